"""Relax rewrites keep the model's meaning: checked end to end against onnxruntime."""

from __future__ import annotations

import numpy as np

from tlmpack.verify import onnxruntime_outputs, rel_err


def test_awkward_matmul_width_is_padded_and_sliced_back(tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import tlmpack.runtime as rt
    from tlmpack.build import BuildOptions, build

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


def test_a_torch_average_pool_covering_its_input_is_a_mean(tmp_path):
    """transformers' EfficientNet pools a 7x7 map with nn.AvgPool2d(1280, ceil_mode=True): taken
    literally, TVM pads each channel to 1286x1286 (8.5 GB). Here 12x12 windows on a 5x5 map."""
    import torch

    import tlmpack.runtime as rt
    from tlmpack.build import BuildOptions, build
    from tlmpack.frontend.torch_rewrites import average_pool_covering_input_to_mean

    class Head(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.pool = torch.nn.AvgPool2d(12, ceil_mode=True)
            self.small = torch.nn.AvgPool2d(2)  # a real window: left alone

        def forward(self, x):
            y = torch.relu(self.conv(x))
            return self.pool(y).flatten(1) + self.small(y)[:, :, 0, 0]

    torch.manual_seed(0)
    module = Head().eval()
    x = torch.randn(1, 3, 5, 5)
    ep = torch.export.export(module, (x,))
    torch.export.save(ep, tmp_path / "head.pt2")
    rewritten = ep.run_decompositions()
    assert average_pool_covering_input_to_mean(rewritten) == 1
    with torch.no_grad():
        ref = module(x).numpy()
        assert rel_err(rewritten.module()(x).numpy(), ref) < 1e-6
    manifest = build(str(tmp_path / "head.pt2"), tmp_path / "head.tar", BuildOptions())
    # a mean; on x86's channels-last path a matmul by 1/(H*W) (layout_ops.py), the model has no other
    assert any("mean" in s["name"] or s["name"].startswith("matmul") for s in manifest["subgraphs"])
    (out,) = rt.load(tmp_path / "head.tar").run(None, {"x": x.numpy()})
    assert np.abs(ref).max() > 0 and rel_err(out, ref) < 1e-4
