"""Build workers must not outlive the collector, even when it dies with them paused."""

import os
import subprocess
import sys
import textwrap
import time

PARENT = textwrap.dedent("""
    import multiprocessing, os, signal, time
    from tlmpack.training.x86_build import init_worker

    def worker():
        init_worker(None)
        time.sleep(120)

    if __name__ == "__main__":
        child = multiprocessing.get_context("spawn").Process(target=worker)
        child.start()
        time.sleep(2)  # let it run init_worker
        os.kill(child.pid, signal.SIGSTOP)  # paused, as while a kernel is timed
        print(child.pid, flush=True)
        os._exit(0)  # the collector dies without resuming it
""")


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


def test_a_paused_worker_dies_with_its_collector(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    pid = int(parent.stdout.readline())  # not read to EOF: a surviving worker would hold the pipe open
    parent.wait(timeout=60)
    deadline = time.time() + 10
    while _state(pid) not in ("gone", "Z") and time.time() < deadline:
        time.sleep(0.2)
    state = _state(pid)
    if state not in ("gone", "Z"):
        os.kill(pid, 9)
    assert state in ("gone", "Z")
