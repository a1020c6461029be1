"""ONNX's conformance cases (onnx/backend/test/data/{pytorch-converted,pytorch-operator,simple})
through ``tlmpack build -t x86`` and ``tlmpack.runtime``, each in a child process with a timeout;
writes the per-case table to docs/onnx-conformance.md (and the rows as JSON with --json).

    PYTHONPATH=. nice -n 10 python bench/onnx_conformance.py --out docs/onnx-conformance.md

See tlmpack/testing/conformance.py for what pass / refused / wrong / crash mean.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import tempfile
from pathlib import Path

from tlmpack.testing import conformance

NOTES = "## Notes\n"


def _table(rows: list[conformance.CaseResult], command: str) -> str:
    counts = {s: sum(r.status == s for r in rows) for s in ("pass", "refused", "wrong", "crash")}
    conv = [r for r in rows if r.convertible]
    conv_pass = sum(r.status == "pass" for r in conv)
    refused = [r for r in rows if r.status == "refused"]
    import onnx
    import tvm

    lines = [
        "# ONNX conformance cases",
        "",
        f"ONNX {onnx.__version__}'s own test cases (model + stored inputs and outputs), built with "
        f"`tlmpack build -t x86` (TVM {tvm.__version__}) and run with `tlmpack.runtime`; outputs compared with "
        f"numpy allclose (rtol {conformance.RTOL:g}, atol {conformance.ATOL:g}). Each case runs in a child process "
        "(one worker that imports TVM once; a crash or a timeout costs only its case's row) with a timeout. Inputs with a dynamic dimension are pinned with `--input-shape` from the test data, as a "
        "user would.",
        "",
        f"Made on {datetime.date.today().isoformat()} ({platform.node()}, {platform.machine()}) with:",
        "",
        f"    {command}",
        "",
        f"**{len(rows)} cases: {counts['pass']} pass, {counts['refused']} refused with a one-line error, "
        f"{counts['wrong']} wrong, {counts['crash']} crash.** "
        f"Of the {len(conv)} cases whose every operator TVM 0.27's ONNX importer has a converter for, "
        f"{conv_pass} pass ({100 * conv_pass / max(len(conv), 1):.1f}%). "
        f"{sum(r.names_op for r in refused)} of the {len(refused)} refusals name an operator of the model.",
        "",
        "| case | result | TVM converts every op | seconds | message |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        message = r.message.replace("|", "\\|")
        lines.append(f"| {r.case} | {r.status} | {'yes' if r.convertible else 'no'} | {r.seconds:.1f} | {message} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/onnx-conformance.md"))
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per case")
    parser.add_argument("--only", nargs="*", default=None, help="suite/name of the cases to run (default: all)")
    args = parser.parse_args(argv)
    cases = conformance.case_dirs()
    if args.only:
        cases = [c for c in cases if conformance.case_name(c) in set(args.only)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="tlmpack-conformance-") as tmp:
        worker = conformance.Worker(Path(tmp))
        try:
            for i, case in enumerate(cases):
                row = worker.run(case, args.timeout)
                rows.append(row)
                print(f"[{i + 1}/{len(cases)}] {row.case:60} {row.status:8} {row.message[:100]}", flush=True)
        finally:
            worker.close()
    command = "PYTHONPATH=. nice -n 10 python bench/onnx_conformance.py " + " ".join(argv or sys.argv[1:])
    notes = ""  # a hand-written "## Notes" section of the existing file is kept
    if args.out.exists() and NOTES in args.out.read_text():
        notes = "\n" + NOTES + args.out.read_text().split(NOTES, 1)[1]
    total = sum(r.seconds for r in rows)
    args.out.write_text(_table(rows, command.strip()) + f"\nTotal {total:.0f} s of case time.\n" + notes)
    if args.json:
        args.json.write_text(json.dumps([r.to_json() for r in rows], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
