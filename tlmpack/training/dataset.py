"""Training sentences for the TLM, from the record store: the grammar (random legal sentences,
measured or sampled from the cached sites) and the taste (the best measured programs of each
task, latency-weighted), each with the legal tokens at every decision position (the mask the
decoder applies), so training scores the model exactly as decoding uses it.

Held-out tasks (data/heldout.json) are in no training sentence of their target.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import math
import random
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from ..schedule.hardware import CudaHardware, X86Hardware
from ..schedule.records import Decision
from ..schedule.space import SamplingSite, legal_values
from ..tlm.decode import MARKER, value_tokens
from ..tlm.language import NO_HINT, TOKEN_ID, Hint, Sentence, TaskInfo, encode
from .hints import hardware_key
from .store import Store

HELDOUT_FILE = "heldout.json"


@dataclass(frozen=True)
class Example:
    """One sentence: token ids, and for each scored position p (predicting ids[p]) its legal ids."""

    ids: tuple[int, ...]
    scored: tuple[tuple[int, tuple[int, ...]], ...]
    weight: float = 1.0


def latency(record: dict) -> float:
    """The latency a record stands for: x86 ``min_us`` (data/README.md, "Which latency"), else the median."""
    return float(record["min_us"] if record["target"] == "x86" and record.get("min_us") else record["median_us"])


def hardware_of(record: dict) -> X86Hardware | CudaHardware:
    h = record["hardware"]
    if record["target"] == "x86":
        return X86Hardware(h["cores"], h["vector_bits"], h["vector_registers"], h["l1d_bytes"], h["l2_bytes"],
                           h["l3_bytes"])
    return CudaHardware(h["arch"], h["sm_count"], h["max_shared_memory_per_block"], h["shared_memory_per_sm"],
                        h["registers_per_block"], h["registers_per_sm"], h["max_threads_per_block"],
                        h.get("warp_size", 32))


def task_info(task: dict) -> TaskInfo:
    return TaskInfo(task["kind"], tuple(task["ops"]), tuple(task["spatial"]), tuple(task["reduction"]),
                    tuple(task["dtypes"]))


@functools.lru_cache(maxsize=65536)
def _legal_prefix_tokens(kind: str, values: tuple, chosen) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """For the tokens of ``chosen`` among ``values``: at each depth, the legal next tokens."""
    seqs = [tuple(value_tokens(kind, v)) for v in values]
    target = tuple(value_tokens(kind, chosen))
    out = []
    for depth, token in enumerate(target):
        nexts = tuple(sorted({s[depth] for s in seqs if len(s) > depth and s[:depth] == target[:depth]}))
        if token not in nexts:
            raise ValueError("value is not legal for its site")
        out.append((token, nexts))
    return tuple(out)


def make_example(hardware, task: TaskInfo, sketch: int, decisions: tuple[Decision, ...],
                 sites: list[list[SamplingSite]], weight: float = 1.0, hint: Hint | None = None) -> Example | None:
    """The sentence of one program with its masks (after ``hint``, the rules' schedule, for a
    guided model: never scored); None when its decisions do not fit the sites (a record of another
    space) or the sentence does not encode."""
    if not 0 <= sketch < len(sites) or len(sites[sketch]) != len(decisions):
        return None
    try:
        ids = encode(Sentence(hardware, task, sketch, decisions, hint))
    except (ValueError, KeyError):
        return None
    own = len(ids) - 1 - ids[::-1].index(TOKEN_ID["sketch"])
    head = ids.index(TOKEN_ID["[SEP]"], own)
    # the sketch number: the tokens between "sketch" and [SEP]
    sketch_at = head - len(value_tokens("sketch", sketch))
    scored: list[tuple[int, tuple[int, ...]]] = []
    try:
        for offset, (_, legal) in enumerate(_legal_prefix_tokens("sketch", tuple(range(len(sites))), sketch)):
            scored.append((sketch_at + offset, legal))
        pos = head + 1
        for site, d in zip(sites[sketch], decisions, strict=True):
            if site.kind != d.kind or ids[pos] != MARKER[d.kind]:
                return None
            pos += 1
            values = legal_values(site) if site.kind != "compute_location" or site.candidates else [d.value]
            if d.value not in values and d.kind == "compute_location":
                values = [*values, d.value]  # the record's own replay had this location
            for token, legal in _legal_prefix_tokens(d.kind, tuple(values), d.value):
                if ids[pos] != token:
                    return None
                scored.append((pos, legal))
                pos += 1
    except ValueError:
        return None
    return Example(tuple(ids), tuple(scored), weight)


def heldout_keys(store: Store, target: str, evaluation: bool = False) -> set[str]:
    """Tasks no training may read: the sampled held-out tasks of ``target`` (what evaluations
    measure; only these with ``evaluation``) and the tasks found only in the corpus's held-out
    models (corpus.HELD_OUT)."""
    path = store.root / HELDOUT_FILE
    if not path.is_file():
        return set()
    held = json.loads(path.read_text())
    return set(held.get(target, [])) | (set() if evaluation else set(held.get("held_out_model_tasks", [])))


def measured_tasks(store: Store, target: str, valid: bool = True) -> set[str]:
    """Tasks with at least one valid record of ``target`` (any record with ``valid`` False): the store
    also holds tasks only the teacher labels (training.hints.teacher_tasks)."""
    return {r["task"] for r in store.records(target) if r.get("valid") or not valid}


def held_out_model_tasks(store: Store) -> list[str]:
    """Tasks that occur only in the corpus's held-out models."""
    from .corpus import HELD_OUT

    by_model = {e["model"]: {t["key"] for t in e["tasks"]} for e in store.corpora()}
    held = set().union(*(v for m, v in by_model.items() if m in HELD_OUT))
    return sorted(held - set().union(*(v for m, v in by_model.items() if m not in HELD_OUT)))


def choose_heldout(store: Store, target: str, fraction: float = 0.1, min_programs: int = 8) -> list[str]:
    """A seeded, kind-stratified choice of held-out tasks among those with ``min_programs`` valid
    records (where a choice can matter)."""
    counts: dict[str, int] = defaultdict(int)
    for r in store.records(target):
        if r.get("valid"):
            counts[r["task"]] += 1
    by_kind: dict[str, list[str]] = defaultdict(list)
    for key in sorted(k for k, n in counts.items() if n >= min_programs):
        by_kind[store.task(key)["kind"]].append(key)
    out = []
    for kind in sorted(by_kind):
        keys = sorted(by_kind[kind], key=lambda k: hashlib.sha256(f"heldout:{target}:{k}".encode()).hexdigest())
        out += keys[: max(1, round(len(keys) * fraction))]
    return sorted(out)


@dataclass
class TrainingSet:
    """Both phases' examples and what the model's summary records of them."""

    grammar: list[Example]
    taste: list[Example]
    tasks: set[str]
    infos: dict[str, TaskInfo]
    sha256: str
    guided: bool = False  # every sentence starts with the rules' hint (tlm.language.Hint)
    vector_bits: tuple[int, ...] = ()  # x86: the vector widths of the machines its records were measured on
    # per (task, hardware, timer) group: its distinct programs, each with its share of the group's target
    # distribution (rank_programs); what the ranking phase (train.rank_loss) fits
    ranking: list[tuple[tuple[Example, float], ...]] = field(default_factory=list)
    channels_last_convs: int = 0  # its tasks that are channels-last convolutions (TrainingSummary)


# the block of TOPI's NHWC convolution (grouped or not): the layout the x86 build compiles
CHANNELS_LAST_CONV_BLOCK = re.compile(r'block\("(group_)?conv2d_nhwc"\)')


def channels_last_convs(store: Store, keys: set[str]) -> int:
    """How many of ``keys`` are channels-last convolutions: what lets a build hand them to the model."""
    return sum(bool(CHANNELS_LAST_CONV_BLOCK.search(store.task(k)["script"])) for k in keys)


def _groups(store: Store, target: str, skip: set[str], llvm_cpu: str | None = None) -> dict[tuple, list[dict]]:
    """Valid records by (task, hardware, timer): latencies compare only within one group."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in store.records(target, as_built=True):  # x86: only kernels timed as builds run them
        if llvm_cpu is not None and r["hardware"].get("llvm_cpu") != llvm_cpu:
            continue
        if llvm_cpu is None and r.get("role"):  # another machine's adapt batch: only `tlm adapt` learns it
            continue
        if r.get("valid") and r["task"] not in skip and latency(r) > 0 and r.get("role") != "eval":
            groups[(r["task"], hardware_key(r["hardware"]), r.get("timer", ""), r.get("timing", ""))].append(r)
    return groups


def build_training_set(store: Store, target: str, sites: dict[str, list[list[SamplingSite]]], seed: int = 0,
                       random_per_sketch: int = 8, best_k: int = 8, beta: float = 6.0,
                       tasks: set[str] | None = None, heldout: bool = False, llvm_cpu: str | None = None,
                       hints: dict[tuple[str, str], Hint] | None = None, rank_k: int = 0,
                       rank_timing: str | None = None, teacher: dict[tuple[str, str], Hint] | None = None,
                       teacher_weight: float = 1.0) -> TrainingSet:
    """grammar: every valid measured program plus ``random_per_sketch`` random legal sentences per
    sketch and hardware; taste: per group the ``best_k`` fastest programs, weighted
    exp(-beta * ln(latency / best)) and normalised so each group weighs the same. ``tasks``:
    only these (default: every task but the held-out ones); ``heldout``: only the held-out ones
    (an evaluation set, never trained on); ``llvm_cpu``: only records measured on that CPU (adapting
    to another machine); ``hints`` (training.hints.load_hints): guided sentences, each after the
    rules' schedule of its task on its hardware (NO_HINT where none was computed); ``rank_k`` > 0:
    also each group's ranking list (rank_programs), slow programs included; ``rank_timing``: only
    from groups timed that way (e.g. "interleaved": older bursts rank programs by the timer's drift);
    ``teacher`` (training.hints.load_teacher): the rules' point of tasks no record measured, one taste
    sentence per task and hardware at ``teacher_weight`` (a measured program weighs 1 on average)."""
    if teacher and hints is not None:
        raise ValueError("teacher sentences are unguided: build a guided set without them")
    skip = heldout_keys(store, target)
    if heldout:
        tasks, skip = heldout_keys(store, target, evaluation=True), set()
    groups = _groups(store, target, skip, llvm_cpu)
    infos: dict[str, TaskInfo] = {}
    grammar: list[Example] = []
    taste: list[Example] = []
    ranking: list[tuple[tuple[Example, float], ...]] = []
    hardwares: dict[str, X86Hardware | CudaHardware] = {}
    used: set[str] = set()
    for (key, hw_json, _, timing), records in sorted(groups.items()):
        if tasks is not None and key not in tasks:
            continue
        if key not in sites:
            continue
        info = infos.get(key) or infos.setdefault(key, task_info(store.task(key)))
        hardware = hardware_of(records[0])
        hardwares[hw_json] = hardware
        hint = None if hints is None else hints.get((key, hw_json), NO_HINT)
        records = sorted(records, key=latency)
        best = latency(records[0])
        weights = [math.exp(-beta * math.log(latency(r) / best)) for r in records[:best_k]]
        norm = sum(weights)
        for r in records:
            ex = make_example(hardware, info, r["sketch"], tuple(Decision.from_json(d) for d in r["decisions"]),
                              sites[key], hint=hint)
            if ex is not None:
                grammar.append(ex)
                used.add(key)
        if len(records) >= 2:
            if hint is not None and hint.sketch >= 0:
                picked = edit_taste(records, hint, list(zip(records[:best_k], [w / norm for w in weights],
                                                            strict=False)), best_k, beta)
            else:
                picked = list(zip(records[:best_k], [w / norm * min(len(records), best_k) for w in weights],
                                  strict=False))
            for r, w in picked:
                ex = make_example(hardware, info, r["sketch"], tuple(Decision.from_json(d) for d in r["decisions"]),
                                  sites[key], weight=w, hint=hint)
                if ex is not None:
                    taste.append(ex)
        if rank_k > 0 and rank_timing in (None, timing):
            group = []
            for r, q in rank_programs(records, rank_k, beta):
                ex = make_example(hardware, info, r["sketch"], tuple(Decision.from_json(d) for d in r["decisions"]),
                                  sites[key], hint=hint)
                if ex is not None:
                    group.append((ex, q))
            if len(group) >= 2:
                total = sum(q for _, q in group)
                ranking.append(tuple((ex, q / total) for ex, q in group))
    for example, key, hw_json, hardware in _teacher_examples(teacher or {}, target, sites, skip | set(infos), tasks,
                                                             store, infos, teacher_weight):
        taste.append(example)
        hardwares.setdefault(hw_json, hardware)
        used.add(key)
    rng = random.Random(f"grammar:{target}:{seed}")
    for key in sorted(used):
        for hw_json, hardware in hardwares.items():
            hint = None if hints is None else hints.get((key, hw_json), NO_HINT)
            for sketch, sketch_sites in enumerate(sites[key]):
                for _ in range(random_per_sketch):
                    decisions = tuple(_random_decision(s, rng) for s in sketch_sites)
                    if any(d is None for d in decisions):
                        break
                    ex = make_example(hardware, infos[key], sketch, decisions, sites[key], hint=hint)
                    if ex is not None:
                        grammar.append(ex)
    digest = hashlib.sha256()
    for ex in grammar + taste:
        digest.update(json.dumps([ex.ids, round(ex.weight, 6)]).encode())
    for group in ranking:
        digest.update(json.dumps([[ex.ids, round(q, 6)] for ex, q in group]).encode())
    widths = tuple(sorted({h.vector_bits for h in hardwares.values() if isinstance(h, X86Hardware)}))
    return TrainingSet(grammar, taste, used, infos, digest.hexdigest(), hints is not None, widths, ranking,
                       channels_last_convs(store, used) if target == "x86" else 0)


def _teacher_examples(teacher: dict[tuple[str, str], Hint], target: str, sites: dict[str, list[list[SamplingSite]]],
                      skip: set[str], tasks: set[str] | None, store: Store, infos: dict[str, TaskInfo],
                      weight: float):
    """(example, task, hardware key, hardware) of each teacher point whose task is neither skipped
    (held out, or measured: its records teach it) nor outside ``tasks``, and has sites."""
    for (key, hw_json), hint in sorted(teacher.items()):
        if key in skip or key not in sites or hint.sketch < 0 or (tasks is not None and key not in tasks):
            continue
        hardware = hardware_of({"target": target, "hardware": json.loads(hw_json)})
        info = infos.get(key) or infos.setdefault(key, task_info(store.task(key)))
        ex = make_example(hardware, info, hint.sketch, hint.decisions, sites[key], weight=weight)
        if ex is not None:
            yield ex, key, hw_json, hardware


RANK_TIE = 0.02  # programs within 2 % of each other are one program's noise on these hosts


def rank_programs(records: list[dict], k: int, beta: float) -> list[tuple[dict, float]]:
    """One group's ranking list (``records`` fastest first): its distinct programs (a program
    measured twice keeps its fastest time), the ``k`` // 2 fastest and the rest spread evenly over
    the slower ones, so the list holds what to avoid as well as what to pick; each with the target
    weight exp(-beta * ln(latency / best)). Empty where the group's programs are all within
    RANK_TIE of its best (nothing to rank)."""
    distinct: dict[str, dict] = {}
    for r in records:
        distinct.setdefault(json.dumps([r["sketch"], r["decisions"]]), r)
    programs = list(distinct.values())
    if len(programs) < 2 or latency(programs[-1]) <= latency(programs[0]) * (1 + RANK_TIE):
        return []
    head = programs[: max(1, k // 2)]
    rest = programs[len(head):]
    step = max(1, math.ceil(len(rest) / max(1, k - len(head))))
    picked = head + rest[::step][: k - len(head)]
    best = latency(programs[0])
    return [(r, math.exp(-beta * math.log(latency(r) / best))) for r in picked]


BETTER_THAN_RULES = 1.03  # a program counts as an improvement on the rules' point past this ratio


def edit_taste(records: list[dict], hint: Hint, picked: list[tuple[dict, float]], best_k: int,
               beta: float) -> list[tuple[dict, float]]:
    """A guided model's taste for one group (``records`` fastest first): where the rules' own point
    was measured, the programs faster than it by BETTER_THAN_RULES (latency-weighted), or the rules'
    point itself where none is: copy the rules unless a measured program beats them. Where it was
    not measured, ``picked`` (the best ``best_k``, weights summing to 1) at half weight: no evidence
    either way. Each group's weights sum to 1 (0.5 unmeasured)."""
    decisions = [d.to_json() for d in hint.decisions]
    rules = [r for r in records if r["sketch"] == hint.sketch and r["decisions"] == decisions]
    if not rules:
        return [(r, w * 0.5) for r, w in picked]
    bar = latency(rules[0]) / BETTER_THAN_RULES
    better = [r for r in records if latency(r) < bar][:best_k]
    if not better:
        return [(rules[0], 1.0)]
    weights = [math.exp(-beta * math.log(latency(r) / latency(better[0]))) for r in better]
    return [(r, w / sum(weights)) for r, w in zip(better, weights, strict=True)]


def _random_decision(site: SamplingSite, rng: random.Random) -> Decision | None:
    if site.kind == "compute_location" and not site.candidates:
        return None
    value = rng.choice(legal_values(site))
    return Decision(site.kind, tuple(value) if site.kind == "tile" else int(value))


def write_heldout(store: Store, keys: dict[str, list[str]]) -> Path:
    path = Path(store.root) / HELDOUT_FILE
    keys = {**keys, "held_out_model_tasks": held_out_model_tasks(store)}
    path.write_text(json.dumps({t: sorted(v) for t, v in sorted(keys.items())}, indent=1) + "\n")
    return path


def save_training_set(data: TrainingSet, path: Path) -> None:
    """One file a training run can read where the store's records are not (e.g. the GPU machine)."""
    import pickle

    with gzip.open(path, "wb", compresslevel=6) as f:
        pickle.dump({"grammar": data.grammar, "taste": data.taste, "tasks": sorted(data.tasks),
                     "infos": data.infos, "sha256": data.sha256, "guided": data.guided,
                     "vector_bits": data.vector_bits, "ranking": data.ranking,
                     "channels_last_convs": data.channels_last_convs}, f, protocol=4)


def load_training_set(path: Path) -> TrainingSet:
    import pickle

    with gzip.open(path, "rb") as f:
        d = pickle.load(f)  # noqa: S301  (our own file, written by save_training_set)
    return TrainingSet(d["grammar"], d["taste"], set(d["tasks"]), d["infos"], d["sha256"], d.get("guided", False),
                       tuple(d.get("vector_bits", ())), d.get("ranking", []), d.get("channels_last_convs", 0))
