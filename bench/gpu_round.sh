#!/usr/bin/env bash
# One improvement round's GPU-machine half (docs/tlm.md): measure a CUDA candidate batch (and an
# x86 adapt batch on this host's CPU), add the records to this copy of data/, fine-tune the TLMs
# from the committed weights, and leave results and weights in $OUT.
#   bash bench/gpu_round.sh ROUND CUDA_BATCH [ADAPT_BATCH] [--train x86,cuda] [--adapt-cpu NAME]
set -euo pipefail
round=$1; cuda_batch=$2; shift 2
adapt_batch=""; train="x86,cuda"; adapt_cpu="skylake-avx512"; steps=1500
while [ $# -gt 0 ]; do
  case $1 in
    --train) train=$2; shift 2;; --adapt-cpu) adapt_cpu=$2; shift 2;; --steps) steps=$2; shift 2;;
    *) adapt_batch=$1; shift;;
  esac
done
export PYTHONUNBUFFERED=1
lscpu > "$OUT/lscpu.txt" || true
if [ -n "$cuda_batch" ] && [ "$cuda_batch" != "-" ]; then
  python3 bench/gpu_measure_programs.py "$cuda_batch" --out "$OUT/cuda-$round.json.gz" --budget-s 330 --jobs 16 \
    --repeat-count 50 --repeat-s 15 2>&1 | tail -n 4
  python3 -c "from tlmpack.training import cuda_programs as c; from tlmpack.training.store import Store; \
print(c.import_results(Store('data'), '$cuda_batch', '$OUT/cuda-$round.json.gz', run='h200-$round'))"
fi
if [ -n "$adapt_batch" ]; then
  python3 bench/remote_x86_measure.py "$adapt_batch" --threads 16 --out "$OUT/adapt-$round.json"
  python3 -c "import json; from pathlib import Path; from tlmpack.training.adapt import import_results; \
from tlmpack.training.store import Store; r = import_results(Store('data'), Path('$adapt_batch'), \
json.loads(Path('$OUT/adapt-$round.json').read_text())); print(len(r), 'adapt records')"
fi
for t in ${train//,/ }; do
  python3 -m tlmpack.training.train --store data --target "$t" --init "tlmpack/tlm/weights/$t.safetensors" \
    --pretrain-steps 0 --finetune-steps "$steps" --batch 128 --device cuda --out "$OUT/$t-$round.safetensors" \
    2>&1 | grep -v Warn | tail -n 3
done
if [ -n "$adapt_batch" ] && [ -f "$OUT/x86-$round.safetensors" ]; then
  python3 -m tlmpack.training.train --store data --target x86 --llvm-cpu "$adapt_cpu" --init "$OUT/x86-$round.safetensors" \
    --pretrain-steps 0 --finetune-steps 300 --batch 32 --device cuda --out "$OUT/x86-$adapt_cpu.safetensors" \
    2>&1 | grep -v Warn | tail -n 3
fi
