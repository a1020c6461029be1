"""Candidate programs of stored tasks, measured side by side: the TLM's greedy schedule and its
top-k samples, the rules' choice, the best stored programs again, and fresh random ones.

What the improvement rounds (generate → measure → fine-tune) and the held-out comparison
measure. x86 is built and timed here in one interleaved pass (x86_build + measure, through
runtime_c's kernel API); CUDA goes into a batch folder for bench/gpu_measure_programs.py.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .dataset import latency
from .store import Store


@dataclass(frozen=True)
class Candidate:
    """One program to measure: the sketch, its decisions (JSON), who proposed it."""

    sketch: int
    decisions: list
    chosen_by: str  # tlm | heuristic | random
    rule: str = ""  # tlm: greedy | top-k; heuristic: the rule; re-measured: a stored program again


def _task_hardware(target: str, threads: int):
    if target == "x86":
        from ..lower.x86 import x86_target
        from ..schedule.hardware import detect_x86

        t = x86_target(num_cores=threads)
        return t.tvm_target(), detect_x86(t.features, t.num_cores)
    from ..schedule.hardware import cuda_hardware
    from .cuda_programs import ARCH, cuda_tvm_target

    return cuda_tvm_target(), cuda_hardware(ARCH)


def built_options(target: str, weights: str, task: dict):
    """The options a ``--scheduler tlm`` build schedules ``task`` with: on x86, a channels-last
    convolution (the layout x86 builds compile) meets the build's gate (build.unseen_by_tlm), which
    the weights' summary lifts or not, so ``--built`` times what a build of it would run."""
    from ..build import unseen_by_tlm
    from ..schedule.select import SelectOptions
    from .dataset import CHANNELS_LAST_CONV_BLOCK

    channels_last = target == "x86" and CHANNELS_LAST_CONV_BLOCK.search(task["script"]) is not None
    return SelectOptions("tlm", tlm_weights={target: weights}, tlm_unseen=unseen_by_tlm("NHWC" if channels_last else None))


def propose(store: Store, target: str, keys: list[str], samples: int, threads: int = 1, seed: int = 0,
            weights: str | None = None, stored_best: int = 0, heuristic: bool = True,
            say: Callable[[str], None] = print, versus: dict[str, str] | None = None,
            built: bool = False, neighbours: int = 0, neighbours_of: str = "rules") -> dict[str, list[Candidate]]:
    """Per task: the TLM's greedy point and up to ``samples`` top-k samples (seeded), the rules'
    point, the ``stored_best`` fastest stored programs of this hardware (to re-measure), and the
    greedy point of each other model of ``versus`` (name -> weights; rule ``greedy:<name>``, even
    where it is the same point: each model's row reads its own measurement). ``built``: also the
    point a ``--scheduler tlm`` build takes with the main weights (its floor, anchor and hardware
    checks applied, the rules where it falls back), as ``greedy:built``. ``neighbours``: up to that many
    legal one-step edits of the rules' point (schedule/neighbours.py; ``chosen_by: search``, rule
    ``neighbour``), a local search around it; ``neighbours_of="best"``: around the task's fastest program
    measured on this hardware instead (x86; one more step of a hill climb), leaving out points measured here."""
    from ..schedule.neighbours import neighbours as edits_of
    from ..schedule.records import Decision
    from ..schedule.select import hint_for, schedule_with_rules, tlm_build_point
    from ..schedule.space import DesignSpace
    from ..tlm.decode import decode_space
    from ..tlm.model import load_file, weights_path
    from .corpus import load_func
    from .dataset import task_info
    from .x86_build import _point_key

    tlm = load_file(Path(weights) if weights else weights_path(target), target)
    others = {name: load_file(Path(path), target) for name, path in (versus or {}).items()}
    tvm_target, hardware = _task_hardware(target, threads)
    best = _stored_best(store, target, set(keys), threads, stored_best) if stored_best else {}
    if neighbours_of not in ("rules", "best"):
        raise ValueError(f"neighbours_of is rules or best, not {neighbours_of!r}")
    climb = _here(store, set(keys), threads) if neighbours and neighbours_of == "best" else {}
    out: dict[str, list[Candidate]] = {}
    for i, key in enumerate(keys, 1):
        task = store.task(key)
        func = load_func(task)
        space = DesignSpace(func, tvm_target, seed=seed)
        found: list[Candidate] = []
        seen: set = set()

        def add(c: Candidate, found=found, seen=seen) -> None:
            point = (c.sketch, repr(c.decisions))
            if point not in seen:
                seen.add(point)
                found.append(c)

        hint = hint_for(tlm, func, tvm_target, target, hardware)
        for j, d in enumerate(decode_space(tlm, space, hardware, task_info(task), samples=samples, seed=seed,
                                           hint=hint)):
            add(Candidate(d.sketch, [x.to_json() for x in d.decisions], "tlm", "greedy" if j == 0 else "top-k"))
        for name, other in others.items():
            d = decode_space(other, space, hardware, task_info(task),
                             hint=hint_for(other, func, tvm_target, target, hardware))
            if d:
                found.append(Candidate(d[0].sketch, [x.to_json() for x in d[0].decisions], "tlm", f"greedy:{name}"))
        if built:
            path = str(Path(weights) if weights else weights_path(target))
            point = tlm_build_point(func, tvm_target, target, hardware, task["name"], built_options(target, path, task))
            if point is not None:
                found.append(Candidate(point[0], [x.to_json() for x in point[1]], "tlm", "greedy:built"))
        if heuristic:
            choice = schedule_with_rules(func, tvm_target, target, hardware)
            if choice is not None:  # even when the TLM chose the same point: then both rows show it
                found.append(Candidate(choice.sketch, [x.to_json() for x in choice.decisions], "heuristic",
                                       choice.rule))
                if neighbours_of == "rules":
                    for edited in edits_of(space, choice.sketch, choice.decisions, neighbours, seed):
                        add(Candidate(choice.sketch, [x.to_json() for x in edited], "search", "neighbour"))
        if key in climb:
            start, measured = climb[key]
            for edited in edits_of(space, start["sketch"], tuple(Decision.from_json(d) for d in start["decisions"]),
                                   neighbours, seed, skip=lambda e, s=start["sketch"], m=measured:
                                   _point_key(s, [x.to_json() for x in e]) in m):
                add(Candidate(start["sketch"], [x.to_json() for x in edited], "search", "neighbour"))
        for r in best.get(key, []):
            add(Candidate(r["sketch"], r["decisions"], r.get("chosen_by") or "random", "re-measured"))
        out[key] = found
        if i % 10 == 0 or i == len(keys):
            say(f"[{i}/{len(keys)}] candidates proposed ({sum(len(v) for v in out.values())} programs)")
    return out


def _here(store: Store, keys: set[str], threads: int) -> dict[str, tuple[dict, set]]:
    """Per task, the fastest valid x86 program measured on this machine's hardware at ``threads``
    cores, and every point measured there (the start and the points to leave out of a hill climb)."""
    from .collect import record_common
    from .x86_build import _point_key

    hardware = record_common(threads, 0)["hardware"]
    out: dict[str, tuple[dict, set]] = {}
    for r in store.records("x86", as_built=True):
        if r["task"] not in keys or r["hardware"] != hardware or r.get("timer") != "runtime_c":
            continue
        best, measured = out.setdefault(r["task"], (r, set()))
        measured.add(_point_key(r["sketch"], r["decisions"]))
        if r.get("valid") and (not best.get("valid") or latency(r) < latency(best)):
            out[r["task"]] = (r, measured)
    return {k: v for k, v in out.items() if v[0].get("valid")}


def _stored_best(store: Store, target: str, keys: set[str], threads: int, k: int) -> dict[str, list[dict]]:
    by_task: dict[str, list[dict]] = {}
    for r in store.records(target, as_built=True):
        if r.get("valid") and r["task"] in keys and (target != "x86" or (
                r["hardware"].get("cores") == threads and r.get("timer") == "runtime_c")):
            by_task.setdefault(r["task"], []).append(r)
    return {key: sorted(rs, key=latency)[:k] for key, rs in by_task.items()}


def measure_x86(store: Store, candidates: dict[str, list[Candidate]], threads: int = 1, random_per_task: int = 0,
                seed: int = 0, say: Callable[[str], None] = print, pause_niced: bool = False,
                run: str | None = None) -> list[dict]:
    """Builds every candidate (and ``random_per_task`` fresh random programs) of every task, checks
    and times them all in one interleaved pass, appends the records (``chosen_by`` as proposed;
    a re-measured stored program keeps its own, with ``rule: re-measured``) and returns them."""
    from .collect import make_record, record_common
    from .measure import Measurement, allowed_other_load, measure_folders, niced_processes
    from .x86_build import build_job

    common = record_common(threads, seed)
    names = {t["key"]: (t["name"], entry["model"]) for entry in store.corpora() for t in entry["tasks"]}
    scratch = tempfile.mkdtemp(prefix="tlmpack-candidates-")
    reference_dir = os.path.join(scratch, "references")
    os.makedirs(reference_dir)
    jobs = []
    known = _known_points(store, set(candidates), threads) if random_per_task else {}
    try:
        for i, (key, found) in enumerate(sorted(candidates.items()), 1):
            ref = os.path.join(reference_dir, f"{key}.npz")
            job = build_job(str(store.root), key, threads, seed, os.path.join(scratch, key),
                            points=[(c.sketch, c.decisions) for c in found], reference_cache=ref)
            jobs.append((job, {f"p{j}": c for j, c in enumerate(found)}))
            if random_per_task:
                rjob = build_job(str(store.root), key, threads, seed, os.path.join(scratch, f"{key}-random"),
                                 count=random_per_task, known=known.get(key, frozenset()),
                                 reference_cache=ref)
                jobs.append((rjob, {}))
            say(f"[{i}/{len(candidates)}] {names.get(key, ('?',))[0]}: built {len(job.programs)} candidates"
                + (f" + {len(rjob.programs)} random" if random_per_task else "") + (f" ({job.error})" if job.error else ""))
        builds = [(job.folder, [n for n, _, _ in job.programs]) for job, _ in jobs if job.programs and not job.error]
        pause = niced_processes() if pause_niced else []
        say(f"timing {sum(len(b[1]) for b in builds)} programs in one interleaved pass")
        measured = measure_folders(builds, threads, pause, allowed_other_load(threads)) if builds else {}
        records = []
        for job, proposed in jobs:
            if job.error:
                continue
            name, model = names.get(job.key, ("?", "?"))
            outcomes = [(n, s, d, Measurement(False, error=err)) for n, s, d, err in job.failed]
            outcomes += [(n, s, d, measured[job.folder][n]) for n, s, d in job.programs]
            for n, sketch, decisions, m in outcomes:
                c = proposed.get(n)
                chosen = {"chosen_by": c.chosen_by, "rule": c.rule} if c else {"chosen_by": "random"}
                records.append(make_record(common, job.key, name, model, sketch, decisions, chosen | job.record_fields(),
                                           m.to_json()))
        if records:
            store.writer("x86", run).append(records)
        return records
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _known_points(store: Store, keys: set[str], threads: int) -> dict[str, frozenset]:
    """The stored points of each task on ``threads`` cores (fresh random programs avoid them)."""
    from .x86_build import _point_key

    known: dict[str, set] = {}
    for r in store.records("x86", as_built=True):
        if r["task"] in keys and r["hardware"].get("cores") == threads:
            known.setdefault(r["task"], set()).add(_point_key(r["sketch"], r["decisions"]))
    return {k: frozenset(v) for k, v in known.items()}
