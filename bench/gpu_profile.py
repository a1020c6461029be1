#!/usr/bin/env python
"""On a GPU machine: `tlmpack bench --profile` over the packed seed models, so the CUDA runtime's
own time per run and per kernel launch is a measured figure (issue 15 item 3, CUDA side).

    python bench/gpu_profile.py --dir DIR [--variants heuristic] [--models a b ...] [--runs 50] [--json OUT]

DIR holds what bench/prepare_gpu_schedulers.sh packed (see bench/gpu_schedulers.py; the first
variant listed carries weights.bin). Per artifact: tlmpack.runtime.bench's latency over warm runs
(host inputs and outputs, CUDA graph replay), then as many profiled runs (one launch after another
with an event after each, no graph), and the profiler's split of a run into time inside kernels
(between consecutive events on the stream) and outside them (checks, input/output copies,
launches not hidden behind the GPU, the final synchronisation).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_schedulers import unpack  # noqa: E402

from tlmpack.runtime import bench as rb  # noqa: E402

MODELS = ["resnet50", "mobilenetv2", "efficientnet-b0"]


def profile_row(name: str, variant: str, folder: Path, runs: int, kernels: bool = False) -> dict:
    result = rb.bench(folder, device="cuda", runs=runs, warmup=10, profile=True)
    p = result.profile
    extra = {}
    if kernels:
        print(rb.format_report(result, top=40), flush=True)
        extra = {"kernels": [asdict(k) for k in p.kernels]}
    return extra | {"model": name, "variant": variant, "device": result.device_name,
            "median_ms": result.latency_ms["median"], "min_ms": result.latency_ms["min"],
            "profiled_run_us": p.run_us, "kernel_us": p.kernel_us, "outside_us": p.outside_us,
            "io_copy_us": p.io_copy_us, "launches": p.kernel_calls_per_run,
            "outside_per_launch_us": p.outside_per_call_us,
            "outside_less_copies_per_launch_us": (p.outside_us - p.io_copy_us) / max(p.kernel_calls_per_run, 1)}


def table(rows: list[dict]) -> list[str]:
    head = ["model", "scheduler", "launches", "median ms (graph)", "profiled run us", "in kernels us",
            "outside us", "of which copies us", "outside us / launch", "outside less copies us / launch"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['variant']} | {r['error'][:120]} |")
            continue
        lines.append(f"| {r['model']} | {r['variant']} | {r['launches']:g} | {r['median_ms']:.3f} | "
                     f"{r['profiled_run_us']:.1f} | {r['kernel_us']:.1f} | {r['outside_us']:.1f} | "
                     f"{r['io_copy_us']:.1f} | {r['outside_per_launch_us']:.2f} | "
                     f"{r['outside_less_copies_per_launch_us']:.2f} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, action="append", required=True)
    ap.add_argument("--variants", nargs="+", default=["heuristic"], help="schedulers as packed; the first carries the weights")
    ap.add_argument("--models", nargs="*", default=MODELS)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--kernels", action="store_true", help="also print and keep the per-kernel table")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models:
            for variant in args.variants:
                try:
                    folder = unpack(args.dir, name, variant, args.variants[0], Path(scratch))
                    rows.append(profile_row(name, variant, folder, args.runs, args.kernels))
                except Exception as e:  # one model's failure must not hide the others' rows
                    rows.append({"model": name, "variant": variant, "error": f"{type(e).__name__}: {e}"})
                print(json.dumps(rows[-1]), flush=True)
    print("\n".join(table(rows)))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
