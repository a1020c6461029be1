"""The build: model → Relax → tasks → schedules → kernels → plan → the .tar artifact.

Drives the rooms in order (frontend, graph, schedule, lower, emit), each called once with plain
records; no stage calls back up.
"""

from __future__ import annotations

import dataclasses
import gc
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import __version__
from .emit.manifest import write_manifest
from .emit.package import add_runtime, choose_summary, link_cuda_plan, link_model_library, subgraphs
from .emit.plan_c import render_plan
from .emit.tarball import write_reproducible_tar
from .errors import LoweringError
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
    # Dynamic batch (build_batch.py): one plan per listed batch size; empty: the model's own shapes.
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


def _build_cuda(stage: Path, graph, imported, cuda, say: Callable[[str], None],
                options: BuildOptions) -> tuple[dict, list, dict | None, list]:
    """Schedules (dlight), generates and compiles the CUDA kernels, renders and links the plan.
    Returns the manifest's target entry, the schedule records, the TLM that chose and the fallbacks."""
    from .emit.cuda_plan import render_cuda_plan
    from .graph_fallbacks import cuda_kernels_with_fallback
    from .schedule.select import SelectOptions, schedule_cuda_tasks, scheduler_for

    cuda_scheduler = scheduler_for("cuda", options.scheduler)
    say(f"scheduling {len(graph.tasks)} tasks for CUDA ({', '.join(cuda.archs)}) with {cuda_scheduler}")
    funcs, records, tlm = schedule_cuda_tasks(graph, cuda, say,
                                              scheduler=SelectOptions(cuda_scheduler, 0, _tlm_weights(options)))
    nvcc_dir = stage.parent / "nvcc"
    kernels, records, fallbacks = cuda_kernels_with_fallback(funcs, records, graph, cuda, nvcc_dir, say)
    (stage / "cuda").mkdir()
    for name in ["kernels.cu", *(file for file, _, _ in kernels.images)]:
        shutil.copy(nvcc_dir / name, stage / "cuda" / name)
    plan = render_cuda_plan(graph, kernels, cuda, imported.inputs, imported.outputs, imported.source.name,
                            __version__)
    link_cuda_plan(stage, plan.c_source)
    files = ["cuda/plan.so", *(f"cuda/{file}" for file, _, _ in kernels.images), "cuda/kernels.cu"]
    say(f"CUDA plan: {plan.num_launches} launches, device arena {plan.arena_bytes / 2**20:.1f} MiB "
        f"(workspace {plan.workspace_bytes / 2**10:.1f} KiB)")
    entry = cuda.to_json() | {"files": files, "launches": plan.num_launches, "arena_bytes": plan.arena_bytes,
                              "workspace_bytes": plan.workspace_bytes}
    return entry, records, tlm, fallbacks


def _unseen_by_tlm(conv_layout: str | None) -> tuple[tuple[str, str], ...]:
    """What the x86 TLM has not been trained on in the form this build compiles it: its corpus's
    convolutions are all NCHW, and its picks for channels-last ones were up to 12x slower than the
    rules' (ResNet-50, BENCHMARKS.md 2026-12-01)."""
    if conv_layout == "NHWC":
        return (("conv2d", "channels-last convolution (the training data has NCHW ones only)"),)
    return ()


def pad_policy(options: BuildOptions, targets: tuple[str, ...]):
    """How awkward matmul extents are padded for a graph shared by ``targets`` (relax_rewrites.py),
    or None with --no-pad-extents."""
    if not options.pad_extents:
        return None
    from .lower.x86 import x86_target
    from .relax_rewrites import policy_for
    from .schedule.hardware import detect_x86

    lanes = detect_x86(x86_target(options.cpu, options.cores).features, options.cores,
                       options.cache_kib).lanes(32) if "x86" in options.targets else 8
    return policy_for(targets, lanes)


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


def _build(model: str, out: Path, options: BuildOptions, say: Callable[[str], None]) -> dict:
    """build(), its switches decided and applied."""
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
    if options.batches:
        from .build_batch import build_batched

        return build_batched(model, out, options, say, started)

    import tvm

    from .emit.x86_weights import pack_graph
    from .frontend import load_model
    from .graph import has_conv2d
    from .graph_fallbacks import Fallback, Lowering, lower_graph, x86_kernels_with_fallback
    from .lower.prepack import Packer
    from .lower.x86 import x86_target
    from .schedule.hardware import detect_x86
    from .schedule.select import SelectOptions, schedule_tasks, scheduler_for

    say(f"loading {model}")
    imported = load_model(model, options.input_shapes)
    say("lowering to fused TIR (Relax LegalizeOps, FuseOps, FuseTIR)")
    # x86 heuristics run convolutions channels-last (a conv becomes a GEMM over output channels);
    # CUDA keeps the model's layout. With both targets the x86 plan has its own graph and weights.
    x86_layout = ("NHWC" if "x86" in options.targets and scheduler_for("x86", options.scheduler) in ("tlm", "heuristic")
                  and has_conv2d(imported.mod) else None)
    # Every optional transformation falls back (graph_fallbacks.py); the manifest lists what fell back.
    fallbacks: list = [Fallback("opset-upgrade", "graph", note) for note in imported.notes]
    for fallback in fallbacks:
        say(fallback.sentence())
    # Awkward matmul extents are padded to what the graph's targets prefer (x86 vectors, CUDA warps).
    graph = None
    if cuda is not None or x86_layout is None:
        pad = pad_policy(options, options.targets if x86_layout is None else ("cuda",))
        graph, _, taken = lower_graph(imported.mod, Lowering(None, options.fast_math, pad=pad), say=say)
        fallbacks += taken
    x86_source = graph if x86_layout is None else None
    layout_ops = False  # layout_ops.py's rewrites, on the channels-last path only
    if x86_layout is not None:
        say(f"lowering for x86 with {x86_layout} convolutions")
        pad = pad_policy(options, ("x86",))
        x86_source, used, taken = lower_graph(imported.mod, Lowering(x86_layout, options.fast_math, pad=pad),
                                              task_prefix="x" if graph is not None else "k", say=say)
        fallbacks += [dataclasses.replace(f, scope="x86 graph") for f in taken]
        x86_layout, layout_ops = used.conv_layout, used.layout_ops and used.conv_layout is not None
        graph = graph or x86_source
    say(f"{len(graph.calls)} kernel calls, {len(graph.tasks)} distinct tasks, "
        f"arena {graph.arena_bytes / 2**20:.1f} MiB, weights {len(graph.weights) / 2**20:.1f} MiB")
    # The graphs' weight blobs hold the constants now; the Relax module's copy goes (the lowering
    # fallbacks above retried from it, nothing after needs it; a 2 GiB model was held twice to the end).
    imported.mod = None
    gc.collect()  # TVMScript's parser keeps the stack's frames in cycles (inspect.stack()): they hold graphs
    memory = graph.memory_json()

    with tempfile.TemporaryDirectory(prefix="tlmpack-build-") as tmp:
        stage = Path(tmp) / "artifact"
        stage.mkdir(parents=True)
        target_entries: dict[str, dict] = {}
        records_by_target: dict[str, dict] = {}
        tlm_models: dict[str, dict] = {}
        if cuda is not None:
            entry, records, tlm_cuda, taken = _build_cuda(stage, graph, imported, cuda, say, options)
            fallbacks += taken
            if tlm_cuda is not None:
                tlm_models["cuda"] = tlm_cuda
            target_entries["cuda"] = entry
            records_by_target["cuda"] = {r.task: r for r in records}
        x86_weights = graph.weights
        if "x86" in options.targets:
            target = x86_target(options.cpu, options.cores)
            hardware = detect_x86(target.features, options.cores, options.cache_kib)
            say(f"scheduling {len(x86_source.tasks)} tasks for x86 ({target.cpu}, scheduler="
                f"{scheduler_for('x86', options.scheduler)})")
            scheduled = schedule_tasks(x86_source, target.tvm_target(), "x86",
                                       SelectOptions(scheduler_for("x86", options.scheduler), options.tune, _tlm_weights(options),
                                                     _unseen_by_tlm(x86_layout)),
                                       hardware.lanes(32), say,
                                       hardware)
            if scheduled.tlm is not None:
                tlm_models["x86"] = scheduled.tlm
            fallbacks += scheduled.fallbacks
            (stage / "x86").mkdir()
            say("building x86 kernels with LLVM")
            kernels_object = Path(tmp) / "kernels.o"
            # before pre-packing: a task whose kernel does not compile loses its packed weight
            fallbacks += x86_kernels_with_fallback(scheduled, x86_source, target, kernels_object,
                                                   hardware.lanes(32), say)
            x86_graph = x86_source
            if scheduled.splits:
                say(f"pre-packing the constants of {len(scheduled.splits)} tasks for their x86 kernels")
                x86_graph = pack_graph(x86_source, scheduled.splits, Packer().pack)
                if cuda is None:  # the plain constants were the packing's input only: let them go
                    graph = x86_source = dataclasses.replace(x86_source, weights=b"")
                    gc.collect()
            plan = render_plan(x86_graph, imported.inputs, imported.outputs, imported.source.name, __version__,
                               target.features)
            link_model_library(stage, plan, kernels_object)
            x86_weights = x86_graph.weights
            files = ["x86/model.so"]
            if cuda is not None and x86_weights != graph.weights:
                (stage / "x86" / "weights.bin").write_bytes(x86_weights)  # the runtime's x86 backend prefers it
                files.append("x86/weights.bin")
            target_entries["x86"] = target.to_json() | {
                "hardware": hardware.to_json(), "files": files, "weights_bytes": len(x86_weights),
                "arena_bytes": x86_graph.arena_bytes, "conv_layout": x86_layout or "model",
                "layout_ops": layout_ops}
            records_by_target["x86"] = {r.task: r for r in scheduled.records}
            say(choose_summary(scheduled))
        # weights.bin: the CUDA plan's constants; in an x86-only build, the x86 plan's (maybe packed)
        (stage / "weights.bin").write_bytes(graph.weights if cuda is not None else x86_weights)
        add_runtime(stage)
        order = [t for t in TARGET_ORDER if t in target_entries]
        manifest = {
            "tlmpack_version": __version__,
            "tvm_version": tvm.__version__,
            "tlm": tlm_models or None,
            "model": imported.source.to_json() | {"path": Path(imported.source.path).name},
            "build_options": options.to_json(),
            "inputs": [s.to_json() for s in imported.inputs],
            "outputs": [s.to_json() for s in imported.outputs],
            "targets": [target_entries[t] for t in order],
            "memory": memory,
            "plan": {"kernel_calls": len(graph.calls), "tensors": len(graph.tensors),
                     "padded_matmuls": {"graph": graph.padded_matmuls} | (
                         {"x86": x86_source.padded_matmuls} if x86_source is not None and x86_source is not graph else {})},
            "subgraphs": subgraphs(graph, x86_source, records_by_target, order),
            "fallbacks": [f.to_json() for f in fallbacks],
        }
        write_manifest(stage, manifest)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_reproducible_tar(stage, out)
    say(f"wrote {out} in {time.perf_counter() - started:.1f} s")
    return manifest
