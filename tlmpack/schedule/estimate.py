"""What the build knows of a kernel's speed without running it: the floating-point operations of
its task (TVM's estimate from the TIR), and for a scheduled x86 kernel how many vector lanes its
reductions run in. The dynamic-batch cost estimates (runtime/batching.py) are made of these.

A scheduled x86 reduction whose innermost loop is vectorized over w lanes does its multiply-adds
w at a time. One whose innermost loop is serial does them one at a time (LLVM does not vectorize a
float reduction it may not reassociate). So its work counts lanes / min(w, lanes) times the FLOPs.
On the dynamic-batch bench models this factor explained why an encoder's batch-4 plan, whose
TLM-chosen matmuls have serial inner loops, ran as slowly as its batch-16 plan (BENCHMARKS.md).
"""

from __future__ import annotations

from typing import Any


def task_flops(task_funcs: dict[str, Any]) -> dict[str, int]:
    """Floating-point operations of one call of each task (0 where TVM cannot estimate them)."""
    import tvm
    from tvm.s_tir.analysis import estimate_tir_flops

    out = {}
    for tid, func in task_funcs.items():
        try:
            out[tid] = max(0, int(estimate_tir_flops(tvm.IRModule({"main": func}))))
        except Exception:  # noqa: BLE001 — an estimate only: a task TVM cannot count costs its bytes and calls
            out[tid] = 0
    return out


def task_bytes(graph: Any) -> dict[str, int]:
    """Bytes one call of each task reads and writes: its arguments, each once (the first call of the
    task in the plan; every call of a task has the same shapes). With task_flops it gives the
    arithmetic intensity that `tlmpack bench --profile` shows beside each kernel's time."""
    out: dict[str, int] = {}
    for call in graph.calls:
        if call.task not in out:
            out[call.task] = sum(graph.tensors[a].nbytes for a in call.args)
    return out


def split_step_work(graph: Any, flops: dict[str, int]) -> list[int]:
    """Per call of the plan, in millions of operations, the work of each convolution call, which the C
    runtime may split into more tasks than threads (0 for every other call; runtime_c/tlmrt_plan.h).

    A long convolution split one task a thread waits for its slowest thread: on the 16-core Xeon
    ResNet-50 ran 1.24x faster at 4 threads with 8 tasks a thread. Dense layers lost their weight
    panel's locality when split so (BERT-base 26 % slower at 16 threads), and short kernels paid for
    the extra tasks (MobileNetV2 41 %), so only convolutions are marked, and the runtime keeps the
    short ones at one task a thread."""
    names = {t.id: t.name for t in graph.tasks}
    return [flops.get(c.task, 0) // 1_000_000 if "conv" in names.get(c.task, "") else 0 for c in graph.calls]


def reduction_lanes(func: Any) -> int | None:
    """The narrowest vector width over the innermost loops around the scheduled kernel's reduction
    blocks (1 for a serial loop), or None when it has no reduction."""
    from tvm import tirx

    widths: list[int] = []

    def walk(stmt: Any, loops: list) -> None:
        if isinstance(stmt, tirx.For):
            walk(stmt.body, [*loops, stmt])
        elif isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                walk(s, loops)
        elif type(stmt).__name__ == "SBlockRealize":
            block = stmt.block
            if any(int(iv.iter_type) == tirx.IterVar.CommReduce for iv in block.iter_vars):
                inner = loops[-1] if loops else None
                vectorized = inner is not None and inner.kind == tirx.ForKind.VECTORIZED
                extent = getattr(inner.extent, "value", None) if vectorized else 1
                widths.append(int(extent) if extent is not None else 1)
            walk(block.body, [])
        else:
            for attr in ("body", "then_case", "else_case"):
                child = getattr(stmt, attr, None)
                if isinstance(child, tirx.Stmt):
                    walk(child, loops)

    walk(func.body, [])
    return min(widths) if widths else None


def lane_factor(func: Any, lanes: int) -> float:
    """How many times its FLOPs a scheduled x86 kernel's work counts: lanes / min(w, lanes) for w the
    width of its reductions' innermost loops; 1 without a reduction."""
    w = reduction_lanes(func)
    return 1.0 if w is None else lanes / max(1, min(w, lanes))
