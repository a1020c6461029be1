"""The CUDA backend of the C runtime, and CUDA in tlmpack.runtime, on machines without a GPU.

The fake CUDA artifact is tests/fixtures_runtime/fabricate_cuda.py: the fake add/scale model with a
cuda target (a hand-written cuda/plan.so over a committed sm_90 cubin and PTX) before its x86 one.
Without a driver, opening it for CUDA must fail with a sentence and CPU fallback must work. With the
simulated driver (tests/cuda/fake_libcuda.c as libcuda.so.1 on LD_LIBRARY_PATH of a subprocess, since
a process loads its driver once), the whole CUDA path runs: open, copies, launches, CUDA graph,
device buffers through DLPack, and every refusal. Tests marked `cuda` need a real GPU.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures_runtime"))
import fabricate  # noqa: E402
import fabricate_cuda  # noqa: E402

import tlmpack.runtime as rt  # noqa: E402
from tlmpack.runtime import _capi, _cuda, preflight  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build the fake plans and driver")

X = np.arange(6, dtype=np.float32).reshape(2, 3)
K = np.array([3], dtype=np.int32)
Y = X + fabricate.WEIGHTS
Z = Y * 3


def _has_real_libcuda() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


no_libcuda = pytest.mark.skipif(_has_real_libcuda(), reason="this machine has libcuda.so.1")


# ---- fixtures ----------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def lib_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fabricate.build_runtime(tmp_path_factory.mktemp("libtlmrt")).parent


@pytest.fixture(scope="session")
def fake_driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fabricate_cuda.build_fake_libcuda(tmp_path_factory.mktemp("fake_driver"))


@pytest.fixture(scope="session")
def test_bin(lib_dir: Path) -> Path:
    exe = lib_dir / "test_cuda"
    subprocess.run(["gcc", "-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", f"-I{fabricate.RUNTIME_C}",
                    str(fabricate.REPO / "tests" / "c" / "test_cuda.c"), "-o", str(exe), f"-L{lib_dir}", "-ltlmrt",
                    f"-Wl,-rpath,{lib_dir}", "-ldl"], check=True, capture_output=True, text=True)
    return exe


@pytest.fixture(scope="session")
def template(tmp_path_factory: pytest.TempPathFactory, lib_dir: Path) -> Path:
    return fabricate_cuda.make_artifact(tmp_path_factory.mktemp("cuda_template") / "model",
                                        runtime_lib=lib_dir / "libtlmrt.so")


@pytest.fixture
def artifact(tmp_path: Path, template: Path) -> Path:
    return Path(shutil.copytree(template, tmp_path / "model"))


@pytest.fixture
def variant(tmp_path: Path, lib_dir: Path):
    """A cuda+x86 artifact whose cuda plan is built with extra -D flags."""
    def make(*defines: str, **kwargs: object) -> Path:
        return fabricate_cuda.make_artifact(tmp_path / "variant", *defines, runtime_lib=lib_dir / "libtlmrt.so",
                                            **kwargs)
    return make


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lib_dir: Path) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("TLMPACK_CACHE", str(d))
    monkeypatch.setenv("TLMPACK_RUNTIME_LIB", str(lib_dir / "libtlmrt.so"))  # the one built with the fakes
    return d


def fake_env(driver_dir: Path | None, **fake: object) -> dict[str, str]:
    """The environment of a subprocess on the simulated driver (or on none at all, driver_dir=None).

    fake: FAKE_CUDA_* settings of tests/cuda/fake_libcuda.c, lowercase without the prefix (cc=80)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_CUDA_")}
    env["LD_LIBRARY_PATH"] = str(driver_dir) if driver_dir is not None else ""
    env.update({f"FAKE_CUDA_{k.upper()}": str(v) for k, v in fake.items()})
    return env


def run_c(test_bin: Path, art: Path, driver_dir: Path | None, *args: str, **fake: object) -> subprocess.CompletedProcess:
    return subprocess.run([str(test_bin), str(art), *args], capture_output=True, text=True, timeout=120,
                          env=fake_env(driver_dir, **fake))


def line(out: str, prefix: str) -> str:
    found = [x for x in out.splitlines() if x.startswith(prefix)]
    assert found, out
    return found[0]


def open_failure(proc: subprocess.CompletedProcess) -> tuple[int, str]:
    assert proc.returncode == 3, proc.stdout + proc.stderr
    msg = line(proc.stdout, "OPEN_FAILED")
    status, _, text = msg.partition(": ")
    return int(status.split("=")[1]), text


def run_py(code: str, art: Path, driver_dir: Path | None, **fake: object) -> dict:
    """Runs `code` in a fresh interpreter (rt, np, ART defined) on the simulated driver; returns its OUT dict."""
    prelude = ("import json, sys, numpy as np\nimport tlmpack.runtime as rt\n"
               f"ART = {str(art)!r}\nOUT = {{}}\n")
    script = prelude + textwrap.dedent(code) + "\nprint('RESULT ' + json.dumps(OUT))\n"
    env = fake_env(driver_dir, **fake)
    env["PYTHONPATH"] = str(fabricate.REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env,
                          cwd=fabricate.REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(line(proc.stdout, "RESULT ")[len("RESULT "):])


# ---- the C runtime on the simulated driver -------------------------------------------------------------

def test_cuda_model_runs_and_replays_a_graph_from_the_second_run(test_bin, artifact, fake_driver):
    proc = run_c(test_bin, artifact, fake_driver)
    assert proc.returncode == 0 and "ALL_OK" in proc.stdout, proc.stdout + proc.stderr
    assert line(proc.stdout, "DEVICE:") == ("DEVICE: cuda:0 Fake GPU sm_90 (cubin cuda/sm_90.cubin, driver 13.0, "
                                            "CUDA graph from the second run)")
    assert line(proc.stdout, "DEVICE_AFTER:").endswith("driver 13.0, CUDA graph)")


def test_cuda_graph_can_be_switched_off(test_bin, artifact, fake_driver):
    proc = run_c(test_bin, artifact, fake_driver, "--no-graph", "--no-verify")
    assert "ALL_OK" in proc.stdout, proc.stdout
    assert line(proc.stdout, "DEVICE_AFTER:").endswith("no CUDA graph)")


def test_failed_graph_capture_falls_back_to_direct_launches_and_says_why(test_bin, artifact, fake_driver):
    proc = run_c(test_bin, artifact, fake_driver, fail="cuStreamBeginCapture_v2")
    assert "ALL_OK" in proc.stdout, proc.stdout
    assert line(proc.stdout, "DEVICE_AFTER:").endswith(
        "no CUDA graph: cuStreamBeginCapture failed with CUDA_ERROR_NOT_SUPPORTED)")


def test_device_buffer_on_another_gpu_is_refused_with_both_devices(test_bin, artifact, fake_driver):
    proc = run_c(test_bin, artifact, fake_driver)
    assert line(proc.stdout, "WRONG_DEVICE:") == (
        "WRONG_DEVICE: input 0 (x): a buffer on cuda:1, but this model runs on cuda:0; expected host memory or "
        "memory on the model's device")


def test_ptx_is_used_for_a_newer_gpu_and_a_same_major_cubin_for_a_minor_one(test_bin, artifact, fake_driver):
    proc = run_c(test_bin, artifact, fake_driver, cc=100)
    assert "ALL_OK" in proc.stdout, proc.stdout
    assert "cuda:0 Fake GPU sm_100 (PTX cuda/kernels.ptx," in line(proc.stdout, "DEVICE:")
    proc = run_c(test_bin, artifact, fake_driver, cc=91)
    assert "sm_91 (cubin cuda/sm_90.cubin," in line(proc.stdout, "DEVICE:")


def test_ptx_only_artifact_is_jitted_by_the_driver(test_bin, variant, fake_driver):
    proc = run_c(test_bin, variant("-DFAKE_PTX_ONLY"), fake_driver)
    assert "ALL_OK" in proc.stdout, proc.stdout
    assert "sm_90 (PTX cuda/kernels.ptx," in line(proc.stdout, "DEVICE:")


def test_kernel_fault_is_reported_and_the_model_refuses_to_run_again(test_bin, artifact, fake_driver):
    proc = run_c(test_bin, artifact, fake_driver, "--fault")
    assert "ALL_OK" in proc.stdout, proc.stdout
    fault = line(proc.stdout, "FAULT:")
    assert "CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was encountered)" in fault
    assert "CUDA_LAUNCH_BLOCKING=1" in fault and "The CUDA context is unusable now" in fault
    assert "cannot run since an earlier failure" in line(proc.stdout, "AFTER_FAULT:")


@pytest.mark.parametrize("args", [(), ("--no-graph", "--fault")])
def test_no_memory_errors_under_valgrind_on_the_cuda_path(test_bin, artifact, fake_driver, args):
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        pytest.skip("needs valgrind")
    proc = subprocess.run([valgrind, "-q", "--error-exitcode=99", "--leak-check=full", "--errors-for-leak-kinds=definite",
                           str(test_bin), str(artifact), *args], capture_output=True, text=True, timeout=300,
                          env=fake_env(fake_driver))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(("fake", "words"), [
    ({"init_result": 100}, "cuInit failed: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected); no usable "
                           "NVIDIA GPU here"),
    ({"count": 0}, "no CUDA GPU found (cuDeviceGetCount returned 0); use device=cpu"),
    ({"cc": 80}, "GPU 0 (Fake GPU) is sm_80; the artifact has cubins for sm_90 and PTX for sm_90+; rebuild it for "
                 "sm_80 or use device=cpu"),
    ({"driver": 12080}, "the NVIDIA driver here supports CUDA 12.8 (cuDriverGetVersion 12080), but the artifact's "
                        "CUDA code needs CUDA 13.0 (13000) or newer; update the driver or use device=cpu"),
    ({"fail": "cuDevicePrimaryCtxRetain"}, "cuDevicePrimaryCtxRetain failed: CUDA_ERROR_NOT_SUPPORTED (operation not "
                                           "supported)"),
    ({"fail": "cuModuleLoadData"}, "cuda/sm_90.cubin: cuModuleLoadData failed: CUDA_ERROR_NOT_SUPPORTED"),
    ({"fail": "cuMemAlloc_v2"}, "allocating 320 bytes on cuda:0 (arena 256 + weights 64) failed: "
                                "CUDA_ERROR_NOT_SUPPORTED"),
])
def test_machine_that_cannot_run_the_cuda_target_is_incompatible_with_a_sentence(test_bin, artifact, fake_driver,
                                                                                  fake, words):
    status, msg = open_failure(run_c(test_bin, artifact, fake_driver, **fake))
    assert status == 4, msg
    assert words in msg, msg


def test_device_index_out_of_range_names_the_gpus_there_are(test_bin, artifact, fake_driver):
    status, msg = open_failure(run_c(test_bin, artifact, fake_driver, "--device", "2"))
    assert (status, msg) == (4, "device cuda:2 requested, but this machine has 1 CUDA GPU (cuda:0..cuda:0)")


@no_libcuda
def test_missing_libcuda_is_incompatible_and_names_the_library(test_bin, artifact):
    status, msg = open_failure(run_c(test_bin, artifact, None))
    assert status == 4
    assert msg.startswith("CUDA driver library libcuda.so.1 not found (dlopen: libcuda.so.1: cannot open shared "
                          "object file")
    assert msg.endswith("; install the NVIDIA driver or use device=cpu")


def test_gpu_without_cubin_or_ptx_for_it_says_there_is_no_ptx(test_bin, variant, fake_driver):
    status, msg = open_failure(run_c(test_bin, variant("-DFAKE_NO_PTX", ptx=False), fake_driver, cc=100))
    assert (status, msg) == (4, "GPU 0 (Fake GPU) is sm_100; the artifact has cubins for sm_90 and no PTX; rebuild it "
                                "for sm_100 or use device=cpu")


@pytest.mark.parametrize(("define", "status", "words"), [
    ("-DFAKE_ABI_VERSION=2", 4, "cuda/plan.so: plan ABI version 2, but this runtime (tlmrt 0.2.0) reads version 1"),
    ("-DFAKE_BAD_ARG", 3, "cuda plan launch 1 (scale_k) argument 1: tensor index expected 0..4, found 99"),
    ("-DFAKE_BAD_IMAGE_PATH", 3, "cuda plan image 1: refusing the file name \"../kernels.ptx\": the path has a '..' "
                                 "component"),
    ("-DFAKE_BAD_OFFSET", 3, "cuda plan tensor 3: bytes [256, 256 + 24) expected within the arena (256 bytes)"),
    ("-DFAKE_BIG_BLOCK", 4, "cuda plan launch 0 (add_w, task fused_add): grid (1, 1, 1) block (2048, 1, 1) exceeds "
                            "what Fake GPU allows (1024 threads per block"),
    ("-DFAKE_MISSING_KERNEL", 3, "cuda plan launch 1: looking up kernel scale_k_missing in cuda/sm_90.cubin failed: "
                                 "CUDA_ERROR_NOT_FOUND"),
    ("-DFAKE_MIN_DRIVER=-5", 3, "cuda plan: min_driver_version expected >= 0, found -5"),
])
def test_inconsistent_cuda_plan_is_refused_with_a_sentence(test_bin, variant, fake_driver, define, status, words):
    got_status, msg = open_failure(run_c(test_bin, variant(define), fake_driver))
    assert got_status == status, msg
    assert words in msg, msg


def test_flipped_cubin_byte_is_a_sha256_mismatch(test_bin, artifact, fake_driver):
    fabricate_flip(artifact / "cuda" / "sm_90.cubin", 100)
    status, msg = open_failure(run_c(test_bin, artifact, fake_driver))
    assert status == 3 and msg.startswith("cuda/sm_90.cubin: sha256 mismatch (expected "), msg


def test_cubin_missing_from_sha256sums_is_refused(test_bin, artifact, fake_driver):
    sums = artifact / "SHA256SUMS"
    sums.write_text("".join(x for x in sums.read_text().splitlines(True) if "sm_90.cubin" not in x))
    status, msg = open_failure(run_c(test_bin, artifact, fake_driver))
    assert status == 3 and "SHA256SUMS lists" in msg and "but not cuda/sm_90.cubin" in msg, msg


def test_flipped_plan_library_byte_is_refused_before_it_is_loaded(test_bin, artifact, fake_driver):
    fabricate_flip(artifact / "cuda" / "plan.so", 300)
    status, msg = open_failure(run_c(test_bin, artifact, fake_driver))
    assert status == 3 and msg.startswith("cuda/plan.so: sha256 mismatch"), msg


def test_ptx_file_that_is_not_text_is_refused(test_bin, artifact, fake_driver):
    (artifact / "cuda" / "kernels.ptx").write_bytes(b"\0binary")
    fabricate.rehash(artifact, fabricate.read_manifest(artifact))
    status, msg = open_failure(run_c(test_bin, artifact, fake_driver, cc=100))
    assert (status, msg) == (3, "cuda/kernels.ptx: expected PTX text, found a NUL byte")


def fabricate_flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


# ---- API version 2 on the CPU backend, through ctypes ----------------------------------------------------

@pytest.fixture
def capi(lib_dir: Path) -> _capi.Library:
    return _capi.Library(lib_dir / "libtlmrt.so")


def test_api_v1_callers_options_are_filled_without_overrun_and_open_on_the_cpu(capi, artifact):
    buf = (ctypes.c_uint8 * 32)(*([0xEE] * 32))
    opts = ctypes.cast(buf, ctypes.POINTER(_capi.Options))
    capi.lib.tlmrt_options_init(opts)
    assert bytes(buf[12:]) == b"\xee" * 20, "the v1 entry point wrote past 12 bytes"
    assert int.from_bytes(bytes(buf[:4]), "little") == 12
    handle = ctypes.c_void_p()
    status = capi.lib.tlmrt_model_open(str(artifact).encode(), opts, ctypes.byref(handle))
    assert status == 0, capi.lib.tlmrt_open_error()
    assert capi.device_name(handle.value).startswith("cpu (")
    capi.lib.tlmrt_model_close(handle)


def test_cpu_run_io_leaves_an_output_in_the_arena_and_refuses_device_buffers(capi, artifact):
    h = capi.open_model(artifact, 1, verify_files=True)
    try:
        x, k, z = X.copy(), K.copy(), np.empty((2, 3), np.float32)
        ins = (_capi.IO * 2)(_capi.IO(x.ctypes.data, 24, 1, 0), _capi.IO(k.ctypes.data, 4, 1, 0))
        outs = (_capi.IO * 2)(_capi.IO(None, 0, 1, 0), _capi.IO(z.ctypes.data, 24, 1, 0))
        assert capi.lib.tlmrt_model_run_io(h, ins, outs) == 0, capi.last_error(h)
        np.testing.assert_allclose(z, Z, rtol=1e-6)
        buf = _capi.IO()
        assert capi.lib.tlmrt_model_output_buffer(h, 0, ctypes.byref(buf)) == 0
        assert (buf.nbytes, buf.device_type) == (24, 1)
        y = np.ctypeslib.as_array(ctypes.cast(buf.data, ctypes.POINTER(ctypes.c_float)), shape=(2, 3)).copy()
        np.testing.assert_allclose(y, Y, rtol=1e-6)
        assert capi.lib.tlmrt_model_stream(h) is None
        ins[0] = _capi.IO(x.ctypes.data, 24, 2, 0)
        assert capi.lib.tlmrt_model_run_io(h, ins, outs) == 1
        assert capi.last_error(h) == ("input 0 (x): a buffer on cuda:0, but this model runs on cpu:0; expected host "
                                      "memory or memory on the model's device")
    finally:
        capi.lib.tlmrt_model_close(h)


def test_unknown_device_type_in_the_options_is_a_caller_mistake(capi, artifact):
    with pytest.raises(rt.InputError, match=r"opts->device_type: expected 1 \(TLMRT_DEVICE_CPU\) or 2 "
                                             r"\(TLMRT_DEVICE_CUDA\), found 7"):
        capi.open_model(artifact, 1, verify_files=True, device_type=7)


# ---- Python: preflight against a described machine (no driver needed) ----------------------------------

def host(**cuda: object) -> preflight.Host:
    info = _cuda.CudaHost(**cuda) if cuda else _cuda.CudaHost(13000, (_cuda.Gpu(0, "NVIDIA H200", 90),))
    return preflight.Host("x86_64", "linux", frozenset({"sse2"}), info)


def test_preflight_picks_the_cuda_target_first_when_the_gpu_can_run_it(template):
    report = rt.check(template, "auto", host=host())
    assert report.ok and report.target["kind"] == "cuda"
    assert "cuda: driver 13.0 (13000); GPUs: cuda:0 NVIDIA H200 (sm_90)" in report.lines()


@pytest.mark.parametrize(("cuda", "words"), [
    ({"error": "CUDA driver library libcuda.so.1 not found (dlopen: x); install the NVIDIA driver or use device=cpu"},
     "target cuda: CUDA driver library libcuda.so.1 not found"),
    ({"driver_version": 13000, "gpus": ()}, "target cuda: no CUDA GPU found (cuDeviceGetCount returned 0); use device=cpu"),
    ({"driver_version": 13000, "gpus": (_cuda.Gpu(0, "NVIDIA A100", 80),)},
     "target cuda: GPU 0 (NVIDIA A100) is sm_80; the artifact has cubins for sm_90 and PTX for sm_90+; rebuild it "
     "for sm_80 or use device=cpu"),
    ({"driver_version": 12080, "gpus": (_cuda.Gpu(0, "NVIDIA H200", 90),)},
     "target cuda: the NVIDIA driver here supports CUDA 12.8 (cuDriverGetVersion 12080), but the artifact's CUDA code "
     "needs CUDA 13.0 (13000) or newer; update the driver or use device=cpu"),
])
def test_preflight_says_why_the_gpu_cannot_run_it_and_auto_falls_back_to_x86(template, cuda, words):
    report = rt.check(template, "cuda", host=host(**cuda))
    assert not report.ok
    assert isinstance(report.problems[0], rt.IncompatibleTargetError)
    assert words in str(report.problems[0])
    auto = rt.check(template, "auto", host=host(**cuda))
    assert auto.ok and auto.target["kind"] == "x86"
    assert any(n.startswith("not using target cuda: ") for n in auto.notes), auto.notes


def test_preflight_refuses_a_device_index_beyond_the_gpus(template):
    report = rt.check(template, "cuda:1", host=host())
    assert str(report.problems[0]) == ("target cuda: device cuda:1 requested, but this machine has 1 CUDA GPU "
                                       "(cuda:0..cuda:0)")


def test_ptx_serves_a_newer_gpu_and_nothing_serves_an_older_one(template):
    m = fabricate.read_manifest(template)
    cuda = m["targets"][0]
    for arch, ok in ((100, True), (91, True), (89, False)):
        info = _cuda.CudaHost(13000, (_cuda.Gpu(0, "GPU", arch),))
        assert (preflight.cuda_target_problems(cuda, info) == []) == ok, arch
    no_ptx = {**cuda, "ptx": False}
    assert preflight.cuda_target_problems(no_ptx, _cuda.CudaHost(13000, (_cuda.Gpu(0, "GPU", 100),))) == [
        "target cuda: GPU 0 (GPU) is sm_100; the artifact has cubins for sm_90 and no PTX; rebuild it for sm_100 or "
        "use device=cpu"]


@pytest.mark.parametrize(("field", "value", "words"), [
    ("archs", ["90"], "'archs' must be a list of SM names like 'sm_90'"),
    ("ptx_arch", None, "'ptx_arch' must name the lowest SM the PTX runs on"),
    ("min_driver_version", "13.0", "'min_driver_version' must be a non-negative integer"),
])
def test_malformed_cuda_target_in_the_manifest_is_an_artifact_error(artifact, field, value, words):
    m = fabricate.read_manifest(artifact)
    m["targets"][0][field] = value
    fabricate.write_manifest(artifact, m)
    with pytest.raises(rt.ArtifactError, match=words):
        rt.load(artifact, device="cpu")


# ---- Python without a driver (this process) -------------------------------------------------------------

@no_libcuda
def test_auto_runs_on_x86_when_libcuda_is_missing(artifact):
    with rt.load(artifact, device="auto") as m:
        assert m.device == "cpu" and m.target["kind"] == "x86"
        assert m.device_name.startswith("cpu (")
        y, z = m(x=X, k=K)
    np.testing.assert_allclose(z, Z, rtol=1e-6)
    report = rt.check(artifact, "auto")
    assert any("libcuda.so.1 not found" in n for n in report.notes), report.notes


@no_libcuda
def test_cuda_device_without_libcuda_raises_incompatible_naming_libcuda(artifact):
    with pytest.raises(rt.IncompatibleTargetError, match=r"^target cuda: CUDA driver library libcuda.so.1 not found "
                                                         r"\(dlopen: .*\); install the NVIDIA driver or use device=cpu"):
        rt.load(artifact, device="cuda")


def test_tlmpack_check_command_prints_the_report_and_exits_2_on_problems(template):
    from click.testing import CliRunner

    from tlmpack.cli import main

    runner = CliRunner()
    ok = runner.invoke(main, ["check", str(template), "--device", "cpu"])
    assert ok.exit_code == 0, ok.output
    assert "target for device cpu: x86 (x86)" in ok.output and ok.output.rstrip().endswith("ok")
    bad = runner.invoke(main, ["check", str(template), "--device", "cuda:7"])
    assert bad.exit_code == 2, bad.output
    assert "problem: target cuda" in bad.output


# ---- Python on the simulated driver (subprocesses) ------------------------------------------------------

def test_python_load_runs_the_cuda_target_with_numpy_io(artifact, fake_driver):
    out = run_py("""
        with rt.load(ART) as m:
            OUT["device"], OUT["name"] = m.device, m.device_name
            x = np.arange(6, dtype=np.float32).reshape(2, 3)
            for _ in range(3):
                y, z = m(x=x, k=np.array([3], np.int32))
            OUT["z"] = z.tolist()
            OUT["after"] = m.device_name
        with rt.load(ART, device="cuda:0", use_cuda_graph=False) as m:
            OUT["nograph"] = m(x=x, k=[3])[1].tolist()
            OUT["nograph_name"] = m.device_name
    """, artifact, fake_driver)
    assert out["device"] == "cuda:0"
    assert out["name"].startswith("cuda:0 Fake GPU sm_90 (cubin cuda/sm_90.cubin")
    assert out["after"].endswith("CUDA graph)")
    assert out["nograph_name"].endswith("no CUDA graph)")
    np.testing.assert_allclose(out["z"], Z, rtol=1e-6)
    np.testing.assert_allclose(out["nograph"], Z, rtol=1e-6)


def test_cuda_profile_times_every_launch_with_events_and_bench_reports_it(artifact, fake_driver):
    out = run_py("""
        from tlmpack.runtime import bench
        r = bench.bench(ART, device="cuda", runs=3, warmup=2, profile=True)
        OUT["kernels"] = [[k.task, k.calls_per_run, k.mean_us] for k in r.profile.kernels]
        OUT["runs"], OUT["kernel_us"] = r.profile.runs, r.profile.kernel_us
        OUT["timeline"] = [list(t) for t in r.profile.timeline]
        with rt.load(ART, device="cuda") as m:
            lib, h = m._lib, m._handle
            x = np.arange(6, dtype=np.float32).reshape(2, 3)
            lib.set_profiling(h, True)
            m(x=x, k=[3])
            lib.set_profiling(h, False)
            for _ in range(3):
                m(x=x, k=[3])
            OUT["z"] = m(x=x, k=[3])[1].tolist()
            OUT["name"] = m.device_name
    """, artifact, fake_driver)
    # the fake driver's clock advances exactly 1000 ns a launch: one launch a kernel, 1 us each
    assert out["runs"] == 3 and out["kernels"] and all(k[1] == 1 and k[2] == 1.0 for k in out["kernels"])
    assert out["kernel_us"] == len(out["kernels"])
    assert [t[1] for t in out["timeline"]] == [float(i) for i in range(len(out["timeline"]))]
    np.testing.assert_allclose(out["z"], Z, rtol=1e-6)
    assert out["name"].endswith("CUDA graph)")  # profiling launches one by one; the graph comes back after


def test_models_of_one_artifact_share_one_device_copy_of_the_weights(artifact, fake_driver):
    """Two opens of one artifact (as the batch plans of a dynamic-batch artifact are): the second
    allocates its arena only; the block with the copy outlives the model that made it, until the last
    one closes."""
    out = run_py("""
        import ctypes
        live = ctypes.CDLL("libcuda.so.1").fake_cuda_live_bytes
        live.restype = ctypes.c_uint64
        base = live()
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        a = rt.load(ART, device="cuda")
        one = live() - base
        b = rt.load(ART, device="cuda")
        two = live() - base
        a.close()
        OUT["z"] = b(x=x, k=[3])[1].tolist()
        after_a = live() - base
        b.close()
        OUT["bytes"] = [one, two, after_a, live() - base]
    """, artifact, fake_driver)
    np.testing.assert_allclose(out["z"], Z, rtol=1e-6)
    one, two, after_a, at_end = out["bytes"]
    assert one >= 320 and two - one == 256  # arena 256 (+ weights 64 the first time)
    assert after_a == two and at_end == 0  # a's block holds the copy: it stays for b, and goes with b


def test_outputs_as_cuda_arrays_and_cuda_inputs_through_dlpack(artifact, fake_driver):
    out = run_py("""
        import ctypes
        stats = ctypes.CDLL("libcuda.so.1").fake_cuda_stats
        def live():
            s = (ctypes.c_int * 6)(); stats(s); return s[2]
        with rt.load(ART, device="cuda") as m:
            base = live()
            x = np.arange(6, dtype=np.float32).reshape(2, 3)
            y, z = m.run(None, {"x": x, "k": np.array([3], np.int32)}, output_device="cuda")
            OUT["types"] = [type(y).__name__, repr(z)]
            OUT["dlpack_device"] = list(z.__dlpack_device__())
            OUT["z"] = z.numpy().tolist()
            OUT["live_with_two"] = live() - base
            # a CudaArray is a CUDA tensor like any other: fed back without a host copy
            (y2,) = m.run_dlpack(["y"], {"x": y, "k": [3]})
            (y2,) = m.run_dlpack(["y"], {"x": y, "k": [3]})  # feeding it does not use it up
            OUT["y2"] = y2.numpy().tolist()
            # to_device, and mixed host/device inputs with numpy outputs
            xd = m.to_device(x)
            OUT["mixed"] = m(x=xd, k=np.array([2], np.int32))[1].tolist()
            # exporting hands the buffer over once; an unconsumed capsule frees it when collected
            cap = z.__dlpack__(stream=None)
            try:
                z.numpy()
            except BufferError as e:
                OUT["after_export"] = str(e)
            del cap, y, z, y2, xd
            import gc; gc.collect()
            OUT["live_at_end"] = live() - base
            OUT["kept"] = len(m._pool)
            # refusals
            for feed in ({"x": m.to_device(x.astype(np.float64)), "k": [3]},
                         {"x": m.to_device(np.zeros((3, 2), np.float32)), "k": [3]}):
                try:
                    m(feed)
                except rt.InputError as e:
                    OUT.setdefault("refused", []).append(str(e))
        gc.collect()
        OUT["live_after_close"] = live() - base
    """, artifact, fake_driver)
    assert out["types"][0] == "CudaArray" and out["types"][1] == "<CudaArray float32 (2, 3) on cuda:0>"
    assert out["dlpack_device"] == [2, 0]
    np.testing.assert_allclose(out["z"], Z, rtol=1e-6)
    assert out["live_with_two"] == 2
    np.testing.assert_allclose(out["y2"], Y + fabricate.WEIGHTS, rtol=1e-6)
    np.testing.assert_allclose(out["mixed"], Y * 2, rtol=1e-6)
    assert "handed to a DLPack consumer" in out["after_export"]
    # the collected, never exported buffers wait in the model's pool for the next outputs; close frees them
    assert out["live_at_end"] == out["kept"] and 1 <= out["kept"] <= 2 * 2
    assert out["live_after_close"] == 0
    assert out["refused"] == ["input 'x': expected dtype float32, got float64",
                              "input 'x': expected shape (2, 3), got (3, 2)"]


def test_dropped_outputs_lend_their_buffers_to_the_next_run(artifact, fake_driver):
    out = run_py("""
        import ctypes, gc
        stats = ctypes.CDLL("libcuda.so.1").fake_cuda_stats
        def live():
            s = (ctypes.c_int * 6)(); stats(s); return s[2]
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        with rt.load(ART, device="cuda") as m:
            (y,) = m.run(["y"], {"x": x, "k": [3]}, output_device="cuda")
            first = y.data_ptr
            del y; gc.collect()
            base = live()
            ptrs = []
            for _ in range(10):  # the loop every benchmark and server writes: each output dropped in turn
                (y,) = m.run(["y"], {"x": x, "k": [3]}, output_device="cuda")
                ptrs.append(y.data_ptr)
            OUT["grew"] = live() - base
            OUT["reused_first"] = first in ptrs
            OUT["distinct"] = len(set(ptrs))
            OUT["y"] = y.numpy().tolist()
            # an exported buffer belongs to its consumer: it never comes back to the pool
            cap = y.__dlpack__()
            del y; gc.collect()
            (y2,) = m.run(["y"], {"x": x, "k": [3]}, output_device="cuda")
            OUT["export_kept_apart"] = y2.data_ptr not in [ptrs[-1]]
            del cap
    """, artifact, fake_driver)
    assert out["grew"] <= 1 and out["reused_first"] and out["distinct"] <= 2
    np.testing.assert_allclose(out["y"], Y, rtol=1e-6)
    assert out["export_kept_apart"]


_FAKE_TORCH = """
    import ctypes, sys, types
    waits = ctypes.CDLL("libcuda.so.1").fake_cuda_stream_waits
    torch = types.ModuleType("torch")
    class Tensor:  # what tlmpack reads of a torch CUDA tensor, over a buffer of the fake device
        is_cuda = True
        def __init__(self, buf, dtype="float32", shape=None, contiguous=True):
            self.buf, self.dtype, self.shape, self.contiguous = buf, "torch." + dtype, shape or buf.shape, contiguous
        def data_ptr(self): return self.buf.data_ptr
        def get_device(self): return 0
        def is_contiguous(self): return self.contiguous
        def __dlpack_device__(self): return (2, 0)
        def __dlpack__(self, stream=None): raise AssertionError("read through DLPack")
    torch.Tensor = Tensor
    torch.cuda = types.SimpleNamespace(current_stream=lambda i: types.SimpleNamespace(cuda_stream=0))
    sys.modules["torch"] = torch
"""


def test_torch_cuda_tensors_are_read_without_dlpack_and_ordered_once_a_run(artifact, fake_driver):
    out = run_py(textwrap.dedent(_FAKE_TORCH) + textwrap.dedent("""
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        with rt.load(ART, device="cuda") as m:
            xt = Tensor(m.to_device(x))
            before = waits()
            OUT["y"] = m(x=xt, k=[3])[0].tolist()
            (y,) = m.run(["y"], {"x": xt, "k": [3]}, output_device="cuda")
            OUT["waits"] = waits() - before
            for bad in (Tensor(xt.buf, "float64"), Tensor(xt.buf, shape=(3, 2)), Tensor(xt.buf, contiguous=False)):
                try:
                    m(x=bad, k=[3])
                except rt.InputError as e:
                    OUT.setdefault("refused", []).append(str(e))
            before = waits()
            m(x=m.to_device(x), k=[3])  # our own buffers need no handover
            OUT["own_waits"] = waits() - before
    """), artifact, fake_driver)
    np.testing.assert_allclose(out["y"], Y, rtol=1e-6)
    assert out["waits"] == 2  # one handover a run, on the device
    assert out["own_waits"] == 0
    assert out["refused"] == ["input 'x': expected dtype float32, got float64",
                              "input 'x': expected shape (2, 3), got (3, 2)",
                              "input 'x': a non-contiguous CUDA tensor; pass a C-contiguous one "
                              "(e.g. tensor.contiguous())"]


def test_wait_stream_in_the_c_api(artifact, fake_driver):
    out = run_py("""
        import ctypes
        waits = ctypes.CDLL("libcuda.so.1").fake_cuda_stream_waits
        with rt.load(ART, device="cuda") as m, rt.load(ART, device="cpu") as c:
            lib = m._lib.lib
            before = waits()
            OUT["legacy"] = lib.tlmrt_model_wait_stream(m._handle, None)
            OUT["own"] = lib.tlmrt_model_wait_stream(m._handle, m._stream)  # nothing to wait for
            OUT["waits"] = waits() - before
            not_a_stream = ctypes.create_string_buffer(64)  # memory, but no stream the fake driver made
            OUT["bogus"] = lib.tlmrt_model_wait_stream(m._handle, ctypes.addressof(not_a_stream))
            OUT["bogus_msg"] = m._lib.last_error(m._handle)
            OUT["cpu"] = lib.tlmrt_model_wait_stream(c._handle, None)
            OUT["y"] = m(x=np.zeros((2, 3), np.float32), k=[1])[0].tolist()  # still runs after the refusal
    """, artifact, fake_driver)
    assert (out["legacy"], out["own"], out["waits"]) == (0, 0, 1)
    assert out["bogus"] == 1 and out["bogus_msg"].startswith("cuEventRecord on the producer's stream failed: "
                                                             "CUDA_ERROR_INVALID_HANDLE")
    assert out["cpu"] == 0
    np.testing.assert_allclose(out["y"], np.zeros((2, 3)) + fabricate.WEIGHTS, rtol=1e-6)


def test_cuda_tensor_for_a_cpu_model_is_refused_with_what_to_do(artifact, fake_driver):
    out = run_py("""
        with rt.load(ART, device="cuda") as g, rt.load(ART, device="cpu") as c:
            xd = g.to_device(np.zeros((2, 3), np.float32))
            try:
                c(x=xd, k=[1])
            except rt.InputError as e:
                OUT["msg"] = str(e)
            try:
                c.run(None, {"x": np.zeros((2, 3), np.float32), "k": [1]}, output_device="cuda")
            except rt.InputError as e:
                OUT["out_msg"] = str(e)
    """, artifact, fake_driver)
    assert out["msg"] == ("input 'x': a tensor on cuda:0, but this model runs on the CPU; pass host memory "
                          "(e.g. tensor.cpu()) or load the model with device='cuda'")
    assert out["out_msg"].startswith("output_device='cuda', but this model runs on cpu")


def test_python_preflight_on_a_gpu_it_cannot_serve(artifact, fake_driver):
    out = run_py("""
        with rt.load(ART) as m:
            OUT["auto"] = m.device
        try:
            rt.load(ART, device="cuda")
        except rt.IncompatibleTargetError as e:
            OUT["cuda"] = str(e)
        OUT["lines"] = rt.check(ART, "auto").lines()
    """, artifact, fake_driver, cc=80)
    assert out["auto"] == "cpu"
    assert out["cuda"] == ("target cuda: GPU 0 (Fake GPU) is sm_80; the artifact has cubins for sm_90 and PTX for "
                           "sm_90+; rebuild it for sm_80 or use device=cpu")
    assert "cuda: driver 13.0 (13000); GPUs: cuda:0 Fake GPU (sm_80)" in out["lines"]
    assert any(x.startswith("note: not using target cuda: GPU 0 (Fake GPU) is sm_80") for x in out["lines"])


def test_auto_falls_back_to_x86_with_a_warning_when_the_c_runtime_cannot_open_cuda(artifact, fake_driver):
    out = run_py("""
        import warnings
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with rt.load(ART) as m:
                OUT["device"] = m.device
                OUT["z"] = m(x=np.ones((2, 3), np.float32), k=[1])[1].tolist()
        OUT["warnings"] = [str(x.message) for x in w]
    """, artifact, fake_driver, fail="cuModuleLoadData")
    assert out["device"] == "cpu"
    assert out["warnings"] and "cuModuleLoadData failed" in out["warnings"][0]
    assert out["warnings"][0].endswith("; running on the CPU instead")


def test_importing_the_runtime_loads_no_cuda_driver(artifact):
    code = ("import tlmpack.runtime, sys; "
            "maps = open('/proc/self/maps').read(); assert 'libcuda' not in maps")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=fabricate.REPO)


# ---- a real GPU -----------------------------------------------------------------------------------------

@pytest.mark.cuda
def test_fake_artifact_runs_on_a_real_gpu(test_bin, artifact):
    proc = subprocess.run([str(test_bin), str(artifact)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "ALL_OK" in proc.stdout, proc.stdout + proc.stderr
    with rt.load(artifact, device="cuda") as m:
        y, z = m(x=X, k=K)
        np.testing.assert_allclose(z, Z, rtol=1e-6)
        try:
            import torch
        except ImportError:
            return
        if torch.cuda.is_available():
            xt = torch.from_numpy(X).cuda()
            (zt,) = m.run_dlpack(["z"], {"x": xt, "k": torch.tensor([3], dtype=torch.int32, device="cuda")})
            np.testing.assert_allclose(torch.from_dlpack(zt).cpu().numpy(), Z, rtol=1e-6)


@pytest.mark.cuda
def test_profile_on_a_real_gpu_times_every_launch_once_a_run(artifact):
    from tlmpack.runtime import bench

    result = bench.bench(artifact, device="cuda", runs=5, warmup=2, profile=True)
    prof = result.profile
    assert prof is not None and prof.runs == 5 and prof.kernels
    assert all(k.calls_per_run == 1 and k.total_ms > 0 for k in prof.kernels)
    assert prof.run_us > 0 and prof.kernel_us > 0
    starts = [t[1] for t in prof.timeline]
    assert starts == sorted(starts) and starts[0] == 0
    with rt.load(artifact, device="cuda") as m:  # and the graph path still gives the right answer after it
        for _ in range(3):
            _, z = m(x=X, k=K)
        np.testing.assert_allclose(z, Z, rtol=1e-6)


def test_a_dynamic_batch_model_orders_every_plan_after_a_dlpack_input():
    """DLPack orders its producer before the largest plan's stream only; the other plans, each with a stream
    of its own, must then wait for that one (and torch tensors for torch's current stream)."""
    from types import SimpleNamespace

    from tlmpack.runtime.dlpack import DeviceView
    from tlmpack.runtime.model import Model

    calls: list[object] = []
    lib = SimpleNamespace(has_wait_stream=True,
                          lib=SimpleNamespace(tlmrt_model_wait_stream=lambda h, s: calls.append(s) or 0))
    view = DeviceView(1, 0, "float32", (2,), True, capsule=object(), ordering="dlpack")
    model = SimpleNamespace(_lib=lib, _handle=1, _stream=77, device_index=0, batch_plans=[1, 4],
                            _raise_for=lambda status: None)
    Model._order_after_producers(model, [view, None])
    assert calls == [77]
    calls.clear()
    model.batch_plans = []
    Model._order_after_producers(model, [view, None])  # one plan: DLPack ordered its stream already
    assert calls == []
