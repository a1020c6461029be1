"""Fast math for sigmoid: ``R.sigmoid(x)`` → ``1 / (1 + exp(-x))``, before FastMathTransform.

TVM legalizes ``R.sigmoid`` to the ``T.sigmoid`` intrinsic, which LLVM lowers on x86 to a scalar
``expf`` call per element: every SiLU (x * sigmoid(x)) and squeeze-excite gate of EfficientNet-B0
ran scalar, 8.4 ms of a 0.5 ms convolution (112x112x96, one thread). FastMathTransform swaps
``R.exp`` for TVM's vectorisable ``fast_exp`` but leaves sigmoid alone, so with fast math on the
sigmoid is written through ``R.exp`` first: the whole tail vectorises and still fuses into the
convolution before it. ``fast_exp`` clamps its input to ±88.4, so the result stays finite and in
[0, 1]. Part of fast math: ``--exact-math`` and the fast-math fallback keep ``T.sigmoid``.
"""

from __future__ import annotations


def sigmoid_through_exp(mod):
    """``mod`` with every float ``R.sigmoid`` written as ``1 / (1 + exp(-x))``."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    sigmoid = tvm.ir.Op.get("relax.sigmoid")

    @mutator
    class _Rewrite(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not (isinstance(call.op, tvm.ir.Op) and call.op.same_as(sigmoid)):
                return call
            x = call.args[0]
            dtype = str(x.ty.dtype)
            if not dtype.startswith("float"):
                return call
            one = relax.const(1.0, dtype)
            exp = self.builder_.emit(relax.op.exp(self.builder_.emit(relax.op.negative(x))))
            return relax.op.divide(one, self.builder_.emit(relax.op.add(one, exp)))

    functions = dict(mod.functions.items())
    changed = False
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function):
            new = _Rewrite().visit_expr(func)
            changed = changed or not new.same_as(func)
            functions[gvar] = new
    return tvm.IRModule(functions, attrs=mod.attrs) if changed else mod


def sigmoid_through_exp_pass():
    """sigmoid_through_exp as a module pass, to run just before FastMathTransform."""
    import tvm

    return tvm.ir.transform.module_pass(lambda mod, _ctx: sigmoid_through_exp(mod), opt_level=0,
                                        name="tlmpack.SigmoidThroughExp")
