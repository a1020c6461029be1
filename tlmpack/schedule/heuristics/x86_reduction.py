"""x86 reduction rule (softmax's pieces, layer norm, mean, pooling): rows in parallel when there
are enough of them, one row's reduction split off as a parallel rfactor only when rows are few
and the row is long.

Sketches of MetaSchedule's llvm space for a reduction differ in whether the reduction loop is
split for rfactor (a 2-way tile of the row) and where producers are computed. Row-parallel
needs rows ≥ 2 × cores; otherwise the split sketch with an inner chunk of a few vectors lets the
postprocessor vectorise the partial sums.
"""

from __future__ import annotations

from ...schedule.space import SamplingSite
from .classify import TaskClass
from .registry import Decisions, Rule, register
from .x86_matmul import largest_divisor_at_most


@register
class X86Reduction(Rule):
    name = "x86-reduction"
    target = "x86"

    def is_eligible(self, task: TaskClass, hardware) -> bool:
        return task.kind == "reduce"

    def sketch_order(self, sketches: list[tuple[str, ...]], task: TaskClass) -> list[int]:
        # The last sketch is the plain one (no rfactor split); the first ones split the row.
        return list(range(len(sketches)))[::-1]

    def decisions(self, task: TaskClass, sites: list[SamplingSite], hardware) -> Decisions | None:
        row_parallel = task.rows >= 2 * hardware.cores or task.row_length < 8 * hardware.lanes(32)
        tiles = [s for s in sites if s.kind == "tile"]
        if row_parallel and tiles:
            return None  # this sketch splits the row: look for the plain one
        chosen: Decisions = {}
        for site in sites:
            if site.kind == "tile":
                bound = site.max_innermost if site.max_innermost > 0 else site.extent
                inner = largest_divisor_at_most(site.extent, min(bound, 4 * hardware.lanes(32)))
                chosen[site.index] = (*([1] * (site.parts - 2)), site.extent // inner, inner)
            elif site.kind == "categorical":
                chosen[site.index] = site.candidates.index(16) if 16 in site.candidates else 0
            elif site.kind == "compute_location":
                chosen[site.index] = -1
        return chosen
