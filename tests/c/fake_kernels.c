/*
 * fake_kernels.c — a kernel library as tlmrt_kernel_library_open expects one, without TVM: tvm-ffi
 * packed functions exported as __tvm_ffi_<name>, TVM's hook variables for the runtime to fill, and
 * (as a model.so's plan does) its own TVMFFIErrorSetRaisedFromCStrParts and tlmrt_plan_kernel_error.
 *
 *   scale2(x float32[n], y float32[n], tasks int32[1]): y = 2 x, one parallel task per pool thread;
 *   tasks[0] = the number of tasks the launch hook ran (1 without a pool).
 *   ticket_stress(hits int32[64], bad int32[1], launches int32[1]): `launches` parallel launches whose
 *   task counts cycle through 64, 1, 7 and 33; each task counts itself in hits; bad[0] counts the
 *   launches after which a task had not run exactly once (the pool's ticket protocol broken).
 *
 * Build: cc -std=c11 -O2 -shared -fPIC -Wl,-Bsymbolic -I runtime_c fake_kernels.c -o fake_kernels.so
 */
#include <stdint.h>
#include <stdio.h>

#include "tlmrt.h"
#include "tlmrt_plan.h"

#define EXPORT __attribute__((visibility("default")))

typedef struct {
  int32_t type_index;
  uint32_t zero_padding;
  union {
    int64_t v_int64;
    void* v_ptr;
  } v;
} TVMFFIAny;

EXPORT tlmrt_parallel_launch_fn __TVMBackendParallelLaunch = NULL;

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

typedef struct {
  const float* x;
  float* y;
  int64_t n;
  int32_t num_task;
} scale_ctx;

static int scale_task(int task_id, tlmrt_parallel_env* penv, void* cdata) {
  scale_ctx* c = (scale_ctx*)cdata;
  int n = penv->num_task > 0 ? penv->num_task : 1;
  if (task_id == 0) c->num_task = n;
  for (int64_t i = task_id; i < c->n; i += n) c->y[i] = 2.0f * c->x[i];
  return 0;
}

EXPORT int32_t __tvm_ffi_scale2(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {
  (void)self;
  (void)result;
  if (num_args != 3) return fail("scale2 expects 3 arguments");
  const tlmrt_dltensor* t[3];
  for (int i = 0; i < 3; ++i) {
    if (args[i].type_index != 7) return fail("scale2 expects tensors");
    t[i] = (const tlmrt_dltensor*)args[i].v.v_ptr;
  }
  if (t[0]->ndim != 1 || t[1]->ndim != 1 || t[1]->shape[0] != t[0]->shape[0]) return fail("scale2: shape mismatch");
  scale_ctx c = {(const float*)t[0]->data, (float*)t[1]->data, t[0]->shape[0], 0};
  if (__TVMBackendParallelLaunch == NULL) return fail("scale2: no launch hook");
  if (__TVMBackendParallelLaunch(scale_task, &c, 0) != 0) return -1;
  *(int32_t*)t[2]->data = c.num_task;
  return 0;
}

typedef struct {
  int32_t* hits;
} hit_ctx;

static int hit_task(int task_id, tlmrt_parallel_env* penv, void* cdata) {
  (void)penv;
  __atomic_fetch_add(&((hit_ctx*)cdata)->hits[task_id], 1, __ATOMIC_RELAXED);
  return 0;
}

EXPORT int32_t __tvm_ffi_ticket_stress(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {
  (void)self;
  (void)result;
  static const int kCounts[4] = {64, 1, 7, 33};
  if (num_args != 3) return fail("ticket_stress expects 3 arguments");
  int32_t* data[3];
  for (int i = 0; i < 3; ++i) {
    if (args[i].type_index != 7) return fail("ticket_stress expects tensors");
    data[i] = (int32_t*)((const tlmrt_dltensor*)args[i].v.v_ptr)->data;
  }
  if (__TVMBackendParallelLaunch == NULL) return fail("ticket_stress: no launch hook");
  int32_t* hits = data[0];
  for (int32_t r = 0; r < data[2][0]; ++r) {
    int n = kCounts[r % 4];
    for (int i = 0; i < 64; ++i) __atomic_store_n(&hits[i], 0, __ATOMIC_RELAXED);
    hit_ctx c = {hits};
    if (__TVMBackendParallelLaunch(hit_task, &c, n) != 0) return fail("ticket_stress: a launch failed");
    for (int i = 0; i < 64; ++i) {
      if (__atomic_load_n(&hits[i], __ATOMIC_RELAXED) != (i < n ? 1 : 0)) {
        ++data[1][0];
        break;
      }
    }
  }
  return 0;
}
