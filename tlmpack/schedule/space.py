"""Space Builder: a task's MetaSchedule design space (sketches and their sampling sites), and
replay of a sketch with chosen decisions into a postprocessed, buildable schedule.

This room uses TVM directly; what leaves it is plain data (SamplingSite, Decision) plus the
scheduled PrimFunc handed to lower/.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
import re
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
    candidates: tuple[int, ...] = ()  # categorical: the values it picks among; compute_location:
    # the legal locations (-2 inline, -1 root, else a loop index), when listed with locations=True


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
    return list(_factorizations(extent, parts, max_innermost))


@functools.lru_cache(maxsize=4096)
def _divisors(n: int) -> tuple[int, ...]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))


@functools.lru_cache(maxsize=4096)
def _factorizations(extent: int, parts: int, max_innermost: int) -> tuple[tuple[int, ...], ...]:
    if parts == 1:
        return ((extent,),) if max_innermost <= 0 or extent <= max_innermost else ()
    return tuple((first, *rest) for first in _divisors(extent)
                 for rest in _factorizations(extent // first, parts - 1, max_innermost))


def legal_next_factors(site: SamplingSite, prefix: tuple[int, ...]) -> list[int]:
    """The factors that may follow ``prefix`` in a tile decision and still complete to a legal
    factorisation (what a token-by-token generator may emit next)."""
    left = site.extent
    for f in prefix:
        left //= f
    remaining = site.parts - len(prefix)
    if remaining <= 0:
        return []
    if remaining == 1:
        return [left] if site.max_innermost <= 0 or left <= site.max_innermost else []
    return [d for d in _divisors(left) if _factorizations(left // d, remaining - 1, site.max_innermost)]


def legal_values(site: SamplingSite) -> list:
    """Every legal value of a site: tile factorisations, categorical indices, compute locations
    (the latter only when the site was listed with ``locations=True``)."""
    if site.kind == "tile":
        return legal_tile_factorizations(site.extent, site.parts, site.max_innermost)
    if site.kind == "categorical":
        return list(range(len(site.candidates)))
    if not site.candidates:
        raise ValueError("compute-location site listed without its locations (use locations=True)")
    return list(site.candidates)


def fixed_decider(decisions: tuple[Decision, ...]):
    """A decider that replays given decisions in trace order (e.g. a decoded sentence)."""

    def decide(site: SamplingSite, _sampled):
        if site.index >= len(decisions) or decisions[site.index].kind != site.kind:
            raise ValueError(f"decision {site.index} does not match a {site.kind} site")
        return decisions[site.index].value

    return decide


# What each space version added, append-only (a stored record's sketch index keeps its meaning):
SPACE_VERSIONS = {
    1: "MetaSchedule's sketches; on CUDA, the appended GEMM sketches of dense and batch matmuls",
    2: "on CUDA, the appended implicit-GEMM sketches of NCHW convolutions",
    3: "on x86, the appended window sketch of channels-last pooling",
    4: "on x86, the appended vector sketch of a channels-last broadcast",
}
SPACE_VERSION = max(SPACE_VERSIONS)


class DesignSpace:
    """The sketches MetaSchedule's post-order-apply generates for one PrimFunc on one target; on
    CUDA, GEMMs get two more after them (cuda_gemm_sketch.py: vectorised, pipelined, split-K), on
    x86 channels-last poolings one (x86_window_sketch.py: the window outside the channel vector) and
    channels-last broadcasts one (x86_broadcast_sketch.py: the channels as the vector loop)."""

    def __init__(self, func, target, seed: int = 0) -> None:
        import tvm
        from tvm.s_tir import meta_schedule as ms

        self.mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
        self.target = target
        if target.kind.name == "cuda":
            import_tensor_intrinsics(())  # no tensor cores: see cuda_space_rules
            generator = _cuda_space_generator(target)
        else:
            import_tensor_intrinsics(("x86",))  # before MetaSchedule imports them all (about 50 s)
            generator = _x86_space_generator()
        self.context = ms.TuneContext(mod=self.mod, target=target, space_generator=generator,
                                      task_name="task", num_threads=1, rand_state=seed)
        self.sketches = list(self.context.generate_design_space())
        self.metaschedule_sketches = len(self.sketches)  # those before the appended GEMM sketches
        # the space version that introduced each sketch (SPACE_VERSIONS): a TLM trained on an older
        # space has no sentence of the newer ones, so decoding does not offer them (sketches_after)
        self.sketch_versions: list[int] = [1] * len(self.sketches)
        if target.kind.name == "cuda":  # appended: MetaSchedule's sketch indexes keep their meaning
            from .cuda_gemm_sketch import gemm_sketches, is_conv

            arch = str(target.attrs.get("arch", "sm_90"))
            appended = gemm_sketches(self.mod, func, async_copy=int(arch[3:] or 0) >= 80)
            self.sketches += appended
            self.sketch_versions += [2 if is_conv(func) else 1] * len(appended)
        else:
            from .x86_broadcast_sketch import broadcast_sketches
            from .x86_window_sketch import window_sketches

            for version, appended in ((3, window_sketches(self.mod)), (4, broadcast_sketches(self.mod))):
                self.sketches += appended
                self.sketch_versions += [version] * len(appended)

    def sketches_after(self, version: int) -> tuple[int, ...]:
        """The sketches a space of ``version`` did not have (what a TLM trained on it has never seen)."""
        return tuple(i for i, v in enumerate(self.sketch_versions) if v > version)

    def steps(self, sketch: int) -> tuple[str, ...]:
        """The schedule instructions of a sketch's trace by kind (``"CacheWrite"``,
        ``"ReverseComputeAt"``, ...): what tells sketches apart, for rules that prefer one shape.
        An rfactor of a loop just split says which half it factors out: ``"RFactor:inner"`` keeps
        a partial sum per inner position (vectorisable), ``"RFactor:outer"`` one per outer chunk."""
        halves: dict = {}  # loop random variable -> "inner" | "outer"
        steps = []
        for inst in self.sketches[sketch].trace.insts:
            kind = str(inst.kind.name)
            if kind == "Split":
                outputs = list(inst.outputs)
                halves.update({rv: "inner" if i == len(outputs) - 1 else "outer" for i, rv in enumerate(outputs)})
            elif kind == "RFactor" and inst.inputs and inst.inputs[0] in halves:
                kind = f"RFactor:{halves[inst.inputs[0]]}"
            steps.append(kind)
        return tuple(steps)

    def sites(self, sketch: int, locations: bool = False) -> list[SamplingSite]:
        """The sampling sites of a sketch in trace order (replayed with its own decisions).
        ``locations``: also list each compute-location site's legal values (about 10 ms a site)."""
        from tvm.s_tir import Schedule

        sch = Schedule(self.mod)
        found: list[SamplingSite] = []

        def provider(inst, inputs, attrs, decision):
            kind = _KIND_OF_INSTRUCTION.get(inst.kind.name)
            if kind is not None:
                found.append(_site(len(found), kind, sch, inputs, attrs, locations))
            return decision

        self.sketches[sketch].trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=provider)
        return found

    def replay(self, sketch: int, decide: Decider, locations: bool = False
               ) -> tuple[Any, tuple[Decision, ...]] | None:
        """Replays sketch ``sketch`` asking ``decide`` for every sampling decision, then runs the
        postprocessors. Returns the scheduled PrimFunc and the decisions, or None if illegal.
        ``locations``: give ``decide`` the legal compute locations and refuse any other."""
        from tvm.s_tir import Schedule

        sch = Schedule(self.mod)
        decisions: list[Decision] = []

        def provider(inst, inputs, attrs, decision):
            kind = _KIND_OF_INSTRUCTION.get(inst.kind.name)
            if kind is None:
                return decision
            site = _site(len(decisions), kind, sch, inputs, attrs, locations)
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


def _x86_space_generator():
    """MetaSchedule's LLVM rules on every x86 target. Left to the target, an AVX-512 or VNNI one adds
    the int8 dot-product tiling rule, which never applies to our fp32 tasks but lists a reduction's
    sketches (and a few matmuls') in the opposite order, so one sketch index meant two schedules
    (docs/tvm-0.27-notes.md). The LLVM rules give every ISA the order AVX2 hosts always had."""
    from tvm.s_tir import meta_schedule as ms

    return ms.space_generator.PostOrderApply(sch_rules="llvm", postprocs="llvm", mutator_probs="llvm")


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


def _site(index: int, kind: str, sch, inputs, attrs, locations: bool = False) -> SamplingSite:
    if kind == "tile":
        extent = int(sch.get(inputs[0]).extent)
        return SamplingSite(index, kind, extent=extent, parts=int(attrs[0]), max_innermost=int(attrs[1]))
    if kind == "categorical":
        return SamplingSite(index, kind, candidates=tuple(int(c) for c in attrs[0]))
    return SamplingSite(index, kind, candidates=_legal_locations(sch, inputs[0]) if locations else ())


def _legal_locations(sch, block) -> tuple[int, ...]:
    """The compute locations TVM accepts for ``block`` in the schedule's current state. TVM 0.27
    does not expose CollectComputeLocation to Python, and SampleComputeLocation snaps an illegal
    decision to the nearest legal one below it; so try every value on a copy of the schedule and
    keep those that come back unchanged."""
    upper = len(re.findall(r"^\s*for ", sch.mod["main"].script(), re.M))  # loops in the function
    legal = []
    for value in range(-2, upper):
        trial = sch.copy()
        trial.sample_compute_location(block, decision=value)
        if int(trial.trace.decisions[trial.trace.insts[-1]]) == value:
            legal.append(value)
    return tuple(legal)


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
    elif int(value) < -2 or (site.candidates and int(value) not in site.candidates):
        raise ValueError(f"compute location {value} is not one of {site.candidates}")
