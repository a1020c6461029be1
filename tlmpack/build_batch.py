"""The build of a dynamic-batch artifact: one plan per listed batch size, one set of kernels, one
weights blob.

The same stages as build.py, run over several Graphs of one model: the frontend imports the model
once per batch size (its batch dimension fixed), graph.py partitions each, batch_graph.py merges
their tasks (identical tasks are scheduled and compiled once) and shares their constants, and emit
links every plan into one x86/model.so (and one cuda/plan.so) under a symbol per batch size. The
largest plan keeps the plain symbol, so a runtime that knows nothing of batch plans opens the
artifact as a fixed model of the largest batch.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from . import __version__
from .errors import InputShapeError

X86_PLAN_SYMBOL, CUDA_PLAN_SYMBOL = "tlmrt_plan_v1", "tlmrt_cuda_plan_v1"


def plan_symbol(kind: str, batch: int, largest: int) -> str:
    """The symbol of one batch plan; runtime_c/tlmrt_batch.c derives the same names."""
    plain = X86_PLAN_SYMBOL if kind == "x86" else CUDA_PLAN_SYMBOL
    return plain if batch == largest else plain.replace("_v1", f"_b{batch}_v1")


def _dynamic_specs(specs_by_batch: dict, what: str) -> list:
    """The public specs with axis 0 symbolic, after checking that it is the batch in every plan."""
    from .frontend.batch import BATCH_DIM
    from .specs import TensorSpec

    largest = max(specs_by_batch)
    out = []
    for i, spec in enumerate(specs_by_batch[largest]):
        for b, specs in specs_by_batch.items():
            s = specs[i]
            if not s.shape or s.shape[0] != b or s.shape[1:] != spec.shape[1:]:
                raise InputShapeError(f"--batch: {what} {s.name!r} has shape {s.shape} in the batch-{b} plan; "
                                      f"every {what} needs the batch as its axis 0")
        out.append(TensorSpec(spec.name, spec.dtype, (BATCH_DIM, *spec.shape[1:])))
    return out


def build_batched(model: str, out: Path, options, say: Callable[[str], None], started: float) -> dict:
    """build() for options.batches (build.py has checked and resolved the options)."""
    import tvm

    from .batch_graph import merge_tasks, plan_work, share_weights
    from .build import TARGET_ORDER, _tlm_weights, _unseen_by_tlm, pad_policy
    from .emit.manifest import write_manifest
    from .emit.package import add_runtime, choose_summary, link_model_library, subgraphs
    from .emit.plan_c import render_plan
    from .emit.tarball import write_reproducible_tar
    from .emit.x86_weights import pack_graph
    from .frontend import load_model
    from .frontend.batch import batch_input_shapes
    from .graph import has_conv2d
    from .graph_fallbacks import Fallback, Lowering, lower_graph, x86_kernels_with_fallback
    from .lower.cuda import cuda_target
    from .lower.prepack import Packer
    from .lower.x86 import x86_target
    from .runtime.batching import BATCH_PLANS_FILE, plan_costs, render_batch_plans
    from .schedule.estimate import lane_factor, task_flops
    from .schedule.hardware import detect_x86
    from .schedule.select import SelectOptions, schedule_tasks, scheduler_for

    batches = options.batches
    largest = max(batches)
    shapes = batch_input_shapes(model, batches, options.input_shapes)
    imported = {}
    for b in batches:
        say(f"loading {model} for batch {b}")
        imported[b] = load_model(model, shapes[b])
    first = imported[largest]
    inputs = _dynamic_specs({b: m.inputs for b, m in imported.items()}, "input")
    outputs = _dynamic_specs({b: m.outputs for b, m in imported.items()}, "output")
    cuda = cuda_target(options.cuda_archs) if "cuda" in options.targets else None
    x86_layout = ("NHWC" if "x86" in options.targets and scheduler_for("x86", options.scheduler) in ("tlm", "heuristic")
                  and has_conv2d(first.mod) else None)
    fallbacks: list = [Fallback("opset-upgrade", "graph", note) for note in first.notes]
    graphs: dict[int, object] = {}
    x86_graphs: dict[int, object] = {}
    layout_ops: dict[int, bool] = dict.fromkeys(batches, False)  # layout_ops.py's rewrites, channels-last only
    for b in batches:
        say(f"lowering the batch-{b} plan to fused TIR")
        if cuda is not None or x86_layout is None:
            pad = pad_policy(options, options.targets if x86_layout is None else ("cuda",))
            graphs[b], _, taken = lower_graph(imported[b].mod, Lowering(None, options.fast_math, pad=pad),
                                              task_prefix=f"b{b}k", say=say)
            fallbacks += [f for f in taken if f not in fallbacks]
        if x86_layout is not None:
            x86_graphs[b], used, taken = lower_graph(imported[b].mod, Lowering(x86_layout, options.fast_math,
                                                                               pad=pad_policy(options, ("x86",))),
                                                     task_prefix=f"b{b}x", say=say)
            fallbacks += [dataclasses.replace(f, scope="x86 graph") for f in taken]
            x86_layout = used.conv_layout
            layout_ops[b] = bool(used.layout_ops and used.conv_layout is not None)
    union, graphs = merge_tasks(graphs) if graphs else (None, {})
    x86_union = None
    if x86_graphs:
        x86_union, x86_graphs = merge_tasks(x86_graphs)
    elif "x86" in options.targets:
        x86_union, x86_graphs = union, graphs
    if union is None:
        union, graphs = x86_union, x86_graphs
    calls = sum(len(g.calls) for g in graphs.values())
    say(f"{len(batches)} batch plans ({', '.join(map(str, batches))}): {calls} kernel calls, "
        f"{len(union.tasks)} distinct tasks")

    with tempfile.TemporaryDirectory(prefix="tlmpack-build-") as tmp:
        stage = Path(tmp) / "artifact"
        stage.mkdir(parents=True)
        target_entries: dict[str, dict] = {}
        records_by_target: dict[str, dict] = {}
        tlm_models: dict[str, dict] = {}
        plan_entries: dict[int, dict] = {b: {"batch": b} for b in batches}
        weights = b""
        costs = {}
        if cuda is not None:
            weights, cuda_graphs = share_weights(graphs)
            entry, records, tlm_cuda, taken, per_plan = _build_cuda_plans(
                stage, union, {b: cuda_graphs[b] for b in sorted(batches, reverse=True)}, inputs, outputs,
                first.source.name, cuda, say, options,
                {b: plan_symbol("cuda", b, largest) for b in batches})
            fallbacks += taken
            if tlm_cuda is not None:
                tlm_models["cuda"] = tlm_cuda
            entry["files"] = [*entry["files"], BATCH_PLANS_FILE]
            target_entries["cuda"] = entry
            records_by_target["cuda"] = {r.task: r for r in records}
            flops = task_flops(union.task_funcs)
            work = {b: plan_work(cuda_graphs[b], flops, calls=per_plan[b]["launches"]) for b in batches}
            costs["cuda"] = plan_costs(work, "cuda")
            for b, numbers in per_plan.items():
                plan_entries[b]["cuda"] = numbers | {"work": work[b].to_json()}
        x86_weights = weights
        if "x86" in options.targets:
            target = x86_target(options.cpu, options.cores)
            hardware = detect_x86(target.features, options.cores, options.cache_kib)
            say(f"scheduling {len(x86_union.tasks)} tasks for x86 ({target.cpu}, scheduler="
                f"{scheduler_for('x86', options.scheduler)})")
            scheduled = schedule_tasks(x86_union, target.tvm_target(), "x86",
                                       SelectOptions(scheduler_for("x86", options.scheduler), options.tune, _tlm_weights(options),
                                                     _unseen_by_tlm(x86_layout)),
                                       hardware.lanes(32), say, hardware)
            if scheduled.tlm is not None:
                tlm_models["x86"] = scheduled.tlm
            fallbacks += scheduled.fallbacks
            (stage / "x86").mkdir()
            say("building x86 kernels with LLVM")
            kernels_object = Path(tmp) / "kernels.o"
            fallbacks += x86_kernels_with_fallback(scheduled, x86_union, target, kernels_object,
                                                   hardware.lanes(32), say)
            packed = {b: pack_graph(g, scheduled.splits, Packer().pack) for b, g in x86_graphs.items()}
            x86_weights, packed = share_weights(packed)
            plans = [render_plan(packed[b], imported[b].inputs, imported[b].outputs, first.source.name,
                                 __version__, target.features, plan_symbol("x86", b, largest), common=b == largest)
                     for b in sorted(batches, reverse=True)]
            link_model_library(stage, plans, kernels_object)
            files = ["x86/model.so", BATCH_PLANS_FILE]
            if cuda is not None and x86_weights != weights:
                (stage / "x86" / "weights.bin").write_bytes(x86_weights)
                files.append("x86/weights.bin")
            target_entries["x86"] = target.to_json() | {
                "hardware": hardware.to_json(), "files": files, "weights_bytes": len(x86_weights),
                "arena_bytes": max(g.arena_bytes for g in packed.values()), "conv_layout": x86_layout or "model",
                "layout_ops": all(layout_ops.values())}
            records_by_target["x86"] = {r.task: r for r in scheduled.records}
            flops = task_flops(x86_union.task_funcs)
            lanes = {t: lane_factor(f, hardware.lanes(32)) for t, f in scheduled.funcs.items()}
            work = {b: plan_work(g, flops, lanes) for b, g in packed.items()}
            costs["x86"] = plan_costs(work, "x86")
            for b, g in packed.items():
                plan_entries[b]["x86"] = {"arena_bytes": g.arena_bytes, "kernel_calls": len(g.calls),
                                          "layout_ops": layout_ops[b], "work": work[b].to_json()}
            say(choose_summary(scheduled))
        (stage / "weights.bin").write_bytes(weights if cuda is not None else x86_weights)
        (stage / BATCH_PLANS_FILE).write_text(render_batch_plans(costs))
        for b in batches:
            plan_entries[b]["cost"] = {t: costs[t][b] for t in sorted(costs)}
        add_runtime(stage)
        order = [t for t in TARGET_ORDER if t in target_entries]
        arena = max(e["arena_bytes"] for e in target_entries.values())
        manifest = {
            "format_version": 3,  # inputs and outputs may have a symbolic dim: version-2 readers would misread them
            "tlmpack_version": __version__,
            "tvm_version": tvm.__version__,
            "tlm": tlm_models or None,
            "model": first.source.to_json() | {"path": Path(first.source.path).name},
            "build_options": options.to_json(),
            "inputs": [s.to_json() for s in inputs],
            "outputs": [s.to_json() for s in outputs],
            "batch_plans": [plan_entries[b] for b in batches],
            "targets": [target_entries[t] for t in order],
            "memory": {"arena_bytes": arena, "weights_bytes": len(weights or x86_weights)},
            "plan": {"kernel_calls": calls, "tensors": sum(len(g.tensors) for g in graphs.values())},
            "subgraphs": subgraphs(union, x86_union if x86_union is not union else None, records_by_target, order),
            "fallbacks": [f.to_json() for f in fallbacks],
        }
        write_manifest(stage, manifest)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_reproducible_tar(stage, out)
    say(f"wrote {out} ({len(batches)} batch plans) in {time.perf_counter() - started:.1f} s")
    return manifest


def _build_cuda_plans(stage: Path, union, graphs: dict, inputs: list, outputs: list, model_name: str, cuda,
                      say: Callable[[str], None], options, symbols: dict[int, str]):
    """build.py's _build_cuda for batch plans: the union's tasks scheduled and compiled once (one
    cubin), one plan per batch size linked into cuda/plan.so, the largest first. The runtime captures
    a CUDA graph per plan. Returns the target entry, the records, the TLM, the fallbacks and each
    plan's numbers."""
    from .build import _tlm_weights
    from .emit.cuda_plan import render_cuda_plan
    from .emit.package import link_cuda_plan
    from .graph_fallbacks import cuda_kernels_with_fallback
    from .schedule.select import SelectOptions, schedule_cuda_tasks, scheduler_for

    cuda_scheduler = scheduler_for("cuda", options.scheduler)
    say(f"scheduling {len(union.tasks)} tasks for CUDA ({', '.join(cuda.archs)}) with {cuda_scheduler}")
    funcs, records, tlm = schedule_cuda_tasks(union, cuda, say,
                                              scheduler=SelectOptions(cuda_scheduler, 0, _tlm_weights(options)))
    nvcc_dir = stage.parent / "nvcc"
    kernels, records, fallbacks = cuda_kernels_with_fallback(funcs, records, union, cuda, nvcc_dir, say)
    (stage / "cuda").mkdir()
    for name in ["kernels.cu", *(file for file, _, _ in kernels.images)]:
        shutil.copy(nvcc_dir / name, stage / "cuda" / name)
    plans = {b: render_cuda_plan(g, kernels, cuda, inputs, outputs, model_name, __version__, symbols[b])
             for b, g in graphs.items()}
    link_cuda_plan(stage, [p.c_source for p in plans.values()])
    files = ["cuda/plan.so", *(f"cuda/{file}" for file, _, _ in kernels.images), "cuda/kernels.cu"]
    largest = plans[max(plans)]
    say(f"CUDA plans: {', '.join(f'batch {b} {p.num_launches} launches' for b, p in plans.items())}")
    entry = cuda.to_json() | {"files": files, "launches": largest.num_launches,
                              "arena_bytes": max(p.arena_bytes for p in plans.values()),
                              "workspace_bytes": max(p.workspace_bytes for p in plans.values())}
    per_plan = {b: {"arena_bytes": p.arena_bytes, "launches": p.num_launches} for b, p in plans.items()}
    return entry, records, tlm, fallbacks, per_plan
