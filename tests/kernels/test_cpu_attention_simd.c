/*
 * tests/kernels/test_cpu_attention_simd.c — the vector attention kernel
 * (AVX-512: one item per query row and KV head, the K/V rows converted once
 * for the whole GQA group) against the scalar kernel, which
 * test_cpu_attention.c checks against a double reference.
 *
 * test_cpu_attention.c uses head_dim 20, which the vector kernel does not
 * take (it needs a multiple of 16); this test uses the shapes real models
 * have (head_dim 64, 3 query heads per KV head, 16-token pages scattered in
 * the pool), causal and masked, F16 and F32 KV. On a machine without
 * AVX-512 both backends run the scalar kernel and agree trivially.
 *
 * Tolerance: each kernel is within tol_ref = max|v| (2 delta + (n + 4) eps)
 * of the exact result (the bound derived in test_cpu_attention.c, with
 * delta = (head_dim + 2) eps max_j S_j), so the two are within 2 tol_ref of
 * each other; the 1- and 3-thread vector results must agree bitwise.
 *
 * q_start: the same five query rows split into two sequences listed out of
 * row order (the second sequence's rows come first in q / out), so q_start
 * is not the running sum of n_q. Each row's computation is unchanged, so
 * every backend must give the single-sequence result bit for bit.
 *
 * Long contexts (the vector kernel's tiles of 16 keys and chunks of 512):
 * Qwen2.5's shape (14 query heads on 2 KV heads, head_dim 64) and a
 * 128-wide one, 1,300 keys (three chunks, a partial last tile), 40 causal
 * rows (several row blocks) or a random mask, against the scalar kernel;
 * and the same request never changes its bits with how it is cut: each row
 * alone (a decode step: its chunks run as separate items and are folded)
 * equals that row inside the 40-row call (one item per row block), at 1
 * and 3 threads.
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

enum { N_LAYER = 2, LAYER = 1, N_KV_HEAD = 2, HEAD_DIM = 64, N_HEAD = 6, PAGE = 16,
       N_PAGES = 8, N_KV = 40, N_Q = 5 };

/* Fill a pool with N_KV random K/V rows for LAYER, run one attention call
 * and return the output [N_Q][N_HEAD * HEAD_DIM]. Same rng seed -> same
 * data on every backend. */
static float *run(cairn_backend *be, cairn_type dtype, uint64_t seed, int masked, int split,
                  float *max_v, float *max_s)
{
    kt_rng rng = {seed};
    cairn_kv_layout L;
    assert_int_equal(cairn_kv_layout_init(&L, N_LAYER, N_KV_HEAD, HEAD_DIM, PAGE, dtype), CAIRN_OK);
    const int width = N_KV_HEAD * HEAD_DIM, qw = N_HEAD * HEAD_DIM;
    float *k = kt_xmalloc(sizeof(float) * N_KV * width), *v = kt_xmalloc(sizeof(float) * N_KV * width);
    float *q = kt_xmalloc(sizeof(float) * N_Q * qw);
    kt_fill(&rng, k, (size_t)N_KV * width, -1, 1);
    kt_fill(&rng, v, (size_t)N_KV * width, -1, 1);
    kt_fill(&rng, q, (size_t)N_Q * qw, -1, 1);
    const int32_t pages[3] = {5, 0, 3}; /* ceil(40 / 16) scattered pages */
    int32_t slots[N_KV], q_index[N_Q];
    for (int j = 0; j < N_KV; j++)
        slots[j] = pages[j / PAGE] * PAGE + j % PAGE;
    for (int i = 0; i < N_Q; i++)
        q_index[i] = N_KV - N_Q + i;
    uint8_t mask[N_Q * N_KV];
    for (int i = 0; i < N_Q * N_KV; i++)
        mask[i] = (uint8_t)(kt_below(&rng, 3) != 0);
    memset(mask + N_KV, 0, N_KV); /* row 1 sees nothing: all-zero output */

    /* largest |v| and largest scaled sum |q k| over the data (for the bound) */
    const float scale = 1.0f / 8.0f;
    *max_v = 0;
    *max_s = 0;
    for (int j = 0; j < N_KV * width; j++)
        *max_v = fmaxf(*max_v, fabsf(v[j]));
    for (int i = 0; i < N_Q; i++)
        for (int h = 0; h < N_HEAD; h++)
            for (int j = 0; j < N_KV; j++) {
                float s = 0;
                for (int d = 0; d < HEAD_DIM; d++)
                    s += fabsf(q[(i * N_HEAD + h) * HEAD_DIM + d] *
                               k[j * width + (h / 3) * HEAD_DIM + d]);
                *max_s = fmaxf(*max_s, s * scale);
            }

    void *pool = kt_dev(be, NULL, L.page_bytes * N_PAGES);
    float *dk = kt_dev(be, k, sizeof(float) * N_KV * width);
    float *dv = kt_dev(be, v, sizeof(float) * N_KV * width);
    float *dq = kt_dev(be, q, sizeof(float) * N_Q * qw);
    float *dout = kt_dev(be, NULL, sizeof(float) * N_Q * qw);
    assert_int_equal(be->iface->kv_store(be, pool, &L, LAYER, dk, dv, slots, N_KV), CAIRN_OK);
    cairn_attn_seq seq[2] = {{.q_start = 0, .n_q = N_Q, .n_kv = N_KV, .q_index = q_index,
                              .pages = pages, .mask = masked ? mask : NULL}};
    if (split) {
        /* rows 2..4 listed first, then rows 0..1: q_start 2, then 0 */
        seq[0] = (cairn_attn_seq){.q_start = 2, .n_q = N_Q - 2, .n_kv = N_KV,
                                  .q_index = q_index + 2, .pages = pages,
                                  .mask = masked ? mask + 2 * N_KV : NULL};
        seq[1] = (cairn_attn_seq){.q_start = 0, .n_q = 2, .n_kv = N_KV, .q_index = q_index,
                                  .pages = pages, .mask = masked ? mask : NULL};
    }
    cairn_attn_args a = {.out = dout, .q = dq, .kv_pool = pool, .kv = &L, .layer = LAYER,
                         .n_head = N_HEAD, .scale = scale, .n_seqs = split ? 2 : 1, .seqs = seq};
    assert_int_equal(be->iface->attention(be, &a), CAIRN_OK);
    float *out = kt_host(be, dout, sizeof(float) * N_Q * qw);
    be->iface->free(be, dout);
    be->iface->free(be, dq);
    be->iface->free(be, dv);
    be->iface->free(be, dk);
    be->iface->free(be, pool);
    free(q);
    free(v);
    free(k);
    return out;
}

static void test_vector_matches_scalar(void **state)
{
    (void)state;
    kt_rng seeds = kt_rng_for("attention_simd");
    cairn_backend *scalar = kt_cpu_isa("scalar", 1, 0);
    cairn_backend *vec1 = kt_cpu_isa("avx512", 1, 0);
    cairn_backend *vec3 = kt_cpu_isa("avx512", 3, 0);
    const cairn_type dtypes[2] = {CAIRN_TYPE_F16, CAIRN_TYPE_F32};
    const size_t n = (size_t)N_Q * N_HEAD * HEAD_DIM;
    for (int di = 0; di < 2; di++)
        for (int masked = 0; masked <= 1; masked++) {
            const uint64_t seed = kt_next(&seeds);
            float max_v, max_s;
            float *want = run(scalar, dtypes[di], seed, masked, 0, &max_v, &max_s);
            float *got = run(vec1, dtypes[di], seed, masked, 0, &max_v, &max_s);
            float *got3 = run(vec3, dtypes[di], seed, masked, 0, &max_v, &max_s);
            char what[64];
            snprintf(what, sizeof what, "attention %s%s", cairn_type_get(dtypes[di])->name,
                     masked ? " masked" : "");
            KT_SAME_BYTES(got, got3, n * sizeof(float), what);
            const double delta = (HEAD_DIM + 2) * (double)FLT_EPSILON * max_s;
            const double tol = 2 * max_v * (2 * delta + (N_KV + 4) * (double)FLT_EPSILON);
            for (size_t i = 0; i < n; i++)
                KT_CLOSE(got[i], want[i], tol, what, (long long)i);
            if (masked) /* query row 1 sees nothing */
                for (int i = 0; i < N_HEAD * HEAD_DIM; i++)
                    KT_CLOSE(got[N_HEAD * HEAD_DIM + i], 0.0, 0.0, what, i);
            free(want);
            free(got);
            free(got3);
        }
    cairn_backend_destroy(scalar);
    cairn_backend_destroy(vec1);
    cairn_backend_destroy(vec3);
}

/* Sequences out of row order: every backend writes each row where its own
 * q_start puts it (the vector kernel once used the flattened row). */
static void test_q_start_not_cumulative(void **state)
{
    (void)state;
    kt_rng seeds = kt_rng_for("attention_simd_q_start");
    cairn_backend *be[3] = {kt_cpu_isa("scalar", 1, 0), kt_cpu_isa("avx512", 1, 0),
                            kt_cpu_isa("avx512", 3, 0)};
    const char *names[3] = {"scalar", "avx512 x1", "avx512 x3"};
    const size_t bytes = (size_t)N_Q * N_HEAD * HEAD_DIM * sizeof(float);
    for (int masked = 0; masked <= 1; masked++) {
        const uint64_t seed = kt_next(&seeds);
        for (int b = 0; b < 3; b++) {
            float max_v, max_s;
            float *one = run(be[b], CAIRN_TYPE_F16, seed, masked, 0, &max_v, &max_s);
            float *split = run(be[b], CAIRN_TYPE_F16, seed, masked, 1, &max_v, &max_s);
            char what[80];
            snprintf(what, sizeof what, "%s%s: two sequences out of row order vs one",
                     names[b], masked ? " masked" : "");
            KT_SAME_BYTES(split, one, bytes, what);
            free(one);
            free(split);
        }
    }
    for (int b = 0; b < 3; b++)
        cairn_backend_destroy(be[b]);
}

/* ---- long contexts ---------------------------------------------------- */

typedef struct {
    int n_kv_head, head_dim, n_head, n_kv, n_q;
    cairn_type dtype;
    int masked;
    int window; /* a sliding window of that many keys, or 0 */
    int sinks;  /* with attention sinks (long_sinks), or without */
} long_shape;

/* A sink per query head (gpt-oss), host memory as the CPU backend's is:
 * around the scores, one far above them and one far below. */
static const float *long_sinks(int n_head)
{
    static float s[64];
    for (int h = 0; h < n_head && h < 64; h++)
        s[h] = (float)(h % 5) - 2.0f;
    s[0] = 50.0f;
    s[n_head - 1] = -60.0f;
    return s;
}

/* The KV of `sh` written once into a pool; q for every row. */
typedef struct {
    cairn_kv_layout L;
    void *pool;
    float *dq;     /* device [n_q][n_head * head_dim] */
    int32_t *pages;
    uint8_t *mask; /* [n_q][n_kv] or NULL */
    float max_v, max_s;
} long_data;

/* bounds: also find max_v and max_s (for the tolerance; costly, so once per shape) */
static void long_data_make(cairn_backend *be, const long_shape *sh, uint64_t seed, int bounds,
                           long_data *d)
{
    kt_rng rng = {seed};
    assert_int_equal(cairn_kv_layout_init(&d->L, 1, sh->n_kv_head, sh->head_dim, PAGE, sh->dtype),
                     CAIRN_OK);
    const int width = sh->n_kv_head * sh->head_dim, qw = sh->n_head * sh->head_dim;
    const int n_pages = (sh->n_kv + PAGE - 1) / PAGE;
    float *k = kt_xmalloc(sizeof(float) * (size_t)sh->n_kv * width);
    float *v = kt_xmalloc(sizeof(float) * (size_t)sh->n_kv * width);
    float *q = kt_xmalloc(sizeof(float) * (size_t)sh->n_q * qw);
    kt_fill(&rng, k, (size_t)sh->n_kv * width, -1, 1);
    kt_fill(&rng, v, (size_t)sh->n_kv * width, -1, 1);
    kt_fill(&rng, q, (size_t)sh->n_q * qw, -1, 1);
    d->pages = kt_xmalloc(sizeof(int32_t) * n_pages);
    for (int p = 0; p < n_pages; p++) /* scattered: page p lives at (p * 37) mod n, a permutation */
        d->pages[p] = (int32_t)(((int64_t)p * 37) % n_pages);
    int32_t *slots = kt_xmalloc(sizeof(int32_t) * sh->n_kv);
    for (int j = 0; j < sh->n_kv; j++)
        slots[j] = d->pages[j / PAGE] * PAGE + j % PAGE;
    d->mask = NULL;
    if (sh->masked) {
        d->mask = kt_xmalloc((size_t)sh->n_q * sh->n_kv);
        for (size_t i = 0; i < (size_t)sh->n_q * sh->n_kv; i++)
            d->mask[i] = (uint8_t)(kt_below(&rng, 4) != 0);
        memset(d->mask + 3 * (size_t)sh->n_kv, 0, sh->n_kv); /* row 3 sees nothing */
        memset(d->mask + 5 * (size_t)sh->n_kv + 520, 0, 700); /* row 5: a chunk with nothing */
    }
    const float scale = 1.0f / sqrtf((float)sh->head_dim);
    d->max_v = 0;
    d->max_s = 0;
    for (size_t j = 0; j < (size_t)sh->n_kv * width; j++)
        d->max_v = fmaxf(d->max_v, fabsf(v[j]));
    const int group = sh->n_head / sh->n_kv_head;
    for (int i = 0; i < (bounds ? sh->n_q : 0); i++)
        for (int h = 0; h < sh->n_head; h++)
            for (int j = 0; j < sh->n_kv; j++) {
                float s = 0;
                for (int e = 0; e < sh->head_dim; e++)
                    s += fabsf(q[((size_t)i * sh->n_head + h) * sh->head_dim + e] *
                               k[(size_t)j * width + (h / group) * sh->head_dim + e]);
                d->max_s = fmaxf(d->max_s, s * scale);
            }
    d->pool = kt_dev(be, NULL, d->L.page_bytes * n_pages);
    float *dk = kt_dev(be, k, sizeof(float) * (size_t)sh->n_kv * width);
    float *dv = kt_dev(be, v, sizeof(float) * (size_t)sh->n_kv * width);
    d->dq = kt_dev(be, q, sizeof(float) * (size_t)sh->n_q * qw);
    assert_int_equal(be->iface->kv_store(be, d->pool, &d->L, 0, dk, dv, slots, sh->n_kv), CAIRN_OK);
    be->iface->free(be, dk);
    be->iface->free(be, dv);
    free(slots);
    free(q);
    free(v);
    free(k);
}

static void long_data_free(cairn_backend *be, long_data *d)
{
    be->iface->free(be, d->pool);
    be->iface->free(be, d->dq);
    free(d->pages);
    free(d->mask);
}

/* Rows [r0, r0 + n) of the request in one call (causal rows sit at the last
 * n_q indices of the context); the output of those rows. */
static float *long_run(cairn_backend *be, const long_shape *sh, const long_data *d, int r0, int n)
{
    const int qw = sh->n_head * sh->head_dim;
    int32_t *q_index = kt_xmalloc(sizeof(int32_t) * n);
    for (int i = 0; i < n; i++)
        q_index[i] = sh->n_kv - sh->n_q + r0 + i;
    float *dout = kt_dev(be, NULL, sizeof(float) * (size_t)n * qw);
    cairn_attn_seq seq = {.q_start = 0, .n_q = n, .n_kv = sh->n_kv, .q_index = q_index,
                          .pages = d->pages,
                          .mask = d->mask ? d->mask + (size_t)r0 * sh->n_kv : NULL};
    cairn_attn_args a = {.out = dout, .q = d->dq + (size_t)r0 * qw, .kv_pool = d->pool, .kv = &d->L,
                         .layer = 0, .n_head = sh->n_head,
                         .scale = 1.0f / sqrtf((float)sh->head_dim), .n_seqs = 1, .seqs = &seq,
                         .window = sh->window,
                         .sinks = sh->sinks ? long_sinks(sh->n_head) : NULL};
    assert_int_equal(be->iface->attention(be, &a), CAIRN_OK);
    float *out = kt_host(be, dout, sizeof(float) * (size_t)n * qw);
    be->iface->free(be, dout);
    free(q_index);
    return out;
}

static void test_long_context(void **state)
{
    (void)state;
    kt_rng seeds = kt_rng_for("attention_simd_long");
    cairn_backend *scalar = kt_cpu_isa("scalar", 1, 0);
    cairn_backend *vec[2] = {kt_cpu_isa("avx512", 1, 0), kt_cpu_isa("avx512", 3, 0)};
    const long_shape shapes[] = {
        {2, 64, 14, 1300, 40, CAIRN_TYPE_F16, 0, 0, 0},
        {2, 64, 14, 1300, 40, CAIRN_TYPE_F16, 1, 0, 0},
        {2, 64, 14, 1300, 40, CAIRN_TYPE_F32, 0, 0, 0},
        {4, 128, 8, 1100, 20, CAIRN_TYPE_F16, 0, 0, 0},
        {1, 96, 3, 700, 9, CAIRN_TYPE_F16, 1, 0, 0},
        /* sliding windows: rows whose window starts past chunk 0 and inside
         * chunk 1 (600 keys over 1300), and one starting mid-tile with a mask */
        {2, 64, 14, 1300, 40, CAIRN_TYPE_F16, 0, 600, 0},
        {4, 128, 8, 1100, 20, CAIRN_TYPE_F32, 0, 517, 0},
        {1, 96, 3, 700, 9, CAIRN_TYPE_F16, 1, 37, 0},
        /* attention sinks, with a window and a mask too */
        {2, 64, 14, 1300, 40, CAIRN_TYPE_F16, 0, 0, 1},
        {4, 64, 8, 700, 20, CAIRN_TYPE_F32, 1, 128, 1},
    };
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const long_shape *sh = &shapes[si];
        const uint64_t seed = kt_next(&seeds);
        const size_t qw = (size_t)sh->n_head * sh->head_dim, n = (size_t)sh->n_q * qw;
        char what[160];
        long_data ds;
        long_data_make(scalar, sh, seed, 1, &ds);
        float *want = long_run(scalar, sh, &ds, 0, sh->n_q);
        long_data_free(scalar, &ds);
        float *whole[2];
        for (int b = 0; b < 2; b++) {
            long_data dv;
            long_data_make(vec[b], sh, seed, 0, &dv);
            whole[b] = long_run(vec[b], sh, &dv, 0, sh->n_q);
            snprintf(what, sizeof what, "shape %zu (%s%s%s, window %d) x%d: vector vs scalar", si,
                     cairn_type_get(sh->dtype)->name, sh->masked ? " masked" : "",
                     sh->sinks ? " sinks" : "", sh->window, b ? 3 : 1);
            const double delta = (sh->head_dim + 2) * (double)FLT_EPSILON * ds.max_s;
            const double tol = 2 * ds.max_v * (2 * delta + (sh->n_kv + 4) * (double)FLT_EPSILON);
            for (size_t i = 0; i < n; i++)
                KT_CLOSE(whole[b][i], want[i], tol, what, (long long)i);
            if (sh->masked) /* row 3 sees nothing */
                for (size_t i = 0; i < qw; i++)
                    KT_CLOSE(whole[b][3 * qw + i], 0.0, 0.0, what, (long long)i);
            /* every row alone, bit for bit as inside the whole call */
            for (int r = 0; r < sh->n_q; r++) {
                float *one = long_run(vec[b], sh, &dv, r, 1);
                snprintf(what, sizeof what, "shape %zu x%d: row %d alone vs in %d rows", si,
                         b ? 3 : 1, r, sh->n_q);
                KT_SAME_BYTES(one, whole[b] + (size_t)r * qw, qw * sizeof(float), what);
                free(one);
            }
            /* and rows 5 .. 21 as one call (a block that does not start on a block boundary) */
            const int r0 = 5, cnt = sh->n_q - r0 < 17 ? sh->n_q - r0 : 17;
            float *part = long_run(vec[b], sh, &dv, r0, cnt);
            snprintf(what, sizeof what, "shape %zu x%d: rows %d..%d vs in %d rows", si, b ? 3 : 1,
                     r0, r0 + cnt - 1, sh->n_q);
            KT_SAME_BYTES(part, whole[b] + (size_t)r0 * qw, (size_t)cnt * qw * sizeof(float), what);
            free(part);
            long_data_free(vec[b], &dv);
        }
        snprintf(what, sizeof what, "shape %zu: 1 vs 3 threads", si);
        KT_SAME_BYTES(whole[0], whole[1], n * sizeof(float), what);
        free(whole[0]);
        free(whole[1]);
        free(want);
    }
    cairn_backend_destroy(scalar);
    cairn_backend_destroy(vec[0]);
    cairn_backend_destroy(vec[1]);
}

int main(void)
{
    kt_init_seed("kernels_cpu_attention_simd");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vector_matches_scalar),
        cmocka_unit_test(test_q_start_not_cumulative),
        cmocka_unit_test(test_long_context),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
