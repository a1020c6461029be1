"""Repeatability: rebuild stored records from their task and decisions, measure them again, and
compare the medians (the dataset is only useful if a latency is a property of the program)."""

from __future__ import annotations

import random
import statistics
import time

from .report import X86_LATENCY
from .store import Store, is_quiet

STATISTICS = ("min_us", "median_us")  # what a record keeps of its rounds: fastest, median


def remeasure(store: Store, count: int, seed: int = 0, back_to_back: bool = False, threads: int | None = None,
              max_wait_s: float = 30.0, pause_niced: bool = False, quiet_only: bool = True,
              timing: str | None = "interleaved") -> dict:
    """Re-measures ``count`` random valid, quiet x86 records taken on ``threads`` cores through
    runtime_c; reports, for each record statistic (``min_us``: the fastest interleaved round, the
    latency training and the tables use; ``median_us``: the median round), the median and p90 of
    the relative difference |new - old| / old and the median new / old, and the programs that no
    longer replay or check. ``back_to_back``: also measure
    each program twice now, which separates the noise of the procedure from drift in the
    machine's load since the record was taken. ``quiet_only``: only records timed on quiet cores
    (what training uses). ``timing``: only records timed that way (``"interleaved"`` rounds, or
    ``"burst"``: the first runtime_c records, 5 repeats back to back); None: all."""
    import os
    import shutil
    import tempfile

    from .measure import allowed_other_load, measure_folders, niced_processes
    from .x86_build import build_job

    threads = threads or len(os.sched_getaffinity(0))
    max_other = allowed_other_load(threads)
    records = [r for r in store.records("x86", as_built=True) if r.get("valid") and r["hardware"]["cores"] == threads
               and (is_quiet(r) or not quiet_only) and r.get("timer") == "runtime_c"
               and timing in (None, r.get("timing", "burst"))]
    chosen = random.Random(seed).sample(records, min(count, len(records)))
    diffs: dict[str, list[float]] = {stat: [] for stat in STATISTICS}
    ratios: dict[str, list[float]] = {stat: [] for stat in STATISTICS}
    again: dict[str, list[float]] = {stat: [] for stat in STATISTICS}
    loads: list[float] = []
    failures, started = 0, time.perf_counter()
    by_task: dict[tuple[str, int], list[dict]] = {}
    for r in chosen:
        by_task.setdefault((r["task"], r.get("seed", 0)), []).append(r)
    scratch = tempfile.mkdtemp(prefix="tlmpack-repeat-")
    try:
        builds, records = [], {}
        for (key, record_seed), recs in by_task.items():
            folder = os.path.join(scratch, key)
            job = build_job(str(store.root), key, threads, record_seed, folder,
                            points=[(r["sketch"], r["decisions"]) for r in recs])
            failures += len(job.failed) + (len(recs) if job.error else 0)
            if job.error or not job.programs:
                continue
            names = [n for n, _, _ in job.programs]
            builds.append((folder, names))
            records.update({(folder, n): recs[int(n[1:])] for n in names})
        pause = niced_processes() if pause_niced else []
        # every program in one interleaved pass, as the collector times a batch of builds
        now = measure_folders(builds, threads, pause, max_other, max_wait_s)
        second = measure_folders(builds, threads, pause, max_other, max_wait_s) if back_to_back else {}
        for folder, names in builds:
            for name in names:
                r, m = records[folder, name], now[folder][name]
                if not m.valid:
                    failures += 1
                    continue
                loads.append(m.other_load)
                repeat = second.get(folder, {}).get(name)
                for stat in STATISTICS:
                    new, old = getattr(m, stat), r[stat]
                    diffs[stat].append(abs(new - old) / old)
                    ratios[stat].append(new / old)
                    if repeat is not None and repeat.valid:
                        again[stat].append(abs(getattr(repeat, stat) - new) / new)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out = {"remeasured": len(diffs["min_us"]), "timing": timing or "any", "failures": failures, "threads": threads,
           "latency": X86_LATENCY, "median_other_load": _median(loads), "seconds": round(time.perf_counter() - started, 1)}
    for stat in STATISTICS:
        out[stat] = {"median_rel_diff": _median(diffs[stat]), "p90_rel_diff": _p90(diffs[stat]),
                     "median_new_over_old": _median(ratios[stat]), "back_to_back_median_rel_diff": _median(again[stat])}
    return out


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def _p90(values: list[float]) -> float | None:
    return round(statistics.quantiles(values, n=10)[-1], 4) if len(values) >= 10 else None
