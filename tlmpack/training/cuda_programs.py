"""CUDA programs for the dataset: sampled here (TVM), measured on a GPU machine (no TVM there).

Here: for each task, seeded random legal points of its CUDA design space (DesignSpace with the
postprocessors, VerifyGPUCode included) plus the task's dlight schedule as the trusted reference,
all turned into CUDA source and launch lists by ``lower.cuda.generate`` (TVM's own pipeline, the
launch dimensions read from the host code after SplitHostDevice). A batch folder holds:

    batch.json.gz      tasks (parameter shapes/dtypes, outputs, reference program), programs (task,
                       sketch, decisions, shard, launches, workspaces), build failures
    shard_NNNN.cu.gz   one nvcc unit (gzip) per shard, many programs each; every program's id is unique in
                       the batch and its kernels are named after it (``<id>_kernel…``)

There: ``bench/gpu_measure_programs.py`` compiles the shards (nvcc -cubin), runs every program on
the task's seeded random inputs, checks it against the reference's outputs, times it with CUDA
events and writes results.json.gz. Back here: ``import_results`` appends the records (valid and
invalid) to the store under records/cuda/, with the x86 records' fields.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..schedule.cuda_footprint import MAX_SHARED_BYTES, MAX_THREADS, SharedFootprint
from ..schedule.records import Decision
from .store import RECORD_VERSION, Store

ARCH = "sm_90"
BATCH_VERSION = 1

# ------------------------------------------------------------------------------------------------
# Sampling
# ------------------------------------------------------------------------------------------------

def cuda_tvm_target(arch: str = ARCH):
    """The TVM target the build uses for ``arch`` (lower.cuda.CudaTarget.tvm_target; nvcc not needed)."""
    return _code_target(arch).tvm_target()


def _code_target(arch: str = ARCH):
    from ..lower.cuda import CudaTarget

    return CudaTarget((arch,), "nvcc", "0.0.0")  # generate() needs only the arch


def guided_decider(rng: random.Random, footprint: SharedFootprint | None = None,
                   max_shared_bytes: int = MAX_SHARED_BYTES):
    """Uniform among a site's legal values that schedule.cuda_footprint.PointFilter keeps (the
    necessary conditions of VerifyGPUCode visible at the tile sites). Every value it returns is
    legal for its site; points the postprocessors still refuse are rejected as with plain uniform
    sampling. One decider per replay (its filter keeps running state)."""
    from ..schedule.cuda_footprint import PointFilter
    from ..schedule.space import legal_values

    keep = PointFilter(footprint, max_shared_bytes)

    def decide(site, _sampled):
        value = rng.choice(keep.keep(site, legal_values(site)))
        keep.chosen(site, value)
        return value

    return decide


@dataclass(frozen=True)
class CudaPoint:
    sketch: int
    decisions: tuple[Decision, ...]
    func: Any

    def key(self) -> tuple:
        return (self.sketch, tuple((d.kind, d.value) for d in self.decisions))


GEMM_ELEMENT_BYTES = 4  # the appended GEMM sketches' tasks are float32


def gemm_decider(rng: random.Random, max_shared_bytes: int = MAX_SHARED_BYTES):
    """Uniform among a site of the appended ``gemm`` / ``gemm-splitk`` sketches' legal values
    (cuda_gemm_sketch.py: 3-way tiles of M and N, then the K tile), leaving out what VerifyGPUCode
    must refuse: threads (the middle factors of M and N) over 1024, and a block whose two staged
    tiles (BM x BK and BK x BN, one stage, no row padding: a lower bound of what the sketch's two
    pipelined, padded stages take) exceed the block's shared memory. Keeps every value when none
    would be left (the postprocessors then refuse the point)."""
    from ..schedule.space import legal_values

    tiles: list[tuple[int, ...]] = []

    def decide(site, _sampled):
        values = legal_values(site)
        if site.kind == "tile" and len(tiles) < 3:
            if len(tiles) == 1:  # N: threads along M x along N
                values = [v for v in values if tiles[0][1] * v[1] <= MAX_THREADS] or values
            elif len(tiles) == 2:  # K: BK is the innermost factor
                bm, bn = tiles[0][1] * tiles[0][2], tiles[1][1] * tiles[1][2]
                values = [v for v in values if GEMM_ELEMENT_BYTES * v[-1] * (bm + bn) <= max_shared_bytes] or values
        value = rng.choice(values)
        if site.kind == "tile" and len(tiles) < 3:
            tiles.append(tuple(value))
        return value

    return decide


def sample_cuda_point(space, rng: random.Random, footprint: SharedFootprint | None = None,
                      appended: bool = False) -> CudaPoint | None:
    """One random legal point of a CUDA space (None when the postprocessors refuse it). The sketch
    is uniform among MetaSchedule's sketches (sites guided by ``guided_decider``), or with
    ``appended`` among all of the space's, the appended GEMM sketches included (their sites guided
    by ``gemm_decider``): what build_batch samples, so the store gets records of both."""
    sketch = rng.randrange(len(space.sketches) if appended else space.metaschedule_sketches)
    if sketch >= space.metaschedule_sketches:
        decide = gemm_decider(rng)
    else:
        decide = guided_decider(rng, footprint)
    replayed = space.replay(sketch, decide, locations=True)
    if replayed is None:
        return None
    return CudaPoint(sketch, replayed[1], replayed[0])


def dlight_schedule(func, tvm_target):
    """The task under dlight's default GPU rules (the reference schedule), or None."""
    from ..schedule.dlight import dlight_schedule as schedule

    return schedule(func, tvm_target)[0]


# ------------------------------------------------------------------------------------------------
# Code generation
# ------------------------------------------------------------------------------------------------

def generate_group(funcs: dict[str, Any], arch: str = ARCH) -> tuple[list[tuple[str, list[str]]], dict, dict]:
    """Programs → [(CUDA source, program ids in it)], launches per id, build error per id.
    One TVM build for the group; when it fails, halves, so one bad program sinks no others."""
    from ..lower.cuda import generate

    target = _code_target(arch)
    names = list(funcs)
    try:
        source, launches = generate({n: funcs[n].with_attr("tirx.is_scheduled", True) for n in names}, target)
        return [(source, names)], {n: launches[n].to_json() for n in names}, {}
    except Exception as e:  # noqa: BLE001  LoweringError or anything TVM raises
        if os.environ.get("TLMPACK_DEBUG_GENERATE"):
            print(f"generate failed for {len(names)} programs: {str(e)[:300]}", flush=True)
        if len(names) == 1:
            text = str(e).strip().splitlines()
            return [], {}, {names[0]: f"build: {type(e).__name__}: {(text[0] if text else '')[:200]}"}
    half = len(names) // 2
    out_sources, out_launches, out_errors = [], {}, {}
    for part in (names[:half], names[half:]):
        s, la, er = generate_group({n: funcs[n] for n in part}, arch)
        out_sources += s
        out_launches.update(la)
        out_errors.update(er)
    return out_sources, out_launches, out_errors


def _params(func) -> list[dict]:
    return [{"shape": [int(d) for d in p.shape], "dtype": str(p.dtype)}
            for p in func.params]


@dataclass
class BatchSummary:
    tasks: int = 0
    tasks_skipped: int = 0
    programs: int = 0  # sampled programs in the batch (build failures included)
    build_failed: int = 0
    sampled: int = 0
    rejected: int = 0
    duplicates: int = 0
    shards: int = 0
    seconds: float = 0.0
    skipped: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {**self.__dict__, "programs_per_s": round(self.programs / max(self.seconds, 1e-9), 2),
                "rejection_rate": round(self.rejected / max(self.sampled, 1), 4)}


def select_tasks(store: Store, count: int, seed: int = 0, max_param_mb: float = 256.0) -> list[str]:
    """``count`` corpus tasks, seeded, spread over the corpus (parameters under ``max_param_mb``)."""
    import numpy as np

    keys = store.task_keys()
    random.Random(seed).shuffle(keys)
    out = []
    for key in keys:
        if len(out) >= count:
            break
        task = store.task(key)
        if any(d not in ("float32", "int32", "int64", "bool") for d in task.get("dtypes", [])):
            continue
        size = 0
        for m in __import__("re").finditer(r"T\.Buffer\(\(([^)]*)\), \"(\w+)\"\)", task["script"]):
            dims = [int(x) for x in m.group(1).replace(" ", "").split(",") if x.strip().isdigit()]
            size += int(np.prod(dims or [1])) * np.dtype(m.group(2)).itemsize
        if size <= max_param_mb * 2**20:
            out.append(key)
    return out


def build_batch(store: Store, keys: list[str], per_task: int, out_dir: str | Path, seed: int = 0,
                programs_per_shard: int = 48, max_tries: int = 0, budget_s: float | None = None,
                say: Callable[[str], None] = print, arch: str = ARCH, prefix: str = "",
                heuristic: bool = False, guide_shared: bool = True, extra: dict | None = None) -> BatchSummary:
    """Samples ``per_task`` random legal CUDA programs of every task in ``keys`` (seeded), adds the
    task's dlight reference, generates CUDA and writes the batch folder (see the module doc).
    ``heuristic``: also the point the compile-time heuristics choose for each task (records say
    ``chosen_by: "heuristic"``), so the GPU run measures where they land among the random ones.
    ``extra``: task key -> candidates.Candidate list, programs measured besides the random ones
    (their records keep the candidate's ``chosen_by`` and ``rule``)."""
    import tvm

    from ..schedule.space import DesignSpace
    from ..tlm.language import LANGUAGE_VERSION
    from .corpus import load_func

    started = time.perf_counter()
    max_tries = max_tries or 40 * per_task
    deadline = started + budget_s if budget_s else float("inf")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{prefix}shard_*.cu.gz"):
        old.unlink()
    tvm_target = _code_target(arch).tvm_target()
    summary = BatchSummary()
    tasks: dict[str, dict] = {}
    programs: list[dict] = []
    failed: list[dict] = []
    pending: dict[str, Any] = {}  # program id -> scheduled func, waiting for the next shard
    meta: dict[str, dict] = {}
    stored = _stored_points(store, "cuda")  # a new seed must not re-measure points the store has

    def flush() -> None:
        if not pending:
            return
        groups, launches, errors = generate_group(dict(pending), arch)
        for source, names in groups:
            shard = f"{prefix}shard_{summary.shards:04d}.cu"
            summary.shards += 1
            with gzip.GzipFile(out / f"{shard}.gz", "wb", mtime=0) as f:  # text: about 10x smaller
                f.write(source.encode())
            for n in names:
                launch = {k: v for k, v in launches[n].items() if k != "task"}  # its "task" is the program id
                programs.append({**meta[n], "id": n, "shard": shard, **launch})
        for n, err in errors.items():
            if meta[n]["reference"]:
                tasks[meta[n]["task"]]["reference_error"] = err
            else:
                failed.append({**meta[n], "id": n, "error": err})
                summary.build_failed += 1
        pending.clear()

    for ti, key in enumerate(keys):
        if time.perf_counter() > deadline:
            break
        task = store.task(key)
        func = load_func(task)
        ref = dlight_schedule(func, tvm_target)
        if ref is None:
            summary.tasks_skipped += 1
            summary.skipped[key] = "no dlight rule"
            continue
        space = DesignSpace(func, tvm_target, seed=seed)
        footprint = SharedFootprint.of(func) if guide_shared else None
        rng = random.Random(f"cuda:{seed}:{key}")
        tid = f"{prefix}t{ti:04d}"
        tasks[key] = {"name": task["name"], "model": task.get("first_model", ""), "num_outputs": task["num_outputs"],
                      "params": _params(func), "reference": f"{tid}_ref", "input_seed": (int(key[:8], 16) ^ seed)
                      & 0x7FFFFFFF}
        meta[f"{tid}_ref"] = {"task": key, "reference": True, "sketch": -1, "decisions": []}
        pending[f"{tid}_ref"] = ref
        if heuristic:
            from ..schedule.hardware import cuda_hardware
            from ..schedule.select import schedule_with_rules

            choice = schedule_with_rules(func, tvm_target, "cuda", cuda_hardware(arch))
            if choice is not None:
                meta[f"{tid}_h"] = {"task": key, "reference": False, "sketch": choice.sketch, "chosen_by": "heuristic",
                                    "rule": choice.rule, "decisions": [d.to_json() for d in choice.decisions]}
                pending[f"{tid}_h"] = choice.func
                summary.programs += 1
        seen: set = set()
        for j, c in enumerate((extra or {}).get(key, [])):
            from ..schedule.records import Decision
            from .sample import replay_point

            point = replay_point(space, c.sketch, tuple(Decision.from_json(d) for d in c.decisions))
            if point is None:
                continue
            pid = f"{tid}_c{j:03d}"
            meta[pid] = {"task": key, "reference": False, "sketch": c.sketch, "decisions": c.decisions,
                         "chosen_by": c.chosen_by, "rule": c.rule}
            pending[pid] = point.func
            summary.programs += 1
        known = stored.get(key, set())
        tries = dups = 0
        while len(seen) < per_task and tries < max_tries and dups < 3 * per_task and time.perf_counter() < deadline:
            tries += 1
            summary.sampled += 1
            point = sample_cuda_point(space, rng, footprint, appended=True)
            if point is None:
                summary.rejected += 1
                continue
            if point.key() in seen or _point_key(point.sketch, point.decisions) in known:
                # small spaces: stop once new points stop coming
                summary.duplicates += 1
                dups += 1
                continue
            seen.add(point.key())
            pid = f"{tid}_p{len(seen) - 1:03d}"
            meta[pid] = {"task": key, "reference": False, "sketch": point.sketch,
                         "decisions": [d.to_json() for d in point.decisions]}
            pending[pid] = point.func
            summary.programs += 1
        summary.tasks += 1
        if len(pending) >= programs_per_shard:
            flush()
        say(f"[{ti + 1}/{len(keys)}] {task['name'][:32]}: {len(seen)} programs "
            f"({summary.programs} total, {summary.programs / (time.perf_counter() - started):.2f}/s)")
    flush()
    # a task whose reference did not build cannot check anything: its programs go as invalid
    for key, t in tasks.items():
        if "reference_error" in t:
            for p in [p for p in programs if p["task"] == key]:
                failed.append({**{k: p[k] for k in ("task", "reference", "sketch", "decisions", "id")},
                               "error": f"reference {t['reference_error']}"})
            programs = [p for p in programs if p["task"] != key]
    summary.seconds = time.perf_counter() - started
    batch = {"version": BATCH_VERSION, "arch": arch, "seed": seed, "tvm": tvm.__version__,
             "language_version": LANGUAGE_VERSION, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
             "tasks": tasks, "programs": programs, "failed": failed,
             "shards": sorted({p["shard"] for p in programs}), "summary": summary.to_json()}
    with gzip.open(out / f"{prefix}batch.json.gz", "wt") as f:
        json.dump(batch, f)
    return summary


def _point_key(sketch: int, decisions) -> tuple:
    """A point's identity, the same for a sampled Point and a stored record's JSON decisions."""
    out = []
    for d in decisions:
        kind, value = (d.kind, d.value) if isinstance(d, Decision) else (d[0], d[1])
        out.append((kind, tuple(value) if isinstance(value, (list, tuple)) else value))
    return (sketch, tuple(out))


def _stored_points(store: Store, target: str) -> dict[str, set]:
    """task key -> the points the store already has a record of on ``target``."""
    out: dict[str, set] = {}
    for r in store.records(target):
        out.setdefault(r["task"], set()).add(_point_key(r["sketch"], r["decisions"]))
    return out


def read_json(path: str | Path) -> dict:
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


# ------------------------------------------------------------------------------------------------
# Import
# ------------------------------------------------------------------------------------------------

def records_from_results(batch: dict, results: dict) -> list[dict]:
    """Store records (x86 records' fields, target "cuda") for every sampled program of the batch:
    measured ones with their outcome, build failures and unmeasured ones as invalid."""
    import tlmpack

    from ..schedule.hardware import cuda_hardware

    info = results.get("machine", {})
    common = {"v": RECORD_VERSION, "target": "cuda", "hardware": cuda_hardware(batch["arch"]).to_json(),
              "machine": {"host": info.get("host", ""), "gpu": info.get("gpu", ""), "cpu": info.get("cpu", ""),
                          "cores": info.get("cores", 0), "driver": info.get("driver", ""),
                          "nvcc": info.get("nvcc", ""), "torch": info.get("torch", "")},
              "tlmpack": tlmpack.__version__, "tvm": batch["tvm"], "language_version": batch["language_version"],
              "seed": batch["seed"], "other_load": 0.0, "loadavg": info.get("loadavg", 0.0)}
    measured = {r["id"]: r for r in results.get("results", [])}
    when = results.get("time", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    out = []
    for p in batch["programs"] + batch["failed"]:
        if p.get("reference"):
            continue
        task = batch["tasks"].get(p["task"], {})
        r = measured.get(p["id"])
        if "error" in p and p["id"] not in measured:
            outcome = {"valid": False, "error": p["error"]}
        elif r is None:
            continue  # not measured (the GPU run ran out of time): no record, it may be measured later
        else:
            outcome = {k: r.get(k) for k in ("valid", "error")}
        rec = {**common, "task": p["task"], "task_name": task.get("name", ""), "model": task.get("model", ""),
               "sketch": p["sketch"], "decisions": p["decisions"], "valid": bool(outcome["valid"]),
               "error": outcome["error"] or "", "median_us": 0.0, "min_us": 0.0, "spread": 0.0, "repeats": 0,
               "rel_err": 0.0, "time": r.get("time", when) if r else when,
               "chosen_by": p.get("chosen_by", "random"), **({"rule": p["rule"]} if p.get("rule") else {})}
        if r is not None:
            rec["rel_err"] = float(f"{r.get('rel_err', 0.0):.3g}") if r.get("rel_err") is not None else 0.0
            if rec["valid"]:
                rec.update(median_us=round(r["median_us"], 3), min_us=round(r["min_us"], 3),
                           spread=round(r["spread"], 4), repeats=r["repeats"])
        out.append(rec)
    return out


def import_results(store: Store, batch_dir: str | Path, results_path: str | Path, run: str | None = None) -> dict:
    """Appends the records of one GPU run to the store (one shard); returns counts and repeatability."""
    results = read_json(results_path)
    records = []
    for path in sorted(Path(batch_dir).glob("*batch.json.gz")):  # one per generating process
        records += records_from_results(read_json(path), results)
    writer = store.writer("cuda", run)
    for i in range(0, len(records), 500):
        writer.append(records[i:i + 500])
    valid = sum(r["valid"] for r in records)
    return {"records": len(records), "valid": valid, "invalid": len(records) - valid,
            "shard": str(writer.path), "repeat": repeatability(results)}


def repeatability(results: dict) -> dict:
    """Median relative difference of the second pass's medians against the first pass's."""
    first = {r["id"]: r for r in results.get("results", []) if r.get("valid")}
    diffs = [abs(r["median_us"] - first[r["id"]]["median_us"]) / first[r["id"]]["median_us"]
             for r in results.get("repeat", []) if r.get("valid") and r["id"] in first
             and first[r["id"]]["median_us"] > 0]
    if not diffs:
        return {"count": 0}
    diffs.sort()
    return {"count": len(diffs), "median_rel_diff": round(statistics.median(diffs), 4),
            "p90_rel_diff": round(diffs[int(0.9 * (len(diffs) - 1))], 4), "max_rel_diff": round(diffs[-1], 4)}


# ------------------------------------------------------------------------------------------------
# Command line: python -m tlmpack.training.cuda_programs build|import ...
# ------------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tlmpack.training.cuda_programs")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="sample programs and write a batch folder")
    b.add_argument("out")
    b.add_argument("--tasks", type=int, default=20, help="how many corpus tasks (seeded choice)")
    b.add_argument("--per-task", type=int, default=10)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--budget-s", type=float, default=None)
    b.add_argument("--part", type=int, default=0, help="this process's share of the tasks (with --parts)")
    b.add_argument("--parts", type=int, default=1)
    b.add_argument("--data", default=None)
    b.add_argument("--heuristic", action="store_true", help="also each task's heuristic schedule")
    b.add_argument("--keys", default=None,
                   help="a file of task keys (one a line) to sample, in that order, instead of --tasks' choice")
    i = sub.add_parser("import", help="append a GPU run's results to the store")
    i.add_argument("batch_dir")
    i.add_argument("results")
    i.add_argument("--data", default=None)
    i.add_argument("--run", default=None, help="the shard's name (default: time and host); the same name on two "
                   "machines gives the same store")
    args = ap.parse_args(argv)
    from .store import default_root

    store = Store(args.data or default_root())
    if args.cmd == "build":
        if args.keys:
            chosen = [k.strip() for k in Path(args.keys).read_text().split() if k.strip()]
        else:
            chosen = select_tasks(store, args.tasks, seed=args.seed)
        keys = chosen[args.part::args.parts]
        prefix = chr(ord("a") + args.part) if args.parts > 1 else ""
        summary = build_batch(store, keys, args.per_task, args.out, seed=args.seed, budget_s=args.budget_s,
                              prefix=prefix, heuristic=args.heuristic)
        print(json.dumps(summary.to_json()))
    else:
        print(json.dumps(import_results(store, args.batch_dir, args.results, run=args.run)))


if __name__ == "__main__":
    main()
