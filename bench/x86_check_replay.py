#!/usr/bin/env python
"""What the build's x86 register check makes of the TLM's greedy picks already measured: per stored
`tlmpack tlm measure` pass, the greedy pick over the rules' pick of the same pass (geometric mean over
its matmul-like tasks), raw, with the accumulator bounds and row cap only, and with the build's whole
check (schedule/x86_registers.register_tile_problem: also the vector-fill rule). A pick the check refuses counts
as the rules' (the build's fallback), so each column is what a build would have run.

    python bench/x86_check_replay.py [RUN.jsonl.gz ...] [--json OUT]

Without files: every pass under data/records/x86/ that measured both picks on at least 3 such tasks.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tlmpack.schedule.records import Decision  # noqa: E402
from tlmpack.schedule.x86_registers import register_tile_problem  # noqa: E402
from tlmpack.training.dataset import hardware_of, latency  # noqa: E402
from tlmpack.training.store import Store  # noqa: E402


def passes_checks(spatial: tuple[int, ...], record: dict) -> tuple[bool, bool]:
    """(keeps the accumulator bounds and row cap, also the vector-fill rule: what a build takes) for
    one measured point; register_tile_problem checks the vector fill last."""
    decisions = tuple(Decision.from_json(d) for d in record["decisions"])
    problem = register_tile_problem(hardware_of(record), spatial, decisions)
    return not problem or problem.startswith("vectorized loop"), not problem


def _picks(path: Path) -> dict[str, dict[str, dict]]:
    """task -> {"greedy": record, "rules": record} of one pass (the main model's greedy pick)."""
    out: dict[str, dict[str, dict]] = defaultdict(dict)
    with gzip.open(path, "rt") as f:
        for r in map(json.loads, f):
            if not r.get("valid") or latency(r) <= 0:
                continue
            if r.get("chosen_by") == "tlm" and r.get("rule") == "greedy":
                out[r["task"]]["greedy"] = r
            elif r.get("chosen_by") == "heuristic" and r.get("rule") != "re-measured":
                out[r["task"]].setdefault("rules", r)
    return out


def replay(path: Path, store: Store) -> dict | None:
    logs: dict[str, list[float]] = {"greedy": [], "checked": [], "checked_vector_fill": []}
    hosts = set()
    for key, pair in _picks(path).items():
        task = store.task(key)
        if len(pair) < 2 or task.get("kind") != "matmul":
            continue
        gain = math.log(latency(pair["rules"]) / latency(pair["greedy"]))
        bounded, filled = passes_checks(tuple(task["spatial"]), pair["greedy"])
        logs["greedy"].append(gain)
        logs["checked"].append(gain if bounded else 0.0)
        logs["checked_vector_fill"].append(gain if filled else 0.0)
        hosts.add(pair["greedy"]["hardware"].get("llvm_cpu"))
    if len(logs["greedy"]) < 3:
        return None
    row = {k: round(math.exp(sum(v) / len(v)), 3) for k, v in logs.items()}
    return {"run": path.name, "tasks": len(logs["greedy"]), "host": ",".join(sorted(map(str, hosts))), **row}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="*", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    store = Store(ROOT / "data")
    runs = args.runs or sorted((ROOT / "data" / "records" / "x86").glob("*.jsonl.gz"))
    rows = [row for path in runs if (row := replay(path, store))]
    print("| pass | host | tasks | greedy / rules | checked | checked + vector fill |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['run']} | {r['host']} | {r['tasks']} | {r['greedy']:.3f} | {r['checked']:.3f} "
              f"| {r['checked_vector_fill']:.3f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
