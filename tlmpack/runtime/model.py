"""`load()` and `Model`: an onnxruntime-like surface over the C runtime.

Feeds are validated here, in Python, so a mistake is reported with names and shapes instead of a
byte count from C; nothing is cast silently. Outputs are fresh numpy arrays every run: the caller
owns them, and the C runtime copies into them (it allocates nothing while running). A model on a
CUDA device also takes CUDA tensors (anything with __dlpack__ on the model's GPU: torch, cupy,
CudaArray) without a trip through the host, and can return its outputs as CudaArray objects that
torch.from_dlpack takes without a copy.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
import warnings
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tlmpack.runtime import _capi, _cuda
from tlmpack.runtime.dlpack import (
    KDL_CUDA,
    BufferPool,
    CudaArray,
    DeviceView,
    device_view,
    dlpack_device,
    torch_stream,
    torch_view,
)
from tlmpack.runtime.errors import (
    ArtifactError,
    IncompatibleTargetError,
    InputError,
    TlmpackError,
    TlmpackWarning,
)
from tlmpack.runtime.kernels import empty_aligned  # 64-byte aligned outputs are written in place
from tlmpack.runtime.preflight import DTYPES, Device, check, select_target, specs_of
from tlmpack.runtime.stage import private_copy

_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: its name, numpy dtype name ("float32") and shape. In a dynamic-batch
    model axis 0 is the string "batch" (symbolic); ``with_batch(b)`` gives the shape of one run."""

    name: str
    dtype: str
    shape: tuple[Any, ...]

    @functools.cached_property
    def nbytes(self) -> int:  # cached: every run asks for every input's and output's
        if self.is_dynamic:
            raise TypeError(f"{self.name}: shape {self.shape} has a symbolic batch; use with_batch(n).nbytes")
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @functools.cached_property
    def is_dynamic(self) -> bool:
        return any(isinstance(d, str) for d in self.shape)

    def with_batch(self, batch: int) -> TensorSpec:
        """The spec of a run of ``batch`` samples (itself when the shape is static)."""
        if not self.is_dynamic:
            return self
        return TensorSpec(self.name, self.dtype, (batch, *self.shape[1:]))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> TensorSpec:
        return TensorSpec(d["name"], d["dtype"], tuple(d["shape"]))


def load(path: str | os.PathLike[str], device: str = "auto", num_threads: int | None = None,
         use_cuda_graph: bool = True) -> Model:
    """Verifies an artifact (.tar or extracted folder), picks a target for `device`, and opens it.

    device: "auto" (the CUDA target on cuda:0 when the artifact has one and this machine can run it,
    else the CPU), "cpu", "cuda" (cuda:0) or "cuda:N".
    num_threads: CPU worker threads for parallel kernels; None uses every online core.
    use_cuda_graph: on CUDA, replay the kernel launches as one CUDA graph from the second run on.
    Every check that needs no code runs first, so a corrupted or foreign artifact is refused
    before anything from it is loaded. With "auto", a CUDA target that passes preflight but that
    the C runtime cannot open (say, PTX the driver cannot compile) falls back to the CPU with a
    TlmpackWarning.
    """
    if num_threads is not None and (not isinstance(num_threads, int) or isinstance(num_threads, bool)
                                    or num_threads < 1):
        raise ValueError(f"num_threads must be a positive integer or None; got {num_threads!r}")
    report = check(path, device, hash_files=False)  # what the model uses is hashed as it is opened
    report.raise_first()
    assert report.artifact_dir is not None and report.manifest is not None and report.target is not None
    dev = Device.parse(device)
    try:
        return Model(report.artifact_dir, report.manifest, report.target, dev, num_threads or 0, use_cuda_graph)
    except IncompatibleTargetError as e:
        if dev.kind != "auto" or report.target["kind"] != "cuda":
            raise
        try:
            cpu = select_target(report.manifest, Device("cpu"))
        except IncompatibleTargetError:
            raise e from None
        warnings.warn(f"{e}; running on the CPU instead", TlmpackWarning, stacklevel=2)
        return Model(report.artifact_dir, report.manifest, cpu, dev, num_threads or 0)


class Model:
    """A loaded artifact, ready to run. Not thread-safe in C, so runs on one Model are serialized.

    Use it as a context manager, or call close(); it is also closed when garbage-collected.
    `device` is "cpu" or "cuda:N"; `device_name` what the C runtime says it runs on.
    """

    def __init__(self, artifact_dir: Path, manifest: dict[str, Any], target: dict[str, Any],
                 device: Device, num_threads: int = 0, use_cuda_graph: bool = True) -> None:
        """Opens the model through the C runtime; use load(), which runs the preflight checks first."""
        self.path = Path(artifact_dir)
        self.manifest = manifest
        self.target = target
        self.is_cuda = target["kind"] == "cuda"
        self.device_index = device.index if self.is_cuda else 0
        self.device = f"cuda:{self.device_index}" if self.is_cuda else "cpu"
        self.inputs: list[TensorSpec] = [TensorSpec(*s) for s in specs_of(manifest, "inputs")]
        self.outputs: list[TensorSpec] = [TensorSpec(*s) for s in specs_of(manifest, "outputs")]
        # Dynamic batch: the plans' batch sizes, ascending (manifest "batch_plans"); [] for fixed shapes.
        self.batch_plans: list[int] = sorted(p["batch"] for p in manifest.get("batch_plans", []))
        # the cost of one run of each plan that decides how other batches run (runtime/batching.py):
        # the build's estimates, until calibrate_batch_plans() measures them
        self.batch_costs: dict[int, int] = {int(p["batch"]): int(p.get("cost", {}).get(target["kind"], 0))
                                            for p in manifest.get("batch_plans", [])}
        self._estimated_costs = dict(self.batch_costs)
        self._input_index = {s.name: i for i, s in enumerate(self.inputs)}
        self._output_index = {s.name: i for i, s in enumerate(self.outputs)}
        self._lock = threading.Lock()
        self._pool = BufferPool()  # dropped CUDA outputs' buffers, for the next run's outputs
        self._pool_finalizer = weakref.finalize(self, self._pool.close)
        # The C runtime opens a private copy of the bytes checked against the manifest, and verifies
        # them again itself (the weights only there, as it reads them).
        with private_copy(self.path, manifest, target) as private:
            self._lib = _capi.load_library()
            self._handle: int | None = self._lib.open_model(
                private, num_threads, verify_files=True,
                device_type=_capi.DEVICE_CUDA if self.is_cuda else _capi.DEVICE_CPU,
                device_id=self.device_index, use_cuda_graph=use_cuda_graph, name=self.path)
        self._finalizer = weakref.finalize(self, self._lib.lib.tlmrt_model_close, self._handle)
        try:
            self._check_against_plan()
        except BaseException:
            self.close()
            raise
        self._sized: dict[int, tuple] = {}  # batch → (inputs, outputs, input nbytes, output nbytes)
        self._in_nbytes, self._out_nbytes = self._for_batch(0)[2:]
        self._stream = (self._lib.lib.tlmrt_model_stream(self._handle) or None) if self.is_cuda else None
        # torch inputs read without DLPack need the C runtime's stream handover (API version 7)
        self._reads_torch = self.is_cuda and self._lib.has_wait_stream

    @property
    def device_name(self) -> str:
        """What the model runs on, e.g. "cuda:0 NVIDIA H200 sm_90 (cubin cuda/sm_90.cubin, driver 13.0, CUDA graph)"."""
        with self._lock:
            return self._lib.device_name(self._handle) if self._handle is not None else "closed"

    @property
    def arena_bytes(self) -> int | None:
        """Bytes of activation arena the C runtime has allocated for this model: one arena per run that has
        been in flight at once (host memory on the CPU, the device arena on CUDA). A dynamic-batch model on
        the CPU has one of its largest plan's size per run in flight, shared by its plans. None from a
        runtime older than API version 6."""
        with self._lock:
            self._check_open()
            return self._lib.arena_bytes(self._handle)

    def _check_against_plan(self) -> None:
        """The manifest (which users read) and the compiled plan (which runs) must describe the same tensors."""
        assert self._handle is not None
        for section, specs in (("input", self.inputs), ("output", self.outputs)):
            infos = self._lib.tensor_infos(self._handle, outputs=section == "output")
            if len(infos) != len(specs):
                raise ArtifactError(f"{self.path}: manifest.json lists {len(specs)} {section}s, the compiled plan has "
                                    f"{len(infos)}")
            if self.batch_plans and self._lib.batch_plans(self._handle) != self.batch_plans:
                raise ArtifactError(f"{self.path}: manifest.json lists the batch plans {self.batch_plans}, the C runtime "
                                    f"opened {self._lib.batch_plans(self._handle)}")
            for i, (spec, info) in enumerate(zip(specs, infos, strict=True)):
                name = (info.name or b"").decode(errors="replace")
                dtype = _DTYPE_NAMES.get((info.dtype_code, info.dtype_bits),
                                         f"(code {info.dtype_code}, {info.dtype_bits} bits)")
                # a dynamic batch: the plan says -1 for axis 0 and the bytes of one sample
                shape = tuple(spec.shape[0] if spec.is_dynamic and k == 0 and d == -1 else d
                              for k, d in enumerate(info.shape[: info.ndim]))
                if (name, dtype, shape, info.nbytes) != (spec.name, spec.dtype, spec.shape, spec.with_batch(1).nbytes):
                    raise ArtifactError(
                        f"{self.path}: manifest.json and the compiled plan disagree about {section} {i}: "
                        f"manifest says {spec.name!r} {spec.dtype} {spec.shape}, plan says {name!r} {dtype} {shape} "
                        f"({info.nbytes} bytes)")

    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [s.name for s in self.outputs]

    @property
    def closed(self) -> bool:
        return self._handle is None

    def close(self) -> None:
        """Frees the model's arena and unloads nothing else; safe to call twice."""
        with self._lock:
            if self._handle is not None:
                self._handle = None
                self._finalizer()
                self._pool_finalizer()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        name = self.manifest.get("model", {}).get("name", "?")
        state = "closed" if self.closed else f"target {self.target['id']} on {self.device}"
        return f"<tlmpack Model {name!r} {state} inputs={self.input_names} outputs={self.output_names}>"

    def run(self, output_names: Sequence[str] | None, feed: Mapping[str, Any], *,
            output_device: str = "cpu") -> list[Any]:
        """Runs once and returns the requested outputs in the order asked (all, in model order, for None).

        onnxruntime's InferenceSession.run semantics. `feed` maps every input name to a numpy array,
        anything with __dlpack__ (a CPU or CUDA torch tensor), or a Python scalar/list. Arrays must have
        the exact dtype and shape; Python scalars and lists, which have no dtype of their own, are
        converted to the input's dtype when that is a same-kind conversion (float -> float32, not
        float -> int32). A CUDA model reads CUDA tensors on its own GPU where they are (device to
        device; they must be C-contiguous); other tensors go through the host.
        output_device: "cpu" returns numpy arrays; "cuda" (a CUDA model only) returns CudaArray
        objects, fresh device buffers that torch.from_dlpack(a) takes without a copy.
        """
        if output_device not in ("cpu", "cuda", self.device):
            raise ValueError(f"output_device must be 'cpu' or 'cuda'; got {output_device!r}")
        to_device = output_device != "cpu"
        if to_device and not self.is_cuda:
            raise InputError(f"output_device={output_device!r}, but this model runs on {self.device}; "
                             f"load it with device='cuda' or ask for output_device='cpu'")
        wanted = self._output_indices(output_names)
        values = self._feed_values(feed)
        inputs, outputs, in_nbytes, out_nbytes = self._for_batch(self._batch_of(values))
        views = [self._device_input(spec, v) for spec, v in zip(inputs, values, strict=True)]
        arrays = [None if view is not None else _as_input_array(spec, v)
                  for spec, v, view in zip(inputs, values, views, strict=True)]
        if not to_device and all(v is None for v in views):
            outs: list[Any] = [empty_aligned(s.shape, s.dtype) for s in outputs]
            in_ptrs = (ctypes.c_void_p * len(arrays))(*(a.ctypes.data for a in arrays))
            out_ptrs = (ctypes.c_void_p * len(outs))(*(o.ctypes.data for o in outs))
            with self._lock:
                self._check_open()
                status = self._lib.lib.tlmrt_model_run(self._handle, in_ptrs, in_nbytes, out_ptrs, out_nbytes)
                self._raise_for(status)
            return [outs[i] for i in wanted]

        ins = (_capi.IO * len(inputs))()
        for i, (spec, arr, view) in enumerate(zip(inputs, arrays, views, strict=True)):
            if view is not None:
                ins[i] = _capi.IO(view.ptr, spec.nbytes, _capi.DEVICE_CUDA, self.device_index)
            else:
                ins[i] = _capi.IO(arr.ctypes.data, spec.nbytes, _capi.DEVICE_CPU, 0)
        asked = set(wanted)
        # a dynamic-batch model's outputs never stay in an arena: every one gets a buffer
        outs = [None if k not in asked and not self.batch_plans else self._new_cuda_array(s) if to_device
                else empty_aligned(s.shape, s.dtype) for k, s in enumerate(outputs)]
        out_io = (_capi.IO * len(outputs))()
        for k, (spec, o) in enumerate(zip(outputs, outs, strict=True)):
            if isinstance(o, CudaArray):
                out_io[k] = _capi.IO(o.data_ptr, spec.nbytes, _capi.DEVICE_CUDA, self.device_index)
            elif o is not None:
                out_io[k] = _capi.IO(o.ctypes.data, spec.nbytes, _capi.DEVICE_CPU, 0)
            else:
                out_io[k] = _capi.IO(None, 0, _capi.DEVICE_CPU, 0)  # not asked for: stays in the arena
        with self._lock:
            self._check_open()
            self._order_after_producers(views)
            status = self._lib.lib.tlmrt_model_run_io(self._handle, ins, out_io)
            self._raise_for(status)
        del views  # the producers' capsules (or tensors) stay alive until here
        return [outs[i] for i in wanted]

    def _order_after_producers(self, views: list[DeviceView | None]) -> None:
        """Orders the run after the device inputs' producers, on the device (under the lock). A torch tensor
        read without DLPack: after torch's current stream. A DLPack input ordered itself before the model's
        stream; a dynamic-batch model's other plans, which have streams of their own, wait for that one."""
        orderings = {v.ordering for v in views if v is not None}
        waits = []
        if "torch" in orderings:
            waits.append(torch_stream(self.device_index))
        if self.batch_plans and "dlpack" in orderings and self._lib.has_wait_stream:
            waits.append(self._stream)
        for stream in waits:
            self._raise_for(self._lib.lib.tlmrt_model_wait_stream(self._handle, stream))

    def calibrate_batch_plans(self, runs: int = 5) -> dict[int, int]:
        """Measures each batch plan and has the C runtime cover other batches by those times instead of
        the build's estimates from the plans' counted work. Plans run on zeros, one run of each in turn (after a
        warm-up), ``runs`` times; a plan's cost is its fastest run, since a busy machine only adds time.
        Returns the costs (nanoseconds per run of each plan). Where a small plan is no cheaper than a
        large one (a launch-bound model, a poorly scheduled size), this turns splits into padding."""
        import time

        if not self.batch_plans:
            raise InputError("calibrate_batch_plans: this model has fixed shapes (no batch plans)")
        self._set_batch_costs(self._estimated_costs)  # under the estimates, batch b runs plan b alone
        feeds = {b: {s.name: np.zeros(s.with_batch(b).shape, s.dtype) for s in self.inputs} for b in self.batch_plans}
        for feed in feeds.values():
            self.run(None, feed)
        best = dict.fromkeys(self.batch_plans, 2**62)
        for _ in range(max(1, runs)):
            for b, feed in feeds.items():
                t0 = time.perf_counter_ns()
                self.run(None, feed)
                best[b] = min(best[b], max(1, time.perf_counter_ns() - t0))
        self._set_batch_costs(best)
        return best

    def _set_batch_costs(self, costs: dict[int, int]) -> None:
        values = (ctypes.c_int64 * len(costs))(*(costs[b] for b in self.batch_plans))
        with self._lock:
            self._check_open()
            self._raise_for(self._lib.lib.tlmrt_model_set_batch_costs(self._handle, len(costs), values))
        self.batch_costs = dict(costs)

    def _for_batch(self, batch: int) -> tuple:
        """The concrete specs and C size arrays of a run of ``batch`` samples (0: fixed shapes)."""
        if batch not in self._sized:
            ins = [s.with_batch(batch) for s in self.inputs]
            outs = [s.with_batch(batch) for s in self.outputs]
            self._sized[batch] = (ins, outs, (ctypes.c_uint64 * len(ins))(*(s.nbytes for s in ins)),
                                  (ctypes.c_uint64 * len(outs))(*(s.nbytes for s in outs)))
        return self._sized[batch]

    def _batch_of(self, values: list[Any]) -> int:
        """The batch of a run: axis 0 of the first input (0 for a model of fixed shapes). Every input is
        then checked against the specs of that batch; one outside the plans' range is an InputError."""
        if not self.batch_plans:
            return 0
        spec, value = self.inputs[0], values[0]
        shape = getattr(value, "shape", None)
        shape = tuple(shape) if shape is not None else np.shape(value)
        largest = self.batch_plans[-1]
        if len(shape) != len(spec.shape) or not 1 <= int(shape[0]) <= largest:
            pretty = "(" + ", ".join(str(d) for d in spec.shape) + ")"
            raise InputError(f"input {spec.name!r}: expected shape {pretty} with batch in 1..{largest}, "
                             f"got {tuple(int(d) for d in shape)}")
        return int(shape[0])

    def run_dlpack(self, output_names: Sequence[str] | None, feed: Mapping[str, Any]) -> list[CudaArray]:
        """run(..., output_device="cuda"): every requested output as a CudaArray on the model's GPU."""
        return self.run(output_names, feed, output_device="cuda")

    def to_device(self, value: Any) -> CudaArray:
        """A copy of a host array (numpy, or anything np.asarray takes) on this model's GPU."""
        if not self.is_cuda:
            raise InputError(f"to_device: this model runs on {self.device}, not on a GPU")
        arr = np.ascontiguousarray(np.asarray(value))
        if arr.dtype.name not in DTYPES:
            raise InputError(f"to_device: dtype {arr.dtype.name} is not one the runtime handles ({', '.join(DTYPES)})")
        out = self._new_cuda_array(TensorSpec("", arr.dtype.name, tuple(arr.shape)))
        _cuda.copy_to_device(self.device_index, out.data_ptr, arr.ctypes.data, arr.nbytes)
        return out

    def _new_cuda_array(self, spec: TensorSpec) -> CudaArray:
        kept = self._pool.take(spec.dtype, spec.shape)
        if kept is not None:
            return CudaArray(kept[0], kept[1], spec.shape, spec.dtype, self.device_index, self._pool)
        code, bits = DTYPES[spec.dtype]
        shape = (ctypes.c_int64 * max(1, len(spec.shape)))(*spec.shape)
        managed, data = ctypes.c_void_p(), ctypes.c_void_p()
        status = self._lib.lib.tlmrt_dlpack_alloc_cuda(self.device_index, code, bits, len(spec.shape), shape,
                                                       ctypes.byref(managed), ctypes.byref(data))
        if status != _capi.OK or not managed.value:
            message = (self._lib.lib.tlmrt_open_error() or b"").decode(errors="replace")
            raise _capi.status_error(status if status != _capi.OK else _capi.ERR_OUT_OF_MEMORY, message,
                                     f"allocating {spec.dtype} {spec.shape} on {self.device}")
        return CudaArray(managed.value, data.value or 0, spec.shape, spec.dtype, self.device_index, self._pool)

    def _device_input(self, spec: TensorSpec, value: Any) -> DeviceView | None:
        """The CUDA memory of a feed value on this model's GPU, checked like a host array; None for host values."""
        view = torch_view(value) if self._reads_torch else None
        if view is None:
            view = self._dlpack_input(spec, value)
            if view is None:
                return None
        if view.device_id != self.device_index:
            raise InputError(f"input {spec.name!r}: a tensor on cuda:{view.device_id}, but this model runs on "
                             f"{self.device}; move it to {self.device} first")
        if view.dtype != spec.dtype:
            raise InputError(f"input {spec.name!r}: expected dtype {spec.dtype}, got {view.dtype}")
        if view.shape != spec.shape:
            raise InputError(f"input {spec.name!r}: expected shape {spec.shape}, got {view.shape}")
        if not view.contiguous:
            raise InputError(f"input {spec.name!r}: a non-contiguous CUDA tensor; pass a C-contiguous one "
                             f"(e.g. tensor.contiguous())")
        return view

    def _dlpack_input(self, spec: TensorSpec, value: Any) -> DeviceView | None:
        """A device feed value read through its DLPack capsule, ordered before the model's stream; None
        for host values."""
        dev = dlpack_device(value)
        if dev is None or dev[0] != KDL_CUDA:
            return None
        if not self.is_cuda:
            raise InputError(f"input {spec.name!r}: a tensor on cuda:{dev[1]}, but this model runs on the CPU; "
                             f"pass host memory (e.g. tensor.cpu()) or load the model with device='cuda'")
        if dev[1] != self.device_index:
            raise InputError(f"input {spec.name!r}: a tensor on cuda:{dev[1]}, but this model runs on {self.device}; "
                             f"move it to {self.device} first")
        try:
            return device_view(value, self._stream)
        except (TypeError, ValueError, RuntimeError, BufferError) as e:
            raise InputError(f"input {spec.name!r}: cannot read the {type(value).__name__} through DLPack ({e})") from e

    def _check_open(self) -> None:
        if self._handle is None:
            raise TlmpackError("this model is closed; load it again to run it")

    def _raise_for(self, status: int) -> None:
        if status != _capi.OK:
            raise _capi.status_error(status, self._lib.last_error(self._handle),
                                     f"running {self.manifest.get('model', {}).get('name', 'the model')}")

    def __call__(self, feed: Mapping[str, Any] | None = None, /, **named: Any) -> list[np.ndarray]:
        """model(x=..., y=...) or model({"x": ...}): every output, as a list in model order (like run(None, ...)).

        Always a list, even with one output, so code does not change shape with the model.
        """
        if feed is not None and not isinstance(feed, Mapping):
            raise InputError(f"pass inputs by name: model(**feed) or model(feed) with feed a dict; got a "
                             f"{type(feed).__name__} (inputs: {', '.join(self.input_names)})")
        merged = dict(feed or {})
        for k, v in named.items():
            if k in merged:
                raise InputError(f"input {k!r} given twice (in the dict and as a keyword)")
            merged[k] = v
        return self.run(None, merged)

    def _output_indices(self, output_names: Sequence[str] | None) -> list[int]:
        if output_names is None:
            return list(range(len(self.outputs)))
        if isinstance(output_names, str):
            raise InputError(f"output_names must be a list of names, not the string {output_names!r}; "
                             f"use [{output_names!r}]")
        indices = []
        for n in output_names:
            if n not in self._output_index:
                raise InputError(f"unknown output {n!r}; this model's outputs are: {', '.join(self.output_names)}")
            indices.append(self._output_index[n])
        return indices

    def _feed_values(self, feed: Mapping[str, Any]) -> list[Any]:
        """The feed's value for every input, in model order, after checking the names."""
        if not isinstance(feed, Mapping):
            raise InputError(f"feed must be a dict of input name -> array; got {type(feed).__name__}")
        expected = ", ".join(self.input_names) or "(none)"
        for name in feed:
            if name not in self._input_index:
                raise InputError(f"unknown input {name!r}; this model's inputs are: {expected}")
        missing = [s.name for s in self.inputs if s.name not in feed]
        if missing:
            raise InputError(f"missing input{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}; "
                             f"this model's inputs are: {expected}")
        return [feed[spec.name] for spec in self.inputs]


def _as_input_array(spec: TensorSpec, value: Any) -> np.ndarray:
    """Converts one feed value to a C-contiguous array of exactly spec's dtype and shape, or raises InputError."""
    want = np.dtype(spec.dtype)
    if isinstance(value, np.ndarray):
        arr = value
    elif hasattr(value, "__dlpack__"):
        try:
            arr = np.from_dlpack(value)
        except (TypeError, ValueError, RuntimeError, BufferError) as e:
            raise InputError(f"input {spec.name!r}: cannot read the {type(value).__name__} through DLPack ({e}); "
                             f"pass a CPU tensor or a numpy array") from e
    elif hasattr(value, "dtype"):  # numpy scalars and array-likes that carry their own dtype
        arr = np.asarray(value)
    else:
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError) as e:
            raise InputError(f"input {spec.name!r}: cannot convert a {type(value).__name__} to an array ({e})") from e
        # A Python scalar or list has no dtype of its own: give it the input's, when no meaning is lost in kind.
        if arr.dtype != want and np.can_cast(arr.dtype, want, casting="same_kind"):
            try:
                arr = np.asarray(value, dtype=want)  # numpy refuses Python ints out of the dtype's range
            except OverflowError as e:
                raise InputError(f"input {spec.name!r}: a value does not fit in {spec.dtype} ({e})") from e
    if arr.dtype != want:
        raise InputError(f"input {spec.name!r}: expected dtype {spec.dtype}, got {_dtype_str(arr.dtype)}")
    if tuple(arr.shape) != spec.shape:
        raise InputError(f"input {spec.name!r}: expected shape {spec.shape}, got {tuple(arr.shape)}")
    return np.ascontiguousarray(arr)


def _dtype_str(dt: np.dtype) -> str:
    """numpy's name for a dtype, with byte order when it is not native (">f4" would otherwise read "float32")."""
    if dt.byteorder not in ("=", "|") and dt.newbyteorder("=") != dt:
        return f"{dt.name} ({'big' if dt.byteorder == '>' else 'little'}-endian)"
    return dt.name
