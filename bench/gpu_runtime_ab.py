#!/usr/bin/env python
"""On a GPU machine: one artifact's ``model.run`` through two builds of tlmpack.runtime, A/B in turn.

    python bench/gpu_runtime_ab.py --a OLD_ROOT --b NEW_ROOT [--rounds 3] [--runs 300] ARTIFACT.tar ...

OLD_ROOT and NEW_ROOT are checkouts (each with its libtlmrt.so built under tlmpack/runtime). Every
round runs each root in a fresh process per artifact, A then B, so drift on a shared machine falls
on both. Each process times, as medians of ``--runs`` synchronised runs after 20 warm-up runs:
``torch``: inputs as torch CUDA tensors, outputs on the GPU (what bench/gpu_schedulers.py times);
``own``: inputs as the model's own CudaArrays (DLPack's path for other producers skipped); ``host``:
numpy in, numpy out; and ``c``: the C call alone with kept buffers, the runtime's floor. Prints one
table row per artifact and variant, the medians over rounds, and B / A.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

_CHILD = r"""
import json, statistics, sys, time
import numpy as np
import torch
import tlmpack.runtime as rt
from tlmpack.runtime import _capi

def median_ms(fn, runs):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)

path, runs = sys.argv[1], int(sys.argv[2])
m = rt.load(path, device="cuda")
rng = np.random.default_rng(0)
host = {s.name: (rng.random(s.shape, dtype=np.float32) if s.dtype == "float32"
                 else np.zeros(s.shape, s.dtype)) for s in m.inputs}
dev = {k: torch.from_numpy(v).cuda() for k, v in host.items()}
own = {k: m.to_device(v) for k, v in host.items()}
out = {"torch": median_ms(lambda: m.run(None, dev, output_device="cuda"), runs),
       "own": median_ms(lambda: m.run(None, own, output_device="cuda"), runs),
       "host": median_ms(lambda: m.run(None, host), runs)}
ins = (_capi.IO * len(m.inputs))(*(_capi.IO(own[s.name].data_ptr, s.nbytes, _capi.DEVICE_CUDA, 0) for s in m.inputs))
kept = [m._new_cuda_array(s) for s in m.outputs]
outs = (_capi.IO * len(kept))(*(_capi.IO(k.data_ptr, s.nbytes, _capi.DEVICE_CUDA, 0) for k, s in zip(kept, m.outputs)))
out["c"] = median_ms(lambda: m._lib.lib.tlmrt_model_run_io(m._handle, ins, outs), runs)
ref = m.run(None, host)[0]
got = m.run(None, dev, output_device="cuda")[0].numpy()
out["same_output"] = bool(np.array_equal(ref, got))
print("RESULT " + json.dumps(out))
"""


def child(root: Path, artifact: Path, runs: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(root))
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(artifact), str(runs)], capture_output=True, text=True,
                          env=env, cwd=root, timeout=600)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{root} on {artifact.name} failed:\n{proc.stdout}\n{proc.stderr}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", type=Path, required=True, help="the checkout timed first in each round (before)")
    ap.add_argument("--b", type=Path, required=True, help="the checkout timed second (after)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--json", type=Path)
    ap.add_argument("artifacts", nargs="+", type=Path)
    args = ap.parse_args()
    rows = []
    print("| artifact | feed | A ms | B ms | B / A |\n|---|---|---:|---:|---:|")
    for artifact in args.artifacts:
        got: dict[str, list[dict]] = {"a": [], "b": []}
        for _ in range(args.rounds):
            got["a"].append(child(args.a.resolve(), artifact.resolve(), args.runs))
            got["b"].append(child(args.b.resolve(), artifact.resolve(), args.runs))
        for feed in ("torch", "own", "host", "c"):
            a = statistics.median(r[feed] for r in got["a"])
            b = statistics.median(r[feed] for r in got["b"])
            rows.append({"artifact": artifact.name, "feed": feed, "a_ms": a, "b_ms": b, "rounds": got})
            print(f"| {artifact.name} | {feed} | {a:.3f} | {b:.3f} | {b / a:.2f} |", flush=True)
        if not all(r["same_output"] for side in got.values() for r in side):
            print(f"| {artifact.name} | OUTPUTS DIFFER between the host and the torch feed |", flush=True)
    if args.json:
        args.json.write_text(json.dumps([{k: v for k, v in r.items() if k != "rounds"} for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
