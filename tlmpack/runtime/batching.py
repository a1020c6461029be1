"""Dynamic batch: the plans' cost model and how a batch is covered by them.

The build writes one cost per (target, batch plan) into the artifact's ``batch_plans`` file; the C
runtime (runtime_c/tlmrt_batch.c) covers a caller's batch with the plans at the least total cost,
by the same dynamic programme as ``cover`` here (which `tlmpack inspect` and the tests use).

The cost model: the build counts each plan's work (``PlanWork``: its kernel calls or launches, the
floating-point operations of its kernels from TVM's estimate of each task's TIR, the same counted as
vector-lane work, and the bytes its kernels' arguments take), and a run's estimated time is

    RUN_NS + lane_flops / FLOP_RATE + bytes / BYTE_RATE + calls * CALL_NS          (nanoseconds)

with one set of rates per target (``RATES``): roughly what tlmpack's own kernels attain, not the
hardware's peak. lane_flops is where the schedule shows. On x86 a reduction whose innermost loop is
serial does one multiply-add where a vectorized one does eight (AVX2), so its FLOPs count eight
times (schedule/estimate.py). A plan whose kernels the TLM scheduled with serial inner loops costs
what its work in lanes says, not its batch size. On CUDA lane_flops is the FLOPs.

So a plan's cost is its work, including what does not grow with the batch, and the fixed cost of a
run is its kernel calls. On x86 a call costs little against the work, so an in-between batch runs
over smaller plans when they do less work in lanes, and is padded when a larger plan is the better
scheduled one. On CUDA a run's fixed cost (the graph launch, the copies, the synchronisation) and
its launches dominate a small model's run, so padding wins (7 as 16). What
the estimate cannot see (caches, the quality of a vectorized schedule, a GPU kernel's occupancy)
``Model.calibrate_batch_plans()`` measures: it replaces the estimates by the plans' run times.

Artifacts built before the plans' work was counted (no "work" in the manifest's batch_plans) have
costs of (P + F) * COST_UNIT for a plan of P samples (F = 1 on x86, the largest plan on CUDA).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

BATCH_PLANS_FILE = "batch_plans"
BATCH_PLANS_HEADER = "tlmpack batch plans 1"
COST_UNIT = 1000  # legacy costs: thousandths of a sample


@dataclass(frozen=True)
class PlanWork:
    """What one run of a plan does on one target: what its cost estimate is made of."""

    calls: int  # kernel calls (x86) or launches (CUDA)
    flops: int  # floating-point operations of its kernels (TVM's estimate from their TIR)
    lane_flops: int  # the same as vector-lane work: x86 reductions in narrower loops count more (schedule/estimate.py)
    bytes: int  # bytes of every kernel's arguments, counted once per call

    def to_json(self) -> dict:
        return {"calls": self.calls, "flops": self.flops, "lane_flops": self.lane_flops, "bytes": self.bytes}

    @staticmethod
    def from_json(d: Mapping) -> PlanWork:
        return PlanWork(int(d["calls"]), int(d["flops"]), int(d["lane_flops"]), int(d["bytes"]))


@dataclass(frozen=True)
class Rates:
    """What tlmpack's kernels attain on a target, roughly: the constants of the cost estimate."""

    flops_per_ns: float
    bytes_per_ns: float
    call_ns: float  # a kernel call (x86: the call and the thread pool's wake-up) or launch (CUDA graph replay)
    run_ns: float = 0.0  # a run's own fixed cost (CUDA: the graph launch, copies and synchronisation)


# x86: one core of the 2-core EPYC build VM ran the bench models' vectorized plans at 60-70 GFLOP/s, and the
# runtime's call with a pool wake-up takes a few microseconds. CUDA: on the H200 the bench CNN's and
# encoder's exact-batch artifacts (bench/dynamic_batch.py, 2026-12-01) ran batch 1 -> 16 in 0.26 -> 0.36 ms
# and 0.12 -> 0.18 ms: about 25 TFLOP/s for the added work over a fixed cost of some 0.1 ms a run. At 2
# TFLOP/s and no fixed cost the estimate split batch 7 of the CNN into 4 + 4, 1.53x the padded run.
RATES = {"x86": Rates(flops_per_ns=60.0, bytes_per_ns=20.0, call_ns=2000.0),
         "cuda": Rates(flops_per_ns=25000.0, bytes_per_ns=1000.0, call_ns=5000.0, run_ns=50000.0)}


def estimate_ns(work: PlanWork, target: str) -> int:
    """The estimated time of one run (ns, at least 1) of a plan doing ``work`` on ``target``."""
    r = RATES[target]
    return max(1, round(r.run_ns + work.lane_flops / r.flops_per_ns + work.bytes / r.bytes_per_ns
                        + work.calls * r.call_ns))


def plan_costs(work: Mapping[int, PlanWork], target: str) -> dict[int, int]:
    """The estimated cost (ns) of one run of each batch plan on ``target`` ("x86" | "cuda")."""
    return {b: estimate_ns(w, target) for b, w in work.items()}


def render_batch_plans(costs: Mapping[str, Mapping[int, int]]) -> str:
    """The ``batch_plans`` file: a header line, then ``<target> <batch> <cost>`` per plan."""
    lines = [BATCH_PLANS_HEADER]
    for target in sorted(costs):
        lines += [f"{target} {b} {c}" for b, c in sorted(costs[target].items())]
    return "\n".join(lines) + "\n"


def cover(batch: int, costs: Mapping[int, int]) -> list[int]:
    """The plans (batch sizes, largest first) whose runs cover ``batch`` samples at the least total
    cost; the last run may be padded. Ties go to fewer runs, then to larger plans."""
    if batch < 1 or batch > max(costs):
        raise ValueError(f"batch {batch} is outside 1..{max(costs)}")
    best: list[tuple[int, int, int]] = [(0, 0, 0)]  # for n samples: (cost, runs, first plan)
    for n in range(1, batch + 1):
        options = []
        for p, c in costs.items():
            rest = best[max(n - p, 0)] if n > p else (0, 0, 0)
            options.append((rest[0] + c, rest[1] + 1, -p))
        cost, runs, neg = min(options)
        best.append((cost, runs, -neg))
    plans, n = [], batch
    while n > 0:
        p = best[n][2]
        plans.append(p)
        n -= p
    return sorted(plans, reverse=True)
