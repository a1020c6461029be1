"""bench/x86_local_search.py: the rules' point against its one-step edits, per pass."""

from __future__ import annotations

import gzip
import json
import sys

from bench_scripts import load


def _module():
    return load("x86_local_search")


def _r(task: str, us: float, **kw) -> dict:
    return {"task": task, "min_us": us, "valid": True, **kw}


def test_a_pass_compares_the_rules_with_their_best_edit_and_the_best_program():
    m = _module()
    records = [_r("a", 10.0, chosen_by="heuristic"), _r("a", 5.0, chosen_by="search", rule="neighbour"),
               _r("a", 4.0, chosen_by="random"), _r("b", 8.0, chosen_by="heuristic"),
               _r("b", 8.0, chosen_by="search", rule="neighbour"), _r("c", 3.0, chosen_by="random")]
    summary, per_task = m.pass_summary(records)
    assert summary["tasks"] == 3 and summary["tasks_with_edits"] == 2
    assert summary["rules_over_best_edit"] == round((2.0 * 1.0) ** 0.5, 3)
    assert summary["rules_over_best_of_pass"] == round((2.5 * 1.0) ** 0.5, 3)
    assert summary["edit_beats_rules_by_2pct"] == 1
    assert per_task == {"a": (10.0, 4.0), "b": (8.0, 8.0)}


def test_passes_together_divide_each_tasks_best_by_its_first_rules_point(tmp_path, capsys, monkeypatch):
    m = _module()
    for name, rows in (("1.jsonl.gz", [_r("a", 10.0, chosen_by="heuristic"), _r("a", 8.0, rule="neighbour")]),
                       ("2.jsonl.gz", [_r("a", 5.0, rule="neighbour"), _r("a", 6.0, valid=False)])):
        with gzip.open(tmp_path / name, "wt") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    out = tmp_path / "out.json"
    monkeypatch.setattr(sys, "argv", ["x", str(tmp_path / "1.jsonl.gz"), str(tmp_path / "2.jsonl.gz"), "--json", str(out)])
    m.main()
    assert json.loads(out.read_text())["together"] == {"tasks": 1, "rules_over_best": 2.0}
