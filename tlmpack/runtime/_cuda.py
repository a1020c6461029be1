"""The NVIDIA driver (libcuda.so.1) through ctypes: what preflight needs to know, and small copies.

No torch and no CUDA toolkit: the driver library alone. `probe()` answers whether CUDA can run here
(the driver loads, cuInit succeeds, how many GPUs, their names and SM versions, the driver version),
with the same sentences the C runtime gives when it opens a CUDA model, which repeats these checks.
The probe runs once per process (cuInit is slow on real GPUs and its answer does not change).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

LIBCUDA = "libcuda.so.1"
_ATTR_CC_MAJOR = 75
_ATTR_CC_MINOR = 76


@dataclass(frozen=True)
class Gpu:
    """One CUDA device: its ordinal, name and SM version as major*10+minor (90 for sm_90)."""

    index: int
    name: str
    arch: int


@dataclass(frozen=True)
class CudaHost:
    """What the driver says about this machine; `error` is a sentence when CUDA cannot run at all."""

    driver_version: int = 0  # as cuDriverGetVersion reports it: 13000 for CUDA 13.0
    gpus: tuple[Gpu, ...] = ()
    error: str | None = None

    @property
    def driver(self) -> str:
        return version_str(self.driver_version)


def version_str(v: int) -> str:
    """cuDriverGetVersion's 12080 as '12.8'."""
    return f"{v // 1000}.{(v % 1000) // 10}"


class _Driver:
    """The loaded libcuda with the few functions used here declared."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(LIBCUDA)  # OSError when there is no driver
        c = ctypes
        self.lib = lib
        for name, args in (
            ("cuInit", [c.c_uint]),
            ("cuDriverGetVersion", [c.POINTER(c.c_int)]),
            ("cuDeviceGetCount", [c.POINTER(c.c_int)]),
            ("cuDeviceGet", [c.POINTER(c.c_int), c.c_int]),
            ("cuDeviceGetName", [c.c_char_p, c.c_int, c.c_int]),
            ("cuDeviceGetAttribute", [c.POINTER(c.c_int), c.c_int, c.c_int]),
            ("cuGetErrorName", [c.c_int, c.POINTER(c.c_char_p)]),
            ("cuGetErrorString", [c.c_int, c.POINTER(c.c_char_p)]),
            ("cuDevicePrimaryCtxRetain", [c.POINTER(c.c_void_p), c.c_int]),
            ("cuDevicePrimaryCtxRelease_v2", [c.c_int]),
            ("cuCtxPushCurrent_v2", [c.c_void_p]),
            ("cuCtxPopCurrent_v2", [c.POINTER(c.c_void_p)]),
            ("cuMemcpyHtoD_v2", [c.c_uint64, c.c_void_p, c.c_size_t]),
            ("cuMemcpyDtoH_v2", [c.c_void_p, c.c_uint64, c.c_size_t]),
        ):
            fn = getattr(lib, name)  # AttributeError: a driver too old to have it
            fn.restype = c.c_int
            fn.argtypes = args

    def error(self, r: int) -> str:
        """'CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)'."""
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        n = name.value.decode() if self.lib.cuGetErrorName(r, ctypes.byref(name)) == 0 and name.value else f"CUresult {r}"
        t = text.value.decode() if self.lib.cuGetErrorString(r, ctypes.byref(text)) == 0 and text.value else "no description"
        return f"{n} ({t})"


@functools.lru_cache(maxsize=1)
def _driver() -> _Driver | str:
    """The driver, or the sentence saying why it cannot be used."""
    try:
        drv = _Driver()
    except OSError as e:
        return f"CUDA driver library {LIBCUDA} not found (dlopen: {e}); install the NVIDIA driver or use device=cpu"
    except AttributeError as e:
        return (f"{LIBCUDA} lacks a function this runtime needs ({e}); the NVIDIA driver is too old "
                f"(it needs a driver for CUDA 12.0 or newer); update the driver or use device=cpu")
    r = drv.lib.cuInit(0)
    if r != 0:
        return (f"cuInit failed: {drv.error(r)}; no usable NVIDIA GPU here: check the driver and the GPU, "
                f"or use device=cpu")
    return drv


@functools.lru_cache(maxsize=1)
def probe() -> CudaHost:
    """This machine's CUDA driver and GPUs (cached for the process)."""
    drv = _driver()
    if isinstance(drv, str):
        return CudaHost(error=drv)
    lib = drv.lib
    version = ctypes.c_int(0)
    r = lib.cuDriverGetVersion(ctypes.byref(version))
    if r != 0:
        return CudaHost(error=f"cuDriverGetVersion failed: {drv.error(r)}")
    count = ctypes.c_int(0)
    r = lib.cuDeviceGetCount(ctypes.byref(count))
    if r != 0:
        return CudaHost(version.value, error=f"cuDeviceGetCount failed: {drv.error(r)}; use device=cpu")
    gpus = []
    for i in range(count.value):
        dev = ctypes.c_int()
        major, minor = ctypes.c_int(), ctypes.c_int()
        name = ctypes.create_string_buffer(128)
        r = lib.cuDeviceGet(ctypes.byref(dev), i)
        if r == 0:
            r = lib.cuDeviceGetAttribute(ctypes.byref(major), _ATTR_CC_MAJOR, dev.value)
        if r == 0:
            r = lib.cuDeviceGetAttribute(ctypes.byref(minor), _ATTR_CC_MINOR, dev.value)
        if r != 0:
            return CudaHost(version.value, error=f"cannot query GPU {i}: {drv.error(r)}")
        if lib.cuDeviceGetName(name, 127, dev.value) != 0:
            name.value = b"(unnamed GPU)"
        gpus.append(Gpu(i, name.value.decode(errors="replace"), major.value * 10 + minor.value))
    return CudaHost(version.value, tuple(gpus))


def _on_device(index: int, what: str, call) -> None:
    """Runs call() with device `index`'s primary context current on this thread, then restores."""
    drv = _driver()
    if isinstance(drv, str):
        raise RuntimeError(drv)
    lib = drv.lib
    dev, ctx, popped = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
    r = lib.cuDeviceGet(ctypes.byref(dev), index)
    if r == 0:
        r = lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev.value)
    if r != 0:
        raise RuntimeError(f"{what} on cuda:{index}: {drv.error(r)}")
    try:
        r = lib.cuCtxPushCurrent_v2(ctx)
        if r != 0:
            raise RuntimeError(f"{what} on cuda:{index}: cuCtxPushCurrent: {drv.error(r)}")
        try:
            r = call(lib)
            if r != 0:
                raise RuntimeError(f"{what} on cuda:{index}: {drv.error(r)}")
        finally:
            lib.cuCtxPopCurrent_v2(ctypes.byref(popped))
    finally:
        lib.cuDevicePrimaryCtxRelease_v2(dev.value)


def copy_to_host(index: int, dst: int, src: int, nbytes: int) -> None:
    """Copies nbytes from device memory src (on cuda:index) to host memory dst, synchronously."""
    if nbytes:
        _on_device(index, "copying device memory to the host", lambda lib: lib.cuMemcpyDtoH_v2(dst, src, nbytes))


def copy_to_device(index: int, dst: int, src: int, nbytes: int) -> None:
    """Copies nbytes from host memory src to device memory dst (on cuda:index), synchronously."""
    if nbytes:
        _on_device(index, "copying host memory to the device", lambda lib: lib.cuMemcpyHtoD_v2(dst, src, nbytes))
