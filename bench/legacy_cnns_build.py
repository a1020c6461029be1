"""Builds the opset 7-9 CNNs of tlmpack.testing.legacy_cnns into artifacts for the GPU machine.

Here (with TVM and onnxruntime): write each model, build it for ``-t cuda,x86``, check the x86
half against onnxruntime, and store the inputs and onnxruntime's outputs as .npy next to the
artifact, so the GPU machine (numpy + tlmpack.runtime only) can check the CUDA half:

    PYTHONPATH=. python bench/legacy_cnns_build.py OUT_DIR [--targets cuda,x86]
    # then, on the GPU machine, from a checkout:
    PYTHONPATH=. python bench/legacy_cnns_run.py OUT_DIR --device cuda:0
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

from tlmpack.testing import legacy_cnns
from tlmpack.verify import check_input_sensitive, check_live, compare, onnxruntime_outputs, random_feed


def build_one(name: str, out: Path, targets: str) -> dict:
    import onnx

    from tlmpack.frontend.onnx import _input_specs

    model = legacy_cnns.write(name, out / f"{name}.onnx")
    tar = out / f"{name}.tar"
    subprocess.run([sys.executable, "-m", "tlmpack.cli", "build", str(model), "-t", targets, "-o", str(tar)],
                   check=True)
    specs = _input_specs(onnx.load(str(model)).graph, {})
    feed, other = random_feed(specs, seed=7), random_feed(specs, seed=8)
    refs, other_refs = onnxruntime_outputs(model, feed), onnxruntime_outputs(model, other)
    for i, (ref, ref_b) in enumerate(zip(refs, other_refs, strict=True)):
        check_live(f"{name} output {i}", ref)
        check_input_sensitive(f"{name} output {i}", ref, ref_b)
    for key, value in feed.items():
        np.save(out / f"{name}.input.{key}.npy", value)
    for i, ref in enumerate(refs):
        np.save(out / f"{name}.output.{i}.npy", ref)
    x86 = compare(tar, model, feed=feed) if "x86" in targets else []
    return {"name": name, "x86_rel_err": max(x86) if x86 else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--targets", default="cuda,x86")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in sorted(legacy_cnns.MODELS):
        row = build_one(name, args.out, args.targets)
        err = row["x86_rel_err"]
        print(f"{name:22} x86 rel L2 {err:.2e}" if err is not None else f"{name:22} built", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
