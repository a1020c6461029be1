"""Task classification and hardware descriptions for the compile-time heuristics."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tasks(zoo_dir):
    from tlmpack import zoo
    from tlmpack.frontend import load_model
    from tlmpack.graph import fuse_to_tir, partition

    found = {}
    for name in ("bert-tiny", "resnet-tiny"):
        path = zoo_dir / f"{name}-classify.onnx"
        zoo.export_onnx(name, path)
        graph = partition(fuse_to_tir(load_model(str(path)).mod))
        found.update({t.name: graph.task_funcs[t.id] for t in graph.tasks})
    return found


def test_dense_is_matmul_with_its_weight_reused_across_rows(tasks):
    from tlmpack.schedule.heuristics.classify import classify

    c = classify(tasks["fused_matmul_add2"])
    assert c.kind == "matmul" and c.spatial == (1, 32, 128) and c.reduction == (128,)
    assert c.reuse["param_0"] == (0, 1)  # the weight ignores batch and sequence: reused by every row


def test_conv2d_is_matmul_reducing_over_channels_and_window(tasks):
    from tlmpack.schedule.heuristics.classify import classify

    c = classify(tasks["fused_conv2d1_add1_relu1"])
    assert c.kind == "matmul" and c.spatial == (1, 16, 56, 56) and c.reduction == (16, 3, 3)


def test_layer_norm_and_softmax_are_reductions_with_row_length(tasks):
    from tlmpack.schedule.heuristics.classify import classify

    assert classify(tasks["layer_norm"]).kind == "reduce"
    softmax = classify(tasks["softmax"])
    assert softmax.kind == "reduce" and softmax.row_length == 32 and softmax.rows == 64


def test_transpose_is_pointwise(tasks):
    from tlmpack.schedule.heuristics.classify import classify

    assert classify(tasks["transpose"]).kind == "pointwise"


def test_hardware_descriptions():
    from tlmpack.schedule.hardware import cuda_hardware, detect_x86

    x86 = detect_x86(("avx2", "fma"), cores=4)
    assert x86.cores == 4 and x86.lanes(32) == 8 and x86.l1d_bytes > 0
    assert detect_x86(("avx512f",)).lanes(32) == 16
    assert cuda_hardware("sm_90").sm_count == 132
    with pytest.raises(ValueError, match="sm_91"):
        cuda_hardware("sm_91")
