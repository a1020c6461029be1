#!/usr/bin/env python
"""Two CUDA TLMs on the held-out tasks, measured in one GPU run: each one's greedy pick against the
rules' and the best known of the same run (every program of both batches of a task).

    tlmpack tlm measure --target cuda --weights A.safetensors --out DIR/a --prefix a ...
    tlmpack tlm measure --target cuda --weights B.safetensors --out DIR/b --prefix b --random 0 --stored-best 0
    (GPU) python3 bench/gpu_measure_programs.py DIR/a DIR/b --out RESULTS
    python bench/cuda_tlm_ab.py a=DIR/a b=DIR/b RESULTS [--json OUT]

Each model's table is ``tlmpack tlm compare-cuda``'s (tlmpack.training.compare): the other model's
greedy pick counts as one more measured program, so "best known" is the same for both.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from tlmpack.training.cli import _store
from tlmpack.training.compare import compare
from tlmpack.training.cuda_programs import read_json, records_from_results
from tlmpack.training.dataset import heldout_keys
from tlmpack.training.sites import load_sites


def labelled_records(batches: dict[str, Path], results: dict) -> dict[str, list[dict]]:
    out = {}
    for label, folder in batches.items():
        out[label] = [r for path in sorted(folder.glob("*batch.json.gz"))
                      for r in records_from_results(read_json(path), results)]
    return out


def as_seen_by(label: str, records: dict[str, list[dict]]) -> list[dict]:
    """All records, with only ``label``'s greedy and rules' picks as the TLM's and the rules' (the
    other batches' count as further measured programs, so the best known is the same for all)."""
    out = []
    for other, rs in records.items():
        for r in rs:
            if other != label and r.get("chosen_by") == "tlm":
                r = {**r, "chosen_by": f"tlm:{other}"}
            elif other != label and r.get("chosen_by") == "heuristic":
                r = {**r, "rule": "re-measured"}
            out.append(r)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("batches", nargs="+", help="LABEL=BATCH_DIR ... then the results file")
    ap.add_argument("--json")
    args = ap.parse_args()
    *pairs, results_path = args.batches
    batches = {p.split("=", 1)[0]: Path(p.split("=", 1)[1]) for p in pairs}
    store = _store(None)
    held = heldout_keys(store, "cuda", evaluation=True)
    names = {t["key"]: t["name"] for entry in store.corpora() for t in entry["tasks"]}
    records = labelled_records(batches, read_json(results_path))
    records = {k: [r for r in rs if r["task"] in held] for k, rs in records.items()}
    sites = load_sites(store, "cuda")
    report = {label: compare(as_seen_by(label, records), sites, names) for label in batches}
    rows = {label: {r["task"]: r for r in rep["rows"] if r.get("tlm_us")} for label, rep in report.items()}
    labels = list(batches)
    print("| task | " + " | ".join(f"{x} µs" for x in labels) + " | rules µs | best µs |")
    print("|---" * (len(labels) + 3) + "|")
    for key in sorted(set().union(*(set(v) for v in rows.values())), key=lambda k: names.get(k, k)):
        any_row = next(rows[x][key] for x in labels if key in rows[x])
        cells = [f"{rows[x][key]['tlm_us']:.1f}" if key in rows[x] else "–" for x in labels]
        rules = f"{any_row['heuristic_us']:.1f}" if any_row.get("heuristic_us") else "–"
        print(f"| {names.get(key, key)} | " + " | ".join(cells) + f" | {rules} | {any_row['best_us']:.1f} |")
    print()
    for label in labels:
        for part in ("matters", "small_spaces"):
            print(f"{label} ({'space ≥ 8' if part == 'matters' else 'space < 8'}): {report[label][part]}")
    a, b = labels[0], labels[-1]
    both = [k for k in rows[a] if k in rows[b]]
    if len(labels) > 1 and both:
        g = math.exp(sum(math.log(rows[b][k]["tlm_us"] / rows[a][k]["tlm_us"]) for k in both) / len(both))
        print(f"\n{a} vs {b}: geometric-mean speed-up {g:.3f} over {len(both)} tasks")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
