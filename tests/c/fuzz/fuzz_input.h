/*
 * fuzz_input.h — reads fuzzer bytes as numbers (little-endian, zeros past the end), for the libFuzzer
 * targets here. Header-only; each target includes it once.
 */
#ifndef TLMRT_FUZZ_INPUT_H_
#define TLMRT_FUZZ_INPUT_H_

#include <stddef.h>
#include <stdint.h>

typedef struct {
  const uint8_t* p;
  size_t n;
} fuzz_input;

static uint64_t fuzz_take(fuzz_input* in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    uint64_t b = 0;
    if (in->n > 0) {
      b = *in->p++;
      in->n--;
    }
    v |= b << (8 * i);
  }
  return v;
}

/* A count in [lo, hi] mostly, and now and then a raw 32-bit value (negative, huge). */
static int32_t fuzz_count(fuzz_input* in, int32_t lo, int32_t hi) {
  uint8_t sel = (uint8_t)fuzz_take(in, 1);
  if (sel == 0xff) return (int32_t)(uint32_t)fuzz_take(in, 4);
  return lo + (int32_t)(sel % (uint32_t)(hi - lo + 1));
}

#endif
