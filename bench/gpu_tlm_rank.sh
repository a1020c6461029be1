#!/usr/bin/env bash
# The x86 TLM's ranking phase on round C's recipe, on the GPU machine (issue 12): weights C from
# scratch (pretraining and taste), then three continuations of C in parallel: R600 and R1500 (ranking
# steps over the interleaved groups, with the taste's loss) and C600 (taste steps only, the control).
# Reads saved training sets (dataset.save_training_set) from DIR; weights and logs land in $OUT.
#   bash bench/gpu_tlm_rank.sh DIR [PRETRAIN_STEPS FINETUNE_STEPS]
set -euo pipefail
dir=$1; pretrain=${2:-3000}; finetune=${3:-1500}
export PYTHONUNBUFFERED=1
train() { python3 -m tlmpack.training.train --data "$dir/x86-train-il.pkl.gz" --heldout "$dir/x86-heldout.pkl.gz" \
  --target x86 --batch 128 --device cuda "$@" 2>&1 | grep -v Warn; }
nvidia-smi -L || true
train --pretrain-steps "$pretrain" --finetune-steps "$finetune" --out "$OUT/C.safetensors" > "$OUT/C.log"
tail -n 2 "$OUT/C.log" | cut -c1-400
train --init "$OUT/C.safetensors" --finetune-steps 0 --rank-steps 600 --rank-groups 16 --out "$OUT/R600.safetensors" > "$OUT/R600.log" &
train --init "$OUT/C.safetensors" --finetune-steps 0 --rank-steps 1500 --rank-groups 16 --out "$OUT/R1500.safetensors" > "$OUT/R1500.log" &
train --init "$OUT/C.safetensors" --finetune-steps 600 --out "$OUT/C600.safetensors" > "$OUT/C600.log" &
wait
for f in R600 R1500 C600; do echo "== $f"; grep -E "rank [0-9]+/|held-out" "$OUT/$f.log" | tail -n 2 | cut -c1-300; done
