"""Shared fixtures: artifacts are built once per session (building costs seconds, TVM's import more)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

# the tests check programs; they need no quiet host (host_gate.py would wait up to 2 min a pass)
os.environ.setdefault("TLMPACK_HOST_WAIT_S", "1")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session", autouse=True)
def c_runtime_lib(tmp_path_factory) -> Path:
    """The C runtime the Python runtime loads in tests: the current runtime_c/ sources, compiled.

    In a checkout the package's library (tlmpack/runtime/libtlmrt.so, which `pip install -e .`
    compiles in place) is rebuilt the same way when it is missing or older than a source, so the
    tests never run a stale C runtime; for an installed tlmpack, a fresh build is named by
    TLMPACK_RUNTIME_LIB (for this session and the CLI subprocesses it starts).
    """
    from tlmpack.runtime import _capi

    if "TLMPACK_RUNTIME_LIB" in os.environ:
        return Path(os.environ["TLMPACK_RUNTIME_LIB"])
    sources = [p for p in (REPO / "runtime_c").iterdir() if p.suffix in (".c", ".h", ".sh")]
    lib = _capi.PACKAGE_LIB
    if lib.is_file() and all(lib.stat().st_mtime >= p.stat().st_mtime for p in sources):
        return lib
    out = tmp_path_factory.mktemp("libtlmrt")
    subprocess.run(["bash", str(REPO / "runtime_c" / "build.sh"), str(out)], check=True, capture_output=True)
    if lib.parent == REPO / "tlmpack" / "runtime":  # this checkout's package: what build_ext --inplace does
        tmp = lib.with_name(f".libtlmrt.{os.getpid()}.tmp")
        shutil.copyfile(out / "libtlmrt.so", tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, lib)  # atomic: a process that loaded the old one keeps it
        return lib
    os.environ["TLMPACK_RUNTIME_LIB"] = str(out / "libtlmrt.so")
    return out / "libtlmrt.so"


@pytest.fixture(scope="session")
def zoo_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("zoo")


@pytest.fixture(scope="session")
def build_zoo_model(zoo_dir):
    """Exports a zoo model to ONNX and builds it for x86; cached per session."""
    from tlmpack import zoo
    from tlmpack.build import BuildOptions, build

    built: dict[str, tuple[Path, Path]] = {}

    def make(name: str) -> tuple[Path, Path]:
        if name not in built:
            onnx_path = zoo_dir / f"{name}.onnx"
            zoo.export_onnx(name, onnx_path)
            tar = zoo_dir / f"{name}.tar"
            build(str(onnx_path), tar, BuildOptions())
            built[name] = (onnx_path, tar)
        return built[name]

    return make


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` need a GPU: where the NVIDIA driver finds none, they are skipped, not failed."""
    marked = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not marked:
        return
    from tlmpack.runtime import _cuda

    info = _cuda.probe()
    if info.error or not info.gpus:
        skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {info.error or 'the driver finds none'}")
        for item in marked:
            item.add_marker(skip)
