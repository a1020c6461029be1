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
        if (spatial is None or len(kernel) != len(spatial) or any(pads)
                or _attribute(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET")
                or any(k < s for k, s in zip(kernel, spatial)) or any(st < s for st, s in zip(strides, spatial))):
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
