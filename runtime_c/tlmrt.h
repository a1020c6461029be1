/*
 * tlmrt.h — the whole public C API of the tlmpack runtime.
 *
 * Open an extracted artifact directory, query its inputs and outputs, run it with caller
 * buffers, read the last error, close. C11, no dependencies beyond libc, pthreads and libdl.
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

#define TLMRT_API_VERSION 1
#define TLMRT_MAX_NDIM 8

typedef enum {
  TLMRT_OK = 0,
  TLMRT_ERR_INVALID_ARGUMENT = 1, /* a caller mistake: bad index, NULL, wrong buffer size */
  TLMRT_ERR_IO = 2,               /* a file is missing or unreadable */
  TLMRT_ERR_ARTIFACT = 3,         /* the artifact is corrupted or inconsistent */
  TLMRT_ERR_INCOMPATIBLE = 4,     /* the artifact cannot run here (ABI, CPU features, device) */
  TLMRT_ERR_KERNEL = 5,           /* a kernel reported an error */
  TLMRT_ERR_OUT_OF_MEMORY = 6
} tlmrt_status;

typedef struct tlmrt_model tlmrt_model;

typedef struct {
  uint32_t struct_size;  /* sizeof(tlmrt_options); set by tlmrt_options_init */
  int32_t num_threads;   /* threads for parallel kernels, the caller of run included; 0 = number of
                            online cores; 1 = no worker threads */
  int32_t verify_files;  /* 1 (default): check SHA256SUMS of the artifact before loading code. With
                            0 or 1, weights.bin is always checked against the plan's size and sha256 */
} tlmrt_options;

typedef struct {
  const char* name;      /* owned by the model; valid until close */
  uint8_t dtype_code;    /* DLPack codes: 0 int, 1 uint, 2 float, 6 bool */
  uint8_t dtype_bits;
  int32_t ndim;
  int64_t shape[TLMRT_MAX_NDIM];
  uint64_t nbytes;
} tlmrt_tensor_info;

void tlmrt_options_init(tlmrt_options* opts);

/* Opens the artifact directory `dir` (holding manifest.json, SHA256SUMS, weights.bin and
 * x86/model.so). On failure *out is NULL and tlmrt_open_error() says why. */
tlmrt_status tlmrt_model_open(const char* dir, const tlmrt_options* opts, tlmrt_model** out);

/* The reason the calling thread's last tlmrt_model_open failed ("" if none). */
const char* tlmrt_open_error(void);

int32_t tlmrt_model_num_inputs(const tlmrt_model* m);
int32_t tlmrt_model_num_outputs(const tlmrt_model* m);
tlmrt_status tlmrt_model_input_info(tlmrt_model* m, int32_t index, tlmrt_tensor_info* out);
tlmrt_status tlmrt_model_output_info(tlmrt_model* m, int32_t index, tlmrt_tensor_info* out);

/* Runs the model once. inputs[i] points to input i's bytes (C order, exactly
 * input_info(i).nbytes of them, given in input_nbytes[i]); outputs[i] receives output i.
 * Allocates nothing itself (kernels may take workspace through the runtime's hook): copies inputs
 * into the arena, calls the kernels, copies outputs out. Parallel kernels use the model's thread
 * pool, the calling thread being one of its threads.
 * Not thread-safe on one model; open one model per thread. */
tlmrt_status tlmrt_model_run(tlmrt_model* m, const void* const* inputs, const uint64_t* input_nbytes,
                             void* const* outputs, const uint64_t* output_nbytes);

/* A human sentence about the last failure on this model ("" if none). */
const char* tlmrt_model_last_error(const tlmrt_model* m);

void tlmrt_model_close(tlmrt_model* m);

const char* tlmrt_version(void);

#ifdef __cplusplus
}
#endif
#endif /* TLMRT_H_ */
