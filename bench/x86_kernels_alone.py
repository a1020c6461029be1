#!/usr/bin/env python
"""Each x86 kernel of a model timed alone, with its data in cache, beside its time inside the model
(`tlmpack bench --profile --json`): which kernels lose the most to memory inside the model.

    python bench/x86_kernels_alone.py MODEL.onnx PROFILE.json [--threads 2] [--tasks k10_,k16_]

The kernels are the rules' schedules of a heuristic build of MODEL.onnx on this host (pass the
profile of such a build; with `--scheduler auto` every x86 task falls back to the rules today),
each timed as `tlmpack build --tune` times candidates: built as the model would run it (weight
pre-packed), through runtime_c's kernel API, in interleaved rounds, the minimum kept. Alone, a
kernel finds its weights, inputs and output in cache; inside the model they come from wherever
the previous kernels left them. Prints per kernel: calls a run, µs inside the model and alone,
their ratio, and the µs a run the difference costs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # x86_rules_schedules


def alone_us(model: str, threads: int, prefixes: list[str]) -> dict[str, float]:
    """Task id -> µs alone, for the tasks whose id starts with one of ``prefixes`` (all when empty)."""
    from x86_rules_schedules import rules_schedules

    from tlmpack.schedule.tune import measure_candidates

    out: dict[str, float] = {}
    for task, func, param, choice, tvm_target in rules_schedules(model):
        if choice is None or (prefixes and not any(task.id.startswith(p) for p in prefixes)):
            continue
        latency = measure_candidates(func, 1, tvm_target, {"rules": (choice.sketch, choice.decisions)},
                                     threads, param)["rules"]
        if latency is not None:
            out[task.id] = latency
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("profile", help="tlmpack bench --profile --json of the model's build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tasks", default="", help="comma-separated task id prefixes (default: all)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    kernels = json.load(open(args.profile))["profile"]["kernels"]
    alone = alone_us(args.model, args.threads, [p for p in args.tasks.split(",") if p])
    rows = []
    for k in kernels:
        if k["kernel"] in alone:
            calls, inside, solo = k["calls_per_run"], k["mean_us"], alone[k["kernel"]]
            rows.append({"kernel": k["kernel"], "calls": calls, "model_us": round(inside, 1), "alone_us": round(solo, 1),
                         "ratio": round(inside / solo, 3), "cost_us_per_run": round((inside - solo) * calls, 1)})
    rows.sort(key=lambda r: -r["cost_us_per_run"])
    print("| kernel | calls | in the model us | alone us | ratio | us a run |\n|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['kernel']} | {r['calls']:.0f} | {r['model_us']} | {r['alone_us']} | {r['ratio']:.2f} | "
              f"{r['cost_us_per_run']} |")
    print(f"\ntotal: {sum(r['cost_us_per_run'] for r in rows):.0f} us a run inside the model beyond the kernels alone")
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
