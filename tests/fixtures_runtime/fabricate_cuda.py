"""Fabricates the CUDA half of a tlmpack artifact, and a stand-in NVIDIA driver, without a GPU or TVM.

- `add_cuda_target(artifact)` adds cuda/plan.so (tests/cuda/fake_cuda_plan.c built with gcc),
  cuda/sm_90.cubin and cuda/kernels.ptx (tests/cuda/fake_kernels.cu, compiled once with nvcc and
  committed, so no CUDA toolkit is needed), and the manifest's cuda target, first in the list, as
  the compiler writes it.
- `build_fake_libcuda(dir)` builds tests/cuda/fake_libcuda.c into dir/libcuda.so.1: put dir on
  LD_LIBRARY_PATH of a subprocess, with its FAKE_CUDA_* variables, to simulate a GPU machine.

Run as a script to write a ready artifact folder for tests/gpu/run_gpu_checks.py:
    python tests/fixtures_runtime/fabricate_cuda.py OUT_DIR [--extra-launches N]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import fabricate  # noqa: E402

CUDA_DIR = fabricate.REPO / "tests" / "cuda"
PLAN_C = CUDA_DIR / "fake_cuda_plan.c"
CUBIN = CUDA_DIR / "fake_kernels_sm_90.cubin"
PTX = CUDA_DIR / "fake_kernels.ptx"
FAKE_LIBCUDA_C = CUDA_DIR / "fake_libcuda.c"


def cuda_target(min_driver: int = 13000, ptx: bool = True, cubin: bool = True) -> dict:
    files = ["cuda/plan.so"] + (["cuda/sm_90.cubin"] if cubin else []) + (["cuda/kernels.ptx"] if ptx else [])
    t = {"id": "cuda", "kind": "cuda", "archs": ["sm_90"] if cubin else [], "ptx": ptx,
         "min_driver_version": min_driver, "files": files}
    if ptx:
        t["ptx_arch"] = "sm_90"
    return t


def build_plan(out: Path, weights_sha256: str, *defines: str) -> Path:
    subprocess.run(["gcc", "-std=c11", "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror",
                    f"-I{fabricate.RUNTIME_C}", f'-DFAKE_WEIGHTS_SHA256="{weights_sha256}"', *defines, str(PLAN_C),
                    "-o", str(out)], check=True, capture_output=True, text=True)
    return out


def add_cuda_target(artifact: Path, *defines: str, min_driver: int = 13000, ptx: bool = True) -> Path:
    """Adds the CUDA target to a fabricated artifact folder (before its x86 target) and rehashes it.

    defines: -D flags for fake_cuda_plan.c (its broken variants, FAKE_EXTRA_LAUNCHES=N, FAKE_MIN_DRIVER=...,
    FAKE_PTX_ONLY).
    """
    cubin = "-DFAKE_PTX_ONLY" not in defines
    cuda = artifact / "cuda"
    cuda.mkdir(exist_ok=True)
    build_plan(cuda / "plan.so", fabricate.sha256(artifact / "weights.bin"), *defines)
    if cubin:
        shutil.copyfile(CUBIN, cuda / "sm_90.cubin")
    if ptx:
        shutil.copyfile(PTX, cuda / "kernels.ptx")
    m = fabricate.read_manifest(artifact)
    m["targets"] = [cuda_target(min_driver, ptx, cubin)] + [t for t in m["targets"] if t["kind"] != "cuda"]
    for f in m["targets"][0]["files"]:
        m["files"][f] = ""
    fabricate.rehash(artifact, m)
    return artifact


def make_artifact(dest: Path, *defines: str, runtime_lib: Path | None = None, min_driver: int = 13000,
                  ptx: bool = True) -> Path:
    """A complete cuda+x86 artifact folder (the fake add/scale model)."""
    fabricate.make_artifact(dest, runtime_lib=runtime_lib)
    return add_cuda_target(dest, *defines, min_driver=min_driver, ptx=ptx)


def build_fake_libcuda(out_dir: Path) -> Path:
    """Builds the simulated driver as out_dir/libcuda.so.1; returns out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o",
                    str(out_dir / "libcuda.so.1"), str(FAKE_LIBCUDA_C), "-lpthread"],
                   check=True, capture_output=True, text=True)
    return out_dir


def write_gpu_check_inputs(folder: Path, name: str, seed: int = 0) -> None:
    """NAME.inputs.npz and NAME.expected.npz for the fake model, for tests/gpu/run_gpu_checks.py."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    k = np.array([3], dtype=np.int32)
    y = x + fabricate.WEIGHTS
    np.savez(folder / f"{name}.inputs.npz", x=x, k=k)
    np.savez(folder / f"{name}.expected.npz", y=y, z=y * np.float32(k[0]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--extra-launches", type=int, default=0, help="repeat scale_k this many more times (graph timing)")
    ap.add_argument("--ptx-only", action="store_true", help="no cubin: the driver must JIT the PTX")
    ap.add_argument("--runtime-lib", type=Path, default=None, help="a prebuilt libtlmrt.so to ship")
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    name = "fake_add_scale" + (f"_x{args.extra_launches + 2}" if args.extra_launches else "") + \
        ("_ptx" if args.ptx_only else "")
    dest = args.out_dir / name
    if dest.exists():
        shutil.rmtree(dest)
    defines = [f"-DFAKE_EXTRA_LAUNCHES={args.extra_launches}"] if args.extra_launches else []
    if args.ptx_only:
        defines.append("-DFAKE_PTX_ONLY")
    make_artifact(dest, *defines, runtime_lib=args.runtime_lib)
    write_gpu_check_inputs(args.out_dir, name)
    print(dest)


if __name__ == "__main__":
    main()
