#!/usr/bin/env python
"""How much of a CUDA search pass's headroom the TLM's own candidates hold (the CUDA twin of tlm_sample_oracle.py).

    python bench/cuda_sample_oracle.py BATCH_DIR RESULTS

BATCH_DIR is a `tlmpack tlm measure --target cuda --samples N --random M ...` batch, RESULTS its
bench/gpu_measure_programs.py run. Per held-out task whose space holds >= 8 programs, against the rules' point
of the same pass: the model's greedy pick, the fastest of its greedy pick and samples (an oracle over its
candidates) and the fastest program of the pass (the best known); geometric means, and which source the
fastest program came from.
"""

from __future__ import annotations

import argparse
import collections
import math
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("batch_dir")
    ap.add_argument("results")
    args = ap.parse_args()

    from tlmpack.training.compare import space_size
    from tlmpack.training.cuda_programs import read_json, records_from_results
    from tlmpack.training.dataset import latency
    from tlmpack.training.sites import load_sites
    from tlmpack.training.store import Store, default_root

    results = read_json(Path(args.results))
    records = [r for batch in sorted(Path(args.batch_dir).glob("*batch.json.gz"))
               for r in records_from_results(read_json(batch), results) if r.get("valid")]
    sites = load_sites(Store(default_root()), "cuda")
    by_task: dict[str, list[dict]] = collections.defaultdict(list)
    for r in records:
        by_task[r["task"]].append(r)
    picks: dict[str, list[float]] = collections.defaultdict(list)
    fastest_from: collections.Counter = collections.Counter()
    for key, rs in sorted(by_task.items()):
        if space_size(sites.get(key, [])) < 8:
            continue
        fastest_from[min(rs, key=latency)["chosen_by"]] += 1
        rules = [latency(r) for r in rs if r["chosen_by"] == "heuristic" and r.get("rule") not in ("re-measured", "neighbour")]
        greedy = [latency(r) for r in rs if r["chosen_by"] == "tlm" and r.get("rule") == "greedy"]
        candidates = [latency(r) for r in rs if r["chosen_by"] == "tlm" and r.get("rule") in ("greedy", "top-k")]
        if not rules or not greedy:
            continue
        picks["greedy"].append(rules[0] / greedy[0])
        picks["fastest of the model's candidates (oracle)"].append(rules[0] / min(candidates))
        picks["best known (the whole pass)"].append(rules[0] / min(latency(r) for r in rs))
    print("| pick | tasks | speed-up over the rules (geometric mean) |")
    print("|---|---:|---:|")
    for name, values in picks.items():
        print(f"| {name} | {len(values)} | {math.exp(sum(map(math.log, values)) / len(values)):.3f} |")
    print("fastest program from:", dict(fastest_from.most_common()))


if __name__ == "__main__":
    main()
