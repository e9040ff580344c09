/*
 * tests/model/test_graph_abandon.c — what model.c's forward does when an op
 * fails while a decode step is being recorded as a step graph
 * (kernels/backend.h, "Step graphs"; review 2026-12-05, finding 7).
 *
 * The backend is the CPU backend's table on its own context, plus graph
 * slots that record nothing (the ops run as they are issued, which is
 * enough to count them) and one matmul that fails once on request. Then:
 *
 *   - an op that fails on its own while recording (CAIRN_EINVAL): the
 *     recording is abandoned, never ended (ending it would launch the half
 *     step recorded so far), the step is not run again, and forward returns
 *     that first failure;
 *   - a recording the backend reports broken (graph_abandon's CAIRN_EBUSY:
 *     the failure may come from recording): the step runs again without a
 *     graph and gives the logits of a plain CPU forward.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "store/tiers.h"
#include "tests/support/support.h"

static cairn_backend *cpu;
static cairn_backend_iface fake_iface;
static cairn_backend fake; /* the CPU's table and context, with graph slots */
static int n_begin, n_end, n_abandon, abandon_rc, fail_matmul, n_matmul;

static int fk_graph_begin(cairn_backend *be, uint64_t key)
{
    (void)be, (void)key;
    n_begin++;
    return CAIRN_OK;
}

static int fk_graph_end(cairn_backend *be)
{
    (void)be;
    n_end++;
    return CAIRN_OK;
}

static int fk_graph_abandon(cairn_backend *be)
{
    (void)be;
    n_abandon++;
    return abandon_rc;
}

static int fk_matmul(cairn_backend *be, float *y, const void *W, cairn_type wtype, const float *x,
                     int T, int n_in, int n_out)
{
    (void)be;
    n_matmul++;
    if (fail_matmul && --fail_matmul == 0)
        return CAIRN_EINVAL;
    return cpu->iface->matmul(cpu, y, W, wtype, x, T, n_in, n_out);
}

typedef struct {
    cairn_model *m;
    cairn_page_pool *pool;
    cairn_kv_layout kv;
    int32_t pages[4];
    int n_vocab;
} run;

static void run_open(run *r, cairn_backend *be)
{
    const char *path = getenv("CAIRN_MODEL");
    assert_non_null(path);
    char err[256];
    cairn_model_params p = {.max_batch_tokens = 32, .max_seqs = 2};
    assert_int_equal(cairn_model_load(path, be, &p, &r->m, err, sizeof err), CAIRN_OK);
    r->n_vocab = cairn_model_hparams(r->m)->n_vocab;
    assert_int_equal(cairn_model_kv_layout(r->m, 16, CAIRN_TYPE_F32, &r->kv), CAIRN_OK);
    assert_int_equal(cairn_page_pool_create(be, &r->kv, 4 * r->kv.page_bytes, &r->pool), CAIRN_OK);
    for (int i = 0; i < 4; i++)
        r->pages[i] = 3 - i;
}

static void run_close(run *r)
{
    cairn_page_pool_free(r->pool);
    cairn_model_free(r->m);
}

static int step(run *r, const int32_t *tokens, int n, int kv_start, float *logits)
{
    cairn_seq_batch sb = {.tokens = tokens, .n_tokens = n, .kv_start = kv_start,
                          .pages = r->pages};
    int n_out = 0;
    return cairn_model_forward(r->m, cairn_page_pool_base(r->pool), &r->kv, &sb, 1, logits, NULL,
                               &n_out);
}

static const int32_t prompt[5] = {1, 40, 90, 200, 7}, next_token = 33;

static void test_failed_op_abandons_recording(void **state)
{
    (void)state;
    run r;
    run_open(&r, &fake);
    float *logits = kt_xmalloc((size_t)5 * r.n_vocab * sizeof(float));
    assert_int_equal(step(&r, prompt, 5, 0, logits), CAIRN_OK); /* a prefill: no graph */
    assert_int_equal(n_begin, 0);

    n_begin = n_end = n_abandon = n_matmul = 0;
    abandon_rc = CAIRN_OK;
    fail_matmul = 3; /* the third matmul of the decode step */
    assert_int_equal(step(&r, &next_token, 1, 5, logits), CAIRN_EINVAL);
    assert_int_equal(n_begin, 1);
    assert_int_equal(n_abandon, 1);
    assert_int_equal(n_end, 0);   /* never launched */
    assert_int_equal(n_matmul, 3); /* and not run again */
    free(logits);
    run_close(&r);
}

static void test_broken_recording_runs_eagerly(void **state)
{
    (void)state;
    run ref, r;
    run_open(&ref, cpu);
    run_open(&r, &fake);
    float *want = kt_xmalloc((size_t)5 * ref.n_vocab * sizeof(float));
    float *got = kt_xmalloc((size_t)5 * ref.n_vocab * sizeof(float));
    assert_int_equal(step(&ref, prompt, 5, 0, want), CAIRN_OK);
    assert_int_equal(step(&r, prompt, 5, 0, got), CAIRN_OK);
    assert_int_equal(step(&ref, &next_token, 1, 5, want), CAIRN_OK);

    n_begin = n_end = n_abandon = n_matmul = 0;
    abandon_rc = CAIRN_EBUSY;
    fail_matmul = 2;
    assert_int_equal(step(&r, &next_token, 1, 5, got), CAIRN_OK);
    assert_int_equal(n_abandon, 1);
    assert_int_equal(n_end, 0);
    assert_true(n_matmul > 2); /* the whole step again, without a graph */
    KT_SAME_BYTES(got, want, (size_t)r.n_vocab * sizeof(float),
                  "a decode step run again after a broken recording");
    free(want);
    free(got);
    run_close(&ref);
    run_close(&r);
}

int main(void)
{
    cpu = kt_cpu(1);
    fake_iface = *cpu->iface;
    fake_iface.name = "cpu-fake-graphs";
    fake_iface.graph_begin = fk_graph_begin;
    fake_iface.graph_end = fk_graph_end;
    fake_iface.graph_abandon = fk_graph_abandon;
    fake_iface.matmul = fk_matmul;
    fake_iface.matmul_multi = NULL; /* every matmul through the counting one */
    fake.iface = &fake_iface;
    fake.ctx = cpu->ctx;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failed_op_abandons_recording),
        cmocka_unit_test(test_broken_recording_runs_eagerly),
    };
    const int failed = cmocka_run_group_tests(tests, NULL, NULL);
    cairn_backend_destroy(cpu);
    return failed;
}
