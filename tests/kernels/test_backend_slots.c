/*
 * tests/kernels/test_backend_slots.c — the optional slots of the backend
 * table (kernels/backend.h): supports_type, synchronize and copy may be
 * NULL, and the wrappers cairn_backend_supports_type / _synchronize / _copy
 * then run the fallbacks of kernels/backend.c.
 *
 * The backend under test is the CPU backend's own table copied with those
 * three slots set to NULL (sharing the CPU backend's context), so every
 * other op is the CPU one and results must be bitwise those of the CPU
 * backend: the fallbacks change how memory moves, never a number. Its
 * download/upload count their calls, to show that copy really bounced
 * through host memory (in chunks, for a copy larger than the bounce
 * buffer). The model loader's use of supports_type is checked on
 * CAIRN_MODEL (stories260K, F32 weights): loading works with the fallback,
 * gives the same logits, and a backend that refuses F32 is refused with a
 * message naming the tensor, the type and the backend.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/model.h"
#include "tests/support/support.h"

static cairn_backend *cpu;             /* the real CPU backend             */
static cairn_backend_iface bare_iface; /* its table, optional slots NULL   */
static cairn_backend bare;             /* that table on the CPU's context  */
static int n_download, n_upload;

static int counting_download(cairn_backend *be, void *host_dst, const void *src, size_t bytes)
{
    n_download++;
    return cpu->iface->download(be, host_dst, src, bytes);
}

static int counting_upload(cairn_backend *be, void *dst, const void *host_src, size_t bytes)
{
    n_upload++;
    return cpu->iface->upload(be, dst, host_src, bytes);
}

static int setup(void **state)
{
    (void)state;
    cpu = kt_cpu(2);
    bare_iface = *cpu->iface;
    bare_iface.name = "cpu-bare";
    bare_iface.supports_type = NULL;
    bare_iface.synchronize = NULL;
    bare_iface.copy = NULL;
    bare_iface.download = counting_download;
    bare_iface.upload = counting_upload;
    bare.iface = &bare_iface;
    bare.ctx = cpu->ctx;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    cairn_backend_destroy(cpu);
    return 0;
}

static void test_supports_type(void **state)
{
    (void)state;
    assert_non_null(cpu->iface->supports_type);
    int n_compute = 0;
    for (int t = -1; t <= CAIRN_TYPE_COUNT_; t++) {
        const cairn_type_traits *tr = cairn_type_get(t);
        const int compute = tr && tr->compute;
        n_compute += compute;
        /* the fallback is the compute flag, and the CPU's list is exactly it */
        assert_int_equal(cairn_backend_supports_type(&bare, (cairn_type)t), compute);
        assert_int_equal(cairn_backend_supports_type(cpu, (cairn_type)t), compute);
    }
    assert_int_equal(n_compute, 12);
    assert_int_equal(cairn_backend_supports_type(NULL, CAIRN_TYPE_F32), 0);
}

static void test_synchronize(void **state)
{
    (void)state;
    assert_int_equal(cairn_backend_synchronize(&bare), CAIRN_OK);
    assert_int_equal(cairn_backend_synchronize(cpu), CAIRN_OK);
    assert_int_equal(cairn_backend_synchronize(NULL), CAIRN_EINVAL);
}

/* The fallback copy of `bytes` at dst_off from src_off inside one buffer
 * against memmove on the host, and the CPU slot on the same data. */
static void check_copy(size_t total, size_t dst_off, size_t src_off, size_t bytes,
                       int min_chunks)
{
    uint8_t *host = kt_xmalloc(total);
    for (size_t i = 0; i < total; i++)
        host[i] = (uint8_t)(i * 131u + (i >> 9));
    uint8_t *a = kt_dev(cpu, host, total), *b = kt_dev(cpu, host, total);
    n_download = n_upload = 0;
    assert_int_equal(cairn_backend_copy(&bare, a + dst_off, a + src_off, bytes), CAIRN_OK);
    assert_true(n_download >= min_chunks && n_upload == n_download);
    assert_int_equal(cairn_backend_copy(cpu, b + dst_off, b + src_off, bytes), CAIRN_OK);
    memmove(host + dst_off, host + src_off, bytes);
    uint8_t *got = kt_host(cpu, a, total), *want = kt_host(cpu, b, total);
    assert_memory_equal(got, host, total);
    assert_memory_equal(want, host, total);
    free(got);
    free(want);
    free(host);
    cpu->iface->free(cpu, a);
    cpu->iface->free(cpu, b);
}

static void test_copy(void **state)
{
    (void)state;
    const size_t MiB = (size_t)1 << 20;
    check_copy(4096, 2048, 0, 1000, 1);              /* disjoint, one chunk   */
    check_copy(4096, 0, 4095, 1, 1);                 /* one byte             */
    check_copy(3 * MiB + 8192, 4096, 0, 3 * MiB + 5, 4);    /* overlapping, dst above */
    check_copy(3 * MiB + 8192, 0, 4099, 3 * MiB + 77, 4);   /* overlapping, dst below */
    check_copy(5 * MiB, 2 * MiB + 3, 0, 2 * MiB + 1, 3);    /* disjoint, 3 chunks  */

    uint8_t *a = kt_dev(cpu, NULL, 64);
    n_download = 0;
    assert_int_equal(cairn_backend_copy(&bare, a, a + 8, 0), CAIRN_OK); /* 0 bytes */
    assert_int_equal(cairn_backend_copy(&bare, a, a, 64), CAIRN_OK);    /* dst == src */
    assert_int_equal(n_download, 0);
    assert_int_equal(cairn_backend_copy(&bare, NULL, a, 4), CAIRN_EINVAL);
    assert_int_equal(cairn_backend_copy(&bare, a, NULL, 4), CAIRN_EINVAL);
    assert_int_equal(cairn_backend_copy(NULL, a, a + 8, 4), CAIRN_EINVAL);
    cpu->iface->free(cpu, a);
}

/* The same matmul + copy + synchronize + download on both tables. */
static void test_ops_identical(void **state)
{
    (void)state;
    kt_rng rng = kt_rng_for("ops_identical");
    const int T = 5, n_in = 256, n_out = 37;
    const cairn_type types[] = {CAIRN_TYPE_F16, CAIRN_TYPE_Q4_0, CAIRN_TYPE_Q6_K};
    float *wf = kt_xmalloc(sizeof(float) * n_in), *x = kt_xmalloc(sizeof(float) * T * n_in);
    for (int i = 0; i < T * n_in; i++)
        x[i] = kt_uniform(&rng, -1.0f, 1.0f);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const size_t rb = cairn_type_row_bytes(types[ti], n_in);
        uint8_t *W = kt_xmalloc(rb * n_out);
        for (int r = 0; r < n_out; r++) {
            for (int k = 0; k < n_in; k++)
                wf[k] = kt_uniform(&rng, -1.0f, 1.0f);
            assert_int_equal(cairn_quantize_row(types[ti], wf, W + rb * r, n_in), CAIRN_OK);
        }
        float *res[2];
        cairn_backend *bes[2] = {cpu, &bare};
        for (int i = 0; i < 2; i++) {
            cairn_backend *be = bes[i];
            void *dW = kt_dev(be, W, rb * n_out);
            float *dx = kt_dev(be, x, sizeof(float) * T * n_in);
            float *dy = kt_dev(be, NULL, sizeof(float) * T * n_out);
            float *dz = kt_dev(be, NULL, sizeof(float) * T * n_out);
            assert_int_equal(be->iface->matmul(be, dy, dW, types[ti], dx, T, n_in, n_out),
                             CAIRN_OK);
            assert_int_equal(cairn_backend_copy(be, dz, dy, sizeof(float) * T * n_out), CAIRN_OK);
            assert_int_equal(cairn_backend_synchronize(be), CAIRN_OK);
            res[i] = kt_host(be, dz, sizeof(float) * T * n_out);
            be->iface->free(be, dW);
            be->iface->free(be, dx);
            be->iface->free(be, dy);
            be->iface->free(be, dz);
        }
        assert_memory_equal(res[0], res[1], sizeof(float) * T * n_out);
        free(res[0]);
        free(res[1]);
        free(W);
    }
    free(wf);
    free(x);
}

/* ---- the model loader ---------------------------------------------------- */

static int no_f32(const cairn_backend *be, cairn_type t)
{
    (void)be;
    return t != CAIRN_TYPE_F32 && cairn_type_get(t) && cairn_type_get(t)->compute;
}

static const char *model_path(void)
{
    const char *p = getenv("CAIRN_MODEL");
    return p && access(p, R_OK) == 0 ? p : NULL;
}

/* Logits of a 6-token prompt, on `be`. */
static float *prompt_logits(cairn_backend *be, int *n_vocab)
{
    char err[256] = "";
    cairn_model *m = NULL;
    int rc = cairn_model_load(model_path(), be, NULL, &m, err, sizeof err);
    if (rc != CAIRN_OK)
        fail_msg("load on %s: %s", be->iface->name, err);
    cairn_kv_layout L;
    assert_int_equal(cairn_model_kv_layout(m, 16, CAIRN_TYPE_F32, &L), CAIRN_OK);
    void *pool = kt_dev(be, NULL, L.page_bytes);
    const int32_t tokens[6] = {1, 400, 17, 90, 3, 200}, pages[1] = {0};
    cairn_seq_batch seq = {.tokens = tokens, .n_tokens = 6, .pages = pages};
    *n_vocab = cairn_model_hparams(m)->n_vocab;
    float *logits = kt_xmalloc(sizeof(float) * (size_t)*n_vocab);
    int n_out = 0;
    assert_int_equal(cairn_model_forward(m, pool, &L, &seq, 1, logits, NULL, &n_out), CAIRN_OK);
    assert_int_equal(n_out, 1);
    be->iface->free(be, pool);
    cairn_model_free(m);
    return logits;
}

static void test_model_fallback(void **state)
{
    (void)state;
    if (!model_path())
        KT_SKIP("no model (CAIRN_MODEL) to load");
    int nv0 = 0, nv1 = 0;
    float *a = prompt_logits(cpu, &nv0), *b = prompt_logits(&bare, &nv1);
    assert_int_equal(nv0, nv1);
    assert_memory_equal(a, b, sizeof(float) * (size_t)nv0);
    free(a);
    free(b);
}

static void test_model_refuses_type(void **state)
{
    (void)state;
    if (!model_path())
        KT_SKIP("no model (CAIRN_MODEL) to load");
    cairn_backend_iface picky_iface = *cpu->iface;
    picky_iface.name = "picky";
    picky_iface.supports_type = no_f32;
    cairn_backend picky = {.iface = &picky_iface, .ctx = cpu->ctx};
    char err[256] = "";
    cairn_model *m = NULL;
    assert_int_equal(cairn_model_load(model_path(), &picky, NULL, &m, err, sizeof err),
                     CAIRN_EUNSUPPORTED);
    assert_null(m);
    /* the first weight bound is the embedding table */
    assert_non_null(strstr(err, "'token_embd.weight'"));
    assert_non_null(strstr(err, "F32"));
    assert_non_null(strstr(err, "picky"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_supports_type),
        cmocka_unit_test(test_synchronize),
        cmocka_unit_test(test_copy),
        cmocka_unit_test(test_ops_identical),
        cmocka_unit_test(test_model_fallback),
        cmocka_unit_test(test_model_refuses_type),
    };
    kt_init_seed("backend_slots");
    return kt_exit_code(cmocka_run_group_tests(tests, setup, teardown));
}
