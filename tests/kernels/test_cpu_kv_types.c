/*
 * tests/kernels/test_cpu_kv_types.c — the KV types of kernels/backend.h on
 * the CPU backend: BF16, Q8_0 and Q4_0 (rotated by the Walsh-Hadamard
 * transform) beside F32/F16, and sliding windows.
 *
 * The reference reads what kv_store put in the pool: each stored head is
 * dequantized with common/quant.c and rotated back with an explicit
 * Hadamard matrix in double, then attention is computed in double over
 * those values. So the comparison is tight (float rounding only) and any
 * mistake in the layout, the rotation of the query or of the output, the
 * block decoding or the window shows. A second check bounds what the
 * storage itself loses against the original K/V (the quantization error),
 * and 1 vs 3 threads and a row alone vs inside its call must agree bit for
 * bit.
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

static cairn_backend *be1, *be3;

static int setup(void **state)
{
    (void)state;
    return cairn_backend_cpu_create(1, &be1) || cairn_backend_cpu_create(3, &be3) ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    cairn_backend_destroy(be1);
    cairn_backend_destroy(be3);
    return 0;
}

enum { HD = 64, NKV = 2, NH = 4, PS = 16, NPAGES = 5, NTOK = NPAGES * PS - 3, NQ = 6 };

/* (H_R)_{ij} = (-1)^popcount(i & j) / sqrt(R), applied to each run of R. */
static void hadamard_double(double *x, int n, int R)
{
    double tmp[HD];
    for (int base = 0; base < n; base += R) {
        for (int i = 0; i < R; i++) {
            double s = 0;
            for (int j = 0; j < R; j++)
                s += (__builtin_popcount((unsigned)(i & j)) & 1 ? -1.0 : 1.0) * x[base + j];
            tmp[i] = s / sqrt((double)R);
        }
        memcpy(x + base, tmp, (size_t)R * sizeof(double));
    }
}

/* The values the pool holds for (kv, token, head), in the model's basis. */
static void stored_head(const uint8_t *pool, const cairn_kv_layout *L, const int32_t *pages, int kv,
                        int t, int h, double *out)
{
    const uint8_t *row = pool + (size_t)pages[t / PS] * L->page_bytes +
                         cairn_kv_offset(L, 0, kv, t % PS) +
                         (size_t)h * cairn_kv_head_bytes(L->dtype, HD);
    float f[HD];
    assert_int_equal(cairn_dequantize_row(L->dtype, row, f, HD), CAIRN_OK);
    for (int d = 0; d < HD; d++)
        out[d] = f[d];
    if (L->rotation)
        hadamard_double(out, HD, L->rotation);
}

typedef struct {
    float k[NTOK][NKV * HD], v[NTOK][NKV * HD], q[NQ][NH * HD];
    int32_t slots[NTOK], pages[NPAGES], q_index[NQ];
} inputs;

static void make_inputs(inputs *in, kt_rng *rng)
{
    for (int t = 0; t < NTOK; t++)
        for (int i = 0; i < NKV * HD; i++) {
            /* one outlier channel per head, as Qwen's keys have */
            const float big = (i % HD) == 5 ? 12.0f : 1.0f;
            in->k[t][i] = big * kt_uniform(rng, -1, 1);
            in->v[t][i] = kt_uniform(rng, -1, 1);
        }
    for (int i = 0; i < NQ; i++)
        for (int j = 0; j < NH * HD; j++)
            in->q[i][j] = kt_uniform(rng, -1, 1);
    kt_permutation(rng, in->pages, NPAGES);
    for (int t = 0; t < NTOK; t++)
        in->slots[t] = in->pages[t / PS] * PS + t % PS;
    for (int i = 0; i < NQ; i++) /* the last rows, a prefill chunk */
        in->q_index[i] = NTOK - NQ + i;
}

/* out[NQ][NH*HD] from the backend; window 0 or > 0; rows: all (-1) or one. */
static void run(cairn_backend *be, const cairn_kv_layout *L, uint8_t *pool, const inputs *in,
                int window, int only_row, float *out)
{
    assert_int_equal(be->iface->kv_store(be, pool, L, 0, &in->k[0][0], &in->v[0][0], in->slots,
                                         NTOK),
                     CAIRN_OK);
    const int first = only_row < 0 ? 0 : only_row, n = only_row < 0 ? NQ : 1;
    cairn_attn_seq seq = {.q_start = 0, .n_q = n, .n_kv = NTOK, .q_index = in->q_index + first,
                          .pages = in->pages};
    cairn_attn_args a = {.out = out, .q = &in->q[first][0], .kv_pool = pool, .kv = L, .layer = 0,
                         .n_head = NH, .scale = 0.125f, .n_seqs = 1, .seqs = &seq,
                         .window = window};
    assert_int_equal(be->iface->attention(be, &a), CAIRN_OK);
}

/* Attention in double over the values `head` gives. */
static void reference(const inputs *in, int window, int use_stored, const uint8_t *pool,
                      const cairn_kv_layout *L, double *out)
{
    static double K[NTOK][NKV][HD], V[NTOK][NKV][HD];
    for (int t = 0; t < NTOK; t++)
        for (int g = 0; g < NKV; g++) {
            if (use_stored) {
                stored_head(pool, L, in->pages, 0, t, g, K[t][g]);
                stored_head(pool, L, in->pages, 1, t, g, V[t][g]);
            } else {
                for (int d = 0; d < HD; d++) {
                    K[t][g][d] = in->k[t][g * HD + d];
                    V[t][g][d] = in->v[t][g * HD + d];
                }
            }
        }
    for (int i = 0; i < NQ; i++)
        for (int h = 0; h < NH; h++) {
            const int g = h / (NH / NKV), qi = in->q_index[i];
            const int lo = window > 0 && qi - window + 1 > 0 ? qi - window + 1 : 0;
            double s[NTOK], max = -INFINITY, sum = 0;
            for (int j = lo; j <= qi; j++) {
                s[j] = 0;
                for (int d = 0; d < HD; d++)
                    s[j] += (double)in->q[i][h * HD + d] * K[j][g][d];
                s[j] *= 0.125;
                max = s[j] > max ? s[j] : max;
            }
            double *o = out + ((size_t)i * NH + h) * HD;
            for (int d = 0; d < HD; d++)
                o[d] = 0;
            for (int j = lo; j <= qi; j++) {
                const double w = exp(s[j] - max);
                sum += w;
                for (int d = 0; d < HD; d++)
                    o[d] += w * V[j][g][d];
            }
            for (int d = 0; d < HD; d++)
                o[d] /= sum;
        }
}

static void test_kv_types(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("kv_types");
    static inputs in;
    make_inputs(&in, &rng);
    const cairn_type types[] = {CAIRN_TYPE_F32, CAIRN_TYPE_F16, CAIRN_TYPE_BF16, CAIRN_TYPE_Q8_0,
                                CAIRN_TYPE_Q4_0};
    /* what storing may cost against the original values, max |out - ref| */
    const double lossy_bound[] = {1e-5, 2e-3, 1.5e-2, 1.5e-2, 0.2};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (int rot = 0; rot < 2; rot++)
            for (int window = 0; window <= 20; window += 20) {
                cairn_kv_layout L;
                assert_int_equal(cairn_kv_layout_init(&L, 1, NKV, HD, PS, types[ti]), CAIRN_OK);
                L.rotation = rot ? (ti < 3 ? 16 : L.rotation) : 0; /* also rotated F32/F16/BF16 */
                if (rot && !L.rotation)
                    continue;
                assert_true(cairn_kv_layout_valid(&L));
                uint8_t *pool = NULL, *pool3 = NULL;
                assert_int_equal(be1->iface->alloc(be1, NPAGES * L.page_bytes, (void **)&pool),
                                 CAIRN_OK);
                assert_int_equal(be3->iface->alloc(be3, NPAGES * L.page_bytes, (void **)&pool3),
                                 CAIRN_OK);
                static float out1[NQ][NH * HD], out3[NQ][NH * HD], row[NH * HD];
                static double ref[NQ * NH * HD], orig[NQ * NH * HD];
                run(be1, &L, pool, &in, window, -1, &out1[0][0]);
                run(be3, &L, pool3, &in, window, -1, &out3[0][0]);
                assert_memory_equal(pool, pool3, NPAGES * L.page_bytes);
                assert_memory_equal(out1, out3, sizeof out1);
                reference(&in, window, 1, pool, &L, ref);
                reference(&in, window, 0, pool, &L, orig);
                double err = 0, loss = 0;
                for (int i = 0; i < NQ * NH * HD; i++) {
                    err = fmax(err, fabs((&out1[0][0])[i] - ref[i]));
                    loss = fmax(loss, fabs((&out1[0][0])[i] - orig[i]));
                }
                if (err > 2e-5 || loss > lossy_bound[ti])
                    fail_msg("%s rotation %d window %d: |out - ref(stored)| %.3g, |out - "
                             "ref(original)| %.3g (seed %llu)",
                             cairn_kv_type_name(types[ti]), L.rotation, window, err, loss,
                             (unsigned long long)kt_seed);
                /* a row alone (a decode step) = the same row in the call */
                for (int i = 0; i < NQ; i += NQ - 1) {
                    run(be1, &L, pool, &in, window, i, row);
                    assert_memory_equal(row, out1[i], sizeof row);
                }
                be1->iface->free(be1, pool);
                be3->iface->free(be3, pool3);
            }
}

/* Layouts and names: what the CLI and the namespace rely on. */
static void test_kv_type_layouts(void **state)
{
    (void)state;
    cairn_kv_layout L;
    assert_int_equal(cairn_kv_layout_init(&L, 2, 2, 64, 16, CAIRN_TYPE_Q8_0), CAIRN_OK);
    assert_int_equal(L.row_bytes, 2 * 2 * 34);
    assert_int_equal(L.rotation, 64);
    assert_int_equal(cairn_kv_layout_init(&L, 2, 2, 96, 16, CAIRN_TYPE_Q4_0), CAIRN_OK);
    assert_int_equal(L.row_bytes, 2 * 3 * 18);
    assert_int_equal(L.rotation, 32);
    assert_int_equal(cairn_kv_layout_init(&L, 2, 2, 64, 16, CAIRN_TYPE_BF16), CAIRN_OK);
    assert_int_equal(L.rotation, 0);
    assert_int_equal(cairn_kv_layout_init(&L, 2, 2, 8, 16, CAIRN_TYPE_Q8_0), CAIRN_EINVAL);
    assert_int_equal(cairn_kv_layout_init(&L, 2, 2, 64, 16, CAIRN_TYPE_Q4_K), CAIRN_EINVAL);
    assert_int_equal(cairn_kv_layout_init(&L, 2, 2, 64, 16, CAIRN_TYPE_Q8_0), CAIRN_OK);
    L.rotation = 48; /* not a power of two */
    assert_false(cairn_kv_layout_valid(&L));
    const char *names[] = {"f32", "f16", "bf16", "q8_0", "q4_0"};
    for (int i = 0; i < 5; i++) {
        cairn_type t;
        assert_int_equal(cairn_kv_type_parse(names[i], &t), CAIRN_OK);
        assert_string_equal(cairn_kv_type_name(t), names[i]);
    }
    cairn_type t;
    assert_int_equal(cairn_kv_type_parse("q4_k", &t), CAIRN_EINVAL);
    assert_int_equal(cairn_kv_type_parse("Q8_0", &t), CAIRN_OK);
}

int main(void)
{
    kt_init_seed("kernels_cpu_kv_types");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_types),
        cmocka_unit_test(test_kv_type_layouts),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
