#!/usr/bin/env python
"""On another x86 machine (numpy, onnxruntime and our C runtime; no TVM): whole seed-model
artifacts cross-built here (`-t ...,x86 --cpu NAME --cores N`) against onnxruntime on the same
model, at several thread counts, paired in one interleaved pass per model and thread count.

    python bench/remote_x86_models.py --dir DIR [--variants tlm heuristic] [--models a b ...]
                                      [--threads 4 16] [--runs 30] [--json OUT]

DIR holds what bench/prepare_gpu_schedulers.sh packed (the artifacts' x86 half runs here; the
same carry serves bench/gpu_schedulers.py) and STEM.inputs.npz. onnxruntime runs STEM.onnx (or
STEM.onnx.xz) from DIR; where the file is not there (too big to carry) it is exported here by the
zoo from the same portable weights (numpy-drawn, the same under any torch), and each artifact's
output is checked (rel err < 1e-4) against the carried STEM.ref.npz (torch on the build host) where
there is one, else against that session; onnxruntime's own distance to STEM.ref.npz is reported.
Reported per model: the median ms per engine and thread count, tlmpack / onnxruntime, and each
engine's latency at the most threads over its latency at the fewest (scaling).

``--tasks-per-thread K [K ...]`` loads every variant once per K with TLMRT_CPU_TASKS_PER_THREAD=K
(the pool's tasks per thread of a parallel loop) and names the engine VARIANT/kK: the same kernels
with their loops split finer or coarser, in the same interleaved pass. K = 0 loads it as it is, so the
plan's step work splits its long convolutions (runtime_c/tlmrt_plan.h): engine VARIANT/steps; any
K >= 1 switches that off and gives every launch K tasks a thread. A K named twice (``0 1 0``) times
a second copy of the same engine (VARIANT/steps#2), the A/A control.

``--runtime-lib NAME=PATH`` (repeatable) also loads every engine with TLMPACK_RUNTIME_LIB=PATH, another
build of the C runtime (e.g. the previous commit's), as engine ENGINE@NAME in the same pass: a runtime
change paired on the same artifacts.
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_x86 import cpu_flags, cpu_model, ort_session, time_alternating  # noqa: E402
from gpu_schedulers import unpack  # noqa: E402
from gpu_seed_models import _find, _stem, rel_err  # noqa: E402

import tlmpack.runtime as rt  # noqa: E402
from tlmpack.environment import environment  # noqa: E402
from tlmpack.verify import check_live  # noqa: E402

MODELS = ["resnet50", "mobilenetv2", "efficientnet-b0", "bert-base", "gpt2"]


def onnx_file(folders: list[Path], name: str, scratch: Path) -> tuple[Path, str]:
    """The model's ONNX file and where it came from (carried, or exported here)."""
    stem = _stem(name)
    if found := _find(folders, f"{stem}.onnx"):
        return found, "carried"
    out = scratch / f"{stem}.onnx"
    if packed := _find(folders, f"{stem}.onnx.xz"):
        with lzma.open(packed) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 24)
        return out, "carried"
    from tlmpack import zoo

    zoo.export_onnx(name, out, weights="portable")
    return out, "exported here (portable weights)"


def carried_reference(folders: list[Path], name: str) -> np.ndarray | None:
    """The first output of STEM.ref.npz (torch on the build host, on the carried inputs), or None.
    An ONNX file exported on this machine comes from its own torch, whose export of a model can
    differ from the build host's (EfficientNet-B0 under torch 2.11: 4.5e-4 from torch 2.13's)."""
    found = _find(folders, f"{_stem(name)}.ref.npz")
    if not found:
        return None
    with np.load(found) as refs:
        first = refs[refs.files[0]]
    check_live(f"{name} ({found.name})", first)
    return first


def load_with(folder: Path, threads: int, settings: dict[str, str]):
    """rt.load with these environment settings (the pool's tasks per thread, another C runtime)."""
    with environment(settings):
        return rt.load(folder, device="cpu", num_threads=threads)


def engines(variants: list[str], tasks: list[int] | None,
            libs: dict[str, str] | None = None) -> list[tuple[str, str, dict[str, str]]]:
    """(engine name, variant, environment at load) for every engine timed. A K given twice loads a
    second copy (VARIANT/kK#2): the A/A control for the ratio between two K. Each runtime library
    named in ``libs`` adds a copy of every engine loaded with it (ENGINE@NAME)."""
    out: list[tuple[str, str, dict[str, str]]] = []
    for v in variants:
        for k in tasks or [None]:
            name = v if k is None else f"{v}/k{k}" if k else f"{v}/steps"
            copies = sum(1 for _, variant, env in out if variant == v and env.get("k") == str(k))
            out.append((f"{name}#{copies + 1}" if copies else name, v,
                        {"k": str(k)} | ({"TLMRT_CPU_TASKS_PER_THREAD": str(k)} if k else {})))
    out += [(f"{e}@{lib}", v, env | {"TLMPACK_RUNTIME_LIB": path})
            for lib, path in (libs or {}).items() for e, v, env in list(out)]
    return [(e, v, {key: val for key, val in env.items() if key != "k"}) for e, v, env in out]


def measure(name: str, variants: list[str], folders: list[Path], scratch: Path, threads: list[int],
            runs: int, tolerance: float, tasks: list[int] | None = None,
            libs: dict[str, str] | None = None) -> dict:
    from tlmpack import zoo

    dirs = {v: unpack(folders, name, v, variants[0], scratch) for v in variants}
    inputs_file = _find(folders, f"{_stem(name)}.inputs.npz")
    feed = dict(np.load(inputs_file)) if inputs_file else zoo.random_inputs(name, 0)
    onnx_path, origin = onnx_file(folders, name, scratch)
    row: dict = {"model": name, "onnx": origin, "ms": {}, "err": {}}
    # the build host's torch output on the carried inputs is the reference where it was carried;
    # onnxruntime on a file exported here (another torch) is checked against it, not trusted over it
    carried = carried_reference(folders, name) if inputs_file else None
    against = "onnxruntime" if carried is None else "the carried torch reference"
    for t in threads:
        session = ort_session(onnx_path, t)
        reference = session.run(None, feed)[0]
        check_live(f"{name} (onnxruntime)", reference)
        if carried is not None:
            row["ort_err"] = rel_err(reference, carried)
            reference = carried
        fns = {"ort": lambda s=session: s.run(None, feed)}
        models = []
        for v, variant, settings in engines(variants, tasks, libs):
            model = load_with(dirs[variant], t, settings)
            models.append(model)
            err = rel_err(model.run(None, feed)[0], reference)
            row["err"][v] = max(row["err"].get(v, 0.0), err)
            if err >= tolerance:
                raise RuntimeError(f"{name} {v} at {t} threads: rel err {err:.1e} against {against}")
            fns[v] = lambda m=model: m.run(None, feed)
        times = time_alternating(fns, runs, warmup=3)
        row["ms"][str(t)] = {k: statistics.median(ts) * 1e3 for k, ts in times.items()}
        print(f"[{name}] {t} threads: " + ", ".join(f"{k} {ms:.2f} ms" for k, ms in row["ms"][str(t)].items())
              + (f" (onnxruntime vs the carried reference: {row['ort_err']:.1e})" if "ort_err" in row else ""),
              flush=True)
        for model in models:
            model.close()
        del session
    return row


def table(rows: list[dict], variants: list[str], threads: list[int]) -> list[str]:
    engines = [*variants, "ort"]
    lo, hi = str(threads[0]), str(threads[-1])
    head = ["model", "threads", *(f"{e} ms" for e in engines), *(f"{v} / ORT" for v in variants)]
    lines = ["| " + " | ".join(head) + " |", "|---|---:|" + "---:|" * (len(head) - 2)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['error'][:120]} |")
            continue
        for t in threads:
            ms = r["ms"][str(t)]
            lines.append("| " + " | ".join([r["model"], str(t), *(f"{ms[e]:.2f}" for e in engines),
                                             *(f"{ms[v] / ms['ort']:.2f}" for v in variants)]) + " |")
    lines += ["", "| model | " + " | ".join(f"{e} {hi} / {lo} threads" for e in engines) + " |",
              "|---|" + "---:|" * len(engines)]
    for r in rows:
        if "error" not in r:
            lines.append(f"| {r['model']} | " + " | ".join(
                f"{r['ms'][hi][e] / r['ms'][lo][e]:.2f}" for e in engines) + " |")
    for v in variants:
        ok = [r for r in rows if "error" not in r]
        if ok:
            g = math.exp(sum(math.log(r["ms"][hi][v] / r["ms"][hi]["ort"]) for r in ok) / len(ok))
            lines.append(f"geometric mean {v} / ORT at {hi} threads over {len(ok)} models: {g:.2f}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, action="append", required=True)
    ap.add_argument("--variants", nargs="+", default=["tlm", "heuristic"])
    ap.add_argument("--models", nargs="*", default=MODELS)
    ap.add_argument("--threads", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--tolerance", type=float, default=1e-4)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--tasks-per-thread", type=int, nargs="+", help="time each variant at each of these")
    ap.add_argument("--runtime-lib", action="append", default=[], metavar="NAME=PATH",
                    help="also time every engine with this libtlmrt.so (ENGINE@NAME)")
    args = ap.parse_args()
    libs = dict(item.split("=", 1) for item in args.runtime_lib)
    import onnxruntime

    print(f"{cpu_model()} ({cpu_flags()}), {os.cpu_count()} CPUs, onnxruntime {onnxruntime.__version__}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models:
            try:
                rows.append(measure(name, args.variants, args.dir, Path(scratch), args.threads, args.runs,
                                    args.tolerance, args.tasks_per_thread, libs))
            except Exception as e:  # one broken model must not hide the others
                rows.append({"model": name, "error": f"{type(e).__name__}: {e}"})
                print(f"[{name}] {rows[-1]['error']}", flush=True)
            for child in Path(scratch).iterdir():
                shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    names = [e for e, _, _ in engines(args.variants, args.tasks_per_thread, libs)]
    print("\n" + "\n".join(table(rows, names, args.threads)))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
