#!/usr/bin/env python
"""On a GPU machine: how much of a CUDA ``model.run`` is outside the C runtime, for small artifacts.

    python bench/gpu_run_overhead.py ARTIFACT.tar [ARTIFACT.tar ...]

Inputs live on the GPU (torch tensors). Times, medians of 300 synchronised runs: (1) ``model.run(None,
feed, output_device="cuda")`` as a user calls it (the Python binding: feed checks, DLPack, a fresh
output buffer a run); (2) the C call ``tlmrt_model_run_io`` with the same inputs and one output
buffer kept across runs; (3) allocating and freeing one output buffer alone.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import tlmpack.runtime as rt  # noqa: E402
from tlmpack.runtime import _capi  # noqa: E402


def median_ms(fn, runs: int = 300) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def measure(path: str) -> str:
    model = rt.load(path, device="cuda")
    feed = {s.name: torch.randn(*s.shape, device="cuda") for s in model.inputs}
    as_user = median_ms(lambda: model.run(None, feed, output_device="cuda"))
    spec = model.outputs[0]
    kept = model._new_cuda_array(spec)
    ins = (_capi.IO * len(model.inputs))()
    for i, s in enumerate(model.inputs):
        ins[i] = _capi.IO(feed[s.name].data_ptr(), s.nbytes, _capi.DEVICE_CUDA, model.device_index)
    outs = (_capi.IO * 1)(_capi.IO(kept.data_ptr, spec.nbytes, _capi.DEVICE_CUDA, model.device_index))
    c_call = median_ms(lambda: model._lib.lib.tlmrt_model_run_io(model._handle, ins, outs))
    alloc = median_ms(lambda: model._new_cuda_array(spec))
    model.close()
    return (f"{Path(path).name}: model.run(output_device='cuda') {as_user:.3f} ms; the C call with one kept "
            f"output buffer {c_call:.3f} ms; allocating and freeing an output buffer alone {alloc:.3f} ms")


def main() -> int:
    for path in sys.argv[1:]:
        print(measure(path), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
