/*
 * fake_plan.c — a hand-written stand-in for x86/model.so (TVM kernels + generated plan), for the
 * C runtime's tests. Built by tests/test_runtime_c.py:
 *   cc -std=c11 -O2 -fPIC -shared -Iruntime_c -Wl,-Bsymbolic -DFAKE_WEIGHTS_SHA='"<hex>"'
 *      tests/c/fake_plan.c -o ARTIFACT/x86/model.so
 *
 * y = reverse((x + w) * scale), computed by two kernels in TVM's packed calling convention:
 *   step 0 fake_add(x, w, tmp):            tmp = x + w; fails when x[0] == FAKE_SENTINEL
 *   step 1 fake_scale(tmp, scale, y, hits): parallel through __TVMBackendParallelLaunch, a workspace
 *          from __TVMBackendAllocWorkspace and a __TVMBackendParallelBarrier between its two
 *          phases (phase 2 reads what other tasks wrote in phase 1). hits[t] counts how often task t
 *          ran, hits[63] is the num_task the tasks saw. Every task also makes a nested launch of 3
 *          tasks, which must run serially and completely.
 * Weights (weights.bin): w[i] = i * 0.25 for i < FAKE_N, then at offset FAKE_SCALE_OFFSET the float 2.
 *
 * Variants for the negative tests: -DFAKE_ABI_VERSION=2, -DFAKE_BAD_OFFSET (y beyond the arena),
 * -DFAKE_MISALIGNED (tmp at a non-multiple of 64), -DFAKE_BAD_ARG (a step argument out of range),
 * -DFAKE_UNSUPPORTED_HOOK (a TVM context hook the runtime does not provide). -DFAKE_NO_BARRIER has no
 * barrier hook (as most TVM kernels): fake_scale then makes two launches where it waited at a barrier,
 * and the runtime's pool shares tasks out dynamically.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "tlmrt_plan.h"

#define FAKE_N 1000
#define FAKE_HITS 64
#define FAKE_SENTINEL (-12345.0f)
#define FAKE_SCALE_OFFSET 4032 /* round_up(FAKE_N * 4, 64) */
#define FAKE_WEIGHTS_BYTES (FAKE_SCALE_OFFSET + 4)
#define OFF_X 0
#define OFF_TMP 4032
#define OFF_Y 8064
#define OFF_HITS 12096
#define ARENA_BYTES 12352 /* OFF_HITS + 256 */

#ifndef FAKE_ABI_VERSION
#define FAKE_ABI_VERSION TLMRT_PLAN_ABI_VERSION
#endif
#ifndef FAKE_WEIGHTS_SHA
#define FAKE_WEIGHTS_SHA "0000000000000000000000000000000000000000000000000000000000000000"
#endif

/* ---- what TVM's object file would contain ------------------------------------------------------ */

typedef struct {
  void* data;
  struct {
    int32_t device_type, device_id;
  } device;
  int32_t ndim;
  struct {
    uint8_t code, bits;
    uint16_t lanes;
  } dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} FakeDLTensor;

typedef struct {
  int32_t type_index;
  uint32_t zero_padding;
  union {
    int64_t v_int64;
    void* v_ptr;
  } v;
} FakeAny;

typedef struct {
  void* sync_handle;
  int32_t num_task;
} FakeParallelEnv;

/* Declared as TVM's LLVM codegen declares them: exported, NULL until the loader stores into them. */
int (*__TVMBackendParallelLaunch)(int (*)(int, FakeParallelEnv*, void*), void*, int) = NULL;
#ifndef FAKE_NO_BARRIER
int (*__TVMBackendParallelBarrier)(int, FakeParallelEnv*) = NULL;
#endif
void* (*__TVMBackendAllocWorkspace)(int, int, uint64_t, int, int) = NULL;
int (*__TVMBackendFreeWorkspace)(int, int, void*) = NULL;
#ifdef FAKE_UNSUPPORTED_HOOK
void* __TVMFFIFunctionCall = NULL;
#endif

void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t n);

static int raise(const char* msg) {
  const char* parts[2] = {msg, " (from the fake kernel)"};
  TVMFFIErrorSetRaisedFromCStrParts("ValueError", parts, 2);
  return -1;
}

/* Checks an argument the way TVM's generated prologue does. */
static float* tensor_arg(const FakeAny* args, int i, int64_t n, uint8_t code, uint8_t bits) {
  if (args[i].type_index != 7 || args[i].zero_padding != 0) return NULL;
  FakeDLTensor* t = (FakeDLTensor*)args[i].v.v_ptr;
  if (t == NULL || t->ndim != 1 || t->shape == NULL || t->shape[0] != n || t->strides != NULL ||
      t->byte_offset != 0 || t->device.device_type != 1 || t->dtype.code != code ||
      t->dtype.bits != bits || t->dtype.lanes != 1 || ((uintptr_t)t->data % 64) != 0) {
    return NULL;
  }
  return (float*)t->data;
}

int32_t fake_add(void* self, const void* packed_args, int32_t num_args, void* result) {
  const FakeAny* args = (const FakeAny*)packed_args;
  (void)self;
  (void)result;
  if (num_args != 3) return raise("fake_add: expected 3 arguments");
  float* x = tensor_arg(args, 0, FAKE_N, 2, 32);
  float* w = tensor_arg(args, 1, FAKE_N, 2, 32);
  float* tmp = tensor_arg(args, 2, FAKE_N, 2, 32);
  if (x == NULL || w == NULL || tmp == NULL) return raise("fake_add: argument check failed");
  if (x[0] == FAKE_SENTINEL) return raise("fake_add: sentinel input");
  for (int i = 0; i < FAKE_N; ++i) tmp[i] = x[i] + w[i];
  return 0;
}

typedef struct {
  const float* tmp;
  float scale;
  float* ws;
  float* y;
  int32_t* hits;
} ScaleClosure;

static int count_nested(int task_id, FakeParallelEnv* penv, void* cdata) {
  if (penv->num_task != 3 || task_id < 0 || task_id >= 3) return 1;
  *(int*)cdata += 1 << (4 * task_id);
  return 0;
}

static int scale_lambda(int task_id, FakeParallelEnv* penv, void* cdata) {
  ScaleClosure* c = (ScaleClosure*)cdata;
  int n = penv->num_task;
  if (n < 1 || task_id < 0 || task_id >= n || task_id >= FAKE_HITS - 1) return 1;
  c->hits[task_id] += 1;
  if (task_id == 0) c->hits[FAKE_HITS - 1] = n;
  int nested = 0;
  if (__TVMBackendParallelLaunch(count_nested, &nested, 3) != 0 || nested != 0x111) return 1;
  int chunk = (FAKE_N + n - 1) / n;
  int begin = task_id * chunk;
  int end = begin + chunk < FAKE_N ? begin + chunk : FAKE_N;
  for (int i = begin; i < end; ++i) c->ws[i] = c->tmp[i] * c->scale;
#ifdef FAKE_NO_BARRIER
  return 0;
}

static int reverse_lambda(int task_id, FakeParallelEnv* penv, void* cdata) {
  ScaleClosure* c = (ScaleClosure*)cdata;
  int n = penv->num_task;
  if (n < 1 || task_id < 0 || task_id >= n) return 1;
  int chunk = (FAKE_N + n - 1) / n;
  int begin = task_id * chunk;
  int end = begin + chunk < FAKE_N ? begin + chunk : FAKE_N;
#else
  if (__TVMBackendParallelBarrier(task_id, penv) != 0) return 1;
#endif
  for (int i = begin; i < end; ++i) c->y[i] = c->ws[FAKE_N - 1 - i];
  return 0;
}

int32_t fake_scale(void* self, const void* packed_args, int32_t num_args, void* result) {
  const FakeAny* args = (const FakeAny*)packed_args;
  (void)self;
  (void)result;
  if (num_args != 4) return raise("fake_scale: expected 4 arguments");
  float* tmp = tensor_arg(args, 0, FAKE_N, 2, 32);
  float* scale = tensor_arg(args, 1, 1, 2, 32);
  float* y = tensor_arg(args, 2, FAKE_N, 2, 32);
  int32_t* hits = (int32_t*)tensor_arg(args, 3, FAKE_HITS, 0, 32);
  if (tmp == NULL || scale == NULL || y == NULL || hits == NULL) {
    return raise("fake_scale: argument check failed");
  }
#ifdef FAKE_NO_BARRIER
  if (__TVMBackendParallelLaunch == NULL || __TVMBackendAllocWorkspace == NULL || __TVMBackendFreeWorkspace == NULL) {
#else
  if (__TVMBackendParallelLaunch == NULL || __TVMBackendParallelBarrier == NULL ||
      __TVMBackendAllocWorkspace == NULL || __TVMBackendFreeWorkspace == NULL) {
#endif
    return raise("fake_scale: the loader did not fill the hooks");
  }
  float* ws = (float*)__TVMBackendAllocWorkspace(1, 0, FAKE_N * sizeof(float), 2, 32);
  if (ws == NULL || ((uintptr_t)ws % 64) != 0) return raise("fake_scale: bad workspace");
  memset(hits, 0, FAKE_HITS * sizeof(int32_t));
  ScaleClosure c = {tmp, scale[0], ws, y, hits};
  int rc = __TVMBackendParallelLaunch(scale_lambda, &c, 0);
#ifdef FAKE_NO_BARRIER
  if (rc == 0) rc = __TVMBackendParallelLaunch(reverse_lambda, &c, 0);
#endif
  if (__TVMBackendFreeWorkspace(1, 0, ws) != 0) return raise("fake_scale: free workspace failed");
  return rc == 0 ? 0 : raise("fake_scale: a parallel task failed");
}

/* ---- what the generated plan.c would contain --------------------------------------------------- */

static _Thread_local char kernel_error[512];

void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t n) {
  size_t used = (size_t)snprintf(kernel_error, sizeof(kernel_error), "%s: ", kind);
  for (int32_t i = 0; i < n && used < sizeof(kernel_error); ++i) {
    used += (size_t)snprintf(kernel_error + used, sizeof(kernel_error) - used, "%s", parts[i]);
  }
}

const char* tlmrt_plan_kernel_error(void) { return kernel_error; }

static const int64_t shape_n[1] = {FAKE_N};
static const int64_t shape_1[1] = {1};
static const int64_t shape_hits[1] = {FAKE_HITS};

#ifdef FAKE_BAD_OFFSET
#define Y_OFFSET ARENA_BYTES
#else
#define Y_OFFSET OFF_Y
#endif
#ifdef FAKE_MISALIGNED
#define TMP_OFFSET 4000
#else
#define TMP_OFFSET OFF_TMP
#endif

static const tlmrt_plan_tensor tensors[] = {
    {TLMRT_STORAGE_ARENA, 2, 32, 1, OFF_X, FAKE_N * 4, 1, shape_n},                /* 0 x */
    {TLMRT_STORAGE_WEIGHTS, 2, 32, 1, 0, FAKE_N * 4, 1, shape_n},                  /* 1 w */
    {TLMRT_STORAGE_ARENA, 2, 32, 1, TMP_OFFSET, FAKE_N * 4, 1, shape_n},           /* 2 tmp */
    {TLMRT_STORAGE_ARENA, 2, 32, 1, Y_OFFSET, FAKE_N * 4, 1, shape_n},             /* 3 y */
    {TLMRT_STORAGE_ARENA, 0, 32, 1, OFF_HITS, FAKE_HITS * 4, 1, shape_hits},       /* 4 hits */
    {TLMRT_STORAGE_WEIGHTS, 2, 32, 1, FAKE_SCALE_OFFSET, 4, 1, shape_1},           /* 5 scale */
};

static const int32_t add_args[] = {0, 1, 2};
#ifdef FAKE_BAD_ARG
static const int32_t scale_args[] = {2, 5, 3, 99};
#else
static const int32_t scale_args[] = {2, 5, 3, 4};
#endif

static const tlmrt_plan_step steps[] = {
    {"fake_add", fake_add, 3, add_args},
    {"fake_scale", fake_scale, 4, scale_args},
};

static const tlmrt_plan_io inputs[] = {{"x", 0}};
static const tlmrt_plan_io outputs[] = {{"y", 3}, {"hits", 4}};

static const tlmrt_plan plan = {
    FAKE_ABI_VERSION, "fake", ARENA_BYTES, FAKE_WEIGHTS_BYTES, FAKE_WEIGHTS_SHA,
    6, tensors, 1, inputs, 2, outputs, 2, steps,
};

const tlmrt_plan* tlmrt_plan_v1(void) { return &plan; }
