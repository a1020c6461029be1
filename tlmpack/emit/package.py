"""Assembling an artifact: linking the generated plans, adding the C runtime, and what the
manifest says of every subgraph. tlmpack/build.py drives the stages and calls these."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from .._paths import RUNTIME_C_DIR
from ..errors import LoweringError


def _run(cmd: list[str], cwd: Path, what: str) -> None:
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise LoweringError(f"{what} failed ({' '.join(cmd[:3])} …):\n{result.stderr.strip()[-2000:]}")


def _plan_sources(build: Path, stem: str, plan_c: str | list[str]) -> list[str]:
    """Writes the plan's C file(s): one, or one per batch plan (plan.c, plan_1.c, ...)."""
    sources = [plan_c] if isinstance(plan_c, str) else plan_c
    names = [f"{stem}.c" if i == 0 else f"{stem}_{i}.c" for i in range(len(sources))]
    for name, text in zip(names, sources, strict=True):
        (build / name).write_text(text)
    return names


def link_model_library(stage: Path, plan_c: str | list[str], kernels_object: Path) -> None:
    """plan.c (or one C file per batch plan) + the kernels' object → x86/model.so, deterministically."""
    x86 = stage / "x86"
    build = stage.parent / "build"
    build.mkdir(exist_ok=True)
    names = _plan_sources(build, "plan", plan_c)
    shutil.copy(RUNTIME_C_DIR / "tlmrt_plan.h", build / "tlmrt_plan.h")
    shutil.copy(kernels_object, build / "kernels.o")
    cmd = ["cc", "-std=c11", "-O2", "-fPIC", "-shared", "-I.", "-ffile-prefix-map=.=.", "-Wl,--build-id=none", "-Wl,-Bsymbolic",
           "-Wl,-soname,model.so", "-o", str(x86 / "model.so"), *names, "kernels.o", "-lm"]
    _run(cmd, build, "linking x86/model.so")


def link_cuda_plan(stage: Path, plan_c: str | list[str]) -> None:
    """cuda_plan.c (or one per batch plan) → cuda/plan.so: a host library holding only the CUDA plan's C data."""
    build = stage.parent / "build-cuda"
    build.mkdir(exist_ok=True)
    names = _plan_sources(build, "cuda_plan", plan_c)
    shutil.copy(RUNTIME_C_DIR / "tlmrt_plan.h", build / "tlmrt_plan.h")
    cmd = ["cc", "-std=c11", "-O2", "-fPIC", "-shared", "-I.", "-ffile-prefix-map=.=.", "-Wl,--build-id=none", "-Wl,-Bsymbolic",
           "-Wl,-soname,plan.so", "-o", str(stage / "cuda" / "plan.so"), *names]
    _run(cmd, build, "linking cuda/plan.so")


def subgraphs(graph, x86_graph, records_by_target: dict, order: list[str], flops_by_target: dict) -> list[dict]:
    """Every task with its schedule on each target that runs it (the x86 graph may be its own), and
    the FLOPs and bytes of one call (the arithmetic intensity `tlmpack bench --profile` shows)."""
    from ..schedule.estimate import task_bytes

    def entry(g, task, targets: list[str]) -> dict:
        flops = flops_by_target[targets[0]].get(task.id)
        work = {"flops": flops} if flops else {}
        return task.to_json() | work | {"bytes": nbytes[id(g)].get(task.id, 0),
                                        "schedules": [records_by_target[k][task.id].to_json() for k in targets]}

    nbytes = {id(g): task_bytes(g) for g in (graph, x86_graph) if g is not None}
    if x86_graph is None or x86_graph is graph:
        return [entry(graph, t, order) for t in graph.tasks]
    out = [entry(graph, t, [k for k in order if k != "x86"]) for t in graph.tasks if "cuda" in order]
    return out + [entry(x86_graph, t, ["x86"]) for t in x86_graph.tasks]


def choose_summary(scheduled) -> str:
    """One line: who chose, and what choosing cost (classify + rule, without TVM's replay)."""
    counts: dict[str, int] = {}
    for r in scheduled.records:
        counts[r.chosen_by] = counts.get(r.chosen_by, 0) + 1
    choose = list(scheduled.choose_ms.values())
    total = list(scheduled.total_ms.values())
    line = "x86 schedules: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    if choose:
        line += f"; choosing {sum(choose) / len(choose):.1f} ms mean, {max(choose):.1f} ms max per task"
    if total:
        line += f" (with design space + replay {sum(total) / len(total):.0f} ms mean, {max(total):.0f} ms max)"
    return line


def add_runtime(stage: Path) -> None:
    """The runtime's sources, the public header, and a prebuilt library for hosts like this one."""
    sources = stage / "runtime_c"
    sources.mkdir()
    for path in sorted(RUNTIME_C_DIR.iterdir()):
        if path.suffix in (".c", ".h") or path.name == "build.sh":
            shutil.copy(path, sources / path.name)
    (stage / "include").mkdir()
    shutil.copy(RUNTIME_C_DIR / "tlmrt.h", stage / "include" / "tlmrt.h")
    _run(["bash", "runtime_c/build.sh", "runtime_c"], stage, "building the C runtime")
