"""Legal values of every sampling site, and seeded random legal sampling of whole points."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from tlm_tasks import example_tasks, x86_space

from tlmpack.schedule.records import Decision
from tlmpack.schedule.space import SamplingSite, legal_next_factors, legal_tile_factorizations, legal_values
from tlmpack.training.sample import replay_point, sample_point


def _brute_force(extent: int, parts: int, bound: int) -> list[tuple[int, ...]]:
    return [f for f in itertools.product(range(1, extent + 1), repeat=parts)
            if math.prod(f) == extent and (bound <= 0 or f[-1] <= bound)]


@pytest.mark.parametrize("extent,parts,bound", [(12, 3, 0), (64, 4, 16), (7, 2, 4), (1, 4, 64), (36, 2, 5)])
def test_tile_factorizations_are_exactly_the_legal_ones(extent, parts, bound):
    assert sorted(legal_tile_factorizations(extent, parts, bound)) == _brute_force(extent, parts, bound)


def test_next_factors_complete_to_legal_tiles():
    site = SamplingSite(0, "tile", extent=48, parts=4, max_innermost=4)
    full = set(legal_tile_factorizations(48, 4, 4))
    for prefix_len in range(4):
        prefixes = {f[:prefix_len] for f in full}
        for prefix in prefixes:
            expected = sorted({f[prefix_len] for f in full if f[:prefix_len] == prefix})
            assert legal_next_factors(site, prefix) == expected
    assert legal_next_factors(SamplingSite(0, "tile", extent=7, parts=2, max_innermost=4), (1,)) == []


@pytest.fixture(scope="module")
def spaces():
    return {name: x86_space(func) for name, func in example_tasks().items()}


def _sites_of(space, point) -> list[SamplingSite]:
    seen: list[SamplingSite] = []

    def decide(site, _sampled):
        seen.append(site)
        return point.decisions[site.index].value

    assert space.replay(point.sketch, decide, locations=True) is not None
    return seen


def test_random_points_take_only_legal_values_and_replay(spaces):
    rng = random.Random(7)
    kinds, rejected, total = set(), 0, 0
    for name, space in spaces.items():
        for _ in range(6):
            total += 1
            point = sample_point(space, rng)
            if point is None:
                rejected += 1
                continue
            for site, decision in zip(_sites_of(space, point), point.decisions, strict=True):
                kinds.add(site.kind)
                assert decision.kind == site.kind
                assert decision.value in legal_values(site), (name, site, decision)
            again = replay_point(space, point.sketch, point.decisions)
            assert again is not None and again.decisions == point.decisions
    assert kinds == {"tile", "categorical", "compute_location"}
    assert rejected <= total // 5


def test_sampling_is_seeded(spaces):
    space = spaces["softmax"]
    first = [sample_point(space, random.Random(3)).key() for _ in range(2)]
    assert first[0] == first[1]
    keys = {sample_point(space, random.Random(s)).key() for s in range(8)}
    assert len(keys) > 1


def test_compute_locations_are_listed_and_others_refused(spaces):
    space = spaces["softmax"]
    for sketch in range(len(space.sketches)):
        own = [d for d in space.replay(sketch, lambda site, sampled: sampled)[1] if d.kind == "compute_location"]
        sites = [s for s in space.sites(sketch, locations=True) if s.kind == "compute_location"]
        assert len(own) == len(sites)
        for decision, site in zip(own, sites, strict=True):
            assert -1 in site.candidates and decision.value in site.candidates
    site = next(s for s in space.sites(0, locations=True) if s.kind == "compute_location")
    illegal = next(v for v in range(-2, 12) if v not in site.candidates)

    def decide(s, sampled):
        return illegal if s.index == site.index else sampled

    assert space.replay(0, decide, locations=True) is None  # TVM would have snapped it silently


def test_fixed_decisions_must_match_the_sites(spaces):
    space = spaces["fused_dense_add_relu"]
    point = sample_point(space, random.Random(1))
    wrong = (Decision("categorical", 0), *point.decisions[1:])
    assert replay_point(space, point.sketch, wrong) is None
    assert replay_point(space, point.sketch, point.decisions[:-1]) is None


def test_x86_sketches_are_in_one_order_on_every_isa():
    """MetaSchedule's rules, left to the target, list a reduction's x86 sketches in opposite orders
    for AVX2 and AVX-512 (docs/tvm-0.27-notes.md); DesignSpace gives every x86 ISA AVX2's order, so a
    sketch index (records, sites, the TLM's sketch token) means one schedule everywhere. The old
    order is kept readable: sketch_order.old_to_new maps it (reversed for the softmax)."""
    from tvm import te, topi

    from tlmpack.lower.x86 import x86_target
    from tlmpack.schedule.space import DesignSpace
    from tlmpack.training.sketch_order import old_to_new, target_reordered

    def traces(func, cpu: str) -> list[str]:
        return [str(s.trace) for s in DesignSpace(func, x86_target(cpu, 1).tvm_target()).sketches]

    x = te.placeholder((1, 12, 128, 128), name="x")
    softmax = te.create_prim_func([x, topi.nn.softmax(x, axis=-1)])
    a, w = te.placeholder((64, 32), name="A"), te.placeholder((48, 32), name="W")
    dense = te.create_prim_func([a, w, topi.nn.relu(topi.nn.dense(a, w))])
    for func in (softmax, dense):
        avx2 = traces(func, "znver2")
        assert len(avx2) > 2 and traces(func, "znver4") == avx2 == traces(func, "skylake-avx512")
    assert target_reordered("znver4", 1) and not target_reordered("znver2", 1)
    n = len(traces(softmax, "znver2"))
    assert old_to_new(softmax, "znver4", 1) == list(range(n))[::-1]
    assert old_to_new(softmax, "znver2", 1) == list(range(n))
    assert old_to_new(dense, "znver4", 1) == [0, 1, 2]
