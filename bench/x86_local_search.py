#!/usr/bin/env python
"""What a local search around the rules' point finds on x86, from passes of `tlm measure --neighbours`.

    python bench/x86_local_search.py RUN.jsonl.gz [RUN2.jsonl.gz ...] [--json OUT]

Every file is one `tlmpack tlm measure` pass (data/records/x86/...): each program in it was built and
timed side by side with the others of the pass. Per task: the rules' point (``chosen_by: heuristic``)
over the fastest one-step edit (``rule: neighbour``) of the same pass, and over the fastest program of
the pass; geometric means over tasks, and how many tasks an edit beats the rules on by more than 2 %.
Several files (a hill climb's passes) are reported one by one and then together, where a task's best
over all passes is divided by its rules' point of the first pass that measured it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
from pathlib import Path


def _geomean(values: list[float]) -> float | None:
    return round(math.exp(sum(map(math.log, values)) / len(values)), 3) if values else None


def _records(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return [r for r in map(json.loads, f) if r.get("valid")]


def _is_rules(r: dict) -> bool:
    """The rules' point, and stored rules' points timed again in the pass (the rules get their best timing)."""
    return r.get("chosen_by") == "heuristic"


def pass_summary(records: list[dict]) -> tuple[dict, dict[str, tuple[float, float]]]:
    """The pass's summary and, per task, (rules' latency, fastest latency of the pass) in µs."""
    tasks: dict[str, list[dict]] = {}
    for r in records:
        tasks.setdefault(r["task"], []).append(r)
    over_edit, over_best, wins, per_task = [], [], 0, {}
    for key, rs in tasks.items():
        rules = [r["min_us"] for r in rs if _is_rules(r)]
        edits = [r["min_us"] for r in rs if r.get("rule") == "neighbour"]
        best = min(r["min_us"] for r in rs)
        if rules:
            per_task[key] = (min(rules), best)
            over_best.append(min(rules) / best)
        if rules and edits:
            over_edit.append(min(rules) / min(edits))
            wins += min(edits) < 0.98 * min(rules)
    return {"tasks": len(tasks), "tasks_with_edits": len(over_edit), "rules_over_best_edit": _geomean(over_edit),
            "rules_over_best_of_pass": _geomean(over_best), "edit_beats_rules_by_2pct": wins}, per_task


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    out, rules, best = {"passes": {}}, {}, {}
    for path in a.runs:
        records = _records(path)
        summary, per_task = pass_summary(records)
        out["passes"][path.name] = summary
        print(path.name, json.dumps(summary, sort_keys=True))
        for key, (rules_us, _) in per_task.items():
            rules.setdefault(key, rules_us)
        for r in records:
            best[r["task"]] = min(best.get(r["task"], math.inf), r["min_us"])
    together = [rules[k] / best[k] for k in rules]
    out["together"] = {"tasks": len(together), "rules_over_best": _geomean(together)}
    print("together", json.dumps(out["together"], sort_keys=True))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
