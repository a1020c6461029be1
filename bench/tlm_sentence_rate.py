#!/usr/bin/env python
"""How fast random legal tensor-language sentences can be generated (for pretraining the TLM).

    nice -n 19 python bench/tlm_sentence_rate.py [--tasks 24] [--per-task 40] [--seed 0] [--target cuda]

Takes stored tasks from data/ (run `tlmpack tlm collect` first), builds each design space, then
samples random legal points (replay + postprocessors), describes and encodes them (CUDA: the
dataset's sampler, with its thread, shared-memory and warp bounds; no CUDA codegen). Prints JSON:
sentences/s with and without the design-space construction, the rejection rate, tokens/sentence.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tlmpack.lower.x86 import x86_target  # noqa: E402
from tlmpack.schedule.hardware import detect_x86  # noqa: E402
from tlmpack.schedule.space import DesignSpace  # noqa: E402
from tlmpack.tlm import language as L  # noqa: E402
from tlmpack.training.corpus import load_func  # noqa: E402
from tlmpack.training.sample import sample_point  # noqa: E402
from tlmpack.training.store import Store, default_root  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=24)
    ap.add_argument("--per-task", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--target", choices=["x86", "cuda"], default="x86")
    a = ap.parse_args()
    store = Store(a.data_dir or default_root())
    keys = random.Random(a.seed).sample(store.task_keys(), min(a.tasks, len(store.task_keys())))
    if a.target == "cuda":
        from tlmpack.schedule.cuda_footprint import SharedFootprint
        from tlmpack.schedule.hardware import cuda_hardware
        from tlmpack.training.cuda_programs import ARCH, cuda_tvm_target, sample_cuda_point

        tvm_target, hw = cuda_tvm_target(), cuda_hardware(ARCH)
    else:
        target = x86_target()
        tvm_target, hw = target.tvm_target(), detect_x86(target.features, target.num_cores)
    rng = random.Random(a.seed)
    sentences = rejected = tokens = 0
    space_s = sample_s = 0.0
    per_kind: dict[str, list[float]] = {}
    for key in keys:
        task = store.task(key)
        func = load_func(task)
        t0 = time.perf_counter()
        space = DesignSpace(func, tvm_target, seed=a.seed)
        footprint = SharedFootprint.of(func) if a.target == "cuda" else None
        info = L.describe_task(func, task["name"])
        t1 = time.perf_counter()
        made = 0
        for _ in range(a.per_task):
            point = sample_cuda_point(space, rng, footprint) if a.target == "cuda" else sample_point(space, rng)
            if point is None:
                rejected += 1
                continue
            ids = L.encode(L.Sentence(hw, info, point.sketch, point.decisions))
            assert L.decode(ids).decisions == point.decisions
            tokens += len(ids)
            made += 1
        t2 = time.perf_counter()
        sentences += made
        space_s += t1 - t0
        sample_s += t2 - t1
        per_kind.setdefault(info.kind, []).append(made / max(t2 - t1, 1e-9))
    print(json.dumps({
        "target": a.target, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "tasks": len(keys), "sentences": sentences, "rejected": rejected,
        "rejection_rate": round(rejected / max(sentences + rejected, 1), 4),
        "sentences_per_s": round(sentences / sample_s, 1),
        "sentences_per_s_with_space": round(sentences / (sample_s + space_s), 1),
        "tokens_per_sentence": round(tokens / max(sentences, 1), 1),
        "per_kind_sentences_per_s_median": {k: round(sorted(v)[len(v) // 2], 1) for k, v in per_kind.items()},
    }, sort_keys=True))


if __name__ == "__main__":
    main()
