"""Plain records shared by the compiler's rooms (frontend → graph → schedule → emit)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

# One record for a model's inputs and outputs on both sides: the compiler writes what the runtime reads.
from .runtime.model import TensorSpec  # noqa: F401  (re-exported)


@dataclass(frozen=True)
class SourceInfo:
    """Where the model came from, for the manifest."""

    name: str
    path: str
    sha256: str
    format: str  # "onnx" | "torch"

    def to_json(self) -> dict:
        return asdict(self)


def parse_input_shapes(items: tuple[str, ...] | list[str]) -> dict[str, tuple[int, ...]]:
    """Parses --input-shape values like ``x:1x3x224x224`` (a scalar is ``x:``)."""
    from .errors import InputShapeError

    shapes: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, dims = item.rpartition(":")
        if not sep or not name:
            raise InputShapeError(f"--input-shape {item!r}: expected NAME:D0xD1x..., e.g. x:1x3x224x224")
        try:
            shapes[name] = tuple(int(d) for d in dims.split("x")) if dims else ()
        except ValueError:
            raise InputShapeError(f"--input-shape {item!r}: dimensions must be integers separated by 'x'") from None
        if any(d <= 0 for d in shapes[name]):
            raise InputShapeError(f"--input-shape {item!r}: dimensions must be positive")
    return shapes
