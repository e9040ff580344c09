/*
 * kernels/cpu/cpu_x86_quant.c — AVX2 and AVX-512 (VNNI) matmul kernels for
 * the block-quantized weights Q8_0, Q4_0, Q5_0 and Q4_Z against activations
 * quantized to int8 (cpu_x86_quantize_act): the AVX2 row kernels, the
 * AVX-512 panel GEMM, and cpu_x86_matmul_q8, which chooses between them
 * for cpu_x86_matmul_q8act. One file because the kernels share the code
 * layouts and zero points; every function carries its target attribute
 * (cpu_x86_impl.h).
 *
 * Per 32-element block (scale d_a, codes q_a):
 *     y = sum_b d_w[b] * d_a[b] * sum_i w_b[i] * q_a[b][i]
 * The integer inner sums use VNNI's vpdpbusd, which multiplies unsigned by
 * signed bytes. Weights are therefore made unsigned by a zero point Z
 * (Q4_0 codes are already q+8 with Z = 8, Q5_0 q+16 with Z = 16; Q8_0
 * codes get +128 with Z = 128; Q4_Z codes are unsigned with the block's own
 * zero z as Z, a per-row vector in the 16-row kernels)
 * and the result is corrected by -Z * sum_i q_a[i], which the activation
 * quantizer precomputes per block.
 *   - AVX2: a row at a time, one block per 256-bit register, against up to
 *     4 tokens per call; each token's arithmetic is the same whatever the
 *     call's token count. (Q4_Z: 8 blocks' sums reduced to exact block
 *     sums first, at qrow_256_z.)
 *   - AVX-512, two tokens and more: outer-product GEMM. A panel of 32 rows is repacked (once per panel,
 *     reused for every token) so that a 512-bit register holds 4
 *     consecutive codes of 16 rows; vpdpbusd with 4 activation codes
 *     broadcast then advances 16 outputs at once, with no horizontal sums.
 *     The per-block float scaling happens once per block for 16 outputs.
 *   - AVX-512, one token (decode): gemv_q8_rows, the same arithmetic per
 *     output without the panel (cpu_x86_impl.h at QG_TOKENS says why).
 * Both keep a fixed per-element order (integer block sums, then one FMA per
 * block in block order), so results depend neither on how rows are split
 * between threads nor on how many tokens share the call.
 */
#include <string.h>

#include "kernels/cpu/cpu_x86_impl.h"

#if CPU_X86_KERNELS

/* ---- quantized weights: row-at-a-time (AVX2) ------------------------------- */

/* Zero point of each weight format's unsigned codes (see the top). */
#define Q4_ZERO 8
#define Q5_ZERO 16
#define Q8_ZERO 128


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

/* Q4_Z on plain AVX2. Its zero point is the block's own byte (up to 255),
 * so the correction -z s can be far larger than the block's product (codes
 * all equal to z: the weights are 0, the two terms cancel). It must meet
 * the code sums as one exact integer per block, as in the scalar reference
 * and the AVX-512 kernels, not in one of the lanes that qrow_256 scales and
 * rounds separately (harmless for Q4_0/Q5_0's constant zeros 8 and 16,
 * not for z = 255 or for codes that cancel). So the 8-lane partial sums of
 * 8 blocks are reduced together by a tree of horizontal adds into one
 * register, lane k the exact code sum of block k; there the correction
 * comes off and the block's scale d_w d_a multiplies: one FMA per 8
 * blocks, lane k accumulating blocks k, k + 8, ... */
INLINE T256 void qrow_256_z(const uint8_t *row, const int8_t *q, const float *d,
                            const int32_t *s, int n_in, const int C, float *y, int n_out)
{
    const int nb = n_in / 32;
    const __m128i low4 = _mm_set1_epi8(0x0f);
    const __m256i ones16 = _mm256_set1_epi16(1);
    __m256 acc[4];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++)
        acc[c] = _mm256_setzero_ps();
    for (int b0 = 0; b0 < nb; b0 += 8) {
        const int nblk = nb - b0 < 8 ? nb - b0 : 8;
        __m256i w[8];
        int32_t zb[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        float dwb[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            if (k >= nblk) {
                w[k] = _mm256_setzero_si256();
                continue;
            }
            const uint8_t *blk = row + (size_t)(b0 + k) * 20;
            const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + 4));
            w[k] = _mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_and_si128(raw, low4)),
                _mm_and_si128(_mm_srli_epi16(raw, 4), low4), 1);
            zb[k] = blk[2];
            dwb[k] = half_to_float(blk);
        }
        const __m256i zv = _mm256_loadu_si256((const __m256i *)zb);
        const __m256 dwv = _mm256_loadu_ps(dwb);
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const size_t ab = (size_t)c * nb + b0;
            const int8_t *qb = q + (size_t)c * n_in + 32 * (size_t)b0;
            __m256i v[8];
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++)
                v[k] = k < nblk ? _mm256_madd_epi16(
                                      _mm256_maddubs_epi16(
                                          w[k], _mm256_loadu_si256((const __m256i *)(qb + 32 * k))),
                                      ones16)
                                : _mm256_setzero_si256();
            /* hadd(a, b) per 128-bit lane: [a0+a1, a2+a3, b0+b1, b2+b3] */
            const __m256i g0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]),
                                                 _mm256_hadd_epi32(v[2], v[3]));
            const __m256i g1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]),
                                                 _mm256_hadd_epi32(v[6], v[7]));
            /* g0 = [blocks 0-3, elements of the low halves | 0-3, high
             * halves], g1 the same for blocks 4-7 */
            const __m256i bsum = _mm256_add_epi32(_mm256_permute2x128_si256(g0, g1, 0x20),
                                                  _mm256_permute2x128_si256(g0, g1, 0x31));
            __m256i sv;
            __m256 dv;
            if (nblk == 8) {
                sv = _mm256_loadu_si256((const __m256i *)(s + ab));
                dv = _mm256_loadu_ps(d + ab);
            } else { /* the row's last blocks: read no further than them */
                int32_t st[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                float dt[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                memcpy(st, s + ab, sizeof(int32_t) * (size_t)nblk);
                memcpy(dt, d + ab, sizeof(float) * (size_t)nblk);
                sv = _mm256_loadu_si256((const __m256i *)st);
                dv = _mm256_loadu_ps(dt);
            }
            /* exact: |z s| <= 255 * 32 * 127 */
            const __m256i is = _mm256_sub_epi32(bsum, _mm256_mullo_epi32(zv, sv));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(dwv, dv), acc[c]);
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++)
        y[(size_t)c * n_out] = hsum256(acc[c]);
}

static __attribute__((noinline)) T256 void qrow_256_qz(const uint8_t *row, const int8_t *q,
                                                       const float *d, const int32_t *s, int n_in,
                                                       int C, float *y, int n_out)
{
    switch (C) {
    case 1: qrow_256_z(row, q, d, s, n_in, 1, y, n_out); break;
    case 2: qrow_256_z(row, q, d, s, n_in, 2, y, n_out); break;
    case 3: qrow_256_z(row, q, d, s, n_in, 3, y, n_out); break;
    default: qrow_256_z(row, q, d, s, n_in, 4, y, n_out); break;
    }
}

typedef void (*qrow_fn)(const uint8_t *row, const int8_t *q, const float *d, const int32_t *s,
                        int n_in, int C, float *y, int n_out);

/* ---- quantized weights: panel GEMM (AVX-512 VNNI) ------------------------- */

/* Repack rows [r, r + 32) (rows from r_end on are zero) into `pk`: for each
 * block, for each 16-row half, 8 groups of [16 rows][4 unsigned codes], then
 * the two halves' 16 float scales, and for Q4_Z then the two halves' 16
 * negated zeros (int32; QZ_BLOCK_BYTES a block instead of QP_BLOCK_BYTES).
 * Gathers read 4 code bytes of 16 rows at once. */
T512 static void pack_panel(const uint8_t *W, size_t rb, cairn_type t, int nb, int64_t r,
                            int64_t r_end, uint8_t *pk)
{
    const int qz = t == CAIRN_TYPE_Q4_Z;
    const size_t bs = t == CAIRN_TYPE_Q4_0 ? 18 : t == CAIRN_TYPE_Q5_0 ? 22 : qz ? 20 : 34;
    const size_t pbs = qz ? QZ_BLOCK_BYTES : QP_BLOCK_BYTES;
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
        uint8_t *out = pk + (size_t)b * pbs;
        for (int p = 0; p < 2; p++) {
            const uint8_t *base = W + (size_t)(r + 16 * p) * rb + (size_t)b * bs;
            const __mmask16 m = valid[p];
            uint8_t *codes = out + (size_t)p * 512;
            const __m512i zero = _mm512_setzero_si512();
            if (t == CAIRN_TYPE_Q4_0 || qz) {
                const size_t qs = qz ? 4 : 2;
                for (int g = 0; g < 4; g++) {
                    __m512i raw =
                        m ? _mm512_mask_i32gather_epi32(zero, m, idx, base + qs + 4 * g, 1) : zero;
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
            if (qz) { /* -z, byte 2 of the block; rows that do not exist get 0 */
                const __m512i z =
                    _mm512_and_si512(_mm512_srli_epi32(dh, 16), _mm512_set1_epi32(0xff));
                _mm512_store_si512(out + 1152 + 64 * p, _mm512_sub_epi32(zero, z));
            }
        }
    }
}

/* Tokens [t0, t0 + C) against a packed panel: P = 1 or 2 halves of 16 rows
 * are computed (the second half is skipped when no row of it exists). With
 * ZL (Q4_Z) the zero point is per row and block, read from the panel, and
 * `zero` is unused. */
INLINE T512 void qgemm_tile(const uint8_t *pk, int nb, const int8_t *q, const float *d,
                            const int32_t *s, int n_in, int zero, const int ZL, const int P,
                            const int C, float *y, int n_out, __mmask16 m0, __mmask16 m1)
{
    const size_t pbs = ZL ? QZ_BLOCK_BYTES : QP_BLOCK_BYTES;
    __m512 facc[2][QG_TOKENS];
#pragma GCC unroll 2
    for (int p = 0; p < P; p++)
#pragma GCC unroll 6
        for (int c = 0; c < C; c++)
            facc[p][c] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *pb = pk + (size_t)b * pbs;
        __m512i iacc[2][QG_TOKENS];
        if (ZL) {
            /* -z s exactly: |z s| <= 255 * 32 * 127 */
            const __m512i nz0 = _mm512_load_si512(pb + 1152);
            const __m512i nz1 = P > 1 ? _mm512_load_si512(pb + 1216) : nz0;
#pragma GCC unroll 6
            for (int c = 0; c < C; c++) {
                const __m512i sv = _mm512_set1_epi32(s[(size_t)c * nb + b]);
                iacc[0][c] = _mm512_mullo_epi32(nz0, sv);
                if (P > 1)
                    iacc[1][c] = _mm512_mullo_epi32(nz1, sv);
            }
        } else {
#pragma GCC unroll 6
            for (int c = 0; c < C; c++) {
                const __m512i init = _mm512_set1_epi32(-zero * s[(size_t)c * nb + b]);
#pragma GCC unroll 2
                for (int p = 0; p < P; p++)
                    iacc[p][c] = init;
            }
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

/* One instantiation per zero-point kind (ZL 0: the type's constant Z,
 * ZL 1: Q4_Z's per-row zeros). */
#define QGEMM_TILE_ANY(NAME, ZL)                                                                   \
    static __attribute__((noinline)) T512 void NAME(const uint8_t *pk, int nb, const int8_t *q,  \
                                                    const float *d, const int32_t *s, int n_in,   \
                                                    int zero, int P, int C, float *y, int n_out,  \
                                                    __mmask16 m0, __mmask16 m1)                   \
    {                                                                                              \
        switch (P * 8 + C) {                                                                       \
            QG_CASE(ZL, 1, 1) QG_CASE(ZL, 1, 2) QG_CASE(ZL, 1, 3) QG_CASE(ZL, 1, 4)                \
            QG_CASE(ZL, 1, 5) QG_CASE(ZL, 1, 6) QG_CASE(ZL, 2, 1) QG_CASE(ZL, 2, 2)                \
            QG_CASE(ZL, 2, 3) QG_CASE(ZL, 2, 4) QG_CASE(ZL, 2, 5)                                  \
        default: qgemm_tile(pk, nb, q, d, s, n_in, zero, ZL, 2, 6, y, n_out, m0, m1); break;       \
        }                                                                                          \
    }
#define QG_CASE(ZL, PP, CC)                                                                        \
    case PP * 8 + CC: qgemm_tile(pk, nb, q, d, s, n_in, zero, ZL, PP, CC, y, n_out, m0, m1); break;
QGEMM_TILE_ANY(qgemm_tile_any, 0)
QGEMM_TILE_ANY(qgemm_tile_any_z, 1)
#undef QG_CASE

/* ---- Q4_0, Q5_0 and Q8_0, one token (decode, AVX-512) ---------------------------- */

/* Decode streams the weights once and is bound by how fast a core turns
 * them into sums; the panel (written and read back through L2, its codes
 * gathered) is skipped. 16 rows are computed straight from their bytes with
 * the panel's arithmetic per output (16 rows in the lanes, one FMA per
 * block in block order, qgemm_tile's expression), so the result is bitwise
 * the batched one:
 *   Q4_0  per row, the code bytes of 4 blocks side by side in one register;
 *         low nibbles times elements 0-15 and high nibbles times 16-31 of
 *         the same blocks (activations regrouped once per 4 blocks) leave
 *         4 partial sums per block in its 128-bit lane;
 *         Q5_0 the same, with each code's bit 4 added from its qh by a
 *         byte mask;
 *   Q8_0  per row, the codes of 2 blocks (+128, unsigned) times the
 *         activations as they lie: 8 partial sums per block.
 * reduce4_rows / reduce16_finish (or a lane transpose) bring 16 rows' exact
 * block sums into lanes; the zero point comes off as in the panel (-Z s).
 * The weight scales, one per row and block, are gathered. */
INLINE T512 __m512 gemv_q8_rows(const uint8_t *base, size_t rb, cairn_type t, const int8_t *q,
                                const float *d, const int32_t *s, int nb, int rows, const int full)
{
    const int q5 = t == CAIRN_TYPE_Q5_0, qz = t == CAIRN_TYPE_Q4_Z;
    const int q4 = t == CAIRN_TYPE_Q4_0 || q5 || qz; /* nibble codes */
    const size_t bs = t == CAIRN_TYPE_Q4_0 ? 18 : q5 ? 22 : qz ? 20 : 34;
    const size_t qs = q5 ? 6 : qz ? 4 : 2; /* code bytes within a block */
    const int per = q4 ? 4 : 2;   /* blocks per register of a row */
    const int zero = t == CAIRN_TYPE_Q4_0 ? Q4_ZERO : q5 ? Q5_ZERO : Q8_ZERO;
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                                             12, 13, 14, 15),
                                           _mm512_set1_epi32((int)rb));
    const __mmask16 m = full ? 0xffff : (__mmask16)((1u << rows) - 1);
    const __m512i low4 = _mm512_set1_epi8(0x0f), flip = _mm512_set1_epi8((char)0x80);
    __m512 facc = _mm512_setzero_ps();
    for (int b0 = 0; b0 < nb; b0 += per) {
        const int nblk = nb - b0 < per ? nb - b0 : per;
        const int8_t *qb = q + 32 * (size_t)b0;
        __m512i alo, ahi = _mm512_setzero_si512();
        if (q4) {
            /* elements 0-15 and 16-31 of each of the 4 blocks */
            alo = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)qb));
            ahi = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(qb + 16)));
            if (nblk > 1) {
                alo = _mm512_inserti32x4(alo, _mm_loadu_si128((const __m128i *)(qb + 32)), 1);
                ahi = _mm512_inserti32x4(ahi, _mm_loadu_si128((const __m128i *)(qb + 48)), 1);
            }
            if (nblk > 2) {
                alo = _mm512_inserti32x4(alo, _mm_loadu_si128((const __m128i *)(qb + 64)), 2);
                ahi = _mm512_inserti32x4(ahi, _mm_loadu_si128((const __m128i *)(qb + 80)), 2);
            }
            if (nblk > 3) {
                alo = _mm512_inserti32x4(alo, _mm_loadu_si128((const __m128i *)(qb + 96)), 3);
                ahi = _mm512_inserti32x4(ahi, _mm_loadu_si128((const __m128i *)(qb + 112)), 3);
            }
        } else {
            alo = nblk > 1 ? _mm512_loadu_si512(qb)
                           : _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)qb));
        }
        __m512i qr[4];
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            __m512i p[4];
#pragma GCC unroll 4
            for (int e = 0; e < 4; e++) {
                const int i = 4 * g + e;
                if (!full && i >= rows) {
                    p[e] = _mm512_setzero_si512();
                    continue;
                }
                const uint8_t *row = base + (size_t)i * rb + (size_t)b0 * bs + qs;
                _mm_prefetch((const char *)(row + 4 * per * bs), _MM_HINT_T0);
                _mm_prefetch((const char *)(row + 4 * per * bs + 64), _MM_HINT_T0);
                __m512i v;
                if (q4) {
                    v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)row));
                    if (nblk > 1)
                        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(row + bs)), 1);
                    if (nblk > 2)
                        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(row + 2 * bs)),
                                               2);
                    if (nblk > 3)
                        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(row + 3 * bs)),
                                               3);
                    __m512i clo = _mm512_and_si512(v, low4);
                    __m512i chi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
                    if (q5) {
                        /* bit 4 of code e of block k: bit e of its qh, which
                         * as byte masks is bits 0-15 (low nibbles) and 16-31
                         * (high) of each block's qh, lane k */
                        uint32_t h0, h1 = 0, h2 = 0, h3 = 0;
                        memcpy(&h0, row - 4, 4);
                        if (nblk > 1)
                            memcpy(&h1, row - 4 + bs, 4);
                        if (nblk > 2)
                            memcpy(&h2, row - 4 + 2 * bs, 4);
                        if (nblk > 3)
                            memcpy(&h3, row - 4 + 3 * bs, 4);
                        const uint64_t A = h0 | (uint64_t)h1 << 32;
                        const uint64_t B = h2 | (uint64_t)h3 << 32;
                        const uint64_t mlo = (A & 0xffffu) | ((A >> 16) & 0xffff0000u) |
                                             ((B & 0xffffu) << 32) |
                                             ((B << 16) & 0xffff000000000000u);
                        const uint64_t mhi = ((A >> 16) & 0xffffu) | ((A >> 32) & 0xffff0000u) |
                                             (((B >> 16) & 0xffffu) << 32) |
                                             (B & 0xffff000000000000u);
                        const __m512i bit4 = _mm512_set1_epi8(0x10);
                        clo = _mm512_mask_add_epi8(clo, (__mmask64)mlo, clo, bit4);
                        chi = _mm512_mask_add_epi8(chi, (__mmask64)mhi, chi, bit4);
                    }
                    p[e] = _mm512_dpbusd_epi32(
                        _mm512_dpbusd_epi32(_mm512_setzero_si512(), clo, alo), chi, ahi);
                } else {
                    v = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)row));
                    if (nblk > 1)
                        v = _mm512_inserti64x4(v, _mm256_loadu_si256((const __m256i *)(row + bs)),
                                               1);
                    p[e] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(v, flip),
                                               alo);
                }
            }
            qr[g] = reduce4_rows(p[0], p[1], p[2], p[3]);
        }
        __m512i isum[4];
        if (q4) {
            /* qr[g] lane k = block b0 + k of rows 4g..4g+3: transpose lanes */
            const __m512i a = _mm512_shuffle_i32x4(qr[0], qr[1], 0x44);
            const __m512i b = _mm512_shuffle_i32x4(qr[0], qr[1], 0xee);
            const __m512i c = _mm512_shuffle_i32x4(qr[2], qr[3], 0x44);
            const __m512i dd = _mm512_shuffle_i32x4(qr[2], qr[3], 0xee);
            isum[0] = _mm512_shuffle_i32x4(a, c, 0x88);
            isum[1] = _mm512_shuffle_i32x4(a, c, 0xdd);
            isum[2] = _mm512_shuffle_i32x4(b, dd, 0x88);
            isum[3] = _mm512_shuffle_i32x4(b, dd, 0xdd);
        } else {
            reduce16_finish(qr, &isum[0], &isum[1]);
        }
        for (int k = 0; k < nblk; k++) {
            const int b = b0 + k;
            const __m512i dh = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx,
                                                           base + (size_t)b * bs, 1);
            const __m512 dw = _mm512_cvtph_ps(
                _mm512_cvtepi32_epi16(_mm512_and_si512(dh, _mm512_set1_epi32(0xffff))));
            /* Q4_Z: each row's own zero, byte 2 of the gathered word; the
             * panel's -z s, the same exact integer */
            const __m512i corr =
                qz ? _mm512_mullo_epi32(_mm512_sub_epi32(_mm512_setzero_si512(),
                                                         _mm512_and_si512(_mm512_srli_epi32(dh, 16),
                                                                          _mm512_set1_epi32(0xff))),
                                        _mm512_set1_epi32(s[b]))
                   : _mm512_set1_epi32(-zero * s[b]);
            const __m512i is = _mm512_add_epi32(corr, isum[k]);
            facc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dw, _mm512_set1_ps(d[b])),
                                   facc);
        }
    }
    return facc;
}

#define GEMV_Q8_TYPED(NAME, TYPE)                                                                  \
    static __attribute__((noinline)) T512 void NAME(float *y, const uint8_t *W, size_t rb,        \
                                                    const int8_t *q, const float *d,               \
                                                    const int32_t *s, int nb, int64_t r0,          \
                                                    int64_t r1)                                    \
    {                                                                                              \
        for (int64_t r = r0; r < r1; r += 16) {                                                    \
            const uint8_t *base = W + (size_t)r * rb;                                              \
            if (r1 - r >= 16) {                                                                    \
                _mm512_storeu_ps(y + r, gemv_q8_rows(base, rb, TYPE, q, d, s, nb, 16, 1));         \
            } else {                                                                               \
                const int rows = (int)(r1 - r);                                                    \
                _mm512_mask_storeu_ps(y + r, (__mmask16)((1u << rows) - 1),                        \
                                      gemv_q8_rows(base, rb, TYPE, q, d, s, nb, rows, 0));         \
            }                                                                                      \
        }                                                                                          \
    }
GEMV_Q8_TYPED(gemv_q4_0, CAIRN_TYPE_Q4_0)
GEMV_Q8_TYPED(gemv_q8_0, CAIRN_TYPE_Q8_0)
GEMV_Q8_TYPED(gemv_q5_0, CAIRN_TYPE_Q5_0)
GEMV_Q8_TYPED(gemv_q4_z, CAIRN_TYPE_Q4_Z)

/* ---- dispatch ----------------------------------------------------------- */

void cpu_x86_matmul_q8(cpu_isa isa, float *y, const uint8_t *W, cairn_type wtype,
                       size_t row_bytes, const int8_t *q, const float *d, const int32_t *s, int T,
                       int n_in, int n_out, int64_t r0, int64_t r1, void *pack)
{
    const int nb = n_in / 32;
    if (isa >= CPU_ISA_AVX512 && T == 1) {
        (wtype == CAIRN_TYPE_Q4_0   ? gemv_q4_0
         : wtype == CAIRN_TYPE_Q5_0 ? gemv_q5_0
         : wtype == CAIRN_TYPE_Q4_Z ? gemv_q4_z
                                    : gemv_q8_0)(y, W, row_bytes, q, d, s, nb, r0, r1);
        return;
    }
    if (isa >= CPU_ISA_AVX512) {
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
                (wtype == CAIRN_TYPE_Q4_Z ? qgemm_tile_any_z : qgemm_tile_any)(
                    pack, nb, q + (size_t)t * n_in, d + (size_t)t * nb, s + (size_t)t * nb, n_in,
                    zero, P, C, y + (size_t)t * n_out + r, n_out, m0, m1);
            }
        }
        return;
    }
    qrow_fn fn = wtype == CAIRN_TYPE_Q4_0 ? qrow_256_q4
               : wtype == CAIRN_TYPE_Q5_0 ? qrow_256_q5
               : wtype == CAIRN_TYPE_Q4_Z ? qrow_256_qz
               : qrow_256_q8;
    for (int64_t r = r0; r < r1; r++)
        for (int t = 0; t < T; t += 4) {
            const int C = T - t < 4 ? T - t : 4;
            fn(W + (size_t)r * row_bytes, q + (size_t)t * n_in, d + (size_t)t * nb,
               s + (size_t)t * nb, n_in, C, y + (size_t)t * n_out + r, n_out);
        }
}

#endif /* CPU_X86_KERNELS */
