"""Dynamic batch (`tlmpack build --batch 1,4,16`): one artifact whose plans cover any batch from 1 to
the largest, exactly, split over smaller plans or padded to a larger one; every batch matches
onnxruntime; batches outside the plans are refused by name and shape, in Python and in C; the
manifest, `m.inputs` and `tlmpack inspect` show the symbolic batch; fixed-shape builds are unchanged
(format_version 2); the CUDA plans are generated (one table per batch plan in cuda/plan.so) without a GPU.

The model is written here with onnx.helper: a conv + pool + matmul CNN whose axis 0 is a dim_param.
"""

from __future__ import annotations

import ctypes
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

BATCHES = (1, 4, 16)


def tiny_cnn(path: Path, batch_dim: str | int = "N") -> Path:
    """Conv(3→8) → Relu → GlobalAveragePool → Flatten → MatMul + Add(10), seeded random weights."""
    import onnx
    from onnx import TensorProto, numpy_helper
    from onnx import helper as h

    rng = np.random.default_rng(0)
    consts = {"w": rng.standard_normal((8, 3, 3, 3)) * 0.3, "b": rng.standard_normal(8) * 0.1,
              "g": rng.standard_normal((8, 10)) * 0.3, "gb": rng.standard_normal(10) * 0.1}
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in consts.items()]
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c"], ["r"]),
             h.make_node("GlobalAveragePool", ["r"], ["p"]), h.make_node("Flatten", ["p"], ["f"]),
             h.make_node("MatMul", ["f", "g"], ["m"]), h.make_node("Add", ["m", "gb"], ["y"])]
    graph = h.make_graph(nodes, "tiny_cnn", [h.make_tensor_value_info("x", TensorProto.FLOAT, [batch_dim, 3, 8, 8])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, [batch_dim, 10])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def dynamic(tmp_path_factory):
    """(onnx path, artifact .tar, extracted folder) of the tiny CNN built with --batch 1,4,16."""
    from tlmpack.build import BuildOptions, build

    out = tmp_path_factory.mktemp("dynamic-batch")
    onnx_path = tiny_cnn(out / "tiny.onnx")
    tar = out / "tiny.tar"
    build(str(onnx_path), tar, BuildOptions(batches=BATCHES))
    folder = out / "x"
    with tarfile.open(tar) as t:
        t.extractall(folder, filter="data")
    return onnx_path, tar, folder


@pytest.fixture(scope="module")
def model(dynamic):
    import tlmpack.runtime as rt

    with rt.load(dynamic[1], device="cpu") as m:
        yield m


def _reference(onnx_path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    ref = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.isfinite(ref).all() and np.abs(ref).max() > 1e-3  # a reference that can tell outputs apart
    return ref


@pytest.mark.parametrize("batch", [1, 3, 4, 7, 16])
def test_every_batch_matches_onnxruntime(dynamic, model, batch):
    x = np.random.default_rng(batch).standard_normal((batch, 3, 8, 8)).astype(np.float32)
    y = model.run(None, {"x": x})[0]
    ref = _reference(dynamic[0], x)
    assert y.shape == (batch, 10)
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-4


def test_padded_and_split_runs_do_not_mix_samples(model):
    """Sample i of a batch-7 run (4 + 4 padded) equals a batch-1 run of sample i alone."""
    x = np.random.default_rng(7).standard_normal((7, 3, 8, 8)).astype(np.float32)
    together = model.run(None, {"x": x})[0]
    alone = np.concatenate([model.run(None, {"x": x[i:i + 1]})[0] for i in range(7)])
    np.testing.assert_allclose(together, alone, rtol=1e-5, atol=1e-6)


def test_inputs_and_outputs_show_the_symbolic_batch(model):
    assert [(s.name, s.shape) for s in model.inputs] == [("x", ("batch", 3, 8, 8))]
    assert [(s.name, s.shape) for s in model.outputs] == [("y", ("batch", 10))]
    assert model.batch_plans == list(BATCHES)
    assert "batch plans 1,4,16" in model.device_name


@pytest.mark.parametrize("batch", [0, 17])
def test_batch_outside_the_plans_names_input_and_shapes(model, batch):
    import tlmpack.runtime as rt

    with pytest.raises(rt.InputError, match=r"input 'x': expected shape \(batch, 3, 8, 8\) with batch in 1\.\.16, "
                                            rf"got \({batch}, 3, 8, 8\)"):
        model.run(None, {"x": np.zeros((batch, 3, 8, 8), np.float32)})


def test_wrong_inner_dim_names_input_and_shapes(model):
    import tlmpack.runtime as rt

    with pytest.raises(rt.InputError, match=r"input 'x': expected shape \(2, 3, 8, 8\), got \(2, 3, 9, 8\)"):
        model.run(None, {"x": np.zeros((2, 3, 9, 8), np.float32)})


def test_manifest_lists_batch_plans_and_shares_one_weights_file(dynamic):
    folder = dynamic[2]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["format_version"] == 3
    assert [p["batch"] for p in manifest["batch_plans"]] == list(BATCHES)
    assert manifest["inputs"][0]["shape"] == ["batch", 3, 8, 8]
    assert sorted(p.name for p in folder.rglob("weights.bin")) == ["weights.bin"]
    # the constants are stored once: 8x3x3x3 + 8 + 8x10 + 10 floats, however the plans pack them
    assert manifest["memory"]["weights_bytes"] < 2 * 4 * (216 + 8 + 80 + 10) + 4 * 64
    assert (folder / "batch_plans").read_text().splitlines()[0] == "tlmpack batch plans 1"


def test_manifest_records_layout_ops_per_plan_as_a_fixed_build_does(dynamic):
    manifest = json.loads((dynamic[2] / "manifest.json").read_text())
    x86 = next(t for t in manifest["targets"] if t["kind"] == "x86")
    assert x86["conv_layout"] == "NHWC" and x86["layout_ops"] is True  # a conv model, channels-last on x86
    assert [p["x86"]["layout_ops"] for p in manifest["batch_plans"]] == [True] * len(BATCHES)


def test_inspect_lists_the_batch_plans_and_how_other_batches_run(dynamic):
    from click.testing import CliRunner

    from tlmpack.cli import main

    result = CliRunner().invoke(main, ["inspect", str(dynamic[1])])
    assert result.exit_code == 0, result.output
    assert "('batch', 3, 8, 8)" in result.output
    for b in BATCHES:
        assert f"batch plan {b:>4}: x86 " in result.output
    from tlmpack.runtime.batching import cover

    manifest = json.loads((dynamic[2] / "manifest.json").read_text())
    costs = {p["batch"]: p["cost"]["x86"] for p in manifest["batch_plans"]}
    for b in (3, 7):  # the covers the plans' recorded costs give (they follow the schedules chosen)
        assert f"{b}→{'+'.join(map(str, cover(b, costs)))}" in result.output


def test_cli_run_with_random_inputs_feeds_the_largest_plan(dynamic):
    from click.testing import CliRunner

    from tlmpack.cli import main

    result = CliRunner().invoke(main, ["run", str(dynamic[1]), "--random-inputs", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "y float32 (16, 10)" in result.output


def test_measured_costs_replace_the_estimates_and_keep_outputs_right(dynamic, model):
    from tlmpack.runtime import _capi

    costs = model.calibrate_batch_plans(runs=1)
    assert sorted(costs) == list(BATCHES) and min(costs.values()) > 0 and model.batch_costs == costs
    model._set_batch_costs({1: 1000, 4: 1000, 16: 1000})  # every batch now runs padded to 16 or exact
    x = np.random.default_rng(5).standard_normal((5, 3, 8, 8)).astype(np.float32)
    ref = _reference(dynamic[0], x)
    assert np.linalg.norm(model.run(None, {"x": x})[0] - ref) / np.linalg.norm(ref) < 1e-4
    values = (ctypes.c_int64 * 2)(1, 2)
    assert model._lib.lib.tlmrt_model_set_batch_costs(model._handle, 2, values) == _capi.ERR_INVALID_ARGUMENT
    assert "expected 3 costs (one per batch plan), found 2" in model._lib.last_error(model._handle)
    model._set_batch_costs(model._estimated_costs)


def test_cover_follows_the_cost_model():
    from tlmpack.runtime.batching import PlanWork, cover, plan_costs

    def work(per_sample_flops: int, calls: int, lane_factor: dict | None = None) -> dict:
        lane_factor = lane_factor or {}
        return {b: PlanWork(calls, per_sample_flops * b, round(per_sample_flops * b * lane_factor.get(b, 1)), 4096 * b)
                for b in BATCHES}

    # x86, work that grows with the batch (a call is cheap against it): in-between batches split
    x86 = plan_costs(work(50_000_000, 20), "x86")
    assert cover(4, x86) == [4] and cover(3, x86) == [1, 1, 1] and cover(7, x86) == [4, 1, 1, 1]
    assert cover(5, x86) == [4, 1]
    # the batch-1 and -4 plans' reductions run in serial inner loops (8x the lane work), the batch-16
    # plan's are vectorized: in-between batches pad to 16 instead
    serial = plan_costs(work(50_000_000, 20, {1: 8, 4: 8}), "x86")
    assert cover(7, serial) == [16] and cover(3, serial) == [16]
    # only the batch-4 plan's: the batch-1 plan is the cheaper way to 7
    serial4 = plan_costs(work(50_000_000, 20, {4: 8}), "x86")
    assert cover(7, serial4) == [1] * 7
    # a tiny model (its calls cost more than its work) pads on x86 too
    tiny = plan_costs(work(30_000, 4), "x86")
    assert cover(3, tiny) == [4] and cover(7, tiny) == [16]
    # CUDA: launches dominate a small model's run, so padding wins
    cuda = plan_costs(work(5_000_000, 20), "cuda")
    assert cover(7, cuda) == [16] and cover(3, cuda) == [4]
    # the bench CNN's CUDA plans as built (bench/dynamic_batch.py): on the H200 exact 16 ran 0.356 ms,
    # 4 + 4 0.540 ms; the estimate must pad
    cnn = plan_costs({1: PlanWork(12, 162_809_162, 162_809_162, 3_191_120),
                      4: PlanWork(12, 651_236_648, 651_236_648, 10_307_528),
                      16: PlanWork(12, 2_604_946_592, 2_604_946_592, 38_773_160)}, "cuda")
    assert cover(7, cnn) == [16] and cover(3, cnn) == [4]
    with pytest.raises(ValueError):
        cover(17, x86)


def test_manifest_records_each_plans_work_and_its_estimate(dynamic):
    from tlmpack.runtime.batching import PlanWork, estimate_ns

    folder = dynamic[2]
    plans = json.loads((folder / "manifest.json").read_text())["batch_plans"]
    works = [PlanWork.from_json(p["x86"]["work"]) for p in plans]
    assert [w.calls for w in works] == [p["x86"]["kernel_calls"] for p in plans]
    assert 0 < works[0].flops < works[1].flops < works[2].flops and all(w.lane_flops >= w.flops for w in works)
    assert [p["cost"]["x86"] for p in plans] == [estimate_ns(w, "x86") for w in works]
    lines = (folder / "batch_plans").read_text().splitlines()[1:]
    assert lines == [f"x86 {p['batch']} {p['cost']['x86']}" for p in plans]


def test_lane_factor_counts_serial_reductions_as_one_lane():
    from tvm import s_tir, te

    from tlmpack.schedule.estimate import lane_factor, reduction_lanes, task_flops

    a, b = te.placeholder((16, 32), name="A"), te.placeholder((32, 64), name="B")
    k = te.reduce_axis((0, 32), name="k")
    c = te.compute((16, 64), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    plain = te.create_prim_func([a, b, c])
    assert task_flops({"t": plain}) == {"t": 2 * 16 * 64 * 32}
    assert reduction_lanes(plain) == 1 and lane_factor(plain, 8) == 8.0
    sch = s_tir.Schedule(plain)
    i, j, kk = sch.get_loops(sch.get_sblock("C"))
    jo, ji = sch.split(j, [None, 8])
    sch.reorder(i, jo, kk, ji)
    sch.vectorize(ji)
    assert reduction_lanes(sch.mod["main"]) == 8 and lane_factor(sch.mod["main"], 8) == 1.0


def _c_model(folder: Path):
    from tlmpack.runtime import _capi

    lib = _capi.load_library()
    return lib, lib.open_model(folder, 1, verify_files=True)


def test_c_api_takes_the_batch_from_the_callers_shapes(dynamic, model):
    from tlmpack.runtime import _capi

    lib, handle = _c_model(dynamic[2])
    try:
        assert lib.batch_plans(handle) == list(BATCHES)
        info = lib.tensor_infos(handle, outputs=False)[0]
        assert info.shape[0] == -1 and info.nbytes == 3 * 8 * 8 * 4  # symbolic batch, one sample's bytes
        x = np.random.default_rng(3).standard_normal((7, 3, 8, 8)).astype(np.float32)
        y = np.zeros((7, 10), np.float32)
        shape = (ctypes.c_int64 * 4)(*x.shape)
        shapes = (ctypes.POINTER(ctypes.c_int64) * 1)(ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)))
        ins = (_capi.IO * 1)(_capi.IO(x.ctypes.data, x.nbytes, _capi.DEVICE_CPU, 0))
        outs = (_capi.IO * 1)(_capi.IO(y.ctypes.data, y.nbytes, _capi.DEVICE_CPU, 0))
        assert lib.lib.tlmrt_model_run_shaped(handle, shapes, ins, outs) == _capi.OK, lib.last_error(handle)
        np.testing.assert_allclose(y, model.run(None, {"x": x})[0], rtol=1e-6)

        bad = (ctypes.c_int64 * 4)(20, 3, 8, 8)
        shapes[0] = ctypes.cast(bad, ctypes.POINTER(ctypes.c_int64))
        assert lib.lib.tlmrt_model_run_shaped(handle, shapes, ins, outs) == _capi.ERR_INVALID_ARGUMENT
        assert lib.last_error(handle) == ("input 0 (x): expected shape (batch, 3, 8, 8) with batch in 1..16, "
                                          "found (20, 3, 8, 8)")
    finally:
        lib.lib.tlmrt_model_close(handle)


def test_c_api_run_of_an_older_caller_takes_the_batch_from_the_buffer_sizes(dynamic):
    from tlmpack.runtime import _capi

    lib, handle = _c_model(dynamic[2])
    try:
        x = np.ones((5, 3, 8, 8), np.float32)
        y = np.zeros((5, 10), np.float32)
        ins = (ctypes.c_void_p * 1)(x.ctypes.data)
        outs = (ctypes.c_void_p * 1)(y.ctypes.data)
        assert lib.lib.tlmrt_model_run(handle, ins, (ctypes.c_uint64 * 1)(x.nbytes), outs,
                                       (ctypes.c_uint64 * 1)(y.nbytes)) == _capi.OK
        assert np.allclose(y, y[0]) and np.abs(y).max() > 0  # five equal samples, computed
        status = lib.lib.tlmrt_model_run(handle, ins, (ctypes.c_uint64 * 1)(x.nbytes - 4), outs,
                                         (ctypes.c_uint64 * 1)(y.nbytes))
        assert status == _capi.ERR_INVALID_ARGUMENT and "one sample" in lib.last_error(handle)
    finally:
        lib.lib.tlmrt_model_close(handle)


def test_c_driver_runs_every_batch_and_concurrent_batches(dynamic, tmp_path):
    """tests/c/batch_model.c over the artifact: every batch against one-sample runs, under the artifact's
    costs and under costs that pad everything, and 8 threads of different batches at once."""
    import os
    import subprocess

    from tlmpack.runtime._capi import PACKAGE_LIB

    repo = Path(__file__).resolve().parent.parent
    exe = tmp_path / "batch_model"
    subprocess.run([os.environ.get("CC", "cc"), "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror",
                    f"-I{repo / 'runtime_c'}", str(repo / "tests" / "c" / "batch_model.c"), "-o", str(exe),
                    f"-L{PACKAGE_LIB.parent}", "-ltlmrt", f"-Wl,-rpath,{PACKAGE_LIB.parent}", "-lpthread"], check=True)
    proc = subprocess.run([str(exe), str(dynamic[2])], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("ALL_OK"), proc.stdout + proc.stderr
    assert "REFUSED: input 0 (x): expected shape (batch, 3, 8, 8) with batch in 1..16, found (17, 3, 8, 8)" in proc.stdout
    plans = json.loads((dynamic[2] / "manifest.json").read_text())["batch_plans"]
    assert f"ARENA {max(p['x86']['arena_bytes'] for p in plans)}\n" in proc.stdout


def test_plans_share_one_arena_the_size_of_the_largest(dynamic):
    """Plans run one after another within a run, so a CPU model has one arena of the largest plan's size
    (not the sum over plans), whatever batches run one after another."""
    import tlmpack.runtime as rt

    _, tar, folder = dynamic
    arenas = [p["x86"]["arena_bytes"] for p in json.loads((folder / "manifest.json").read_text())["batch_plans"]]
    assert sum(arenas) > max(arenas)
    with rt.load(tar, device="cpu") as m:
        assert m.arena_bytes == max(arenas)
        x = np.random.default_rng(3).standard_normal((16, 3, 8, 8)).astype(np.float32)
        full = m.run(None, {"x": x})[0]
        for b in (1, 3, 7, 16):
            np.testing.assert_allclose(m.run(None, {"x": x[:b]})[0], full[:b], rtol=1e-5, atol=1e-6)
        assert m.arena_bytes == max(arenas)


def test_a_fixed_shape_build_stays_format_version_2_without_batch_plans(tmp_path):
    import tlmpack.runtime as rt
    from tlmpack.build import BuildOptions, build
    from tlmpack.runtime.preflight import manifest_of

    onnx_path = tiny_cnn(tmp_path / "tiny.onnx", batch_dim=2)
    build(str(onnx_path), tmp_path / "fixed.tar", BuildOptions())
    manifest = manifest_of(str(tmp_path / "fixed.tar"))
    assert manifest["format_version"] == 2 and "batch_plans" not in manifest
    assert "batches" not in manifest["build_options"]
    with rt.load(tmp_path / "fixed.tar", device="cpu") as m:
        assert m.batch_plans == [] and m.inputs[0].shape == (2, 3, 8, 8)
        assert m.arena_bytes == manifest["targets"][0]["arena_bytes"] > 0  # its one arena
        x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
        ref = _reference(onnx_path, x)
        assert np.linalg.norm(m.run(None, {"x": x})[0] - ref) / np.linalg.norm(ref) < 1e-4


def test_batch_on_a_fixed_batch_model_is_refused_with_the_shape(tmp_path):
    from tlmpack.build import BuildOptions, build
    from tlmpack.errors import InputShapeError

    onnx_path = tiny_cnn(tmp_path / "fixed.onnx", batch_dim=1)
    with pytest.raises(InputShapeError, match=r"input 'x' has a fixed batch dimension 1 \(shape \(1, 3, 8, 8\)\)"):
        build(str(onnx_path), tmp_path / "x.tar", BuildOptions(batches=(1, 4)))


def test_cli_batch_on_a_fixed_batch_model_is_a_one_line_error(tmp_path):
    from click.testing import CliRunner

    from tlmpack.cli import main

    onnx_path = tiny_cnn(tmp_path / "fixed.onnx", batch_dim=1)
    result = CliRunner().invoke(main, ["build", str(onnx_path), "--max-batch", "4", "-o", str(tmp_path / "x.tar")])
    assert result.exit_code == 2
    assert "fixed batch dimension 1" in result.output and "Traceback" not in result.output


def test_batch_options_parse():
    from tlmpack.errors import InputShapeError
    from tlmpack.frontend.batch import parse_batches

    assert parse_batches("16,1,4", None) == (1, 4, 16)
    assert parse_batches(None, 12) == (1, 2, 4, 8, 12)
    assert parse_batches(None, None) == ()
    for bad in ("0,4", "a,b"):
        with pytest.raises(InputShapeError):
            parse_batches(bad, None)
    with pytest.raises(InputShapeError):
        parse_batches("1,4", 8)


def test_cuda_plans_are_one_table_per_batch_plan(tmp_path):
    from tlmpack.build import BuildOptions, build
    from tlmpack.emit.cuda_plan import read_cuda_plan
    from tlmpack.lower.cuda import find_nvcc

    if find_nvcc() is None:
        pytest.skip("nvcc not found: the cuda target cannot be built here")
    onnx_path = tiny_cnn(tmp_path / "tiny.onnx")
    manifest = build(str(onnx_path), tmp_path / "cuda.tar", BuildOptions(targets=("cuda",), batches=(1, 4),
                                                                         scheduler="dlight"))
    folder = tmp_path / "x"
    with tarfile.open(tmp_path / "cuda.tar") as t:
        t.extractall(folder, filter="data")
    assert "batch_plans" in manifest["targets"][0]["files"]
    largest = read_cuda_plan(folder / "cuda" / "plan.so")
    small = read_cuda_plan(folder / "cuda" / "plan.so", "tlmrt_cuda_plan_b1_v1")
    tensor = largest["tensors"][largest["inputs"][0][1]]
    assert tensor["shape"] == (4, 3, 8, 8)
    assert small["tensors"][small["inputs"][0][1]]["shape"] == (1, 3, 8, 8)
    assert small["weights_sha256"] == largest["weights_sha256"]  # one weights.bin for both plans
    assert {launch["kernel"] for launch in small["launches"]}.isdisjoint({launch["kernel"] for launch in largest["launches"]}) \
        or small["launches"]  # distinct kernels per batch where the shapes differ; every plan launches some
    from tlmpack.runtime.batching import PlanWork, estimate_ns

    works = {p["batch"]: PlanWork.from_json(p["cuda"]["work"]) for p in manifest["batch_plans"]}
    assert works[1].calls == len(small["launches"]) and works[4].calls == len(largest["launches"])
    assert works[1].lane_flops == works[1].flops > 0  # no lane factor on CUDA
    costs = [f"cuda {b} {estimate_ns(w, 'cuda')}" for b, w in sorted(works.items())]
    assert (folder / "batch_plans").read_text().splitlines()[1:] == costs
