"""The TLM: its numpy forward pass, masked decoding (legal, deterministic), the fallback to the
rules, the shipped weights, and a smoke training run from the committed data."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from tlm_tasks import example_tasks, x86_space

from tlmpack.schedule.hardware import X86Hardware
from tlmpack.tlm.language import TOKEN_ID, VOCAB, describe_task

HARDWARE = X86Hardware(2, 256, 16, 32 * 1024, 512 * 1024, 32 * 1024 * 1024)


@pytest.fixture(scope="module")
def shipped():
    from tlmpack.tlm.model import load

    return load("x86")


def test_numpy_forward_matches_transformers_logits(shipped):
    import torch

    ids = [TOKEN_ID["[BOS]"], TOKEN_ID["target:x86"], TOKEN_ID["cores"], TOKEN_ID["2"], TOKEN_ID["kind:matmul"],
           TOKEN_ID["op:dense"], TOKEN_ID["spatial"], TOKEN_ID["32"], TOKEN_ID["48"]]
    with torch.no_grad():
        expected = shipped.torch_model()(input_ids=torch.tensor([ids])).logits[0].numpy()
    cache = shipped.net.start()
    got = [shipped.net.logits(shipped.net.step(ids[:4], cache))]
    for t in ids[4:]:  # then token by token through the cache
        got.append(shipped.net.logits(shipped.net.step([t], cache)))
    np.testing.assert_allclose(got[0], expected[3], atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(np.stack(got[1:]), expected[4:], atol=1e-4, rtol=1e-4)


def test_shipped_weights_are_package_data_with_the_vocabulary_hash(shipped):
    from safetensors import safe_open

    from tlmpack.tlm.language import VOCAB_SHA256
    from tlmpack.tlm.model import weights_path

    for target in ("x86", "cuda"):
        path = weights_path(target)
        assert path.is_file() and path.stat().st_size <= 50 * 2**20
        with safe_open(str(path), "np") as f:
            assert f.metadata()["vocab_sha256"] == VOCAB_SHA256
    assert shipped.summary.tasks > 100 and "matmul" in shipped.summary.kinds


def test_weights_of_another_vocabulary_are_refused(tmp_path, shipped):
    from safetensors.numpy import save_file

    from tlmpack.tlm.model import TLMUnavailable, load_file

    path = tmp_path / "other.safetensors"
    save_file(shipped.state, str(path), metadata={"format": "tlmpack-tlm", "vocab_sha256": "0" * 64})
    with pytest.raises(TLMUnavailable, match="another vocabulary"):
        load_file(path, "x86")
    with pytest.raises(TLMUnavailable, match="not installed"):
        load_file(tmp_path / "missing.safetensors", "x86")


@pytest.fixture(scope="module")
def spaces():
    return {name: (func, x86_space(func)) for name, func in example_tasks().items()}


def test_every_decoded_schedule_is_a_legal_point_of_its_space(shipped, spaces):
    from tlmpack.tlm.decode import decode_space
    from tlmpack.training.sample import replay_point

    for name, (func, space) in spaces.items():
        decoded = decode_space(shipped, space, HARDWARE, describe_task(func, name), samples=3)
        assert decoded, name
        for d in decoded:
            again = replay_point(space, d.sketch, d.decisions)  # the Space Builder accepts it as it is
            assert again is not None and again.decisions == d.decisions, name
            assert 0.0 < d.confidence <= 1.0


def test_greedy_decoding_gives_the_same_schedule_every_time(shipped, spaces):
    from tlmpack.tlm.decode import decode_space

    func, space = spaces["fused_dense_add_relu"]
    info = describe_task(func, "fused_dense_add_relu")
    first, second = (decode_space(shipped, space, HARDWARE, info)[0] for _ in range(2))
    assert (first.sketch, first.decisions) == (second.sketch, second.decisions)
    samples = decode_space(shipped, space, HARDWARE, info, samples=4, seed=1)
    assert len({(d.sketch, d.decisions) for d in samples}) == len(samples) > 1  # distinct candidates


def test_tasks_unlike_training_are_out_of_distribution(shipped):
    from tlmpack.tlm.decode import out_of_distribution
    from tlmpack.tlm.language import TaskInfo

    ok = TaskInfo("matmul", ("matmul", "add"), (32, 48), (64,), ("float32",))
    assert out_of_distribution(shipped, ok) is None
    assert "op topk never seen" in out_of_distribution(shipped, dataclasses.replace(ok, ops=("topk",)))
    assert "far outside" in out_of_distribution(shipped, dataclasses.replace(ok, spatial=(1 << 20, 1 << 20)))


def test_an_x86_of_a_vector_width_never_seen_in_training_is_out_of_distribution(shipped):
    from tlmpack.schedule.hardware import detect_x86
    from tlmpack.tlm.decode import out_of_distribution
    from tlmpack.tlm.language import TaskInfo

    task = TaskInfo("matmul", ("matmul", "add"), (32, 48), (64,), ("float32",))
    avx2, avx512 = detect_x86(("avx2", "fma"), cores=2), detect_x86(("avx512f", "avx2", "fma"), cores=2)
    seen_avx2 = dataclasses.replace(shipped, summary=dataclasses.replace(shipped.summary, vector_bits=(256,)))
    assert out_of_distribution(seen_avx2, task, avx2) is None
    assert out_of_distribution(seen_avx2, task, avx512) == \
        "x86 with 512-bit vectors never seen in training (it saw 256-bit)"
    unrecorded = dataclasses.replace(shipped, summary=dataclasses.replace(shipped.summary, vector_bits=()))
    assert out_of_distribution(unrecorded, task, avx512) is None  # weights from before the field: no test


def test_a_build_falls_back_to_the_rules_and_says_why(tmp_path, shipped):
    """Weights whose training saw no matmul: every matmul task is scheduled by the rules, and the
    manifest's note names the reason."""
    import tarfile

    from safetensors.numpy import save_file

    from tlmpack.build import BuildOptions, build
    from tlmpack.tlm.model import LANGUAGE_VERSION, VOCAB_SHA256

    summary = dataclasses.replace(shipped.summary, kinds=("reduce",))
    weights = tmp_path / "x86.safetensors"
    meta = {"format": "tlmpack-tlm", "language_version": str(LANGUAGE_VERSION), "vocab_sha256": VOCAB_SHA256,
            "shape": json.dumps(dataclasses.asdict(shipped.shape)), "summary": json.dumps(summary.to_json())}
    save_file(shipped.state, str(weights), metadata=meta)
    build("tlmpack.zoo:mlp_factory", tmp_path / "mlp.tar", BuildOptions(scheduler="tlm",
                                                                      tlm_weights={"x86": str(weights)}))
    with tarfile.open(tmp_path / "mlp.tar") as t:
        manifest = json.load(t.extractfile("manifest.json"))
    notes = [s["schedules"][0] for s in manifest["subgraphs"]]
    assert all(n["chosen_by"] == "heuristic" and n["note"].startswith("tlm fallback: kind matmul never seen")
               for n in notes)


def test_training_examples_score_only_legal_tokens():
    from tlmpack.training.dataset import build_training_set, measured_tasks
    from tlmpack.training.sites import load_sites
    from tlmpack.training.store import Store, default_root

    store = Store(default_root())
    sites = load_sites(store, "x86")
    data = build_training_set(store, "x86", sites, tasks=set(sorted(set(sites) & measured_tasks(store, "x86"))[:20]),
                              random_per_sketch=1)
    assert data.grammar and data.taste
    for ex in data.grammar[:200] + data.taste[:200]:
        for pos, legal in ex.scored:
            assert ex.ids[pos] in legal and all(0 <= t < len(VOCAB) for t in legal)
    weights_per_task = {}
    for ex in data.taste:
        weights_per_task.setdefault(ex.ids[:20], []).append(ex.weight)
    assert max(max(w) for w in weights_per_task.values()) > min(min(w) for w in weights_per_task.values())


def test_heldout_tasks_are_in_no_training_sentence():
    from tlmpack.training.dataset import build_training_set, heldout_keys, measured_tasks
    from tlmpack.training.sites import load_sites
    from tlmpack.training.store import Store, default_root

    store = Store(default_root())
    held = heldout_keys(store, "x86")
    assert len(held) >= 10
    sites = load_sites(store, "x86")
    some = set(sorted(held)[:3]) | set(sorted((set(sites) & measured_tasks(store, "x86")) - held)[:3])
    data = build_training_set(store, "x86", sites, tasks=some, random_per_sketch=1)
    assert data.tasks and not (data.tasks & held)


def test_smoke_training_run_writes_loadable_weights(tmp_path):
    from click.testing import CliRunner

    from tlmpack.cli import main
    from tlmpack.schedule.space import SPACE_VERSION
    from tlmpack.tlm.model import load_file, set_summary_fields

    out = tmp_path / "smoke.safetensors"
    result = CliRunner().invoke(main, ["tlm", "train", "--target", "x86", "--smoke", "--device", "cpu",
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    loaded = load_file(out, "x86")
    assert loaded.sha256 == report["sha256"] and loaded.summary.tasks > 0
    assert loaded.summary.space_version == SPACE_VERSION  # the space its sites were computed on
    assert 256 in loaded.summary.vector_bits  # the widths of its records: the committed ones hold AVX2 (256-bit)
    assert loaded.summary.channels_last == (report["channels_last_convs"] > 0)  # builds hand it what it saw

    set_summary_fields(out, space_version=1)
    assert load_file(out, "x86").summary.space_version == 1
    with pytest.raises(TypeError):
        set_summary_fields(out, no_such_field=1)


def test_a_guided_model_trains_after_the_rules_hints_and_decodes_legal_points_after_them(tmp_path, spaces):
    """--guided: every sentence starts with the rules' schedule of its task (data/hints/); the weights
    say so, and decoding (a build, `tlm generate`) shows the model the rules' point first."""
    from click.testing import CliRunner

    from tlmpack.cli import main
    from tlmpack.lower.x86 import x86_target
    from tlmpack.schedule.select import hint_for, rules_hint
    from tlmpack.tlm.decode import decode_space
    from tlmpack.tlm.model import load_file
    from tlmpack.training.sample import replay_point

    out = tmp_path / "guided.safetensors"
    result = CliRunner().invoke(main, ["tlm", "train", "--target", "x86", "--smoke", "--guided", "--device", "cpu",
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    guided = load_file(out, "x86")
    assert guided.summary.guided and guided.shape.n_positions >= 256
    func, space = spaces["fused_dense_add_relu"]
    tvm_target = x86_target(num_cores=2).tvm_target()
    hint = hint_for(guided, func, tvm_target, "x86", HARDWARE)
    assert hint == rules_hint(func, tvm_target, "x86", HARDWARE) and hint.sketch >= 0 and hint.decisions
    info = describe_task(func, "fused_dense_add_relu")
    (d,) = decode_space(guided, space, HARDWARE, info, hint=hint)
    again = replay_point(space, d.sketch, d.decisions)
    assert again is not None and again.decisions == d.decisions
    assert decode_space(guided, space, HARDWARE, info, hint=hint)[0].decisions == d.decisions  # deterministic

    init = CliRunner().invoke(main, ["tlm", "train", "--target", "x86", "--smoke", "--device", "cpu", "--init",
                                     str(out), "--out", str(tmp_path / "mixed.safetensors")])
    assert init.exit_code != 0 and "guided" in str(init.exception)  # unguided sentences on guided weights


def test_guided_training_without_hints_says_how_to_make_them(tmp_path):
    import shutil

    from click.testing import CliRunner

    from tlmpack.cli import main
    from tlmpack.training.store import default_root

    data = tmp_path / "data"
    shutil.copytree(default_root(), data, ignore=shutil.ignore_patterns("hints", "records"))
    result = CliRunner().invoke(main, ["tlm", "train", "--target", "x86", "--smoke", "--guided", "--device", "cpu",
                                       "--data-dir", str(data), "--out", str(tmp_path / "w.safetensors")])
    assert result.exit_code != 0 and "tlmpack tlm hints --target x86" in result.output


def test_two_tlm_builds_in_fresh_processes_are_byte_identical(tmp_path):
    import subprocess
    import sys

    tars = []
    for name in ("a.tar", "b.tar"):
        out = tmp_path / name
        subprocess.run([sys.executable, "-m", "tlmpack.cli", "build", "tlmpack.zoo:mlp_factory", "-o", str(out),
                        "--scheduler", "tlm"], check=True, capture_output=True, timeout=600)
        tars.append(out.read_bytes())
    assert tars[0] == tars[1]


def test_generate_prints_a_decodable_sentence_per_candidate():
    from click.testing import CliRunner

    from tlmpack.cli import main
    from tlmpack.tlm.language import decode_tokens
    from tlmpack.training.store import Store, default_root

    key = Store(default_root()).task_keys()[0]
    result = CliRunner().invoke(main, ["tlm", "generate", "--target", "x86", "--task", key[:8], "--samples", "2"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.strip().splitlines() if line.startswith("{")]
    assert lines and lines[0]["rank"] == 0 and lines[0]["task"] == key
    for line in lines:
        sentence = decode_tokens(line["sentence"].split())
        assert [d.to_json() for d in sentence.decisions] == line["decisions"]


def test_tune_measures_the_tlm_and_rules_candidates_and_keeps_the_fastest(tmp_path):
    import tarfile

    from tlmpack.build import BuildOptions, build

    build("tlmpack.zoo:mlp_factory", tmp_path / "tuned.tar", BuildOptions(scheduler="tlm", tune=3))
    with tarfile.open(tmp_path / "tuned.tar") as t:
        manifest = json.load(t.extractfile("manifest.json"))
    assert manifest["build_options"]["tune"] == 3
    for subgraph in manifest["subgraphs"]:
        (schedule,) = subgraph["schedules"]
        assert schedule["chosen_by"] == "search" and "measured here" in schedule["note"]
        assert "heuristic" in schedule["note"] and "tlm_greedy" in schedule["note"]


def test_auto_runs_the_tlm_on_x86_and_the_rules_on_cuda():
    from tlmpack.build import BuildOptions
    from tlmpack.schedule.select import scheduler_for

    assert BuildOptions().scheduler == "auto"
    assert scheduler_for("x86", "auto") == "tlm" and scheduler_for("cuda", "auto") == "heuristic"
    assert scheduler_for("x86", "auto", cross_cpu=True) == "heuristic"  # another CPU: the rules
    assert scheduler_for("x86", "tlm", cross_cpu=True) == "tlm"
    assert scheduler_for("cuda", "tlm") == "tlm" and scheduler_for("cuda", "baseline") == "dlight"
    assert scheduler_for("x86", "baseline") == "baseline"


def test_sites_of_a_task_with_a_record_on_a_newer_sketch_are_recomputed(tmp_path):
    """A sketch appended to the space after a task's sites were cached (a convolution's implicit
    GEMM) makes its cached sites stale: training would have no mask for that sketch's records."""
    from tlmpack.training.sites import stale_tasks
    from tlmpack.training.store import Store

    store = Store(tmp_path)
    base = {"v": 1, "target": "cuda", "valid": True, "decisions": []}
    store.writer("cuda", "r").append([{**base, "task": "old", "sketch": 3}, {**base, "task": "fine", "sketch": 1},
                                      {**base, "task": "uncached", "sketch": 5}])
    cached = {"old": [[], [], []], "fine": [[], []]}
    assert stale_tasks(store, "cuda", cached) == {"old"}


def test_a_guided_taste_copies_the_rules_unless_a_measured_program_beats_them():
    from tlmpack.schedule.records import Decision
    from tlmpack.tlm.language import Hint
    from tlmpack.training.dataset import edit_taste

    def rec(us: float, tile: int) -> dict:
        return {"target": "cuda", "median_us": us, "sketch": 0, "decisions": [["tile", [tile, 1]]]}

    hint = Hint(0, (Decision("tile", (4, 1)),))
    rules_best = [rec(10.0, 4), rec(10.2, 8), rec(30.0, 2)]  # 10.2: within the noise of the rules' 10.0
    assert edit_taste(rules_best, hint, [(r, 1 / 3) for r in rules_best], 8, 6.0) == [(rules_best[0], 1.0)]
    beaten = [rec(5.0, 16), rec(6.0, 8), rec(10.0, 4)]
    picked = edit_taste(beaten, hint, [(r, 1 / 3) for r in beaten], 8, 6.0)
    assert [r["decisions"] for r, _ in picked] == [[["tile", [16, 1]]], [["tile", [8, 1]]]]
    assert picked[0][1] > picked[1][1] and abs(sum(w for _, w in picked) - 1.0) < 1e-9
    unmeasured = [rec(5.0, 16), rec(6.0, 8)]
    assert edit_taste(unmeasured, hint, [(unmeasured[0], 1.0)], 8, 6.0) == [(unmeasured[0], 0.5)]


def test_an_anchor_margin_keeps_the_rules_point_unless_the_model_is_clearly_surer(tmp_path, shipped, spaces):
    """anchor_margin: greedy decoding keeps the rules' token unless the model's best beats it by the
    margin (log-probability). Past every gap it writes the rules' schedule itself; at 0 it is plain greedy."""
    import shutil

    from tlmpack.lower.x86 import x86_target
    from tlmpack.schedule.select import hint_for, rules_hint
    from tlmpack.tlm.decode import decode_space
    from tlmpack.tlm.model import load_file, set_summary_fields, weights_path

    path = tmp_path / "anchored.safetensors"
    shutil.copy(weights_path("x86"), path)
    set_summary_fields(path, anchor_margin=1e9)
    anchored = load_file(path, "x86")
    unanchored = tmp_path / "unanchored.safetensors"
    shutil.copy(weights_path("x86"), unanchored)
    set_summary_fields(unanchored, anchor_margin=0.0)
    plain_model = load_file(unanchored, "x86")
    tvm_target = x86_target(num_cores=2).tvm_target()
    differs = 0
    for name, (func, space) in spaces.items():
        info = describe_task(func, name)
        hint = hint_for(anchored, func, tvm_target, "x86", HARDWARE)
        assert hint == rules_hint(func, tvm_target, "x86", HARDWARE)
        (d,) = decode_space(anchored, space, HARDWARE, info, hint=hint)
        assert (d.sketch, d.decisions) == (hint.sketch, hint.decisions), name
        plain = decode_space(plain_model, space, HARDWARE, info, hint=hint)[0]  # margin 0: the hint is not read
        assert hint_for(plain_model, func, tvm_target, "x86", HARDWARE) is None
        differs += (plain.sketch, plain.decisions) != (d.sketch, d.decisions)
    assert differs  # the model alone departs from the rules somewhere, so the test can fail


def test_the_build_point_is_the_tlms_where_it_is_trusted_and_the_rules_elsewhere(tmp_path, shipped, spaces):
    """schedule.select.tlm_build_point: what `tlm measure --built` measures as the build's pick."""
    from safetensors.numpy import save_file

    from tlmpack.lower.x86 import x86_target
    from tlmpack.schedule.select import SelectOptions, rules_hint, tlm_build_point
    from tlmpack.tlm.model import LANGUAGE_VERSION, VOCAB_SHA256, weights_path

    func, _ = spaces["fused_dense_add_relu"]
    tvm_target = x86_target(num_cores=2).tvm_target()
    trusted = tlm_build_point(func, tvm_target, "x86", HARDWARE, "fused_dense_add_relu",
                              SelectOptions("tlm", tlm_weights={"x86": str(weights_path("x86"))}))
    assert trusted is not None and trusted[2] in ("tlm", "heuristic")
    summary = dataclasses.replace(shipped.summary, kinds=("reduce",))  # a model that never saw a matmul
    weights = tmp_path / "x86.safetensors"
    save_file(shipped.state, str(weights), metadata={
        "format": "tlmpack-tlm", "language_version": str(LANGUAGE_VERSION), "vocab_sha256": VOCAB_SHA256,
        "shape": json.dumps(dataclasses.asdict(shipped.shape)), "summary": json.dumps(summary.to_json())})
    fallback = tlm_build_point(func, tvm_target, "x86", HARDWARE, "fused_dense_add_relu",
                               SelectOptions("tlm", tlm_weights={"x86": str(weights)}))
    hint = rules_hint(func, tvm_target, "x86", HARDWARE)
    assert fallback == (hint.sketch, hint.decisions, "heuristic")


def test_a_failed_check_sends_an_anchored_model_to_the_rules_and_never_refuses_the_rules_point(tmp_path, spaces):
    import shutil

    from tlmpack.lower.x86 import x86_target
    from tlmpack.schedule.select import PointCheck, _first_that_fits, rules_hint
    from tlmpack.tlm.decode import decode_space
    from tlmpack.tlm.model import load_file, set_summary_fields, weights_path

    path = tmp_path / "anchored.safetensors"
    shutil.copy(weights_path("x86"), path)
    set_summary_fields(path, anchor_margin=1e9)
    anchored = load_file(path, "x86")
    func, space = spaces["fused_dense_add_relu"]
    info = describe_task(func, "fused_dense_add_relu")
    hint = rules_hint(func, x86_target(num_cores=2).tvm_target(), "x86", HARDWARE)
    never = PointCheck(lambda d: False, lambda d: "refused by the test")
    decoded = decode_space(anchored, space, HARDWARE, info, hint=hint)
    assert _first_that_fits(decoded, never, hint) == (decoded[0], "")  # the rules' point
    other = dataclasses.replace(decoded[0], sketch=decoded[0].sketch + 1)
    assert _first_that_fits([other], never, hint) == (None, "refused by the test")


def test_tlm_hints_writes_the_rules_point_of_each_recorded_task_and_hardware(tmp_path):
    import shutil

    from click.testing import CliRunner

    from tlmpack.cli import main
    from tlmpack.training.corpus import load_func
    from tlmpack.training.hints import hardware_key, load_hints, rules_hint_for
    from tlmpack.training.store import Store, default_root

    source = Store(default_root())
    keys = sorted(source.task_keys())[:2]
    data = tmp_path / "data"
    shutil.copytree(default_root(), data, ignore=shutil.ignore_patterns("records", "hints"))
    hardware = {"cores": 1, "kind": "x86", "l1d_bytes": 32768, "l2_bytes": 524288, "l3_bytes": 33554432,
                "vector_bits": 256, "vector_registers": 16}
    Store(data).writer("x86", "test").append([{"task": k, "target": "x86", "valid": True, "hardware": hardware,
                                               "sketch": 0, "decisions": [], "min_us": 1.0} for k in keys])
    result = CliRunner().invoke(main, ["tlm", "hints", "--target", "x86", "--data-dir", str(data)])
    assert result.exit_code == 0, result.output
    hints = load_hints(Store(data), "x86")
    assert sorted(hints) == [(k, hardware_key(hardware)) for k in keys]
    for key in keys:
        assert hints[(key, hardware_key(hardware))] == rules_hint_for(load_func(source.task(key)), "x86", hardware)
    first = (data / "hints" / "x86.json.gz").read_bytes()
    assert CliRunner().invoke(main, ["tlm", "hints", "--target", "x86", "--data-dir", str(data)]).exit_code == 0
    assert (data / "hints" / "x86.json.gz").read_bytes() == first  # the same hints, the same bytes


def test_hints_follow_the_recorded_machine_not_the_one_computing_them():
    """The rules' point of an AVX-512 record has AVX-512 tiles wherever the hints are computed."""
    from tvm import te

    from tlmpack.training.hints import rules_hint_for

    a, w = te.placeholder((128, 768), name="A"), te.placeholder((768, 768), name="W")
    k = te.reduce_axis((0, 768), name="k")
    func = te.create_prim_func([a, w, te.compute((128, 768), lambda i, j: te.sum(a[i, k] * w[k, j], axis=k))])
    caches = {"l1d_bytes": 49152, "l2_bytes": 2097152, "l3_bytes": 33554432}
    avx2 = {"cores": 1, "kind": "x86", "vector_bits": 256, "vector_registers": 16, "llvm_cpu": "haswell", **caches}
    avx512 = {**avx2, "vector_bits": 512, "vector_registers": 32, "llvm_cpu": "skylake-avx512"}
    inner = {name: [d.value for d in rules_hint_for(func, "x86", hw).decisions if d.kind == "tile"][1][-1]
             for name, hw in (("avx2", avx2), ("avx512", avx512))}
    assert inner == {"avx2": 16, "avx512": 32}  # two vectors of 8 or of 16 lanes
