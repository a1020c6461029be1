"""Dynamic batch: the plans' cost model and how a batch is covered by them.

The build writes one cost per (target, batch plan) into the artifact's ``batch_plans`` file; the C
runtime (runtime_c/tlmrt_batch.c) covers a caller's batch with the plans at the least total cost,
by the same dynamic programme as ``cover`` here (which `tlmpack inspect` and the tests use).

The cost model: a run of the plan for P samples costs P + F sample-units, F being the run's fixed
cost (kernel launches, thread-pool wake-ups, small-batch inefficiency). On x86 a run is mostly
compute, so F = 1 and an in-between batch is split over smaller plans when padding would waste more
than a run's overhead. On CUDA a small model's run is mostly launches and idle SMs, so F = the
largest plan: padding wins unless it more than doubles the work. These are estimates from the plan
sizes alone, not measurements; bench/dynamic_batch.py measures what they choose.
"""

from __future__ import annotations

from collections.abc import Mapping

BATCH_PLANS_FILE = "batch_plans"
BATCH_PLANS_HEADER = "tlmpack batch plans 1"
COST_UNIT = 1000  # costs are integers in the file: thousandths of a sample


def plan_costs(batches: tuple[int, ...], target: str) -> dict[int, int]:
    """The estimated cost of one run of each batch plan on ``target`` ("x86" | "cuda")."""
    fixed = 1 if target == "x86" else max(batches)
    return {b: (b + fixed) * COST_UNIT for b in batches}


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
