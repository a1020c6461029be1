"""cuda-matmul: a point of MultiLevelTiling's SSSRRSRS sketch for dense, batch matmul and conv2d
(depthwise included), chosen from the hardware description alone.

Sites: one 5-way tile per spatial loop (blockIdx, vthread, threadIdx, inner, innermost), one 3-way
tile per reduction loop (outer, the shared-memory stage, inner), then a cooperative-fetch vector
length per staged input and the unroll depth.

How it decides: each spatial loop is on the "left" side (the loop the second input ignores, GEMM's
M; conv's N/H/W), the "right" side (the first input ignores it: GEMM's N, conv's output channels)
or neither (batch, depthwise channels: no reuse, only parallelism). A small menu of block shapes
(threads per side x register tile per side: 64-256 threads, at most 64 accumulators) is mapped onto
the loops' divisors, innermost loop first, and each result is scored with a closed-form SM model:
per wave, the slowest of FMA issue (128/clk/SM), shared-memory reads (32 words/clk, one A and one
B read per register-tile row/column), L2 traffic (about 16 words/clk/SM) and one global-load
latency (~700 clk) per K stage hidden by the other resident blocks, times the number of waves
(so a half-empty last wave and too few blocks for the SMs cost what they cost), a penalty
when fewer than 8 warps per SM are resident, and one for the idle lanes of a partial warp. The
K stage takes reduction divisors, innermost first, up to 16 words (a 3x3 window stays whole), so both staged tiles fit shared memory with
room for several blocks per SM. vthread stays 1; unroll 512 covers the register tile; the
cooperative fetch stays scalar (whether a vector load is aligned depends on the operand's layout,
which the task class does not carry).
"""

from __future__ import annotations

import math
import os
from typing import Any

from ..space import SamplingSite
from .classify import TaskClass
from .registry import Decisions, Rule, register

FMA_PER_CLK = 128  # fp32 FMA per SM per clock (sm_70 .. sm_90)
SMEM_WORDS_PER_CLK = 32  # 32 banks x 4 bytes
L2_WORDS_PER_CLK = 16  # about 64 B/clk/SM from L2
LOAD_LATENCY_CLK = 700
MAX_ACCUMULATORS = 64
K_STAGE_WORDS = 16
UNROLL = 512
# (threads on the left side, on the right side, register tile left, right), largest first.
BLOCK_MENU = [(tl, tr, rl, rr) for tl, tr in ((16, 16), (8, 16), (16, 8), (8, 8), (4, 16), (16, 4), (4, 32), (32, 4),
                                                (2, 64), (64, 2), (1, 128), (128, 1), (1, 256), (256, 1), (8, 32), (32, 8))
              for rl, rr in ((8, 8), (4, 8), (8, 4), (4, 4), (2, 4), (4, 2), (2, 2), (1, 4), (4, 1), (1, 2), (2, 1), (1, 1))]


def _divisor_at_most(n: int, bound: int) -> int:
    for d in range(min(n, max(bound, 1)), 0, -1):
        if n % d == 0:
            return d
    return 1


def axis_roles(task: TaskClass) -> list[str]:
    """left | right | free for every spatial loop (see the module docstring)."""
    inputs = list(task.reuse.values())
    roles = []
    for axis in range(len(task.spatial)):
        ignored = [axis in ignored_by for ignored_by in inputs]
        if len(inputs) == 2 and ignored == [False, True]:
            roles.append("left")
        elif len(inputs) == 2 and ignored == [True, False]:
            roles.append("right")
        else:
            roles.append("free")
    return roles


def _map_side(extents: list[int], axes: list[int], threads: int, regs: int,
              tiles: dict[int, list[int]]) -> tuple[int, int]:
    """Gives the side's loops their register then thread factors, innermost loop first."""
    got_threads, got_regs = 1, 1
    for axis in reversed(axes):
        e = extents[axis]
        r = _divisor_at_most(e, regs // got_regs)
        t = _divisor_at_most(e // r, threads // got_threads)
        tiles[axis] = [e // (r * t), 1, t, r, 1]
        got_threads *= t
        got_regs *= r
    return got_threads, got_regs


def k_stage(reduction: tuple[int, ...], words: int = K_STAGE_WORDS) -> list[int]:
    """Per reduction loop, the part staged in shared memory at once (innermost loop first)."""
    stage = [1] * len(reduction)
    budget = words
    for axis in reversed(range(len(reduction))):
        e = reduction[axis]
        if e <= budget and budget // e >= 1:
            stage[axis] = e
            budget //= e
        else:
            stage[axis] = _divisor_at_most(e, budget)
            break
    return stage


def plan(task: TaskClass, hw: Any, menu=BLOCK_MENU) -> tuple[dict[int, list[int]], list[int], float] | None:
    """The best-scoring block shape: spatial tiles by loop, the K stage, and its score (clocks)."""
    roles = axis_roles(task)
    extents = list(task.spatial)
    left = [a for a, r in enumerate(roles) if r == "left"]
    right = [a for a, r in enumerate(roles) if r == "right"]
    free = [a for a, r in enumerate(roles) if r == "free"]
    stage = k_stage(task.reduction)
    kt = math.prod(stage)
    k = max(task.row_length, 1)
    best = None
    seen = set()
    for tl, tr, rl, rr in menu:
        tiles: dict[int, list[int]] = {}
        got_tl, got_rl = _map_side(extents, left, tl, rl, tiles)
        got_tr, got_rr = _map_side(extents, right, tr, rr, tiles)
        # Loops no input reuses get the threads the sides left over (depthwise channels, batch).
        spare = max(1, (tl * tr) // (got_tl * got_tr))
        got_tf = 1
        for axis in reversed(free):
            t = _divisor_at_most(extents[axis], spare // got_tf)
            tiles[axis] = [extents[axis] // t, 1, t, 1, 1]
            got_tf *= t
        key = tuple(tuple(tiles[a]) for a in range(len(extents)))
        if key in seen:
            continue
        seen.add(key)
        threads = got_tl * got_tr * got_tf
        regs = got_rl * got_rr
        if not 32 <= threads <= hw.max_threads_per_block or regs > MAX_ACCUMULATORS:
            continue
        score = _score(hw, tiles, extents, threads, got_tl * got_rl, got_tr * got_rr, got_rl, got_rr, got_tf, k, kt)
        if score is None:
            continue
        if best is None or score < best[2] - 1e-9:
            best = (tiles, stage, score)
    return best


def _score(hw, tiles, extents, threads, block_left, block_right, rl, rr, free_threads, k, kt) -> float | None:
    blocks = math.prod(tiles[a][0] for a in range(len(extents)))
    outputs_per_block = math.prod(extents) // blocks
    smem_bytes = 4 * kt * (block_left * free_threads + block_right * free_threads)
    if smem_bytes > hw.max_shared_memory_per_block:
        return None
    regs_per_thread = rl * rr + rl + rr + 32
    if regs_per_thread > 255:
        return None
    per_sm = min(2048 // threads, hw.registers_per_sm // (threads * regs_per_thread),
                 hw.shared_memory_per_sm // max(smem_bytes, 1), 32)
    if per_sm < 1:
        return None
    resident = min(per_sm, math.ceil(blocks / hw.sm_count))
    waves = math.ceil(blocks / (per_sm * hw.sm_count))
    fma = resident * outputs_per_block * k / FMA_PER_CLK
    smem = resident * outputs_per_block * k * (1 / rr + 1 / rl) / SMEM_WORDS_PER_CLK
    l2 = resident * (block_left + block_right) * free_threads * k / L2_WORDS_PER_CLK
    latency = math.ceil(k / kt) * LOAD_LATENCY_CLK / min(resident, 4)
    wave = max(fma, smem, l2, latency)
    warps = resident * math.ceil(threads / 32)
    if warps < 8:
        wave *= 8 / warps
    wave *= math.ceil(threads / 32) * 32 / threads  # idle lanes of a partial warp
    # Wave efficiency: the share of SM slots busy when blocks are dealt one per SM per round
    # (96 blocks on 132 SMs: 0.73). Dividing by it makes the search halve the block tile until
    # blocks fill the SMs evenly, as long as the smaller tile's other costs allow.
    rounds = math.ceil(blocks / hw.sm_count)
    return waves * wave / (blocks / (rounds * hw.sm_count))


def _pipelined_first() -> bool:
    return os.environ.get("TLMPACK_CUDA_PIPELINE", "") not in ("", "0")


@register
class CudaMatmul(Rule):
    name = "cuda-matmul"
    target = "cuda"

    def is_eligible(self, task: TaskClass, hardware: Any) -> bool:
        # GEMV-like tasks (little output, long reduction) need split-K, which SSSRRSRS cannot do.
        return task.kind == "matmul" and not (task.rows < hardware.sm_count * 64 and task.row_length >= 256)

    def sketch_order(self, sketches: list[tuple[str, ...]], task: TaskClass, hardware: Any) -> list[int]:
        num_sketches = len(sketches)
        # Sketch 0 stages through shared memory synchronously; 1 and 2 add cp.async pipelines.
        order = list(range(num_sketches))
        if _pipelined_first() and num_sketches > 1:
            order = [1, 0, *order[2:]]
        return order

    def decisions(self, task: TaskClass, sites: list[SamplingSite], hardware: Any) -> Decisions | None:
        ns, nr = len(task.spatial), len(task.reduction)
        start = _find_tiles(task, sites)
        if start is None:
            return None
        chosen = plan(task, hardware)
        if chosen is None:
            return None
        tiles, stage, _ = chosen
        out: Decisions = {}
        for axis in range(ns):
            out[sites[start + axis].index] = tuple(tiles[axis])
        for axis in range(nr):
            e = task.reduction[axis]
            out[sites[start + ns + axis].index] = (e // stage[axis], stage[axis], 1)
        for site in sites[start + ns + nr:]:
            if site.kind != "categorical":
                continue
            if 0 in site.candidates and 1024 in site.candidates:  # unroll depth
                out[site.index] = site.candidates.index(UNROLL)
            elif set(site.candidates) <= {1, 2, 3, 4, 8, 16}:  # cooperative fetch vector length
                out[site.index] = site.candidates.index(1) if 1 in site.candidates else 0
            else:  # AutoBind of a block outside the tiled one
                out[site.index] = _threads_index(site.candidates, 256)
        return out


def _find_tiles(task: TaskClass, sites: list[SamplingSite]) -> int | None:
    """Where the main block's tiles start: 5-way tiles over its spatial extents, then 3-way ones
    over its reduction extents."""
    ns, nr = len(task.spatial), len(task.reduction)
    for start in range(len(sites) - ns - nr + 1):
        group = sites[start:start + ns + nr]
        if all(s.kind == "tile" and s.parts == 5 and s.extent == e for s, e in zip(group[:ns], task.spatial, strict=True)) and all(
                s.kind == "tile" and s.parts == 3 and s.extent == e for s, e in zip(group[ns:], task.reduction, strict=True)):
            return start
    return None


def _threads_index(candidates: tuple[int, ...], want: int) -> int:
    """Index of the largest candidate no larger than ``want`` (else the smallest)."""
    fitting = [i for i, c in enumerate(candidates) if c <= want]
    return max(fitting, key=lambda i: candidates[i]) if fitting else min(range(len(candidates)), key=lambda i: candidates[i])
