"""TIR calls from TVM's ONNX importer → Relax ops, before the channels-last conversion.

The importer writes Pad and Clip as ``R.call_tir`` of a TOPI function (``bb.emit_te``). Relax's
ConvertLayout cannot look inside a TIR call, so on the x86 channels-last path it surrounds every
one with a pair of transposes, and those transposes split each convolution from its element-wise
tail (MobileNetV2: 35 Clip and 17 Pad calls; EfficientNet-B0: a Pad before each of its 81
convolutions). The rewrites, each keeping the model's meaning exactly:

- ``pad-into-conv``: a zero Pad of the spatial axes whose every user is an NCHW convolution's data
  becomes part of those convolutions' ``padding`` (TF-style "same" padding, EfficientNet's no-op
  pads before 1x1 convolutions);
- ``clip-to-relax``: Clip's maximum / minimum against a scalar become ``R.maximum`` /
  ``R.minimum``, which ConvertLayout knows and FuseOps fuses into the convolution before them;
  ``R.clip`` (the torch importer's ReLU6), which ConvertLayout does not know either, becomes the same pair;
- after ConvertLayout, ``unit_transposes_to_reshapes``: a transpose that only moves unit axes
  (NHWC → NCHW of a globally pooled [1, 1, 1, C] before Flatten) is a reshape, so a view;
- after ConvertLayout, ``input_transposes_into_convolutions``: the NCHW → NHWC transpose of a
  tensor that only ungrouped convolutions read (a CNN's input before its stem) goes: each reads
  the NCHW tensor and writes NHWC (``nchw_input_conv2d_te``), its padding block a contiguous
  NCHW copy (the transpose kernel took 55-180 µs of ResNet-50's and MobileNetV2's runs).

A TIR call is recognised by structural equality with what ``emit_te`` of the same TOPI function
gives for the same argument types, never by its name. ``graph_fallbacks.py`` switches this module
off ("layout-ops") when TVM trips over its output.
"""

from __future__ import annotations

from typing import Any

from ..errors import LoweringError, one_line
from .relax_rewrites import static_shape, users_of, with_main

MAX_PAD = 8  # spatial pads tried per axis when recognising a Pad (models pad by 0-3)


class LayoutRewriteError(LoweringError):
    """One of this module's rewrites failed: graph_fallbacks.py builds without them ("layout-ops")."""


def before_conversion(mod):
    """tir_calls_to_relax_ops, its failure a LayoutRewriteError."""
    try:
        return tir_calls_to_relax_ops(mod)[0]
    except Exception as e:
        raise LayoutRewriteError(f"layout-ops rewrite failed: {one_line(e)}") from None


def after_conversion(mod, cores: int = 0, lanes: int = 16):
    """unit_transposes_to_reshapes, channels_last_pools_as_matmuls (for ``cores`` with vectors of
    ``lanes``; 0 cores: by size alone) and input_transposes_into_convolutions, a failure a
    LayoutRewriteError."""
    try:
        pools = channels_last_pools_as_matmuls(unit_transposes_to_reshapes(mod), cores, lanes)
        return input_transposes_into_convolutions(pools)
    except Exception as e:
        raise LayoutRewriteError(f"layout-ops rewrite failed: {one_line(e)}") from None


def _emit_te_func(fn, arg_types: list, *extra):
    """The PrimFunc that ``bb.emit_te(fn, *args, *extra)`` makes for arguments of ``arg_types``."""
    from tvm import relax

    bb = relax.BlockBuilder()
    params = [relax.Var(f"p{i}", t) for i, t in enumerate(arg_types)]
    with bb.function("reference", params):
        with bb.dataflow():
            out = bb.emit_output(bb.emit_te(fn, *params, *extra))
        bb.emit_func_output(out)
    mod = bb.get()
    return next(mod[g] for g in mod.get_global_vars() if g.name_hint != "reference")


def _zero_spatial_pad(func, arg_type, out_type) -> tuple[int, int, int, int] | None:
    """(top, left, bottom, right) when ``func`` is ``topi.nn.pad`` by zeros of axes 2 and 3 of a
    4-D tensor, else None."""
    import itertools

    import tvm_ffi
    from tvm import topi

    shape_in, shape_out = static_shape(arg_type), static_shape(out_type)
    if shape_in is None or shape_out is None or len(shape_in) != 4 or len(shape_out) != 4:
        return None
    total = [o - i for o, i in zip(shape_out, shape_in, strict=True)]
    if total[0] or total[1] or not all(0 <= p <= MAX_PAD for p in total[2:]):
        return None
    for top, left in itertools.product(range(total[2] + 1), range(total[3] + 1)):
        bottom, right = total[2] - top, total[3] - left
        reference = _emit_te_func(topi.nn.pad, [arg_type], [0, 0, top, left], [0, 0, bottom, right], 0.0)
        if tvm_ffi.structural_equal(func, reference):
            return top, left, bottom, right
    return None


def _scalar_bound(func, arg_types: list) -> str | None:
    """"maximum" / "minimum" when ``func`` is that TOPI function of a tensor and a 0-d tensor."""
    import tvm_ffi
    from tvm import topi

    if len(arg_types) != 2 or static_shape(arg_types[1]) != []:
        return None
    for name in ("maximum", "minimum"):
        if tvm_ffi.structural_equal(func, _emit_te_func(getattr(topi, name), arg_types)):
            return name
    return None


def _is_conv_data_of(value, var) -> bool:
    import tvm

    return (isinstance(value, tvm.relax.Call) and isinstance(value.op, tvm.ir.Op)
            and value.op.name == "relax.nn.conv2d" and value.args[0].same_as(var)
            and not value.args[1].same_as(var) and value.attrs.data_layout == "NCHW")


def tir_calls_to_relax_ops(mod) -> tuple[Any, dict[str, int]]:
    """``mod`` with the pads folded into convolutions and the clips as Relax ops, and how many of
    each were rewritten ({"pad-into-conv": n, "clip-to-relax": m})."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    main = mod["main"]
    call_tir = tvm.ir.Op.get("relax.call_tir")
    clip = tvm.ir.Op.get("relax.clip")
    users = users_of(main)
    pads: dict[Any, tuple[Any, tuple[int, int, int, int]]] = {}  # pad var → (its input, pad)
    bounds: dict[Any, str] = {}  # call_tir value → maximum | minimum
    kinds: dict[str, Any] = {}  # PrimFunc name → what it is (one check per function)
    for block in main.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if not (isinstance(value, relax.Call) and value.op.same_as(call_tir) and len(value.args) == 2):
                continue
            gvar, args = value.args[0], list(value.args[1].fields)
            types = [a.ty for a in args]
            if gvar.name_hint not in kinds:
                func = mod[gvar]
                kinds[gvar.name_hint] = (("pad", _zero_spatial_pad(func, types[0], value.ty)) if len(args) == 1
                                         else ("bound", _scalar_bound(func, types)))
            kind, what = kinds[gvar.name_hint]
            if what is None:
                continue
            if kind == "bound":
                bounds[value] = what
            elif all(_is_conv_data_of(u, binding.var) for u in users.get(binding.var, [])):
                pads[binding.var] = (args[0], what)
    counts = {"pad-into-conv": 0, "clip-to-relax": 0}

    @mutator
    class _Rewrite(PyExprMutator):
        def visit_call_(self, call):
            if call.op.same_as(call_tir) and call in bounds:
                counts["clip-to-relax"] += 1
                x, bound = (self.visit_expr(a) for a in call.args[1].fields)
                return getattr(relax.op, bounds[call])(x, bound)
            if isinstance(call.op, tvm.ir.Op) and call.op.same_as(clip) and _clip_bounds(call) is not None:
                counts["clip-to-relax"] += 1
                low, high = _clip_bounds(call)
                x = self.visit_expr(call.args[0])
                dtype = call.args[0].ty.dtype
                return relax.op.minimum(self.builder_.emit(relax.op.maximum(x, relax.const(low, dtype))),
                                        relax.const(high, dtype))
            if _is_conv_data_of(call, call.args[0]) and call.args[0] in pads:
                counts["pad-into-conv"] += 1
                source, (top, left, bottom, right) = pads[call.args[0]]
                a = call.attrs
                t, lf, b, r = (int(p) for p in a.padding)
                return relax.op.nn.conv2d(self.visit_expr(source), self.visit_expr(call.args[1]), a.strides,
                                          [t + top, lf + left, b + bottom, r + right], a.dilation, a.groups,
                                          a.data_layout, a.kernel_layout, a.out_layout, a.out_dtype)
            return super().visit_call_(call)

    new_main = _Rewrite().visit_expr(main)
    if not any(counts.values()):
        return mod, counts
    return relax.transform.DeadCodeElimination(["main"])(with_main(mod, new_main)), counts


def _number(arg) -> float | None:
    """A clip bound as a Python number: an immediate (TVM 0.27 passes FloatImm) or one wrapped in
    a PrimValue; None for anything computed."""
    value = getattr(arg, "value", None)
    if isinstance(value, (int, float)):
        return float(value)
    inner = getattr(value, "value", None)
    return float(inner) if isinstance(inner, (int, float)) else None


def _clip_bounds(call) -> tuple[float, float] | None:
    """(min, max) of an ``R.clip`` whose bounds are plain numbers of a float tensor, else None."""
    if len(call.args) != 3 or not str(call.args[0].ty.dtype).startswith("float"):
        return None
    low, high = _number(call.args[1]), _number(call.args[2])
    return None if low is None or high is None else (low, high)


def _only_moves_unit_axes(shape: list[int], axes: list[int]) -> bool:
    """Whether permuting ``shape`` by ``axes`` keeps the order of every axis longer than 1: then
    the bytes do not move and the transpose is a reshape."""
    moved = [a for a in axes if shape[a] != 1]
    return moved == sorted(moved)


def unit_transposes_to_reshapes(mod):
    """``mod`` with every ``R.permute_dims`` that only moves unit axes (ConvertLayout's NHWC → NCHW
    of a globally pooled [1, 1, 1, C] before a flatten) as ``R.reshape``, which the plan makes a
    view instead of a kernel. Transposes of constants are left to FoldConstant."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    permute = tvm.ir.Op.get("relax.permute_dims")

    @mutator
    class _Rewrite(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not (isinstance(call.op, tvm.ir.Op) and call.op.same_as(permute)):
                return call
            source = call.args[0]
            shape = static_shape(source.ty)
            if shape is None or isinstance(source, tvm.ir.expr.Constant):
                return call
            axes = list(range(len(shape)))[::-1] if call.attrs.axes is None else [int(a) for a in call.attrs.axes]
            if not _only_moves_unit_axes(shape, axes):
                return call
            return relax.op.reshape(source, [shape[a] for a in axes])

    main = _Rewrite().visit_expr(mod["main"])
    return mod if main.same_as(mod["main"]) else with_main(mod, main)


# a pool over at least this many pixels is summed in parts (pool_parts)
POOL_SPLIT_MIN_PIXELS = 4096
POOL_MAX_PARTS = 16
POOL_MIN_PART_PIXELS = 256
# for the target's cores: a part keeps at least this many pixels, and the split is taken only where the
# chunks' balance on the cores was below POOL_GOOD_BALANCE (then the fewest parts that reach it, or the best)
POOL_MIN_CORE_PART_PIXELS = 64
POOL_GOOD_BALANCE = 0.85


def pool_channel_tiles(channels: int, lanes: int) -> int:
    """How many parallel column tiles x86-matmul gives a pool's channels: two vectors of ``lanes``
    where they divide the channels, else one (EfficientNet-B0 on AVX-512: 96 -> 3, 144 -> 9)."""
    width = 2 * lanes if channels % (2 * lanes) == 0 else lanes
    return -(-channels // width)


def chunk_balance(chunks: int, cores: int) -> float:
    """The share of ``cores`` busy while ``chunks`` equal chunks run on them: (chunks / cores) over the
    busiest core's ceil(chunks / cores)."""
    return (chunks / cores) / -(-chunks // cores)


def pool_parts(pixels: int, channels: int = 0, cores: int = 0, lanes: int = 16) -> int:
    """How many parts a global pool over ``pixels`` is summed in.

    A large map (at least POOL_SPLIT_MIN_PIXELS): the largest divisor of ``pixels`` up to POOL_MAX_PARTS
    that leaves each part POOL_MIN_PART_PIXELS. As one matmul, a pool over few channels is one column
    tile and so one thread: EfficientNet-B0's first squeeze (112 x 112 x 32) ran 82 us at 4 threads and
    93 at 16 on the 16-core Xeon, the pool's other threads asleep by the time it ended. In parts, each
    part is a chunk of a batched matmul, and a small sum adds the parts' means.

    With the target's ``cores`` (and vector ``lanes``), also a smaller map whose channel tiles leave the
    cores unevenly busy (chunk_balance below POOL_GOOD_BALANCE): 56 x 56 x 96 is 3 tiles, so 3 of 16
    cores work. Then the fewest parts (divisors of ``pixels`` up to POOL_MAX_PARTS, each part at least
    POOL_MIN_CORE_PART_PIXELS) whose tiles x parts reach the balance, else the best balance."""
    divisors = [d for d in range(1, POOL_MAX_PARTS + 1) if pixels % d == 0]
    parts = 1
    if pixels >= POOL_SPLIT_MIN_PIXELS:
        parts = max(d for d in divisors if pixels // d >= POOL_MIN_PART_PIXELS)
    if cores > 1 and channels > 0:
        tiles = pool_channel_tiles(channels, lanes)
        if chunk_balance(tiles * parts, cores) < POOL_GOOD_BALANCE:
            more = [d for d in divisors if d > parts and pixels // d >= POOL_MIN_CORE_PART_PIXELS]
            good = [d for d in more if chunk_balance(tiles * d, cores) >= POOL_GOOD_BALANCE]
            best = min(good) if good else max(more, key=lambda d: (chunk_balance(tiles * d, cores), -d), default=parts)
            if chunk_balance(tiles * best, cores) > chunk_balance(tiles * parts, cores):
                parts = best
    return parts


def channels_last_pools_as_matmuls(mod, cores: int = 0, lanes: int = 16):
    """``mod`` with every mean over the spatial axes of an NHWC tensor (a global average pool:
    EfficientNet's squeeze-excite, the classifier's pool) as a product with a constant row of
    1 / (H·W): ``[1, H·W] @ [N, H·W, C]``. As a reduction the mean sums each channel alone, one
    strided scalar at a time, re-reading every cache line once per channel (EfficientNet-B0's 17
    pools were 14 % of its kernel time); as a matmul x86-matmul vectorises over the channels and
    reads the input once. A pool over a large map, or whose channel tiles leave the target's ``cores``
    (vectors of ``lanes``) unevenly busy, is summed in parts (pool_parts)."""
    import numpy as np
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    mean = tvm.ir.Op.get("relax.mean")

    @mutator
    class _Rewrite(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not (isinstance(call.op, tvm.ir.Op) and call.op.same_as(mean)):
                return call
            x = call.args[0]
            shape = static_shape(x.ty)
            dtype = str(x.ty.dtype)
            axes = None if call.attrs.axis is None else sorted(int(a) % 4 for a in call.attrs.axis)
            if shape is None or len(shape) != 4 or axes != [1, 2] or not dtype.startswith("float"):
                return call
            n, h, w, c = shape
            if h * w == 1 or c == 1:
                return call
            parts = pool_parts(h * w, c, cores, lanes)
            row = relax.const(np.full((1, h * w // parts), 1.0 / (h * w), dtype=dtype))
            if parts == 1:
                flat = self.builder_.emit(relax.op.reshape(x, [n, h * w, c]))
                product = self.builder_.emit(relax.op.matmul(row, flat))  # [n, 1, c]
            else:  # parts partial means, one parallel chunk each, then their sum
                split = self.builder_.emit(relax.op.reshape(x, [n, parts, h * w // parts, c]))
                partial = self.builder_.emit(relax.op.matmul(row, split))  # [n, parts, 1, c]
                product = self.builder_.emit(relax.op.sum(partial, axis=[1]))  # [n, 1, c]
            return relax.op.reshape(product, [n, 1, 1, c] if call.attrs.keepdims else [n, c])

    main = _Rewrite().visit_expr(mod["main"])
    return mod if main.same_as(mod["main"]) else with_main(mod, main)


_TO_NHWC = [0, 2, 3, 1]


def input_transposes_into_convolutions(mod):
    """``mod`` with every NCHW → NHWC ``R.permute_dims`` whose every user is an ungrouped NHWC
    convolution's data removed: those convolutions read the NCHW tensor (data_layout NCHW,
    out_layout NHWC), which partition.py legalizes with ``nchw_input_conv2d_te``."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    permute, conv2d = tvm.ir.Op.get("relax.permute_dims"), tvm.ir.Op.get("relax.nn.conv2d")
    users = users_of(mod["main"])

    def is_nhwc_conv_of(value, var) -> bool:
        return (isinstance(value, relax.Call) and value.op.same_as(conv2d) and value.args[0].same_as(var)
                and not any(a.same_as(var) for a in value.args[1:]) and str(value.attrs.data_layout) == "NHWC"
                and str(value.attrs.out_layout) == "NHWC" and int(value.attrs.groups) == 1)

    @mutator
    class _Rewrite(PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not (isinstance(call.op, tvm.ir.Op) and call.op.same_as(conv2d)) or not is_nhwc_conv_of(call, call.args[0]):
                return call
            var = call.args[0]
            bound = self.lookup_binding(var) if isinstance(var, relax.Var) else None
            if not (isinstance(bound, relax.Call) and bound.op.same_as(permute) and bound.attrs.axes is not None
                    and [int(a) for a in bound.attrs.axes] == _TO_NHWC and static_shape(bound.args[0].ty) is not None):
                return call
            if not all(is_nhwc_conv_of(u, var) for u in users.get(var, [])):
                return call
            a = call.attrs
            return relax.op.nn.conv2d(bound.args[0], call.args[1], a.strides, a.padding, a.dilation, a.groups,
                                      data_layout="NCHW", kernel_layout=str(a.kernel_layout), out_layout="NHWC",
                                      out_dtype=a.out_dtype)

    main = _Rewrite().visit_expr(mod["main"])
    return mod if main.same_as(mod["main"]) else with_main(mod, main)


def reads_nchw_writes_nhwc(call) -> bool:
    """A convolution input_transposes_into_convolutions made (TOPI legalizes none such)."""
    a = call.attrs
    return str(a.data_layout) == "NCHW" and str(a.out_layout) == "NHWC" and str(a.kernel_layout) == "OHWI"


def nchw_input_conv2d_te(data, kernel, strides, padding, dilation, out_dtype: str, wide: int = 0):
    """An ungrouped convolution of an NCHW tensor into NHWC (kernel OHWI): the padding block copies
    the input as it lies (NCHW, contiguous), and the convolution broadcasts its scalars from there,
    so no transpose is written anywhere. ``wide`` > W: computed over that many output columns, the
    first W copied back, so its pixels fill whole register tiles as conv_width.py's do (an image
    stem's 112 -> 114 columns: 6 pixels of a row); the columns past the input read zero padding, or
    the last real column of an unpadded input."""
    from tvm import te, tirx

    from .conv_width import conv_shape

    n, c, h, w, f, kh, kw, sh, sw, dh, dw, top, left, bottom, right, out_h, out_w = conv_shape(
        data.shape, kernel.shape, strides, padding, dilation, channels_first=True)
    wide = max(wide, out_w)
    if top or left or bottom or right:
        in_w = max(w + left + right, (wide - 1) * sw + (kw - 1) * dw + 1)
        padded = te.compute((n, c, h + top + bottom, in_w), lambda i, ch, y, x: tirx.if_then_else(
            tirx.all(y >= top, y < h + top, x >= left, x < w + left), data[i, ch, y - top, x - left],
            tirx.const(0, data.dtype)), name="pad_temp")

        def read(i, ch, y, x):
            return padded[i, ch, y, x]
    else:
        def read(i, ch, y, x):
            return data[i, ch, y, tirx.min(x, w - 1) if wide > out_w else x]
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    rc = te.reduce_axis((0, c), name="rc")
    conv = te.compute((n, out_h, wide, f), lambda i, y, x, ff: te.sum(
        read(i, rc, y * sh + ry * dh, x * sw + rx * dw).astype(out_dtype) * kernel[ff, ry, rx, rc].astype(out_dtype),
        axis=[ry, rx, rc]), name="conv2d_nhwc")
    if wide == out_w:
        return conv
    return te.compute((n, out_h, out_w, f), lambda i, y, x, ff: conv[i, y, x, ff], name="conv2d_nhwc_columns")


# a stem with fewer multiply-adds an output is bound by writing its output, and a wider one only costs:
# MobileNetV2's and EfficientNet-B0's 3x3 stems over 3 channels (27) ran 1.22x and 1.28x slower so,
# ResNet-50's 7x7 one (147) 0.87x (Zen 2 EPYC, 2 threads, in the whole model; BENCHMARKS.md 2026-12-06)
WIDE_STEM_MIN_MACS = 64


def legalize_nchw_input_conv2d(bb, call, rows: int = 0, columns: int = 0):
    """The LegalizeOps entry for a convolution reads_nchw_writes_nhwc; with the rules' register tile
    (``rows`` pixels x ``columns`` channels), over a wider output where conv_width.py would widen it and
    the stem has WIDE_STEM_MIN_MACS multiply-adds an output or more."""
    from .conv_width import conv_shape, out_dtype_of, widens, wider_width

    out_dtype = out_dtype_of(call)
    a = call.attrs
    strides, padding, dilation = ([int(v) for v in x] for x in (a.strides, a.padding, a.dilation))
    wide = 0
    data, kernel = static_shape(call.args[0].ty), static_shape(call.args[1].ty)
    if rows > 1 and data is not None and kernel is not None and widens(data, kernel, columns):
        shape = conv_shape(data, kernel, strides, padding, dilation, channels_first=True)
        if shape.kh * shape.kw * shape.c >= WIDE_STEM_MIN_MACS:
            wide = wider_width(shape.out_w, shape.out_h, rows)
    return bb.call_te(nchw_input_conv2d_te, call.args[0], call.args[1], strides, padding, dilation, out_dtype, wide,
                      primfunc_name_hint="conv2d")
