/*
 * run_model.c — run a tlmpack artifact from C, no Python: load, describe, run, print, save.
 *
 *   run_model [-o DIR] [-t THREADS] [-n REPEAT] [--no-verify] ARTIFACT_DIR [input0.bin ...]
 *
 * Each input file holds exactly that input's bytes: little-endian, C order, no header (numpy's
 * arr.tofile()). With no input files, every input is filled with the pattern below. Outputs are
 * printed (name, dtype, shape, first 8 values, sum, mean) and, with -o DIR, written to
 * DIR/out_<i>.bin in the same raw format.
 *
 * The fill pattern, for input i (reproduce it in Python with the snippet in examples/README.md):
 *   s = 0x12345678 + i * 0x9E3779B9                (uint32 arithmetic, wrapping)
 *   per element: s = s * 1664525 + 1013904223;  r = s >> 8   (24 random bits)
 *   float types: r / 2^24 * 2 - 1  (in [-1, 1), rounded to the element type)
 *   int / uint:  r % 16;   bool: r & 1
 *
 * Build: see examples/README.md.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tlmrt.h"

enum { DL_INT = 0, DL_UINT = 1, DL_FLOAT = 2, DL_BFLOAT = 4, DL_BOOL = 6 };

static const char* dtype_name(const tlmrt_tensor_info* t, char* buf, size_t cap) {
  switch (t->dtype_code) {
    case DL_INT: snprintf(buf, cap, "int%u", t->dtype_bits); break;
    case DL_UINT: snprintf(buf, cap, "uint%u", t->dtype_bits); break;
    case DL_FLOAT: snprintf(buf, cap, "float%u", t->dtype_bits); break;
    case DL_BFLOAT: snprintf(buf, cap, "bfloat%u", t->dtype_bits); break;
    case DL_BOOL: snprintf(buf, cap, "bool"); break;
    default: snprintf(buf, cap, "code%u_bits%u", t->dtype_code, t->dtype_bits); break;
  }
  return buf;
}

static void print_tensor_info(const char* kind, int i, const tlmrt_tensor_info* t) {
  char dt[32];
  printf("%s %d: %s %s [", kind, i, t->name, dtype_name(t, dt, sizeof(dt)));
  for (int d = 0; d < t->ndim; ++d) printf("%s%lld", d ? ", " : "", (long long)t->shape[d]);
  printf("] %llu bytes\n", (unsigned long long)t->nbytes);
}

static uint64_t elem_count(const tlmrt_tensor_info* t) {
  uint64_t n = 1;
  for (int d = 0; d < t->ndim; ++d) n *= (uint64_t)t->shape[d];
  return n;
}

/* ---- float16 / bfloat16 ------------------------------------------------------------------------- */

static float f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31u, man = h & 1023u;
  if (exp == 31) return f32_from_bits(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    float v = (float)man / 16777216.0f; /* man * 2^-24 */
    return sign ? -v : v;
  }
  return f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
}

/* Round to nearest even; enough for values in [-1, 1) and ordinary magnitudes. */
static uint16_t float_to_half(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  int32_t exp = (int32_t)((u >> 23) & 255u) - 127 + 15;
  uint32_t man = u & 0x7fffffu;
  if (((u >> 23) & 255u) == 255u) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0u));
  if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return (uint16_t)sign;
    man |= 0x800000u;
    uint32_t shift = (uint32_t)(14 - exp);
    uint32_t half_man = man >> shift;
    uint32_t rest = man & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
    if (rest > halfway || (rest == halfway && (half_man & 1u))) ++half_man;
    return (uint16_t)(sign | half_man);
  }
  uint32_t h = sign | ((uint32_t)exp << 10) | (man >> 13);
  uint32_t rest = man & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return (uint16_t)h;
}

static uint16_t float_to_bfloat(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* ---- element access ----------------------------------------------------------------------------- */

static double get_elem(const tlmrt_tensor_info* t, const uint8_t* p, uint64_t i) {
  unsigned bytes = t->dtype_bits / 8u;
  const uint8_t* e = p + i * bytes;
  if (t->dtype_code == DL_FLOAT && bytes == 4) { float v; memcpy(&v, e, 4); return v; }
  if (t->dtype_code == DL_FLOAT && bytes == 8) { double v; memcpy(&v, e, 8); return v; }
  if (t->dtype_code == DL_FLOAT && bytes == 2) { uint16_t v; memcpy(&v, e, 2); return half_to_float(v); }
  if (t->dtype_code == DL_BFLOAT && bytes == 2) {
    uint16_t v;
    memcpy(&v, e, 2);
    return f32_from_bits((uint32_t)v << 16);
  }
  if (t->dtype_code == DL_INT || t->dtype_code == DL_BOOL) {
    switch (bytes) {
      case 1: { int8_t v; memcpy(&v, e, 1); return v; }
      case 2: { int16_t v; memcpy(&v, e, 2); return v; }
      case 4: { int32_t v; memcpy(&v, e, 4); return v; }
      case 8: { int64_t v; memcpy(&v, e, 8); return (double)v; }
      default: break;
    }
  }
  if (t->dtype_code == DL_UINT) {
    switch (bytes) {
      case 1: return e[0];
      case 2: { uint16_t v; memcpy(&v, e, 2); return v; }
      case 4: { uint32_t v; memcpy(&v, e, 4); return v; }
      case 8: { uint64_t v; memcpy(&v, e, 8); return (double)v; }
      default: break;
    }
  }
  return 0.0;
}

static int supported(const tlmrt_tensor_info* t) {
  unsigned b = t->dtype_bits;
  switch (t->dtype_code) {
    case DL_FLOAT: return b == 16 || b == 32 || b == 64;
    case DL_BFLOAT: return b == 16;
    case DL_INT:
    case DL_UINT: return b == 8 || b == 16 || b == 32 || b == 64;
    case DL_BOOL: return b == 8;
    default: return 0;
  }
}

static void fill_pattern(const tlmrt_tensor_info* t, int input_index, uint8_t* p) {
  uint32_t s = 0x12345678u + (uint32_t)input_index * 0x9E3779B9u;
  uint64_t n = elem_count(t);
  unsigned bytes = t->dtype_bits / 8u;
  for (uint64_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    uint32_t r = s >> 8;
    uint8_t* e = p + i * bytes;
    if (t->dtype_code == DL_FLOAT || t->dtype_code == DL_BFLOAT) {
      float f = (float)r / 16777216.0f * 2.0f - 1.0f;
      if (t->dtype_code == DL_BFLOAT) {
        uint16_t h = float_to_bfloat(f);
        memcpy(e, &h, 2);
      } else if (bytes == 2) {
        uint16_t h = float_to_half(f);
        memcpy(e, &h, 2);
      } else if (bytes == 4) {
        memcpy(e, &f, 4);
      } else {
        double d = f;
        memcpy(e, &d, 8);
      }
    } else {
      uint64_t v = t->dtype_code == DL_BOOL ? (r & 1u) : (r % 16u);
      memcpy(e, &v, bytes); /* little-endian: the low bytes */
    }
  }
}

/* ---- main --------------------------------------------------------------------------------------- */

static int read_file(const char* path, void* buf, uint64_t nbytes, const char* name) {
  FILE* f = fopen(path, "rb");
  if (f == NULL) {
    fprintf(stderr, "error: %s: %s\n", path, strerror(errno));
    return 1;
  }
  int rc = 0;
  if (fseek(f, 0, SEEK_END) != 0) rc = 1;
  long size = rc ? -1 : ftell(f);
  if (rc == 0 && (size < 0 || (uint64_t)size != nbytes)) {
    fprintf(stderr, "error: %s: input %s expects %llu bytes, the file has %ld\n", path, name,
            (unsigned long long)nbytes, size);
    rc = 1;
  }
  if (rc == 0 && (fseek(f, 0, SEEK_SET) != 0 || (nbytes > 0 && fread(buf, 1, (size_t)nbytes, f) != nbytes))) {
    fprintf(stderr, "error: cannot read %s\n", path);
    rc = 1;
  }
  fclose(f);
  return rc;
}

static int write_file(const char* dir, int index, const void* buf, uint64_t nbytes) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/out_%d.bin", dir, index);
  FILE* f = fopen(path, "wb");
  if (f == NULL) {
    fprintf(stderr, "error: %s: %s\n", path, strerror(errno));
    return 1;
  }
  int rc = (nbytes > 0 && fwrite(buf, 1, (size_t)nbytes, f) != nbytes) ? 1 : 0;
  if (fclose(f) != 0) rc = 1;
  if (rc) fprintf(stderr, "error: cannot write %s\n", path);
  return rc;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static void usage(const char* argv0) {
  fprintf(stderr,
          "usage: %s [-o DIR] [-t THREADS] [-n REPEAT] [--no-verify] ARTIFACT_DIR [input0.bin ...]\n",
          argv0);
}

int main(int argc, char** argv) {
  const char* out_dir = NULL;
  int threads = 0, repeat = 1, verify = 1, argi = 1;
  for (; argi < argc && argv[argi][0] == '-'; ++argi) {
    const char* a = argv[argi];
    if (strcmp(a, "--no-verify") == 0) {
      verify = 0;
    } else if ((strcmp(a, "-o") == 0 || strcmp(a, "-t") == 0 || strcmp(a, "-n") == 0) && argi + 1 < argc) {
      const char* v = argv[++argi];
      if (a[1] == 'o') out_dir = v;
      if (a[1] == 't') threads = atoi(v);
      if (a[1] == 'n') repeat = atoi(v);
    } else {
      usage(argv[0]);
      return 2;
    }
  }
  if (argi >= argc || repeat < 1 || threads < 0) {
    usage(argv[0]);
    return 2;
  }
  const char* dir = argv[argi++];
  int num_files = argc - argi;

  tlmrt_options opts;
  tlmrt_options_init(&opts);
  opts.num_threads = threads;
  opts.verify_files = verify;
  tlmrt_model* m = NULL;
  if (tlmrt_model_open(dir, &opts, &m) != TLMRT_OK) {
    fprintf(stderr, "error: %s\n", tlmrt_open_error());
    return 1;
  }
  int rc = 1;
  int ni = tlmrt_model_num_inputs(m), no = tlmrt_model_num_outputs(m);
  tlmrt_tensor_info* in_info = calloc((size_t)ni + 1u, sizeof(tlmrt_tensor_info));
  tlmrt_tensor_info* out_info = calloc((size_t)no + 1u, sizeof(tlmrt_tensor_info));
  void** in_buf = calloc((size_t)ni + 1u, sizeof(void*));
  void** out_buf = calloc((size_t)no + 1u, sizeof(void*));
  uint64_t* in_n = calloc((size_t)ni + 1u, sizeof(uint64_t));
  uint64_t* out_n = calloc((size_t)no + 1u, sizeof(uint64_t));
  double* times = calloc((size_t)repeat, sizeof(double));
  if (!in_info || !out_info || !in_buf || !out_buf || !in_n || !out_n || !times) {
    fprintf(stderr, "error: out of memory\n");
    goto done;
  }
  printf("artifact %s (tlmrt %s)\n", dir, tlmrt_version());
  for (int i = 0; i < ni; ++i) {
    if (tlmrt_model_input_info(m, i, &in_info[i]) != TLMRT_OK) goto model_error;
    print_tensor_info("input", i, &in_info[i]);
  }
  for (int i = 0; i < no; ++i) {
    if (tlmrt_model_output_info(m, i, &out_info[i]) != TLMRT_OK) goto model_error;
    print_tensor_info("output", i, &out_info[i]);
  }
  if (num_files != 0 && num_files != ni) {
    fprintf(stderr, "error: the model has %d inputs, %d input files given\n", ni, num_files);
    goto done;
  }
  for (int i = 0; i < ni; ++i) {
    in_n[i] = in_info[i].nbytes;
    in_buf[i] = malloc(in_n[i] > 0 ? (size_t)in_n[i] : 1u);
    if (in_buf[i] == NULL) {
      fprintf(stderr, "error: out of memory\n");
      goto done;
    }
    if (num_files > 0) {
      if (read_file(argv[argi + i], in_buf[i], in_n[i], in_info[i].name)) goto done;
    } else if (supported(&in_info[i])) {
      fill_pattern(&in_info[i], i, in_buf[i]);
    } else {
      fprintf(stderr, "error: input %s: no fill pattern for this dtype; give input files\n", in_info[i].name);
      goto done;
    }
  }
  for (int i = 0; i < no; ++i) {
    out_n[i] = out_info[i].nbytes;
    out_buf[i] = malloc(out_n[i] > 0 ? (size_t)out_n[i] : 1u);
    if (out_buf[i] == NULL) {
      fprintf(stderr, "error: out of memory\n");
      goto done;
    }
  }
  for (int r = 0; r < repeat; ++r) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (tlmrt_model_run(m, (const void* const*)in_buf, in_n, out_buf, out_n) != TLMRT_OK) goto model_error;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    times[r] = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
  }
  qsort(times, (size_t)repeat, sizeof(double), cmp_double);
  printf("run: %d time%s, median %.3f ms, min %.3f ms\n", repeat, repeat == 1 ? "" : "s",
         times[repeat / 2], times[0]);
  for (int i = 0; i < no; ++i) {
    const tlmrt_tensor_info* t = &out_info[i];
    char dt[32];
    printf("output %d %s %s [", i, t->name, dtype_name(t, dt, sizeof(dt)));
    for (int d = 0; d < t->ndim; ++d) printf("%s%lld", d ? ", " : "", (long long)t->shape[d]);
    printf("]");
    if (!supported(t)) {
      printf(" (values not shown for this dtype)\n");
    } else {
      uint64_t n = elem_count(t);
      double sum = 0.0;
      for (uint64_t k = 0; k < n; ++k) sum += get_elem(t, out_buf[i], k);
      printf(" first:");
      for (uint64_t k = 0; k < n && k < 8; ++k) printf(" %.6g", get_elem(t, out_buf[i], k));
      printf(" sum %.9g mean %.9g\n", sum, n > 0 ? sum / (double)n : 0.0);
    }
    if (out_dir != NULL && write_file(out_dir, i, out_buf[i], out_n[i])) goto done;
  }
  rc = 0;
  goto done;

model_error:
  fprintf(stderr, "error: %s\n", tlmrt_model_last_error(m));
done:
  for (int i = 0; in_buf && i < ni; ++i) free(in_buf[i]);
  for (int i = 0; out_buf && i < no; ++i) free(out_buf[i]);
  free(in_info);
  free(out_info);
  free(in_buf);
  free(out_buf);
  free(in_n);
  free(out_n);
  free(times);
  tlmrt_model_close(m);
  return rc;
}
