"""The ``ranked`` scheduler: per task, the candidates a build can write without measuring anything, and
the shipped cost model's pick among them (tlm/cost_model.py).

The candidates: the rules' point first, the TLM's greedy decode and ``SAMPLES`` seeded top-k samples,
and ``EDITS`` one-step edits of the rules' point (neighbours.py). On the CUDA held-out tasks the TLM's
greedy pick alone is level with the rules, while the fastest of these candidates runs 1.22x the rules:
ranking them is where the speed is (BENCHMARKS.md, 2026-12-07 17:45, "the cost model ranks").

Every candidate is a legal point of the task's space, replayed; on CUDA those under the build's grid
floor are left out (select._grid_check), the rules' point never. Ties keep the rules' point.
``SEED`` is the held-out pass's, so that pass measured exactly the candidates a build ranks.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .records import Decision
from .space import DesignSpace

SAMPLES = 16  # the TLM's top-k samples besides its greedy point
EDITS = 8  # one-step edits of the rules' point
SEED = 37
RANKED_TARGETS = ("cuda",)  # x86: among the TLM's samples a cost model picked 1.00-1.05x the rules, level with builds
JOBS_ENV = "TLMPACK_JOBS"  # worker processes that rank a build's tasks (default: this host's CPUs)
TASKS_PER_WORKER = 4  # fewer tasks than this a worker: starting it (TVM's import, ~3 s) costs more than it saves


@dataclass(frozen=True)
class Candidate:
    """One written program: where it came from (``rules``, ``tlm greedy``, ``tlm sample N``, ``edit N``)."""

    source: str
    sketch: int
    decisions: tuple[Decision, ...]
    func: Any


@dataclass(frozen=True)
class RankedPick:
    """The kept candidate, its score over the rules' point's, how many were ranked, and by what."""

    candidate: Candidate
    margin: float
    ranked: int
    cost_model: Any  # tlm.cost_model.CostModel
    tlm: Any  # tlm.model.LoadedTLM or None
    choose_ms: float

    @property
    def chosen_by(self) -> str:
        return "heuristic" if self.candidate.source == "rules" else "ranked"

    @property
    def note(self) -> str:
        return (f"{self.cost_model.id}: {self.candidate.source} of {self.ranked} candidates"
                + (f", score +{self.margin:.2f} over the rules' point" if self.candidate.source != "rules" else ""))


def candidates(func, tvm_target, target_kind: str, hardware: Any, task_name: str, tlm_path: str | None = None,
               rules=None, grid_floor: bool | None = None) -> tuple[list[Candidate], DesignSpace | None]:
    """The rules' point (``rules``: select.RuleChoice, computed when None), the TLM's greedy point and
    samples where its weights load, the rules' edits; distinct points, the rules' first; and the design
    space they were written in (its context extracts their features). Empty and None when no
    rule fits the task. ``grid_floor`` False keeps CUDA points under the grid floor (default: the
    TLMPACK_RANKED_GRID_FLOOR environment variable, on unless "0": a control for measuring)."""
    from ..tlm.decode import decode_space
    from ..tlm.language import Hint, describe_task
    from .neighbours import neighbour_points
    from .select import _grid_check, schedule_with_rules

    if grid_floor is None:
        grid_floor = os.environ.get("TLMPACK_RANKED_GRID_FLOOR", "1") != "0"
    rules = rules or schedule_with_rules(func, tvm_target, target_kind, hardware)
    if rules is None:
        return [], None
    out = [Candidate("rules", rules.sketch, tuple(rules.decisions), rules.func)]
    seen = {(rules.sketch, tuple(rules.decisions))}
    space = DesignSpace(func, tvm_target, seed=SEED)
    check = _grid_check(space, hardware) if target_kind == "cuda" and grid_floor else None

    def add(c: Candidate) -> None:
        if (c.sketch, c.decisions) not in seen:
            seen.add((c.sketch, c.decisions))
            out.append(c)

    tlm = _tlm_or_none(target_kind, tlm_path)
    if tlm is not None:
        hint = Hint(rules.sketch, tuple(rules.decisions))  # what select.hint_for gives (decode_space drops it if unused)
        decoded = decode_space(tlm, space, hardware, describe_task(func, task_name), samples=SAMPLES, seed=SEED,
                               hint=hint)
        for i, d in enumerate(decoded):
            if check is None or check.fits(d):
                add(Candidate("tlm greedy" if i == 0 else f"tlm sample {i}", d.sketch, tuple(d.decisions), d.func))
    for i, (edited, edited_func) in enumerate(neighbour_points(space, rules.sketch, tuple(rules.decisions), EDITS,
                                                               SEED), 1):
        c = Candidate(f"edit {i}", rules.sketch, tuple(edited), edited_func)
        if check is None or check.fits(c):
            add(c)
    return out, space


def rank(func, tvm_target, target_kind: str, hardware: Any, task_name: str, tlm_path: str | None = None,
         cost_model_path: str | None = None, rules=None) -> RankedPick | None:
    """The best-scored candidate; None when no rule fits the task (the caller's fallback schedules
    it). Raises tlm.cost_model.CostModelUnavailable when the target has no cost model."""
    from ..tlm.cost_model import load, program_features

    model = load(target_kind, cost_model_path)
    started = time.perf_counter()
    found, space = candidates(func, tvm_target, target_kind, hardware, task_name, tlm_path, rules)
    if not found:
        return None
    scores = model.score([program_features(space, c.func) for c in found])
    best = int(np.argmax(scores))  # the first of equal scores: the rules' point on a tie
    return RankedPick(found[best], float(scores[best] - scores[0]), len(found), model, _tlm_or_none(target_kind, tlm_path),
                      (time.perf_counter() - started) * 1e3)


def _tlm_or_none(target_kind: str, tlm_path: str | None):
    """The TLM whose samples join the candidates (loaded once per process), or None where it has no weights."""
    from ..tlm.model import TLMUnavailable, load

    try:
        return load(target_kind, tlm_path)
    except TLMUnavailable:
        return None


def build_jobs(tasks: int) -> int:
    """Worker processes for ranking ``tasks`` tasks: TLMPACK_JOBS or this host's CPUs, at most one per
    TASKS_PER_WORKER tasks; 1 means in this process."""
    from ..errors import TlmpackBuildError
    from .hardware import host_cores

    wanted = os.environ.get(JOBS_ENV, "").strip()
    if wanted and not (wanted.isdigit() and int(wanted) > 0):
        raise TlmpackBuildError(f"{JOBS_ENV}={wanted!r}: expected a whole number of worker processes, at least 1")
    jobs = int(wanted) if wanted else host_cores()
    return max(1, min(jobs, -(-tasks // TASKS_PER_WORKER)))


def rank_tasks(tasks: Sequence[tuple[Any, str]], tvm_target, target_kind: str, hardware: Any,
               tlm_path: str | None = None, cost_model_path: str | None = None,
               jobs: int = 1) -> Iterator[RankedPick | None]:
    """rank() of each (func, task name), in order. About 1 s a task, all of it Python and TVM in one
    thread, so ``jobs`` > 1 ranks in that many worker processes (rank_worker.py, each a fresh
    interpreter that imports TVM and loads the weights once; task i goes to worker i mod ``jobs``).
    Each task's pick is seeded by the task alone: the same picks, bytes and order for any ``jobs``.
    Raises CostModelUnavailable before any worker starts, and TlmpackBuildError when a worker dies."""
    from ..tlm.cost_model import load

    model = load(target_kind, cost_model_path)
    if jobs <= 1 or len(tasks) < 2:
        for func, name in tasks:
            yield rank(func, tvm_target, target_kind, hardware, name, tlm_path, cost_model_path)
        return
    from .rank_worker import Workers

    tlm = _tlm_or_none(target_kind, tlm_path)

    settings = (tvm_target, target_kind, hardware, tlm_path, cost_model_path)
    with Workers(min(jobs, len(tasks)), settings, list(tasks)) as workers:
        for found in workers.results():
            yield None if found is None else RankedPick(found[0], found[1], found[2], model, tlm, found[3])


def rank_for_worker(settings: tuple, func, task_name: str) -> tuple[Candidate, float, int, float] | None:
    """One task's pick without the weights, as a worker sends it back (the parent holds its own copies)."""
    tvm_target, target_kind, hardware, tlm_path, cost_model_path = settings
    picked = rank(func, tvm_target, target_kind, hardware, task_name, tlm_path, cost_model_path)
    return None if picked is None else (picked.candidate, picked.margin, picked.ranked, picked.choose_ms)
