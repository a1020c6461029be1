#!/usr/bin/env python
"""Where the rules' CUDA point lands among the measured programs of the seed ONNX builds' tasks
(the ``onnx-*`` corpus entries), per kind, and which sketch family the fastest program is from.

    python bench/cuda_onnx_tasks_report.py [--data DIR] [--run SHARD_NAME] [--json OUT]

``--run``: only the records of that shard (one GPU run: the heuristic point and the random ones
timed side by side). Per task: heuristic median_us / the best random program's; geometric means
over the tasks with at least 8 valid random programs (where the choice matters).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
from collections import defaultdict
from pathlib import Path


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def report(data: Path, run: str | None) -> dict:
    corpora = [json.loads(p.read_text()) for p in sorted((data / "corpus").glob("onnx-*.json"))]
    keys = {t["key"] for c in corpora for t in c["tasks"]}
    held = set(json.loads((data / "heldout.json").read_text()).get("cuda_onnx", []))
    shards = sorted((data / "records" / "cuda").glob(f"{run or '*'}.jsonl.gz"))
    by_task: dict[str, list[dict]] = defaultdict(list)
    for shard in shards:
        with gzip.open(shard, "rt") as f:
            for line in f:
                r = json.loads(line)
                if r["task"] in keys and r.get("valid") and r["median_us"] > 0:
                    by_task[r["task"]].append(r)
    tasks = {}
    for key, records in by_task.items():
        task = json.loads(gzip.open(data / "tasks" / f"{key}.json.gz", "rt").read())
        sketches = [s for s in json.loads(gzip.open(data / "sites" / "cuda.json.gz", "rt").read())["tasks"].get(key, [])]
        rules = [r for r in records if r.get("chosen_by") == "heuristic"]
        random_ = [r for r in records if r.get("chosen_by", "random") == "random"]
        if not random_:
            continue
        best = min(random_, key=lambda r: r["median_us"])
        tasks[key] = {"name": task["name"], "kind": task["kind"], "held_out": key in held, "random": len(random_),
                      "sketches": len(sketches), "best_us": best["median_us"], "best_sketch": best["sketch"],
                      "rules_us": rules[0]["median_us"] if rules else None,
                      "rules_sketch": rules[0]["sketch"] if rules else None, "rules_rule": rules[0].get("rule") if rules else None}
    out: dict = {"shards": [s.name for s in shards], "tasks_with_records": len(tasks), "onnx_tasks": len(keys),
                 "by_kind": {}}
    for kind in sorted({t["kind"] for t in tasks.values()}):
        sel = [t for t in tasks.values() if t["kind"] == kind and t["random"] >= 8 and t["rules_us"]]
        ratios = [t["rules_us"] / t["best_us"] for t in sel]
        out["by_kind"][kind] = {
            "tasks": len(sel),
            "rules_over_best_random_geomean": round(_geomean(ratios), 3),
            "rules_within_1.1x": sum(x <= 1.1 for x in ratios),
            "rules_slower_than_1.5x": sum(x > 1.5 for x in ratios),
            "max": round(max(ratios), 2) if ratios else None,
        }
    all_ratios = [t["rules_us"] / t["best_us"] for t in tasks.values() if t["random"] >= 8 and t["rules_us"]]
    out["all"] = {"tasks": len(all_ratios), "rules_over_best_random_geomean": round(_geomean(all_ratios), 3)}
    out["tasks"] = tasks
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parent.parent / "data")
    ap.add_argument("--run", default=None)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    out = report(args.data, args.run)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "tasks"}, indent=1))


if __name__ == "__main__":
    main()
