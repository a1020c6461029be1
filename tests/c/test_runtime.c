/*
 * test_runtime.c — drives libtlmrt.so over the fake artifact built from tests/c/fake_plan.c.
 *
 *   test_runtime ARTIFACT_DIR NUM_THREADS [--no-verify]
 *
 * Exit 0 and "ALL_OK" when every check passed; exit 1 with "FAIL ..." lines otherwise; exit 3 with
 * "OPEN_FAILED status=<n>: <message>" when the artifact does not open (the corruption tests expect
 * that). Lines "WRONG_SIZE: ...", "KERNEL: ..." carry error messages for tests/test_runtime_c.py.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tlmrt.h"

#define N 1000
#define HITS 64

static int g_failures = 0;

#define CHECK(cond, ...)                       \
  do {                                         \
    if (!(cond)) {                             \
      printf("FAIL line %d: ", __LINE__);      \
      printf(__VA_ARGS__);                     \
      printf("\n");                            \
      ++g_failures;                            \
    }                                          \
  } while (0)

static float weight(int i) { return (float)i * 0.25f; }

static void fill(float* x, uint32_t seed) {
  for (int i = 0; i < N; ++i) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = (float)(seed >> 8) / 16777216.0f * 2.0f - 1.0f;
  }
}

/* Runs once and checks y and hits; returns the number of failed checks. */
static int run_and_check(tlmrt_model* m, uint32_t seed, int expect_tasks) {
  float x[N], y[N];
  int32_t hits[HITS];
  fill(x, seed);
  const void* in[1] = {x};
  uint64_t in_n[1] = {sizeof(x)};
  void* out[2] = {y, hits};
  uint64_t out_n[2] = {sizeof(y), sizeof(hits)};
  tlmrt_status s = tlmrt_model_run(m, in, in_n, out, out_n);
  if (s != TLMRT_OK) {
    printf("FAIL run: status %d: %s\n", (int)s, tlmrt_model_last_error(m));
    return 1;
  }
  int bad = 0;
  for (int i = 0; i < N; ++i) {
    int j = N - 1 - i;
    float want = (x[j] + weight(j)) * 2.0f;
    if (y[i] != want) {
      if (bad < 3) printf("FAIL y[%d] = %g, expected %g\n", i, (double)y[i], (double)want);
      ++bad;
    }
  }
  for (int t = 0; t < HITS - 1; ++t) {
    int want = t < expect_tasks ? 1 : 0;
    if (hits[t] != want) {
      if (bad < 6) printf("FAIL task %d ran %d times, expected %d\n", t, hits[t], want);
      ++bad;
    }
  }
  if (hits[HITS - 1] != expect_tasks) {
    printf("FAIL tasks saw num_task %d, expected %d\n", hits[HITS - 1], expect_tasks);
    ++bad;
  }
  return bad;
}

typedef struct {
  const char* dir;
  int verify;
  int failures;
} thread_arg;

static void* thread_main(void* p) {
  thread_arg* a = (thread_arg*)p;
  tlmrt_options opts;
  tlmrt_options_init(&opts);
  opts.num_threads = 2;
  opts.verify_files = a->verify;
  tlmrt_model* m = NULL;
  if (tlmrt_model_open(a->dir, &opts, &m) != TLMRT_OK) {
    printf("FAIL open in a thread: %s\n", tlmrt_open_error());
    a->failures = 1;
    return NULL;
  }
  for (int r = 0; r < 50 && a->failures == 0; ++r) a->failures += run_and_check(m, 1000u + (uint32_t)r, 2);
  tlmrt_model_close(m);
  return NULL;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s ARTIFACT_DIR NUM_THREADS [--no-verify]\n", argv[0]);
    return 2;
  }
  const char* dir = argv[1];
  int threads = atoi(argv[2]);
  int verify = !(argc > 3 && strcmp(argv[3], "--no-verify") == 0);
  setvbuf(stdout, NULL, _IONBF, 0);

  CHECK(strcmp(tlmrt_version(), "0.2.0") == 0, "version %s", tlmrt_version());

  tlmrt_options opts;
  tlmrt_options_init(&opts);
  opts.num_threads = threads;
  opts.verify_files = verify;
  tlmrt_model* m = NULL;
  tlmrt_status s = tlmrt_model_open(dir, &opts, &m);
  if (s != TLMRT_OK) {
    CHECK(m == NULL, "a failed open left a model");
    printf("OPEN_FAILED status=%d: %s\n", (int)s, tlmrt_open_error());
    return 3;
  }
  CHECK(tlmrt_open_error()[0] == '\0', "open error after success: %s", tlmrt_open_error());

  /* info */
  CHECK(tlmrt_model_num_inputs(m) == 1, "num_inputs %d", tlmrt_model_num_inputs(m));
  CHECK(tlmrt_model_num_outputs(m) == 2, "num_outputs %d", tlmrt_model_num_outputs(m));
  tlmrt_tensor_info info;
  CHECK(tlmrt_model_input_info(m, 0, &info) == TLMRT_OK, "input_info");
  CHECK(strcmp(info.name, "x") == 0 && info.dtype_code == 2 && info.dtype_bits == 32 && info.ndim == 1 &&
            info.shape[0] == N && info.nbytes == N * 4,
        "input 0 info: %s code %d bits %d ndim %d", info.name, info.dtype_code, info.dtype_bits, info.ndim);
  CHECK(tlmrt_model_output_info(m, 1, &info) == TLMRT_OK, "output_info");
  CHECK(strcmp(info.name, "hits") == 0 && info.dtype_code == 0 && info.nbytes == HITS * 4, "output 1 info");
  CHECK(tlmrt_model_output_info(m, 2, &info) == TLMRT_ERR_INVALID_ARGUMENT, "output index 2 accepted");
  CHECK(strstr(tlmrt_model_last_error(m), "expected 0..1, found 2") != NULL, "index message: %s",
        tlmrt_model_last_error(m));
  CHECK(tlmrt_model_input_info(m, -1, &info) == TLMRT_ERR_INVALID_ARGUMENT, "input index -1 accepted");
  CHECK(tlmrt_model_input_info(m, 0, NULL) == TLMRT_ERR_INVALID_ARGUMENT, "NULL info accepted");

  /* runs */
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int expect_tasks = threads > 0 ? threads : (int)(ncpu > 0 ? ncpu : 1);
  for (uint32_t r = 0; r < 20; ++r) g_failures += run_and_check(m, r, expect_tasks);

  /* caller mistakes */
  float x[N], y[N];
  int32_t hits[HITS];
  fill(x, 7);
  const void* in[1] = {x};
  uint64_t in_n[1] = {sizeof(x) - 4};
  void* out[2] = {y, hits};
  uint64_t out_n[2] = {sizeof(y), sizeof(hits)};
  s = tlmrt_model_run(m, in, in_n, out, out_n);
  CHECK(s == TLMRT_ERR_INVALID_ARGUMENT, "short input gave status %d", (int)s);
  printf("WRONG_SIZE: %s\n", tlmrt_model_last_error(m));
  in_n[0] = sizeof(x);
  out_n[1] = sizeof(hits) + 4;
  s = tlmrt_model_run(m, in, in_n, out, out_n);
  CHECK(s == TLMRT_ERR_INVALID_ARGUMENT, "long output gave status %d", (int)s);
  CHECK(strstr(tlmrt_model_last_error(m), "hits") != NULL, "output message: %s", tlmrt_model_last_error(m));
  out_n[1] = sizeof(hits);
  s = tlmrt_model_run(m, NULL, in_n, out, out_n);
  CHECK(s == TLMRT_ERR_INVALID_ARGUMENT, "NULL inputs gave status %d", (int)s);
  const void* null_in[1] = {NULL};
  s = tlmrt_model_run(m, null_in, in_n, out, out_n);
  CHECK(s == TLMRT_ERR_INVALID_ARGUMENT, "a NULL input buffer gave status %d", (int)s);

  /* a kernel error, then a good run again */
  x[0] = -12345.0f;
  s = tlmrt_model_run(m, in, in_n, out, out_n);
  CHECK(s == TLMRT_ERR_KERNEL, "sentinel gave status %d", (int)s);
  printf("KERNEL: %s\n", tlmrt_model_last_error(m));
  g_failures += run_and_check(m, 99, expect_tasks);
  CHECK(tlmrt_model_last_error(m)[0] == '\0', "last error not cleared: %s", tlmrt_model_last_error(m));

  /* a second model of the same artifact (same library, same hooks) next to the first */
  tlmrt_model* m2 = NULL;
  opts.num_threads = 1;
  CHECK(tlmrt_model_open(dir, &opts, &m2) == TLMRT_OK, "second open: %s", tlmrt_open_error());
  if (m2 != NULL) {
    g_failures += run_and_check(m2, 5, 1);
    g_failures += run_and_check(m, 6, expect_tasks);
    g_failures += run_and_check(m2, 7, 1);
    tlmrt_model_close(m2);
  }
  g_failures += run_and_check(m, 8, expect_tasks);
  tlmrt_model_close(m);

  /* one model per thread, running at the same time */
  thread_arg args[2] = {{dir, verify, 0}, {dir, verify, 0}};
  pthread_t th[2];
  for (int i = 0; i < 2; ++i) CHECK(pthread_create(&th[i], NULL, thread_main, &args[i]) == 0, "thread");
  for (int i = 0; i < 2; ++i) {
    pthread_join(th[i], NULL);
    g_failures += args[i].failures;
  }

  /* open's own argument checks */
  m = NULL;
  CHECK(tlmrt_model_open(NULL, NULL, &m) == TLMRT_ERR_INVALID_ARGUMENT && m == NULL, "NULL dir");
  CHECK(tlmrt_model_open(dir, NULL, NULL) == TLMRT_ERR_INVALID_ARGUMENT, "NULL out");
  tlmrt_options zero;
  memset(&zero, 0, sizeof(zero));
  CHECK(tlmrt_model_open(dir, &zero, &m) == TLMRT_ERR_INVALID_ARGUMENT, "uninitialized options");
  CHECK(strstr(tlmrt_open_error(), "struct_size") != NULL, "options message: %s", tlmrt_open_error());
  tlmrt_model_close(NULL);

  if (g_failures != 0) {
    printf("FAILURES: %d\n", g_failures);
    return 1;
  }
  printf("ALL_OK\n");
  return 0;
}
