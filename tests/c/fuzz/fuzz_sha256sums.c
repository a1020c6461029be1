/*
 * fuzz_sha256sums.c — libFuzzer target for the SHA256SUMS parser (runtime_c/tlmrt_sha256.c), the one
 * text format the C runtime reads from an artifact. The input is the file's bytes.
 *
 *   clang -std=c11 -g -O1 -fsanitize=fuzzer,address,undefined -Iruntime_c tests/c/fuzz/fuzz_sha256sums.c \
 *     runtime_c/tlmrt_core.c runtime_c/tlmrt_cpu.c runtime_c/tlmrt_cuda.c runtime_c/tlmrt_kernels.c -ldl -lpthread
 *
 * Properties checked beyond "no crash, no sanitizer report": every entry it accepts has 64 lowercase
 * hex digits and a path that tlmrt_bad_path_reason accepts (relative, no "..", no control
 * characters), lies inside the buffer, and no path is listed twice.
 */
#include "../../../runtime_c/tlmrt_sha256.c"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

/* An independent statement of what an accepted path must be: relative, components neither empty nor
 * "." nor "..", no control characters. */
static int path_is_safe(const char* path) {
  if (path[0] == '\0' || path[0] == '/') return 0;
  const char* c = path;
  for (;;) {
    size_t n = strcspn(c, "/");
    if (n == 0 || (n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.')) return 0;
    if (c[n] == '\0') break;
    c += n + 1;
  }
  for (c = path; *c != '\0'; ++c) {
    if ((unsigned char)*c < 0x20 || *c == 0x7f) return 0;
  }
  return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > SUMS_MAX_BYTES) return 0;
  char* buf = (char*)malloc(size + 1u);
  if (buf == NULL) return 0;
  memcpy(buf, data, size);
  buf[size] = '\0';  /* as read_small_file leaves it */
  sums_entry* entries = NULL;
  int n = 0;
  char err[TLMRT_ERROR_CAP];
  tlmrt_status s = parse_sums(buf, size, &entries, &n, err, sizeof(err));
  if (s == TLMRT_OK) {
    for (int i = 0; i < n; ++i) {
      if (entries[i].hex < buf || entries[i].path > buf + size) abort();
      for (int k = 0; k < 64; ++k) {
        if (!is_lower_hex(entries[i].hex[k])) abort();
      }
      if (tlmrt_bad_path_reason(entries[i].path) != NULL || !path_is_safe(entries[i].path)) abort();
      for (int j = 0; j < i; ++j) {
        if (strcmp(entries[i].path, entries[j].path) == 0) abort();
      }
    }
  } else if (s != TLMRT_ERR_ARTIFACT || err[0] == '\0' || strchr(err, '\n') != NULL) {
    abort();  /* a refusal is an artifact error with one line that says why */
  }
  free(entries);
  free(buf);
  /* the path check on its own, over the raw bytes as one NUL-terminated string */
  char* path = (char*)malloc(size + 1u);
  if (path == NULL) return 0;
  memcpy(path, data, size);
  path[size] = '\0';
  const char* why = tlmrt_bad_path_reason(path);
  if (why == NULL && !path_is_safe(path)) abort();
  free(path);
  return 0;
}
