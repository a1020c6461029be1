"""Speed of each model's greedy picks against the rules' point, split into the channels-last held-out
x86 tasks (data/heldout.json "x86_onnx") and the rest, from a `tlmpack tlm measure --report` file.

    python bench/tlm_heldout_by_layout.py REPORT.json
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

HELDOUT = Path(__file__).resolve().parent.parent / "data" / "heldout.json"


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main(report_path: str) -> None:
    rows = json.loads(Path(report_path).read_text())["rows"]
    channels_last = set(json.loads(HELDOUT.read_text())["x86_onnx"])
    names = ["tlm"] + sorted({k for r in rows for k in r.get("versus_us", {})})
    groups = {"channels-last": lambda r: r["task"] in channels_last, "NCHW": lambda r: r["task"] not in channels_last,
              "all": lambda r: True}
    print("| weights | " + " | ".join(groups) + " |")
    print("|---|" + "---:|" * len(groups))
    for name in names:
        cells = []
        for keep in groups.values():
            speeds = [r["heuristic_us"] / us for r in rows if keep(r)
                      for us in [r["tlm_us"] if name == "tlm" else r.get("versus_us", {}).get(name)] if us]
            cells.append(f"{geomean(speeds):.3f} ({len(speeds)})")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"\nrules vs the best of the pass: {1 / geomean([r['heuristic_us'] / r['best_us'] for r in rows]):.3f}")


if __name__ == "__main__":
    main(sys.argv[1])
