/*
 * batch_model.c — drives a dynamic-batch artifact (tlmpack build --batch ...) through the C API:
 *
 *   batch_model ARTIFACT_DIR
 *
 * Every batch 1..max through tlmrt_model_run_shaped, its outputs equal (within 1e-4) to runs of one
 * sample each through tlmrt_model_run (the batch taken from the buffer sizes), under the artifact's
 * costs and then under costs that pad everything (tlmrt_model_set_batch_costs); a batch past the
 * largest plan refused with a sentence; then 8 threads running different batches at once, each
 * output bitwise equal to the same batch run alone. Exit 0 and "ALL_OK", or 1 with "FAIL ..." lines.
 * Run it under ASan and TSan too (tests/c/ci_sanitize.sh's flags).
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tlmrt.h"

static tlmrt_model* g_model;
static tlmrt_tensor_info g_in, g_out;
static float* g_x;
static float* g_ref[65];
static int64_t g_max;
static int g_failures;

#define FAIL(...)                              \
  do {                                         \
    printf("FAIL line %d: ", __LINE__);        \
    printf(__VA_ARGS__);                       \
    printf("\n");                              \
    __atomic_add_fetch(&g_failures, 1, __ATOMIC_SEQ_CST); \
  } while (0)

static tlmrt_status run_batch(int64_t b, float* y) {
  int64_t shape[TLMRT_MAX_NDIM];
  memcpy(shape, g_in.shape, sizeof(shape));
  shape[0] = b;
  const int64_t* shapes[1] = {shape};
  tlmrt_io in = {g_x, g_in.nbytes * (uint64_t)b, TLMRT_DEVICE_CPU, 0};
  tlmrt_io out = {y, g_out.nbytes * (uint64_t)b, TLMRT_DEVICE_CPU, 0};
  return tlmrt_model_run_shaped(g_model, shapes, &in, &out);
}

static void check_against_single_samples(const char* costs) {
  size_t floats = (size_t)(g_out.nbytes / 4u) * (size_t)g_max;
  float* y = (float*)calloc(floats, sizeof(float));
  float* one = (float*)calloc(floats, sizeof(float));
  for (int64_t b = 1; b <= g_max; ++b) {
    if (run_batch(b, y) != TLMRT_OK) FAIL("%s: batch %lld: %s", costs, (long long)b, tlmrt_model_last_error(g_model));
    for (int64_t s = 0; s < b; ++s) {
      const void* ip[1] = {(const char*)g_x + (size_t)s * g_in.nbytes};
      void* op[1] = {(char*)one + (size_t)s * g_out.nbytes};
      uint64_t inb = g_in.nbytes, outb = g_out.nbytes;
      if (tlmrt_model_run(g_model, ip, &inb, op, &outb) != TLMRT_OK) FAIL("batch 1: %s", tlmrt_model_last_error(g_model));
    }
    for (size_t k = 0; k < (size_t)(g_out.nbytes / 4u) * (size_t)b; ++k) {
      float d = y[k] - one[k];
      if (d > 1e-4f || d < -1e-4f) {
        FAIL("%s: batch %lld, output float %zu: %g, one sample at a time %g", costs, (long long)b, k, y[k], one[k]);
        break;
      }
    }
  }
  free(y);
  free(one);
}

static void* worker(void* arg) {
  int64_t b = (int64_t)(intptr_t)arg;
  float* y = (float*)calloc((size_t)(g_out.nbytes / 4u) * (size_t)b, sizeof(float));
  for (int r = 0; r < 200; ++r) {
    if (run_batch(b, y) != TLMRT_OK) {
      FAIL("thread batch %lld: %s", (long long)b, tlmrt_model_last_error(g_model));
      break;
    }
    if (memcmp(y, g_ref[b], (size_t)(g_out.nbytes * (uint64_t)b)) != 0) {
      FAIL("thread batch %lld: outputs differ from the batch run alone", (long long)b);
      break;
    }
  }
  free(y);
  return NULL;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s ARTIFACT_DIR\n", argv[0]);
    return 2;
  }
  tlmrt_options o;
  tlmrt_options_init(&o);
  o.num_threads = 2;
  if (tlmrt_model_open(argv[1], &o, &g_model) != TLMRT_OK) {
    printf("OPEN_FAILED %s\n", tlmrt_open_error());
    return 1;
  }
  int32_t plans = tlmrt_model_num_batch_plans(g_model);
  g_max = plans > 0 ? tlmrt_model_batch_plan(g_model, plans - 1) : 0;
  if (plans < 2 || g_max < 2 || g_max > 64) FAIL("expected 2+ batch plans up to 64, found %d up to %lld", plans, (long long)g_max);
  if (tlmrt_model_input_info(g_model, 0, &g_in) != TLMRT_OK || tlmrt_model_output_info(g_model, 0, &g_out) != TLMRT_OK ||
      g_in.shape[0] != -1 || g_in.dtype_code != 2 || g_out.dtype_code != 2 || tlmrt_model_num_inputs(g_model) != 1 ||
      tlmrt_model_num_outputs(g_model) != 1) {
    FAIL("expected one float input and output with a symbolic batch (shape[0] -1)");
  }
  if (g_failures) return 1;
  uint64_t arena = tlmrt_model_arena_bytes(g_model);  /* one arena of the largest plan's size, shared */
  printf("ARENA %llu\n", (unsigned long long)arena);
  g_x = (float*)malloc((size_t)g_in.nbytes * (size_t)g_max);
  for (size_t i = 0; i < (size_t)(g_in.nbytes / 4u) * (size_t)g_max; ++i) g_x[i] = (float)((i * 7919u) % 101u) / 50.0f - 1.0f;

  check_against_single_samples("the artifact's costs");
  if (tlmrt_model_arena_bytes(g_model) != arena) FAIL("runs one after another made another arena");
  int64_t flat[64];
  for (int32_t i = 0; i < plans; ++i) flat[i] = 1000;  /* equal costs: every batch pads to one run */
  if (tlmrt_model_set_batch_costs(g_model, plans, flat) != TLMRT_OK) FAIL("set costs: %s", tlmrt_model_last_error(g_model));
  check_against_single_samples("equal costs");
  if (tlmrt_model_set_batch_costs(g_model, plans - 1, flat) != TLMRT_ERR_INVALID_ARGUMENT) FAIL("a short cost table was taken");

  float* y = (float*)calloc((size_t)(g_out.nbytes / 4u) * (size_t)g_max, sizeof(float));
  g_x = (float*)realloc(g_x, (size_t)g_in.nbytes * (size_t)(g_max + 1));
  if (run_batch(g_max + 1, y) != TLMRT_ERR_INVALID_ARGUMENT || strstr(tlmrt_model_last_error(g_model), "with batch in 1..") == NULL) {
    FAIL("batch %lld past the plans: expected a refusal, got \"%s\"", (long long)g_max + 1, tlmrt_model_last_error(g_model));
  }
  printf("REFUSED: %s\n", tlmrt_model_last_error(g_model));
  free(y);

  for (int64_t b = 1; b <= g_max; ++b) {
    g_ref[b] = (float*)calloc((size_t)(g_out.nbytes / 4u) * (size_t)b, sizeof(float));
    if (run_batch(b, g_ref[b]) != TLMRT_OK) FAIL("reference batch %lld", (long long)b);
  }
  pthread_t threads[8];
  for (int i = 0; i < 8; ++i) {
    int64_t b = 1 + (int64_t)((i * 5) % g_max);
    pthread_create(&threads[i], NULL, worker, (void*)(intptr_t)b);
  }
  for (int i = 0; i < 8; ++i) pthread_join(threads[i], NULL);
  /* Runs one after another kept the one arena; overlapping runs took one more each, at most 8 in all. */
  uint64_t after = tlmrt_model_arena_bytes(g_model);
  if (arena == 0 || after % arena != 0 || after > 8u * arena) {
    FAIL("arena after 8 threads: expected k x %llu for k in 1..8, found %llu", (unsigned long long)arena,
         (unsigned long long)after);
  }

  for (int64_t b = 1; b <= g_max; ++b) free(g_ref[b]);
  free(g_x);
  tlmrt_model_close(g_model);
  if (g_failures) return 1;
  printf("ALL_OK\n");
  return 0;
}
