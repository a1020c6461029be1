"""The x86 vector sketch of a channels-last broadcast (schedule/x86_broadcast_sketch.py): appended only
where it serves, chosen by the rules (and over a TLM that never saw it), vectorised over the channels,
and computing what the broadcast multiply does."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def host():
    from tlmpack.lower.x86 import x86_target
    from tlmpack.schedule.hardware import detect_x86

    target = x86_target()
    return target.tvm_target(), detect_x86(target.features, 2)


def _multiply(x_shape, g_shape):
    """``x * g`` as LegalizeOps gives it: TOPI's broadcasting multiply."""
    from tvm import te, topi

    x, g = te.placeholder(x_shape, name="x"), te.placeholder(g_shape, name="g")
    return te.create_prim_func([x, g, topi.multiply(x, g)])


def _transpose():
    from tvm import te, topi

    x = te.placeholder((1, 14, 14, 144), name="x")
    return te.create_prim_func([x, topi.transpose(x, (0, 3, 1, 2))])


def test_vector_steps_are_whole_vectors_where_the_channels_allow():
    from tlmpack.schedule.x86_window_sketch import vector_step

    assert [vector_step(c) for c in (144, 240, 32, 1152, 96, 40, 12)] == [48, 48, 32, 64, 48, 40, 12]
    with pytest.raises(ValueError):
        vector_step(7)


def test_a_channels_last_gate_gets_the_vector_sketch_the_rules_take_it_and_it_matches_numpy(host):
    import re

    import tvm

    from tlmpack.schedule.select import schedule_with_rules
    from tlmpack.schedule.space import DesignSpace
    from tlmpack.schedule.x86_broadcast_sketch import MARK

    target, hardware = host
    func = _multiply((1, 14, 14, 144), (1, 1, 1, 144))
    space = DesignSpace(func, target)
    last = len(space.sketches) - 1
    assert space.sketch_versions[-1] == 4 and MARK in space.steps(last) and space.sites(last) == []
    assert MARK not in space.steps(0)  # MetaSchedule's sketch leaves vectors to its postprocessor
    choice = schedule_with_rules(func, target, "x86", hardware)
    assert choice is not None and choice.sketch == last
    script = choice.func.script()
    assert re.search(r"T\.parallel\((T\.int64\()?196\)", script) and re.search(r"T\.vectorized\((T\.int64\()?48\)", script), script
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 14, 14, 144)).astype(np.float32)
    g = rng.standard_normal((1, 1, 1, 144)).astype(np.float32)
    executable = tvm.compile(tvm.IRModule({"main": choice.func.with_attr("global_symbol", "main")}), target)
    args = [tvm.runtime.tensor(x), tvm.runtime.tensor(g), tvm.runtime.tensor(np.zeros_like(x))]
    executable["main"](*args)
    np.testing.assert_array_equal(args[2].numpy(), x * g)


@pytest.mark.parametrize("make", [
    lambda: _multiply((1, 14, 14, 144), (1, 14, 14, 144)),  # no broadcast: SiLU's product
    lambda: _multiply((1, 144, 14, 14), (1, 144, 1, 1)),  # NCHW: the channels are no contiguous loop
    lambda: _multiply((1, 14, 14, 4), (1, 1, 1, 4)),  # too few channels for a vector
    _transpose,
])
def test_other_pointwise_tasks_keep_metaschedules_sketch(host, make):
    from tlmpack.schedule.space import DesignSpace

    target, _ = host
    assert 4 not in DesignSpace(make(), target).sketch_versions


def test_a_tlm_that_never_saw_the_sketch_leaves_the_task_to_the_rules(host, tmp_path):
    import shutil

    from tlmpack.schedule.select import SelectOptions, _tlm_choice
    from tlmpack.tlm.model import set_summary_fields, weights_path

    target, hardware = host
    func = _multiply((1, 14, 14, 144), (1, 1, 1, 144))
    older = tmp_path / "x86.safetensors"  # weights trained before the sketch was appended (version 4)
    shutil.copy(weights_path("x86"), older)
    set_summary_fields(older, space_version=3)
    options = SelectOptions(tlm_weights={"x86": str(older)})
    choice, why, _ = _tlm_choice(func, target, "x86", hardware, "multiply", options)
    assert choice is None and "newer than the model's space" in why, why
