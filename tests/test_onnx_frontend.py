"""The ONNX frontend on graphs other tools write: operators matched by (domain, op_type), local
functions inlined, optional transformations that fall back, one-line refusals with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile

import pytest

from tlmpack.testing import legacy_cnns, onnx_cases
from tlmpack.verify import compare

CLI = [sys.executable, "-m", "tlmpack.cli"]


def _manifest(tar) -> dict:
    with tarfile.open(tar) as t:
        return json.loads(t.extractfile("manifest.json").read())


def _build(model, tar) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "build", str(model), "-t", "x86", "-o", str(tar)], capture_output=True, text=True)


def test_custom_domain_op_named_relu_runs_its_local_function_like_onnxruntime(tmp_path):
    model = onnx_cases.custom_domain_relu_function(tmp_path / "custom.onnx")
    result = _build(model, tmp_path / "custom.tar")
    assert result.returncode == 0, result.stderr
    errors = compare(tmp_path / "custom.tar", model)  # onnxruntime runs the function: -2x, not 2 relu(x)
    assert max(errors) < 1e-6


def test_custom_domain_op_without_a_function_is_refused_naming_domain_op_node_and_opset(tmp_path):
    model = onnx_cases.custom_domain_relu_function(tmp_path / "custom.onnx", with_function=False)
    result = _build(model, tmp_path / "custom.tar")
    assert result.returncode == 2
    lines = [ln for ln in result.stderr.splitlines() if not ln.startswith("[")]  # progress lines are "[  0.1s] …"
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr
    assert "'com.example::Relu'" in lines[0] and "'custom_relu'" in lines[0] and "opset 17" in lines[0]
    assert not (tmp_path / "custom.tar").exists()


def test_channels_last_failure_falls_back_to_model_layout_and_the_manifest_says_why(tmp_path):
    model = onnx_cases.conv_dropout_with_used_mask(tmp_path / "dropmask.onnx")
    tar = tmp_path / "dropmask.tar"
    result = _build(model, tar)
    assert result.returncode == 0, result.stderr
    assert "fallback [channels-last, graph]" in result.stderr
    manifest = _manifest(tar)
    assert [f["transform"] for f in manifest["fallbacks"]] == ["channels-last"]
    assert "Expected nested to match tuple" in manifest["fallbacks"][0]["reason"]
    assert manifest["targets"][0]["conv_layout"] == "model"
    assert max(compare(tar, model)) < 1e-4


def test_dropout_is_the_identity_so_a_cnn_with_dropout_keeps_channels_last(tmp_path):
    model = onnx_cases.conv_dropout_with_used_mask(tmp_path / "dropout.onnx", use_mask=False)
    tar = tmp_path / "dropout.tar"
    result = _build(model, tar)
    assert result.returncode == 0, result.stderr
    manifest = _manifest(tar)
    assert manifest["fallbacks"] == [] and manifest["targets"][0]["conv_layout"] == "NHWC"
    assert max(compare(tar, model)) < 1e-4


def test_prepacking_failure_of_one_task_builds_that_task_with_plain_weights(monkeypatch, tmp_path):
    from tlmpack.frontend import load_model
    from tlmpack.graph import fuse_to_tir, partition
    from tlmpack.lower import prepack
    from tlmpack.lower.x86 import x86_target
    from tlmpack.schedule.select import schedule_tasks

    def broken(*args, **kwargs):
        raise RuntimeError("InternalError: Check failed: layout rewrite exploded")

    monkeypatch.setattr(prepack, "split_prepack", broken)
    model = legacy_cnns.write("mobilenet_v1_clip", tmp_path / "m.onnx")
    graph = partition(fuse_to_tir(load_model(str(model)).mod))
    target = x86_target()
    scheduled = schedule_tasks(graph, target.tvm_target(), "x86")
    assert scheduled.splits == {}
    assert scheduled.fallbacks and {f.transform for f in scheduled.fallbacks} == {"pre-packing"}
    assert all("layout rewrite exploded" in f.reason for f in scheduled.fallbacks)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(legacy_cnns.MODELS))
def test_legacy_opset7_to_9_cnn_matches_onnxruntime(tmp_path, name):
    model = legacy_cnns.write(name, tmp_path / f"{name}.onnx")
    result = _build(model, tmp_path / f"{name}.tar")
    assert result.returncode == 0, result.stderr
    assert max(compare(tmp_path / f"{name}.tar", model)) < 1e-4


def test_shape_computed_at_run_time_is_folded_and_matches_onnxruntime(tmp_path):
    model = onnx_cases.computed_shape_constant(tmp_path / "shapes.onnx")
    result = _build(model, tmp_path / "shapes.tar")
    assert result.returncode == 0, result.stderr
    assert max(compare(tmp_path / "shapes.tar", model)) < 1e-6


def test_cuda_codegen_failure_of_one_task_gives_that_task_dlight(monkeypatch, tmp_path):
    from tlmpack.errors import LoweringError
    from tlmpack.frontend import load_model
    from tlmpack.graph import fuse_to_tir, partition
    from tlmpack.graph_fallbacks import cuda_kernels_with_fallback
    from tlmpack.lower import cuda as lower_cuda
    from tlmpack.schedule.select import schedule_cuda_tasks

    if lower_cuda.find_nvcc() is None:
        pytest.skip("needs nvcc (CUDA code generation needs no GPU)")
    model = legacy_cnns.write("mobilenet_v1_clip", tmp_path / "m.onnx")
    graph = partition(fuse_to_tir(load_model(str(model)).mod))
    cuda = lower_cuda.cuda_target()
    funcs, records, _ = schedule_cuda_tasks(graph, cuda, scheduler="heuristic")
    bad = graph.tasks[0].id
    chosen = funcs[bad]
    real = lower_cuda.generate

    def generate(fs, target):
        if fs.get(bad) is chosen:
            raise LoweringError("TVM failed to build the CUDA kernels: InternalError: Check failed: boom")
        return real(fs, target)

    monkeypatch.setattr(lower_cuda, "generate", generate)
    kernels, new_records, fallbacks = cuda_kernels_with_fallback(funcs, records, graph, cuda, tmp_path / "nvcc",
                                                                 lambda s: None)
    assert [(f.transform, f.scope) for f in fallbacks] == [("cuda-schedule", bad)]
    assert "boom" in fallbacks[0].reason
    assert next(r for r in new_records if r.task == bad).chosen_by == "dlight"
    assert set(kernels.launches) == set(funcs)


def test_x86_compile_failure_of_one_task_gives_it_the_fixed_rules_on_plain_weights(monkeypatch, tmp_path):
    from tlmpack.errors import LoweringError
    from tlmpack.frontend import load_model
    from tlmpack.graph import fuse_to_tir, partition
    from tlmpack.graph_fallbacks import x86_kernels_with_fallback
    from tlmpack.lower import x86 as lower_x86
    from tlmpack.schedule.select import schedule_tasks

    model = legacy_cnns.write("mobilenet_v1_clip", tmp_path / "m.onnx")
    graph = partition(fuse_to_tir(load_model(str(model)).mod))
    target = lower_x86.x86_target()
    scheduled = schedule_tasks(graph, target.tvm_target(), "x86", "heuristic")
    bad = next(iter(scheduled.splits))  # a task whose weight is pre-packed
    chosen = scheduled.funcs[bad]
    real = lower_x86.build_kernels

    def build_kernels(funcs, tgt, out):
        if funcs.get(bad) is chosen:
            raise LoweringError("TVM failed to build the x86 kernels: InternalError: Check failed: boom")
        return real(funcs, tgt, out)

    monkeypatch.setattr(lower_x86, "build_kernels", build_kernels)
    fallbacks = x86_kernels_with_fallback(scheduled, graph, target, tmp_path / "k.o", 8, lambda s: None)
    assert [(f.transform, f.scope) for f in fallbacks] == [("x86-schedule", bad)]
    assert bad not in scheduled.splits and (tmp_path / "k.o").stat().st_size > 0
    assert next(r for r in scheduled.records if r.task == bad).chosen_by not in ("heuristic", "tlm")


def test_x86_task_whose_fixed_rules_fail_too_gets_the_unscheduled_loop_nest(monkeypatch, tmp_path):
    """A TVM bug that trips the rules' schedule as well (an fp16 matmul on an AVX-512 target, where
    the TLM had fallen back to the rules) must still build: the task gets TVM's plain loop nest."""
    import tvm_ffi

    from tlmpack.errors import LoweringError
    from tlmpack.frontend import load_model
    from tlmpack.graph import fuse_to_tir, partition
    from tlmpack.graph_fallbacks import x86_kernels_with_fallback
    from tlmpack.lower import x86 as lower_x86
    from tlmpack.schedule.select import schedule_tasks

    model = legacy_cnns.write("mobilenet_v1_clip", tmp_path / "m.onnx")
    graph = partition(fuse_to_tir(load_model(str(model)).mod))
    target = lower_x86.x86_target()
    scheduled = schedule_tasks(graph, target.tvm_target(), "x86", "heuristic")
    bad = next(iter(scheduled.splits))
    real = lower_x86.build_kernels

    def build_kernels(funcs, tgt, out):
        if bad in funcs and not tvm_ffi.structural_equal(funcs[bad], graph.task_funcs[bad]):
            raise LoweringError("TVM failed to build the x86 kernels: InternalError: Check failed: boom")
        return real(funcs, tgt, out)

    monkeypatch.setattr(lower_x86, "build_kernels", build_kernels)
    fallbacks = x86_kernels_with_fallback(scheduled, graph, target, tmp_path / "k.o", 8, lambda s: None)
    assert [(f.transform, f.scope) for f in fallbacks] == [("x86-schedule", bad)]
    assert next(r for r in scheduled.records if r.task == bad).chosen_by == "unscheduled"
    assert (tmp_path / "k.o").stat().st_size > 0
