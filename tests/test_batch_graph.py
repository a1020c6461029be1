"""batch_graph.py on hand-made Graphs: a task that does not depend on the batch is kept once across
the batch plans (so it is scheduled and compiled once), batch-dependent tasks stay apart, and the
plans' constants share one weights blob by content."""

from __future__ import annotations

import numpy as np

from tlmpack.graph import Graph, KernelCall, Task, Tensor


def _func(n: int):
    """A PrimFunc adding 1 to an n-element vector (n plays the batch)."""
    from tvm import te

    a = te.placeholder((n,), "float32", name="a")
    b = te.compute((n,), lambda i: a[i] + 1.0, name="b")
    return te.create_prim_func([a, b])


def _graph(batch: int, weight: bytes) -> Graph:
    """Two calls: a batch-independent task on a constant (4 floats), then one over the batch."""
    shared, per_batch = f"b{batch}k0_w", f"b{batch}k1_x"
    tensors = [Tensor(0, "x", "float32", (batch,), "arena", 0), Tensor(1, "w", "float32", (4,), "weights", 1, 0),
               Tensor(2, "w1", "float32", (4,), "arena", 2), Tensor(3, "y", "float32", (batch,), "arena", 3)]
    calls = [KernelCall(shared, (1, 2), 1), KernelCall(per_batch, (0, 3), 1)]
    tasks = [Task(shared, "add_w", "00", 1), Task(per_batch, "add_x", f"{batch:02x}", 1)]
    return Graph(tensors, calls, tasks, [0], [3], weight, 256,
                 task_funcs={shared: _func(4), per_batch: _func(batch)})


def test_a_task_that_does_not_depend_on_the_batch_is_kept_once():
    from tlmpack.graph.batch_graph import merge_tasks

    w = np.arange(4, dtype=np.float32).tobytes()
    graphs = {1: _graph(1, w), 8: _graph(8, w)}
    graphs[8].tasks[0] = Task("b8k0_w", "add_w", "00", 1)  # same structural hash as batch 1's
    union, renamed = merge_tasks(graphs)
    assert [t.id for t in union.tasks] == ["b1k0_w", "b1k1_x", "b8k1_x"]
    assert [c.task for c in renamed[8].calls] == ["b1k0_w", "b8k1_x"]
    assert {t.id: t.calls for t in union.tasks} == {"b1k0_w": 2, "b1k1_x": 1, "b8k1_x": 1}
    # the union's calls name the union's tensors: each plan's tensors side by side
    assert union.tensors[union.calls[3].args[0]].shape == (8,)


def test_plans_share_constants_with_the_same_bytes_and_keep_different_ones_apart():
    from tlmpack.graph.batch_graph import share_weights

    same = np.arange(4, dtype=np.float32).tobytes()
    other = np.ones(4, dtype=np.float32).tobytes()
    blob, plans = share_weights({1: _graph(1, same), 4: _graph(4, same)})
    assert blob == same and plans[1].tensors[1].offset == plans[4].tensors[1].offset == 0
    blob, plans = share_weights({1: _graph(1, same), 4: _graph(4, other)})
    assert len(blob) == 64 + 16 and plans[4].tensors[1].offset == 64
    assert blob[64:] == other and plans[1].weights == plans[4].weights == blob


def test_plans_lowered_with_pending_weights_are_copied_once_into_the_shared_blob():
    import dataclasses

    from tlmpack.graph import PendingWeights
    from tlmpack.graph.batch_graph import share_weights

    same = np.arange(4, dtype=np.float32)
    other = np.ones(4, dtype=np.float32)

    def pending(batch, *arrays):
        g = _graph(batch, b"".join(a.tobytes() for a in arrays))
        return dataclasses.replace(g, weights=PendingWeights(16, [(0, arrays[0])]))

    blob, plans = share_weights({1: pending(1, same), 4: pending(4, same)})
    assert bytes(blob) == same.tobytes() and plans[1].weights is plans[4].weights is blob
    blob, plans = share_weights({1: pending(1, same), 4: pending(4, other)})
    assert bytes(blob[:16]) == same.tobytes() and bytes(blob[64:80]) == other.tobytes()
    assert plans[4].tensors[1].offset == 64
