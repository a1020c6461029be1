/*
 * tlmrt_kernels.c — kernel libraries: single TVM kernels called and timed through the CPU backend's
 * thread pool and context hooks (tlmrt_cpu.c), the path a deployed x86/model.so runs them on.
 *
 * A kernel library is a shared library exporting tvm-ffi packed functions: TVM's LLVM backend
 * exports the PrimFunc whose global_symbol is `name` as `__tvm_ffi_<name>` (tvm-ffi's
 * symbol prefix; names under `__tvm_ffi__` are its library data and metadata, not kernels). Each
 * call packs the caller's tensors as a model step packs its arguments: one TVMFFIAny of type index
 * 7 (DLTensor*) per tensor, into a buffer the library keeps, so a call allocates nothing once a
 * kernel has been looked up and the buffer is large enough.
 *
 * Kernel symbols are looked up with dlsym once and cached in an open-addressing hash table by name.
 */
#define _GNU_SOURCE /* RTLD_DEFAULT */

#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "tlmrt_internal.h"

#define KERNEL_SYMBOL_PREFIX "__tvm_ffi_"
#define KERNEL_MAX_NAME 512
#define KERNEL_MAX_ARGS 4096
#define KERNEL_MAX_NUMBER 1000000000LL  /* calls per timed repeat */
#define KERNEL_MAX_REPEAT_MS 3600000.0  /* an hour */

/* tvm-ffi's error object, declared ABI-compatibly: a TVMFFIObject header (24 bytes) followed by
 * a TVMFFIErrorCell whose first fields are the kind and the message as byte arrays. */
enum { FFI_TYPE_ERROR = 67 };  /* kTVMFFIError */
typedef struct {
  const char* data;
  size_t size;
} ffi_byte_array;
typedef struct {
  uint64_t combined_ref_count;
  int32_t type_index;
  uint32_t padding;
  void* deleter;
  ffi_byte_array kind;
  ffi_byte_array message;
} ffi_error_object;
typedef void (*ffi_move_from_raised_fn)(void** result);
typedef int (*ffi_dec_ref_fn)(void* obj);

typedef struct {
  char* name;  /* NULL: an empty slot */
  uint64_t hash;
  tlmrt_packed_fn fn;
} kernel_slot;

struct tlmrt_kernel_library {
  void* dl_handle;
  tlmrt_cpu_pool* pool;
  char* path;
  tlmrt_plan_kernel_error_fn kernel_error;       /* the library's own message buffer, if it has one */
  ffi_move_from_raised_fn ffi_move_from_raised;  /* libtvm_ffi.so's, when the process has it */
  ffi_dec_ref_fn ffi_dec_ref;
  kernel_slot* slots;  /* capacity: a power of two, at most half full */
  size_t num_slots;
  size_t num_kernels;
  tlmrt_ffi_any* args;
  int32_t cap_args;
  char last_error[TLMRT_ERROR_CAP];
};

/* ---- open / close ----------------------------------------------------------------------------- */

TLMRT_EXPORT void tlmrt_kernel_library_close(tlmrt_kernel_library* lib) {
  if (lib == NULL) return;
  /* Threads first: nothing may call into the library once it is unloaded. */
  tlmrt_cpu_pool_destroy(lib->pool);
  if (lib->dl_handle != NULL) dlclose(lib->dl_handle);
  for (size_t i = 0; i < lib->num_slots; ++i) free(lib->slots[i].name);
  free(lib->slots);
  free(lib->args);
  free(lib->path);
  free(lib);
}

TLMRT_EXPORT tlmrt_status tlmrt_kernel_library_open(const char* so_path, int32_t num_threads,
                                                    tlmrt_kernel_library** out) {
  size_t cap = 0;
  char* err = tlmrt_thread_error(&cap);
  err[0] = '\0';
  if (out == NULL) return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT, "out: expected a pointer, found NULL");
  *out = NULL;
  if (so_path == NULL || so_path[0] == '\0') {
    return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT,
                        "so_path: expected the path of a kernel library, found %s",
                        so_path == NULL ? "NULL" : "\"\"");
  }
  struct stat st;
  if (stat(so_path, &st) != 0) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_IO,
                        "%s: cannot open (%s); expected a kernel library (a shared library exported by TVM)",
                        so_path, strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_IO, "%s: expected a kernel library (a regular file)", so_path);
  }
  tlmrt_kernel_library* lib = (tlmrt_kernel_library*)calloc(1, sizeof(tlmrt_kernel_library));
  /* dlopen searches the library path for a name without a slash: make it a path. */
  size_t n = strlen(so_path) + 3u;
  char* path = (char*)malloc(n);
  if (lib == NULL || path == NULL) {
    free(lib);
    free(path);
    return tlmrt_errorf(err, cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  }
  snprintf(path, n, "%s%s", strchr(so_path, '/') != NULL ? "" : "./", so_path);
  lib->path = path;

  tlmrt_status s = TLMRT_OK;
  dlerror();
  lib->dl_handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib->dl_handle == NULL) {
    const char* why = dlerror();
    if (why == NULL) why = "unknown dlopen error";
    int needs_ffi = strstr(why, "TVMFFIErrorSetRaisedFromCStrParts") != NULL;
    s = tlmrt_errorf(err, cap, TLMRT_ERR_INCOMPATIBLE, "%s: cannot load (%s); %s", so_path, why,
                     needs_ffi ? "a library from TVM's export_library reports kernel errors through "
                                 "libtvm_ffi.so: load it into the process with RTLD_GLOBAL first (importing "
                                 "tvm_ffi does), or link a definition of TVMFFIErrorSetRaisedFromCStrParts "
                                 "into the library (as x86/model.so's plan does)"
                               : "expected a shared library for this machine");
    goto fail;
  }
  s = tlmrt_cpu_pool_start(num_threads, lib->dl_handle, so_path, &lib->pool, err, cap);
  if (s != TLMRT_OK) goto fail;

  void* sym;
  dlerror();
  sym = dlsym(lib->dl_handle, TLMRT_PLAN_KERNEL_ERROR_SYMBOL);
  if (sym != NULL) memcpy(&lib->kernel_error, &sym, sizeof(lib->kernel_error));
  dlerror();
  sym = dlsym(RTLD_DEFAULT, "TVMFFIErrorMoveFromRaised");
  void* dec_ref = dlsym(RTLD_DEFAULT, "TVMFFIObjectDecRef");
  if (sym != NULL && dec_ref != NULL) {
    memcpy(&lib->ffi_move_from_raised, &sym, sizeof(lib->ffi_move_from_raised));
    memcpy(&lib->ffi_dec_ref, &dec_ref, sizeof(lib->ffi_dec_ref));
  }
  *out = lib;
  return TLMRT_OK;
fail:
  tlmrt_kernel_library_close(lib);
  return s;
}

TLMRT_EXPORT const char* tlmrt_kernel_library_last_error(const tlmrt_kernel_library* lib) {
  return lib != NULL ? lib->last_error : "";
}

/* ---- kernel lookup ---------------------------------------------------------------------------- */

static uint64_t name_hash(const char* s) {
  uint64_t h = 14695981039346656037ull;  /* FNV-1a */
  for (; *s != '\0'; ++s) h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

static kernel_slot* find_slot(kernel_slot* slots, size_t num_slots, const char* name, uint64_t hash) {
  size_t mask = num_slots - 1u;
  for (size_t i = (size_t)hash & mask;; i = (i + 1u) & mask) {
    kernel_slot* slot = &slots[i];
    if (slot->name == NULL || (slot->hash == hash && strcmp(slot->name, name) == 0)) return slot;
  }
}

static tlmrt_status cache_kernel(tlmrt_kernel_library* lib, const char* name, uint64_t hash, tlmrt_packed_fn fn) {
  if (2u * (lib->num_kernels + 1u) > lib->num_slots) {
    size_t grown = lib->num_slots == 0 ? 16u : 2u * lib->num_slots;
    kernel_slot* slots = (kernel_slot*)calloc(grown, sizeof(kernel_slot));
    if (slots == NULL) return TLMRT_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i < lib->num_slots; ++i) {
      if (lib->slots[i].name != NULL) *find_slot(slots, grown, lib->slots[i].name, lib->slots[i].hash) = lib->slots[i];
    }
    free(lib->slots);
    lib->slots = slots;
    lib->num_slots = grown;
  }
  char* copy = strdup(name);
  if (copy == NULL) return TLMRT_ERR_OUT_OF_MEMORY;
  kernel_slot* slot = find_slot(lib->slots, lib->num_slots, name, hash);
  slot->name = copy;
  slot->hash = hash;
  slot->fn = fn;
  lib->num_kernels++;
  return TLMRT_OK;
}

static tlmrt_status lookup_kernel(tlmrt_kernel_library* lib, const char* name, tlmrt_packed_fn* out) {
  char* err = lib->last_error;
  size_t len = strlen(name);
  if (len == 0 || len > KERNEL_MAX_NAME) {
    return tlmrt_errorf(err, sizeof(lib->last_error), TLMRT_ERR_INVALID_ARGUMENT,
                        "name: expected a kernel name of 1..%d bytes, found %zu bytes", KERNEL_MAX_NAME, len);
  }
  if (name[0] == '_') {
    /* "_x" would be __tvm_ffi__x: tvm-ffi's library data and metadata live there, not kernels. */
    return tlmrt_errorf(err, sizeof(lib->last_error), TLMRT_ERR_INVALID_ARGUMENT,
                        "no kernel named \"%.200s\": names starting with '_' map to tvm-ffi's reserved "
                        KERNEL_SYMBOL_PREFIX "_ symbols, which are not kernels",
                        name);
  }
  uint64_t hash = name_hash(name);
  if (lib->num_slots > 0) {
    kernel_slot* slot = find_slot(lib->slots, lib->num_slots, name, hash);
    if (slot->name != NULL) {
      *out = slot->fn;
      return TLMRT_OK;
    }
  }
  char symbol[sizeof(KERNEL_SYMBOL_PREFIX) + KERNEL_MAX_NAME];
  snprintf(symbol, sizeof(symbol), KERNEL_SYMBOL_PREFIX "%s", name);
  dlerror();
  void* sym = dlsym(lib->dl_handle, symbol);
  if (sym == NULL) {
    return tlmrt_errorf(err, sizeof(lib->last_error), TLMRT_ERR_INVALID_ARGUMENT,
                        "no kernel named \"%.200s\" (expected the exported symbol %.220s, found none)", name,
                        symbol);
  }
  tlmrt_packed_fn fn;
  memcpy(&fn, &sym, sizeof(fn));
  if (cache_kernel(lib, name, hash, fn) != TLMRT_OK) {
    return tlmrt_errorf(err, sizeof(lib->last_error), TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  }
  *out = fn;
  return TLMRT_OK;
}

/* ---- calls ------------------------------------------------------------------------------------ */

/* Checks the library, name and tensors, finds the kernel and packs the arguments into lib->args. */
static tlmrt_status prepare(tlmrt_kernel_library* lib, const char* name, tlmrt_dltensor* const* args,
                            int32_t num_args, tlmrt_packed_fn* fn) {
  if (lib == NULL) {
    size_t cap = 0;
    char* err = tlmrt_thread_error(&cap);
    return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT, "lib: expected a kernel library, found NULL");
  }
  char* err = lib->last_error;
  size_t cap = sizeof(lib->last_error);
  err[0] = '\0';
  if (name == NULL) return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT, "name: expected a kernel name, found NULL");
  if (num_args < 0 || num_args > KERNEL_MAX_ARGS || (num_args > 0 && args == NULL)) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT,
                        "kernel %.200s: expected 0..%d arguments in a non-NULL array, found %d%s", name,
                        KERNEL_MAX_ARGS, num_args, args == NULL ? " and a NULL array" : "");
  }
  for (int32_t i = 0; i < num_args; ++i) {
    const tlmrt_dltensor* t = args[i];
    const char* bad = NULL;
    if (t == NULL) {
      bad = "expected a tensor, found NULL";
    } else if (t->device.device_type != TLMRT_DEVICE_CPU) {
      bad = "expected a CPU tensor (device type 1)";
    } else if (t->ndim < 0 || (t->ndim > 0 && t->shape == NULL)) {
      bad = "expected ndim >= 0 and a shape array";
    } else {
      int empty = 0;
      for (int32_t d = 0; d < t->ndim; ++d) empty |= t->shape[d] == 0;
      uintptr_t address = (uintptr_t)t->data + (uintptr_t)t->byte_offset;
      if (t->data == NULL && !empty) {
        bad = "expected data, found NULL";
      } else if (address % TLMRT_ALIGNMENT != 0 && !empty) {
        /* TVM's kernels assume it (its buffers' data_alignment) and may use aligned vector loads. */
        return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT,
                            "kernel %.200s argument %d: expected data aligned to %u bytes, as TVM's kernels "
                            "assume, found an address %u bytes past a multiple of %u",
                            name, i, TLMRT_ALIGNMENT, (unsigned)(address % TLMRT_ALIGNMENT), TLMRT_ALIGNMENT);
      }
    }
    if (bad != NULL) {
      return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT, "kernel %.200s argument %d: %s", name, i, bad);
    }
  }
  tlmrt_status s = lookup_kernel(lib, name, fn);
  if (s != TLMRT_OK) return s;
  if (num_args > lib->cap_args) {
    tlmrt_ffi_any* grown = (tlmrt_ffi_any*)realloc(lib->args, (size_t)num_args * sizeof(tlmrt_ffi_any));
    if (grown == NULL) return tlmrt_errorf(err, cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
    lib->args = grown;
    lib->cap_args = num_args;
  }
  for (int32_t i = 0; i < num_args; ++i) {
    lib->args[i].type_index = TLMRT_FFI_TYPE_DLTENSOR_PTR;
    lib->args[i].zero_padding = 0;
    lib->args[i].v.v_ptr = args[i];
  }
  return TLMRT_OK;
}

/* The failed kernel's message: the library's own buffer (a model.so's plan), else the error it
 * raised in libtvm_ffi.so (taken, so it does not linger there); NULL when it left none. */
static const char* kernel_message(tlmrt_kernel_library* lib, char* buf, size_t cap) {
  if (lib->kernel_error != NULL) {
    const char* why = lib->kernel_error();
    if (why != NULL && why[0] != '\0') return why;
  }
  if (lib->ffi_move_from_raised == NULL) return NULL;
  void* obj = NULL;
  lib->ffi_move_from_raised(&obj);
  if (obj == NULL) return NULL;
  const ffi_error_object* e = (const ffi_error_object*)obj;
  const char* out = NULL;
  if (e->type_index == FFI_TYPE_ERROR && e->message.data != NULL) {
    int kind_len = e->kind.data != NULL && e->kind.size < 256 ? (int)e->kind.size : 0;
    int msg_len = e->message.size < cap ? (int)e->message.size : (int)cap;
    snprintf(buf, cap, "%.*s%s%.*s", kind_len, kind_len > 0 ? e->kind.data : "", kind_len > 0 ? ": " : "",
             msg_len, e->message.data);
    out = buf;
  }
  lib->ffi_dec_ref(obj);
  return out;
}

static tlmrt_status kernel_failed(tlmrt_kernel_library* lib, const char* name, int32_t rc, const char* when) {
  char why[TLMRT_ERROR_CAP];
  const char* msg = kernel_message(lib, why, sizeof(why));
  return tlmrt_errorf(lib->last_error, sizeof(lib->last_error), TLMRT_ERR_KERNEL,
                      "kernel %.200s failed%s (returned %d): %s", name, when, (int)rc,
                      (msg != NULL && msg[0] != '\0') ? msg : "(the kernel left no message)");
}

static inline int32_t invoke(tlmrt_packed_fn fn, tlmrt_ffi_any* args, int32_t num_args) {
  tlmrt_ffi_any result;
  memset(&result, 0, sizeof(result));
  return fn(NULL, args, num_args, &result);
}

TLMRT_EXPORT tlmrt_status tlmrt_kernel_call(tlmrt_kernel_library* lib, const char* name, tlmrt_dltensor* const* args,
                                            int32_t num_args) {
  tlmrt_packed_fn fn = NULL;
  tlmrt_status s = prepare(lib, name, args, num_args, &fn);
  if (s != TLMRT_OK) return s;
  tlmrt_cpu_pool* saved = tlmrt_cpu_pool_enter(lib->pool);
  int32_t rc = invoke(fn, lib->args, num_args);
  tlmrt_cpu_pool_leave(saved);
  return rc == 0 ? TLMRT_OK : kernel_failed(lib, name, rc, "");
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

TLMRT_EXPORT tlmrt_status tlmrt_kernel_time(tlmrt_kernel_library* lib, const char* name, tlmrt_dltensor* const* args,
                                            int32_t num_args, int32_t repeats, double min_repeat_ms,
                                            double* seconds_per_run) {
  tlmrt_packed_fn fn = NULL;
  tlmrt_status s = prepare(lib, name, args, num_args, &fn);
  if (s != TLMRT_OK) return s;
  char* err = lib->last_error;
  size_t cap = sizeof(lib->last_error);
  if (repeats < 1) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT, "kernel %.200s: repeats: expected >= 1, found %d",
                        name, (int)repeats);
  }
  if (!(min_repeat_ms >= 0.0 && min_repeat_ms <= KERNEL_MAX_REPEAT_MS)) { /* NaN fails too */
    return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT,
                        "kernel %.200s: min_repeat_ms: expected 0..%.0f, found %g", name, KERNEL_MAX_REPEAT_MS,
                        min_repeat_ms);
  }
  if (seconds_per_run == NULL) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT,
                        "kernel %.200s: seconds_per_run: expected an array of %d doubles, found NULL", name,
                        (int)repeats);
  }
  tlmrt_cpu_pool* saved = tlmrt_cpu_pool_enter(lib->pool);
  double t0 = now_seconds();
  int32_t rc = invoke(fn, lib->args, num_args);
  double warm = now_seconds() - t0;
  if (rc != 0) {
    tlmrt_cpu_pool_leave(saved);
    return kernel_failed(lib, name, rc, " in the warm-up call");
  }
  if (warm < 1e-9) warm = 1e-9;
  double want = min_repeat_ms * 1e-3 / warm;
  int64_t number = 1;
  if (want > (double)KERNEL_MAX_NUMBER) {
    number = KERNEL_MAX_NUMBER;
  } else if (want > 1.0) {
    number = (int64_t)want;
    if ((double)number < want) ++number;
  }
  for (int32_t r = 0; r < repeats; ++r) {
    double start = now_seconds();
    for (int64_t i = 0; i < number; ++i) {
      rc = invoke(fn, lib->args, num_args);
      if (rc != 0) {
        tlmrt_cpu_pool_leave(saved);
        char when[64];
        snprintf(when, sizeof(when), " in timed repeat %d", (int)r);
        return kernel_failed(lib, name, rc, when);
      }
    }
    seconds_per_run[r] = (now_seconds() - start) / (double)number;
  }
  tlmrt_cpu_pool_leave(saved);
  return TLMRT_OK;
}
