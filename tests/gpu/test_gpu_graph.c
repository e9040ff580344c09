/*
 * tests/gpu/test_gpu_graph.c — decode steps run as CUDA graphs
 * (kernels/cuda/cuda_graph.cu) give exactly the logits of the same steps
 * run op by op.
 *
 * Two CUDA backends on the same device: one made with CAIRN_CUDA_GRAPHS=1
 * (each decode step captured and launched as one graph, the graph of a
 * batch size updated in place from step to step), one without. The same
 * model on each, the same prompts prefilled, then greedy decode steps at
 * batch 1, 4 and 9 (the batch size changes the graph; page boundaries
 * change the page tables inside it): every step's logits must be equal to
 * the bit, and the graphed backend must really have launched graphs,
 * given up none (a test that passes because graphs silently stayed off
 * proves nothing), and updated each batch size's graph in place instead of
 * making it anew every step.
 *
 * usage: test_gpu_graph MODEL (or CAIRN_MODEL). Skips, fails or runs as
 * tests/gpu/gpu_probe.h says. With CAIRN_GPU_TEST_BACKEND=cpu both backends
 * are the CPU's (which has no graphs): the harness and the model's
 * graph-or-eager logic are checked, not the graphs.
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
#include "tests/gpu/gpu_probe.h"
#include "tests/support/support.h"

static const char *model_path;
static cairn_backend *eager, *graphed;
static cairn_model *m_eager, *m_graphed;
static int n_vocab;

#define PAGE_SIZE 16
#define PAGES_PER_SEQ 6 /* 96 tokens: prompts up to 31, 48 steps */
#define MAX_B 9

typedef struct {
    cairn_page_pool *pool;
    cairn_kv_layout kv;
    int32_t table[MAX_B][PAGES_PER_SEQ];
} kv_cache;

static void kv_open(kv_cache *c, cairn_model *m, cairn_backend *be)
{
    assert_int_equal(cairn_model_kv_layout(m, PAGE_SIZE, CAIRN_TYPE_F16, &c->kv), CAIRN_OK);
    const int n_pages = MAX_B * PAGES_PER_SEQ;
    assert_int_equal(cairn_page_pool_create(be, &c->kv, (size_t)n_pages * c->kv.page_bytes,
                                            &c->pool),
                     CAIRN_OK);
    for (int s = 0; s < MAX_B; s++) /* scattered, interleaved */
        for (int p = 0; p < PAGES_PER_SEQ; p++)
            c->table[s][p] = n_pages - 1 - (p * MAX_B + s);
}

static int make_prompt(int which, int32_t *out)
{
    uint32_t state = 777u + 104729u * (uint32_t)which;
    const int n = 3 + (5 * which) % 29;
    out[0] = 1;
    for (int i = 1; i < n; i++)
        out[i] = 3 + (int32_t)((support_lcg32(&state) >> 8) % (uint32_t)(n_vocab - 3));
    return n;
}

static void forward(cairn_model *m, kv_cache *c, const cairn_seq_batch *sb, int n, float *logits)
{
    int n_out = 0;
    assert_int_equal(cairn_model_forward(m, cairn_page_pool_base(c->pool), &c->kv, sb, n, logits,
                                         NULL, &n_out),
                     CAIRN_OK);
    assert_int_equal(n_out, n);
}

static void check_graph_equals_eager(int B, int steps)
{
    kv_cache ce, cg;
    kv_open(&ce, m_eager, eager);
    kv_open(&cg, m_graphed, graphed);
    int32_t prompts[MAX_B][32];
    int len[MAX_B];
    float *le = kt_xmalloc((size_t)B * n_vocab * sizeof(float));
    float *lg = kt_xmalloc((size_t)B * n_vocab * sizeof(float));
    for (int s = 0; s < B; s++) { /* prefills are not graphed: they only set up */
        len[s] = make_prompt(s, prompts[s]);
        cairn_seq_batch sb = {.tokens = prompts[s], .n_tokens = len[s], .pages = ce.table[s]};
        forward(m_eager, &ce, &sb, 1, le + (size_t)s * n_vocab);
        sb.pages = cg.table[s];
        forward(m_graphed, &cg, &sb, 1, lg + (size_t)s * n_vocab);
    }
    int32_t next[MAX_B];
    for (int step = 0; step < steps; step++) {
        for (int s = 0; s < B; s++)
            next[s] = support_argmax(le + (size_t)s * n_vocab, n_vocab);
        cairn_seq_batch sb[MAX_B];
        for (int s = 0; s < B; s++)
            sb[s] = (cairn_seq_batch){.tokens = &next[s], .n_tokens = 1,
                                      .kv_start = len[s] + step, .pages = ce.table[s]};
        forward(m_eager, &ce, sb, B, le);
        for (int s = 0; s < B; s++)
            sb[s].pages = cg.table[s];
        forward(m_graphed, &cg, sb, B, lg);
        if (memcmp(le, lg, (size_t)B * n_vocab * sizeof(float)) != 0) {
            for (int i = 0; i < B * n_vocab; i++)
                if (memcmp(&le[i], &lg[i], sizeof(float)) != 0)
                    fail_msg("batch %d, step %d: row %d logit %d: graph %.9g, eager %.9g", B, step,
                             i / n_vocab, i % n_vocab, lg[i], le[i]);
        }
    }
    free(le);
    free(lg);
    cairn_page_pool_free(ce.pool);
    cairn_page_pool_free(cg.pool);
}

static void test_graph_equals_eager(void **state)
{
    (void)state;
    check_graph_equals_eager(1, 48);
    check_graph_equals_eager(4, 40);
    check_graph_equals_eager(9, 24);
    check_graph_equals_eager(1, 8); /* back to batch 1: its graph is reused */
    cairn_cuda_graph_stats st;
    const int rc = cairn_backend_cuda_graph_stats(graphed, &st);
    if (gpu_test_is_harness()) {
        assert_int_equal(rc, CAIRN_EUNSUPPORTED); /* the CPU has no graphs */
        return;
    }
    assert_int_equal(rc, CAIRN_OK);
    printf("graphs: %llu steps launched as graphs (%llu updated in place, %llu instantiated), "
           "%llu captures given up\n",
           (unsigned long long)st.launched, (unsigned long long)st.updated,
           (unsigned long long)st.instantiated, (unsigned long long)st.abandoned);
    assert_true(st.launched >= 48 + 40 + 24 + 8);
    assert_int_equal(st.abandoned, 0);
    assert_int_equal(st.updated + st.instantiated, st.launched);
    /* Three batch sizes, so three graphs to make; every other step must
     * update its batch size's graph in place. Two more are allowed for a
     * step whose arrays happen to coincide (a token id equal to a
     * position: one copy fewer, another shape). A step graph made anew
     * each step would measure instantiation, not launches. */
    if (st.instantiated > 3 + 2)
        fail_msg("%llu of %llu steps instantiated a graph; at most 5 expected (3 batch sizes)",
                 (unsigned long long)st.instantiated, (unsigned long long)st.launched);
}

static int load(cairn_backend *be, cairn_model **out)
{
    char err[256];
    cairn_model_params p = {.max_batch_tokens = 64, .max_seqs = MAX_B};
    int rc = cairn_model_load(model_path, be, &p, out, err, sizeof err);
    if (rc != CAIRN_OK)
        fprintf(stderr, "cannot load %s: %s\n", model_path, err);
    return rc;
}

int main(int argc, char **argv)
{
    model_path = argc > 1 ? argv[1] : getenv("CAIRN_MODEL");
    if (!model_path) {
        fprintf(stderr, "usage: test_gpu_graph MODEL (or set CAIRN_MODEL)\n");
        return 1;
    }
    const int open_rc = gpu_test_open(&eager, "gpu_graph");
    if (open_rc != 0)
        return open_rc;
    setenv("CAIRN_CUDA_GRAPHS", "1", 1); /* read when a backend is made */
    const int rc = kt_open_device(&graphed);
    unsetenv("CAIRN_CUDA_GRAPHS");
    if (rc != CAIRN_OK) {
        printf("FAIL gpu_graph: a second backend with graphs did not come up: %s\n",
               cairn_strerror(rc));
        return 1;
    }
    if (load(eager, &m_eager) != CAIRN_OK || load(graphed, &m_graphed) != CAIRN_OK)
        return 1;
    n_vocab = cairn_model_hparams(m_eager)->n_vocab;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_graph_equals_eager),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    cairn_model_free(m_eager);
    cairn_model_free(m_graphed);
    cairn_backend_destroy(eager);
    cairn_backend_destroy(graphed);
    return failed;
}
