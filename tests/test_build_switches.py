"""Every switch that changes generated code is a build option the manifest records (build_switches.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tlmpack.build import BuildOptions, build


@pytest.fixture(scope="module")
def mlp_onnx(tmp_path_factory):
    from tlmpack import zoo

    path = tmp_path_factory.mktemp("switches") / "mlp.onnx"
    zoo.export_onnx("mlp", path)
    return path


def test_rules_disabled_through_the_environment_are_recorded_in_the_manifest(mlp_onnx, tmp_path, monkeypatch):
    default = build(str(mlp_onnx), tmp_path / "a.tar", BuildOptions())
    assert default["build_options"]["disabled_rules"] == []
    monkeypatch.setenv("TLMPACK_DISABLE_RULES", "x86-matmul")
    off = build(str(mlp_onnx), tmp_path / "b.tar", BuildOptions())
    assert off["build_options"]["disabled_rules"] == ["x86-matmul"]
    assert off["subgraphs"] != default["subgraphs"], "disabling the matmul rule should change the MLP's schedules"


def test_an_explicit_option_wins_over_the_environment_and_the_environment_is_restored(mlp_onnx, tmp_path, monkeypatch):
    monkeypatch.setenv("TLMPACK_DISABLE_RULES", "x86-matmul")
    manifest = build(str(mlp_onnx), tmp_path / "c.tar", BuildOptions(disabled_rules=()))
    assert manifest["build_options"]["disabled_rules"] == []
    assert os.environ["TLMPACK_DISABLE_RULES"] == "x86-matmul"


def test_the_recorded_options_rebuild_the_same_bytes(mlp_onnx, tmp_path, monkeypatch):
    monkeypatch.setenv("TLMPACK_DISABLE_RULES", "x86-matmul")
    first = build(str(mlp_onnx), tmp_path / "d.tar", BuildOptions())
    monkeypatch.delenv("TLMPACK_DISABLE_RULES")
    recorded = tuple(first["build_options"]["disabled_rules"])
    build(str(mlp_onnx), tmp_path / "e.tar", BuildOptions(disabled_rules=recorded))
    assert (tmp_path / "d.tar").read_bytes() == (tmp_path / "e.tar").read_bytes()


def test_an_unknown_rule_name_is_refused_naming_the_rules():
    from tlmpack.errors import LoweringError

    with pytest.raises(LoweringError, match="unknown rule 'x86-magic'; the rules are .*x86-matmul"):
        build("unused.onnx", Path("/nonexistent/x.tar"), BuildOptions(disabled_rules=("x86-magic",)))
