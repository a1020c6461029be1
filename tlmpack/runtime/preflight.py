"""Preflight: everything that can be checked about an artifact before any of its code is loaded.

SHA256SUMS is the root: it lists every file of the artifact with its sha256, manifest.json included,
so the manifest is checked against it before it is believed; the manifest's own `files` must agree
with it, and a file that neither lists is refused. Every file's sha256 is compared (`check`), and a
target that this machine can run is chosen. `load` hashes only what it uses, once, when it uses it
(see stage.py); the manifest it reads is the bytes that were hashed. Nothing from the artifact is
loaded, so `check()` is safe to run on an artifact nobody trusts yet (`tlmpack check`). A CUDA
target is checked against the NVIDIA driver itself (libcuda.so.1 through ctypes: the driver
version, the GPUs and their SM versions), the first time one is considered.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tlmpack.runtime import _cuda
from tlmpack.runtime.errors import ArtifactError, IncompatibleTargetError, TlmpackError
from tlmpack.runtime.extract import (
    extract_artifact,
    read_members,
    sha256_file,
    unsafe_path_reason,
    verify_tar,
)

FORMAT = "tlmpack"
BATCH_DIM = "batch"  # axis 0 of every input and output of a dynamic-batch artifact (format_version 3)
SUPPORTED_FORMAT_VERSIONS: tuple[int, ...] = (2, 3)  # 2: SHA256SUMS covers manifest.json; 3: a symbolic batch dim
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 16 << 20  # a large model's manifest is a few hundred KiB
SHA256SUMS = "SHA256SUMS"

# dtype names the runtime can feed from and return to numpy (DLPack code, bits).
DTYPES: dict[str, tuple[int, int]] = {
    "bool": (6, 8),
    "int8": (0, 8), "int16": (0, 16), "int32": (0, 32), "int64": (0, 64),
    "uint8": (1, 8), "uint16": (1, 16), "uint32": (1, 32), "uint64": (1, 64),
    "float16": (2, 16), "float32": (2, 32), "float64": (2, 64),
}

# Which target kinds serve which device request, in order of preference.
_DEVICE_KINDS: dict[str, tuple[str, ...]] = {"cpu": ("x86",), "cuda": ("cuda",), "auto": ("cuda", "x86")}
_SUPPORTED_KINDS: frozenset[str] = frozenset({"x86", "cuda"})
_SM = re.compile(r"^sm_(\d+)(a?)$")


@dataclass(frozen=True)
class Device:
    """A parsed device request: kind is "cpu", "cuda" or "auto"; index only for CUDA."""

    kind: str
    index: int = 0

    @staticmethod
    def parse(device: str) -> Device:
        """Parses "auto", "cpu", "cuda" or "cuda:N"; anything else is a caller mistake (ValueError)."""
        if not isinstance(device, str):
            raise ValueError(f"device must be a string like 'cpu', 'auto' or 'cuda:0'; got {device!r}")
        d = device.strip().lower()
        if d in ("cpu", "auto", "cuda"):
            return Device(d)
        if d.startswith("cuda:") and d[5:].isdigit():
            return Device("cuda", int(d[5:]))
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N'; got {device!r}")

    def __str__(self) -> str:
        return f"cuda:{self.index}" if self.kind == "cuda" else self.kind


@dataclass(frozen=True)
class Host:
    """What preflight needs to know about this machine; a parameter so tests can describe other machines.

    cuda: the driver and GPUs; None means "ask the driver" (once per process, only when an artifact
    has a CUDA target).
    """

    machine: str
    os: str
    cpu_features: frozenset[str]
    cuda: _cuda.CudaHost | None = None

    @staticmethod
    def this(cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo") -> Host:
        """This machine: architecture, OS, and the CPU flags every core has."""
        return Host(platform.machine().lower(), sys.platform, read_cpu_features(cpuinfo))

    def cuda_info(self) -> _cuda.CudaHost:
        return self.cuda if self.cuda is not None else _cuda.probe()


def read_cpu_features(cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo") -> frozenset[str]:
    """The /proc/cpuinfo flags that every listed processor has (empty when the file is unreadable).

    The intersection, not the first core's flags, because a thread may be scheduled on any core.
    """
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return frozenset()
    common: set[str] | None = None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            flags = set(value.split())
            common = flags if common is None else common & flags
    return frozenset(common or ())


def read_manifest(artifact_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Reads and validates manifest.json: the format, its version, and the fields the runtime relies on."""
    return _read_manifest(artifact_dir)[0]


def _read_manifest(artifact_dir: str | os.PathLike[str]) -> tuple[dict[str, Any], str]:
    """read_manifest, plus the sha256 of the very bytes that were parsed."""
    path = Path(artifact_dir) / MANIFEST
    try:
        size = path.stat().st_size
        if size > MAX_MANIFEST_BYTES:
            raise ArtifactError(f"{path}: {size} bytes, expected at most {MAX_MANIFEST_BYTES}; not a tlmpack manifest")
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ArtifactError(f"{artifact_dir}: no {MANIFEST}; this is not a tlmpack artifact") from None
    except OSError as e:
        raise ArtifactError(f"{path}: cannot read it ({e.strerror or e})") from e
    return parse_manifest(path, raw), hashlib.sha256(raw).hexdigest()


def parse_manifest(path: Path, raw: bytes) -> dict[str, Any]:
    """Parses and validates manifest.json's bytes; `path` names it in messages."""
    try:
        manifest = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path}: not valid JSON ({e})") from e
    except RecursionError:
        raise ArtifactError(f"{path}: not valid JSON (nested too deeply)") from None
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{path}: expected a JSON object, found {type(manifest).__name__}")
    fmt = manifest.get("format")
    if fmt != FORMAT:
        raise ArtifactError(f"{path}: format is {fmt!r}, expected {FORMAT!r}; this is not a tlmpack artifact")
    version = manifest.get("format_version")
    if version not in SUPPORTED_FORMAT_VERSIONS or isinstance(version, bool):
        supported = ", ".join(str(v) for v in SUPPORTED_FORMAT_VERSIONS)
        newer = isinstance(version, int) and version > max(SUPPORTED_FORMAT_VERSIONS)
        older = isinstance(version, int) and 0 < version < min(SUPPORTED_FORMAT_VERSIONS)
        hint = (" (an artifact from a newer tlmpack; upgrade tlmpack to load it)" if newer else
                " (an artifact from an older tlmpack, whose SHA256SUMS does not vouch for manifest.json; rebuild it)"
                if older else "")
        raise ArtifactError(f"{path}: format_version {version!r} is not supported; this runtime reads "
                            f"format_version {supported}{hint}")
    _validate_manifest(path, manifest)
    return manifest


def _validate_manifest(path: Path, m: dict[str, Any]) -> None:
    """Checks the fields the runtime uses, so later code can index them without guarding every access."""
    def bad(what: str) -> ArtifactError:
        return ArtifactError(f"{path}: {what}")

    for section in ("inputs", "outputs"):
        specs = m.get(section)
        if not isinstance(specs, list) or (section == "outputs" and not specs):
            raise bad(f"{section!r} must be a non-empty list" if section == "outputs" else f"{section!r} must be a list")
        names: set[str] = set()
        for i, s in enumerate(specs):
            if not isinstance(s, dict) or not isinstance(s.get("name"), str) or not s["name"]:
                raise bad(f"{section}[{i}] needs a non-empty string 'name'")
            if s["name"] in names:
                raise bad(f"{section} name {s['name']!r} appears twice")
            names.add(s["name"])
            if not isinstance(s.get("dtype"), str) or s["dtype"] not in DTYPES:
                raise bad(f"{section[:-1]} {s['name']!r} has dtype {s.get('dtype')!r}; this runtime handles "
                          f"{', '.join(DTYPES)}")
            shape = s.get("shape")
            dynamic = m.get("batch_plans") and isinstance(shape, list) and shape and shape[0] == BATCH_DIM
            if (not isinstance(shape, list) or
                    not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape[1 if dynamic else 0:])):
                raise bad(f"{section[:-1]} {s['name']!r} has shape {shape!r}; expected a list of non-negative integers"
                          + (f" (axis 0 may be {BATCH_DIM!r} in a dynamic-batch artifact)" if m.get("batch_plans") else ""))
    plans = m.get("batch_plans")
    if plans is not None:
        sizes = [p.get("batch") if isinstance(p, dict) else None for p in plans] if isinstance(plans, list) else None
        if not sizes or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in sizes) or \
                sizes != sorted(set(sizes)):
            raise bad(f"'batch_plans' must list positive batch sizes in ascending order; found {plans!r}")

    for section in ("model", "memory", "build_options"):
        if section in m and not isinstance(m[section], dict):
            raise bad(f"{section!r} must be an object; found {type(m[section]).__name__}")

    files = m.get("files")
    if not isinstance(files, dict) or not files:
        raise bad("'files' must be a non-empty object mapping paths to sha256 hashes")
    for rel, digest in files.items():
        reason = unsafe_path_reason(rel)
        if reason:
            raise bad(f"files entry {rel!r} {reason}")
        if rel in (MANIFEST, SHA256SUMS):
            raise bad(f"files must not list {rel!r} (it cannot hash itself)")
        if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
            raise bad(f"files entry {rel!r} has {digest!r}, expected a lowercase hex sha256")

    targets = m.get("targets")
    if not isinstance(targets, list) or not targets:
        raise bad("'targets' must be a non-empty list")
    for i, t in enumerate(targets):
        if not isinstance(t, dict) or not isinstance(t.get("id"), str) or not isinstance(t.get("kind"), str):
            raise bad(f"targets[{i}] needs string 'id' and 'kind'")
        tfiles = t.get("files", [])
        if not isinstance(tfiles, list) or not all(isinstance(f, str) for f in tfiles):
            raise bad(f"target {t['id']!r}: 'files' must be a list of paths")
        for f in tfiles:
            if f not in files:
                raise bad(f"target {t['id']!r} needs {f!r}, which 'files' does not list (so it is not hashed)")
        feats = t.get("cpu_features", [])
        if not isinstance(feats, list) or not all(isinstance(f, str) for f in feats):
            raise bad(f"target {t['id']!r}: 'cpu_features' must be a list of strings")
        if t["kind"] == "cuda":
            _validate_cuda_target(t, bad)


def _validate_cuda_target(t: dict[str, Any], bad: Any) -> None:
    """archs: ["sm_90", ...]; ptx: bool; ptx_arch: "sm_NN" when ptx; min_driver_version: int (cuDriverGetVersion form)."""
    archs = t.get("archs")
    if not isinstance(archs, list) or not all(isinstance(a, str) and _SM.match(a) for a in archs):
        raise bad(f"target {t['id']!r}: 'archs' must be a list of SM names like 'sm_90'; found {archs!r}")
    ptx = t.get("ptx", False)
    if not isinstance(ptx, bool):
        raise bad(f"target {t['id']!r}: 'ptx' must be true or false; found {ptx!r}")
    if ptx and not (isinstance(t.get("ptx_arch"), str) and _SM.match(t["ptx_arch"])):
        raise bad(f"target {t['id']!r}: 'ptx_arch' must name the lowest SM the PTX runs on, like 'sm_90'; "
                  f"found {t.get('ptx_arch')!r}")
    if not archs and not ptx:
        raise bad(f"target {t['id']!r}: has neither cubins ('archs') nor PTX")
    drv = t.get("min_driver_version", 0)
    if not isinstance(drv, int) or isinstance(drv, bool) or drv < 0:
        raise bad(f"target {t['id']!r}: 'min_driver_version' must be a non-negative integer like 13000; found {drv!r}")


def read_sha256sums(artifact_dir: str | os.PathLike[str]) -> dict[str, str]:
    """Parses SHA256SUMS ("<sha256>  <path>" lines, as sha256sum writes them)."""
    path = Path(artifact_dir) / SHA256SUMS
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ArtifactError(f"{artifact_dir}: no {SHA256SUMS}; the artifact is incomplete") from None
    except OSError as e:
        raise ArtifactError(f"{path}: cannot read it ({e.strerror or e})") from e
    return parse_sha256sums(path, raw)


def parse_sha256sums(path: Path, raw: bytes) -> dict[str, str]:
    """Parses SHA256SUMS's bytes into {path: sha256}; refuses what sha256sum would not have written."""
    try:
        text = raw.decode()
    except UnicodeDecodeError as e:
        raise ArtifactError(f"{path}: not UTF-8 text ({e})") from None
    sums: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        digest, sep, rel = line.partition(" ")
        rel = rel.lstrip(" *")  # " " text mode, "*" binary mode
        if not sep or len(digest) != 64 or not rel or not all(c in "0123456789abcdefABCDEF" for c in digest):
            raise ArtifactError(f"{path}: line {n} is not '<sha256>  <path>': {line!r}")
        if rel in sums:
            raise ArtifactError(f"{path}: line {n} lists {rel!r} a second time")
        sums[rel] = digest.lower()
    return sums


def verify_files(artifact_dir: str | os.PathLike[str], manifest: Mapping[str, Any]) -> list[ArtifactError]:
    """Compares every file with SHA256SUMS and the manifest: hashes, unlisted files, manifest.json itself.

    Returns one error per problem (empty when all is well) so `check` can show them all;
    `load` raises the first.
    """
    raw = (Path(artifact_dir) / MANIFEST).read_bytes()
    return _verify_files(artifact_dir, manifest, hashlib.sha256(raw).hexdigest(), hash_files=True)[1]


def _verify_files(artifact_dir: str | os.PathLike[str], manifest: Mapping[str, Any], manifest_sha256: str,
                  hash_files: bool) -> tuple[int, list[ArtifactError]]:
    """verify_files, plus how many files matched their hash; without hash_files, every check but the hashes."""
    root = Path(artifact_dir)
    matched = 0
    files: dict[str, str] = manifest["files"]
    problems: list[ArtifactError] = []
    try:
        sums = read_sha256sums(root)
    except ArtifactError as e:
        problems.append(e)
    else:
        listed = sums.pop(MANIFEST, None)
        if listed is None:
            problems.append(ArtifactError(
                f"{SHA256SUMS} does not list {MANIFEST}, so nothing vouches for the manifest; rebuild the "
                f"artifact with this tlmpack"))
        elif listed != manifest_sha256:
            problems.append(ArtifactError(
                f"{MANIFEST}: sha256 mismatch (expected {listed[:12]}… from {SHA256SUMS}, found "
                f"{manifest_sha256[:12]}…); the artifact is corrupted or was modified"))
        if sums != files:
            only_sums = sorted(set(sums) - set(files))
            only_manifest = sorted(set(files) - set(sums))
            differ = sorted(k for k in set(files) & set(sums) if files[k] != sums[k])
            what = (f"{only_manifest[0]!r} is in manifest.json only" if only_manifest else
                    f"{only_sums[0]!r} is in SHA256SUMS only" if only_sums else
                    f"they give different hashes for {differ[0]!r}")
            problems.append(ArtifactError(f"{SHA256SUMS} and manifest.json disagree: {what}"))
    problems.extend(_unlisted_files(root, set(files) | {MANIFEST, SHA256SUMS}))
    for rel in sorted(files):
        path = root / rel
        if path.is_symlink() or not path.is_file():
            problems.append(ArtifactError(
                f"{rel}: listed in manifest.json but {'a link' if path.is_symlink() else 'missing'} "
                f"in the artifact {root}"))
            continue
        if not hash_files:
            continue
        try:
            found = sha256_file(path)
        except OSError as e:
            problems.append(ArtifactError(f"{rel}: cannot read it ({e.strerror or e})"))
            continue
        if found != files[rel]:
            problems.append(ArtifactError(
                f"{rel}: sha256 mismatch (expected {files[rel][:12]}…, found {found[:12]}…); "
                f"the artifact is corrupted or was modified"))
        else:
            matched += 1
    return matched, problems


def _unlisted_files(root: Path, listed: set[str]) -> list[ArtifactError]:
    """A problem for every file or link in the artifact folder that SHA256SUMS does not vouch for."""
    problems = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        for name in sorted(filenames) + sorted(d for d in dirnames if (here / d).is_symlink()):
            rel = (here / name).relative_to(root).as_posix()
            if rel not in listed:
                problems.append(ArtifactError(
                    f"{rel}: in the artifact {root} but not listed in {SHA256SUMS}; refusing an artifact "
                    f"with unlisted files"))
    return problems


def target_problems(target: Mapping[str, Any], host: Host, device_index: int = 0) -> list[str]:
    """Why `host` cannot run `target` (empty when it can). One function per kind goes here."""
    kind = target["kind"]
    tid = target["id"]
    if kind not in _SUPPORTED_KINDS:
        return [f"target {tid} is a {kind} target, which this runtime does not support yet"]
    if kind == "x86":
        if host.machine not in ("x86_64", "amd64") or not host.os.startswith("linux"):
            return [f"target {tid} needs x86-64 Linux; this machine is {host.machine} {host.os}"]
        wanted = [f.lower() for f in target.get("cpu_features", [])]
        if wanted and not host.cpu_features:
            return [f"target {tid} needs CPU features {', '.join(wanted)}, and this machine's "
                    f"/proc/cpuinfo cannot be read to confirm them"]
        missing = [f for f in wanted if f not in host.cpu_features]
        if missing:
            return [f"target {tid} needs CPU features {', '.join(missing)}, which this CPU lacks"]
    if kind == "cuda":
        return cuda_target_problems(target, host.cuda_info(), device_index)
    return []


def cuda_target_problems(target: Mapping[str, Any], info: _cuda.CudaHost, index: int = 0) -> list[str]:
    """Why GPU `index` cannot run a CUDA target: no driver, no GPU, an old driver, an SM with no code.

    The same rules as the C runtime: a cubin for the GPU's exact SM, else one of the same major and a
    lower minor, else PTX for an SM at or below the GPU's.
    """
    tid = target["id"]
    if info.error:
        return [f"target {tid}: {info.error}"]
    n = len(info.gpus)
    if n == 0:
        return [f"target {tid}: no CUDA GPU found (cuDeviceGetCount returned 0); use device=cpu"]
    if index >= n:
        return [f"target {tid}: device cuda:{index} requested, but this machine has {n} CUDA GPU"
                f"{'' if n == 1 else 's'} (cuda:0..cuda:{n - 1})"]
    need = int(target.get("min_driver_version", 0))
    if info.driver_version < need:
        return [f"target {tid}: the NVIDIA driver here supports CUDA {info.driver} (cuDriverGetVersion "
                f"{info.driver_version}), but the artifact's CUDA code needs CUDA {_cuda.version_str(need)} ({need}) "
                f"or newer; update the driver or use device=cpu"]
    gpu = info.gpus[index]
    cubins = [_SM.match(a) for a in target.get("archs", [])]
    for m in cubins:
        arch = int(m.group(1))
        if arch == gpu.arch or (not m.group(2) and arch // 10 == gpu.arch // 10 and arch < gpu.arch):
            return []
    ptx = _SM.match(target.get("ptx_arch") or "") if target.get("ptx") else None
    if ptx and int(ptx.group(1)) <= gpu.arch:
        return []
    has = (f"cubins for {', '.join(target['archs'])}" if cubins else "no cubins") + \
        (f" and PTX for {target['ptx_arch']}+" if ptx else " and no PTX")
    return [f"target {tid}: GPU {index} ({gpu.name}) is sm_{gpu.arch}; the artifact has {has}; "
            f"rebuild it for sm_{gpu.arch} or use device=cpu"]


def select_target(manifest: Mapping[str, Any], device: str | Device, host: Host | None = None) -> dict[str, Any]:
    """Picks the first target in the manifest that serves `device` and that this machine can run.

    "auto" tries CUDA targets first (on cuda:0), then the CPU. Raises IncompatibleTargetError with
    every reason when none can.
    """
    return _select_target(manifest, device, host)[0]


def _select_target(manifest: Mapping[str, Any], device: str | Device,
                   host: Host | None = None) -> tuple[dict[str, Any], list[str]]:
    """select_target, plus why the targets tried before the chosen one were passed over."""
    dev = device if isinstance(device, Device) else Device.parse(device)
    host = host or Host.this()
    targets: list[dict[str, Any]] = manifest["targets"]
    kinds = _DEVICE_KINDS[dev.kind]
    built_for = ", ".join(sorted({t["kind"] for t in targets}))
    if dev.kind == "cuda" and not any(t["kind"] == "cuda" for t in targets):
        raise IncompatibleTargetError(
            f"device '{dev}': the artifact has no cuda target (it was built for: {built_for}); "
            f"rebuild it with a CUDA target, or load it with device='cpu'")
    reasons: list[str] = []
    for kind in kinds:
        for t in targets:
            if t["kind"] != kind:
                continue
            if kind not in _SUPPORTED_KINDS and dev.kind == "auto":
                continue  # "auto" quietly falls back to what this runtime can run
            why = target_problems(t, host, dev.index)
            if not why:
                return dict(t), reasons
            reasons.extend(why)
    if not reasons:
        raise IncompatibleTargetError(
            f"device '{dev}': the artifact has no {'/'.join(kinds)} target "
            f"(it was built for: {built_for})")
    raise IncompatibleTargetError("; ".join(reasons))


@dataclass(frozen=True)
class CheckReport:
    """What preflight found: the artifact folder, its manifest, the chosen target, and every problem."""

    path: Path
    device: str
    artifact_dir: Path | None = None
    manifest: dict[str, Any] | None = None
    target: dict[str, Any] | None = None
    files_checked: int = 0
    problems: tuple[TlmpackError, ...] = field(default=())
    notes: tuple[str, ...] = ()             # e.g. why "auto" passed over the CUDA target
    cuda: _cuda.CudaHost | None = None      # the driver and GPUs, when the artifact has a CUDA target

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_first(self) -> None:
        """Raises the first problem (artifact problems come before target problems), noting how many more."""
        if not self.problems:
            return
        first = self.problems[0]
        rest = len(self.problems) - 1
        if rest == 0:
            raise first
        raise type(first)(f"{first} (and {rest} more problem{'s' if rest > 1 else ''}: "
                          f"run `tlmpack check` to see all)") from first

    def lines(self) -> list[str]:
        """Human-readable summary, one fact per line, for the CLI."""
        out = [f"artifact: {self.path}"]
        if self.artifact_dir is not None and self.artifact_dir != self.path:
            out.append(f"extracted to: {self.artifact_dir}")
        if self.manifest is not None:
            model = self.manifest.get("model", {})
            out.append(f"model: {model.get('name', '?')} (format_version {self.manifest.get('format_version')}, "
                       f"tlmpack {self.manifest.get('tlmpack_version', '?')})")
            out.append(f"files verified: {self.files_checked}/{len(self.manifest['files'])}")
        if self.cuda is not None and not self.cuda.error:  # an error shows as a note or a problem
            gpus = ", ".join(f"cuda:{g.index} {g.name} (sm_{g.arch})" for g in self.cuda.gpus) or "none"
            out.append(f"cuda: driver {self.cuda.driver} ({self.cuda.driver_version}); GPUs: {gpus}")
        if self.target is not None:
            out.append(f"target for device {self.device}: {self.target['id']} ({self.target['kind']})")
        out.extend(f"note: {n}" for n in self.notes)
        out.extend(f"problem: {p}" for p in self.problems)
        out.append("ok" if self.ok else f"{len(self.problems)} problem(s)")
        return out


def manifest_of(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of an artifact folder or .tar, checked against SHA256SUMS; nothing is extracted."""
    p = Path(path).expanduser()
    if p.is_dir():
        manifest, digest = _read_manifest(p)
        sums = read_sha256sums(p)
    elif p.is_file():
        found = read_members(p, (MANIFEST, SHA256SUMS))
        if MANIFEST not in found:
            raise ArtifactError(f"{p.name}: no {MANIFEST}; this is not a tlmpack artifact")
        if SHA256SUMS not in found:
            raise ArtifactError(f"{p.name}: no {SHA256SUMS}; the artifact is incomplete")
        manifest = parse_manifest(p / MANIFEST, found[MANIFEST])
        digest = hashlib.sha256(found[MANIFEST]).hexdigest()
        sums = parse_sha256sums(p / SHA256SUMS, found[SHA256SUMS])
    else:
        raise ArtifactError(f"{p}: not a regular file or folder" if p.exists() else f"{p}: no such file or directory")
    if sums.get(MANIFEST) != digest:
        what = "does not list it" if MANIFEST not in sums else f"lists {sums[MANIFEST][:12]}…, found {digest[:12]}…"
        raise ArtifactError(f"{p.name}: {MANIFEST} is not the one {SHA256SUMS} vouches for ({what}); "
                            f"the artifact is corrupted or was modified")
    return manifest


def resolve_artifact(path: str | os.PathLike[str]) -> Path:
    """A directory is used in place; a file is treated as a tar and extracted into the cache."""
    p = Path(path).expanduser()
    if p.is_dir():
        return p
    if p.is_file():
        return extract_artifact(p, verify=_verify_extracted)
    raise ArtifactError(f"{p}: not a regular file or folder" if p.exists() else f"{p}: no such file or directory")


def _verify_extracted(tar_name: str, folder: Path) -> None:
    """Every file SHA256SUMS lists has its hash (manifest.json included), before the folder enters the cache."""
    try:
        sums = read_sha256sums(folder)
    except ArtifactError as e:
        raise ArtifactError(f"{tar_name}: {str(e).replace(str(folder) + '/', '')}") from None
    for rel, digest in sorted(sums.items()):
        path = folder / rel
        found = sha256_file(path) if path.is_file() and not path.is_symlink() else None
        if found != digest:
            what = f"found {found[:12]}…" if found else "the archive has no such file"
            raise ArtifactError(f"{tar_name}: {rel}: sha256 mismatch (expected {digest[:12]}… from SHA256SUMS, "
                                f"{what}); the archive is corrupted or was modified")


def check(path: str | os.PathLike[str], device: str = "auto", host: Host | None = None, *,
          hash_files: bool = True) -> CheckReport:
    """Runs every preflight check without loading any code; returns a report instead of raising.

    hash_files=False skips the sha256 of the files (load hashes what it uses as it uses it).
    Only a malformed `device` raises (ValueError): that is a caller mistake, not an artifact problem.
    """
    dev = Device.parse(device)
    p = Path(path)
    try:
        if hash_files and p.is_file():
            verify_tar(p)  # the cache may hold a genuine copy under the same SHA256SUMS: check these bytes
        artifact_dir = resolve_artifact(p)
    except TlmpackError as e:
        return CheckReport(p, str(dev), problems=(e,))
    try:
        manifest, manifest_sha256 = _read_manifest(artifact_dir)
    except TlmpackError as e:
        return CheckReport(p, str(dev), artifact_dir, problems=(e,))
    matched, file_problems = _verify_files(artifact_dir, manifest, manifest_sha256, hash_files)
    problems: list[TlmpackError] = list(file_problems)
    target = None
    notes: list[str] = []
    host = host or Host.this()
    try:
        target, passed_over = _select_target(manifest, dev, host)
        notes = [f"not using {r}" for r in passed_over]
    except IncompatibleTargetError as e:
        problems.append(e)
    has_cuda = any(t["kind"] == "cuda" for t in manifest["targets"])
    cuda = host.cuda_info() if has_cuda and dev.kind != "cpu" else None
    return CheckReport(p, str(dev), artifact_dir, manifest, target, files_checked=matched,
                       problems=tuple(problems), notes=tuple(notes), cuda=cuda)


def specs_of(manifest: Mapping[str, Any], section: str) -> Iterable[tuple[str, str, tuple[int, ...]]]:
    """(name, dtype, shape) of each input or output in the manifest."""
    for s in manifest[section]:
        yield s["name"], s["dtype"], tuple(s["shape"])
