#!/usr/bin/env bash
# The GPU machine's half of bench/dynamic_batch.py: time the prebuilt CUDA artifacts of
# `python bench/dynamic_batch.py build --dir .carry/batch/cuda --targets cuda` (dynamic batch vs
# exact batch, batches 1 3 4 7 16, each checked against onnxruntime), once under the build's cost
# estimates and once calibrated (Model.calibrate_batch_plans), and leave both tables in $OUT.
#   bash bench/gpu_dynamic_batch.sh [CARRY_DIR]        (default .carry/batch/cuda)
# Needs numpy, onnxruntime and tlmpack's C runtime only (built here when a C compiler is present).
set -euo pipefail
carry="${1:-.carry/batch/cuda}"
out="${OUT:-.}"
export PYTHONUNBUFFERED=1
if command -v cc >/dev/null 2>&1; then bash runtime_c/build.sh tlmpack/runtime; fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/gpu.txt" || true
python3 bench/dynamic_batch.py run --dir "$carry" --targets cuda --device cuda --runs 200 \
  --report "$out/dynamic_batch_cuda.md" 2>&1 | tee "$out/dynamic_batch_cuda.log"
python3 bench/dynamic_batch.py run --dir "$carry" --targets cuda --device cuda --runs 200 --calibrate \
  --report "$out/dynamic_batch_cuda_calibrated.md" 2>&1 | tee "$out/dynamic_batch_cuda_calibrated.log"
