"""The x86 channels-last path leaves no layout churn inside a CNN (layout_ops.py), and keeps its meaning.

Small ONNX CNNs written as TVM's importer sees MobileNetV2 and EfficientNet-B0: explicit Pad
nodes before convolutions (TF "same" padding), Clip as ReLU6 (a TIR call after import), SiLU,
and a squeeze-excite block. Built with the rules (no TLM), checked against onnxruntime.
"""

from __future__ import annotations

import json
import tarfile

import numpy as np
import pytest

from tlmpack.verify import onnxruntime_outputs, rel_err

TOLERANCE = 1e-4


def _conv(rng, name: str, x: str, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1,
          pads=(0, 0, 0, 0)) -> tuple[list, list]:
    from onnx import helper, numpy_helper

    w = (rng.standard_normal((cout, cin // groups, k, k)) / np.sqrt(cin // groups * k * k)).astype(np.float32)
    b = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    node = helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [name], strides=[stride, stride],
                            group=groups, kernel_shape=[k, k], pads=list(pads))
    return [node], [numpy_helper.from_array(w, f"{name}.w"), numpy_helper.from_array(b, f"{name}.b")]


def _pad(name: str, x: str, top: int, left: int, bottom: int, right: int, value: float = 0.0) -> tuple[list, list]:
    from onnx import helper, numpy_helper

    pads = np.array([0, 0, top, left, 0, 0, bottom, right], dtype=np.int64)
    inits = [numpy_helper.from_array(pads, f"{name}.pads"), numpy_helper.from_array(np.array(value, np.float32), f"{name}.value")]
    return [helper.make_node("Pad", [x, f"{name}.pads", f"{name}.value"], [name])], inits


def _relu6(name: str, x: str) -> tuple[list, list]:
    from onnx import helper, numpy_helper

    inits = [numpy_helper.from_array(np.array(0.0, np.float32), f"{name}.lo"),
             numpy_helper.from_array(np.array(6.0, np.float32), f"{name}.hi")]
    return [helper.make_node("Clip", [x, f"{name}.lo", f"{name}.hi"], [name])], inits


def _silu(name: str, x: str) -> tuple[list, list]:
    from onnx import helper

    return [helper.make_node("Sigmoid", [x], [f"{name}.s"]), helper.make_node("Mul", [x, f"{name}.s"], [name])], []


def _head(rng, x: str, channels: int, classes: int = 10) -> tuple[list, list]:
    from onnx import helper, numpy_helper

    w = (rng.standard_normal((channels, classes)) / np.sqrt(channels)).astype(np.float32)
    nodes = [helper.make_node("GlobalAveragePool", [x], ["pool"]), helper.make_node("Flatten", ["pool"], ["flat"]),
             helper.make_node("MatMul", ["flat", "head.w"], ["logits"])]
    return nodes, [numpy_helper.from_array(w, "head.w")]


def _save(tmp_path, name: str, parts: list[tuple[list, list]], channels_out: int = 10, size: int = 16):
    import onnx
    from onnx import TensorProto, helper

    nodes = [n for p in parts for n in p[0]]
    inits = [i for p in parts for i in p[1]]
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, channels_out])],
                              initializer=inits)
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def relu6_cnn(tmp_path):
    """MobileNetV2's shape: TF padding, a conv, ReLU6, a padded depthwise conv, ReLU6, a 1x1 conv
    with a residual add."""
    rng = np.random.default_rng(0)
    return _save(tmp_path, "relu6_cnn", [
        _pad("p0", "x", 0, 0, 1, 1), _conv(rng, "c0", "p0", 3, 16, 3, stride=2), _relu6("r0", "c0"),
        _pad("p1", "r0", 1, 1, 1, 1), _conv(rng, "c1", "p1", 16, 16, 3, groups=16), _relu6("r1", "c1"),
        _conv(rng, "c2", "r1", 16, 16, 1),
        ([__import__("onnx").helper.make_node("Add", ["c2", "r0"], ["res"])], []),
        _head(rng, "res", 16),
    ])


def silu_se_cnn(tmp_path, size: int = 16):
    """EfficientNet-B0's shape: SiLU after each conv, a depthwise conv whose output is scaled by
    a squeeze-excite block (mean, 1x1 convs, sigmoid, multiply), zero pads before every conv."""
    from onnx import helper

    rng = np.random.default_rng(1)
    se = [helper.make_node("GlobalAveragePool", ["a1"], ["se.pool"])]
    return _save(tmp_path, "silu_se_cnn", [
        _pad("p0", "x", 0, 0, 1, 1), _conv(rng, "c0", "p0", 3, 16, 3, stride=2), _silu("a0", "c0"),
        _pad("p1", "a0", 1, 1, 1, 1), _conv(rng, "c1", "p1", 16, 16, 3, groups=16), _silu("a1", "c1"),
        (se, []), _pad("p2", "se.pool", 0, 0, 0, 0), _conv(rng, "se.r", "p2", 16, 4, 1), _silu("se.a", "se.r"),
        _conv(rng, "se.e", "se.a", 4, 16, 1),
        ([helper.make_node("Sigmoid", ["se.e"], ["se.s"]), helper.make_node("Mul", ["a1", "se.s"], ["scaled"])], []),
        _pad("p3", "scaled", 0, 0, 0, 0), _conv(rng, "c2", "p3", 16, 24, 1),
        _head(rng, "c2", 24),
    ], size=size)


def _x86_graph(model_path, layout_ops: bool = True, cores: int = 0):
    from tlmpack.frontend import load_model
    from tlmpack.graph_fallbacks import Lowering, lower_graph

    graph, used, fallbacks = lower_graph(load_model(str(model_path)).mod,
                                         Lowering("NHWC", fast_math=True, layout_ops=layout_ops, cores=cores))
    assert used.conv_layout == "NHWC" and not fallbacks
    return graph


def _transposes_inside(graph) -> list[str]:
    """Transpose kernels that neither read a model input nor write a model output."""
    names = {t.id: t.name for t in graph.tasks}
    edges = set(graph.inputs) | {graph.tensors[o].base for o in graph.outputs}
    inside = []
    for call in graph.calls:
        bases = {graph.tensors[a].base for a in call.args}
        if "transpose" in names[call.task] and not bases & edges:
            inside.append(names[call.task])
    return inside


@pytest.mark.parametrize("make", [relu6_cnn, silu_se_cnn])
def test_channels_last_cnn_has_no_transpose_kernels_inside(tmp_path, make):
    model = make(tmp_path)
    assert _transposes_inside(_x86_graph(model, layout_ops=False))  # what layout_ops.py is for
    graph = _x86_graph(model)
    assert _transposes_inside(graph) == []
    names = [t.name for t in graph.tasks]
    assert not any(n.startswith("pad") or "_pad" in n for n in names), names  # pads went into the convs


def test_clip_and_silu_tails_fuse_into_their_convolutions(tmp_path):
    import re

    convs = [t.name for t in _x86_graph(relu6_cnn(tmp_path)).tasks if "conv2d" in t.name]
    clip, residual = r"fused_conv2d\d*_add\d*_maximum\d*_minimum\d*", r"fused_conv2d\d*_add\d*_add\d*"
    assert [bool(re.fullmatch(clip, n)) for n in convs] == [True, True, False], convs
    assert re.fullmatch(residual, convs[2]), convs
    convs = [t.name for t in _x86_graph(silu_se_cnn(tmp_path)).tasks if "conv2d" in t.name]
    # SiLU, or the SE scale after the excite conv; fast math writes the sigmoid through exp (fast_sigmoid.py)
    silu = r"fused_conv2d\d*_add\d*_tir_negative\d*_fast_exp\d*_add\d*_divide\d*_multiply\d*"
    assert [bool(re.fullmatch(silu, n)) for n in convs] == [True, True, True, True, False], convs


@pytest.mark.parametrize("make", [relu6_cnn, silu_se_cnn])
def test_a_channels_last_global_pool_is_a_matmul_over_the_channels(tmp_path, make):
    names = [t.name for t in _x86_graph(make(tmp_path)).tasks]
    assert not any(n.startswith("mean") for n in names), names
    matmuls = sum(n.startswith(("matmul", "fused_matmul")) for n in names)
    assert matmuls == 2 + (make is silu_se_cnn), names  # the head's MatMul, its pool, the SE block's pool


def test_a_pool_over_a_large_map_is_summed_in_parts_and_matches_onnxruntime(tmp_path):
    """A 64 x 64 map (4096 pixels, POOL_SPLIT_MIN_PIXELS) is pooled as 16 partial means, chunks of one
    batched matmul, and their sum: not one column tile on one thread."""
    import tlmpack.runtime as rt
    from tlmpack.build import BuildOptions, build
    from tlmpack.graph.layout_ops import POOL_SPLIT_MIN_PIXELS, pool_parts

    assert pool_parts(64 * 64) == 16 and pool_parts(56 * 56) == 1 and 56 * 56 < POOL_SPLIT_MIN_PIXELS
    assert pool_parts(4099) == 1  # a prime: no parts
    rng = np.random.default_rng(4)
    model = _save(tmp_path, "big_pool", [_conv(rng, "c0", "x", 3, 32, 3, pads=(1, 1, 1, 1)), _silu("a0", "c0"),
                                         _head(rng, "a0", 32)], size=64)
    names = [t.name for t in _x86_graph(model).tasks]
    assert any(n.startswith("sum") for n in names) and sum(n.startswith(("matmul", "fused_matmul")) for n in names) == 2
    tar = tmp_path / "big_pool.tar"
    build(str(model), tar, BuildOptions(scheduler="heuristic"))
    x = np.random.default_rng(5).standard_normal((1, 3, 64, 64)).astype(np.float32)
    (ref,) = onnxruntime_outputs(model, {"x": x})
    assert np.abs(ref).max() > 0 and np.isfinite(ref).all()
    (out,) = rt.load(tar).run(None, {"x": x})
    assert rel_err(out, ref) < TOLERANCE


def test_pool_parts_for_the_cores_follow_the_channel_tiles():
    """A pool whose channel tiles leave the cores unevenly busy is split until they are (EfficientNet-B0's
    squeezes on 16 AVX-512 cores); one whose tiles already fill them, or too small a map, is not."""
    from tlmpack.graph.layout_ops import chunk_balance, pool_channel_tiles, pool_parts

    assert pool_channel_tiles(96, 16) == 3 and pool_channel_tiles(144, 16) == 9 and pool_channel_tiles(144, 8) == 9
    assert chunk_balance(3, 16) == 3 / 16 and chunk_balance(42, 16) == 42 / 48 and chunk_balance(32, 16) == 1.0
    assert [pool_parts(56 * 56, 96, cores, 16) for cores in (0, 1, 2, 4, 16)] == [1, 1, 2, 4, 14]
    assert pool_parts(56 * 56, 144, 16, 16) == 7  # 9 tiles: 63 chunks, 0.98 of 16 cores busy
    assert pool_parts(28 * 28, 240, 16, 16) == 1  # 15 tiles already keep 15 of 16 cores busy
    assert pool_parts(7 * 7, 1152, 16, 16) == 1  # 49 pixels: no part of 64
    assert pool_parts(64 * 64, 32, 16, 16) == 16  # the large map's own split stands
    assert pool_parts(56 * 56, 96, 2, 8) == 1  # AVX2: 6 tiles of 16 channels keep 2 cores busy


def test_a_pool_is_split_for_many_cores_and_matches_onnxruntime(tmp_path):
    """A 16 x 16 x 48 pool is 3 column tiles: built for 16 cores it is summed in 4 parts (12 chunks), for
    this host's own cores in none, and both builds match onnxruntime."""
    import tlmpack.runtime as rt
    from tlmpack.build import BuildOptions, build

    rng = np.random.default_rng(6)
    model = _save(tmp_path, "pool48", [_conv(rng, "c0", "x", 3, 48, 3, pads=(1, 1, 1, 1)), _silu("a0", "c0"),
                                       _head(rng, "a0", 48)], size=16)
    assert any(t.name.startswith("sum") for t in _x86_graph(model, cores=16).tasks)
    assert not any(t.name.startswith("sum") for t in _x86_graph(model).tasks)
    x = np.random.default_rng(7).standard_normal((1, 3, 16, 16)).astype(np.float32)
    (ref,) = onnxruntime_outputs(model, {"x": x})
    assert np.abs(ref).max() > 0 and np.isfinite(ref).all()
    tar = tmp_path / "pool48.tar"
    manifest = build(str(model), tar, BuildOptions(scheduler="heuristic", cores=16))
    assert any(s["name"].startswith("sum") for s in manifest["subgraphs"])
    (out,) = rt.load(tar).run(None, {"x": x})
    assert rel_err(out, ref) < TOLERANCE


@pytest.mark.parametrize("make", [relu6_cnn, silu_se_cnn])
def test_channels_last_cnn_matches_onnxruntime(tmp_path, make):
    import tlmpack.runtime as rt
    from tlmpack.build import BuildOptions, build

    model = make(tmp_path)
    tar = tmp_path / "model.tar"
    manifest = build(str(model), tar, BuildOptions(scheduler="heuristic"))
    (x86,) = manifest["targets"]
    assert x86["conv_layout"] == "NHWC" and x86["layout_ops"] is True
    assert not any("transpose" in s["name"] and s["calls"] > 1 for s in manifest["subgraphs"])
    with tarfile.open(tar) as t:
        assert json.load(t.extractfile("manifest.json"))["fallbacks"] == []
    x = np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float32) * 3  # clips bite
    (ref,) = onnxruntime_outputs(model, {"x": x})
    (out,) = rt.load(tar).run(None, {"x": x})
    assert rel_err(out, ref) < TOLERANCE


def test_a_pad_that_is_not_zero_stays_a_pad(tmp_path):
    from tlmpack.frontend import load_model
    from tlmpack.graph.layout_ops import tir_calls_to_relax_ops

    rng = np.random.default_rng(3)
    model = _save(tmp_path, "pad_one", [_pad("p0", "x", 1, 1, 1, 1, value=1.0), _conv(rng, "c0", "p0", 3, 8, 3),
                                        _head(rng, "c0", 8)])
    _, counts = tir_calls_to_relax_ops(load_model(str(model)).mod)
    assert counts["pad-into-conv"] == 0


def test_a_failing_layout_rewrite_falls_back_and_keeps_channels_last(tmp_path, monkeypatch):
    from tlmpack.frontend import load_model
    from tlmpack.graph import layout_ops
    from tlmpack.graph_fallbacks import Lowering, lower_graph

    def broken(mod):
        raise RuntimeError("simulated TVM failure")

    monkeypatch.setattr(layout_ops, "tir_calls_to_relax_ops", broken)
    _, used, fallbacks = lower_graph(load_model(str(relu6_cnn(tmp_path))).mod, Lowering("NHWC", fast_math=True))
    assert [f.transform for f in fallbacks] == ["layout-ops"] and "simulated" in fallbacks[0].reason
    assert used.conv_layout == "NHWC" and not used.layout_ops


def test_a_torch_relu6_is_a_clip_that_fuses_into_its_convolution_and_matches_torch(tmp_path):
    """The torch importer writes nn.ReLU6 as R.clip, which ConvertLayout does not know either."""
    import torch

    import tlmpack.runtime as rt
    from tlmpack.build import BuildOptions, build

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
            self.depthwise = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
            self.act = torch.nn.ReLU6()

        def forward(self, x):
            return self.act(self.depthwise(self.act(self.conv(x)))).mean((2, 3))

    torch.manual_seed(0)
    block, x = Block().eval(), torch.randn(1, 3, 16, 16) * 3  # clips bite
    torch.export.save(torch.export.export(block, (x,)), tmp_path / "block.pt2")
    graph = _x86_graph(tmp_path / "block.pt2")
    assert _transposes_inside(graph) == []
    convs = [t.name for t in graph.tasks if "conv2d" in t.name]
    assert len(convs) == 2 and all("maximum" in n and "minimum" in n for n in convs), convs
    build(str(tmp_path / "block.pt2"), tmp_path / "block.tar", BuildOptions(scheduler="heuristic"))
    (out,) = rt.load(tmp_path / "block.tar").run(None, {"x": x.numpy()})
    with torch.no_grad():
        assert rel_err(out, block(x).numpy()) < TOLERANCE


def _two_branch_model(tmp_path, grouped_branch: bool):
    """The input read by a dense 3x3 convolution and by a second branch (a depthwise or a dense 3x3
    convolution, then a 1x1 one), the two added."""
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(3)
    parts = [_conv(rng, "c0", "x", 3, 8, 3, pads=(1, 1, 1, 1)),
             _conv(rng, "c1", "x", 3, 3, 3, groups=3 if grouped_branch else 1, pads=(1, 1, 1, 1)),
             _conv(rng, "c2", "c1", 3, 8, 1),
             ([helper.make_node("Add", ["c0", "c2"], ["y"])], [])]
    graph = helper.make_graph([n for p in parts for n in p[0]], "two_branch",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
                              initializer=[i for p in parts for i in p[1]])
    path = tmp_path / f"two_branch_{grouped_branch}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.parametrize("make", [relu6_cnn, silu_se_cnn])
def test_the_input_transpose_is_read_in_place_by_the_stem_convolution(tmp_path, make):
    graph = _x86_graph(make(tmp_path))
    assert not [t.name for t in graph.tasks if "transpose" in t.name]
    stem = next(t for t in graph.tasks if "conv2d" in t.name)
    assert "T.Buffer((T.int64(1), T.int64(3), T.int64(16), T.int64(16))" in graph.task_funcs[stem.id].script()


@pytest.mark.parametrize("grouped_branch", [False, True])
def test_an_input_read_by_a_grouped_convolution_keeps_its_transpose(tmp_path, grouped_branch):
    import tlmpack.runtime as rt
    from tlmpack.build import BuildOptions, build

    model = _two_branch_model(tmp_path, grouped_branch)
    graph = _x86_graph(model)
    transposes = [t.name for t in graph.tasks if "transpose" in t.name]
    assert len(transposes) == (2 if grouped_branch else 1)  # the output's back to NCHW, and the input's if kept
    tar = tmp_path / "model.tar"
    build(str(model), tar, BuildOptions(scheduler="heuristic"))
    x = np.random.default_rng(4).standard_normal((1, 3, 16, 16)).astype(np.float32)
    (ref,) = onnxruntime_outputs(model, {"x": x})
    (out,) = rt.load(tar).run(None, {"x": x})
    assert rel_err(out, ref) < TOLERANCE


def test_a_gate_over_a_large_map_is_a_kernel_of_its_own_and_matches_onnxruntime(tmp_path):
    """wide_gates.py: a squeeze-excite gate over 32 x 32 pixels (>= MIN_GATED_PIXELS) is multiplied in a
    broadcast kernel of its own, scheduled with the channels as its vector loop; over 8 x 8 pixels it
    stays the excite convolution's tail (test_clip_and_silu_tails_fuse_into_their_convolutions)."""
    import re

    import tlmpack.runtime as rt
    from tlmpack.build import BuildOptions, build
    from tlmpack.graph.wide_gates import MIN_GATED_PIXELS

    assert 32 * 32 >= MIN_GATED_PIXELS > 8 * 8
    model = silu_se_cnn(tmp_path, size=64)
    names = [t.name for t in _x86_graph(model).tasks]
    assert [n for n in names if re.fullmatch(r"multiply\d*", n)], names
    excite = r"fused_conv2d\d*_add\d*_tir_negative\d*_fast_exp\d*_add\d*_divide\d*"
    assert sum(bool(re.fullmatch(excite, n)) for n in names) == 1, names  # the sigmoid stays with its conv
    tar = tmp_path / "gate.tar"
    manifest = build(str(model), tar, BuildOptions(scheduler="heuristic"))
    (gate,) = [s for s in manifest["subgraphs"] if re.fullmatch(r"multiply\d*", s["name"])]
    assert gate["schedules"][0]["sketch"] > 0  # the appended vector sketch, not MetaSchedule's
    x = np.random.default_rng(6).standard_normal((1, 3, 64, 64)).astype(np.float32)
    (ref,) = onnxruntime_outputs(model, {"x": x})
    assert np.abs(ref).max() > 0 and np.isfinite(ref).all()
    (out,) = rt.load(tar).run(None, {"x": x})
    assert rel_err(out, ref) < TOLERANCE


def test_a_constant_per_channel_scale_is_no_gate(tmp_path):
    """Only a run-time gate leaves its convolution: a constant per-channel scale (a batch norm's) is
    a tail the convolution keeps, and equal shapes (SiLU's product) are no broadcast."""
    import re

    from onnx import helper, numpy_helper

    from tlmpack.graph.wide_gates import _gate_pixels

    assert _gate_pixels([1, 1, 1, 32], [1, 56, 56, 32]) == 56 * 56
    assert _gate_pixels([1, 32, 1, 1], [1, 32, 56, 56]) == 56 * 56  # NCHW
    assert _gate_pixels([1, 56, 56, 32], [1, 56, 56, 32]) == 0
    assert _gate_pixels([1, 1, 56, 32], [1, 56, 56, 32]) == 0  # broadcast over one axis only
    assert _gate_pixels([1, 1, 1, 1], [1, 56, 56, 32]) == 0  # a scalar
    rng = np.random.default_rng(7)
    scale = numpy_helper.from_array(rng.standard_normal((1, 16, 1, 1)).astype(np.float32), "scale")
    model = _save(tmp_path, "scaled", [_conv(rng, "c0", "x", 3, 16, 3, pads=(1, 1, 1, 1)),
                                       ([helper.make_node("Mul", ["c0", "scale"], ["s0"])], [scale]),
                                       _silu("a0", "s0"), _head(rng, "a0", 16)], size=64)
    names = [t.name for t in _x86_graph(model).tasks]
    assert not [n for n in names if re.fullmatch(r"multiply\d*", n)], names
