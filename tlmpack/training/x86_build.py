"""The TVM half of x86 collection: sample a task's programs, build them into one shared library and
run the unscheduled reference. Runs in build worker processes (see collect.py), so the process that
times kernels never builds one, and imports no TVM.

A job writes into its own folder:

    kernels.so     every program of the job, kernel ``p<i>`` (TVM's export_library, llvm)
    reference.npz  the task's arguments (``arg<i>``, outputs pre-filled with NaN) and the expected
                   outputs (``expected<i>``), from the unscheduled task on the same inputs
    packed.json    only for a task whose build pre-packs a weight (the store's ``weight_param``):
                   ``{"param": i, "programs": {kernel: file}}``, the packed weight each kernel
                   reads in place of ``arg<i>``; the files are ``packed-<digest>.npy`` beside it
and returns a picklable JobResult naming the programs and the ones that did not build.

Weights are passed as builds pass them (``weights: "as-built"`` on the records): a build packs a
matmul-like task's constant operand once into the tiled order its kernel walks (lower/prepack.py),
so the kernel it runs reads the packed weight. Timing the same program on the plain weight measured
another kernel: 2.2x slower on ResNet-50's convolutions (docs/tlm.md, "the x86 dataset's two gaps").
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..runtime.kernels import random_arguments
from .store import WEIGHTS_AS_BUILT


@dataclass
class JobResult:
    """What one build job made. ``programs``: (kernel name, sketch, decisions as JSON) of every
    program in kernels.so; ``failed``: the same for programs that did not build, with the error."""

    key: str
    folder: str
    programs: list[tuple[str, int, list]] = field(default_factory=list)
    failed: list[tuple[str, int, list, str]] = field(default_factory=list)
    sampled: int = 0
    rejected: int = 0
    duplicates: int = 0
    exhausted: bool = False  # new points stopped coming: the space is (nearly) all measured
    heuristic_rule: str = ""  # with heuristic=True: the rule (or fallback) that chose program "h"
    error: str = ""  # the job as a whole failed (the reference did not build, ...)
    weight_param: int | None = None  # the parameter passed as builds pass it (packed where they pack)

    def record_fields(self) -> dict:
        """What every record of this job's programs says about how they were timed."""
        return {} if self.weight_param is None else {"weights": WEIGHTS_AS_BUILT}


def _compile(funcs: dict[str, Any], target):
    from ..lower.x86 import compile_kernels

    return compile_kernels(funcs, target)


def compile_group(funcs: dict[str, Any], target) -> tuple[Any, dict[str, str]]:
    """One tvm.compile for the group (much faster than one each). When it fails, halves, so one bad
    program sinks no others: (list of executables, build error per program)."""
    try:
        return [_compile(funcs, target)], {}
    except Exception as e:  # noqa: BLE001  TVM raises many kinds
        names = list(funcs)
        if len(names) == 1:
            text = str(e).strip().splitlines()
            return [], {names[0]: f"build: {type(e).__name__}: {(text[0] if text else '')[:200]}"}
    half = len(names) // 2
    built, errors = [], {}
    for part in (names[:half], names[half:]):
        b, er = compile_group({n: funcs[n] for n in part}, target)
        built += b
        errors.update(er)
    return built, errors


def reference_seed(key: str, seed: int) -> int:
    """The task's input seed: the same for every job and re-measurement of one collect seed."""
    return (int(key[:8], 16) ^ seed) & 0x7FFFFFFF


def write_reference(func, num_outputs: int, target, seed: int, path: Path) -> None:
    """Runs the unscheduled task once on seeded random arguments and saves arguments and outputs."""
    import tvm

    args = random_arguments(func, num_outputs, seed)
    mod = _compile({"reference": func}, target).mod
    tensors = [tvm.runtime.tensor(a) for a in args]
    mod["reference"](*tensors)
    expected = [t.numpy() for t in tensors[len(args) - num_outputs:]]
    np.savez(path, **{f"arg{i}": a for i, a in enumerate(args)}, **{f"expected{i}": e for i, e in enumerate(expected)})


def load_reference(path: str | Path) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(arguments, expected outputs) written by write_reference."""
    with np.load(path) as z:
        args = [z[f"arg{i}"] for i in range(sum(k.startswith("arg") for k in z.files))]
        expected = [z[f"expected{i}"] for i in range(sum(k.startswith("expected") for k in z.files))]
    return args, expected


def _point_key(sketch: int, decisions: list) -> tuple:
    return (sketch, tuple((k, tuple(v) if isinstance(v, list | tuple) else v) for k, v in decisions))


def build_job(data_root: str, key: str, threads: int, seed: int, folder: str, count: int = 0,
              known: frozenset = frozenset(), points: list[tuple[int, list]] | None = None,
              reference_cache: str | None = None, heuristic: bool = False, cpu: str | None = None) -> JobResult:
    """Samples ``count`` new random legal programs of task ``key`` (none of ``known``), or replays
    the given ``points`` (sketch, decisions JSON) for re-measurement; builds them for this x86 with
    ``threads`` cores into ``folder``/kernels.so and writes ``folder``/reference.npz.
    ``reference_cache``: where this task's reference for ``seed`` is kept between jobs (the
    unscheduled task runs naive loops on one core: up to a minute for an LM head). ``heuristic``:
    also the point tlmpack's compile-time heuristics choose (kernel ``h``), timed with the others.
    ``cpu``: cross-build the programs for this LLVM CPU (measured on another machine); the
    reference still runs here, built for this host."""
    from ..lower.x86 import x86_target
    from ..schedule.records import Decision
    from ..schedule.select import mark_layout_free
    from ..schedule.space import DesignSpace
    from .corpus import load_func
    from .sample import replay_point, sample_point
    from .store import Store

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    store = Store(data_root)
    result = JobResult(key, str(out), weight_param=store.weight_params().get(key))
    task = store.task(key)
    func = load_func(task)
    target = x86_target(cpu, num_cores=threads).tvm_target()
    host_target = target if cpu is None else x86_target(num_cores=threads).tvm_target()
    # the build's space: RewriteLayout packs the marked weight (same sketches and sites as unmarked)
    marked = mark_layout_free(func, result.weight_param)
    space = DesignSpace(marked, target, seed=seed)
    chosen: dict[str, tuple[int, list, Any]] = {}
    if points is not None:
        for i, (sketch, decisions) in enumerate(points):
            p = replay_point(space, sketch, tuple(Decision.from_json(d) for d in decisions))
            if p is None:
                result.failed.append((f"p{i}", sketch, decisions, "replay: no longer a legal point"))
            else:
                chosen[f"p{i}"] = (sketch, decisions, p.func)
    else:
        rng = random.Random(f"{seed}:{key}:{len(known)}")
        seen, misses = set(known), 0
        while len(chosen) < count and misses < 4 * max(count, 8):
            result.sampled += 1
            p = sample_point(space, rng)
            if p is None:
                result.rejected += 1
                misses += 1
                continue
            decisions = [d.to_json() for d in p.decisions]
            pkey = _point_key(p.sketch, decisions)
            if pkey in seen:
                result.duplicates += 1
                misses += 1
                continue
            seen.add(pkey)
            chosen[f"p{len(chosen)}"] = (p.sketch, decisions, p.func)
        result.exhausted = len(chosen) < count
    if heuristic:
        choice = heuristic_point(marked, target, threads)
        if choice is not None:
            sketch, scheduled, decisions, result.heuristic_rule = choice
            chosen["h"] = (sketch, [d.to_json() for d in decisions], scheduled)
    try:
        if reference_cache is None or not os.path.exists(reference_cache):
            # in a child too: the unscheduled task's buffers (8.5 GB for one bad pool) and LLVM's
            # memory leave with it instead of staying in a long-lived worker
            from .build_guard import OverBudget, run_guarded

            written = run_guarded(write_reference, (func, task["num_outputs"], host_target, reference_seed(key, seed),
                                                    Path(reference_cache or out / "reference.npz")),
                                  REFERENCE_BUDGET.single_cpu_s, REFERENCE_BUDGET.max_rss_bytes)
            if isinstance(written, OverBudget):
                result.error = f"reference: {written.reason}"
                return result
        if reference_cache is not None:
            os.link(reference_cache, out / "reference.npz")
    except Exception as e:  # noqa: BLE001
        result.error = f"reference: {type(e).__name__}: {str(e)[:200]}"
        return result
    if not chosen:
        return result
    kernels = {n: f for n, (_, _, f) in chosen.items()}
    if result.weight_param is not None:
        try:
            kernels = pack_as_built(kernels, result.weight_param, task["num_outputs"], out)
        except Exception as e:  # noqa: BLE001  TVM failed to split or pack: a build falls back the same way
            result.error = f"pre-packing: {type(e).__name__}: {str(e)[:200]}"
            return result
    errors = build_library(kernels, target, out / "kernels.so")
    for n, err in errors.items():
        result.failed.append((n, chosen[n][0], chosen[n][1], err))
    result.programs = [(n, s, d) for n, (s, d, _) in chosen.items() if n not in errors]
    return result


PACKED_FILE = "packed.json"


def pack_as_built(funcs: dict[str, Any], param: int, num_outputs: int, folder: Path) -> dict[str, Any]:
    """The kernels a build runs for ``funcs`` (scheduled on the marked space; lower/prepack.
    kernel_as_built), each packer run here on the reference's weight, the packed weights saved in ``folder`` (one file per distinct packing) and named in
    packed.json. Programs that RewriteLayout left alone keep reading the plain weight."""
    import hashlib
    import json

    from ..lower.prepack import Packer, kernel_as_built

    args, _ = load_reference(folder / "reference.npz")
    packer, kernels, files = Packer(), {}, {}
    for name, func in funcs.items():
        kernels[name], packed = kernel_as_built(func, num_outputs, param, args[param], packer)
        if packed is None:
            continue
        digest = hashlib.sha256(str(packed.shape).encode() + packed.tobytes()).hexdigest()[:16]
        files[name] = f"packed-{digest}.npy"
        if not (folder / files[name]).exists():
            np.save(folder / files[name], packed)
    (folder / PACKED_FILE).write_text(json.dumps({"param": param, "programs": files}))
    return kernels


def program_arguments(folder: str | Path, args: list[np.ndarray]) -> dict[str, list[np.ndarray]]:
    """Kernel name -> its arguments, where packed.json gives it a packed weight (the others take
    ``args`` as they are). Programs with one packing share one array."""
    import json

    path = Path(folder) / PACKED_FILE
    if not path.is_file():
        return {}
    spec = json.loads(path.read_text())
    arrays = {f: np.load(Path(folder) / f) for f in set(spec["programs"].values())}
    param = int(spec["param"])
    return {name: [arrays[f] if i == param else a for i, a in enumerate(args)]
            for name, f in spec["programs"].items()}


def heuristic_point(func, tvm_target, cores: int) -> tuple[int, Any, tuple, str] | None:
    """(sketch, scheduled PrimFunc, decisions, rule) that ``tlmpack build`` picks for this task on
    this x86: the first fitting heuristic rule, else the fixed rules it falls back to."""
    from ..lower.x86 import x86_target
    from ..schedule.hardware import detect_x86
    from ..schedule.select import fixed_schedule, schedule_with_rules

    target = x86_target(num_cores=cores)
    hardware = detect_x86(target.features, target.num_cores)
    choice = schedule_with_rules(func, tvm_target, "x86", hardware)
    if choice is not None:
        return choice.sketch, choice.func, choice.decisions, choice.rule
    fixed = fixed_schedule(func, tvm_target, max(hardware.vector_bits // 32, 1))
    if fixed is None:
        return None
    return fixed[0], fixed[1], fixed[2], f"fallback:{fixed[3]}"


@dataclass(frozen=True)
class BuildBudget:
    """What one build may use (CPU seconds: time spent paused by the timing process does not
    count). Normal groups take well under a second of CPU per program (48 conv2d programs: 39 s)."""

    group_cpu_s: float = 120.0  # a group of n programs: group_cpu_s + n * per_program_cpu_s
    per_program_cpu_s: float = 5.0
    single_cpu_s: float = 60.0
    max_rss_bytes: int = 4 << 30

    def for_group(self, n: int) -> float:
        return self.group_cpu_s + n * self.per_program_cpu_s


REFERENCE_BUDGET = BuildBudget(single_cpu_s=900.0, max_rss_bytes=8 << 30)  # an LM head's naive loops: 43 s


def build_library(funcs: dict[str, Any], target, path: Path, budget: BuildBudget = BuildBudget()) -> dict[str, str]:
    """Builds the scheduled ``funcs`` into one shared library at ``path`` (kernels named by the
    keys); returns the build error of each program left out. The build runs in a child process
    under ``budget`` (build_guard.py); a group over it is retried one program at a time, and the
    programs over ``single_cpu_s`` are left out with that reason, so one pathological point costs
    a minute instead of the whole job."""
    from .build_guard import OverBudget, run_guarded

    outcome = run_guarded(_build_unguarded, (funcs, target, path), budget.for_group(len(funcs)),
                          budget.max_rss_bytes)
    if not isinstance(outcome, OverBudget):
        return outcome
    Path(path).unlink(missing_ok=True)  # a child killed right after writing it: not the library's answer
    errors: dict[str, str] = {}
    for name, func in funcs.items():
        alone = run_guarded(_compile_errors, ({name: func}, target), budget.single_cpu_s, budget.max_rss_bytes)
        if isinstance(alone, OverBudget):
            errors[name] = f"build: {alone.reason} (alone; the group of {len(funcs)} went {outcome.reason})"
        else:
            errors.update(alone)
    good = {n: f for n, f in funcs.items() if n not in errors}
    if good:
        again = run_guarded(_build_unguarded, (good, target, path), budget.for_group(len(good)),
                            budget.max_rss_bytes)
        if isinstance(again, OverBudget):
            Path(path).unlink(missing_ok=True)
            errors.update({n: f"build: {again.reason} (group of the {len(good)} that built alone)" for n in good})
        else:
            errors.update(again)
    return errors


def _compile_errors(funcs: dict[str, Any], target) -> dict[str, str]:
    return compile_group(funcs, target)[1]


def _build_unguarded(funcs: dict[str, Any], target, path: Path) -> dict[str, str]:
    built, errors = compile_group(funcs, target)
    good = {n: f for n, f in funcs.items() if n not in errors}
    if good:
        executable = built[0] if not errors else _compile(good, target)  # the halves, as one library
        executable.export_library(str(path))
    return errors


def init_worker(cores: list[int] | None, pid_dir: str | None = None) -> None:
    """Build worker start-up: keep to ``cores`` (when given), run at low priority, leave this
    process's id in ``pid_dir`` so the timing process can pause it, and die with the timing
    process: killed while it had the workers paused (SIGSTOP), it would otherwise leave them
    stopped for good, holding their memory."""
    from .build_guard import announce_pausable, die_with_parent

    die_with_parent()
    announce_pausable(pid_dir)
    if cores:
        os.sched_setaffinity(0, cores)
    os.nice(5)
    if pid_dir:
        Path(pid_dir, str(os.getpid())).touch()
