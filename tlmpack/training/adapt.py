"""Adapting the x86 TLM to another machine from a few hundred measurements taken on it.

    here:    tlmpack tlm adapt-batch --cpu skylake-avx512 --cores 16 --out DIR   (cross builds: LLVM)
    there:   python bench/remote_x86_measure.py DIR --threads 16                 (numpy + runtime_c only)
    here:    tlmpack tlm import-x86 DIR DIR/results.json                          (records of that machine)
             tlmpack tlm adapt --cpu skylake-avx512                               (fine-tune → weights)

A batch holds, per task, one folder (kernels.so cross-built for the named CPU with the target's
core count, reference.npz computed here) and batch.json naming every program, who proposed it
(the TLM's greedy pick and top-k samples, random programs) and its role: ``train`` programs
teach the adapted model; ``eval`` programs (held-out tasks) compare it with the unadapted one.
The adapted weights go beside the shipped ones as ``x86-<cpu>.safetensors``; a build with that
``--cpu`` uses them.
"""

from __future__ import annotations

import json
import os
import platform
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..schedule.hardware import X86Hardware
from .store import LEGACY_SKETCH_ORDER, SKETCH_ORDER, Store

MAX_PARAM_BYTES = 1 << 20


def _params_bytes(task: dict) -> int:
    """The task's arguments in bytes, from its TVMScript signature (4 bytes an element assumed)."""
    import math
    import re

    signature = task["script"].split("T.func_attr")[0]
    total = 0
    for shape in re.findall(r'T\.Buffer\(\((.*?)\), "', signature):
        total += 4 * math.prod(int(x) for x in re.findall(r"\d+", shape.replace("int64", "")))
    return total


@dataclass(frozen=True)
class Machine:
    """The other machine: its LLVM CPU name and the hardware description the TLM is told."""

    cpu: str
    hardware: X86Hardware

    def hardware_json(self) -> dict:
        return {**self.hardware.to_json(), "llvm_cpu": self.cpu}


def adapted_weights_path(cpu: str) -> Path:
    from ..tlm.model import WEIGHTS_DIR

    return WEIGHTS_DIR / f"x86-{cpu}.safetensors"


def build_batch(store: Store, machine: Machine, train_keys: list[str], eval_keys: list[str], out_dir: Path,
                samples: int = 4, random_per_task: int = 4, seed: int = 0, weights: dict[str, str] | None = None,
                say: Callable[[str], None] = print) -> dict:
    """Cross-builds the batch (see the module doc). ``weights``: name -> TLM weights whose greedy
    picks the eval tasks compare (default: the shipped model as ``unadapted``)."""
    from ..lower.x86 import x86_target
    from ..schedule.select import hint_for
    from ..schedule.space import DesignSpace
    from ..tlm.decode import decode_space
    from ..tlm.model import load_file, weights_path
    from .corpus import load_func
    from .dataset import task_info
    from .x86_build import build_job

    out_dir.mkdir(parents=True, exist_ok=True)
    cores = machine.hardware.cores
    tvm_target = x86_target(machine.cpu, num_cores=cores).tvm_target()
    models = {name: load_file(Path(path), "x86") for name, path in
              (weights or {"unadapted": str(weights_path("x86"))}).items()}
    programs, started = [], time.perf_counter()
    for i, (key, role) in enumerate([(k, "train") for k in train_keys] + [(k, "eval") for k in eval_keys], 1):
        task = store.task(key)
        func = load_func(task)
        space = DesignSpace(func, tvm_target, seed=seed)
        points: list[tuple[int, list, dict]] = []
        for name, tlm in models.items():
            hint = hint_for(tlm, func, tvm_target, "x86", machine.hardware)
            for j, d in enumerate(decode_space(tlm, space, machine.hardware, task_info(task),
                                               samples=samples if role == "train" else 0, seed=seed, hint=hint)):
                points.append((d.sketch, [x.to_json() for x in d.decisions],
                               {"chosen_by": "tlm", "rule": "greedy" if j == 0 else "top-k", "model": name}))
        folder = out_dir / key
        if _params_bytes(task) > MAX_PARAM_BYTES:  # its reference would not fit a carried batch
            say(f"[{i}] {task['name'][:32]}: parameters over {MAX_PARAM_BYTES >> 20} MiB, skipped")
            continue
        job = build_job(str(store.root), key, cores, seed, str(folder), points=[(s, d) for s, d, _ in points],
                        cpu=machine.cpu)
        named = {f"p{j}": p for j, p in enumerate(points)}
        for n, sketch, decisions in job.programs:
            programs.append({"task": key, "role": role, "folder": key, "name": n, "sketch": sketch,
                             "decisions": decisions, **named[n][2], **job.record_fields()})
        if role == "train" and random_per_task:
            rjob = build_job(str(store.root), key, cores, seed, str(out_dir / f"{key}-random"),
                             count=random_per_task, cpu=machine.cpu,
                             reference_cache=str(folder / "reference.npz") if (folder / "reference.npz").exists()
                             else None)
            for n, sketch, decisions in rjob.programs:
                programs.append({"task": key, "role": role, "folder": f"{key}-random", "name": n, "sketch": sketch,
                                 "decisions": decisions, "chosen_by": "random", **rjob.record_fields()})
        say(f"[{i}/{len(train_keys) + len(eval_keys)}] {task['name'][:32]} ({role}): {len(programs)} programs, "
            f"{time.perf_counter() - started:.0f} s" + (f" ({job.error})" if job.error else ""))
    batch = {"cpu": machine.cpu, "hardware": machine.hardware_json(), "threads": cores, "seed": seed,
             "sketch_order": SKETCH_ORDER, "models": {n: m.to_json() for n, m in models.items()}, "programs": programs,
             "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (out_dir / "batch.json").write_text(json.dumps(batch, sort_keys=True))
    return {"programs": len(programs), "tasks": len(train_keys) + len(eval_keys), "seconds": time.perf_counter() - started}


def measure_batch(batch_dir: Path, threads: int) -> dict:
    """On the other machine: checks and times every program of the batch through runtime_c
    (interleaved rounds, as the dataset); returns the results (JSON)."""
    from .collect import _cpu_model
    from .measure import measure_folders

    batch = json.loads((batch_dir / "batch.json").read_text())
    folders: dict[str, list[str]] = {}
    for p in batch["programs"]:
        folders.setdefault(p["folder"], []).append(p["name"])
    builds = [(str(batch_dir / f), names) for f, names in sorted(folders.items())]
    started = time.perf_counter()
    measured = measure_folders(builds, threads, [], max_other=float(os.cpu_count() or 1), max_wait_s=0.0,
                               host_wait=0.0)
    results = []
    for f, names in sorted(folders.items()):
        for n in names:
            results.append({"folder": f, "name": n, **measured[str(batch_dir / f)][n].to_json()})
    return {"results": results, "seconds": round(time.perf_counter() - started, 1),
            "machine": {"host": platform.node(), "cpu": _cpu_model(), "cores": os.cpu_count()},
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def import_results(store: Store, batch_dir: Path, results: dict) -> list[dict]:
    """The batch's records (``hardware`` of the other machine) appended to the store; returned."""
    import tlmpack

    from ..tlm.language import LANGUAGE_VERSION
    from .measure import TIMING

    batch = json.loads((batch_dir / "batch.json").read_text())
    measured = {(r["folder"], r["name"]): r for r in results["results"]}
    names = {t["key"]: (t["name"], entry["model"]) for entry in store.corpora() for t in entry["tasks"]}
    records = []
    for p in batch["programs"]:
        r = measured.get((p["folder"], p["name"]))
        if r is None:
            continue
        name, model = names.get(p["task"], ("?", "?"))
        records.append({
            "v": 1, "target": "x86", "hardware": batch["hardware"], "machine": results["machine"],
            "tlmpack": tlmpack.__version__, "tvm": "0.27.0.post1", "language_version": LANGUAGE_VERSION,
            "seed": batch["seed"], "timer": "runtime_c", "timing": TIMING, "task": p["task"], "task_name": name,
            "model": model, "sketch": p["sketch"], "decisions": p["decisions"], "chosen_by": p["chosen_by"],
            "rule": p.get("rule", ""), "tlm_model": p.get("model", ""), "role": p["role"], "other_load": 0.0,
            **({"weights": p["weights"]} if "weights" in p else {}),
            "time": results["time"], **{k: v for k, v in r.items() if k not in ("folder", "name")},
            # a batch built before 2026-12-08 numbered its sketches in its CPU's old order (sketch_order.py)
            "sketch_order": batch.get("sketch_order", LEGACY_SKETCH_ORDER)})
    if records:
        store.writer("x86", f"adapt-{batch['cpu']}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}").append(records)
    return records


def pick_tasks(store: Store, count: int, seed: int = 0) -> list[str]:
    """``count`` training tasks (>= 8 stored programs, not held out), seeded."""
    from .dataset import choose_heldout, heldout_keys

    held = heldout_keys(store, "x86")
    keys = [k for k in choose_heldout(store, "x86", fraction=1.0) if k not in held]
    random.Random(f"adapt:{seed}").shuffle(keys)
    return sorted(keys[:count])
