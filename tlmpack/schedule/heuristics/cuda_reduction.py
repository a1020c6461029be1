"""cuda-reduction: softmax pieces, layer norm, mean, pooling and other non-matmul reductions.

The design space has a row-parallel sketch (sketch 0: one thread per row, AutoBind picks the
block size) and sketches where more and more of the task's reduction blocks become
CrossThreadReduction (a warp-shuffle / shared-memory tree across a thread block per row; the last
sketch makes every one of them cross-thread). A long row (>= 64 elements) goes cross-thread, most
blocks first, with threads per row a power of two near half the row (32..512), so each thread
sums a couple of elements before the tree; a short row stays row-parallel, with blocks small
enough that there is at least one per SM. Unroll stays moderate (64): the per-thread loops are
short and a deep unroll only grows the code.
"""

from __future__ import annotations

import os
from typing import Any

from ..space import SamplingSite
from .classify import TaskClass
from .registry import Decisions, Rule, register

LONG_ROW = 64
UNROLL = 64
EPILOGUE_THREADS = 256

_CROSS_THREAD = (4, 8, 16, 32, 64, 128, 256, 512)


def _is_cross_thread(site: SamplingSite) -> bool:
    return site.kind == "categorical" and 4 in site.candidates and 1024 not in site.candidates


def _is_unroll(site: SamplingSite) -> bool:
    return site.kind == "categorical" and 0 in site.candidates


def _pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def row_threads(row_length: int) -> int:
    """Threads per row for a cross-thread reduction. TLMPACK_CUDA_REDUCTION_ROW_THREADS caps it (an
    A/B knob for bench/gpu_ops.py, not a build option)."""
    cap = int(os.environ.get("TLMPACK_CUDA_REDUCTION_ROW_THREADS", "") or 512)
    return max(min(32, cap), min(cap, _pow2_floor(row_length // 2)))


def block_threads(candidates: tuple[int, ...], work: int, sm_count: int, want: int = EPILOGUE_THREADS) -> int:
    """Index of the largest block size <= ``want`` that still gives every SM a block (else the
    smallest candidate)."""
    order = sorted(range(len(candidates)), key=lambda i: candidates[i])
    fitting = [i for i in order if candidates[i] <= want and -(-work // candidates[i]) >= sm_count]
    return fitting[-1] if fitting else order[0]


@register
class CudaReduction(Rule):
    name = "cuda-reduction"
    target = "cuda"

    def is_eligible(self, task: TaskClass, hardware: Any) -> bool:
        return task.kind == "reduce" and task.row_length > 1

    def sketch_order(self, sketches: list[tuple[str, ...]], task: TaskClass, hardware: Any) -> list[int]:
        num_sketches = len(sketches)
        if task.row_length >= LONG_ROW:
            return list(reversed(range(num_sketches)))  # most cross-thread blocks first
        return list(range(num_sketches))

    def decisions(self, task: TaskClass, sites: list[SamplingSite], hardware: Any) -> Decisions | None:
        cross = [s for s in sites if _is_cross_thread(s)]
        if task.row_length >= LONG_ROW and not cross:
            return None  # a long row wants a cross-thread sketch; try the next one
        out: Decisions = {}
        threads = row_threads(task.row_length)
        for site in sites:
            if _is_cross_thread(site):
                fitting = [i for i, c in enumerate(site.candidates) if c <= threads]
                out[site.index] = max(fitting, key=lambda i: site.candidates[i]) if fitting else 0
            elif _is_unroll(site):
                out[site.index] = site.candidates.index(UNROLL) if UNROLL in site.candidates else 0
            elif site.kind == "categorical":  # AutoBind of a row-parallel or elementwise block
                out[site.index] = block_threads(site.candidates, task.rows, hardware.sm_count)
        return out
