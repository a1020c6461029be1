"""The x86 timing procedure: programs are timed in interleaved rounds, not in one burst each."""

from tlmpack.schedule.data.measure import LONG_CALL_S, time_interleaved


class _RecordingLibrary:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def time(self, name, arrays, repeats, min_repeat_ms):
        assert repeats == 1
        self.calls.append(name)
        return [float(len(self.calls))]


def test_rounds_visit_every_program_before_any_program_again():
    lib = _RecordingLibrary()
    samples = time_interleaved(lib, ["a", "b", "c"], [], {"a": 1e-4, "b": 1e-4, "c": 1e-4}, rounds=4)
    assert lib.calls == ["a", "b", "c"] * 4
    assert samples["b"] == [2.0, 5.0, 8.0, 11.0]


def test_long_programs_get_three_rounds():
    lib = _RecordingLibrary()
    samples = time_interleaved(lib, ["fast", "slow"], [], {"fast": 1e-4, "slow": 2 * LONG_CALL_S}, rounds=9)
    assert len(samples["fast"]) == 9 and len(samples["slow"]) == 3
