"""The ``ranked`` scheduler (schedule/ranked.py) and its cost model (tlm/cost_model.py, training/cost_model.py):
the weights round-trip and refuse what is not theirs, inference agrees with training's scoring, a CUDA
build's ranked picks are legal, deterministic, recorded with the cost model's id, and compile with nvcc."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_heuristics_cuda import _model, model_graph, needs_nvcc
from tlmpack.tlm.cost_model import CostModel, CostModelUnavailable, cost_model_path, load_file, save


def _random_model(seed: int = 0, seeds: int = 2) -> CostModel:
    rng = np.random.default_rng(seed)
    nets = tuple(tuple((rng.standard_normal((o, i)), rng.standard_normal(o)) for i, o in ((164, 8), (8, 8), (8, 1)))
                 for _ in range(seeds))
    return CostModel(nets, rng.standard_normal(164), rng.random(164) + 0.5, "cuda")


def _programs(seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, 164)).astype(np.float32) for n in (1, 3, 2, 5)]


def test_weights_round_trip_with_their_id(tmp_path):
    model = _random_model()
    path = tmp_path / "c.safetensors"
    sha = save(model, path, {"groups": 3})
    loaded = load_file(path, "cuda")
    assert loaded.sha256 == sha and loaded.id == f"cost-cuda-{sha[:12]}"
    assert loaded.to_json()["training"] == {"groups": 3}
    np.testing.assert_allclose(loaded.score(_programs()), model.score(_programs()), rtol=1e-5, atol=1e-5)


def test_a_file_that_is_not_a_cost_model_is_refused(tmp_path):
    from tlmpack.tlm.model import weights_path

    with pytest.raises(CostModelUnavailable, match="not installed"):
        load_file(tmp_path / "missing.safetensors", "cuda")
    with pytest.raises(CostModelUnavailable, match="not a cost model"):
        load_file(weights_path("cuda"), "cuda")  # the TLM's weights


def test_a_score_is_a_sum_over_the_programs_stores():
    model = _random_model()
    a, b = _programs()[1], _programs()[3]
    joined = model.score([np.concatenate([a, b])])[0]
    assert joined == pytest.approx(model.score([a])[0] + model.score([b])[0], rel=1e-9)


def test_training_scores_what_inference_scores():
    """The torch MLPs training fits and the numpy model a build loads rank programs alike."""
    import torch

    from tlmpack.training.cost_model import _summed_scores, train

    rng = np.random.default_rng(0)
    groups = [(f"t{i}", [rng.standard_normal((int(rng.integers(1, 4)), 164)).astype(np.float32) for _ in range(6)],
               np.log(rng.random(6) + 0.1)) for i in range(4)]
    model = train(groups, seeds=1, epochs=2, hidden=16, target="cuda")
    net = torch.nn.Sequential(torch.nn.Linear(164, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU(),
                              torch.nn.Linear(16, 1))
    with torch.no_grad():
        for layer, (w, b) in zip([m for m in net if isinstance(m, torch.nn.Linear)], model.nets[0], strict=True):
            layer.weight.copy_(torch.tensor(w))
            layer.bias.copy_(torch.tensor(b))
        expected = _summed_scores(net, groups[0][1], model.mean, model.std).numpy()
    np.testing.assert_allclose(model.score(groups[0][1]), expected, rtol=1e-4, atol=1e-4)


def test_ranked_is_cuda_only_and_x86_builds_take_the_tlm():
    from tlmpack.schedule.select import scheduler_for

    assert scheduler_for("cuda", "ranked") == "ranked"
    assert scheduler_for("x86", "ranked") == "tlm"
    assert scheduler_for("x86", "ranked", cross_cpu=True) == "tlm"


def test_the_cuda_cost_model_ships_in_the_package():
    model = load_file(cost_model_path("cuda"), "cuda")
    assert model.to_json()["training"]["groups"] > 100
    assert cost_model_path("cuda").stat().st_size < 50e6


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return model_graph(tmp_path_factory.mktemp("ranked"))


@pytest.fixture(scope="module")
def ranked(graph):
    from tlmpack.lower.cuda import cuda_target
    from tlmpack.schedule.select import schedule_cuda_tasks

    target = cuda_target(())
    return target, schedule_cuda_tasks(graph, target, scheduler="ranked")


def test_ranked_candidates_are_distinct_legal_points_rules_first(graph):
    from tlmpack.lower.cuda import cuda_target
    from tlmpack.schedule.hardware import cuda_hardware
    from tlmpack.schedule.ranked import candidates
    from tlmpack.schedule.space import DesignSpace, fixed_decider

    tvm_target = cuda_target(()).tvm_target()
    task = next(t for t in graph.tasks if "matmul" in t.name)
    func = graph.task_funcs[task.id]
    found, _ = candidates(func, tvm_target, "cuda", cuda_hardware("sm_90"), task.name)
    assert found[0].source == "rules" and len(found) > 8
    assert len({(c.sketch, c.decisions) for c in found}) == len(found)
    space = DesignSpace(func, tvm_target)
    for c in found:
        replayed = space.replay(c.sketch, fixed_decider(c.decisions), locations=True)
        assert replayed is not None and tuple(replayed[1]) == c.decisions, c.source


def test_a_ranked_build_records_its_picks_and_the_cost_model(ranked):
    _, (funcs, records, tlm_json) = ranked
    assert set(funcs) == {r.task for r in records}
    assert {r.chosen_by for r in records} <= {"ranked", "heuristic", "dlight"}
    ranked_notes = [r.note for r in records if r.chosen_by in ("ranked", "heuristic")]
    assert ranked_notes and all(n.startswith("cost-cuda-") and "candidates" in n for n in ranked_notes)
    assert tlm_json["cost_model"]["id"].startswith("cost-cuda-") and tlm_json["id"].startswith("tlm-cuda-")


def test_two_ranked_schedulings_pick_the_same_points(graph, ranked):
    from tlmpack.schedule.select import schedule_cuda_tasks

    target, (_, records, _) = ranked
    again = schedule_cuda_tasks(graph, target, scheduler="ranked")[1]
    assert [(r.task, r.sketch, r.decisions, r.note) for r in again] == [(r.task, r.sketch, r.decisions, r.note)
                                                                       for r in records]


def test_worker_processes_pick_what_one_process_picks(graph):
    """A build ranks its tasks in worker processes where it has the CPUs: the same picks, in order."""
    import tvm

    from tlmpack.lower.cuda import cuda_target
    from tlmpack.schedule.hardware import cuda_hardware
    from tlmpack.schedule.ranked import rank_tasks

    tasks = [(graph.task_funcs[t.id], t.name) for t in graph.tasks[:3]]
    args = (cuda_target(()).tvm_target(), "cuda", cuda_hardware("sm_90"))
    alone, workers = list(rank_tasks(tasks, *args, jobs=1)), list(rank_tasks(tasks, *args, jobs=2))
    assert len(alone) == len(workers) == len(tasks) and any(p is not None for p in alone)
    for a, w in zip(alone, workers, strict=True):
        assert (a is None) == (w is None)
        if a is not None:
            assert (w.candidate.source, w.candidate.sketch, w.candidate.decisions, w.note) == (
                a.candidate.source, a.candidate.sketch, a.candidate.decisions, a.note)
            tvm.ir.assert_structural_equal(w.candidate.func, a.candidate.func)


def test_a_worker_that_dies_is_a_one_line_build_error():
    from tlmpack.errors import TlmpackBuildError
    from tlmpack.schedule.rank_worker import Workers

    with Workers(1, ("not settings",), [(None, "conv")]) as workers:  # rank_for_worker cannot unpack them
        with pytest.raises(TlmpackBuildError, match=r"ranking worker exited with code 1 before task 'conv': ValueError"):
            list(workers.results())


def test_build_jobs_reads_the_host_or_tlmpack_jobs(monkeypatch):
    from tlmpack.errors import TlmpackBuildError
    from tlmpack.schedule import ranked

    monkeypatch.setenv(ranked.JOBS_ENV, "3")
    assert ranked.build_jobs(100) == 3
    assert ranked.build_jobs(ranked.TASKS_PER_WORKER) == 1  # too few tasks to pay for a worker's start
    monkeypatch.delenv(ranked.JOBS_ENV)
    monkeypatch.setattr("tlmpack.schedule.hardware.host_cores", lambda: 5)
    assert ranked.build_jobs(100) == 5
    for bad in ("two", "0", "-1"):
        monkeypatch.setenv(ranked.JOBS_ENV, bad)
        with pytest.raises(TlmpackBuildError, match="TLMPACK_JOBS"):
            ranked.build_jobs(100)


@needs_nvcc
def test_ranked_kernels_compile(ranked, tmp_path):
    from tlmpack.lower.cuda import build_kernels

    target, (funcs, _, _) = ranked
    kernels = build_kernels(funcs, target, tmp_path)
    assert set(kernels.launches) == set(funcs)


def test_without_a_cost_model_the_rules_schedule_and_say_why(graph, monkeypatch, tmp_path):
    from tlmpack.lower.cuda import cuda_target
    from tlmpack.schedule.select import schedule_cuda_tasks
    from tlmpack.tlm import cost_model

    monkeypatch.setattr(cost_model, "cost_model_path", lambda target: tmp_path / "none.safetensors")
    cost_model.load.cache_clear()
    try:
        _, records, _ = schedule_cuda_tasks(graph, cuda_target(()), scheduler="ranked")
    finally:
        cost_model.load.cache_clear()
    assert all(r.note.startswith("ranked fallback: no cost model for cuda") for r in records if r.chosen_by != "ranked")
    assert not any(r.chosen_by == "ranked" for r in records)


def test_cost_model_command_smoke_trains_a_loadable_file(tmp_path):
    from click.testing import CliRunner

    from tlmpack.training.cli import tlm

    out = tmp_path / "c.safetensors"
    result = CliRunner().invoke(tlm, ["cost-model", "--target", "cuda", "--smoke", "--jobs", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    model = load_file(out, "cuda")
    assert len(model.nets) == 1 and model.to_json()["training"]["groups"] >= 1


@needs_nvcc
def test_two_ranked_builds_in_fresh_processes_are_byte_identical(tmp_path):
    import subprocess
    import sys

    onnx_path = tmp_path / "model.onnx"
    _model(onnx_path)
    tars = []
    for name in ("a.tar", "b.tar"):
        out = tmp_path / name
        subprocess.run([sys.executable, "-m", "tlmpack.cli", "build", str(onnx_path), "-t", "cuda", "--scheduler",
                        "ranked", "-o", str(out)], check=True, capture_output=True, timeout=900)
        tars.append(out.read_bytes())
    assert tars[0] == tars[1]
