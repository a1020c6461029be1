"""ONNX frontend: onnx.ModelProto → Relax, through TVM's own converter."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from ..errors import InputShapeError, ModelLoadError, one_line
from ..specs import SourceInfo, TensorSpec
from . import ImportedModel, file_sha256
from .onnx_ops import check_operators, conversion_failure
from .onnx_rewrites import average_pool_covering_input_to_global, dropout_to_identity
from .relax_io import output_specs


def _input_specs(graph, overrides: dict[str, tuple[int, ...]]) -> list[TensorSpec]:
    import onnx

    initializers = {init.name for init in graph.initializer}
    specs = []
    for value in graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type).name
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
        if value.name in overrides:
            shape = overrides[value.name]
            if len(shape) != len(dims) or any(d is not None and d != s for d, s in zip(dims, shape)):
                raise InputShapeError(
                    f"--input-shape {value.name}: the model declares shape "
                    f"{tuple(d if d is not None else '?' for d in dims)}, got {shape}"
                )
        elif any(d is None or d <= 0 for d in dims):
            pretty = "x".join(str(d) if d else "?" for d in dims)
            raise InputShapeError(
                f"input {value.name!r} has a dynamic shape {pretty}; pin it with --input-shape {value.name}:"
                + "x".join(str(d) if d else "N" for d in dims)
            )
        else:
            shape = tuple(int(d) for d in dims)
        specs.append(TensorSpec(value.name, dtype, tuple(shape)))
    unknown = set(overrides) - {s.name for s in specs}
    if unknown:
        raise InputShapeError(
            f"--input-shape names {sorted(unknown)}, which are not inputs; the inputs are {[s.name for s in specs]}"
        )
    return specs


def _inline_local_functions(model):
    """Model-local functions become their bodies, so each node is a standard operator that TVM
    converts by its real meaning (a function ``com.example::Relu`` whose body is Neg stays Neg).
    Returns (model, whether every local function was inlined)."""
    if not model.functions:
        return model, True
    import onnx.inliner

    try:
        return onnx.inliner.inline_local_functions(model), True
    except Exception:  # check_operators then names the function's node
        return model, False


def load_onnx(path: str, input_shapes: dict[str, tuple[int, ...]]) -> ImportedModel:
    """Loads an ONNX file into Relax with static shapes; refuses unsupported operators by name."""
    import onnx

    if not Path(path).is_file():
        raise ModelLoadError(f"{path}: no such file")
    try:
        model = onnx.load(path)
    except Exception as e:  # onnx raises DecodeError, ValueError, ... for malformed files
        raise ModelLoadError(f"{path}: not a valid ONNX file ({type(e).__name__}: {e})") from None
    if not model.graph.node:
        raise ModelLoadError(f"{path}: the ONNX graph has no nodes")
    model, inlined = _inline_local_functions(model)
    check_operators(model, inlined)
    inputs = _input_specs(model.graph, input_shapes)
    average_pool_covering_input_to_global(model)
    dropout_to_identity(model)

    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    printed = io.StringIO()  # TVM prints "Error converting operator X, with inputs: <Relax>" on failure
    try:
        with contextlib.redirect_stdout(printed):
            mod = from_onnx(
                model,
                shape_dict={s.name: list(s.shape) for s in inputs},
                dtype_dict={s.name: s.dtype for s in inputs},
                keep_params_in_input=False,
            )
    except Exception as e:
        failed = re.search(r"Error converting operator (\S+), with inputs", printed.getvalue())
        if failed:
            raise conversion_failure(model, failed.group(1).rstrip(","), e) from None
        raise ModelLoadError(f"{path}: TVM could not import the model: {one_line(e)}") from None
    mod = relax.transform.DecomposeOpsForInference()(mod)
    names = [o.name for o in model.graph.output]
    outputs = output_specs(mod, names)
    source = SourceInfo(name=Path(path).stem, path=str(path), sha256=file_sha256(path), format="onnx")
    return ImportedModel(mod=mod, inputs=inputs, outputs=outputs, source=source)
