/*
 * tests/kernels/test_kquants.c — the Q5_0, Q4_K, Q5_K and Q6_K formats and
 * the CPU kernels that use them:
 *
 *   - layout: bytes fixed by hand (values worked out on paper) and random
 *     blocks packed here, by this file's own reading of the layouts in
 *     common/common.h, must dequantize to exactly the values of the format's
 *     formula (the float arithmetic is part of the definition);
 *   - round trip: cairn_quantize_row then cairn_dequantize_row within each
 *     quantizer's bound (stated at round_trip_bound);
 *   - matmul at every instruction-set level (CAIRN_CPU_ISA), in the default
 *     mode (activations quantized to int8 per 32 elements) and the exact
 *     mode (CAIRN_CPU_EXACT_MATMUL), against a double-precision product of
 *     the dequantized weights with the (dequantized) activations; 1 and 3
 *     threads must agree bitwise;
 *   - get_rows against cairn_dequantize_row.
 * The comparison with an independent implementation (gguf-py's dequantizer,
 * on the real model's tensors and on random bytes) is test_kquants_real.py.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/support.h"

static const cairn_type kq_types[] = {CAIRN_TYPE_Q5_0, CAIRN_TYPE_Q4_K, CAIRN_TYPE_Q5_K,
                                      CAIRN_TYPE_Q6_K};
#define N_KQ_TYPES 4

static const char *const levels[] = {"scalar", "avx2", "avx512"};
#define N_LEVELS 3

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* ---- this test's own packers (from the table in common/common.h) ------- */

static void pack_q5_0(uint16_t dh, const int codes[32], uint8_t out[22])
{
    put16(out, dh);
    uint32_t qh = 0;
    for (int e = 0; e < 32; e++)
        qh |= (uint32_t)((codes[e] >> 4) & 1) << e;
    for (int i = 0; i < 4; i++)
        out[2 + i] = (uint8_t)(qh >> (8 * i));
    for (int j = 0; j < 16; j++)
        out[6 + j] = (uint8_t)((codes[j] & 15) | ((codes[j + 16] & 15) << 4));
}

/* Q4_K (bits 4) / Q5_K (bits 5) */
static void pack_q45k(int bits, uint16_t dh, uint16_t dminh, const int sc[8], const int mn[8],
                      const int codes[256], uint8_t *out)
{
    memset(out, 0, bits == 4 ? 144 : 176);
    put16(out, dh);
    put16(out + 2, dminh);
    uint8_t *b = out + 4;
    for (int j = 0; j < 4; j++) {
        b[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        b[j + 4] = (uint8_t)(mn[j] | ((mn[j + 4] >> 4) << 6));
        b[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
    }
    uint8_t *qh = out + 16, *qs = out + (bits == 4 ? 16 : 48);
    for (int e = 0; e < 256; e++) {
        const int sub = e / 32, l = e % 32;
        qs[32 * (sub / 2) + l] |= (uint8_t)((codes[e] & 15) << (sub % 2 ? 4 : 0));
        if (bits == 5)
            qh[l] |= (uint8_t)(((codes[e] >> 4) & 1) << sub);
    }
}

static void pack_q6k(uint16_t dh, const int sc[16], const int codes[256], uint8_t out[210])
{
    memset(out, 0, 210);
    for (int e = 0; e < 256; e++) {
        const int half = e / 128, k = (e % 128) / 32, l = e % 32;
        uint8_t *ql = out + 64 * half + 32 * (k % 2) + l;
        *ql |= (uint8_t)((codes[e] & 15) << (k >= 2 ? 4 : 0));
        out[128 + 32 * half + l] |= (uint8_t)((codes[e] >> 4) << (2 * k));
    }
    for (int i = 0; i < 16; i++)
        out[192 + i] = (uint8_t)(int8_t)sc[i];
    put16(out + 208, dh);
}

/* A random fp16 scale in [lo, hi). */
static uint16_t rand_half(kt_rng *rng, float lo, float hi)
{
    return cairn_fp32_to_fp16(kt_uniform(rng, lo, hi));
}

/* ---- layout ------------------------------------------------------------- */

static void test_fixed_bytes(void **state)
{
    (void)state;
    float out[256];

    /* Q5_0: d = 2 (0x4000); qh bit 0 and bit 16 set; qs[0] = 0x3f.
     * element 0: 0xf | 16 = 31 -> 2 * 15 = 30; element 16: 3 | 16 = 19 -> 6;
     * element 1: 0 -> -32; element 17: 0 -> -32. */
    uint8_t q5[22] = {0x00, 0x40, 0x01, 0x00, 0x01, 0x00, 0x3f};
    assert_int_equal(cairn_dequantize_row(CAIRN_TYPE_Q5_0, q5, out, 32), CAIRN_OK);
    KT_CLOSE(out[0], 30.0, 0.0, "Q5_0 fixed", 0);
    KT_CLOSE(out[16], 6.0, 0.0, "Q5_0 fixed", 16);
    KT_CLOSE(out[1], -32.0, 0.0, "Q5_0 fixed", 1);
    KT_CLOSE(out[17], -32.0, 0.0, "Q5_0 fixed", 17);

    /* Q4_K: d = 1, dmin = 0.5. scales byte 0 = 0xc5: sc0 = 5 and the top
     * bits (3) of sc4; byte 4 = 0x47: m0 = 7, top bits (1) of m4; byte 8 =
     * 0x21: sc4 = 1 | 3 << 4 = 49, m4 = 2 | 1 << 4 = 18.
     * qs[0] = 0x9a: element 0 = 10 -> 5 * 10 - 0.5 * 7 = 46.5, element 32
     * (sub-block 1, sc = m = 0) = 9 -> 0. qs[64] = 0x03: element 128
     * (sub-block 4) = 3 -> 49 * 3 - 0.5 * 18 = 138. */
    uint8_t q4k[144] = {0};
    put16(q4k, 0x3c00);
    put16(q4k + 2, 0x3800);
    q4k[4 + 0] = 0xc5;
    q4k[4 + 4] = 0x47;
    q4k[4 + 8] = 0x21;
    q4k[16 + 0] = 0x9a;
    q4k[16 + 64] = 0x03;
    assert_int_equal(cairn_dequantize_row(CAIRN_TYPE_Q4_K, q4k, out, 256), CAIRN_OK);
    KT_CLOSE(out[0], 46.5, 0.0, "Q4_K fixed", 0);
    KT_CLOSE(out[32], 0.0, 0.0, "Q4_K fixed", 32);
    KT_CLOSE(out[1], -3.5, 0.0, "Q4_K fixed", 1);
    KT_CLOSE(out[128], 138.0, 0.0, "Q4_K fixed", 128);
    KT_CLOSE(out[129], -9.0, 0.0, "Q4_K fixed", 129);

    /* Q5_K: d = dmin = 1. scales: byte 0 = 2 (sc0), byte 4 = 1 (m0),
     * byte 11 = 0x31 (sc7 = 1, m7 = 3). qh[0] = 0x81: bit 4 of element 0 of
     * sub-blocks 0 and 7. qs[0] = 0x0f: element 0 = 15 | 16 = 31 ->
     * 2 * 31 - 1 = 61; qs[96] = 0x20: element 224 (sub-block 7, high
     * nibble) = 2 | 16 = 18 -> 18 - 3 = 15; element 192 (sub-block 6) = 0. */
    uint8_t q5k[176] = {0};
    put16(q5k, 0x3c00);
    put16(q5k + 2, 0x3c00);
    q5k[4 + 0] = 2;
    q5k[4 + 4] = 1;
    q5k[4 + 11] = 0x31;
    q5k[16 + 0] = 0x81;
    q5k[48 + 0] = 0x0f;
    q5k[48 + 96] = 0x20;
    assert_int_equal(cairn_dequantize_row(CAIRN_TYPE_Q5_K, q5k, out, 256), CAIRN_OK);
    KT_CLOSE(out[0], 61.0, 0.0, "Q5_K fixed", 0);
    KT_CLOSE(out[224], 15.0, 0.0, "Q5_K fixed", 224);
    KT_CLOSE(out[225], -3.0, 0.0, "Q5_K fixed", 225);
    KT_CLOSE(out[192], 0.0, 0.0, "Q5_K fixed", 192);
    KT_CLOSE(out[1], -1.0, 0.0, "Q5_K fixed", 1);

    /* Q6_K: d = 0.5 (last two bytes); ql[0] = 0x21, ql[32] = 0x50,
     * qh[0] = 0xe4 (bits 0-1: 0, 2-3: 1, 4-5: 2, 6-7: 3); scales
     * sc0 = 3, sc2 = -2, sc4 = 4, sc6 = 1.
     *   element 0:  1 | 0 << 4 = 1   -> 0.5 * 3 * (1 - 32)   = -46.5
     *   element 32: 0 | 1 << 4 = 16  -> 0.5 * -2 * (16 - 32) = 16
     *   element 64: 2 | 2 << 4 = 34  -> 0.5 * 4 * 2          = 4
     *   element 96: 5 | 3 << 4 = 53  -> 0.5 * 1 * 21         = 10.5
     * Second half: ql[64] = 0x0f, qh[32] = 0x02, sc8 = -1: element 128 =
     * 15 | 2 << 4 = 47 -> 0.5 * -1 * 15 = -7.5. */
    uint8_t q6k[210] = {0};
    q6k[0] = 0x21;
    q6k[32] = 0x50;
    q6k[128] = 0xe4;
    q6k[64] = 0x0f;
    q6k[160] = 0x02;
    q6k[192 + 0] = 3;
    q6k[192 + 2] = (uint8_t)(int8_t)-2;
    q6k[192 + 4] = 4;
    q6k[192 + 6] = 1;
    q6k[192 + 8] = (uint8_t)(int8_t)-1;
    put16(q6k + 208, 0x3800);
    assert_int_equal(cairn_dequantize_row(CAIRN_TYPE_Q6_K, q6k, out, 256), CAIRN_OK);
    KT_CLOSE(out[0], -46.5, 0.0, "Q6_K fixed", 0);
    KT_CLOSE(out[32], 16.0, 0.0, "Q6_K fixed", 32);
    KT_CLOSE(out[64], 4.0, 0.0, "Q6_K fixed", 64);
    KT_CLOSE(out[96], 10.5, 0.0, "Q6_K fixed", 96);
    KT_CLOSE(out[128], -7.5, 0.0, "Q6_K fixed", 128);
    KT_CLOSE(out[1], 0.5 * 3 * -32, 0.0, "Q6_K fixed", 1);
}

/* Random codes and scales packed by this file's packers must come back as
 * exactly the formula's float values, for several blocks in a row. */
static void test_random_layout(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("random_layout");
    enum { NB = 3 };
    uint8_t buf[NB * 210];
    float out[NB * 256], want[NB * 256];
    int codes[256];
    for (int rep = 0; rep < 50; rep++) {
        /* Q5_0: 8 blocks of 32 */
        for (int b = 0; b < 8; b++) {
            const uint16_t dh = rand_half(&rng, -2, 2);
            for (int e = 0; e < 32; e++) {
                codes[e] = kt_below(&rng, 32);
                want[32 * b + e] = cairn_fp16_to_fp32(dh) * (float)(codes[e] - 16);
            }
            pack_q5_0(dh, codes, buf + 22 * b);
        }
        assert_int_equal(cairn_dequantize_row(CAIRN_TYPE_Q5_0, buf, out, 256), CAIRN_OK);
        for (int i = 0; i < 256; i++)
            KT_CLOSE(out[i], want[i], 0.0, "Q5_0 random layout", i);

        for (int bits = 4; bits <= 5; bits++) {
            const cairn_type t = bits == 4 ? CAIRN_TYPE_Q4_K : CAIRN_TYPE_Q5_K;
            const size_t bs = bits == 4 ? 144 : 176;
            for (int b = 0; b < NB; b++) {
                const uint16_t dh = rand_half(&rng, 0, 0.1f), dminh = rand_half(&rng, 0, 0.1f);
                int sc[8], mn[8];
                for (int j = 0; j < 8; j++) {
                    sc[j] = kt_below(&rng, 64);
                    mn[j] = kt_below(&rng, 64);
                }
                for (int e = 0; e < 256; e++) {
                    codes[e] = kt_below(&rng, 1 << bits);
                    const float scale = cairn_fp16_to_fp32(dh) * (float)sc[e / 32];
                    const float offset = cairn_fp16_to_fp32(dminh) * (float)mn[e / 32];
                    want[256 * b + e] = scale * (float)codes[e] - offset;
                }
                pack_q45k(bits, dh, dminh, sc, mn, codes, buf + bs * b);
            }
            assert_int_equal(cairn_dequantize_row(t, buf, out, NB * 256), CAIRN_OK);
            for (int i = 0; i < NB * 256; i++)
                KT_CLOSE(out[i], want[i], 0.0, cairn_type_get(t)->name, i);
        }

        for (int b = 0; b < NB; b++) {
            const uint16_t dh = rand_half(&rng, 0, 0.1f);
            int sc[16];
            for (int i = 0; i < 16; i++)
                sc[i] = kt_below(&rng, 256) - 128;
            for (int e = 0; e < 256; e++) {
                codes[e] = kt_below(&rng, 64);
                want[256 * b + e] =
                    (cairn_fp16_to_fp32(dh) * (float)sc[e / 16]) * (float)(codes[e] - 32);
            }
            pack_q6k(dh, sc, codes, buf + 210 * b);
        }
        assert_int_equal(cairn_dequantize_row(CAIRN_TYPE_Q6_K, buf, out, NB * 256), CAIRN_OK);
        for (int i = 0; i < NB * 256; i++)
            KT_CLOSE(out[i], want[i], 0.0, "Q6_K random layout", i);
    }
    /* rows that are not a whole number of blocks are refused */
    assert_int_equal(cairn_dequantize_row(CAIRN_TYPE_Q4_K, buf, out, 128), CAIRN_EINVAL);
    assert_int_equal(cairn_quantize_row(CAIRN_TYPE_Q6_K, out, buf, 32), CAIRN_EINVAL);
    assert_int_equal(cairn_quantize_row(CAIRN_TYPE_Q5_0, out, buf, 48), CAIRN_EINVAL);
    assert_int_equal(cairn_type_row_bytes(CAIRN_TYPE_Q5_0, 64), 44);
    assert_int_equal(cairn_type_row_bytes(CAIRN_TYPE_Q4_K, 512), 288);
    assert_int_equal(cairn_type_row_bytes(CAIRN_TYPE_Q5_K, 256), 176);
    assert_int_equal(cairn_type_row_bytes(CAIRN_TYPE_Q6_K, 768), 630);
    assert_int_equal(cairn_type_row_bytes(CAIRN_TYPE_Q6_K, 300), 0);
    for (int i = 0; i < N_KQ_TYPES; i++)
        assert_true(cairn_type_get(kq_types[i])->compute);
}

/* ---- round trip ----------------------------------------------------------- */

/* The quantizers' bounds per element, from the values of its (sub-)block:
 *   Q5_0  d = -vmax/16 (vmax: the value of largest magnitude, signed): the
 *         opposite extreme maps to +16, clamped to 15, so up to |d|; the
 *         fp16 scale adds 16 |d| 2^-11.
 *   Q4_K, Q5_K (qmax = 15, 31): the sub-block is fitted as scale * q -
 *         offset with both rounded up to 6-bit multiples of fp16 super-block
 *         scales, so nothing is clamped and the error is scale/2 <= (R/qmax)
 *         (1 + 2/63 + 2^-10) / 2, R = the largest max(0, max) - min(0, min)
 *         of the super-block's sub-blocks. Bound used: 0.53 R / qmax.
 *   Q6_K  sub-block scale -vmax/32 rounded to an int8 multiple of d =
 *         amax_superblock / (32 * 127): one step (the +32 clamp) plus 16 d
 *         for the scale's rounding, <= amax_sb / 32 * (1 + 1/127 + 1/8).
 * Each gets a 1e-5 relative slack for the float arithmetic of the fit, and
 * an absolute one for fp16 scales in the subnormal range (below 2^-14),
 * whose rounding error is absolute (2^-25): times the largest code, 16 for
 * Q5_0, and 64 + 64 (scale and min factors) for the K-quants. */
static double round_trip_bound(cairn_type t, const float *x, int64_t i)
{
    if (t == CAIRN_TYPE_Q5_0) {
        const float *b = x + i / 32 * 32;
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(b[j]));
        return amax / 16.0 * (1 + 16 * 0x1p-11) * (1 + 1e-5) + 16 * 0x1p-25;
    }
    const float *sb = x + i / 256 * 256;
    if (t == CAIRN_TYPE_Q6_K) {
        float amax = 0;
        for (int j = 0; j < 256; j++)
            amax = fmaxf(amax, fabsf(sb[j]));
        return amax / 32.0 * (1 + 1.0 / 127 + 1.0 / 8) * (1 + 1e-5) + 128 * 0x1p-25;
    }
    double R = 0;
    for (int j = 0; j < 8; j++) {
        float lo = 0, hi = 0;
        for (int l = 0; l < 32; l++) {
            lo = fminf(lo, sb[32 * j + l]);
            hi = fmaxf(hi, sb[32 * j + l]);
        }
        R = fmax(R, (double)hi - lo);
    }
    const double qmax = t == CAIRN_TYPE_Q4_K ? 15 : 31;
    return 0.53 * R / qmax * (1 + 1e-5) + 128 * 0x1p-25;
}

static void round_trip(cairn_type t, int mode, float amp, kt_rng *rng)
{
    const int64_t n = 256 * 4;
    float *x = kt_xmalloc(sizeof(float) * n), *back = kt_xmalloc(sizeof(float) * n);
    uint8_t *q = kt_xmalloc(cairn_type_row_bytes(t, n));
    for (int64_t i = 0; i < n; i++) {
        float v = kt_uniform(rng, -amp, amp);
        if (mode == 1) /* sub-blocks of very different magnitude */
            v *= (i / 32) % 3 == 0 ? 1.0f : (i / 32) % 3 == 1 ? 0.01f : 0.3f;
        if (mode == 2) /* one-signed data, shifted */
            v = fabsf(v) + amp * 0.5f;
        x[i] = v;
    }
    for (int j = 512; j < 768; j++) /* super-block 2 is all zeros */
        x[j] = 0.0f;
    assert_int_equal(cairn_quantize_row(t, x, q, n), CAIRN_OK);
    assert_int_equal(cairn_dequantize_row(t, q, back, n), CAIRN_OK);
    char what[64];
    snprintf(what, sizeof what, "%s round trip mode %d amp %g", cairn_type_get(t)->name, mode,
             (double)amp);
    double sq = 0, sq_bound = 0;
    for (int64_t i = 0; i < n; i++) {
        const double tol = round_trip_bound(t, x, i);
        KT_CLOSE(back[i], x[i], tol, what, i);
        if (i >= 512 && i < 768)
            KT_CLOSE(back[i], 0.0, 0.0, what, i);
        sq += ((double)back[i] - x[i]) * ((double)back[i] - x[i]);
        sq_bound += tol * tol;
    }
    /* and on average well inside it (uniform rounding error: bound^2 / 3
     * for a bound of half a step, less when the bound is a whole step) */
    if (!(sq <= sq_bound / 2.0))
        fail_msg("seed %llu: %s: mean square error %g above half the bound %g",
                 (unsigned long long)kt_seed, what, sq / n, sq_bound / n / 2);
    free(q);
    free(back);
    free(x);
}

static void test_round_trip(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("kq_round_trip");
    const float amps[] = {1.0f, 0.003f, 300.0f};
    for (int t = 0; t < N_KQ_TYPES; t++)
        for (int mode = 0; mode < 3; mode++)
            for (int a = 0; a < 3; a++)
                for (int rep = 0; rep < 3; rep++)
                    round_trip(kq_types[t], mode, amps[a], &rng);
}

/* ---- matmul ---------------------------------------------------------------- */

/* |dmin * m| of each element's sub-block (Q4_K, Q5_K; 0 otherwise): the
 * kernels subtract the offset term separately, so their rounding scales
 * with it, not only with |w|. */
static void offsets_of(cairn_type t, const uint8_t *row, int n, float *off)
{
    for (int i = 0; i < n; i++)
        off[i] = 0.0f;
    if (t != CAIRN_TYPE_Q4_K && t != CAIRN_TYPE_Q5_K)
        return;
    const size_t bs = t == CAIRN_TYPE_Q4_K ? 144 : 176;
    for (int sb = 0; sb < n / 256; sb++) {
        const uint8_t *b = row + sb * bs;
        const float dmin = cairn_fp16_to_fp32((uint16_t)(b[2] | (b[3] << 8)));
        for (int j = 0; j < 8; j++) {
            const int m = j < 4 ? b[4 + j + 4] & 63 : (b[4 + j + 4] >> 4) | ((b[4 + j] >> 6) << 4);
            for (int l = 0; l < 32; l++)
                off[256 * sb + 32 * j + l] = fabsf(dmin * (float)m);
        }
    }
}

static void check_case(cairn_type type, int T, int n_in, int n_out, kt_rng *rng)
{
    const size_t rb = cairn_type_row_bytes(type, n_in);
    assert_true(rb > 0);
    float *w_src = kt_xmalloc(sizeof(float) * n_in);
    uint8_t *W = kt_xmalloc(rb * n_out);
    float *Wd = kt_xmalloc(sizeof(float) * n_in * n_out);
    float *off = kt_xmalloc(sizeof(float) * n_in * n_out);
    float *x = kt_xmalloc(sizeof(float) * T * n_in);
    float *xq = kt_xmalloc(sizeof(float) * T * n_in);
    for (int o = 0; o < n_out; o++) {
        kt_fill(rng, w_src, n_in, -1, 1);
        if (o % 3 == 1) /* one-signed rows: the K-quants' mins matter */
            for (int i = 0; i < n_in; i++)
                w_src[i] = fabsf(w_src[i]) + 0.5f;
        assert_int_equal(cairn_quantize_row(type, w_src, W + o * rb, n_in), CAIRN_OK);
        assert_int_equal(cairn_dequantize_row(type, W + o * rb, Wd + (size_t)o * n_in, n_in),
                         CAIRN_OK);
        offsets_of(type, W + o * rb, n_in, off + (size_t)o * n_in);
    }
    for (int t = 0; t < T; t++)
        for (int b = 0; 32 * b < n_in; b++) {
            const float mag = b % 3 == 2 ? 0.0f : b % 3 == 1 ? 0.01f : 3.0f;
            kt_fill(rng, x + (size_t)t * n_in + 32 * b, 32, -mag, mag);
        }
    for (int i = 0; i < T * n_in; i += 32)
        kt_quantize_act_block(x + i, xq + i);

    for (int lv = 0; lv < N_LEVELS; lv++)
        for (int exact = 0; exact <= 1; exact++) {
            char what[128];
            snprintf(what, sizeof what, "matmul %s %s%s T=%d n_in=%d n_out=%d", levels[lv],
                     cairn_type_get(type)->name, exact ? " exact" : " q8-act", T, n_in, n_out);
            float *got = kt_matmul_1_3(levels[lv], exact, type, W, rb, x, T, n_in, n_out, what);
            /* float rounding only: (n_in + 2) FLT_EPSILON sum|terms| (with
             * the offset terms), the bound of test_cpu_matmul.c; a wrong
             * code, scale, min or block pairing is off by orders of
             * magnitude */
            kt_expect_matmul(got, Wd, off, exact ? x : xq, T, n_in, n_out, what);
            free(got);
        }
    free(xq);
    free(x);
    free(off);
    free(Wd);
    free(W);
    free(w_src);
}

static void test_matmul(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("kq_matmul");
    /* T: 1-3 (decode kernels, AVX-512 takes up to 3 tokens per call), 4-7
     * (several calls, partial token groups); n_in: one and several
     * super-blocks, and for Q5_0 block counts that leave partial groups of
     * 16 blocks in the AVX-512 kernel (896 = 28 blocks, as the real model);
     * n_out odd. */
    static const int shapes[][3] = {
        {1, 256, 37}, {2, 512, 9}, {3, 768, 5}, {4, 256, 17}, {5, 1024, 3}, {7, 256, 6},
        {1, 2304, 4},
    };
    for (int ti = 0; ti < N_KQ_TYPES; ti++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            check_case(kq_types[ti], shapes[s][0], shapes[s][1], shapes[s][2], &rng);
    /* Q5_0 also goes through the AVX-512 panel GEMM from T = 4: one and two
     * 16-row halves, partial token tiles */
    static const int q5_shapes[][3] = {{1, 896, 7},  {2, 96, 5},    {3, 544, 4},
                                       {6, 32, 33},  {17, 128, 45}, {13, 160, 64}};
    for (size_t s = 0; s < sizeof q5_shapes / sizeof q5_shapes[0]; s++)
        check_case(CAIRN_TYPE_Q5_0, q5_shapes[s][0], q5_shapes[s][1], q5_shapes[s][2], &rng);
}

/* ---- get_rows ---------------------------------------------------------------- */

static void test_get_rows(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("kq_get_rows");
    enum { D = 512, ROWS = 11, T = 7 };
    float want[D];
    const int32_t ids[T] = {3, 0, 10, 3, 7, 1, 9};
    for (int ti = 0; ti < N_KQ_TYPES; ti++) {
        const cairn_type t = kq_types[ti];
        const size_t rb = cairn_type_row_bytes(t, D);
        uint8_t *table = kt_random_weights(&rng, t, ROWS, D, -2, 2, NULL);
        for (int threads = 1; threads <= 3; threads += 2) {
            cairn_backend *be = kt_cpu(threads);
            void *dtab = kt_dev(be, table, rb * ROWS);
            int32_t *dids = kt_dev(be, ids, sizeof ids);
            float *dout = kt_dev(be, NULL, sizeof(float) * D * T);
            assert_int_equal(be->iface->get_rows(be, dout, dtab, t, D, dids, T), CAIRN_OK);
            float *got = kt_host(be, dout, sizeof(float) * D * T);
            for (int k = 0; k < T; k++) {
                assert_int_equal(cairn_dequantize_row(t, table + ids[k] * rb, want, D), CAIRN_OK);
                KT_SAME_BYTES(got + k * D, want, sizeof want, cairn_type_get(t)->name);
            }
            /* a row length that is not whole blocks is refused */
            if (t != CAIRN_TYPE_Q5_0)
                assert_int_equal(be->iface->get_rows(be, dout, dtab, t, 288, dids, 1),
                                 CAIRN_EINVAL);
            free(got);
            be->iface->free(be, dout);
            be->iface->free(be, dids);
            be->iface->free(be, dtab);
            cairn_backend_destroy(be);
        }
        free(table);
    }
}

int main(void)
{
    kt_init_seed("kernels_kquants");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixed_bytes),
        cmocka_unit_test(test_random_layout),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_get_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
