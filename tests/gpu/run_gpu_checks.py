"""Runs every artifact of a folder on a GPU through the C runtime, checks its outputs, times it, prints a table.

    python tests/gpu/run_gpu_checks.py FOLDER [--device cuda:0] [--runs 200] [--json results.json]

FOLDER holds artifacts (NAME/ with a manifest.json, or NAME.tar) and, optionally, beside each:
  NAME.inputs.npz     the feed (one array per input name); else seeded random inputs
  NAME.expected.npz   reference outputs (one array per output name); else the artifact's own x86
                      target on the same inputs, when it has one
Needs numpy and tlmpack.runtime only. With torch and a CUDA build of it, each model also takes
torch CUDA tensors as inputs and hands its outputs to torch.from_dlpack, and those are checked too.

For each artifact: load with device=cuda, compare with the reference (relative error: max |a-b| /
max |b|), then time the median of --runs runs after warm-up, with host numpy I/O with and without the
CUDA graph, and with device I/O (inputs already on the GPU, outputs as CudaArray). Exit status 1 when
an output is off or a model fails. To make the fake CUDA artifact for this script:
    python tests/fixtures_runtime/fabricate_cuda.py FOLDER [--extra-launches 100]
Reference hooks for real models go in REFERENCES (name -> function(feed) -> outputs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import tlmpack.runtime as rt  # noqa: E402

# name -> function(feed) -> {output name: array}; consulted before the x86 target.
REFERENCES: dict[str, Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]] = {}


def find_artifacts(folder: Path) -> list[tuple[str, Path]]:
    found = []
    for p in sorted(folder.iterdir()):
        if p.is_dir() and (p / "manifest.json").is_file():
            found.append((p.name, p))
        elif p.is_file() and p.suffix == ".tar":
            found.append((p.stem, p))
    return found


def make_feed(name: str, folder: Path, model: rt.Model, seed: int = 0) -> dict[str, np.ndarray]:
    path = folder / f"{name}.inputs.npz"
    if path.is_file():
        with np.load(path) as z:
            return {k: z[k] for k in z.files}
    rng = np.random.default_rng(seed)
    feed = {}
    for spec in model.inputs:
        if spec.dtype.startswith(("int", "uint")):
            feed[spec.name] = rng.integers(0, 10, size=spec.shape).astype(spec.dtype)
        elif spec.dtype == "bool":
            feed[spec.name] = rng.integers(0, 2, size=spec.shape).astype(bool)
        else:
            feed[spec.name] = rng.standard_normal(spec.shape).astype(spec.dtype)
    return feed


def reference(name: str, folder: Path, artifact: Path, feed: dict[str, np.ndarray]) -> tuple[str, dict[str, np.ndarray]]:
    path = folder / f"{name}.expected.npz"
    if path.is_file():
        with np.load(path) as z:
            return path.name, {k: z[k] for k in z.files}
    if name in REFERENCES:
        return "reference hook", REFERENCES[name](feed)
    with rt.load(artifact, device="cpu") as cpu:
        outs = cpu.run(None, feed)
        return "x86 target", dict(zip(cpu.output_names, outs, strict=True))


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return float("inf")
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    diff = float(np.max(np.abs(got - want))) if want.size else 0.0
    return diff / scale if scale > 0 else diff


def median_ms(fn: Callable[[], Any], runs: int, warmup: int = 10) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def torch_check(model: rt.Model, feed: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> float | None:
    """Max relative error with torch CUDA tensors in and torch.from_dlpack out; None without torch+CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    dev = torch.device(model.device)
    tfeed = {k: torch.from_numpy(np.ascontiguousarray(v)).to(dev) for k, v in feed.items()}
    outs = model.run_dlpack(None, tfeed)
    tensors = [torch.from_dlpack(o) for o in outs]
    torch.cuda.synchronize(dev)
    return max(rel_err(t.cpu().numpy(), want[n]) for n, t in zip(model.output_names, tensors, strict=True))


def check_one(name: str, artifact: Path, folder: Path, device: str, runs: int, rtol: float) -> dict[str, Any]:
    row: dict[str, Any] = {"artifact": name}
    with rt.load(artifact, device=device) as model:
        row["device"] = model.device_name
        feed = make_feed(name, folder, model)
        row["reference"], want = reference(name, folder, artifact, feed)
        outs = model.run(None, feed)
        row["rel_err"] = max(rel_err(o, want[n]) for n, o in zip(model.output_names, outs, strict=True))
        # the first run launched directly; from now on the graph replays
        outs = model.run(None, feed)
        row["rel_err_graph"] = max(rel_err(o, want[n]) for n, o in zip(model.output_names, outs, strict=True))
        row["device_name_after"] = model.device_name
        row["ms_host_graph"] = median_ms(lambda: model.run(None, feed), runs)
        dfeed = {k: model.to_device(v) for k, v in feed.items()}
        douts = model.run_dlpack(None, dfeed)
        row["rel_err_device_io"] = max(rel_err(o.numpy(), want[n]) for n, o in zip(model.output_names, douts,
                                                                                    strict=True))
        row["ms_device_in"] = median_ms(lambda: model.run(None, dfeed), runs)
        row["ms_device_io"] = median_ms(lambda: model.run_dlpack(None, dfeed), runs)
        row["rel_err_torch"] = torch_check(model, feed, want)
    with rt.load(artifact, device=device, use_cuda_graph=False) as model:
        outs = model.run(None, feed)
        row["rel_err_no_graph"] = max(rel_err(o, want[n]) for n, o in zip(model.output_names, outs, strict=True))
        row["ms_host_no_graph"] = median_ms(lambda: model.run(None, feed), runs)
    errs = [row[k] for k in ("rel_err", "rel_err_graph", "rel_err_device_io", "rel_err_no_graph", "rel_err_torch")
            if row.get(k) is not None]
    row["ok"] = all(e <= rtol for e in errs)
    return row


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if v < 1e-2 or v >= 1e3 else f"{v:.3f}"
    return str(v)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--rtol", type=float, default=1e-4, help="max relative error (max|a-b| / max|b|)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = ap.parse_args()

    arts = find_artifacts(args.folder)
    if not arts:
        print(f"no artifacts in {args.folder}", file=sys.stderr)
        return 2
    rows = []
    for name, path in arts:
        try:
            rows.append(check_one(name, path, args.folder, args.device, args.runs, args.rtol))
        except Exception as e:  # noqa: BLE001 - one failing model must not hide the others
            traceback.print_exc()
            rows.append({"artifact": name, "ok": False, "error": f"{type(e).__name__}: {e}"})
    cols = [("artifact", "artifact"), ("ok", "ok"), ("rel_err", "rel err"), ("rel_err_torch", "torch err"),
            ("ms_host_graph", "host ms graph"), ("ms_host_no_graph", "host ms no graph"),
            ("ms_device_in", "dev-in ms"), ("ms_device_io", "dev-io ms")]
    print("| " + " | ".join(h for _, h in cols) + " |")
    print("|" + "|".join("---" for _ in cols) + "|")
    for r in rows:
        print("| " + " | ".join(fmt(r.get(k)) for k, _ in cols) + " |")
    for r in rows:
        print(f"{r['artifact']}: {r.get('device_name_after') or r.get('error')}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2, default=str) + "\n")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
