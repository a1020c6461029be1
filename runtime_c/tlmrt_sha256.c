/*
 * tlmrt_sha256.c — artifact integrity: a small SHA-256 (FIPS 180-4; portable C, and the x86 SHA
 * extensions where the CPU has them) and the SHA256SUMS check.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tlmrt_internal.h"

/* ---- SHA-256 ---------------------------------------------------------------------------------- */

static const uint32_t kRound[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u,
    0xab1c5ed5u, 0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu,
    0x9bdc06a7u, 0xc19bf174u, 0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu,
    0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau, 0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u,
    0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u, 0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu,
    0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u, 0xa2bfe8a1u, 0xa81a664bu,
    0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u, 0x19a4c116u,
    0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u,
    0xc67178f2u};

static inline uint32_t rotr32(uint32_t x, unsigned n) { return (x >> n) | (x << (32u - n)); }

static void sha256_blocks(uint32_t state[8], const uint8_t* p, size_t nblocks) {
  for (; nblocks > 0; --nblocks, p += 64) {
    uint32_t w[64];
    for (int i = 0; i < 16; ++i) {
      w[i] = ((uint32_t)p[4 * i] << 24) | ((uint32_t)p[4 * i + 1] << 16) |
             ((uint32_t)p[4 * i + 2] << 8) | (uint32_t)p[4 * i + 3];
    }
    for (int i = 16; i < 64; ++i) {
      uint32_t s0 = rotr32(w[i - 15], 7) ^ rotr32(w[i - 15], 18) ^ (w[i - 15] >> 3);
      uint32_t s1 = rotr32(w[i - 2], 17) ^ rotr32(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
    uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
    for (int i = 0; i < 64; ++i) {
      uint32_t t1 = h + (rotr32(e, 6) ^ rotr32(e, 11) ^ rotr32(e, 25)) + ((e & f) ^ (~e & g)) +
                    kRound[i] + w[i];
      uint32_t t2 = (rotr32(a, 2) ^ rotr32(a, 13) ^ rotr32(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    state[0] += a;
    state[1] += b;
    state[2] += c;
    state[3] += d;
    state[4] += e;
    state[5] += f;
    state[6] += g;
    state[7] += h;
  }
}

/* x86 SHA extensions (SHA-NI): the same compression, four rounds per pair of sha256rnds2. The
 * state is kept as the instructions want it: st0 = (a, b, e, f), st1 = (c, d, g, h), highest lane
 * first. msg[j] holds four schedule words W[4g..4g+3] in turn; sha256msg1/msg2 extend it. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define TLMRT_HAVE_SHANI 1

__attribute__((target("sha,sse4.1,ssse3"))) static void sha256_blocks_shani(uint32_t state[8], const uint8_t* p,
                                                                            size_t nblocks) {
  const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
  __m128i t = _mm_loadu_si128((const __m128i*)(const void*)&state[0]);   /* d c b a */
  __m128i st1 = _mm_loadu_si128((const __m128i*)(const void*)&state[4]); /* h g f e */
  t = _mm_shuffle_epi32(t, 0xB1);                                        /* c d a b */
  st1 = _mm_shuffle_epi32(st1, 0x1B);                                    /* e f g h */
  __m128i st0 = _mm_alignr_epi8(t, st1, 8);                              /* a b e f */
  st1 = _mm_blend_epi16(st1, t, 0xF0);                                   /* c d g h */
  for (; nblocks > 0; --nblocks, p += 64) {
    const __m128i save0 = st0, save1 = st1;
    __m128i msg[4];
    for (int g = 0; g < 4; ++g) {
      msg[g] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i*)(const void*)(p + 16 * g)), bswap);
    }
#pragma GCC unroll 16
    for (int g = 0; g < 16; ++g) {
      __m128i v = _mm_add_epi32(msg[g & 3], _mm_loadu_si128((const __m128i*)(const void*)&kRound[4 * g]));
      st1 = _mm_sha256rnds2_epu32(st1, st0, v);
      if (g >= 3 && g <= 14) { /* W[4(g+1)..]: needs msg1 of four words ago, then msg2 */
        __m128i w = _mm_add_epi32(msg[(g + 1) & 3], _mm_alignr_epi8(msg[g & 3], msg[(g - 1) & 3], 4));
        msg[(g + 1) & 3] = _mm_sha256msg2_epu32(w, msg[g & 3]);
      }
      v = _mm_shuffle_epi32(v, 0x0E);
      st0 = _mm_sha256rnds2_epu32(st0, st1, v);
      if (g >= 1 && g <= 12) msg[(g - 1) & 3] = _mm_sha256msg1_epu32(msg[(g - 1) & 3], msg[g & 3]);
    }
    st0 = _mm_add_epi32(st0, save0);
    st1 = _mm_add_epi32(st1, save1);
  }
  t = _mm_shuffle_epi32(st0, 0x1B);         /* f e b a */
  st1 = _mm_shuffle_epi32(st1, 0xB1);       /* d c h g */
  st0 = _mm_blend_epi16(t, st1, 0xF0);      /* d c b a */
  st1 = _mm_alignr_epi8(st1, t, 8);         /* h g f e */
  _mm_storeu_si128((__m128i*)(void*)&state[0], st0);
  _mm_storeu_si128((__m128i*)(void*)&state[4], st1);
}

/* SHA, SSSE3 and SSE4.1 from cpuid (leaf 7 EBX bit 29; leaf 1 ECX bits 9 and 19). */
static int cpu_has_shani(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  if (!(c & (1u << 9)) || !(c & (1u << 19))) return 0;
  if (__get_cpuid_max(0, NULL) < 7) return 0;
  __cpuid_count(7, 0, a, b, c, d);
  return (b & (1u << 29)) != 0;
}
#endif

/* Which compression runs, decided once per process: SHA-NI where the CPU has it, unless
 * TLMRT_SHA256_PORTABLE=1 asks for the portable code (the tests cover both this way). The choice
 * is a pure function of the CPU and the environment, so a race on the first calls is harmless. */
typedef void (*sha256_blocks_fn)(uint32_t state[8], const uint8_t* p, size_t nblocks);
static sha256_blocks_fn g_blocks; /* NULL until chosen */

static sha256_blocks_fn choose_blocks(void) {
  sha256_blocks_fn f = __atomic_load_n(&g_blocks, __ATOMIC_ACQUIRE);
  if (f != NULL) return f;
  f = sha256_blocks;
#ifdef TLMRT_HAVE_SHANI
  const char* env = getenv("TLMRT_SHA256_PORTABLE");
  int portable = env != NULL && strcmp(env, "1") == 0;
  if (!portable && cpu_has_shani()) f = sha256_blocks_shani;
#endif
  __atomic_store_n(&g_blocks, f, __ATOMIC_RELEASE);
  return f;
}

void tlmrt_sha256_init(tlmrt_sha256_ctx* ctx) {
  static const uint32_t kInit[8] = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
                                    0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u};
  memcpy(ctx->state, kInit, sizeof(kInit));
  ctx->total_bytes = 0;
  ctx->block_len = 0;
}

void tlmrt_sha256_update(tlmrt_sha256_ctx* ctx, const void* data, size_t len) {
  const uint8_t* p = (const uint8_t*)data;
  ctx->total_bytes += len;
  if (ctx->block_len > 0) {
    size_t take = 64u - ctx->block_len;
    if (take > len) take = len;
    memcpy(ctx->block + ctx->block_len, p, take);
    ctx->block_len += (uint32_t)take;
    p += take;
    len -= take;
    if (ctx->block_len < 64u) return;
    choose_blocks()(ctx->state, ctx->block, 1);
    ctx->block_len = 0;
  }
  size_t whole = len / 64u;
  if (whole > 0) {
    choose_blocks()(ctx->state, p, whole);
    p += whole * 64u;
    len -= whole * 64u;
  }
  if (len > 0) {
    memcpy(ctx->block, p, len);
    ctx->block_len = (uint32_t)len;
  }
}

void tlmrt_sha256_final(tlmrt_sha256_ctx* ctx, uint8_t digest[32]) {
  uint64_t bit_len = ctx->total_bytes * 8u;
  uint8_t pad[72] = {0x80};
  size_t pad_len = (ctx->block_len < 56u) ? (56u - ctx->block_len) : (120u - ctx->block_len);
  for (int i = 0; i < 8; ++i) pad[pad_len + (size_t)i] = (uint8_t)(bit_len >> (56 - 8 * i));
  tlmrt_sha256_update(ctx, pad, pad_len + 8u);
  for (int i = 0; i < 8; ++i) {
    digest[4 * i] = (uint8_t)(ctx->state[i] >> 24);
    digest[4 * i + 1] = (uint8_t)(ctx->state[i] >> 16);
    digest[4 * i + 2] = (uint8_t)(ctx->state[i] >> 8);
    digest[4 * i + 3] = (uint8_t)ctx->state[i];
  }
}

void tlmrt_sha256_hex(const uint8_t digest[32], char hex[65]) {
  static const char kHex[] = "0123456789abcdef";
  for (int i = 0; i < 32; ++i) {
    hex[2 * i] = kHex[digest[i] >> 4];
    hex[2 * i + 1] = kHex[digest[i] & 15];
  }
  hex[64] = '\0';
}

tlmrt_status tlmrt_sha256_file(const char* path, char hex[65], char* err, size_t err_cap) {
  int fd = open(path, O_RDONLY | O_NONBLOCK);  /* O_NONBLOCK: a FIFO must not hang us */
  if (fd < 0) return tlmrt_errorf(err, err_cap, TLMRT_ERR_IO, "cannot open %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_IO, "%s: expected a regular file", path);
  }
  enum { kChunk = 1 << 16 };
  uint8_t* buf = (uint8_t*)malloc(kChunk);
  if (buf == NULL) {
    close(fd);
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory hashing %s", path);
  }
  tlmrt_sha256_ctx ctx;
  tlmrt_sha256_init(&ctx);
  tlmrt_status status = TLMRT_OK;
  for (;;) {
    ssize_t got = read(fd, buf, kChunk);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      status = tlmrt_errorf(err, err_cap, TLMRT_ERR_IO, "cannot read %s: %s", path, strerror(errno));
      break;
    }
    if (got == 0) break;
    tlmrt_sha256_update(&ctx, buf, (size_t)got);
  }
  free(buf);
  close(fd);
  if (status != TLMRT_OK) return status;
  uint8_t digest[32];
  tlmrt_sha256_final(&ctx, digest);
  tlmrt_sha256_hex(digest, hex);
  return TLMRT_OK;
}

/* ---- SHA256SUMS ------------------------------------------------------------------------------- */

#define SUMS_NAME "SHA256SUMS"
#define SUMS_MAX_BYTES (16u << 20)
#define SUMS_MAX_PATH 1024u

typedef struct {
  const char* hex;   /* 64 chars inside the file buffer (not NUL-terminated) */
  const char* path;  /* NUL-terminated inside the file buffer */
} sums_entry;

static int is_lower_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

/* A relative path with no empty, "." or ".." component and nothing that could escape dir. */
const char* tlmrt_bad_path_reason(const char* path) {
  if (path[0] == '\0') return "the path is empty";
  if (path[0] == '/') return "the path is absolute";
  if (strlen(path) >= SUMS_MAX_PATH) return "the path is too long";
  const char* p = path;
  while (*p != '\0') {
    const char* end = strchr(p, '/');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (n == 0) return "the path has an empty component";
    if (n == 2 && p[0] == '.' && p[1] == '.') return "the path has a '..' component";
    if (n == 1 && p[0] == '.') return "the path has a '.' component";
    if (end == NULL) break;
    p = end + 1;
    if (*p == '\0') return "the path ends with '/'";
  }
  for (p = path; *p != '\0'; ++p) {
    if ((unsigned char)*p < 0x20 || *p == 0x7f) return "the path has a control character";
  }
  return NULL;
}

static tlmrt_status read_small_file(const char* path, char** out, size_t* out_len, char* err,
                                    size_t err_cap) {
  *out = NULL;
  *out_len = 0;
  int fd = open(path, O_RDONLY | O_NONBLOCK);
  if (fd < 0) {
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                        "%s: cannot open (%s); expected a SHA256SUMS file in every artifact", path,
                        strerror(errno));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT, "%s: expected a regular file", path);
  }
  if (st.st_size < 0 || (uint64_t)st.st_size > SUMS_MAX_BYTES) {
    close(fd);
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT, "%s: expected at most %u bytes, found %lld",
                        path, SUMS_MAX_BYTES, (long long)st.st_size);
  }
  size_t size = (size_t)st.st_size;
  char* buf = (char*)malloc(size + 1u);
  if (buf == NULL) {
    close(fd);
    return tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory reading %s", path);
  }
  size_t have = 0;
  while (have < size) {
    ssize_t got = read(fd, buf + have, size - have);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      int e = errno;
      free(buf);
      close(fd);
      return tlmrt_errorf(err, err_cap, TLMRT_ERR_IO, "cannot read %s: %s", path,
                          got < 0 ? strerror(e) : "the file shrank while reading");
    }
    have += (size_t)got;
  }
  close(fd);
  buf[size] = '\0';
  *out = buf;
  *out_len = size;
  return TLMRT_OK;
}

/* Splits the buffer in place into entries; checks the syntax of every line. */
static tlmrt_status parse_sums(char* buf, size_t len, sums_entry** out, int* out_n, char* err,
                               size_t err_cap) {
  *out = NULL;
  *out_n = 0;
  size_t lines = 0;
  for (size_t i = 0; i < len; ++i) lines += (buf[i] == '\n');
  lines += 1;
  sums_entry* entries = (sums_entry*)calloc(lines, sizeof(sums_entry));
  if (entries == NULL) return tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  int n = 0;
  size_t pos = 0;
  int line_no = 0;
  while (pos < len) {
    ++line_no;
    char* line = buf + pos;
    char* nl = memchr(line, '\n', len - pos);
    size_t line_len = nl ? (size_t)(nl - line) : len - pos;
    pos += line_len + (nl ? 1u : 0u);
    if (memchr(line, '\0', line_len) != NULL) {
      free(entries);
      return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                          SUMS_NAME " line %d: expected text, found a NUL byte", line_no);
    }
    int ok = line_len > 66u && line[64] == ' ' && (line[65] == ' ' || line[65] == '*');
    for (int i = 0; ok && i < 64; ++i) ok = is_lower_hex(line[i]);
    if (!ok) {
      free(entries);
      return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                          SUMS_NAME " line %d: expected \"<64 lowercase hex digits>  <relative path>\", "
                          "found \"%.*s\"",
                          line_no, (int)(line_len < 100u ? line_len : 100u), line);
    }
    line[line_len] = '\0';  /* the '\n' (or the buffer's terminating NUL) */
    const char* path = line + 66;
    const char* why = tlmrt_bad_path_reason(path);
    if (why != NULL) {
      free(entries);
      return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                          SUMS_NAME " line %d: refusing \"%.200s\": %s; expected a relative path "
                          "inside the artifact",
                          line_no, path, why);
    }
    for (int k = 0; k < n; ++k) {
      if (strcmp(entries[k].path, path) == 0) {
        free(entries);
        return tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                            SUMS_NAME " line %d: \"%.200s\" is listed twice", line_no, path);
      }
    }
    entries[n].hex = line;
    entries[n].path = path;
    ++n;
  }
  *out = entries;
  *out_n = n;
  return TLMRT_OK;
}

tlmrt_status tlmrt_verify_sha256sums(const char* dir, const char* const* must_list, int n_must,
                                     const char* const* known_names, const char* const* known_hex,
                                     int n_known, char* err, size_t err_cap) {
  size_t dir_len = strlen(dir);
  size_t path_cap = dir_len + SUMS_MAX_PATH + 2u;
  char* path = (char*)malloc(path_cap);
  if (path == NULL) return tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  snprintf(path, path_cap, "%s/" SUMS_NAME, dir);

  char* text = NULL;
  size_t text_len = 0;
  sums_entry* entries = NULL;
  int n = 0;
  tlmrt_status status = read_small_file(path, &text, &text_len, err, err_cap);
  if (status == TLMRT_OK) status = parse_sums(text, text_len, &entries, &n, err, err_cap);

  for (int m = 0; status == TLMRT_OK && m < n_must; ++m) {
    int found = 0;
    for (int k = 0; k < n && !found; ++k) found = strcmp(entries[k].path, must_list[m]) == 0;
    if (!found) {
      status = tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                            SUMS_NAME " lists %d files but not %s; expected every file of the "
                            "artifact to be listed",
                            n, must_list[m]);
    }
  }

  for (int k = 0; status == TLMRT_OK && k < n; ++k) {
    char found_hex[65];
    const char* found = NULL;
    for (int j = 0; j < n_known && found == NULL; ++j) {
      if (strcmp(known_names[j], entries[k].path) == 0) found = known_hex[j];
    }
    if (found == NULL) {
      snprintf(path, path_cap, "%s/%s", dir, entries[k].path);
      char io_err[TLMRT_ERROR_CAP];
      if (tlmrt_sha256_file(path, found_hex, io_err, sizeof(io_err)) != TLMRT_OK) {
        status = tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                              "%s: listed in " SUMS_NAME " but cannot be hashed (%s); the artifact "
                              "is incomplete",
                              entries[k].path, io_err);
        break;
      }
      found = found_hex;
    }
    if (memcmp(found, entries[k].hex, 64) != 0) {
      status = tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                            "%s: sha256 mismatch (expected %.64s, found %.64s); the artifact is "
                            "corrupted",
                            entries[k].path, entries[k].hex, found);
    }
  }
  free(entries);
  free(text);
  free(path);
  return status;
}

tlmrt_status tlmrt_sha256sums_expect(const char* dir, const char* name, const char* hex, char* err,
                                     size_t err_cap) {
  char* path = tlmrt_join_path(dir, SUMS_NAME);
  if (path == NULL) return tlmrt_errorf(err, err_cap, TLMRT_ERR_OUT_OF_MEMORY, "out of memory");
  char* text = NULL;
  size_t text_len = 0;
  sums_entry* entries = NULL;
  int n = 0;
  tlmrt_status status = read_small_file(path, &text, &text_len, err, err_cap);
  if (status == TLMRT_OK) status = parse_sums(text, text_len, &entries, &n, err, err_cap);
  if (status == TLMRT_OK) {
    int k = 0;
    while (k < n && strcmp(entries[k].path, name) != 0) ++k;
    if (k == n) {
      status = tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                            SUMS_NAME " lists %d files but not %.200s; expected every file of the "
                            "artifact to be listed",
                            n, name);
    } else if (memcmp(entries[k].hex, hex, 64) != 0) {
      status = tlmrt_errorf(err, err_cap, TLMRT_ERR_ARTIFACT,
                            "%.200s: sha256 mismatch (expected %.64s, found %.64s); the artifact is "
                            "corrupted",
                            name, entries[k].hex, hex);
    }
  }
  free(entries);
  free(text);
  free(path);
  return status;
}
