"""The x86 spine end to end: ONNX / torch.export → artifact → tlmpack.runtime, checked against references."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from tlmpack.verify import check_input_sensitive, check_live, onnxruntime_outputs, random_feed, rel_err

TOLERANCE = 1e-4
CLI = [sys.executable, "-m", "tlmpack.cli"]


@pytest.mark.parametrize("name", ["mlp", "resnet-tiny", "bert-tiny", "gpt2-tiny"])
def test_artifact_matches_onnxruntime_on_fresh_inputs(build_zoo_model, name):
    import tlmpack.runtime as rt

    onnx_path, tar = build_zoo_model(name)
    from tlmpack import zoo

    model = rt.load(tar)
    previous = None
    for seed in (11, 12):
        feed = zoo.random_inputs(name, seed)  # token ids stay inside each model's vocabulary
        refs = onnxruntime_outputs(onnx_path, feed)
        for i, (spec, out, ref) in enumerate(zip(model.outputs, model.run(None, feed), refs, strict=True)):
            check_live(spec.name, ref)
            if previous is not None:
                check_input_sensitive(spec.name, previous[i], ref)
            assert out.shape == ref.shape
            assert rel_err(out, ref) < TOLERANCE, spec.name
        previous = refs


def test_torch_export_factory_matches_torch(tmp_path):
    import torch

    import tlmpack.runtime as rt
    from tlmpack import zoo
    from tlmpack.build import BuildOptions, build

    tar = tmp_path / "mlp_torch.tar"
    manifest = build("tlmpack.zoo:mlp_factory", tar, BuildOptions())
    assert manifest["model"]["format"] == "torch"
    module, _example, _, _ = zoo.get_model("mlp")
    model = rt.load(tar)
    feed = random_feed(model.inputs, 5)
    with torch.no_grad():
        ref = module(*(torch.from_numpy(feed[s.name]) for s in model.inputs)).numpy()
    check_live("out", ref)
    (out,) = model.run(None, feed)
    assert rel_err(out, ref) < TOLERANCE


def test_two_builds_are_byte_identical(build_zoo_model, tmp_path):
    from tlmpack.build import BuildOptions, build

    onnx_path, first = build_zoo_model("bert-tiny")
    second = tmp_path / "again.tar"
    build(str(onnx_path), second, BuildOptions())
    assert first.read_bytes() == second.read_bytes()


def test_manifest_records_each_subgraph_schedule_as_decisions(build_zoo_model):
    from tlmpack.tlm.model import load

    _, tar = build_zoo_model("resnet-tiny")
    with tarfile.open(tar) as t:
        manifest = json.load(t.extractfile("manifest.json"))
        names = t.getnames()
        files = {m.name for m in t.getmembers() if m.isfile()}
    assert manifest["format_version"] == 2
    assert {"weights.bin", "x86/model.so", "runtime_c/libtlmrt.so", "include/tlmrt.h", "SHA256SUMS"} <= set(names)
    assert set(manifest["files"]) == files - {"manifest.json", "SHA256SUMS"}
    chosen, pooled = set(), False
    taught_channels_last = load("x86").summary.channels_last
    for subgraph in manifest["subgraphs"]:
        (schedule,) = subgraph["schedules"]
        assert schedule["target"] == "x86"
        chosen.add(schedule["chosen_by"])
        if schedule["chosen_by"] == "tlm":  # the model's id and confidence
            assert schedule["note"].startswith(manifest["tlm"]["x86"]["id"])
        else:  # the rules, and why the model did not choose
            assert schedule["chosen_by"] == "heuristic" and schedule["note"].startswith("tlm fallback: ")
        if "conv2d" in subgraph["name"] and not taught_channels_last:  # not what these weights were trained on
            assert schedule["note"].startswith("tlm fallback: channels-last convolution")
        if "conv2d" in subgraph["name"] and taught_channels_last:
            assert "channels-last convolution" not in schedule["note"]
        if "pool2d" in subgraph["name"]:
            assert schedule["note"].startswith("tlm fallback: channels-last pooling")
            pooled = True
        assert schedule["sketch"] >= 0
        if "conv2d" in subgraph["name"] and "x86-matmul" in schedule["note"] + "tlm":
            assert schedule["decisions"] and "pre-packed" in schedule["note"]
    assert pooled, "resnet-tiny's stem max pool is the channels-last pooling this test checks"
    if "tlm" in chosen:
        assert len(manifest["tlm"]["x86"]["sha256"]) == 64
    (x86,) = manifest["targets"]
    assert x86["conv_layout"] == "NHWC" and x86["hardware"]["vector_bits"] in (256, 512)
    assert manifest["memory"]["arena_bytes"] <= manifest["memory"]["unplanned_bytes"]


def test_baseline_scheduler_keeps_the_first_release_rules_and_matches_onnxruntime(build_zoo_model, tmp_path):
    import tlmpack.runtime as rt
    from tlmpack import zoo
    from tlmpack.build import BuildOptions, build

    onnx_path, _ = build_zoo_model("resnet-tiny")
    tar = tmp_path / "baseline.tar"
    manifest = build(str(onnx_path), tar, BuildOptions(scheduler="baseline"))
    assert {s["schedules"][0]["chosen_by"] for s in manifest["subgraphs"]} <= {"default", "sampled"}
    assert manifest["targets"][0]["conv_layout"] == "model"
    feed = zoo.random_inputs("resnet-tiny", 1)
    (ref,) = onnxruntime_outputs(onnx_path, feed)
    (out,) = rt.load(tar).run(None, feed)
    assert rel_err(out, ref) < TOLERANCE


def test_identical_subgraphs_share_one_kernel(build_zoo_model):
    _, tar = build_zoo_model("bert-tiny")
    with tarfile.open(tar) as t:
        manifest = json.load(t.extractfile("manifest.json"))
    calls = sum(s["calls"] for s in manifest["subgraphs"])
    assert calls == manifest["plan"]["kernel_calls"]
    assert len(manifest["subgraphs"]) < calls  # two identical layers reuse their kernels


def test_flipped_weight_byte_is_refused_before_any_kernel_runs(build_zoo_model, tmp_path):
    import tlmpack.runtime as rt
    from tlmpack.runtime.errors import ArtifactError

    _, tar = build_zoo_model("mlp")
    folder = tmp_path / "art"
    with tarfile.open(tar) as t:
        t.extractall(folder, filter="data")
    weights = folder / "weights.bin"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="weights.bin"):
        rt.load(folder)


def test_c_example_prints_the_same_outputs_as_python(build_zoo_model, tmp_path):
    import tlmpack.runtime as rt

    _, tar = build_zoo_model("resnet-tiny")
    folder = tmp_path / "art"
    with tarfile.open(tar) as t:
        t.extractall(folder, filter="data")
    exe = _build_c_example(tmp_path)
    model = rt.load(folder)
    feed = random_feed(model.inputs, 3)
    inputs = []
    for i, spec in enumerate(model.inputs):
        path = tmp_path / f"input{i}.bin"
        feed[spec.name].tofile(path)
        inputs.append(str(path))
    out_dir = tmp_path / "outs"
    out_dir.mkdir()
    result = subprocess.run([str(exe), "-o", str(out_dir), str(folder), *inputs], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    for i, (spec, expected) in enumerate(zip(model.outputs, model.run(None, feed), strict=True)):
        got = np.fromfile(out_dir / f"out_{i}.bin", dtype=spec.dtype).reshape(spec.shape)
        np.testing.assert_array_equal(got, expected)
        assert spec.name in result.stdout


def _build_c_example(folder: Path) -> Path:
    """examples/run_model.c compiled with the runtime's sources in one line, as its README says."""
    root = Path(__file__).resolve().parent.parent
    exe = folder / "run_model"
    subprocess.run(["cc", "-std=c11", "-O2", f"-I{root / 'runtime_c'}", str(root / "examples" / "run_model.c"),
                    *map(str, sorted((root / "runtime_c").glob("*.c"))), "-o", str(exe), "-lpthread", "-ldl", "-lm"],
                   check=True)
    return exe


def _onnx_with_op(path: Path, op_type: str) -> None:
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node(op_type, ["x"], ["y"], name="the_node")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_unsupported_onnx_op_names_op_and_node_and_exits_2(tmp_path):
    model = tmp_path / "bad.onnx"
    _onnx_with_op(model, "Det")
    result = subprocess.run([*CLI, "build", str(model), "-t", "x86", "-o", str(tmp_path / "bad.tar")],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert "'Det'" in result.stderr and "'the_node'" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "bad.tar").exists()


def test_malformed_onnx_file_is_a_clear_error(tmp_path):
    model = tmp_path / "junk.onnx"
    model.write_bytes(b"\x08\x07not a protobuf at all")
    result = subprocess.run([*CLI, "build", str(model), "-o", str(tmp_path / "x.tar")], capture_output=True, text=True)
    assert result.returncode == 2
    assert "junk.onnx" in result.stderr and "Traceback" not in result.stderr


def test_dynamic_input_needs_input_shape_and_says_how(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    model = tmp_path / "dyn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    from tlmpack.build import BuildOptions, build
    from tlmpack.errors import InputShapeError

    with pytest.raises(InputShapeError, match="--input-shape x:"):
        build(str(model), tmp_path / "dyn.tar", BuildOptions())
    build(str(model), tmp_path / "dyn.tar", BuildOptions(input_shapes={"x": (3, 4)}))
    import tlmpack.runtime as rt

    m = rt.load(tmp_path / "dyn.tar")
    assert m.inputs[0].shape == (3, 4)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(m.run(None, {"x": x})[0], np.maximum(x, 0))


def test_cli_inspect_lists_io_targets_and_schedules(build_zoo_model):
    _, tar = build_zoo_model("mlp")
    result = subprocess.run([*CLI, "inspect", str(tar)], capture_output=True, text=True, check=True)
    assert "input" in result.stdout and "target x86" in result.stdout and "heuristic" in result.stdout


def test_cli_run_reads_npy_inputs(build_zoo_model, tmp_path):
    import tlmpack.runtime as rt

    _, tar = build_zoo_model("mlp")
    spec = rt.load(tar).inputs[0]
    np.save(tmp_path / "x.npy", np.ones(spec.shape, dtype=spec.dtype))
    result = subprocess.run([*CLI, "run", str(tar), "--input", f"{spec.name}=@{tmp_path / 'x.npy'}"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    bad = subprocess.run([*CLI, "run", str(tar), "--input", f"nope=@{tmp_path / 'x.npy'}"], capture_output=True, text=True)
    assert bad.returncode == 2 and "nope" in bad.stderr and "Traceback" not in bad.stderr


def test_average_pool_window_covering_the_input_becomes_global_pool(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    import tlmpack.runtime as rt
    from tlmpack.build import BuildOptions, build

    node = helper.make_node("AveragePool", ["x"], ["y"], name="pool", kernel_shape=[1280, 1280],
                            strides=[1280, 1280], ceil_mode=1, count_include_pad=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 7, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 1, 1])])
    model = tmp_path / "pool.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    manifest = build(str(model), tmp_path / "pool.tar", BuildOptions())
    names = [s["name"] for s in manifest["subgraphs"]]
    assert not any("avg_pool2d" in n for n in names), names  # lowered as a mean, no 1280x1280 window
    x = np.random.default_rng(0).standard_normal((2, 8, 7, 7)).astype(np.float32)
    (ref,) = onnxruntime_outputs(model, {"x": x})
    (out,) = rt.load(tmp_path / "pool.tar").run(None, {"x": x})
    assert rel_err(out, ref) < TOLERANCE


def test_default_rules_tile_a_matmul_for_registers_and_keep_parallel_outer_loops():
    from tlmpack.schedule.select import default_decisions
    from tlmpack.schedule.space import SamplingSite

    sites = [SamplingSite(0, "tile", extent=128, parts=4, max_innermost=64),
             SamplingSite(1, "tile", extent=768, parts=4, max_innermost=64),
             SamplingSite(2, "tile", extent=768, parts=2, max_innermost=64),
             SamplingSite(3, "categorical", candidates=(0, 16, 64, 512))]
    chosen = default_decisions(sites, vector_lanes=8)
    assert chosen[0] == (8, 4, 1, 4)  # 4 register rows innermost, a block of 4 at level 1, the rest parallel
    assert chosen[1] == (48, 1, 1, 16)  # two vectors of 8 innermost: 4 x 2 = 8 accumulators
    assert chosen[2] == (96, 8)
    assert chosen[3] == 2  # unroll up to 64


def test_c_runtime_refuses_kernels_built_for_a_cpu_feature_this_cpu_lacks(tmp_path):
    import tlmpack.runtime as rt
    from tlmpack.build import BuildOptions, build
    from tlmpack.runtime.errors import IncompatibleTargetError
    from tlmpack.runtime.preflight import read_cpu_features

    if "avx512f" in read_cpu_features():
        pytest.skip("this CPU has AVX-512: no feature to miss")
    from tlmpack import zoo

    onnx_path = tmp_path / "mlp.onnx"
    zoo.export_onnx("mlp", onnx_path)
    tar = tmp_path / "mlp512.tar"
    manifest = build(str(onnx_path), tar, BuildOptions(cpu="skylake-avx512", cores=16))
    # a cross build's default is the rules (the adapted TLM lost to them on that CPU)
    assert {s["chosen_by"] for g in manifest["subgraphs"] for s in g["schedules"]} == {"heuristic"}
    with pytest.raises(IncompatibleTargetError, match="avx512f"):
        rt.load(tar, device="cpu")  # the Python preflight
    folder = tmp_path / "art"
    with tarfile.open(tar) as t:
        t.extractall(folder, filter="data")
    exe = _build_c_example(tmp_path)
    result = subprocess.run([str(exe), str(folder)], capture_output=True, text=True)  # the C runtime alone
    assert result.returncode != 0 and result.returncode != -4  # an error, not SIGILL
    assert "the kernels need the CPU feature avx512" in result.stderr


def test_exact_math_build_also_matches_onnxruntime(build_zoo_model, tmp_path):
    import tlmpack.runtime as rt
    from tlmpack import zoo
    from tlmpack.build import BuildOptions, build

    onnx_path, fast = build_zoo_model("bert-tiny")  # by default GELU's erf and softmax's exp are approximated
    with tarfile.open(fast) as t:
        assert json.load(t.extractfile("manifest.json"))["build_options"]["fast_math"] is True
    tar = tmp_path / "exact.tar"
    manifest = build(str(onnx_path), tar, BuildOptions(fast_math=False))
    assert manifest["build_options"]["fast_math"] is False
    feed = zoo.random_inputs("bert-tiny", 4)
    (ref,) = onnxruntime_outputs(onnx_path, feed)
    (out,) = rt.load(tar).run(None, feed)
    assert rel_err(out, ref) < TOLERANCE


def test_a_cross_build_takes_its_cores_and_caches_from_the_options_not_the_host(monkeypatch):
    import tlmpack.schedule.hardware as hardware
    from tlmpack.build import BuildOptions, resolve_x86_machine
    from tlmpack.errors import LoweringError

    with pytest.raises(LoweringError, match="cross build: give --cores N"):
        resolve_x86_machine(BuildOptions(cpu="skylake-avx512"))
    first = resolve_x86_machine(BuildOptions(cpu="skylake-avx512", cores=16))
    monkeypatch.setattr(hardware, "host_cores", lambda: 64)  # another build machine
    monkeypatch.setattr(hardware, "host_caches_kib", lambda: (64, 4096, 65536))
    second = resolve_x86_machine(BuildOptions(cpu="skylake-avx512", cores=16))
    assert first == second and first.cores == 16 and first.cache_kib == hardware.NAMED_CPU_CACHES_KIB["skylake-avx512"]
    assert first.to_json()["cores"] == 16 and first.to_json()["cache_kib"] == list(first.cache_kib)
    native = resolve_x86_machine(BuildOptions())  # a native build: this host's, recorded
    assert native.cores == 64 and native.cache_kib == (64, 4096, 65536)
    with pytest.raises(LoweringError, match="no cache sizes known"):
        resolve_x86_machine(BuildOptions(cpu="tigerlake", cores=4))


def test_weights_trained_on_channels_last_convolutions_are_handed_them(build_zoo_model, tmp_path):
    """A summary that says channels_last lifts that fallback (not the pooling one)."""
    import shutil

    from tlmpack.build import BuildOptions, build
    from tlmpack.tlm.model import set_summary_fields, weights_path

    onnx_path, _ = build_zoo_model("resnet-tiny")
    weights = tmp_path / "x86.safetensors"
    shutil.copy(weights_path("x86"), weights)
    set_summary_fields(weights, channels_last=True, min_confidence=0.0)
    tar = tmp_path / "taught.tar"
    build(str(onnx_path), tar, BuildOptions(tlm_weights={"x86": str(weights)}))
    with tarfile.open(tar) as t:
        manifest = json.load(t.extractfile("manifest.json"))
    notes = {s["name"]: (s["schedules"][0]["chosen_by"], s["schedules"][0].get("note", ""))
             for s in manifest["subgraphs"]}
    convs = [v for name, v in notes.items() if "conv2d" in name]
    assert convs and not any("channels-last convolution" in note for _, note in convs)
    assert any(chosen == "tlm" for chosen, _ in convs)
    assert all("channels-last pooling" in note for name, (_, note) in notes.items() if "pool2d" in name)
