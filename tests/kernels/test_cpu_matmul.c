/*
 * tests/kernels/test_cpu_matmul.c — the CPU matmul at every instruction-set
 * level this machine has (scalar, AVX2, AVX-512 VNNI, forced with
 * CAIRN_CPU_ISA), in both of its modes:
 *
 *   - float weights (F32, F16, BF16), and every type in exact mode, against
 *     a double reference on the dequantized weights (the bound of
 *     test_cpu_ops.c's test_matmul);
 *   - Q8_0/Q4_0/MXFP4 weights in the default mode, where activations are
 *     quantized to int8 per 32-element block. The test quantizes the
 *     activations itself by the documented rule (d = max|x| / 127 in float,
 *     q = x * (1/d) rounded to nearest even) and checks the kernel against
 *     the exact product of the dequantized weights with the dequantized
 *     activations: the only error allowed is float rounding, so a wrong
 *     code, zero point, nibble order, scale or block pairing fails by orders
 *     of magnitude.
 *   - MXFP4 (gpt-oss's experts, which have no quantizer in cairn: random
 *     blocks) also exactly: every E2M1 code under every one of the 256
 *     E8M0 exponents reaches the output as the reference weight times a
 *     one-hot activation, subnormal scales (e = 0, 1) and 2^127 included;
 *     and it gives the bits of its exact rewrite as Q5_0 (the model's
 *     fallback for backends without MXFP4 kernels).
 *
 * Every case runs on a 1-thread and a 3-thread backend that must agree
 * bitwise, with shapes that exercise every tile tail: T from 1 (decode rows)
 * to 17 (prefill panels with a partial token tile), output counts that are
 * not multiples of 16 or 32.
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

/* The levels to test: each is requested through CAIRN_CPU_ISA, which only
 * ever lowers the detected level, so on a machine without AVX-512 the
 * "avx512" backends run AVX2 (or scalar) kernels and the test still holds. */
static const char *const levels[] = {"scalar", "avx2", "avx512"};
#define N_LEVELS 3

/* n_out x n_in MXFP4 weights (cairn has no MXFP4 quantizer): per block a
 * nibble pattern — random, all +6 (code 24), all -6 (code 0), all -0, or
 * +-6 alternating — and an exponent in trained weights' range 115..130
 * (scales 2^-13 .. 2^2), or for one block in 16 a far one: 20..30 or
 * 140..150. Not the subnormal scales of e <= 1: their products with the
 * activation scales round as subnormals, beyond the relative bound of the
 * double reference (test_mxfp4_every_code checks them exactly, and
 * test_cpu_packed.c that every level builds them alike). */
static uint8_t *mxfp4_weights(kt_rng *rng, int n_out, int n_in)
{
    const size_t rb = cairn_type_row_bytes(CAIRN_TYPE_MXFP4, n_in);
    uint8_t *W = kt_xmalloc(rb * (size_t)n_out);
    for (int r = 0; r < n_out; r++)
        for (int b = 0; b < n_in / 32; b++) {
            uint8_t *blk = W + (size_t)r * rb + (size_t)b * 17;
            const int kind = kt_below(rng, 16);
            blk[0] = (uint8_t)(kind == 0   ? 20 + kt_below(rng, 11)
                               : kind == 1 ? 140 + kt_below(rng, 11)
                                           : 115 + kt_below(rng, 16));
            const int pattern = kt_below(rng, 8);
            for (int j = 0; j < 16; j++)
                blk[1 + j] = pattern == 1   ? 0x77
                           : pattern == 2 ? 0xff
                           : pattern == 3 ? 0x88
                           : pattern == 4 ? (j % 2 ? 0x7f : 0xf7)
                                          : (uint8_t)kt_below(rng, 256);
        }
    return W;
}

/* Random weights of `type` and (when Wd) their reference values. */
static uint8_t *weights_of(kt_rng *rng, cairn_type type, int n_out, int n_in, float **Wd)
{
    if (type != CAIRN_TYPE_MXFP4)
        return kt_random_weights(rng, type, n_out, n_in, -1, 1, Wd);
    uint8_t *W = mxfp4_weights(rng, n_out, n_in);
    if (Wd) {
        const size_t rb = cairn_type_row_bytes(type, n_in);
        *Wd = kt_xmalloc(sizeof(float) * (size_t)n_out * (size_t)n_in);
        for (int r = 0; r < n_out; r++)
            assert_int_equal(cairn_dequantize_row(type, W + (size_t)r * rb,
                                                  *Wd + (size_t)r * n_in, n_in),
                             CAIRN_OK);
    }
    return W;
}

static void check_case(cairn_type type, int T, int n_in, int n_out, kt_rng *rng)
{
    const size_t rb = cairn_type_row_bytes(type, n_in);
    float *Wd;                                                        /* [n_out][n_in] */
    uint8_t *W = weights_of(rng, type, n_out, n_in, &Wd);
    float *x = kt_xmalloc(sizeof(float) * (size_t)T * (size_t)n_in);  /* [T][n_in] */
    float *xq = kt_xmalloc(sizeof(float) * (size_t)T * (size_t)n_in); /* dequantized x */
    /* Blocks of very different magnitude, and an all-zero block, so the
     * per-block scales matter. */
    for (int t = 0; t < T; t++)
        for (int b = 0; 32 * b < n_in; b++) {
            const float mag = b % 3 == 2 ? 0.0f : b % 3 == 1 ? 0.01f : 3.0f;
            const int len = n_in - 32 * b < 32 ? n_in - 32 * b : 32;
            kt_fill(rng, x + (size_t)t * n_in + 32 * b, (size_t)len, -mag, mag);
        }
    const int quantized =
        type == CAIRN_TYPE_Q8_0 || type == CAIRN_TYPE_Q4_0 || type == CAIRN_TYPE_MXFP4;
    if (quantized)
        for (size_t i = 0; i < (size_t)T * n_in; i += 32)
            kt_quantize_act_block(x + i, xq + i);

    for (int lv = 0; lv < N_LEVELS; lv++) {
        for (int exact = 0; exact <= quantized; exact++) {
            /* exact = 0 is the default mode; for float types it is the
             * only one (they are always exact). */
            const int q8 = quantized && !exact;
            char what[128];
            snprintf(what, sizeof what, "matmul %s %s%s T=%d n_in=%d n_out=%d", levels[lv],
                     cairn_type_get(type)->name, q8 ? " q8-act" : "", T, n_in, n_out);
            float *got = kt_matmul_1_3(levels[lv], exact || !quantized ? 1 : 0, type, W, rb, x,
                                       T, n_in, n_out, what);
            /* as test_cpu_ops.c: (n_in + 2) FLT_EPSILON sum|terms| */
            kt_expect_matmul(got, Wd, NULL, q8 ? xq : x, T, n_in, n_out, what);
            free(got);
        }
    }
    free(xq);
    free(x);
    free(Wd);
    free(W);
}

static void test_float_weights(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("float_weights");
    static const cairn_type types[] = {CAIRN_TYPE_F32, CAIRN_TYPE_F16, CAIRN_TYPE_BF16};
    /* T, n_in, n_out: every row/token tail of the 4x4 (and 4x2) tiles, and
     * row lengths that are not a multiple of the vector width. */
    static const int shapes[][3] = {
        {1, 64, 37}, {5, 96, 130}, {3, 45, 11}, {2, 7, 40}, {17, 128, 21}, {4, 33, 9},
    };
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            check_case(types[ti], shapes[s][0], shapes[s][1], shapes[s][2], &rng);
}

static void test_quantized_weights(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("quantized_weights");
    static const cairn_type types[] = {CAIRN_TYPE_Q8_0, CAIRN_TYPE_Q4_0, CAIRN_TYPE_MXFP4};
    /* AVX2: row-at-a-time kernels, 1-4 tokens a call; AVX-512: the panel
     * GEMM at every T, with 1 or 2 half panels and partial token tiles;
     * n_out below, between and above the 16/32-row panel sizes. */
    static const int shapes[][3] = {
        {1, 64, 37}, {3, 256, 7}, {1, 32, 1}, {4, 96, 16}, {6, 64, 33},
        {17, 128, 301}, {13, 160, 64}, {8, 32, 50},
        /* long rows at decode sizes: many blocks, an odd last block */
        {1, 544, 9}, {2, 1056, 5}, {3, 736, 4}, {1, 1024, 3},
        /* gpt-oss's 2880 (90 blocks) at decode and prefill batch sizes */
        {1, 2880, 19}, {2, 2880, 37}, {5, 2880, 50}, {8, 2880, 17}, {17, 2880, 33},
        {64, 2880, 21},
    };
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            check_case(types[ti], shapes[s][0], shapes[s][1], shapes[s][2], &rng);
}

/* A token's row of y is the same whether it is computed alone or in a
 * batch, for float weights at every level (the engine relies on this for
 * F32 models: decode and prefill agree bitwise). Batches of 6 and more take
 * the AVX-512 panel kernel (weights converted to F32 per 16-row panel, 4x6
 * tiles, 128-token blocks); the shapes cover partial panels and tiles, a
 * row length that is not a multiple of 16, and more than one token block.
 * Tokens 0, stride, 2 stride, ... are also run alone. */
static void batch_invariance_case(kt_rng *rng, int T, int n_in, int n_out, int stride)
{
    static const cairn_type types[] = {CAIRN_TYPE_F32, CAIRN_TYPE_F16, CAIRN_TYPE_BF16};
    float *x = kt_xmalloc(sizeof(float) * T * n_in);
    kt_fill(rng, x, (size_t)T * n_in, -2, 2);
    for (size_t ti = 0; ti < 3; ti++) {
        const size_t rb = cairn_type_row_bytes(types[ti], n_in);
        uint8_t *W = kt_random_weights(rng, types[ti], n_out, n_in, -1, 1, NULL);
        for (int lv = 0; lv < N_LEVELS; lv++) {
            char what[96];
            snprintf(what, sizeof what, "batch invariance %s %s T=%d n_in=%d n_out=%d",
                     levels[lv], cairn_type_get(types[ti])->name, T, n_in, n_out);
            float *all = kt_matmul_1_3(levels[lv], 1, types[ti], W, rb, x, T, n_in, n_out, what);
            for (int t = 0; t < T; t += stride) {
                float *one = kt_matmul_1_3(levels[lv], 1, types[ti], W, rb, x + (size_t)t * n_in,
                                           1, n_in, n_out, what);
                KT_SAME_BYTES(one, all + (size_t)t * n_out, sizeof(float) * n_out, what);
                free(one);
            }
            free(all);
        }
        free(W);
    }
    free(x);
}

static void test_float_batch_invariance(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("batch_invariance");
    batch_invariance_case(&rng, 7, 80, 23, 1);
    batch_invariance_case(&rng, 19, 83, 37, 1);
    batch_invariance_case(&rng, 131, 40, 20, 10); /* 0..130: both token blocks */
}

/* The same for quantized weights with 8-bit activations (the path every
 * quantized model runs): a token's row is the same bytes alone, in a batch
 * of 2-3 (the decode sizes) and in batches that take the panel GEMM, so a
 * request's tokens never depend on what else is in its batch or on how its
 * prompt was chunked. K-quant rows need 256-element super-blocks. */
static void test_quantized_batch_invariance(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("quantized_batch_invariance");
    static const cairn_type types[] = {CAIRN_TYPE_Q8_0, CAIRN_TYPE_Q4_0, CAIRN_TYPE_Q5_0,
                                       CAIRN_TYPE_MXFP4, CAIRN_TYPE_Q4_K, CAIRN_TYPE_Q5_K,
                                       CAIRN_TYPE_Q6_K};
    /* n_in, n_out; the last two only for the 32-element block types: row
     * lengths of 17 and 3 blocks, which the decode kernels (4 or 2 blocks
     * of a row per register) end with a partial register */
    static const int shapes[][2] = {{512, 37}, {768, 16}, {256, 33}, {544, 21}, {96, 40}};
    const int T = 13;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int n_in = shapes[si][0], n_out = shapes[si][1];
            if (n_in % 256 != 0 && cairn_type_get(types[ti])->block_elems == 256)
                continue;
            float *x = kt_xmalloc(sizeof(float) * T * n_in);
            kt_fill(&rng, x, (size_t)T * n_in, -2, 2);
            const size_t rb = cairn_type_row_bytes(types[ti], n_in);
            uint8_t *W = weights_of(&rng, types[ti], n_out, n_in, NULL);
            for (int lv = 0; lv < N_LEVELS; lv++) {
                char what[128];
                snprintf(what, sizeof what, "quantized batch invariance %s %s n_in=%d n_out=%d",
                         levels[lv], cairn_type_get(types[ti])->name, n_in, n_out);
                float *all = kt_matmul_1_3(levels[lv], 0, types[ti], W, rb, x, T, n_in, n_out,
                                           what);
                for (int t0 = 0; t0 < T; t0 += 3) {
                    /* alone, then in the decode batch sizes 2 and 3 */
                    for (int n = 1; n <= 3 && t0 + n <= T; n++) {
                        float *part = kt_matmul_1_3(levels[lv], 0, types[ti], W, rb,
                                                    x + (size_t)t0 * n_in, n, n_in, n_out, what);
                        KT_SAME_BYTES(part, all + (size_t)t0 * n_out,
                                      sizeof(float) * (size_t)n * n_out, what);
                        free(part);
                    }
                }
                free(all);
            }
            free(W);
            free(x);
        }
}

/* MXFP4 exactly: row r (0..255) has exponent e = r in both of its blocks,
 * and each block holds the 16 codes twice in a random order; token t is
 * one-hot at element t with the value 127 * 2^-10, whose int8 block is
 * d = 2^-10, q = 127 (exact). Output (t, r) is then 127 (c - 12) times
 * [2^(e - 128) 2^-10] plus exact zeros: no rounding anywhere, from the
 * subnormal scales of e = 0, 1 to e = 255 (2^127), so it must equal the
 * weight by its definition (OCP E2M1 times 2^(e - 127)) times 127 * 2^-10
 * exactly, at every level, for decode (T = 1), small tiles (T = 4) and
 * panels (T = 64). Exact mode (dequantized weights, float activations)
 * must give the same, except where the weight itself is beyond float range
 * (e >= 253: the reference decoder's float is infinite there). */
static void test_mxfp4_every_code(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("mxfp4_every_code");
    static const double e2m1[16] = {0,    0.5,  1,  1.5,  2,  3,  4,  6,
                                    -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
    const cairn_type type = CAIRN_TYPE_MXFP4;
    const int n = 64, n_out = 256;
    const size_t rb = cairn_type_row_bytes(type, n);
    const float one = 127.0f * 0x1p-10f;
    uint8_t *W = kt_xmalloc(rb * n_out);
    double *want = kt_xmalloc(sizeof(double) * (size_t)n_out * n); /* [r][j]: w times one */
    float *Wd = kt_xmalloc(sizeof(float) * n);
    for (int r = 0; r < n_out; r++) {
        for (int b = 0; b < n / 32; b++) {
            uint8_t *blk = W + (size_t)r * rb + (size_t)b * 17;
            int32_t perm[32];
            kt_permutation(&rng, perm, 32);
            blk[0] = (uint8_t)r;
            for (int j = 0; j < 16; j++) {
                const int lo = perm[j] % 16, hi = perm[j + 16] % 16;
                blk[1 + j] = (uint8_t)(lo | (hi << 4));
                want[(size_t)r * n + 32 * b + j] = e2m1[lo] * ldexp(1.0, r - 127) * one;
                want[(size_t)r * n + 32 * b + j + 16] = e2m1[hi] * ldexp(1.0, r - 127) * one;
            }
        }
        /* the reference decoder agrees wherever its float can hold the weight */
        assert_int_equal(cairn_dequantize_row(type, W + (size_t)r * rb, Wd, n), CAIRN_OK);
        for (int j = 0; j < n; j++)
            if (isfinite(Wd[j]))
                KT_CLOSE((double)Wd[j] * one, want[(size_t)r * n + j], 0.0, "MXFP4 decoder",
                         (long long)r * n + j);
    }
    float *eye = kt_xmalloc(sizeof(float) * (size_t)n * n);
    memset(eye, 0, sizeof(float) * (size_t)n * n);
    for (int t = 0; t < n; t++)
        eye[(size_t)t * n + t] = one;
    static const int batch[] = {1, 4, 64};
    for (int lv = 0; lv < N_LEVELS; lv++)
        for (int exact = 0; exact <= 1; exact++)
            for (int bi = 0; bi < 3; bi++)
                for (int t0 = 0; t0 + batch[bi] <= n; t0 += batch[bi]) {
                    const int T = batch[bi];
                    if (T == 1 && t0 % 5 != 0)
                        continue; /* decode: a sample of the tokens */
                    char what[96];
                    snprintf(what, sizeof what, "MXFP4 every code %s%s T=%d", levels[lv],
                             exact ? " exact" : "", T);
                    float *got = kt_matmul_1_3(levels[lv], exact, type, W, rb,
                                               eye + (size_t)t0 * n, T, n, n_out, what);
                    for (int t = 0; t < T; t++)
                        for (int r = 0; r < (exact ? 253 : n_out); r++)
                            KT_CLOSE(got[(size_t)t * n_out + r], want[(size_t)r * n + t0 + t],
                                     0.0, what, (long long)(t0 + t) * n_out + r);
                    free(got);
                }
    free(eye);
    free(Wd);
    free(want);
    free(W);
}

/* MXFP4 and its exact rewrite as Q5_0 (cairn_mxfp4_to_q5_0: q = 16 +
 * 2 E2M1, d = 2^(e - 128) as an fp16) give the same bits at every level
 * and batch size: the same integer block sums (codes around 12 or 16)
 * times the same float scales, so a backend that multiplies MXFP4 as it is
 * computes exactly what the rewrite does where fp16 holds the scale
 * (e in [104, 143], which this test's exponents stay in). */
static void test_mxfp4_equals_q5_0(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("mxfp4_equals_q5_0");
    static const int Ts[] = {1, 2, 5, 8, 17, 64};
    const int n_in = 2880, n_out = 37;
    uint8_t *W = mxfp4_weights(&rng, n_out, n_in);
    const size_t rb = cairn_type_row_bytes(CAIRN_TYPE_MXFP4, n_in);
    for (int r = 0; r < n_out; r++)
        for (int b = 0; b < n_in / 32; b++) {
            uint8_t *e = W + (size_t)r * rb + (size_t)b * 17;
            *e = (uint8_t)(*e < 104 ? 104 + kt_below(&rng, 4) : *e > 143 ? 143 : *e);
        }
    const size_t rb5 = cairn_type_row_bytes(CAIRN_TYPE_Q5_0, n_in);
    uint8_t *W5 = kt_xmalloc(rb5 * n_out);
    int64_t inexact = 0;
    assert_int_equal(cairn_mxfp4_to_q5_0(W, W5, (int64_t)n_in * n_out, &inexact), CAIRN_OK);
    assert_int_equal(inexact, 0);
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
        const int T = Ts[ti];
        float *x = kt_xmalloc(sizeof(float) * (size_t)T * n_in);
        kt_fill(&rng, x, (size_t)T * n_in, -2, 2);
        for (int lv = 0; lv < N_LEVELS; lv++) {
            char what[96];
            snprintf(what, sizeof what, "MXFP4 vs Q5_0 rewrite %s T=%d", levels[lv], T);
            float *a = kt_matmul_1_3(levels[lv], 0, CAIRN_TYPE_MXFP4, W, rb, x, T, n_in, n_out,
                                     what);
            float *b = kt_matmul_1_3(levels[lv], 0, CAIRN_TYPE_Q5_0, W5, rb5, x, T, n_in, n_out,
                                     what);
            KT_SAME_BYTES(a, b, sizeof(float) * (size_t)T * n_out, what);
            free(b);
            free(a);
        }
        free(x);
    }
    free(W5);
    free(W);
}

int main(void)
{
    kt_init_seed("kernels_cpu_matmul");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_float_weights),
        cmocka_unit_test(test_quantized_weights),
        cmocka_unit_test(test_float_batch_invariance),
        cmocka_unit_test(test_quantized_batch_invariance),
        cmocka_unit_test(test_mxfp4_every_code),
        cmocka_unit_test(test_mxfp4_equals_q5_0),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
