"""The cost model a ``--scheduler ranked`` build ranks a task's written candidates with, measuring nothing.

The TLM's greedy decode rarely beats the rules, yet its samples and the rules' one-step edits often
hold a much faster program (on the CUDA held-out tasks an oracle over them reaches 1.22x the rules).
Ranking them needs a judge that has seen many programs: MetaSchedule's recipe, trained offline on the
measured programs of the training tasks (training/cost_model.py). Per buffer store of the scheduled
PrimFunc, TVM's PerStoreFeature gives 164 numbers; an MLP scores each store and the scores are summed;
an ensemble of seeds is averaged. A score compares programs of one task only.

Weights: tlm/weights/<target>-cost.safetensors (package data). Inference is numpy in float64, so the
same candidates get the same order on any machine; the id is the file's sha256.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .model import WEIGHTS_DIR

FORMAT = "tlmpack-cost-model"
FEATURES = "PerStoreFeature/164"  # TVM's extractor, extract_workload off: what the weights read


class CostModelUnavailable(Exception):
    """No usable cost model for a target (missing file, other features): the build takes the rules."""


@dataclass(frozen=True)
class CostModel:
    """An ensemble of per-store MLPs: ``nets`` holds per seed the (weight [out, in], bias) of each layer,
    ReLU between layers; inputs standardised with ``mean`` / ``std`` of the training programs."""

    nets: tuple[tuple[tuple[np.ndarray, np.ndarray], ...], ...]
    mean: np.ndarray
    std: np.ndarray
    target: str = ""
    sha256: str = ""
    summary: dict | None = None

    @property
    def id(self) -> str:
        return f"cost-{self.target}-{self.sha256[:12]}"

    def to_json(self) -> dict:
        return {"id": self.id, "sha256": self.sha256, "features": FEATURES, "training": self.summary or {}}

    def score(self, programs: list[np.ndarray]) -> np.ndarray:
        """One score per program (rows: its stores' features); higher is predicted faster."""
        x = (np.concatenate(programs).astype(np.float64) - self.mean) / self.std
        owner = np.repeat(np.arange(len(programs)), [len(p) for p in programs])
        total = np.zeros(len(programs))
        for layers in self.nets:
            h = x
            for i, (w, b) in enumerate(layers):
                h = h @ w.T + b
                if i < len(layers) - 1:
                    h = np.maximum(h, 0.0)
            total += np.bincount(owner, weights=h[:, 0], minlength=len(programs))
        return total / len(self.nets)


def cost_model_path(target: str) -> Path:
    return WEIGHTS_DIR / f"{target}-cost.safetensors"


def to_tensors(model: CostModel) -> dict[str, np.ndarray]:
    """The safetensors layout: ``net{seed}.{layer}.weight|bias``, ``mean``, ``std`` (float32)."""
    out = {"mean": model.mean.astype(np.float32), "std": model.std.astype(np.float32)}
    for s, layers in enumerate(model.nets):
        for i, (w, b) in enumerate(layers):
            out[f"net{s}.{i}.weight"], out[f"net{s}.{i}.bias"] = w.astype(np.float32), b.astype(np.float32)
    return out


def save(model: CostModel, path: Path, summary: dict) -> str:
    """Writes the weights with what they read and how they were trained; returns the sha256."""
    from safetensors.numpy import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    meta = {"format": FORMAT, "features": FEATURES, "target": model.target,
            "summary": json.dumps(summary, sort_keys=True)}
    save_file(dict(sorted(to_tensors(model).items())), str(tmp), metadata=meta)
    tmp.chmod(0o644)  # package data: readable by every user of an installed package
    tmp.replace(path)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_file(path: Path, target: str) -> CostModel:
    """Loads one weights file with numpy alone; CostModelUnavailable when missing or of other features."""
    from safetensors import safe_open
    from safetensors.numpy import load as load_bytes

    if not path.is_file():
        raise CostModelUnavailable(f"no cost model for {target} ({path.name} is not installed)")
    data = path.read_bytes()
    with safe_open(str(path), "np") as f:
        meta = f.metadata() or {}
    if meta.get("format") != FORMAT or meta.get("features") != FEATURES:
        raise CostModelUnavailable(f"{path.name} is not a cost model over {FEATURES}")
    tensors = load_bytes(data)
    nets = []
    for s in range(len({k.split(".")[0] for k in tensors if k.startswith("net")})):
        depth = len([k for k in tensors if k.startswith(f"net{s}.") and k.endswith(".weight")])
        nets.append(tuple((tensors[f"net{s}.{i}.weight"].astype(np.float64), tensors[f"net{s}.{i}.bias"].astype(np.float64))
                          for i in range(depth)))
    return CostModel(tuple(nets), tensors["mean"].astype(np.float64), tensors["std"].astype(np.float64), target,
                     hashlib.sha256(data).hexdigest(), json.loads(meta.get("summary", "{}")))


@functools.lru_cache(maxsize=4)
def load(target: str, path: str | None = None) -> CostModel:
    """The shipped cost model of ``target`` (or the file at ``path``), loaded once per process."""
    return load_file(Path(path) if path else cost_model_path(target), target)


def program_features(space: Any, func: Any) -> np.ndarray:
    """PerStoreFeature of one scheduled PrimFunc of ``space`` (schedule.space.DesignSpace): [stores, 164]."""
    import tvm
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms

    candidate = ms.MeasureCandidate(Schedule(tvm.IRModule({"main": func})), ms.arg_info.ArgInfo.from_prim_func(func))
    return _extractor().extract_from(space.context, [candidate])[0].numpy().astype(np.float32)


@functools.lru_cache(maxsize=1)
def _extractor():
    from tvm.s_tir import meta_schedule as ms

    return ms.feature_extractor.PerStoreFeature(extract_workload=False)
