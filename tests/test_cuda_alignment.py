"""cuda_alignment.py: a point whose cp.async copies start off their width is refused before codegen
(on the GPU it faulted: CUDA error: misaligned address), and an aligned point of the same task is not.
The points are two measured programs of a ResNet-50 convolution (data/tasks), MetaSchedule's second
CUDA sketch, from the 2026-12-01 H200 batch: one crashed there, one ran and matched."""

from __future__ import annotations

import pytest

from tlmpack.errors import LoweringError

TASK = "2b643070b2b91dcc"
CRASHED = [["tile", [4, 2, 2, 1, 1]], ["tile", [4, 2, 1, 6, 2]], ["tile", [1, 1, 7, 2, 1]], ["tile", [1, 1, 7, 2, 1]],
           ["tile", [384, 1, 1]], ["tile", [1, 1, 1]], ["tile", [1, 1, 1]], ["categorical", 2], ["categorical", 1],
           ["categorical", 6]]
RAN = [["tile", [8, 1, 2, 1, 1]], ["tile", [1, 4, 8, 3, 1]], ["tile", [2, 1, 7, 1, 1]], ["tile", [2, 1, 1, 1, 7]],
       ["tile", [64, 6, 1]], ["tile", [1, 1, 1]], ["tile", [1, 1, 1]], ["categorical", 1], ["categorical", 2],
       ["categorical", 5]]


def _scheduled(decisions):
    from tlmpack.schedule.records import Decision
    from tlmpack.schedule.space import DesignSpace
    from tlmpack.training.corpus import load_func
    from tlmpack.training.cuda_programs import cuda_tvm_target
    from tlmpack.training.sample import replay_point
    from tlmpack.training.store import Store

    func = load_func(Store("data").task(TASK))
    point = replay_point(DesignSpace(func, cuda_tvm_target()), 1, tuple(Decision.from_json(d) for d in decisions))
    assert point is not None
    return point.func


def test_a_point_with_misaligned_cp_async_is_refused_before_codegen():
    from tlmpack.lower.cuda import generate
    from tlmpack.training.cuda_programs import _code_target

    with pytest.raises(LoweringError, match=r"TVM failed to build the CUDA kernels: .*2 misaligned cp.async; "
                                            r"t_kernel: 8-byte cp.async \(global side\) at element offset "
                                            r"cse_v12 \+ 1, not provably a multiple of 2"):
        generate({"t": _scheduled(CRASHED)}, _code_target())


def test_an_aligned_point_of_the_same_task_generates():
    from tlmpack.lower.cuda import generate
    from tlmpack.training.cuda_programs import _code_target

    source, launches = generate({"t": _scheduled(RAN)}, _code_target())
    assert "cp_async" in source and launches["t"].launches
