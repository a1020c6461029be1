/*
 * fuzz_plan.c — libFuzzer target for the checks of an x86 plan (runtime_c/tlmrt_cpu.c: validate_plan,
 * tlmrt_validate_tables, tlmrt_check_weights), which stand between a model.so's data and every pointer
 * the runtime hands to kernels. The input bytes are decoded into a plan (tensors, inputs, outputs,
 * steps, arena size) over a small weights buffer.
 *
 *   clang -std=c11 -g -O1 -fsanitize=fuzzer,address,undefined -Iruntime_c tests/c/fuzz/fuzz_plan.c \
 *     runtime_c/tlmrt_core.c runtime_c/tlmrt_sha256.c runtime_c/tlmrt_cuda.c runtime_c/tlmrt_kernels.c -ldl -lpthread
 *
 * When the checks accept a plan, the target builds the shared tables and a run's context from it
 * (build_shared, cpu_ctx_create) and touches every byte of every tensor through the DLTensors a kernel
 * would get, in an arena and a weights buffer allocated to their exact sizes: AddressSanitizer then
 * reports any tensor the checks let reach outside them.
 */
#include "../../../runtime_c/tlmrt_cpu.c"

#include "fuzz_input.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#define MAX_T 12
#define MAX_S 6
#define MAX_A 6

static int32_t fake_kernel(void* self, const void* args, int32_t num_args, void* result) {
  (void)self;
  (void)args;
  (void)num_args;
  (void)result;
  return 0;
}

static void touch(const tlmrt_dltensor* t, uint64_t nbytes) {
  volatile uint8_t* p = (volatile uint8_t*)t->data;
  for (uint64_t i = 0; i < nbytes; i += 1 + nbytes / 64) p[i] = p[i];
  if (nbytes > 0) p[nbytes - 1] = p[nbytes - 1];
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz_input in = {data, size};
  static int64_t shapes[MAX_T][TLMRT_PLAN_MAX_NDIM + 2];
  static tlmrt_plan_tensor tensors[MAX_T];
  static tlmrt_plan_io ios[8];
  static tlmrt_plan_step steps[MAX_S];
  static int32_t args[MAX_S][MAX_A];
  memset(tensors, 0, sizeof(tensors));

  uint64_t weights_size = fuzz_take(&in, 2);
  tlmrt_weights w;
  memset(&w, 0, sizeof(w));
  w.file = TLMRT_WEIGHTS_FILE;
  w.size = weights_size;
  uint8_t* wbuf = (uint8_t*)malloc(weights_size > 0 ? weights_size : 1u);  /* exact size: ASan sees overruns */
  if (wbuf == NULL) return 0;
  memset(wbuf, 0x5a, weights_size);
  w.data = wbuf;
  memset(w.sha256, 'a', 64);
  w.sha256[64] = '\0';

  tlmrt_plan plan;
  memset(&plan, 0, sizeof(plan));
  uint8_t flags = (uint8_t)fuzz_take(&in, 1);
  plan.abi_version = (flags & 1) ? (uint32_t)fuzz_take(&in, 4) : TLMRT_PLAN_ABI_VERSION;
  plan.model_name = (flags & 2) ? NULL : "fuzz";
  plan.weights_bytes = (flags & 4) ? fuzz_take(&in, 8) : weights_size;
  plan.weights_sha256 = (flags & 8) ? "not a digest" : w.sha256;
  plan.arena_bytes = (flags & 16) ? fuzz_take(&in, 8) : fuzz_take(&in, 2) * 8u;

  plan.num_tensors = fuzz_count(&in, 0, MAX_T);
  plan.tensors = (flags & 32) ? NULL : tensors;
  int32_t nt = plan.num_tensors < 0 ? 0 : plan.num_tensors > MAX_T ? MAX_T : plan.num_tensors;
  for (int32_t i = 0; i < nt; ++i) {
    tlmrt_plan_tensor* t = &tensors[i];
    t->storage = (int32_t)(fuzz_take(&in, 1) % 3u);
    uint8_t dt = (uint8_t)fuzz_take(&in, 1);
    static const uint8_t kBits[] = {8, 16, 32, 64, 1, 0, 7, 128};
    t->dtype_code = (uint8_t)(dt & 7u);
    t->dtype_bits = kBits[(dt >> 3) & 7u];
    t->dtype_lanes = (dt & 0x40) ? (uint16_t)fuzz_take(&in, 2) : 1u;
    t->offset = (dt & 0x80) ? fuzz_take(&in, 8) : fuzz_take(&in, 1) * 64u;
    t->ndim = fuzz_count(&in, 0, TLMRT_PLAN_MAX_NDIM + 1);
    int32_t nd = t->ndim < 0 ? 0 : t->ndim > TLMRT_PLAN_MAX_NDIM + 1 ? TLMRT_PLAN_MAX_NDIM + 1 : t->ndim;
    uint64_t count = 1;
    for (int32_t d = 0; d < nd; ++d) {
      uint8_t sel = (uint8_t)fuzz_take(&in, 1);
      shapes[i][d] = sel == 0xff ? (int64_t)fuzz_take(&in, 8) : (int64_t)(sel % 17u) - (sel == 0xfe ? 20 : 0);
      if (shapes[i][d] >= 0) count *= (uint64_t)shapes[i][d] % (1u << 20);
    }
    t->shape = (nd > 0 && (fuzz_take(&in, 1) & 15u) == 0) ? NULL : shapes[i];
    t->nbytes = (fuzz_take(&in, 1) & 7u) == 0 ? fuzz_take(&in, 8) : count * t->dtype_bits / 8u;
  }

  plan.num_inputs = fuzz_count(&in, 0, 3);
  plan.num_outputs = fuzz_count(&in, 0, 3);
  plan.inputs = &ios[0];
  plan.outputs = &ios[4];
  for (int k = 0; k < 8; ++k) {
    ios[k].name = (fuzz_take(&in, 1) & 31u) == 0 ? NULL : "io";
    ios[k].tensor = (int32_t)fuzz_take(&in, 1) - 2;
  }

  plan.num_steps = fuzz_count(&in, 0, MAX_S);
  plan.steps = steps;
  for (int32_t s = 0; s < MAX_S; ++s) {
    steps[s].kernel = (fuzz_take(&in, 1) & 31u) == 0 ? NULL : "k";
    steps[s].fn = (fuzz_take(&in, 1) & 31u) == 0 ? NULL : fake_kernel;
    steps[s].num_args = fuzz_count(&in, 0, MAX_A);
    steps[s].args = args[s];
    for (int a = 0; a < MAX_A; ++a) args[s][a] = (int32_t)fuzz_take(&in, 1) - 2;
  }
  if (plan.num_steps > MAX_S) plan.num_steps = MAX_S;  /* the table has MAX_S entries: keep to it */
  for (int32_t s = 0; s < MAX_S; ++s) {
    if (steps[s].num_args > MAX_A) steps[s].num_args = MAX_A;
  }
  if (plan.num_tensors > MAX_T) plan.num_tensors = MAX_T;
  if (plan.num_inputs > 4) plan.num_inputs = 4;
  if (plan.num_outputs > 4) plan.num_outputs = 4;

  char err[TLMRT_ERROR_CAP];
  uint64_t total_args = 0;
  tlmrt_status s = validate_plan(&plan, &w, &total_args, err, sizeof(err));
  if (s != TLMRT_OK && (err[0] == '\0' || strchr(err, '\n') != NULL)) abort();
#ifdef FUZZ_COUNT_ACCEPTED
  if (s == TLMRT_OK) fprintf(stderr, "ACCEPTED\n");
#endif
  if (s == TLMRT_OK && plan.arena_bytes <= (1u << 22)) {
    cpu_model m;
    memset(&m, 0, sizeof(m));
    m.plan = &plan;
    m.weights = w;
    m.total_args = total_args;
    void* ctx = NULL;
    if (build_shared(&m, err, sizeof(err)) == TLMRT_OK && cpu_ctx_create(&m, NULL, &ctx, err, sizeof(err)) == TLMRT_OK) {
      cpu_ctx* c = (cpu_ctx*)ctx;
      /* the arena exactly as large as the plan says, so a tensor past its end is an ASan report */
      uint8_t* exact = (uint8_t*)malloc(plan.arena_bytes > 0 ? plan.arena_bytes : 1u);
      if (exact != NULL) {
        for (int32_t i = 0; i < plan.num_tensors; ++i) {
          tlmrt_dltensor t = c->tensors[i];
          if (tensors[i].storage == TLMRT_STORAGE_ARENA) t.data = exact + ((uint8_t*)t.data - c->arena);
          touch(&t, tensors[i].nbytes);
          for (int32_t d = 0; d < t.ndim; ++d) {
            if (t.shape[d] < 0) abort();
          }
        }
        for (int32_t st = 0; st < plan.num_steps; ++st) {
          const tlmrt_ffi_any* a = &c->args[m.step_first_arg[st]];
          for (int32_t k = 0; k < steps[st].num_args; ++k) {
            const tlmrt_dltensor* t = (const tlmrt_dltensor*)a[k].v.v_ptr;
            if (t < c->tensors || t >= c->tensors + plan.num_tensors || a[k].type_index != 7) abort();
          }
        }
        for (int32_t k = 0; k < plan.num_inputs + plan.num_outputs; ++k) {
          const tlmrt_plan_io* io = k < plan.num_inputs ? &plan.inputs[k] : &plan.outputs[k - plan.num_inputs];
          if (io->tensor < 0 || io->tensor >= plan.num_tensors || tensors[io->tensor].storage != TLMRT_STORAGE_ARENA) {
            abort();
          }
        }
        free(exact);
      }
      cpu_ctx_destroy(&m, ctx);
    }
    free(m.shapes);
    free(m.step_first_arg);
  }
  free(wbuf);
  return 0;
}
