"""Prefetch an x86 tile's epilogue lines while its reduction runs.

A convolution whose element-wise tail is computed inside its tile (bias, ReLU, a residual add)
reads the residual and writes the output one tile at a time, after the tile's reduction: a few
64-byte lines a pixel, at a stride of the channel count (1-8 KB in ResNet-50). Inside a model
those lines are not in cache (the residual was written kernels ago, the output region last held
another tensor), and at that stride the hardware prefetchers do not follow, so every tile's tail
waits on memory. ResNet-50's residual 1x1 convolutions ran 1.27-1.42x their in-cache time inside
the model on a Zen 2 EPYC (docs/x86-performance-notes.md, section 7).

This pass puts, at the start of such a tile, one software prefetch per line its tail will read
(the tensors shaped like the output) and write (the output, as a write prefetch), so the lines
arrive while the tile's multiply-adds run. Prefetches are hints: they never fault and never
change a result. The pass changes nothing else and leaves kernels without that shape alone.
"""

from __future__ import annotations

import math
from typing import Any

from .tir_rebuild import loop_nest, loop_with, realize_with_body

LINE_BYTES = 64
MAX_LINES = 256  # more than a register tile's tail: not the shape this pass is for
UNROLL_LINES = 32  # prefetch nests up to this many lines are unrolled, larger ones stay loops


def prefetch_epilogue_lines(func: Any) -> Any:
    """``func`` with its in-tile epilogues' lines prefetched at the start of their tiles (or
    ``func`` itself where it has none)."""
    params = [p for p in func.params if hasattr(p, "shape")]
    body, changed = _rewrite(func.body, params)
    return func.with_body(body) if changed else func


def _rewrite(stmt: Any, params: list) -> tuple[Any, bool]:
    """Rebuilds the path to every loop whose body runs a reduction and then an epilogue."""
    from tvm import s_tir, tirx

    if isinstance(stmt, s_tir.SBlockRealize):
        block = stmt.block
        if block.init is not None or len(block.iter_vars) > 0:
            return stmt, False
        body, changed = _rewrite(block.body, params)
        if not changed:
            return stmt, False
        return realize_with_body(stmt, body), True
    if isinstance(stmt, tirx.SeqStmt):
        parts = [_rewrite(s, params) for s in stmt.seq]
        if not any(changed for _, changed in parts):
            return stmt, False
        return tirx.SeqStmt([s for s, _ in parts]), True
    if isinstance(stmt, tirx.For):
        body, changed = _rewrite(stmt.body, params)
        if not changed and isinstance(stmt.body, tirx.SeqStmt) and len(stmt.body.seq) >= 2:
            found = [_epilogue_prefetch(s, params) for s in list(stmt.body.seq)[1:]]
            prefetches = [p for p in found if p is not None]
            if prefetches:
                body, changed = tirx.SeqStmt([*prefetches, *stmt.body.seq]), True
        if not changed:
            return stmt, False
        return loop_with(stmt, body), True
    return stmt, False


def _epilogue_prefetch(stmt: Any, params: list) -> Any | None:
    """The prefetch nest for an epilogue (a loop nest around a block that stores a function
    parameter, contiguous along its innermost loop), or None."""
    import tvm
    from tvm import tirx
    from tvm.ir.prim import expr as prim

    from ..schedule.heuristics.classify import buffer_loads

    nest = loop_nest(stmt)
    if nest is None:
        return None
    loops, realize = nest
    block, store = realize.block, realize.block.body
    if block.init is not None or not isinstance(store, tirx.BufferStore):
        return None
    out = store.buffer
    if not any(out.same_as(p) for p in params) or not all(isinstance(x, prim.IntImm) for x in out.shape):
        return None
    if not all(isinstance(lp.extent, prim.IntImm) for lp in loops):
        return None
    inner = loops[-1]
    lanes_per_line = max(LINE_BYTES * 8 // tvm.DataType(out.dtype).bits, 1)
    lines = -(-int(inner.extent) // lanes_per_line)
    total = lines * math.prod(int(lp.extent) for lp in loops[:-1])
    if total > MAX_LINES:
        return None

    accesses = [(out, list(store.indices), 1)] + [
        (load.source, list(load.indices), 0) for load in buffer_loads(store.value, through_calls=True)
        if any(load.source.same_as(p) for p in params) and not load.source.same_as(out)
        and [int(x) for x in load.source.shape] == [int(x) for x in out.shape]]
    iter_vars = [iv.var for iv in block.iter_vars]
    if not all(_contiguous_in_last(indices, iter_vars, realize, inner.loop_var) for _, indices, _ in accesses):
        return None
    loop_vars = [lp.loop_var for lp in loops]
    fresh = [tirx.Var(v.name + "_prefetch", v.ty) for v in loop_vars]
    moved = [*fresh[:-1], fresh[-1] * lanes_per_line + inner.min]
    bindings = tirx.IndexMap(loop_vars, list(realize.iter_values), None).map_indices(moved)
    calls = [tirx.Evaluate(_prefetch(tirx.BufferLoad(buffer, tirx.IndexMap(iter_vars, indices, None).map_indices(bindings)),
                                     write)) for buffer, indices, write in accesses]
    body: Any = tirx.SeqStmt(calls) if len(calls) > 1 else calls[0]
    predicate = realize.predicate
    if not (isinstance(predicate, prim.IntImm) and int(predicate) == 1):
        body = tirx.IfThenElse(tirx.IndexMap(loop_vars, [predicate], None).map_indices(moved)[0], body, None)
    kind = tirx.ForKind.UNROLLED if total <= UNROLL_LINES else tirx.ForKind.SERIAL
    body = tirx.For(fresh[-1], 0, lines, kind, body)
    for lp, var in zip(reversed(loops[:-1]), reversed(fresh[:-1]), strict=True):
        body = tirx.For(var, lp.min, lp.extent, kind, body)
    return body


def _prefetch(element: Any, write: int) -> Any:
    """LLVM's prefetch of the line holding ``element``: read or write, keep in every cache level."""
    from tvm import tirx

    return tirx.call_llvm_intrin("void", "llvm.prefetch.p0", tirx.address_of(element), tirx.const(write, "int32"),
                                 tirx.const(3, "int32"), tirx.const(1, "int32"))


def _contiguous_in_last(indices: list, iter_vars: list, realize: Any, inner_var: Any) -> bool:
    """Whether the innermost loop moves only the last index (so its lanes share lines)."""
    moved_by_inner = [iv for iv, value in zip(iter_vars, realize.iter_values, strict=True) if _mentions(value, inner_var)]
    return not any(_mentions(index, iv) for index in indices[:-1] for iv in moved_by_inner)


def _mentions(expr: Any, var: Any) -> bool:
    from tvm import tirx

    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr))
