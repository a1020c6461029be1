"""Shared memory a CUDA matmul-like point will need, known while its tiles are still being sampled.

Random CUDA points of a convolution or matmul are mostly illegal: about 24 of every 25 ask for more
shared memory than a block has, and VerifyGPUCode (the last postprocessor, after a full replay)
refuses them. MetaSchedule's CUDA multi-level tiling (SSSRRSRS) stages every input of the main block
in shared memory at the outer reduction loop: one block's copy covers, for each input dimension, the
span its index takes over the block's spatial tile (all but the outermost of the 5 factors) and the
inner reduction tile (the last 2 of the 3 factors). With the index affine in the block's iteration
variables, that span is sum(|coefficient| * (tile - 1)) + 1.

``SharedFootprint.bytes`` gives that size for the tiles chosen so far (1 for those not yet chosen,
which is the smallest they can be), so a sampler can skip any value that already exceeds the block's
shared memory: a necessary condition, never one that removes a point the verifier would accept
(up to the region TVM compacts the staged buffer to, which is the same span).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SharedFootprint:
    """The main block's loops (extent, is reduction) and each input's per-dimension coefficients."""

    loops: tuple[tuple[int, bool], ...]
    inputs: tuple[tuple[int, tuple[tuple[int, ...], ...]], ...]  # (element bytes, coefficients per dim)
    # bytes() by tiles: a decode asks about the same few hundred tilings ~10,000 times a task
    _memo: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @staticmethod
    def of(func) -> SharedFootprint | None:
        """The model for a matmul-like task (see heuristics.classify), None for other tasks or
        indices that are not affine in the block's variables."""
        from tvm import s_tir, tirx
        from tvm.sym.pattern import detect_linear_equation

        from .heuristics.classify import _is_multiply_accumulate, classify

        kind = classify(func)
        if kind.kind != "matmul":
            return None
        sch = s_tir.Schedule(func)
        block = sch.get(sch.get_sblock(kind.block))
        variables = [v.var for v in block.iter_vars]
        loops = tuple((int(v.dom.extent), v.iter_type == tirx.IterVar.CommReduce) for v in block.iter_vars)
        _, operands = _is_multiply_accumulate(block)
        inputs = []
        for load in operands:
            dims = []
            for index in load.indices:
                coefficients = detect_linear_equation(index, variables)
                if len(coefficients) != len(variables) + 1:
                    return None
                dims.append(tuple(abs(int(c)) for c in coefficients[:-1]))
            inputs.append(((load.source.dtype.bits + 7) // 8, tuple(dims)))
        return SharedFootprint(loops, tuple(inputs))

    def bytes(self, tiles: list[int]) -> int:
        """Shared bytes one block stages for per-loop tile sizes ``tiles`` (loop order)."""
        key = tuple(tiles)
        known = self._memo.get(key)
        if known is None:
            known = self._memo[key] = self._bytes(key)
        return known

    def _bytes(self, tiles: tuple[int, ...]) -> int:
        total = 0
        for element_bytes, dims in self.inputs:
            span = 1
            for coefficients in dims:
                span *= sum(c * (t - 1) for c, t in zip(coefficients, tiles, strict=True)) + 1
            total += element_bytes * span
        return total

    @staticmethod
    def block_tile(value: tuple[int, ...]) -> int:
        """The part of a tile decision one block's shared copy spans: all factors but the outermost
        (for a spatial loop's 5 and a reduction loop's 3 alike)."""
        return math.prod(value[1:])


MAX_THREADS, MAX_VTHREAD, MIN_THREADS = 1024, 8, 32
MAX_SHARED_BYTES = 49152  # a block's shared memory without opt-in (CudaHardware.max_shared_memory_per_block)
POINTS_PER_BLOCK = 256  # the grid floor never asks for blocks of fewer output points on average


def grid_floor(footprint: SharedFootprint | None, sm_count: int) -> int:
    """The fewest thread blocks a matmul-like point should launch: one per SM (a smaller grid
    leaves SMs idle for the whole kernel), lowered for small loop nests so that a block keeps
    POINTS_PER_BLOCK output points on average. 0 (no floor) for other tasks. A performance rule,
    not a legality condition: the sampler does not apply it; the TLM's choice is checked with it."""
    if footprint is None or sm_count <= 0:
        return 0
    points = math.prod(extent for extent, reduction in footprint.loops if not reduction)
    return min(sm_count, points // POINTS_PER_BLOCK)


def grid_blocks(footprint: SharedFootprint, decisions, appended_gemm: bool = False) -> int:
    """Thread blocks of a point. An SSSRRSRS point (MetaSchedule's sketches): the product of the
    outermost factors of the main block's spatial tiles (its 5-way tile decisions, in loop order).
    A point of the appended ``gemm`` / ``gemm-splitk`` sketches (cuda_gemm_sketch.py): its first two
    decisions tile M and N 3 ways (grid, threads, registers); the grid is their outer factors, times
    the batch loops (the output points M and N do not cover), times a split K's outer factor. Read
    the SSSRRSRS way, such a point has no 5-way tile and looked like one block."""
    tiles = [d.value for d in decisions if d.kind == "tile"]
    if appended_gemm and len(tiles) >= 3 and len(tiles[0]) == len(tiles[1]) == 3:
        m, n, k = tiles[:3]
        points = math.prod(extent for extent, reduction in footprint.loops if not reduction)
        batch = max(points // (math.prod(m) * math.prod(n)), 1)
        return m[0] * n[0] * batch * (k[0] if len(k) == 3 else 1)
    spatial = sum(not reduction for _, reduction in footprint.loops)
    return math.prod(t[0] for t in [t for t in tiles if len(t) == 5][:spatial])


class PointFilter:
    """Necessary conditions of VerifyGPUCode that MetaSchedule's SSSRRSRS tiling makes visible at
    the tile sites, kept as a point's tiles are chosen: the product of the thread factors (index 2
    of the 5-way spatial tiles) stays <= 1024, the product of the virtual-thread factors (index 1)
    <= 8, and (with ``footprint``, for matmul-like tasks) the inputs one block stages in shared
    memory fit ``max_shared_bytes`` with the tiles not yet chosen at their smallest, and the block
    can still reach MIN_THREADS threads. It only ever removes values no legal point can use, and
    keeps every value when none would be left. One filter per replay (it keeps running state);
    the random sampler and the TLM's decoder both use it."""

    def __init__(self, footprint: SharedFootprint | None = None, max_shared_bytes: int = MAX_SHARED_BYTES) -> None:
        self.footprint, self.max_shared = footprint, max_shared_bytes
        self.threads = self.vthreads = 1
        self.loop = 0
        self.tiles = [1] * len(footprint.loops) if footprint else []

    def _fits(self, value: tuple[int, ...]) -> bool:
        if not self.footprint or self.loop >= len(self.tiles):
            return True
        trial = list(self.tiles)
        trial[self.loop] = SharedFootprint.block_tile(value)
        return self.footprint.bytes(trial) <= self.max_shared

    def keep(self, site, values: list) -> list:
        """The values of ``site`` (its legal values) that can still make a valid point."""
        if site.kind != "tile" or site.parts not in (3, 5):
            return values
        if self.tiles and self.loop < len(self.tiles):
            extent, reduction = self.footprint.loops[self.loop]
            if extent != site.extent or reduction != (site.parts == 3):
                self.tiles.clear()  # not the main block's loop order: stop guiding by shared memory
        reachable = 0  # the most threads the spatial loops after this one can still add
        if self.tiles and site.parts == 5:
            reachable = math.prod(e for e, red in self.footprint.loops[self.loop + 1:] if not red)
        ok = [v for v in values if self._fits(v) and (site.parts == 3 or (
            self.threads * v[2] <= MAX_THREADS and self.vthreads * v[1] <= MAX_VTHREAD
            and (not reachable or self.threads * v[2] * reachable >= MIN_THREADS)))]
        return ok or values

    def chosen(self, site, value) -> None:
        """Records the value taken at ``site`` (call after every keep)."""
        if site.kind != "tile" or site.parts not in (3, 5):
            return
        if site.parts == 5:
            self.threads *= value[2]
            self.vthreads *= value[1]
        if self.loop < len(self.tiles):
            self.tiles[self.loop] = SharedFootprint.block_tile(value)
        self.loop += 1
