"""Programs one step away from a given point (usually the rules'): a local search, measured offline
or ranked by the cost model in a `--scheduler ranked` build.

Random programs rarely beat the rules on channels-last convolutions timed as built (the rules won
72 of 101 such tasks against 12–24 random programs each), so fine-tuning on the best measured program
of a task teaches the model less than the rules already know. One-step edits of the rules' point are
where the faster programs are most likely, and they make the task's "best known" a search around a
good point rather than a handful of random draws. A step is one site changed, the others kept:

- a tile: one prime factor moved from one loop level to another (16, 4 -> 8, 8), the product unchanged;
- a categorical (unroll step, vector width): any other choice;
- a compute location: any other legal location.

Each edit is replayed on the space; edits the postprocessors refuse are dropped, so every point is legal.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

from .records import Decision
from .space import DesignSpace, SamplingSite, fixed_decider, legal_values


def _prime_factors(n: int) -> list[int]:
    found, p = [], 2
    while p * p <= n:
        while n % p == 0:
            found.append(p)
            n //= p
        p += 1
    return found + ([n] if n > 1 else [])


def tile_steps(value: tuple[int, ...], max_innermost: int = 0) -> list[tuple[int, ...]]:
    """Every factorisation one prime factor away from ``value``, in a fixed order (legal bounds kept)."""
    out: list[tuple[int, ...]] = []
    for src, factor in enumerate(value):
        for prime in sorted(set(_prime_factors(factor))):
            for dst in range(len(value)):
                if dst == src:
                    continue
                step = list(value)
                step[src] //= prime
                step[dst] *= prime
                if max_innermost > 0 and step[-1] > max_innermost:
                    continue
                if tuple(step) not in out:
                    out.append(tuple(step))
    return out


def site_steps(site: SamplingSite, value) -> list:
    """The values one step away from ``value`` at ``site``."""
    if site.kind == "tile":
        return tile_steps(tuple(value), site.max_innermost)
    return [v for v in legal_values(site) if v != value]


def _edits(space: DesignSpace, sketch: int, decisions: tuple[Decision, ...]) -> Iterator[tuple[Decision, ...]]:
    sites = space.sites(sketch, locations=True)
    if len(sites) != len(decisions):
        return
    for site, decision in zip(sites, decisions, strict=True):
        for value in site_steps(site, decision.value):
            edited = list(decisions)
            edited[site.index] = Decision(decision.kind, tuple(value) if site.kind == "tile" else int(value))
            yield tuple(edited)


def neighbour_points(space: DesignSpace, sketch: int, decisions: tuple[Decision, ...], count: int, seed: int = 0,
                     skip: Callable[[tuple[Decision, ...]], bool] | None = None) -> list[tuple[tuple[Decision, ...], Any]]:
    """Up to ``count`` legal points of ``sketch`` one step from ``decisions``, a seeded choice among all
    steps, each with its scheduled PrimFunc; ``skip`` leaves out the points it is true for (e.g. those
    measured already)."""
    if count <= 0:
        return []
    edits = [e for e in _edits(space, sketch, decisions) if skip is None or not skip(e)]
    random.Random(seed).shuffle(edits)
    found: list[tuple[tuple[Decision, ...], Any]] = []
    for edited in edits:
        replayed = space.replay(sketch, fixed_decider(edited), locations=True)
        if replayed is not None and replayed[1] == edited:
            found.append((edited, replayed[0]))
            if len(found) == count:
                break
    return found


def neighbours(space: DesignSpace, sketch: int, decisions: tuple[Decision, ...], count: int,
               seed: int = 0, skip: Callable[[tuple[Decision, ...]], bool] | None = None) -> list[tuple[Decision, ...]]:
    """The decisions of ``neighbour_points``."""
    return [edited for edited, _ in neighbour_points(space, sketch, decisions, count, seed, skip)]
