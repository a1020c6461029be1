/*
 * tlmrt_batch.c — dynamic batch: an artifact with one plan per batch size.
 *
 * The artifact's batch_plans file lists, per device kind, each plan's batch size and the estimated
 * cost of one of its runs (integers, from the build's cost model: tlmpack/runtime/batching.py).
 * Open reads it (its sha256 checked against SHA256SUMS), opens every plan as a model of its own (the
 * plan library's symbol tlmrt_plan_b<N>_v1, the largest plan's the plain one; one dlopen'ed library
 * and one weights.bin file for all), and checks that the plans agree: the same inputs and outputs,
 * axis 0 the plan's batch, the other axes equal.
 *
 * A run covers the caller's batch with plans at the least total cost (a dynamic programme over the
 * costs, made at open for every batch up to the largest): the exact plan when it is the cheapest, else
 * several runs of smaller plans over consecutive slices of the caller's buffers, the last of which may
 * be padded. A padded run goes through staging buffers made at open (zero-filled past the caller's
 * samples), one padded run at a time (a mutex); device buffers cannot be padded.
 *
 * Arenas (CPU): the plans of one run execute one after another, so they share one arena of the
 * largest plan's size. Each run in flight holds a slot: an arena and every plan's context in it
 * (slot 0 made at open, another one when runs overlap, kept until close). So the arena memory is
 * the largest plan's per run in flight, not the sum over the plans. CUDA plans keep their own device
 * arenas (each its own stream and CUDA graph, and a CUDA model takes one run at a time).
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tlmrt_internal.h"

#define MAX_PLANS 64
#define MAX_SLOTS 64 /* runs in flight at once, as the CPU backend's contexts */
#define MAX_BATCH 65536
#define MAX_FILE_BYTES 65536
#define HEADER "tlmpack batch plans 1"

struct tlmrt_batch {
  int32_t count;
  int64_t sizes[MAX_PLANS];  /* ascending */
  int64_t costs[MAX_PLANS];
  tlmrt_model* models[MAX_PLANS];
  int32_t* first;            /* first[n]: the plan of the first run covering n samples, n in 1..max */
  int32_t num_inputs, num_outputs;
  uint64_t* sample_nbytes;   /* inputs, then outputs */
  uint8_t** staging;         /* one buffer per input and output, max batch samples each */
  pthread_mutex_t staging_lock;
  int shared;                         /* the plans run in the slots' arenas (the backend takes_arena) */
  uint64_t arena_bytes;               /* the largest plan's arena: each slot's */
  _Atomic int32_t num_slots;
  _Atomic uint32_t slot_busy[MAX_SLOTS];  /* 0, or the fork count + 1 of the thread running in it */
  uint8_t* slot_arena[MAX_SLOTS];
  pthread_mutex_t slot_lock;          /* making a slot */
  char description[512];
};

/* Slot n (n = num_slots, under slot_lock): the arena and every plan's context in it, held by the
 * caller. */
static tlmrt_status make_slot(tlmrt_batch* b, int32_t n, char* err, size_t cap) {
  uint64_t size = b->arena_bytes == 0 ? TLMRT_ALIGNMENT : (b->arena_bytes + TLMRT_ALIGNMENT - 1u) & ~(uint64_t)(TLMRT_ALIGNMENT - 1u);
  uint8_t* arena = b->slot_arena[n];  /* left by an earlier attempt that failed after it, with some contexts in it */
  if (arena == NULL) {
    arena = (uint8_t*)tlmrt_alloc_large(size);
    if (arena == NULL) {
      return tlmrt_errorf(err, cap, TLMRT_ERR_OUT_OF_MEMORY, "cannot allocate the arena (%" PRIu64 " bytes)", size);
    }
    memset(arena, 0, (size_t)size);
    b->slot_arena[n] = arena;
  }
  for (int32_t p = 0; p < b->count; ++p) {
    tlmrt_status s = tlmrt_plan_prepare_slot(b->models[p], n, arena, err, cap);
    if (s != TLMRT_OK) return s;  /* the arena and the contexts made stay for close; the slot is not published */
  }
  atomic_store_explicit(&b->slot_busy[n], tlmrt_fork_count() + 1u, memory_order_relaxed);
  atomic_store_explicit(&b->num_slots, n + 1, memory_order_release);
  return TLMRT_OK;
}

/* A free slot for one run (busy until slot_release), made when every one is busy. A slot marked with
 * an older fork count was held by a thread of a parent process, which does not exist here: it is free. */
static tlmrt_status slot_acquire(tlmrt_batch* b, int32_t* out, char* err, size_t cap) {
  uint32_t mine = tlmrt_fork_count() + 1u;
  int32_t n = atomic_load_explicit(&b->num_slots, memory_order_acquire);
  for (int32_t i = 0; i < n; ++i) {
    uint32_t held = 0;
    int got = atomic_compare_exchange_strong_explicit(&b->slot_busy[i], &held, mine, memory_order_acquire,
                                                      memory_order_relaxed);
    if (!got && held != mine) {
      got = atomic_compare_exchange_strong_explicit(&b->slot_busy[i], &held, mine, memory_order_acquire,
                                                    memory_order_relaxed);
    }
    if (got) {
      *out = i;
      return TLMRT_OK;
    }
  }
  pthread_mutex_lock(&b->slot_lock);
  n = atomic_load_explicit(&b->num_slots, memory_order_acquire);
  tlmrt_status s = n < MAX_SLOTS ? make_slot(b, n, err, cap)
                                 : tlmrt_errorf(err, cap, TLMRT_ERR_BUSY,
                                                "%d runs of this model are in flight already, the most it takes at "
                                                "once; open another model or wait for one of them", MAX_SLOTS);
  pthread_mutex_unlock(&b->slot_lock);
  if (s == TLMRT_OK) *out = n;
  return s;
}

static void slot_release(tlmrt_batch* b, int32_t i) {
  atomic_store_explicit(&b->slot_busy[i], 0u, memory_order_release);
}

uint64_t tlmrt_batch_arena_bytes(const tlmrt_batch* b) {
  if (b->shared) return b->arena_bytes * (uint64_t)atomic_load_explicit(&b->num_slots, memory_order_acquire);
  uint64_t total = 0;
  for (int32_t p = 0; p < b->count; ++p) total += tlmrt_model_arena_bytes(b->models[p]);
  return total;
}

static tlmrt_status read_plans(const char* dir, const tlmrt_options* opts, tlmrt_batch* b, char* err, size_t cap) {
  char* path = tlmrt_join_path(dir, TLMRT_BATCH_PLANS_FILE);
  if (path == NULL) return tlmrt_errorf(err, cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  FILE* f = fopen(path, "rb");
  free(path);
  if (f == NULL) return tlmrt_errorf(err, cap, TLMRT_ERR_IO, TLMRT_BATCH_PLANS_FILE ": cannot open it");
  char* text = (char*)calloc(MAX_FILE_BYTES + 1, 1);
  size_t n = text ? fread(text, 1, MAX_FILE_BYTES + 1, f) : 0;
  fclose(f);
  if (text == NULL) return tlmrt_errorf(err, cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  tlmrt_status s = TLMRT_OK;
  if (n > MAX_FILE_BYTES) {
    s = tlmrt_errorf(err, cap, TLMRT_ERR_ARTIFACT, TLMRT_BATCH_PLANS_FILE ": larger than %d bytes", MAX_FILE_BYTES);
    goto done;
  }
  text[n] = '\0';
  if (opts->verify_files) {
    tlmrt_sha256_ctx ctx;
    uint8_t digest[32];
    char hex[65];
    tlmrt_sha256_init(&ctx);
    tlmrt_sha256_update(&ctx, text, n);
    tlmrt_sha256_final(&ctx, digest);
    tlmrt_sha256_hex(digest, hex);
    s = tlmrt_sha256sums_expect(dir, TLMRT_BATCH_PLANS_FILE, hex, err, cap);
    if (s != TLMRT_OK) goto done;
  }
  const char* want = opts->device_type == TLMRT_DEVICE_CUDA ? "cuda" : "x86";
  char* save = NULL;
  char* line = strtok_r(text, "\n", &save);
  if (line == NULL || strcmp(line, HEADER) != 0) {
    s = tlmrt_errorf(err, cap, TLMRT_ERR_ARTIFACT, TLMRT_BATCH_PLANS_FILE ": expected the header \"" HEADER "\"");
    goto done;
  }
  for (line = strtok_r(NULL, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
    char kind[16];
    long long size = 0, cost = 0;
    char extra;
    if (sscanf(line, "%15s %lld %lld %c", kind, &size, &cost, &extra) != 3 || size < 1 || size > MAX_BATCH ||
        cost < 1 || cost > (1LL << 40)) {
      s = tlmrt_errorf(err, cap, TLMRT_ERR_ARTIFACT,
                       TLMRT_BATCH_PLANS_FILE ": expected \"<target> <batch 1..%d> <cost>\", found \"%.80s\"",
                       MAX_BATCH, line);
      goto done;
    }
    if (strcmp(kind, want) != 0) continue;
    if (b->count == MAX_PLANS || (b->count > 0 && size <= b->sizes[b->count - 1])) {
      s = tlmrt_errorf(err, cap, TLMRT_ERR_ARTIFACT,
                       TLMRT_BATCH_PLANS_FILE ": expected at most %d %s plans in ascending batch order", MAX_PLANS,
                       want);
      goto done;
    }
    b->sizes[b->count] = size;
    b->costs[b->count] = cost;
    b->count++;
  }
  if (b->count == 0) {
    s = tlmrt_errorf(err, cap, TLMRT_ERR_ARTIFACT, TLMRT_BATCH_PLANS_FILE ": no batch plans for %s", want);
  }
done:
  free(text);
  return s;
}

/* first[n] for n in 1..max: least total cost, then fewest runs, then the larger plan (as batching.py).
 * Replaces b->first only when the new table is complete. */
static tlmrt_status plan_cover(tlmrt_batch* b, char* err, size_t cap) {
  int64_t max = b->sizes[b->count - 1];
  int64_t* cost = (int64_t*)calloc((size_t)max + 1u, sizeof(int64_t));
  int32_t* runs = (int32_t*)calloc((size_t)max + 1u, sizeof(int32_t));
  int32_t* first = (int32_t*)calloc((size_t)max + 1u, sizeof(int32_t));
  if (cost == NULL || runs == NULL || first == NULL) {
    free(cost);
    free(runs);
    free(first);
    return tlmrt_errorf(err, cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  }
  for (int64_t n = 1; n <= max; ++n) {
    int32_t best = -1;
    for (int32_t p = 0; p < b->count; ++p) {
      int64_t rest = n > b->sizes[p] ? n - b->sizes[p] : 0;
      int64_t c = cost[rest] + b->costs[p];
      int32_t r = runs[rest] + 1;
      if (best < 0 || c < cost[n] || (c == cost[n] && (r < runs[n] || (r == runs[n] && b->sizes[p] > b->sizes[best])))) {
        best = p;
        cost[n] = c;
        runs[n] = r;
      }
    }
    first[n] = best;
  }
  free(cost);
  free(runs);
  free(b->first);
  b->first = first;
  return TLMRT_OK;
}

tlmrt_status tlmrt_batch_set_costs(tlmrt_batch* b, int32_t num_plans, const int64_t* costs, char* err, size_t cap) {
  if (num_plans != b->count || costs == NULL) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT, "costs: expected %d costs (one per batch plan), found %d%s",
                        b->count, num_plans, costs == NULL ? " and NULL" : "");
  }
  for (int32_t i = 0; i < num_plans; ++i) {
    if (costs[i] < 1 || costs[i] > (1LL << 50)) {
      return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT,
                          "costs[%d] (batch %" PRId64 "): expected 1..2^50, found %" PRId64, i, b->sizes[i], costs[i]);
    }
  }
  int64_t saved[MAX_PLANS];
  memcpy(saved, b->costs, sizeof(saved));
  memcpy(b->costs, costs, (size_t)num_plans * sizeof(int64_t));
  tlmrt_status s = plan_cover(b, err, cap);
  if (s != TLMRT_OK) memcpy(b->costs, saved, sizeof(saved));
  return s;
}

static tlmrt_status check_plans(tlmrt_batch* b, char* err, size_t cap) {
  tlmrt_model* top = b->models[b->count - 1];
  int64_t max = b->sizes[b->count - 1];
  b->num_inputs = tlmrt_model_num_inputs(top);
  b->num_outputs = tlmrt_model_num_outputs(top);
  int32_t total = b->num_inputs + b->num_outputs;
  b->sample_nbytes = (uint64_t*)calloc((size_t)total + 1u, sizeof(uint64_t));
  b->staging = (uint8_t**)calloc((size_t)total + 1u, sizeof(uint8_t*));
  if (b->sample_nbytes == NULL || b->staging == NULL) return tlmrt_errorf(err, cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  for (int32_t k = 0; k < total; ++k) {
    int output = k >= b->num_inputs;
    int32_t index = output ? k - b->num_inputs : k;
    const char* kind = output ? "output" : "input";
    tlmrt_tensor_info ref;
    tlmrt_status s = output ? tlmrt_model_output_info(top, index, &ref) : tlmrt_model_input_info(top, index, &ref);
    if (s != TLMRT_OK) return tlmrt_errorf(err, cap, s, "batch plans: %s", tlmrt_model_last_error(top));
    if (ref.ndim < 1 || ref.shape[0] != max || ref.nbytes % (uint64_t)max != 0) {
      return tlmrt_errorf(err, cap, TLMRT_ERR_ARTIFACT,
                          "batch plans: %s %.200s of the batch-%" PRId64 " plan expected the batch as axis 0",
                          kind, ref.name, max);
    }
    b->sample_nbytes[k] = ref.nbytes / (uint64_t)max;
    for (int32_t p = 0; p < b->count; ++p) {
      tlmrt_model* m = b->models[p];
      tlmrt_tensor_info t;
      int32_t count = output ? tlmrt_model_num_outputs(m) : tlmrt_model_num_inputs(m);
      s = index < count ? (output ? tlmrt_model_output_info(m, index, &t) : tlmrt_model_input_info(m, index, &t))
                        : TLMRT_ERR_ARTIFACT;
      int same = s == TLMRT_OK && strcmp(t.name, ref.name) == 0 && t.dtype_code == ref.dtype_code &&
                 t.dtype_bits == ref.dtype_bits && t.ndim == ref.ndim && t.shape[0] == b->sizes[p] &&
                 t.nbytes == b->sample_nbytes[k] * (uint64_t)b->sizes[p];
      for (int32_t d = 1; same && d < t.ndim; ++d) same = t.shape[d] == ref.shape[d];
      if (!same || tlmrt_model_num_inputs(m) != b->num_inputs || tlmrt_model_num_outputs(m) != b->num_outputs) {
        return tlmrt_errorf(err, cap, TLMRT_ERR_ARTIFACT,
                            "batch plans: the batch-%" PRId64 " plan's %s %d does not match the batch-%" PRId64
                            " plan's (%.200s)", b->sizes[p], kind, index, max, ref.name);
      }
    }
    b->staging[k] = (uint8_t*)tlmrt_alloc_aligned(b->sample_nbytes[k] * (uint64_t)max);
    if (b->staging[k] == NULL) return tlmrt_errorf(err, cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  }
  return TLMRT_OK;
}

tlmrt_status tlmrt_batch_open(const char* dir, const tlmrt_options* opts, tlmrt_batch** out, char* err, size_t cap) {
  *out = NULL;
  char* path = tlmrt_join_path(dir, TLMRT_BATCH_PLANS_FILE);
  if (path == NULL) return tlmrt_errorf(err, cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  struct stat st;
  int exists = stat(path, &st) == 0;
  free(path);
  if (!exists) return TLMRT_OK;
  tlmrt_batch* b = (tlmrt_batch*)calloc(1, sizeof(tlmrt_batch));
  if (b == NULL) return tlmrt_errorf(err, cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  pthread_mutex_init(&b->staging_lock, NULL);
  pthread_mutex_init(&b->slot_lock, NULL);
  atomic_init(&b->num_slots, 0);
  for (int32_t i = 0; i < MAX_SLOTS; ++i) atomic_init(&b->slot_busy[i], 0u);
  b->shared = tlmrt_backend_takes_arena(opts->device_type);
  tlmrt_status s = read_plans(dir, opts, b, err, cap);
  if (s == TLMRT_OK) s = plan_cover(b, err, cap);
  /* The largest plan first, checking SHA256SUMS as asked; the others load the same verified files. */
  tlmrt_options sub = *opts;
  for (int32_t i = b->count - 1; s == TLMRT_OK && i >= 0; --i) {
    char symbol[64];
    const char* plain = opts->device_type == TLMRT_DEVICE_CUDA ? TLMRT_CUDA_PLAN_SYMBOL : TLMRT_PLAN_SYMBOL;
    if (i == b->count - 1) {
      snprintf(symbol, sizeof(symbol), "%s", plain);
    } else {
      snprintf(symbol, sizeof(symbol), "%.*s_b%" PRId64 "_v1", (int)(strlen(plain) - 3), plain, b->sizes[i]);
    }
    s = tlmrt_open_plan_model(dir, &sub, symbol, !b->shared, &b->models[i], err, cap);
    sub.verify_files = 0;
  }
  if (s == TLMRT_OK) s = check_plans(b, err, cap);
  if (s == TLMRT_OK && b->shared) {
    for (int32_t i = 0; i < b->count; ++i) {
      uint64_t bytes = tlmrt_plan_arena_bytes(b->models[i]);
      if (bytes > b->arena_bytes) b->arena_bytes = bytes;
    }
    s = make_slot(b, 0, err, cap);  /* the first run's, so that warm runs allocate nothing */
    if (s == TLMRT_OK) slot_release(b, 0);
  }
  if (s != TLMRT_OK) {
    tlmrt_batch_close(b);
    return s;
  }
  int used = snprintf(b->description, sizeof(b->description), "%s, batch plans",
                      tlmrt_model_device_name(b->models[b->count - 1]));
  for (int32_t i = 0; i < b->count && used > 0 && (size_t)used < sizeof(b->description); ++i) {
    used += snprintf(b->description + used, sizeof(b->description) - (size_t)used, "%s%" PRId64, i ? "," : " ",
                     b->sizes[i]);
  }
  *out = b;
  return TLMRT_OK;
}

void tlmrt_batch_close(tlmrt_batch* b) {
  if (b == NULL) return;
  for (int32_t i = 0; i < MAX_PLANS; ++i) tlmrt_model_close(b->models[i]);  /* before the arenas they run in */
  for (int32_t i = 0; i < MAX_SLOTS; ++i) free(b->slot_arena[i]);
  if (b->staging != NULL) {
    for (int32_t k = 0; k < b->num_inputs + b->num_outputs; ++k) free(b->staging[k]);
  }
  free(b->staging);
  free(b->sample_nbytes);
  free(b->first);
  pthread_mutex_destroy(&b->staging_lock);
  pthread_mutex_destroy(&b->slot_lock);
  free(b);
}

tlmrt_model* tlmrt_batch_largest(const tlmrt_batch* b) { return b->models[b->count - 1]; }
int32_t tlmrt_batch_count(const tlmrt_batch* b) { return b->count; }
int64_t tlmrt_batch_size(const tlmrt_batch* b, int32_t index) { return b->sizes[index]; }
tlmrt_model* tlmrt_batch_model(const tlmrt_batch* b, int32_t index) { return b->models[index]; }
const char* tlmrt_batch_describe(tlmrt_batch* b) { return b->description; }

uint64_t tlmrt_batch_sample_nbytes(const tlmrt_batch* b, int output, int32_t index) {
  return b->sample_nbytes[output ? b->num_inputs + index : index];
}

/* One run of plan p over samples [start, start + n) of the caller's buffers (n < the plan's batch:
 * padded through the staging buffers), in the arena of `slot` when the plans share arenas. */
static tlmrt_status run_slice(tlmrt_batch* b, int32_t slot, int32_t p, int64_t start, int64_t n,
                              const tlmrt_io* inputs, const tlmrt_io* outputs, char* err, size_t cap) {
  int64_t size = b->sizes[p];
  int padded = n < size;
  int32_t total = b->num_inputs + b->num_outputs;
  tlmrt_io io[total > 0 ? total : 1];
  for (int32_t k = 0; k < total; ++k) {
    const tlmrt_io* given = k < b->num_inputs ? &inputs[k] : &outputs[k - b->num_inputs];
    uint64_t sample = b->sample_nbytes[k];
    if (padded && given->device_type != TLMRT_DEVICE_CPU) {
      return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT,
                          "batch %" PRId64 " is padded to the batch-%" PRId64 " plan, and a padded run takes host "
                          "buffers only; give host buffers, or a batch the plans cover exactly", start + n, size);
    }
    io[k] = *given;
    io[k].nbytes = sample * (uint64_t)size;
    if (padded) {
      io[k].data = b->staging[k];
    } else {
      io[k].data = (uint8_t*)given->data + sample * (uint64_t)start;
    }
  }
  if (padded) {
    pthread_mutex_lock(&b->staging_lock);
    for (int32_t k = 0; k < b->num_inputs; ++k) {
      uint64_t sample = b->sample_nbytes[k];
      memcpy(b->staging[k], (const uint8_t*)inputs[k].data + sample * (uint64_t)start, (size_t)(sample * (uint64_t)n));
      memset(b->staging[k] + sample * (uint64_t)n, 0, (size_t)(sample * (uint64_t)(size - n)));
    }
  }
  tlmrt_model* m = b->models[p];
  tlmrt_status s;
  if (b->shared) {
    char why[TLMRT_ERROR_CAP];
    why[0] = '\0';
    s = tlmrt_plan_run_in(m, slot, io, io + b->num_inputs, why, sizeof(why));
    if (s != TLMRT_OK) tlmrt_errorf(err, cap, s, "batch-%" PRId64 " plan: %s", size, why);
  } else {
    s = tlmrt_model_run_io(m, io, io + b->num_inputs);
    if (s != TLMRT_OK) tlmrt_errorf(err, cap, s, "batch-%" PRId64 " plan: %s", size, tlmrt_model_last_error(m));
  }
  if (s == TLMRT_OK && padded) {
    for (int32_t k = b->num_inputs; k < total; ++k) {
      uint64_t sample = b->sample_nbytes[k];
      memcpy((uint8_t*)outputs[k - b->num_inputs].data + sample * (uint64_t)start, b->staging[k],
             (size_t)(sample * (uint64_t)n));
    }
  }
  if (padded) pthread_mutex_unlock(&b->staging_lock);
  return s;
}

tlmrt_status tlmrt_batch_run(tlmrt_batch* b, int64_t batch, const tlmrt_io* inputs, const tlmrt_io* outputs,
                             char* err, size_t cap) {
  int64_t max = b->sizes[b->count - 1];
  if (batch < 1 || batch > max) {
    return tlmrt_errorf(err, cap, TLMRT_ERR_INVALID_ARGUMENT,
                        "batch %" PRId64 " is outside the batch plans' range 1..%" PRId64, batch, max);
  }
  int32_t slot = -1;
  tlmrt_status s = b->shared ? slot_acquire(b, &slot, err, cap) : TLMRT_OK;
  int64_t start = 0;
  for (int64_t left = batch; s == TLMRT_OK && left > 0;) {
    int32_t p = b->first[left];
    int64_t n = left < b->sizes[p] ? left : b->sizes[p];
    s = run_slice(b, slot, p, start, n, inputs, outputs, err, cap);
    start += n;
    left -= n;
  }
  if (slot >= 0) slot_release(b, slot);
  return s;
}
