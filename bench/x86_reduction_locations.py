#!/usr/bin/env python
"""Where should an x86 reduction compute its partial sums? The rules' point against variants of it.

    python bench/x86_reduction_locations.py [--tasks train|heldout] [--limit 24] [--out FILE.json]

For a seeded choice of stored reduce tasks (training tasks, or the held-out ones), the rules' point
(``schedule_with_rules``) and variants that change one compute-location decision (to loop 0, 1 or 2),
all of them (to 0 or 1), or set every location back to the root (``variant:root``: the rules before
the short-row change of heuristics/x86_reduction.py) are built and timed in one interleaved pass on
this host (1 thread, lower-priority processes paused), through training.candidates.measure_x86. The
records go to the store (the rules' point as ``heuristic``, the variants as ``random`` with their
``rule`` naming the variant). Prints, per variant, its geometric-mean speed-up over the rules' point
and each task's latencies; ``--out`` keeps them as JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tlmpack.schedule.select import schedule_with_rules  # noqa: E402
from tlmpack.training.candidates import Candidate, _task_hardware, measure_x86  # noqa: E402
from tlmpack.training.corpus import load_func  # noqa: E402
from tlmpack.training.dataset import heldout_keys, latency  # noqa: E402
from tlmpack.training.store import Store, default_root  # noqa: E402

RULES = "x86-reduction"


def reduce_tasks(store: Store, which: str, limit: int) -> list[str]:
    """A seeded choice of reduce tasks with at least 8 stored programs, held out or not."""
    held = heldout_keys(store, "x86")
    counts: dict[str, int] = defaultdict(int)
    for r in store.records("x86"):
        if r.get("valid") and not r.get("role"):
            counts[r["task"]] += 1
    keys = [k for k, n in counts.items() if n >= 8 and store.task(k)["kind"] == "reduce"
            and (k in held) == (which == "heldout")]
    return sorted(keys, key=lambda k: hashlib.sha256(k.encode()).hexdigest())[:limit]


def variants(sketch: int, base: list) -> list[Candidate]:
    """The rules' point and its compute-location variants."""
    out = [Candidate(sketch, base, "heuristic", RULES)]
    locations = [i for i, d in enumerate(base) if d[0] == "compute_location"]
    for i in locations:
        for value in (0, 1, 2):
            point = [list(d) for d in base]
            point[i] = ["compute_location", value]
            out.append(Candidate(sketch, point, "random", f"variant:cl{i}={value}"))
    root = [["compute_location", -1] if d[0] == "compute_location" else list(d) for d in base]
    if root != base:
        out.append(Candidate(sketch, root, "random", "variant:root"))
    for value in (0, 1):
        point = [["compute_location", value] if d[0] == "compute_location" else list(d) for d in base]
        out.append(Candidate(sketch, point, "random", f"variant:all={value}"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", choices=("train", "heldout"), default="train")
    ap.add_argument("--limit", type=int, default=24)
    ap.add_argument("--out", help="write the per-task latencies (JSON) here")
    args = ap.parse_args()
    store = Store(default_root())
    tvm_target, hardware = _task_hardware("x86", 1)
    candidates = {}
    for key in reduce_tasks(store, args.tasks, args.limit):
        choice = schedule_with_rules(load_func(store.task(key)), tvm_target, "x86", hardware)
        if choice is not None:
            candidates[key] = variants(choice.sketch, [d.to_json() for d in choice.decisions])
    print(f"{len(candidates)} tasks, {sum(len(v) for v in candidates.values())} programs", flush=True)
    records = measure_x86(store, candidates, threads=1, pause_niced=True, say=lambda s: print(s, flush=True))
    by_task: dict[str, dict[str, float]] = defaultdict(dict)
    for r in records:
        if r.get("valid"):
            by_task[r["task"]][r.get("rule") or "random"] = latency(r)
    if args.out:
        Path(args.out).write_text(json.dumps(by_task, indent=1) + "\n")
    for name in sorted({n for v in by_task.values() for n in v if n.startswith("variant")}):
        ratios = [v[RULES] / v[name] for v in by_task.values() if name in v and RULES in v]
        if ratios:
            geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
            print(f"{name}: {len(ratios)} tasks, speed-up over the rules {geo:.3f} (min {min(ratios):.2f}, "
                  f"max {max(ratios):.2f})")
    for key, row in by_task.items():
        task = store.task(key)
        print(task["name"][:30], task["spatial"], task["reduction"], {n: round(us, 1) for n, us in row.items()})


if __name__ == "__main__":
    main()
