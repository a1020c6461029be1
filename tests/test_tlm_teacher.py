"""The rules as a teacher: `tlmpack tlm teacher` writes the rules' points of the unmeasured
synthetic tasks on the store's common hardware, and a training set takes them as taste sentences
for those tasks only (never a held-out or measured task's, never in a guided set)."""

from __future__ import annotations

import json
import shutil

import pytest

from tlmpack.training.store import Store, default_root

PREFIX = "onnx-synthblock-s0-"


@pytest.fixture(scope="module")
def store():
    return Store(default_root())


def test_the_committed_store_holds_unmeasured_synthetic_tasks_and_their_teacher_points(store):
    from tlmpack.training.hints import load_teacher, teacher_tasks

    keys = teacher_tasks(store, "onnx-synthblock-")
    assert len(keys) >= 500
    measured = {r["task"] for r in store.records("x86")}
    assert not set(keys) & measured
    taught = {k for k, _ in load_teacher(store, "x86")}
    assert set(keys) <= taught


def test_tlm_teacher_writes_the_rules_points_on_the_common_hardware_same_bytes_twice(tmp_path, store):
    from click.testing import CliRunner

    from tlmpack.cli import main
    from tlmpack.training.corpus import load_func
    from tlmpack.training.hints import (
        _cpus,
        _machines,
        common_hardware,
        load_teacher,
        rules_hint_for,
        teacher_tasks,
    )

    data = tmp_path / "data"
    shutil.copytree(default_root(), data, ignore=shutil.ignore_patterns("hints"))
    args = ["tlm", "teacher", "--target", "x86", "--corpus-prefix", PREFIX, "--hardware-top", "2",
            "--data-dir", str(data)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    first = (data / "hints" / "x86-teacher.json.gz").read_bytes()
    keys = teacher_tasks(store, PREFIX)
    machines = _machines(store, "x86")
    hardware = common_hardware(machines, 2)
    teacher = load_teacher(Store(data), "x86")
    assert sorted(teacher) == sorted((k, hw) for k in keys for hw in hardware)
    cpus = _cpus(machines)
    key, hw = sorted(teacher)[0]
    assert teacher[(key, hw)] == rules_hint_for(load_func(store.task(key)), "x86", json.loads(hw) | {"llvm_cpu": cpus[hw]})
    assert CliRunner().invoke(main, args).exit_code == 0
    assert (data / "hints" / "x86-teacher.json.gz").read_bytes() == first


def test_teacher_points_are_taste_sentences_of_unmeasured_tasks_only(store):
    from tlmpack.training.dataset import build_training_set, heldout_keys, measured_tasks
    from tlmpack.training.hints import load_teacher, teacher_tasks
    from tlmpack.training.sites import load_sites

    sites = load_sites(store, "x86")
    teacher = load_teacher(store, "x86")
    unmeasured = teacher_tasks(store, PREFIX)[:3]
    held = sorted(heldout_keys(store, "x86", evaluation=True))[0]
    measured = next(iter(build_training_set(store, "x86", sites, random_per_sketch=0,
                                            tasks=set(sorted(set(sites) & measured_tasks(store, "x86"))[:5])).tasks))
    hw = next(hw for k, hw in teacher if k == unmeasured[0])
    rules = teacher[(unmeasured[0], hw)]
    # a measured and a held-out task given teacher points too: the teacher must leave them alone
    teacher = teacher | {(measured, hw): rules, (held, hw): rules}
    chosen = {*unmeasured, held, measured}
    plain = build_training_set(store, "x86", sites, tasks=chosen, random_per_sketch=0)
    taught = build_training_set(store, "x86", sites, tasks=chosen, random_per_sketch=0, teacher=teacher,
                                teacher_weight=0.25)
    assert held not in taught.tasks and measured in taught.tasks and set(unmeasured) <= taught.tasks
    extra = taught.taste[len(plain.taste):]
    assert taught.taste[: len(plain.taste)] == plain.taste
    assert len(extra) == sum(1 for k, _ in teacher if k in unmeasured) and all(e.weight == 0.25 for e in extra)
    for ex in extra:
        assert all(ex.ids[pos] in legal for pos, legal in ex.scored)
    assert taught.sha256 != plain.sha256


def test_a_guided_set_takes_no_teacher(store):
    from tlmpack.tlm.language import NO_HINT
    from tlmpack.training.dataset import build_training_set
    from tlmpack.training.sites import load_sites

    with pytest.raises(ValueError, match="unguided"):
        build_training_set(store, "x86", load_sites(store, "x86"), tasks=set(), hints={},
                           teacher={("k", "h"): NO_HINT})


def test_tlm_train_with_a_teacher_weight_trains_and_without_the_file_says_how_to_make_it(tmp_path):
    from click.testing import CliRunner

    from tlmpack.cli import main

    out = tmp_path / "smoke.safetensors"
    args = ["tlm", "train", "--target", "x86", "--smoke", "--device", "cpu", "--teacher-weight", "0.5"]
    result = CliRunner().invoke(main, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1])["sha256"]
    data = tmp_path / "data"
    shutil.copytree(default_root(), data, ignore=shutil.ignore_patterns("hints", "records"))
    result = CliRunner().invoke(main, [*args, "--out", str(out), "--data-dir", str(data)])
    assert result.exit_code != 0 and "tlmpack tlm teacher --target x86" in result.output


def test_channels_last_convolutions_are_counted_from_the_tasks_own_loops(store):
    """The x86 build's graph of a model holds channels-last convolutions; its NCHW graph none."""
    from tlmpack.training.dataset import channels_last_convs

    def keys(model: str) -> set[str]:
        (entry,) = [e for e in store.corpora() if e["model"] == model]
        return {t["key"] for t in entry["tasks"]}

    assert channels_last_convs(store, keys("onnx-synthblock-s0-x86")) >= 3
    assert channels_last_convs(store, keys("onnx-synthblock-s0-nchw")) == 0


def test_built_points_meet_the_builds_channels_last_gate_on_channels_last_convolutions_only(store):
    """`tlm measure --built` times what a build runs: x86 builds gate channels-last convolutions."""
    from tlmpack.training.candidates import built_options

    def first_conv(model: str) -> dict:
        (entry,) = [e for e in store.corpora() if e["model"] == model]
        return next(store.task(t["key"]) for t in entry["tasks"] if "conv2d" in store.task(t["key"])["ops"])

    gated = built_options("x86", "W", first_conv("onnx-synthblock-s0-x86"))
    assert [word for word, _, _ in gated.tlm_unseen] == ["conv2d", "pool2d"] and gated.tlm_weights == {"x86": "W"}
    assert built_options("x86", "W", first_conv("onnx-synthblock-s0-nchw")).tlm_unseen == ()
    assert built_options("cuda", "W", first_conv("onnx-synthblock-s0-x86")).tlm_unseen == ()
