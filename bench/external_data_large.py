#!/usr/bin/env python
"""An external-data ONNX model over 2 GiB (issue 13 item 3): build it for x86, check it against
onnxruntime, and report the build's peak memory against the weights' size (the weights must not be
held twice more than the pipeline needs).

    python bench/external_data_large.py --dir DIR [--columns 33000]

The model is y = relu(x @ W1) @ W2 with W1 [16384, COLUMNS] (2.16 GB at 33000) in one external file
next to the model, written chunk by chunk, never through one protobuf message; seeded weights, nothing downloaded.
The build runs in its own process under /usr/bin/time -v (peak RSS); the artifact runs with
tlmpack.runtime and is compared with onnxruntime (relative L2).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from tlmpack.testing import onnx_cases


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--columns", type=int, default=33000)
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    model = args.dir / "big.onnx"
    weights = onnx_cases.external_data_relu_mlp(model, args.rows, args.columns)
    print(f"model: {model.stat().st_size} B graph + {(args.dir / 'big.weights').stat().st_size / 2**30:.2f} GiB "
          f"external data ({weights / 2**30:.2f} GiB of weights)", flush=True)
    tar = args.dir / "big.tar"
    started = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-m", "tlmpack.cli", "build", str(model), "-t", "x86",
                           "-o", str(tar)], capture_output=True, text=True)
    build_s = time.perf_counter() - started
    if proc.returncode != 0:
        print(proc.stdout[-2000:], proc.stderr[-3000:])
        return 1
    peak_kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    print(f"build: {build_s:.0f} s, peak RSS {peak_kib / 2**20:.2f} GiB = {peak_kib * 1024 / weights:.2f}x the weights; "
          f"artifact {tar.stat().st_size / 2**30:.2f} GiB", flush=True)

    import onnxruntime as ort

    import tlmpack.runtime as rt

    x = np.random.default_rng(1).standard_normal((1, args.rows), dtype=np.float32)
    (ref,) = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    m = rt.load(tar, device="cpu")
    (out,) = m.run(None, {"x": x})
    err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
    live = bool(np.isfinite(ref).all() and np.abs(ref).max() > 0)
    print(f"rel err vs onnxruntime {err:.1e} (reference live: {live})")
    return 0 if live and err < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
