"""CUDA: dlight schedules every task, TVM generates CUDA C for all of them at once, the local nvcc
turns it into one cubin per requested arch plus PTX for the lowest, and the launch sequence of each
task (kernel, grid, block, dynamic shared memory, arguments) is read from TVM's host code.

How launches are found: ``tvm.tirx.build`` runs the default TIR pipeline, splits host from device
and code-generates each side. We run the same pipeline (same passes, same PassContext) with a pass
instrument that keeps the module as it is right after ``tirx.SplitHostDevice``. There each task's
host function still has the task's own buffer parameters, and its body is a flat sequence of
``AllocBuffer`` (global intermediates), ``DeclBuffer`` (aliases and views of parameters) and
``T.call_ffi_kernel(name, args..., dims..., launch_params=[tags])`` statements. The last
``len(launch_params)`` arguments are the launch dimensions (tags ``blockIdx.*``, ``threadIdx.*``
and ``tirx.use_dyn_shared_memory``); the others are the kernel's parameters, in the order of the
generated ``extern "C" __global__`` signature. Anything else in the host code (loops, branches,
scalar lets) is refused with a LoweringError rather than guessed at. The device side is taken
from the end of the pipeline, exactly as ``tvm.compile`` would, and every launch is checked against
the device function of the same name (parameter count and kinds).

What leaves this room is plain data (CudaTarget, Launch, TaskLaunches, CudaKernels).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import LoweringError

DEFAULT_ARCH = "sm_90"
# The hardware limits dlight may plan for: what every sm_70+ GPU gives a block without opt-in.
MAX_SHARED_MEMORY_PER_BLOCK = 48 * 1024
MAX_THREADS_PER_BLOCK = 1024
# Fixed, so the artifact is reproducible; no --use_fast_math (fp32 results must stay within 1e-4).
NVCC_FLAGS = ("-O3", "-std=c++17", "-w")
ASYNC_COPY_MIN_ARCH = 80  # cp.async: sm_80 and later (the PTX is built for the lowest arch)

_ARCH_RE = re.compile(r"^sm_(\d{2,3})$")
_LAUNCH_TAGS = {"blockIdx.x": ("grid", 0), "blockIdx.y": ("grid", 1), "blockIdx.z": ("grid", 2),
                "threadIdx.x": ("block", 0), "threadIdx.y": ("block", 1), "threadIdx.z": ("block", 2)}
_DYN_SMEM_TAG = "tirx.use_dyn_shared_memory"


# ------------------------------------------------------------------------------------------------
# The toolchain and the target
# ------------------------------------------------------------------------------------------------

def find_nvcc() -> str | None:
    """nvcc from $TLMPACK_NVCC, PATH, $CUDA_HOME/bin or /usr/local/cuda/bin; None if there is none."""
    candidates = [os.environ.get("TLMPACK_NVCC"), shutil.which("nvcc")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates.append(str(Path(home) / "bin" / "nvcc"))
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    return None


@lru_cache(maxsize=4)
def _nvcc_info(nvcc: str) -> tuple[str, tuple[str, ...]]:
    """(version "13.0.88", the compute_XX names it can target)."""
    try:
        version_text = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
        arch_text = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise LoweringError(f"{nvcc} does not run: {e}") from None
    m = re.search(r"V(\d+\.\d+\.\d+)", version_text) or re.search(r"release (\d+\.\d+)", version_text)
    if not m:
        raise LoweringError(f"cannot read the CUDA version from `{nvcc} --version`")
    return m.group(1), tuple(arch_text.split())


def arch_number(arch: str) -> int:
    """'sm_90' → 90, 'sm_120' → 120 (major*10+minor, as tlmrt_cuda_image.arch wants it)."""
    m = _ARCH_RE.match(arch)
    if not m:
        raise LoweringError(f"--cuda-arch {arch!r}: expected sm_XX, e.g. sm_80 or sm_90")
    return int(m.group(1))


@dataclass(frozen=True)
class CudaTarget:
    """The GPUs the kernels are built for: a cubin for every arch, PTX for the lowest one."""

    archs: tuple[str, ...]  # sorted by SM number, no duplicates
    nvcc: str
    nvcc_version: str  # "13.0.88"

    @property
    def ptx_arch(self) -> str:
        return self.archs[0]

    @property
    def min_driver_version(self) -> int:
        """The oldest driver (cuDriverGetVersion form) that loads what this nvcc writes (its PTX ISA)."""
        major, minor = (int(x) for x in self.nvcc_version.split(".")[:2])
        return major * 1000 + minor * 10

    def to_json(self) -> dict:
        return {"id": "cuda", "kind": "cuda", "archs": list(self.archs), "ptx": True, "ptx_arch": self.ptx_arch,
                "min_driver_version": self.min_driver_version, "nvcc_version": self.nvcc_version}

    def tvm_target(self):
        """TVM generates code for the lowest arch, so the one source serves every cubin and the PTX."""
        from tvm.target import Target

        return Target({"kind": "cuda", "arch": self.ptx_arch,
                       "max_shared_memory_per_block": MAX_SHARED_MEMORY_PER_BLOCK,
                       "max_threads_per_block": MAX_THREADS_PER_BLOCK},
                      host={"kind": "llvm"})


def cuda_target(archs: Sequence[str] = ()) -> CudaTarget:
    """Validates the requested archs against the local nvcc; refuses what it cannot build."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise LoweringError("the cuda target needs nvcc (CUDA toolkit): not on PATH, $CUDA_HOME/bin or "
                            "/usr/local/cuda/bin (set TLMPACK_NVCC to its path)")
    version, supported = _nvcc_info(nvcc)
    wanted = sorted({a.strip() for a in (archs or (DEFAULT_ARCH,)) if a.strip()}, key=arch_number)
    for arch in wanted:
        if f"compute_{arch_number(arch)}" not in supported:
            raise LoweringError(f"--cuda-arch {arch}: nvcc {version} cannot build it "
                                f"(it knows {', '.join(s.replace('compute_', 'sm_') for s in supported)})")
    if not wanted:
        raise LoweringError("--cuda-arch: no arch given")
    return CudaTarget(tuple(wanted), nvcc, version)


# ------------------------------------------------------------------------------------------------
# Launches: plain data read from TVM's host code
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Workspace:
    """A global buffer a task's host code allocates between its kernels (an arena tensor on the GPU)."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class KernelArg:
    """One kernel parameter. kind: param (the task's index-th buffer parameter), workspace (the
    task's index-th Workspace), int32 / int64 (an immediate ``value``)."""

    kind: str
    index: int = -1
    value: int = 0

    def to_json(self) -> list:
        return [self.kind, self.value if self.kind in ("int32", "int64") else self.index]


@dataclass(frozen=True)
class Launch:
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_smem_bytes: int
    args: tuple[KernelArg, ...]

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "grid": list(self.grid), "block": list(self.block),
                "dynamic_smem_bytes": self.dynamic_smem_bytes, "args": [a.to_json() for a in self.args]}


@dataclass(frozen=True)
class TaskLaunches:
    """What running one task means on the GPU: its launches in order, over its parameters and workspaces."""

    task: str
    launches: tuple[Launch, ...]
    workspaces: tuple[Workspace, ...] = ()

    def to_json(self) -> dict:
        return {"task": self.task, "launches": [x.to_json() for x in self.launches],
                "workspaces": [w.to_json() for w in self.workspaces]}


@dataclass
class CudaKernels:
    """The build's result: CUDA source, launches per task, and the files written (relative names)."""

    source: str
    launches: dict[str, TaskLaunches]
    images: list[tuple[str, str, int]] = field(default_factory=list)  # (file, "cubin" | "ptx", arch number)


def _type_of(expr) -> str:
    """'handle' for pointers, else the scalar dtype ('int32', 'float32', ...)."""
    import tvm

    ty = getattr(expr, "ty", None)
    if isinstance(ty, tvm.ir.PointerType):
        return "handle"
    if isinstance(ty, tvm.ir.PrimType):
        return str(ty.dtype)
    return str(getattr(expr, "dtype", "unknown"))


def _int(expr, what: str) -> int:
    import tvm

    if isinstance(expr, int):
        return expr
    if isinstance(expr, tvm.tirx.IntImm):
        return int(expr.value)
    raise LoweringError(f"{what} is not a constant ({expr}); dynamic launch dimensions are not supported")


class _HostReader:
    """Reads one task's host function (after SplitHostDevice) into a TaskLaunches."""

    def __init__(self, task: str, func) -> None:
        self.task = task
        self.roots: dict[Any, tuple[str, int]] = {}  # buffer Var → ("param", i) | ("workspace", j)
        self.workspaces: list[Workspace] = []
        self.launches: list[Launch] = []
        for i, param in enumerate(func.params):
            self.roots[param] = ("param", i)
        self.stmt(func.body)

    def fail(self, what: str):
        raise LoweringError(f"task {self.task}: cannot read its CUDA launches: {what}")

    def stmt(self, s) -> None:
        from tvm import tirx

        if isinstance(s, tirx.SeqStmt):
            for x in s.seq:
                self.stmt(x)
        elif isinstance(s, tirx.AllocBuffer):
            buf = s.buffer
            scope = buf.scope()
            if scope not in ("global", ""):
                self.fail(f"host code allocates {buf.name} in {scope!r} memory")
            try:
                shape = tuple(int(d) for d in buf.ty.shape)
                dtype = str(buf.ty.dtype)
                np.dtype(dtype)
            except (TypeError, ValueError):
                self.fail(f"intermediate {buf.name} has shape {buf.ty.shape} / dtype {buf.ty.dtype}")
            self.roots[buf] = ("workspace", len(self.workspaces))
            self.workspaces.append(Workspace(buf.name, dtype, shape))
        elif isinstance(s, tirx.DeclBuffer):
            self.roots[s.buffer] = self.root_of(s.data)
        elif isinstance(s, tirx.AttrStmt):
            self.stmt(s.body)
        elif isinstance(s, tirx.Evaluate):
            self.evaluate(s.value)
        else:
            self.fail(f"unexpected {type(s).__name__} in the host code:\n{str(s)[:400]}")

    def root_of(self, data) -> tuple[str, int]:
        import tvm

        if isinstance(data, tvm.ir.expr.Call) and data.op.name == "tirx.buffer_data" and len(data.args) == 1:
            buf = data.args[0]
            for known, root in self.roots.items():
                if known.same_as(buf):
                    return root
            self.fail(f"pointer to an unknown buffer {buf}")
        self.fail(f"a kernel pointer argument that is not a buffer's data: {data}")

    def evaluate(self, value) -> None:
        import tvm
        from tvm import tirx

        if isinstance(value, tirx.IntImm):  # a no-op
            return
        if not (isinstance(value, tvm.ir.expr.Call) and value.op.name == "tirx.call_ffi_kernel"):
            self.fail(f"host code calls {value}")
        tags = [str(t) for t in value.attrs.launch_params]
        name = str(value.args[0].value)
        n_dims = len(tags)
        params, dims = list(value.args[1:len(value.args) - n_dims]), list(value.args[len(value.args) - n_dims:])
        grid, block, smem = [1, 1, 1], [1, 1, 1], 0
        for tag, dim in zip(tags, dims, strict=True):
            extent = _int(dim, f"launch dimension {tag} of {name}")
            if tag == _DYN_SMEM_TAG:
                smem = extent
            elif tag in _LAUNCH_TAGS:
                which, axis = _LAUNCH_TAGS[tag]
                (grid if which == "grid" else block)[axis] = extent
            else:
                self.fail(f"kernel {name} has launch parameter {tag!r}, which the CUDA plan cannot express")
        if min(grid + block) < 1 or smem < 0:
            self.fail(f"kernel {name} launches with grid {grid}, block {block}, shared memory {smem}")
        args = []
        for a in params:
            if isinstance(a, tirx.IntImm):
                dtype = _type_of(a)
                if dtype not in ("int32", "int64"):
                    self.fail(f"kernel {name} takes a {dtype} immediate, which the CUDA plan cannot express")
                args.append(KernelArg(dtype, value=int(a.value)))
            elif isinstance(a, tvm.ir.expr.Call):
                kind, index = self.root_of(a)
                args.append(KernelArg(kind, index=index))
            else:
                self.fail(f"kernel {name} takes argument {a} ({type(a).__name__}), which the CUDA plan cannot express")
        self.launches.append(Launch(name, tuple(grid), tuple(block), smem, tuple(args)))


def _check_against_device(launches: dict[str, TaskLaunches], device_mod) -> None:
    """Each launch must match its device function: same parameter count, pointers where pointers go."""
    device = {gv.name_hint: f for gv, f in device_mod.functions.items()}
    for tl in launches.values():
        for launch in tl.launches:
            func = device.get(launch.kernel)
            if func is None:
                raise LoweringError(f"task {tl.task}: host launches {launch.kernel}, which TVM did not generate")
            if len(func.params) != len(launch.args):
                raise LoweringError(f"task {tl.task}: {launch.kernel} takes {len(func.params)} parameters, "
                                    f"the host passes {len(launch.args)}")
            for p, a in zip(func.params, launch.args, strict=True):
                expected = "handle" if a.kind in ("param", "workspace") else a.kind
                if _type_of(p) != expected:
                    raise LoweringError(f"task {tl.task}: {launch.kernel} parameter {p} ({_type_of(p)}) gets {a.kind}")


def generate(funcs: dict[str, Any], target: CudaTarget) -> tuple[str, dict[str, TaskLaunches]]:
    """All scheduled tasks → one CUDA source and every task's launches (TVM's own pipeline)."""
    import tvm
    from tvm.tirx.build import codegen_build, split_host_device_mods

    from .cuda_alignment import misaligned_accesses

    tvm_target = target.tvm_target()
    mod = tvm.IRModule({task_id: f.with_attr("global_symbol", task_id) for task_id, f in funcs.items()})

    @tvm.ir.instrument.pass_instrument
    class _AfterSplit:
        def __init__(self) -> None:
            self.mod = None

        def run_after_pass(self, mod, info) -> None:
            if info.name == "tirx.SplitHostDevice":
                self.mod = mod

    snapshot = _AfterSplit()
    try:
        # What tvm.tirx.build does, step by step (tvm.compile of a PrimFunc module goes there).
        mod = tvm.tirx.transform.BindTarget(tvm_target)(mod)
        pipeline, _finalize_host, finalize_device = tvm.tirx.get_default_tir_pipeline(tvm_target)
        current = tvm.transform.PassContext.current()
        config = dict(current.config)
        if arch_number(target.ptx_arch) >= ASYNC_COPY_MIN_ARCH:
            # copies in a pipeline's async stage (software_pipeline_async_stages) become cp.async;
            # without this TVM keeps them synchronous and only emits the commit/wait groups
            config.setdefault("tirx.use_async_copy", True)
        with tvm.transform.PassContext(opt_level=current.opt_level, config=config,
                                       instruments=[snapshot]):
            lowered = pipeline(mod)
        _host, device_mods = split_host_device_mods(lowered)
        if len(device_mods) != 1:
            raise LoweringError(f"expected one CUDA device module, TVM made {len(device_mods)}")
        ((device_target, device_mod),) = device_mods.items()
        misaligned = misaligned_accesses(device_mod)
        if misaligned:  # it would fault on the GPU: refused like code TVM cannot generate
            raise RuntimeError(f"{len(misaligned)} misaligned cp.async; {misaligned[0].sentence()}")
        device_mod = finalize_device()(device_mod)
        source = codegen_build(device_mod, device_target).inspect_source("")
    except LoweringError:
        raise
    except Exception as e:
        raise LoweringError(f"TVM failed to build the CUDA kernels: {type(e).__name__}: {e}") from None
    if snapshot.mod is None:
        raise LoweringError("TVM's TIR pipeline has no tirx.SplitHostDevice pass: cannot read the launches")
    split = snapshot.mod
    launches = {}
    for task_id in funcs:
        reader = _HostReader(task_id, split[task_id])
        launches[task_id] = TaskLaunches(task_id, tuple(reader.launches), tuple(reader.workspaces))
        if not launches[task_id].launches:
            raise LoweringError(f"task {task_id}: TVM's host code launches no kernel")
    _check_against_device(launches, device_mod)
    return source, launches


# ------------------------------------------------------------------------------------------------
# nvcc
# ------------------------------------------------------------------------------------------------

def _nvcc_jobs(target: CudaTarget) -> list[tuple[str, list[str], str, int]]:
    """(file, command, kind, arch) for every image: a cubin per arch, then PTX for the lowest."""
    jobs = [(f"{arch}.cubin", [target.nvcc, *NVCC_FLAGS, "-cubin", f"-arch={arch}", "-o", f"{arch}.cubin",
                               "kernels.cu"], "cubin", arch_number(arch)) for arch in target.archs]
    low = arch_number(target.ptx_arch)
    jobs.append(("kernels.ptx", [target.nvcc, *NVCC_FLAGS, "-ptx", f"-arch=compute_{low}", "-o", "kernels.ptx",
                                 "kernels.cu"], "ptx", low))
    return jobs


def compile_source(source: str, target: CudaTarget, out_dir: Path) -> list[tuple[str, str, int]]:
    """kernels.cu → <arch>.cubin for each arch and kernels.ptx, in ``out_dir`` (nvcc jobs in parallel;
    the source is compiled under a fixed relative name so the bytes do not depend on the folder)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "kernels.cu").write_text(source)
    jobs = _nvcc_jobs(target)

    def run(job):
        _, cmd, _, _ = job
        return subprocess.run(cmd, cwd=out_dir, capture_output=True, text=True)

    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        results = list(pool.map(run, jobs))
    for (file, cmd, _, _), result in zip(jobs, results, strict=True):
        if result.returncode != 0:
            raise LoweringError(f"nvcc failed building {file} ({' '.join(cmd[1:])}):\n"
                                f"{result.stderr.strip()[-2000:]}")
    return [(file, kind, arch) for file, _, kind, arch in jobs]


def build_kernels(funcs: dict[str, Any], target: CudaTarget, out_dir: Path,
                  progress: Callable[[str], None] | None = None) -> CudaKernels:
    """Scheduled tasks → CUDA source, cubins and PTX in ``out_dir``, and the launches of every task."""
    started = time.perf_counter()
    source, launches = generate(funcs, target)
    n = sum(len(t.launches) for t in launches.values())
    if progress:
        progress(f"TVM generated CUDA for {len(funcs)} tasks ({n} kernels) in {time.perf_counter() - started:.1f} s; "
                 f"nvcc {target.nvcc_version}: {', '.join(target.archs)} cubin + {target.ptx_arch} PTX")
    started = time.perf_counter()
    images = compile_source(source, target, out_dir)
    if progress:
        progress(f"nvcc took {time.perf_counter() - started:.1f} s")
    return CudaKernels(source, launches, images)
