#!/usr/bin/env bash
# Build the seed models here once per scheduler and pack what the GPU machine needs to compare
# them side by side (bench/gpu_schedulers.py):
#   SCHEDULERS="tlm heuristic" BUILD_FLAGS="-t cuda" bash bench/prepare_gpu_schedulers.sh WORK_DIR CARRY_DIR [models...]
# SCHEDULERS defaults to "heuristic dlight", BUILD_FLAGS to "-t cuda". A model may be NAME@bN.
# WORK_DIR must hold STEM.onnx, STEM.inputs.npz, STEM.ref.npz (STEM = NAME or NAME_bN;
# bench/prepare_gpu_models.sh or examples/make_models.py --weights portable make them). Only the
# first scheduler's artifact of a batch-1 model carries weights.bin: every other build of the same
# graph and constants ships without it, and load() checks the sha256 of the copy put back.
set -euo pipefail
work="$1"; carry="$2"; shift 2
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(resnet50 mobilenetv2 efficientnet-b0 bert-base gpt2 llama-2l-4096)
read -r -a schedulers <<< "${SCHEDULERS:-heuristic dlight}"
read -r -a flags <<< "${BUILD_FLAGS:--t cuda}"
py="${PYTHON:-python}"
mkdir -p "$carry"
for m in "${models[@]}"; do
  stem="${m/@b/_b}"
  for s in "${schedulers[@]}"; do
    out="$work/$stem.$s.tar"
    [ -f "$out" ] && [ "$out" -nt "$work/$stem.onnx" ] || "$py" -m tlmpack.cli build "$work/$stem.onnx" "${flags[@]}" --scheduler "$s" -o "$out"
    if [ "$s" = "${schedulers[0]}" ] && [ "$stem" = "$m" ]; then
      xz -T2 -1 -c "$out" > "$carry/$stem.$s.tar.xz"
    else
      "$py" bench/strip_weights.py "$out" "$work/$stem.$s.noweights.tar"
      xz -T2 -1 -c "$work/$stem.$s.noweights.tar" > "$carry/$stem.$s.noweights.tar.xz"
    fi
  done
  # a small model's ONNX goes too: exported there by another torch it can differ (remote_x86_models.py)
  if [ "$stem" = "$m" ] && [ "$(stat -c %s "$work/$stem.onnx")" -le 40000000 ]; then
    xz -T2 -3 -c "$work/$stem.onnx" > "$carry/$stem.onnx.xz"
  fi
  for f in inputs ref bnstats; do
    [ ! -f "$work/$stem.$f.npz" ] || [ "$(stat -c %s "$work/$stem.$f.npz")" -gt 4000000 ] || cp "$work/$stem.$f.npz" "$carry/"
  done
done
du -sh "$carry"
