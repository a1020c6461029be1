/*
 * tlmrt_core.c — open, query, run and close a model: the device-independent part.
 *
 * The core validates options and every caller buffer, answers the input/output queries from the
 * plan's tables, and hands the rest to the backend of the requested device (tlmrt_backend in
 * tlmrt_internal.h): tlmrt_cpu.c for x86/model.so, tlmrt_cuda.c for cuda/plan.so. It also holds
 * what both backends share: mapping weights.bin (hashed from the mapping), validating the tensor
 * and I/O tables of a plan, and opening a plan library.
 *
 * Open never runs code from the artifact before it is checked: each backend maps and hashes
 * weights.bin, verifies SHA256SUMS (when opts.verify_files), and only then dlopens its plan library.
 * Run checks the buffers, then copies inputs in, runs the kernels, copies outputs out, and
 * allocates nothing.
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tlmrt_internal.h"

/* tlmrt_options as API version 1 callers know it: struct_size, num_threads, verify_files. */
#define OPTIONS_V1_SIZE 12u

/* What one run in flight owns (the backend's context and the core's tlmrt_io copies of
 * tlmrt_model_run's buffers); busy while a run holds it. Made at open for the first run, and when runs
 * overlap, then kept until close, so warm runs allocate nothing. */
typedef struct {
  _Atomic uint32_t busy;  /* 0, or the fork count + 1 of the thread running in it */
  int own_arena;          /* 0: it runs in a caller's arena (tlmrt_plan_prepare_slot) */
  void* backend_ctx;
  tlmrt_io* host_inputs;
  tlmrt_io* host_outputs;
} exec_ctx;

#define MAX_CONTEXTS 64

struct tlmrt_model {
  const tlmrt_backend* backend;
  void* state;
  tlmrt_plan_tables tables;  /* the plan's tensors, inputs and outputs; valid until close */
  int32_t device_id;
  int32_t max_contexts;      /* the backend's, at most MAX_CONTEXTS */
  int32_t num_steps;
  uint64_t id;               /* unique in the process: names the model in the thread records below */
  _Atomic(exec_ctx*) ctxs[MAX_CONTEXTS];
  _Atomic int profiling;
  _Atomic uint64_t prof_runs;
  _Atomic uint64_t prof_run_ns;
  tlmrt_step_counter* prof_steps;  /* num_steps, then the I/O copies, the pool's waits, its wake-ups */
  tlmrt_batch* batch;        /* a dynamic-batch model: its plans, each a model (state is then NULL); else NULL */
};

static _Atomic uint64_t g_next_model_id = 1;

/* Per thread: the last failure of a call on a model, and the context of its last run there. Errors
 * live here, not in the model, so that runs on one model from many threads never write one buffer. */
typedef struct {
  uint64_t error_model;
  uint64_t run_model;
  int32_t run_ctx;
  char error[TLMRT_ERROR_CAP];
} thread_record;
static _Thread_local thread_record tls_record;

/* The calling thread's error buffer, now holding m's last error ("" from here on). */
static char* claim_error(const tlmrt_model* m) {
  tls_record.error_model = m->id;
  tls_record.error[0] = '\0';
  return tls_record.error;
}
#define ERR_CAP sizeof(tls_record.error)

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

char* tlmrt_join_path(const char* dir, const char* rel) {
  size_t n = strlen(dir) + strlen(rel) + 2u;
  char* p = (char*)malloc(n);
  if (p != NULL) snprintf(p, n, "%s/%s", dir, rel);
  return p;
}

static uint64_t round_up_64(uint64_t n) { return (n + (TLMRT_ALIGNMENT - 1u)) & ~(uint64_t)(TLMRT_ALIGNMENT - 1u); }

void* tlmrt_alloc_aligned(uint64_t n) {
  if (n > (uint64_t)SIZE_MAX - TLMRT_ALIGNMENT) return NULL;
  uint64_t size = n == 0 ? TLMRT_ALIGNMENT : round_up_64(n);
  return aligned_alloc(TLMRT_ALIGNMENT, (size_t)size);
}

#define HUGE_PAGE_BYTES ((uint64_t)2 << 20)

int tlmrt_huge_pages_wanted(void) {
  const char* env = getenv("TLMRT_CPU_HUGE_PAGES");
  return env == NULL || strcmp(env, "0") != 0;
}

void* tlmrt_alloc_large(uint64_t n) {
  if (n < HUGE_PAGE_BYTES || !tlmrt_huge_pages_wanted()) return tlmrt_alloc_aligned(n);
  uint64_t size = (n + HUGE_PAGE_BYTES - 1u) & ~(HUGE_PAGE_BYTES - 1u);
  if (size < n || size > (uint64_t)SIZE_MAX) return NULL;
  void* p = NULL;
  if (posix_memalign(&p, (size_t)HUGE_PAGE_BYTES, (size_t)size) != 0) return NULL;
  (void)madvise(p, (size_t)size, MADV_HUGEPAGE); /* advice: without THP it changes nothing */
  return p;
}

/* An anonymous, zero-filled mapping of at least `len` bytes that starts on a 2 MiB boundary and
 * is advised to be backed by huge pages; its length (a multiple of 2 MiB) in *out_len. */
static uint8_t* map_huge_aligned(size_t len, size_t* out_len) {
  size_t huge = (size_t)HUGE_PAGE_BYTES;
  if (len > SIZE_MAX - 2u * huge) return NULL;
  size_t want = (len + huge - 1u) / huge * huge;
  uint8_t* raw = (uint8_t*)mmap(NULL, want + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return NULL;
  uint8_t* start = (uint8_t*)(((uintptr_t)raw + huge - 1u) & ~(uintptr_t)(huge - 1u));
  if (start > raw) (void)munmap(raw, (size_t)(start - raw));
  uint8_t* end = raw + want + huge;
  if (end > start + want) (void)munmap(start + want, (size_t)(end - (start + want)));
  (void)madvise(start, want, MADV_HUGEPAGE);
  *out_len = want;
  return start;
}

int tlmrt_is_sha256_hex(const char* s) {
  if (s == NULL) return 0;
  for (int i = 0; i < 64; ++i) {
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
  }
  return s[64] == '\0';
}

/* ---- weights ---------------------------------------------------------------------------------- */

/* The file is mapped read-only and private into a reservation one page longer than the file's
 * pages: the tail of the file's last page and the whole page after it read as zeros (the kernel
 * zero-fills past the end of the file; the extra page is anonymous), so the weights stay followed
 * by at least 64 zero bytes as when they were copied into a zero-padded buffer. The mapping is
 * page-aligned (>= 64 bytes). Two models of one artifact share the page cache.
 * What a mapping gives up against a copy: the pages stay the file's, so whoever can write the file
 * itself (not just the folder) after the hash can change the weights the kernels read, or truncate
 * it (a SIGBUS). The Python runtime links weights.bin from its own cache, writable only by the
 * user who loads it; a C caller that must defend against other writers opens a private copy.
 * With private_copy (a CPU model of one plan) the file's bytes are copied once into anonymous memory
 * on huge pages and the mapping dropped: 2-3 % faster whole models (BENCHMARKS.md, 2026-12-06), at
 * the price of one copy of the weights per loaded model instead of one page cache for all. */
tlmrt_status tlmrt_load_weights(const char* dir, const char* file, int private_copy, tlmrt_weights* out, char* err,
                                size_t err_cap) {
  memset(out, 0, sizeof(*out));
  out->file = file;
  char* path = tlmrt_join_path(dir, file);
  if (path == NULL) return tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  int fd = open(path, O_RDONLY | O_NONBLOCK);
  if (fd < 0) {
    tlmrt_status s = tlmrt_errorf(err, err_cap, TLMRT_ERR_IO, "%s: cannot open (%s); expected the artifact's %s",
                                  path, strerror(errno), file);
    free(path);
    return s;
  }
  tlmrt_status status = TLMRT_OK;
  void* base = MAP_FAILED;
  size_t map_len = 0;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 0) {
    status = tlmrt_errorf(err, err_cap, TLMRT_ERR_IO, "%s: expected a regular file", path);
    goto done;
  }
  uint64_t size = (uint64_t)st.st_size;
  long page_l = sysconf(_SC_PAGESIZE);
  uint64_t page = page_l > 0 ? (uint64_t)page_l : 4096u;
  if (size > (uint64_t)SIZE_MAX - 2u * page) {
    status = tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY,
                          "cannot map %" PRIu64 " bytes for %s", size, file);
    goto done;
  }
  uint64_t file_pages = (size + page - 1u) / page * page;
  map_len = (size_t)(file_pages + page);
  base = mmap(NULL, map_len, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    status = tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY,
                          "cannot map %" PRIu64 " bytes for %s: %s", size, file, strerror(errno));
    goto done;
  }
  if (size > 0) {
    void* got = mmap(base, (size_t)size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
    if (got == MAP_FAILED || got != base) {
      int e = errno;
      status = tlmrt_errorf(err, err_cap, TLMRT_ERR_IO, "cannot map %s: %s", path,
                            got == MAP_FAILED ? strerror(e) : "the mapping moved");
      goto done;
    }
    /* One sequential pass to hash it: ask for read-ahead (advice only; its failure changes nothing). */
    (void)posix_madvise(base, (size_t)size, POSIX_MADV_SEQUENTIAL);
  }
  /* The file must not have changed size since fstat: a shrunk file would fault on the hash. */
  struct stat st2;
  if (fstat(fd, &st2) != 0 || (uint64_t)st2.st_size != size) {
    status = tlmrt_errorf(err, err_cap, TLMRT_ERR_IO, "cannot read %s: %s", path,
                          "the file changed size while reading");
    goto done;
  }
  /* A private copy, on huge pages where the kernel gives them: the kernels stream the weights, and
   * 4 KiB pages cost a TLB miss every 4 KiB. The hash is taken of the copy, the bytes used. */
  size_t copy_len = 0;
  uint8_t* copy = private_copy && size > 0 ? map_huge_aligned(map_len, &copy_len) : NULL;
  if (copy != NULL) {
    /* 2 MiB at a time, each unmapped once copied: the load peaks at the weights plus 2 MiB, not twice. */
    for (size_t done = 0; done < map_len;) {
      size_t n = map_len - done < (size_t)HUGE_PAGE_BYTES ? map_len - done : (size_t)HUGE_PAGE_BYTES;
      if (done < size) memcpy(copy + done, (uint8_t*)base + done, (size_t)size - done < n ? (size_t)size - done : n);
      (void)munmap((uint8_t*)base + done, n);
      done += n;
    }
    base = copy;
    map_len = copy_len;
  }
  tlmrt_sha256_ctx ctx;
  tlmrt_sha256_init(&ctx);
  tlmrt_sha256_update(&ctx, base, (size_t)size);
  uint8_t digest[32];
  tlmrt_sha256_final(&ctx, digest);
  tlmrt_sha256_hex(digest, out->sha256);
  if (copy != NULL) {
    (void)mprotect(base, map_len, PROT_READ); /* read-only as the file's pages were; a kernel's write faults */
  } else if (size > 0) {
    (void)posix_madvise(base, (size_t)size, POSIX_MADV_NORMAL);
  }
  out->data = (const uint8_t*)base;
  out->size = size;
  out->map_len = map_len;
  base = MAP_FAILED;
done:
  if (base != MAP_FAILED) (void)munmap(base, map_len); /* the open failed already; only EINVAL is possible */
  close(fd);
  free(path);
  return status;
}

void tlmrt_release_weights(tlmrt_weights* w) {
  if (w == NULL || w->data == NULL) return;
  (void)munmap((void*)(uintptr_t)w->data, w->map_len);  /* only EINVAL, impossible for our own mapping */
  w->data = NULL;
  w->size = 0;
  w->map_len = 0;
}

tlmrt_status tlmrt_check_weights(const char* what, uint64_t plan_bytes, const char* plan_sha256,
                                 const tlmrt_weights* w, char* err, size_t err_cap) {
  if (!tlmrt_is_sha256_hex(plan_sha256)) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                        "%s: weights_sha256 expected 64 lowercase hex digits, found %s", what,
                        plan_sha256 == NULL ? "NULL" : "something else");
  }
  if (plan_bytes != w->size) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                        "%s: expected %" PRIu64 " bytes (the %s's weights_bytes), found %" PRIu64
                        "; the artifact is corrupted or mixed up",
                        w->file, plan_bytes, what, w->size);
  }
  if (memcmp(plan_sha256, w->sha256, 64) != 0) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                        "%s: sha256 mismatch (expected %.64s from the %s, found %.64s); "
                        "the artifact is corrupted",
                        w->file, plan_sha256, what, w->sha256);
  }
  return TLMRT_OK;
}

/* ---- plan validation -------------------------------------------------------------------------- */

static tlmrt_status validate_tensor(const char* what, const tlmrt_plan_tensor* t, int32_t i, uint64_t arena_bytes,
                                    uint64_t weights_size, char* err, size_t err_cap) {
  uint64_t limit;
  const char* where;
  if (t->storage == TLMRT_STORAGE_ARENA) {
    limit = arena_bytes;
    where = "the arena";
  } else if (t->storage == TLMRT_STORAGE_WEIGHTS) {
    limit = weights_size;
    where = TLMRT_WEIGHTS_FILE;
  } else {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                        "%s tensor %d: storage expected %d (arena) or %d (weights), found %d", what, i,
                        TLMRT_STORAGE_ARENA, TLMRT_STORAGE_WEIGHTS, t->storage);
  }
  if (t->ndim < 0 || t->ndim > TLMRT_PLAN_MAX_NDIM) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT, "%s tensor %d: ndim expected 0..%d, found %d",
                        what, i, TLMRT_PLAN_MAX_NDIM, t->ndim);
  }
  if (t->ndim > 0 && t->shape == NULL) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                        "%s tensor %d: expected %d shape entries, found a NULL shape", what, i, t->ndim);
  }
  if (t->dtype_lanes != 1 || t->dtype_bits == 0) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                        "%s tensor %d: expected dtype lanes 1 and bits > 0, found lanes %u bits %u", what, i,
                        (unsigned)t->dtype_lanes, (unsigned)t->dtype_bits);
  }
  uint64_t count = 1;
  for (int32_t d = 0; d < t->ndim; ++d) {
    if (t->shape[d] < 0) {
      return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                          "%s tensor %d: dimension %d expected >= 0, found %" PRId64, what, i, d, t->shape[d]);
    }
    if (__builtin_mul_overflow(count, (uint64_t)t->shape[d], &count)) {
      return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                          "%s tensor %d: the element count overflows 64 bits", what, i);
    }
  }
  uint64_t bits;
  if (__builtin_mul_overflow(count, (uint64_t)t->dtype_bits, &bits) || bits % 8u != 0 ||
      bits / 8u != t->nbytes) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                        "%s tensor %d: nbytes expected %" PRIu64 " elements * %u bits / 8, found %" PRIu64,
                        what, i, count, (unsigned)t->dtype_bits, t->nbytes);
  }
  if (t->offset % TLMRT_ALIGNMENT != 0) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                        "%s tensor %d: offset expected a multiple of %u, found %" PRIu64, what, i,
                        TLMRT_ALIGNMENT, t->offset);
  }
  if (t->offset > limit || t->nbytes > limit - t->offset) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                        "%s tensor %d: bytes [%" PRIu64 ", %" PRIu64 " + %" PRIu64
                        ") expected within %s (%" PRIu64 " bytes), found beyond its end",
                        what, i, t->offset, t->offset, t->nbytes, where, limit);
  }
  return TLMRT_OK;
}

static tlmrt_status validate_io(const char* what, const tlmrt_plan_tables* t, const char* kind, int32_t count,
                                const tlmrt_plan_io* ios, char* err, size_t err_cap) {
  if (count < 0 || count > TLMRT_MAX_PLAN_ENTRIES || (count > 0 && ios == NULL)) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                        "%s: expected 0..%d %ss with a non-NULL table, found %d (table %s)", what,
                        TLMRT_MAX_PLAN_ENTRIES, kind, count, ios == NULL ? "NULL" : "set");
  }
  for (int32_t i = 0; i < count; ++i) {
    if (ios[i].name == NULL) {
      return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT, "%s %s %d: expected a name, found NULL",
                          what, kind, i);
    }
    int32_t ti = ios[i].tensor;
    if (ti < 0 || ti >= t->num_tensors) {
      return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                          "%s %s %d (%.200s): tensor index expected 0..%d, found %d", what, kind, i,
                          ios[i].name, t->num_tensors - 1, ti);
    }
    if (t->tensors[ti].storage != TLMRT_STORAGE_ARENA) {
      return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                          "%s %s %d (%.200s): tensor %d expected in the arena, found storage %d",
                          what, kind, i, ios[i].name, ti, t->tensors[ti].storage);
    }
  }
  return TLMRT_OK;
}

tlmrt_status tlmrt_validate_tables(const char* what, const tlmrt_plan_tables* t, uint64_t arena_bytes,
                                   uint64_t weights_size, char* err, size_t err_cap) {
  if (t->num_tensors < 0 || t->num_tensors > TLMRT_MAX_PLAN_ENTRIES || (t->num_tensors > 0 && t->tensors == NULL)) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                        "%s: expected 0..%d tensors with a non-NULL table, found %d", what,
                        TLMRT_MAX_PLAN_ENTRIES, t->num_tensors);
  }
  for (int32_t i = 0; i < t->num_tensors; ++i) {
    tlmrt_status s = validate_tensor(what, &t->tensors[i], i, arena_bytes, weights_size, err, err_cap);
    if (s != TLMRT_OK) return s;
  }
  tlmrt_status s = validate_io(what, t, "input", t->num_inputs, t->inputs, err, err_cap);
  if (s != TLMRT_OK) return s;
  return validate_io(what, t, "output", t->num_outputs, t->outputs, err, err_cap);
}

/* ---- plan libraries --------------------------------------------------------------------------- */

tlmrt_status tlmrt_open_library(const char* dir, const char* rel, const char* symbol, void** out_handle,
                                void** out_symbol, char* err, size_t err_cap) {
  *out_handle = NULL;
  *out_symbol = NULL;
  char* path = tlmrt_join_path(dir, rel);
  if (path == NULL) return tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  tlmrt_status s = TLMRT_OK;
  struct stat st;
  if (stat(path, &st) != 0) {
    s = tlmrt_errorf(err, err_cap, TLMRT_ERR_IO, "%s: cannot open (%s); expected the model library", path,
                     strerror(errno));
    goto done;
  }
  dlerror();
  void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (handle == NULL) {
    const char* why = dlerror();
    s = tlmrt_errorf(err, err_cap, TLMRT_ERR_INCOMPATIBLE,
                     "%s: cannot load (%s); expected a shared library for this machine", path,
                     why != NULL ? why : "unknown dlopen error");
    goto done;
  }
  dlerror();
  void* sym = dlsym(handle, symbol);
  if (sym == NULL) {
    dlclose(handle);
    s = tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                     "%s: expected the symbol %s, found none; not a tlmpack model library", rel, symbol);
    goto done;
  }
  *out_handle = handle;
  *out_symbol = sym;
done:
  free(path);
  return s;
}

/* ---- open / close ----------------------------------------------------------------------------- */

TLMRT_EXPORT const char* tlmrt_version(void) { return "0.2.0"; }

static void options_defaults(tlmrt_options* o) {
  memset(o, 0, sizeof(*o));
  o->struct_size = (uint32_t)sizeof(tlmrt_options);
  o->num_threads = 0;
  o->verify_files = 1;
  o->device_type = TLMRT_DEVICE_CPU;
  o->device_id = 0;
  o->use_cuda_graph = 1;
}

TLMRT_EXPORT void tlmrt_options_init_sized(tlmrt_options* opts, uint32_t size) {
  if (opts == NULL || size < OPTIONS_V1_SIZE) return;  /* too small to be any version of the struct */
  tlmrt_options d;
  options_defaults(&d);
  memcpy(opts, &d, size < sizeof(d) ? size : sizeof(d));
  opts->struct_size = size;
}

/* The API version 1 entry point (see tlmrt.h); the parentheses keep the macro out. */
TLMRT_EXPORT void(tlmrt_options_init)(tlmrt_options* opts) { tlmrt_options_init_sized(opts, OPTIONS_V1_SIZE); }

TLMRT_EXPORT const char* tlmrt_open_error(void) { return tls_open_error; }

char* tlmrt_thread_error(size_t* cap) {
  *cap = sizeof(tls_open_error);
  return tls_open_error;
}

static void ctx_destroy(tlmrt_model* m, exec_ctx* c) {
  if (c == NULL) return;
  if (c->backend_ctx != NULL) m->backend->ctx_destroy(m->state, c->backend_ctx);
  free(c->host_inputs);
  free(c->host_outputs);
  free(c);
}

static tlmrt_status ctx_create(tlmrt_model* m, void* arena, exec_ctx** out, char* err, size_t cap) {
  *out = NULL;
  exec_ctx* c = (exec_ctx*)calloc(1, sizeof(exec_ctx));
  if (c == NULL) return tlmrt_errorf(err, cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  atomic_init(&c->busy, tlmrt_fork_count() + 1u);
  c->own_arena = arena == NULL;
  size_t ni = m->tables.num_inputs > 0 ? (size_t)m->tables.num_inputs : 1u;
  size_t no = m->tables.num_outputs > 0 ? (size_t)m->tables.num_outputs : 1u;
  c->host_inputs = (tlmrt_io*)calloc(ni, sizeof(tlmrt_io));
  c->host_outputs = (tlmrt_io*)calloc(no, sizeof(tlmrt_io));
  if (c->host_inputs == NULL || c->host_outputs == NULL) {
    ctx_destroy(m, c);
    return tlmrt_errorf(err, cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  }
  tlmrt_status s = m->backend->ctx_create(m->state, arena, &c->backend_ctx, err, cap);
  if (s != TLMRT_OK) {
    ctx_destroy(m, c);
    return s;
  }
  *out = c;
  return TLMRT_OK;
}

/* A free context for one run (busy from here on until ctx_release), made when every one is busy. */
static tlmrt_status ctx_acquire(tlmrt_model* m, exec_ctx** out, int32_t* out_index, char* err, size_t cap) {
  /* A context marked with an older fork count was in use by a thread of a parent process, which
   * does not exist here: it is free. */
  uint32_t mine = tlmrt_fork_count() + 1u;
  for (int32_t i = 0; i < m->max_contexts; ++i) {
    exec_ctx* c = atomic_load_explicit(&m->ctxs[i], memory_order_acquire);
    if (c == NULL) break;
    uint32_t held = 0;
    int got = atomic_compare_exchange_strong_explicit(&c->busy, &held, mine, memory_order_acquire,
                                                      memory_order_relaxed);
    if (!got && held != mine) {
      got = atomic_compare_exchange_strong_explicit(&c->busy, &held, mine, memory_order_acquire,
                                                    memory_order_relaxed);
    }
    if (got) {
      *out = c;
      *out_index = i;
      return TLMRT_OK;
    }
  }
  if (atomic_load_explicit(&m->ctxs[m->max_contexts - 1], memory_order_acquire) == NULL) {
    exec_ctx* c = NULL;
    tlmrt_status s = ctx_create(m, NULL, &c, err, cap);
    if (s != TLMRT_OK) return s;
    for (int32_t i = 0; i < m->max_contexts; ++i) {
      exec_ctx* expected = NULL;
      if (atomic_compare_exchange_strong_explicit(&m->ctxs[i], &expected, c, memory_order_acq_rel,
                                                  memory_order_acquire)) {
        *out = c;
        *out_index = i;
        return TLMRT_OK;
      }
    }
    ctx_destroy(m, c);
  }
  if (m->max_contexts == 1) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_BUSY,
                        "another thread is running this model; a %s model takes one run at a time: open "
                        "one model per thread, or wait for the other run",
                        m->backend->name);
  }
  return tlmrt_errorf(err, cap, TLMRT_ERR_BUSY,
                      "%d runs of this model are in flight already, the most it takes at once; open "
                      "another model or wait for one of them",
                      m->max_contexts);
}

static void ctx_release(exec_ctx* c) { atomic_store_explicit(&c->busy, 0u, memory_order_release); }

TLMRT_EXPORT void tlmrt_model_close(tlmrt_model* m) {
  if (m == NULL) return;
  tlmrt_batch_close(m->batch);
  for (int32_t i = 0; i < MAX_CONTEXTS; ++i) {
    ctx_destroy(m, atomic_load_explicit(&m->ctxs[i], memory_order_acquire));
  }
  if (m->backend != NULL && m->state != NULL) {
    if (m->backend->set_profiling != NULL && atomic_load(&m->profiling)) {
      char ignored[TLMRT_ERROR_CAP];
      m->backend->set_profiling(m->state, 0, ignored, sizeof(ignored));
    }
    m->backend->close(m->state);
  }
  if (tls_record.error_model == m->id) tls_record.error_model = 0;
  if (tls_record.run_model == m->id) tls_record.run_model = 0;
  free(m->prof_steps);
  free(m);
}

/* The caller's options over the defaults: fields past the caller's struct_size keep their defaults. */
static tlmrt_status read_options(const tlmrt_options* given, tlmrt_options* out, char* err, size_t cap) {
  options_defaults(out);
  if (given == NULL) return TLMRT_OK;
  if (given->struct_size < OPTIONS_V1_SIZE) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT,
                        "opts->struct_size: expected at least %u (call tlmrt_options_init), found %u",
                        OPTIONS_V1_SIZE, given->struct_size);
  }
  size_t n = given->struct_size < sizeof(tlmrt_options) ? given->struct_size : sizeof(tlmrt_options);
  memcpy(out, given, n);
  out->struct_size = (uint32_t)sizeof(tlmrt_options);
  if (out->num_threads < 0) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT,
                        "opts->num_threads: expected 0 (all cores) or more, found %d", out->num_threads);
  }
  if (out->verify_files != 0 && out->verify_files != 1) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT, "opts->verify_files: expected 0 or 1, found %d",
                        out->verify_files);
  }
  if (out->device_type != TLMRT_DEVICE_CPU && out->device_type != TLMRT_DEVICE_CUDA) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT,
                        "opts->device_type: expected %d (TLMRT_DEVICE_CPU) or %d (TLMRT_DEVICE_CUDA), found %d",
                        TLMRT_DEVICE_CPU, TLMRT_DEVICE_CUDA, out->device_type);
  }
  if (out->device_id < 0 || (out->device_type == TLMRT_DEVICE_CPU && out->device_id != 0)) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT,
                        "opts->device_id: expected %s, found %d",
                        out->device_type == TLMRT_DEVICE_CPU ? "0 for the CPU" : "a CUDA ordinal >= 0",
                        out->device_id);
  }
  if (out->use_cuda_graph != 0 && out->use_cuda_graph != 1) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT, "opts->use_cuda_graph: expected 0 or 1, found %d",
                        out->use_cuda_graph);
  }
  return TLMRT_OK;
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
  tlmrt_options o;
  tlmrt_status s = read_options(opts, &o, err, cap);
  if (s != TLMRT_OK) return s;
  tlmrt_batch* batch = NULL;
  s = tlmrt_batch_open(dir, &o, &batch, err, cap);
  if (s != TLMRT_OK || batch == NULL) return s == TLMRT_OK ? tlmrt_open_plan_model(dir, &o, NULL, 1, out, err, cap) : s;
  tlmrt_model* m = (tlmrt_model*)calloc(1, sizeof(tlmrt_model));
  if (m == NULL) {
    tlmrt_batch_close(batch);
    return tlmrt_errorf(err, cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  }
  tlmrt_model* top = tlmrt_batch_largest(batch);
  m->batch = batch;
  m->backend = top->backend;
  m->tables = top->tables;
  m->device_id = top->device_id;
  m->max_contexts = top->max_contexts;
  m->id = atomic_fetch_add(&g_next_model_id, 1u);
  for (int32_t i = 0; i < MAX_CONTEXTS; ++i) atomic_init(&m->ctxs[i], NULL);
  atomic_init(&m->profiling, 0);
  *out = m;
  return TLMRT_OK;
}

tlmrt_status tlmrt_open_plan_model(const char* dir, const tlmrt_options* opts, const char* plan_symbol, int own_arena,
                                   tlmrt_model** out, char* err, size_t cap) {
  const tlmrt_options o = *opts;
  tlmrt_status s = TLMRT_OK;
  *out = NULL;
  tlmrt_model* m = (tlmrt_model*)calloc(1, sizeof(tlmrt_model));
  if (m == NULL) return tlmrt_errorf(err, cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  m->backend = o.device_type == TLMRT_DEVICE_CUDA ? &tlmrt_backend_cuda : &tlmrt_backend_cpu;
  m->device_id = o.device_id;
  m->id = atomic_fetch_add(&g_next_model_id, 1u);
  m->max_contexts = m->backend->max_contexts < 1            ? 1
                    : m->backend->max_contexts > MAX_CONTEXTS ? MAX_CONTEXTS
                                                              : m->backend->max_contexts;
  for (int32_t i = 0; i < MAX_CONTEXTS; ++i) atomic_init(&m->ctxs[i], NULL);
  atomic_init(&m->profiling, 0);
  atomic_init(&m->prof_runs, 0u);
  atomic_init(&m->prof_run_ns, 0u);
  s = m->backend->open(dir, &o, plan_symbol, &m->state, &m->tables, err, cap);
  if (s == TLMRT_OK) {
    m->num_steps = m->backend->num_steps(m->state);
    m->prof_steps = (tlmrt_step_counter*)calloc((size_t)m->num_steps + 3u, sizeof(tlmrt_step_counter));
    if (m->prof_steps == NULL) s = tlmrt_errorf(err, cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  }
  if (s == TLMRT_OK && !own_arena && !m->backend->takes_arena) {
    s = tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT, "the %s backend runs in its own arena only", m->backend->name);
  }
  if (s == TLMRT_OK && own_arena) {
    exec_ctx* first = NULL;
    s = ctx_create(m, NULL, &first, err, cap);
    if (s == TLMRT_OK) {
      ctx_release(first);
      atomic_store(&m->ctxs[0], first);
    }
  }
  if (s != TLMRT_OK) {
    tlmrt_model_close(m);
    return s;
  }
  *out = m;
  return TLMRT_OK;
}

int tlmrt_backend_takes_arena(int32_t device_type) {
  return (device_type == TLMRT_DEVICE_CUDA ? &tlmrt_backend_cuda : &tlmrt_backend_cpu)->takes_arena;
}

uint64_t tlmrt_plan_arena_bytes(const tlmrt_model* m) { return m->backend->arena_bytes(m->state); }

tlmrt_status tlmrt_plan_prepare_slot(tlmrt_model* m, int32_t slot, void* arena, char* err, size_t cap) {
  if (slot < 0 || slot >= m->max_contexts || !m->backend->takes_arena || arena == NULL) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT, "plan context %d: expected 0..%d and an arena", slot,
                        m->max_contexts - 1);
  }
  if (atomic_load_explicit(&m->ctxs[slot], memory_order_acquire) != NULL) return TLMRT_OK;
  exec_ctx* c = NULL;
  tlmrt_status s = ctx_create(m, arena, &c, err, cap);
  if (s != TLMRT_OK) return s;
  ctx_release(c);  /* the caller holds the slot; busy stays for ctx_acquire, which these models never call */
  atomic_store_explicit(&m->ctxs[slot], c, memory_order_release);
  return TLMRT_OK;
}

tlmrt_status tlmrt_plan_run_in(tlmrt_model* m, int32_t slot, const tlmrt_io* inputs, const tlmrt_io* outputs,
                               char* err, size_t cap) {
  int prof = atomic_load_explicit(&m->profiling, memory_order_relaxed);
  uint64_t t0 = prof ? tlmrt_now_ns() : 0;
  exec_ctx* c = slot >= 0 && slot < m->max_contexts ? atomic_load_explicit(&m->ctxs[slot], memory_order_acquire) : NULL;
  if (c == NULL) return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT, "plan context %d: not prepared", slot);
  tlmrt_status s = m->backend->run(m->state, c->backend_ctx, inputs, outputs, prof ? m->prof_steps : NULL, err, cap);
  if (prof && s == TLMRT_OK) {
    atomic_fetch_add_explicit(&m->prof_runs, 1u, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->prof_run_ns, tlmrt_now_ns() - t0, memory_order_relaxed);
  }
  return s;
}

/* ---- queries ---------------------------------------------------------------------------------- */

TLMRT_EXPORT int32_t tlmrt_model_num_inputs(const tlmrt_model* m) { return m ? m->tables.num_inputs : 0; }
TLMRT_EXPORT int32_t tlmrt_model_num_outputs(const tlmrt_model* m) { return m ? m->tables.num_outputs : 0; }

TLMRT_EXPORT const char* tlmrt_model_last_error(const tlmrt_model* m) {
  return (m != NULL && tls_record.error_model == m->id) ? tls_record.error : "";
}

TLMRT_EXPORT const char* tlmrt_model_device_name(const tlmrt_model* m) {
  if (m != NULL && m->batch != NULL) return tlmrt_batch_describe(m->batch);
  return m ? m->backend->describe(m->state) : "";
}

TLMRT_EXPORT void* tlmrt_model_stream(const tlmrt_model* m) {
  if (m != NULL && m->batch != NULL) return tlmrt_model_stream(tlmrt_batch_largest(m->batch));
  return m ? m->backend->stream(m->state) : NULL;
}

TLMRT_EXPORT tlmrt_status tlmrt_model_wait_stream(tlmrt_model* m, void* stream) {
  if (m == NULL) return TLMRT_ERR_INVALID_ARGUMENT;
  char* err = claim_error(m);
  int32_t count = m->batch != NULL ? tlmrt_batch_count(m->batch) : 1;
  for (int32_t i = 0; i < count; ++i) {
    const tlmrt_model* plan = m->batch != NULL ? tlmrt_batch_model(m->batch, i) : m;
    if (plan->backend->wait_stream == NULL) continue;
    tlmrt_status s = plan->backend->wait_stream(plan->state, stream, err, ERR_CAP);
    if (s != TLMRT_OK) return s;
  }
  return TLMRT_OK;
}

TLMRT_EXPORT uint64_t tlmrt_model_arena_bytes(const tlmrt_model* m) {
  if (m == NULL) return 0;
  if (m->batch != NULL) return tlmrt_batch_arena_bytes(m->batch);
  uint64_t total = 0;
  for (int32_t i = 0; i < m->max_contexts; ++i) {
    const exec_ctx* c = atomic_load_explicit(&m->ctxs[i], memory_order_acquire);
    if (c != NULL && c->own_arena) total += m->backend->arena_bytes(m->state);
  }
  return total;
}

TLMRT_EXPORT int32_t tlmrt_model_num_batch_plans(const tlmrt_model* m) {
  return m != NULL && m->batch != NULL ? tlmrt_batch_count(m->batch) : 0;
}

TLMRT_EXPORT tlmrt_status tlmrt_model_set_batch_costs(tlmrt_model* m, int32_t num_plans, const int64_t* costs) {
  if (m == NULL) return TLMRT_ERR_INVALID_ARGUMENT;
  char* err = claim_error(m);
  if (m->batch == NULL) {
    return tlmrt_errorf(err, ERR_CAP, TLMRT_ERR_INVALID_ARGUMENT, "batch costs: this model has fixed shapes");
  }
  return tlmrt_batch_set_costs(m->batch, num_plans, costs, err, ERR_CAP);
}

TLMRT_EXPORT int64_t tlmrt_model_batch_plan(const tlmrt_model* m, int32_t index) {
  if (m == NULL || m->batch == NULL || index < 0 || index >= tlmrt_batch_count(m->batch)) return 0;
  return tlmrt_batch_size(m->batch, index);
}

static tlmrt_status io_info(tlmrt_model* m, const char* kind, int32_t count, const tlmrt_plan_io* ios,
                            int32_t index, tlmrt_tensor_info* out) {
  char* err = claim_error(m);
  if (out == NULL) {
    return tlmrt_errorf(err, ERR_CAP, TLMRT_ERR_INVALID_ARGUMENT,
                        "%s info: expected an output pointer, found NULL", kind);
  }
  if (index < 0 || index >= count) {
    return tlmrt_errorf(err, ERR_CAP, TLMRT_ERR_INVALID_ARGUMENT,
                        "%s index: expected 0..%d, found %d", kind, count - 1, index);
  }
  const tlmrt_plan_tensor* t = &m->tables.tensors[ios[index].tensor];
  memset(out, 0, sizeof(*out));
  out->name = ios[index].name;
  out->dtype_code = t->dtype_code;
  out->dtype_bits = t->dtype_bits;
  out->ndim = t->ndim;
  for (int32_t d = 0; d < t->ndim; ++d) out->shape[d] = t->shape[d];
  out->nbytes = t->nbytes;
  if (m->batch != NULL) { /* axis 0 is the batch: symbolic, and nbytes is one sample's */
    out->shape[0] = -1;
    out->nbytes = tlmrt_batch_sample_nbytes(m->batch, ios == m->tables.outputs, index);
  }
  return TLMRT_OK;
}

TLMRT_EXPORT tlmrt_status tlmrt_model_input_info(tlmrt_model* m, int32_t index, tlmrt_tensor_info* out) {
  return m ? io_info(m, "input", m->tables.num_inputs, m->tables.inputs, index, out)
           : TLMRT_ERR_INVALID_ARGUMENT;
}

TLMRT_EXPORT tlmrt_status tlmrt_model_output_info(tlmrt_model* m, int32_t index, tlmrt_tensor_info* out) {
  return m ? io_info(m, "output", m->tables.num_outputs, m->tables.outputs, index, out)
           : TLMRT_ERR_INVALID_ARGUMENT;
}

TLMRT_EXPORT tlmrt_status tlmrt_model_output_buffer(tlmrt_model* m, int32_t index, tlmrt_io* out) {
  if (m == NULL) return TLMRT_ERR_INVALID_ARGUMENT;
  char* err = claim_error(m);
  if (out == NULL) {
    return tlmrt_errorf(err, ERR_CAP, TLMRT_ERR_INVALID_ARGUMENT,
                        "output buffer: expected a tlmrt_io pointer, found NULL");
  }
  if (index < 0 || index >= m->tables.num_outputs) {
    return tlmrt_errorf(err, ERR_CAP, TLMRT_ERR_INVALID_ARGUMENT,
                        "output index: expected 0..%d, found %d", m->tables.num_outputs - 1, index);
  }
  if (m->batch != NULL) {
    return tlmrt_errorf(err, ERR_CAP, TLMRT_ERR_INVALID_ARGUMENT,
                        "output buffer: a dynamic-batch model's outputs do not stay in an arena; give output buffers");
  }
  int32_t k = tls_record.run_model == m->id ? tls_record.run_ctx : 0;
  exec_ctx* c = atomic_load_explicit(&m->ctxs[k], memory_order_acquire);
  memset(out, 0, sizeof(*out));
  m->backend->output_buffer(m->state, c->backend_ctx, index, out);
  return TLMRT_OK;
}

/* ---- run -------------------------------------------------------------------------------------- */

static const char* device_word(int32_t device_type) {
  return device_type == TLMRT_DEVICE_CUDA ? "cuda" : device_type == TLMRT_DEVICE_CPU ? "cpu" : "unknown";
}

/* batch: for a dynamic-batch model, the run's batch (each buffer holds that many samples); else 0. */
static tlmrt_status check_io(tlmrt_model* m, char* err, const char* kind, int32_t count, const tlmrt_plan_io* ios,
                             const tlmrt_io* bufs, int allow_skip, int64_t batch) {
  size_t cap = ERR_CAP;
  if (count > 0 && bufs == NULL) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT, "%ss: expected %d buffers, found NULL", kind, count);
  }
  for (int32_t i = 0; i < count; ++i) {
    const tlmrt_io* b = &bufs[i];
    uint64_t want = m->tables.tensors[ios[i].tensor].nbytes;
    if (m->batch != NULL) {
      allow_skip = 0;
      want = tlmrt_batch_sample_nbytes(m->batch, ios == m->tables.outputs, i) * (uint64_t)batch;
    }
    if (allow_skip && b->data == NULL && b->nbytes == 0) continue;  /* stays in the arena */
    if (b->device_type != TLMRT_DEVICE_CPU && b->device_type != TLMRT_DEVICE_CUDA) {
      return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT,
                          "%s %d (%.200s): device_type expected %d (cpu) or %d (cuda), found %d", kind, i,
                          ios[i].name, TLMRT_DEVICE_CPU, TLMRT_DEVICE_CUDA, b->device_type);
    }
    if (b->device_type == TLMRT_DEVICE_CUDA &&
        (m->backend->device_type != TLMRT_DEVICE_CUDA || b->device_id != m->device_id)) {
      return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT,
                          "%s %d (%.200s): a buffer on cuda:%d, but this model runs on %s:%d; expected host "
                          "memory or memory on the model's device",
                          kind, i, ios[i].name, b->device_id, device_word(m->backend->device_type), m->device_id);
    }
    if (b->nbytes != want) {
      return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT,
                          "%s %d (%.200s): expected %" PRIu64 " bytes, given %" PRIu64, kind, i, ios[i].name,
                          want, b->nbytes);
    }
    if (b->data == NULL && want > 0) {
      return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT,
                          "%s %d (%.200s): expected a buffer of %" PRIu64 " bytes, found NULL", kind, i,
                          ios[i].name, want);
    }
  }
  return TLMRT_OK;
}

static tlmrt_status host_buffers(char* err, const char* kind, int32_t count, const void* const* ptrs,
                                 const uint64_t* nbytes, tlmrt_io* out) {
  if (count > 0 && (ptrs == NULL || nbytes == NULL)) {
    return tlmrt_errorf(err, ERR_CAP, TLMRT_ERR_INVALID_ARGUMENT,
                        "%ss: expected %d buffers and their sizes, found a NULL %s", kind, count,
                        ptrs == NULL ? "buffer array" : "size array");
  }
  for (int32_t i = 0; i < count; ++i) {
    out[i].data = (void*)ptrs[i];
    out[i].nbytes = nbytes[i];
    out[i].device_type = TLMRT_DEVICE_CPU;
    out[i].device_id = 0;
  }
  return TLMRT_OK;
}

/* One run: takes a context, checks the buffers, takes a context, runs, and times it when profiling is on. Host buffers
 * (tlmrt_model_run) come as ptrs/nbytes and are turned into the context's tlmrt_io arrays; run_io's
 * come as tlmrt_io. allow_skip: an output with data NULL and nbytes 0 stays in the arena (run_io). */
static tlmrt_status run_model(tlmrt_model* m, int host, const tlmrt_io* inputs, const tlmrt_io* outputs, const void* const* in_ptrs,
                              const uint64_t* in_nbytes, void* const* out_ptrs, const uint64_t* out_nbytes,
                              int allow_skip) {
  int prof = atomic_load_explicit(&m->profiling, memory_order_relaxed);
  uint64_t t0 = prof ? tlmrt_now_ns() : 0;
  char* err = claim_error(m);
  exec_ctx* c = NULL;
  int32_t index = 0;
  tlmrt_status s = ctx_acquire(m, &c, &index, err, ERR_CAP);
  if (s != TLMRT_OK) return s;
  if (host) {
    s = host_buffers(err, "input", m->tables.num_inputs, in_ptrs, in_nbytes, c->host_inputs);
    if (s == TLMRT_OK) {
      s = host_buffers(err, "output", m->tables.num_outputs, (const void* const*)out_ptrs, out_nbytes,
                       c->host_outputs);
    }
    inputs = c->host_inputs;
    outputs = c->host_outputs;
  }
  if (s == TLMRT_OK) s = check_io(m, err, "input", m->tables.num_inputs, m->tables.inputs, inputs, 0, 0);
  if (s == TLMRT_OK) s = check_io(m, err, "output", m->tables.num_outputs, m->tables.outputs, outputs, allow_skip, 0);
  if (s == TLMRT_OK) {
    s = m->backend->run(m->state, c->backend_ctx, inputs, outputs, prof ? m->prof_steps : NULL, err, ERR_CAP);
  }
  tls_record.run_model = m->id;
  tls_record.run_ctx = index;
  ctx_release(c);
  if (prof && s == TLMRT_OK) {
    atomic_fetch_add_explicit(&m->prof_runs, 1u, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->prof_run_ns, tlmrt_now_ns() - t0, memory_order_relaxed);
  }
  return s;
}

/* A dynamic-batch model's run of `batch` samples (0: take it from input 0's size): checks the buffers
 * against it, then runs the plans that cover it, timing the whole when profiling is on. */
static tlmrt_status run_batched(tlmrt_model* m, int64_t batch, const tlmrt_io* inputs, const tlmrt_io* outputs) {
  int prof = atomic_load_explicit(&m->profiling, memory_order_relaxed);
  uint64_t t0 = prof ? tlmrt_now_ns() : 0;
  char* err = claim_error(m);
  if (batch == 0 && m->tables.num_inputs > 0 && inputs != NULL) {
    uint64_t sample = tlmrt_batch_sample_nbytes(m->batch, 0, 0);
    if (sample == 0 || inputs[0].nbytes % sample != 0 || inputs[0].nbytes == 0) {
      return tlmrt_errorf(err, ERR_CAP, TLMRT_ERR_INVALID_ARGUMENT,
                          "input 0 (%.200s): expected a positive multiple of %" PRIu64 " bytes (one sample), given %"
                          PRIu64, m->tables.inputs[0].name, sample, inputs[0].nbytes);
    }
    batch = (int64_t)(inputs[0].nbytes / sample);
  }
  int64_t max = tlmrt_model_batch_plan(m, tlmrt_batch_count(m->batch) - 1);
  if (batch < 1 || batch > max) {
    return tlmrt_errorf(err, ERR_CAP, TLMRT_ERR_INVALID_ARGUMENT,
                        "batch %" PRId64 " is outside the batch plans' range 1..%" PRId64, batch, max);
  }
  tlmrt_status s = check_io(m, err, "input", m->tables.num_inputs, m->tables.inputs, inputs, 0, batch);
  if (s == TLMRT_OK) s = check_io(m, err, "output", m->tables.num_outputs, m->tables.outputs, outputs, 0, batch);
  if (s == TLMRT_OK) {
    char why[TLMRT_ERROR_CAP];  /* the plans' runs claim this thread's error buffer for themselves */
    why[0] = '\0';
    s = tlmrt_batch_run(m->batch, batch, inputs, outputs, why, sizeof(why));
    err = claim_error(m);
    snprintf(err, ERR_CAP, "%s", why);
  }
  if (prof && s == TLMRT_OK) {
    atomic_fetch_add_explicit(&m->prof_runs, 1u, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->prof_run_ns, tlmrt_now_ns() - t0, memory_order_relaxed);
  }
  return s;
}

TLMRT_EXPORT tlmrt_status tlmrt_model_run_io(tlmrt_model* m, const tlmrt_io* inputs, const tlmrt_io* outputs) {
  if (m == NULL) return TLMRT_ERR_INVALID_ARGUMENT;
  if (m->batch != NULL) return run_batched(m, 0, inputs, outputs);
  return run_model(m, 0, inputs, outputs, NULL, NULL, NULL, NULL, 1);
}

TLMRT_EXPORT tlmrt_status tlmrt_model_run(tlmrt_model* m, const void* const* inputs,
                                          const uint64_t* input_nbytes, void* const* outputs,
                                          const uint64_t* output_nbytes) {
  if (m == NULL) return TLMRT_ERR_INVALID_ARGUMENT;
  if (m->batch != NULL) {
    int32_t n_in = m->tables.num_inputs, n_out = m->tables.num_outputs;
    tlmrt_io io[n_in + n_out > 0 ? n_in + n_out : 1];
    char* err = claim_error(m);
    tlmrt_status s = host_buffers(err, "input", n_in, inputs, input_nbytes, io);
    if (s == TLMRT_OK) s = host_buffers(err, "output", n_out, (const void* const*)outputs, output_nbytes, io + n_in);
    return s == TLMRT_OK ? run_batched(m, 0, io, io + n_in) : s;
  }
  return run_model(m, 1, NULL, NULL, inputs, input_nbytes, outputs, output_nbytes, 0);
}

/* "(3, 8, 8)", or with the batch symbolic "(batch, 3, 8)", into buf. */
static void format_shape(char* buf, size_t cap, const int64_t* shape, int32_t ndim, int symbolic_batch) {
  size_t used = (size_t)snprintf(buf, cap, "(");
  for (int32_t d = 0; d < ndim && used < cap; ++d) {
    if (d == 0 && symbolic_batch) {
      used += (size_t)snprintf(buf + used, cap - used, "batch");  /* the manifest's name for axis 0 */
    } else {
      used += (size_t)snprintf(buf + used, cap - used, "%s%" PRId64, d ? ", " : "", shape[d]);
    }
  }
  if (used < cap) snprintf(buf + used, cap - used, ndim == 1 ? ",)" : ")");
}

TLMRT_EXPORT tlmrt_status tlmrt_model_run_shaped(tlmrt_model* m, const int64_t* const* input_shapes,
                                                 const tlmrt_io* inputs, const tlmrt_io* outputs) {
  if (m == NULL) return TLMRT_ERR_INVALID_ARGUMENT;
  char* err = claim_error(m);
  int32_t n = m->tables.num_inputs;
  if (n > 0 && input_shapes == NULL) {
    return tlmrt_errorf(err, ERR_CAP, TLMRT_ERR_INVALID_ARGUMENT, "input shapes: expected %d shapes, found NULL", n);
  }
  int64_t batch = 0;
  for (int32_t i = 0; i < n; ++i) {
    const tlmrt_plan_tensor* t = &m->tables.tensors[m->tables.inputs[i].tensor];
    const int64_t* given = input_shapes[i];
    if (given == NULL && t->ndim > 0) {
      return tlmrt_errorf(err, ERR_CAP, TLMRT_ERR_INVALID_ARGUMENT, "input %d (%.200s): expected a shape, found NULL",
                          i, m->tables.inputs[i].name);
    }
    int ok = 1;
    for (int32_t d = 0; d < t->ndim; ++d) {
      if (d == 0 && m->batch != NULL) {
        if (batch == 0) batch = given[0];
        ok = ok && given[0] == batch && batch >= 1 && batch <= tlmrt_model_batch_plan(m, tlmrt_model_num_batch_plans(m) - 1);
      } else {
        ok = ok && given[d] == t->shape[d];
      }
    }
    if (!ok) {
      char want[256], found[256];
      format_shape(want, sizeof(want), t->shape, t->ndim, m->batch != NULL);
      format_shape(found, sizeof(found), given, t->ndim, 0);
      if (m->batch != NULL) {
        return tlmrt_errorf(err, ERR_CAP, TLMRT_ERR_INVALID_ARGUMENT,
                            "input %d (%.200s): expected shape %s with batch in 1..%" PRId64 "%s, found %s", i,
                            m->tables.inputs[i].name, want,
                            tlmrt_model_batch_plan(m, tlmrt_model_num_batch_plans(m) - 1),
                            i > 0 ? " and equal to input 0's" : "", found);
      }
      return tlmrt_errorf(err, ERR_CAP, TLMRT_ERR_INVALID_ARGUMENT, "input %d (%.200s): expected shape %s, found %s",
                          i, m->tables.inputs[i].name, want, found);
    }
  }
  if (m->batch != NULL) return run_batched(m, batch, inputs, outputs);
  return run_model(m, 0, inputs, outputs, NULL, NULL, NULL, NULL, 1);
}

/* ---- profiling -------------------------------------------------------------------------------- */

TLMRT_EXPORT tlmrt_status tlmrt_model_set_profiling(tlmrt_model* m, int32_t enabled) {
  if (m == NULL) return TLMRT_ERR_INVALID_ARGUMENT;
  char* err = claim_error(m);
  if (enabled != 0 && enabled != 1) {
    return tlmrt_errorf(err, ERR_CAP, TLMRT_ERR_INVALID_ARGUMENT, "enabled: expected 0 or 1, found %d", enabled);
  }
  int was = atomic_load(&m->profiling);
  for (int32_t p = 0; m->batch != NULL && p < tlmrt_batch_count(m->batch); ++p) {
    tlmrt_model* plan = tlmrt_batch_model(m->batch, p);
    tlmrt_status s = tlmrt_model_set_profiling(plan, enabled);
    if (s != TLMRT_OK) {
      char why[TLMRT_ERROR_CAP];
      snprintf(why, sizeof(why), "%s", tlmrt_model_last_error(plan));
      return tlmrt_errorf(claim_error(m), ERR_CAP, s, "%s", why);
    }
  }
  if (m->batch != NULL) {
    claim_error(m);
    atomic_store_explicit(&m->prof_runs, 0u, memory_order_relaxed);
    atomic_store_explicit(&m->prof_run_ns, 0u, memory_order_relaxed);
    atomic_store(&m->profiling, enabled);
    return TLMRT_OK;
  }
  if (enabled && !was && m->backend->set_profiling != NULL) {
    tlmrt_status s = m->backend->set_profiling(m->state, 1, err, ERR_CAP);
    if (s != TLMRT_OK) return s;
  }
  if (enabled) {
    for (int32_t i = 0; i <= m->num_steps + 2; ++i) {
      atomic_store_explicit(&m->prof_steps[i].calls, 0u, memory_order_relaxed);
      atomic_store_explicit(&m->prof_steps[i].ns, 0u, memory_order_relaxed);
      atomic_store_explicit(&m->prof_steps[i].last_start, 0u, memory_order_relaxed);
      atomic_store_explicit(&m->prof_steps[i].last_ns, 0u, memory_order_relaxed);
    }
    atomic_store_explicit(&m->prof_runs, 0u, memory_order_relaxed);
    atomic_store_explicit(&m->prof_run_ns, 0u, memory_order_relaxed);
  }
  atomic_store(&m->profiling, enabled);
  if (!enabled && was && m->backend->set_profiling != NULL) {
    return m->backend->set_profiling(m->state, 0, err, ERR_CAP);
  }
  return TLMRT_OK;
}

TLMRT_EXPORT tlmrt_status tlmrt_model_get_profile(tlmrt_model* m, tlmrt_profile* out) {
  if (m == NULL) return TLMRT_ERR_INVALID_ARGUMENT;
  char* err = claim_error(m);
  if (out == NULL) {
    return tlmrt_errorf(err, ERR_CAP, TLMRT_ERR_INVALID_ARGUMENT, "profile: expected a pointer, found NULL");
  }
  memset(out, 0, sizeof(*out));
  out->enabled = atomic_load(&m->profiling);
  out->num_steps = m->num_steps;
  out->runs = atomic_load_explicit(&m->prof_runs, memory_order_relaxed);
  out->run_ns = atomic_load_explicit(&m->prof_run_ns, memory_order_relaxed);
  if (m->batch != NULL) { /* the plans' kernel and copy times, summed; steps are per plan (num_steps 0 here) */
    for (int32_t p = 0; p < tlmrt_batch_count(m->batch); ++p) {
      tlmrt_profile plan;
      tlmrt_model_get_profile(tlmrt_batch_model(m->batch, p), &plan);
      claim_error(m);
      out->kernel_ns += plan.kernel_ns;
      out->io_ns += plan.io_ns;
      out->pool_launches += plan.pool_launches;
      out->pool_wait_ns += plan.pool_wait_ns;
      out->pool_wakes += plan.pool_wakes;
    }
    return TLMRT_OK;
  }
  for (int32_t i = 0; i < m->num_steps; ++i) out->kernel_ns += atomic_load_explicit(&m->prof_steps[i].ns, memory_order_relaxed);
  out->io_ns = atomic_load_explicit(&m->prof_steps[m->num_steps].ns, memory_order_relaxed);
  out->pool_launches = atomic_load_explicit(&m->prof_steps[m->num_steps + 1].calls, memory_order_relaxed);
  out->pool_wait_ns = atomic_load_explicit(&m->prof_steps[m->num_steps + 1].ns, memory_order_relaxed);
  out->pool_wakes = atomic_load_explicit(&m->prof_steps[m->num_steps + 2].calls, memory_order_relaxed);
  return TLMRT_OK;
}

TLMRT_EXPORT tlmrt_status tlmrt_model_get_profile_step(tlmrt_model* m, int32_t step, tlmrt_profile_step* out) {
  if (m == NULL) return TLMRT_ERR_INVALID_ARGUMENT;
  char* err = claim_error(m);
  if (out == NULL) {
    return tlmrt_errorf(err, ERR_CAP, TLMRT_ERR_INVALID_ARGUMENT, "profile step: expected a pointer, found NULL");
  }
  if (step < 0 || step >= m->num_steps) {
    return tlmrt_errorf(err, ERR_CAP, TLMRT_ERR_INVALID_ARGUMENT, "step: expected 0..%d, found %d",
                        m->num_steps - 1, step);
  }
  memset(out, 0, sizeof(*out));
  m->backend->step_name(m->state, step, &out->kernel, &out->task);
  out->calls = atomic_load_explicit(&m->prof_steps[step].calls, memory_order_relaxed);
  out->total_ns = atomic_load_explicit(&m->prof_steps[step].ns, memory_order_relaxed);
  out->last_start_ns = atomic_load_explicit(&m->prof_steps[step].last_start, memory_order_relaxed);
  out->last_ns = atomic_load_explicit(&m->prof_steps[step].last_ns, memory_order_relaxed);
  return TLMRT_OK;
}
