"""Channels-last convolutions computed over a wider output for whole register tiles (conv_width.py):
which maps are widened, that the widened task is what the rules tile, and that the model keeps its
meaning (against onnxruntime)."""

from __future__ import annotations

import numpy as np
import pytest

from tlmpack.graph.conv_width import has_tile, wider_width
from tlmpack.verify import onnxruntime_outputs, rel_err

TOLERANCE = 1e-4


@pytest.mark.parametrize("width, height, rows, wide", [
    (56, 56, 6, 60),  # 6 pixels of one row, not 57's 3 x 2 (module notes)
    (28, 28, 6, 30),
    (14, 14, 6, 15),  # 18 would add 29 %: 3 x 2
    (112, 112, 6, 114),
    (7, 7, 6, 7),  # too narrow
    (49, 49, 6, 49),  # no wider width within 8 % gives 6 (H is odd: 6 must divide the width: 54 is +10 %)
    (12, 12, 6, 12),  # already whole
    (56, 56, 8, 56),  # AVX-512's 8 rows: 8 divides 56
    (14, 14, 8, 14),  # 4 x 2 would need 16 columns: +14 %, left alone
    (56, 56, 1, 56),
])
def test_the_narrowest_wider_output_that_holds_a_whole_tile(width, height, rows, wide):
    assert wider_width(width, height, rows) == wide
    if wide != width:
        assert has_tile(wide, height, rows) and not has_tile(width, height, rows)


def _model(tmp_path, size: int = 14):
    """Over a size x size map: a 3x3 padded convolution of the input, a memory-bound 1x1 one with a
    residual add, a dilated 3x3 one, a stride-2 3x3 one, a 3x3 one on the halved map,
    and a stride-2 1x1 one; channels-last on x86."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits = [], []

    def conv(name, x, cin, cout, k, stride=1, pad=0, dilation=1):
        w = (rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)
        b = (0.1 * rng.standard_normal(cout)).astype(np.float32)
        inits.extend([numpy_helper.from_array(w, f"{name}.w"), numpy_helper.from_array(b, f"{name}.b")])
        nodes.append(helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [name], strides=[stride, stride],
                                      kernel_shape=[k, k], pads=[pad] * 4, dilations=[dilation, dilation]))
        return name

    a = conv("c0", "x", 24, 32, 3, pad=1)  # reads the NCHW input in place (layout_ops), widened as well
    nodes.append(helper.make_node("Relu", [a], ["r0"]))
    b = conv("c1", "r0", 32, 32, 1)  # memory-bound: widened too
    nodes.append(helper.make_node("Add", [b, "r0"], ["res"]))
    c = conv("c2", "res", 32, 32, 3, pad=2, dilation=2)  # 288: widened
    d = conv("c3", c, 32, 32, 3, stride=2, pad=1)  # strided: widened too (7 x 7: flattened)
    e = conv("c4", d, 32, 32, 3, pad=1)  # on the halved map: 7 x 7 is flattened (49 -> 54 pixels)
    conv("c5", e, 32, 16, 1, stride=2)  # strided, unpadded, 4 x 4: flattened (16 -> 18 pixels)
    graph = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 24, size, size])],
                              [helper.make_tensor_value_info("c5", TensorProto.FLOAT, None)], initializer=inits)
    path = tmp_path / "wide.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.parametrize("width, height, rows, pixels", [
    (7, 7, 6, 54),  # ResNet-50's last stage: 6 rows of one flattened loop
    (56, 56, 6, 3136),  # widened instead (60 columns)
    (12, 12, 6, 144),  # whole already
    (5, 5, 8, 25),  # 32 would add 28 %
    (14, 14, 8, 196),  # AVX-512's 8 rows: the map's own 7 pixels are enough (ENOUGH_ROWS), not 200 flattened
])
def test_small_maps_are_flattened_when_no_wider_width_holds_a_tile(width, height, rows, pixels):
    from tlmpack.graph.conv_width import flat_pixels

    assert flat_pixels(width, height, rows) == pixels


@pytest.mark.parametrize("width, height, rows, pixels, fills", [
    (14, 14, 8, 7, True),  # 7 x 1 of 8: 14 accumulators of two vectors, left alone
    (14, 14, 6, 4, False),  # AVX2's 6 rows: 2 x 2 only, so widened (14 -> 15)
    (56, 56, 6, 4, False),
    (56, 56, 8, 8, True),
    (7, 7, 8, 7, True),
    (12, 12, 6, 6, True),
])
def test_a_map_whose_own_tile_is_nearly_whole_is_left_alone(width, height, rows, pixels, fills):
    from tlmpack.graph.conv_width import fills_tile, tile_pixels

    assert tile_pixels(width, height, rows) == pixels
    assert fills_tile(width, height, rows) == fills


def test_only_convolutions_with_whole_two_vector_rows_are_widened():
    from tlmpack.graph.conv_width import widens

    assert widens([1, 56, 56, 64], [64, 3, 3, 64], 16)
    assert widens([1, 56, 56, 64], [256, 1, 1, 64], 16)  # memory-bound too
    assert not widens([1, 56, 56, 144], [24, 1, 1, 144], 16)  # 24 channels: one vector, more rows
    assert not widens([1, 56, 56, 64], [48, 3, 3, 64], 32)  # AVX-512: 48 channels are not 2 x 16 lanes


def _widths(graph) -> dict[str, list[int]]:
    """Each task's convolution block output width (the block's third loop), by task name."""
    import re

    out = {}
    for task in graph.tasks:
        script = graph.task_funcs[task.id].script()
        # the convolution block's loops: batch, height, width, channels and three reduction loops
        found = re.search(r"for \w+, \w+, \w+, \w+, \w+, \w+, \w+ in T\.grid\(T\.int64\(1\), T\.int64\((\d+)\), "
                          r"T\.int64\((\d+)\)", script)
        if found:
            out[task.name] = [int(found.group(1)), int(found.group(2))]
    return out


def test_convolutions_are_widened_or_flattened_for_six_rows(tmp_path):
    from tlmpack.frontend import load_model
    from tlmpack.graph.relax_rewrites import policy_for
    from tlmpack.graph_fallbacks import Lowering, lower_graph

    model = _model(tmp_path)
    graph, used, fallbacks = lower_graph(load_model(str(model)).mod,
                                         Lowering("NHWC", fast_math=True, pad=policy_for(("x86",), 8, 6)))
    assert used.conv_layout == "NHWC" and not fallbacks
    widths = sorted(_widths(graph).values())
    assert widths == [[14, 15], [14, 15], [14, 15]], widths  # c0 (reads the NCHW input), c1, c2 widened
    scripts = [graph.task_funcs[t.id].script() for t in graph.tasks]
    assert sum("T.grid(T.int64(1), T.int64(54), T.int64(32)" in s for s in scripts) == 2  # c3 and c4, flattened
    assert sum("T.grid(T.int64(1), T.int64(18), T.int64(16)" in s for s in scripts) == 1  # c5
    unpadded, _, _ = lower_graph(load_model(str(model)).mod, Lowering("NHWC", fast_math=True, pad=None))
    assert sorted(_widths(unpadded).values()) == [[4, 4], [7, 7], [7, 7], [14, 14], [14, 14], [14, 14]]


def test_the_rules_tile_a_widened_convolution_with_twelve_accumulators(tmp_path):
    from tlmpack.frontend import load_model
    from tlmpack.graph.relax_rewrites import policy_for
    from tlmpack.graph_fallbacks import Lowering, lower_graph
    from tlmpack.schedule.hardware import detect_x86
    from tlmpack.schedule.select import schedule_tasks

    graph, _, _ = lower_graph(load_model(str(_model(tmp_path))).mod,
                              Lowering("NHWC", fast_math=True, pad=policy_for(("x86",), 8, 6)))
    from tlmpack.lower.x86 import x86_target

    avx2 = detect_x86(("avx2", "fma"), cores=1, caches_kib=(32, 256, 8192))
    scheduled = schedule_tasks(graph, x86_target("haswell", 1).tvm_target(), "x86", "heuristic", hardware=avx2)
    tiles = {r.task: [d.value for d in r.decisions if d.kind == "tile"] for r in scheduled.records}
    widened = [t for t in graph.tasks if _widths(graph).get(t.name) == [14, 15]]
    assert widened
    for task in widened:
        spatial = tiles[task.id][:4]
        pixels = spatial[1][3] * spatial[2][3]
        assert pixels == 6 and spatial[3][3] == 16, (task.name, spatial)
    flat = [t for t in graph.tasks if "T.int64(54)" in graph.task_funcs[t.id].script()]
    assert len(flat) == 2
    for task in flat:
        spatial = tiles[task.id][:3]  # batch, pixels, channels
        assert spatial[1][3] == 6 and spatial[2][3] == 16, spatial
    (strided,) = [t for t in graph.tasks if "T.int64(18), T.int64(16)" in graph.task_funcs[t.id].script()]
    assert tiles[strided.id][1][3] == 6, tiles[strided.id]  # c5: 6 of its 18 flattened pixels


def _check_against_onnxruntime(model, tmp_path, input_shape: tuple[int, ...]) -> None:
    """Builds ``model`` with the rules for an AVX2 target and checks it against onnxruntime on fresh input."""
    import tlmpack.runtime as rt
    from tlmpack.build import BuildOptions, build

    tar = tmp_path / "built.tar"
    build(str(model), tar, BuildOptions(scheduler="heuristic", cpu="haswell", cores=2))
    x = np.random.default_rng(1).standard_normal(input_shape).astype(np.float32)
    (ref,) = onnxruntime_outputs(model, {"x": x})
    assert np.abs(ref).max() > 0 and np.isfinite(ref).all()
    (out,) = rt.load(tar).run(None, {"x": x})
    assert out.shape == ref.shape and rel_err(out, ref) < TOLERANCE


@pytest.mark.parametrize("size", [14, 28])
def test_a_widened_model_matches_onnxruntime(tmp_path, size):
    _check_against_onnxruntime(_model(tmp_path, size=size), tmp_path, (1, 24, size, size))


def _stem(tmp_path, size: int, kernel: int, pad: int):
    """An image stem: Conv(3 -> 32, stride 2) + Relu on a [1, 3, size, size] NCHW input."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((32, 3, kernel, kernel)) / np.sqrt(3 * kernel * kernel)).astype(np.float32)
    b = (0.1 * rng.standard_normal(32)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[2, 2], kernel_shape=[kernel, kernel],
                              pads=[pad] * 4),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "stem", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    path = tmp_path / "stem.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.parametrize("size, kernel, pad, wide", [
    (40, 7, 3, 21),  # padded (ResNet's 7 x 7 stem): 20 -> 21 columns, 3 x 2 pixels; the extra ones read zeros
    (31, 5, 0, 15),  # unpadded: 14 -> 15 columns, the last input column read again for the extra one
    (31, 3, 1, 16),  # a 3 x 3 stem (27 multiply-adds an output, bound by its writes): left as it is
])
def test_a_stem_reading_the_nchw_input_is_widened_and_matches_onnxruntime(tmp_path, size, kernel, pad, wide):
    """The stem that reads the NCHW input in place (layout_ops.py) gets the wider output too (ResNet-50's
    7 x 7 stem: 112 -> 114 columns, 6 pixels of two vectors instead of 4), unless it has too few
    multiply-adds an output (layout_ops.WIDE_STEM_MIN_MACS)."""
    from tlmpack.frontend import load_model
    from tlmpack.graph.relax_rewrites import policy_for
    from tlmpack.graph_fallbacks import Lowering, lower_graph

    model = _stem(tmp_path, size, kernel, pad)
    graph, used, fallbacks = lower_graph(load_model(str(model)).mod,
                                         Lowering("NHWC", fast_math=True, pad=policy_for(("x86",), 8, 6)))
    assert used.conv_layout == "NHWC" and not fallbacks
    stem = next(t for t in graph.tasks if "conv2d" in t.name)
    assert f"T.Buffer((T.int64(1), T.int64(3), T.int64({size}), T.int64({size}))" in graph.task_funcs[stem.id].script()
    out_w = (size + 2 * pad - kernel) // 2 + 1
    assert list(_widths(graph).values()) == [[out_w, wide]]  # read in place (above), over ``wide`` columns
    _check_against_onnxruntime(model, tmp_path, (1, 3, size, size))
