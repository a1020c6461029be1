/*
 * stress_model.c — one model of any artifact, many threads at once: every run's outputs must be
 * bitwise identical to a reference run's on the same inputs.
 *
 *   stress_model ARTIFACT_DIR POOL_THREADS CALLER_THREADS RUNS_PER_THREAD
 *
 * Inputs are a fixed pseudo-random fill: floats in [-1, 1), integers 0 (a valid index for token ids
 * and positions). Exit 0 and "ALL_OK", 1 and "FAIL ..." lines, 3 when the model does not open.
 * tests/c/ci_sanitize.sh runs it under ThreadSanitizer on a real (tiny) artifact.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tlmrt.h"

typedef struct {
  tlmrt_model* m;
  int ni, no;
  const void** in;
  uint64_t* in_n;
  void** want;
  uint64_t* out_n;
  int runs;
  int failures;
  char why[512];
} job;

static void* worker(void* p) {
  job* j = (job*)p;
  void** out = (void**)calloc((size_t)j->no + 1u, sizeof(void*));
  if (out == NULL) {
    j->failures = 1;
    return NULL;
  }
  for (int i = 0; i < j->no; ++i) out[i] = malloc(j->out_n[i] + 1u);
  for (int r = 0; r < j->runs && j->failures == 0; ++r) {
    for (int i = 0; i < j->no; ++i) memset(out[i], 0xa5, j->out_n[i]);
    tlmrt_status s = tlmrt_model_run(j->m, j->in, j->in_n, out, j->out_n);
    if (s != TLMRT_OK) {
      snprintf(j->why, sizeof(j->why), "run %d: status %d: %s", r, (int)s, tlmrt_model_last_error(j->m));
      j->failures = 1;
      break;
    }
    for (int i = 0; i < j->no; ++i) {
      if (memcmp(out[i], j->want[i], j->out_n[i]) != 0) {
        snprintf(j->why, sizeof(j->why), "run %d: output %d differs from the reference run's", r, i);
        j->failures = 1;
      }
    }
  }
  for (int i = 0; i < j->no; ++i) free(out[i]);
  free(out);
  return NULL;
}

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s ARTIFACT_DIR POOL_THREADS CALLER_THREADS RUNS_PER_THREAD\n", argv[0]);
    return 2;
  }
  int callers = atoi(argv[3]), runs = atoi(argv[4]);
  if (callers < 1 || callers > 256 || runs < 1) return 2;
  tlmrt_options opts;
  tlmrt_options_init(&opts);
  opts.num_threads = atoi(argv[2]);
  tlmrt_model* m = NULL;
  if (tlmrt_model_open(argv[1], &opts, &m) != TLMRT_OK) {
    printf("OPEN_FAILED: %s\n", tlmrt_open_error());
    return 3;
  }
  job base;
  memset(&base, 0, sizeof(base));
  base.m = m;
  base.ni = tlmrt_model_num_inputs(m);
  base.no = tlmrt_model_num_outputs(m);
  base.in = (const void**)calloc((size_t)base.ni + 1u, sizeof(void*));
  base.in_n = (uint64_t*)calloc((size_t)base.ni + 1u, sizeof(uint64_t));
  base.want = (void**)calloc((size_t)base.no + 1u, sizeof(void*));
  base.out_n = (uint64_t*)calloc((size_t)base.no + 1u, sizeof(uint64_t));
  if (base.in == NULL || base.in_n == NULL || base.want == NULL || base.out_n == NULL) return 1;
  uint32_t seed = 12345u;
  for (int i = 0; i < base.ni; ++i) {
    tlmrt_tensor_info info;
    if (tlmrt_model_input_info(m, i, &info) != TLMRT_OK) return 1;
    uint8_t* buf = (uint8_t*)calloc(1, info.nbytes + 1u);
    if (buf == NULL) return 1;
    if (info.dtype_code == 2 && info.dtype_bits == 32) {
      float* f = (float*)buf;
      for (uint64_t k = 0; k < info.nbytes / 4u; ++k) {
        seed = seed * 1664525u + 1013904223u;
        f[k] = (float)(seed >> 8) / 8388608.0f - 1.0f;
      }
    }
    base.in[i] = buf;
    base.in_n[i] = info.nbytes;
  }
  for (int i = 0; i < base.no; ++i) {
    tlmrt_tensor_info info;
    if (tlmrt_model_output_info(m, i, &info) != TLMRT_OK) return 1;
    base.want[i] = malloc(info.nbytes + 1u);
    base.out_n[i] = info.nbytes;
  }
  if (tlmrt_model_run(m, base.in, base.in_n, base.want, base.out_n) != TLMRT_OK) {
    printf("FAIL reference run: %s\n", tlmrt_model_last_error(m));
    return 1;
  }
  job* jobs = (job*)calloc((size_t)callers, sizeof(job));
  pthread_t* th = (pthread_t*)calloc((size_t)callers, sizeof(pthread_t));
  if (jobs == NULL || th == NULL) return 1;
  for (int t = 0; t < callers; ++t) {
    jobs[t] = base;
    jobs[t].runs = runs;
    if (pthread_create(&th[t], NULL, worker, &jobs[t]) != 0) return 1;
  }
  int failures = 0;
  for (int t = 0; t < callers; ++t) {
    pthread_join(th[t], NULL);
    if (jobs[t].failures) {
      printf("FAIL thread %d: %s\n", t, jobs[t].why);
      ++failures;
    }
  }
  tlmrt_model_close(m);
  for (int i = 0; i < base.ni; ++i) free((void*)base.in[i]);
  for (int i = 0; i < base.no; ++i) free(base.want[i]);
  free(base.in);
  free(base.in_n);
  free(base.want);
  free(base.out_n);
  free(jobs);
  free(th);
  if (failures) return 1;
  printf("ALL_OK %d threads x %d runs, outputs identical to the reference run\n", callers, runs);
  return 0;
}
