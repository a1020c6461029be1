"""The register tile of an x86 matmul-like point, and the bounds a usable one keeps.

A point of the SSRSRS sketch keeps, innermost, one accumulator per (vector of the last spatial
loop) x (every other spatial loop's innermost factor). FMA latency (4) x ports (2) wants about 8
independent accumulators on AVX2; more than the vector registers minus the operands' spills
inside the reduction loop. The TLM chose both extremes on GPT-2's dense layers (1 and 16
accumulators on 16 ymm registers: 3.1x and 3.2x slower than the rules), so a build takes a TLM
point only inside these bounds (select.py tries the model's top-k samples, then the rules).
"""

from __future__ import annotations

import math
from typing import Any

from .records import Decision

OPERAND_REGISTERS = 2  # the broadcast and the vector-loaded operand of each FMA
# vectors of the last loop per row of the tile: the rules' own cap (heuristics/x86_matmul.py); the
# shipped TLM's 2 rows x 4 vectors for GPT-2's FFN up projection (128 x 768 -> 3072) ran 1.10x
# slower than the rules' 4 x 2 (7589 vs 6918 us, one thread; BENCHMARKS.md, 2026-12-01 19:40)
MAX_ROW_VECTORS = 2


def _innermost_tiles(spatial: tuple[int, ...], decisions: tuple[Decision, ...]) -> list[tuple] | None:
    """The point's 4-way spatial tiles, or None when they do not match the task's spatial loops
    (another sketch shape: nothing to check)."""
    tiles = [d.value for d in decisions if d.kind == "tile" and isinstance(d.value, tuple) and len(d.value) == 4]
    if len(tiles) != len(spatial) or [math.prod(t) for t in tiles] != list(spatial):
        return None
    return tiles


def register_tile_vectors(spatial: tuple[int, ...], decisions: tuple[Decision, ...], lanes: int) -> int | None:
    """Accumulator vectors of the point's innermost tile, or None for another sketch shape."""
    tiles = _innermost_tiles(spatial, decisions)
    if tiles is None:
        return None
    vectors = math.ceil(tiles[-1][3] / lanes)
    for tile in tiles[:-1]:
        vectors *= tile[3]
    return vectors


def row_vectors(spatial: tuple[int, ...], decisions: tuple[Decision, ...], lanes: int) -> int | None:
    """Vectors of the last spatial loop in the point's innermost tile (one row's accumulators), or
    None for another sketch shape."""
    tiles = _innermost_tiles(spatial, decisions)
    return None if tiles is None else math.ceil(tiles[-1][3] / lanes)


def innermost_lanes(spatial: tuple[int, ...], decisions: tuple[Decision, ...]) -> int | None:
    """The innermost factor of the last spatial loop (the loop LLVM vectorizes), or None for
    another sketch shape."""
    tiles = _innermost_tiles(spatial, decisions)
    return None if tiles is None else tiles[-1][3]


def vector_fill_problem(inner: int, extent: int, lanes: int) -> str:
    """Why a point's vectorized loop (``inner`` of a last spatial loop of ``extent``) wastes its
    vectors, or "". Where the extent is a multiple of the lanes, the loop must be whole vectors (the
    rules' always are): a 24- or 8-lane loop on 16 lanes runs a partial vector every iteration, and
    the TLM's such picks for held-out channels-last convolutions ran 2.1-13x slower than the rules'.
    Elsewhere it must fill half of the widest vector the extent divides into (20 channels on 16
    lanes: 10, so at least 5): the TLM's 1-lane picks for two held-out 1x1 convolutions ran 8.8x and
    12x slower (BENCHMARKS.md, 2026-12-03)."""
    if extent % lanes == 0:
        return "" if inner % lanes == 0 else f"vectorized loop of {inner} lanes, not whole {lanes}-lane vectors"
    from .heuristics.x86_matmul import largest_divisor_at_most

    floor = (largest_divisor_at_most(extent, lanes) + 1) // 2
    return "" if inner >= floor else f"vectorized loop of {inner} lanes, under {floor} of {lanes}"


def register_tile_bounds(hardware: Any, spatial: tuple[int, ...] = ()) -> tuple[int, int]:
    """(fewest, most) accumulator vectors: half the rules' budget, and the register file less
    the operands (AVX2: 4..14 of 16 ymm; AVX-512: 8..30 of 32 zmm). A task with fewer rows than
    that (``spatial``'s loops but the last: a classifier's 1 x 2048 GEMV) has no lower bound, since
    its rows cannot hold the accumulators and one vector is what the rules choose too."""
    budget = max(4, hardware.vector_registers // 2)
    fewest = budget // 2
    if spatial and math.prod(spatial[:-1]) < fewest:
        fewest = 1
    return fewest, hardware.vector_registers - OPERAND_REGISTERS


def register_tile_problem(hardware: Any, spatial: tuple[int, ...], decisions: tuple[Decision, ...]) -> str:
    """Why an x86 matmul-like point's register tile is out of bounds, or "" (also for another sketch
    shape): the accumulator vectors keep register_tile_bounds, a row at most MAX_ROW_VECTORS, and the
    vectorized loop keeps vector_fill_problem. What a build refuses a TLM point for. (One-row tasks
    keep the row cap too: their kernels of 1-4 us time too noisily to say otherwise; the same 3-vector
    point of a 1 x 240 matmul measured 0.29x and 1.05x the rules in two passes.)"""
    lanes = hardware.lanes(32)
    vectors = register_tile_vectors(spatial, decisions, lanes)
    if vectors is None:
        return ""
    low, high = register_tile_bounds(hardware, spatial)
    if not low <= vectors <= high:
        return f"register tile of {vectors} accumulator vectors outside {low}..{high}"
    if (per_row := row_vectors(spatial, decisions, lanes) or 0) > MAX_ROW_VECTORS:
        return f"register tile rows of {per_row} vectors, over {MAX_ROW_VECTORS}"
    return vector_fill_problem(innermost_lanes(spatial, decisions) or 0, spatial[-1], lanes)
