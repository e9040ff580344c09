/*
 * common/common.h — what every cairn module shares: status codes, element
 * types and their reference (de)quantizers, half-precision conversion,
 * random numbers, logging and a growing string. One file each in common/:
 * status.c, types.c, quant.c, rng.c, log.c, strbuf.c. Nothing here depends on
 * any other cairn module.
 *
 * Status codes
 * ------------
 * Every fallible function in cairn returns an `int`: CAIRN_OK (0) on success,
 * a negative CAIRN_E* code otherwise. Results come back through
 * out-parameters, which are left untouched on failure unless the function says
 * otherwise. cairn_strerror() turns a code into a short English phrase; the
 * functions that can say more (a GGUF file that is corrupt, say) also fill a
 * caller-supplied message buffer.
 *
 * Element types
 * -------------
 * cairn_type values are GGUF's own tensor type ids, so a type read from a
 * file needs no translation. Quantized types are stored in GGUF's block
 * layout: a row of n elements is n / block_elems blocks of block_bytes each.
 *
 *   type   block_elems block_bytes  layout of one block
 *   F32        1           4        float
 *   F16        1           2        IEEE half
 *   BF16       1           2        upper half of an IEEE float
 *   Q8_0      32          34        half scale d, 32 x int8 q      x = d*q
 *   Q4_0      32          18        half scale d, 16 bytes of nibbles:
 *                                   byte j holds element j (low nibble) and
 *                                   element j+16 (high nibble)  x = d*(q-8)
 *   Q5_0      32          22        half d, 4 bytes qh (little-endian u32),
 *                                   16 bytes of nibbles as Q4_0; bit j of
 *                                   qh is bit 4 of element j   x = d*(q-16)
 *
 * K-quants: super-blocks of 256 elements in sub-blocks.
 *   Q4_K     256         144        half d, half dmin, 12 bytes of 6-bit
 *                                   scales sc[8] and mins m[8], 128 bytes of
 *                                   nibbles; sub-block j (32 elements) is
 *                                   x = (d*sc[j])*q - (dmin*m[j]). Nibble
 *                                   byte 32p+l: element l of sub-block 2p
 *                                   (low nibble) and of 2p+1 (high nibble).
 *                                   Scale packing: j<4: sc = b[j]&63,
 *                                   m = b[j+4]&63; j>=4: sc = (b[j+4]&15) |
 *                                   (b[j-4]>>6)<<4, m = (b[j+4]>>4) |
 *                                   (b[j]>>6)<<4.
 *   Q5_K     256         176        as Q4_K, with 32 bytes qh between the
 *                                   scales and the nibbles: bit j of qh[l] is
 *                                   bit 4 of element l of sub-block j.
 *   Q6_K     256         210        128 bytes ql (low nibbles), 64 bytes qh
 *                                   (2-bit high parts), 16 int8 scales, half
 *                                   d (last). Sub-block i = elements
 *                                   16i..16i+15: x = (d*sc[i])*(q-32). In
 *                                   half h (128 elements), element 32k+l
 *                                   (k<4) has the low (k<2) or high (k>=2)
 *                                   nibble of ql[64h+l+32(k&1)] and bits
 *                                   2k..2k+1 of qh[32h+l] as bits 4-5.
 * (common/quant.c defines these exactly.)
 *
 * Thread safety: everything here is pure or uses only atomics, except
 * cairn_log_set_level(), which is meant to be called once at start-up.
 */
#ifndef CAIRN_COMMON_H
#define CAIRN_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version reported by `cairn --version` and the server's server.info. */
#define CAIRN_VERSION "0.1.0"

/* ---- status codes ------------------------------------------------------ */

enum {
    CAIRN_OK = 0,
    CAIRN_EINVAL = -1,     /* an argument is out of its documented range     */
    CAIRN_ENOMEM = -2,     /* an allocation failed (host or device)          */
    CAIRN_EIO = -3,        /* a read, write, open or mmap failed             */
    CAIRN_EFORMAT = -4,    /* a file or message is malformed or corrupt      */
    CAIRN_EUNSUPPORTED = -5, /* valid, but cairn does not implement it       */
    CAIRN_ENOTFOUND = -6,  /* a key, tensor, token or record does not exist  */
    CAIRN_ERANGE = -7,     /* an output buffer is too small, or a count or
                              position exceeds a configured limit           */
    CAIRN_EFULL = -8,      /* a pool or store has no free capacity left      */
    CAIRN_EBUSY = -9,      /* the object is in use (locked, still loading)   */
    CAIRN_ECORRUPT = -10,  /* stored data failed its checksum or identity    */
    CAIRN_EBACKEND = -11,  /* the compute backend reported an error          */
    CAIRN_ECLOSED = -12,   /* the peer or object has been shut down          */
    CAIRN_EPERM = -13,     /* not authenticated, or not permitted            */
    CAIRN_EQUOTA = -14,    /* a caller's own bound is used up (a tenant's
                              pinned tokens): others may still be served  */
};

/* A static, never-NULL description of a status code. */
const char *cairn_strerror(int status);

/* A NUL-terminated byte string that grows by doubling. A failed growth sets
 * `oom` and turns every later append into a no-op, so a builder checks once
 * at the end. Zero-initialise; the caller owns `data` (free() it, or
 * cairn_strbuf_free). */
typedef struct {
    char *data;
    size_t len, cap;
    bool oom;
} cairn_strbuf;

/* Append n bytes of s (kept NUL-terminated); a no-op once `oom` is set. */
void cairn_strbuf_add(cairn_strbuf *b, const void *s, size_t n);
/* Free `data` and zero the buffer for reuse. */
void cairn_strbuf_free(cairn_strbuf *b);

/* The one way a function with an error buffer reports: writes the printf-style
 * message to err[err_len] (when err is non-NULL and err_len > 0) and returns
 * rc, so a failure path reads `return cairn_errorf(err, n, CAIRN_EFORMAT, ...)`.
 * Any thread. */
int cairn_errorf(char *err, size_t err_len, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- element types (values are GGUF's ggml_type ids) ------------------- */

typedef enum {
    CAIRN_TYPE_F32 = 0,
    CAIRN_TYPE_F16 = 1,
    CAIRN_TYPE_Q4_0 = 2,
    CAIRN_TYPE_Q4_1 = 3,
    CAIRN_TYPE_Q5_0 = 6,
    CAIRN_TYPE_Q5_1 = 7,
    CAIRN_TYPE_Q8_0 = 8,
    CAIRN_TYPE_Q8_1 = 9,
    CAIRN_TYPE_Q2_K = 10,
    CAIRN_TYPE_Q3_K = 11,
    CAIRN_TYPE_Q4_K = 12,
    CAIRN_TYPE_Q5_K = 13,
    CAIRN_TYPE_Q6_K = 14,
    CAIRN_TYPE_Q8_K = 15,
    CAIRN_TYPE_I8 = 24,
    CAIRN_TYPE_I16 = 25,
    CAIRN_TYPE_I32 = 26,
    CAIRN_TYPE_I64 = 27,
    CAIRN_TYPE_F64 = 28,
    CAIRN_TYPE_BF16 = 30,
    /* OCP microscaling FP4 (gpt-oss's experts). Blocks of 32: { u8 e;
     * u8 qs[16] }, w[j] = E2M1[q_j] * 2^(e - 127) with q_j the low nibble of
     * qs[j] for j < 16 and the high nibble of qs[j - 16] after (Q4_0's
     * order), E2M1 = {0, .5, 1, 1.5, 2, 3, 4, 6} and their negatives. The
     * CPU and CUDA backends multiply it as it is; for a backend without
     * MXFP4 kernels the model loader rewrites it as Q5_0
     * (cairn_mxfp4_to_q5_0: exact unless a scale is outside fp16's range). */
    CAIRN_TYPE_MXFP4 = 39,
    /* cairn's own layouts for the weights of checkpoint folders (ckpt/),
     * repacked at load and never read from a GGUF file (traits.own):
     *
     *   Q4_Z      AWQ and GPTQ int4. Blocks of 32: { f16 d; u8 z; u8 pad;
     *             u8 qs[16] }, w[j] = d * (q[j] - z) with q[j] the low nibble
     *             of qs[j] for j < 16 and the high nibble of qs[j - 16]
     *             after (Q4_0's order). Every block of a checkpoint's group
     *             carries that group's scale and zero, exactly.
     *   F8_E4M3   FP8 e4m3fn (bias 7, no infinities, 0x7f/0xff NaN). Blocks
     *             of 32: { f32 d; u8 q[32] }, w[j] = d * e4m3(q[j]); the
     *             checkpoint's per-tensor, per-channel or per-block scale
     *             copied into each block it covers. */
    CAIRN_TYPE_Q4_Z = 64,
    CAIRN_TYPE_F8_E4M3 = 65,
    CAIRN_TYPE_COUNT_ = 66 /* upper bound on ids, not a type */
} cairn_type;

typedef struct {
    const char *name;    /* "F32", "Q4_0", ...                               */
    int block_elems;     /* elements per block (1 for plain types)           */
    int block_bytes;     /* bytes per block                                  */
    bool compute;        /* true when cairn's kernels can multiply with it   */
    bool own;            /* cairn's own layout: refused in a GGUF file       */
} cairn_type_traits;

/* Traits of `type`, or NULL when the id is unknown to cairn (so a GGUF file
 * naming it is refused with a message, not misread). */
const cairn_type_traits *cairn_type_get(int type);

/* Bytes of a row of `n` elements of `type`; 0 when `n` is not a multiple of
 * the block size or the type is unknown. */
size_t cairn_type_row_bytes(int type, int64_t n);

/* Dequantize one row of `n` elements (n a multiple of the block size) into
 * floats. Supports every type whose traits say `compute`. Returns CAIRN_OK or
 * CAIRN_EUNSUPPORTED. Host memory only; this is the reference definition of
 * each format that the kernels and their tests agree with. */
int cairn_dequantize_row(int type, const void *src, float *dst, int64_t n);

/* Quantize one row of floats into `type` (F32, F16, BF16, Q8_0, Q4_0, Q5_0,
 * Q4_K, Q5_K, Q6_K, Q4_Z, F8_E4M3, MXFP4 (a power-of-two scale per block
 * and the nearest E2M1 code)), with round-to-nearest scales as GGUF writers do (for
 * the K-quants a plain per-sub-block min/max fit, not llama.cpp's search, so
 * the bytes differ from GGUF writers'). Used by tests and tools. */
int cairn_quantize_row(int type, const float *src, void *dst, int64_t n);

/* Rewrite n elements (a multiple of 32) of MXFP4 as Q5_0 blocks (22 bytes
 * per 32): an E2M1 value is an even integer in [-12, 12] times 2^(e - 128),
 * so q = 16 + 2 E2M1 and d = 2^(e - 128) give the same weights exactly
 * whenever d is an fp16 (e in [104, 143]; trained weights' scales are far
 * inside). A block outside that range is rounded to the nearest fp16 scale
 * and counted in *inexact (may be NULL). Returns CAIRN_EINVAL when n is not
 * a multiple of 32. */
int cairn_mxfp4_to_q5_0(const void *src, void *dst, int64_t n, int64_t *inexact);

/* ---- half precision ---------------------------------------------------- */

/* IEEE binary16 <-> binary32 (subnormals, infinities and NaNs kept). */
float cairn_fp16_to_fp32(uint16_t h);
uint16_t cairn_fp32_to_fp16(float f); /* round to nearest even */
static inline float cairn_bf16_to_fp32(uint16_t h)
{
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}
uint16_t cairn_fp32_to_bf16(float f); /* round to nearest even, NaN kept */

/* FP8 e4m3fn (1 sign, 4 exponent bits of bias 7, 3 mantissa bits; no
 * infinities; 0x7f and 0xff are NaN; largest finite 448, smallest subnormal
 * 2^-9). Decoding is exact. Encoding rounds to nearest even and saturates to
 * +-448 (what FP8 checkpoint writers do); NaN stays NaN. */
float cairn_e4m3_to_fp32(uint8_t v);
uint8_t cairn_fp32_to_e4m3(float f);

/* ---- random numbers ---------------------------------------------------- */

/* splitmix64: advances *state and returns the next value of a well-mixed
 * sequence; any starting state is fine (random seeds, seed expansion). */
uint64_t cairn_splitmix64(uint64_t *state);

/* xoshiro256**, seeded by splitmix64: the samplers' generator. A seed gives
 * the same sequence on every machine. One generator per user; not shared
 * between threads. */
typedef struct {
    uint64_t s[4];
} cairn_rng;
void cairn_rng_seed(cairn_rng *r, uint64_t seed);
uint64_t cairn_rng_next(cairn_rng *r);
double cairn_rng_uniform(cairn_rng *r); /* [0, 1), the top 53 bits */

/* n bytes from the kernel's random source (getrandom, else /dev/urandom):
 * for values that must not be guessable (session ids). CAIRN_EIO when it
 * cannot be read. Thread-safe. */
int cairn_os_random(void *buf, size_t n);

/* ---- logging ----------------------------------------------------------- */

/* Diagnostics go to stderr, never stdout (stdout carries generated text). */
typedef enum { CAIRN_LOG_ERROR = 0, CAIRN_LOG_WARN, CAIRN_LOG_INFO, CAIRN_LOG_DEBUG } cairn_log_level;
void cairn_log_set_level(cairn_log_level level);
void cairn_log(cairn_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Monotonic clock in seconds, for timings. */
double cairn_now(void);
/* Wall clock in seconds since the epoch, for what other processes or
 * machines read (timestamps on the wire, ages of shared marks). */
double cairn_wall_now(void);

#ifdef __cplusplus
}
#endif
#endif /* CAIRN_COMMON_H */
