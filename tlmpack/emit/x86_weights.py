"""The x86 plan's own view of the graph when some of its kernels read pre-packed weights.

Every call of a packed task reads a packed copy of its constant (one copy per constant and
task); the weights blob is laid out again with only the constants the x86 kernels read, so a
weight that only packed kernels use is not loaded twice. The CUDA plan keeps the original graph.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from ..graph import ALIGNMENT, Graph, KernelCall, Tensor, weights_buffer


def _aligned(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def pack_graphs(graphs: dict[int, Graph], splits: dict, pack: Callable[..., np.ndarray]) -> dict[int, Graph]:
    """Copies of the plans (a fixed build's one, or a dynamic batch's) whose packed tasks read packed
    constants, over one new blob. ``splits``: task id → lower.prepack.SplitKernel; ``pack(split,
    weight, out)`` runs the split's prepack function on ``weight`` (a view of the plain blob) into
    ``out`` (a view of the new one). The plans share one plain blob (batch_graph.share_weights), so a
    constant is known by its offset there: one that several plans read, plain or packed the same way
    (the same packing function into the same shape), is laid out and packed once. Nothing but the
    plain blob and the new one is held, whatever the weights' size."""
    if not splits:
        return graphs
    plain = next(iter(graphs.values())).weights
    if any(g.weights is not plain for g in graphs.values()):
        raise ValueError("pack_graphs: the plans must share one weights blob (batch_graph.share_weights)")
    slots: dict[tuple, int] = {}  # (plain offset, packing or None) → offset in the new blob
    fills: list[tuple[int, Tensor, object, Tensor]] = []  # (new offset, tensor, split or None, its source)
    size = 0
    laid_out = {}
    for b in sorted(graphs):
        graph = graphs[b]
        tensors, calls, packed_from = _packed_calls(graph, splits)
        keep = _kept(graph, tensors, calls)
        offsets: dict[int, int] = {}
        for t in keep:
            if t.storage == "weights" and t.base == t.id:
                split, source = packed_from.get(t.id, (None, t))
                key = (source.offset, _packing(split))
                if key not in slots:
                    slots[key] = _aligned(size)
                    size = slots[key] + t.nbytes
                    fills.append((slots[key], t, split, source))
                offsets[t.id] = slots[key]
        laid_out[b] = (graph, keep, calls, offsets)
    blob = weights_buffer(size)
    old = memoryview(plain).cast("B")
    for offset, t, split, source in fills:
        if split is None:
            blob[offset:offset + t.nbytes] = old[source.offset:source.offset + source.nbytes]
            continue
        weight = np.frombuffer(plain, dtype=source.dtype, count=int(np.prod(source.shape, dtype=np.int64)),
                               offset=source.offset).reshape(source.shape)
        pack(split, weight, np.frombuffer(blob, dtype=t.dtype, count=int(np.prod(t.shape, dtype=np.int64)),
                                          offset=offset).reshape(t.shape))
    return {b: _renumbered(graph, keep, calls, offsets, blob) for b, (graph, keep, calls, offsets) in laid_out.items()}


def _packing(split) -> tuple | None:
    """What makes two packed copies of one constant the same bytes: the packing function (its body, not
    its name) and the packed shape; None for a constant read plain."""
    if split is None:
        return None
    import tvm_ffi

    func = split.prepack.without_attr("global_symbol") if split.prepack.attrs else split.prepack
    return (tvm_ffi.structural_hash(func), tuple(split.packed_shape), split.dtype)


def _packed_calls(graph: Graph, splits: dict) -> tuple[list[Tensor], list[KernelCall], dict[int, tuple]]:
    """The graph's tensors with a packed copy of each constant a packed task reads (one per constant
    and task), the calls rewired to them, and packed tensor id → (split, the constant it packs)."""
    tensors = list(graph.tensors)
    packed_from: dict[int, tuple[object, Tensor]] = {}
    packed_of: dict[tuple[int, str], int] = {}
    calls = []
    for call in graph.calls:
        split = splits.get(call.task)
        if split is None:
            calls.append(call)
            continue
        args = list(call.args)
        source = tensors[args[split.param]]
        key = (source.id, call.task)
        if key not in packed_of:
            tid = len(tensors)
            tensors.append(Tensor(tid, f"{source.name}.packed", source.dtype, tuple(split.packed_shape), "weights", tid))
            packed_from[tid] = (split, source)
            packed_of[key] = tid
        args[split.param] = packed_of[key]
        calls.append(KernelCall(call.task, tuple(args), call.num_outputs))
    return tensors, calls, packed_from


def _kept(graph: Graph, tensors: list[Tensor], calls: list[KernelCall]) -> list[Tensor]:
    """The tensors a plan still needs: the arena's, and the constants some call (or the plan's edges) reads."""
    used = {t for c in calls for t in c.args} | set(graph.inputs) | set(graph.outputs)
    used |= {tensors[t].base for t in used}
    return [t for t in tensors if t.storage == "arena" or t.id in used]


def _renumbered(graph: Graph, keep: list[Tensor], calls: list[KernelCall], offsets: dict[int, int],
                blob) -> Graph:
    new_id = {t.id: i for i, t in enumerate(keep)}
    renumbered = [
        dataclasses.replace(t, id=new_id[t.id], base=new_id[t.base],
                            offset=offsets[t.base] if t.storage == "weights" else t.offset)
        for t in keep
    ]
    return dataclasses.replace(
        graph, tensors=renumbered,
        calls=[KernelCall(c.task, tuple(new_id[a] for a in c.args), c.num_outputs) for c in calls],
        inputs=[new_id[t] for t in graph.inputs], outputs=[new_id[t] for t in graph.outputs],
        weights=blob)
