"""A byte-reproducible tar: sorted entries, fixed owner, mode and mtime, no pax timestamps."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path


def write_reproducible_tar(folder: Path, out: Path, mtime: int | None = None) -> None:
    """Packs ``folder``'s regular files (and their folders) into ``out``; links are refused."""
    if mtime is None:
        mtime = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    paths = sorted(p for p in folder.rglob("*"))
    tmp = out.with_name(out.name + ".partial")
    with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
        for path in paths:
            rel = path.relative_to(folder).as_posix()
            if path.is_symlink():
                raise ValueError(f"{rel}: links are not allowed in an artifact")
            info = tarfile.TarInfo(rel)
            info.mtime = mtime
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if path.is_dir():
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            else:  # streamed: weights.bin may be gigabytes
                info.size = path.stat().st_size
                info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
                with open(path, "rb") as f:
                    tar.addfile(info, f)
    tmp.replace(out)
