"""Rewrites of a torch.export program before TVM imports it: the same meaning, a sane kernel."""

from __future__ import annotations


def average_pool_covering_input_to_mean(ep) -> int:
    """``aten.avg_pool2d`` whose single window covers the whole input (one output pixel, no padding,
    no divisor override) is a mean over the two spatial axes: with no padding, the part of a
    ceil_mode window past the input is not counted.

    transformers' EfficientNet pools with ``nn.AvgPool2d(1280, ceil_mode=True)`` on a 7x7 map;
    lowered literally, TVM pads every channel to 1286x1286 (an 8.5 GB workspace) and sums 1280x1280
    windows. The ONNX frontend has the same rewrite (onnx_rewrites.py). Returns how many it rewrote.
    """
    import torch

    graph = ep.graph_module.graph
    rewritten = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target != torch.ops.aten.avg_pool2d.default:
            continue
        x, kernel = node.args[0], list(node.args[1])
        stride = list(node.args[2]) if len(node.args) > 2 and node.args[2] else kernel
        padding = node.args[3] if len(node.args) > 3 else 0
        divisor = node.args[6] if len(node.args) > 6 else node.kwargs.get("divisor_override")
        value, out = x.meta.get("val"), node.meta.get("val")
        if value is None or out is None or divisor is not None:
            continue
        padding = [padding] * 2 if isinstance(padding, int) else list(padding)
        spatial = [int(d) for d in value.shape[-2:]]
        kernel = kernel * 2 if len(kernel) == 1 else kernel
        stride = stride * 2 if len(stride) == 1 else stride
        if (any(padding) or tuple(int(d) for d in out.shape[-2:]) != (1, 1)
                or any(k < s for k, s in zip(kernel, spatial, strict=True))):
            continue
        with graph.inserting_before(node):
            mean = graph.call_function(torch.ops.aten.mean.dim, (x, [-2, -1], True))
        mean.meta = dict(node.meta)
        node.replace_all_uses_with(mean)
        graph.erase_node(node)
        rewritten += 1
    if rewritten:
        graph.lint()
        ep.graph_module.recompile()
    return rewritten
