"""Measures an adapt batch (tlmpack tlm adapt-batch) on another x86 machine with numpy and the C
runtime only (no TVM there): every program checked against its reference and timed through
runtime_c's kernel API in interleaved rounds, as the dataset is; writes the results JSON that
`tlmpack tlm import-x86` reads.

    python bench/remote_x86_measure.py BATCH_DIR --threads 16 --out results.json

Kernel libraries from TVM's export_library leave TVMFFIErrorSetRaisedFromCStrParts to
libtvm_ffi; where there is none, a one-function stand-in (compiled here with cc) is loaded first.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

STAND_IN = r"""
#include <stdint.h>
#include <stdio.h>
static _Thread_local char error[1024];
__attribute__((visibility("default"))) void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts,
                                                                             int32_t n) {
  size_t used = (size_t)snprintf(error, sizeof error, "%s: ", kind ? kind : "Error");
  for (int32_t i = 0; i < n && used < sizeof error; ++i)
    if (parts[i]) used += (size_t)snprintf(error + used, sizeof error - used, "%s", parts[i]);
}
"""


def load_stand_in() -> None:
    folder = Path(tempfile.mkdtemp(prefix="tlmpack-ffi-"))
    (folder / "ffi.c").write_text(STAND_IN)
    subprocess.run(["cc", "-O2", "-fPIC", "-shared", "-o", str(folder / "ffi.so"), str(folder / "ffi.c")], check=True)
    ctypes.CDLL(str(folder / "ffi.so"), mode=ctypes.RTLD_GLOBAL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("batch_dir")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    os.environ.setdefault("TLMPACK_HOST_WAIT_S", "0")
    load_stand_in()
    from tlmpack.training.adapt import measure_batch

    results = measure_batch(Path(args.batch_dir), args.threads)
    Path(args.out).write_text(json.dumps(results))
    valid = sum(r["valid"] for r in results["results"])
    print(f"{len(results['results'])} programs, {valid} valid, {results['seconds']} s on {results['machine']['cpu']}")


if __name__ == "__main__":
    main()
