"""tlmpack.runtime (the Python side): safe extraction, preflight, feed validation, and runs through the C runtime.

Artifacts are fabricated by tests/fixtures_runtime/fabricate.py (a hand-written plan compiled with
gcc) until the compiler builds real ones.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures_runtime"))
import fabricate  # noqa: E402

import tlmpack.runtime as rt  # noqa: E402
from tlmpack.runtime import _capi, _cuda, preflight  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to compile the fake plan")

X = np.arange(6, dtype=np.float32).reshape(2, 3)
K = np.array([3], dtype=np.int32)


# ---- fixtures --------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def runtime_lib(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """libtlmrt.so built once from runtime_c/ with its build.sh; None while the C runtime has no sources yet."""
    if not fabricate.runtime_sources_present():
        return None
    return fabricate.build_runtime(tmp_path_factory.mktemp("libtlmrt"))


@pytest.fixture(scope="session")
def template(tmp_path_factory: pytest.TempPathFactory, runtime_lib: Path | None) -> Path:
    return fabricate.make_artifact(tmp_path_factory.mktemp("template") / "model", runtime_lib=runtime_lib)


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test gets its own extraction cache, so tests never see each other's extracted artifacts."""
    d = tmp_path / "cache"
    monkeypatch.setenv("TLMPACK_CACHE", str(d))
    return d


@pytest.fixture
def artifact(tmp_path: Path, template: Path) -> Path:
    """A fresh, writable copy of the fabricated artifact folder."""
    return Path(shutil.copytree(template, tmp_path / "model"))


@pytest.fixture
def needs_runtime(runtime_lib: Path | None) -> None:
    if runtime_lib is None:
        pytest.skip("runtime_c/ has no C sources and build.sh yet (the C runtime is being written)")


@pytest.fixture
def model(artifact: Path, needs_runtime: None):
    with rt.load(artifact) as m:
        yield m


@pytest.fixture
def no_code_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails the test if anything tries to load the C runtime (and so the model's kernels)."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the C runtime was loaded although preflight should have refused the artifact")
    monkeypatch.setattr(_capi, "load_library", refuse)


def flip_byte(path: Path, offset: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


# ---- import hygiene ------------------------------------------------------------------------------

def test_importing_runtime_does_not_import_tvm_torch_or_transformers() -> None:
    code = ("import tlmpack.runtime, sys; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('tvm','torch','transformers','tvm_ffi')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=fabricate.REPO)


# ---- safe extraction --------------------------------------------------------------------------------

def test_tar_entry_with_dotdot_is_refused_with_a_clear_message(artifact: Path, tmp_path: Path, cache: Path) -> None:
    tar = fabricate.make_tar(artifact, tmp_path / "model.tar", [fabricate.tar_member("../evil", data=b"x")])
    with pytest.raises(rt.ArtifactError) as e:
        rt.load(tar)
    assert str(e.value) == "model.tar: entry '../evil' escapes the artifact folder; refusing to extract"
    assert not (cache / "evil").exists() and not (cache.parent / "evil").exists()
    assert not list((cache / "artifacts").glob("*")), "a refused tar must leave nothing in the cache"


def test_tar_entry_with_dotdot_inside_the_path_is_refused(artifact: Path, tmp_path: Path) -> None:
    tar = fabricate.make_tar(artifact, tmp_path / "model.tar", [fabricate.tar_member("x86/../../evil", data=b"x")])
    with pytest.raises(rt.ArtifactError, match="'x86/../../evil' escapes the artifact folder"):
        rt.load(tar)


def test_tar_entry_with_absolute_path_is_refused(artifact: Path, tmp_path: Path) -> None:
    tar = fabricate.make_tar(artifact, tmp_path / "model.tar", [fabricate.tar_member("/tmp/evil", data=b"x")])
    with pytest.raises(rt.ArtifactError, match="entry '/tmp/evil' is an absolute path; refusing to extract"):
        rt.load(tar)


def test_tar_with_symlink_is_refused_even_when_it_points_inside(artifact: Path, tmp_path: Path) -> None:
    tar = fabricate.make_tar(artifact, tmp_path / "model.tar",
                             [fabricate.tar_member("x86/link.so", tarfile.SYMTYPE, linkname="model.so")])
    with pytest.raises(rt.ArtifactError, match=r"entry 'x86/link.so' is a symbolic link .*refusing to extract"):
        rt.load(tar)


def test_tar_with_hardlink_is_refused(artifact: Path, tmp_path: Path) -> None:
    tar = fabricate.make_tar(artifact, tmp_path / "model.tar",
                             [fabricate.tar_member("weights2.bin", tarfile.LNKTYPE, linkname="weights.bin")])
    with pytest.raises(rt.ArtifactError, match="entry 'weights2.bin' is a hard link"):
        rt.load(tar)


def test_tar_with_device_file_is_refused(artifact: Path, tmp_path: Path) -> None:
    tar = fabricate.make_tar(artifact, tmp_path / "model.tar", [fabricate.tar_member("null", tarfile.CHRTYPE)])
    with pytest.raises(rt.ArtifactError, match="entry 'null' is a character device"):
        rt.load(tar)


def test_file_that_is_not_a_tar_is_refused(tmp_path: Path) -> None:
    bogus = tmp_path / "model.tar"
    bogus.write_bytes(b"this is not a tar archive" * 40)
    with pytest.raises(rt.ArtifactError, match="model.tar: not a readable tar archive"):
        rt.load(bogus)


def test_missing_path_is_an_artifact_error(tmp_path: Path) -> None:
    with pytest.raises(rt.ArtifactError, match="no such file or directory"):
        rt.load(tmp_path / "nope.tar")


def test_tar_is_extracted_once_into_the_cache_and_reused(artifact: Path, tmp_path: Path, cache: Path) -> None:
    tar = fabricate.make_tar(artifact, tmp_path / "model.tar")
    first = rt.check(tar)
    second = rt.check(tar)
    assert first.ok, first.lines()
    assert first.artifact_dir == second.artifact_dir
    assert first.artifact_dir.parent == cache / "artifacts"
    assert sorted(p.name for p in (cache / "artifacts").iterdir()) == [first.artifact_dir.name], \
        "no temporary folder may be left behind"


def test_concurrent_extractions_of_one_tar_agree(artifact: Path, tmp_path: Path, cache: Path) -> None:
    tar = fabricate.make_tar(artifact, tmp_path / "model.tar")
    results: list[Path] = []
    errors: list[BaseException] = []

    def extract() -> None:
        try:
            results.append(rt.check(tar).artifact_dir)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=extract) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 1
    assert len(list((cache / "artifacts").iterdir())) == 1


def test_directory_artifact_is_used_in_place(artifact: Path, cache: Path) -> None:
    report = rt.check(artifact)
    assert report.ok, report.lines()
    assert report.artifact_dir == artifact
    assert not cache.exists()


# ---- preflight ---------------------------------------------------------------------------------------

def test_flipped_byte_in_weights_is_refused_naming_weights_bin(artifact: Path, needs_runtime: None) -> None:
    # The C runtime hashes the weights as it reads them, before it loads any code (test_runtime_c.py).
    flip_byte(artifact / "weights.bin", 5)
    with pytest.raises(rt.ArtifactError, match=r"cannot open the model: weights\.bin: sha256 mismatch \(expected [0-9a-f]{64}, "
                                               r"found [0-9a-f]{64}\)"):
        rt.load(artifact)


def test_check_hashes_the_weights_without_loading_anything(artifact: Path, no_code_loaded: None) -> None:
    flip_byte(artifact / "weights.bin", 5)
    (problem,) = rt.check(artifact).problems
    assert re.match(r"weights\.bin: sha256 mismatch \(expected [0-9a-f]{12}…, found [0-9a-f]{12}…\)", str(problem))


def test_flipped_byte_inside_a_tar_is_refused_naming_the_file(artifact: Path, tmp_path: Path, needs_runtime: None) -> None:
    flip_byte(artifact / "weights.bin", 0)
    tar = fabricate.make_tar(artifact, tmp_path / "model.tar")
    with pytest.raises(rt.ArtifactError, match=r"weights\.bin: sha256 mismatch"):
        rt.load(tar)


def test_modified_model_library_is_refused_before_it_is_loaded(artifact: Path, no_code_loaded: None) -> None:
    with open(artifact / "x86" / "model.so", "ab") as f:
        f.write(b"\0")
    with pytest.raises(rt.ArtifactError, match=r"^x86/model\.so: sha256 mismatch"):
        rt.load(artifact)


def test_missing_listed_file_is_named(artifact: Path, no_code_loaded: None) -> None:
    (artifact / "weights.bin").unlink()
    with pytest.raises(rt.ArtifactError, match="weights.bin: listed in manifest.json but missing"):
        rt.load(artifact)


def test_sha256sums_that_disagree_with_the_manifest_is_refused(artifact: Path, no_code_loaded: None) -> None:
    sums = artifact / "SHA256SUMS"
    sums.write_text("".join(line for line in sums.read_text().splitlines(True) if "weights.bin" not in line))
    with pytest.raises(rt.ArtifactError, match="SHA256SUMS and manifest.json disagree: 'weights.bin' is in manifest.json only"):
        rt.load(artifact)


def test_unsupported_format_version_says_which_was_found_and_which_is_supported(artifact: Path) -> None:
    m = fabricate.read_manifest(artifact)
    m["format_version"] = 7
    fabricate.write_manifest(artifact, m)
    with pytest.raises(rt.ArtifactError, match=r"format_version 7 is not supported; this runtime reads format_version 2"):
        rt.load(artifact)


def test_folder_without_manifest_is_not_an_artifact(tmp_path: Path) -> None:
    with pytest.raises(rt.ArtifactError, match="no manifest.json; this is not a tlmpack artifact"):
        rt.load(tmp_path)


def test_manifest_of_another_format_is_refused(artifact: Path) -> None:
    m = fabricate.read_manifest(artifact)
    m["format"] = "onnx"
    fabricate.write_manifest(artifact, m)
    with pytest.raises(rt.ArtifactError, match="format is 'onnx', expected 'tlmpack'"):
        rt.load(artifact)


def test_manifest_file_path_escaping_the_artifact_is_refused(artifact: Path) -> None:
    m = fabricate.read_manifest(artifact)
    m["files"]["../../etc/passwd"] = "0" * 64
    fabricate.write_manifest(artifact, m)
    with pytest.raises(rt.ArtifactError, match="files entry '../../etc/passwd' escapes the artifact folder"):
        rt.load(artifact)


def test_missing_cpu_feature_names_the_feature(artifact: Path, no_code_loaded: None) -> None:
    m = fabricate.read_manifest(artifact)
    m["targets"][0]["cpu_features"] = ["sse2", "avx9000_madeup"]
    fabricate.write_manifest(artifact, m)
    with pytest.raises(rt.IncompatibleTargetError) as e:
        rt.load(artifact)
    assert str(e.value) == "target x86 needs CPU features avx9000_madeup, which this CPU lacks"


def test_cpu_features_are_the_flags_every_core_has(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu sse2 avx2\n")
    assert preflight.read_cpu_features(cpuinfo) == {"fpu", "sse2", "avx2"}


def test_x86_target_on_another_architecture_is_incompatible(artifact: Path) -> None:
    host = preflight.Host("aarch64", "linux", frozenset({"fp", "asimd"}))
    report = rt.check(artifact, host=host)
    assert not report.ok
    assert str(report.problems[0]) == "target x86 needs x86-64 Linux; this machine is aarch64 linux"


def test_cuda_device_without_cuda_target_says_the_artifact_has_none(artifact: Path) -> None:
    with pytest.raises(rt.IncompatibleTargetError, match=r"device 'cuda:0': the artifact has no cuda target \(it was built for: x86\)"):
        rt.load(artifact, device="cuda:0")


def test_cuda_device_on_a_machine_without_the_driver_names_libcuda_and_auto_falls_back(artifact: Path) -> None:
    m = fabricate.read_manifest(artifact)
    m["targets"].insert(0, {"id": "cuda_sm90", "kind": "cuda", "archs": ["sm_90"], "files": []})
    fabricate.write_manifest(artifact, m)
    no_driver = preflight.Host("x86_64", "linux", preflight.read_cpu_features(), _cuda.CudaHost(
        error="CUDA driver library libcuda.so.1 not found (dlopen: gone); install the NVIDIA driver or use device=cpu"))
    report = rt.check(artifact, device="cuda", host=no_driver)
    assert [str(p) for p in report.problems] == [
        "target cuda_sm90: CUDA driver library libcuda.so.1 not found (dlopen: gone); install the NVIDIA driver or "
        "use device=cpu"]
    assert rt.check(artifact, device="auto", host=no_driver).target["id"] == "x86", "auto falls back to the CPU target"


def test_auto_device_picks_the_cpu_target(artifact: Path) -> None:
    report = rt.check(artifact, device="auto")
    assert report.ok and report.target["kind"] == "x86"


def test_malformed_device_string_is_a_value_error(artifact: Path) -> None:
    with pytest.raises(ValueError, match="device must be 'auto', 'cpu', 'cuda' or 'cuda:N'; got 'gpu'"):
        rt.load(artifact, device="gpu")


def test_check_reports_every_problem_and_load_refuses_before_opening(artifact: Path, no_code_loaded: None) -> None:
    flip_byte(artifact / "weights.bin")
    m = fabricate.read_manifest(artifact)
    m["targets"][0]["cpu_features"] = ["avx9000_madeup"]
    fabricate.write_manifest(artifact, m)
    report = rt.check(artifact)
    assert not report.ok
    assert [type(p) for p in report.problems] == [rt.ArtifactError, rt.IncompatibleTargetError]
    assert any("weights.bin" in line for line in report.lines())
    with pytest.raises(rt.IncompatibleTargetError, match="avx9000_madeup"):
        rt.load(artifact)


# ---- running through the C runtime ------------------------------------------------------------------------

def expected(x: np.ndarray = X, k: np.ndarray = K) -> tuple[np.ndarray, np.ndarray]:
    y = x + fabricate.WEIGHTS
    return y, y * k[0]


def test_run_end_to_end_through_the_c_runtime(model: rt.Model) -> None:
    y, z = model.run(None, {"x": X, "k": K})
    ey, ez = expected()
    np.testing.assert_allclose(y, ey, rtol=1e-6)
    np.testing.assert_allclose(z, ez, rtol=1e-6)


def test_load_from_tar_runs_end_to_end(artifact: Path, tmp_path: Path, needs_runtime: None) -> None:
    tar = fabricate.make_tar(artifact, tmp_path / "model.tar")
    with rt.load(tar, num_threads=2) as m:
        (z,) = m.run(["z"], {"x": X, "k": K})
    np.testing.assert_allclose(z, expected()[1], rtol=1e-6)


def test_model_describes_its_inputs_and_outputs(model: rt.Model) -> None:
    assert model.inputs == [rt.TensorSpec("x", "float32", (2, 3)), rt.TensorSpec("k", "int32", (1,))]
    assert model.outputs == [rt.TensorSpec("y", "float32", (2, 3)), rt.TensorSpec("z", "float32", (2, 3))]
    assert model.device == "cpu"
    assert model.manifest["model"]["name"] == "fake_add_scale"


def test_run_returns_requested_outputs_in_the_order_asked(model: rt.Model) -> None:
    z, y = model.run(["z", "y"], {"x": X, "k": K})
    ey, ez = expected()
    np.testing.assert_allclose(y, ey, rtol=1e-6)
    np.testing.assert_allclose(z, ez, rtol=1e-6)


def test_call_takes_keywords_or_a_dict_and_returns_every_output_as_a_list(model: rt.Model) -> None:
    by_keyword = model(x=X, k=K)
    by_dict = model({"x": X, "k": K})
    assert isinstance(by_keyword, list) and len(by_keyword) == 2
    for a, b in zip(by_keyword, by_dict, strict=True):
        np.testing.assert_array_equal(a, b)


def test_each_run_returns_fresh_arrays_the_caller_owns(model: rt.Model) -> None:
    (first,) = model.run(["y"], {"x": X, "k": K})
    kept = first.copy()
    (second,) = model.run(["y"], {"x": X + 1, "k": K})
    assert first is not second and not np.shares_memory(first, second)
    np.testing.assert_array_equal(first, kept)
    first[:] = -1  # writable, and changing it affects nothing else
    np.testing.assert_allclose(model.run(["y"], {"x": X, "k": K})[0], expected()[0], rtol=1e-6)


def test_non_contiguous_input_is_accepted(model: rt.Model) -> None:
    xt = np.ascontiguousarray(X.T).T  # same values, Fortran order
    assert not xt.flags.c_contiguous
    np.testing.assert_allclose(model(x=xt, k=K)[0], expected()[0], rtol=1e-6)


def test_python_lists_take_the_input_dtype_when_the_kind_matches(model: rt.Model) -> None:
    y, z = model(x=X.tolist(), k=[3])
    np.testing.assert_allclose(z, expected()[1], rtol=1e-6)


def test_dlpack_tensor_is_accepted(model: rt.Model) -> None:
    class OnlyDLPack:  # anything exposing __dlpack__, like a CPU torch tensor
        def __init__(self, a: np.ndarray) -> None:
            self._a = a

        def __dlpack__(self, **kwargs: object) -> object:
            return self._a.__dlpack__(**kwargs)

        def __dlpack_device__(self) -> tuple[int, int]:
            return self._a.__dlpack_device__()

    y, _ = model(x=OnlyDLPack(X), k=K)
    np.testing.assert_allclose(y, expected()[0], rtol=1e-6)


def test_cpu_torch_tensor_is_accepted_through_dlpack(model: rt.Model) -> None:
    import torch

    y, z = model(x=torch.from_numpy(X.copy()), k=torch.tensor([3], dtype=torch.int32))
    np.testing.assert_allclose(z, expected()[1], rtol=1e-6)


def test_torch_tensor_that_requires_grad_is_refused_with_the_reason(model: rt.Model) -> None:
    import torch

    with pytest.raises(rt.InputError, match="input 'x': cannot read the Tensor through DLPack"):
        model(x=torch.zeros(2, 3, requires_grad=True), k=K)


def test_python_int_out_of_range_for_the_input_dtype_is_refused(model: rt.Model) -> None:
    with pytest.raises(rt.InputError, match="input 'k': a value does not fit in int32"):
        model(x=X, k=[2**40])


def test_wrong_dtype_names_input_and_expected_dtype(model: rt.Model) -> None:
    with pytest.raises(rt.InputError) as e:
        model(x=X.astype(np.float64), k=K)
    assert str(e.value) == "input 'x': expected dtype float32, got float64"


def test_python_floats_for_an_integer_input_are_refused_not_truncated(model: rt.Model) -> None:
    with pytest.raises(rt.InputError, match="input 'k': expected dtype int32, got float64"):
        model(x=X, k=[2.5])


def test_wrong_shape_names_input_and_expected_shape(model: rt.Model) -> None:
    with pytest.raises(rt.InputError) as e:
        model(x=np.zeros((2, 4), np.float32), k=K)
    assert str(e.value) == "input 'x': expected shape (2, 3), got (2, 4)"


def test_unknown_input_name_lists_the_expected_names(model: rt.Model) -> None:
    with pytest.raises(rt.InputError) as e:
        model(x=X, k=K, kk=K)
    assert str(e.value) == "unknown input 'kk'; this model's inputs are: x, k"


def test_missing_input_is_named(model: rt.Model) -> None:
    with pytest.raises(rt.InputError) as e:
        model(x=X)
    assert str(e.value) == "missing input 'k'; this model's inputs are: x, k"


def test_unknown_output_name_lists_the_valid_names(model: rt.Model) -> None:
    with pytest.raises(rt.InputError, match="unknown output 'w'; this model's outputs are: y, z"):
        model.run(["w"], {"x": X, "k": K})


def test_kernel_failure_raises_kernel_error_with_the_kernels_message(model: rt.Model) -> None:
    with pytest.raises(rt.KernelError, match="k == -1 is the fake plan's way to fail"):
        model(x=X, k=np.array([-1], np.int32))
    np.testing.assert_allclose(model(x=X, k=K)[1], expected()[1], rtol=1e-6), "the model still runs afterwards"


def test_runs_from_several_threads_on_one_model_do_not_mix(model: rt.Model) -> None:
    results: dict[int, list[np.ndarray]] = {}

    def work(i: int) -> None:
        results[i] = [model(x=X + i, k=K)[1] for _ in range(20)]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        for z in results[i]:
            np.testing.assert_allclose(z, expected(X + i)[1], rtol=1e-6)


def test_closed_model_refuses_to_run(artifact: Path, needs_runtime: None) -> None:
    m = rt.load(artifact)
    m.close()
    m.close()  # twice is fine
    with pytest.raises(rt.TlmpackError, match="this model is closed"):
        m(x=X, k=K)


def test_manifest_that_disagrees_with_the_plan_is_refused(artifact: Path, needs_runtime: None) -> None:
    m = fabricate.read_manifest(artifact)
    m["inputs"][0]["shape"] = [3, 2]
    fabricate.write_manifest(artifact, m)
    with pytest.raises(rt.ArtifactError, match="manifest.json and the compiled plan disagree about input 0"):
        rt.load(artifact)


def test_c_runtime_refusal_at_open_is_a_typed_error_with_its_sentence(artifact: Path, needs_runtime: None) -> None:
    weights = artifact / "weights.bin"
    weights.write_bytes(weights.read_bytes()[:32])  # consistent hashes, but not the size the plan expects
    fabricate.rehash(artifact, fabricate.read_manifest(artifact))
    with pytest.raises(rt.ArtifactError, match="cannot open the model: .*weights.bin"):
        rt.load(artifact)


def test_the_artifacts_own_runtime_library_is_never_loaded_or_compiled(
        artifact: Path, cache: Path, needs_runtime: None) -> None:
    lib = artifact / "runtime_c" / "libtlmrt.so"
    lib.write_bytes(b"not an ELF file")
    fabricate.rehash(artifact, fabricate.read_manifest(artifact))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with rt.load(artifact) as model:
            np.testing.assert_allclose(model(x=X, k=K)[1], expected()[1], rtol=1e-6)
    assert not (cache / "runtime").exists()
    assert model._lib.path != lib.resolve()


def test_check_report_is_json_friendly_for_the_cli(artifact: Path) -> None:
    report = rt.check(artifact)
    assert report.ok
    json.dumps({"target": report.target, "lines": report.lines()})


def _weights_mappings() -> list[str]:
    """The lines of /proc/self/maps that map a weights.bin (the staging folder's link to it may be
    removed already: the line then ends in " (deleted)")."""
    with open("/proc/self/maps") as f:
        rows = [ln.split(maxsplit=5) for ln in f]
    return [" ".join(r) for r in rows if len(r) == 6 and r[5].removesuffix(" (deleted)\n").rstrip("\n")
            .endswith("/weights.bin")]


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux's /proc/self/maps")
def test_two_models_of_one_artifact_map_its_weights_read_only_and_unmap_them_at_close(
        artifact: Path, needs_runtime: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TLMRT_CPU_HUGE_PAGES", "0")  # the default copies them onto huge pages instead
    before = len(_weights_mappings())
    first = rt.load(artifact, device="cpu", num_threads=1)
    second = rt.load(artifact, device="cpu", num_threads=1)
    maps = _weights_mappings()
    assert len(maps) == before + 2, maps  # mapped, not copied: each open maps the file once
    assert all(ln.split()[1] == "r--p" for ln in maps[before:]), maps
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    k = np.array([3], dtype=np.int32)
    want = first.run(None, {"x": x, "k": k})
    got = second.run(None, {"x": x, "k": k})
    assert all(np.array_equal(a, b) for a, b in zip(want, got, strict=True))
    first.close()
    second.close()
    assert len(_weights_mappings()) == before


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux's /proc/self/maps")
def test_a_cpu_model_copies_its_weights_off_the_file_by_default(artifact: Path, needs_runtime: None,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TLMRT_CPU_HUGE_PAGES", raising=False)
    before = _weights_mappings()
    with rt.load(artifact, device="cpu", num_threads=1) as model:
        assert _weights_mappings() == before  # a private copy (on huge pages where the kernel has them)
        np.testing.assert_array_equal(model.run(["y"], {"x": X, "k": K})[0], X + fabricate.WEIGHTS)


def _run_c(model, outputs: list[np.ndarray | None], k: np.ndarray = K) -> int:
    """One run through the C API with the caller's output buffers (None: not asked for)."""
    ins = (_capi.IO * 2)(_capi.IO(X.ctypes.data, X.nbytes, _capi.DEVICE_CPU, 0),
                         _capi.IO(k.ctypes.data, k.nbytes, _capi.DEVICE_CPU, 0))
    outs = (_capi.IO * 2)(*(_capi.IO(None, 0, _capi.DEVICE_CPU, 0) if o is None else
                            _capi.IO(o.ctypes.data, o.nbytes, _capi.DEVICE_CPU, 0) for o in outputs))
    return model._lib.lib.tlmrt_model_run_io(model._handle, ins, outs)


def _nan_buffer(aligned: bool) -> np.ndarray:
    """A 2 x 3 float32 buffer full of NaN, starting on a 64-byte boundary or 4 bytes past one."""
    raw = np.full(6 + 32, np.nan, dtype=np.float32)
    start = (-raw.ctypes.data % 64) // 4 + (0 if aligned else 1)
    out = raw[start:start + 6].reshape(2, 3)
    assert (out.ctypes.data % 64 == 0) == aligned
    return out


@pytest.mark.parametrize("aligned", [True, False], ids=["in-place", "copied"])
def test_outputs_land_in_the_callers_buffers_aligned_or_not(model, aligned: bool) -> None:
    y, z = _nan_buffer(aligned), _nan_buffer(aligned)
    for _ in range(2):
        assert _run_c(model, [y, z]) == 0, model._lib.last_error(model._handle)
        np.testing.assert_array_equal(y, X + fabricate.WEIGHTS)
        np.testing.assert_array_equal(z, (X + fabricate.WEIGHTS) * 3)


@pytest.mark.parametrize("first_run_fails", [False, True], ids=["after-a-run", "after-a-failed-run"])
def test_an_output_written_in_place_is_back_in_the_arena_for_the_next_run(model, first_run_fails: bool) -> None:
    y, z = _nan_buffer(True), _nan_buffer(True)
    status = _run_c(model, [y, z], k=np.array([-1 if first_run_fails else 3], np.int32))
    assert (status != 0) == first_run_fails  # k == -1: scale fails after add_w wrote y
    y.fill(np.nan)
    z2 = _nan_buffer(True)
    assert _run_c(model, [None, z2]) == 0, model._lib.last_error(model._handle)  # y not asked: the arena's
    np.testing.assert_array_equal(z2, (X + fabricate.WEIGHTS) * 3)
    assert np.isnan(y).all()  # the last run's buffer is the caller's again
    y2 = _nan_buffer(True)
    assert _run_c(model, [y2, None]) == 0
    np.testing.assert_array_equal(y2, X + fabricate.WEIGHTS)


def test_an_output_that_views_another_kernels_tensor_is_copied_out(tmp_path: Path, needs_runtime: None) -> None:
    artifact = fabricate.make_artifact(tmp_path / "view", view_output=True)
    with rt.load(artifact, device="cpu", num_threads=1) as model:
        y, z = _nan_buffer(True), _nan_buffer(True)
        assert _run_c(model, [y, z]) == 0, model._lib.last_error(model._handle)
        np.testing.assert_array_equal(y, X + fabricate.WEIGHTS)
        np.testing.assert_array_equal(z, (X + fabricate.WEIGHTS) * 3)


def test_run_returns_64_byte_aligned_outputs(model) -> None:
    outs = model.run(None, {"x": X, "k": K})
    assert all(o.ctypes.data % 64 == 0 and o.flags.c_contiguous and o.flags.writeable for o in outs)
