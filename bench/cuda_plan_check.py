#!/usr/bin/env python
"""Runs an artifact's CUDA plan on a GPU without the C runtime, as an independent check of the compiler
side: reads cuda/plan.so through ctypes, loads the cubin (or PTX) with CuPy, replays every launch
over one device arena and the device copy of weights.bin, and compares the outputs with references.

    python bench/cuda_plan_check.py ARTIFACT(.tar or folder) --inputs X.npz [--refs R.npz | --onnx M.onnx]
                                    [--repeat 20] [--image ptx]

Needs numpy and cupy (and onnxruntime for --onnx); never tvm. The arena starts filled with 0xFF bytes
(NaN for floats) so a kernel that reads memory no launch wrote shows up as NaN in the outputs.
"""

from __future__ import annotations

import argparse
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tlmpack.emit.cuda_plan import ARENA, ARG_INT32, ARG_INT64, IMAGE_CUBIN, IMAGE_PTX, read_cuda_plan  # noqa: E402

_DTYPE = {(0, 8): np.int8, (0, 16): np.int16, (0, 32): np.int32, (0, 64): np.int64, (1, 8): np.uint8,
          (2, 16): np.float16, (2, 32): np.float32, (2, 64): np.float64, (6, 8): np.bool_}


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    out64, ref64 = np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(out64 - ref64) / max(np.linalg.norm(ref64), 1e-30))


class PlanRunner:
    def __init__(self, folder: Path, image_kind: str = "auto") -> None:
        import cupy as cp

        self.cp = cp
        self.plan = read_cuda_plan(folder / "cuda" / "plan.so")
        cc = int(cp.cuda.Device().compute_capability)
        images = self.plan["images"]
        cubin = [im for im in images if im[1] == IMAGE_CUBIN and im[2] == cc]
        ptx = sorted((im for im in images if im[1] == IMAGE_PTX and im[2] <= cc), key=lambda im: -im[2])
        chosen = (cubin or ptx) if image_kind == "auto" else (cubin if image_kind == "cubin" else ptx)
        if not chosen:
            raise SystemExit(f"no {image_kind} image for sm_{cc} in {images}")
        self.image = chosen[0]
        self.module = cp.RawModule(path=str(folder / self.image[0]))
        weights = np.fromfile(folder / "weights.bin", dtype=np.uint8)
        assert weights.size == self.plan["weights_bytes"]
        self.weights = cp.asarray(weights) if weights.size else cp.zeros(1, dtype=cp.uint8)
        self.arena = cp.full(max(self.plan["arena_bytes"], 1), 0xFF, dtype=cp.uint8)
        self.functions = {}
        self.launches = []
        for launch in self.plan["launches"]:
            f = self.functions.get(launch["kernel"])
            if f is None:
                f = self.functions[launch["kernel"]] = self.module.get_function(launch["kernel"])
            if launch["smem"] > 48 * 1024:
                f.max_dynamic_shared_size_bytes = launch["smem"]
            args = []
            for kind, tensor, value in launch["args"]:
                if kind == ARG_INT32:
                    args.append(np.int32(value))
                elif kind == ARG_INT64:
                    args.append(np.int64(value))
                else:
                    args.append(np.uint64(self.pointer(tensor)))
            self.launches.append((f, launch["grid"], launch["block"], tuple(args), launch["smem"]))

    def pointer(self, tid: int) -> int:
        t = self.plan["tensors"][tid]
        base = self.arena if t["storage"] == ARENA else self.weights
        return base.data.ptr + t["offset"]

    def view(self, tid: int):
        t = self.plan["tensors"][tid]
        dtype = _DTYPE[(t["dtype"][0], t["dtype"][1])]
        return self.arena[t["offset"]:t["offset"] + t["nbytes"]].view(dtype).reshape(t["shape"])

    def run(self, feed: dict[str, np.ndarray], repeat: int = 0) -> tuple[list[np.ndarray], float | None]:
        """One run, outputs read right after it; then ``repeat`` timed runs. Inputs are copied in before
        every run: the memory plan lets intermediates reuse an input's bytes after its last read."""
        cp = self.cp
        staged = []
        for name, tid in self.plan["inputs"]:
            view = self.view(tid)
            staged.append((view, cp.asarray(np.ascontiguousarray(feed[name]).astype(view.dtype).reshape(view.shape))))

        def once():
            for view, value in staged:
                view[...] = value
            for f, grid, block, args, smem in self.launches:
                f(grid, block, args, shared_mem=smem)

        once()
        cp.cuda.Device().synchronize()
        outputs = [cp.asnumpy(self.view(tid)) for _, tid in self.plan["outputs"]]
        ms = None
        if repeat:
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            for _ in range(3):
                once()
            times = []
            for _ in range(repeat):
                for view, value in staged:
                    view[...] = value
                start.record()
                for f, grid, block, args, smem in self.launches:
                    f(grid, block, args, shared_mem=smem)
                stop.record()
                stop.synchronize()
                times.append(cp.cuda.get_elapsed_time(start, stop))
            ms = float(np.median(times))
            again = [cp.asnumpy(self.view(tid)) for _, tid in self.plan["outputs"]]
            for first, last in zip(outputs, again, strict=True):
                if not np.array_equal(first, last, equal_nan=True):
                    print("warning: a timed run gave different outputs than the first run (not deterministic)")
        return outputs, ms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact")
    parser.add_argument("--inputs", required=True, help=".npz keyed by input name")
    parser.add_argument("--refs", help=".npz keyed by output name (or arr_0, arr_1, ... in output order)")
    parser.add_argument("--onnx", help="compute references with onnxruntime from this model")
    parser.add_argument("--repeat", type=int, default=0, help="time this many runs (CUDA events, median)")
    parser.add_argument("--image", choices=["auto", "cubin", "ptx"], default="auto")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.artifact)
        if folder.is_file():
            with tarfile.open(folder) as t:
                t.extractall(tmp, filter="data")
            folder = Path(tmp)
        started = time.perf_counter()
        runner = PlanRunner(folder, args.image)
        feed = dict(np.load(args.inputs))
        outputs, ms = runner.run(feed, args.repeat)
        elapsed = time.perf_counter() - started
        names = [n for n, _ in runner.plan["outputs"]]
        if args.onnx:
            import onnxruntime as ort

            sess = ort.InferenceSession(args.onnx, providers=["CPUExecutionProvider"])
            refs = sess.run(names, {k: v for k, v in feed.items() if k in {i.name for i in sess.get_inputs()}})
        elif args.refs:
            stored = np.load(args.refs)
            refs = [stored[n] if n in stored else stored[f"arr_{i}"] for i, n in enumerate(names)]
        else:
            refs = [None] * len(names)
        ok = True
        for name, out, ref in zip(names, outputs, refs, strict=True):
            finite = bool(np.all(np.isfinite(out))) if out.dtype.kind == "f" else True
            err = rel_err(out, ref) if ref is not None else float("nan")
            good = finite and (ref is None or err < args.tolerance)
            ok &= good
            print(f"{name}: shape {out.shape} finite={finite} rel_err={err:.3g} {'OK' if good else 'FAIL'}")
        print(f"{runner.plan['model_name']}: {len(runner.launches)} launches, image {runner.image[0]}, "
              f"first run {elapsed:.2f} s" + (f", median {ms:.3f} ms over {args.repeat}" if ms is not None else ""))
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
