"""Models with several outputs, end to end, and the memory plan's invariant on many random graphs.

The multi-output model returns an intermediate that later kernels still read, two outputs computed
from it, and lists them out of topological order: the runtime must return each under its own name,
in the manifest's order, equal to onnxruntime's. The plan test checks plan_memory on graphs it did
not see while written: no two arena tensors that are live at the same step share a byte.
"""

from __future__ import annotations

import numpy as np
import pytest

from tlmpack.graph import Graph, KernelCall, Tensor, plan_memory
from tlmpack.verify import onnxruntime_outputs, rel_err

TOLERANCE = 1e-5


def _multi_output_onnx(path) -> list[str]:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Relu", ["h"], ["a"], name="relu"),
        helper.make_node("Sigmoid", ["h"], ["s"], name="sigmoid"),
        helper.make_node("Add", ["a", "s"], ["c"], name="add"),
        helper.make_node("ReduceSum", ["c"], ["total"], name="sum", keepdims=0),
    ]
    names = ["c", "h", "total", "a"]  # not the order they are computed in
    outputs = [helper.make_tensor_value_info("c", TensorProto.FLOAT, [2, 8]),
               helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, 8]),
               helper.make_tensor_value_info("total", TensorProto.FLOAT, []),
               helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 8])]
    graph = helper.make_graph(nodes, "multi", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              outputs, [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return names


@pytest.fixture(scope="module")
def multi_output(tmp_path_factory):
    from tlmpack.build import BuildOptions, build

    d = tmp_path_factory.mktemp("multi_output")
    names = _multi_output_onnx(d / "multi.onnx")
    build(str(d / "multi.onnx"), d / "multi.tar", BuildOptions())
    return d / "multi.onnx", d / "multi.tar", names


def test_multi_output_model_returns_every_output_by_name_equal_to_onnxruntime(multi_output):
    import tlmpack.runtime as rt

    onnx_path, tar, names = multi_output
    with rt.load(tar) as model:
        assert [s.name for s in model.outputs] == names
        for seed in (0, 1):
            feed = {"x": np.random.default_rng(seed).standard_normal((2, 8)).astype(np.float32)}
            refs = onnxruntime_outputs(onnx_path, feed)
            outs = model.run(None, feed)
            for spec, out, ref in zip(model.outputs, outs, refs, strict=True):
                assert out.shape == ref.shape == spec.shape, spec.name
                assert rel_err(out, ref) < TOLERANCE, spec.name


def test_multi_output_model_returns_a_subset_in_the_order_asked(multi_output):
    import tlmpack.runtime as rt

    onnx_path, tar, names = multi_output
    feed = {"x": np.random.default_rng(5).standard_normal((2, 8)).astype(np.float32)}
    refs = dict(zip(names, onnxruntime_outputs(onnx_path, feed), strict=True))
    with rt.load(tar) as model:
        total, h = model.run(["total", "h"], feed)
    assert rel_err(total, refs["total"]) < TOLERANCE and rel_err(h, refs["h"]) < TOLERANCE


# ---- the memory plan's invariant ------------------------------------------------------------------------

def _random_graph(rng: np.random.Generator) -> Graph:
    """Inputs, weights, kernel calls over earlier tensors (views among them), and a few outputs."""
    tensors: list[Tensor] = []

    def new(storage: str = "arena", base: int | None = None) -> int:
        tid = len(tensors)
        size = int(rng.integers(1, 3000))
        tensors.append(Tensor(tid, f"t{tid}", "float32", (size,), storage, tid if base is None else base))
        return tid

    inputs = [new() for _ in range(int(rng.integers(1, 4)))]
    weights = [new("weights") for _ in range(int(rng.integers(0, 3)))]
    produced: list[int] = list(inputs)
    calls = []
    for _ in range(int(rng.integers(1, 40))):
        if rng.random() < 0.2:  # a view: shares its source's bytes
            src = tensors[int(rng.choice(produced))]
            view = new(base=src.base)
            produced.append(view)
            continue
        pool = produced + weights
        args = [int(rng.choice(pool)) for _ in range(int(rng.integers(1, 4)))]
        outs = [new() for _ in range(int(rng.integers(1, 3)))]
        produced.extend(outs)
        calls.append(KernelCall("k", tuple(args + outs), len(outs)))
    outputs = sorted({int(rng.choice(produced)) for _ in range(int(rng.integers(1, 4)))})
    return Graph(tensors, calls, [], inputs, outputs)


def _live_ranges(graph: Graph) -> dict[int, tuple[int, int]]:
    """[first, last] step at which each arena base tensor must hold its value (inputs from -1, outputs to the end)."""
    span: dict[int, list[int]] = {}
    for tid in graph.inputs:
        span[graph.tensors[tid].base] = [-1, -1]
    for step, call in enumerate(graph.calls):
        for tid in call.args:
            lo_hi = span.setdefault(graph.tensors[tid].base, [step, step])
            lo_hi[0], lo_hi[1] = min(lo_hi[0], step), max(lo_hi[1], step)
    for tid in graph.outputs:
        span.setdefault(graph.tensors[tid].base, [len(graph.calls)] * 2)[1] = len(graph.calls)
    return {b: (lo, hi) for b, (lo, hi) in span.items() if graph.tensors[b].storage == "arena"}


@pytest.mark.parametrize("seed", range(200))
def test_memory_plan_never_overlaps_two_live_tensors(seed: int) -> None:
    graph = _random_graph(np.random.default_rng(seed))
    plan_memory(graph)
    live = _live_ranges(graph)
    placed = {b: (graph.tensors[b].offset, graph.tensors[b].offset + graph.tensors[b].nbytes) for b in live}
    for b, (start, end) in placed.items():
        assert 0 <= start and end <= graph.arena_bytes and start % 64 == 0, (b, start, end, graph.arena_bytes)
    bases = sorted(live)
    for i, a in enumerate(bases):
        for b in bases[i + 1:]:
            (alo, ahi), (blo, bhi) = live[a], live[b]
            if alo <= bhi and blo <= ahi:  # live at a common step
                (a0, a1), (b0, b1) = placed[a], placed[b]
                assert a1 <= b0 or b1 <= a0, f"tensors {a} {live[a]} and {b} {live[b]} share bytes {placed[a]} {placed[b]}"
    for t in graph.tensors:  # a view reads its base's bytes
        if t.storage == "arena" and t.base != t.id:
            assert t.offset == graph.tensors[t.base].offset
