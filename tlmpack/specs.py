"""Plain records shared by the compiler's rooms (frontend → graph → schedule → emit)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output as the user sees it."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @staticmethod
    def from_json(d: dict) -> TensorSpec:
        return TensorSpec(d["name"], d["dtype"], tuple(int(s) for s in d["shape"]))


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
