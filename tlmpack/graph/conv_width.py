"""Channels-last convolutions computed over a wider output, so that their pixels fill whole register tiles.

The x86 rules hold ``rows`` pixels of two vectors in registers (heuristics/x86_matmul.py: 6 on AVX2, as
rows x second rows taken from the output's width and height). MetaSchedule's space has perfect tiles
only, and the maps of most CNNs are 2^k x 7 pixels (56, 28, 14, 7), which have no 3 or 6: an AVX2
convolution gets 4 pixels (8 accumulators), too few to hide the FMA latency. This rewrite legalizes an
ungrouped NHWC convolution (any stride) whose width and height give no such tile into a kernel that
computes ``wide`` >= W output columns (56 -> 60, so 6 pixels of a row; 14 -> 15, so 3 x 2) and copies
the first W back:

- the input is read as before where it exists; the columns past it come from the zero padding (a
  padded convolution) or from the last real column (an unpadded one, whose index is clamped: no
  padding block, no copy, and those outputs are never read);
- strided convolutions too: ResNet-50's six stride-2 ones, alone, 0.78-0.89 of their time (2 threads),
  the whole model 0.96 of its time with them (a 3 x 3 stride-2 trial of a wider output at the graph
  level, with a separate slice, had measured 1.01-1.08);
- the extra columns cost (wide - W) / W more multiply-adds, at most ``MAX_EXTRA``;
- a map with no such width (7 x 7) is computed as one flattened pixel loop instead, 49 -> 54 pixels
  (ResNet-50's 7 x 7 3 x 3 convolution, alone, 2 threads: 0.84-0.86 of its time). Flattening the
  larger maps too (56 x 56: 3136 -> 3138 pixels, less waste than 60 columns) measured slower than
  widening them (their 3 x 3 convolutions 1.03-1.06 against 0.80-0.88);
- the copy back is an element-wise block that FuseOps fuses with the convolution's tail, where
  the schedule inlines it.

It keeps the model's meaning exactly: every output element sums the same products in the same order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

MAX_EXTRA = 0.08  # at most this fraction of extra output columns (56 -> 60, 28 -> 30, 14 -> 15)
MIN_WIDTH = 8  # narrower maps are flattened instead (flat_pixels)
MAX_FLAT_EXTRA = 0.125  # a flattened map may add this fraction of pixels (7 x 7: 49 -> 54)
# a map whose own best tile holds this share of ``rows`` pixels is left alone (AVX-512's 8 rows: a
# 14-wide map's 7 pixels x 2 vectors are 14 accumulators; flattened to 200 pixels for 8, ResNet-50's
# 14 x 14 convolutions ran 1.15-1.25x slower on a Zen 4 EPYC at 2 threads)
ENOUGH_ROWS = 7 / 8


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def has_tile(width: int, height: int, rows: int) -> bool:
    """Whether ``rows`` pixels split as a divisor of the width times one of the height."""
    return any(rows % a == 0 and height % (rows // a) == 0 for a in _divisors(width) if a <= rows)


def tile_pixels(width: int, height: int, rows: int) -> int:
    """The most pixels, at most ``rows``, that a tile of a divisor of the width times one of the height holds."""
    return max(a * b for a in _divisors(width) if a <= rows for b in _divisors(height) if a * b <= rows)


def fills_tile(width: int, height: int, rows: int) -> bool:
    """Whether the map as it is gives a tile of at least ENOUGH_ROWS of ``rows`` pixels: no wider output needed."""
    return tile_pixels(width, height, rows) >= ENOUGH_ROWS * rows


def wider_width(width: int, height: int, rows: int) -> int:
    """The output width to compute: ``width`` when it already gives a tile of nearly ``rows`` pixels
    (fills_tile), or is too narrow, or no wider one is within MAX_EXTRA; else the next multiple of ``rows``, all of the tile's
    pixels in one output row (56 -> 60); else the narrowest that splits them over two rows (14 -> 15,
    3 x 2). One row measured faster: ResNet-50's 56 x 56 1 x 1 convolutions over 256 channels, alone,
    2 threads, 0.89-0.90 of their time at 60 columns against 1.06 at 57 (3 x 2)."""
    if rows <= 1 or width < MIN_WIDTH or fills_tile(width, height, rows):
        return width
    limit = int(width * (1 + MAX_EXTRA))
    if -(-width // rows) * rows <= limit:
        return -(-width // rows) * rows
    for wide in range(width + 1, limit + 1):
        if has_tile(wide, height, rows):
            return wide
    return width


def flat_pixels(width: int, height: int, rows: int) -> int:
    """The pixels to compute as one flattened loop where no wider width gives a ``rows``-pixel tile
    (a 7 x 7 map: 49 -> 54, 6 rows of one vector pair): the next multiple of ``rows``, within
    MAX_FLAT_EXTRA; else width x height (left alone)."""
    pixels = width * height
    if rows <= 1 or fills_tile(width, height, rows) or wider_width(width, height, rows) != width or pixels < rows:
        return pixels
    up = -(-pixels // rows) * rows
    return up if up - pixels <= MAX_FLAT_EXTRA * pixels else pixels


class ConvShape(NamedTuple):
    """A 2-D convolution's sizes (data N, C, H, W; kernel F, KH, KW; strides, dilation, padding) and its output's."""

    n: int
    c: int
    h: int
    w: int
    f: int
    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    top: int
    left: int
    bottom: int
    right: int
    out_h: int
    out_w: int

    @property
    def padded(self) -> bool:
        return bool(self.top or self.left or self.bottom or self.right)


def conv_shape(data_shape, kernel_shape, strides, padding, dilation, channels_first: bool = False) -> ConvShape:
    """The sizes of a convolution of NHWC (or, ``channels_first``, NCHW) data with an OHWI kernel."""
    n, c, h, w = (int(d) for d in data_shape) if channels_first else (int(data_shape[i]) for i in (0, 3, 1, 2))
    f, kh, kw = (int(kernel_shape[i]) for i in range(3))
    sh, sw = (int(s) for s in strides)
    dh, dw = (int(d) for d in dilation)
    top, left, bottom, right = (int(p) for p in padding)
    out_h = (h + top + bottom - (kh - 1) * dh - 1) // sh + 1
    out_w = (w + left + right - (kw - 1) * dw - 1) // sw + 1
    return ConvShape(n, c, h, w, f, kh, kw, sh, sw, dh, dw, top, left, bottom, right, out_h, out_w)


def out_dtype_of(call) -> str:
    """A Relax convolution's output dtype: its ``out_dtype``, else its data's."""
    out_dtype = str(call.attrs.out_dtype or "")
    return str(call.args[0].ty.dtype) if out_dtype in ("", "None", "void") else out_dtype


def _static(shape) -> list[int] | None:
    try:
        return [int(d) for d in shape]
    except (TypeError, ValueError):
        return None


def wide_conv2d_te(data, kernel, strides, padding, dilation, wide: int, out_dtype: str, flat: bool = False):
    """The NHWC x OHWI convolution over ``wide`` output columns, then its first W columns; ``flat``:
    over ``wide`` pixels of one flattened loop, then the first H x W."""
    from tvm import te, tirx

    n, c, h, w, f, kh, kw, sh, sw, dh, dw, top, left, bottom, right, out_h, out_w = conv_shape(
        data.shape, kernel.shape, strides, padding, dilation)
    if top or left or bottom or right:
        in_w = w + left + right if flat else (wide - 1) * sw + (kw - 1) * dw + 1

        def inside(y, x):
            return tirx.all(y >= top, y < h + top, x >= left, x < w + left)

        padded = te.compute((n, h + top + bottom, in_w, c), lambda i, y, x, ch: tirx.if_then_else(
            inside(y, x), data[i, y - top, x - left, ch], tirx.const(0, data.dtype)), name="pad_temp")

        def read(i, y, x, ch):
            return padded[i, y, x, ch]
    else:
        def read(i, y, x, ch):
            return data[i, y, tirx.min(x, w - 1), ch]
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    rc = te.reduce_axis((0, c), name="rc")

    def product(i, y, x, ff):
        return te.sum(read(i, y * sh + ry * dh, x * sw + rx * dw, rc).astype(out_dtype)
                      * kernel[ff, ry, rx, rc].astype(out_dtype), axis=[ry, rx, rc])

    if flat:  # one pixel loop over ``wide`` >= out_h x out_w; the pixels past the map repeat the last one
        last = out_h * out_w - 1
        conv = te.compute((n, wide, f), lambda i, p, ff: product(
            i, tirx.min(p, last) // out_w, tirx.min(p, last) % out_w, ff), name="conv2d_nhwc")
        return te.compute((n, out_h, out_w, f), lambda i, y, x, ff: conv[i, y * out_w + x, ff],
                          name="conv2d_nhwc_pixels")
    conv = te.compute((n, out_h, wide, f), product, name="conv2d_nhwc")
    return te.compute((n, out_h, out_w, f), lambda i, y, x, ff: conv[i, y, x, ff], name="conv2d_nhwc_columns")


def widens(data: list[int], kernel: list[int], columns: int) -> bool:
    """Whether an NHWC x OHWI convolution is one this rewrite is for: whole two-vector rows of output
    channels (``columns``), so the rules' tile is 2 vectors x ``rows`` pixels (a narrower channel count
    takes one vector and more rows). Memory-bound ones too: alone (hot cache) MobileNetV2's 1 x 1
    convolutions over 16-144 channels measured 0.82-1.19 of their time, but in the whole model, paired
    against a build that left them alone, MobileNetV2 ran 0.93 and 0.98 of its time, ResNet-50 0.98 and
    0.99, EfficientNet-B0 0.99 (BENCHMARKS.md, 2026-12-06)."""
    return len(kernel) == 4 and kernel[0] % columns == 0


def wide_conv_legalizer(rows: int, columns: int) -> Callable[[Any, Any], Any]:
    """A LegalizeOps entry for ``relax.nn.conv2d``: the wide kernel where it applies (module notes),
    else TVM's own legalization. ``rows`` x ``columns``: the rules' register tile (pixels x channels)."""
    from tvm.relax.transform.legalize_ops.nn import _nn_conv2d

    def legalize(bb, call):
        attrs = call.attrs
        data, kernel = _static(call.args[0].ty.shape), _static(call.args[1].ty.shape)
        if (data is None or kernel is None or str(attrs.data_layout) != "NHWC" or str(attrs.kernel_layout) != "OHWI"
                or str(attrs.out_layout) != "NHWC" or int(attrs.groups) != 1
                or not widens(data, kernel, columns)):
            return _nn_conv2d(bb, call)
        padding, dilation, strides = ([int(v) for v in a] for a in (attrs.padding, attrs.dilation, attrs.strides))
        out_h, out_w = conv_shape(data, kernel, strides, padding, dilation)[-2:]
        wide, flat = wider_width(out_w, out_h, rows), False
        if wide == out_w:
            wide, flat = flat_pixels(out_w, out_h, rows), True
            if wide == out_w * out_h:
                return _nn_conv2d(bb, call)
        out_dtype = out_dtype_of(call)
        return bb.call_te(wide_conv2d_te, call.args[0], call.args[1], strides, padding, dilation, wide, out_dtype,
                          flat, primfunc_name_hint="conv2d")

    return legalize
