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
    for record, task in zip(scheduled.records, bert_tiny.tasks):
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
