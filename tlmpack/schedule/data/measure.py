"""x86 measurement of sampled programs: build a batch with TVM (one tvm.compile for many programs is
much faster than one each), run every program on the task's random inputs, check it against the
unscheduled reference, then time the median of repeats after a warm-up.

Programs run through TVM's runtime (its thread pool, sized by TVM_NUM_THREADS), not yet through
runtime_c's kernel path: the kernels are the same object code, the pool differs.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

REL_TOL = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 2e-2, "float64": 1e-9}


@dataclass(frozen=True)
class Measurement:
    """One program's outcome. Invalid programs carry ``error`` and no latency."""

    valid: bool
    median_us: float = 0.0
    min_us: float = 0.0
    spread: float = 0.0  # (max - min) / median over the timed repeats
    repeats: int = 0
    rel_err: float = 0.0
    error: str = ""
    other_load: float = 0.0  # cores other processes kept busy just before timing

    def to_json(self) -> dict:
        return {"valid": self.valid, "median_us": round(self.median_us, 3), "min_us": round(self.min_us, 3),
                "spread": round(self.spread, 4), "repeats": self.repeats, "rel_err": float(f"{self.rel_err:.3g}"),
                "error": self.error, "other_load": round(self.other_load, 2)}


def _shape(param) -> tuple[int, ...]:
    return tuple(int(d) for d in param.shape)


def random_arguments(func, num_outputs: int, seed: int) -> list[np.ndarray]:
    """Inputs: floats uniform in [0.1, 1) (safe for sqrt/log/division), integers 0 or 1 (safe as
    gather indices). Outputs: NaN (or -1), so a program that skips elements is caught."""
    rng = np.random.default_rng(seed)
    params = list(func.params)
    arrays = []
    for i, p in enumerate(params):
        dtype, shape = np.dtype(str(p.dtype)) if str(p.dtype) != "bool" else np.dtype(bool), _shape(p)
        if i >= len(params) - num_outputs:
            arrays.append(np.full(shape, np.nan if dtype.kind == "f" else -1, dtype=dtype) if dtype.kind != "b"
                          else np.zeros(shape, dtype))
        elif dtype.kind == "f":
            arrays.append(rng.uniform(0.1, 1.0, shape).astype(dtype))
        elif dtype.kind == "b":
            arrays.append(rng.integers(0, 2, shape).astype(bool))
        else:
            arrays.append(rng.integers(0, 2, shape).astype(dtype))
    return arrays


def _compile(funcs: dict[str, Any], target):
    import tvm

    mod = tvm.IRModule({name: f.with_attr("global_symbol", name) for name, f in funcs.items()})
    return tvm.compile(mod, target=target)


def compile_batch(funcs: dict[str, Any], target) -> dict[str, Any]:
    """name -> callable runtime module holding it, or the build error text. One compile for the
    batch; if it fails, each program alone, so one bad program does not sink the others."""
    try:
        ex = _compile(funcs, target)
        return {name: ex.mod for name in funcs}
    except Exception:  # noqa: BLE001  (TVM raises many kinds)
        out: dict[str, Any] = {}
        for name, f in funcs.items():
            try:
                out[name] = _compile({name: f}, target).mod
            except Exception as e:  # noqa: BLE001
                out[name] = f"build: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        return out


def run_reference(func, num_outputs: int, target, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Runs the unscheduled task once: (arguments, expected outputs)."""
    import tvm

    args = random_arguments(func, num_outputs, seed)
    mod = _compile({"reference": func}, target).mod
    tensors = [tvm.runtime.tensor(a) for a in args]
    mod["reference"](*tensors)
    return args, [t.numpy() for t in tensors[len(args) - num_outputs:]]


def check(outputs: list[np.ndarray], expected: list[np.ndarray]) -> tuple[bool, float, str]:
    """Valid when every output matches: non-finite exactly where the reference is, relative L2
    error within the dtype's tolerance, not all zero unless the reference is."""
    worst = 0.0
    for got, ref in zip(outputs, expected, strict=True):
        if got.dtype.kind != "f":
            if not np.array_equal(got, ref):
                return False, 1.0, "mismatch (exact dtype)"
            continue
        finite = np.isfinite(ref)
        if not np.array_equal(np.isfinite(got), finite):
            return False, float("inf"), "NaN/Inf where the reference is finite (or the reverse)"
        g, r = got[finite].astype(np.float64), ref[finite].astype(np.float64)
        if not np.any(g) and np.any(r):
            return False, 1.0, "all-zero output"
        err = float(np.linalg.norm(g - r) / max(np.linalg.norm(r), 1e-30))
        worst = max(worst, err)
        if err > REL_TOL.get(str(got.dtype), 1e-4):
            return False, err, f"rel err {err:.2e}"
    return True, worst, ""


def _cpu_snapshot() -> tuple[int, int, int]:
    """(all jiffies, idle jiffies) of the machine and this process's own (all threads)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:9]]
    with open("/proc/self/stat") as f:
        own = f.read().rsplit(")", 1)[1].split()
    return sum(values), values[3] + values[4], int(own[11]) + int(own[12])


def other_load(window_s: float = 0.1) -> float:
    """How many cores other processes kept busy over ``window_s`` (0 where /proc is missing)."""
    try:
        total0, idle0, own0 = _cpu_snapshot()
        time.sleep(window_s)
        total1, idle1, own1 = _cpu_snapshot()
    except (OSError, ValueError, IndexError):
        return 0.0
    cores = os.cpu_count() or 1
    busy = (total1 - total0) - (idle1 - idle0) - (own1 - own0)
    return max(0.0, cores * busy / max(total1 - total0, 1))


def wait_quiet(max_other: float = 0.5, timeout_s: float = 30.0) -> float:
    """The build host is shared: a parallel kernel whose second thread waits for a busy core runs
    at half speed or worse. So time only when other processes leave the cores free (or give up
    after ``timeout_s`` and say how busy it was; the record keeps that number)."""
    deadline = time.perf_counter() + timeout_s
    load = other_load()
    while load > max_other and time.perf_counter() < deadline:
        time.sleep(0.5)
        load = other_load()
    return load


def time_program(mod, name: str, tensors, repeats: int = 5, min_repeat_ms: int = 20) -> list[float]:
    """Seconds per run for ``repeats`` timed repeats after one untimed warm-up repeat; each repeat
    runs the program often enough to last ``min_repeat_ms``."""
    import tvm

    evaluator = mod.time_evaluator(name, tvm.cpu(), number=1, repeat=repeats + 1, min_repeat_ms=int(min_repeat_ms))
    return list(evaluator(*tensors).results)[1:]


def measure(mod, name: str, args: list[np.ndarray], expected: list[np.ndarray], repeats: int = 5,
            max_wait_s: float = 30.0, max_other: float = 0.5) -> Measurement:
    """Checks one built program, then times it (after waiting up to ``max_wait_s`` for quiet cores)."""
    import tvm

    tensors = [tvm.runtime.tensor(a) for a in args]  # fresh copies: outputs start as NaN again
    try:
        started = time.perf_counter()
        mod[name](*tensors)
        first = time.perf_counter() - started
    except Exception as e:  # noqa: BLE001
        return Measurement(False, error=f"run: {type(e).__name__}: {str(e)[:200]}")
    ok, err, why = check([t.numpy() for t in tensors[len(args) - len(expected):]], expected)
    if not ok:
        return Measurement(False, rel_err=err, error=why)
    load = wait_quiet(max_other, timeout_s=max_wait_s)
    times = time_program(mod, name, tensors, repeats=3 if first > 0.2 else repeats)
    median = statistics.median(times)
    return Measurement(True, median * 1e6, min(times) * 1e6, (max(times) - min(times)) / median, len(times), err,
                       other_load=max(load, other_load(0.05)))
