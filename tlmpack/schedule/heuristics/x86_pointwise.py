"""x86 pointwise rule: elementwise, broadcast, transpose and padding kernels. MetaSchedule's llvm
sketch for them has no sampling sites: the postprocessor fuses the outer loops into one parallel
loop and vectorises the innermost. A channels-last broadcast (a squeeze-excite gate) takes the
appended vector sketch first (schedule/x86_broadcast_sketch.py: the channels as the vector loop, not
a gather of the gate per fused index). Otherwise the rule only accepts them, so the manifest says
who decided."""

from __future__ import annotations

from typing import Any

from ...schedule.space import SamplingSite
from ..x86_broadcast_sketch import MARK as VECTOR_MARK
from .classify import TaskClass
from .registry import Decisions, Rule, register


@register
class X86Pointwise(Rule):
    name = "x86-pointwise"
    target = "x86"

    def is_eligible(self, task: TaskClass, hardware) -> bool:
        return task.kind == "pointwise"

    def sketch_order(self, sketches: list[tuple[str, ...]], task: TaskClass, hardware: Any) -> list[int]:
        vector = [i for i, steps in enumerate(sketches) if VECTOR_MARK in steps]
        return vector + [i for i in range(len(sketches)) if i not in vector]

    def decisions(self, task: TaskClass, sites: list[SamplingSite], hardware) -> Decisions | None:
        chosen: Decisions = {}
        for site in sites:  # an unroll categorical, if a sketch has one: a moderate 64
            if site.kind == "categorical":
                chosen[site.index] = site.candidates.index(64) if 64 in site.candidates else 0
        return chosen
