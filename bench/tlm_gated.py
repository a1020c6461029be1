"""What a build does with a held-out comparison: the TLM's pick where its confidence is at least
the floor, the rules' pick elsewhere, from one `tlmpack tlm measure` report (same pass, so the
rules' latency is measured beside the TLM's).

    python bench/tlm_gated.py REPORT.json x86|cuda WEIGHTS FLOOR [FLOOR ...] [--threads 1] [--versus NAME]

``--versus NAME``: the pick of the report's `--versus NAME=WEIGHTS` model (give its WEIGHTS) instead of
the main model's.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report")
    ap.add_argument("target", choices=["x86", "cuda"])
    ap.add_argument("weights")
    ap.add_argument("floors", nargs="+", type=float)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--versus", default=None, help="the report's --versus model whose pick is gated")
    args = ap.parse_args()

    from tlmpack.schedule.select import hint_for
    from tlmpack.schedule.space import DesignSpace
    from tlmpack.tlm.decode import decode_space
    from tlmpack.tlm.model import load_file
    from tlmpack.training.candidates import _task_hardware
    from tlmpack.training.corpus import load_func
    from tlmpack.training.dataset import task_info
    from tlmpack.training.store import Store, default_root

    store = Store(default_root())
    tlm = load_file(Path(args.weights), args.target)
    tvm_target, hardware = _task_hardware(args.target, args.threads)
    rows = []
    for r in json.loads(Path(args.report).read_text())["rows"]:
        if r.get("tlm_us") is None or not r.get("heuristic_us") or r["space"] < 8:
            continue
        if args.versus:
            r = {**r, "tlm_us": r["versus_us"][args.versus]}
        task = store.task(r["task"])
        func = load_func(task)
        decoded = decode_space(tlm, DesignSpace(func, tvm_target), hardware, task_info(task),
                               hint=hint_for(tlm, func, tvm_target, args.target, hardware))
        rows.append((decoded[0].confidence, r))

    def geomean(xs: list[float]) -> float:
        return math.exp(sum(math.log(x) for x in xs) / len(xs))

    for floor in args.floors:
        chosen = [r["heuristic_us"] if c < floor else r["tlm_us"] for c, r in rows]
        print(f"floor {floor}: trusted {sum(c >= floor for c, _ in rows)}/{len(rows)}; speed-up vs rules "
              f"{geomean([r['heuristic_us'] / x for (_, r), x in zip(rows, chosen, strict=True)]):.3f}; speed vs "
              f"best known {geomean([r['best_us'] / x for (_, r), x in zip(rows, chosen, strict=True)]):.3f}")


if __name__ == "__main__":
    main()
