#!/usr/bin/env bash
# Build the seed models here for CUDA twice, with the heuristic rules and with TVM dlight, and
# pack what the H200 needs to compare them (bench/gpu_heuristic_vs_dlight.py):
#   bash bench/prepare_gpu_heuristic.sh WORK_DIR CARRY_DIR [models...]
# WORK_DIR must hold NAME.onnx, NAME.inputs.npz, NAME.ref.npz (bench/prepare_gpu_models.sh makes
# them, with portable weights). The dlight artifact ships without weights.bin: both builds share
# the same graph and constants, and load() checks the sha256 the GPU script copies over.
set -euo pipefail
work="$1"; carry="$2"; shift 2
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(resnet50 mobilenetv2 efficientnet-b0 bert-base gpt2 llama-2l-4096)
py="${PYTHON:-python}"
mkdir -p "$carry"
for m in "${models[@]}"; do
  for s in heuristic dlight; do
    out="$work/$m.$s.tar"
    [ -f "$out" ] && [ "$out" -nt "$work/$m.onnx" ] || "$py" -m tlmpack.cli build "$work/$m.onnx" -t cuda --scheduler "$s" -o "$out"
  done
  xz -T2 -1 -c "$work/$m.heuristic.tar" > "$carry/$m.heuristic.tar.xz"
  "$py" bench/strip_weights.py "$work/$m.dlight.tar" "$work/$m.dlight.noweights.tar"
  xz -T2 -1 -c "$work/$m.dlight.noweights.tar" > "$carry/$m.dlight.noweights.tar.xz"
  for f in inputs ref bnstats; do
    [ ! -f "$work/$m.$f.npz" ] || [ "$(stat -c %s "$work/$m.$f.npz")" -gt 4000000 ] || cp "$work/$m.$f.npz" "$carry/"
  done
done
du -sh "$carry"
