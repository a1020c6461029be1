"""bench/remote_x86_models.py's reference: the carried torch output wins over an ONNX re-export."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def remote():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("remote_x86_models", BENCH / "remote_x86_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_carried_reference_is_the_first_output_of_stem_ref_npz(remote, tmp_path):
    logits = np.arange(1, 11, dtype=np.float32).reshape(1, 10)
    np.savez(tmp_path / "resnet50.ref.npz", logits=logits, other=np.zeros(3, np.float32))
    np.testing.assert_array_equal(remote.carried_reference([tmp_path], "resnet50"), logits)
    assert remote.carried_reference([tmp_path], "gpt2") is None


@pytest.mark.parametrize("bad", [np.zeros((1, 4), np.float32), np.array([[1.0, np.nan]], np.float32)])
def test_a_carried_reference_of_zeros_or_nan_is_refused(remote, tmp_path, bad):
    np.savez(tmp_path / "mobilenetv2.ref.npz", out=bad)
    with pytest.raises(AssertionError, match="NaN/Inf|constant"):
        remote.carried_reference([tmp_path], "mobilenetv2")


def test_tasks_per_thread_zero_is_the_artifact_as_built_and_others_switch_step_work_off(remote):
    assert remote.engines(["auto"], [0, 1, 8]) == [("auto/steps", "auto", {}),
                                                  ("auto/k1", "auto", {"TLMRT_CPU_TASKS_PER_THREAD": "1"}),
                                                  ("auto/k8", "auto", {"TLMRT_CPU_TASKS_PER_THREAD": "8"})]
    assert remote.engines(["auto"], None) == [("auto", "auto", {})]


def test_a_tasks_per_thread_named_twice_times_a_second_copy_as_the_control(remote):
    assert [e for e, _, _ in remote.engines(["auto"], [0, 1, 0])] == ["auto/steps", "auto/k1", "auto/steps#2"]


def test_another_runtime_library_times_a_copy_of_every_engine_loaded_with_it(remote):
    assert remote.engines(["auto", "heuristic"], None, {"old": "/o/libtlmrt.so"}) == [
        ("auto", "auto", {}), ("heuristic", "heuristic", {}),
        ("auto@old", "auto", {"TLMPACK_RUNTIME_LIB": "/o/libtlmrt.so"}),
        ("heuristic@old", "heuristic", {"TLMPACK_RUNTIME_LIB": "/o/libtlmrt.so"})]
    assert remote.engines(["auto"], [1], {"old": "/o"})[1] == (
        "auto/k1@old", "auto", {"TLMRT_CPU_TASKS_PER_THREAD": "1", "TLMPACK_RUNTIME_LIB": "/o"})
