"""Folds an ONNX graph's shape arithmetic into constants before TVM imports it.

Exporters compute shapes at run time (``Shape -> Gather -> Unsqueeze -> Concat ->
ConstantOfShape``, the TorchScript exporter's attention masks). With every input shape pinned
those values are constants, and TVM 0.27's converters fail on several of the run-time forms
(ConstantOfShape of a computed shape: ``broadcast_to expects the input shape to have the number
of ndim at least...``). Folded here: ``Shape`` of a tensor whose shape inference knows it, and a
standard-domain, deterministic node whose inputs are all constants and whose outputs are small
(shape-sized, not weights: at most ``MAX_FOLDED_ELEMENTS``), evaluated with onnx's reference
implementation. Weights are never copied: shape inference sees large initializers as typed inputs.
"""

from __future__ import annotations

import numpy as np

MAX_FOLDED_ELEMENTS = 4096
_NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                     "Bernoulli"}


def _numel(dims) -> int:
    return int(np.prod(list(dims), dtype=np.int64))


def _static_shapes(model, input_shapes: dict[str, tuple[int, ...]]) -> dict[str, list[int]]:
    """Static shapes of the graph's values, with the inputs pinned to ``input_shapes``."""
    import onnx
    from onnx import helper

    g = model.graph
    small = [t for t in g.initializer if _numel(t.dims) <= 64 and not t.external_data]
    small_names = {t.name for t in small}
    inputs = []
    for vi in g.input:
        if vi.name in small_names:
            continue
        if vi.name in input_shapes and vi.type.HasField("tensor_type"):
            vi = helper.make_tensor_value_info(vi.name, vi.type.tensor_type.elem_type, list(input_shapes[vi.name]))
        inputs.append(vi)
    listed = {vi.name for vi in inputs}
    typed = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in g.initializer
             if t.name not in small_names and t.name not in listed]
    probe = helper.make_model(helper.make_graph(list(g.node), "shapes", inputs + typed, list(g.output), small),
                              opset_imports=list(model.opset_import), functions=list(model.functions))
    probe.ir_version = max(model.ir_version, 4)
    try:
        inferred = onnx.shape_inference.infer_shapes(probe, strict_mode=False)
    except Exception:
        return {}
    shapes = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input):
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            shapes[vi.name] = [d.dim_value for d in tt.shape.dim]
    for t in g.initializer:
        shapes[t.name] = list(t.dims)
    return shapes


def _shape_value(node, shape: list[int]) -> np.ndarray:
    start, end = 0, len(shape)
    for attr in node.attribute:
        if attr.name == "start":
            start = attr.i
        elif attr.name == "end":
            end = attr.i
    return np.asarray(shape[slice(start, end)], dtype=np.int64)


def fold_shape_computations(model, input_shapes: dict[str, tuple[int, ...]]) -> int:
    """Replaces foldable nodes by initializers, in place; returns how many it folded."""
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    g = model.graph
    if not any(n.op_type in ("Shape", "ConstantOfShape", "Size") for n in g.node):
        return 0  # nothing computes a shape: leave the graph as it is
    shapes = _static_shapes(model, input_shapes)
    constants: dict[str, np.ndarray] = {}
    for t in g.initializer:
        if _numel(t.dims) <= MAX_FOLDED_ELEMENTS and not t.external_data:
            constants[t.name] = numpy_helper.to_array(t)
    outputs = {o.name for o in g.output}
    opsets = list(model.opset_import)
    kept, folded, new_inits = [], 0, []
    for node in g.node:
        values = None
        standard = node.domain in ("", "ai.onnx")
        if any(o in outputs for o in node.output) or not standard:
            pass
        elif node.op_type == "Shape" and node.input[0] in shapes:
            values = [_shape_value(node, shapes[node.input[0]])]
        elif node.op_type == "Size" and node.input[0] in shapes:
            values = [np.asarray(_numel(shapes[node.input[0]]), dtype=np.int64)]
        elif (node.op_type not in _NONDETERMINISTIC and (node.input or node.op_type == "Constant")
              and all(not i or i in constants for i in node.input)
              and not any(a.type in (a.GRAPH, a.GRAPHS) for a in node.attribute)):
            try:
                single = helper.make_model(helper.make_graph(
                    [node], "fold", [], [helper.make_value_info(o, helper.TypeProto()) for o in node.output]),
                    opset_imports=opsets)
                values = ReferenceEvaluator(single).run(None, {i: constants[i] for i in node.input if i})
            except Exception:  # the reference evaluator lacks the op or refuses it: keep the node
                values = None
            if values is not None and any(np.asarray(v).size > MAX_FOLDED_ELEMENTS for v in values):
                values = None
        if values is None:
            kept.append(node)
            continue
        for name, value in zip(node.output, values, strict=True):
            value = np.asarray(value)
            constants[name] = value
            new_inits.append(numpy_helper.from_array(value, name))
        folded += 1
    if folded:
        del g.node[:]
        g.node.extend(kept)
        g.initializer.extend(new_inits)
        if model.ir_version < 4:
            g.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in new_inits)
    return folded
