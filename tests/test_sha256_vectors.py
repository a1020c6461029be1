"""Both SHA-256s an artifact goes through agree with the standard test vectors (FIPS 180-2 / NIST).

The Python runtime hashes with hashlib in chunks (extract.sha256_file, stage's copy-while-hashing);
the C runtime with its own implementation, reached here through its public API: an artifact whose
SHA256SUMS lists files holding the vectors' messages opens with verification on only if every
digest the C runtime computes is the standard one. The C runtime has two implementations (the x86
SHA extensions where the CPU has them, portable C elsewhere); TLMRT_SHA256_PORTABLE=1 forces the
portable one, so both are checked on a CPU that has the extensions.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures_runtime"))
import fabricate  # noqa: E402

from tlmpack.runtime import _capi  # noqa: E402
from tlmpack.runtime.errors import ArtifactError  # noqa: E402
from tlmpack.runtime.extract import sha256_file  # noqa: E402
from tlmpack.runtime.stage import _copy_hashed  # noqa: E402

VECTORS = {
    "empty": (b"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    "abc": (b"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
    "448-bit": (b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
                "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"),
    "896-bit": (b"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrs"
                b"mnopqrstnopqrstu", "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"),
    "million-a": (b"a" * 1_000_000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
}
# Not a published vector: longer than the Python side's 1 MiB chunks and the C side's 4 MiB reads,
# with every byte value, checked against hashlib's one-shot digest (OpenSSL's implementation).
_LONG = bytes(range(256)) * ((9 << 20) // 256 + 3)
VECTORS["9-mib-every-byte"] = (_LONG, hashlib.sha256(_LONG).hexdigest())


@pytest.fixture(scope="module")
def vectors_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("sha256_vectors")
    for name, (message, _) in VECTORS.items():
        (d / f"{name}.bin").write_bytes(message)
    return d


@pytest.mark.parametrize("name", list(VECTORS))
def test_python_file_hash_matches_the_standard_vector(vectors_dir: Path, name: str) -> None:
    assert sha256_file(vectors_dir / f"{name}.bin") == VECTORS[name][1]


@pytest.mark.parametrize("name", list(VECTORS))
def test_copy_while_hashing_matches_the_standard_vector_and_copies_every_byte(vectors_dir: Path, tmp_path: Path,
                                                                             name: str) -> None:
    assert _copy_hashed(vectors_dir / f"{name}.bin", tmp_path / "copy") == VECTORS[name][1]
    assert (tmp_path / "copy").read_bytes() == VECTORS[name][0]


def _artifact_listing(tmp_path: Path, vectors_dir: Path, digests: dict[str, str]) -> Path:
    art = fabricate.make_artifact(tmp_path / "model")
    (art / "v").mkdir()
    lines = []
    for name in VECTORS:
        shutil.copy(vectors_dir / f"{name}.bin", art / "v" / f"{name}.bin")
        lines.append(f"{digests[name]}  v/{name}.bin\n")
    with open(art / "SHA256SUMS", "a") as f:
        f.writelines(lines)
    return art


def test_c_runtime_hash_matches_every_standard_vector(vectors_dir: Path, tmp_path: Path) -> None:
    lib = _capi.load_library()
    art = _artifact_listing(tmp_path, vectors_dir, {k: v for k, (_, v) in VECTORS.items()})
    handle = lib.open_model(art, 1, verify_files=True)  # verification hashes every listed file
    lib.lib.tlmrt_model_close(handle)


def test_c_runtime_refuses_a_digest_one_hex_digit_off(vectors_dir: Path, tmp_path: Path) -> None:
    lib = _capi.load_library()
    digests = {k: v for k, (_, v) in VECTORS.items()}
    digests["abc"] = digests["abc"][:-1] + ("e" if digests["abc"][-1] != "e" else "f")
    art = _artifact_listing(tmp_path, vectors_dir, digests)
    with pytest.raises(ArtifactError, match=r"v/abc\.bin: sha256 mismatch"):
        lib.open_model(art, 1, verify_files=True)


@pytest.mark.skipif(os.environ.get("TLMRT_SHA256_PORTABLE") == "1", reason="already the portable run")
def test_c_runtime_portable_hash_matches_every_standard_vector_too() -> None:
    env = {**os.environ, "TLMRT_SHA256_PORTABLE": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
                           "-k", "c_runtime_hash_matches or one_hex_digit_off"],
                          env=env, cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 passed" in proc.stdout, proc.stdout[-3000:]
