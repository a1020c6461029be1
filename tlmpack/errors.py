"""Errors the compiler raises for the user (the CLI prints them as one line and exits with code 2), and
the record of one it recovered from (Fallback: the build log and the manifest list them)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


class TlmpackBuildError(Exception):
    """Base of every error that is the model's or the user's, not a bug in tlmpack."""


class ModelLoadError(TlmpackBuildError):
    """The model file is missing, malformed, or not a format tlmpack reads."""


class UnsupportedOperatorError(TlmpackBuildError):
    """TVM has no converter (or lowering) for an operator of the model."""

    def __init__(self, op: str, node: str, detail: str = "", opset: int | None = None) -> None:
        self.op = op
        self.node = node
        self.opset = opset
        more = f": {detail}" if detail else ""
        at_opset = f" (opset {opset})" if opset is not None else ""
        super().__init__(f"unsupported operator {op!r}{at_opset} at node {node!r}{more}")


class InputShapeError(TlmpackBuildError):
    """An input has a dynamic dimension that was not pinned with --input-shape, or a bad override."""


class LoweringError(TlmpackBuildError):
    """TVM or the C toolchain failed to build a kernel or the model library."""


def one_line(error: BaseException, limit: int = 240) -> str:
    """An exception as one short line: its type and the most specific line of its message
    (TVM's InternalError carries a C++ backtrace first and the check that failed last)."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    checks = [ln for ln in lines if "Check failed" in ln or ln.startswith(("InternalError", "TVMError", "ValueError"))]
    text = (checks[-1] if checks else lines[-1] if lines else "").removeprefix("error: ")
    text = text.replace("Relax could not lower the model to TIR: ", "")
    return f"{type(error).__name__}: {text}"[:limit]


@dataclass(frozen=True)
class Fallback:
    """One optional transformation that was not applied, where, and the error that made us stop."""

    # switched off: layout-ops | channels-last | fast-math | constant-folding | pad-awkward-extents | pre-packing |
    # cuda-schedule / x86-schedule (a task's chosen schedule that TVM cannot compile, replaced by
    # dlight's / the fixed rules');
    # a rescue: opset-upgrade (the frontend converted the model to the opset TVM's converter is for)
    transform: str
    scope: str  # "graph", or the task id for per-task fallbacks
    reason: str  # one line

    def to_json(self) -> dict:
        return asdict(self)

    def sentence(self) -> str:
        return f"fallback [{self.transform}, {self.scope}]: {self.reason}"
