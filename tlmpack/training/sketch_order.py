"""Old x86 records' sketch indices in today's order.

Until 2026-12-08 `DesignSpace` let the target choose MetaSchedule's rules. An AVX-512 or VNNI target
adds the int8 dot-product tiling rule, which never applies to our fp32 tasks but lists every
reduction's sketches (and a few matmuls') in the opposite order, so records measured on such a host
numbered the same sketches differently (docs/tvm-0.27-notes.md). Now every x86 target gets the LLVM
rules and AVX2's order. The store stays append-only: records written since carry ``sketch_order``,
and `data/sketch-order/x86.json` maps an older record's index to today's for each (task, CPU,
cores) whose order differed; `Store.records` applies it.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from .store import SKETCH_ORDER, Store, legacy_order_key, sketch_order_path

_INT8_TILING = "MultiLevelTilingWithIntrin"  # the rule an AVX-512/VNNI target added


def _target(cpu: str, cores: int):
    from ..lower.x86 import X86Target

    return X86Target(cpu, cores, ()).tvm_target()  # the record's own CPU: no host check, no features needed


def target_reordered(cpu: str, cores: int) -> bool:
    """Whether MetaSchedule's rules for this CPU (left to the target) held the int8 tiling rule."""
    import tvm
    from tvm import te
    from tvm.s_tir import meta_schedule as ms

    x = te.placeholder((4,), name="x")
    mod = tvm.IRModule({"main": te.create_prim_func([x, te.compute((4,), lambda i: x[i])])})
    context = ms.TuneContext(mod=mod, target=_target(cpu, cores), space_generator="post-order-apply",
                             task_name="probe", num_threads=1)
    return any(_INT8_TILING in str(rule) for rule in context.space_generator.sch_rules)


def _shape(trace) -> str:
    """A sketch's trace without its sampled decisions: what the same sketch has under either order."""
    from tvm.s_tir.schedule import Trace

    return str(Trace(trace.insts, {}))


def old_to_new(func, cpu: str, cores: int) -> list[int]:
    """For each sketch index of the old, target-chosen order, the index of the same sketch today."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from ..schedule.space import DesignSpace, import_tensor_intrinsics

    import_tensor_intrinsics(("x86",))  # the int8 tiling rule of the old order looks them up
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    context = ms.TuneContext(mod=mod, target=_target(cpu, cores), space_generator="post-order-apply",
                             task_name="task", num_threads=1, rand_state=0)
    old = [_shape(s.trace) for s in context.generate_design_space()]
    space = DesignSpace(func, _target(cpu, cores))
    new = [_shape(s.trace) for s in space.sketches[:space.metaschedule_sketches]]
    if sorted(old) != sorted(new) or len(set(new)) != len(new):
        raise ValueError(f"the old and new sketches of {cpu} ({cores} cores) are not one set of distinct sketches")
    return [new.index(shape) for shape in old]


def compute_table(store: Store, say: Callable[[str], None] = print) -> dict:
    """Writes data/sketch-order/x86.json: every (task, CPU, cores) of the x86 records without
    ``sketch_order`` whose CPU's old rules reordered sketches, where the order differed."""
    from .corpus import load_func

    groups = {(r["task"], r["hardware"]["llvm_cpu"], int(r["hardware"]["cores"]))
              for r in store.records("x86") if r.get("sketch_order") != SKETCH_ORDER}
    reordered = {(cpu, cores): target_reordered(cpu, cores) for _, cpu, cores in groups}
    todo = sorted(g for g in groups if reordered[g[1:]])
    table: dict[str, list[int]] = {}
    for i, (task, cpu, cores) in enumerate(todo, 1):
        mapping = old_to_new(load_func(store.task(task)), cpu, cores)
        if mapping != list(range(len(mapping))):
            table[legacy_order_key(task, cpu, cores)] = mapping
        if i % 50 == 0 or i == len(todo):
            say(f"[{i}/{len(todo)}] sketch orders; {len(table)} differ")
    path = sketch_order_path(store.root)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, sort_keys=True, indent=0) + "\n")
    return {"groups": len(groups), "reordering_cpus": sorted({c for (c, _), r in reordered.items() if r}),
            "checked": len(todo), "differ": len(table), "path": str(path)}
