/*
 * tests/kernels/test_cpu_matmul.c — the CPU matmul at every instruction-set
 * level this machine has (scalar, AVX2, AVX-512 VNNI, forced with
 * CAIRN_CPU_ISA), in both of its modes:
 *
 *   - float weights (F32, F16, BF16), and every type in exact mode, against
 *     a double reference on the dequantized weights (the bound of
 *     test_cpu_ops.c's test_matmul);
 *   - Q8_0/Q4_0 weights in the default mode, where activations are quantized
 *     to int8 per 32-element block. The test quantizes the activations itself
 *     by the documented rule (d = max|x| / 127 in float, q = x * (1/d)
 *     rounded to nearest even) and checks the kernel against the exact
 *     product of the dequantized weights with the dequantized activations:
 *     the only error allowed is float rounding, so a wrong code, zero point,
 *     nibble order, scale or block pairing fails by orders of magnitude.
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/support.h"

/* The levels to test: each is requested through CAIRN_CPU_ISA, which only
 * ever lowers the detected level, so on a machine without AVX-512 the
 * "avx512" backends run AVX2 (or scalar) kernels and the test still holds. */
static const char *const levels[] = {"scalar", "avx2", "avx512"};
#define N_LEVELS 3

static void check_case(cairn_type type, int T, int n_in, int n_out, kt_rng *rng)
{
    const size_t rb = cairn_type_row_bytes(type, n_in);
    float *Wd;                                                        /* [n_out][n_in] */
    uint8_t *W = kt_random_weights(rng, type, n_out, n_in, -1, 1, &Wd);
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
    const int quantized = type == CAIRN_TYPE_Q8_0 || type == CAIRN_TYPE_Q4_0;
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
    static const cairn_type types[] = {CAIRN_TYPE_Q8_0, CAIRN_TYPE_Q4_0};
    /* AVX2: row-at-a-time kernels, 1-4 tokens a call; AVX-512: the panel
     * GEMM at every T, with 1 or 2 half panels and partial token tiles;
     * n_out below, between and above the 16/32-row panel sizes. */
    static const int shapes[][3] = {
        {1, 64, 37}, {3, 256, 7}, {1, 32, 1}, {4, 96, 16}, {6, 64, 33},
        {17, 128, 301}, {13, 160, 64}, {8, 32, 50},
        /* long rows at decode sizes: many blocks, an odd last block */
        {1, 544, 9}, {2, 1056, 5}, {3, 736, 4}, {1, 1024, 3},
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
                                       CAIRN_TYPE_Q4_K, CAIRN_TYPE_Q5_K, CAIRN_TYPE_Q6_K};
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
            uint8_t *W = kt_random_weights(&rng, types[ti], n_out, n_in, -1, 1, NULL);
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

int main(void)
{
    kt_init_seed("kernels_cpu_matmul");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_float_weights),
        cmocka_unit_test(test_quantized_weights),
        cmocka_unit_test(test_float_batch_invariance),
        cmocka_unit_test(test_quantized_batch_invariance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
