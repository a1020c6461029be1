#!/usr/bin/env python
"""onnxruntime's time per node of one model (its own profiler), to set beside `tlmpack bench
--profile`'s per-kernel table of the same model: which operators onnxruntime runs faster.

    python bench/ort_node_times.py MODEL.onnx [--threads 2] [--runs 30] [--json OUT]

Median over the timed runs of each node's kernel time, in µs, after 10 untimed runs. The profiler
itself costs onnxruntime a few per cent, so compare nodes, not the sum with a latency measured
without it.
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
from pathlib import Path

import numpy as np


def _random_input(rng: np.random.Generator, shape: list[int], onnx_type: str) -> np.ndarray:
    """Normal floats, or small non-negative integers for an integer input (token ids, masks)."""
    if "int" in onnx_type:
        return rng.integers(0, 2, shape).astype(np.int64 if "int64" in onnx_type else np.int32)
    return rng.standard_normal(shape).astype(np.float32)


def node_times(model: str, threads: int, runs: int) -> list[dict]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ort")
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feed = {i.name: _random_input(rng, [d if isinstance(d, int) else 1 for d in i.shape], i.type)
            for i in session.get_inputs()}
    for _ in range(10 + runs):
        session.run(None, feed)
    events = json.loads(Path(session.end_profiling()).read_text())
    times: dict[str, list] = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            times[e["name"][:-len("_kernel_time")]].append(e)
    rows = []
    for name, evs in times.items():
        durations = sorted(e["dur"] for e in evs[-runs:])
        rows.append({"node": name, "op": evs[0]["args"].get("op_name"), "median_us": durations[len(durations) // 2],
                     "output": evs[0]["args"].get("output_type_shape")})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = node_times(args.model, args.threads, args.runs)
    for r in rows:
        print(f"{r['median_us']:>8} us  {r['op']:<18} {r['node'][:70]}")
    print(f"sum of node medians {sum(r['median_us'] for r in rows)} us over {len(rows)} nodes")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
