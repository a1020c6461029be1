#!/usr/bin/env bash
# Build MODEL (default encoder-197) for CUDA with and without awkward-extent padding, with the
# zoo's portable weights, and pack what bench/gpu_pad_ab.py needs into CARRY_DIR:
#   bash bench/prepare_gpu_pad.sh WORK_DIR CARRY_DIR [MODEL]
# Both artifacts are carried whole (their weights.bin differ: the padded one holds the attention
# masks); with portable weights xz packs encoder-197 to about 16 MB each.
set -euo pipefail
work="$1"; carry="$2"; model="${3:-encoder-197}"
py="${PYTHON:-python}"
mkdir -p "$work" "$carry"
[ -f "$work/$model.onnx" ] || "$py" examples/make_models.py --out "$work" --weights portable --ref "$model"
"$py" -m tlmpack.cli build "$work/$model.onnx" -t cuda -o "$work/$model.tar"
"$py" -m tlmpack.cli build "$work/$model.onnx" -t cuda --no-pad-extents -o "$work/$model.nopad.tar"
xz -T2 -1 -c "$work/$model.tar" > "$carry/$model.tar.xz"
xz -T2 -1 -c "$work/$model.nopad.tar" > "$carry/$model.nopad.tar.xz"
cp "$work/$model.inputs.npz" "$work/$model.ref.npz" "$carry/"
du -sh "$carry"
