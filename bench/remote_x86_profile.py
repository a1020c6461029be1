#!/usr/bin/env python
"""On another x86 machine (numpy, onnxruntime and our C runtime; no TVM): where a cross-built
artifact's time goes at each thread count, kernel by kernel, beside onnxruntime's time per node of
the same model, to see which kernels keep a model from scaling.

    python bench/remote_x86_profile.py --dir DIR --variant fin [--models resnet50 ...] [--threads 4 16]
                                       [--runs 20] --out OUT

DIR holds what bench/prepare_gpu_schedulers.sh packed (as for remote_x86_models.py). For each model
and thread count, OUT gets MODEL.VARIANT.tN.json (`tlmpack bench --profile --json`'s result) and
MODEL.ort.tN.json (bench/ort_node_times.py's rows). onnxruntime's profiler costs it a few per cent:
compare kernels with nodes, and whole runs with remote_x86_models.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from gpu_schedulers import unpack  # noqa: E402
from ort_node_times import node_times  # noqa: E402
from remote_x86_models import onnx_file  # noqa: E402

from tlmpack.runtime.bench import bench  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, action="append", required=True)
    ap.add_argument("--variant", required=True)
    ap.add_argument("--models", nargs="+", default=["resnet50"])
    ap.add_argument("--threads", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="tlmpack-profile-"))
    for name in args.models:
        folder = unpack(args.dir, name, args.variant, args.variant, scratch)
        model, origin = onnx_file(args.dir, name, scratch)
        for threads in args.threads:
            result = bench(folder, threads=threads, runs=args.runs, profile=True)
            (args.out / f"{name}.{args.variant}.t{threads}.json").write_text(json.dumps(result.to_json()))
            rows = node_times(str(model), threads, args.runs)
            (args.out / f"{name}.ort.t{threads}.json").write_text(json.dumps(rows))
            ort_ms = sum(r["median_us"] for r in rows) / 1e3
            print(f"{name} {threads} threads: tlmpack {result.latency_ms['median']:.2f} ms (kernels "
                  f"{result.profile.kernel_us / 1e3:.2f}; pool wait {result.profile.pool_wait_us:.0f} us, "
                  f"{result.profile.pool_wakes_per_run:g} of {result.profile.pool_launches_per_run:g} launches "
                  f"woke sleepers), onnxruntime nodes {ort_ms:.2f} ms ({origin})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
