"""The host gate holds timing rounds while the probe says the host is slow, and only so long."""

from __future__ import annotations

import json

from tlmpack.training import host_gate
from tlmpack.training.host_gate import HostGate


class ScriptedGate(HostGate):
    """A gate whose probe reads from a script of µs values (then repeats the last)."""

    def __init__(self, probes: list[float], max_wait_s: float, path: str) -> None:
        self.script = list(probes)
        super().__init__(max_wait_s, path)

    def probe_us(self) -> float:
        return self.script.pop(0) if len(self.script) > 1 else self.script[0]


def test_a_slow_host_is_waited_out_and_the_fastest_probe_is_remembered(tmp_path, monkeypatch):
    monkeypatch.setattr(host_gate.time, "sleep", lambda s: None)
    path = str(tmp_path / "probe.json")
    gate = ScriptedGate([100.0] * 20 + [145.0, 146.0, 101.0], max_wait_s=60, path=path)
    assert gate.best_us == 100.0
    assert gate.wait() == 1.01 and gate.waited_s == 0.5  # two slow probes, then quiet
    again = ScriptedGate([120.0], max_wait_s=60, path=path)  # another process: no calibration
    assert again.best_us == 100.0 and list(json.loads(open(path).read()).values()) == [100.0]


def test_the_wait_is_bounded_and_the_record_says_how_slow_it_was(tmp_path, monkeypatch):
    monkeypatch.setattr(host_gate.time, "sleep", lambda s: None)
    gate = ScriptedGate([100.0] * 20 + [150.0], max_wait_s=2, path=str(tmp_path / "p.json"))
    assert gate.wait() == 1.5 and gate.waited_s == 2.0


def test_measurements_carry_the_probe_ratio(tmp_path):
    from tlmpack.training.measure import Measurement

    assert Measurement(True, 2.0, 1.0, host_slowdown=1.04).to_json()["host_slowdown"] == 1.04
    assert "host_slowdown" not in Measurement(True, 2.0, 1.0).to_json()
