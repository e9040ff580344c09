/*
 * tests/kernels/test_cpu_ckpt_types.c — the CPU kernels of the checkpoint
 * weight types (common/common.h): Q4_Z (AWQ/GPTQ int4, w = d (q - z)) and
 * F8_E4M3 (FP8, w = d e4m3(q)), at every instruction-set level this machine
 * has (scalar, AVX2, AVX-512 VNNI, forced with CAIRN_CPU_ISA, which only
 * ever lowers the detected level), and the e4m3 conversions they rest on.
 *
 *   - e4m3: every code decodes to its value and encodes back; encoding
 *     rounds to nearest with ties to the even code, saturates at 448 and
 *     keeps NaN.
 *   - Q4_Z multiplies against activations quantized to int8 per 32-element
 *     block (the default mode). The test quantizes the activations by the
 *     documented rule itself and checks the kernel against the exact product
 *     of the dequantized weights with the dequantized activations, within
 *     float rounding (kt_expect_matmul's bound), and against the float
 *     activations within the bound that the int8 rounding allows (derived at
 *     expect_act_bound). Exact mode must give the float reference.
 *   - F8_E4M3 takes the float path: within float rounding of the double
 *     reference, and exact mode the same bytes; every finite code (with
 *     scales tiny, huge and not a power of two) reaches the output exactly
 *     through one-hot activations, and NaN codes give NaN.
 *
 * Weights are random rows from cairn_quantize_row with hand-built blocks
 * mixed in: Q4_Z zeros 0, 15, 16 (GPTQ's v1 format stores 16 for a
 * symmetric group) and 255 (the u8's end), codes all 0 / all 15; F8 rows
 * of every code. Every case runs on a 1-thread and a 3-thread backend that
 * must agree bitwise; a token's row computed alone must be the bytes of the
 * same token inside a batch (T = 5, and 13 for the panels' partial tiles);
 * row lengths 32, 96 and 4128 (4096 + 32, an odd block count), output
 * counts that are not multiples of the 16/32-row tiles.
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

static const char *const levels[] = {"scalar", "avx2", "avx512"};
#define N_LEVELS 3

static void wr16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}

/* Every row of W ([rows] of `type`, n elements) dequantized by the
 * reference decoder into fresh memory [rows][n]. */
static float *dequantized(cairn_type type, const uint8_t *W, int rows, int n)
{
    const size_t rb = cairn_type_row_bytes(type, n);
    float *Wd = kt_xmalloc(sizeof(float) * (size_t)rows * (size_t)n);
    for (int r = 0; r < rows; r++)
        assert_int_equal(cairn_dequantize_row(type, W + (size_t)r * rb, Wd + (size_t)r * n, n),
                         CAIRN_OK);
    return Wd;
}

/* Activations [T][n]: blocks of magnitude 3, 0.01 and 0 in turn (shifted
 * per token), so the per-block activation scales matter. */
static float *activations(kt_rng *rng, int T, int n)
{
    float *x = kt_xmalloc(sizeof(float) * (size_t)T * (size_t)n);
    for (int t = 0; t < T; t++)
        for (int b = 0; b < n / 32; b++) {
            const int k = (t + b) % 3;
            const float mag = k == 2 ? 0.0f : k == 1 ? 0.01f : 3.0f;
            kt_fill(rng, x + (size_t)t * n + 32 * b, 32, -mag, mag);
        }
    return x;
}

/* ---- e4m3 conversion ----------------------------------------------------- */

static void test_e4m3_conversion(void **state)
{
    (void)state;
    char what[96];
    /* decoding: the value of every code, by its definition */
    for (int c = 0; c < 256; c++) {
        const int e = (c >> 3) & 15, m = c & 7;
        const float v = cairn_e4m3_to_fp32((uint8_t)c);
        snprintf(what, sizeof what, "e4m3 decode 0x%02x", c);
        if (e == 15 && m == 7) {
            assert_true(isnan(v));
            continue;
        }
        const double mag = e == 0 ? m * 0x1p-9 : (1.0 + m / 8.0) * ldexp(1.0, e - 7);
        const double want = c & 0x80 ? -mag : mag;
        KT_CLOSE(v, want, 0.0, what, c);
        assert_int_equal(!!signbit(v), c >> 7); /* 0x80 is -0 */
        /* the round trip: every finite code, -0 included */
        assert_int_equal(cairn_fp32_to_e4m3(v), c);
    }
    assert_true(cairn_e4m3_to_fp32(0x7e) == 448.0f);
    assert_true(cairn_e4m3_to_fp32(0x01) == 0x1p-9f);
    assert_true(cairn_e4m3_to_fp32(0x38) == 1.0f);
    /* encoding between neighbours: below, at and above each midpoint of
     * codes c and c + 1, both signs (the midpoint of two e4m3 values is
     * exact in float) */
    for (int c = 0; c < 0x7e; c++) {
        const float lo = cairn_e4m3_to_fp32((uint8_t)c), hi = cairn_e4m3_to_fp32((uint8_t)(c + 1));
        const float mid = (lo + hi) / 2;
        assert_true(lo < mid && mid < hi);
        const int even = c % 2 == 0 ? c : c + 1;
        for (int sg = 0; sg < 2; sg++) {
            const float s = sg ? -1.0f : 1.0f;
            const int sb = sg ? 0x80 : 0;
            snprintf(what, sizeof what, "e4m3 encode near 0x%02x sign %d", c, sg);
            assert_int_equal(cairn_fp32_to_e4m3(s * mid), sb | even);
            assert_int_equal(cairn_fp32_to_e4m3(s * nextafterf(mid, 0.0f)), sb | c);
            assert_int_equal(cairn_fp32_to_e4m3(s * nextafterf(mid, 1e9f)), sb | (c + 1));
        }
    }
    /* below half the smallest subnormal: (signed) zero */
    assert_int_equal(cairn_fp32_to_e4m3(0x1p-11f), 0x00);
    assert_int_equal(cairn_fp32_to_e4m3(-1e-30f), 0x80);
    assert_int_equal(cairn_fp32_to_e4m3(0x1p-10f), 0x00); /* tie, to even 0 */
    assert_int_equal(cairn_fp32_to_e4m3(3 * 0x1p-10f), 0x02); /* tie of 1 and 2 */
    /* saturation at 448: above it, at what would be 480's midpoint, beyond
     * float range */
    assert_int_equal(cairn_fp32_to_e4m3(448.0f), 0x7e);
    assert_int_equal(cairn_fp32_to_e4m3(464.0f), 0x7e);
    assert_int_equal(cairn_fp32_to_e4m3(500.0f), 0x7e);
    assert_int_equal(cairn_fp32_to_e4m3(1e30f), 0x7e);
    assert_int_equal(cairn_fp32_to_e4m3(-1e30f), 0xfe);
    assert_int_equal(cairn_fp32_to_e4m3(INFINITY), 0x7e);
    assert_int_equal(cairn_fp32_to_e4m3(-INFINITY), 0xfe);
    /* NaN stays NaN */
    assert_int_equal(cairn_fp32_to_e4m3(NAN) & 0x7f, 0x7f);
    assert_int_equal(cairn_fp32_to_e4m3(-NAN) & 0x7f, 0x7f);
    assert_true(isnan(cairn_e4m3_to_fp32(0x7f)));
    assert_true(isnan(cairn_e4m3_to_fp32(0xff)));
}

/* ---- Q4_Z ------------------------------------------------------------------ */

/* n_out x n_in Q4_Z weights: random rows (cairn_quantize_row's min/max fit)
 * with hand-built blocks in place of 4 of every 5, cycling through the
 * zeros 0, 15, 16, 255, with scales of either sign and code patterns
 * random, all 0, all 15, alternating. */
static uint8_t *q4z_weights(kt_rng *rng, int n_out, int n_in)
{
    uint8_t *W = kt_random_weights(rng, CAIRN_TYPE_Q4_Z, n_out, n_in, -1, 1, NULL);
    const size_t rb = cairn_type_row_bytes(CAIRN_TYPE_Q4_Z, n_in);
    static const int zeros[] = {0, 15, 16, 255};
    const int nb = n_in / 32;
    for (int r = 0; r < n_out; r++)
        for (int b = 0; b < nb; b++) {
            const int kind = (r * nb + b) % 5;
            if (kind == 4)
                continue; /* the quantizer's own block */
            uint8_t *blk = W + (size_t)r * rb + (size_t)b * 20;
            const float d = kt_uniform(rng, 0.002f, 0.2f) * (kt_below(rng, 4) == 0 ? -1.0f : 1.0f);
            wr16(blk, cairn_fp32_to_fp16(d));
            blk[2] = (uint8_t)zeros[kind];
            blk[3] = 0;
            const int pattern = kt_below(rng, 5);
            for (int j = 0; j < 16; j++) {
                int lo, hi;
                if (pattern == 1) {
                    lo = hi = 0;
                } else if (pattern == 2) {
                    lo = hi = 15;
                } else if (pattern == 3) {
                    lo = j % 2 ? 15 : 0;
                    hi = 15 - lo;
                } else {
                    lo = kt_below(rng, 16);
                    hi = kt_below(rng, 16);
                }
                blk[4 + j] = (uint8_t)(lo | (hi << 4));
            }
        }
    return W;
}

/* The kernel against the float activations x. Per activation block b the
 * kernel uses d_b q_i for x_i, with d_b = max|x| / 127 (in float) and q_i =
 * x_i (1/d_b) rounded to nearest, so |d_b q_i - x_i| <= d_b (1/2 + r) where
 * r <= 2^-12 bounds the float error of x_i (1/d_b) (|x_i / d_b| <= 127.5,
 * relative error a few FLT_EPSILON). Hence
 *   |y - W x| <= sum_b d_b (1/2 + 2^-12) sum_{i in b} |w_i|
 *                + the float rounding of the kernel's own sum,
 * the second term kt_expect_matmul's bound on the quantized activations
 * xq, (n_in + 2) FLT_EPSILON sum |w_i xq_i|. */
static void expect_act_bound(const float *got, const float *Wd, const float *x, const float *xq,
                             int T, int n_in, int n_out, const char *what)
{
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * n_in, *xqt = xq + (size_t)t * n_in;
        for (int o = 0; o < n_out; o++) {
            const float *w = Wd + (size_t)o * n_in;
            double want = 0, act = 0, mag = 0;
            for (int b = 0; b < n_in / 32; b++) {
                float amax = 0;
                for (int i = 0; i < 32; i++)
                    amax = fmaxf(amax, fabsf(xt[32 * b + i]));
                const double db = amax / 127.0f;
                double wabs = 0;
                for (int i = 32 * b; i < 32 * b + 32; i++) {
                    want += (double)w[i] * xt[i];
                    wabs += fabs((double)w[i]);
                    mag += fabs((double)w[i] * xqt[i]);
                }
                act += db * (0.5 + 0x1p-12) * wabs;
            }
            const double tol = act + (n_in + 2) * (double)FLT_EPSILON * mag;
            KT_CLOSE(got[(size_t)t * n_out + o], want, tol, what, (long long)t * n_out + o);
        }
    }
}

static void q4z_case(kt_rng *rng, int T, int n_in, int n_out)
{
    const cairn_type type = CAIRN_TYPE_Q4_Z;
    const size_t rb = cairn_type_row_bytes(type, n_in);
    uint8_t *W = q4z_weights(rng, n_out, n_in);
    float *Wd = dequantized(type, W, n_out, n_in);
    float *x = activations(rng, T, n_in);
    float *xq = kt_xmalloc(sizeof(float) * (size_t)T * (size_t)n_in);
    for (size_t i = 0; i < (size_t)T * n_in; i += 32)
        kt_quantize_act_block(x + i, xq + i);
    for (int lv = 0; lv < N_LEVELS; lv++) {
        char what[128];
        snprintf(what, sizeof what, "Q4_Z q8-act %s T=%d n_in=%d n_out=%d", levels[lv], T, n_in,
                 n_out);
        float *got = kt_matmul_1_3(levels[lv], 0, type, W, rb, x, T, n_in, n_out, what);
        kt_expect_matmul(got, Wd, NULL, xq, T, n_in, n_out, what);
        expect_act_bound(got, Wd, x, xq, T, n_in, n_out, what);
        free(got);
        snprintf(what, sizeof what, "Q4_Z exact %s T=%d n_in=%d n_out=%d", levels[lv], T, n_in,
                 n_out);
        got = kt_matmul_1_3(levels[lv], 1, type, W, rb, x, T, n_in, n_out, what);
        kt_expect_matmul(got, Wd, NULL, x, T, n_in, n_out, what);
        free(got);
    }
    free(xq);
    free(x);
    free(Wd);
    free(W);
}

/* T, n_in, n_out: decode (T = 1, the AVX-512 16-row kernel), AVX2's 1-4
 * token calls, AVX-512 panels with 1 or 2 halves and partial token tiles;
 * n_out below, between and above 16 and 32. */
static const int shapes[][3] = {
    {1, 32, 37}, {2, 32, 5}, {5, 96, 50}, {7, 96, 21}, {13, 96, 33},
    {1, 4128, 37}, {3, 4128, 19}, {6, 4128, 50}, {17, 4128, 7},
};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

static void test_q4z_matmul(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("q4z_matmul");
    for (size_t s = 0; s < N_SHAPES; s++)
        q4z_case(&rng, shapes[s][0], shapes[s][1], shapes[s][2]);
}

/* ---- F8_E4M3 ------------------------------------------------------------- */

/* n_out x n_in F8 weights, row r of kind r % 4: the quantizer's rows (scale
 * amax / 448), rows of scale 2^-80 and of scale 2^90 with random finite
 * codes, and rows of random finite codes with random scales. */
static uint8_t *f8_weights(kt_rng *rng, int n_out, int n_in)
{
    uint8_t *W = kt_random_weights(rng, CAIRN_TYPE_F8_E4M3, n_out, n_in, -1, 1, NULL);
    const size_t rb = cairn_type_row_bytes(CAIRN_TYPE_F8_E4M3, n_in);
    for (int r = 0; r < n_out; r++) {
        if (r % 4 == 0)
            continue;
        for (int b = 0; b < n_in / 32; b++) {
            uint8_t *blk = W + (size_t)r * rb + (size_t)b * 36;
            const float d = r % 4 == 1   ? 0x1p-80f
                          : r % 4 == 2 ? 0x1p90f
                                       : kt_uniform(rng, 1e-3f, 2.0f);
            memcpy(blk, &d, 4);
            for (int j = 0; j < 32; j++) {
                int c;
                do
                    c = kt_below(rng, 256);
                while ((c & 0x7f) == 0x7f);
                blk[4 + j] = (uint8_t)c;
            }
        }
    }
    return W;
}

static void f8_case(kt_rng *rng, int T, int n_in, int n_out)
{
    const cairn_type type = CAIRN_TYPE_F8_E4M3;
    const size_t rb = cairn_type_row_bytes(type, n_in);
    const size_t y_bytes = sizeof(float) * (size_t)T * (size_t)n_out;
    uint8_t *W = f8_weights(rng, n_out, n_in);
    float *Wd = dequantized(type, W, n_out, n_in);
    float *x = kt_xmalloc(sizeof(float) * (size_t)T * (size_t)n_in);
    kt_fill(rng, x, (size_t)T * n_in, -2, 2);
    for (int lv = 0; lv < N_LEVELS; lv++) {
        char what[128];
        snprintf(what, sizeof what, "F8_E4M3 %s T=%d n_in=%d n_out=%d", levels[lv], T, n_in, n_out);
        float *got = kt_matmul_1_3(levels[lv], 0, type, W, rb, x, T, n_in, n_out, what);
        kt_expect_matmul(got, Wd, NULL, x, T, n_in, n_out, what);
        /* a float format: exact mode is the same kernel */
        float *ex = kt_matmul_1_3(levels[lv], 1, type, W, rb, x, T, n_in, n_out, what);
        KT_SAME_BYTES(ex, got, y_bytes, what);
        free(ex);
        free(got);
    }
    free(x);
    free(Wd);
    free(W);
}

static void test_f8_matmul(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("f8_matmul");
    for (size_t s = 0; s < N_SHAPES; s++)
        f8_case(&rng, shapes[s][0], shapes[s][1], shapes[s][2]);
}

/* Every finite code through the kernels exactly: rows of 256 elements
 * holding the 254 finite codes (and two more zeros) in a random order,
 * one scale per row (2^-80, 1, 2^90, and 0.7 and 1/3, whose products with
 * the codes round), against one-hot activations. Output t of row r is
 * 1 * w[r][t] plus exact zeros, so it must equal the reference weight
 * d * e4m3(q) exactly, at every level and for decode (T = 1), small tiles
 * (T = 4) and panels (T = 256). */
static void test_f8_every_code(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("f8_every_code");
    const cairn_type type = CAIRN_TYPE_F8_E4M3;
    const int n = 256;
    static const float scales[] = {0x1p-80f, 1.0f, 0x1p90f, 0.7f, 1.0f / 3.0f};
    const int n_out = 5;
    const size_t rb = cairn_type_row_bytes(type, n);
    uint8_t *W = kt_xmalloc(rb * n_out);
    for (int r = 0; r < n_out; r++) {
        uint8_t codes[256];
        int k = 0;
        for (int c = 0; c < 256; c++)
            if ((c & 0x7f) != 0x7f)
                codes[k++] = (uint8_t)c;
        codes[k++] = 0;
        codes[k++] = 0;
        int32_t perm[256];
        kt_permutation(&rng, perm, n);
        for (int b = 0; b < n / 32; b++) {
            uint8_t *blk = W + (size_t)r * rb + (size_t)b * 36;
            memcpy(blk, &scales[r], 4);
            for (int j = 0; j < 32; j++)
                blk[4 + j] = codes[perm[32 * b + j]];
        }
    }
    float *Wd = dequantized(type, W, n_out, n);
    float *eye = kt_xmalloc(sizeof(float) * (size_t)n * n);
    for (int t = 0; t < n; t++)
        eye[(size_t)t * n + t] = 1.0f;
    static const int batch[] = {1, 4, 256};
    for (int lv = 0; lv < N_LEVELS; lv++)
        for (int bi = 0; bi < 3; bi++)
            for (int t0 = 0; t0 + batch[bi] <= n; t0 += batch[bi]) {
                const int T = batch[bi];
                if (T == 1 && t0 % 7 != 0)
                    continue; /* decode: a sample of the tokens */
                char what[96];
                snprintf(what, sizeof what, "F8_E4M3 every code %s T=%d", levels[lv], T);
                float *got = kt_matmul_1_3(levels[lv], 0, type, W, rb, eye + (size_t)t0 * n,
                                           T, n, n_out, what);
                for (int t = 0; t < T; t++)
                    for (int r = 0; r < n_out; r++)
                        KT_CLOSE(got[(size_t)t * n_out + r], Wd[(size_t)r * n + t0 + t], 0.0,
                                 what, (long long)(t0 + t) * n_out + r);
                free(got);
            }
    free(eye);
    free(Wd);
    free(W);
}

/* A NaN code (0x7f or 0xff) makes its row's outputs NaN, as the reference
 * (d * NaN, then sums) does, on every path. */
static void test_f8_nan(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("f8_nan");
    const cairn_type type = CAIRN_TYPE_F8_E4M3;
    const int n_in = 96, n_out = 21;
    const size_t rb = cairn_type_row_bytes(type, n_in);
    uint8_t *W = f8_weights(&rng, n_out, n_in);
    /* rows 3 and 10: one NaN code each, in different blocks and lanes */
    W[3 * rb + 36 + 4 + 17] = 0x7f;
    W[10 * rb + 2 * 36 + 4 + 5] = 0xff;
    static const int Ts[] = {1, 3, 7};
    for (int lv = 0; lv < N_LEVELS; lv++)
        for (int ti = 0; ti < 3; ti++) {
            const int T = Ts[ti];
            float *x = kt_xmalloc(sizeof(float) * (size_t)T * n_in);
            kt_fill(&rng, x, (size_t)T * n_in, -2, 2);
            char what[96];
            snprintf(what, sizeof what, "F8_E4M3 NaN %s T=%d", levels[lv], T);
            float *got = kt_matmul_1_3(levels[lv], 0, type, W, rb, x, T, n_in, n_out, what);
            for (int t = 0; t < T; t++)
                for (int r = 0; r < n_out; r++) {
                    const float v = got[(size_t)t * n_out + r];
                    if ((r == 3 || r == 10) != !!isnan(v))
                        fail_msg("seed %llu: %s: row %d token %d: %g",
                                 (unsigned long long)kt_seed, what, r, t, v);
                }
            free(got);
            free(x);
        }
    free(W);
}

/* ---- batch invariance and lookups ----------------------------------------- */

/* A token's row of y is the same bytes computed alone as inside a batch
 * (of 5, one AVX-512 panel tile; of 13, two full tiles and a partial one):
 * the float path's rule for F8_E4M3 and the quantized path's for Q4_Z, as
 * for Q4_0 in test_cpu_matmul.c. */
static void test_batch_invariance(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("ckpt_batch_invariance");
    static const cairn_type types[] = {CAIRN_TYPE_Q4_Z, CAIRN_TYPE_F8_E4M3};
    static const int dims[][2] = {{32, 37}, {96, 50}, {4128, 21}};
    static const int Ts[] = {5, 13};
    for (int ti = 0; ti < 2; ti++)
        for (int si = 0; si < 3; si++)
            for (int bi = 0; bi < 2; bi++) {
                const cairn_type type = types[ti];
                const int n_in = dims[si][0], n_out = dims[si][1], T = Ts[bi];
                const size_t rb = cairn_type_row_bytes(type, n_in);
                uint8_t *W = type == CAIRN_TYPE_Q4_Z ? q4z_weights(&rng, n_out, n_in)
                                                     : f8_weights(&rng, n_out, n_in);
                float *x = activations(&rng, T, n_in);
                for (int lv = 0; lv < N_LEVELS; lv++) {
                    char what[128];
                    snprintf(what, sizeof what, "batch invariance %s %s T=%d n_in=%d n_out=%d",
                             levels[lv], cairn_type_get(type)->name, T, n_in, n_out);
                    float *all = kt_matmul_1_3(levels[lv], 0, type, W, rb, x, T, n_in, n_out,
                                               what);
                    for (int t = 0; t < T; t++) {
                        float *one = kt_matmul_1_3(levels[lv], 0, type, W, rb,
                                                   x + (size_t)t * n_in, 1, n_in, n_out, what);
                        KT_SAME_BYTES(one, all + (size_t)t * n_out, sizeof(float) * n_out, what);
                        free(one);
                    }
                    free(all);
                }
                free(x);
                free(W);
            }
}

/* get_rows is exact: each row the bytes of cairn_dequantize_row. */
static void test_get_rows(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("ckpt_get_rows");
    static const cairn_type types[] = {CAIRN_TYPE_Q4_Z, CAIRN_TYPE_F8_E4M3};
    const int D = 96, n_rows = 23, T = 9;
    int32_t ids[9] = {0, 22, 5, 5, 13, 1, 22, 0, 0};
    ids[7] = kt_below(&rng, n_rows);
    for (int ti = 0; ti < 2; ti++) {
        const cairn_type type = types[ti];
        const size_t rb = cairn_type_row_bytes(type, D);
        const size_t out_bytes = sizeof(float) * (size_t)T * D;
        uint8_t *table = type == CAIRN_TYPE_Q4_Z ? q4z_weights(&rng, n_rows, D)
                                                 : f8_weights(&rng, n_rows, D);
        float *want = kt_xmalloc(out_bytes);
        for (int t = 0; t < T; t++)
            assert_int_equal(
                cairn_dequantize_row(type, table + (size_t)ids[t] * rb, want + (size_t)t * D, D),
                CAIRN_OK);
        for (int threads = 1; threads <= 3; threads += 2) {
            cairn_backend *be = kt_cpu(threads);
            assert_true(cairn_backend_supports_type(be, type));
            void *dtable = kt_dev(be, table, rb * n_rows);
            float *dout = kt_dev(be, NULL, out_bytes);
            assert_int_equal(be->iface->get_rows(be, dout, dtable, type, D, ids, T), CAIRN_OK);
            float *got = kt_host(be, dout, out_bytes);
            KT_SAME_BYTES(got, want, out_bytes, cairn_type_get(type)->name);
            free(got);
            be->iface->free(be, dout);
            be->iface->free(be, dtable);
            cairn_backend_destroy(be);
        }
        free(want);
        free(table);
    }
}

int main(void)
{
    kt_init_seed("kernels_cpu_ckpt_types");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_e4m3_conversion),
        cmocka_unit_test(test_q4z_matmul),
        cmocka_unit_test(test_f8_matmul),
        cmocka_unit_test(test_f8_every_code),
        cmocka_unit_test(test_f8_nan),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_get_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
