"""Frontends: turn an ONNX file or a PyTorch model into a Relax IRModule plus its IO specs."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..specs import SourceInfo, TensorSpec


@dataclass
class ImportedModel:
    """A model in Relax with its public signature. Holds TVM objects: only compiling rooms use it."""

    mod: Any  # tvm.IRModule whose "main" takes the inputs in order; build.py sets None once lowered
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    source: SourceInfo
    notes: list[str] = field(default_factory=list)  # rescues the frontend made (e.g. an opset upgrade)


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_model(model: str, input_shapes: dict[str, tuple[int, ...]] | None = None) -> ImportedModel:
    """Dispatches on the model reference: ``*.onnx``, ``*.pt2`` or ``package.module:factory``."""
    from ..errors import ModelLoadError

    input_shapes = input_shapes or {}
    if model.endswith(".onnx"):
        from .onnx import load_onnx

        return load_onnx(model, input_shapes)
    if model.endswith(".pt2") or (":" in model and not Path(model).exists()):
        from .torch import load_torch

        return load_torch(model, input_shapes)
    raise ModelLoadError(
        f"{model}: not a model tlmpack reads; expected an .onnx file, a torch.export .pt2 file, "
        "or package.module:factory"
    )
