"""`tlmpack bench`: structure of its report, table and trace (never its timings)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures_runtime"))
import fabricate  # noqa: E402

from tlmpack.cli import main  # noqa: E402

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to compile the fake plan")


@pytest.fixture(scope="module")
def fake_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lib = fabricate.build_runtime(tmp_path_factory.mktemp("libtlmrt"))
    return fabricate.make_artifact(tmp_path_factory.mktemp("bench") / "model", runtime_lib=lib)


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TLMPACK_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TLMPACK_RUNTIME_LIB", raising=False)


def _bench_json(artifact: Path, *extra: str) -> dict:
    result = CliRunner().invoke(main, ["bench", str(artifact), "--runs", "3", "--warmup", "1", "--json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@needs_gcc
def test_bench_json_has_the_latency_distribution_and_no_profile_unless_asked(fake_artifact: Path) -> None:
    out = _bench_json(fake_artifact, "--threads", "2")
    lat = out["latency_ms"]
    assert set(lat) == {"min", "median", "p90", "mean", "max"}
    assert lat["min"] <= lat["median"] <= lat["p90"] <= lat["max"]
    assert out["runs"] == 3 and out["profile"] is None and out["device"] == "cpu"


@needs_gcc
def test_bench_profile_counts_each_kernel_once_a_run_and_splits_the_time_outside_kernels(fake_artifact: Path) -> None:
    prof = _bench_json(fake_artifact, "--threads", "2", "--profile")["profile"]
    assert prof["runs"] == 3 and prof["kernels"]
    assert all(k["calls_per_run"] == 1 for k in prof["kernels"])
    assert prof["kernel_calls_per_run"] == len(prof["kernels"])
    assert abs(sum(k["share"] for k in prof["kernels"]) - 1.0) < 1e-6
    assert prof["outside_us"] == pytest.approx(prof["run_us"] - prof["kernel_us"])
    assert 0 <= prof["io_copy_us"] <= prof["outside_us"] + 1e-9


@needs_gcc
def test_bench_table_names_every_column_and_the_time_outside_kernels(fake_artifact: Path) -> None:
    result = CliRunner().invoke(main, ["bench", str(fake_artifact), "--runs", "2", "--profile"])
    assert result.exit_code == 0, result.output
    assert "median" in result.output and "p90" in result.output and "outside kernels" in result.output
    header = next(line for line in result.output.splitlines() if line.startswith("kernel "))
    assert header.split() == ["kernel", "calls", "total", "ms", "mean", "us", "share", "GFLOP/s", "chosen_by", "sketch",
                              "flop/B"]


@needs_gcc
def test_bench_trace_is_a_chrome_trace_with_one_event_per_kernel_call(fake_artifact: Path, tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    prof = _bench_json(fake_artifact, "--trace", str(trace))["profile"]
    events = json.loads(trace.read_text())["traceEvents"]
    assert len(events) == prof["kernel_calls_per_run"]
    assert all(e["ph"] == "X" and e["dur"] >= 0 and e["ts"] >= 0 for e in events)


@needs_gcc
def test_bench_with_zero_threads_is_a_usage_error(fake_artifact: Path) -> None:
    result = CliRunner().invoke(main, ["bench", str(fake_artifact), "--threads", "0"])
    assert result.exit_code == 2 and "--threads" in result.output


def test_bench_profile_of_a_built_model_joins_the_manifest_schedules(build_zoo_model) -> None:
    _, tar = build_zoo_model("mlp")
    prof = _bench_json(tar, "--profile", "--threads", "1")["profile"]
    assert prof["kernels"] and all(k["chosen_by"] in ("tlm", "heuristic", "search", "baseline") for k in prof["kernels"])
    assert all(k["sketch"] != "" for k in prof["kernels"])


def test_built_model_manifest_counts_each_task_and_the_profile_shows_its_intensity_and_rate(build_zoo_model) -> None:
    _, tar = build_zoo_model("mlp")
    import tarfile

    with tarfile.open(tar) as archive:
        manifest = json.load(archive.extractfile("manifest.json"))
    subs = {s["id"]: s for s in manifest["subgraphs"]}
    matmuls = [s for s in subs.values() if "matmul" in s["name"]]
    assert matmuls and all(s["flops"] > 0 and s["bytes"] > 0 for s in matmuls)
    prof = _bench_json(tar, "--profile", "--threads", "1")["profile"]
    rows = {k["task"]: k for k in prof["kernels"]}
    for s in matmuls:
        row = rows[s["id"]]
        assert row["intensity"] == pytest.approx(s["flops"] / s["bytes"])
        assert row["gflops"] == pytest.approx(s["flops"] / (row["mean_us"] * 1e3))
