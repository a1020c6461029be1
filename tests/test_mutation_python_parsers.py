"""Seeded mutation tests for the artifact parsers that live in Python: tar extraction and the manifest.

The C parsers have libFuzzer targets (tests/c/fuzz/); these are their Python counterparts, cheap enough
for every CI run. Each case damages a good artifact in a seeded way and loads it: the load either works
(the damage missed everything that matters) or raises one of tlmpack's typed errors with a one-line
message, never another exception, a crash or a hang.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures_runtime"))
import fabricate  # noqa: E402

import tlmpack.runtime as rt  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to compile the fake plan")

TAR_CASES = 450
MANIFEST_CASES = 120


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lib = fabricate.build_runtime(tmp_path_factory.mktemp("libtlmrt"))
    return fabricate.make_artifact(tmp_path_factory.mktemp("mut") / "model", runtime_lib=lib)


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TLMPACK_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TLMPACK_RUNTIME_LIB", raising=False)


def _load_or_typed_error(path: Path) -> str:
    """'ok' when it loads (and runs), else the typed error's message; any other exception fails the test."""
    try:
        with rt.load(path, device="cpu", num_threads=1) as m:
            m.run(None, {s.name: _zeros(s) for s in m.inputs})
        return "ok"
    except rt.TlmpackError as e:
        message = str(e)
        assert message and "\n" not in message.strip(), f"not one line: {message!r}"
        return message


def _zeros(spec: rt.TensorSpec) -> Any:
    import numpy as np

    return np.zeros(spec.shape, dtype=spec.dtype)


def _mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    buf = bytearray(data)
    kind = rng.randrange(4)
    if kind == 0:  # flip a few bits
        for _ in range(rng.randint(1, 8)):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
    elif kind == 1:  # truncate
        del buf[rng.randrange(len(buf)):]
    elif kind == 2:  # overwrite a header-sized block with noise
        at = rng.randrange(len(buf))
        buf[at:at + 512] = bytes(rng.randrange(256) for _ in range(min(512, len(buf) - at)))
    else:  # a run of digits or NULs where tar keeps sizes and checksums
        at = (rng.randrange(max(1, len(buf) // 512)) * 512) + rng.choice((100, 124, 136, 148, 156))
        if at < len(buf):
            buf[at:at + 12] = rng.choice((b"77777777777\0", b"\0" * 12, b"-1         \0", b"99999999999\0"))
    return bytes(buf)


def test_mutated_tars_load_or_fail_with_a_typed_one_line_error(good: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    tar = fabricate.make_tar(good, tmp_path / "good.tar")
    data = tar.read_bytes()
    rng = random.Random(14)
    outcomes: dict[str, int] = {}
    for i in range(TAR_CASES):
        bad = tmp_path / f"bad{i}.tar"
        bad.write_bytes(_mutate_bytes(data, rng))
        # a fresh cache: one keyed by SHA256SUMS would serve the genuine copy to a tar whose SHA256SUMS survived
        monkeypatch.setenv("TLMPACK_CACHE", str(tmp_path / f"cache{i}"))
        outcome = "ok" if _load_or_typed_error(bad) == "ok" else "refused"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        bad.unlink()
    assert outcomes.get("refused", 0) > TAR_CASES // 2, outcomes


def _mutate_json(value: Any, rng: random.Random) -> Any:
    """One structural change somewhere in a JSON value: a key dropped, a type changed, a number made odd."""
    if isinstance(value, dict) and value and rng.random() < 0.7:
        key = rng.choice(sorted(value))
        out = dict(value)
        if rng.random() < 0.25:
            del out[key]
        else:
            out[key] = _mutate_json(value[key], rng)
        return out
    if isinstance(value, list) and value and rng.random() < 0.7:
        out = list(value)
        k = rng.randrange(len(out))
        out[k] = _mutate_json(out[k], rng)
        return out
    return rng.choice([None, -1, 0, 2**63, 1.5, "", "x" * 300, [], {}, True, "../../etc/passwd", [2, -3], "float99"])


def test_mutated_manifests_load_or_fail_with_a_typed_one_line_error(good: Path, tmp_path: Path) -> None:
    manifest = fabricate.read_manifest(good)
    text = (good / "manifest.json").read_bytes()
    rng = random.Random(15)
    untyped: list[str] = []
    for i in range(MANIFEST_CASES):
        art = tmp_path / f"m{i}"
        shutil.copytree(good, art)
        if i % 3 == 0:
            (art / "manifest.json").write_bytes(_mutate_bytes(text, rng))
        else:
            (art / "manifest.json").write_text(json.dumps(_mutate_json(manifest, rng)))
        try:
            _load_or_typed_error(art)
        except Exception as e:  # noqa: BLE001  (what the test is looking for: any untyped exception)
            tb = e.__traceback__
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            where = f"{Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno}" if tb else "?"
            untyped.append(f"case {i}: {type(e).__name__} at {where}: {e}")
        shutil.rmtree(art)
    assert not untyped, "\n".join(untyped)
