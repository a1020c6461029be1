#!/usr/bin/env python
"""On a GPU machine: cProfile of 500 CUDA ``model.run`` calls with inputs on the GPU, by own time.

    python bench/gpu_run_profile.py ARTIFACT.tar
"""

from __future__ import annotations

import cProfile
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import tlmpack.runtime as rt  # noqa: E402


def main() -> int:
    model = rt.load(sys.argv[1], device="cuda")
    feed = {s.name: torch.randn(*s.shape, device="cuda") for s in model.inputs}
    for _ in range(50):
        model.run(None, feed, output_device="cuda")
    torch.cuda.synchronize()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(500):
        model.run(None, feed, output_device="cuda")
    torch.cuda.synchronize()
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(18)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
