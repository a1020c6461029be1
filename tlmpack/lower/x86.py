"""x86: TVM's LLVM backend turns every scheduled task into one object file of packed functions."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import LoweringError

# LLVM feature names → /proc/cpuinfo flags, for the vector ISA the kernels may use.
_CPUINFO_FLAG = {
    "sse4.1": "sse4_1", "sse4.2": "sse4_2", "avx": "avx", "avx2": "avx2", "fma": "fma", "f16c": "f16c",
    "avx512f": "avx512f", "avx512bw": "avx512bw", "avx512dq": "avx512dq", "avx512vl": "avx512vl",
    "avx512cd": "avx512cd", "avx512vnni": "avx512_vnni", "avxvnni": "avx_vnni", "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16", "amx-tile": "amx_tile",
}


@dataclass(frozen=True)
class X86Target:
    """The CPU the kernels are built for. ``cpu`` is an LLVM CPU name (default: the build host's)."""

    cpu: str
    num_cores: int
    features: tuple[str, ...]  # /proc/cpuinfo flag names the code may use

    def to_json(self) -> dict:
        return {"id": "x86", "kind": "x86", "cpu": self.cpu, "cpu_features": list(self.features)}

    def tvm_target(self):
        import tvm

        return tvm.target.Target({"kind": "llvm", "mcpu": self.cpu, "num-cores": self.num_cores})


def host_cpu() -> str:
    """LLVM's name of the build host's CPU."""
    import tvm

    return tvm.target.codegen.llvm_get_system_cpu()


def x86_target(cpu: str | None = None, num_cores: int | None = None) -> X86Target:
    """Describes the target CPU; refuses names LLVM does not know."""
    import os

    import tvm

    host = host_cpu()
    cpu = cpu or host
    if cpu != host and not tvm.target.codegen.llvm_is_valid_cpu(cpu, tvm.target.codegen.llvm_get_system_triple()):
        raise LoweringError(f"--cpu {cpu!r}: LLVM does not know this CPU (the build host is {host!r})")
    target = tvm.target.Target({"kind": "llvm", "mcpu": cpu, "num-cores": num_cores or os.cpu_count() or 1})
    llvm_features = set(tvm.target.codegen.llvm_get_cpu_features(target))
    features = tuple(sorted(flag for name, flag in _CPUINFO_FLAG.items() if name in llvm_features))
    return X86Target(cpu, int(target.attrs["num-cores"]), features)


def compile_kernels(funcs: dict[str, Any], tvm_target) -> Any:
    """TVM's executable of the scheduled ``funcs``, each exported under its key. Every x86 kernel,
    a build's, a tuner's candidate or a dataset program, goes through here, so what is timed is
    what is shipped: the epilogue prefetches (x86_prefetch.py) are added on the way, and a kernel
    without a parallel loop runs its large element-wise tail on every thread (x86_serial_tails.py)."""
    import tvm

    from .x86_prefetch import prefetch_epilogue_lines
    from .x86_serial_tails import parallel_serial_tails

    mod = tvm.IRModule({name: parallel_serial_tails(prefetch_epilogue_lines(f)).with_attr("global_symbol", name)
                        for name, f in funcs.items()})
    return tvm.compile(mod, target=tvm_target)


def build_kernels(funcs: dict[str, Any], target: X86Target, out_object: Path) -> list[str]:
    """Compiles all tasks into one object file; returns the exported symbol of each task, in order."""
    try:
        executable = compile_kernels(funcs, target.tvm_target())
    except Exception as e:
        raise LoweringError(f"TVM failed to build the x86 kernels: {type(e).__name__}: {e}") from None
    executable.mod.write_to_file(str(out_object))
    return [f"__tvm_ffi_{task_id}" for task_id in funcs]
