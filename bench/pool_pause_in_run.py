#!/usr/bin/env python
"""A run that works alone between two parallel launches: what the pool's spin costs or saves.

    python bench/pool_pause_in_run.py [--lib NAME=PATH ...] [--pauses 0 300 600] [--gaps-ms 0 5]
                                      [--runs 200] [--threads 2] [--rounds 3]

The fabricated artifact of tests/fixtures_runtime (two steps; the second, with FAKE_RELAUNCH_AFTER_US=P,
works alone on the calling thread for P us and then launches an empty parallel loop) is run by each
C runtime named (each in a process of its own, the order alternating by round), idle GAP ms before each
run. Reported per runtime, pause and gap: the median over rounds of the mean us a run (from the C
profiler, entry to return) and of the launches a run that found the workers asleep (a runtime before API
version 8 does not count them: 0). A runtime built with -DTLMRT_CPU_RUN_SPIN_NS=N keeps its
workers spinning through such a pause, one built without it lets them sleep after 50 us.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests" / "fixtures_runtime"))

CHILD = """
import json, sys, time
import numpy as np
import tlmpack.runtime as rt
art, threads, runs, gap_ms = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
feed = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "k": np.array([3], dtype=np.int32)}
with rt.load(art, num_threads=threads) as m:
    m.run(None, feed)
    m._lib.set_profiling(m._handle, True)
    for _ in range(runs):
        if gap_ms:
            time.sleep(gap_ms / 1e3)
        m.run(None, feed)
    r = m._lib.profile(m._handle)
print(json.dumps({"us": r.run_ns / runs / 1e3, "wakes": r.pool_wakes / runs, "launches": r.pool_launches / runs}))
"""


def run_child(art: Path, lib: str | None, threads: int, runs: int, gap_ms: float, pause: int) -> dict:
    env = dict(os.environ, FAKE_RELAUNCH_AFTER_US=str(pause), PYTHONPATH=str(ROOT))
    env.pop("TLMPACK_RUNTIME_LIB", None)
    if lib:
        env["TLMPACK_RUNTIME_LIB"] = lib
    out = subprocess.run([sys.executable, "-c", CHILD, str(art), str(threads), str(runs), str(gap_ms)],
                         env=env, capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    import fabricate

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", action="append", default=[], metavar="NAME=PATH",
                    help="a libtlmrt.so to time (default: the package's, as 'package')")
    ap.add_argument("--pauses", type=int, nargs="+", default=[0, 300, 600])
    ap.add_argument("--gaps-ms", type=float, nargs="+", default=[0.0, 5.0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    libs = dict(item.split("=", 1) for item in args.lib) or {"package": ""}
    with tempfile.TemporaryDirectory() as scratch:
        art = fabricate.make_artifact(Path(scratch) / "fake")
        results: dict[tuple[str, float, int], list[dict]] = {}
        for r in range(args.rounds):
            names = list(libs) if r % 2 == 0 else list(reversed(libs))
            for gap in args.gaps_ms:
                for pause in args.pauses:
                    for name in names:
                        results.setdefault((name, gap, pause), []).append(
                            run_child(art, libs[name] or None, args.threads, args.runs, gap, pause))
    print(f"{args.threads} threads, {args.runs} runs a round, {args.rounds} rounds, {os.cpu_count()} CPUs")
    print("| runtime | gap ms | pause us | us a run | launches a run that woke sleepers |")
    print("|---|---:|---:|---:|---:|")
    for (name, gap, pause), rows in results.items():
        us = statistics.median(x["us"] for x in rows)
        wakes = statistics.median(x["wakes"] for x in rows)
        print(f"| {name} | {gap:g} | {pause} | {us:.1f} | {wakes:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
