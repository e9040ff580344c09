/*
 * tests/kernels/test_cpu_ops.c — the CPU backend's memory ops, get_rows,
 * matmul, rmsnorm, rope, swiglu, add and softmax against naive
 * double-precision references, on fresh random data.
 *
 * Every op runs on a 1-thread and a 3-thread backend; the two results must be
 * bitwise identical (the backend's promise of thread-count independence) and
 * within the stated tolerance of the reference. Shapes are odd on purpose:
 * T = 1 and T > 1, output counts that are not multiples of 3.
 *
 * Tolerances use u = FLT_EPSILON / 2, the unit roundoff of float; each one is
 * a first-order worst-case bound for the float expression the kernel
 * evaluates, relative to the magnitude of the terms involved (not of the
 * result, which may cancel to near zero), so a correct kernel cannot fail
 * them while a wrong element, pairing or scale misses them by orders of
 * magnitude.
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
#include <unistd.h>

#include "tests/support/support.h"

static cairn_backend *be1; /* 1 thread: no workers */
static cairn_backend *be3; /* 3 threads */

/* These backends are created in exact-matmul mode, so Q8_0/Q4_0 weights
 * multiply float activations and the float-reference tolerance of
 * test_matmul applies to every type. The default mode (activations
 * quantized to 8 bits) is tested in test_cpu_matmul.c. */
static int setup_backends(void **state)
{
    (void)state;
    setenv("CAIRN_CPU_EXACT_MATMUL", "1", 1);
    int ok = cairn_backend_cpu_create(1, &be1) == CAIRN_OK &&
             cairn_backend_cpu_create(3, &be3) == CAIRN_OK;
    unsetenv("CAIRN_CPU_EXACT_MATMUL");
    return ok ? 0 : -1;
}

static int teardown_backends(void **state)
{
    (void)state;
    cairn_backend_destroy(be1);
    cairn_backend_destroy(be3);
    return 0;
}

static const cairn_type all_types[] = {CAIRN_TYPE_F32, CAIRN_TYPE_F16, CAIRN_TYPE_BF16,
                                       CAIRN_TYPE_Q8_0, CAIRN_TYPE_Q4_0};
#define N_TYPES (sizeof all_types / sizeof all_types[0])

static const char *type_name(cairn_type t)
{
    return cairn_type_get(t)->name;
}

/* ---- creation and memory ----------------------------------------------- */

static void test_create(void **state)
{
    (void)state;
    assert_int_equal(cairn_backend_cpu_threads(be1), 1);
    assert_int_equal(cairn_backend_cpu_threads(be3), 3);
    assert_string_equal(be1->iface->name, "cpu");

    cairn_backend *be = kt_cpu(0); /* one per online core */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    assert_int_equal(cairn_backend_cpu_threads(be), cores < 1 ? 1 : (int)cores);
    cairn_backend_destroy(be);

    cairn_backend *untouched = (cairn_backend *)&be;
    cairn_backend *out = untouched;
    assert_int_equal(cairn_backend_cpu_create(-1, &out), CAIRN_EINVAL);
    assert_ptr_equal(out, untouched);
    assert_int_equal(cairn_backend_cpu_create(2, NULL), CAIRN_EINVAL);
    assert_true(cairn_backend_cpu_threads(NULL) < 0);
    cairn_backend_destroy(NULL); /* a no-op */
}

/* Creating, using and destroying pools repeatedly must neither hang nor leak
 * threads: destroy has to wake and join workers that are asleep. */
static void test_pool_lifecycle(void **state)
{
    (void)state;
    /* 4 x 256 inputs, 200 outputs: big enough that the rows are split. */
    enum { T = 4, N_IN = 256, N_OUT = 200 };
    float *x = kt_xmalloc(sizeof(float) * T * N_IN), *w = kt_xmalloc(sizeof(float) * N_OUT * N_IN);
    float y[T * N_OUT], y_ref[T * N_OUT];
    kt_rng rng = kt_rng_for("pool_lifecycle");
    kt_fill(&rng, x, T * N_IN, -1, 1);
    kt_fill(&rng, w, N_OUT * N_IN, -1, 1);
    assert_int_equal(be1->iface->matmul(be1, y_ref, w, CAIRN_TYPE_F32, x, T, N_IN, N_OUT), CAIRN_OK);
    for (int i = 0; i < 20; i++) {
        cairn_backend *be = kt_cpu(1 + i % 5);
        if (i % 2 == 0) { /* half of them never run a job before destroy */
            for (int rep = 0; rep < 3; rep++) {
                memset(y, 0, sizeof y);
                assert_int_equal(be->iface->matmul(be, y, w, CAIRN_TYPE_F32, x, T, N_IN, N_OUT),
                                 CAIRN_OK);
                KT_SAME_BYTES(y, y_ref, sizeof y, "matmul on a fresh pool");
            }
        }
        cairn_backend_destroy(be);
    }
    free(x);
    free(w);
}

static void test_memory(void **state)
{
    (void)state;
    cairn_backend *be = be3;
    const size_t sizes[] = {1, 63, 64, 1000, 1 << 20};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        uint8_t *p = NULL;
        assert_int_equal(be->iface->alloc(be, sizes[s], (void **)&p), CAIRN_OK);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 64, 0);
        for (size_t i = 0; i < sizes[s]; i++)
            if (p[i] != 0)
                fail_msg("alloc(%zu) byte %zu not zero", sizes[s], i);
        be->iface->free(be, p);
    }
    void *p = NULL;
    assert_int_equal(be->iface->alloc(be, 0, &p), CAIRN_EINVAL);
    assert_int_equal(be->iface->alloc(be, 16, NULL), CAIRN_EINVAL);
    assert_int_equal(be->iface->alloc(be, SIZE_MAX, &p), CAIRN_ENOMEM);
    assert_null(p);
    be->iface->free(be, NULL);

    /* upload -> copy -> download round trip */
    uint8_t src[300], dst[300];
    for (int i = 0; i < 300; i++)
        src[i] = (uint8_t)(i * 7 + 1);
    void *a = kt_dev(be, NULL, 300), *b = kt_dev(be, NULL, 300);
    assert_int_equal(be->iface->upload(be, a, src, 300), CAIRN_OK);
    assert_int_equal(be->iface->copy(be, b, a, 300), CAIRN_OK);
    memset(dst, 0, sizeof dst);
    assert_int_equal(be->iface->download(be, dst, b, 300), CAIRN_OK);
    assert_memory_equal(dst, src, 300);
    assert_int_equal(be->iface->synchronize(be), CAIRN_OK);
    assert_int_equal(be->iface->copy(be, b, a, 0), CAIRN_OK); /* 0 bytes: no-op */
    assert_int_equal(be->iface->upload(be, NULL, src, 4), CAIRN_EINVAL);
    assert_int_equal(be->iface->upload(be, a, NULL, 4), CAIRN_EINVAL);
    assert_int_equal(be->iface->download(be, NULL, a, 4), CAIRN_EINVAL);
    assert_int_equal(be->iface->copy(be, b, NULL, 4), CAIRN_EINVAL);
    be->iface->free(be, a);
    be->iface->free(be, b);
}

/* ---- get_rows ---------------------------------------------------------- */

/* A lookup is exact: each output row must equal cairn_dequantize_row of the
 * table row bit for bit. */
static void check_get_rows(cairn_type type, const int32_t *ids, int T, kt_rng *rng)
{
    const int block = cairn_type_get(type)->block_elems;
    const int D = block == 1 ? 45 : 96;
    const int n_rows = 23;
    const size_t rb = cairn_type_row_bytes(type, D);
    const size_t out_bytes = sizeof(float) * (size_t)T * (size_t)D;
    uint8_t *table = kt_random_weights(rng, type, n_rows, D, -2, 2, NULL);
    float *want = kt_xmalloc(out_bytes);
    for (int t = 0; t < T; t++)
        assert_int_equal(cairn_dequantize_row(type, table + (size_t)ids[t] * rb,
                                              want + (size_t)t * D, D), CAIRN_OK);
    cairn_backend *bes[2] = {be1, be3};
    for (int b = 0; b < 2; b++) {
        cairn_backend *be = bes[b];
        void *dtable = kt_dev(be, table, rb * n_rows);
        float *dout = kt_dev(be, NULL, out_bytes);
        assert_int_equal(be->iface->get_rows(be, dout, dtable, type, D, ids, T), CAIRN_OK);
        float *got = kt_host(be, dout, out_bytes);
        KT_SAME_BYTES(got, want, out_bytes, type_name(type));
        free(got);
        be->iface->free(be, dout);
        be->iface->free(be, dtable);
    }
    free(want);
    free(table);
}

static void test_get_rows(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("get_rows");
    int32_t few[7] = {0, 22, 5, 5, 13, 1, 22}; /* repeats and both ends */
    few[2] = kt_below(&rng, 23);
    int32_t many[700]; /* enough rows for the pool to split them */
    for (int t = 0; t < 700; t++)
        many[t] = kt_below(&rng, 23);
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        check_get_rows(all_types[ti], few, 7, &rng);
        check_get_rows(all_types[ti], many, 700, &rng);
    }
}

/* ---- matmul ------------------------------------------------------------ */

/* y = x · Wᵀ for one weight type and shape, against a double reference on
 * the dequantized weights.
 *
 * Tolerance: the kernel forms n_in float products (each rounded, <= u|term|)
 * and adds them in float (n_in - 1 additions, each adding <= u times a
 * partial sum, itself <= sum|terms|), so |y - exact| <= (n_in + 1) u sum|terms|
 * to first order. We allow (n_in + 2) FLT_EPSILON sum|terms|, about twice
 * that. The weights are compared after dequantization, so the format's own
 * rounding is not part of the error (test_quant bounds that separately). */
static void check_matmul(cairn_type type, int T, int n_in, int n_out, kt_rng *rng)
{
    const size_t rb = cairn_type_row_bytes(type, n_in);
    float *Wd;                                                       /* [n_out][n_in] */
    uint8_t *W = kt_random_weights(rng, type, n_out, n_in, -1, 1, &Wd);
    float *x = kt_xmalloc(sizeof(float) * (size_t)T * (size_t)n_in); /* [T][n_in] */
    kt_fill(rng, x, (size_t)T * (size_t)n_in, -3, 3);

    const size_t y_bytes = sizeof(float) * (size_t)T * (size_t)n_out;
    float *got[2];
    cairn_backend *bes[2] = {be1, be3};
    for (int b = 0; b < 2; b++)
        got[b] = kt_run_matmul(bes[b], type, W, rb, x, T, n_in, n_out);
    char what[96];
    snprintf(what, sizeof what, "matmul %s T=%d n_in=%d n_out=%d", type_name(type), T, n_in, n_out);
    KT_SAME_BYTES(got[0], got[1], y_bytes, what);
    kt_expect_matmul(got[0], Wd, NULL, x, T, n_in, n_out, what);
    free(got[0]);
    free(got[1]);
    free(x);
    free(Wd);
    free(W);
}

static void test_matmul(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("matmul");
    /* T, n_in, n_out: single token, a batch, a wide input, an output count
     * far from a multiple of the thread count, and one large enough that the
     * pool really splits the rows. */
    static const int shapes[][3] = {
        {1, 64, 37}, {5, 96, 130}, {3, 256, 7}, {1, 32, 1}, {17, 128, 301},
    };
    for (size_t ti = 0; ti < N_TYPES; ti++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            check_matmul(all_types[ti], shapes[s][0], shapes[s][1], shapes[s][2], &rng);
    /* Plain types accept any row length. */
    check_matmul(CAIRN_TYPE_F32, 3, 45, 11, &rng);
    check_matmul(CAIRN_TYPE_F16, 2, 7, 40, &rng);
    check_matmul(CAIRN_TYPE_BF16, 4, 33, 9, &rng);
}

/* ---- rmsnorm ----------------------------------------------------------- */

/* Tolerance: the sum of squares is kept in double (negligible error); then
 * mean -> float, + eps, sqrtf, 1/., x*scale, *w each round once, about 6u of
 * relative error in all. We allow 8 FLT_EPSILON = 16u relative to |result|. */
static void test_rmsnorm(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("rmsnorm");
    static const int shapes[][2] = {{1, 67}, {3, 288}, {40, 1000}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int T = shapes[s][0], D = shapes[s][1];
        const float eps = 1e-5f;
        const size_t n = (size_t)T * D;
        float *x = kt_xmalloc(sizeof(float) * n), *w = kt_xmalloc(sizeof(float) * (size_t)D);
        kt_fill(&rng, x, n, -4, 4);
        kt_fill(&rng, w, (size_t)D, -2, 2);
        float *got[3];
        cairn_backend *bes[3] = {be1, be3, be3};
        for (int b = 0; b < 3; b++) {
            cairn_backend *be = bes[b];
            float *dx = kt_dev(be, x, sizeof(float) * n), *dw = kt_dev(be, w, sizeof(float) * D);
            /* the third run is in place: out == x */
            float *dout = b == 2 ? dx : kt_dev(be, NULL, sizeof(float) * n);
            assert_int_equal(be->iface->rmsnorm(be, dout, dx, dw, T, D, eps), CAIRN_OK);
            got[b] = kt_host(be, dout, sizeof(float) * n);
            if (dout != dx)
                be->iface->free(be, dout);
            be->iface->free(be, dx);
            be->iface->free(be, dw);
        }
        KT_SAME_BYTES(got[0], got[1], sizeof(float) * n, "rmsnorm 1 vs 3 threads");
        KT_SAME_BYTES(got[0], got[2], sizeof(float) * n, "rmsnorm in place");
        for (int t = 0; t < T; t++) {
            double ss = 0.0;
            for (int i = 0; i < D; i++)
                ss += (double)x[(size_t)t * D + i] * x[(size_t)t * D + i];
            double scale = 1.0 / sqrt(ss / D + eps);
            for (int i = 0; i < D; i++) {
                double want = x[(size_t)t * D + i] * scale * w[i];
                KT_CLOSE(got[0][(size_t)t * D + i], want, 8 * FLT_EPSILON * fabs(want), "rmsnorm",
                         (long long)t * D + i);
            }
        }
        for (int b = 0; b < 3; b++)
            free(got[b]);
        free(x);
        free(w);
    }
}

/* ---- rope -------------------------------------------------------------- */

/* One rope configuration on x[T][n_heads][head_dim].
 *
 * Reference: theta_i = pos * freq_scale * base^(-2i/n_rot) / factor_i in
 * double. The kernel builds theta as llama.cpp does: a running float product
 * of powf(base, -2/n_rot) (relative error <= (3i + 1) u after i steps: the
 * power's own rounding compounds i times, plus i multiplications), then a
 * division by the factor and a multiplication by freq_scale (u each). So
 * |dtheta_i| <= (3i + 4) u theta_i. cosf/sinf add about u each, and the
 * rotation x0 c - x1 s two more roundings. Per output element:
 *     tol = (|x0| + |x1|) * ((3i + 4) u theta_i + 6u),
 * and we use FLT_EPSILON (2u) in place of u. At large positions this is
 * dominated by the angle, which is why the bound grows with theta. */
static void check_rope(int T, int n_heads, cairn_rope_mode mode, int head_dim, int n_rot,
                       float freq_scale, int with_factors, int max_pos, kt_rng *rng)
{
    const size_t n = (size_t)T * n_heads * head_dim;
    float *x = kt_xmalloc(sizeof(float) * n);
    kt_fill(rng, x, n, -2, 2);
    int32_t *pos = kt_xmalloc(sizeof(int32_t) * (size_t)T);
    for (int t = 0; t < T; t++)
        pos[t] = kt_below(rng, max_pos + 1);
    pos[0] = 0;
    float factors[64];
    for (int i = 0; i < n_rot / 2; i++)
        factors[i] = kt_uniform(rng, 1.0f, 8.0f);
    cairn_rope_params p = {
        .n_rot = n_rot, .mode = mode, .freq_base = 10000.0f, .freq_scale = freq_scale,
        .freq_factors = NULL,
    };

    float *got[2];
    cairn_backend *bes[2] = {be1, be3};
    for (int b = 0; b < 2; b++) {
        cairn_backend *be = bes[b];
        float *dx = kt_dev(be, x, sizeof(float) * n);
        float *dff = kt_dev(be, factors, sizeof factors);
        p.freq_factors = with_factors ? dff : NULL;
        assert_int_equal(be->iface->rope(be, dx, T, n_heads, head_dim, pos, &p), CAIRN_OK);
        got[b] = kt_host(be, dx, sizeof(float) * n);
        be->iface->free(be, dff);
        be->iface->free(be, dx);
    }
    char what[128];
    snprintf(what, sizeof what, "rope %s head_dim=%d n_rot=%d scale=%g factors=%d",
             mode == CAIRN_ROPE_NEOX ? "neox" : "normal", head_dim, n_rot, freq_scale, with_factors);
    KT_SAME_BYTES(got[0], got[1], sizeof(float) * n, what);

    const double u = FLT_EPSILON;
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < n_heads; h++) {
            const size_t base = ((size_t)t * n_heads + h) * head_dim;
            const float *in = x + base;
            const float *out = got[0] + base;
            for (int i = 0; i < n_rot / 2; i++) {
                double theta = pos[t] * (double)freq_scale *
                               pow(10000.0, -2.0 * i / n_rot) / (with_factors ? factors[i] : 1.0);
                int i0 = mode == CAIRN_ROPE_NEOX ? i : 2 * i;
                int i1 = mode == CAIRN_ROPE_NEOX ? i + n_rot / 2 : 2 * i + 1;
                double x0 = in[i0], x1 = in[i1];
                double tol = (fabs(x0) + fabs(x1)) * ((3.0 * i + 4) * u * theta + 6 * u);
                KT_CLOSE(out[i0], x0 * cos(theta) - x1 * sin(theta), tol, what, (long long)(base + i0));
                KT_CLOSE(out[i1], x0 * sin(theta) + x1 * cos(theta), tol, what, (long long)(base + i1));
            }
            /* Dimensions beyond n_rot pass through untouched, and position 0
             * is the identity, bit for bit. */
            for (int d = n_rot; d < head_dim; d++)
                KT_CLOSE(out[d], in[d], 0.0, what, (long long)(base + d));
            if (pos[t] == 0)
                for (int d = 0; d < head_dim; d++)
                    KT_CLOSE(out[d], in[d], 0.0, what, (long long)(base + d));
        }
    }
    free(got[0]);
    free(got[1]);
    free(pos);
    free(x);
}

static void test_rope(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("rope");
    const cairn_rope_mode modes[] = {CAIRN_ROPE_NORMAL, CAIRN_ROPE_NEOX};
    for (int m = 0; m < 2; m++) {
        /*        T  heads mode      hd  n_rot scale factors max_pos */
        check_rope(1, 3, modes[m], 16, 16, 1.0f, 0, 64, &rng);     /* one token */
        check_rope(5, 3, modes[m], 24, 16, 1.0f, 0, 64, &rng);     /* n_rot < head_dim */
        check_rope(5, 2, modes[m], 64, 64, 1.0f, 1, 300, &rng);    /* Llama 3 freq factors */
        check_rope(5, 3, modes[m], 48, 32, 0.25f, 1, 300, &rng);   /* linear scaling + factors */
        check_rope(3, 1, modes[m], 32, 2, 1.0f, 0, 10, &rng);      /* a single pair */
        check_rope(64, 8, modes[m], 128, 96, 1.0f, 0, 4096, &rng); /* long positions, split
                                                                      over threads */
    }
}

/* The two modes really differ: NORMAL must not rotate (i, i + n_rot/2). A
 * one-hot vector makes the pairing visible exactly. */
static void test_rope_pairing(void **state)
{
    (void)state;
    const int head_dim = 8;
    int32_t pos[1] = {1};
    cairn_rope_params p = {.n_rot = 8, .freq_base = 10000.0f, .freq_scale = 1.0f};
    float x[8] = {1, 0, 0, 0, 0, 0, 0, 0};
    p.mode = CAIRN_ROPE_NORMAL;
    assert_int_equal(be1->iface->rope(be1, x, 1, 1, head_dim, pos, &p), CAIRN_OK);
    /* pair (0, 1) at angle 1: (cos 1, sin 1); the rest stays zero */
    KT_CLOSE(x[0], cos(1.0), 4 * FLT_EPSILON, "normal x0", 0);
    KT_CLOSE(x[1], sin(1.0), 4 * FLT_EPSILON, "normal x1", 1);
    for (int d = 2; d < 8; d++)
        KT_CLOSE(x[d], 0.0, 0.0, "normal rest", d);
    float y[8] = {1, 0, 0, 0, 0, 0, 0, 0};
    p.mode = CAIRN_ROPE_NEOX;
    assert_int_equal(be1->iface->rope(be1, y, 1, 1, head_dim, pos, &p), CAIRN_OK);
    /* pair (0, 4) */
    KT_CLOSE(y[0], cos(1.0), 4 * FLT_EPSILON, "neox x0", 0);
    KT_CLOSE(y[4], sin(1.0), 4 * FLT_EPSILON, "neox x4", 4);
    KT_CLOSE(y[1], 0.0, 0.0, "neox x1", 1);
}

/* ---- swiglu, add, softmax ---------------------------------------------- */

/* swiglu: silu(g) * u = g / (1 + exp(-g)) * u. expf (~1u), 1 + e (u; the
 * relative error of e shrinks by e/(1+e) <= 1), the division and the product
 * (u each): about 4u of relative error; we allow 6 FLT_EPSILON = 12u.
 * add: one correctly rounded addition, <= u |a + b|; we allow FLT_EPSILON. */
static void test_swiglu_add(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("swiglu_add");
    const size_t sizes[] = {1, 1000, 70001}; /* the last one is split over threads */
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const size_t n = sizes[s], bytes = sizeof(float) * n;
        float *a = kt_xmalloc(bytes), *b = kt_xmalloc(bytes);
        kt_fill(&rng, a, n, -10, 10);
        kt_fill(&rng, b, n, -3, 3);
        float *sw[3], *ad[3];
        cairn_backend *bes[3] = {be1, be3, be3};
        for (int k = 0; k < 3; k++) {
            cairn_backend *be = bes[k];
            float *da = kt_dev(be, a, bytes), *db = kt_dev(be, b, bytes);
            /* the third run is in place: out == first operand */
            float *dout = k == 2 ? da : kt_dev(be, NULL, bytes);
            assert_int_equal(be->iface->swiglu(be, dout, da, db, n), CAIRN_OK);
            sw[k] = kt_host(be, dout, bytes);
            assert_int_equal(be->iface->upload(be, da, a, bytes), CAIRN_OK);
            assert_int_equal(be->iface->add(be, dout, da, db, n), CAIRN_OK);
            ad[k] = kt_host(be, dout, bytes);
            if (dout != da)
                be->iface->free(be, dout);
            be->iface->free(be, da);
            be->iface->free(be, db);
        }
        KT_SAME_BYTES(sw[0], sw[1], bytes, "swiglu 1 vs 3 threads");
        KT_SAME_BYTES(sw[0], sw[2], bytes, "swiglu in place");
        KT_SAME_BYTES(ad[0], ad[1], bytes, "add 1 vs 3 threads");
        KT_SAME_BYTES(ad[0], ad[2], bytes, "add in place");
        for (size_t i = 0; i < n; i++) {
            double g = a[i], want = g / (1.0 + exp(-g)) * b[i];
            KT_CLOSE(sw[0][i], want, 6 * FLT_EPSILON * fabs(want) + 1e-37, "swiglu", i);
            double sum = (double)a[i] + b[i];
            KT_CLOSE(ad[0][i], sum, FLT_EPSILON * fabs(sum), "add", i);
        }
        for (int k = 0; k < 3; k++) {
            free(sw[k]);
            free(ad[k]);
        }
        free(a);
        free(b);
    }
}

/* swiglu_clamped (gpt-oss's experts): g' sigmoid(alpha g') (u' + 1) with
 * g' = min(g, limit), u' = clamp(u, -limit, limit). The clamps are exact;
 * alpha g' rounds once more than swiglu's argument (u), whose error the
 * exponential scales by |alpha g'| <= 1.702 * 7 ~ 12: relative error up to
 * about 16u, plus the (u' + 1) sum, which cancels near u' = -1: allow
 * 20 FLT_EPSILON of the result plus 2 FLT_EPSILON of the product without
 * the +1's cancellation. Values span beyond +-limit on both inputs. */
static void test_swiglu_clamped(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("swiglu_clamped");
    const float alpha = 1.702f, limit = 7.0f;
    const size_t sizes[] = {1, 1000, 70001};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const size_t n = sizes[s], bytes = sizeof(float) * n;
        float *a = kt_xmalloc(bytes), *b = kt_xmalloc(bytes);
        kt_fill(&rng, a, n, -12, 12);
        kt_fill(&rng, b, n, -10, 10);
        float *got[3];
        cairn_backend *bes[3] = {be1, be3, be3};
        for (int k = 0; k < 3; k++) {
            cairn_backend *be = bes[k];
            assert_non_null(be->iface->swiglu_clamped);
            float *da = kt_dev(be, a, bytes), *db = kt_dev(be, b, bytes);
            float *dout = k == 2 ? da : kt_dev(be, NULL, bytes); /* the third in place */
            assert_int_equal(be->iface->swiglu_clamped(be, dout, da, db, n, alpha, limit),
                             CAIRN_OK);
            got[k] = kt_host(be, dout, bytes);
            if (dout != da)
                be->iface->free(be, dout);
            be->iface->free(be, da);
            be->iface->free(be, db);
        }
        KT_SAME_BYTES(got[0], got[1], bytes, "swiglu_clamped 1 vs 3 threads");
        KT_SAME_BYTES(got[0], got[2], bytes, "swiglu_clamped in place");
        for (size_t i = 0; i < n; i++) {
            const double g = fmin(a[i], limit), u = fmax(-limit, fmin(b[i], limit));
            const double act = g / (1.0 + exp(-(double)alpha * g));
            const double want = act * (u + 1.0);
            KT_CLOSE(got[0][i], want,
                     20 * FLT_EPSILON * fabs(want) + 2 * FLT_EPSILON * fabs(act) * (fabs(u) + 1) +
                         1e-37,
                     "swiglu_clamped", i);
        }
        for (int k = 0; k < 3; k++)
            free(got[k]);
        free(a);
        free(b);
    }
    float x = 1;
    assert_int_equal(be1->iface->swiglu_clamped(be1, &x, &x, &x, 1, alpha, 0.0f), CAIRN_EINVAL);
    assert_int_equal(be1->iface->swiglu_clamped(be1, NULL, &x, &x, 1, alpha, limit), CAIRN_EINVAL);
}

/* softmax. Per entry, x_i - max rounds (<= u |x_i - max|) and expf adds ~u,
 * so each exponent carries a relative error delta_i <= u (|x_i - max| + 2);
 * the normaliser (summed in double) carries at most max_j delta_j, and the
 * final scaling one more u. Tolerance:
 *     p_i * FLT_EPSILON * (|x_i - max| + max_j |x_j - max| + 4),
 * with FLT_EPSILON = 2u for margin, plus 1e-37 for entries that underflow. */
static void check_softmax(const float *x, int T, int n)
{
    const size_t bytes = sizeof(float) * (size_t)T * (size_t)n;
    float *got[2];
    cairn_backend *bes[2] = {be1, be3};
    for (int b = 0; b < 2; b++) {
        float *dx = kt_dev(bes[b], x, bytes);
        assert_int_equal(bes[b]->iface->softmax(bes[b], dx, T, n), CAIRN_OK);
        got[b] = kt_host(bes[b], dx, bytes);
        bes[b]->iface->free(bes[b], dx);
    }
    KT_SAME_BYTES(got[0], got[1], bytes, "softmax 1 vs 3 threads");
    for (int t = 0; t < T; t++) {
        const float *row = x + (size_t)t * n;
        const float *out = got[0] + (size_t)t * n;
        double max = -INFINITY;
        for (int i = 0; i < n; i++)
            max = row[i] > max ? row[i] : max;
        if (max == -INFINITY) {
            for (int i = 0; i < n; i++)
                KT_CLOSE(out[i], 0.0, 0.0, "softmax of all -inf", (long long)t * n + i);
            continue;
        }
        double z = 0.0, spread = 0.0;
        for (int i = 0; i < n; i++) {
            z += exp(row[i] - max);
            if (isfinite(row[i]))
                spread = fmax(spread, max - row[i]);
        }
        double total = 0.0;
        for (int i = 0; i < n; i++) {
            double want = exp(row[i] - max) / z;
            double dist = isfinite(row[i]) ? max - row[i] : 0.0;
            KT_CLOSE(out[i], want, want * FLT_EPSILON * (dist + spread + 4) + 1e-37, "softmax",
                     (long long)t * n + i);
            total += out[i];
        }
        KT_CLOSE(total, 1.0, n * FLT_EPSILON, "softmax row sum", t);
    }
    free(got[0]);
    free(got[1]);
}

static void test_softmax(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("softmax");
    enum { T = 6, N = 37 };
    float x[T * N];
    kt_fill(&rng, x, (size_t)T * N, -6, 6);
    for (int i = 0; i < N; i++)
        x[1 * N + i] = kt_uniform(&rng, 1000, 1010); /* would overflow a naive exp */
    x[2 * N + 3] = -INFINITY;                        /* masked entries */
    x[2 * N + 30] = -INFINITY;
    for (int i = 0; i < N; i++)
        x[3 * N + i] = -INFINITY;                    /* nothing visible: all zeros */
    for (int i = 0; i < N; i++)
        x[4 * N + i] = 0.5f;                         /* uniform */
    x[5 * N + 0] = 88.0f;                            /* one dominant entry */
    check_softmax(x, T, N);

    /* many long rows, split over threads */
    enum { BIG_T = 64, BIG_N = 1000 };
    float *big = kt_xmalloc(sizeof(float) * BIG_T * BIG_N);
    kt_fill(&rng, big, (size_t)BIG_T * BIG_N, -20, 20);
    check_softmax(big, BIG_T, BIG_N);
    check_softmax(big, 1, 1); /* a single entry: probability 1 */
    free(big);
}

/* ---- bad arguments ----------------------------------------------------- */

static void test_bad_arguments(void **state)
{
    (void)state;
    cairn_backend *be = be3;
    const cairn_backend_iface *f = be->iface;
    float buf[256] = {0}, y[64] = {0}, w[64] = {0};
    uint8_t q[64 * 34] = {0};
    int32_t ids[2] = {0, 1}, bad_ids[2] = {0, -1}, pos[2] = {0, 1};

    /* get_rows */
    assert_int_equal(f->get_rows(be, NULL, q, CAIRN_TYPE_Q8_0, 32, ids, 2), CAIRN_EINVAL);
    assert_int_equal(f->get_rows(be, buf, NULL, CAIRN_TYPE_Q8_0, 32, ids, 2), CAIRN_EINVAL);
    assert_int_equal(f->get_rows(be, buf, q, CAIRN_TYPE_Q8_0, 32, NULL, 2), CAIRN_EINVAL);
    assert_int_equal(f->get_rows(be, buf, q, CAIRN_TYPE_Q8_0, 33, ids, 2), CAIRN_EINVAL);
    assert_int_equal(f->get_rows(be, buf, q, CAIRN_TYPE_Q8_0, 32, ids, 0), CAIRN_EINVAL);
    assert_int_equal(f->get_rows(be, buf, q, CAIRN_TYPE_Q8_0, 0, ids, 2), CAIRN_EINVAL);
    assert_int_equal(f->get_rows(be, buf, q, CAIRN_TYPE_Q8_0, 32, bad_ids, 2), CAIRN_EINVAL);
    assert_int_equal(f->get_rows(be, buf, q, CAIRN_TYPE_Q2_K, 256, ids, 1), CAIRN_EINVAL);
    assert_int_equal(f->get_rows(be, buf, q, (cairn_type)99, 32, ids, 1), CAIRN_EINVAL);

    /* matmul */
    assert_int_equal(f->matmul(be, NULL, q, CAIRN_TYPE_Q4_0, buf, 1, 64, 2), CAIRN_EINVAL);
    assert_int_equal(f->matmul(be, y, NULL, CAIRN_TYPE_Q4_0, buf, 1, 64, 2), CAIRN_EINVAL);
    assert_int_equal(f->matmul(be, y, q, CAIRN_TYPE_Q4_0, NULL, 1, 64, 2), CAIRN_EINVAL);
    assert_int_equal(f->matmul(be, y, q, CAIRN_TYPE_Q4_0, buf, 1, 48, 2), CAIRN_EINVAL);
    assert_int_equal(f->matmul(be, y, q, CAIRN_TYPE_Q8_0, buf, 1, 31, 2), CAIRN_EINVAL);
    assert_int_equal(f->matmul(be, y, q, CAIRN_TYPE_Q4_0, buf, 0, 64, 2), CAIRN_EINVAL);
    assert_int_equal(f->matmul(be, y, q, CAIRN_TYPE_Q4_0, buf, 1, 0, 2), CAIRN_EINVAL);
    assert_int_equal(f->matmul(be, y, q, CAIRN_TYPE_Q4_0, buf, 1, 64, -3), CAIRN_EINVAL);
    assert_int_equal(f->matmul(be, y, q, CAIRN_TYPE_Q2_K, buf, 1, 256, 1), CAIRN_EINVAL);
    assert_int_equal(f->matmul(be, buf, q, CAIRN_TYPE_F32, buf, 1, 4, 2), CAIRN_EINVAL); /* y == x */

    /* rmsnorm */
    assert_int_equal(f->rmsnorm(be, NULL, buf, w, 1, 8, 1e-5f), CAIRN_EINVAL);
    assert_int_equal(f->rmsnorm(be, y, NULL, w, 1, 8, 1e-5f), CAIRN_EINVAL);
    assert_int_equal(f->rmsnorm(be, y, buf, NULL, 1, 8, 1e-5f), CAIRN_EINVAL);
    assert_int_equal(f->rmsnorm(be, y, buf, w, 0, 8, 1e-5f), CAIRN_EINVAL);
    assert_int_equal(f->rmsnorm(be, y, buf, w, 1, -8, 1e-5f), CAIRN_EINVAL);
    assert_int_equal(f->rmsnorm(be, y, buf, w, 1, 8, -1.0f), CAIRN_EINVAL);
    assert_int_equal(f->rmsnorm(be, y, buf, w, 1, 8, NAN), CAIRN_EINVAL);

    /* rope */
    cairn_rope_params p = {.n_rot = 8, .mode = CAIRN_ROPE_NEOX, .freq_base = 10000.0f,
                           .freq_scale = 1.0f};
    assert_int_equal(f->rope(be, buf, 2, 2, 8, pos, &p), CAIRN_OK);
    assert_int_equal(f->rope(be, NULL, 2, 2, 8, pos, &p), CAIRN_EINVAL);
    assert_int_equal(f->rope(be, buf, 2, 2, 8, NULL, &p), CAIRN_EINVAL);
    assert_int_equal(f->rope(be, buf, 2, 2, 8, pos, NULL), CAIRN_EINVAL);
    assert_int_equal(f->rope(be, buf, 0, 2, 8, pos, &p), CAIRN_EINVAL);
    assert_int_equal(f->rope(be, buf, 2, 0, 8, pos, &p), CAIRN_EINVAL);
    assert_int_equal(f->rope(be, buf, 2, 2, 6, pos, &p), CAIRN_EINVAL); /* n_rot > head_dim */
    cairn_rope_params bad = p;
    bad.n_rot = 7;
    assert_int_equal(f->rope(be, buf, 2, 2, 8, pos, &bad), CAIRN_EINVAL);
    bad.n_rot = 0;
    assert_int_equal(f->rope(be, buf, 2, 2, 8, pos, &bad), CAIRN_EINVAL);
    bad = p;
    bad.mode = (cairn_rope_mode)1;
    assert_int_equal(f->rope(be, buf, 2, 2, 8, pos, &bad), CAIRN_EINVAL);
    bad = p;
    bad.freq_base = 0.0f;
    assert_int_equal(f->rope(be, buf, 2, 2, 8, pos, &bad), CAIRN_EINVAL);
    bad = p;
    bad.freq_scale = -1.0f;
    assert_int_equal(f->rope(be, buf, 2, 2, 8, pos, &bad), CAIRN_EINVAL);

    /* element-wise */
    assert_int_equal(f->swiglu(be, NULL, buf, buf, 4), CAIRN_EINVAL);
    assert_int_equal(f->swiglu(be, y, NULL, buf, 4), CAIRN_EINVAL);
    assert_int_equal(f->swiglu(be, y, buf, NULL, 4), CAIRN_EINVAL);
    assert_int_equal(f->swiglu(be, y, buf, buf, 0), CAIRN_EINVAL);
    assert_int_equal(f->add(be, NULL, buf, buf, 4), CAIRN_EINVAL);
    assert_int_equal(f->add(be, y, buf, NULL, 4), CAIRN_EINVAL);
    assert_int_equal(f->add(be, y, buf, buf, 0), CAIRN_EINVAL);
    assert_int_equal(f->softmax(be, NULL, 1, 4), CAIRN_EINVAL);
    assert_int_equal(f->softmax(be, buf, 0, 4), CAIRN_EINVAL);
    assert_int_equal(f->softmax(be, buf, 1, -4), CAIRN_EINVAL);
}

int main(void)
{
    kt_init_seed("kernels_cpu_ops");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create),
        cmocka_unit_test(test_pool_lifecycle),
        cmocka_unit_test(test_memory),
        cmocka_unit_test(test_get_rows),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_swiglu_clamped),
        cmocka_unit_test(test_rope_pairing),
        cmocka_unit_test(test_swiglu_add),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, setup_backends, teardown_backends);
}
