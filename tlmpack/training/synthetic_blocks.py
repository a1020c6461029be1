"""Seeded ONNX networks of the blocks modern CNNs are made of, for the teacher corpus: the fused
tasks a channels-last x86 build really sees (a convolution with a SiLU, ReLU or ReLU6 tail, a residual
add before or after its ReLU, a squeeze-excite gate over one pixel, a global pool as a matmul, a
classifier GEMV), at shapes no seed model holds.

    python -m tlmpack.training.synthetic_blocks --out DIR --seeds 0 1 2 [--blocks 8]

writes ``DIR/synthblock-s<seed>.onnx``; ``python -m tlmpack.training.onnx_corpus FILE --name
onnx-synthblock-s<seed>-x86 --target x86`` adds its tasks to the store. synthetic_convs.py's
plain stacks (conv, bias, ReLU) cover fewer of these tails: the held-out EfficientNet-B0 and ResNet-50
tasks are mostly SiLU-gated and residual convolutions.
"""

from __future__ import annotations

import numpy as np

from .synthetic_convs import RESOLUTIONS, WIDTHS, checked_model, write_models

ACTIVATIONS = ("relu", "relu6", "silu", "none")
BLOCKS = ("pointwise", "depthwise", "dense", "inverted", "bottleneck", "squeeze")
CLASSES = (10, 100, 1000, 1001)
CAP = {112: 96, 56: 256, 28: 512, 14: 1152, 7: 2048}  # widths by resolution: a few MB of activations


class _Graph:
    """Nodes and initializers of one model, named in order."""

    def __init__(self, rng: np.random.Generator):
        self.rng, self.nodes, self.inits, self.n = rng, [], [], 0

    def name(self, stem: str) -> str:
        self.n += 1
        return f"{stem}{self.n}"

    def const(self, value: np.ndarray) -> str:
        from onnx import numpy_helper

        name = self.name("c")
        self.inits.append(numpy_helper.from_array(value.astype(np.float32), name))
        return name

    def node(self, op: str, inputs: list[str], **attrs) -> str:
        from onnx import helper

        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def conv(self, x: str, cin: int, cout: int, kernel: int, stride: int, group: int, act: str) -> str:
        w = self.rng.standard_normal((cout, cin // group, kernel, kernel)) * (2.0 / (cin // group * kernel ** 2)) ** 0.5
        b = self.rng.standard_normal(cout) * 0.1
        pad = kernel // 2
        y = self.node("Conv", [x, self.const(w), self.const(b)], kernel_shape=[kernel, kernel], strides=[stride] * 2,
                      pads=[pad] * 4, group=group)
        return self.act(y, act)

    def act(self, x: str, act: str) -> str:
        if act == "relu":
            return self.node("Relu", [x])
        if act == "relu6":
            return self.node("Clip", [x, self.const(np.array(0.0)), self.const(np.array(6.0))])
        if act == "silu":
            return self.node("Mul", [x, self.node("Sigmoid", [x])])
        return x


def _width(rng: np.random.Generator, size: int, low: int = 8) -> int:
    return int(rng.choice([w for w in WIDTHS if low <= w <= CAP[size]]))


def make_block_model(seed: int, blocks: int = 8):
    """The ONNX model of ``seed``: input [1, C, H, W], ``blocks`` blocks in a chain, and with even odds
    a classifier head (global pool, flatten, GEMM)."""
    rng = np.random.default_rng([7, seed])  # a stream of its own: synthetic_convs draws from default_rng(seed)
    g = _Graph(rng)
    size = int(rng.choice(RESOLUTIONS[:3]))
    channels = _width(rng, size, 8) if size > 28 else _width(rng, size, 16)
    first, x = (channels, size), "x"
    for _ in range(blocks):
        kind = str(rng.choice(BLOCKS))
        act = str(rng.choice(ACTIVATIONS[:3]))
        stride = 2 if size > 7 and rng.random() < 0.25 else 1
        out_size = (size - 1) // stride + 1
        if kind == "pointwise":
            out = _width(rng, out_size)
            x = g.conv(x, channels, out, 1, 1, 1, str(rng.choice(ACTIVATIONS)))
            stride, out_size = 1, size
        elif kind == "depthwise":
            out = channels
            x = g.conv(x, channels, channels, int(rng.choice((3, 5))), stride, channels, act)
        elif kind == "dense":
            out = _width(rng, out_size)
            x = g.conv(x, channels, out, 3 if channels * out <= 256 * 256 else 1, stride, 1, act)
        elif kind == "squeeze":  # x * sigmoid(W2 act(W1 mean(x))), the gate of EfficientNet's blocks
            reduced = max(4, channels // int(rng.choice((4, 16, 24))) // 4 * 4)
            gate = g.conv(g.node("GlobalAveragePool", [x]), channels, reduced, 1, 1, 1, act)
            x = g.node("Mul", [x, g.node("Sigmoid", [g.conv(gate, reduced, channels, 1, 1, 1, "none")])])
            out, stride, out_size = channels, 1, size
        else:  # inverted (MobileNetV2/EfficientNet) or bottleneck (ResNet) residual blocks
            inner = min(CAP[size], channels * int(rng.choice((3, 4, 6)))) if kind == "inverted" else max(8, channels // 4)
            out = channels if stride == 1 else _width(rng, out_size)
            y = g.conv(x, channels, inner, 1, 1, 1, act)
            y = (g.conv(y, inner, inner, int(rng.choice((3, 5))), stride, inner, act) if kind == "inverted"
                 else g.conv(y, inner, inner, 3, stride, 1, act))
            y = g.conv(y, inner, out, 1, 1, 1, "none")
            if stride == 1 and out == channels:
                y = g.node("Add", [y, x])
                if kind == "bottleneck":
                    y = g.node("Relu", [y])
            x = y
        channels, size = out, out_size
    if rng.random() < 0.5:
        classes = int(rng.choice(CLASSES))
        flat = g.node("Flatten", [g.node("GlobalAveragePool", [x])], axis=1)
        w = g.const(rng.standard_normal((channels, classes)) * channels ** -0.5)
        x = g.node("Gemm", [flat, w, g.const(rng.standard_normal(classes) * 0.1)])
        out_shape = [1, classes]
    else:
        out_shape = [1, channels, size, size]
    return checked_model(g.nodes, g.inits, f"synthblock_s{seed}", [1, first[0], first[1], first[1]], x, out_shape)


def main(argv: list[str] | None = None) -> None:
    write_models(argv, "synthetic_blocks", "synthblock", make_block_model, "--blocks", 8)


if __name__ == "__main__":
    main()
