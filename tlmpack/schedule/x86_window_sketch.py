"""A sketch appended to the x86 design space of channels-last pooling (after MetaSchedule's own,
so stored sketch indexes keep their meaning): the window loops outside the channel loop, and the
channels as the vector.

MetaSchedule's llvm sketches keep a pooling's reduction loops innermost, inside the loop over
channels, so in NHWC nothing is vectorised: every output channel takes its 9 window reads one
scalar at a time, and the padding is a whole padded copy of the input. ResNet-50's 3x3 stride-2
max pool (112x112x64) took 132 us on one thread of the AVX-512 EPYC that way, 75 us on two, and
the rules' point of that space is the best of it (`--tune 16` found 60 us at best). With the
window outside the channels, the padding inlined (its test depends on the row and column, not on
the channel) and the channels as one vector a step, it took 80 and 30 us (BENCHMARKS.md
2026-12-04).

The sketch has no sampling sites: it is one program. It serves tasks whose one reduction block is
TOPI's pool (``pool_max``, ``pool_sum``) and whose last output loop indexes every read's last
axis directly (channels-last); an NCHW pool's last loop is a strided column and keeps
MetaSchedule's sketches.
"""

from __future__ import annotations

from typing import Any

POOL_BLOCKS = ("pool_max", "pool_sum")
VECTOR_CHUNK = 64  # channels a vector step: 4 AVX-512 or 8 AVX2 registers
MIN_STEP = 8  # channels: narrower steps are no vector worth the sketch
MARK = "DecomposeReduction"  # in DesignSpace.steps: how the rules tell this sketch apart


def window_sketches(mod) -> list[Any]:
    """The appended sketch for ``mod["main"]``, empty when it is no channels-last pooling."""
    from tvm import s_tir

    sch = s_tir.Schedule(mod)
    try:
        block = _pool_block(sch)
        if block is None:
            return []
        _schedule(sch, block)
    except Exception:  # noqa: BLE001 — TVM refuses a shape this sketch did not foresee: no sketch
        return []
    return [sch]


def _pool_block(sch):
    """The task's one pooling reduction block, when its last spatial loop is the channel axis of
    every buffer it reads and writes."""
    from tvm import tirx

    found = [b for b in sch.get_child_blocks(sch.get_sblock("root")) if sch.get(b).name_hint in POOL_BLOCKS]
    if len(found) != 1:
        return None
    block = sch.get(found[0])
    spatial = [iv for iv in block.iter_vars if int(iv.iter_type) == tirx.IterVar.DataPar]
    reduce = [iv for iv in block.iter_vars if int(iv.iter_type) == tirx.IterVar.CommReduce]
    if not spatial or not reduce or len(spatial) + len(reduce) != len(block.iter_vars):
        return None
    channel = spatial[-1].var
    for region in [*block.reads, *block.writes]:
        last = region.region[-1].min
        if not (isinstance(last, tirx.Var) and last.same_as(channel)):
            return None
    if len(sch.get_loops(found[0])) != len(block.iter_vars):
        return None
    return found[0]


def _schedule(sch, block) -> None:
    """Producers inlined; loops (outer spatial..., window..., channels); the outer two spatial loops
    fused and parallel; channels split into vector chunks; the init decomposed above the window.
    Consumers (an average's division) follow each output row, vectorised the same way."""
    from tvm import tirx

    for producer in sch.get_producers(block):
        sch.compute_inline(producer)
    iters = sch.get(block).iter_vars
    loops = sch.get_loops(block)
    spatial = [lp for lp, iv in zip(loops, iters, strict=True) if int(iv.iter_type) == tirx.IterVar.DataPar]
    window = [lp for lp, iv in zip(loops, iters, strict=True) if int(iv.iter_type) == tirx.IterVar.CommReduce]
    sch.reorder(*spatial[:-1], *window, spatial[-1])
    outer = sch.fuse(*spatial[:-2]) if len(spatial) > 2 else spatial[0]
    sch.parallel(outer)
    row = spatial[-2] if len(spatial) > 2 else outer
    vectorize_channels(sch, spatial[-1])
    sch.decompose_reduction(block, window[0])
    for consumer in sch.get_consumers(block):
        sch.reverse_compute_at(consumer, row)
        vectorize_channels(sch, sch.get_loops(consumer)[-1])


def vectorize_channels(sch, loop) -> None:
    """Vectorises ``loop`` (the channels) in steps of ``vector_step`` of its extent."""
    extent = int(sch.get(loop).extent)
    step = vector_step(extent)
    if step < extent:
        loop = sch.split(loop, [None, step])[1]
    sch.vectorize(loop)


def vector_step(channels: int) -> int:
    """The channels one vector step takes: the largest divisor up to VECTOR_CHUNK that is a whole
    number of 16-lane, else 8-lane, vectors (144 -> 48, 240 -> 48, 32 -> 32); else the largest divisor
    of at least MIN_STEP (refused below it)."""
    divisors = [d for d in range(1, min(channels, VECTOR_CHUNK) + 1) if channels % d == 0]
    for lanes in (16, 8):
        whole = [d for d in divisors if d % lanes == 0]
        if whole:
            return max(whole)
    if max(divisors) < MIN_STEP:
        raise ValueError(f"{channels} channels have no vector step of at least {MIN_STEP}")
    return max(divisors)
