#!/usr/bin/env python
"""Where a CNN's time goes, by kind of kernel: a `tlmpack bench --profile --json` result grouped.

    tlmpack bench ART.tar --threads 2 --profile --json > prof.json
    python bench/profile_by_kind.py ART.tar prof.json

Kinds come from each kernel's name and the loop extents its schedule records in the manifest:
layout (a transpose, alone or fused with element-wise ops and pads), pad, conv 1x1 / depthwise /
kxk (reduction extents kh, kw, ci; "1x1 spatial" marks squeeze-excite convolutions), matmul,
mean. Prints a markdown table of calls and milliseconds per run.
"""

from __future__ import annotations

import json
import math
import sys
import tarfile
from collections import defaultdict


def kind(name: str, decisions: list) -> str:
    if "transpose" in name:
        fused = any(op in name for op in ("maximum", "sigmoid", "multiply", "add", "pad"))
        return "layout (transpose)" + (" + elementwise" if fused else "")
    if name.startswith("pad"):
        return "pad"
    if "conv2d" in name:
        tiles = [value for k, value in decisions if k == "tile"]
        spatial = [math.prod(t) for t in tiles if len(t) == 4]
        reduction = [math.prod(t) for t in tiles if len(t) == 2]
        if len(reduction) >= 3 and reduction[0] * reduction[1] == 1:
            label = "conv 1x1"
        elif len(reduction) >= 3 and reduction[2] == 1:
            label = "conv depthwise"
        else:
            label = "conv kxk"
        return label + (" (1x1 spatial, SE)" if len(spatial) >= 3 and spatial[1] * spatial[2] == 1 else "")
    if "matmul" in name or "dense" in name:
        return "matmul"
    if "mean" in name:
        return "mean (pool)"
    return "other: " + name


def main(argv: list[str]) -> int:
    artifact, profile_json = argv
    with tarfile.open(artifact) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
    subgraphs = {s["id"]: s for s in manifest["subgraphs"]}
    profile = json.load(open(profile_json))["profile"]
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for k in profile["kernels"]:
        s = subgraphs[k["kernel"]]
        row = by_kind[kind(s["name"], s["schedules"][0]["decisions"])]
        row[0] += k["calls_per_run"]
        row[1] += k["total_ms"] / profile["runs"]
    total = sum(ms for _, ms in by_kind.values())
    print("| kind | calls a run | ms a run | share |\n|---|---:|---:|---:|")
    for name, (calls, ms) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
        print(f"| {name} | {calls:g} | {ms:.2f} | {100 * ms / total:.1f}% |")
    print(f"| all kernels | {sum(c for c, _ in by_kind.values()):g} | {total:.2f} | |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
