"""Shared fixtures: artifacts are built once per session (building costs seconds, TVM's import more)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def zoo_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("zoo")


@pytest.fixture(scope="session")
def build_zoo_model(zoo_dir):
    """Exports a zoo model to ONNX and builds it for x86; cached per session."""
    from tlmpack import zoo
    from tlmpack.emit.package import BuildOptions, build

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
