"""Choosing one schedule per task with no search: the rules that exist today, in order of trust.

Today: ``default``, simple fixed rules over a whole sketch's sampling sites (parallel outer loops,
a small register tile with a vector-wide innermost loop, moderate unrolling). Later schedulers (heuristics, the TLM) slot in here and only
change the decisions; emit and the runtime read ScheduleRecords and never care who chose.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..graph import Graph
from .records import ScheduleRecord
from .space import DesignSpace, SamplingSite


def _largest_divisor_at_most(n: int, bound: int) -> int:
    for d in range(min(n, max(bound, 1)), 0, -1):
        if n % d == 0:
            return d
    return 1


def default_decisions(sites: list[SamplingSite], vector_lanes: int = 8) -> dict[int, Any]:
    """Fixed rules that see a whole sketch: consecutive 4-way tiles are one block's spatial loops
    (MetaSchedule's SSRSRS tiling), the 2-way tiles after them its reduction loops.

    Spatial loops keep their whole extent outermost (fused and parallelised by the postprocessor)
    except a register tile: the innermost spatial loop gets one vector (``vector_lanes``) times up
    to 2, the one before it up to 4 rows. Reduction loops get an inner chunk of up to 8 (a whole
    small loop, like a 3x3 kernel, stays inner). Categorical choices unroll up to 64; compute
    locations stay the sketch's own. Sites it does not recognise keep the sketch's decision.
    """
    chosen: dict[int, Any] = {}
    i = 0
    while i < len(sites):
        site = sites[i]
        if site.kind == "tile" and site.parts == 4:
            group = [site]
            while i + len(group) < len(sites) and sites[i + len(group)].kind == "tile" and sites[i + len(group)].parts == 4:
                group.append(sites[i + len(group)])
            for position, s in enumerate(group):
                bound = s.max_innermost if s.max_innermost > 0 else s.extent
                if position == len(group) - 1:  # innermost spatial loop: vectors
                    inner = _largest_divisor_at_most(s.extent, min(bound, vector_lanes))
                    block = _largest_divisor_at_most(s.extent // inner, 2)
                elif position == len(group) - 2:  # the loop before it: register rows
                    inner, block = 1, _largest_divisor_at_most(s.extent, 4)
                else:
                    inner, block = 1, 1
                chosen[s.index] = (s.extent // (inner * block), 1, block, inner)
            i += len(group)
            continue
        if site.kind == "tile":
            bound = site.max_innermost if site.max_innermost > 0 else site.extent
            inner = site.extent if site.extent <= min(bound, 7) else _largest_divisor_at_most(site.extent, min(bound, 8))
            chosen[site.index] = (*([1] * (site.parts - 2)), site.extent // inner, inner)[-site.parts:] if site.parts >= 2 else (site.extent,)
        elif site.kind == "categorical":
            chosen[site.index] = site.candidates.index(64) if 64 in site.candidates else len(site.candidates) // 2
        i += 1
    return chosen


def _replay_default(space: DesignSpace, sketch: int, vector_lanes: int):
    try:
        chosen = default_decisions(space.sites(sketch), vector_lanes)
    except Exception:  # a sketch that does not even replay with its own decisions
        return None
    return space.replay(sketch, lambda site, sampled: chosen.get(site.index, sampled))


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
            result = _replay_default(space, sketch, vector_lanes)
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
