"""Calls and times x86 TVM kernels through the C runtime's kernel path (runtime_c/tlmrt_kernels.c).

A dataset record's latency must be what a deployed model would see: the kernel running on
runtime_c's own thread pool, with the context hooks (parallel launch and barrier, workspace) that
the runtime fills into x86/model.so, not on TVM's runtime and its pool. This module opens a library
that TVM exported (``tvm.compile(mod, target=...).export_library(path)``) with
``tlmrt_kernel_library_open``, which starts that pool and fills those hooks, and times kernels with
``tlmrt_kernel_time``.

Only ctypes and numpy: no TVM. libtlmrt.so is the one tlmpack.runtime uses, compiled once per set of
runtime_c/ sources into the cache by its helper (or $TLMPACK_RUNTIME_LIB). A library from
export_library leaves TVMFFIErrorSetRaisedFromCStrParts to libtvm_ffi.so, so it opens only in a
process that has loaded tvm_ffi (the collector has, to compile). TVM's kernels assume 64-byte
aligned data, which numpy does not promise: other arrays run on aligned copies, copied back after
the call (``empty_aligned`` makes arrays that need none).
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

import numpy as np

from tlmpack.runtime import _capi
from tlmpack.runtime.dlpack import DLDataType, DLDevice, DLTensor  # tlmrt_dltensor has DLPack's layout
from tlmpack.runtime.errors import InputError, TlmpackError

ALIGNMENT = 64  # bytes; TVM's kernels assume it for every tensor's data
_INT32_MAX = 2**31 - 1
_DTYPE_CODES = {"i": 0, "u": 1, "f": 2, "b": 6}  # numpy kind -> DLPack type code
_BFLOAT = 4


assert ctypes.sizeof(DLTensor) == 48 and DLTensor.shape.offset == 24

_runtime: ctypes.CDLL | None = None


def _runtime_library() -> ctypes.CDLL:
    """libtlmrt.so with the kernel-library functions declared: $TLMPACK_RUNTIME_LIB, else the library
    installed with tlmpack (pip install -e . compiles this checkout's runtime_c/ into the package)."""
    global _runtime
    with _capi._load_lock:
        if _runtime is not None:
            return _runtime
        loaded = _capi.load_library()
        lib, path = loaded.lib, loaded.path
        if not hasattr(lib, "tlmrt_kernel_library_open"):
            raise TlmpackError(f"{path}: this C runtime has no kernel-library API (tlmrt_kernel_library_open); "
                               f"use one built from runtime_c/ of API version 3 or later")
        c_status, handle, tensors = ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.POINTER(DLTensor))
        sig = _capi.Library._sig
        sig(lib, "tlmrt_kernel_library_open", c_status, [ctypes.c_char_p, ctypes.c_int32, ctypes.POINTER(handle)])
        sig(lib, "tlmrt_kernel_call", c_status, [handle, ctypes.c_char_p, tensors, ctypes.c_int32])
        sig(lib, "tlmrt_kernel_time", c_status, [handle, ctypes.c_char_p, tensors, ctypes.c_int32, ctypes.c_int32,
                                                 ctypes.c_double, ctypes.POINTER(ctypes.c_double)])
        sig(lib, "tlmrt_kernel_library_last_error", ctypes.c_char_p, [handle])
        sig(lib, "tlmrt_kernel_library_close", None, [handle])
        _runtime = lib
        return lib


def empty_aligned(shape: tuple[int, ...], dtype: object) -> np.ndarray:
    """An uninitialized C-contiguous array whose data is 64-byte aligned, as TVM's kernels assume
    (arrays that are not get copied to one around each call). A model reads an input given in one
    where it is, without copying it into its arena; numpy's own arrays are often only 16-byte aligned."""
    dtype = np.dtype(dtype)
    shape = tuple(int(d) for d in shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    buf = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    start = (-buf.ctypes.data) % ALIGNMENT
    return buf[start:start + nbytes].view(dtype).reshape(shape)


def _dtype_code(i: int, a: np.ndarray) -> int:
    if a.dtype.name == "bfloat16":
        return _BFLOAT
    if a.dtype.kind in _DTYPE_CODES:
        return _DTYPE_CODES[a.dtype.kind]
    raise InputError(f"argument {i}: dtype {a.dtype} has no DLPack code here (expected int, uint, float, bool)")


class _Packed:
    """The tlmrt_dltensor* array for a call, everything it points to, and the arrays that were staged
    in aligned copies (C-contiguous, 64-byte aligned), to copy back after the call."""

    def __init__(self, arrays: list[np.ndarray]) -> None:
        self.keep: list = []
        self.staged: list[tuple[np.ndarray, np.ndarray]] = []
        tensors = []
        for i, a in enumerate(arrays):
            if not isinstance(a, np.ndarray):
                raise InputError(f"argument {i}: expected a numpy array, found {type(a).__name__}")
            code = _dtype_code(i, a)
            if a.size > 0 and (not a.flags.c_contiguous or a.ctypes.data % ALIGNMENT != 0):
                staged = empty_aligned(a.shape, a.dtype)
                staged[...] = a
                self.staged.append((a, staged))
                a = staged
            shape = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
            self.keep += [a, shape]
            tensors.append(DLTensor(a.ctypes.data, DLDevice(_capi.DEVICE_CPU, 0), a.ndim,
                                    DLDataType(code, a.dtype.itemsize * 8, 1),
                                    ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)), None, 0))
        self.keep += tensors
        self.count = len(tensors)
        self.ptrs = (ctypes.POINTER(DLTensor) * max(len(tensors), 1))(*(ctypes.pointer(t) for t in tensors))

    def copy_back(self) -> None:
        for original, staged in self.staged:
            if original.flags.writeable:
                original[...] = staged


def _name(name: str) -> bytes:
    if not isinstance(name, str) or "\0" in name:
        raise InputError(f"kernel name: expected a string without NUL characters, found {name!r}")
    return name.encode()


class KernelLibrary:
    """A TVM-exported kernel library opened by the C runtime, with a pool of ``num_threads`` threads
    (0: every online core). Use as a context manager, or call ``close``. Calls on one library are
    serialized (the C library is not thread-safe on one library)."""

    def __init__(self, so_path: str | os.PathLike[str], num_threads: int = 0) -> None:
        self.path = Path(so_path)
        self._handle: int | None = None
        self._lock = threading.Lock()
        if not isinstance(num_threads, int) or not 0 <= num_threads <= _INT32_MAX:
            raise InputError(f"num_threads: expected 0 (all cores) or a positive int, found {num_threads!r}")
        self._lib = _runtime_library()
        handle = ctypes.c_void_p()
        status = self._lib.tlmrt_kernel_library_open(os.fsencode(self.path), num_threads, ctypes.byref(handle))
        if status != _capi.OK or not handle.value:
            # Thread-local in C, and ctypes calls run on this thread: read it right away.
            message = (self._lib.tlmrt_open_error() or b"").decode(errors="replace")
            raise _capi.status_error(status if status != _capi.OK else _capi.ERR_IO, message,
                                     f"{self.path}: cannot open the kernel library")
        self._handle = handle.value

    def _check(self, status: int) -> None:
        if status != _capi.OK:  # the C sentence names the kernel
            message = (self._lib.tlmrt_kernel_library_last_error(self._handle) or b"").decode(errors="replace")
            raise _capi.status_error(status, message, str(self.path))

    def _open_handle(self) -> int:
        if self._handle is None:
            raise TlmpackError(f"{self.path}: the kernel library is closed")
        return self._handle

    def call(self, name: str, arrays: list[np.ndarray]) -> None:
        """Runs kernel ``name`` once on ``arrays``; outputs are written into them. Arrays that are not
        C-contiguous and 64-byte aligned run on aligned copies, copied back afterwards."""
        encoded = _name(name)
        packed = _Packed(arrays)
        with self._lock:
            status = self._lib.tlmrt_kernel_call(self._open_handle(), encoded, packed.ptrs, packed.count)
            self._check(status)
        packed.copy_back()

    def time(self, name: str, arrays: list[np.ndarray], repeats: int = 5, min_repeat_ms: float = 10.0) -> list[float]:
        """Seconds per call of kernel ``name``, one value per repeat, after one untimed warm-up call.
        Each repeat makes enough calls back to back to last at least ``min_repeat_ms``."""
        if not isinstance(repeats, int) or not 1 <= repeats <= _INT32_MAX:
            raise InputError(f"repeats: expected an int >= 1, found {repeats!r}")
        encoded = _name(name)
        packed = _Packed(arrays)
        out = (ctypes.c_double * repeats)()
        with self._lock:
            status = self._lib.tlmrt_kernel_time(self._open_handle(), encoded, packed.ptrs, packed.count, repeats,
                                                 float(min_repeat_ms), out)
            self._check(status)
        packed.copy_back()
        return list(out)

    def close(self) -> None:
        """Stops the pool's threads and unloads the library; further calls raise. Idempotent."""
        with self._lock:
            if self._handle is not None:
                self._lib.tlmrt_kernel_library_close(self._handle)
                self._handle = None

    def __enter__(self) -> KernelLibrary:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_handle", None) is not None:
            self.close()


def _shape(param) -> tuple[int, ...]:
    return tuple(int(d) for d in param.shape)


def random_arguments(func, num_outputs: int, seed: int) -> list[np.ndarray]:
    """Inputs: floats uniform in [0.1, 1) (safe for sqrt/log/division), integers 0 or 1 (safe as
    gather indices). Outputs: NaN (or -1), so a program that skips elements is caught."""
    rng = np.random.default_rng(seed)
    params = list(func.params)
    arrays = []
    for i, p in enumerate(params):
        dtype, shape = np.dtype(str(p.dtype)) if str(p.dtype) != "bool" else np.dtype(bool), _shape(p)
        if i >= len(params) - num_outputs:
            arrays.append(np.full(shape, np.nan if dtype.kind == "f" else -1, dtype=dtype) if dtype.kind != "b"
                          else np.zeros(shape, dtype))
        elif dtype.kind == "f":
            arrays.append(rng.uniform(0.1, 1.0, shape).astype(dtype))
        elif dtype.kind == "b":
            arrays.append(rng.integers(0, 2, shape).astype(bool))
        else:
            arrays.append(rng.integers(0, 2, shape).astype(dtype))
    return arrays
