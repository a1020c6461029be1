#!/usr/bin/env python
"""Dynamic batch vs exact-batch artifacts, side by side.

    python bench/dynamic_batch.py [build|run|all] [--dir DIR] [--models cnn,encoder] [--targets x86]
                                  [--device cpu] [--threads T] [--runs N] [--calibrate] [--no-append]
                                  [--report FILE]

build (here: needs the compiler and torch): writes two small models with seeded random weights and a
symbolic batch (``cnn``: a ResNet-ish CNN on 3x32x32; ``encoder``: a BERT-ish 2-layer encoder over 32
tokens), then for each target builds ``DIR/<model>.dyn.<target>.tar`` (``--batch 1,4,16``) and the
exact-batch artifacts ``DIR/<model>.b<N>.<target>.tar`` for N in 1, 3, 4, 7, 16 (``--input-shape``).

run (needs numpy, onnxruntime and tlmpack's runtime only: no TVM, so it runs on the GPU machine from
prebuilt artifacts): loads every artifact of the target on ``--device``, checks every batch against
onnxruntime (relative L2), and times batches 1, 3, 4, 7, 16 on the dynamic and the exact artifact in
rotation, run by run, with the exact artifact of the next listed plan for in-between batches (the
median of ``--runs`` warm runs of each), so every ratio in a row is paired.
``--calibrate`` has the runtime cover batches by measured plan times instead of the build's
estimates (Model.calibrate_batch_plans). The table shows both, their ratio, and the in-between batches against the next listed plan (the
acceptance target: within 1.3x of it). It is printed, and appended to BENCHMARKS.md (``--no-append``
to skip) or written to ``--report FILE``.

all (default): build, then run on x86 here.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PLANS = (1, 4, 16)
BATCHES = (1, 3, 4, 7, 16)
MODELS = ("cnn", "encoder")


# --- models (build only: torch) ------------------------------------------------------------------

def _export(name: str, path: Path) -> None:
    """Exports one model to ONNX with axis 0 named "batch" (seeded weights, opset 17)."""
    import torch
    from torch import nn

    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.a, self.b = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, c, 3, padding=1)

        def forward(self, x):
            return torch.relu(x + self.b(torch.relu(self.a(x))))

    class Cnn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Conv2d(3, 32, 3, padding=1)
            self.s1 = nn.Sequential(Block(32), Block(32))
            self.down = nn.Conv2d(32, 64, 3, stride=2, padding=1)
            self.s2 = nn.Sequential(Block(64), Block(64))
            self.fc = nn.Linear(64, 10)

        def forward(self, x):
            x = self.s2(torch.relu(self.down(self.s1(torch.relu(self.stem(x))))))
            return self.fc(x.mean(dim=(2, 3)))

    class Layer(nn.Module):
        """Sizes are constants (not read from x.shape), so the export has no shape arithmetic on the batch."""

        def __init__(self, d: int, heads: int, seq: int = 32) -> None:
            super().__init__()
            self.d, self.heads, self.seq, self.scale = d, heads, seq, float((d // heads) ** -0.5)
            self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

        def forward(self, x):
            qkv = self.qkv(x).reshape(-1, self.seq, 3, self.heads, self.d // self.heads).permute(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            att = torch.softmax((q * self.scale) @ k.transpose(-1, -2), dim=-1)
            x = self.n1(x + self.out((att @ v).transpose(1, 2).reshape(-1, self.seq, self.d)))
            return self.n2(x + self.ff(x))

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok, self.pos = nn.Embedding(1000, 128), nn.Parameter(torch.randn(32, 128) * 0.02)
            self.layers = nn.Sequential(Layer(128, 4), Layer(128, 4))

        def forward(self, ids):
            return self.layers(self.tok(ids) + self.pos)

    model = (Cnn() if name == "cnn" else Encoder()).eval()
    example = torch.randn(2, 3, 32, 32) if name == "cnn" else torch.randint(0, 1000, (2, 32))
    in_name = "x" if name == "cnn" else "ids"
    torch.onnx.export(model, (example,), str(path), input_names=[in_name], output_names=["y"], opset_version=17,
                      dynamic_axes={in_name: {0: "batch"}, "y": {0: "batch"}}, dynamo=False)


def _tail(name: str) -> str:
    return "3x32x32" if name == "cnn" else "32"


def build(args) -> None:
    """Writes the models and builds the dynamic and exact-batch artifacts (subprocesses of the CLI)."""
    directory = Path(args.dir)
    directory.mkdir(parents=True, exist_ok=True)
    for name in args.models:
        onnx_path = directory / f"{name}.onnx"
        if not onnx_path.exists():
            _export(name, onnx_path)
        in_name = "x" if name == "cnn" else "ids"
        for target in args.targets:
            jobs = {f"{name}.dyn.{target}.tar": ["--batch", ",".join(map(str, PLANS))]}
            for b in BATCHES:
                jobs[f"{name}.b{b}.{target}.tar"] = ["--input-shape", f"{in_name}:{b}x{_tail(name)}"]
            for tar, extra in jobs.items():
                if (directory / tar).exists():
                    continue
                cmd = [sys.executable, "-m", "tlmpack.cli", "build", str(onnx_path), "-t", target,
                       "-o", str(directory / tar), *extra]
                started = time.perf_counter()
                done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
                if done.returncode != 0:
                    sys.exit(f"building {tar} failed:\n{done.stderr[-3000:]}")
                print(f"built {tar} in {time.perf_counter() - started:.0f} s", flush=True)


# --- timing (run: numpy, onnxruntime, tlmpack.runtime) ----------------------------------------------

def _inputs(name: str, batch: int):
    import numpy as np

    rng = np.random.default_rng(batch)
    if name == "cnn":
        return {"x": rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)}
    return {"ids": rng.integers(0, 1000, (batch, 32)).astype(np.int64)}


def _interleaved_ms(jobs: list, runs: int, warmup: int) -> list[float]:
    """Median ms of each (model, feed) job, timed run by run in rotation (abc, bca, cab, ...), so the
    drift of a shared machine hits every job alike and ratios within one call are paired."""
    for _ in range(warmup):
        for model, feed in jobs:
            model.run(None, feed)
    times: list[list[float]] = [[] for _ in jobs]
    for i in range(runs):
        for k in range(len(jobs)):
            j = (i + k) % len(jobs)
            model, feed = jobs[j]
            t0 = time.perf_counter()
            model.run(None, feed)
            times[j].append(time.perf_counter() - t0)
    return [statistics.median(t) * 1e3 for t in times]


def run(args) -> list[str]:
    """Checks and times every model's artifacts on args.device; returns the markdown table's lines."""
    import numpy as np
    import onnxruntime as ort

    import tlmpack.runtime as rt

    directory = Path(args.dir)
    target = args.targets[0]
    kw = {"num_threads": args.threads} if args.threads else {}
    lines = ["| model | batch | exact ms | dynamic ms | dynamic / exact | runs as | vs next listed plan | rel err |",
             "|---|---:|---:|---:|---:|---|---:|---:|"]
    for name in args.models:
        dyn = rt.load(directory / f"{name}.dyn.{target}.tar", device=args.device, **kw)
        exact = {b: rt.load(directory / f"{name}.b{b}.{target}.tar", device=args.device, **kw) for b in BATCHES}
        session = ort.InferenceSession(str(directory / f"{name}.onnx"), providers=["CPUExecutionProvider"])
        from tlmpack.runtime.batching import cover

        if args.calibrate:
            print(f"{name}: measured plan costs (ns) {dyn.calibrate_batch_plans(runs=5)}", flush=True)
        costs = dict(dyn.batch_costs)
        results = {}
        for b in BATCHES:
            feed = _inputs(name, b)
            ref = session.run(None, feed)[0]
            got = dyn.run(None, feed)[0]
            assert np.isfinite(ref).all() and np.abs(ref).max() > 0, "reference is all zeros or not finite"
            err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
            nxt = min(p for p in PLANS if p >= b)
            jobs = [(exact[b], feed), (dyn, feed)] + ([(exact[nxt], _inputs(name, nxt))] if nxt != b else [])
            results[b] = (*_interleaved_ms(jobs, args.runs, args.warmup), err)
        for b in BATCHES:
            ex, dy, *rest = results[b]
            err = rest[-1]
            nxt = min(p for p in PLANS if p >= b)
            vs_next = f"{dy / rest[0]:.2f}x of exact {nxt} ({rest[0]:.3f} ms)" if nxt != b else ""
            lines.append(f"| {name} | {b} | {ex:.3f} | {dy:.3f} | {dy / ex:.2f} | {'+'.join(map(str, cover(b, costs)))} "
                         f"| {vs_next} | {err:.1e} |")
        print(f"{name}: {dyn.device_name}", flush=True)
        dyn.close()
        for m in exact.values():
            m.close()
    return lines


def _machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", nargs="?", default="all", choices=["build", "run", "all"])
    parser.add_argument("--dir", default=str(REPO / "out" / "dynamic_batch"))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--targets", default="x86", help="build: targets to build; run: the first is timed")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--calibrate", action="store_true",
                        help="cover batches by measured plan times (Model.calibrate_batch_plans), not the build's estimates")
    parser.add_argument("--no-append", action="store_true")
    parser.add_argument("--report", default=None, help="write the table here instead of BENCHMARKS.md")
    args = parser.parse_args()
    args.models = [m for m in args.models.split(",") if m]
    args.targets = [t for t in args.targets.split(",") if t]
    if args.mode in ("build", "all"):
        build(args)
    if args.mode == "build":
        return
    lines = run(args)
    header = [f"## {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} — dynamic batch vs exact-batch artifacts "
              f"({args.device}, issue 13 item 4)", "",
              f"Machine: {_machine()}. Command: `python bench/dynamic_batch.py "
              f"{shlex.join(sys.argv[1:])}`. Batches covered by {'measured plan times' if args.calibrate else 'the build estimates'}. Plans {','.join(map(str, PLANS))}; median of {args.runs} warm runs "
              f"each; a row's artifacts run in rotation, run by run, so its ratios are paired.", ""]
    text = "\n".join(header + lines) + "\n"
    print(text)
    if args.report:
        Path(args.report).write_text(text)
    elif not args.no_append:
        with open(REPO / "BENCHMARKS.md", "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
