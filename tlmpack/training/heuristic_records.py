"""Re-records the heuristic schedule of stored tasks after a rule changed, so the per-task table
shows what `tlmpack build` picks now (a task's latest heuristic record is the one reported).

Only tasks whose heuristic choice (sketch and decisions) differs from their latest heuristic
record are built and timed, together in one interleaved pass like the collector's.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable

from .store import Store


def latest_heuristic(store: Store, threads: int) -> dict[str, dict]:
    """task key → its latest runtime_c heuristic record taken on ``threads`` cores."""
    latest: dict[str, dict] = {}
    for r in store.records("x86"):
        if (r.get("chosen_by") == "heuristic" and r.get("timer") == "runtime_c"
                and r.get("hardware", {}).get("cores") == threads):
            latest[r["task"]] = r
    return latest


def changed_tasks(store: Store, threads: int, keys: list[str] | None = None) -> list[str]:
    """The tasks (of ``keys``, default: every task with a heuristic record) whose heuristic
    choice is no longer the one recorded, or that have no heuristic record."""
    from ..lower.x86 import x86_target
    from .corpus import load_func
    from .x86_build import heuristic_point

    latest = latest_heuristic(store, threads)
    target = x86_target(num_cores=threads).tvm_target()
    changed = []
    for key in keys if keys is not None else sorted(latest):
        choice = heuristic_point(load_func(store.task(key)), target, threads)
        if choice is None:
            continue
        sketch, _, decisions, _ = choice
        old = latest.get(key)
        if old is None or old["sketch"] != sketch or old["decisions"] != [d.to_json() for d in decisions]:
            changed.append(key)
    return changed


def refresh_heuristics(store: Store, threads: int, keys: list[str], seed: int = 0,
                       say: Callable[[str], None] = print, pause_niced: bool = False,
                       max_wait_s: float = 30.0) -> dict:
    """Builds the current heuristic schedule of each task in ``keys``, checks and times them all
    in one pass, and appends the records (``chosen_by: "heuristic"``): {"recorded", "invalid"}."""
    from .collect import make_record, record_common
    from .measure import Measurement, allowed_other_load, measure_folders, niced_processes
    from .x86_build import build_job

    common = record_common(threads, seed)
    names = {t["key"]: (t["name"], entry["model"]) for entry in store.corpora() for t in entry["tasks"]}
    scratch = tempfile.mkdtemp(prefix="tlmpack-heuristics-")
    jobs = []
    try:
        for i, key in enumerate(keys, 1):
            job = build_job(str(store.root), key, threads, seed, os.path.join(scratch, key), count=0, heuristic=True)
            say(f"[{i}/{len(keys)}] {names.get(key, ('?',))[0]}: {job.heuristic_rule or job.error or 'no choice'}")
            if not job.error and (job.programs or job.failed):
                jobs.append(job)
        builds = [(job.folder, [n for n, _, _ in job.programs]) for job in jobs if job.programs]
        pause = niced_processes() if pause_niced else []
        measured = measure_folders(builds, threads, pause, allowed_other_load(threads), max_wait_s) if builds else {}
        records, invalid = [], 0
        for job in jobs:
            name, model = names.get(job.key, ("?", "?"))
            outcomes = [(sketch, decisions, Measurement(False, error=err)) for _, sketch, decisions, err in job.failed]
            outcomes += [(sketch, decisions, measured[job.folder][n]) for n, sketch, decisions in job.programs]
            chosen = {"chosen_by": "heuristic", "rule": job.heuristic_rule}
            for sketch, decisions, m in outcomes:
                invalid += not m.valid
                records.append(make_record(common, job.key, name, model, sketch, decisions, chosen | job.record_fields(),
                                           m.to_json()))
        if records:
            store.writer("x86").append(records)
        return {"recorded": len(records), "invalid": invalid}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
