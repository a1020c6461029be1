"""Errors the compiler raises for the user. The CLI prints them as one line and exits with code 2."""

from __future__ import annotations


class TlmpackBuildError(Exception):
    """Base of every error that is the model's or the user's, not a bug in tlmpack."""


class ModelLoadError(TlmpackBuildError):
    """The model file is missing, malformed, or not a format tlmpack reads."""


class UnsupportedOperatorError(TlmpackBuildError):
    """TVM has no converter (or lowering) for an operator of the model."""

    def __init__(self, op: str, node: str, detail: str = "") -> None:
        self.op = op
        self.node = node
        more = f": {detail}" if detail else ""
        super().__init__(f"unsupported operator {op!r} at node {node!r}{more}")


class InputShapeError(TlmpackBuildError):
    """An input has a dynamic dimension that was not pinned with --input-shape, or a bad override."""


class LoweringError(TlmpackBuildError):
    """TVM or the C toolchain failed to build a kernel or the model library."""
