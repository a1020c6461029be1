"""The ranking phase of TLM training: which measured programs of a group it ranks, with what
target weights, and that its listwise loss moves the decoder's probability from the slow
program to the fast one (which the taste's loss, trained on the fast ones only, does not do
explicitly)."""

from __future__ import annotations

import math

import pytest

from tlmpack.training.dataset import RANK_TIE, Example, rank_programs


def _record(us: float, tile: int) -> dict:
    return {"target": "x86", "min_us": us, "median_us": us, "sketch": 0, "decisions": [["tile", [tile, 1]]]}


def test_rank_programs_keeps_each_program_once_with_its_fastest_time_and_the_slow_ones_too():
    records = sorted([_record(10.0, 1), _record(11.0, 1), _record(12.0, 2), *[_record(20.0 + i, 10 + i)
                                                                              for i in range(20)]],
                     key=lambda r: r["min_us"])
    picked = rank_programs(records, k=6, beta=6.0)
    tiles = [r["decisions"][0][1][0] for r, _ in picked]
    assert len(picked) == 6 and len(set(tiles)) == 6 and tiles[:3] == [1, 2, 10]
    assert picked[0][0]["min_us"] == 10.0 and picked[0][1] == 1.0  # the duplicate's slower time is dropped
    assert max(tiles) >= 25  # the list reaches into the slow end of the group, not only the best
    weights = [w for _, w in picked]
    assert weights == sorted(weights, reverse=True)
    assert weights[1] == pytest.approx(math.exp(-6.0 * math.log(12.0 / 10.0)))


def test_rank_programs_skips_a_group_whose_programs_are_all_within_the_noise():
    records = [_record(10.0, 1), _record(10.0 * (1 + RANK_TIE / 2), 2)]
    assert rank_programs(records, k=8, beta=6.0) == []
    assert rank_programs([_record(10.0, 1)], k=8, beta=6.0) == []


def _tiny_model():
    from tlmpack.tlm.model import ModelShape, new_model

    return new_model(ModelShape(n_layer=1, n_head=2, n_embd=32), seed=0)


def _two_programs() -> tuple[tuple[Example, float], ...]:
    """Two sentences that differ at one decision (token 10 or 11, both legal), the first 4x likelier
    to be wanted."""
    legal = (10, 11, 12)
    fast = Example((1, 5, 6, 7, 10, 2), ((4, legal),))
    slow = Example((1, 5, 6, 7, 11, 2), ((4, legal),))
    return ((fast, 0.8), (slow, 0.2))


def test_sequence_log_probs_is_the_masked_decoders_log_probability_of_the_program():
    import torch

    from tlmpack.training.train import _batch, masked_loss, sequence_log_probs

    model = _tiny_model()
    (fast, _), (slow, _) = _two_programs()
    batch = _batch([fast, slow], "cpu", model.config.vocab_size)
    with torch.no_grad():
        scores = sequence_log_probs(model, batch, 2)
        nll, _ = masked_loss(model, _batch([fast], "cpu", model.config.vocab_size))
    assert float(scores[0]) == pytest.approx(-float(nll), abs=1e-5)
    assert math.exp(float(scores[0])) + math.exp(float(scores[1])) < 1.0  # token 12 keeps the rest


def test_rank_loss_moves_probability_from_the_slow_program_to_the_fast_one():
    import torch

    from tlmpack.training.train import _batch, rank_loss, sequence_log_probs

    torch.manual_seed(0)
    model = _tiny_model()
    group = _two_programs()
    # start from a model that prefers the slow program, as one trained on it would
    group_backwards = ((group[0][0], 0.01), (group[1][0], 0.99))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(30):
        loss, _ = rank_loss(model, [group_backwards], "cpu", model.config.vocab_size)
        opt.zero_grad()
        loss.backward()
        opt.step()
    batch = _batch([ex for ex, _ in group], "cpu", model.config.vocab_size)
    with torch.no_grad():
        before = sequence_log_probs(model, batch, 2)
    assert float(before[1]) > float(before[0])
    for _ in range(60):
        loss, hits = rank_loss(model, [group], "cpu", model.config.vocab_size)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        after = sequence_log_probs(model, batch, 2)
    assert float(after[0]) > float(after[1]) and hits == 1.0
    # the fitted odds approach the target's 4:1
    assert float(after[0] - after[1]) == pytest.approx(math.log(4.0), abs=0.35)


def test_rank_timing_keeps_only_the_groups_timed_that_way():
    """The ranking lists of older, burst-timed groups order programs by the timer's drift as much
    as by their speed; ``rank_timing`` leaves them out and keeps the taste and grammar whole."""
    from collections import defaultdict

    from tlmpack.training.dataset import _groups, build_training_set, heldout_keys
    from tlmpack.training.sites import load_sites
    from tlmpack.training.store import Store, default_root

    store = Store(default_root())
    timings: dict[str, set[str]] = defaultdict(set)
    for key in _groups(store, "x86", heldout_keys(store, "x86")):
        timings[key[0]].add(key[3])
    mixed = {k for k, t in timings.items() if {"", "interleaved"} <= t}
    sites = load_sites(store, "x86")
    tasks = set(sorted(mixed & set(sites))[:4])
    assert tasks
    every = build_training_set(store, "x86", sites, tasks=tasks, random_per_sketch=0, rank_k=8)
    interleaved = build_training_set(store, "x86", sites, tasks=tasks, random_per_sketch=0, rank_k=8,
                                     rank_timing="interleaved")
    assert 0 < len(interleaved.ranking) < len(every.ranking)
    assert len(interleaved.taste) == len(every.taste) and len(interleaved.grammar) == len(every.grammar)
