"""Small ONNX graphs for the frontend's tests: each shows one behaviour. Test support only."""

from __future__ import annotations

import numpy as np


def custom_domain_relu_function(path, with_function: bool = True):
    """``com.example::Relu`` on x; with ``with_function`` the model defines it as a local function
    whose body is Neg (onnxruntime runs the function: -x, not relu(x))."""
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("Relu", ["x"], ["h"], domain="com.example", name="custom_relu")
    scale = helper.make_node("Mul", ["h", "two"], ["y"], name="scale")
    two = onnx.numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")
    graph = helper.make_graph([node, scale], "custom", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], initializer=[two])
    functions = []
    if with_function:
        body = helper.make_node("Neg", ["a"], ["b"])
        functions.append(helper.make_function("com.example", "Relu", ["a"], ["b"], [body],
                                              [helper.make_opsetid("", 17)]))
    model = helper.make_model(graph, functions=functions, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    onnx.save(model, str(path))
    return path


def conv_dropout_with_used_mask(path, use_mask: bool = True):
    """Conv → Dropout whose mask is used (Cast to float, multiplied in): TVM imports the Dropout as
    a tuple that its channels-last conversion cannot pass, so the build must fall back. With
    ``use_mask=False`` the mask is unused and the Dropout is the identity."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Dropout", ["c"], ["d", "mask"], name="dropout"),
        *([helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT, name="cast")] if use_mask else []),
        helper.make_node("Mul", ["d", "m" if use_mask else "d"], ["p"], name="mul"),
        helper.make_node("Relu", ["p"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(nodes, "dropmask", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])  # a bool mask (opset 12+)
    onnx.save(model, str(path))
    return path
