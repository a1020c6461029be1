"""A sketch appended to the x86 design space of a channels-last broadcast (after MetaSchedule's own,
so stored sketch indexes keep their meaning): every loop but the last fused and parallel, the last
(the channels) vectorised in whole steps.

MetaSchedule's llvm sketch of an element-wise block leaves the loops to the postprocessor, which
fuses all of them into one and vectorises 64 elements at a time. Where an operand broadcasts over
all but the last axis (a squeeze-excite gate: ``x[n, h, w, c] * g[n, 0, 0, c]``) and the channels
are no divisor of 64, each vector step then reads the gate at ``fused % C``, a gather: EfficientNet-B0's
56 x 56 x 144 gate took 340-400 us on two threads of the AVX-512 EPYC, its 112 x 112 x 32 one (32
divides 64) 45 us for about as many bytes. With the channels as the vector loop the gate is one
contiguous load a step.

The sketch has no sampling sites: it is one program. It serves tasks of one element-wise block
whose last loop indexes the last axis of every buffer directly and that read at least one buffer
broadcast over the other loops; transposes, pads and plain element-wise kernels keep MetaSchedule's
sketch.
"""

from __future__ import annotations

from typing import Any

from .x86_window_sketch import MIN_STEP, vectorize_channels

MARK = "Vectorize"  # in DesignSpace.steps: MetaSchedule's element-wise sketch leaves vectors to its postprocessor


def broadcast_sketches(mod) -> list[Any]:
    """The appended sketch for ``mod["main"]``, empty when it is no channels-last broadcast."""
    from tvm import s_tir

    sch = s_tir.Schedule(mod)
    try:
        block = _broadcast_block(sch)
        if block is None:
            return []
        loops = sch.get_loops(block)
        sch.parallel(sch.fuse(*loops[:-1]))
        vectorize_channels(sch, loops[-1])
    except Exception:  # noqa: BLE001 — TVM refuses a shape this sketch did not foresee: no sketch
        return []
    return [sch]


def _broadcast_block(sch):
    """The task's one block, when it is element-wise over at least two loops, its last loop indexes
    the last axis of every buffer it touches directly, and one read ignores every other loop."""
    from tvm import tirx

    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    if len(blocks) != 1:
        return None
    block = sch.get(blocks[0])
    iters = block.iter_vars
    if len(iters) < 2 or any(int(iv.iter_type) != tirx.IterVar.DataPar for iv in iters):
        return None
    if len(sch.get_loops(blocks[0])) != len(iters) or int(iters[-1].dom.extent) < MIN_STEP:
        return None
    channel = iters[-1].var
    regions = [*block.reads, *block.writes]
    if any(not (isinstance(r.region[-1].min, tirx.Var) and r.region[-1].min.same_as(channel)) for r in regions):
        return None
    others = [iv.var for iv in iters[:-1] if int(iv.dom.extent) > 1]

    def follows_others(region) -> bool:
        return any(isinstance(r.min, tirx.Var) and any(r.min.same_as(v) for v in others) for r in region.region[:-1])

    broadcast = [r for r in block.reads if not follows_others(r)]
    if not broadcast or len(broadcast) == len(block.reads):
        return None
    return blocks[0]
