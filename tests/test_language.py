"""The tensor language: a fixed vocabulary, exact round trips, and sentences that build."""

from __future__ import annotations

import dataclasses
import random

import pytest
from tlm_tasks import example_tasks, x86_space

from tlmpack.schedule.hardware import X86Hardware, cuda_hardware
from tlmpack.schedule.records import Decision
from tlmpack.tlm import language as L
from tlmpack.training.sample import replay_point, sample_point

X86 = X86Hardware(cores=2, vector_bits=256, vector_registers=16, l1d_bytes=32 * 1024, l2_bytes=512 * 1024,
                  l3_bytes=32 * 1024 * 1024)


def test_vocabulary_is_fixed_for_this_version():
    # Changing the vocabulary must bump LANGUAGE_VERSION and this pin together.
    assert L.LANGUAGE_VERSION == 1
    assert len(L.VOCAB) == len(set(L.VOCAB)) == 4290
    assert L.VOCAB_SHA256.startswith("bef4063edbca462e")
    assert L.TOKEN_ID["[PAD]"] == 0 and L.VOCAB[-1] == str(L.MAX_SMALL)


def test_op_words_of_task_names():
    assert L.op_words("fused_matmul3_add4") == ("matmul", "add")
    assert L.op_words("fused_conv2d1_add_relu") == ("conv2d", "add", "relu")
    assert L.op_words("fused_softmax_broadcast_to3") == ("softmax", "broadcast", "to")
    assert L.op_words("fused_frobnicate_add") == ("unk", "add")


def test_big_numbers_are_spelled_in_digits():
    task = L.TaskInfo("matmul", ("matmul",), (1, 128, 50257), (4096,), ("float32",))
    s = L.Sentence(X86, task, 3, (Decision("tile", (50257, 1, 1, 1)), Decision("compute_location", -2),
                                  Decision("compute_location", 5000), Decision("categorical", 2)))
    toks = L.tokens(s)
    assert toks[toks.index("spatial") + 3:toks.index("spatial") + 10] == ["[NUM]", "5", "0", "2", "5", "7", "[/NUM]"]
    assert L.decode(L.encode(s)) == s


def test_malformed_sentences_are_refused():
    task = L.TaskInfo("reduce", ("softmax",), (4, 32), (32,), ("float32",))
    ids = L.encode(L.Sentence(X86, task, 0, (Decision("categorical", 1),)))
    with pytest.raises(ValueError):
        L.decode(ids[:-1])  # no [EOS]
    with pytest.raises(ValueError):
        L.decode([*ids, L.TOKEN_ID["[EOS]"]])
    with pytest.raises(ValueError):
        L.decode([ids[0], L.TOKEN_ID["tile"], *ids[1:]])
    with pytest.raises(ValueError):
        L.encode(L.Sentence(X86, L.TaskInfo("reduce", ("frobnicate",), (), (), ()), 0, ()))


@pytest.fixture(scope="module")
def sentences():
    """Random legal points of several real tasks, as (space, sentence) on x86 and as H200 sentences."""
    out = []
    rng = random.Random(11)
    for name, func in example_tasks().items():
        space = x86_space(func)
        info = L.describe_task(func, name)
        for _ in range(5):
            point = sample_point(space, rng)
            if point is not None:
                out.append((space, L.Sentence(X86, info, point.sketch, point.decisions)))
                out.append((None, L.Sentence(cuda_hardware("sm_90"), info, point.sketch, point.decisions)))
    return out


def test_round_trip_over_random_points(sentences):
    assert len(sentences) >= 30
    kinds = {d.kind for _, s in sentences for d in s.decisions}
    assert kinds == {"tile", "categorical", "compute_location"}
    for _, s in sentences:
        ids = L.encode(s)
        assert all(0 <= i < len(L.VOCAB) for i in ids)
        assert L.decode(ids) == s


def test_every_written_sentence_replays_and_builds(sentences):
    import tvm

    from tlmpack.lower.x86 import x86_target

    funcs = {}
    for i, (space, s) in enumerate(sentences):
        if space is None:
            continue
        back = L.decode(L.encode(s))
        point = replay_point(space, back.sketch, back.decisions)
        assert point is not None, s
        funcs[f"p{i}"] = point.func.with_attr("global_symbol", f"p{i}")
    executable = tvm.compile(tvm.IRModule(funcs), target=x86_target(num_cores=2).tvm_target())
    for name in funcs:
        assert executable.mod.implements_function(name) or executable[name] is not None


def test_guided_sentences_carry_the_rules_hint_and_round_trip(sentences):
    from tlmpack.tlm.decode import prompt_ids

    (_, first), (_, second) = sentences[0], sentences[2]
    guided = dataclasses.replace(second, hint=L.Hint(first.sketch, first.decisions))
    ids = L.encode(guided)
    assert L.decode(ids) == guided
    toks = L.tokens(guided)
    assert toks.count("sketch") == 2 and toks.count("[EOS]") == 2
    assert toks[-len(L.tokens(second)) + toks.index("sketch"):] == L.tokens(second)[L.tokens(second).index("sketch"):]
    prompt = prompt_ids(dataclasses.replace(guided, decisions=()))  # what decoding starts from: up to the own sketch
    assert prompt == ids[: len(prompt)] and L.VOCAB[prompt[-1]] == "sketch" and len(prompt) > toks.index("[SEP]")
    no_rule = dataclasses.replace(second, hint=L.NO_HINT)
    assert L.decode(L.encode(no_rule)) == no_rule and "[UNK]" in L.tokens(no_rule)
    head = L.tokens(second)[: L.tokens(second).index("sketch")]
    with pytest.raises(ValueError, match="no sketch"):  # the model's own schedule always has one
        L.decode_tokens([*head, "sketch", "[UNK]", "[EOS]"])
