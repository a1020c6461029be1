"""The build: model → Relax → tasks → schedules → kernels → plan → the .tar artifact.

One pipeline drives the rooms in order, each called once with plain records, no stage calling
back up: frontend (``_import``), graph (``_lower``), then per target schedule → lower → emit
(``_build_cuda``, ``_build_x86``), then the manifest and the tar. It compiles one plan or several:
a fixed build has one, of the model's own shapes; ``--batch 1,4,16`` (options.batches) has one per
batch size, whose identical tasks are scheduled and compiled once (batch_graph.py) and which share
one weights blob, one x86/model.so and one cuda/plan.so (a symbol per plan), plus the batch_plans
cost table the runtime covers other batches with (docs/dynamic-batch.md).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import __version__
from .emit.manifest import write_manifest
from .emit.package import add_runtime, choose_summary, link_cuda_plan, link_model_library, subgraphs
from .emit.plan_c import render_plan
from .emit.tarball import write_reproducible_tar
from .errors import InputShapeError, LoweringError
from .schedule.select import SCHEDULERS  # auto, tlm, heuristic, baseline, dlight: select.py says which runs

SUPPORTED_TARGETS = ("x86", "cuda")
TARGET_ORDER = ("cuda", "x86")


@dataclass(frozen=True)
class BuildOptions:
    """Everything that changes the artifact; recorded in the manifest."""

    targets: tuple[str, ...] = ("x86",)
    cpu: str | None = None
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    scheduler: str = "auto"  # auto | tlm | heuristic | baseline (fixed x86 rules, dlight on CUDA)
    tune: int = 0  # > 0: measure this many candidates per x86 task on the build host, keep the fastest
    cores: int | None = None  # the x86 target's cores (parallel loops are split for them); default: this host's
    cache_kib: tuple[int, int, int] | None = None  # its L1d, L2 (per core) and L3 in KiB; default: this host's
    tlm_weights: dict[str, str] = field(default_factory=dict)  # target -> TLM weights file (default: shipped)
    cuda_archs: tuple[str, ...] = ()  # e.g. ("sm_80", "sm_90"); empty: sm_90
    # TVM's FastMathTransform: vectorisable erf/exp/tanh approximations. On by default: checked
    # within 1e-4 of onnxruntime / torch on x86 and on the H200 (BENCHMARKS.md); --exact-math for libm.
    fast_math: bool = True
    # Heuristic rules switched off by name, and the CUDA matmul rule's pipelined-sketch preference:
    # None takes TLMPACK_DISABLE_RULES / TLMPACK_CUDA_PIPELINE (build_switches.py); recorded either way.
    disabled_rules: tuple[str, ...] | None = None
    cuda_pipeline: bool | None = None
    # Dynamic batch (docs/dynamic-batch.md): one plan per listed batch size; empty: the model's own shapes.
    batches: tuple[int, ...] = ()
    # Matmuls over awkward extents (197 tokens, a 50257-wide LM head) computed over the next
    # multiple the target prefers and sliced back (relax_rewrites.py); --no-pad-extents for as is.
    pad_extents: bool = True

    def to_json(self) -> dict:
        out = {"targets": list(self.targets), "cpu": self.cpu, "scheduler": self.scheduler,
               "input_shapes": {k: list(v) for k, v in sorted(self.input_shapes.items())}}
        out["fast_math"] = self.fast_math
        out["pad_extents"] = self.pad_extents
        out["disabled_rules"] = list(self.disabled_rules or ())
        if "cuda" in self.targets:
            out["cuda_pipeline"] = bool(self.cuda_pipeline)
        if self.tune:
            out["tune"] = self.tune
        if "x86" in self.targets:
            out["cores"], out["cache_kib"] = self.cores, list(self.cache_kib) if self.cache_kib else None
        if self.tlm_weights:  # the manifest's "tlm" entry has their ids and sha256
            out["tlm_weights"] = {t: Path(p).name for t, p in sorted(self.tlm_weights.items())}
        if "cuda" in self.targets:
            out["cuda_archs"] = list(self.cuda_archs)
        if self.batches:
            out["batches"] = list(self.batches)
        return out


def unseen_by_tlm(conv_layout: str | None) -> tuple[tuple[str, str, str], ...]:
    """What the x86 TLM has not been trained on in the form this build compiles it: its corpus's
    convolutions and poolings are all NCHW. Its picks for channels-last convolutions were up to 12x
    slower than the rules' (ResNet-50, BENCHMARKS.md 2026-12-01), and for ResNet-50's channels-last
    max pool 2x slower (133 vs 66 us, `--tune 16` on the AVX-512 EPYC, 2026-12-04). Each entry is
    (op word, why, the summary flag that lifts it): weights whose summary says ``channels_last``
    (trained on such convolutions: the rules as a teacher) are handed the convolutions all the same."""
    if conv_layout == "NHWC":
        return (("conv2d", "channels-last convolution (the training data has NCHW ones only)", "channels_last"),
                ("pool2d", "channels-last pooling (the training data has NCHW ones only)", ""))
    return ()


def _x86_hardware(options: BuildOptions):
    """The x86 target's description (schedule/hardware.py) for ``options``' --cpu, cores and caches."""
    from .lower.x86 import x86_target
    from .schedule.hardware import detect_x86

    return detect_x86(x86_target(options.cpu, options.cores).features, options.cores, options.cache_kib)


def pad_policy(options: BuildOptions, targets: tuple[str, ...]):
    """How awkward matmul extents are padded for a graph shared by ``targets`` (relax_rewrites.py),
    or None with --no-pad-extents."""
    if not options.pad_extents:
        return None
    from .graph.relax_rewrites import policy_for
    from .schedule.heuristics.x86_matmul import register_rows

    if "x86" not in options.targets:
        return policy_for(targets)
    hardware = _x86_hardware(options)
    return policy_for(targets, hardware.lanes(32), register_rows(hardware.vector_registers))


def resolve_x86_machine(options: BuildOptions) -> BuildOptions:
    """The x86 target's cores and caches, decided once and recorded: given, else this host's for a
    native build; a cross build (--cpu of another CPU) never takes them from the host, so the same
    options give the same bytes on any build machine."""
    import tvm

    from .schedule.hardware import NAMED_CPU_CACHES_KIB, host_caches_kib, host_cores

    cross = options.cpu is not None and options.cpu != tvm.target.codegen.llvm_get_system_cpu()
    cores, cache = options.cores, options.cache_kib
    if cores is None:
        if cross:
            raise LoweringError(f"--cpu {options.cpu} is a cross build: give --cores N, the target machine's "
                                "core count (kernels split their parallel loops for it)")
        cores = host_cores()
    if cache is None:
        cache = NAMED_CPU_CACHES_KIB.get(options.cpu) if cross else host_caches_kib()
        if cache is None:
            raise LoweringError(f"--cpu {options.cpu}: no cache sizes known for this CPU; give --cache L1D,L2,L3 "
                                f"(KiB; known: {', '.join(sorted(NAMED_CPU_CACHES_KIB))})")
    if cores < 1 or min(cache) < 1:
        raise LoweringError(f"--cores and --cache must be positive (got {cores} and {list(cache)})")
    return dataclasses.replace(options, cores=cores, cache_kib=tuple(cache))


def _tlm_weights(options: BuildOptions) -> dict[str, str] | None:
    """Weights given with --tlm-weights; else, for a cross build for a CPU the x86 TLM was adapted
    to (tlmpack tlm adapt), those; else the shipped ones (None)."""
    from .tlm.model import WEIGHTS_DIR

    chosen = dict(options.tlm_weights)
    adapted = WEIGHTS_DIR / f"x86-{options.cpu}.safetensors"
    if "x86" not in chosen and options.cpu and adapted.is_file():
        chosen["x86"] = str(adapted)
    return chosen or None


def build(model: str, out: Path, options: BuildOptions, say: Callable[[str], None] = lambda s: None) -> dict:
    """Builds ``model`` into the artifact ``out``; returns the manifest."""
    from . import build_switches

    options = build_switches.resolve(options)  # every switch that changes code is an option, recorded
    with build_switches.applied(options):
        return _build(model, out, options, say)


X86_PLAN_SYMBOL, CUDA_PLAN_SYMBOL = "tlmrt_plan_v1", "tlmrt_cuda_plan_v1"


def plan_symbol(kind: str, batch: int, largest: int) -> str:
    """The symbol of one plan; runtime_c/tlmrt_batch.c derives the same names. The largest plan (a
    fixed build's only one) has the plain symbol, so a runtime that knows nothing of batch plans opens
    a dynamic-batch artifact as a fixed model of the largest batch."""
    plain = X86_PLAN_SYMBOL if kind == "x86" else CUDA_PLAN_SYMBOL
    return plain if batch == largest else plain.replace("_v1", f"_b{batch}_v1")


@dataclass
class Plans:
    """The model as the build compiles it: one import (frontend) and its graphs (graph/) per plan.
    A fixed build has one plan, of the model's own shapes (key 0); a dynamic-batch build one per
    listed batch size. ``graphs`` are the CUDA graphs, or the only ones when x86 needs no graph of
    its own; ``union`` is the Graph the schedulers take (every distinct task once), and ``x86_*`` the
    same for the x86 target (the same objects when it shares the graph)."""

    imported: dict[int, Any]
    inputs: list  # the public specs; axis 0 "batch" when batched
    outputs: list
    batched: bool
    fallbacks: list
    graphs: dict[int, Any] = field(default_factory=dict)
    union: Any = None
    x86_graphs: dict[int, Any] = field(default_factory=dict)
    x86_union: Any = None
    x86_layout: str | None = None
    layout_ops: dict[int, bool] = field(default_factory=dict)  # layout_ops.py's rewrites, channels-last only
    memory: dict = field(default_factory=dict)  # a fixed build's graph.memory_json(), taken before weights go

    def release_module(self, b: int) -> None:
        """Plan b's imported Relax module, once its graphs are lowered: the lowering fallbacks retried
        from it, nothing after needs it (a 2 GiB model was held twice while it stayed)."""
        self.imported[b].mod = None
        gc.collect()  # TVMScript's parser keeps the stack's frames in cycles (inspect.stack()): they hold graphs

    def materialize_weights(self) -> None:
        """Copies each graph's pending weights (views of its lowered module) into a blob of its own."""
        from .graph import PendingWeights

        for graphs in (self.graphs, self.x86_graphs):
            for b, g in graphs.items():
                if isinstance(g.weights, PendingWeights):
                    graphs[b] = dataclasses.replace(g, weights=g.weights.materialized())
        gc.collect()

    def release_plain_weights(self) -> None:
        """An x86-only build's unpacked constants, once pre-packing has copied them: let them go."""
        def bare(g):
            return dataclasses.replace(g, weights=b"") if g is not None else None

        replaced = {id(g): bare(g) for g in [self.union, self.x86_union, *self.graphs.values(), *self.x86_graphs.values()]
                    if g is not None}
        self.union, self.x86_union = replaced.get(id(self.union)), replaced.get(id(self.x86_union))
        self.graphs = {b: replaced[id(g)] for b, g in self.graphs.items()}
        self.x86_graphs = {b: replaced[id(g)] for b, g in self.x86_graphs.items()}
        gc.collect()

    @property
    def keys(self) -> list[int]:
        return sorted(self.imported)

    @property
    def largest(self) -> int:
        return max(self.imported)

    @property
    def first(self):
        """The largest plan's import (a fixed build's only one): the source, the frontend's notes."""
        return self.imported[self.largest]

    def task_prefix(self, b: int, x86: bool) -> str:
        if self.batched:
            return f"b{b}{'x' if x86 else 'k'}"
        return "x" if x86 and self.graphs else "k"


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


def _import(model: str, options: BuildOptions, say: Callable[[str], None]) -> Plans:
    """frontend: the model once (a fixed build) or once per batch size, its batch dimension fixed."""
    from .errors import Fallback
    from .frontend import load_model

    if not options.batches:
        say(f"loading {model}")
        imported = {0: load_model(model, options.input_shapes)}
        inputs, outputs = imported[0].inputs, imported[0].outputs
    else:
        from .frontend.batch import batch_input_shapes
        from .frontend.onnx_external import shared_initializers

        shapes = batch_input_shapes(model, options.batches, options.input_shapes)
        imported = {}
        with shared_initializers():  # every plan's constants are the first import's tensors
            for b in options.batches:
                say(f"loading {model} for batch {b}")
                imported[b] = load_model(model, shapes[b])
        inputs = _dynamic_specs({b: m.inputs for b, m in imported.items()}, "input")
        outputs = _dynamic_specs({b: m.outputs for b, m in imported.items()}, "output")
    first = imported[max(imported)]
    fallbacks = [Fallback("opset-upgrade", "graph", note) for note in first.notes]
    for fallback in fallbacks:
        say(fallback.sentence())
    return Plans(imported, inputs, outputs, bool(options.batches), fallbacks)


def _lower(plans: Plans, options: BuildOptions, cuda, say: Callable[[str], None]) -> None:
    """graph/: every plan's fused TIR, partition and memory plan; for a dynamic batch, the plans'
    tasks merged by structure (batch_graph.py) so that a task that does not depend on the batch is
    scheduled and compiled once."""
    from .graph import has_conv2d
    from .graph.batch_graph import merge_tasks
    from .graph_fallbacks import Lowering, lower_graph
    from .schedule.select import scheduler_for

    # x86 heuristics run convolutions channels-last (a conv becomes a GEMM over output channels);
    # CUDA keeps the model's layout. With both targets the x86 plan has its own graph and weights.
    x86_layout = ("NHWC" if "x86" in options.targets and scheduler_for("x86", options.scheduler) in ("tlm", "heuristic")
                  and has_conv2d(plans.first.mod) else None)
    # the x86 graph's Lowering, the same for every plan: its padding, and the cores and vector lanes its
    # parallel splits are for
    x86_lowering = (Lowering(x86_layout, options.fast_math, pad=pad_policy(options, ("x86",)), cores=options.cores,
                             lanes=_x86_hardware(options).lanes(32)) if x86_layout is not None else None)
    if not plans.batched:
        say("lowering to fused TIR (Relax LegalizeOps, FuseOps, FuseTIR)")
    for b in plans.keys:
        if plans.batched:
            say(f"lowering the batch-{b} plan to fused TIR")
        mod = plans.imported[b].mod
        plans.layout_ops[b] = False
        # Awkward matmul extents are padded to what the graph's targets prefer (x86 vectors, CUDA warps).
        if cuda is not None or x86_layout is None:
            pad = pad_policy(options, options.targets if x86_layout is None else ("cuda",))
            views = _matmul_views_for(cuda is not None and (x86_layout is not None or "x86" not in options.targets))
            plans.graphs[b], _, taken = lower_graph(mod, Lowering(None, options.fast_math, pad=pad,
                                                                  matmul_views=views),
                                                    task_prefix=plans.task_prefix(b, False), say=say,
                                                    materialize=False)
            plans.fallbacks += [f for f in taken if f not in plans.fallbacks]
        if x86_layout is not None:
            if not plans.batched:
                say(f"lowering for x86 with {x86_layout} convolutions")
            plans.x86_graphs[b], used, taken = lower_graph(
                mod, x86_lowering,
                task_prefix=plans.task_prefix(b, True), say=say, materialize=False)
            plans.fallbacks += [dataclasses.replace(f, scope="x86 graph") for f in taken]
            x86_layout = used.conv_layout
            plans.layout_ops[b] = bool(used.layout_ops and used.conv_layout is not None)
        # The graphs' weights are still views of the lowered modules' constants (graph.PendingWeights):
        # the imported module goes first, so a constant TVM rewrote (a transposed Gemm weight, a
        # channels-last kernel) is not held three times (imported, rewritten, blob) but twice.
        del mod
        plans.release_module(b)
    plans.x86_layout = x86_layout
    if plans.batched:
        from .graph.batch_graph import share_weights

        # the plans' constants copied once, into one blob (each plan's are still views of its module)
        if plans.graphs:
            plans.union, plans.graphs = merge_tasks(share_weights(plans.graphs)[1])
        if plans.x86_graphs:
            plans.x86_union, plans.x86_graphs = merge_tasks(share_weights(plans.x86_graphs)[1])
    else:
        plans.materialize_weights()
        plans.union = plans.graphs.get(0)
        plans.x86_union = plans.x86_graphs.get(0)
    if "x86" in options.targets and plans.x86_union is None:  # x86 shares the graph
        plans.x86_union, plans.x86_graphs = plans.union, plans.graphs
    if plans.union is None:
        plans.union, plans.graphs = plans.x86_union, plans.x86_graphs
    if plans.batched:
        calls = sum(len(g.calls) for g in plans.graphs.values())
        say(f"{len(plans.keys)} batch plans ({', '.join(map(str, plans.keys))}): {calls} kernel calls, "
            f"{len(plans.union.tasks)} distinct tasks")
    else:
        graph = plans.union
        say(f"{len(graph.calls)} kernel calls, {len(graph.tasks)} distinct tasks, "
            f"arena {graph.arena_bytes / 2**20:.1f} MiB, weights {len(graph.weights) / 2**20:.1f} MiB")
        plans.memory = graph.memory_json()


def _matmul_views_for(cuda_graph: bool) -> bool:
    """Whether a graph folds the views around its matmuls (matmul_views.py): a graph of CUDA's alone
    does (measured on the H200); x86's not yet, unless TLMPACK_MATMUL_VIEWS=all (an A/B knob for
    bench/, not a build option)."""
    return cuda_graph or os.environ.get("TLMPACK_MATMUL_VIEWS", "") == "all"


@dataclass
class TargetBuild:
    """What one target's build (schedule → lower → emit) gives the artifact."""

    entry: dict  # the manifest's target entry
    records: dict  # task id → ScheduleRecord
    tlm: dict | None
    weights: bytes  # the constants its plans read
    per_plan: dict[int, dict]  # the manifest's batch_plans numbers of each plan (batched only)
    costs: dict[int, int]  # each plan's estimated cost (batched only)
    flops: dict[str, int]  # task id → FLOPs of one call (TVM's estimate; the manifest's subgraphs)


def _build_cuda(stage: Path, plans: Plans, cuda, say: Callable[[str], None], options: BuildOptions) -> TargetBuild:
    """Schedules the tasks (dlight or the TLM), generates and compiles the CUDA kernels once (one
    cubin/PTX for every plan), renders each plan and links them into cuda/plan.so, the largest first.
    The runtime captures a CUDA graph per plan."""
    from .emit.cuda_plan import render_cuda_plan
    from .graph.batch_graph import plan_work, share_weights
    from .graph_fallbacks import cuda_kernels_with_fallback
    from .runtime.batching import BATCH_PLANS_FILE, plan_costs
    from .schedule.estimate import task_flops
    from .schedule.select import SelectOptions, schedule_cuda_tasks, scheduler_for

    union = plans.union
    weights, graphs = share_weights(plans.graphs) if plans.batched else (union.weights, plans.graphs)
    cuda_scheduler = scheduler_for("cuda", options.scheduler)
    say(f"scheduling {len(union.tasks)} tasks for CUDA ({', '.join(cuda.archs)}) with {cuda_scheduler}")
    funcs, records, tlm = schedule_cuda_tasks(union, cuda, say,
                                              scheduler=SelectOptions(cuda_scheduler, 0, _tlm_weights(options)))
    nvcc_dir = stage.parent / "nvcc"
    kernels, records, taken = cuda_kernels_with_fallback(funcs, records, union, cuda, nvcc_dir, say)
    plans.fallbacks += taken
    (stage / "cuda").mkdir()
    for name in ["kernels.cu", *(file for file, _, _ in kernels.images)]:
        shutil.copy(nvcc_dir / name, stage / "cuda" / name)
    rendered = {b: render_cuda_plan(graphs[b], kernels, cuda, plans.inputs, plans.outputs, plans.first.source.name,
                                    __version__, plan_symbol("cuda", b, plans.largest))
                for b in sorted(graphs, reverse=True)}
    link_cuda_plan(stage, [p.c_source for p in rendered.values()])
    files = ["cuda/plan.so", *(f"cuda/{file}" for file, _, _ in kernels.images), "cuda/kernels.cu"]
    largest = rendered[plans.largest]
    if plans.batched:
        say(f"CUDA plans: {', '.join(f'batch {b} {p.num_launches} launches' for b, p in rendered.items())}")
        files.append(BATCH_PLANS_FILE)
    else:
        say(f"CUDA plan: {largest.num_launches} launches, device arena {largest.arena_bytes / 2**20:.1f} MiB "
            f"(workspace {largest.workspace_bytes / 2**10:.1f} KiB)")
    entry = cuda.to_json() | {"files": files, "launches": largest.num_launches,
                              "arena_bytes": max(p.arena_bytes for p in rendered.values()),
                              "workspace_bytes": max(p.workspace_bytes for p in rendered.values())}
    per_plan, costs = {}, {}
    flops = task_flops(union.task_funcs)
    if plans.batched:
        work = {b: plan_work(graphs[b], flops, calls=p.num_launches) for b, p in rendered.items()}
        costs = plan_costs(work, "cuda")
        per_plan = {b: {"arena_bytes": p.arena_bytes, "launches": p.num_launches, "work": work[b].to_json()}
                    for b, p in rendered.items()}
    return TargetBuild(entry, {r.task: r for r in records}, tlm, weights, per_plan, costs, flops)


def _build_x86(stage: Path, tmp: Path, plans: Plans, cuda_weights: bytes | None, say: Callable[[str], None],
               options: BuildOptions) -> TargetBuild:
    """Schedules the x86 tasks once, builds them into one kernels object with LLVM, pre-packs the
    constants their kernels read tiled, renders each plan and links them with the kernels into
    x86/model.so, the largest first."""
    from .emit.x86_weights import pack_graphs
    from .graph.batch_graph import plan_work
    from .graph_fallbacks import x86_kernels_with_fallback
    from .lower.prepack import Packer
    from .lower.x86 import host_cpu, x86_target
    from .runtime.batching import BATCH_PLANS_FILE, plan_costs
    from .schedule.estimate import lane_factor, split_step_work, task_flops
    from .schedule.hardware import detect_x86
    from .schedule.select import SelectOptions, schedule_tasks, scheduler_for

    union = plans.x86_union
    target = x86_target(options.cpu, options.cores)
    hardware = detect_x86(target.features, options.cores, options.cache_kib)
    scheduler = scheduler_for("x86", options.scheduler, cross_cpu=target.cpu != host_cpu())
    say(f"scheduling {len(union.tasks)} tasks for x86 ({target.cpu}, scheduler={scheduler})")
    scheduled = schedule_tasks(union, target.tvm_target(), "x86",
                               SelectOptions(scheduler, options.tune, _tlm_weights(options),
                                             unseen_by_tlm(plans.x86_layout)),
                               hardware.lanes(32), say, hardware)
    plans.fallbacks += scheduled.fallbacks
    (stage / "x86").mkdir()
    say("building x86 kernels with LLVM")
    kernels_object = tmp / "kernels.o"
    # before pre-packing: a task whose kernel does not compile loses its packed weight
    plans.fallbacks += x86_kernels_with_fallback(scheduled, union, target, kernels_object, hardware.lanes(32), say)
    if scheduled.splits:
        say(f"pre-packing the constants of {len(scheduled.splits)} tasks for their x86 kernels")
    packed = pack_graphs(plans.x86_graphs, scheduled.splits, Packer().pack)  # one blob for all plans
    if cuda_weights is None and scheduled.splits:
        plans.release_plain_weights()
        union = plans.x86_union
    weights = packed[min(packed)].weights
    flops = task_flops(union.task_funcs)
    rendered = [render_plan(packed[b], plans.imported[b].inputs, plans.imported[b].outputs, plans.first.source.name,
                            __version__, target.features, plan_symbol("x86", b, plans.largest), common=b == plans.largest,
                            step_work=split_step_work(packed[b], flops))
                for b in sorted(packed, reverse=True)]
    link_model_library(stage, rendered, kernels_object)
    files = ["x86/model.so", *([BATCH_PLANS_FILE] if plans.batched else [])]
    if cuda_weights is not None and weights != cuda_weights:
        (stage / "x86" / "weights.bin").write_bytes(weights)  # the runtime's x86 backend prefers it
        files.append("x86/weights.bin")
    entry = target.to_json() | {
        "hardware": hardware.to_json(), "files": files, "weights_bytes": len(weights),
        "arena_bytes": max(g.arena_bytes for g in packed.values()), "conv_layout": plans.x86_layout or "model",
        "layout_ops": all(plans.layout_ops.values())}
    per_plan, costs = {}, {}
    if plans.batched:
        lanes = {t: lane_factor(f, hardware.lanes(32)) for t, f in scheduled.funcs.items()}
        work = {b: plan_work(g, flops, lanes) for b, g in packed.items()}
        costs = plan_costs(work, "x86")
        per_plan = {b: {"arena_bytes": g.arena_bytes, "kernel_calls": len(g.calls), "layout_ops": plans.layout_ops[b],
                        "work": work[b].to_json()} for b, g in packed.items()}
    say(choose_summary(scheduled))
    return TargetBuild(entry, {r.task: r for r in scheduled.records}, scheduled.tlm, weights, per_plan, costs, flops)


def _build(model: str, out: Path, options: BuildOptions, say: Callable[[str], None]) -> dict:
    """build(), its switches decided and applied: frontend → graph → schedule → lower → emit, for
    one plan (a fixed build) or one per batch size (options.batches)."""
    from .lower.cuda import cuda_target

    if options.scheduler not in SCHEDULERS:
        raise LoweringError(f"unknown scheduler {options.scheduler!r}; expected one of {list(SCHEDULERS)}")
    unknown = set(options.targets) - set(SUPPORTED_TARGETS)
    if unknown:
        raise LoweringError(f"unknown target(s) {sorted(unknown)}; this build supports {list(SUPPORTED_TARGETS)}")
    if not options.targets:
        raise LoweringError(f"no target given; this build supports {list(SUPPORTED_TARGETS)}")
    if options.cuda_archs and "cuda" not in options.targets:
        raise LoweringError("--cuda-arch is for the cuda target: add -t cuda")
    started = time.perf_counter()
    cuda = cuda_target(options.cuda_archs) if "cuda" in options.targets else None  # fail before the long part
    options = dataclasses.replace(options, targets=tuple(t for t in TARGET_ORDER if t in options.targets),
                                  cuda_archs=cuda.archs if cuda else ())
    if "x86" in options.targets:
        options = resolve_x86_machine(options)

    plans = _import(model, options, say)
    _lower(plans, options, cuda, say)
    with tempfile.TemporaryDirectory(prefix="tlmpack-build-") as tmp:
        stage = Path(tmp) / "artifact"
        stage.mkdir(parents=True)
        built: dict[str, TargetBuild] = {}
        if cuda is not None:
            built["cuda"] = _build_cuda(stage, plans, cuda, say, options)
        if "x86" in options.targets:
            built["x86"] = _build_x86(stage, Path(tmp), plans, built["cuda"].weights if cuda is not None else None,
                                      say, options)
        # weights.bin: the CUDA plans' constants; in an x86-only build, the x86 plans' (maybe packed)
        (stage / "weights.bin").write_bytes(built["cuda" if cuda is not None else "x86"].weights)
        if plans.batched:
            from .runtime.batching import BATCH_PLANS_FILE, render_batch_plans

            (stage / BATCH_PLANS_FILE).write_text(render_batch_plans({t: b.costs for t, b in built.items()}))
        add_runtime(stage)
        manifest = _manifest(plans, options, built)
        write_manifest(stage, manifest)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_reproducible_tar(stage, out)
    n = f" ({len(plans.keys)} batch plans)" if plans.batched else ""
    say(f"wrote {out}{n} in {time.perf_counter() - started:.1f} s")
    return manifest


def _manifest(plans: Plans, options: BuildOptions, built: dict[str, TargetBuild]) -> dict:
    """manifest.json: the records of every stage written down. A dynamic-batch build's is format
    version 3 (inputs and outputs may have a symbolic dim: version-2 readers would misread them),
    with its batch_plans; a fixed build's stays version 2."""
    import tvm

    order = [t for t in TARGET_ORDER if t in built]
    first = plans.first
    tlm = {t: b.tlm for t, b in built.items() if b.tlm is not None}
    x86_union = plans.x86_union if plans.x86_union is not plans.union else None
    manifest = {
        "tlmpack_version": __version__,
        "tvm_version": tvm.__version__,
        "tlm": {t: tlm[t] for t in order if t in tlm} or None,
        "model": first.source.to_json() | {"path": Path(first.source.path).name},
        "build_options": options.to_json(),
        "inputs": [s.to_json() for s in plans.inputs],
        "outputs": [s.to_json() for s in plans.outputs],
        "targets": [built[t].entry for t in order],
    }
    if plans.batched:
        entries = {b: {"batch": b} for b in plans.keys}
        for t, b in built.items():
            for batch, numbers in b.per_plan.items():
                entries[batch][t] = numbers
        for batch in plans.keys:
            entries[batch]["cost"] = {t: built[t].costs[batch] for t in sorted(built)}
        weights = built["cuda" if "cuda" in built else "x86"].weights
        manifest |= {
            "format_version": 3,
            "batch_plans": [entries[b] for b in plans.keys],
            "memory": {"arena_bytes": max(b.entry["arena_bytes"] for b in built.values()), "weights_bytes": len(weights)},
            "plan": {"kernel_calls": sum(len(g.calls) for g in plans.graphs.values()),
                     "tensors": sum(len(g.tensors) for g in plans.graphs.values())},
        }
    else:
        graph = plans.union
        manifest |= {
            "memory": plans.memory,
            "plan": {"kernel_calls": len(graph.calls), "tensors": len(graph.tensors),
                     "padded_matmuls": {"graph": graph.padded_matmuls} | (
                         {"x86": x86_union.padded_matmuls} if x86_union is not None else {})},
        }
    flops = {t: b.flops for t, b in built.items()}
    manifest["subgraphs"] = subgraphs(plans.union, x86_union, {t: b.records for t, b in built.items()}, order, flops)
    manifest["fallbacks"] = [f.to_json() for f in plans.fallbacks]
    return manifest
