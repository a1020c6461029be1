"""The heuristics registry: rules in trust order, each one file, each a class with
``is_eligible`` and ``decisions`` (in the manner of TVM dlight's rules and Helion's registry).

A rule never touches TVM: it reads the task's class (classify.py), the sketch's sampling sites
(space.py) and the hardware description (hardware.py), and returns decision values by site
index. The caller (select.py) replays the sketch with them; a site the rule leaves out keeps
the sketch's own sampled value, which is always legal.

Rules can be switched off by name (``TLMPACK_DISABLE_RULES=x86-matmul,cuda-reduction`` or
``disabled=`` in code) to compare against the fallback.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from ..space import SamplingSite
from .classify import TaskClass

Decisions = dict[int, Any]  # site index → tile tuple | categorical index | compute location


class Rule:
    """One compile-time rule for one target kind. Subclasses set ``name`` and ``target``."""

    name: ClassVar[str] = ""
    target: ClassVar[str] = ""  # "x86" | "cuda"
    # a rule that places a producer at a loop: its location is checked against the legal ones when
    # the point is replayed (space.py; ~10 ms a site), the nearest legal loop outside it taken
    wants_locations: ClassVar[bool] = False

    def is_eligible(self, task: TaskClass, hardware: Any) -> bool:
        raise NotImplementedError

    def sketch_order(self, sketches: list[tuple[str, ...]], task: TaskClass, hardware: Any) -> list[int]:
        """Which sketches to try, best first; the first one that replays legally wins.
        ``sketches``: each sketch's schedule instructions by kind (DesignSpace.steps)."""
        return list(range(len(sketches)))

    def decisions(self, task: TaskClass, sites: list[SamplingSite], hardware: Any) -> Decisions | None:
        """Decision values for one sketch's sites, or None when this sketch does not suit the rule."""
        raise NotImplementedError


_RULES: list[type[Rule]] = []


def register(cls: type[Rule]) -> type[Rule]:
    """Class decorator: appends a rule; registration order is trust order within a target."""
    if not cls.name or cls.target not in ("x86", "cuda"):
        raise ValueError(f"rule {cls.__name__} needs a name and a target")
    if any(r.name == cls.name for r in _RULES):
        raise ValueError(f"two rules named {cls.name}")
    _RULES.append(cls)
    return cls


RULE_MODULES = ("x86_matmul", "x86_reduction", "x86_pointwise", "cuda_gemm", "cuda_matmul", "cuda_reduction", "cuda_pointwise")


def _load_rule_modules() -> None:
    """Importing the modules registers their rules (one file per rule), in trust order."""
    import importlib

    for name in RULE_MODULES:
        importlib.import_module(f"{__package__}.{name}")


def rules_for(target: str, disabled: frozenset[str] | None = None) -> list[Rule]:
    """The enabled rules of one target kind, in trust order."""
    _load_rule_modules()
    if disabled is None:
        disabled = frozenset(n.strip() for n in os.environ.get("TLMPACK_DISABLE_RULES", "").split(",") if n.strip())
    return [cls() for cls in _RULES if cls.target == target and cls.name not in disabled]


def all_rule_names() -> list[str]:
    _load_rule_modules()
    return [cls.name for cls in _RULES]
