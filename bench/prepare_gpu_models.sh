#!/usr/bin/env bash
# Build the seed models here for -t cuda,x86 with portable weights, check the x86 half against
# onnxruntime, and pack what the GPU machine needs into a folder small enough to carry:
#   bash bench/prepare_gpu_models.sh WORK_DIR CARRY_DIR [models...]      (a model may be NAME@bN)
# A NAME@bN artifact is packed without weights.bin (it is NAME's, byte for byte: the GPU script
# takes it from there and load() checks its sha256). References over 4 MB are left behind: the
# GPU script computes its own with torch there.
set -euo pipefail
work="$1"; carry="$2"; shift 2
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(resnet50 mobilenetv2 efficientnet-b0 bert-base gpt2 llama-2l-4096)
py="${PYTHON:-python}"
mkdir -p "$work" "$carry"
for m in "${models[@]}"; do
  stem="${m/@b/_b}"
  [ -f "$work/$stem.onnx" ] || { "$py" examples/make_models.py --out "$work" --weights portable --ref "$m";
    for f in "$work/$m".*; do mv "$f" "$work/$stem${f#"$work/$m"}"; done; }
  if [ ! -f "$work/$stem.tar" ] || [ "$work/$stem.onnx" -nt "$work/$stem.tar" ]; then
    "$py" -m tlmpack.cli build "$work/$stem.onnx" -t cuda,x86 -o "$work/$stem.tar"
  fi
  "$py" -m tlmpack.verify "$work/$stem.tar" "$work/$stem.onnx" --inputs "$work/$stem.inputs.npz"
  if [ "$stem" != "$m" ]; then
    "$py" bench/strip_weights.py "$work/$stem.tar" "$work/$stem.noweights.tar"
    xz -T2 -1 -c "$work/$stem.noweights.tar" > "$carry/$stem.noweights.tar.xz"
  else
    xz -T2 -1 -c "$work/$stem.tar" > "$carry/$stem.tar.xz"
  fi
  # inputs are zoo.random_inputs(NAME, 0), numpy-seeded: large ones are remade on the GPU machine
  [ "$(stat -c %s "$work/$stem.inputs.npz")" -gt 4000000 ] || cp "$work/$stem.inputs.npz" "$carry/"
  [ "$(stat -c %s "$work/$stem.ref.npz")" -gt 4000000 ] || cp "$work/$stem.ref.npz" "$carry/"
  [ ! -f "$work/$stem.bnstats.npz" ] || cp "$work/$stem.bnstats.npz" "$carry/"
done
du -sh "$carry"
