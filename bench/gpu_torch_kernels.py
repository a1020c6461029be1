#!/usr/bin/env python
"""On a GPU machine: where torch.compile's time goes, kernel by kernel, for the seed models, so a
tlmpack per-kernel table (bench/gpu_profile.py --kernels) has a counterpart to read it against.

    python bench/gpu_torch_kernels.py --models bert-base@b16 gpt2@b16 [--runs 20] [--json OUT]

The zoo model is rebuilt on the GPU from its portable weights (as bench/gpu_seed_models.py does),
fp32 with TF32 off, compiled with torch.compile (default mode), warmed up, then --runs runs are
recorded by torch.profiler. Per model: GPU time a run in kernels, by kind (gemm: cuBLAS/CUTLASS
GEMMs; attention: SDPA kernels; triton: Inductor's fused kernels; other), and the ten largest
kernels with their calls and µs a run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_seed_models import torch_reference  # noqa: E402

GEMM_MARKS = ("gemm", "sgemm", "cutlass", "cublas", "xmma", "splitkreduce")
ATTENTION_MARKS = ("fmha", "attention", "flash", "sdpa")


def kind_of(kernel: str) -> str:
    name = kernel.lower()
    if any(m in name for m in ATTENTION_MARKS):
        return "attention"
    if any(m in name for m in GEMM_MARKS):
        return "gemm"
    if name.startswith("triton"):
        return "triton"
    return "other"


def profile_model(name: str, runs: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from tlmpack import zoo

    feed = zoo.random_inputs(name, 0)
    _, compiled, args, _, _ = torch_reference(name, feed, use_compile=True)
    with torch.no_grad():
        for _ in range(5):
            compiled(*args)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(runs):
                compiled(*args)
            torch.cuda.synchronize()
    per_kernel: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        entry = per_kernel[event.name]
        entry[0] += 1
        entry[1] += event.device_time
    by_kind: dict[str, float] = defaultdict(float)
    for kernel, (_, us) in per_kernel.items():
        by_kind[kind_of(kernel)] += us / runs
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1][1])[:10]
    return {
        "model": name,
        "runs": runs,
        "kernel_us_per_run": round(sum(us for _, us in per_kernel.values()) / runs, 1),
        "by_kind_us": {k: round(v, 1) for k, v in sorted(by_kind.items())},
        "top": [{"kernel": k[:120], "kind": kind_of(k), "calls_per_run": c / runs, "us_per_run": round(us / runs, 1)}
                for k, (c, us) in top],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", required=True)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    np.random.seed(0)
    rows = []
    for name in args.models:
        try:
            rows.append(profile_model(name, args.runs))
        except Exception as e:  # one model's failure must not hide the others' rows
            rows.append({"model": name, "error": f"{type(e).__name__}: {e}"})
        print(json.dumps(rows[-1], indent=1), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
