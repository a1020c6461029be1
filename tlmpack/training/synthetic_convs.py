"""Seeded ONNX stacks of convolutions, written for the x86 corpus: more distinct channels-last
convolution shapes than three seed CNNs hold, so the TLM's taste sees enough of them to
generalise (the held-out convolutions are mostly pointwise and depthwise layers of shapes no
training task has).

    python -m tlmpack.training.synthetic_convs --out DIR --seeds 0 1 2 3 [--layers 14]

writes ``DIR/synthconv-s<seed>.onnx``; put each through
``python -m tlmpack.training.onnx_corpus FILE --name onnx-synthconv-s<seed>-x86 --target x86``.
The shapes are drawn the way MobileNet- and ResNet-like networks use them: channel widths that
are multiples of 8 (with some of 4), resolutions 7 to 112 halved by strided layers, and the
layer kinds pointwise (1x1), depthwise (3x3 or 5x5, one group per channel, ReLU6) and dense 3x3.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

WIDTHS = (8, 12, 16, 20, 24, 32, 40, 48, 56, 64, 72, 80, 96, 112, 120, 128, 144, 160, 192, 200, 240,
          256, 288, 320, 384, 432, 480, 512, 576, 640, 672, 768, 960, 1024, 1152, 1280, 2048)
RESOLUTIONS = (112, 56, 28, 14, 7)
KINDS = ("pointwise", "pointwise", "depthwise", "dense")


def make_model(seed: int, layers: int = 14):
    """The ONNX model of ``seed``: one input [1, C, H, W], the plan's layers in a chain, each a
    Conv with bias and its activation (ReLU, or Clip 0..6 after a depthwise layer)."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(seed)
    size = int(rng.choice(RESOLUTIONS[:3]))
    channels = int(rng.choice([w for w in WIDTHS if 8 <= w <= 64]))
    nodes, inits = [], []
    first = (channels, size)
    x = "x"
    for i in range(layers):
        kind = str(rng.choice(KINDS))
        stride = 2 if size > 7 and rng.random() < 0.25 else 1
        cap = {112: 96, 56: 192, 28: 480, 14: 1024, 7: 2048}[size]  # weights and activations stay within a few MB
        if kind == "depthwise":
            out, kernel, group = channels, int(rng.choice((3, 3, 5))), channels
        else:
            out = int(rng.choice([w for w in WIDTHS if w <= cap]))
            kernel, group = (1, 1) if kind == "pointwise" else (3, 1)
            if kind == "dense" and channels * out > 256 * 256:
                kernel = 1
        w = (rng.standard_normal((out, channels // group, kernel, kernel)) * (2.0 / (channels // group * kernel ** 2)) ** 0.5)
        b = rng.standard_normal(out) * 0.1
        inits += [numpy_helper.from_array(w.astype(np.float32), f"w{i}"), numpy_helper.from_array(b.astype(np.float32), f"b{i}")]
        pad = kernel // 2
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], kernel_shape=[kernel, kernel],
                                      strides=[stride, stride], pads=[pad] * 4, group=group, name=f"conv{i}"))
        if group > 1:
            inits += [numpy_helper.from_array(np.array(0.0, np.float32), f"lo{i}"),
                      numpy_helper.from_array(np.array(6.0, np.float32), f"hi{i}")]
            nodes.append(helper.make_node("Clip", [f"c{i}", f"lo{i}", f"hi{i}"], [f"a{i}"], name=f"relu6_{i}"))
        else:
            nodes.append(helper.make_node("Relu", [f"c{i}"], [f"a{i}"], name=f"relu{i}"))
        x, channels, size = f"a{i}", out, (size + 2 * pad - kernel) // stride + 1
    return checked_model(nodes, inits, f"synthconv_s{seed}", [1, first[0], first[1], first[1]], x,
                         [1, channels, size, size])


def checked_model(nodes: list, inits: list, name: str, input_shape: list[int], output: str, output_shape: list[int]):
    """The model of one graph with input ``x`` and one output, at opset 17 and IR version 8 (what
    onnxruntime of any recent year reads), checked by onnx."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, input_shape)],
                              [helper.make_tensor_value_info(output, TensorProto.FLOAT, output_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def write_models(argv: list[str] | None, module: str, stem: str, make, size_flag: str, size_default: int) -> None:
    """The command line of a synthetic-model module: ``--out DIR --seeds ... [size_flag N]`` writes
    ``DIR/<stem>-s<seed>.onnx`` = ``make(seed, N)`` for each seed."""
    import onnx

    ap = argparse.ArgumentParser(prog=f"python -m tlmpack.training.{module}")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument(size_flag, type=int, default=size_default, dest="size")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        path = out / f"{stem}-s{seed}.onnx"
        onnx.save(make(seed, args.size), path)
        print(path)


def main(argv: list[str] | None = None) -> None:
    write_models(argv, "synthetic_convs", "synthconv", make_model, "--layers", 14)


if __name__ == "__main__":
    main()
