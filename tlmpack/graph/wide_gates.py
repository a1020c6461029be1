"""A squeeze-excite gate over a large map as a kernel of its own, parallel over the map's pixels.

EfficientNet's squeeze-excite block ends in ``x * sigmoid(conv(pool(x)))``: the 1 x 1 convolution
makes one value a channel, and the multiply broadcasts them over the whole map. FuseOps fuses that
multiply into the convolution's kernel as its tail, and the schedule computes the tail inside the
convolution's channel tiles (heuristics/x86_matmul.py: at the root its inlined sigmoid ran 11-31x
slower). So the kernel's parallel chunks are the convolution's output-channel tiles: on AVX-512,
EfficientNet-B0's 56 x 56 x 96 gate has 3, its 56 x 56 x 144 and 28 x 28 x 144 ones 9, and at 16 threads
most threads wait. (A one-chunk kernel already runs such a tail on every thread: lower/x86_serial_tails.py.)

Here such a multiply is marked injective after AnnotateTIROpPattern, so FuseOps leaves it out of the
convolution's kernel: the convolution and its sigmoid write the C gate values, and the multiply is a
broadcast kernel that the element-wise rules parallelise over pixels. A gate is a run-time value (a
constant per-channel scale, such as a batch norm's, stays fused) that broadcasts over at least
``MIN_GATED_PIXELS`` pixels: smaller maps (14 x 14 and 7 x 7, 15-36 channel tiles) keep the one launch.
On 2 threads of the Zen 4 EPYC EfficientNet-B0 is level with it (BENCHMARKS.md 2026-12-07 00:35); the
16-core Xeon, where it is meant to pay, has not measured it yet.
"""

from __future__ import annotations

import math

from .relax_rewrites import static_shape

MIN_GATED_PIXELS = 28 * 28
_ELEMWISE, _BROADCAST, _INJECTIVE = 0, 1, 2  # TVM's OpPatternKind (a broadcast of equal rank is annotated elemwise)


def _gate_pixels(small: list[int], big: list[int]) -> int:
    """How many pixels ``small`` (a per-channel gate: 1 on every axis but the batch and one channel
    axis) broadcasts over in ``big``; 0 when ``small`` is not such a gate of ``big``."""
    if len(small) != len(big) or len(big) < 3 or small[0] != big[0] or small == big:
        return 0
    kept = [a for a in range(1, len(big)) if small[a] != 1]
    if len(kept) != 1 or small[kept[0]] != big[kept[0]] or big[kept[0]] == 1:
        return 0
    return math.prod(big[1:]) // big[kept[0]]


def wide_gates_unfused(mod, min_pixels: int):
    """``mod`` with the PrimFunc of every broadcast multiply of a run-time gate by a map of at least
    ``min_pixels`` pixels marked injective, so FuseOps gives it a kernel of its own. A PrimFunc that
    some other call shares (LegalizeOps gives equal shapes one function: a constant scale's too) is
    left as it is."""
    import tvm
    from tvm import relax, tirx

    call_tir = tvm.ir.Op.get("relax.call_tir")
    gated, shared = set(), set()
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if not (isinstance(value, relax.Call) and value.op.same_as(call_tir)):
                continue
            gvar = value.args[0]
            func = mod[gvar]
            if not (isinstance(func, tirx.PrimFunc) and gvar.name_hint.startswith("multiply")
                    and int(func.attrs.get("op_pattern", -1)) in (_ELEMWISE, _BROADCAST)):
                continue
            (gated if _is_wide_gate(value, min_pixels) else shared).add(gvar)
    marked = gated - shared
    if not marked:
        return mod
    updated = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)  # a pass must not change its input
    for gvar in marked:
        updated.update_func(gvar, mod[gvar].with_attr("op_pattern", _INJECTIVE))
    return updated


def _is_wide_gate(call, min_pixels: int) -> bool:
    """Whether a multiply's call_tir takes two run-time float tensors, one a per-channel gate of the
    other over at least ``min_pixels`` pixels."""
    from tvm import relax

    args = list(call.args[1].fields) if len(call.args) > 1 and isinstance(call.args[1], relax.Tuple) else []
    if len(args) != 2 or not all(isinstance(a, relax.Var) for a in args):
        return False
    shapes = [static_shape(a.ty) for a in args]
    if None in shapes or not str(args[0].ty.dtype).startswith("float"):
        return False
    small, big = sorted(shapes, key=math.prod)
    return _gate_pixels(small, big) >= max(min_pixels, 1)


def wide_gates_pass(min_pixels: int | None = None):
    """wide_gates_unfused as a module pass, between AnnotateTIROpPattern and FuseOps (``min_pixels``:
    MIN_GATED_PIXELS when the pass runs)."""
    import tvm

    def run(mod, _ctx):
        return wide_gates_unfused(mod, MIN_GATED_PIXELS if min_pixels is None else min_pixels)

    return tvm.ir.transform.module_pass(run, opt_level=0, name="tlmpack.WideGatesUnfused")
