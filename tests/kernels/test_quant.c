/*
 * tests/kernels/test_quant.c — the reference formats: cairn_quantize_row and
 * cairn_dequantize_row round trip within each format's error bound, and the
 * dequantizer reads hand-built blocks exactly as GGUF lays them out.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/support.h"

/* Bytes of a row, checked against the traits table. */
static size_t row_bytes(cairn_type type, int64_t n)
{
    size_t bytes = cairn_type_row_bytes(type, n);
    assert_true(bytes > 0);
    return bytes;
}

static void test_row_bytes(void **state)
{
    (void)state;
    assert_int_equal(cairn_type_row_bytes(CAIRN_TYPE_F32, 10), 40);
    assert_int_equal(cairn_type_row_bytes(CAIRN_TYPE_F16, 10), 20);
    assert_int_equal(cairn_type_row_bytes(CAIRN_TYPE_BF16, 10), 20);
    assert_int_equal(cairn_type_row_bytes(CAIRN_TYPE_Q8_0, 64), 68);
    assert_int_equal(cairn_type_row_bytes(CAIRN_TYPE_Q4_0, 64), 36);
    /* not a whole number of blocks */
    assert_int_equal(cairn_type_row_bytes(CAIRN_TYPE_Q8_0, 40), 0);
    assert_int_equal(cairn_type_row_bytes(CAIRN_TYPE_Q4_0, 31), 0);
}

/* Round trip of n values drawn from [-amp, amp), with a few exact zeros and
 * one all-zero block, checked element by element against the bound of the
 * format:
 *   F32   exact.
 *   F16   round to nearest: |err| <= 2^-11 |x| for normal halves; the data is
 *         kept in the normal range ([2^-14, 65504)) or zero.
 *   BF16  round to nearest with an 8-bit significand: |err| <= 2^-8 |x|.
 *   Q8_0  per block d = amax/127, q = round(x/d), stored scale fp16(d):
 *         |x - fp16(d) q| <= d/2 + |q| |d - fp16(d)| <= d (1/2 + 127 * 2^-11).
 *   Q4_0  per block d = -max/8 (max = the value of largest magnitude, signed),
 *         q = clamp(round(x/d) + 8, 0, 15): rounding costs d/2, but the
 *         opposite extreme maps to +8 and is clamped to 7, costing up to |d|;
 *         the fp16 scale adds |q - 8| |d - fp16(d)| <= 8 |d| 2^-11.
 * Each bound gets a relative slack of 1e-6 for the float arithmetic of the
 * scale itself (1/d and x*id are rounded too). */
static void round_trip(cairn_type type, float amp, kt_rng *rng)
{
    const int64_t n = 32 * 9;
    float *x = kt_xmalloc(sizeof(float) * (size_t)n);
    float *back = kt_xmalloc(sizeof(float) * (size_t)n);
    void *q = kt_xmalloc(row_bytes(type, n));
    for (int64_t i = 0; i < n; i++) {
        float v = kt_uniform(rng, -amp, amp);
        /* Keep F16 data out of the subnormal range (below 2^-14), where its
         * bound is absolute rather than relative. */
        if (fabsf(v) < 0x1p-14f)
            v = 0.0f;
        x[i] = v;
    }
    x[5] = 0.0f;
    for (int j = 64; j < 96; j++) /* block 2 is all zeros */
        x[j] = 0.0f;

    assert_int_equal(cairn_quantize_row(type, x, q, n), CAIRN_OK);
    assert_int_equal(cairn_dequantize_row(type, q, back, n), CAIRN_OK);

    const char *name = cairn_type_get(type)->name;
    for (int64_t b = 0; b < n / 32; b++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[b * 32 + j]));
        for (int j = 0; j < 32; j++) {
            const int64_t i = b * 32 + j;
            double tol;
            switch (type) {
            case CAIRN_TYPE_F32: tol = 0.0; break;
            case CAIRN_TYPE_F16: tol = 0x1p-11 * fabs(x[i]); break;
            case CAIRN_TYPE_BF16: tol = 0x1p-8 * fabs(x[i]); break;
            case CAIRN_TYPE_Q8_0: tol = amax / 127.0 * (0.5 + 127 * 0x1p-11) * (1 + 1e-6); break;
            case CAIRN_TYPE_Q4_0: tol = amax / 8.0 * (1.0 + 8 * 0x1p-11) * (1 + 1e-6); break;
            default: fail_msg("no bound for type %d", type); return;
            }
            KT_CLOSE(back[i], x[i], tol, name, i);
            if (x[i] == 0.0f && amax == 0.0f)
                assert_true(back[i] == 0.0f); /* an all-zero block stays zero */
        }
    }
    free(q);
    free(back);
    free(x);
}

static void test_round_trip(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("round_trip");
    const cairn_type types[] = {CAIRN_TYPE_F32, CAIRN_TYPE_F16, CAIRN_TYPE_BF16,
                                CAIRN_TYPE_Q8_0, CAIRN_TYPE_Q4_0};
    const float amps[] = {1.0f, 0.03f, 200.0f};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (size_t a = 0; a < sizeof amps / sizeof amps[0]; a++)
            for (int rep = 0; rep < 4; rep++)
                round_trip(types[t], amps[a], &rng);
}

/* Quantizing values that are already on a format's grid must reproduce them
 * exactly: a block whose values are d*k for small integers k. */
static void test_exact_grid(void **state)
{
    (void)state;
    float x[32], back[32];
    uint8_t q[34];
    /* Q8_0: amax = 127 * 0.5, so d = 0.5 exactly and every x is 0.5 * k. */
    for (int j = 0; j < 32; j++)
        x[j] = 0.5f * (float)(j * 8 - 127); /* -63.5 .. 60.5 */
    x[31] = 63.5f; /* the block's amax: 127 * 0.5 */
    assert_int_equal(cairn_quantize_row(CAIRN_TYPE_Q8_0, x, q, 32), CAIRN_OK);
    assert_int_equal(cairn_dequantize_row(CAIRN_TYPE_Q8_0, q, back, 32), CAIRN_OK);
    for (int j = 0; j < 32; j++)
        KT_CLOSE(back[j], x[j], 0.0, "Q8_0 grid", j);
    /* Q4_0: max = -4 so d = 0.5; values 0.5 * (k - 8) for k in 0..15. */
    for (int j = 0; j < 32; j++)
        x[j] = 0.5f * (float)((j % 16) - 8);
    assert_int_equal(cairn_quantize_row(CAIRN_TYPE_Q4_0, x, q, 32), CAIRN_OK);
    assert_int_equal(cairn_dequantize_row(CAIRN_TYPE_Q4_0, q, back, 32), CAIRN_OK);
    for (int j = 0; j < 32; j++)
        KT_CLOSE(back[j], x[j], 0.0, "Q4_0 grid", j);
}

/* Hand-built blocks, independent of the quantizer: the byte layout of
 * common/common.h's table. */
static void test_block_layout(void **state)
{
    (void)state;
    float out[64];

    /* Q8_0: little-endian fp16 scale 0.25 (0x3400), then int8 values. */
    uint8_t q8[34];
    q8[0] = 0x00;
    q8[1] = 0x34;
    for (int j = 0; j < 32; j++)
        q8[2 + j] = (uint8_t)(int8_t)(j - 16);
    assert_int_equal(cairn_dequantize_row(CAIRN_TYPE_Q8_0, q8, out, 32), CAIRN_OK);
    for (int j = 0; j < 32; j++)
        KT_CLOSE(out[j], 0.25 * (j - 16), 0.0, "Q8_0 layout", j);

    /* Q4_0: scale 2.0 (0x4000); byte j holds element j in its low nibble and
     * element j + 16 in its high nibble; value = d * (nibble - 8). */
    uint8_t q4[18];
    q4[0] = 0x00;
    q4[1] = 0x40;
    for (int j = 0; j < 16; j++)
        q4[2 + j] = (uint8_t)((j & 0x0f) | ((15 - j) << 4));
    assert_int_equal(cairn_dequantize_row(CAIRN_TYPE_Q4_0, q4, out, 32), CAIRN_OK);
    for (int j = 0; j < 16; j++) {
        KT_CLOSE(out[j], 2.0 * (j - 8), 0.0, "Q4_0 low nibble", j);
        KT_CLOSE(out[j + 16], 2.0 * ((15 - j) - 8), 0.0, "Q4_0 high nibble", j + 16);
    }

    /* F16 and BF16: little-endian 16-bit values. 1.0 = 0x3c00 (F16),
     * 0x3f80 (BF16); -2.0 = 0xc000 / 0xc000. */
    uint8_t h[4] = {0x00, 0x3c, 0x00, 0xc0};
    assert_int_equal(cairn_dequantize_row(CAIRN_TYPE_F16, h, out, 2), CAIRN_OK);
    KT_CLOSE(out[0], 1.0, 0.0, "F16", 0);
    KT_CLOSE(out[1], -2.0, 0.0, "F16", 1);
    uint8_t bf[4] = {0x80, 0x3f, 0x00, 0xc0};
    assert_int_equal(cairn_dequantize_row(CAIRN_TYPE_BF16, bf, out, 2), CAIRN_OK);
    KT_CLOSE(out[0], 1.0, 0.0, "BF16", 0);
    KT_CLOSE(out[1], -2.0, 0.0, "BF16", 1);
}

/* Half conversions: exact on representable values, round-to-nearest-even
 * halfway cases, specials kept. */
static void test_half_conversions(void **state)
{
    (void)state;
    /* Every half that is not NaN survives half -> float -> half. */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x03ff))
            continue;
        float f = cairn_fp16_to_fp32((uint16_t)h);
        if (cairn_fp32_to_fp16(f) != h)
            fail_msg("fp16 0x%04x -> %g -> 0x%04x", h, f, cairn_fp32_to_fp16(f));
    }
    /* 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0). */
    assert_int_equal(cairn_fp32_to_fp16(1.0f + 0x1p-11f), 0x3c00);
    /* 1 + 3 * 2^-11 is halfway between 1 + 2^-10 and 1 + 2^-9: ties to even. */
    assert_int_equal(cairn_fp32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);
    assert_int_equal(cairn_fp32_to_fp16(1e6f), 0x7c00);     /* overflow -> inf */
    assert_int_equal(cairn_fp32_to_fp16(-INFINITY), 0xfc00);
    assert_true(isnan(cairn_fp16_to_fp32(cairn_fp32_to_fp16(NAN))));
    assert_int_equal(cairn_fp32_to_fp16(0x1p-24f), 0x0001); /* smallest subnormal */
    /* bf16: ties to even on the upper 16 bits. */
    assert_int_equal(cairn_fp32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(cairn_fp32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    assert_int_equal(cairn_fp32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    assert_true(isnan(cairn_bf16_to_fp32(cairn_fp32_to_bf16(NAN))));
}

/* MXFP4: the block layout by hand (E8M0 scale byte, then nibbles in Q4_0's
 * order, E2M1 codes), and its Q5_0 rewrite giving the same floats bit for
 * bit for every code at every scale an fp16 holds, while a scale outside
 * that range is counted as inexact. */
static void test_mxfp4(void **state)
{
    (void)state;
    static const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    uint8_t blk[2 * 17];
    float want[64], got[64], via[64];
    for (int b = 0; b < 2; b++) {
        blk[17 * b] = (uint8_t)(b == 0 ? 127 : 120); /* 2^0 and 2^-7 */
        for (int j = 0; j < 16; j++)
            blk[17 * b + 1 + j] = (uint8_t)(j | ((15 - j) << 4));
        for (int j = 0; j < 16; j++) {
            want[32 * b + j] = ldexpf(e2m1[j], b == 0 ? 0 : -7);
            want[32 * b + j + 16] = ldexpf(e2m1[15 - j], b == 0 ? 0 : -7);
        }
    }
    assert_int_equal(cairn_type_row_bytes(CAIRN_TYPE_MXFP4, 64), 34);
    assert_int_equal(cairn_dequantize_row(CAIRN_TYPE_MXFP4, blk, got, 64), CAIRN_OK);
    for (int i = 0; i < 64; i++)
        KT_CLOSE(got[i], want[i], 0.0, "MXFP4 layout", i);

    /* every scale from 2^-24 to 2^15 (e = 104 .. 143) and random codes */
    kt_rng rng = kt_rng_for("mxfp4");
    uint8_t mx[17], q5[22];
    for (int e = 100; e <= 147; e++) {
        mx[0] = (uint8_t)e;
        for (int j = 0; j < 16; j++)
            mx[1 + j] = (uint8_t)kt_below(&rng, 256);
        int64_t inexact = 0;
        assert_int_equal(cairn_mxfp4_to_q5_0(mx, q5, 32, &inexact), CAIRN_OK);
        assert_int_equal(cairn_dequantize_row(CAIRN_TYPE_MXFP4, mx, got, 32), CAIRN_OK);
        assert_int_equal(cairn_dequantize_row(CAIRN_TYPE_Q5_0, q5, via, 32), CAIRN_OK);
        const int exact = e >= 104 && e <= 143;
        assert_int_equal(inexact, exact ? 0 : 1);
        if (exact)
            KT_SAME_BYTES(got, via, sizeof got[0] * 32, "MXFP4 as Q5_0");
    }
    assert_int_equal(cairn_mxfp4_to_q5_0(mx, q5, 31, NULL), CAIRN_EINVAL);

    /* the quantizer: values on the grid come back exactly (the hand-built
     * blocks above), the scale is the least power of two that fits the
     * block's largest magnitude in 6, and every value lands within half a
     * step of the grid around it (the step is at most 2 scales: 4 to 6) */
    uint8_t q[2 * 17];
    assert_int_equal(cairn_quantize_row(CAIRN_TYPE_MXFP4, want, q, 64), CAIRN_OK);
    assert_int_equal(cairn_dequantize_row(CAIRN_TYPE_MXFP4, q, got, 64), CAIRN_OK);
    for (int i = 0; i < 64; i++)
        KT_CLOSE(got[i], want[i], 0.0, "MXFP4 quantized grid", i);
    assert_int_equal(q[0], 127);
    assert_int_equal(q[17], 120);
    const float amps[] = {1.0f, 1e-30f, 3e4f};
    for (size_t a = 0; a < sizeof amps / sizeof amps[0]; a++) {
        float x[64];
        for (int i = 0; i < 64; i++)
            x[i] = kt_uniform(&rng, -amps[a], amps[a]);
        assert_int_equal(cairn_quantize_row(CAIRN_TYPE_MXFP4, x, q, 64), CAIRN_OK);
        assert_int_equal(cairn_dequantize_row(CAIRN_TYPE_MXFP4, q, got, 64), CAIRN_OK);
        for (int b = 0; b < 2; b++) {
            float amax = 0;
            for (int j = 0; j < 32; j++)
                amax = fmaxf(amax, fabsf(x[32 * b + j]));
            const float scale = ldexpf(1.0f, (int)q[17 * b] - 127);
            assert_true(amax <= 6 * scale && amax > 3 * scale); /* the least that fits */
            for (int j = 0; j < 32; j++)
                KT_CLOSE(got[32 * b + j], x[32 * b + j], scale * (1 + 1e-6), "MXFP4 round trip",
                         32 * b + j);
        }
    }
    float zeros[32] = {0};
    assert_int_equal(cairn_quantize_row(CAIRN_TYPE_MXFP4, zeros, q, 32), CAIRN_OK);
    assert_int_equal(cairn_dequantize_row(CAIRN_TYPE_MXFP4, q, got, 32), CAIRN_OK);
    for (int j = 0; j < 32; j++)
        assert_true(got[j] == 0.0f);
    assert_int_equal(cairn_quantize_row(CAIRN_TYPE_MXFP4, zeros, q, 31), CAIRN_EINVAL);
}

int main(void)
{
    kt_init_seed("kernels_quant");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_row_bytes),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_exact_grid),
        cmocka_unit_test(test_block_layout),
        cmocka_unit_test(test_mxfp4),
        cmocka_unit_test(test_half_conversions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
