#!/usr/bin/env python
"""The rules' point of each widened convolution (conv_width.py) against the same task unwidened, alone.

    python bench/x86_conv_width_ab.py MODEL.onnx [--threads 2] [--rounds 3] [--rows 6] [--json OUT]

Both x86 graphs (channels-last, the AVX2 pad policy with ``--rows`` register rows) are lowered from
the same ONNX file, once with the widening and once without; every convolution task whose TIR
differs is scheduled by the rules and timed as a build runs it (schedule/tune.measure_candidates:
pre-packed weight, runtime_c's kernel API), the two alternating for ``--rounds`` rounds, the minimum
kept. Hot-cache kernel times: a whole-model run (bench_x86.py --compare) is the figure that counts.
"""

from __future__ import annotations

import argparse
import json


def graphs(model: str, rows: int):
    """(plain, widened) x86 graphs of ``model``."""
    import tlmpack.graph_fallbacks as fallbacks
    from tlmpack.frontend import load_model
    from tlmpack.graph.relax_rewrites import policy_for
    from tlmpack.graph_fallbacks import Lowering, lower_graph

    lowering = Lowering("NHWC", fast_math=True, pad=policy_for(("x86",), 8, rows))
    widened = fallbacks._conv_tile
    try:
        fallbacks._conv_tile = lambda lw: (0, 0)
        plain, _, _ = lower_graph(load_model(model).mod, lowering)
    finally:
        fallbacks._conv_tile = widened
    wide, _, _ = lower_graph(load_model(model).mod, lowering)
    return plain, wide


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=6)
    parser.add_argument("--json")
    args = parser.parse_args()

    from tlmpack.lower.x86 import x86_target
    from tlmpack.schedule.hardware import detect_x86
    from tlmpack.schedule.select import mark_layout_free, packed_weight_param, schedule_with_rules
    from tlmpack.schedule.tune import measure_candidates

    plain, wide = graphs(args.model, args.rows)
    hardware = detect_x86(("avx2", "fma"), cores=args.threads)
    target = x86_target(None, args.threads).tvm_target()
    rows = []
    for p_task, w_task in zip(plain.tasks, wide.tasks, strict=True):
        funcs = {"plain": (plain, p_task), "wide": (wide, w_task)}
        if plain.task_funcs[p_task.id].script() == wide.task_funcs[w_task.id].script():
            continue
        points = {}
        for label, (graph, task) in funcs.items():
            func = graph.task_funcs[task.id]
            param = packed_weight_param(graph, task.id, func)
            rules = schedule_with_rules(mark_layout_free(func, param), target, "x86", hardware)
            outputs = next(c.num_outputs for c in graph.calls if c.task == task.id)
            points[label] = (func, outputs, {"rules": (rules.sketch, rules.decisions)}, param)
        best = {"plain": float("inf"), "wide": float("inf")}
        for _ in range(args.rounds):
            for label, (func, outputs, candidate, param) in points.items():
                us = measure_candidates(func, outputs, target, candidate, args.threads, param)["rules"]
                best[label] = min(best[label], us if us is not None else float("inf"))
        rows.append({"task": p_task.name, "calls": p_task.calls, "plain_us": round(best["plain"], 1),
                     "wide_us": round(best["wide"], 1), "ratio": round(best["wide"] / best["plain"], 3)})
        print(f"{p_task.name:40s} calls {p_task.calls}  plain {best['plain']:8.1f}  wide {best['wide']:8.1f}  "
              f"{best['wide'] / best['plain']:.3f}", flush=True)
    plain_us = sum(r["calls"] * r["plain_us"] for r in rows)
    wide_us = sum(r["calls"] * r["wide_us"] for r in rows)
    if rows:
        print(f"weighted by calls: {plain_us:.0f} -> {wide_us:.0f} us, {wide_us / plain_us:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "threads": args.threads, "tasks": rows}, f, indent=1)


if __name__ == "__main__":
    main()
