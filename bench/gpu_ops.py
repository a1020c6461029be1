#!/usr/bin/env python
"""Single non-GEMM operators of the seed transformers (softmax, layer norm) on the GPU: tlmpack's
CUDA kernels against torch's, per variant of the rules, kernel time only.

    python bench/gpu_ops.py prepare WORK CARRY [--variants heuristic r32]   # here: ONNX + builds
    python bench/gpu_ops.py run CARRY [--runs 200] [--json OUT]             # on the GPU machine

A variant is ``heuristic`` (the rules as they are) or ``rN``: cuda-reduction with at most N
threads per row (TLMPACK_CUDA_REDUCTION_ROW_THREADS, an A/B knob, not a build option). Each
operator is one ONNX node of one input X; torch runs the same operator (torch.softmax,
torch.nn.functional.layer_norm) on the same tensor, timed with CUDA events around back-to-back
calls; tlmpack's time is the C runtime's CUDA-event profiler. Results are checked against torch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

# (label, ONNX op, input shape): BERT-base / GPT-2 at batch 16, sequence 128
OPS = [
    ("softmax-b16", "Softmax", (16, 12, 128, 128)),
    ("softmax-b1", "Softmax", (1, 12, 128, 128)),
    ("layernorm-b16", "LayerNormalization", (16, 128, 768)),
    ("layernorm-b1", "LayerNormalization", (1, 128, 768)),
]


def op_onnx(path: Path, op: str, shape: tuple[int, ...]) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits, inputs = [], ["X"]
    attrs = {"axis": -1}
    if op == "LayerNormalization":
        rng = np.random.default_rng(1)
        for name in ("scale", "bias"):
            inits.append(numpy_helper.from_array(rng.standard_normal(shape[-1:]).astype(np.float32), name))
            inputs.append(name)
        attrs["epsilon"] = 1e-5
    graph = helper.make_graph([helper.make_node(op, inputs, ["Y"], **attrs)], op.lower(),
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, list(shape))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def variant_env(name: str) -> dict[str, str]:
    if name == "heuristic":
        return {}
    if name.startswith("r") and name[1:].isdigit():
        return {"TLMPACK_CUDA_REDUCTION_ROW_THREADS": name[1:]}
    raise SystemExit(f"unknown variant {name!r}: heuristic or rN")


def prepare(work: Path, carry: Path, variants: list[str]) -> None:
    work.mkdir(parents=True, exist_ok=True)
    carry.mkdir(parents=True, exist_ok=True)
    for label, op, shape in OPS:
        onnx_path = work / f"{label}.onnx"
        op_onnx(onnx_path, op, shape)
        for v in variants:
            out = carry / f"{label}.{v}.tar"
            if not out.exists():
                subprocess.run([sys.executable, "-m", "tlmpack.cli", "build", str(onnx_path), "-t", "cuda",
                                "--scheduler", "heuristic", "-o", str(out)], check=True,
                               env={**os.environ, **variant_env(v)})
    (carry / "ops.json").write_text(json.dumps({"ops": OPS, "variants": variants}))


def run(carry: Path, runs: int, json_out: Path | None) -> int:
    import torch
    from gpu_gemm import event_ms, kernel_ms, packed_artifact

    import tlmpack.runtime as rt

    spec = json.loads((carry / "ops.json").read_text())
    rows, failed = [], []
    with tempfile.TemporaryDirectory() as scratch:
        for label, op, shape in spec["ops"]:
            x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
            tx = torch.from_numpy(x).cuda()
            row: dict = {"op": label, "shape": shape}
            ref = None
            for v in spec["variants"]:
                folder = Path(scratch) / f"{label}.{v}"
                with tarfile.open(packed_artifact(carry, f"{label}.{v}")) as tar:
                    tar.extractall(folder, filter="data")
                model = rt.load(folder, device="cuda")
                if ref is None:
                    ref = _reference(op, tx)
                (out,) = model.run(None, {"X": x})
                row[f"{v}_err"] = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
                row[f"{v}_kernel_us"] = kernel_ms(model, {"X": tx}, runs) * 1e3
                chosen = json.loads((folder / "manifest.json").read_text())["subgraphs"][0]["schedules"][0]
                row[f"{v}_schedule"] = f"{chosen['note']} sketch {chosen['sketch']} {chosen['decisions']}"
                model.close()
                if row[f"{v}_err"] >= 1e-4:
                    failed.append(f"{label}.{v}")
            row["torch_kernel_us"] = event_ms(_torch_fn(op, tx), runs) * 1e3
            rows.append(row)
            print(json.dumps(row), flush=True)
    if json_out:
        json_out.write_text(json.dumps(rows, indent=1))
    variants = spec["variants"]
    print("\n| op | shape | torch µs | " + " | ".join(f"{v} µs | torch / {v}" for v in variants) + " |")
    print("|---|---|---:|" + "---:|---:|" * len(variants))
    for r in rows:
        cells = [f"{r[f'{v}_kernel_us']:.1f} | {r['torch_kernel_us'] / r[f'{v}_kernel_us']:.2f}" for v in variants]
        print(f"| {r['op']} | {'×'.join(map(str, r['shape']))} | {r['torch_kernel_us']:.1f} | " + " | ".join(cells) + " |")
    print("FAILED: " + ", ".join(failed) if failed else "all results match torch within 1e-4")
    return 1 if failed else 0


def _weights() -> tuple[np.ndarray, np.ndarray]:
    """The layer norm's scale and bias, drawn as op_onnx drew them."""
    rng = np.random.default_rng(1)
    return rng.standard_normal(768).astype(np.float32), rng.standard_normal(768).astype(np.float32)


def _torch_fn(op: str, x):
    import torch

    if op == "Softmax":
        return lambda: torch.softmax(x, dim=-1)
    scale, bias = (torch.from_numpy(w).cuda() for w in _weights())
    return lambda: torch.nn.functional.layer_norm(x, x.shape[-1:], scale, bias, eps=1e-5)


def _reference(op: str, x) -> np.ndarray:
    return _torch_fn(op, x)().cpu().numpy()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("work", type=Path)
    p.add_argument("carry", type=Path)
    p.add_argument("--variants", nargs="+", default=["heuristic", "r32"])
    r = sub.add_parser("run")
    r.add_argument("carry", type=Path)
    r.add_argument("--runs", type=int, default=200)
    r.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.cmd == "prepare":
        prepare(args.work, args.carry, args.variants)
        return 0
    return run(args.carry, args.runs, args.json)


if __name__ == "__main__":
    sys.exit(main())
