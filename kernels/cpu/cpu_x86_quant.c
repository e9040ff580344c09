/*
 * kernels/cpu/cpu_x86_quant.c — the AVX-512 (VNNI) and AVX2 matmul kernels
 * of every quantized weight type (Q8_0, Q4_0, Q5_0, Q4_Z, MXFP4, Q4_K, Q5_K,
 * Q6_K) against activations quantized to int8 (cpu_x86_quantize_act). They
 * read weights in the packed layout (cpu_impl.h, "Packed weights"): a
 * group of 16 rows whose codes lie as column vectors, dword i of a 64-byte
 * vector holding 4 consecutive codes of row i. One function per ISA level,
 * cpu_x86_gemm_group, computes a group for any number of tokens.
 *
 * Outer-product form: a code vector times 4 activation bytes broadcast
 * advances the block sums of all 16 rows at once (vpdpbusd; on AVX2
 * vpmaddubsw + vpmaddwd over 8 rows), so no horizontal sum is ever needed
 * and each weight byte is loaded once per tile of tokens:
 *
 *                  activations of token c, block b: a0 a1 ... a31
 *                      |4 bytes|4 bytes| ...
 *     code vector k:  [row 0: c4k..c4k+3][row 1: ...] ... [row 15: ...]
 *         vpdpbusd(acc, vector k, broadcast(a4k..a4k+3))  -> 16 row sums
 *
 * Per output element (row r, token t) every level computes exactly
 *
 *     iacc_b = sum_i c_i q_i - Z s_b                (exact, in int32)
 *     acc    = fma((float)iacc_b, d_w d_a, acc)     for b = 0, 1, ... in order
 *
 * with the type's zero Z and scales (cpu_impl.h at cpu_q8act_type gives
 * the expression of each type), starting from acc = 0. Integer sums are
 * exact in any order and every float operation is the same single
 * rounding on every level, so the AVX-512 kernel, the AVX2 kernel and the
 * scalar reference (cpu_matmul.c) give the same bits for any batch size,
 * token tile or thread count: a token's result never depends on what else
 * is in the batch or on which kernel ran.
 */
#include <string.h>

#include "kernels/cpu/cpu_x86_impl.h"

#if CPU_X86_KERNELS

/* Tokens per pass over a group: as many accumulators as the registers
 * hold beside the 8 code vectors. */
#define TILE_512 8

#define TILE_256 4

static inline int is_kquant(cairn_type t)
{
    return t == CAIRN_TYPE_Q4_K || t == CAIRN_TYPE_Q5_K || t == CAIRN_TYPE_Q6_K;
}

/* ---- AVX-512 ---------------------------------------------------------------- */

/* The 8 code vectors of block b of a group, unsigned: w[k] holds codes
 * 4k..4k+3 of the block for the 16 rows (k < 4 the low nibbles of the
 * nibble types, k >= 4 their high nibbles, i.e. codes 16 + 4(k - 4)...). */
INLINE T512 void codes_512(const cpu_pack_geom *g, const uint8_t *grp, cairn_type t, int b,
                           const int j, const int hi16, __m512i w[8])
{
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    if (t == CAIRN_TYPE_Q8_0) {
        const uint8_t *m = grp + (size_t)b * g->main_bytes;
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            w[k] = _mm512_load_si512(m + 64 * k);
        return;
    }
    if (!is_kquant(t)) { /* Q4_0, Q5_0, Q4_Z, MXFP4 */
        const uint8_t *m = grp + (size_t)b * g->main_bytes;
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const __m512i v = _mm512_load_si512(m + 64 * k);
            w[k] = _mm512_and_si512(v, low4);
            /* Q4_0, Q4_Z with hi16: the high nibbles stay in place, 16
             * times their code (one XOR instead of a shift and an AND),
             * and the caller divides their exact sum by 16 per token:
             * worth it for one or two tokens */
            w[k + 4] = (t == CAIRN_TYPE_Q4_0 || t == CAIRN_TYPE_Q4_Z) && hi16
                           ? _mm512_xor_si512(v, w[k])
                           : _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        }
        if (t == CAIRN_TYPE_MXFP4) {
            /* nibble -> code 0..24 (cpu_mxfp4_code), the 16-entry table in
             * every 128-bit lane; the nibbles' values are needed, so the
             * high ones are shifted down (no hi16 trick) */
            const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(CPU_MXFP4_CODES));
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++)
                w[k] = _mm512_shuffle_epi8(lut, w[k]);
        }
        if (t == CAIRN_TYPE_Q5_0) {
            const __m512i bit4 = _mm512_set1_epi8(0x10);
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                uint64_t mk;
                memcpy(&mk, m + 256 + 8 * k, 8);
                w[k] = _mm512_mask_add_epi8(w[k], (__mmask64)mk, w[k], bit4);
            }
        }
        return;
    }
    const int sb = b / 8;
    const uint8_t *m = grp + (size_t)sb * g->main_bytes;
    if (t == CAIRN_TYPE_Q6_K) {
        const int h = j / 4, k4 = j % 4;
        const uint8_t *ql = m + 512 * (2 * h + (k4 & 1)), *qh = m + 2048 + 512 * h;
        const __m512i bits45 = _mm512_set1_epi8(0x30);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m512i l = _mm512_load_si512(ql + 64 * k);
            const __m512i lo = k4 < 2 ? _mm512_and_si512(l, low4)
                                      : _mm512_and_si512(_mm512_srli_epi16(l, 4), low4);
            const __m512i hv = _mm512_load_si512(qh + 64 * k);
            /* bits 2k4, 2k4+1 of each byte to bits 4, 5 (16-bit shifts: the
             * mask keeps only bits that stayed in their byte) */
            const __m512i hb = k4 == 0 ? _mm512_slli_epi16(hv, 4)
                             : k4 == 1 ? _mm512_slli_epi16(hv, 2)
                             : k4 == 2 ? hv
                                       : _mm512_srli_epi16(hv, 2);
            w[k] = _mm512_ternarylogic_epi32(lo, hb, bits45, 0xf8); /* lo | (hb & 0x30) */
        }
        return;
    }
    /* Q4_K, Q5_K: pair j/2 of the 128 code bytes, low nibbles for even j;
     * with hi16, Q4_K's odd blocks keep their high nibbles in place (16
     * times the code; the caller divides the exact sum by 16) */
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        const __m512i v = _mm512_load_si512(m + 512 * (j / 2) + 64 * k);
        w[k] = !(j & 1)                ? _mm512_and_si512(v, low4)
             : t == CAIRN_TYPE_Q4_K && hi16 ? _mm512_andnot_si512(low4, v)
                                    : _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        if (t == CAIRN_TYPE_Q5_K) {
            /* bit j of qh's byte to bit 4 */
            const __m512i hv = _mm512_load_si512(m + 2048 + 64 * k);
            const __m512i hb = j <= 4 ? _mm512_slli_epi16(hv, 4 - j) : _mm512_srli_epi16(hv, j - 4);
            w[k] = _mm512_ternarylogic_epi32(w[k], hb, _mm512_set1_epi8(0x10), 0xf8);
        }
    }
}

/* The 6-bit scales (sc) and mins (mn) of a Q4_K/Q5_K super-block of the
 * 16 rows, from the three dword columns of its 12 packed bytes: lane i of
 * sc[0] holds sc_0..sc_3 of row i as bytes, sc[1] sc_4..sc_7, and the
 * same for mn (cpu_kq_scales' unpacking, 16 rows at once). */
INLINE T512 void kq_scales_512(const uint8_t *col, __m512i sc[2], __m512i mn[2])
{
    const __m512i w0 = _mm512_load_si512(col), w1 = _mm512_load_si512(col + 64);
    const __m512i w2 = _mm512_load_si512(col + 128);
    const __m512i m6 = _mm512_set1_epi32(0x3f3f3f3f), m4 = _mm512_set1_epi32(0x0f0f0f0f);
    const __m512i hi2 = _mm512_set1_epi32(0x30303030);
    sc[0] = _mm512_and_si512(w0, m6);
    mn[0] = _mm512_and_si512(w1, m6);
    /* (w2 & 0x0f) | ((w0 >> 2) & 0x30), per byte */
    sc[1] = _mm512_ternarylogic_epi32(_mm512_and_si512(w2, m4), _mm512_srli_epi32(w0, 2), hi2,
                                      0xf8);
    mn[1] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi32(w2, 4), m4),
                                      _mm512_srli_epi32(w1, 2), hi2, 0xf8);
}

/* Byte j % 4 of each lane of v[j / 4], as floats. */
INLINE T512 __m512 byte_lane_512(const __m512i v[2], int j)
{
    const __m512i x = _mm512_srli_epi32(v[j / 4], 8 * (j % 4));
    return _mm512_cvtepi32_ps(_mm512_and_si512(x, _mm512_set1_epi32(0xff)));
}

/* The weight scales of block b of a group, 16 rows in the lanes: A (and B
 * for the K-quants' mins and Q6_K's second half; nz = -z for Q4_Z), with
 * the super-block state (d, dmin, the 6-bit scales) refreshed at its first
 * block. */
typedef struct {
    __m512i sc[2], mn[2];
    __m512 d, dmin;
} kq_state_512;

/* MXFP4: the 16 rows' E8M0 exponents e (as int32) to their scales
 * 2^(e - 128), exactly as cpu_mxfp4_scale: float bits max((e - 1) << 23,
 * (e + 1) << 21), the second the subnormal of e = 0 and 1. */
INLINE T512 __m512 mxfp4_scale_512(__m512i e)
{
    const __m512i a = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i b = _mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(1)), 21);
    return _mm512_castsi512_ps(_mm512_max_epi32(a, b));
}

INLINE T512 void scales_512(const cpu_pack_geom *g, const uint8_t *grp, cairn_type t, int b,
                            const int j, kq_state_512 *st, __m512 *A, __m512 *B, __m512i *nz)
{
    const uint8_t *side = grp + g->side_off;
    if (!is_kquant(t)) {
        const uint8_t *sd = side + (size_t)b * g->side_bytes;
        if (t == CAIRN_TYPE_MXFP4) {
            *A = mxfp4_scale_512(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)sd)));
            return;
        }
        *A = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sd));
        if (t == CAIRN_TYPE_Q4_Z)
            *nz = _mm512_sub_epi32(_mm512_setzero_si512(),
                                   _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sd + 32))));
        return;
    }
    const int sbi = b / 8;
    const uint8_t *mb = grp + (size_t)sbi * g->main_bytes;
    if (t == CAIRN_TYPE_Q6_K) {
        if (j == 0)
            st->d = _mm512_cvtph_ps(
                _mm256_loadu_si256((const __m256i *)(side + (size_t)sbi * g->side_bytes)));
        const int8_t *scv = (const int8_t *)(mb + 3072);
        *A = _mm512_mul_ps(st->d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                      _mm_load_si128((const __m128i *)(scv + 32 * j)))));
        *B = _mm512_mul_ps(st->d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                      _mm_load_si128((const __m128i *)(scv + 32 * j + 16)))));
        return;
    }
    const size_t hd = t == CAIRN_TYPE_Q4_K ? 2048 : 2560;
    if (j == 0) {
        st->d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(mb + hd)));
        st->dmin = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(mb + hd + 32)));
        kq_scales_512(mb + hd + 64, st->sc, st->mn);
    }
    *A = _mm512_mul_ps(st->d, byte_lane_512(st->sc, j));
    *B = _mm512_mul_ps(st->dmin, byte_lane_512(st->mn, j));
}

/* Tokens [0, C) of P (1 or 2) consecutive groups: y[c][16p .. 16p + 16)
 * (lanes outside m[p] not stored). Two groups share every activation
 * broadcast, which halves the loads per weight byte of a lone token. */
INLINE T512 void group_512(const cpu_pack_geom *g, const uint8_t *grp, cairn_type t,
                           const cpu_act *act, int t0, int n_in, const int P, const int C, float *y,
                           int n_out, __mmask16 m0, __mmask16 m1, int pf)
{
    const int nb = n_in / 32;
    /* entry (token t0 + c, block b) of the activations is base + 8 b + c */
    const size_t base = cpu_act_index(nb, t0, 0);
    const int8_t *qt = act->q + 32 * base;
    const float *dt = act->d + base, *zft = act->zf + base;
    const int32_t *zit = act->zi + base, *zi2t = act->zi2 + base;
    /* one or two tokens: high nibbles at 16 times their value (codes_512),
     * and two dpbusd chains per block so a lone token is not one long
     * dependency (more tokens hide the latency; the sums are the same) */
    const int hi16 = C <= 2, split = C == 1;
    /* bytes of the group stream per block, for the prefetch */
    const size_t step = g->main_bytes / (size_t)(is_kquant(t) ? 8 : 1);
    __m512 facc[2][TILE_512];
#pragma GCC unroll 2
    for (int p = 0; p < P; p++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++)
            facc[p][c] = _mm512_setzero_ps();
    kq_state_512 st[2];
    memset(st, 0, sizeof st);
    /* blocks per super-block: unrolled, so every K-quant block index,
     * shift and offset below is a constant */
    const int bps = is_kquant(t) ? 8 : 1;
    for (int b0 = 0; b0 < nb; b0 += bps)
#pragma GCC unroll 8
    for (int b = b0; b < b0 + bps; b++) {
        __m512i w[2][8], nz[2];
        __m512 A[2], B[2];
#pragma GCC unroll 2
        for (int p = 0; p < P; p++) {
            const uint8_t *gp = grp + (size_t)p * g->group_bytes;
            if (pf > 0) {
                const char *ahead = (const char *)gp + (size_t)b * step + pf;
                for (size_t off = 0; off < step; off += 64)
                    _mm_prefetch(ahead + off, _MM_HINT_T1);
            }
            codes_512(g, gp, t, b, b - b0, hi16, w[p]);
            B[p] = _mm512_setzero_ps();
            nz[p] = _mm512_setzero_si512();
            scales_512(g, gp, t, b, b - b0, &st[p], &A[p], &B[p], &nz[p]);
        }
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            const size_t e = 8 * (size_t)b + (size_t)c;
            const int8_t *qb = qt + 32 * e;
            const __m512 vda = _mm512_set1_ps(dt[e]);
            __m512i a4[8];
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++)
                a4[k] = _mm512_broadcastd_epi32(_mm_loadu_si32(qb + 4 * k));
            if (t == CAIRN_TYPE_Q6_K) {
                /* two 16-code halves with their own scales; zero 32 */
#pragma GCC unroll 2
                for (int p = 0; p < P; p++) {
                    __m512i lo = _mm512_set1_epi32(zit[e]);
                    __m512i hi = _mm512_set1_epi32(zi2t[e]);
#pragma GCC unroll 4
                    for (int k = 0; k < 4; k++) {
                        lo = _mm512_dpbusd_epi32(lo, w[p][k], a4[k]);
                        hi = _mm512_dpbusd_epi32(hi, w[p][k + 4], a4[k + 4]);
                    }
                    facc[p][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), _mm512_mul_ps(A[p], vda),
                                                 facc[p][c]);
                    facc[p][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), _mm512_mul_ps(B[p], vda),
                                                 facc[p][c]);
                }
                continue;
            }
#pragma GCC unroll 2
            for (int p = 0; p < P; p++) {
                /* two chains of 4, so a lone token's block is not one long
                 * dependency; the integer sum is the same */
                __m512i i0, i1 = _mm512_setzero_si512();
                if (t == CAIRN_TYPE_Q4_Z)
                    i0 = _mm512_mullo_epi32(nz[p], _mm512_set1_epi32(zit[e]));
                else if (is_kquant(t))
                    i0 = _mm512_setzero_si512();
                else
                    i0 = _mm512_set1_epi32(zit[e]);
                const int lo_hi = hi16 && (t == CAIRN_TYPE_Q4_0 || t == CAIRN_TYPE_Q4_Z);
                __m512i isum_i;
                if (split || lo_hi) {
#pragma GCC unroll 4
                    for (int k = 0; k < 4; k++) {
                        i0 = _mm512_dpbusd_epi32(i0, w[p][k], a4[k]);
                        i1 = _mm512_dpbusd_epi32(i1, w[p][k + 4], a4[k + 4]);
                    }
                    if (lo_hi) /* 16 x the high nibbles' sum */
                        i1 = _mm512_srai_epi32(i1, 4);
                    isum_i = _mm512_add_epi32(i0, i1);
                } else {
#pragma GCC unroll 8
                    for (int k = 0; k < 8; k++)
                        i0 = _mm512_dpbusd_epi32(i0, w[p][k], a4[k]);
                    isum_i = i0;
                }
                if (t == CAIRN_TYPE_Q4_K && hi16 && ((b - b0) & 1)) /* 16 x the block's sum */
                    isum_i = _mm512_srai_epi32(isum_i, 4);
                const __m512 isum = _mm512_cvtepi32_ps(isum_i);
                facc[p][c] = _mm512_fmadd_ps(isum, _mm512_mul_ps(A[p], vda), facc[p][c]);
                if (t == CAIRN_TYPE_Q4_K || t == CAIRN_TYPE_Q5_K)
                    facc[p][c] = _mm512_fmadd_ps(B[p], _mm512_set1_ps(zft[e]), facc[p][c]);
            }
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < C; c++) {
        _mm512_mask_storeu_ps(y + (size_t)c * n_out, m0, facc[0][c]);
        if (P > 1)
            _mm512_mask_storeu_ps(y + (size_t)c * n_out + 16, m1, facc[1][c]);
    }
}

/* One instantiation per type, so its decoding is resolved at compile
 * time; P = 2 with up to 4 tokens, P = 1 with up to 8. */
#define GROUP_512_TYPED(NAME, TYPE)                                                                \
    static __attribute__((noinline)) T512 void NAME(                                               \
        const cpu_pack_geom *g, const uint8_t *grp, const cpu_act *act, int t0, int n_in, int P,   \
        int C, float *y, int n_out, __mmask16 m0, __mmask16 m1, int pf)                            \
    {                                                                                              \
        switch (P * 16 + C) {                                                                      \
        case 16 + 1: group_512(g, grp, TYPE, act, t0, n_in, 1, 1, y, n_out, m0, m1, pf); break;    \
        case 16 + 2: group_512(g, grp, TYPE, act, t0, n_in, 1, 2, y, n_out, m0, m1, pf); break;    \
        case 16 + 3: group_512(g, grp, TYPE, act, t0, n_in, 1, 3, y, n_out, m0, m1, pf); break;    \
        case 16 + 4: group_512(g, grp, TYPE, act, t0, n_in, 1, 4, y, n_out, m0, m1, pf); break;    \
        case 16 + 5: group_512(g, grp, TYPE, act, t0, n_in, 1, 5, y, n_out, m0, m1, pf); break;    \
        case 16 + 6: group_512(g, grp, TYPE, act, t0, n_in, 1, 6, y, n_out, m0, m1, pf); break;    \
        case 16 + 7: group_512(g, grp, TYPE, act, t0, n_in, 1, 7, y, n_out, m0, m1, pf); break;    \
        case 16 + 8: group_512(g, grp, TYPE, act, t0, n_in, 1, 8, y, n_out, m0, m1, pf); break;    \
        case 32 + 1: group_512(g, grp, TYPE, act, t0, n_in, 2, 1, y, n_out, m0, m1, pf); break;    \
        case 32 + 2: group_512(g, grp, TYPE, act, t0, n_in, 2, 2, y, n_out, m0, m1, pf); break;    \
        case 32 + 3: group_512(g, grp, TYPE, act, t0, n_in, 2, 3, y, n_out, m0, m1, pf); break;    \
        default: group_512(g, grp, TYPE, act, t0, n_in, 2, 4, y, n_out, m0, m1, pf); break;        \
        }                                                                                          \
    }
GROUP_512_TYPED(group_512_q8_0, CAIRN_TYPE_Q8_0)
GROUP_512_TYPED(group_512_q4_0, CAIRN_TYPE_Q4_0)
GROUP_512_TYPED(group_512_q5_0, CAIRN_TYPE_Q5_0)
GROUP_512_TYPED(group_512_q4_z, CAIRN_TYPE_Q4_Z)
GROUP_512_TYPED(group_512_mxfp4, CAIRN_TYPE_MXFP4)
GROUP_512_TYPED(group_512_q4_k, CAIRN_TYPE_Q4_K)
GROUP_512_TYPED(group_512_q5_k, CAIRN_TYPE_Q5_K)
GROUP_512_TYPED(group_512_q6_k, CAIRN_TYPE_Q6_K)

/* ---- AVX2 -------------------------------------------------------------------- */

/* AVX2 has no vpdpbusd: u8 x s8 pairs are summed into int16 by vpmaddubsw
 * and into int32 by vpmaddwd. A group is computed as two halves of 8 rows
 * (the low and high 32 bytes of every 64-byte column vector). Products of
 * codes below 16 (32: Q5_0, Q5_K and MXFP4's 0..24; 64) with activations
 * in [-127, 127] leave pair sums small enough that 8 (4, 2) of them add up
 * in int16 without saturating before one vpmaddwd; Q8_0's codes are
 * multiplied as signed values (|w| x sign(a, w)), whose pair sums fit only
 * one at a time. The integer block sums come out the same as vpdpbusd's,
 * hence the same floats. */

INLINE T256 __m256i load_half(const uint8_t *p, int h)
{
    return _mm256_load_si256((const __m256i *)(p + 32 * h));
}

/* Q5_0: 32 bits of a lane mask (bit 4i + e for rows 8h..8h+7) to bytes
 * of 0x10 where set. */
INLINE T256 __m256i q5_bits_256(uint32_t bits)
{
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2,
                                            2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i select = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i x = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread),
                                       select);
    return _mm256_and_si256(_mm256_cmpeq_epi8(x, select), _mm256_set1_epi8(0x10));
}

/* codes_512's vectors for rows 8h..8h+7. */
INLINE T256 void codes_256(const cpu_pack_geom *g, const uint8_t *grp, cairn_type t, int b,
                           const int j, int h, __m256i w[8])
{
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    if (t == CAIRN_TYPE_Q8_0) {
        const uint8_t *m = grp + (size_t)b * g->main_bytes;
        const __m256i flip = _mm256_set1_epi8((char)0x80);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) /* back to the signed code */
            w[k] = _mm256_xor_si256(load_half(m + 64 * k, h), flip);
        return;
    }
    if (!is_kquant(t)) {
        const uint8_t *m = grp + (size_t)b * g->main_bytes;
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const __m256i v = load_half(m + 64 * k, h);
            w[k] = _mm256_and_si256(v, low4);
            w[k + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        }
        if (t == CAIRN_TYPE_MXFP4) { /* as codes_512 */
            const __m256i lut = _mm256_broadcastsi128_si256(_mm_setr_epi8(CPU_MXFP4_CODES));
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++)
                w[k] = _mm256_shuffle_epi8(lut, w[k]);
        }
        if (t == CAIRN_TYPE_Q5_0) {
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) {
                uint64_t mk;
                memcpy(&mk, m + 256 + 8 * k, 8);
                w[k] = _mm256_or_si256(w[k], q5_bits_256((uint32_t)(mk >> (32 * h))));
            }
        }
        return;
    }
    const int sb = b / 8;
    const uint8_t *m = grp + (size_t)sb * g->main_bytes;
    if (t == CAIRN_TYPE_Q6_K) {
        const int hh = j / 4, k4 = j % 4;
        const uint8_t *ql = m + 512 * (2 * hh + (k4 & 1)), *qh = m + 2048 + 512 * hh;
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m256i l = load_half(ql + 64 * k, h);
            const __m256i lo = k4 < 2 ? _mm256_and_si256(l, low4)
                                      : _mm256_and_si256(_mm256_srli_epi16(l, 4), low4);
            const __m256i hv = load_half(qh + 64 * k, h);
            const __m256i hb = k4 == 0 ? _mm256_slli_epi16(hv, 4)
                             : k4 == 1 ? _mm256_slli_epi16(hv, 2)
                             : k4 == 2 ? hv
                                       : _mm256_srli_epi16(hv, 2);
            w[k] = _mm256_or_si256(lo, _mm256_and_si256(hb, _mm256_set1_epi8(0x30)));
        }
        return;
    }
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        const __m256i v = load_half(m + 512 * (j / 2) + 64 * k, h);
        w[k] = (j & 1) ? _mm256_and_si256(_mm256_srli_epi16(v, 4), low4)
                       : _mm256_and_si256(v, low4);
        if (t == CAIRN_TYPE_Q5_K) {
            const __m256i hv = load_half(m + 2048 + 64 * k, h);
            const __m256i hb = j <= 4 ? _mm256_slli_epi16(hv, 4 - j) : _mm256_srli_epi16(hv, j - 4);
            w[k] = _mm256_or_si256(w[k], _mm256_and_si256(hb, _mm256_set1_epi8(0x10)));
        }
    }
}

/* Exact sum over code vectors [k0, k1) of w[k] x activation bytes 4k..4k+3:
 * int16 runs of `run` vpmaddubsw, each run widened by one vpmaddwd. */
INLINE T256 __m256i dot_256(const __m256i w[8], const int8_t *qb, int k0, int k1, int run,
                            int signed_codes)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc = _mm256_setzero_si256(), p16 = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int k = k0; k < k1; k++) {
        const __m256i a = _mm256_broadcastd_epi32(_mm_loadu_si32(qb + 4 * k));
        const __m256i p = signed_codes
                              ? _mm256_maddubs_epi16(_mm256_abs_epi8(w[k]), _mm256_sign_epi8(a, w[k]))
                              : _mm256_maddubs_epi16(w[k], a);
        p16 = (k - k0) % run == 0 ? p : _mm256_add_epi16(p16, p);
        if ((k - k0) % run == run - 1 || k == k1 - 1)
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p16, ones));
    }
    return acc;
}

/* mxfp4_scale_512 for 8 rows. */
INLINE T256 __m256 mxfp4_scale_256(__m256i e)
{
    const __m256i a = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i b = _mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(1)), 21);
    return _mm256_castsi256_ps(_mm256_max_epi32(a, b));
}

/* kq_scales_512 for 8 rows. */
INLINE T256 void kq_scales_256(const uint8_t *col, int h, __m256i sc[2], __m256i mn[2])
{
    const __m256i w0 = load_half(col, h), w1 = load_half(col + 64, h);
    const __m256i w2 = load_half(col + 128, h);
    const __m256i m6 = _mm256_set1_epi32(0x3f3f3f3f), m4 = _mm256_set1_epi32(0x0f0f0f0f);
    const __m256i hi2 = _mm256_set1_epi32(0x30303030);
    sc[0] = _mm256_and_si256(w0, m6);
    mn[0] = _mm256_and_si256(w1, m6);
    sc[1] = _mm256_or_si256(_mm256_and_si256(w2, m4),
                            _mm256_and_si256(_mm256_srli_epi32(w0, 2), hi2));
    mn[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w2, 4), m4),
                            _mm256_and_si256(_mm256_srli_epi32(w1, 2), hi2));
}

INLINE T256 __m256 byte_lane_256(const __m256i v[2], int j)
{
    const __m256i x = _mm256_srli_epi32(v[j / 4], 8 * (j % 4));
    return _mm256_cvtepi32_ps(_mm256_and_si256(x, _mm256_set1_epi32(0xff)));
}

/* group_512 for rows 8h..8h+7 and C <= TILE_256 tokens; `rows` of the 8
 * are stored. */
INLINE T256 void group_256(const cpu_pack_geom *g, const uint8_t *grp, cairn_type t, int h,
                           const cpu_act *act, int t0, int n_in, const int C, float *y, int n_out,
                           int rows)
{
    const int nb = n_in / 32;
    const size_t base = cpu_act_index(nb, t0, 0); /* as in group_512 */
    const int8_t *qt = act->q + 32 * base;
    const float *dt = act->d + base, *zft = act->zf + base;
    const int32_t *zit = act->zi + base, *zi2t = act->zi2 + base;
    /* int16 run lengths (see above) */
    const int run = t == CAIRN_TYPE_Q8_0                             ? 1
                  : t == CAIRN_TYPE_Q6_K                             ? 2
                  : t == CAIRN_TYPE_Q5_0 || t == CAIRN_TYPE_Q5_K ||
                            t == CAIRN_TYPE_MXFP4                    ? 4
                                                                     : 8;
    const uint8_t *side = grp + g->side_off;
    __m256 facc[TILE_256];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++)
        facc[c] = _mm256_setzero_ps();
    __m256i sc[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()}, mn[2] = {sc[0], sc[1]};
    __m256 dsb = _mm256_setzero_ps(), dmin = _mm256_setzero_ps();
    const int bps = is_kquant(t) ? 8 : 1; /* unrolled: constant K-quant offsets */
    for (int b0 = 0; b0 < nb; b0 += bps)
#pragma GCC unroll 8
    for (int b = b0; b < b0 + bps; b++) {
        const int j = b - b0;
        __m256i w[8];
        codes_256(g, grp, t, b, j, h, w);
        __m256 A, B = _mm256_setzero_ps();
        __m256i nz = _mm256_setzero_si256();
        if (!is_kquant(t)) {
            const uint8_t *sd = side + (size_t)b * g->side_bytes;
            if (t == CAIRN_TYPE_MXFP4) {
                int64_t e8;
                memcpy(&e8, sd + 8 * h, 8);
                A = mxfp4_scale_256(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(e8)));
            } else {
                A = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sd + 16 * h)));
            }
            if (t == CAIRN_TYPE_Q4_Z) {
                int64_t z8;
                memcpy(&z8, sd + 32 + 8 * h, 8);
                nz = _mm256_sub_epi32(_mm256_setzero_si256(),
                                      _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(z8)));
            }
        } else {
            const int sbi = b / 8;
            const uint8_t *mb = grp + (size_t)sbi * g->main_bytes;
            if (t == CAIRN_TYPE_Q6_K) {
                if (j == 0)
                    dsb = _mm256_cvtph_ps(_mm_loadu_si128(
                        (const __m128i *)(side + (size_t)sbi * g->side_bytes + 16 * h)));
                const int8_t *scv = (const int8_t *)(mb + 3072) + 8 * h;
                int64_t s0, s1;
                memcpy(&s0, scv + 32 * j, 8);
                memcpy(&s1, scv + 32 * j + 16, 8);
                A = _mm256_mul_ps(dsb, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(s0))));
                B = _mm256_mul_ps(dsb, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(s1))));
            } else {
                const size_t hd = t == CAIRN_TYPE_Q4_K ? 2048 : 2560;
                if (j == 0) {
                    dsb = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(mb + hd + 16 * h)));
                    dmin = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(mb + hd + 32 + 16 * h)));
                    kq_scales_256(mb + hd + 64, h, sc, mn);
                }
                A = _mm256_mul_ps(dsb, byte_lane_256(sc, j));
                B = _mm256_mul_ps(dmin, byte_lane_256(mn, j));
            }
        }
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const size_t e = 8 * (size_t)b + (size_t)c;
            const int8_t *qb = qt + 32 * e;
            const __m256 vda = _mm256_set1_ps(dt[e]);
            if (t == CAIRN_TYPE_Q6_K) {
                const __m256i lo = _mm256_add_epi32(_mm256_set1_epi32(zit[e]),
                                                    dot_256(w, qb, 0, 4, run, 0));
                const __m256i hi = _mm256_add_epi32(_mm256_set1_epi32(zi2t[e]),
                                                    dot_256(w, qb, 4, 8, run, 0));
                facc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), _mm256_mul_ps(A, vda), facc[c]);
                facc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), _mm256_mul_ps(B, vda), facc[c]);
                continue;
            }
            /* Q8_0's codes are signed here: no zero point to take out */
            __m256i isum = dot_256(w, qb, 0, 8, run, t == CAIRN_TYPE_Q8_0);
            if (t == CAIRN_TYPE_Q4_Z)
                isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(nz, _mm256_set1_epi32(zit[e])));
            else if (t == CAIRN_TYPE_Q4_0 || t == CAIRN_TYPE_Q5_0 || t == CAIRN_TYPE_MXFP4)
                isum = _mm256_add_epi32(isum, _mm256_set1_epi32(zit[e]));
            facc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(A, vda), facc[c]);
            if (t == CAIRN_TYPE_Q4_K || t == CAIRN_TYPE_Q5_K)
                facc[c] = _mm256_fmadd_ps(B, _mm256_set1_ps(zft[e]), facc[c]);
        }
    }
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(rows), lanes);
#pragma GCC unroll 4
    for (int c = 0; c < C; c++)
        _mm256_maskstore_ps(y + (size_t)c * n_out, keep, facc[c]);
}

#define GROUP_CASES4(FN, TYPE, C, ...)                                                             \
    switch (C) {                                                                                   \
    case 1: FN(__VA_ARGS__, TYPE, 1); break;                                                       \
    case 2: FN(__VA_ARGS__, TYPE, 2); break;                                                       \
    case 3: FN(__VA_ARGS__, TYPE, 3); break;                                                       \
    default: FN(__VA_ARGS__, TYPE, 4); break;                                                      \
    }
#define CALL_256(g, grp, h, act, t0, n_in, y, n_out, rows, TYPE, C)                               \
    group_256(g, grp, TYPE, h, act, t0, n_in, C, y, n_out, rows)

#define GROUP_256_TYPED(NAME, TYPE)                                                                \
    static __attribute__((noinline)) T256 void NAME(const cpu_pack_geom *g, const uint8_t *grp,   \
                                                    int h, const cpu_act *act, int t0, int n_in,   \
                                                    int C, float *y, int n_out, int rows)          \
    {                                                                                              \
        GROUP_CASES4(CALL_256, TYPE, C, g, grp, h, act, t0, n_in, y, n_out, rows)                  \
    }
GROUP_256_TYPED(group_256_q8_0, CAIRN_TYPE_Q8_0)
GROUP_256_TYPED(group_256_q4_0, CAIRN_TYPE_Q4_0)
GROUP_256_TYPED(group_256_q5_0, CAIRN_TYPE_Q5_0)
GROUP_256_TYPED(group_256_q4_z, CAIRN_TYPE_Q4_Z)
GROUP_256_TYPED(group_256_mxfp4, CAIRN_TYPE_MXFP4)
GROUP_256_TYPED(group_256_q4_k, CAIRN_TYPE_Q4_K)
GROUP_256_TYPED(group_256_q5_k, CAIRN_TYPE_Q5_K)
GROUP_256_TYPED(group_256_q6_k, CAIRN_TYPE_Q6_K)

/* ---- dispatch ------------------------------------------------------------------ */

typedef void (*group512_fn)(const cpu_pack_geom *g, const uint8_t *grp, const cpu_act *act,
                            int t0, int n_in, int P, int C, float *y, int n_out, __mmask16 m0,
                            __mmask16 m1, int pf);
typedef void (*group256_fn)(const cpu_pack_geom *g, const uint8_t *grp, int h, const cpu_act *act,
                            int t0, int n_in, int C, float *y, int n_out, int rows);

static __mmask16 lane_mask(int rows)
{
    return rows >= 16 ? 0xffff : rows <= 0 ? 0 : (__mmask16)((1u << rows) - 1);
}

int cpu_x86_gemm_groups(cpu_isa isa, const cpu_pack_geom *g, const uint8_t *grp, int rows,
                        const cpu_act *act, int T, int n_in, float *y, int n_out,
                        const cpu_quant_tuning *tune)
{
    const cairn_type t = g->type;
    if (isa >= CPU_ISA_AVX512) {
        const group512_fn fn = t == CAIRN_TYPE_Q8_0   ? group_512_q8_0
                             : t == CAIRN_TYPE_Q4_0   ? group_512_q4_0
                             : t == CAIRN_TYPE_Q5_0   ? group_512_q5_0
                             : t == CAIRN_TYPE_Q4_Z   ? group_512_q4_z
                             : t == CAIRN_TYPE_MXFP4  ? group_512_mxfp4
                             : t == CAIRN_TYPE_Q4_K   ? group_512_q4_k
                             : t == CAIRN_TYPE_Q5_K   ? group_512_q5_k
                                                      : group_512_q6_k;
        for (int r = 0; r < rows; r += 32) {
            const int left = rows - r;
            /* two groups at once for up to tune->pair_tokens tokens */
            const int pair = left > 16 && T <= tune->pair_tokens && !is_kquant(t);
            const int P = pair ? 2 : 1, tile = pair ? 4 : TILE_512;
            const uint8_t *gp = grp + (size_t)(r / 16) * g->group_bytes;
            for (int h = 0; h < 2 && 16 * h < left; h += P) {
                for (int t0 = 0; t0 < T; t0 += tile) {
                    const int C = T - t0 < tile ? T - t0 : tile;
                    fn(g, gp + (size_t)h * g->group_bytes, act, t0, n_in, P, C,
                       y + (size_t)t0 * n_out + r + 16 * h, n_out, lane_mask(left - 16 * h),
                       lane_mask(left - 16 * h - 16), tune->prefetch);
                }
            }
        }
        return 1;
    }
    if (isa >= CPU_ISA_AVX2) {
        const group256_fn fn = t == CAIRN_TYPE_Q8_0   ? group_256_q8_0
                             : t == CAIRN_TYPE_Q4_0   ? group_256_q4_0
                             : t == CAIRN_TYPE_Q5_0   ? group_256_q5_0
                             : t == CAIRN_TYPE_Q4_Z   ? group_256_q4_z
                             : t == CAIRN_TYPE_MXFP4  ? group_256_mxfp4
                             : t == CAIRN_TYPE_Q4_K   ? group_256_q4_k
                             : t == CAIRN_TYPE_Q5_K   ? group_256_q5_k
                                                      : group_256_q6_k;
        for (int r = 0; r < rows; r += 16) {
            const uint8_t *gp = grp + (size_t)(r / 16) * g->group_bytes;
            const int left = rows - r < 16 ? rows - r : 16;
            for (int h = 0; h < 2 && 8 * h < left; h++)
                for (int t0 = 0; t0 < T; t0 += TILE_256) {
                    const int C = T - t0 < TILE_256 ? T - t0 : TILE_256;
                    fn(g, gp, h, act, t0, n_in, C, y + (size_t)t0 * n_out + r + 8 * h, n_out,
                       left - 8 * h);
                }
        }
        return 1;
    }
    return 0;
}

#else /* not x86-64 */

int cpu_x86_gemm_groups(cpu_isa isa, const cpu_pack_geom *g, const uint8_t *grp, int rows,
                        const cpu_act *act, int T, int n_in, float *y, int n_out,
                        const cpu_quant_tuning *tune)
{
    (void)isa, (void)g, (void)grp, (void)rows, (void)act, (void)T, (void)n_in, (void)y;
    (void)n_out, (void)tune;
    return 0;
}

#endif
