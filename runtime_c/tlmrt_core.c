/*
 * tlmrt_core.c — open, validate, run and close a model (the device-independent part).
 *
 * Open, in this order, so that no code from the artifact runs before it is checked:
 *   1. read weights.bin into a 64-byte-aligned buffer, hashing it on the way;
 *   2. if opts.verify_files, check SHA256SUMS (weights.bin's digest comes from step 1, so the bytes
 *      checked are the bytes used);
 *   3. dlopen x86/model.so (RTLD_NOW | RTLD_LOCAL), get the plan, validate all of it, and compare
 *      weights.bin's size and sha256 with the plan's (always, whatever verify_files says);
 *   4. preallocate the arena, one DLTensor per plan tensor and one TVMFFIAny array per step;
 *   5. let the backend fill the kernel hooks and start its threads.
 * Run copies inputs in, calls the steps, copies outputs out, and allocates nothing.
 */
#define _POSIX_C_SOURCE 200809L

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tlmrt_internal.h"

#define WEIGHTS_FILE "weights.bin"
#define MODEL_FILE "x86/model.so"
#define MAX_PLAN_ENTRIES (1 << 24) /* tensors, steps, arguments of one step: sanity bound */

struct tlmrt_model {
  void* dl_handle;
  const tlmrt_plan* plan;               /* lives in dl_handle's data; validated at open */
  tlmrt_plan_kernel_error_fn kernel_error;
  const tlmrt_backend* backend;
  void* backend_state;
  uint8_t* arena;
  uint8_t* weights;
  tlmrt_dltensor* tensors;              /* plan->num_tensors */
  int64_t* shapes;                      /* TLMRT_PLAN_MAX_NDIM per tensor */
  tlmrt_ffi_any* args;                  /* every step's arguments, one after another */
  size_t* step_first_arg;               /* plan->num_steps */
  char last_error[TLMRT_ERROR_CAP];
};

static _Thread_local char tls_open_error[TLMRT_ERROR_CAP];

tlmrt_status tlmrt_errorf(char* buf, size_t cap, tlmrt_status status, const char* fmt, ...) {
  if (buf != NULL && cap > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
  }
  return status;
}

static char* join_path(const char* dir, const char* rel) {
  size_t n = strlen(dir) + strlen(rel) + 2u;
  char* p = (char*)malloc(n);
  if (p != NULL) snprintf(p, n, "%s/%s", dir, rel);
  return p;
}

static uint64_t round_up_64(uint64_t n) { return (n + (TLMRT_ALIGNMENT - 1u)) & ~(uint64_t)(TLMRT_ALIGNMENT - 1u); }

/* aligned_alloc of at least 64 bytes, n rounded up to 64; NULL if n does not fit. */
static void* alloc_aligned(uint64_t n) {
  if (n > (uint64_t)SIZE_MAX - TLMRT_ALIGNMENT) return NULL;
  uint64_t size = n == 0 ? TLMRT_ALIGNMENT : round_up_64(n);
  return aligned_alloc(TLMRT_ALIGNMENT, (size_t)size);
}

/* ---- weights ---------------------------------------------------------------------------------- */

static tlmrt_status load_weights(const char* path, uint8_t** out, uint64_t* out_size, char hex[65],
                                 char* err, size_t err_cap) {
  *out = NULL;
  *out_size = 0;
  int fd = open(path, O_RDONLY | O_NONBLOCK);
  if (fd < 0) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_IO, "%s: cannot open (%s); expected the artifact's "
                        WEIGHTS_FILE, path, strerror(errno));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 0) {
    close(fd);
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_IO, "%s: expected a regular file", path);
  }
  uint64_t size = (uint64_t)st.st_size;
  uint8_t* buf = (uint8_t*)alloc_aligned(size);
  if (buf == NULL) {
    close(fd);
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY,
                        "cannot allocate %" PRIu64 " bytes for " WEIGHTS_FILE, size);
  }
  memset(buf + size, 0, (size_t)(size == 0 ? TLMRT_ALIGNMENT : round_up_64(size) - size));
  tlmrt_sha256_ctx ctx;
  tlmrt_sha256_init(&ctx);
  uint64_t have = 0;
  while (have < size) {
    uint64_t want = size - have;
    if (want > (1u << 22)) want = 1u << 22;
    ssize_t got = read(fd, buf + have, (size_t)want);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      int e = errno;
      free(buf);
      close(fd);
      return tlmrt_errorf(err, err_cap, TLMRT_ERR_IO, "cannot read %s: %s", path,
                          got < 0 ? strerror(e) : "the file shrank while reading");
    }
    tlmrt_sha256_update(&ctx, buf + have, (size_t)got);
    have += (uint64_t)got;
  }
  close(fd);
  uint8_t digest[32];
  tlmrt_sha256_final(&ctx, digest);
  tlmrt_sha256_hex(digest, hex);
  *out = buf;
  *out_size = size;
  return TLMRT_OK;
}

/* ---- plan validation -------------------------------------------------------------------------- */

static tlmrt_status validate_tensor(const tlmrt_plan* plan, int32_t i, uint64_t weights_size,
                                    char* err, size_t err_cap) {
  const tlmrt_plan_tensor* t = &plan->tensors[i];
  uint64_t limit;
  const char* where;
  if (t->storage == TLMRT_STORAGE_ARENA) {
    limit = plan->arena_bytes;
    where = "the arena";
  } else if (t->storage == TLMRT_STORAGE_WEIGHTS) {
    limit = weights_size;
    where = WEIGHTS_FILE;
  } else {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                        "plan tensor %d: storage expected %d (arena) or %d (weights), found %d", i,
                        TLMRT_STORAGE_ARENA, TLMRT_STORAGE_WEIGHTS, t->storage);
  }
  if (t->ndim < 0 || t->ndim > TLMRT_PLAN_MAX_NDIM) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT, "plan tensor %d: ndim expected 0..%d, found %d",
                        i, TLMRT_PLAN_MAX_NDIM, t->ndim);
  }
  if (t->ndim > 0 && t->shape == NULL) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                        "plan tensor %d: expected %d shape entries, found a NULL shape", i, t->ndim);
  }
  if (t->dtype_lanes != 1 || t->dtype_bits == 0) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                        "plan tensor %d: expected dtype lanes 1 and bits > 0, found lanes %u bits %u", i,
                        (unsigned)t->dtype_lanes, (unsigned)t->dtype_bits);
  }
  uint64_t count = 1;
  for (int32_t d = 0; d < t->ndim; ++d) {
    if (t->shape[d] < 0) {
      return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                          "plan tensor %d: dimension %d expected >= 0, found %" PRId64, i, d, t->shape[d]);
    }
    if (__builtin_mul_overflow(count, (uint64_t)t->shape[d], &count)) {
      return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                          "plan tensor %d: the element count overflows 64 bits", i);
    }
  }
  uint64_t bits;
  if (__builtin_mul_overflow(count, (uint64_t)t->dtype_bits, &bits) || bits % 8u != 0 ||
      bits / 8u != t->nbytes) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                        "plan tensor %d: nbytes expected %" PRIu64 " elements * %u bits / 8, found %" PRIu64,
                        i, count, (unsigned)t->dtype_bits, t->nbytes);
  }
  if (t->offset % TLMRT_ALIGNMENT != 0) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                        "plan tensor %d: offset expected a multiple of %u, found %" PRIu64, i,
                        TLMRT_ALIGNMENT, t->offset);
  }
  if (t->offset > limit || t->nbytes > limit - t->offset) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                        "plan tensor %d: bytes [%" PRIu64 ", %" PRIu64 " + %" PRIu64
                        ") expected within %s (%" PRIu64 " bytes), found beyond its end",
                        i, t->offset, t->offset, t->nbytes, where, limit);
  }
  return TLMRT_OK;
}

static tlmrt_status validate_io(const tlmrt_plan* plan, const char* kind, int32_t count,
                                const tlmrt_plan_io* ios, char* err, size_t err_cap) {
  if (count < 0 || count > MAX_PLAN_ENTRIES || (count > 0 && ios == NULL)) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                        "plan: expected 0..%d %ss with a non-NULL table, found %d (table %s)",
                        MAX_PLAN_ENTRIES, kind, count, ios == NULL ? "NULL" : "set");
  }
  for (int32_t i = 0; i < count; ++i) {
    if (ios[i].name == NULL) {
      return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT, "plan %s %d: expected a name, found NULL",
                          kind, i);
    }
    int32_t t = ios[i].tensor;
    if (t < 0 || t >= plan->num_tensors) {
      return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                          "plan %s %d (%.200s): tensor index expected 0..%d, found %d", kind, i,
                          ios[i].name, plan->num_tensors - 1, t);
    }
    if (plan->tensors[t].storage != TLMRT_STORAGE_ARENA) {
      return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                          "plan %s %d (%.200s): tensor %d expected in the arena, found storage %d",
                          kind, i, ios[i].name, t, plan->tensors[t].storage);
    }
  }
  return TLMRT_OK;
}

static int is_sha256_hex(const char* s) {
  if (s == NULL) return 0;
  for (int i = 0; i < 64; ++i) {
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
  }
  return s[64] == '\0';
}

static tlmrt_status validate_plan(const tlmrt_plan* plan, uint64_t weights_size, const char* weights_hex,
                                  uint64_t* out_total_args, char* err, size_t err_cap) {
  if (plan->abi_version != TLMRT_PLAN_ABI_VERSION) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_INCOMPATIBLE,
                        MODEL_FILE ": plan ABI version %u, but this runtime (tlmrt %s) reads version %d; "
                        "rebuild the artifact or use a matching runtime",
                        plan->abi_version, tlmrt_version(), TLMRT_PLAN_ABI_VERSION);
  }
  if (plan->model_name == NULL) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT, "plan: expected a model name, found NULL");
  }
  if (!is_sha256_hex(plan->weights_sha256)) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                        "plan: weights_sha256 expected 64 lowercase hex digits, found %s",
                        plan->weights_sha256 == NULL ? "NULL" : "something else");
  }
  if (plan->weights_bytes != weights_size) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                        WEIGHTS_FILE ": expected %" PRIu64 " bytes (the plan's weights_bytes), found %" PRIu64
                        "; the artifact is corrupted or mixed up",
                        plan->weights_bytes, weights_size);
  }
  if (memcmp(plan->weights_sha256, weights_hex, 64) != 0) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                        WEIGHTS_FILE ": sha256 mismatch (expected %.64s from the plan, found %.64s); "
                        "the artifact is corrupted",
                        plan->weights_sha256, weights_hex);
  }
  if (plan->num_tensors < 0 || plan->num_tensors > MAX_PLAN_ENTRIES ||
      (plan->num_tensors > 0 && plan->tensors == NULL)) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                        "plan: expected 0..%d tensors with a non-NULL table, found %d", MAX_PLAN_ENTRIES,
                        plan->num_tensors);
  }
  for (int32_t i = 0; i < plan->num_tensors; ++i) {
    tlmrt_status s = validate_tensor(plan, i, weights_size, err, err_cap);
    if (s != TLMRT_OK) return s;
  }
  tlmrt_status s = validate_io(plan, "input", plan->num_inputs, plan->inputs, err, err_cap);
  if (s != TLMRT_OK) return s;
  s = validate_io(plan, "output", plan->num_outputs, plan->outputs, err, err_cap);
  if (s != TLMRT_OK) return s;
  if (plan->num_steps < 0 || plan->num_steps > MAX_PLAN_ENTRIES ||
      (plan->num_steps > 0 && plan->steps == NULL)) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                        "plan: expected 0..%d steps with a non-NULL table, found %d", MAX_PLAN_ENTRIES,
                        plan->num_steps);
  }
  uint64_t total_args = 0;
  for (int32_t i = 0; i < plan->num_steps; ++i) {
    const tlmrt_plan_step* st = &plan->steps[i];
    if (st->kernel == NULL || st->fn == NULL) {
      return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                          "plan step %d: expected a kernel name and function, found %s", i,
                          st->kernel == NULL ? "a NULL name" : "a NULL function");
    }
    if (st->num_args < 0 || st->num_args > MAX_PLAN_ENTRIES || (st->num_args > 0 && st->args == NULL)) {
      return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                          "plan step %d (%.200s): expected 0..%d arguments with a non-NULL table, "
                          "found %d",
                          i, st->kernel, MAX_PLAN_ENTRIES, st->num_args);
    }
    for (int32_t a = 0; a < st->num_args; ++a) {
      if (st->args[a] < 0 || st->args[a] >= plan->num_tensors) {
        return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                            "plan step %d (%.200s) argument %d: tensor index expected 0..%d, found %d",
                            i, st->kernel, a, plan->num_tensors - 1, st->args[a]);
      }
    }
    total_args += (uint64_t)st->num_args;
  }
  *out_total_args = total_args;
  return TLMRT_OK;
}

/* ---- open / close ----------------------------------------------------------------------------- */

TLMRT_EXPORT const char* tlmrt_version(void) { return "0.1.0"; }

TLMRT_EXPORT void tlmrt_options_init(tlmrt_options* opts) {
  if (opts == NULL) return;
  memset(opts, 0, sizeof(*opts));
  opts->struct_size = (uint32_t)sizeof(tlmrt_options);
  opts->num_threads = 0;
  opts->verify_files = 1;
}

TLMRT_EXPORT const char* tlmrt_open_error(void) { return tls_open_error; }

TLMRT_EXPORT void tlmrt_model_close(tlmrt_model* m) {
  if (m == NULL) return;
  /* Threads first: nothing may call into the library once it is unloaded. */
  if (m->backend != NULL && m->backend_state != NULL) m->backend->destroy(m->backend_state);
  if (m->dl_handle != NULL) dlclose(m->dl_handle);
  free(m->step_first_arg);
  free(m->args);
  free(m->shapes);
  free(m->tensors);
  free(m->weights);
  free(m->arena);
  free(m);
}

static tlmrt_status build_tensors(tlmrt_model* m, uint64_t total_args, char* err, size_t err_cap) {
  const tlmrt_plan* plan = m->plan;
  size_t nt = (size_t)plan->num_tensors;
  m->arena = (uint8_t*)alloc_aligned(plan->arena_bytes);
  m->tensors = (tlmrt_dltensor*)calloc(nt > 0 ? nt : 1u, sizeof(tlmrt_dltensor));
  m->shapes = (int64_t*)calloc((nt > 0 ? nt : 1u) * TLMRT_PLAN_MAX_NDIM, sizeof(int64_t));
  m->args = (tlmrt_ffi_any*)calloc(total_args > 0 ? (size_t)total_args : 1u, sizeof(tlmrt_ffi_any));
  m->step_first_arg = (size_t*)calloc(plan->num_steps > 0 ? (size_t)plan->num_steps : 1u, sizeof(size_t));
  if (m->arena == NULL || m->tensors == NULL || m->shapes == NULL || m->args == NULL ||
      m->step_first_arg == NULL) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY,
                        "cannot allocate the arena (%" PRIu64 " bytes) and tables for %d tensors",
                        plan->arena_bytes, plan->num_tensors);
  }
  memset(m->arena, 0, (size_t)(plan->arena_bytes == 0 ? TLMRT_ALIGNMENT : round_up_64(plan->arena_bytes)));
  for (size_t i = 0; i < nt; ++i) {
    const tlmrt_plan_tensor* pt = &plan->tensors[i];
    tlmrt_dltensor* t = &m->tensors[i];
    uint8_t* base = pt->storage == TLMRT_STORAGE_ARENA ? m->arena : m->weights;
    int64_t* shape = &m->shapes[i * TLMRT_PLAN_MAX_NDIM];
    for (int32_t d = 0; d < pt->ndim; ++d) shape[d] = pt->shape[d];
    t->data = base + pt->offset;
    t->device.device_type = TLMRT_DL_CPU;
    t->device.device_id = 0;
    t->ndim = pt->ndim;
    t->dtype.code = pt->dtype_code;
    t->dtype.bits = pt->dtype_bits;
    t->dtype.lanes = pt->dtype_lanes;
    t->shape = shape;
    t->strides = NULL;
    t->byte_offset = 0;
  }
  size_t next = 0;
  for (int32_t s = 0; s < plan->num_steps; ++s) {
    const tlmrt_plan_step* st = &plan->steps[s];
    m->step_first_arg[s] = next;
    for (int32_t a = 0; a < st->num_args; ++a) {
      tlmrt_ffi_any* any = &m->args[next++];
      any->type_index = TLMRT_FFI_TYPE_DLTENSOR_PTR;
      any->zero_padding = 0;
      any->v.v_ptr = &m->tensors[st->args[a]];
    }
  }
  return TLMRT_OK;
}

static tlmrt_status open_model(const char* dir, const tlmrt_options* opts, tlmrt_model* m, char* err,
                               size_t err_cap) {
  char weights_hex[65];
  uint64_t weights_size = 0;
  char* weights_path = join_path(dir, WEIGHTS_FILE);
  char* model_path = join_path(dir, MODEL_FILE);
  tlmrt_status s = TLMRT_OK;
  if (weights_path == NULL || model_path == NULL) {
    s = tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
    goto done;
  }
  s = load_weights(weights_path, &m->weights, &weights_size, weights_hex, err, err_cap);
  if (s != TLMRT_OK) goto done;

  if (opts->verify_files) {
    const char* must[] = {MODEL_FILE, WEIGHTS_FILE};
    const char* known_names[] = {WEIGHTS_FILE};
    const char* known_hex[] = {weights_hex};
    s = tlmrt_verify_sha256sums(dir, must, 2, known_names, known_hex, 1, err, err_cap);
    if (s != TLMRT_OK) goto done;
  }

  struct stat st;
  if (stat(model_path, &st) != 0) {
    s = tlmrt_errorf(err, err_cap, TLMRT_ERR_IO, "%s: cannot open (%s); expected the model library",
                     model_path, strerror(errno));
    goto done;
  }
  dlerror();
  m->dl_handle = dlopen(model_path, RTLD_NOW | RTLD_LOCAL);
  if (m->dl_handle == NULL) {
    const char* why = dlerror();
    s = tlmrt_errorf(err, err_cap, TLMRT_ERR_INCOMPATIBLE,
                     "%s: cannot load (%s); expected a shared library for this machine", model_path,
                     why != NULL ? why : "unknown dlopen error");
    goto done;
  }
  dlerror();
  void* sym = dlsym(m->dl_handle, TLMRT_PLAN_SYMBOL);
  if (sym == NULL) {
    s = tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                     MODEL_FILE ": expected the symbol " TLMRT_PLAN_SYMBOL ", found none; not a tlmpack "
                     "model library");
    goto done;
  }
  tlmrt_plan_get_fn get_plan;
  memcpy(&get_plan, &sym, sizeof(get_plan));
  m->plan = get_plan();
  if (m->plan == NULL) {
    s = tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                     MODEL_FILE ": " TLMRT_PLAN_SYMBOL "() expected to return a plan, returned NULL");
    goto done;
  }
  dlerror();
  sym = dlsym(m->dl_handle, TLMRT_PLAN_KERNEL_ERROR_SYMBOL);
  if (sym != NULL) memcpy(&m->kernel_error, &sym, sizeof(m->kernel_error));

  uint64_t total_args = 0;
  s = validate_plan(m->plan, weights_size, weights_hex, &total_args, err, err_cap);
  if (s != TLMRT_OK) goto done;
  s = build_tensors(m, total_args, err, err_cap);
  if (s != TLMRT_OK) goto done;

  m->backend = &tlmrt_backend_cpu;
  s = m->backend->create(opts, m->dl_handle, &m->backend_state, err, err_cap);

done:
  free(weights_path);
  free(model_path);
  return s;
}

TLMRT_EXPORT tlmrt_status tlmrt_model_open(const char* dir, const tlmrt_options* opts, tlmrt_model** out) {
  char* err = tls_open_error;
  size_t cap = sizeof(tls_open_error);
  err[0] = '\0';
  if (out == NULL) return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT, "out: expected a pointer, found NULL");
  *out = NULL;
  if (dir == NULL || dir[0] == '\0') {
    return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT,
                        "dir: expected an artifact directory, found %s", dir == NULL ? "NULL" : "\"\"");
  }
  tlmrt_options defaults;
  tlmrt_options_init(&defaults);
  if (opts == NULL) opts = &defaults;
  if (opts->struct_size < sizeof(tlmrt_options)) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT,
                        "opts->struct_size: expected at least %zu (call tlmrt_options_init), found %u",
                        sizeof(tlmrt_options), opts->struct_size);
  }
  if (opts->num_threads < 0) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT,
                        "opts->num_threads: expected 0 (all cores) or more, found %d", opts->num_threads);
  }
  if (opts->verify_files != 0 && opts->verify_files != 1) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT, "opts->verify_files: expected 0 or 1, found %d",
                        opts->verify_files);
  }
  tlmrt_model* m = (tlmrt_model*)calloc(1, sizeof(tlmrt_model));
  if (m == NULL) return tlmrt_errorf(err, cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  tlmrt_status s = open_model(dir, opts, m, err, cap);
  if (s != TLMRT_OK) {
    tlmrt_model_close(m);
    return s;
  }
  *out = m;
  return TLMRT_OK;
}

/* ---- queries ---------------------------------------------------------------------------------- */

TLMRT_EXPORT int32_t tlmrt_model_num_inputs(const tlmrt_model* m) { return m ? m->plan->num_inputs : 0; }
TLMRT_EXPORT int32_t tlmrt_model_num_outputs(const tlmrt_model* m) { return m ? m->plan->num_outputs : 0; }

TLMRT_EXPORT const char* tlmrt_model_last_error(const tlmrt_model* m) { return m ? m->last_error : ""; }

static tlmrt_status io_info(tlmrt_model* m, const char* kind, int32_t count, const tlmrt_plan_io* ios,
                            int32_t index, tlmrt_tensor_info* out) {
  if (m == NULL) return TLMRT_ERR_INVALID_ARGUMENT;
  if (out == NULL) {
    return tlmrt_errorf(m->last_error, sizeof(m->last_error), TLMRT_ERR_INVALID_ARGUMENT,
                        "%s info: expected an output pointer, found NULL", kind);
  }
  if (index < 0 || index >= count) {
    return tlmrt_errorf(m->last_error, sizeof(m->last_error), TLMRT_ERR_INVALID_ARGUMENT,
                        "%s index: expected 0..%d, found %d", kind, count - 1, index);
  }
  const tlmrt_plan_tensor* t = &m->plan->tensors[ios[index].tensor];
  memset(out, 0, sizeof(*out));
  out->name = ios[index].name;
  out->dtype_code = t->dtype_code;
  out->dtype_bits = t->dtype_bits;
  out->ndim = t->ndim;
  for (int32_t d = 0; d < t->ndim; ++d) out->shape[d] = t->shape[d];
  out->nbytes = t->nbytes;
  return TLMRT_OK;
}

TLMRT_EXPORT tlmrt_status tlmrt_model_input_info(tlmrt_model* m, int32_t index, tlmrt_tensor_info* out) {
  return m ? io_info(m, "input", m->plan->num_inputs, m->plan->inputs, index, out)
           : TLMRT_ERR_INVALID_ARGUMENT;
}

TLMRT_EXPORT tlmrt_status tlmrt_model_output_info(tlmrt_model* m, int32_t index, tlmrt_tensor_info* out) {
  return m ? io_info(m, "output", m->plan->num_outputs, m->plan->outputs, index, out)
           : TLMRT_ERR_INVALID_ARGUMENT;
}

/* ---- run -------------------------------------------------------------------------------------- */

static tlmrt_status check_buffers(tlmrt_model* m, const char* kind, int32_t count, const tlmrt_plan_io* ios,
                                  const void* const* ptrs, const uint64_t* nbytes) {
  char* err = m->last_error;
  size_t cap = sizeof(m->last_error);
  if (count > 0 && (ptrs == NULL || nbytes == NULL)) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT,
                        "%ss: expected %d buffers and their sizes, found a NULL %s", kind, count,
                        ptrs == NULL ? "buffer array" : "size array");
  }
  for (int32_t i = 0; i < count; ++i) {
    uint64_t want = m->plan->tensors[ios[i].tensor].nbytes;
    if (nbytes[i] != want) {
      return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT,
                          "%s %d (%.200s): expected %" PRIu64 " bytes, given %" PRIu64, kind, i, ios[i].name,
                          want, nbytes[i]);
    }
    if (ptrs[i] == NULL && want > 0) {
      return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT,
                          "%s %d (%.200s): expected a buffer of %" PRIu64 " bytes, found NULL", kind, i,
                          ios[i].name, want);
    }
  }
  return TLMRT_OK;
}

TLMRT_EXPORT tlmrt_status tlmrt_model_run(tlmrt_model* m, const void* const* inputs,
                                          const uint64_t* input_nbytes, void* const* outputs,
                                          const uint64_t* output_nbytes) {
  if (m == NULL) return TLMRT_ERR_INVALID_ARGUMENT;
  const tlmrt_plan* plan = m->plan;
  m->last_error[0] = '\0';
  tlmrt_status s = check_buffers(m, "input", plan->num_inputs, plan->inputs, inputs, input_nbytes);
  if (s != TLMRT_OK) return s;
  s = check_buffers(m, "output", plan->num_outputs, plan->outputs, (const void* const*)outputs,
                    output_nbytes);
  if (s != TLMRT_OK) return s;

  for (int32_t i = 0; i < plan->num_inputs; ++i) {
    const tlmrt_plan_tensor* t = &plan->tensors[plan->inputs[i].tensor];
    if (t->nbytes > 0) memcpy(m->arena + t->offset, inputs[i], (size_t)t->nbytes);
  }

  void* saved = m->backend->run_begin(m->backend_state);
  for (int32_t i = 0; i < plan->num_steps; ++i) {
    const tlmrt_plan_step* st = &plan->steps[i];
    tlmrt_ffi_any result;
    memset(&result, 0, sizeof(result));
    int32_t rc = st->fn(NULL, &m->args[m->step_first_arg[i]], st->num_args, &result);
    if (rc != 0) {
      const char* why = m->kernel_error != NULL ? m->kernel_error() : NULL;
      s = tlmrt_errorf(m->last_error, sizeof(m->last_error), TLMRT_ERR_KERNEL,
                       "kernel %.200s (step %d) failed: %s", st->kernel, i,
                       (why != NULL && why[0] != '\0') ? why : "(the kernel left no message)");
      break;
    }
  }
  m->backend->run_end(m->backend_state, saved);
  if (s != TLMRT_OK) return s;

  for (int32_t i = 0; i < plan->num_outputs; ++i) {
    const tlmrt_plan_tensor* t = &plan->tensors[plan->outputs[i].tensor];
    if (t->nbytes > 0) memcpy(outputs[i], m->arena + t->offset, (size_t)t->nbytes);
  }
  return TLMRT_OK;
}
