#!/usr/bin/env python
"""How evenly each x86 kernel of a model can share its work among N threads, read from the
schedules the rules write for that machine, without running anything.

    python bench/x86_parallel_chunks.py MODEL.onnx --cpu skylake-avx512 --cores 16 [--threads 4 16]
                                        [--profile PROFILE.json] [--all]

A kernel's parallel loop of C iterations runs on the pool as at most C chunks, so on T threads the
busiest thread runs ceil(C / T) of them while the kernel's work is worth C / T: its balance is
(C / T) / ceil(C / T), and a kernel of 3 chunks on 16 threads is 0.19 (13 threads wait). With a profile
(`tlmpack bench ART.tar --threads T0 --profile --json` of the same build on the target machine, e.g.
from bench/remote_x86_profile.py), each kernel's time there is scaled to the most threads asked,
assuming perfect scaling within its chunks, and the table says what the imbalance costs a run in µs.
Sorted by that cost, else by balance. Kernels with no parallel loop show 1 chunk.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # x86_rules_schedules


def parallel_extents(func) -> list[int]:
    """The extents of the parallel loops of a scheduled PrimFunc, outermost first (loops, sequences,
    blocks and branches walked; TVM 0.27's tirx has no visitor in Python)."""
    from tvm import tirx

    found: list[int] = []

    def visit(node) -> None:
        if node is None or isinstance(node, (int, float)):
            return
        if isinstance(node, tirx.For) and node.kind == tirx.ForKind.PARALLEL:
            found.append(int(node.extent.value) if hasattr(node.extent, "value") else -1)
        if isinstance(node, tirx.SeqStmt):
            for part in node.seq:
                visit(part)
            return
        for name in ("body", "block", "init", "then_case", "else_case"):
            visit(getattr(node, name, None))

    visit(func.body)
    return found


def chunks_per_task(model: str, cpu: str | None, cores: int | None) -> tuple[dict[str, int], dict[str, int]]:
    """Task id -> parallel chunks of the rules' schedule for ``cpu`` with ``cores``, and task id -> calls a run."""
    from x86_rules_schedules import rules_schedules

    chunks: dict[str, int] = {}
    calls: dict[str, int] = {}
    for task, _, _, choice, _ in rules_schedules(model, cpu, cores):
        extents = parallel_extents(choice.func) if choice is not None else []
        chunks[task.id] = extents[0] if extents else 1
        calls[task.id] = task.calls
    return chunks, calls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--cpu", default=None, help="LLVM CPU name of the target (default: this host)")
    ap.add_argument("--cores", type=int, default=None)
    ap.add_argument("--threads", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--profile", help="`tlmpack bench --profile --json` of the same build on the target")
    ap.add_argument("--all", action="store_true", help="every kernel, not only those below balance 0.9")
    args = ap.parse_args()
    from tlmpack.graph.layout_ops import chunk_balance as balance

    times: dict[str, float] = {}
    base_threads = None
    if args.profile:
        result = json.load(open(args.profile))
        found = re.fullmatch(r"cpu \((\d+) threads?\)", str(result.get("device_name", "")))
        if found is None:
            ap.error(f"{args.profile}: expected an x86 profile (device_name 'cpu (N threads)' from `tlmpack bench "
                     f"--profile --json`), found device_name {result.get('device_name')!r}")
        base_threads = int(found.group(1))
        times = {k["kernel"]: k["mean_us"] for k in result["profile"]["kernels"]}
    chunks, calls = chunks_per_task(args.model, args.cpu, args.cores)  # after the checks: it builds the model
    most = max(args.threads)
    rows = []
    for task, c in chunks.items():
        row = {"task": task, "calls": calls.get(task, 0), "chunks": c,
               **{f"balance_t{t}": round(balance(c, t), 2) for t in args.threads}}
        if task in times and base_threads:
            # its time at base_threads, scaled to `most` threads were it perfectly balanced, and the loss
            ideal = times[task] * balance(c, base_threads) * base_threads / most
            row["ideal_us"] = round(ideal, 1)
            row["lost_us_per_run"] = round((ideal / balance(c, most) - ideal) * row["calls"], 1)
        rows.append(row)
    key = (lambda r: -r.get("lost_us_per_run", 0)) if times else (lambda r: r[f"balance_t{most}"])
    rows.sort(key=key)
    cols = ["task", "calls", "chunks", *[f"balance_t{t}" for t in args.threads]] + (["lost_us_per_run"] if times else [])
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        if args.all or r[f"balance_t{most}"] < 0.9:
            print("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")
    if times:
        print(f"\nlost to imbalance at {most} threads: {sum(r.get('lost_us_per_run', 0) for r in rows):.0f} us a run "
              f"(from the {base_threads}-thread profile, each kernel scaled as if perfectly balanced)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
