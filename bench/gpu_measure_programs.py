"""Measures a batch of CUDA programs (tlmpack/training/cuda_programs.py) on this GPU.

No TVM here: numpy, torch (allocations, streams, events, CUDA graphs), nvcc and libcuda (ctypes:
cuModuleLoadData, cuModuleGetFunction, cuLaunchKernel).

    python bench/gpu_measure_programs.py BATCH_DIR [BATCH_DIR...] --out results.json.gz --budget-s 300

1. Every shard (<prefix>shard_NNNN.cu.gz) → cubin with nvcc -cubin -arch=sm_90, in parallel.
2. Worker processes run the programs task by task: the task's seeded random inputs (floats uniform
   in [0.1, 1), integers 0/1, outputs NaN), the dlight reference first (refused when its outputs
   are all zero or not finite), then each program: run once, check against the reference
   (relative L2 error < 1e-4 for fp32, non-finite exactly where the reference is, not all zero),
   then time: the program's launches, ``number`` times back to back, captured in a CUDA graph;
   one warm-up replay, then ``repeats`` replays each between two CUDA events; the time per run is
   the replay's time / number (``number`` makes a replay last >= --min-repeat-ms).
   A worker that crashes (a sticky CUDA error) or hangs is replaced and its program recorded as
   invalid; the run goes on with the next program.
3. A second pass re-measures --repeat-count random valid programs (repeatability).
"""

from __future__ import annotations

import argparse
import ctypes
import gzip
import json
import math
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REL_TOL = {"float32": 1e-4, "float16": 1e-2, "float64": 1e-9}


def read_json(path: Path) -> dict:
    with (gzip.open(path, "rt") if str(path).endswith(".gz") else open(path)) as f:
        return json.load(f)


# ------------------------------------------------------------------------------------------------
# nvcc
# ------------------------------------------------------------------------------------------------

def first_shards(batch_dirs: list[Path], count: int, skip: int = 0) -> set[str]:
    """The "dir/shard" keys of ``count`` shards (0: all) of every batch.json in ``batch_dirs``, after its first
    ``skip`` (a later call measures what an earlier one's ``--max-shards`` left out)."""
    keys = set()
    for d in batch_dirs:
        for bj in sorted(d.glob("*batch.json.gz")):
            shards = sorted(read_json(bj)["shards"])[skip:]
            keys.update(f"{d}/{s}" for s in (shards[:count] if count else shards))
    return keys


def compile_shards(batch_dirs: list[Path], work: Path, arch: str, jobs: int,
                   only: set[str] | None = None) -> dict[str, str]:
    """(batch dir, shard) → cubin path or an error text; ``only``: just these "dir/shard" keys."""
    work.mkdir(parents=True, exist_ok=True)
    todo = []
    for d in batch_dirs:
        for gz in sorted(d.glob("*shard_*.cu.gz")):
            if only is not None and f"{d}/{gz.name[:-3]}" not in only:
                continue
            cu = work / f"{d.name}__{gz.name[:-3]}"
            if not Path(f"{d}/{gz.name[:-3]}.cubin").is_file():
                cu.write_bytes(gzip.decompress(gz.read_bytes()))
            todo.append((f"{d}/{gz.name[:-3]}", cu))

    def run(item):
        key, cu = item
        cubin = cu.with_suffix(".cubin")
        built = Path(key + ".cubin")  # compiled beforehand (--compile-only, same nvcc): use it
        if built.is_file():
            return key, str(built)
        r = subprocess.run(["nvcc", "-O3", "-std=c++17", "-w", "-cubin", f"-arch={arch}", "-o", str(cubin), str(cu)],
                           capture_output=True, text=True)
        return key, str(cubin) if r.returncode == 0 else "nvcc: " + r.stderr.strip()[-300:]

    with ThreadPoolExecutor(jobs) as pool:
        return dict(pool.map(run, todo))


# ------------------------------------------------------------------------------------------------
# The worker: runs programs in one CUDA context
# ------------------------------------------------------------------------------------------------

class Driver:
    def __init__(self) -> None:
        self.cu = ctypes.CDLL("libcuda.so.1")
        self.modules: dict[str, ctypes.c_void_p] = {}
        self.functions: dict[tuple[str, str], ctypes.c_void_p] = {}

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            name = ctypes.c_char_p()
            self.cu.cuGetErrorName(rc, ctypes.byref(name))
            raise RuntimeError(f"{what}: {name.value.decode() if name.value else rc}")

    def function(self, cubin: str, kernel: str, smem: int) -> ctypes.c_void_p:
        if cubin not in self.modules:
            mod = ctypes.c_void_p()
            data = Path(cubin).read_bytes()
            self.check(self.cu.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(data)), "cuModuleLoadData")
            self.modules[cubin] = mod
        key = (cubin, kernel)
        if key not in self.functions:
            f = ctypes.c_void_p()
            self.check(self.cu.cuModuleGetFunction(ctypes.byref(f), self.modules[cubin], kernel.encode()),
                       f"cuModuleGetFunction {kernel}")
            if smem > 48 * 1024:
                self.check(self.cu.cuFuncSetAttribute(f, 8, ctypes.c_int(smem)), "cuFuncSetAttribute")
            self.functions[key] = f
        return self.functions[key]

    def launch(self, f, grid, block, smem, params, stream) -> None:
        self.check(self.cu.cuLaunchKernel(f, *[ctypes.c_uint(x) for x in grid], *[ctypes.c_uint(x) for x in block],
                                          ctypes.c_uint(smem), ctypes.c_void_p(stream), params, None),
                   "cuLaunchKernel")


def random_inputs(task: dict, np):
    rng = np.random.default_rng(task["input_seed"])
    n = len(task["params"])
    arrays = []
    for i, p in enumerate(task["params"]):
        dtype = np.dtype(p["dtype"])
        shape = tuple(p["shape"])
        if i >= n - task["num_outputs"]:
            arrays.append(None)
        elif dtype.kind == "f":
            arrays.append(rng.uniform(0.1, 1.0, shape).astype(dtype))
        elif dtype.kind == "b":
            arrays.append(rng.integers(0, 2, shape).astype(bool))
        else:
            arrays.append(rng.integers(0, 2, shape).astype(dtype))
    return arrays


def worker(args) -> None:
    import numpy as np
    import torch

    batch = {}
    for d in args.batch:
        for bj in sorted(Path(d).glob("*batch.json.gz")):
            b = read_json(bj)
            for p in b["programs"]:
                p["cubin_key"] = f"{Path(d)}/{p['shard']}"
            batch.setdefault("tasks", {}).update(b["tasks"])
            batch.setdefault("programs", {}).update({p["id"]: p for p in b["programs"]})
    cubins = read_json(Path(args.cubins))
    order = [line.strip() for line in open(args.order) if line.strip()]
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    drv = Driver()
    out = open(args.results, "a")
    deadline = args.deadline
    state = {"task": None}

    def emit(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    def tensors_for(task_key):
        task = batch["tasks"][task_key]
        arrays = random_inputs(task, np)
        ts = []
        for p, a in zip(task["params"], arrays, strict=True):
            dtype = getattr(torch, p["dtype"]) if p["dtype"] != "bool" else torch.bool
            if a is None:
                t = torch.empty(p["shape"], dtype=dtype, device="cuda")
            else:
                t = torch.from_numpy(a).to("cuda")
            ts.append(t)
        return ts

    def reset_outputs(task, ts):
        for t in ts[len(ts) - task["num_outputs"]:]:
            t.fill_(float("nan") if t.is_floating_point() else (0 if t.dtype == torch.bool else -1))

    def make_runner(prog, ts):
        cubin = cubins[prog["cubin_key"]]
        if not cubin.endswith(".cubin"):
            raise RuntimeError(cubin)
        ws = [torch.empty(int(np.prod(w["shape"])) * np.dtype(w["dtype"]).itemsize + 16, dtype=torch.uint8,
                          device="cuda") for w in prog["workspaces"]]
        launches = []
        keep = [ws]
        for la in prog["launches"]:
            f = drv.function(cubin, la["kernel"], la["dynamic_smem_bytes"])
            values = []
            for kind, v in la["args"]:
                if kind == "param":
                    values.append(ctypes.c_void_p(ts[v].data_ptr()))
                elif kind == "workspace":
                    values.append(ctypes.c_void_p(ws[v].data_ptr()))
                elif kind == "int32":
                    values.append(ctypes.c_int32(v))
                else:
                    values.append(ctypes.c_int64(v))
            params = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.pointer(x), ctypes.c_void_p) for x in values])
            keep.append((values, params))
            launches.append((f, la["grid"], la["block"], la["dynamic_smem_bytes"], params))

        def run():
            s = torch.cuda.current_stream().cuda_stream
            for f, grid, block, smem, params in launches:
                drv.launch(f, grid, block, smem, params, s)

        run.keep = keep
        return run

    def compare(got, ref):
        worst = 0.0
        for g, r in zip(got, ref, strict=True):
            if not g.is_floating_point():
                if not torch.equal(g, r):
                    return False, 1.0, "mismatch (exact dtype)"
                continue
            finite = torch.isfinite(r)
            if not torch.equal(torch.isfinite(g), finite):
                return False, float("inf"), "NaN/Inf where the reference is finite (or the reverse)"
            gg, rr = g[finite].double(), r[finite].double()
            if not bool(gg.any()) and bool(rr.any()):
                return False, 1.0, "all-zero output"
            err = float(torch.linalg.norm(gg - rr) / max(float(torch.linalg.norm(rr)), 1e-30))
            worst = max(worst, err)
            if err > REL_TOL.get(str(g.dtype).replace("torch.", ""), 1e-4):
                return False, err, f"rel err {err:.2e}"
        return True, worst, ""

    def time_program(run):
        # one timed direct run sizes ``number``
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        once_ms = start.elapsed_time(end)
        repeats = args.repeats if once_ms < 50 else 3
        number = max(1, min(args.max_number, math.ceil(args.min_repeat_ms / max(once_ms, 1e-4))))
        graph = None
        if once_ms < 5:
            try:
                g = torch.cuda.CUDAGraph()
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    run()  # warm
                torch.cuda.current_stream().wait_stream(side)
                torch.cuda.synchronize()
                with torch.cuda.graph(g):
                    for _ in range(number):
                        run()
                graph = g
            except Exception:  # noqa: BLE001  fall back to direct launches
                graph = None
                torch.cuda.synchronize()

        def once():
            if graph is not None:
                graph.replay()
            else:
                for _ in range(number):
                    run()

        once()  # warm-up repeat
        times = []
        for _ in range(repeats):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            once()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) * 1000.0 / number)
        med = statistics.median(times)
        return {"median_us": med, "min_us": min(times), "spread": (max(times) - min(times)) / med if med else 0.0,
                "repeats": repeats, "number": number, "graph": graph is not None}

    refs: dict[str, object] = {}
    for pid in order:
        if time.time() > deadline:
            emit({"stop": "deadline"})
            break
        prog = batch["programs"][pid]
        key = prog["task"]
        task = batch["tasks"][key]
        emit({"begin": pid})
        result = {"id": pid, "task": key, "valid": False, "error": "", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                          time.gmtime())}
        try:
            if state["task"] != key:
                state["task"] = key
                state["ts"] = None
                refs.clear()
                torch.cuda.empty_cache()
                ts = tensors_for(key)
                state["ts"] = ts
                ref_prog = batch["programs"][task["reference"]]
                reset_outputs(task, ts)
                make_runner(ref_prog, ts)()
                torch.cuda.synchronize()
                outs = [t.clone() for t in ts[len(ts) - task["num_outputs"]:]]
                bad = ""
                for o in outs:
                    if o.is_floating_point() and not bool(torch.isfinite(o).all()):
                        bad = "reference output not finite"
                    elif not bool(o.any()):
                        bad = "reference output all zero"
                refs[key] = bad or outs
            ref = refs[key]
            if isinstance(ref, str):
                raise RuntimeError(ref)
            ts = state["ts"]
            reset_outputs(task, ts)
            run = make_runner(prog, ts)
            run()
            torch.cuda.synchronize()
            ok, err, why = compare(ts[len(ts) - task["num_outputs"]:], ref)
            result["rel_err"] = err if math.isfinite(err) else 1e30
            if not ok:
                result["error"] = why
            else:
                result.update(time_program(run))
                result["valid"] = True
        except Exception as e:  # noqa: BLE001
            result["error"] = f"run: {type(e).__name__}: {str(e)[:200]}"
            emit(result)
            if "CUDA" in str(e) or "cuda" in str(e).lower():
                torch.cuda.synchronize()  # raises again if the context is broken: the parent restarts us
            continue
        emit(result)
    out.close()


# ------------------------------------------------------------------------------------------------
# The parent: compile, run workers (restarting after crashes), second pass
# ------------------------------------------------------------------------------------------------

def run_pass(args, ids: list[str], results_path: Path, deadline: float, work: Path) -> list[dict]:
    done: dict[str, dict] = {}
    remaining = list(ids)
    results_path.write_text("")
    crashes = stuck = 0
    while remaining and time.time() < deadline:
        order = work / "order.txt"
        order.write_text("\n".join(remaining) + "\n")
        cmd = [sys.executable, __file__, *args.batch, "--worker", "--cubins", str(work / "cubins.json"),
               "--order", str(order), "--results", str(results_path), "--deadline", str(deadline),
               "--repeats", str(args.repeats), "--min-repeat-ms", str(args.min_repeat_ms),
               "--max-number", str(args.max_number)]
        proc = subprocess.Popen(cmd)
        last_size, last_change = -1, time.time()
        while proc.poll() is None:
            time.sleep(0.5)
            size = results_path.stat().st_size
            if size != last_size:
                last_size, last_change = size, time.time()
            elif time.time() - last_change > args.hang_s:
                proc.kill()
                proc.wait()
                break
        begun = None
        for line in results_path.read_text().splitlines():
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "begin" in obj:
                begun = obj["begin"]
            elif "id" in obj:
                done[obj["id"]] = obj
                begun = None
            elif obj.get("stop"):
                begun = None
        if begun is not None and begun not in done:
            crashes += 1
            done[begun] = {"id": begun, "valid": False, "error": f"run: worker died (rc {proc.returncode})",
                           "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            with open(results_path, "a") as f:
                f.write(json.dumps(done[begun]) + "\n")
        progress = len(remaining) - len([i for i in ids if i not in done])
        remaining = [i for i in ids if i not in done]
        if proc.returncode == 0 and begun is None:
            break
        stuck = stuck + 1 if progress == 0 else 0
        if stuck >= 2:
            print("worker fails without progress: giving up", flush=True)
            break
        print(f"worker restarted after {len(done)} programs (crashes {crashes})", flush=True)
    return [done[i] for i in ids if i in done]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("batch", nargs="+")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "results.json.gz"))
    ap.add_argument("--budget-s", type=float, default=300.0, help="whole run, compile included")
    ap.add_argument("--repeat-count", type=int, default=100)
    ap.add_argument("--repeat-s", type=float, default=40.0, help="kept for the second pass")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--min-repeat-ms", type=float, default=2.0)
    ap.add_argument("--max-number", type=int, default=2000)
    ap.add_argument("--hang-s", type=float, default=30.0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 4)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--limit", type=int, default=0, help="measure at most this many programs")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--cubins")
    ap.add_argument("--order")
    ap.add_argument("--results")
    ap.add_argument("--deadline", type=float)
    ap.add_argument("--max-shards", type=int, default=0,
                    help="compile and measure only the first N shards of each generating process's batch (a short "
                         "GPU session; the rest can be measured by a later run)")
    ap.add_argument("--skip-shards", type=int, default=0,
                    help="leave out the first N shards of each generating process's batch (measured by an earlier run)")
    ap.add_argument("--compile-only", action="store_true",
                    help="write <shard>.cubin beside each shard (carried: no nvcc time on the GPU machine)")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    if args.compile_only:
        import shutil

        cubins = compile_shards([Path(d) for d in args.batch], Path(os.environ.get("TMPDIR", "/tmp")) /
                                f"gpucompile-{os.getpid()}", args.arch, args.jobs)
        bad = 0
        for key, path in cubins.items():
            if path.endswith(".cubin") and path != key + ".cubin":
                shutil.copyfile(path, key + ".cubin")
            bad += not path.endswith(".cubin")
        print(f"{len(cubins)} shards, {bad} failed")
        return
    started = time.time()
    end = started + args.budget_s
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpumeasure-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    dirs = [Path(d) for d in args.batch]
    only = first_shards(dirs, args.max_shards, args.skip_shards) if args.max_shards or args.skip_shards else None
    cubins = compile_shards(dirs, work / "cu", args.arch, args.jobs, only)
    compile_s = time.time() - started
    (work / "cubins.json").write_text(json.dumps(cubins))
    failed_shards = {k: v for k, v in cubins.items() if not v.endswith(".cubin")}
    print(f"nvcc: {len(cubins)} shards in {compile_s:.1f} s, {len(failed_shards)} failed", flush=True)
    ids, refs = [], set()
    for d in dirs:
        for bj in sorted(d.glob("*batch.json.gz")):
            b = read_json(bj)
            refs.update(t["reference"] for t in b["tasks"].values())
            shard_of = {p["id"]: f"{d}/{p['shard']}" for p in b["programs"]}
            ref_shard = {key: shard_of.get(t["reference"]) for key, t in b["tasks"].items()}
            ids += [p["id"] for p in b["programs"] if not p["reference"] and (
                only is None or (shard_of[p["id"]] in only and ref_shard.get(p["task"]) in only))]
    if args.limit:
        ids = ids[:args.limit]
    t0 = time.time()
    first = run_pass(args, ids, work / "pass1.jsonl", end - args.repeat_s, work)
    measure_s = time.time() - t0
    valid = [r for r in first if r.get("valid")]
    rng = random.Random(0)
    again = rng.sample([r["id"] for r in valid], min(args.repeat_count, len(valid)))
    again.sort(key=ids.index)
    t1 = time.time()
    second = run_pass(args, again, work / "pass2.jsonl", max(end, time.time() + 10), work) if again else []
    repeat_s = time.time() - t1
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip().splitlines()
    nvcc_v = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    import torch

    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    machine = {"host": socket.gethostname(), "gpu": gpu[0].split(",")[0].strip() if gpu else "",
               "driver": gpu[0].split(",")[1].strip() if gpu else "", "cpu": cpu, "cores": os.cpu_count(),
               "nvcc": nvcc_v[-1] if nvcc_v else "", "torch": torch.__version__,
               "loadavg": round(os.getloadavg()[0], 2)}
    summary = {"programs": len(ids), "measured": len(first), "valid": len(valid), "compile_s": round(compile_s, 1),
               "measure_s": round(measure_s, 1), "programs_per_s": round(len(first) / max(measure_s, 1e-9), 2),
               "repeat_s": round(repeat_s, 1), "failed_shards": failed_shards,
               "errors": {}}
    for r in first:
        if not r.get("valid"):
            k = r["error"].split(":")[0].split(" ")[0]
            summary["errors"][k] = summary["errors"].get(k, 0) + 1
    sec = {r["id"]: r for r in first if r.get("valid")}
    diffs = sorted(abs(r["median_us"] - sec[r["id"]]["median_us"]) / sec[r["id"]]["median_us"]
                   for r in second if r.get("valid") and r["id"] in sec)
    if diffs:
        summary["repeat"] = {"count": len(diffs), "median_rel_diff": round(statistics.median(diffs), 4),
                             "p90_rel_diff": round(diffs[int(0.9 * (len(diffs) - 1))], 4)}
    out = {"machine": machine, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "summary": summary,
           "results": first, "repeat": second}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(args.out, "wt") as f:
        json.dump(out, f)
    print(json.dumps(summary, indent=1), flush=True)


if __name__ == "__main__":
    main()
