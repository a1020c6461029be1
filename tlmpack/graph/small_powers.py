"""``R.power(x, c)`` with a small whole exponent c (2, 3 or 4) written as multiplications.

TVM legalizes ``R.power`` to ``T.pow``, which LLVM lowers on x86 to a scalar ``powf`` call per
element unless fast-math flags allow it to expand a constant exponent. GPT-2's GELU (``x + 0.044715 *
x ** 3`` under a tanh) came from ONNX as ``Pow(x, 3.0)``: 4.2 ms a call on a 128 x 3072 activation,
9 % of the whole model on one thread, where the multiplications take a fraction of a millisecond and
vectorise. ``x * x * x`` rounds twice where ``powf`` rounds once: at most about two units in the last
place apart, far inside the 1e-4 a compiled model is checked to, so the rewrite is made with or
without fast math. Other exponents (0.5, negative, fractional, per-element) are left to ``powf``,
whose special cases (``pow(-0, 0.5)``, infinities) a rewrite would change.
"""

from __future__ import annotations

SMALL_EXPONENTS = (2, 3, 4)


def _whole_exponent(expr) -> int | None:
    """The exponent when ``expr`` is a float constant with one element equal to 2, 3 or 4, else None."""
    import numpy as np
    import tvm

    if not isinstance(expr, tvm.ir.expr.Constant):
        return None
    value = expr.value.numpy()
    if value.size != 1 or value.dtype.kind != "f":
        return None
    exponent = float(value.reshape(-1)[0])
    return int(exponent) if exponent in SMALL_EXPONENTS and np.isfinite(exponent) else None


def small_powers_as_products(mod):
    """``mod`` with every float ``R.power(x, c)`` of its ``main``, c a one-element constant of 2, 3 or 4
    whose shape does not broadcast x to a larger one, written as products of x."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    from .relax_rewrites import with_main

    power = tvm.ir.Op.get("relax.power")
    rewritten = [0]

    @mutator
    class _Rewrite(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not (isinstance(call.op, tvm.ir.Op) and call.op.same_as(power)):
                return call
            x, c = call.args
            exponent = _whole_exponent(c)
            x_type = x.ty
            if (exponent is None or not isinstance(x_type, relax.TensorType) or x_type.ndim < 0
                    or not str(x_type.dtype).startswith("float") or len(c.value.shape) > x_type.ndim):
                return call
            rewritten[0] += 1
            square = self.builder_.emit(relax.op.multiply(x, x))
            if exponent == 2:
                return square
            if exponent == 3:
                return relax.op.multiply(square, x)
            return relax.op.multiply(square, square)

    main = _Rewrite().visit_expr(mod["main"])
    return with_main(mod, main) if rewritten[0] else mod  # the mutator rebuilds main even when nothing changed


def small_powers_pass():
    """small_powers_as_products as a module pass, before LegalizeOps."""
    import tvm

    return tvm.ir.transform.module_pass(lambda mod, _ctx: small_powers_as_products(mod), opt_level=0,
                                        name="tlmpack.SmallPowersAsProducts")
