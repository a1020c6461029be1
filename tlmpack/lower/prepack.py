"""Weight pre-packing for x86: a kernel reads its constant operand in the tiled order its loops
walk, so the weights are rearranged once, at build time, not on every call.

MetaSchedule's RewriteLayout postprocessor (x86) does the analysis: on a PrimFunc whose weight
parameter is marked ``layout_free_buffers``, it adds a preproc block (annotated
``meta_schedule.layout_rewrite_preproc``) that copies the weight into the tiled layout, and
indexes the packed buffer in the kernel. Relax's SplitLayoutRewritePreproc splits that block into
its own function; we compile it for the build host and run it on every constant the task's calls
pass there. The packed tensor has the same elements in another order (perfect tiles: no padding).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import LoweringError
from ..graph import Graph, host_array

PREPROC_ANNOTATION = "meta_schedule.layout_rewrite_preproc"


def weight_operand_params(graph: Graph, task_id: str, func, operand_buffers: tuple[str, ...]) -> list[int]:
    """Parameter indices of ``func`` that are a multiply-accumulate operand (named in
    ``operand_buffers``) and receive a constant (weights storage) in every call of the task."""
    calls = [c for c in graph.calls if c.task == task_id]
    names = [p.name for p in func.params]
    found = []
    for index, name in enumerate(names):
        if name not in operand_buffers:
            continue
        if calls and all(graph.tensors[graph.tensors[c.args[index]].base].storage == "weights" for c in calls):
            found.append(index)
    return found


def has_preproc(func) -> bool:
    return PREPROC_ANNOTATION in func.script()


@dataclass
class SplitKernel:
    """A scheduled task split into the kernel that reads the packed weight and the packer."""

    kernel: Any  # PrimFunc: same parameters, the packed one in the packed shape
    prepack: Any  # PrimFunc (weight, packed weight)
    param: int  # which parameter is packed
    packed_shape: tuple[int, ...]
    dtype: str


def split_prepack(scheduled, arg_types: list[tuple[tuple[int, ...], str]], num_outputs: int,
                  param: int) -> SplitKernel | None:
    """Splits the layout-rewrite block off ``scheduled`` (a replayed PrimFunc); None when
    RewriteLayout did not rewrite anything (the kernel then reads the plain weight)."""
    from tvm import relax

    if not has_preproc(scheduled):
        return None
    inputs = arg_types[:len(arg_types) - num_outputs]
    outputs = arg_types[len(arg_types) - num_outputs:]
    builder = relax.BlockBuilder()
    params = [relax.Var(f"a{i}", relax.TensorType(shape, dtype)) for i, (shape, dtype) in enumerate(inputs)]
    with builder.function("main", params):
        with builder.dataflow():
            kernel_var = builder.add_func(scheduled.without_attr("global_symbol"), "k")
            out_type = ([relax.TensorType(s, d) for s, d in outputs] if num_outputs > 1
                        else relax.TensorType(*outputs[0]))
            result = builder.emit_output(builder.emit(relax.call_tir(kernel_var, params, out_type)))
        builder.emit_func_output(result)
    split = relax.transform.SplitLayoutRewritePreproc()(builder.get())
    functions = {gv.name_hint: fn for gv, fn in split.functions.items()}
    kernel, prepack = functions.get("k_prepacked"), functions.get("k_weight_prepack")
    if kernel is None or prepack is None:
        return None
    if len(prepack.params) != 2:  # one packed weight per task: more would need a tuple-aware plan
        raise LoweringError(f"layout rewrite packed {len(prepack.params) - 1} buffers; expected 1")
    packed_shape = None
    for block in split["main"].body.blocks:
        for binding in block.bindings:
            callee = getattr(binding.value, "args", [None])[0]
            if getattr(callee, "name_hint", "") == "k_weight_prepack":
                packed_shape = tuple(int(d) for d in binding.var.ty.shape)
    if packed_shape is None:
        raise LoweringError("layout rewrite: the split module has no call of the prepack function")
    return SplitKernel(kernel, prepack, param, packed_shape, arg_types[param][1])


def func_arg_types(func) -> list[tuple[tuple[int, ...], str]]:
    """(shape, dtype) of every parameter of a PrimFunc, in order: what split_prepack needs where
    no graph is at hand (the dataset's timer, --tune)."""
    return [(tuple(int(d) for d in p.shape), str(p.dtype)) for p in func.params]


def kernel_as_built(scheduled, num_outputs: int, param: int, weight: np.ndarray, packer: Packer):
    """(the kernel a build runs for ``scheduled``, a PrimFunc of the space with ``param`` marked
    layout-free, and the packed weight it reads), or (``scheduled``, None) where RewriteLayout
    packed nothing. What the dataset's timer and --tune time: the build's kernel, not the plain one."""
    split = split_prepack(scheduled, func_arg_types(scheduled), num_outputs, param)
    if split is None:
        return scheduled, None
    return split.kernel, packer.pack(split, weight)


class Packer:
    """Compiles prepack functions for the build host and runs them on constants."""

    def __init__(self) -> None:
        import tvm

        self._target = tvm.target.Target({"kind": "llvm"})
        self._cache: dict[int, list[tuple[Any, Any]]] = {}

    def _compiled(self, prepack):
        """The packer's executable; structurally equal packers (programs with one tiling) share one."""
        import tvm
        import tvm_ffi

        bucket = self._cache.setdefault(tvm_ffi.structural_hash(prepack), [])
        for func, executable in bucket:
            if tvm_ffi.structural_equal(func, prepack):
                return executable
        executable = tvm.compile(tvm.IRModule({"main": prepack.with_attr("global_symbol", "main")}),
                                 target=self._target)
        bucket.append((prepack, executable))
        return executable

    def pack(self, split: SplitKernel, weight: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``weight`` packed into ``out`` (a new array if None), which is returned. TVM reads and
        writes both in place when they are 64-byte aligned (graph.weights_buffer's are)."""
        import tvm

        compiled = self._compiled(split.prepack)
        if out is None:
            out = np.empty(split.packed_shape, dtype=weight.dtype)
        source, target = _in_place(weight), _in_place(out)
        if source is None:
            source = tvm.runtime.tensor(np.ascontiguousarray(weight))
        packed = target if target is not None else tvm.runtime.empty(out.shape, str(out.dtype))
        compiled["main"](source, packed)
        if target is None:
            out[...] = host_array(packed)
        return out


def _in_place(array: np.ndarray):
    """``array`` as a tvm tensor over the same memory, or None where TVM cannot take it (unaligned,
    read-only, empty)."""
    import tvm

    if array.size and array.flags.c_contiguous and array.flags.writeable and array.ctypes.data % 64 == 0:
        return tvm.runtime.from_dlpack(array)
    return None
