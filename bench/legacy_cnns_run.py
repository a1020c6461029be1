"""Runs the artifacts of bench/legacy_cnns_build.py with tlmpack.runtime only (no TVM, no
onnxruntime) and compares with the stored onnxruntime outputs (relative L2 < 1e-4).

    PYTHONPATH=. python bench/legacy_cnns_run.py DIR [--device cuda:0]

Prints one line per model and exits 1 if any is over the tolerance.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import tlmpack.runtime as rt

TOLERANCE = 1e-4


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    out64, ref64 = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out64 - ref64) / max(np.linalg.norm(ref64), 1e-30))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args(argv)
    failed = 0
    tars = sorted(args.dir.glob("*.tar"))
    if not tars:
        print(f"no .tar artifacts in {args.dir}")
        return 1
    for tar in tars:
        name = tar.stem
        model = rt.load(tar, device=args.device)
        feed = {s.name: np.load(args.dir / f"{name}.input.{s.name}.npy") for s in model.inputs}
        outs = model.run(None, feed)
        errors = []
        for i, out in enumerate(outs):
            ref = np.load(args.dir / f"{name}.output.{i}.npy")
            if not np.all(np.isfinite(ref)) or not np.any(ref):
                raise SystemExit(f"{name}: reference output {i} is all zero or not finite")
            errors.append(rel_err(out, ref))
        ok = max(errors) < TOLERANCE
        failed += not ok
        print(f"{name:22} {args.device:8} rel L2 {max(errors):.2e} {'ok' if ok else 'FAIL'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
