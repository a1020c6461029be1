"""The x86 timer runs a program as a build runs it: a matmul-like task's constant weight pre-packed
for the program's own tiling (lower/prepack.py), so the dataset, ``tlm measure`` and ``--tune`` time
the kernel a built model calls, not the same schedule reading the plain weight."""

import json

import numpy as np
import pytest

from tests.tlm_tasks import example_tasks

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

DENSE = "fused_dense_add_relu"  # A (32, 64) · W (48, 64)^T + B: W is the weight a build packs


def _store(tmp_path, weight_param: int | None):
    from tlmpack.training.corpus import task_key
    from tlmpack.training.store import Store

    store = Store(tmp_path / "data")
    func = example_tasks()[DENSE]
    key = task_key(func)
    store.put_task({"key": key, "name": DENSE, "num_outputs": 1, "script": func.script(), "kind": "matmul"})
    entry = {"key": key, "name": DENSE, "calls": 1} | ({} if weight_param is None else {"weight_param": weight_param})
    store.put_corpus("tiny-x86", {"model": "tiny-x86", "held_out": False, "tasks": [entry]})
    return store, key


def test_the_store_knows_which_parameter_a_build_packs(tmp_path):
    store, key = _store(tmp_path, 1)
    assert store.weight_params() == {key: 1}
    assert _store(tmp_path / "other", None)[0].weight_params() == {}


def test_a_record_is_as_built_when_it_read_the_weight_the_way_the_build_passes_it():
    from tlmpack.training.store import timed_as_built

    packs = {"k": 1}
    assert timed_as_built({"target": "x86", "task": "k", "weights": "as-built"}, packs)
    assert not timed_as_built({"target": "x86", "task": "k"}, packs)  # the plain weight: another kernel
    assert timed_as_built({"target": "x86", "task": "other"}, packs)  # nothing to pack: plain is as built
    assert timed_as_built({"target": "cuda", "task": "k"}, packs)  # CUDA builds pack nothing


def test_a_job_packs_each_programs_weight_and_the_timer_passes_it(tmp_path):
    from tlmpack.training.measure import measure_folder
    from tlmpack.training.x86_build import build_job, load_reference, program_arguments

    store, key = _store(tmp_path, 1)
    job = build_job(str(store.root), key, 1, 0, str(tmp_path / "job"), count=4, heuristic=True)
    assert not job.error and len(job.programs) == 5 and job.record_fields() == {"weights": "as-built"}
    spec = json.loads((tmp_path / "job" / "packed.json").read_text())
    assert spec["param"] == 1 and "h" in spec["programs"]  # the rules' point is tiled: RewriteLayout packs it
    args, _ = load_reference(tmp_path / "job" / "reference.npz")
    own = program_arguments(tmp_path / "job", args)
    packed = own["h"][1]
    assert packed.shape != args[1].shape and packed.size == args[1].size
    assert np.allclose(np.sort(packed, axis=None), np.sort(args[1], axis=None))  # the same values, reordered
    assert all(own["h"][i] is args[i] for i in (0, 2, 3))
    names = [n for n, _, _ in job.programs]
    measured = measure_folder(job.folder, names, 1, max_other=99, max_wait_s=0)
    assert all(m.valid and m.min_us > 0 for m in measured.values()), measured


def test_a_packed_kernel_fails_its_check_on_the_plain_weight(tmp_path):
    """Passing the packed array is what makes the kernel right: fed the plain weight it computes
    something else (so the timer cannot silently time the wrong thing)."""
    from tlmpack.runtime.kernels import KernelLibrary
    from tlmpack.training.measure import Measurement, check_program
    from tlmpack.training.x86_build import build_job, load_reference, program_arguments

    store, key = _store(tmp_path, 1)
    job = build_job(str(store.root), key, 1, 0, str(tmp_path / "job"), count=0, heuristic=True)
    args, expected = load_reference(tmp_path / "job" / "reference.npz")
    plain = [a.reshape(program_arguments(job.folder, args)["h"][i].shape) for i, a in enumerate(args)]
    with KernelLibrary(str(tmp_path / "job" / "kernels.so"), 1) as library:
        packed = check_program(library, "h", program_arguments(job.folder, args)["h"], expected)
        wrong = check_program(library, "h", plain, expected)
    assert isinstance(packed, tuple)  # (seconds of the first call, its error): it checked
    assert isinstance(wrong, Measurement) and not wrong.valid and "rel err" in wrong.error


def test_a_task_without_a_packed_weight_is_timed_on_plain_arguments(tmp_path):
    from tlmpack.training.x86_build import build_job

    store, key = _store(tmp_path, None)
    job = build_job(str(store.root), key, 1, 0, str(tmp_path / "job"), count=2)
    assert not job.error and job.programs and job.record_fields() == {}
    assert not (tmp_path / "job" / "packed.json").exists()


def test_tune_times_each_candidate_with_its_own_packed_weight():
    from tlmpack.lower.x86 import x86_target
    from tlmpack.runtime.kernels import random_arguments
    from tlmpack.schedule.hardware import detect_x86
    from tlmpack.schedule.select import mark_layout_free, schedule_with_rules
    from tlmpack.schedule.tune import _as_built, measure_candidates

    func = example_tasks()[DENSE]
    target = x86_target(num_cores=1)
    tvm_target = target.tvm_target()
    rules = schedule_with_rules(mark_layout_free(func, 1), tvm_target, "x86", detect_x86(target.features, 1))
    candidates = {"heuristic": (rules.sketch, rules.decisions)}
    args = random_arguments(func, 1, 0)
    kernel, own = _as_built(func, 1, tvm_target, candidates, 1, args)["heuristic"]
    assert tuple(int(d) for d in kernel.params[1].shape) == own[1].shape != args[1].shape
    plain_kernel, plain_args = _as_built(func, 1, tvm_target, candidates, None, args)["heuristic"]
    assert plain_args is args and tuple(int(d) for d in plain_kernel.params[1].shape) == args[1].shape
    assert measure_candidates(func, 1, tvm_target, candidates, 1, weight_param=1)["heuristic"] > 0


def test_what_learns_or_compares_latencies_reads_only_records_timed_as_built(tmp_path):
    store, key = _store(tmp_path, 1)
    base = {"target": "x86", "task": key, "valid": True, "min_us": 5.0, "hardware": {"cores": 1}}
    store.writer("x86", "run").append([base | {"min_us": 9.0}, base | {"weights": "as-built"},
                                       base | {"task": "nothing-to-pack", "min_us": 7.0}])
    assert len(list(store.records("x86"))) == 3
    kept = list(store.records("x86", as_built=True))
    assert [(r["task"], r["min_us"]) for r in kept] == [(key, 5.0), ("nothing-to-pack", 7.0)]


def test_the_gap_report_compares_the_rules_with_random_programs_in_each_setting(tmp_path):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("gap", Path(__file__).parent.parent / "bench" / "x86_as_built_gap.py")
    gap = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gap)
    store, key = _store(tmp_path, 1)
    base = {"target": "x86", "task": key, "valid": True, "hardware": {"cores": 1}}
    rows = [base | {"chosen_by": "random", "min_us": 10.0 + i} for i in range(8)]
    rows += [base | {"chosen_by": "heuristic", "min_us": 20.0}]
    rows += [r | {"weights": "as-built", "min_us": r["min_us"] / 4} for r in rows[:8]]
    rows += [base | {"chosen_by": "heuristic", "min_us": 2.0, "weights": "as-built"}]
    store.writer("x86", "run").append(rows)
    result = gap.summary(store, 1)
    assert result["as_built"] == {"tasks": 1, "rules_over_best_random": 0.8, "rules_beat_every_random": 1,
                                  "median_random_over_best": 1.4}
    assert result["both_settings"]["plain_rules_over_best_random"] == 2.0
    assert result["both_settings"]["rules_plain_over_as_built"] == 10.0
