"""ONNX frontend: onnx.ModelProto → Relax, through TVM's own converter."""

from __future__ import annotations

import contextlib
import hashlib
import io
import re
from pathlib import Path

from ..errors import InputShapeError, ModelLoadError, UnsupportedOperatorError, one_line
from ..specs import SourceInfo, TensorSpec
from . import ImportedModel, file_sha256
from .onnx_external import import_onnx, load_attribute_data
from .onnx_fold import fold_shape_computations
from .onnx_ops import check_operators, check_static_shapes, conversion_failure, model_opset, newer_opset_for
from .onnx_rewrites import (
    average_pool_covering_input_to_global,
    dropout_to_identity,
    prelu_with_slope_vector_to_elementwise,
    sequence_insert_positions_nonnegative,
)
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
            if len(shape) != len(dims) or any(d is not None and d != s for d, s in zip(dims, shape, strict=True)):
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


def _from_onnx(model, inputs: list[TensorSpec], path: str):
    """TVM's importer with its failure as a typed error: the operator whose converter failed when
    TVM says which (it prints "Error converting operator X, with inputs: <Relax>"), else the model.
    External initializers are read from their files as TVM converts them (onnx_external.py)."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            return import_onnx(model, {s.name: list(s.shape) for s in inputs}, {s.name: s.dtype for s in inputs},
                               Path(path).resolve().parent)
    except ModelLoadError as e:  # an external initializer's file (onnx_external.read_external)
        raise ModelLoadError(f"{path}: could not read its external data ({e})") from None
    except Exception as e:
        failed = re.search(r"Error converting operator (\S+), with inputs", printed.getvalue())
        if failed:
            raise conversion_failure(model, failed.group(1).rstrip(","), e) from None
        raise ModelLoadError(f"{path}: TVM could not import the model: {one_line(e)}") from None


def _import_upgrading_opset(model, inputs: list[TensorSpec], path: str):
    """Imports ``model``; when a converter fails and TVM's converter of that operator is for a
    newer opset than the model's (TVM applies it to older opsets anyway: Slice-1 with attributes
    read as Slice-13 inputs), converts the model with onnx.version_converter and imports again.
    Returns (the Relax module, notes for the build log and manifest)."""
    notes: list[str] = []
    for _ in range(3):
        try:
            return _from_onnx(model, inputs, path), notes
        except UnsupportedOperatorError as e:
            wanted = newer_opset_for(e.op, model)
            if wanted is None:
                raise
            upgraded = _convert_version(model, wanted)
            if upgraded is None:
                raise
            notes.append(f"opset {model_opset(model)} -> {wanted} (onnx.version_converter): {e}")
            model = upgraded
    return _from_onnx(model, inputs, path), notes


def _convert_version(model, opset: int):
    import onnx.version_converter

    try:
        return onnx.version_converter.convert_version(model, opset)
    except Exception:  # no adapter for some operator: keep the model's own opset and its error
        return None


def _external_files(model, path: str) -> list[Path]:
    """The external-data files the model's initializers name (sorted), each checked to exist
    and to stay inside the model's folder (onnx refuses such paths too, less clearly)."""
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    base = Path(path).resolve().parent
    files = set()
    for tensor in model.graph.initializer:
        if not uses_external_data(tensor):
            continue
        location = base / ExternalDataInfo(tensor).location
        if base not in location.resolve().parents or not location.is_file():
            raise ModelLoadError(f"{path}: initializer {tensor.name!r} names external data "
                                 f"{ExternalDataInfo(tensor).location!r}, which is not a file next to the model")
        files.add(location)
    return sorted(files)


def _model_sha256(path: str, external: list[Path]) -> str:
    """The model's hash: the .onnx file alone, or with its external-data files (name and bytes)."""
    if not external:
        return file_sha256(path)
    h = hashlib.sha256(file_sha256(path).encode())
    for file in external:
        h.update(file.name.encode())
        h.update(file_sha256(file).encode())
    return h.hexdigest()


def load_onnx(path: str, input_shapes: dict[str, tuple[int, ...]]) -> ImportedModel:
    """Loads an ONNX file into Relax with static shapes; refuses unsupported operators by name."""
    import onnx

    if not Path(path).is_file():
        raise ModelLoadError(f"{path}: no such file")
    try:  # the graph only: external weights are read once, as TVM imports them
        model = onnx.load(path, load_external_data=False)
    except Exception as e:  # onnx raises DecodeError, ValueError, ... for malformed files
        raise ModelLoadError(f"{path}: not a valid ONNX file ({one_line(e)})") from None
    external = _external_files(model, path)
    if not model.graph.node:
        raise ModelLoadError(f"{path}: the ONNX graph has no nodes")
    model, inlined = _inline_local_functions(model)
    check_operators(model, inlined)
    inputs = _input_specs(model.graph, input_shapes)
    check_static_shapes(model, {s.name for s in inputs})
    fold_shape_computations(model, {s.name: s.shape for s in inputs})
    sequence_insert_positions_nonnegative(model)
    average_pool_covering_input_to_global(model)
    dropout_to_identity(model)
    prelu_with_slope_vector_to_elementwise(model)

    from tvm import relax

    if external:  # initializers are read as TVM converts them (_from_onnx); other tensors now
        try:
            load_attribute_data(model, Path(path).resolve().parent)
        except Exception as e:
            raise ModelLoadError(f"{path}: could not read its external data ({one_line(e)})") from None
    mod, notes = _import_upgrading_opset(model, inputs, path)
    mod = relax.transform.DecomposeOpsForInference()(mod)
    names = [o.name for o in model.graph.output]
    outputs = output_specs(mod, names)
    source = SourceInfo(name=Path(path).stem, path=str(path), sha256=_model_sha256(path, external), format="onnx")
    return ImportedModel(mod=mod, inputs=inputs, outputs=outputs, source=source, notes=notes)
