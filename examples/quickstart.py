#!/usr/bin/env python
"""The main job in one script: export a seed model to ONNX, build it with tlmpack for x86, load
the artifact with tlmpack.runtime alone, and compare its output with onnxruntime.

    python examples/quickstart.py [MODEL] [--out DIR]      # MODEL: a tlmpack.zoo name (default resnet-tiny)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default="resnet-tiny")
    parser.add_argument("--out", default="out")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from tlmpack import zoo

    onnx_path, tar = out / f"{args.model}.onnx", out / f"{args.model}.tar"
    print(f"exporting {args.model} (random weights, seeded) to {onnx_path}")
    zoo.export_onnx(args.model, onnx_path)
    subprocess.run([sys.executable, "-m", "tlmpack.cli", "build", str(onnx_path), "-t", "x86", "-o", str(tar)], check=True)
    subprocess.run([sys.executable, "-m", "tlmpack.cli", "inspect", str(tar)], check=True)

    import tlmpack.runtime as rt
    from tlmpack.verify import onnxruntime_outputs, rel_err

    model = rt.load(tar)
    feed = zoo.random_inputs(args.model, seed=1)
    started = time.perf_counter()
    outputs = model.run(None, feed)
    elapsed = (time.perf_counter() - started) * 1e3
    refs = onnxruntime_outputs(onnx_path, feed)
    for spec, got, ref in zip(model.outputs, outputs, refs, strict=True):
        print(f"{spec.name}: shape {got.shape}, relative error vs onnxruntime {rel_err(got, ref):.2e}, first run {elapsed:.1f} ms")
    worst = max(rel_err(g, r) for g, r in zip(outputs, refs, strict=True))
    print("OK" if worst < 1e-4 else "MISMATCH")
    return 0 if worst < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
