"""Fabricates tlmpack artifacts for the runtime tests, until the compiler can build real ones.

The artifact follows the agreed layout (manifest.json, SHA256SUMS, weights.bin, x86/model.so,
runtime_c/, include/tlmrt.h); its model.so is fake_plan.c compiled with gcc, so no TVM is needed.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
RUNTIME_C = REPO / "runtime_c"
FAKE_PLAN = HERE / "fake_plan.c"

WEIGHTS = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32)


def runtime_sources_present() -> bool:
    """Whether runtime_c/ has the C runtime's sources and build script (it is being written in parallel)."""
    return (RUNTIME_C / "build.sh").is_file() and any(RUNTIME_C.glob("*.c"))


def build_runtime(out_dir: Path) -> Path:
    """Builds libtlmrt.so from the repo's runtime_c/ with its own build script; returns its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["bash", str(RUNTIME_C / "build.sh"), str(out_dir)], cwd=REPO, check=True,
                   capture_output=True, text=True)
    return out_dir / "libtlmrt.so"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_artifact(dest: Path, *, runtime_lib: Path | None = None, cpu_features: list[str] | None = None,
                  step_work_mflop: int | None = None, view_output: bool = False,
                  input_views: bool = False, view_base: int | None = None) -> Path:
    """Writes a complete artifact folder at `dest` and returns it.

    runtime_lib: a prebuilt libtlmrt.so to ship as runtime_c/libtlmrt.so (None: ship none).
    step_work_mflop: the plan says its first step (add_w) does this much work (tlmrt_plan.h's step work).
    view_output: output y is a view of the tensor add_w writes, read by scale (fake_plan.c's FAKE_VIEW_OUTPUT).
    input_views: the plan names its tensors' bases and add_w reads x through a view (FAKE_INPUT_VIEWS);
    view_base: that view's base in the table instead of x (a damaged table, FAKE_VIEW_BASE).
    The runtime's sources are copied whenever they exist, as the packager does.
    """
    dest.mkdir(parents=True)
    weights = dest / "weights.bin"
    weights.write_bytes(WEIGHTS.tobytes().ljust(64, b"\0"))
    (dest / "x86").mkdir()
    subprocess.run(["gcc", "-std=c11", "-O2", "-shared", "-fPIC", "-Wl,-Bsymbolic", "-fvisibility=hidden", f"-I{RUNTIME_C}",
                    f'-DFAKE_WEIGHTS_SHA256="{sha256(weights)}"',
                    *([f"-DFAKE_STEP_WORK={step_work_mflop}"] if step_work_mflop is not None else []),
                    *(["-DFAKE_VIEW_OUTPUT"] if view_output else []),
                    *(["-DFAKE_INPUT_VIEWS"] if input_views else []),
                    *([f"-DFAKE_VIEW_BASE={view_base}"] if view_base is not None else []), str(FAKE_PLAN), "-o", str(dest / "x86" / "model.so")],
                   check=True, capture_output=True, text=True)
    (dest / "runtime_c").mkdir()
    for p in sorted(RUNTIME_C.iterdir()):
        if p.is_file() and p.suffix in (".c", ".h", ".sh"):
            shutil.copy2(p, dest / "runtime_c" / p.name)
    if runtime_lib is not None:
        shutil.copy2(runtime_lib, dest / "runtime_c" / "libtlmrt.so")
    (dest / "include").mkdir()
    shutil.copy2(RUNTIME_C / "tlmrt.h", dest / "include" / "tlmrt.h")

    files = {p.relative_to(dest).as_posix(): sha256(p) for p in sorted(dest.rglob("*")) if p.is_file()}
    manifest = {
        "format": "tlmpack",
        "format_version": 2,
        "tlmpack_version": "0.1.0",
        "tvm_version": "none (fabricated by tests)",
        "model": {"name": "fake_add_scale", "source": "fake_plan.c", "source_sha256": sha256(FAKE_PLAN)},
        "build_options": {},
        "inputs": [{"name": "x", "dtype": "float32", "shape": [2, 3]}, {"name": "k", "dtype": "int32", "shape": [1]}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": [2, 3]}, {"name": "z", "dtype": "float32", "shape": [2, 3]}],
        "targets": [{"id": "x86", "kind": "x86", "cpu": "x86-64",
                     "cpu_features": cpu_features if cpu_features is not None else ["sse2"],
                     "files": ["x86/model.so"]}],
        "memory": {"arena_bytes": 256, "weights_bytes": 64},
        "subgraphs": [],
        "files": files,
    }
    write_manifest(dest, manifest)
    return dest


def read_manifest(artifact: Path) -> dict:
    return json.loads((artifact / "manifest.json").read_text())


def write_manifest(artifact: Path, manifest: dict) -> None:
    """Writes manifest.json and a SHA256SUMS of its files and of manifest.json itself, as the packager does."""
    (artifact / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    sums = dict(manifest["files"], **{"manifest.json": sha256(artifact / "manifest.json")})
    (artifact / "SHA256SUMS").write_text("".join(f"{h}  {p}\n" for p, h in sorted(sums.items())))


def rehash(artifact: Path, manifest: dict) -> None:
    """Re-records every file's sha256 in the manifest and SHA256SUMS, for tests that change a file on purpose."""
    manifest["files"] = {rel: sha256(artifact / rel) for rel in manifest["files"]}
    write_manifest(artifact, manifest)


def make_tar(artifact: Path, tar_path: Path, extra: list[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]] = ()) -> Path:
    """Packs `artifact` reproducibly (sorted, fixed mtime and owner), then appends `extra` raw members."""
    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tf:
        for p in sorted(artifact.rglob("*")):
            info = tf.gettarinfo(str(p), p.relative_to(artifact).as_posix())
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if p.is_file():
                with open(p, "rb") as f:
                    tf.addfile(info, f)
            else:
                tf.addfile(info)
        for item in extra:
            info, data = item if isinstance(item, tuple) else (item, None)
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return tar_path


def tar_member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", linkname: str = "") -> tuple[tarfile.TarInfo, bytes]:
    """A raw tar member, for building hostile archives."""
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, data
