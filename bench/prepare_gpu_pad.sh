#!/usr/bin/env bash
# Build MODEL (default encoder-197) for CUDA with and without awkward-extent padding, with the
# zoo's portable weights, and pack what bench/gpu_pad_ab.py needs into CARRY_DIR:
#   bash bench/prepare_gpu_pad.sh WORK_DIR CARRY_DIR [MODEL]
# The unpadded artifact is packed without weights.bin (the padding changes no constant of the
# model: checked here), so the carry holds one copy of the weights.
set -euo pipefail
work="$1"; carry="$2"; model="${3:-encoder-197}"
py="${PYTHON:-python}"
mkdir -p "$work" "$carry"
[ -f "$work/$model.onnx" ] || "$py" examples/make_models.py --out "$work" --weights portable --ref "$model"
"$py" -m tlmpack.cli build "$work/$model.onnx" -t cuda -o "$work/$model.tar"
"$py" -m tlmpack.cli build "$work/$model.onnx" -t cuda --no-pad-extents -o "$work/$model.nopad.tar"
a=$(tar -xOf "$work/$model.tar" weights.bin | sha256sum); b=$(tar -xOf "$work/$model.nopad.tar" weights.bin | sha256sum)
[ "$a" = "$b" ] || { echo "the two builds' weights differ: carry both artifacts whole" >&2; exit 1; }
"$py" bench/strip_weights.py "$work/$model.nopad.tar" "$work/$model.nopad.noweights.tar"
xz -T2 -1 -c "$work/$model.tar" > "$carry/$model.tar.xz"
xz -T2 -1 -c "$work/$model.nopad.noweights.tar" > "$carry/$model.nopad.noweights.tar.xz"
cp "$work/$model.inputs.npz" "$work/$model.ref.npz" "$carry/"
du -sh "$carry"
