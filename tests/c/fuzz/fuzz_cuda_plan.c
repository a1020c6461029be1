/*
 * fuzz_cuda_plan.c — libFuzzer target for the checks of a CUDA plan (runtime_c/tlmrt_cuda.c:
 * tlmrt_validate_tables, validate_launches, validate_images, choose_image, check_image_bytes) against
 * an H200-like device. No GPU and no driver are needed: these checks run before any driver call.
 *
 *   clang -std=c11 -g -O1 -fsanitize=fuzzer,address,undefined -Iruntime_c tests/c/fuzz/fuzz_cuda_plan.c \
 *     runtime_c/tlmrt_core.c runtime_c/tlmrt_sha256.c runtime_c/tlmrt_cpu.c runtime_c/tlmrt_kernels.c -ldl -lpthread
 *
 * When the checks accept a plan, every tensor argument of every launch must index the tensor table,
 * every launch must fit the device's limits, and the chosen image must be one of the plan's.
 */
#include "../../../runtime_c/tlmrt_cuda.c"

#include "fuzz_input.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#define MAX_T 8
#define MAX_L 6
#define MAX_A 6
#define MAX_I 4

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz_input in = {data, size};
  static int64_t shapes[MAX_T][TLMRT_PLAN_MAX_NDIM + 2];  /* as many entries as any ndim the checks let by */
  static tlmrt_plan_tensor tensors[MAX_T];
  static tlmrt_cuda_launch launches[MAX_L];
  static tlmrt_cuda_arg args[MAX_L][MAX_A];
  static tlmrt_cuda_image images[MAX_I];
  static char names[MAX_I][24];
  static const char* const kFiles[] = {"cuda/sm_90.cubin", "cuda/kernels.ptx", "../x", "/abs", "a//b", "", "ok/.",
                                       "cuda/sm_80.cubin"};

  cuda_device d;
  memset(&d, 0, sizeof(d));
  snprintf(d.name, sizeof(d.name), "fuzz H200");
  d.arch = (fuzz_take(&in, 1) & 1u) ? 90 : (int)(fuzz_take(&in, 1) % 120u);
  d.driver_version = 13000;
  d.max_threads = 1024;
  d.max_block[0] = d.max_block[1] = 1024;
  d.max_block[2] = 64;
  d.max_grid[0] = 2147483647;
  d.max_grid[1] = d.max_grid[2] = 65535;
  d.smem_optin = 232448;

  tlmrt_cuda_plan plan;
  memset(&plan, 0, sizeof(plan));
  plan.abi_version = TLMRT_PLAN_ABI_VERSION;
  plan.model_name = "fuzz";
  plan.arena_bytes = fuzz_take(&in, 2) * 16u;
  uint64_t weights_size = fuzz_take(&in, 2);
  plan.num_tensors = fuzz_count(&in, 0, MAX_T);
  plan.tensors = tensors;
  for (int32_t i = 0; i < MAX_T; ++i) {
    tlmrt_plan_tensor* t = &tensors[i];
    t->storage = (int32_t)(fuzz_take(&in, 1) % 3u);
    t->dtype_code = 2;
    t->dtype_bits = (fuzz_take(&in, 1) & 1u) ? 32 : 16;
    t->dtype_lanes = 1;
    t->offset = fuzz_take(&in, 1) * 64u;
    t->ndim = fuzz_count(&in, 0, 2);
    shapes[i][0] = (int64_t)fuzz_take(&in, 1) - 3;
    shapes[i][1] = (int64_t)fuzz_take(&in, 1);
    for (int k = 2; k < TLMRT_PLAN_MAX_NDIM + 2; ++k) shapes[i][k] = 1;
    t->shape = shapes[i];
    uint64_t count = 1;
    for (int32_t k = 0; k < t->ndim && k < 2; ++k) count *= shapes[i][k] > 0 ? (uint64_t)shapes[i][k] : 0u;
    t->nbytes = (fuzz_take(&in, 1) & 7u) == 0 ? fuzz_take(&in, 4) : count * t->dtype_bits / 8u;
  }
  if (plan.num_tensors > MAX_T) plan.num_tensors = MAX_T;
  static tlmrt_plan_io ios[2];
  ios[0] = (tlmrt_plan_io){"x", (int32_t)fuzz_take(&in, 1) - 1};
  ios[1] = (tlmrt_plan_io){"y", (int32_t)fuzz_take(&in, 1) - 1};
  plan.num_inputs = 1;
  plan.inputs = &ios[0];
  plan.num_outputs = 1;
  plan.outputs = &ios[1];

  plan.num_launches = fuzz_count(&in, 0, MAX_L);
  if (plan.num_launches > MAX_L) plan.num_launches = MAX_L;
  plan.launches = launches;
  for (int32_t i = 0; i < MAX_L; ++i) {
    tlmrt_cuda_launch* l = &launches[i];
    l->kernel = (fuzz_take(&in, 1) & 15u) == 0 ? "" : "k";
    l->task = (fuzz_take(&in, 1) & 15u) == 0 ? NULL : "t";
    for (int k = 0; k < 3; ++k) {
      uint8_t sel = (uint8_t)fuzz_take(&in, 1);
      l->grid[k] = sel == 0xff ? (uint32_t)fuzz_take(&in, 4) : sel % 5u;
      sel = (uint8_t)fuzz_take(&in, 1);
      l->block[k] = sel == 0xff ? (uint32_t)fuzz_take(&in, 4) : (uint32_t)sel * 4u % 1100u;
    }
    l->dynamic_smem_bytes = (uint32_t)fuzz_take(&in, 3);
    l->num_args = fuzz_count(&in, 0, MAX_A);
    if (l->num_args > MAX_A) l->num_args = MAX_A;
    l->args = args[i];
    for (int a = 0; a < MAX_A; ++a) {
      args[i][a].kind = (int32_t)(fuzz_take(&in, 1) % 4u);
      args[i][a].tensor = (int32_t)fuzz_take(&in, 1) - 2;
      args[i][a].value = (int64_t)fuzz_take(&in, 8);
    }
  }
  plan.num_images = fuzz_count(&in, 0, MAX_I);
  if (plan.num_images > MAX_I) plan.num_images = MAX_I;
  plan.images = images;
  for (int32_t i = 0; i < MAX_I; ++i) {
    snprintf(names[i], sizeof(names[i]), "%s", kFiles[fuzz_take(&in, 1) % 8u]);
    images[i].file = names[i];
    images[i].kind = (int32_t)(fuzz_take(&in, 1) % 3u);
    images[i].arch = (int32_t)fuzz_take(&in, 1);
  }

  char err[TLMRT_ERROR_CAP];
  tlmrt_plan_tables t = plan_tables(&plan);
  tlmrt_status s = tlmrt_validate_tables("cuda plan", &t, plan.arena_bytes, weights_size, err, sizeof(err));
  uint64_t total_args = 0;
  if (s == TLMRT_OK) s = validate_launches(&plan, &d, &total_args, err, sizeof(err));
  if (s == TLMRT_OK) s = validate_images(&plan, err, sizeof(err));
  if (s != TLMRT_OK && (err[0] == '\0' || strchr(err, '\n') != NULL)) abort();
#ifdef FUZZ_COUNT_ACCEPTED
  if (s == TLMRT_OK) fprintf(stderr, "ACCEPTED\n");
#endif
  if (s == TLMRT_OK) {
    for (int32_t i = 0; i < plan.num_launches; ++i) {
      const tlmrt_cuda_launch* l = &launches[i];
      uint64_t threads = (uint64_t)l->block[0] * l->block[1] * l->block[2];
      if (threads == 0 || threads > (uint64_t)d.max_threads) abort();
      for (int32_t a = 0; a < l->num_args; ++a) {
        if (l->args[a].kind == TLMRT_CUDA_ARG_TENSOR && (l->args[a].tensor < 0 || l->args[a].tensor >= plan.num_tensors)) {
          abort();
        }
      }
    }
    const tlmrt_cuda_image* im = choose_image(&plan, &d, err, sizeof(err));
    if (im != NULL && (im < images || im >= images + plan.num_images)) abort();
    if (im != NULL) {
      /* the image bytes: whatever is left of the input */
      check_image_bytes(im, in.p, in.n, err, sizeof(err));
    }
  }
  return 0;
}
