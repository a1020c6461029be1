/*
 * test_pool_tickets.c — the dynamic pool's claims under load: a kernel library without a barrier hook
 * (tests/c/fake_kernels.c) runs launches of 64, 1, 7 and 33 tasks in turn on a pool of more threads
 * than cores (8 threads: owned shares for 64 and 33, one shared range for 1 and 7), so workers often
 * arrive after their launch is over, while the caller already writes the next one. Every task must
 * run exactly once per launch, and no launch may hang (the caller of tests/test_kernel_timer.py kills
 * this process after its timeout).
 *
 *   test_pool_tickets FAKE_KERNELS_SO THREADS SECONDS
 */
#define _POSIX_C_SOURCE 200809L
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "test_tensor.h"
#include "tlmrt.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s FAKE_KERNELS_SO THREADS SECONDS\n", argv[0]);
    return 2;
  }
  tlmrt_kernel_library* lib = NULL;
  if (tlmrt_kernel_library_open(argv[1], atoi(argv[2]), &lib) != TLMRT_OK) {
    printf("FAIL open: %s\n", tlmrt_open_error());
    return 1;
  }
  static alignas(64) int32_t hits[64], bad[16], launches[16];
  int64_t n_hits = 64, one = 1;
  tlmrt_dltensor th = test_tensor_1d(hits, &n_hits, 0);
  tlmrt_dltensor tb = test_tensor_1d(bad, &one, 0);
  tlmrt_dltensor tl = test_tensor_1d(launches, &one, 0);
  tlmrt_dltensor* args[3] = {&th, &tb, &tl};
  launches[0] = 1000;
  double end = now_s() + atof(argv[3]);
  long total = 0;
  while (now_s() < end) {
    if (tlmrt_kernel_call(lib, "ticket_stress", args, 3) != TLMRT_OK) {
      printf("FAIL call: %s\n", tlmrt_kernel_library_last_error(lib));
      return 1;
    }
    total += launches[0];
  }
  tlmrt_kernel_library_close(lib);
  printf("%ld launches, %d with a task not run exactly once\n", total, bad[0]);
  if (bad[0] == 0) printf("ALL_OK\n");
  return bad[0] == 0 ? 0 : 1;
}
