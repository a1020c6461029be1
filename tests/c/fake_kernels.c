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
 *   share_order(who int32[16], bad int32[1], launches int32[3]): launches[0] launches of 16 tasks of
 *   a few microseconds each on a pool of two threads; who[i] says whether the calling thread (1) or the
 *   worker (2) ran task i. bad[0] counts the launches where a thread's own share (the caller's tasks
 *   0..7, the worker's 8..15) was not a run of its own from the front and the other's from the back;
 *   launches[1] counts those where the worker ran any task, launches[2] those where it ran some of its own.
 *
 * Build: cc -std=c11 -O2 -shared -fPIC -Wl,-Bsymbolic -I runtime_c fake_kernels.c -o fake_kernels.so
 */
#define _GNU_SOURCE
#include <pthread.h>
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

/* The three int32 tensors of a pool test kernel into `data`, and a launch hook to run them on;
 * else the kernel's error (-1). */
static int three_int_tensors_and_a_pool(const char* kernel, const TVMFFIAny* args, int32_t num_args, int32_t** data) {
  static char msg[128];
  if (num_args != 3) {
    snprintf(msg, sizeof(msg), "%s expects 3 arguments, got %d", kernel, (int)num_args);
    return fail(msg);
  }
  for (int i = 0; i < 3; ++i) {
    if (args[i].type_index != 7) {
      snprintf(msg, sizeof(msg), "%s expects tensors; argument %d has type index %d", kernel, i, (int)args[i].type_index);
      return fail(msg);
    }
    data[i] = (int32_t*)((const tlmrt_dltensor*)args[i].v.v_ptr)->data;
  }
  if (__TVMBackendParallelLaunch != NULL) return 0;
  snprintf(msg, sizeof(msg), "%s: no launch hook", kernel);
  return fail(msg);
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
  int32_t* data[3];
  if (three_int_tensors_and_a_pool("ticket_stress", args, num_args, data) != 0) return -1;
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

typedef struct {
  int32_t* who;
  pthread_t caller;
} share_ctx;

static int share_task(int task_id, tlmrt_parallel_env* penv, void* cdata) {
  (void)penv;
  share_ctx* c = (share_ctx*)cdata;
  volatile uint32_t spin = 0;
  for (int i = 0; i < 4000; ++i) spin += (uint32_t)i;  /* a few microseconds, so the worker takes part */
  __atomic_store_n(&c->who[task_id], pthread_equal(pthread_self(), c->caller) ? 1 : 2, __ATOMIC_RELAXED);
  return 0;
}

/* Whether who[lo..hi) is `owner`'s tasks from the front, then the other thread's. */
static int owner_first(const int32_t* who, int lo, int hi, int owner) {
  int i = lo;
  while (i < hi && who[i] == owner) ++i;
  for (; i < hi; ++i) {
    if (who[i] == owner) return 0;
  }
  return 1;
}

EXPORT int32_t __tvm_ffi_share_order(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {
  (void)self;
  (void)result;
  int32_t* data[3];
  if (three_int_tensors_and_a_pool("share_order", args, num_args, data) != 0) return -1;
  int32_t* who = data[0];
  for (int32_t r = 0; r < data[2][0]; ++r) {
    for (int i = 0; i < 16; ++i) __atomic_store_n(&who[i], 0, __ATOMIC_RELAXED);
    share_ctx c = {who, pthread_self()};
    if (__TVMBackendParallelLaunch(share_task, &c, 16) != 0) return fail("share_order: a launch failed");
    if (!owner_first(who, 0, 8, 1) || !owner_first(who, 8, 16, 2)) ++data[1][0];
    int worker = 0;
    for (int i = 0; i < 16; ++i) worker |= who[i] == 2;
    data[2][1] += worker;
    data[2][2] += who[8] == 2;
  }
  return 0;
}
