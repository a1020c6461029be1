"""Corpus tasks as ``tlmpack build`` sees them (the CUDA graph, or with ``--target x86`` the x86
one): an ONNX file through the build's own import and lowering (build._import, build._lower: ONNX
frontend, batch norm folded, bias and activation fused into the convolutions and GEMMs, awkward
extents padded), so the task keys are what a build's tasks hash to (corpus.task_key). The
torch-exported corpus (corpus.py) never sees these tasks.

    python -m tlmpack.training.onnx_corpus MODEL.onnx --name onnx-resnet50 [--target cuda|x86] [--data DIR]

``--target x86`` takes the x86 build's graph instead (channels-last convolutions; name it e.g.
``onnx-resnet50-x86``).

A model's entry is data/corpus/<name>.json (``source: "onnx"``); new tasks go to data/tasks/.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def build_tasks(model_path: str | Path, targets: tuple[str, ...] = ("cuda",)) -> list[dict]:
    """The distinct tasks of ``model_path``'s graph for ``targets``' first target, as
    corpus.extract_tasks writes them. ``("x86",)`` gives the x86 build's own graph: convolutions
    channels-last (NHWC), which the torch-exported corpus and the CUDA graph never hold."""
    import dataclasses

    from .. import build, build_switches
    from ..lower.cuda import CudaTarget
    from ..schedule.select import packed_weight_param
    from ..tlm.language import describe_task
    from .corpus import task_key

    x86 = targets[0] == "x86"
    # the rules' layout: a build schedules x86 convolutions channels-last under tlm and heuristic
    options = build_switches.resolve(build.BuildOptions(targets=targets, scheduler="heuristic" if x86 else "auto"))
    # _lower only asks whether there is a CUDA target; the arch list is the build's default (sm_90)
    options = dataclasses.replace(options, cuda_archs=("sm_90",))
    cuda = None if "cuda" not in targets else CudaTarget(("sm_90",), "nvcc", "0.0.0")
    with build_switches.applied(options):
        plans = build._import(str(model_path), options, lambda s: None)
        build._lower(plans, options, cuda, lambda s: None)
    graph = plans.x86_union if x86 else plans.union
    outputs = {call.task: call.num_outputs for call in graph.calls}
    out = []
    for task in graph.tasks:
        func = graph.task_funcs[task.id]
        info = describe_task(func, task.name)
        script = func.script()
        out.append({
            "key": task_key(func), "name": task.name, "calls": task.calls, "num_outputs": outputs[task.id],
            "script": script, "script_sha256": hashlib.sha256(script.encode()).hexdigest(),
            "kind": info.kind, "ops": list(info.ops), "spatial": list(info.spatial),
            "reduction": list(info.reduction), "dtypes": list(info.dtypes),
            "weight_param": packed_weight_param(graph, task.id, func),
        })
    return out


def add_model(store, name: str, tasks: list[dict], source: str, input_shape: list[int]) -> dict:
    """Writes the model's corpus entry and every task the store lacks (append-only: an existing
    task file is never rewritten). Returns {"tasks", "new"}."""
    new = 0
    seen: dict[str, dict] = {}
    for t in tasks:
        if t["key"] in seen:  # two graph tasks with one structure: one corpus task, calls added
            seen[t["key"]]["calls"] += t["calls"]
            continue
        seen[t["key"]] = {"key": t["key"], "name": t["name"], "calls": t["calls"]}
        if t.get("weight_param") is not None:  # a graph fact: which parameter the build packs
            seen[t["key"]]["weight_param"] = t["weight_param"]
        if not store.has_task(t["key"]):
            store.put_task({k: v for k, v in t.items() if k != "weight_param"} | {"first_model": name})
            new += 1
    store.put_corpus(name, {"model": name, "held_out": False, "source": source, "input_shape": input_shape,
                            "tasks": sorted(seen.values(), key=lambda e: e["key"])})
    return {"tasks": len(seen), "new": new}


def main(argv: list[str] | None = None) -> None:
    import argparse
    import json

    from .store import Store, default_root

    ap = argparse.ArgumentParser(prog="python -m tlmpack.training.onnx_corpus")
    ap.add_argument("model")
    ap.add_argument("--name", required=True, help="corpus name, e.g. onnx-resnet50 or onnx-resnet50@b16")
    ap.add_argument("--source", default="", help="how the ONNX file was made (recorded in the entry)")
    ap.add_argument("--target", choices=("cuda", "x86"), default="cuda",
                    help="whose graph: x86 builds run convolutions channels-last")
    ap.add_argument("--data", default=None)
    args = ap.parse_args(argv)
    import onnx

    graph = onnx.load(args.model, load_external_data=False).graph
    shape = [d.dim_value for d in graph.input[0].type.tensor_type.shape.dim]
    tasks = build_tasks(args.model, (args.target,))
    print(json.dumps({"model": args.name, **add_model(Store(args.data or default_root()), args.name, tasks,
                                                     args.source or "onnx", shape)}))


if __name__ == "__main__":
    main()
