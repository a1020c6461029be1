/*
 * test_tensor.h — the one-dimensional CPU tensor of 32-bit elements that the C test programs pass to
 * tlmrt_kernel_call (type code 0: int, 2: float), in one place.
 */
#ifndef TLMPACK_TESTS_C_TEST_TENSOR_H_
#define TLMPACK_TESTS_C_TEST_TENSOR_H_

#include <stdint.h>

#include "tlmrt.h"

static inline tlmrt_dltensor test_tensor_1d(void* data, int64_t* shape, uint8_t code) {
  tlmrt_dltensor t = {0};
  t.data = data;
  t.device.device_type = TLMRT_DEVICE_CPU;
  t.ndim = 1;
  t.dtype.code = code;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

#endif
