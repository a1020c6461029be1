"""TVM dlight's default GPU rules: the CUDA scheduler of the first release (``--scheduler
baseline``), and the fallback for tasks no CUDA heuristic rule fits."""

from __future__ import annotations

from typing import Any


def dlight_rules() -> list:
    from tvm.s_tir import dlight as dl

    # The order of relax.backend.cuda's default pipeline.
    return [dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()]


def dlight_schedule(func, tvm_target) -> tuple[Any, str, list[str]]:
    """(scheduled PrimFunc or None, the rule's name, why the rules that matched gave up)."""
    from tvm import s_tir

    failures = []
    for rule in dlight_rules():
        try:
            with tvm_target:
                space = rule.apply(func, tvm_target, False)
        except Exception as e:  # a rule that matched but could not finish: try the next one
            failures.append(f"{type(rule).__name__}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
            continue
        if space is None:
            continue
        sch = space[0] if isinstance(space, list) else space
        if isinstance(sch, s_tir.Schedule):
            return sch.mod["main"], type(rule).__name__, failures
    return None, "", failures
