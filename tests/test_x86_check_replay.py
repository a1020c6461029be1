"""bench/x86_check_replay.py: a stored pass's greedy picks as a build would run them, through the
register check and the vector-fill rule (a refused pick counts as the rules')."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from bench_scripts import load

ROOT = Path(__file__).resolve().parent.parent
TASK = "dc0d02a9ed87fdfd"  # a held-out 1x1 convolution, 7 x 7 x 2048 (data/tasks)
SE_TASK = "9b9975b525603a14"  # a held-out squeeze-excite 1x1 convolution, 1 x 1 x 20
ROCKETLAKE = {"cores": 1, "features": ["avx", "avx2", "avx512f", "fma"], "kind": "x86", "l1d_bytes": 49152,
              "l2_bytes": 2097152, "l3_bytes": 503316480, "llvm_cpu": "rocketlake", "vector_bits": 512,
              "vector_registers": 32}


def _module():
    return load("x86_check_replay")


def _record(task: str, tiles: list, us: float, chosen_by: str = "tlm", rule: str = "greedy") -> dict:
    return {"task": task, "target": "x86", "chosen_by": chosen_by, "rule": rule, "valid": True, "min_us": us, "median_us": us,
            "sketch": 0, "decisions": [["tile", t] for t in tiles] + [["categorical", 2]], "hardware": ROCKETLAKE}


def _conv(inner_c: list) -> list:
    return [[1, 1, 1, 1], [1, 7, 1, 1], [1, 1, 1, 7], inner_c, [1, 1], [1, 1], [64, 8]]


def _se(inner_c: list) -> list:
    return [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], inner_c, [1, 1], [1, 1], [60, 8]]


def test_the_vector_fill_rule_refuses_what_the_accumulator_bounds_let_through():
    m = _module()
    from tlmpack.training.store import Store

    store = Store(ROOT / "data")
    conv, se = tuple(store.task(TASK)["spatial"]), tuple(store.task(SE_TASK)["spatial"])
    assert m.passes_checks(conv, _record(TASK, _conv([64, 1, 1, 32]), 1.0)) == (True, True)  # the rules'
    # 1 lane x 7 rows: 7 vectors, under AVX-512's 8 as well
    assert m.passes_checks(conv, _record(TASK, _conv([16, 1, 128, 1]), 1.0)) == (False, False)
    # one row: no lower bound, so only the vector-fill rule (5 of 20 channels' widest 10) refuses 2 lanes
    assert m.passes_checks(se, _record(SE_TASK, _se([2, 1, 1, 10]), 1.0)) == (True, True)
    assert m.passes_checks(se, _record(SE_TASK, _se([1, 2, 5, 2]), 1.0)) == (True, False)


def test_a_pass_counts_a_refused_pick_as_the_rules(tmp_path):
    m = _module()
    from tlmpack.training.store import Store

    run = tmp_path / "run.jsonl.gz"
    records = [_record(TASK, _conv([64, 1, 1, 32]), 100.0, "heuristic", "x86-matmul"),
               _record(TASK, _conv([16, 1, 128, 1]), 800.0),
               _record(SE_TASK, _se([2, 1, 1, 10]), 10.0, "heuristic", "x86-matmul"),
               _record(SE_TASK, _se([1, 2, 5, 2]), 40.0)]
    with gzip.open(run, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    store = Store(ROOT / "data")
    assert m.replay(run, store) is None  # under 3 tasks: no geometric mean
    with gzip.open(run, "at") as f:  # a third task: the rules' pick again, as the greedy one (1x)
        third = "6dfa4ff6841408c9"
        spatial = store.task(third)["spatial"]
        tiles = [[1, 1, 1, 1]] * (len(spatial) - 1) + [[1, 1, 1, spatial[-1]]] + [[spatial[-1], 1]]
        for chosen_by, rule in (("heuristic", "x86-matmul"), ("tlm", "greedy")):
            f.write(json.dumps(_record(third, tiles, 5.0, chosen_by, rule)) + "\n")
    row = m.replay(run, store)
    assert row["tasks"] == 3
    assert row["greedy"] == round((1 / 8 * 1 / 4 * 1) ** (1 / 3), 3)
    assert row["checked"] == round((1 * 1 / 4 * 1) ** (1 / 3), 3)
    assert row["checked_vector_fill"] == 1.0
