#!/usr/bin/env python
"""On a GPU machine: the same seed models built with different schedulers, against each other and
torch.compile, side by side in one process per model, each artifact checked against torch first.

    python bench/gpu_schedulers.py --dir DIR [--variants tlm heuristic] [--models a b@b16 ...] [--runs 50] [--json OUT]
                                   [--no-compile]

DIR (repeatable) holds what bench/prepare_gpu_schedulers.sh packed: STEM.V.tar.xz for the first
variant of a batch-1 model (or its .partNN pieces), STEM.V.noweights.tar.xz for every other build
(weights.bin is the first variant's artifact of the batch-1 model: the same constants),
STEM.inputs.npz, STEM.ref.npz and NAME.bnstats.npz where the model has BatchNorm (STEM = NAME or
NAME_bN for NAME@bN). Times are medians of --runs after warm-up with inputs and outputs on the
GPU (DLPack) and CUDA graph replay: about the kernels' GPU time. After the others the first
variant is timed again (the spread column). Ratios: V / first (above 1: the first is faster) and
torch.compile / first (above 1: tlmpack is faster).
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

from gpu_seed_models import _extract, _find, _stem, median_ms, rel_err, torch_reference  # noqa: E402

import tlmpack.runtime as rt  # noqa: E402

MODELS = ["resnet50", "mobilenetv2", "efficientnet-b0", "bert-base", "gpt2", "llama-2l-4096"]


def _joined(folders: list[Path], filename: str, scratch: Path) -> Path | None:
    """FILE, or FILE.partNN pieces (split to fit a carry, maybe over several --dir) joined."""
    if found := _find(folders, filename):
        return found
    parts = sorted((p for folder in folders for p in folder.glob(f"{filename}.part*")), key=lambda p: p.name)
    if not parts:
        return None
    joined = scratch / filename
    with open(joined, "wb") as dst:
        for part in parts:
            with open(part, "rb") as src:
                shutil.copyfileobj(src, dst, 1 << 24)
    return joined


def _variant_with_weights(folders: list[Path], name: str, preferred: str) -> str:
    """The variant of ``name`` packed with its weights.bin: ``preferred`` if it is, else the first by
    name, so that any variant may be loaded first or profiled alone."""
    stem = _stem(name)
    full = sorted({p.name.split(".tar.xz")[0][len(stem) + 1:] for folder in folders
                   for p in folder.glob(f"{stem}.*.tar.xz*") if ".noweights." not in p.name})
    if not full:
        raise FileNotFoundError(f"no {stem}.VARIANT.tar.xz with weights in {[str(f) for f in folders]}")
    return preferred if preferred in full else full[0]


def unpack(folders: list[Path], name: str, variant: str, first: str, scratch: Path) -> Path:
    """The artifact of ``name`` built with ``variant``, extracted, weights.bin put back if stripped."""
    stem = _stem(name)
    out = scratch / f"{stem}.{variant}"
    if out.exists():
        return out
    if packed := _joined(folders, f"{stem}.{variant}.tar.xz", scratch):
        with lzma.open(packed) as f:
            return _extract(f, out)
    stripped = _find(folders, f"{stem}.{variant}.noweights.tar.xz")
    if stripped is None:
        raise FileNotFoundError(f"no {stem}.{variant}[.noweights].tar.xz in {[str(f) for f in folders]}")
    base_name = name.partition("@b")[0]
    source = _variant_with_weights(folders, base_name, first)
    base = unpack(folders, base_name, source, source, scratch)
    with lzma.open(stripped) as f:
        _extract(io.BufferedReader(f), out)
    shutil.copy(base / "weights.bin", out / "weights.bin")
    return out


def compare(name: str, variants: list[str], folders: list[Path], scratch: Path, runs: int,
            use_compile: bool = True) -> dict:
    import torch

    from tlmpack import zoo

    dirs = {v: unpack(folders, name, v, variants[0], scratch) for v in variants}
    inputs_file = _find(folders, f"{_stem(name)}.inputs.npz")
    feed = dict(np.load(inputs_file)) if inputs_file else zoo.random_inputs(name, 0)
    stats_file = _find(folders, f"{name.partition('@b')[0]}.bnstats.npz")
    bn_stats = dict(np.load(stats_file)) if stats_file else None
    module, compiled, args, gpu_ref, ref64 = torch_reference(name, feed, use_compile, bn_stats)
    row: dict = {"model": name, "live": bool(np.isfinite(gpu_ref).all() and gpu_ref.std() > 0)}
    device_feed = {n: torch.from_numpy(v).cuda() for n, v in feed.items()}
    sync = torch.cuda.synchronize
    for label, folder in dirs.items():
        model = rt.load(folder, device="cuda")
        (out,) = model.run(None, feed)
        row[f"{label}_err"] = min(rel_err(out, gpu_ref), rel_err(out, ref64))
        row[f"{label}_ms"] = median_ms(lambda m=model: m.run(None, device_feed, output_device="cuda"), runs, sync)
        model.close()
    if compiled is not None:
        with torch.no_grad():
            compiled(*args)
            row["compile_ms"] = median_ms(lambda: compiled(*args), runs, sync)
    model = rt.load(dirs[variants[0]], device="cuda")
    row["first_ms_again"] = median_ms(lambda: model.run(None, device_feed, output_device="cuda"), runs, sync)
    model.close()
    return row


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def table(rows: list[dict], variants: list[str]) -> list[str]:
    first = variants[0]
    head = ["model", *(f"rel err {v}" for v in variants), *(f"{v} ms" for v in variants), f"{first} again",
            "torch.compile ms", *(f"{v} / {first}" for v in variants[1:]), f"torch.compile / {first}"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    ratios: dict[str, list[float]] = {v: [] for v in [*variants[1:], "compile"]}
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['error'][:100]} |")
            continue
        for v in variants[1:]:
            ratios[v].append(r[f"{v}_ms"] / r[f"{first}_ms"])
        if "compile_ms" in r:
            ratios["compile"].append(r["compile_ms"] / r[f"{first}_ms"])
        cells = [r["model"], *(f"{r[f'{v}_err']:.1e}" for v in variants), *(f"{r[f'{v}_ms']:.3f}" for v in variants),
                 f"{r['first_ms_again']:.3f}", f"{r['compile_ms']:.3f}" if "compile_ms" in r else "-",
                 *(f"{r[f'{v}_ms'] / r[f'{first}_ms']:.2f}" for v in variants[1:]),
                 f"{r['compile_ms'] / r[f'{first}_ms']:.2f}" if "compile_ms" in r else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    for key, xs in ratios.items():
        label = "torch.compile" if key == "compile" else key
        lines.append(f"geometric mean {label} / {first} over {len(xs)} models: {_geomean(xs):.3f}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, action="append", required=True)
    ap.add_argument("--variants", nargs="+", default=["heuristic", "dlight"],
                    help="schedulers as packed; the first carries the weights")
    ap.add_argument("--models", nargs="*", default=MODELS)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--tolerance", type=float, default=1e-4)
    ap.add_argument("--no-compile", action="store_true", help="leave torch.compile out (saves its compile time)")
    args = ap.parse_args()
    import torch

    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)
    rows, failed = [], []
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models:
            try:
                row = compare(name, args.variants, args.dir, Path(scratch), args.runs, not args.no_compile)
            except Exception as e:  # one broken model must not hide the others
                row = {"model": name, "error": f"{type(e).__name__}: {e}"}
            rows.append(row)
            errs = [row.get(f"{v}_err", math.inf) for v in args.variants]
            if "error" in row or not row["live"] or max(errs) >= args.tolerance:
                failed.append(name)
            print(json.dumps(row), flush=True)
            for v in args.variants:
                shutil.rmtree(Path(scratch) / f"{_stem(name)}.{v}", ignore_errors=True)
            torch.cuda.empty_cache()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print("\n" + "\n".join(table(rows, args.variants)))
    print("FAILED: " + ", ".join(failed) if failed else "all artifacts match torch")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
