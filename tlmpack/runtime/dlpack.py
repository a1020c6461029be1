"""DLPack for CUDA memory, with ctypes alone: read a producer's capsule, and export our own buffers.

Inputs: `device_view(value, stream)` asks a CUDA tensor (torch, cupy, jax, or a CudaArray) for its
capsule, telling the producer which stream will read it, and reads the device pointer, dtype, shape
and strides out of the DLManagedTensor (or DLManagedTensorVersioned). The capsule is not consumed:
it stays the producer's, and it must stay alive (the view holds it) until the run has finished.

A torch CUDA tensor is read through its own accessors instead (`torch_view`): torch's
`__dlpack__(stream=...)` costs tens of microseconds a tensor (stream objects and an event each), so
the model is ordered after torch's current stream once per run (tlmrt_model_wait_stream) instead.

Outputs: `CudaArray` owns a device buffer allocated by the C runtime (tlmrt_dlpack_alloc_cuda),
already wrapped in a DLManagedTensor whose C deleter frees it. `__dlpack__` hands that to one
consumer (torch.from_dlpack(a)); an array never exported gives its buffer back when collected: to
its model's `BufferPool`, for the next run's output of the same dtype and shape, else to the driver.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from tlmpack.runtime import _cuda

KDL_CPU = 1
KDL_CUDA = 2
_LEGACY = b"dltensor"
_VERSIONED = b"dltensor_versioned"
_USED = b"used_dltensor"

# dtype <-> DLPack (code, bits): 0 int, 1 uint, 2 float, 6 bool
DL_DTYPES: dict[str, tuple[int, int]] = {
    "bool": (6, 8),
    "int8": (0, 8), "int16": (0, 16), "int32": (0, 32), "int64": (0, 64),
    "uint8": (1, 8), "uint16": (1, 16), "uint32": (1, 32), "uint64": (1, 64),
    "float16": (2, 16), "float32": (2, 32), "float64": (2, 64),
}
_DL_NAMES = {v: k for k, v in DL_DTYPES.items()}


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


assert ctypes.sizeof(DLTensor) == 48 and ctypes.sizeof(DLManagedTensor) == 64

_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CapsuleDestructor]
_is_valid_raw = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_get_pointer_raw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer", _api))


def _call_deleter(managed: int) -> None:
    """Calls a DLManagedTensor's own deleter (a C function), if it has one."""
    deleter = DLManagedTensor.from_address(managed).deleter
    if deleter:
        _Deleter(deleter)(managed)


@_CapsuleDestructor
def _capsule_destructor(capsule: int) -> None:
    """Frees the tensor of a capsule that no consumer took (a consumer renames it to used_dltensor)."""
    if _is_valid_raw(capsule, _LEGACY):
        _call_deleter(_get_pointer_raw(capsule, _LEGACY))


# ---- reading a producer's CUDA tensor -------------------------------------------------------------

@dataclass(frozen=True)
class DeviceView:
    """A producer's tensor on a CUDA device, read from its DLPack capsule (which it keeps alive)."""

    ptr: int
    device_id: int
    dtype: str  # numpy name, or "(code c, b bits, l lanes)" when numpy has none
    shape: tuple[int, ...]
    contiguous: bool
    capsule: Any  # what keeps the memory alive until the run ends: the capsule, tensor or CudaArray
    # how the run is ordered after the producer's writes: "dlpack" (the producer ordered them before the
    # stream it was given), "torch" (the run must wait for torch's current stream) or "ready" (none pending)
    ordering: str = "dlpack"


def dlpack_device(value: Any) -> tuple[int, int] | None:
    """value.__dlpack_device__() as two ints, or None when it has none (or it fails)."""
    fn = getattr(value, "__dlpack_device__", None)
    if fn is None:
        return None
    try:
        kind, index = fn()
        return int(kind), int(index)
    except (TypeError, ValueError, RuntimeError, BufferError):
        return None


def device_view(value: Any, stream: int | None) -> DeviceView:
    """Reads a CUDA tensor's capsule. stream: the CUstream (an int) that will read the memory, so the
    producer orders its pending work before it (the DLPack protocol); raises BufferError, TypeError,
    ValueError or RuntimeError from the producer, or ValueError for a capsule that is not CUDA memory.
    A CudaArray is read directly, not exported (it can be exported only once, and its data is ready)."""
    if isinstance(value, CudaArray):
        value._check_owned("feed")
        return DeviceView(value.data_ptr, value.device_id, value.dtype.name, value.shape, True, value, "ready")
    try:
        capsule = value.__dlpack__(stream=stream)
    except TypeError:
        capsule = value.__dlpack__()  # a producer without the stream argument
    if _api.PyCapsule_IsValid(capsule, _LEGACY):
        managed = DLManagedTensor.from_address(_api.PyCapsule_GetPointer(capsule, _LEGACY))
        t = managed.dl_tensor
    elif _api.PyCapsule_IsValid(capsule, _VERSIONED):
        managed_v = DLManagedTensorVersioned.from_address(_api.PyCapsule_GetPointer(capsule, _VERSIONED))
        t = managed_v.dl_tensor
    else:
        raise ValueError("__dlpack__ returned something that is not an unconsumed DLPack capsule")
    if t.device.device_type != KDL_CUDA:
        raise ValueError(f"the capsule's memory is on DLPack device type {t.device.device_type}, not CUDA ({KDL_CUDA})")
    ndim = t.ndim
    if not 0 <= ndim <= 32:
        raise ValueError(f"the capsule has ndim {ndim}")
    shape = tuple(t.shape[i] for i in range(ndim))
    contiguous = True
    if t.strides:
        expect = 1
        for i in reversed(range(ndim)):
            if shape[i] != 1 and t.strides[i] != expect:
                contiguous = False
            expect *= shape[i]
    dt = t.dtype
    name = _DL_NAMES.get((dt.code, dt.bits)) if dt.lanes == 1 else None
    dtype = name or f"(code {dt.code}, {dt.bits} bits, {dt.lanes} lanes)"
    return DeviceView((t.data or 0) + t.byte_offset, t.device.device_id, dtype, shape, contiguous, capsule)


def torch_view(value: Any) -> DeviceView | None:
    """A torch CUDA tensor's memory read through its accessors, with no capsule and no event; None for
    anything else (a subclass, a CPU tensor, another framework: those go through DLPack). Not ordered:
    the caller makes the model wait for torch's current stream (torch_stream) before the run."""
    torch = sys.modules.get("torch")  # never imported here: a torch tensor means torch is loaded
    if torch is None or type(value) is not torch.Tensor or not value.is_cuda:
        return None
    dtype = str(value.dtype).removeprefix("torch.")
    return DeviceView(value.data_ptr(), value.get_device(), dtype, tuple(value.shape), value.is_contiguous(), value,
                      "torch")


def torch_stream(device_index: int) -> int:
    """torch's current CUstream on that GPU (0: the legacy default stream), which its pending work is on."""
    return int(sys.modules["torch"].cuda.current_stream(device_index).cuda_stream)


# ---- our own device buffers -------------------------------------------------------------------------

class BufferPool:
    """Device buffers of a model's collected, never exported CudaArrays, kept for its next outputs of the
    same dtype and shape: a run then needs no cuMemAlloc, and the dropped output no cuMemFree (which waits
    for the whole device). Such a buffer was only ever read by runs and host copies, which finish before
    they return, so reusing it cannot race. At most KEEP a shape; close() frees them."""

    KEEP = 2

    def __init__(self) -> None:
        self._spare: dict[tuple[str, tuple[int, ...]], list[tuple[int, int]]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def take(self, dtype: str, shape: tuple[int, ...]) -> tuple[int, int] | None:
        """A kept (managed tensor, data pointer) of that dtype and shape, or None."""
        with self._lock:
            spare = self._spare.get((dtype, shape))
            return spare.pop() if spare else None

    def give(self, dtype: str, shape: tuple[int, ...], managed: int, ptr: int) -> None:
        """Keeps a buffer for reuse, or frees it when the pool is full or closed."""
        with self._lock:
            spare = self._spare.setdefault((dtype, shape), [])
            if not self._closed and len(spare) < self.KEEP:
                spare.append((managed, ptr))
                return
        _call_deleter(managed)

    def close(self) -> None:
        """Frees every kept buffer; later gives free theirs at once."""
        with self._lock:
            self._closed = True
            kept = [m for spare in self._spare.values() for m, _ in spare]
            self._spare.clear()
        for managed in kept:
            _call_deleter(managed)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._spare.values())


def _release(managed: int, ptr: int, dtype: str, shape: tuple[int, ...], pool: BufferPool | None) -> None:
    if pool is not None:
        pool.give(dtype, shape, managed, ptr)
    else:
        _call_deleter(managed)


class CudaArray:
    """A tensor in CUDA device memory that the runtime allocated: a model output, or model.to_device(x).

    Hand it to any DLPack consumer (torch.from_dlpack(a), cupy.from_dlpack(a)) without a copy: the
    consumer then owns the buffer, and this object becomes empty. Or feed it back to a model, or copy
    it to the host with numpy().
    """

    def __init__(self, managed: int, ptr: int, shape: tuple[int, ...], dtype: str, device_id: int,
                 pool: BufferPool | None = None) -> None:
        self._managed: int | None = managed
        self.data_ptr = ptr
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.device_id = device_id
        name = dtype if isinstance(dtype, str) else self.dtype.name
        self._finalizer = weakref.finalize(self, _release, managed, ptr, name, self.shape, pool)

    @property
    def device(self) -> str:
        return f"cuda:{self.device_id}"

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def exported(self) -> bool:
        return self._managed is None

    def __repr__(self) -> str:
        state = ", exported" if self.exported else ""
        return f"<CudaArray {self.dtype.name} {self.shape} on {self.device}{state}>"

    def _check_owned(self, what: str) -> None:
        if self._managed is None:
            raise BufferError(f"this CudaArray was handed to a DLPack consumer, which owns its memory now; "
                              f"{what} that tensor instead")

    def __dlpack_device__(self) -> tuple[int, int]:
        return (KDL_CUDA, self.device_id)

    def __dlpack__(self, *, stream: int | None = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """The buffer as a "dltensor" capsule, for one consumer. The data is ready on every stream (the
        run that wrote it has synchronized), so `stream` needs no waiting."""
        del stream, max_version  # an unversioned capsule serves every consumer
        self._check_owned("use")
        if dl_device is not None and tuple(int(v) for v in dl_device) != (KDL_CUDA, self.device_id):
            raise BufferError(f"a CudaArray on {self.device} cannot be exported to DLPack device {tuple(dl_device)}")
        if copy:
            raise BufferError("a CudaArray is exported without a copy; copy it with the consumer afterwards")
        capsule = _api.PyCapsule_New(self._managed, _LEGACY, _capsule_destructor)
        self._managed = None
        self._finalizer.detach()
        return capsule

    def numpy(self) -> np.ndarray:
        """A host copy."""
        self._check_owned("copy")
        out = np.empty(self.shape, dtype=self.dtype)
        _cuda.copy_to_host(self.device_id, out.ctypes.data, self.data_ptr, self.nbytes)
        return out
