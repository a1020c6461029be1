#!/usr/bin/env python
"""On a GPU machine: check and time the seed-model artifacts built elsewhere, against torch.

    python bench/gpu_seed_models.py --dir DIR [--models a b ...] [--runs 50] [--json OUT.json] [--no-compile]

DIR holds, per model, NAME.tar (or NAME.tar.xz, decompressed on the fly), NAME.inputs.npz and
NAME.ref.npz (torch fp32 on the build machine's CPU). The artifact runs through tlmpack.runtime
alone (numpy + our C runtime). torch is the reference here: the zoo rebuilds each model on the
GPU from its portable weights (``weights="portable"``: numpy-drawn, the same under any torch),
fp32 with TF32 off. Relative error is ‖out − ref‖ / ‖ref‖.

Timing, same batch, one process, medians of --runs after warm-up:
  graph      artifact with CUDA graph replay, host numpy in/out
  nograph    artifact launching every kernel, host numpy in/out
  dev        artifact with CUDA graph, inputs already on the GPU (DLPack) and outputs left there:
             about the GPU time of the kernels plus one graph launch
  eager      torch eager on the GPU;   compile: torch.compile (default mode)
launch overhead ≈ nograph − graph (the same kernels, launched one by one from the host).
"""

from __future__ import annotations

import argparse
import json
import lzma
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tlmpack.runtime as rt  # noqa: E402

MODELS = ["resnet50", "mobilenetv2", "efficientnet-b0", "bert-base", "gpt2", "llama-2l-4096"]


def rel_err(out, ref) -> float:
    out64, ref64 = np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(out64 - ref64) / max(np.linalg.norm(ref64), 1e-30))


def _stem(name: str) -> str:
    return name.replace("@b", "_b")


def _find(folders: list[Path], filename: str) -> Path | None:
    return next((f / filename for f in folders if (f / filename).exists()), None)


def _extract(tar_stream, into: Path) -> Path:
    import tarfile

    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=tar_stream, mode="r|") as tar:
        tar.extractall(into, filter="data")
    return into


def artifact_dir(folders: list[Path], name: str, scratch: Path) -> Path:
    """The artifact of ``name`` extracted under ``scratch``, from NAME.tar[.xz], NAME.tar.xz.partNN
    (split to fit a carry) or NAME.noweights.tar.xz (a NAME@bN build: weights.bin comes from NAME's
    artifact; load() then checks its sha256 against the manifest)."""
    import io

    stem = _stem(name)
    out = scratch / stem
    if out.exists():
        return out
    if tar := _find(folders, f"{stem}.tar"):
        with open(tar, "rb") as f:
            return _extract(f, out)
    if packed := _find(folders, f"{stem}.tar.xz"):
        with lzma.open(packed) as f:
            return _extract(f, out)
    parts = sorted((p for folder in folders for p in folder.glob(f"{stem}.tar.xz.part*")), key=lambda p: p.name)
    if parts:
        joined = scratch / f"{stem}.tar.xz"
        with open(joined, "wb") as dst:
            for part in parts:
                with open(part, "rb") as src:
                    shutil.copyfileobj(src, dst, 1 << 24)
        with lzma.open(joined) as f:
            _extract(f, out)
        joined.unlink()
        return out
    if packed := _find(folders, f"{stem}.noweights.tar.xz"):
        base = artifact_dir(folders, name.partition("@b")[0], scratch)
        with lzma.open(packed) as f:
            _extract(io.BufferedReader(f), out)
        shutil.copy(base / "weights.bin", out / "weights.bin")
        return out
    raise FileNotFoundError(f"no artifact for {name} in {[str(f) for f in folders]}")


def median_ms(fn, runs: int, sync=None) -> float:
    for _ in range(3):
        fn()
    if sync:
        sync()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def torch_reference(name: str, feed: dict, use_compile: bool, bn_stats: dict | None = None):
    """The zoo model on the GPU: fp32 (TF32 off) output, fp64 output, and the fp32 module to time."""
    import torch

    from tlmpack import zoo

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    module, _, input_names, _ = zoo.get_model(name, 0, "portable", bn_stats)
    module = module.cuda().eval()
    args = [torch.from_numpy(feed[n]).cuda() for n in input_names]
    with torch.no_grad():
        ref = module(*args).float().cpu().numpy()
        module.double()
        ref64 = module(*(a.double() if a.is_floating_point() else a for a in args)).cpu().numpy()
        module.float()
    compiled = torch.compile(module) if use_compile else None
    return module, compiled, args, ref, ref64


def check_model(name: str, folders: list[Path], scratch: Path, runs: int, use_compile: bool) -> dict:
    import torch

    row: dict = {"model": name}
    tar = artifact_dir(folders, name, scratch)
    inputs_file = _find(folders, f"{_stem(name)}.inputs.npz")
    if inputs_file:
        feed = dict(np.load(inputs_file))
    else:  # what examples/make_models.py saved: the zoo's numpy-seeded inputs, the same anywhere
        from tlmpack import zoo

        feed = zoo.random_inputs(name, 0)
    ref_file = _find(folders, f"{_stem(name)}.ref.npz")
    cpu_ref = dict(np.load(ref_file)) if ref_file else {}

    model = rt.load(tar, device="cuda")
    row["device"] = model.device_name
    (out,) = model.run(None, feed)
    stats_file = _find(folders, f"{_stem(name.partition('@b')[0])}.bnstats.npz")
    bn_stats = dict(np.load(stats_file)) if stats_file else None  # the build machine's calibration
    module, compiled, args, gpu_ref, ref64 = torch_reference(name, feed, use_compile, bn_stats)
    row["err_torch_gpu"] = rel_err(out, gpu_ref)
    row["err_torch_gpu_fp64"] = rel_err(out, ref64)
    row["torch_fp32_vs_fp64"] = rel_err(gpu_ref, ref64)
    if cpu_ref:
        row["err_torch_cpu"] = rel_err(out, next(iter(cpu_ref.values())))
        row["torch_gpu_vs_cpu"] = rel_err(gpu_ref, next(iter(cpu_ref.values())))
    row["live"] = bool(np.isfinite(gpu_ref).all() and gpu_ref.std() > 0)

    sync = torch.cuda.synchronize
    row["graph_ms"] = median_ms(lambda: model.run(None, feed), runs)
    device_feed = {n: torch.from_numpy(v).cuda() for n, v in feed.items()}
    row["dev_ms"] = median_ms(lambda: model.run(None, device_feed, output_device="cuda"), runs, sync)
    nograph = rt.load(tar, device="cuda", use_cuda_graph=False)
    row["nograph_ms"] = median_ms(lambda: nograph.run(None, feed), runs)
    nograph.close()
    with torch.no_grad():
        row["eager_ms"] = median_ms(lambda: module(*args), runs, sync)
        if compiled is not None:
            started = time.perf_counter()
            compiled(*args)
            sync()
            row["compile_s"] = time.perf_counter() - started
            row["compile_ms"] = median_ms(lambda: compiled(*args), runs, sync)
    row["launch_overhead_ms"] = row["nograph_ms"] - row["graph_ms"]
    model.close()
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, action="append", required=True, help="repeatable: where to look")
    ap.add_argument("--models", nargs="*", default=MODELS)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--tolerance", type=float, default=1e-4)
    args = ap.parse_args()
    import torch

    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}", flush=True)
    rows, failed = [], []
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models:
            try:
                row = check_model(name, args.dir, Path(scratch), args.runs, not args.no_compile)
            except Exception as e:  # report and go on: one broken model must not hide the others
                row = {"model": name, "error": f"{type(e).__name__}: {e}"}
            rows.append(row)
            # torch's own fp32 result can be the less accurate one (cuDNN algorithms): judge by the
            # better of the fp32 and fp64 references, and print both.
            ok = "error" not in row and row["live"] and min(row["err_torch_gpu"], row["err_torch_gpu_fp64"]) < args.tolerance
            if not ok:
                failed.append(name)
            print(json.dumps(row), flush=True)
            torch.cuda.empty_cache()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print("\n| model | rel err vs torch GPU fp32 | vs fp64 | torch fp32 vs fp64 | tlmpack graph ms | no graph ms | device I/O ms | launch overhead ms "
          "| torch eager ms | torch.compile ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | {r['error'][:80]} | | | | | | | | |")
            continue
        print(f"| {r['model']} | {r['err_torch_gpu']:.2e} | {r['err_torch_gpu_fp64']:.2e} | "
              f"{r['torch_fp32_vs_fp64']:.2e} | {r['graph_ms']:.3f} | {r['nograph_ms']:.3f} | "
              f"{r['dev_ms']:.3f} | {r['launch_overhead_ms']:.3f} | {r['eager_ms']:.3f} | "
              f"{r.get('compile_ms', float('nan')):.3f} |")
    print("FAILED: " + ", ".join(failed) if failed else "all models match torch")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
