#!/usr/bin/env python
"""Two builds of one model, kernel by kernel: which kernels a change made faster or slower.

    python bench/x86_profile_ab.py A.tar B.tar [--rounds 6] [--threads 2] [--runs 20] [--min-change 0.03]

Runs `tlmpack bench X.tar --profile --json` on A and B in alternating order (A B, B A, ...), so host
drift hits both alike, and prints per kernel (matched by name without its `kN_` prefix, since the two
builds may number their tasks differently) the median over rounds of its mean µs a call in A and in B,
B/A, its calls a run, and what the difference costs a run; then each side's run latency, kernel time and
pool wait by round. Whole-model speed is `bench/x86_ab.py`'s job: a per-kernel profile times every kernel
with a clock read around it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path


def profile(artifact: str, threads: int, runs: int) -> dict:
    """One `tlmpack bench --profile --json` of ``artifact``."""
    out = subprocess.run([sys.executable, "-m", "tlmpack.cli", "bench", artifact, "--threads", str(threads),
                          "--runs", str(runs), "--profile", "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def kernel_key(name: str) -> str:
    """A kernel's name without its task number (`k18_fused_conv2d16_add9` -> `fused_conv2d16_add9`)."""
    head, _, rest = name.partition("_")
    return rest if head.startswith("k") and head[1:].isdigit() and rest else name


def compare(rounds_a: list[dict], rounds_b: list[dict]) -> list[dict]:
    """Rows per kernel: median mean-µs a call over rounds, B/A, calls a run and the µs a run the
    difference costs, the largest cost first. A kernel only one build has (a change that splits or
    merges kernels) counts 0 µs on the other side, its ratio infinite or 0."""
    def medians(rounds: list[dict]) -> dict[str, tuple[float, float]]:
        per: dict[str, list[float]] = {}
        calls: dict[str, float] = {}
        for result in rounds:
            for k in result["profile"]["kernels"]:
                key = kernel_key(k["kernel"])
                per.setdefault(key, []).append(k["mean_us"])
                calls[key] = k["calls_per_run"]
        return {key: (statistics.median(v), calls[key]) for key, v in per.items()}

    a, b = medians(rounds_a), medians(rounds_b)
    rows = []
    for key in a.keys() | b.keys():
        (us_a, calls_a), (us_b, calls_b) = a.get(key, (0.0, 0.0)), b.get(key, (0.0, 0.0))
        calls = calls_b or calls_a
        rows.append({"kernel": key, "a_us": us_a, "b_us": us_b, "ratio": us_b / us_a if us_a else float("inf"),
                     "calls": calls, "cost_us_per_run": us_b * calls_b - us_a * calls_a})
    return sorted(rows, key=lambda r: -abs(r["cost_us_per_run"]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--min-change", type=float, default=0.0, help="list only kernels with |B/A - 1| at least this")
    args = ap.parse_args()
    for path in (args.a, args.b):
        if not Path(path).is_file():
            ap.error(f"no artifact at {path}")
    results: dict[str, list[dict]] = {args.a: [], args.b: []}
    for r in range(args.rounds):
        for artifact in (args.a, args.b) if r % 2 == 0 else (args.b, args.a):
            results[artifact].append(profile(artifact, args.threads, args.runs))
    rows = compare(results[args.a], results[args.b])
    print("| kernel | A µs | B µs | B/A | calls | µs a run |\n|---|---:|---:|---:|---:|---:|")
    for row in rows:
        if abs(row["ratio"] - 1) >= args.min_change:
            print(f"| {row['kernel']} | {row['a_us']:.0f} | {row['b_us']:.0f} | {row['ratio']:.2f} | {row['calls']:.0f} "
                  f"| {row['cost_us_per_run']:+.0f} |")
    print(f"\nsum over both: A {sum(r['a_us'] * r['calls'] for r in rows):.0f} µs, "
          f"B {sum(r['b_us'] * r['calls'] for r in rows):.0f} µs a run")
    for label, artifact in (("A", args.a), ("B", args.b)):
        rounds = results[artifact]
        print(f"{label}: latency median ms by round {[round(x['latency_ms']['median'], 2) for x in rounds]}, "
              f"kernel µs {[round(x['profile']['kernel_us']) for x in rounds]}, "
              f"pool wait µs {[round(x['profile']['pool_wait_us']) for x in rounds]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
