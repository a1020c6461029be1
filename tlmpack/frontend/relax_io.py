"""Reads a Relax main function's output signature as TensorSpecs."""

from __future__ import annotations

from ..errors import ModelLoadError
from ..specs import TensorSpec


def _leaf_tensor_infos(sinfo) -> list:
    from tvm import relax

    if isinstance(sinfo, relax.TupleType):
        leaves = []
        for field in sinfo.fields:
            leaves.extend(_leaf_tensor_infos(field))
        return leaves
    return [sinfo]


def output_specs(mod, names: list[str] | None) -> list[TensorSpec]:
    """The flattened outputs of ``main``; static shapes are required."""
    from tvm import relax

    leaves = _leaf_tensor_infos(mod["main"].ret_ty)
    if names is None or len(names) != len(leaves):
        names = [f"output_{i}" for i in range(len(leaves))]
    specs = []
    for name, sinfo in zip(names, leaves, strict=True):
        if not isinstance(sinfo, relax.TensorType) or sinfo.shape is None:
            raise ModelLoadError(f"output {name!r} is not a tensor with a known shape ({sinfo})")
        try:
            shape = tuple(int(d) for d in sinfo.shape.values)
        except (TypeError, AttributeError):
            raise ModelLoadError(f"output {name!r} has a dynamic shape {sinfo.shape}; tlmpack needs static shapes") from None
        specs.append(TensorSpec(name, str(sinfo.dtype), shape))
    return specs
