/*
 * kernels/cpu/cpu_x86_kquant.c — AVX2 and AVX-512 (VNNI) matmul kernels for
 * the K-quants Q4_K, Q5_K and Q6_K against activations quantized to int8:
 * the AVX2 row kernels, the AVX-512 panel GEMM, and cpu_x86_matmul_kq,
 * which chooses between them for cpu_x86_matmul_q8act. One file because
 * the kernels share the super-block decoding (codes, 6-bit scales and
 * mins); every function carries its target attribute (cpu_x86_impl.h).
 *
 * K-quants have 32-element sub-blocks (16 for Q6_K's scales) with their own
 * 6- or 8-bit scales inside 256-element super-blocks, so they share the
 * activation blocks of Q8_0 (cpu_x86_quant.c). AVX2: a row at a time, a
 * super-block per step (krow_256). AVX-512, every batch size (decode too:
 * cpu_x86_impl.h says why): the panel GEMM of cpu_x86_quant.c with a
 * K-quant panel (pack_panel_k: the same code layout plus per-block scale
 * and min, or two half-block scales for Q6_K).
 */
#include <string.h>

#include "kernels/cpu/cpu_x86_impl.h"

#if CPU_X86_KERNELS

/* ---- K-quant weights (Q4_K, Q5_K, Q6_K): row-at-a-time (AVX2) ------------ */

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


/* ---- K-quant weights: panel GEMM (AVX-512 VNNI) --------------------------- */

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
 * tile. A block of the panel is KP_BLOCK_BYTES (cpu_x86_impl.h). */

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
    /* The scale and min of every block of a super-block, per row: decoded
     * once per super-block (the 12 packed bytes hold all 8), not once per
     * block, which made the scalar decoding the most of a decode step. */
    float sA[QP_ROWS][8], sB[QP_ROWS][8];
    for (int b = 0; b < nb; b++) {
        uint8_t *out = pk + (size_t)b * KP_BLOCK_BYTES;
        const int sb = b / 8, j = b % 8;
        if (j == 0)
            for (int i = 0; i < QP_ROWS; i++) {
                if (r + i >= r_end)
                    break;
                const uint8_t *blk = W + (size_t)(r + i) * rb + (size_t)sb * bs;
                if (t == CAIRN_TYPE_Q6_K) {
                    const float dd = half_to_float(blk + 208);
                    for (int k = 0; k < 8; k++) {
                        sA[i][k] = dd * (float)(int8_t)blk[192 + 2 * k];
                        sB[i][k] = dd * (float)(int8_t)blk[192 + 2 * k + 1];
                    }
                } else {
                    uint8_t sc[8], mn[8];
                    cpu_kq_scales(blk + 4, sc, mn);
                    const float dd = half_to_float(blk), dmin = half_to_float(blk + 2);
                    for (int k = 0; k < 8; k++) {
                        sA[i][k] = dd * (float)sc[k];
                        sB[i][k] = dmin * (float)mn[k];
                    }
                }
            }
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
                const int on = m >> i & 1;
                A[i] = on ? sA[16 * p + i][j] : 0.0f;
                B[i] = on ? sB[16 * p + i][j] : 0.0f;
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

/* ---- dispatch ----------------------------------------------------------- */

typedef void (*krow_fn)(const uint8_t *row, const int8_t *q, const float *d, const int32_t *s,
                        int n_in, int C, float *y, int n_out);

void cpu_x86_matmul_kq(cpu_isa isa, float *y, const uint8_t *W, cairn_type wtype,
                       size_t row_bytes, const int8_t *q, const float *d, const int32_t *s, int T,
                       int n_in, int n_out, int64_t r0, int64_t r1, void *pack)
{
    const int nb = n_in / 32;
    if (isa >= CPU_ISA_AVX512) { /* every batch size: see cpu_x86_impl.h */
        matmul_kgemm(wtype, y, W, row_bytes, q, d, s, T, n_in, n_out, r0, r1, pack);
        return;
    }
    krow_fn fn = wtype == CAIRN_TYPE_Q4_K ? krow_256_q4k
               : wtype == CAIRN_TYPE_Q5_K ? krow_256_q5k
                                          : krow_256_q6k;
    for (int64_t r = r0; r < r1; r++)
        for (int t = 0; t < T; t += 4) {
            const int C = T - t < 4 ? T - t : 4;
            fn(W + (size_t)r * row_bytes, q + (size_t)t * n_in, d + (size_t)t * nb,
               s + (size_t)t * nb, n_in, C, y + (size_t)t * n_out + r, n_out);
        }
}

#endif /* CPU_X86_KERNELS */
