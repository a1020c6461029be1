"""Renders the CUDA execution plan (templates/cuda_plan.c.j2) as C data for cuda/plan.so.

The device arena reuses the Graph's memory plan (same tensors, same offsets) and appends one
workspace region after it for the global intermediates some tasks allocate between their kernels.
Calls run one after another on one stream, so every task's workspaces start at the same offset
and the region is as large as the largest task's needs. Weights keep their weights.bin offsets.
"""

from __future__ import annotations

import ctypes
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import LoweringError
from ..graph import ALIGNMENT, Graph
from ..lower.cuda import CudaKernels, CudaTarget
from ..specs import TensorSpec
from .plan_c import _DLPACK_CODE, _environment, c_string

# tlmrt_plan.h's enums, for readers of the table.
ARENA, WEIGHTS = 0, 1
ARG_TENSOR, ARG_INT32, ARG_INT64 = 0, 1, 2
IMAGE_CUBIN, IMAGE_PTX = 0, 1

_ARG_KIND = {"int32": "TLMRT_CUDA_ARG_INT32", "int64": "TLMRT_CUDA_ARG_INT64"}
_IMAGE_KIND = {"cubin": "TLMRT_CUDA_IMAGE_CUBIN", "ptx": "TLMRT_CUDA_IMAGE_PTX"}


def _aligned(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


@dataclass(frozen=True)
class CudaPlan:
    """The rendered plan and the numbers the manifest records."""

    c_source: str
    arena_bytes: int
    workspace_bytes: int
    num_tensors: int
    num_launches: int


def _tensor(tid: int, name: str, storage: str, dtype: str, shape, offset: int) -> dict:
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    return {"id": tid, "name": c_string(name).replace("*/", "* /"),
            "storage": "TLMRT_STORAGE_ARENA" if storage == "arena" else "TLMRT_STORAGE_WEIGHTS",
            "dtype_code": _DLPACK_CODE[dt.kind], "dtype_bits": 8 if dt.kind == "b" else dt.itemsize * 8,
            "offset": offset, "nbytes": nbytes, "ndim": len(shape), "shape": [int(s) for s in shape]}


def render_cuda_plan(graph: Graph, kernels: CudaKernels, target: CudaTarget, inputs: list[TensorSpec],
                     outputs: list[TensorSpec], model_name: str, version: str,
                     plan_symbol: str = "tlmrt_cuda_plan_v1") -> CudaPlan:
    """The CUDA plan as C data; a dynamic-batch plan.so holds one per batch size, each under its own symbol."""
    tensors = [_tensor(t.id, t.name, t.storage, t.dtype, t.shape, t.offset) for t in graph.tensors]

    # Workspaces: one tensor per (task, intermediate), all tasks sharing one region after the arena.
    workspace_base = _aligned(graph.arena_bytes)
    workspace_ids: dict[tuple[str, int], int] = {}
    workspace_bytes = 0
    for task in graph.tasks:
        used = 0
        for j, ws in enumerate(kernels.launches[task.id].workspaces):
            workspace_ids[(task.id, j)] = len(tensors)
            tensors.append(_tensor(len(tensors), f"{task.id}.{ws.name}", "arena", ws.dtype, ws.shape,
                                   workspace_base + used))
            used += _aligned(max(ws.nbytes, 1))
        workspace_bytes = max(workspace_bytes, used)
    arena_bytes = workspace_base + workspace_bytes if workspace_bytes else graph.arena_bytes

    launches = []
    for call in graph.calls:
        task_launches = kernels.launches[call.task]
        func = graph.task_funcs.get(call.task)
        if func is not None and len(func.params) != len(call.args):
            raise LoweringError(f"task {call.task} has {len(func.params)} parameters, its call passes {len(call.args)}")
        for launch in task_launches.launches:
            args = []
            for a in launch.args:
                if a.kind == "param":
                    if not 0 <= a.index < len(call.args):
                        raise LoweringError(f"{launch.kernel}: parameter {a.index} of a call with {len(call.args)}")
                    args.append({"kind": "TLMRT_CUDA_ARG_TENSOR", "tensor": call.args[a.index], "value": 0})
                elif a.kind == "workspace":
                    args.append({"kind": "TLMRT_CUDA_ARG_TENSOR", "tensor": workspace_ids[(call.task, a.index)],
                                 "value": 0})
                else:
                    args.append({"kind": _ARG_KIND[a.kind], "tensor": -1, "value": a.value})
            launches.append({"kernel": c_string(launch.kernel), "task": c_string(call.task),
                             "grid": list(launch.grid), "block": list(launch.block),
                             "dynamic_smem_bytes": launch.dynamic_smem_bytes, "args": args})

    images = sorted(kernels.images, key=lambda im: (im[1] != "cubin", im[2], im[0]))  # cubins first
    source = _environment().get_template("cuda_plan.c.j2").render(
        tlmpack_version=version, plan_symbol=plan_symbol,
        model_name=c_string(model_name),
        tensors=tensors,
        launches=launches,
        inputs=[{"name": c_string(s.name), "tensor": tid} for s, tid in zip(inputs, graph.inputs, strict=True)],
        outputs=[{"name": c_string(s.name), "tensor": tid} for s, tid in zip(outputs, graph.outputs, strict=True)],
        images=[{"file": c_string(f"cuda/{file}"), "kind": _IMAGE_KIND[kind], "arch": arch}
                for file, kind, arch in images],
        arena_bytes=arena_bytes,
        weights_bytes=len(graph.weights),
        weights_sha256=hashlib.sha256(graph.weights).hexdigest(),
        min_driver_version=target.min_driver_version,
    )
    return CudaPlan(source, arena_bytes, workspace_bytes, len(tensors), len(launches))


# ------------------------------------------------------------------------------------------------
# Reading a built cuda/plan.so back (tests, tools): a ctypes mirror of tlmrt_plan.h's CUDA plan.
# ------------------------------------------------------------------------------------------------

class _CTensor(ctypes.Structure):
    _fields_ = [("storage", ctypes.c_int32), ("dtype_code", ctypes.c_uint8), ("dtype_bits", ctypes.c_uint8),
                ("dtype_lanes", ctypes.c_uint16), ("offset", ctypes.c_uint64), ("nbytes", ctypes.c_uint64),
                ("ndim", ctypes.c_int32), ("shape", ctypes.POINTER(ctypes.c_int64))]


class _CIO(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("tensor", ctypes.c_int32)]


class _CArg(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("tensor", ctypes.c_int32), ("value", ctypes.c_int64)]


class _CLaunch(ctypes.Structure):
    _fields_ = [("kernel", ctypes.c_char_p), ("task", ctypes.c_char_p), ("grid", ctypes.c_uint32 * 3),
                ("block", ctypes.c_uint32 * 3), ("dynamic_smem_bytes", ctypes.c_uint32),
                ("num_args", ctypes.c_int32), ("args", ctypes.POINTER(_CArg))]


class _CImage(ctypes.Structure):
    _fields_ = [("file", ctypes.c_char_p), ("kind", ctypes.c_int32), ("arch", ctypes.c_int32)]


class _CPlan(ctypes.Structure):
    _fields_ = [("abi_version", ctypes.c_uint32), ("model_name", ctypes.c_char_p), ("arena_bytes", ctypes.c_uint64),
                ("weights_bytes", ctypes.c_uint64), ("weights_sha256", ctypes.c_char_p),
                ("min_driver_version", ctypes.c_int32),
                ("num_tensors", ctypes.c_int32), ("tensors", ctypes.POINTER(_CTensor)),
                ("num_inputs", ctypes.c_int32), ("inputs", ctypes.POINTER(_CIO)),
                ("num_outputs", ctypes.c_int32), ("outputs", ctypes.POINTER(_CIO)),
                ("num_launches", ctypes.c_int32), ("launches", ctypes.POINTER(_CLaunch)),
                ("num_images", ctypes.c_int32), ("images", ctypes.POINTER(_CImage))]




def read_cuda_plan(plan_so: Path, symbol: str = "tlmrt_cuda_plan_v1") -> dict:
    """Loads cuda/plan.so and copies its table (the plan under ``symbol``: a batch plan's) into plain Python data."""
    lib = ctypes.CDLL(str(plan_so))
    get = getattr(lib, symbol)
    get.restype = ctypes.POINTER(_CPlan)
    p = get().contents

    def tensor(t: _CTensor) -> dict:
        return {"storage": t.storage, "dtype": (t.dtype_code, t.dtype_bits, t.dtype_lanes), "offset": t.offset,
                "nbytes": t.nbytes, "shape": tuple(t.shape[i] for i in range(t.ndim))}

    return {
        "abi_version": p.abi_version, "model_name": p.model_name.decode(), "arena_bytes": p.arena_bytes,
        "weights_bytes": p.weights_bytes, "weights_sha256": p.weights_sha256.decode(),
        "min_driver_version": p.min_driver_version,
        "tensors": [tensor(p.tensors[i]) for i in range(p.num_tensors)],
        "inputs": [(p.inputs[i].name.decode(), p.inputs[i].tensor) for i in range(p.num_inputs)],
        "outputs": [(p.outputs[i].name.decode(), p.outputs[i].tensor) for i in range(p.num_outputs)],
        "launches": [{"kernel": launch.kernel.decode(), "task": launch.task.decode(), "grid": tuple(launch.grid),
                      "block": tuple(launch.block), "smem": launch.dynamic_smem_bytes,
                      "args": [(launch.args[j].kind, launch.args[j].tensor, launch.args[j].value)
                               for j in range(launch.num_args)]}
                     for launch in (p.launches[i] for i in range(p.num_launches))],
        "images": [(p.images[i].file.decode(), p.images[i].kind, p.images[i].arch) for i in range(p.num_images)],
    }
