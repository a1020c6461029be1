"""The collect loop: corpus models → tasks (extracted once, stored) → random legal points, built by
worker processes → x86 measurements through runtime_c → records, flushed task by task. Resumable: a
task's existing records count toward ``per_task`` and are never measured twice; a stop at any moment
loses only the tasks in flight."""

from __future__ import annotations

import os
import platform
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .store import RECORD_VERSION, Store


@dataclass
class CollectSummary:
    """What one collect run did."""

    tasks_seen: int = 0
    measured: int = 0
    valid: int = 0
    sampled: int = 0
    rejected: int = 0  # points the replay or the postprocessors refused (never measured)
    duplicates: int = 0
    seconds: float = 0.0
    stopped: str = ""
    invalid_reasons: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {**self.__dict__, "records_per_hour": round(self.measured / max(self.seconds, 1e-9) * 3600),
                "rejection_rate": round(self.rejected / max(self.sampled, 1), 4)}


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine() -> dict:
    """The machine a record was measured on (its load average says how busy it was)."""
    return {"host": socket.gethostname(), "cpu": _cpu_model(), "cores": os.cpu_count(),
            "tvm_num_threads": os.environ.get("TVM_NUM_THREADS", ""), "nice": os.nice(0)}


def record_common(threads: int, seed: int) -> dict:
    """The fields every x86 record of one run shares: format, hardware it was built and timed for
    (``threads`` cores), machine, versions, collect seed, timer."""
    import tvm

    import tlmpack

    from ..lower.x86 import x86_target
    from ..schedule.hardware import detect_x86
    from ..tlm.language import LANGUAGE_VERSION
    from .measure import TIMING

    target = x86_target(num_cores=threads)
    hardware = {**detect_x86(target.features, target.num_cores).to_json(), "llvm_cpu": target.cpu,
                "features": list(target.features)}
    return {"v": RECORD_VERSION, "target": "x86", "hardware": hardware, "machine": machine(),
            "tlmpack": tlmpack.__version__, "tvm": tvm.__version__, "language_version": LANGUAGE_VERSION,
            "seed": seed, "timer": "runtime_c", "timing": TIMING}


def make_record(common: dict, key: str, name: str, model: str, sketch: int, decisions: list, chosen: dict,
                result: dict) -> dict:
    """One x86 record: the run's common fields, the task, the point, who chose it, the measurement."""
    return {**common, "task": key, "task_name": name, "model": model, "sketch": sketch, "decisions": decisions,
            **chosen, **result, "loadavg": round(os.getloadavg()[0], 2),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def ensure_tasks(store: Store, models: list[str], say: Callable[[str], None]) -> list[tuple[str, dict]]:
    """(model, task entry) for every distinct task of the models, extracting models not yet in the
    store (the Relax → TIR path only; seconds to minutes per model)."""
    from .corpus import HELD_OUT, MODELS, extract_tasks

    seen: set[str] = set()
    out = []
    for name in models:
        entry = store.corpus(name)
        if entry is None:
            if name not in MODELS:
                raise KeyError(f"unknown corpus model {name!r}; known: {', '.join(MODELS)}")
            started = time.perf_counter()
            tasks = extract_tasks(MODELS[name])
            for t in tasks:
                store.put_task(t)
            entry = {"model": name, "held_out": name in HELD_OUT, "input_shape": list(MODELS[name].input_shape),
                     "tasks": [{"key": t["key"], "name": t["name"], "calls": t["calls"]} for t in tasks]}
            store.put_corpus(name, entry)
            say(f"{name}: {len(tasks)} tasks extracted in {time.perf_counter() - started:.0f} s")
        for t in entry["tasks"]:
            if t["key"] not in seen:
                seen.add(t["key"])
                out.append((name, t))
    return out


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _existing(store: Store, target: str, cores: int) -> dict[str, set]:
    """task key → the points (sketch, decisions) already recorded for it on ``cores`` cores."""
    done: dict[str, set] = {}
    for r in store.records(target, as_built=True):
        if r.get("hardware", {}).get("cores") != cores:
            continue
        done.setdefault(r["task"], set()).add((r["sketch"], _decisions_key(r["decisions"])))
    return done


def _with_heuristic(store: Store, target: str, cores: int) -> set[str]:
    """Task keys that have a runtime_c record of their heuristic schedule on ``cores`` cores."""
    return {r["task"] for r in store.records(target, as_built=True) if r.get("chosen_by") == "heuristic"
            and r.get("timer") == "runtime_c" and r.get("hardware", {}).get("cores") == cores}


def _rss_bytes() -> int:
    """This process's resident memory (0 where /proc is missing)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _memory_bytes() -> int:
    """The machine's memory (effectively unlimited where it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 1 << 62


def _gather_ready(in_flight: dict, min_programs: int, gather_s: float, submit_next: Callable[[], bool],
                  deadline: float) -> list:
    """(model, task entry, JobResult) of finished builds: the first, and those that finish while
    fewer than ``min_programs`` programs are ready (at most ``gather_s`` longer). Each finished
    build's worker gets the next job at once."""
    from concurrent.futures import FIRST_COMPLETED, wait

    ready, programs, until = [], 0, None
    while in_flight:
        timeout = None if until is None else max(until - time.perf_counter(), 0.0)
        finished = wait(in_flight, timeout=timeout, return_when=FIRST_COMPLETED).done
        if not finished:
            break
        for future in finished:
            model, entry = in_flight.pop(future)
            job = future.result()
            ready.append((model, entry, job))
            programs += len(job.programs)
            if time.perf_counter() < deadline:
                submit_next()
        if until is None:
            until = time.perf_counter() + gather_s
        if programs >= min_programs or time.perf_counter() >= until:
            break
    return ready


def _work(store: Store, key: str) -> int:
    """A task's size: output elements times reduction extent (how long it takes to build and run)."""
    task = store.task(key)
    size = 1
    for extent in list(task.get("spatial") or []) + list(task.get("reduction") or []):
        size *= int(extent)
    return size


def _decisions_key(decisions: list) -> tuple:
    return tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in decisions)


def collect(store: Store, models: list[str], per_task: int, seed: int = 0, budget_minutes: float | None = None,
            batch: int = 48, say: Callable[[str], None] = print, progress: bool = True,
            max_wait_s: float = 30.0, threads: int | None = None, build_workers: int | None = None,
            pause_niced: bool = False, heuristic: bool = True, min_programs: int = 32,
            gather_s: float = 60.0, kinds: set[str] | None = None,
            max_rss_fraction: float = 0.5) -> CollectSummary:
    """Measures up to ``per_task`` random legal programs of every task of ``models`` on this x86,
    built for and run on ``threads`` cores (default: all) through runtime_c's kernel path.

    ``build_workers`` processes (default: one per core) sample and build the next tasks' programs
    (x86_build.build_job, at most ``batch`` programs a job) while this process checks and times the
    last ones; they are paused (SIGSTOP) while a kernel is timed, as is every lower-priority process
    of this user with ``pause_niced``, so timings see quiet cores. ``heuristic``: every task's
    first job also builds the schedule tlmpack's heuristics choose (``chosen_by: "heuristic"``), so
    the per-task table can say where it lands among the random programs. Finished builds are
    timed together, in one interleaved pass, once ``min_programs`` are ready (or ``gather_s``
    after the first one), so every program's rounds are spread over seconds. ``kinds``: only tasks
    of these kinds (``matmul``, ``reduce``, ``pointwise``: the stored task's ``kind``). The run
    stops cleanly (``stopped: "memory"``) once this process holds more than ``max_rss_fraction``
    of the machine's memory: a run of reduction tasks grew to 15 GiB and was OOM-killed once."""
    import multiprocessing
    import shutil
    import signal
    import tempfile
    from collections import deque
    from concurrent.futures import ProcessPoolExecutor

    from .measure import Measurement, allowed_other_load, measure_folders, niced_processes
    from .x86_build import build_job, init_worker

    threads = threads or len(os.sched_getaffinity(0))
    max_rss = max_rss_fraction * _memory_bytes()
    started = time.perf_counter()
    deadline = started + budget_minutes * 60 if budget_minutes else float("inf")
    summary = CollectSummary()
    tasks = ensure_tasks(store, models, say)
    if kinds is not None:
        tasks = [(model, entry) for model, entry in tasks if store.task(entry["key"]).get("kind") in kinds]
    done = _existing(store, "x86", threads)
    max_other = allowed_other_load(threads)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)  # kill = Ctrl-C: the tasks in flight are the only loss
    common = record_common(threads, seed)
    with_heuristic = _with_heuristic(store, "x86", threads) if heuristic else None
    exhausted = store.exhausted("x86", threads)

    def wanted(key: str) -> int:
        """How many more random programs task ``key`` needs (0 once its space ran dry)."""
        return 0 if key in exhausted else max(per_task - len(done.get(key, ())), 0)

    todo = [(model, entry) for model, entry in tasks if wanted(entry["key"]) > 0
            or (with_heuristic is not None and entry["key"] not in with_heuristic)]
    todo.sort(key=lambda item: _work(store, item[1]["key"]))  # cheap tasks first: most programs per hour
    writer = store.writer("x86")
    bar = _bar(sum(wanted(e["key"]) for _, e in todo), progress)
    workers = build_workers or os.cpu_count() or 1
    scratch = Path(tempfile.mkdtemp(prefix="tlmpack-collect-"))
    pid_dir = scratch / "workers"
    pid_dir.mkdir()
    references = scratch / "references"  # one per task, shared by its jobs
    references.mkdir()
    executor = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=init_worker, initargs=(None, str(pid_dir)))
    in_flight: dict = {}  # future -> (model, task entry)
    queue: deque = deque(todo)

    def submit_next() -> bool:
        while queue:
            model, entry = queue.popleft()
            key = entry["key"]
            have = done.setdefault(key, set())
            count = min(batch, wanted(key))
            add_heuristic = with_heuristic is not None and key not in with_heuristic
            if count <= 0 and not add_heuristic:
                continue
            if add_heuristic:
                with_heuristic.add(key)  # asked for once per run
            folder = scratch / f"{key}-{len(have)}"
            future = executor.submit(build_job, str(store.root), key, threads, seed, str(folder), count,
                                     frozenset(have), None, str(references / f"{key}-{seed}.npz"), add_heuristic)
            in_flight[future] = (model, entry)
            return True
        return False

    try:
        while len(in_flight) < workers + 1 and time.perf_counter() < deadline and submit_next():
            pass
        while in_flight:
            ready = _gather_ready(in_flight, min_programs, gather_s, submit_next, deadline)
            jobs = []
            for model, entry, job in ready:
                summary.tasks_seen += 1
                summary.sampled += job.sampled
                summary.rejected += job.rejected
                summary.duplicates += job.duplicates
                if job.error:
                    say(f"{entry['name']}: {job.error}")
                    shutil.rmtree(job.folder, ignore_errors=True)
                else:
                    jobs.append((model, entry, job))
            builds = [(job.folder, [n for n, _, _ in job.programs]) for _, _, job in jobs if job.programs]
            measured = {}
            if builds:  # the ready builds' programs share one interleaved pass
                pause = [int(p.name) for p in pid_dir.iterdir()] + (niced_processes() if pause_niced else [])
                measured = measure_folders(builds, threads, pause, max_other, max_wait_s)
            for model, entry, job in jobs:
                outcomes: list[tuple[str, int, list, Measurement]] = [
                    (name, sketch, decisions, Measurement(False, error=err))
                    for name, sketch, decisions, err in job.failed]
                outcomes += [(n, sketch, decisions, measured[job.folder][n]) for n, sketch, decisions in job.programs]
                records = []
                key = entry["key"]
                for name, sketch, decisions, m in outcomes:
                    chosen = {"chosen_by": "heuristic", "rule": job.heuristic_rule} if name == "h" else \
                        {"chosen_by": "random"}
                    summary.measured += 1
                    summary.valid += m.valid
                    if not m.valid:
                        reason = m.error.split(":")[0].split(" ")[0]
                        summary.invalid_reasons[reason] = summary.invalid_reasons.get(reason, 0) + 1
                    records.append(make_record(common, key, entry["name"], model, sketch, decisions,
                                               chosen | job.record_fields(), m.to_json()))
                    done[key].add((sketch, _decisions_key(decisions)))
                if records:
                    writer.append(records)  # flushed: a stop after this loses only the jobs in flight
                sampled_any = job.sampled > 0
                if job.exhausted and sampled_any:
                    store.mark_exhausted("x86", key, threads, len(done[key]))
                    exhausted.add(key)
                if wanted(key) > 0 and sampled_any:
                    queue.appendleft((model, entry))  # more to do: its next job goes first
                    if len(in_flight) < workers + 1 and time.perf_counter() < deadline:
                        submit_next()
                shutil.rmtree(job.folder, ignore_errors=True)
                bar.set_postfix_str(f"{entry['name'][:24]} {summary.valid}/{summary.measured} valid")
                bar.update(len(outcomes))
            rss = _rss_bytes()
            if rss > max_rss:
                say(f"stopping: this process holds {rss / 2**30:.1f} GiB (limit {max_rss / 2**30:.1f} GiB); "
                    "what was measured is kept, and a new run resumes")
                summary.stopped = "memory"
                break
        summary.stopped = summary.stopped or ("budget" if time.perf_counter() >= deadline else "done")
    except KeyboardInterrupt:
        summary.stopped = "interrupted"
    finally:
        bar.close()
        executor.shutdown(wait=False, cancel_futures=True)
        for pid in [int(p.name) for p in pid_dir.iterdir()]:  # a worker mid-build: it has nothing to keep
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(scratch, ignore_errors=True)
        summary.seconds = time.perf_counter() - started
    return summary


class _Lines:
    """A stand-in progress bar: one line per task."""

    def __init__(self, total: int) -> None:
        self.total, self.n, self.note = total, 0, ""

    def update(self, n: int) -> None:
        self.n += n
        print(f"[{self.n}/{self.total}] {self.note}", flush=True)

    def set_postfix_str(self, note: str) -> None:
        self.note = note

    def close(self) -> None:
        pass


def _bar(total: int, enabled: bool):
    if enabled:
        try:
            from tqdm import tqdm

            return tqdm(total=total, unit="program", dynamic_ncols=True)
        except ImportError:
            pass
    return _Lines(total)
