"""Renders the execution plan (templates/plan.c.j2) as C data for the runtime."""

from __future__ import annotations

import hashlib

import numpy as np

from .._paths import TEMPLATES_DIR
from ..graph import Graph
from ..specs import TensorSpec

_DLPACK_CODE = {"i": 0, "u": 1, "f": 2, "b": 6}


def c_string(text: str) -> str:
    """Escapes text for a C string literal (names come from the model file: never trust them)."""
    out = []
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif 32 <= ord(ch) < 127:
            out.append(ch)
        else:
            out.extend(f"\\{b:03o}" for b in ch.encode())
    return "".join(out)


def _environment():
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)), trim_blocks=True,
                             lstrip_blocks=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["c_string"] = c_string
    return env


# /proc/cpuinfo flag names (the manifest's) → names gcc's __builtin_cpu_supports knows.
_GCC_CPU_FEATURE = {
    "sse4_1": "sse4.1", "sse4_2": "sse4.2", "avx": "avx", "avx2": "avx2", "fma": "fma", "f16c": "f16c",
    "avx512f": "avx512f", "avx512bw": "avx512bw", "avx512dq": "avx512dq", "avx512vl": "avx512vl",
    "avx512cd": "avx512cd",
}


def render_plan(graph: Graph, inputs: list[TensorSpec], outputs: list[TensorSpec], model_name: str,
                version: str, cpu_features: tuple[str, ...] = (), plan_symbol: str = "tlmrt_plan_v1",
                common: bool = True, step_work: list[int] | None = None) -> str:
    """The plan for x86/model.so; input and output names are the model's public names.
    A dynamic-batch model.so links one plan per batch size, each under its own ``plan_symbol``;
    exactly one of them has the ``common`` part (the kernels' error hook, the CPU feature check).
    ``step_work``: per call, the work the runtime may split finer (schedule/estimate.split_step_work)."""
    if step_work is not None and len(step_work) != len(graph.calls):
        raise ValueError(f"step_work has {len(step_work)} values for {len(graph.calls)} calls")
    tensors = []
    for t in graph.tensors:
        dt = np.dtype(t.dtype)
        tensors.append({
            "id": t.id, "name": c_string(t.name).replace("*/", "* /"),
            "storage": "TLMRT_STORAGE_ARENA" if t.storage == "arena" else "TLMRT_STORAGE_WEIGHTS",
            "dtype_code": _DLPACK_CODE[dt.kind], "dtype_bits": 8 if dt.kind == "b" else dt.itemsize * 8,
            "offset": t.offset, "nbytes": t.nbytes, "ndim": len(t.shape), "shape": list(t.shape),
        })
    steps = [{"task": c.task, "symbol": f"__tvm_ffi_{c.task}", "args": list(c.args)} for c in graph.calls]
    return _environment().get_template("plan.c.j2").render(
        tlmpack_version=version, plan_symbol=plan_symbol, common=common,
        cpu_features=[_GCC_CPU_FEATURE[f] for f in cpu_features if f in _GCC_CPU_FEATURE],
        model_name=c_string(model_name),
        kernels=[f"__tvm_ffi_{t.id}" for t in graph.tasks],
        tensors=tensors,
        steps=steps,
        step_work=[min(int(w), 2**32 - 1) for w in step_work or []],
        tensor_bases=[t.base for t in graph.tensors],
        inputs=[{"name": c_string(s.name), "tensor": tid} for s, tid in zip(inputs, graph.inputs, strict=True)],
        outputs=[{"name": c_string(s.name), "tensor": tid} for s, tid in zip(outputs, graph.outputs, strict=True)],
        arena_bytes=graph.arena_bytes,
        weights_bytes=len(graph.weights),
        weights_sha256=hashlib.sha256(graph.weights).hexdigest(),
    )
