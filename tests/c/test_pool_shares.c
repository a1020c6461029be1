/*
 * test_pool_shares.c — the dynamic pool's owned shares: with more tasks than threads, each thread runs
 * its own contiguous share of a launch from the front and others take its leftovers from the back, so
 * consecutive kernels find their data where the thread left it. A pool of two threads runs launches of
 * 16 tasks (tests/c/fake_kernels.c share_order); prints the launches that broke that order and those
 * the worker took part in.
 *
 *   test_pool_shares FAKE_KERNELS_SO LAUNCHES
 */
#define _POSIX_C_SOURCE 200809L
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>

#include "test_tensor.h"
#include "tlmrt.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s FAKE_KERNELS_SO LAUNCHES\n", argv[0]);
    return 2;
  }
  tlmrt_kernel_library* lib = NULL;
  if (tlmrt_kernel_library_open(argv[1], 2, &lib) != TLMRT_OK) {
    printf("FAIL open: %s\n", tlmrt_open_error());
    return 1;
  }
  static alignas(64) int32_t who[16], bad[16], launches[16];
  int64_t n_who = 16, one = 1, three = 3;
  tlmrt_dltensor tw = test_tensor_1d(who, &n_who, 0);
  tlmrt_dltensor tb = test_tensor_1d(bad, &one, 0);
  tlmrt_dltensor tl = test_tensor_1d(launches, &three, 0);
  tlmrt_dltensor* args[3] = {&tw, &tb, &tl};
  launches[0] = atoi(argv[2]);
  if (tlmrt_kernel_call(lib, "share_order", args, 3) != TLMRT_OK) {
    printf("FAIL call: %s\n", tlmrt_kernel_library_last_error(lib));
    return 1;
  }
  tlmrt_kernel_library_close(lib);
  printf("launches %d out_of_order %d worker_ran %d worker_own %d\n", launches[0], bad[0], launches[1], launches[2]);
  return 0;
}
