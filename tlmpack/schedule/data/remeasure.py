"""Repeatability: rebuild stored records from their task and decisions, measure them again, and
compare the medians (the dataset is only useful if a latency is a property of the program)."""

from __future__ import annotations

import random
import statistics
import time

from .store import Store


def remeasure(store: Store, count: int, seed: int = 0) -> dict:
    """Re-measures ``count`` random valid x86 records; reports the median relative difference
    |new - old| / old and the programs that no longer replay or check."""
    import os

    os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))
    from ...lower.x86 import x86_target
    from ..records import Decision
    from ..space import DesignSpace
    from .corpus import load_func
    from .measure import compile_batch, measure, run_reference
    from .sample import replay_point

    records = [r for r in store.records("x86") if r.get("valid")]
    chosen = random.Random(seed).sample(records, min(count, len(records)))
    target = x86_target().tvm_target()
    diffs, failures, started = [], 0, time.perf_counter()
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
            m = measure(mod, f"p{i}", args, expected) if mod is not None and not isinstance(mod, str) else None
            if m is None or not m.valid:
                failures += m is not None
                continue
            diffs.append(abs(m.median_us - r["median_us"]) / r["median_us"])
    return {"remeasured": len(diffs), "failures": failures,
            "median_rel_diff": statistics.median(diffs) if diffs else None,
            "p90_rel_diff": statistics.quantiles(diffs, n=10)[-1] if len(diffs) >= 10 else None,
            "seconds": round(time.perf_counter() - started, 1)}
