/*
 * fake_libcuda.c — a stand-in libcuda.so.1 for machines without a GPU (CI), so the C runtime's
 * CUDA backend can be tested there: put the directory holding the built libcuda.so.1 first on
 * LD_LIBRARY_PATH of a subprocess.
 *
 * It exports every driver function the runtime dlsyms, with the versioned names. The probing
 * functions answer what the environment says:
 *   FAKE_CUDA_INIT_RESULT  CUresult of cuInit (default 0)
 *   FAKE_CUDA_COUNT        cuDeviceGetCount (default 1)
 *   FAKE_CUDA_CC           compute capability as major*10+minor (default 90)
 *   FAKE_CUDA_DRIVER       cuDriverGetVersion (default 13000)
 *   FAKE_CUDA_NAME         cuDeviceGetName (default "Fake GPU")
 *   FAKE_CUDA_FAIL         the name of one function (e.g. cuStreamBeginCapture_v2) that fails with
 *                          CUDA_ERROR_NOT_SUPPORTED
 * The rest simulate a device on the host, strictly enough to catch runtime bugs: device pointers
 * are host allocations and every copy and kernel argument must lie inside one; every call that
 * needs a context fails without a current one (push/pop per thread); primary contexts are
 * reference-counted; copies on a capturing stream are refused, as CUDA does for host memory; the
 * kernels of fake_kernels.cu (add_w, scale_k) run on the CPU over their grid and block; a graph
 * records its launches (with copies of the argument values) and replays them. scale_k with
 * k[0] == -1 faults like the real kernel: a sticky CUDA_ERROR_ILLEGAL_ADDRESS from then on.
 * fake_cuda_stats() reports counters for the tests. Events read a fake clock that each kernel launch
 * (direct or in a graph) advances by exactly 1000 ns, so profiles are deterministic.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum {
  OK = 0,
  E_INVALID_VALUE = 1,
  E_OUT_OF_MEMORY = 2,
  E_NOT_INITIALIZED = 3,
  E_NO_DEVICE = 100,
  E_INVALID_DEVICE = 101,
  E_INVALID_IMAGE = 200,
  E_INVALID_CONTEXT = 201,
  E_INVALID_HANDLE = 400,
  E_NOT_FOUND = 500,
  E_ILLEGAL_ADDRESS = 700,
  E_NOT_SUPPORTED = 801,
  E_CAPTURE_UNSUPPORTED = 900,
  E_CAPTURE_INVALIDATED = 901,
  E_CAPTURE_UNMATCHED = 903
};

static const struct {
  CUresult code;
  const char* name;
  const char* text;
} kErrors[] = {
    {OK, "CUDA_SUCCESS", "no error"},
    {E_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {E_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {E_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {E_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {E_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {E_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {E_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {E_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {E_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {E_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {E_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {E_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {E_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
    {E_CAPTURE_UNMATCHED, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", "capture was not initiated in this stream"},
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_initialized = 0;
static int g_sticky = 0;
static int g_launches = 0, g_graph_launches = 0, g_live_allocs = 0, g_ctx_refs = 0, g_modules = 0, g_streams = 0;
static int g_events = 0;
static uint64_t g_clock_ns = 0;

static int env_int(const char* name, int dflt) {
  const char* v = getenv(name);
  return v != NULL && v[0] != '\0' ? atoi(v) : dflt;
}

/* The named function fails when FAKE_CUDA_FAIL names it. */
static int forced(const char* fn) {
  const char* v = getenv("FAKE_CUDA_FAIL");
  return v != NULL && strcmp(v, fn) == 0;
}

#define ENTER(fn)                                      \
  do {                                                 \
    if (forced(fn)) return E_NOT_SUPPORTED;            \
    if (!g_initialized) return E_NOT_INITIALIZED;      \
    if (g_sticky) return E_ILLEGAL_ADDRESS;            \
  } while (0)

/* Releasing calls: after a sticky fault a real driver frees these with the context; the fake frees
 * them right away (and still reports the fault), so leak checks see only the runtime's own leaks. */
#define ENTER_RELEASE(fn)                              \
  do {                                                 \
    if (forced(fn)) return E_NOT_SUPPORTED;            \
    if (!g_initialized) return E_NOT_INITIALIZED;      \
  } while (0)
#define RELEASED() (g_sticky ? E_ILLEGAL_ADDRESS : OK)

/* ---- contexts: one primary context per device, a per-thread stack ------------------------------- */

typedef struct {
  int magic;
  int device;
  int refs;
} fake_ctx;

static fake_ctx g_primary[8];
static _Thread_local fake_ctx* t_stack[16];
static _Thread_local int t_depth = 0;

static fake_ctx* current(void) { return t_depth > 0 ? t_stack[t_depth - 1] : NULL; }

#define NEED_CONTEXT()                        \
  do {                                        \
    if (current() == NULL) return E_INVALID_CONTEXT; \
  } while (0)

/* ---- memory ------------------------------------------------------------------------------------ */

typedef struct {
  uint8_t* ptr;
  size_t size;
} fake_alloc;

static fake_alloc g_allocs[4096];

/* 1 when [p, p + n) lies inside one live allocation. */
static int in_device_memory(CUdeviceptr p, size_t n) {
  pthread_mutex_lock(&g_mu);
  int ok = 0;
  for (size_t i = 0; i < sizeof(g_allocs) / sizeof(g_allocs[0]) && !ok; ++i) {
    uint8_t* base = g_allocs[i].ptr;
    ok = base != NULL && (uintptr_t)p >= (uintptr_t)base && n <= g_allocs[i].size &&
         (uintptr_t)p - (uintptr_t)base <= g_allocs[i].size - n;
  }
  pthread_mutex_unlock(&g_mu);
  return ok;
}

/* ---- streams and graphs ------------------------------------------------------------------------ */

typedef struct {
  int kernel;  /* 0 add_w, 1 scale_k */
  unsigned grid, block;
  CUdeviceptr p[3];
  int64_t n;
} fake_node;

typedef struct {
  int magic;
  int capturing;
  int capture_failed;
  fake_node nodes[256];
  int num_nodes;
} fake_stream;

typedef struct {
  int magic;
  fake_node nodes[256];
  int num_nodes;
} fake_graph;

#define STREAM_MAGIC 0x57
#define GRAPH_MAGIC 0x6a
#define EXEC_MAGIC 0x6b
#define MODULE_MAGIC 0x4d

typedef struct {
  int magic;
} fake_module;

typedef struct {
  int kernel;
} fake_function;

static fake_function g_functions[2] = {{0}, {1}};

/* ---- error names ------------------------------------------------------------------------------- */

EXPORT CUresult cuGetErrorName(CUresult e, const char** s) {
  for (size_t i = 0; i < sizeof(kErrors) / sizeof(kErrors[0]); ++i) {
    if (kErrors[i].code == e) {
      *s = kErrors[i].name;
      return OK;
    }
  }
  *s = NULL;
  return E_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorString(CUresult e, const char** s) {
  for (size_t i = 0; i < sizeof(kErrors) / sizeof(kErrors[0]); ++i) {
    if (kErrors[i].code == e) {
      *s = kErrors[i].text;
      return OK;
    }
  }
  *s = NULL;
  return E_INVALID_VALUE;
}

/* ---- probing ----------------------------------------------------------------------------------- */

EXPORT CUresult cuInit(unsigned int flags) {
  if (flags != 0) return E_INVALID_VALUE;
  CUresult r = (CUresult)env_int("FAKE_CUDA_INIT_RESULT", 0);
  if (forced("cuInit")) r = E_NOT_SUPPORTED;
  if (r == OK) g_initialized = 1;
  return r;
}

EXPORT CUresult cuDriverGetVersion(int* v) {
  if (v == NULL) return E_INVALID_VALUE;
  *v = env_int("FAKE_CUDA_DRIVER", 13000);
  return OK;
}

EXPORT CUresult cuDeviceGetCount(int* n) {
  ENTER("cuDeviceGetCount");
  if (n == NULL) return E_INVALID_VALUE;
  *n = env_int("FAKE_CUDA_COUNT", 1);
  return OK;
}

EXPORT CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  ENTER("cuDeviceGet");
  if (d == NULL || ordinal < 0 || ordinal >= env_int("FAKE_CUDA_COUNT", 1) || ordinal >= 8) return E_INVALID_DEVICE;
  *d = ordinal;
  return OK;
}

EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
  ENTER("cuDeviceGetName");
  if (name == NULL || len <= 0 || d < 0 || d >= 8) return E_INVALID_VALUE;
  const char* v = getenv("FAKE_CUDA_NAME");
  snprintf(name, (size_t)len, "%s", v != NULL ? v : "Fake GPU");
  return OK;
}

EXPORT CUresult cuDeviceGetAttribute(int* out, int attr, CUdevice d) {
  ENTER("cuDeviceGetAttribute");
  if (out == NULL || d < 0 || d >= 8) return E_INVALID_VALUE;
  int cc = env_int("FAKE_CUDA_CC", 90);
  switch (attr) {
    case 1: *out = 1024; break;                            /* max threads per block */
    case 2: case 3: *out = 1024; break;                    /* max block x, y */
    case 4: *out = 64; break;                              /* max block z */
    case 5: *out = 2147483647; break;                      /* max grid x */
    case 6: case 7: *out = 65535; break;                   /* max grid y, z */
    case 8: *out = 49152; break;                           /* shared memory per block */
    case 75: *out = cc / 10; break;
    case 76: *out = cc % 10; break;
    case 97: *out = 232448; break;                         /* opt-in shared memory per block */
    default: return E_INVALID_VALUE;
  }
  return OK;
}

/* ---- contexts ---------------------------------------------------------------------------------- */

EXPORT CUresult cuDevicePrimaryCtxRetain(void** ctx, CUdevice d) {
  ENTER("cuDevicePrimaryCtxRetain");
  if (ctx == NULL || d < 0 || d >= 8) return E_INVALID_VALUE;
  pthread_mutex_lock(&g_mu);
  g_primary[d].magic = 0xc7;
  g_primary[d].device = d;
  ++g_primary[d].refs;
  ++g_ctx_refs;
  pthread_mutex_unlock(&g_mu);
  *ctx = &g_primary[d];
  return OK;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  if (!g_initialized) return E_NOT_INITIALIZED;
  if (d < 0 || d >= 8) return E_INVALID_DEVICE;
  pthread_mutex_lock(&g_mu);
  CUresult r = g_primary[d].refs > 0 ? OK : E_INVALID_CONTEXT;
  if (r == OK) {
    --g_primary[d].refs;
    --g_ctx_refs;
  }
  pthread_mutex_unlock(&g_mu);
  return r;
}

EXPORT CUresult cuCtxPushCurrent_v2(void* ctx) {
  if (forced("cuCtxPushCurrent_v2")) return E_NOT_SUPPORTED;
  if (!g_initialized) return E_NOT_INITIALIZED;
  fake_ctx* c = (fake_ctx*)ctx;
  if (c == NULL || c->magic != 0xc7 || c->refs <= 0) return E_INVALID_CONTEXT;
  if (t_depth == 16) return E_INVALID_VALUE;
  t_stack[t_depth++] = c;
  return OK;
}

EXPORT CUresult cuCtxPopCurrent_v2(void** ctx) {
  if (!g_initialized) return E_NOT_INITIALIZED;
  if (t_depth == 0) return E_INVALID_CONTEXT;
  fake_ctx* c = t_stack[--t_depth];
  if (ctx != NULL) *ctx = c;
  return OK;
}

/* ---- modules ----------------------------------------------------------------------------------- */

EXPORT CUresult cuModuleLoadData(void** module, const void* image) {
  ENTER("cuModuleLoadData");
  NEED_CONTEXT();
  if (module == NULL || image == NULL) return E_INVALID_VALUE;
  const char* s = (const char*)image;
  int elf = memcmp(s, "\x7f" "ELF", 4) == 0;
  int ptx = strstr(s, ".version") != NULL && strstr(s, ".entry") != NULL;
  if (!elf && !ptx) return E_INVALID_IMAGE;
  fake_module* m = (fake_module*)calloc(1, sizeof(fake_module));
  if (m == NULL) return E_OUT_OF_MEMORY;
  m->magic = MODULE_MAGIC;
  __atomic_add_fetch(&g_modules, 1, __ATOMIC_SEQ_CST);
  *module = m;
  return OK;
}

EXPORT CUresult cuModuleUnload(void* module) {
  ENTER_RELEASE("cuModuleUnload");
  NEED_CONTEXT();
  fake_module* m = (fake_module*)module;
  if (m == NULL || m->magic != MODULE_MAGIC) return E_INVALID_HANDLE;
  m->magic = 0;
  free(m);
  __atomic_sub_fetch(&g_modules, 1, __ATOMIC_SEQ_CST);
  return RELEASED();
}

EXPORT CUresult cuModuleGetFunction(void** fn, void* module, const char* name) {
  ENTER("cuModuleGetFunction");
  NEED_CONTEXT();
  fake_module* m = (fake_module*)module;
  if (fn == NULL || name == NULL || m == NULL || m->magic != MODULE_MAGIC) return E_INVALID_HANDLE;
  if (strcmp(name, "add_w") == 0) {
    *fn = &g_functions[0];
  } else if (strcmp(name, "scale_k") == 0) {
    *fn = &g_functions[1];
  } else {
    return E_NOT_FOUND;
  }
  return OK;
}

EXPORT CUresult cuFuncSetAttribute(void* fn, int attr, int value) {
  ENTER("cuFuncSetAttribute");
  if (fn == NULL || attr != 8 || value < 0 || value > 232448) return E_INVALID_VALUE;
  return OK;
}

/* ---- memory ------------------------------------------------------------------------------------ */

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t n) {
  ENTER("cuMemAlloc_v2");
  NEED_CONTEXT();
  if (p == NULL || n == 0) return E_INVALID_VALUE;
  uint8_t* mem = (uint8_t*)malloc(n);
  if (mem == NULL) return E_OUT_OF_MEMORY;
  memset(mem, 0xa5, n);  /* not zero: the runtime must clear what it relies on */
  pthread_mutex_lock(&g_mu);
  size_t i = 0;
  while (i < sizeof(g_allocs) / sizeof(g_allocs[0]) && g_allocs[i].ptr != NULL) ++i;
  if (i == sizeof(g_allocs) / sizeof(g_allocs[0])) {
    pthread_mutex_unlock(&g_mu);
    free(mem);
    return E_OUT_OF_MEMORY;
  }
  g_allocs[i].ptr = mem;
  g_allocs[i].size = n;
  ++g_live_allocs;
  pthread_mutex_unlock(&g_mu);
  *p = (CUdeviceptr)(uintptr_t)mem;
  return OK;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
  ENTER_RELEASE("cuMemFree_v2");
  NEED_CONTEXT();
  pthread_mutex_lock(&g_mu);
  for (size_t i = 0; i < sizeof(g_allocs) / sizeof(g_allocs[0]); ++i) {
    if (g_allocs[i].ptr != NULL && (CUdeviceptr)(uintptr_t)g_allocs[i].ptr == p) {
      free(g_allocs[i].ptr);
      g_allocs[i].ptr = NULL;
      --g_live_allocs;
      pthread_mutex_unlock(&g_mu);
      return RELEASED();
    }
  }
  pthread_mutex_unlock(&g_mu);
  return E_INVALID_VALUE;
}

EXPORT CUresult cuMemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n) {
  ENTER("cuMemsetD8_v2");
  NEED_CONTEXT();
  if (!in_device_memory(p, n)) return E_INVALID_VALUE;
  memset((void*)(uintptr_t)p, v, n);
  return OK;
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  ENTER("cuMemcpyHtoD_v2");
  NEED_CONTEXT();
  if (src == NULL || !in_device_memory(dst, n) || in_device_memory((CUdeviceptr)(uintptr_t)src, 1)) {
    return E_INVALID_VALUE;
  }
  memcpy((void*)(uintptr_t)dst, src, n);
  return OK;
}

EXPORT CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  ENTER("cuMemcpyDtoH_v2");
  NEED_CONTEXT();
  if (dst == NULL || !in_device_memory(src, n) || in_device_memory((CUdeviceptr)(uintptr_t)dst, 1)) {
    return E_INVALID_VALUE;
  }
  memcpy(dst, (const void*)(uintptr_t)src, n);
  return OK;
}

static CUresult stream_ok(void* stream) {
  fake_stream* s = (fake_stream*)stream;
  if (s == NULL || s->magic != STREAM_MAGIC) return E_INVALID_HANDLE;
  if (s->capturing) {
    s->capture_failed = 1;
    return E_CAPTURE_UNSUPPORTED;
  }
  return OK;
}

EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, void* stream) {
  ENTER("cuMemcpyHtoDAsync_v2");
  NEED_CONTEXT();
  CUresult r = stream_ok(stream);
  if (r != OK) return r;
  /* Real CUDA would take device memory here too (unified addressing); the runtime must not send it. */
  if (src == NULL || !in_device_memory(dst, n) || in_device_memory((CUdeviceptr)(uintptr_t)src, 1)) {
    return E_INVALID_VALUE;
  }
  memcpy((void*)(uintptr_t)dst, src, n);
  return OK;
}

EXPORT CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, void* stream) {
  ENTER("cuMemcpyDtoHAsync_v2");
  NEED_CONTEXT();
  CUresult r = stream_ok(stream);
  if (r != OK) return r;
  if (dst == NULL || !in_device_memory(src, n) || in_device_memory((CUdeviceptr)(uintptr_t)dst, 1)) {
    return E_INVALID_VALUE;
  }
  memcpy(dst, (const void*)(uintptr_t)src, n);
  return OK;
}

EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void* stream) {
  ENTER("cuMemcpyDtoDAsync_v2");
  NEED_CONTEXT();
  CUresult r = stream_ok(stream);
  if (r != OK) return r;
  if (!in_device_memory(dst, n) || !in_device_memory(src, n)) return E_INVALID_VALUE;
  memmove((void*)(uintptr_t)dst, (const void*)(uintptr_t)src, n);
  return OK;
}

/* ---- streams ----------------------------------------------------------------------------------- */

EXPORT CUresult cuStreamCreate(void** stream, unsigned int flags) {
  ENTER("cuStreamCreate");
  NEED_CONTEXT();
  if (stream == NULL || flags > 1) return E_INVALID_VALUE;
  fake_stream* s = (fake_stream*)calloc(1, sizeof(fake_stream));
  if (s == NULL) return E_OUT_OF_MEMORY;
  s->magic = STREAM_MAGIC;
  __atomic_add_fetch(&g_streams, 1, __ATOMIC_SEQ_CST);
  *stream = s;
  return OK;
}

EXPORT CUresult cuStreamDestroy_v2(void* stream) {
  ENTER_RELEASE("cuStreamDestroy_v2");
  NEED_CONTEXT();
  fake_stream* s = (fake_stream*)stream;
  if (s == NULL || s->magic != STREAM_MAGIC) return E_INVALID_HANDLE;
  s->magic = 0;
  free(s);
  __atomic_sub_fetch(&g_streams, 1, __ATOMIC_SEQ_CST);
  return RELEASED();
}

EXPORT CUresult cuStreamSynchronize(void* stream) {
  ENTER("cuStreamSynchronize");
  NEED_CONTEXT();
  fake_stream* s = (fake_stream*)stream;
  if (s == NULL || s->magic != STREAM_MAGIC) return E_INVALID_HANDLE;
  return s->capturing ? E_CAPTURE_UNSUPPORTED : OK;
}

EXPORT CUresult cuStreamBeginCapture_v2(void* stream, int mode) {
  ENTER("cuStreamBeginCapture_v2");
  NEED_CONTEXT();
  fake_stream* s = (fake_stream*)stream;
  if (s == NULL || s->magic != STREAM_MAGIC || mode < 0 || mode > 2) return E_INVALID_VALUE;
  if (s->capturing) return E_INVALID_VALUE;
  s->capturing = 1;
  s->capture_failed = 0;
  s->num_nodes = 0;
  return OK;
}

EXPORT CUresult cuStreamEndCapture(void* stream, void** graph) {
  ENTER("cuStreamEndCapture");
  NEED_CONTEXT();
  fake_stream* s = (fake_stream*)stream;
  if (s == NULL || s->magic != STREAM_MAGIC || graph == NULL) return E_INVALID_VALUE;
  *graph = NULL;
  if (!s->capturing) return E_CAPTURE_UNMATCHED;
  s->capturing = 0;
  if (s->capture_failed) return E_CAPTURE_INVALIDATED;
  fake_graph* g = (fake_graph*)calloc(1, sizeof(fake_graph));
  if (g == NULL) return E_OUT_OF_MEMORY;
  g->magic = GRAPH_MAGIC;
  memcpy(g->nodes, s->nodes, sizeof(g->nodes));
  g->num_nodes = s->num_nodes;
  *graph = g;
  return OK;
}

EXPORT CUresult cuGraphInstantiateWithFlags(void** exec, void* graph, unsigned long long flags) {
  ENTER("cuGraphInstantiateWithFlags");
  NEED_CONTEXT();
  fake_graph* g = (fake_graph*)graph;
  if (exec == NULL || g == NULL || g->magic != GRAPH_MAGIC || flags != 0) return E_INVALID_VALUE;
  fake_graph* e = (fake_graph*)malloc(sizeof(fake_graph));
  if (e == NULL) return E_OUT_OF_MEMORY;
  *e = *g;
  e->magic = EXEC_MAGIC;
  *exec = e;
  return OK;
}

EXPORT CUresult cuGraphDestroy(void* graph) {
  ENTER_RELEASE("cuGraphDestroy");
  fake_graph* g = (fake_graph*)graph;
  if (g == NULL || g->magic != GRAPH_MAGIC) return E_INVALID_HANDLE;
  g->magic = 0;
  free(g);
  return RELEASED();
}

EXPORT CUresult cuGraphExecDestroy(void* exec) {
  ENTER_RELEASE("cuGraphExecDestroy");
  fake_graph* e = (fake_graph*)exec;
  if (e == NULL || e->magic != EXEC_MAGIC) return E_INVALID_HANDLE;
  e->magic = 0;
  free(e);
  return RELEASED();
}

/* ---- kernels ----------------------------------------------------------------------------------- */

static CUresult run_node(const fake_node* nd) {
  int64_t threads = (int64_t)nd->grid * nd->block;
  int64_t n = nd->n;
  if (n < 0 || n > threads) n = n < 0 ? 0 : threads;
  size_t bytes = (size_t)(n > 0 ? n : 1) * 4u;
  if (nd->kernel == 0) {
    if (!in_device_memory(nd->p[0], bytes) || !in_device_memory(nd->p[1], bytes) || !in_device_memory(nd->p[2], bytes)) {
      g_sticky = 1;
      return E_ILLEGAL_ADDRESS;
    }
    const float* x = (const float*)(uintptr_t)nd->p[0];
    const float* w = (const float*)(uintptr_t)nd->p[1];
    float* y = (float*)(uintptr_t)nd->p[2];
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] + w[i];
  } else {
    if (!in_device_memory(nd->p[0], bytes) || !in_device_memory(nd->p[1], 4) || !in_device_memory(nd->p[2], bytes)) {
      g_sticky = 1;
      return E_ILLEGAL_ADDRESS;
    }
    const float* y = (const float*)(uintptr_t)nd->p[0];
    int32_t k = *(const int32_t*)(uintptr_t)nd->p[1];
    float* z = (float*)(uintptr_t)nd->p[2];
    if (k == -1) {
      g_sticky = 1;  /* the real kernel writes out of bounds; the fault shows at the next sync */
      return OK;
    }
    for (int64_t i = 0; i < n; ++i) z[i] = y[i] * (float)k;
  }
  return OK;
}

EXPORT CUresult cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                               unsigned smem, void* stream, void** params, void** extra) {
  ENTER("cuLaunchKernel");
  NEED_CONTEXT();
  fake_stream* s = (fake_stream*)stream;
  fake_function* fn = (fake_function*)f;
  if (s == NULL || s->magic != STREAM_MAGIC || fn == NULL || params == NULL || extra != NULL || smem > 232448) {
    return E_INVALID_VALUE;
  }
  if (gx == 0 || gy != 1 || gz != 1 || bx == 0 || bx > 1024 || by != 1 || bz != 1) return E_INVALID_VALUE;
  fake_node nd;
  memset(&nd, 0, sizeof(nd));
  nd.kernel = fn->kernel;
  nd.grid = gx;
  nd.block = bx;
  for (int i = 0; i < 3; ++i) nd.p[i] = *(const CUdeviceptr*)params[i];
  nd.n = fn->kernel == 0 ? (int64_t)*(const int32_t*)params[3] : *(const int64_t*)params[3];
  if (s->capturing) {
    if (s->num_nodes == 256) {
      s->capture_failed = 1;
      return E_OUT_OF_MEMORY;
    }
    s->nodes[s->num_nodes++] = nd;
    return OK;
  }
  __atomic_add_fetch(&g_launches, 1, __ATOMIC_SEQ_CST);
  __atomic_add_fetch(&g_clock_ns, 1000u, __ATOMIC_SEQ_CST);
  return run_node(&nd);
}

EXPORT CUresult cuGraphLaunch(void* exec, void* stream) {
  ENTER("cuGraphLaunch");
  NEED_CONTEXT();
  fake_graph* e = (fake_graph*)exec;
  CUresult r = stream_ok(stream);
  if (r != OK) return r;
  if (e == NULL || e->magic != EXEC_MAGIC) return E_INVALID_HANDLE;
  __atomic_add_fetch(&g_graph_launches, 1, __ATOMIC_SEQ_CST);
  __atomic_add_fetch(&g_clock_ns, 1000u * (uint64_t)e->num_nodes, __ATOMIC_SEQ_CST);
  for (int i = 0; i < e->num_nodes && r == OK; ++i) r = run_node(&e->nodes[i]);
  return r;
}

/* ---- events: the fake clock ---------------------------------------------------------------------- */

#define EVENT_MAGIC 0x45564e54
typedef struct {
  int magic;
  int recorded;
  uint64_t ns;
} fake_event;

EXPORT CUresult cuEventCreate(void** out, unsigned flags) {
  ENTER("cuEventCreate");
  NEED_CONTEXT();
  if (out == NULL || flags > 15u) return E_INVALID_VALUE;
  fake_event* e = (fake_event*)calloc(1, sizeof(fake_event));
  if (e == NULL) return E_OUT_OF_MEMORY;
  e->magic = EVENT_MAGIC;
  __atomic_add_fetch(&g_events, 1, __ATOMIC_SEQ_CST);
  *out = e;
  return OK;
}

EXPORT CUresult cuEventRecord(void* event, void* stream) {
  ENTER("cuEventRecord");
  NEED_CONTEXT();
  fake_event* e = (fake_event*)event;
  CUresult r = stream == NULL ? OK : stream_ok(stream);  /* NULL: the legacy default stream */
  if (r != OK) return r;
  if (e == NULL || e->magic != EVENT_MAGIC) return E_INVALID_HANDLE;
  e->recorded = 1;
  e->ns = __atomic_load_n(&g_clock_ns, __ATOMIC_SEQ_CST);
  return OK;
}

EXPORT CUresult cuEventElapsedTime(float* ms, void* start, void* end) {
  ENTER("cuEventElapsedTime");
  NEED_CONTEXT();
  fake_event* a = (fake_event*)start;
  fake_event* b = (fake_event*)end;
  if (ms == NULL || a == NULL || b == NULL || a->magic != EVENT_MAGIC || b->magic != EVENT_MAGIC) return E_INVALID_HANDLE;
  if (!a->recorded || !b->recorded) return E_INVALID_HANDLE;
  *ms = (float)((double)(int64_t)(b->ns - a->ns) / 1e6);
  return OK;
}

static int g_stream_waits = 0;

EXPORT CUresult cuStreamWaitEvent(void* stream, void* event, unsigned flags) {
  ENTER("cuStreamWaitEvent");
  NEED_CONTEXT();
  CUresult r = stream_ok(stream);
  if (r != OK) return r;
  fake_event* e = (fake_event*)event;
  if (e == NULL || e->magic != EVENT_MAGIC || flags != 0u) return E_INVALID_HANDLE;
  __atomic_add_fetch(&g_stream_waits, 1, __ATOMIC_SEQ_CST);
  return OK;
}

EXPORT CUresult cuEventDestroy_v2(void* event) {
  ENTER_RELEASE("cuEventDestroy_v2");
  NEED_CONTEXT();
  fake_event* e = (fake_event*)event;
  if (e == NULL || e->magic != EVENT_MAGIC) return E_INVALID_HANDLE;
  e->magic = 0;
  free(e);
  __atomic_sub_fetch(&g_events, 1, __ATOMIC_SEQ_CST);
  return RELEASED();
}

/* ---- for the tests ----------------------------------------------------------------------------- */

/* Bytes of device memory allocated and not yet freed. */
EXPORT uint64_t fake_cuda_live_bytes(void) {
  uint64_t n = 0;
  pthread_mutex_lock(&g_mu);
  for (size_t i = 0; i < sizeof(g_allocs) / sizeof(g_allocs[0]); ++i) {
    if (g_allocs[i].ptr != NULL) n += g_allocs[i].size;
  }
  pthread_mutex_unlock(&g_mu);
  return n;
}

/* cuStreamWaitEvent calls so far (tlmrt_model_wait_stream's handovers). */
EXPORT int fake_cuda_stream_waits(void) { return __atomic_load_n(&g_stream_waits, __ATOMIC_SEQ_CST); }

EXPORT void fake_cuda_stats(int out[6]) {
  out[0] = g_launches;
  out[1] = g_graph_launches;
  out[2] = g_live_allocs;
  out[3] = g_ctx_refs;
  out[4] = g_modules;
  out[5] = g_streams;
}
