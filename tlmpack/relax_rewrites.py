"""Relax-level rewrites tlmpack applies before lowering, each keeping the model's meaning exactly.

pad_matmul_columns: a matmul by a constant whose column count N has no divisor that is a whole
vector (GPT-2's LM head: 50257 = 29 x 1733) cannot get a vector-wide innermost tile from
MetaSchedule's perfect tiles, so it runs scalar on x86 and with odd thread shapes on CUDA. The
weight is padded with zero columns to a multiple of 16 at build time and the product sliced back
to N columns: one cheap copy instead of a scalar GEMM.
"""

from __future__ import annotations

PAD_MULTIPLE = 16
MIN_WEIGHT_ELEMENTS = 1 << 20  # small matmuls are not worth an extra slice kernel


def pad_matmul_columns(mod):
    """Returns ``mod`` with every large constant-weight matmul of awkward width padded and sliced."""
    import numpy as np
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    matmul = tvm.ir.Op.get("relax.matmul")

    @mutator
    class _Pad(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not (isinstance(call.op, tvm.ir.Op) and call.op.same_as(matmul) and len(call.args) == 2):
                return call
            weight = call.args[1]
            if not isinstance(weight, tvm.ir.expr.Constant):
                return call
            value = weight.value.numpy()
            if value.ndim != 2 or value.shape[1] % 8 == 0 or value.size < MIN_WEIGHT_ELEMENTS:
                return call
            columns = value.shape[1]
            padded = np.pad(value, ((0, 0), (0, -columns % PAD_MULTIPLE)))
            product = self.builder_.emit(relax.op.matmul(call.args[0], relax.const(padded), out_dtype=call.attrs.out_dtype))
            rank = len(product.ty.shape)
            return relax.op.strided_slice(product, axes=[rank - 1], begin=[0], end=[columns])

    main = _Pad().visit_expr(mod["main"])
    if main.same_as(mod["main"]):
        return mod
    functions = dict(mod.functions.items())  # the same GlobalVars: calls into other functions still resolve
    functions[mod.get_global_var("main")] = main
    return tvm.IRModule(functions, attrs=mod.attrs)
