"""A CPU model reads a 64-byte aligned input where the caller keeps it, instead of copying it into
the arena (issue 15's runtime overhead: a 602 KB image cost 70 us a run). These tests check that it
does, that the input's views read the same bytes, that an unaligned input or an older plan is still
copied, that a damaged table is refused at load, and that real kernels neither write nor read past a
caller's input."""

from __future__ import annotations

import ctypes
import mmap
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures_runtime"))
import fabricate  # noqa: E402

import tlmpack.runtime as rt  # noqa: E402
from tlmpack.runtime.kernels import empty_aligned  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to compile the fake plan")

K = np.array([3], dtype=np.int32)


@pytest.fixture(scope="module")
def runtime_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fabricate.build_runtime(tmp_path_factory.mktemp("libtlmrt"))


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("TLMPACK_CACHE", str(d))
    return d


def _x(aligned: bool) -> np.ndarray:
    """A 2 x 3 float32 input starting on a 64-byte boundary, or 4 bytes past one."""
    raw = np.zeros(6 + 32, dtype=np.float32)
    start = (-raw.ctypes.data % 64) // 4 + (0 if aligned else 1)
    x = raw[start:start + 6].reshape(2, 3)
    x[...] = np.arange(6, dtype=np.float32).reshape(2, 3) + 0.5
    assert (x.ctypes.data % 64 == 0) == aligned
    return x


def _address_read(model: rt.Model, x: np.ndarray, where: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """Runs once; returns the address add_w read x's bytes at, after checking both outputs."""
    monkeypatch.setenv("FAKE_INPUT_ADDRESS_FILE", str(where))
    y, z = model.run(None, {"x": x, "k": K})
    np.testing.assert_array_equal(y, x + fabricate.WEIGHTS)
    np.testing.assert_array_equal(z, (x + fabricate.WEIGHTS) * 3)
    return int(where.read_text())


def test_an_aligned_input_is_read_through_its_view_where_the_caller_keeps_it(
        tmp_path: Path, runtime_lib: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    artifact = fabricate.make_artifact(tmp_path / "m", runtime_lib=runtime_lib, input_views=True)
    with rt.load(artifact, device="cpu", num_threads=2) as model:
        aligned, unaligned = _x(True), _x(False)
        assert _address_read(model, aligned, tmp_path / "a", monkeypatch) == aligned.ctypes.data
        arena = _address_read(model, unaligned, tmp_path / "a", monkeypatch)
        assert arena != unaligned.ctypes.data and arena % 64 == 0  # copied into the arena
        assert _address_read(model, aligned, tmp_path / "a", monkeypatch) == aligned.ctypes.data
        unaligned[...] += 1  # the arena again, with the new values: nothing left from the in-place run
        assert _address_read(model, unaligned, tmp_path / "a", monkeypatch) == arena


def test_an_older_plan_without_the_bases_copies_every_input(
        tmp_path: Path, runtime_lib: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    artifact = fabricate.make_artifact(tmp_path / "m", runtime_lib=runtime_lib)
    with rt.load(artifact, device="cpu", num_threads=1) as model:
        x = _x(True)
        assert _address_read(model, x, tmp_path / "a", monkeypatch) != x.ctypes.data


def test_an_input_is_read_in_place_beside_an_output_that_is_a_view(
        tmp_path: Path, runtime_lib: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    artifact = fabricate.make_artifact(tmp_path / "m", runtime_lib=runtime_lib, input_views=True, view_output=True)
    with rt.load(artifact, device="cpu", num_threads=1) as model:
        x = _x(True)
        assert _address_read(model, x, tmp_path / "a", monkeypatch) == x.ctypes.data


@pytest.mark.parametrize(("base", "why"), [(7, "base expected 0..6, found 7"),
                                           (5, "tensor 6 is not a view inside its base 5")])
def test_a_damaged_base_table_is_refused_at_load(tmp_path: Path, runtime_lib: Path, base: int, why: str) -> None:
    artifact = fabricate.make_artifact(tmp_path / "m", runtime_lib=runtime_lib, input_views=True, view_base=base)
    with pytest.raises(rt.ArtifactError, match=why):
        rt.load(artifact, device="cpu", num_threads=1)


# ---- a real model: a convolution stem, a matmul and a reshape, built with TVM ----------------------


def _onnx_model(path: Path) -> Path:
    """Conv 3x3 (3 -> 16, stride 2) + Relu, flattened, then a Gemm: the input is read by a stem
    convolution (NCHW, in place) and the model has views."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((16, 3, 3, 3)) / 5).astype(np.float32)
    g = (rng.standard_normal((16 * 8 * 8, 10)) / 32).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], strides=[2, 2], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("Gemm", ["f", "g"], ["y"])]
    graph = helper.make_graph(nodes, "stem_gemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(g, "g")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return path


def _guarded(nbytes: int) -> tuple[mmap.mmap, np.ndarray, int]:
    """A float32 buffer of nbytes that ends where an inaccessible page begins (64-byte aligned when
    nbytes is a multiple of 64): a kernel reading or writing past it faults."""
    page = mmap.PAGESIZE
    pages = -(-nbytes // page)
    region = mmap.mmap(-1, (pages + 1) * page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mprotect(ctypes.c_void_p(base + pages * page), ctypes.c_size_t(page), 0) == 0
    start = pages * page - nbytes
    arr = np.frombuffer(region, dtype=np.uint8, count=nbytes, offset=start).view(np.float32)
    return region, arr, base + start


def test_a_built_model_reads_its_input_in_place_and_matches_onnxruntime(tmp_path: Path) -> None:
    from tlmpack.build import BuildOptions, build
    from tlmpack.verify import onnxruntime_outputs, rel_err

    model = _onnx_model(tmp_path / "m.onnx")
    tar = tmp_path / "m.tar"
    build(str(model), tar, BuildOptions(scheduler="heuristic", cpu="haswell", cores=2))
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)
    (ref,) = onnxruntime_outputs(model, {"x": x})
    assert np.abs(ref).max() > 0 and np.isfinite(ref).all()
    region, guarded, address = _guarded(x.nbytes)
    guarded[...] = x.reshape(-1)
    aligned = empty_aligned(x.shape, np.float32)
    aligned[...] = x
    with rt.load(tar, device="cpu", num_threads=2) as m:
        assert _plan_names_tensor_bases(m)
        for feed in (guarded.reshape(x.shape), aligned, x):
            (out,) = m.run(None, {"x": feed})
            assert rel_err(out, ref) < 1e-4
    assert address % 64 == 0
    np.testing.assert_array_equal(guarded.reshape(x.shape), x)  # never written
    del guarded
    region.close()


def _plan_names_tensor_bases(model: rt.Model) -> bool:
    """Whether the loaded plan exports its tensor bases (so its inputs are read in place)."""
    lib = ctypes.CDLL(str(Path(model.path) / "x86" / "model.so"))
    return hasattr(lib, "tlmrt_plan_v1_tensor_bases")
