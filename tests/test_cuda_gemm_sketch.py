"""The appended CUDA GEMM sketches (schedule/cuda_gemm_sketch.py) and the cuda-gemm rule that
picks them: append-only indexes, legal points, the rule's choice per shape, and the CUDA TVM
generates from them (float4 / cp.async). Numerical results need a GPU: bench/gpu_gemm.py checks
every built GEMM against fp64 there."""

from __future__ import annotations

import random
import subprocess

import pytest

from tlmpack.lower.cuda import find_nvcc

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found: the cuda target cannot be built here")


def _matmul(m: int, k: int, n: int, bias: bool = False, batch: int = 0):
    from tvm import te

    lead = (batch,) if batch else ()
    a = te.placeholder((*lead, m, k), name="A")
    b = te.placeholder((*lead, k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((*lead, m, n), lambda *ij: te.sum(a[(*ij[:-1], r)] * b[(*ij[:-2], r, ij[-1])], axis=r), name="C")
    if not bias:
        return te.create_prim_func([a, b, c])
    bb = te.placeholder((n,), name="bias")
    d = te.compute((*lead, m, n), lambda *ij: te.max(c[ij] + bb[ij[-1]], 0.0), name="D")
    return te.create_prim_func([a, b, bb, d])


@pytest.fixture(scope="module")
def tvm_target():
    from tvm.target import Target

    from tlmpack.lower.cuda import MAX_SHARED_MEMORY_PER_BLOCK, MAX_THREADS_PER_BLOCK

    return Target({"kind": "cuda", "arch": "sm_90", "max_shared_memory_per_block": MAX_SHARED_MEMORY_PER_BLOCK,
                   "max_threads_per_block": MAX_THREADS_PER_BLOCK}, host={"kind": "llvm"})


@pytest.fixture(scope="module")
def hw():
    from tlmpack.schedule.hardware import cuda_hardware

    return cuda_hardware("sm_90")


def _space(func, tvm_target):
    from tlmpack.schedule.space import DesignSpace

    return DesignSpace(func, tvm_target)


def _ours(space) -> list[int]:
    return [i for i in range(len(space.sketches)) if "StorageAlign" in space.steps(i)]


def test_gemm_sketches_come_after_metaschedules_and_leave_their_indexes_alone(tvm_target, monkeypatch):
    from tlmpack.schedule import cuda_gemm_sketch

    func = _matmul(128, 768, 768)
    space = _space(func, tvm_target)
    monkeypatch.setattr(cuda_gemm_sketch, "gemm_sketches", lambda mod, f, async_copy=True: [])
    before = _space(func, tvm_target)
    n = len(before.sketches)
    assert len(space.sketches) == n + 2
    assert _ours(space) == [n, n + 1]
    assert any(step.startswith("RFactor") for step in space.steps(n + 1))
    for i in range(n):
        assert space.steps(i) == before.steps(i)
        assert space.sites(i) == before.sites(i)


def test_only_gemms_get_the_sketches(tvm_target):
    from tvm import te

    x = te.placeholder((1, 8, 16, 16), name="X")
    w = te.placeholder((8, 8, 3, 3), name="W")
    rc, ry, rx = te.reduce_axis((0, 8)), te.reduce_axis((0, 3)), te.reduce_axis((0, 3))
    conv = te.compute((1, 8, 14, 14), lambda n, f, y, z: te.sum(x[n, rc, y + ry, z + rx] * w[f, rc, ry, rx],
                                                                axis=[rc, ry, rx]), name="conv")
    assert _ours(_space(te.create_prim_func([x, w, conv]), tvm_target)) == []
    assert len(_ours(_space(_matmul(64, 256, 128, batch=4), tvm_target))) == 2
    assert len(_ours(_space(_matmul(128, 768, 768, bias=True), tvm_target))) == 2


@pytest.mark.parametrize("shape,split", [((4096, 4096, 4096), False), ((2048, 768, 3072), False),
                                         ((128, 768, 768), True), ((128, 3072, 768), True),
                                         ((128, 11008, 4096), True)])
def test_rules_pick_the_gemm_sketch_and_split_k_for_small_grids(shape, split, tvm_target, hw):
    from tlmpack.schedule.select import schedule_with_rules

    func = _matmul(*shape)
    choice = schedule_with_rules(func, tvm_target, "cuda", hw)
    space = _space(func, tvm_target)
    assert choice.rule == "cuda-gemm"
    assert choice.sketch in _ours(space)
    assert any(s.startswith("RFactor") for s in space.steps(choice.sketch)) == split
    m_tile, n_tile = choice.decisions[0].value, choice.decisions[1].value
    assert m_tile[2] * n_tile[2] >= 16  # register tiles of at least 16 accumulators


def test_rule_points_are_legal_for_the_space_builder_and_replay_from_the_record(tvm_target, hw):
    from tlmpack.schedule.select import schedule_with_rules
    from tlmpack.schedule.space import fixed_decider, legal_values

    for shape in ((128, 768, 2304), (128, 4096, 4096), (2048, 768, 3072)):
        func = _matmul(*shape)
        choice = schedule_with_rules(func, tvm_target, "cuda", hw)
        space = _space(func, tvm_target)
        sites = space.sites(choice.sketch)
        assert len(sites) == len(choice.decisions)
        for site, decision in zip(sites, choice.decisions, strict=True):
            assert decision.kind == site.kind
            assert decision.value in legal_values(site)
        again = space.replay(choice.sketch, fixed_decider(choice.decisions))
        assert again is not None and again[1] == choice.decisions


def test_random_legal_points_of_the_gemm_sketches_replay_or_are_refused_cleanly(tvm_target):
    from tlmpack.training.sample import sample_point

    space = _space(_matmul(128, 768, 768, bias=True), tvm_target)
    rng = random.Random(0)
    for sketch in _ours(space):
        points = [sample_point(space, rng, sketch) for _ in range(6)]
        assert any(p is not None for p in points)


def test_disabling_cuda_gemm_gives_the_old_rule(tvm_target, hw):
    from tlmpack.schedule.select import schedule_with_rules

    choice = schedule_with_rules(_matmul(128, 768, 768), tvm_target, "cuda", hw, disabled=frozenset({"cuda-gemm"}))
    assert choice.rule == "cuda-matmul" and choice.sketch == 0


@needs_nvcc
@pytest.mark.parametrize("shape,bias", [((128, 3072, 768), True), ((2048, 768, 3072), False)])
def test_generated_cuda_has_16_byte_cp_async_and_compiles(shape, bias, tvm_target, hw, tmp_path):
    from tlmpack.lower.cuda import cuda_target, generate
    from tlmpack.schedule.select import schedule_with_rules

    func = _matmul(*shape, bias=bias)
    choice = schedule_with_rules(func, tvm_target, "cuda", hw)
    target = cuda_target(("sm_90",))
    source, launches = generate({"t": choice.func.with_attr("tirx.is_scheduled", True)}, target)
    assert "cp.async.cg.shared.global" in source and "cp_async_legacy_cg_16" in source  # float4 = 16 bytes
    assert "cp.async.wait_group" in source and "cp.async.commit_group" in source
    expected = 2 if shape[0] == 128 else 1  # split-K: partial sums, then their sum (+ bias, relu)
    assert len(launches["t"].launches) == expected
    cu = tmp_path / "gemm.cu"
    cu.write_text(source)
    subprocess.run([target.nvcc, "-cubin", "-arch=sm_90", "-O3", "-std=c++17", "-w", "-o", str(tmp_path / "g.cubin"),
                    str(cu)], check=True, capture_output=True)


@needs_nvcc
def test_no_cp_async_below_sm_80(hw):
    from tvm.target import Target

    from tlmpack.lower.cuda import cuda_target, generate
    from tlmpack.schedule.hardware import cuda_hardware
    from tlmpack.schedule.select import schedule_with_rules

    target75 = Target({"kind": "cuda", "arch": "sm_75", "max_shared_memory_per_block": 48 * 1024,
                       "max_threads_per_block": 1024}, host={"kind": "llvm"})
    choice = schedule_with_rules(_matmul(2048, 768, 3072), target75, "cuda", cuda_hardware("sm_75"))
    source, _ = generate({"t": choice.func.with_attr("tirx.is_scheduled", True)}, cuda_target(("sm_75",)))
    assert "cp.async.cg.shared.global" not in source


def _activation_by_weight(batch: int, m: int, k: int, n: int):
    """An ONNX MatMul of a [batch, rows, K] activation by a [K, N] weight, plus bias: the weight
    ignores two loops (batch and rows): rows are M, batch goes to the grid."""
    from tvm import te

    a = te.placeholder((batch, m, k), name="A")
    w = te.placeholder((k, n), name="W")
    bias = te.placeholder((n,), name="bias")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((batch, m, n), lambda b, i, j: te.sum(a[b, i, r] * w[r, j], axis=r), name="C")
    d = te.compute((batch, m, n), lambda b, i, j: c[b, i, j] + bias[j], name="D")
    return te.create_prim_func([a, w, bias, d])


@pytest.mark.parametrize("batch", [1, 16])
def test_a_weight_that_ignores_batch_and_rows_is_a_batched_gemm(batch, tvm_target, hw):
    from tlmpack.schedule.cuda_gemm_sketch import gemm_loops
    from tlmpack.schedule.heuristics.classify import classify
    from tlmpack.schedule.select import schedule_with_rules
    from tlmpack.schedule.space import fixed_decider

    func = _activation_by_weight(batch, 128, 768, 768)
    assert gemm_loops(classify(func))[:3] == (1, 2, (0,))
    space = _space(func, tvm_target)
    assert len(_ours(space)) == 2
    choice = schedule_with_rules(func, tvm_target, "cuda", hw)
    assert choice.rule == "cuda-gemm" and choice.sketch in _ours(space)
    m_tile = choice.decisions[0].value
    assert m_tile[0] * m_tile[1] * m_tile[2] == 128
    again = space.replay(choice.sketch, fixed_decider(choice.decisions))
    assert again is not None and again[1] == choice.decisions


@pytest.mark.parametrize("shape,threads", [((4096, 4096, 4096), 256), ((2048, 768, 3072), 256),
                                           ((128, 4096, 11008), 256), ((128, 768, 768), None)])
def test_gemms_with_many_outputs_get_256_thread_blocks(shape, threads, tvm_target, hw, monkeypatch):
    """Measured on the H200 (BENCHMARKS.md 2026-12-01 15:00): 256-thread blocks from 2^19 outputs."""
    from tlmpack.schedule.heuristics.classify import classify
    from tlmpack.schedule.heuristics.cuda_gemm import MANY_OUTPUTS, plan

    monkeypatch.delenv("TLMPACK_CUDA_GEMM_MIN_THREADS", raising=False)
    m, k, n = shape
    chosen = plan(classify(_matmul(m, k, n)), hw)
    if threads is None:
        assert m * n < MANY_OUTPUTS and chosen["ty"] * chosen["tx"] >= 64
    else:
        assert chosen["ty"] * chosen["tx"] == threads
