"""What kind of kernel a task is, read from its TIR loop nest and data flow.

(TVM 0.27: loads are tvm.ir.expr.TensorLoad with .source for the buffer; arithmetic nodes are in
tvm.ir.prim.expr.)

matmul  — a reduction block computing C += A * B over two different inputs (dense, batch matmul,
          conv2d): its spatial and reduction loops, and for each input the loops it does not
          depend on (where it is reused)
reduce  — another reduction (sum, max, mean, softmax's pieces): row length and number of rows
pointwise — every block injective (elementwise, broadcast, transpose, pad, ...)
other   — anything else
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class TaskClass:
    kind: str  # matmul | reduce | pointwise | other
    block: str = ""  # the main block's name
    spatial: tuple[int, ...] = ()  # extents of the main block's spatial loops, in order
    reduction: tuple[int, ...] = ()  # extents of its reduction loops
    reuse: dict[str, tuple[int, ...]] = field(default_factory=dict)  # input → indices of spatial loops it ignores
    # elements the task writes / elements the main block computes: > 1 when an epilogue broadcasts
    # the result (squeeze-excite: a 1x1 conv's 480 values scale a 480x14x14 tensor, 196)
    epilogue_growth: int = 1
    # the epilogue writes fewer elements than the main block computes: it slices off the rows or
    # columns that relax_rewrites.pad_awkward_extents padded (GPT-2's LM head: 132 x 50272 -> 128 x 50257)
    epilogue_drops: bool = False

    @property
    def rows(self) -> int:
        return math.prod(self.spatial)

    @property
    def row_length(self) -> int:
        return math.prod(self.reduction)

    def to_json(self) -> dict:
        return asdict(self) | {"spatial": list(self.spatial), "reduction": list(self.reduction),
                               "reuse": {k: list(v) for k, v in self.reuse.items()}}


def buffer_loads(expr, through_calls: bool = False) -> list:
    """Buffer loads in an expression, outermost first. ``through_calls``: also inside calls and
    selects (an epilogue's clip or sigmoid); the multiply-accumulate test looks at operands only."""
    from tvm.ir import expr as E
    from tvm.ir.prim import expr as P

    if isinstance(expr, E.TensorLoad):
        return [expr]
    children = [getattr(expr, name, None) for name in ("a", "b", "value")]
    if through_calls and isinstance(expr, E.Call):
        children += list(expr.args)
    if through_calls and isinstance(expr, P.Select):
        children += [expr.condition, expr.true_value, expr.false_value]
    found = []
    for child in children:
        if child is not None and not isinstance(child, int | float):
            try:
                found.extend(buffer_loads(child, through_calls))
            except TypeError:
                pass
    return found


def _is_multiply_accumulate(block) -> tuple[bool, list]:
    """C[...] = C[...] + A[...] * B[...] (casts allowed) with A and B different buffers."""
    from tvm.ir import expr as E
    from tvm.ir.prim import expr as P
    from tvm.tirx import stmt as S

    store = block.body
    if not isinstance(store, S.BufferStore) or not isinstance(store.value, P.Add):
        return False, []
    add = store.value
    for accumulated, update in ((add.a, add.b), (add.b, add.a)):
        while isinstance(update, P.Cast):
            update = update.value
        if (isinstance(accumulated, E.TensorLoad) and accumulated.source.same_as(store.buffer)
                and isinstance(update, P.Mul)):
            operands = buffer_loads(update)
            if len(operands) == 2 and not operands[0].source.same_as(operands[1].source):
                return True, operands
    return False, []


def classify(func) -> TaskClass:
    """Classifies a PrimFunc (an unscheduled tlmpack task)."""
    from tvm import s_tir, tirx

    sch = s_tir.Schedule(func)
    try:
        blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    except Exception:  # no root block or nested blocks the schedule cannot list
        return TaskClass("other")
    if not blocks:
        return TaskClass("other")
    reductions = [b for b in blocks if any(v.iter_type == tirx.IterVar.CommReduce for v in b.iter_vars)]
    if not reductions:
        return TaskClass("pointwise", blocks[-1].name_hint,
                         spatial=tuple(int(v.dom.extent) for v in blocks[-1].iter_vars))
    main = max(reductions, key=lambda b: math.prod(int(v.dom.extent) for v in b.iter_vars))
    spatial_vars = [v for v in main.iter_vars if v.iter_type == tirx.IterVar.DataPar]
    spatial = tuple(int(v.dom.extent) for v in spatial_vars)
    reduction = tuple(int(v.dom.extent) for v in main.iter_vars if v.iter_type == tirx.IterVar.CommReduce)
    is_mac, operands = _is_multiply_accumulate(main)
    if not is_mac:
        return TaskClass("reduce", main.name_hint, spatial, reduction)
    reuse = {}
    for load in operands:
        used = set()
        for index in load.indices:
            used.update(v.name for v in tirx.analysis.undefined_vars(index))
        reuse[load.source.name] = tuple(i for i, v in enumerate(spatial_vars) if v.var.name not in used)
    last = blocks[-1]  # where the task's output is written: an epilogue, or the main block itself
    written = math.prod(int(v.dom.extent) for v in last.iter_vars if v.iter_type == tirx.IterVar.DataPar)
    growth = max(written // max(math.prod(spatial), 1), 1)
    return TaskClass("matmul", main.name_hint, spatial, reduction, reuse, growth, written < math.prod(spatial))
