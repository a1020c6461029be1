"""Views around matmuls folded away (Relax rewrites): row reshapes of 2-D products, and
attention's head transposes folded into the batch matmuls around them.

A transformer splits its projections into heads with ``reshape`` (a view) then ``permute_dims``
([b, s, h, d] -> [b, h, s, d]), multiplies per head, and merges the heads back with the inverse
permute before the output projection. Each permute is a kernel of its own: TVM's FuseOps fuses no
injective producer into a matmul and no injective consumer after one, so BERT-base at batch 16
spent 0.46 ms a run in them on the H200 (BENCHMARKS.md, 2026-12-01 22:30). Here a matmul whose
operand is such a permute (used by nothing else) reads the un-permuted tensor through the
permuted index instead, and a matmul whose one user is such a permute writes its product in the
permuted layout directly; the permutes become dead code.

Row reshapes first: GPT-2's Conv1D is exported as Reshape → Gemm → Reshape, and the reshape after the
2-D product splits the GEMM from the element-wise ops after it (a tanh-GELU, a residual add). A
``reshape(matmul(p, W) [+ bias])`` that only splits the product's rows becomes the batched
``matmul(reshape(p), W) [+ bias]`` (``lift_matmul_reshapes``), which FuseOps fuses with its tail.

Only permutes that keep the tensor's last axis last are folded: the matmul's operand tiles then
stay rows of contiguous words, as they were. K's (0, 2, 3, 1) of Q K^T, which makes the reduction
axis the contiguous one, stays a kernel. Static 4-D float32 shapes only; the batch axes of the two
operands must agree (no broadcast).
"""

from __future__ import annotations

import math
from typing import Any

from .relax_rewrites import static_shape, users_of


def _axes(call, rank: int) -> list[int]:
    return list(range(rank))[::-1] if call.attrs.axes is None else [int(a) for a in call.attrs.axes]


def _is_op(value, name: str) -> bool:
    import tvm

    return isinstance(value, tvm.relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name == name


def _foldable_permute(value) -> bool:
    """A 4-D float32 permute_dims that keeps the last axis last."""
    if not _is_op(value, "relax.permute_dims"):
        return False
    shape = static_shape(value.args[0].ty)
    if shape is None or len(shape) != 4 or str(value.args[0].ty.dtype) != "float32":
        return False
    return _axes(value, 4)[-1] == 3


def _matmul_te(a_src, a_axes, b_src, b_axes, out_axes, out_dtype: str):
    """A TE function for ``emit_te``: permute(matmul(permute(a_src, a_axes), permute(b_src, b_axes)), out_axes)
    with every permute an index map, None axes meaning identity."""
    from tvm import te

    def read(src, axes, idx):
        if axes is None:
            return src[tuple(idx)]
        at = [None] * len(idx)
        for i, a in enumerate(axes):
            at[a] = idx[i]
        return src[tuple(at)]

    def shape_of(src, axes):
        shape = [int(d) for d in src.shape]
        return shape if axes is None else [shape[a] for a in axes]

    a_shape, b_shape = shape_of(a_src, a_axes), shape_of(b_src, b_axes)
    k = te.reduce_axis((0, a_shape[-1]), name="k")
    product = [*a_shape[:-1], b_shape[-1]]
    final = product if out_axes is None else [product[a] for a in out_axes]

    def body(*f):
        if out_axes is None:
            o = list(f)
        else:
            o = [None] * len(f)
            for i, a in enumerate(out_axes):
                o[a] = f[i]
        *batch, m, n = o
        return te.sum(read(a_src, a_axes, [*batch, m, k]).astype(out_dtype)
                      * read(b_src, b_axes, [*batch, k, n]).astype(out_dtype), axis=k)

    return te.compute(final, body, name="matmul")


def fold_transposes_into_matmuls(mod) -> tuple[Any, int]:
    """(``mod`` with head transposes folded into the matmuls around them, how many permutes went)."""
    from tvm.relax.expr_functor import PyExprMutator, mutator

    main = mod["main"]
    users = users_of(main)
    bound = _bindings(main)

    def only_user(var, value) -> bool:
        return _only_user(users, var, value)

    def operand(matmul, i):
        """(source, axes) of matmul's operand i: the permute's input where it folds, else itself."""
        arg = matmul.args[i]
        value = bound.get(arg)
        if value is not None and _foldable_permute(value) and only_user(arg, matmul):
            return value.args[0], _axes(value, 4)
        return arg, None

    def foldable_matmul(value) -> bool:
        if not _is_op(value, "relax.matmul"):
            return False
        shapes = [static_shape(a.ty) for a in value.args]
        out = static_shape(value.ty)
        return (all(s is not None and len(s) == 4 for s in shapes) and out is not None and len(out) == 4
                and shapes[0][:2] == shapes[1][:2] and str(value.ty.dtype) == "float32")

    folded = [0]

    @mutator
    class _Fold(PyExprMutator):
        def _emit(self, matmul, out_axes):
            (a, pa), (b, pb) = operand(matmul, 0), operand(matmul, 1)
            if pa is None and pb is None and out_axes is None:
                return None
            folded[0] += (pa is not None) + (pb is not None) + (out_axes is not None)
            a, b = self.visit_expr(a), self.visit_expr(b)
            return self.builder_.call_te(_matmul_te, a, pa, b, pb, out_axes, str(matmul.ty.dtype),
                                         primfunc_name_hint="matmul")

        def visit_call_(self, call):
            if foldable_matmul(call):
                user = users.get(self._var_of(call))
                if user and len(user) == 1 and _foldable_permute(user[0]):
                    return super().visit_call_(call)  # its user's rewrite below writes it permuted; this dies
                emitted = self._emit(call, None)
                return super().visit_call_(call) if emitted is None else emitted
            if _foldable_permute(call):
                source = call.args[0]
                matmul = bound.get(source)
                if matmul is not None and foldable_matmul(matmul) and only_user(source, call):
                    emitted = self._emit(matmul, _axes(call, 4))
                    return super().visit_call_(call) if emitted is None else emitted
            return super().visit_call_(call)

        def _var_of(self, value):
            return next((v for v, x in bound.items() if x.same_as(value)), None)

    return _rewritten(mod, _Fold(mod), folded)


def _rewritten(mod, mutator, count: list[int]) -> tuple[Any, int]:
    """(``mod`` with ``main`` as ``mutator`` rewrites it and what became dead dropped, ``count[0]``);
    ``mod`` itself when nothing was rewritten."""
    from tvm import relax

    new_main = mutator.visit_expr(mod["main"])
    if not count[0]:
        return mod, 0
    mutator.builder_.update_func(mod.get_global_var("main"), new_main)
    return relax.transform.DeadCodeElimination(["main"])(mutator.builder_.get()), count[0]


def _bindings(main) -> dict[Any, Any]:
    """Relax var -> the value bound to it, over main's blocks."""
    return {b.var: b.value for block in main.body.blocks for b in block.bindings}


def _only_user(users: dict, var, value) -> bool:
    """Whether ``value`` is the one use of ``var``."""
    return len(users.get(var, [])) == 1 and users[var][0].same_as(value)


def _reshape_source(value, bound: dict) -> Any:
    """The tensor a 2-D matmul operand is a reshape of, or the operand itself."""
    inner = bound.get(value)
    return inner.args[0] if inner is not None and _is_op(inner, "relax.reshape") else value


def lift_matmul_reshapes(mod) -> tuple[Any, int]:
    """(``mod`` with every ``reshape(matmul(p, W) [+ bias], [..., M', N])`` of a 2-D product computed
    as the batched ``matmul(reshape(p, [..., M', K]), W) [+ bias]``, how many). GPT-2's Conv1D is
    exported as Reshape → Gemm → Reshape: the reshape after the Gemm splits the GEMM from the
    element-wise ops after it (FuseOps fuses no view in between), so its tanh-GELU and residual
    adds ran as kernels of their own (0.46 ms of a batch-16 run on the H200). Batched, the product
    is what BERT's MatMul already is, and the GEMM sketches take it the same way."""
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    main = mod["main"]
    users = users_of(main)
    bound = _bindings(main)

    def only_user(var, value) -> bool:
        return _only_user(users, var, value)

    def product_of(reshape):
        """(matmul, bias or None, final shape) when ``reshape`` merely splits the rows of a 2-D product."""
        source = reshape.args[0]
        if not only_user(source, reshape):
            return None
        value, bias = bound.get(source), None
        if value is not None and _is_op(value, "relax.add"):
            product, bias = value.args
            bias_shape = static_shape(bias.ty)
            if bias_shape is None or len(bias_shape) > 1 or not only_user(product, value):
                return None
            value = bound.get(product)
        if value is None or not _is_op(value, "relax.matmul"):
            return None
        shapes = [static_shape(a.ty) for a in value.args]
        out, final = static_shape(value.ty), static_shape(reshape.ty)
        if any(s is None or len(s) != 2 for s in shapes) or out is None or final is None or len(final) < 3:
            return None
        if final[-1] != out[1] or math.prod(final[:-1]) != out[0] or str(value.ty.dtype) != "float32":
            return None
        return value, bias, final

    lifted = [0]

    @mutator
    class _Lift(PyExprMutator):
        def visit_call_(self, call):
            if _is_op(call, "relax.reshape"):
                found = product_of(call)
                if found is not None:
                    matmul, bias, final = found
                    p, w = (self.visit_expr(a) for a in matmul.args)
                    rows = _reshape_source(matmul.args[0], bound)
                    k = static_shape(p.ty)[1]
                    if static_shape(rows.ty) == [*final[:-1], k]:
                        p = self.visit_expr(rows)
                    else:
                        p = self.builder_.emit(relax.op.reshape(p, [*final[:-1], k]))
                    lifted[0] += 1
                    product = self.builder_.emit(relax.op.matmul(p, w))
                    return product if bias is None else relax.op.add(product, self.visit_expr(bias))
            return super().visit_call_(call)

    return _rewritten(mod, _Lift(mod), lifted)


def rewrite_matmul_views(mod) -> tuple[Any, int, int]:
    """lift_matmul_reshapes, then fold_transposes_into_matmuls: (module, reshapes lifted, transposes folded)."""
    mod, lifted = lift_matmul_reshapes(mod)
    mod, folded = fold_transposes_into_matmuls(mod)
    return mod, lifted, folded
