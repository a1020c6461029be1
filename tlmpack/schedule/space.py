"""Space Builder: a task's MetaSchedule design space (sketches and their sampling sites), and
replay of a sketch with chosen decisions into a postprocessed, buildable schedule.

This room uses TVM directly; what leaves it is plain data (SamplingSite, Decision) plus the
scheduled PrimFunc handed to lower/.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .records import Decision


@dataclass(frozen=True)
class SamplingSite:
    """One sampling instruction met during replay, with what bounds its legal values."""

    index: int
    kind: str  # tile | categorical | compute_location
    extent: int = 0  # tile: the loop extent being split
    parts: int = 0  # tile: number of factors
    max_innermost: int = 0  # tile: bound on the innermost factor
    candidates: tuple[int, ...] = ()  # categorical: the values it picks among


# A decider gets the site and the sketch's own (randomly sampled, legal) decision and returns a value.
Decider = Callable[[SamplingSite, Any], Any]

_KIND_OF_INSTRUCTION = {
    "SamplePerfectTile": "tile",
    "SampleCategorical": "categorical",
    "SampleComputeLocation": "compute_location",
}


def import_tensor_intrinsics(kinds: tuple[str, ...] = ("x86",)) -> None:
    """MetaSchedule imports every tensor intrinsic (about 50 s, mostly CUDA's); load only ours."""
    name = "tvm.s_tir.tensor_intrin"
    if name not in sys.modules:
        spec = importlib.util.find_spec(name)
        package = types.ModuleType(name)
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        package.__package__ = name
        sys.modules[name] = package
    for kind in kinds:
        importlib.import_module(f"{name}.{kind}")


def legal_tile_factorizations(extent: int, parts: int, max_innermost: int) -> list[tuple[int, ...]]:
    """Every ordered ``parts``-way factorisation of ``extent`` whose innermost factor is at most
    ``max_innermost`` (max_innermost <= 0 means unbounded)."""
    if parts == 1:
        return [(extent,)] if max_innermost <= 0 or extent <= max_innermost else []
    result = []
    for first in range(1, extent + 1):
        if extent % first == 0:
            for rest in legal_tile_factorizations(extent // first, parts - 1, max_innermost):
                result.append((first, *rest))
    return result


class DesignSpace:
    """The sketches MetaSchedule's post-order-apply generates for one PrimFunc on one target."""

    def __init__(self, func, target, seed: int = 0) -> None:
        import tvm
        from tvm.s_tir import meta_schedule as ms

        self.mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
        self.target = target
        if target.kind.name == "cuda":
            import_tensor_intrinsics(())  # no tensor cores: see cuda_space_rules
            generator = _cuda_space_generator(target)
        else:
            import_tensor_intrinsics(("x86",))
            generator = "post-order-apply"
        self.context = ms.TuneContext(mod=self.mod, target=target, space_generator=generator,
                                      task_name="task", num_threads=1, rand_state=seed)
        self.sketches = list(self.context.generate_design_space())

    def sites(self, sketch: int) -> list[SamplingSite]:
        """The sampling sites of a sketch in trace order (replayed with its own decisions)."""
        from tvm.s_tir import Schedule

        sch = Schedule(self.mod)
        found: list[SamplingSite] = []

        def provider(inst, inputs, attrs, decision):
            kind = _KIND_OF_INSTRUCTION.get(inst.kind.name)
            if kind is not None:
                found.append(_site(len(found), kind, sch, inputs, attrs))
            return decision

        self.sketches[sketch].trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=provider)
        return found

    def replay(self, sketch: int, decide: Decider) -> tuple[Any, tuple[Decision, ...]] | None:
        """Replays sketch ``sketch`` asking ``decide`` for every sampling decision, then runs the
        postprocessors. Returns the scheduled PrimFunc and the decisions, or None if illegal."""
        from tvm.s_tir import Schedule

        sch = Schedule(self.mod)
        decisions: list[Decision] = []

        def provider(inst, inputs, attrs, decision):
            kind = _KIND_OF_INSTRUCTION.get(inst.kind.name)
            if kind is None:
                return decision
            site = _site(len(decisions), kind, sch, inputs, attrs)
            value = decide(site, _plain(decision))
            _validate(site, value)
            decisions.append(Decision(kind, tuple(int(v) for v in value) if kind == "tile" else int(value)))
            return value

        try:
            self.sketches[sketch].trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=provider)
            for postproc in self.context.space_generator.postprocs:
                if not postproc.apply(sch):
                    return None
        except Exception:  # TVM raises ScheduleError / TVMError for points that do not schedule
            return None
        return sch.mod["main"], tuple(decisions)


def _cuda_space_generator(target):
    """MetaSchedule's default CUDA rules minus tensor cores, grid caps sized to the target's GPU."""
    from .cuda_space_rules import space_generator
    from .hardware import CUDA_ARCHS

    arch = str(target.attrs.get("arch", "")) if hasattr(target, "attrs") else ""
    hardware = CUDA_ARCHS.get(arch)
    return space_generator(hardware.sm_count if hardware else None)


def _plain(decision) -> Any:
    if decision is None:
        return None
    try:
        return tuple(int(v) for v in decision)
    except TypeError:
        return int(decision)


def _site(index: int, kind: str, sch, inputs, attrs) -> SamplingSite:
    if kind == "tile":
        extent = int(sch.get(inputs[0]).extent)
        return SamplingSite(index, kind, extent=extent, parts=int(attrs[0]), max_innermost=int(attrs[1]))
    if kind == "categorical":
        return SamplingSite(index, kind, candidates=tuple(int(c) for c in attrs[0]))
    return SamplingSite(index, kind)


def _validate(site: SamplingSite, value) -> None:
    """MetaSchedule snaps some illegal values silently; refuse them instead."""
    if site.kind == "tile":
        product = 1
        for v in value:
            product *= int(v)
        if len(value) != site.parts or product != site.extent or min(value) < 1 or (
            site.max_innermost > 0 and value[-1] > site.max_innermost
        ):
            raise ValueError(f"illegal tile {value} for extent {site.extent}")
    elif site.kind == "categorical":
        if not 0 <= int(value) < len(site.candidates):
            raise ValueError(f"categorical index {value} out of range")
    elif int(value) < -2:
        raise ValueError(f"compute location {value} out of range")
