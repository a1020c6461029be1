"""Trains the cost model a ``--scheduler ranked`` build ranks candidates with (tlm/cost_model.py).

MetaSchedule's recipe on our store: PerStoreFeature of every measured program of the training tasks
(held-out tasks never read), an MLP per store summed over the stores, a listwise loss within each
measured group (softmax cross-entropy against exp(-beta ln(latency / best)), so latencies of two
machines or timers are never compared), an ensemble of seeds. CPU, deterministic for a seed.

    tlmpack tlm cost-model --target cuda --out tlmpack/tlm/weights/cuda-cost.safetensors
"""

from __future__ import annotations

import hashlib
import json
import math
import multiprocessing
import pickle
import random
import zlib
from pathlib import Path

import numpy as np

from ..tlm.cost_model import FEATURES, CostModel
from .store import Store

Group = tuple[str, list[np.ndarray], np.ndarray]  # task, its programs' features, ln(latency)


def program_key(sketch: int, decisions: list) -> str:
    return json.dumps([sketch, decisions])


def _features_of_tasks(args: tuple[list[tuple[str, list[str]]], str, str]) -> dict[str, dict[str, np.ndarray]]:
    """Per-store features of each (task, program keys), replayed on ``target`` (x86: this host's)."""
    jobs, root, target = args
    from ..schedule.records import Decision
    from ..schedule.space import DesignSpace
    from ..tlm.cost_model import program_features
    from .candidates import _task_hardware
    from .corpus import load_func
    from .sample import replay_point

    store = Store(root)
    tvm_target, _ = _task_hardware(target, 1)
    out: dict[str, dict[str, np.ndarray]] = {}
    for key, programs in jobs:
        space = DesignSpace(load_func(store.task(key)), tvm_target)
        feats = out.setdefault(key, {})
        for pk in programs:
            sketch, decisions = json.loads(pk)
            if sketch >= len(space.sketches):
                continue
            point = replay_point(space, sketch, tuple(Decision.from_json(d) for d in decisions))
            if point is not None:  # else a record of an older space
                feats[pk] = program_features(space, point.func)
    return out


def features(wanted: dict[str, set[str]], root: str, target: str, cache: Path | None,
             jobs: int) -> dict[str, dict[str, np.ndarray]]:
    """Features of every wanted program (task -> program keys), from ``cache`` where computed before."""
    have: dict[str, dict[str, np.ndarray]] = pickle.loads(cache.read_bytes()) if cache and cache.is_file() else {}
    missing = [(k, sorted(p - set(have.get(k, {})))) for k, p in sorted(wanted.items())]
    missing = [(k, p) for k, p in missing if p]
    if missing:
        shards = [[m for m in missing if zlib.crc32(m[0].encode()) % jobs == i] for i in range(jobs)]
        with multiprocessing.Pool(jobs) as pool:
            for part in pool.map(_features_of_tasks, [(s, root, target) for s in shards]):
                for k, f in part.items():
                    have.setdefault(k, {}).update(f)
        if cache:
            cache.write_bytes(pickle.dumps(have))
    return have


def training_groups(store: Store, target: str, cache: Path | None = None, jobs: int = 2,
                    extra: dict[str, set[str]] | None = None, max_tasks: int = 0,
                    vector_bits: int | None = None) -> tuple[list[Group], dict]:
    """The measured groups of the training tasks with >= 4 distinct programs and some spread, and
    the features (of those and of ``extra`` programs: task -> program keys, e.g. a held-out pass);
    ``max_tasks`` > 0: only the groups of that many tasks (the first keys in order: a smoke run);
    ``vector_bits``: only groups measured on machines with that vector width (x86: 256 or 512)."""
    from .dataset import _groups, heldout_keys, latency

    groups_in = {gk: recs for gk, recs in _groups(store, target, heldout_keys(store, target)).items()
                 if len(recs) >= 4 and (vector_bits is None or recs[0]["hardware"].get("vector_bits") == vector_bits)}
    if max_tasks > 0:
        kept = set(sorted({gk[0] for gk in groups_in})[:max_tasks])
        groups_in = {gk: recs for gk, recs in groups_in.items() if gk[0] in kept}
    wanted: dict[str, set[str]] = {k: set(v) for k, v in (extra or {}).items()}
    for recs in groups_in.values():
        for r in recs:
            wanted.setdefault(r["task"], set()).add(program_key(r["sketch"], r["decisions"]))
    feats = features(wanted, str(store.root), target, cache, jobs)
    groups: list[Group] = []
    for gk, recs in sorted(groups_in.items()):
        best: dict[str, float] = {}
        for r in recs:
            pk = program_key(r["sketch"], r["decisions"])
            if pk in feats.get(gk[0], {}):
                best[pk] = min(best.get(pk, math.inf), latency(r))
        ll = np.log([best[p] for p in sorted(best)])
        if len(best) >= 4 and ll.max() - ll.min() >= 0.02:
            groups.append((gk[0], [feats[gk[0]][p] for p in sorted(best)], ll))
    return groups, feats


def _summed_scores(net, programs: list[np.ndarray], mean: np.ndarray, std: np.ndarray):
    import torch

    x = torch.tensor((np.concatenate(programs) - mean) / std, dtype=torch.float32)
    seg = torch.tensor(np.repeat(np.arange(len(programs)), [len(p) for p in programs]))
    return torch.zeros(len(programs)).index_add_(0, seg, net(x).squeeze(-1))


def train(groups: list[Group], seeds: int = 5, epochs: int = 200, beta: float = 3.0, hidden: int = 256,
          target: str = "") -> CostModel:
    """An ensemble of ``seeds`` per-store MLPs (two hidden layers), 16 groups a step, up to 48 programs a group."""
    import torch

    torch.set_num_threads(2)
    stacked = np.concatenate([f for _, fs, _ in groups for f in fs])
    mean, std = stacked.mean(0), stacked.std(0) + 1e-3
    data = [(fs, torch.tensor(ll, dtype=torch.float32)) for _, fs, ll in groups]
    nets = []
    for seed in range(seeds):
        torch.manual_seed(seed)
        rng = random.Random(seed)
        net = torch.nn.Sequential(torch.nn.Linear(stacked.shape[1], hidden), torch.nn.ReLU(),
                                  torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
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
                scores = _summed_scores(net, programs, mean, std)
                loss, off = 0.0, 0
                for n, tgt in zip(sizes, targets, strict=True):
                    loss = loss - (tgt * torch.log_softmax(scores[off:off + n], 0)).sum()
                    off += n
                opt.zero_grad()
                (loss / len(sizes)).backward()
                opt.step()
        layers = [m for m in net if isinstance(m, torch.nn.Linear)]
        nets.append(tuple((m.weight.detach().numpy().astype(np.float64), m.bias.detach().numpy().astype(np.float64))
                          for m in layers))
    return CostModel(tuple(nets), mean.astype(np.float64), std.astype(np.float64), target)


def data_sha256(groups: list[Group]) -> str:
    """What the model was trained on: each group's task and latencies, in order."""
    h = hashlib.sha256()
    for key, _, ll in groups:
        h.update(key.encode())
        h.update(np.round(ll, 6).tobytes())
    return h.hexdigest()


def train_and_save(store: Store, target: str, out: Path, seeds: int = 5, epochs: int = 200, beta: float = 3.0,
                   cache: Path | None = None, jobs: int = 2, say=print, max_tasks: int = 0) -> str:
    """`tlmpack tlm cost-model`: features, groups, training, the weights file; returns its sha256."""
    from ..tlm.cost_model import save

    groups, _ = training_groups(store, target, cache, jobs, max_tasks=max_tasks)
    if not groups:
        raise ValueError(f"no measured {target} training groups with >= 4 programs in {store.root}")
    say(f"{len(groups)} groups, {sum(len(g[1]) for g in groups)} programs; training {seeds} seeds x {epochs} epochs")
    model = train(groups, seeds, epochs, beta, target=target)
    summary = {"groups": len(groups), "programs": sum(len(g[1]) for g in groups), "seeds": seeds, "epochs": epochs,
               "beta": beta, "data": data_sha256(groups), "features": FEATURES}
    return save(model, out, summary)
