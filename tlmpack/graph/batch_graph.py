"""Batch plans as one compilation: the Graphs of one model at several batch sizes.

Each batch size has its own Graph (partition.py: calls, tensors, memory plan). Here their tasks are
deduplicated across the plans by structure (a task that does not depend on the batch is scheduled
and compiled once), the schedulers get one union Graph over every plan's tasks, and the plans'
constants are laid out once in a shared weights blob (constants with the same bytes share them,
so unpacked weights are stored once; a constant packed differently for two plans' kernels has
one copy per layout).
"""

from __future__ import annotations

import dataclasses
import hashlib

from .partition import ALIGNMENT, Graph, KernelCall, Task, Tensor


def _aligned(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def _renamed(graph: Graph, new_id: dict[str, str]) -> Graph:
    tasks, seen = [], set()
    for t in graph.tasks:
        tid = new_id[t.id]
        if tid not in seen:
            seen.add(tid)
            tasks.append(dataclasses.replace(t, id=tid))
    return dataclasses.replace(
        graph, tasks=tasks,
        calls=[KernelCall(new_id[c.task], c.args, c.num_outputs) for c in graph.calls],
        task_funcs={new_id[k]: f for k, f in graph.task_funcs.items()})


def merge_tasks(graphs: dict[int, Graph]) -> tuple[Graph, dict[int, Graph]]:
    """Renames every plan's tasks so that structurally equal ones share one id (the first plan's),
    and returns the union Graph the schedulers and kernel builders take (every distinct task once;
    its tensors and calls are the plans' side by side, so each task's arguments are there) and the
    renamed per-batch Graphs."""
    import tvm_ffi

    buckets: dict[str, list[tuple[str, object]]] = {}  # structural hash → (task id, func)
    renamed: dict[int, Graph] = {}
    for batch in sorted(graphs):
        graph = graphs[batch]
        new_id = {}
        for task in graph.tasks:
            func = graph.task_funcs[task.id]
            match = next((tid for tid, f in buckets.get(task.structural_hash, [])
                          if tvm_ffi.structural_equal(f, func)), None)
            if match is None:
                buckets.setdefault(task.structural_hash, []).append((task.id, func))
                match = task.id
            new_id[task.id] = match
        renamed[batch] = _renamed(graph, new_id)
    tensors: list[Tensor] = []
    calls: list[KernelCall] = []
    tasks: dict[str, Task] = {}
    funcs: dict[str, object] = {}
    for batch in sorted(renamed):
        graph = renamed[batch]
        base = len(tensors)
        tensors += [dataclasses.replace(t, id=t.id + base, base=t.base + base) for t in graph.tensors]
        calls += [KernelCall(c.task, tuple(a + base for a in c.args), c.num_outputs) for c in graph.calls]
        for t in graph.tasks:
            if t.id not in tasks:
                tasks[t.id] = t
                funcs[t.id] = graph.task_funcs[t.id]
    counts: dict[str, int] = {}
    for c in calls:
        counts[c.task] = counts.get(c.task, 0) + 1
    union = Graph(tensors, calls, [dataclasses.replace(t, calls=counts[t.id]) for t in tasks.values()],
                  [], [], b"", arena_bytes=max(g.arena_bytes for g in graphs.values()), task_funcs=funcs,
                  padded_matmuls=max(g.padded_matmuls for g in graphs.values()))
    return union, renamed


def share_weights(graphs: dict[int, Graph]) -> tuple[bytes | memoryview, dict[int, Graph]]:
    """One weights blob for every plan: each distinct constant (by its bytes and dtype) once, in the
    order the plans first use them. The first plan's blob is the start of it, its offsets unchanged:
    when the other plans add no constant of their own (a batch size changes no weight), it is the
    shared blob itself, and nothing is copied; otherwise one blob is allocated and each new constant
    copied into it once (64-byte aligned); plans lowered with PendingWeights (graph.partition's
    materialize=False) are copied from their modules straight into it. Returns the blob and the plans
    with their offsets rewritten."""
    from .partition import PendingWeights, weights_buffer

    def constant(graph: Graph, t: Tensor) -> memoryview:
        if isinstance(graph.weights, PendingWeights):
            return graph.weights.view(t.offset, t.nbytes)
        return memoryview(graph.weights).cast("B")[t.offset:t.offset + t.nbytes]

    order = sorted(graphs)
    first = graphs[order[0]]
    offsets: dict[tuple[str, str], int] = {}
    new: list[tuple[int, Graph, Tensor]] = []  # (offset in the shared blob, plan, constant) to copy
    size = len(first.weights)
    where: dict[int, dict[int, int]] = {}
    for batch in order:
        graph = graphs[batch]
        where[batch] = {}
        for t in graph.tensors:
            if t.storage != "weights" or t.base != t.id:
                continue
            key = (t.dtype, hashlib.sha256(constant(graph, t)).hexdigest())
            if key not in offsets:
                if graph is first:
                    offsets[key] = t.offset
                else:
                    offsets[key] = _aligned(size)
                    size = offsets[key] + t.nbytes
                    new.append((offsets[key], graph, t))
            where[batch][t.id] = t.offset if graph is first else offsets[key]
    if new or isinstance(first.weights, PendingWeights):
        blob = weights_buffer(size)
        if isinstance(first.weights, PendingWeights):
            first.weights.write_into(blob)
        else:
            blob[:len(first.weights)] = memoryview(first.weights).cast("B")
        for offset, graph, t in new:
            blob[offset:offset + t.nbytes] = constant(graph, t)
    else:
        blob = first.weights
    out: dict[int, Graph] = {}
    for batch in order:
        graph, moved = graphs[batch], where[batch]
        tensors = [dataclasses.replace(t, offset=moved[t.base] + (t.offset - graph.tensors[t.base].offset))
                   if t.storage == "weights" else t for t in graph.tensors]
        out[batch] = dataclasses.replace(graph, tensors=tensors, weights=blob)
    return blob, out


def plan_work(graph: Graph, flops: dict[str, int], factors: dict[str, float] | None = None,
              calls: int | None = None):
    """One plan's work (runtime/batching.py's PlanWork): its calls (or ``calls`` launches, CUDA), the
    FLOPs of its kernels, the same counted in vector-lane work (each task's FLOPs times its factor in
    ``factors``, schedule/estimate.py's lane_factor; 1 where absent) and the bytes of the kernels'
    arguments, every argument once per call."""
    from ..runtime.batching import PlanWork

    factors = factors or {}
    nbytes = sum(graph.tensors[a].nbytes for c in graph.calls for a in c.args)
    return PlanWork(len(graph.calls) if calls is None else calls, sum(flops.get(c.task, 0) for c in graph.calls),
                    round(sum(flops.get(c.task, 0) * factors.get(c.task, 1.0) for c in graph.calls)), nbytes)
