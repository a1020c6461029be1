"""Copies of TIR nodes with one part replaced, for the passes that rewrite scheduled kernels
(x86_prefetch.py, x86_serial_tails.py): TVM's nodes are immutable, and each pass rebuilds the path
from the function's root down to what it changes."""

from __future__ import annotations

from typing import Any


def realize_with_body(realize: Any, body: Any) -> Any:
    """``realize`` (a block realize, e.g. the root block) with its block's body replaced."""
    from tvm import s_tir

    block = realize.block
    new_block = s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, body, block.init,
                             block.alloc_buffers, block.match_buffers, block.annotations)
    return s_tir.SBlockRealize(realize.iter_values, realize.predicate, new_block)


def loop_with(loop: Any, body: Any, kind: Any = None) -> Any:
    """``loop`` with its body replaced, and its kind where ``kind`` is given."""
    from tvm import tirx

    return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind if kind is None else kind, body,
                    loop.thread_binding, loop.annotations)


def loop_nest(stmt: Any) -> tuple[list, Any] | None:
    """(loops, block realize) where ``stmt`` is a perfect loop nest around one block; else None."""
    from tvm import s_tir, tirx

    loops = []
    while isinstance(stmt, tirx.For):
        loops.append(stmt)
        stmt = stmt.body
    return (loops, stmt) if loops and isinstance(stmt, s_tir.SBlockRealize) else None
