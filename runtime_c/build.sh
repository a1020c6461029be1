#!/usr/bin/env bash
# Builds libtlmrt.so with one compiler line: bash runtime_c/build.sh OUT_DIR
# CC overrides the compiler; EXTRA_CFLAGS adds flags (e.g. -DTLMRT_CPU_RUN_SPIN_NS=0, a variant to
# measure against). The output is reproducible: no timestamps, no build id, and source
# paths are rewritten relative to the repository (-ffile-prefix-map).
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$1"
mkdir -p "$OUT"
cd "$ROOT"
export SOURCE_DATE_EPOCH=0
"${CC:-cc}" -std=c11 -O2 -fPIC -shared -Wall -Wextra -Werror -fvisibility=hidden ${EXTRA_CFLAGS:-} \
  -ffile-prefix-map="$ROOT"=. -Wl,--build-id=none -Wl,-soname,libtlmrt.so \
  -o "$OUT/libtlmrt.so" runtime_c/*.c \
  -lpthread -ldl
