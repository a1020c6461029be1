"""The x86 heuristic rules: register tiles from the hardware description, the registry's
switch-off, and pre-packed weights computing exactly what the plain kernel computes."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def bert_tiny(zoo_dir):
    from tlmpack import zoo
    from tlmpack.frontend import load_model
    from tlmpack.graph import fuse_to_tir, partition

    path = zoo_dir / "bert-tiny-x86rules.onnx"
    zoo.export_onnx("bert-tiny", path)
    return partition(fuse_to_tir(load_model(str(path)).mod))


@pytest.fixture(scope="module")
def host():
    from tlmpack.lower.x86 import x86_target
    from tlmpack.schedule.hardware import detect_x86

    target = x86_target()
    return target.tvm_target(), detect_x86(("avx2", "fma"), 2)


def test_register_tile_balances_vectors_and_rows():
    from tlmpack.schedule.heuristics.x86_matmul import register_tile

    assert register_tile(768, 128, 8, 8) == (16, 4)  # 2 vectors x 4 rows = 8 accumulators (AVX2)
    assert register_tile(64, 7, 8, 8) == (8, 7)  # a 7x7 map: one vector of channels x 7 pixels
    assert register_tile(14, 256, 8, 8) == (7, 8)  # NCHW row of 14: a partial vector of 7, 8 channels
    assert register_tile(768, 128, 16, 16) == (32, 8)  # AVX-512: 32 registers, 16 accumulators


def test_every_task_of_a_transformer_gets_a_rule_and_matmuls_pack_their_weight(bert_tiny, host):
    from tlmpack.schedule.select import schedule_tasks

    target, hardware = host
    scheduled = schedule_tasks(bert_tiny, target, "x86", "heuristic", 8, None, hardware)
    rules = {r.task: r.note.split(";")[0] for r in scheduled.records}
    assert {r.chosen_by for r in scheduled.records} == {"heuristic"}
    assert set(rules.values()) == {"x86-matmul", "x86-reduction", "x86-pointwise"}
    dense = [t.id for t in bert_tiny.tasks if t.name.startswith("fused_matmul_add")]
    assert dense and all(t in scheduled.splits for t in dense)


def test_a_switched_off_rule_falls_back_to_the_fixed_rules(bert_tiny, host, monkeypatch):
    from tlmpack.schedule.select import schedule_tasks

    target, hardware = host
    monkeypatch.setenv("TLMPACK_DISABLE_RULES", "x86-matmul")
    scheduled = schedule_tasks(bert_tiny, target, "x86", "heuristic", 8, None, hardware)
    for record, task in zip(scheduled.records, bert_tiny.tasks, strict=True):
        if "matmul" in task.name:
            assert record.chosen_by == "default" and "no heuristic rule" in record.note
    assert not scheduled.splits


def test_packed_kernel_computes_what_the_plain_kernel_computes(bert_tiny, host):
    import tvm

    from tlmpack.lower.prepack import Packer
    from tlmpack.schedule.select import fixed_schedule, schedule_tasks

    target, hardware = host
    scheduled = schedule_tasks(bert_tiny, target, "x86", "heuristic", 8, None, hardware)
    task_id, split = next(iter(scheduled.splits.items()))
    call = next(c for c in bert_tiny.calls if c.task == task_id)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(bert_tiny.tensors[a].shape).astype(np.float32) for a in call.args]
    _, plain, _, _ = fixed_schedule(bert_tiny.task_funcs[task_id], target, 8)

    def run(func, args):
        ex = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)
        tensors = [tvm.runtime.tensor(a) for a in args]
        ex["main"](*tensors)
        return tensors[-1].numpy()

    expected = run(plain, arrays)
    packed = Packer().pack(split, arrays[split.param])
    assert packed.shape == split.packed_shape and packed.shape != arrays[split.param].shape
    got = run(split.kernel, [packed if i == split.param else a for i, a in enumerate(arrays)])
    assert np.abs(got - expected).max() <= 1e-4 * np.abs(expected).max()
    assert np.abs(expected).max() > 0


def _squeeze_excite():
    """efficientnet's squeeze-excite tail: sigmoid(1x1 conv of the pooled vector + bias) scales
    every pixel of the feature map (the conv makes 32 values, the task writes 32x14x14)."""
    from tvm import te, topi

    pooled = te.placeholder((1, 8, 1, 1), name="pooled")
    weight = te.placeholder((32, 8, 1, 1), name="weight")
    bias = te.placeholder((1, 32, 1, 1), name="bias")
    feature = te.placeholder((1, 32, 14, 14), name="feature")
    gate = topi.sigmoid(topi.add(topi.nn.conv2d_nchw(pooled, weight, 1, 0, 1), bias))
    return te.create_prim_func([pooled, weight, bias, feature, topi.multiply(feature, gate)])


def test_a_broadcast_epilogue_is_computed_inside_the_tile(host):
    """Left at the root, the inlined sigmoid ran once per output element: 11-31x slower on all ten
    of efficientnet-b0's squeeze-excite tasks (data/TASKS-x86.md)."""
    from tlmpack.schedule.heuristics.classify import classify
    from tlmpack.schedule.select import schedule_with_rules
    from tlmpack.schedule.space import DesignSpace

    func = _squeeze_excite()
    task = classify(func)
    assert task.kind == "matmul" and task.epilogue_growth == 196
    target, hardware = host
    choice = schedule_with_rules(func, target, "x86", hardware)
    assert choice is not None and choice.rule == "x86-matmul"
    assert "ReverseComputeAt" in DesignSpace(func, target).steps(choice.sketch)


def test_a_plain_epilogue_keeps_the_first_sketch(host):
    from tvm import te, topi

    from tlmpack.schedule.heuristics.classify import classify
    from tlmpack.schedule.select import schedule_with_rules

    a, w = te.placeholder((64, 32), name="A"), te.placeholder((48, 32), name="W")
    b = te.placeholder((48,), name="B")
    func = te.create_prim_func([a, w, b, topi.nn.relu(topi.add(topi.nn.dense(a, w), b))])
    assert classify(func).epilogue_growth == 1
    target, hardware = host
    assert schedule_with_rules(func, target, "x86", hardware).sketch == 0


def test_a_matmul_that_slices_off_padded_rows_and_columns_does_it_inside_the_tile(host):
    """GPT-2's LM head, padded to 132 x 50272 and sliced back to 128 x 50257: at the root the slice
    was a second pass over a 26.5 MB intermediate (GPT-2 0.94x its time with the slice in the tile,
    BENCHMARKS.md 2026-12-06 17:10). Here over 132 x 4096 columns, sliced to 128 x 4000."""
    from tvm import te, topi

    from tlmpack.schedule.heuristics.classify import classify
    from tlmpack.schedule.select import schedule_with_rules
    from tlmpack.schedule.space import DesignSpace

    x, w = te.placeholder((132, 256), name="x"), te.placeholder((256, 4096), name="w")
    func = te.create_prim_func([x, w, topi.strided_slice(topi.matmul(x, w), [0, 0], [128, 4000])])
    task = classify(func)
    assert task.kind == "matmul" and task.epilogue_drops and task.epilogue_growth == 1
    target, hardware = host
    choice = schedule_with_rules(func, target, "x86", hardware)
    assert choice is not None and choice.rule == "x86-matmul"
    assert "ReverseComputeAt" in DesignSpace(func, target).steps(choice.sketch)
    unsliced = te.create_prim_func([x, w, topi.nn.relu(topi.matmul(x, w))])
    assert not classify(unsliced).epilogue_drops


def test_a_long_row_is_reduced_as_vector_partial_sums_and_a_short_one_plainly(host):
    """The plain sketch adds a row one scalar at a time: 8-17x slower than the best random program
    on efficientnet's spatial means, whose best programs all rfactor the inner half."""
    from tvm import te, topi

    from tlmpack.schedule.select import schedule_with_rules
    from tlmpack.schedule.space import DesignSpace

    target, hardware = host
    for width, expected in ((28, "RFactor:inner"), (3, None)):
        x = te.placeholder((1, 24, width, width), name="x")
        func = te.create_prim_func([x, topi.sum(x, axis=[2, 3], keepdims=True)])
        choice = schedule_with_rules(func, target, "x86", hardware)
        assert choice is not None and choice.rule == "x86-reduction"
        steps = DesignSpace(func, target).steps(choice.sketch)
        rfactors = [s for s in steps if s.startswith("RFactor")]
        assert rfactors == ([expected] if expected else []), (width, steps)


def test_a_short_mean_keeps_its_partial_sums_in_the_channel_loop_and_a_long_one_at_the_root(host):
    """7x7 and 14x14 means were 1.17-1.49x faster with the partial sums computed per channel; a
    112x112 one 15x slower (BENCHMARKS.md, 2026-12-02 07:00)."""
    from tvm import te, topi

    from tlmpack.schedule.select import schedule_with_rules

    target, hardware = host
    for width, location in ((7, 1), (14, 1), (112, -1)):
        x = te.placeholder((1, 64, width, width), name="x")
        func = te.create_prim_func([x, topi.divide(topi.sum(x, axis=[2, 3], keepdims=True), width * width)])
        choice = schedule_with_rules(func, target, "x86", hardware)
        assert choice is not None and choice.rule == "x86-reduction"
        locations = [d.value for d in choice.decisions if d.kind == "compute_location"]
        assert len(locations) == 2 and locations[1] == location, (width, choice.decisions)


def _nhwc_conv_relu6(channels_in: int, channels_out: int, kernel: int, groups: int = 1, size: int = 14):
    """A channels-last conv + bias + ReLU6 as ConvertLayout and LegalizeOps give it (14x14 map)."""
    from tvm import te, topi

    data = te.placeholder((1, size, size, channels_in), name="data")
    weight = te.placeholder((kernel, kernel, channels_in // groups, channels_out), name="weight")
    bias = te.placeholder((1, 1, 1, channels_out), name="bias")
    pad = kernel // 2
    if groups == 1:
        conv = topi.nn.conv2d_nhwc(data, weight, 1, pad, 1)
    else:
        conv = topi.nn.group_conv2d_nhwc(data, weight, 1, pad, 1, groups)
    out = topi.minimum(topi.maximum(topi.add(conv, bias), 0.0), 6.0)
    return te.create_prim_func([data, weight, bias, out])


@pytest.mark.parametrize("cin, cout, kernel, groups, in_tile", [
    (16, 96, 1, 1, True),  # 16 multiply-adds per output: memory-bound, the tail goes in the tile
    (32, 32, 3, 32, True),  # depthwise 3x3: 9
    (256, 256, 3, 1, True),  # 2304: compute-bound, and still better so in the whole model
])
def test_a_convolution_computes_its_tail_inside_the_tile(host, cin, cout, kernel, groups, in_tile):
    from tlmpack.schedule.select import schedule_with_rules
    from tlmpack.schedule.space import DesignSpace

    func = _nhwc_conv_relu6(cin, cout, kernel, groups)
    target, hardware = host
    choice = schedule_with_rules(func, target, "x86", hardware)
    assert choice is not None and choice.rule == "x86-matmul"
    assert ("ReverseComputeAt" in DesignSpace(func, target).steps(choice.sketch)) == in_tile


def test_a_depthwise_convolution_inlines_its_padding_and_a_dense_one_pads_apart(host):
    target, hardware = host
    from tlmpack.schedule.select import schedule_with_rules

    def pad_location(func) -> int:
        choice = schedule_with_rules(func, target, "x86", hardware)
        (location,) = [d.value for d in choice.decisions if d.kind == "compute_location"]
        return location

    assert pad_location(_nhwc_conv_relu6(64, 64, 3, groups=64)) == -2  # inlined
    assert pad_location(_nhwc_conv_relu6(64, 64, 3)) == -1  # its own block at the root


def test_a_rule_location_takes_the_first_legal_preference_else_the_nearest_outside():
    from tlmpack.schedule.select import _location_or_outside
    from tlmpack.schedule.space import SamplingSite

    site = SamplingSite(0, "compute_location", candidates=(-1, 0, 1, 3))
    inline_or_3 = _location_or_outside(lambda s, sampled: (-2, 3))
    assert inline_or_3(site, 0) == 3  # inlining refused: the second choice
    assert inline_or_3(SamplingSite(0, "compute_location", candidates=(-2, -1, 3)), 0) == -2
    assert _location_or_outside(lambda s, sampled: (-2, 2))(site, 0) == 1  # 2 refused: the loop outside it
    assert _location_or_outside(lambda s, sampled: 2)(site, 0) == 1
    assert _location_or_outside(lambda s, sampled: (4, 8))(SamplingSite(0, "tile"), 0) == (4, 8)


def test_a_dense_layer_on_many_cores_runs_column_tiles_outside_row_tiles():
    """With every row tile at level 1, the parallel loop walks columns outside rows: each thread
    streams its weight panels once (16-core Xeon, 16 threads: BERT-base 45.5 -> 36.4 ms). A
    convolution keeps enough chunks outside level 1."""
    from tvm import te

    from tlmpack.lower.x86 import x86_target
    from tlmpack.schedule.hardware import detect_x86
    from tlmpack.schedule.heuristics.x86_matmul import row_block
    from tlmpack.schedule.select import schedule_with_rules

    a, w = te.placeholder((128, 768), name="A"), te.placeholder((768, 768), name="W")
    k = te.reduce_axis((0, 768), name="k")
    func = te.create_prim_func([a, w, te.compute((128, 768), lambda i, j: te.sum(a[i, k] * w[k, j], axis=k))])
    target = x86_target("skylake-avx512", 16)
    choice = schedule_with_rules(func, target.tvm_target(), "x86", detect_x86(target.features, 16))
    rows = choice.decisions[0].value
    assert rows[0] == 1 and rows[1] * rows[3] == 128  # all 16 row tiles of 8 at level 1
    assert "T.parallel(384" in str(choice.func)  # the same chunk count as before: 24 column x 16 row tiles
    assert row_block(16, 24, 16, convolution=True) == 2  # a convolution: 8 x 24 >= 8 chunks a core


def test_avx2_register_tile_holds_12_accumulators_as_2_vectors_by_6_rows():
    """15 of 16 ymm registers: 12 accumulators, 2 loaded vectors and a broadcast (a third vector a
    row spilled); a matmul's rows are padded to a multiple of 6 to get it (relax_rewrites)."""
    from tlmpack.schedule.heuristics.x86_matmul import accumulator_budget, register_rows, register_tile

    assert accumulator_budget(16) == 12 and register_rows(16) == 6
    assert accumulator_budget(32) == 16 and register_rows(32) == 8  # AVX-512 as before
    assert register_tile(768, 132, 8, accumulator_budget(16)) == (16, 6)  # 128 rows padded to 132
    assert register_tile(768, 128, 8, accumulator_budget(16)) == (16, 4)  # not 1 vector x 8 rows: more loads


def test_register_tile_takes_rows_from_two_loops_when_one_is_short():
    from tlmpack.schedule.heuristics.x86_matmul import register_tile_2d

    assert register_tile_2d(256, 14, 14, 8, 8) == (16, 2, 2)  # 14x14 map: 2 x 2 pixels of 2 vectors
    assert register_tile_2d(64, 56, 56, 8, 8) == (16, 4, 1)  # a long row alone, as before
    assert register_tile_2d(512, 7, 7, 8, 8) == (8, 7, 1)  # 7x7: 7 pixels of one vector, as before


def _spatial_tiles(func, host) -> list[tuple[int, ...]]:
    from tlmpack.schedule.select import schedule_with_rules

    target, hardware = host
    choice = schedule_with_rules(func, target, "x86", hardware)
    assert choice is not None and choice.rule == "x86-matmul"
    return [d.value for d in choice.decisions if d.kind == "tile" and len(d.value) == 4]


def test_a_14x14_convolution_tiles_2x2_pixels_of_two_vectors(host):
    """One thread, ResNet-50's 14x14 3x3 convolution over 256 channels: 3009 -> 2463 us
    (7 pixels of one vector -> 2 x 2 pixels of two; BENCHMARKS.md, 2026-12-01 19:40)."""
    n, h, w, c = _spatial_tiles(_nhwc_conv_relu6(256, 256, 3), host)
    assert (h[3], w[3], c[3]) == (2, 2, 16)


def test_a_depthwise_convolution_keeps_its_rows_in_one_loop(host):
    n, h, w, c = _spatial_tiles(_nhwc_conv_relu6(64, 64, 3, groups=64), host)
    assert h[3] == 1


@pytest.mark.parametrize("cin, cout, kernel, size, channels_outer", [
    (512, 512, 3, 7, True),  # 2.4 M weights for 25 k inputs: every pixel under each weight panel
    (1024, 256, 1, 14, False),  # 262 k weights for 200 k inputs: as before
    (64, 64, 3, 56, False),  # 37 k weights, 200 k inputs
])
def test_a_weight_bound_convolution_streams_each_weight_panel_once(host, cin, cout, kernel, size, channels_outer):
    n, h, w, c = _spatial_tiles(_nhwc_conv_relu6(cin, cout, kernel, size=size), host)
    assert (n[0] * h[0] * w[0] == 1) == channels_outer
    assert c[0] * n[0] * h[0] * w[0] >= 8 * host[1].cores  # enough parallel chunks either way


@pytest.mark.parametrize("cin, cout, kernel, size", [(512, 512, 3, 7), (256, 256, 3, 14), (1024, 2048, 1, 7)])
def test_a_weight_bound_convolution_on_16_cores_keeps_one_chunk_a_core(cin, cout, kernel, size):
    """Each parallel chunk of pixels streams every weight panel again: on the 16-core Xeon, 8 chunks
    a core left ResNet-50's 7x7 and 14x14 3x3 convolutions 1.6-3.1x slower than onnxruntime's."""
    from tlmpack.lower.x86 import x86_target
    from tlmpack.schedule.hardware import detect_x86
    from tlmpack.schedule.heuristics.classify import classify
    from tlmpack.schedule.heuristics.x86_matmul import weight_bound

    func = _nhwc_conv_relu6(cin, cout, kernel, size=size)
    assert weight_bound(classify(func))
    xeon = x86_target("skylake-avx512", 16)
    n, h, w, c = _spatial_tiles(func, (xeon.tvm_target(), detect_x86(xeon.features, 16)))
    chunks = n[0] * h[0] * w[0] * c[0]
    assert 16 <= chunks < 8 * 16


def _nhwc_conv(channels_in: int, channels_out: int, kernel: int, size: int, stride: int = 1):
    """A channels-last conv + bias + residual add + ReLU, ResNet's bottleneck end."""
    from tvm import te, topi

    data = te.placeholder((1, size, size, channels_in), name="data")
    weight = te.placeholder((kernel, kernel, channels_in, channels_out), name="weight")
    bias = te.placeholder((1, 1, 1, channels_out), name="bias")
    conv = topi.nn.conv2d_nhwc(data, weight, stride, kernel // 2, 1)
    residual = te.placeholder(tuple(int(d) for d in conv.shape), name="residual")
    out = topi.maximum(topi.add(topi.add(conv, bias), residual), 0.0)
    return te.create_prim_func([data, weight, bias, residual, out])


@pytest.mark.parametrize("cin, cout, kernel, size, stride, inside", [
    (64, 256, 1, 56, 1, True),  # ResNet-50's first expand 1x1: 0.86-0.90x in the whole model
    (128, 128, 3, 28, 1, True),  # a 3x3 over 128 channels
    (3, 64, 7, 224, 2, False),  # an image stem: 1.11x slower with its channel tiles inside
    (512, 512, 3, 7, 1, False),  # weight-bound: every pixel under each weight panel instead
    (128, 512, 1, 28, 1, False),  # a 1x1 over 128 channels or more: its prefetched tail reads no worse outside
    (512, 256, 1, 28, 1, False),  # (ResNet-50's 28x28 residual k10 0.80x, k13 0.96x in the whole model)
])
def test_a_channels_last_convolution_walks_its_channel_tiles_inside_its_pixel_tiles(host, cin, cout, kernel, size,
                                                                                   stride, inside):
    from tlmpack.lower.x86 import x86_target
    from tlmpack.schedule.hardware import detect_x86

    func = _nhwc_conv(cin, cout, kernel, size, stride)
    n, h, w, c = _spatial_tiles(func, host)
    assert (c[1] > 1) == inside
    if inside:
        assert c[0] == 1 and c[1] * c[3] == cout  # every channel tile at level 1, none in the parallel loop
    if not inside:
        return
    # on 16 cores, as many channel tiles stay outside as keep 8 parallel chunks a core
    xeon = x86_target("skylake-avx512", 16)
    n, h, w, c = _spatial_tiles(func, (xeon.tvm_target(), detect_x86(xeon.features, 16)))
    assert n[0] * h[0] * w[0] * c[0] >= 8 * 16


def test_a_channels_first_convolution_is_never_weight_bound():
    """The weight-bound order moves the loops before the last into level 1; in NCHW the last loop is
    a row of pixels, not the output channels the weight follows."""
    from tvm import te, topi

    from tlmpack.schedule.heuristics.classify import classify
    from tlmpack.schedule.heuristics.x86_matmul import weight_bound

    data = te.placeholder((1, 512, 9, 9), name="data")
    weight = te.placeholder((512, 512, 3, 3), name="weight")
    func = te.create_prim_func([data, weight, topi.nn.conv2d_nchw(data, weight, 1, 0, 1)])
    assert not weight_bound(classify(func))
    assert weight_bound(classify(_nhwc_conv_relu6(512, 512, 3, size=7)))


def _gemv(gate_of_pixels: int = 0):
    """x (1 x 3136) times W (3136 x 144), like EfficientNet-B0's 56x56x144 pool as a matmul; with
    ``gate_of_pixels``, the sigmoid of the result scales that many pixels of 144 channels (a
    squeeze-excite gate: an epilogue that broadcasts the row)."""
    from tvm import te, topi

    x, w = te.placeholder((1, 3136), name="X"), te.placeholder((3136, 144), name="W")
    k = te.reduce_axis((0, 3136), name="k")
    row = te.compute((1, 144), lambda i, j: te.sum(x[i, k] * w[k, j], axis=k))
    if not gate_of_pixels:
        return te.create_prim_func([x, w, row])
    feature = te.placeholder((gate_of_pixels, 144), name="feature")
    return te.create_prim_func([x, w, feature, topi.multiply(feature, topi.sigmoid(row))])


def _column_tiles(func, cores: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    from tlmpack.lower.x86 import x86_target
    from tlmpack.schedule.hardware import detect_x86
    from tlmpack.schedule.select import schedule_with_rules

    target = x86_target(None, cores)
    choice = schedule_with_rules(func, target.tvm_target(), "x86", detect_x86(("avx2", "fma"), cores))
    assert choice is not None and choice.rule == "x86-matmul"
    rows, columns = [d.value for d in choice.decisions if d.kind == "tile" and len(d.value) == 4]
    return rows, columns


@pytest.mark.parametrize("cores, column_tiles_at_level_2", [(1, True), (2, False)])
def test_a_single_row_task_on_one_core_streams_whole_rows(cores, column_tiles_at_level_2):
    """A GEMV walks its column tiles inside the outer reduction loop on one core (EfficientNet-B0,
    one thread: 56x56x144 pool-as-matmul 45 -> 28 us alone; its 15 such kernels 0.75-0.91x in the
    whole model); on two cores the tiles stay the parallel loop (the other placement was 1.55x
    slower in a 2-thread model; BENCHMARKS.md 2026-12-05 23:45)."""
    rows, columns = _column_tiles(_gemv(), cores)
    assert rows == (1, 1, 1, 1)
    assert columns == ((1, 1, 9, 16) if column_tiles_at_level_2 else (9, 1, 1, 16))


def test_a_single_row_task_with_a_broadcast_epilogue_keeps_its_column_tiles_outermost():
    """A squeeze-excite gate computed inside the tile ran 1.8-4.6x slower with the columns inside
    the reduction loop (EfficientNet-B0, one thread)."""
    from tlmpack.schedule.heuristics.classify import classify

    func = _gemv(gate_of_pixels=196)
    assert classify(func).epilogue_growth == 196
    assert _column_tiles(func, 1)[1] == (9, 1, 1, 16)


@pytest.mark.parametrize("cin, cout, size, avx512_tile", [
    (64, 256, 56, (8, 16)),  # ResNet-50's 56x56 residual 1x1: one vector by 8 pixels on AVX-512
    (128, 512, 28, (8, 16)),  # its 28x28 one: 2 x 4 pixels of one vector
    (16, 96, 112, (8, 16)),  # MobileNetV2's first expansion
    (256, 1024, 14, None),  # over more than 128 input channels: two vectors, as before
])
def test_a_narrow_pointwise_convolution_gets_a_one_vector_tile_on_avx512(host, cin, cout, size, avx512_tile):
    """Zen 4, 2 threads, alone: ResNet-50's 56x56 64 -> 256 residual 1x1 0.83-0.90x, its 28x28
    128 -> 512 0.90-0.95x, MobileNetV2's 112x112 16 -> 96 0.73x (BENCHMARKS.md 2026-12-06 21:40).
    AVX2 keeps its two-vector tile."""
    from tlmpack.lower.x86 import x86_target
    from tlmpack.schedule.hardware import detect_x86

    func = _nhwc_conv(cin, cout, 1, size)
    n, h, w, c = _spatial_tiles(func, host)  # AVX2
    assert c[3] == 16 and h[3] * w[3] > 1  # two 8-lane vectors
    zen4 = x86_target("znver4", 2)
    n, h, w, c = _spatial_tiles(func, (zen4.tvm_target(), detect_x86(zen4.features, 2)))
    if avx512_tile is None:
        assert c[3] == 32
    else:
        assert (h[3] * w[3], c[3]) == avx512_tile


@pytest.mark.parametrize("channels, size, avx512_tile", [
    (32, 56, (4, 32)),  # 56x56x32: 4 pixels of two vectors, not 8
    (144, 28, (7, 16)),  # 28x28x144 (9 vectors): 7 pixels of one, not 14
    (192, 7, (7, 16)),  # a 7x7 map over 192 channels: 7 pixels of one vector, not two
])
def test_a_depthwise_convolution_holds_8_accumulators_on_avx512(host, channels, size, avx512_tile):
    """Zen 4, 2 threads, in the whole model: MobileNetV2's depthwise kernels 0.57-1.05x (56x56x144
    150 -> 86 us, 112x112x32 124 -> 91 us), EfficientNet-B0's 0.77-1.10x; both models 0.98x paired
    (BENCHMARKS.md 2026-12-07 21:15). AVX2 keeps its budget of 12."""
    from tlmpack.lower.x86 import x86_target
    from tlmpack.schedule.hardware import detect_x86
    from tlmpack.schedule.heuristics.classify import classify
    from tlmpack.schedule.heuristics.x86_matmul import depthwise_channels_last

    func = _nhwc_conv_relu6(channels, channels, 3, groups=channels, size=size)
    assert not depthwise_channels_last(classify(func), host[1])  # AVX2
    assert not depthwise_channels_last(classify(_nhwc_conv_relu6(channels, channels, 3, size=size)),
                                       detect_x86(("avx512f", "avx2", "fma"), 2))  # a dense convolution
    zen4 = x86_target("znver4", 2)
    n, h, w, c = _spatial_tiles(func, (zen4.tvm_target(), detect_x86(zen4.features, 2)))
    assert (h[3] * w[3], c[3]) == avx512_tile
