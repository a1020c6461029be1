#!/usr/bin/env python
"""Export zoo seed models to ONNX with a live random input set.

    python examples/make_models.py --out DIR [names...]

writes, for every name, ``DIR/<name>.onnx`` (plus ``DIR/<name>.onnx.data`` for models over 2 GiB),
``DIR/<name>.inputs.npz`` (``random_inputs(name, seed)``, keyed by input name) and, with ``--ref``,
``DIR/<name>.ref.npz`` (the torch output, keyed by output name). Each export is checked in
onnxruntime against torch (live output, rel err < 1e-4) unless ``--no-check``.

Names: any of ``tlmpack.zoo.names()``, or ``all``, ``tiny``, ``bench`` (the default:
bench models + tiny models). ``--report FILE`` writes a markdown table with export time,
size, node count and the ONNX op types per model.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tlmpack import zoo  # noqa: E402


def expand(names: list[str]) -> list[str]:
    out: list[str] = []
    for n in names:
        if n == "all":
            out += zoo.names()
        elif n == "tiny":
            out += zoo.names(tiny=True)
        elif n == "bench":
            out += zoo.BENCH_DEFAULT
        else:
            zoo.spec(n)  # raises on unknown names
            out.append(n)
    return list(dict.fromkeys(out))


def fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def write_report(path: Path, rows: list[dict], opset: int) -> None:
    lines = [
        "# Zoo ONNX export report",
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M')} by `examples/make_models.py`, opset {opset}, "
        "TorchScript exporter (dynamo=False) + tlmpack.zoo._simplify.",
        "",
        "| model | export s | .onnx | .onnx.data | nodes | ORT rel err | live | input | output |",
        "|---|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for r in rows:
        chk = r.get("check", {})
        ins = ", ".join(f"{i.name} {i.dtype}{list(i.shape)}" for i in zoo.spec(r["name"]).inputs)
        err = f"{chk['rel_err']:.1e}" if chk else "-"
        live = ("yes" if chk.get("live") else "NO") if chk else "-"
        lines.append(
            f"| {r['name']} | {r['time_s']:.1f} | {fmt_bytes(r['size_bytes'])} | "
            f"{fmt_bytes(r['data_bytes']) if r['data_bytes'] else '-'} | {r['num_nodes']} | {err} | {live} | "
            f"{ins} | {chk.get('shape', '-')} |"
        )
    lines += ["", "## ONNX op types per model (count)", ""]
    for r in rows:
        ops = ", ".join(f"{k} {v}" for k, v in r["op_counts"].items())
        lines.append(f"- **{r['name']}**: {ops}")
    all_ops = sorted({k for r in rows for k in r["op_counts"]})
    lines += ["", f"Union of op types: {', '.join(all_ops)}", ""]
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", default=["bench", "tiny"], help="models (default: bench tiny)")
    ap.add_argument("--out", required=True, type=Path, help="output directory")
    ap.add_argument("--opset", type=int, default=zoo.DEFAULT_OPSET)
    ap.add_argument("--seed", type=int, default=zoo.DEFAULT_SEED, help="weight and input seed")
    ap.add_argument("--weights", choices=zoo.WEIGHT_MODES, default="dense",
                    help="dense: transformers' init (+noise); portable: numpy-drawn sparse weights, same under any "
                         "torch version and ~30x compressible (for carrying artifacts to a GPU machine)")
    ap.add_argument("--no-check", action="store_true", help="skip the onnxruntime vs torch check")
    ap.add_argument("--ref", action="store_true", help="also write <name>.ref.npz with the torch output")
    ap.add_argument("--dynamo", action="store_true", help="use the dynamo exporter instead of TorchScript")
    ap.add_argument("--report", type=Path, help="write a markdown report (times, sizes, op types)")
    ap.add_argument("--json", type=Path, help="write the raw per-model results as JSON")
    args = ap.parse_args(argv)

    import numpy as np

    names = expand(args.names)
    args.out.mkdir(parents=True, exist_ok=True)
    rows, failed = [], []
    for name in names:
        t0 = time.perf_counter()
        model, _, _, out_names = zoo.get_model(name, args.seed, args.weights)
        build_s = time.perf_counter() - t0
        onnx_path = args.out / f"{name}.onnx"
        r = zoo.export_onnx(
            name, onnx_path, opset=args.opset, seed=args.seed, dynamo=args.dynamo, model=model
        )
        r["build_s"] = build_s
        feed = zoo.random_inputs(name, args.seed)
        np.savez(args.out / f"{name}.inputs.npz", **feed)
        if stats := zoo.batchnorm_stats(model):  # lets another torch rebuild exactly this model
            np.savez(args.out / f"{name}.bnstats.npz", **stats)
        msg = (
            f"{name:16s} build {build_s:5.1f}s  export {r['time_s']:6.1f}s  {fmt_bytes(r['size_bytes']):>10s}"
            + (f" + data {fmt_bytes(r['data_bytes'])}" if r["data_bytes"] else "")
            + f"  {r['num_nodes']} nodes"
        )
        if not args.no_check or args.ref:
            chk = zoo.check_onnx(name, onnx_path, args.seed, model=model, return_outputs=args.ref)
            if args.ref:
                np.savez(args.out / f"{name}.ref.npz", **{out_names[0]: chk.pop("torch_out")})
                chk.pop("feed"), chk.pop("ort_out")
            r["check"] = chk
            msg += (
                f"  ORT rel err {chk['rel_err']:.1e}  std {chk['std']:.3g}  {'ok' if chk['ok'] else 'FAILED'}"
            )
            if not chk["ok"]:
                failed.append(name)
        print(msg, flush=True)
        print(f"{'':16s} ops: {' '.join(r['op_types'])}", flush=True)
        rows.append(r)
        del model
    if args.report:
        write_report(args.report, rows, args.opset)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))
    if failed:
        print(f"FAILED checks: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
