#!/usr/bin/env python
"""Linear layers (MatMul by a constant weight, then a bias) of the transformer seed models, built
here for another x86 (`--cpu NAME --cores N`) and timed there against onnxruntime, paired per
shape and thread count: where a model's gap on that machine comes from, kernel by kernel.

    python bench/remote_x86_gemm.py prepare WORK CARRY --cpu skylake-avx512 --cores 16 \
        [--variants auto heuristic auto@haswell]                                   # here
    python3 bench/remote_x86_gemm.py run CARRY [--threads 1 4 16] [--runs 60] [--json OUT]  # there

A variant is a scheduler (`auto`, `heuristic`, ...), optionally `@CPU` to build for another LLVM CPU
than --cpu (e.g. `auto@haswell`: the same machine with AVX2 code, to tell the vector width from the
schedule). Weights are multiples of 1/16 in [-0.5, 0.5) so the artifacts compress for the carry
(the timing does not depend on the values). Reported: median ms, GFLOP/s and tlmpack / onnxruntime.
"""

from __future__ import annotations

import argparse
import json
import lzma
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

# (label, M, K, N) of BERT-base / GPT-2 at sequence 128
SHAPES = [("bert-qkv", 128, 768, 768), ("gpt2-attn", 128, 768, 2304),
          ("bert-ffn1", 128, 768, 3072), ("bert-ffn2", 128, 3072, 768)]



def linear_onnx(path: Path, m: int, k: int, n: int, seed: int = 0) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = (rng.integers(-8, 8, (k, n)) / 16).astype(np.float32)
    b = (rng.integers(-8, 8, (n,)) / 16).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y0"]), helper.make_node("Add", ["y0", "b"], ["y"])], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")])
    # IR version 8: what older onnxruntime builds (1.30 on the GPU machine: at most 13) still load
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


def prepare(work: Path, carry: Path, cpu: str, cores: int, variants: list[str]) -> None:
    work.mkdir(parents=True, exist_ok=True)
    carry.mkdir(parents=True, exist_ok=True)
    for label, m, k, n in SHAPES:
        onnx_path = work / f"{label}.onnx"
        linear_onnx(onnx_path, m, k, n)
        with open(onnx_path, "rb") as src, lzma.open(carry / f"{label}.onnx.xz", "wb", preset=6) as dst:
            shutil.copyfileobj(src, dst)
        for v in variants:
            scheduler, _, other_cpu = v.partition("@")
            out = work / f"{label}.{v}.tar"
            subprocess.run([sys.executable, "-m", "tlmpack.cli", "build", str(onnx_path), "-t", "x86", "--cpu",
                            other_cpu or cpu, "--cores", str(cores), "--scheduler", scheduler, "-o", str(out)],
                           check=True)
            with open(out, "rb") as src, lzma.open(carry / f"{label}.{v}.tar.xz", "wb", preset=6) as dst:
                shutil.copyfileobj(src, dst)
    (carry / "gemm.json").write_text(json.dumps({"shapes": SHAPES, "variants": variants, "cpu": cpu,
                                                 "cores": cores}))


def run(carry: Path, threads: list[int], runs: int, json_out: Path | None) -> None:
    from bench_x86 import cpu_flags, cpu_model, ort_session, time_alternating

    import tlmpack.runtime as rt

    spec = json.loads((carry / "gemm.json").read_text())
    print(f"# {cpu_model()} ({cpu_flags()}); built for {spec['cpu']}, {spec['cores']} cores")
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for label, m, k, n in spec["shapes"]:
            onnx_path = Path(scratch) / f"{label}.onnx"
            with lzma.open(carry / f"{label}.onnx.xz") as src, open(onnx_path, "wb") as dst:
                shutil.copyfileobj(src, dst)
            folders = {}
            for v in spec["variants"]:
                folders[v] = Path(scratch) / f"{label}.{v}"
                with lzma.open(carry / f"{label}.{v}.tar.xz") as f, tarfile.open(fileobj=f) as tar:
                    tar.extractall(folders[v], filter="data")
            x = np.random.default_rng(1).uniform(-1, 1, (m, k)).astype(np.float32)
            for t in threads:
                session = ort_session(onnx_path, t)
                ref = session.run(None, {"x": x})[0]
                feed = {"x": x}
                fns = {"ort": lambda s=session, f=feed: s.run(None, f)}
                models = []
                for v, folder in folders.items():
                    model = rt.load(folder, device="cpu", num_threads=t)
                    got = model.run(None, {"x": x})[0]
                    err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
                    if not err < 1e-4:
                        raise RuntimeError(f"{label} {v} at {t} threads: rel err {err:.1e} against onnxruntime")
                    fns[v] = lambda mdl=model, f=feed: mdl.run(None, f)
                    models.append(model)
                times = time_alternating(fns, runs, warmup=5)
                ms = {e: statistics.median(ts) * 1e3 for e, ts in times.items()}
                gflops = {e: 2 * m * k * n / (v * 1e-3) / 1e9 for e, v in ms.items()}
                rows.append({"shape": label, "m": m, "k": k, "n": n, "threads": t, "ms": ms, "gflops": gflops})
                print(f"{label} {t:>2} threads: " + ", ".join(
                    f"{e} {ms[e]:.3f} ms ({gflops[e]:.0f} GFLOP/s)" for e in ms), flush=True)
                for model in models:
                    model.close()
    engines = ["ort", *spec["variants"]]
    print("\n| shape | threads | " + " | ".join(f"{e} GFLOP/s" for e in engines) + " | "
          + " | ".join(f"{v} / ORT" for v in spec["variants"]) + " |")
    print("|---" * (2 + len(engines) + len(spec["variants"])) + "|")
    for r in rows:
        print(f"| {r['shape']} | {r['threads']} | " + " | ".join(f"{r['gflops'][e]:.0f}" for e in engines) + " | "
              + " | ".join(f"{r['ms'][v] / r['ms']['ort']:.2f}" for v in spec["variants"]) + " |")
    if json_out:
        json_out.write_text(json.dumps({"machine": cpu_model(), "flags": cpu_flags(), "spec": spec, "rows": rows},
                                       indent=1))


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("work", type=Path)
    p.add_argument("carry", type=Path)
    p.add_argument("--cpu", required=True)
    p.add_argument("--cores", type=int, required=True)
    p.add_argument("--variants", nargs="+", default=["auto", "heuristic", "auto@haswell"])
    r = sub.add_parser("run")
    r.add_argument("carry", type=Path)
    r.add_argument("--threads", type=int, nargs="+", default=[1, 4, 16])
    r.add_argument("--runs", type=int, default=60)
    r.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.cmd == "prepare":
        prepare(args.work, args.carry, args.cpu, args.cores, args.variants)
    else:
        run(args.carry, args.threads, args.runs, args.json)


if __name__ == "__main__":
    main()
