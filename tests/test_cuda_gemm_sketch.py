"""The appended CUDA GEMM sketches (schedule/cuda_gemm_sketch.py) and the cuda-gemm rule that
picks them: append-only indexes, legal points, the rule's choice per shape, and the CUDA TVM
generates from them (float4 / cp.async). Numerical results need a GPU: bench/gpu_gemm.py checks
every built GEMM against fp64 there."""

from __future__ import annotations

import random
import re
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


def _conv(n: int, ci: int, co: int, hw: int, k: int, stride: int = 1, epilogue: bool = False):
    """An NCHW convolution as Relax legalizes it (topi: a pad_temp block, then the reduction),
    optionally with a bias and ReLU epilogue (a folded batch norm)."""
    from tvm import te, topi

    x = te.placeholder((n, ci, hw * stride, hw * stride), name="X")
    w = te.placeholder((co, ci, k, k), name="W")
    c = topi.nn.conv2d_nchw(x, w, stride, k // 2, 1)
    if not epilogue:
        return te.create_prim_func([x, w, c])
    b = te.placeholder((1, co, 1, 1), name="bias")
    d = te.compute(c.shape, lambda i, j, y, z: te.max(c[i, j, y, z] + b[0, j, 0, 0], 0.0), name="D")
    return te.create_prim_func([x, w, b, d])


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


def test_only_gemms_and_convolutions_get_the_sketches(tvm_target):
    from tvm import te, topi

    x = te.placeholder((1, 8, 16, 16), name="X")
    w = te.placeholder((8, 1, 3, 3), name="W")
    depthwise = topi.nn.depthwise_conv2d_nchw(x, w, 1, 1, 1)  # channels are batch loops: no GEMM
    assert _ours(_space(te.create_prim_func([x, w, depthwise]), tvm_target)) == []
    assert len(_ours(_space(_conv(1, 8, 8, 14, 3), tvm_target))) == 2
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


def _matmul_gelu(m: int, k: int, n: int, batch: int = 1):
    """ONNX BERT's FFN up-projection as Relax legalizes it: [batch, m, k] x [k, n] + bias, then
    erf-GELU, whose blocks read the biased product twice (x / sqrt 2 and x * (1 + erf))."""
    from tvm import te, topi

    a = te.placeholder((batch, m, k), name="A")
    w = te.placeholder((k, n), name="W")
    bias = te.placeholder((n,), name="bias")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((batch, m, n), lambda b, i, j: te.sum(a[b, i, r] * w[r, j], axis=r), name="matmul")
    x = topi.add(c, bias)
    gelu = topi.multiply(topi.multiply(x, topi.add(topi.fast_erf(topi.divide(x, 1.4142135)), 1.0)), 0.5)
    return te.create_prim_func([a, w, bias, gelu])


@needs_nvcc
@pytest.mark.parametrize("shape", [(1, 128, 768, 3072), (16, 128, 768, 3072), (1, 2048, 768, 3072)])
def test_a_gelu_epilogue_that_reads_its_input_twice_goes_into_the_gemms_write_back(shape, tvm_target, hw):
    from tlmpack.lower.cuda import cuda_target, generate
    from tlmpack.schedule.select import schedule_with_rules

    batch, m, k, n = shape
    choice = schedule_with_rules(_matmul_gelu(m, k, n, batch), tvm_target, "cuda", hw)
    assert choice.rule == "cuda-gemm"  # was cuda-matmul: the chain's first inline orphaned x's second read
    source, launches = generate({"t": choice.func.with_attr("tirx.is_scheduled", True)}, cuda_target(("sm_90",)))
    split = any(s.startswith("RFactor") for s in _space(_matmul_gelu(m, k, n, batch), tvm_target).steps(choice.sketch))
    assert len(launches["t"].launches) == (2 if split else 1)  # the epilogue runs in the write-back
    assert "cp_async_legacy_cg_16" in source


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


def test_a_convolution_is_an_implicit_gemm_of_weight_by_padded_input():
    from tlmpack.schedule.cuda_gemm_sketch import conv_loops, gemm_axes, gemm_loops
    from tlmpack.schedule.heuristics.classify import classify
    from tlmpack.schedule.heuristics.cuda_gemm import gemm_extents

    func = _conv(1, 256, 512, 7, 3)
    task = classify(func)
    assert gemm_loops(task) is None
    # M = co; batch n; N = (h, w); A = W, B = pad_temp
    assert conv_loops(task) == (1, (0,), (2, 3), "W", "pad_temp")
    assert gemm_extents(task) == (512, 49, 256 * 9, 1)
    assert gemm_axes(func)[1:] == (1, 2, {"A": "W", "B": "pad_temp"}, (0, 1, 2, 3))
    assert gemm_extents(classify(_conv(16, 64, 256, 56, 1))) == (256, 56 * 56, 64, 16)


def test_conv_block_tiles_lie_in_whole_rows_or_images_and_k_steps_in_whole_windows():
    from tlmpack.schedule.heuristics.cuda_gemm import _conv_bk, _conv_tile_ok

    assert _conv_tile_ok(112, (56, 56)) and _conv_tile_ok(8, (56, 56)) and _conv_tile_ok(196, (14, 14))
    assert not _conv_tile_ok(64, (56, 56))  # rows of 56 split 64 by 64: the staged box is not constant
    assert _conv_tile_ok(49, (7, 7)) and not _conv_tile_ok(56, (7, 7))
    assert all(bk % 9 == 0 for bk in _conv_bk(9)) and 36 in _conv_bk(9)
    assert _conv_bk(1) == (32, 16, 8, 4)


@pytest.mark.parametrize("n,ci,co,hw,k,split", [(1, 256, 256, 14, 3, True), (1, 512, 512, 7, 3, True),
                                                (1, 2048, 512, 7, 1, True), (16, 64, 256, 56, 1, False),
                                                (16, 256, 256, 14, 3, True)])
def test_rules_pick_the_gemm_sketches_for_resnet_convolutions(n, ci, co, hw, k, split, tvm_target):
    from tlmpack.schedule.hardware import cuda_hardware
    from tlmpack.schedule.select import schedule_with_rules
    from tlmpack.schedule.space import fixed_decider, legal_values

    hardware = cuda_hardware("sm_90")
    func = _conv(n, ci, co, hw, k, epilogue=True)
    choice = schedule_with_rules(func, tvm_target, "cuda", hardware)
    space = _space(func, tvm_target)
    assert choice.rule == "cuda-gemm" and choice.sketch in _ours(space)
    assert any(s.startswith("RFactor") for s in space.steps(choice.sketch)) == split
    for site, decision in zip(space.sites(choice.sketch), choice.decisions, strict=True):
        assert decision.value in legal_values(site)
    n_tile = choice.decisions[1].value
    assert (n_tile[1] * n_tile[2]) % hw == 0 or hw % (n_tile[1] * n_tile[2]) == 0
    again = space.replay(choice.sketch, fixed_decider(choice.decisions))
    assert again is not None and again[1] == choice.decisions


def test_disabling_cuda_gemm_gives_convolutions_the_old_rule(tvm_target, hw):
    from tlmpack.schedule.select import schedule_with_rules

    choice = schedule_with_rules(_conv(1, 256, 256, 14, 3), tvm_target, "cuda", hw, disabled=frozenset({"cuda-gemm"}))
    assert choice.rule == "cuda-matmul" and choice.sketch == 0


def test_a_convolution_the_plan_cannot_stage_falls_back_to_cuda_matmul(tvm_target, hw):
    """A strided 1x1 convolution stages a box of its input twice as wide as the tile the SM model
    counts: over the shared-memory limit, the GEMM sketches are refused and the old rule takes it."""
    from tlmpack.schedule.select import schedule_with_rules

    choice = schedule_with_rules(_conv(1, 256, 512, 28, 1, stride=2), tvm_target, "cuda", hw)
    assert choice.rule == "cuda-matmul" and choice.sketch == 0


@needs_nvcc
@pytest.mark.parametrize("k,hw_,split", [(3, 14, True), (1, 56, False)])
def test_generated_conv_cuda_stages_the_padded_input_and_compiles(k, hw_, split, tvm_target, hw, tmp_path):
    from tlmpack.lower.cuda import cuda_target, generate
    from tlmpack.schedule.select import schedule_with_rules

    func = _conv(1, 256, 256, hw_, k, epilogue=True) if split else _conv(1, 64, 256, hw_, k, epilogue=True)
    choice = schedule_with_rules(func, tvm_target, "cuda", hw)
    assert choice.rule == "cuda-gemm"
    target = cuda_target(("sm_90",))
    source, launches = generate({"t": choice.func.with_attr("tirx.is_scheduled", True)}, target)
    assert "pad_temp_shared" in source and "W_shared" in source
    assert "cp.async" in source  # the two-stage pipeline's copies
    assert len(launches["t"].launches) == (2 if split else 1)  # the epilogue fused (into the partial sums' sum)
    cu = tmp_path / "conv.cu"
    cu.write_text(source)
    done = subprocess.run([target.nvcc, "-cubin", "-arch=sm_90", "-O3", "-std=c++17", "-w", "-Xptxas", "-v", "-o",
                           str(tmp_path / "c.cubin"), str(cu)], check=True, capture_output=True, text=True)
    # the accumulators are registers: with h and w apart they were a local-memory array (5x slower)
    frames = re.findall(r"(\d+) bytes stack frame", done.stderr)
    assert frames and all(f == "0" for f in frames)


def test_a_tlm_of_an_older_space_is_not_offered_a_convolutions_implicit_gemm_sketches(tvm_target):
    """They came with space version 2: weights trained before it have no sentence of them."""
    conv = _space(_conv(1, 256, 64, 56, 1), tvm_target)
    assert conv.sketches_after(1) == tuple(_ours(conv)) and len(conv.sketches_after(1)) == 2
    assert conv.sketches_after(2) == ()
    assert _space(_matmul(128, 768, 768), tvm_target).sketches_after(1) == ()
