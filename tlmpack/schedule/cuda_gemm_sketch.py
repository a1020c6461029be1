"""Two GEMM sketches appended to the CUDA design space of dense / batch-matmul tasks (after
MetaSchedule's own, so stored sketch indexes keep their meaning): ``gemm`` and ``gemm-splitk``.

Both are traces of ordinary schedule instructions whose choices are sampling instructions, so the
Space Builder lists them as sites and replays them like any other sketch:

- a block tile of BM x BN outputs computed by (BM/TM) x (BN/TN) threads, each holding a TM x TN
  register tile (``i``, ``j``: 3-way tiles grid / threads / registers; the thread loops are fused
  into threadIdx.x with N fastest, so a warp spans N and reads the A tile by broadcast);
- the K loop split into outer steps of BK (``k``: 2-way tile; ``gemm-splitk``: 3-way, its
  outermost factor split off by rfactor into a grid dimension, with a second small kernel adding
  the partial sums);
- both operand tiles staged in shared memory (rows padded by 4 words: 16-byte aligned, fewer bank
  conflicts) by cooperative fetches whose vector length is a categorical site (1, 2 or 4 words:
  4 is a float4 load, a 16-byte cp.async once pipelined);
- a two-stage software pipeline over the K loop (``software_pipeline_stage`` [0, 0, 1]; on sm_80+
  the copy stage is asynchronous, ``software_pipeline_async_stages`` [0], and lower/cuda.py's
  ``tirx.use_async_copy`` turns its copies into 16-byte cp.async), and an unroll-depth site.

Tasks with one multiply-accumulate block over one reduction loop whose inputs each ignore exactly
one output loop (A ignores N, B ignores M; other loops batch) get them; injective producers are
inlined into the GEMM and injective consumers into its write-back.

Convolutions (NCHW: ``out[n, co, h, w] += X[n, ci, h*s + kh, w*s + kw] * W[co, ci, kh, kw]``, the
padded input ``pad_temp`` as X) get them as implicit GEMMs (conv_loops): M = the one loop X ignores
(co), N = h and w fused, K = the reduction loops (ci, kh, kw) fused, n a batch loop of the grid. W
is A and X is B, so a warp spans N (the output's contiguous loops) and reads W's tile by broadcast.
The padding block is not inlined into the GEMM: X's shared tile is cached from ``pad_temp`` and the
padding is then inlined into that copy (the staged region is a box of pad_temp: a 3x3 window's halo
is fetched once a tile). The accumulators' local buffer is re-laid out by the fused (h, w), so a
thread's register tile has constant indices. The staged tiles are padded on their outermost axis
(a 4-D tile's row is not a GEMM row). Sites and their order are the GEMM's, so the cuda-gemm rule
decides both; which tile shapes keep the staged box constant is the rule's business
(heuristics/cuda_gemm.py: whole rows or images, whole windows a K step).
"""

from __future__ import annotations

import os
from itertools import permutations
from typing import Any

SKETCH_NAMES = ("gemm", "gemm-splitk")
FETCH_VECTOR_LENS = [1, 2, 4]
UNROLL_MAX_STEPS = [0, 16, 64, 512, 1024]
FINAL_THREADS = 256
CONV_MAX_K_STEP = 64  # a convolution's K step holds whole windows: 36 or 18 of a 3x3, 49 of a 7x7
SHARED_ROW_PAD = 4  # words: keeps 16-byte alignment for float4 stores and cp.async
PIPELINE = {"software_pipeline_stage": [0, 0, 1], "software_pipeline_order": [0, 1, 2],
            "software_pipeline_async_stages": [0]}


def gemm_loops(task) -> tuple[int, int, tuple[int, ...], str, str] | None:
    """(M loop, N loop, batch loops, A's name, B's name) of a GEMM task these sketches serve, else
    None. A ignores only N; B ignores M, the last loop before N it ignores, and may ignore more
    loops before it: an ONNX MatMul of a [batch, rows, K] activation by a [K, N] weight, whose
    batch loop then goes to the grid like any batch loop (fused with the rows, the staged A tile's
    region could not be proven to stay in one batch). Loops neither ignores are batch loops."""
    if task.kind != "matmul" or len(task.reduction) != 1 or len(task.reuse) != 2 or len(task.spatial) < 2:
        return None
    for (a_name, a_ignores), (b_name, b_ignores) in permutations(task.reuse.items()):
        if len(a_ignores) != 1 or not b_ignores or a_ignores[0] in b_ignores:
            continue
        n_axis = a_ignores[0]
        before_n = [a for a in b_ignores if a < n_axis]
        if len(before_n) != len(b_ignores):
            continue
        m_axis = max(before_n)
        batch = tuple(a for a in range(len(task.spatial)) if a not in (m_axis, n_axis))
        return m_axis, n_axis, batch, a_name, b_name
    return None


def conv_loops(task) -> tuple[int, tuple[int, ...], tuple[int, ...], str, str] | None:
    """(M loop, batch loops, N loops, A's name, B's name) of a convolution these sketches serve as
    an implicit GEMM, else None: a matmul-kind task that is no GEMM (gemm_loops), whose one input
    (X: B) ignores exactly one output loop (co: M) and whose other (W: A) ignores every other output
    loop, at least three (n, h, w); the last two (h, w) are N, those before them (n) batch loops of
    the grid (fused with h and w, the staged box's bounds would not simplify). A depthwise or
    grouped convolution has loops neither ignores: no implicit GEMM."""
    if task.kind != "matmul" or gemm_loops(task) is not None or len(task.reuse) != 2 or len(task.spatial) < 4:
        return None
    for (b_name, b_ignores), (a_name, a_ignores) in permutations(task.reuse.items()):
        if len(b_ignores) != 1:
            continue
        m_axis = b_ignores[0]
        rows = tuple(a for a in range(len(task.spatial)) if a != m_axis)
        if tuple(a_ignores) == rows:
            return m_axis, rows[:-2], rows[-2:], a_name, b_name
    return None


def gemm_axes(func) -> tuple[str, int, int, dict[str, str], tuple[int, ...] | None] | None:
    """(main block, M loop, N loop, {"A": its input's name, "B": its input's name}, a convolution's
    loop order (batch loops, co, the N loops to fuse) or None) when ``func`` is a GEMM or a
    convolution these sketches serve, else None. For a convolution M and N are counted after its
    N loops and its reductions are fused (batch loops first, then M, then N)."""
    from tvm import s_tir

    from .heuristics.classify import classify

    task = classify(func)
    loops = gemm_loops(task)
    order = None
    if loops is None:
        conv = conv_loops(task)
        if conv is None:
            return None
        co_axis, batch, n_loops, a_name, b_name = conv
        order = (*batch, co_axis, *n_loops)
        loops = (len(batch), len(batch) + 1, (), a_name, b_name)
    m_axis, n_axis, _, a_name, b_name = loops
    sch = s_tir.Schedule(func)
    block = sch.get(sch.get_sblock(task.block))
    reads = [r.source.name for r in block.reads]
    if a_name not in reads or b_name not in reads:
        return None
    kinds = [int(v.iter_type) for v in block.iter_vars]
    if kinds[-1] != 2:  # reduction loop last (CommReduce)
        return None
    if order is not None:
        if kinds != [0] * len(task.spatial) + [2] * len(task.reduction):
            return None
        return task.block, m_axis, n_axis, {"A": a_name, "B": b_name}, order
    return task.block, m_axis, n_axis, {"A": a_name, "B": b_name}, None


def is_conv(func) -> bool:
    """Whether the sketches take ``func`` as a convolution's implicit GEMM."""
    axes = gemm_axes(func)
    return axes is not None and axes[4] is not None


def gemm_sketches(mod, func, async_copy: bool = True) -> list[Any]:
    """The appended sketches for ``mod["main"]`` (``func`` the task), empty when it is no GEMM.
    ``async_copy``: the pipeline's copy stage is asynchronous (cp.async: sm_80 and later)."""
    axes = gemm_axes(func)
    if axes is None:
        return []
    out = []
    for split_k in (False, True):
        sch = _sketch(mod, axes, split_k, async_copy)
        if sch is not None:
            out.append(sch)
    return out


def _sketch(mod, axes, split_k: bool, async_copy: bool):
    from tvm import s_tir

    block_name, m_axis, n_axis, read_names, conv = axes
    sch = s_tir.Schedule(mod)
    try:
        block = sch.get_sblock(block_name)
        # a convolution's padding stays a block until X's shared tile is cached from it
        keep = _producer_of(sch, block, read_names["B"]) if conv is not None else None
        if not _inline_around(sch, block_name, keep):
            return None
        loops = sch.get_loops(block)
        if conv is not None:  # implicit GEMM: [batch..., co, (h, w)] x (ci, kh, kw)
            ns = len(conv)
            sch.reorder(*(loops[a] for a in conv))
            loops = sch.get_loops(block)
            rows = sch.fuse(*loops[n_axis:ns]) if ns > n_axis + 1 else loops[n_axis]
            k = sch.fuse(*loops[ns:]) if len(loops) > ns + 1 else loops[ns]
            spatial = [*loops[:n_axis], rows]
        else:
            spatial, k = loops[:-1], loops[-1]
        i_factors = sch.sample_perfect_tile(spatial[m_axis], n=3, max_innermost_factor=8)
        j_factors = sch.sample_perfect_tile(spatial[n_axis], n=3, max_innermost_factor=8)
        k_step = CONV_MAX_K_STEP if conv is not None else 32
        k_tiles = sch.split(k, sch.sample_perfect_tile(k, n=3 if split_k else 2, max_innermost_factor=k_step))
        final = None
        if split_k:  # the outermost K part becomes a grid dimension of partial sums
            sch.reorder(k_tiles[0], *spatial)
            final, block = block, sch.rfactor(k_tiles[0], factor_axis=0)
            ks, *loops = sch.get_loops(block)
            spatial, k_tiles = loops[:-2], loops[-2:]
        i_tiles = sch.split(spatial[m_axis], i_factors)
        j_tiles = sch.split(spatial[n_axis], j_factors)
        batch = [loop for a, loop in enumerate(spatial) if a not in (m_axis, n_axis)]
        sch.reorder(*batch, i_tiles[0], j_tiles[0], i_tiles[1], j_tiles[1], *k_tiles, i_tiles[2], j_tiles[2])
        grid = sch.fuse(*([ks] if split_k else []), *batch, i_tiles[0], j_tiles[0])
        sch.bind(grid, "blockIdx.x")
        threads = sch.fuse(i_tiles[1], j_tiles[1])
        sch.bind(threads, "threadIdx.x")
        ko = k_tiles[0]
        reads = [r.source.name for r in sch.get(block).reads]
        for operand in ("A", "B"):
            shared = sch.cache_read(block, reads.index(read_names[operand]), "shared")
            # unit loops kept: the trace's shape must not depend on the sampled tiles
            sch.compute_at(shared, ko, preserve_unit_loops=True)
            ndim = len(sch.get(shared).writes[0].source.shape)
            if operand == "A" and conv is None and GEMM_EXPERIMENT.get("a_k_major"):
                sch.transform_layout(shared, ("write", 0), _swap_last_two(ndim))
            if conv is not None:  # rows of W's tile (co) or of the input's box (n): 4 words, mod 16
                sch.storage_align(shared, 0, axis=0, factor=16, offset=SHARED_ROW_PAD)
            else:
                sch.storage_align(shared, 0, axis=ndim - 2, factor=32, offset=SHARED_ROW_PAD)
            if operand == "B" and keep is not None:
                sch.compute_inline(sch.get_sblock(keep))
            sch.fuse(*sch.get_loops(shared)[-ndim:])
            vector = sch.sample_categorical(FETCH_VECTOR_LENS, [1 / len(FETCH_VECTOR_LENS)] * len(FETCH_VECTOR_LENS))
            sch.annotate(shared, "meta_schedule.cooperative_fetch", vector)
        local = sch.cache_write(block, 0, "local")
        if conv is not None:  # the accumulators by the fused (h, w): a constant index a register
            _merge_rows_of_write(sch, block, len(conv) - n_axis)
        sch.reverse_compute_at(local, threads, preserve_unit_loops=True)
        if final is not None:  # the partial sums' reduction: one thread per output
            ks_sum, *outputs = sch.get_loops(final)  # the K part stayed outermost
            sch.reorder(*outputs, ks_sum)
            bx, tx = sch.split(sch.fuse(*outputs), [None, FINAL_THREADS])
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
            local_final = sch.cache_write(final, 0, "local")
            sch.reverse_compute_at(local_final, tx, preserve_unit_loops=True)
            _reverse_inline_consumers(sch, local_final)
        else:
            _reverse_inline_consumers(sch, local)
        pipeline = dict(PIPELINE)
        if GEMM_EXPERIMENT.get("stages"):
            pipeline["software_pipeline_stage"] = [0, 0, int(GEMM_EXPERIMENT["stages"]) - 1]
        for key, value in pipeline.items():
            if async_copy or key != "software_pipeline_async_stages":
                sch.annotate(ko, key, value)
        root = sch.get_sblock("root")
        unroll = sch.sample_categorical(UNROLL_MAX_STEPS, [1 / len(UNROLL_MAX_STEPS)] * len(UNROLL_MAX_STEPS))
        sch.annotate(root, "meta_schedule.unroll_explicit", unroll)
    except Exception:  # noqa: BLE001 - TVM's ScheduleError: this task does not take the sketch
        return None
    return sch


# A/B knobs for bench/gpu_gemm.py's experiment points, not build options (TLMPACK_GEMM_EXPERIMENT:
# plan=TMxTN/TYxTX/BK, stages=N, a_k_major=1); empty in a normal build
GEMM_EXPERIMENT = dict(kv.split("=") for kv in os.environ.get("TLMPACK_GEMM_EXPERIMENT", "").split(",") if kv)


def _swap_last_two(ndim: int):
    from tvm import tirx

    return tirx.IndexMap.from_func(lambda *idx: (*idx[:-2], idx[-1], idx[-2]), ndim=ndim)


def _inline_around(sch, main: str, keep: str | None = None) -> bool:
    """Inlines every injective producer of the GEMM into it (transposes, casts of its inputs) but
    ``keep``; False when a block before it cannot be."""
    from tvm import tirx

    root = sch.get_sblock("root")
    for rv in sch.get_child_blocks(root):
        b = sch.get(rv)
        if b.name_hint == main:
            return True
        if any(v.iter_type == tirx.IterVar.CommReduce for v in b.iter_vars):
            return False
        if b.name_hint != keep:
            sch.compute_inline(rv)
    return True


def _merge_rows_of_write(sch, block, rows: int) -> None:
    """The block's written (local) buffer [..., h, w] as [..., h * w]: the N tile's accumulators
    then sit at constant offsets of one fused index (with h and w apart, the region a thread
    writes has data-dependent bounds and the accumulators go to local memory)."""
    from tvm import tirx

    written = sch.get(block).writes[0].source.shape
    shape = [int(x) for x in written]
    lead, tail = len(shape) - rows, shape[-rows:]

    def merged(*idx):
        flat = idx[lead]
        for i, extent in enumerate(tail[1:], start=lead + 1):
            flat = flat * extent + idx[i]
        return (*idx[:lead], flat)

    index_map = tirx.IndexMap.from_func(merged, ndim=len(shape), index_dtype=str(written[0].ty))
    sch.transform_layout(block, ("write", 0), index_map)


def _producer_of(sch, block, buffer_name: str) -> str | None:
    """The name of the block of this function that writes ``buffer_name`` (a convolution's
    pad_temp), None when it is a parameter."""
    root = sch.get_sblock("root")
    for rv in sch.get_child_blocks(root):
        b = sch.get(rv)
        if any(w.source.name == buffer_name for w in b.writes):
            return b.name_hint
    return None


def _reverse_inline_consumers(sch, local) -> None:
    """Injective epilogues (bias, activation) into the write-back; what does not go stays a block
    of its own, bound by RewriteUnboundBlock. An epilogue that reads one value in two blocks (GELU:
    x * (1 + erf(x / sqrt 2)) / 2 reads x twice) is first folded into its last block: inlining the
    chain's first consumer alone would leave the other reading a buffer nobody writes."""
    after = _blocks_after(sch, local)
    if _fans_out(sch, after):
        for name in after[:-1]:
            try:
                sch.compute_inline(sch.get_sblock(name))
            except Exception:  # noqa: BLE001 - TVM's ScheduleError: the chain stays as it is
                break
        after = _blocks_after(sch, local)
        if _fans_out(sch, after):
            return
    for name in after:
        try:
            sch.reverse_compute_inline(sch.get_sblock(name))
        except Exception:  # noqa: BLE001
            return


def _blocks_after(sch, local) -> list[str]:
    """The names of the root's blocks after the write-back ``local``, in order."""
    root = sch.get_sblock("root")
    blocks = [sch.get(b).name_hint for b in sch.get_child_blocks(root)]
    write_back = sch.get(local).name_hint
    return blocks[blocks.index(write_back) + 1:] if write_back in blocks else []


def _fans_out(sch, names: list[str]) -> bool:
    """Whether some buffer is read by more than one of the blocks ``names``."""
    readers: dict[str, int] = {}
    for name in names:
        for buffer in {r.source.name for r in sch.get(sch.get_sblock(name)).reads}:
            readers[buffer] = readers.get(buffer, 0) + 1
    return any(count > 1 for count in readers.values())
