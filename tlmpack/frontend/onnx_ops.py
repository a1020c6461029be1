"""Which ONNX nodes TVM 0.27's importer converts, matched by (domain, op_type) and opset.

TVM's converter map is keyed by op_type alone, so a node ``com.example::Relu`` would silently be
built as the standard Relu (issue 14, defect 1). Here a node is convertible only if its domain is
the standard one (or com.microsoft for the contrib ops TVM names that are not standard ops), and
TVM's importer knows it. (TVM applies its oldest converter to older opsets too, so the opset
only enters the message when a converter fails: ``conversion_failure``.)
"""

from __future__ import annotations

from ..errors import UnsupportedOperatorError, one_line

STANDARD_DOMAINS = ("", "ai.onnx")


def model_opset(model) -> int:
    """The model's version of the standard domain (ONNX's default when it names none)."""
    for entry in model.opset_import:
        if entry.domain in STANDARD_DOMAINS:
            return int(entry.version)
    return 1


def _is_standard_op(op_type: str) -> bool:
    import onnx

    return onnx.defs.has(op_type, "")


def _converter_versions(converter) -> list[int]:
    return sorted(int(d.removeprefix("_impl_v")) for d in dir(converter) if d.startswith("_impl_v"))


def node_label(node, index: int) -> str:
    return node.name or f"#{index} ({node.op_type})"


def check_operators(model, functions_inlined: bool) -> None:
    """Raises UnsupportedOperatorError for the first node TVM cannot convert, saying what would be
    needed: a standard-domain operator, or a converter TVM does not have."""
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    supported = _get_convert_map()
    opset = model_opset(model)
    local = {(f.domain, f.name) for f in model.functions}
    for index, node in enumerate(model.graph.node):
        label = node_label(node, index)
        if node.domain not in STANDARD_DOMAINS:
            qualified = f"{node.domain}::{node.op_type}"
            if (node.domain, node.op_type) in local and not functions_inlined:
                raise UnsupportedOperatorError(qualified, label, "a model-local function onnx could not inline",
                                               opset)
            if node.domain == "com.microsoft" and node.op_type in supported and not _is_standard_op(node.op_type):
                continue
            same_name = " (it is not the standard operator of that name)" if _is_standard_op(node.op_type) else ""
            raise UnsupportedOperatorError(
                qualified, label, f"custom domain {node.domain!r}{same_name}; TVM converts only the standard "
                "ONNX domain: define it as a model-local function or replace it with standard operators", opset)
        converter = supported.get(node.op_type)
        if converter is None:
            raise UnsupportedOperatorError(node.op_type, label, "TVM 0.27's ONNX importer has no converter for it",
                                           opset)


def newer_opset_for(op_type: str, model) -> int | None:
    """The opset TVM's converter of ``op_type`` is written for, when newer than the model's."""
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    versions = _converter_versions(_get_convert_map().get(op_type, object))
    if versions and min(versions) > model_opset(model):
        return min(versions)
    return None


def conversion_failure(model, op_type: str, error: BaseException) -> UnsupportedOperatorError:
    """The typed error for TVM's converter of ``op_type`` raising ``error`` on this model; names the
    first node of that type (TVM converts in graph order) and, when TVM's converter is for a newer
    opset than the model's, says so."""
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map


    opset = model_opset(model)
    nodes = [(i, n) for i, n in enumerate(model.graph.node) if n.op_type == op_type]
    label = node_label(nodes[0][1], nodes[0][0]) if nodes else "?"
    if len(nodes) > 1:
        label += f" or another of the {len(nodes)} {op_type} nodes"
    versions = _converter_versions(_get_convert_map().get(op_type, object))
    need = ""
    if versions and min(versions) > opset:
        need = (f"; TVM's converter is for opset {min(versions)}+: convert the model to opset >= {min(versions)} "
                "(onnx.version_converter)")
    return UnsupportedOperatorError(op_type, label, f"TVM's converter failed ({one_line(error, 160)}){need}", opset)


# operand positions that set an output's shape: a user input there makes the shape a run-time value
SHAPE_OPERANDS = {
    "Expand": (1,), "Reshape": (1,), "ConstantOfShape": (0,), "Tile": (1,), "Range": (0, 1, 2),
    "Resize": (1, 2, 3), "Upsample": (1,), "Pad": (1,), "TopK": (1,), "OneHot": (1,),
    "Slice": (1, 2, 3, 4), "Squeeze": (1,), "Unsqueeze": (1,), "Split": (1,), "ReduceSum": (1,),
    "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,), "ReduceProd": (1,), "CenterCropPad": (1,),
}


def check_static_shapes(model, user_inputs: set[str]) -> None:
    """tlmpack plans memory for static shapes: an operand that sets an output's shape must be a
    constant, not one of the model's inputs (its value arrives only at run time)."""
    for index, node in enumerate(model.graph.node):
        for position in SHAPE_OPERANDS.get(node.op_type, ()):
            if position < len(node.input) and node.input[position] in user_inputs:
                name = node.input[position]
                raise UnsupportedOperatorError(
                    node.op_type, node_label(node, index),
                    f"its operand {position} ({name!r}) is a model input, so the output's shape is known only "
                    f"at run time; tlmpack needs static shapes: make {name!r} a constant (an initializer)",
                    model_opset(model))
