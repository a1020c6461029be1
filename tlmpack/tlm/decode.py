"""Masked decoding: the TLM writes one task's schedule as a sentence of the tensor language,

    [BOS] <target> <task> sketch S [SEP] <decisions in trace order> [EOS]

choosing at every position only among the values the Space Builder says are legal there (the
sketches of the task's design space; each site's tile factorisations, categorical indices and
compute locations, met one by one while the sketch replays). A value of several tokens (a tile's
factors, a number spelled digit by digit) is chosen token by token, each token masked to those
that still continue a legal value. So every sentence is a legal schedule by construction.

Greedy decoding takes the most likely legal token, ties to the lower token id, scores rounded to
1e-4 so that last-bit differences between CPUs do not change the bytes; it runs in fp32 on one CPU
thread. ``samples`` > 0 adds seeded top-k samples (the candidates of ``--tune`` and of the offline
improvement rounds), each also legal by construction.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Any

from ..schedule.records import Decision
from .language import NO_HINT, TOKEN_ID, Hint, Sentence, TaskInfo, _number, tokens
from .model import LoadedTLM


@dataclass(frozen=True)
class Decoded:
    """One decoded schedule: the sketch, the scheduled PrimFunc, the decisions, and how sure the
    model was (geometric-mean probability of its choices where it had more than one)."""

    sketch: int
    func: Any
    decisions: tuple[Decision, ...]
    confidence: float
    decode_ms: float  # the model's forward passes (TVM's replay excluded), wall clock
    decode_cpu_ms: float = 0.0  # the same in this thread's CPU time (what a busy host does not inflate)


def value_tokens(kind: str, value) -> list[int]:
    """The token ids a decision value is written with (after its marker)."""
    if kind == "tile":
        return [TOKEN_ID[t] for f in value for t in _number(int(f))]
    if kind == "compute_location" and value in (-2, -1):
        return [TOKEN_ID["loc:inline" if value == -2 else "loc:root"]]
    return [TOKEN_ID[t] for t in _number(int(value))]


MARKER = {"tile": TOKEN_ID["tile"], "categorical": TOKEN_ID["cat"], "compute_location": TOKEN_ID["loc"]}


class _Session:
    """The GPT-2 (numpy forward pass) over a growing token prefix. Tokens are fed lazily: a run
    of forced tokens (a single legal value, the markers) costs one forward step when the next real
    choice comes, and a task with no choice to make costs none."""

    def __init__(self, tlm: LoadedTLM, prompt: list[int]) -> None:
        self.net = tlm.net
        self.cache = self.net.start()
        self.model_s = self.model_cpu_s = 0.0
        self.pending = list(prompt)
        self.hidden = None

    def push(self, token: int) -> None:
        self.pending.append(token)

    def scores(self, tokens: list[int]) -> list[float]:
        """Logits of ``tokens`` at the next position (rounded to 1e-4: see the module doc)."""
        started, cpu = time.perf_counter(), time.thread_time()
        if self.pending:
            self.hidden = self.net.step(self.pending, self.cache)
            self.pending = []
        out = [round(float(x), 4) for x in self.net.logits(self.hidden, tokens)]
        self.model_s += time.perf_counter() - started
        self.model_cpu_s += time.thread_time() - cpu
        return out


class _Chooser:
    """Chooses legal values token by token: greedy, or a seeded top-k sample. Greedy with an anchor
    margin > 0 keeps the rules' token (``preferred``) unless the model's best token beats it by more
    than ``margin`` in log-probability: the model overrides the rules only where it is clearly sure."""

    def __init__(self, session: _Session, rng: random.Random | None = None, top_k: int = 4,
                 temperature: float = 1.0, margin: float = 0.0) -> None:
        self.session, self.rng, self.top_k, self.temperature = session, rng, top_k, temperature
        self.margin = margin if rng is None else 0.0
        self.logp: list[float] = []  # per choice with more than one legal value

    def choose(self, values: list, kind: str, preferred: Any = None) -> Any:
        """One of ``values`` (each written as ``value_tokens(kind, v)``); pushes its tokens."""
        seqs = [(value_tokens(kind, v), v) for v in values]
        anchor = value_tokens(kind, preferred) if self.margin > 0 and preferred in values else None
        total = 0.0
        depth = 0
        while True:
            nexts = sorted({s[depth] for s, _ in seqs if len(s) > depth})
            if not nexts:
                break
            if len(nexts) == 1:
                token = nexts[0]
            else:
                scores = self.session.scores(nexts)
                token, logp = self._pick(nexts, scores)
                if anchor is not None and depth < len(anchor) and anchor[depth] != token:
                    kept = scores[nexts.index(anchor[depth])]
                    if max(scores) - kept <= self.margin:  # logits differ as log-probabilities do
                        token, logp = anchor[depth], logp - (max(scores) - kept)
                total += logp
            if anchor is not None and (depth >= len(anchor) or anchor[depth] != token):
                anchor = None  # off the rules' value: the rest is the model's
            self.session.push(token)
            seqs = [(s, v) for s, v in seqs if len(s) > depth and s[depth] == token]
            depth += 1
            if len(seqs) == 1 and len(seqs[0][0]) == depth:
                break
        done = [v for s, v in seqs if len(s) == depth]
        if len(values) > 1:
            self.logp.append(total)
        return done[0]

    def _pick(self, legal: list[int], scores: list[float]) -> tuple[int, float]:
        """The token (most likely, ties to the lower id; or a top-k sample) and its log-probability
        among the legal ones."""
        ranked = sorted(range(len(legal)), key=lambda i: (-scores[i], legal[i]))
        top = scores[ranked[0]]
        norm = top + math.log(sum(math.exp(x - top) for x in scores))
        pick = ranked[0]
        if self.rng is not None:
            head = ranked[: self.top_k]
            weights = [math.exp((scores[i] - top) / self.temperature) for i in head]
            pick = self.rng.choices(head, weights=weights)[0]
        return legal[pick], scores[pick] - norm

    def confidence(self) -> float:
        return math.exp(sum(self.logp) / len(self.logp)) if self.logp else 1.0


class _RulesCursor:
    """Walks the rules' decisions beside the decoder's sites: the rules' value of each site, by kind
    in trace order (a rule that replays without compute locations has none to offer for them)."""

    def __init__(self, hint: Hint | None) -> None:
        self.decisions = list(hint.decisions) if hint is not None else []
        self.i = 0

    def value(self, kind: str) -> Any:
        while self.i < len(self.decisions):
            d = self.decisions[self.i]
            if d.kind == kind:
                self.i += 1
                return tuple(d.value) if kind == "tile" else d.value
            if kind == "compute_location":
                return None  # the rules left this location to the sketch
            self.i += 1  # a location the decoder does not visit
        return None


def prompt_ids(sentence_head: Sentence) -> list[int]:
    """[BOS] <target> <task> [<hint>] sketch — the tokens before the (own) sketch number."""
    toks = tokens(sentence_head)
    last = len(toks) - 1 - toks[::-1].index("sketch")
    return [TOKEN_ID[t] for t in toks[: last + 1]]


def _point_filter(hardware, footprint):
    """CUDA: VerifyGPUCode's thread and shared-memory conditions as a mask (schedule.cuda_footprint)."""
    if not getattr(hardware, "sm_count", 0):
        return _NoFilter()
    from ..schedule.cuda_footprint import PointFilter

    return PointFilter(footprint, hardware.max_shared_memory_per_block)


class _NoFilter:
    def keep(self, site, values: list) -> list:
        return values

    def chosen(self, site, value) -> None:
        pass


def decode_space(tlm: LoadedTLM, space, hardware, task: TaskInfo, samples: int = 0, seed: int = 0,
                 top_k: int = 4, max_sketch_tries: int = 4, hint: Hint | None = None) -> list[Decoded]:
    """Greedy decode (first), then ``samples`` seeded top-k samples, of one task's design space
    (schedule.space.DesignSpace). A guided model reads ``hint``, the rules' schedule of the task
    (NO_HINT when not given); an unguided one ignores it. A sketch whose point the postprocessors refuse is dropped and the
    next most likely sketch tried. Empty when no legal point came out. BLAS runs on one thread:
    the same reductions on every machine, and no worker threads to wake for matrices this small
    (on a busy 2-core host, threaded BLAS made each step 20x slower)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        needs = tlm.summary.guided or tlm.summary.anchor_margin > 0
        return _decode_space(tlm, space, hardware, task, samples, seed, top_k, max_sketch_tries,
                             (hint or NO_HINT) if needs else None)


def _decode_space(tlm: LoadedTLM, space, hardware, task: TaskInfo, samples: int, seed: int, top_k: int,
                  max_sketch_tries: int, hint: Hint | None) -> list[Decoded]:
    from ..schedule.space import legal_values

    footprint = None
    if getattr(hardware, "sm_count", 0):
        from ..schedule.cuda_footprint import SharedFootprint

        footprint = SharedFootprint.of(space.mod["main"])
    guided = tlm.summary.guided
    head = Sentence(hardware, task, 0, (), hint if guided else None)
    prompt = prompt_ids(head)
    anchor = hint if hint is not None and hint.sketch >= 0 and tlm.summary.anchor_margin > 0 else None
    out: list[Decoded] = []
    seen: set = set()
    for attempt in range(samples + 1):
        rng = random.Random(f"{seed}:{attempt}") if attempt else None
        refused: set[int] = set()
        for _ in range(max_sketch_tries):
            session = _Session(tlm, prompt)
            chooser = _Chooser(session, rng, top_k, margin=tlm.summary.anchor_margin if anchor else 0.0)
            hidden = space.sketches_after(tlm.summary.space_version)
            sketches = [s for s in range(len(space.sketches)) if s not in refused and s not in hidden]
            if not sketches:
                break
            sketch = chooser.choose(sketches, "sketch", anchor.sketch if anchor else None)
            session.push(TOKEN_ID["[SEP]"])
            cuda = _point_filter(hardware, footprint)
            rules = _RulesCursor(anchor if anchor and sketch == anchor.sketch else None)

            def decide(site, _sampled, chooser=chooser, session=session, cuda=cuda, rules=rules):
                session.push(MARKER[site.kind])
                value = chooser.choose(cuda.keep(site, legal_values(site)), site.kind, rules.value(site.kind))
                cuda.chosen(site, value)
                return value

            try:
                result = space.replay(sketch, decide, locations=True)
            except OverflowError:
                result = None
            if result is None:
                refused.add(sketch)
                continue
            func, decisions = result
            key = (sketch, decisions)
            if key not in seen:
                seen.add(key)
                out.append(Decoded(sketch, func, decisions, chooser.confidence(), session.model_s * 1e3,
                               session.model_cpu_s * 1e3))
            break
    return out


def out_of_distribution(tlm: LoadedTLM, task: TaskInfo, hardware: Any = None) -> str | None:
    """Why the model should not be trusted with ``task`` on ``hardware`` (None when both are
    within training)."""
    s = tlm.summary
    bits = getattr(hardware, "vector_bits", None)
    if s.vector_bits and bits is not None and bits not in s.vector_bits:
        seen = "/".join(str(b) for b in s.vector_bits)
        return f"x86 with {bits}-bit vectors never seen in training (it saw {seen}-bit)"
    if task.kind not in s.kinds:
        return f"kind {task.kind} never seen in training"
    unseen = [w for w in task.ops if w not in s.ops]
    if unseen:
        return f"op {unseen[0]} never seen in training"
    low, high = s.extent_range.get(task.kind, [1, 1])
    size = math.prod(task.spatial or (1,)) * math.prod(task.reduction or (1,))
    if size < low / 16 or size > high * 16:
        return f"loop nest of {size} points far outside training ({low}..{high})"
    return None
