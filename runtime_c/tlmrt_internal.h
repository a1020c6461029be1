/*
 * tlmrt_internal.h — declarations shared by the runtime's .c files. Not installed, not public.
 *
 * Everything here has hidden visibility (the library is built with -fvisibility=hidden); only
 * functions marked TLMRT_EXPORT leave libtlmrt.so, and those are exactly the ones in tlmrt.h.
 */
#ifndef TLMRT_INTERNAL_H_
#define TLMRT_INTERNAL_H_

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "tlmrt.h"
#include "tlmrt_plan.h"

#define TLMRT_EXPORT __attribute__((visibility("default")))
#define TLMRT_ALIGNMENT 64u
#define TLMRT_ERROR_CAP 1024u

/* ---- DLPack / tvm-ffi values, declared here ABI-compatibly (not copied from TVM) ---------------- */

enum { TLMRT_DL_CPU = 1 };                 /* DLDeviceType kDLCPU */
enum { TLMRT_FFI_TYPE_DLTENSOR_PTR = 7 };  /* tvm-ffi kTVMFFIDLTensorPtr */

typedef struct {
  void* data;
  struct {
    int32_t device_type;
    int32_t device_id;
  } device;
  int32_t ndim;
  struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
  } dtype;
  int64_t* shape;
  int64_t* strides;      /* NULL: compact C order */
  uint64_t byte_offset;
} tlmrt_dltensor;

typedef struct {
  int32_t type_index;
  uint32_t zero_padding;
  union {
    int64_t v_int64;
    double v_float64;
    void* v_ptr;
  } v;
} tlmrt_ffi_any;

_Static_assert(sizeof(tlmrt_dltensor) == 48, "DLTensor ABI");
_Static_assert(offsetof(tlmrt_dltensor, ndim) == 16, "DLTensor ABI");
_Static_assert(offsetof(tlmrt_dltensor, shape) == 24, "DLTensor ABI");
_Static_assert(offsetof(tlmrt_dltensor, byte_offset) == 40, "DLTensor ABI");
_Static_assert(sizeof(tlmrt_ffi_any) == 16, "TVMFFIAny ABI");
_Static_assert(offsetof(tlmrt_ffi_any, v) == 8, "TVMFFIAny ABI");

/* TVM's fourth context hook; filled too when a model.so has it (kernels with parallel barriers). */
typedef int (*tlmrt_parallel_barrier_fn)(int task_id, tlmrt_parallel_env* penv);
#define TLMRT_HOOK_PARALLEL_BARRIER "__TVMBackendParallelBarrier"

/* ---- errors --------------------------------------------------------------------------------- */

/* Formats a sentence into buf (always NUL-terminated, truncated to cap) and returns status. */
tlmrt_status tlmrt_errorf(char* buf, size_t cap, tlmrt_status status, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- sha256 (tlmrt_sha256.c) ----------------------------------------------------------------- */

typedef struct {
  uint32_t state[8];
  uint64_t total_bytes;
  uint8_t block[64];
  uint32_t block_len;
} tlmrt_sha256_ctx;

void tlmrt_sha256_init(tlmrt_sha256_ctx* ctx);
void tlmrt_sha256_update(tlmrt_sha256_ctx* ctx, const void* data, size_t len);
void tlmrt_sha256_final(tlmrt_sha256_ctx* ctx, uint8_t digest[32]);
/* 64 lowercase hex digits and a NUL. */
void tlmrt_sha256_hex(const uint8_t digest[32], char hex[65]);

/* Hashes the file at path. Errors: TLMRT_ERR_IO (cannot open or read). */
tlmrt_status tlmrt_sha256_file(const char* path, char hex[65], char* err, size_t err_cap);

/* Checks dir/SHA256SUMS: every line is "<64 lowercase hex>  <relative path>\n", no path is
 * absolute or has a ".." component, every listed file exists and has that hash, and every name in
 * must_list[0..n) is listed. A listed file named in known_names[k] is not re-read: its hash is taken
 * from known_hex[k] (the caller hashed the very bytes it loaded). */
tlmrt_status tlmrt_verify_sha256sums(const char* dir, const char* const* must_list, int n_must,
                                     const char* const* known_names, const char* const* known_hex,
                                     int n_known, char* err, size_t err_cap);

/* ---- backends -------------------------------------------------------------------------------- */

/* A backend owns whatever a model needs to execute its kernels on one kind of device. The core
 * dlopens the model library and calls `create` with its handle; the CPU backend fills the TVM
 * context hooks there and starts its thread pool. `run_begin`/`run_end` bracket one
 * tlmrt_model_run on the calling thread (the CPU backend publishes its pool to the parallel-launch
 * hook through a thread-local pointer). A CUDA backend will add its own entry. */
typedef struct {
  const char* name;
  tlmrt_status (*create)(const tlmrt_options* opts, void* dl_handle, void** out_state, char* err,
                         size_t err_cap);
  void (*destroy)(void* state);
  void* (*run_begin)(void* state);              /* returns what run_end restores */
  void (*run_end)(void* state, void* saved);
} tlmrt_backend;

extern const tlmrt_backend tlmrt_backend_cpu;

#endif /* TLMRT_INTERNAL_H_ */
