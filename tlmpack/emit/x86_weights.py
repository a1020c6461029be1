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


def pack_graph(graph: Graph, splits: dict, pack: Callable[..., np.ndarray]) -> Graph:
    """A copy of ``graph`` whose packed tasks read packed constants. ``splits``: task id →
    lower.prepack.SplitKernel; ``pack(split, weight, out)`` runs the split's prepack function on
    ``weight`` (a view of ``graph.weights``) into ``out`` (a view of the new blob): nothing but the
    two blobs is held, whatever the weights' size."""
    if not splits:
        return graph
    tensors = list(graph.tensors)
    packed_from: dict[int, tuple[object, Tensor]] = {}  # packed tensor id → (split, the constant it packs)
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

    def fill(tid: int, out: np.ndarray) -> None:
        split, source = packed_from[tid]
        weight = np.frombuffer(graph.weights, dtype=source.dtype, count=int(np.prod(source.shape, dtype=np.int64)),
                               offset=source.offset).reshape(source.shape)
        pack(split, weight, out)

    return _compact(graph, tensors, calls, set(packed_from), fill)


def _compact(graph: Graph, tensors: list[Tensor], calls: list[KernelCall], packed: set[int],
             fill: Callable[[int, np.ndarray], None]) -> Graph:
    """Drops the constants no call reads any more, renumbers tensors, lays out the new blob:
    the kept constants copied from the old one, the ``packed`` ones written in place by ``fill``."""
    used = {t for c in calls for t in c.args} | set(graph.inputs) | set(graph.outputs)
    used |= {tensors[t].base for t in used}
    keep = [t for t in tensors if t.storage == "arena" or t.id in used]
    new_id = {t.id: i for i, t in enumerate(keep)}
    offsets: dict[int, int] = {}
    size = 0
    for t in keep:
        if t.storage == "weights" and t.base == t.id:
            offsets[t.id] = _aligned(size)
            size = offsets[t.id] + t.nbytes
    blob = weights_buffer(size)
    old = memoryview(graph.weights)
    for t in keep:
        if t.id not in offsets:
            continue
        if t.id in packed:
            fill(t.id, np.frombuffer(blob, dtype=t.dtype, count=int(np.prod(t.shape, dtype=np.int64)),
                                     offset=offsets[t.id]).reshape(t.shape))
        else:
            blob[offsets[t.id]:offsets[t.id] + t.nbytes] = old[t.offset:t.offset + t.nbytes]
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
