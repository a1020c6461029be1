"""The x86 window sketch of channels-last pooling (schedule/x86_window_sketch.py): appended only
where it serves, chosen by the rules, vectorised over channels, and computing what TOPI's pool does."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def host():
    from tlmpack.lower.x86 import x86_target
    from tlmpack.schedule.hardware import detect_x86

    target = x86_target()
    return target.tvm_target(), detect_x86(target.features, 2)


def _pool(kind: str, layout: str, channels: int = 96, size: int = 15):
    """A 3x3 stride-2 pool, padding 1, as LegalizeOps gives it: TOPI's pool2d."""
    from tvm import te, topi

    shape = (1, size, size, channels) if layout == "NHWC" else (1, channels, size, size)
    data = te.placeholder(shape, name="data")
    out = topi.nn.pool2d(data, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), kind, count_include_pad=False, layout=layout)
    return te.create_prim_func([data, out])


def _reference(kind: str, x: np.ndarray) -> np.ndarray:
    """NHWC pooling by numpy: the window's max, or its mean over the inside of the image."""
    pad = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=np.nan)
    size = (x.shape[1] - 1) // 2 + 1
    windows = np.stack([pad[:, i:i + 2 * size:2, j:j + 2 * size:2, :] for i in range(3) for j in range(3)])
    return np.nanmax(windows, axis=0) if kind == "max" else np.nanmean(windows, axis=0)


def _run(func, target, x: np.ndarray, out_shape) -> np.ndarray:
    import tvm

    executable = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target)
    args = [tvm.runtime.tensor(x), tvm.runtime.tensor(np.zeros(out_shape, np.float32))]
    executable["main"](*args)
    return args[1].numpy()


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_channels_last_pool_gets_the_window_sketch_the_rules_take_it_and_it_matches_numpy(host, kind):
    from tlmpack.schedule.select import schedule_with_rules
    from tlmpack.schedule.space import DesignSpace
    from tlmpack.schedule.x86_window_sketch import MARK

    target, hardware = host
    func = _pool(kind, "NHWC")
    space = DesignSpace(func, target)
    assert space.sketch_versions[-1] == 3 and MARK in space.steps(len(space.sketches) - 1)
    assert space.sites(len(space.sketches) - 1) == []  # one program, no decisions
    choice = schedule_with_rules(func, target, "x86", hardware)
    assert choice is not None and choice.sketch == len(space.sketches) - 1
    script = choice.func.script()
    assert "T.vectorized(48)" in script  # 96 channels: two steps of 48, not a scalar loop
    x = np.random.default_rng(0).standard_normal((1, 15, 15, 96)).astype(np.float32)
    got = _run(choice.func, target, x, (1, 8, 8, 96))
    np.testing.assert_allclose(got, _reference(kind, x), rtol=1e-6, atol=1e-6)


def test_nchw_pool_and_a_pool_of_few_channels_keep_metaschedules_sketches(host):
    from tlmpack.schedule.space import DesignSpace

    target, _ = host
    for func in (_pool("max", "NCHW"), _pool("max", "NHWC", channels=3)):
        space = DesignSpace(func, target)
        assert 3 not in space.sketch_versions


def test_old_tlm_weights_are_not_offered_the_window_sketch(host):
    from tlmpack.schedule.space import DesignSpace

    target, _ = host
    space = DesignSpace(_pool("max", "NHWC"), target)
    assert space.sketches_after(2) == (len(space.sketches) - 1,)
