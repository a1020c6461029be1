"""Decodes every task of every corpus model with the shipped TLM and reports, per target:
legality (each decoded point replayed by the Space Builder as it is), the decode time per task
(the model's forward passes, and with TVM's design space and replay), the confidence, how many
tasks fall back to the rules, and a digest of every decoded sentence (two fresh processes must
print the same one).

    python bench/tlm_decode.py [--target x86|cuda] [--limit N] [--corpus PREFIX] [--append]

``--corpus onnx-``: only the tasks of corpus entries whose model name starts with PREFIX (the seed
ONNX builds' tasks). On CUDA it also counts the tasks that have the appended GEMM sketches and how
many of them the model's point takes one of.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import statistics
import sys
import time
from pathlib import Path


def run(target: str, limit: int, corpus: str = "") -> dict:
    from tlmpack.schedule.select import hint_for
    from tlmpack.schedule.space import DesignSpace
    from tlmpack.tlm.decode import decode_space, out_of_distribution
    from tlmpack.tlm.language import Sentence, describe_task, tokens
    from tlmpack.tlm.model import load
    from tlmpack.training.candidates import _task_hardware
    from tlmpack.training.corpus import load_func
    from tlmpack.training.sample import replay_point
    from tlmpack.training.store import Store, default_root

    store = Store(default_root())
    keys = sorted({t["key"] for entry in store.corpora() if entry["model"].startswith(corpus)
                   for t in entry["tasks"]})[: limit or None]
    tlm = load(target)
    tvm_target, hardware = _task_hardware(target, 2 if target == "x86" else 1)
    model_ms, model_cpu_ms, total_ms, total_cpu_ms, confidence = [], [], [], [], []
    legal = illegal = none = fallback = 0
    gemm_tasks = gemm_picked = 0
    digest = hashlib.sha256()
    for key in keys:
        task = store.task(key)
        func = load_func(task)
        info = describe_task(func, task["name"])
        started, cpu = time.perf_counter(), time.thread_time()
        space = DesignSpace(func, tvm_target)
        decoded = decode_space(tlm, space, hardware, info, hint=hint_for(tlm, func, tvm_target, target, hardware))
        total_ms.append((time.perf_counter() - started) * 1e3)
        total_cpu_ms.append((time.thread_time() - cpu) * 1e3)
        if out_of_distribution(tlm, info) is not None:
            fallback += 1
        if not decoded:
            none += 1
            continue
        d = decoded[0]
        if len(space.sketches) > space.metaschedule_sketches:
            gemm_tasks += 1
            gemm_picked += d.sketch >= space.metaschedule_sketches
        model_ms.append(d.decode_ms)
        model_cpu_ms.append(d.decode_cpu_ms)
        confidence.append(d.confidence)
        again = replay_point(space, d.sketch, d.decisions)
        if again is not None and again.decisions == d.decisions:
            legal += 1
        else:
            illegal += 1
        digest.update(" ".join(tokens(Sentence(hardware, info, d.sketch, d.decisions))).encode() + b"\n")
    if confidence:
        fallback += sum(c < tlm.summary.min_confidence for c in confidence)
    return {"target": target, "model": tlm.id, "tasks": len(keys), "decoded": len(model_ms), "legal": legal,
            "illegal": illegal, "no_point": none, "fallback_to_rules": fallback,
            "gemm_sketch_tasks": gemm_tasks, "gemm_sketch_picked": gemm_picked,
            "model_ms_mean": round(statistics.mean(model_ms), 2), "model_ms_max": round(max(model_ms), 2),
            "model_cpu_ms_mean": round(statistics.mean(model_cpu_ms), 2), "model_cpu_ms_max": round(max(model_cpu_ms), 2),
            "with_tvm_ms_mean": round(statistics.mean(total_ms), 1), "with_tvm_ms_max": round(max(total_ms), 1),
            "with_tvm_cpu_ms_mean": round(statistics.mean(total_cpu_ms), 1),
            "confidence_median": round(statistics.median(confidence), 3), "sentences_sha256": digest.hexdigest()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", choices=["x86", "cuda"], action="append")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--corpus", default="", help="only corpus models whose name starts with this")
    ap.add_argument("--append", action="store_true", help="append the table to BENCHMARKS.md")
    args = ap.parse_args()
    rows = [run(t, args.limit, args.corpus) for t in args.target or ["x86", "cuda"]]
    lines = ["| target | model | tasks | legal | fallback | model ms mean / max (wall) | model CPU ms mean / max | "
             "with TVM space+replay ms mean / max (wall; CPU mean) | median confidence | sentences sha256 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['target']} | {r['model']} | {r['tasks']} | {r['legal']}/{r['decoded']} "
                     f"({r['illegal']} illegal, {r['no_point']} none) | {r['fallback_to_rules']} | "
                     f"{r['model_ms_mean']} / {r['model_ms_max']} | {r['model_cpu_ms_mean']} / {r['model_cpu_ms_max']} | "
                     f"{r['with_tvm_ms_mean']} / {r['with_tvm_ms_max']}; {r['with_tvm_cpu_ms_mean']} | "
                     f"{r['confidence_median']} | {r['sentences_sha256'][:16]} |")
    table = "\n".join(lines)
    print(json.dumps(rows, indent=1))
    print(table)
    if args.append:
        with open(Path(__file__).resolve().parent.parent / "BENCHMARKS.md", "a") as f:
            f.write(f"\n### TLM decoding over every corpus task ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
                    f"{platform.node()}, {platform.processor() or platform.machine()})\n\n"
                    f"`python bench/{Path(__file__).name} {' '.join(sys.argv[1:])}`\n\n{table}\n")


if __name__ == "__main__":
    main()
