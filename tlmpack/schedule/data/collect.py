"""The collect loop: corpus models → tasks (extracted once, stored) → random legal points →
x86 measurements → records, flushed batch by batch. Resumable: a task's existing records count
toward ``per_task`` and are never measured twice; a stop at any moment loses at most one batch."""

from __future__ import annotations

import os
import platform
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

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


def use_threads(threads: int | None) -> int:
    """Sets TVM's runtime thread count (before its pool starts) and returns it."""
    threads = threads or len(os.sched_getaffinity(0))
    os.environ["TVM_NUM_THREADS"] = str(threads)
    return threads


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _existing(store: Store, target: str, cores: int) -> dict[str, set]:
    """task key → the points (sketch, decisions) already recorded for it on ``cores`` cores."""
    done: dict[str, set] = {}
    for r in store.records(target):
        if r.get("hardware", {}).get("cores") != cores:
            continue
        done.setdefault(r["task"], set()).add((r["sketch"], _decisions_key(r["decisions"])))
    return done


def _decisions_key(decisions: list) -> tuple:
    return tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in decisions)


def collect(store: Store, models: list[str], per_task: int, seed: int = 0, budget_minutes: float | None = None,
            batch: int = 8, say: Callable[[str], None] = print, progress: bool = True,
            max_wait_s: float = 30.0, threads: int | None = None) -> CollectSummary:
    """Measures up to ``per_task`` random legal programs of every task of ``models`` on this x86,
    built for and run on ``threads`` cores (default: all). On a shared host, fewer threads than
    cores keeps timings clean while other work holds the remaining cores."""
    threads = use_threads(threads)
    import signal

    import tvm

    import tlmpack

    from ..hardware import detect_x86
    from ..language import LANGUAGE_VERSION
    from ..space import DesignSpace
    from .corpus import load_func
    from .measure import Measurement, compile_batch, measure, run_reference
    from .sample import sample_point

    started = time.perf_counter()
    deadline = started + budget_minutes * 60 if budget_minutes else float("inf")
    summary = CollectSummary()
    tasks = ensure_tasks(store, models, say)
    done = _existing(store, "x86", threads)
    from ...lower.x86 import x86_target

    target = x86_target(num_cores=threads)
    tvm_target = target.tvm_target()
    max_other = (os.cpu_count() or threads) - threads + 0.2  # other work may hold the cores we leave free
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)  # kill = Ctrl-C: the batch in flight is the only loss
    hardware = {**detect_x86(target.features, target.num_cores).to_json(), "llvm_cpu": target.cpu,
                "features": list(target.features)}
    common = {"v": RECORD_VERSION, "target": "x86", "hardware": hardware, "machine": machine(),
              "tlmpack": tlmpack.__version__, "tvm": tvm.__version__, "language_version": LANGUAGE_VERSION,
              "seed": seed}
    writer = store.writer("x86")
    bar = _bar(len(tasks), progress)
    try:
        for model, entry in tasks:
            bar.update(1)
            key = entry["key"]
            have = done.setdefault(key, set())
            if len(have) >= per_task:
                continue
            if time.perf_counter() > deadline:
                summary.stopped = "budget"
                break
            summary.tasks_seen += 1
            task = store.task(key)
            func = load_func(task)
            space = DesignSpace(func, tvm_target, seed=seed)
            ref_seed = (int(key[:8], 16) ^ seed) & 0x7FFFFFFF
            args, expected = run_reference(func, task["num_outputs"], tvm_target, ref_seed)
            rng = random.Random(f"{seed}:{key}:{len(have)}")
            misses = 0
            while len(have) < per_task and misses < 4 * batch and time.perf_counter() < deadline:
                points = []
                while len(points) < min(batch, per_task - len(have)) and misses < 4 * batch:
                    summary.sampled += 1
                    point = sample_point(space, rng)
                    if point is None:
                        summary.rejected += 1
                        misses += 1
                        continue
                    pkey = (point.sketch, _decisions_key([d.to_json() for d in point.decisions]))
                    if pkey in have or any(p.key() == point.key() for p in points):
                        summary.duplicates += 1
                        misses += 1
                        continue
                    points.append(point)
                if not points:
                    break
                built = compile_batch({f"p{i}": p.func for i, p in enumerate(points)}, tvm_target)
                records = []
                for i, p in enumerate(points):
                    mod = built[f"p{i}"]
                    if isinstance(mod, str):
                        m = Measurement(False, error=mod)
                    else:
                        m = measure(mod, f"p{i}", args, expected, max_wait_s=max_wait_s, max_other=max_other)
                    summary.measured += 1
                    summary.valid += m.valid
                    if not m.valid:
                        reason = m.error.split(":")[0].split(" ")[0]
                        summary.invalid_reasons[reason] = summary.invalid_reasons.get(reason, 0) + 1
                    records.append({**common, "task": key, "task_name": entry["name"], "model": model,
                                    "sketch": p.sketch, "decisions": [d.to_json() for d in p.decisions],
                                    **m.to_json(), "loadavg": round(os.getloadavg()[0], 2),
                                    "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
                    have.add((p.sketch, _decisions_key([d.to_json() for d in p.decisions])))
                writer.append(records)  # flushed: a stop after this loses nothing
                bar.set_postfix_str(f"{entry['name'][:24]} {summary.valid}/{summary.measured} valid")
        else:
            summary.stopped = summary.stopped or "done"
    except KeyboardInterrupt:
        summary.stopped = "interrupted"
    finally:
        bar.close()
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

            return tqdm(total=total, unit="task", dynamic_ncols=True)
        except ImportError:
            pass
    return _Lines(total)
