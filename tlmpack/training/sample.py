"""Seeded random legal points of a design space: a sketch and one legal value at every sampling
site, drawn uniformly among the legal values given the decisions before it (compute locations
depend on the loops the earlier decisions made)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from ..schedule.records import Decision
from ..schedule.space import DesignSpace, SamplingSite, fixed_decider, legal_values


@dataclass(frozen=True)
class Point:
    """One sampled program: the sketch, its decisions in trace order, the scheduled PrimFunc."""

    sketch: int
    decisions: tuple[Decision, ...]
    func: Any

    def key(self) -> tuple:
        return (self.sketch, tuple((d.kind, d.value) for d in self.decisions))


def random_decider(rng: random.Random):
    """A decider for DesignSpace.replay that picks uniformly among a site's legal values."""

    def decide(site: SamplingSite, _sampled):
        return rng.choice(legal_values(site))

    return decide


def sample_point(space: DesignSpace, rng: random.Random, sketch: int | None = None) -> Point | None:
    """One random legal point (random sketch unless given); None when the replay or the
    postprocessors reject it (see ``rejection_rate``)."""
    if sketch is None:
        sketch = rng.randrange(len(space.sketches))
    replayed = space.replay(sketch, random_decider(rng), locations=True)
    if replayed is None:
        return None
    func, decisions = replayed
    return Point(sketch, decisions, func)


def replay_point(space: DesignSpace, sketch: int, decisions: tuple[Decision, ...]) -> Point | None:
    """Rebuilds a point from its decisions; None if they are not a legal, complete point."""
    replayed = space.replay(sketch, fixed_decider(decisions), locations=True)
    if replayed is None or len(replayed[1]) != len(decisions):
        return None
    return Point(sketch, replayed[1], replayed[0])
