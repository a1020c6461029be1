"""The compiler side of the CUDA target, checked without a GPU: `-t cuda,x86` artifacts hold cuda/plan.so,
cubins and PTX whose launch table agrees with the PTX (every kernel exists, takes the arguments the
plan passes), the x86 target beside it still matches onnxruntime, builds are reproducible, and
launches of multi-kernel tasks (global intermediates) are read from TVM's host code correctly.

Builds need nvcc (PATH, $CUDA_HOME/bin or /usr/local/cuda/bin); the TVM-only tests run without it.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from tlmpack.emit.cuda_plan import (
    ARENA,
    ARG_INT32,
    ARG_INT64,
    ARG_TENSOR,
    IMAGE_CUBIN,
    IMAGE_PTX,
    read_cuda_plan,
)
from tlmpack.lower.cuda import find_nvcc
from tlmpack.verify import check_live, onnxruntime_outputs, rel_err

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin): "
                                                            "the cuda target cannot be built here")

def ptx_entries(ptx: str) -> dict[str, list[str]]:
    """Every `.entry name(...)` of a PTX file with the types of its parameters (.u64, .u32, ...)."""
    entries = {}
    for m in re.finditer(r"\.entry\s+([A-Za-z_$][\w$]*)\s*\((.*?)\)", ptx, re.S):
        entries[m.group(1)] = re.findall(r"\.param\s+(\.\w+)", m.group(2))
    return entries


# --- builds (once per session) ------------------------------------------------------------------------

BUILDS = {"mlp": ("sm_80", "sm_90"), "bert-tiny": ()}
SCHEDULER = {"mlp": "dlight", "bert-tiny": "heuristic"}  # both CUDA schedulers go through nvcc and the plan


@pytest.fixture(scope="session")
def cuda_artifact(zoo_dir, tmp_path_factory):
    """Builds a zoo model with -t cuda,x86 once; returns (onnx path, tar path, extracted folder)."""
    from tlmpack import zoo
    from tlmpack.build import BuildOptions, build

    built: dict[str, tuple[Path, Path, Path]] = {}

    def make(name: str):
        if name not in built:
            onnx_path = zoo_dir / f"{name}.onnx"
            if not onnx_path.exists():
                zoo.export_onnx(name, onnx_path)
            out = tmp_path_factory.mktemp(f"cuda-{name}")
            tar = out / f"{name}.tar"
            build(str(onnx_path), tar, BuildOptions(targets=("x86", "cuda"), cuda_archs=BUILDS[name],
                                                    scheduler=SCHEDULER[name]))
            folder = out / "x"
            with tarfile.open(tar) as t:
                t.extractall(folder, filter="data")
            built[name] = (onnx_path, tar, folder)
        return built[name]

    return make


@needs_nvcc
@pytest.mark.parametrize("name", list(BUILDS))
def test_artifact_holds_both_targets(cuda_artifact, name):
    _, tar, folder = cuda_artifact(name)
    manifest = json.loads((folder / "manifest.json").read_text())
    archs = sorted(BUILDS[name] or ("sm_90",))
    cuda, x86 = manifest["targets"]
    assert (cuda["id"], cuda["kind"], x86["id"]) == ("cuda", "cuda", "x86")
    assert cuda["archs"] == archs and cuda["ptx"] is True and cuda["ptx_arch"] == archs[0]
    assert cuda["min_driver_version"] >= 12000  # 13000 with nvcc 13.0
    expected = {"cuda/plan.so", "cuda/kernels.ptx", *(f"cuda/{a}.cubin" for a in archs)}
    assert expected <= set(cuda["files"])
    for f in cuda["files"] + x86["files"]:
        assert (folder / f).is_file(), f
        assert manifest["files"][f] == hashlib.sha256((folder / f).read_bytes()).hexdigest()
    assert manifest["build_options"]["targets"] == ["cuda", "x86"]
    assert manifest["build_options"]["cuda_archs"] == archs
    chosen = []
    for subgraph in manifest["subgraphs"]:
        on_cuda, on_x86 = subgraph["schedules"]
        chosen.append(on_cuda["chosen_by"])
        if on_cuda["chosen_by"] == "dlight":
            assert on_cuda["sketch"] == -1
            assert on_cuda["note"] in ("Matmul", "GEMV", "Reduction", "GeneralReduction", "Fallback")
        else:  # a point of MetaSchedule's CUDA space, written as its decisions
            assert on_cuda["chosen_by"] == "heuristic" and on_cuda["sketch"] >= 0 and on_cuda["note"].startswith("cuda-")
        assert (on_cuda["target"], on_x86["target"]) == ("cuda", "x86")
    assert ("heuristic" in chosen) == (SCHEDULER[name] == "heuristic")


@needs_nvcc
@pytest.mark.parametrize("name", list(BUILDS))
def test_cuda_plan_table_agrees_with_ptx_cubins_and_graph(cuda_artifact, name):
    _, _, folder = cuda_artifact(name)
    manifest = json.loads((folder / "manifest.json").read_text())
    cuda = manifest["targets"][0]
    plan = read_cuda_plan(folder / "cuda" / "plan.so")
    weights = (folder / "weights.bin").read_bytes()
    assert plan["abi_version"] == 1
    assert plan["weights_bytes"] == len(weights) and plan["weights_sha256"] == hashlib.sha256(weights).hexdigest()
    assert plan["min_driver_version"] == cuda["min_driver_version"]
    assert plan["arena_bytes"] == cuda["arena_bytes"] >= manifest["memory"]["arena_bytes"]

    # Tensors: inside their storage, 64-byte aligned; the Graph's tensors come first, as in the x86 plan.
    tensors = plan["tensors"]
    for t in tensors:
        limit = plan["arena_bytes"] if t["storage"] == ARENA else plan["weights_bytes"]
        assert t["offset"] % 64 == 0 and t["offset"] + t["nbytes"] <= limit
        assert t["dtype"][2] == 1 and t["nbytes"] == int(np.prod(t["shape"], dtype=np.int64)) * t["dtype"][1] // 8
    assert len(tensors) >= manifest["plan"]["tensors"]
    assert [n for n, _ in plan["inputs"]] == [s["name"] for s in manifest["inputs"]]
    assert [n for n, _ in plan["outputs"]] == [s["name"] for s in manifest["outputs"]]
    for _, tid in plan["inputs"] + plan["outputs"]:
        assert tensors[tid]["storage"] == ARENA

    # Images: cubins first (one per arch), then the PTX; the files exist.
    archs = [int(a[3:]) for a in cuda["archs"]]
    assert plan["images"] == [(f"cuda/sm_{a}.cubin", IMAGE_CUBIN, a) for a in archs] + \
        [("cuda/kernels.ptx", IMAGE_PTX, int(cuda["ptx_arch"][3:]))]
    ptx = (folder / "cuda" / "kernels.ptx").read_text()
    assert re.search(rf"^\.target sm_{archs[0]}\b", ptx, re.M)
    entries = ptx_entries(ptx)
    cubins = [(folder / f).read_bytes() for f, kind, _ in plan["images"] if kind == IMAGE_CUBIN]

    # Launches: every kernel exists in the PTX and the cubins and takes what the plan passes.
    tasks = {s["id"] for s in manifest["subgraphs"]}
    assert plan["launches"]
    first_kernel: dict[str, str] = {}
    calls = 0
    for launch in plan["launches"]:
        assert launch["task"] in tasks
        calls += first_kernel.setdefault(launch["task"], launch["kernel"]) == launch["kernel"]
        assert launch["kernel"] in entries, launch["kernel"]
        assert all(launch["kernel"].encode() in c for c in cubins)
        assert min(launch["grid"]) >= 1 and min(launch["block"]) >= 1
        assert launch["block"][0] * launch["block"][1] * launch["block"][2] <= 1024
        assert launch["smem"] <= 227 * 1024
        params = entries[launch["kernel"]]
        assert len(params) == len(launch["args"])
        for ptype, (kind, tensor, _value) in zip(params, launch["args"], strict=True):
            if kind == ARG_TENSOR:
                assert 0 <= tensor < len(tensors) and ptype == ".u64"
            else:
                assert kind in (ARG_INT32, ARG_INT64)
                assert ptype in ((".u32", ".s32") if kind == ARG_INT32 else (".u64", ".s64"))
    assert calls == manifest["plan"]["kernel_calls"]

    # Every model output is passed to some launch.
    written = {tensors[tid]["offset"] for _, tid in plan["outputs"]}
    touched = {tensors[t]["offset"] for launch in plan["launches"] for k, t, _ in launch["args"] if k == ARG_TENSOR
               and tensors[t]["storage"] == ARENA}
    assert written <= touched


@needs_nvcc
def test_x86_target_beside_cuda_matches_onnxruntime(cuda_artifact):
    import tlmpack.runtime as rt
    from tlmpack import zoo

    onnx_path, tar, _ = cuda_artifact("bert-tiny")
    model = rt.load(tar, device="cpu")
    feed = zoo.random_inputs("bert-tiny", 21)
    refs = onnxruntime_outputs(onnx_path, feed)
    for spec, out, ref in zip(model.outputs, model.run(None, feed), refs, strict=True):
        check_live(spec.name, ref)
        assert rel_err(out, ref) < 1e-4, spec.name


@needs_nvcc
def test_cuda_builds_are_byte_identical(cuda_artifact, tmp_path):
    from tlmpack.build import BuildOptions, build

    onnx_path, first, _ = cuda_artifact("mlp")
    second = tmp_path / "again.tar"
    build(str(onnx_path), second, BuildOptions(targets=("cuda", "x86"), cuda_archs=("sm_90", "sm_80"),
                                               scheduler=SCHEDULER["mlp"]))
    assert first.read_bytes() == second.read_bytes()


@needs_nvcc
def test_cli_cuda_arch_is_validated(tmp_path):
    from tlmpack.errors import LoweringError
    from tlmpack.lower.cuda import cuda_target

    with pytest.raises(LoweringError, match="sm_XX"):
        cuda_target(["ampere"])
    with pytest.raises(LoweringError, match="cannot build"):
        cuda_target(["sm_10"])
    assert cuda_target(["sm_90", "sm_80", "sm_90"]).archs == ("sm_80", "sm_90")
    result = subprocess.run([sys.executable, "-m", "tlmpack.cli", "build", "nowhere.onnx", "-t", "x86",
                             "--cuda-arch", "sm_90", "-o", str(tmp_path / "x.tar")], capture_output=True, text=True)
    assert result.returncode == 2 and "-t cuda" in result.stderr


# --- launches of a multi-kernel task (TVM only; no nvcc needed) ---------------------------------------


def _two_kernel_task():
    """column sums C (a global intermediate), then D = A @ exp(C): dlight's Fallback makes two kernels."""
    from tvm import te

    a = te.placeholder((64, 128), name="A")
    k = te.reduce_axis((0, 64), name="k")
    c = te.compute((128,), lambda j: te.sum(a[k, j], axis=k), name="C")
    e = te.compute((128,), lambda j: te.exp(c[j]), name="E")
    k2 = te.reduce_axis((0, 128), name="k2")
    d = te.compute((64,), lambda i: te.sum(a[i, k2] * e[k2], axis=k2), name="D")
    return te.create_prim_func([a, d])


def _fake_graph(func):
    from tlmpack.graph import Graph, KernelCall, Task, Tensor

    tensors = [Tensor(0, "A", "float32", (64, 128), "arena", 0, 0), Tensor(1, "D", "float32", (64,), "arena", 1, 32768)]
    return Graph(tensors, [KernelCall("t0", (0, 1), 1)], [Task("t0", "two_kernels", "0", 1)], [0], [1], b"",
                 32768 + 256, {"t0": func})


def test_multi_kernel_task_launches_and_workspace(tmp_path):
    from tlmpack.build import link_cuda_plan as _link_cuda_plan
    from tlmpack.emit.cuda_plan import render_cuda_plan
    from tlmpack.lower.cuda import CudaKernels, CudaTarget, generate
    from tlmpack.schedule.select import schedule_cuda_tasks
    from tlmpack.specs import TensorSpec

    graph = _fake_graph(_two_kernel_task())
    target = CudaTarget(("sm_90",), "nvcc", "13.0.88")
    funcs, records, _ = schedule_cuda_tasks(graph, target)
    assert records[0].note == "Fallback"
    source, launches = generate(funcs, target)
    task = launches["t0"]
    assert [w.to_json() for w in task.workspaces] == [{"name": "C", "dtype": "float32", "shape": [128]}]
    assert [x.kernel for x in task.launches] == ["t0_kernel", "t0_kernel_1"]
    first, second = task.launches
    assert [(a.kind, a.index) for a in first.args] == [("param", 0), ("workspace", 0)]
    assert [(a.kind, a.index) for a in second.args] == [("param", 0), ("workspace", 0), ("param", 1)]
    for launch in task.launches:
        assert min(launch.grid) >= 1 and 1 <= launch.block[0] <= 1024 and launch.dynamic_smem_bytes == 0
        signature = re.search(rf'__global__ void __launch_bounds__\((\d+)\) {launch.kernel}\(([^)]*)\)', source)
        assert signature and int(signature.group(1)) == launch.block[0] * launch.block[1] * launch.block[2]
        assert len(signature.group(2).split(",")) == len(launch.args)

    # The plan places the workspace after the Graph's arena and passes it to both kernels.
    kernels = CudaKernels(source, launches, [("sm_90.cubin", "cubin", 90), ("kernels.ptx", "ptx", 90)])
    specs = [TensorSpec("A", "float32", (64, 128)), TensorSpec("D", "float32", (64,))]
    plan = render_cuda_plan(graph, kernels, target, specs[:1], specs[1:], "two-kernels", "test")
    stage = tmp_path / "artifact"
    (stage / "cuda").mkdir(parents=True)
    _link_cuda_plan(stage, plan.c_source)
    table = read_cuda_plan(stage / "cuda" / "plan.so")
    workspace = table["tensors"][2]
    assert workspace["offset"] == 33024 and workspace["nbytes"] == 512 and workspace["shape"] == (128,)
    assert table["arena_bytes"] == plan.arena_bytes == 33024 + 512
    assert [launch["args"] for launch in table["launches"]] == [[(0, 0, 0), (0, 2, 0)], [(0, 0, 0), (0, 2, 0), (0, 1, 0)]]
    assert table["images"] == [("cuda/sm_90.cubin", 0, 90), ("cuda/kernels.ptx", 1, 90)]
    assert table["inputs"] == [("A", 0)] and table["outputs"] == [("D", 1)]


def test_dynamic_shared_memory_is_read_from_launch_params():
    """A kernel staging its input in `shared.dyn` memory gets dynamic_smem_bytes from the launch params."""
    from tvm import s_tir, te

    from tlmpack.lower.cuda import CudaTarget, generate

    a = te.placeholder((1024,), name="A")
    b = te.compute((1024,), lambda i: a[i] * 2.0, name="B")
    sch = s_tir.Schedule(te.create_prim_func([a, b]))
    block = sch.get_sblock("B")
    (i,) = sch.get_loops(block)
    bx, tx = sch.split(i, [None, 128])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    staged = sch.cache_read(block, 0, "shared.dyn")
    sch.compute_at(staged, bx)
    sch.bind(sch.get_loops(staged)[-1], "threadIdx.x")
    _, launches = generate({"t0": sch.mod["main"]}, CudaTarget(("sm_90",), "nvcc", "13.0.88"))
    (launch,) = launches["t0"].launches
    assert (launch.grid, launch.block, launch.dynamic_smem_bytes) == ((8, 1, 1), (128, 1, 1), 128 * 4)
    assert [(x.kind, x.index) for x in launch.args] == [("param", 0), ("param", 1)]
