/*
 * tests/gpu/test_gpu_ops.c — every op of the CUDA backend against the CPU
 * backend on fresh random inputs (seeded; rerun with CAIRN_TEST_SEED).
 *
 * Tolerances (each check says which):
 *   - get_rows and kv_store: bit-exact (the kernels use the CPU's float
 *     expressions; F16 conversion is round-to-nearest-even on both), but
 *     for the payload of a NaN (F8_E4M3's NaN codes: any NaN will do);
 *   - kv_store with a rotation (H_R in float, its rounding the kernel's
 *     own): F32 pages within 1e-6 of a host H_R; quantized pages at most
 *     1 byte in 1000 different from the CPU's (a code on a rounding
 *     boundary), every element dequantized within 1 (Q8_0) or 2 (Q4_0,
 *     where the sign of the scale may flip) steps of its block's scale;
 *   - attention over each KV type: the GPU reads the CPU's pool bytes, so
 *     only the softmax's float rounding differs (2e-5; 5e-5 with a
 *     rotation, which adds two float Hadamard transforms);
 *   - geglu: 1e-5 relative (tanhf); scale: bit-exact; add_rows_scaled: 1e-6
 *     relative plus 1e-4 (an ulp of the product, which the device may fuse);
 *   - float paths (F32 matmul, GEMV on any type, rmsnorm, rope, swiglu,
 *     softmax, attention): 1e-5 relative, where "relative" is to the sum of
 *     magnitudes that went into the value (sum |w x| for a dot product), so
 *     the bound holds whatever the summation order;
 *   - F16/BF16 weights with more than 64 tokens (cuBLAS on activations
 *     rounded to 16 bits): 1e-2 relative (BF16 keeps 8 mantissa bits).
 * The CPU backend runs with CAIRN_CPU_EXACT_MATMUL=1 so its quantized matmul
 * has the float semantics the CUDA GEMV implements.
 *
 * Every op's output is poisoned with NaN (all bytes 0xff) before the op, so
 * an element the op forgets to write fails its comparison instead of
 * passing as a zero from alloc().
 *
 * Batch invariance: with 16-bit or quantized weights and T <= 64, a token's
 * matmul output must be bit-identical whether it is computed alone or with
 * the others (docs/cuda.md, "Matmul paths"); a long decode row's attention
 * (the split-KV path) must be bit-identical alone and beside other
 * sequences (test_attention_split).
 *
 * Exits 77 (ctest: skipped) only when the CUDA runtime sees no device (and
 * CAIRN_GPU_REQUIRED is not 1); a device whose backend does not come up is
 * a failure (tests/gpu/gpu_probe.h). With CAIRN_GPU_TEST_BACKEND=cpu a
 * scalar CPU backend stands in for the GPU; the cases that are huge by
 * design (a matmul of 4096 x 16400, a KV pool above 4.5 GiB) then run at a
 * reduced size, which each says, so the harness stays quick.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu/gpu_probe.h"
#include "tests/support/support.h"

static cairn_backend *cpu, *gpu;
static int harness; /* the "GPU" is the scalar CPU backend */

/* ---- helpers ------------------------------------------------------------- */

/* Upload the same host bytes to both backends. */
typedef struct {
    void *c, *g;
    size_t bytes;
} pair_buf;

static pair_buf pair_new(const void *host, size_t bytes)
{
    pair_buf p = {kt_dev(cpu, host, bytes), kt_dev(gpu, host, bytes), bytes};
    return p;
}

/* An output buffer on both backends, every byte 0xff (a NaN as float). */
static pair_buf pair_out(size_t bytes)
{
    uint8_t *nan = kt_xmalloc(bytes);
    memset(nan, 0xff, bytes);
    pair_buf p = pair_new(nan, bytes);
    free(nan);
    return p;
}

static void pair_free(pair_buf *p)
{
    cpu->iface->free(cpu, p->c);
    gpu->iface->free(gpu, p->g);
}

/* Both results on the host: *c from the CPU, *g from the GPU. */
static void pair_fetch(const pair_buf *p, float **c, float **g)
{
    *c = kt_host(cpu, p->c, p->bytes);
    *g = kt_host(gpu, p->g, p->bytes);
}

static void expect_close(const float *got, const float *want, const float *mag, size_t n,
                         double rtol, double atol, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        const double m = mag ? mag[i] : fabs(want[i]);
        KT_CLOSE(got[i], want[i], rtol * m + atol, what, i);
    }
}

/* A buffer pair's n floats: the GPU's within rtol·|cpu| + atol of the CPU's,
 * or (pair_same) the same bytes. */
static void pair_close(const pair_buf *p, size_t n, double rtol, double atol, const char *what)
{
    float *c, *g;
    pair_fetch(p, &c, &g);
    expect_close(g, c, NULL, n, rtol, atol, what);
    free(c);
    free(g);
}

static void pair_same(const pair_buf *p, size_t n, const char *what)
{
    float *c, *g;
    pair_fetch(p, &c, &g);
    KT_SAME_BYTES(g, c, n * 4, what);
    free(c);
    free(g);
}

static const cairn_type all_types[] = {
    CAIRN_TYPE_F32,  CAIRN_TYPE_F16,  CAIRN_TYPE_BF16, CAIRN_TYPE_Q8_0, CAIRN_TYPE_Q4_0,
    CAIRN_TYPE_Q5_0, CAIRN_TYPE_Q4_K, CAIRN_TYPE_Q5_K, CAIRN_TYPE_Q6_K, CAIRN_TYPE_Q4_Z,
    CAIRN_TYPE_F8_E4M3, CAIRN_TYPE_MXFP4,
};
#define N_TYPES (sizeof all_types / sizeof all_types[0])

/* ---- memory ----------------------------------------------------------------- */

static void test_memory(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("memory");
    const size_t n = 100003; /* odd size: the rounding up must not show */
    uint8_t *src = kt_xmalloc(n), *back = kt_xmalloc(n);
    for (size_t i = 0; i < n; i++)
        src[i] = (uint8_t)kt_next(&r);
    void *a = NULL, *b = NULL;
    assert_int_equal(gpu->iface->alloc(gpu, n, &a), CAIRN_OK);
    assert_int_equal(gpu->iface->alloc(gpu, n, &b), CAIRN_OK);
    assert_int_equal((uintptr_t)a % 64, 0);
    assert_int_equal((uintptr_t)b % 64, 0);
    /* zeroed */
    memset(back, 0xff, n);
    assert_int_equal(gpu->iface->download(gpu, back, a, n), CAIRN_OK);
    for (size_t i = 0; i < n; i++)
        if (back[i] != 0)
            fail_msg("alloc not zeroed at byte %zu", i);
    /* upload, device copy (at an offset), download */
    assert_int_equal(gpu->iface->upload(gpu, a, src, n), CAIRN_OK);
    assert_int_equal(gpu->iface->copy(gpu, (uint8_t *)b + 7, (uint8_t *)a + 7, n - 7), CAIRN_OK);
    assert_int_equal(gpu->iface->synchronize(gpu), CAIRN_OK);
    assert_int_equal(gpu->iface->download(gpu, back, b, n), CAIRN_OK);
    for (size_t i = 0; i < 7; i++)
        assert_int_equal(back[i], 0);
    KT_SAME_BYTES(back + 7, src + 7, n - 7, "upload/copy/download");
    /* overlapping ranges: CUDA's copy refuses them (cudaMemcpyAsync is
     * undefined there), the CPU's is memmove; dst == src is a no-op */
    if (harness) {
        assert_int_equal(gpu->iface->copy(gpu, (uint8_t *)b + 1, b, 64), CAIRN_OK);
    } else {
        assert_int_equal(gpu->iface->copy(gpu, (uint8_t *)b + 1, b, 64), CAIRN_EINVAL);
        assert_int_equal(gpu->iface->copy(gpu, b, (uint8_t *)b + 63, 64), CAIRN_EINVAL);
    }
    assert_int_equal(gpu->iface->copy(gpu, b, b, 64), CAIRN_OK);
    assert_int_equal(gpu->iface->copy(gpu, (uint8_t *)b + 64, b, 64), CAIRN_OK); /* adjacent */
    /* edge rules */
    assert_int_equal(gpu->iface->copy(gpu, b, a, 0), CAIRN_OK);
    assert_int_equal(gpu->iface->upload(gpu, NULL, src, 4), CAIRN_EINVAL);
    assert_int_equal(gpu->iface->download(gpu, back, NULL, 4), CAIRN_EINVAL);
    void *none = NULL;
    assert_int_equal(gpu->iface->alloc(gpu, 0, &none), CAIRN_EINVAL);
    assert_int_equal(gpu->iface->alloc(gpu, 16, NULL), CAIRN_EINVAL);
    gpu->iface->free(gpu, a);
    gpu->iface->free(gpu, b);
    gpu->iface->free(gpu, NULL);
    free(src);
    free(back);
}

/* The backend names its weight types with its own supports_type slot, and
 * they are the CPU backend's (the ops below test every one of them). */
static void test_supports_type(void **state)
{
    (void)state;
    assert_non_null(gpu->iface->supports_type);
    /* the CPU's types, MXFP4 among them (multiplied as it is, not
     * rewritten as Q5_0 at load) */
    for (int t = -1; t <= CAIRN_TYPE_COUNT_; t++)
        assert_int_equal(cairn_backend_supports_type(gpu, (cairn_type)t),
                         cairn_backend_supports_type(cpu, (cairn_type)t));
    for (size_t ti = 0; ti < N_TYPES; ti++)
        assert_true(cairn_backend_supports_type(gpu, all_types[ti]));
}

/* ---- get_rows ---------------------------------------------------------------- */

static void test_get_rows(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("get_rows");
    const int rows = 19, D = 512, T = 23;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const cairn_type type = all_types[ti];
        float *values;
        uint8_t *table = kt_random_weights(&r, type, rows, D, -1.0f, 1.0f, &values);
        int32_t ids[23];
        for (int t = 0; t < T; t++)
            ids[t] = kt_below(&r, rows); /* repeats included */
        pair_buf tab = pair_new(table, cairn_type_row_bytes(type, D) * rows);
        pair_buf out = pair_out((size_t)T * D * sizeof(float));
        assert_int_equal(cpu->iface->get_rows(cpu, out.c, tab.c, type, D, ids, T), CAIRN_OK);
        assert_int_equal(gpu->iface->get_rows(gpu, out.g, tab.g, type, D, ids, T), CAIRN_OK);
        float *c, *g;
        pair_fetch(&out, &c, &g);
        char what[64];
        snprintf(what, sizeof what, "get_rows %s", cairn_type_get(type)->name);
        KT_SAME_BYTES(g, c, out.bytes, what);
        for (int t = 0; t < T; t++) /* and they are the reference values */
            KT_SAME_BYTES(g + (size_t)t * D, values + (size_t)ids[t] * D, D * sizeof(float), what);
        free(c);
        free(g);
        pair_free(&tab);
        pair_free(&out);
        free(table);
        free(values);
    }
    /* an F32 row width that is not a multiple of anything */
    float tab[3 * 37];
    kt_fill(&r, tab, 3 * 37, -5, 5);
    int32_t ids[2] = {2, 0};
    pair_buf t2 = pair_new(tab, sizeof tab), o2 = pair_out(2 * 37 * sizeof(float));
    assert_int_equal(gpu->iface->get_rows(gpu, o2.g, t2.g, CAIRN_TYPE_F32, 37, ids, 2), CAIRN_OK);
    float *g = kt_host(gpu, o2.g, o2.bytes);
    KT_SAME_BYTES(g, tab + 2 * 37, 37 * sizeof(float), "get_rows f32 odd width");
    KT_SAME_BYTES(g + 37, tab, 37 * sizeof(float), "get_rows f32 odd width");
    free(g);
    /* edge rules as the CPU */
    int32_t bad[1] = {-1};
    assert_int_equal(gpu->iface->get_rows(gpu, o2.g, t2.g, CAIRN_TYPE_F32, 37, bad, 1), CAIRN_EINVAL);
    assert_int_equal(gpu->iface->get_rows(gpu, o2.g, t2.g, CAIRN_TYPE_Q8_0, 37, ids, 1), CAIRN_EINVAL);
    assert_int_equal(gpu->iface->get_rows(gpu, o2.g, t2.g, CAIRN_TYPE_F32, 37, ids, 0), CAIRN_EINVAL);
    pair_free(&t2);
    pair_free(&o2);
}

/* ---- the checkpoint layouts' every code ----------------------------------------- */

/* n floats: the same bits, except that where want is a NaN got only has to
 * be one (the GPU's multiply returns its canonical NaN, not the operand's
 * payload and sign as x86 does). */
static void same_bits_or_nan(const float *got, const float *want, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        if (isnan(want[i]) ? !isnan(got[i]) : memcmp(got + i, want + i, 4) != 0)
            fail_msg("seed %llu: %s [%zu]: got %a, want %a", (unsigned long long)kt_seed, what, i,
                     (double)got[i], (double)want[i]);
    }
}

/* get_rows of a table of `rows` rows of D elements of `type` (host bytes
 * `table`): the backend under test against the CPU backend and against
 * cairn_dequantize_row, and once more with the table 2 bytes past a 4-byte
 * boundary (the kernels' byte-load path for blocks they otherwise read a
 * word at a time), which must give the very same bits. */
static void check_get_rows_table(cairn_type type, const uint8_t *table, int rows, int D,
                                 const char *what)
{
    const size_t rb = cairn_type_row_bytes(type, D), bytes = rb * rows;
    int32_t ids[16];
    assert_true(rows <= 16);
    for (int t = 0; t < rows; t++)
        ids[t] = rows - 1 - t;
    float *ref = kt_xmalloc((size_t)rows * D * sizeof(float));
    for (int t = 0; t < rows; t++)
        assert_int_equal(cairn_dequantize_row(type, table + (size_t)ids[t] * rb,
                                              ref + (size_t)t * D, D),
                         CAIRN_OK);
    uint8_t *shifted = kt_xmalloc(bytes + 2);
    shifted[0] = shifted[1] = 0x5a;
    memcpy(shifted + 2, table, bytes);
    pair_buf tab = pair_new(table, bytes);
    pair_buf tab2 = pair_new(shifted, bytes + 2);
    pair_buf out = pair_out((size_t)rows * D * sizeof(float));
    pair_buf out2 = pair_out((size_t)rows * D * sizeof(float));
    assert_int_equal(cpu->iface->get_rows(cpu, out.c, tab.c, type, D, ids, rows), CAIRN_OK);
    assert_int_equal(gpu->iface->get_rows(gpu, out.g, tab.g, type, D, ids, rows), CAIRN_OK);
    assert_int_equal(gpu->iface->get_rows(gpu, out2.g, (uint8_t *)tab2.g + 2, type, D, ids, rows),
                     CAIRN_OK);
    float *c, *g;
    pair_fetch(&out, &c, &g);
    float *g2 = kt_host(gpu, out2.g, out2.bytes);
    char msg[96];
    snprintf(msg, sizeof msg, "%s: against the CPU backend", what);
    same_bits_or_nan(g, c, (size_t)rows * D, msg);
    snprintf(msg, sizeof msg, "%s: against cairn_dequantize_row", what);
    same_bits_or_nan(g, ref, (size_t)rows * D, msg);
    snprintf(msg, sizeof msg, "%s: table at a 2-byte offset", what);
    KT_SAME_BYTES(g2, g, out.bytes, msg);
    free(c);
    free(g);
    free(g2);
    free(ref);
    free(shifted);
    pair_free(&tab);
    pair_free(&tab2);
    pair_free(&out);
    pair_free(&out2);
}

/* Blocks made by hand rather than quantized from floats, so that every
 * code occurs, with scales at the edges of their types:
 *   F8_E4M3: each row holds the 256 codes in order (8 blocks), the NaN
 *     codes 0x7f/0xff and the subnormals 0x01..0x07 included, one scale per
 *     row: 1 (the output is the e4m3 table itself, checked against
 *     cairn_e4m3_to_fp32 too), -0.3712, 2^-120 and 2^-130 (products that
 *     are float subnormals: nothing may flush them), 3e38 (products that
 *     overflow to inf);
 *   Q4_Z: row r has zero r (0..15) and 16 blocks whose 16 bytes are
 *     16b .. 16b + 15, so every byte value, both nibbles, meets every zero;
 *     the f16 scales include subnormals, the largest finite and negatives. */
static void test_get_rows_ckpt_codes(void **state)
{
    (void)state;
    {
        enum { ROWS = 5, D = 256 };
        static const float scales[ROWS] = {1.0f, -0.3712f, 0x1p-120f, 0x1p-130f, 3e38f};
        uint8_t table[ROWS * (D / 32) * 36];
        uint8_t *p = table;
        for (int row = 0; row < ROWS; row++)
            for (int b = 0; b < D / 32; b++, p += 36) {
                memcpy(p, &scales[row], 4);
                for (int j = 0; j < 32; j++)
                    p[4 + j] = (uint8_t)(32 * b + j);
            }
        check_get_rows_table(CAIRN_TYPE_F8_E4M3, table, ROWS, D, "get_rows F8_E4M3 codes");
        /* with d = 1 (row 0) the row is the e4m3 table */
        pair_buf tab = pair_new(table, sizeof table);
        pair_buf out = pair_out(D * sizeof(float));
        const int32_t id0[1] = {0};
        assert_int_equal(gpu->iface->get_rows(gpu, out.g, tab.g, CAIRN_TYPE_F8_E4M3, D, id0, 1),
                         CAIRN_OK);
        float *g = kt_host(gpu, out.g, out.bytes), want[D];
        for (int c = 0; c < D; c++)
            want[c] = cairn_e4m3_to_fp32((uint8_t)c);
        same_bits_or_nan(g, want, D, "get_rows F8_E4M3, d = 1: the e4m3 table");
        for (int c = 0; c < D; c++) /* a NaN code is the only non-finite value */
            if (!isfinite(g[c]) != ((c & 0x7f) == 0x7f))
                fail_msg("e4m3 code 0x%02x decoded to %a", c, (double)g[c]);
        free(g);
        pair_free(&tab);
        pair_free(&out);
    }
    {
        enum { ROWS = 16, D = 512 };
        static const uint16_t dh[D / 32] = {
            0x3c00, 0xbc00, 0x0001, 0x03ff, 0x8001, 0x7bff, 0xfbff, 0x0400,
            0x3555, 0xb666, 0x1234, 0x2e66, 0x4900, 0xc100, 0x0000, 0x5bcd,
        };
        uint8_t table[ROWS * (D / 32) * 20];
        uint8_t *p = table;
        for (int row = 0; row < ROWS; row++)
            for (int b = 0; b < D / 32; b++, p += 20) {
                p[0] = (uint8_t)(dh[b] & 0xff);
                p[1] = (uint8_t)(dh[b] >> 8);
                p[2] = (uint8_t)row; /* the zero */
                p[3] = (uint8_t)(0xa5 ^ b); /* padding: must be ignored */
                for (int j = 0; j < 16; j++)
                    p[4 + j] = (uint8_t)(16 * b + j);
            }
        check_get_rows_table(CAIRN_TYPE_Q4_Z, table, ROWS, D, "get_rows Q4_Z codes");
    }
}

/* Quantized weights 2 bytes past a 4-byte boundary: the GEMV (T = 3) and
 * the dequantize + SGEMM path (T = 70) read them a byte at a time, and
 * must give the same bits as from the aligned copy. */
static void test_matmul_ckpt_unaligned(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("matmul_ckpt_unaligned");
    static const cairn_type types[] = {CAIRN_TYPE_Q4_Z, CAIRN_TYPE_F8_E4M3, CAIRN_TYPE_MXFP4};
    static const int Ts[] = {3, 70};
    const int n_in = 256, n_out = 37;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const cairn_type type = types[ti];
        const size_t bytes = cairn_type_row_bytes(type, n_in) * n_out;
        uint8_t *w = kt_random_weights(&r, type, n_out, n_in, -1.0f, 1.0f, NULL);
        uint8_t *shifted = kt_xmalloc(bytes + 2);
        shifted[0] = shifted[1] = 0;
        memcpy(shifted + 2, w, bytes);
        void *Wa = kt_dev(gpu, w, bytes), *Wu = kt_dev(gpu, shifted, bytes + 2);
        for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
            const int T = Ts[k];
            float *x = kt_xmalloc((size_t)T * n_in * sizeof(float));
            kt_fill(&r, x, (size_t)T * n_in, -2.0f, 2.0f);
            void *X = kt_dev(gpu, x, (size_t)T * n_in * sizeof(float));
            pair_buf Y = pair_out((size_t)T * n_out * sizeof(float));
            pair_buf Y2 = pair_out(Y.bytes);
            assert_int_equal(gpu->iface->matmul(gpu, Y.g, Wa, type, X, T, n_in, n_out), CAIRN_OK);
            assert_int_equal(
                gpu->iface->matmul(gpu, Y2.g, (uint8_t *)Wu + 2, type, X, T, n_in, n_out),
                CAIRN_OK);
            float *ya = kt_host(gpu, Y.g, Y.bytes), *yu = kt_host(gpu, Y2.g, Y2.bytes);
            for (size_t i = 0; i < (size_t)T * n_out; i++)
                if (isnan(ya[i]))
                    fail_msg("matmul %s T=%d: y[%zu] not written", cairn_type_get(type)->name, T,
                             i);
            char what[96];
            snprintf(what, sizeof what, "matmul %s T=%d: weights at a 2-byte offset",
                     cairn_type_get(type)->name, T);
            KT_SAME_BYTES(yu, ya, Y.bytes, what);
            free(ya);
            free(yu);
            free(x);
            gpu->iface->free(gpu, X);
            pair_free(&Y);
            pair_free(&Y2);
        }
        gpu->iface->free(gpu, Wa);
        gpu->iface->free(gpu, Wu);
        free(w);
        free(shifted);
    }
}

/* ---- matmul ------------------------------------------------------------------ */

static void check_matmul(kt_rng *r, cairn_type type, int T, int n_in, int n_out)
{
    float *wv;
    uint8_t *w = kt_random_weights(r, type, n_out, n_in, -1.0f, 1.0f, &wv);
    float *x = kt_xmalloc((size_t)T * n_in * sizeof(float));
    kt_fill(r, x, (size_t)T * n_in, -2.0f, 2.0f);
    /* sum_i |w_i x_i| per output: the scale of the rounding error */
    float *mag = kt_xmalloc((size_t)T * n_out * sizeof(float));
    for (int t = 0; t < T; t++)
        for (int o = 0; o < n_out; o++) {
            double s;
            kt_ref_dot(wv + (size_t)o * n_in, x + (size_t)t * n_in, n_in, NULL, &s);
            mag[(size_t)t * n_out + o] = (float)s;
        }
    pair_buf W = pair_new(w, cairn_type_row_bytes(type, n_in) * n_out);
    pair_buf X = pair_new(x, (size_t)T * n_in * sizeof(float));
    pair_buf Y = pair_out((size_t)T * n_out * sizeof(float));
    assert_int_equal(cpu->iface->matmul(cpu, Y.c, W.c, type, X.c, T, n_in, n_out), CAIRN_OK);
    assert_int_equal(gpu->iface->matmul(gpu, Y.g, W.g, type, X.g, T, n_in, n_out), CAIRN_OK);
    float *c, *g;
    pair_fetch(&Y, &c, &g);
    /* 16-bit weights past the GEMV size go through cuBLAS on 16-bit
     * activations; everything else is float arithmetic */
    const int is16 = type == CAIRN_TYPE_F16 || type == CAIRN_TYPE_BF16;
    const int gemv = type != CAIRN_TYPE_F32 && T <= 64 && (!is16 || n_in % 8 == 0);
    const int rounded = is16 && !gemv;
    char what[96];
    snprintf(what, sizeof what, "matmul %s T=%d n_in=%d n_out=%d", cairn_type_get(type)->name, T,
             n_in, n_out);
    expect_close(g, c, mag, (size_t)T * n_out, rounded ? 1e-2 : 1e-5, 1e-6, what);
    if (gemv && T > 1) {
        /* batch invariance: the last token alone (it sits in the last,
         * partial group of 8 when T % 8 != 0) gives the same bits */
        pair_buf Y1 = pair_out((size_t)n_out * sizeof(float));
        const float *x_last = (const float *)X.g + (size_t)(T - 1) * n_in;
        assert_int_equal(gpu->iface->matmul(gpu, Y1.g, W.g, type, x_last, 1, n_in, n_out), CAIRN_OK);
        float *g1 = kt_host(gpu, Y1.g, Y1.bytes);
        char inv[192];
        snprintf(inv, sizeof inv, "%s: token %d alone vs in the batch", what, T - 1);
        KT_SAME_BYTES(g1, g + (size_t)(T - 1) * n_out, Y1.bytes, inv);
        free(g1);
        gpu->iface->free(gpu, Y1.g);
        cpu->iface->free(cpu, Y1.c);
    }
    free(c);
    free(g);
    pair_free(&W);
    pair_free(&X);
    pair_free(&Y);
    free(w);
    free(wv);
    free(x);
    free(mag);
}

static void test_matmul(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("matmul");
    /* T = 1, 3, 8: one GEMV launch; 9, 33, 40, 64: grouped GEMV (16-bit
     * and quantized); 65: cuBLAS on 16-bit activations (16-bit) or
     * dequantize + SGEMM (quantized). F32 is SGEMM at every T. */
    static const int Ts[] = {1, 3, 8, 9, 33, 40, 64, 65};
    for (size_t ti = 0; ti < N_TYPES; ti++)
        for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++)
            check_matmul(&r, all_types[ti], Ts[k], 512, 67);
    /* 16-bit rows: a multiple of 8 only (vector GEMV), and of nothing
     * (cuBLAS even for one token) */
    check_matmul(&r, CAIRN_TYPE_BF16, 2, 72, 33);
    check_matmul(&r, CAIRN_TYPE_F16, 2, 72, 33);
    check_matmul(&r, CAIRN_TYPE_BF16, 2, 36, 5);
    check_matmul(&r, CAIRN_TYPE_F32, 5, 37, 3);
    /* tall 16-bit matrices: 4 and 2 rows per warp, with a partial last warp */
    check_matmul(&r, CAIRN_TYPE_BF16, 3, 64, 8195);
    check_matmul(&r, CAIRN_TYPE_F16, 8, 64, 2051);
    check_matmul(&r, CAIRN_TYPE_BF16, 1, 64, 8195);
    /* an LM-head-like shape */
    check_matmul(&r, CAIRN_TYPE_Q6_K, 2, 256, 1000);
    /* quantized rows of 4096: each lane loops over 4 blocks (128 per row);
     * T 17 and 32 are 3 and 4 GEMV launches, 33 and 64 five and eight */
    static const int Tq[] = {17, 32, 33, 64};
    for (size_t k = 0; k < sizeof Tq / sizeof Tq[0]; k++) {
        check_matmul(&r, CAIRN_TYPE_Q4_K, Tq[k], 4096, 67);
        check_matmul(&r, CAIRN_TYPE_Q8_0, Tq[k], 4096, 37);
    }
    check_matmul(&r, CAIRN_TYPE_Q6_K, 17, 4096, 33);
    check_matmul(&r, CAIRN_TYPE_BF16, 33, 4096, 67);
    /* the checkpoint layouts (AWQ/GPTQ int4 as Q4_Z, FP8 as F8_E4M3) in
     * rows of 4096: T 1 and 5 are the GEMV, 100 dequantize + SGEMM */
    static const int Tc[] = {1, 5, 100};
    for (size_t k = 0; k < sizeof Tc / sizeof Tc[0]; k++) {
        check_matmul(&r, CAIRN_TYPE_Q4_Z, Tc[k], 4096, 67);
        check_matmul(&r, CAIRN_TYPE_F8_E4M3, Tc[k], 4096, 37);
        /* gpt-oss's experts (2880 inputs: 90 blocks of 17 bytes) */
        check_matmul(&r, CAIRN_TYPE_MXFP4, Tc[k], 2880, 37);
    }

    /* edge rules */
    float x[64];
    kt_fill(&r, x, 64, -1, 1);
    pair_buf X = pair_new(x, sizeof x);
    assert_int_equal(gpu->iface->matmul(gpu, X.g, X.g, CAIRN_TYPE_F32, X.g, 1, 8, 8), CAIRN_EINVAL);
    assert_int_equal(gpu->iface->matmul(gpu, X.g, X.g, CAIRN_TYPE_Q8_0, x, 1, 40, 1), CAIRN_EINVAL);
    assert_int_equal(gpu->iface->matmul(gpu, X.g, X.g, CAIRN_TYPE_I32, x, 1, 8, 1), CAIRN_EINVAL);
    pair_free(&X);
}

/* A Q4_K matrix too big to dequantize in one 256 MiB chunk: 4096 x 16400
 * rows of F32 are 268.7 MB, so the quantized prefill path (T > 64) runs two
 * chunks, the second writing y at column offset 16384. The weights are
 * random Q4_K blocks made directly (random scales, mins and nibbles, small
 * finite d and dmin) rather than quantized from floats, which would take
 * far longer at this size; the CPU reference runs on a sample of rows
 * (both chunks, both sides of the boundary, the last row). On the CPU
 * harness the matrix is scaled down to 1640 rows (the chunking is the
 * GPU's own business; the harness checks the test's logic). */
static void test_matmul_two_chunks(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("matmul_two_chunks");
    const cairn_type type = CAIRN_TYPE_Q4_K;
    const int n_in = 4096, T = 72, n_out = harness ? 1640 : 16400;
    if (harness)
        printf("matmul_two_chunks: CPU harness, %d rows instead of 16400\n", n_out);
    const size_t rb = cairn_type_row_bytes(type, n_in), blk = 144;
    uint8_t *w = kt_xmalloc(rb * n_out);
    for (size_t i = 0; i < rb * n_out; i++)
        w[i] = (uint8_t)kt_next(&r);
    for (size_t b = 0; b < rb * n_out / blk; b++) {
        const uint16_t d = cairn_fp32_to_fp16(kt_uniform(&r, 0.001f, 0.02f));
        const uint16_t dmin = cairn_fp32_to_fp16(kt_uniform(&r, 0.001f, 0.02f));
        memcpy(w + b * blk, &d, 2);
        memcpy(w + b * blk + 2, &dmin, 2);
    }
    float *x = kt_xmalloc((size_t)T * n_in * sizeof(float));
    kt_fill(&r, x, (size_t)T * n_in, -2.0f, 2.0f);

    enum { N_SAMPLE = 24 };
    int rows[N_SAMPLE] = {0, 1, n_out / 2, n_out - 1};
    int ns = 4;
    if (n_out > 16385) { /* the chunk boundary: 256 MiB / (4096 * 4) rows */
        rows[ns++] = 16383;
        rows[ns++] = 16384;
    }
    while (ns < N_SAMPLE)
        rows[ns++] = kt_below(&r, n_out);
    uint8_t *ws = kt_xmalloc(rb * N_SAMPLE);
    float *wv = kt_xmalloc((size_t)n_in * sizeof(float));
    float *mag = kt_xmalloc((size_t)T * N_SAMPLE * sizeof(float));
    for (int k = 0; k < N_SAMPLE; k++) {
        memcpy(ws + rb * k, w + rb * rows[k], rb);
        assert_int_equal(cairn_dequantize_row(type, ws + rb * k, wv, n_in), CAIRN_OK);
        for (int t = 0; t < T; t++) {
            double m;
            kt_ref_dot(wv, x + (size_t)t * n_in, n_in, NULL, &m);
            mag[(size_t)t * N_SAMPLE + k] = (float)m;
        }
    }
    void *Wg = kt_dev(gpu, w, rb * n_out);
    free(w);
    pair_buf X = pair_new(x, (size_t)T * n_in * sizeof(float));
    pair_buf Ws = pair_new(ws, rb * N_SAMPLE);
    pair_buf Ys = pair_out((size_t)T * N_SAMPLE * sizeof(float));
    uint8_t *nan = kt_xmalloc((size_t)T * n_out * sizeof(float));
    memset(nan, 0xff, (size_t)T * n_out * sizeof(float));
    float *Yg = kt_dev(gpu, nan, (size_t)T * n_out * sizeof(float));
    free(nan);
    assert_int_equal(gpu->iface->matmul(gpu, Yg, Wg, type, X.g, T, n_in, n_out), CAIRN_OK);
    assert_int_equal(cpu->iface->matmul(cpu, Ys.c, Ws.c, type, X.c, T, n_in, N_SAMPLE), CAIRN_OK);
    float *g = kt_host(gpu, Yg, (size_t)T * n_out * sizeof(float));
    float *c = kt_host(cpu, Ys.c, Ys.bytes);
    for (int t = 0; t < T; t++)
        for (int k = 0; k < N_SAMPLE; k++) {
            char what[96];
            snprintf(what, sizeof what, "matmul Q4_K %d x %d T=%d, row %d token %d", n_out, n_in,
                     T, rows[k], t);
            KT_CLOSE(g[(size_t)t * n_out + rows[k]], c[(size_t)t * N_SAMPLE + k],
                     1e-5 * mag[(size_t)t * N_SAMPLE + k] + 1e-6, what, rows[k]);
        }
    for (size_t i = 0; i < (size_t)T * n_out; i++) /* every element written */
        if (isnan(g[i]))
            fail_msg("matmul Q4_K %d x %d: y[%zu] not written", n_out, n_in, i);
    free(g);
    free(c);
    gpu->iface->free(gpu, Wg);
    gpu->iface->free(gpu, Yg);
    pair_free(&X);
    pair_free(&Ws);
    pair_free(&Ys);
    free(ws);
    free(wv);
    free(mag);
    free(x);
}

/* F16 weights on the cuBLAS path (T > 64) round activations to 16 bits; a
 * NaN activation must stay NaN (it once became -65504) and an inf must not
 * turn finite, as on the CPU and the GEMV path. */
static void test_matmul_f16_nonfinite(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("matmul_f16_nonfinite");
    const int T = 70, n_in = 64, n_out = 5;
    float *wv;
    uint8_t *w = kt_random_weights(&r, CAIRN_TYPE_F16, n_out, n_in, 0.5f, 1.0f, &wv);
    float *x = kt_xmalloc((size_t)T * n_in * sizeof(float));
    kt_fill(&r, x, (size_t)T * n_in, 0.5f, 1.0f); /* all products positive */
    x[3 * n_in + 7] = NAN;
    x[5 * n_in + 9] = INFINITY;
    x[6 * n_in + 1] = 1e6f; /* finite: saturates to 65504 in F16, stays finite */
    pair_buf W = pair_new(w, cairn_type_row_bytes(CAIRN_TYPE_F16, n_in) * n_out);
    pair_buf X = pair_new(x, (size_t)T * n_in * sizeof(float));
    pair_buf Y = pair_out((size_t)T * n_out * sizeof(float));
    assert_int_equal(gpu->iface->matmul(gpu, Y.g, W.g, CAIRN_TYPE_F16, X.g, T, n_in, n_out), CAIRN_OK);
    float *g = kt_host(gpu, Y.g, Y.bytes);
    for (int o = 0; o < n_out; o++) {
        if (!isnan(g[3 * n_out + o]))
            fail_msg("F16 matmul: NaN activation gave %g in row 3, output %d", g[3 * n_out + o], o);
        if (!(isinf(g[5 * n_out + o]) && g[5 * n_out + o] > 0))
            fail_msg("F16 matmul: +inf activation gave %g in row 5, output %d", g[5 * n_out + o], o);
        if (!isfinite(g[6 * n_out + o]) || g[6 * n_out + o] < 65504.0f * 0.5f)
            fail_msg("F16 matmul: a 1e6 activation gave %g in row 6, output %d", g[6 * n_out + o], o);
        if (!isfinite(g[0 * n_out + o]))
            fail_msg("F16 matmul: row 0 output %d is %g", o, g[o]);
    }
    free(g);
    pair_free(&W);
    pair_free(&X);
    pair_free(&Y);
    free(w);
    free(wv);
    free(x);
}

/* ---- the staging ring ------------------------------------------------------------ */

/* More than the ring's first 4 MiB in one call (a 2048 x 2100 tree mask:
 * the ring must grow), then far more than the ring across many calls issued
 * without a wait in between (it must wrap, and no call may see another's
 * index array). */
static void test_staging(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("staging");
    {
        cairn_kv_layout L;
        assert_int_equal(cairn_kv_layout_init(&L, 1, 1, 16, 16, CAIRN_TYPE_F16), CAIRN_OK);
        const int n_q = 2048, n_kv = 2100, n_head = 2, n_pages = (n_kv + 15) / 16;
        int32_t *pages = kt_xmalloc((size_t)n_pages * 4), *slots = kt_xmalloc((size_t)n_kv * 4);
        kt_permutation(&r, pages, n_pages);
        for (int j = 0; j < n_kv; j++)
            slots[j] = pages[j / 16] * 16 + j % 16;
        const size_t kvn = (size_t)n_kv * 16, qn = (size_t)n_q * n_head * 16;
        float *k = kt_xmalloc(kvn * 4), *v = kt_xmalloc(kvn * 4), *q = kt_xmalloc(qn * 4);
        kt_fill(&r, k, kvn, -1, 1);
        kt_fill(&r, v, kvn, -1, 1);
        kt_fill(&r, q, qn, -1, 1);
        uint8_t *mask = kt_xmalloc((size_t)n_q * n_kv);
        for (size_t i = 0; i < (size_t)n_q * n_kv; i++)
            mask[i] = (uint8_t)(kt_below(&r, 4) != 0);
        pair_buf pool = pair_new(NULL, (size_t)n_pages * L.page_bytes);
        pair_buf K = pair_new(k, kvn * 4), V = pair_new(v, kvn * 4), Q = pair_new(q, qn * 4);
        pair_buf O = pair_out(qn * 4);
        assert_int_equal(cpu->iface->kv_store(cpu, pool.c, &L, 0, K.c, V.c, slots, n_kv), CAIRN_OK);
        assert_int_equal(gpu->iface->kv_store(gpu, pool.g, &L, 0, K.g, V.g, slots, n_kv), CAIRN_OK);
        cairn_attn_seq seq = {0, n_q, n_kv, NULL, pages, mask};
        cairn_attn_args a = {O.c, Q.c, pool.c, &L, 0, n_head, 0.25f, 1, &seq, 0, NULL};
        assert_int_equal(cpu->iface->attention(cpu, &a), CAIRN_OK);
        a.out = O.g;
        a.q = Q.g;
        a.kv_pool = pool.g;
        assert_int_equal(gpu->iface->attention(gpu, &a), CAIRN_OK);
        float *c, *g;
        pair_fetch(&O, &c, &g);
        for (size_t i = 0; i < qn; i++)
            KT_CLOSE(g[i], c[i], 2e-5, "attention with a 2048 x 2100 mask (4.3 MB staged)", i);
        free(c);
        free(g);
        pair_free(&pool);
        pair_free(&K);
        pair_free(&V);
        pair_free(&Q);
        pair_free(&O);
        free(pages);
        free(slots);
        free(k);
        free(v);
        free(q);
        free(mask);
    }
    {
        /* 96 get_rows calls of 65536 ids each: 24 MiB of ids through the
         * ring, several wraps whatever size it has grown to */
        enum { CALLS = 96, T = 65536, ROWS = 1000, D = 4 };
        float tab[ROWS * D];
        kt_fill(&r, tab, ROWS * D, -5, 5);
        int32_t *ids = kt_xmalloc((size_t)CALLS * T * 4);
        for (size_t i = 0; i < (size_t)CALLS * T; i++)
            ids[i] = kt_below(&r, ROWS);
        void *tg = kt_dev(gpu, tab, sizeof tab);
        const size_t out_bytes = (size_t)CALLS * T * D * sizeof(float);
        uint8_t *nan = kt_xmalloc(out_bytes);
        memset(nan, 0xff, out_bytes);
        float *og = kt_dev(gpu, nan, out_bytes);
        free(nan);
        for (int c = 0; c < CALLS; c++)
            assert_int_equal(gpu->iface->get_rows(gpu, og + (size_t)c * T * D, tg, CAIRN_TYPE_F32,
                                                  D, ids + (size_t)c * T, T),
                             CAIRN_OK);
        float *g = kt_host(gpu, og, out_bytes);
        for (size_t i = 0; i < (size_t)CALLS * T; i++)
            if (memcmp(g + i * D, tab + (size_t)ids[i] * D, D * sizeof(float)) != 0)
                fail_msg("get_rows through a wrapping ring: call %zu, id %zu wrong", i / T, i % T);
        free(g);
        gpu->iface->free(gpu, tg);
        gpu->iface->free(gpu, og);
        free(ids);
    }
}

/* ---- element-wise and per-row ops -------------------------------------------- */

static void test_rmsnorm(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("rmsnorm");
    static const int Ds[] = {4096, 100, 1};
    for (size_t k = 0; k < 3; k++) {
        const int T = 5, D = Ds[k];
        float *x = kt_xmalloc((size_t)T * D * sizeof(float)), *w = kt_xmalloc((size_t)D * 4);
        kt_fill(&r, x, (size_t)T * D, -3, 3);
        kt_fill(&r, w, (size_t)D, -2, 2);
        pair_buf X = pair_new(x, (size_t)T * D * 4), Wb = pair_new(w, (size_t)D * 4);
        pair_buf O = pair_out((size_t)T * D * 4);
        assert_int_equal(cpu->iface->rmsnorm(cpu, O.c, X.c, Wb.c, T, D, 1e-5f), CAIRN_OK);
        assert_int_equal(gpu->iface->rmsnorm(gpu, O.g, X.g, Wb.g, T, D, 1e-5f), CAIRN_OK);
        /* in place as well */
        assert_int_equal(cpu->iface->rmsnorm(cpu, X.c, X.c, Wb.c, T, D, 1e-5f), CAIRN_OK);
        assert_int_equal(gpu->iface->rmsnorm(gpu, X.g, X.g, Wb.g, T, D, 1e-5f), CAIRN_OK);
        float *c, *g;
        pair_fetch(&O, &c, &g);
        expect_close(g, c, NULL, (size_t)T * D, 1e-5, 1e-6, "rmsnorm");
        free(c);
        free(g);
        pair_fetch(&X, &c, &g);
        expect_close(g, c, NULL, (size_t)T * D, 1e-5, 1e-6, "rmsnorm in place");
        free(c);
        free(g);
        pair_free(&X);
        pair_free(&Wb);
        pair_free(&O);
        free(x);
        free(w);
    }
}

static void check_rope(kt_rng *r, cairn_rope_mode mode, int n_rot, int with_factors,
                       float freq_scale)
{
    const int T = 7, n_heads = 3, hd = 64;
    const size_t n = (size_t)T * n_heads * hd;
    float *x = kt_xmalloc(n * 4), factors[32];
    kt_fill(r, x, n, -2, 2);
    for (int i = 0; i < 32; i++)
        factors[i] = kt_uniform(r, 1.0f, 8.0f);
    int32_t pos[7] = {0, 1, 2, 17, 511, 4095, 100000};
    pair_buf X = pair_new(x, n * 4), F = pair_new(factors, sizeof factors);
    cairn_rope_params pc = {n_rot, mode, 10000.0f, freq_scale, with_factors ? F.c : NULL};
    cairn_rope_params pg = pc;
    pg.freq_factors = with_factors ? F.g : NULL;
    assert_int_equal(cpu->iface->rope(cpu, X.c, T, n_heads, hd, pos, &pc), CAIRN_OK);
    assert_int_equal(gpu->iface->rope(gpu, X.g, T, n_heads, hd, pos, &pg), CAIRN_OK);
    float *c, *g;
    pair_fetch(&X, &c, &g);
    /* a rotated pair mixes two inputs: scale the bound by their size (2).
     * The largest position's angle (1e5 rad) costs a few ulp of reduction
     * on either side; 1e-5 of the magnitude covers it. */
    char what[64];
    snprintf(what, sizeof what, "rope mode %d n_rot %d factors %d", (int)mode, n_rot, with_factors);
    for (size_t i = 0; i < n; i++)
        KT_CLOSE(g[i], c[i], 4e-5, what, i);
    free(c);
    free(g);
    pair_free(&X);
    pair_free(&F);
    free(x);
}

static void test_rope(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("rope");
    check_rope(&r, CAIRN_ROPE_NORMAL, 64, 0, 1.0f);
    check_rope(&r, CAIRN_ROPE_NEOX, 64, 0, 1.0f);
    check_rope(&r, CAIRN_ROPE_NORMAL, 32, 1, 0.5f); /* partial rotation */
    check_rope(&r, CAIRN_ROPE_NEOX, 48, 1, 0.25f);
    /* edge rules */
    float x[8] = {0};
    pair_buf X = pair_new(x, sizeof x);
    int32_t pos[1] = {0};
    cairn_rope_params bad = {3, CAIRN_ROPE_NORMAL, 10000.0f, 1.0f, NULL};
    assert_int_equal(gpu->iface->rope(gpu, X.g, 1, 1, 8, pos, &bad), CAIRN_EINVAL);
    bad.n_rot = 16;
    assert_int_equal(gpu->iface->rope(gpu, X.g, 1, 1, 8, pos, &bad), CAIRN_EINVAL);
    pair_free(&X);
}

static void test_elementwise(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("elementwise");
    const int T = 3, n = 70001; /* odd: the tail matters */
    const size_t total = (size_t)T * n;
    float *a = kt_xmalloc(total * 4), *b = kt_xmalloc(total * 4), *bias = kt_xmalloc((size_t)n * 4);
    kt_fill(&r, a, total, -20, 20);
    kt_fill(&r, b, total, -3, 3);
    kt_fill(&r, bias, (size_t)n, -1, 1);
    pair_buf A = pair_new(a, total * 4), B = pair_new(b, total * 4), Bi = pair_new(bias, (size_t)n * 4);
    pair_buf O = pair_out(total * 4);

    assert_int_equal(cpu->iface->swiglu(cpu, O.c, A.c, B.c, total), CAIRN_OK);
    assert_int_equal(gpu->iface->swiglu(gpu, O.g, A.g, B.g, total), CAIRN_OK);
    pair_close(&O, total, 1e-5, 1e-6, "swiglu");

    assert_int_equal(cpu->iface->add(cpu, O.c, A.c, B.c, total), CAIRN_OK);
    assert_int_equal(gpu->iface->add(gpu, O.g, A.g, B.g, total), CAIRN_OK);
    pair_same(&O, total, "add");

    /* in place: y == a */
    assert_int_equal(cpu->iface->add(cpu, A.c, A.c, B.c, total), CAIRN_OK);
    assert_int_equal(gpu->iface->add(gpu, A.g, A.g, B.g, total), CAIRN_OK);
    assert_int_equal(cpu->iface->add_bias(cpu, A.c, Bi.c, T, n), CAIRN_OK);
    assert_int_equal(gpu->iface->add_bias(gpu, A.g, Bi.g, T, n), CAIRN_OK);
    pair_same(&A, total, "add in place + add_bias");

    /* swiglu in place (out == gate) */
    assert_int_equal(cpu->iface->swiglu(cpu, A.c, A.c, B.c, total), CAIRN_OK);
    assert_int_equal(gpu->iface->swiglu(gpu, A.g, A.g, B.g, total), CAIRN_OK);
    pair_close(&A, total, 1e-5, 1e-6, "swiglu in place");

    /* geglu, then in place (out == gate) */
    assert_int_equal(cpu->iface->geglu(cpu, O.c, A.c, B.c, total), CAIRN_OK);
    assert_int_equal(gpu->iface->geglu(gpu, O.g, A.g, B.g, total), CAIRN_OK);
    pair_close(&O, total, 1e-5, 1e-6, "geglu");
    assert_int_equal(cpu->iface->geglu(cpu, A.c, A.c, B.c, total), CAIRN_OK);
    assert_int_equal(gpu->iface->geglu(gpu, A.g, A.g, B.g, total), CAIRN_OK);
    pair_close(&A, total, 1e-5, 1e-6, "geglu in place");

    /* scale: one product per element on both sides (on B, whose copies are
     * still the same bytes; A's went through float ops that may round
     * differently) */
    assert_int_equal(cpu->iface->scale(cpu, B.c, 33.941125f, total), CAIRN_OK);
    assert_int_equal(gpu->iface->scale(gpu, B.g, 33.941125f, total), CAIRN_OK);
    pair_same(&B, total, "scale");
    assert_int_equal(gpu->iface->scale(gpu, A.g, 2.0f, 0), CAIRN_EINVAL);
    assert_int_equal(gpu->iface->scale(gpu, A.g, NAN, total), CAIRN_EINVAL);
    assert_int_equal(gpu->iface->geglu(gpu, O.g, A.g, B.g, 0), CAIRN_EINVAL);

    assert_int_equal(gpu->iface->add(gpu, O.g, A.g, B.g, 0), CAIRN_EINVAL);
    assert_int_equal(gpu->iface->add_bias(gpu, A.g, Bi.g, 0, n), CAIRN_EINVAL);

    /* add_rows_scaled: rows 2 and 0 of Y ([T][n], fresh on both sides) get w
     * times rows 0 and 1 of B (the same bytes on both sides: the experts'
     * outputs); one product and one add per element, which the device may
     * fuse: within an ulp of |w·b| (B is up to ~100 after the scale) */
    {
        float *y = kt_xmalloc(total * 4);
        kt_fill(&r, y, total, -1, 1);
        pair_buf Y = pair_new(y, total * 4);
        const int32_t rows[2] = {2, 0};
        const float w[2] = {0.625f, -1.5f};
        assert_int_equal(cpu->iface->add_rows_scaled(cpu, Y.c, B.c, rows, w, 2, n), CAIRN_OK);
        assert_int_equal(gpu->iface->add_rows_scaled(gpu, Y.g, B.g, rows, w, 2, n), CAIRN_OK);
        pair_close(&Y, total, 1e-6, 1e-4, "add_rows_scaled");
        const int32_t bad[1] = {-1};
        assert_int_equal(gpu->iface->add_rows_scaled(gpu, Y.g, B.g, bad, w, 1, n), CAIRN_EINVAL);
        assert_int_equal(gpu->iface->add_rows_scaled(gpu, Y.g, B.g, rows, w, 0, n), CAIRN_EINVAL);
        pair_free(&Y);
        free(y);
    }
    pair_free(&A);
    pair_free(&B);
    pair_free(&Bi);
    pair_free(&O);
    free(a);
    free(b);
    free(bias);
}

/* gpt-oss's clamped SwiGLU at its own constants (alpha 1.702, limit 7), on
 * gates and ups well past +-limit (both clamps, and the gate's missing
 * lower one), the boundaries themselves, and in place. The GPU is checked
 * against the definition (in double on the host) first, so the check says
 * something even where the CPU backend has no swiglu_clamped yet, then
 * against the CPU at swiglu's tolerance (expf's ulps). */
static void test_swiglu_clamped(void **state)
{
    (void)state;
    if (!gpu->iface->swiglu_clamped) {
        if (harness)
            KT_SKIP("swiglu_clamped: the stand-in CPU backend has no swiglu_clamped");
        fail_msg("the CUDA backend has no swiglu_clamped");
    }
    kt_rng r = kt_rng_for("swiglu clamped");
    const float alpha = 1.702f, limit = 7.0f;
    const size_t n = 70001; /* odd: the tail matters */
    float *a = kt_xmalloc(n * 4), *b = kt_xmalloc(n * 4);
    kt_fill(&r, a, n, -12, 12);
    kt_fill(&r, b, n, -12, 12);
    /* on and around the limits: (gate, up) */
    const float edge[][2] = {{7.0f, 7.0f},   {7.0001f, -7.0001f}, {-7.5f, -8.0f},
                             {-40.0f, 0.5f}, {30.0f, 30.0f},      {0.0f, -1.0f}};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) {
        a[i] = edge[i][0];
        b[i] = edge[i][1];
    }
    pair_buf A = pair_new(a, n * 4), B = pair_new(b, n * 4), O = pair_out(n * 4);

    assert_int_equal(gpu->iface->swiglu_clamped(gpu, O.g, A.g, B.g, n, alpha, limit), CAIRN_OK);
    {
        float *g = kt_host(gpu, O.g, n * 4);
        for (size_t i = 0; i < n; i++) {
            const double gi = a[i] < limit ? a[i] : limit;
            const double ui = b[i] < -limit ? -limit : b[i] > limit ? limit : b[i];
            const double want = gi / (1.0 + exp(-(double)alpha * gi)) * (ui + 1.0);
            KT_CLOSE(g[i], want, 1e-5 * fabs(want) + 1e-6, "swiglu_clamped vs its definition", i);
        }
        free(g);
    }
    assert_int_equal(gpu->iface->swiglu_clamped(gpu, O.g, A.g, B.g, 0, alpha, limit),
                     CAIRN_EINVAL);
    assert_int_equal(gpu->iface->swiglu_clamped(gpu, O.g, A.g, B.g, n, alpha, NAN), CAIRN_EINVAL);
    assert_int_equal(gpu->iface->swiglu_clamped(gpu, O.g, A.g, B.g, n, INFINITY, limit),
                     CAIRN_EINVAL);

    if (!cpu->iface->swiglu_clamped) {
        pair_free(&A);
        pair_free(&B);
        pair_free(&O);
        free(a);
        free(b);
        KT_SKIP("swiglu_clamped: the CPU backend has none to compare with (the GPU matched "
                "the definition)");
    }
    assert_int_equal(cpu->iface->swiglu_clamped(cpu, O.c, A.c, B.c, n, alpha, limit), CAIRN_OK);
    pair_close(&O, n, 1e-5, 1e-6, "swiglu_clamped");
    /* in place (out == gate) */
    assert_int_equal(cpu->iface->swiglu_clamped(cpu, A.c, A.c, B.c, n, alpha, limit), CAIRN_OK);
    assert_int_equal(gpu->iface->swiglu_clamped(gpu, A.g, A.g, B.g, n, alpha, limit), CAIRN_OK);
    pair_close(&A, n, 1e-5, 1e-6, "swiglu_clamped in place");
    pair_free(&A);
    pair_free(&B);
    pair_free(&O);
    free(a);
    free(b);
}

static void test_softmax(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("softmax");
    const int T = 4, n = 32003;
    float *x = kt_xmalloc((size_t)T * n * 4);
    kt_fill(&r, x, (size_t)T * n, -30, 30);
    for (int i = 0; i < n; i++) /* row 2: all -inf -> zeros */
        x[2 * n + i] = -INFINITY;
    for (int i = 0; i < n; i += 3) /* row 3: some -inf */
        x[3 * n + i] = -INFINITY;
    pair_buf X = pair_new(x, (size_t)T * n * 4);
    assert_int_equal(cpu->iface->softmax(cpu, X.c, T, n), CAIRN_OK);
    assert_int_equal(gpu->iface->softmax(gpu, X.g, T, n), CAIRN_OK);
    float *c, *g;
    pair_fetch(&X, &c, &g);
    expect_close(g, c, NULL, (size_t)T * n, 1e-5, 1e-9, "softmax");
    for (int i = 0; i < n; i++)
        assert_true(g[2 * n + i] == 0.0f);
    free(c);
    free(g);
    pair_free(&X);
    free(x);
}

/* ---- kv_store + attention ------------------------------------------------------ */

/* Five sequences in one call, their rows laid out in q / out in a different
 * order from the seqs array (so q_start is not the running sum of n_q):
 *   0: a prefill of 37 rows over 37 KV (causal, tile kernel);
 *   1: a decode row over 150 KV (row kernel);
 *   2: a tree of 6 rows over 45 KV with a mask, one row seeing nothing;
 *   3: a prefill of 20 rows after a cached prefix of 100 tokens: q_index
 *      100 .. 119 over 120 KV (the tile kernel not starting at 0);
 *   4: a single masked row over 30 KV (the row kernel with a mask). */
enum { ATT_S = 5 };
static const int att_n_kv[ATT_S] = {37, 150, 45, 120, 30}, att_n_q[ATT_S] = {37, 1, 6, 20, 1};
/* first row of each sequence in q / out: 3 first, then 0, 2, 4, 1 */
static const int att_q_start[ATT_S] = {20, 64, 57, 0, 63};
#define ATT_ROWS 65

/* The largest magnitude of a block's scale in either pool (Q8_0/Q4_0
 * blocks start with their half scale). */
static float block_scale_max(const uint8_t *a, const uint8_t *b, size_t blk)
{
    const float da = cairn_fp16_to_fp32((uint16_t)(a[blk] | (a[blk + 1] << 8)));
    const float db = cairn_fp16_to_fp32((uint16_t)(b[blk] | (b[blk + 1] << 8)));
    return fmaxf(fabsf(da), fabsf(db));
}

/* Two KV pools written from the same inputs by kv_store: for a rotation or
 * a quantized type they may differ where a rotated value rounds to the
 * other side of a code boundary (see the tolerances above). */
static void expect_kv_pools_close(const uint8_t *g, const uint8_t *c, size_t bytes,
                                  const cairn_kv_layout *L, const char *what)
{
    const cairn_type t = L->dtype;
    if (t != CAIRN_TYPE_Q8_0 && t != CAIRN_TYPE_Q4_0) {
        /* plain elements: the whole pool is one run of them */
        const size_t esz = t == CAIRN_TYPE_F32 ? 4 : 2, n = bytes / esz;
        float *fg = kt_xmalloc(n * 4), *fc = kt_xmalloc(n * 4);
        assert_int_equal(cairn_dequantize_row(t, g, fg, (int64_t)n), CAIRN_OK);
        assert_int_equal(cairn_dequantize_row(t, c, fc, (int64_t)n), CAIRN_OK);
        /* one rounding step of the stored type, on values of at most
         * sqrt(R) (inputs in [-1, 1]) */
        const float ulp = t == CAIRN_TYPE_F32 ? 1e-6f : t == CAIRN_TYPE_F16 ? 1e-3f : 8e-3f;
        for (size_t i = 0; i < n; i++)
            KT_CLOSE(fg[i], fc[i], ulp * fmaxf(1.0f, fabsf(fc[i])), what, i);
        free(fg);
        free(fc);
        return;
    }
    const size_t bb = t == CAIRN_TYPE_Q8_0 ? 34 : 18, nb = bytes / bb;
    size_t differ = 0;
    for (size_t i = 0; i < bytes; i++)
        differ += g[i] != c[i];
    if (differ > bytes / 1000 + 4)
        fail_msg("seed %llu: %s: %zu of %zu bytes differ", (unsigned long long)kt_seed, what,
                 differ, bytes);
    float vg[32], vc[32];
    const float steps = t == CAIRN_TYPE_Q8_0 ? 1.01f : 2.01f;
    for (size_t b = 0; b < nb; b++) {
        assert_int_equal(cairn_dequantize_row(t, g + b * bb, vg, 32), CAIRN_OK);
        assert_int_equal(cairn_dequantize_row(t, c + b * bb, vc, 32), CAIRN_OK);
        const float tol = steps * block_scale_max(g, c, b * bb) + 1e-7f;
        for (int j = 0; j < 32; j++)
            KT_CLOSE(vg[j], vc[j], tol, what, (long long)(b * 32 + (size_t)j));
    }
}

/* rotation: -1 keeps the layout's default (cairn_kv_layout_init's), else
 * it is set; window: the sliding window (0 = none); with_sinks: a sink
 * logit per query head (cairn_attn_args.sinks), one of them above every
 * score so that the sink sets the softmax's maximum. */
static void check_attention(kt_rng *r, cairn_type dtype, int n_kv_head, int group, int head_dim,
                            int page_size, int alias_out, int rotation, int window,
                            int with_sinks)
{
    cairn_kv_layout L;
    assert_int_equal(cairn_kv_layout_init(&L, 2, n_kv_head, head_dim, page_size, dtype), CAIRN_OK);
    if (rotation >= 0)
        L.rotation = rotation;
    assert_true(cairn_kv_layout_valid(&L));
    const int n_head = n_kv_head * group, layer = 1;
    int n_pages = 3; /* a few never used */
    for (int s = 0; s < ATT_S; s++)
        n_pages += (att_n_kv[s] + page_size - 1) / page_size;
    int32_t *perm = kt_xmalloc((size_t)n_pages * sizeof(int32_t));
    kt_permutation(r, perm, n_pages); /* scattered pages, none shared */
    int32_t *pages[ATT_S];
    int used = 0;
    for (int s = 0; s < ATT_S; s++) {
        pages[s] = perm + used;
        used += (att_n_kv[s] + page_size - 1) / page_size;
    }
    /* Every KV entry of each sequence written with kv_store, in a few calls
     * of different sizes. */
    pair_buf pool = pair_new(NULL, (size_t)n_pages * L.page_bytes);
    const int width = n_kv_head * head_dim;
    for (int s = 0; s < ATT_S; s++) {
        for (int j0 = 0; j0 < att_n_kv[s];) {
            int T = 1 + kt_below(r, 40);
            if (T > att_n_kv[s] - j0)
                T = att_n_kv[s] - j0;
            float *k = kt_xmalloc((size_t)T * width * 4), *v = kt_xmalloc((size_t)T * width * 4);
            kt_fill(r, k, (size_t)T * width, -1, 1);
            kt_fill(r, v, (size_t)T * width, -1, 1);
            int32_t *slots = kt_xmalloc((size_t)T * 4);
            for (int t = 0; t < T; t++)
                slots[t] = pages[s][(j0 + t) / page_size] * page_size + (j0 + t) % page_size;
            pair_buf K = pair_new(k, (size_t)T * width * 4), V = pair_new(v, (size_t)T * width * 4);
            assert_int_equal(cpu->iface->kv_store(cpu, pool.c, &L, layer, K.c, V.c, slots, T), CAIRN_OK);
            assert_int_equal(gpu->iface->kv_store(gpu, pool.g, &L, layer, K.g, V.g, slots, T), CAIRN_OK);
            pair_free(&K);
            pair_free(&V);
            free(k);
            free(v);
            free(slots);
            j0 += T;
        }
    }
    {
        uint8_t *c = kt_host(cpu, pool.c, pool.bytes), *g = kt_host(gpu, pool.g, pool.bytes);
        if ((dtype == CAIRN_TYPE_F32 || dtype == CAIRN_TYPE_F16 || dtype == CAIRN_TYPE_BF16) &&
            L.rotation == 0) {
            KT_SAME_BYTES(g, c, pool.bytes, "kv_store pool");
        } else {
            char what[96];
            snprintf(what, sizeof what, "kv_store pool %s rotation %d", cairn_kv_type_name(dtype),
                     L.rotation);
            expect_kv_pools_close(g, c, pool.bytes, &L, what);
            /* attention below reads the very same bytes on both sides */
            assert_int_equal(gpu->iface->upload(gpu, pool.g, c, pool.bytes), CAIRN_OK);
        }
        free(c);
        free(g);
    }

    const size_t row_width = (size_t)n_head * head_dim, qn = (size_t)ATT_ROWS * row_width;
    float *q = kt_xmalloc(qn * 4);
    kt_fill(r, q, qn, -1.5f, 1.5f);
    int32_t qidx0[37], qidx1[1] = {149}, qidx3[20];
    for (int i = 0; i < 37; i++)
        qidx0[i] = i;
    for (int i = 0; i < 20; i++)
        qidx3[i] = 100 + i;
    uint8_t mask2[6 * 45], mask4[30];
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 45; j++)
            mask2[i * 45 + j] = i == 4 ? 0 : (j < 40 || kt_below(r, 2));
    for (int j = 0; j < 30; j++)
        mask4[j] = (uint8_t)(j % 3 != 1);
    /* the masked sequences' KV indices: only a window reads them */
    int32_t qidx2[6], qidx4[1] = {29};
    for (int i = 0; i < 6; i++)
        qidx2[i] = 39 + i;
    const int32_t *qidx[ATT_S] = {qidx0, qidx1, window > 0 ? qidx2 : NULL, qidx3,
                                  window > 0 ? qidx4 : NULL};
    const uint8_t *masks[ATT_S] = {NULL, NULL, mask2, NULL, mask4};
    cairn_attn_seq seqs[ATT_S];
    for (int s = 0; s < ATT_S; s++)
        seqs[s] = (cairn_attn_seq){att_q_start[s], att_n_q[s], att_n_kv[s], qidx[s], pages[s],
                                   masks[s]};
    /* sinks [n_head]: scores here are about +-1 (at most 1.5 sqrt(head_dim)),
     * so the last head's 8 dominates them and the others, in [-3, 3], sit
     * among them; the same bytes in each backend's memory (host memory for
     * the CPU) */
    pair_buf S = {NULL, NULL, 0};
    if (with_sinks) {
        float *sinks = kt_xmalloc((size_t)n_head * 4);
        kt_fill(r, sinks, (size_t)n_head, -3.0f, 3.0f);
        sinks[n_head - 1] = 8.0f;
        S = pair_new(sinks, (size_t)n_head * 4);
        free(sinks);
    }
    pair_buf Q = pair_new(q, qn * 4), O = pair_out(qn * 4);
    cairn_attn_args a = {O.c, Q.c, pool.c, &L, layer, n_head, 1.0f / sqrtf((float)head_dim),
                         ATT_S, seqs, window, NULL};
    if (alias_out)
        a.out = Q.c;
    a.sinks = (const float *)S.c;
    assert_int_equal(cpu->iface->attention(cpu, &a), CAIRN_OK);
    a.out = alias_out ? Q.g : O.g;
    a.q = Q.g;
    a.kv_pool = pool.g;
    a.sinks = (const float *)S.g;
    assert_int_equal(gpu->iface->attention(gpu, &a), CAIRN_OK);
    float *c, *g;
    pair_fetch(alias_out ? &Q : &O, &c, &g);
    char what[112];
    snprintf(what, sizeof what,
             "attention %s rot %d win %d kvh %d group %d hd %d ps %d alias %d sinks %d",
             cairn_kv_type_name(dtype), L.rotation, window, n_kv_head, group, head_dim, page_size,
             alias_out, with_sinks);
    /* outputs are convex combinations of V entries in [-1, 1] (quantized:
     * about that), rotated back; with a sink the weights sum to less than 1 */
    const double tol = L.rotation ? 5e-5 : 2e-5;
    for (size_t i = 0; i < qn; i++)
        KT_CLOSE(g[i], c[i], tol, what, i);
    /* the masked-out row is zeros (a sink changes nothing there) */
    for (size_t d = 0; d < row_width; d++)
        assert_true(g[(size_t)(att_q_start[2] + 4) * row_width + d] == 0.0f);
    free(c);
    free(g);

    /* edge rules: q_index beyond n_kv */
    int32_t bad_q[1] = {150};
    cairn_attn_seq bad = {att_q_start[1], 1, 150, bad_q, pages[1], NULL};
    a.n_seqs = 1;
    a.seqs = &bad;
    assert_int_equal(gpu->iface->attention(gpu, &a), CAIRN_EINVAL);

    pair_free(&Q);
    pair_free(&O);
    if (with_sinks)
        pair_free(&S);
    pair_free(&pool);
    free(q);
    free(perm);
}

static void test_attention(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("attention");
    check_attention(&r, CAIRN_TYPE_F32, 2, 2, 64, 16, 0, -1, 0, 0);
    check_attention(&r, CAIRN_TYPE_F16, 2, 4, 128, 16, 0, -1, 0, 0);
    check_attention(&r, CAIRN_TYPE_F16, 1, 3, 40, 7, 1, -1, 0, 0);   /* odd sizes, out == q */
    check_attention(&r, CAIRN_TYPE_F32, 4, 1, 256, 32, 0, -1, 0, 0); /* no GQA, wide heads */
    check_attention(&r, CAIRN_TYPE_F16, 2, 2, 8, 4, 0, -1, 0, 0);    /* stories260K's head */
    check_attention(&r, CAIRN_TYPE_F16, 1, 2, 512, 16, 0, -1, 0, 0); /* the widest head: 4 dims a thread */
}

/* Each KV type in the layout's default rotation (none for the plain types,
 * the largest power of two dividing head_dim for Q8_0/Q4_0), a rotation on
 * a plain type and a shorter one on a quantized type; both kernels (the
 * sequences above have prefills, decode rows and masks) and head sizes on
 * either side of the tiled kernel's limit (128). */
static void test_attention_kv_types(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("attention kv types");
    check_attention(&r, CAIRN_TYPE_BF16, 2, 2, 64, 16, 0, -1, 0, 0);
    check_attention(&r, CAIRN_TYPE_Q8_0, 2, 2, 64, 16, 0, -1, 0, 0);  /* R = 64 */
    check_attention(&r, CAIRN_TYPE_Q4_0, 2, 4, 128, 16, 0, -1, 0, 0); /* R = 128 */
    check_attention(&r, CAIRN_TYPE_Q8_0, 1, 3, 96, 7, 1, -1, 0, 0);   /* R = 32, out == q */
    check_attention(&r, CAIRN_TYPE_Q4_0, 2, 2, 256, 32, 0, -1, 0, 0); /* row kernel only */
    check_attention(&r, CAIRN_TYPE_Q8_0, 2, 2, 64, 16, 0, 0, 0, 0);   /* unrotated */
    check_attention(&r, CAIRN_TYPE_Q4_0, 2, 2, 64, 16, 0, 8, 0, 0);   /* R shorter than a block */
    check_attention(&r, CAIRN_TYPE_F32, 2, 2, 64, 16, 0, 16, 0, 0);   /* a rotated plain type */
    check_attention(&r, CAIRN_TYPE_F16, 1, 2, 512, 16, 0, 512, 0, 0); /* the widest head and run */
}

/* Sliding windows: 1 (a row sees only its own key), windows shorter than a
 * key tile and than the prefill rows, one that cuts into the cached prefix
 * of sequence 3, and one longer than every sequence (as no window), over
 * several KV types; the masked sequences take the window besides the mask. */
static void test_attention_windows(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("attention windows");
    check_attention(&r, CAIRN_TYPE_F32, 2, 2, 64, 16, 0, -1, 1, 0);
    check_attention(&r, CAIRN_TYPE_F16, 2, 4, 128, 16, 0, -1, 7, 0);
    check_attention(&r, CAIRN_TYPE_F16, 1, 3, 40, 7, 1, -1, 40, 0);
    check_attention(&r, CAIRN_TYPE_Q8_0, 2, 2, 64, 16, 0, -1, 33, 0);
    check_attention(&r, CAIRN_TYPE_Q4_0, 2, 2, 256, 32, 0, -1, 100, 0);
    check_attention(&r, CAIRN_TYPE_BF16, 2, 2, 64, 16, 0, -1, 1000, 0);
}

/* Kernels launched so far under `kernel` (0 in the harness, which has none):
 * what shows that a case reached the path it is about. */
static uint64_t gpu_launches(const char *kernel)
{
    uint64_t n = 0;
    if (!harness)
        assert_int_equal(cairn_backend_cuda_launches(gpu, kernel, &n), CAIRN_OK);
    return n;
}

/* Attention sinks (gpt-oss: a logit per query head in every softmax's
 * denominator) through the row and tiled kernels: the five sequences above
 * (prefills on the tiled kernel for heads up to 128, decode and masked rows
 * on the row kernel, a row that sees nothing), plain and rotated KV, GQA
 * and not, out over q, a window, and the row kernel's prefills (a head
 * above 128). The split path's sinks are in test_attention_split. */
static void test_attention_sinks(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("attention sinks");
    const uint64_t tiles0 = gpu_launches("attention_tile"), rows0 = gpu_launches("attention");
    check_attention(&r, CAIRN_TYPE_F32, 2, 2, 64, 16, 0, -1, 0, 1);
    check_attention(&r, CAIRN_TYPE_F16, 2, 4, 128, 16, 0, -1, 0, 1);
    check_attention(&r, CAIRN_TYPE_F16, 1, 3, 40, 7, 1, -1, 0, 1);   /* out == q */
    check_attention(&r, CAIRN_TYPE_Q8_0, 2, 2, 64, 16, 0, -1, 0, 1);  /* rotated back after */
    check_attention(&r, CAIRN_TYPE_F16, 2, 4, 128, 16, 0, -1, 7, 1);  /* a window */
    check_attention(&r, CAIRN_TYPE_F32, 4, 1, 256, 32, 0, -1, 0, 1);  /* row kernel only */
    check_attention(&r, CAIRN_TYPE_Q4_0, 2, 2, 256, 32, 0, -1, 0, 1); /* rotated, row kernel */
    if (!harness &&
        (gpu_launches("attention_tile") == tiles0 || gpu_launches("attention") == rows0))
        fail_msg("attention sinks: the tiled or the row kernel never ran");
}

/* ---- split-KV decode ---------------------------------------------------------- */

/* Decode rows with more than 1024 visible keys take the CUDA backend's
 * split path (kernels/cuda/cuda_attention.cu: 256-key chunks over every
 * query head of a GQA slice, merged in chunk order by a second kernel).
 * Four sequences in one call:
 *   0: a decode row over 4100 KV (17 chunks, the last of 4 keys), the row
 *      the batch checks follow;
 *   1: a decode row over 1500 KV (6 chunks, also split);
 *   2: a decode row over 200 KV (the row kernel);
 *   3: a prefill of 24 rows ending at 3001 KV (the tiled kernel, or the row
 *      kernel for heads above 128).
 * Compared with the CPU at the attention tolerance above. Then the batch
 * rule: sequence 0 alone (q_start 0, its own buffers), and with two others
 * of different lengths in another order, must give the very bits it gave
 * in the four-sequence call. */
enum { SPL_S = 4, SPL_ROWS = 27 };
static const int spl_n_kv[SPL_S] = {4100, 1500, 200, 3001}, spl_n_q[SPL_S] = {1, 1, 1, 24};
static const int spl_q_start[SPL_S] = {26, 0, 25, 1};

/* The GPU's attention of `n` sequences (their q rows at q_start in q, n_rows
 * rows) over pool_g: the output rows, on the host (out over q with alias). */
static float *split_run_gpu(const cairn_kv_layout *L, int n_head, void *pool_g, const float *q,
                            int n_rows, const cairn_attn_seq *seqs, int n, int window,
                            int alias_out, const float *sinks_g)
{
    const size_t bytes = (size_t)n_rows * n_head * L->head_dim * 4;
    void *Q = kt_dev(gpu, q, bytes), *O = NULL;
    if (!alias_out) {
        uint8_t *nan = kt_xmalloc(bytes);
        memset(nan, 0xff, bytes);
        O = kt_dev(gpu, nan, bytes);
        free(nan);
    }
    cairn_attn_args a = {alias_out ? Q : O, Q, pool_g, L, 1, n_head,
                         1.0f / sqrtf((float)L->head_dim), n, seqs, window, sinks_g};
    assert_int_equal(gpu->iface->attention(gpu, &a), CAIRN_OK);
    float *out = kt_host(gpu, alias_out ? Q : O, bytes);
    gpu->iface->free(gpu, Q);
    if (O)
        gpu->iface->free(gpu, O);
    return out;
}

/* with_sinks: a sink per query head (as in check_attention), which the
 * split path adds once, when it merges the chunks. */
static void check_attention_split(kt_rng *r, cairn_type dtype, int n_kv_head, int group,
                                  int head_dim, int page_size, int window, int alias_out,
                                  int with_sinks)
{
    cairn_kv_layout L;
    assert_int_equal(cairn_kv_layout_init(&L, 2, n_kv_head, head_dim, page_size, dtype), CAIRN_OK);
    const int n_head = n_kv_head * group, layer = 1;
    int n_pages = 2;
    for (int s = 0; s < SPL_S; s++)
        n_pages += (spl_n_kv[s] + page_size - 1) / page_size;
    int32_t *perm = kt_xmalloc((size_t)n_pages * sizeof(int32_t));
    kt_permutation(r, perm, n_pages); /* scattered pages, none shared */
    int32_t *pages[SPL_S];
    int used = 0;
    for (int s = 0; s < SPL_S; s++) {
        pages[s] = perm + used;
        used += (spl_n_kv[s] + page_size - 1) / page_size;
    }
    /* the KV written by the CPU's kv_store, and the same bytes sent to the
     * GPU's pool (kv_store itself is compared above) */
    const size_t pool_bytes = (size_t)n_pages * L.page_bytes;
    void *pool_c = kt_dev(cpu, NULL, pool_bytes), *pool_g = kt_dev(gpu, NULL, pool_bytes);
    const int width = n_kv_head * head_dim;
    for (int s = 0; s < SPL_S; s++) {
        for (int j0 = 0; j0 < spl_n_kv[s]; j0 += 512) {
            const int T = spl_n_kv[s] - j0 < 512 ? spl_n_kv[s] - j0 : 512;
            float *k = kt_xmalloc((size_t)T * width * 4), *v = kt_xmalloc((size_t)T * width * 4);
            kt_fill(r, k, (size_t)T * width, -1, 1);
            kt_fill(r, v, (size_t)T * width, -1, 1);
            int32_t *slots = kt_xmalloc((size_t)T * 4);
            for (int t = 0; t < T; t++)
                slots[t] = pages[s][(j0 + t) / page_size] * page_size + (j0 + t) % page_size;
            void *K = kt_dev(cpu, k, (size_t)T * width * 4), *V = kt_dev(cpu, v, (size_t)T * width * 4);
            assert_int_equal(cpu->iface->kv_store(cpu, pool_c, &L, layer, K, V, slots, T), CAIRN_OK);
            cpu->iface->free(cpu, K);
            cpu->iface->free(cpu, V);
            free(k);
            free(v);
            free(slots);
        }
    }
    {
        uint8_t *c = kt_host(cpu, pool_c, pool_bytes);
        assert_int_equal(gpu->iface->upload(gpu, pool_g, c, pool_bytes), CAIRN_OK);
        free(c);
    }

    const size_t row_width = (size_t)n_head * head_dim, qn = (size_t)SPL_ROWS * row_width;
    float *q = kt_xmalloc(qn * 4);
    /* a wider spread than the other cases: sharper softmaxes, whose
     * maximum moves from chunk to chunk */
    kt_fill(r, q, qn, -4.0f, 4.0f);
    int32_t qi0[1] = {spl_n_kv[0] - 1}, qi1[1] = {spl_n_kv[1] - 1}, qi2[1] = {spl_n_kv[2] - 1};
    int32_t qi3[24];
    for (int i = 0; i < 24; i++)
        qi3[i] = spl_n_kv[3] - 24 + i;
    const int32_t *qidx[SPL_S] = {qi0, qi1, qi2, qi3};
    cairn_attn_seq seqs[SPL_S];
    for (int s = 0; s < SPL_S; s++)
        seqs[s] = (cairn_attn_seq){spl_q_start[s], spl_n_q[s], spl_n_kv[s], qidx[s], pages[s], NULL};

    /* sinks [n_head]: among the sharper scores here (q in +-4) and, for the
     * last head, above them; host memory for the CPU, a copy for the GPU */
    float *sinks = NULL, *sinks_c = NULL, *sinks_g = NULL;
    if (with_sinks) {
        sinks = kt_xmalloc((size_t)n_head * 4);
        kt_fill(r, sinks, (size_t)n_head, -3.0f, 3.0f);
        sinks[n_head - 1] = 12.0f;
        sinks_c = kt_dev(cpu, sinks, (size_t)n_head * 4);
        sinks_g = kt_dev(gpu, sinks, (size_t)n_head * 4);
    }

    /* the CPU reference */
    void *Qc = kt_dev(cpu, q, qn * 4), *Oc = NULL;
    if (!alias_out) {
        uint8_t *nan = kt_xmalloc(qn * 4);
        memset(nan, 0xff, qn * 4);
        Oc = kt_dev(cpu, nan, qn * 4);
        free(nan);
    }
    cairn_attn_args a = {alias_out ? Qc : Oc, Qc, pool_c, &L, layer, n_head,
                         1.0f / sqrtf((float)head_dim), SPL_S, seqs, window, sinks_c};
    assert_int_equal(cpu->iface->attention(cpu, &a), CAIRN_OK);
    float *c = kt_host(cpu, alias_out ? Qc : Oc, qn * 4);
    float *g = split_run_gpu(&L, n_head, pool_g, q, SPL_ROWS, seqs, SPL_S, window, alias_out,
                             sinks_g);
    char what[128];
    snprintf(what, sizeof what,
             "split attention %s rot %d win %d kvh %d group %d hd %d ps %d alias %d sinks %d",
             cairn_kv_type_name(dtype), L.rotation, window, n_kv_head, group, head_dim, page_size,
             alias_out, with_sinks);
    const double tol = L.rotation ? 5e-5 : 2e-5;
    for (size_t i = 0; i < qn; i++)
        KT_CLOSE(g[i], c[i], tol, what, i);

    /* the batch rule, for sequence 0's row */
    const float *row0 = g + (size_t)spl_q_start[0] * row_width;
    cairn_attn_seq alone = seqs[0];
    alone.q_start = 0;
    float *g1 = split_run_gpu(&L, n_head, pool_g, q + (size_t)spl_q_start[0] * row_width, 1,
                              &alone, 1, window, alias_out, sinks_g);
    snprintf(what, sizeof what, "split attention %s win %d: a row alone vs in a batch of 4",
             cairn_kv_type_name(dtype), window);
    KT_SAME_BYTES(g1, row0, row_width * 4, what);
    /* rows: 0 = sequence 2's, 1 = sequence 0's, 2 = sequence 1's */
    float *q3 = kt_xmalloc(3 * row_width * 4);
    memcpy(q3, q + (size_t)spl_q_start[2] * row_width, row_width * 4);
    memcpy(q3 + row_width, q + (size_t)spl_q_start[0] * row_width, row_width * 4);
    memcpy(q3 + 2 * row_width, q + (size_t)spl_q_start[1] * row_width, row_width * 4);
    cairn_attn_seq three[3] = {seqs[2], seqs[0], seqs[1]};
    for (int s = 0; s < 3; s++)
        three[s].q_start = s;
    float *g3 = split_run_gpu(&L, n_head, pool_g, q3, 3, three, 3, window, alias_out, sinks_g);
    snprintf(what, sizeof what, "split attention %s win %d: a row with 2 others vs in a batch of 4",
             cairn_kv_type_name(dtype), window);
    KT_SAME_BYTES(g3 + row_width, row0, row_width * 4, what);

    free(g3);
    free(q3);
    free(g1);
    free(g);
    free(c);
    cpu->iface->free(cpu, Qc);
    if (Oc)
        cpu->iface->free(cpu, Oc);
    cpu->iface->free(cpu, pool_c);
    gpu->iface->free(gpu, pool_g);
    if (with_sinks) {
        cpu->iface->free(cpu, sinks_c);
        gpu->iface->free(gpu, sinks_g);
        free(sinks);
    }
    free(q);
    free(perm);
}

/* Each KV type at GQA 4:1 (the layout's default rotation: none for the
 * plain types, R = 128 or 64 for Q8_0/Q4_0), the Llama-3-8B head, pages
 * that are not a power of two, a group of 12 (a slice of 8 query heads and
 * one of 4), the widest head, windows (one starting mid-chunk and mid-page,
 * one just above the threshold: 1025 keys, the last chunk a single key),
 * and out over q. */
static void test_attention_split(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("attention split");
    /* On a GPU this must run the split path, or it proves nothing about it:
     * the path off in the environment, or its scratch refused (the logged
     * fallback), would send every row to the row kernel and still pass. So
     * each case must launch the split kernel: once per GPU call below (the
     * batch, the row alone, the row with two others), each with a row of
     * more than 1,024 visible keys. */
    const char *off = getenv("CAIRN_CUDA_SPLIT_ATTN");
    if (!harness && off && strcmp(off, "0") == 0)
        fail_msg("CAIRN_CUDA_SPLIT_ATTN=0 is set: the split path is off and this test would "
                 "check the row kernel instead; unset it");
#define SPLIT_CASE(...)                                                                            \
    do {                                                                                           \
        uint64_t before_ = 0, after_ = 0;                                                          \
        const int have_ = cairn_backend_cuda_launches(gpu, "attention_split", &before_);           \
        check_attention_split(&r, __VA_ARGS__);                                                    \
        if (!harness) {                                                                            \
            assert_int_equal(have_, CAIRN_OK);                                                     \
            assert_int_equal(cairn_backend_cuda_launches(gpu, "attention_split", &after_),         \
                             CAIRN_OK);                                                            \
            if (after_ - before_ < 3)                                                              \
                fail_msg("split attention (%s): %llu split launches for 3 calls; the row "         \
                         "kernel took the long rows",                                              \
                         #__VA_ARGS__, (unsigned long long)(after_ - before_));                    \
        }                                                                                          \
    } while (0)
    SPLIT_CASE(CAIRN_TYPE_F32, 2, 4, 64, 64, 0, 0, 0);
    SPLIT_CASE(CAIRN_TYPE_F16, 2, 4, 128, 16, 0, 0, 0);
    SPLIT_CASE(CAIRN_TYPE_BF16, 2, 4, 64, 48, 0, 0, 0);
    SPLIT_CASE(CAIRN_TYPE_Q8_0, 2, 4, 128, 64, 0, 0, 0);
    SPLIT_CASE(CAIRN_TYPE_Q4_0, 2, 4, 64, 32, 0, 0, 0);
    SPLIT_CASE(CAIRN_TYPE_F16, 1, 12, 64, 100, 0, 1, 0);
    SPLIT_CASE(CAIRN_TYPE_F16, 1, 2, 512, 16, 0, 0, 0);
    SPLIT_CASE(CAIRN_TYPE_Q8_0, 2, 4, 96, 64, 2000, 0, 0);
    SPLIT_CASE(CAIRN_TYPE_F16, 2, 4, 64, 64, 1025, 1, 0);
    /* attention sinks (gpt-oss), joined in the combine: plain, rotated
     * (the combine rotates back after the sink), out over q with a slice of
     * 8 heads and one of 4, and a window */
    SPLIT_CASE(CAIRN_TYPE_F16, 2, 4, 128, 16, 0, 0, 1);
    SPLIT_CASE(CAIRN_TYPE_Q8_0, 2, 4, 128, 64, 0, 0, 1);
    SPLIT_CASE(CAIRN_TYPE_F16, 1, 12, 64, 100, 0, 1, 1);
    SPLIT_CASE(CAIRN_TYPE_BF16, 2, 4, 64, 48, 2000, 0, 1);
#undef SPLIT_CASE
}

/* kv_store's rotation on its own, against the definition rather than the
 * CPU backend: H_R[a][b] = (-1)^popcount(a & b) / sqrt(R), applied on the
 * host in double to each run of R elements; F32 pages must hold that
 * within float rounding, and Q8_0/Q4_0 pages the blocks common/quant.c
 * makes of the host-rotated values (up to the boundary cases above). */
/* ---- verification rows give a decode row's bits ---------------------------------- */

/* A speculative tree of VT_N nodes after a prefix of P keys: node x's
 * parent, and its path from the root (x last). */
#define VT_N 6
static const int vt_parent[VT_N] = {-1, 0, 0, 1, 2, 3};

static int vt_path(int x, int path[VT_N])
{
    int n = 0, rev[VT_N];
    for (int y = x; y >= 0; y = vt_parent[y])
        rev[n++] = y;
    for (int i = 0; i < n; i++)
        path[i] = rev[n - 1 - i];
    return n;
}

/* Writes keys/values [T][width] at KV indices 0..T-1 of a sequence. */
static void vt_store(const cairn_kv_layout *L, void *pool_c, int layer, const int32_t *pages,
                     const float *k, const float *v, int T)
{
    const size_t width = (size_t)L->n_kv_head * L->head_dim;
    int32_t *slots = kt_xmalloc((size_t)T * 4);
    for (int t = 0; t < T; t++)
        slots[t] = pages[t / L->page_size] * L->page_size + t % L->page_size;
    void *K = kt_dev(cpu, k, (size_t)T * width * 4), *V = kt_dev(cpu, v, (size_t)T * width * 4);
    assert_int_equal(cpu->iface->kv_store(cpu, pool_c, L, layer, K, V, slots, T), CAIRN_OK);
    cpu->iface->free(cpu, K);
    cpu->iface->free(cpu, V);
    free(slots);
}

/* Every row of a verification tree (a masked sequence: its prefix, its
 * ancestors and itself visible, the ancestors at tree slots) against the
 * same query decoded plainly over a cache that holds the accepted path at
 * consecutive indices: the same bits (speculation is lossless only so),
 * with P keys before the tree on the row kernel (P < 1024) and on the split
 * path (P > 1024). */
static void check_verify_rows(kt_rng *r, cairn_type dtype, int P, int window)
{
    cairn_kv_layout L;
    const int n_kv_head = 2, group = 4, head_dim = 64, page_size = 16, layer = 1;
    assert_int_equal(cairn_kv_layout_init(&L, 2, n_kv_head, head_dim, page_size, dtype), CAIRN_OK);
    const int n_head = n_kv_head * group, n_tree = P + VT_N;
    const int tree_pages = (n_tree + page_size - 1) / page_size;
    const int path_pages = (P + VT_N + page_size - 1) / page_size;
    const int n_pages = tree_pages + VT_N * path_pages;
    int32_t *perm = kt_xmalloc((size_t)n_pages * sizeof(int32_t));
    kt_permutation(r, perm, n_pages);
    const size_t pool_bytes = (size_t)n_pages * L.page_bytes;
    void *pool_c = kt_dev(cpu, NULL, pool_bytes), *pool_g = kt_dev(gpu, NULL, pool_bytes);
    const size_t width = (size_t)n_kv_head * head_dim;
    float *k = kt_xmalloc((size_t)n_tree * width * 4), *v = kt_xmalloc((size_t)n_tree * width * 4);
    kt_fill(r, k, (size_t)n_tree * width, -1, 1);
    kt_fill(r, v, (size_t)n_tree * width, -1, 1);
    vt_store(&L, pool_c, layer, perm, k, v, n_tree);
    /* sequence 1 + x: the prefix, then node x's path at consecutive indices */
    float *kp = kt_xmalloc((size_t)(P + VT_N) * width * 4);
    float *vp = kt_xmalloc((size_t)(P + VT_N) * width * 4);
    int path[VT_N][VT_N], depth[VT_N];
    for (int x = 0; x < VT_N; x++) {
        depth[x] = vt_path(x, path[x]);
        memcpy(kp, k, (size_t)P * width * 4);
        memcpy(vp, v, (size_t)P * width * 4);
        for (int i = 0; i < depth[x]; i++) {
            memcpy(kp + (size_t)(P + i) * width, k + (size_t)(P + path[x][i]) * width, width * 4);
            memcpy(vp + (size_t)(P + i) * width, v + (size_t)(P + path[x][i]) * width, width * 4);
        }
        vt_store(&L, pool_c, layer, perm + tree_pages + x * path_pages, kp, vp, P + depth[x]);
    }
    {
        uint8_t *c = kt_host(cpu, pool_c, pool_bytes);
        assert_int_equal(gpu->iface->upload(gpu, pool_g, c, pool_bytes), CAIRN_OK);
        free(c);
    }
    const size_t row_width = (size_t)n_head * head_dim;
    float *q = kt_xmalloc((size_t)VT_N * row_width * 4);
    kt_fill(r, q, (size_t)VT_N * row_width, -4.0f, 4.0f);
    /* the tree: all VT_N rows in one masked sequence */
    uint8_t *mask = kt_xmalloc((size_t)VT_N * n_tree);
    int32_t qidx[VT_N];
    for (int x = 0; x < VT_N; x++) {
        memset(mask + (size_t)x * n_tree, 1, (size_t)P);
        for (int i = 0; i < depth[x]; i++)
            mask[(size_t)x * n_tree + P + path[x][i]] = 1;
        qidx[x] = P + x;
    }
    cairn_attn_seq tree = {0, VT_N, n_tree, qidx, perm, mask};
    float *gt = split_run_gpu(&L, n_head, pool_g, q, VT_N, &tree, 1, window, 0, NULL);
    for (int x = 0; x < VT_N; x++) {
        int32_t qi[1] = {P + depth[x] - 1};
        cairn_attn_seq plain = {0, 1, P + depth[x], qi, perm + tree_pages + x * path_pages, NULL};
        float *gp = split_run_gpu(&L, n_head, pool_g, q + (size_t)x * row_width, 1, &plain, 1,
                                  window, 0, NULL);
        char what[128];
        snprintf(what, sizeof what,
                 "%s, %d keys before the tree, window %d: tree row %d (depth %d) vs the same "
                 "token decoded",
                 cairn_kv_type_name(dtype), P, window, x, depth[x]);
        KT_SAME_BYTES(gt + (size_t)x * row_width, gp, row_width * 4, what);
        free(gp);
    }
    free(gt);
    free(q);
    free(mask);
    free(kp);
    free(vp);
    free(k);
    free(v);
    cpu->iface->free(cpu, pool_c);
    gpu->iface->free(gpu, pool_g);
    free(perm);
}

static void test_attention_verify_rows(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("attention verify rows");
    check_verify_rows(&r, CAIRN_TYPE_F16, 100, 0);  /* the row kernel */
    check_verify_rows(&r, CAIRN_TYPE_F16, 58, 0);   /* the tree across a 64-key tile */
    check_verify_rows(&r, CAIRN_TYPE_Q8_0, 1500, 0); /* the split path, rotated keys */
    check_verify_rows(&r, CAIRN_TYPE_F16, 1100, 0);  /* the split path's last chunk short */
    /* No windows: a tree row's window is counted from its slot (q_index),
     * a decoded token's from its position, on the CPU as here; sliding-
     * window models are refused today, and their speculation must count
     * from the position when they come. */
}

static void check_kv_rotation(kt_rng *r, cairn_type dtype, int n_kv_head, int head_dim, int R)
{
    cairn_kv_layout L;
    const int page_size = 4, T = 6;
    assert_int_equal(cairn_kv_layout_init(&L, 1, n_kv_head, head_dim, page_size, dtype), CAIRN_OK);
    L.rotation = R;
    assert_true(cairn_kv_layout_valid(&L));
    const int n_pages = 3, width = n_kv_head * head_dim;
    float *k = kt_xmalloc((size_t)T * width * 4), *v = kt_xmalloc((size_t)T * width * 4);
    kt_fill(r, k, (size_t)T * width, -1, 1);
    kt_fill(r, v, (size_t)T * width, -1, 1);
    for (int t = 0; t < T; t++) /* an outlier channel, what the rotation is for */
        k[(size_t)t * width + 3] = 20.0f;
    int32_t slots[6] = {9, 2, 3, 0, 11, 5};
    pair_buf K = pair_new(k, (size_t)T * width * 4), V = pair_new(v, (size_t)T * width * 4);
    void *pool = kt_dev(gpu, NULL, (size_t)n_pages * L.page_bytes);
    assert_int_equal(gpu->iface->kv_store(gpu, pool, &L, 0, K.g, V.g, slots, T), CAIRN_OK);
    uint8_t *got = kt_host(gpu, pool, (size_t)n_pages * L.page_bytes);
    uint8_t *want = kt_xmalloc(L.row_bytes);
    float *rot = kt_xmalloc((size_t)width * 4);
    char what[96];
    snprintf(what, sizeof what, "kv_store %s rotation %d vs the host's H_R",
             cairn_kv_type_name(dtype), R);
    for (int t = 0; t < T; t++) {
        for (int kv = 0; kv < 2; kv++) {
            const float *x = (kv ? v : k) + (size_t)t * width;
            for (int e = 0; e < width; e += R)
                for (int a = 0; a < R; a++) {
                    double sum = 0;
                    for (int b = 0; b < R; b++)
                        sum += (__builtin_popcount((unsigned)(a & b)) & 1 ? -1.0 : 1.0) * x[e + b];
                    rot[e + a] = (float)(sum / sqrt((double)R));
                }
            const uint8_t *row = got + cairn_kv_offset(&L, 0, kv, slots[t] % page_size) +
                                 (size_t)(slots[t] / page_size) * L.page_bytes;
            if (dtype == CAIRN_TYPE_F32) {
                const float *f = (const float *)row;
                for (int e = 0; e < width; e++)
                    KT_CLOSE(f[e], rot[e], 1e-5 * (1.0 + fabs(rot[e])), what, e);
            } else {
                /* a head's blocks are the row's blocks in order */
                assert_int_equal(cairn_quantize_row(dtype, rot, want, width), CAIRN_OK);
                expect_kv_pools_close(row, want, L.row_bytes, &L, what);
            }
        }
    }
    gpu->iface->free(gpu, pool);
    pair_free(&K);
    pair_free(&V);
    free(got);
    free(want);
    free(rot);
    free(k);
    free(v);
}

static void test_kv_rotation(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("kv rotation");
    check_kv_rotation(&r, CAIRN_TYPE_F32, 2, 64, 64);
    check_kv_rotation(&r, CAIRN_TYPE_F32, 3, 96, 32);
    check_kv_rotation(&r, CAIRN_TYPE_F32, 1, 128, 4);
    check_kv_rotation(&r, CAIRN_TYPE_Q8_0, 2, 64, 64);
    check_kv_rotation(&r, CAIRN_TYPE_Q8_0, 3, 96, 32);
    check_kv_rotation(&r, CAIRN_TYPE_Q4_0, 2, 128, 128);
    check_kv_rotation(&r, CAIRN_TYPE_Q4_0, 1, 64, 16);
}

/* A KV pool above 4.5 GiB, written and read at its last pages: every page
 * and row offset must be computed in 64 bits. The GPU pool's pages are
 * compared with a small CPU pool holding the same rows at renumbered pages,
 * then attention (a decode row and a 20-row prefill) over the far pages.
 * Skipped with a message when the device cannot allocate the pool; on the
 * CPU harness the pool is 64 MiB (the offsets are the GPU's concern). */
static void test_kv_pool_high_offsets(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("kv_pool_high_offsets");
    cairn_kv_layout L;
    /* 128 KiB pages: 2 layers x K,V x 16 rows x 8 heads x 128 x F16 */
    assert_int_equal(cairn_kv_layout_init(&L, 2, 8, 128, 16, CAIRN_TYPE_F16), CAIRN_OK);
    const size_t want_bytes = harness ? (size_t)64 << 20 : (size_t)4700 << 20;
    const int n_pages = (int)(want_bytes / L.page_bytes);
    if (harness)
        printf("kv_pool_high_offsets: CPU harness, a 64 MiB pool instead of 4.6 GiB\n");
    void *big = NULL;
    const int arc = gpu->iface->alloc(gpu, (size_t)n_pages * L.page_bytes, &big);
    if (arc == CAIRN_ENOMEM) {
        KT_SKIP("kv_pool_high_offsets: the device cannot allocate %.1f GiB",
                (double)n_pages * L.page_bytes / (1 << 30));
    }
    assert_int_equal(arc, CAIRN_OK);
    enum { NP = 7, N_KV = 100, LAYER = 1 };
    /* the sequence's pages: the pool's last ones, scattered */
    int32_t far[NP], near[NP];
    for (int i = 0; i < NP; i++) {
        far[i] = n_pages - 1 - (i * 3) % NP - (i % 2) * NP;
        near[i] = i;
    }
    const int width = L.n_kv_head * L.head_dim, n_head = 16;
    float *k = kt_xmalloc((size_t)N_KV * width * 4), *v = kt_xmalloc((size_t)N_KV * width * 4);
    kt_fill(&r, k, (size_t)N_KV * width, -1, 1);
    kt_fill(&r, v, (size_t)N_KV * width, -1, 1);
    int32_t sf[N_KV], sn[N_KV];
    for (int j = 0; j < N_KV; j++) {
        sf[j] = far[j / 16] * 16 + j % 16;
        sn[j] = near[j / 16] * 16 + j % 16;
    }
    pair_buf K = pair_new(k, (size_t)N_KV * width * 4), V = pair_new(v, (size_t)N_KV * width * 4);
    void *small = kt_dev(cpu, NULL, (size_t)NP * L.page_bytes);
    assert_int_equal(gpu->iface->kv_store(gpu, big, &L, LAYER, K.g, V.g, sf, N_KV), CAIRN_OK);
    assert_int_equal(cpu->iface->kv_store(cpu, small, &L, LAYER, K.c, V.c, sn, N_KV), CAIRN_OK);
    uint8_t *page = kt_xmalloc(L.page_bytes);
    for (int i = 0; i < NP; i++) {
        assert_int_equal(gpu->iface->download(gpu, page, (uint8_t *)big + (size_t)far[i] * L.page_bytes,
                                              L.page_bytes),
                         CAIRN_OK);
        char what[64];
        snprintf(what, sizeof what, "kv_store at page %d of %d", far[i], n_pages);
        KT_SAME_BYTES(page, (uint8_t *)small + (size_t)i * L.page_bytes, L.page_bytes, what);
    }
    const size_t qn = (size_t)21 * n_head * L.head_dim;
    float *q = kt_xmalloc(qn * 4);
    kt_fill(&r, q, qn, -1, 1);
    int32_t qd[1] = {N_KV - 1}, qp[20];
    for (int i = 0; i < 20; i++)
        qp[i] = 60 + i;
    cairn_attn_seq sg[2] = {{0, 1, N_KV, qd, far, NULL}, {1, 20, 80, qp, far, NULL}};
    cairn_attn_seq sc[2] = {{0, 1, N_KV, qd, near, NULL}, {1, 20, 80, qp, near, NULL}};
    pair_buf Q = pair_new(q, qn * 4), O = pair_out(qn * 4);
    cairn_attn_args a = {O.c, Q.c, small, &L, LAYER, n_head, 0.088f, 2, sc, 0, NULL};
    assert_int_equal(cpu->iface->attention(cpu, &a), CAIRN_OK);
    a = (cairn_attn_args){O.g, Q.g, big, &L, LAYER, n_head, 0.088f, 2, sg, 0, NULL};
    assert_int_equal(gpu->iface->attention(gpu, &a), CAIRN_OK);
    float *c, *g;
    pair_fetch(&O, &c, &g);
    for (size_t i = 0; i < qn; i++)
        KT_CLOSE(g[i], c[i], 2e-5, "attention over the last pages of a large pool", i);
    free(c);
    free(g);
    pair_free(&Q);
    pair_free(&O);
    pair_free(&K);
    pair_free(&V);
    cpu->iface->free(cpu, small);
    gpu->iface->free(gpu, big);
    free(page);
    free(q);
    free(k);
    free(v);
}

int main(void)
{
    const int open_rc = gpu_test_open(&gpu, "gpu_ops");
    if (open_rc != 0)
        return open_rc;
    harness = gpu_test_is_harness();
    cpu = kt_cpu(2);
    kt_init_seed("gpu_ops");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory),     cmocka_unit_test(test_supports_type),
        cmocka_unit_test(test_get_rows),   cmocka_unit_test(test_get_rows_ckpt_codes),
        cmocka_unit_test(test_matmul_ckpt_unaligned),
        cmocka_unit_test(test_matmul),     cmocka_unit_test(test_matmul_two_chunks),
        cmocka_unit_test(test_matmul_f16_nonfinite),
        cmocka_unit_test(test_staging),    cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),       cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_swiglu_clamped),
        cmocka_unit_test(test_softmax),    cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_kv_types), cmocka_unit_test(test_attention_windows),
        cmocka_unit_test(test_attention_sinks),
        cmocka_unit_test(test_attention_split),
        cmocka_unit_test(test_attention_verify_rows),
        cmocka_unit_test(test_kv_rotation),
        cmocka_unit_test(test_kv_pool_high_offsets),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    cairn_backend_destroy(cpu);
    cairn_backend_destroy(gpu);
    return gpu_test_finish(kt_exit_code(failed), "gpu_ops");
}
