"""External-data ONNX initializers, read from their file straight into the TVM tensors the Relax
constants hold: the weights are in memory once, never in the protobuf too (a model over 2 GiB
would otherwise be held three times while TVM converts it: the protobuf's bytes, the numpy array
onnx makes of them, the TVM tensor; and onnx's checker, which TVM runs first, serialises the
whole model once more).

``import_onnx`` is TVM's ``from_onnx`` (the same importer, the same opset choice) with the importer's
one place that reads a tensor's data (``_parse_array``) taught to read external initializers
itself. Tensors elsewhere (a Constant node's value saved as external data) are loaded into the
protobuf, as onnx does; they are small.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..errors import ModelLoadError

CHUNK = 64 << 20  # bytes per read: the kernel copies them into the tensor, no buffer in between

# initializer name, element type, dims and where its bytes are -> the TVM tensor read for it
_SHARED: contextvars.ContextVar[dict | None] = contextvars.ContextVar("tlmpack_shared_initializers", default=None)


@contextlib.contextmanager
def shared_initializers() -> Iterator[None]:
    """Within it, imports of one ONNX file (a dynamic-batch build imports it once per batch size)
    get the same TVM tensors for its initializers: the weights are held once, not once per plan.
    Only for imports of the same file: initializers are matched by name, type, shape and location."""
    token = _SHARED.set({})
    try:
        yield
    finally:
        _SHARED.reset(token)


def _initializer_key(tensor, base: Path) -> tuple:
    where = tuple((e.key, e.value) for e in tensor.external_data) or (len(tensor.raw_data),)
    return (str(base), tensor.name, tensor.data_type, tuple(tensor.dims), where)


def _plain_dtypes() -> set[int]:
    """ONNX element types whose external bytes are the numpy array's bytes on this host."""
    from onnx import TensorProto

    if sys.byteorder != "little":  # ONNX stores little-endian; let onnx swap
        return set()
    return {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT8, TensorProto.INT16,
            TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32,
            TensorProto.UINT64, TensorProto.BOOL}


def read_external(tensor, base: Path):
    """The tvm runtime tensor of an external-data initializer, read from its file in chunks
    directly into the tensor's memory. Other element types (bfloat16, float8, 4-bit) go through
    onnx's own conversion."""
    import onnx
    import tvm
    from onnx.external_data_helper import ExternalDataInfo, load_external_data_for_tensor

    info = ExternalDataInfo(tensor)
    location = base / info.location
    if base not in location.resolve().parents or not location.is_file():
        raise ModelLoadError(f"initializer {tensor.name!r} names {info.location!r}, which is not a file next to the model")
    if tensor.data_type not in _plain_dtypes():
        copy = onnx.TensorProto()
        copy.CopyFrom(tensor)
        load_external_data_for_tensor(copy, str(base))
        return tvm.runtime.tensor(onnx.numpy_helper.to_array(copy).reshape(tuple(tensor.dims)))
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
    shape = tuple(int(d) for d in tensor.dims)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if info.length is not None and int(info.length) != nbytes:
        raise ModelLoadError(f"initializer {tensor.name!r}: its external data is {info.length} bytes long, "
                             f"its shape {list(shape)} of {dtype} needs {nbytes}")
    out = tvm.runtime.empty(shape, str(dtype))
    view = memoryview(np.from_dlpack(out).reshape(-1).view(np.uint8))
    offset = int(info.offset or 0)
    done = 0
    try:
        with open(location, "rb", buffering=0) as f:
            f.seek(offset)
            while done < nbytes:
                got = f.readinto(view[done:min(nbytes, done + CHUNK)])
                if not got:
                    break
                done += got
    except OSError as e:
        raise ModelLoadError(f"initializer {tensor.name!r}: {info.location}: {e.strerror or e}") from None
    if done < nbytes:
        raise ModelLoadError(f"initializer {tensor.name!r}: {info.location} ends at byte {offset + done}, "
                             f"its data needs bytes {offset}..{offset + nbytes}")
    return out


def _attribute_tensors(graph) -> Iterator:
    """Tensors held in node attributes (a Constant's value), in subgraphs too."""
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _attribute_tensors(sub)


def load_attribute_data(model, base: Path) -> None:
    """Reads the external data of tensors that are not initializers into the protobuf."""
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    for tensor in _attribute_tensors(model.graph):
        if uses_external_data(tensor):
            load_external_data_for_tensor(tensor, str(base))
            tensor.data_location = tensor.DEFAULT
            del tensor.external_data[:]


def import_onnx(model, shape_dict: dict, dtype_dict: dict, base: Path):
    """``tvm.relax.frontend.onnx.from_onnx(model, shape_dict, dtype_dict, keep_params_in_input=False)``
    for a model whose initializers may name external data under ``base`` (not loaded). onnx's
    checker is not run: it only warns, and on a model whose data is not in the protobuf it fails
    on every external tensor."""
    from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter

    from .onnx_ops import model_opset

    shared = _SHARED.get()
    initializers = {t.name for t in model.graph.initializer} if shared is not None else set()

    class Importer(ONNXGraphImporter):
        def _parse_array(self, tensor_proto):
            from onnx.external_data_helper import uses_external_data

            key = _initializer_key(tensor_proto, base) if tensor_proto.name in initializers else None
            if key is not None and key in shared:
                return shared[key]
            if uses_external_data(tensor_proto):
                value = read_external(tensor_proto, base)
            else:
                value = super()._parse_array(tensor_proto)
            if key is not None:
                shared[key] = value
            return value

    if model.ir_version < 3:
        raise ValueError(f"Model IR version {model.ir_version} not supported. Must be at least after 1.1.0.")
    importer = Importer(shape_dict, dtype_dict, keep_params_in_input=False, sanitize=True)
    return importer.from_onnx(model.graph, model_opset(model))
