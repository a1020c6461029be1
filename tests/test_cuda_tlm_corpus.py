"""The CUDA corpus as builds see it (training/onnx_corpus.py) and the random sampler's coverage of
the appended GEMM sketches (training/cuda_programs.sample_cuda_point, gemm_decider)."""

from __future__ import annotations

import json
import random

import pytest


def _matmul(m: int, k: int, n: int):
    from tvm import te

    a = te.placeholder((m, k), name="A")
    b = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return te.create_prim_func([a, b, c])


@pytest.fixture(scope="module")
def space():
    from tlmpack.schedule.space import DesignSpace
    from tlmpack.training.cuda_programs import cuda_tvm_target

    return DesignSpace(_matmul(128, 768, 768), cuda_tvm_target())


def test_the_random_sampler_draws_the_appended_gemm_sketches(space):
    from tlmpack.training.cuda_programs import sample_cuda_point

    assert len(space.sketches) > space.metaschedule_sketches  # the task has the GEMM sketches
    rng = random.Random(3)
    points = [sample_cuda_point(space, rng, appended=True) for _ in range(24)]
    assert all(p.sketch < space.metaschedule_sketches  # without it, MetaSchedule's alone (as before)
               for p in (sample_cuda_point(space, random.Random(i)) for i in range(8)) if p is not None)
    sketches = {p.sketch for p in points if p is not None}
    assert any(s >= space.metaschedule_sketches for s in sketches)  # a legal point of an appended sketch
    assert any(s < space.metaschedule_sketches for s in sketches)  # and of MetaSchedule's


def test_gemm_decider_leaves_out_only_what_verify_gpu_code_refuses(space):
    """Threads over 1024 and staged tiles over the block's shared memory are never drawn; the
    values it keeps are the site's legal values."""
    from tlmpack.schedule.space import legal_values
    from tlmpack.training.cuda_programs import GEMM_ELEMENT_BYTES, MAX_SHARED_BYTES, gemm_decider

    gemm = space.metaschedule_sketches

    def recorder(decide, seen):
        def record(site, sampled):
            value = decide(site, sampled)
            assert value in legal_values(site)
            seen.append((site.kind, tuple(value) if site.kind == "tile" else value))
            return value
        return record

    for seed in range(12):
        seen: list = []
        space.replay(gemm, recorder(gemm_decider(random.Random(seed)), seen), locations=True)
        i, j, k = [v for kind, v in seen if kind == "tile"][:3]
        assert i[1] * j[1] <= 1024
        assert GEMM_ELEMENT_BYTES * k[-1] * (i[1] * i[2] + j[1] * j[2]) <= MAX_SHARED_BYTES


def test_a_batch_samples_gemm_sketches_and_carries_the_rules_point(tmp_path):
    from tlmpack.training import cuda_programs as cp
    from tlmpack.training.corpus import task_key
    from tlmpack.training.store import Store

    func = _matmul(64, 256, 256)
    key = task_key(func)
    store = Store(tmp_path / "data")
    store.put_task({"key": key, "name": "matmul", "num_outputs": 1, "script": func.script(), "kind": "matmul",
                    "dtypes": ["float32"] * 3})
    cp.build_batch(store, [key], per_task=6, out_dir=tmp_path / "b", seed=0, say=lambda s: None, heuristic=True)
    batch = cp.read_json(tmp_path / "b" / "batch.json.gz")
    programs = [p for p in batch["programs"] + batch["failed"] if not p["reference"]]
    (rules,) = [p for p in programs if p.get("chosen_by") == "heuristic"]
    assert rules["rule"] == "cuda-gemm"
    from tlmpack.schedule.space import DesignSpace

    space = DesignSpace(func, cp.cuda_tvm_target())
    assert any(p["sketch"] >= space.metaschedule_sketches for p in programs if p.get("chosen_by") != "heuristic")


def test_onnx_corpus_entry_is_append_only_and_merges_equal_tasks(tmp_path):
    from tlmpack.training.onnx_corpus import add_model
    from tlmpack.training.store import Store

    store = Store(tmp_path / "data")
    task = {"key": "00000000000000aa", "name": "fused_add", "calls": 2, "num_outputs": 1, "script": "s",
            "kind": "pointwise", "dtypes": ["float32"]}
    store.put_task({**task, "first_model": "earlier", "script": "kept"})
    got = add_model(store, "onnx-x", [task, {**task, "name": "fused_add1", "calls": 1},
                                      {**task, "key": "00000000000000bb"}], "onnx", [1, 3])
    assert got == {"tasks": 2, "new": 1}
    assert store.task("00000000000000aa")["script"] == "kept"  # an existing task file is not rewritten
    assert store.task("00000000000000bb")["first_model"] == "onnx-x"
    entry = json.loads(store.corpus_path("onnx-x").read_text())
    assert entry["source"] == "onnx" and [t["calls"] for t in entry["tasks"]] == [3, 2]


def test_onnx_corpus_keys_are_the_builds_task_keys(tmp_path):
    """A tiny ONNX model: its corpus keys are the structural hashes of the tasks build() lowers."""
    from tlmpack import zoo
    from tlmpack.training.onnx_corpus import build_tasks

    path = tmp_path / "mlp.onnx"
    zoo.export_onnx("mlp", path)
    tasks = build_tasks(path)
    assert tasks and all(len(t["key"]) == 16 for t in tasks)
    assert {t["kind"] for t in tasks} & {"matmul"}  # the dense layers, bias and activation fused in
    from tlmpack.training.corpus import load_func, task_key

    assert all(task_key(load_func(t)) == t["key"] for t in tasks)  # stored scripts hash back to their keys


def test_build_takes_a_keys_file_and_import_a_fixed_shard_name(tmp_path, capsys):
    import gzip

    from tlmpack.training import cuda_programs as cp
    from tlmpack.training.store import Store, default_root

    store = Store(default_root())
    small = sorted((len(store.task(k)["script"]), k) for k in store.task_keys()[:60]
                   if store.task(k)["kind"] == "pointwise")
    if not small:
        pytest.skip("no corpus tasks in data/")
    key = small[0][1]
    mine = Store(tmp_path / "data")
    mine.put_task(store.task(key))
    keys = tmp_path / "keys.txt"
    keys.write_text(f"{key}\n")
    cp.main(["build", str(tmp_path / "b"), "--keys", str(keys), "--per-task", "1", "--data", str(mine.root)])
    batch = cp.read_json(tmp_path / "b" / "batch.json.gz")
    assert list(batch["tasks"]) == [key]
    programs = [p for p in batch["programs"] if not p["reference"]]
    with gzip.open(tmp_path / "r.json.gz", "wt") as f:
        json.dump({"machine": {}, "results": [{"id": p["id"], "valid": True, "error": "", "rel_err": 0.0,
                                               "median_us": 2.0, "min_us": 2.0, "spread": 0.0, "repeats": 5}
                                              for p in programs]}, f)
    capsys.readouterr()
    cp.main(["import", str(tmp_path / "b"), str(tmp_path / "r.json.gz"), "--data", str(mine.root), "--run", "fixed"])
    assert json.loads(capsys.readouterr().out)["records"] == len(programs) >= 1
    assert (mine.root / "records" / "cuda" / "fixed.jsonl.gz").is_file()


def test_onnx_corpus_for_x86_holds_the_channels_last_convolutions_an_x86_build_schedules(tmp_path):
    """The x86 graph's convolution tasks are NHWC (output channels last), unlike the CUDA graph's,
    and their keys are what an x86 build's tasks hash to."""
    from tlmpack import zoo
    from tlmpack.training.corpus import load_func, task_key
    from tlmpack.training.onnx_corpus import build_tasks

    path = tmp_path / "resnet-tiny.onnx"
    zoo.export_onnx("resnet-tiny", path)
    convs = {t["key"]: t for t in build_tasks(path, ("x86",)) if "conv2d" in t["name"] and t["kind"] == "matmul"}
    cuda_convs = {t["key"] for t in build_tasks(path) if "conv2d" in t["name"]}
    assert convs and not set(convs) & cuda_convs
    first = next(iter(convs.values()))
    h, w, c = first["spatial"][1:4]  # N, H, W, C; W may be computed wider for whole register tiles (conv_width.py)
    assert h <= w <= h + h // 8 and c not in (h, w), first["spatial"]
    assert all(task_key(load_func(t)) == k for k, t in convs.items())
    # each convolution's constant kernel is the operand the build pre-packs, and the timer packs it
    assert all(t["weight_param"] == 1 for t in convs.values())
    assert all(t["weight_param"] is None for t in build_tasks(path, ("x86",)) if t["kind"] != "matmul")
