"""Repeatability: rebuild stored records from their task and decisions, measure them again, and
compare the medians (the dataset is only useful if a latency is a property of the program)."""

from __future__ import annotations

import random
import statistics
import time

from .store import Store, is_quiet


def remeasure(store: Store, count: int, seed: int = 0, back_to_back: bool = False, threads: int | None = None,
              max_wait_s: float = 30.0) -> dict:
    """Re-measures ``count`` random valid, quiet x86 records taken on ``threads`` cores; reports the median relative difference
    |new - old| / old (of the medians, and of the minima) and the programs that no longer replay
    or check. ``back_to_back``: also measure each program twice now, which separates the noise of
    the procedure from drift in the machine's load since the record was taken."""
    import os

    from .collect import use_threads

    threads = use_threads(threads)
    max_other = (os.cpu_count() or threads) - threads + 0.2
    from ...lower.x86 import x86_target
    from ..records import Decision
    from ..space import DesignSpace
    from .corpus import load_func
    from .measure import compile_batch, measure, run_reference
    from .sample import replay_point

    records = [r for r in store.records("x86") if r.get("valid") and r["hardware"]["cores"] == threads
               and is_quiet(r)]  # quiet records: what training should use
    chosen = random.Random(seed).sample(records, min(count, len(records)))
    target = x86_target(num_cores=threads).tvm_target()
    diffs, min_diffs, again_diffs, ratios, loads = [], [], [], [], []
    failures, started = 0, time.perf_counter()
    by_task: dict[str, list[dict]] = {}
    for r in chosen:
        by_task.setdefault(r["task"], []).append(r)
    for key, recs in by_task.items():
        task = store.task(key)
        func = load_func(task)
        space = DesignSpace(func, target, seed=recs[0].get("seed", 0))
        args, expected = run_reference(func, task["num_outputs"], target, (int(key[:8], 16) ^ recs[0].get("seed", 0))
                                       & 0x7FFFFFFF)
        points = [replay_point(space, r["sketch"], tuple(Decision.from_json(d) for d in r["decisions"])) for r in recs]
        funcs = {f"p{i}": p.func for i, p in enumerate(points) if p is not None}
        failures += sum(p is None for p in points)
        built = compile_batch(funcs, target) if funcs else {}
        for i, r in enumerate(recs):
            mod = built.get(f"p{i}")
            m = measure(mod, f"p{i}", args, expected, max_wait_s=max_wait_s, max_other=max_other) \
                if mod is not None and not isinstance(mod, str) else None
            if m is None or not m.valid:
                failures += m is not None
                continue
            loads.append(m.other_load)
            diffs.append(abs(m.median_us - r["median_us"]) / r["median_us"])
            ratios.append(m.median_us / r["median_us"])
            min_diffs.append(abs(m.min_us - r["min_us"]) / r["min_us"])
            if back_to_back:
                m2 = measure(mod, f"p{i}", args, expected, max_wait_s=max_wait_s, max_other=max_other)
                again_diffs.append(abs(m2.median_us - m.median_us) / m.median_us)
    return {"remeasured": len(diffs), "failures": failures, "threads": os.environ["TVM_NUM_THREADS"],
            "median_rel_diff": _median(diffs), "median_new_over_old": _median(ratios), "p90_rel_diff": _p90(diffs),
            "min_rel_diff": _median(min_diffs), "back_to_back_median_rel_diff": _median(again_diffs),
            "median_other_load": _median(loads), "seconds": round(time.perf_counter() - started, 1)}


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def _p90(values: list[float]) -> float | None:
    return round(statistics.quantiles(values, n=10)[-1], 4) if len(values) >= 10 else None
