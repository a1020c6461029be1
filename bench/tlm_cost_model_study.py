#!/usr/bin/env python
"""Can a learned cost model pick among the TLM's own candidates better than its greedy decode, with no
measurement? (issue 12: an oracle over the model's 17 candidates holds 1.14-1.17x the rules, its greedy pick ~1.0x)

    python bench/tlm_cost_model_study.py RUN.jsonl.gz [--target x86|cuda] [--cache FILE] [--seeds 5] [--epochs 200]
        [--weights COST.safetensors]

The cost model is MetaSchedule's recipe: PerStoreFeature (164 numbers per buffer store of the scheduled
PrimFunc), an MLP per store, summed over the stores; trained with a listwise loss (softmax cross-entropy
against exp(-beta ln(latency / best)) within one measured group, so hosts never compare) on every x86
training group of the store (held-out tasks excluded), an ensemble over seeds. Reported:

- validation: 4-fold split of the training tasks (train on 3, score the 4th's programs): the picked
  program's speed against the group's best, and Spearman's rank correlation;
- held-out: RUN is a `tlmpack tlm measure --tasks heldout --samples 16` search pass (data/records/<target>/...);
  each held-out task whose space holds >= 8 programs is decoded again as that pass did (greedy + 16 samples,
  seed 37) and the cost model picks among the first k+1 candidates and the rules' point, against the rules
  (geometric mean). On CUDA the features are those of the GPU-bound PrimFunc; the training groups are the
  H200's, the held-out pass may be another card's (ranks, not latencies, carry over).
- what a `--scheduler ranked` build keeps: schedule/ranked.py's own candidates and pick, looked up in RUN
  (its seed is the pass's, so each candidate was measured there).

The cost model is training/cost_model.py's (what `tlmpack tlm cost-model` ships); `--weights` scores with a
trained file instead of training here.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import random
import time
from pathlib import Path

import numpy as np

from tlmpack.training.cost_model import program_key, train, training_groups


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def validation(groups, seeds: int, epochs: int, beta: float) -> dict:
    tasks = sorted({g[0] for g in groups})
    random.Random(0).shuffle(tasks)
    picks, spearman = [], []
    for fold in range(4):
        val = set(tasks[fold::4])
        model = train([g for g in groups if g[0] not in val], seeds, epochs, beta)
        for _, fs, ll in (g for g in groups if g[0] in val):
            s = model.score(fs)
            picks.append(math.exp(ll.min() - ll[int(np.argmax(s))]))
            spearman.append(float(np.corrcoef(np.argsort(np.argsort(-s)), np.argsort(np.argsort(ll)))[0, 1]))
    return {"groups": len(picks), "pick_over_best": geomean(picks), "spearman": float(np.mean(spearman))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run")
    ap.add_argument("--target", choices=["x86", "cuda"], default="x86")
    ap.add_argument("--cache", help="features computed before (default: a file per target under /tmp)")
    ap.add_argument("--weights", help="score with this trained cost model instead of training one here")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--beta", type=float, default=3.0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--vector-bits", type=int, help="train only on groups measured with this vector width (x86)")
    ap.add_argument("--no-validation", action="store_true")
    ap.add_argument("--no-grid-floor", action="store_true", help="rank CUDA candidates under the grid floor too")
    args = ap.parse_args()

    from tlmpack.schedule.ranked import candidates as ranked_candidates
    from tlmpack.schedule.select import hint_for, schedule_with_rules
    from tlmpack.schedule.space import DesignSpace
    from tlmpack.tlm.cost_model import load_file as load_cost_model
    from tlmpack.tlm.cost_model import program_features
    from tlmpack.tlm.decode import decode_space
    from tlmpack.tlm.model import load_file, weights_path
    from tlmpack.training.candidates import _task_hardware
    from tlmpack.training.compare import space_size
    from tlmpack.training.corpus import load_func
    from tlmpack.training.dataset import CHANNELS_LAST_CONV_BLOCK, heldout_keys, latency, task_info
    from tlmpack.training.sites import load_sites
    from tlmpack.training.store import Store, default_root

    started = time.time()
    store = Store(default_root())
    target = args.target
    cache = Path(args.cache or ("/tmp/tlm_cost_model_features.pkl" if target == "x86"
                                else f"/tmp/tlm_cost_model_features_{target}.pkl"))
    run = [r for r in store.shard(args.run) if r.get("valid")]
    extra: dict[str, set[str]] = collections.defaultdict(set)
    for r in run:
        extra[r["task"]].add(program_key(r["sketch"], r["decisions"]))
    groups, feats = training_groups(store, target, cache, args.jobs, extra, vector_bits=args.vector_bits)
    print(f"features: {sum(len(v) for v in feats.values())} programs, {time.time() - started:.0f} s", flush=True)
    print(f"training groups: {len(groups)}, programs: {sum(len(g[1]) for g in groups)}", flush=True)
    if not args.no_validation:
        print("validation (4 folds over the training tasks):",
              json.dumps(validation(groups, args.seeds, args.epochs, args.beta)), flush=True)

    model = (load_cost_model(Path(args.weights), target) if args.weights
             else train(groups, args.seeds, args.epochs, args.beta, target=target))
    lat: dict[tuple[str, str], float] = {}
    rules: dict[str, str] = {}
    source: dict[tuple[str, str], str] = {}  # (task, program) -> the pass's source: tlm, random, neighbour, ...
    for r in run:
        pk = program_key(r["sketch"], r["decisions"])
        source.setdefault((r["task"], pk), {"neighbour": "neighbour", "re-measured": "stored"}.get(r.get("rule", ""),
                                                                                                 r["chosen_by"]))
        lat[(r["task"], pk)] = min(lat.get((r["task"], pk), math.inf), latency(r))
        if r["chosen_by"] == "heuristic" and r.get("rule") not in ("neighbour", "re-measured"):
            rules.setdefault(r["task"], pk)
    tlm = load_file(weights_path(target), target)
    tvm_target, hardware = _task_hardware(target, 1)
    sites = load_sites(store, target)
    rows: dict[str, list[float]] = collections.defaultdict(list)
    unmeasured = 0
    for key in sorted(heldout_keys(store, target, evaluation=True)):
        if key not in rules or space_size(sites.get(key, [])) < 8:
            continue
        task = store.task(key)
        func = load_func(task)
        channels_last = target == "x86" and CHANNELS_LAST_CONV_BLOCK.search(task["script"]) is not None
        decoded = decode_space(tlm, DesignSpace(func, tvm_target, seed=37), hardware, task_info(task), samples=16,
                               seed=37, hint=hint_for(tlm, func, tvm_target, target, hardware))
        order = [program_key(d.sketch, [x.to_json() for x in d.decisions]) for d in decoded]
        timed = [p for p in order if (key, p) in lat and p in feats[key]]
        if not timed or timed[0] != order[0]:
            continue
        base = lat[(key, rules[key])]
        rows["greedy"].append(base / lat[(key, order[0])])
        rows["best known (the whole pass)"].append(base / min(v for (t, _), v in lat.items() if t == key))
        for k in (0, 2, 4, 8, 16):
            pool = [p for p in order[:k + 1] if p in timed] + [rules[key]]
            pick = pool[int(np.argmax(model.score([feats[key][p] for p in pool])))]
            rows[f"cost model, greedy + {k} samples + rules"].append(base / lat[(key, pick)])
            if target == "x86":
                rows[f"  the same, channels-last convolutions to the rules (as builds)"
                     f" k={k}"].append(1.0 if channels_last else base / lat[(key, pick)])
            rows[f"oracle, greedy + {k} samples + rules"].append(base / min(lat[(key, p)] for p in pool))
        # wider pools a build could also write without measuring: the rules' point's edits, random programs
        every = [p for (t, p) in lat if t == key and p in feats[key]]
        for name, keep in (("the rules' point and its edits", {"heuristic", "neighbour"}),
                           ("greedy + 16 samples + the rules' point and its edits", {"tlm", "heuristic", "neighbour"}),
                           ("greedy + 16 samples + the rules' point, its edits and the random programs",
                            {"tlm", "heuristic", "neighbour", "random"}),
                           ("every program of the pass", None)):
            pool = [p for p in every if keep is None or source[(key, p)] in keep] + [rules[key]]
            pick = pool[int(np.argmax(model.score([feats[key][p] for p in pool])))]
            rows[f"cost model over {name}"].append(base / lat[(key, pick)])
            rows[f"oracle over {name}"].append(base / min(lat[(key, p)] for p in pool))
        # what a --scheduler ranked build keeps (its own candidates, grid floor applied)
        rules_choice = schedule_with_rules(func, tvm_target, target, hardware)
        found, space = ranked_candidates(func, tvm_target, target, hardware, task["name"], rules=rules_choice,
                                  grid_floor=False if args.no_grid_floor else None)
        keys = [program_key(c.sketch, [x.to_json() for x in c.decisions]) for c in found]
        scores = model.score([program_features(space, c.func) for c in found])
        pick = keys[int(np.argmax(scores))]
        if (key, pick) not in lat:
            unmeasured += 1
            continue
        rows["a --scheduler ranked build's pick"].append(base / lat[(key, pick)])
        for margin in (0.05, 0.1, 0.2, 0.4):  # keep the rules' point unless another is predicted this much faster (ln)
            kept = pick if scores.max() - scores[0] > margin * args.beta else keys[0]
            rows[f"  the same, the rules' point kept unless another is predicted exp({margin}) times faster"].append(
                base / lat[(key, kept)] if (key, kept) in lat else base / lat[(key, pick)])
        rows["oracle over a ranked build's candidates"].append(
            base / min(lat[(key, p)] for p in keys if (key, p) in lat))
    print("| pick (held-out tasks) | tasks | speed-up over the rules (geometric mean) |")
    print("|---|---:|---:|")
    for name, values in rows.items():
        print(f"| {name} | {len(values)} | {geomean(values):.3f} |")
    if unmeasured:
        print(f"{unmeasured} ranked picks were not measured in RUN (left out of that row)")
    print(f"{time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
