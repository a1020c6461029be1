/*
 * test_cuda.c — drives libtlmrt.so's CUDA backend over the fake CUDA artifact
 * (tests/cuda/fake_cuda_plan.c + fake_kernels.cu): on a real GPU, or on the simulated driver
 * tests/cuda/fake_libcuda.c (whose counters it then checks too).
 *
 *   test_cuda ARTIFACT_DIR [--no-graph] [--no-verify] [--fault] [--device N]
 *
 * Exit 0 and "ALL_OK" when every check passed; exit 1 with "FAIL ..." lines otherwise; exit 3 with
 * "OPEN_FAILED status=<n>: <message>" when the model does not open. "DEVICE: ...", "WRONG_DEVICE: ...",
 * "FAULT: ..." lines carry messages for tests/test_runtime_cuda.py. --fault ends with a run that makes
 * a kernel fault (k = -1), which leaves the CUDA context unusable.
 */
#define _GNU_SOURCE

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tlmrt.h"

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

static const float kW[6] = {1, 2, 3, 4, 5, 6};

typedef void (*stats_fn)(int out[6]);

/* The fake driver's counters (launches, graph launches, live allocations, context references,
 * modules, streams); NULL on a real driver. */
static stats_fn fake_stats(void) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (h == NULL) return NULL;
  void* sym = dlsym(h, "fake_cuda_stats");
  stats_fn fn = NULL;
  memcpy(&fn, &sym, sizeof(fn));
  dlclose(h);
  return fn;
}

static int close_to(float a, float b) { return a == b || (a - b < 1e-5f && b - a < 1e-5f); }

/* One host run with x = base + i, k; checks y = x + w and z = y * k. */
static void host_run(tlmrt_model* m, float base, int32_t k) {
  float x[6], y[6], z[6];
  for (int i = 0; i < 6; ++i) x[i] = base + (float)i;
  const void* in[2] = {x, &k};
  uint64_t in_n[2] = {sizeof(x), sizeof(k)};
  void* out[2] = {y, z};
  uint64_t out_n[2] = {sizeof(y), sizeof(z)};
  tlmrt_status s = tlmrt_model_run(m, in, in_n, out, out_n);
  CHECK(s == TLMRT_OK, "run: status %d: %s", (int)s, tlmrt_model_last_error(m));
  if (s != TLMRT_OK) return;
  for (int i = 0; i < 6; ++i) {
    CHECK(close_to(y[i], x[i] + kW[i]), "y[%d] = %g, expected %g", i, (double)y[i], (double)(x[i] + kW[i]));
    CHECK(close_to(z[i], (x[i] + kW[i]) * (float)k), "z[%d] = %g", i, (double)z[i]);
  }
}

typedef void (*dl_deleter)(void*);

static void dlpack_free(void* managed) {
  if (managed == NULL) return;
  dl_deleter del;
  memcpy(&del, (char*)managed + 56, sizeof(del));  /* DLManagedTensor.deleter */
  del(managed);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s ARTIFACT_DIR [--no-graph] [--no-verify] [--fault] [--device N]\n", argv[0]);
    return 2;
  }
  int graph = 1, verify = 1, do_fault = 0, device = 0;
  for (int i = 2; i < argc; ++i) {
    if (strcmp(argv[i], "--no-graph") == 0) graph = 0;
    if (strcmp(argv[i], "--no-verify") == 0) verify = 0;
    if (strcmp(argv[i], "--fault") == 0) do_fault = 1;
    if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) device = atoi(argv[++i]);
  }
  setvbuf(stdout, NULL, _IONBF, 0);

  tlmrt_options opts;
  tlmrt_options_init(&opts);
  CHECK(opts.struct_size == sizeof(tlmrt_options) && opts.device_type == TLMRT_DEVICE_CPU && opts.use_cuda_graph == 1,
        "option defaults");
  opts.device_type = TLMRT_DEVICE_CUDA;
  opts.device_id = device;
  opts.use_cuda_graph = graph;
  opts.verify_files = verify;
  tlmrt_model* m = NULL;
  tlmrt_status s = tlmrt_model_open(argv[1], &opts, &m);
  if (s != TLMRT_OK) {
    CHECK(m == NULL, "a failed open left a model");
    printf("OPEN_FAILED status=%d: %s\n", (int)s, tlmrt_open_error());
    return 3;
  }
  stats_fn stats = fake_stats();
  printf("DEVICE: %s\n", tlmrt_model_device_name(m));
  CHECK(tlmrt_model_stream(m) != NULL, "a CUDA model has a stream");
  CHECK(tlmrt_model_num_inputs(m) == 2 && tlmrt_model_num_outputs(m) == 2, "I/O counts");
  tlmrt_tensor_info info;
  CHECK(tlmrt_model_output_info(m, 1, &info) == TLMRT_OK && strcmp(info.name, "z") == 0 && info.nbytes == 24,
        "output 1 info");

  /* host buffers: the first run launches directly, later ones replay the graph */
  for (int r = 0; r < 5; ++r) host_run(m, (float)r * 10.0f, r + 1);
  const char* after = tlmrt_model_device_name(m);
  printf("DEVICE_AFTER: %s\n", after);
  int graph_on = strstr(after, ", CUDA graph)") != NULL;
  CHECK(graph || !graph_on, "a graph without use_cuda_graph");
  if (stats != NULL) {
    int st[6];
    stats(st);
    /* five runs: with a graph, the first launches each kernel and the other four replay the graph */
    if (graph_on) {
      CHECK(st[0] >= 2 && st[1] == 4, "graph: %d direct launches, %d graph launches (expected 4)", st[0], st[1]);
    } else {
      CHECK(st[0] >= 10 && st[0] % 5 == 0 && st[1] == 0, "no graph: %d direct launches, %d graph launches", st[0],
            st[1]);
    }
    CHECK(st[2] == 1 && st[3] == 1 && st[4] == 1 && st[5] == 1,
          "one device block, context reference, module and stream; found %d %d %d %d", st[2], st[3], st[4], st[5]);
  }

  /* device buffers: y stays in the arena, then feeds the next run as a device input */
  float x[6] = {1, 1, 1, 1, 1, 1}, y[6], z[6];
  int32_t k = 2;
  tlmrt_io in[2] = {{x, sizeof(x), TLMRT_DEVICE_CPU, 0}, {&k, sizeof(k), TLMRT_DEVICE_CPU, 0}};
  tlmrt_io out[2] = {{NULL, 0, TLMRT_DEVICE_CPU, 0}, {z, sizeof(z), TLMRT_DEVICE_CPU, 0}};
  s = tlmrt_model_run_io(m, in, out);
  CHECK(s == TLMRT_OK, "run_io, y left in the arena: %s", tlmrt_model_last_error(m));
  tlmrt_io ybuf;
  CHECK(tlmrt_model_output_buffer(m, 0, &ybuf) == TLMRT_OK && ybuf.device_type == TLMRT_DEVICE_CUDA &&
            ybuf.nbytes == 24 && ybuf.data != NULL,
        "output_buffer(0)");
  CHECK(tlmrt_model_output_buffer(m, 2, &ybuf) == TLMRT_ERR_INVALID_ARGUMENT, "output_buffer(2) accepted");

  void* managed_x = NULL;
  void* managed_z = NULL;
  void* dx = NULL;
  void* dz = NULL;
  int64_t shape[2] = {2, 3};
  s = tlmrt_dlpack_alloc_cuda(0, 2, 32, 2, shape, &managed_x, &dx);
  CHECK(s == TLMRT_OK && dx != NULL, "dlpack alloc x: %s", tlmrt_open_error());
  s = tlmrt_dlpack_alloc_cuda(0, 2, 32, 2, shape, &managed_z, &dz);
  CHECK(s == TLMRT_OK && dz != NULL, "dlpack alloc z: %s", tlmrt_open_error());
  if (managed_x != NULL) {
    CHECK(*(int32_t*)((char*)managed_x + 8) == TLMRT_DEVICE_CUDA && *(int32_t*)((char*)managed_x + 16) == 2 &&
              ((int64_t**)((char*)managed_x + 24))[0][1] == 3,
          "DLTensor fields");
  }
  if (dx != NULL && dz != NULL) {
    /* x_dev <- y (device to device, out of the last run's arena), z_dev <- z of a run on it */
    tlmrt_io in2[2] = {{ybuf.data, 24, TLMRT_DEVICE_CUDA, 0}, {&k, sizeof(k), TLMRT_DEVICE_CPU, 0}};
    tlmrt_io out2[2] = {{dx, 24, TLMRT_DEVICE_CUDA, 0}, {dz, 24, TLMRT_DEVICE_CUDA, 0}};
    s = tlmrt_model_run_io(m, in2, out2);  /* x = y1 = 1 + w;  y2 = x + w lands in dx;  z2 = y2 * 2 in dz */
    CHECK(s == TLMRT_OK, "run_io with device buffers: %s", tlmrt_model_last_error(m));
    tlmrt_io in3[2] = {{dz, 24, TLMRT_DEVICE_CUDA, 0}, {&k, sizeof(k), TLMRT_DEVICE_CPU, 0}};
    tlmrt_io out3[2] = {{y, sizeof(y), TLMRT_DEVICE_CPU, 0}, {z, sizeof(z), TLMRT_DEVICE_CPU, 0}};
    s = tlmrt_model_run_io(m, in3, out3);  /* y3 = z2 + w */
    CHECK(s == TLMRT_OK, "run_io from a device input: %s", tlmrt_model_last_error(m));
    for (int i = 0; i < 6; ++i) {
      float y1 = 1.0f + kW[i], y2 = y1 + kW[i], z2 = y2 * 2.0f, y3 = z2 + kW[i];
      CHECK(close_to(y[i], y3), "y3[%d] = %g, expected %g", i, (double)y[i], (double)y3);
    }
    /* a device buffer on another GPU is refused before anything runs */
    in3[0].device_id = 1;
    s = tlmrt_model_run_io(m, in3, out3);
    CHECK(s == TLMRT_ERR_INVALID_ARGUMENT, "a cuda:1 input gave status %d", (int)s);
    printf("WRONG_DEVICE: %s\n", tlmrt_model_last_error(m));
    in3[0].device_id = 0;
    in3[0].nbytes = 20;
    s = tlmrt_model_run_io(m, in3, out3);
    CHECK(s == TLMRT_ERR_INVALID_ARGUMENT && strstr(tlmrt_model_last_error(m), "expected 24 bytes, given 20"),
          "short device input: %d %s", (int)s, tlmrt_model_last_error(m));
  }
  /* a NULL output is a mistake for tlmrt_model_run, not "leave it in the arena" */
  {
    const void* hin[2] = {x, &k};
    uint64_t hin_n[2] = {sizeof(x), sizeof(k)};
    void* hout[2] = {NULL, z};
    uint64_t hout_n[2] = {0, sizeof(z)};
    s = tlmrt_model_run(m, hin, hin_n, hout, hout_n);
    CHECK(s == TLMRT_ERR_INVALID_ARGUMENT, "tlmrt_model_run took a NULL output: %d", (int)s);
  }
  host_run(m, 100.0f, 3);

  if (do_fault) {
    float fx[6] = {0};
    int32_t fk = -1;
    const void* fin[2] = {fx, &fk};
    uint64_t fin_n[2] = {sizeof(fx), sizeof(fk)};
    void* fout[2] = {y, z};
    uint64_t fout_n[2] = {sizeof(y), sizeof(z)};
    s = tlmrt_model_run(m, fin, fin_n, fout, fout_n);
    CHECK(s == TLMRT_ERR_KERNEL, "a faulting kernel gave status %d", (int)s);
    printf("FAULT: %s\n", tlmrt_model_last_error(m));
    s = tlmrt_model_run(m, fin, fin_n, fout, fout_n);
    CHECK(s == TLMRT_ERR_KERNEL, "a run after the fault gave status %d", (int)s);
    printf("AFTER_FAULT: %s\n", tlmrt_model_last_error(m));
  }
  tlmrt_model_close(m);
  dlpack_free(managed_x);
  dlpack_free(managed_z);
  if (stats != NULL && !do_fault) {
    int st[6];
    stats(st);
    CHECK(st[2] == 0 && st[3] == 0 && st[4] == 0 && st[5] == 0,
          "after close: %d allocations, %d context references, %d modules, %d streams left", st[2], st[3], st[4],
          st[5]);
  }

  if (g_failures != 0) {
    printf("FAILURES: %d\n", g_failures);
    return 1;
  }
  printf("ALL_OK\n");
  return 0;
}
