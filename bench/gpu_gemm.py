#!/usr/bin/env python
"""fp32 GEMM kernels: tlmpack's CUDA schedules as a share of cuBLAS (torch.matmul, TF32 off).

    python bench/gpu_gemm.py prepare WORK CARRY [--schedulers tlm heuristic]   # here: ONNX + builds
    python bench/gpu_gemm.py run CARRY [--runs 100] [--json OUT]               # on the GPU machine

A "scheduler" may also be a variant of VARIANTS: old-rules (heuristic without the cuda-gemm rule,
i.e. MetaSchedule's SSSRRSRS sketch as before), gemm256 (cuda-gemm with 256-thread blocks at least).

Each shape is one ONNX MatMul of two inputs A [M, K] and B [K, N] (no weights, so the artifacts
are small enough to carry), built with ``tlmpack build -t cuda --scheduler S``. There, inputs
live on the GPU (DLPack), the artifact replays its CUDA graph, and torch.matmul runs on the same
tensors; times are medians of --runs after warm-up, paired per shape in one process. Share of
cuBLAS = cuBLAS ms / tlmpack ms (1.0: as fast as cuBLAS). Results are checked against fp64.
"""

from __future__ import annotations

import argparse
import json
import math
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

# (label, M, K, N): the square case, then BERT-base / GPT-2 (seq 128) and LLaMA-7B layer GEMMs
SHAPES = [
    ("square-4096", 4096, 4096, 4096),
    ("bert-qkv", 128, 768, 768),
    ("gpt2-attn", 128, 768, 2304),
    ("bert-ffn1", 128, 768, 3072),
    ("bert-ffn2", 128, 3072, 768),
    ("bert-b16-ffn1", 2048, 768, 3072),
    ("bert-b16-qkv", 2048, 768, 768),
    ("bert-b16-ffn2", 2048, 3072, 768),
    ("gpt2-b16-attn", 2048, 768, 2304),
    ("llama-qkvo", 128, 4096, 4096),
    ("llama-up", 128, 4096, 11008),
    ("llama-down", 128, 11008, 4096),
]


# variant → (tlmpack build arguments, extra environment)
VARIANTS = {
    "old-rules": (["--scheduler", "heuristic", "--disable-rules", "cuda-gemm"], {}),
    "gemm256": (["--scheduler", "heuristic"], {"TLMPACK_CUDA_GEMM_MIN_THREADS": "256"}),
    "gemm128": (["--scheduler", "heuristic"], {"TLMPACK_CUDA_GEMM_MIN_THREADS": "128"}),
}


def variant(name: str) -> tuple[list[str], dict[str, str]]:
    """Build arguments and environment of a scheduler or VARIANTS name, or of an experiment point
    ``x-TMxTN-TYxTX-bkBK[-sSTAGES][-ak]`` (cuda-gemm forced to that whole-K tile, a pipeline of
    STAGES, A's shared tile k-major: TLMPACK_GEMM_EXPERIMENT, an A/B knob)."""
    if name in VARIANTS:
        return VARIANTS[name]
    if not name.startswith("x-"):
        return ["--scheduler", name], {}
    regs, threads, bk, *rest = name[2:].split("-")
    knobs = [f"plan={regs}/{threads}/{bk.removeprefix('bk')}"]
    knobs += [f"stages={r[1:]}" for r in rest if r.startswith("s")] + ["a_k_major=1" for r in rest if r == "ak"]
    return ["--scheduler", "heuristic"], {"TLMPACK_GEMM_EXPERIMENT": ",".join(knobs)}


def gemm_onnx(path: Path, m: int, k: int, n: int) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["A", "B"], ["C"])], "gemm",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [m, k]),
         helper.make_tensor_value_info("B", TensorProto.FLOAT, [k, n])],
        [helper.make_tensor_value_info("C", TensorProto.FLOAT, [m, n])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def prepare(work: Path, carry: Path, schedulers: list[str], labels: list[str] | None = None) -> None:
    work.mkdir(parents=True, exist_ok=True)
    carry.mkdir(parents=True, exist_ok=True)
    shapes = [s for s in SHAPES if not labels or s[0] in labels]
    for label, m, k, n in shapes:
        onnx_path = work / f"{label}.onnx"
        gemm_onnx(onnx_path, m, k, n)
        for s in schedulers:
            out = carry / f"{label}.{s}.tar"
            if not out.exists():
                args, env = variant(s)
                subprocess.run([sys.executable, "-m", "tlmpack.cli", "build", str(onnx_path), "-t", "cuda",
                                *args, "-o", str(out)], check=True, env={**os.environ, **env})
    (carry / "gemm.json").write_text(json.dumps({"shapes": shapes, "schedulers": schedulers}))


def packed_artifact(carry: Path, stem: str) -> Path:
    """STEM.tar, or STEM.tar.xz where the carry was compressed to fit (tarfile reads either)."""
    plain = carry / f"{stem}.tar"
    return plain if plain.exists() else carry / f"{stem}.tar.xz"


def kernel_ms(model, feed: dict, runs: int) -> float:
    """GPU time of the artifact's kernels per run (the C runtime's CUDA-event profiler)."""
    lib, handle = model._lib, model._handle
    lib.set_profiling(handle, True)
    try:
        for _ in range(runs):
            model.run(None, feed, output_device="cuda")
        report = lib.profile(handle)
    finally:
        lib.set_profiling(handle, False)
    return report.kernel_ns / max(report.runs, 1) / 1e6


def event_ms(fn, runs: int) -> float:
    """GPU time per call of ``fn`` between two CUDA events around ``runs`` back-to-back calls."""
    import torch

    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(runs):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / runs


def run(carry: Path, runs: int, json_out: Path | None) -> int:
    import torch
    from gpu_seed_models import median_ms

    import tlmpack.runtime as rt

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    spec = json.loads((carry / "gemm.json").read_text())
    schedulers = spec["schedulers"]
    sync = torch.cuda.synchronize
    rows, failed = [], []
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        for label, m, k, n in spec["shapes"]:
            rng = np.random.default_rng(0)
            a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
            ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
            ref = (ta.double() @ tb.double()).cpu().numpy()
            row = {"shape": label, "m": m, "k": k, "n": n}
            for s in schedulers:
                folder = Path(scratch) / f"{label}.{s}"
                with tarfile.open(packed_artifact(carry, f"{label}.{s}")) as tar:
                    tar.extractall(folder, filter="data")
                model = rt.load(folder, device="cuda")
                chosen = json.loads((folder / "manifest.json").read_text())["subgraphs"][0]["schedules"][0]
                row[f"{s}_schedule"] = f"{chosen['note']} sketch {chosen['sketch']} {chosen['decisions'][:3]}"
                (out,) = model.run(None, {"A": a, "B": b})
                row[f"{s}_err"] = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
                row[f"{s}_ms"] = median_ms(lambda mod=model, x=ta, y=tb: mod.run(None, {"A": x, "B": y}, output_device="cuda"),
                                           runs, sync)
                row[f"{s}_kernel_ms"] = kernel_ms(model, {"A": ta, "B": tb}, runs)
                model.close()
                if row[f"{s}_err"] >= 1e-4:
                    failed.append(f"{label}.{s}")
            row["cublas_ms"] = median_ms(lambda x=ta, y=tb: torch.matmul(x, y), runs, sync)
            row["cublas_kernel_ms"] = event_ms(lambda x=ta, y=tb: torch.matmul(x, y), runs)
            row["cublas_tflops"] = 2 * m * k * n / row["cublas_ms"] / 1e9
            rows.append(row)
            print(json.dumps(row), flush=True)
    if json_out:
        json_out.write_text(json.dumps(rows, indent=1))
    print("\n| shape | M×K×N | cuBLAS ms | cuBLAS TFLOP/s | " + " | ".join(f"{s} ms | {s} share" for s in schedulers) + " |")
    print("|---|---|---:|---:|" + "---:|---:|" * len(schedulers))
    for r in rows:
        cells = [f"{r[f'{s}_ms']:.3f} | {r['cublas_ms'] / r[f'{s}_ms']:.2f}" for s in schedulers]
        print(f"| {r['shape']} | {r['m']}×{r['k']}×{r['n']} | {r['cublas_ms']:.3f} | {r['cublas_tflops']:.1f} | "
              + " | ".join(cells) + " |")
    for s in schedulers:
        shares = [r["cublas_ms"] / r[f"{s}_ms"] for r in rows]
        print(f"geometric mean share of cuBLAS, {s}: {math.exp(sum(map(math.log, shares)) / len(shares)):.2f}")
    print("\nkernel time only (tlmpack: the runtime's CUDA-event profiler; cuBLAS: events around back-to-back calls)")
    print("| shape | cuBLAS kernel ms | " + " | ".join(f"{s} kernel ms | {s} share" for s in schedulers) + " |")
    print("|---|---:|" + "---:|---:|" * len(schedulers))
    for r in rows:
        cells = [f"{r[f'{s}_kernel_ms']:.4f} | {r['cublas_kernel_ms'] / r[f'{s}_kernel_ms']:.2f}" for s in schedulers]
        print(f"| {r['shape']} | {r['cublas_kernel_ms']:.4f} | " + " | ".join(cells) + " |")
    for s in schedulers:
        shares = [r["cublas_kernel_ms"] / r[f"{s}_kernel_ms"] for r in rows]
        print(f"geometric mean kernel share of cuBLAS, {s}: {math.exp(sum(map(math.log, shares)) / len(shares)):.2f}")
    print("FAILED: " + ", ".join(failed) if failed else "all results match fp64 within 1e-4")
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("work", type=Path)
    p.add_argument("carry", type=Path)
    p.add_argument("--schedulers", nargs="+", default=["tlm", "heuristic"])
    p.add_argument("--shapes", nargs="+", help="labels of SHAPES to build (default: all)")
    r = sub.add_parser("run")
    r.add_argument("carry", type=Path)
    r.add_argument("--runs", type=int, default=100)
    r.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.cmd == "prepare":
        prepare(args.work, args.carry, args.schedulers, args.shapes)
        return 0
    return run(args.carry, args.runs, args.json)


if __name__ == "__main__":
    sys.exit(main())
