/*
 * test_threads.c — one model, many threads, and fork(), over the fake artifact of tests/c/fake_plan.c.
 *
 *   test_threads ARTIFACT_DIR POOL_THREADS CALLER_THREADS RUNS_PER_THREAD [--no-fork]
 *
 * 1. Runs once on the calling thread for the reference outputs.
 * 2. CALLER_THREADS threads each run the one model RUNS_PER_THREAD times with inputs of their own,
 *    at the same time, and check every output against the reference computed the same way.
 * 3. fork(): the child runs the model (opened and run before the fork) and checks the outputs; the
 *    parent waits at most 30 s for it (a child that hangs is killed and reported). Then again while
 *    two other threads are in the middle of runs (the child inherits a pool and contexts held by
 *    threads it does not have).
 * 4. Profiling on: the counters count every step of every run.
 * Exit 0 and "ALL_OK", or 1 and "FAIL ..." lines. Built with -fsanitize=thread by ci_sanitize.sh, which
 * passes --no-fork (ThreadSanitizer does not support fork() in a process with threads).
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tlmrt.h"

#define N 1000
#define HITS 64

static void fill(float* x, uint32_t seed) {
  for (int i = 0; i < N; ++i) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = (float)(seed >> 8) / 16777216.0f * 2.0f - 1.0f;
  }
}

/* y = reverse((x + w) * 2), w[i] = i / 4: what fake_plan.c computes. */
static int check_y(const float* x, const float* y) {
  for (int i = 0; i < N; ++i) {
    int j = N - 1 - i;
    if (y[i] != (x[j] + (float)j * 0.25f) * 2.0f) return 0;
  }
  return 1;
}

/* Set in a forked child: every run must have had the pool (all of its tasks). */
static int g_strict_tasks = 0;

/* One run with inputs from seed; 0 when the outputs are right. */
static int run_once(tlmrt_model* m, uint32_t seed, int tasks, char* why, size_t cap) {
  float x[N], y[N];
  int32_t hits[HITS];
  fill(x, seed);
  const void* in[1] = {x};
  uint64_t in_n[1] = {sizeof(x)};
  void* out[2] = {y, hits};
  uint64_t out_n[2] = {sizeof(y), sizeof(hits)};
  tlmrt_status s = tlmrt_model_run(m, in, in_n, out, out_n);
  if (s != TLMRT_OK) {
    snprintf(why, cap, "status %d: %s", (int)s, tlmrt_model_last_error(m));
    return 1;
  }
  if (!check_y(x, y)) {
    snprintf(why, cap, "wrong y for seed %u", seed);
    return 1;
  }
  /* A run that had the pool sees `tasks` tasks; one whose kernels ran on its own thread sees 1. */
  if (hits[HITS - 1] != tasks && (hits[HITS - 1] != 1 || g_strict_tasks)) {
    snprintf(why, cap, "the tasks saw num_task %d, expected %d or 1", hits[HITS - 1], tasks);
    return 1;
  }
  for (int t = 0; t < hits[HITS - 1]; ++t) {
    if (hits[t] != 1) {
      snprintf(why, cap, "task %d ran %d times", t, hits[t]);
      return 1;
    }
  }
  return 0;
}

typedef struct {
  tlmrt_model* m;
  int index;
  int runs;
  int tasks;
  int failures;
  char why[512];
} worker_arg;

static void* worker(void* p) {
  worker_arg* a = (worker_arg*)p;
  for (int r = 0; r < a->runs && a->failures == 0; ++r) {
    a->failures += run_once(a->m, (uint32_t)(a->index * 100003 + r), a->tasks, a->why, sizeof(a->why));
  }
  return NULL;
}

int main(int argc, char** argv) {
  if (argc != 5 && !(argc == 6 && strcmp(argv[5], "--no-fork") == 0)) {
    fprintf(stderr, "usage: %s ARTIFACT_DIR POOL_THREADS CALLER_THREADS RUNS_PER_THREAD [--no-fork]\n", argv[0]);
    return 2;
  }
  setvbuf(stdout, NULL, _IONBF, 0);
  const char* dir = argv[1];
  int pool_threads = atoi(argv[2]);
  int callers = atoi(argv[3]);
  int runs = atoi(argv[4]);
  if (pool_threads < 1 || callers < 1 || callers > 64 || runs < 1) {
    fprintf(stderr, "POOL_THREADS >= 1, CALLER_THREADS in 1..64, RUNS_PER_THREAD >= 1\n");
    return 2;
  }
  int failures = 0;
  tlmrt_options opts;
  tlmrt_options_init(&opts);
  opts.num_threads = pool_threads;
  tlmrt_model* m = NULL;
  if (tlmrt_model_open(dir, &opts, &m) != TLMRT_OK) {
    printf("FAIL open: %s\n", tlmrt_open_error());
    return 1;
  }
  char why[512];
  if (run_once(m, 1, pool_threads, why, sizeof(why)) != 0) {
    printf("FAIL first run: %s\n", why);
    ++failures;
  }

  /* many threads, one model */
  worker_arg* args = (worker_arg*)calloc((size_t)callers, sizeof(worker_arg));
  pthread_t* th = (pthread_t*)calloc((size_t)callers, sizeof(pthread_t));
  if (args == NULL || th == NULL) return 1;
  for (int i = 0; i < callers; ++i) {
    args[i] = (worker_arg){m, i, runs, pool_threads, 0, ""};
    if (pthread_create(&th[i], NULL, worker, &args[i]) != 0) {
      printf("FAIL pthread_create\n");
      return 1;
    }
  }
  for (int i = 0; i < callers; ++i) {
    pthread_join(th[i], NULL);
    if (args[i].failures != 0) {
      printf("FAIL thread %d: %s\n", i, args[i].why);
      failures += args[i].failures;
    }
  }
  printf("THREADS: %d threads x %d runs\n", callers, runs);
  free(th);
  free(args);

  /* fork after the model has run: the child must run it too */
  pid_t pid = argc == 6 ? 1 : fork();
  if (pid < 0) {
    printf("FAIL fork\n");
    return 1;
  }
  if (pid == 0) {
    int bad = 0;
    for (int r = 0; r < 20 && bad == 0; ++r) bad += run_once(m, 7000u + (uint32_t)r, pool_threads, why, sizeof(why));
    if (bad) printf("FAIL in the child: %s\n", why);
    tlmrt_model_close(m);
    _exit(bad ? 1 : 0);
  }
  int status = 0;
  pid_t done = argc == 6 ? 1 : 0;
  for (int waited = 0; waited < 3000 && done == 0; ++waited) {
    done = waitpid(pid, &status, WNOHANG);
    if (done == 0) nanosleep(&(struct timespec){0, 10000000}, NULL);
  }
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    printf("FAIL the forked child hung running the model\n");
    ++failures;
  } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    printf("FAIL the forked child failed (status %d)\n", status);
    ++failures;
  } else if (argc == 5) {
    printf("FORK: the child ran the model\n");
  }
  /* fork while other threads are in the middle of runs: the child has a pool (and contexts) held by
   * threads that do not exist there; it must still run (on contexts of its own, kernels serially) */
  if (argc == 5) {
    worker_arg busy[2] = {{m, 90, 400, pool_threads, 0, ""}, {m, 91, 400, pool_threads, 0, ""}};
    pthread_t bt[2];
    for (int i = 0; i < 2; ++i) pthread_create(&bt[i], NULL, worker, &busy[i]);
    nanosleep(&(struct timespec){0, 2000000}, NULL);
    pid_t busy_pid = fork();
    if (busy_pid == 0) {
      g_strict_tasks = 1;  /* the pool and contexts held by the parent's threads are free here */
      int bad = 0;
      for (int r = 0; r < 20 && bad == 0; ++r) bad += run_once(m, 8000u + (uint32_t)r, pool_threads, why, sizeof(why));
      if (bad) printf("FAIL in the child forked during runs: %s\n", why);
      _exit(bad ? 1 : 0);
    }
    int bstatus = 0;
    pid_t bdone = 0;
    for (int waited = 0; waited < 3000 && bdone == 0 && busy_pid > 0; ++waited) {
      bdone = waitpid(busy_pid, &bstatus, WNOHANG);
      if (bdone == 0) nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    if (busy_pid < 0 || bdone == 0) {
      if (busy_pid > 0) {
        kill(busy_pid, SIGKILL);
        waitpid(busy_pid, &bstatus, 0);
      }
      printf("FAIL the child forked during runs hung (or fork failed)\n");
      ++failures;
    } else if (!WIFEXITED(bstatus) || WEXITSTATUS(bstatus) != 0) {
      printf("FAIL the child forked during runs failed (status %d)\n", bstatus);
      ++failures;
    } else {
      printf("FORK_BUSY: the child forked during runs ran the model\n");
    }
    for (int i = 0; i < 2; ++i) {
      pthread_join(bt[i], NULL);
      if (busy[i].failures) {
        printf("FAIL busy thread %d: %s\n", i, busy[i].why);
        ++failures;
      }
    }
  }

  /* and the parent still runs it */
  if (run_once(m, 2, pool_threads, why, sizeof(why)) != 0) {
    printf("FAIL run after fork in the parent: %s\n", why);
    ++failures;
  }

  /* profiling */
  tlmrt_profile prof;
  if (tlmrt_model_set_profiling(m, 1) != TLMRT_OK || tlmrt_model_get_profile(m, &prof) != TLMRT_OK ||
      prof.enabled != 1 || prof.runs != 0 || prof.num_steps != 2) {
    printf("FAIL profiling on: %s\n", tlmrt_model_last_error(m));
    ++failures;
  }
  for (int r = 0; r < 5; ++r) failures += run_once(m, 3u + (uint32_t)r, pool_threads, why, sizeof(why));
  tlmrt_profile_step step;
  if (tlmrt_model_get_profile(m, &prof) != TLMRT_OK || prof.runs != 5 || prof.run_ns < prof.kernel_ns) {
    printf("FAIL profile: runs %llu run_ns %llu kernel_ns %llu\n", (unsigned long long)prof.runs,
           (unsigned long long)prof.run_ns, (unsigned long long)prof.kernel_ns);
    ++failures;
  }
  for (int i = 0; i < prof.num_steps; ++i) {
    if (tlmrt_model_get_profile_step(m, i, &step) != TLMRT_OK || step.calls != 5 || step.kernel == NULL) {
      printf("FAIL profile step %d\n", i);
      ++failures;
    } else {
      printf("PROFILE step %d %s calls %llu ns %llu\n", i, step.kernel, (unsigned long long)step.calls,
             (unsigned long long)step.total_ns);
    }
  }
  if (tlmrt_model_get_profile_step(m, prof.num_steps, &step) != TLMRT_ERR_INVALID_ARGUMENT) {
    printf("FAIL profile step out of range accepted\n");
    ++failures;
  }
  printf("PROFILE runs %llu run_ns %llu kernel_ns %llu\n", (unsigned long long)prof.runs,
         (unsigned long long)prof.run_ns, (unsigned long long)prof.kernel_ns);
  tlmrt_model_set_profiling(m, 0);
  tlmrt_model_close(m);
  if (failures != 0) {
    printf("FAILURES: %d\n", failures);
    return 1;
  }
  printf("ALL_OK\n");
  return 0;
}
