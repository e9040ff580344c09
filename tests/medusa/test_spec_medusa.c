/*
 * tests/medusa/test_spec_medusa.c — speculative decoding with Medusa heads
 * is lossless.
 *
 *   greedy_*    at temperature 0 the output equals plain greedy decoding
 *               token for token, over many prompts and tree shapes: with the
 *               trained heads (models/stories260K-medusa.gguf, which must
 *               also draft well: tau > 1.5 at the default shape), with
 *               random heads converted from the published layout (drafts
 *               mostly rejected), heads reading the target's LM head, and
 *               Medusa combined with n-gram lookup in one tree.
 *   sampling_*  the first two emitted tokens over N seeded runs follow the
 *               target's exact joint distribution p(t1) p(t2 | t1) (chi-
 *               squared at a 0.1% false-alarm rate; the seeds are fixed).
 *   errors      heads of another target are refused.
 *
 * argv[1] python, argv[2] tools/ folder, argv[3] tests/medusa/ folder,
 * argv[4] the trained heads, argv[5] a scratch folder.
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

static const char *python, *tools_dir, *test_dir, *trained_heads, *scratch_dir;
static char random_heads[1024], shared_heads[1024];

#define CAPACITY 512
#define PAGE 16

typedef struct {
    cairn_backend *be;
    cairn_model *m;
    cairn_medusa *heads;
    cairn_spec *spec;
    cairn_kv_layout kv;
    void *pool;
    int32_t pages[CAPACITY / PAGE];     /* for the speculative decoder */
    int32_t ref_pages[CAPACITY / PAGE]; /* for plain decoding          */
    int n_vocab;
} fixture;

static void open_fixture(fixture *f, const char *heads, bool with_ngram)
{
    memset(f, 0, sizeof *f);
    char err[256] = "";
    assert_int_equal(cairn_backend_cpu_create(1, &f->be), CAIRN_OK);
    cairn_model_params p = {.max_batch_tokens = 128, .max_seqs = 1};
    if (cairn_model_load(getenv("CAIRN_MODEL"), f->be, &p, &f->m, err, sizeof err) != CAIRN_OK)
        fail_msg("load %s: %s", getenv("CAIRN_MODEL"), err);
    if (cairn_medusa_load(heads, f->m, &f->heads, err, sizeof err) != CAIRN_OK)
        fail_msg("load heads %s: %s", heads, err);
    f->n_vocab = cairn_model_hparams(f->m)->n_vocab;
    assert_int_equal(cairn_spec_create(f->m, &f->spec), CAIRN_OK);
    assert_int_equal(cairn_spec_add_medusa(f->spec, f->heads), CAIRN_OK);
    if (with_ngram)
        assert_int_equal(cairn_spec_add_ngram(f->spec), CAIRN_OK);
    assert_true(cairn_spec_needs_features(f->spec));
    assert_false(cairn_spec_has_kv(f->spec)); /* the pages are the target's alone */
    assert_int_equal(cairn_spec_kv_layout(f->spec, PAGE, CAIRN_TYPE_F32, &f->kv), CAIRN_OK);
    const int n_pages = 2 * CAPACITY / PAGE;
    assert_int_equal(f->be->iface->alloc(f->be, (size_t)n_pages * f->kv.page_bytes, &f->pool),
                     CAIRN_OK);
    /* scattered, interleaved page tables so page boundaries matter */
    for (int i = 0; i < CAPACITY / PAGE; i++) {
        f->pages[i] = n_pages - 1 - 2 * i;
        f->ref_pages[i] = 2 * i;
    }
}

static void close_fixture(fixture *f)
{
    f->be->iface->free(f->be, f->pool);
    cairn_spec_free(f->spec);
    cairn_medusa_free(f->heads);
    cairn_model_free(f->m);
    cairn_backend_destroy(f->be);
}

/* Plain decoding: tokens[0..n) into ref_pages at kv_start; the logits of
 * the last one. */
static void plain_eval(fixture *f, const int32_t *tokens, int n, int kv_start, float *logits)
{
    cairn_seq_batch sb = {.tokens = tokens, .n_tokens = n, .kv_start = kv_start,
                          .pages = f->ref_pages};
    int n_out = 0;
    assert_int_equal(cairn_model_forward(f->m, f->pool, &f->kv, &sb, 1, logits, NULL, &n_out),
                     CAIRN_OK);
    assert_int_equal(n_out, 1);
}

static void plain_greedy(fixture *f, const int32_t *prompt, int n_prompt, int n_gen, int32_t *out)
{
    float *logits = malloc((size_t)f->n_vocab * sizeof(float));
    plain_eval(f, prompt, n_prompt, 0, logits);
    for (int i = 0; i < n_gen; i++) {
        out[i] = support_argmax(logits, f->n_vocab);
        if (i + 1 < n_gen)
            plain_eval(f, &out[i], 1, n_prompt + i, logits);
    }
    free(logits);
}

/* Drafting every step: the tests measure the tree, not the controller that
 * pauses speculation where it does not pay. */
static int seq_create(fixture *f, const cairn_spec_params *dp, const cairn_sampling_params *sp,
                      cairn_spec_seq **out)
{
    cairn_spec_params p = dp ? *dp : cairn_spec_defaults();
    p.fixed_length = true;
    return cairn_spec_seq_create(f->spec, &p, sp, 0, out);
}

static void spec_generate(fixture *f, cairn_spec_seq *s, const int32_t *prompt, int n_prompt,
                          int n_gen, int32_t *out, double *tau)
{
    assert_int_equal(cairn_spec_seq_begin(s, f->pool, &f->kv, f->pages, CAPACITY, prompt,
                                          n_prompt),
                     CAIRN_OK);
    int32_t *step = malloc((size_t)cairn_spec_seq_max_out(s) * sizeof *step);
    int n = 0;
    while (n < n_gen) {
        int got = 0;
        assert_int_equal(cairn_spec_seq_step(s, step, cairn_spec_seq_max_out(s), &got), CAIRN_OK);
        assert_true(got >= 1);
        for (int i = 0; i < got && n < n_gen; i++)
            out[n++] = step[i];
    }
    free(step);
    cairn_spec_stats st;
    cairn_spec_seq_stats(s, &st);
    if (tau)
        *tau = (double)st.tokens / (double)st.steps;
}

/* BOS, then pseudo-random ids (lengths vary so page boundaries move). */
static int make_prompt(int i, int n_vocab, int32_t *p)
{
    int n = 1 + (i * 7) % 23;
    uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 3);
    p[0] = 1;
    for (int j = 1; j < n; j++)
        p[j] = 3 + (int32_t)(support_xorshift64(&x) % (uint64_t)(n_vocab - 3));
    return n;
}

/* ---- greedy ---------------------------------------------------------------- */

static const cairn_spec_params shapes[] = {
    {.depth = 1, .top_k = 1, .n_draft = 1},
    {.depth = 2, .top_k = 3, .n_draft = 5},
    {.depth = 3, .top_k = 2, .n_draft = 6},
    {.depth = 5, .top_k = 8, .n_draft = 32}, /* the defaults */
    {.depth = 8, .top_k = 16, .n_draft = 100},
};
#define N_SHAPES (int)(sizeof shapes / sizeof shapes[0])

static void greedy_case(const char *heads, bool with_ngram, int n_prompts, int n_gen,
                        double *tau_out)
{
    fixture f;
    open_fixture(&f, heads, with_ngram);
    int32_t prompt[32], ref[256], got[256];
    for (int sh = 0; sh < N_SHAPES; sh++) {
        cairn_spec_params dp = cairn_spec_defaults();
        dp.depth = shapes[sh].depth;
        dp.top_k = shapes[sh].top_k;
        dp.n_draft = shapes[sh].n_draft;
        if (dp.chain_max > dp.n_draft)
            dp.chain_max = dp.n_draft;
        cairn_spec_seq *s;
        assert_int_equal(seq_create(&f, &dp, NULL, &s), CAIRN_OK);
        double tau_sum = 0;
        for (int i = 0; i < n_prompts; i++) {
            const int n = make_prompt(i, f.n_vocab, prompt);
            plain_greedy(&f, prompt, n, n_gen, ref);
            double tau;
            spec_generate(&f, s, prompt, n, n_gen, got, &tau);
            tau_sum += tau;
            for (int j = 0; j < n_gen; j++)
                if (got[j] != ref[j])
                    fail_msg("%s, depth %d top_k %d n %d, prompt %d: token %d is %d, plain "
                             "greedy gives %d",
                             heads, dp.depth, dp.top_k, dp.n_draft, i, j, got[j], ref[j]);
        }
        print_message("%s%s depth %d top_k %2d n %3d: tau %.2f over %d prompts\n",
                      strrchr(heads, '/') + 1, with_ngram ? " + ngram" : "", dp.depth, dp.top_k,
                      dp.n_draft, tau_sum / n_prompts, n_prompts);
        if (tau_out)
            tau_out[sh] = tau_sum / n_prompts;
        cairn_spec_seq_free(s);
    }
    close_fixture(&f);
}

static void test_greedy_trained(void **state)
{
    (void)state;
    double tau[N_SHAPES];
    greedy_case(trained_heads, false, 16, 64, tau);
    /* the shipped heads must actually draft: 2.13 tokens per target forward
     * at the default shape (greedy, deterministic; AVX2 and AVX-512 alike).
     * The floor sits just under it, so that heads reading a partly wrong or
     * uninitialised hidden state (the class of bug tests/eagle3's
     * test_greedy_trained records: 1.1-1.45 against 3.08) fail here. */
    if (!(tau[3] > 1.9))
        fail_msg("trained Medusa heads: tau %.2f at the default shape, want > 1.9 (2.13 measured)",
                 tau[3]);
}

static void test_greedy_random_published(void **state)
{
    (void)state;
    greedy_case(random_heads, false, 6, 48, NULL);
}

static void test_greedy_target_lm_head(void **state)
{
    (void)state;
    greedy_case(shared_heads, false, 6, 48, NULL);
}

static void test_greedy_with_ngram(void **state)
{
    (void)state;
    greedy_case(trained_heads, true, 8, 64, NULL);
}

/* ---- sampling distribution -------------------------------------------------- */

/* The sampler's distribution, written out: top-k, min-p, top-p (mass over
 * the top-k survivors), temperature. */
static void ref_probs(const float *logits, int n, const cairn_sampling_params *p, double *out)
{
    int *ids = calloc((size_t)n + 1, sizeof(int));
    for (int i = 0; i < n; i++)
        ids[i] = i;
    for (int i = 1; i < n; i++) { /* insertion sort, logit desc, id asc */
        int v = ids[i], j = i;
        while (j > 0 && logits[ids[j - 1]] < logits[v])
            ids[j] = ids[j - 1], j--;
        ids[j] = v;
    }
    int keep = p->top_k > 0 && p->top_k < n ? p->top_k : n;
    double best = logits[ids[0]], z = 0;
    for (int i = 0; i < keep; i++)
        z += exp(logits[ids[i]] - best);
    if (p->min_p > 0) {
        int k2 = 0;
        while (k2 < keep && logits[ids[k2]] >= best + log(p->min_p))
            k2++;
        keep = k2;
    }
    if (p->top_p < 1) {
        double cum = 0;
        for (int i = 0; i < keep; i++) {
            cum += exp(logits[ids[i]] - best);
            if (cum >= p->top_p * z) {
                keep = i + 1;
                break;
            }
        }
    }
    double tot = 0;
    for (int i = 0; i < n; i++)
        out[i] = 0;
    for (int i = 0; i < keep; i++)
        tot += out[ids[i]] = exp((logits[ids[i]] - best) / p->temperature);
    for (int i = 0; i < keep; i++)
        out[ids[i]] /= tot;
    free(ids);
}

static void sampling_case(const char *heads, const cairn_sampling_params *sp,
                          const cairn_spec_params *dp, int n_runs)
{
    fixture f;
    open_fixture(&f, heads, false);
    /* "Once upon a time, there was a": an uncertain next word, then another */
    const int32_t prompt[] = {1, 403, 407, 261, 378, 432, 383, 286, 261};
    const int n_prompt = 9, nv = f.n_vocab;

    double *p1 = malloc((size_t)nv * sizeof(double));
    double *p2 = malloc((size_t)nv * sizeof(double));
    double *joint = calloc((size_t)nv * nv, sizeof(double));
    float *logits = malloc((size_t)nv * sizeof(float));
    plain_eval(&f, prompt, n_prompt, 0, logits);
    ref_probs(logits, nv, sp, p1);
    for (int a = 0; a < nv; a++) {
        if (p1[a] == 0)
            continue;
        plain_eval(&f, prompt, n_prompt, 0, logits);
        plain_eval(&f, (const int32_t[]){a}, 1, n_prompt, logits);
        ref_probs(logits, nv, sp, p2);
        for (int b = 0; b < nv; b++)
            joint[(size_t)a * nv + b] = p1[a] * p2[b];
    }

    int *count = calloc((size_t)nv * nv, sizeof(int));
    int64_t accepted = 0;
    for (int run = 0; run < n_runs; run++) {
        cairn_sampling_params s = *sp;
        s.seed = 5000 + (uint64_t)run;
        cairn_spec_seq *q;
        assert_int_equal(seq_create(&f, dp, &s, &q), CAIRN_OK);
        int32_t out[2];
        spec_generate(&f, q, prompt, n_prompt, 2, out, NULL);
        count[(size_t)out[0] * nv + out[1]]++;
        cairn_spec_stats st;
        cairn_spec_seq_stats(q, &st);
        accepted += st.accepted;
        cairn_spec_seq_free(q);
    }
    /* the drafts were used, or the test would check plain sampling only */
    assert_true(accepted > n_runs / 10);

    double chi2 = 0, pooled_e = 0;
    int pooled_o = 0, df = -1;
    for (size_t c = 0; c < (size_t)nv * nv; c++) {
        const double e = joint[c] * n_runs;
        if (joint[c] == 0 && count[c] > 0)
            fail_msg("drew (%zu, %zu), which the target never samples", c / nv, c % nv);
        if (e >= 5) {
            chi2 += (count[c] - e) * (count[c] - e) / e;
            df++;
        } else {
            pooled_e += e;
            pooled_o += count[c];
        }
    }
    if (pooled_e > 0) {
        chi2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
        df++;
    }
    assert_true(df >= 10);
    const double crit = support_chi2_critical(df);
    print_message("temp %.2f top_k %d top_p %.2f: chi2 %.1f, df %d, 0.1%% critical %.1f, "
                  "%.2f drafts accepted per run\n",
                  sp->temperature, sp->top_k, sp->top_p, chi2, df, crit,
                  (double)accepted / n_runs);
    if (chi2 > crit)
        fail_msg("speculative sampling does not follow the target (chi2 %.1f > %.1f)", chi2, crit);
    free(count);
    free(p1);
    free(p2);
    free(joint);
    free(logits);
    close_fixture(&f);
}

static cairn_sampling_params sampling(float t, int k, float p, float m)
{
    cairn_sampling_params sp = cairn_sampling_defaults();
    sp.temperature = t;
    sp.top_k = k;
    sp.top_p = p;
    sp.min_p = m;
    return sp;
}

static void test_sampling_plain_softmax(void **state)
{
    (void)state;
    const cairn_sampling_params sp = sampling(1.0f, 0, 1.0f, 0.0f);
    cairn_spec_params dp = cairn_spec_defaults();
    dp.depth = 3, dp.top_k = 4, dp.n_draft = 16;
    sampling_case(trained_heads, &sp, &dp, 3000);
}

static void test_sampling_truncated(void **state)
{
    (void)state;
    const cairn_sampling_params sp = sampling(0.9f, 12, 0.9f, 0.02f);
    sampling_case(trained_heads, &sp, NULL, 3000);
}

/* ---- errors ------------------------------------------------------------------ */

static void test_errors(void **state)
{
    (void)state;
    fixture f;
    open_fixture(&f, trained_heads, false);
    /* heads loaded for another target (another load of the same file) */
    char err[256] = "";
    cairn_model *other = NULL;
    cairn_model_params p = {.max_batch_tokens = 64, .max_seqs = 1};
    assert_int_equal(cairn_model_load(getenv("CAIRN_MODEL"), f.be, &p, &other, err, sizeof err),
                     CAIRN_OK);
    cairn_spec *s2 = NULL;
    assert_int_equal(cairn_spec_create(other, &s2), CAIRN_OK);
    assert_int_equal(cairn_spec_add_medusa(s2, f.heads), CAIRN_EINVAL);
    assert_int_equal(cairn_spec_count(s2), 0);
    cairn_spec_free(s2);
    cairn_model_free(other);
    /* once per spec */
    assert_int_equal(cairn_spec_add_medusa(f.spec, f.heads), CAIRN_EINVAL);
    assert_true(cairn_spec_method_mask(f.spec, "medusa") != 0);
    close_fixture(&f);
}

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: %s PYTHON TOOLS_DIR TEST_DIR TRAINED_HEADS SCRATCH_DIR\n",
                argv[0]);
        return 2;
    }
    python = argv[1];
    tools_dir = argv[2];
    test_dir = argv[3];
    trained_heads = argv[4];
    scratch_dir = argv[5];
    cairn_log_set_level(CAIRN_LOG_WARN);
    snprintf(random_heads, sizeof random_heads, "%s/own.gguf", scratch_dir);
    snprintf(shared_heads, sizeof shared_heads, "%s/shared.gguf", scratch_dir);
    static char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' '%s/medusa_fixture.py' '%s' '%s' '%s'", python, test_dir,
             tools_dir, getenv("CAIRN_MODEL"), scratch_dir);
    int rc = system(cmd);
    if (rc != 0) {
        fprintf(stderr, "test_spec_medusa: '%s' failed (%d)\n", cmd, rc);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_trained),
        cmocka_unit_test(test_greedy_random_published),
        cmocka_unit_test(test_greedy_target_lm_head),
        cmocka_unit_test(test_greedy_with_ngram),
        cmocka_unit_test(test_sampling_plain_softmax),
        cmocka_unit_test(test_sampling_truncated),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
