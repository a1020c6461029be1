"""x86 reduction rule (softmax's pieces, layer norm, mean, pooling): rows in parallel, and a row
long enough for vectors reduced as partial sums over an inner chunk of a few vectors.

Sketches of MetaSchedule's llvm space for a reduction differ in whether the reduction loop is
split for rfactor (a 2-way tile of the row), which half the rfactor factors out, and where
producers are computed. The sketch whose every rfactor keeps the *inner* half (DesignSpace.steps:
"RFactor:inner") holds one partial sum per inner position, which the postprocessor vectorises;
the plain sketch reduces a row one scalar add at a time. Measured (data/TASKS-x86.md, 1 thread):
the plain sketch was 8-17x slower than the best random program on efficientnet's spatial means
(rows of 196-12544) and 7-12x on bert's layer norms; their best programs all use the inner
rfactor. Rows shorter than two vectors keep the plain sketch.

A channels-last pooling takes the appended window sketch first (schedule/x86_window_sketch.py:
the window outside the channel vector): ResNet-50's max pool ran 2x faster alone than the best of
the 9 points of MetaSchedule's sketches that `--tune 16` measured, and 4x faster in the model.

A short row's partial sums are computed inside the consumer's channel loop, not at the root (a
4-D NCHW mean over at most SHORT_ROW elements: one tile site, two compute-location sites, the
second the partial sums'). Measured on this VM's AVX-512 znver4, 1 thread, one interleaved pass
(BENCHMARKS.md, 2026-12-02 07:00): 1.17-1.49x on the seven 7x7 and 14x14 means of the training
tasks; rows of 3136 were level and a row of 12544 15x slower that way, so longer rows stay at the root.
"""

from __future__ import annotations

from typing import Any

from ...schedule.space import SamplingSite
from ..x86_window_sketch import MARK as WINDOW_MARK
from .classify import TaskClass
from .registry import Decisions, Rule, register
from .x86_matmul import largest_divisor_at_most

MIN_VECTOR_ROWS = 2  # a row of at least this many vectors is reduced as vectorised partial sums
SHORT_ROW = 1024  # a mean's row of at most this many elements keeps its partial sums by its channel
IN_CHANNEL_LOOP = 1  # the compute location of the consumer's loop over channels (n, c, 1, 1)


def vector_chunk(extent: int, lanes: int, bound: int) -> int:
    """The inner chunk of a split row: the largest whole number of vectors (up to 4) that divides
    it (784 -> 16, 3136 -> 32), else its largest divisor up to 4 vectors (196 -> 28)."""
    limit = min(bound, 4 * lanes)
    for vectors in range(limit // lanes, 0, -1):
        if extent % (vectors * lanes) == 0:
            return vectors * lanes
    return largest_divisor_at_most(extent, limit)


@register
class X86Reduction(Rule):
    name = "x86-reduction"
    target = "x86"

    def is_eligible(self, task: TaskClass, hardware) -> bool:
        return task.kind == "reduce"

    def sketch_order(self, sketches: list[tuple[str, ...]], task: TaskClass, hardware: Any) -> list[int]:
        window = [i for i, steps in enumerate(sketches) if WINDOW_MARK in steps]  # channels-last pooling
        rfactors = [{s for s in steps if s.startswith("RFactor")} for steps in sketches]
        plain = [i for i, kinds in enumerate(rfactors) if not kinds and i not in window]
        inner = [i for i, kinds in enumerate(rfactors) if kinds == {"RFactor:inner"}]
        rest = [i for i in range(len(sketches)) if i not in plain and i not in inner and i not in window]
        if task.row_length >= MIN_VECTOR_ROWS * hardware.lanes(32):
            return window + inner + plain + rest
        return window + plain + inner + rest

    def decisions(self, task: TaskClass, sites: list[SamplingSite], hardware) -> Decisions | None:
        chosen: Decisions = {}
        for site in sites:
            if site.kind == "tile":
                bound = site.max_innermost if site.max_innermost > 0 else site.extent
                inner = vector_chunk(site.extent, hardware.lanes(32), bound)
                chosen[site.index] = (*([1] * (site.parts - 2)), site.extent // inner, inner)
            elif site.kind == "categorical":
                chosen[site.index] = site.candidates.index(16) if 16 in site.candidates else 0
            elif site.kind == "compute_location":
                chosen[site.index] = -1
        locations = [s.index for s in sites if s.kind == "compute_location"]
        tiles = [s for s in sites if s.kind == "tile"]
        if len(tiles) == 1 and len(locations) == 2 and len(task.spatial) == 4 and task.row_length <= SHORT_ROW:
            chosen[locations[1]] = IN_CHANNEL_LOOP
        return chosen
