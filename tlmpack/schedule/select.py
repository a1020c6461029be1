"""Choosing one schedule per task, for every target, with no search.

``tlm`` (the default): the Tensor Language Model decodes the task's schedule (tlm/decode.py),
masked to the legal values of its design space; where the model has no weights for the target,
the task is out of its training distribution, or it is unsure, the rules choose instead and the
record says why (``chosen_by: heuristic``, ``note: tlm fallback: …``). ``heuristic``: the rules
registry (heuristics/), which reads the task's loop nest and the hardware description. Where no
rule fits: on x86 the first release's fixed rules (``default_decisions``, also the ``baseline``
scheduler), on CUDA TVM dlight (also ``baseline``/``dlight``). On x86 the weights of matmul-like
tasks are pre-packed for the chosen tiling. emit and the runtime read ScheduleRecords and never
care who chose.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from ..graph import Graph
from .heuristics.x86_matmul import largest_divisor_at_most as _largest_divisor_at_most
from .heuristics.x86_matmul import vector_tile as _vector_tile
from .records import Decision, ScheduleRecord
from .space import DesignSpace, SamplingSite


def default_decisions(sites: list[SamplingSite], vector_lanes: int = 8,
                      rows_axis: int | None = None) -> dict[int, Any]:
    """Fixed rules that see a whole sketch: consecutive 4-way tiles are one block's spatial loops
    (MetaSchedule's SSRSRS tiling: levels 0 and 1 outside the reduction, 2 between its chunks,
    3 innermost), the 2-way tiles after them its reduction loops.

    The register tile sits at level 3, inside the inner reduction loop, and holds about 8
    accumulators (4 FMA latency x 2 FMA units; AVX2 has 16 registers): the last spatial loop
    gets one or two vectors, ``rows_axis`` (the loop the vector-loaded operand does not depend on,
    so its operand is broadcast; default: the loop before the last) gets 8 / vectors rows. Level
    0 keeps the rest of every loop (fused and parallelised by the postprocessor) but a small
    level-1 block of rows. Reduction loops get an inner chunk of up to 8 (a whole small loop, like
    a 3x3 window, stays inner); unroll up to 64 (0 is 3x slower); compute locations stay the
    sketch's own. docs/x86-performance-notes.md has the measurements behind these numbers.
    """
    chosen: dict[int, Any] = {}
    i = 0
    while i < len(sites):
        site = sites[i]
        if site.kind == "tile" and site.parts == 4:
            group = [site]
            while i + len(group) < len(sites) and sites[i + len(group)].kind == "tile" and sites[i + len(group)].parts == 4:
                group.append(sites[i + len(group)])
            last = len(group) - 1
            rows_at = rows_axis if rows_axis is not None and 0 <= rows_axis < last else last - 1
            vectors = 1
            for position, s in enumerate(group):
                if position == last:
                    inner = _vector_tile(s.extent, vector_lanes)
                    vectors = -(-inner // vector_lanes)
                    chosen[s.index] = (s.extent // inner, 1, 1, inner)
            for position, s in enumerate(group):
                if position == rows_at:
                    rows = _largest_divisor_at_most(s.extent, max(1, 8 // vectors))
                    block = _largest_divisor_at_most(s.extent // rows, 4)
                    chosen[s.index] = (s.extent // (rows * block), block, 1, rows)
                elif position != last:
                    chosen[s.index] = (s.extent, 1, 1, 1)
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


def rows_axis_of(func) -> int | None:
    """For a matmul-like task: the spatial loop its vector-loaded operand (the one that depends
    on the last spatial loop) ignores, the largest such; None when there is none."""
    from .heuristics.classify import classify

    task = classify(func)
    if task.kind != "matmul" or len(task.spatial) < 2:
        return None
    last = len(task.spatial) - 1
    for ignored in task.reuse.values():
        if last not in ignored:  # this operand is loaded along the vector
            candidates = [a for a in ignored if task.spatial[a] > 1]
            if candidates:
                return max(candidates, key=lambda a: task.spatial[a])
    return None


def _replay_default(space: DesignSpace, sketch: int, vector_lanes: int, rows_axis: int | None = None):
    try:
        chosen = default_decisions(space.sites(sketch), vector_lanes, rows_axis)
    except Exception:  # a sketch that does not even replay with its own decisions
        return None
    return space.replay(sketch, lambda site, sampled: chosen.get(site.index, sampled))


def fixed_schedule(func, tvm_target, vector_lanes: int) -> tuple[int, Any, tuple[Decision, ...], str] | None:
    """The first release's fixed rules (the 'baseline' scheduler and the heuristics' safe default),
    else the first sketch that replays with its own sampled decisions."""
    space = DesignSpace(func, tvm_target)
    rows_axis = rows_axis_of(func)
    for sketch in range(len(space.sketches)):
        result = _replay_default(space, sketch, vector_lanes, rows_axis)
        if result is not None:
            return (sketch, *result, "default")
    for sketch in range(len(space.sketches)):
        result = space.replay(sketch, lambda site, sampled: sampled)
        if result is not None:
            return (sketch, *result, "sampled")
    return None


@dataclass(frozen=True)
class RuleChoice:
    """What the heuristics chose for one task: the sketch, the scheduled PrimFunc, the decisions
    in trace order, the rule's name, and how long choosing took (classify + rule, no TVM replay)."""

    sketch: int
    func: Any
    decisions: tuple[Decision, ...]
    rule: str
    choose_ms: float
    total_ms: float
    alternatives: tuple = ()  # the TLM's top-k samples besides its pick (decode.Decoded), for --tune


def _location_or_outside(decide):
    """A rule's compute location where TVM allows it, else the nearest legal loop outside it (the
    root at worst): what TVM would silently snap it to, but checked at replay and so recorded as
    what runs. A rule may give several locations in order of preference (a tuple): the first TVM
    allows, else the last one's nearest legal loop outside."""
    def wrapped(site: SamplingSite, sampled):
        value = decide(site, sampled)
        if site.kind != "compute_location":
            return value
        preferred = value if isinstance(value, tuple) else (value,)
        if not site.candidates:
            return preferred[-1]
        for location in preferred:
            if location in site.candidates:
                return location
        outside = [c for c in site.candidates if -1 <= c <= preferred[-1]]
        return max(outside) if outside else sampled

    return wrapped


def schedule_with_rules(func, tvm_target, target_kind: str, hardware: Any,
                        disabled: frozenset[str] | None = None) -> RuleChoice | None:
    """The first eligible rule (trust order) whose decisions replay legally on one of its sketches;
    None when no rule fits (the caller falls back to its safe default)."""
    from .heuristics.classify import classify
    from .heuristics.registry import rules_for

    started = time.perf_counter()
    task = classify(func)
    choose = time.perf_counter() - started
    space = None
    for rule in rules_for(target_kind, disabled):
        if not rule.is_eligible(task, hardware):
            continue
        if space is None:
            space = DesignSpace(func, tvm_target)
        for sketch in rule.sketch_order([space.steps(i) for i in range(len(space.sketches))], task, hardware):
            if not 0 <= sketch < len(space.sketches):
                continue
            sites = space.sites(sketch)
            t0 = time.perf_counter()
            try:
                chosen = rule.decisions(task, sites, hardware)
            except Exception:  # a rule bug must not break the build: the next rule or the default
                chosen = None
            choose += time.perf_counter() - t0
            if chosen is None:
                continue
            decide = lambda site, sampled, chosen=chosen: chosen.get(site.index, sampled)  # noqa: E731
            if rule.wants_locations:
                decide = _location_or_outside(decide)
            result = space.replay(sketch, decide, locations=rule.wants_locations)
            if result is not None:
                scheduled, decisions = result
                return RuleChoice(sketch, scheduled, decisions, rule.name, choose * 1e3,
                                  (time.perf_counter() - started) * 1e3)
    return None


def rules_hint(func, tvm_target, target_kind: str, hardware: Any):
    """What a guided TLM reads first (tlm.language.Hint): the rules' schedule of the task, on x86
    with the fixed rules where no rule fits; NO_HINT where nothing fits (CUDA: dlight's tasks)."""
    from ..tlm.language import NO_HINT, Hint

    choice = schedule_with_rules(func, tvm_target, target_kind, hardware)
    if choice is not None:
        return Hint(choice.sketch, tuple(choice.decisions))
    if target_kind == "x86":
        fixed = fixed_schedule(func, tvm_target, max(hardware.vector_bits // 32, 1))
        if fixed is not None:
            return Hint(fixed[0], tuple(fixed[2]))
    return NO_HINT


def hint_for(tlm, func, tvm_target, target_kind: str, hardware: Any):
    """The hint ``tlm`` decodes after: the rules' schedule for a guided or anchored model, else None."""
    needs = tlm.summary.guided or tlm.summary.anchor_margin > 0
    return rules_hint(func, tvm_target, target_kind, hardware) if needs else None


SCHEDULERS = ("auto", "tlm", "heuristic", "ranked", "baseline", "dlight")
# What "auto" (the default) runs per target: the TLM on x86, where whole seed models built with it
# match the rules; the rules on CUDA, where the shipped CUDA model lost to them on three of four seed
# models on the H200 (BENCHMARKS.md, 2026-12-01) although it beat them on held-out corpus tasks.
# A cross build for another x86 (--cpu) runs the rules: there, on the H200 machine's AVX-512 Xeon,
# the TLM adapted to it lost to them on all four transformer linear layers at 1, 4 and 16 threads
# (1.1-5x slower; BENCHMARKS.md, 2026-12-01 19:45); `--scheduler tlm` still uses it.
AUTO_SCHEDULER = {"x86": "tlm", "cuda": "heuristic", "x86-cross": "heuristic"}


def scheduler_for(target_kind: str, scheduler: str, cross_cpu: bool = False) -> str:
    """The scheduler a target runs for the build option ``scheduler``: ``auto`` resolved per target
    (and, on x86, per whether the kernels are for another CPU than the build host's); on CUDA,
    baseline is dlight (the first release's CUDA scheduler); ``ranked`` is the TLM's on targets
    without a shipped cost model (ranked.RANKED_TARGETS)."""
    from .ranked import RANKED_TARGETS

    kind = "x86-cross" if target_kind == "x86" and cross_cpu else target_kind
    chosen = AUTO_SCHEDULER[kind] if scheduler == "auto" else scheduler
    if chosen == "ranked" and target_kind not in RANKED_TARGETS:  # no cost model shipped: its TLM
        chosen = "tlm"
    if target_kind == "cuda" and chosen not in ("tlm", "heuristic", "ranked"):
        return "dlight"
    return chosen


@dataclass(frozen=True)
class SelectOptions:
    """How schedules are chosen (build options: recorded in the manifest)."""

    scheduler: str = "tlm"
    tune: int = 0  # > 0: measure this many candidates per task on the build host, keep the fastest
    tlm_weights: dict[str, str] | None = None  # target -> weights file (default: the package's)
    # (op word, why, summary flag): tasks the TLM never saw in this form go to the rules, e.g. the x86
    # build's channels-last convolutions, unless the weights' summary sets the flag ("" for none), e.g.
    # channels_last: trained on such tasks, the rules as a teacher (docs/tlm.md)
    tlm_unseen: tuple[tuple[str, str, str], ...] = ()


def _tlm_choice(func, tvm_target, target_kind: str, hardware: Any, task_name: str, options: SelectOptions,
                samples: int = 0) -> tuple[RuleChoice | None, str, Any]:
    """The TLM's greedy schedule (and ``samples`` top-k ones in ``RuleChoice.alternatives``):
    (choice, why it fell back, the loaded model or None)."""
    from ..tlm.decode import decode_space, out_of_distribution
    from ..tlm.language import describe_task
    from ..tlm.model import TLMUnavailable, load

    started = time.perf_counter()
    try:
        tlm = load(target_kind, (options.tlm_weights or {}).get(target_kind))
    except TLMUnavailable as e:
        return None, str(e), None
    info = describe_task(func, task_name)
    why = next((reason for word, reason, lifted_by in options.tlm_unseen
                if word in info.ops and not (lifted_by and getattr(tlm.summary, lifted_by))), None)
    why = why or out_of_distribution(tlm, info, hardware)
    if why is not None:
        return None, why, tlm
    hint = hint_for(tlm, func, tvm_target, target_kind, hardware)
    space = DesignSpace(func, tvm_target)
    newer = space.sketches_after(tlm.summary.space_version)
    if newer:  # a sketch the model never saw: the rules' where they take it
        rules = hint if hint is not None else rules_hint(func, tvm_target, target_kind, hardware)
        if rules.sketch in newer:
            return None, (f"the rules take sketch {rules.sketch}, newer than the model's space "
                          f"(version {tlm.summary.space_version})"), tlm
    t0 = time.perf_counter()
    decoded = decode_space(tlm, space, hardware, info, samples=samples, hint=hint)
    choose_ms = (time.perf_counter() - t0) * 1e3
    if not decoded:
        return None, "no legal point decoded", tlm
    check = _grid_check(space, hardware) if target_kind == "cuda" else _register_check(func, hardware)
    best, why = _first_that_fits(decoded, check, hint)
    if best is None:
        return None, why, tlm
    if best.confidence < tlm.summary.min_confidence:
        return None, f"confidence {best.confidence:.2f} below {tlm.summary.min_confidence:.2f}", tlm
    note = f"{tlm.id}, confidence {best.confidence:.2f}"
    choice = RuleChoice(best.sketch, best.func, best.decisions, note, choose_ms,
                        (time.perf_counter() - started) * 1e3, tuple(d for d in decoded if d is not best))
    return choice, "", tlm


def tlm_build_point(func, tvm_target, target_kind: str, hardware: Any, task_name: str,
                    options: SelectOptions) -> tuple[int, tuple[Decision, ...], str] | None:
    """(sketch, decisions, who) that a ``--scheduler tlm`` build takes for one task: the TLM's point
    after its out-of-distribution test, confidence floor, anchor and hardware checks, else the rules'
    (``who``: "tlm" or "heuristic"); None where neither fits. What the held-out comparison measures
    as the build's pick (`tlmpack tlm measure --built`)."""
    choice, _, _ = _tlm_choice(func, tvm_target, target_kind, hardware, task_name, options)
    if choice is not None:
        return choice.sketch, tuple(choice.decisions), "tlm"
    hint = rules_hint(func, tvm_target, target_kind, hardware)
    return (hint.sketch, hint.decisions, "heuristic") if hint.sketch >= 0 else None


@dataclass(frozen=True)
class PointCheck:
    """A hardware-derived bound a TLM point must keep (the model has no notion of the machine)."""

    fits: Callable[[Any], bool]  # Decoded -> within bounds
    why_not: Callable[[Any], str]  # Decoded -> the fallback note


def _grid_check(space: DesignSpace, hardware: Any) -> PointCheck | None:
    """CUDA: the grid reaches cuda_footprint.grid_floor. On fused convolutions it never saw whole,
    the model chose grids of 1-16 blocks for a 132-SM GPU: ResNet-50 ran 13x slower than with the rules."""
    from .cuda_footprint import SharedFootprint, grid_blocks, grid_floor

    footprint = SharedFootprint.of(space.mod["main"])
    floor = grid_floor(footprint, hardware.sm_count)
    if not floor:
        return None
    def blocks(d) -> int:
        return grid_blocks(footprint, d.decisions, appended_gemm=d.sketch >= space.metaschedule_sketches)

    return PointCheck(lambda d: blocks(d) >= floor,
                      lambda d: f"grid of {blocks(d)} blocks under one wave ({floor}) "
                                f"of {hardware.sm_count} SMs")


def _register_check(func, hardware: Any) -> PointCheck | None:
    """x86 matmul-like tasks: the point's register tile keeps x86_registers.register_tile_problem."""
    from .heuristics.classify import classify
    from .x86_registers import register_tile_problem

    task = classify(func)
    if task.kind != "matmul":
        return None
    spatial = tuple(task.spatial)

    def why_not(d) -> str:
        return register_tile_problem(hardware, spatial, d.decisions)

    return PointCheck(lambda d: not why_not(d), why_not)


def _first_that_fits(decoded: list, check: PointCheck | None, hint=None) -> tuple[Any, str]:
    """The greedy point when it passes ``check``, else (None, why): the build takes the rules. The
    rules' own point (``hint``) passes: the checks bound the model's choices, not the rules'. The
    model's top-k samples are no substitute: on the 23 x86 held-out tasks, where the greedy point
    failed, the first sample in bounds ran 0.12-1.00x the rules (geomean 0.46x over 9 tasks), and on
    the H200 held-out tasks samples made an anchored build 0.91x the rules (BENCHMARKS.md)."""
    first = decoded[0]
    is_rules = hint is not None and (first.sketch, tuple(first.decisions)) == (hint.sketch, tuple(hint.decisions))
    if check is None or check.fits(first) or is_rules:
        return first, ""
    return None, check.why_not(first)


@dataclass
class ScheduledTasks:
    """The x86 schedules: kernels by task id, manifest records, the tasks whose constant operand
    is pre-packed (lower/prepack.py), how long choosing took per task, and the TLM that chose."""

    funcs: dict[str, Any]
    records: list[ScheduleRecord]
    splits: dict[str, Any]
    choose_ms: dict[str, float]
    total_ms: dict[str, float]
    tlm: dict | None = None
    fallbacks: list = field(default_factory=list)  # errors.Fallback: tasks built without pre-packing


def _arg_types(graph: Graph, task_id: str) -> tuple[list[tuple[tuple[int, ...], str]], int]:
    call = next(c for c in graph.calls if c.task == task_id)
    return [(graph.tensors[a].shape, graph.tensors[a].dtype) for a in call.args], call.num_outputs


def packed_weight_param(graph: Graph, task_id: str, func) -> int | None:
    """The parameter of a matmul-like task that a build pre-packs: its first multiply-accumulate
    operand that receives a constant in every call (lower/prepack.py), None when there is none.
    The dataset's x86 timer packs the same one (training/x86_build.py), so it times what builds run."""
    from ..lower.prepack import weight_operand_params
    from .heuristics.classify import classify

    task_class = classify(func)
    if task_class.kind != "matmul":
        return None
    found = weight_operand_params(graph, task_id, func, tuple(task_class.reuse))
    return found[0] if found else None


def mark_layout_free(func, param: int | None):
    """``func`` with ``param`` marked layout-free, so the space's RewriteLayout packs it."""
    return func if param is None else func.with_attr("layout_free_buffers", [param])


def _choose_x86(graph: Graph, task, func, tvm_target, hardware, prepack: bool, options: SelectOptions):
    """TLM (when asked) then rules, weights marked layout-free so RewriteLayout packs them:
    (choice, chosen_by, note prefix, split, tlm) — choice None when neither fits."""
    from ..lower.prepack import split_prepack

    param = packed_weight_param(graph, task.id, func) if prepack else None
    marked = mark_layout_free(func, param)
    choice, chosen_by, prefix, tlm = None, "heuristic", "", None
    if options.scheduler == "tlm":
        choice, why, tlm = _tlm_choice(marked, tvm_target, "x86", hardware, task.name, options,
                                       samples=max(0, options.tune - 2))
        if choice is not None:
            chosen_by = "tlm"
        else:
            prefix = f"tlm fallback: {why}; "
    if options.tune and options.scheduler in ("tlm", "heuristic"):
        tuned = _tune_x86(graph, task, func, param, tvm_target, hardware, choice, options)
        if tuned is not None:
            choice, chosen_by = tuned, "search"
    if choice is None:
        choice = schedule_with_rules(marked, tvm_target, "x86", hardware)
    if choice is None:
        return None, chosen_by, prefix, None, tlm
    split = None
    if param is not None:
        types, num_outputs = _arg_types(graph, task.id)
        split = split_prepack(choice.func, types, num_outputs, param)
    return choice, chosen_by, prefix, split, tlm


def _tlm_points(func, tvm_target, hardware, task_name: str, options: SelectOptions) -> list:
    """The TLM's greedy and top-k points whatever its confidence (--tune measures them anyway)."""
    from ..tlm.decode import decode_space
    from ..tlm.language import describe_task
    from ..tlm.model import TLMUnavailable, load

    try:
        tlm = load("x86", (options.tlm_weights or {}).get("x86"))
    except TLMUnavailable:
        return []
    hint = hint_for(tlm, func, tvm_target, "x86", hardware)
    return decode_space(tlm, DesignSpace(func, tvm_target), hardware, describe_task(func, task_name),
                        samples=max(0, options.tune - 2), hint=hint)


def _tune_x86(graph: Graph, task, func, param: int | None, tvm_target, hardware, tlm_choice: RuleChoice | None,
              options: SelectOptions) -> RuleChoice | None:
    """--tune: the fastest of the TLM's points and the rules' on this host, each timed as the
    kernel the build runs (weight ``param`` pre-packed), then replayed on the build's space; None
    when nothing could be measured."""
    from .space import fixed_decider
    from .tune import tune_task

    marked = mark_layout_free(func, param)
    started = time.perf_counter()
    if tlm_choice is not None:
        points = [tlm_choice, *tlm_choice.alternatives]
    else:  # the model fell back, but its candidates are measured with the rules' all the same
        points = _tlm_points(marked, tvm_target, hardware, task.name, options) if options.scheduler == "tlm" else []
    rules = schedule_with_rules(marked, tvm_target, "x86", hardware)
    num_outputs = next(c.num_outputs for c in graph.calls if c.task == task.id)
    tuned = tune_task(func, num_outputs, tvm_target, hardware.cores, points, rules, weight_param=param)
    if tuned is None:
        return None
    replayed = DesignSpace(marked, tvm_target).replay(tuned.sketch, fixed_decider(tuned.decisions), locations=True)
    if replayed is None:
        return None
    measured = ", ".join(f"{n} {t:.1f}" for n, t in sorted(tuned.latencies.items(), key=lambda kv: kv[1] or 1e30)
                         if t is not None and n in ("tlm_greedy", "heuristic"))
    note = f"fastest of {len(tuned.latencies)} measured here: {tuned.best_us:.1f} µs ({measured} µs)"
    return RuleChoice(tuned.sketch, replayed[0], replayed[1], note, 0.0, (time.perf_counter() - started) * 1e3)


def _choose_x86_or_unpacked(graph: Graph, task, func, tvm_target, hardware, prepack: bool, options: SelectOptions,
                            out: ScheduledTasks):
    """Pre-packing is optional: when TVM fails to split or pack a task's weight, the task is
    chosen again with the plain weight, and ``out.fallbacks`` says so."""
    from ..errors import Fallback, one_line

    try:
        return _choose_x86(graph, task, func, tvm_target, hardware, prepack, options)
    except Exception as e:
        if not prepack:
            raise
        out.fallbacks.append(Fallback("pre-packing", task.id, one_line(e)))
        return _choose_x86(graph, task, func, tvm_target, hardware, False, options)


def schedule_tasks(graph: Graph, target, target_id: str, scheduler: str | SelectOptions = "tlm",
                   vector_lanes: int = 8, progress: Callable[[str], None] | None = None, hardware: Any = None,
                   prepack: bool = True) -> ScheduledTasks:
    """Schedules every task for x86. ``tlm``: the model, the rules where it falls back;
    ``heuristic``: the first eligible rule of the registry; both with pre-packed weights, and
    tasks no rule fits get the fixed rules. ``baseline``: the fixed rules only."""
    from tvm import s_tir

    options = scheduler if isinstance(scheduler, SelectOptions) else SelectOptions(scheduler)
    if options.scheduler not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {options.scheduler!r}; expected one of {SCHEDULERS}")
    options = replace(options, scheduler=scheduler_for("x86", options.scheduler))
    if hardware is None:
        from .hardware import detect_x86

        hardware = detect_x86(("avx512f",) if vector_lanes >= 16 else ("avx2",))
    out = ScheduledTasks({}, [], {}, {}, {})
    for i, task in enumerate(graph.tasks):
        func = graph.task_funcs[task.id]
        started = time.perf_counter()
        scheduled, record, prefix = None, None, ""
        if options.scheduler in ("tlm", "heuristic"):
            choice, chosen_by, prefix, split, tlm = _choose_x86_or_unpacked(graph, task, func, target, hardware,
                                                                            prepack, options, out)
            if tlm is not None and chosen_by in ("tlm", "search"):
                out.tlm = tlm.to_json()
            if choice is not None:
                scheduled = split.kernel if split is not None else choice.func
                note = prefix + choice.rule + (f"; weight param {split.param} pre-packed to {list(split.packed_shape)}"
                                               if split is not None else "")
                record = ScheduleRecord(task.id, target_id, choice.sketch, choice.decisions, chosen_by, note)
                out.choose_ms[task.id] = choice.choose_ms
                if split is not None:
                    out.splits[task.id] = split
        if scheduled is None:
            fixed = fixed_schedule(func, target, vector_lanes)
            if fixed is None:
                scheduled = s_tir.Schedule(func).mod["main"]
                record = ScheduleRecord(task.id, target_id, -1, (), "unscheduled", "no legal point found")
            else:
                sketch, scheduled, decisions, who = fixed
                note = prefix + "no heuristic rule fits" if options.scheduler != "baseline" else ""
                record = ScheduleRecord(task.id, target_id, sketch, decisions, who, note)
        out.funcs[task.id] = scheduled
        out.records.append(record)
        out.total_ms[task.id] = (time.perf_counter() - started) * 1e3
        if progress:
            progress(f"[{i + 1}/{len(graph.tasks)}] {task.name} ({record.chosen_by}"
                     f"{', ' + record.note.split(';')[0] if record.chosen_by in ('heuristic', 'tlm', 'search') else ''}, "
                     f"{out.total_ms[task.id]:.0f} ms)")
    return out


def schedule_cuda_tasks(graph: Graph, target, progress: Callable[[str], None] | None = None,
                        scheduler: str | SelectOptions = "dlight") -> tuple[dict[str, Any], list[ScheduleRecord], dict | None]:
    """Schedules every task for CUDA (``target``: lower.cuda.CudaTarget); the record notes who
    chose. ``tlm``: the model, the cuda rules where it falls back, dlight where no rule fits;
    ``ranked``: the cost model's pick among the rules' point, its edits and the TLM's samples
    (ranked.py), then dlight; ``heuristic``: the rules, then dlight; ``dlight``/``baseline``: the first dlight rule that
    applies. Returns the kernels, the records and the TLM that chose (None if it chose none)."""
    from ..errors import LoweringError
    from .dlight import dlight_schedule
    from .hardware import cuda_hardware
    from .space import import_tensor_intrinsics

    options = scheduler if isinstance(scheduler, SelectOptions) else SelectOptions(scheduler)
    options = replace(options, scheduler=scheduler_for("cuda", options.scheduler))
    import_tensor_intrinsics(())  # dlight's Matmul may import the CUDA intrinsics: not the whole package
    tvm_target = target.tvm_target()
    funcs: dict[str, Any] = {}
    records: list[ScheduleRecord] = []
    started = time.perf_counter()
    hardware = cuda_hardware(target.ptx_arch) if options.scheduler in ("tlm", "heuristic", "ranked") else None
    timings: list[tuple[float, float]] = []
    tlm_json = None
    ranked = _ranked_cuda(graph, tvm_target, hardware, options) if options.scheduler == "ranked" else None
    for i, task in enumerate(graph.tasks, 1):
        func = graph.task_funcs[task.id]
        prefix = ""
        if options.scheduler == "tlm":
            choice, why, tlm = _tlm_choice(func, tvm_target, "cuda", hardware, task.name, options)
            if choice is not None:
                tlm_json = tlm.to_json()
                funcs[task.id] = choice.func.with_attr("tirx.is_scheduled", True)
                records.append(ScheduleRecord(task.id, "cuda", choice.sketch, choice.decisions, "tlm", choice.rule))
                timings.append((choice.choose_ms, choice.total_ms))
                continue
            prefix = f"tlm fallback: {why}; "
        if options.scheduler == "ranked":
            picked, prefix = next(ranked)
            if picked is not None:
                funcs[task.id] = picked.candidate.func.with_attr("tirx.is_scheduled", True)
                records.append(ScheduleRecord(task.id, "cuda", picked.candidate.sketch, picked.candidate.decisions,
                                              picked.chosen_by, picked.note))
                timings.append((picked.choose_ms, picked.choose_ms))
                tlm_json = (picked.tlm.to_json() if picked.tlm else {}) | {"cost_model": picked.cost_model.to_json()}
                if progress:  # about 1.7 s a task: say where it is
                    progress(f"[{i}/{len(graph.tasks)}] {task.name}: {picked.note} ({picked.choose_ms:.0f} ms)")
                continue
        if hardware is not None:
            choice = schedule_with_rules(func, tvm_target, "cuda", hardware)
            if choice is not None:
                funcs[task.id] = choice.func.with_attr("tirx.is_scheduled", True)
                records.append(ScheduleRecord(task.id, "cuda", choice.sketch, choice.decisions, "heuristic",
                                              prefix + choice.rule))
                timings.append((choice.choose_ms, choice.total_ms))
                continue
        scheduled, rule_name, failures = dlight_schedule(func, tvm_target)
        if scheduled is None:
            raise LoweringError(f"task {task.id} ({task.name}): no dlight GPU rule applies"
                                + (f" ({'; '.join(failures)})" if failures else ""))
        funcs[task.id] = scheduled.with_attr("tirx.is_scheduled", True)
        records.append(ScheduleRecord(task.id, "cuda", -1, (), "dlight", prefix + rule_name))
    if progress:
        counts: dict[str, int] = {}
        for r in records:
            counts[r.chosen_by] = counts.get(r.chosen_by, 0) + 1
        progress(f"{options.scheduler} scheduled {len(records)} CUDA tasks in {time.perf_counter() - started:.1f} s ("
                 + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + ")")
        if timings:
            choose, total = [t[0] for t in timings], [t[1] for t in timings]
            progress(f"choosing ms per task: mean {sum(choose) / len(choose):.2f}, max {max(choose):.2f}; "
                     f"with design space + replay: mean {sum(total) / len(total):.0f}, max {max(total):.0f}")
    return funcs, records, tlm_json


def _ranked_cuda(graph: Graph, tvm_target, hardware: Any, options: SelectOptions) -> Iterator[tuple[Any, str]]:
    """Per task in order: (the ranked pick, "") or (None, the fallback note's prefix) when no cost
    model is installed or no rule fits (the rules, then dlight, take the task). Ranked in worker
    processes where the host has the CPUs (ranked.build_jobs)."""
    from ..tlm.cost_model import CostModelUnavailable
    from .ranked import build_jobs, rank_tasks

    tasks = [(graph.task_funcs[task.id], task.name) for task in graph.tasks]
    picks = rank_tasks(tasks, tvm_target, "cuda", hardware, (options.tlm_weights or {}).get("cuda"),
                       jobs=build_jobs(len(tasks)))
    try:
        for picked in picks:
            yield picked, ("" if picked is not None else "ranked fallback: no rule fits; ")
    except CostModelUnavailable as e:
        for _ in tasks:
            yield None, f"ranked fallback: {e}; "
