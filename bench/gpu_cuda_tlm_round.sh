#!/usr/bin/env bash
# On the GPU machine, one call: measure a CUDA batch, import it into a copy of the store under a
# fixed shard name (the same records as importing the results here), and retrain the CUDA TLM with
# the shipped weights' recipe on the H200 (3,000 grammar + 1,500 taste steps of 128, seed 0), or with
# INIT=WEIGHTS only the 1,500 taste steps from those weights (a round of the improvement loop).
# Run from a folder holding tlmpack/, bench/, data/ and the batch folder (cubins compiled beforehand
# with the same nvcc save the GPU machine's nvcc time: bench/gpu_measure_programs.py --compile-only):
#   RUN=NAME [INIT=FILE] bash bench/gpu_cuda_tlm_round.sh BATCH_DIR OUT_DIR [MEASURE_BUDGET_S] [TRAIN_LIMIT_S]
# OUT_DIR gets results.json.gz, the imported shard, cuda.safetensors and the logs.
set -uo pipefail
batch="$1"; out="$2"; budget="${3:-270}"; limit="${4:-330}"
run="${RUN:?RUN names the shard}"
py="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
"$py" bench/gpu_measure_programs.py "$batch" --out "$out/results.json.gz" --budget-s "$budget" \
  --repeat-count 50 --repeat-s 15 --hang-s 30 --jobs 16 2>&1 | tee "$out/measure.log" | tail -5
"$py" -m tlmpack.training.cuda_programs import "$batch" "$out/results.json.gz" --data data --run "$run" \
  | tee "$out/import.json"
cp "data/records/cuda/$run.jsonl.gz" "$out/"
timeout "$limit" "$py" -m tlmpack.training.train --store data --target cuda --out "$out/cuda.safetensors" \
  --device cuda --pretrain-steps 3000 --finetune-steps 1500 --batch 128 --seed 0 ${INIT:+--init "$INIT"} 2>&1 | tee "$out/train.log" | tail -4
