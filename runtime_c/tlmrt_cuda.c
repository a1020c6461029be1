/*
 * tlmrt_cuda.c — the CUDA backend: cuda/plan.so (launch table), cubin/PTX images, one device arena.
 *
 * Nothing links against CUDA. The driver API is reached through dlopen("libcuda.so.1"), the first
 * time a CUDA model is opened (or a DLPack buffer allocated); the few types, constants and
 * functions used are declared below, ABI-compatible with cuda.h (CUDA 12/13), with the versioned
 * symbol names that cuda.h's #defines select (cuMemAlloc -> cuMemAlloc_v2, ...). The driver table
 * is the runtime's one process-wide object besides the CPU hook lock: the driver is process-wide
 * itself, and is never unloaded.
 *
 * Open, in this order (every failure is a sentence; a machine that cannot run the artifact gets
 * TLMRT_ERR_INCOMPATIBLE before anything large is read):
 *   1. libcuda.so.1, cuInit, the device (ordinal in range), its compute capability and limits;
 *   2. weights.bin mapped and hashed; SHA256SUMS checked (when opts.verify_files) before any code
 *      of the artifact is loaded;
 *   3. dlopen cuda/plan.so, validate the whole plan (ABI, tensors, I/O, every launch and argument,
 *      every image's file name), the weights' size and sha256, the driver version;
 *   4. pick the image: the cubin for the device's arch, else a cubin of the same major arch and a
 *      lower minor (SASS is compatible within a major), else PTX for an arch <= the device's
 *      (the driver JITs it); read it, hash it, check it against SHA256SUMS (when verify_files);
 *   5. on the device's primary context (shared with other users of the driver, e.g. torch):
 *      load the module, look up every launch's function (raising its dynamic shared memory limit
 *      above 48 KiB where asked), allocate ONE device block (arena, then weights), upload
 *      weights.bin once from its mapping (unmapped after the upload), create a non-blocking stream,
 *      and build every launch's kernelParams. A model whose weights another open model of the
 *      process already has on the device (same ordinal, sha256 and size: the batch plans of one
 *      artifact, or one artifact opened twice) allocates its arena only and reads that copy, which
 *      lives until the last of its models closes (shared_weights below).
 *
 * Run copies inputs into the arena (host-to-device, or device-to-device for device buffers), runs
 * the launches, copies outputs out, and synchronizes the stream; it allocates nothing. With
 * use_cuda_graph, the first run launches every kernel directly (so a launch error names its
 * kernel), and the second run captures the launch sequence (kernels only, not the copies of
 * caller buffers) into a CUDA graph, instantiates it once and replays it from then on; if capture
 * fails, the model keeps launching directly and its device name says why.
 */
#define _POSIX_C_SOURCE 200809L

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tlmrt_internal.h"

/* ---- the driver API, declared here (no CUDA headers needed to build) --------------------------- */

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st* CUcontext;
typedef struct CUmod_st* CUmodule;
typedef struct CUfunc_st* CUfunction;
typedef struct CUstream_st* CUstream;
typedef struct CUgraph_st* CUgraph;
typedef struct CUgraphExec_st* CUgraphExec;
typedef struct CUevent_st* CUevent;
typedef unsigned long long CUdeviceptr;

enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_ECC_UNCORRECTABLE = 214,
  CUDA_ERROR_INVALID_IMAGE = 200,
  CUDA_ERROR_INVALID_PTX = 218,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_ILLEGAL_ADDRESS = 700,
  CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
  CUDA_ERROR_LAUNCH_FAILED = 719
};

enum {
  CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
  CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X = 2,
  CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X = 5,
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 8,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
  CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
  CU_STREAM_NON_BLOCKING = 1,
  CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1
};

#define STATIC_SMEM_LIMIT 49152u  /* above this, a kernel must opt in to dynamic shared memory */

typedef struct {
  CUresult (*GetErrorName)(CUresult, const char**);
  CUresult (*GetErrorString)(CUresult, const char**);
  CUresult (*Init)(unsigned int);
  CUresult (*DriverGetVersion)(int*);
  CUresult (*DeviceGetCount)(int*);
  CUresult (*DeviceGet)(CUdevice*, int);
  CUresult (*DeviceGetName)(char*, int, CUdevice);
  CUresult (*DeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*DevicePrimaryCtxRelease)(CUdevice);
  CUresult (*CtxPushCurrent)(CUcontext);
  CUresult (*CtxPopCurrent)(CUcontext*);
  CUresult (*ModuleLoadData)(CUmodule*, const void*);
  CUresult (*ModuleUnload)(CUmodule);
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*FuncSetAttribute)(CUfunction, int, int);
  CUresult (*MemAlloc)(CUdeviceptr*, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
  CUresult (*MemcpyHtoD)(CUdeviceptr, const void*, size_t);
  CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream);
  CUresult (*MemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream);
  CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*StreamCreate)(CUstream*, unsigned int);
  CUresult (*StreamDestroy)(CUstream);
  CUresult (*StreamSynchronize)(CUstream);
  CUresult (*StreamBeginCapture)(CUstream, int);
  CUresult (*StreamEndCapture)(CUstream, CUgraph*);
  CUresult (*GraphInstantiateWithFlags)(CUgraphExec*, CUgraph, unsigned long long);
  CUresult (*GraphLaunch)(CUgraphExec, CUstream);
  CUresult (*GraphExecDestroy)(CUgraphExec);
  CUresult (*GraphDestroy)(CUgraph);
  CUresult (*LaunchKernel)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                           unsigned int, unsigned int, CUstream, void**, void**);
  /* Optional (profiling only): NULL when the driver lacks them. */
  CUresult (*EventCreate)(CUevent*, unsigned int);
  CUresult (*EventRecord)(CUevent, CUstream);
  CUresult (*EventElapsedTime)(float*, CUevent, CUevent);
  CUresult (*EventDestroy)(CUevent);
  /* Optional (tlmrt_model_wait_stream only). */
  CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned int);
} cuda_api;

#define API_ENTRY(sym, field) {sym, offsetof(cuda_api, field)}
static const struct {
  const char* symbol;
  size_t offset;
} kApiSymbols[] = {
    API_ENTRY("cuGetErrorName", GetErrorName),
    API_ENTRY("cuGetErrorString", GetErrorString),
    API_ENTRY("cuInit", Init),
    API_ENTRY("cuDriverGetVersion", DriverGetVersion),
    API_ENTRY("cuDeviceGetCount", DeviceGetCount),
    API_ENTRY("cuDeviceGet", DeviceGet),
    API_ENTRY("cuDeviceGetName", DeviceGetName),
    API_ENTRY("cuDeviceGetAttribute", DeviceGetAttribute),
    API_ENTRY("cuDevicePrimaryCtxRetain", DevicePrimaryCtxRetain),
    API_ENTRY("cuDevicePrimaryCtxRelease_v2", DevicePrimaryCtxRelease),
    API_ENTRY("cuCtxPushCurrent_v2", CtxPushCurrent),
    API_ENTRY("cuCtxPopCurrent_v2", CtxPopCurrent),
    API_ENTRY("cuModuleLoadData", ModuleLoadData),
    API_ENTRY("cuModuleUnload", ModuleUnload),
    API_ENTRY("cuModuleGetFunction", ModuleGetFunction),
    API_ENTRY("cuFuncSetAttribute", FuncSetAttribute),
    API_ENTRY("cuMemAlloc_v2", MemAlloc),
    API_ENTRY("cuMemFree_v2", MemFree),
    API_ENTRY("cuMemsetD8_v2", MemsetD8),
    API_ENTRY("cuMemcpyHtoD_v2", MemcpyHtoD),
    API_ENTRY("cuMemcpyHtoDAsync_v2", MemcpyHtoDAsync),
    API_ENTRY("cuMemcpyDtoHAsync_v2", MemcpyDtoHAsync),
    API_ENTRY("cuMemcpyDtoDAsync_v2", MemcpyDtoDAsync),
    API_ENTRY("cuStreamCreate", StreamCreate),
    API_ENTRY("cuStreamDestroy_v2", StreamDestroy),
    API_ENTRY("cuStreamSynchronize", StreamSynchronize),
    API_ENTRY("cuStreamBeginCapture_v2", StreamBeginCapture),
    API_ENTRY("cuStreamEndCapture", StreamEndCapture),
    API_ENTRY("cuGraphInstantiateWithFlags", GraphInstantiateWithFlags),
    API_ENTRY("cuGraphLaunch", GraphLaunch),
    API_ENTRY("cuGraphExecDestroy", GraphExecDestroy),
    API_ENTRY("cuGraphDestroy", GraphDestroy),
    API_ENTRY("cuLaunchKernel", LaunchKernel),
};

/* Loaded once per process (the driver itself is process-wide) and never unloaded. */
static pthread_once_t g_api_once = PTHREAD_ONCE_INIT;
static cuda_api g_api;
static tlmrt_status g_api_status = TLMRT_ERR_INCOMPATIBLE;
static char g_api_error[TLMRT_ERROR_CAP];

/* "CUDA_ERROR_NO_DEVICE", or "CUresult 100" when the driver cannot name it. */
static const char* cu_name(CUresult r, char buf[32]) {
  const char* s = NULL;
  if (g_api.GetErrorName != NULL && g_api.GetErrorName(r, &s) == CUDA_SUCCESS && s != NULL) return s;
  snprintf(buf, 32, "CUresult %d", r);
  return buf;
}

static const char* cu_string(CUresult r) {
  const char* s = NULL;
  if (g_api.GetErrorString != NULL && g_api.GetErrorString(r, &s) == CUDA_SUCCESS && s != NULL) return s;
  return "no description";
}

/* "<what> failed: CUDA_ERROR_X (its description)<hint>". */
static tlmrt_status cu_fail(char* err, size_t cap, tlmrt_status status, CUresult r, const char* what,
                            const char* hint) {
  char buf[32];
  return tlmrt_errorf(err, cap, status, "%s failed: %s (%s)%s", what, cu_name(r, buf), cu_string(r),
                      hint != NULL ? hint : "");
}

static void api_load(void) {
  dlerror();
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    const char* why = dlerror();
    tlmrt_errorf(g_api_error, sizeof(g_api_error), TLMRT_ERR_INCOMPATIBLE,
                 "CUDA driver library libcuda.so.1 not found (dlopen: %s); install the NVIDIA driver or "
                 "use device=cpu",
                 why != NULL ? why : "unknown error");
    return;
  }
  cuda_api api;
  memset(&api, 0, sizeof(api));
  for (size_t i = 0; i < sizeof(kApiSymbols) / sizeof(kApiSymbols[0]); ++i) {
    dlerror();
    void* sym = dlsym(lib, kApiSymbols[i].symbol);
    if (sym == NULL) {
      tlmrt_errorf(g_api_error, sizeof(g_api_error), TLMRT_ERR_INCOMPATIBLE,
                   "libcuda.so.1 has no %s; the NVIDIA driver is too old for this runtime (it needs a "
                   "driver for CUDA 12.0 or newer); update the driver or use device=cpu",
                   kApiSymbols[i].symbol);
      return;  /* the library stays loaded: unloading a driver is never safe */
    }
    memcpy((char*)&api + kApiSymbols[i].offset, &sym, sizeof(sym));
  }
  static const struct {
    const char* symbol;
    size_t offset;
  } kOptional[] = {
      API_ENTRY("cuEventCreate", EventCreate),
      API_ENTRY("cuEventRecord", EventRecord),
      API_ENTRY("cuEventElapsedTime", EventElapsedTime),
      API_ENTRY("cuEventDestroy_v2", EventDestroy),
      API_ENTRY("cuStreamWaitEvent", StreamWaitEvent),
  };
  for (size_t i = 0; i < sizeof(kOptional) / sizeof(kOptional[0]); ++i) {
    dlerror();
    void* sym = dlsym(lib, kOptional[i].symbol);
    memcpy((char*)&api + kOptional[i].offset, &sym, sizeof(sym));
  }
  /* CUDA 12.8 added cuEventElapsedTime_v2 (same signature); newer headers map the name to it. */
  dlerror();
  void* elapsed_v2 = dlsym(lib, "cuEventElapsedTime_v2");
  if (elapsed_v2 != NULL) memcpy(&api.EventElapsedTime, &elapsed_v2, sizeof(elapsed_v2));
  g_api = api;
  CUresult r = g_api.Init(0);
  if (r != CUDA_SUCCESS) {
    char buf[32];
    tlmrt_errorf(g_api_error, sizeof(g_api_error), TLMRT_ERR_INCOMPATIBLE,
                 "cuInit failed: %s (%s); no usable NVIDIA GPU here: check the driver and the GPU, or use "
                 "device=cpu",
                 cu_name(r, buf), cu_string(r));
    return;
  }
  g_api_status = TLMRT_OK;
}

static tlmrt_status api_get(char* err, size_t cap) {
  pthread_once(&g_api_once, api_load);
  if (g_api_status != TLMRT_OK) return tlmrt_errorf(err, cap, g_api_status, "%s", g_api_error);
  return TLMRT_OK;
}

/* Sticky errors leave the context unusable: every later call fails. */
static int cu_sticky(CUresult r) {
  return r == CUDA_ERROR_ECC_UNCORRECTABLE || (r >= CUDA_ERROR_ILLEGAL_ADDRESS && r <= CUDA_ERROR_LAUNCH_FAILED &&
                                               r != CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
}

/* ---- the device ------------------------------------------------------------------------------- */

typedef struct {
  int ordinal;
  CUdevice dev;
  char name[128];
  int arch;  /* major * 10 + minor */
  int driver_version;
  int max_threads, max_block[3], max_grid[3], smem_optin;
} cuda_device;

static tlmrt_status device_find(int ordinal, cuda_device* d, char* err, size_t cap) {
  memset(d, 0, sizeof(*d));
  d->ordinal = ordinal;
  tlmrt_status s = api_get(err, cap);
  if (s != TLMRT_OK) return s;
  int count = 0;
  CUresult r = g_api.DeviceGetCount(&count);
  if (r != CUDA_SUCCESS) return cu_fail(err, cap, TLMRT_ERR_INCOMPATIBLE, r, "cuDeviceGetCount", "; use device=cpu");
  if (count <= 0) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_INCOMPATIBLE,
                        "no CUDA GPU found (cuDeviceGetCount returned %d); use device=cpu", count);
  }
  if (ordinal >= count) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_INCOMPATIBLE,
                        "device cuda:%d requested, but this machine has %d CUDA GPU%s (cuda:0..cuda:%d)",
                        ordinal, count, count == 1 ? "" : "s", count - 1);
  }
  r = g_api.DeviceGet(&d->dev, ordinal);
  if (r != CUDA_SUCCESS) return cu_fail(err, cap, TLMRT_ERR_INCOMPATIBLE, r, "cuDeviceGet", NULL);
  r = g_api.DriverGetVersion(&d->driver_version);
  if (r != CUDA_SUCCESS) return cu_fail(err, cap, TLMRT_ERR_INCOMPATIBLE, r, "cuDriverGetVersion", NULL);
  r = g_api.DeviceGetName(d->name, (int)sizeof(d->name) - 1, d->dev);
  if (r != CUDA_SUCCESS) snprintf(d->name, sizeof(d->name), "(unnamed GPU)");
  d->name[sizeof(d->name) - 1] = '\0';
  struct {
    int attr;
    int* out;
  } attrs[] = {
      {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, &d->max_threads},
      {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, &d->max_block[0]},
      {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X + 1, &d->max_block[1]},
      {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X + 2, &d->max_block[2]},
      {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, &d->max_grid[0]},
      {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X + 1, &d->max_grid[1]},
      {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X + 2, &d->max_grid[2]},
      {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, &d->smem_optin},
  };
  int major = 0, minor = 0;
  r = g_api.DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d->dev);
  if (r == CUDA_SUCCESS) r = g_api.DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d->dev);
  if (r != CUDA_SUCCESS) {
    return cu_fail(err, cap, TLMRT_ERR_INCOMPATIBLE, r, "cuDeviceGetAttribute(compute capability)", NULL);
  }
  d->arch = major * 10 + minor;
  for (size_t i = 0; i < sizeof(attrs) / sizeof(attrs[0]); ++i) {
    r = g_api.DeviceGetAttribute(attrs[i].out, attrs[i].attr, d->dev);
    if (r != CUDA_SUCCESS) return cu_fail(err, cap, TLMRT_ERR_INCOMPATIBLE, r, "cuDeviceGetAttribute", NULL);
  }
  return TLMRT_OK;
}

/* ---- the model -------------------------------------------------------------------------------- */

#define PLAN_FILE "cuda/plan.so"
#define MAX_IMAGES 256
#define MAX_IMAGE_BYTES ((uint64_t)1 << 32)
#define MAX_ARGS_PER_LAUNCH 4096  /* CUDA caps a kernel's parameters at 32 KiB */

typedef union {
  CUdeviceptr ptr;
  int32_t i32;
  int64_t i64;
} cuda_arg_value;

typedef enum { GRAPH_OFF = 0, GRAPH_PENDING, GRAPH_ON, GRAPH_FAILED } graph_state;

typedef struct {
  cuda_device device;
  void* dl_handle;
  const tlmrt_cuda_plan* plan;    /* lives in dl_handle's data; validated at open */
  const tlmrt_cuda_image* image;  /* the one loaded */
  CUcontext ctx;                  /* the device's primary context, retained */
  int ctx_retained;
  CUmodule module;
  CUdeviceptr block;              /* arena, then weights (or the arena only, when the weights are shared) */
  uint64_t weights_offset;        /* of the weights inside block */
  CUdeviceptr weights;            /* the device copy of weights.bin the kernels read */
  struct shared_weights* shared;  /* the registry entry of that copy, NULL if not registered */
  CUstream stream;
  CUfunction* functions;          /* plan->num_launches */
  cuda_arg_value* values;         /* every launch's argument values, one after another */
  void** params;                  /* kernelParams: pointers into values */
  size_t* first_param;            /* plan->num_launches */
  graph_state graph;
  CUgraphExec graph_exec;
  int runs;                       /* successful runs so far */
  uint32_t fork_count;            /* tlmrt_fork_count() at open: a child process has no CUDA context */
  CUevent* events;                /* profiling: num_launches + 1 events, NULL while it is off */
  CUevent handover;               /* tlmrt_model_wait_stream's event (no timing), made on first use */
  char broken[TLMRT_ERROR_CAP];   /* why the context is unusable ("" while it is fine) */
  char graph_note[160];
  char description[512];
} cuda_model;

static tlmrt_plan_tables plan_tables(const tlmrt_cuda_plan* plan) {
  tlmrt_plan_tables t = {plan->tensors, plan->num_tensors, plan->inputs, plan->num_inputs,
                         plan->outputs, plan->num_outputs};
  return t;
}

static tlmrt_status validate_launches(const tlmrt_cuda_plan* plan, const cuda_device* d, uint64_t* out_args,
                                      char* err, size_t cap) {
  if (plan->num_launches < 0 || plan->num_launches > TLMRT_MAX_PLAN_ENTRIES ||
      (plan->num_launches > 0 && plan->launches == NULL)) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_ARTIFACT,
                        "cuda plan: expected 0..%d launches with a non-NULL table, found %d",
                        TLMRT_MAX_PLAN_ENTRIES, plan->num_launches);
  }
  uint64_t total = 0;
  for (int32_t i = 0; i < plan->num_launches; ++i) {
    const tlmrt_cuda_launch* l = &plan->launches[i];
    if (l->kernel == NULL || l->kernel[0] == '\0' || strnlen(l->kernel, 1024) == 1024) {
      return tlmrt_errorf(err, cap, TLMRT_ERR_ARTIFACT,
                          "cuda plan launch %d: expected a kernel name of 1..1023 characters, found %s", i,
                          l->kernel == NULL ? "NULL" : l->kernel[0] == '\0' ? "\"\"" : "a longer one");
    }
    const char* task = (l->task != NULL && strnlen(l->task, 1024) < 1024) ? l->task : "?";
    for (int k = 0; k < 3; ++k) {
      if (l->grid[k] == 0 || l->block[k] == 0) {
        return tlmrt_errorf(err, cap, TLMRT_ERR_ARTIFACT,
                            "cuda plan launch %d (%.200s, task %.200s): grid and block dimensions expected >= 1, "
                            "found grid (%u, %u, %u) block (%u, %u, %u)",
                            i, l->kernel, task, l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1],
                            l->block[2]);
      }
    }
    uint64_t threads = (uint64_t)l->block[0] * l->block[1] * l->block[2];
    int over = threads > (uint64_t)d->max_threads;
    for (int k = 0; k < 3; ++k) {
      over |= l->block[k] > (uint32_t)d->max_block[k] || l->grid[k] > (uint32_t)d->max_grid[k];
    }
    if (over) {
      return tlmrt_errorf(err, cap, TLMRT_ERR_INCOMPATIBLE,
                          "cuda plan launch %d (%.200s, task %.200s): grid (%u, %u, %u) block (%u, %u, %u) exceeds "
                          "what %s allows (%d threads per block, block (%d, %d, %d), grid (%d, %d, %d))",
                          i, l->kernel, task, l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1],
                          l->block[2], d->name, d->max_threads, d->max_block[0], d->max_block[1], d->max_block[2],
                          d->max_grid[0], d->max_grid[1], d->max_grid[2]);
    }
    if (l->dynamic_smem_bytes > (uint32_t)d->smem_optin && l->dynamic_smem_bytes > STATIC_SMEM_LIMIT) {
      return tlmrt_errorf(err, cap, TLMRT_ERR_INCOMPATIBLE,
                          "cuda plan launch %d (%.200s, task %.200s): %u bytes of dynamic shared memory, but %s "
                          "allows at most %d per block",
                          i, l->kernel, task, l->dynamic_smem_bytes, d->name, d->smem_optin);
    }
    if (l->num_args < 0 || l->num_args > MAX_ARGS_PER_LAUNCH || (l->num_args > 0 && l->args == NULL)) {
      return tlmrt_errorf(err, cap, TLMRT_ERR_ARTIFACT,
                          "cuda plan launch %d (%.200s): expected 0..%d arguments with a non-NULL table, found %d",
                          i, l->kernel, MAX_ARGS_PER_LAUNCH, l->num_args);
    }
    for (int32_t a = 0; a < l->num_args; ++a) {
      const tlmrt_cuda_arg* arg = &l->args[a];
      if (arg->kind == TLMRT_CUDA_ARG_TENSOR) {
        if (arg->tensor < 0 || arg->tensor >= plan->num_tensors) {
          return tlmrt_errorf(err, cap, TLMRT_ERR_ARTIFACT,
                              "cuda plan launch %d (%.200s) argument %d: tensor index expected 0..%d, found %d",
                              i, l->kernel, a, plan->num_tensors - 1, arg->tensor);
        }
      } else if (arg->kind == TLMRT_CUDA_ARG_INT32) {
        if (arg->value < INT32_MIN || arg->value > INT32_MAX) {
          return tlmrt_errorf(err, cap, TLMRT_ERR_ARTIFACT,
                              "cuda plan launch %d (%.200s) argument %d: an int32 immediate, found %" PRId64, i,
                              l->kernel, a, arg->value);
        }
      } else if (arg->kind != TLMRT_CUDA_ARG_INT64) {
        return tlmrt_errorf(err, cap, TLMRT_ERR_ARTIFACT,
                            "cuda plan launch %d (%.200s) argument %d: kind expected %d (tensor), %d (int32) or %d "
                            "(int64), found %d",
                            i, l->kernel, a, TLMRT_CUDA_ARG_TENSOR, TLMRT_CUDA_ARG_INT32, TLMRT_CUDA_ARG_INT64,
                            arg->kind);
      }
    }
    total += (uint64_t)l->num_args;
  }
  *out_args = total;
  return TLMRT_OK;
}

static tlmrt_status validate_images(const tlmrt_cuda_plan* plan, char* err, size_t cap) {
  if (plan->num_images < 1 || plan->num_images > MAX_IMAGES || plan->images == NULL) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_ARTIFACT,
                        "cuda plan: expected 1..%d images (cubins, PTX) with a non-NULL table, found %d",
                        MAX_IMAGES, plan->num_images);
  }
  for (int32_t i = 0; i < plan->num_images; ++i) {
    const tlmrt_cuda_image* im = &plan->images[i];
    const char* why = im->file == NULL ? "the name is NULL" : tlmrt_bad_path_reason(im->file);
    if (why != NULL) {
      return tlmrt_errorf(err, cap, TLMRT_ERR_ARTIFACT,
                          "cuda plan image %d: refusing the file name \"%.200s\": %s; expected a relative path "
                          "inside the artifact",
                          i, im->file == NULL ? "(null)" : im->file, why);
    }
    if (im->kind != TLMRT_CUDA_IMAGE_CUBIN && im->kind != TLMRT_CUDA_IMAGE_PTX) {
      return tlmrt_errorf(err, cap, TLMRT_ERR_ARTIFACT,
                          "cuda plan image %d (%.200s): kind expected %d (cubin) or %d (PTX), found %d", i,
                          im->file, TLMRT_CUDA_IMAGE_CUBIN, TLMRT_CUDA_IMAGE_PTX, im->kind);
    }
    if (im->arch < 10 || im->arch > 10000) {
      return tlmrt_errorf(err, cap, TLMRT_ERR_ARTIFACT,
                          "cuda plan image %d (%.200s): arch expected an SM version like 90 (sm_90), found %d",
                          i, im->file, im->arch);
    }
  }
  return TLMRT_OK;
}

/* The image for arch, per the rule at the top; NULL with a sentence when there is none. */
static const tlmrt_cuda_image* choose_image(const tlmrt_cuda_plan* plan, const cuda_device* d, char* err,
                                            size_t cap) {
  const tlmrt_cuda_image* best = NULL;
  for (int32_t i = 0; i < plan->num_images; ++i) {
    const tlmrt_cuda_image* im = &plan->images[i];
    if (im->kind == TLMRT_CUDA_IMAGE_CUBIN && im->arch == d->arch) return im;
  }
  for (int32_t i = 0; i < plan->num_images; ++i) {
    const tlmrt_cuda_image* im = &plan->images[i];
    if (im->kind == TLMRT_CUDA_IMAGE_CUBIN && im->arch / 10 == d->arch / 10 && im->arch < d->arch &&
        (best == NULL || im->arch > best->arch)) {
      best = im;
    }
  }
  if (best != NULL) return best;
  for (int32_t i = 0; i < plan->num_images; ++i) {
    const tlmrt_cuda_image* im = &plan->images[i];
    if (im->kind == TLMRT_CUDA_IMAGE_PTX && im->arch <= d->arch && (best == NULL || im->arch > best->arch)) best = im;
  }
  if (best != NULL) return best;
  char cubins[256] = "", ptx[256] = "";
  size_t nc = 0, np = 0;
  for (int32_t i = 0; i < plan->num_images; ++i) {
    const tlmrt_cuda_image* im = &plan->images[i];
    char* buf = im->kind == TLMRT_CUDA_IMAGE_CUBIN ? cubins : ptx;
    size_t* n = im->kind == TLMRT_CUDA_IMAGE_CUBIN ? &nc : &np;
    if (*n < sizeof(cubins) - 16) {
      int w = snprintf(buf + *n, sizeof(cubins) - *n, "%ssm_%d%s", *n ? ", " : "", im->arch,
                       im->kind == TLMRT_CUDA_IMAGE_PTX ? "+" : "");
      if (w > 0) *n += (size_t)w;
    }
  }
  tlmrt_errorf(err, cap, TLMRT_ERR_INCOMPATIBLE,
               "GPU %d (%s) is sm_%d; the artifact has %s%s and %s%s; rebuild it for sm_%d or use device=cpu",
               d->ordinal, d->name, d->arch, nc ? "cubins for " : "no cubins", cubins, np ? "PTX for " : "no PTX",
               ptx, d->arch);
  return NULL;
}

/* Reads dir/rel whole (plus a NUL, for PTX), hashing it. */
static tlmrt_status read_image(const char* dir, const char* rel, uint8_t** out, uint64_t* out_size, char hex[65],
                               char* err, size_t cap) {
  *out = NULL;
  *out_size = 0;
  char* path = tlmrt_join_path(dir, rel);
  if (path == NULL) return tlmrt_errorf(err, cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  tlmrt_status s = TLMRT_OK;
  uint8_t* buf = NULL;
  int fd = open(path, O_RDONLY | O_NONBLOCK);
  if (fd < 0) {
    s = tlmrt_errorf(err, cap, TLMRT_ERR_IO, "%s: cannot open (%s); expected the CUDA image the plan names", path,
                     strerror(errno));
    goto done;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 0 || (uint64_t)st.st_size > MAX_IMAGE_BYTES) {
    s = tlmrt_errorf(err, cap, TLMRT_ERR_IO, "%s: expected a regular file of at most 4 GiB", path);
    goto done;
  }
  uint64_t size = (uint64_t)st.st_size;
  buf = (uint8_t*)malloc((size_t)size + 1u);
  if (buf == NULL) {
    s = tlmrt_errorf(err, cap, TLMRT_ERR_OUT_OF_MEMORY, "cannot allocate %" PRIu64 " bytes for %s", size, rel);
    goto done;
  }
  tlmrt_sha256_ctx ctx;
  tlmrt_sha256_init(&ctx);
  uint64_t have = 0;
  while (have < size) {
    uint64_t want = size - have < (1u << 22) ? size - have : (1u << 22);
    ssize_t got = read(fd, buf + have, (size_t)want);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      int e = errno;
      s = tlmrt_errorf(err, cap, TLMRT_ERR_IO, "cannot read %s: %s", path,
                       got < 0 ? strerror(e) : "the file shrank while reading");
      goto done;
    }
    tlmrt_sha256_update(&ctx, buf + have, (size_t)got);
    have += (uint64_t)got;
  }
  buf[size] = 0;
  uint8_t digest[32];
  tlmrt_sha256_final(&ctx, digest);
  tlmrt_sha256_hex(digest, hex);
  *out = buf;
  *out_size = size;
  buf = NULL;
done:
  if (fd >= 0) close(fd);
  free(buf);
  free(path);
  return s;
}

static tlmrt_status check_image_bytes(const tlmrt_cuda_image* im, const uint8_t* data, uint64_t size, char* err,
                                      size_t cap) {
  if (im->kind == TLMRT_CUDA_IMAGE_CUBIN) {
    static const uint8_t kElf[4] = {0x7f, 'E', 'L', 'F'};
    static const uint8_t kFatbin[4] = {0x50, 0xed, 0x55, 0xba};
    if (size < 4 || (memcmp(data, kElf, 4) != 0 && memcmp(data, kFatbin, 4) != 0)) {
      return tlmrt_errorf(err, cap, TLMRT_ERR_ARTIFACT,
                          "%.200s: expected a cubin (an ELF file) or a fatbin, found something else", im->file);
    }
  } else if (size == 0 || memchr(data, '\0', (size_t)size) != NULL) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_ARTIFACT, "%.200s: expected PTX text, found %s", im->file,
                        size == 0 ? "an empty file" : "a NUL byte");
  }
  return TLMRT_OK;
}

/* Device copies of weights.bin that open models share: one per (device, sha256, size), made by the first
 * model (its block holds them after its arena) and freed with the block when the last model using
 * them closes. Entries of another fork count belong to a parent's context and are never matched. */
typedef struct shared_weights {
  struct shared_weights* next;
  int ordinal;
  uint32_t fork_count;
  uint64_t size;
  char sha256[65];
  CUdeviceptr block;    /* the first model's whole block, freed with the last reference */
  CUdeviceptr weights;  /* inside block */
  int refs;
} shared_weights;
static pthread_mutex_t g_shared_lock = PTHREAD_MUTEX_INITIALIZER;
static shared_weights* g_shared;

/* The registered copy of these weights on this device, with one more reference; NULL if none. */
static shared_weights* shared_find(int ordinal, const tlmrt_weights* w) {
  pthread_mutex_lock(&g_shared_lock);
  shared_weights* e = g_shared;
  while (e != NULL && !(e->ordinal == ordinal && e->fork_count == tlmrt_fork_count() && e->size == w->size &&
                        strcmp(e->sha256, w->sha256) == 0)) {
    e = e->next;
  }
  if (e != NULL) e->refs++;
  pthread_mutex_unlock(&g_shared_lock);
  return e;
}

/* Registers m's freshly uploaded weights (best effort: without memory for the entry, m keeps them alone). */
static void shared_add(cuda_model* m, const tlmrt_weights* w) {
  shared_weights* e = (shared_weights*)calloc(1, sizeof(shared_weights));
  if (e == NULL) return;
  e->ordinal = m->device.ordinal;
  e->fork_count = tlmrt_fork_count();
  e->size = w->size;
  memcpy(e->sha256, w->sha256, sizeof(e->sha256));
  e->block = m->block;
  e->weights = m->weights;
  e->refs = 1;
  pthread_mutex_lock(&g_shared_lock);
  e->next = g_shared;
  g_shared = e;
  pthread_mutex_unlock(&g_shared_lock);
  m->shared = e;
}

/* Drops one reference; the last one frees the block that holds the copy (the context is current). */
static void shared_release(shared_weights* e) {
  pthread_mutex_lock(&g_shared_lock);
  int last = --e->refs == 0;
  if (last) {
    shared_weights** link = &g_shared;
    while (*link != e) link = &(*link)->next;
    *link = e->next;
  }
  pthread_mutex_unlock(&g_shared_lock);
  if (last) {
    g_api.MemFree(e->block);
    free(e);
  }
}

static void cuda_close(void* state) {
  cuda_model* m = (cuda_model*)state;
  if (m == NULL) return;
  if (m->ctx != NULL && g_api.CtxPushCurrent(m->ctx) == CUDA_SUCCESS) {
    /* Errors cannot be reported from here; a broken context fails these calls harmlessly. */
    if (m->stream != NULL) g_api.StreamSynchronize(m->stream);
    if (m->events != NULL) {
      for (int32_t i = 0; i <= m->plan->num_launches; ++i) {
        if (m->events[i] != NULL) g_api.EventDestroy(m->events[i]);
      }
    }
    if (m->handover != NULL) g_api.EventDestroy(m->handover);
    if (m->graph_exec != NULL) g_api.GraphExecDestroy(m->graph_exec);
    if (m->stream != NULL) g_api.StreamDestroy(m->stream);
    if (m->block != 0 && (m->shared == NULL || m->block != m->shared->block)) g_api.MemFree(m->block);
    if (m->shared != NULL) shared_release(m->shared);
    if (m->module != NULL) g_api.ModuleUnload(m->module);
    CUcontext popped;
    g_api.CtxPopCurrent(&popped);
  }
  if (m->ctx_retained) g_api.DevicePrimaryCtxRelease(m->device.dev);
  if (m->dl_handle != NULL) dlclose(m->dl_handle);
  free(m->events);
  free(m->functions);
  free(m->values);
  free(m->params);
  free(m->first_param);
  free(m);
}

static void describe(cuda_model* m) {
  const char* graph = m->graph == GRAPH_OFF       ? "no CUDA graph"
                      : m->graph == GRAPH_PENDING ? "CUDA graph from the second run"
                      : m->graph == GRAPH_ON      ? "CUDA graph"
                                                  : "no CUDA graph: ";
  snprintf(m->description, sizeof(m->description), "cuda:%d %s sm_%d (%s %s, driver %d.%d, %s%s)",
           m->device.ordinal, m->device.name, m->device.arch,
           m->image->kind == TLMRT_CUDA_IMAGE_CUBIN ? "cubin" : "PTX", m->image->file,
           m->device.driver_version / 1000, (m->device.driver_version % 1000) / 10, graph,
           m->graph == GRAPH_FAILED ? m->graph_note : "");
}

/* Loads the module, finds the functions, allocates and fills the device block, creates the stream
 * and the kernel parameters; the context is current. */
static tlmrt_status cuda_prepare(cuda_model* m, const uint8_t* image, const tlmrt_weights* w, uint64_t total_args,
                                 char* err, size_t cap) {
  const tlmrt_cuda_plan* plan = m->plan;
  char what[320];
  CUresult r = g_api.ModuleLoadData(&m->module, image);
  if (r != CUDA_SUCCESS) {
    snprintf(what, sizeof(what), "%.200s: cuModuleLoadData", m->image->file);
    tlmrt_status st = r == CUDA_ERROR_OUT_OF_MEMORY                            ? TLMRT_ERR_OUT_OF_MEMORY
                      : (r == CUDA_ERROR_INVALID_IMAGE || r == CUDA_ERROR_INVALID_PTX) ? TLMRT_ERR_ARTIFACT
                                                                               : TLMRT_ERR_INCOMPATIBLE;
    m->module = NULL;
    return cu_fail(err, cap, st, r, what,
                   m->image->kind == TLMRT_CUDA_IMAGE_PTX ? "; the driver could not JIT the PTX for this GPU"
                                                          : NULL);
  }
  size_t nl = plan->num_launches > 0 ? (size_t)plan->num_launches : 1u;
  size_t na = total_args > 0 ? (size_t)total_args : 1u;
  m->functions = (CUfunction*)calloc(nl, sizeof(CUfunction));
  m->first_param = (size_t*)calloc(nl, sizeof(size_t));
  m->values = (cuda_arg_value*)calloc(na, sizeof(cuda_arg_value));
  m->params = (void**)calloc(na, sizeof(void*));
  if (m->functions == NULL || m->first_param == NULL || m->values == NULL || m->params == NULL) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory for %d launches", plan->num_launches);
  }
  for (int32_t i = 0; i < plan->num_launches; ++i) {
    const tlmrt_cuda_launch* l = &plan->launches[i];
    r = g_api.ModuleGetFunction(&m->functions[i], m->module, l->kernel);
    if (r != CUDA_SUCCESS) {
      snprintf(what, sizeof(what), "cuda plan launch %d: looking up kernel %.200s in %.60s", i, l->kernel,
               m->image->file);
      return cu_fail(err, cap, r == CUDA_ERROR_NOT_FOUND ? TLMRT_ERR_ARTIFACT : TLMRT_ERR_INCOMPATIBLE, r, what,
                     NULL);
    }
    if (l->dynamic_smem_bytes > STATIC_SMEM_LIMIT) {
      r = g_api.FuncSetAttribute(m->functions[i], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                 (int)l->dynamic_smem_bytes);
      if (r != CUDA_SUCCESS) {
        snprintf(what, sizeof(what), "kernel %.200s: allowing %u bytes of dynamic shared memory", l->kernel,
                 l->dynamic_smem_bytes);
        return cu_fail(err, cap, TLMRT_ERR_INCOMPATIBLE, r, what, NULL);
      }
    }
  }

  /* One block: the arena (rounded up to 256 bytes), then the weights; the arena alone when another
   * open model has these weights on this device already. */
  shared_weights* have = w->size > 0 ? shared_find(m->device.ordinal, w) : NULL;
  m->shared = have;
  uint64_t arena = (plan->arena_bytes + 255u) & ~(uint64_t)255u;
  uint64_t total;
  if (arena < plan->arena_bytes || __builtin_add_overflow(arena, have ? 0u : w->size, &total) ||
      total > (uint64_t)SIZE_MAX) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_ARTIFACT, "cuda plan: arena and weights sizes overflow");
  }
  if (total == 0) total = 256;
  m->weights_offset = arena;
  r = g_api.MemAlloc(&m->block, (size_t)total);
  if (r != CUDA_SUCCESS) {
    m->block = 0;
    if (have != NULL) {
      snprintf(what, sizeof(what), "allocating %" PRIu64 " bytes on cuda:%d (arena %" PRIu64 "; weights shared)",
               total, m->device.ordinal, plan->arena_bytes);
    } else {
      snprintf(what, sizeof(what), "allocating %" PRIu64 " bytes on cuda:%d (arena %" PRIu64 " + weights %" PRIu64 ")",
               total, m->device.ordinal, plan->arena_bytes, w->size);
    }
    return cu_fail(err, cap, r == CUDA_ERROR_OUT_OF_MEMORY ? TLMRT_ERR_OUT_OF_MEMORY : TLMRT_ERR_INCOMPATIBLE, r,
                   what, NULL);
  }
  m->weights = have != NULL ? have->weights : m->block + m->weights_offset;
  r = g_api.MemsetD8(m->block, 0, (size_t)arena);
  if (r != CUDA_SUCCESS) return cu_fail(err, cap, TLMRT_ERR_INCOMPATIBLE, r, "clearing the device arena", NULL);
  if (w->size > 0 && have == NULL) {
    r = g_api.MemcpyHtoD(m->weights, w->data, (size_t)w->size);
    if (r != CUDA_SUCCESS) return cu_fail(err, cap, TLMRT_ERR_INCOMPATIBLE, r, "uploading weights.bin", NULL);
    shared_add(m, w);
  }
  r = g_api.StreamCreate(&m->stream, CU_STREAM_NON_BLOCKING);
  if (r != CUDA_SUCCESS) {
    m->stream = NULL;
    return cu_fail(err, cap, TLMRT_ERR_INCOMPATIBLE, r, "cuStreamCreate", NULL);
  }

  size_t next = 0;
  for (int32_t i = 0; i < plan->num_launches; ++i) {
    const tlmrt_cuda_launch* l = &plan->launches[i];
    m->first_param[i] = next;
    for (int32_t a = 0; a < l->num_args; ++a, ++next) {
      const tlmrt_cuda_arg* arg = &l->args[a];
      cuda_arg_value* v = &m->values[next];
      if (arg->kind == TLMRT_CUDA_ARG_TENSOR) {
        const tlmrt_plan_tensor* t = &plan->tensors[arg->tensor];
        v->ptr = (t->storage == TLMRT_STORAGE_ARENA ? m->block : m->weights) + t->offset;
        m->params[next] = &v->ptr;
      } else if (arg->kind == TLMRT_CUDA_ARG_INT32) {
        v->i32 = (int32_t)arg->value;
        m->params[next] = &v->i32;
      } else {
        v->i64 = arg->value;
        m->params[next] = &v->i64;
      }
    }
  }
  return TLMRT_OK;
}

static tlmrt_status cuda_open(const char* dir, const tlmrt_options* opts, const char* plan_symbol,
                              void** out_state, tlmrt_plan_tables* tables, char* err, size_t cap) {
  if (plan_symbol == NULL) plan_symbol = TLMRT_CUDA_PLAN_SYMBOL;
  *out_state = NULL;
  cuda_model* m = (cuda_model*)calloc(1, sizeof(cuda_model));
  if (m == NULL) return tlmrt_errorf(err, cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  m->fork_count = tlmrt_fork_count();
  tlmrt_weights w;
  memset(&w, 0, sizeof(w));
  uint8_t* image = NULL;
  int pushed = 0;
  tlmrt_status s = device_find(opts->device_id, &m->device, err, cap);
  if (s != TLMRT_OK) goto fail;

  s = tlmrt_load_weights(dir, TLMRT_WEIGHTS_FILE, 0, &w, err, cap);
  if (s != TLMRT_OK) goto fail;
  if (opts->verify_files) {
    const char* must[] = {PLAN_FILE, TLMRT_WEIGHTS_FILE};
    const char* known_names[] = {TLMRT_WEIGHTS_FILE};
    const char* known_hex[] = {w.sha256};
    s = tlmrt_verify_sha256sums(dir, must, 2, known_names, known_hex, 1, err, cap);
    if (s != TLMRT_OK) goto fail;
  }
  void* sym = NULL;
  s = tlmrt_open_library(dir, PLAN_FILE, plan_symbol, &m->dl_handle, &sym, err, cap);
  if (s != TLMRT_OK) goto fail;
  tlmrt_cuda_plan_get_fn get_plan;
  memcpy(&get_plan, &sym, sizeof(get_plan));
  const tlmrt_cuda_plan* plan = get_plan();
  m->plan = plan;
  if (plan == NULL) {
    s = tlmrt_errorf(err, cap, TLMRT_ERR_ARTIFACT,
                     PLAN_FILE ": %s() expected to return a plan, returned NULL", plan_symbol);
    goto fail;
  }
  if (plan->abi_version != TLMRT_PLAN_ABI_VERSION) {
    s = tlmrt_errorf(err, cap, TLMRT_ERR_INCOMPATIBLE,
                     PLAN_FILE ": plan ABI version %u, but this runtime (tlmrt %s) reads version %d; rebuild the "
                     "artifact or use a matching runtime",
                     plan->abi_version, tlmrt_version(), TLMRT_PLAN_ABI_VERSION);
    goto fail;
  }
  if (plan->model_name == NULL) {
    s = tlmrt_errorf(err, cap, TLMRT_ERR_ARTIFACT, "cuda plan: expected a model name, found NULL");
    goto fail;
  }
  s = tlmrt_check_weights("cuda plan", plan->weights_bytes, plan->weights_sha256, &w, err, cap);
  if (s != TLMRT_OK) goto fail;
  tlmrt_plan_tables t = plan_tables(plan);
  s = tlmrt_validate_tables("cuda plan", &t, plan->arena_bytes, w.size, err, cap);
  if (s != TLMRT_OK) goto fail;
  uint64_t total_args = 0;
  s = validate_launches(plan, &m->device, &total_args, err, cap);
  if (s != TLMRT_OK) goto fail;
  s = validate_images(plan, err, cap);
  if (s != TLMRT_OK) goto fail;
  if (plan->min_driver_version < 0) {
    s = tlmrt_errorf(err, cap, TLMRT_ERR_ARTIFACT, "cuda plan: min_driver_version expected >= 0, found %d",
                     plan->min_driver_version);
    goto fail;
  }
  if (m->device.driver_version < plan->min_driver_version) {
    int have = m->device.driver_version, need = plan->min_driver_version;
    s = tlmrt_errorf(err, cap, TLMRT_ERR_INCOMPATIBLE,
                     "the NVIDIA driver here supports CUDA %d.%d (cuDriverGetVersion %d), but the artifact's CUDA "
                     "code needs CUDA %d.%d (%d) or newer; update the driver or use device=cpu",
                     have / 1000, (have % 1000) / 10, have, need / 1000, (need % 1000) / 10, need);
    goto fail;
  }
  m->image = choose_image(plan, &m->device, err, cap);
  if (m->image == NULL) {
    s = TLMRT_ERR_INCOMPATIBLE;
    goto fail;
  }
  uint64_t image_size = 0;
  char image_hex[65];
  s = read_image(dir, m->image->file, &image, &image_size, image_hex, err, cap);
  if (s != TLMRT_OK) goto fail;
  if (opts->verify_files) {
    s = tlmrt_sha256sums_expect(dir, m->image->file, image_hex, err, cap);
    if (s != TLMRT_OK) goto fail;
  }
  s = check_image_bytes(m->image, image, image_size, err, cap);
  if (s != TLMRT_OK) goto fail;

  CUresult r = g_api.DevicePrimaryCtxRetain(&m->ctx, m->device.dev);
  if (r != CUDA_SUCCESS) {
    m->ctx = NULL;
    s = cu_fail(err, cap, TLMRT_ERR_INCOMPATIBLE, r, "cuDevicePrimaryCtxRetain", "; the GPU cannot be used here");
    goto fail;
  }
  m->ctx_retained = 1;
  r = g_api.CtxPushCurrent(m->ctx);
  if (r != CUDA_SUCCESS) {
    s = cu_fail(err, cap, TLMRT_ERR_INCOMPATIBLE, r, "cuCtxPushCurrent", NULL);
    goto fail;
  }
  pushed = 1;
  s = cuda_prepare(m, image, &w, total_args, err, cap);
  if (s != TLMRT_OK) goto fail;
  CUcontext popped;
  g_api.CtxPopCurrent(&popped);
  pushed = 0;

  m->graph = opts->use_cuda_graph ? GRAPH_PENDING : GRAPH_OFF;
  describe(m);
  free(image);
  tlmrt_release_weights(&w);
  *tables = t;
  *out_state = m;
  return TLMRT_OK;
fail:
  if (pushed) {
    CUcontext popped;
    g_api.CtxPopCurrent(&popped);
  }
  free(image);
  tlmrt_release_weights(&w);
  cuda_close(m);
  return s;
}

/* Captures the launch sequence into a graph; on failure the model keeps launching directly. */
static void build_graph(cuda_model* m) {
  const tlmrt_cuda_plan* plan = m->plan;
  char buf[32];
  CUresult r = g_api.StreamBeginCapture(m->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  const char* step = "cuStreamBeginCapture";
  if (r == CUDA_SUCCESS) {
    for (int32_t i = 0; i < plan->num_launches && r == CUDA_SUCCESS; ++i) {
      const tlmrt_cuda_launch* l = &plan->launches[i];
      r = g_api.LaunchKernel(m->functions[i], l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1],
                             l->block[2], l->dynamic_smem_bytes, m->stream, &m->params[m->first_param[i]], NULL);
      step = "cuLaunchKernel while capturing";
    }
    CUgraph graph = NULL;
    CUresult end = g_api.StreamEndCapture(m->stream, &graph);
    if (r == CUDA_SUCCESS && end != CUDA_SUCCESS) {
      r = end;
      step = "cuStreamEndCapture";
    }
    if (r == CUDA_SUCCESS && graph == NULL) {
      r = CUDA_ERROR_INVALID_VALUE;
      step = "cuStreamEndCapture (no graph)";
    }
    if (r == CUDA_SUCCESS) {
      r = g_api.GraphInstantiateWithFlags(&m->graph_exec, graph, 0);
      step = "cuGraphInstantiateWithFlags";
      if (r != CUDA_SUCCESS) m->graph_exec = NULL;
    }
    if (graph != NULL) g_api.GraphDestroy(graph);
  }
  if (r == CUDA_SUCCESS) {
    m->graph = GRAPH_ON;
  } else {
    m->graph = GRAPH_FAILED;
    snprintf(m->graph_note, sizeof(m->graph_note), "%s failed with %s", step, cu_name(r, buf));
  }
  describe(m);
}

/* A sticky error: the context is unusable from now on. Remembers why, for this and every later run. */
static tlmrt_status fault(cuda_model* m, CUresult r, const char* where, char* err, size_t cap) {
  char buf[32];
  tlmrt_errorf(m->broken, sizeof(m->broken), TLMRT_ERR_KERNEL,
               "the model's kernels failed on cuda:%d: %s (%s), reported by %s; launches are asynchronous, so "
               "the failing kernel is not known here: run with CUDA_LAUNCH_BLOCKING=1 and use_cuda_graph=0 to "
               "find it. The CUDA context is unusable now: close the model and restart the process",
               m->device.ordinal, cu_name(r, buf), cu_string(r), where);
  return tlmrt_errorf(err, cap, TLMRT_ERR_KERNEL, "%s", m->broken);
}

static tlmrt_status copy_failed(cuda_model* m, CUresult r, const char* kind, int32_t i, const char* name,
                                const tlmrt_io* b, char* err, size_t cap) {
  char what[320];
  snprintf(what, sizeof(what), "%s %d (%.200s): copying %" PRIu64 " bytes %s %s", kind, i, name, b->nbytes,
           kind[0] == 'i' ? "from" : "to", b->device_type == TLMRT_DEVICE_CUDA ? "device memory" : "host memory");
  if (cu_sticky(r)) return fault(m, r, what, err, cap);
  return cu_fail(err, cap, r == CUDA_ERROR_INVALID_VALUE ? TLMRT_ERR_INVALID_ARGUMENT : TLMRT_ERR_KERNEL, r, what,
                 r == CUDA_ERROR_INVALID_VALUE ? "; is the buffer on this model's device and large enough?" : NULL);
}

static tlmrt_status run_on_stream(cuda_model* m, const tlmrt_io* inputs, const tlmrt_io* outputs, int timed,
                                  char* err, size_t cap) {
  const tlmrt_cuda_plan* plan = m->plan;
  CUresult r;
  for (int32_t i = 0; i < plan->num_inputs; ++i) {
    const tlmrt_plan_tensor* t = &plan->tensors[plan->inputs[i].tensor];
    if (t->nbytes == 0) continue;
    CUdeviceptr dst = m->block + t->offset;
    r = inputs[i].device_type == TLMRT_DEVICE_CUDA
            ? g_api.MemcpyDtoDAsync(dst, (CUdeviceptr)(uintptr_t)inputs[i].data, (size_t)t->nbytes, m->stream)
            : g_api.MemcpyHtoDAsync(dst, inputs[i].data, (size_t)t->nbytes, m->stream);
    if (r != CUDA_SUCCESS) return copy_failed(m, r, "input", i, plan->inputs[i].name, &inputs[i], err, cap);
  }
  if (timed) {
    r = g_api.EventRecord(m->events[0], m->stream);
    if (r != CUDA_SUCCESS) return cu_fail(err, cap, TLMRT_ERR_KERNEL, r, "cuEventRecord (profiling)", NULL);
  }
  if (m->graph_exec != NULL && !timed) {
    r = g_api.GraphLaunch(m->graph_exec, m->stream);
    if (r != CUDA_SUCCESS) {
      return cu_sticky(r) ? fault(m, r, "cuGraphLaunch", err, cap)
                          : cu_fail(err, cap, TLMRT_ERR_KERNEL, r, "cuGraphLaunch", NULL);
    }
  } else {
    for (int32_t i = 0; i < plan->num_launches; ++i) {
      const tlmrt_cuda_launch* l = &plan->launches[i];
      r = g_api.LaunchKernel(m->functions[i], l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1],
                             l->block[2], l->dynamic_smem_bytes, m->stream, &m->params[m->first_param[i]], NULL);
      if (r != CUDA_SUCCESS) {
        char what[480];
        snprintf(what, sizeof(what), "kernel %.200s (launch %d, task %.200s): cuLaunchKernel", l->kernel, i,
                 l->task != NULL ? l->task : "?");
        if (cu_sticky(r)) return fault(m, r, what, err, cap);
        return cu_fail(err, cap, TLMRT_ERR_KERNEL, r, what,
                       r == CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
                           ? "; the kernel needs more registers or shared memory per block than this GPU has"
                           : NULL);
      }
      if (timed) {
        r = g_api.EventRecord(m->events[i + 1], m->stream);
        if (r != CUDA_SUCCESS) return cu_fail(err, cap, TLMRT_ERR_KERNEL, r, "cuEventRecord (profiling)", NULL);
      }
    }
  }
  for (int32_t i = 0; i < plan->num_outputs; ++i) {
    const tlmrt_plan_tensor* t = &plan->tensors[plan->outputs[i].tensor];
    if (t->nbytes == 0 || outputs[i].data == NULL) continue;
    CUdeviceptr src = m->block + t->offset;
    r = outputs[i].device_type == TLMRT_DEVICE_CUDA
            ? g_api.MemcpyDtoDAsync((CUdeviceptr)(uintptr_t)outputs[i].data, src, (size_t)t->nbytes, m->stream)
            : g_api.MemcpyDtoHAsync(outputs[i].data, src, (size_t)t->nbytes, m->stream);
    if (r != CUDA_SUCCESS) return copy_failed(m, r, "output", i, plan->outputs[i].name, &outputs[i], err, cap);
  }
  return TLMRT_OK;
}

/* Adds each launch's time between its two events to prof (after the stream has synchronized). */
static tlmrt_status read_events(cuda_model* m, tlmrt_step_counter* prof, char* err, size_t cap) {
  for (int32_t i = 0; i < m->plan->num_launches; ++i) {
    float ms = 0.0f;
    CUresult r = g_api.EventElapsedTime(&ms, m->events[i], m->events[i + 1]);
    if (r != CUDA_SUCCESS) return cu_fail(err, cap, TLMRT_ERR_KERNEL, r, "cuEventElapsedTime (profiling)", NULL);
    uint64_t ns = ms > 0.0f ? (uint64_t)((double)ms * 1e6 + 0.5) : 0u;
    atomic_fetch_add_explicit(&prof[i].calls, 1u, memory_order_relaxed);
    atomic_fetch_add_explicit(&prof[i].ns, ns, memory_order_relaxed);
    float start_ms = 0.0f;
    if (i > 0 && g_api.EventElapsedTime(&start_ms, m->events[0], m->events[i]) != CUDA_SUCCESS) start_ms = 0.0f;
    atomic_store_explicit(&prof[i].last_start, start_ms > 0.0f ? (uint64_t)((double)start_ms * 1e6 + 0.5) : 0u,
                          memory_order_relaxed);
    atomic_store_explicit(&prof[i].last_ns, ns, memory_order_relaxed);
  }
  return TLMRT_OK;
}

static tlmrt_status cuda_run(void* state, void* ctx, const tlmrt_io* inputs, const tlmrt_io* outputs,
                             tlmrt_step_counter* prof, char* err, size_t cap) {
  cuda_model* m = (cuda_model*)state;
  (void)ctx;
  if (m->fork_count != tlmrt_fork_count()) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_INCOMPATIBLE,
                        "this CUDA model was opened before fork(), and a CUDA context does not survive fork: "
                        "open the model again in the child process");
  }
  if (m->broken[0] != '\0') {
    return tlmrt_errorf(err, cap, TLMRT_ERR_KERNEL, "this model cannot run since an earlier failure: %s", m->broken);
  }
  int timed = prof != NULL && m->events != NULL;
  CUresult r = g_api.CtxPushCurrent(m->ctx);
  if (r != CUDA_SUCCESS) return cu_fail(err, cap, TLMRT_ERR_KERNEL, r, "cuCtxPushCurrent", NULL);
  if (m->graph == GRAPH_PENDING && m->runs >= 1 && !timed) build_graph(m);
  tlmrt_status s = run_on_stream(m, inputs, outputs, timed, err, cap);
  /* Always wait: on failure too, so no copy into a caller's buffer is still in flight on return. */
  r = g_api.StreamSynchronize(m->stream);
  if (s == TLMRT_OK && r != CUDA_SUCCESS) {
    s = cu_sticky(r) ? fault(m, r, "cuStreamSynchronize", err, cap)
                     : cu_fail(err, cap, TLMRT_ERR_KERNEL, r, "cuStreamSynchronize after the launches", NULL);
  }
  if (s == TLMRT_OK && timed) s = read_events(m, prof, err, cap);
  CUcontext popped;
  g_api.CtxPopCurrent(&popped);
  if (s == TLMRT_OK) ++m->runs;
  return s;
}

/* Profiling on: one event before the first launch and one after each (made once, kept until close). */
static tlmrt_status cuda_set_profiling(void* state, int on, char* err, size_t cap) {
  cuda_model* m = (cuda_model*)state;
  if (!on || m->events != NULL) return TLMRT_OK;
  if (g_api.EventCreate == NULL || g_api.EventRecord == NULL || g_api.EventElapsedTime == NULL ||
      g_api.EventDestroy == NULL) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_INCOMPATIBLE,
                        "this NVIDIA driver's libcuda.so.1 lacks the event functions (cuEventCreate, "
                        "cuEventRecord, cuEventElapsedTime, cuEventDestroy_v2) that kernel timing needs");
  }
  int32_t n = m->plan->num_launches + 1;
  CUevent* events = (CUevent*)calloc((size_t)n, sizeof(CUevent));
  if (events == NULL) return tlmrt_errorf(err, cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  CUresult r = g_api.CtxPushCurrent(m->ctx);
  if (r != CUDA_SUCCESS) {
    free(events);
    return cu_fail(err, cap, TLMRT_ERR_KERNEL, r, "cuCtxPushCurrent", NULL);
  }
  tlmrt_status s = TLMRT_OK;
  for (int32_t i = 0; i < n && s == TLMRT_OK; ++i) {
    r = g_api.EventCreate(&events[i], 0);
    if (r != CUDA_SUCCESS) {
      events[i] = NULL;
      s = cu_fail(err, cap, TLMRT_ERR_OUT_OF_MEMORY, r, "cuEventCreate (profiling)", NULL);
    }
  }
  if (s != TLMRT_OK) {
    for (int32_t i = 0; i < n; ++i) {
      if (events[i] != NULL) g_api.EventDestroy(events[i]);
    }
    free(events);
  } else {
    m->events = events;
  }
  CUcontext popped;
  g_api.CtxPopCurrent(&popped);
  return s;
}

static tlmrt_status cuda_ctx_create(void* state, void* arena, void** out_ctx, char* err, size_t cap) {
  (void)err;
  (void)cap;
  (void)arena;  /* takes_arena 0: always NULL; the device arena is the model's (its block) */
  *out_ctx = state;  /* one run at a time (max_contexts 1): the model is its own context */
  return TLMRT_OK;
}

static void cuda_ctx_destroy(void* state, void* ctx) {
  (void)state;
  (void)ctx;
}

static void cuda_output_buffer(void* state, void* ctx, int32_t index, tlmrt_io* out) {
  cuda_model* m = (cuda_model*)state;
  (void)ctx;
  const tlmrt_plan_tensor* t = &m->plan->tensors[m->plan->outputs[index].tensor];
  out->data = (void*)(uintptr_t)(m->block + t->offset);
  out->nbytes = t->nbytes;
  out->device_type = TLMRT_DEVICE_CUDA;
  out->device_id = m->device.ordinal;
}

static uint64_t cuda_arena_bytes(void* state) { return ((cuda_model*)state)->plan->arena_bytes; }

static int32_t cuda_num_steps(void* state) { return ((cuda_model*)state)->plan->num_launches; }

static void cuda_step_name(void* state, int32_t step, const char** kernel, const char** task) {
  const tlmrt_cuda_launch* l = &((cuda_model*)state)->plan->launches[step];
  *kernel = l->kernel;
  *task = l->task != NULL ? l->task : l->kernel;
}

static void* cuda_stream(void* state) { return ((cuda_model*)state)->stream; }

#define CU_EVENT_DISABLE_TIMING 2u

/* The model's stream waits, on the device, for what `stream` holds now: one event, no host wait. */
static tlmrt_status cuda_wait_stream(void* state, void* stream, char* err, size_t cap) {
  cuda_model* m = (cuda_model*)state;
  if ((CUstream)stream == m->stream) return TLMRT_OK;
  if (m->fork_count != tlmrt_fork_count()) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_INCOMPATIBLE,
                        "this CUDA model was opened before fork(), and a CUDA context does not survive fork: "
                        "open the model again in the child process");
  }
  if (g_api.EventCreate == NULL || g_api.EventRecord == NULL || g_api.EventDestroy == NULL ||
      g_api.StreamWaitEvent == NULL) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_INCOMPATIBLE,
                        "this NVIDIA driver's libcuda.so.1 lacks cuEventCreate, cuEventRecord or cuStreamWaitEvent; "
                        "synchronize the producer's stream before the run instead");
  }
  CUresult r = g_api.CtxPushCurrent(m->ctx);
  if (r != CUDA_SUCCESS) return cu_fail(err, cap, TLMRT_ERR_KERNEL, r, "cuCtxPushCurrent", NULL);
  tlmrt_status s = TLMRT_OK;
  if (m->handover == NULL) {
    r = g_api.EventCreate(&m->handover, CU_EVENT_DISABLE_TIMING);
    if (r != CUDA_SUCCESS) {
      m->handover = NULL;
      s = cu_fail(err, cap, TLMRT_ERR_OUT_OF_MEMORY, r, "cuEventCreate (stream handover)", NULL);
    }
  }
  if (s == TLMRT_OK) {
    r = g_api.EventRecord(m->handover, (CUstream)stream);
    if (r != CUDA_SUCCESS) {
      s = cu_fail(err, cap, TLMRT_ERR_INVALID_ARGUMENT, r, "cuEventRecord on the producer's stream",
                  "; is it a stream of this model's device?");
    }
  }
  if (s == TLMRT_OK) {
    r = g_api.StreamWaitEvent(m->stream, m->handover, 0);
    if (r != CUDA_SUCCESS) s = cu_fail(err, cap, TLMRT_ERR_KERNEL, r, "cuStreamWaitEvent", NULL);
  }
  CUcontext popped;
  g_api.CtxPopCurrent(&popped);
  return s;
}

static const char* cuda_describe(void* state) { return ((cuda_model*)state)->description; }

const tlmrt_backend tlmrt_backend_cuda = {
    "cuda",           TLMRT_DEVICE_CUDA, 1,           cuda_open,    cuda_close,     cuda_ctx_create,
    cuda_ctx_destroy, cuda_run,          cuda_output_buffer, cuda_stream, cuda_wait_stream, cuda_describe,
    cuda_num_steps,
    cuda_step_name,   cuda_set_profiling, cuda_arena_bytes, 0,
};

/* ---- DLPack buffers --------------------------------------------------------------------------- */

/* dlpack.h's DLManagedTensor (unversioned), declared ABI-compatibly. */
typedef struct dl_managed_tensor {
  tlmrt_dltensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct dl_managed_tensor* self);
} dl_managed_tensor;

_Static_assert(sizeof(dl_managed_tensor) == 64, "DLManagedTensor ABI");

typedef struct {
  dl_managed_tensor managed;  /* first: the deleter gets this pointer */
  int64_t shape[TLMRT_MAX_NDIM];
  CUdevice dev;
  CUcontext ctx;
  CUdeviceptr ptr;
} dlpack_owner;

static void dlpack_delete(dl_managed_tensor* self) {
  if (self == NULL) return;
  dlpack_owner* o = (dlpack_owner*)self;
  /* Nothing can be reported from a deleter; the context stays retained until the buffer is freed. */
  if (g_api.CtxPushCurrent(o->ctx) == CUDA_SUCCESS) {
    g_api.MemFree(o->ptr);
    CUcontext popped;
    g_api.CtxPopCurrent(&popped);
  }
  g_api.DevicePrimaryCtxRelease(o->dev);
  free(o);
}

TLMRT_EXPORT tlmrt_status tlmrt_dlpack_alloc_cuda(int32_t device_id, uint8_t dtype_code, uint8_t dtype_bits,
                                                  int32_t ndim, const int64_t* shape, void** out_managed,
                                                  void** out_data) {
  size_t cap = 0;
  char* err = tlmrt_thread_error(&cap);
  err[0] = '\0';
  if (out_managed == NULL || out_data == NULL) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT, "out_managed, out_data: expected pointers, found NULL");
  }
  *out_managed = NULL;
  *out_data = NULL;
  if (device_id < 0 || ndim < 0 || ndim > TLMRT_MAX_NDIM || (ndim > 0 && shape == NULL) || dtype_bits == 0 ||
      dtype_bits % 8u != 0) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT,
                        "expected a device ordinal >= 0, ndim 0..%d with a shape, and whole-byte dtype bits; found "
                        "device %d, ndim %d, bits %u",
                        TLMRT_MAX_NDIM, device_id, ndim, (unsigned)dtype_bits);
  }
  uint64_t nbytes = dtype_bits / 8u;
  for (int32_t d = 0; d < ndim; ++d) {
    if (shape[d] < 0 || __builtin_mul_overflow(nbytes, (uint64_t)shape[d], &nbytes) || nbytes > (uint64_t)SIZE_MAX) {
      return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT,
                          "shape[%d] = %" PRId64 ": expected >= 0 and a size that fits in memory", d, shape[d]);
    }
  }
  cuda_device dev;
  tlmrt_status s = device_find(device_id, &dev, err, cap);
  if (s != TLMRT_OK) return s;
  dlpack_owner* o = (dlpack_owner*)calloc(1, sizeof(dlpack_owner));
  if (o == NULL) return tlmrt_errorf(err, cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  CUresult r = g_api.DevicePrimaryCtxRetain(&o->ctx, dev.dev);
  if (r != CUDA_SUCCESS) {
    free(o);
    return cu_fail(err, cap, TLMRT_ERR_INCOMPATIBLE, r, "cuDevicePrimaryCtxRetain", NULL);
  }
  o->dev = dev.dev;
  r = g_api.CtxPushCurrent(o->ctx);
  if (r == CUDA_SUCCESS) {
    r = g_api.MemAlloc(&o->ptr, nbytes > 0 ? (size_t)nbytes : 256u);
    CUcontext popped;
    g_api.CtxPopCurrent(&popped);
  }
  if (r != CUDA_SUCCESS) {
    g_api.DevicePrimaryCtxRelease(o->dev);
    free(o);
    char what[96];
    snprintf(what, sizeof(what), "allocating %" PRIu64 " bytes on cuda:%d", nbytes, device_id);
    return cu_fail(err, cap, r == CUDA_ERROR_OUT_OF_MEMORY ? TLMRT_ERR_OUT_OF_MEMORY : TLMRT_ERR_INCOMPATIBLE, r,
                   what, NULL);
  }
  for (int32_t d = 0; d < ndim; ++d) o->shape[d] = shape[d];
  tlmrt_dltensor* t = &o->managed.dl_tensor;
  t->data = (void*)(uintptr_t)o->ptr;
  t->device.device_type = TLMRT_DEVICE_CUDA;
  t->device.device_id = device_id;
  t->ndim = ndim;
  t->dtype.code = dtype_code;
  t->dtype.bits = dtype_bits;
  t->dtype.lanes = 1;
  t->shape = o->shape;
  t->strides = NULL;
  t->byte_offset = 0;
  o->managed.manager_ctx = o;
  o->managed.deleter = dlpack_delete;
  *out_managed = &o->managed;
  *out_data = t->data;
  return TLMRT_OK;
}
