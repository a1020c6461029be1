"""Small real tasks for the tensor-language tests, built from TVM's TE operators (seconds, no model)."""

from __future__ import annotations


def example_tasks() -> dict[str, object]:
    """name -> unscheduled PrimFunc: a matmul with bias and relu, a conv2d with relu, a softmax,
    a layer norm. Names follow TVM's fused-task naming so the op words are real."""
    from tvm import te, topi

    tasks = {}
    a = te.placeholder((32, 64), name="A")
    w = te.placeholder((48, 64), name="W")
    b = te.placeholder((48,), name="B")
    tasks["fused_dense_add_relu"] = te.create_prim_func([a, w, b, topi.nn.relu(topi.add(topi.nn.dense(a, w), b))])
    x = te.placeholder((1, 8, 14, 14), name="X")
    k = te.placeholder((16, 8, 3, 3), name="K")
    tasks["fused_conv2d_relu"] = te.create_prim_func([x, k, topi.nn.relu(topi.nn.conv2d_nchw(x, k, 1, 1, 1))])
    s = te.placeholder((4, 32, 32), name="S")
    tasks["softmax"] = te.create_prim_func([s, topi.nn.softmax(s, axis=-1)])
    n = te.placeholder((16, 96), name="N")
    gamma = te.placeholder((96,), name="G")
    beta = te.placeholder((96,), name="Be")
    tasks["layer_norm"] = te.create_prim_func([n, gamma, beta, topi.nn.layer_norm(n, gamma, beta, axis=[1])])
    return tasks


def x86_space(func):
    from tlmpack.lower.x86 import x86_target
    from tlmpack.schedule.space import DesignSpace

    return DesignSpace(func, x86_target(num_cores=2).tvm_target())
