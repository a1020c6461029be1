"""Choosing one schedule per task with no search: the rules that exist today, in order of trust.

Today: ``default``, simple fixed rules over the design space (parallel outer loops, a vector-wide
innermost tile, moderate unrolling). Later schedulers (heuristics, the TLM) slot in here and only
change the decisions; emit and the runtime read ScheduleRecords and never care who chose.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..graph import Graph
from .records import ScheduleRecord
from .space import Decider, DesignSpace, SamplingSite


def _largest_divisor_at_most(n: int, bound: int) -> int:
    for d in range(min(n, max(bound, 1)), 0, -1):
        if n % d == 0:
            return d
    return 1


def default_decider(vector_lanes: int = 8) -> Decider:
    """Fixed rules: innermost tile two vectors wide, next tile a small register block, the rest
    outermost (where the parallel postprocessor fuses and parallelises it); unroll up to 64."""

    def decide(site: SamplingSite, sampled: Any) -> Any:
        if site.kind == "tile":
            bound = site.max_innermost if site.max_innermost > 0 else site.extent
            left = site.extent
            inner = _largest_divisor_at_most(left, min(bound, 2 * vector_lanes))
            left //= inner
            factors = [inner]
            if site.parts >= 3:
                second = _largest_divisor_at_most(left, 4)
                factors.insert(0, second)
                left //= second
            while len(factors) < site.parts - 1:
                factors.insert(0, 1)
            return (left, *factors)
        if site.kind == "categorical":
            return site.candidates.index(64) if 64 in site.candidates else len(site.candidates) // 2
        return sampled  # compute location: the sketch's own legal value

    return decide


def schedule_tasks(graph: Graph, target, target_id: str, scheduler: str = "default", vector_lanes: int = 8,
                   progress: Callable[[str], None] | None = None) -> tuple[dict[str, Any], list[ScheduleRecord]]:
    """Schedules every task; returns the scheduled PrimFuncs by task id and the records."""
    from tvm import s_tir

    funcs: dict[str, Any] = {}
    records: list[ScheduleRecord] = []
    for i, task in enumerate(graph.tasks):
        func = graph.task_funcs[task.id]
        started = time.perf_counter()
        space = DesignSpace(func, target)
        chosen = None
        for sketch in range(len(space.sketches)):
            result = space.replay(sketch, default_decider(vector_lanes))
            if result is not None:
                chosen = (sketch, *result, "default")
                break
        if chosen is None:
            for sketch in range(len(space.sketches)):
                result = space.replay(sketch, lambda site, sampled: sampled)
                if result is not None:
                    chosen = (sketch, *result, "sampled")
                    break
        if chosen is None:
            scheduled = s_tir.Schedule(func).mod["main"]
            records.append(ScheduleRecord(task.id, target_id, -1, (), "unscheduled", "no legal point found"))
        else:
            sketch, scheduled, decisions, who = chosen
            records.append(ScheduleRecord(task.id, target_id, sketch, decisions, who))
        funcs[task.id] = scheduled
        if progress:
            progress(f"[{i + 1}/{len(graph.tasks)}] {task.name} ({records[-1].chosen_by}, "
                     f"{(time.perf_counter() - started) * 1e3:.0f} ms)")
    return funcs, records
