"""bench/gpu_schedulers.unpack: a variant packed without weights.bin takes it from a variant packed with it,
whichever variant is named first, so carried builds may be loaded in any order or profiled alone."""

from __future__ import annotations

import io
import lzma
import sys
import tarfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from gpu_schedulers import unpack  # noqa: E402


def _pack(path: Path, files: dict[str, bytes]) -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(lzma.compress(raw.getvalue()))


def test_a_stripped_variant_named_first_takes_the_weights_of_the_one_packed_with_them(tmp_path: Path) -> None:
    carry = tmp_path / "carry"
    carry.mkdir()
    _pack(carry / "net.pool.tar.xz", {"manifest.json": b"pool", "weights.bin": b"W" * 64})
    _pack(carry / "net.pg49.noweights.tar.xz", {"manifest.json": b"pg49"})
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    out = unpack([carry], "net", "pg49", "pg49", scratch)
    assert (out / "manifest.json").read_bytes() == b"pg49"
    assert (out / "weights.bin").read_bytes() == b"W" * 64


def test_a_stripped_variant_with_no_variant_packed_with_weights_is_refused(tmp_path: Path) -> None:
    carry = tmp_path / "carry"
    carry.mkdir()
    _pack(carry / "net.pg49.noweights.tar.xz", {"manifest.json": b"pg49"})
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with pytest.raises(FileNotFoundError, match="with weights"):
        unpack([carry], "net", "pg49", "pg49", scratch)
