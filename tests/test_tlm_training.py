"""The offline TLM loop's bookkeeping: side-by-side comparison, the per-round progress, the
confidence floor, adapting's eval table, and rewriting a weights file's floor."""

from __future__ import annotations

import math

import pytest

from tlmpack.training.compare import calibrate, compare, geomean_table, round_progress
from tlmpack.training.store import Store


def _record(task: str, us: float, chosen_by: str = "random", rule: str = "", **kw) -> dict:
    return {"task": task, "target": "cuda", "valid": True, "median_us": us, "min_us": us, "chosen_by": chosen_by,
            "rule": rule, "hardware": {"kind": "cuda", "arch": "sm_90"}, "decisions": [["tile", [us]]],
            "sketch": 0, "time": kw.pop("time", "t1"), **kw}


def test_compare_measures_the_tlm_against_the_rules_and_the_best_of_the_same_pass():
    records = [_record("a", 10.0, "tlm", "greedy"), _record("a", 20.0, "heuristic", "x"), _record("a", 8.0),
               _record("b", 30.0, "tlm", "greedy"), _record("b", 15.0, "heuristic", "x")]
    result = compare(records, sites={})
    rows = {r["task"]: r for r in result["rows"]}
    assert rows["a"]["tlm_speedup_vs_heuristic"] == 2.0 and rows["a"]["tlm_vs_best"] == 0.8
    assert rows["b"]["tlm_speedup_vs_heuristic"] == 0.5 and rows["b"]["best_by"] == "heuristic"
    small = result["small_spaces"]  # no cached sites: spaces count as one point, reported apart
    assert small["tasks"] == 2 and math.isclose(small["tlm_speedup_vs_heuristic_geomean"], 1.0)


def test_compare_gives_each_versus_models_pick_of_the_same_pass():
    records = [_record("a", 10.0, "tlm", "greedy"), _record("a", 20.0, "heuristic", "x"),
               _record("a", 40.0, "tlm", "greedy:shipped"), _record("b", 30.0, "tlm", "greedy"),
               _record("b", 15.0, "heuristic", "x"), _record("b", 15.0, "tlm", "greedy:shipped")]
    result = compare(records, sites={})
    rows = {r["task"]: r for r in result["rows"]}
    assert rows["a"]["tlm_us"] == 10.0 and rows["a"]["versus_us"] == {"shipped": 40.0}
    small = result["small_spaces"]
    assert small["shipped_speedup_vs_heuristic_geomean"] == pytest.approx(math.sqrt(0.5 * 1.0), rel=1e-3)


def test_calibrate_picks_the_floor_that_keeps_the_good_picks_and_drops_the_bad():
    rows = [{"task": "good", "tlm_us": 5.0, "heuristic_us": 10.0}, {"task": "bad", "tlm_us": 40.0, "heuristic_us": 10.0}]
    result = calibrate(rows, {"good": 0.9, "bad": 0.2})
    assert 0.2 < result["min_confidence"] <= 0.9 and result["speedup_vs_heuristic"] == pytest.approx(math.sqrt(2.0), rel=1e-3)
    trusting = calibrate(rows, {"good": 0.9, "bad": 0.95})  # the bad pick is the sure one: trust none
    assert trusting["min_confidence"] > 0.95 and trusting["speedup_vs_heuristic"] == 1.0


def test_round_progress_compares_the_best_known_before_and_after_with_the_best_random(tmp_path):
    store = Store(tmp_path)
    store.writer("cuda", "old").append([_record("a", 10.0), _record("a", 12.0), _record("a", 9.0, "heuristic")])
    new = [_record("a", 6.0, "tlm", "greedy", time="t2")]
    p = round_progress(store, "cuda", new)
    (row,) = p["rows"]
    assert (row["best_random_us"], row["best_before_us"], row["best_after_us"]) == (10.0, 9.0, 6.0)
    assert p["improved_tasks"] == 1 and math.isclose(p["after_vs_random_geomean"], 10.0 / 6.0)


def test_adapt_eval_table_gives_each_models_speedup_over_the_unadapted_one():
    records = [_record("a", 10.0, "tlm", "greedy", tlm_model="unadapted"),
               _record("a", 5.0, "tlm", "greedy", tlm_model="adapted"),
               _record("b", 8.0, "tlm", "greedy", tlm_model="unadapted"),
               _record("b", 8.0, "tlm", "greedy", tlm_model="adapted")]
    table = geomean_table(records)
    assert f"geometric-mean speed-up {math.sqrt(2.0):.3f} over 2 tasks" in table


def test_setting_the_confidence_floor_changes_the_weights_id_not_the_tensors(tmp_path):
    import shutil

    import numpy as np

    from tlmpack.tlm.model import load_file, set_min_confidence, weights_path

    path = tmp_path / "x86.safetensors"
    shutil.copy(weights_path("x86"), path)
    before = load_file(path, "x86")
    sha = set_min_confidence(path, 0.37)
    after = load_file(path, "x86")
    assert after.summary.min_confidence == pytest.approx(0.37) and after.sha256 == sha != before.sha256
    for name, array in before.state.items():
        np.testing.assert_array_equal(array, after.state[name])


def test_adapt_batches_skip_tasks_whose_arguments_would_not_fit_a_carried_batch():
    from tlmpack.training.adapt import _params_bytes

    script = ('def main(A: T.Buffer((T.int64(2), T.int64(512)), "float32"), '
              'B: T.Buffer((T.int64(1024),), "float32")):\n    T.func_attr({})\n')
    assert _params_bytes({"script": script}) == 4 * (2 * 512 + 1024)
