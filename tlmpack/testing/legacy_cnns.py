"""Classic image-classification graphs at opset 7-9, written with onnx's helper API.

Test support only (see tlmpack/testing/__init__.py). These mimic ONNX files that older tools
(caffe2/CNTK/early torch exporters) wrote: LRN, Dropout, Concat branches, Flatten + Gemm heads,
grouped and depthwise convolutions, channel shuffles, attribute-style Pad/Clip, BatchNormalization
with ``spatial``. Weights are seeded random (nothing is downloaded); small spatial sizes keep a
build to seconds. ``MODELS`` maps a name to a builder returning a ModelProto.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


class _Graph:
    """A tiny graph writer: nodes, seeded initializers, fresh names."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []
        self.count = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.count}"

    def const(self, prefix: str, array: np.ndarray) -> str:
        from onnx import numpy_helper

        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(self, op: str, inputs: list[str], n_out: int = 1, **attrs) -> list[str]:
        from onnx import helper

        outs = [self.name(op.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=self.name(f"n_{op}"), **attrs))
        return outs

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, pad: int = 0, group: int = 1,
             bias: bool = True) -> str:
        fan_in = cin // group * k * k
        w = self.const("w", (self.rng.standard_normal((cout, cin // group, k, k)) / np.sqrt(fan_in)).astype(np.float32))
        inputs = [x, w]
        if bias:
            inputs.append(self.const("b", (0.1 * self.rng.standard_normal(cout)).astype(np.float32)))
        return self.node("Conv", inputs, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4,
                         group=group)[0]

    def bn(self, x: str, c: int, opset: int) -> str:
        scale = self.const("s", (1 + 0.1 * self.rng.standard_normal(c)).astype(np.float32))
        bias = self.const("bb", (0.1 * self.rng.standard_normal(c)).astype(np.float32))
        mean = self.const("m", (0.1 * self.rng.standard_normal(c)).astype(np.float32))
        var = self.const("v", (1 + 0.2 * self.rng.random(c)).astype(np.float32))
        attrs = {"epsilon": 1e-5}
        if opset < 9:
            attrs["spatial"] = 1
        return self.node("BatchNormalization", [x, scale, bias, mean, var], **attrs)[0]

    def gemm(self, x: str, k: int, n: int, trans_b: bool = True) -> str:
        shape = (n, k) if trans_b else (k, n)
        w = self.const("fc", (self.rng.standard_normal(shape) / np.sqrt(k)).astype(np.float32))
        b = self.const("fcb", (0.1 * self.rng.standard_normal(n)).astype(np.float32))
        return self.node("Gemm", [x, w, b], transB=int(trans_b), alpha=1.0, beta=1.0)[0]

    def relu(self, x: str) -> str:
        return self.node("Relu", [x])[0]

    def model(self, x_shape: list[int], out: str, out_shape: list[int], opset: int, name: str):
        """IR version 3/4 like the old writers; initializers are listed as graph inputs too, as
        IR < 4 requires (importers must not take them for user inputs)."""
        from onnx import TensorProto, helper

        for node in self.nodes:  # the last node's output is the model's "prob"
            node.input[:] = ["prob" if i == out else i for i in node.input]
        self.nodes[-1].output[0] = "prob"
        weights = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in self.inits]
        graph = helper.make_graph(
            self.nodes, name, [helper.make_tensor_value_info("data", TensorProto.FLOAT, x_shape), *weights],
            [helper.make_tensor_value_info("prob", TensorProto.FLOAT, out_shape)], initializer=self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                                  producer_name="legacy-cnn-writer")
        model.ir_version = 3
        return model


def alexnet_lrn(seed: int = 0):
    """AlexNet/CaffeNet shape, opset 7: LRN, two-group convolutions, Dropout, Flatten + Gemm head."""
    g = _Graph(seed)
    x = g.relu(g.conv("data", 3, 16, 5, stride=2, pad=2))
    x = g.node("LRN", [x], size=5, alpha=1e-4, beta=0.75, bias=1.0)[0]
    x = g.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2])[0]
    x = g.relu(g.conv(x, 16, 32, 3, pad=1, group=2))
    x = g.node("LRN", [x], size=5, alpha=1e-4, beta=0.75, bias=2.0)[0]
    x = g.relu(g.conv(x, 32, 32, 3, pad=1, group=2))
    x = g.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2])[0]
    x = g.node("Flatten", [x], axis=1)[0]
    x = g.node("Dropout", [x], ratio=0.5)[0]
    x = g.relu(g.gemm(x, 32 * 3 * 3, 64))
    x = g.node("Dropout", [x], ratio=0.5)[0]
    x = g.gemm(x, 64, 10)
    out = g.node("Softmax", [x], axis=1)[0]
    return g.model([1, 3, 32, 32], out, [1, 10], 7, "alexnet_lrn")


def _inception(g: _Graph, x: str, cin: int, c1: int, c3r: int, c3: int, c5r: int, c5: int, cp: int) -> str:
    b1 = g.relu(g.conv(x, cin, c1, 1))
    b3 = g.relu(g.conv(g.relu(g.conv(x, cin, c3r, 1)), c3r, c3, 3, pad=1))
    b5 = g.relu(g.conv(g.relu(g.conv(x, cin, c5r, 1)), c5r, c5, 5, pad=2))
    pool = g.node("MaxPool", [x], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])[0]
    bp = g.relu(g.conv(pool, cin, cp, 1))
    return g.node("Concat", [b1, b3, b5, bp], axis=1)[0]


def googlenet_inception(seed: int = 0):
    """GoogLeNet shape, opset 8: LRN, inception Concat branches, AveragePool, Dropout, Reshape + Gemm."""
    g = _Graph(seed)
    x = g.relu(g.conv("data", 3, 16, 7, stride=2, pad=3))
    x = g.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1])[0]
    x = g.node("LRN", [x], size=5, alpha=1e-4, beta=0.75)[0]
    x = _inception(g, x, 16, 8, 8, 12, 4, 4, 4)
    x = _inception(g, x, 28, 12, 8, 16, 4, 8, 8)
    x = g.node("AveragePool", [x], kernel_shape=[8, 8], strides=[1, 1])[0]
    x = g.node("Dropout", [x], ratio=0.4)[0]
    shape = g.const("shape", np.array([1, 44], dtype=np.int64))
    x = g.node("Reshape", [x, shape])[0]
    x = g.gemm(x, 44, 10)
    out = g.node("Softmax", [x])[0]
    return g.model([1, 3, 32, 32], out, [1, 10], 8, "googlenet_inception")


def _shuffle(g: _Graph, x: str, c: int, groups: int, hw: int) -> str:
    s1 = g.const("shape", np.array([1, groups, c // groups, hw, hw], dtype=np.int64))
    s2 = g.const("shape", np.array([1, c, hw, hw], dtype=np.int64))
    x = g.node("Reshape", [x, s1])[0]
    x = g.node("Transpose", [x], perm=[0, 2, 1, 3, 4])[0]
    return g.node("Reshape", [x, s2])[0]


def shufflenet_units(seed: int = 0):
    """ShuffleNet v1 shape, opset 9: grouped 1x1 convolutions, a 5-D channel shuffle, depthwise
    3x3, BatchNormalization, residual Add and a strided unit whose AveragePool branch is Concat'ed."""
    g = _Graph(seed)
    x = g.relu(g.bn(g.conv("data", 3, 24, 3, stride=2, pad=1, bias=False), 24, 9))
    x = g.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])[0]  # 8x8
    # strided unit: 24 -> 24 + 24 channels, 4x4
    y = g.relu(g.bn(g.conv(x, 24, 24, 1, group=3, bias=False), 24, 9))
    y = _shuffle(g, y, 24, 3, 8)
    y = g.bn(g.conv(y, 24, 24, 3, stride=2, pad=1, group=24, bias=False), 24, 9)
    y = g.bn(g.conv(y, 24, 24, 1, group=3, bias=False), 24, 9)
    pool = g.node("AveragePool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])[0]
    x = g.relu(g.node("Concat", [pool, y], axis=1)[0])
    # residual unit at 48 channels
    y = g.relu(g.bn(g.conv(x, 48, 12, 1, group=4, bias=False), 12, 9))
    y = _shuffle(g, y, 12, 4, 4)
    y = g.bn(g.conv(y, 12, 12, 3, pad=1, group=12, bias=False), 12, 9)
    y = g.bn(g.conv(y, 12, 48, 1, group=4, bias=False), 48, 9)
    x = g.relu(g.node("Add", [x, y])[0])
    x = g.node("GlobalAveragePool", [x])[0]
    x = g.node("Flatten", [x])[0]
    out = g.gemm(x, 48, 10)
    return g.model([1, 3, 32, 32], out, [1, 10], 9, "shufflenet_units")


def squeezenet_fire(seed: int = 0):
    """SqueezeNet 1.0 shape, opset 7: Fire modules (1x1 squeeze, 1x1 + 3x3 expand, Concat), Dropout,
    a 1x1 classifier convolution, GlobalAveragePool, Flatten and Softmax."""
    g = _Graph(seed)

    def fire(x: str, cin: int, s: int, e: int) -> str:
        sq = g.relu(g.conv(x, cin, s, 1))
        return g.node("Concat", [g.relu(g.conv(sq, s, e, 1)), g.relu(g.conv(sq, s, e, 3, pad=1))], axis=1)[0]

    x = g.relu(g.conv("data", 3, 24, 3, stride=2))
    x = g.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2])[0]
    x = fire(x, 24, 8, 16)
    x = fire(x, 32, 8, 16)
    x = g.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2])[0]
    x = fire(x, 32, 12, 24)
    x = g.node("Dropout", [x], ratio=0.5)[0]
    x = g.relu(g.conv(x, 48, 10, 1))
    x = g.node("GlobalAveragePool", [x])[0]
    x = g.node("Flatten", [x])[0]
    out = g.node("Softmax", [x])[0]
    return g.model([1, 3, 32, 32], out, [1, 10], 7, "squeezenet_fire")


def mobilenet_v1_clip(seed: int = 0):
    """MobileNet v1 shape, opset 8: attribute-style Pad, depthwise separable convolutions with
    BatchNormalization (spatial=1) and attribute-style Clip (ReLU6), Sum (opset-8 variadic add),
    GlobalAveragePool, Reshape + Gemm (transB=0), Softmax."""
    g = _Graph(seed)

    def relu6(x: str) -> str:
        return g.node("Clip", [x], min=0.0, max=6.0)[0]

    x = g.node("Pad", ["data"], pads=[0, 0, 1, 1, 0, 0, 1, 1], mode="constant", value=0.0)[0]
    x = relu6(g.bn(g.conv(x, 3, 16, 3, stride=2, bias=False), 16, 8))
    for cin, cout, stride in ((16, 32, 1), (32, 32, 2), (32, 64, 1)):
        y = relu6(g.bn(g.conv(x, cin, cin, 3, stride=stride, pad=1, group=cin, bias=False), cin, 8))
        y = relu6(g.bn(g.conv(y, cin, cout, 1, bias=False), cout, 8))
        if cin == cout and stride == 1:
            y = g.node("Sum", [x, y])[0]
        x = y
    x = g.node("GlobalAveragePool", [x])[0]
    shape = g.const("shape", np.array([1, 64], dtype=np.int64))
    x = g.node("Reshape", [x, shape])[0]
    x = g.gemm(x, 64, 10, trans_b=False)
    out = g.node("Softmax", [x], axis=1)[0]
    return g.model([1, 3, 32, 32], out, [1, 10], 8, "mobilenet_v1_clip")


MODELS: dict[str, Callable[..., object]] = {
    "alexnet_lrn": alexnet_lrn,
    "googlenet_inception": googlenet_inception,
    "shufflenet_units": shufflenet_units,
    "squeezenet_fire": squeezenet_fire,
    "mobilenet_v1_clip": mobilenet_v1_clip,
}


def write(name: str, path, seed: int = 0):
    """Writes model ``name`` to ``path`` after onnx's checker accepts it; returns the path."""
    import onnx

    model = MODELS[name](seed)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path
