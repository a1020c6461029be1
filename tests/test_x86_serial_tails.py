"""A kernel with no parallel loop runs its large element-wise tail on every thread
(lower/x86_serial_tails.py): a squeeze-excite gate's scaling of a whole feature map becomes a
parallel loop, with the same bits; kernels that are parallel already, and small tails, are left alone."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def host():
    from tlmpack.lower.x86 import x86_target
    from tlmpack.schedule.hardware import detect_x86

    # AVX-512's 2 x 16 lanes hold the gate's 32 channels in one tile: no chunk for a second thread
    return x86_target().tvm_target(), detect_x86(("avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl"), 2)


def _squeeze_excite_gate(size: int, squeezed: int = 8, channels: int = 32):
    """EfficientNet's gate: a 1x1 convolution over one pixel (squeezed -> channels) + bias, its sigmoid
    scaling a size x size x channels map (channels-last)."""
    from tvm import te, topi

    pooled = te.placeholder((1, 1, 1, squeezed), name="pooled")
    weight = te.placeholder((1, 1, squeezed, channels), name="weight")
    bias = te.placeholder((1, 1, 1, channels), name="bias")
    features = te.placeholder((1, size, size, channels), name="features")
    conv = topi.nn.conv2d_nhwc(pooled, weight, 1, 0, 1)
    out = te.compute(features.shape, lambda n, y, x, c: features[n, y, x, c] * te.sigmoid(conv[0, 0, 0, c] + bias[0, 0, 0, c]),
                     name="scaled")
    return te.create_prim_func([pooled, weight, bias, features, out])


def _scheduled(func, host):
    from tlmpack.schedule.select import schedule_with_rules

    target, hardware = host
    choice = schedule_with_rules(func, target, "x86", hardware)
    assert choice is not None
    return choice.func


def _parallel_loops(func) -> int:
    return func.script().count("T.parallel(")


def test_a_gate_with_no_parallel_loop_gets_its_scaling_nest_parallel(host):
    from tlmpack.lower.x86_serial_tails import parallel_serial_tails

    scheduled = _scheduled(_squeeze_excite_gate(112), host)
    assert _parallel_loops(scheduled) == 0  # the gate is one tile: nothing for the postprocessor to split
    rewritten = parallel_serial_tails(scheduled)
    assert _parallel_loops(rewritten) == 1


def test_a_small_tail_and_a_parallel_kernel_are_left_alone(host):
    from tvm import te, topi

    from tlmpack.lower.x86_serial_tails import MIN_TAIL_ELEMENTS, parallel_serial_tails

    small = _scheduled(_squeeze_excite_gate(8), host)  # 8 x 8 x 32 = 2048 elements
    assert 8 * 8 * 32 < MIN_TAIL_ELEMENTS and parallel_serial_tails(small).same_as(small)
    data = te.placeholder((1, 56, 56, 64), name="data")
    weight = te.placeholder((1, 1, 64, 64), name="weight")
    conv = topi.nn.conv2d_nhwc(data, weight, 1, 0, 1)
    parallel = _scheduled(te.create_prim_func([data, weight, conv]), host)
    assert _parallel_loops(parallel) >= 1 and parallel_serial_tails(parallel).same_as(parallel)


def test_the_parallel_tail_computes_what_the_serial_one_does(host):
    import tvm

    from tlmpack.lower.x86 import compile_kernels
    from tlmpack.runtime.kernels import random_arguments

    func = _squeeze_excite_gate(56)
    scheduled = _scheduled(func, host)
    target, _ = host
    rewritten = compile_kernels({"k": scheduled}, target)  # the pass runs on the way
    plain = tvm.compile(tvm.IRModule({"k": scheduled.with_attr("global_symbol", "k")}), target=target)
    assert "ParallelLaunch" in rewritten.mod.inspect_source("asm")  # the pool runs it
    assert "ParallelLaunch" not in plain.mod.inspect_source("asm")

    def run(executable) -> np.ndarray:
        tensors = [tvm.runtime.tensor(a) for a in random_arguments(func, 1, seed=5)]
        executable["k"](*tensors)
        return tensors[-1].numpy()

    expected = run(plain)
    assert np.abs(expected).max() > 0 and np.isfinite(expected).all()
    np.testing.assert_array_equal(run(rewritten), expected)
