/*
 * tests/medusa/test_medusa.c — Medusa heads, from the published checkpoint
 * layout to draft trees.
 *
 *   logits_*   checkpoints written the way the Medusa authors' code saves
 *              them (tests/medusa/medusa_fixture.py: medusa_lm_head
 *              .safetensors / .pt + config.json, half-precision tensors,
 *              heads with and without LM heads of their own), converted by
 *              tools/eagle_convert.py, give the logits the published forward
 *              computes (numpy, float64) for the same features.
 *   draft_*    the draft tree holds exactly the best paths under the budget
 *              (compared with brute-force enumeration), parents first, within
 *              the depth and per-level widths; a logit-biased token is drafted.
 *   errors     heads that do not fit the target, lack a tensor, are not
 *              Medusa heads or are cut short are refused with a message.
 *
 * argv[1] python, argv[2] tools/ folder, argv[3] tests/medusa/ folder,
 * argv[4] a scratch folder.
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

static const char *python, *tools_dir, *test_dir, *scratch_dir;

#define N_FEAT 4

typedef struct {
    cairn_backend *be;
    cairn_model *m;
    int n_vocab, dim;
} fixture;

static void open_target(fixture *f)
{
    memset(f, 0, sizeof *f);
    char err[256] = "";
    assert_int_equal(cairn_backend_cpu_create(1, &f->be), CAIRN_OK);
    cairn_model_params p = {.max_batch_tokens = 64, .max_seqs = 1};
    if (cairn_model_load(getenv("CAIRN_MODEL"), f->be, &p, &f->m, err, sizeof err) != CAIRN_OK)
        fail_msg("load %s: %s", getenv("CAIRN_MODEL"), err);
    f->n_vocab = cairn_model_hparams(f->m)->n_vocab;
    f->dim = cairn_model_hparams(f->m)->dim;
}

static void close_target(fixture *f)
{
    cairn_model_free(f->m);
    cairn_backend_destroy(f->be);
}

static char *scratch(const char *name)
{
    static char path[8][1024];
    static int next;
    char *p = path[next++ % 8];
    snprintf(p, sizeof path[0], "%s/%s", scratch_dir, name);
    return p;
}

static float *read_floats(const char *name, size_t n)
{
    FILE *fp = fopen(scratch(name), "rb");
    if (!fp)
        fail_msg("cannot open %s", scratch(name));
    float *x = malloc(n * sizeof(float));
    assert_non_null(x);
    assert_int_equal(fread(x, sizeof(float), n, fp), n);
    fclose(fp);
    return x;
}

static cairn_medusa *load_heads(fixture *f, const char *name)
{
    char err[256] = "";
    cairn_medusa *h = NULL;
    if (cairn_medusa_load(scratch(name), f->m, &h, err, sizeof err) != CAIRN_OK)
        fail_msg("load %s: %s", name, err);
    return h;
}

/* ---- logits ------------------------------------------------------------ */

static void check_logits(const char *head_file, const char *want_file, int n_heads)
{
    fixture f;
    open_target(&f);
    cairn_medusa *h = load_heads(&f, head_file);
    assert_int_equal(cairn_medusa_head_count(h), n_heads);
    const size_t per = (size_t)n_heads * f.n_vocab;
    float *feat = read_floats("features.bin", (size_t)N_FEAT * f.dim);
    float *want = read_floats(want_file, N_FEAT * per);
    float *got = malloc(per * sizeof(float));
    for (int n = 0; n < N_FEAT; n++) {
        assert_int_equal(cairn_medusa_logits(h, feat + (size_t)n * f.dim, got), CAIRN_OK);
        for (size_t i = 0; i < per; i++) {
            const float w = want[n * per + i];
            /* float32 sums of 64 products against float64 ones */
            if (!(fabsf(got[i] - w) <= 1e-4f * (1 + fabsf(w))))
                fail_msg("%s: feature %d, head %zu, token %zu: got %.7g, want %.7g", head_file,
                         n, i / f.n_vocab, i % f.n_vocab, got[i], w);
        }
    }
    free(got);
    free(want);
    free(feat);
    cairn_medusa_free(h);
    close_target(&f);
}

static void test_logits_own_lm_heads(void **state)
{
    (void)state;
    check_logits("own.gguf", "own.logits.bin", 3);
}

static void test_logits_pt_checkpoint(void **state)
{
    (void)state;
    FILE *fp = fopen(scratch("own.pt.gguf"), "rb");
    if (!fp) /* medusa_lm_head.pt is written only where torch is installed */
        KT_SKIP("no own.pt.gguf: torch is not installed, so no .pt checkpoint was written "
                "to convert");
    fclose(fp);
    check_logits("own.pt.gguf", "own.logits.bin", 3);
}

static void test_logits_target_lm_head(void **state)
{
    (void)state;
    check_logits("shared.gguf", "shared.logits.bin", 2);
}

/* ---- draft trees ----------------------------------------------------------- */

/* Every path of the tree the widths allow, by brute force: path scores of
 * all prefixes, so the best `budget` can be compared with the drafter's. */
typedef struct {
    float score;
    int depth;
    int32_t tok[CAIRN_MEDUSA_MAX_HEADS];
} path;

static int cmp_path(const void *a, const void *b)
{
    const path *x = a, *y = b;
    return (x->score < y->score) - (x->score > y->score);
}

static double log_softmax_at(const float *logits, int n, int32_t t)
{
    double max = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++)
        if (logits[i] > max)
            max = logits[i];
    for (int i = 0; i < n; i++)
        sum += exp(logits[i] - max);
    return logits[t] - max - log(sum);
}

/* Ranks of head k's tokens: order[k][r] = the r-th best token. */
static void rank_tokens(const float *row, int n, int k, int32_t *order)
{
    for (int r = 0; r < k; r++) {
        int best = -1;
        for (int i = 0; i < n; i++) {
            bool used = false;
            for (int q = 0; q < r; q++)
                used |= order[q] == i;
            if (!used && (best < 0 || row[i] > row[best]))
                best = i;
        }
        order[r] = best;
    }
}

static void check_tree(fixture *f, cairn_medusa *h, const float *logits, int depth, int top_k,
                       int budget)
{
    int32_t tokens[CAIRN_MEDUSA_MAX_ROWS], parents[CAIRN_MEDUSA_MAX_ROWS];
    int n = -1;
    assert_int_equal(cairn_medusa_draft(h, logits, NULL, depth, top_k, budget, tokens, parents, &n),
                     CAIRN_OK);
    const int K = cairn_medusa_head_count(h), D = depth < K ? depth : K;
    int width[CAIRN_MEDUSA_MAX_HEADS];
    for (int k = 0; k < D; k++) {
        width[k] = top_k >> k;
        if (width[k] < 2)
            width[k] = top_k < 2 ? top_k : 2;
    }
    /* all paths the widths allow */
    int32_t order[CAIRN_MEDUSA_MAX_HEADS][CAIRN_MEDUSA_MAX_TOP_K];
    for (int k = 0; k < D; k++)
        rank_tokens(logits + (size_t)k * f->n_vocab, f->n_vocab, width[k], order[k]);
    size_t total = 0, level = 1;
    for (int k = 0; k < D; k++)
        total += (level *= (size_t)width[k]);
    path *all = calloc(total, sizeof *all);
    size_t n_all = 0;
    for (int dd = 1; dd <= D; dd++) {
        size_t count = 1;
        for (int k = 0; k < dd; k++)
            count *= (size_t)width[k];
        for (size_t c = 0; c < count; c++) {
            path *p = &all[n_all++];
            p->depth = dd;
            size_t rest = c;
            for (int k = dd - 1; k >= 0; k--) {
                p->tok[k] = order[k][rest % (size_t)width[k]];
                rest /= (size_t)width[k];
                p->score += (float)log_softmax_at(logits + (size_t)k * f->n_vocab, f->n_vocab,
                                                  p->tok[k]);
            }
        }
    }
    qsort(all, n_all, sizeof *all, cmp_path);
    const int want_n = (size_t)budget < n_all ? budget : (int)n_all;
    assert_int_equal(n, want_n);

    /* every row: parent earlier, depth within D, and its path among the best
     * want_n (up to float ties at the cut) */
    const float cut = want_n > 0 ? all[want_n - 1].score : 0;
    for (int r = 0; r < n; r++) {
        assert_true(parents[r] >= -1 && parents[r] < r);
        int32_t toks[CAIRN_MEDUSA_MAX_HEADS];
        int dd = 0;
        for (int a = r; a >= 0; a = parents[a])
            dd++;
        assert_true(dd >= 1 && dd <= D);
        int i = dd;
        for (int a = r; a >= 0; a = parents[a])
            toks[--i] = tokens[a];
        float score = 0;
        for (int k = 0; k < dd; k++)
            score += (float)log_softmax_at(logits + (size_t)k * f->n_vocab, f->n_vocab, toks[k]);
        if (!(score >= cut - 1e-4f))
            fail_msg("row %d (depth %d) scores %.6f, below the %d-th best path %.6f", r, dd,
                     score, want_n, cut);
        /* no path is drafted twice */
        for (int q = 0; q < r; q++)
            assert_false(parents[q] == parents[r] && tokens[q] == tokens[r]);
    }
    /* row 0 is head 0's best guess: the most likely next-next token */
    if (n > 0) {
        assert_int_equal(parents[0], -1);
        assert_int_equal(tokens[0], order[0][0]);
    }
    free(all);
}

static void test_draft_best_paths(void **state)
{
    (void)state;
    fixture f;
    open_target(&f);
    cairn_medusa *h = load_heads(&f, "own.gguf");
    float *feat = read_floats("features.bin", (size_t)N_FEAT * f.dim);
    float *logits = malloc((size_t)3 * f.n_vocab * sizeof(float));
    const int shapes[][3] = {{3, 8, 32}, {3, 8, 255}, {2, 4, 10}, {1, 16, 5}, {3, 1, 3},
                             {8, 3, 7}, {3, 16, 64}, {3, 8, 0}};
    for (int n = 0; n < N_FEAT; n++) {
        assert_int_equal(cairn_medusa_logits(h, feat + (size_t)n * f.dim, logits), CAIRN_OK);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            check_tree(&f, h, logits, shapes[s][0], shapes[s][1], shapes[s][2]);
    }
    /* features of the real target too: peaked distributions */
    cairn_medusa *m2 = load_heads(&f, "shared.gguf");
    cairn_kv_layout kv;
    assert_int_equal(cairn_model_kv_layout(f.m, 16, CAIRN_TYPE_F32, &kv), CAIRN_OK);
    void *pool = NULL;
    assert_int_equal(f.be->iface->alloc(f.be, 4 * kv.page_bytes, &pool), CAIRN_OK);
    const int32_t pages[4] = {3, 1, 0, 2};
    const int32_t prompt[] = {1, 403, 407, 261, 378, 282, 350, 395, 289};
    const int T = (int)(sizeof prompt / sizeof prompt[0]);
    float *fts = malloc((size_t)T * f.dim * sizeof(float));
    cairn_seq_batch sb = {.tokens = prompt, .n_tokens = T, .kv_start = 0, .pages = pages};
    int n_out = 0;
    assert_int_equal(cairn_model_forward_features(f.m, pool, &kv, &sb, 1, NULL, fts, &n_out),
                     CAIRN_OK);
    for (int t = 0; t < T; t++) {
        assert_int_equal(cairn_medusa_logits(m2, fts + (size_t)t * f.dim, logits), CAIRN_OK);
        check_tree(&f, m2, logits, 2, 8, 20);
    }
    f.be->iface->free(f.be, pool);
    free(fts);
    cairn_medusa_free(m2);
    free(logits);
    free(feat);
    cairn_medusa_free(h);
    close_target(&f);
}

static void test_draft_logit_bias(void **state)
{
    (void)state;
    fixture f;
    open_target(&f);
    cairn_medusa *h = load_heads(&f, "own.gguf");
    float *feat = read_floats("features.bin", (size_t)N_FEAT * f.dim);
    float *logits = malloc((size_t)3 * f.n_vocab * sizeof(float));
    assert_int_equal(cairn_medusa_logits(h, feat, logits), CAIRN_OK);
    /* the least likely token of head 0, forced */
    int worst = 0;
    for (int i = 1; i < f.n_vocab; i++)
        if (logits[i] < logits[worst])
            worst = i;
    cairn_sampling_params sp = cairn_sampling_defaults();
    sp.n_logit_bias = 1;
    sp.logit_bias[0].token = worst;
    sp.logit_bias[0].bias = 100;
    int32_t tokens[CAIRN_MEDUSA_MAX_ROWS], parents[CAIRN_MEDUSA_MAX_ROWS];
    int n = 0;
    assert_int_equal(cairn_medusa_draft(h, logits, &sp, 3, 8, 16, tokens, parents, &n), CAIRN_OK);
    assert_true(n > 0);
    assert_int_equal(tokens[0], worst);
    assert_int_equal(parents[0], -1);
    /* the logits are the caller's and stay as they were */
    float again = logits[worst];
    int32_t t2[CAIRN_MEDUSA_MAX_ROWS], p2[CAIRN_MEDUSA_MAX_ROWS];
    int n2 = 0;
    assert_int_equal(cairn_medusa_draft(h, logits, NULL, 3, 8, 16, t2, p2, &n2), CAIRN_OK);
    assert_true(logits[worst] == again);
    assert_true(t2[0] != worst);
    free(logits);
    free(feat);
    cairn_medusa_free(h);
    close_target(&f);
}

/* ---- errors -------------------------------------------------------------- */

static void expect_refused(fixture *f, const char *path, int rc, const char *says)
{
    char err[512] = "";
    cairn_medusa *h = NULL;
    assert_int_equal(cairn_medusa_load(path, f->m, &h, err, sizeof err), rc);
    assert_null(h);
    if (!strstr(err, says))
        fail_msg("%s: message '%s' does not say '%s'", path, err, says);
}

static void test_errors(void **state)
{
    (void)state;
    fixture f;
    open_target(&f);
    expect_refused(&f, scratch("wrongdim.gguf"), CAIRN_EFORMAT, "does not fit the target");
    expect_refused(&f, scratch("missing.gguf"), CAIRN_EFORMAT,
                   "missing tensor 'medusa.1.res.1.weight'");
    /* an EAGLE head or a model is not a Medusa head */
    expect_refused(&f, getenv("CAIRN_MODEL"), CAIRN_EFORMAT, "not a Medusa head");
    /* a file cut short */
    FILE *in = fopen(scratch("complete.gguf"), "rb"), *out = fopen(scratch("cut.gguf"), "wb");
    assert_non_null(in);
    assert_non_null(out);
    char buf[4096];
    size_t got = fread(buf, 1, sizeof buf, in);
    assert_true(got == sizeof buf);
    fwrite(buf, 1, got, out);
    fclose(in);
    fclose(out);
    char err[512] = "";
    cairn_medusa *h = NULL;
    assert_true(cairn_medusa_load(scratch("cut.gguf"), f.m, &h, err, sizeof err) != CAIRN_OK);
    assert_null(h);
    assert_true(err[0] != 0);
    /* drafting arguments out of range */
    cairn_medusa *ok = load_heads(&f, "complete.gguf");
    float *logits = calloc((size_t)2 * f.n_vocab, sizeof(float));
    int32_t t[4], p[4];
    int n = 0;
    assert_int_equal(cairn_medusa_draft(ok, logits, NULL, 2, 0, 4, t, p, &n), CAIRN_EINVAL);
    assert_int_equal(cairn_medusa_draft(ok, logits, NULL, 2, 17, 4, t, p, &n), CAIRN_EINVAL);
    assert_int_equal(cairn_medusa_draft(ok, logits, NULL, 2, 4, 256, t, p, &n), CAIRN_EINVAL);
    free(logits);
    cairn_medusa_free(ok);
    close_target(&f);
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: %s PYTHON TOOLS_DIR TEST_DIR SCRATCH_DIR\n", argv[0]);
        return 2;
    }
    python = argv[1];
    tools_dir = argv[2];
    test_dir = argv[3];
    scratch_dir = argv[4];
    cairn_log_set_level(CAIRN_LOG_WARN);
    static char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' '%s/medusa_fixture.py' '%s' '%s' '%s'", python, test_dir,
             tools_dir, getenv("CAIRN_MODEL"), scratch_dir);
    int rc = system(cmd);
    if (rc != 0) {
        fprintf(stderr, "test_medusa: '%s' failed (%d)\n", cmd, rc);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logits_own_lm_heads),
        cmocka_unit_test(test_logits_pt_checkpoint),
        cmocka_unit_test(test_logits_target_lm_head),
        cmocka_unit_test(test_draft_best_paths),
        cmocka_unit_test(test_draft_logit_bias),
        cmocka_unit_test(test_errors),
    };
    kt_select_tests(); /* CAIRN_TEST_ONLY / CAIRN_TEST_EXCEPT (tests.cmake) */
    return kt_exit_code(cmocka_run_group_tests(tests, NULL, NULL));
}
