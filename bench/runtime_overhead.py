#!/usr/bin/env python
"""The C runtime's own cost per run, before and after a change, side by side in one run.

    python bench/runtime_overhead.py ARTIFACT [ARTIFACT ...] [--old-rev 970e811] [--threads 1,2]
                                     [--runs 30] [--rounds 3] [--append]

Builds libtlmrt.so twice, from runtime_c/ at --old-rev (git archive) and from the working tree, and
bench/c/runtime_overhead.c against each (with the profiler for the new one). ARTIFACT is a .tar or an
extracted directory; "fake" stands for tests/c/fake_plan.c built without a barrier hook (two kernels,
three parallel launches a run: almost nothing but the pool's wake-up and join). For each artifact and
thread count, rounds alternate old and new, each RUNS warm runs of zero inputs, and the table shows the
median over rounds of each round's median wall time per run through the C API, and for the new runtime
what its profiler says: the time outside kernels per run (copies included) and per kernel call, and
the caller's wait for pool workers. The old runtime's time outside kernels is not measurable (it has no
profiler); old minus new wall time is the whole difference, kernels' pool waits included.
--append adds the table to BENCHMARKS.md with the date, the machine and the command.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import struct
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _sh(*cmd: str | Path, cwd: Path | None = None) -> str:
    return subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True, cwd=cwd).stdout


def build_runtime(src_root: Path, out: Path, profile: bool) -> Path:
    """libtlmrt.so from src_root/runtime_c with its build.sh, and the timing program linked to it."""
    out.mkdir(parents=True, exist_ok=True)
    _sh("bash", src_root / "runtime_c" / "build.sh", out, cwd=src_root)
    exe = out / "runtime_overhead"
    flags = ["-DTLMRT_PROFILE"] if profile else []
    _sh("cc", "-std=c11", "-O2", f"-I{src_root / 'runtime_c'}", *flags, ROOT / "bench" / "c" / "runtime_overhead.c",
        "-o", exe, f"-L{out}", "-ltlmrt", f"-Wl,-rpath,{out}")
    return exe


def fake_artifact(out: Path) -> Path:
    """tests/c/fake_plan.c without a barrier hook, as an artifact directory."""
    (out / "x86").mkdir(parents=True, exist_ok=True)
    data = bytearray(struct.pack("<1000f", *(i * 0.25 for i in range(1000))))
    data += bytes(4032 - len(data)) + struct.pack("<f", 2.0)
    (out / "weights.bin").write_bytes(bytes(data))
    import hashlib

    sha = hashlib.sha256(bytes(data)).hexdigest()
    _sh("cc", "-std=c11", "-O2", "-fPIC", "-shared", "-Wl,-Bsymbolic", f"-I{ROOT / 'runtime_c'}",
        f'-DFAKE_WEIGHTS_SHA="{sha}"', "-DFAKE_NO_BARRIER", ROOT / "tests" / "c" / "fake_plan.c", "-o",
        out / "x86" / "model.so")
    sums = [f"{hashlib.sha256((out / p).read_bytes()).hexdigest()}  {p}\n" for p in ("weights.bin", "x86/model.so")]
    (out / "SHA256SUMS").write_text("".join(sums))
    return out


def extracted(path: str, work: Path) -> Path:
    if path == "fake":
        return fake_artifact(work / "fake")
    p = Path(path)
    if p.is_dir():
        return p
    dest = work / p.stem
    with tarfile.open(p) as tf:
        tf.extractall(dest, filter="data")
    return dest


def measure(exe: Path, art: Path, threads: int, runs: int) -> dict:
    out = subprocess.run([str(exe), str(art), str(threads), str(runs)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("artifacts", nargs="+", help='.tar files, extracted directories, or "fake"')
    ap.add_argument("--old-rev", default="970e811", help="the git revision of the runtime to compare with")
    ap.add_argument("--old-tar", type=Path, default=None,
                    help="runtime_c of the old revision as a tar (git archive REV runtime_c), for machines without git")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--append", action="store_true", help="append the table to BENCHMARKS.md")
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]

    with tempfile.TemporaryDirectory(prefix="tlmrt-overhead-") as tmp:
        work = Path(tmp)
        old_src = work / "old-src"
        old_src.mkdir()
        archive = args.old_tar.read_bytes() if args.old_tar else subprocess.run(
            ["git", "archive", args.old_rev, "runtime_c"], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old_src)], input=archive, check=True)
        old_exe = build_runtime(old_src, work / "old", profile=False)
        new_exe = build_runtime(ROOT, work / "new", profile=True)
        rows = []
        for a in args.artifacts:
            art = extracted(a, work)
            for t in threads:
                old_ms, new_ms, prof = [], [], []
                for r in range(args.rounds):
                    pair = [("old", old_exe), ("new", new_exe)]
                    for which, exe in pair if r % 2 == 0 else pair[::-1]:
                        res = measure(exe, art, t, args.runs)
                        (old_ms if which == "old" else new_ms).append(res["median_us"] / 1e3)
                        if which == "new":
                            prof.append(res)
                outside = statistics.median(p["outside_us"] for p in prof)
                calls = prof[0]["kernel_calls_per_run"]
                rows.append((Path(a).name, t, statistics.median(old_ms), statistics.median(new_ms), outside,
                             statistics.median(p["io_copy_us"] for p in prof), outside / calls if calls else 0.0,
                             calls, prof[0]["pool_launches_per_run"],
                             statistics.median(p["pool_wait_us"] for p in prof)))
    head = ("| artifact | threads | old ms/run | new ms/run | new: outside kernels us/run (copies) | us per kernel "
            "call | kernel calls | pool launches | pool wait us/run |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, t, old, new, outside, io, per_call, calls, launches, wait in rows:
        lines.append(f"| {name} | {t} | {old:.3f} | {new:.3f} | {outside:.1f} ({io:.1f}) | {per_call:.2f} | "
                     f"{calls:g} | {launches:g} | {wait:.1f} |")
    table = "\n".join(lines)
    print(table)
    if args.append:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        cpu = platform.processor() or platform.machine()
        try:
            cpu = next(x.split(":", 1)[1].strip() for x in Path("/proc/cpuinfo").read_text().splitlines()
                       if x.startswith("model name"))
        except (OSError, StopIteration):
            pass
        cmd = "python " + " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]])
        with open(ROOT / "BENCHMARKS.md", "a") as f:
            f.write(f"\n## {stamp} — C runtime overhead per run, runtime at {args.old_rev} vs this tree\n\n"
                    f"- machine: {cpu}, {os.cpu_count()} logical CPUs; command: `{cmd}`\n"
                    f"- {args.rounds} rounds alternating old/new, each the median of {args.runs} warm runs\n\n"
                    f"{table}\n")


if __name__ == "__main__":
    main()
