/*
 * fake_cuda_plan.c — a hand-written cuda/plan.so, following runtime_c/tlmrt_plan.h exactly the way
 * the generated CUDA plan does, over the kernels of fake_kernels.cu (a cubin for sm_90 and PTX).
 * The same model as tests/fixtures_runtime/fake_plan.c, so one artifact can carry both targets:
 *
 *   inputs:  x float32 [2, 3], k int32 [1]
 *   weights: w float32 [2, 3] = weights.bin[0:24]
 *   outputs: y = x + w   (launch add_w)
 *            z = y * k   (launch scale_k, 1 + FAKE_EXTRA_LAUNCHES times: idempotent, for timing graphs)
 *
 * Build: gcc -std=c11 -O2 -shared -fPIC -I runtime_c -DFAKE_WEIGHTS_SHA256='"<hex>"' fake_cuda_plan.c
 * Variants for the refusal tests: -DFAKE_ABI_VERSION=2, -DFAKE_BAD_ARG (a tensor index out of range),
 * -DFAKE_BAD_IMAGE_PATH (an image named "../kernels.ptx"), -DFAKE_NO_PTX, -DFAKE_MIN_DRIVER=13010,
 * -DFAKE_BIG_BLOCK (2048 threads per block), -DFAKE_MISSING_KERNEL, -DFAKE_BAD_OFFSET; and -DFAKE_PTX_ONLY
 * (no cubin: the driver JITs the PTX).
 */
#include <stdint.h>

#include "tlmrt_plan.h"

#ifndef FAKE_WEIGHTS_SHA256
#error "define FAKE_WEIGHTS_SHA256 as the quoted hex sha256 of weights.bin"
#endif
#ifndef FAKE_ABI_VERSION
#define FAKE_ABI_VERSION TLMRT_PLAN_ABI_VERSION
#endif
#ifndef FAKE_MIN_DRIVER
#define FAKE_MIN_DRIVER 13000
#endif
#ifndef FAKE_EXTRA_LAUNCHES
#define FAKE_EXTRA_LAUNCHES 0
#endif

#define EXPORT __attribute__((visibility("default")))

static const int64_t kShape23[2] = {2, 3};
static const int64_t kShape1[1] = {1};

static const tlmrt_plan_tensor kTensors[] = {
    /* 0 x */ {TLMRT_STORAGE_ARENA, 2, 32, 1, 0, 24, 2, kShape23},
    /* 1 k */ {TLMRT_STORAGE_ARENA, 0, 32, 1, 64, 4, 1, kShape1},
    /* 2 w */ {TLMRT_STORAGE_WEIGHTS, 2, 32, 1, 0, 24, 2, kShape23},
#ifdef FAKE_BAD_OFFSET
    /* 3 y */ {TLMRT_STORAGE_ARENA, 2, 32, 1, 256, 24, 2, kShape23},
#else
    /* 3 y */ {TLMRT_STORAGE_ARENA, 2, 32, 1, 128, 24, 2, kShape23},
#endif
    /* 4 z */ {TLMRT_STORAGE_ARENA, 2, 32, 1, 192, 24, 2, kShape23},
};

static const tlmrt_cuda_arg kAddArgs[] = {
    {TLMRT_CUDA_ARG_TENSOR, 0, 0},
    {TLMRT_CUDA_ARG_TENSOR, 2, 0},
    {TLMRT_CUDA_ARG_TENSOR, 3, 0},
    {TLMRT_CUDA_ARG_INT32, 0, 6},
};
static const tlmrt_cuda_arg kScaleArgs[] = {
    {TLMRT_CUDA_ARG_TENSOR, 3, 0},
#ifdef FAKE_BAD_ARG
    {TLMRT_CUDA_ARG_TENSOR, 99, 0},
#else
    {TLMRT_CUDA_ARG_TENSOR, 1, 0},
#endif
    {TLMRT_CUDA_ARG_TENSOR, 4, 0},
    {TLMRT_CUDA_ARG_INT64, 0, 6},
};

#ifdef FAKE_BIG_BLOCK
#define ADD_BLOCK 2048
#else
#define ADD_BLOCK 32
#endif
#ifdef FAKE_MISSING_KERNEL
#define SCALE_NAME "scale_k_missing"
#else
#define SCALE_NAME "scale_k"
#endif

static tlmrt_cuda_launch kLaunches[2 + FAKE_EXTRA_LAUNCHES] = {
    {"add_w", "fused_add", {1, 1, 1}, {ADD_BLOCK, 1, 1}, 0, 4, kAddArgs},
    {SCALE_NAME, "fused_mul", {1, 1, 1}, {32, 1, 1}, 0, 4, kScaleArgs},
};

static const tlmrt_cuda_image kImages[] = {
#ifndef FAKE_PTX_ONLY
    {"cuda/sm_90.cubin", TLMRT_CUDA_IMAGE_CUBIN, 90},
#endif
#if defined(FAKE_BAD_IMAGE_PATH)
    {"../kernels.ptx", TLMRT_CUDA_IMAGE_PTX, 90},
#elif !defined(FAKE_NO_PTX)
    {"cuda/kernels.ptx", TLMRT_CUDA_IMAGE_PTX, 90},
#endif
};

static const tlmrt_plan_io kInputs[] = {{"x", 0}, {"k", 1}};
static const tlmrt_plan_io kOutputs[] = {{"y", 3}, {"z", 4}};

static const tlmrt_cuda_plan kPlan = {
    FAKE_ABI_VERSION,
    "fake_add_scale",
    256, /* arena_bytes */
    64,  /* weights_bytes: 24 bytes of w, padded to 64 */
    FAKE_WEIGHTS_SHA256,
    FAKE_MIN_DRIVER,
    5, kTensors,
    2, kInputs,
    2, kOutputs,
    2 + FAKE_EXTRA_LAUNCHES, kLaunches,
    (int32_t)(sizeof(kImages) / sizeof(kImages[0])), kImages,
};

EXPORT const tlmrt_cuda_plan* tlmrt_cuda_plan_v1(void) {
  for (int i = 2; i < 2 + FAKE_EXTRA_LAUNCHES; ++i) kLaunches[i] = kLaunches[1];
  return &kPlan;
}
