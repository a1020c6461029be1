#!/usr/bin/env python
"""How the x86 dataset ranks the rules' point among random programs, timed as builds run them.

    python bench/x86_as_built_gap.py [--data DIR] [--threads 1] [--json OUT]

For the tasks whose build pre-packs a weight (data/corpus ``weight_param``), per task: the rules'
latest point over the best random program, with the weight pre-packed as builds pass it
(``weights: "as-built"``) and, where the store also holds them, with the plain weight (the records
from before 2026-12-03); geometric means. Only tasks with >= 8 random programs in a setting count.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tlmpack.training.store import WEIGHTS_AS_BUILT, Store, default_root  # noqa: E402

MIN_RANDOM = 8


def _geomean(values: list[float]) -> float | None:
    return round(math.exp(sum(map(math.log, values)) / len(values)), 3) if values else None


def latencies(store: Store, threads: int) -> dict[str, dict[str, dict[str, list[float]]]]:
    """setting ("as-built" | "plain") -> task -> {"rules": [...], "random": [...]} (min_us, in store order)."""
    packs = store.weight_params()
    out: dict[str, dict[str, dict[str, list[float]]]] = {"as-built": {}, "plain": {}}
    for r in store.records("x86"):
        if (not r.get("valid") or r["task"] not in packs or r["hardware"].get("cores") != threads
                or r.get("rule") == "re-measured" or r.get("chosen_by") not in ("heuristic", "random")):
            continue
        setting = "as-built" if r.get("weights") == WEIGHTS_AS_BUILT else "plain"
        who = "rules" if r["chosen_by"] == "heuristic" else "random"
        out[setting].setdefault(r["task"], {}).setdefault(who, []).append(r["min_us"])
    return out


def _counted(tasks: dict[str, dict[str, list[float]]]) -> set[str]:
    return {k for k, v in tasks.items() if v.get("rules") and len(v.get("random", ())) >= MIN_RANDOM}


def summary(store: Store, threads: int) -> dict:
    data = latencies(store, threads)
    built, plain = data["as-built"], data["plain"]
    ratios = {k: built[k]["rules"][-1] / min(built[k]["random"]) for k in _counted(built)}
    both = sorted(_counted(built) & _counted(plain))
    return {
        "threads": threads,
        "as_built": {"tasks": len(ratios), "rules_over_best_random": _geomean(list(ratios.values())),
                     "rules_beat_every_random": sum(x <= 1 for x in ratios.values()),
                     "median_random_over_best": _geomean([sorted(built[k]["random"])[len(built[k]["random"]) // 2]
                                                          / min(built[k]["random"]) for k in ratios])},
        "both_settings": {
            "tasks": len(both),
            "plain_rules_over_best_random": _geomean([plain[k]["rules"][-1] / min(plain[k]["random"]) for k in both]),
            "as_built_rules_over_best_random": _geomean([ratios[k] for k in both]),
            "rules_plain_over_as_built": _geomean([plain[k]["rules"][-1] / built[k]["rules"][-1] for k in both]),
            "best_random_plain_over_as_built": _geomean([min(plain[k]["random"]) / min(built[k]["random"])
                                                         for k in both])},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    result = summary(Store(args.data or default_root()), args.threads)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
