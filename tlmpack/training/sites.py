"""The sampling sites of every stored task's sketches, per target, kept under data/sites/ so that
training can mask each decision position to its legal values without TVM.

A site list is the Space Builder's (``DesignSpace.sites(sketch, locations=True)``) replayed with
the sketch's own sampled decisions: tile extents and categorical candidates do not depend on the
earlier decisions; compute locations may, and are the sketch's own (good enough for a training
mask; decoding in a build asks the Space Builder at every site).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

from ..schedule.space import SamplingSite
from .store import Store

SITES_VERSION = 1


def site_to_json(site: SamplingSite) -> dict:
    out = {"kind": site.kind}
    if site.kind == "tile":
        out |= {"extent": site.extent, "parts": site.parts, "max_innermost": site.max_innermost}
    else:
        out["candidates"] = list(site.candidates)
    return out


def site_from_json(index: int, d: dict) -> SamplingSite:
    return SamplingSite(index, d["kind"], extent=d.get("extent", 0), parts=d.get("parts", 0),
                        max_innermost=d.get("max_innermost", 0), candidates=tuple(d.get("candidates", ())))


def sites_path(store: Store, target: str) -> Path:
    return store.root / "sites" / f"{target}.json.gz"


def load_sites(store: Store, target: str) -> dict[str, list[list[SamplingSite]]]:
    """task key -> per sketch, its sites in trace order ({} when none were computed)."""
    path = sites_path(store, target)
    if not path.is_file():
        return {}
    with gzip.open(path, "rt") as f:
        raw = json.load(f)
    return {key: [[site_from_json(i, s) for i, s in enumerate(sk)] for sk in sketches]
            for key, sketches in raw["tasks"].items()}


def _tvm_target(target: str):
    if target == "x86":
        from ..lower.x86 import x86_target

        return x86_target(num_cores=2).tvm_target()
    from .cuda_programs import cuda_tvm_target

    return cuda_tvm_target()


def stale_tasks(store: Store, target: str, cached: dict[str, list]) -> set[str]:
    """Tasks with a record on a sketch their cached sites lack: sketches appended to the space after
    the sites were computed (a convolution's implicit-GEMM sketches), so recomputing is needed."""
    return {r["task"] for r in store.records(target)
            if r["task"] in cached and r["sketch"] >= len(cached[r["task"]])}


def compute_sites(store: Store, target: str, keys: list[str] | None = None,
                  say: Callable[[str], None] = print) -> dict:
    """Computes (or completes) data/sites/<target>.json.gz for ``keys`` (default: every task)."""
    from ..schedule.space import DesignSpace
    from .corpus import load_func

    path = sites_path(store, target)
    raw = {"version": SITES_VERSION, "tasks": {}}
    if path.is_file():
        with gzip.open(path, "rt") as f:
            raw = json.load(f)
    tvm_target = _tvm_target(target)
    stale = stale_tasks(store, target, raw["tasks"])
    todo = [k for k in (keys or store.task_keys()) if k not in raw["tasks"] or k in stale]
    for i, key in enumerate(todo, 1):
        try:
            space = DesignSpace(load_func(store.task(key)), tvm_target)
            raw["tasks"][key] = [[site_to_json(s) for s in space.sites(sk, locations=True)]
                                 for sk in range(len(space.sketches))]
        except Exception as e:  # noqa: BLE001  (a task TVM cannot give a space for has no sites)
            say(f"{key}: no design space ({type(e).__name__}: {str(e)[:100]})")
            raw["tasks"][key] = []
        if i % 25 == 0 or i == len(todo):
            say(f"[{i}/{len(todo)}] sites for {target}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(path, "wb", mtime=0) as f:
        f.write(json.dumps(raw, sort_keys=True, separators=(",", ":")).encode())
    return {"tasks": len(raw["tasks"]), "computed": len(todo)}
