/*
 * tests/eagle3/test_eagle3.c — EAGLE-3 heads from the published checkpoint
 * layout to the head's outputs.
 *
 *   rows     a checkpoint written as SafeAILab/EAGLE's eagle3 code saves one
 *            (tests/eagle3/eagle3_fixture.py), converted by
 *            tools/eagle_convert.py, run over the target's low/mid/high
 *            states (cairn_model_set_feature_layers) gives the logits and
 *            pre-norm outputs numpy computes in float64 from the checkpoint
 *            itself (Hugging Face's rotate-half RoPE on the unpermuted q/k:
 *            the converter's permutation is checked too); a draft row
 *            reading its parent's output (not fused states) as well; draft
 *            ids map to target ids through d2t.
 *   errors   heads of another shape, reading a layer the target lacks, or
 *            not EAGLE-3 heads are refused with a message.
 *
 * argv[1] python, argv[2] tools/ folder, argv[3] tests/ref/ folder,
 * argv[4] tests/eagle3/ folder, argv[5] a scratch folder.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"
#include "tests/support/support.h"

static const char *scratch_dir;

#define PAGE 8
#define DRAFT_TOKEN 300

static char *scratch(const char *name)
{
    static char path[8][1024];
    static int next;
    char *p = path[next++ % 8];
    snprintf(p, sizeof path[0], "%s/%s", scratch_dir, name);
    return p;
}

static void *read_file(const char *name, size_t bytes)
{
    FILE *fp = fopen(scratch(name), "rb");
    if (!fp)
        fail_msg("cannot open %s", scratch(name));
    void *x = malloc(bytes);
    assert_non_null(x);
    assert_int_equal(fread(x, 1, bytes, fp), bytes);
    fclose(fp);
    return x;
}

static void close_rows(const float *got, const float *want, int rows, int cols, const char *what)
{
    for (int r = 0; r < rows; r++) {
        double scale = 0;
        for (int c = 0; c < cols; c++)
            scale = fmax(scale, fabs(want[(size_t)r * cols + c]));
        for (int c = 0; c < cols; c++) {
            const double d = fabs((double)got[(size_t)r * cols + c] - want[(size_t)r * cols + c]);
            if (!(d <= 1e-4 * scale + 1e-5))
                fail_msg("%s: row %d col %d: got %.7g, want %.7g", what, r, c,
                         got[(size_t)r * cols + c], want[(size_t)r * cols + c]);
        }
    }
}

static void test_rows(void **state)
{
    (void)state;
    char err[256] = "";
    cairn_backend *be;
    assert_int_equal(cairn_backend_cpu_create(1, &be), CAIRN_OK);
    cairn_model_params p = {.max_batch_tokens = 64, .max_seqs = 1};
    cairn_model *m;
    if (cairn_model_load(getenv("CAIRN_MODEL"), be, &p, &m, err, sizeof err) != CAIRN_OK)
        fail_msg("load: %s", err);
    cairn_eagle3 *e;
    if (cairn_eagle3_load(scratch("eagle3.gguf"), m, &e, err, sizeof err) != CAIRN_OK)
        fail_msg("load head: %s", err);
    const cairn_hparams *hp = cairn_model_hparams(m);
    const int dim = hp->dim, nvd = cairn_eagle3_draft_vocab(e);
    assert_int_equal(nvd, 384);
    int layers[3];
    cairn_eagle3_target_layers(e, layers);
    assert_int_equal(layers[0], 2); /* the published defaults: 2, n/2, n-3 */
    assert_int_equal(layers[1], hp->n_layer / 2);
    assert_int_equal(layers[2], hp->n_layer - 3);

    const int T = 20;
    int32_t *tokens = read_file("tokens.bin", (size_t)T * sizeof(int32_t));
    float *want_lg = read_file("rows.logits.bin", (size_t)(T - 1) * nvd * sizeof(float));
    float *want_h = read_file("rows.hidden.bin", (size_t)(T - 1) * dim * sizeof(float));
    float *want_draft = read_file("draft.logits.bin", (size_t)nvd * sizeof(float));

    /* the target's states at the head's layers; the head's KV one layer past */
    cairn_kv_layout kv;
    assert_int_equal(cairn_kv_layout_init(&kv, hp->n_layer + 1, hp->n_kv_head, hp->head_dim, PAGE,
                                          CAIRN_TYPE_F32),
                     CAIRN_OK);
    void *pool;
    assert_int_equal(be->iface->alloc(be, 8 * kv.page_bytes, &pool), CAIRN_OK);
    const int32_t pages[8] = {5, 2, 7, 0, 3, 1, 6, 4};
    assert_int_equal(cairn_model_set_feature_layers(m, layers, 3), CAIRN_OK);
    float *states = malloc((size_t)T * 3 * dim * sizeof(float));
    cairn_seq_batch sb = {.tokens = tokens, .n_tokens = T, .pages = pages};
    int n_out = 0;
    assert_int_equal(cairn_model_forward_features(m, pool, &kv, &sb, 1, NULL, states, &n_out),
                     CAIRN_OK);

    /* rows 0..T-2 in two calls (the second attends to the first's KV) */
    float *lg = malloc((size_t)(T - 1) * nvd * sizeof(float));
    float *hid = malloc((size_t)(T - 1) * dim * sizeof(float));
    int32_t pos[32], idx[32];
    for (int j = 0; j < T - 1; j++)
        pos[j] = idx[j] = j;
    const int first = 7;
    for (int c = 0; c < 2; c++) {
        const int from = c ? first : 0, n = c ? T - 1 - first : first;
        const cairn_eagle3_rows rows = {
            .n_rows = n, .tokens = tokens + from + 1, .features = states + (size_t)from * 3 * dim,
            .fused = true, .pos = pos + from, .kv_index = idx + from, .n_kv = from + n,
            .kv_pool = pool, .kv = &kv, .pages = pages, .kv_layer = hp->n_layer,
        };
        assert_int_equal(cairn_eagle3_forward(e, &rows, hid + (size_t)from * dim,
                                              lg + (size_t)from * nvd, n),
                         CAIRN_OK);
    }
    close_rows(hid, want_h, T - 1, dim, "pre-norm outputs");
    close_rows(lg, want_lg, T - 1, nvd, "logits");

    /* a draft row: its parent's output as the feature, over rows 0..T-2 and
     * itself (KV index T-1) */
    uint8_t mask[32];
    memset(mask, 1, (size_t)T);
    const int32_t dtok = DRAFT_TOKEN, dpos = T - 1, didx = T - 1;
    const cairn_eagle3_rows draft = {
        .n_rows = 1, .tokens = &dtok, .features = hid + (size_t)(T - 2) * dim, .fused = false,
        .pos = &dpos, .kv_index = &didx, .n_kv = T, .mask = mask, .kv_pool = pool, .kv = &kv,
        .pages = pages, .kv_layer = hp->n_layer,
    };
    float *dl = malloc((size_t)nvd * sizeof(float));
    assert_int_equal(cairn_eagle3_forward(e, &draft, NULL, dl, 1), CAIRN_OK);
    close_rows(dl, want_draft, 1, nvd, "draft row logits");
    /* the same logits from the row's output alone */
    float *dh = malloc((size_t)dim * sizeof(float));
    assert_int_equal(cairn_eagle3_forward(e, &draft, dh, NULL, 0), CAIRN_OK);
    assert_int_equal(cairn_eagle3_project(e, dh, 1, dl), CAIRN_OK);
    close_rows(dl, want_draft, 1, nvd, "projected draft row");
    free(dh);

    /* draft ids are target ids through d2t: increasing, within the vocabulary */
    int32_t prev = -1;
    for (int d = 0; d < nvd; d++) {
        const int32_t t = cairn_eagle3_target_token(e, d);
        assert_true(t > prev && t < hp->n_vocab);
        prev = t;
    }
    assert_int_equal(cairn_eagle3_target_token(e, nvd), -1);

    /* bad rows are refused */
    cairn_eagle3_rows bad = draft;
    bad.kv_layer = kv.n_layer;
    assert_int_equal(cairn_eagle3_forward(e, &bad, NULL, dl, 1), CAIRN_EINVAL);
    bad = draft;
    bad.n_rows = CAIRN_EAGLE3_MAX_ROWS + 1;
    assert_int_equal(cairn_eagle3_forward(e, &bad, NULL, dl, 1), CAIRN_EINVAL);

    free(dl);
    free(lg);
    free(hid);
    free(states);
    free(tokens);
    free(want_lg);
    free(want_h);
    free(want_draft);
    be->iface->free(be, pool);
    cairn_eagle3_free(e);
    cairn_model_free(m);
    cairn_backend_destroy(be);
}

static void expect_refused(cairn_model *m, const char *path, const char *says)
{
    char err[512] = "";
    cairn_eagle3 *e = NULL;
    assert_int_equal(cairn_eagle3_load(path, m, &e, err, sizeof err), CAIRN_EFORMAT);
    assert_null(e);
    if (!strstr(err, says))
        fail_msg("%s: message '%s' does not say '%s'", path, err, says);
}

static void test_errors(void **state)
{
    (void)state;
    char err[256] = "";
    cairn_backend *be;
    assert_int_equal(cairn_backend_cpu_create(1, &be), CAIRN_OK);
    cairn_model *m;
    assert_int_equal(cairn_model_load(getenv("CAIRN_MODEL"), be, NULL, &m, err, sizeof err),
                     CAIRN_OK);
    expect_refused(m, scratch("wrongdim.gguf"), "does not fit the target");
    expect_refused(m, scratch("badlayer.gguf"), "reads layer 9; the target has 5");
    expect_refused(m, getenv("CAIRN_MODEL"), "not an EAGLE-3 head");
    cairn_model_free(m);
    cairn_backend_destroy(be);
}

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: %s PYTHON TOOLS_DIR REF_DIR TEST_DIR SCRATCH_DIR\n", argv[0]);
        return 2;
    }
    scratch_dir = argv[5];
    cairn_log_set_level(CAIRN_LOG_WARN);
    static char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' '%s/eagle3_fixture.py' '%s' '%s' '%s' '%s'", argv[1], argv[4],
             argv[2], argv[3], getenv("CAIRN_MODEL"), scratch_dir);
    int rc = system(cmd);
    if (rc != 0) {
        fprintf(stderr, "test_eagle3: '%s' failed (%d)\n", cmd, rc);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
