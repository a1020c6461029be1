"""Correctness check of a built artifact against onnxruntime (or torch) on fresh random inputs.

Used by the tests, the benchmarks and ``python -m tlmpack.verify``. A reference that is all
zeros or not finite is refused: it would hide an unwritten output.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    out64, ref64 = np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(out64 - ref64) / max(np.linalg.norm(ref64), 1e-30))


def check_live(name: str, ref: np.ndarray) -> None:
    if not np.all(np.isfinite(ref)):
        raise AssertionError(f"reference output {name} has NaN/Inf: pick another seed")
    if not np.any(ref) or float(np.std(ref)) == 0.0:
        raise AssertionError(f"reference output {name} is constant ({ref.reshape(-1)[:1]}): not a live test")


def check_input_sensitive(name: str, ref_a: np.ndarray, ref_b: np.ndarray) -> None:
    """A model whose output ignores its input (a degenerate random-weight net) tests nothing."""
    if rel_err(ref_b, ref_a) < 1e-6:
        raise AssertionError(f"reference output {name} does not change with the input: not a live test")


def random_feed(specs, seed: int) -> dict[str, np.ndarray]:
    """Random inputs for the given TensorSpecs: N(0,1) floats, small non-negative integers."""
    rng = np.random.default_rng(seed)
    feed = {}
    for s in specs:
        if np.dtype(s.dtype).kind in "iu":
            feed[s.name] = rng.integers(0, 100, size=s.shape).astype(s.dtype)
        else:
            feed[s.name] = rng.standard_normal(s.shape).astype(s.dtype)
    return feed


def onnxruntime_outputs(onnx_path: str | Path, feed: dict[str, np.ndarray], threads: int = 0) -> list[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def compare(artifact: str | Path, onnx_path: str | Path, seed: int = 1, feed=None) -> list[float]:
    """Runs the artifact and onnxruntime on the same fresh inputs; returns the relative errors."""
    from . import runtime

    model = runtime.load(artifact, device="cpu")
    feed = feed or random_feed(model.inputs, seed)
    refs = onnxruntime_outputs(onnx_path, feed)
    other_refs = onnxruntime_outputs(onnx_path, random_feed(model.inputs, seed + 1000))
    outs = model.run(None, feed)
    errors = []
    for spec, out, ref, other in zip(model.outputs, outs, refs, other_refs, strict=True):
        check_live(spec.name, ref)
        check_input_sensitive(spec.name, ref, other)
        errors.append(rel_err(out, ref))
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Compare an artifact with onnxruntime on random inputs.")
    parser.add_argument("artifact")
    parser.add_argument("onnx")
    parser.add_argument("--inputs", help=".npz with the inputs (default: seeded random)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tolerance", type=float, default=1e-4)
    args = parser.parse_args(argv)
    feed = dict(np.load(args.inputs)) if args.inputs else None
    errors = compare(args.artifact, args.onnx, args.seed, feed)
    worst = max(errors)
    print(f"{args.artifact}: relative error per output {[f'{e:.2e}' for e in errors]} "
          f"({'ok' if worst < args.tolerance else 'FAIL'} at {args.tolerance:g})")
    return 0 if worst < args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
