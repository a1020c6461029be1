"""How repeatable an x86 timing is, with 1 and with 2 runtime_c threads: builds a few random programs
of some stored tasks, times each twice back to back with each thread count, and prints the median
relative difference between the two timings (the noise of the procedure itself, no drift), of the
medians and of the minima over the interleaved rounds.

    python bench/x86_timer_noise.py --tasks 5 --per-task 6 --seed 7 [--pause-niced]

Run it on a quiet machine (or with --pause-niced, which stops this user's lower-priority
processes while a kernel is timed, like `tlmpack tlm collect --pause-niced`).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=5)
    ap.add_argument("--per-task", type=int, default=6)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--threads", default="1,2", help="thread counts to compare")
    ap.add_argument("--pause-niced", action="store_true")
    ap.add_argument("--data", default=None, help="the store (default: the checkout's data/)")
    args = ap.parse_args()

    from tlmpack.training.measure import measure_folders, niced_processes
    from tlmpack.training.store import Store, default_root
    from tlmpack.training.x86_build import build_job

    store = Store(args.data or default_root())
    keys = store.task_keys()
    random.Random(args.seed).shuffle(keys)
    thread_counts = [int(t) for t in args.threads.split(",")]
    diffs: dict[int, list[float]] = {t: [] for t in thread_counts}
    min_diffs: dict[int, list[float]] = {t: [] for t in thread_counts}
    scratch = Path(tempfile.mkdtemp(prefix="tlmpack-noise-"))
    try:
        builds = []
        for key in keys[:args.tasks]:
            folder = scratch / key
            job = build_job(str(store.root), key, max(thread_counts), args.seed, str(folder), count=args.per_task)
            builds.append((str(folder), [n for n, _, _ in job.programs]))
        for threads in thread_counts:
            pause = niced_processes() if args.pause_niced else []
            # all programs in one interleaved pass, as `tlmpack tlm collect` times them
            first = measure_folders(builds, threads, pause, max_other=99, max_wait_s=0)
            second = measure_folders(builds, threads, pause, max_other=99, max_wait_s=0)
            for folder, names in builds:
                for n in names:
                    a, b = first[folder][n], second[folder][n]
                    if a.valid and b.valid:
                        diffs[threads].append(abs(a.median_us - b.median_us) / a.median_us)
                        min_diffs[threads].append(abs(a.min_us - b.min_us) / a.min_us)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "programs": len(diffs[thread_counts[0]]),
                      "back_to_back_median_rel_diff": {t: round(statistics.median(d), 4) for t, d in diffs.items() if d},
                      "back_to_back_min_rel_diff": {t: round(statistics.median(d), 4) for t, d in min_diffs.items() if d}}))


if __name__ == "__main__":
    main()
