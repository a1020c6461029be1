"""The CUDA heuristics, checked without a GPU: a small ONNX model with a dense layer, a conv, a
depthwise conv, a softmax and elementwise ops is scheduled with scheduler="heuristic"; every
cuda rule must pick at least one task (chosen_by "heuristic"), the kernels must go through TVM's
codegen and nvcc, a disabled rule's tasks must fall back to dlight, and the design space must
not import TVM's CUDA tensor intrinsics (36-50 s)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from tlmpack.lower.cuda import find_nvcc

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found: the cuda target cannot be built here")


def _model(path) -> None:
    """x[1,16,16,16] -> conv3x3(32) -> relu -> depthwise conv3x3 -> mean over HxW -> dense(64)
    -> softmax; beside it z[256,128] @ [128,512] -> a row softmax (long rows: the cross-thread
    sketch), and sigmoid(transpose(z)) (pointwise)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def weight(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.1, name)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], group=32),
        helper.make_node("ReduceMean", ["c2"], ["m"], axes=[2, 3], keepdims=0),
        helper.make_node("Gemm", ["m", "w3", "b3"], ["g"], transB=1),
        helper.make_node("Softmax", ["g"], ["y"], axis=-1),
        helper.make_node("MatMul", ["z", "w4"], ["mm"]),
        helper.make_node("Softmax", ["mm"], ["y2"], axis=-1),
        helper.make_node("Transpose", ["z"], ["t"], perm=[1, 0]),
        helper.make_node("Sigmoid", ["t"], ["y3"]),
    ]
    graph = helper.make_graph(
        nodes, "cuda_heuristics",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 16, 16]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [256, 128])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64]),
         helper.make_tensor_value_info("y2", TensorProto.FLOAT, [256, 512]),
         helper.make_tensor_value_info("y3", TensorProto.FLOAT, [128, 256])],
        [weight("w1", 32, 16, 3, 3), weight("b1", 32), weight("w2", 32, 1, 3, 3), weight("w3", 64, 32),
         weight("b3", 64), weight("w4", 128, 512)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)


def model_graph(folder):
    """_model's fused, partitioned graph (written into ``folder``)."""
    from tlmpack.frontend import load_model
    from tlmpack.graph import fuse_to_tir, partition

    _model(folder / "model.onnx")
    return partition(fuse_to_tir(load_model(str(folder / "model.onnx"), {}).mod))


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return model_graph(tmp_path_factory.mktemp("cuda-heuristics"))


@pytest.fixture(scope="module")
def target():
    from tlmpack.lower.cuda import cuda_target

    return cuda_target(())


@pytest.fixture(scope="module")
def heuristic(graph, target):
    from tlmpack.schedule.select import schedule_cuda_tasks

    return schedule_cuda_tasks(graph, target, scheduler="heuristic")[:2]


@needs_nvcc
def test_every_rule_schedules_a_task_and_nvcc_compiles(heuristic, target, tmp_path):
    from tlmpack.lower.cuda import build_kernels

    funcs, records = heuristic
    by_rule = {r.note for r in records if r.chosen_by == "heuristic"}
    assert {"cuda-matmul", "cuda-reduction", "cuda-pointwise"} <= by_rule, [(r.task, r.chosen_by, r.note) for r in records]
    assert sum(r.chosen_by == "heuristic" for r in records) >= len(records) - 1  # the GEMV-like dense may go to dlight
    for r in records:
        if r.chosen_by == "heuristic":
            assert r.sketch >= 0 and r.decisions
    kernels = build_kernels(funcs, target, tmp_path)
    assert (tmp_path / "sm_90.cubin").stat().st_size > 0
    assert set(kernels.launches) == set(funcs)
    for tl in kernels.launches.values():
        for launch in tl.launches:
            assert launch.block[0] * launch.block[1] * launch.block[2] <= 1024


@needs_nvcc
def test_disabled_rule_falls_back_to_dlight(graph, target, heuristic, monkeypatch):
    from tlmpack.schedule.select import schedule_cuda_tasks

    _, records = heuristic
    reduced = {r.task for r in records if r.note == "cuda-reduction"}
    monkeypatch.setenv("TLMPACK_DISABLE_RULES", "cuda-reduction")
    _, again, _ = schedule_cuda_tasks(graph, target, scheduler="heuristic")
    for r in again:
        if r.task in reduced:
            assert r.chosen_by == "dlight", r
        assert r.note != "cuda-reduction"


@needs_nvcc
def test_cuda_space_needs_no_tensor_core_intrinsics(graph, target):
    from tlmpack.schedule.space import DesignSpace

    func = graph.task_funcs[graph.tasks[0].id]
    space = DesignSpace(func, target.tvm_target())
    assert space.sketches
    assert "tvm.s_tir.tensor_intrin.cuda" not in sys.modules


def test_matmul_plan_respects_the_hardware():
    from tlmpack.schedule.hardware import cuda_hardware
    from tlmpack.schedule.heuristics.classify import TaskClass
    from tlmpack.schedule.heuristics.cuda_matmul import plan

    hw = cuda_hardware("sm_90")
    big = TaskClass("matmul", "matmul", (1, 128, 3072), (768,), {"A": (2,), "B": (0, 1)})
    tiles, stage, _ = plan(big, hw)
    threads = np.prod([t[2] for t in tiles.values()])
    accumulators = np.prod([t[1] * t[3] * t[4] for t in tiles.values()])
    blocks = np.prod([t[0] for t in tiles.values()])
    assert 64 <= threads <= 512 and accumulators <= 64
    assert blocks >= hw.sm_count  # no idle SMs
    assert 8 <= np.prod(stage) <= 16
