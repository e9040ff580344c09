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
 * super-block per step (krow_256). AVX-512, two tokens and more: the panel
 * GEMM of cpu_x86_quant.c with a K-quant panel (pack_panel_k: the same
 * code layout plus per-block scale and min, or two half-block scales for
 * Q6_K); one token (decode), Q4_K and Q6_K: gemv_q4k / gemv_q6k, the
 * panel's arithmetic per output without the panel (cpu_x86_impl.h at
 * QG_TOKENS); Q5_K decode still takes the panel.
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

/* The codes of one super-block of 16 rows (half p of the panel) into the 8
 * blocks' code groups: each run of 64 code bytes is read row by row and
 * transposed (load_columns16), so column k is bytes 4k..4k+3 of the run
 * for all 16 rows. Per block j (32 elements) the groups g = 0..7 are:
 *   Q4_K  qs at 16 + 32 (j/2) + 4g, low nibble for even j, high for odd
 *   Q5_K  as Q4_K from qs at 48, plus bit j of qh at 16 + 4g as bit 4
 *   Q6_K  ql at 64 h + 32 (k&1) + 4g (h = j/4, k = j%4; low nibble for
 *         k < 2), plus bits 2k, 2k+1 of qh at 128 + 32 h + 4g as bits 4, 5
 * — the same bytes pack_panel_k's layout has always held. */
INLINE T512 void pack_codes_k(const uint8_t *base, size_t rb, cairn_type t, __mmask16 m,
                              uint8_t *out /* block 0 of the super-block, half p */)
{
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    __m512i c0[16], c1[16];
    if (t == CAIRN_TYPE_Q4_K) {
        for (int w = 0; w < 2; w++) { /* qs bytes 64w..64w+63: blocks 4w..4w+3 */
            load_columns16(base, rb, m, 16 + 64 * (size_t)w, c0);
            for (int k = 0; k < 16; k++) {
                const int j = 4 * w + 2 * (k / 8), g = k % 8;
                _mm512_store_si512(out + (size_t)j * KP_BLOCK_BYTES + 64 * g,
                                   _mm512_and_si512(c0[k], low4));
                _mm512_store_si512(out + (size_t)(j + 1) * KP_BLOCK_BYTES + 64 * g,
                                   _mm512_and_si512(_mm512_srli_epi16(c0[k], 4), low4));
            }
        }
        return;
    }
    if (t == CAIRN_TYPE_Q5_K) {
        /* bytes 16..79: qh (columns 0-7) and qs pair 0 (8-15); then qs
         * pairs 1-2 (80..143) and 2-3 (112..175, pair 2 read twice) */
        __m512i qh[8];
        load_columns16(base, rb, m, 16, c0);
        for (int g = 0; g < 8; g++)
            qh[g] = c0[g];
        for (int pair = 0; pair < 4; pair++) {
            const __m512i *src;
            int col;
            if (pair == 0) {
                src = c0, col = 8;
            } else if (pair == 1) {
                load_columns16(base, rb, m, 80, c1);
                src = c1, col = 0;
            } else if (pair == 2) {
                src = c1, col = 8;
            } else {
                load_columns16(base, rb, m, 112, c0);
                src = c0, col = 8;
            }
            for (int g = 0; g < 8; g++) {
                const __m512i raw = src[col + g];
                for (int odd = 0; odd < 2; odd++) {
                    const int j = 2 * pair + odd;
                    const __m512i c = odd ? _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4)
                                          : _mm512_and_si512(raw, low4);
                    const __m512i hb = j <= 4 ? _mm512_slli_epi32(qh[g], 4 - j)
                                              : _mm512_srli_epi32(qh[g], j - 4);
                    _mm512_store_si512(
                        out + (size_t)j * KP_BLOCK_BYTES + 64 * g,
                        _mm512_or_si512(c, _mm512_and_si512(hb, _mm512_set1_epi8(0x10))));
                }
            }
        }
        return;
    }
    /* Q6_K: c0 = ql 0..63 (h = 0), c1 = ql 64..127 (h = 1), then qh */
    __m512i qh[16];
    load_columns16(base, rb, m, 0, c0);
    load_columns16(base, rb, m, 64, c1);
    load_columns16(base, rb, m, 128, qh);
    for (int j = 0; j < 8; j++) {
        const int h = j / 4, k = j % 4;
        for (int g = 0; g < 8; g++) {
            const __m512i ql = (h ? c1 : c0)[8 * (k & 1) + g];
            const __m512i q2 = qh[8 * h + g];
            __m512i c = k < 2 ? _mm512_and_si512(ql, low4)
                              : _mm512_and_si512(_mm512_srli_epi16(ql, 4), low4);
            /* bits 2k, 2k+1 to bits 4, 5 (32-bit shifts: the mask keeps
             * only bits that stayed in their byte) */
            const __m512i hb = 2 * k <= 4 ? _mm512_slli_epi32(q2, 4 - 2 * k)
                                          : _mm512_srli_epi32(q2, 2 * k - 4);
            c = _mm512_or_si512(c, _mm512_and_si512(hb, _mm512_set1_epi8(0x30)));
            _mm512_store_si512(out + (size_t)j * KP_BLOCK_BYTES + 64 * g, c);
        }
    }
}

T512 static void pack_panel_k(const uint8_t *W, size_t rb, cairn_type t, int nb, int64_t r,
                              int64_t r_end, uint8_t *pk)
{
    const size_t bs = t == CAIRN_TYPE_Q4_K ? 144 : t == CAIRN_TYPE_Q5_K ? 176 : 210;
    __mmask16 valid[2];
    for (int p = 0; p < 2; p++) {
        int64_t n = r_end - (r + 16 * p);
        valid[p] = n >= 16 ? 0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
    }
    for (int sb = 0; sb < nb / 8; sb++) {
        uint8_t *out = pk + (size_t)sb * 8 * KP_BLOCK_BYTES;
        for (int p = 0; p < 2; p++) {
            const __mmask16 m = valid[p];
            const uint8_t *base = W + (size_t)(r + 16 * p) * rb + (size_t)sb * bs;
            pack_codes_k(base, rb, t, m, out + (size_t)p * 512);
            /* The scale and min of each block: one vector per row, decoded
             * once per super-block (its 12 or 16 scale bytes hold all 8
             * blocks'), then transposed so column j of the Q4_K/Q5_K row
             * [A_0..A_7, B_0..B_7] (of the Q6_K row [A_0, B_0, A_1, ...]) is
             * block j's A (B) for all 16 rows. */
            __m512i v[16];
            for (int i = 0; i < 16; i++) {
                if (!(m >> i & 1)) {
                    v[i] = _mm512_setzero_si512();
                    continue;
                }
                const uint8_t *blk = base + (size_t)i * rb;
                __m512 f;
                if (t == CAIRN_TYPE_Q6_K) {
                    const __m512i sc = _mm512_cvtepi8_epi32(
                        _mm_loadu_si128((const __m128i *)(blk + 192)));
                    f = _mm512_mul_ps(_mm512_set1_ps(half_to_float(blk + 208)),
                                      _mm512_cvtepi32_ps(sc));
                } else {
                    /* the packing of cpu_kq_scales, four bytes at a time */
                    uint32_t w0, w1, w2;
                    memcpy(&w0, blk + 4, 4);
                    memcpy(&w1, blk + 8, 4);
                    memcpy(&w2, blk + 12, 4);
                    const uint32_t sc_lo = w0 & 0x3f3f3f3fu, mn_lo = w1 & 0x3f3f3f3fu;
                    const uint32_t sc_hi = (w2 & 0x0f0f0f0fu) | ((w0 >> 2) & 0x30303030u);
                    const uint32_t mn_hi = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 2) & 0x30303030u);
                    const __m512i bytes = _mm512_cvtepu8_epi32(
                        _mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)mn_lo, (int)mn_hi));
                    const __m512 dd = _mm512_mask_blend_ps(0xff00,
                                                           _mm512_set1_ps(half_to_float(blk)),
                                                           _mm512_set1_ps(half_to_float(blk + 2)));
                    f = _mm512_mul_ps(dd, _mm512_cvtepi32_ps(bytes));
                }
                v[i] = _mm512_castps_si512(f);
            }
            transpose16_epi32(v);
            for (int j = 0; j < 8; j++) {
                uint8_t *blk_out = out + (size_t)j * KP_BLOCK_BYTES + 64 * p;
                const int six = t == CAIRN_TYPE_Q6_K;
                _mm512_store_si512(blk_out + 1024, v[six ? 2 * j : j]);
                _mm512_store_si512(blk_out + 1152, v[six ? 2 * j + 1 : 8 + j]);
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

/* ---- Q4_K, one token (decode, AVX-512) ---------------------------------- */

/* Decode streams the weights once and is bound by how fast a core turns
 * them into sums, so it skips the panel (written and read back through L2)
 * and computes 16 rows at a time straight from their bytes, with the
 * panel's arithmetic per output (16 rows in the lanes, one FMA pair per
 * block in block order, kgemm_tile's expression), hence bitwise its result.
 *
 * Per row and super-block the 128 code bytes are two loads; their low and
 * high nibbles are blocks (0, 2), (1, 3), (4, 6), (5, 7), 32 codes each,
 * multiplied by the activations of the same two blocks side by side
 * (vpdpbusd): 8 partial sums per block. The exact block sums of 16 rows
 * are then gathered into lanes by a tree of unpacks and adds
 * (reduce4_rows, reduce16_finish). The blocks' scales and mins come as in pack_panel_k. */

/* The first 16 bytes (d, dmin, the 12 scale bytes) of a super-block of
 * each of 16 rows (those past `rows` read as zeros), as A_j = d sc_j and
 * B_j = dmin m_j (j = 0..7) for rows 0..15 in the lanes: the header is
 * transposed to 4 column vectors (16 x 4 dwords: 4 rows per register,
 * then two unpack levels) and decoded 16 rows at once, with cpu_kq_scales'
 * bit layout and pack_panel_k's products. */
INLINE T512 void q4k_scales16(const uint8_t *base, size_t rb, int rows, __m512 A[8], __m512 B[8])
{
    __m512i v[4];
#define Q4K_HDR(i)                                                                                 \
    ((i) < rows ? _mm_loadu_si128((const __m128i *)(base + (size_t)(i) * rb)) : _mm_setzero_si128())
#pragma GCC unroll 4
    for (int a = 0; a < 4; a++) { /* lane L of v[a]: row 4L + a */
        v[a] = _mm512_castsi128_si512(Q4K_HDR(a));
        v[a] = _mm512_inserti32x4(v[a], Q4K_HDR(4 + a), 1);
        v[a] = _mm512_inserti32x4(v[a], Q4K_HDR(8 + a), 2);
        v[a] = _mm512_inserti32x4(v[a], Q4K_HDR(12 + a), 3);
    }
#undef Q4K_HDR
    const __m512i lo01 = _mm512_unpacklo_epi32(v[0], v[1]), hi01 = _mm512_unpackhi_epi32(v[0], v[1]);
    const __m512i lo23 = _mm512_unpacklo_epi32(v[2], v[3]), hi23 = _mm512_unpackhi_epi32(v[2], v[3]);
    const __m512i x0 = _mm512_unpacklo_epi64(lo01, lo23); /* d | dmin << 16 */
    const __m512i w0 = _mm512_unpackhi_epi64(lo01, lo23);
    const __m512i w1 = _mm512_unpacklo_epi64(hi01, hi23);
    const __m512i w2 = _mm512_unpackhi_epi64(hi01, hi23);
    const __m512 dd = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_and_si512(x0, _mm512_set1_epi32(0xffff))));
    const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(x0, 16)));
    const __m512i m6 = _mm512_set1_epi32(0x3f3f3f3f), m4 = _mm512_set1_epi32(0x0f0f0f0f);
    const __m512i top = _mm512_set1_epi32(0x30303030), byte = _mm512_set1_epi32(0xff);
    const __m512i sc_lo = _mm512_and_si512(w0, m6), mn_lo = _mm512_and_si512(w1, m6);
    const __m512i sc_hi = _mm512_or_si512(_mm512_and_si512(w2, m4),
                                          _mm512_and_si512(_mm512_srli_epi32(w0, 2), top));
    const __m512i mn_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(w2, 4), m4),
                                          _mm512_and_si512(_mm512_srli_epi32(w1, 2), top));
    for (int j = 0; j < 4; j++) {
        A[j] = _mm512_mul_ps(dd, _mm512_cvtepi32_ps(
                                     _mm512_and_si512(_mm512_srli_epi32(sc_lo, 8 * j), byte)));
        A[4 + j] = _mm512_mul_ps(dd, _mm512_cvtepi32_ps(
                                         _mm512_and_si512(_mm512_srli_epi32(sc_hi, 8 * j), byte)));
        B[j] = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(
                                       _mm512_and_si512(_mm512_srli_epi32(mn_lo, 8 * j), byte)));
        B[4 + j] = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(
                                           _mm512_and_si512(_mm512_srli_epi32(mn_hi, 8 * j), byte)));
    }
}

/* 16 rows from `base` (rows >= `rows` are zero and not read); FULL: rows
 * is 16, so the compiler drops every row test. */
INLINE T512 __m512 gemv_q4k_rows(const uint8_t *base, size_t rb, const int8_t *q, const float *d,
                                 const int32_t *s, int nsb, int rows, const int full)
{
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    __m512 facc = _mm512_setzero_ps();
    for (int sb = 0; sb < nsb; sb++) {
        const int8_t *qs = q + 256 * (size_t)sb;
        const uint8_t *sbase = base + (size_t)sb * 144;
        /* activations of blocks (0, 2), (1, 3), (4, 6), (5, 7) side by side */
        __m512i a[4];
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const int blk = (k & 1) + 4 * (k >> 1);
            a[k] = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(qs + 32 * blk))),
                _mm256_loadu_si256((const __m256i *)(qs + 32 * blk + 64)), 1);
        }
        /* code sums: the low and high nibbles of the first and second 64
         * code bytes, 4 rows at a time */
        __m512i isum[8];
#pragma GCC unroll 2
        for (int half = 0; half < 2; half++) {
            __m512i qlo[4], qhi[4];
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                __m512i plo[4], phi[4];
#pragma GCC unroll 4
                for (int e = 0; e < 4; e++) {
                    const int i = 4 * g + e;
                    if (!full && i >= rows) {
                        plo[e] = phi[e] = _mm512_setzero_si512();
                        continue;
                    }
                    const uint8_t *blk = sbase + (size_t)i * rb;
                    if (half == 0)
                        _mm_prefetch((const char *)(blk + 3 * 144), _MM_HINT_T0);
                    else {
                        _mm_prefetch((const char *)(blk + 3 * 144 + 64), _MM_HINT_T0);
                        _mm_prefetch((const char *)(blk + 3 * 144 + 128), _MM_HINT_T0);
                    }
                    const __m512i l = _mm512_loadu_si512(blk + 16 + 64 * half);
                    plo[e] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(l, low4),
                                                 a[2 * half]);
                    phi[e] = _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                                 _mm512_and_si512(_mm512_srli_epi16(l, 4), low4),
                                                 a[2 * half + 1]);
                }
                qlo[g] = reduce4_rows(plo[0], plo[1], plo[2], plo[3]);
                qhi[g] = reduce4_rows(phi[0], phi[1], phi[2], phi[3]);
            }
            /* low nibbles: blocks (4 half, 4 half + 2); high nibbles:
             * blocks (4 half + 1, 4 half + 3) */
            reduce16_finish(qlo, &isum[4 * half], &isum[4 * half + 2]);
            reduce16_finish(qhi, &isum[4 * half + 1], &isum[4 * half + 3]);
        }
        __m512 A[8], B[8];
        q4k_scales16(sbase, rb, full ? 16 : rows, A, B);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const int b = 8 * sb + j;
            const float dab = d[b];
            const __m512 da = _mm512_set1_ps(dab);
            const __m512 das = _mm512_set1_ps(-dab * (float)s[b]);
            facc = _mm512_fmadd_ps(
                B[j], das,
                _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[j]), _mm512_mul_ps(A[j], da), facc));
        }
    }
    return facc;
}

/* Q6_K, 16 rows: per row and half h of a super-block, the 64 ql bytes
 * (low nibbles: blocks 4h, 4h+1; high: 4h+2, 4h+3) with bits 4, 5 from the
 * 32 qh bytes (shifted per block by a per-half vpsllvw / vpsrlvw), times
 * the activations of those two blocks as they lie: 4 partial sums per
 * 16-element sub-block, one sub-block per 128-bit lane, which reduce4_rows
 * and a lane transpose bring into rows. Then kgemm_tile's two FMAs per
 * block (sub-block sums less 32 times their activation code sums, times
 * d sc_u d_a). */
INLINE T512 __m512 gemv_q6k_rows(const uint8_t *base, size_t rb, const int8_t *q, const float *d,
                                 int nsb, int rows, const int full)
{
    const __m512i low4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    /* blocks k = 0, 1 of a half: bits (0, 1), (2, 3) up to (4, 5); k = 2, 3:
     * bits (4, 5) stay, (6, 7) down */
    const __m512i cnt_lo = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i cnt_hi = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    __m512 facc = _mm512_setzero_ps();
    for (int sb = 0; sb < nsb; sb++) {
        const int8_t *qs = q + 256 * (size_t)sb;
        const uint8_t *sbase = base + (size_t)sb * 210;
        int32_t zs[16]; /* 32 x the code sum of each 16-element sub-block */
        for (int u = 0; u < 16; u++) {
            const __m128i sad = _mm_sad_epu8(
                _mm_xor_si128(_mm_loadu_si128((const __m128i *)(qs + 16 * u)), _mm_set1_epi8((char)0x80)),
                _mm_setzero_si128());
            zs[u] = 32 * (_mm_cvtsi128_si32(sad) + _mm_extract_epi16(sad, 4) - 16 * 128);
        }
        __m512i isum[16];
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
#pragma GCC unroll 2
            for (int pair = 0; pair < 2; pair++) {
                const __m512i a = _mm512_loadu_si512(qs + 128 * h + 64 * pair);
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
                        const uint8_t *blk = sbase + (size_t)i * rb;
                        if (pair == 0)
                            _mm_prefetch((const char *)(blk + 2 * 210 + 64 * h), _MM_HINT_T0);
                        else if (h == 1)
                            _mm_prefetch((const char *)(blk + 2 * 210 + 128), _MM_HINT_T0);
                        else
                            _mm_prefetch((const char *)(blk + 2 * 210 + 192), _MM_HINT_T0);
                        const __m512i l = _mm512_loadu_si512(blk + 64 * h);
                        const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
                        const __m512i qq = _mm512_inserti64x4(_mm512_castsi256_si512(qh), qh, 1);
                        __m512i c, hb;
                        if (pair == 0) {
                            c = _mm512_and_si512(l, low4);
                            hb = _mm512_sllv_epi16(qq, cnt_lo);
                        } else {
                            c = _mm512_and_si512(_mm512_srli_epi16(l, 4), low4);
                            hb = _mm512_srlv_epi16(qq, cnt_hi);
                        }
                        c = _mm512_or_si512(c, _mm512_and_si512(hb, m30));
                        p[e] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c, a);
                    }
                    qr[g] = reduce4_rows(p[0], p[1], p[2], p[3]);
                }
                /* lane L of qr[g]: sub-block L of blocks (A, A + 1), A =
                 * 4h + 2 pair, i.e. sub-blocks 2A .. 2A + 3, rows 4g.. */
                const __m512i ta = _mm512_shuffle_i32x4(qr[0], qr[1], 0x44);
                const __m512i tb = _mm512_shuffle_i32x4(qr[0], qr[1], 0xee);
                const __m512i tc = _mm512_shuffle_i32x4(qr[2], qr[3], 0x44);
                const __m512i td = _mm512_shuffle_i32x4(qr[2], qr[3], 0xee);
                const int u0 = 2 * (4 * h + 2 * pair);
                isum[u0] = _mm512_shuffle_i32x4(ta, tc, 0x88);
                isum[u0 + 1] = _mm512_shuffle_i32x4(ta, tc, 0xdd);
                isum[u0 + 2] = _mm512_shuffle_i32x4(tb, td, 0x88);
                isum[u0 + 3] = _mm512_shuffle_i32x4(tb, td, 0xdd);
            }
        }
        /* d sc_u of rows 0..15 per sub-block u (A_j = u 2j, B_j = u 2j+1) */
        __m512i sc[16];
        for (int i = 0; i < 16; i++) {
            if (!full && i >= rows) {
                sc[i] = _mm512_setzero_si512();
                continue;
            }
            const uint8_t *blk = sbase + (size_t)i * rb;
            const __m512i v = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 192)));
            sc[i] = _mm512_castps_si512(
                _mm512_mul_ps(_mm512_set1_ps(half_to_float(blk + 208)), _mm512_cvtepi32_ps(v)));
        }
        transpose16_epi32(sc);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const __m512 da = _mm512_set1_ps(d[8 * sb + j]);
#pragma GCC unroll 2
            for (int part = 0; part < 2; part++) {
                const int u = 2 * j + part;
                const __m512i is = _mm512_add_epi32(_mm512_set1_epi32(-zs[u]), isum[u]);
                facc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is),
                                       _mm512_mul_ps(_mm512_castsi512_ps(sc[u]), da), facc);
            }
        }
    }
    return facc;
}

static T512 void gemv_q6k(float *y, const uint8_t *W, size_t rb, const int8_t *q, const float *d,
                          int n_in, int64_t r0, int64_t r1)
{
    const int nsb = n_in / 256;
    for (int64_t r = r0; r < r1; r += 16) {
        const uint8_t *base = W + (size_t)r * rb;
        if (r1 - r >= 16) {
            _mm512_storeu_ps(y + r, gemv_q6k_rows(base, rb, q, d, nsb, 16, 1));
        } else {
            const int rows = (int)(r1 - r);
            _mm512_mask_storeu_ps(y + r, (__mmask16)((1u << rows) - 1),
                                  gemv_q6k_rows(base, rb, q, d, nsb, rows, 0));
        }
    }
}

static T512 void gemv_q4k(float *y, const uint8_t *W, size_t rb, const int8_t *q, const float *d,
                          const int32_t *s, int n_in, int64_t r0, int64_t r1)
{
    const int nsb = n_in / 256;
    for (int64_t r = r0; r < r1; r += 16) {
        const uint8_t *base = W + (size_t)r * rb;
        if (r1 - r >= 16) {
            _mm512_storeu_ps(y + r, gemv_q4k_rows(base, rb, q, d, s, nsb, 16, 1));
        } else {
            const int rows = (int)(r1 - r);
            _mm512_mask_storeu_ps(y + r, (__mmask16)((1u << rows) - 1),
                                  gemv_q4k_rows(base, rb, q, d, s, nsb, rows, 0));
        }
    }
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
    if (isa >= CPU_ISA_AVX512 && T == 1 && wtype == CAIRN_TYPE_Q4_K) {
        gemv_q4k(y, W, row_bytes, q, d, s, n_in, r0, r1);
        return;
    }
    if (isa >= CPU_ISA_AVX512 && T == 1 && wtype == CAIRN_TYPE_Q6_K) {
        gemv_q6k(y, W, row_bytes, q, d, n_in, r0, r1);
        return;
    }
    if (isa >= CPU_ISA_AVX512) { /* the panel: see cpu_x86_impl.h */
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
