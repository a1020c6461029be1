"""Optional transformations with fallbacks: a valid model must build, at worst a little slower.

The channels-last conversion (and layout_ops.py's rewrites, which serve it), TVM's
FastMathTransform, constant folding and the padding of awkward matmul extents only make kernels faster. TVM 0.27 trips over some graphs (ConvertLayout on a tuple such
as ``R.nn.dropout`` with its mask used: ``Expected nested to match tuple``), so ``lower_graph``
tries the full set first and switches transformations off one at a time, for the whole graph
(Relax passes run on the whole module), until lowering and partitioning succeed. Per task,
``x86_kernels_with_fallback`` and ``cuda_kernels_with_fallback`` replace a schedule TVM cannot
compile, and schedule/select.py drops a pre-packing that fails. Each one is a ``Fallback``
record: the build log says it and the manifest lists it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .errors import Fallback, LoweringError, TlmpackBuildError, one_line


@dataclass(frozen=True)
class Lowering:
    """Which optional transformations one attempt applies."""

    conv_layout: str | None
    fast_math: bool
    fold_constants: bool = True
    pad: Any = None  # a relax_rewrites.PadPolicy: the multiples awkward matmul extents are padded to; None: off
    layout_ops: bool = True  # layout_ops.py, with a conv layout only
    matmul_views: bool = False  # matmul_views.py: reshapes and head transposes around matmuls folded (CUDA graphs)
    cores: int = 0  # the x86 target's cores and vector lanes, for the graph's parallel splits (layout_ops.pool_parts)
    lanes: int = 16


def _any(error: Exception) -> bool:
    return True


def _layout_rewrite(error: Exception) -> bool:
    from .graph.layout_ops import LayoutRewriteError

    return isinstance(error, LayoutRewriteError)


# (transformation name, how to switch it off, whether applied, whether an error can be its), in the
# order they are given up; layout_ops.py's rewrites report their own failures, so a ConvertLayout
# failure turns channels-last off, not them
_OPTIONAL = (
    ("matmul-views", lambda lw: replace(lw, matmul_views=False), lambda lw: lw.matmul_views, _any),
    ("layout-ops", lambda lw: replace(lw, layout_ops=False), lambda lw: lw.layout_ops and lw.conv_layout is not None,
     _layout_rewrite),
    ("channels-last", lambda lw: replace(lw, conv_layout=None), lambda lw: lw.conv_layout is not None, _any),
    ("fast-math", lambda lw: replace(lw, fast_math=False), lambda lw: lw.fast_math, _any),
    ("pad-awkward-extents", lambda lw: replace(lw, pad=None), lambda lw: lw.pad is not None, _any),
    ("constant-folding", lambda lw: replace(lw, fold_constants=False), lambda lw: lw.fold_constants, _any),
)


def _conv_tile(lowering: Lowering) -> tuple[int, int]:
    """(pixels, channels) of the register tile a channels-last convolution is widened for
    (conv_width.py), part of the awkward-extents padding: the x86 rows its policy pads matmuls to and
    its widest column multiple; (0, 0), no widening, without it."""
    if lowering.pad is None or lowering.conv_layout != "NHWC" or not lowering.pad.rows:
        return 0, 0
    return lowering.pad.rows[0], lowering.pad.multiples[0]


def lower_graph(mod, wanted: Lowering, task_prefix: str = "k",
                say: Callable[[str], None] = lambda s: None, materialize: bool = True):
    """Fused TIR + partition of ``mod`` with as many of ``wanted``'s optional transformations as
    TVM gets through. Returns (graph, the Lowering used, fallbacks). A failure with none left is
    the model's: a LoweringError (an UnsupportedOperatorError from partition passes through).
    ``materialize``: as graph.partition's."""
    from .graph import fuse_to_tir, partition
    from .graph.matmul_views import rewrite_matmul_views
    from .graph.relax_rewrites import pad_awkward_extents

    current, fallbacks = wanted, []
    while True:
        culprit = None  # a failure inside our own rewrite switches that rewrite off first
        try:
            culprit = "pad-awkward-extents"
            padded, count = pad_awkward_extents(mod, current.pad) if current.pad is not None else (mod, 0)
            culprit = "matmul-views"
            padded, lifts, folds = rewrite_matmul_views(padded) if current.matmul_views else (padded, 0, 0)
            culprit = None
            graph = partition(fuse_to_tir(padded, fast_math=current.fast_math, conv_layout=current.conv_layout,
                                          fold_constants=current.fold_constants, pad_policy=None,
                                          layout_ops=current.layout_ops, conv_tile=_conv_tile(current),
                                          cores=current.cores, lanes=current.lanes),
                              task_prefix=task_prefix, materialize=materialize)
            graph.padded_matmuls = count
            if lifts or folds:
                say(f"matmul views: {lifts} row reshapes after 2-D products lifted before them, "
                    f"{folds} head transposes folded into the matmuls around them")
            if count:
                say(f"{count} matmuls over awkward extents computed padded (rows to multiples of "
                    f"{'/'.join(map(str, current.pad.rows or current.pad.multiples))}, columns and reductions "
                    f"of {'/'.join(map(str, current.pad.multiples))}) and sliced back")
            return graph, current, fallbacks
        except TlmpackBuildError as e:
            if not isinstance(e, LoweringError):
                raise  # an operator the plan cannot run: no transformation changes that
            error: Exception = e
        except Exception as e:  # TVM's InternalError, TypeError, ... from a pass
            error = e
        steps = [(name, off) for name, off, applied, blamed in _OPTIONAL if applied(current) and blamed(error)]
        step = next((st for st in steps if st[0] == culprit), steps[0] if steps else None)
        if step is None:
            if isinstance(error, LoweringError):
                raise error
            raise LoweringError(f"Relax could not lower the model to TIR: {one_line(error)}") from None
        name, off = step
        fallback = Fallback(name, "graph", one_line(error).removeprefix("LoweringError: "))
        say(fallback.sentence())
        fallbacks.append(fallback)
        current = off(current)


def cuda_kernels_with_fallback(funcs: dict, records: list, graph, cuda, out_dir, say: Callable[[str], None]):
    """lower.cuda.build_kernels, and when TVM fails to generate code for the chosen schedules
    (``Check failed: (!load_remap_.count(alloc_key))`` on a TLM/rule point), finds the tasks that
    fail alone and gives them dlight's schedule (the first release's CUDA scheduler). Returns
    (kernels, records, fallbacks); a failure dlight cannot mend is the original LoweringError."""
    from dataclasses import replace as replace_record

    from .lower.cuda import build_kernels, generate
    from .schedule.dlight import dlight_schedule

    try:
        return build_kernels(funcs, cuda, out_dir, say), records, []
    except LoweringError as e:
        if "TVM failed to build the CUDA kernels" not in str(e):
            raise
        original = e
    tvm_target = cuda.tvm_target()
    funcs, fallbacks = dict(funcs), []
    by_task = {r.task: i for i, r in enumerate(records)}
    records = list(records)
    for task_id, func in list(funcs.items()):
        try:
            generate({task_id: func}, cuda)
            continue
        except LoweringError as e:
            reason = one_line(e).removeprefix("LoweringError: ").replace("TVM failed to build the CUDA kernels: ", "")
        scheduled, rule, _ = dlight_schedule(graph.task_funcs[task_id], tvm_target)
        if scheduled is None:
            raise original from None
        funcs[task_id] = scheduled.with_attr("tirx.is_scheduled", True)
        index = by_task[task_id]
        records[index] = replace_record(records[index], sketch=-1, decisions=(), chosen_by="dlight",
                                        note=f"code generation failed for the {records[index].chosen_by} schedule; {rule}")
        fallback = Fallback("cuda-schedule", task_id, reason)
        say(fallback.sentence())
        fallbacks.append(fallback)
    if not fallbacks:
        raise original from None
    return build_kernels(funcs, cuda, out_dir, say), records, fallbacks


def _x86_compiles(func, task_id: str, target, probe) -> bool:
    from .lower.x86 import build_kernels

    try:
        build_kernels({task_id: func}, target, probe)
        return True
    except LoweringError:
        return False


def x86_kernels_with_fallback(scheduled, graph, target, out_object, vector_lanes: int,
                              say: Callable[[str], None]) -> list:
    """lower.x86.build_kernels, and when TVM fails to compile the chosen schedules, finds the tasks
    that fail alone and gives them the fixed rules' schedule on the plain weight (their weight is
    no longer pre-packed), or TVM's unscheduled loop nest. Changes ``scheduled`` (funcs, records,
    splits) in place; returns the fallbacks. Call it before pre-packing: a dropped split must not
    be packed."""
    import tempfile
    from dataclasses import replace as replace_record
    from pathlib import Path

    from .lower.x86 import build_kernels
    from .schedule.select import fixed_schedule

    try:
        build_kernels(scheduled.funcs, target, out_object)
        return []
    except LoweringError as e:
        if "TVM failed to build the x86 kernels" not in str(e):
            raise
        original = e
    fallbacks = []
    by_task = {r.task: i for i, r in enumerate(scheduled.records)}
    with tempfile.TemporaryDirectory(prefix="tlmpack-x86-probe-") as tmp:
        for task_id, func in list(scheduled.funcs.items()):
            try:
                build_kernels({task_id: func}, target, Path(tmp) / "probe.o")
                continue
            except LoweringError as e:
                reason = one_line(e).removeprefix("LoweringError: ").replace("TVM failed to build the x86 kernels: ", "")
            from tvm import s_tir

            plain = graph.task_funcs[task_id]
            fixed = fixed_schedule(plain, target.tvm_target(), vector_lanes)
            if fixed is not None and not _x86_compiles(fixed[1], task_id, target, Path(tmp) / "probe.o"):
                fixed = None  # the rules' schedule trips the same TVM bug (the TLM had fallen back to it)
            index = by_task[task_id]
            was = scheduled.records[index].chosen_by
            if fixed is not None:
                sketch, func, decisions, who = fixed
                record = replace_record(scheduled.records[index], sketch=sketch, decisions=decisions, chosen_by=who,
                                        note=f"compiling the {was} schedule failed")
            else:
                func = s_tir.Schedule(plain).mod["main"]
                record = replace_record(scheduled.records[index], sketch=-1, decisions=(), chosen_by="unscheduled",
                                        note=f"compiling the {was} schedule failed")
            scheduled.funcs[task_id] = func
            scheduled.records[index] = record
            scheduled.splits.pop(task_id, None)
            fallback = Fallback("x86-schedule", task_id, reason)
            say(fallback.sentence())
            fallbacks.append(fallback)
    if not fallbacks:
        raise original from None
    build_kernels(scheduled.funcs, target, out_object)
    return fallbacks
