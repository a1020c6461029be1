/*
 * fake_plan.c — a hand-written stand-in for a generated x86/model.so, for the Python runtime tests.
 *
 * It follows runtime_c/tlmrt_plan.h exactly, the way a TVM-built plan does: kernels use the packed
 * tvm-ffi signature with DLTensor* arguments, reach the thread pool and workspace through the
 * global hook pointers the loader fills, and report failures through
 * TVMFFIErrorSetRaisedFromCStrParts.
 *
 *   inputs:  x float32 [2, 3], k int32 [1]
 *   weights: w float32 [2, 3] = weights.bin[0:24]
 *   outputs: y = x + w            (kernel "add_w", parallel over rows)
 *            z = y * k            (kernel "scale", uses a workspace buffer; fails when k == -1;
 *                                  FAKE_RELAUNCH_AFTER_US: see relaunch_after_a_pause)
 *
 * Build: gcc -std=c11 -O2 -shared -fPIC -I runtime_c -DFAKE_WEIGHTS_SHA256='"<hex>"' fake_plan.c
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tlmrt_plan.h"

#ifndef FAKE_WEIGHTS_SHA256
#error "define FAKE_WEIGHTS_SHA256 as the quoted hex sha256 of weights.bin"
#endif
#ifndef FAKE_WEIGHTS_BYTES
#define FAKE_WEIGHTS_BYTES 64 /* 24 bytes of w, padded to 64; bench/load_memory.py makes them bigger */
#endif

#define EXPORT __attribute__((visibility("default")))

/* ---- tvm-ffi / DLPack values, declared ABI-compatibly ---- */
typedef struct {
  void* data;
  struct { int32_t device_type; int32_t device_id; } device;
  int32_t ndim;
  struct { uint8_t code; uint8_t bits; uint16_t lanes; } dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} DLTensor;

typedef struct {
  int32_t type_index;
  uint32_t zero_padding;
  union { int64_t v_int64; double v_float64; void* v_ptr; } v;
} TVMFFIAny;

enum { kDLTensorPtr = 7 };

/* ---- the hooks, as TVM's LLVM codegen declares them: global pointers the loader fills ---- */
EXPORT tlmrt_parallel_launch_fn __TVMBackendParallelLaunch = 0;
EXPORT tlmrt_alloc_workspace_fn __TVMBackendAllocWorkspace = 0;
EXPORT tlmrt_free_workspace_fn __TVMBackendFreeWorkspace = 0;

/* ---- kernel errors ---- */
static _Thread_local char g_error[512];

EXPORT void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t n) {
  size_t len = (size_t)snprintf(g_error, sizeof g_error, "%s: ", kind ? kind : "Error");
  for (int32_t i = 0; i < n && len < sizeof g_error; ++i) {
    len += (size_t)snprintf(g_error + len, sizeof g_error - len, "%s", parts[i] ? parts[i] : "");
  }
}

EXPORT const char* tlmrt_plan_kernel_error(void) { return g_error; }

static int32_t fail(const char* msg) {
  const char* parts[1] = {msg};
  TVMFFIErrorSetRaisedFromCStrParts("ValueError", parts, 1);
  return -1;
}

static DLTensor* tensor_arg(const TVMFFIAny* args, int32_t i, int ndim, const int64_t* shape,
                            uint8_t code) {
  if (args[i].type_index != kDLTensorPtr) return NULL;
  DLTensor* t = (DLTensor*)args[i].v.v_ptr;
  if (!t || t->ndim != ndim || t->dtype.code != code || t->dtype.bits != 32 || t->dtype.lanes != 1) return NULL;
  for (int d = 0; d < ndim; ++d)
    if (t->shape[d] != shape[d]) return NULL;
  return t;
}

static const int64_t kShape23[2] = {2, 3};
static const int64_t kShape1[1] = {1};

/* ---- add_w: y = x + w, one row per parallel task ---- */
typedef struct { const float* x; const float* w; float* y; } add_ctx;

/* With FAKE_NUM_TASK_FILE set, add_w writes the task count its launch got there (the pool's split). */
static void report_num_task(int n) {
  const char* path = getenv("FAKE_NUM_TASK_FILE");
  FILE* f = path != NULL ? fopen(path, "w") : NULL;
  if (f == NULL) return;
  fprintf(f, "%d", n);
  fclose(f);
}

/* With FAKE_INPUT_ADDRESS_FILE set, add_w writes the address its x argument's bytes were read at. */
static void report_input_address(const void* x) {
  const char* path = getenv("FAKE_INPUT_ADDRESS_FILE");
  FILE* f = path != NULL ? fopen(path, "w") : NULL;
  if (f == NULL) return;
  fprintf(f, "%llu", (unsigned long long)(uintptr_t)x);
  fclose(f);
}

static int add_rows(int task_id, tlmrt_parallel_env* penv, void* cdata) {
  add_ctx* c = (add_ctx*)cdata;
  int n = penv->num_task > 0 ? penv->num_task : 1;
  if (task_id == 0) report_num_task(n);
  for (int r = task_id; r < 2; r += n)
    for (int j = 0; j < 3; ++j) c->y[r * 3 + j] = c->x[r * 3 + j] + c->w[r * 3 + j];
  return 0;
}

EXPORT int32_t __tvm_ffi_add_w(void* self, const TVMFFIAny* args, int32_t n, TVMFFIAny* ret) {
  (void)self; (void)ret;
  if (n != 3) return fail("add_w: expected 3 arguments");
  DLTensor* x = tensor_arg(args, 0, 2, kShape23, 2);
  DLTensor* w = tensor_arg(args, 1, 2, kShape23, 2);
  DLTensor* y = tensor_arg(args, 2, 2, kShape23, 2);
  if (!x || !w || !y) return fail("add_w: argument type, dtype or shape mismatch");
  if (!__TVMBackendParallelLaunch) return fail("add_w: the parallel-launch hook was not filled");
  report_input_address((char*)x->data + x->byte_offset);
  add_ctx c = {(const float*)((char*)x->data + x->byte_offset), (const float*)((char*)w->data + w->byte_offset),
               (float*)((char*)y->data + y->byte_offset)};
  return __TVMBackendParallelLaunch(add_rows, &c, 0) == 0 ? 0 : fail("add_w: a parallel task failed");
}

/* With FAKE_RELAUNCH_AFTER_US=N set, scale works alone on the calling thread for N microseconds and then
 * launches an empty parallel loop: the pool's workers sit idle for N us inside a run. */
static int no_task(int task_id, tlmrt_parallel_env* penv, void* cdata) {
  (void)task_id; (void)penv; (void)cdata;
  return 0;
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int32_t relaunch_after_a_pause(void) {
  const char* env = getenv("FAKE_RELAUNCH_AFTER_US");
  if (env == NULL) return 0;
  double until = now_us() + atof(env);
  while (now_us() < until) {
  }
  return __TVMBackendParallelLaunch(no_task, NULL, 0) == 0 ? 0 : fail("scale: the empty launch failed");
}

/* ---- scale: z = y * k, through a workspace buffer ---- */
EXPORT int32_t __tvm_ffi_scale(void* self, const TVMFFIAny* args, int32_t n, TVMFFIAny* ret) {
  (void)self; (void)ret;
  if (n != 3) return fail("scale: expected 3 arguments");
  DLTensor* y = tensor_arg(args, 0, 2, kShape23, 2);
  DLTensor* k = tensor_arg(args, 1, 1, kShape1, 0);
  DLTensor* z = tensor_arg(args, 2, 2, kShape23, 2);
  if (!y || !k || !z) return fail("scale: argument type, dtype or shape mismatch");
  int32_t kv = *(const int32_t*)((char*)k->data + k->byte_offset);
  if (kv == -1) return fail("scale: k == -1 is the fake plan's way to fail");
  if (!__TVMBackendAllocWorkspace || !__TVMBackendFreeWorkspace) return fail("scale: workspace hooks not filled");
  float* tmp = (float*)__TVMBackendAllocWorkspace(1, 0, 6 * sizeof(float), 2, 32);
  if (!tmp) return fail("scale: workspace allocation failed");
  const float* yd = (const float*)((char*)y->data + y->byte_offset);
  for (int i = 0; i < 6; ++i) tmp[i] = yd[i] * (float)kv;
  memcpy((char*)z->data + z->byte_offset, tmp, 6 * sizeof(float));
  if (__TVMBackendFreeWorkspace(1, 0, tmp) != 0) return fail("scale: workspace free failed");
  return relaunch_after_a_pause();
}

/* ---- the plan ---- */
static const tlmrt_plan_tensor kTensors[] = {
    /* 0 x */ {TLMRT_STORAGE_ARENA, 2, 32, 1, 0, 24, 2, kShape23},
    /* 1 k */ {TLMRT_STORAGE_ARENA, 0, 32, 1, 64, 4, 1, kShape1},
    /* 2 w */ {TLMRT_STORAGE_WEIGHTS, 2, 32, 1, 0, 24, 2, kShape23},
    /* 3 y */ {TLMRT_STORAGE_ARENA, 2, 32, 1, 128, 24, 2, kShape23},
    /* 4 z */ {TLMRT_STORAGE_ARENA, 2, 32, 1, 192, 24, 2, kShape23},
    /* 5 y as a view: the bytes of y under another tensor, as a reshape's output is */
    {TLMRT_STORAGE_ARENA, 2, 32, 1, 128, 24, 2, kShape23},
    /* 6 x as a view (what add_w reads under -DFAKE_INPUT_VIEWS) */
    {TLMRT_STORAGE_ARENA, 2, 32, 1, 0, 24, 2, kShape23},
};
#ifdef FAKE_INPUT_VIEWS
/* -DFAKE_INPUT_VIEWS: the plan names every tensor's base (tlmrt_plan.h's optional tensor bases), and
 * add_w reads x through its view, tensor 6: the runtime reads an aligned x in the caller's buffer. */
static const int32_t kAddArgs[] = {6, 2, 3};
#else
static const int32_t kAddArgs[] = {0, 2, 3};
#endif
#ifdef FAKE_VIEW_OUTPUT
/* -DFAKE_VIEW_OUTPUT: output y is the view (tensor 5), which scale reads; add_w writes tensor 3. The
 * runtime must not compute y in the caller's buffer: add_w would still write the arena. */
static const int32_t kScaleArgs[] = {5, 1, 4};
#define FAKE_Y 5
#else
static const int32_t kScaleArgs[] = {3, 1, 4};
#define FAKE_Y 3
#endif
static const tlmrt_plan_step kSteps[] = {
    {"add_w", (tlmrt_packed_fn)__tvm_ffi_add_w, 3, kAddArgs},
    {"scale", (tlmrt_packed_fn)__tvm_ffi_scale, 3, kScaleArgs},
};
static const tlmrt_plan_io kInputs[] = {{"x", 0}, {"k", 1}};
static const tlmrt_plan_io kOutputs[] = {{"y", FAKE_Y}, {"z", 4}};

static const tlmrt_plan kPlan = {
    TLMRT_PLAN_ABI_VERSION,
    "fake_add_scale",
    256,                 /* arena_bytes */
    FAKE_WEIGHTS_BYTES,  /* weights_bytes */
    FAKE_WEIGHTS_SHA256,
    7, kTensors,
    2, kInputs,
    2, kOutputs,
    2, kSteps,
};

EXPORT const tlmrt_plan* tlmrt_plan_v1(void) { return &kPlan; }

#ifdef FAKE_STEP_WORK
/* -DFAKE_STEP_WORK=N: add_w claims N million operations of work (tlmrt_plan.h's optional step work). */
static const uint32_t kStepWork[2] = {FAKE_STEP_WORK, 0};
EXPORT const uint32_t* tlmrt_plan_v1_step_work(void) { return kStepWork; }
#endif

#ifdef FAKE_INPUT_VIEWS
#ifndef FAKE_VIEW_BASE
#define FAKE_VIEW_BASE 0 /* -DFAKE_VIEW_BASE=N: a damaged table, the view's base is N */
#endif
static const int32_t kTensorBases[7] = {0, 1, 2, 3, 4, 3, FAKE_VIEW_BASE};
EXPORT const int32_t* tlmrt_plan_v1_tensor_bases(void) { return kTensorBases; }
#endif
