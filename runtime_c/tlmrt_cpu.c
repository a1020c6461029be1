/*
 * tlmrt_cpu.c — the CPU backend: x86/model.so (TVM's LLVM kernels and the generated plan), a pthread
 * pool, and the TVM context hooks that kernels call.
 *
 * TVM's LLVM kernels call the runtime through global function-pointer variables in the model
 * library (__TVMBackendParallelLaunch, __TVMBackendAllocWorkspace, __TVMBackendFreeWorkspace and,
 * for kernels with barriers, __TVMBackendParallelBarrier). cpu_open stores the functions below into
 * those variables, as TVM's own loader does.
 *
 * The launch hook has no context parameter, so the pool it uses is found through a thread-local
 * pointer: a run that holds the model's pool sets it on the calling thread for the duration of the
 * run (tlmrt_cpu_pool_enter/leave; a kernel library's call does the same). A launch on a thread with
 * no current pool (a kernel called outside a run, a nested launch from inside a parallel task, a
 * launch from a worker, a run while another thread holds the pool) runs its tasks one after another
 * on the calling thread.
 *
 * Pool: N threads in total, the caller being thread 0 and N-1 workers. Task i of a launch with n
 * tasks runs on thread i % N, so with n <= N (the usual case: TVM asks for num_task = 0, meaning N)
 * every task has its own thread and parallel barriers work. A launch writes the job, then bumps a
 * generation counter; each worker runs its tasks and stores that generation into its own
 * cache-line-sized slot, which the caller reads (no counter that every worker writes). Every worker
 * acknowledges every launch, even one that gives it no task, so no worker can lag a launch behind.
 * Waiting (workers for work, the caller for the workers) spins for at most TLMRT_CPU_SPIN_NS with a
 * pause instruction, then sleeps on a futex; a pool with more threads than online cores does not
 * spin. Built with TLMRT_CPU_RUN_SPIN_NS, a wait inside a run spins on for up to that long: a kernel
 * on fewer chunks than threads can keep the others waiting longer than the short budget, and a worker
 * that slept costs the next launch a wake-up; an idle pool (between runs, or a second model's) keeps
 * the short budget. Only a launch that finds sleeping workers makes a system call to wake them.
 *
 * Fork: a child process has none of its parent's threads. A pthread_atfork child handler bumps a
 * process-wide fork count; a pool started under an older count rebuilds its workers the next time a
 * run takes it (so a model run before fork() runs in the child too). Whoever holds the pool (and a
 * run context, tlmrt_core.c) marks it with its fork count + 1, so a mark of an older count, left by
 * a parent's thread that was mid-run at the fork, is void in the child.
 *
 * Workspace: TVM kernels take scratch memory through __TVMBackendAllocWorkspace and give it back in
 * reverse order. Each thread keeps one 64-byte-aligned stack for it that grows to the high-water
 * mark of the first runs, so warm runs allocate nothing.
 */
#define _GNU_SOURCE /* syscall */

#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#include "tlmrt_internal.h"

#ifndef TLMRT_CPU_SPIN_NS
#define TLMRT_CPU_SPIN_NS 50000 /* 50 us: longer than the gap between two kernels of a run */
#endif
/* The spin budget while a run holds the pool; off (the short budget) unless built with it. 500 us for
 * every wait took 4-6 % off MobileNetV2 and EfficientNet-B0 at 16 threads on the 16-core Xeon
 * (BENCHMARKS.md 2026-12-06 19:45), but cost a second model loaded in the same process 1.2x: its idle
 * workers spun on the cores the first ran on. Held to runs, a longer spin costs an idle pool nothing;
 * but on a 2-vCPU VM a run that works alone for 300-600 us between two launches took 1.9-2.1x as long
 * with 1 ms of it (BENCHMARKS.md 2026-12-07 06:45): a spinning worker can take the caller's CPU. */
#ifndef TLMRT_CPU_RUN_SPIN_NS
#define TLMRT_CPU_RUN_SPIN_NS 0
#endif
#define TLMRT_CPU_MAX_THREADS 1024
#define SPIN_CLOCK_EVERY 64      /* pauses between two looks at the clock */
#define RANGE_MAX_TASKS 0xFFFFu /* a dynamic launch's task indices fit a range word's 16-bit fields */

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#define cpu_relax() ((void)0)
#endif

uint64_t tlmrt_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- futex: sleep until a 32-bit word changes ------------------------------------------------- */

static void futex_wait(_Atomic uint32_t* word, uint32_t expected) {
#ifdef __linux__
  syscall(SYS_futex, (uint32_t*)word, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
#else
  (void)word;
  (void)expected;
  sched_yield();
#endif
}

static void futex_wake_all(_Atomic uint32_t* word) {
#ifdef __linux__
  syscall(SYS_futex, (uint32_t*)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#else
  (void)word;
#endif
}

/* ---- fork ------------------------------------------------------------------------------------- */

static _Atomic uint32_t g_fork_count = 0;
static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;
/* Two models of one artifact share one dlopen'ed library, so its hook variables may already be
 * filled, and kernels of the first model may be reading them: write only a slot that differs, and
 * let only one thread at a time look. Held across fork() so a child never inherits it locked. */
static pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER;

static void atfork_prepare(void) { pthread_mutex_lock(&hook_lock); }
static void atfork_parent(void) { pthread_mutex_unlock(&hook_lock); }
static void atfork_child(void) {
  atomic_fetch_add(&g_fork_count, 1u);
  pthread_mutex_unlock(&hook_lock);
}
static void atfork_register(void) { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); }

uint32_t tlmrt_fork_count(void) {
  pthread_once(&g_atfork_once, atfork_register);
  return atomic_load_explicit(&g_fork_count, memory_order_acquire);
}

/* ---- the pool --------------------------------------------------------------------------------- */

/* One worker's acknowledgement, alone on its cache line. */
typedef struct {
  _Alignas(64) _Atomic uint32_t done;  /* the last generation this worker finished */
} cpu_slot;
_Static_assert(sizeof(cpu_slot) == 64, "one cache line per worker slot");

/* One thread's share of a dynamic launch, alone on its cache line: generation << 32 | next << 16 |
 * end, the tasks [next, end) not yet claimed. Its owner claims from the front, others from the back. */
typedef struct {
  _Alignas(64) _Atomic uint64_t word;
} cpu_range;
_Static_assert(sizeof(cpu_range) == 64, "one cache line per range");

static inline uint64_t range_word(uint32_t g, uint32_t next, uint32_t end) {
  return (uint64_t)g << 32 | (uint64_t)next << 16 | (uint64_t)end;
}

typedef struct {
  tlmrt_cpu_pool* pool;
  int index;            /* 1..N-1 */
  uint32_t start_gen;   /* the generation when it was started: launches before it are not its own */
  pthread_t thread;
} cpu_worker;

typedef struct {
  _Atomic int count;
  _Atomic uint32_t generation;
  uint64_t spin_ns;
} cpu_barrier;

struct tlmrt_cpu_pool {
  int num_threads;     /* N, the caller included */
  int num_started;     /* workers running now; 0 runs every launch serially */
  uint64_t spin_ns;    /* spin budget before sleeping: TLMRT_CPU_SPIN_NS, or 0 when oversubscribed */
  uint64_t run_spin_ns; /* the budget while a run holds the pool: TLMRT_CPU_RUN_SPIN_NS, at least spin_ns */
  uint32_t fork_count; /* tlmrt_fork_count() when the workers were started */
  cpu_worker* workers; /* N-1 */
  cpu_slot* slots;     /* N-1, 64-byte aligned */
  cpu_range* ranges;   /* dynamic: N, thread i's share of the current launch (the caller's first) */

  int dynamic;         /* the library has no barrier hook: threads claim tasks (see cpu_parallel_launch) */
  int default_tasks;   /* the task count a launch of num_task 0 gets (see tasks_per_thread) */
  int launch_tasks;    /* when > 0, what a launch of num_task 0 gets instead: the holder's current step's
                        * task count (cpu_run sets it per step from the plan's step work) */

  /* The current launch; written by the caller before it bumps `generation`. Atomics only because a
   * lagging worker of a dynamic pool may read them while the next launch writes them. A worker of a
   * dynamic pool reads them only after it has claimed a task of the launch (see claim_and_run), and
   * the caller writes the next launch's only once every task of this one is done. */
  _Atomic(tlmrt_parallel_lambda) flambda;
  _Atomic(void*) cdata;
  _Atomic int num_task;
  void* sync_handle;
  _Atomic int stop;

  _Alignas(64) _Atomic uint32_t generation;
  _Alignas(64) _Atomic int sleepers;          /* workers asleep (or about to be) on `generation` */
  _Alignas(64) _Atomic uint32_t done_word;    /* bumped by a worker that finishes while the caller sleeps */
  _Atomic int caller_sleeping;
  _Atomic int failed;
  _Alignas(64) _Atomic uint32_t tasks_done;   /* dynamic: tasks of this launch finished */
  _Alignas(64) _Atomic uint64_t claimed;      /* dynamic: generation << 32 | tasks << 16 | tasks claimed */
  _Alignas(64) _Atomic uint32_t in_use;       /* 0, or the fork count + 1 of the thread that holds it */
  tlmrt_step_counter* wait_prof;               /* profiling: [0] launches and the caller's wait for workers,
                                                * [1] launches that woke sleeping workers */
  _Alignas(64) cpu_barrier barrier;
};

/* The pool that __TVMBackendParallelLaunch uses on this thread; see the comment at the top. */
static _Thread_local tlmrt_cpu_pool* tls_current_pool = NULL;
/* While a run goes without the pool because another thread holds it: the task count its launches of
 * num_task 0 get, the pool's size (for a library without barriers), so they split their loops as a
 * run with the pool does and compute the same bits. 0 otherwise: such launches get one task. */
static _Thread_local int tls_serial_tasks = 0;

/* Whether a wait that began at `start` has spun long enough at `now`: past the short budget when no
 * run holds the pool, past the run budget when one does. */
static int spin_spent(tlmrt_cpu_pool* pool, uint64_t start, uint64_t now) {
  uint64_t spent = now - start;
  if (spent < pool->spin_ns) return 0;
  return spent >= pool->run_spin_ns || atomic_load_explicit(&pool->in_use, memory_order_relaxed) == 0u;
}

static int run_tasks(tlmrt_parallel_lambda flambda, void* cdata, int first, int step, int n,
                     void* sync_handle) {
  int failed = 0;
  for (int i = first; i < n; i += step) {
    tlmrt_parallel_env env = {sync_handle, n};
    if (flambda(i, &env, cdata) != 0) failed = 1;
  }
  return failed;
}

static uint32_t worker_wait_work(tlmrt_cpu_pool* pool, uint32_t seen) {
  uint32_t g;
  if (pool->spin_ns > 0) {
    uint64_t start = 0;
    for (unsigned i = 0;; ++i) {
      g = atomic_load_explicit(&pool->generation, memory_order_acquire);
      if (g != seen) return g;
      cpu_relax();
      if (i % SPIN_CLOCK_EVERY == 0) {
        uint64_t now = tlmrt_now_ns();
        if (start == 0) {
          start = now;
        } else if (spin_spent(pool, start, now)) {
          break;
        }
      }
    }
  }
  for (;;) {
    atomic_fetch_add(&pool->sleepers, 1);  /* seq_cst: pairs with pool_publish's load of sleepers */
    g = atomic_load(&pool->generation);
    if (g == seen) futex_wait(&pool->generation, seen);
    atomic_fetch_sub(&pool->sleepers, 1);
    g = atomic_load_explicit(&pool->generation, memory_order_acquire);
    if (g != seen) return g;
  }
}

/* Dynamic pools: claims one task of launch g from `owner`'s range, from the front when it is the
 * claiming thread's own, else from the back; 0 when that range holds none of launch g's. `count`:
 * add it to the launch's claimed tasks (only owned shares are searched by that count). */
static int claim_task(tlmrt_cpu_pool* pool, int owner, uint32_t g, int own, int count, uint32_t* task) {
  _Atomic uint64_t* word = &pool->ranges[owner].word;
  uint64_t w = atomic_load_explicit(word, memory_order_acquire);
  for (;;) {
    if ((uint32_t)(w >> 32) != g) return 0;  /* another launch's range: g is over */
    uint32_t next = (uint32_t)(w >> 16) & RANGE_MAX_TASKS, end = (uint32_t)w & RANGE_MAX_TASKS;
    if (next >= end) return 0;
    uint64_t claimed = own ? range_word(g, next + 1u, end) : range_word(g, next, end - 1u);
    if (atomic_compare_exchange_weak_explicit(word, &w, claimed, memory_order_acq_rel, memory_order_acquire)) {
      *task = own ? next : end - 1u;
      if (count) atomic_fetch_add_explicit(&pool->claimed, 1u, memory_order_relaxed);  /* < 2^16: in its field */
      return 1;
    }
  }
}

/* Whether some task of launch g is still unclaimed: one load instead of a look at every range. */
static int tasks_left(tlmrt_cpu_pool* pool, uint32_t g) {
  uint64_t c = atomic_load_explicit(&pool->claimed, memory_order_relaxed);
  return (uint32_t)(c >> 32) == g && (c & RANGE_MAX_TASKS) < ((c >> 16) & RANGE_MAX_TASKS);
}

/* Dynamic pools: thread `self` runs the tasks of launch g left in its own range, front to back, then
 * takes what is left of the others' from their backs, until none is left (a shared count of the
 * claimed tasks ends the search once all are, rather than a look at every other thread's cache
 * line). Each thread starts on the same contiguous share of every launch's loop (TVM splits a parallel loop into num_task contiguous
 * blocks), so a kernel finds in its own cache what the kernel before it wrote there, and a thread the
 * OS delays still has its share taken by the others.
 * The launch's fields are read only after a task of g is claimed: the launch cannot end before that
 * task is done, so they are still g's (the caller wrote them before the ranges it published, release;
 * the claim's compare-exchange acquires). A worker late for g finds its ranges spent or another
 * generation's, and claims nothing. The thread that finishes the last task wakes a sleeping caller. */
static void claim_and_run(tlmrt_cpu_pool* pool, uint32_t g, int self) {
  uint64_t c = atomic_load_explicit(&pool->claimed, memory_order_relaxed);
  if ((uint32_t)(c >> 32) != g) return;  /* launch g is over */
  int threads = pool->num_threads;
  int shared = ((c >> 16) & RANGE_MAX_TASKS) <= (uint64_t)threads;  /* one range: see cpu_parallel_launch */
  uint32_t task;
  for (int k = 0; k < threads; ++k) {
    if (k > 0 && (shared || !tasks_left(pool, g))) return;
    int owner = shared ? 0 : (self + k) % threads;
    while (claim_task(pool, owner, g, owner == self, !shared, &task)) {
      tlmrt_parallel_lambda flambda = atomic_load_explicit(&pool->flambda, memory_order_acquire);
      void* cdata = atomic_load_explicit(&pool->cdata, memory_order_acquire);
      uint32_t n = (uint32_t)atomic_load_explicit(&pool->num_task, memory_order_acquire);
      tlmrt_parallel_env env = {NULL, (int32_t)n};
      if (flambda((int)task, &env, cdata) != 0) atomic_store_explicit(&pool->failed, 1, memory_order_relaxed);
      if (atomic_fetch_add(&pool->tasks_done, 1u) + 1u == n && atomic_load(&pool->caller_sleeping)) {
        futex_wake_all(&pool->tasks_done);
      }
    }
  }
}

static void* worker_main(void* arg) {
  cpu_worker* self = (cpu_worker*)arg;
  tlmrt_cpu_pool* pool = self->pool;
  cpu_slot* slot = &pool->slots[self->index - 1];
  uint32_t seen = self->start_gen;
  for (;;) {
    seen = worker_wait_work(pool, seen);
    if (pool->stop) break;
    if (pool->dynamic) {
      claim_and_run(pool, seen, self->index);
      continue;
    }
    if (run_tasks(atomic_load_explicit(&pool->flambda, memory_order_relaxed),
                  atomic_load_explicit(&pool->cdata, memory_order_relaxed), self->index, pool->num_threads,
                  atomic_load_explicit(&pool->num_task, memory_order_relaxed), pool->sync_handle)) {
      atomic_store_explicit(&pool->failed, 1, memory_order_relaxed);
    }
    atomic_store(&slot->done, seen);  /* seq_cst: pairs with the caller's caller_sleeping */
    if (atomic_load(&pool->caller_sleeping)) {
      atomic_fetch_add(&pool->done_word, 1u);
      futex_wake_all(&pool->done_word);
    }
  }
  return NULL;
}

/* Publishes the job fields written just before; wakes sleeping workers (all of them to stop). */
static uint32_t pool_publish(tlmrt_cpu_pool* pool, int always_wake) {
  uint32_t g = atomic_fetch_add(&pool->generation, 1u) + 1u;  /* seq_cst, release for the job */
  if (always_wake || atomic_load(&pool->sleepers) > 0) {
    futex_wake_all(&pool->generation);
    if (pool->wait_prof != NULL) atomic_fetch_add_explicit(&pool->wait_prof[1].calls, 1u, memory_order_relaxed);
  }
  return g;
}

static int all_done(tlmrt_cpu_pool* pool, int* cursor, uint32_t g) {
  int n = pool->num_started;
  while (*cursor < n && atomic_load_explicit(&pool->slots[*cursor].done, memory_order_acquire) == g) ++*cursor;
  return *cursor == n;
}

static void pool_wait_workers(tlmrt_cpu_pool* pool, uint32_t g) {
  int cursor = 0;
  if (all_done(pool, &cursor, g)) return;
  if (pool->spin_ns > 0) {
    uint64_t start = tlmrt_now_ns();
    for (unsigned i = 1;; ++i) {
      cpu_relax();
      if (all_done(pool, &cursor, g)) return;
      if (i % SPIN_CLOCK_EVERY == 0 && spin_spent(pool, start, tlmrt_now_ns())) break;
    }
  }
  atomic_store(&pool->caller_sleeping, 1);
  for (;;) {
    uint32_t w = atomic_load(&pool->done_word);
    if (all_done(pool, &cursor, g)) break;
    futex_wait(&pool->done_word, w);
  }
  atomic_store(&pool->caller_sleeping, 0);
}

/* Dynamic pools: the caller waits until every task of launch g is done (spin, then futex). */
static void pool_wait_tasks(tlmrt_cpu_pool* pool, uint32_t n) {
  if (atomic_load_explicit(&pool->tasks_done, memory_order_acquire) == n) return;
  if (pool->spin_ns > 0) {
    uint64_t start = tlmrt_now_ns();
    for (unsigned i = 1;; ++i) {
      cpu_relax();
      if (atomic_load_explicit(&pool->tasks_done, memory_order_acquire) == n) return;
      if (i % SPIN_CLOCK_EVERY == 0 && spin_spent(pool, start, tlmrt_now_ns())) break;
    }
  }
  atomic_store(&pool->caller_sleeping, 1);
  for (;;) {
    uint32_t d = atomic_load(&pool->tasks_done);
    if (d == n) break;
    futex_wait(&pool->tasks_done, d);
  }
  atomic_store(&pool->caller_sleeping, 0);
}

/* Two ways to share a launch's n tasks among the N threads:
 *   static (a library with a barrier hook): task i runs on thread i % N, so with n <= N all tasks run
 *     at once and a barrier between them works; the caller waits for every worker's acknowledgement.
 *   dynamic (no barrier hook, so no task waits for another): with more tasks than threads (a long
 *     convolution split finer by the plan's step work), thread t owns the contiguous share
 *     [t * n / N, (t + 1) * n / N) of the tasks and runs it front to back, then takes the others'
 *     leftovers from their backs (see claim_and_run); with at most one a thread, all n sit in one
 *     range that the threads take in the order they come, as the single ticket before (owned shares
 *     there measured MobileNetV2 1.14-1.67x slower at 16 threads on the 16-core Xeon, but always
 *     loaded first, and load order alone moves it by up to 1.36x there: not resolved, so kept). The
 *     caller waits only until all n are done. A worker the OS has not scheduled yet costs little: the
 *     others take its tasks, and it finds the launch over when it comes. A launch of more than
 *     RANGE_MAX_TASKS tasks runs on the caller. */
static int cpu_parallel_launch(tlmrt_parallel_lambda flambda, void* cdata, int num_task) {
  if (flambda == NULL || num_task < 0) return -1;
  tlmrt_cpu_pool* pool = tls_current_pool;
  if (pool == NULL || pool->num_started == 0) {
    /* No pool here (or a pool of one): run serially. A barrier cannot work with n > 1 here. */
    int n = num_task != 0 ? num_task : tls_serial_tasks > 0 ? tls_serial_tasks : 1;
    int saved = tls_serial_tasks;
    tls_serial_tasks = 0;  /* a nested launch gets one task, as it does under the pool */
    int failed = run_tasks(flambda, cdata, 0, 1, n, NULL);
    tls_serial_tasks = saved;
    return failed ? -1 : 0;
  }
  int n = num_task != 0 ? num_task : pool->launch_tasks > 0 ? pool->launch_tasks : pool->default_tasks;
  if (pool->dynamic && (uint32_t)n > RANGE_MAX_TASKS) {
    tls_current_pool = NULL;
    int failed = run_tasks(flambda, cdata, 0, 1, n, NULL);
    tls_current_pool = pool;
    return failed ? -1 : 0;
  }
  atomic_store_explicit(&pool->flambda, flambda, memory_order_release);
  atomic_store_explicit(&pool->cdata, cdata, memory_order_release);
  atomic_store_explicit(&pool->num_task, n, memory_order_release);
  atomic_store_explicit(&pool->failed, 0, memory_order_relaxed);
  uint64_t t0 = pool->wait_prof != NULL ? tlmrt_now_ns() : 0;
  int failed;
  if (pool->dynamic) {
    uint32_t g = atomic_load_explicit(&pool->generation, memory_order_relaxed) + 1u;
    atomic_store_explicit(&pool->tasks_done, 0u, memory_order_relaxed);
    atomic_store_explicit(&pool->claimed, range_word(g, (uint32_t)n, 0u), memory_order_relaxed);
    if (n <= pool->num_threads) {  /* one task a thread at most: one range, taken in arrival order */
      atomic_store_explicit(&pool->ranges[0].word, range_word(g, 0u, (uint32_t)n), memory_order_release);
    } else {  /* the other ranges keep an older generation's word: nothing to claim there */
      for (int t = 0; t < pool->num_threads; ++t) {
        uint32_t lo = (uint32_t)((int64_t)t * n / pool->num_threads);
        uint32_t hi = (uint32_t)((int64_t)(t + 1) * n / pool->num_threads);
        atomic_store_explicit(&pool->ranges[t].word, range_word(g, lo, hi), memory_order_release);
      }
    }
    pool_publish(pool, 0);
    tls_current_pool = NULL;  /* a nested launch from a task runs serially */
    claim_and_run(pool, g, 0);
    tls_current_pool = pool;
    if (pool->wait_prof != NULL) t0 = tlmrt_now_ns();
    pool_wait_tasks(pool, (uint32_t)n);
    failed = 0;
  } else {
    pool->sync_handle = n <= pool->num_threads ? (void*)&pool->barrier : NULL;
    atomic_store_explicit(&pool->barrier.count, 0, memory_order_relaxed);
    uint32_t g = pool_publish(pool, 0);
    tls_current_pool = NULL;  /* a nested launch from task 0 runs serially */
    failed = run_tasks(flambda, cdata, 0, pool->num_threads, n, pool->sync_handle);
    tls_current_pool = pool;
    if (pool->wait_prof != NULL) t0 = tlmrt_now_ns();
    pool_wait_workers(pool, g);
  }
  if (pool->wait_prof != NULL) {
    atomic_fetch_add_explicit(&pool->wait_prof->calls, 1u, memory_order_relaxed);
    atomic_fetch_add_explicit(&pool->wait_prof->ns, tlmrt_now_ns() - t0, memory_order_relaxed);
  }
  return (failed || atomic_load_explicit(&pool->failed, memory_order_relaxed)) ? -1 : 0;
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
  /* Tasks wait for each other only briefly here; past the spin budget, yield the core each time. */
  uint64_t deadline = b->spin_ns > 0 ? tlmrt_now_ns() + b->spin_ns : 0;
  for (unsigned i = 1; atomic_load(&b->generation) == gen; ++i) {
    if (deadline != 0) {
      cpu_relax();
      if (i % SPIN_CLOCK_EVERY == 0 && tlmrt_now_ns() >= deadline) deadline = 0;
    } else {
      sched_yield();
    }
  }
  return 0;
}

/* Starts workers 1..N-1 (none for N = 1). On failure no worker is left running. */
static int pool_start_workers(tlmrt_cpu_pool* pool) {
  int num_workers = pool->num_threads - 1;
  pool->num_started = 0;
  pool->stop = 0;
  pool->fork_count = tlmrt_fork_count();
  uint32_t g = atomic_load(&pool->generation);
  atomic_store(&pool->sleepers, 0);
  atomic_store(&pool->caller_sleeping, 0);
  for (int i = 0; i < num_workers; ++i) atomic_store(&pool->slots[i].done, g);
  /* Workers block every signal (they inherit the mask), so signals go to the application's threads. */
  sigset_t all, saved;
  sigfillset(&all);
  int mask_rc = pthread_sigmask(SIG_SETMASK, &all, &saved);
  int rc = 0;
  for (int i = 0; i < num_workers && rc == 0; ++i) {
    pool->workers[i].pool = pool;
    pool->workers[i].index = i + 1;
    pool->workers[i].start_gen = g;
    rc = pthread_create(&pool->workers[i].thread, NULL, worker_main, &pool->workers[i]);
    if (rc == 0) pool->num_started = i + 1;
  }
  if (mask_rc == 0) pthread_sigmask(SIG_SETMASK, &saved, NULL);
  if (rc != 0) {
    int started = pool->num_started;
    pool->stop = 1;
    pool_publish(pool, 1);
    for (int i = 0; i < started; ++i) pthread_join(pool->workers[i].thread, NULL);
    pool->num_started = 0;
  }
  return rc;
}

void tlmrt_cpu_pool_destroy(tlmrt_cpu_pool* pool) {
  if (pool == NULL) return;
  /* In a forked child the workers are the parent's: there is nothing to stop or join. */
  if (pool->num_started > 0 && pool->fork_count == tlmrt_fork_count()) {
    pool->stop = 1;
    pool_publish(pool, 1);
    for (int i = 0; i < pool->num_started; ++i) pthread_join(pool->workers[i].thread, NULL);
  }
  free(pool->slots);
  free(pool->ranges);
  free(pool->workers);
  free(pool);
}

/* Tasks per thread of a dynamic pool's launch of num_task 0. TVM splits a parallel loop into num_task
 * contiguous blocks; with one block a thread, a thread that the OS delays (another tenant, a page
 * fault) makes every other wait for its whole half. Smaller blocks let the others take its share,
 * but cost a claim each: 4 a thread from 8 threads up, tried as the default, showed no effect on the
 * 16-core Xeon at 16 threads once both load orders were timed (BENCHMARKS.md 2026-12-06 23:15), so one it is.
 * TLMRT_CPU_TASKS_PER_THREAD overrides it (1..64) for measuring. */
#ifndef TLMRT_CPU_TASKS_PER_THREAD
#define TLMRT_CPU_TASKS_PER_THREAD 1
#endif
static int tasks_per_thread_set(void) { return getenv("TLMRT_CPU_TASKS_PER_THREAD") != NULL; }

static int tasks_per_thread(void) {
  const char* env = getenv("TLMRT_CPU_TASKS_PER_THREAD");
  int k = env != NULL ? atoi(env) : TLMRT_CPU_TASKS_PER_THREAD;
  return k >= 1 && k <= 64 ? k : TLMRT_CPU_TASKS_PER_THREAD;
}

static tlmrt_status pool_create(int num_threads, uint64_t spin_ns, int dynamic, tlmrt_cpu_pool** out, char* err,
                                size_t err_cap) {
  *out = NULL;
  tlmrt_cpu_pool* pool = (tlmrt_cpu_pool*)tlmrt_alloc_aligned(sizeof(tlmrt_cpu_pool));
  if (pool == NULL) return tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  memset(pool, 0, sizeof(*pool));
  pool->num_threads = num_threads;
  pool->spin_ns = spin_ns;
  uint64_t run_spin_ns = TLMRT_CPU_RUN_SPIN_NS;
  pool->run_spin_ns = spin_ns > 0 && run_spin_ns > spin_ns ? run_spin_ns : spin_ns;
  pool->dynamic = dynamic;
  pool->default_tasks = dynamic ? num_threads * tasks_per_thread() : num_threads;
  pool->barrier.spin_ns = spin_ns;
  atomic_init(&pool->generation, 0u);
  atomic_init(&pool->sleepers, 0);
  atomic_init(&pool->done_word, 0u);
  atomic_init(&pool->caller_sleeping, 0);
  atomic_init(&pool->failed, 0);
  atomic_init(&pool->in_use, 0u);
  atomic_init(&pool->tasks_done, 0u);
  atomic_init(&pool->claimed, 0u);
  atomic_init(&pool->flambda, NULL);
  atomic_init(&pool->cdata, NULL);
  atomic_init(&pool->num_task, 0);
  atomic_init(&pool->barrier.count, 0);
  atomic_init(&pool->barrier.generation, 0u);
  int num_workers = num_threads - 1;
  if (num_workers > 0) {
    pool->workers = (cpu_worker*)calloc((size_t)num_workers, sizeof(cpu_worker));
    pool->slots = (cpu_slot*)tlmrt_alloc_aligned((uint64_t)num_workers * sizeof(cpu_slot));
    pool->ranges = (cpu_range*)tlmrt_alloc_aligned((uint64_t)num_threads * sizeof(cpu_range));
    if (pool->workers == NULL || pool->slots == NULL || pool->ranges == NULL) {
      tlmrt_cpu_pool_destroy(pool);
      return tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (int i = 0; i < num_workers; ++i) atomic_init(&pool->slots[i].done, 0u);
    for (int i = 0; i < num_threads; ++i) atomic_init(&pool->ranges[i].word, 0u);  /* generation 0: no launch */
  }
  int rc = pool_start_workers(pool);
  if (rc != 0) {
    tlmrt_cpu_pool_destroy(pool);
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY, "cannot start %d worker threads: %s",
                        num_workers, strerror(rc));
  }
  *out = pool;
  return TLMRT_OK;
}

/* ---- workspace: a per-thread stack ------------------------------------------------------------ */

/* Each block is preceded by a 64-byte header. Blocks come back in reverse order in TVM's code; one
 * that comes back early is marked and popped with the block above it. A block that does not fit
 * comes from the heap, and the stack grows to the high-water mark once it is empty again. */
typedef struct {
  uint64_t below;  /* offset of the block below this one's header, or UINT64_MAX */
  uint32_t kind;   /* WS_STACK, WS_HEAP */
  uint32_t freed;
} ws_header;
enum { WS_STACK = 0x57537431u, WS_HEAP = 0x57534850u };
#define WS_HEADER 64u
#define WS_MIN_CAP (64u * 1024u)

typedef struct {
  uint8_t* base;
  uint64_t cap;
  uint64_t top;       /* bytes in use */
  uint64_t last;      /* offset of the top block's header, or UINT64_MAX */
  uint64_t want;      /* high-water mark, heap blocks included */
  uint64_t heap_live; /* heap blocks not yet freed */
} ws_stack;

static _Thread_local ws_stack tls_ws = {NULL, 0, 0, UINT64_MAX, 0, 0};
static pthread_key_t g_ws_key;
static pthread_once_t g_ws_once = PTHREAD_ONCE_INIT;
static int g_ws_key_ok = 0;

static void ws_thread_exit(void* base) { free(base); }
static void ws_key_create(void) { g_ws_key_ok = pthread_key_create(&g_ws_key, ws_thread_exit) == 0; }

/* The key's destructor lives in this library: delete it before the library is unloaded. */
__attribute__((destructor)) static void ws_key_delete(void) {
  if (g_ws_key_ok) pthread_key_delete(g_ws_key);
}

static void ws_grow(ws_stack* ws) {
  if (ws->top != 0 || ws->heap_live != 0 || ws->want <= ws->cap) return;
  uint64_t cap = ws->want < WS_MIN_CAP ? WS_MIN_CAP : ws->want + ws->want / 4u;
  uint8_t* base = (uint8_t*)tlmrt_alloc_aligned(cap);
  if (base == NULL) return;  /* keep the old stack; the heap serves what does not fit */
  pthread_once(&g_ws_once, ws_key_create);
  /* Without the key the buffer would leak at thread exit: keep serving from the heap. */
  if (!g_ws_key_ok || pthread_setspecific(g_ws_key, base) != 0) {
    free(base);
    return;
  }
  free(ws->base);
  ws->base = base;
  ws->cap = cap;
}

static void* cpu_alloc_workspace(int device_type, int device_id, uint64_t nbytes, int dtype_code_hint,
                                 int dtype_bits_hint) {
  (void)device_type;
  (void)device_id;
  (void)dtype_code_hint;
  (void)dtype_bits_hint;
  if (nbytes > UINT64_MAX / 2u || nbytes > (uint64_t)SIZE_MAX / 2u) return NULL;
  uint64_t size = WS_HEADER + ((nbytes + TLMRT_ALIGNMENT - 1u) & ~(uint64_t)(TLMRT_ALIGNMENT - 1u));
  ws_stack* ws = &tls_ws;
  uint64_t want = ws->top + size;
  if (want > ws->want) ws->want = want;
  ws_header* h;
  if (ws->base != NULL && size <= ws->cap - ws->top) {
    h = (ws_header*)(ws->base + ws->top);
    h->below = ws->last;
    h->kind = WS_STACK;
    h->freed = 0;
    ws->last = ws->top;
    ws->top += size;
  } else {
    h = (ws_header*)tlmrt_alloc_aligned(size);
    if (h == NULL) return NULL;
    h->below = UINT64_MAX;
    h->kind = WS_HEAP;
    h->freed = 0;
    ws->heap_live += 1;
  }
  return (uint8_t*)h + WS_HEADER;
}

static int cpu_free_workspace(int device_type, int device_id, void* ptr) {
  (void)device_type;
  (void)device_id;
  if (ptr == NULL) return 0;
  ws_stack* ws = &tls_ws;
  ws_header* h = (ws_header*)((uint8_t*)ptr - WS_HEADER);
  if (h->kind == WS_HEAP) {
    h->kind = 0;
    free(h);
    ws->heap_live -= 1;
  } else if (h->kind == WS_STACK && ws->base != NULL && (uint8_t*)h >= ws->base &&
             (uint8_t*)h < ws->base + ws->top) {
    h->freed = 1;
    /* Pop every freed block from the top. */
    while (ws->last != UINT64_MAX) {
      ws_header* top = (ws_header*)(ws->base + ws->last);
      if (!top->freed) break;
      top->kind = 0;
      ws->top = ws->last;
      ws->last = top->below;
    }
  } else {
    return -1;  /* not a block of this thread's workspace */
  }
  ws_grow(ws);
  return 0;
}

/* ---- hooks into a library, pool start ----------------------------------------------------------- */

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
  /* A library whose kernels never wait at a barrier lets threads claim tasks dynamically. */
  dlerror();
  int dynamic = dlsym(dl_handle, TLMRT_HOOK_PARALLEL_BARRIER) == NULL;
  tlmrt_cpu_pool* pool = NULL;
  tlmrt_status status = pool_create((int)n, n <= cores ? TLMRT_CPU_SPIN_NS : 0, dynamic, &pool, err, err_cap);
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

int tlmrt_cpu_pool_threads(const tlmrt_cpu_pool* pool) { return pool->num_threads; }

/* Takes the pool for the calling thread if no other thread holds it, rebuilding its workers first in
 * a forked child; else launches on this thread run serially until leave. */
tlmrt_cpu_pool* tlmrt_cpu_pool_enter(tlmrt_cpu_pool* pool) {
  tlmrt_cpu_pool* previous = tls_current_pool;
  tls_current_pool = NULL;
  tls_serial_tasks = 0;
  if (pool == NULL) return previous;
  /* A holder marked with an older fork count was a thread of a parent process: it does not exist
   * here, so its claim is void (the workers are restarted below anyway). */
  uint32_t mine = tlmrt_fork_count() + 1u;
  uint32_t held = 0;
  int got = atomic_compare_exchange_strong_explicit(&pool->in_use, &held, mine, memory_order_acquire,
                                                    memory_order_relaxed);
  if (!got && held != mine) {
    got = atomic_compare_exchange_strong_explicit(&pool->in_use, &held, mine, memory_order_acquire,
                                                  memory_order_relaxed);
  }
  if (!got) {
    tls_serial_tasks = pool->dynamic ? pool->default_tasks : 1;
    return previous;
  }
  if (pool->fork_count != mine - 1u && pool->num_threads > 1) {
    pool->num_started = 0;  /* the parent's threads: gone here */
    pool_start_workers(pool);  /* on failure num_started stays 0: launches run serially */
  }
  tls_current_pool = pool;
  return previous;
}

/* The task count of the next launches of num_task 0 on the pool this thread holds (0: its default).
 * Only a dynamic pool takes it: a static pool's barrier needs one task a thread. */
static void held_pool_set_launch_tasks(int n) {
  tlmrt_cpu_pool* pool = tls_current_pool;
  if (pool != NULL && pool->dynamic) pool->launch_tasks = n;
}

void tlmrt_cpu_pool_profile(tlmrt_step_counter* counters) {
  if (tls_current_pool != NULL) tls_current_pool->wait_prof = counters;
}

void tlmrt_cpu_pool_leave(tlmrt_cpu_pool* previous) {
  tlmrt_cpu_pool* held = tls_current_pool;
  tls_serial_tasks = 0;
  if (held != NULL) {
    held->wait_prof = NULL;
    atomic_store_explicit(&held->in_use, 0u, memory_order_release);
  }
  tls_current_pool = previous;
}

/* ---- the x86 model ---------------------------------------------------------------------------- */

#define MODEL_FILE "x86/model.so"

/* What every run shares: the code, the plan, the weights, the pool. */
typedef struct {
  void* dl_handle;
  const tlmrt_plan* plan;               /* lives in dl_handle's data; validated at open */
  tlmrt_plan_kernel_error_fn kernel_error;
  tlmrt_cpu_pool* pool;
  tlmrt_weights weights;
  int64_t* shapes;                      /* TLMRT_PLAN_MAX_NDIM per tensor */
  size_t* step_first_arg;               /* plan->num_steps */
  int* step_tasks;                      /* plan->num_steps launch task counts (0: the pool's default), or NULL */
  uint64_t total_args;
  int32_t* direct_outputs;              /* plan->num_outputs: the tensor a run may write in the caller's buffer, or -1 */
  int32_t* input_view_start;            /* plan->num_inputs + 1 offsets into input_views, or NULL: copy every input */
  int32_t* input_views;                 /* per input read in place: the input's tensor and its views */
  char description[64];
} cpu_model;

/* What one run in flight owns: the activation arena and the kernels' argument tables into it. */
typedef struct {
  uint8_t* arena;
  int own_arena;                        /* 0: the caller's (a dynamic-batch model's shared arena) */
  tlmrt_dltensor* tensors;              /* plan->num_tensors */
  tlmrt_ffi_any* args;                  /* every step's arguments, one after another */
} cpu_ctx;

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
  if (total_args > TLMRT_MAX_PLAN_ENTRIES) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT, "plan: expected at most %d step arguments, found %" PRIu64,
                        TLMRT_MAX_PLAN_ENTRIES, total_args);
  }
  *out_total_args = total_args;
  return TLMRT_OK;
}

/* The tables every context shares: shapes (the kernels read them, never write) and argument offsets. */
static tlmrt_status build_shared(cpu_model* m, char* err, size_t err_cap) {
  const tlmrt_plan* plan = m->plan;
  size_t nt = (size_t)plan->num_tensors;
  m->shapes = (int64_t*)calloc((nt > 0 ? nt : 1u) * TLMRT_PLAN_MAX_NDIM, sizeof(int64_t));
  m->step_first_arg = (size_t*)calloc(plan->num_steps > 0 ? (size_t)plan->num_steps : 1u, sizeof(size_t));
  if (m->shapes == NULL || m->step_first_arg == NULL) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY, "cannot allocate the tables for %d tensors",
                        plan->num_tensors);
  }
  for (size_t i = 0; i < nt; ++i) {
    const tlmrt_plan_tensor* pt = &plan->tensors[i];
    for (int32_t d = 0; d < pt->ndim; ++d) m->shapes[i * TLMRT_PLAN_MAX_NDIM + (size_t)d] = pt->shape[d];
  }
  size_t next = 0;
  for (int32_t s = 0; s < plan->num_steps; ++s) {
    m->step_first_arg[s] = next;
    next += (size_t)plan->steps[s].num_args;
  }
  return TLMRT_OK;
}

static int is_input_tensor(const tlmrt_plan* plan, int32_t t) {
  for (int32_t i = 0; i < plan->num_inputs; ++i) {
    if (plan->inputs[i].tensor == t) return 1;
  }
  return 0;
}

/* Which outputs a run may compute straight into the caller's buffer, instead of into the arena and
 * then copied out (GPT-2's 25.7 MB of logits: 3 ms a run). An output qualifies when the step that
 * first names it writes it (kernels take their outputs last: destination-passing style), it is not an
 * input nor another output's tensor, and no other tensor over its arena bytes is used at or after that
 * step (an alias would still be written or read in the arena; a tensor placed there earlier and dead
 * by then is not). Outputs count as used after the last step. The rest are copied, as before. */
static tlmrt_status find_direct_outputs(cpu_model* m, char* err, size_t err_cap) {
  const tlmrt_plan* plan = m->plan;
  size_t nt = plan->num_tensors > 0 ? (size_t)plan->num_tensors : 1u;
  m->direct_outputs = (int32_t*)malloc((plan->num_outputs > 0 ? (size_t)plan->num_outputs : 1u) * sizeof(int32_t));
  int32_t* first = (int32_t*)malloc(nt * sizeof(int32_t)); /* the first and last step naming each tensor */
  int32_t* last = (int32_t*)malloc(nt * sizeof(int32_t));
  if (m->direct_outputs == NULL || first == NULL || last == NULL) {
    free(first);
    free(last);
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  }
  for (size_t u = 0; u < nt; ++u) {
    first[u] = plan->num_steps;
    last[u] = -1;
  }
  for (int32_t s = 0; s < plan->num_steps; ++s) {
    const tlmrt_plan_step* st = &plan->steps[s];
    for (int32_t a = 0; a < st->num_args; ++a) {
      int32_t u = st->args[a];
      if (s < first[u]) first[u] = s;
      last[u] = s;
    }
  }
  for (int32_t j = 0; j < plan->num_outputs; ++j) last[plan->outputs[j].tensor] = plan->num_steps;
  for (int32_t i = 0; i < plan->num_outputs; ++i) {
    int32_t t = plan->outputs[i].tensor;
    const tlmrt_plan_tensor* out = &plan->tensors[t];
    int32_t w = first[t];
    int ok = out->storage == TLMRT_STORAGE_ARENA && out->nbytes > 0 && w < plan->num_steps &&
             plan->steps[w].args[plan->steps[w].num_args - 1] == t && !is_input_tensor(plan, t);
    for (int32_t j = 0; ok && j < plan->num_outputs; ++j) ok = j == i || plan->outputs[j].tensor != t;
    for (int32_t u = 0; ok && u < plan->num_tensors; ++u) {
      const tlmrt_plan_tensor* other = &plan->tensors[u];
      if (u == t || other->storage != TLMRT_STORAGE_ARENA || other->nbytes == 0) continue;
      if (other->offset >= out->offset + out->nbytes || out->offset >= other->offset + other->nbytes) continue;
      ok = last[u] < w;
    }
    m->direct_outputs[i] = ok ? t : -1;
  }
  free(first);
  free(last);
  return TLMRT_OK;
}

/* Which inputs a run may read in the caller's buffer instead of copying them into the arena (a
 * 602 KB image: 70 us a run). An input qualifies when the plan names every tensor's base
 * (<plan>_tensor_bases), so that its views can point there too, and neither it nor a view of it is
 * an output (outputs are copied out of the arena). Other tensors placed over its arena bytes after
 * its last use keep the arena. Kernels never write an input: every output is a tensor of its own. */
static tlmrt_status find_direct_inputs(cpu_model* m, const char* plan_symbol, char* err, size_t err_cap) {
  const tlmrt_plan* plan = m->plan;
  char name[256];
  if ((size_t)snprintf(name, sizeof(name), "%s%s", plan_symbol, TLMRT_PLAN_TENSOR_BASES_SUFFIX) >= sizeof(name))
    return TLMRT_OK;
  dlerror();
  void* sym = dlsym(m->dl_handle, name);
  if (sym == NULL) return TLMRT_OK;  /* an older plan: inputs are copied */
  tlmrt_plan_tensor_bases_fn get_bases;
  memcpy(&get_bases, &sym, sizeof(get_bases));
  const int32_t* base = get_bases();
  if (base == NULL) return TLMRT_OK;
  for (int32_t u = 0; u < plan->num_tensors; ++u) {
    const tlmrt_plan_tensor* tu = &plan->tensors[u];
    int32_t b = base[u];
    if (b < 0 || b >= plan->num_tensors) {
      return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT, "%s: tensor %d's base expected 0..%d, found %d", name, u,
                          plan->num_tensors - 1, b);
    }
    const tlmrt_plan_tensor* tb = &plan->tensors[b];
    if (base[b] != b || tb->storage != tu->storage || tu->offset < tb->offset ||
        tu->offset + tu->nbytes > tb->offset + tb->nbytes) {
      return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                          "%s: tensor %d is not a view inside its base %d (a base of its own, same storage, "
                          "within its bytes)", name, u, b);
    }
  }
  int32_t n_in = plan->num_inputs;
  m->input_view_start = (int32_t*)calloc((size_t)n_in + 1u, sizeof(int32_t));
  m->input_views = (int32_t*)malloc((plan->num_tensors > 0 ? (size_t)plan->num_tensors : 1u) * sizeof(int32_t));
  if (m->input_view_start == NULL || m->input_views == NULL)
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  int32_t next = 0;
  for (int32_t i = 0; i < n_in; ++i) {
    int32_t t = plan->inputs[i].tensor;
    int32_t first = next;
    int ok = base[t] == t && plan->tensors[t].storage == TLMRT_STORAGE_ARENA && plan->tensors[t].nbytes > 0;
    for (int32_t j = 0; ok && j < i; ++j) ok = base[plan->inputs[j].tensor] != t;
    for (int32_t o = 0; ok && o < plan->num_outputs; ++o) ok = base[plan->outputs[o].tensor] != t;
    for (int32_t u = 0; ok && u < plan->num_tensors; ++u) {
      if (base[u] == t) m->input_views[next++] = u;
    }
    if (!ok) next = first;
    m->input_view_start[i + 1] = next;
  }
  return TLMRT_OK;
}

static void cpu_ctx_destroy(void* state, void* ctx) {
  (void)state;
  cpu_ctx* c = (cpu_ctx*)ctx;
  if (c == NULL) return;
  free(c->args);
  free(c->tensors);
  if (c->own_arena) free(c->arena);
  free(c);
}

static tlmrt_status cpu_ctx_create(void* state, void* arena, void** out_ctx, char* err, size_t err_cap) {
  cpu_model* m = (cpu_model*)state;
  const tlmrt_plan* plan = m->plan;
  *out_ctx = NULL;
  size_t nt = (size_t)plan->num_tensors;
  cpu_ctx* c = (cpu_ctx*)calloc(1, sizeof(cpu_ctx));
  if (c == NULL) return tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  c->own_arena = arena == NULL;
  c->arena = arena != NULL ? (uint8_t*)arena : (uint8_t*)tlmrt_alloc_large(plan->arena_bytes);
  c->tensors = (tlmrt_dltensor*)calloc(nt > 0 ? nt : 1u, sizeof(tlmrt_dltensor));
  c->args = (tlmrt_ffi_any*)calloc(m->total_args > 0 ? (size_t)m->total_args : 1u, sizeof(tlmrt_ffi_any));
  if (c->arena == NULL || c->tensors == NULL || c->args == NULL) {
    cpu_ctx_destroy(state, c);
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY,
                        "cannot allocate the arena (%" PRIu64 " bytes) and tables for %d tensors",
                        plan->arena_bytes, plan->num_tensors);
  }
  uint64_t arena_alloc = plan->arena_bytes == 0 ? TLMRT_ALIGNMENT
                                                : (plan->arena_bytes + TLMRT_ALIGNMENT - 1u) & ~(uint64_t)(TLMRT_ALIGNMENT - 1u);
  if (c->own_arena) memset(c->arena, 0, (size_t)arena_alloc);  /* a caller's arena comes zeroed */
  for (size_t i = 0; i < nt; ++i) {
    const tlmrt_plan_tensor* pt = &plan->tensors[i];
    tlmrt_dltensor* t = &c->tensors[i];
    /* The weights are mapped read-only: the kernels only read constants (a write would fault). */
    uint8_t* base = pt->storage == TLMRT_STORAGE_ARENA ? c->arena : (uint8_t*)(uintptr_t)m->weights.data;
    t->data = base + pt->offset;
    t->device.device_type = TLMRT_DL_CPU;
    t->device.device_id = 0;
    t->ndim = pt->ndim;
    t->dtype.code = pt->dtype_code;
    t->dtype.bits = pt->dtype_bits;
    t->dtype.lanes = pt->dtype_lanes;
    t->shape = &m->shapes[i * TLMRT_PLAN_MAX_NDIM];
    t->strides = NULL;
    t->byte_offset = 0;
  }
  for (int32_t s = 0; s < plan->num_steps; ++s) {
    const tlmrt_plan_step* st = &plan->steps[s];
    tlmrt_ffi_any* any = &c->args[m->step_first_arg[s]];
    for (int32_t a = 0; a < st->num_args; ++a) {
      any[a].type_index = TLMRT_FFI_TYPE_DLTENSOR_PTR;
      any[a].zero_padding = 0;
      any[a].v.v_ptr = &c->tensors[st->args[a]];
    }
  }
  *out_ctx = c;
  return TLMRT_OK;
}

static void cpu_close(void* state) {
  cpu_model* m = (cpu_model*)state;
  if (m == NULL) return;
  /* Threads first: nothing may call into the library once it is unloaded. */
  tlmrt_cpu_pool_destroy(m->pool);
  if (m->dl_handle != NULL) dlclose(m->dl_handle);
  free(m->step_first_arg);
  free(m->step_tasks);
  free(m->direct_outputs);
  free(m->input_view_start);
  free(m->input_views);
  free(m->shapes);
  tlmrt_release_weights(&m->weights);
  free(m);
}

/* Open, in this order, so that no code from the artifact runs before it is checked:
 *   1. map the plan's weights (x86/weights.bin when the artifact has it: the x86 kernels' own,
 *      pre-packed copy; else the shared weights.bin) read-only, and hash them from the mapping;
 *   2. if opts.verify_files, check SHA256SUMS (weights.bin's digest comes from step 1, so the bytes
 *      checked are the bytes used);
 *   3. dlopen x86/model.so (RTLD_NOW | RTLD_LOCAL), get the plan, validate all of it, and compare
 *      weights.bin's size and sha256 with the plan's (always, whatever verify_files says);
 *   4. build the tables that every run shares (the core then makes the first run's context:
 *      the arena, one DLTensor per plan tensor and one TVMFFIAny array per step);
 *   5. fill the kernel hooks and start the threads. */
/* A step of `mflop` million operations run on `threads` threads: about TLMRT_CPU_STEP_MFLOP_PER_TASK
 * a task, between one and TLMRT_CPU_STEP_MAX_TASKS_PER_THREAD tasks a thread (0 for one a thread: the
 * pool's default). */
#define TLMRT_CPU_STEP_MFLOP_PER_TASK 2u
#define TLMRT_CPU_STEP_MAX_TASKS_PER_THREAD 8u
static int step_tasks(uint32_t mflop, int threads) {
  if (mflop == 0 || threads <= 1) return 0;
  uint32_t per_thread = mflop / ((uint32_t)threads * TLMRT_CPU_STEP_MFLOP_PER_TASK);
  if (per_thread > TLMRT_CPU_STEP_MAX_TASKS_PER_THREAD) per_thread = TLMRT_CPU_STEP_MAX_TASKS_PER_THREAD;
  return per_thread <= 1 ? 0 : threads * (int)per_thread;
}

/* The plan's optional step work (tlmrt_plan.h) as launch task counts for this thread count. Off when
 * TLMRT_CPU_TASKS_PER_THREAD sets one count for every launch, or TLMRT_CPU_STEP_TASKS=0 (measuring). */
static tlmrt_status load_step_tasks(cpu_model* m, const char* plan_symbol, int threads, char* err, size_t err_cap) {
  const char* off = getenv("TLMRT_CPU_STEP_TASKS");
  if (tasks_per_thread_set() || (off != NULL && strcmp(off, "0") == 0)) return TLMRT_OK;
  char name[256];
  if ((size_t)snprintf(name, sizeof(name), "%s%s", plan_symbol, TLMRT_PLAN_STEP_WORK_SUFFIX) >= sizeof(name))
    return TLMRT_OK;
  dlerror();
  void* sym = dlsym(m->dl_handle, name);
  if (sym == NULL) return TLMRT_OK;  /* an older plan, or no step worth splitting */
  tlmrt_plan_step_work_fn get_work;
  memcpy(&get_work, &sym, sizeof(get_work));
  const uint32_t* work = get_work();
  if (work == NULL) return TLMRT_OK;
  m->step_tasks = (int*)calloc(m->plan->num_steps > 0 ? (size_t)m->plan->num_steps : 1u, sizeof(int));
  if (m->step_tasks == NULL) return tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  for (int32_t i = 0; i < m->plan->num_steps; ++i) m->step_tasks[i] = step_tasks(work[i], threads);
  return TLMRT_OK;
}

static tlmrt_status cpu_open(const char* dir, const tlmrt_options* opts, const char* plan_symbol, void** out_state,
                             tlmrt_plan_tables* tables, char* err, size_t err_cap) {
  int single_plan = plan_symbol == NULL;
  if (plan_symbol == NULL) plan_symbol = TLMRT_PLAN_SYMBOL;
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
  /* A model of one plan copies its weights onto huge pages; a dynamic-batch model's plans each open
   * the file, so they keep sharing its page cache instead of holding one copy each. */
  int private_copy = single_plan && tlmrt_huge_pages_wanted();
  tlmrt_status s = tlmrt_load_weights(dir, weights_file, private_copy, &m->weights, err, err_cap);
  if (s != TLMRT_OK) goto fail;
  if (opts->verify_files) {
    const char* must[] = {MODEL_FILE, weights_file};
    const char* known_names[] = {weights_file};
    const char* known_hex[] = {m->weights.sha256};
    s = tlmrt_verify_sha256sums(dir, must, 2, known_names, known_hex, 1, err, err_cap);
    if (s != TLMRT_OK) goto fail;
  }
  void* sym = NULL;
  s = tlmrt_open_library(dir, MODEL_FILE, plan_symbol, &m->dl_handle, &sym, err, err_cap);
  if (s != TLMRT_OK) goto fail;
  tlmrt_plan_get_fn get_plan;
  memcpy(&get_plan, &sym, sizeof(get_plan));
  m->plan = get_plan();
  if (m->plan == NULL) {
    s = tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                     MODEL_FILE ": %s() expected to return a plan, returned NULL", plan_symbol);
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

  s = validate_plan(m->plan, &m->weights, &m->total_args, err, err_cap);
  if (s != TLMRT_OK) goto fail;
  s = build_shared(m, err, err_cap);
  if (s != TLMRT_OK) goto fail;
  s = find_direct_outputs(m, err, err_cap);
  if (s != TLMRT_OK) goto fail;
  s = find_direct_inputs(m, plan_symbol, err, err_cap);
  if (s != TLMRT_OK) goto fail;
  s = tlmrt_cpu_pool_start(opts->num_threads, m->dl_handle, MODEL_FILE, &m->pool, err, err_cap);
  if (s != TLMRT_OK) goto fail;
  int nthreads = tlmrt_cpu_pool_threads(m->pool);
  s = load_step_tasks(m, plan_symbol, nthreads, err, err_cap);
  if (s != TLMRT_OK) goto fail;
  snprintf(m->description, sizeof(m->description), "cpu (%d thread%s)", nthreads, nthreads == 1 ? "" : "s");
  *tables = plan_tables(m->plan);
  *out_state = m;
  return TLMRT_OK;
fail:
  cpu_close(m);
  return s;
}

/* Points input i's tensor and its views at `caller` (the caller's buffer), or back at the arena for NULL. */
static void point_input_views(const cpu_model* m, cpu_ctx* c, int32_t i, uint8_t* caller) {
  const tlmrt_plan* plan = m->plan;
  const tlmrt_plan_tensor* in = &plan->tensors[plan->inputs[i].tensor];
  for (int32_t k = m->input_view_start[i]; k < m->input_view_start[i + 1]; ++k) {
    int32_t u = m->input_views[k];
    uint64_t offset = plan->tensors[u].offset;
    c->tensors[u].data = caller != NULL ? caller + (offset - in->offset) : c->arena + offset;
  }
}

static tlmrt_status cpu_run(void* state, void* ctx, const tlmrt_io* inputs, const tlmrt_io* outputs,
                            tlmrt_step_counter* prof, char* err, size_t err_cap) {
  cpu_model* m = (cpu_model*)state;
  cpu_ctx* c = (cpu_ctx*)ctx;
  const tlmrt_plan* plan = m->plan;
  uint64_t io0 = prof != NULL ? tlmrt_now_ns() : 0;
  /* Inputs read in place: the input and its views point into the caller's buffer for this run, when
   * it is 64-byte aligned as the kernels assume; else the input is copied into the arena. Both set
   * every run (a context held at fork() comes to the child mid-run). */
  for (int32_t i = 0; i < plan->num_inputs; ++i) {
    const tlmrt_plan_tensor* t = &plan->tensors[plan->inputs[i].tensor];
    int in_place = m->input_view_start != NULL && m->input_view_start[i] < m->input_view_start[i + 1] &&
                   ((uintptr_t)inputs[i].data & (TLMRT_ALIGNMENT - 1u)) == 0;
    if (m->input_view_start != NULL) point_input_views(m, c, i, in_place ? (uint8_t*)inputs[i].data : NULL);
    if (!in_place && t->nbytes > 0) memcpy(c->arena + t->offset, inputs[i].data, (size_t)t->nbytes);
  }
  /* Outputs computed in place: the caller's buffer stands in for the arena's bytes for this run. The
   * kernels assume 64-byte aligned tensors, so a buffer that is not takes the copy instead. Set every
   * run, never left from the last: a context a thread held at fork() comes to the child mid-run. */
  for (int32_t i = 0; i < plan->num_outputs; ++i) {
    int32_t t = m->direct_outputs[i];
    if (t < 0) continue;
    int in_place = outputs[i].data != NULL && ((uintptr_t)outputs[i].data & (TLMRT_ALIGNMENT - 1u)) == 0;
    c->tensors[t].data = in_place ? outputs[i].data : c->arena + plan->tensors[t].offset;
  }
  if (prof != NULL) atomic_fetch_add_explicit(&prof[plan->num_steps].ns, tlmrt_now_ns() - io0, memory_order_relaxed);

  tlmrt_status s = TLMRT_OK;
  tlmrt_cpu_pool* saved = tlmrt_cpu_pool_enter(m->pool);
  if (prof != NULL) tlmrt_cpu_pool_profile(&prof[plan->num_steps + 1]);  /* and + 2 */
  for (int32_t i = 0; i < plan->num_steps; ++i) {
    const tlmrt_plan_step* st = &plan->steps[i];
    tlmrt_ffi_any result;
    memset(&result, 0, sizeof(result));
    if (m->step_tasks != NULL) held_pool_set_launch_tasks(m->step_tasks[i]);
    uint64_t t0 = prof != NULL ? tlmrt_now_ns() : 0;
    int32_t rc = st->fn(NULL, &c->args[m->step_first_arg[i]], st->num_args, &result);
    if (prof != NULL) {
      uint64_t t1 = tlmrt_now_ns();
      atomic_fetch_add_explicit(&prof[i].calls, 1u, memory_order_relaxed);
      atomic_fetch_add_explicit(&prof[i].ns, t1 - t0, memory_order_relaxed);
      atomic_store_explicit(&prof[i].last_start, t0 - io0, memory_order_relaxed);
      atomic_store_explicit(&prof[i].last_ns, t1 - t0, memory_order_relaxed);
    }
    if (rc != 0) {
      const char* why = m->kernel_error != NULL ? m->kernel_error() : NULL;
      s = tlmrt_errorf(err, err_cap, TLMRT_ERR_KERNEL, "kernel %.200s (step %d) failed: %s", st->kernel, i,
                       (why != NULL && why[0] != '\0') ? why : "(the kernel left no message)");
      break;
    }
  }
  if (m->step_tasks != NULL) held_pool_set_launch_tasks(0);
  tlmrt_cpu_pool_leave(saved);
  io0 = prof != NULL ? tlmrt_now_ns() : 0;
  for (int32_t i = 0; m->input_view_start != NULL && i < plan->num_inputs; ++i) point_input_views(m, c, i, NULL);
  for (int32_t i = 0; i < plan->num_outputs; ++i) {
    const tlmrt_plan_tensor* t = &plan->tensors[plan->outputs[i].tensor];
    uint8_t* home = c->arena + t->offset;
    if (m->direct_outputs[i] >= 0 && c->tensors[m->direct_outputs[i]].data != home) {
      c->tensors[m->direct_outputs[i]].data = home;  /* written in place: back to the arena for the next run */
    } else if (s == TLMRT_OK && outputs[i].data != NULL && t->nbytes > 0) {
      memcpy(outputs[i].data, home, (size_t)t->nbytes);
    }
  }
  if (s != TLMRT_OK) return s;
  if (prof != NULL) {
    atomic_fetch_add_explicit(&prof[plan->num_steps].calls, 1u, memory_order_relaxed);
    atomic_fetch_add_explicit(&prof[plan->num_steps].ns, tlmrt_now_ns() - io0, memory_order_relaxed);
  }
  return TLMRT_OK;
}

static void cpu_output_buffer(void* state, void* ctx, int32_t index, tlmrt_io* out) {
  cpu_model* m = (cpu_model*)state;
  cpu_ctx* c = (cpu_ctx*)ctx;
  const tlmrt_plan_tensor* t = &m->plan->tensors[m->plan->outputs[index].tensor];
  out->data = c->arena + t->offset;
  out->nbytes = t->nbytes;
  out->device_type = TLMRT_DEVICE_CPU;
  out->device_id = 0;
}

static void* cpu_stream(void* state) {
  (void)state;
  return NULL;
}

static const char* cpu_describe(void* state) { return ((cpu_model*)state)->description; }

static uint64_t cpu_arena_bytes(void* state) { return ((cpu_model*)state)->plan->arena_bytes; }

static int32_t cpu_num_steps(void* state) { return ((cpu_model*)state)->plan->num_steps; }

static void cpu_step_name(void* state, int32_t step, const char** kernel, const char** task) {
  const char* name = ((cpu_model*)state)->plan->steps[step].kernel;
  *kernel = name;
  *task = name;
}

/* Many runs of one model at once: each takes a context; the first to come takes the pool, the others
 * run their kernels on their own threads. */
#define CPU_MAX_CONTEXTS 64

const tlmrt_backend tlmrt_backend_cpu = {
    "cpu",          TLMRT_DEVICE_CPU, CPU_MAX_CONTEXTS, cpu_open,      cpu_close,     cpu_ctx_create,
    cpu_ctx_destroy, cpu_run,          cpu_output_buffer, cpu_stream,  NULL,          cpu_describe,
    cpu_num_steps,
    cpu_step_name,  NULL,             cpu_arena_bytes,   1,
};
