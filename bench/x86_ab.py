#!/usr/bin/env python
"""Two builds of the same model, side by side on x86: which is faster, and do they agree?

    python bench/x86_ab.py NAME=A.tar,B.tar [NAME=A.tar,B.tar ...] --inputs-dir out/bench
                           [--threads 2] [--rounds 5] [--runs 10] [--warmup 3]

For each pair, both artifacts are loaded with tlmpack.runtime (no TVM) and run on
``<inputs-dir>/<NAME>.inputs.npz`` (bench_x86.py writes it). Rounds alternate which goes first; in
each, an artifact runs ``--warmup`` untimed runs, then ``--runs`` timed runs back to back, so host
drift hits both alike. Each pair runs twice, loading A first and then B first (so neither
gets the better memory placement or pool start-up every time), and B/A is the geometric mean of
the two orders. Before each block the host gate (tlmpack's x86 dataset timer, host_gate.py)
waits up to ``--host-wait-s`` for the host's other tenants to leave this core alone. Prints a markdown row per model: median ms of each, B/A, and the relative
difference of their outputs. Meant for "before / after" a scheduling change: build A with the old
checkout, B with the new one.

An artifact may carry environment settings for its load, ``PATH?KEY=VALUE[&KEY=VALUE]``: the same
artifact with and without a runtime setting, e.g.
``resnet50=R.tar,R.tar?TLMRT_CPU_TASKS_PER_THREAD=1`` (the pool's tasks per thread, read when the
model's pool is made).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
from bench_x86 import load_spec


def _timed(model, feed: dict, warmup: int, runs: int) -> list[float]:
    for _ in range(warmup):
        model.run(None, feed)
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        model.run(None, feed)
        out.append((time.perf_counter() - started) * 1e3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pairs", nargs="+", metavar="NAME=A.tar,B.tar")
    ap.add_argument("--inputs-dir", type=Path, default=Path("out/bench"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--host-wait-s", type=float, default=60.0, help="per block; 0: time whatever the host does")
    args = ap.parse_args()

    import tlmpack.runtime as rt
    from tlmpack.training.host_gate import HostGate

    print("| model | A ms (A loaded first / B first) | B ms (A first / B first) | B/A (geometric mean) | outputs rel diff |")
    print("|---|---:|---:|---:|---:|")
    for pair in args.pairs:
        name, _, paths = pair.partition("=")
        first, second = paths.split(",")
        with np.load(args.inputs_dir / f"{name}.inputs.npz") as z:
            feed = {k: z[k] for k in z.files}
        medians = {}
        for order in ((first, second), (second, first)):
            loaded = {spec: load_spec(rt.load, spec, args.threads) for spec in order}
            models = [loaded[first], loaded[second]]
            outputs = [m.run(None, feed)[0] for m in models]
            diff = float(np.linalg.norm(outputs[1] - outputs[0]) / max(np.linalg.norm(outputs[0]), 1e-30))
            times: list[list[float]] = [[], []]
            for r in range(args.rounds):
                for i in ((0, 1) if r % 2 == 0 else (1, 0)):
                    HostGate(args.host_wait_s).wait()
                    times[i] += _timed(models[i], feed, args.warmup, args.runs)
            medians[order[0]] = (statistics.median(times[0]), statistics.median(times[1]))
            del loaded, models
        (a1, b1), (a2, b2) = medians[first], medians[second]
        ratio = ((b1 / a1) * (b2 / a2)) ** 0.5
        print(f"| {name} | {a1:.2f} / {a2:.2f} | {b1:.2f} / {b2:.2f} | {ratio:.2f} | {diff:.1e} |", flush=True)


if __name__ == "__main__":
    main()
