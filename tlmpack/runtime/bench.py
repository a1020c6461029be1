"""`tlmpack bench`: how fast an artifact runs here, and where a run's time goes.

Latency comes from warm runs timed with perf_counter around Model.run (what a user sees, Python
included). With profile=True, a second set of runs goes through the C runtime's profiler (off during
the latency runs, so it costs them nothing): every kernel call's time, each run's total inside the C
runtime, and so the time outside kernels (copies, checks, launch overhead), joined with the schedule
that the manifest records for each kernel (who chose it, the sketch). Imports only numpy and the
runtime, like the rest of tlmpack.runtime.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tlmpack.runtime.kernels import empty_aligned
from tlmpack.runtime.model import Model, load


@dataclass(frozen=True)
class KernelRow:
    """One kernel of the plan as profiled: its calls per run, times, and the schedule it was built with."""

    kernel: str
    task: str
    calls_per_run: float
    total_ms: float  # over every profiled run
    mean_us: float  # per call
    share: float  # of the time inside kernels
    chosen_by: str
    sketch: str
    note: str
    intensity: float | None  # flops per byte, when the manifest has both for the task
    gflops: float | None  # the rate this kernel reached (its FLOPs a call over its mean time), for the peak's sake


@dataclass(frozen=True)
class Profile:
    """What the C profiler counted over `runs` runs, per run where it says so."""

    runs: int
    run_us: float  # per run, inside the C runtime from entry to return
    kernel_us: float  # per run, inside kernel calls
    outside_us: float  # run_us - kernel_us: the runtime's own time per run
    outside_per_call_us: float  # outside_us per kernel call
    io_copy_us: float  # the part of outside_us that copies inputs in and outputs out (CPU)
    kernel_calls_per_run: float
    pool_launches_per_run: float
    pool_wait_us: float  # per run: the caller's wait for the pool's workers, inside kernel_us (CPU)
    pool_wakes_per_run: float  # launches a run that found the workers asleep and paid a system call to wake them
    kernels: tuple[KernelRow, ...]
    timeline: tuple[tuple[str, float, float], ...]  # the last profiled run: (kernel, start us, length us)


@dataclass(frozen=True)
class BenchResult:
    artifact: str
    device: str
    device_name: str
    runs: int
    warmup: int
    latency_ms: dict[str, float]  # min, median, p90, mean, max
    profile: Profile | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def random_feed(model: Model, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for timing: floats ~ N(0, 1); integers 0, always a valid index (token ids, positions).
    64-byte aligned, as a torch tensor or ``empty_aligned`` gives them: the model reads them in place."""
    rng = np.random.default_rng(seed)
    feed = {}
    largest = model.batch_plans[-1] if model.batch_plans else 0  # a dynamic batch: its largest plan
    for spec in (s.with_batch(largest) for s in model.inputs):
        value = empty_aligned(spec.shape, spec.dtype)
        value[...] = rng.standard_normal(spec.shape) if np.dtype(spec.dtype).kind == "f" else 0
        feed[spec.name] = value
    return feed


def _percentile(sorted_ms: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    k = max(0, min(len(sorted_ms) - 1, int(np.ceil(q * len(sorted_ms))) - 1))
    return sorted_ms[k]


def _schedules(manifest: Mapping[str, Any], target: str) -> dict[str, dict[str, Any]]:
    """task id -> {chosen_by, sketch, note, flops, bytes} from the manifest's subgraphs, for one target."""
    out: dict[str, dict[str, Any]] = {}
    for sub in manifest.get("subgraphs", []):
        if not isinstance(sub, Mapping) or not isinstance(sub.get("id"), str):
            continue
        info: dict[str, Any] = {"flops": sub.get("flops"), "bytes": sub.get("bytes")}
        for sch in sub.get("schedules", []):
            if isinstance(sch, Mapping) and sch.get("target") == target:
                info.update(chosen_by=str(sch.get("chosen_by", "")), sketch=str(sch.get("sketch", "")),
                            note=str(sch.get("note", "")))
        out[sub["id"]] = info
    return out


def _rate(info: Mapping[str, Any], mean_us: float) -> float | None:
    """GFLOP/s of one call taking ``mean_us``, when the manifest counted the task's FLOPs."""
    flops = info.get("flops")
    return float(flops) / (mean_us * 1e3) if isinstance(flops, int | float) and flops > 0 and mean_us > 0 else None


def _intensity(info: Mapping[str, Any]) -> float | None:
    flops, nbytes = info.get("flops"), info.get("bytes")
    if isinstance(flops, int | float) and isinstance(nbytes, int | float) and nbytes > 0:
        return float(flops) / float(nbytes)
    return None


def profile_model(model: Model, feed: Mapping[str, Any], runs: int) -> Profile:
    """Runs `runs` times with the C profiler on and summarises it per run and per kernel."""
    lib, handle = model._lib, model._handle
    if handle is None:
        raise ValueError("the model is closed")
    lib.set_profiling(handle, True)
    try:
        for _ in range(runs):
            model.run(None, feed)
        report = lib.profile(handle)
    finally:
        lib.set_profiling(handle, False)
    n = max(report.runs, 1)
    schedules = _schedules(model.manifest, model.target.get("id", ""))
    by_task: dict[str, list] = {}
    for step in report.steps:
        by_task.setdefault(step.task or step.kernel, []).append(step)
    kernel_ns = max(report.kernel_ns, 1)
    rows = []
    for task, steps in by_task.items():
        calls = sum(s.calls for s in steps)
        total = sum(s.total_ns for s in steps)
        info = schedules.get(task, {})
        kernels = sorted({s.kernel for s in steps})
        mean_us = total / max(calls, 1) / 1e3
        rows.append(KernelRow(
            kernel=kernels[0] if len(kernels) == 1 else f"{kernels[0]} (+{len(kernels) - 1})", task=task,
            calls_per_run=calls / n, total_ms=total / 1e6, mean_us=mean_us,
            share=total / kernel_ns, chosen_by=info.get("chosen_by", ""), sketch=info.get("sketch", ""),
            note=info.get("note", ""), intensity=_intensity(info), gflops=_rate(info, mean_us)))
    rows.sort(key=lambda r: r.total_ms, reverse=True)
    calls = sum(s.calls for s in report.steps)
    outside = (report.run_ns - report.kernel_ns) / n / 1e3
    per_run_calls = calls / n
    timeline = tuple((s.task or s.kernel, s.last_start_ns / 1e3, s.last_ns / 1e3) for s in report.steps if s.calls)
    return Profile(
        runs=report.runs, run_us=report.run_ns / n / 1e3, kernel_us=report.kernel_ns / n / 1e3, outside_us=outside,
        outside_per_call_us=outside / per_run_calls if per_run_calls else 0.0, io_copy_us=report.io_ns / n / 1e3,
        kernel_calls_per_run=per_run_calls, pool_launches_per_run=report.pool_launches / n,
        pool_wait_us=report.pool_wait_ns / n / 1e3, pool_wakes_per_run=report.pool_wakes / n, kernels=tuple(rows),
        timeline=timeline)


def bench(path: str | Path, device: str = "cpu", threads: int | None = None, runs: int = 50, warmup: int = 5,
          profile: bool = False) -> BenchResult:
    """Loads `path`, runs `warmup` untimed and `runs` timed runs, and profiles `runs` more when asked."""
    if runs < 1 or warmup < 0:
        raise ValueError(f"runs must be >= 1 and warmup >= 0; got runs={runs}, warmup={warmup}")
    with load(path, device=device, num_threads=threads) as model:
        feed = random_feed(model)
        for _ in range(warmup):
            model.run(None, feed)
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            model.run(None, feed)
            times.append((time.perf_counter() - started) * 1e3)
        times.sort()
        latency = {"min": times[0], "median": statistics.median(times), "p90": _percentile(times, 0.9),
                   "mean": statistics.fmean(times), "max": times[-1]}
        prof = profile_model(model, feed, runs) if profile else None
        return BenchResult(str(path), model.device, model.device_name, runs, warmup, latency, prof)


def format_report(result: BenchResult, top: int | None = None) -> str:
    """The human report: the latency line, and with a profile the per-kernel table and the time outside kernels."""
    lat = result.latency_ms
    lines = [f"{result.artifact} on {result.device_name}: {result.runs} warm runs (after {result.warmup}), "
             f"min {lat['min']:.3f} ms, median {lat['median']:.3f} ms, p90 {lat['p90']:.3f} ms"]
    p = result.profile
    if p is None:
        return "\n".join(lines)
    lines.append(f"profiled {p.runs} runs: {p.run_us:.1f} us a run in the C runtime, {p.kernel_us:.1f} us in "
                 f"{p.kernel_calls_per_run:g} kernel calls, {p.outside_us:.1f} us outside kernels "
                 f"({p.outside_per_call_us:.2f} us a call; input/output copies {p.io_copy_us:.1f} us)")
    if p.pool_launches_per_run:
        lines.append(f"thread pool: {p.pool_launches_per_run:g} parallel launches a run, the caller waited "
                     f"{p.pool_wait_us:.1f} us a run for workers (inside the kernels' time); "
                     f"{p.pool_wakes_per_run:g} launches a run found them asleep")
    header = ("kernel", "calls", "total ms", "mean us", "share", "GFLOP/s", "chosen_by", "sketch", "flop/B")
    rows = [header]
    for r in p.kernels[:top] if top else p.kernels:
        rows.append((r.task, f"{r.calls_per_run:g}", f"{r.total_ms:.3f}", f"{r.mean_us:.1f}", f"{100 * r.share:.1f}%",
                     f"{r.gflops:.1f}" if r.gflops is not None else "-", r.chosen_by or "-", r.sketch or "-",
                     f"{r.intensity:.1f}" if r.intensity is not None else "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for k, row in enumerate(rows):
        cells = [c.ljust(w) if i == 0 or i >= 6 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    if top and len(p.kernels) > top:
        lines.append(f"... {len(p.kernels) - top} more kernels (--json lists every one)")
    return "\n".join(lines)


def write_chrome_trace(result: BenchResult, path: str | Path) -> None:
    """The last profiled run as a Chrome trace (chrome://tracing, Perfetto): one complete event per kernel call."""
    if result.profile is None:
        raise ValueError("a trace needs a profile: bench(..., profile=True)")
    events = [{"name": name, "cat": "kernel", "ph": "X", "ts": start, "dur": dur, "pid": 0, "tid": 0}
              for name, start, dur in result.profile.timeline]
    meta = {"artifact": result.artifact, "device": result.device_name}
    Path(path).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms", "otherData": meta}))
