"""Run a tlmpack artifact: `model = tlmpack.runtime.load("model.tar"); y, = model(x=x)`.

This package runs on deployment machines, so it imports only the standard library and numpy:
never tvm, torch or transformers (a test enforces it). The kernels run in the C runtime installed
with tlmpack (runtime_c/, compiled at install), reached through ctypes; on CUDA, the C runtime
reaches the NVIDIA driver (libcuda.so.1) itself, and so does preflight (through ctypes), to see
what the GPU can run.
"""

from tlmpack.runtime.dlpack import CudaArray
from tlmpack.runtime.errors import (
    ArtifactError,
    IncompatibleTargetError,
    InputError,
    KernelError,
    TlmpackError,
    TlmpackWarning,
)
from tlmpack.runtime.kernels import empty_aligned
from tlmpack.runtime.model import Model, TensorSpec, load
from tlmpack.runtime.preflight import CheckReport, check

__all__ = [
    "ArtifactError",
    "CheckReport",
    "CudaArray",
    "IncompatibleTargetError",
    "InputError",
    "KernelError",
    "Model",
    "TensorSpec",
    "TlmpackError",
    "TlmpackWarning",
    "check",
    "empty_aligned",
    "load",
]
