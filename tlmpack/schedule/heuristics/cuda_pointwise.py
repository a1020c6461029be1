"""cuda-pointwise: elementwise, broadcast, transpose, pad, gather.

The sketch's only choices are AutoBind's threads per block (and sometimes an unroll depth). These
kernels are memory-bound: what matters is enough threads in flight to cover DRAM latency and no
idle SMs. Take 256 threads per block (8 warps: full occupancy at 8 blocks per SM, fine-grained
enough that the last wave is short), fewer when that would leave SMs without a block, and 512
for very large tensors (at least 4 full waves of 256-thread blocks), which halves the block count
at no occupancy cost. The grid itself is capped by cuda_space_rules.max_threadblocks (a full GPU of
256-thread blocks); beyond that threads loop. Unroll: the smallest non-zero depth (16).
"""

from __future__ import annotations

from typing import Any

from ..space import SamplingSite
from .classify import TaskClass
from .registry import Decisions, Rule, register

THREADS = 256
LARGE_THREADS = 512
LARGE_WAVES = 4
UNROLL = 16


def threads_for(elements: int, sm_count: int) -> int:
    """Threads per block for ``elements`` outputs on ``sm_count`` SMs."""
    if elements >= LARGE_WAVES * sm_count * 2048:
        return LARGE_THREADS
    threads = THREADS
    while threads > 32 and -(-elements // threads) < sm_count:
        threads //= 2
    return threads


@register
class CudaPointwise(Rule):
    name = "cuda-pointwise"
    target = "cuda"

    def is_eligible(self, task: TaskClass, hardware: Any) -> bool:
        return task.kind == "pointwise"

    def decisions(self, task: TaskClass, sites: list[SamplingSite], hardware: Any) -> Decisions | None:
        want = threads_for(task.rows, hardware.sm_count)
        out: Decisions = {}
        for site in sites:
            if site.kind != "categorical":
                continue
            if 0 in site.candidates:  # unroll depth
                out[site.index] = site.candidates.index(UNROLL) if UNROLL in site.candidates else 0
            else:
                fitting = [i for i, c in enumerate(site.candidates) if c <= want]
                out[site.index] = (max(fitting, key=lambda i: site.candidates[i]) if fitting
                                   else min(range(len(site.candidates)), key=lambda i: site.candidates[i]))
        return out
