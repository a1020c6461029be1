"""Worker processes for ranked.rank_tasks: each a fresh interpreter, ``python -m tlmpack.schedule.rank_worker``.

Why not multiprocessing: its spawn and forkserver start methods import the caller's ``__main__`` again in
every worker, so a user's build script without an ``if __name__ == "__main__"`` guard would run again
there; fork copies a process whose TVM, BLAS and OpenMP threads may hold locks. A plain subprocess
imports only tlmpack (TVM's own worker pools do the same).

Protocol: the parent pickles (settings, [(func, task name), ...]) into a file, the worker's stdin; the worker
pickles one result per task, in order, to its stdout. Anything else the worker prints (TVM's warnings,
Python prints) goes to a log file, whose last line a failure quotes.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class Workers:
    """``count`` workers ranking ``tasks`` (task i on worker i mod count); ``results`` yields in task order."""

    def __init__(self, count: int, settings: tuple, tasks: list[tuple[Any, str]]) -> None:
        self.count, self.settings, self.tasks = count, settings, tasks
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Any] = []

    def __enter__(self) -> Workers:
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # the folder holding this tlmpack package
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        for w in range(self.count):
            log = tempfile.TemporaryFile()
            self.logs.append(log)
            with tempfile.TemporaryFile() as payload:  # a file, not a pipe: no worker waits for another's start
                pickle.dump((self.settings, self.tasks[w::self.count]), payload, protocol=pickle.HIGHEST_PROTOCOL)
                payload.seek(0)
                self.procs.append(subprocess.Popen([sys.executable, "-m", "tlmpack.schedule.rank_worker"],
                                                   stdin=payload, stdout=subprocess.PIPE, stderr=log, env=env))
        return self

    def results(self) -> Iterator[Any]:
        for i in range(len(self.tasks)):
            proc = self.procs[i % self.count]
            try:
                yield pickle.load(proc.stdout)
            except EOFError as e:  # its stdout closed: it is exiting
                raise self._died(i % self.count, i) from e
            except pickle.UnpicklingError as e:  # alive with a corrupt stream: it would block on a full pipe
                proc.kill()
                raise self._died(i % self.count, i) from e

    def _died(self, worker: int, task: int) -> Exception:
        from ..errors import TlmpackBuildError

        proc, log = self.procs[worker], self.logs[worker]
        code = proc.wait()
        log.seek(0)
        lines = [ln for ln in log.read().decode(errors="replace").splitlines() if ln.strip()]
        return TlmpackBuildError(f"a ranking worker exited with code {code} before task {self.tasks[task][1]!r}"
                                 + (f": {lines[-1].strip()}" if lines else "") + "; TLMPACK_JOBS=1 ranks in this process")

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.stdout.close()
        for log in self.logs:
            log.close()


def main() -> None:
    """The worker: results go to a private copy of stdout; fd 1 itself now writes to stderr, so a
    print or a C library's output cannot corrupt the stream."""
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    settings, tasks = pickle.load(sys.stdin.buffer)
    from .ranked import rank_for_worker

    for func, name in tasks:
        pickle.dump(rank_for_worker(settings, func, name), out, protocol=pickle.HIGHEST_PROTOCOL)
        out.flush()


if __name__ == "__main__":
    main()
