"""Relax rewrites keep the model's meaning: checked end to end against onnxruntime."""

from __future__ import annotations

import numpy as np

from tlmpack.verify import onnxruntime_outputs, rel_err


def test_awkward_matmul_width_is_padded_and_sliced_back(tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import tlmpack.runtime as rt
    from tlmpack.emit.package import BuildOptions, build

    columns = 8201  # prime: no divisor is a whole vector; 128 x 8201 weights pass the size bar
    weight = np.random.default_rng(0).standard_normal((128, columns)).astype(np.float32) * 0.1
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="head")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 128])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, columns])],
                              initializer=[numpy_helper.from_array(weight, "w")])
    model = tmp_path / "head.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    manifest = build(str(model), tmp_path / "head.tar", BuildOptions())
    assert any("strided_slice" in s["name"] for s in manifest["subgraphs"])
    x = np.random.default_rng(1).standard_normal((1, 4, 128)).astype(np.float32)
    (ref,) = onnxruntime_outputs(model, {"x": x})
    (out,) = rt.load(tmp_path / "head.tar").run(None, {"x": x})
    assert out.shape == (1, 4, columns) and rel_err(out, ref) < 1e-4
