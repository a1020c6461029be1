"""A build that runs away (LLVM on a few unrolled points) costs its budget, not the whole job."""

from __future__ import annotations

import os
import time

import numpy as np
from tlm_tasks import example_tasks

from tlmpack.training.build_guard import OverBudget, announce_pausable, run_guarded


def _square(x: int) -> int:
    return x * x


def _spin() -> None:
    while True:
        pass


def _hoard() -> None:
    blocks = []
    while True:
        blocks.append(np.ones(1 << 24, dtype=np.uint8))  # 16 MiB a step, touched


def _fail() -> None:
    raise ValueError("no such intrinsic\nsecond line")


def _crash() -> None:
    os._exit(3)


def test_the_answer_of_a_child_within_budget_comes_back():
    assert run_guarded(_square, (7,), cpu_s=30, max_rss_bytes=1 << 40) == 49


def test_a_child_over_its_cpu_budget_is_stopped():
    outcome = run_guarded(_spin, (), cpu_s=0.5, max_rss_bytes=1 << 40)
    assert isinstance(outcome, OverBudget) and "CPU" in outcome.reason


def _busy() -> int:
    return sum(range(3_000_000))  # some tens of ms of CPU, done before the parent's first look


def test_a_child_that_finishes_before_the_first_look_still_answers_to_its_cpu_budget():
    outcome = run_guarded(_busy, (), cpu_s=0.0, max_rss_bytes=1 << 40, poll_s=10.0)
    assert isinstance(outcome, OverBudget) and "over 0 s of CPU" in outcome.reason
    assert run_guarded(_busy, (), cpu_s=30, max_rss_bytes=1 << 40, poll_s=10.0) == sum(range(3_000_000))


def test_a_child_over_its_memory_budget_is_stopped():
    outcome = run_guarded(_hoard, (), cpu_s=60, max_rss_bytes=1 << 30)
    assert isinstance(outcome, OverBudget) and "memory" in outcome.reason


def test_an_exception_or_a_dead_child_is_a_reason_not_a_crash():
    raised = run_guarded(_fail, (), cpu_s=30, max_rss_bytes=1 << 40)
    assert isinstance(raised, OverBudget) and raised.reason == "ValueError: no such intrinsic"
    died = run_guarded(_crash, (), cpu_s=30, max_rss_bytes=1 << 40)
    assert isinstance(died, OverBudget) and "exit code 3" in died.reason


def _announced(folder: str) -> bool:
    mine = os.path.join(folder, str(os.getpid()))
    for _ in range(100):
        if os.path.exists(mine):
            return True
        time.sleep(0.05)
    return False


def test_a_running_child_announces_itself_so_the_timer_can_pause_it(tmp_path):
    announce_pausable(str(tmp_path))
    try:
        assert run_guarded(_announced, (str(tmp_path),), cpu_s=30, max_rss_bytes=1 << 40) is True
    finally:
        announce_pausable(None)
    assert list(tmp_path.iterdir()) == []  # gone once it ended


def test_programs_over_budget_are_left_out_with_the_reason_and_the_rest_build(tmp_path):
    from tlmpack.lower.x86 import x86_target
    from tlmpack.training.x86_build import BuildBudget, build_library

    funcs = {"a": example_tasks()["fused_dense_add_relu"], "b": example_tasks()["softmax"]}
    target = x86_target(num_cores=1).tvm_target()
    errors = build_library(funcs, target, tmp_path / "ok.so")
    assert errors == {} and (tmp_path / "ok.so").stat().st_size > 0
    starved = BuildBudget(group_cpu_s=0.0, per_program_cpu_s=0.0, single_cpu_s=0.0)
    errors = build_library(funcs, target, tmp_path / "none.so", starved)
    assert set(errors) == {"a", "b"} and all("over 0 s of CPU" in e for e in errors.values())
    assert not (tmp_path / "none.so").exists()


def test_the_memory_budget_counts_what_the_child_adds_not_what_it_inherits():
    inherited = np.ones(1 << 28, dtype=np.uint8)  # 256 MiB resident in the parent, shared by the fork
    try:
        assert run_guarded(_square, (3,), cpu_s=30, max_rss_bytes=128 << 20) == 9
    finally:
        del inherited


def test_a_reference_over_budget_fails_the_job_with_the_reason(tmp_path, monkeypatch):
    from tlmpack.training import x86_build
    from tlmpack.training.corpus import task_key
    from tlmpack.training.store import Store

    store = Store(tmp_path / "data")
    func = example_tasks()["softmax"]
    key = task_key(func)
    store.put_task({"key": key, "name": "softmax", "num_outputs": 1, "script": func.script()})
    monkeypatch.setattr(x86_build, "REFERENCE_BUDGET", x86_build.BuildBudget(single_cpu_s=0.5))
    monkeypatch.setattr(x86_build, "write_reference", lambda *args: _spin())  # naive loops that never end
    job = x86_build.build_job(str(store.root), key, 1, 0, str(tmp_path / "job"), count=2)
    assert job.error.startswith("reference: over 0 s of CPU") and not job.programs
