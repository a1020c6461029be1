#!/usr/bin/env python
"""Load time and memory of two models of one big artifact, for one or more tlmpack checkouts.

    python bench/load_memory.py --weights-mb 300 --checkout before=../tlmpack-before --checkout after=.

(``before``: a checkout of the commit to compare with, e.g. ``git worktree add ../tlmpack-before REV``.)

The artifact is the fabricated model of tests/fixtures_runtime (a hand-written plan: loading costs
what the runtime does, not what TVM's kernels do) with WEIGHTS_MB of weights, written in the
layout each checkout's runtime reads (its manifest format_version, and whether SHA256SUMS lists
manifest.json). Each checkout is measured in fresh processes, one per phase:

  cold:  the first load of the .tar (extraction into an empty cache, then open), then a second
         load of the same .tar in the same process;
  warm:  a new process, the cache already filled: two loads again.

Each load's wall time, and the process's VmRSS, RssAnon (private memory) and Pss (file pages
shared among their mappings) after it and its VmHWM (peak), are printed as a table and appended to
BENCHMARKS.md (--no-append to skip). Load never runs kernels, so no reference is needed; each
model runs once at the end and its output is compared with numpy's.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FAKE_PLAN = REPO / "tests" / "fixtures_runtime" / "fake_plan.c"

MEASURE = r"""
import json, os, sys, time
import numpy as np
import tlmpack.runtime as rt

def mem():
    out = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM", "RssAnon"):
            out[k] = int(v.split()[0]) / 1024
    # VmRSS counts a file page once per mapping of it; Pss shares it among the mappings (what the
    # memory costs), RssAnon is the process's private memory (a copy of the weights lands there)
    out["Pss"] = float("nan")
    if os.path.exists("/proc/self/smaps_rollup"):
        for line in open("/proc/self/smaps_rollup"):
            if line.startswith("Pss:"):
                out["Pss"] = int(line.split()[1]) / 1024
    return out

tar = sys.argv[1]
rows, models = [], []
for i in range(2):
    t = time.perf_counter()
    models.append(rt.load(tar, device="cpu", num_threads=1))
    rows.append({"load": i + 1, "s": time.perf_counter() - t, **mem()})
x = np.arange(6, dtype=np.float32).reshape(2, 3)
w = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32)
for m in models:
    y, z = m.run(None, {"x": x, "k": np.array([3], dtype=np.int32)})
    assert np.array_equal(y, x + w) and np.array_equal(z, (x + w) * 3)
print("RESULT " + json.dumps(rows))
"""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def make_tar(checkout: Path, out_dir: Path, weights_mb: int) -> Path:
    """The fabricated artifact in the layout `checkout`'s runtime reads, packed as a tar."""
    sys.path.insert(0, str(checkout))
    try:
        from tlmpack.emit import manifest as emit_manifest  # the checkout's own writer: its format
    finally:
        sys.path.pop(0)
    version = emit_manifest.FORMAT_VERSION
    for name in [n for n in sys.modules if n == "tlmpack" or n.startswith("tlmpack.")]:
        del sys.modules[name]  # the next checkout imports its own

    art = out_dir / "model"
    art.mkdir(parents=True)
    weights = art / "weights.bin"
    size = weights_mb << 20
    block = bytes(range(256)) * 4096  # 1 MiB, deterministic
    with open(weights, "wb") as f:
        for _ in range(size // len(block)):
            f.write(block)
    with open(weights, "r+b") as f:  # the plan reads w = weights[0:24] as float32 [[1, 2, 3], [4, 5, 6]]
        f.write(struct.pack("<6f", 1, 2, 3, 4, 5, 6))
    runtime_c = checkout / "runtime_c"
    (art / "x86").mkdir()
    subprocess.run(["gcc", "-std=c11", "-O2", "-shared", "-fPIC", "-Wl,-Bsymbolic", "-fvisibility=hidden",
                    f"-I{runtime_c}", f'-DFAKE_WEIGHTS_SHA256="{_sha256(weights)}"', f"-DFAKE_WEIGHTS_BYTES={size}",
                    str(FAKE_PLAN), "-o", str(art / "x86" / "model.so")], check=True)
    (art / "runtime_c").mkdir()
    for p in sorted(runtime_c.iterdir()):
        if p.suffix in (".c", ".h", ".sh"):
            shutil.copy2(p, art / "runtime_c" / p.name)
    subprocess.run(["bash", str(runtime_c / "build.sh"), str(art / "runtime_c")], check=True)  # the prebuilt one
    (art / "include").mkdir()
    shutil.copy2(runtime_c / "tlmrt.h", art / "include" / "tlmrt.h")
    files = {p.relative_to(art).as_posix(): _sha256(p) for p in sorted(art.rglob("*")) if p.is_file()}
    manifest = {
        "format": "tlmpack", "format_version": version, "tlmpack_version": "bench", "tvm_version": "none",
        "model": {"name": "fake_add_scale_big"}, "build_options": {},
        "inputs": [{"name": "x", "dtype": "float32", "shape": [2, 3]}, {"name": "k", "dtype": "int32", "shape": [1]}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": [2, 3]}, {"name": "z", "dtype": "float32", "shape": [2, 3]}],
        "targets": [{"id": "x86", "kind": "x86", "cpu": "x86-64", "cpu_features": ["sse2"], "files": ["x86/model.so"]}],
        "memory": {"arena_bytes": 256, "weights_bytes": size}, "subgraphs": [], "files": files,
    }
    (art / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    sums = dict(files)
    if version >= 2:  # format 2: SHA256SUMS vouches for manifest.json too
        sums["manifest.json"] = _sha256(art / "manifest.json")
    (art / "SHA256SUMS").write_text("".join(f"{h}  {p}\n" for p, h in sorted(sums.items())))
    tar = out_dir / "big.tar"
    with tarfile.open(tar, "w", format=tarfile.USTAR_FORMAT) as tf:
        for p in sorted(art.rglob("*")):
            tf.add(p, p.relative_to(art).as_posix(), recursive=False)
    shutil.rmtree(art)
    return tar


def measure(checkout: Path, tar: Path, cache: Path) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=str(checkout), TLMPACK_CACHE=str(cache))
    env.pop("TLMPACK_RUNTIME_LIB", None)
    lib = checkout / "tlmpack" / "runtime" / "libtlmrt.so"
    if (checkout / "setup.py").is_file() and not lib.is_file():  # a checkout whose runtime comes with the package
        out = cache.parent / "lib"
        subprocess.run(["bash", str(checkout / "runtime_c" / "build.sh"), str(out)], check=True)
        env["TLMPACK_RUNTIME_LIB"] = str(out / "libtlmrt.so")
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(tar)], env=env, capture_output=True, text=True,
                          timeout=600, cwd=tempfile.gettempdir())
    if proc.returncode != 0:
        raise SystemExit(f"{checkout}: {proc.stderr.strip()[-2000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights-mb", type=int, default=300)
    ap.add_argument("--checkout", action="append", default=[], metavar="LABEL=PATH",
                    help="a tlmpack checkout to measure (repeatable; default: this one)")
    ap.add_argument("--repeat", type=int, default=3, help="times each phase runs (median and min reported)")
    ap.add_argument("--note", default="")
    ap.add_argument("--benchmarks-md", type=Path, default=REPO / "BENCHMARKS.md")
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args()
    checkouts = [(c.partition("=")[0], Path(c.partition("=")[2]).resolve()) for c in args.checkout] or [("this", REPO)]

    runs: dict[tuple[str, str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="tlmpack-load-bench-") as tmp:
        tars = {label: make_tar(checkout, Path(tmp) / label, args.weights_mb) for label, checkout in checkouts}
        for rep in range(args.repeat):  # checkouts alternate, so a busy moment hits each alike
            for label, checkout in checkouts:
                cache = Path(tmp) / label / f"cache{rep}"
                for phase in ("cold", "warm"):
                    for r in measure(checkout, tars[label], cache):
                        runs.setdefault((label, phase, r["load"]), []).append(r)
    header = ("| checkout | phase | load | wall s (median) | wall s (min) | VmRSS MiB after | RssAnon MiB | "
              "Pss MiB | VmHWM MiB |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
    table = header + "".join(
        f"| {label} | {phase} | {load} | {statistics.median(r['s'] for r in rs):.3f} | {min(r['s'] for r in rs):.3f} | "
        f"{max(r['VmRSS'] for r in rs):.0f} | {max(r['RssAnon'] for r in rs):.0f} | {max(r['Pss'] for r in rs):.0f} | "
        f"{max(r['VmHWM'] for r in rs):.0f} |\n"
        for (label, phase, load), rs in runs.items())
    print(table)
    if args.no_append:
        return
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    revs = {label: subprocess.run(["git", "-C", str(c), "rev-parse", "--short", "HEAD"], capture_output=True,
                                  text=True).stdout.strip() for label, c in checkouts}
    command = "python bench/load_memory.py " + " ".join(f"--weights-mb {args.weights_mb}".split() +
                                                       [f"--repeat {args.repeat}"] +
                                                       [f"--checkout {c}" for c in args.checkout])
    with open(args.benchmarks_md, "a") as f:
        f.write(f"\n## {now} — loading one {args.weights_mb} MiB artifact twice: time and memory\n\n"
                f"- machine: {cpu}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}\n"
                f"- checkouts: {', '.join(f'{k} {v}' for k, v in revs.items())}\n"
                f"- artifact: tests/fixtures_runtime's fabricated model with {args.weights_mb} MiB of weights, "
                f"loaded from the .tar with num_threads=1; cold = empty cache (extraction included), warm = a "
                f"new process with the cache filled; each model's output checked after the loads; "
                f"{args.repeat} repeats, checkouts alternating; load average at the start {os.getloadavg()[0]:.1f}\n"
                f"- command: `{command}`\n" + (f"- note: {args.note}\n" if args.note else "") + "\n" + table)


if __name__ == "__main__":
    main()
