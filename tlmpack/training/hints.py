"""The rules' schedule of every stored task, per hardware the records were measured on, kept under
data/hints/ so that a guided TLM (tlm.language.Hint) trains on the sentence a build will show it
without TVM (the GPU machine has none).

The teacher file (data/hints/<target>-teacher.json.gz) holds the same kind of points for tasks no
program was measured of (the synthetic blocks' corpus), on the store's most common hardware: the
rules as a teacher, whose choices the TLM fits where no measurement says better (dataset's
``teacher``). It costs no timing, so it can cover many more shapes than the measured corpus.

A build computes the same hint from the same rules (schedule.select.rules_hint), so a rule change
shifts what a guided model reads; `tlmpack tlm hints` recomputes the file and the file records the
tlmpack version that wrote it.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from ..schedule.records import Decision
from ..tlm.language import NO_HINT, Hint
from .store import Store

HINTS_VERSION = 1


def hardware_key(hardware: dict) -> str:
    """The part of a record's hardware that a hint depends on, as one string (as dataset._groups)."""
    return json.dumps({k: v for k, v in hardware.items() if k not in ("features", "llvm_cpu")}, sort_keys=True)


def hints_path(store: Store, target: str) -> Path:
    return store.root / "hints" / f"{target}.json.gz"


def load_hints(store: Store, target: str) -> dict[tuple[str, str], Hint]:
    """(task key, hardware_key) -> the rules' hint ({} when none were computed)."""
    return _read(hints_path(store, target))


def _read(path: Path) -> dict[tuple[str, str], Hint]:
    if not path.is_file():
        return {}
    with gzip.open(path, "rt") as f:
        raw = json.load(f)
    return {(h["task"], h["hardware"]): Hint(h["sketch"], tuple(Decision.from_json(d) for d in h["decisions"]))
            for h in raw["hints"]}


def _hardwares(store: Store, target: str) -> dict[str, set[str]]:
    """task -> the hardware keys of its valid records (another machine's adapt batches excluded)."""
    out: dict[str, set[str]] = {}
    for r in store.records(target):
        if r.get("valid") and not r.get("role"):
            out.setdefault(r["task"], set()).add(hardware_key(r["hardware"]))
    return out


def rules_hint_for(func, target: str, hardware: dict) -> Hint:
    """The rules' schedule of one task on one recorded hardware, as a build computes it."""
    from ..schedule.select import rules_hint

    if target == "x86":
        from ..lower.x86 import x86_target
        from .dataset import hardware_of

        # the recorded machine, not the one computing the hints: an AVX2 host writing the hints of
        # AVX-512 records gave them AVX2 tiles (a record without its LLVM CPU gets this host's)
        t = x86_target(cpu=hardware.get("llvm_cpu"), num_cores=hardware["cores"])
        return rules_hint(func, t.tvm_target(), "x86", hardware_of({"target": "x86", "hardware": hardware}))
    from ..schedule.hardware import cuda_hardware
    from .cuda_programs import cuda_tvm_target

    return rules_hint(func, cuda_tvm_target(), "cuda", cuda_hardware(hardware["arch"]))


def compute_hints(store: Store, target: str, say: Callable[[str], None] = print) -> Path:
    """Writes data/hints/<target>.json.gz: the rules' point of every task on every hardware its
    records were taken on (x86: the records' core counts), NO_HINT where no rule fits."""
    tasks = _hardwares(store, target)
    return _write(hints_path(store, target), target, _rules_points(store, target, tasks, _cpus(_machines(store, target)), say))


def teacher_path(store: Store, target: str) -> Path:
    return store.root / "hints" / f"{target}-teacher.json.gz"


def _machines(store: Store, target: str) -> dict[str, Counter]:
    """hardware key -> how many of the store's valid records (adapt batches excluded) were taken on each
    LLVM CPU (None: a record that names none), in one read of the records."""
    counts: dict[str, Counter] = {}
    for r in store.records(target):
        if r.get("valid") and not r.get("role"):
            counts.setdefault(hardware_key(r["hardware"]), Counter())[r["hardware"].get("llvm_cpu")] += 1
    return counts


def _cpus(machines: dict[str, Counter]) -> dict[str, str]:
    """hardware key -> the LLVM CPU most of its records were taken on: the key leaves the CPU out
    (hints match on what the model reads), but the rules' target must be that machine's (an AVX2
    host computing an AVX-512 key's point gave it AVX2 tiles)."""
    named = {hw: Counter({cpu: n for cpu, n in c.items() if cpu}) for hw, c in machines.items()}
    return {hw: c.most_common(1)[0][0] for hw, c in named.items() if c}


def common_hardware(machines: dict[str, Counter], top: int) -> list[str]:
    """The ``top`` hardware keys most records were taken on."""
    return [hw for hw, _ in Counter({hw: c.total() for hw, c in machines.items()}).most_common(top)]


def teacher_tasks(store: Store, corpus_prefix: str) -> list[str]:
    """The tasks of the corpora named ``corpus_prefix``* that no record of any target measured."""
    from .dataset import measured_tasks

    measured = measured_tasks(store, "x86", valid=False) | measured_tasks(store, "cuda", valid=False)
    keys = {t["key"] for e in store.corpora() if e["model"].startswith(corpus_prefix) for t in e["tasks"]}
    return sorted(keys - measured)


def compute_teacher(store: Store, target: str, keys: list[str], top: int,
                    say: Callable[[str], None] = print) -> Path:
    """Writes the teacher file: the rules' point of each of ``keys`` on each of the ``top`` hardware
    keys most records were taken on."""
    machines = _machines(store, target)
    hardware = set(common_hardware(machines, top))
    say(f"{len(keys)} tasks on {len(hardware)} hardware descriptions")
    return _write(teacher_path(store, target), target,
                  _rules_points(store, target, {k: hardware for k in keys}, _cpus(machines), say))


def load_teacher(store: Store, target: str) -> dict[tuple[str, str], Hint]:
    """(task key, hardware_key) -> the rules' point ({} when no teacher file was written)."""
    return _read(teacher_path(store, target))


def _rules_points(store: Store, target: str, tasks: dict[str, set[str]], cpus: dict[str, str],
                  say: Callable[[str], None]) -> list[dict]:
    """The rules' point of each task on each of its hardware keys (on that key's LLVM CPU, ``cpus``)."""
    from .corpus import load_func

    out = []
    for i, key in enumerate(sorted(tasks), 1):
        func = load_func(store.task(key))
        for hw in sorted(tasks[key]):
            try:
                hint = rules_hint_for(func, target, json.loads(hw) | ({"llvm_cpu": cpus[hw]} if hw in cpus else {}))
            except Exception as e:  # a task the rules cannot schedule: the model reads no hint
                say(f"{key}: no hint ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})")
                hint = NO_HINT
            out.append({"task": key, "hardware": hw, "sketch": hint.sketch,
                        "decisions": [d.to_json() for d in hint.decisions]})
        if i % 25 == 0 or i == len(tasks):
            say(f"[{i}/{len(tasks)}] rules' points computed")
    return out


def _write(path: Path, target: str, out: list[dict]) -> Path:
    import tlmpack

    path.parent.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"v": HINTS_VERSION, "target": target, "tlmpack": tlmpack.__version__, "hints": out},
                      sort_keys=True, separators=(",", ":")).encode()
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as f:
        f.write(body)  # mtime 0: the same hints give the same bytes
    return path
