/*
 * tlmrt.h — the whole public C API of the tlmpack runtime.
 *
 * Open an extracted artifact directory, query its inputs and outputs, run it with caller
 * buffers, read the last error, close. C11, no dependencies beyond libc, pthreads and libdl.
 * Two devices: the CPU (x86/model.so) and CUDA (cuda/plan.so + cubin/PTX images), the latter
 * through the NVIDIA driver API, dlopen'ed ("libcuda.so.1") only when a CUDA model is opened:
 * nothing links against CUDA.
 *
 *   tlmrt_options opts; tlmrt_options_init(&opts);
 *   tlmrt_model* m = NULL;
 *   if (tlmrt_model_open("model_dir", &opts, &m) != TLMRT_OK) puts(tlmrt_open_error());
 *   ...
 *   tlmrt_model_close(m);
 */
#ifndef TLMRT_H_
#define TLMRT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TLMRT_API_VERSION 8
#define TLMRT_MAX_NDIM 8

typedef enum {
  TLMRT_OK = 0,
  TLMRT_ERR_INVALID_ARGUMENT = 1, /* a caller mistake: bad index, NULL, wrong buffer size */
  TLMRT_ERR_IO = 2,               /* a file is missing or unreadable */
  TLMRT_ERR_ARTIFACT = 3,         /* the artifact is corrupted or inconsistent */
  TLMRT_ERR_INCOMPATIBLE = 4,     /* the artifact cannot run here (ABI, CPU features, device) */
  TLMRT_ERR_KERNEL = 5,           /* a kernel reported an error */
  TLMRT_ERR_OUT_OF_MEMORY = 6,
  TLMRT_ERR_BUSY = 7              /* the model takes no more concurrent runs now (since API version 4):
                                     a CUDA model one at a time, a CPU model 64 */
} tlmrt_status;

typedef struct tlmrt_model tlmrt_model;

/* Device types: DLPack's DLDeviceType values kDLCPU and kDLCUDA. */
enum { TLMRT_DEVICE_CPU = 1, TLMRT_DEVICE_CUDA = 2 };

/* Fields are only ever added at the end; struct_size tells the runtime which ones the caller knows,
 * and the ones it does not know take their defaults (a caller built against API version 1 passes 12). */
typedef struct {
  uint32_t struct_size;    /* sizeof(tlmrt_options); set by tlmrt_options_init */
  int32_t num_threads;     /* CPU: threads for parallel kernels, the caller of run included; 0 = number
                              of online cores; 1 = no worker threads. CUDA: unused */
  int32_t verify_files;    /* 1 (default): check SHA256SUMS of the artifact before loading code. With
                              0 or 1, weights.bin is always checked against the plan's size and sha256 */
  /* since API version 2 */
  int32_t device_type;     /* TLMRT_DEVICE_CPU (default): x86/model.so; TLMRT_DEVICE_CUDA: cuda/plan.so */
  int32_t device_id;       /* CUDA device ordinal (default 0); must be 0 for the CPU */
  int32_t use_cuda_graph;  /* 1 (default): from the second run on, replay the kernel launches as one
                              captured CUDA graph; 0: launch every kernel every run */
} tlmrt_options;

/* One caller buffer for tlmrt_model_run_io: host memory, or CUDA device memory (a CUdeviceptr
 * cast to void*). */
typedef struct {
  void* data;
  uint64_t nbytes;
  int32_t device_type;  /* TLMRT_DEVICE_CPU or TLMRT_DEVICE_CUDA */
  int32_t device_id;    /* the CUDA ordinal; 0 for the CPU */
} tlmrt_io;

typedef struct {
  const char* name;      /* owned by the model; valid until close */
  uint8_t dtype_code;    /* DLPack codes: 0 int, 1 uint, 2 float, 6 bool */
  uint8_t dtype_bits;
  int32_t ndim;
  int64_t shape[TLMRT_MAX_NDIM];
  uint64_t nbytes;
} tlmrt_tensor_info;

/* Fills *opts with the defaults, for a caller whose tlmrt_options has `size` bytes: fields past it are
 * left alone, and struct_size is set to `size`. Use the macro, which passes sizeof from the header
 * the caller was compiled with, so a newer library never writes past an older caller's struct. */
void tlmrt_options_init_sized(tlmrt_options* opts, uint32_t size);
#define tlmrt_options_init(opts) tlmrt_options_init_sized((opts), (uint32_t)sizeof(tlmrt_options))
/* The library also exports tlmrt_options_init(opts) itself, for callers built against API version 1:
 * it fills the 12 bytes those callers have. */

/* Opens the artifact directory `dir` (holding manifest.json, SHA256SUMS, weights.bin and
 * x86/model.so, or cuda/plan.so and its images for opts->device_type TLMRT_DEVICE_CUDA). On failure
 * *out is NULL and tlmrt_open_error() says why; a machine that cannot run the device (no
 * libcuda.so.1, no GPU, a GPU the artifact has no code for, a driver that is too old) gives
 * TLMRT_ERR_INCOMPATIBLE. A CPU model (not a dynamic-batch one) copies weights.bin into memory of its
 * own on huge pages where the kernel gives them, and its arenas from 2 MiB on go there too; with
 * TLMRT_CPU_HUGE_PAGES=0 in the environment at open, it maps the file instead (one page cache for
 * every process that opens it) and its arenas are plain. */
tlmrt_status tlmrt_model_open(const char* dir, const tlmrt_options* opts, tlmrt_model** out);

/* The reason the calling thread's last tlmrt_model_open (or tlmrt_dlpack_alloc_cuda) failed ("" if
 * none). */
const char* tlmrt_open_error(void);

int32_t tlmrt_model_num_inputs(const tlmrt_model* m);
int32_t tlmrt_model_num_outputs(const tlmrt_model* m);
tlmrt_status tlmrt_model_input_info(tlmrt_model* m, int32_t index, tlmrt_tensor_info* out);
tlmrt_status tlmrt_model_output_info(tlmrt_model* m, int32_t index, tlmrt_tensor_info* out);

/* Runs the model once. inputs[i] points to input i's bytes (C order, exactly
 * input_info(i).nbytes of them, given in input_nbytes[i]); outputs[i] receives output i.
 * Allocates nothing itself (kernels may take workspace through the runtime's hook): copies inputs
 * into the arena, calls the kernels, copies outputs out. A CPU model computes an output straight
 * into the caller's buffer instead when the buffer is 64-byte aligned and the output is a kernel's
 * own result (not a view of another tensor): no copy, and the arena does not hold it after the run
 * (so tlmrt_model_output_buffer is for outputs given no buffer). Likewise it reads a 64-byte
 * aligned input where it is, with no copy, when the artifact's plan names its tensors' views
 * (<plan>_tensor_bases; an older artifact's inputs are copied): an input's buffer must not change
 * during the run nor overlap an output's buffer. Parallel kernels use the model's thread pool, the
 * calling thread being one of its threads. A CUDA model takes host buffers here too: it copies
 * them to its device arena on its stream, launches the kernels (or replays their CUDA
 * graph), copies the outputs back and synchronizes before returning.
 * Threads (since API version 4): a CPU model takes runs from many threads at once. Each run in
 * flight has an execution context of its own (an arena and argument tables, sharing the weights and
 * code; made at open for the first run and when runs first overlap, then reused), and the first run
 * to come takes the thread pool while the others run their kernels on their own calling threads. A
 * CUDA model takes one run at a time: a second concurrent run returns TLMRT_ERR_BUSY at once.
 * Fork: a CPU model opened (and run) before fork() runs in the child too: the pool's threads are
 * started again there, and the pool and contexts that threads of the parent held at the fork are
 * free in the child. A CUDA model refuses to run in a child with TLMRT_ERR_INCOMPATIBLE (a CUDA
 * context does not survive fork): open it again in the child. */
tlmrt_status tlmrt_model_run(tlmrt_model* m, const void* const* inputs, const uint64_t* input_nbytes,
                             void* const* outputs, const uint64_t* output_nbytes);

/* Runs the model once, like tlmrt_model_run, with buffers that may live on the model's CUDA device.
 * A CUDA model copies a device input device-to-device into its arena, and a device output from its
 * arena into the caller's buffer, on its stream: no round trip through the host. Device buffers
 * must be on the model's device; a CPU model takes host buffers only. An output whose data is NULL
 * (and nbytes 0) is not copied: it stays in the arena, where tlmrt_model_output_buffer finds it.
 * Device inputs must be ready on the model's stream (tlmrt_model_stream): order the producer's
 * stream before it (DLPack's __dlpack__(stream=...) does) or synchronize the producer first. The
 * call returns when every output has been written (it synchronizes the stream).
 * Threads and fork as for tlmrt_model_run. */
tlmrt_status tlmrt_model_run_io(tlmrt_model* m, const tlmrt_io* inputs, const tlmrt_io* outputs);

/* Where output `index` lives in the arena of the calling thread's last run of this model: a host
 * pointer for a CPU model, a device pointer on the model's device for a CUDA model. Valid until the
 * next run or close; for zero-copy export of outputs (DLPack). Meant for outputs that run was given
 * no buffer for: a CPU model may have written one it was given a buffer for there and not here. */
tlmrt_status tlmrt_model_output_buffer(tlmrt_model* m, int32_t index, tlmrt_io* out);

/* The CUstream a CUDA model runs on (NULL for a CPU model), so callers can order their own work
 * with it. Owned by the model. */
void* tlmrt_model_stream(const tlmrt_model* m);

/* Orders the model's next run after all work submitted so far to `stream` (a CUstream of the model's
 * device, NULL for the legacy default stream) without waiting on the host (since API version 7): one
 * event recorded there, waited for on the model's stream (on every plan's stream, for a dynamic-batch
 * model). The cheap way to hand over device inputs that a framework wrote on its own stream; call it
 * before the run, from the thread that runs. A CPU model has nothing to order: TLMRT_OK. */
tlmrt_status tlmrt_model_wait_stream(tlmrt_model* m, void* stream);

/* What the model runs on, for logs and benchmarks: "cpu (16 threads)", or
 * "cuda:0 NVIDIA H200 sm_90 (cubin cuda/sm_90.cubin, driver 13.0, CUDA graph)". */
const char* tlmrt_model_device_name(const tlmrt_model* m);

/* Allocates a CUDA buffer of one tensor (C order, dtype code/bits as in tlmrt_tensor_info) on device
 * `device_id`, and wraps it in a DLPack DLManagedTensor (dlpack.h's unversioned struct; returned as
 * void*, with the buffer in *out_data) whose deleter frees the buffer and the struct. The deleter
 * may run on any thread, after every model has closed. For handing outputs to DLPack consumers
 * (torch.from_dlpack) in buffers they own. On failure *out_managed is NULL, and
 * tlmrt_open_error() says why (TLMRT_ERR_INCOMPATIBLE when CUDA is unusable here). */
tlmrt_status tlmrt_dlpack_alloc_cuda(int32_t device_id, uint8_t dtype_code, uint8_t dtype_bits, int32_t ndim,
                                     const int64_t* shape, void** out_managed, void** out_data);

/* A human sentence about why the calling thread's last call on this model failed ("" if it did not).
 * Kept per thread, so runs on one model from many threads each read their own. Valid until that
 * thread's next call on a model. */
const char* tlmrt_model_last_error(const tlmrt_model* m);

/* ---- dynamic batch (since API version 5) -------------------------------------------------------
 *
 * An artifact built with `tlmpack build --batch 1,4,16` has a plan per batch size and runs any batch
 * from 1 to the largest: the exact plan, else several runs of smaller plans over slices of the
 * caller's buffers, or a run of a larger plan padded with zeros, whichever the artifact's cost table
 * (batch_plans) says is cheaper. Axis 0 of every input and output is the batch: input_info and
 * output_info report shape[0] = -1 and nbytes = the bytes of one sample. tlmrt_model_run and
 * tlmrt_model_run_io take the batch from input 0's size (every buffer must hold that many samples);
 * tlmrt_model_run_shaped takes it from the caller's shapes. A padded run takes host buffers only,
 * and padded runs of one model run one at a time; output_buffer is refused (outputs never stay in an
 * arena). Profiling sums the plans' runs; its steps are not listed (num_steps 0). Each plan is a
 * model of its own inside (a thread pool, and on CUDA a device arena, a device copy of the weights
 * and a CUDA graph each); the files on disk are shared. On the CPU the plans share their arenas: one
 * arena of the largest plan's size per run in flight (since API version 6). */

/* The number of batch plans (0 for a model of fixed shapes), and the batch of plan index (ascending;
 * 0 for an index out of range). */
int32_t tlmrt_model_num_batch_plans(const tlmrt_model* m);
int64_t tlmrt_model_batch_plan(const tlmrt_model* m, int32_t index);

/* The bytes of activation arena the model has allocated (since API version 6): host memory on the
 * CPU, one arena per run that has been in flight at once (one after open); the device arena on CUDA.
 * A dynamic-batch model on the CPU has one arena of its largest plan's size per run in flight, shared
 * by its plans (they run one after another within a run); on CUDA, each plan's own, summed. */
uint64_t tlmrt_model_arena_bytes(const tlmrt_model* m);

/* Replaces the cost of one run of each plan (num_plans of them, in plan order; any positive unit, e.g.
 * measured nanoseconds) that decides how other batches are covered; the artifact's batch_plans file has
 * estimates from each plan's counted work. Not while runs are in flight on the model. */
tlmrt_status tlmrt_model_set_batch_costs(tlmrt_model* m, int32_t num_plans, const int64_t* costs);

/* Runs once like tlmrt_model_run_io, with input i's shape given in input_shapes[i] (input_info(i).ndim
 * entries): for a dynamic-batch model, axis 0 of every input is the batch of this run (all equal, in
 * 1..the largest plan) and the other axes must equal the model's; buffers hold exactly that many
 * samples. For a model of fixed shapes every axis must equal the model's. Outputs may not be left in
 * the arena (data NULL) on a dynamic-batch model. */
tlmrt_status tlmrt_model_run_shaped(tlmrt_model* m, const int64_t* const* input_shapes, const tlmrt_io* inputs,
                                    const tlmrt_io* outputs);

/* ---- profiling (since API version 4) ------------------------------------------------------------
 *
 * Off by default, and then free: a run reads one flag. On, each run times every step (a kernel call
 * on the CPU, with CLOCK_MONOTONIC; a kernel launch on CUDA, with CUDA events, launching kernel by
 * kernel instead of replaying the CUDA graph) and itself (from entry to return of tlmrt_model_run or
 * tlmrt_model_run_io). run_ns - kernel_ns is the time the runtime spends outside kernels (copies,
 * checks, launch overhead), io_ns the copies' part of it. A step's time includes the thread pool's
 * wake-up and join for its parallel loops. Switch profiling between runs. */

typedef struct {
  int32_t enabled;
  int32_t num_steps;   /* steps a run makes; for tlmrt_model_get_profile_step */
  uint64_t runs;       /* successful runs timed since profiling was switched on */
  uint64_t run_ns;     /* their total wall time */
  uint64_t kernel_ns;  /* the part of it inside steps (the sum over steps) */
  uint64_t io_ns;      /* the part of it copying inputs into the arena and outputs out of it (CPU; 0 on
                          CUDA, whose copies are asynchronous) */
  uint64_t pool_launches;  /* CPU: parallel launches on the model's thread pool, inside the steps */
  uint64_t pool_wait_ns;   /* CPU: the calling thread's wait for the workers after its own tasks (wake-up,
                              join and load imbalance), inside kernel_ns */
  uint64_t pool_wakes;     /* CPU: launches that found workers asleep and had to wake them with a system
                              call (since API version 8; a runtime before it leaves the field alone) */
} tlmrt_profile;

typedef struct {
  const char* kernel;  /* the kernel it calls (owned by the model) */
  const char* task;    /* the task of the schedule it belongs to (CPU: the same as kernel) */
  uint64_t calls;
  uint64_t total_ns;
  uint64_t last_start_ns;  /* the last timed run: when this step started (ns after the run's start on
                              the CPU, after the first launch's start on CUDA) and how long it took; a
                              timeline of one run, for traces */
  uint64_t last_ns;
} tlmrt_profile_step;

/* enabled 1: zeroes the counters and starts timing (CUDA: creates the events it needs, which may fail
 * with the driver's error); 0: stops. */
tlmrt_status tlmrt_model_set_profiling(tlmrt_model* m, int32_t enabled);
tlmrt_status tlmrt_model_get_profile(tlmrt_model* m, tlmrt_profile* out);
/* One step's name and counters; step in 0..num_steps-1, in run order. */
tlmrt_status tlmrt_model_get_profile_step(tlmrt_model* m, int32_t step, tlmrt_profile_step* out);

void tlmrt_model_close(tlmrt_model* m);

const char* tlmrt_version(void);

/* ---- kernel libraries (since API version 3) ----------------------------------------------------
 *
 * Runs single TVM kernels through the same thread pool and context hooks as a CPU model, for
 * measuring kernels the way a deployed x86/model.so runs them (tlmpack's schedule data collector).
 * A kernel library is a shared library that TVM exported (tvm.compile(mod, target="llvm ...")
 * .export_library(path)), or any library that exports tvm-ffi packed functions the same way: the
 * PrimFunc whose global_symbol is `name` is the function
 *   int32_t __tvm_ffi_<name>(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result)
 * and every argument is a DLTensor* (type index 7), as a model's steps pass them.
 *
 *   tlmrt_kernel_library* lib = NULL;
 *   if (tlmrt_kernel_library_open("k.so", 0, &lib) != TLMRT_OK) puts(tlmrt_open_error());
 *   tlmrt_dltensor* args[3] = {&a, &b, &c};
 *   if (tlmrt_kernel_call(lib, "matmul", args, 3) != TLMRT_OK) puts(tlmrt_kernel_library_last_error(lib));
 *   tlmrt_kernel_library_close(lib);
 *
 * Kernel error messages: TVM's kernels report a failed argument check (wrong number of arguments,
 * dtype, shape, device) through TVMFFIErrorSetRaisedFromCStrParts, which a library from TVM's
 * export_library leaves undefined: it binds to libtvm_ffi.so when the process has loaded that with
 * RTLD_GLOBAL (importing tvm_ffi in Python does), and the library then cannot be opened without it.
 * The message is read back from tlmrt_plan_kernel_error when the library defines that (as a
 * model.so does: tlmrt_plan.h), else from libtvm_ffi.so (TVMFFIErrorMoveFromRaised).
 *
 * The context hooks are variables inside the library: loading one file also through TVM's runtime
 * in the same process shares them, and whichever loader wrote last serves both. Not thread-safe on
 * one library; open one per thread. */

typedef struct tlmrt_kernel_library tlmrt_kernel_library;

/* DLPack's DLTensor, declared ABI-compatibly (a DLTensor* from dlpack.h may be passed as one). */
typedef struct {
  void* data;
  struct {
    int32_t device_type;  /* TLMRT_DEVICE_CPU for kernel libraries */
    int32_t device_id;
  } device;
  int32_t ndim;
  struct {
    uint8_t code;         /* 0 int, 1 uint, 2 float, 4 bfloat, 6 bool */
    uint8_t bits;
    uint16_t lanes;
  } dtype;
  int64_t* shape;
  int64_t* strides;       /* NULL: compact C order */
  uint64_t byte_offset;
} tlmrt_dltensor;

/* dlopens `so_path` (RTLD_NOW | RTLD_LOCAL), refuses a library that needs a TVM context hook this
 * runtime does not provide (TLMRT_ERR_INCOMPATIBLE, as for a model), starts a thread pool of
 * num_threads threads, the caller of each kernel call included (0 = number of online cores, 1 = no
 * worker threads), and fills the library's hooks (parallel launch and barrier, workspace alloc and
 * free). On failure *out is NULL and tlmrt_open_error() says why: TLMRT_ERR_IO (no such file),
 * TLMRT_ERR_INCOMPATIBLE (it does not load here), TLMRT_ERR_INVALID_ARGUMENT (NULL, num_threads). */
tlmrt_status tlmrt_kernel_library_open(const char* so_path, int32_t num_threads, tlmrt_kernel_library** out);

/* Calls kernel `name` once on args[0..num_args) (CPU tensors; outputs are written in place),
 * its parallel loops running on the library's pool. The symbol is looked up once and cached.
 * TLMRT_ERR_INVALID_ARGUMENT: NULL library, name or tensor, an unknown kernel name, a tensor that
 * is not on the CPU, has NULL data or data not aligned to 64 bytes (TVM's kernels assume it); TLMRT_ERR_KERNEL: the kernel returned nonzero (its own checks
 * catch a wrong number of arguments, dtype or shape), with its message when it left one. */
tlmrt_status tlmrt_kernel_call(tlmrt_kernel_library* lib, const char* name, tlmrt_dltensor* const* args,
                               int32_t num_args);

/* Times kernel `name` on args: one untimed warm-up call, then `repeats` timed repeats. Each repeat
 * calls the kernel `number` times back to back, number being chosen once from the warm-up call's
 * duration so that a repeat lasts at least min_repeat_ms (at least 1 call). Writes repeats values,
 * seconds per call (the repeat's CLOCK_MONOTONIC time / number), to seconds_per_run[0..repeats).
 * Errors as tlmrt_kernel_call, and TLMRT_ERR_INVALID_ARGUMENT for repeats < 1, a NULL
 * seconds_per_run, or min_repeat_ms that is negative, not finite or above an hour. */
tlmrt_status tlmrt_kernel_time(tlmrt_kernel_library* lib, const char* name, tlmrt_dltensor* const* args,
                               int32_t num_args, int32_t repeats, double min_repeat_ms, double* seconds_per_run);

/* A human sentence about the last failure on this library ("" if none, or lib is NULL; a call
 * given a NULL library leaves its sentence in tlmrt_open_error()). */
const char* tlmrt_kernel_library_last_error(const tlmrt_kernel_library* lib);

/* Stops the pool's threads and dlcloses the library. NULL is a no-op. */
void tlmrt_kernel_library_close(tlmrt_kernel_library* lib);

#ifdef __cplusplus
}
#endif
#endif /* TLMRT_H_ */
