#!/usr/bin/env python
"""Can a learned cost model pick among the TLM's own candidates better than its greedy decode, with no
measurement? (issue 12: an oracle over the model's 17 candidates holds 1.14-1.17x the rules, its greedy pick ~1.0x)

    python bench/tlm_cost_model_study.py RUN.jsonl.gz [--cache DIR] [--seeds 5] [--epochs 200] [--jobs 2]

The cost model is MetaSchedule's recipe: PerStoreFeature (164 numbers per buffer store of the scheduled
PrimFunc), an MLP per store, summed over the stores; trained with a listwise loss (softmax cross-entropy
against exp(-beta ln(latency / best)) within one measured group, so hosts never compare) on every x86
training group of the store (held-out tasks excluded), an ensemble over seeds. Reported:

- validation: 4-fold split of the training tasks (train on 3, score the 4th's programs): the picked
  program's speed against the group's best, and Spearman's rank correlation;
- held-out: RUN is a `tlmpack tlm measure --tasks heldout --samples 16` search pass (data/records/x86/...);
  each held-out task is decoded again as that pass did (greedy + 16 samples, seed 37) and the cost model
  picks among the first k+1 candidates and the rules' point, against the rules (geometric mean).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import math
import multiprocessing
import pickle
import random
import time
import zlib
from pathlib import Path

import numpy as np


def program_key(sketch: int, decisions: list) -> str:
    return json.dumps([sketch, decisions])


def _features_of_tasks(args: tuple[list[tuple[str, list[str]]], str]) -> dict[str, dict[str, np.ndarray]]:
    """Per-store features of each (task, program keys), replayed on this host's x86 target."""
    jobs, root = args
    import tvm
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms

    from tlmpack.schedule.records import Decision
    from tlmpack.schedule.space import DesignSpace
    from tlmpack.training.candidates import _task_hardware
    from tlmpack.training.corpus import load_func
    from tlmpack.training.sample import replay_point
    from tlmpack.training.store import Store

    store = Store(root)
    tvm_target, _ = _task_hardware("x86", 1)
    extractor = ms.feature_extractor.PerStoreFeature(extract_workload=False)
    out: dict[str, dict[str, np.ndarray]] = {}
    for key, programs in jobs:
        func = load_func(store.task(key))
        space = DesignSpace(func, tvm_target)
        feats = out.setdefault(key, {})
        for pk in programs:
            sketch, decisions = json.loads(pk)
            if sketch >= len(space.sketches):
                continue
            point = replay_point(space, sketch, tuple(Decision.from_json(d) for d in decisions))
            if point is None:  # a record of an older space
                continue
            candidate = ms.MeasureCandidate(Schedule(tvm.IRModule({"main": point.func})),
                                            ms.arg_info.ArgInfo.from_prim_func(point.func))
            feats[pk] = extractor.extract_from(space.context, [candidate])[0].numpy().astype(np.float32)
    return out


def features(wanted: dict[str, set[str]], root: str, cache: Path, jobs: int) -> dict[str, dict[str, np.ndarray]]:
    """Features of every wanted program, from ``cache`` where computed before."""
    have: dict[str, dict[str, np.ndarray]] = pickle.loads(cache.read_bytes()) if cache.is_file() else {}
    missing = [(k, sorted(p - set(have.get(k, {})))) for k, p in sorted(wanted.items())]
    missing = [(k, p) for k, p in missing if p]
    if missing:
        shards = [[m for m in missing if zlib.crc32(m[0].encode()) % jobs == i] for i in range(jobs)]
        with multiprocessing.Pool(jobs) as pool:
            for part in pool.map(_features_of_tasks, [(s, root) for s in shards]):
                for k, f in part.items():
                    have.setdefault(k, {}).update(f)
        cache.write_bytes(pickle.dumps(have))
    return have


def summed_scores(net, programs: list[np.ndarray], mean: np.ndarray, std: np.ndarray):
    """One score per program: ``net`` over each of its stores (standardised features), summed."""
    import torch

    x = torch.tensor((np.concatenate(programs) - mean) / std)
    seg = torch.tensor(np.repeat(np.arange(len(programs)), [len(p) for p in programs]))
    return torch.zeros(len(programs)).index_add_(0, seg, net(x).squeeze(-1))


class CostModel:
    """An ensemble of per-store MLPs (summed over stores), inputs standardised over the training programs."""

    def __init__(self, nets: list, mean: np.ndarray, std: np.ndarray) -> None:
        self.nets, self.mean, self.std = nets, mean, std

    def score(self, programs: list[np.ndarray]) -> np.ndarray:
        """Higher: predicted faster (comparable only within one task)."""
        import torch

        with torch.no_grad():
            return torch.stack([summed_scores(net, programs, self.mean, self.std) for net in self.nets]).mean(0).numpy()


def train(groups: list[tuple[str, list[np.ndarray], np.ndarray]], seeds: int, epochs: int, beta: float) -> CostModel:
    import torch

    torch.set_num_threads(2)
    stacked = np.concatenate([f for _, fs, _ in groups for f in fs])
    mean, std = stacked.mean(0), stacked.std(0) + 1e-3
    data = [(fs, torch.tensor(ll, dtype=torch.float32)) for _, fs, ll in groups]
    nets = []
    for seed in range(seeds):
        torch.manual_seed(seed)
        rng = random.Random(seed)
        net = torch.nn.Sequential(torch.nn.Linear(stacked.shape[1], 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                  torch.nn.ReLU(), torch.nn.Linear(256, 1))
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=1e-4)
        for _ in range(epochs):
            order = list(range(len(data)))
            rng.shuffle(order)
            for i in range(0, len(order), 16):
                programs, sizes, targets = [], [], []
                for j in order[i:i + 16]:
                    fs, ll = data[j]
                    pick = rng.sample(range(len(fs)), min(48, len(fs)))
                    programs += [fs[k] for k in pick]
                    sizes.append(len(pick))
                    targets.append(torch.softmax(-beta * (ll[pick] - ll[pick].min()), 0))
                scores = summed_scores(net, programs, mean, std)
                loss, off = 0.0, 0
                for n, target in zip(sizes, targets, strict=True):
                    loss = loss - (target * torch.log_softmax(scores[off:off + n], 0)).sum()
                    off += n
                opt.zero_grad()
                (loss / len(sizes)).backward()
                opt.step()
        nets.append(net.eval())
    return CostModel(nets, mean, std)


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
    ap.add_argument("--cache", default="/tmp/tlm_cost_model_features.pkl")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--beta", type=float, default=3.0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--no-validation", action="store_true")
    args = ap.parse_args()

    from tlmpack.schedule.select import hint_for
    from tlmpack.schedule.space import DesignSpace
    from tlmpack.tlm.decode import decode_space
    from tlmpack.tlm.model import load_file, weights_path
    from tlmpack.training.candidates import _task_hardware
    from tlmpack.training.corpus import load_func
    from tlmpack.training.dataset import CHANNELS_LAST_CONV_BLOCK, _groups, heldout_keys, latency, task_info
    from tlmpack.training.store import Store, default_root

    started = time.time()
    store = Store(default_root())
    train_groups = {gk: recs for gk, recs in _groups(store, "x86", heldout_keys(store, "x86")).items() if len(recs) >= 4}
    run = [r for r in map(json.loads, gzip.open(args.run, "rt")) if r.get("valid")]
    wanted: dict[str, set[str]] = collections.defaultdict(set)
    for recs in [*train_groups.values(), run]:
        for r in recs:
            wanted[r["task"]].add(program_key(r["sketch"], r["decisions"]))
    feats = features(wanted, str(store.root), Path(args.cache), args.jobs)
    print(f"features: {sum(len(v) for v in feats.values())} programs, {time.time() - started:.0f} s", flush=True)

    groups = []
    for gk, recs in sorted(train_groups.items()):
        best: dict[str, float] = {}
        for r in recs:
            pk = program_key(r["sketch"], r["decisions"])
            if pk in feats.get(gk[0], {}):
                best[pk] = min(best.get(pk, math.inf), latency(r))
        ll = np.log([best[p] for p in sorted(best)])
        if len(best) >= 4 and ll.max() - ll.min() >= 0.02:
            groups.append((gk[0], [feats[gk[0]][p] for p in sorted(best)], ll))
    print(f"training groups: {len(groups)}, programs: {sum(len(g[1]) for g in groups)}", flush=True)
    if not args.no_validation:
        print("validation (4 folds over the training tasks):",
              json.dumps(validation(groups, args.seeds, args.epochs, args.beta)), flush=True)

    model = train(groups, args.seeds, args.epochs, args.beta)
    lat: dict[tuple[str, str], float] = {}
    rules: dict[str, str] = {}
    for r in run:
        pk = program_key(r["sketch"], r["decisions"])
        lat[(r["task"], pk)] = min(lat.get((r["task"], pk), math.inf), r["min_us"])
        if r["chosen_by"] == "heuristic" and r.get("rule") != "neighbour":
            rules.setdefault(r["task"], pk)
    tlm = load_file(weights_path("x86"), "x86")
    tvm_target, hardware = _task_hardware("x86", 1)
    rows: dict[str, list[float]] = collections.defaultdict(list)
    for key in sorted(heldout_keys(store, "x86", evaluation=True)):
        if key not in rules:
            continue
        task = store.task(key)
        func = load_func(task)
        channels_last = CHANNELS_LAST_CONV_BLOCK.search(task["script"]) is not None
        decoded = decode_space(tlm, DesignSpace(func, tvm_target, seed=37), hardware, task_info(task), samples=16,
                               seed=37, hint=hint_for(tlm, func, tvm_target, "x86", hardware))
        order = [program_key(d.sketch, [x.to_json() for x in d.decisions]) for d in decoded]
        timed = [p for p in order if (key, p) in lat and p in feats[key]]
        if not timed or timed[0] != order[0]:
            continue
        base = lat[(key, rules[key])]
        rows["greedy"].append(base / lat[(key, order[0])])
        for k in (0, 2, 4, 8, 16):
            pool = [p for p in order[:k + 1] if p in timed] + [rules[key]]
            pick = pool[int(np.argmax(model.score([feats[key][p] for p in pool])))]
            rows[f"cost model, greedy + {k} samples + rules"].append(base / lat[(key, pick)])
            rows[f"  the same, channels-last convolutions to the rules (as builds)"
                 f" k={k}"].append(1.0 if channels_last else base / lat[(key, pick)])
            rows[f"oracle, greedy + {k} samples + rules"].append(base / min(lat[(key, p)] for p in pool))
    print("| pick (held-out tasks) | tasks | speed-up over the rules (geometric mean) |")
    print("|---|---:|---:|")
    for name, values in rows.items():
        print(f"| {name} | {len(values)} | {geomean(values):.3f} |")
    print(f"{time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
