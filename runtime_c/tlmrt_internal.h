/*
 * tlmrt_internal.h — declarations shared by the runtime's .c files. Not installed, not public.
 *
 * Everything here has hidden visibility (the library is built with -fvisibility=hidden); only
 * functions marked TLMRT_EXPORT leave libtlmrt.so, and those are exactly the ones in tlmrt.h.
 */
#ifndef TLMRT_INTERNAL_H_
#define TLMRT_INTERNAL_H_

#include <stdarg.h>
#include <stdatomic.h>
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

/* tlmrt_dltensor (DLPack's DLTensor) is declared in tlmrt.h. */

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

/* The calling thread's error buffer behind tlmrt_open_error(), for calls that have no model. */
char* tlmrt_thread_error(size_t* cap);

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

/* Why `path` is not a safe relative path inside the artifact (absolute, empty, a "." or ".."
 * component, a control character, too long), or NULL when it is. */
const char* tlmrt_bad_path_reason(const char* path);

/* Looks `name` up in dir/SHA256SUMS: TLMRT_OK when it is listed with the digest `hex` (64 lowercase
 * hex digits), TLMRT_ERR_ARTIFACT when it is not listed or listed with another digest, with a
 * sentence. For files whose bytes the caller has just read and hashed itself (CUDA images). */
tlmrt_status tlmrt_sha256sums_expect(const char* dir, const char* name, const char* hex, char* err,
                                     size_t err_cap);

/* ---- shared by the backends (tlmrt_core.c) --------------------------------------------------- */

#define TLMRT_WEIGHTS_FILE "weights.bin"
/* The x86 plan's own weights when they differ from the CUDA plan's (pre-packed for its kernels). */
#define TLMRT_X86_WEIGHTS_FILE "x86/weights.bin"
#define TLMRT_MAX_PLAN_ENTRIES (1 << 24) /* tensors, steps, launches, arguments: sanity bound */

/* dir + "/" + rel, malloc'ed (NULL when out of memory). */
char* tlmrt_join_path(const char* dir, const char* rel);
/* aligned_alloc of n bytes rounded up to 64 (at least 64); NULL if n does not fit. */
void* tlmrt_alloc_aligned(uint64_t n);
/* An arena: from 2 MiB on, 2 MiB-aligned and advised to be backed by huge pages (the kernels stream
 * it, and 4 KiB pages cost a TLB miss each); smaller, tlmrt_alloc_aligned. Freed with free(). */
void* tlmrt_alloc_large(uint64_t n);
/* Whether CPU models take huge pages: yes unless TLMRT_CPU_HUGE_PAGES=0 (the weights then stay a
 * mapping of the file, shared through the page cache by every process that loads it). */
int tlmrt_huge_pages_wanted(void);
int tlmrt_is_sha256_hex(const char* s);

/* weights.bin read-only in memory (page-aligned, followed by at least 64 zero bytes): a private
 * mapping of the file, or with private_copy an anonymous copy on huge pages (2 MiB-aligned). Hashed
 * once from that memory, so the bytes checked are the bytes used. */
typedef struct {
  const uint8_t* data;
  uint64_t size;
  size_t map_len;    /* of the whole mapping (file pages + one zero page, or the copy's), for munmap */
  char sha256[65];
  const char* file;  /* the artifact-relative name it was read from (a string literal) */
} tlmrt_weights;

/* Maps `file` (TLMRT_WEIGHTS_FILE or TLMRT_X86_WEIGHTS_FILE) from the artifact directory; with
 * private_copy, copies it onto huge pages (falling back to the mapping where that memory is refused). */
tlmrt_status tlmrt_load_weights(const char* dir, const char* file, int private_copy, tlmrt_weights* out, char* err,
                                size_t err_cap);
/* Unmaps what tlmrt_load_weights mapped (nothing when it mapped nothing); safe to call twice. */
void tlmrt_release_weights(tlmrt_weights* w);
/* The plan's weights_bytes and weights_sha256 against the file's. `what` names the plan ("plan"). */
tlmrt_status tlmrt_check_weights(const char* what, uint64_t plan_bytes, const char* plan_sha256,
                                 const tlmrt_weights* w, char* err, size_t err_cap);

/* The tensor and I/O tables that both plan kinds share. */
typedef struct {
  const tlmrt_plan_tensor* tensors;
  int32_t num_tensors;
  const tlmrt_plan_io* inputs;
  int32_t num_inputs;
  const tlmrt_plan_io* outputs;
  int32_t num_outputs;
} tlmrt_plan_tables;

/* Bounds-checks every tensor (storage, dtype, shape, nbytes, 64-byte alignment, within the arena or
 * weights.bin) and every input and output (a name, an arena tensor). `what` names the plan in
 * messages ("plan", "cuda plan"). */
tlmrt_status tlmrt_validate_tables(const char* what, const tlmrt_plan_tables* t, uint64_t arena_bytes,
                                   uint64_t weights_size, char* err, size_t err_cap);

/* dlopen(dir/rel, RTLD_NOW | RTLD_LOCAL) after a stat, then dlsym(symbol). Errors: TLMRT_ERR_IO (no
 * file), TLMRT_ERR_INCOMPATIBLE (does not load here), TLMRT_ERR_ARTIFACT (no symbol). On failure
 * nothing stays open. */
tlmrt_status tlmrt_open_library(const char* dir, const char* rel, const char* symbol, void** out_handle,
                                void** out_symbol, char* err, size_t err_cap);

/* ---- backends -------------------------------------------------------------------------------- */

/* Per-step profile counters, added to by concurrent runs (relaxed atomics). */
typedef struct {
  _Atomic uint64_t calls;
  _Atomic uint64_t ns;
  _Atomic uint64_t last_start;  /* the last timed call: its start (ns from its run's start) and length */
  _Atomic uint64_t last_ns;
} tlmrt_step_counter;

/* A backend runs models on one kind of device: the CPU (tlmrt_cpu.c: x86/model.so, TVM's context
 * hooks, a thread pool) or CUDA (tlmrt_cuda.c: cuda/plan.so, cubin/PTX images, the driver API
 * through dlopen). The core (tlmrt_core.c) validates options and caller buffers, answers the
 * queries from the plan's tables, hands each run an execution context of its own, and calls the
 * backend for everything else. */
typedef struct {
  const char* name;      /* "cpu", "cuda" */
  int32_t device_type;   /* TLMRT_DEVICE_* */
  int32_t max_contexts;  /* runs one model can take at once (1: a second concurrent run is BUSY) */
  /* Loads, verifies and validates everything the model needs, so run only copies and launches.
   * Fills *tables (pointing into the plan, valid until close). On failure *out_state is NULL and
   * nothing is left open. plan_symbol: the plan library's symbol to take the plan from (a batch
   * plan's), NULL for the plain one. */
  tlmrt_status (*open)(const char* dir, const tlmrt_options* opts, const char* plan_symbol, void** out_state,
                       tlmrt_plan_tables* tables, char* err, size_t err_cap);
  void (*close)(void* state);
  /* What one run in flight needs for itself (the CPU: an arena and its argument tables), made at open
   * for the first run and when runs overlap; the weights and the code stay shared. arena: NULL (the
   * context makes its own), or, for a backend with takes_arena, a zeroed 64-byte-aligned buffer of at
   * least arena_bytes(state) bytes that the context runs in and never frees (a dynamic-batch model's
   * plans share one arena per run in flight: tlmrt_batch.c). */
  tlmrt_status (*ctx_create)(void* state, void* arena, void** out_ctx, char* err, size_t err_cap);
  void (*ctx_destroy)(void* state, void* ctx);
  /* One run in ctx. The core has checked every buffer: sizes match the plan, data is non-NULL (except
   * an output with data NULL and nbytes 0: leave it in the arena), device buffers are on this
   * model's device and only given to a backend that takes them. prof (num_steps + 1 counters) is NULL
   * unless profiling is on: then each step's calls and nanoseconds are added to prof[step], and the
   * time spent copying inputs in and outputs out to prof[num_steps] (a backend that cannot tell,
   * CUDA with its asynchronous copies, leaves it alone), and the thread pool's launches and the
   * caller's wait for its workers to prof[num_steps + 1] (CPU). */
  tlmrt_status (*run)(void* state, void* ctx, const tlmrt_io* inputs, const tlmrt_io* outputs,
                      tlmrt_step_counter* prof, char* err, size_t err_cap);
  void (*output_buffer)(void* state, void* ctx, int32_t index, tlmrt_io* out);
  void* (*stream)(void* state);
  /* Orders the next run after the work submitted so far to `stream` (CUDA); NULL if nothing to order. */
  tlmrt_status (*wait_stream)(void* state, void* stream, char* err, size_t err_cap);
  const char* (*describe)(void* state);
  /* The steps a run makes (CPU: kernel calls; CUDA: kernel launches), and their names. */
  int32_t (*num_steps)(void* state);
  void (*step_name)(void* state, int32_t step, const char** kernel, const char** task);
  /* Prepares (on = 1) or drops (0) what timing needs beyond a clock (CUDA: events); NULL if nothing. */
  tlmrt_status (*set_profiling)(void* state, int on, char* err, size_t err_cap);
  /* The bytes of activation arena one context runs in (the plan's arena_bytes; CUDA: the device arena,
   * one per model). */
  uint64_t (*arena_bytes)(void* state);
  int32_t takes_arena;  /* 1: ctx_create runs a context in the caller's arena when given one */
} tlmrt_backend;

extern const tlmrt_backend tlmrt_backend_cpu;
extern const tlmrt_backend tlmrt_backend_cuda;

/* ---- dynamic batch (tlmrt_batch.c) ------------------------------------------------------------
 *
 * An artifact with a batch_plans file has one plan per batch size (each a model of its own inside,
 * sharing the plan library and weights.bin); a run covers the caller's batch with them. */

#define TLMRT_BATCH_PLANS_FILE "batch_plans"
typedef struct tlmrt_batch tlmrt_batch;

/* Opens one plan of the artifact as a model: the core's open with the plan library's symbol.
 * own_arena 1: the first run's context (and its arena) is made now, as for any model; 0 (a backend
 * with takes_arena): no context is made, and the plan runs only through tlmrt_plan_run_in, in arenas
 * the caller gives. */
tlmrt_status tlmrt_open_plan_model(const char* dir, const tlmrt_options* opts, const char* plan_symbol, int own_arena,
                                   tlmrt_model** out, char* err, size_t err_cap);
/* Makes context `slot` of plan model m in `arena` (see ctx_create) unless it exists. The caller holds
 * the slot: no other thread uses it meanwhile. */
tlmrt_status tlmrt_plan_prepare_slot(tlmrt_model* m, int32_t slot, void* arena, char* err, size_t err_cap);
/* One run of plan model m in context `slot`, prepared before (tlmrt_plan_prepare_slot) and held by the
 * caller; buffers sized as the plan's tables say. Profiling counts it as a run of m. */
tlmrt_status tlmrt_plan_run_in(tlmrt_model* m, int32_t slot, const tlmrt_io* inputs, const tlmrt_io* outputs,
                               char* err, size_t err_cap);
/* The backend's arena bytes per context of model m, and whether its contexts take a caller's arena. */
uint64_t tlmrt_plan_arena_bytes(const tlmrt_model* m);
int tlmrt_backend_takes_arena(int32_t device_type);
/* *out NULL (and TLMRT_OK) when dir has no batch_plans file; else every batch plan, opened and
 * checked against each other. */
tlmrt_status tlmrt_batch_open(const char* dir, const tlmrt_options* opts, tlmrt_batch** out, char* err,
                              size_t err_cap);
void tlmrt_batch_close(tlmrt_batch* b);
/* The largest plan's model (its tables name the inputs and outputs). */
tlmrt_model* tlmrt_batch_largest(const tlmrt_batch* b);
int32_t tlmrt_batch_count(const tlmrt_batch* b);
int64_t tlmrt_batch_size(const tlmrt_batch* b, int32_t index);
tlmrt_model* tlmrt_batch_model(const tlmrt_batch* b, int32_t index);
/* Bytes of one sample of input (output = 0) or output (output = 1) `index`. */
uint64_t tlmrt_batch_sample_nbytes(const tlmrt_batch* b, int output, int32_t index);
const char* tlmrt_batch_describe(tlmrt_batch* b);
/* Replaces the plans' costs (one per plan, ascending batch order) and remakes the cover table. */
tlmrt_status tlmrt_batch_set_costs(tlmrt_batch* b, int32_t num_plans, const int64_t* costs, char* err, size_t err_cap);
/* The activation arena bytes the plans have allocated: with shared arenas (CPU), one arena of the
 * largest plan's size per run that has been in flight at once; else the sum of the plans' own. */
uint64_t tlmrt_batch_arena_bytes(const tlmrt_batch* b);
/* Runs `batch` samples (buffers already checked by the core: batch * sample bytes each), over the
 * plans the cost table chose for it. */
tlmrt_status tlmrt_batch_run(tlmrt_batch* b, int64_t batch, const tlmrt_io* inputs, const tlmrt_io* outputs,
                             char* err, size_t err_cap);

/* ---- the CPU thread pool and TVM's context hooks (tlmrt_cpu.c), shared with tlmrt_kernels.c ---- */

typedef struct tlmrt_cpu_pool tlmrt_cpu_pool;

/* Refuses a library (dl_handle, named `what` in messages) that has a TVM context hook this runtime
 * does not fill, starts a pool of num_threads threads (0 = online cores; the caller is thread 0)
 * and fills the library's hook variables. */
tlmrt_status tlmrt_cpu_pool_start(int32_t num_threads, void* dl_handle, const char* what, tlmrt_cpu_pool** out,
                                  char* err, size_t err_cap);
void tlmrt_cpu_pool_destroy(tlmrt_cpu_pool* pool);
/* Makes `pool` the one the launch hook uses on the calling thread if no other thread holds it (else
 * launches run serially on this thread); returns the previous one, which the caller restores with
 * tlmrt_cpu_pool_leave when its kernels are done. In a forked child it first restarts the workers. */
tlmrt_cpu_pool* tlmrt_cpu_pool_enter(tlmrt_cpu_pool* pool);
void tlmrt_cpu_pool_leave(tlmrt_cpu_pool* previous);
int tlmrt_cpu_pool_threads(const tlmrt_cpu_pool* pool);
/* While the calling thread holds a pool (after enter), counts its launches and the time it waits
 * for the workers after its own tasks into counters[0], and the launches that had to wake sleeping
 * workers into counters[1].calls; leave stops it. */
void tlmrt_cpu_pool_profile(tlmrt_step_counter* counters);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t tlmrt_now_ns(void);
/* How many times this process has been forked into being (0 in the original process): an object made
 * under another count belongs to a parent whose threads and device contexts are not here. */
uint32_t tlmrt_fork_count(void);

#endif /* TLMRT_INTERNAL_H_ */
