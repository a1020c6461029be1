"""Partition: a Relax model → an ordered list of kernel calls over named tensors, deduplicated
tasks, the constants for weights.bin, and a static memory plan with liveness-based reuse.

Everything here but ``partition`` (which reads the TVM IRModule) is plain data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import LoweringError, UnsupportedOperatorError
from .relax_rewrites import PadPolicy, pad_awkward_extents, policy_for

X86_PAD_POLICY = policy_for(("x86",))  # what a plain fuse_to_tir pads to (AVX2 lanes)

ALIGNMENT = 64
# Relax ops kept out of LegalizeOps: they only change the shape, so the plan turns them into views.
VIEW_OPS = ("relax.reshape", "relax.squeeze", "relax.expand_dims", "relax.flatten")


@dataclass(frozen=True)
class Tensor:
    """One tensor of the plan. ``base`` is the tensor whose bytes a view reuses (itself otherwise)."""

    id: int
    name: str
    dtype: str
    shape: tuple[int, ...]
    storage: str  # "arena" | "weights"
    base: int
    offset: int = 0

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def to_json(self) -> dict:
        return {"id": self.id, "name": self.name, "dtype": self.dtype, "shape": list(self.shape),
                "storage": self.storage, "base": self.base, "offset": self.offset}


@dataclass(frozen=True)
class KernelCall:
    """One step of the plan: a task's kernel over tensor ids (its inputs, then its outputs)."""

    task: str
    args: tuple[int, ...]
    num_outputs: int

    def to_json(self) -> dict:
        return {"task": self.task, "args": list(self.args), "num_outputs": self.num_outputs}


@dataclass(frozen=True)
class Task:
    """A distinct fused subgraph; one kernel serves every call with the same structure."""

    id: str  # a C identifier, also the kernel's symbol
    name: str  # the fused function's name from TVM, e.g. fused_conv2d_add_relu
    structural_hash: str
    calls: int

    def to_json(self) -> dict:
        return {"id": self.id, "name": self.name, "structural_hash": self.structural_hash, "calls": self.calls}


class PendingWeights:
    """A graph's weights not yet copied into one blob: where each constant goes, and a view of its data
    in the Relax module (which must stay alive until then). A dynamic-batch build lowers every plan
    this way so that batch_graph.share_weights copies each constant once into the shared blob, not
    first into a blob per plan."""

    def __init__(self, size: int, chunks: list[tuple[int, np.ndarray]]) -> None:
        self.size = size
        self._chunks = dict(chunks)  # offset → contiguous array

    def __len__(self) -> int:
        return self.size

    def view(self, offset: int, nbytes: int) -> memoryview:
        """The bytes of the constant laid out at ``offset``."""
        data = memoryview(self._chunks[offset].reshape(-1).view(np.uint8))
        if len(data) != nbytes:
            raise ValueError(f"constant at weights offset {offset}: {len(data)} bytes, its tensor says {nbytes}")
        return data

    def write_into(self, blob) -> None:
        """Copies every constant to its offset in ``blob`` (at least ``size`` bytes)."""
        out = np.frombuffer(blob, np.uint8)
        for offset, array in self._chunks.items():
            out[offset:offset + array.nbytes] = array.reshape(-1).view(np.uint8)

    def materialized(self) -> memoryview:
        """The weights blob (weights_buffer: aligned) with every constant copied in."""
        blob = weights_buffer(self.size)
        self.write_into(blob)
        return blob


@dataclass
class Graph:
    tensors: list[Tensor]
    calls: list[KernelCall]
    tasks: list[Task]
    inputs: list[int]
    outputs: list[int]
    weights: bytes | memoryview | PendingWeights = b""  # partition's: a memoryview of weights_buffer (aligned)
    arena_bytes: int = 0
    task_funcs: dict[str, Any] = field(default_factory=dict, repr=False)  # task id → tvm PrimFunc
    padded_matmuls: int = 0  # matmuls computed over padded extents (relax_rewrites.py); last: callers pass the rest by position

    def memory_json(self) -> dict:
        arena_tensors = [t for t in self.tensors if t.storage == "arena" and t.base == t.id]
        return {"arena_bytes": self.arena_bytes, "weights_bytes": len(self.weights),
                "unplanned_bytes": sum(_aligned(t.nbytes) for t in arena_tensors)}


def _aligned(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def weights_buffer(size: int) -> memoryview:
    """``size`` zeroed, writable bytes starting on an ALIGNMENT boundary: a weights blob that TVM
    reads and writes in place (lower/prepack.py), so a model's weights are never copied to pass them."""
    raw = bytearray(size + ALIGNMENT)
    start = -np.frombuffer(raw, np.uint8).ctypes.data % ALIGNMENT
    return memoryview(raw)[start:start + size]


def host_array(tensor) -> np.ndarray:
    """A tvm runtime tensor's data as numpy, without copying it where DLPack allows."""
    try:
        return np.from_dlpack(tensor)
    except (BufferError, RuntimeError, TypeError):
        return tensor.numpy()


def has_conv2d(mod) -> bool:
    return "R.nn.conv2d(" in mod["main"].script()


def fuse_to_tir(mod, fast_math: bool = False, conv_layout: str | None = None, fold_constants: bool = True,
                pad_policy: PadPolicy | None = X86_PAD_POLICY, layout_ops: bool = True,
                conv_tile: tuple[int, int] = (0, 0), cores: int = 0, lanes: int = 16):
    """Runs Relax up to fused TIR: LegalizeOps (views kept), AnnotateTIROpPattern, FoldConstant,
    FuseOps, FuseTIR, then drops what became dead. ``fast_math`` swaps exact erf/exp/tanh for
    TVM's vectorisable approximations (exact erf is a scalar libm call per element on x86), sigmoid
    included (fast_sigmoid.py).
    ``conv_layout="NHWC"`` converts convolutions (and the ops between them) to channels-last, so a
    conv is a GEMM whose output channels are the contiguous, vectorised loop; the transposed
    weights fold into constants and transposes remain only at the model's edges. ``fold_constants``
    and ``pad_policy`` (relax_rewrites.pad_awkward_extents; None: no padding) are optional too, and
    so is ``layout_ops`` (layout_ops.py: with a conv layout, the importer's TIR calls for Pad and Clip
    become Relax ops first, so ConvertLayout leaves no transposes around them, and a transpose
    that only moves unit axes becomes a reshape, so a view): graph_fallbacks.py
    switches each off when TVM trips over it. ``conv_tile``: the register tile (pixels, channels)
    a channels-last convolution is widened for (conv_width.py; 0 pixels: none). ``cores`` and ``lanes``:
    the x86 target's, for which a global pool is split into enough parallel chunks (layout_ops.pool_parts;
    0 cores: by the map's size alone)."""
    import tvm
    from tvm import relax

    from .fast_sigmoid import sigmoid_through_exp_pass
    from .small_powers import small_powers_pass
    from .wide_gates import wide_gates_pass

    if pad_policy is not None:
        mod, _ = pad_awkward_extents(mod, pad_policy)
    rewrite_for_layout = bool(conv_layout and layout_ops)
    if rewrite_for_layout:
        from . import layout_ops as rewrites

        mod = rewrites.before_conversion(mod)  # a failure here is a LayoutRewriteError: its own fallback
    keep = {op: (lambda bb, call: call) for op in VIEW_OPS}
    if conv_layout == "NHWC":
        keep["relax.nn.conv2d"] = _conv2d_legalizer(*conv_tile)
    passes = tvm.ir.transform.Sequential([
        small_powers_pass(),  # x ** 3 as x * x * x: a scalar powf per element otherwise
        *([sigmoid_through_exp_pass(), relax.transform.FastMathTransform()]  # rewrite Relax ops: first
          if fast_math else []),
        relax.transform.LegalizeOps(customize_legalize_map=keep),
        relax.transform.AnnotateTIROpPattern(),
        *([relax.transform.FoldConstant()] if fold_constants else []),
        *([wide_gates_pass()] if rewrite_for_layout else []),  # before FuseOps: a large gate its own kernel
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        relax.transform.DeadCodeElimination(["main"]),
    ])
    try:
        if conv_layout:
            mod = relax.transform.ConvertLayout({"relax.nn.conv2d": [conv_layout, "OHWI"]})(mod)
    except Exception as e:
        raise LoweringError(f"Relax could not lower the model to TIR: {type(e).__name__}: {e}") from None
    if rewrite_for_layout:
        mod = rewrites.after_conversion(mod, cores, lanes)
    try:
        return passes(mod)
    except Exception as e:
        raise LoweringError(f"Relax could not lower the model to TIR: {type(e).__name__}: {e}") from None


def _conv2d_legalizer(conv_rows: int, conv_columns: int):
    """Channels-last convolutions legalized by tlmpack where TOPI has no kernel or a worse one: an
    NCHW input read in place (layout_ops.py), a wider output (conv_width.py); else TOPI's."""
    from tvm.relax.transform.legalize_ops.nn import _nn_conv2d

    from .conv_width import wide_conv_legalizer
    from .layout_ops import legalize_nchw_input_conv2d, reads_nchw_writes_nhwc

    widened = wide_conv_legalizer(conv_rows, conv_columns) if conv_rows > 1 else _nn_conv2d

    def legalize(bb, call):
        if reads_nchw_writes_nhwc(call):
            return legalize_nchw_input_conv2d(bb, call, conv_rows, conv_columns)
        return widened(bb, call)

    return legalize


def _c_identifier(text: str) -> str:
    return re.sub(r"[^0-9A-Za-z_]", "_", text)[:48]


class _Builder:
    """Walks Relax ``main`` once, collecting tensors, calls and tasks."""

    def __init__(self, mod, task_prefix: str = "k") -> None:
        self.mod = mod
        self.task_prefix = task_prefix
        self.tensors: list[Tensor] = []
        self.calls: list[KernelCall] = []
        self.values: dict[Any, Any] = {}  # relax Var → tensor id or tuple of them
        self.constant_ids: dict[Any, int] = {}
        self.weight_chunks: list[tuple[int, np.ndarray]] = []
        self.weights_size = 0
        self.tasks: dict[str, Task] = {}
        self.task_funcs: dict[str, Any] = {}
        self.task_of_gvar: dict[str, str] = {}
        self.hash_buckets: dict[int, list[str]] = {}

    def new_tensor(self, name: str, dtype: str, shape, storage: str = "arena", base: int | None = None,
                   offset: int = 0) -> int:
        tid = len(self.tensors)
        self.tensors.append(Tensor(tid, name, dtype, tuple(int(s) for s in shape), storage,
                                   tid if base is None else base, offset))
        return tid

    def constant(self, const) -> int:
        for known, tid in self.constant_ids.items():
            if known.same_as(const):
                return tid
        array = host_array(const.value)  # a view: the module holds the data until the blob has it
        offset = _aligned(self.weights_size)
        self.weight_chunks.append((offset, np.ascontiguousarray(array)))
        self.weights_size = offset + array.nbytes
        tid = self.new_tensor(f"const{len(self.constant_ids)}", str(array.dtype), array.shape, "weights",
                              offset=offset)
        self.constant_ids[const] = tid
        return tid

    def tensor_of(self, expr) -> int:
        import tvm
        from tvm import relax

        if isinstance(expr, tvm.ir.expr.Constant):
            return self.constant(expr)
        if isinstance(expr, relax.Var) and expr in self.values:
            value = self.values[expr]
            if isinstance(value, tuple):
                raise UnsupportedOperatorError("tuple", expr.name, "a tuple used where a tensor is expected")
            return value
        raise UnsupportedOperatorError(type(expr).__name__, str(expr)[:60], "not a tensor the plan can name")

    def task_for(self, gvar) -> str:
        import tvm_ffi

        name = gvar.name_hint
        if name in self.task_of_gvar:
            return self.task_of_gvar[name]
        func = self.mod[gvar]
        h = tvm_ffi.structural_hash(func)
        for task_id in self.hash_buckets.get(h, []):
            if tvm_ffi.structural_equal(self.task_funcs[task_id], func):
                self.task_of_gvar[name] = task_id
                return task_id
        task_id = f"{self.task_prefix}{len(self.tasks)}_{_c_identifier(name)}"
        self.tasks[task_id] = Task(task_id, name, f"{h & 0xFFFFFFFFFFFFFFFF:016x}", 0)
        self.task_funcs[task_id] = func
        self.hash_buckets.setdefault(h, []).append(task_id)
        self.task_of_gvar[name] = task_id
        return task_id

    def view(self, var, source: int) -> int:
        src = self.tensors[source]
        sinfo = var.ty
        shape = [int(d) for d in sinfo.shape.values]
        view = self.new_tensor(var.name, str(sinfo.dtype), shape, src.storage, base=src.base, offset=src.offset)
        if self.tensors[view].nbytes != src.nbytes:
            raise LoweringError(f"view {var.name}: {src.shape} → {tuple(shape)} changes the size")
        return view

    def bind(self, var, value) -> None:
        import tvm
        from tvm import relax

        if isinstance(value, relax.Call) and isinstance(value.op, tvm_op_type()):
            op = value.op.name
            if op == "relax.call_tir":
                self.values[var] = self.call_tir(var, value)
                return
            if op in VIEW_OPS:
                self.values[var] = self.view(var, self.tensor_of(value.args[0]))
                return
            raise UnsupportedOperatorError(op.removeprefix("relax."), var.name,
                                           "no TIR lowering for it (LegalizeOps left it in the graph)")
        if isinstance(value, relax.Var):
            self.values[var] = self.values[value]
        elif isinstance(value, tvm.ir.expr.Constant):
            self.values[var] = self.constant(value)
        elif isinstance(value, relax.TupleGetItem):
            self.values[var] = self.values[value.tuple_value][value.index]
        elif isinstance(value, relax.Tuple):
            self.values[var] = tuple(self.tuple_item(f) for f in value.fields)
        else:
            raise UnsupportedOperatorError(type(value).__name__, var.name, "not a kernel call or a view")

    def tuple_item(self, expr):
        from tvm import relax

        if isinstance(expr, relax.Tuple):
            return tuple(self.tuple_item(f) for f in expr.fields)
        if isinstance(expr, relax.Var) and isinstance(self.values.get(expr), tuple):
            return self.values[expr]
        return self.tensor_of(expr)

    def call_tir(self, var, call) -> Any:
        from tvm import relax

        if len(call.args) > 2:
            raise UnsupportedOperatorError("call_tir", var.name, "symbolic shape arguments are not supported")
        gvar, arg_tuple = call.args[0], call.args[1]
        args = [self.tensor_of(a) for a in arg_tuple.fields]
        out_sinfo = call.ty_args[0]
        leaves = list(out_sinfo.fields) if isinstance(out_sinfo, relax.TupleType) else [out_sinfo]
        outs = []
        for i, leaf in enumerate(leaves):
            try:
                shape = [int(d) for d in leaf.shape.values]
            except TypeError:
                raise LoweringError(f"{var.name}: dynamic output shape {leaf.shape}") from None
            outs.append(self.new_tensor(var.name if len(leaves) == 1 else f"{var.name}.{i}",
                                        str(leaf.dtype), shape))
        task_id = self.task_for(gvar)
        self.calls.append(KernelCall(task_id, tuple(args + outs), len(outs)))
        return outs[0] if not isinstance(out_sinfo, relax.TupleType) else tuple(outs)


def tvm_op_type():
    import tvm

    return tvm.ir.Op


def _flatten(value) -> list[int]:
    if isinstance(value, tuple):
        return [i for v in value for i in _flatten(v)]
    return [value]


def partition(mod, task_prefix: str = "k", materialize: bool = True) -> Graph:
    """Turns fused Relax ``main`` into a Graph (plain data) plus the TIR of each task. Task ids are
    ``<task_prefix><n>_<name>``: a second graph of the same model (another layout) uses another prefix.
    ``materialize=False`` leaves the weights as PendingWeights (views into ``mod``'s constants)."""
    from tvm import relax

    main = mod["main"]
    b = _Builder(mod, task_prefix)
    inputs = []
    for param in main.params:
        sinfo = param.ty
        if not isinstance(sinfo, relax.TensorType):
            raise UnsupportedOperatorError("input", param.name, "only tensor inputs are supported")
        tid = b.new_tensor(param.name, str(sinfo.dtype), [int(d) for d in sinfo.shape.values])
        b.values[param] = tid
        inputs.append(tid)
    body = main.body
    for block in body.blocks:
        for binding in block.bindings:
            if not isinstance(binding, relax.VarBinding):
                raise UnsupportedOperatorError("match_cast", binding.var.name, "dynamic shapes are not supported")
            b.bind(binding.var, binding.value)
    outputs = _flatten(b.tuple_item(body.body))
    for tid in outputs:
        if b.tensors[tid].storage != "arena":
            raise LoweringError(f"output {b.tensors[tid].name} is a constant of the model; tlmpack needs outputs computed from inputs")

    pending = PendingWeights(b.weights_size, b.weight_chunks)
    weights = pending.materialized() if materialize else pending
    counts: dict[str, int] = {}
    for c in b.calls:
        counts[c.task] = counts.get(c.task, 0) + 1
    tasks = [Task(t.id, t.name, t.structural_hash, counts.get(t.id, 0)) for t in b.tasks.values()]
    graph = Graph(b.tensors, b.calls, tasks, inputs, outputs, weights, task_funcs=b.task_funcs)
    plan_memory(graph)
    return graph


def plan_memory(graph: Graph) -> None:
    """Gives every arena tensor an offset. Tensors whose live ranges overlap never share bytes; a
    kernel's outputs are live at its step together with its inputs, so kernels never alias."""
    last_step = len(graph.calls)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for tid in graph.inputs:
        first[graph.tensors[tid].base] = -1
    for step, call in enumerate(graph.calls):
        for tid in call.args:
            base = graph.tensors[tid].base
            first.setdefault(base, step)
            last[base] = step
    for tid in graph.outputs:
        last[graph.tensors[tid].base] = last_step
    placed: list[tuple[int, int, int, int]] = []  # (offset, size, first, last)
    offsets: dict[int, int] = {}
    for base in sorted(first, key=lambda t: (first[t], t)):
        if graph.tensors[base].storage != "arena":
            continue
        size = _aligned(max(graph.tensors[base].nbytes, 1))
        start, end = first[base], last.get(base, first[base])
        busy = sorted((o, s) for o, s, lo, hi in placed if not (hi < start or lo > end))
        offset = 0
        for o, s in busy:
            if offset + size <= o:
                break
            offset = max(offset, o + s)
        placed.append((offset, size, start, end))
        offsets[base] = offset
    arena = max((o + s for o, s, _, _ in placed), default=0)
    graph.tensors = [
        t if t.storage != "arena" else Tensor(t.id, t.name, t.dtype, t.shape, t.storage, t.base, offsets.get(t.base, 0))
        for t in graph.tensors
    ]
    graph.arena_bytes = arena
