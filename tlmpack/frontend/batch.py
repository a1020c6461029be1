"""A dynamic batch dimension: which batch sizes get a plan, and each plan's input shapes.

A batch plan is the same model imported with its batch dimension (axis 0 of every input) fixed
to one size, so the frontend's --input-shape path does the real work; this module only says
which shapes to ask for, and refuses models whose batch dimension is not symbolic.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InputShapeError

BATCH_DIM = "batch"  # the symbolic name the manifest and `m.inputs` show


def parse_batches(text: str | None, max_batch: int | None) -> tuple[int, ...]:
    """``--batch 1,4,16`` → (1, 4, 16); ``--max-batch 16`` → the powers of two up to it, and it."""
    if text and max_batch:
        raise InputShapeError("give --batch or --max-batch, not both")
    if max_batch is not None and not text:
        if max_batch < 1:
            raise InputShapeError(f"--max-batch must be positive, got {max_batch}")
        sizes = {1 << k for k in range(max_batch.bit_length()) if 1 << k <= max_batch} | {max_batch}
        return tuple(sorted(sizes))
    if not text:
        return ()
    try:
        sizes = {int(part) for part in text.split(",") if part.strip()}
    except ValueError:
        raise InputShapeError(f"--batch {text!r}: expected batch sizes separated by commas, e.g. 1,4,16") from None
    if not sizes or min(sizes) < 1:
        raise InputShapeError(f"--batch {text!r}: batch sizes must be positive integers")
    return tuple(sorted(sizes))


def _onnx_input_dims(path: str) -> dict[str, list[int | str | None]]:
    """Each graph input's declared dims: an int, a dim_param name, or None (unknown)."""
    import onnx

    model = onnx.load(path, load_external_data=False)
    initializers = {init.name for init in model.graph.initializer}
    dims = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dims[value.name] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                            for d in value.type.tensor_type.shape.dim]
    return dims


def batch_input_shapes(model: str, batches: tuple[int, ...],
                       input_shapes: dict[str, tuple[int, ...]]) -> dict[int, dict[str, tuple[int, ...]]]:
    """batch size → the --input-shape of every input for that plan. Axis 0 of every input is the
    batch; it must be symbolic in the model (a dim_param): a fixed batch dimension is refused
    rather than rewritten, because a model exported for batch 1 may bake it into reshapes."""
    if Path(model).suffix.lower() != ".onnx":
        raise InputShapeError(f"--batch needs an ONNX model with a symbolic batch dimension; {model} is not .onnx")
    declared = _onnx_input_dims(model)
    unknown = set(input_shapes) - set(declared)
    if unknown:
        raise InputShapeError(f"--input-shape names {sorted(unknown)}, which are not inputs; the inputs are "
                              f"{sorted(declared)}")
    rest: dict[str, tuple[int, ...]] = {}
    for name, dims in declared.items():
        if not dims:
            raise InputShapeError(f"--batch: input {name!r} is a scalar; every input needs the batch as its axis 0")
        if isinstance(dims[0], int) and dims[0] > 0:
            raise InputShapeError(f"--batch: input {name!r} has a fixed batch dimension {dims[0]} (shape "
                                  f"{tuple(dims)}); re-export the model with a symbolic axis 0 (dim_param)")
        given = input_shapes.get(name)
        if given is not None:
            if len(given) != len(dims):
                raise InputShapeError(f"--input-shape {name}: the model declares {len(dims)} dims, got {given}")
            tail = tuple(given[1:])
        else:
            if any(not isinstance(d, int) or d <= 0 for d in dims[1:]):
                pretty = "x".join(str(d) if d else "?" for d in dims)
                raise InputShapeError(f"input {name!r} has dynamic dims besides the batch ({pretty}); pin them with "
                                      f"--input-shape {name}:1x..." )
            tail = tuple(int(d) for d in dims[1:])
        rest[name] = tail
    return {b: {name: (b, *tail) for name, tail in rest.items()} for b in batches}
