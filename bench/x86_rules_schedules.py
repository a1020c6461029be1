"""The rules' schedule of every x86 task of a model, as a heuristic build for a given machine would choose
it: one home for the bench scripts that look at or time those kernels (x86_kernels_alone.py,
x86_parallel_chunks.py). Needs TVM (the build host)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def rules_schedules(model: str, cpu: str | None = None, cores: int | None = None) -> Iterator[tuple[Any, ...]]:
    """(task, func, packed weight param, the rules' choice or None, tvm target) for every x86 task of
    ``model`` built for ``cpu`` (default: this host) with ``cores`` (default: this host's)."""
    from tlmpack import build, build_switches
    from tlmpack.lower.x86 import x86_target
    from tlmpack.schedule.hardware import detect_x86
    from tlmpack.schedule.select import mark_layout_free, packed_weight_param, schedule_with_rules

    options = build.resolve_x86_machine(build_switches.resolve(build.BuildOptions(
        targets=("x86",), cpu=cpu, cores=cores, scheduler="heuristic")))
    with build_switches.applied(options):
        plans = build._import(model, options, lambda s: None)
        build._lower(plans, options, None, lambda s: None)
    graph = plans.x86_union
    target = x86_target(options.cpu, options.cores)
    hardware = detect_x86(target.features, options.cores, options.cache_kib)
    for task in graph.tasks:
        func = graph.task_funcs[task.id]
        param = packed_weight_param(graph, task.id, func)
        choice = schedule_with_rules(mark_layout_free(func, param), target.tvm_target(), "x86", hardware)
        yield task, func, param, choice, target.tvm_target()
