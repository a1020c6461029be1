#!/usr/bin/env bash
# Session 35 on the Xeon: the run-scoped spin (run, 1 ms) against this session's default runtime (cur),
# EfficientNet-B0's pool and pg49 builds, MobileNetV2 and ResNet-50 (their pg49 = pool: an A/A copy).
# Passes alternate which runtime the engines load first (base = TLMPACK_RUNTIME_LIB) and the variants' order.
set -u
D=.carry/x35; R=$OUT/s35; mkdir -p $R
M="efficientnet-b0 mobilenetv2 resnet50"
RUNS=${RUNS:-60}
save() { tar -C $OUT -cf $OUT/s35.tar s35; }
pass() { # name base-lib other-name other-lib variants...
  local n=$1 base=$2 oname=$3 olib=$4; shift 4
  TLMPACK_RUNTIME_LIB=$base timeout 140 python3 bench/remote_x86_models.py --dir $D --variants "$@" --models $M \
    --threads 4 16 --runs $RUNS --runtime-lib $oname=$olib --json $R/$n.json > $R/$n.log 2>&1
  echo "$n rc=$?"; tail -14 $R/$n.log; save
}
prof() { # lib variant model
  TLMPACK_RUNTIME_LIB=$PWD/$D/libtlmrt.$1.so timeout 50 python3 bench/remote_x86_profile.py --dir $D --variant $2 \
    --models $3 --threads 16 --runs 30 --out $R/prof-$1 > $R/prof-$1-$2-$3.log 2>&1; echo "prof $1 $2 $3 rc=$?"
  grep threads $R/prof-$1-$2-$3.log; save
}
nproc; lscpu | grep -E "Model name|Thread|MHz" | head -3
pass A1 $PWD/$D/libtlmrt.run.so cur $PWD/$D/libtlmrt.cur.so pool pg49
pass B1 $PWD/$D/libtlmrt.cur.so run $PWD/$D/libtlmrt.run.so pg49 pool
prof cur pool efficientnet-b0; prof run pool efficientnet-b0; prof cur pool mobilenetv2; prof run pool mobilenetv2
pass A2 $PWD/$D/libtlmrt.run.so cur $PWD/$D/libtlmrt.cur.so pg49 pool
pass B2 $PWD/$D/libtlmrt.cur.so run $PWD/$D/libtlmrt.run.so pool pg49
which gcc && timeout 90 python3 bench/pool_pause_in_run.py --lib cur=$PWD/$D/libtlmrt.cur.so --lib run1ms=$PWD/$D/libtlmrt.run.so \
  --threads 16 --runs 100 --rounds 2 --pauses 0 300 --gaps-ms 0 5 > $R/pause16.log 2>&1; echo pause rc=$?; tail -11 $R/pause16.log
save
