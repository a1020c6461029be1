"""Runs one build in a forked child process under a CPU-time and memory budget.

LLVM spends minutes and gigabytes on a few legal points: a fully unrolled rfactor softmax
(task 0600cc44, sketch 1 with unroll step 512) compiles for more than 10 minutes where its neighbours
take 0.3 s, and a job of 48 programs that contains one such point never finishes. The child is
killed once it has used ``cpu_s`` seconds of CPU (time spent paused by the timing process does not
count) or has grown by more than ``max_rss_bytes`` of resident memory since the fork (a forked child
starts out resident with all of its parent's pages); the caller then narrows the build down.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_pid_dir: str | None = None  # where the build worker announces pausable processes (init_worker sets it)


def announce_pausable(pid_dir: str | None) -> None:
    """Children forked from now on leave their pid in ``pid_dir`` while they run, so the process
    that times kernels stops them too."""
    global _pid_dir
    _pid_dir = pid_dir


def die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent exits (it works on stopped processes too)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: a killed collector may leave paused workers behind


@dataclass(frozen=True)
class OverBudget:
    """A child that was killed, or died, before it answered: why."""

    reason: str


def _usage(pid: int) -> tuple[float, int]:
    """(CPU seconds, resident bytes) of process ``pid`` (zeros where /proc is missing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/statm") as f:
            resident_pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0.0, 0
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks, resident_pages * os.sysconf("SC_PAGE_SIZE")


def _child_main(conn, fn: Callable[..., Any], args: tuple) -> None:
    die_with_parent()
    started = time.process_time()
    try:
        result: Any = fn(*args)
    except Exception as e:  # noqa: BLE001  any failure is the build's answer
        text = str(e).strip().splitlines()
        result = OverBudget(f"{type(e).__name__}: {(text[0] if text else '')[:200]}")
    conn.send((result, time.process_time() - started))  # the CPU it took: a run between two polls counts too
    conn.close()


def _answer(received: tuple[Any, float], cpu_s: float) -> Any:
    """The child's result, or OverBudget when it took more than ``cpu_s`` CPU seconds all the same
    (it finished before the parent's next look at it)."""
    result, cpu = received
    return OverBudget(f"over {cpu_s:.0f} s of CPU") if cpu > cpu_s else result


def run_guarded(fn: Callable[..., Any], args: tuple, cpu_s: float, max_rss_bytes: int,
                poll_s: float = 0.1) -> Any:
    """``fn(*args)`` in a forked child: its (picklable) result, or OverBudget when the child used
    more than ``cpu_s`` CPU seconds or grew by ``max_rss_bytes`` of memory, raised, or died."""
    _, parent_rss = _usage(os.getpid())
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child_main, args=(send, fn, args), daemon=True)
    child.start()
    send.close()
    announced = Path(_pid_dir, str(child.pid)) if _pid_dir else None
    if announced is not None:
        announced.touch()
    try:
        while True:
            if receive.poll(poll_s):
                try:
                    return _answer(receive.recv(), cpu_s)
                except EOFError:
                    break
            if not child.is_alive():
                if receive.poll(0):
                    return _answer(receive.recv(), cpu_s)
                break
            cpu, rss = _usage(child.pid)
            if cpu > cpu_s:
                return OverBudget(f"over {cpu_s:.0f} s of CPU")
            if rss - parent_rss > max_rss_bytes:
                return OverBudget(f"over {max_rss_bytes >> 20} MiB of memory")
        child.join(timeout=5)  # the pipe can close before the child is reaped
        code = child.exitcode
        name = signal.Signals(-code).name if code is not None and code < 0 else f"exit code {code}"
        return OverBudget(f"the build process died ({name})")
    finally:
        if child.is_alive():
            child.kill()
        child.join()
        receive.close()
        if announced is not None:
            announced.unlink(missing_ok=True)

