"""``tlmpack build --tune N``: measure N candidate schedules of each x86 task on the build host
(the TLM's greedy pick and top-k samples, plus the rules' point) and keep the fastest.

The only measurement a build ever makes, and only when asked. Candidates are timed as the
dataset times programs: built together into one library by TVM, run through runtime_c's kernel
API (the deployed thread pool and hooks) on seeded random inputs, in interleaved rounds, the
minimum over rounds kept. Each is the kernel the build would run: replayed on the build's
(pre-packing) space, its constant weight packed for its own tiling (lower/prepack.py).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .records import Decision
from .space import DesignSpace, fixed_decider

ROUNDS = 3
ROUND_MS = 2.0


@dataclass(frozen=True)
class Tuned:
    """The fastest candidate: its point, its latency, and every candidate's (µs; None: failed)."""

    sketch: int
    decisions: tuple[Decision, ...]
    best_us: float
    latencies: dict[str, float | None]


def measure_candidates(func, num_outputs: int, tvm_target, candidates: dict[str, tuple[int, tuple[Decision, ...]]],
                       threads: int, weight_param: int | None = None) -> dict[str, float | None]:
    """name -> min µs over interleaved rounds (None when the point did not replay, build or run).
    ``weight_param``: the parameter the build pre-packs; each candidate's kernel then reads it
    packed for its own tiling, as the built model's will."""
    import numpy as np

    from ..lower.x86 import compile_kernels
    from ..runtime.kernels import KernelLibrary, random_arguments

    args = random_arguments(func, num_outputs, seed=0)
    kernels = _as_built(func, num_outputs, tvm_target, candidates, weight_param, args)
    out: dict[str, float | None] = {name: None for name in candidates}
    if not kernels:
        return out
    with tempfile.TemporaryDirectory(prefix="tlmpack-tune-") as tmp:
        path = Path(tmp) / "candidates.so"
        try:
            compile_kernels({n: f for n, (f, _) in kernels.items()}, tvm_target).export_library(str(path))
        except Exception:  # noqa: BLE001  one bad candidate: build them one by one
            return out | {n: _measure_one(f, own, tvm_target, threads, n) for n, (f, own) in kernels.items()}
        with KernelLibrary(str(path), threads) as lib:
            best: dict[str, float] = {}
            for _ in range(ROUNDS):
                for name, (_, own) in kernels.items():
                    try:
                        times = lib.time(name, [a.copy() for a in own], repeats=1, min_repeat_ms=ROUND_MS)
                    except Exception:  # noqa: BLE001  a candidate that fails to run is out
                        best[name] = float("nan")
                        continue
                    if not np.isnan(best.get(name, 0.0)):
                        best[name] = min(best.get(name, float("inf")), min(times) * 1e6)
    return out | {n: (None if np.isnan(t) else t) for n, t in best.items()}


def _as_built(func, num_outputs: int, tvm_target, candidates: dict[str, tuple[int, tuple[Decision, ...]]],
              weight_param: int | None, args: list) -> dict[str, tuple[Any, list]]:
    """name -> (the kernel a build would run for the candidate, its arguments): replayed on the
    build's space, split from its packer where the weight is pre-packed (the weight then packed)."""
    from ..lower.prepack import Packer, kernel_as_built
    from .select import mark_layout_free

    space = DesignSpace(mark_layout_free(func, weight_param), tvm_target)
    packer = Packer() if weight_param is not None else None
    out: dict[str, tuple[Any, list]] = {}
    for name, (sketch, decisions) in candidates.items():
        replayed = space.replay(sketch, fixed_decider(decisions), locations=True)
        if replayed is None:
            continue
        kernel, own = replayed[0], args
        if packer is not None:
            try:
                kernel, packed = kernel_as_built(kernel, num_outputs, weight_param, args[weight_param], packer)
            except Exception:  # noqa: BLE001  the build would fall back to the plain weight: not this point
                continue
            if packed is not None:
                own = [packed if i == weight_param else a for i, a in enumerate(args)]
        out[name] = (kernel.with_attr("global_symbol", name), own)
    return out


def _measure_one(func, args: list, tvm_target, threads: int, name: str) -> float | None:
    from ..lower.x86 import compile_kernels
    from ..runtime.kernels import KernelLibrary

    with tempfile.TemporaryDirectory(prefix="tlmpack-tune-") as tmp:
        path = Path(tmp) / "one.so"
        try:
            compile_kernels({name: func}, tvm_target).export_library(str(path))
            with KernelLibrary(str(path), threads) as lib:
                return min(min(lib.time(name, [a.copy() for a in args], 1, ROUND_MS)) for _ in range(ROUNDS)) * 1e6
        except Exception:  # noqa: BLE001
            return None


def tune_task(func, num_outputs: int, tvm_target, threads: int, tlm_points: list, rule_point,
              say: Callable[[str], None] | None = None, weight_param: int | None = None) -> Tuned | None:
    """Measures the TLM's points (decode.Decoded, greedy first) and the rules' (RuleChoice or
    None); the fastest that ran."""
    candidates: dict[str, tuple[int, tuple[Decision, ...]]] = {}
    for i, d in enumerate(tlm_points):
        candidates["tlm_greedy" if i == 0 else f"tlm_{i}"] = (d.sketch, d.decisions)
    if rule_point is not None:
        candidates["heuristic"] = (rule_point.sketch, rule_point.decisions)
    started = time.perf_counter()
    latencies = measure_candidates(func, num_outputs, tvm_target, candidates, threads, weight_param)
    timed = {n: t for n, t in latencies.items() if t is not None}
    if say:
        say(f"  tuned {len(candidates)} candidates in {time.perf_counter() - started:.1f} s")
    if not timed:
        return None
    name = min(timed, key=lambda n: (timed[n], n))
    sketch, decisions = candidates[name]
    return Tuned(sketch, decisions, timed[name], latencies)
