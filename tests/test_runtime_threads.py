"""One model under threads and fork(), and the C profiler, through tlmpack.runtime.

The artifact is the fabricated one of tests/fixtures_runtime (a hand-written plan whose kernel launches
parallel tasks through the runtime's pool), so a pool of two threads is really used.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures_runtime"))
import fabricate  # noqa: E402

import tlmpack.runtime as rt  # noqa: E402

pytestmark = [
    pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to compile the fake plan"),
    pytest.mark.skipif(not fabricate.runtime_sources_present(), reason="needs runtime_c/ sources"),
]

ROOT = Path(__file__).resolve().parents[1]
X = np.arange(6, dtype=np.float32).reshape(2, 3)
K = np.array([3], dtype=np.int32)


@pytest.fixture(scope="session")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lib = fabricate.build_runtime(tmp_path_factory.mktemp("libtlmrt"))
    return fabricate.make_artifact(tmp_path_factory.mktemp("threads") / "model", runtime_lib=lib)


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("TLMPACK_CACHE", str(d))
    monkeypatch.delenv("TLMPACK_RUNTIME_LIB", raising=False)
    return d


def expected(x: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y = x + fabricate.WEIGHTS
    return y, y * np.float32(k[0])


def test_model_run_before_fork_runs_in_the_child_without_hanging(artifact: Path, tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import os, sys
        import numpy as np
        import tlmpack.runtime as rt
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        k = np.array([3], dtype=np.int32)
        m = rt.load({str(artifact)!r}, num_threads=2)
        want = m.run(None, {{"x": x, "k": k}})
        pid = os.fork()
        if pid == 0:
            got = m.run(None, {{"x": x, "k": k}})
            same = all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
            os._exit(0 if same else 3)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        again = m.run(None, {{"x": x, "k": k}})
        sys.exit(code or (0 if all(np.array_equal(a, b) for a, b in zip(again, want, strict=True)) else 4))
    """)
    env = dict(os.environ, TLMPACK_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    env.pop("TLMPACK_RUNTIME_LIB", None)
    try:
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env,
                              cwd=ROOT)
    except subprocess.TimeoutExpired:
        pytest.fail("the forked child hung running a model loaded before fork()")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_many_python_threads_on_one_model_all_get_their_own_outputs(artifact: Path) -> None:
    threads, runs = 8, 1000
    failures: list[str] = []
    with rt.load(artifact, num_threads=2) as m:

        def work(t: int) -> None:
            rng = np.random.default_rng(t)
            for r in range(runs):
                x = rng.standard_normal((2, 3), dtype=np.float32)
                k = np.array([t + r % 5], dtype=np.int32)
                y, z = m.run(None, {"x": x, "k": k})
                ey, ez = expected(x, k)
                if not (np.array_equal(y, ey) and np.array_equal(z, ez)):
                    failures.append(f"thread {t} run {r}")
                    return

        pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
    assert failures == []


def test_profiler_counts_every_kernel_call_of_every_run(artifact: Path) -> None:
    with rt.load(artifact, num_threads=2) as m:
        lib, handle = m._lib, m._handle
        assert handle is not None
        assert lib.profile(handle).runs == 0
        lib.set_profiling(handle, True)
        for _ in range(7):
            m.run(None, {"x": X, "k": K})
        report = lib.profile(handle)
        lib.set_profiling(handle, False)
        m.run(None, {"x": X, "k": K})
        after = lib.profile(handle)
    assert report.runs == 7 and report.steps
    assert all(s.calls == 7 and s.kernel for s in report.steps)
    assert report.kernel_ns == sum(s.total_ns for s in report.steps)
    assert report.run_ns >= report.kernel_ns
    assert after.runs == 7  # off: nothing is counted


def test_profiling_switched_on_again_starts_from_zero(artifact: Path) -> None:
    with rt.load(artifact, num_threads=1) as m:
        lib, handle = m._lib, m._handle
        assert handle is not None
        lib.set_profiling(handle, True)
        m.run(None, {"x": X, "k": K})
        lib.set_profiling(handle, True)
        assert lib.profile(handle).runs == 0
        assert all(s.calls == 0 for s in lib.profile(handle).steps)


def test_profiler_counts_the_launches_that_had_to_wake_sleeping_workers(
        artifact: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle for 20 ms before each run, far past any spin, the worker is asleep at each run's first launch;
    the fake plan's second launch (FAKE_RELAUNCH_AFTER_US) may find it either way."""
    import time

    monkeypatch.setenv("FAKE_RELAUNCH_AFTER_US", "0")
    runs = 20
    with rt.load(artifact, num_threads=2) as m:
        lib, handle = m._lib, m._handle
        assert handle is not None
        m.run(None, {"x": X, "k": K})
        lib.set_profiling(handle, True)
        for _ in range(runs):
            time.sleep(0.02)
            m.run(None, {"x": X, "k": K})
        report = lib.profile(handle)
        lib.set_profiling(handle, False)
        time.sleep(0.02)
        m.run(None, {"x": X, "k": K})
        after = lib.profile(handle)
    assert report.runs == runs and report.pool_launches == 2 * runs
    assert runs <= report.pool_wakes <= 2 * runs, report.pool_wakes
    assert after.pool_wakes == report.pool_wakes  # off: nothing is counted


def test_built_model_gives_identical_bits_to_eight_threads_at_once(build_zoo_model, tmp_path: Path) -> None:
    _, tar = build_zoo_model("mlp")
    art = tmp_path / "art"
    import tarfile

    with tarfile.open(tar) as tf:
        tf.extractall(art, filter="data")
    lib = fabricate.build_runtime(tmp_path / "lib")
    exe = tmp_path / "stress_model"
    subprocess.run(["gcc", "-std=c11", "-O2", f"-I{ROOT / 'runtime_c'}", str(ROOT / "tests" / "c" / "stress_model.c"),
                    "-o", str(exe), f"-L{lib.parent}", "-ltlmrt", f"-Wl,-rpath,{lib.parent}", "-lpthread"],
                   check=True, capture_output=True, text=True)
    proc = subprocess.run([str(exe), str(art), "2", "8", "200"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "ALL_OK" in proc.stdout, proc.stdout + proc.stderr


def _add_w_tasks(artifact: Path, threads: int, report: Path) -> int:
    """The task count the pool gave add_w's parallel launch in one run (the fake kernel writes it)."""
    report.unlink(missing_ok=True)
    with rt.load(artifact, num_threads=threads) as m:
        m.run(None, {"x": X, "k": K})
    return int(report.read_text())


@pytest.fixture(scope="session")
def heavy_step_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lib = fabricate.build_runtime(tmp_path_factory.mktemp("libtlmrt-work"))
    return fabricate.make_artifact(tmp_path_factory.mktemp("work") / "model", runtime_lib=lib, step_work_mflop=100)


def test_a_step_the_plan_marks_as_heavy_is_split_into_more_tasks_than_threads(
        artifact: Path, heavy_step_artifact: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    report = tmp_path / "num_task"
    monkeypatch.setenv("FAKE_NUM_TASK_FILE", str(report))
    monkeypatch.delenv("TLMRT_CPU_TASKS_PER_THREAD", raising=False)
    monkeypatch.delenv("TLMRT_CPU_STEP_TASKS", raising=False)
    assert _add_w_tasks(artifact, 2, report) == 2  # no step work: one task a thread
    assert _add_w_tasks(heavy_step_artifact, 2, report) == 16  # 100 Mop over 2 threads: 8 tasks a thread (the cap)
    monkeypatch.setenv("TLMRT_CPU_STEP_TASKS", "0")
    assert _add_w_tasks(heavy_step_artifact, 2, report) == 2  # switched off, for measuring
    monkeypatch.setenv("TLMRT_CPU_TASKS_PER_THREAD", "3")
    monkeypatch.delenv("TLMRT_CPU_STEP_TASKS")
    assert _add_w_tasks(heavy_step_artifact, 2, report) == 6  # one count for every launch wins


def test_a_heavy_step_still_gives_the_right_outputs(heavy_step_artifact: Path) -> None:
    with rt.load(heavy_step_artifact, num_threads=2) as m:
        y, z = m.run(None, {"x": X, "k": K})
    want_y, want_z = expected(X, K)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(z, want_z)
