"""Repeatability: rebuild stored records from their task and decisions, measure them again, and
compare the medians (the dataset is only useful if a latency is a property of the program)."""

from __future__ import annotations

import random
import statistics
import time

from .store import Store, is_quiet


def remeasure(store: Store, count: int, seed: int = 0, back_to_back: bool = False, threads: int | None = None,
              max_wait_s: float = 30.0, pause_niced: bool = False, quiet_only: bool = True,
              timing: str | None = "interleaved") -> dict:
    """Re-measures ``count`` random valid, quiet x86 records taken on ``threads`` cores through
    runtime_c; reports the median relative difference |new - old| / old (of the medians, and of
    the minima) and the programs that no longer replay or check. ``back_to_back``: also measure
    each program twice now, which separates the noise of the procedure from drift in the
    machine's load since the record was taken. ``quiet_only``: only records timed on quiet cores
    (what training uses). ``timing``: only records timed that way (``"interleaved"`` rounds, or
    ``"burst"``: the first runtime_c records, 5 repeats back to back); None: all."""
    import os
    import shutil
    import tempfile

    from .measure import measure_folders, niced_processes
    from .x86_build import build_job

    threads = threads or len(os.sched_getaffinity(0))
    max_other = (os.cpu_count() or threads) - threads + 0.2
    records = [r for r in store.records("x86") if r.get("valid") and r["hardware"]["cores"] == threads
               and (is_quiet(r) or not quiet_only) and r.get("timer") == "runtime_c"
               and timing in (None, r.get("timing", "burst"))]
    chosen = random.Random(seed).sample(records, min(count, len(records)))
    diffs, min_diffs, again_diffs, again_min_diffs, ratios, loads = [], [], [], [], [], []
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
        again = measure_folders(builds, threads, pause, max_other, max_wait_s) if back_to_back else {}
        for folder, names in builds:
            for name in names:
                r, m = records[folder, name], now[folder][name]
                if not m.valid:
                    failures += 1
                    continue
                loads.append(m.other_load)
                diffs.append(abs(m.median_us - r["median_us"]) / r["median_us"])
                ratios.append(m.median_us / r["median_us"])
                min_diffs.append(abs(m.min_us - r["min_us"]) / r["min_us"])
                second = again.get(folder, {}).get(name)
                if second is not None and second.valid:
                    again_diffs.append(abs(second.median_us - m.median_us) / m.median_us)
                    again_min_diffs.append(abs(second.min_us - m.min_us) / m.min_us)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"remeasured": len(diffs), "timing": timing or "any", "failures": failures, "threads": threads,
            "median_rel_diff": _median(diffs), "median_new_over_old": _median(ratios), "p90_rel_diff": _p90(diffs),
            "min_rel_diff": _median(min_diffs), "back_to_back_median_rel_diff": _median(again_diffs),
            "back_to_back_min_rel_diff": _median(again_min_diffs),
            "median_other_load": _median(loads), "seconds": round(time.perf_counter() - started, 1)}


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def _p90(values: list[float]) -> float | None:
    return round(statistics.quantiles(values, n=10)[-1], 4) if len(values) >= 10 else None
