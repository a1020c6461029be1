"""manifest.json and SHA256SUMS: the records of the build, written down with sorted keys."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

FORMAT = "tlmpack"
FORMAT_VERSION = 2  # 2: SHA256SUMS lists manifest.json too


def _sha256(path: Path) -> str:
    """In chunks: weights.bin may be gigabytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` but the two files that describe the others."""
    hashes = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_file() and rel not in ("manifest.json", "SHA256SUMS"):
            hashes[rel] = _sha256(path)
    return hashes


def write_manifest(folder: Path, manifest: dict) -> None:
    """Adds ``files`` to the manifest, writes it and SHA256SUMS: every file's hash, manifest.json's included.

    SHA256SUMS is the root of the artifact's integrity: the runtime checks manifest.json against it
    before believing anything the manifest says, and its sha256 names the whole artifact.
    """
    hashes = file_hashes(folder)
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, **manifest, "files": hashes}
    if "SOURCE_DATE_EPOCH" in os.environ:
        manifest["built_at_epoch"] = int(os.environ["SOURCE_DATE_EPOCH"])
    text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    (folder / "manifest.json").write_text(text)
    sums = dict(hashes, **{"manifest.json": hashlib.sha256(text.encode()).hexdigest()})
    (folder / "SHA256SUMS").write_text("".join(f"{h}  {p}\n" for p, h in sorted(sums.items())))
