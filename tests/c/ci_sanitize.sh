#!/usr/bin/env bash
# The C runtime under sanitizers, for CI: bash tests/c/ci_sanitize.sh [FUZZ_SECONDS]
#
#   1. AddressSanitizer + UndefinedBehaviorSanitizer: tests/test_runtime_c.py with everything built
#      sanitized (TLMRT_SANITIZE): the fake artifact and its corrupted and inconsistent variants;
#      then examples/run_model.c over a real artifact (TLMRT_SAN_ARTIFACT=model.tar, or a tiny one
#      built here when tlmpack's compiler is installed) and over corrupted copies of it; then the CUDA
#      backend (tests/c/test_cuda.c) on the simulated driver over good and broken fake CUDA artifacts.
#   2. ThreadSanitizer: tests/c/test_threads.c, 8 threads x 1000 runs on one model, static and dynamic
#      pools (without its fork step: TSan does not support fork in a threaded process); and
#      tests/c/stress_model.c, 8 threads x 1000 runs on the real artifact of step 1 with outputs
#      bitwise identical to a reference run.
#   3. libFuzzer: each target in tests/c/fuzz/ for FUZZ_SECONDS (default 5) from its committed corpus.
#
# Installs nothing. A step whose compiler support is missing is skipped with a line that says so; the
# packages that give all of it on Debian/Ubuntu: clang (libFuzzer, ASan/UBSan/TSan in clang 14's
# runtime) and libclang-rt-dev where the runtime is packaged apart (newer releases), or gcc for 1 and 2.
# PYTHON overrides the interpreter (default: .venv/bin/python, else python3). Any sanitizer report or
# fuzzer crash fails the script (exit 1).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
FUZZ_SECONDS="${1:-5}"
PYTHON="${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/tlmrt-san.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=99"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="halt_on_error=1:exitcode=99"

say() { echo "ci_sanitize: $*"; }

# The first of clang, gcc that links a program with these sanitizer flags, or nothing.
compiler_for() {
  local flags="$1" cc
  echo 'int main(void) { return 0; }' > "$WORK/probe.c"
  for cc in clang gcc; do
    if command -v "$cc" > /dev/null && "$cc" $flags "$WORK/probe.c" -o "$WORK/probe" 2> /dev/null; then
      echo "$cc"
      return
    fi
  done
}

RUNTIME_SRCS=(runtime_c/*.c)
failed=0

# ---- 1. ASan + UBSan ----------------------------------------------------------------------------
SAN="address,undefined"
CC_SAN="$(compiler_for "-fsanitize=$SAN")"
if [ -z "$CC_SAN" ]; then
  say "SKIP ASan/UBSan: neither clang nor gcc links -fsanitize=$SAN here (apt-get install clang libclang-rt-dev)"
else
  say "ASan/UBSan with $CC_SAN: tests/test_runtime_c.py"
  if ! CC="$CC_SAN" TLMRT_SANITIZE="$SAN" "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_runtime_c.py; then
    failed=1
  fi
  SANF=(-fsanitize=$SAN -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1)
  "$CC_SAN" -std=c11 "${SANF[@]}" -fPIC -shared -fvisibility=hidden -o "$WORK/libtlmrt.so" "${RUNTIME_SRCS[@]}" \
    -lpthread -ldl
  "$CC_SAN" -std=c11 "${SANF[@]}" -Iruntime_c examples/run_model.c -o "$WORK/run_model" -L"$WORK" -ltlmrt \
    -Wl,-rpath,"$WORK"
  TAR="${TLMRT_SAN_ARTIFACT:-}"
  if [ -z "$TAR" ] && "$PYTHON" -c "import tvm" 2> /dev/null; then
    say "building a tiny real artifact (zoo mlp) for the ASan run"
    "$PYTHON" -c "from tlmpack import zoo; zoo.export_onnx('mlp', '$WORK/mlp.onnx')"
    "$PYTHON" -m tlmpack.cli build "$WORK/mlp.onnx" -o "$WORK/mlp.tar" > /dev/null 2>&1 && TAR="$WORK/mlp.tar"
  fi
  if [ -z "$TAR" ]; then
    say "SKIP ASan on a real artifact: set TLMRT_SAN_ARTIFACT=model.tar or install tlmpack[compiler]"
  else
    mkdir -p "$WORK/real" && tar -xf "$TAR" -C "$WORK/real"
    say "ASan/UBSan: examples/run_model.c over $(basename "$TAR") and corrupted copies"
    if ! "$WORK/run_model" -n 3 -t 2 "$WORK/real" > "$WORK/real.out" 2>&1; then
      cat "$WORK/real.out"
      failed=1
    fi
    # Each corruption must be refused with a message (exit 1), never a sanitizer report (exit 99).
    corrupt() {  # NAME COMMAND...: a fresh copy of the real artifact, damaged by COMMAND in it
      local name="$1"
      shift
      rm -rf "$WORK/bad" && cp -r "$WORK/real" "$WORK/bad"
      (cd "$WORK/bad" && eval "$*")
      local rc=0
      "$WORK/run_model" -n 1 -t 2 "$WORK/bad" > "$WORK/bad.out" 2>&1 || rc=$?
      if [ "$rc" -ne 1 ] || ! grep -q . "$WORK/bad.out"; then
        say "FAIL corrupted artifact ($name): exit $rc"
        cat "$WORK/bad.out"
        failed=1
      fi
    }
    corrupt "flipped weights byte" 'printf "\xff" | dd of=weights.bin bs=1 seek=100 conv=notrunc status=none'
    corrupt "truncated weights" 'truncate -s 100 weights.bin'
    corrupt "truncated model.so" 'truncate -s 4096 x86/model.so'
    corrupt "garbage SHA256SUMS" 'head -c 3000 /dev/urandom > SHA256SUMS'
    corrupt "SHA256SUMS escaping the artifact" 'echo "$(printf %064d 0)  ../../etc/passwd" >> SHA256SUMS'
    corrupt "empty SHA256SUMS line" 'printf "\n\n" >> SHA256SUMS'
    corrupt "no model.so" 'rm x86/model.so'
  fi
  # The CUDA backend on the simulated driver (tests/cuda/fake_libcuda.c): a good fake artifact, its
  # graph-less and faulting runs, and its broken variants, which must be refused (exit 3).
  say "ASan/UBSan: the CUDA backend on the simulated driver, good and broken cuda plans"
  "$CC_SAN" -std=c11 "${SANF[@]}" -Iruntime_c tests/c/test_cuda.c -o "$WORK/test_cuda" -L"$WORK" -ltlmrt \
    -Wl,-rpath,"$WORK" -ldl
  "$PYTHON" - "$WORK/cudaart" <<'EOF'
import sys
from pathlib import Path
sys.path.insert(0, "tests/fixtures_runtime")
import fabricate_cuda
out = Path(sys.argv[1])
fabricate_cuda.build_fake_libcuda(out / "driver")
fabricate_cuda.make_artifact(out / "good")
for i, d in enumerate(["-DFAKE_ABI_VERSION=2", "-DFAKE_BAD_ARG", "-DFAKE_BAD_IMAGE_PATH", "-DFAKE_BAD_OFFSET",
                       "-DFAKE_BIG_BLOCK", "-DFAKE_MISSING_KERNEL", "-DFAKE_MIN_DRIVER=-5"]):
    fabricate_cuda.make_artifact(out / f"bad{i}", d)
EOF
  cuda_case() {  # EXPECTED_EXIT DIR ARGS...
    local want="$1" dir="$2" rc=0
    shift 2
    LD_LIBRARY_PATH="$WORK/cudaart/driver" "$WORK/test_cuda" "$dir" "$@" > "$WORK/cuda.out" 2>&1 || rc=$?
    if [ "$rc" -ne "$want" ]; then
      say "FAIL CUDA backend $(basename "$dir") $*: exit $rc, expected $want"
      cat "$WORK/cuda.out"
      failed=1
    fi
  }
  cuda_case 0 "$WORK/cudaart/good"
  cuda_case 0 "$WORK/cudaart/good" --no-graph
  cuda_case 0 "$WORK/cudaart/good" --fault
  for bad in "$WORK"/cudaart/bad*; do cuda_case 3 "$bad"; done
  printf '\x01' | dd of="$WORK/cudaart/good/cuda/sm_90.cubin" bs=1 seek=100 conv=notrunc status=none
  cuda_case 3 "$WORK/cudaart/good"
fi

# ---- 2. TSan -------------------------------------------------------------------------------------
CC_TSAN="$(compiler_for "-fsanitize=thread")"
if [ -z "$CC_TSAN" ]; then
  say "SKIP TSan: neither clang nor gcc links -fsanitize=thread here"
else
  say "TSan with $CC_TSAN: one model, 8 threads x 1000 runs"
  TF=(-fsanitize=thread -g -O1)
  "$CC_TSAN" -std=c11 "${TF[@]}" -fPIC -shared -fvisibility=hidden -o "$WORK/tsan_libtlmrt.so" "${RUNTIME_SRCS[@]}" \
    -lpthread -ldl
  mkdir -p "$WORK/tsan" && cp "$WORK/tsan_libtlmrt.so" "$WORK/tsan/libtlmrt.so"
  "$CC_TSAN" -std=c11 "${TF[@]}" -Iruntime_c tests/c/test_threads.c -o "$WORK/test_threads" -L"$WORK/tsan" -ltlmrt \
    -Wl,-rpath,"$WORK/tsan" -lpthread
  "$PYTHON" - "$WORK/fake" <<'EOF'
import struct, sys
from pathlib import Path
out = Path(sys.argv[1])
(out / "x86").mkdir(parents=True, exist_ok=True)
data = bytearray(struct.pack("<1000f", *(i * 0.25 for i in range(1000))))
data += bytes(4032 - len(data)) + struct.pack("<f", 2.0)
(out / "weights.bin").write_bytes(bytes(data))
EOF
  SHA="$(sha256sum "$WORK/fake/weights.bin" | cut -c1-64)"
  for variant in static dynamic; do
    extra=()
    [ "$variant" = dynamic ] && extra=(-DFAKE_NO_BARRIER)
    "$CC_TSAN" -std=c11 "${TF[@]}" -fPIC -shared -Wl,-Bsymbolic -Iruntime_c "-DFAKE_WEIGHTS_SHA=\"$SHA\"" \
      "${extra[@]}" tests/c/fake_plan.c -o "$WORK/fake/x86/model.so"
    (cd "$WORK/fake" && sha256sum weights.bin x86/model.so > SHA256SUMS)
    if ! "$WORK/test_threads" "$WORK/fake" 2 8 1000 --no-fork > "$WORK/tsan.out" 2>&1 ||
      ! grep -q ALL_OK "$WORK/tsan.out"; then
      say "FAIL TSan ($variant pool)"
      cat "$WORK/tsan.out"
      failed=1
    fi
  done
  say "TSan: the dynamic pool's tickets, launches of 64, 1, 7 and 33 tasks on 8 threads for 2 s"
  "$CC_TSAN" -std=c11 "${TF[@]}" -fPIC -shared -Wl,-Bsymbolic -Iruntime_c tests/c/fake_kernels.c \
    -o "$WORK/tsan_fake_kernels.so"
  "$CC_TSAN" -std=c11 "${TF[@]}" -Iruntime_c tests/c/test_pool_tickets.c -o "$WORK/test_pool_tickets" \
    -L"$WORK/tsan" -ltlmrt -Wl,-rpath,"$WORK/tsan"
  if ! timeout 120 "$WORK/test_pool_tickets" "$WORK/tsan_fake_kernels.so" 8 2 > "$WORK/tickets.out" 2>&1 ||
    ! grep -q ALL_OK "$WORK/tickets.out"; then
    say "FAIL TSan (the dynamic pool's tickets; exit 124: a launch hung)"
    cat "$WORK/tickets.out"
    failed=1
  fi
  if [ -d "$WORK/real" ]; then
    say "TSan: the real artifact, 8 threads x 1000 runs, outputs bitwise identical"
    "$CC_TSAN" -std=c11 "${TF[@]}" -Iruntime_c tests/c/stress_model.c -o "$WORK/stress_model" -L"$WORK/tsan" -ltlmrt \
      -Wl,-rpath,"$WORK/tsan" -lpthread
    if ! "$WORK/stress_model" "$WORK/real" 2 8 1000 > "$WORK/stress.out" 2>&1; then
      say "FAIL TSan (real artifact)"
      cat "$WORK/stress.out"
      failed=1
    fi
  fi
fi

# ---- 3. libFuzzer --------------------------------------------------------------------------------
if ! command -v clang > /dev/null || ! clang -fsanitize=fuzzer,address,undefined -x c - -o "$WORK/fz" 2> /dev/null \
  <<< 'int LLVMFuzzerTestOneInput(const unsigned char* d, unsigned long n) { (void)d; (void)n; return 0; }'; then
  say "SKIP libFuzzer: needs clang with -fsanitize=fuzzer (apt-get install clang libclang-rt-dev)"
else
  for src in tests/c/fuzz/fuzz_*.c; do
    name="$(basename "$src" .c)"
    target="${name#fuzz_}"
    tested="runtime_c/tlmrt_sha256.c"
    case "$target" in
      plan) tested="runtime_c/tlmrt_cpu.c" ;;
      cuda_plan) tested="runtime_c/tlmrt_cuda.c" ;;
    esac
    others=()
    for f in "${RUNTIME_SRCS[@]}"; do [ "$f" != "$tested" ] && others+=("$f"); done
    clang -std=c11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -Iruntime_c "$src" \
      "${others[@]}" -ldl -lpthread -o "$WORK/$name"
    mkdir -p "$WORK/corpus_$target"
    cp tests/c/fuzz/corpus/"$target"/* "$WORK/corpus_$target/"
    say "libFuzzer $name for ${FUZZ_SECONDS}s"
    if ! (cd "$WORK" && "./$name" -max_total_time="$FUZZ_SECONDS" -max_len=4096 -print_final_stats=1 \
      "corpus_$target" > "$WORK/$name.log" 2>&1); then
      tail -40 "$WORK/$name.log"
      failed=1
    else
      grep -E "^stat::number_of_executed_units" "$WORK/$name.log" || true
    fi
  done
fi

if [ "$failed" -ne 0 ]; then
  say "FAILED"
  exit 1
fi
say "OK"
