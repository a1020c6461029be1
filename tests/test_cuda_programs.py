"""CUDA dataset programs: a tiny batch is generated, its shard compiles with nvcc (when present), and
results of a (simulated) GPU run import into a store as cuda records."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tlmpack.training import cuda_programs as cp
from tlmpack.training.store import Store, default_root

REPO = Path(__file__).resolve().parents[1]


def _small_pointwise_tasks(store: Store, count: int) -> list[str]:
    keys = []
    for key in store.task_keys():
        task = store.task(key)
        if task.get("kind") == "pointwise" and task["dtypes"] == ["float32"] * len(task["dtypes"]):
            keys.append((len(task["script"]), key))
    return [k for _, k in sorted(keys)[:count]]


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    store = Store(default_root())
    if not store.task_keys():
        pytest.skip("no corpus tasks in data/")
    keys = _small_pointwise_tasks(store, 2)
    fresh = Store(tmp_path_factory.mktemp("tasks_only"))  # no records: nothing to skip as already measured
    for key in keys:
        fresh.put_task(store.task(key))
    out = tmp_path_factory.mktemp("cudabatch")
    summary = cp.build_batch(fresh, keys, per_task=2, out_dir=out, seed=0, say=lambda s: None)
    assert summary.tasks == len(keys)
    return out, summary


def test_batch_layout(batch):
    out, summary = batch
    b = cp.read_json(out / "batch.json.gz")
    assert b["arch"] == "sm_90" and len(b["tasks"]) == 2
    ids = [p["id"] for p in b["programs"]]
    assert len(ids) == len(set(ids))
    progs = [p for p in b["programs"] if not p["reference"]]
    assert len(progs) + len(b["failed"]) == summary.programs >= 2
    for t in b["tasks"].values():
        assert t["reference"] in ids and t["params"] and t["num_outputs"] >= 1
    for p in b["programs"]:
        assert p["task"] in b["tasks"]
        source = gzip.decompress((out / f"{p['shard']}.gz").read_bytes()).decode()
        assert p["launches"]
        for la in p["launches"]:
            assert la["kernel"].startswith(p["id"]) and f" {la['kernel']}(" in source
            assert min(la["grid"] + la["block"]) >= 1


def test_shard_compiles_with_nvcc(batch, tmp_path):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    out, _ = batch
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import gpu_measure_programs as gm
    finally:
        sys.path.pop(0)
    cubins = gm.compile_shards([out], tmp_path, "sm_90", 2)
    assert cubins and all(v.endswith(".cubin") and Path(v).stat().st_size > 0 for v in cubins.values()), cubins
    # the kernels the launches name are in the cubin
    names = subprocess.run(["cuobjdump", "-symbols", next(iter(cubins.values()))], capture_output=True,
                           text=True).stdout if shutil.which("cuobjdump") else ""
    b = cp.read_json(out / "batch.json.gz")
    if names:
        for p in b["programs"]:
            for la in p["launches"]:
                assert la["kernel"] in names


def test_results_import_into_store(batch, tmp_path):
    out, _ = batch
    b = cp.read_json(out / "batch.json.gz")
    progs = [p for p in b["programs"] if not p["reference"]]
    results = {"machine": {"host": "h", "gpu": "NVIDIA H200", "driver": "1", "cores": 16},
               "time": "2026-11-30T00:00:00Z",
               "results": [{"id": p["id"], "valid": i > 0, "error": "" if i > 0 else "rel err 1.00e+00",
                            "rel_err": 1e-7, "median_us": 10.0 + i, "min_us": 9.0, "spread": 0.01, "repeats": 5}
                           for i, p in enumerate(progs)],
               "repeat": [{"id": progs[-1]["id"], "valid": True, "median_us": 10.0 + len(progs) - 1 + 0.1}]}
    rpath = tmp_path / "results.json.gz"
    with gzip.open(rpath, "wt") as f:
        json.dump(results, f)
    store = Store(tmp_path / "data")
    summary = cp.import_results(store, out, rpath)
    assert summary["records"] == len(progs) + len(b["failed"])
    assert summary["valid"] == len(progs) - 1
    assert summary["repeat"]["count"] == 1
    records = list(store.records("cuda"))
    assert {r["target"] for r in records} == {"cuda"}
    assert records[0]["hardware"]["kind"] == "cuda" and records[0]["machine"]["gpu"] == "NVIDIA H200"
    assert store.stats()["records"]["cuda"] == len(progs) - 1
    # the same fields as an x86 record
    x86 = next(Store(default_root()).records("x86"), None)
    if x86 is not None:  # chosen_by: optional, "random" where absent (x86 records before it existed)
        assert set(records[0]) - {"chosen_by"} == set(x86) - {"chosen_by"}
    assert {r["chosen_by"] for r in records} == {"random"}


def test_a_batch_can_carry_each_tasks_heuristic_point(tmp_path):
    from tlmpack.training.report import cuda_task_table

    store = Store(default_root())
    keys = _small_pointwise_tasks(store, 1)
    if not keys:
        pytest.skip("no corpus tasks in data/")
    out = tmp_path / "h"
    cp.build_batch(store, keys, per_task=0, out_dir=out, seed=0, say=lambda s: None, heuristic=True)
    b = cp.read_json(out / "batch.json.gz")
    (h,) = [p for p in b["programs"] if not p["reference"]]
    assert h["chosen_by"] == "heuristic" and h["rule"].startswith("cuda-")
    results = {"machine": {"gpu": "NVIDIA H200"}, "results": [
        {"id": h["id"], "valid": True, "error": "", "rel_err": 0.0, "median_us": 7.5, "min_us": 7.0, "spread": 0.01,
         "repeats": 5}]}
    rpath = tmp_path / "results.json.gz"
    with gzip.open(rpath, "wt") as f:
        json.dump(results, f)
    mine = Store(tmp_path / "data")
    cp.import_results(mine, out, rpath)
    (record,) = mine.records("cuda")
    assert record["chosen_by"] == "heuristic" and record["valid"]
    table = cuda_task_table(mine)
    assert "| 0 | - | - | - | 7.5 | - |" in table


def test_a_new_batch_skips_points_the_store_has_measured(tmp_path):
    store = Store(default_root())
    keys = _small_pointwise_tasks(store, 1)
    if not keys:
        pytest.skip("no corpus tasks in data/")
    mine = Store(tmp_path / "data")
    mine.put_task(store.task(keys[0]))
    first = cp.build_batch(mine, keys, per_task=2, out_dir=tmp_path / "b1", seed=0, say=lambda s: None)
    b = cp.read_json(tmp_path / "b1" / "batch.json.gz")
    programs = [p for p in b["programs"] if not p["reference"]]
    assert first.programs == len(programs) >= 1
    results = {"machine": {}, "results": [{"id": p["id"], "valid": True, "error": "", "rel_err": 0.0, "median_us": 1.0,
                                           "min_us": 1.0, "spread": 0.0, "repeats": 5} for p in programs]}
    with gzip.open(tmp_path / "r.json.gz", "wt") as f:
        json.dump(results, f)
    cp.import_results(mine, tmp_path / "b1", tmp_path / "r.json.gz")
    again = cp.build_batch(mine, keys, per_task=2, out_dir=tmp_path / "b2", seed=0, say=lambda s: None)
    assert again.duplicates >= len(programs)  # the same seed draws the measured points first: skipped
    measured = {(p["sketch"], json.dumps(p["decisions"])) for p in programs}
    b2 = cp.read_json(tmp_path / "b2" / "batch.json.gz")
    assert not measured & {(p["sketch"], json.dumps(p["decisions"])) for p in b2["programs"] if not p["reference"]}
