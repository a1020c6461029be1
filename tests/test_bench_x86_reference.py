"""bench/bench_x86.py flags a reference that ignores its input: a rel err against it checks nothing."""

from __future__ import annotations

import numpy as np
from bench_scripts import load


def _module():
    return load("bench_x86")


class _Session:
    """onnxruntime's run() for a model computing ``fn`` of its feed."""

    def __init__(self, fn):
        self.fn = fn

    def run(self, _names, feed):
        return [self.fn(feed)]


def test_a_dead_reference_is_flagged_and_a_live_one_is_not():
    m = _module()
    feed = {"x": np.ones((1, 4), np.float32), "ids": np.arange(6, dtype=np.int64).reshape(1, 6)}
    dead = _Session(lambda f: np.full((1, 3), 0.25, np.float32))
    assert not m.reference_follows_input(dead, feed, dead.run(None, feed)[0])
    live = _Session(lambda f: f["x"] * 2)
    assert m.reference_follows_input(live, feed, live.run(None, feed)[0])
    by_ids = _Session(lambda f: f["ids"].astype(np.float32) * np.arange(6))  # integer inputs are rolled
    assert m.reference_follows_input(by_ids, feed, by_ids.run(None, feed)[0])


def test_a_model_is_exported_with_the_weights_asked_for_and_an_existing_file_is_kept(tmp_path, monkeypatch):
    m = _module()
    asked = []

    def export_onnx(name, path, seed, weights):
        asked.append(weights)
        path.write_bytes(b"onnx")
        return {"time_s": 0.0}

    monkeypatch.setattr(m.zoo, "export_onnx", export_onnx)
    monkeypatch.setattr(m.zoo, "random_inputs", lambda name, seed: {"x": np.ones((1, 2), np.float32)})
    path, feed = m.ensure_model("efficientnet-b0", tmp_path, 0, "portable")
    assert asked == ["portable"] and path.read_bytes() == b"onnx" and feed["x"].shape == (1, 2)
    m.ensure_model("efficientnet-b0", tmp_path, 0, "dense")
    assert asked == ["portable"]  # already there: used as it is
