/*
 * tlmrt_cpu.c — the CPU backend: x86/model.so (TVM's LLVM kernels and the generated plan), a pthread
 * pool, and the TVM context hooks that kernels call.
 *
 * TVM's LLVM kernels call the runtime through global function-pointer variables in the model
 * library (__TVMBackendParallelLaunch, __TVMBackendAllocWorkspace, __TVMBackendFreeWorkspace and,
 * for kernels with barriers, __TVMBackendParallelBarrier). cpu_create (at open) stores the functions
 * below into those variables, as TVM's own loader does.
 *
 * The launch hook has no context parameter, so the pool it uses is found through a thread-local
 * pointer: a run sets it to the model's pool on the calling thread for the duration of the run and
 * restores the previous value afterwards (a kernel library's call does the same with its pool:
 * tlmrt_kernels.c, through tlmrt_cpu_pool_enter/leave). A launch on a thread with
 * no current pool (a kernel called outside tlmrt_model_run, a nested launch from inside a parallel
 * task, a launch from a worker) runs its tasks one after another on the calling thread.
 *
 * Pool: N threads in total, the caller being thread 0 and N-1 workers. Task i of a launch with n
 * tasks runs on thread i % N, so with n <= N (the usual case: TVM asks for num_task = 0, meaning N)
 * every task has its own thread and parallel barriers work. Every worker acknowledges every launch,
 * even one that gives it no task, so no worker can lag a launch behind. Waiting (workers for work,
 * the caller for completion) spins for TLMRT_CPU_SPIN iterations (a pause each, a sched_yield every
 * 32nd, so a preempted peer gets the core) before sleeping on a condvar. A pool with more threads
 * than online cores does not spin at all.
 */
#define _POSIX_C_SOURCE 200809L

#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tlmrt_internal.h"

#ifndef TLMRT_CPU_SPIN
#define TLMRT_CPU_SPIN 4096
#endif
#define TLMRT_CPU_MAX_THREADS 1024

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#define cpu_relax() ((void)0)
#endif

/* One iteration of a spin-wait. */
static inline void spin_pause(int i) {
  if ((i & 31) == 31) {
    sched_yield();
  } else {
    cpu_relax();
  }
}

typedef struct {
  tlmrt_cpu_pool* pool;
  int index;  /* 1..N-1 */
  pthread_t thread;
} cpu_worker;

typedef struct {
  _Atomic int count;
  _Atomic uint32_t generation;
  int spin;  /* the pool's spin count */
} cpu_barrier;

struct tlmrt_cpu_pool {
  int num_threads;  /* N, the caller included */
  int num_started;  /* workers actually running */
  int spin;         /* spin iterations before sleeping: TLMRT_CPU_SPIN, or 0 when oversubscribed */
  cpu_worker* workers;

  /* The current launch; written by the caller before it bumps `generation`. */
  tlmrt_parallel_lambda flambda;
  void* cdata;
  int num_task;
  void* sync_handle;
  int stop;

  _Alignas(64) _Atomic uint32_t generation;
  _Alignas(64) _Atomic int remaining;  /* workers yet to acknowledge the launch */
  _Atomic int failed;
  _Alignas(64) _Atomic int sleepers;   /* workers asleep on wake_cv */
  _Atomic int caller_sleeping;
  _Alignas(64) cpu_barrier barrier;

  pthread_mutex_t mu;
  pthread_cond_t wake_cv;
  pthread_cond_t done_cv;
};

/* The pool that __TVMBackendParallelLaunch uses on this thread; see the comment at the top. */
static _Thread_local tlmrt_cpu_pool* tls_current_pool = NULL;

/* ---- hooks ------------------------------------------------------------------------------------ */

static int run_tasks(tlmrt_parallel_lambda flambda, void* cdata, int first, int step, int n,
                     void* sync_handle) {
  int failed = 0;
  for (int i = first; i < n; i += step) {
    tlmrt_parallel_env env = {sync_handle, n};
    if (flambda(i, &env, cdata) != 0) failed = 1;
  }
  return failed;
}

static void worker_wait_done(tlmrt_cpu_pool* pool) {
  if (atomic_fetch_sub(&pool->remaining, 1) == 1 && atomic_load(&pool->caller_sleeping)) {
    pthread_mutex_lock(&pool->mu);
    pthread_cond_signal(&pool->done_cv);
    pthread_mutex_unlock(&pool->mu);
  }
}

static uint32_t worker_wait_work(tlmrt_cpu_pool* pool, uint32_t seen) {
  for (int i = 0; i < pool->spin; ++i) {
    uint32_t g = atomic_load_explicit(&pool->generation, memory_order_acquire);
    if (g != seen) return g;
    spin_pause(i);
  }
  pthread_mutex_lock(&pool->mu);
  atomic_fetch_add(&pool->sleepers, 1);
  uint32_t g;
  while ((g = atomic_load(&pool->generation)) == seen) pthread_cond_wait(&pool->wake_cv, &pool->mu);
  atomic_fetch_sub(&pool->sleepers, 1);
  pthread_mutex_unlock(&pool->mu);
  return g;
}

static void* worker_main(void* arg) {
  cpu_worker* self = (cpu_worker*)arg;
  tlmrt_cpu_pool* pool = self->pool;
  uint32_t seen = 0;
  for (;;) {
    seen = worker_wait_work(pool, seen);
    if (pool->stop) break;
    if (run_tasks(pool->flambda, pool->cdata, self->index, pool->num_threads, pool->num_task,
                  pool->sync_handle)) {
      atomic_store(&pool->failed, 1);
    }
    worker_wait_done(pool);
  }
  return NULL;
}

/* Publishes the job fields written just before (seq_cst pairs with the worker's sleeper count). */
static void pool_publish(tlmrt_cpu_pool* pool, int always_broadcast) {
  atomic_fetch_add(&pool->generation, 1u);
  if (always_broadcast || atomic_load(&pool->sleepers) > 0) {
    pthread_mutex_lock(&pool->mu);
    pthread_cond_broadcast(&pool->wake_cv);
    pthread_mutex_unlock(&pool->mu);
  }
}

static void pool_wait_workers(tlmrt_cpu_pool* pool) {
  for (int i = 0; i < pool->spin; ++i) {
    if (atomic_load_explicit(&pool->remaining, memory_order_acquire) == 0) return;
    spin_pause(i);
  }
  pthread_mutex_lock(&pool->mu);
  atomic_store(&pool->caller_sleeping, 1);
  while (atomic_load(&pool->remaining) != 0) pthread_cond_wait(&pool->done_cv, &pool->mu);
  atomic_store(&pool->caller_sleeping, 0);
  pthread_mutex_unlock(&pool->mu);
}

static int cpu_parallel_launch(tlmrt_parallel_lambda flambda, void* cdata, int num_task) {
  if (flambda == NULL || num_task < 0) return -1;
  tlmrt_cpu_pool* pool = tls_current_pool;
  if (pool == NULL || pool->num_started == 0) {
    /* No pool here (or a pool of one): run serially. A barrier cannot work with n > 1 here. */
    int n = num_task == 0 ? 1 : num_task;
    return run_tasks(flambda, cdata, 0, 1, n, NULL) ? -1 : 0;
  }
  int n = num_task == 0 ? pool->num_threads : num_task;
  pool->flambda = flambda;
  pool->cdata = cdata;
  pool->num_task = n;
  pool->sync_handle = n <= pool->num_threads ? (void*)&pool->barrier : NULL;
  atomic_store_explicit(&pool->barrier.count, 0, memory_order_relaxed);
  atomic_store_explicit(&pool->failed, 0, memory_order_relaxed);
  atomic_store_explicit(&pool->remaining, pool->num_started, memory_order_relaxed);
  pool_publish(pool, 0);

  tls_current_pool = NULL;  /* a nested launch from task 0 runs serially */
  int failed = run_tasks(flambda, cdata, 0, pool->num_threads, n, pool->sync_handle);
  tls_current_pool = pool;
  pool_wait_workers(pool);
  return (failed || atomic_load(&pool->failed)) ? -1 : 0;
}

static int cpu_parallel_barrier(int task_id, tlmrt_parallel_env* penv) {
  (void)task_id;
  if (penv == NULL) return -1;
  if (penv->num_task <= 1) return 0;
  cpu_barrier* b = (cpu_barrier*)penv->sync_handle;
  if (b == NULL) return -1;  /* the tasks are not all running at once: waiting would deadlock */
  uint32_t gen = atomic_load(&b->generation);
  if (atomic_fetch_add(&b->count, 1) == penv->num_task - 1) {
    atomic_store(&b->count, 0);
    atomic_fetch_add(&b->generation, 1u);
    return 0;
  }
  /* Tasks wait for each other only briefly here; past the spin count, yield the core each time. */
  for (int i = 0; atomic_load(&b->generation) == gen; i += i < b->spin) {
    if (i < b->spin) {
      spin_pause(i);
    } else {
      sched_yield();
    }
  }
  return 0;
}

static void* cpu_alloc_workspace(int device_type, int device_id, uint64_t nbytes, int dtype_code_hint,
                                 int dtype_bits_hint) {
  (void)device_type;
  (void)device_id;
  (void)dtype_code_hint;
  (void)dtype_bits_hint;
  if (nbytes > (uint64_t)SIZE_MAX - TLMRT_ALIGNMENT) return NULL;
  size_t size = ((size_t)nbytes + TLMRT_ALIGNMENT - 1u) & ~(size_t)(TLMRT_ALIGNMENT - 1u);
  if (size == 0) size = TLMRT_ALIGNMENT;
  return aligned_alloc(TLMRT_ALIGNMENT, size);
}

static int cpu_free_workspace(int device_type, int device_id, void* ptr) {
  (void)device_type;
  (void)device_id;
  free(ptr);
  return 0;
}

/* ---- backend ---------------------------------------------------------------------------------- */

void tlmrt_cpu_pool_destroy(tlmrt_cpu_pool* pool) {
  if (pool == NULL) return;
  if (pool->num_started > 0) {
    pool->stop = 1;
    pool_publish(pool, 1);
    for (int i = 0; i < pool->num_started; ++i) pthread_join(pool->workers[i].thread, NULL);
  }
  pthread_cond_destroy(&pool->done_cv);
  pthread_cond_destroy(&pool->wake_cv);
  pthread_mutex_destroy(&pool->mu);
  free(pool->workers);
  free(pool);
}

static tlmrt_status pool_create(int num_threads, int spin, tlmrt_cpu_pool** out, char* err,
                                size_t err_cap) {
  *out = NULL;
  tlmrt_cpu_pool* pool = (tlmrt_cpu_pool*)aligned_alloc(64, sizeof(tlmrt_cpu_pool));
  if (pool == NULL) return tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  memset(pool, 0, sizeof(*pool));
  pool->num_threads = num_threads;
  pool->spin = spin;
  pool->barrier.spin = spin;
  atomic_init(&pool->generation, 0u);
  atomic_init(&pool->remaining, 0);
  atomic_init(&pool->failed, 0);
  atomic_init(&pool->sleepers, 0);
  atomic_init(&pool->caller_sleeping, 0);
  atomic_init(&pool->barrier.count, 0);
  atomic_init(&pool->barrier.generation, 0u);
  int rc = pthread_mutex_init(&pool->mu, NULL);
  if (rc == 0) {
    rc = pthread_cond_init(&pool->wake_cv, NULL);
    if (rc == 0) {
      rc = pthread_cond_init(&pool->done_cv, NULL);
      if (rc != 0) pthread_cond_destroy(&pool->wake_cv);
    }
    if (rc != 0) pthread_mutex_destroy(&pool->mu);
  }
  if (rc != 0) {
    free(pool);
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY,
                        "cannot create the thread pool's mutex or condition variables: %s",
                        strerror(rc));
  }
  int num_workers = num_threads - 1;
  if (num_workers > 0) {
    pool->workers = (cpu_worker*)calloc((size_t)num_workers, sizeof(cpu_worker));
    if (pool->workers == NULL) {
      tlmrt_cpu_pool_destroy(pool);
      return tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
    }
  }
  /* Workers block every signal (they inherit the mask), so signals go to the application's threads. */
  sigset_t all, saved;
  sigfillset(&all);
  int mask_rc = pthread_sigmask(SIG_SETMASK, &all, &saved);
  rc = 0;
  for (int i = 0; i < num_workers && rc == 0; ++i) {
    pool->workers[i].pool = pool;
    pool->workers[i].index = i + 1;
    rc = pthread_create(&pool->workers[i].thread, NULL, worker_main, &pool->workers[i]);
    if (rc == 0) pool->num_started = i + 1;
  }
  if (mask_rc == 0) pthread_sigmask(SIG_SETMASK, &saved, NULL);
  if (rc != 0) {
    int started = pool->num_started;
    tlmrt_cpu_pool_destroy(pool);
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY, "cannot start worker thread %d of %d: %s",
                        started + 1, num_workers, strerror(rc));
  }
  *out = pool;
  return TLMRT_OK;
}

/* Two models of one artifact share one dlopen'ed library, so its hook variables may already be
 * filled, and kernels of the first model may be reading them: write only a slot that differs, and
 * let only one thread at a time look. This lock is the runtime's one process-wide object. */
static pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER;

/* Stores fn into the model library's function-pointer variable `name`, if the library has one. */
static void fill_hook(void* dl_handle, const char* name, const void* fn_ptr, size_t fn_size) {
  pthread_mutex_lock(&hook_lock);
  dlerror();
  void* slot = dlsym(dl_handle, name);
  if (slot != NULL && memcmp(slot, fn_ptr, fn_size) != 0) memcpy(slot, fn_ptr, fn_size);
  pthread_mutex_unlock(&hook_lock);  /* slot == NULL: no kernel uses this hook */
}

/* Checks the library for hooks this runtime does not fill, starts the pool and fills the hooks. */
tlmrt_status tlmrt_cpu_pool_start(int32_t num_threads, void* dl_handle, const char* what, tlmrt_cpu_pool** out,
                                  char* err, size_t err_cap) {
  *out = NULL;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores < 1) cores = 1;
  long n = num_threads == 0 ? cores : num_threads;
  if (n < 1 || n > TLMRT_CPU_MAX_THREADS) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_INVALID_ARGUMENT,
                        "num_threads: expected 0 (all cores) or 1..%d, found %ld",
                        TLMRT_CPU_MAX_THREADS, n);
  }
  /* Context hooks of TVM's loader that this runtime does not provide: a kernel would call through
   * a NULL pointer. The LLVM codegen emits such a variable only when generated code uses it. */
  static const char* const kUnsupported[] = {"__TVMFFIFunctionCall", "__TVMFFIEnvModLookupFromImports",
                                             "__TVMFFIHandleInitOnce", "__TVMFFIErrorSetRaisedFromCStr"};
  for (size_t i = 0; i < sizeof(kUnsupported) / sizeof(kUnsupported[0]); ++i) {
    dlerror();
    if (dlsym(dl_handle, kUnsupported[i]) != NULL) {
      return tlmrt_errorf(err, err_cap, TLMRT_ERR_INCOMPATIBLE,
                          "%s uses the TVM context hook %s, which this runtime does not "
                          "provide; expected kernels that need only __TVMBackendParallelLaunch, "
                          "__TVMBackendParallelBarrier and the workspace hooks",
                          what, kUnsupported[i]);
    }
  }
  tlmrt_cpu_pool* pool = NULL;
  tlmrt_status status = pool_create((int)n, n <= cores ? TLMRT_CPU_SPIN : 0, &pool, err, err_cap);
  if (status != TLMRT_OK) return status;

  tlmrt_parallel_launch_fn launch = cpu_parallel_launch;
  tlmrt_parallel_barrier_fn barrier = cpu_parallel_barrier;
  tlmrt_alloc_workspace_fn alloc = cpu_alloc_workspace;
  tlmrt_free_workspace_fn release = cpu_free_workspace;
  /* Equivalent to *(tlmrt_parallel_launch_fn*)dlsym(h, "__TVMBackendParallelLaunch") = launch. */
  fill_hook(dl_handle, TLMRT_HOOK_PARALLEL_LAUNCH, &launch, sizeof(launch));
  fill_hook(dl_handle, TLMRT_HOOK_PARALLEL_BARRIER, &barrier, sizeof(barrier));
  fill_hook(dl_handle, TLMRT_HOOK_ALLOC_WORKSPACE, &alloc, sizeof(alloc));
  fill_hook(dl_handle, TLMRT_HOOK_FREE_WORKSPACE, &release, sizeof(release));
  *out = pool;
  return TLMRT_OK;
}

tlmrt_cpu_pool* tlmrt_cpu_pool_enter(tlmrt_cpu_pool* pool) {
  tlmrt_cpu_pool* previous = tls_current_pool;
  tls_current_pool = pool;
  return previous;
}

void tlmrt_cpu_pool_leave(tlmrt_cpu_pool* previous) { tls_current_pool = previous; }

/* ---- the x86 model ---------------------------------------------------------------------------- */

#define MODEL_FILE "x86/model.so"

typedef struct {
  void* dl_handle;
  const tlmrt_plan* plan;               /* lives in dl_handle's data; validated at open */
  tlmrt_plan_kernel_error_fn kernel_error;
  tlmrt_cpu_pool* pool;
  uint8_t* arena;
  tlmrt_weights weights;
  tlmrt_dltensor* tensors;              /* plan->num_tensors */
  int64_t* shapes;                      /* TLMRT_PLAN_MAX_NDIM per tensor */
  tlmrt_ffi_any* args;                  /* every step's arguments, one after another */
  size_t* step_first_arg;               /* plan->num_steps */
  char description[64];
} cpu_model;

static tlmrt_plan_tables plan_tables(const tlmrt_plan* plan) {
  tlmrt_plan_tables t = {plan->tensors, plan->num_tensors, plan->inputs, plan->num_inputs,
                         plan->outputs, plan->num_outputs};
  return t;
}

static tlmrt_status validate_plan(const tlmrt_plan* plan, const tlmrt_weights* w, uint64_t* out_total_args,
                                  char* err, size_t err_cap) {
  if (plan->abi_version != TLMRT_PLAN_ABI_VERSION) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_INCOMPATIBLE,
                        MODEL_FILE ": plan ABI version %u, but this runtime (tlmrt %s) reads version %d; "
                        "rebuild the artifact or use a matching runtime",
                        plan->abi_version, tlmrt_version(), TLMRT_PLAN_ABI_VERSION);
  }
  if (plan->model_name == NULL) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT, "plan: expected a model name, found NULL");
  }
  tlmrt_status s = tlmrt_check_weights("plan", plan->weights_bytes, plan->weights_sha256, w, err, err_cap);
  if (s != TLMRT_OK) return s;
  tlmrt_plan_tables tables = plan_tables(plan);
  s = tlmrt_validate_tables("plan", &tables, plan->arena_bytes, w->size, err, err_cap);
  if (s != TLMRT_OK) return s;
  if (plan->num_steps < 0 || plan->num_steps > TLMRT_MAX_PLAN_ENTRIES ||
      (plan->num_steps > 0 && plan->steps == NULL)) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                        "plan: expected 0..%d steps with a non-NULL table, found %d", TLMRT_MAX_PLAN_ENTRIES,
                        plan->num_steps);
  }
  uint64_t total_args = 0;
  for (int32_t i = 0; i < plan->num_steps; ++i) {
    const tlmrt_plan_step* st = &plan->steps[i];
    if (st->kernel == NULL || st->fn == NULL) {
      return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                          "plan step %d: expected a kernel name and function, found %s", i,
                          st->kernel == NULL ? "a NULL name" : "a NULL function");
    }
    if (st->num_args < 0 || st->num_args > TLMRT_MAX_PLAN_ENTRIES || (st->num_args > 0 && st->args == NULL)) {
      return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                          "plan step %d (%.200s): expected 0..%d arguments with a non-NULL table, "
                          "found %d",
                          i, st->kernel, TLMRT_MAX_PLAN_ENTRIES, st->num_args);
    }
    for (int32_t a = 0; a < st->num_args; ++a) {
      if (st->args[a] < 0 || st->args[a] >= plan->num_tensors) {
        return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                            "plan step %d (%.200s) argument %d: tensor index expected 0..%d, found %d",
                            i, st->kernel, a, plan->num_tensors - 1, st->args[a]);
      }
    }
    total_args += (uint64_t)st->num_args;
  }
  *out_total_args = total_args;
  return TLMRT_OK;
}

static tlmrt_status build_tensors(cpu_model* m, uint64_t total_args, char* err, size_t err_cap) {
  const tlmrt_plan* plan = m->plan;
  size_t nt = (size_t)plan->num_tensors;
  m->arena = (uint8_t*)tlmrt_alloc_aligned(plan->arena_bytes);
  m->tensors = (tlmrt_dltensor*)calloc(nt > 0 ? nt : 1u, sizeof(tlmrt_dltensor));
  m->shapes = (int64_t*)calloc((nt > 0 ? nt : 1u) * TLMRT_PLAN_MAX_NDIM, sizeof(int64_t));
  m->args = (tlmrt_ffi_any*)calloc(total_args > 0 ? (size_t)total_args : 1u, sizeof(tlmrt_ffi_any));
  m->step_first_arg = (size_t*)calloc(plan->num_steps > 0 ? (size_t)plan->num_steps : 1u, sizeof(size_t));
  if (m->arena == NULL || m->tensors == NULL || m->shapes == NULL || m->args == NULL ||
      m->step_first_arg == NULL) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY,
                        "cannot allocate the arena (%" PRIu64 " bytes) and tables for %d tensors",
                        plan->arena_bytes, plan->num_tensors);
  }
  uint64_t arena_alloc = plan->arena_bytes == 0 ? TLMRT_ALIGNMENT
                                                : (plan->arena_bytes + TLMRT_ALIGNMENT - 1u) & ~(uint64_t)(TLMRT_ALIGNMENT - 1u);
  memset(m->arena, 0, (size_t)arena_alloc);
  for (size_t i = 0; i < nt; ++i) {
    const tlmrt_plan_tensor* pt = &plan->tensors[i];
    tlmrt_dltensor* t = &m->tensors[i];
    uint8_t* base = pt->storage == TLMRT_STORAGE_ARENA ? m->arena : m->weights.data;
    int64_t* shape = &m->shapes[i * TLMRT_PLAN_MAX_NDIM];
    for (int32_t d = 0; d < pt->ndim; ++d) shape[d] = pt->shape[d];
    t->data = base + pt->offset;
    t->device.device_type = TLMRT_DL_CPU;
    t->device.device_id = 0;
    t->ndim = pt->ndim;
    t->dtype.code = pt->dtype_code;
    t->dtype.bits = pt->dtype_bits;
    t->dtype.lanes = pt->dtype_lanes;
    t->shape = shape;
    t->strides = NULL;
    t->byte_offset = 0;
  }
  size_t next = 0;
  for (int32_t s = 0; s < plan->num_steps; ++s) {
    const tlmrt_plan_step* st = &plan->steps[s];
    m->step_first_arg[s] = next;
    for (int32_t a = 0; a < st->num_args; ++a) {
      tlmrt_ffi_any* any = &m->args[next++];
      any->type_index = TLMRT_FFI_TYPE_DLTENSOR_PTR;
      any->zero_padding = 0;
      any->v.v_ptr = &m->tensors[st->args[a]];
    }
  }
  return TLMRT_OK;
}

static void cpu_close(void* state) {
  cpu_model* m = (cpu_model*)state;
  if (m == NULL) return;
  /* Threads first: nothing may call into the library once it is unloaded. */
  tlmrt_cpu_pool_destroy(m->pool);
  if (m->dl_handle != NULL) dlclose(m->dl_handle);
  free(m->step_first_arg);
  free(m->args);
  free(m->shapes);
  free(m->tensors);
  free(m->weights.data);
  free(m->arena);
  free(m);
}

/* Open, in this order, so that no code from the artifact runs before it is checked:
 *   1. read the plan's weights (x86/weights.bin when the artifact has it: the x86 kernels' own,
 *      pre-packed copy; else the shared weights.bin) into a 64-byte-aligned buffer, hashing it;
 *   2. if opts.verify_files, check SHA256SUMS (weights.bin's digest comes from step 1, so the bytes
 *      checked are the bytes used);
 *   3. dlopen x86/model.so (RTLD_NOW | RTLD_LOCAL), get the plan, validate all of it, and compare
 *      weights.bin's size and sha256 with the plan's (always, whatever verify_files says);
 *   4. preallocate the arena, one DLTensor per plan tensor and one TVMFFIAny array per step;
 *   5. fill the kernel hooks and start the threads. */
static tlmrt_status cpu_open(const char* dir, const tlmrt_options* opts, void** out_state,
                             tlmrt_plan_tables* tables, char* err, size_t err_cap) {
  *out_state = NULL;
  cpu_model* m = (cpu_model*)calloc(1, sizeof(cpu_model));
  if (m == NULL) return tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  const char* weights_file = TLMRT_WEIGHTS_FILE;
  char* own = tlmrt_join_path(dir, TLMRT_X86_WEIGHTS_FILE);
  if (own == NULL) {
    free(m);
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  }
  if (access(own, F_OK) == 0) weights_file = TLMRT_X86_WEIGHTS_FILE;
  free(own);
  tlmrt_status s = tlmrt_load_weights(dir, weights_file, &m->weights, err, err_cap);
  if (s != TLMRT_OK) goto fail;
  if (opts->verify_files) {
    const char* must[] = {MODEL_FILE, weights_file};
    const char* known_names[] = {weights_file};
    const char* known_hex[] = {m->weights.sha256};
    s = tlmrt_verify_sha256sums(dir, must, 2, known_names, known_hex, 1, err, err_cap);
    if (s != TLMRT_OK) goto fail;
  }
  void* sym = NULL;
  s = tlmrt_open_library(dir, MODEL_FILE, TLMRT_PLAN_SYMBOL, &m->dl_handle, &sym, err, err_cap);
  if (s != TLMRT_OK) goto fail;
  tlmrt_plan_get_fn get_plan;
  memcpy(&get_plan, &sym, sizeof(get_plan));
  m->plan = get_plan();
  if (m->plan == NULL) {
    s = tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                     MODEL_FILE ": " TLMRT_PLAN_SYMBOL "() expected to return a plan, returned NULL");
    goto fail;
  }
  dlerror();
  sym = dlsym(m->dl_handle, TLMRT_PLAN_KERNEL_ERROR_SYMBOL);
  if (sym != NULL) memcpy(&m->kernel_error, &sym, sizeof(m->kernel_error));
  /* The kernels may use vector instructions this CPU lacks: refuse before any of them runs
   * (a SIGILL is not an error message). The check itself is plain x86-64 code in the plan. */
  dlerror();
  sym = dlsym(m->dl_handle, TLMRT_PLAN_MISSING_CPU_FEATURE_SYMBOL);
  if (sym != NULL) {
    tlmrt_plan_missing_cpu_feature_fn missing_feature;
    memcpy(&missing_feature, &sym, sizeof(missing_feature));
    const char* missing = missing_feature();
    if (missing != NULL) {
      s = tlmrt_errorf(err, err_cap, TLMRT_ERR_INCOMPATIBLE,
                       MODEL_FILE ": the kernels need the CPU feature %s, which this CPU lacks; "
                       "rebuild with --cpu naming this machine's CPU", missing);
      goto fail;
    }
  }

  uint64_t total_args = 0;
  s = validate_plan(m->plan, &m->weights, &total_args, err, err_cap);
  if (s != TLMRT_OK) goto fail;
  s = build_tensors(m, total_args, err, err_cap);
  if (s != TLMRT_OK) goto fail;
  s = tlmrt_cpu_pool_start(opts->num_threads, m->dl_handle, MODEL_FILE, &m->pool, err, err_cap);
  if (s != TLMRT_OK) goto fail;
  snprintf(m->description, sizeof(m->description), "cpu (%d thread%s)", m->pool->num_threads,
           m->pool->num_threads == 1 ? "" : "s");
  *tables = plan_tables(m->plan);
  *out_state = m;
  return TLMRT_OK;
fail:
  cpu_close(m);
  return s;
}

static tlmrt_status cpu_run(void* state, const tlmrt_io* inputs, const tlmrt_io* outputs, char* err,
                            size_t err_cap) {
  cpu_model* m = (cpu_model*)state;
  const tlmrt_plan* plan = m->plan;
  for (int32_t i = 0; i < plan->num_inputs; ++i) {
    const tlmrt_plan_tensor* t = &plan->tensors[plan->inputs[i].tensor];
    if (t->nbytes > 0) memcpy(m->arena + t->offset, inputs[i].data, (size_t)t->nbytes);
  }

  tlmrt_status s = TLMRT_OK;
  tlmrt_cpu_pool* saved = tls_current_pool;
  tls_current_pool = m->pool;
  for (int32_t i = 0; i < plan->num_steps; ++i) {
    const tlmrt_plan_step* st = &plan->steps[i];
    tlmrt_ffi_any result;
    memset(&result, 0, sizeof(result));
    int32_t rc = st->fn(NULL, &m->args[m->step_first_arg[i]], st->num_args, &result);
    if (rc != 0) {
      const char* why = m->kernel_error != NULL ? m->kernel_error() : NULL;
      s = tlmrt_errorf(err, err_cap, TLMRT_ERR_KERNEL, "kernel %.200s (step %d) failed: %s", st->kernel, i,
                       (why != NULL && why[0] != '\0') ? why : "(the kernel left no message)");
      break;
    }
  }
  tls_current_pool = saved;
  if (s != TLMRT_OK) return s;

  for (int32_t i = 0; i < plan->num_outputs; ++i) {
    const tlmrt_plan_tensor* t = &plan->tensors[plan->outputs[i].tensor];
    if (outputs[i].data != NULL && t->nbytes > 0) memcpy(outputs[i].data, m->arena + t->offset, (size_t)t->nbytes);
  }
  return TLMRT_OK;
}

static void cpu_output_buffer(void* state, int32_t index, tlmrt_io* out) {
  cpu_model* m = (cpu_model*)state;
  const tlmrt_plan_tensor* t = &m->plan->tensors[m->plan->outputs[index].tensor];
  out->data = m->arena + t->offset;
  out->nbytes = t->nbytes;
  out->device_type = TLMRT_DEVICE_CPU;
  out->device_id = 0;
}

static void* cpu_stream(void* state) {
  (void)state;
  return NULL;
}

static const char* cpu_describe(void* state) { return ((cpu_model*)state)->description; }

const tlmrt_backend tlmrt_backend_cpu = {
    "cpu", TLMRT_DEVICE_CPU, cpu_open, cpu_close, cpu_run, cpu_output_buffer, cpu_stream, cpu_describe,
};
