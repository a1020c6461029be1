"""ctypes bindings over runtime_c/tlmrt.h, the C runtime's whole public API.

The library is the one installed with this package (tlmpack/runtime/libtlmrt.so, compiled from
runtime_c/ by `pip install` for this platform), never anything from the artifact: loading a model
compiles nothing and runs no script. The artifact's own runtime_c/ (sources and a prebuilt library)
is there for C users. ctypes releases the GIL during every call, so a long run does not block other
Python threads.
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from tlmpack.runtime.errors import (
    ArtifactError,
    IncompatibleTargetError,
    InputError,
    KernelError,
    TlmpackError,
)

MAX_NDIM = 8  # TLMRT_MAX_NDIM
LIB_NAME = "libtlmrt.so"
PACKAGE_LIB = Path(__file__).resolve().parent / LIB_NAME  # built by setup.py at install

# tlmrt_status
OK = 0
ERR_INVALID_ARGUMENT = 1
ERR_IO = 2
ERR_ARTIFACT = 3
ERR_INCOMPATIBLE = 4
ERR_KERNEL = 5
ERR_OUT_OF_MEMORY = 6
ERR_BUSY = 7  # API version 4: the model takes no more concurrent runs now

# device types (DLPack's kDLCPU, kDLCUDA)
DEVICE_CPU = 1
DEVICE_CUDA = 2

STATUS_NAMES = {
    OK: "TLMRT_OK", ERR_INVALID_ARGUMENT: "TLMRT_ERR_INVALID_ARGUMENT", ERR_IO: "TLMRT_ERR_IO",
    ERR_ARTIFACT: "TLMRT_ERR_ARTIFACT", ERR_INCOMPATIBLE: "TLMRT_ERR_INCOMPATIBLE",
    ERR_KERNEL: "TLMRT_ERR_KERNEL", ERR_OUT_OF_MEMORY: "TLMRT_ERR_OUT_OF_MEMORY", ERR_BUSY: "TLMRT_ERR_BUSY",
}
_STATUS_ERRORS: dict[int, type[TlmpackError]] = {
    ERR_INVALID_ARGUMENT: InputError,
    ERR_IO: ArtifactError,
    ERR_ARTIFACT: ArtifactError,
    ERR_INCOMPATIBLE: IncompatibleTargetError,
    ERR_KERNEL: KernelError,
    ERR_OUT_OF_MEMORY: TlmpackError,
    ERR_BUSY: TlmpackError,
}


class Options(ctypes.Structure):
    """tlmrt_options."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("num_threads", ctypes.c_int32),
        ("verify_files", ctypes.c_int32),
        # API version 2
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("use_cuda_graph", ctypes.c_int32),
    ]


class IO(ctypes.Structure):
    """tlmrt_io: one caller buffer, host or CUDA device memory."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("nbytes", ctypes.c_uint64),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
    ]


class TensorInfo(ctypes.Structure):
    """tlmrt_tensor_info."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype_code", ctypes.c_uint8),
        ("dtype_bits", ctypes.c_uint8),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * MAX_NDIM),
        ("nbytes", ctypes.c_uint64),
    ]


class Profile(ctypes.Structure):
    """tlmrt_profile: a model's run totals since profiling was switched on."""

    _fields_ = [
        ("enabled", ctypes.c_int32),
        ("num_steps", ctypes.c_int32),
        ("runs", ctypes.c_uint64),
        ("run_ns", ctypes.c_uint64),
        ("kernel_ns", ctypes.c_uint64),
        ("io_ns", ctypes.c_uint64),
        ("pool_launches", ctypes.c_uint64),
        ("pool_wait_ns", ctypes.c_uint64),
        ("pool_wakes", ctypes.c_uint64),  # API version 8; a runtime before it leaves the zero here
    ]


class ProfileStep(ctypes.Structure):
    """tlmrt_profile_step: one step's (kernel call's or launch's) counters."""

    _fields_ = [
        ("kernel", ctypes.c_char_p),
        ("task", ctypes.c_char_p),
        ("calls", ctypes.c_uint64),
        ("total_ns", ctypes.c_uint64),
        ("last_start_ns", ctypes.c_uint64),
        ("last_ns", ctypes.c_uint64),
    ]


@dataclass(frozen=True)
class StepTime:
    """One step of a run as the C runtime's profiler counted it."""

    step: int
    kernel: str
    task: str
    calls: int
    total_ns: int
    last_start_ns: int  # the last timed run: start after the run's start, and length (a timeline)
    last_ns: int


@dataclass(frozen=True)
class ProfileReport:
    """What the C profiler counted since it was switched on; run_ns - kernel_ns is the runtime's own time."""

    runs: int
    run_ns: int
    kernel_ns: int
    io_ns: int  # the part of run_ns - kernel_ns that copies inputs in and outputs out (CPU)
    pool_launches: int  # parallel launches on the thread pool (CPU)
    pool_wait_ns: int  # the caller's wait for the pool's workers after its own tasks, inside kernel_ns (CPU)
    pool_wakes: int  # launches that found workers asleep and woke them with a system call (CPU)
    steps: tuple[StepTime, ...]


def status_error(status: int, message: str, context: str) -> TlmpackError:
    """The typed exception for a failed C call: `context` says what we were doing, `message` is the C sentence."""
    cls = _STATUS_ERRORS.get(status, TlmpackError)
    name = STATUS_NAMES.get(status, f"status {status}")
    detail = message.strip() or f"the C runtime returned {name} without a message"
    if status == ERR_OUT_OF_MEMORY:
        detail = f"out of memory: {detail}"
    return cls(f"{context}: {detail}")


class Library:
    """One loaded libtlmrt.so with its function signatures declared."""

    def __init__(self, path: Path) -> None:
        self.path = path
        lib = ctypes.CDLL(str(path))  # OSError if it does not load here
        c_status = ctypes.c_int
        pm = ctypes.c_void_p
        self._sig(lib, "tlmrt_options_init", None, [ctypes.POINTER(Options)])
        self._sig(lib, "tlmrt_model_open", c_status,
                  [ctypes.c_char_p, ctypes.POINTER(Options), ctypes.POINTER(ctypes.c_void_p)])
        self._sig(lib, "tlmrt_open_error", ctypes.c_char_p, [])
        self._sig(lib, "tlmrt_model_num_inputs", ctypes.c_int32, [pm])
        self._sig(lib, "tlmrt_model_num_outputs", ctypes.c_int32, [pm])
        self._sig(lib, "tlmrt_model_input_info", c_status, [pm, ctypes.c_int32, ctypes.POINTER(TensorInfo)])
        self._sig(lib, "tlmrt_model_output_info", c_status, [pm, ctypes.c_int32, ctypes.POINTER(TensorInfo)])
        self._sig(lib, "tlmrt_model_run", c_status,
                  [pm, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint64),
                   ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint64)])
        self._sig(lib, "tlmrt_model_last_error", ctypes.c_char_p, [pm])
        self._sig(lib, "tlmrt_model_close", None, [pm])
        self._sig(lib, "tlmrt_version", ctypes.c_char_p, [])
        # API version 2 (CUDA, device buffers); absent from runtimes packaged before it.
        self.has_v2 = all(hasattr(lib, n) for n in (
            "tlmrt_options_init_sized", "tlmrt_model_run_io", "tlmrt_model_output_buffer", "tlmrt_model_stream",
            "tlmrt_model_device_name", "tlmrt_dlpack_alloc_cuda"))
        if self.has_v2:
            self._sig(lib, "tlmrt_options_init_sized", None, [ctypes.POINTER(Options), ctypes.c_uint32])
            self._sig(lib, "tlmrt_model_run_io", c_status, [pm, ctypes.POINTER(IO), ctypes.POINTER(IO)])
            self._sig(lib, "tlmrt_model_output_buffer", c_status, [pm, ctypes.c_int32, ctypes.POINTER(IO)])
            self._sig(lib, "tlmrt_model_stream", ctypes.c_void_p, [pm])
            self._sig(lib, "tlmrt_model_device_name", ctypes.c_char_p, [pm])
            self._sig(lib, "tlmrt_dlpack_alloc_cuda", c_status,
                      [ctypes.c_int32, ctypes.c_uint8, ctypes.c_uint8, ctypes.c_int32, ctypes.POINTER(ctypes.c_int64),
                       ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p)])
        # API version 4 (profiling); absent from runtimes packaged before it.
        self.has_profiling = all(hasattr(lib, n) for n in (
            "tlmrt_model_set_profiling", "tlmrt_model_get_profile", "tlmrt_model_get_profile_step"))
        if self.has_profiling:
            self._sig(lib, "tlmrt_model_set_profiling", c_status, [pm, ctypes.c_int32])
            self._sig(lib, "tlmrt_model_get_profile", c_status, [pm, ctypes.POINTER(Profile)])
            self._sig(lib, "tlmrt_model_get_profile_step", c_status, [pm, ctypes.c_int32, ctypes.POINTER(ProfileStep)])
        # API version 5 (dynamic batch); absent from runtimes packaged before it.
        self.has_batch = all(hasattr(lib, n) for n in (
            "tlmrt_model_num_batch_plans", "tlmrt_model_batch_plan", "tlmrt_model_run_shaped",
            "tlmrt_model_set_batch_costs"))
        if self.has_batch:
            self._sig(lib, "tlmrt_model_set_batch_costs", c_status, [pm, ctypes.c_int32, ctypes.POINTER(ctypes.c_int64)])
            self._sig(lib, "tlmrt_model_num_batch_plans", ctypes.c_int32, [pm])
            self._sig(lib, "tlmrt_model_batch_plan", ctypes.c_int64, [pm, ctypes.c_int32])
            self._sig(lib, "tlmrt_model_run_shaped", c_status,
                      [pm, ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)), ctypes.POINTER(IO), ctypes.POINTER(IO)])
        # API version 6 (arenas shared by batch plans, and their size); absent before it.
        self.has_arena_bytes = hasattr(lib, "tlmrt_model_arena_bytes")
        if self.has_arena_bytes:
            self._sig(lib, "tlmrt_model_arena_bytes", ctypes.c_uint64, [pm])
        # API version 7 (ordering a CUDA model after a producer's stream, on the device); absent before it.
        self.has_wait_stream = hasattr(lib, "tlmrt_model_wait_stream")
        if self.has_wait_stream:
            self._sig(lib, "tlmrt_model_wait_stream", c_status, [pm, ctypes.c_void_p])
        self.lib = lib
        self.version = (lib.tlmrt_version() or b"").decode(errors="replace")

    @staticmethod
    def _sig(lib: ctypes.CDLL, name: str, restype: object, argtypes: list[object]) -> None:
        fn = getattr(lib, name)  # AttributeError if the library lacks the symbol
        fn.restype = restype
        fn.argtypes = argtypes

    def open_model(self, artifact_dir: Path, num_threads: int, verify_files: bool, device_type: int = DEVICE_CPU,
                   device_id: int = 0, use_cuda_graph: bool = True, name: Path | None = None) -> int:
        """tlmrt_model_open; returns the model handle (an address) or raises the typed error.

        name: the artifact as the user knows it, for messages (artifact_dir may be a private copy).
        """
        opts = Options()
        if self.has_v2:
            self.lib.tlmrt_options_init_sized(ctypes.byref(opts), ctypes.sizeof(Options))
            opts.device_type = device_type
            opts.device_id = device_id
            opts.use_cuda_graph = 1 if use_cuda_graph else 0
        else:
            if device_type != DEVICE_CPU:
                raise IncompatibleTargetError(
                    f"{self.path}: this C runtime (tlmrt {self.version}) has no CUDA backend; rebuild the artifact "
                    f"with a newer tlmpack, or load it with device='cpu'")
            self.lib.tlmrt_options_init(ctypes.byref(opts))  # fills the 12 bytes of API version 1
        opts.num_threads = num_threads
        opts.verify_files = 1 if verify_files else 0
        handle = ctypes.c_void_p()
        status = self.lib.tlmrt_model_open(os.fsencode(artifact_dir), ctypes.byref(opts), ctypes.byref(handle))
        if status != OK or not handle.value:
            # Thread-local in C, and ctypes calls run on this thread: read it right away.
            message = (self.lib.tlmrt_open_error() or b"").decode(errors="replace")
            message = message.replace(f"{os.fspath(artifact_dir)}/", "")  # the private copy's path means nothing
            raise status_error(status if status != OK else ERR_ARTIFACT, message,
                               f"{name or artifact_dir}: cannot open the model")
        return handle.value

    def batch_plans(self, handle: int) -> list[int]:
        """The batch size of each plan of a dynamic-batch model ([] for fixed shapes or an older runtime)."""
        if not self.has_batch:
            return []
        return [int(self.lib.tlmrt_model_batch_plan(handle, i))
                for i in range(self.lib.tlmrt_model_num_batch_plans(handle))]

    def arena_bytes(self, handle: int) -> int | None:
        """The activation arena bytes the model has allocated (None from a runtime before API version 6)."""
        return int(self.lib.tlmrt_model_arena_bytes(handle)) if self.has_arena_bytes else None

    def device_name(self, handle: int) -> str:
        if not self.has_v2:
            return "cpu"
        return (self.lib.tlmrt_model_device_name(handle) or b"").decode(errors="replace")

    def set_profiling(self, handle: int, enabled: bool) -> None:
        """Switches the C runtime's per-kernel timing on (counters zeroed) or off; call between runs."""
        if not self.has_profiling:
            raise IncompatibleTargetError(f"{self.path}: this C runtime (tlmrt {self.version}) has no profiler; "
                                          f"rebuild the artifact with a newer tlmpack")
        status = self.lib.tlmrt_model_set_profiling(handle, 1 if enabled else 0)
        if status != OK:
            raise status_error(status, self.last_error(handle), "cannot switch profiling")

    def profile(self, handle: int) -> ProfileReport:
        """The profiler's counters: run totals and every step's calls and nanoseconds, in run order."""
        total = Profile()
        status = self.lib.tlmrt_model_get_profile(handle, ctypes.byref(total))
        if status != OK:
            raise status_error(status, self.last_error(handle), "cannot read the profile")
        steps = []
        for i in range(total.num_steps):
            st = ProfileStep()
            status = self.lib.tlmrt_model_get_profile_step(handle, i, ctypes.byref(st))
            if status != OK:
                raise status_error(status, self.last_error(handle), f"cannot read step {i} of the profile")
            steps.append(StepTime(i, (st.kernel or b"").decode(errors="replace"),
                                  (st.task or b"").decode(errors="replace"), st.calls, st.total_ns,
                                  st.last_start_ns, st.last_ns))
        return ProfileReport(total.runs, total.run_ns, total.kernel_ns, total.io_ns, total.pool_launches,
                             total.pool_wait_ns, total.pool_wakes, tuple(steps))

    def last_error(self, handle: int) -> str:
        return (self.lib.tlmrt_model_last_error(handle) or b"").decode(errors="replace")

    def tensor_infos(self, handle: int, outputs: bool) -> list[TensorInfo]:
        """Every input's (or output's) tlmrt_tensor_info, names copied before the model can close."""
        count = (self.lib.tlmrt_model_num_outputs if outputs else self.lib.tlmrt_model_num_inputs)(handle)
        query = self.lib.tlmrt_model_output_info if outputs else self.lib.tlmrt_model_input_info
        infos = []
        for i in range(count):
            info = TensorInfo()
            status = query(handle, i, ctypes.byref(info))
            if status != OK:
                raise status_error(status, self.last_error(handle),
                                   f"cannot query {'output' if outputs else 'input'} {i} of the model")
            if not 0 <= info.ndim <= MAX_NDIM:
                raise ArtifactError(f"the C runtime reports ndim {info.ndim} for {'output' if outputs else 'input'} {i}")
            infos.append(info)
        return infos


_loaded: dict[Path, Library] = {}
_load_lock = threading.RLock()  # the kernel timer holds it around load_library()


def load_library() -> Library:
    """The C runtime installed with this package, or $TLMPACK_RUNTIME_LIB (for developing the C runtime)."""
    override = os.environ.get("TLMPACK_RUNTIME_LIB")
    if override:
        path, source = Path(override).expanduser(), f"TLMPACK_RUNTIME_LIB={override}"
    else:
        path, source = PACKAGE_LIB, str(PACKAGE_LIB)
    with _load_lock:
        if not path.is_file():
            raise IncompatibleTargetError(
                f"{source}: the tlmpack C runtime is not there; it is compiled when tlmpack is installed "
                f"(pip install tlmpack, or pip install -e . in a checkout)" if not override else
                f"{source}: no such file; expected a libtlmrt.so built by runtime_c/build.sh")
        real = path.resolve()
        if real in _loaded:
            return _loaded[real]
        try:
            lib = Library(real)
        except (OSError, AttributeError) as e:
            raise IncompatibleTargetError(f"{source}: cannot load it as the tlmpack C runtime ({e})") from e
        _loaded[real] = lib
        return lib
