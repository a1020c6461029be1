"""The record store (append-only gzip shards that survive a torn write), the measurement checks,
and a small resumable collect run over one stored task."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
from tlm_tasks import example_tasks

from tlmpack.training.measure import check
from tlmpack.training.store import Store, read_shard


def _record(task: str, valid: bool, target: str = "x86") -> dict:
    return {"task": task, "target": target, "valid": valid, "sketch": 0, "decisions": [["categorical", 1]]}


def test_shards_append_and_stats_count_valid_records_only(tmp_path):
    store = Store(tmp_path)
    w = store.writer("x86", run="a")
    w.append([_record("t1", True), _record("t1", False)])
    w.append([_record("t2", True)])
    store.writer("cuda", run="b").append([_record("t1", True, "cuda")])
    store.put_task({"key": "t1", "script": "x"})
    store.put_task({"key": "t1", "script": "changed"})  # tasks are written once
    assert store.task("t1")["script"] == "x"
    s = store.stats()
    assert s["tasks"] == 1 and s["records"] == {"x86": 2, "cuda": 1} and s["invalid"]["x86"] == 1
    assert len(list(store.records("x86"))) == 3


def test_older_avx512_records_are_read_in_todays_sketch_order(tmp_path):
    """Records written before 2026-12-08 on a CPU whose old order differed (no ``sketch_order``) are
    read through data/sketch-order/x86.json; new x86 records are stamped and read as written."""
    import json

    from tlmpack.training.store import SKETCH_ORDER, sketch_order_path

    store = Store(tmp_path)
    hw = {"llvm_cpu": "znver4", "cores": 1}
    old = [{**_record("t1", True), "hardware": hw, "sketch": i} for i in (0, 2, 5)]  # 5: an appended sketch
    with gzip.open(tmp_path / "old.jsonl.gz", "wt") as f:  # as a shard written before the stamp existed
        f.write("".join(json.dumps(r) + "\n" for r in old))
    (tmp_path / "records" / "x86").mkdir(parents=True)
    (tmp_path / "old.jsonl.gz").rename(tmp_path / "records" / "x86" / "a-old.jsonl.gz")
    store.writer("x86", run="b-new").append([{**_record("t1", True), "hardware": hw, "sketch": 0}])
    store.writer("cuda", run="c").append([_record("t1", True, "cuda")])
    assert [r["sketch"] for r in store.records("x86")] == [0, 2, 5, 0]  # no table: as written
    path = sketch_order_path(tmp_path)
    path.parent.mkdir()
    path.write_text(json.dumps({"t1|znver4|1": [2, 1, 0]}))
    read = list(store.records())
    assert [r["sketch"] for r in read] == [0, 2, 0, 5, 0]  # cuda first (shards in path order)
    assert [r["sketch"] for r in store.records("x86")] == [2, 0, 5, 0]
    assert [r.get("sketch_order") for r in store.records("x86")] == [None] * 3 + [SKETCH_ORDER]
    assert [r["sketch"] for r in store.shard(tmp_path / "records" / "x86" / "a-old.jsonl.gz")] == [2, 0, 5]
    assert "sketch_order" not in next(store.records("cuda"))


def test_a_torn_last_batch_loses_only_itself(tmp_path):
    store = Store(tmp_path)
    w = store.writer("x86", run="torn")
    w.append([_record("t1", True)] * 3)
    with open(w.path, "ab") as f:
        f.write(gzip.compress(b'{"task": "t9"}\n' * 50)[:-12])  # killed mid-write
    assert [r["task"] for r in read_shard(w.path)] == ["t1"] * 3


def test_check_rejects_wrong_nan_and_zero_outputs():
    ref = np.linspace(1, 2, 64, dtype=np.float32)
    assert check([ref + 1e-7], [ref])[0]
    assert not check([ref * 1.01], [ref])[0]
    assert not check([np.zeros_like(ref)], [ref])[0]
    bad = ref.copy()
    bad[3] = np.nan
    assert not check([bad], [ref])[0]
    assert not check([np.array([1, 2], np.int64)], [np.array([1, 3], np.int64)])[0]


def test_stored_script_gives_back_the_same_task(tmp_path):
    import tvm_ffi

    from tlmpack.training.corpus import load_func, task_key

    func = example_tasks()["softmax"]
    back = load_func({"script": func.script()})
    assert tvm_ffi.structural_equal(back.without_attr("global_symbol"), func.without_attr("global_symbol"))
    assert task_key(back) == task_key(func)


@pytest.fixture
def one_task_store(tmp_path):
    from tlmpack.training.corpus import task_key

    store = Store(tmp_path)
    func = example_tasks()["fused_dense_add_relu"]
    key = task_key(func)
    store.put_task({"key": key, "name": "fused_dense_add_relu", "num_outputs": 1, "script": func.script()})
    store.put_corpus("toy", {"model": "toy", "held_out": False,
                             "tasks": [{"key": key, "name": "fused_dense_add_relu", "calls": 1}]})
    return store, key


def test_collect_measures_checks_and_resumes(one_task_store):
    from tlmpack.training.collect import collect

    store, key = one_task_store
    first = collect(store, ["toy"], per_task=3, seed=1, batch=2, progress=False, say=lambda m: None, max_wait_s=0)
    records = list(store.records("x86"))
    assert first.measured == len(records) == 3
    assert all(r["task"] == key and r["valid"] and r["median_us"] > 0 and r["rel_err"] < 1e-4 for r in records)
    assert len({(r["sketch"], str(r["decisions"])) for r in records}) == 3
    assert [r["chosen_by"] for r in records].count("heuristic") == 1  # where tlmpack's own choice lands
    again = collect(store, ["toy"], per_task=3, seed=1, progress=False, say=lambda m: None, max_wait_s=0)
    assert again.measured == 0 and len(list(store.records("x86"))) == 3
    more = collect(store, ["toy"], per_task=4, seed=1, progress=False, say=lambda m: None, max_wait_s=0)
    assert more.measured == 1


def test_repeat_rebuilds_stored_points_and_times_them_again(one_task_store):
    from tlmpack.training.collect import collect
    from tlmpack.training.remeasure import remeasure

    store, _ = one_task_store
    collect(store, ["toy"], per_task=3, seed=2, progress=False, say=lambda m: None, max_wait_s=0, threads=1,
            build_workers=1)
    assert all(r["timer"] == "runtime_c" and r["hardware"]["cores"] == 1 for r in store.records("x86"))
    out = remeasure(store, 3, threads=1, back_to_back=True, max_wait_s=0, quiet_only=False)
    assert all(r["timing"] == "interleaved" and r["repeats"] >= 3 for r in store.records("x86"))
    assert out["remeasured"] == 3 and out["failures"] == 0
    assert out["latency"] == "min_us"
    for stat in ("min_us", "median_us"):
        assert out[stat]["median_rel_diff"] is not None and out[stat]["back_to_back_median_rel_diff"] is not None


def test_table_summary_says_how_much_the_schedule_matters_and_where_the_heuristic_trails():
    from tlmpack.training.report import summary

    spans = [("a", 1.0, 2.0, 1.0, 10), ("b", 2.0, 8.0, 6.0, 10), ("c", 1.0, 1.0, None, 2)]
    text = summary(spans)
    assert "3 tasks" in text and "2 tasks with ≥ 8 programs" in text
    assert "median 3.00×" in text  # median/best: 2 and 4
    assert "at least as fast as every random program on 1" in text
    assert text.index("b 3.00×") < text.index("a 1.00×")  # worst first


def test_a_space_found_exhausted_is_remembered_and_not_sampled_again(tmp_path):
    from tvm import te, topi

    from tlmpack.training.collect import collect
    from tlmpack.training.corpus import task_key

    store = Store(tmp_path)
    a, b = te.placeholder((4, 8), name="A"), te.placeholder((4, 8), name="B")
    func = te.create_prim_func([a, b, topi.add(a, b)])  # a tiny space: fewer points than asked for
    key = task_key(func)
    store.put_task({"key": key, "name": "add", "num_outputs": 1, "script": func.script(), "spatial": [4, 8]})
    store.put_corpus("toy", {"model": "toy", "held_out": False, "tasks": [{"key": key, "name": "add", "calls": 1}]})
    run = dict(per_task=5, progress=False, say=lambda m: None, max_wait_s=0, threads=1, build_workers=1,
               heuristic=False)
    first = collect(store, ["toy"], seed=1, **run)
    assert 0 < first.measured < 5 and first.duplicates > 0
    assert store.exhausted("x86", 1) == {key} and store.exhausted("x86", 2) == set()
    again = collect(store, ["toy"], seed=2, **run)
    assert again.sampled == 0 and again.measured == 0


def test_collect_can_be_limited_to_task_kinds(one_task_store):
    from tlmpack.training.collect import collect

    store, key = one_task_store
    store.task_path(key).unlink()
    task = {"key": key, "name": "fused_dense_add_relu", "num_outputs": 1, "kind": "matmul",
            "script": example_tasks()["fused_dense_add_relu"].script()}
    store.put_task(task)
    run = dict(per_task=1, seed=3, progress=False, say=lambda m: None, max_wait_s=0, threads=1, build_workers=1,
               heuristic=False)
    assert collect(store, ["toy"], kinds={"reduce", "pointwise"}, **run).measured == 0
    assert collect(store, ["toy"], kinds={"matmul"}, **run).measured == 1


def test_collect_stops_cleanly_when_its_memory_passes_the_limit(one_task_store):
    from tlmpack.training.collect import collect

    store, _ = one_task_store
    said = []
    summary = collect(store, ["toy"], per_task=4, seed=4, batch=2, progress=False, say=said.append, max_wait_s=0,
                      threads=1, build_workers=1, heuristic=False, max_rss_fraction=1e-9)
    assert summary.stopped == "memory" and 0 < summary.measured < 4
    assert any("GiB" in line for line in said) and len(list(store.records("x86"))) == summary.measured


def test_a_changed_heuristic_choice_is_found_and_recorded_again(one_task_store):
    from tlmpack.training.collect import collect
    from tlmpack.training.heuristic_records import changed_tasks, latest_heuristic, refresh_heuristics

    store, key = one_task_store
    collect(store, ["toy"], per_task=1, seed=3, progress=False, say=lambda m: None, max_wait_s=0, threads=1,
            build_workers=1)
    assert changed_tasks(store, 1) == []  # the rules still pick what was recorded
    stale = dict(latest_heuristic(store, 1)[key])
    stale["decisions"] = [["categorical", 0]]  # as if an older rule had chosen otherwise
    store.writer("x86").append([stale])
    assert changed_tasks(store, 1) == [key]
    out = refresh_heuristics(store, 1, [key], say=lambda m: None, max_wait_s=0)
    assert out == {"recorded": 1, "invalid": 0}
    latest = latest_heuristic(store, 1)[key]
    assert latest["valid"] and latest["min_us"] > 0 and latest["rule"]
    assert changed_tasks(store, 1) == []
