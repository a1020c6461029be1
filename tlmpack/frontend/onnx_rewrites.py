"""Small ONNX graph canonicalisations applied before TVM imports a model.

Each one replaces a pattern whose literal lowering is needlessly expensive with an equivalent,
cheaper operator. They run on a copy-free ModelProto, after shape inference.
"""

from __future__ import annotations


def _attribute(node, name: str, default):
    from onnx import helper

    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


def _spatial_shape(value_info: dict, name: str) -> list[int] | None:
    vi = value_info.get(name)
    if vi is None:
        return None
    dims = vi.type.tensor_type.shape.dim
    if len(dims) < 3 or any(not d.HasField("dim_value") for d in dims):
        return None
    return [d.dim_value for d in dims[2:]]


def average_pool_covering_input_to_global(model) -> int:
    """AveragePool whose single window covers the whole input (kernel and stride >= input, no
    padding) is GlobalAveragePool: with no pads, the part of a ceil_mode window past the input is
    not counted, whatever count_include_pad says (onnxruntime and torch agree).

    transformers' EfficientNet pools with kernel 1280 on a 7x7 map; lowered literally, TVM pads the
    input to the window (1280x1280 per channel: gigabytes of workspace). Returns the number rewritten.
    """
    import onnx

    if not any(node.op_type == "AveragePool" for node in model.graph.node):
        return 0  # shape inference serialises the model: skip it (over 2 GB it cannot)
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # protobuf's 2 GB limit: leave the pools as they are
        return 0
    value_info = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.input)}
    rewritten = 0
    for node in model.graph.node:
        if node.op_type != "AveragePool":
            continue
        spatial = _spatial_shape(value_info, node.input[0])
        kernel = list(_attribute(node, "kernel_shape", []))
        pads = list(_attribute(node, "pads", [0] * (2 * len(kernel))))
        strides = list(_attribute(node, "strides", [1] * len(kernel)))
        if (spatial is None or len(kernel) != len(spatial) or len(strides) != len(spatial) or any(pads)
                or _attribute(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET")
                or any(k < s for k, s in zip(kernel, spatial, strict=True)) or any(st < s for st, s in zip(strides, spatial, strict=True))):
            continue
        del node.attribute[:]
        node.op_type = "GlobalAveragePool"
        rewritten += 1
    return rewritten


def dropout_to_identity(model) -> int:
    """Dropout at inference is the identity. TVM imports it as ``R.nn.dropout`` (a tuple of output
    and mask) that ConvertLayout cannot pass through (``Expected nested to match tuple``), which
    cost every classic CNN with a Dropout its channels-last x86 kernels. Rewritten only where the
    mask is unused and no ``training_mode`` input is given. Returns the number rewritten."""
    used = {name for node in model.graph.node for name in node.input} | {o.name for o in model.graph.output}
    rewritten = 0
    for node in model.graph.node:
        if node.op_type != "Dropout" or node.domain not in ("", "ai.onnx"):
            continue
        if len(node.input) > 2 and node.input[2]:
            continue  # training_mode given: onnxruntime honours it
        if len(node.output) > 1 and node.output[1] and node.output[1] in used:
            continue
        del node.attribute[:]
        del node.input[1:]
        del node.output[1:]
        node.op_type = "Identity"
        rewritten += 1
    return rewritten


def _add_initializer(model, tensor) -> None:
    """A new constant; listed as a graph input too where the IR version (< 4) requires it."""
    from onnx import helper

    model.graph.initializer.append(tensor)
    if model.ir_version < 4:
        model.graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))


def _sequence_lengths(model) -> dict[str, int]:
    """Statically known sequence lengths, from SequenceConstruct/Empty through Erase/Insert."""
    lengths: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type == "SequenceConstruct":
            lengths[node.output[0]] = len(node.input)
        elif node.op_type == "SequenceEmpty":
            lengths[node.output[0]] = 0
        elif node.op_type in ("SequenceErase", "SequenceInsert") and node.input[0] in lengths:
            lengths[node.output[0]] = lengths[node.input[0]] + (1 if node.op_type == "SequenceInsert" else -1)
    return lengths


def sequence_insert_positions_nonnegative(model) -> int:
    """ONNX's SequenceInsert puts a tensor at ``n + position`` for a negative position; TVM 0.27
    puts it one further (``n + position + 1``), a silently wrong sequence. Constant negative
    positions are made non-negative here where the length is known; elsewhere the model is
    refused. Returns the number rewritten."""
    import numpy as np
    from onnx import numpy_helper

    from ..errors import UnsupportedOperatorError

    constants = {t.name: t for t in model.graph.initializer}
    lengths = _sequence_lengths(model)
    rewritten = 0
    for index, node in enumerate(model.graph.node):
        if node.op_type != "SequenceInsert" or len(node.input) < 3 or not node.input[2]:
            continue
        position = constants.get(node.input[2])
        if position is None:
            continue  # TVM refuses a position that is not a constant
        value = int(numpy_helper.to_array(position))
        if value >= 0:
            continue
        if node.input[0] not in lengths:
            raise UnsupportedOperatorError("SequenceInsert", node.name or f"#{index}",
                                           "a negative position into a sequence of unknown length "
                                           "(TVM 0.27 counts it off by one): give a non-negative position")
        fixed = numpy_helper.from_array(np.asarray(lengths[node.input[0]] + value, dtype=np.int64),
                                        f"{node.input[2]}__nonneg_{index}")
        _add_initializer(model, fixed)
        node.input[2] = fixed.name
        rewritten += 1
    return rewritten


def _ranks(model) -> dict[str, int]:
    """Known ranks of the graph's values (inputs, initializers, shape inference when it runs)."""
    import onnx

    ranks = {t.name: len(t.dims) for t in model.graph.initializer}
    values = list(model.graph.input)
    try:
        values += list(onnx.shape_inference.infer_shapes(model).graph.value_info)
    except Exception:  # over protobuf's 2 GB or an op onnx cannot infer: the inputs' ranks only
        pass
    for vi in values:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            ranks[vi.name] = len(vi.type.tensor_type.shape.dim)
    return ranks


def prelu_with_slope_vector_to_elementwise(model) -> int:
    """PRelu with a constant per-channel slope as ``relu(x) - slope * relu(-x)``: TVM 0.27's PReLU
    fails (a bare AssertionError) on a slope that is not a scalar. Before opset 7 a 1-D slope of
    C values is per channel (axis 1), so it is reshaped to [C, 1, ...]; from opset 7 it
    broadcasts like numpy, which the elementwise ops do as they are. Returns the number rewritten."""
    import numpy as np
    from onnx import helper, numpy_helper

    from .onnx_ops import model_opset

    constants = {t.name: t for t in model.graph.initializer}
    candidates = [n for n in model.graph.node if n.op_type == "PRelu" and n.domain in ("", "ai.onnx")
                  and len(n.input) == 2 and n.input[1] in constants]
    candidates = [n for n in candidates if int(np.prod(constants[n.input[1]].dims, dtype=np.int64)) > 1]
    if not candidates:
        return 0
    ranks, opset = _ranks(model), model_opset(model)
    nodes, rewritten = [], 0
    for index, node in enumerate(model.graph.node):
        if node not in candidates or (opset < 7 and node.input[0] not in ranks):
            nodes.append(node)
            continue
        slope = numpy_helper.to_array(constants[node.input[1]])
        if opset < 7 and slope.ndim == 1:
            slope = slope.reshape([slope.size] + [1] * (ranks[node.input[0]] - 2))
        x, y, tag = node.input[0], node.output[0], f"{node.name or 'prelu'}__{index}"
        _add_initializer(model, numpy_helper.from_array(slope, f"{tag}_slope"))
        nodes += [helper.make_node("Neg", [x], [f"{tag}_neg"], name=f"{tag}_neg"),
                  helper.make_node("Relu", [f"{tag}_neg"], [f"{tag}_rneg"], name=f"{tag}_rneg"),
                  helper.make_node("Mul", [f"{tag}_rneg", f"{tag}_slope"], [f"{tag}_scaled"], name=f"{tag}_mul"),
                  helper.make_node("Relu", [x], [f"{tag}_rpos"], name=f"{tag}_rpos"),
                  helper.make_node("Sub", [f"{tag}_rpos", f"{tag}_scaled"], [y], name=f"{tag}_sub")]
        rewritten += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return rewritten
