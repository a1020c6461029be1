#!/usr/bin/env python
"""One thread, by the calling thread's CPU time: tlmpack artifacts against onnxruntime on a busy host.

    python bench/x86_cpu_time.py NAME A.tar[,B.tar ...] [--inputs-dir out/bench] [--rounds 4] [--runs 3]

At one thread both engines run on the calling thread (tlmpack ``num_threads=1``, onnxruntime
``intra_op_num_threads=1``), so ``time.thread_time_ns`` around a run counts only the time this
thread ran: the time the OS gave other processes on the core is left out, and the per-thread speed
of the kernels is compared even while other tenants load the host (they still share caches and
memory bandwidth, so this is not a quiet host's figure). Rounds alternate the engines' order; in
each, an engine runs once untimed, then ``--runs`` timed runs. Prints one markdown row per engine:
the minimum and median CPU ms, the minimum against onnxruntime's, and the output's relative L2
error against onnxruntime's. ``<inputs-dir>/<NAME>.onnx`` and ``<NAME>.inputs.npz`` are
bench_x86.py's. Nothing is appended to BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name")
    ap.add_argument("artifacts", help="comma-separated .tar files")
    ap.add_argument("--inputs-dir", type=Path, default=Path("out/bench"))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()

    import onnxruntime as ort

    import tlmpack.runtime as rt

    with np.load(args.inputs_dir / f"{args.name}.inputs.npz") as z:
        feed = {k: z[k] for k in z.files}
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(args.inputs_dir / f"{args.name}.onnx"), options,
                                   providers=["CPUExecutionProvider"])
    engines = [("onnxruntime", lambda: session.run(None, feed)[0])]
    for path in args.artifacts.split(","):
        model = rt.load(path, device="cpu", num_threads=1)
        engines.append((path, lambda model=model: model.run(None, feed)[0]))
    reference = engines[0][1]()
    cpu_ms: dict[str, list[float]] = {name: [] for name, _ in engines}
    for r in range(args.rounds):
        for name, run in engines if r % 2 == 0 else engines[::-1]:
            run()
            for _ in range(args.runs):
                started = time.thread_time_ns()
                run()
                cpu_ms[name].append((time.thread_time_ns() - started) / 1e6)
    base = min(cpu_ms["onnxruntime"])
    print("| model | engine | CPU ms min | CPU ms median | min / onnxruntime | rel err |")
    print("|---|---|---:|---:|---:|---:|")
    for name, run in engines:
        out = run()
        rel = float(np.linalg.norm(out - reference) / np.linalg.norm(reference))
        times = cpu_ms[name]
        print(f"| {args.name} | {name} | {min(times):.2f} | {statistics.median(times):.2f} | "
              f"{min(times) / base:.3f} | {rel:.1e} |")


if __name__ == "__main__":
    main()
