"""Where today's rules land in a measured held-out pass: after a rule change, which held-out tasks get a
new point, and what the pass measured for it (no new measurement).

    python bench/rules_on_heldout_pass.py data/records/x86/20261207T120401-vm-1445.jsonl.gz [--target x86]

For each task of RUN (a `tlmpack tlm measure --tasks heldout` pass), the rules' point at this checkout
(select.schedule_with_rules, on this host's x86 target or the sm_90 CUDA one) is compared with the rules'
point the pass timed; where they differ, prints the old and new latency (min over the pass's repeats of
that program) and the pass's best, then the geometric mean of rules / best over every task, before and
after (a new point the pass never timed counts as the old one, and is reported).
"""

from __future__ import annotations

import argparse
import math


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run")
    ap.add_argument("--target", choices=["x86", "cuda"], default="x86")
    args = ap.parse_args()

    from tlmpack.schedule.select import schedule_with_rules
    from tlmpack.training.candidates import _task_hardware
    from tlmpack.training.corpus import load_func
    from tlmpack.training.cost_model import program_key
    from tlmpack.training.dataset import latency
    from tlmpack.training.store import Store, default_root

    store = Store(default_root())
    lat: dict[tuple[str, str], float] = {}
    rules: dict[str, str] = {}
    for r in store.shard(args.run):
        if not r.get("valid"):
            continue
        key = (r["task"], program_key(r["sketch"], r["decisions"]))
        lat[key] = min(lat.get(key, math.inf), latency(r))
        if r["chosen_by"] == "heuristic" and r.get("rule") not in ("neighbour", "re-measured"):
            rules.setdefault(r["task"], key[1])
    tvm_target, hardware = _task_hardware(args.target, 1)
    before, after, unmeasured = [], [], 0
    print("| task | name | old µs | new µs | best µs |")
    print("|---|---|---:|---:|---:|")
    for task in sorted(rules):
        best = min(v for (t, _), v in lat.items() if t == task)
        old = lat[(task, rules[task])]
        choice = schedule_with_rules(load_func(store.task(task)), tvm_target, args.target, hardware)
        new = old
        if choice is not None:
            point = program_key(choice.sketch, [d.to_json() for d in choice.decisions])
            if point != rules[task]:
                measured = lat.get((task, point))
                unmeasured += measured is None
                new = measured if measured is not None else old
                shown = f"{measured:.0f}" if measured is not None else "not in the pass"
                print(f"| {task} | {store.task(task)['name'][:40]} | {old:.0f} | {shown} | {best:.0f} |")
        before.append(best / old)
        after.append(best / new)
    geo = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))  # noqa: E731
    print(f"\nrules / best known over {len(before)} tasks: before {geo(before):.3f}, now {geo(after):.3f}"
          + (f" ({unmeasured} new points the pass never timed count as the old ones)" if unmeasured else ""))


if __name__ == "__main__":
    main()
