"""A private folder holding exactly the bytes the C runtime will open, hashed as they are written.

Preflight checks an artifact folder, and the C runtime opens files by path afterwards: whoever can
write the folder between the two could swap a checked library for another. So before the C
runtime opens a model, the files it will load as code or data (the target's files: plan library,
cubins, PTX) are copied into a fresh folder only this process's user can reach, hashing the very
bytes that are written, and compared with the manifest. The weights are linked, not copied: the C
runtime reads them itself (a CPU model copies them onto huge pages, else it maps them read-only)
and hashes the memory it will use (against SHA256SUMS and the plan's own digest), so they are
hashed once per load, by the one reading that is used. A
SHA256SUMS for just these files goes along, so the C runtime's own verification runs too.

The folder is removed as soon as the C runtime has opened the model (it reads nothing later).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tlmpack.runtime.errors import ArtifactError
from tlmpack.runtime.extract import cache_root

_CHUNK = 1 << 20
WEIGHTS_NAME = "weights.bin"  # weights.bin and x86/weights.bin: read and hashed by the C runtime itself


def files_to_open(manifest: Mapping[str, Any], target: Mapping[str, Any]) -> list[str]:
    """The artifact files the C runtime reads to open `target`: its own files, and the shared
    weights.bin unless the target has weights of its own (x86/weights.bin next to a CUDA target's)."""
    wanted = set(target.get("files", []))
    if WEIGHTS_NAME in manifest["files"] and not any(Path(f).name == WEIGHTS_NAME for f in wanted):
        wanted.add(WEIGHTS_NAME)
    return sorted(wanted)


def _copy_hashed(src: Path, dst: Path) -> str:
    """Copies src to a new file dst (never through an existing one) and returns the sha256 of what was written."""
    h = hashlib.sha256()
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    with open(src, "rb") as fin, os.fdopen(fd, "wb") as fout:
        while chunk := fin.read(_CHUNK):
            h.update(chunk)
            fout.write(chunk)
    os.chmod(dst, 0o500)
    return h.hexdigest()


def _link(src: Path, dst: Path) -> None:
    """A hard link when src is on the same file system, else a symbolic one: the weights are not copied."""
    try:
        os.link(src, dst)
    except OSError:
        os.symlink(src.resolve(), dst)


def _private_folder() -> Path:
    """A fresh folder (mode 0700) in the cache, else in the temporary folder (a read-only home)."""
    errors = []
    for base in (cache_root() / "open", Path(tempfile.gettempdir())):
        try:
            base.mkdir(parents=True, exist_ok=True)
            return Path(tempfile.mkdtemp(prefix="tlmpack-load-", dir=base))
        except OSError as e:
            errors.append(f"{base}: {e.strerror or e}")
    raise ArtifactError(f"cannot create a private folder to open the model from ({'; '.join(errors)}); "
                        f"set TLMPACK_CACHE to a writable folder")


@contextlib.contextmanager
def private_copy(artifact_dir: Path, manifest: Mapping[str, Any], target: Mapping[str, Any]) -> Iterator[Path]:
    """Yields a private folder with the target's files (copied and checked) and the weights (linked)."""
    files: Mapping[str, str] = manifest["files"]
    private = _private_folder()
    try:
        for rel in files_to_open(manifest, target):
            src = artifact_dir / rel
            dst = private / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_symlink() or not src.is_file():
                raise ArtifactError(f"{rel}: listed in manifest.json but {'a link' if src.is_symlink() else 'missing'} "
                                    f"in the artifact {artifact_dir}")
            if Path(rel).name == WEIGHTS_NAME:
                _link(src, dst)
                continue
            try:
                found = _copy_hashed(src, dst)
            except OSError as e:
                raise ArtifactError(f"{rel}: cannot read it ({e.strerror or e})") from e
            if found != files[rel]:
                raise ArtifactError(f"{rel}: sha256 mismatch (expected {files[rel][:12]}…, found {found[:12]}…); "
                                    f"the artifact is corrupted or was modified")
        sums = "".join(f"{files[rel]}  {rel}\n" for rel in files_to_open(manifest, target))
        (private / "SHA256SUMS").write_text(sums)
        yield private
    finally:
        shutil.rmtree(private, ignore_errors=True)
