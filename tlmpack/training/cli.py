"""``tlmpack tlm``: build and inspect the measured dataset the Tensor Language Model learns from."""

from __future__ import annotations

import json
import os
import sys

import click


@click.group()
def tlm() -> None:
    """The tensor-program dataset: collect measurements, show what the store holds."""


def _store(data_dir: str | None):
    from .store import Store, default_root

    if data_dir is not None and not os.path.isdir(data_dir):
        raise click.BadParameter(f"{data_dir} is not a folder", param_hint="--data-dir")
    return Store(data_dir or default_root())


@tlm.command()
@click.option("--models", default=None, help="Comma-separated corpus models (default: the quick-start list).")
@click.option("--target", default="x86", show_default=True, type=click.Choice(["x86", "cuda"]),
              help="x86: build and measure here. cuda: sample and generate here into --out, a batch that "
                   "bench/gpu_measure_programs.py measures on the GPU machine; then `tlmpack tlm import-cuda`.")
@click.option("--out", "out_dir", default=None, help="cuda: the batch folder to write (carry it to the GPU).")
@click.option("--tasks", default=50, show_default=True, help="cuda: how many corpus tasks (a seeded choice).")
@click.option("--per-task", default=32, show_default=True, help="Programs per task (existing ones count).")
@click.option("--seed", default=0, show_default=True)
@click.option("--budget-minutes", default=None, type=float, help="Stop starting new batches after this long.")
@click.option("--batch", default=48, show_default=True,
              help="x86: at most this many new programs of a task per build job (one tvm.compile, one library).")
@click.option("--data-dir", default=None, help="The store (default: the checkout's data/).")
@click.option("--no-progress", is_flag=True, help="One line per task instead of a progress bar.")
@click.option("--max-wait-s", default=30.0, show_default=True,
              help="Before timing a program, wait up to this long for other processes to leave the cores free.")
@click.option("--threads", default=None, type=int,
              help="Build for and run on this many cores (default: all); the records' hardware says so.")
@click.option("--build-workers", default=None, type=int,
              help="x86: processes that sample and build ahead while kernels are timed (default: one per core); "
                   "they are paused while a kernel runs.")
@click.option("--pause-niced", is_flag=True,
              help="x86: also pause (SIGSTOP/SIGCONT) this user's lower-priority processes while a kernel is timed.")
@click.option("--kinds", default=None,
              help="x86: only tasks of these comma-separated kinds (matmul, reduce, pointwise).")
def collect(models: str | None, target: str, out_dir: str | None, tasks: int, per_task: int, seed: int,
            budget_minutes: float | None, batch: int, data_dir: str | None, no_progress: bool, max_wait_s: float,
            threads: int | None, build_workers: int | None, pause_niced: bool, kinds: str | None) -> None:
    """Measure random legal programs of every task of the models. Resumable; Ctrl-C keeps what was measured."""
    from .collect import collect as run
    from .corpus import DEFAULT_ORDER

    if target == "cuda":
        from .cuda_programs import build_batch, select_tasks

        if not out_dir:
            raise click.UsageError("--target cuda writes a batch for the GPU machine: give --out DIR")
        store = _store(data_dir)
        summary = build_batch(store, select_tasks(store, tasks, seed=seed), per_task, out_dir, seed=seed,
                              budget_s=budget_minutes * 60 if budget_minutes else None,
                              say=lambda m: click.echo(m, err=True))
        click.echo(json.dumps(summary.to_json(), sort_keys=True))
        return

    names = [m.strip() for m in models.split(",")] if models else list(DEFAULT_ORDER)
    summary = run(_store(data_dir), names, per_task, seed, budget_minutes, batch,
                  say=lambda m: click.echo(m, err=True), progress=not no_progress, max_wait_s=max_wait_s,
                  threads=threads, build_workers=build_workers, pause_niced=pause_niced,
                  kinds={k.strip() for k in kinds.split(",")} if kinds else None)
    click.echo(json.dumps(summary.to_json(), sort_keys=True))
    if summary.stopped == "interrupted":
        sys.exit(130)


@tlm.command("import-cuda")
@click.argument("batch_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("results", type=click.Path(exists=True, dir_okay=False))
@click.option("--data-dir", default=None, help="The store (default: the checkout's data/).")
def import_cuda(batch_dir: str, results: str, data_dir: str | None) -> None:
    """Append a GPU run's results (bench/gpu_measure_programs.py) for BATCH_DIR to the store."""
    from .cuda_programs import import_results

    click.echo(json.dumps(import_results(_store(data_dir), batch_dir, results), sort_keys=True))


@tlm.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--data-dir", default=None, help="The store (default: the checkout's data/).")
def stats(as_json: bool, data_dir: str | None) -> None:
    """What the store holds: tasks, and valid measured records per target."""
    s = _store(data_dir).stats()
    if as_json:
        click.echo(json.dumps(s, sort_keys=True))
        return
    click.echo(f"tasks: {s['tasks']} ({s['tasks_with_records']} with valid records), models: {len(s['models'])}")
    for target, n in sorted(s["records"].items()):
        click.echo(f"{target}: {n} valid records, {s['invalid'].get(target, 0)} invalid")
    if s["x86_timer"]:
        timers = ", ".join(f"{n} through {t}" for t, n in sorted(s["x86_timer"].items()))
        click.echo(f"x86 valid records timed: {timers}")


@tlm.command()
@click.option("-n", "count", default=100, show_default=True, help="How many random valid records.")
@click.option("--seed", default=0, show_default=True)
@click.option("--back-to-back", is_flag=True, help="Also measure each program twice in a row now.")
@click.option("--threads", default=None, type=int, help="Re-measure the records taken on this many cores.")
@click.option("--max-wait-s", default=30.0, show_default=True, help="Wait this long at most for quiet cores.")
@click.option("--pause-niced", is_flag=True, help="Pause this user's lower-priority processes while timing.")
@click.option("--timing", default="interleaved", show_default=True, type=click.Choice(["interleaved", "burst", "any"]),
              help="Only records timed this way: interleaved rounds, or the first runtime_c records' burst of "
                   "5 back-to-back repeats.")
@click.option("--data-dir", default=None, help="The store (default: the checkout's data/).")
def repeat(count: int, seed: int, back_to_back: bool, threads: int | None, max_wait_s: float, pause_niced: bool,
           timing: str, data_dir: str | None) -> None:
    """Re-measure random quiet x86 records and print the median relative difference of their latencies."""
    from .remeasure import remeasure

    click.echo(json.dumps(remeasure(_store(data_dir), count, seed, back_to_back, threads, max_wait_s,
                                    pause_niced, timing=None if timing == "any" else timing),
                          sort_keys=True))


@tlm.command()
@click.option("--data-dir", default=None, help="The store (default: the checkout's data/).")
@click.option("--heuristic", is_flag=True, help="Also build and measure the heuristic schedule of every task.")
@click.option("--models", default=None, help="Only the tasks of these comma-separated corpus models.")
@click.option("--threads", default=None, type=int, help="Only records taken on this many cores (default: all cores).")
@click.option("--target", default="x86", show_default=True, type=click.Choice(["x86", "cuda"]),
              help="cuda: the H200 records; the heuristic column comes from heuristic programs measured there.")
def table(data_dir: str | None, heuristic: bool, models: str | None, threads: int | None, target: str) -> None:
    """A markdown table per task: valid records, best and median latency (and the heuristic's)."""
    from .report import cuda_task_table, task_table

    if target == "cuda":
        click.echo(cuda_task_table(_store(data_dir)))
        return

    chosen = [m.strip() for m in models.split(",")] if models else None
    click.echo(task_table(_store(data_dir), heuristic=heuristic, models=chosen, threads=threads))


@tlm.command()
@click.option("--tasks", default=None, help="Comma-separated task keys or key prefixes (default: every task with a "
                                           "heuristic record).")
@click.option("--threads", default=None, type=int, help="The records' core count (default: all cores).")
@click.option("--all", "everything", is_flag=True, help="Re-time them all, not only those whose choice changed.")
@click.option("--pause-niced", is_flag=True, help="Pause this user's lower-priority processes while timing.")
@click.option("--data-dir", default=None, help="The store (default: the checkout's data/).")
def heuristics(tasks: str | None, threads: int | None, everything: bool, pause_niced: bool,
               data_dir: str | None) -> None:
    """Record the heuristic schedule of stored tasks again where a rule now picks another one
    (what `tlm table` then shows in its heuristic column)."""
    from .heuristic_records import changed_tasks, latest_heuristic, refresh_heuristics

    store = _store(data_dir)
    threads = threads or len(os.sched_getaffinity(0))
    keys = None
    if tasks:
        known = store.task_keys()
        keys = []
        for prefix in (p.strip() for p in tasks.split(",") if p.strip()):
            found = [k for k in known if k.startswith(prefix)]
            if len(found) != 1:
                raise click.BadParameter(f"{prefix!r} matches {len(found)} stored tasks; expected exactly one",
                                         param_hint="--tasks")
            keys += found
    if everything:
        keys = keys if keys is not None else sorted(latest_heuristic(store, threads))
    else:
        click.echo("finding the tasks whose heuristic choice changed ...", err=True)
        keys = changed_tasks(store, threads, keys)
    click.echo(f"{len(keys)} tasks to re-time", err=True)
    result = refresh_heuristics(store, threads, keys, say=lambda line: click.echo(line, err=True),
                                pause_niced=pause_niced) if keys else {"recorded": 0, "invalid": 0}
    click.echo(json.dumps({"tasks": len(keys), **result}, sort_keys=True))


@tlm.command("cost-model")
@click.option("--target", required=True, type=click.Choice(["x86", "cuda"]))
@click.option("--out", "out_path", default=None, type=click.Path(dir_okay=False),
              help="Weights file to write (default: the package's tlmpack/tlm/weights/<target>-cost.safetensors).")
@click.option("--seeds", default=5, show_default=True, help="Ensemble size (one MLP a seed, 0..N-1).")
@click.option("--epochs", default=200, show_default=True)
@click.option("--beta", default=3.0, show_default=True, help="Listwise target sharpness: exp(-beta ln(t / best)).")
@click.option("--cache", default=None, type=click.Path(dir_okay=False),
              help="Keep the programs' features in this file between runs (extracting them takes minutes).")
@click.option("--jobs", default=2, show_default=True, help="Feature-extraction processes.")
@click.option("--smoke", is_flag=True, help="Six tasks, two epochs, one seed: checks the pipeline.")
@click.option("--data-dir", default=None, help="The store (default: the checkout's data/).")
def cost_model(target: str, out_path: str | None, seeds: int, epochs: int, beta: float, cache: str | None, jobs: int,
               smoke: bool, data_dir: str | None) -> None:
    """Train the cost model a `--scheduler ranked` build ranks candidates with, from the store's measured
    programs of the training tasks (held-out tasks stay out)."""
    from pathlib import Path

    from ..tlm.cost_model import cost_model_path
    from .cost_model import train_and_save

    store = _store(data_dir)
    out = Path(out_path) if out_path else cost_model_path(target)
    say = lambda m: click.echo(m, err=True)  # noqa: E731
    say(f"extracting the {target} training programs' features ...")
    try:
        sha = train_and_save(store, target, out, 1 if smoke else seeds, 2 if smoke else epochs, beta,
                             Path(cache) if cache else None, jobs, say, max_tasks=6 if smoke else 0)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"wrote {out} (sha256 {sha[:12]})")


@tlm.command()
@click.option("--target", required=True, type=click.Choice(["x86", "cuda"]))
@click.option("--out", "out_path", default=None, type=click.Path(dir_okay=False),
              help="Weights file to write (default: the package's tlmpack/tlm/weights/<target>.safetensors).")
@click.option("--seed", default=0, show_default=True)
@click.option("--pretrain-steps", default=1500, show_default=True, help="Steps on random legal sentences.")
@click.option("--finetune-steps", default=800, show_default=True, help="Steps on the best measured programs.")
@click.option("--batch", default=64, show_default=True)
@click.option("--best-k", default=8, show_default=True, help="Fine-tune on this many fastest programs per task.")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, or auto (cuda when torch sees one).")
@click.option("--init", "init_path", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Start from these weights and only fine-tune (the improvement rounds).")
@click.option("--smoke", is_flag=True, help="A tiny run (a few steps on a few tasks): checks the pipeline.")
@click.option("--guided", is_flag=True, help="Each sentence after the rules' schedule of its task (`tlm hints`): "
              "the model learns what to change in the rules' choice.")
@click.option("--teacher-weight", default=0.0, show_default=True,
              help="Also fit the rules' points of unmeasured tasks (`tlm teacher`), each weighing this; 0: none.")
@click.option("--data-dir", default=None, help="The store (default: the checkout's data/).")
def train(target: str, out_path: str | None, seed: int, pretrain_steps: int, finetune_steps: int, batch: int,
          best_k: int, device: str, init_path: str | None, smoke: bool, guided: bool, teacher_weight: float,
          data_dir: str | None) -> None:
    """Train the TLM of TARGET from the store: grammar, then taste. Held-out tasks (data/heldout.json) stay out."""
    from pathlib import Path

    from ..tlm.model import ModelShape, weights_path
    from .dataset import build_training_set, measured_tasks
    from .sites import load_sites
    from .train import GUIDED_SHAPE, TrainConfig, required_hints, required_teacher
    from .train import train as run

    store = _store(data_dir)
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    sites = load_sites(store, target)
    if not sites:
        raise click.ClickException(f"no sites for {target} under {store.root}/sites: run `tlmpack tlm sites` first")
    say = lambda m: click.echo(m, err=True)  # noqa: E731
    tasks = set(sorted(set(sites) & measured_tasks(store, target))[:12]) if smoke else None
    say(f"reading the {target} training set ...")
    try:
        hints = required_hints(store, target) if guided else None
        teacher = required_teacher(store, target) if teacher_weight > 0 else None
        data = build_training_set(store, target, sites, seed=seed, best_k=best_k, tasks=tasks,
                                  random_per_sketch=2 if smoke else 8, hints=hints, teacher=teacher,
                                  teacher_weight=teacher_weight)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    positions = GUIDED_SHAPE.n_positions if guided else ModelShape.n_positions
    shape = ModelShape(n_layer=1, n_head=2, n_embd=32, n_positions=positions) if smoke else ModelShape(
        n_positions=positions)
    cfg = TrainConfig(pretrain_steps=4 if smoke else pretrain_steps, finetune_steps=4 if smoke else finetune_steps,
                      batch=8 if smoke else batch, seed=seed, device=device)
    out = Path(out_path) if out_path else weights_path(target)
    report = run(data, target, out, cfg, shape, say, init=Path(init_path) if init_path else None)
    click.echo(json.dumps(report, sort_keys=True))


@tlm.command()
@click.option("--target", required=True, type=click.Choice(["x86", "cuda"]))
@click.option("--data-dir", default=None, help="The store (default: the checkout's data/).")
def sites(target: str, data_dir: str | None) -> None:
    """Compute (or complete) the sampling sites of every stored task's sketches: data/sites/TARGET.json.gz."""
    from .sites import compute_sites

    click.echo(json.dumps(compute_sites(_store(data_dir), target, say=lambda m: click.echo(m, err=True))))


@tlm.command("sketch-order")
@click.option("--data-dir", default=None, help="The store (default: the checkout's data/).")
def sketch_order(data_dir: str | None) -> None:
    """Map older x86 records' sketch indices (numbered per ISA before 2026-12-08) to today's order:
    data/sketch-order/x86.json, which reading the store applies."""
    from .sketch_order import compute_table

    click.echo(json.dumps(compute_table(_store(data_dir), say=lambda m: click.echo(m, err=True))))


@tlm.command()
@click.option("--target", required=True, type=click.Choice(["x86", "cuda"]))
@click.option("--data-dir", default=None, help="The store (default: the checkout's data/).")
def hints(target: str, data_dir: str | None) -> None:
    """Compute the rules' schedule of every stored task on every hardware its records were taken on,
    which a guided TLM trains after (`tlm train --guided`): data/hints/TARGET.json.gz."""
    from .hints import compute_hints

    click.echo(str(compute_hints(_store(data_dir), target, say=lambda m: click.echo(m, err=True))))


@tlm.command()
@click.option("--target", default="x86", show_default=True, type=click.Choice(["x86", "cuda"]))
@click.option("--corpus-prefix", default="onnx-synthblock-", show_default=True,
              help="The unmeasured tasks of the corpora named so (`python -m tlmpack.training.synthetic_blocks`).")
@click.option("--hardware-top", default=6, show_default=True,
              help="On the hardware most of the store's records were taken on, this many.")
@click.option("--data-dir", default=None, help="The store (default: the checkout's data/).")
def teacher(target: str, corpus_prefix: str, hardware_top: int, data_dir: str | None) -> None:
    """Compute the rules' points of tasks no program was measured of, for `tlm train --teacher-weight`:
    data/hints/TARGET-teacher.json.gz. No timing: the rules teach the shapes the measured corpus lacks."""
    from .hints import compute_teacher, teacher_tasks

    store = _store(data_dir)
    keys = teacher_tasks(store, corpus_prefix)
    if not keys:
        raise click.ClickException(f"no unmeasured task in the corpora named {corpus_prefix}* under {store.root}")
    click.echo(str(compute_teacher(store, target, keys, hardware_top, say=lambda m: click.echo(m, err=True))))


def _keys(store, target: str, tasks: str) -> list[str]:
    """heldout | train | a comma-separated list of task keys."""
    from .dataset import heldout_keys

    if tasks == "heldout":
        return sorted(heldout_keys(store, target, evaluation=True))
    if tasks == "train":
        from .dataset import choose_heldout

        held = heldout_keys(store, target)
        return [k for k in choose_heldout(store, target, fraction=1.0) if k not in held]
    return [k.strip() for k in tasks.split(",") if k.strip()]


@tlm.command()
@click.option("--target", required=True, type=click.Choice(["x86", "cuda"]))
@click.option("--tasks", default="heldout", show_default=True,
              help="heldout, train (tasks with >= 8 programs outside the held-out set), or comma-separated keys.")
@click.option("--samples", default=16, show_default=True, help="TLM top-k samples per task besides its greedy pick.")
@click.option("--random", "random_per_task", default=48, show_default=True,
              help="Fresh random programs per task (the search the best known includes).")
@click.option("--stored-best", default=4, show_default=True, help="Re-measure this many fastest stored programs.")
@click.option("--threads", default=1, show_default=True, help="x86: build for and time on this many cores.")
@click.option("--limit", default=0, help="Only N of the tasks (a seeded choice).")
@click.option("--out", "out_dir", default=None, help="cuda: the batch folder to write (carry it to the GPU).")
@click.option("--prefix", default="", help="cuda: the batch's file prefix (several batches in one folder).")
@click.option("--weights", default=None, help="TLM weights (default: the package's).")
@click.option("--versus", multiple=True, metavar="NAME=WEIGHTS",
              help="Also another model's greedy pick, in the same pass (repeatable; its row: versus_us.NAME).")
@click.option("--built", is_flag=True, help="Also the point a --scheduler tlm build takes (its floor, anchor and "
              "hardware checks; the rules where it falls back): row versus_us.built.")
@click.option("--neighbours", default=0, show_default=True,
              help="Also up to this many one-step edits of the rules' pick per task (a local search; chosen_by: search).")
@click.option("--neighbours-of", type=click.Choice(["rules", "best"]), default="rules", show_default=True,
              help="x86: edit the rules' pick, or the task's fastest program measured on this hardware (a hill "
              "climb's next step, leaving out points measured here).")
@click.option("--report", "report_path", default=None, help="x86: write the comparison (JSON) here.")
@click.option("--seed", default=0, show_default=True)
@click.option("--pause-niced", is_flag=True, help="x86: pause this user's lower-priority processes while timing.")
@click.option("--data-dir", default=None, help="The store (default: the checkout's data/).")
def measure(target: str, tasks: str, samples: int, random_per_task: int, stored_best: int, threads: int, limit: int,
            out_dir: str | None, prefix: str, weights: str | None, versus: tuple[str, ...], built: bool,
            neighbours: int, neighbours_of: str, report_path: str | None, seed: int, pause_niced: bool, data_dir: str | None) -> None:
    """Measure, side by side, the TLM's greedy pick and samples, the rules' pick and its neighbours, the stored
    best and fresh random programs of TASKS; records go to the store (chosen_by: tlm | heuristic | search | random).
    x86 runs here; cuda writes a batch for bench/gpu_measure_programs.py (then `tlm import-cuda`)."""
    from .candidates import measure_x86, propose

    store = _store(data_dir)
    say = lambda m: click.echo(m, err=True)  # noqa: E731
    keys = _keys(store, target, tasks)
    if limit and limit < len(keys):  # a seeded spread, not the first ones of one kind
        import random

        keys = sorted(random.Random(f"limit:{seed}").sample(keys, limit))
    if any("=" not in v for v in versus):
        raise click.BadParameter("give NAME=WEIGHTS", param_hint="--versus")
    found = propose(store, target, keys, samples, threads, seed, weights, stored_best, say=say,
                    versus=dict(v.split("=", 1) for v in versus), built=built, neighbours=neighbours,
                    neighbours_of=neighbours_of)
    if target == "cuda":
        if not out_dir:
            raise click.UsageError("--target cuda writes a batch for the GPU machine: give --out DIR")
        from .cuda_programs import build_batch

        summary = build_batch(store, keys, random_per_task, out_dir, seed=seed, say=say, extra=found, prefix=prefix)
        click.echo(json.dumps(summary.to_json(), sort_keys=True))
        return
    records = measure_x86(store, found, threads, random_per_task, seed, say, pause_niced)
    _report(store, target, records, report_path)
    if tasks == "train":
        _progress(store, target, records)


def _progress(store, target: str, records: list[dict]) -> None:
    from .compare import round_progress

    p = round_progress(store, target, records)
    click.echo(json.dumps({k: v for k, v in p.items() if k != "rows"}, sort_keys=True))


def _report(store, target: str, records: list[dict], report_path: str | None) -> None:
    from .compare import compare, markdown
    from .sites import load_sites

    names = {t["key"]: t["name"] for entry in store.corpora() for t in entry["tasks"]}
    result = compare(records, load_sites(store, target), names)
    if report_path:
        from pathlib import Path

        Path(report_path).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    click.echo(markdown(result, f"{target}: TLM vs heuristic vs best known"))


@tlm.command("compare-cuda")
@click.argument("batch_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("results", type=click.Path(exists=True, dir_okay=False))
@click.option("--report", "report_path", default=None, help="Write the comparison (JSON) here.")
@click.option("--data-dir", default=None, help="The store (default: the checkout's data/).")
def compare_cuda(batch_dir: str, results: str, report_path: str | None, data_dir: str | None) -> None:
    """The TLM vs heuristic vs best-known table of a GPU run of a `tlm measure --target cuda` batch."""
    from pathlib import Path

    from .cuda_programs import read_json, records_from_results
    from .dataset import heldout_keys

    res = read_json(results)
    records = []
    for path in sorted(Path(batch_dir).glob("*batch.json.gz")):
        records += records_from_results(read_json(path), res)
    store = _store(data_dir)
    _report(store, "cuda", [r for r in records if r["task"] in heldout_keys(store, "cuda", evaluation=True)],
            report_path)
    train = [r for r in records if r["task"] not in heldout_keys(store, "cuda")]
    if train:
        _progress(store, "cuda", train)


def _machine(cpu: str, cores: int, l1d_kib: int, l2_kib: int, l3_kib: int):
    from ..schedule.hardware import X86Hardware
    from .adapt import Machine

    wide = "avx512" in cpu or cpu in ("skylake-avx512", "cascadelake", "icelake-server", "sapphirerapids",
                                      "znver4", "znver5")
    return Machine(cpu, X86Hardware(cores, 512 if wide else 256, 32 if wide else 16, l1d_kib * 1024,
                                    l2_kib * 1024, l3_kib * 1024))


_MACHINE_OPTIONS = [
    click.option("--cpu", required=True, help="The other machine's LLVM CPU name, e.g. skylake-avx512."),
    click.option("--cores", default=16, show_default=True, help="Its cores (kernels are built and timed for them)."),
    click.option("--l1d-kib", default=48, show_default=True),
    click.option("--l2-kib", default=2048, show_default=True),
    click.option("--l3-kib", default=32768, show_default=True),
]


def _machine_options(f):
    for option in reversed(_MACHINE_OPTIONS):
        f = option(f)
    return f


@tlm.command("adapt-batch")
@_machine_options
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="The batch folder to write.")
@click.option("--train-tasks", default=40, show_default=True, help="Training tasks measured there.")
@click.option("--samples", default=4, show_default=True, help="TLM top-k samples per training task.")
@click.option("--random", "random_per_task", default=4, show_default=True, help="Random programs per training task.")
@click.option("--eval", "with_eval", is_flag=True, help="Also the held-out tasks' greedy picks of each --weights model.")
@click.option("--weights", "weights", multiple=True, metavar="NAME=FILE",
              help="Models whose greedy picks the eval tasks compare (default: the shipped one, as 'unadapted').")
@click.option("--seed", default=0, show_default=True)
@click.option("--data-dir", default=None, help="The store (default: the checkout's data/).")
def adapt_batch(cpu: str, cores: int, l1d_kib: int, l2_kib: int, l3_kib: int, out_dir: str, train_tasks: int,
                samples: int, random_per_task: int, with_eval: bool, weights: tuple[str, ...], seed: int,
                data_dir: str | None) -> None:
    """Cross-build programs for another x86 machine (bench/remote_x86_measure.py measures them there)."""
    from pathlib import Path

    from .adapt import build_batch, pick_tasks
    from .dataset import heldout_keys

    store = _store(data_dir)
    named = dict(w.split("=", 1) for w in weights) if weights else None
    train = pick_tasks(store, train_tasks, seed) if train_tasks else []
    held = sorted(heldout_keys(store, "x86", evaluation=True)) if with_eval else []
    summary = build_batch(store, _machine(cpu, cores, l1d_kib, l2_kib, l3_kib), train, held, Path(out_dir),
                          samples, random_per_task, seed, named, say=lambda m: click.echo(m, err=True))
    click.echo(json.dumps(summary, sort_keys=True))


@tlm.command("import-x86")
@click.argument("batch_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("results", type=click.Path(exists=True, dir_okay=False))
@click.option("--data-dir", default=None, help="The store (default: the checkout's data/).")
def import_x86(batch_dir: str, results: str, data_dir: str | None) -> None:
    """Append another machine's measurements of an adapt batch to the store; print the eval table."""
    from pathlib import Path

    from .adapt import import_results
    from .compare import geomean_table

    records = import_results(_store(data_dir), Path(batch_dir), json.loads(Path(results).read_text()))
    click.echo(geomean_table([r for r in records if r.get("role") == "eval"]))
    click.echo(json.dumps({"records": len(records), "valid": sum(r["valid"] for r in records)}))


@tlm.command()
@_machine_options
@click.option("--steps", default=400, show_default=True, help="Fine-tuning steps.")
@click.option("--device", default="auto", show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--out", "out_path", default=None, help="Weights to write (default: tlmpack/tlm/weights/x86-CPU.safetensors).")
@click.option("--data-dir", default=None, help="The store (default: the checkout's data/).")
def adapt(cpu: str, cores: int, l1d_kib: int, l2_kib: int, l3_kib: int, steps: int, device: str, seed: int,
          out_path: str | None, data_dir: str | None) -> None:
    """Fine-tune the shipped x86 TLM on the records measured on another machine (CPU named by --cpu)."""
    from pathlib import Path

    from ..tlm.model import weights_path
    from .adapt import adapted_weights_path
    from .dataset import build_training_set
    from .sites import load_sites
    from .train import TrainConfig
    from .train import train as run

    store = _store(data_dir)
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    data = build_training_set(store, "x86", load_sites(store, "x86"), seed=seed, llvm_cpu=cpu)
    if not data.taste:
        raise click.ClickException(f"no records measured on {cpu} in the store: run adapt-batch, measure, import-x86")
    out = Path(out_path) if out_path else adapted_weights_path(cpu)
    report = run(data, "x86", out, TrainConfig(finetune_steps=steps, batch=32, seed=seed, device=device),
                 say=lambda m: click.echo(m, err=True), init=weights_path("x86"))
    click.echo(json.dumps(report, sort_keys=True))


@tlm.command()
@click.option("--target", required=True, type=click.Choice(["x86", "cuda"]))
@click.argument("reports", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--threads", default=1, show_default=True, help="x86: the cores the reports were measured on.")
@click.option("--weights", default=None, help="Weights to calibrate (default: the package's).")
@click.option("--write", is_flag=True, help="Write the floor into the weights' metadata.")
@click.option("--data-dir", default=None, help="The store (default: the checkout's data/).")
def calibrate(target: str, reports: tuple[str, ...], threads: int, weights: str | None, write: bool,
              data_dir: str | None) -> None:
    """Choose the confidence floor below which builds take the rules' schedule, from `tlm measure`
    reports of TRAINING tasks (never held-out ones): the floor that maximises the speed-up over the rules."""
    from pathlib import Path

    from ..schedule.select import hint_for
    from ..schedule.space import DesignSpace
    from ..tlm.decode import decode_space
    from ..tlm.model import load_file, set_min_confidence, weights_path
    from .candidates import _task_hardware
    from .compare import calibrate as choose
    from .corpus import load_func
    from .dataset import heldout_keys, task_info

    store = _store(data_dir)
    path = Path(weights) if weights else weights_path(target)
    tlm = load_file(path, target)
    held = heldout_keys(store, target)
    rows = [r for p in reports for r in json.loads(Path(p).read_text())["rows"] if r["task"] not in held]
    tvm_target, hardware = _task_hardware(target, threads)
    confidences = {}
    for r in rows:
        task = store.task(r["task"])
        func = load_func(task)
        decoded = decode_space(tlm, DesignSpace(func, tvm_target), hardware, task_info(task),
                               hint=hint_for(tlm, func, tvm_target, target, hardware))
        if decoded:
            confidences[r["task"]] = decoded[0].confidence
    result = choose(rows, confidences)
    click.echo(json.dumps(result, sort_keys=True))
    if write:
        click.echo(f"{path.name}: min_confidence {result['min_confidence']}, sha256 "
                   f"{set_min_confidence(path, result['min_confidence'])}")


@tlm.command()
@click.option("--target", required=True, type=click.Choice(["x86", "cuda"]))
@click.option("--task", "tasks", required=True, multiple=True, help="A stored task's key or key prefix (repeatable).")
@click.option("--samples", default=0, show_default=True, help="Also this many seeded top-k samples.")
@click.option("--threads", default=1, show_default=True, help="x86: the cores the schedule is for.")
@click.option("--weights", default=None, help="TLM weights (default: the package's).")
@click.option("--seed", default=0, show_default=True)
@click.option("--data-dir", default=None, help="The store (default: the checkout's data/).")
def generate(target: str, tasks: tuple[str, ...], samples: int, threads: int, weights: str | None, seed: int,
             data_dir: str | None) -> None:
    """Decode stored tasks' schedules with the TLM (greedy first, then samples): one JSON line each,
    with the sentence in the tensor language and the model's confidence."""
    from pathlib import Path

    from ..schedule.select import hint_for
    from ..schedule.space import DesignSpace
    from ..tlm.decode import decode_space, out_of_distribution
    from ..tlm.language import Sentence, tokens
    from ..tlm.model import load_file, weights_path
    from .candidates import _task_hardware
    from .corpus import load_func
    from .dataset import task_info

    store = _store(data_dir)
    tlm = load_file(Path(weights) if weights else weights_path(target), target)
    tvm_target, hardware = _task_hardware(target, threads)
    known = store.task_keys()
    for prefix in tasks:
        found = [k for k in known if k.startswith(prefix)]
        if len(found) != 1:
            raise click.BadParameter(f"{prefix!r} matches {len(found)} stored tasks; expected exactly one",
                                     param_hint="--task")
        task = store.task(found[0])
        info = task_info(task)
        func = load_func(task)
        hint = hint_for(tlm, func, tvm_target, target, hardware)
        for i, d in enumerate(decode_space(tlm, DesignSpace(func, tvm_target), hardware, info,
                                           samples=samples, seed=seed, hint=hint)):
            click.echo(json.dumps({
                "task": found[0], "name": task["name"], "model": tlm.id, "rank": i, "sketch": d.sketch,
                "decisions": [x.to_json() for x in d.decisions], "confidence": round(d.confidence, 4),
                "model_ms": round(d.decode_ms, 2), "out_of_distribution": out_of_distribution(tlm, info, hardware),
                "sentence": " ".join(tokens(Sentence(hardware, info, d.sketch, d.decisions,
                                                      hint if tlm.summary.guided else None)))}, sort_keys=True))
