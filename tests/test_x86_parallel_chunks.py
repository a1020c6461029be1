"""bench/x86_parallel_chunks.py: each x86 kernel's parallel chunks as the rules schedule it for a target's cores."""

from __future__ import annotations

import numpy as np
from bench_scripts import load


def _pool_model(path):
    """x [1, 3, 16, 16] -> 3x3 conv to 48 channels -> ReLU -> global pool -> Gemm to 10: a pool of 3
    column tiles, which a 16-core build sums in 4 parts."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((48, 3, 3, 3)).astype(np.float32), "w")
    g = numpy_helper.from_array(rng.standard_normal((48, 10)).astype(np.float32), "g")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "g"], ["y"])]
    graph = helper.make_graph(nodes, "pool48", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], [w, g])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_pool_built_for_sixteen_cores_is_split_into_chunks_for_them_and_one_for_one_core_is_not(tmp_path):
    m = load("x86_parallel_chunks")
    model = str(_pool_model(tmp_path / "pool48.onnx"))
    many, calls = m.chunks_per_task(model, None, 16)
    few, _ = m.chunks_per_task(model, None, 1)
    pool = lambda chunks: [c for task, c in chunks.items() if task.endswith("_matmul")]  # noqa: E731 (the head is matmul1)
    assert pool(many) == [12] and pool(few) == [1]  # 4 parts x 3 tiles of 16 channels; one core: no parallel loop
    assert any("sum" in task for task in many) and not any("sum" in task for task in few)
    assert all(c >= 1 for c in many.values()) and set(calls) == set(many) and all(n == 1 for n in calls.values())


def test_a_profile_that_is_not_an_x86_one_is_refused_before_anything_is_built(tmp_path, monkeypatch, capsys):
    import json

    import pytest

    profile = tmp_path / "gpu.json"
    profile.write_text(json.dumps({"device_name": "cuda:0 (NVIDIA H200)", "profile": {"kernels": []}}))
    monkeypatch.setattr("sys.argv", ["x86_parallel_chunks.py", str(tmp_path / "absent.onnx"), "--profile", str(profile)])
    with pytest.raises(SystemExit) as exited:
        load("x86_parallel_chunks").main()
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "expected an x86 profile" in err and "'cuda:0 (NVIDIA H200)'" in err
