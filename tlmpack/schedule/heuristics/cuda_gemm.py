"""cuda-gemm: a point of the appended ``gemm`` / ``gemm-splitk`` sketches (schedule/cuda_gemm_sketch.py)
for dense and batch-matmul tasks, chosen from the hardware description alone.

Sites: a 3-way tile of M (grid, threads, register rows), one of N (grid, threads, register
columns), the K tile (``gemm``: steps of BK, BK; ``gemm-splitk``: K parts, steps, BK), the
cooperative-fetch vector length of A's and B's shared tile, and the unroll depth.

How it decides: every block shape of a small menu (threads along M x along N, a TM x TN register
tile, BK) that divides the loops, and every split of K into 1..32 parts, is scored with a
closed-form model of the busiest SM: the slowest of FMA issue (128/clk), shared-memory reads (32
words/clk; TM + TN words a thread per K step, a float4 read counting once per 4 words along N),
L2 reads (about 16 words/clk/SM) and DRAM (about 2.7 kB/clk for the part), with too few resident
warps to hide latency charged as in cuda-matmul, plus, for a split, the partial sums' round trip
and a second launch. Occupancy comes from threads, registers (TM*TN accumulators + TM + TN + 40)
and shared memory (two stages of both tiles, rows padded by 4 words). The fetch vector is the
widest of 4, 2, 1 that divides a tile row and the tile over the threads; unroll 512.

Convolutions (the sketches' implicit GEMM: M = co, N = h*w, K = ci*kh*kw, batch n) are scored the
same way with their own menus: N tiles of 7s as well as powers of two (ResNet's 56/28/14/7-wide
images) that lie in whole rows or images or divide a row (so the staged box of the input has a
constant size), K steps of whole windows (9, 18, 36 for a 3x3), 224-thread blocks where a GEMM
has 256, scalar fetches of the input box and of a windowed weight (a 1x1's weight rows take the
GEMM's vector). A point the space refuses (a strided 1x1 whose box is twice the tile the model
counts, over the shared-memory limit) goes back to cuda-matmul.
"""

from __future__ import annotations

import math
import os
from typing import Any

from ..space import SamplingSite
from .classify import TaskClass
from .registry import Decisions, Rule, register

FMA_PER_CLK = 128
SMEM_WORDS_PER_CLK = 32
L2_WORDS_PER_CLK = 16
DRAM_BYTES_PER_CLK = 2700  # H200: 4.8 TB/s at 1.75 GHz; the same order on every sm_80+ part
LAUNCH_CLK = 4000  # a second kernel (split-K's sum): launch and tail
LOAD_LATENCY_CLK = 700
PAD = 4  # words per shared row (cuda_gemm_sketch.SHARED_ROW_PAD)
STAGES = 2
THREADS_M = (1, 2, 4, 8, 16, 32)
THREADS_N = (8, 16, 32)
REG_M = (1, 2, 4, 8)
REG_N = (1, 2, 4, 8)
BK_MENU = (32, 16, 8, 4)
MAX_SPLIT = 32
SPLIT_BELOW_WAVES = 2  # K is split only when the whole-K grid has fewer blocks than 2 per SM
SPLIT_UP_TO_WAVES = 4
UNROLL = 512
FETCH_VECTORS = (4, 2, 1)


# A convolution's implicit GEMM (cuda_gemm_sketch.conv_loops): N is its fused (h, w), so block
# tiles along N may be multiples of 7 (ResNet's 56, 28, 14, 7 wide images).
CONV_THREADS_N = (7, 8, 14, 16, 28, 32)
CONV_REG_N = (1, 2, 4, 7, 8)


def gemm_extents(task: TaskClass) -> tuple[int, int, int, int] | None:
    """(M, N, K, batch) of a GEMM the sketches take (a convolution's implicit GEMM included), else None."""
    from ..cuda_gemm_sketch import conv_loops, gemm_loops

    loops = gemm_loops(task)
    if loops is None:
        conv = conv_loops(task)
        if conv is None:
            return None
        co, batch, rows, _, _ = conv
        return (task.spatial[co], math.prod(task.spatial[a] for a in rows), math.prod(task.reduction),
                math.prod(task.spatial[a] for a in batch))
    m_axis, n_axis, batch_axes, _, _ = loops
    return task.spatial[m_axis], task.spatial[n_axis], task.reduction[0], math.prod(task.spatial[a] for a in batch_axes)


def plan(task: TaskClass, hw: Any, split_k: bool | None = None) -> dict | None:
    """The best-scoring point: {"tm", "tn", "ty", "tx", "bk", "ks", "score"} (ks 1: no split).
    ``split_k``: True / False restricts the search to one sketch."""
    extents = gemm_extents(task)
    if extents is None:
        return None
    m, n, k, batch = extents
    conv = _conv_shape(task)
    forced = _forced_plan(m, n, k)
    if forced is not None and not conv:
        return forced if split_k is not True else None
    threads_n, reg_n = (CONV_THREADS_N, CONV_REG_N) if conv else (THREADS_N, REG_N)
    # a conv's 7-wide thread rows make 224-thread blocks where a GEMM has 256
    min_threads = _min_threads(m * n * batch) * (7 if conv else 8) // 8
    best = None
    for ty in THREADS_M:
        for tx in threads_n:
            threads = ty * tx
            if not min_threads <= threads <= min(256, hw.max_threads_per_block):
                continue
            for tm in REG_M:
                for tn in reg_n:
                    bm, bn = ty * tm, tx * tn
                    if m % bm or n % bn or (conv and not _conv_tile_ok(bn, conv[0])):
                        continue
                    for bk in _conv_bk(conv[1]) if conv else BK_MENU:
                        if k % bk:
                            continue
                        for ks in range(1, MAX_SPLIT + 1):
                            if (split_k is False and ks > 1) or (split_k is True and ks == 1):
                                continue
                            if (k // bk) % ks or k // (bk * ks) < 2:
                                continue
                            score = _score(hw, m, n, k, batch, ty, tx, tm, tn, bk, ks)
                            if score is not None and (best is None or score < best["score"] - 1e-9):
                                best = {"tm": tm, "tn": tn, "ty": ty, "tx": tx, "bk": bk, "ks": ks, "score": score}
    return best


def _conv_shape(task: TaskClass) -> tuple[tuple[int, ...], int] | None:
    """A convolution's N loop extents (h, w) and its window (kh * kw), None for a GEMM."""
    from ..cuda_gemm_sketch import conv_loops

    conv = conv_loops(task)
    if conv is None:
        return None
    _, _, rows, _, _ = conv
    return tuple(task.spatial[a] for a in rows), math.prod(task.reduction[1:])


def _conv_bk(window: int) -> tuple[int, ...]:
    """K steps of a convolution: whole windows (a step's input channels are then a constant range)."""
    if window == 1:
        return BK_MENU
    return tuple(sorted({window * c for c in (1, 2, 4, 8) if window * c <= 2 * max(BK_MENU)} | {window}, reverse=True))


def _conv_tile_ok(bn: int, rows: tuple[int, ...]) -> bool:
    """A block's N tile lies in whole rows, images or their even parts (each of w, h*w is a
    multiple or a divisor of it), so its staged input region has a constant size; otherwise its
    bounds are data-dependent and the box a block stages is the whole image."""
    span = 1
    for extent in reversed(rows):
        span *= extent
        if bn % span and span % bn:
            return False
    return True


# Outputs from which a GEMM's blocks have 256 threads. The SM model scores 64-thread blocks with big
# register tiles as well as 256-thread ones, but on the H200 (bench/gpu_gemm.py, 2026-12-01 15:00)
# 256 threads ran 4096^3, the batch-16 BERT/GPT-2 layers and LLaMA's at 0.71-0.85 of cuBLAS where
# the model's picks ran 0.49-0.69; under 2^19 outputs (BERT's seq-128 layers, split over K) its picks
# were as fast or faster (0.90-1.21).
MANY_OUTPUTS = 1 << 19


def _min_threads(outputs: int) -> int:
    """256 threads a block from MANY_OUTPUTS outputs, else 64; TLMPACK_CUDA_GEMM_MIN_THREADS overrides
    (an A/B knob for bench/gpu_gemm.py, not a build option)."""
    override = os.environ.get("TLMPACK_CUDA_GEMM_MIN_THREADS", "")
    if override:
        return int(override)
    return 256 if outputs >= MANY_OUTPUTS else 64


def _score(hw, m, n, k, batch, ty, tx, tm, tn, bk, ks) -> float | None:
    threads = ty * tx
    bm, bn = ty * tm, tx * tn
    kc = k // ks
    smem = 4 * STAGES * (bm * (bk + PAD) + bk * (bn + PAD))
    if smem > hw.max_shared_memory_per_block:
        return None
    regs = tm * tn + tm + tn + 40
    if regs > 255:
        return None
    per_sm = min(2048 // threads, hw.registers_per_sm // (threads * regs), hw.shared_memory_per_sm // smem, 32)
    if per_sm < 1:
        return None
    blocks = batch * (m // bm) * (n // bn) * ks
    if ks > 1 and (blocks // ks >= SPLIT_BELOW_WAVES * hw.sm_count or blocks > SPLIT_UP_TO_WAVES * hw.sm_count):
        return None  # split only grids too small for the SMs, and only up to a few waves
    on_sm = math.ceil(blocks / hw.sm_count)  # blocks the busiest SM runs
    resident = min(on_sm, per_sm)
    work = on_sm * bm * bn * kc  # FMAs
    warp_steps = work / (tm * tn) / 32  # one warp's K step: TM*TN FMAs, TM + TN shared words a thread
    issue = warp_steps * (tm * tn + tm + math.ceil(tn / 4) + 2) / 4  # 4 schedulers, one instruction a clock
    rows_per_warp = max(1, 32 // tx)  # A's words: broadcast within a row of threads, rows conflict
    a_wavefronts = tm * rows_per_warp
    b_wavefronts = max(tn * tx / 32, math.ceil(tn / 4)) * (2 if tn == 8 else 1)  # LDS.128 of 8-word rows: 2-way
    shared = warp_steps * (a_wavefronts + b_wavefronts)  # one 128-byte wavefront a clock
    l2 = on_sm * (bm + bn) * kc / L2_WORDS_PER_CLK
    dram = 4 * batch * (m * k + k * n + m * n * (2 * ks - 1 if ks > 1 else 1)) / DRAM_BYTES_PER_CLK / hw.sm_count
    latency = math.ceil(on_sm / per_sm) * (kc // bk) * LOAD_LATENCY_CLK / (STAGES * min(resident, 4))
    sm_time = max(issue, shared, l2, dram, latency)
    warps = resident * math.ceil(threads / 32)
    if warps < 8:
        sm_time *= 8 / warps
    if ks > 1:
        sm_time += LAUNCH_CLK
    return sm_time


def fetch_vector(words: int, row_words: int, threads: int) -> int:
    """The widest vector that divides a tile row and spreads the tile evenly over the threads."""
    return next((v for v in FETCH_VECTORS if row_words % v == 0 and words % (threads * v) == 0), 1)


def _forced_plan(m: int, n: int, k: int) -> dict | None:
    """A/B knob for bench/gpu_gemm.py (not a build option): TLMPACK_GEMM_EXPERIMENT's
    ``plan=TMxTN/TYxTX/BK`` forces one whole-K point where it divides the loops."""
    from ..cuda_gemm_sketch import GEMM_EXPERIMENT

    if "plan" not in GEMM_EXPERIMENT:
        return None
    regs, threads, bk = GEMM_EXPERIMENT["plan"].split("/")
    (tm, tn), (ty, tx) = (map(int, regs.split("x")), map(int, threads.split("x")))
    if m % (ty * tm) or n % (tx * tn) or k % int(bk):
        return None
    return {"tm": tm, "tn": tn, "ty": ty, "tx": tx, "bk": int(bk), "ks": 1, "score": 0.0}


def _a_k_major() -> bool:
    from ..cuda_gemm_sketch import GEMM_EXPERIMENT

    return bool(GEMM_EXPERIMENT.get("a_k_major"))


@register
class CudaGemm(Rule):
    name = "cuda-gemm"
    target = "cuda"

    def is_eligible(self, task: TaskClass, hardware: Any) -> bool:
        return gemm_extents(task) is not None

    def sketch_order(self, sketches: list[tuple[str, ...]], task: TaskClass, hardware: Any) -> list[int]:
        """The appended sketches (their staged tiles are padded: StorageAlign), the split-K one
        first when the plan splits K; the others are cuda-matmul's."""
        ours = [i for i, steps in enumerate(sketches) if "StorageAlign" in steps]
        split = [i for i in ours if any(step.startswith("RFactor") for step in sketches[i])]
        whole = [i for i in ours if i not in split]
        chosen = plan(task, hardware)
        if chosen is None:
            return []
        return split + whole if chosen["ks"] > 1 else whole + split

    def decisions(self, task: TaskClass, sites: list[SamplingSite], hardware: Any) -> Decisions | None:
        extents = gemm_extents(task)
        if extents is None or len(sites) != 6 or [s.kind for s in sites] != ["tile"] * 3 + ["categorical"] * 3:
            return None
        m, n, k, _ = extents
        tile_m, tile_n, tile_k = sites[:3]
        if (tile_m.extent, tile_n.extent, tile_k.extent) != (m, n, k):
            return None
        chosen = plan(task, hardware, split_k=tile_k.parts == 3)
        if chosen is None:
            return None
        tm, tn, ty, tx, bk, ks = (chosen[key] for key in ("tm", "tn", "ty", "tx", "bk", "ks"))
        threads = ty * tx
        out: Decisions = {
            tile_m.index: (m // (ty * tm), ty, tm),
            tile_n.index: (n // (tx * tn), tx, tn),
            tile_k.index: (ks, k // (ks * bk), bk) if tile_k.parts == 3 else (k // bk, bk),
        }
        # A's tile is BM x BK words, B's BK x BN, rows along either (the class does not say the layout)
        conv = _conv_shape(task)
        for operand, (site, side) in enumerate(zip(sites[3:5], (ty * tm, tx * tn), strict=True)):
            vector = fetch_vector(side * bk, math.gcd(side, bk), threads)
            if conv and (operand == 1 or conv[1] > 1):
                # a conv's input box (its rows' width, a stride) and a windowed weight's rows
                # (ci, kh, kw) do not say what a vector load would need: scalar fetches
                vector = 1
            if operand == 0 and not conv and _a_k_major():
                vector = 1  # a k-major A tile is written across its rows: no vector store
            out[site.index] = site.candidates.index(vector) if vector in site.candidates else 0
        unroll = sites[5]
        out[unroll.index] = unroll.candidates.index(UNROLL) if UNROLL in unroll.candidates else 0
        return out
