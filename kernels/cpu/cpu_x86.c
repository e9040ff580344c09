/*
 * kernels/cpu/cpu_x86.c — AVX2 and AVX-512 kernels of the CPU backend.
 *
 * Every function here carries a target attribute instead of relying on the
 * build's -march, so the same binary runs everywhere and cpu_isa_detect()
 * picks the level at run time. Off x86-64 the file compiles to stubs that
 * report "not handled" and the scalar reference kernels run.
 *
 * Matmul strategy
 * ---------------
 * Float weights (F32, F16, BF16): dot-product form. Each output element is
 * one 16-lane (8 on AVX2) vector FMA chain over k, reduced at the end by a
 * fixed tree, whatever kernel and tile computes it, so a token's result is
 * the same in a batch and alone (bitwise). The kernels differ only in how
 * they feed the chains:
 *   - one token (decode, AVX-512): 8 rows at a time with the next 8 rows
 *     prefetched — a stream over the weights;
 *   - 2-5 tokens, and AVX2: tiles of up to 4 rows x 4 (2) tokens, each
 *     weight vector converted once per tile;
 *   - 6 and more tokens (prefill, AVX-512): weights converted to F32 once
 *     per 16-row panel and 128-token block, 4 x 6 register tiles.
 *
 * Quantized weights (Q8_0, Q4_0, Q5_0) against activations quantized to
 * int8 per 32-element block (scale d_a, codes q_a):
 *     y = sum_b d_w[b] * d_a[b] * sum_i w_b[i] * q_a[b][i]
 * The integer inner sums use VNNI's vpdpbusd, which multiplies unsigned by
 * signed bytes. Weights are therefore made unsigned by a zero point Z
 * (Q4_0 codes are already q+8 with Z = 8, Q5_0 q+16 with Z = 16; Q8_0
 * codes get +128 with Z = 128)
 * and the result is corrected by -Z * sum_i q_a[i], which the activation
 * quantizer precomputes per block.
 *   - Few tokens (decode, AVX-512): two blocks per 512-bit register, two
 *     rows interleaved, weight scales gathered 16 blocks at a time and the
 *     correction applied once per 16 blocks (see qrows2_512). AVX2: one
 *     block per 256-bit register.
 *   - Many tokens (prefill, AVX-512): outer-product GEMM. A panel of 32 rows
 *     is repacked (once per panel, reused for every token) so that a 512-bit
 *     register holds 4 consecutive codes of 16 rows; vpdpbusd with 4
 *     activation codes broadcast then advances 16 outputs at once, with no
 *     horizontal sums. The per-block float scaling happens once per block
 *     for 16 outputs.
 * Both keep a fixed per-element order (integer block sums, then one FMA per
 * block in block order), so results do not depend on how rows are split
 * between threads.
 *
 * K-quants (Q4_K, Q5_K, Q6_K) have 32-element sub-blocks (16 for Q6_K's
 * scales) with their own 6- or 8-bit scales inside 256-element super-blocks,
 * so they share the activation blocks. Decode: a row at a time, a
 * super-block per step (krow2_512, two blocks per register; krow_256 on
 * AVX2). Prefill (AVX-512): the panel GEMM above with a K-quant panel
 * (pack_panel_k: the same code layout plus per-block scale and min, or two
 * half-block scales for Q6_K).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_impl.h"

/* ---- level detection ---------------------------------------------------- */

const char *cpu_isa_name(cpu_isa isa)
{
    switch (isa) {
    case CPU_ISA_AVX512: return "avx512-vnni";
    case CPU_ISA_AVX2: return "avx2";
    default: return "scalar";
    }
}

cpu_isa cpu_isa_detect(void)
{
    cpu_isa best = CPU_ISA_SCALAR;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        best = CPU_ISA_AVX2;
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
            best = CPU_ISA_AVX512;
    }
#endif
    const char *cap = getenv("CAIRN_CPU_ISA");
    if (cap && *cap) {
        cpu_isa want = best;
        if (strcmp(cap, "scalar") == 0)
            want = CPU_ISA_SCALAR;
        else if (strcmp(cap, "avx2") == 0)
            want = CPU_ISA_AVX2;
        else if (strcmp(cap, "avx512") == 0)
            want = CPU_ISA_AVX512;
        if (want < best)
            best = want;
    }
    return best;
}

void cpu_quantize_act_block_ref(const float *x, int8_t *q, float *d, int32_t *sum)
{
    float amax = 0.0f;
    for (int i = 0; i < 32; i++)
        amax = fmaxf(amax, fabsf(x[i]));
    const float scale = amax / 127.0f;
    const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
    int32_t s = 0;
    for (int i = 0; i < 32; i++) {
        /* nearest, ties to even: what the vector conversion does */
        const int v = (int)nearbyintf(x[i] * inv);
        q[i] = (int8_t)v;
        s += v;
    }
    *d = scale;
    *sum = s;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define T256 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

/* Panel of the quantized GEMM: 32 rows (2 x 16); per block 2 x 8 groups of
 * [16 rows][4 codes] then 2 x 16 float weight scales. */
#define QP_ROWS 32
#define QP_BLOCK_BYTES (2 * 8 * 64 + 2 * 64)
/* Tokens per GEMM tile, and the batch size from which the GEMM is used. */
#define QG_TOKENS 6
#define QG_MIN_T 4

static inline float half_to_float(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return cpu_half_to_float(h);
}

/* ---- activation quantization ------------------------------------------- */

T512 static void quantize_act_512(const float *x, int n, int8_t *q, float *d, int32_t *s)
{
    for (int b = 0; b < n / 32; b++) {
        __m512 x0 = _mm512_loadu_ps(x + 32 * b);
        __m512 x1 = _mm512_loadu_ps(x + 32 * b + 16);
        __m512 m = _mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1));
        const float amax = _mm512_reduce_max_ps(m);
        const float scale = amax / 127.0f;
        const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
        const __m512 vinv = _mm512_set1_ps(inv);
        __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, vinv));
        __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, vinv));
        _mm_storeu_si128((__m128i *)(q + 32 * b), _mm512_cvtepi32_epi8(i0));
        _mm_storeu_si128((__m128i *)(q + 32 * b + 16), _mm512_cvtepi32_epi8(i1));
        d[b] = scale;
        s[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
    }
}

int cpu_x86_quantize_act(cpu_isa isa, const float *x, int n, int8_t *q, float *d, int32_t *s)
{
    if (isa >= CPU_ISA_AVX512) {
        quantize_act_512(x, n, q, d, s);
        return 1;
    }
    return 0;
}

/* ---- float weights: dot-product tiles ------------------------------------ */

/* 16 weights of a row from element k, as floats; lanes outside `m` are 0. */
INLINE T512 __m512 load_w16(const uint8_t *row, int k, cairn_type t, __mmask16 m)
{
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

/* AVX2: 8 lanes, tiles of up to 4 rows x 2 tokens (16 ymm registers). */
INLINE T256 __m256 load_w8(const uint8_t *row, int k, cairn_type t)
{
    if (t == CAIRN_TYPE_F32)
        return _mm256_loadu_ps((const float *)(row + 4 * (size_t)k));
    __m128i h = _mm_loadu_si128((const __m128i *)(row + 2 * (size_t)k));
    if (t == CAIRN_TYPE_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

INLINE T256 float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Weight element k of a row as a float (the scalar tail of the AVX2 tile). */
static inline float w_at(const uint8_t *row, int k, cairn_type t)
{
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

typedef void (*ftile_fn)(const uint8_t *W, size_t rb, const float *x, int n_in, int R, int C,
                         float *y, int n_out);

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
        if (((size_t)k * es) % 64 == 0)
            for (int r = 0; r < n_next; r++)
                _mm_prefetch((const char *)(next + (size_t)r * rb + (size_t)k * es), _MM_HINT_T0);
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

static T512 void matmul_float_decode(float *y, const uint8_t *W, cairn_type wtype,
                                     size_t row_bytes, const float *x, int n_in, int64_t r0,
                                     int64_t r1)
{
    void (*fn)(const uint8_t *, size_t, const float *, int, int, float *, const uint8_t *, int) =
        wtype == CAIRN_TYPE_F32 ? frow_512_f32
      : wtype == CAIRN_TYPE_F16 ? frow_512_f16
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

/* Rows [r, r + rows) of F16/BF16 weights as F32 into pk [rows][n_in]. */
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
        } else {
            for (; k + 16 <= n_in; k += 16)
                _mm512_storeu_ps(out + k, load_w16(row, k, CAIRN_TYPE_BF16, 0xffff));
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

size_t cpu_x86_float_panel_floats(cpu_isa isa, int T, int n_in)
{
    return isa >= CPU_ISA_AVX512 && T >= FP_MIN_T ? (size_t)FP_ROWS * (size_t)n_in : 0;
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
           : ftile_512_bf16;
        max_c = 4;
    } else if (isa >= CPU_ISA_AVX2) {
        fn = wtype == CAIRN_TYPE_F32 ? ftile_256_f32
           : wtype == CAIRN_TYPE_F16 ? ftile_256_f16
           : ftile_256_bf16;
        max_c = 2;
    } else {
        return 0;
    }
    if (wtype != CAIRN_TYPE_F32 && wtype != CAIRN_TYPE_F16 && wtype != CAIRN_TYPE_BF16)
        return 0;
    if (isa >= CPU_ISA_AVX512 && T >= FP_MIN_T) {
        matmul_float_panels(y, W, wtype, row_bytes, x, T, n_in, n_out, r0, r1, panel);
        return 1;
    }
    if (isa >= CPU_ISA_AVX512 && T == 1) {
        matmul_float_decode(y, W, wtype, row_bytes, x, n_in, r0, r1);
        return 1;
    }
    for (int64_t r = r0; r < r1; r += 4) {
        const int R = r1 - r < 4 ? (int)(r1 - r) : 4;
        for (int t = 0; t < T; t += max_c) {
            const int C = T - t < max_c ? T - t : max_c;
            fn(W + (size_t)r * row_bytes, row_bytes, x + (size_t)t * n_in, n_in, R, C,
               y + (size_t)t * n_out + r, n_out);
        }
    }
    return 1;
}

/* ---- quantized weights: row-at-a-time (decode) ---------------------------- */

/* Zero point of each weight format's unsigned codes (see the top). */
#define Q4_ZERO 8
#define Q5_ZERO 16
#define Q8_ZERO 128

/* Bytes ahead of the current block that the decode kernel prefetches. */
#define QROW_PREFETCH 2048

/* Most tokens the decode kernel takes at once (the batch sizes below
 * QG_MIN_T) and most rows it interleaves. */
#define QD_TOKENS 3
#define QD_ROWS 2
_Static_assert(QG_MIN_T - 1 <= QD_TOKENS, "the decode kernel must cover every T below QG_MIN_T");

/* Blocks [b0, b0 + n) (n <= 16) of R rows (g: the group's first block in
 * the first row, rows rb bytes apart) against C tokens; see qrows2_512. */
INLINE T512 void qrow2_group(const uint8_t *g, size_t rb, cairn_type t, const int8_t *q,
                             const float *d, const int32_t *s, int n_in, int nb, int b0,
                             const int n, const int R, const int C,
                             __m512 acc[QD_ROWS][QD_TOKENS][2], __m512 corr[QD_ROWS][QD_TOKENS])
{
    const int bs = t == CAIRN_TYPE_Q4_0 ? 18 : t == CAIRN_TYPE_Q5_0 ? 22 : 34;
    const __m512i vidx = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(bs));
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const __m512i zero = _mm512_setzero_si512();
    const __mmask16 bm = n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1);
    __m512 sc[QD_ROWS][QD_TOKENS];
#pragma GCC unroll 2
    for (int i = 0; i < R; i++) {
        const __m512i dh = _mm512_mask_i32gather_epi32(zero, bm, vidx, g + (size_t)i * rb, 1);
        const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dh));
#pragma GCC unroll 3
        for (int c = 0; c < C; c++) {
            sc[i][c] = _mm512_mul_ps(dw, _mm512_maskz_loadu_ps(bm, d + (size_t)c * nb + b0));
            const __m512 sv =
                _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(bm, s + (size_t)c * nb + b0));
            corr[i][c] = _mm512_fmadd_ps(sc[i][c], sv, corr[i][c]);
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < n; j += 2) {
        const int two = j + 1 < n;
        /* Full groups alternate two accumulators so consecutive FMAs do not
         * wait for each other; a partial group (a loop with a run-time
         * count) uses one, which stays in a register. */
        const int slot = n == 16 ? (j >> 1) & 1 : 0;
        /* lanes 0-7 scale by block j, 8-15 by block j + 1 */
        const __m512i pick = _mm512_mask_blend_epi32(0xff00, _mm512_set1_epi32(j),
                                                     _mm512_set1_epi32(j + 1));
        __m512i a[QD_TOKENS];
#pragma GCC unroll 3
        for (int c = 0; c < C; c++) {
            const int8_t *a_src = q + (size_t)c * n_in + 32 * (size_t)(b0 + j);
            a[c] = two ? _mm512_loadu_si512(a_src)
                       : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)a_src));
        }
#pragma GCC unroll 2
        for (int i = 0; i < R; i++) {
            const uint8_t *blk = g + (size_t)i * rb + (size_t)j * bs;
            /* Rows are short (432 bytes for 768 Q4_0), too short for the
             * hardware prefetcher to ramp up on; fetch QROW_PREFETCH bytes
             * ahead (the matrix is contiguous, so that is a later row). */
            _mm_prefetch((const char *)(blk + QROW_PREFETCH), _MM_HINT_T0);
            if (bs > 32)
                _mm_prefetch((const char *)(blk + QROW_PREFETCH + 64), _MM_HINT_T0);
            __m512i w;
            if (t == CAIRN_TYPE_Q4_0 || t == CAIRN_TYPE_Q5_0) {
                const int nib = t == CAIRN_TYPE_Q4_0 ? 2 : 6;
                const __m512i r0 =
                    _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(blk + nib)));
                const __m512i r1 = two ? _mm512_broadcast_i32x4(
                                             _mm_loadu_si128((const __m128i *)(blk + bs + nib)))
                                       : zero;
                __m512i raw = _mm512_mask_blend_epi64(0xf0, r0, r1);
                /* 128-bit lanes 1 and 3 take the high nibbles */
                raw = _mm512_mask_srli_epi16(raw, 0xff00ff00u, raw, 4);
                w = _mm512_and_si512(raw, low4);
                if (t == CAIRN_TYPE_Q5_0) {
                    /* bit e of a block's qh is bit 4 of its element e, which
                     * sits in byte e of the block's 32 bytes here */
                    uint32_t h0, h1 = 0;
                    memcpy(&h0, blk + 2, 4);
                    if (two)
                        memcpy(&h1, blk + bs + 2, 4);
                    const __mmask64 hb = (__mmask64)h0 | ((__mmask64)h1 << 32);
                    w = _mm512_or_si512(w, _mm512_maskz_mov_epi8(hb, _mm512_set1_epi8(0x10)));
                }
            } else {
                const __m256i lo = _mm256_loadu_si256((const __m256i *)(blk + 2));
                w = two ? _mm512_inserti64x4(_mm512_castsi256_si512(lo),
                                             _mm256_loadu_si256((const __m256i *)(blk + bs + 2)), 1)
                        : _mm512_zextsi256_si512(lo);
                w = _mm512_xor_si512(w, flip);
            }
#pragma GCC unroll 3
            for (int c = 0; c < C; c++) {
                const __m512i isum = _mm512_dpbusd_epi32(zero, w, a[c]);
                const __m512 scale = _mm512_permutexvar_ps(pick, sc[i][c]);
                acc[i][c][slot] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[i][c][slot]);
            }
        }
    }
}

/* Decode on AVX-512: a 512-bit register holds two blocks, so each vpdpbusd,
 * conversion and FMA covers 64 weights; lanes 0-7 of the integer sums
 * belong to the first block and 8-15 to the second. Per group of 16 blocks
 * the weight scales are fetched with one gather and multiplied by the
 * activation scales in one vector op. The zero point is taken out in float,
 * once per group: sum_b dw_b d_b (isum_b - Z s_b) =
 * sum_b dw_b d_b isum_b - Z sum_b dw_b d_b s_b. R rows are interleaved so
 * their FMA chains (and the final reductions) overlap. */
INLINE T512 void qrows2_512(const uint8_t *row, size_t rb, cairn_type t, const int8_t *q,
                            const float *d, const int32_t *s, int n_in, const int R, const int C,
                            float *y, int n_out)
{
    const int nb = n_in / 32;
    const int bs = t == CAIRN_TYPE_Q4_0 ? 18 : t == CAIRN_TYPE_Q5_0 ? 22 : 34;
    const int zero_point = t == CAIRN_TYPE_Q4_0 ? Q4_ZERO : t == CAIRN_TYPE_Q5_0 ? Q5_ZERO : Q8_ZERO;
    __m512 acc[QD_ROWS][QD_TOKENS][2], corr[QD_ROWS][QD_TOKENS];
#pragma GCC unroll 2
    for (int i = 0; i < R; i++)
#pragma GCC unroll 3
        for (int c = 0; c < C; c++)
            acc[i][c][0] = acc[i][c][1] = corr[i][c] = _mm512_setzero_ps();
    int b0 = 0;
    for (; b0 + 16 <= nb; b0 += 16)
        qrow2_group(row + (size_t)b0 * bs, rb, t, q, d, s, n_in, nb, b0, 16, R, C, acc, corr);
    if (b0 < nb)
        qrow2_group(row + (size_t)b0 * bs, rb, t, q, d, s, n_in, nb, b0, nb - b0, R, C, acc,
                    corr);
#pragma GCC unroll 2
    for (int i = 0; i < R; i++)
#pragma GCC unroll 3
        for (int c = 0; c < C; c++)
            y[(size_t)c * n_out + i] = _mm512_reduce_add_ps(
                _mm512_fmadd_ps(_mm512_set1_ps(-(float)zero_point), corr[i][c],
                                _mm512_add_ps(acc[i][c][0], acc[i][c][1])));
}

/* Rows [r0, r1) against C <= QD_TOKENS tokens; the row loop sits inside
 * each case so the kernel's constants are set up once per call. */
#define QROWS_CASE(TYPE, CC)                                                                       \
    case CC: {                                                                                     \
        int64_t r = r0;                                                                            \
        for (; r + QD_ROWS <= r1; r += QD_ROWS)                                                    \
            qrows2_512(W + (size_t)r * rb, rb, TYPE, q, d, s, n_in, QD_ROWS, CC, y + r, n_out);    \
        for (; r < r1; r++)                                                                        \
            qrows2_512(W + (size_t)r * rb, rb, TYPE, q, d, s, n_in, 1, CC, y + r, n_out);          \
        break;                                                                                     \
    }
#define QROWS_TYPED(NAME, TYPE)                                                                    \
    static __attribute__((noinline)) T512 void NAME(const uint8_t *W, size_t rb, int64_t r0,      \
                                                    int64_t r1, const int8_t *q, const float *d,  \
                                                    const int32_t *s, int n_in, int C, float *y,  \
                                                    int n_out)                                    \
    {                                                                                              \
        switch (C) {                                                                               \
            QROWS_CASE(TYPE, 1)                                                                    \
            QROWS_CASE(TYPE, 2)                                                                    \
        default:                                                                                   \
            QROWS_CASE(TYPE, 3)                                                                    \
        }                                                                                          \
    }
QROWS_TYPED(qrows_512_q4, CAIRN_TYPE_Q4_0)
QROWS_TYPED(qrows_512_q8, CAIRN_TYPE_Q8_0)
QROWS_TYPED(qrows_512_q5, CAIRN_TYPE_Q5_0)

/* Decode on plain AVX2, one block per 256-bit register; u8 x s8 products
 * are summed in pairs into int16 (maddubs) and then into int32. Q4_0 codes (< 16) cannot saturate the
 * pair sums; Q8_0 uses |w| and sign(a, w) instead (pair sums <= 2 * 128 *
 * 127 < 32768), which needs no zero point. */
INLINE T256 void qrow_256(const uint8_t *row, cairn_type t, const int8_t *q, const float *d,
                          const int32_t *s, int n_in, const int C, float *y, int n_out)
{
    const int nb = n_in / 32;
    const size_t bs = t == CAIRN_TYPE_Q4_0 ? 18 : t == CAIRN_TYPE_Q5_0 ? 22 : 34;
    const __m128i low4 = _mm_set1_epi8(0x0f);
    /* Q5_0: byte e of a register picks bit e of qh (bytes 0-7 from its first
     * byte, and so on), then tests it */
    const __m256i qh_spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2,
                                               2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i qh_bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i ones16 = _mm256_set1_epi16(1);
    /* Two accumulators per token (even and odd blocks) so consecutive
     * blocks' FMAs do not wait for each other. */
    __m256 acc[4][2];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++)
        acc[c][0] = acc[c][1] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = row + (size_t)b * bs;
        const float dw = half_to_float(blk);
        __m256i w;
        if (t == CAIRN_TYPE_Q4_0 || t == CAIRN_TYPE_Q5_0) {
            const __m128i raw =
                _mm_loadu_si128((const __m128i *)(blk + (t == CAIRN_TYPE_Q4_0 ? 2 : 6)));
            const __m128i lo = _mm_and_si128(raw, low4);
            const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low4);
            w = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
            if (t == CAIRN_TYPE_Q5_0) {
                int32_t qh;
                memcpy(&qh, blk + 2, 4);
                const __m256i bits =
                    _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(qh), qh_spread), qh_bit);
                w = _mm256_or_si256(w, _mm256_and_si256(_mm256_cmpeq_epi8(bits, qh_bit),
                                                        _mm256_set1_epi8(0x10)));
            }
        } else {
            w = _mm256_loadu_si256((const __m256i *)(blk + 2));
        }
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const size_t ab = (size_t)c * nb + b;
            const __m256i a = _mm256_loadu_si256((const __m256i *)(q + (size_t)c * n_in + 32 * b));
            __m256i pairs, init;
            if (t == CAIRN_TYPE_Q4_0 || t == CAIRN_TYPE_Q5_0) {
                /* codes < 32: pair sums <= 2 * 31 * 128, no saturation */
                pairs = _mm256_maddubs_epi16(w, a);
                init = _mm256_set_epi32(0, 0, 0, 0, 0, 0, 0,
                                        -(t == CAIRN_TYPE_Q4_0 ? Q4_ZERO : Q5_ZERO) * s[ab]);
            } else {
                pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w));
                init = _mm256_setzero_si256();
            }
            const __m256i isum = _mm256_add_epi32(init, _mm256_madd_epi16(pairs, ones16));
            acc[c][b & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dw * d[ab]),
                                            acc[c][b & 1]);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++)
        y[(size_t)c * n_out] = hsum256(_mm256_add_ps(acc[c][0], acc[c][1]));
}

#define QROW_TYPED(NAME, BODY, ATTR, TYPE)                                                         \
    static __attribute__((noinline)) ATTR void NAME(const uint8_t *row, const int8_t *q,          \
                                                    const float *d, const int32_t *s, int n_in,   \
                                                    int C, float *y, int n_out)                   \
    {                                                                                              \
        switch (C) {                                                                               \
        case 1: BODY(row, TYPE, q, d, s, n_in, 1, y, n_out); break;                                \
        case 2: BODY(row, TYPE, q, d, s, n_in, 2, y, n_out); break;                                \
        case 3: BODY(row, TYPE, q, d, s, n_in, 3, y, n_out); break;                                \
        default: BODY(row, TYPE, q, d, s, n_in, 4, y, n_out); break;                               \
        }                                                                                          \
    }
QROW_TYPED(qrow_256_q4, qrow_256, T256, CAIRN_TYPE_Q4_0)
QROW_TYPED(qrow_256_q8, qrow_256, T256, CAIRN_TYPE_Q8_0)
QROW_TYPED(qrow_256_q5, qrow_256, T256, CAIRN_TYPE_Q5_0)

typedef void (*qrow_fn)(const uint8_t *row, const int8_t *q, const float *d, const int32_t *s,
                        int n_in, int C, float *y, int n_out);

/* ---- K-quant weights (Q4_K, Q5_K, Q6_K): row-at-a-time ------------------- */

/* AVX2 decode: one row against C <= 4 tokens, a 256-element super-block at
 * a time, one 32-element block per 256-bit register; the u8 x s8 sums are
 * maddubs + madd, exact since codes < 64 (pair sums <= 2 * 63 * 128).
 *   Q4_K/Q5_K: acc += isum_j * (d sc_j d_a), the 8 float scales of a
 *     super-block formed in one vector; the mins are taken out once per
 *     super-block and token: accm += (m_j s_a) (dmin d_a), 8 blocks per op.
 *   Q6_K: isum lanes (4 per 16-element sub-block) get the zero point taken
 *     out (32 * sum q_a, by a second dot) and their sub-block's int8 scale
 *     multiplied in as integers, then acc += isum * (d d_a).
 * Each output element is the same sequence of operations whatever the
 * thread split, as the other kernels. */
#define KQ_PREFETCH 1536

INLINE T256 __m256i kq_dot256(__m256i u, __m256i a)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1));
}

/* Codes of block j (0..7) of a super-block as 32 unsigned bytes. */
INLINE T256 __m256i kq_codes(const uint8_t *blk, cairn_type t, const int j)
{
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    if (t == CAIRN_TYPE_Q6_K) {
        const int h = j / 4, k = j % 4;
        const __m256i ql = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32 * (k & 1)));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
        const __m256i lo = k < 2 ? _mm256_and_si256(ql, low4)
                                 : _mm256_and_si256(_mm256_srli_epi16(ql, 4), low4);
        /* bits 2k, 2k+1 of each byte to bits 4, 5 (16-bit shifts by at most
         * 4 never carry a bit across a byte that the mask keeps) */
        const __m256i hb = k == 0 ? _mm256_slli_epi16(qh, 4)
                         : k == 1 ? _mm256_slli_epi16(qh, 2)
                         : k == 2 ? qh
                                  : _mm256_srli_epi16(qh, 2);
        return _mm256_or_si256(lo, _mm256_and_si256(hb, _mm256_set1_epi8(0x30)));
    }
    const uint8_t *qs = blk + (t == CAIRN_TYPE_Q4_K ? 16 : 48) + 32 * (j / 2);
    const __m256i raw = _mm256_loadu_si256((const __m256i *)qs);
    __m256i c = (j & 1) ? _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4)
                        : _mm256_and_si256(raw, low4);
    if (t == CAIRN_TYPE_Q5_K) {
        /* bit j of qh[l] to bit 4 */
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16));
        const __m256i hb = j < 4 ? _mm256_slli_epi16(qh, 4 - j)
                         : j == 4 ? qh
                                  : _mm256_srli_epi16(qh, j - 4);
        c = _mm256_or_si256(c, _mm256_and_si256(hb, _mm256_set1_epi8(0x10)));
    }
    return c;
}

INLINE T256 void krow_256(const uint8_t *row, cairn_type t, const int8_t *q, const float *d,
                          const int32_t *s, int n_in, const int C, float *y, int n_out)
{
    const int nb = n_in / 32, nsb = n_in / 256;
    const size_t bs = t == CAIRN_TYPE_Q4_K ? 144 : t == CAIRN_TYPE_Q5_K ? 176 : 210;
    __m256 acc[4][2], accm[4];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++)
        acc[c][0] = acc[c][1] = accm[c] = _mm256_setzero_ps();
    for (int sb = 0; sb < nsb; sb++) {
        const uint8_t *blk = row + (size_t)sb * bs;
        for (size_t off = 0; off < bs; off += 64)
            _mm_prefetch((const char *)(blk + KQ_PREFETCH + off), _MM_HINT_T0);
        __m256 fs[4];
        __m128i sc6 = _mm_setzero_si128();
        if (t == CAIRN_TYPE_Q6_K) {
            const __m256 dd = _mm256_set1_ps(half_to_float(blk + 208));
            sc6 = _mm_loadu_si128((const __m128i *)(blk + 192));
#pragma GCC unroll 4
            for (int c = 0; c < C; c++)
                fs[c] = _mm256_mul_ps(dd, _mm256_loadu_ps(d + (size_t)c * nb + 8 * sb));
        } else {
            uint8_t sc[8], mn[8];
            cpu_kq_scales(blk + 4, sc, mn);
            int64_t sc8, mn8;
            memcpy(&sc8, sc, 8);
            memcpy(&mn8, mn, 8);
            const __m256 dsc =
                _mm256_mul_ps(_mm256_set1_ps(half_to_float(blk)),
                              _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(sc8))));
            const __m256i m32 = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(mn8));
            const __m256 dmin = _mm256_set1_ps(half_to_float(blk + 2));
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                const __m256 da = _mm256_loadu_ps(d + (size_t)c * nb + 8 * sb);
                fs[c] = _mm256_mul_ps(dsc, da);
                const __m256i ms = _mm256_mullo_epi32(
                    m32, _mm256_loadu_si256((const __m256i *)(s + (size_t)c * nb + 8 * sb)));
                accm[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ms), _mm256_mul_ps(dmin, da), accm[c]);
            }
        }
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const __m256i u = kq_codes(blk, t, j);
            __m256i scl = _mm256_setzero_si256();
            if (t == CAIRN_TYPE_Q6_K)
                scl = _mm256_cvtepi8_epi32(_mm_shuffle_epi8(
                    sc6, _mm_setr_epi8(2 * j, 2 * j, 2 * j, 2 * j, 2 * j + 1, 2 * j + 1, 2 * j + 1,
                                       2 * j + 1, 0, 0, 0, 0, 0, 0, 0, 0)));
            const __m256i pick = _mm256_set1_epi32(j);
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                const __m256i a = _mm256_loadu_si256(
                    (const __m256i *)(q + (size_t)c * n_in + 256 * (size_t)sb + 32 * j));
                __m256i isum = kq_dot256(u, a);
                if (t == CAIRN_TYPE_Q6_K)
                    isum = _mm256_mullo_epi32(
                        _mm256_sub_epi32(isum, kq_dot256(_mm256_set1_epi8(32), a)), scl);
                acc[c][j & 1] = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(isum), _mm256_permutevar8x32_ps(fs[c], pick), acc[c][j & 1]);
            }
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++)
        y[(size_t)c * n_out] = hsum256(_mm256_add_ps(acc[c][0], acc[c][1])) - hsum256(accm[c]);
}

#define KROW_TYPED(NAME, BODY, ATTR, TYPE)                                                         \
    static __attribute__((noinline)) ATTR void NAME(const uint8_t *row, const int8_t *q,           \
                                                    const float *d, const int32_t *s, int n_in,    \
                                                    int C, float *y, int n_out)                    \
    {                                                                                              \
        switch (C) {                                                                               \
        case 1:                                                                                    \
            BODY(row, TYPE, q, d, s, n_in, 1, y, n_out);                                           \
            break;                                                                                 \
        case 2:                                                                                    \
            BODY(row, TYPE, q, d, s, n_in, 2, y, n_out);                                           \
            break;                                                                                 \
        case 3:                                                                                    \
            BODY(row, TYPE, q, d, s, n_in, 3, y, n_out);                                           \
            break;                                                                                 \
        default:                                                                                   \
            BODY(row, TYPE, q, d, s, n_in, 4, y, n_out);                                           \
            break;                                                                                 \
        }                                                                                          \
    }
KROW_TYPED(krow_256_q4k, krow_256, T256, CAIRN_TYPE_Q4_K)
KROW_TYPED(krow_256_q5k, krow_256, T256, CAIRN_TYPE_Q5_K)
KROW_TYPED(krow_256_q6k, krow_256, T256, CAIRN_TYPE_Q6_K)

/* AVX-512 decode: as krow_256 but two blocks per 512-bit register (the
 * pairs of blocks that share their code bytes: Q4_K/Q5_K blocks 2p, 2p+1
 * are the low and high nibbles of the same 32 bytes, Q6_K quarters k and
 * k+1 of a half likewise), so each vpdpbusd, conversion and FMA covers 64
 * weights; lanes 0-7 belong to the first block, 8-15 to the second. */
INLINE T512 void krow2_512(const uint8_t *row, cairn_type t, const int8_t *q, const float *d,
                           const int32_t *s, int n_in, const int C, float *y, int n_out)
{
    const int nb = n_in / 32, nsb = n_in / 256;
    const size_t bs = t == CAIRN_TYPE_Q4_K ? 144 : t == CAIRN_TYPE_Q5_K ? 176 : 210;
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __m512i zero = _mm512_setzero_si512();
    __m512 acc[4][2];
    __m256 accm[4];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        acc[c][0] = acc[c][1] = _mm512_setzero_ps();
        accm[c] = _mm256_setzero_ps();
    }
    for (int sb = 0; sb < nsb; sb++) {
        const uint8_t *blk = row + (size_t)sb * bs;
        for (size_t off = 0; off < bs; off += 64)
            _mm_prefetch((const char *)(blk + KQ_PREFETCH + off), _MM_HINT_T0);
        __m512 fs[4]; /* per token: the 8 blocks' float scales in lanes 0-7 */
        __m128i sc6 = _mm_setzero_si128();
        if (t == CAIRN_TYPE_Q6_K) {
            const __m256 dd = _mm256_set1_ps(half_to_float(blk + 208));
            sc6 = _mm_loadu_si128((const __m128i *)(blk + 192));
#pragma GCC unroll 4
            for (int c = 0; c < C; c++)
                fs[c] = _mm512_castps256_ps512(
                    _mm256_mul_ps(dd, _mm256_loadu_ps(d + (size_t)c * nb + 8 * sb)));
        } else {
            uint8_t sc[8], mn[8];
            cpu_kq_scales(blk + 4, sc, mn);
            int64_t sc8, mn8;
            memcpy(&sc8, sc, 8);
            memcpy(&mn8, mn, 8);
            const __m256 dsc =
                _mm256_mul_ps(_mm256_set1_ps(half_to_float(blk)),
                              _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(sc8))));
            const __m256i m32 = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(mn8));
            const __m256 dmin = _mm256_set1_ps(half_to_float(blk + 2));
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                const __m256 da = _mm256_loadu_ps(d + (size_t)c * nb + 8 * sb);
                fs[c] = _mm512_castps256_ps512(_mm256_mul_ps(dsc, da));
                const __m256i ms = _mm256_mullo_epi32(
                    m32, _mm256_loadu_si256((const __m256i *)(s + (size_t)c * nb + 8 * sb)));
                accm[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ms), _mm256_mul_ps(dmin, da), accm[c]);
            }
        }
#pragma GCC unroll 4
        for (int pr = 0; pr < 4; pr++) {
            /* blocks 2pr (lanes 0-7) and 2pr + 1 (lanes 8-15) */
            __m512i w;
            __m512i scl = zero;
            if (t == CAIRN_TYPE_Q6_K) {
                const int h = pr / 2, hi = pr % 2; /* hi: quarters 2, 3 of half h */
                const __m512i ql = _mm512_loadu_si512(blk + 64 * h);
                const __m512i qh = _mm512_broadcast_i64x4(
                    _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h)));
                const __m512i lo = hi ? _mm512_and_si512(_mm512_srli_epi16(ql, 4), low4)
                                      : _mm512_and_si512(ql, low4);
                /* quarter k wants bits 2k, 2k+1 at 4, 5: k = 0, 1 shift left
                 * by 4, 2; k = 2, 3 right by 0, 2 */
                const __m512i cnt = _mm512_mask_blend_epi64(
                    0xf0, _mm512_set1_epi16(hi ? 0 : 4), _mm512_set1_epi16(2));
                const __m512i hb = hi ? _mm512_srlv_epi16(qh, cnt) : _mm512_sllv_epi16(qh, cnt);
                w = _mm512_or_si512(lo, _mm512_and_si512(hb, _mm512_set1_epi8(0x30)));
                /* sub-blocks 4pr .. 4pr+3, one per 4 lanes */
                scl = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(
                    sc6, _mm_setr_epi8(4 * pr, 4 * pr, 4 * pr, 4 * pr, 4 * pr + 1, 4 * pr + 1,
                                       4 * pr + 1, 4 * pr + 1, 4 * pr + 2, 4 * pr + 2, 4 * pr + 2,
                                       4 * pr + 2, 4 * pr + 3, 4 * pr + 3, 4 * pr + 3, 4 * pr + 3)));
            } else {
                const uint8_t *qs = blk + (t == CAIRN_TYPE_Q4_K ? 16 : 48) + 32 * pr;
                __m512i raw = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qs));
                raw = _mm512_mask_srli_epi16(raw, 0xffff0000u, raw, 4);
                w = _mm512_and_si512(raw, low4);
                if (t == CAIRN_TYPE_Q5_K) {
                    /* bit j of qh[l] to bit 4, j = 2pr (low half), 2pr + 1 */
                    const __m512i qh = _mm512_broadcast_i64x4(
                        _mm256_loadu_si256((const __m256i *)(blk + 16)));
                    const __m512i hb =
                        pr < 2 ? _mm512_sllv_epi16(
                                     qh, _mm512_mask_blend_epi64(0xf0, _mm512_set1_epi16(4 - 2 * pr),
                                                                 _mm512_set1_epi16(3 - 2 * pr)))
                               : _mm512_srlv_epi16(
                                     qh, _mm512_mask_blend_epi64(0xf0, _mm512_set1_epi16(2 * pr - 4),
                                                                 _mm512_set1_epi16(2 * pr - 3)));
                    w = _mm512_or_si512(w, _mm512_and_si512(hb, _mm512_set1_epi8(0x10)));
                }
            }
            const __m512i pick = _mm512_mask_blend_epi32(0xff00, _mm512_set1_epi32(2 * pr),
                                                         _mm512_set1_epi32(2 * pr + 1));
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                const __m512i a =
                    _mm512_loadu_si512(q + (size_t)c * n_in + 256 * (size_t)sb + 64 * pr);
                __m512i isum = _mm512_dpbusd_epi32(zero, w, a);
                if (t == CAIRN_TYPE_Q6_K)
                    isum = _mm512_mullo_epi32(
                        _mm512_sub_epi32(isum, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(32), a)),
                        scl);
                acc[c][pr & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum),
                                                 _mm512_permutexvar_ps(pick, fs[c]), acc[c][pr & 1]);
            }
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++)
        y[(size_t)c * n_out] =
            _mm512_reduce_add_ps(_mm512_add_ps(acc[c][0], acc[c][1])) - hsum256(accm[c]);
}

KROW_TYPED(krow2_512_q4k, krow2_512, T512, CAIRN_TYPE_Q4_K)
KROW_TYPED(krow2_512_q5k, krow2_512, T512, CAIRN_TYPE_Q5_K)
KROW_TYPED(krow2_512_q6k, krow2_512, T512, CAIRN_TYPE_Q6_K)

/* ---- quantized weights: panel GEMM (prefill, AVX-512 VNNI) --------------- */

/* Repack rows [r, r + 32) (rows from r_end on are zero) into `pk`: for each
 * block, for each 16-row half, 8 groups of [16 rows][4 unsigned codes], then
 * the two halves' 16 float scales. Gathers read 4 code bytes of 16 rows at
 * once. */
T512 static void pack_panel(const uint8_t *W, size_t rb, cairn_type t, int nb, int64_t r,
                            int64_t r_end, uint8_t *pk)
{
    const size_t bs = t == CAIRN_TYPE_Q4_0 ? 18 : t == CAIRN_TYPE_Q5_0 ? 22 : 34;
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                                             12, 13, 14, 15),
                                           _mm512_set1_epi32((int)rb));
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const __m512i low16 = _mm512_set1_epi32(0xffff);
    __mmask16 valid[2];
    for (int p = 0; p < 2; p++) {
        int64_t n = r_end - (r + 16 * p);
        valid[p] = n >= 16 ? 0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
    }
    for (int b = 0; b < nb; b++) {
        uint8_t *out = pk + (size_t)b * QP_BLOCK_BYTES;
        for (int p = 0; p < 2; p++) {
            const uint8_t *base = W + (size_t)(r + 16 * p) * rb + (size_t)b * bs;
            const __mmask16 m = valid[p];
            uint8_t *codes = out + (size_t)p * 512;
            const __m512i zero = _mm512_setzero_si512();
            if (t == CAIRN_TYPE_Q4_0) {
                for (int g = 0; g < 4; g++) {
                    __m512i raw = m ? _mm512_mask_i32gather_epi32(zero, m, idx, base + 2 + 4 * g, 1)
                                    : zero;
                    _mm512_store_si512(codes + 64 * g, _mm512_and_si512(raw, low4));
                    _mm512_store_si512(codes + 64 * (g + 4),
                                       _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4));
                }
            } else if (t == CAIRN_TYPE_Q5_0) {
                /* as Q4_0, plus bit 4 of element e from bit e of each row's
                 * qh: 4 bits (elements 4g..4g+3) are spread to bit 0 of
                 * bytes 0-3 by one multiply (bit k moves by 7k, no two
                 * partial products overlap), then moved to bit 4. */
                const __m512i qhv =
                    m ? _mm512_mask_i32gather_epi32(zero, m, idx, base + 2, 1) : zero;
                const __m512i spread = _mm512_set1_epi32(0x00204081);
                const __m512i bit0s = _mm512_set1_epi32(0x01010101);
                const __m512i nib4 = _mm512_set1_epi32(0xf);
                for (int g = 0; g < 4; g++) {
                    __m512i raw = m ? _mm512_mask_i32gather_epi32(zero, m, idx, base + 6 + 4 * g, 1)
                                    : zero;
                    const __m512i hlo = _mm512_slli_epi32(
                        _mm512_and_si512(_mm512_mullo_epi32(_mm512_and_si512(
                                                                _mm512_srli_epi32(qhv, 4 * g), nib4),
                                                            spread),
                                         bit0s),
                        4);
                    const __m512i hhi = _mm512_slli_epi32(
                        _mm512_and_si512(
                            _mm512_mullo_epi32(
                                _mm512_and_si512(_mm512_srli_epi32(qhv, 16 + 4 * g), nib4), spread),
                            bit0s),
                        4);
                    _mm512_store_si512(codes + 64 * g,
                                       _mm512_or_si512(_mm512_and_si512(raw, low4), hlo));
                    _mm512_store_si512(
                        codes + 64 * (g + 4),
                        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(raw, 4), low4), hhi));
                }
            } else {
                for (int g = 0; g < 8; g++) {
                    __m512i raw = m ? _mm512_mask_i32gather_epi32(zero, m, idx, base + 2 + 4 * g, 1)
                                    : zero;
                    /* rows that do not exist get code 128 = value 0 */
                    _mm512_store_si512(codes + 64 * g, _mm512_xor_si512(raw, flip));
                }
            }
            __m512i dh = m ? _mm512_mask_i32gather_epi32(zero, m, idx, base, 1) : zero;
            __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_and_si512(dh, low16)));
            _mm512_store_ps((float *)(out + 1024 + 64 * p), dw);
        }
    }
}

/* Tokens [t0, t0 + C) against a packed panel: P = 1 or 2 halves of 16 rows
 * are computed (the second half is skipped when no row of it exists). */
INLINE T512 void qgemm_tile(const uint8_t *pk, int nb, const int8_t *q, const float *d,
                            const int32_t *s, int n_in, int zero, const int P, const int C,
                            float *y, int n_out, __mmask16 m0, __mmask16 m1)
{
    __m512 facc[2][QG_TOKENS];
#pragma GCC unroll 2
    for (int p = 0; p < P; p++)
#pragma GCC unroll 6
        for (int c = 0; c < C; c++)
            facc[p][c] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *pb = pk + (size_t)b * QP_BLOCK_BYTES;
        __m512i iacc[2][QG_TOKENS];
#pragma GCC unroll 6
        for (int c = 0; c < C; c++) {
            const __m512i init = _mm512_set1_epi32(-zero * s[(size_t)c * nb + b]);
#pragma GCC unroll 2
            for (int p = 0; p < P; p++)
                iacc[p][c] = init;
        }
        const int8_t *qb = q + 32 * (size_t)b;
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) {
            const __m512i w0 = _mm512_load_si512(pb + 64 * g);
            const __m512i w1 = P > 1 ? _mm512_load_si512(pb + 512 + 64 * g) : w0;
#pragma GCC unroll 6
            for (int c = 0; c < C; c++) {
                int32_t a4;
                memcpy(&a4, qb + (size_t)c * n_in + 4 * g, 4);
                const __m512i a = _mm512_set1_epi32(a4);
                iacc[0][c] = _mm512_dpbusd_epi32(iacc[0][c], w0, a);
                if (P > 1)
                    iacc[1][c] = _mm512_dpbusd_epi32(iacc[1][c], w1, a);
            }
        }
        const __m512 dw0 = _mm512_load_ps((const float *)(pb + 1024));
        const __m512 dw1 = P > 1 ? _mm512_load_ps((const float *)(pb + 1088)) : dw0;
#pragma GCC unroll 6
        for (int c = 0; c < C; c++) {
            const __m512 da = _mm512_set1_ps(d[(size_t)c * nb + b]);
            facc[0][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[0][c]), _mm512_mul_ps(dw0, da),
                                         facc[0][c]);
            if (P > 1)
                facc[1][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[1][c]),
                                             _mm512_mul_ps(dw1, da), facc[1][c]);
        }
    }
#pragma GCC unroll 6
    for (int c = 0; c < C; c++) {
        _mm512_mask_storeu_ps(y + (size_t)c * n_out, m0, facc[0][c]);
        if (P > 1)
            _mm512_mask_storeu_ps(y + (size_t)c * n_out + 16, m1, facc[1][c]);
    }
}

static __attribute__((noinline)) T512 void qgemm_tile_any(const uint8_t *pk, int nb,
                                                          const int8_t *q, const float *d,
                                                          const int32_t *s, int n_in, int zero,
                                                          int P, int C, float *y, int n_out,
                                                          __mmask16 m0, __mmask16 m1)
{
#define QG_CASE(PP, CC)                                                                            \
    case PP * 8 + CC: qgemm_tile(pk, nb, q, d, s, n_in, zero, PP, CC, y, n_out, m0, m1); break;
    switch (P * 8 + C) {
        QG_CASE(1, 1) QG_CASE(1, 2) QG_CASE(1, 3) QG_CASE(1, 4) QG_CASE(1, 5) QG_CASE(1, 6)
        QG_CASE(2, 1) QG_CASE(2, 2) QG_CASE(2, 3) QG_CASE(2, 4) QG_CASE(2, 5)
    default: qgemm_tile(pk, nb, q, d, s, n_in, zero, 2, 6, y, n_out, m0, m1); break;
    }
#undef QG_CASE
}


/* ---- K-quant weights: panel GEMM (prefill, AVX-512 VNNI) ----------------- */

/* The K-quants' panel: per 32-element block, the codes as pack_panel lays
 * them out (2 halves x 8 groups of [16 rows][4 codes], unsigned), then two
 * float vectors per half:
 *   Q4_K/Q5_K  A = d sc_j (scale), B = dmin m_j (min);
 *   Q6_K       A = d sc_2j (first 16 elements), B = d sc_2j+1 (last 16).
 * The tile then computes, per block and token (see cpu_q8act_type):
 *   Q4_K/Q5_K  y += cvt(sum c q) (A d_a) - B (d_a s_a)
 *   Q6_K       y += cvt(sum_lo c q - 32 s_lo) (A d_a)
 *                 + cvt(sum_hi c q - 32 (s_a - s_lo)) (B d_a)
 * with s_lo, the sum of a block's first 16 activation codes, formed in the
 * tile. */
#define KP_BLOCK_BYTES (2 * 8 * 64 + 4 * 64)

T512 static void pack_panel_k(const uint8_t *W, size_t rb, cairn_type t, int nb, int64_t r,
                              int64_t r_end, uint8_t *pk)
{
    const size_t bs = t == CAIRN_TYPE_Q4_K ? 144 : t == CAIRN_TYPE_Q5_K ? 176 : 210;
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                                             12, 13, 14, 15),
                                           _mm512_set1_epi32((int)rb));
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __m512i zero = _mm512_setzero_si512();
    __mmask16 valid[2];
    for (int p = 0; p < 2; p++) {
        int64_t n = r_end - (r + 16 * p);
        valid[p] = n >= 16 ? 0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
    }
    for (int b = 0; b < nb; b++) {
        uint8_t *out = pk + (size_t)b * KP_BLOCK_BYTES;
        const int sb = b / 8, j = b % 8;
        for (int p = 0; p < 2; p++) {
            const __mmask16 m = valid[p];
            const uint8_t *base = W + (size_t)(r + 16 * p) * rb + (size_t)sb * bs;
            uint8_t *codes = out + (size_t)p * 512;
            for (int g = 0; g < 8; g++) {
                __m512i c;
                if (t == CAIRN_TYPE_Q6_K) {
                    const int h = j / 4, k = j % 4;
                    const __m512i ql = m ? _mm512_mask_i32gather_epi32(
                                               zero, m, idx, base + 64 * h + 32 * (k & 1) + 4 * g, 1)
                                         : zero;
                    const __m512i qh =
                        m ? _mm512_mask_i32gather_epi32(zero, m, idx, base + 128 + 32 * h + 4 * g, 1)
                          : zero;
                    c = k < 2 ? _mm512_and_si512(ql, low4)
                              : _mm512_and_si512(_mm512_srli_epi16(ql, 4), low4);
                    /* bits 2k, 2k+1 to bits 4, 5 (32-bit shifts: the mask
                     * keeps only bits that stayed in their byte) */
                    const __m512i hb = 2 * k <= 4 ? _mm512_slli_epi32(qh, 4 - 2 * k)
                                                  : _mm512_srli_epi32(qh, 2 * k - 4);
                    c = _mm512_or_si512(c, _mm512_and_si512(hb, _mm512_set1_epi8(0x30)));
                } else {
                    const size_t qs = t == CAIRN_TYPE_Q4_K ? 16 : 48;
                    const __m512i raw =
                        m ? _mm512_mask_i32gather_epi32(zero, m, idx,
                                                        base + qs + 32 * (j / 2) + 4 * g, 1)
                          : zero;
                    c = (j & 1) ? _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4)
                                : _mm512_and_si512(raw, low4);
                    if (t == CAIRN_TYPE_Q5_K) {
                        const __m512i qh =
                            m ? _mm512_mask_i32gather_epi32(zero, m, idx, base + 16 + 4 * g, 1)
                              : zero;
                        const __m512i hb = j <= 4 ? _mm512_slli_epi32(qh, 4 - j)
                                                  : _mm512_srli_epi32(qh, j - 4);
                        c = _mm512_or_si512(c, _mm512_and_si512(hb, _mm512_set1_epi8(0x10)));
                    }
                }
                _mm512_store_si512(codes + 64 * g, c);
            }
            float *A = (float *)(out + 1024 + 64 * p), *B = (float *)(out + 1152 + 64 * p);
            for (int i = 0; i < 16; i++) {
                if (!(m >> i & 1)) {
                    A[i] = B[i] = 0.0f;
                    continue;
                }
                const uint8_t *blk = base + (size_t)i * rb;
                if (t == CAIRN_TYPE_Q6_K) {
                    const float dd = half_to_float(blk + 208);
                    A[i] = dd * (float)(int8_t)blk[192 + 2 * j];
                    B[i] = dd * (float)(int8_t)blk[192 + 2 * j + 1];
                } else {
                    uint8_t sc[8], mn[8];
                    cpu_kq_scales(blk + 4, sc, mn);
                    A[i] = half_to_float(blk) * (float)sc[j];
                    B[i] = half_to_float(blk + 2) * (float)mn[j];
                }
            }
        }
    }
}

/* Tokens [t0, t0 + C) against a K panel (see pack_panel_k); P halves. */
INLINE T512 void kgemm_tile(const uint8_t *pk, int nb, const int8_t *q, const float *d,
                            const int32_t *s, int n_in, const int six, const int P, const int C,
                            float *y, int n_out, __mmask16 m0, __mmask16 m1)
{
    __m512 facc[2][QG_TOKENS];
#pragma GCC unroll 2
    for (int p = 0; p < P; p++)
#pragma GCC unroll 6
        for (int c = 0; c < C; c++)
            facc[p][c] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *pb = pk + (size_t)b * KP_BLOCK_BYTES;
        const int8_t *qb = q + 32 * (size_t)b;
        const __m512 A0 = _mm512_load_ps((const float *)(pb + 1024));
        const __m512 A1 = P > 1 ? _mm512_load_ps((const float *)(pb + 1088)) : A0;
        const __m512 B0 = _mm512_load_ps((const float *)(pb + 1152));
        const __m512 B1 = P > 1 ? _mm512_load_ps((const float *)(pb + 1216)) : B0;
        /* Q6_K: two passes of 4 groups (the two 16-element sub-blocks);
         * Q4_K/Q5_K: one pass of 8 */
        for (int part = 0; part < (six ? 2 : 1); part++) {
            __m512i iacc[2][QG_TOKENS];
            int32_t zs[QG_TOKENS];
#pragma GCC unroll 6
            for (int c = 0; c < C; c++) {
                zs[c] = 0;
                if (six) {
                    /* sum of this half's 16 activation codes, times 32 */
                    const __m128i a16 = _mm_loadu_si128((const __m128i *)(qb + (size_t)c * n_in +
                                                                          16 * part));
                    const __m128i sad =
                        _mm_sad_epu8(_mm_xor_si128(a16, _mm_set1_epi8((char)0x80)),
                                     _mm_setzero_si128());
                    zs[c] = 32 * (_mm_cvtsi128_si32(sad) + _mm_extract_epi16(sad, 4) - 16 * 128);
                }
#pragma GCC unroll 2
                for (int p = 0; p < P; p++)
                    iacc[p][c] = _mm512_set1_epi32(-zs[c]);
            }
            for (int g = 4 * part; g < (six ? 4 * part + 4 : 8); g++) {
                const __m512i w0 = _mm512_load_si512(pb + 64 * g);
                const __m512i w1 = P > 1 ? _mm512_load_si512(pb + 512 + 64 * g) : w0;
#pragma GCC unroll 6
                for (int c = 0; c < C; c++) {
                    int32_t a4;
                    memcpy(&a4, qb + (size_t)c * n_in + 4 * g, 4);
                    const __m512i a = _mm512_set1_epi32(a4);
                    iacc[0][c] = _mm512_dpbusd_epi32(iacc[0][c], w0, a);
                    if (P > 1)
                        iacc[1][c] = _mm512_dpbusd_epi32(iacc[1][c], w1, a);
                }
            }
#pragma GCC unroll 6
            for (int c = 0; c < C; c++) {
                const float dab = d[(size_t)c * nb + b];
                const __m512 da = _mm512_set1_ps(dab);
                if (six) {
                    const __m512 sc0 = part ? B0 : A0, sc1 = part ? B1 : A1;
                    facc[0][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[0][c]),
                                                 _mm512_mul_ps(sc0, da), facc[0][c]);
                    if (P > 1)
                        facc[1][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[1][c]),
                                                     _mm512_mul_ps(sc1, da), facc[1][c]);
                } else {
                    const __m512 das = _mm512_set1_ps(-dab * (float)s[(size_t)c * nb + b]);
                    facc[0][c] = _mm512_fmadd_ps(
                        B0, das,
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[0][c]), _mm512_mul_ps(A0, da),
                                        facc[0][c]));
                    if (P > 1)
                        facc[1][c] = _mm512_fmadd_ps(
                            B1, das,
                            _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[1][c]), _mm512_mul_ps(A1, da),
                                            facc[1][c]));
                }
            }
        }
    }
#pragma GCC unroll 6
    for (int c = 0; c < C; c++) {
        _mm512_mask_storeu_ps(y + (size_t)c * n_out, m0, facc[0][c]);
        if (P > 1)
            _mm512_mask_storeu_ps(y + (size_t)c * n_out + 16, m1, facc[1][c]);
    }
}

static __attribute__((noinline)) T512 void kgemm_tile_any(const uint8_t *pk, int nb,
                                                          const int8_t *q, const float *d,
                                                          const int32_t *s, int n_in, int six,
                                                          int P, int C, float *y, int n_out,
                                                          __mmask16 m0, __mmask16 m1)
{
#define KG_CASE(SIX, PP, CC)                                                                       \
    case SIX * 64 + PP * 8 + CC:                                                                   \
        kgemm_tile(pk, nb, q, d, s, n_in, SIX, PP, CC, y, n_out, m0, m1);                          \
        break;
    switch (six * 64 + P * 8 + C) {
        KG_CASE(0, 1, 1) KG_CASE(0, 1, 2) KG_CASE(0, 1, 3) KG_CASE(0, 1, 4) KG_CASE(0, 1, 5)
        KG_CASE(0, 1, 6) KG_CASE(0, 2, 1) KG_CASE(0, 2, 2) KG_CASE(0, 2, 3) KG_CASE(0, 2, 4)
        KG_CASE(0, 2, 5) KG_CASE(0, 2, 6)
        KG_CASE(1, 1, 1) KG_CASE(1, 1, 2) KG_CASE(1, 1, 3) KG_CASE(1, 1, 4) KG_CASE(1, 1, 5)
        KG_CASE(1, 1, 6) KG_CASE(1, 2, 1) KG_CASE(1, 2, 2) KG_CASE(1, 2, 3) KG_CASE(1, 2, 4)
        KG_CASE(1, 2, 5)
    default: kgemm_tile(pk, nb, q, d, s, n_in, 1, 2, 6, y, n_out, m0, m1); break;
    }
#undef KG_CASE
}

static T512 void matmul_kgemm(cairn_type wtype, float *y, const uint8_t *W, size_t row_bytes,
                              const int8_t *q, const float *d, const int32_t *s, int T, int n_in,
                              int n_out, int64_t r0, int64_t r1, void *pack)
{
    const int nb = n_in / 32, six = wtype == CAIRN_TYPE_Q6_K;
    for (int64_t r = r0; r < r1; r += QP_ROWS) {
        const int64_t rows = r1 - r < QP_ROWS ? r1 - r : QP_ROWS;
        pack_panel_k(W, row_bytes, wtype, nb, r, r + rows, pack);
        const int P = rows > 16 ? 2 : 1;
        const __mmask16 m0 = rows >= 16 ? 0xffff : (__mmask16)((1u << rows) - 1);
        const __mmask16 m1 = rows >= 32 ? 0xffff
                           : rows > 16 ? (__mmask16)((1u << (rows - 16)) - 1)
                           : 0;
        for (int t = 0; t < T; t += QG_TOKENS) {
            const int C = T - t < QG_TOKENS ? T - t : QG_TOKENS;
            kgemm_tile_any(pack, nb, q + (size_t)t * n_in, d + (size_t)t * nb, s + (size_t)t * nb,
                           n_in, six, P, C, y + (size_t)t * n_out + r, n_out, m0, m1);
        }
    }
}

size_t cpu_x86_pack_bytes(int n_in)
{
    return (size_t)(n_in / 32) * (KP_BLOCK_BYTES > QP_BLOCK_BYTES ? KP_BLOCK_BYTES : QP_BLOCK_BYTES);
}

int cpu_x86_q8act_rows_per_item(cpu_isa isa, int T)
{
    return isa >= CPU_ISA_AVX512 && T >= QG_MIN_T ? QP_ROWS : 16;
}

int cpu_x86_matmul_q8act(cpu_isa isa, float *y, const uint8_t *W, cairn_type wtype,
                         size_t row_bytes, const int8_t *q, const float *d, const int32_t *s,
                         int T, int n_in, int n_out, int64_t r0, int64_t r1, void *pack)
{
    if (isa < CPU_ISA_AVX2 || !cpu_q8act_type(wtype))
        return 0;
    const int nb = n_in / 32;
    const int k_quant =
        wtype == CAIRN_TYPE_Q4_K || wtype == CAIRN_TYPE_Q5_K || wtype == CAIRN_TYPE_Q6_K;
    if (k_quant && isa >= CPU_ISA_AVX512 && T >= QG_MIN_T) {
        matmul_kgemm(wtype, y, W, row_bytes, q, d, s, T, n_in, n_out, r0, r1, pack);
        return 1;
    }
    if (k_quant) {
        qrow_fn fn = isa >= CPU_ISA_AVX512
                         ? (wtype == CAIRN_TYPE_Q4_K ? krow2_512_q4k
                            : wtype == CAIRN_TYPE_Q5_K ? krow2_512_q5k
                                                       : krow2_512_q6k)
                         : (wtype == CAIRN_TYPE_Q4_K ? krow_256_q4k
                            : wtype == CAIRN_TYPE_Q5_K ? krow_256_q5k
                                                       : krow_256_q6k);
        for (int64_t r = r0; r < r1; r++)
            for (int t = 0; t < T; t += 4) {
                const int C = T - t < 4 ? T - t : 4;
                fn(W + (size_t)r * row_bytes, q + (size_t)t * n_in, d + (size_t)t * nb,
                   s + (size_t)t * nb, n_in, C, y + (size_t)t * n_out + r, n_out);
            }
        return 1;
    }
    if (isa >= CPU_ISA_AVX512 && T >= QG_MIN_T) {
        const int zero = wtype == CAIRN_TYPE_Q4_0 ? Q4_ZERO
                       : wtype == CAIRN_TYPE_Q5_0 ? Q5_ZERO
                       : Q8_ZERO;
        for (int64_t r = r0; r < r1; r += QP_ROWS) {
            const int64_t rows = r1 - r < QP_ROWS ? r1 - r : QP_ROWS;
            pack_panel(W, row_bytes, wtype, nb, r, r + rows, pack);
            const int P = rows > 16 ? 2 : 1;
            const __mmask16 m0 = rows >= 16 ? 0xffff : (__mmask16)((1u << rows) - 1);
            const __mmask16 m1 = rows >= 32 ? 0xffff
                               : rows > 16 ? (__mmask16)((1u << (rows - 16)) - 1)
                               : 0;
            for (int t = 0; t < T; t += QG_TOKENS) {
                const int C = T - t < QG_TOKENS ? T - t : QG_TOKENS;
                qgemm_tile_any(pack, nb, q + (size_t)t * n_in, d + (size_t)t * nb,
                               s + (size_t)t * nb, n_in, zero, P, C, y + (size_t)t * n_out + r,
                               n_out, m0, m1);
            }
        }
        return 1;
    }
    if (isa >= CPU_ISA_AVX512) {
        /* the row kernels, QD_TOKENS tokens per call (T < QG_MIN_T: one call) */
        void (*fn)(const uint8_t *, size_t, int64_t, int64_t, const int8_t *, const float *,
                   const int32_t *, int, int, float *, int) =
            wtype == CAIRN_TYPE_Q4_0 ? qrows_512_q4
          : wtype == CAIRN_TYPE_Q5_0 ? qrows_512_q5
          : qrows_512_q8;
        for (int t = 0; t < T; t += QD_TOKENS) {
            const int C = T - t < QD_TOKENS ? T - t : QD_TOKENS;
            fn(W, row_bytes, r0, r1, q + (size_t)t * n_in, d + (size_t)t * nb,
               s + (size_t)t * nb, n_in, C, y + (size_t)t * n_out, n_out);
        }
        return 1;
    }
    qrow_fn fn = wtype == CAIRN_TYPE_Q4_0 ? qrow_256_q4
               : wtype == CAIRN_TYPE_Q5_0 ? qrow_256_q5
               : qrow_256_q8;
    for (int64_t r = r0; r < r1; r++)
        for (int t = 0; t < T; t += 4) {
            const int C = T - t < 4 ? T - t : 4;
            fn(W + (size_t)r * row_bytes, q + (size_t)t * n_in, d + (size_t)t * nb,
               s + (size_t)t * nb, n_in, C, y + (size_t)t * n_out + r, n_out);
        }
    return 1;
}

/* ---- attention helpers ----------------------------------------------------- */

static T512 float dot_kv_f16_512(const float *q, const void *k, int n)
{
    const uint16_t *kh = k;
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i),
                              _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kh + i))), acc);
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + i),
                              _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, kh + i)), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

static T512 float dot_kv_f32_512(const float *q, const void *k, int n)
{
    const float *kf = k;
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(kf + i), acc);
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + i), _mm512_maskz_loadu_ps(m, kf + i),
                              acc);
    }
    return _mm512_reduce_add_ps(acc);
}

static T512 void axpy_kv_f16_512(float *acc, float w, const void *v, int n)
{
    const uint16_t *vh = v;
    const __m512 wv = _mm512_set1_ps(w);
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(acc + i,
                         _mm512_fmadd_ps(wv, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(vh + i))),
                                         _mm512_loadu_ps(acc + i)));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(acc + i, m,
                              _mm512_fmadd_ps(wv, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, vh + i)),
                                              _mm512_maskz_loadu_ps(m, acc + i)));
    }
}

static T512 void axpy_kv_f32_512(float *acc, float w, const void *v, int n)
{
    const float *vf = v;
    const __m512 wv = _mm512_set1_ps(w);
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(acc + i, _mm512_fmadd_ps(wv, _mm512_loadu_ps(vf + i), _mm512_loadu_ps(acc + i)));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(acc + i, m,
                              _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, vf + i),
                                              _mm512_maskz_loadu_ps(m, acc + i)));
    }
}

static T256 float dot_kv_f16_256(const float *q, const void *k, int n)
{
    const uint16_t *kh = k;
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i),
                              _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kh + i))), acc);
    float sum = hsum256(acc);
    for (; i < n; i++)
        sum = fmaf(q[i], cpu_half_to_float(kh[i]), sum);
    return sum;
}

static T256 void axpy_kv_f16_256(float *acc, float w, const void *v, int n)
{
    const uint16_t *vh = v;
    const __m256 wv = _mm256_set1_ps(w);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(acc + i,
                         _mm256_fmadd_ps(wv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vh + i))),
                                         _mm256_loadu_ps(acc + i)));
    for (; i < n; i++)
        acc[i] = fmaf(w, cpu_half_to_float(vh[i]), acc[i]);
}

/* e^x for 16 lanes: x = n ln2 + r with |r| <= ln2/2, e^r by its Taylor
 * series to r^7 (truncation error below 2^-27 relative), then scaled by
 * 2^n. Within 2 ulp of expf; -inf and x < -110 give 0, x > 89 gives inf
 * (NaN stays NaN). */
INLINE T512 __m512 exp_512(__m512 x)
{
    /* e^-110 rounds to 0 and e^89 overflows; clamping keeps r and n sane */
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-110.0f)), _mm512_set1_ps(89.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* ln2 split in two so n * ln2_hi is exact */
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* A K or V row of `hd` elements (F16 or F32) as floats into v[hd/16]. */
INLINE T512 void load_kv_row(const uint8_t *p, int hd, int f16, __m512 *v)
{
#pragma GCC unroll 16
    for (int i = 0; i < hd / 16; i++)
        v[i] = f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32 * (size_t)i)))
                   : _mm512_loadu_ps((const float *)(p + 64 * (size_t)i));
}

/* HD and GC: the head size and group size when known at compile time (0:
 * read them from g). With both known, the loops unroll, K/V rows and — when
 * they fit, GC * HD / 16 <= 16 registers — the output accumulators stay in
 * registers; the arithmetic per element is the same either way. */
INLINE T512 void attend_group_512(const cpu_attn_group *g, const int f16, const int HD,
                                  const int GC)
{
    const cairn_kv_layout *L = g->L;
    const int hd = HD ? HD : L->head_dim, ps = L->page_size, G = GC ? GC : g->group;
    const size_t k_off = cairn_kv_offset(L, g->layer, 0, 0) + g->head_off;
    const size_t v_off = cairn_kv_offset(L, g->layer, 1, 0) + g->head_off;
    float *scores = g->scratch;                           /* [G][n_pad]  */
    const size_t n_pad = ((size_t)g->n_scan + 15) / 16 * 16;
    float *q = scores + (size_t)G * n_pad;                /* [G][hd]     */
    float *acc = q + (size_t)G * hd;                      /* [G][hd]     */
    memcpy(q, g->q, sizeof(float) * (size_t)G * hd);
    float max[64];
    for (int h = 0; h < G; h++)
        max[h] = -INFINITY;
    int any = 0;
    __m512 kv[16];

    /* Pass 1: each visible K row is converted once and scored against
     * every query head of the group. */
    for (int j = 0, page_i = 0, row = 0; j < g->n_scan; j++) {
        if (g->mask && !g->mask[j]) {
            for (int h = 0; h < G; h++)
                scores[(size_t)h * n_pad + j] = -INFINITY; /* weight 0 below */
        } else {
            const uint8_t *k = g->pool + (size_t)g->pages[page_i] * L->page_bytes + k_off +
                               (size_t)row * L->row_bytes;
            load_kv_row(k, hd, f16, kv);
#pragma GCC unroll 4
            for (int h = 0; h < G; h++) {
                const float *qh = q + (size_t)h * hd;
                __m512 a = _mm512_mul_ps(_mm512_loadu_ps(qh), kv[0]);
#pragma GCC unroll 16
                for (int i = 1; i < hd / 16; i++)
                    a = _mm512_fmadd_ps(_mm512_loadu_ps(qh + 16 * i), kv[i], a);
                const float s = _mm512_reduce_add_ps(a) * g->scale;
                scores[(size_t)h * n_pad + j] = s;
                max[h] = s > max[h] ? s : max[h];
            }
            any = 1;
        }
        if (++row == ps) {
            row = 0;
            page_i++;
        }
    }

    /* Pass 2: softmax weights, 16 at a time (masked entries hold -inf and
     * get 0; so do the padding lanes), then the weighted sum of V rows. */
    float sum[64];
    for (int h = 0; h < G; h++)
        sum[h] = 0.0f;
    const int in_regs = GC && HD && GC * HD / 16 <= 16;
    __m512 ar[16];
    if (in_regs) {
#pragma GCC unroll 16
        for (int i = 0; i < G * hd / 16; i++)
            ar[i] = _mm512_setzero_ps();
    } else {
        memset(acc, 0, sizeof(float) * (size_t)G * hd);
    }
    if (any) {
        for (int h = 0; h < G; h++) {
            float *sh = scores + (size_t)h * n_pad;
            const __m512 mh = _mm512_set1_ps(max[h]);
            __m512 sv = _mm512_setzero_ps();
            for (int j = 0; j < g->n_scan; j += 16) {
                const __mmask16 m = g->n_scan - j >= 16 ? 0xffff
                                  : (__mmask16)((1u << (g->n_scan - j)) - 1);
                const __m512 w = _mm512_maskz_mov_ps(
                    m, exp_512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sh + j), mh)));
                _mm512_storeu_ps(sh + j, w);
                sv = _mm512_add_ps(sv, w);
            }
            sum[h] = _mm512_reduce_add_ps(sv);
        }
        for (int j = 0, page_i = 0, row = 0; j < g->n_scan; j++) {
            if (!g->mask || g->mask[j]) {
                const uint8_t *v = g->pool + (size_t)g->pages[page_i] * L->page_bytes + v_off +
                                   (size_t)row * L->row_bytes;
                load_kv_row(v, hd, f16, kv);
#pragma GCC unroll 4
                for (int h = 0; h < G; h++) {
                    const __m512 wv = _mm512_set1_ps(scores[(size_t)h * n_pad + j]);
                    if (in_regs) {
#pragma GCC unroll 16
                        for (int i = 0; i < hd / 16; i++)
                            ar[h * (hd / 16) + i] = _mm512_fmadd_ps(wv, kv[i], ar[h * (hd / 16) + i]);
                    } else {
                        float *ah = acc + (size_t)h * hd;
                        for (int i = 0; i < hd / 16; i++)
                            _mm512_storeu_ps(ah + 16 * i, _mm512_fmadd_ps(wv, kv[i],
                                                                          _mm512_loadu_ps(ah + 16 * i)));
                    }
                }
            }
            if (++row == ps) {
                row = 0;
                page_i++;
            }
        }
    }
    if (in_regs) {
#pragma GCC unroll 16
        for (int i = 0; i < G * hd / 16; i++)
            _mm512_storeu_ps(acc + 16 * i, ar[i]);
    }
    for (int h = 0; h < G; h++) {
        const float inv = sum[h] > 0.0f ? 1.0f / sum[h] : 0.0f;
        const __m512 iv = _mm512_set1_ps(inv);
        for (int i = 0; i < hd / 16; i++)
            _mm512_storeu_ps(g->out + (size_t)h * hd + 16 * i,
                             _mm512_mul_ps(_mm512_loadu_ps(acc + (size_t)h * hd + 16 * i), iv));
    }
}

#define ATTEND_FN(NAME, F16, HD, GC)                                                               \
    static T512 void NAME(const cpu_attn_group *g) { attend_group_512(g, F16, HD, GC); }
ATTEND_FN(attend_f16_any, 1, 0, 0)
ATTEND_FN(attend_f32_any, 0, 0, 0)
ATTEND_FN(attend_f16_64x1, 1, 64, 1)
ATTEND_FN(attend_f16_64x2, 1, 64, 2)
ATTEND_FN(attend_f16_64x3, 1, 64, 3)
ATTEND_FN(attend_f16_64x4, 1, 64, 4)
ATTEND_FN(attend_f16_128x1, 1, 128, 1)
ATTEND_FN(attend_f16_128x2, 1, 128, 2)
ATTEND_FN(attend_f32_64x1, 0, 64, 1)
ATTEND_FN(attend_f32_64x2, 0, 64, 2)
ATTEND_FN(attend_f32_64x3, 0, 64, 3)
ATTEND_FN(attend_f32_64x4, 0, 64, 4)
ATTEND_FN(attend_f32_128x1, 0, 128, 1)
ATTEND_FN(attend_f32_128x2, 0, 128, 2)

cpu_attend_group_fn cpu_x86_attend_group(cpu_isa isa, const cairn_kv_layout *L, int group)
{
    if (isa < CPU_ISA_AVX512 || L->head_dim % 16 != 0 || L->head_dim > 256 || group > 64)
        return NULL;
    const int f16 = L->dtype == CAIRN_TYPE_F16;
    if (L->head_dim == 64 && group >= 1 && group <= 4) {
        static const cpu_attend_group_fn h64[2][4] = {
            {attend_f32_64x1, attend_f32_64x2, attend_f32_64x3, attend_f32_64x4},
            {attend_f16_64x1, attend_f16_64x2, attend_f16_64x3, attend_f16_64x4},
        };
        return h64[f16][group - 1];
    }
    if (L->head_dim == 128 && group >= 1 && group <= 2) {
        static const cpu_attend_group_fn h128[2][2] = {
            {attend_f32_128x1, attend_f32_128x2},
            {attend_f16_128x1, attend_f16_128x2},
        };
        return h128[f16][group - 1];
    }
    return f16 ? attend_f16_any : attend_f32_any;
}

cpu_dot_kv_fn cpu_x86_dot_kv(cpu_isa isa, cairn_type dtype)
{
    if (isa >= CPU_ISA_AVX512)
        return dtype == CAIRN_TYPE_F16 ? dot_kv_f16_512 : dot_kv_f32_512;
    if (isa >= CPU_ISA_AVX2 && dtype == CAIRN_TYPE_F16)
        return dot_kv_f16_256;
    return NULL;
}

cpu_axpy_kv_fn cpu_x86_axpy_kv(cpu_isa isa, cairn_type dtype)
{
    if (isa >= CPU_ISA_AVX512)
        return dtype == CAIRN_TYPE_F16 ? axpy_kv_f16_512 : axpy_kv_f32_512;
    if (isa >= CPU_ISA_AVX2 && dtype == CAIRN_TYPE_F16)
        return axpy_kv_f16_256;
    return NULL;
}

/* ---- element-wise helpers ------------------------------------------------ */

/* F32 -> F16 with the rounding of cairn_fp32_to_fp16 (nearest even, with
 * subnormals, overflow to inf); NaNs become its canonical quiet NaN. */
static T512 void f32_to_f16_512(uint16_t *dst, const float *src, int n)
{
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    for (int i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 x = _mm512_maskz_loadu_ps(m, src + i);
        __m256i h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
        if (nan) {
            const __m256i signs = _mm512_cvtepi32_epi16(
                _mm512_srli_epi32(_mm512_and_si512(_mm512_castps_si512(x), sign), 16));
            h = _mm256_mask_mov_epi16(h, nan, _mm256_or_si256(signs, _mm256_set1_epi16(0x7e00)));
        }
        _mm256_mask_storeu_epi16(dst + i, m, h);
    }
}

int cpu_x86_f32_to_f16(cpu_isa isa, uint16_t *dst, const float *src, int n)
{
    if (isa < CPU_ISA_AVX512)
        return 0;
    f32_to_f16_512(dst, src, n);
    return 1;
}

/* out = silu(g) * u with silu(g) = g / (1 + e^-g), the scalar kernel's
 * expression with a vector exponential. */
static T512 void swiglu_512(float *out, const float *g, const float *u, int64_t n)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
        const __m512 e = exp_512(_mm512_sub_ps(_mm512_setzero_ps(), gv));
        const __m512 silu = _mm512_div_ps(gv, _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, u + i)));
    }
}

int cpu_x86_swiglu(cpu_isa isa, float *out, const float *g, const float *u, int64_t n)
{
    if (isa < CPU_ISA_AVX512)
        return 0;
    swiglu_512(out, g, u, n);
    return 1;
}

#else /* not x86-64: the scalar reference kernels do everything */

int cpu_x86_quantize_act(cpu_isa isa, const float *x, int n, int8_t *q, float *d, int32_t *s)
{
    (void)isa, (void)x, (void)n, (void)q, (void)d, (void)s;
    return 0;
}
int cpu_x86_matmul_float(cpu_isa isa, float *y, const uint8_t *W, cairn_type wtype,
                         size_t row_bytes, const float *x, int T, int n_in, int n_out, int64_t r0,
                         int64_t r1, float *panel)
{
    (void)isa, (void)y, (void)W, (void)wtype, (void)row_bytes, (void)x, (void)T, (void)n_in;
    (void)n_out, (void)r0, (void)r1, (void)panel;
    return 0;
}
size_t cpu_x86_float_panel_floats(cpu_isa isa, int T, int n_in)
{
    (void)isa, (void)T, (void)n_in;
    return 0;
}
int cpu_x86_float_rows_per_item(cpu_isa isa, int T)
{
    (void)isa, (void)T;
    return 4;
}
int cpu_x86_matmul_q8act(cpu_isa isa, float *y, const uint8_t *W, cairn_type wtype,
                         size_t row_bytes, const int8_t *q, const float *d, const int32_t *s,
                         int T, int n_in, int n_out, int64_t r0, int64_t r1, void *pack)
{
    (void)isa, (void)y, (void)W, (void)wtype, (void)row_bytes, (void)q, (void)d, (void)s;
    (void)T, (void)n_in, (void)n_out, (void)r0, (void)r1, (void)pack;
    return 0;
}
size_t cpu_x86_pack_bytes(int n_in)
{
    (void)n_in;
    return 0;
}
int cpu_x86_q8act_rows_per_item(cpu_isa isa, int T)
{
    (void)isa, (void)T;
    return 16;
}
cpu_dot_kv_fn cpu_x86_dot_kv(cpu_isa isa, cairn_type dtype)
{
    (void)isa, (void)dtype;
    return NULL;
}
cpu_axpy_kv_fn cpu_x86_axpy_kv(cpu_isa isa, cairn_type dtype)
{
    (void)isa, (void)dtype;
    return NULL;
}
cpu_attend_group_fn cpu_x86_attend_group(cpu_isa isa, const cairn_kv_layout *L, int group)
{
    (void)isa, (void)L, (void)group;
    return NULL;
}
int cpu_x86_f32_to_f16(cpu_isa isa, uint16_t *dst, const float *src, int n)
{
    (void)isa, (void)dst, (void)src, (void)n;
    return 0;
}
int cpu_x86_swiglu(cpu_isa isa, float *out, const float *g, const float *u, int64_t n)
{
    (void)isa, (void)out, (void)g, (void)u, (void)n;
    return 0;
}
#endif
