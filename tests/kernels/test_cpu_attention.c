/*
 * tests/kernels/test_cpu_attention.c — kv_store and paged attention of the
 * CPU backend against a naive double-precision reference.
 *
 * The KV pool is filled through kv_store at slots given by page tables that
 * are random permutations of the pool (so a sequence's pages are scattered
 * and out of order), with different data in the neighbouring layers (so a
 * layer mix-up shows). One attention call covers several sequences of
 * different lengths: single-token decode, a prefill chunk, a query that sees
 * only part of its n_kv, and an EAGLE-style tree under an explicit mask.
 * GQA ratios 1, 2 and 4, F32 and F16 KV. 1 and 3 threads must agree bit for
 * bit.
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

static cairn_backend *be1; /* 1 thread */
static cairn_backend *be3; /* 3 threads */

static int setup_backends(void **state)
{
    (void)state;
    if (cairn_backend_cpu_create(1, &be1) != CAIRN_OK)
        return -1;
    if (cairn_backend_cpu_create(3, &be3) != CAIRN_OK)
        return -1;
    return 0;
}

static int teardown_backends(void **state)
{
    (void)state;
    cairn_backend_destroy(be1);
    cairn_backend_destroy(be3);
    return 0;
}

/* The value a float has after a round trip through the pool's dtype. */
static float stored_value(float v, cairn_type dtype)
{
    return dtype == CAIRN_TYPE_F16 ? cairn_fp16_to_fp32(cairn_fp32_to_fp16(v)) : v;
}

/* Byte offset of (page, layer, K/V, row) computed from the layout described
 * in kernels/backend.h, independently of cairn_kv_offset:
 * page p: [layer 0: K[page_size rows] V[page_size rows]] [layer 1 ...] ... */
static size_t expected_offset(const cairn_kv_layout *L, int page, int layer, int kv, int row)
{
    size_t row_bytes = (size_t)L->n_kv_head * L->head_dim * (L->dtype == CAIRN_TYPE_F32 ? 4 : 2);
    size_t page_bytes = (size_t)L->n_layer * 2 * L->page_size * row_bytes;
    return (size_t)page * page_bytes + ((size_t)(layer * 2 + kv) * L->page_size + row) * row_bytes;
}

/* ---- kv_store ---------------------------------------------------------- */

/* Rows land at exactly the bytes the layout says, converted to the dtype,
 * and nothing else in the pool changes. */
static void check_kv_store(cairn_type dtype, kt_rng *rng)
{
    cairn_kv_layout L;
    assert_int_equal(cairn_kv_layout_init(&L, 2, 3, 5, 3, dtype), CAIRN_OK);
    const int n_pages = 5, n_slots = n_pages * 3, T = 6, width = 3 * 5;
    const size_t pool_bytes = L.page_bytes * n_pages;
    int32_t perm[15], slots[6];
    kt_permutation(rng, perm, n_slots);
    for (int t = 0; t < T; t++)
        slots[t] = perm[t]; /* distinct, scattered */
    float k[6 * 15], v[6 * 15];
    kt_fill(rng, k, (size_t)T * width, -3, 3);
    kt_fill(rng, v, (size_t)T * width, -3, 3);
    /* Values where F16 rounding is delicate, which the vector conversion
     * must round exactly as cairn_fp32_to_fp16: NaNs (with payload and
     * sign), infinities, the overflow edge, subnormal halves and their
     * ties, ties between normal halves, signed zero. */
    const uint32_t special_bits[] = {
        0x7fc00001u, 0xffa00000u, 0x7f800000u, 0xff800000u, 0x477fe000u /* 65504 */,
        0x477fefffu /* just below 65520 */, 0x477ff000u /* 65520 */, 0x33800000u /* 2^-24 */,
        0x33000000u /* 2^-25: tie to 0 */, 0x33c00000u /* 3 2^-25: tie up */, 0x80000000u,
        0x3f801000u /* 1 + 2^-11: tie to even */, 0x3f803000u /* 1 + 3 2^-11 */,
        0x38800000u /* 2^-14, smallest normal half */, 0x387fe000u /* just below */,
        0x0d000000u, 0xc2f6e979u,
    };
    for (size_t i = 0; i < sizeof special_bits / sizeof special_bits[0]; i++)
        memcpy(&k[i], &special_bits[i], 4);

    uint8_t *want = kt_xmalloc(pool_bytes);
    cairn_backend *bes[2] = {be1, be3};
    uint8_t *got[2];
    for (int b = 0; b < 2; b++) {
        cairn_backend *be = bes[b];
        void *pool = kt_dev(be, NULL, pool_bytes);
        float *dk = kt_dev(be, k, sizeof k), *dv = kt_dev(be, v, sizeof v);
        for (int layer = 0; layer < 2; layer++) {
            /* layer 1 gets the rows in reverse order: different data */
            if (layer == 1) {
                float kr[6 * 15], vr[6 * 15];
                for (int t = 0; t < T; t++) {
                    memcpy(kr + t * width, k + (T - 1 - t) * width, sizeof(float) * width);
                    memcpy(vr + t * width, v + (T - 1 - t) * width, sizeof(float) * width);
                }
                assert_int_equal(be->iface->upload(be, dk, kr, sizeof kr), CAIRN_OK);
                assert_int_equal(be->iface->upload(be, dv, vr, sizeof vr), CAIRN_OK);
            }
            assert_int_equal(be->iface->kv_store(be, pool, &L, layer, dk, dv, slots, T), CAIRN_OK);
        }
        got[b] = kt_host(be, pool, pool_bytes);
        be->iface->free(be, dk);
        be->iface->free(be, dv);
        be->iface->free(be, pool);
    }

    for (int layer = 0; layer < 2; layer++) {
        for (int t = 0; t < T; t++) {
            const int src = layer == 0 ? t : T - 1 - t;
            const int page = slots[t] / 3, row = slots[t] % 3;
            for (int kv = 0; kv < 2; kv++) {
                const float *vals = (kv == 0 ? k : v) + src * width;
                uint8_t *dst = want + expected_offset(&L, page, layer, kv, row);
                for (int i = 0; i < width; i++) {
                    if (dtype == CAIRN_TYPE_F32) {
                        memcpy(dst + 4 * i, &vals[i], 4);
                    } else {
                        uint16_t h = cairn_fp32_to_fp16(vals[i]);
                        memcpy(dst + 2 * i, &h, 2);
                    }
                }
            }
        }
    }
    KT_SAME_BYTES(got[0], want, pool_bytes, "kv_store pool image");
    KT_SAME_BYTES(got[1], want, pool_bytes, "kv_store pool image, 3 threads");
    free(got[0]);
    free(got[1]);
    free(want);
}

static void test_kv_store(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("kv_store");
    for (int rep = 0; rep < 3; rep++) {
        check_kv_store(CAIRN_TYPE_F32, &rng);
        check_kv_store(CAIRN_TYPE_F16, &rng);
    }
}

/* ---- attention --------------------------------------------------------- */

enum { N_LAYER = 3, LAYER = 1, N_KV_HEAD = 2, HEAD_DIM = 20, PAGE_SIZE = 4, N_PAGES = 48 };

/* One sequence of the test batch: its KV values (what attention should see,
 * already rounded to the pool's dtype) and its share of the call. */
typedef struct {
    int n_kv, n_q;
    int32_t q_index[16];
    uint8_t *mask;      /* [n_q][n_kv] or NULL */
    int32_t pages[16];
    float *k, *v;       /* [n_kv][N_KV_HEAD * HEAD_DIM], as stored */
} test_seq;

typedef struct {
    cairn_kv_layout L;
    test_seq seqs[6];
    int n_seqs;
    int n_rows;
    uint8_t *pool_host; /* filled pool, copied into each backend */
    size_t pool_bytes;
} test_batch;

/* Build the batch: six sequences, scattered pages, KV written with kv_store
 * (on be1) for layers 0..2, the tested layer holding seq->k / seq->v. */
static void build_batch(test_batch *tb, cairn_type dtype, kt_rng *rng)
{
    memset(tb, 0, sizeof *tb);
    assert_int_equal(cairn_kv_layout_init(&tb->L, N_LAYER, N_KV_HEAD, HEAD_DIM, PAGE_SIZE, dtype),
                     CAIRN_OK);
    /* n_kv and n_q of each sequence:
     *   0: decode of a 1-token sequence
     *   1: a 5-token prefill chunk at the end of 13
     *   2: decode at position 21
     *   3: a 4-token draft tree under a mask (prefix 0..6, tree 7..10)
     *   4: a 16-token prefill chunk, large enough to be split over threads
     *   5: one query that sees only 0..3 of its 9 entries (q_index < n_kv-1) */
    static const int shape[6][2] = {{1, 1}, {13, 5}, {22, 1}, {11, 4}, {30, 16}, {9, 1}};
    tb->n_seqs = 6;
    int32_t perm[N_PAGES];
    kt_permutation(rng, perm, N_PAGES);
    int next_page = 0;
    const int width = N_KV_HEAD * HEAD_DIM;
    for (int s = 0; s < tb->n_seqs; s++) {
        test_seq *sq = &tb->seqs[s];
        sq->n_kv = shape[s][0];
        sq->n_q = shape[s][1];
        tb->n_rows += sq->n_q;
        for (int i = 0; i < sq->n_q; i++)
            sq->q_index[i] = sq->n_kv - sq->n_q + i;
        for (int p = 0; p < (sq->n_kv + PAGE_SIZE - 1) / PAGE_SIZE; p++)
            sq->pages[p] = perm[next_page++];
        sq->k = kt_xmalloc(sizeof(float) * (size_t)sq->n_kv * width);
        sq->v = kt_xmalloc(sizeof(float) * (size_t)sq->n_kv * width);
    }
    tb->seqs[5].q_index[0] = 3;
    /* The tree: row 0 is the root (7); row 1 its child 8; rows 2 and 3 the
     * other branch 9 -> 10. Every row sees the prefix 0..6. q_index is set to
     * something the mask contradicts, to show that the mask replaces it. */
    test_seq *tree = &tb->seqs[3];
    tree->mask = kt_xmalloc((size_t)tree->n_q * tree->n_kv);
    static const int tree_path[4][3] = {{7, -1, -1}, {7, 8, -1}, {7, 9, -1}, {7, 9, 10}};
    for (int i = 0; i < tree->n_q; i++) {
        for (int j = 0; j < 7; j++)
            tree->mask[i * tree->n_kv + j] = 1;
        for (int d = 0; d < 3; d++)
            if (tree_path[i][d] >= 0)
                tree->mask[i * tree->n_kv + tree_path[i][d]] = 1;
        tree->q_index[i] = 10;
    }

    /* Write every layer: the tested one with the sequences' values, the
     * others with unrelated values. */
    int n_tokens = 0;
    for (int s = 0; s < tb->n_seqs; s++)
        n_tokens += tb->seqs[s].n_kv;
    int32_t *slots = kt_xmalloc(sizeof(int32_t) * (size_t)n_tokens);
    float *k = kt_xmalloc(sizeof(float) * (size_t)n_tokens * width);
    float *v = kt_xmalloc(sizeof(float) * (size_t)n_tokens * width);
    tb->pool_bytes = tb->L.page_bytes * N_PAGES;
    void *pool = kt_dev(be1, NULL, tb->pool_bytes);
    for (int layer = 0; layer < N_LAYER; layer++) {
        int t = 0;
        for (int s = 0; s < tb->n_seqs; s++) {
            test_seq *sq = &tb->seqs[s];
            for (int j = 0; j < sq->n_kv; j++, t++) {
                slots[t] = sq->pages[j / PAGE_SIZE] * PAGE_SIZE + j % PAGE_SIZE;
                float *kr = k + (size_t)t * width, *vr = v + (size_t)t * width;
                kt_fill(rng, kr, (size_t)width, -1, 1);
                kt_fill(rng, vr, (size_t)width, -2, 2);
                if (layer == LAYER) {
                    for (int i = 0; i < width; i++) {
                        sq->k[(size_t)j * width + i] = stored_value(kr[i], dtype);
                        sq->v[(size_t)j * width + i] = stored_value(vr[i], dtype);
                    }
                }
            }
        }
        assert_int_equal(be1->iface->kv_store(be1, pool, &tb->L, layer, k, v, slots, n_tokens),
                         CAIRN_OK);
    }
    tb->pool_host = kt_host(be1, pool, tb->pool_bytes);
    be1->iface->free(be1, pool);
    free(slots);
    free(k);
    free(v);
}

static void free_batch(test_batch *tb)
{
    for (int s = 0; s < tb->n_seqs; s++) {
        free(tb->seqs[s].k);
        free(tb->seqs[s].v);
        free(tb->seqs[s].mask);
    }
    free(tb->pool_host);
}

/* Run attention on `be` over the batch; returns host [n_rows][n_head*HEAD_DIM].
 * With in_place, out is the q buffer itself. */
static float *run_attention(cairn_backend *be, const test_batch *tb, const float *q, int n_head,
                            float scale, int in_place, const float *sinks)
{
    const size_t act_bytes = sizeof(float) * (size_t)tb->n_rows * n_head * HEAD_DIM;
    void *pool = kt_dev(be, tb->pool_host, tb->pool_bytes);
    float *dq = kt_dev(be, q, act_bytes);
    float *dout = in_place ? dq : kt_dev(be, NULL, act_bytes);
    cairn_attn_seq seqs[6];
    int row = 0;
    for (int s = 0; s < tb->n_seqs; s++) {
        const test_seq *sq = &tb->seqs[s];
        seqs[s] = (cairn_attn_seq){
            .q_start = row, .n_q = sq->n_q, .n_kv = sq->n_kv, .q_index = sq->q_index,
            .pages = sq->pages, .mask = sq->mask,
        };
        row += sq->n_q;
    }
    cairn_attn_args args = {
        .out = dout, .q = dq, .kv_pool = pool, .kv = &tb->L, .layer = LAYER,
        .n_head = n_head, .scale = scale, .n_seqs = tb->n_seqs, .seqs = seqs,
    };
    float *dsinks = sinks ? kt_dev(be, sinks, sizeof(float) * (size_t)n_head) : NULL;
    args.sinks = dsinks;
    assert_int_equal(be->iface->attention(be, &args), CAIRN_OK);
    if (dsinks)
        be->iface->free(be, dsinks);
    float *out = kt_host(be, dout, act_bytes);
    if (!in_place)
        be->iface->free(be, dout);
    be->iface->free(be, dq);
    be->iface->free(be, pool);
    return out;
}

/* Compare one output against the double reference.
 *
 * Tolerance. Let S_j = scale * sum_d |q_d k_jd| over the visible entries j.
 * Each float score is within delta = (HEAD_DIM + 2) FLT_EPSILON max_j S_j of
 * the exact one (a dot of HEAD_DIM terms plus the scale multiply, with 2x
 * margin as in matmul). Shifting every score by at most delta changes each
 * softmax weight by a factor within e^(+-2 delta), so the output moves by at
 * most ~2 delta max|v|. The float exps, the float sum of n_vis weights and
 * of n_vis weighted V rows, and the final scaling add (n_vis + 4) u relative
 * to max|v|; with FLT_EPSILON for u:
 *     tol = max|v| * (2 delta + (n_vis + 4) FLT_EPSILON). */
static void check_against_reference(const test_batch *tb, const float *q, const float *got,
                                    int n_head, float scale, const float *sinks, const char *what)
{
    const int group = n_head / N_KV_HEAD, width = N_KV_HEAD * HEAD_DIM;
    int row = 0;
    double p[64];
    for (int s = 0; s < tb->n_seqs; s++) {
        const test_seq *sq = &tb->seqs[s];
        for (int i = 0; i < sq->n_q; i++, row++) {
            for (int h = 0; h < n_head; h++) {
                const int kvh = h / group;
                const float *qv = q + ((size_t)row * n_head + h) * HEAD_DIM;
                const float *ov = got + ((size_t)row * n_head + h) * HEAD_DIM;
                double max = -INFINITY, max_s = 0.0, max_v = 0.0;
                int n_vis = 0;
                for (int j = 0; j < sq->n_kv; j++) {
                    int visible = sq->mask ? sq->mask[i * sq->n_kv + j] : j <= sq->q_index[i];
                    if (!visible) {
                        p[j] = -INFINITY;
                        continue;
                    }
                    const float *kv = sq->k + (size_t)j * width + (size_t)kvh * HEAD_DIM;
                    const float *vv = sq->v + (size_t)j * width + (size_t)kvh * HEAD_DIM;
                    double dot = 0.0, abs_dot = 0.0;
                    for (int d = 0; d < HEAD_DIM; d++) {
                        dot += (double)qv[d] * kv[d];
                        abs_dot += fabs((double)qv[d] * kv[d]);
                        max_v = fmax(max_v, fabs(vv[d]));
                    }
                    p[j] = dot * scale;
                    max = fmax(max, p[j]);
                    max_s = fmax(max_s, abs_dot * fabs(scale));
                    n_vis++;
                }
                double z = 0.0;
                for (int j = 0; j < sq->n_kv; j++) {
                    p[j] = isfinite(p[j]) ? exp(p[j] - max) : 0.0;
                    z += p[j];
                }
                /* a sink joins the denominator only (kernels/backend.h);
                 * its exp is the same relative size in the kernel's float */
                if (sinks && n_vis > 0)
                    z += exp((double)sinks[h] - max);
                const double delta = (HEAD_DIM + 2) * FLT_EPSILON * max_s;
                const double tol = max_v * (2 * delta + (n_vis + 4) * FLT_EPSILON);
                for (int d = 0; d < HEAD_DIM; d++) {
                    double want = 0.0;
                    for (int j = 0; j < sq->n_kv; j++)
                        if (p[j] > 0.0)
                            want += p[j] / z * sq->v[(size_t)j * width + (size_t)kvh * HEAD_DIM + d];
                    KT_CLOSE(ov[d], want, tol, what, ((long long)row * n_head + h) * HEAD_DIM + d);
                }
            }
        }
    }
}

static void check_attention(cairn_type dtype, int group, float q_amp, const float *sinks,
                            kt_rng *rng)
{
    test_batch tb;
    build_batch(&tb, dtype, rng);
    const int n_head = N_KV_HEAD * group;
    const size_t n_act = (size_t)tb.n_rows * n_head * HEAD_DIM;
    float *q = kt_xmalloc(sizeof(float) * n_act);
    kt_fill(rng, q, n_act, -q_amp, q_amp);
    const float scale = 1.0f / sqrtf((float)HEAD_DIM);

    char what[96];
    snprintf(what, sizeof what, "attention %s gqa=%d q_amp=%g",
             dtype == CAIRN_TYPE_F16 ? "F16" : "F32", group, q_amp);
    if (sinks)
        strncat(what, " sinks", sizeof what - strlen(what) - 1);
    float *one = run_attention(be1, &tb, q, n_head, scale, 0, sinks);
    float *three = run_attention(be3, &tb, q, n_head, scale, 0, sinks);
    float *in_place = run_attention(be3, &tb, q, n_head, scale, 1, sinks);
    KT_SAME_BYTES(one, three, sizeof(float) * n_act, what);
    KT_SAME_BYTES(one, in_place, sizeof(float) * n_act, "attention with out == q");
    check_against_reference(&tb, q, one, n_head, scale, sinks, what);
    free(one);
    free(three);
    free(in_place);
    free(q);
    free_batch(&tb);
}

static void test_attention(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("attention");
    const cairn_type dtypes[] = {CAIRN_TYPE_F32, CAIRN_TYPE_F16};
    const int groups[] = {1, 2, 4};
    for (int d = 0; d < 2; d++)
        for (int g = 0; g < 3; g++)
            check_attention(dtypes[d], groups[g], 1.0f, NULL, &rng);
    /* Scores in the hundreds: a softmax without the max shift overflows. */
    check_attention(CAIRN_TYPE_F32, 2, 60.0f, NULL, &rng);
    check_attention(CAIRN_TYPE_F16, 4, 60.0f, NULL, &rng);
}

/* Attention sinks (gpt-oss): a logit per query head in the denominator.
 * Sinks around the scores, one far above them (its head's outputs shrink
 * towards zero, and e^{sink - max} would overflow a float without the
 * shift), one far below (no effect), with small and large scores. */
static void test_attention_sinks(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("attention sinks");
    float sinks[8];
    for (int g = 1; g <= 4; g *= 2) {
        kt_fill(&rng, sinks, 8, -2, 2);
        sinks[0] = 120.0f;
        sinks[N_KV_HEAD * g - 1] = -90.0f;
        check_attention(CAIRN_TYPE_F32, g, 1.0f, sinks, &rng);
        check_attention(CAIRN_TYPE_F16, g, 1.0f, sinks, &rng);
        check_attention(CAIRN_TYPE_F32, g, 60.0f, sinks, &rng);
    }
}

/* A query row whose mask hides everything gets zeros (not NaN); its
 * neighbours are unaffected. */
static void test_attention_empty_mask_row(void **state)
{
    (void)state;
    cairn_kv_layout L;
    assert_int_equal(cairn_kv_layout_init(&L, 1, 1, 4, 2, CAIRN_TYPE_F32), CAIRN_OK);
    void *pool = kt_dev(be3, NULL, L.page_bytes * 2);
    const float k[3 * 4] = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0};
    const float v[3 * 4] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    const int32_t pages[2] = {1, 0}, slots[3] = {2, 3, 0};
    assert_int_equal(be3->iface->kv_store(be3, pool, &L, 0, k, v, slots, 3), CAIRN_OK);
    const uint8_t mask[2 * 3] = {0, 0, 0, 0, 1, 0};
    const int32_t q_index[2] = {2, 2};
    float q[2 * 4] = {1, 1, 1, 1, 1, 1, 1, 1}, out[2 * 4];
    memset(out, 0xff, sizeof out);
    cairn_attn_seq seq = {.q_start = 0, .n_q = 2, .n_kv = 3, .q_index = q_index, .pages = pages,
                          .mask = mask};
    cairn_attn_args args = {.out = out, .q = q, .kv_pool = pool, .kv = &L, .layer = 0,
                            .n_head = 1, .scale = 0.5f, .n_seqs = 1, .seqs = &seq};
    assert_int_equal(be3->iface->attention(be3, &args), CAIRN_OK);
    for (int d = 0; d < 4; d++) {
        KT_CLOSE(out[d], 0.0, 0.0, "row with nothing visible", d);
        KT_CLOSE(out[4 + d], v[4 + d], 0.0, "row seeing only entry 1", 4 + d);
    }
    be3->iface->free(be3, pool);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    cairn_backend *be = be3;
    const cairn_backend_iface *f = be->iface;
    cairn_kv_layout L;
    assert_int_equal(cairn_kv_layout_init(&L, 2, 2, 4, 4, CAIRN_TYPE_F16), CAIRN_OK);
    void *pool = kt_dev(be, NULL, L.page_bytes * 4);
    float k[2 * 8] = {0}, v[2 * 8] = {0}, q[4 * 8] = {0}, out[4 * 8];
    int32_t slots[2] = {0, 5}, bad_slots[2] = {0, -5};

    /* kv_store */
    assert_int_equal(f->kv_store(be, pool, &L, 1, k, v, slots, 2), CAIRN_OK);
    assert_int_equal(f->kv_store(be, NULL, &L, 1, k, v, slots, 2), CAIRN_EINVAL);
    assert_int_equal(f->kv_store(be, pool, NULL, 1, k, v, slots, 2), CAIRN_EINVAL);
    assert_int_equal(f->kv_store(be, pool, &L, 2, k, v, slots, 2), CAIRN_EINVAL);
    assert_int_equal(f->kv_store(be, pool, &L, -1, k, v, slots, 2), CAIRN_EINVAL);
    assert_int_equal(f->kv_store(be, pool, &L, 0, NULL, v, slots, 2), CAIRN_EINVAL);
    assert_int_equal(f->kv_store(be, pool, &L, 0, k, NULL, slots, 2), CAIRN_EINVAL);
    assert_int_equal(f->kv_store(be, pool, &L, 0, k, v, NULL, 2), CAIRN_EINVAL);
    assert_int_equal(f->kv_store(be, pool, &L, 0, k, v, slots, 0), CAIRN_EINVAL);
    assert_int_equal(f->kv_store(be, pool, &L, 0, k, v, bad_slots, 2), CAIRN_EINVAL);
    cairn_kv_layout bad = L;
    bad.dtype = CAIRN_TYPE_Q4_K; /* not a KV type */;
    assert_int_equal(f->kv_store(be, pool, &bad, 0, k, v, slots, 2), CAIRN_EINVAL);
    bad = L;
    bad.row_bytes += 2; /* inconsistent with the shape */
    assert_int_equal(f->kv_store(be, pool, &bad, 0, k, v, slots, 2), CAIRN_EINVAL);

    /* attention: start from a valid call, break one thing at a time */
    int32_t q_index[4] = {0, 1, 2, 3}, pages[2] = {3, 1}, bad_pages[2] = {3, -1};
    int32_t far_index[4] = {0, 1, 2, 6};
    cairn_attn_seq seq = {.q_start = 0, .n_q = 4, .n_kv = 6, .q_index = q_index, .pages = pages};
    cairn_attn_args good = {.out = out, .q = q, .kv_pool = pool, .kv = &L, .layer = 1,
                            .n_head = 2, .scale = 0.5f, .n_seqs = 1, .seqs = &seq};
    assert_int_equal(f->attention(be, &good), CAIRN_OK);
    assert_int_equal(f->attention(be, NULL), CAIRN_EINVAL);
    cairn_attn_args a;
#define EXPECT_EINVAL(field, value)                                                              \
    do {                                                                                         \
        a = good;                                                                                \
        a.field = value;                                                                         \
        assert_int_equal(f->attention(be, &a), CAIRN_EINVAL);                                    \
    } while (0)
    EXPECT_EINVAL(out, NULL);
    EXPECT_EINVAL(q, NULL);
    EXPECT_EINVAL(kv_pool, NULL);
    EXPECT_EINVAL(kv, NULL);
    EXPECT_EINVAL(kv, &bad);
    EXPECT_EINVAL(layer, 2);
    EXPECT_EINVAL(layer, -1);
    EXPECT_EINVAL(n_head, 3); /* not a multiple of n_kv_head = 2 */
    EXPECT_EINVAL(n_head, 0);
    EXPECT_EINVAL(scale, NAN);
    EXPECT_EINVAL(n_seqs, 0);
    EXPECT_EINVAL(seqs, NULL);
#undef EXPECT_EINVAL
    cairn_attn_seq s;
#define EXPECT_SEQ_EINVAL(field, value)                                                          \
    do {                                                                                         \
        s = seq;                                                                                 \
        s.field = value;                                                                         \
        a = good;                                                                                \
        a.seqs = &s;                                                                             \
        assert_int_equal(f->attention(be, &a), CAIRN_EINVAL);                                    \
    } while (0)
    EXPECT_SEQ_EINVAL(q_start, -1);
    EXPECT_SEQ_EINVAL(n_q, 0);
    EXPECT_SEQ_EINVAL(n_kv, 0);
    EXPECT_SEQ_EINVAL(q_index, NULL);      /* needed without a mask */
    EXPECT_SEQ_EINVAL(q_index, far_index); /* 6 >= n_kv */
    EXPECT_SEQ_EINVAL(pages, NULL);
    EXPECT_SEQ_EINVAL(pages, bad_pages);
#undef EXPECT_SEQ_EINVAL
    /* With a mask, q_index is not needed. */
    uint8_t mask[4 * 6];
    memset(mask, 1, sizeof mask);
    s = seq;
    s.q_index = NULL;
    s.mask = mask;
    a = good;
    a.seqs = &s;
    assert_int_equal(f->attention(be, &a), CAIRN_OK);
    be->iface->free(be, pool);
}

int main(void)
{
    kt_init_seed("kernels_cpu_attention");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_store),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_sinks),
        cmocka_unit_test(test_attention_empty_mask_row),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, setup_backends, teardown_backends);
}
