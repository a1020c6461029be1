/*
 * tlmrt_plan.h — the contract between a generated execution plan (templates/plan.c.j2,
 * compiled into x86/model.so next to the TVM kernels) and the C runtime.
 *
 * The plan is plain C data: the runtime needs no JSON parser and no TVM. The runtime
 * never trusts it: every offset and size is bounds-checked at open.
 */
#ifndef TLMRT_PLAN_H_
#define TLMRT_PLAN_H_

#include <stdint.h>

#define TLMRT_PLAN_ABI_VERSION 1
#define TLMRT_PLAN_MAX_NDIM 8

/* Where a tensor's bytes live. */
enum {
  TLMRT_STORAGE_ARENA = 0,   /* offset into the activation arena (inputs and outputs live here too) */
  TLMRT_STORAGE_WEIGHTS = 1  /* offset into weights.bin, read-only */
};

/* A TVM packed function as the LLVM backend exports it (tvm-ffi calling convention):
 * int32_t __tvm_ffi_<name>(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result).
 * Every argument is a DLTensor* with type index 7 (kTVMFFIDLTensorPtr). */
typedef int32_t (*tlmrt_packed_fn)(void* self, const void* args, int32_t num_args, void* result);

typedef struct {
  int32_t storage;       /* TLMRT_STORAGE_* */
  uint8_t dtype_code;    /* DLPack: 0 int, 1 uint, 2 float, 6 bool */
  uint8_t dtype_bits;
  uint16_t dtype_lanes;  /* always 1 (the runtime refuses anything else) */
  uint64_t offset;       /* byte offset in its storage, 64-byte aligned */
  uint64_t nbytes;       /* product(shape) * bits / 8 */
  int32_t ndim;          /* 0..TLMRT_PLAN_MAX_NDIM */
  const int64_t* shape;  /* ndim entries (may be NULL when ndim == 0) */
} tlmrt_plan_tensor;

typedef struct {
  const char* kernel;          /* kernel name, for error messages */
  tlmrt_packed_fn fn;
  int32_t num_args;
  const int32_t* args;         /* indices into tensors[] */
} tlmrt_plan_step;

typedef struct {
  const char* name;
  int32_t tensor;              /* index into tensors[]; storage must be ARENA */
} tlmrt_plan_io;

typedef struct {
  uint32_t abi_version;        /* TLMRT_PLAN_ABI_VERSION */
  const char* model_name;
  uint64_t arena_bytes;
  uint64_t weights_bytes;      /* expected size of weights.bin */
  const char* weights_sha256;  /* lowercase hex, 64 chars */
  int32_t num_tensors;
  const tlmrt_plan_tensor* tensors;
  int32_t num_inputs;
  const tlmrt_plan_io* inputs;
  int32_t num_outputs;
  const tlmrt_plan_io* outputs;
  int32_t num_steps;
  const tlmrt_plan_step* steps;
} tlmrt_plan;

/* The one symbol a model library exports for the runtime. */
typedef const tlmrt_plan* (*tlmrt_plan_get_fn)(void);
#define TLMRT_PLAN_SYMBOL "tlmrt_plan_v1"

/* Hooks that TVM's LLVM kernels reach through global function pointers that the loader
 * fills (dlsym + store), exactly as TVM's own loader does. Declared here, ABI-compatible
 * with tvm-ffi, written for tlmpack. */
typedef struct {
  void* sync_handle;
  int32_t num_task;
} tlmrt_parallel_env;
typedef int (*tlmrt_parallel_lambda)(int task_id, tlmrt_parallel_env* penv, void* cdata);
typedef int (*tlmrt_parallel_launch_fn)(tlmrt_parallel_lambda flambda, void* cdata, int num_task);
typedef void* (*tlmrt_alloc_workspace_fn)(int device_type, int device_id, uint64_t nbytes,
                                          int dtype_code_hint, int dtype_bits_hint);
typedef int (*tlmrt_free_workspace_fn)(int device_type, int device_id, void* ptr);
#define TLMRT_HOOK_PARALLEL_LAUNCH "__TVMBackendParallelLaunch"
#define TLMRT_HOOK_ALLOC_WORKSPACE "__TVMBackendAllocWorkspace"
#define TLMRT_HOOK_FREE_WORKSPACE "__TVMBackendFreeWorkspace"

/* The runtime stores its functions into these variables after dlopen (RTLD_NOW | RTLD_LOCAL), so
 * they must stay exported from model.so; a variable that is absent is skipped. Link model.so with
 * -Wl,-Bsymbolic: then the kernels' references to these variables and to
 * TVMFFIErrorSetRaisedFromCStrParts bind inside model.so even when the process has loaded
 * libtvm_ffi.so with RTLD_GLOBAL (importing tvm_ffi in Python does), which otherwise takes the
 * kernels' error messages away from tlmrt_plan_kernel_error. A model.so that has any other TVM
 * context variable (__TVMFFIFunctionCall, __TVMFFIEnvModLookupFromImports, __TVMFFIHandleInitOnce,
 * __TVMFFIErrorSetRaisedFromCStr) is refused with TLMRT_ERR_INCOMPATIBLE: nothing fills them. */

/* The generated plan.c also defines
 *   void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t n);
 * (the kernels call it when an argument check fails; TVM's kernels leave it undefined) and keeps
 * the message in a thread-local buffer; the runtime reads it through this symbol. */
typedef const char* (*tlmrt_plan_kernel_error_fn)(void);
#define TLMRT_PLAN_KERNEL_ERROR_SYMBOL "tlmrt_plan_kernel_error"

/* Optional: the first CPU feature the kernels were built for that this CPU lacks (a name like
 * "avx512f"), or NULL when all are present. Compiled without target flags, so it runs anywhere. */
typedef const char* (*tlmrt_plan_missing_cpu_feature_fn)(void);
#define TLMRT_PLAN_MISSING_CPU_FEATURE_SYMBOL "tlmrt_plan_missing_cpu_feature"

/* Optional, one per plan: <plan symbol>_step_work() returns plan->num_steps values, each the
 * floating-point work of one call of that step in millions of operations, where the build lets the
 * pool split the step's parallel loops into more tasks than threads (0: the pool's default). A long
 * convolution split one task a thread waits for its slowest thread; smaller tasks let the others
 * take a delayed thread's share. The runtime picks the tasks per thread from the work and the
 * thread count it runs with (tlmrt_cpu.c, step_tasks). */
typedef const uint32_t* (*tlmrt_plan_step_work_fn)(void);
#define TLMRT_PLAN_STEP_WORK_SUFFIX "_step_work"

/* Optional, one per plan: <plan symbol>_tensor_bases() returns plan->num_tensors values, each the
 * index of the tensor whose bytes that tensor reuses (a view: reshape, squeeze, flatten) or its own
 * index. With it the runtime reads a 64-byte aligned input in the caller's buffer, pointing the
 * input and its views there, instead of copying it into the arena; without it every input is
 * copied. Kernels never write an input: their outputs are tensors of their own. */
typedef const int32_t* (*tlmrt_plan_tensor_bases_fn)(void);
#define TLMRT_PLAN_TENSOR_BASES_SUFFIX "_tensor_bases"


/* ---------------------------------------------------------------------------------------------
 * CUDA plan: C data in cuda/plan.so (a host library holding no code but this table), beside
 * cuda/<arch>.cubin files and one cuda/kernels.ptx. It shares tlmrt_plan_tensor and
 * tlmrt_plan_io with the x86 plan; tensors index a device arena and the device copy of
 * weights.bin. A step is one kernel launch (a TVM task may become several launches; its global
 * intermediates are arena tensors like any other).
 * ------------------------------------------------------------------------------------------- */

enum {
  TLMRT_CUDA_ARG_TENSOR = 0,  /* pass the device pointer of tensors[tensor] */
  TLMRT_CUDA_ARG_INT32 = 1,   /* pass (int32_t)value */
  TLMRT_CUDA_ARG_INT64 = 2    /* pass (int64_t)value */
};

typedef struct {
  int32_t kind;    /* TLMRT_CUDA_ARG_* */
  int32_t tensor;  /* index into tensors[] when kind == TENSOR */
  int64_t value;   /* the immediate otherwise */
} tlmrt_cuda_arg;

typedef struct {
  const char* kernel;      /* the extern "C" __global__ function's name in the module */
  const char* task;        /* the task it belongs to, for error messages */
  uint32_t grid[3];
  uint32_t block[3];
  uint32_t dynamic_smem_bytes;
  int32_t num_args;
  const tlmrt_cuda_arg* args;
} tlmrt_cuda_launch;

enum { TLMRT_CUDA_IMAGE_CUBIN = 0, TLMRT_CUDA_IMAGE_PTX = 1 };

typedef struct {
  const char* file;   /* relative to the artifact root, e.g. "cuda/sm_90.cubin", "cuda/kernels.ptx" */
  int32_t kind;       /* TLMRT_CUDA_IMAGE_* */
  int32_t arch;       /* SM version as major*10+minor: 90 for sm_90; for PTX, the lowest it JITs for */
} tlmrt_cuda_image;

typedef struct {
  uint32_t abi_version;          /* TLMRT_PLAN_ABI_VERSION */
  const char* model_name;
  uint64_t arena_bytes;          /* device arena */
  uint64_t weights_bytes;
  const char* weights_sha256;
  int32_t min_driver_version;    /* as cuDriverGetVersion reports it, e.g. 12080 */
  int32_t num_tensors;
  const tlmrt_plan_tensor* tensors;
  int32_t num_inputs;
  const tlmrt_plan_io* inputs;
  int32_t num_outputs;
  const tlmrt_plan_io* outputs;
  int32_t num_launches;
  const tlmrt_cuda_launch* launches;
  int32_t num_images;
  const tlmrt_cuda_image* images;  /* cubins first, then PTX; the runtime takes the cubin whose arch
                                      equals the device's, else PTX with arch <= the device's */
} tlmrt_cuda_plan;

typedef const tlmrt_cuda_plan* (*tlmrt_cuda_plan_get_fn)(void);
#define TLMRT_CUDA_PLAN_SYMBOL "tlmrt_cuda_plan_v1"

#endif /* TLMRT_PLAN_H_ */
