/*
 * kernels/cpu/cpu_x86_float.c — AVX2 and AVX-512 matmul kernels for float
 * weights (F32, F16, BF16, and F8_E4M3: a float scale per 32 times an exact
 * e4m3 value) against float activations: cpu_x86_matmul_float and the
 * tiles, row streams and panels behind it. One file because the
 * kernels share their weight loaders and the per-element arithmetic that
 * makes them agree bitwise; every function carries its target attribute
 * (cpu_x86_impl.h).
 *
 * Strategy: dot-product form. Each output element is one 16-lane (8 on
 * AVX2) vector FMA chain over k, reduced at the end by a fixed tree,
 * whatever kernel and tile computes it, so a token's result is the same in
 * a batch and alone (bitwise). The kernels differ only in how they feed the
 * chains:
 *   - one token (decode, AVX-512): 8 rows at a time with the next 8 rows
 *     prefetched — a stream over the weights;
 *   - 2-5 tokens, and AVX2: tiles of up to 4 rows x 4 (2) tokens, each
 *     weight vector converted once per tile (F8_E4M3, whose decoding
 *     costs more, over more than one tile: the 4 rows decoded to F32
 *     once, then F32 tiles);
 *   - 6 and more tokens (prefill, AVX-512): weights converted to F32 once
 *     per 16-row panel and 128-token block, 4 x 6 register tiles.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_x86_impl.h"

#if CPU_X86_KERNELS

/* ---- F8_E4M3: exact decoding --------------------------------------------- */

/* F8_E4M3 weights are w = d * e4m3(q) (cairn_dequantize_row): the exact
 * e4m3 value as a float, then one rounded product with the block's scale,
 * so every kernel sees the reference's weights bit for bit. Never through a
 * float denormal (which a core with denormals-are-zero would read as 0):
 *
 *   AVX-512: a code is s eeee mmm and its value (M + m) S, with S =
 *     +-2^(max(e,1) - 10) and M = 8 for e >= 1 (the implicit bit), 0 for
 *     the subnormals. S and M S come from 32-entry tables indexed by the
 *     top 5 bits (sign and exponent), m as a float from a 16-entry table
 *     indexed by the low 4 (which hold m), and fma(m, S, M S) is exact
 *     (the value has 4 significant bits; every operand is 0 or normal).
 *   AVX2: from the bits (em = the code without its sign): em >= 8 is
 *     (1 + m/8) 2^(e-7), float bits (em << 20) + (120 << 23); em < 8 the
 *     integer m converted and scaled by 2^-9; then the sign bit.
 * 0x7f and 0xff (em = 127) are NaN at both. */
INLINE T512 __m512 e4m3x16(__m128i codes, __m512 d)
{
#define E4M3_S(e) ((e) == 0 ? 0x1p-9f : (float)(1 << (e)) * 0x1p-10f)
#define E4M3_ROW(sg, F)                                                                            \
    _mm512_setr_ps(sg F(0), sg F(1), sg F(2), sg F(3), sg F(4), sg F(5), sg F(6), sg F(7),        \
                   sg F(8), sg F(9), sg F(10), sg F(11), sg F(12), sg F(13), sg F(14), sg F(15))
#define E4M3_MS(e) ((e) == 0 ? 0.0f : 8.0f * E4M3_S(e))
    const __m512 s_pos = E4M3_ROW(+, E4M3_S), s_neg = E4M3_ROW(-, E4M3_S);
    const __m512 o_pos = E4M3_ROW(+, E4M3_MS), o_neg = E4M3_ROW(-, E4M3_MS);
#undef E4M3_S
#undef E4M3_ROW
#undef E4M3_MS
    const __m512 mtab = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
    const __m512i x = _mm512_cvtepu8_epi32(codes);
    const __m512i se = _mm512_srli_epi32(x, 3); /* sign and exponent: 5 bits */
    const __m512 S = _mm512_permutex2var_ps(s_pos, se, s_neg);
    const __m512 MS = _mm512_permutex2var_ps(o_pos, se, o_neg);
    const __m512 m = _mm512_permutexvar_ps(x, mtab); /* index: the low 4 bits */
    /* code 0x80: fma(0, -2^-9, -0) = -0, as the reference's -0.0f */
    __m512 v = _mm512_fmadd_ps(m, S, MS);
    const __mmask16 nan =
        _mm_cmpeq_epi8_mask(_mm_or_si128(codes, _mm_set1_epi8((char)0x80)), _mm_set1_epi8(-1));
    v = _mm512_mask_mov_ps(v, nan, _mm512_set1_ps(NAN));
    return _mm512_mul_ps(d, v);
}

INLINE T256 __m256 e4m3x8(__m128i codes, __m256 d)
{
    const __m256i x = _mm256_cvtepu8_epi32(codes);
    const __m256i em = _mm256_and_si256(x, _mm256_set1_epi32(0x7f));
    const __m256 nrm = _mm256_castsi256_ps(
        _mm256_add_epi32(_mm256_slli_epi32(em, 20), _mm256_set1_epi32(120 << 23)));
    const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(em), _mm256_set1_ps(0x1p-9f));
    __m256 mag = _mm256_blendv_ps(
        nrm, sub, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(8), em)));
    mag = _mm256_blendv_ps(mag, _mm256_set1_ps(NAN),
                           _mm256_castsi256_ps(_mm256_cmpeq_epi32(em, _mm256_set1_epi32(0x7f))));
    const __m256 sign = _mm256_castsi256_ps(
        _mm256_and_si256(_mm256_slli_epi32(x, 24), _mm256_set1_epi32((int)0x80000000u)));
    return _mm256_mul_ps(d, _mm256_or_ps(mag, sign));
}

/* Byte offset of element k in an F8_E4M3 row (blocks of 36 bytes: the
 * scale, then 32 codes). */
static inline size_t f8_off(int k)
{
    return (size_t)(k / 32) * 36 + 4 + (size_t)(k % 32);
}

static inline float f8_scale(const uint8_t *row, int k)
{
    float d;
    memcpy(&d, row + (size_t)(k / 32) * 36, 4);
    return d;
}

/* ---- float weights: dot-product tiles ------------------------------------ */

/* 16 weights of a row from element k, as floats; lanes outside `m` are 0.
 * F8_E4M3: k is a multiple of 16 (its rows are whole 32-element blocks),
 * so the 16 lie in one block. */
INLINE T512 __m512 load_w16(const uint8_t *row, int k, cairn_type t, __mmask16 m)
{
    if (t == CAIRN_TYPE_F8_E4M3)
        return _mm512_maskz_mov_ps(
            m, e4m3x16(_mm_loadu_si128((const __m128i *)(row + f8_off(k))),
                       _mm512_set1_ps(f8_scale(row, k))));
    if (t == CAIRN_TYPE_F32)
        return _mm512_maskz_loadu_ps(m, row + 4 * (size_t)k);
    __m256i h = _mm256_maskz_loadu_epi16(m, row + 2 * (size_t)k);
    if (t == CAIRN_TYPE_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); /* BF16 */
}

INLINE T512 void ftile_512(const uint8_t *W, size_t rb, cairn_type t, const float *x, int n_in,
                           const int R, const int C, float *y, int n_out)
{
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm512_setzero_ps();
    int k = 0;
    for (; k + 16 <= n_in; k += 16) {
        __m512 w[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            w[r] = load_w16(W + (size_t)r * rb, k, t, 0xffff);
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const __m512 xv = _mm512_loadu_ps(x + (size_t)c * n_in + k);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                acc[r][c] = _mm512_fmadd_ps(w[r], xv, acc[r][c]);
        }
    }
    if (k < n_in) {
        const __mmask16 m = (__mmask16)((1u << (n_in - k)) - 1);
        __m512 w[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            w[r] = load_w16(W + (size_t)r * rb, k, t, m);
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const __m512 xv = _mm512_maskz_loadu_ps(m, x + (size_t)c * n_in + k);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                acc[r][c] = _mm512_fmadd_ps(w[r], xv, acc[r][c]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            y[(size_t)c * n_out + r] = _mm512_reduce_add_ps(acc[r][c]);
}

#define FTILE_CASES(fn, W, rb, t, x, n_in, R, C, y, n_out)                                         \
    switch ((R) * 8 + (C)) {                                                                       \
    case 1 * 8 + 1: fn(W, rb, t, x, n_in, 1, 1, y, n_out); break;                                  \
    case 1 * 8 + 2: fn(W, rb, t, x, n_in, 1, 2, y, n_out); break;                                  \
    case 1 * 8 + 3: fn(W, rb, t, x, n_in, 1, 3, y, n_out); break;                                  \
    case 1 * 8 + 4: fn(W, rb, t, x, n_in, 1, 4, y, n_out); break;                                  \
    case 2 * 8 + 1: fn(W, rb, t, x, n_in, 2, 1, y, n_out); break;                                  \
    case 2 * 8 + 2: fn(W, rb, t, x, n_in, 2, 2, y, n_out); break;                                  \
    case 2 * 8 + 3: fn(W, rb, t, x, n_in, 2, 3, y, n_out); break;                                  \
    case 2 * 8 + 4: fn(W, rb, t, x, n_in, 2, 4, y, n_out); break;                                  \
    case 3 * 8 + 1: fn(W, rb, t, x, n_in, 3, 1, y, n_out); break;                                  \
    case 3 * 8 + 2: fn(W, rb, t, x, n_in, 3, 2, y, n_out); break;                                  \
    case 3 * 8 + 3: fn(W, rb, t, x, n_in, 3, 3, y, n_out); break;                                  \
    case 3 * 8 + 4: fn(W, rb, t, x, n_in, 3, 4, y, n_out); break;                                  \
    case 4 * 8 + 1: fn(W, rb, t, x, n_in, 4, 1, y, n_out); break;                                  \
    case 4 * 8 + 2: fn(W, rb, t, x, n_in, 4, 2, y, n_out); break;                                  \
    case 4 * 8 + 3: fn(W, rb, t, x, n_in, 4, 3, y, n_out); break;                                  \
    default: fn(W, rb, t, x, n_in, 4, 4, y, n_out); break;                                         \
    }

/* One weight type per instantiation so the loads are resolved at compile
 * time. */
#define FTILE_TYPED(NAME, TYPE)                                                                    \
    static __attribute__((noinline)) T512 void NAME(const uint8_t *W, size_t rb, const float *x,  \
                                                    int n_in, int R, int C, float *y, int n_out) \
    {                                                                                              \
        FTILE_CASES(ftile_512, W, rb, TYPE, x, n_in, R, C, y, n_out)                               \
    }
FTILE_TYPED(ftile_512_f32, CAIRN_TYPE_F32)
FTILE_TYPED(ftile_512_f16, CAIRN_TYPE_F16)
FTILE_TYPED(ftile_512_bf16, CAIRN_TYPE_BF16)
FTILE_TYPED(ftile_512_f8, CAIRN_TYPE_F8_E4M3)

/* AVX2: 8 lanes, tiles of up to 4 rows x 2 tokens (16 ymm registers). */
INLINE T256 __m256 load_w8(const uint8_t *row, int k, cairn_type t)
{
    if (t == CAIRN_TYPE_F8_E4M3) /* k a multiple of 8: the 8 lie in one block */
        return e4m3x8(_mm_loadl_epi64((const __m128i *)(row + f8_off(k))),
                      _mm256_set1_ps(f8_scale(row, k)));
    if (t == CAIRN_TYPE_F32)
        return _mm256_loadu_ps((const float *)(row + 4 * (size_t)k));
    __m128i h = _mm_loadu_si128((const __m128i *)(row + 2 * (size_t)k));
    if (t == CAIRN_TYPE_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Weight element k of a row as a float (the scalar tail of the AVX2 tile). */
static inline float w_at(const uint8_t *row, int k, cairn_type t)
{
    if (t == CAIRN_TYPE_F8_E4M3)
        return f8_scale(row, k) * cpu_e4m3_to_float(row[f8_off(k)]);
    if (t == CAIRN_TYPE_F32) {
        float f;
        memcpy(&f, row + 4 * (size_t)k, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, row + 2 * (size_t)k, 2);
    return t == CAIRN_TYPE_F16 ? cpu_half_to_float(h) : cairn_bf16_to_fp32(h);
}

INLINE T256 void ftile_256(const uint8_t *W, size_t rb, cairn_type t, const float *x, int n_in,
                           const int R, const int C, float *y, int n_out)
{
    __m256 acc[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= n_in; k += 8) {
        __m256 w[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            w[r] = load_w8(W + (size_t)r * rb, k, t);
#pragma GCC unroll 2
        for (int c = 0; c < C; c++) {
            const __m256 xv = _mm256_loadu_ps(x + (size_t)c * n_in + k);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                acc[r][c] = _mm256_fmadd_ps(w[r], xv, acc[r][c]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int c = 0; c < C; c++) {
            float sum = hsum256(acc[r][c]);
            for (int kk = k; kk < n_in; kk++)
                sum = fmaf(w_at(W + (size_t)r * rb, kk, t), x[(size_t)c * n_in + kk], sum);
            y[(size_t)c * n_out + r] = sum;
        }
}

#define FTILE256_TYPED(NAME, TYPE)                                                                 \
    static __attribute__((noinline)) T256 void NAME(const uint8_t *W, size_t rb, const float *x,  \
                                                    int n_in, int R, int C, float *y, int n_out) \
    {                                                                                              \
        switch (R * 8 + C) {                                                                       \
        case 1 * 8 + 1: ftile_256(W, rb, TYPE, x, n_in, 1, 1, y, n_out); break;                    \
        case 1 * 8 + 2: ftile_256(W, rb, TYPE, x, n_in, 1, 2, y, n_out); break;                    \
        case 2 * 8 + 1: ftile_256(W, rb, TYPE, x, n_in, 2, 1, y, n_out); break;                    \
        case 2 * 8 + 2: ftile_256(W, rb, TYPE, x, n_in, 2, 2, y, n_out); break;                    \
        case 3 * 8 + 1: ftile_256(W, rb, TYPE, x, n_in, 3, 1, y, n_out); break;                    \
        case 3 * 8 + 2: ftile_256(W, rb, TYPE, x, n_in, 3, 2, y, n_out); break;                    \
        case 4 * 8 + 1: ftile_256(W, rb, TYPE, x, n_in, 4, 1, y, n_out); break;                    \
        default: ftile_256(W, rb, TYPE, x, n_in, 4, 2, y, n_out); break;                           \
        }                                                                                          \
    }
FTILE256_TYPED(ftile_256_f32, CAIRN_TYPE_F32)
FTILE256_TYPED(ftile_256_f16, CAIRN_TYPE_F16)
FTILE256_TYPED(ftile_256_bf16, CAIRN_TYPE_BF16)
FTILE256_TYPED(ftile_256_f8, CAIRN_TYPE_F8_E4M3)

typedef void (*ftile_fn)(const uint8_t *W, size_t rb, const float *x, int n_in, int R, int C,
                         float *y, int n_out);

/* Rows [r, r + rows) of F8_E4M3 weights as F32 into pk [rows][n_in], with
 * AVX2's decoder (n_in a multiple of 32). */
static T256 void convert_rows_256(const uint8_t *W, size_t rb, int n_in, int64_t r, int rows,
                                  float *pk)
{
    for (int i = 0; i < rows; i++) {
        const uint8_t *row = W + (size_t)(r + i) * rb;
        for (int k = 0; k < n_in; k += 8)
            _mm256_storeu_ps(pk + (size_t)i * n_in + k, load_w8(row, k, CAIRN_TYPE_F8_E4M3));
    }
}

/* ---- float weights, one token (decode, AVX-512) ------------------------------ */

/* Decode is a stream over the weights. Eight rows at a time keep eight
 * independent FMA chains and eight memory streams in flight, and the rows
 * of the next tile are prefetched while this one is computed (rows are
 * short — 1.5 KB at 768 F16 — so the hardware prefetcher barely ramps up
 * within one). Each element is the same FMA chain and reduction as in
 * ftile_512, so the result is bitwise that of the batched kernels. */
#define FR_ROWS 8

INLINE T512 void frow_512(const uint8_t *W, size_t rb, cairn_type t, const float *x, int n_in,
                          const int R, float *y, const uint8_t *next, int n_next)
{
    const size_t es = t == CAIRN_TYPE_F32 ? 4 : 2;
    __m512 acc[FR_ROWS];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        acc[r] = _mm512_setzero_ps();
    int k = 0;
    for (; k + 16 <= n_in; k += 16) {
        const __m512 xv = _mm512_loadu_ps(x + k);
        /* a line of the next rows per 64 bytes of weights; F8_E4M3 blocks
         * are 36 bytes, so one prefetch per block covers every line */
        if (t == CAIRN_TYPE_F8_E4M3 ? k % 32 == 0 : ((size_t)k * es) % 64 == 0) {
            const size_t off = t == CAIRN_TYPE_F8_E4M3 ? (size_t)(k / 32) * 36 : (size_t)k * es;
            for (int r = 0; r < n_next; r++)
                _mm_prefetch((const char *)(next + (size_t)r * rb + off), _MM_HINT_T0);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            acc[r] = _mm512_fmadd_ps(load_w16(W + (size_t)r * rb, k, t, 0xffff), xv, acc[r]);
    }
    if (k < n_in) {
        const __mmask16 m = (__mmask16)((1u << (n_in - k)) - 1);
        const __m512 xv = _mm512_maskz_loadu_ps(m, x + k);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
            acc[r] = _mm512_fmadd_ps(load_w16(W + (size_t)r * rb, k, t, m), xv, acc[r]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        y[r] = _mm512_reduce_add_ps(acc[r]);
}

#define FROW_TYPED(NAME, TYPE)                                                                     \
    static __attribute__((noinline)) T512 void NAME(const uint8_t *W, size_t rb, const float *x,  \
                                                    int n_in, int R, float *y,                    \
                                                    const uint8_t *next, int n_next)              \
    {                                                                                              \
        if (R == FR_ROWS)                                                                          \
            frow_512(W, rb, TYPE, x, n_in, FR_ROWS, y, next, n_next);                              \
        else                                                                                       \
            for (int r = 0; r < R; r++)                                                            \
                frow_512(W + (size_t)r * rb, rb, TYPE, x, n_in, 1, y + r, next, 0);                \
    }
FROW_TYPED(frow_512_f32, CAIRN_TYPE_F32)
FROW_TYPED(frow_512_f16, CAIRN_TYPE_F16)
FROW_TYPED(frow_512_bf16, CAIRN_TYPE_BF16)
FROW_TYPED(frow_512_f8, CAIRN_TYPE_F8_E4M3)

static T512 void matmul_float_decode(float *y, const uint8_t *W, cairn_type wtype,
                                     size_t row_bytes, const float *x, int n_in, int64_t r0,
                                     int64_t r1)
{
    void (*fn)(const uint8_t *, size_t, const float *, int, int, float *, const uint8_t *, int) =
        wtype == CAIRN_TYPE_F32 ? frow_512_f32
      : wtype == CAIRN_TYPE_F16 ? frow_512_f16
      : wtype == CAIRN_TYPE_F8_E4M3 ? frow_512_f8
      : frow_512_bf16;
    for (int64_t r = r0; r < r1; r += FR_ROWS) {
        const int R = r1 - r < FR_ROWS ? (int)(r1 - r) : FR_ROWS;
        const int64_t nr = r + R;
        const int n_next = r1 - nr < FR_ROWS ? (int)(r1 - nr) : FR_ROWS;
        fn(W + (size_t)r * row_bytes, row_bytes, x, n_in, R, y + r,
           W + (size_t)nr * row_bytes, n_next);
    }
}

/* ---- float weights, many tokens: F32 panels (AVX-512) --------------------- */

/* Prefill keeps the dot-product form of ftile_512 (so every element is the
 * same 16-lane FMA chain over k and the same final reduction, bitwise equal
 * to decode) but removes what limited it:
 *   - weights are converted to F32 once per panel of FP_ROWS rows and token
 *     block, instead of once per 4-token tile (vcvtph2ps competes with the
 *     FMAs for the same ports);
 *   - tiles are 4 rows x 6 tokens: 24 accumulators, 10 loads per 24 FMAs;
 *   - tokens are processed in blocks of FP_TOKEN_BLOCK so the activations a
 *     panel is multiplied with stay in L2 (512 tokens x 2048 floats do not).
 * Converting F16/BF16 to F32 is exact, so the arithmetic per element is
 * exactly that of the unpacked tile. */
#define FP_ROWS 16
#define FP_TOKENS 6
#define FP_TOKEN_BLOCK 128
#define FP_MIN_T 6

INLINE T512 void fptile_512(const float *w, size_t ws, const float *x, int n_in, const int R,
                            const int C, float *y, int n_out)
{
    __m512 acc[4][FP_TOKENS];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 6
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm512_setzero_ps();
    int k = 0;
    for (; k + 16 <= n_in; k += 16) {
        __m512 wv[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            wv[r] = _mm512_loadu_ps(w + (size_t)r * ws + k);
#pragma GCC unroll 6
        for (int c = 0; c < C; c++) {
            const __m512 xv = _mm512_loadu_ps(x + (size_t)c * n_in + k);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                acc[r][c] = _mm512_fmadd_ps(wv[r], xv, acc[r][c]);
        }
    }
    if (k < n_in) {
        const __mmask16 m = (__mmask16)((1u << (n_in - k)) - 1);
        __m512 wv[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            wv[r] = _mm512_maskz_loadu_ps(m, w + (size_t)r * ws + k);
#pragma GCC unroll 6
        for (int c = 0; c < C; c++) {
            const __m512 xv = _mm512_maskz_loadu_ps(m, x + (size_t)c * n_in + k);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                acc[r][c] = _mm512_fmadd_ps(wv[r], xv, acc[r][c]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 6
        for (int c = 0; c < C; c++)
            y[(size_t)c * n_out + r] = _mm512_reduce_add_ps(acc[r][c]);
}

static __attribute__((noinline)) T512 void fptile_512_any(const float *w, size_t ws,
                                                          const float *x, int n_in, int R, int C,
                                                          float *y, int n_out)
{
#define FP_CASE(RR, CC)                                                                            \
    case RR * 8 + CC: fptile_512(w, ws, x, n_in, RR, CC, y, n_out); break;
    switch (R * 8 + C) {
        FP_CASE(1, 1) FP_CASE(1, 2) FP_CASE(1, 3) FP_CASE(1, 4) FP_CASE(1, 5) FP_CASE(1, 6)
        FP_CASE(2, 1) FP_CASE(2, 2) FP_CASE(2, 3) FP_CASE(2, 4) FP_CASE(2, 5) FP_CASE(2, 6)
        FP_CASE(3, 1) FP_CASE(3, 2) FP_CASE(3, 3) FP_CASE(3, 4) FP_CASE(3, 5) FP_CASE(3, 6)
        FP_CASE(4, 1) FP_CASE(4, 2) FP_CASE(4, 3) FP_CASE(4, 4) FP_CASE(4, 5)
    default: fptile_512(w, ws, x, n_in, 4, 6, y, n_out); break;
    }
#undef FP_CASE
}

/* Rows [r, r + rows) of F16/BF16/F8_E4M3 weights as F32 into pk
 * [rows][n_in]. */
static T512 void convert_panel(const uint8_t *W, size_t rb, cairn_type t, int n_in, int64_t r,
                               int rows, float *pk)
{
    for (int i = 0; i < rows; i++) {
        const uint8_t *row = W + (size_t)(r + i) * rb;
        float *out = pk + (size_t)i * n_in;
        int k = 0;
        if (t == CAIRN_TYPE_F16) {
            for (; k + 16 <= n_in; k += 16)
                _mm512_storeu_ps(out + k, _mm512_cvtph_ps(_mm256_loadu_si256(
                                              (const __m256i *)(row + 2 * (size_t)k))));
        } else if (t == CAIRN_TYPE_BF16) {
            for (; k + 16 <= n_in; k += 16)
                _mm512_storeu_ps(out + k, load_w16(row, k, CAIRN_TYPE_BF16, 0xffff));
        } else {
            for (; k + 16 <= n_in; k += 16)
                _mm512_storeu_ps(out + k, load_w16(row, k, CAIRN_TYPE_F8_E4M3, 0xffff));
        }
        if (k < n_in) {
            const __mmask16 m = (__mmask16)((1u << (n_in - k)) - 1);
            _mm512_mask_storeu_ps(out + k, m, load_w16(row, k, t, m));
        }
    }
}

static T512 void matmul_float_panels(float *y, const uint8_t *W, cairn_type wtype,
                                     size_t row_bytes, const float *x, int T, int n_in, int n_out,
                                     int64_t r0, int64_t r1, float *pk)
{
    for (int tb = 0; tb < T; tb += FP_TOKEN_BLOCK) {
        const int te = T - tb < FP_TOKEN_BLOCK ? T : tb + FP_TOKEN_BLOCK;
        for (int64_t r = r0; r < r1; r += FP_ROWS) {
            const int rows = r1 - r < FP_ROWS ? (int)(r1 - r) : FP_ROWS;
            const float *w;
            size_t ws;
            if (wtype == CAIRN_TYPE_F32) {
                w = (const float *)(W + (size_t)r * row_bytes);
                ws = row_bytes / sizeof(float);
            } else {
                convert_panel(W, row_bytes, wtype, n_in, r, rows, pk);
                w = pk;
                ws = (size_t)n_in;
            }
            for (int t = tb; t < te; t += FP_TOKENS) {
                const int C = te - t < FP_TOKENS ? te - t : FP_TOKENS;
                for (int i = 0; i < rows; i += 4) {
                    const int R = rows - i < 4 ? rows - i : 4;
                    fptile_512_any(w + (size_t)i * ws, ws, x + (size_t)t * n_in, n_in, R, C,
                                   y + (size_t)t * n_out + r + i, n_out);
                }
            }
        }
    }
}

/* Tokens per tile of the dot-product tiles (ftile_512, ftile_256). */
static int tile_tokens(cpu_isa isa)
{
    return isa >= CPU_ISA_AVX512 ? 4 : 2;
}

size_t cpu_x86_float_panel_floats(cpu_isa isa, cairn_type wtype, int T, int n_in)
{
    if (isa >= CPU_ISA_AVX512 && T >= FP_MIN_T)
        return (size_t)FP_ROWS * (size_t)n_in;
    /* F8_E4M3 in more than one token tile: its 4 rows decoded once */
    if (isa >= CPU_ISA_AVX2 && wtype == CAIRN_TYPE_F8_E4M3 && T > tile_tokens(isa))
        return 4 * (size_t)n_in;
    return 0;
}

int cpu_x86_float_rows_per_item(cpu_isa isa, int T)
{
    if (isa >= CPU_ISA_AVX512)
        return T >= FP_MIN_T ? FP_ROWS : T == 1 ? FR_ROWS : 4;
    return 4;
}

int cpu_x86_matmul_float(cpu_isa isa, float *y, const uint8_t *W, cairn_type wtype,
                         size_t row_bytes, const float *x, int T, int n_in, int n_out, int64_t r0,
                         int64_t r1, float *panel)
{
    ftile_fn fn;
    int max_c;
    if (isa >= CPU_ISA_AVX512) {
        fn = wtype == CAIRN_TYPE_F32 ? ftile_512_f32
           : wtype == CAIRN_TYPE_F16 ? ftile_512_f16
           : wtype == CAIRN_TYPE_F8_E4M3 ? ftile_512_f8
           : ftile_512_bf16;
        max_c = tile_tokens(isa);
    } else if (isa >= CPU_ISA_AVX2) {
        fn = wtype == CAIRN_TYPE_F32 ? ftile_256_f32
           : wtype == CAIRN_TYPE_F16 ? ftile_256_f16
           : wtype == CAIRN_TYPE_F8_E4M3 ? ftile_256_f8
           : ftile_256_bf16;
        max_c = tile_tokens(isa);
    } else {
        return 0;
    }
    if (wtype != CAIRN_TYPE_F32 && wtype != CAIRN_TYPE_F16 && wtype != CAIRN_TYPE_BF16 &&
        wtype != CAIRN_TYPE_F8_E4M3)
        return 0;
    if (isa >= CPU_ISA_AVX512 && T >= FP_MIN_T) {
        matmul_float_panels(y, W, wtype, row_bytes, x, T, n_in, n_out, r0, r1, panel);
        return 1;
    }
    if (isa >= CPU_ISA_AVX512 && T == 1) {
        matmul_float_decode(y, W, wtype, row_bytes, x, n_in, r0, r1);
        return 1;
    }
    /* F8_E4M3 over several token tiles: the 4 rows are decoded to F32 once
     * (the same floats load_w8/load_w16 give) and the F32 tile runs on
     * them, the same arithmetic as the F8 tile without decoding per tile */
    const int f8_rows = wtype == CAIRN_TYPE_F8_E4M3 && T > max_c;
    for (int64_t r = r0; r < r1; r += 4) {
        const int R = r1 - r < 4 ? (int)(r1 - r) : 4;
        const uint8_t *w = W + (size_t)r * row_bytes;
        size_t rb = row_bytes;
        ftile_fn f = fn;
        if (f8_rows) {
            if (isa >= CPU_ISA_AVX512) {
                convert_panel(W, row_bytes, wtype, n_in, r, R, panel);
                f = ftile_512_f32;
            } else {
                convert_rows_256(W, row_bytes, n_in, r, R, panel);
                f = ftile_256_f32;
            }
            w = (const uint8_t *)panel;
            rb = sizeof(float) * (size_t)n_in;
        }
        for (int t = 0; t < T; t += max_c) {
            const int C = T - t < max_c ? T - t : max_c;
            f(w, rb, x + (size_t)t * n_in, n_in, R, C, y + (size_t)t * n_out + r, n_out);
        }
    }
    return 1;
}

/* ---- packed F16 / BF16 (AVX-512): outer product over 16-row groups -------- */

/* A packed group (cpu_impl.h, "Packed weights") holds, per 32-element
 * block, 16 column vectors: dword i of vector p is elements 2p and 2p+1 of
 * row i. Each output keeps two accumulators, and per element k (in k order)
 *   F16, and BF16 in float mode:  acc[k % 2] = fma(w_k, x_k, acc[k % 2])
 *   BF16 in bf16 mode:            acc[p % 2] = vdpbf16ps(acc[p % 2],
 *                                     (w_2p, w_2p+1), (b_2p, b_2p+1))
 * with b = x rounded to bf16 (nearest even) once per call; y = acc[0] +
 * acc[1]. Every batch size and token tile computes exactly this, so a row's
 * result never depends on its batch. Two accumulators keep a lone token's
 * chain of dependent adds short; more tokens per pass keep the units busy
 * (C of them, 2C registers). */
#define TILE_F 8

#define TBF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))

INLINE T512 void fgroup_512(const uint8_t *grp, cairn_type t, const float *x, int n_in,
                            const int C, float *y, int n_out, __mmask16 m, int pf)
{
    __m512 acc[TILE_F][2];
#pragma GCC unroll 8
    for (int c = 0; c < C; c++)
        acc[c][0] = acc[c][1] = _mm512_setzero_ps();
    const __m512i hi16 = _mm512_set1_epi32((int)0xffff0000u);
    for (int b = 0; b < n_in / 32; b++) {
        const uint8_t *mb = grp + (size_t)b * 1024;
        if (pf > 0)
            for (int off = 0; off < 1024; off += 64)
                _mm_prefetch((const char *)mb + pf + off, _MM_HINT_T1);
#pragma GCC unroll 16
        for (int p = 0; p < 16; p++) {
            const __m512i v = _mm512_load_si512(mb + 64 * p);
            __m512 even, odd;
            if (t == CAIRN_TYPE_F16) {
                even = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
                odd = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16)));
            } else {
                even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
                odd = _mm512_castsi512_ps(_mm512_and_si512(v, hi16));
            }
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) {
                const float *xk = x + (size_t)c * n_in + 32 * (size_t)b + 2 * p;
                acc[c][0] = _mm512_fmadd_ps(even, _mm512_set1_ps(xk[0]), acc[c][0]);
                acc[c][1] = _mm512_fmadd_ps(odd, _mm512_set1_ps(xk[1]), acc[c][1]);
            }
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < C; c++)
        _mm512_mask_storeu_ps(y + (size_t)c * n_out, m, _mm512_add_ps(acc[c][0], acc[c][1]));
}

/* bf16 mode: xb [C][n_in] bf16 activations (rows n_in apart). */
INLINE TBF16 void bgroup_512(const uint8_t *grp, const uint16_t *xb, int n_in, const int C,
                             float *y, int n_out, __mmask16 m, int pf)
{
    __m512 acc[TILE_F][2];
#pragma GCC unroll 8
    for (int c = 0; c < C; c++)
        acc[c][0] = acc[c][1] = _mm512_setzero_ps();
    for (int b = 0; b < n_in / 32; b++) {
        const uint8_t *mb = grp + (size_t)b * 1024;
        if (pf > 0)
            for (int off = 0; off < 1024; off += 64)
                _mm_prefetch((const char *)mb + pf + off, _MM_HINT_T1);
#pragma GCC unroll 16
        for (int p = 0; p < 16; p++) {
            const __m512bh w = (__m512bh)_mm512_load_si512(mb + 64 * p);
#pragma GCC unroll 8
            for (int c = 0; c < C; c++) {
                const uint16_t *xk = xb + (size_t)c * n_in + 32 * (size_t)b + 2 * p;
                const __m512bh a = (__m512bh)_mm512_broadcastd_epi32(_mm_loadu_si32(xk));
                acc[c][p & 1] = _mm512_dpbf16_ps(acc[c][p & 1], w, a);
            }
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < C; c++)
        _mm512_mask_storeu_ps(y + (size_t)c * n_out, m, _mm512_add_ps(acc[c][0], acc[c][1]));
}

#define FGROUP_TYPED(NAME, TYPE)                                                                   \
    static __attribute__((noinline)) T512 void NAME(const uint8_t *grp, const float *x, int n_in,  \
                                                    int C, float *y, int n_out, __mmask16 m,       \
                                                    int pf)                                        \
    {                                                                                              \
        switch (C) {                                                                               \
        case 1: fgroup_512(grp, TYPE, x, n_in, 1, y, n_out, m, pf); break;                         \
        case 2: fgroup_512(grp, TYPE, x, n_in, 2, y, n_out, m, pf); break;                         \
        case 3: fgroup_512(grp, TYPE, x, n_in, 3, y, n_out, m, pf); break;                         \
        case 4: fgroup_512(grp, TYPE, x, n_in, 4, y, n_out, m, pf); break;                         \
        case 5: fgroup_512(grp, TYPE, x, n_in, 5, y, n_out, m, pf); break;                         \
        case 6: fgroup_512(grp, TYPE, x, n_in, 6, y, n_out, m, pf); break;                         \
        case 7: fgroup_512(grp, TYPE, x, n_in, 7, y, n_out, m, pf); break;                         \
        default: fgroup_512(grp, TYPE, x, n_in, 8, y, n_out, m, pf); break;                        \
        }                                                                                          \
    }
FGROUP_TYPED(fgroup_512_f16, CAIRN_TYPE_F16)
FGROUP_TYPED(fgroup_512_bf16, CAIRN_TYPE_BF16)

static __attribute__((noinline)) TBF16 void bgroup_512_any(const uint8_t *grp,
                                                            const uint16_t *xb, int n_in, int C,
                                                            float *y, int n_out, __mmask16 m,
                                                            int pf)
{
    switch (C) {
    case 1: bgroup_512(grp, xb, n_in, 1, y, n_out, m, pf); break;
    case 2: bgroup_512(grp, xb, n_in, 2, y, n_out, m, pf); break;
    case 3: bgroup_512(grp, xb, n_in, 3, y, n_out, m, pf); break;
    case 4: bgroup_512(grp, xb, n_in, 4, y, n_out, m, pf); break;
    case 5: bgroup_512(grp, xb, n_in, 5, y, n_out, m, pf); break;
    case 6: bgroup_512(grp, xb, n_in, 6, y, n_out, m, pf); break;
    case 7: bgroup_512(grp, xb, n_in, 7, y, n_out, m, pf); break;
    default: bgroup_512(grp, xb, n_in, 8, y, n_out, m, pf); break;
    }
}

int cpu_x86_gemm_float_groups(cpu_isa isa, cairn_type wtype, size_t group_bytes,
                              const uint8_t *grp, int rows, const float *x, const uint16_t *xb,
                              int T, int n_in, float *y, int n_out, const cpu_quant_tuning *tune)
{
    if (isa < CPU_ISA_AVX512 || (wtype != CAIRN_TYPE_F16 && wtype != CAIRN_TYPE_BF16))
        return 0;
    for (int r = 0; r < rows; r += 16) {
        const uint8_t *gp = grp + (size_t)(r / 16) * group_bytes;
        const int left = rows - r;
        const __mmask16 m = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
        for (int t0 = 0; t0 < T; t0 += TILE_F) {
            const int C = T - t0 < TILE_F ? T - t0 : TILE_F;
            float *yt = y + (size_t)t0 * n_out + r;
            if (xb)
                bgroup_512_any(gp, xb + (size_t)t0 * n_in, n_in, C, yt, n_out, m,
                               tune->prefetch);
            else
                (wtype == CAIRN_TYPE_F16 ? fgroup_512_f16 : fgroup_512_bf16)(
                    gp, x + (size_t)t0 * n_in, n_in, C, yt, n_out, m, tune->prefetch);
        }
    }
    return 1;
}

static TBF16 void to_bf16_512(const float *x, uint16_t *out, size_t n)
{
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
        _mm512_storeu_si512(out + i, (__m512i)v);
    }
    for (; i < n; i++) {
        const __m256bh v = _mm512_cvtneps_pbh(_mm512_set1_ps(x[i]));
        out[i] = (uint16_t)_mm256_extract_epi16((__m256i)v, 0);
    }
}

int cpu_x86_to_bf16(const float *x, uint16_t *out, size_t n)
{
    to_bf16_512(x, out, n);
    return 1;
}

#else /* not x86-64: the scalar reference kernels do everything */

int cpu_x86_matmul_float(cpu_isa isa, float *y, const uint8_t *W, cairn_type wtype,
                         size_t row_bytes, const float *x, int T, int n_in, int n_out, int64_t r0,
                         int64_t r1, float *panel)
{
    (void)isa, (void)y, (void)W, (void)wtype, (void)row_bytes, (void)x, (void)T, (void)n_in;
    (void)n_out, (void)r0, (void)r1, (void)panel;
    return 0;
}
size_t cpu_x86_float_panel_floats(cpu_isa isa, cairn_type wtype, int T, int n_in)
{
    (void)isa, (void)wtype, (void)T, (void)n_in;
    return 0;
}
int cpu_x86_float_rows_per_item(cpu_isa isa, int T)
{
    (void)isa, (void)T;
    return 4;
}
int cpu_x86_gemm_float_groups(cpu_isa isa, cairn_type wtype, size_t group_bytes,
                              const uint8_t *grp, int rows, const float *x, const uint16_t *xb,
                              int T, int n_in, float *y, int n_out, const cpu_quant_tuning *tune)
{
    (void)isa, (void)wtype, (void)group_bytes, (void)grp, (void)rows, (void)x, (void)xb, (void)T;
    (void)n_in, (void)y, (void)n_out, (void)tune;
    return 0;
}
int cpu_x86_to_bf16(const float *x, uint16_t *out, size_t n)
{
    (void)x, (void)out, (void)n;
    return 0;
}
#endif
