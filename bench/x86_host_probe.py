#!/usr/bin/env python
"""Does host_gate's probe tell when this shared host slows our kernels down?

    python bench/x86_host_probe.py [--seconds 240] [--programs 12] [--seed 5]

Rebuilds ``--programs`` random stored 1-thread x86 records (20 µs – 3 ms), then, for ``--seconds``,
alternates: probe, time every program (3 repeats of ≥ 3 ms, the fastest), probe. Prints, as JSON,
how the probe ratio (to its fastest) and the kernels' slowdown (each to its own fastest, median
over programs) move together: their correlation, and the slowdown when the probe says quiet
(ratio < host_gate.QUIET_RATIO) and when it does not.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=240.0)
    ap.add_argument("--programs", type=int, default=12)
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args()

    from tlmpack.runtime.kernels import KernelLibrary
    from tlmpack.training.host_gate import QUIET_RATIO, HostGate
    from tlmpack.training.store import Store, default_root
    from tlmpack.training.x86_build import build_job, load_reference

    store = Store(default_root())
    records = [r for r in store.records("x86") if r.get("valid") and r["hardware"]["cores"] == 1
               and r.get("timing") == "interleaved" and 20 < r["min_us"] < 3000]
    chosen = random.Random(args.seed).sample(records, args.programs)
    scratch = Path(tempfile.mkdtemp(prefix="tlmpack-probe-"))
    libraries = []
    try:
        for i, r in enumerate(chosen):
            folder = scratch / str(i)
            build_job(str(store.root), r["task"], 1, r.get("seed", 0), str(folder), points=[(r["sketch"], r["decisions"])])
            inputs, _ = load_reference(folder / "reference.npz")
            libraries.append((KernelLibrary(str(folder / "kernels.so"), 1), [a.copy() for a in inputs]))
        gate = HostGate(max_wait_s=0.0, path=str(scratch / "probe.json"))  # probe only, never wait
        probes, kernels = [], []
        deadline = time.perf_counter() + args.seconds
        while time.perf_counter() < deadline:
            before = gate.probe_us()
            kernels.append([min(lib.time("p0", arrays, repeats=3, min_repeat_ms=3)) for lib, arrays in libraries])
            probes.append(min(before, gate.probe_us()))
        probe = np.array(probes) / min(probes)
        times = np.array(kernels)
        slowdown = np.median(times / times.min(axis=0), axis=1)
        quiet = probe < QUIET_RATIO
        print(json.dumps({
            "iterations": len(probes), "programs": len(libraries), "seconds": args.seconds,
            "probe_ratio_p50_p90_max": np.percentile(probe, [50, 90, 100]).round(3).tolist(),
            "kernel_slowdown_p50_p90_max": np.percentile(slowdown, [50, 90, 100]).round(3).tolist(),
            "correlation": round(float(np.corrcoef(probe, slowdown)[0, 1]), 3),
            "quiet_fraction": round(float(quiet.mean()), 3),
            "slowdown_when_quiet_p50": round(float(np.median(slowdown[quiet])), 3) if quiet.any() else None,
            "slowdown_when_slow_p50": round(float(np.median(slowdown[~quiet])), 3) if (~quiet).any() else None,
        }))
    finally:
        for lib, _ in libraries:
            lib.close()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
