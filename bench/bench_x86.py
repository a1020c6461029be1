#!/usr/bin/env python
"""tlmpack vs onnxruntime on x86 CPU, side by side.

    python bench/bench_x86.py [models...] [--dir DIR] [--threads T] [--runs N] [--warmup W]
                              [--schedulers heuristic,baseline] [--baseline-fast-math] [--compare LABEL=PATH]
                              [--weights dense|portable]

For each model (default: resnet50 mobilenetv2 bert-base gpt2):

1. ``DIR/<name>.onnx`` and ``DIR/<name>.inputs.npz`` are made with ``tlmpack.zoo`` if missing (``--weights``:
   the zoo's dense weights, or portable ones where the dense export ignores its input);
2. for each scheduler (default: heuristic, the compile-time rules with fast math, and baseline,
   the first release's fixed rules with exact math, as it was built then): ``tlmpack build DIR/<name>.onnx -t x86 --scheduler S -o
   DIR/<name>.<S>.tar`` (subprocess; timed; reused when newer than the .onnx unless ``--rebuild``);
   ``S/FLAG`` (e.g. ``heuristic/no-pad-extents``) adds ``--FLAG`` to that build: an A/B of a build switch;
   ``--previous DIR`` times ``DIR/<name>.<S>.tar`` too (e.g. built by the previous commit), column ``S@prev``;
3. the artifact is loaded with ``tlmpack.runtime.load(tar, device="cpu", num_threads=T)`` and
   onnxruntime with ``intra_op_num_threads=T, inter_op_num_threads=1`` (all graph optimizations);
4. both run the same input; rel err = ‖tlmpack − ORT‖ / ‖ORT‖;
5. ``--rounds`` rounds (default 3); in each, every engine (rotating which goes first) runs
   ``--warmup`` untimed runs and then its share of ``--runs`` timed runs back to back, so each is
   timed warm and drift hits all engines alike; the table shows medians, and each engine's ratio
   to onnxruntime both from the medians and "by round" (the geometric mean of the rounds' ratios,
   which a host that changes speed between rounds does not skew).

``--compare LABEL=PATH`` adds prebuilt artifacts (``{model}`` in PATH is the model's name; ``PATH?KEY=VALUE``
loads one with those environment variables, e.g. ``TLMPACK_RUNTIME_LIB=old/libtlmrt.so``), e.g.
the same models built by the commit before a change, timed in the same rounds: a before/after
against onnxruntime in one run.

The table is printed and appended to BENCHMARKS.md (``--no-append`` to skip) with the date, CPU
model, core count, thread count and the exact command. ``--ort-only`` times onnxruntime alone
(e.g. before the compiler builds a model).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tlmpack import zoo  # noqa: E402
from tlmpack.verify import rel_err  # noqa: E402

DEFAULT_MODELS = zoo.BENCH_DEFAULT


def reference_follows_input(sess, feed: dict, out) -> bool:
    """Whether onnxruntime's output changes when the input does (floats redrawn, integer ids rolled): a
    random-weight net whose activations die gives the same output for every input, and a rel err against
    it checks nothing (tlmpack.verify refuses such a reference)."""
    rng = np.random.default_rng(12345)
    other = {k: (rng.standard_normal(v.shape).astype(v.dtype) if np.issubdtype(v.dtype, np.floating)
                 else np.roll(v, 1)) for k, v in feed.items()}
    return rel_err(sess.run(None, other)[0], out) >= 1e-6


# ---------------------------------------------------------------------------------------------
# machine description
# ---------------------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def core_counts() -> tuple[int, int]:
    """(physical cores, logical CPUs) usable by this process."""
    logical = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    physical = set()
    try:
        phys_id = core_id = None
        for line in Path("/proc/cpuinfo").read_text().splitlines() + [""]:
            if line.startswith("physical id"):
                phys_id = line.split(":")[1].strip()
            elif line.startswith("core id"):
                core_id = line.split(":")[1].strip()
            elif not line.strip():
                if core_id is not None:
                    physical.add((phys_id, core_id))
                phys_id = core_id = None
    except OSError:
        pass
    return (min(len(physical), logical) if physical else logical), logical


def cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                keep = ["avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile"]
                return " ".join(f for f in keep if f in flags)
    except OSError:
        pass
    return ""


def git_rev() -> str:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
        )
        return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except OSError:
        return "?"


# ---------------------------------------------------------------------------------------------
# engines
# ---------------------------------------------------------------------------------------------


def tlmpack_cmd() -> list[str]:
    """The ``tlmpack`` console script next to this interpreter, on PATH, or the CLI via -c."""
    here = Path(sys.executable).with_name("tlmpack")
    if here.exists():
        return [str(here)]
    found = shutil.which("tlmpack")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from tlmpack.cli import main; sys.exit(main())"]


def ensure_model(name: str, d: Path, seed: int, weights: str = "dense") -> tuple[Path, dict]:
    """``d/<name>.onnx`` and its inputs, exported by the zoo with ``weights`` where missing (a file
    already there is used as it is, whatever weights it was made with)."""
    onnx_path = d / f"{name}.onnx"
    inputs_path = d / f"{name}.inputs.npz"
    if not onnx_path.exists():
        print(f"[{name}] exporting ONNX -> {onnx_path}", flush=True)
        r = zoo.export_onnx(name, onnx_path, seed=seed, weights=weights)
        print(f"[{name}] exported in {r['time_s']:.1f}s", flush=True)
    if not inputs_path.exists():
        np.savez(inputs_path, **zoo.random_inputs(name, seed))
    with np.load(inputs_path) as z:
        feed = {k: z[k] for k in z.files}
    return onnx_path, feed


def build_tlmpack(
    name: str, onnx_path: Path, tar: Path, rebuild: bool, log_dir: Path, extra: list[str] = ()
) -> tuple[float | None, str]:
    """Returns (build seconds or None if reused, error message or "")."""
    if tar.exists() and not rebuild and tar.stat().st_mtime >= onnx_path.stat().st_mtime:
        return None, ""
    cmd = tlmpack_cmd() + ["build", str(onnx_path), "-t", "x86", *extra, "-o", str(tar)]
    print(f"[{name}] {shlex.join(cmd)}", flush=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    log = log_dir / f"{tar.stem}.build.log"
    log.write_text(
        f"$ {shlex.join(cmd)}\n# exit {proc.returncode} after {dt:.1f}s\n{proc.stdout}\n{proc.stderr}"
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
        return dt, f"build failed (exit {proc.returncode}): {tail[0][:200]} (log: {log})"
    print(f"[{name}] built in {dt:.1f}s", flush=True)
    return dt, ""


def ort_session(onnx_path: Path, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])


def time_alternating(fns: dict[str, callable], runs: int, warmup: int, rounds: int = 3,
                     gate=None, per_round: dict[str, list[float]] | None = None) -> dict[str, list[float]]:
    """``rounds`` rounds; in each, every engine (in rotated order) runs ``warmup`` untimed runs and
    then about runs / rounds timed runs back to back. The untimed runs absorb the switch from the
    previous engine (its spinning worker threads, caches, an idle core's wake-up), so each engine is
    timed warm and steady, and drift over the rounds hits all engines alike. ``gate``
    (tlmpack.training.host_gate.HostGate) holds each block while the host's other tenants are busy.
    ``per_round``, when given, gets each engine's median of every round (see round_ratio)."""
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    runs_a_round = max(1, -(-runs // rounds))
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            if gate is not None:
                gate.wait()
            for _ in range(warmup):
                fns[n]()
            block = []
            for _ in range(runs_a_round):
                t0 = time.perf_counter()
                fns[n]()
                block.append(time.perf_counter() - t0)
            times[n] += block
            if per_round is not None:
                per_round.setdefault(n, []).append(statistics.median(block))
    return times


def round_ratio(per_round: dict[str, list[float]], engine: str, reference: str = "ort") -> float:
    """Geometric mean over rounds of engine's round median / the reference's round median: a
    ratio that holds when the host changes speed between rounds (a shared VM does, by 20-30 %
    within a minute), which the ratio of whole-run medians does not."""
    ratios = [a / b for a, b in zip(per_round[engine], per_round[reference], strict=True)]
    return math.exp(sum(map(math.log, ratios)) / len(ratios))


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------


def fmt_ms(ts: list[float] | None) -> str:
    return f"{statistics.median(ts) * 1e3:.2f}" if ts else "-"



def load_spec(load, spec: str, threads: int):
    """``load`` (tlmpack.runtime.load) of ``PATH?KEY=VALUE&...`` with those variables set in the
    environment while it loads (then restored): the same artifact under another runtime library
    (TLMPACK_RUNTIME_LIB) or pool setting, timed beside it."""
    from tlmpack.environment import environment

    path, _, query = spec.partition("?")
    settings = dict(item.split("=", 1) for item in query.split("&") if item)
    with environment(settings):
        return load(path, device="cpu", num_threads=threads)

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", default=DEFAULT_MODELS, help=f"default: {' '.join(DEFAULT_MODELS)}")
    ap.add_argument(
        "--dir", type=Path, default=REPO / "out" / "bench", help="models and artifacts (default: out/bench)"
    )
    ap.add_argument(
        "--threads", type=int, default=None, help="threads for both engines (default: physical cores)"
    )
    ap.add_argument("--runs", type=int, default=20, help="timed runs per engine (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up runs per engine (default 3)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of alternating engines (default 3); the table's 'by round' ratios come from them")
    ap.add_argument("--seed", type=int, default=zoo.DEFAULT_SEED)
    ap.add_argument("--weights", choices=zoo.WEIGHT_MODES, default="dense",
                    help="the zoo's weights for a model exported here: dense (transformers' init) or portable "
                         "(numpy-drawn; EfficientNet-B0's dense export gives the same logits for every input)")
    ap.add_argument("--rebuild", action="store_true", help="rebuild artifacts even when up to date")
    ap.add_argument("--ort-only", action="store_true", help="time onnxruntime only (no tlmpack build)")
    ap.add_argument("--tol", type=float, default=1e-4, help="rel err above which a row is flagged")
    ap.add_argument("--benchmarks-md", type=Path, default=REPO / "BENCHMARKS.md")
    ap.add_argument("--no-append", action="store_true", help="do not append to BENCHMARKS.md")
    ap.add_argument("--note", default="", help="free text added under the table")
    ap.add_argument("--schedulers", default="heuristic,baseline",
                    help="comma-separated tlmpack schedulers to build and time (default: heuristic,baseline); "
                         "SCHEDULER/FLAG[/FLAG] adds --FLAG to that build, e.g. heuristic/no-pad-extents")
    ap.add_argument("--previous", type=Path, default=None, metavar="DIR",
                    help="also time DIR/<model>.<scheduler>.tar (e.g. built by the previous commit) side by side, "
                         "as column <scheduler>@prev; never rebuilt here")
    ap.add_argument("--baseline-fast-math", action="store_true",
                    help="build the baseline with fast math too (default: --exact-math, as the first release did)")
    ap.add_argument("--host-wait-s", type=float, default=0.0,
                    help="before each engine's block, wait up to this many seconds in all for a quiet host "
                         "(tlmpack's host gate; default 0: time whatever the host does)")
    ap.add_argument("--compare", action="append", default=[], metavar="LABEL=PATH",
                    help="also time a prebuilt artifact, e.g. before=out/bench/{model}.before.tar (built by "
                         "another commit; {model} is the model's name; repeatable): a before/after in one run")
    args = ap.parse_args(argv)
    command = "python " + shlex.join(
        [os.path.relpath(__file__, Path.cwd())] + (sys.argv[1:] if argv is None else argv)
    )

    physical, logical = core_counts()
    threads = args.threads or physical
    args.dir.mkdir(parents=True, exist_ok=True)
    for m in args.models:
        zoo.spec(m)

    import onnxruntime as ort

    tlm_load = None
    tlm_note = ""
    if not args.ort_only:
        try:
            from tlmpack.runtime import load as tlm_load
        except Exception as e:  # the runtime may not exist yet
            tlm_note = f"tlmpack.runtime unavailable ({type(e).__name__}: {e}); ORT only"
            print(tlm_note, flush=True)

    gate = None
    if args.host_wait_s > 0:
        from tlmpack.training.host_gate import HostGate

        gate = HostGate(args.host_wait_s)
    schedulers = [x.strip() for x in args.schedulers.split(",") if x.strip()]
    prebuilt = dict(c.split("=", 1) for c in args.compare)
    if any(label in schedulers or not template for label, template in prebuilt.items()):
        ap.error("--compare needs LABEL=PATH with a label that is not one of --schedulers")
    rows = []
    for name in args.models:
        row = dict(model=name, times={}, err={}, build={}, status=[])
        onnx_path, feed = ensure_model(name, args.dir, args.seed, args.weights)
        sess = ort_session(onnx_path, threads)
        ort_out = sess.run(None, feed)[0]
        if not reference_follows_input(sess, feed, ort_out):
            row["status"].append("the reference ignores the input (dead random weights): rel err checks nothing;"
                                 " --weights portable in a fresh --dir exports live ones")
            print(f"[{name}] {row['status'][-1]}", flush=True)
        fns = {}
        models = []
        for scheduler in [*schedulers, *prebuilt] if tlm_load is not None else []:
            spec = ""
            if scheduler in prebuilt:
                spec = prebuilt[scheduler].format(model=name)
                tar = Path(spec.partition("?")[0])
                build_s, err = None, "" if tar.exists() else f"no prebuilt artifact {tar}"
            else:
                base, *flags = scheduler.split("/")  # e.g. heuristic/no-pad-extents: build flags after the name
                exact = base == "baseline" and not args.baseline_fast_math
                tar = args.dir / f"{name}.{'-'.join([base, *flags])}.tar"
                extra = ["--scheduler", base, "--exact-math" if exact else "--fast-math", *(f"--{f}" for f in flags)]
                build_s, err = build_tlmpack(name, onnx_path, tar, args.rebuild, args.dir, extra)
            row["build"][scheduler] = build_s
            if err:
                row["status"].append(f"{scheduler}: {err}")
                print(f"[{name}] {err}", flush=True)
                continue
            try:
                model = load_spec(tlm_load, spec or str(tar), threads)
                models.append(model)
                tlm_out = model.run(None, feed)[0]
                row["err"][scheduler] = rel_err(tlm_out, ort_out)
                if not np.all(np.isfinite(tlm_out)):
                    row["status"].append(f"{scheduler}: non-finite output")
                elif row["err"][scheduler] > args.tol:
                    row["status"].append(f"{scheduler}: rel err > {args.tol:g}")
                fns[scheduler] = lambda m=model, f=feed: m.run(None, f)
            except Exception as e:
                row["status"].append(f"{scheduler}: load/run failed: {type(e).__name__}: {str(e)[:200]}")
                print(f"[{name}] {row['status'][-1]}", flush=True)
        for scheduler in schedulers if tlm_load is not None and args.previous else []:
            tar = args.previous / f"{name}.{'-'.join(scheduler.split('/'))}.tar"
            label = f"{scheduler}@prev"
            if not tar.exists():
                row["status"].append(f"{label}: no {tar}")
                continue
            model = tlm_load(tar, device="cpu", num_threads=threads)
            models.append(model)
            row["err"][label] = rel_err(model.run(None, feed)[0], ort_out)
            fns[label] = lambda m=model, f=feed: m.run(None, f)
        fns["ort"] = lambda s=sess, f=feed: s.run(None, f)
        row["per_round"] = {}
        row["times"] = time_alternating(fns, args.runs, args.warmup, rounds=args.rounds, gate=gate,
                                        per_round=row["per_round"])
        rows.append(row)
        ort_ms = statistics.median(row["times"]["ort"])
        print(f"[{name}] ORT {ort_ms * 1e3:.2f} ms; " + "; ".join(
            f"{k} {statistics.median(v) * 1e3:.2f} ms ({statistics.median(v) / ort_ms:.2f}x ORT, rel err "
            f"{row['err'][k]:.1e})" for k, v in row["times"].items() if k != "ort") + (
            f"  {row['status']}" if row["status"] else ""), flush=True)
        for model in models:
            model.close()
        del sess

    labels = [*schedulers, *prebuilt] + [f"{s}@prev" for s in schedulers]
    columns = [s for s in labels if any(s in r["times"] for r in rows)]
    table = [
        "| model | " + " | ".join(f"{s} ms" for s in columns) + " | ORT ms | "
        + " | ".join(f"{s}/ORT" for s in columns) + " | " + " | ".join(f"{s}/ORT by round" for s in columns)
        + " | " + " | ".join(f"{s} rel err" for s in columns)
        + " | build s | notes |",
        "|---|" + "---:|" * (4 * len(columns) + 2) + "---|",
    ]
    for r in rows:
        ort_ms = statistics.median(r["times"]["ort"])
        cells = [fmt_ms(r["times"].get(s)) for s in columns] + [fmt_ms(r["times"]["ort"])]
        cells += [f"{statistics.median(r['times'][s]) / ort_ms:.2f}" if s in r["times"] else "-" for s in columns]
        cells += [f"{round_ratio(r['per_round'], s):.2f}" if s in r["times"] else "-" for s in columns]
        cells += [f"{r['err'][s]:.1e}" if s in r["err"] else "-" for s in columns]
        builds = [f"{s} {r['build'][s]:.0f}" for s in columns if r["build"].get(s)]
        cells += [", ".join(builds) or "cached", "; ".join(r["status"])]
        table.append(f"| {r['model']} | " + " | ".join(cells) + " |")
    try:
        import tvm

        tvm_v = tvm.__version__
    except Exception:
        tvm_v = "n/a"
    header = [
        f"## {time.strftime('%Y-%m-%d %H:%M %Z')} — x86 CPU{'' if columns else ' (onnxruntime only)'}"
        + (f": {' vs '.join(columns)} schedules vs onnxruntime" if columns else "")
        + ("" if args.baseline_fast_math or "baseline" not in columns
           else " (baseline with --exact-math, as the first release built it)"),
        "",
        f"- machine: {cpu_model()}, {physical} physical cores / {logical} logical CPUs"
        + (f" ({cpu_flags()})" if cpu_flags() else ""),
        f"- threads: {threads} (tlmpack num_threads, ORT intra_op_num_threads; ORT inter_op 1)",
        f"- timing: {args.rounds} rounds, each engine {args.warmup} warm-up runs then {-(-args.runs // args.rounds)} timed runs back to back per round "
        f"(rotating order); median of {args.rounds * -(-args.runs // args.rounds)} timed runs; 'by round': geometric "
        "mean over rounds of the round's median over onnxruntime's in that round",
        f"- versions: tlmpack {git_rev()}, onnxruntime {ort.__version__}, tvm {tvm_v}, python {platform.python_version()}",
        f"- command: `{command}`",
    ]
    if tlm_note:
        header.append(f"- note: {tlm_note}")
    if gate is not None:
        header.append(f"- host gate: each block waited for a quiet host, {gate.waited_s:.0f} s of at most "
                      f"{args.host_wait_s:.0f} s in all spent waiting")
    for label, template in prebuilt.items():
        header.append(f"- {label}: prebuilt artifacts {template} (not rebuilt by this run)")
    if args.note:
        header.append(f"- note: {args.note}")
    block = "\n".join(header + [""] + table + [""])
    print()
    print(block)
    if not args.no_append:
        md = args.benchmarks_md
        if not md.exists():
            md.write_text("# Benchmarks\n\nAppended by `bench/bench_x86.py`; newest last.\n\n")
        with md.open("a") as f:
            f.write("\n" + block)
        print(f"appended to {md}")
    return 1 if any(r["status"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
