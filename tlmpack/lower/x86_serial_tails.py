"""Run a one-chunk kernel's large element-wise tail on every thread.

A squeeze-excite gate is a 1x1 convolution over one pixel (8 -> 32 channels in EfficientNet-B0's first
block) whose tail scales a whole feature map by its sigmoid (112 x 112 x 32). The x86 rule computes the
tail inside the tile (heuristics/x86_matmul.py: at the root the sigmoid is recomputed behind a fused,
divided index), and the tile is the whole gate, so the kernel has no parallel loop at all: the map's
1.6 MB are read and written by one thread while the others wait. On the 16-core Xeon that kernel took
146 us at 4 threads and 188 us at 16 (BENCHMARKS.md 2026-12-06 19:30).

This pass finds such a kernel (no parallel loop anywhere) and, where a loop nest of its body that runs
once per call writes a spatial block of at least MIN_TAIL_ELEMENTS elements, makes that nest's
outermost loop of more than one iteration parallel. Every iteration writes its own elements, so the
result is bit-for-bit the same; only the thread that runs each one changes.
"""

from __future__ import annotations

import math
from typing import Any

from .tir_rebuild import loop_nest, loop_with, realize_with_body

MIN_TAIL_ELEMENTS = 16384  # a launch of the pool costs a few us: below this the tail is cheaper alone


def parallel_serial_tails(func: Any) -> Any:
    """``func`` with its large once-run element-wise nests parallel, when it has no parallel loop
    (else ``func`` itself)."""
    if _has_parallel(func.body):
        return func
    body, changed = _rewrite(func.body)
    return func.with_body(body) if changed else func


def _has_parallel(stmt: Any) -> bool:
    """Whether a parallel loop is anywhere under ``stmt`` (loops, sequences, blocks, branches)."""
    from tvm import tirx

    if stmt is None:
        return False
    if isinstance(stmt, tirx.For) and stmt.kind == tirx.ForKind.PARALLEL:
        return True
    if isinstance(stmt, tirx.SeqStmt):
        return any(_has_parallel(s) for s in stmt.seq)
    children = [getattr(stmt, name, None) for name in ("body", "block", "init", "then_case", "else_case")]
    return any(_has_parallel(c) for c in children if c is not None and not isinstance(c, (int, float)))


def _rewrite(stmt: Any) -> tuple[Any, bool]:
    """Descends through the root block, sequences and loops of one iteration (code that runs once
    per call) and rewrites the large spatial nests it meets there."""
    from tvm import s_tir, tirx

    if isinstance(stmt, s_tir.SBlockRealize):
        block = stmt.block
        if block.init is not None or len(block.iter_vars) > 0:
            return stmt, False
        body, changed = _rewrite(block.body)
        if not changed:
            return stmt, False
        return realize_with_body(stmt, body), True
    if isinstance(stmt, tirx.SeqStmt):
        parts = [_parallel_nest(s) or _rewrite(s) for s in stmt.seq]
        if not any(changed for _, changed in parts):
            return stmt, False
        return tirx.SeqStmt([s for s, _ in parts]), True
    if isinstance(stmt, tirx.For) and _extent(stmt) == 1:
        body, changed = _rewrite(stmt.body)
        if not changed:
            return stmt, False
        return loop_with(stmt, body), True
    return stmt, False


def _parallel_nest(stmt: Any) -> tuple[Any, bool] | None:
    """The nest with its outermost multi-iteration loop parallel, where ``stmt`` is a perfect serial
    nest around one spatial block of at least MIN_TAIL_ELEMENTS iterations; else None."""
    from tvm import tirx

    nest = loop_nest(stmt)
    if nest is None:
        return None
    loops, inner = nest
    block = inner.block
    extents = [_extent(loop) for loop in loops]
    if (block.init is not None or any(v.iter_type != tirx.IterVar.DataPar for v in block.iter_vars)
            or None in extents or math.prod(extents) < MIN_TAIL_ELEMENTS):
        return None
    at = next(i for i, e in enumerate(extents) if e > 1)
    if loops[at].kind != tirx.ForKind.SERIAL:
        return None
    rebuilt = inner
    for i in reversed(range(len(loops))):
        rebuilt = loop_with(loops[i], rebuilt, tirx.ForKind.PARALLEL if i == at else None)
    return rebuilt, True


def _extent(loop: Any) -> int | None:
    try:
        return int(loop.extent)
    except (TypeError, ValueError):
        return None
