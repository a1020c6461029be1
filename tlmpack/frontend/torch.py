"""PyTorch frontend: a saved ExportedProgram (.pt2) or ``package.module:factory`` → torch.export → Relax."""

from __future__ import annotations

import hashlib
import importlib
import logging
import zipfile
from pathlib import Path

from ..errors import ModelLoadError, UnsupportedOperatorError
from ..specs import SourceInfo, TensorSpec
from . import ImportedModel, file_sha256
from .relax_io import output_specs
from .torch_rewrites import average_pool_covering_input_to_mean


def _export_from_factory(reference: str):
    import torch

    module_name, _, factory_name = reference.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), factory_name)
    except (ImportError, AttributeError) as e:
        raise ModelLoadError(f"{reference}: cannot import the factory ({e})") from None
    made = factory()
    if not (isinstance(made, tuple) and len(made) == 2):
        raise ModelLoadError(f"{reference}: the factory must return (nn.Module, example_inputs)")
    module, example_inputs = made
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    module.eval()
    try:
        return torch.export.export(module, tuple(example_inputs))
    except Exception as e:
        raise ModelLoadError(f"{reference}: torch.export failed: {type(e).__name__}: {e}") from None


def _program_sha256(ep) -> str:
    """A content hash of the program: its graph and its constants (a .pt2 zip holds timestamps)."""
    h = hashlib.sha256(str(ep.graph).encode())
    for name, tensor in sorted(ep.state_dict.items()):
        h.update(name.encode())
        h.update(tensor.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def _input_specs(ep) -> list[TensorSpec]:
    from torch.export.graph_signature import InputKind

    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    specs = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind != InputKind.USER_INPUT:
            continue
        value = placeholders[spec.arg.name].meta.get("val")
        if value is None or not hasattr(value, "shape"):
            raise ModelLoadError(f"input {spec.arg.name!r} is not a tensor; tlmpack takes tensor inputs only")
        try:
            shape = tuple(int(d) for d in value.shape)
        except TypeError:
            raise ModelLoadError(f"input {spec.arg.name!r} has a dynamic shape; export with static shapes") from None
        specs.append(TensorSpec(spec.arg.name, str(value.dtype).removeprefix("torch."), shape))
    return specs


class _Captured(logging.Handler):
    """Keeps the records a logger emits instead of printing them."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _load_pt2(reference: str):
    """torch.export.load, with one line instead of torch's logged traceback when the file is not a program."""
    if not Path(reference).is_file():
        raise ModelLoadError(f"{reference}: no such file")
    if not zipfile.is_zipfile(reference):  # a .pt2 is a zip archive; say so before importing torch
        raise ModelLoadError(f"{reference}: not a torch.export program (not a zip archive, which a .pt2 file is)")
    import torch

    log = logging.getLogger("torch.export")
    captured = _Captured()
    saved = (log.handlers[:], log.propagate)
    log.handlers, log.propagate = [captured], False  # torch logs a failed load's traceback as a warning
    try:
        return torch.export.load(reference)
    except Exception as e:
        causes = [r.exc_info[1] for r in captured.records if r.exc_info and r.exc_info[1] is not None]
        cause = causes[0] if causes else e  # torch's own exception only says "check the warnings above"
        lines = str(cause).strip().splitlines()
        detail = lines[0][:200] if lines else ""
        raise ModelLoadError(f"{reference}: not a torch.export program ({type(cause).__name__}: {detail})") from None
    finally:
        log.handlers, log.propagate = saved


def load_torch(reference: str, input_shapes: dict[str, tuple[int, ...]]) -> ImportedModel:
    """Exports (or loads) the program and converts it with TVM's ExportedProgram frontend."""
    if reference.endswith(".pt2"):
        ep = _load_pt2(reference)
        sha, name = file_sha256(reference), Path(reference).stem
    else:
        ep = _export_from_factory(reference)
        sha, name = _program_sha256(ep), reference.rpartition(":")[2]
    ep = ep.run_decompositions()
    average_pool_covering_input_to_mean(ep)
    inputs = _input_specs(ep)
    for spec in inputs:
        if spec.name in input_shapes and tuple(input_shapes[spec.name]) != spec.shape:
            raise ModelLoadError(
                f"--input-shape {spec.name}: the exported program has static shape {spec.shape}; "
                "re-export it with the shape you want"
            )

    from tvm.relax.frontend.torch import from_exported_program

    try:
        mod = from_exported_program(ep, keep_params_as_input=False, unwrap_unit_return_tuple=True)
    except Exception as e:
        message = str(e)
        if "Unsupported function type" in message or "not supported" in message:
            op = message.split("type")[-1].strip(" :'[]\n") if "type" in message else "?"
            raise UnsupportedOperatorError(op, "torch graph", message.splitlines()[0]) from None
        raise ModelLoadError(f"{reference}: TVM could not import the program: {type(e).__name__}: {e}") from None
    user_outputs = [s.arg.name for s in ep.graph_signature.output_specs if hasattr(s.arg, "name")]
    outputs = output_specs(mod, user_outputs or None)
    source = SourceInfo(name=name, path=reference, sha256=sha, format="torch")
    return ImportedModel(mod=mod, inputs=inputs, outputs=outputs, source=source)
