/*
 * runtime_overhead.c — how long one run of an extracted artifact takes through the C API, and (with a
 * runtime that has the profiler, API version 4) how much of it is spent outside the kernels.
 *
 *   cc -std=c11 -O2 -Iruntime_c bench/c/runtime_overhead.c -o ro -Lout -ltlmrt -Wl,-rpath,out [-DTLMRT_PROFILE]
 *   ./ro ARTIFACT_DIR THREADS RUNS
 *
 * Inputs are zeros (timing only). Prints the median and minimum wall time per run over RUNS warm runs
 * (after 5 warm-up runs) and, with -DTLMRT_PROFILE, a second block of RUNS profiled runs: run_ns and
 * kernel_ns per run, their difference (the time outside kernels) and the kernel calls per run.
 * bench/runtime_overhead.py builds and runs it against two libtlmrt.so builds.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tlmrt.h"

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s ARTIFACT_DIR THREADS RUNS\n", argv[0]);
    return 2;
  }
  int runs = atoi(argv[3]);
  if (runs < 1) return 2;
  tlmrt_options opts;
  tlmrt_options_init(&opts);
  opts.num_threads = atoi(argv[2]);
  tlmrt_model* m = NULL;
  if (tlmrt_model_open(argv[1], &opts, &m) != TLMRT_OK) {
    fprintf(stderr, "open: %s\n", tlmrt_open_error());
    return 1;
  }
  int ni = tlmrt_model_num_inputs(m), no = tlmrt_model_num_outputs(m);
  const void** in = calloc((size_t)ni + 1, sizeof(void*));
  void** out = calloc((size_t)no + 1, sizeof(void*));
  uint64_t* in_n = calloc((size_t)ni + 1, sizeof(uint64_t));
  uint64_t* out_n = calloc((size_t)no + 1, sizeof(uint64_t));
  double* t = calloc((size_t)runs, sizeof(double));
  if (in == NULL || out == NULL || in_n == NULL || out_n == NULL || t == NULL) return 1;
  for (int i = 0; i < ni; ++i) {
    tlmrt_tensor_info info;
    if (tlmrt_model_input_info(m, i, &info) != TLMRT_OK) return 1;
    in[i] = calloc(1, info.nbytes + 1);
    in_n[i] = info.nbytes;
  }
  for (int i = 0; i < no; ++i) {
    tlmrt_tensor_info info;
    if (tlmrt_model_output_info(m, i, &info) != TLMRT_OK) return 1;
    out[i] = calloc(1, info.nbytes + 1);
    out_n[i] = info.nbytes;
  }
  for (int r = 0; r < 5; ++r) {
    if (tlmrt_model_run(m, in, in_n, out, out_n) != TLMRT_OK) {
      fprintf(stderr, "run: %s\n", tlmrt_model_last_error(m));
      return 1;
    }
  }
  for (int r = 0; r < runs; ++r) {
    double t0 = now_us();
    tlmrt_model_run(m, in, in_n, out, out_n);
    t[r] = now_us() - t0;
  }
  qsort(t, (size_t)runs, sizeof(double), cmp);
  printf("{\"device\": \"%s\", \"runs\": %d, \"median_us\": %.1f, \"min_us\": %.1f", tlmrt_model_device_name(m), runs,
         t[runs / 2], t[0]);
#ifdef TLMRT_PROFILE
  tlmrt_model_set_profiling(m, 1);
  for (int r = 0; r < runs; ++r) tlmrt_model_run(m, in, in_n, out, out_n);
  tlmrt_profile p;
  tlmrt_model_get_profile(m, &p);
  uint64_t calls = 0;
  for (int i = 0; i < p.num_steps; ++i) {
    tlmrt_profile_step st;
    tlmrt_model_get_profile_step(m, i, &st);
    calls += st.calls;
  }
  double per = (double)(p.runs > 0 ? p.runs : 1);
  printf(", \"profiled_runs\": %llu, \"run_us\": %.1f, \"kernel_us\": %.1f, \"outside_us\": %.2f, "
         "\"io_copy_us\": %.2f, \"kernel_calls_per_run\": %.1f, \"pool_launches_per_run\": %.1f, "
         "\"pool_wait_us\": %.1f",
         (unsigned long long)p.runs, (double)p.run_ns / per / 1e3, (double)p.kernel_ns / per / 1e3,
         (double)(p.run_ns - p.kernel_ns) / per / 1e3, (double)p.io_ns / per / 1e3, (double)calls / per,
         (double)p.pool_launches / per, (double)p.pool_wait_ns / per / 1e3);
#endif
  printf("}\n");
  tlmrt_model_close(m);
  return 0;
}
