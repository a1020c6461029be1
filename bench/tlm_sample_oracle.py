#!/usr/bin/env python
"""How much of a search pass's headroom the TLM's own candidates hold, and whether its likelihood finds it.

    python bench/tlm_sample_oracle.py RUN.jsonl.gz [--samples 16] [--seed S] [--weights W]

RUN is one `tlmpack tlm measure --target x86 --tasks heldout --samples N --seed S` pass (data/records/x86/...).
The held-out tasks are decoded again exactly as that pass did (the same weights, samples and seed, 1 thread), each
decoded point is matched to its latency in RUN (min_us), and per task three picks are compared with the rules'
point of the same pass: the greedy point, the candidate the model is surest of (the highest confidence), and the
fastest candidate (an oracle over the model's own candidates). Geometric means over the tasks.
"""

from __future__ import annotations

import argparse
import json
import math


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run")
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--seed", type=int, default=37)
    ap.add_argument("--weights", default=None, help="the pass's --weights (default: the package's)")
    args = ap.parse_args()

    from pathlib import Path

    from tlmpack.schedule.select import hint_for
    from tlmpack.schedule.space import DesignSpace
    from tlmpack.tlm.decode import decode_space
    from tlmpack.tlm.model import load_file, weights_path
    from tlmpack.training.candidates import _task_hardware
    from tlmpack.training.corpus import load_func
    from tlmpack.training.dataset import heldout_keys, task_info
    from tlmpack.training.store import Store, default_root

    store = Store(default_root())
    records = [r for r in store.shard(args.run) if r.get("valid")]
    latency: dict[tuple, float] = {}
    rules: dict[str, float] = {}
    for r in records:
        point = (r["task"], r["sketch"], json.dumps(r["decisions"]))
        latency[point] = min(latency.get(point, math.inf), r["min_us"])
        if r.get("chosen_by") == "heuristic" and r.get("rule") != "neighbour":
            rules[r["task"]] = min(rules.get(r["task"], math.inf), r["min_us"])
    tlm = load_file(Path(args.weights) if args.weights else weights_path("x86"), "x86")
    tvm_target, hardware = _task_hardware("x86", 1)
    picks: dict[str, list[float]] = {"greedy": [], "surest": [], "fastest (oracle)": []}
    for key in sorted(heldout_keys(store, "x86", evaluation=True)):
        if key not in rules:
            continue
        task = store.task(key)
        func = load_func(task)
        space = DesignSpace(func, tvm_target, seed=args.seed)
        decoded = decode_space(tlm, space, hardware, task_info(task), samples=args.samples, seed=args.seed,
                               hint=hint_for(tlm, func, tvm_target, "x86", hardware))
        timed = [(d.confidence, latency.get((key, d.sketch, json.dumps([x.to_json() for x in d.decisions]))))
                 for d in decoded]
        if not timed or timed[0][1] is None:
            print(f"{key}: the pass did not time this decode (other weights or seed?)")
            continue
        known = [(c, us) for c, us in timed if us is not None]
        picks["greedy"].append(rules[key] / timed[0][1])
        picks["surest"].append(rules[key] / max(known)[1])
        picks["fastest (oracle)"].append(rules[key] / min(us for _, us in known))
    print("| pick among the model's candidates | tasks | speed-up over the rules (geometric mean) |")
    print("|---|---:|---:|")
    for name, values in picks.items():
        mean = math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")
        print(f"| {name} | {len(values)} | {mean:.3f} |")


if __name__ == "__main__":
    main()
