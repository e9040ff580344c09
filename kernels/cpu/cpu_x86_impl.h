/*
 * kernels/cpu/cpu_x86_impl.h — what the cpu_x86*.c files share, and only
 * they include: the target attributes, the panel geometry that the
 * dispatcher (cpu_x86.c) and the quantized GEMMs must agree on, the small
 * inline helpers every kernel family uses, and the entry points of the
 * quantized families that cpu_x86.c dispatches to.
 *
 * Target attributes are per function, never per file (no #pragma GCC
 * target, no -m flags on the files): every kernel is declared with T512 or
 * T256, so the build needs no -march and cpu_isa_detect() picks the level
 * at run time. A new file of kernels includes this header and marks each of
 * its functions the same way; plain C functions (dispatch, loops over rows)
 * stay unmarked and only call the marked ones.
 *
 * Off x86-64 (or with a compiler without these attributes) CPU_X86_KERNELS
 * is 0, nothing below it is defined, and each file compiles its entry
 * points to stubs that report "not handled".
 */
#ifndef CAIRN_KERNELS_CPU_X86_IMPL_H
#define CAIRN_KERNELS_CPU_X86_IMPL_H

#include <string.h>

#include "kernels/cpu/cpu_impl.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CPU_X86_KERNELS 1
#else
#define CPU_X86_KERNELS 0
#endif

#if CPU_X86_KERNELS

#include <immintrin.h>

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define T256 __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

/* Panel of the quantized GEMM: 32 rows (2 x 16); per block 2 x 8 groups of
 * [16 rows][4 codes] then 2 x 16 float weight scales (Q8_0/Q4_0/Q5_0,
 * cpu_x86_quant.c), for Q4_Z then also 2 x 16 int32 zeros, or then 4 x 16
 * floats (the K-quants' scales and mins, layout at pack_panel_k in
 * cpu_x86_kquant.c). */
#define QP_ROWS 32
#define QP_BLOCK_BYTES (2 * 8 * 64 + 2 * 64)
#define QZ_BLOCK_BYTES (2 * 8 * 64 + 4 * 64)
#define KP_BLOCK_BYTES (2 * 8 * 64 + 4 * 64)
/* Tokens per GEMM tile. On AVX-512 every batch size computes each output
 * with the panel GEMM's sequence of operations (integer block sums, one
 * FMA per block in block order, 16 rows a lane), whether the token is
 * alone, among other requests' tokens or in any prompt chunk, so batching
 * never changes a result. A single token (decode) takes its own kernels
 * (gemv_* in cpu_x86_quant.c and cpu_x86_kquant.c), which skip the panel
 * and form the same block sums another way (exact integers), then do the
 * same float operations per lane: bitwise the panel's result. (Row-at-a-
 * time decode kernels with float sums in another order were used below 4
 * tokens once: a request decoded alone and in a batch differed in the last
 * bits.) */
#define QG_TOKENS 6

static inline float half_to_float(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return cpu_half_to_float(h);
}

/* Sum of the 8 lanes in a fixed order. */
INLINE T256 float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* In-register transpose of a 16 x 16 matrix of 32-bit elements: v[i] holds
 * row i on entry; on return v[k] holds element k of every row, row i in
 * lane i. The panel packers use it instead of gathers: each row's codes
 * are read with plain contiguous loads (a stream the hardware prefetcher
 * follows) and turned into [16 rows][4 codes] groups here, at 64 shuffles
 * per 16 x 64 bytes where 16 gathers cost several times that. */
INLINE T512 void transpose16_epi32(__m512i v[16])
{
    __m512i x[16];
    /* pairs of rows, then quads: x[4R + e] lane L = rows 4R..4R+3 at
     * element 4L + e */
    for (int R = 0; R < 4; R++) {
        const __m512i lo01 = _mm512_unpacklo_epi32(v[4 * R], v[4 * R + 1]);
        const __m512i hi01 = _mm512_unpackhi_epi32(v[4 * R], v[4 * R + 1]);
        const __m512i lo23 = _mm512_unpacklo_epi32(v[4 * R + 2], v[4 * R + 3]);
        const __m512i hi23 = _mm512_unpackhi_epi32(v[4 * R + 2], v[4 * R + 3]);
        x[4 * R + 0] = _mm512_unpacklo_epi64(lo01, lo23);
        x[4 * R + 1] = _mm512_unpackhi_epi64(lo01, lo23);
        x[4 * R + 2] = _mm512_unpacklo_epi64(hi01, hi23);
        x[4 * R + 3] = _mm512_unpackhi_epi64(hi01, hi23);
    }
    /* then the 4 x 4 transpose of 128-bit lanes */
    for (int e = 0; e < 4; e++) {
        const __m512i a = _mm512_shuffle_i32x4(x[e], x[4 + e], 0x44);
        const __m512i b = _mm512_shuffle_i32x4(x[e], x[4 + e], 0xee);
        const __m512i c = _mm512_shuffle_i32x4(x[8 + e], x[12 + e], 0x44);
        const __m512i d = _mm512_shuffle_i32x4(x[8 + e], x[12 + e], 0xee);
        v[e] = _mm512_shuffle_i32x4(a, c, 0x88);
        v[4 + e] = _mm512_shuffle_i32x4(a, c, 0xdd);
        v[8 + e] = _mm512_shuffle_i32x4(b, d, 0x88);
        v[12 + e] = _mm512_shuffle_i32x4(b, d, 0xdd);
    }
}

/* The 64 bytes at `off` of each of 16 rows rb apart (rows whose bit in m
 * is clear read as zeros and are not touched), transposed: v[k] = bytes
 * 4k..4k+3 of rows 0..15. The caller guarantees the bytes lie inside
 * every row that m names. */
INLINE T512 void load_columns16(const uint8_t *base, size_t rb, __mmask16 m, size_t off,
                                __m512i v[16])
{
    for (int i = 0; i < 16; i++)
        v[i] = (m >> i & 1) ? _mm512_loadu_si512(base + (size_t)i * rb + off)
                            : _mm512_setzero_si512();
    transpose16_epi32(v);
}

/* The decode (T = 1) kernels' reduction: each row's vpdpbusd leaves a
 * block's exact code sum spread over several int32 lanes; these trees of
 * unpacks and adds bring 16 rows' sums into the lanes of one register per
 * block, row i in lane i (integer sums, so the order is immaterial). */
/* Rows 4g..4g+3's partial sums p0..p3 ([8 partials of block A | 8 of
 * block B] each) to one vector: per 128-bit lane, the 4 rows' sums of that
 * lane's 4 partials (lanes 0, 1: block A's two halves; 2, 3: block B's). */
INLINE T512 __m512i reduce4_rows(__m512i p0, __m512i p1, __m512i p2, __m512i p3)
{
    const __m512i s01 =
        _mm512_add_epi32(_mm512_unpacklo_epi32(p0, p1), _mm512_unpackhi_epi32(p0, p1));
    const __m512i s23 =
        _mm512_add_epi32(_mm512_unpacklo_epi32(p2, p3), _mm512_unpackhi_epi32(p2, p3));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
}

/* Four reduce4_rows results (rows 0-3, 4-7, 8-11, 12-15) to block A's and
 * block B's exact sums of rows 0..15, row i in lane i. */
INLINE T512 void reduce16_finish(const __m512i q[4], __m512i *ya, __m512i *yb)
{
    const __m512i z01 = _mm512_add_epi32(_mm512_shuffle_i32x4(q[0], q[1], 0x88),
                                         _mm512_shuffle_i32x4(q[0], q[1], 0xdd));
    const __m512i z23 = _mm512_add_epi32(_mm512_shuffle_i32x4(q[2], q[3], 0x88),
                                         _mm512_shuffle_i32x4(q[2], q[3], 0xdd));
    /* z01 = [A rows 0-3, B rows 0-3, A rows 4-7, B rows 4-7] */
    *ya = _mm512_shuffle_i32x4(z01, z23, 0x88);
    *yb = _mm512_shuffle_i32x4(z01, z23, 0xdd);
}

/* The quantized families behind cpu_x86_matmul_q8act, which has checked
 * isa >= CPU_ISA_AVX2 and the weight type: each picks its kernel from the
 * level and T and computes y[t][r] for r in [r0, r1), t in [0, T), with
 * the arguments of cpu_x86_matmul_q8act. */
/* Q8_0, Q4_0, Q5_0, Q4_Z (cpu_x86_quant.c). */
void cpu_x86_matmul_q8(cpu_isa isa, float *y, const uint8_t *W, cairn_type wtype,
                       size_t row_bytes, const int8_t *q, const float *d, const int32_t *s, int T,
                       int n_in, int n_out, int64_t r0, int64_t r1, void *pack);
/* Q4_K, Q5_K, Q6_K (cpu_x86_kquant.c). */
void cpu_x86_matmul_kq(cpu_isa isa, float *y, const uint8_t *W, cairn_type wtype,
                       size_t row_bytes, const int8_t *q, const float *d, const int32_t *s, int T,
                       int n_in, int n_out, int64_t r0, int64_t r1, void *pack);

#endif /* CPU_X86_KERNELS */
#endif /* CAIRN_KERNELS_CPU_X86_IMPL_H */
