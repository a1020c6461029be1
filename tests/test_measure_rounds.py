"""The x86 timing procedure: programs are timed in interleaved rounds, not in one burst each."""

from tlmpack.training.measure import LONG_CALL_S, TimedProgram, time_interleaved


class _RecordingLibrary:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def time(self, name, arrays, repeats, min_repeat_ms):
        assert repeats == 1
        self.calls.append(name)
        return [float(len(self.calls))]


def test_rounds_visit_every_program_before_any_program_again():
    lib = _RecordingLibrary()
    samples = time_interleaved({n: TimedProgram(lib, n, [], 1e-4) for n in "abc"}, rounds=4)
    assert lib.calls == ["a", "b", "c"] * 4
    assert samples["b"] == [2.0, 5.0, 8.0, 11.0]


def test_long_programs_get_three_rounds():
    lib = _RecordingLibrary()
    samples = time_interleaved({"fast": TimedProgram(lib, "fast", [], 1e-4),
                                "slow": TimedProgram(lib, "slow", [], 2 * LONG_CALL_S)}, rounds=9)
    assert len(samples["fast"]) == 9 and len(samples["slow"]) == 3


def test_programs_of_different_builds_share_the_rounds():
    one, two = _RecordingLibrary(), _RecordingLibrary()
    samples = time_interleaved({("f1", "p0"): TimedProgram(one, "p0", [], 1e-4),
                                ("f2", "p0"): TimedProgram(two, "p0", [], 1e-4)}, rounds=3)
    assert one.calls == two.calls == ["p0"] * 3 and set(samples) == {("f1", "p0"), ("f2", "p0")}


def test_timing_lock_lets_one_pass_run_at_a_time(tmp_path):
    import subprocess
    import sys
    import time

    from tlmpack.training.measure import TimingLock

    path = str(tmp_path / "lock")
    code = (f"from tlmpack.training.measure import TimingLock\nprint('ready', flush=True)\n"
            f"with TimingLock({path!r}): print('taken')")
    with TimingLock(path):
        other = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert other.stdout.readline().strip() == "ready"
        time.sleep(1)
        assert other.poll() is None  # waiting for this pass to end
    assert other.communicate(timeout=30)[0].strip() == "taken"
