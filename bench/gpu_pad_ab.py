#!/usr/bin/env python
"""On a GPU machine: awkward-extent padding on and off, side by side, against torch (issue 15 item 2).

    python bench/gpu_pad_ab.py --dir DIR [--model encoder-197] [--runs 50] [--no-compile] [--json OUT.json]

DIR holds what bench/prepare_gpu_pad.sh packed: MODEL.tar.xz (built with padding, the default),
MODEL.nopad.tar.xz (the same model built with --no-pad-extents), MODEL.inputs.npz and
MODEL.ref.npz (torch on the build machine's CPU). Both artifacts run through
tlmpack.runtime alone; torch (the zoo's portable weights, fp32, TF32 off) is the reference and the
eager / torch.compile timing. Timing as in gpu_seed_models.py: medians of --runs after warm-up,
CUDA graph replay with host numpy in/out ("graph") and inputs already on the GPU ("dev").
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_seed_models import artifact_dir, median_ms, rel_err, torch_reference  # noqa: E402

import tlmpack.runtime as rt  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--model", default="encoder-197")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import torch

    feed = dict(np.load(args.dir / f"{args.model}.inputs.npz"))
    rows: dict = {"model": args.model}
    with tempfile.TemporaryDirectory(prefix="tlmpack-pad-ab-") as tmp:
        scratch = Path(tmp)
        padded = artifact_dir([args.dir], args.model, scratch)
        variants = {"pad": padded, "nopad": artifact_dir([args.dir], f"{args.model}.nopad", scratch)}
        module, compiled, targs, ref, ref64 = torch_reference(args.model, feed, not args.no_compile)
        sync = torch.cuda.synchronize
        device_feed = {n: torch.from_numpy(v).cuda() for n, v in feed.items()}
        for name, path in variants.items():
            model = rt.load(path, device="cuda")
            rows["device"] = model.device_name
            (out,) = model.run(None, feed)
            rows[f"{name}_err_torch_gpu"] = rel_err(out, ref)
            rows[f"{name}_err_torch_fp64"] = rel_err(out, ref64)
            rows[f"{name}_graph_ms"] = median_ms(lambda m=model: m.run(None, feed), args.runs)
            rows[f"{name}_dev_ms"] = median_ms(lambda m=model: m.run(None, device_feed, output_device="cuda"),
                                               args.runs, sync)
            model.close()
        rows["live"] = bool(np.isfinite(ref).all() and ref.std() > 0)
        with torch.no_grad():
            rows["eager_ms"] = median_ms(lambda: module(*targs), args.runs, sync)
            if compiled is not None:
                started = time.perf_counter()
                compiled(*targs)
                sync()
                rows["compile_s"] = time.perf_counter() - started
                rows["compile_ms"] = median_ms(lambda: compiled(*targs), args.runs, sync)
    for key, value in rows.items():
        print(f"{key:24s} {value:.4g}" if isinstance(value, float) else f"{key:24s} {value}")
    if "compile_ms" in rows:
        for name in ("pad", "nopad"):
            print(f"{name} dev / torch.compile: {rows[f'{name}_dev_ms'] / rows['compile_ms']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, sort_keys=True))
    errors = [rows[f"{n}_err_torch_gpu"] for n in ("pad", "nopad")]
    return 0 if rows["live"] and max(errors) < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
