"""x86 pointwise rule: elementwise, broadcast, transpose and padding kernels. MetaSchedule's llvm
sketch for them has no sampling sites: the postprocessor fuses the outer loops into one parallel
loop and vectorises the innermost. The rule only accepts them, so the manifest says who decided."""

from __future__ import annotations

from ...schedule.space import SamplingSite
from .classify import TaskClass
from .registry import Decisions, Rule, register


@register
class X86Pointwise(Rule):
    name = "x86-pointwise"
    target = "x86"

    def is_eligible(self, task: TaskClass, hardware) -> bool:
        return task.kind == "pointwise"

    def decisions(self, task: TaskClass, sites: list[SamplingSite], hardware) -> Decisions | None:
        chosen: Decisions = {}
        for site in sites:  # an unroll categorical, if a sketch has one: a moderate 64
            if site.kind == "categorical":
                chosen[site.index] = site.candidates.index(64) if 64 in site.candidates else 0
        return chosen
