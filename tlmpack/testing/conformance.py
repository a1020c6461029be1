"""ONNX's own conformance cases (shipped in the onnx wheel) through ``tlmpack build -t x86`` and
``tlmpack.runtime``. Test support only: bench/onnx_conformance.py writes the table, and
tests/test_onnx_conformance.py runs a fixed subset.

Cases run in a child process (``Worker``) with a timeout per case, so a crash or a hang is a row
of the table and not the end of the run; the child imports TVM once for all the cases it runs
(a fresh child per case costs ~5 s of imports each on two cores). A case is
  pass     every output allclose to the stored one (rtol 1e-3, atol 1e-5), every data set
  refused  the build raised one of tlmpack's typed errors (one line; ``names_op`` says whether it
           names an operator of the model)
  wrong    it built and ran, and an output differs
  crash    anything else: an untyped exception, a runtime error on a built artifact, a signal, a timeout
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

SUITES = ("pytorch-converted", "pytorch-operator", "simple")
RTOL, ATOL = 1e-3, 1e-5


@dataclass(frozen=True)
class CaseResult:
    case: str  # suite/name
    status: str  # pass | refused | wrong | crash
    message: str  # one line
    names_op: bool  # for refusals: the message names an operator of the model
    convertible: bool  # every node is a standard-domain op TVM 0.27's importer has a converter for
    seconds: float

    def to_json(self) -> dict:
        return asdict(self)


def data_root() -> Path:
    import onnx

    return Path(onnx.__file__).parent / "backend" / "test" / "data"


def case_dirs(suites: tuple[str, ...] = SUITES) -> list[Path]:
    root = data_root()
    return [d for suite in suites for d in sorted((root / suite).iterdir()) if (d / "model.onnx").is_file()]


def case_name(case_dir: Path) -> str:
    return f"{case_dir.parent.name}/{case_dir.name}"


def _read_value(path: Path, type_proto):
    """A test-data .pb as numpy: a tensor, or a list of tensors for a sequence input."""
    import onnx
    from onnx import numpy_helper

    data = path.read_bytes()
    if type_proto is not None and type_proto.HasField("sequence_type"):
        seq = onnx.SequenceProto()
        seq.ParseFromString(data)
        return numpy_helper.to_list(seq)
    tensor = onnx.TensorProto()
    tensor.ParseFromString(data)
    return numpy_helper.to_array(tensor)


def _data_sets(case_dir: Path, model) -> list[tuple[dict, list]]:
    initializers = {i.name for i in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in initializers]
    sets = []
    for data_dir in sorted(case_dir.glob("test_data_set_*")):
        feed = {}
        for i, value in enumerate(inputs):
            path = data_dir / f"input_{i}.pb"
            if path.exists():
                feed[value.name] = _read_value(path, value.type)
        outputs = [_read_value(p, model.graph.output[i].type if i < len(model.graph.output) else None)
                   for i, p in enumerate(sorted(data_dir.glob("output_*.pb"), key=lambda p: int(p.stem.split("_")[1])))]
        sets.append((feed, outputs))
    return sets


def convertible(model) -> bool:
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    supported = _get_convert_map()
    return all(n.domain in ("", "ai.onnx") and n.op_type in supported for n in model.graph.node)


def _names_op(message: str, model) -> bool:
    ops = {n.op_type for n in model.graph.node}
    return "unsupported operator" in message or any(f"'{op}'" in message or f" {op} " in message for op in ops)


def _dynamic_shapes(model, feed: dict) -> dict[str, tuple[int, ...]]:
    """--input-shape for the inputs whose declared shape is not static, from the test data (what a
    user would pin)."""
    shapes = {}
    for value in model.graph.input:
        if value.name not in feed or not value.type.HasField("tensor_type"):
            continue
        dims = value.type.tensor_type.shape.dim
        if any(not d.HasField("dim_value") or d.dim_value <= 0 for d in dims) and hasattr(feed[value.name], "shape"):
            shapes[value.name] = tuple(int(s) for s in feed[value.name].shape)
    return shapes


def run_case(case_dir: Path, work: Path) -> CaseResult:
    """Builds and runs one case in this process (the child's job)."""
    import numpy as np
    import onnx

    from tlmpack.build import BuildOptions, build
    from tlmpack.errors import TlmpackBuildError, one_line

    started = time.perf_counter()
    name = case_name(case_dir)
    model = onnx.load(str(case_dir / "model.onnx"))
    is_convertible = convertible(model)

    def result(status: str, message: str, names_op: bool = False) -> CaseResult:
        return CaseResult(name, status, message.replace("\n", " ")[:300], names_op, is_convertible,
                          round(time.perf_counter() - started, 1))

    sets = _data_sets(case_dir, model)
    if not sets:
        return result("crash", "the case has no test data")
    tar = work / "case.tar"
    try:
        build(str(case_dir / "model.onnx"), tar, BuildOptions(targets=("x86",),
                                                             input_shapes=_dynamic_shapes(model, sets[0][0])))
    except TlmpackBuildError as e:
        message = str(e)
        status = "refused" if len(message.splitlines()) == 1 else "crash"
        return result(status, f"{type(e).__name__}: {message}", _names_op(message, model))
    except Exception as e:  # noqa: BLE001 (the table's job is to show these)
        return result("crash", one_line(e))
    import tlmpack.runtime as rt

    try:
        loaded = rt.load(tar, device="cpu")
        for feed, expected in sets:
            if any(not isinstance(v, np.ndarray) for v in feed.values()):
                return result("crash", "built a model whose inputs are not tensors")
            outs = loaded.run(None, feed)
            if len(outs) != len(expected):
                return result("wrong", f"{len(outs)} outputs, expected {len(expected)}")
            for i, (out, ref) in enumerate(zip(outs, expected, strict=True)):
                ref = np.asarray(ref)
                if out.shape != ref.shape:
                    return result("wrong", f"output {i}: shape {out.shape}, expected {ref.shape}")
                if not np.allclose(out, ref, rtol=RTOL, atol=ATOL, equal_nan=True):
                    worst = float(np.max(np.abs(out.astype(np.float64) - ref.astype(np.float64))))
                    return result("wrong", f"output {i}: max abs diff {worst:.3g}")
    except Exception as e:  # noqa: BLE001
        return result("crash", f"built, then failed to run: {one_line(e)}")
    return result("pass", f"{len(sets)} data set(s)")


class Worker:
    """A child process that imports TVM once and runs cases one at a time, one JSON line each
    (``python -m tlmpack.testing.conformance --worker WORK_DIR``, case folders on stdin). A case
    that kills the child or passes its timeout is a crash row; the next case gets a fresh child."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.proc: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        self.work.mkdir(parents=True, exist_ok=True)
        return subprocess.Popen([sys.executable, "-m", "tlmpack.testing.conformance", "--worker", str(self.work)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True, bufsize=1)

    def run(self, case_dir: Path, timeout_s: float = 300.0) -> CaseResult:
        import select

        started = time.perf_counter()
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        proc = self.proc
        proc.stdin.write(f"{case_dir}\n")
        proc.stdin.flush()
        deadline = started + timeout_s
        while True:
            left = deadline - time.perf_counter()
            ready, _, _ = select.select([proc.stdout], [], [], max(left, 0))
            if not ready:
                self.close()
                return CaseResult(case_name(case_dir), "crash", f"timed out after {timeout_s:.0f} s", False, False,
                                  round(time.perf_counter() - started, 1))
            line = proc.stdout.readline()
            if not line:  # the child died
                code = proc.wait()
                self.proc = None
                return CaseResult(case_name(case_dir), "crash", f"the child process died (exit status {code})",
                                  False, False, round(time.perf_counter() - started, 1))
            if line.startswith("{"):
                return CaseResult(**json.loads(line))

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


def _worker(work: Path) -> None:
    import contextlib
    import os

    out = os.fdopen(os.dup(1), "w", buffering=1)
    with contextlib.redirect_stdout(sys.stderr):  # TVM's prints must not mix with the JSON lines
        for line in sys.stdin:
            case_dir = Path(line.strip())
            case_work = work / case_dir.name
            case_work.mkdir(parents=True, exist_ok=True)
            outcome = run_case(case_dir, case_work)
            out.write(json.dumps(outcome.to_json()) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        _worker(Path(sys.argv[2]))
    else:
        print(json.dumps(run_case(Path(sys.argv[1]), Path(sys.argv[2])).to_json()), flush=True)
