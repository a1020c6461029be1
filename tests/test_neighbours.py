"""One-step edits of the rules' point (schedule/neighbours.py): the local search measured offline."""

from __future__ import annotations

import math

import pytest

from tests.tlm_tasks import example_tasks, x86_space
from tlmpack.schedule.neighbours import neighbours, tile_steps


def test_a_tile_step_moves_one_prime_factor_and_keeps_the_product():
    steps = tile_steps((16, 1, 3), max_innermost=0)
    assert steps and (16, 1, 3) not in steps
    for step in steps:
        assert math.prod(step) == 48
        changed = [i for i in range(3) if step[i] != (16, 1, 3)[i]]
        assert len(changed) == 2  # one level lost a prime, another gained it
    assert (8, 2, 3) in steps and (16, 3, 1) in steps and (48, 1, 1) in steps


def test_a_tile_step_respects_the_innermost_bound():
    assert all(step[-1] <= 4 for step in tile_steps((2, 2, 4), max_innermost=4))
    assert (2, 1, 8) not in tile_steps((2, 2, 4), max_innermost=4)


@pytest.fixture(scope="module")
def matmul_rules_point():
    from tlmpack.lower.x86 import x86_target
    from tlmpack.schedule.hardware import detect_x86
    from tlmpack.schedule.select import schedule_with_rules

    func = example_tasks()["fused_dense_add_relu"]
    target = x86_target(num_cores=2)
    choice = schedule_with_rules(func, target.tvm_target(), "x86", detect_x86(target.features, target.num_cores))
    assert choice is not None
    return x86_space(func), choice


def test_neighbours_are_legal_distinct_one_site_edits_and_seeded(matmul_rules_point):
    space, choice = matmul_rules_point
    found = neighbours(space, choice.sketch, choice.decisions, 8, seed=3)
    assert 0 < len(found) <= 8 and len(set(found)) == len(found)
    for edited in found:
        assert sum(a != b for a, b in zip(edited, choice.decisions, strict=True)) == 1
        assert space.replay(choice.sketch, lambda site, _s, e=edited: e[site.index].value, locations=True) is not None
    assert neighbours(space, choice.sketch, choice.decisions, 8, seed=3) == found
    assert neighbours(space, choice.sketch, choice.decisions, 0) == []


def test_a_point_that_does_not_match_the_sketch_has_no_neighbours(matmul_rules_point):
    space, choice = matmul_rules_point
    assert neighbours(space, choice.sketch, choice.decisions[:-1], 8) == []


def _tiny_store(tmp_path):
    from tlmpack.tlm.language import describe_task
    from tlmpack.training.corpus import task_key
    from tlmpack.training.store import Store

    store = Store(tmp_path / "data")
    func = example_tasks()["fused_dense_add_relu"]
    key = task_key(func)
    info = describe_task(func, "fused_dense_add_relu")
    store.put_task({"key": key, "name": "fused_dense_add_relu", "num_outputs": 1, "script": func.script(),
                    "kind": info.kind, "ops": list(info.ops), "spatial": list(info.spatial),
                    "reduction": list(info.reduction), "dtypes": list(info.dtypes)})
    store.put_corpus("tiny-x86", {"model": "tiny-x86", "held_out": False,
                                  "tasks": [{"key": key, "name": "fused_dense_add_relu", "calls": 1}]})
    return store, key


def test_tlm_measure_proposes_the_rules_point_and_its_neighbours(tmp_path):
    from tlmpack.training.candidates import propose

    store, key = _tiny_store(tmp_path)
    found = propose(store, "x86", [key], samples=0, neighbours=5, say=lambda _m: None)[key]
    rules = [c for c in found if c.chosen_by == "heuristic"]
    edits = [c for c in found if c.rule == "neighbour"]
    assert len(rules) == 1 and 0 < len(edits) <= 5
    assert all(c.chosen_by == "search" and c.sketch == rules[0].sketch for c in edits)
    assert len({repr(c.decisions) for c in edits} | {repr(rules[0].decisions)}) == len(edits) + 1


def test_a_hill_climb_step_edits_the_fastest_program_measured_here_and_skips_measured_points(tmp_path):
    from tlmpack.training.candidates import propose
    from tlmpack.training.collect import make_record, record_common

    store, key = _tiny_store(tmp_path)
    rules = [c for c in propose(store, "x86", [key], samples=0, say=lambda _m: None)[key] if c.chosen_by == "heuristic"][0]
    space = x86_space(example_tasks()["fused_dense_add_relu"])
    from tlmpack.schedule.records import Decision

    first = neighbours(space, rules.sketch, tuple(Decision.from_json(d) for d in rules.decisions), 2, seed=1)
    common = record_common(1, 0)
    fast, slow = [[d.to_json() for d in e] for e in first]
    store.writer("x86", "test").append([
        make_record(common, key, "fused_dense_add_relu", "tiny-x86", rules.sketch, fast, {"chosen_by": "search"},
                    {"valid": True, "min_us": 1.0, "median_us": 1.0}),
        make_record(common, key, "fused_dense_add_relu", "tiny-x86", rules.sketch, slow, {"chosen_by": "search"},
                    {"valid": True, "min_us": 9.0, "median_us": 9.0})])
    found = propose(store, "x86", [key], samples=0, neighbours=50, neighbours_of="best", heuristic=False,
                    say=lambda _m: None)[key]
    edits = [c for c in found if c.rule == "neighbour"]
    assert edits
    start = [tuple(v) if isinstance(v, list) else v for _, v in fast]
    for c in edits:  # one step from the fast program, never a point measured already
        values = [tuple(v) if isinstance(v, list) else v for _, v in c.decisions]
        assert sum(a != b for a, b in zip(values, start, strict=True)) == 1
        assert c.decisions not in (fast, slow)
