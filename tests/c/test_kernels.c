/*
 * test_kernels.c — drives the kernel-library API of libtlmrt.so over tests/c/fake_kernels.c.
 *
 *   test_kernels FAKE_KERNELS_SO
 *
 * Exit 0 and "ALL_OK" when every check passed; exit 1 with "FAIL ..." lines otherwise. Every error
 * path must give a status and a sentence, never a crash.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdalign.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "test_tensor.h"
#include "tlmrt.h"

#define N 1000

static int g_failures = 0;

#define CHECK(cond, ...)                  \
  do {                                    \
    if (!(cond)) {                        \
      printf("FAIL line %d: ", __LINE__); \
      printf(__VA_ARGS__);                \
      printf("\n");                       \
      ++g_failures;                       \
    }                                     \
  } while (0)

/* status s and a message containing `word` */
#define CHECK_ERR(s, want, msg, word) \
  CHECK((s) == (want) && strstr((msg), (word)) != NULL, "status %d (want %d): %s", (int)(s), (int)(want), (msg))

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s FAKE_KERNELS_SO\n", argv[0]);
    return 2;
  }
  tlmrt_kernel_library* lib = (tlmrt_kernel_library*)1;
  tlmrt_status s = tlmrt_kernel_library_open(NULL, 2, &lib);
  CHECK_ERR(s, TLMRT_ERR_INVALID_ARGUMENT, tlmrt_open_error(), "so_path");
  CHECK(lib == NULL, "out not cleared");
  s = tlmrt_kernel_library_open(argv[1], 2, NULL);
  CHECK_ERR(s, TLMRT_ERR_INVALID_ARGUMENT, tlmrt_open_error(), "out");
  s = tlmrt_kernel_library_open("/nonexistent/k.so", 2, &lib);
  CHECK_ERR(s, TLMRT_ERR_IO, tlmrt_open_error(), "/nonexistent/k.so: cannot open");
  s = tlmrt_kernel_library_open(argv[1], -1, &lib);
  CHECK_ERR(s, TLMRT_ERR_INVALID_ARGUMENT, tlmrt_open_error(), "num_threads");
  s = tlmrt_kernel_library_open(argv[1], 2, &lib);
  CHECK(s == TLMRT_OK && lib != NULL, "open: %s", tlmrt_open_error());
  if (lib == NULL) return 1;

  static alignas(64) float x[N], y[N];
  static alignas(64) int32_t tasks[16];
  for (int i = 0; i < N; ++i) x[i] = (float)i;
  int64_t n = N, one = 1;
  tlmrt_dltensor tx = test_tensor_1d(x, &n, 2), ty = test_tensor_1d(y, &n, 2), tt = test_tensor_1d(tasks, &one, 0);
  tlmrt_dltensor* args[3] = {&tx, &ty, &tt};

  s = tlmrt_kernel_call(lib, "scale2", args, 3);
  CHECK(s == TLMRT_OK, "call: %s", tlmrt_kernel_library_last_error(lib));
  int bad = 0;
  for (int i = 0; i < N; ++i) bad += y[i] != 2.0f * x[i];
  CHECK(bad == 0, "%d wrong outputs", bad);
  CHECK(tasks[0] == 2, "the launch ran %d tasks, expected 2 (one per pool thread)", tasks[0]);

  double seconds[3] = {-1, -1, -1};
  s = tlmrt_kernel_time(lib, "scale2", args, 3, 3, 1.0, seconds);
  CHECK(s == TLMRT_OK, "time: %s", tlmrt_kernel_library_last_error(lib));
  for (int r = 0; r < 3; ++r) CHECK(seconds[r] > 0 && seconds[r] < 1, "repeat %d: %g s", r, seconds[r]);

  /* every bad input: a status and a sentence */
  const char* err = tlmrt_kernel_library_last_error(lib);
  s = tlmrt_kernel_call(lib, "nope", args, 3);
  CHECK_ERR(s, TLMRT_ERR_INVALID_ARGUMENT, err, "no kernel named \"nope\"");
  s = tlmrt_kernel_call(lib, "_library_bin", args, 0);
  CHECK_ERR(s, TLMRT_ERR_INVALID_ARGUMENT, err, "reserved");
  s = tlmrt_kernel_call(lib, "", args, 3);
  CHECK_ERR(s, TLMRT_ERR_INVALID_ARGUMENT, err, "name");
  s = tlmrt_kernel_call(lib, NULL, args, 3);
  CHECK_ERR(s, TLMRT_ERR_INVALID_ARGUMENT, err, "name");
  s = tlmrt_kernel_call(NULL, "scale2", args, 3);
  CHECK_ERR(s, TLMRT_ERR_INVALID_ARGUMENT, tlmrt_open_error(), "lib");
  s = tlmrt_kernel_call(lib, "scale2", NULL, 3);
  CHECK_ERR(s, TLMRT_ERR_INVALID_ARGUMENT, err, "NULL array");
  s = tlmrt_kernel_call(lib, "scale2", args, -1);
  CHECK_ERR(s, TLMRT_ERR_INVALID_ARGUMENT, err, "found -1");
  s = tlmrt_kernel_call(lib, "scale2", args, 2);
  CHECK_ERR(s, TLMRT_ERR_KERNEL, err, "kernel scale2 failed (returned -1): ValueError: scale2 expects 3 arguments");
  tlmrt_dltensor* with_null[3] = {&tx, NULL, &tt};
  s = tlmrt_kernel_call(lib, "scale2", with_null, 3);
  CHECK_ERR(s, TLMRT_ERR_INVALID_ARGUMENT, err, "argument 1: expected a tensor, found NULL");
  tlmrt_dltensor shifted = test_tensor_1d(y + 1, &n, 2);
  tlmrt_dltensor* misaligned[3] = {&tx, &shifted, &tt};
  s = tlmrt_kernel_call(lib, "scale2", misaligned, 3);
  CHECK_ERR(s, TLMRT_ERR_INVALID_ARGUMENT, err, "argument 1: expected data aligned to 64 bytes");
  tlmrt_dltensor on_gpu = tx;
  on_gpu.device.device_type = TLMRT_DEVICE_CUDA;
  tlmrt_dltensor* gpu[3] = {&on_gpu, &ty, &tt};
  s = tlmrt_kernel_call(lib, "scale2", gpu, 3);
  CHECK_ERR(s, TLMRT_ERR_INVALID_ARGUMENT, err, "argument 0: expected a CPU tensor");
  s = tlmrt_kernel_time(lib, "scale2", args, 3, 0, 1.0, seconds);
  CHECK_ERR(s, TLMRT_ERR_INVALID_ARGUMENT, err, "repeats");
  s = tlmrt_kernel_time(lib, "scale2", args, 3, 3, NAN, seconds);
  CHECK_ERR(s, TLMRT_ERR_INVALID_ARGUMENT, err, "min_repeat_ms");
  s = tlmrt_kernel_time(lib, "scale2", args, 3, 3, -1.0, seconds);
  CHECK_ERR(s, TLMRT_ERR_INVALID_ARGUMENT, err, "min_repeat_ms");
  s = tlmrt_kernel_time(lib, "scale2", args, 3, 3, 1.0, NULL);
  CHECK_ERR(s, TLMRT_ERR_INVALID_ARGUMENT, err, "seconds_per_run");
  s = tlmrt_kernel_time(lib, "scale2", args, 2, 3, 1.0, seconds);
  CHECK_ERR(s, TLMRT_ERR_KERNEL, err, "failed in the warm-up call");
  CHECK(strcmp(tlmrt_kernel_library_last_error(NULL), "") == 0, "last_error(NULL)");

  /* the cached kernel still works after the errors */
  memset(y, 0, sizeof(y));
  s = tlmrt_kernel_call(lib, "scale2", args, 3);
  CHECK(s == TLMRT_OK && y[N - 1] == 2.0f * x[N - 1], "call after errors: %s", err);
  tlmrt_kernel_library_close(lib);
  tlmrt_kernel_library_close(NULL);

  /* one thread: no workers, the launch runs its one task on the caller */
  s = tlmrt_kernel_library_open(argv[1], 1, &lib);
  CHECK(s == TLMRT_OK, "open with 1 thread: %s", tlmrt_open_error());
  if (s == TLMRT_OK) {
    s = tlmrt_kernel_call(lib, "scale2", args, 3);
    CHECK(s == TLMRT_OK && tasks[0] == 1, "1 thread: status %d, %d tasks", (int)s, tasks[0]);
    tlmrt_kernel_library_close(lib);
  }
  if (g_failures == 0) printf("ALL_OK\n");
  return g_failures == 0 ? 0 : 1;
}
