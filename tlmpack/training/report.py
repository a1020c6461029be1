"""Per-task summary of the store: how much the choice of schedule matters (best vs median of
random legal programs) and, optionally, where the heuristic schedule lands."""

from __future__ import annotations

import statistics

from .store import Store

X86_LATENCY = "min_us"  # the repeatable statistic on a shared host: see data/README.md, "Which latency"


def latencies(store: Store, cores: int, target: str = "x86",
              statistic: str = X86_LATENCY) -> tuple[dict[str, list[float]], dict[str, tuple]]:
    """(task key → the latencies (µs, ``statistic`` of each record) of its valid random records
    taken on ``cores`` cores, task key → (µs, rule) of its heuristic record, the latest)."""
    out: dict[str, list[float]] = {}
    heuristic: dict[str, tuple] = {}
    for r in store.records(target, as_built=True):
        if not r.get("valid") or r["hardware"]["cores"] != cores:
            continue
        if r.get("chosen_by") == "heuristic":
            heuristic[r["task"]] = (r[statistic], r.get("rule", ""))
        else:
            out.setdefault(r["task"], []).append(r[statistic])
    return out, heuristic


def _us(value: float) -> str:
    """Microseconds with 3 significant digits (kernels run from tens of ns to a second)."""
    return f"{value:.3g}" if value < 1000 else f"{value:.0f}"


def heuristic_latency(store: Store, key: str, cores: int) -> tuple[float | None, str]:
    """Builds and measures the heuristic schedule of one stored task now, through runtime_c (plain
    weights, like the random programs): (median µs or None, the rule or fallback that chose it)."""
    import shutil
    import tempfile

    from .measure import measure_folder
    from .x86_build import build_job

    folder = tempfile.mkdtemp(prefix="tlmpack-heuristic-")
    try:
        job = build_job(str(store.root), key, cores, 0, folder, count=0, heuristic=True)
        if job.error or not job.programs:
            return None, job.heuristic_rule or "none"
        m = measure_folder(folder, ["h"], cores)["h"]
        return (getattr(m, X86_LATENCY) if m.valid else None), job.heuristic_rule
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def task_table(store: Store, heuristic: bool = False, models: list[str] | None = None,
               threads: int | None = None) -> str:
    """Markdown: one row per task with records, best, median, median/best, and the heuristic's
    record (collect measures it with the random programs; ``heuristic``: build and measure it now
    for tasks without one); ``models``: only the tasks of these corpus models. A program's latency
    is its record's X86_LATENCY (the fastest of its interleaved rounds)."""
    import os

    threads = threads or len(os.sched_getaffinity(0))
    lat, stored_heuristic = latencies(store, threads)
    names = {}
    for entry in store.corpora():
        if models and entry["model"] not in models:
            continue
        for t in entry["tasks"]:
            names.setdefault(t["key"], (t["name"], entry["model"]))
    lat = {k: v for k, v in lat.items() if k in names}
    head = "| task | model | records | best µs | median µs | median/best |"
    rule = "|---|---|---:|---:|---:|---:|"
    head += " heuristic µs | heuristic/best | chosen by |"
    rule += "---:|---:|---|"
    rows = [head, rule]
    spans: list[tuple[str, float, float, float | None, int]] = []
    for key, values in sorted(lat.items(), key=lambda kv: names.get(kv[0], ("", ""))[::-1]):
        name, model = names.get(key, ("?", "?"))
        best, median = min(values), statistics.median(values)
        row = f"| {name} `{key[:8]}` | {model} | {len(values)} | {_us(best)} | {_us(median)} | {median / best:.2f} |"
        h, who = stored_heuristic.get(key, (None, ""))
        if h is None and heuristic:
            h, who = heuristic_latency(store, key, threads)
        row += f" {_us(h)} | {h / best:.2f} | {who} |" if h is not None else f" - | - | {who} |"
        rows.append(row)
        spans.append((f"{name} `{key[:8]}`", best, median, h, len(values)))
    return summary(spans) + "\n\n" + "\n".join(rows)


def summary(spans: list[tuple[str, float, float, float | None, int]], min_programs: int = 8) -> str:
    """Markdown bullets over the table: how much the schedule matters (median/best over tasks with at
    least ``min_programs`` random programs) and where the heuristic stands against the best random
    program, with the tasks where it falls furthest behind."""

    def quantiles(values: list[float]) -> str:
        values = sorted(values)
        return (f"median {statistics.median(values):.2f}×, p90 {values[int(0.9 * (len(values) - 1))]:.2f}×, "
                f"max {values[-1]:.2f}×")

    lines = []
    spread = [m / b for _, b, m, _, n in spans if n >= min_programs and b > 0]
    if spread:
        lines.append(f"- {len(spans)} tasks. How much the schedule matters, median random program / best random "
                     f"program per task (the {len(spread)} tasks with ≥ {min_programs} programs): {quantiles(spread)}.")
    with_h = [(name, h / b, n) for name, b, _, h, n in spans if h is not None and b > 0 and n >= min_programs]
    if with_h:
        ratios = [r for _, r, _ in with_h]
        ahead = sum(r <= 1.0 for r in ratios)
        lines.append(f"- Heuristic / best random ({len(with_h)} tasks with ≥ {min_programs} programs): "
                     f"{quantiles(ratios)}; at least as fast as every random program on {ahead}, within 1.25× on "
                     f"{sum(r <= 1.25 for r in ratios)}.")
        worst = sorted(with_h, key=lambda t: -t[1])[:8]
        lines.append("- Furthest behind: " + ", ".join(f"{name} {r:.2f}×" for name, r, _ in worst) + ".")
    return "\n".join(lines)


def cuda_task_table(store: Store) -> str:
    """Markdown: per task, the H200 latencies of its random legal programs (count, best, median)
    and of the heuristic schedule measured in the same GPU run when there is one."""
    random_us: dict[str, list[float]] = {}
    heuristic_us: dict[str, float] = {}
    names: dict[str, tuple[str, str]] = {}
    for r in store.records("cuda"):
        if not r.get("valid"):
            continue
        names.setdefault(r["task"], (r.get("task_name", "?"), r.get("model", "?")))
        if r.get("chosen_by") == "heuristic":
            heuristic_us[r["task"]] = r["median_us"]
        else:
            random_us.setdefault(r["task"], []).append(r["median_us"])
    rows = ["| task | model | random programs | best µs | median µs | median/best | heuristic µs | heuristic/best |",
            "|---|---|---:|---:|---:|---:|---:|---:|"]
    spans = []
    for key in sorted(set(random_us) | set(heuristic_us), key=lambda k: names[k][::-1]):
        name, model = names[key]
        values = random_us.get(key, [])
        h = heuristic_us.get(key)
        if values:
            best, median = min(values), statistics.median(values)
            cells = f"{len(values)} | {_us(best)} | {_us(median)} | {median / best:.2f}"
            spans.append((f"{name} `{key[:8]}`", best, median, h, len(values)))
        else:
            best, cells = None, "0 | - | - | -"
        hcells = f"{_us(h)} | {h / best:.2f}" if h is not None and best else (f"{_us(h)} | -" if h is not None else "- | -")
        rows.append(f"| {name} `{key[:8]}` | {model} | {cells} | {hcells} |")
    return summary(spans) + "\n\n" + "\n".join(rows)
