"""x86 measurement of built programs through runtime_c's kernel path (the library the deployed
runtime uses: its thread pool, its hooks; see runtime/kernels.py): run every program on the task's
random inputs, check it against the unscheduled reference, then time it in rounds interleaved with
the other programs of its build (median and minimum over the rounds, each after a warm-up call). No TVM here: x86_build.py builds the programs in worker processes.
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

REL_TOL = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 2e-2, "float64": 1e-9}


@dataclass(frozen=True)
class Measurement:
    """One program's outcome. Invalid programs carry ``error`` and no latency."""

    valid: bool
    median_us: float = 0.0
    min_us: float = 0.0
    spread: float = 0.0  # (max - min) / median over the timed repeats
    repeats: int = 0
    rel_err: float = 0.0
    error: str = ""
    other_load: float = 0.0  # cores other processes kept busy just before timing
    host_slowdown: float = 0.0  # host_gate's probe ratio over this program's rounds (median; 0: no gate)

    def to_json(self) -> dict:
        out = {"valid": self.valid, "median_us": round(self.median_us, 3), "min_us": round(self.min_us, 3),
               "spread": round(self.spread, 4), "repeats": self.repeats, "rel_err": float(f"{self.rel_err:.3g}"),
               "error": self.error, "other_load": round(self.other_load, 2)}
        if self.host_slowdown:
            out["host_slowdown"] = round(self.host_slowdown, 3)
        return out


def check(outputs: list[np.ndarray], expected: list[np.ndarray]) -> tuple[bool, float, str]:
    """Valid when every output matches: non-finite exactly where the reference is, relative L2
    error within the dtype's tolerance, not all zero unless the reference is."""
    worst = 0.0
    for got, ref in zip(outputs, expected, strict=True):
        if got.dtype.kind != "f":
            if not np.array_equal(got, ref):
                return False, 1.0, "mismatch (exact dtype)"
            continue
        finite = np.isfinite(ref)
        if not np.array_equal(np.isfinite(got), finite):
            return False, float("inf"), "NaN/Inf where the reference is finite (or the reverse)"
        g, r = got[finite].astype(np.float64), ref[finite].astype(np.float64)
        if not np.any(g) and np.any(r):
            return False, 1.0, "all-zero output"
        err = float(np.linalg.norm(g - r) / max(np.linalg.norm(r), 1e-30))
        worst = max(worst, err)
        if err > REL_TOL.get(str(got.dtype), 1e-4):
            return False, err, f"rel err {err:.2e}"
    return True, worst, ""


def _cpu_snapshot() -> tuple[int, int, int]:
    """(all jiffies, idle jiffies) of the machine and this process's own (all threads)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:9]]
    with open("/proc/self/stat") as f:
        own = f.read().rsplit(")", 1)[1].split()
    return sum(values), values[3] + values[4], int(own[11]) + int(own[12])


def other_load(window_s: float = 0.1) -> float:
    """How many cores other processes kept busy over ``window_s`` (0 where /proc is missing)."""
    try:
        total0, idle0, own0 = _cpu_snapshot()
        time.sleep(window_s)
        total1, idle1, own1 = _cpu_snapshot()
    except (OSError, ValueError, IndexError):
        return 0.0
    cores = os.cpu_count() or 1
    busy = (total1 - total0) - (idle1 - idle0) - (own1 - own0)
    return max(0.0, cores * busy / max(total1 - total0, 1))


def allowed_other_load(threads: int) -> float:
    """How busy other processes may keep this machine while ``threads`` cores time a kernel: the
    cores left free (plus a little slack)."""
    return (os.cpu_count() or threads) - threads + 0.2


def wait_quiet(max_other: float = 0.5, timeout_s: float = 30.0) -> float:
    """The build host is shared: a parallel kernel whose second thread waits for a busy core runs
    at half speed or worse. So time only when other processes leave the cores free (or give up
    after ``timeout_s`` and say how busy it was; the record keeps that number)."""
    deadline = time.perf_counter() + timeout_s
    load = other_load()
    while load > max_other and time.perf_counter() < deadline:
        time.sleep(0.5)
        load = other_load()
    return load


TIMING_LOCK = os.environ.get("TLMPACK_TIMING_LOCK", "/tmp/tlmpack-x86-timing.lock")


class TimingLock:
    """One timing pass at a time on this machine: two processes timing kernels on neighbouring
    cores (two collectors, a collector and `tlm repeat`) slow each other down, and both would
    record it. Held around a pass (taken before pausing anyone, so a paused process never holds it);
    a second process waits for the first pass to end."""

    def __init__(self, path: str = TIMING_LOCK) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> TimingLock:
        import fcntl

        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)  # closing releases the lock
        self.fd = -1


class PausedProcesses:
    """SIGSTOPs ``pids`` for the duration of a ``with`` (and SIGCONTs them after, whatever happens):
    the build workers and other low-priority work of this host must not share the cores a kernel is
    timed on. Processes that have gone are skipped."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = [p for p in pids if p != os.getpid()]

    def _signal(self, sig: int) -> None:
        for pid in self.pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def __enter__(self) -> PausedProcesses:
        self._signal(signal.SIGSTOP)
        return self

    def __exit__(self, *exc) -> None:
        self._signal(signal.SIGCONT)


def niced_processes() -> list[int]:
    """This user's other processes running at a lower priority than this one (background work that
    can wait while a kernel is timed)."""
    own, uid = os.nice(0), os.getuid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[16]) > own and fields[0] not in "ZXT":  # nice, and alive and not stopped
                found.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return found


ROUNDS = 9  # interleaved rounds per program (3 for programs over LONG_CALL_S a call)
ROUND_MS = 5.0  # each round runs a program back to back for at least this long
LONG_CALL_S = 0.2
TIMING = "interleaved"  # the records' ``timing``: what median_us and min_us are taken over
HOST_WAIT_S = 120.0  # a timing pass waits this long at most, in all, for the host to be quiet


def host_wait_s() -> float:
    """HOST_WAIT_S, or the environment's TLMPACK_HOST_WAIT_S (the tests use 1 s: they check
    programs, they do not need quiet numbers)."""
    return float(os.environ.get("TLMPACK_HOST_WAIT_S", HOST_WAIT_S))


def check_program(library, name: str, args: list[np.ndarray],
                  expected: list[np.ndarray]) -> Measurement | tuple[float, float]:
    """Runs program ``name`` of ``library`` (a kernel_timer.KernelLibrary) once on fresh copies of
    ``args`` and checks its outputs: the invalid Measurement, or (seconds the call took, error)."""
    arrays = [a.copy() for a in args]  # fresh copies: outputs start as NaN again
    try:
        started = time.perf_counter()
        library.call(name, arrays)
        first = time.perf_counter() - started
    except Exception as e:  # noqa: BLE001
        return Measurement(False, error=f"run: {type(e).__name__}: {str(e)[:200]}")
    ok, err, why = check(arrays[len(arrays) - len(expected):], expected)
    if not ok:
        return Measurement(False, rel_err=err, error=why)
    return first, err


@dataclass
class TimedProgram:
    """A checked program ready to be timed: its library, kernel name, arguments, first call's time."""

    library: Any
    name: str
    arrays: list[np.ndarray]
    first_call_s: float


def time_interleaved(programs: dict[Hashable, TimedProgram], rounds: int = ROUNDS, round_ms: float = ROUND_MS,
                     gate: Any = None, slowdowns: dict[Hashable, list[float]] | None = None
                     ) -> dict[Hashable, list[float]]:
    """Seconds per call of each program, one value per round. A round times every program once
    (a warm-up call, then calls back to back for at least ``round_ms``), so a program's samples
    are spread over the whole pass: on a shared host whose speed changes over seconds, samples
    taken in one burst all share that moment's speed, and a re-measurement sees another one.
    ``gate`` (a host_gate.HostGate): each round of a program waits for a quiet host; the probe
    ratio it went on at is appended to ``slowdowns[key]``."""
    samples: dict[Hashable, list[float]] = {k: [] for k in programs}
    for r in range(rounds):
        for key, p in programs.items():
            if r >= 3 and p.first_call_s > LONG_CALL_S:
                continue
            if gate is not None:
                ratio = gate.wait()
                if slowdowns is not None:
                    slowdowns.setdefault(key, []).append(ratio)
            samples[key] += p.library.time(p.name, p.arrays, repeats=1, min_repeat_ms=round_ms)
    return samples


def measure_folder(folder: str, names: list[str], threads: int, pause: list[int] = (), max_other: float = 0.5,
                   max_wait_s: float = 30.0, rounds: int = ROUNDS) -> dict[str, Measurement]:
    """measure_folders for one build folder: kernel name → Measurement."""
    return measure_folders([(folder, names)], threads, pause, max_other, max_wait_s, rounds)[folder]


def measure_folders(builds: list[tuple[str, list[str]]], threads: int, pause: list[int] = (),
                    max_other: float = 0.5, max_wait_s: float = 30.0, rounds: int = ROUNDS,
                    host_wait: float | None = None) -> dict[str, dict[str, Measurement]]:
    """Measures the kernels of build folders (x86_build: kernels.so and reference.npz; given as
    (folder, kernel names)) through runtime_c with ``threads`` threads, with the processes
    ``pause`` stopped meanwhile: checks every program against its reference, then times all the
    valid ones together in interleaved rounds (the median and the minimum over rounds), each
    round held while the host is slow (host_gate.py; up to ``host_wait`` seconds a pass, default
    host_wait_s())."""
    from contextlib import ExitStack
    from pathlib import Path

    from ..runtime.kernels import KernelLibrary
    from .host_gate import HostGate
    from .x86_build import load_reference, program_arguments

    out: dict[tuple[str, str], Measurement] = {}
    slowdowns: dict[tuple[str, str], list[float]] = {}
    programs: dict[tuple[str, str], TimedProgram] = {}
    errors: dict[tuple[str, str], float] = {}
    with ExitStack() as stack:
        stack.enter_context(TimingLock())
        stack.enter_context(PausedProcesses(list(pause)))
        load = wait_quiet(max_other, timeout_s=max_wait_s)
        for folder, names in builds:
            args, expected = load_reference(Path(folder) / "reference.npz")
            library = stack.enter_context(KernelLibrary(str(Path(folder) / "kernels.so"), threads))
            arrays = [a.copy() for a in args]  # shared by the folder's timed calls: only timing matters now
            packed = program_arguments(folder, args)  # kernels that read a pre-packed weight, as built
            for name in names:
                own = packed.get(name)
                outcome = check_program(library, name, own or args, expected)
                if isinstance(outcome, Measurement):
                    out[folder, name] = outcome
                else:
                    first, errors[folder, name] = outcome
                    timed = arrays if own is None else [o if o is not args[i] else arrays[i] for i, o in enumerate(own)]
                    programs[folder, name] = TimedProgram(library, name, timed, first)
        gate = HostGate(host_wait_s() if host_wait is None else host_wait) if programs else None
        try:
            samples = time_interleaved(programs, rounds, gate=gate, slowdowns=slowdowns)
        except Exception:  # noqa: BLE001  a program that checked but fails when timed: find it
            samples = {}
            for key, program in programs.items():
                try:
                    samples.update(time_interleaved({key: program}, rounds, gate=gate, slowdowns=slowdowns))
                except Exception as e:  # noqa: BLE001
                    out[key] = Measurement(False, error=f"run: {type(e).__name__}: {str(e)[:200]}")
    for key, times in samples.items():
        median = statistics.median(times)
        out[key] = Measurement(True, median * 1e6, min(times) * 1e6, (max(times) - min(times)) / median, len(times),
                               errors[key], other_load=load,
                               host_slowdown=statistics.median(slowdowns[key]) if slowdowns.get(key) else 0.0)
    return {folder: {n: out[folder, n] for n in names} for folder, names in builds}
