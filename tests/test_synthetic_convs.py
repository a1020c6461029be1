"""The synthetic convolution stacks the x86 corpus grows from: seeded, valid ONNX, and what
onnxruntime computes from them is a real (non-zero, finite) output of the declared shape."""

import numpy as np
import onnx

from tlmpack.training.synthetic_convs import make_model


def test_same_seed_same_bytes_other_seed_other_model():
    assert make_model(3, 6).SerializeToString() == make_model(3, 6).SerializeToString()
    assert make_model(3, 6).SerializeToString() != make_model(4, 6).SerializeToString()


def assert_runs_in_onnxruntime_with_its_declared_output(model) -> None:
    """onnx's full check passes, and onnxruntime's output on a random input has the declared shape
    and is real: finite and not all zeros."""
    import onnxruntime as ort

    onnx.checker.check_model(model, full_check=True)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    out_shape = [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)})
    assert list(y.shape) == out_shape
    assert np.isfinite(y).all() and np.abs(y).max() > 0


def test_runs_in_onnxruntime_with_the_declared_output_shape():
    model = make_model(1, 8)
    assert_runs_in_onnxruntime_with_its_declared_output(model)
    kinds = {(n.op_type, next((a.i for a in n.attribute if a.name == "group"), 1) > 1) for n in model.graph.node}
    assert ("Conv", False) in kinds
