"""Per-task comparison of one side-by-side measurement: the TLM's greedy schedule against the
rules' choice and against the best known (the fastest valid program measured in the same pass:
TLM samples, re-measured stored best, fresh random search), as geometric means over the tasks
whose space holds at least 8 distinct legal programs (where the choice matters)."""

from __future__ import annotations

import math
from collections import defaultdict

from .dataset import latency


def space_size(sites_of_task: list) -> int:
    """Distinct legal points of a task's space, from its cached sites (capped at 10**6)."""
    from ..schedule.space import legal_values

    total = 0
    for sketch in sites_of_task:
        n = 1
        for site in sketch:
            n *= max(1, len(legal_values(site)) if site.kind != "compute_location" or site.candidates else 1)
            if n > 10**6:
                break
        total += n
    return min(total, 10**6)


def compare(records: list[dict], sites: dict[str, list], names: dict[str, str] | None = None) -> dict:
    """Rows per task and the geometric means (choice-matters tasks and the others apart)."""
    by_task: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_task[r["task"]].append(r)
    rows = []
    for key, rs in sorted(by_task.items()):
        valid = [r for r in rs if r.get("valid")]
        greedy = [r for r in valid if r.get("chosen_by") == "tlm" and r.get("rule") == "greedy"]
        heuristic = [r for r in valid if r.get("chosen_by") == "heuristic" and r.get("rule") != "re-measured"]
        if not valid or not greedy:
            rows.append({"task": key, "name": (names or {}).get(key, ""), "tlm_us": None, "note": "no valid TLM program"})
            continue
        best = min(latency(r) for r in valid)
        row = {"task": key, "name": (names or {}).get(key, ""), "programs": len(valid),
               "space": space_size(sites.get(key, [])), "tlm_us": latency(greedy[0]), "best_us": best,
               "heuristic_us": latency(heuristic[0]) if heuristic else None,
               "best_by": min(valid, key=latency).get("chosen_by")}
        row["tlm_vs_best"] = best / row["tlm_us"]  # speed of the TLM's pick relative to the best: <= 1
        if row["heuristic_us"]:
            row["tlm_speedup_vs_heuristic"] = row["heuristic_us"] / row["tlm_us"]
        for r in valid:  # other models' greedy picks of the same pass (`tlm measure --versus`)
            if r.get("chosen_by") == "tlm" and str(r.get("rule", "")).startswith("greedy:"):
                row.setdefault("versus_us", {})[r["rule"].removeprefix("greedy:")] = latency(r)
        rows.append(row)
    return {"rows": rows, "matters": _summary([r for r in rows if r.get("tlm_us") and r["space"] >= 8]),
            "small_spaces": _summary([r for r in rows if r.get("tlm_us") and r["space"] < 8])}


def _geomean(xs: list[float]) -> float | None:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _summary(rows: list[dict]) -> dict:
    vs_best = [r["tlm_vs_best"] for r in rows]
    vs_heur = [r["tlm_speedup_vs_heuristic"] for r in rows if r.get("tlm_speedup_vs_heuristic")]
    heur_vs_best = [r["best_us"] / r["heuristic_us"] for r in rows if r.get("heuristic_us")]
    out = {"tasks": len(rows), "tlm_speed_vs_best_geomean": _geomean(vs_best),
           "tlm_speedup_vs_heuristic_geomean": _geomean(vs_heur),
           "heuristic_speed_vs_best_geomean": _geomean(heur_vs_best)}
    for name in sorted({n for r in rows for n in r.get("versus_us", {})}):
        paired = [r for r in rows if name in r.get("versus_us", {}) and r.get("heuristic_us")]
        out[f"{name}_speedup_vs_heuristic_geomean"] = _geomean([r["heuristic_us"] / r["versus_us"][name] for r in paired])
        out[f"{name}_speed_vs_best_geomean"] = _geomean([r["best_us"] / r["versus_us"][name] for r in paired])
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}


def markdown(result: dict, title: str) -> str:
    """The comparison as a markdown table (BENCHMARKS.md)."""
    lines = [f"#### {title}", "", "| task | space | programs | TLM µs | heuristic µs | best µs (by) | TLM/best speed | TLM vs heuristic |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if r.get("tlm_us") is None:
            lines.append(f"| {r['name'] or r['task']} | | | {r['note']} | | | | |")
            continue
        h = f"{r['heuristic_us']:.1f}" if r.get("heuristic_us") else "–"
        vs = f"{r['tlm_speedup_vs_heuristic']:.2f}×" if r.get("tlm_speedup_vs_heuristic") else "–"
        lines.append(f"| {r['name'] or r['task']} | {r['space']} | {r['programs']} | {r['tlm_us']:.1f} | {h} | "
                     f"{r['best_us']:.1f} ({r['best_by']}) | {r['tlm_vs_best']:.2f} | {vs} |")
    for part in ("matters", "small_spaces"):
        s = result[part]
        lines.append("")
        lines.append(f"{'space ≥ 8' if part == 'matters' else 'space < 8'}: {s['tasks']} tasks; TLM speed vs best "
                     f"{s['tlm_speed_vs_best_geomean']}, TLM speed-up vs heuristic {s['tlm_speedup_vs_heuristic_geomean']}, "
                     f"heuristic speed vs best {s['heuristic_speed_vs_best_geomean']} (geometric means)")
    return "\n".join(lines) + "\n"


def geomean_table(records: list[dict]) -> str:
    """Adapt eval: per task the greedy pick of each model (``tlm_model``), and each model's
    geometric-mean speed-up over the first one (``unadapted``)."""
    by_task: dict[str, dict[str, float]] = defaultdict(dict)
    for r in records:
        if r.get("valid") and r.get("rule") == "greedy":
            by_task[r["task"]][r.get("tlm_model", "")] = latency(r)
    models = sorted({m for v in by_task.values() for m in v}, key=lambda m: (m != "unadapted", m))
    lines = ["| task | " + " | ".join(f"{m} µs" for m in models) + " |", "|---" * (len(models) + 1) + "|"]
    for key, lat in sorted(by_task.items()):
        lines.append(f"| {key} | " + " | ".join(f"{lat[m]:.1f}" if m in lat else "–" for m in models) + " |")
    if len(models) > 1:
        base = models[0]
        for m in models[1:]:
            ratios = [v[base] / v[m] for v in by_task.values() if base in v and m in v]
            g = _geomean(ratios)
            lines.append(f"\n{m} vs {base}: geometric-mean speed-up {g:.3f} over {len(ratios)} tasks" if g else "")
    return "\n".join(lines) + "\n"


def round_progress(store, target: str, records: list[dict]) -> dict:
    """One improvement round: per task whose TLM candidates were measured, the best-known latency
    before (stored programs of the same hardware, but this round's) and after, each against the
    best random program; geometric means. (x86 rounds compare across timing passes: min_us
    repeats to 2-4 %, data/README.md.)"""
    import json as _json

    def group(r: dict) -> tuple:
        hw = {k: v for k, v in r["hardware"].items() if k not in ("features",)}
        return r["task"], _json.dumps(hw, sort_keys=True), r.get("timer", "")

    mine = defaultdict(list)
    for r in records:
        if r.get("valid"):
            mine[group(r)].append(r)
    before: dict[tuple, list[dict]] = defaultdict(list)
    for r in store.records(target, as_built=True):
        if r.get("valid") and group(r) in mine and r.get("rule") != "re-measured":
            before[group(r)].append(r)
    rows = []
    for g, rs in sorted(mine.items()):
        old = [r for r in before[g] if not any(r.get("time") == x.get("time") and r["decisions"] == x["decisions"]
                                               for x in rs)]
        random_best = min((latency(r) for r in old if r.get("chosen_by") in (None, "random")), default=None)
        if random_best is None:
            continue
        known_before = min(latency(r) for r in old)
        after = min(known_before, min(latency(r) for r in rs))
        rows.append({"task": g[0], "best_random_us": random_best, "best_before_us": known_before,
                     "best_after_us": after, "tlm_best_us": min(latency(r) for r in rs)})
    return {"tasks": len(rows),
            "before_vs_random_geomean": _geomean([r["best_random_us"] / r["best_before_us"] for r in rows]),
            "after_vs_random_geomean": _geomean([r["best_random_us"] / r["best_after_us"] for r in rows]),
            "tlm_best_vs_random_geomean": _geomean([r["best_random_us"] / r["tlm_best_us"] for r in rows]),
            "improved_tasks": sum(r["best_after_us"] < r["best_before_us"] for r in rows), "rows": rows}


def calibrate(rows: list[dict], confidences: dict[str, float], grid: tuple[float, ...] = tuple(
        round(0.05 * i, 2) for i in range(21))) -> dict:
    """The confidence floor under which the build should take the rules' schedule instead of the
    TLM's: the one that maximises the geometric-mean speed-up over the rules on ``rows`` (compare()
    rows of TRAINING tasks, each with the TLM's and the rules' latency), given each task's greedy
    confidence. Ties go to the lower floor (trust the model)."""
    usable = [r for r in rows if r.get("tlm_us") and r.get("heuristic_us") and r["task"] in confidences]
    best = (0.0, -1.0)
    table = []
    for floor in grid:
        ratios = [r["heuristic_us"] / r["tlm_us"] if confidences[r["task"]] >= floor else 1.0 for r in usable]
        g = _geomean(ratios) or 1.0
        trusted = sum(confidences[r["task"]] >= floor for r in usable)
        table.append({"floor": floor, "speedup_vs_heuristic": round(g, 4), "trusted": trusted})
        if g > best[1] + 1e-9:
            best = (floor, g)
    return {"min_confidence": best[0], "speedup_vs_heuristic": round(best[1], 4), "tasks": len(usable),
            "table": table}
