#!/usr/bin/env python
"""How long the compile-time heuristics take to choose a schedule, per subgraph, on both targets.

    python bench/choose_time.py MODEL.onnx [MODEL.onnx ...] [--json OUT]

For every task of every model (x86: the channels-last graph the x86 build uses; CUDA: the model's
layout), three numbers in ms:
  choose   classify the task + run the rule over a sketch's sampling sites (what the rule costs)
  total    choose + building MetaSchedule's design space + replaying the chosen point with the
           postprocessors (what the build pays per task, before code generation)
Printed: mean and max of each over all subgraphs, per target, and the rule that chose.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from tlmpack.frontend import load_model
    from tlmpack.graph import fuse_to_tir, has_conv2d, partition
    from tlmpack.lower.cuda import cuda_target
    from tlmpack.lower.x86 import x86_target
    from tlmpack.schedule.hardware import cuda_hardware, detect_x86
    from tlmpack.schedule.select import schedule_with_rules

    x86 = x86_target()
    x86_hw = detect_x86(x86.features, x86.num_cores)
    cuda = cuda_target(("sm_90",))
    cuda_hw = cuda_hardware("sm_90")
    rows = []
    for path in args.models:
        imported = load_model(str(path))
        layout = "NHWC" if has_conv2d(imported.mod) else None
        graphs = {"x86": partition(fuse_to_tir(imported.mod, conv_layout=layout)),
                  "cuda": partition(fuse_to_tir(imported.mod))}
        for kind, graph in graphs.items():
            target, hw = (x86.tvm_target(), x86_hw) if kind == "x86" else (cuda.tvm_target(), cuda_hw)
            for task in graph.tasks:
                choice = schedule_with_rules(graph.task_funcs[task.id], target, kind, hw)
                rows.append({"model": path.stem, "target": kind, "task": task.name,
                             "rule": choice.rule if choice else None,
                             "choose_ms": choice.choose_ms if choice else None,
                             "total_ms": choice.total_ms if choice else None})
        print(f"{path.stem}: {len(graphs['x86'].tasks)} x86 tasks, {len(graphs['cuda'].tasks)} cuda tasks", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print("\n| target | subgraphs | by a rule | choose ms mean | choose ms max | with space + replay ms mean | max |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind in ("x86", "cuda"):
        mine = [r for r in rows if r["target"] == kind]
        chosen = [r for r in mine if r["rule"]]
        if not chosen:
            continue
        choose = [r["choose_ms"] for r in chosen]
        total = [r["total_ms"] for r in chosen]
        print(f"| {kind} | {len(mine)} | {len(chosen)} | {statistics.mean(choose):.2f} | {max(choose):.2f} | "
              f"{statistics.mean(total):.0f} | {max(total):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
