"""MetaSchedule's CUDA design space without tensor cores.

TVM's "from-target" CUDA space (ScheduleRule/Postproc "cuda-tensorcore" for sm_70+) needs every
CUDA tensor intrinsic registered, which costs 36-50 s of Python import on 2 cores, and our models
are fp32, where the tensor-core tiling never matches. This is TVM 0.27's ``ScheduleRule.create
("cuda")`` / ``Postproc.create("cuda")`` written out, in the same order and with the same
arguments, except that the grid caps (AutoBind / RewriteUnboundBlock ``max_threadblocks``, 256 in
TVM) follow the GPU: enough 256-thread blocks to fill every SM (``sm_count * 2048 / 256``), so
memory-bound pointwise kernels keep enough loads in flight on a 132-SM part.
"""

from __future__ import annotations

from typing import Any

# TVM's default-CUDA arguments (src/s_tir/meta_schedule/schedule_rule/schedule_rule.cc).
VECTOR_LOAD_LENS = [1, 2, 3, 4, 8, 16]
CROSS_THREAD_EXTENTS = [4, 8, 16, 32, 64, 128, 256, 512]
UNROLL_MAX_STEPS = [0, 16, 32, 64, 128, 256, 512, 1024]
AUTO_BIND_THREADS = [32, 64, 128, 256, 512, 1024]
DEFAULT_MAX_THREADBLOCKS = 256
THREADS_PER_SM = 2048  # every arch from sm_70 to sm_90


def max_threadblocks(sm_count: int | None) -> int:
    """Grid cap for loops AutoBind binds: full occupancy at 256 threads per block."""
    if not sm_count:
        return DEFAULT_MAX_THREADBLOCKS
    return max(DEFAULT_MAX_THREADBLOCKS, sm_count * THREADS_PER_SM // 256)


def schedule_rules(sm_count: int | None = None) -> list[Any]:
    """The default CUDA schedule rules minus tensor cores."""
    from tvm.s_tir.meta_schedule import schedule_rule as R

    return [
        R.ApplyCustomRule(),
        R.MultiLevelTiling(
            structure="SSSRRSRS",
            tile_binds=["blockIdx.x", "vthread.x", "threadIdx.x"],
            max_innermost_factor=64,
            vector_load_lens=VECTOR_LOAD_LENS,
            reuse_read=R.ReuseType(req="must", levels=[4], scope="shared"),
            reuse_write=R.ReuseType(req="must", levels=[3], scope="local"),
        ),
        R.InlineConstantScalars(),
        R.AutoInline(into_producer=True, into_consumer=True, inline_const_tensor=True,
                     disallow_if_then_else=False, require_injective=False, require_ordered=False,
                     disallow_op=[]),
        R.CrossThreadReduction(thread_extents=CROSS_THREAD_EXTENTS),
        R.ParallelizeVectorizeUnroll(max_jobs_per_core=-1, max_vectorize_extent=-1,
                                     unroll_max_steps=UNROLL_MAX_STEPS, unroll_explicit=True),
        R.AutoBind(max_threadblocks=max_threadblocks(sm_count), thread_extents=AUTO_BIND_THREADS),
    ]


def postprocs(sm_count: int | None = None) -> list[Any]:
    """The default CUDA postprocessors (VerifyGPUCode last: it refuses points over the limits)."""
    from tvm.s_tir.meta_schedule import postproc as P

    return [
        P.DisallowDynamicLoop(),
        P.RewriteCooperativeFetch(),
        P.RewriteUnboundBlock(max_threadblocks=max_threadblocks(sm_count)),
        P.RewriteParallelVectorizeUnroll(),
        P.RewriteReductionBlock(),
        P.VerifyGPUCode(),
    ]


def space_generator(sm_count: int | None = None) -> Any:
    """A post-order-apply space generator over these rules (no mutators: we never evolve)."""
    from tvm.s_tir.meta_schedule.space_generator import PostOrderApply

    return PostOrderApply(sch_rules=schedule_rules(sm_count), postprocs=postprocs(sm_count), mutator_probs={})
