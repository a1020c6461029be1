"""The tensor language: one task's schedule on one target as a sentence of tokens,

    [BOS] <target tokens> <task tokens> [SEP] <decision tokens> [EOS]

with a fixed, versioned vocabulary, so a model trained on one version reads every sentence of
that version. Numbers 0..MAX_SMALL are single tokens (tile factors, indices, small extents);
larger ones are spelled digit by digit between [NUM] and [/NUM], so the vocabulary never grows.
Decisions are a marker (tile | cat | loc) then one token per value, in trace order.

A guided sentence (a model whose training summary says ``guided``) first writes the rules'
schedule of the task as a hint, then the model's own:

    [BOS] <target> <task> sketch <rules' sketch> [SEP] <rules' decisions> [EOS] sketch <sketch> [SEP] ... [EOS]

(``sketch [UNK] [EOS]`` where no rule fits), so the model learns where the rules are right and what
to change where they are not: copying is what it falls back to, not a whole-task switch.

Plain data in, plain data out; only ``describe_task`` reads TVM (lazily).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, fields

from ..schedule.hardware import CudaHardware, X86Hardware
from ..schedule.records import Decision

LANGUAGE_VERSION = 1
MAX_SMALL = 4096  # numbers 0..MAX_SMALL are one token each

SPECIALS = ("[PAD]", "[BOS]", "[SEP]", "[EOS]", "[UNK]", "[NUM]", "[/NUM]")
TARGET_WORDS = (
    "target:x86", "target:cuda",
    # x86 hints, in X86Hardware field order (caches in KiB)
    "cores", "vector_bits", "vector_registers", "l1d_kib", "l2_kib", "l3_kib",
    # cuda hints, in CudaHardware field order (memories in KiB)
    "sm_count", "smem_block_kib", "smem_sm_kib", "regs_block", "regs_sm", "threads_block", "warp",
)
ARCHS = ("sm_50", "sm_52", "sm_53", "sm_60", "sm_61", "sm_62", "sm_70", "sm_72", "sm_75", "sm_80", "sm_86",
         "sm_87", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_100a", "sm_103", "sm_110", "sm_120", "sm_121")
TASK_KINDS = ("matmul", "reduce", "pointwise", "other")
# Words of TVM's legalised op names (a task is named after the ops fused into it).
OP_WORDS = (
    "unk", "add", "subtract", "multiply", "divide", "floor", "mod", "power", "sqrt", "rsqrt", "exp", "log",
    "tanh", "erf", "sigmoid", "relu", "gelu", "silu", "clip", "minimum", "maximum", "max", "min", "sum",
    "mean", "variance", "std", "prod", "softmax", "layer", "group", "rms", "batch", "instance", "norm",
    "matmul", "dense", "conv1d", "conv2d", "conv3d", "transpose", "depthwise", "pool1d", "pool2d", "avg",
    "adaptive", "global", "pad", "reshape", "broadcast", "to", "take", "cast", "concatenate", "split",
    "strided", "slice", "where", "less", "greater", "equal", "not", "logical", "and", "or", "astype",
    "full", "like", "zeros", "ones", "expand", "dims", "squeeze", "flatten", "image", "resize2d", "collapse",
    "te", "negative", "abs", "ceil", "round", "square", "fast", "tile", "repeat", "argmax", "argmin",
    "cumsum", "topk", "gather", "elements", "nd", "scatter", "permute", "sin", "cos", "triu", "tril",
    "arange", "dynamic", "einsum", "index", "put", "one", "hot", "sort", "argsort", "nll", "loss",
    "hardswish", "hardsigmoid", "leakyrelu", "prelu", "softplus", "mish", "selu", "elu", "log_softmax",
    "attention", "linear", "bias", "scale", "shift", "rotary", "embedding",
)
DTYPES = ("float32", "float16", "bfloat16", "float64", "int8", "int16", "int32", "int64", "uint8", "bool",
          "float8_e4m3fn", "float8_e5m2")
TASK_WORDS = ("spatial", "reduction", "sketch")
DECISION_WORDS = ("tile", "cat", "loc", "loc:inline", "loc:root")

MAX_OPS = 8  # op words kept per task
MAX_DTYPES = 4


def vocabulary() -> tuple[str, ...]:
    """Every token of this language version, in id order."""
    return (*SPECIALS, *TARGET_WORDS, *(f"arch:{a}" for a in ARCHS), *(f"kind:{k}" for k in TASK_KINDS),
            *(f"op:{w}" for w in OP_WORDS), *(f"dtype:{d}" for d in DTYPES), *TASK_WORDS, *DECISION_WORDS,
            *(str(n) for n in range(MAX_SMALL + 1)))


VOCAB = vocabulary()
TOKEN_ID = {t: i for i, t in enumerate(VOCAB)}
VOCAB_SHA256 = hashlib.sha256("\n".join(VOCAB).encode()).hexdigest()


@dataclass(frozen=True)
class TaskInfo:
    """What the language says about a task: its kind, op words, main loop extents and dtypes."""

    kind: str
    ops: tuple[str, ...]
    spatial: tuple[int, ...]
    reduction: tuple[int, ...]
    dtypes: tuple[str, ...]


@dataclass(frozen=True)
class Hint:
    """The rules' schedule a guided sentence starts from (sketch -1: no rule fits)."""

    sketch: int
    decisions: tuple[Decision, ...] = ()


NO_HINT = Hint(-1)


@dataclass(frozen=True)
class Sentence:
    """One task's schedule on one target: the hardware, the task, the sketch, the decisions; and
    for a guided model the rules' schedule it was shown (None: an unguided sentence)."""

    hardware: X86Hardware | CudaHardware
    task: TaskInfo
    sketch: int
    decisions: tuple[Decision, ...]
    hint: Hint | None = None


def op_words(task_name: str) -> tuple[str, ...]:
    """The op words of a fused task's name: 'fused_matmul3_add4' -> ('matmul', 'add')."""
    words = []
    for part in task_name.removeprefix("fused_").split("_"):
        word = part if part in OP_WORDS else re.sub(r"\d+$", "", part)  # matmul3 -> matmul
        if word:
            words.append(word if word in OP_WORDS else "unk")
    return tuple(words[:MAX_OPS])


def describe_task(func, name: str) -> TaskInfo:
    """Reads a task's kind, main-loop extents and parameter dtypes from its PrimFunc (imports TVM)."""
    from ..schedule.heuristics.classify import classify

    cls = classify(func)
    dtypes = tuple(dict.fromkeys(str(p.dtype) for p in func.params))
    return TaskInfo(cls.kind, op_words(name), tuple(cls.spatial), tuple(cls.reduction),
                    tuple(d if d in DTYPES else "float32" for d in dtypes)[:MAX_DTYPES])


def _number(n: int) -> list[str]:
    if n < 0:
        raise ValueError(f"the language writes no negative numbers ({n})")
    if n <= MAX_SMALL:
        return [str(n)]
    return ["[NUM]", *str(n), "[/NUM]"]


def _kib(nbytes: int) -> int:
    if nbytes % 1024:
        raise ValueError(f"{nbytes} bytes is not a whole number of KiB")
    return nbytes // 1024


def _target_tokens(hw: X86Hardware | CudaHardware) -> list[str]:
    if isinstance(hw, X86Hardware):
        values = [hw.cores, hw.vector_bits, hw.vector_registers, _kib(hw.l1d_bytes), _kib(hw.l2_bytes),
                  _kib(hw.l3_bytes)]
        out = ["target:x86"]
        for word, value in zip(TARGET_WORDS[2:8], values, strict=True):
            out += [word, *_number(value)]
        return out
    if hw.arch not in ARCHS:
        raise ValueError(f"arch {hw.arch} is not in language version {LANGUAGE_VERSION}")
    values = [hw.sm_count, _kib(hw.max_shared_memory_per_block), _kib(hw.shared_memory_per_sm),
              hw.registers_per_block, hw.registers_per_sm, hw.max_threads_per_block, hw.warp_size]
    out = ["target:cuda", f"arch:{hw.arch}"]
    for word, value in zip(TARGET_WORDS[8:], values, strict=True):
        out += [word, *_number(value)]
    return out


def _task_tokens(task: TaskInfo) -> list[str]:
    if task.kind not in TASK_KINDS or any(w not in OP_WORDS for w in task.ops) or any(
            d not in DTYPES for d in task.dtypes):
        raise ValueError(f"task {task} has words outside language version {LANGUAGE_VERSION}")
    out = [f"kind:{task.kind}", *(f"op:{w}" for w in task.ops), "spatial"]
    for n in task.spatial:
        out += _number(n)
    out.append("reduction")
    for n in task.reduction:
        out += _number(n)
    return [*out, *(f"dtype:{d}" for d in task.dtypes)]


def _schedule_tokens(sketch: int, decisions: tuple[Decision, ...]) -> list[str]:
    """sketch <n> [SEP] <decisions> [EOS] (a hint without a rule: sketch [UNK] [EOS])."""
    if sketch < 0:
        return ["sketch", "[UNK]", "[EOS]"]
    out = ["sketch", *_number(sketch), "[SEP]"]
    for d in decisions:
        out += _decision_tokens(d)
    return [*out, "[EOS]"]


def _decision_tokens(d: Decision) -> list[str]:
    if d.kind == "tile":
        return ["tile", *(t for f in d.value for t in _number(f))]
    if d.kind == "categorical":
        return ["cat", *_number(d.value)]
    if d.kind == "compute_location":
        return ["loc", *({-2: ["loc:inline"], -1: ["loc:root"]}.get(d.value) or _number(d.value))]
    raise ValueError(f"unknown decision kind {d.kind}")


def tokens(sentence: Sentence) -> list[str]:
    """The sentence as token strings."""
    out = ["[BOS]", *_target_tokens(sentence.hardware), *_task_tokens(sentence.task)]
    if sentence.hint is not None:
        out += _schedule_tokens(sentence.hint.sketch, sentence.hint.decisions)
    return [*out, *_schedule_tokens(sentence.sketch, sentence.decisions)]


def encode(sentence: Sentence) -> list[int]:
    """The sentence as token ids of this language version."""
    return [TOKEN_ID[t] for t in tokens(sentence)]


class _Reader:
    """Walks a token list for ``decode``."""

    def __init__(self, toks: list[str]) -> None:
        self.toks, self.i = toks, 0

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, expected: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (expected is not None and tok != expected):
            raise ValueError(f"token {self.i}: expected {expected or 'a token'}, found {tok}")
        self.i += 1
        return tok

    def at_number(self) -> bool:
        tok = self.peek()
        return tok is not None and (tok == "[NUM]" or tok.isdigit())

    def number(self) -> int:
        tok = self.take()
        if tok.isdigit():
            return int(tok)
        if tok != "[NUM]":
            raise ValueError(f"token {self.i - 1}: expected a number, found {tok}")
        digits = ""
        while self.peek() != "[/NUM]":
            digit = self.take()
            if len(digit) != 1 or not digit.isdigit():
                raise ValueError(f"token {self.i - 1}: {digit} is not a digit")
            digits += digit
        self.take("[/NUM]")
        return int(digits)

    def numbers(self) -> tuple[int, ...]:
        out = []
        while self.at_number():
            out.append(self.number())
        return tuple(out)


def _read_target(r: _Reader) -> X86Hardware | CudaHardware:
    kind = r.take()
    if kind == "target:x86":
        values = []
        for word in TARGET_WORDS[2:8]:
            r.take(word)
            values.append(r.number())
        values[3:6] = [v * 1024 for v in values[3:6]]
        return X86Hardware(*values)
    if kind != "target:cuda":
        raise ValueError(f"unknown target token {kind}")
    arch = r.take().removeprefix("arch:")
    values = []
    for word in TARGET_WORDS[8:]:
        r.take(word)
        values.append(r.number())
    values[1:3] = [v * 1024 for v in values[1:3]]
    names = [f.name for f in fields(CudaHardware)][1:]
    return CudaHardware(arch, **dict(zip(names, values, strict=True)))


def _read_decision(r: _Reader) -> Decision:
    marker = r.take()
    if marker == "tile":
        return Decision("tile", r.numbers())
    if marker == "cat":
        return Decision("categorical", r.number())
    if marker == "loc":
        special = {"loc:inline": -2, "loc:root": -1}.get(r.peek() or "")
        if special is not None:
            r.take()
            return Decision("compute_location", special)
        return Decision("compute_location", r.number())
    raise ValueError(f"expected a decision marker, found {marker}")


def decode_tokens(toks: list[str]) -> Sentence:
    """Parses token strings back into a Sentence; raises ValueError on a malformed sentence."""
    r = _Reader(toks)
    r.take("[BOS]")
    hardware = _read_target(r)
    kind = r.take().removeprefix("kind:")
    ops = []
    while (r.peek() or "").startswith("op:"):
        ops.append(r.take().removeprefix("op:"))
    r.take("spatial")
    spatial = r.numbers()
    r.take("reduction")
    reduction = r.numbers()
    dtypes = []
    while (r.peek() or "").startswith("dtype:"):
        dtypes.append(r.take().removeprefix("dtype:"))
    first = _read_schedule(r)
    hint = None
    if r.peek() is not None:
        hint, first = Hint(*first), _read_schedule(r)
    if r.peek() is not None:
        raise ValueError("tokens after [EOS]")
    if first[0] < 0:
        raise ValueError("a sentence's own schedule has no sketch")
    return Sentence(hardware, TaskInfo(kind, tuple(ops), spatial, reduction, tuple(dtypes)), first[0], first[1],
                    hint)


def _read_schedule(r: _Reader) -> tuple[int, tuple[Decision, ...]]:
    r.take("sketch")
    if r.peek() == "[UNK]":
        r.take()
        r.take("[EOS]")
        return -1, ()
    sketch = r.number()
    r.take("[SEP]")
    decisions = []
    while r.peek() != "[EOS]":
        decisions.append(_read_decision(r))
    r.take("[EOS]")
    return sketch, tuple(decisions)


def decode(ids: list[int]) -> Sentence:
    """Token ids back to a Sentence."""
    try:
        return decode_tokens([VOCAB[i] for i in ids])
    except IndexError:
        raise ValueError(f"token id outside the vocabulary of version {LANGUAGE_VERSION}") from None
