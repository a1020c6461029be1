"""x86 kernels prefetch the lines a tile's element-wise tail reads and writes (lower/x86_prefetch.py):
one prefetch per 64-byte line of the output (for writing) and of each tensor shaped like it that the
tail reads (a residual), at the start of the tile, under the tail's own guard; nothing else, and the
same results."""

from __future__ import annotations

import re

import numpy as np
import pytest


@pytest.fixture(scope="module")
def host():
    from tlmpack.lower.x86 import x86_target
    from tlmpack.schedule.hardware import detect_x86

    return x86_target().tvm_target(), detect_x86(("avx2", "fma"), 2)


def _residual_block_tail(size: int = 14, channels_in: int = 64, channels_out: int = 256, computed_width: int = 0):
    """A channels-last 1x1 convolution + bias + residual add + ReLU (ResNet's block output).
    ``computed_width``: the convolution runs over that many columns (as conv_width.py widens a
    14-wide map to 15), the tail over ``size``."""
    from tvm import te, topi

    data = te.placeholder((1, size, size, channels_in), name="data")
    weight = te.placeholder((1, 1, channels_in, channels_out), name="weight")
    bias = te.placeholder((1, 1, 1, channels_out), name="bias")
    residual = te.placeholder((1, size, size, channels_out), name="residual")
    wide = topi.nn.pad(data, [0, 0, 0, 0], [0, 0, max(computed_width - size, 0), 0]) if computed_width else data
    conv = topi.nn.conv2d_nhwc(wide, weight, 1, 0, 1)
    out = te.compute(residual.shape, lambda n, y, x, c: te.max(conv[n, y, x, c] + bias[0, 0, 0, c] + residual[n, y, x, c],
                                                               0.0), name="tail")
    return te.create_prim_func([data, weight, bias, residual, out])


def _scheduled(func, host):
    from tlmpack.schedule.select import schedule_with_rules

    target, hardware = host
    choice = schedule_with_rules(func, target, "x86", hardware)
    assert choice is not None and choice.rule == "x86-matmul"
    return choice


def _prefetches(func) -> list[str]:
    return [line.strip() for line in func.script().splitlines() if "llvm.prefetch" in line]


def _tile_pixels_and_lines(choice) -> tuple[int, int]:
    """Pixels in the register tile (H x W at level 3) and 64-byte lines a pixel (channels at level 3)."""
    tiles = [d.value for d in choice.decisions if d.kind == "tile" and len(d.value) == 4]
    _, height, width, channels = tiles
    return height[3] * width[3], -(-channels[3] * 4 // 64)


def test_a_residual_tail_prefetches_its_output_and_residual_lines_at_the_start_of_its_tile(host):
    from tlmpack.lower.x86_prefetch import prefetch_epilogue_lines

    choice = _scheduled(_residual_block_tail(), host)
    prefetched = prefetch_epilogue_lines(choice.func)
    calls = _prefetches(prefetched)
    assert len(calls) == 2  # one nest: the output and the residual; the bias is not shaped like the output
    assert "T.address_of(tail[" in calls[0] and calls[0].endswith("1, 3, 1)")  # written
    assert "T.address_of(residual[" in calls[1] and calls[1].endswith("0, 3, 1)")  # read
    script = prefetched.script()
    assert script.index("llvm.prefetch") < script.index('T.sblock("conv2d_nhwc_init")')
    pixels, lines = _tile_pixels_and_lines(choice)
    nest = script[script.index("_prefetch in"):script.index("llvm.prefetch")]
    extents = [int(e) for e in re.findall(r"_prefetch in T\.unroll\((?:T\.int64\()?(\d+)", nest)]
    assert np.prod(extents) == pixels * lines


def test_a_guarded_tail_keeps_its_guard_on_the_prefetches(host):
    from tlmpack.lower.x86_prefetch import prefetch_epilogue_lines

    choice = _scheduled(_residual_block_tail(size=14, channels_in=256, channels_out=1024, computed_width=15), host)
    script = prefetch_epilogue_lines(choice.func).script()
    assert "T.where(" in script  # ResNet-50's 14x14 map in tiles of 3 pixels: the last tile is cut
    guarded = script[script.index("_prefetch in"):script.index("llvm.prefetch")]
    assert "if " in guarded


def test_the_prefetching_kernel_computes_what_the_plain_one_does_and_issues_prefetches(host):
    import tvm

    from tlmpack.lower.x86 import compile_kernels
    from tlmpack.runtime.kernels import random_arguments

    func = _residual_block_tail(size=7, channels_in=128, channels_out=512)
    choice = _scheduled(func, host)
    target, _ = host
    prefetching = compile_kernels({"k": choice.func}, target)
    assembly = prefetching.mod.inspect_source("asm")
    assert "prefetchw" in assembly and "prefetcht0" in assembly
    plain = tvm.compile(tvm.IRModule({"k": choice.func.with_attr("global_symbol", "k")}), target=target)

    def run(executable) -> np.ndarray:
        tensors = [tvm.runtime.tensor(a) for a in random_arguments(func, 1, seed=3)]
        executable["k"](*tensors)
        return tensors[-1].numpy()

    expected = run(plain)
    assert np.abs(expected).max() > 0 and np.isfinite(expected).all()
    np.testing.assert_array_equal(run(prefetching), expected)


def test_a_kernel_without_an_in_tile_tail_is_left_alone(host):
    from tvm import te, topi

    from tlmpack.lower.x86_prefetch import prefetch_epilogue_lines

    x = te.placeholder((32, 256), name="x")
    w = te.placeholder((512, 256), name="w")
    dense = te.create_prim_func([x, w, topi.nn.relu(topi.nn.dense(x, w))])  # a matmul keeps its tail at the root
    choice = _scheduled(dense, host)
    assert prefetch_epilogue_lines(choice.func) is choice.func
