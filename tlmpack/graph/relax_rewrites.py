"""Relax-level rewrites tlmpack applies before lowering, each keeping the model's meaning exactly.

pad_awkward_extents: MetaSchedule's design space has only perfect tiles, so a matmul loop whose
extent has no useful divisor (197 tokens, 77, GPT-2's 50257-wide LM head, 1000 classes...) gets a
1 x 197 tile: scalar on x86, odd thread shapes on CUDA. Every matmul (constant weight or not,
batched or not) whose M, N or K extent is awkward computes instead over a friendlier extent, the
next multiple the target asks for (``policy_for``: x86 whole vectors for N and K and its register
tile's rows for M, even where M is friendly to everything else (128 rows -> 132 on AVX2),
CUDA warp-sized tiles) as long as that adds at most ``MAX_OVERHEAD`` of the work, and is sliced back:

- M (rows) and N (columns): the operand is padded with zeros and the product sliced back to the
  original rows/columns, so padded rows and columns never reach anything else;
- K (the reduction): both operands are padded with zeros, which add exactly 0 to every sum; an
  attention's P = softmax(S) is instead recomputed over S padded with the lowest float, so the
  padded keys' probabilities are exactly 0 and the softmax reduces over the friendly length too
  (a copy of P fused into the softmax measured 2.7x slower than the softmax alone).

A constant operand is padded here, at build time (FoldConstant keeps it a constant); an activation
costs a pad copy, which FuseOps fuses into the kernel that produces it when it can. Reductions over
awkward lengths are otherwise left alone (a layer norm's rows are not tiled into registers; a
softmax is padded only as the P of an attention, above). The old LM-head padding is the N case of this rewrite.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_OVERHEAD = 0.125  # padding may add at most this fraction to an extent
MIN_WORK = 1 << 20  # multiply-adds below which a matmul is not worth the extra pad/slice kernels
MIN_EXTENT = 16  # extents below this fit one tile whatever they are
_ARITHMETIC = ("relax.multiply", "relax.divide", "relax.add", "relax.subtract")
_REDUCTIONS = ("matmul", "sum", "mean", "max", "min", "prod", "variance", "std", "argmax", "argmin",
               "cumsum", "cumprod", "nn.conv1d", "nn.conv2d", "nn.conv3d", "nn.max_pool2d", "nn.avg_pool2d",
               "nn.adaptive_avg_pool2d", "einsum")


@dataclass(frozen=True)
class PadPolicy:
    """The multiples a target prefers for its loop extents, best first (the first one within the
    overhead bound wins): ``multiples`` for the columns (N) and the reduction (K), ``rows`` for M.
    N and K share theirs: attention's keys are QK^T's N and P V's K, padded alike."""

    multiples: tuple[int, ...]
    rows: tuple[int, ...] = ()  # empty: as ``multiples``

    def padded(self, extent: int, rows: bool = False) -> int:
        """The extent to compute over: ``extent`` itself when it is small or already a multiple of
        the smallest preferred multiple, else the next multiple within the overhead bound."""
        multiples = (self.rows or self.multiples) if rows else self.multiples
        if extent < MIN_EXTENT or extent % min(multiples) == 0:
            return extent
        for m in multiples:
            up = -(-extent // m) * m
            if up - extent <= MAX_OVERHEAD * extent:
                return up
        return extent


def policy_for(targets: tuple[str, ...], x86_lanes: int = 8, x86_rows: int = 6) -> PadPolicy:
    """x86 wants whole vectors (two, else one, of ``x86_lanes`` floats) along N and K, and rows in
    multiples of its register tile's ``x86_rows`` (AVX2: 2 vectors x 6 rows, so 128 rows -> 132
    and 197 -> 198; AVX-512: 8); CUDA wants warp-sized
    tiles (32, else 16) everywhere, and whole 128-wide blocks along N and K where they cost little
    (GPT-2's LM head: 50257 -> 50304, not 50272 = 32 x 1571, whose only block widths are 32 and
    1571). A graph shared by both targets takes the coarser multiples first."""
    multiples: list[int] = []
    rows: list[int] = []
    if "cuda" in targets:
        multiples += [128, 32, 16]
        rows += [32, 16]
    if "x86" in targets:
        multiples += [2 * x86_lanes, x86_lanes]
        rows += [x86_rows]
    if not multiples:
        multiples, rows = [16, 8], [8]
    return PadPolicy(tuple(sorted(set(multiples), reverse=True)), tuple(sorted(set(rows), reverse=True)))


def pad_awkward_extents(mod, policy: PadPolicy):
    """Returns ``mod`` with every matmul over awkward extents computed padded and sliced back, and
    how many matmuls were padded."""
    import numpy as np
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    matmul = tvm.ir.Op.get("relax.matmul")
    softmax = tvm.ir.Op.get("relax.nn.softmax")
    count = [0]

    def static_shape(expr) -> tuple[int, ...] | None:
        ty = expr.ty
        if not isinstance(ty, relax.TensorType) or ty.shape is None:
            return None
        try:
            return tuple(int(d) for d in ty.shape.values)
        except (TypeError, AttributeError):
            return None

    padded: dict = {}  # (operand, padded shape, value) → the padded operand: Q, K, V matmuls share one pad
    own_slices: list = []  # the slices this rewrite made: what is beyond them is known (zeros)

    @mutator
    class _Pad(PyExprMutator):

        def pad(self, expr, shape: tuple[int, ...], to: tuple[int, ...], value: float = 0.0):
            """``expr`` padded with ``value`` at the end of each axis to ``to``: folded when constant."""
            if to == shape:
                return expr
            widths = [(0, t - s) for s, t in zip(shape, to, strict=True)]
            if isinstance(expr, tvm.ir.expr.Constant):
                return relax.const(np.pad(expr.value.numpy(), widths, constant_values=value))
            for (known, known_to, known_value), done in padded.items():
                if known_to == to and known_value == value and known.same_as(expr):
                    return done
            source = self.row_reshape_source(expr, shape, to)
            if source is not None:  # pad before the reshape, so that the pad can fuse into source's producer
                source, source_shape, source_to = source
                done = self.builder_.emit(relax.op.reshape(self.pad(source, source_shape, source_to, value), to))
            else:
                done = self.builder_.emit(relax.op.nn.pad(expr, [w for pair in widths for w in pair], pad_value=value))
            padded[(expr, to, value)] = done
            return done

        def row_reshape_source(self, expr, shape: tuple[int, ...], to: tuple[int, ...]):
            """(X, X's shape, X's padded shape) when ``expr`` (rows x columns after axes of 1) is a
            reshape of X whose padding is X's padding reshaped, else None: X has the same rows and
            columns behind axes of 1 ([1, T, C] read as [T, C], as GPT-2's Conv1D Gemm reads its
            input), or, when only the rows are padded, columns split over trailing axes (attention's
            heads [1, T, H, D] merged into [T, H * D]). A pad right after X's producer (a GELU, the
            heads' transpose; not a reduction: fuses_a_pad) fuses into its kernel; a pad after the
            reshape (a view) is a kernel of its own."""
            if len(shape) < 2 or any(d != 1 for d in shape[:-2]) or not isinstance(expr, relax.Var):
                return None
            if any(t != d for t, d in zip(to[:-2], shape[:-2], strict=True)):
                return None
            rows, columns, to = shape[-2], shape[-1], to[-2:]
            value = self.lookup_binding(expr)
            if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
                    and value.op.name == "relax.reshape"):
                return None
            source = value.args[0]
            source_shape = static_shape(source)
            if not self.fuses_a_pad(source):
                return None
            for lead in range(len(source_shape or ()) - 1):  # source_shape[lead] is the rows axis
                rest = source_shape[lead + 1:]
                if (any(d != 1 for d in source_shape[:lead]) or source_shape[lead] != rows
                        or int(np.prod(rest, dtype=np.int64)) != columns):
                    continue
                if rest == (columns,):
                    return source, source_shape, (*source_shape[:lead], *to)
                if to[1] == columns:  # padded columns would have to be spread over the merged axes
                    return source, source_shape, (*source_shape[:lead], to[0], *rest)
                return None
            return None

        def fuses_a_pad(self, expr) -> bool:
            """Whether a pad of ``expr`` may join the kernel that computes it: an element-wise or
            layout op does; a reduction (a layer norm, a softmax, a matmul) does not, as FuseOps would
            put the pad into the reduction's loop nest: GPT-2's layer norms ran 3.8x slower so."""
            if not isinstance(expr, relax.Var):
                return False
            value = self.lookup_binding(expr)
            if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)):
                return False
            name = value.op.name.removeprefix("relax.")
            return not (name.startswith("nn.") and ("norm" in name or "softmax" in name)) and name not in _REDUCTIONS

        def padded_softmax(self, expr, shape: tuple[int, ...], to: tuple[int, ...]):
            """When ``expr`` is a softmax over its last axis (attention's P, whose keys are P V's
            reduction), the softmax recomputed over scores padded with the lowest float: the padded
            keys get exactly 0 (exp underflows) and the reduction of the softmax itself runs over
            the friendly length; padded rows are uniform, finite and sliced off. Else None."""
            if not isinstance(expr, relax.Var):
                return None
            value = self.lookup_binding(expr)
            if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.same_as(softmax)
                    and int(value.attrs.axis) in (-1, len(shape) - 1)
                    and static_shape(value.args[0]) == shape):
                return None
            lowest = float(np.finfo(np.dtype(str(expr.ty.dtype))).min)
            scores = self.unsliced_scores(value.args[0], to, lowest)
            if scores is None:
                scores = self.pad(value.args[0], shape, to, lowest)
            return self.builder_.emit(relax.op.nn.softmax(scores, axis=-1))

        def unsliced_scores(self, expr, to: tuple[int, ...], lowest: float):
            """Scores S = f(our slice of a padded QK^T), f a chain of arithmetic with constants (the
            1/sqrt(d) scale, a causal mask): f applied to the padded product, its constants padded
            alike (0, or 1 for a divisor), plus a column mask (0 for the real keys, the lowest float
            for the padded ones). The padded product's extra rows and columns are exactly 0 (Q and
            K^T were zero-padded) and f of them is finite, so this equals padding S with the lowest
            float, without the slice and the pad copy in the QK^T kernel. Else None."""
            chain = []
            while isinstance(expr, relax.Var):
                value = self.lookup_binding(expr)
                if any(value.same_as(own) for own in own_slices) and static_shape(value.args[0]) == to:
                    product = value.args[0]
                    break
                if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
                        and value.op.name in _ARITHMETIC and len(value.args) == 2):
                    return None
                constants = [i for i, arg in enumerate(value.args) if isinstance(arg, tvm.ir.expr.Constant)
                             and np.isfinite(arg.value.numpy()).all()]
                if len(constants) != 1 or (value.op.name == "relax.divide" and constants != [1]):
                    return None
                chain.append((value.op, constants[0], value.args[constants[0]].value.numpy()))
                expr = value.args[1 - constants[0]]
            else:
                return None
            rows, keys = static_shape(expr)[-2:]
            grown = [_grown(array, rows, keys, to, 1 if op.name == "relax.divide" else 0) for op, _, array in chain]
            if any(g is None for g in grown):
                return None
            for (op, at, _), array in reversed(list(zip(chain, grown, strict=True))):
                args = [product, relax.const(array)] if at == 1 else [relax.const(array), product]
                product = self.builder_.emit(relax.Call(op, args))
            mask = np.zeros(to[-1], dtype=str(product.ty.dtype))
            mask[keys:] = lowest
            return self.builder_.emit(relax.op.add(product, relax.const(mask)))

        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not (isinstance(call.op, tvm.ir.Op) and call.op.same_as(matmul) and len(call.args) == 2):
                return call
            a, b = call.args
            sa, sb, out = static_shape(a), static_shape(b), static_shape(call)
            if sa is None or sb is None or out is None or len(sa) < 2 or len(sb) < 2:
                return call
            if str(a.ty.dtype) not in ("float32", "float16") or str(b.ty.dtype) != str(a.ty.dtype):
                return call
            m, k, n = sa[-2], sa[-1], sb[-1]
            batch = int(np.prod(out[:-2], dtype=np.int64)) if len(out) > 2 else 1
            if batch * m * n * k < MIN_WORK:
                return call
            pm, pn, pk = policy.padded(m, rows=True), policy.padded(n), policy.padded(k)
            if (pm, pn, pk) == (m, n, k):
                return call
            count[0] += 1
            masked = self.padded_softmax(a, sa, (*sa[:-2], pm, pk)) if pk != k else None
            a = masked if masked is not None else self.pad(a, sa, (*sa[:-2], pm, pk))
            b = self.pad(b, sb, (*sb[:-2], pk, pn))
            product = self.builder_.emit(relax.op.matmul(a, b, out_dtype=call.attrs.out_dtype))
            rank = len(out)
            axes = [ax for ax, (p, e) in ((rank - 2, (pm, m)), (rank - 1, (pn, n))) if p != e]
            if not axes:
                return product
            ends = [m if ax == rank - 2 else n for ax in axes]
            own_slices.append(relax.op.strided_slice(product, axes=axes, begin=[0] * len(axes), end=ends))
            return own_slices[-1]

    main = _Pad().visit_expr(mod["main"])
    if count[0] == 0:  # the mutator rebuilds the function even when nothing changed
        return mod, 0
    return with_main(mod, main), count[0]


def static_shape(ty) -> list[int] | None:
    """A Relax type's shape as ints, None when it is not static."""
    try:
        return [int(d) for d in ty.shape.values]
    except (AttributeError, TypeError):
        return None


def users_of(main) -> dict[Any, list]:
    """Relax var → the values (binding values, the function's result) that use it."""
    from tvm import relax

    users: dict[Any, list] = {}
    for block in main.body.blocks:
        for binding in block.bindings:
            for var in relax.analysis.free_vars(binding.value):
                users.setdefault(var, []).append(binding.value)
    for var in relax.analysis.free_vars(main.body.body):
        users.setdefault(var, []).append(main.body.body)
    return users


def with_main(mod, main):
    """``mod`` with its ``main`` replaced by ``main``; the same GlobalVars, so calls into the
    module's other functions still resolve (every rewrite here changes ``main`` only)."""
    import tvm

    functions = dict(mod.functions.items())
    functions[mod.get_global_var("main")] = main
    return tvm.IRModule(functions, attrs=mod.attrs)


def _grown(array, rows: int, keys: int, to: tuple[int, ...], fill: float):
    """A constant of the scores' chain broadcast over (rows, keys) padded to ``to``'s last two
    extents with ``fill``; None when it does not broadcast that way."""
    import numpy as np

    if array.ndim > len(to):
        return None
    widths = [(0, 0)] * array.ndim
    for axis, real in ((-1, keys), (-2, rows)):
        if array.ndim >= -axis and array.shape[axis] != 1:
            if array.shape[axis] != real:
                return None
            widths[axis] = (0, to[axis] - real)
    return np.pad(array, widths, constant_values=fill) if array.ndim else array
