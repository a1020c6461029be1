"""Safe extraction of an artifact .tar into a content-addressed cache.

An artifact comes from elsewhere and holds code we are about to dlopen, so the tar is not trusted:
every member is checked before anything is written (no absolute paths, no `..`, no links, no
devices), tarfile's "data" filter is applied on top, and the result is checked again on disk. A
damaged header is not taken for the end of the archive (tarfile stops listing there quietly): what
follows the last member must be the zero blocks that end a tar. Extraction goes into a temporary
folder that is renamed into place, so a cache entry either is complete or does not exist:
concurrent loads and interrupted extractions are safe.

The cache is keyed by the sha256 of the tar's SHA256SUMS, which covers every other file (manifest.json
included), so finding an entry costs no pass over the weights. A folder enters the cache only after
every file matched SHA256SUMS (the caller's `verify`), so a tampered tar with a genuine SHA256SUMS
cannot stand in for the genuine artifact; and what a load uses is hashed again when it is used
(stage.py and the C runtime), never trusted because it sits in the cache.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tlmpack.runtime.errors import ArtifactError

_CHUNK = 1 << 20
_STALE_TMP_S = 24 * 3600  # a temporary folder this old was left by an interrupted extraction
# tarfile's extraction filters arrived in 3.12 and were backported to 3.10.12/3.11.4; our own member
# check is stricter than the "data" filter, so an older Python still extracts safely without it.
_FILTER: dict[str, str] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}


def cache_root() -> Path:
    """Where tlmpack keeps extracted artifacts and rebuilt runtimes: $TLMPACK_CACHE, else the XDG cache."""
    env = os.environ.get("TLMPACK_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "tlmpack"


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in chunks so big weights do not need to fit in memory twice."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def unsafe_path_reason(name: str) -> str | None:
    """Why a relative path from an untrusted source (tar entry, manifest) is unsafe, or None if it is fine."""
    if not name:
        return "has an empty name"
    if "\x00" in name:
        return "has a NUL byte in its name"
    if name.startswith("/") or name.startswith("\\"):
        return "is an absolute path"
    parts = name.replace("\\", "/").split("/")
    if any(p == ".." for p in parts):
        return "escapes the artifact folder"
    if len(parts[0]) >= 2 and parts[0][1] == ":":  # a Windows drive ("C:...") is absolute somewhere
        return "is an absolute path"
    return None


def _member_kind(m: tarfile.TarInfo) -> str | None:
    """A description of a member that is neither a regular file nor a folder, or None if it is one of those."""
    if m.isreg() or m.isdir():
        return None
    if m.issym():
        return f"is a symbolic link (to {m.linkname!r})"
    if m.islnk():
        return f"is a hard link (to {m.linkname!r})"
    if m.ischr():
        return "is a character device"
    if m.isblk():
        return "is a block device"
    if m.isfifo():
        return "is a FIFO"
    return f"has tar type {m.type!r}"


def _normalized(name: str) -> str:
    """The member's path without './' components and trailing slashes, as it will land on disk."""
    return "/".join(p for p in name.split("/") if p not in ("", "."))


def check_members(tar_name: str, members: list[tarfile.TarInfo]) -> list[str]:
    """Refuses any member an artifact never has; returns the normalized regular-file paths.

    Stricter than tarfile's "data" filter on purpose: the filter allows links that stay inside the
    destination, but a tlmpack artifact has none, so any link is a sign of tampering.
    """
    files: list[str] = []
    seen: set[str] = set()
    for m in members:
        reason = unsafe_path_reason(m.name)
        if reason is None:
            reason = _member_kind(m)
        if reason is None and _normalized(m.name) in seen and not m.isdir():
            reason = "appears twice"
        if reason is not None:
            raise ArtifactError(f"{tar_name}: entry {m.name!r} {reason}; refusing to extract")
        norm = _normalized(m.name)
        seen.add(norm)
        if m.isreg() and norm:
            files.append(norm)
        elif m.isreg():
            raise ArtifactError(f"{tar_name}: entry {m.name!r} is a file without a name; refusing to extract")
    return files


def _check_extracted(tar_name: str, root: Path, files: list[str]) -> None:
    """Checks that every file landed inside `root` as a regular file, and that nothing else appeared there."""
    real_root = root.resolve()
    for rel in files:
        p = root / rel
        real = p.resolve()
        if real_root not in real.parents or p.is_symlink() or not p.is_file():
            raise ArtifactError(f"{tar_name}: entry {rel!r} did not extract to a regular file inside the artifact folder")
    expected = set(files)
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            if (Path(dirpath) / d).is_symlink():
                raise ArtifactError(f"{tar_name}: extraction produced a symbolic link {d!r}; refusing it")
        for f in filenames:
            rel = (Path(dirpath) / f).relative_to(root).as_posix()
            if rel not in expected:
                raise ArtifactError(f"{tar_name}: extraction produced unexpected file {rel!r}; refusing it")


SUMS_MEMBER = "SHA256SUMS"
MANIFEST_MEMBER = "manifest.json"
_MAX_SUMS_BYTES = 16 << 20  # the C runtime's limit too


def _open_tar(tar_path: Path) -> tarfile.TarFile:
    """Opens an artifact tar, saying in one line why a file is not one (empty, not a tar, unreadable)."""
    name = tar_path.name
    try:
        size = tar_path.stat().st_size
    except OSError as e:
        raise ArtifactError(f"{name}: cannot read it ({e.strerror or e})") from e
    if size == 0:
        raise ArtifactError(f"{name}: an empty file, not a tlmpack artifact (expected a .tar from tlmpack build)")
    try:
        return tarfile.open(tar_path, "r:*")
    except tarfile.TarError:
        raise ArtifactError(f"{name}: not a readable tar archive ({size} bytes that no tar reader recognises), "
                            f"so not a tlmpack artifact") from None
    except OSError as e:
        raise ArtifactError(f"{name}: cannot read it ({e.strerror or e})") from e


def _members(tar_name: str, tf: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """Every member, refusing an archive whose listing stops before its end (a damaged header)."""
    try:
        members = tf.getmembers()
    except (tarfile.TarError, EOFError, OSError) as e:
        raise ArtifactError(f"{tar_name}: the archive is damaged or truncated ({e})") from None
    # tarfile ends the listing at the first header it cannot parse as if it were the end; a real end
    # is zero blocks up to the end of the file.
    fileobj = tf.fileobj
    assert fileobj is not None
    try:
        fileobj.seek(tf.offset)
        pos = tf.offset
        while chunk := fileobj.read(_CHUNK):
            zeros = len(chunk) - len(chunk.lstrip(b"\0"))
            if zeros != len(chunk):
                after = f"after entry {members[-1].name!r}" if members else "at its first header"
                raise ArtifactError(f"{tar_name}: the archive is damaged (an unreadable tar header {after}, "
                                    f"at byte {pos + zeros}); it lists {len(members)} entries and cannot be trusted")
            pos += len(chunk)
    except (OSError, EOFError, tarfile.TarError) as e:
        raise ArtifactError(f"{tar_name}: the archive is damaged or truncated ({e})") from None
    return members


def _cache_key(tar_name: str, tf: tarfile.TarFile, members: list[tarfile.TarInfo]) -> str:
    """The sha256 of the tar's SHA256SUMS member: it names every other file's bytes."""
    by_name = {_normalized(m.name): m for m in members}
    sums = by_name.get(SUMS_MEMBER)
    if sums is None or not sums.isreg():
        what = "no manifest.json and no SHA256SUMS" if MANIFEST_MEMBER not in by_name else "no SHA256SUMS"
        raise ArtifactError(f"{tar_name}: has {what} ({len(members)} entries); this is not a tlmpack artifact")
    if sums.size > _MAX_SUMS_BYTES:
        raise ArtifactError(f"{tar_name}: SHA256SUMS is {sums.size} bytes, expected at most {_MAX_SUMS_BYTES}")
    f = tf.extractfile(sums)
    assert f is not None
    try:
        return hashlib.sha256(f.read()).hexdigest()
    except (OSError, EOFError, tarfile.TarError) as e:
        raise ArtifactError(f"{tar_name}: the archive is damaged or truncated ({e})") from None


def verify_tar(tar_path: str | os.PathLike[str]) -> None:
    """Hashes every regular member of the archive itself against its SHA256SUMS, extracting nothing.

    What `tlmpack check` runs on a .tar: a load may use a verified cached copy with the same
    SHA256SUMS, which says nothing about these bytes.
    """
    tar_path = Path(tar_path)
    name = tar_path.name
    with _open_tar(tar_path) as tf:
        members = _members(name, tf)
        check_members(name, members)
        regular = {_normalized(m.name): m for m in members if m.isreg()}
        if SUMS_MEMBER not in regular:
            raise ArtifactError(f"{name}: has no SHA256SUMS ({len(members)} entries); this is not a tlmpack artifact")
        sums: dict[str, str] = {}
        for line in _read(name, tf, regular[SUMS_MEMBER]).decode(errors="replace").splitlines():
            digest, _, rel = line.partition("  ")
            if rel:
                sums[rel] = digest
        for rel, member in sorted(regular.items()):
            if rel == SUMS_MEMBER:
                continue
            if rel not in sums:
                raise ArtifactError(f"{name}: {rel} is in the archive but not listed in SHA256SUMS")
            f = tf.extractfile(member)
            assert f is not None
            h = hashlib.sha256()
            try:
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
            except (OSError, EOFError, tarfile.TarError) as e:
                raise ArtifactError(f"{name}: the archive is damaged or truncated ({e})") from None
            if h.hexdigest() != sums[rel]:
                raise ArtifactError(f"{name}: {rel}: sha256 mismatch (expected {sums[rel][:12]}… from SHA256SUMS, "
                                    f"found {h.hexdigest()[:12]}…); the archive is corrupted or was modified")
        missing = sorted(set(sums) - set(regular))
        if missing:
            raise ArtifactError(f"{name}: {missing[0]} is listed in SHA256SUMS but not in the archive")


def _read(name: str, tf: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    if member.size > _MAX_SUMS_BYTES:
        raise ArtifactError(f"{name}: {member.name} is {member.size} bytes, expected at most {_MAX_SUMS_BYTES}")
    f = tf.extractfile(member)
    assert f is not None
    try:
        return f.read()
    except (OSError, EOFError, tarfile.TarError) as e:
        raise ArtifactError(f"{name}: the archive is damaged or truncated ({e})") from None


def read_members(tar_path: str | os.PathLike[str], names: tuple[str, ...],
                 limit: int = _MAX_SUMS_BYTES) -> dict[str, bytes]:
    """The bytes of a few small regular members (absent names are left out), from a checked archive.

    For reading manifest.json without extracting anything (`tlmpack inspect`): the listing is
    checked like an extraction's, so a damaged or hostile archive is refused the same way.
    """
    tar_path = Path(tar_path)
    with _open_tar(tar_path) as tf:
        members = _members(tar_path.name, tf)
        check_members(tar_path.name, members)
        out: dict[str, bytes] = {}
        for m in members:
            name = _normalized(m.name)
            if name in names and m.isreg():
                if m.size > limit:
                    raise ArtifactError(f"{tar_path.name}: {name} is {m.size} bytes, expected at most {limit}")
                f = tf.extractfile(m)
                assert f is not None
                try:
                    out[name] = f.read()
                except (OSError, EOFError, tarfile.TarError) as e:
                    raise ArtifactError(f"{tar_path.name}: the archive is damaged or truncated ({e})") from None
        return out


def extract_artifact(tar_path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None,
                     verify: Callable[[str, Path], None] | None = None) -> Path:
    """Extracts `tar_path` once into `<cache>/artifacts/<sha256 of its SHA256SUMS>` and returns that folder.

    verify(tar_name, folder) checks the extracted files against their SHA256SUMS before the folder
    is moved into place, so the cache holds only what SHA256SUMS vouches for: a tampered tar with a
    genuine SHA256SUMS cannot take the place of the genuine artifact. A later call with the same
    SHA256SUMS reuses the folder without reading the tar's data; the files a load uses are hashed
    again then, so a tampered cache is caught too.
    """
    tar_path = Path(tar_path)
    tar_name = tar_path.name
    tf = _open_tar(tar_path)
    with tf:
        members = _members(tar_name, tf)
        files = check_members(tar_name, members)
        digest = _cache_key(tar_name, tf, members)
        root = Path(cache_dir) if cache_dir is not None else cache_root() / "artifacts"
        dest = root / digest
        if dest.is_dir():
            return dest
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ArtifactError(f"{tar_name}: cannot create the cache folder {root} ({e.strerror or e}); "
                                f"set TLMPACK_CACHE to a writable folder") from e
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{digest[:16]}-", dir=root))
        try:
            try:
                tf.extractall(tmp, members=members, **_FILTER)  # type: ignore[arg-type]
            except (tarfile.TarError, OSError, EOFError) as e:
                raise ArtifactError(f"{tar_name}: extraction failed ({e})") from e
            _check_extracted(tar_name, tmp, files)
            if verify is not None:
                verify(tar_name, tmp)
            for rel in files:  # the cache is not a place to edit an artifact in
                os.chmod(tmp / rel, 0o444)
            try:
                os.rename(tmp, dest)
            except OSError as e:
                # Another process finished first: its copy has the same bytes, use it.
                if e.errno in (errno.EEXIST, errno.ENOTEMPTY) and dest.is_dir():
                    shutil.rmtree(tmp, ignore_errors=True)
                    return dest
                raise ArtifactError(f"{tar_name}: cannot move the extracted artifact into {dest} "
                                    f"({e.strerror or e})") from e
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    _sweep_stale(root)
    return dest


def _sweep_stale(root: Path) -> None:
    """Removes temporary folders that interrupted extractions (a kill, a power cut) left behind."""
    now = time.time()
    for p in root.glob(".tmp-*"):
        try:
            if now - p.stat().st_mtime > _STALE_TMP_S:
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            pass
