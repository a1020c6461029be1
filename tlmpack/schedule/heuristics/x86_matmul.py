"""x86 matmul-like rule (dense, batch matmul, conv2d): a register tile of about half the vector
registers in accumulators, innermost, inside the inner reduction loop; every other spatial loop
outermost, where the postprocessor fuses and parallelises it.

Decisions on MetaSchedule's llvm SSRSRS sketch: each spatial loop is a 4-way tile (levels 0, 1
outside the reduction, 2 between its chunks, 3 innermost), each reduction loop a 2-way tile.
Why these numbers (docs/x86-performance-notes.md has the measurements):
- level 3 holds the register tile: the last spatial loop (contiguous in the output) as one or
  two full vectors, and ``rows`` of the loop that the vector-loaded operand ignores (its value is
  broadcast), so each FMA has an independent accumulator: at least FMA latency (4-5) × FMA
  ports (2), as many as the registers hold beside the operands (accumulator_budget): 12 on AVX2
  (2 vectors × 6 rows, 15 of 16 ymm registers: GPT-2's dense layers on a Zen 2 EPYC, 2 threads,
  rows padded 128 -> 132, 122-131 -> 147-166 GFLOP/s, against 2 × 4 = 8; a third vector a row,
  4 × 3, spilled and ran 2.6x slower), 16 with AVX-512's 32 registers; when that loop is
  too short for the best tile, the rows come from two loops (a channels-last convolution's H and
  W: a 14x14 map gets 2 x 2 pixels of two vectors, not 7 pixels of one; ResNet-50's 14x14 3x3
  convolution over 256 channels, one thread: 3009 -> 2463 us, its 1x1 1024 -> 256 1349 -> 1071 us);
- level 1 walks every register-row tile of a dense layer (columns outside rows in the parallel
  loop: each thread streams its weight panels once; 16-core Xeon: BERT-base 45.5 -> 36.4 ms) and,
  for a convolution, as many as keep 8 parallel chunks per core, so a task reuses the packed
  weight panel it streams across more rows (bert-base's dense layers: 196 -> 175 ms);
  a convolution with far more weights than inputs (weight_bound) moves its pixel loops into level
  1 as well, as far as the cores' chunks allow, so each weight panel is read once per call and
  not once per row of pixels (ResNet-50's 7x7 stage in the whole model, one thread: 3x3 over 512
  channels 4559 -> 3788 us, 1x1 1024 -> 2048 4353 -> 3259 us; in isolation, weights in cache,
  no change); those cores' chunks are one a core, not 8: built for 16 cores, 8 a core kept the
  7x7 stage's rows in the parallel loop, each 590 KB panel streamed once per row, and on the
  16-core Xeon that stage ran 2.4-3.1x onnxruntime's time per node; with one a core 0.61-0.86x,
  the whole ResNet-50 0.90-0.95x its time at 16 threads (BENCHMARKS.md 2026-12-06 14:13);
- on one core, a task with a single output row (a GEMV: a classifier's dense layer, a
  squeeze-excite 1x1 convolution, a global pool written as a matmul) walks its column tiles at
  level 2, inside the outer reduction loop, so each step streams a whole contiguous row of the
  operand it reads, not one 64-byte strip a row per column tile (AVX2 EPYC, one thread: alone,
  EfficientNet-B0's 56x56x144 pool-as-matmul 45 -> 28 us, its SE convolutions 480 -> 20 3.1 ->
  1.0 us and 1152 -> 48 5.6 -> 2.7 us, MobileNetV2's classifier 129 -> 92 us; in the whole
  1-thread model its 15 such kernels 0.75-0.91x over four rounds). Not where an epilogue
  broadcasts the row (a squeeze-excite gate: 1.8-4.6x slower so), and not on two cores or more,
  where the column tiles stay the parallel loop: in a 2-thread model the placement with 3 or with
  1 parallel chunks made them 1.55x and 2.3x slower (BENCHMARKS.md 2026-12-05 23:45);
- a reduction loop keeps an inner chunk of at most 8 (a whole 3x3 or 7x7 window stays inner; 64
  for a dense's K measured 5% slower);
- unroll 64 (0 is 2-3x slower, more gains nothing); a dense convolution's padding stays its own
  block; a depthwise one's is inlined where TVM allows it, else computed under the outer tile
  loops, inside each parallel chunk (MobileNetV2's 3x3 depthwise convolutions on one thread,
  under the tile against their own block at the root: 56x56x96 390 -> 248 us, 28x28x144 127 ->
  78 us; inlined against under the tile, 2 threads: its 10 depthwise kernels 1.27x faster,
  EfficientNet-B0's 12 1.19x, every one faster or level);
- an epilogue that broadcasts the result (squeeze-excite: sigmoid of a 1x1 conv's 480 values
  scales a 480x14x14 tensor) is computed inside the tile (the sketches with ReverseComputeAt):
  left at the root, the inlined sigmoid runs once per output element behind a fused, divided
  index, 11-31x slower than the best random program on all ten of efficientnet-b0's;
- so is a convolution's element-wise tail (bias, ReLU6, SiLU, residual add): at the root it is a
  second pass over an output that has left the cache (MobileNetV2, one thread: 112x112x96 1x1
  conv + bias + ReLU6 2353 -> 491 us, 56x56x144 1289 -> 599 us). That held first for convolutions
  of at most 160 multiply-adds an output only; on the Zen 2 EPYC, 2 threads, ResNet-50's 14x14
  1x1 convolution 256 -> 1024 with its residual add ran 627-658 -> 548 us alone, and with the
  channel order below the whole model 0.98-0.99x. Matmuls keep their tail at the root (bert-base,
  gpt2 unchanged), except a tail that slices off the rows or columns pad_awkward_extents padded:
  at the root it is a second pass over the whole padded result (GPT-2's LM head: a 26.5 MB
  intermediate, its 57 ms 4-5 ms more than the bare matmul's), inside the tile it writes only the
  kept part of each tile (Zen 2, 2 threads, paired: GPT-2 0.94x, BERT-base and a 197-token
  encoder 0.96x, bitwise-equal outputs; BENCHMARKS.md 2026-12-06 17:10);
- a channels-last dense convolution over 16 or more input channels walks its output-channel tiles
  inside its pixel tiles (level 1), as far as the cores' parallel chunks allow: each pixel tile's
  input stays in L1 for every channel tile, and the tail reads and writes whole contiguous pixels
  (a residual's 256 channels are 1 KB), not one 64-byte strip a pixel per channel tile, which the
  prefetcher cannot follow at a 1 KB stride. Alone, with everything in cache, no change (56x56
  64 -> 256: 582-597 against 575-583 us); in the whole model, where the tail's residual comes from
  L3 or memory, ResNet-50's 56x56 and 28x28 kernels ran 0.86-0.95x (the 1x1 ones with a residual
  add 0.86-0.90x). Not an image stem over 3 channels (1.11x slower so: its 7x7x3 weight panel
  stays in L1 under the channel tiles outside), nor weight-bound ones (they stream each panel
  once). Whole models with both changes, paired (BENCHMARKS.md 2026-12-06 10:50): ResNet-50
  0.97x, MobileNetV2 and EfficientNet-B0 0.98x.
  Since the tail's lines are prefetched (lower/x86_prefetch.py), a 1x1 convolution over 128 input
  channels or more keeps its channel tiles outside again: ResNet-50's 28x28 residual convolution
  723-755 -> 600-605 us, its 512 -> 256 one 0.96x, the model 0.99x paired twice; over 64 channels
  the 56x56 residual one was 1.05-1.08x slower outside, so it stays inside (MobileNetV2 and
  EfficientNet-B0 1.00; BENCHMARKS.md 2026-12-06 17:40).
- on AVX-512, a channels-last 1x1 convolution over at most 128 input channels (narrow_pointwise)
  holds one vector of output channels by 8 pixels (8 accumulators), not two by 8: its reduction is
  short, so each tile is mostly start and tail, and the narrower tile ran faster alone on the Zen 4
  EPYC, 2 threads, interleaved: ResNet-50's 56x56 64 -> 256 residual convolution 0.83-0.90x (two
  vectors by 7 pixels 0.96x, one by 16 pixels 1.10x), its 28x28 128 -> 512 one 0.90-0.95x,
  MobileNetV2's 112x112 16 -> 96 0.73x and 56x56 24 -> 144 (one vector by 16 pixels before) 0.79x;
  over 256 channels or more it gained nothing (0.95-1.02x). In the whole ResNet-50, kernel by
  kernel, about 1.1 ms a run less (BENCHMARKS.md 2026-12-06 21:40); on the 16-core Xeon the seed CNNs
  were level with it in both load orders (0.97-1.04x, 23:15).
- on AVX-512, a channels-last depthwise convolution holds 8 accumulators, not 16
  (depthwise_channels_last): each of its multiply-adds loads its own input vector (there is no
  broadcast operand to share), so the wider tile only adds register pressure. In the store's Zen 4
  groups the fastest programs of such tasks halve the rules' pixel tile (28x28x200 5x5: 14 -> 7
  pixels, 1.32-1.36x; 112 -> 56 stride 2 over 96 channels: 8 -> 4 pixels of two vectors, 1.13-1.25x).
  In the whole model, Zen 4, 2 threads, kernel by kernel: MobileNetV2's ten 0.57-1.05x (56x56x144
  150 -> 86 us, 112x112x32 124 -> 91 us), EfficientNet-B0's twelve 0.77-1.10x; paired, both models
  0.98x (BENCHMARKS.md 2026-12-07 21:15). Not measured on the Xeon; AVX2 keeps its budget.
"""

from __future__ import annotations

import math
from typing import Any

from ...schedule.space import SamplingSite
from .classify import TaskClass
from .registry import Decisions, Rule, register


def largest_divisor_at_most(n: int, bound: int) -> int:
    for d in range(min(n, max(bound, 1)), 0, -1):
        if n % d == 0:
            return d
    return 1


def vector_tile(extent: int, lanes: int) -> int:
    """Two full vectors if they divide the loop, else one, else the largest divisor under one
    vector (a 14-wide row gets 7)."""
    for candidate in (2 * lanes, lanes):
        if extent % candidate == 0:
            return candidate
    return largest_divisor_at_most(extent, lanes)


def rows_axis(task: TaskClass) -> int | None:
    """The spatial loop that the vector-loaded operand (the one depending on the last spatial
    loop) ignores — the largest such; None when there is none."""
    last = len(task.spatial) - 1
    for ignored in task.reuse.values():
        if last not in ignored:
            candidates = [a for a in ignored if task.spatial[a] > 1]
            if candidates:
                return max(candidates, key=lambda a: (task.spatial[a], a))
    return None


def second_rows_axis(task: TaskClass, first: int) -> int | None:
    """Another loop whose rows the register tile may take, beside ``first``: the largest other
    spatial loop (not the last) that the vector-loaded operand ignores too, when some operand is
    broadcast along the vector (it ignores the last loop). A channels-last convolution's H beside
    W: a 14-wide map gets 2 x 2 pixels of 2 vectors (8 accumulators) instead of 7 pixels of one.
    None for a depthwise convolution, whose input is vector-loaded per pixel as well."""
    last = len(task.spatial) - 1
    if not any(last in ignored for ignored in task.reuse.values()):
        return None
    for ignored in task.reuse.values():
        if last not in ignored and first in ignored:
            candidates = [a for a in ignored if a not in (first, last) and task.spatial[a] > 1]
            if candidates:
                return max(candidates, key=lambda a: (task.spatial[a], a))
    return None


def accumulator_budget(vector_registers: int) -> int:
    """Accumulators a register tile may hold: all registers but the operands of two vectors a
    row and a broadcast (and one spare), at most 16 (AVX-512's 2 x 8, as measured there)."""
    return min(16, vector_registers - 4)


def register_rows(vector_registers: int) -> int:
    """Rows of the two-vector register tile: what a padded matmul's row count should divide."""
    return accumulator_budget(vector_registers) // 2


def register_tile_2d(vector_extent: int, rows_extent: int, second_extent: int, lanes: int,
                     accumulators: int, max_vectors: int = 2) -> tuple[int, int, int]:
    """(innermost extent, rows, second rows): register_tile's choice with the rows taken from two
    loops (their product), each split exactly. The same ranking, then the fewest second rows, so
    a loop that alone gives the best tile keeps it (a 56-wide map: 4 x 1 pixels of 2 vectors)."""
    best = (0, 0, 0, 0, 0, 0, 0)
    for vectors in range(1, max_vectors + 1):
        inner = vectors * lanes
        if vector_extent % inner:
            continue
        budget = accumulators // vectors
        for second in range(1, min(second_extent, budget) + 1):
            if second_extent % second:
                continue
            rows = largest_divisor_at_most(rows_extent, budget // second)
            total = rows * second
            best = max(best, (vectors * total, -(vectors + total), -vectors, -second, inner, rows, second))
    if best[0] == 0:
        inner, rows = register_tile(vector_extent, rows_extent, lanes, accumulators, max_vectors)
        return inner, rows, 1
    return best[4], best[5], best[6]


def register_tile(vector_extent: int, rows_extent: int, lanes: int, accumulators: int,
                  max_vectors: int = 2) -> tuple[int, int]:
    """(innermost extent, rows): as many independent accumulators (vectors x rows) as the budget
    allows, each loop split exactly; ties go to the fewest loads per step (vectors + rows: 2 x 4
    beats 8 x 1), then to fewer vectors (4 rows x 2 vectors measured best). A loop
    shorter than a vector, or with no vector-multiple divisor, gets one partial vector."""
    best = (0, 0, 0, 0, 0)
    for vectors in range(1, max_vectors + 1):  # more than 2 a row measured slower (spills, wide tails)
        inner = vectors * lanes
        if vector_extent % inner:
            continue
        rows = largest_divisor_at_most(rows_extent, accumulators // vectors)
        best = max(best, (vectors * rows, -(vectors + rows), -vectors, inner, rows))
    if best[0] == 0:
        inner = vector_tile(vector_extent, lanes)
        return inner, largest_divisor_at_most(rows_extent, accumulators)
    return best[3], best[4]


def row_block(row_tiles: int, parallel_other: int, cores: int, convolution: bool = False) -> int:
    """Register-row tiles a parallel task walks at level 1.

    A dense or batch matmul puts all of them there: the postprocessor fuses level 1 into the
    parallel loop anyway (as many chunks as before), but with the column tiles outside the row
    tiles, so each thread streams its few weight panels once for all rows instead of every
    panel once per row block (the H200 machine's 16-core Xeon, 16 threads: BERT's linear layers
    1.2-1.4x faster, BERT-base 45.5 -> 36.4 ms; on 2 cores the old rule already chose this).
    A convolution keeps as many as leave at least 8 parallel chunks per core outside level 1
    (its row operand, an input patch, is large; not measured the other way)."""
    if not convolution:
        return row_tiles
    for block in range(row_tiles, 0, -1):
        if row_tiles % block == 0 and (row_tiles // block) * parallel_other >= 8 * cores:
            return block
    return 1


# a dense convolution with this many times more weights than input elements streams its weight
# panels once (module notes); ResNet-50's 28x28 3x3 convolutions (1.5x) measured slower that way
WEIGHT_BOUND_RATIO = 2


def weight_bound(task: TaskClass) -> bool:
    """A dense convolution whose weight outweighs its input (elements: output channels x the
    reduction, against output pixels x input channels, so a strided one's input is undercounted):
    ResNet-50's later stages, 2.4 M weights for 25 k inputs in a 7x7 3x3 convolution over 512
    channels."""
    if not dense_convolution(task) or not channels_last(task):
        return False
    weight = task.spatial[-1] * macs_per_output(task)
    return weight >= WEIGHT_BOUND_RATIO * math.prod(task.spatial[:-1]) * task.reduction[-1]


def channels_last(task: TaskClass) -> bool:
    """The weight follows only the output's last loop (NHWC: output channels), ignoring every pixel loop."""
    last = len(task.spatial) - 1
    return any(set(ignored) == set(range(last)) for ignored in task.reuse.values())


# a convolution over fewer input channels than this (an image stem's 3) keeps its channel tiles outermost
CHANNELS_INSIDE_MIN_INPUT = 16
# a 1x1 convolution over this many input channels or more keeps its channel tiles outside (module notes)
POINTWISE_OUTSIDE_MIN_INPUT = 128


def channels_inside_pixels(task: TaskClass) -> bool:
    """Whether a channels-last convolution walks its output-channel tiles inside its pixel tiles
    (module notes): dense, not weight-bound (those stream each weight panel once), and over enough
    input channels that a pixel tile's input is worth keeping in L1 across every channel tile."""
    if not dense_convolution(task):
        return False
    pointwise_deep = pointwise(task) and task.reduction[-1] >= POINTWISE_OUTSIDE_MIN_INPUT
    return (channels_last(task) and not weight_bound(task) and not pointwise_deep
            and task.reduction[-1] >= CHANNELS_INSIDE_MIN_INPUT)


# a channels-last 1x1 convolution over at most this many input channels gets a one-vector tile on
# AVX-512 (module notes), of this many accumulators
NARROW_POINTWISE_MAX_INPUT = 128
NARROW_POINTWISE_ACCUMULATORS = 8


def narrow_pointwise(task: TaskClass, hardware) -> bool:
    """A dense channels-last 1x1 convolution over few input channels, to whole vectors of output
    channels, on a map of at least a tile's pixels, on AVX-512: its register tile is one vector of
    output channels by 8 pixels, not two by 8 (module notes). Not a squeeze-excite convolution over
    one pixel (a GEMV: 44 -> 83 us so)."""
    if hardware.lanes(32) != 16 or not dense_convolution(task):
        return False
    return (pointwise(task) and channels_last(task) and task.reduction[-1] <= NARROW_POINTWISE_MAX_INPUT and task.spatial[-1] % hardware.lanes(32) == 0
            and math.prod(task.spatial[:-1]) >= NARROW_POINTWISE_ACCUMULATORS)


# a channels-last depthwise convolution's register tile on AVX-512 (module notes)
DEPTHWISE_ACCUMULATORS = 8


def depthwise_channels_last(task: TaskClass, hardware) -> bool:
    """A channels-last grouped (depthwise) convolution on AVX-512: its register tile holds
    DEPTHWISE_ACCUMULATORS accumulators, not the budget's 16 (module notes)."""
    return (hardware.lanes(32) == 16 and is_convolution(task) and task.block.startswith("group_conv")
            and bool(task.reduction) and channels_last(task))


def single_row(task: TaskClass) -> bool:
    """One output row (every spatial loop but the last, the vector loop, has extent 1) and no
    epilogue that broadcasts it: a squeeze-excite gate computed inside the tile (sketch_order) ran
    1.8-4.6x slower with its column tiles inside the reduction loop (EfficientNet-B0, one thread)."""
    return len(task.spatial) >= 2 and math.prod(task.spatial[:-1]) == 1 and task.epilogue_growth == 1


# parallel chunks a core: enough that a delayed thread's share is taken by the others
CHUNKS_PER_CORE = 8
# for a weight-bound convolution: every pixel chunk streams every weight panel again, so one a core
# (module notes)
WEIGHT_BOUND_CHUNKS_PER_CORE = 1


def outer_chunks(tiles: int, others: int, cores: int, per_core: int = CHUNKS_PER_CORE) -> int:
    """How many of a loop's ``tiles`` stay in the parallel level-0 loop: the fewest (a divisor)
    that, with the ``others`` chunks of the other level-0 loops, keep ``per_core`` parallel chunks
    per core."""
    for count in range(1, tiles + 1):
        if tiles % count == 0 and count * others >= per_core * cores:
            return count
    return tiles


def is_convolution(task: TaskClass) -> bool:
    return "conv" in task.block


def dense_convolution(task: TaskClass) -> bool:
    """A convolution that is not grouped (depthwise), with a reduction."""
    return is_convolution(task) and not task.block.startswith("group_conv") and bool(task.reduction)


def pointwise(task: TaskClass) -> bool:
    """A 1x1 convolution: every reduction loop but the input channels has extent 1."""
    return bool(task.reduction) and math.prod(task.reduction[:-1]) == 1


def macs_per_output(task: TaskClass) -> int:
    product = 1
    for extent in task.reduction:
        product *= extent
    return product


def tail_in_tile(task: TaskClass) -> bool:
    """Whether the epilogue is computed inside the register tile's loops (module notes)."""
    return task.epilogue_growth >= 2 or is_convolution(task) or task.epilogue_drops


INLINE = -2  # a compute location: the producer inlined into its consumer (schedule.space)


def producer_location(task: TaskClass) -> tuple[int, ...]:
    """Where a producer of the main block (a convolution's padding) is computed, in order of
    preference (select.py takes the first TVM allows, or the nearest legal loop outside a loop it
    refuses): for a grouped (depthwise) convolution inlined, else under the outermost tile level, so
    each parallel chunk pads just the input rows and channels it reads while they are in cache; a
    dense convolution's stays its own block (it would pad all its input channels again for every
    chunk of output channels). Inlined, a channels-last depthwise convolution's padding ran
    1.41-2.32x faster than under the tile (9 of 9 tasks, AVX-512, one thread; BENCHMARKS.md
    2026-12-03 18:30)."""
    if not task.block.startswith("group_conv"):
        return (-1,)
    return (INLINE, len(task.spatial) - 1)


@register
class X86Matmul(Rule):
    name = "x86-matmul"
    target = "x86"

    def is_eligible(self, task: TaskClass, hardware) -> bool:
        return task.kind == "matmul" and len(task.spatial) >= 2

    wants_locations = True  # a convolution's padding goes under its parallel loop (module notes)

    def sketch_order(self, sketches: list[tuple[str, ...]], task: TaskClass, hardware: Any) -> list[int]:
        order = list(range(len(sketches)))
        if tail_in_tile(task):
            fused = [i for i in order if "ReverseComputeAt" in sketches[i]]
            order = fused + [i for i in order if i not in fused]
        return order

    def decisions(self, task: TaskClass, sites: list[SamplingSite], hardware) -> Decisions | None:
        lanes = hardware.lanes(32)
        accumulators = accumulator_budget(hardware.vector_registers)
        max_vectors = 2
        if narrow_pointwise(task, hardware):
            accumulators, max_vectors = NARROW_POINTWISE_ACCUMULATORS, 1
        elif depthwise_channels_last(task, hardware):
            accumulators = DEPTHWISE_ACCUMULATORS
        spatial = [s for s in sites if s.kind == "tile" and s.parts == 4]
        if len(spatial) != len(task.spatial) or [s.extent for s in spatial] != list(task.spatial):
            return None  # not the SSRSRS sketch of the main block
        chosen: Decisions = {}
        last = len(spatial) - 1
        rows_at = rows_axis(task)
        if rows_at is None or rows_at == last:
            rows_at = last - 1
        second_at = second_rows_axis(task, rows_at)
        if second_at is None:
            inner, rows = register_tile(spatial[last].extent, spatial[rows_at].extent, lanes, accumulators,
                                        max_vectors)
            second = 1
        else:
            inner, rows, second = register_tile_2d(spatial[last].extent, spatial[rows_at].extent,
                                                   spatial[second_at].extent, lanes, accumulators, max_vectors)
        tiles = spatial[last].extent // inner
        if single_row(task) and hardware.cores == 1:  # module notes: stream whole rows, not strips
            chosen[spatial[last].index] = (1, 1, tiles, inner)
        else:
            chosen[spatial[last].index] = (tiles, 1, 1, inner)
        parallel_other = 1  # parallel chunks from the loops kept outermost
        for position, site in enumerate(spatial):
            if position == last:
                parallel_other *= site.extent // inner
            elif position == second_at:
                parallel_other *= site.extent // second
            elif position != rows_at:
                parallel_other *= site.extent
        for position, site in enumerate(spatial[:last]):
            if position == rows_at:
                block = row_block(site.extent // rows, parallel_other, hardware.cores, is_convolution(task))
                chosen[site.index] = (site.extent // (rows * block), block, 1, rows)
            elif position == second_at:
                chosen[site.index] = (site.extent // second, 1, 1, second)
            else:
                chosen[site.index] = (site.extent, 1, 1, 1)
        if weight_bound(task):
            # level 0 loops fuse in loop order (n, h, w, c): with the loops before the channels kept
            # outer, every chunk of pixels streams all the weight panels again; moved into level 1
            # (as far as the cores' chunks allow), each panel is read once and reused from cache
            for site in spatial[:last]:
                first, block, middle, innermost = chosen[site.index]
                others = math.prod(chosen[s.index][0] for s in spatial if s is not site)
                count = outer_chunks(first, others, hardware.cores, WEIGHT_BOUND_CHUNKS_PER_CORE)
                chosen[site.index] = (count, first // count * block, middle, innermost)
        if channels_inside_pixels(task):
            # the channel tiles go to level 1, inside the pixel tiles, as far as the cores' chunks allow
            site = spatial[last]
            first, block, middle, innermost = chosen[site.index]
            others = math.prod(chosen[s.index][0] for s in spatial[:last])
            count = outer_chunks(first, others, hardware.cores)
            chosen[site.index] = (count, first // count * block, middle, innermost)
        for site in sites:
            if site.kind == "tile" and site.parts == 2:
                bound = site.max_innermost if site.max_innermost > 0 else site.extent
                inner_r = site.extent if site.extent <= min(bound, 7) else largest_divisor_at_most(site.extent, min(bound, 8))
                chosen[site.index] = (site.extent // inner_r, inner_r)
            elif site.kind == "categorical":
                chosen[site.index] = site.candidates.index(64) if 64 in site.candidates else len(site.candidates) // 2
            elif site.kind == "compute_location":
                chosen[site.index] = producer_location(task)
        return chosen
