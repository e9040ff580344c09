/*
 * tests/gpu/test_gpu_ops.c — every op of the CUDA backend against the CPU
 * backend on fresh random inputs (seeded; rerun with CAIRN_TEST_SEED).
 *
 * Tolerances (each check says which):
 *   - get_rows and kv_store: bit-exact (the kernels use the CPU's float
 *     expressions; F16 conversion is round-to-nearest-even on both);
 *   - float paths (F32 matmul, GEMV on any type, rmsnorm, rope, swiglu,
 *     softmax, attention): 1e-5 relative, where "relative" is to the sum of
 *     magnitudes that went into the value (sum |w x| for a dot product), so
 *     the bound holds whatever the summation order;
 *   - F16/BF16 weights with more than 8 tokens (cuBLAS on activations
 *     rounded to 16 bits): 1e-2 relative (BF16 keeps 8 mantissa bits).
 * The CPU backend runs with CAIRN_CPU_EXACT_MATMUL=1 so its quantized matmul
 * has the float semantics the CUDA GEMV implements.
 *
 * Exits 77 (ctest: skipped) with a message when no CUDA device is present.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/support.h"

static cairn_backend *cpu, *gpu;

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

static const cairn_type all_types[] = {
    CAIRN_TYPE_F32,  CAIRN_TYPE_F16,  CAIRN_TYPE_BF16, CAIRN_TYPE_Q8_0, CAIRN_TYPE_Q4_0,
    CAIRN_TYPE_Q5_0, CAIRN_TYPE_Q4_K, CAIRN_TYPE_Q5_K, CAIRN_TYPE_Q6_K,
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
        pair_buf out = pair_new(NULL, (size_t)T * D * sizeof(float));
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
    pair_buf t2 = pair_new(tab, sizeof tab), o2 = pair_new(NULL, 2 * 37 * sizeof(float));
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
    pair_buf Y = pair_new(NULL, (size_t)T * n_out * sizeof(float));
    assert_int_equal(cpu->iface->matmul(cpu, Y.c, W.c, type, X.c, T, n_in, n_out), CAIRN_OK);
    assert_int_equal(gpu->iface->matmul(gpu, Y.g, W.g, type, X.g, T, n_in, n_out), CAIRN_OK);
    float *c, *g;
    pair_fetch(&Y, &c, &g);
    /* 16-bit weights past the GEMV size go through cuBLAS on 16-bit
     * activations; everything else is float arithmetic */
    const int rounded = (type == CAIRN_TYPE_F16 || type == CAIRN_TYPE_BF16) &&
                        (T > 8 || (n_in % 32 != 0 && n_in % 8 != 0));
    char what[96];
    snprintf(what, sizeof what, "matmul %s T=%d n_in=%d n_out=%d", cairn_type_get(type)->name, T,
             n_in, n_out);
    expect_close(g, c, mag, (size_t)T * n_out, rounded ? 1e-2 : 1e-5, 1e-6, what);
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
    /* T = 1, 3, 8: one GEMV launch; 9, 33: grouped GEMV (quantized) or
     * cuBLAS (16-bit); 40: dequantize + SGEMM (quantized) */
    static const int Ts[] = {1, 3, 8, 9, 33, 40};
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

    /* edge rules */
    float x[64];
    kt_fill(&r, x, 64, -1, 1);
    pair_buf X = pair_new(x, sizeof x);
    assert_int_equal(gpu->iface->matmul(gpu, X.g, X.g, CAIRN_TYPE_F32, X.g, 1, 8, 8), CAIRN_EINVAL);
    assert_int_equal(gpu->iface->matmul(gpu, X.g, X.g, CAIRN_TYPE_Q8_0, x, 1, 40, 1), CAIRN_EINVAL);
    assert_int_equal(gpu->iface->matmul(gpu, X.g, X.g, CAIRN_TYPE_I32, x, 1, 8, 1), CAIRN_EINVAL);
    pair_free(&X);
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
        pair_buf O = pair_new(NULL, (size_t)T * D * 4);
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
    pair_buf O = pair_new(NULL, total * 4);
    float *c, *g;

    assert_int_equal(cpu->iface->swiglu(cpu, O.c, A.c, B.c, total), CAIRN_OK);
    assert_int_equal(gpu->iface->swiglu(gpu, O.g, A.g, B.g, total), CAIRN_OK);
    pair_fetch(&O, &c, &g);
    expect_close(g, c, NULL, total, 1e-5, 1e-6, "swiglu");
    free(c);
    free(g);

    assert_int_equal(cpu->iface->add(cpu, O.c, A.c, B.c, total), CAIRN_OK);
    assert_int_equal(gpu->iface->add(gpu, O.g, A.g, B.g, total), CAIRN_OK);
    pair_fetch(&O, &c, &g);
    KT_SAME_BYTES(g, c, total * 4, "add");
    free(c);
    free(g);

    /* in place: y == a */
    assert_int_equal(cpu->iface->add(cpu, A.c, A.c, B.c, total), CAIRN_OK);
    assert_int_equal(gpu->iface->add(gpu, A.g, A.g, B.g, total), CAIRN_OK);
    assert_int_equal(cpu->iface->add_bias(cpu, A.c, Bi.c, T, n), CAIRN_OK);
    assert_int_equal(gpu->iface->add_bias(gpu, A.g, Bi.g, T, n), CAIRN_OK);
    pair_fetch(&A, &c, &g);
    KT_SAME_BYTES(g, c, total * 4, "add in place + add_bias");
    free(c);
    free(g);

    /* swiglu in place (out == gate) */
    assert_int_equal(cpu->iface->swiglu(cpu, A.c, A.c, B.c, total), CAIRN_OK);
    assert_int_equal(gpu->iface->swiglu(gpu, A.g, A.g, B.g, total), CAIRN_OK);
    pair_fetch(&A, &c, &g);
    expect_close(g, c, NULL, total, 1e-5, 1e-6, "swiglu in place");
    free(c);
    free(g);

    assert_int_equal(gpu->iface->add(gpu, O.g, A.g, B.g, 0), CAIRN_EINVAL);
    assert_int_equal(gpu->iface->add_bias(gpu, A.g, Bi.g, 0, n), CAIRN_EINVAL);
    pair_free(&A);
    pair_free(&B);
    pair_free(&Bi);
    pair_free(&O);
    free(a);
    free(b);
    free(bias);
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

static void check_attention(kt_rng *r, cairn_type dtype, int n_kv_head, int group, int head_dim,
                            int page_size, int alias_out)
{
    cairn_kv_layout L;
    assert_int_equal(cairn_kv_layout_init(&L, 2, n_kv_head, head_dim, page_size, dtype), CAIRN_OK);
    const int n_head = n_kv_head * group, layer = 1;
    const int n_pages = 64;
    /* three sequences: a prefill of 37 rows over 37 KV (causal), a decode
     * row over 150 KV, a tree of 6 rows over 45 KV with a mask (one row
     * sees nothing) */
    enum { S = 3 };
    const int n_kv[S] = {37, 150, 45}, n_q[S] = {37, 1, 6};
    int32_t perm[64];
    kt_permutation(r, perm, n_pages); /* scattered pages, none shared */
    int32_t *pages[S];
    int used = 0;
    for (int s = 0; s < S; s++) {
        const int np = (n_kv[s] + page_size - 1) / page_size;
        assert_true(used + np <= n_pages);
        pages[s] = perm + used;
        used += np;
    }
    /* Every KV entry of each sequence written with kv_store, in a few calls
     * of different sizes. */
    pair_buf pool = pair_new(NULL, (size_t)n_pages * L.page_bytes);
    const int width = n_kv_head * head_dim;
    for (int s = 0; s < S; s++) {
        for (int j0 = 0; j0 < n_kv[s];) {
            int T = 1 + kt_below(r, 40);
            if (T > n_kv[s] - j0)
                T = n_kv[s] - j0;
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
        KT_SAME_BYTES(g, c, pool.bytes, "kv_store pool");
        free(c);
        free(g);
    }

    int n_rows = 0;
    for (int s = 0; s < S; s++)
        n_rows += n_q[s];
    const size_t qn = (size_t)n_rows * n_head * head_dim;
    float *q = kt_xmalloc(qn * 4);
    kt_fill(r, q, qn, -1.5f, 1.5f);
    int32_t qidx0[37], qidx1[1] = {149};
    for (int i = 0; i < 37; i++)
        qidx0[i] = i;
    uint8_t *mask = kt_xmalloc((size_t)6 * 45);
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 45; j++)
            mask[i * 45 + j] = i == 4 ? 0 : (j < 40 || kt_below(r, 2));
    cairn_attn_seq seqs[S] = {
        {0, 37, 37, qidx0, pages[0], NULL},
        {37, 1, 150, qidx1, pages[1], NULL},
        {38, 6, 45, NULL, pages[2], mask},
    };
    pair_buf Q = pair_new(q, qn * 4), O = pair_new(NULL, qn * 4);
    cairn_attn_args a = {O.c, Q.c, pool.c, &L, layer, n_head, 1.0f / sqrtf((float)head_dim), S, seqs};
    if (alias_out)
        a.out = Q.c;
    assert_int_equal(cpu->iface->attention(cpu, &a), CAIRN_OK);
    a.out = alias_out ? Q.g : O.g;
    a.q = Q.g;
    a.kv_pool = pool.g;
    assert_int_equal(gpu->iface->attention(gpu, &a), CAIRN_OK);
    float *c, *g;
    pair_fetch(alias_out ? &Q : &O, &c, &g);
    char what[96];
    snprintf(what, sizeof what, "attention %s kvh %d group %d hd %d ps %d alias %d",
             dtype == CAIRN_TYPE_F16 ? "f16" : "f32", n_kv_head, group, head_dim, page_size,
             alias_out);
    /* outputs are convex combinations of V entries in [-1, 1] */
    for (size_t i = 0; i < qn; i++)
        KT_CLOSE(g[i], c[i], 2e-5, what, i);
    /* the masked-out row is zeros */
    for (int d = 0; d < n_head * head_dim; d++)
        assert_true(g[(size_t)(38 + 4) * n_head * head_dim + d] == 0.0f);
    free(c);
    free(g);

    /* edge rules: q_index beyond n_kv, negative page */
    int32_t bad_q[1] = {150};
    cairn_attn_seq bad = {37, 1, 150, bad_q, pages[1], NULL};
    a.n_seqs = 1;
    a.seqs = &bad;
    assert_int_equal(gpu->iface->attention(gpu, &a), CAIRN_EINVAL);

    pair_free(&Q);
    pair_free(&O);
    pair_free(&pool);
    free(q);
    free(mask);
}

static void test_attention(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("attention");
    check_attention(&r, CAIRN_TYPE_F32, 2, 2, 64, 16, 0);
    check_attention(&r, CAIRN_TYPE_F16, 2, 4, 128, 16, 0);
    check_attention(&r, CAIRN_TYPE_F16, 1, 3, 40, 7, 1);   /* odd sizes, out == q */
    check_attention(&r, CAIRN_TYPE_F32, 4, 1, 256, 32, 0); /* no GQA, wide heads */
    check_attention(&r, CAIRN_TYPE_F16, 2, 2, 8, 4, 0);    /* stories260K's head */
}

int main(void)
{
    cairn_backend *probe = NULL;
    if (kt_open_device(&probe) != CAIRN_OK) {
        printf("SKIP: no CUDA device available (cairn_backend_cuda_create failed); the gpu "
               "tests run only on a machine with an NVIDIA GPU\n");
        return 77;
    }
    gpu = probe;
    cpu = kt_cpu(2);
    kt_init_seed("gpu_ops");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory),     cmocka_unit_test(test_supports_type),
        cmocka_unit_test(test_get_rows),
        cmocka_unit_test(test_matmul),     cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),       cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_softmax),    cmocka_unit_test(test_attention),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    cairn_backend_destroy(cpu);
    cairn_backend_destroy(gpu);
    return failed;
}
