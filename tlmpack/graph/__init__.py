"""The graph stage: a Relax model → fused TIR kernels → a Graph of kernel calls over named tensors,
deduplicated tasks and a static memory plan (partition.py).

The Relax rewrites that shape what FuseOps sees live beside it, one job a module: channels-last layout
ops (layout_ops.py), awkward extents padded (relax_rewrites.py), matmul views (matmul_views.py), wide
convolution outputs (conv_width.py), sigmoid through exp (fast_sigmoid.py), small powers as products
(small_powers.py), squeeze-excite gates as kernels of their own (wide_gates.py); and the merge of one
graph per batch size (batch_graph.py).
"""

from .partition import (
    ALIGNMENT,
    Graph,
    KernelCall,
    PendingWeights,
    Task,
    Tensor,
    fuse_to_tir,
    has_conv2d,
    host_array,
    partition,
    plan_memory,
    weights_buffer,
)

__all__ = [
    "ALIGNMENT",
    "Graph",
    "KernelCall",
    "PendingWeights",
    "Task",
    "Tensor",
    "fuse_to_tir",
    "has_conv2d",
    "host_array",
    "partition",
    "plan_memory",
    "weights_buffer",
]
