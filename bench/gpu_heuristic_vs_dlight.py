#!/usr/bin/env python
"""On a GPU machine: the heuristic CUDA schedules against TVM dlight's and torch.compile, side by
side in one process per model, each artifact checked against torch first.

    python bench/gpu_heuristic_vs_dlight.py --dir DIR [--models a b ...] [--runs 50] [--json OUT]

DIR holds what bench/prepare_gpu_heuristic.sh packed: NAME.heuristic.tar.xz (or its .partNN pieces,
spread over several --dir), NAME.dlight.noweights.tar.xz
(weights.bin is the heuristic artifact's: the same graph and constants), NAME.inputs.npz,
NAME.ref.npz and NAME.bnstats.npz where the model has BatchNorm. Times are medians of --runs
after warm-up with inputs and outputs on the GPU (DLPack) and CUDA graph replay: about the
kernels' GPU time. The ratio column is dlight / heuristic (above 1: the heuristics are faster).
"""

from __future__ import annotations

import argparse
import io
import json
import lzma
import math
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_seed_models import _extract, _find, median_ms, rel_err, torch_reference  # noqa: E402

import tlmpack.runtime as rt  # noqa: E402

MODELS = ["resnet50", "mobilenetv2", "efficientnet-b0", "bert-base", "gpt2", "llama-2l-4096"]


def _joined(folders: list[Path], filename: str, scratch: Path) -> Path:
    """FILE, or FILE.partNN pieces (split to fit a carry, maybe over several --dir) joined."""
    if found := _find(folders, filename):
        return found
    parts = sorted((p for folder in folders for p in folder.glob(f"{filename}.part*")), key=lambda p: p.name)
    if not parts:
        raise FileNotFoundError(f"no {filename} in {[str(f) for f in folders]}")
    joined = scratch / filename
    with open(joined, "wb") as dst:
        for part in parts:
            with open(part, "rb") as src:
                shutil.copyfileobj(src, dst, 1 << 24)
    return joined


def unpack(folders: list[Path], name: str, scratch: Path) -> tuple[Path, Path]:
    heuristic = scratch / f"{name}.heuristic"
    with lzma.open(_joined(folders, f"{name}.heuristic.tar.xz", scratch)) as f:
        _extract(f, heuristic)
    dlight = scratch / f"{name}.dlight"
    with lzma.open(_find(folders, f"{name}.dlight.noweights.tar.xz")) as f:
        _extract(io.BufferedReader(f), dlight)
    shutil.copy(heuristic / "weights.bin", dlight / "weights.bin")
    return heuristic, dlight


def compare(name: str, folders: list[Path], scratch: Path, runs: int) -> dict:
    import torch

    from tlmpack import zoo

    heuristic_dir, dlight_dir = unpack(folders, name, scratch)
    inputs_file = _find(folders, f"{name}.inputs.npz")
    feed = dict(np.load(inputs_file)) if inputs_file else zoo.random_inputs(name, 0)
    stats_file = _find(folders, f"{name}.bnstats.npz")
    bn_stats = dict(np.load(stats_file)) if stats_file else None
    module, compiled, args, gpu_ref, ref64 = torch_reference(name, feed, True, bn_stats)
    row: dict = {"model": name, "live": bool(np.isfinite(gpu_ref).all() and gpu_ref.std() > 0)}
    device_feed = {n: torch.from_numpy(v).cuda() for n, v in feed.items()}
    sync = torch.cuda.synchronize
    for label, folder in (("heuristic", heuristic_dir), ("dlight", dlight_dir)):
        model = rt.load(folder, device="cuda")
        (out,) = model.run(None, feed)
        row[f"{label}_err"] = min(rel_err(out, gpu_ref), rel_err(out, ref64))
        row[f"{label}_ms"] = median_ms(lambda m=model: m.run(None, device_feed, output_device="cuda"), runs, sync)
        model.close()
    with torch.no_grad():
        compiled(*args)
        row["compile_ms"] = median_ms(lambda: compiled(*args), runs, sync)
    # second heuristic pass: same process, after the others, to show the run-to-run spread
    model = rt.load(heuristic_dir, device="cuda")
    row["heuristic_ms_again"] = median_ms(lambda: model.run(None, device_feed, output_device="cuda"), runs, sync)
    model.close()
    row["dlight_over_heuristic"] = row["dlight_ms"] / row["heuristic_ms"]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, action="append", required=True)
    ap.add_argument("--models", nargs="*", default=MODELS)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--tolerance", type=float, default=1e-4)
    args = ap.parse_args()
    import torch

    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)
    rows, failed = [], []
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models:
            try:
                row = compare(name, args.dir, Path(scratch), args.runs)
            except Exception as e:  # one broken model must not hide the others
                row = {"model": name, "error": f"{type(e).__name__}: {e}"}
            rows.append(row)
            if "error" in row or not row["live"] or max(row["heuristic_err"], row["dlight_err"]) >= args.tolerance:
                failed.append(name)
            print(json.dumps(row), flush=True)
            shutil.rmtree(Path(scratch) / f"{name}.heuristic", ignore_errors=True)
            shutil.rmtree(Path(scratch) / f"{name}.dlight", ignore_errors=True)
            torch.cuda.empty_cache()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print("\n| model | rel err heuristic | rel err dlight | heuristic ms | (again) | dlight ms | torch.compile ms "
          "| dlight / heuristic | torch.compile / heuristic |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    ratios = []
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | {r['error'][:80]} | | | | | | | |")
            continue
        ratios.append(r["dlight_over_heuristic"])
        print(f"| {r['model']} | {r['heuristic_err']:.1e} | {r['dlight_err']:.1e} | {r['heuristic_ms']:.3f} | "
              f"{r['heuristic_ms_again']:.3f} | {r['dlight_ms']:.3f} | {r['compile_ms']:.3f} | "
              f"{r['dlight_over_heuristic']:.2f} | {r['compile_ms'] / r['heuristic_ms']:.2f} |")
    if ratios:
        print(f"geometric mean dlight / heuristic over {len(ratios)} models: "
              f"{math.exp(sum(math.log(x) for x in ratios) / len(ratios)):.2f}")
    print("FAILED: " + ", ".join(failed) if failed else "all artifacts match torch")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
