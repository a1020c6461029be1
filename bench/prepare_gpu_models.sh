#!/usr/bin/env bash
# Build the seed models here for -t cuda,x86 with portable weights, check the x86 half against
# onnxruntime, and pack what the GPU machine needs (xz-compressed artifacts, inputs, references)
# into a folder small enough to carry:   bash bench/prepare_gpu_models.sh WORK_DIR CARRY_DIR [models...]
set -euo pipefail
work="$1"; carry="$2"; shift 2
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(resnet50 mobilenetv2 efficientnet-b0 bert-base gpt2 llama-2l-4096)
py="${PYTHON:-python}"
mkdir -p "$work" "$carry"
for m in "${models[@]}"; do
  [ -f "$work/$m.onnx" ] || "$py" examples/make_models.py --out "$work" --weights portable --ref "$m"
  if [ ! -f "$work/$m.tar" ] || [ "$work/$m.onnx" -nt "$work/$m.tar" ]; then
    "$py" -m tlmpack.cli build "$work/$m.onnx" -t cuda,x86 -o "$work/$m.tar"
  fi
  "$py" -m tlmpack.verify "$work/$m.tar" "$work/$m.onnx" --inputs "$work/$m.inputs.npz"
  xz -T2 -1 -c "$work/$m.tar" > "$carry/$m.tar.xz"
  cp "$work/$m.inputs.npz" "$work/$m.ref.npz" "$carry/"
  ls -la "$carry/$m.tar.xz"
done
du -sh "$carry"
