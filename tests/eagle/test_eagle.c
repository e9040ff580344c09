/*
 * tests/eagle/test_eagle.c — speculative decoding is lossless, with every
 * method (EAGLE heads, n-gram lookup, draft models) alone and together.
 *
 *   tree_mask      one target forward over a token tree (tree mask, positions
 *                  prefix + depth) gives, for every node, the logits and
 *                  features of decoding that node's path one token at a time.
 *   greedy_*       at temperature 0 the speculative output equals plain
 *                  greedy decoding token for token: many prompts, several
 *                  tree shapes, on stories260K with the shipped head and on a
 *                  synthetic model with a randomly initialised head (whose
 *                  drafts are mostly rejected: the other branch of the rule).
 *   sampling_*     with sampling, the first two emitted tokens over N runs
 *                  (fixed seeds) follow the target's own joint distribution
 *                  p(t1) p(t2 | t1), computed exactly here, by a chi-squared
 *                  test at false-alarm rate 0.1% per case (the seeds are
 *                  fixed, so the outcome is deterministic).
 *   ngram, draft_model, combined
 *                  the same two checks for prompt lookup, a draft model (the
 *                  target itself: every guess taken; a random model of
 *                  another page geometry: most rejected) and all methods
 *                  adding to one tree.
 *   errors         bad parameters, mismatched heads and draft models of
 *                  another vocabulary are refused.
 *
 * argv[1] python, argv[2] tools/ folder, argv[3] the shipped head
 * (models/stories260K-eagle.gguf), argv[4] a scratch folder for the synthetic
 * model and random head this test generates.
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

static const char *python, *tools_dir, *shipped_head, *scratch_dir;
static char synth_model[1024], synth_head[1024], rand_head_260k[1024], synth_v600[1024];

#define CAPACITY 512
#define PAGE 16

typedef struct {
    cairn_backend *be;
    cairn_model *m;
    cairn_eagle *head;   /* NULL without one */
    cairn_model *draft;  /* a draft model, or NULL */
    cairn_spec *spec;    /* the methods */
    cairn_kv_layout kv;
    void *pool;
    int32_t pages[CAPACITY / PAGE];     /* for the speculative decoder */
    int32_t ref_pages[CAPACITY / PAGE]; /* for plain decoding          */
    int n_vocab, dim;
} fixture;

/* The target `model` with the methods asked for, in the order they draft:
 * n-gram lookup, a draft model (a GGUF path), an EAGLE head (a path). */
static void open_fixture_with(fixture *f, const char *model, bool ngram, const char *draft,
                              const char *head)
{
    memset(f, 0, sizeof *f);
    char err[256] = "";
    /* one thread: a 260K-parameter model gains nothing from more, and the
     * test stays quick on a busy machine */
    assert_int_equal(cairn_backend_cpu_create(1, &f->be), CAIRN_OK);
    cairn_model_params p = {.max_batch_tokens = 128, .max_seqs = 1};
    int rc = cairn_model_load(model, f->be, &p, &f->m, err, sizeof err);
    if (rc != CAIRN_OK)
        fail_msg("load %s: %s", model, err);
    assert_int_equal(cairn_spec_create(f->m, &f->spec), CAIRN_OK);
    if (ngram)
        assert_int_equal(cairn_spec_add_ngram(f->spec), CAIRN_OK);
    if (draft) {
        rc = cairn_model_load(draft, f->be, &p, &f->draft, err, sizeof err);
        if (rc != CAIRN_OK)
            fail_msg("load draft model %s: %s", draft, err);
        rc = cairn_spec_add_draft_model(f->spec, f->draft, err, sizeof err);
        if (rc != CAIRN_OK)
            fail_msg("add draft model %s: %s", draft, err);
    }
    if (head) {
        rc = cairn_eagle_load(head, f->m, &f->head, err, sizeof err);
        if (rc != CAIRN_OK)
            fail_msg("load head %s: %s", head, err);
        assert_int_equal(cairn_spec_add_eagle(f->spec, f->head), CAIRN_OK);
    }
    f->n_vocab = cairn_model_hparams(f->m)->n_vocab;
    f->dim = cairn_model_hparams(f->m)->dim;
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

static void open_fixture(fixture *f, const char *model, const char *head)
{
    open_fixture_with(f, model, false, NULL, head);
}

static void close_fixture(fixture *f)
{
    f->be->iface->free(f->be, f->pool);
    cairn_spec_free(f->spec);
    cairn_eagle_free(f->head);
    cairn_model_free(f->draft);
    cairn_model_free(f->m);
    cairn_backend_destroy(f->be);
}

/* Plain decoding: evaluate tokens[0..n) into ref_pages (one call) and
 * return the logits [n_vocab] and feature [dim] of the last one. */
static void plain_eval(fixture *f, const int32_t *tokens, int n, int kv_start, float *logits,
                       float *hidden)
{
    cairn_seq_batch sb = {.tokens = tokens, .n_tokens = n, .kv_start = kv_start,
                          .pages = f->ref_pages};
    int n_out = 0;
    assert_int_equal(cairn_model_forward(f->m, f->pool, &f->kv, &sb, 1, logits, hidden, &n_out),
                     CAIRN_OK);
    assert_int_equal(n_out, 1);
}

/* logits += the logit bias of `sp` (NULL: none), written out here. */
static void add_bias(float *logits, const cairn_sampling_params *sp)
{
    for (int i = 0; sp && i < sp->n_logit_bias; i++)
        logits[sp->logit_bias[i].token] += sp->logit_bias[i].bias;
}

/* Greedy continuation of n_gen tokens, one token per forward call, with the
 * logit bias of `sp` (NULL: none). */
static void plain_greedy_biased(fixture *f, const int32_t *prompt, int n_prompt, int n_gen,
                                const cairn_sampling_params *sp, int32_t *out)
{
    float *logits = malloc((size_t)f->n_vocab * sizeof(float));
    plain_eval(f, prompt, n_prompt, 0, logits, NULL);
    for (int i = 0; i < n_gen; i++) {
        add_bias(logits, sp);
        out[i] = support_argmax(logits, f->n_vocab);
        if (i + 1 < n_gen)
            plain_eval(f, &out[i], 1, n_prompt + i, logits, NULL);
    }
    free(logits);
}

static void plain_greedy(fixture *f, const int32_t *prompt, int n_prompt, int n_gen, int32_t *out)
{
    plain_greedy_biased(f, prompt, n_prompt, n_gen, NULL, out);
}

/* A decoder of the head alone with tree shape dp (NULL: the defaults),
 * drafting every step: these tests measure the tree, not the controller
 * that pauses speculation where it does not pay (it never pays on a model
 * this small). */
static int seq_create(fixture *f, const cairn_spec_params *dp, const cairn_sampling_params *sp,
                      cairn_spec_seq **out)
{
    cairn_spec_params p = dp ? *dp : cairn_spec_defaults();
    p.fixed_length = true;
    return cairn_spec_seq_create(f->spec, &p, sp, 0, out);
}

/* Steps of a begun (or adopted) sequence until n_gen tokens are out (a
 * step emits several; the last one's extra tokens are dropped). */
static void spec_steps(cairn_spec_seq *s, int n_gen, int32_t *out)
{
    int n = 0;
    while (n < n_gen) {
        int32_t step[32];
        int got = 0;
        assert_int_equal(cairn_spec_seq_step(s, step, 32, &got), CAIRN_OK);
        assert_true(got >= 1);
        for (int i = 0; i < got && n < n_gen; i++)
            out[n++] = step[i];
    }
}

/* Speculative continuation: at least n_gen tokens (steps emit several). */
static void spec_generate(fixture *f, cairn_spec_seq *s, const int32_t *prompt, int n_prompt,
                          int n_gen, int32_t *out, double *tau)
{
    assert_int_equal(cairn_spec_seq_begin(s, f->pool, &f->kv, f->pages, CAPACITY, prompt,
                                           n_prompt),
                     CAIRN_OK);
    spec_steps(s, n_gen, out);
    cairn_spec_stats st;
    cairn_spec_seq_stats(s, &st);
    if (tau)
        *tau = (double)st.tokens / (double)st.steps;
}

/* Deterministic prompts: BOS, then pseudo-random ids (different lengths so
 * page boundaries fall in different places). */
static int make_prompt(int i, int n_vocab, int32_t *p)
{
    int n = 1 + (i * 7) % 23;
    uint64_t x = 0x2545F4914F6CDD1Dull * (uint64_t)(i + 1);
    p[0] = 1;
    for (int j = 1; j < n; j++)
        p[j] = 3 + (int32_t)(support_xorshift64(&x) % (uint64_t)(n_vocab - 3));
    return n;
}

/* ---- tree mask ------------------------------------------------------------ */

static void test_tree_mask(void **state)
{
    (void)state;
    fixture f;
    open_fixture(&f, getenv("CAIRN_MODEL"), shipped_head);
    const int32_t prefix[] = {1, 403, 407, 261, 378, 432, 383};
    const int n_prefix = 7;
    /* tree rows: 0 root(286), 1..3 children of 0, 4..5 children of 1,
     * 6 child of 3, 7 child of 4, 8 child of 7 */
    const int32_t tok[] = {286, 261, 300, 17, 376, 261, 99, 298, 315};
    const int parent[] = {-1, 0, 0, 0, 1, 1, 3, 4, 7};
    const int T = 9;
    int depth[9];
    for (int r = 0; r < T; r++)
        depth[r] = parent[r] < 0 ? 0 : depth[parent[r]] + 1;

    float *logits = malloc((size_t)T * f.n_vocab * sizeof(float));
    float *hidden = malloc((size_t)T * f.dim * sizeof(float));
    float *ref_l = malloc((size_t)f.n_vocab * sizeof(float));
    float *ref_h = malloc((size_t)f.dim * sizeof(float));
    /* prefix into the tree's pages, then the tree in one call */
    cairn_seq_batch pre = {.tokens = prefix, .n_tokens = n_prefix, .pages = f.pages};
    int n_out;
    assert_int_equal(cairn_model_forward(f.m, f.pool, &f.kv, &pre, 1, NULL, NULL, &n_out), CAIRN_OK);
    const int n_kv = n_prefix + T;
    uint8_t *mask = calloc((size_t)T * n_kv, 1);
    int32_t pos[9];
    uint8_t want[9];
    for (int r = 0; r < T; r++) {
        memset(mask + (size_t)r * n_kv, 1, n_prefix);
        for (int a = r; a >= 0; a = parent[a])
            mask[(size_t)r * n_kv + n_prefix + a] = 1;
        pos[r] = n_prefix + depth[r];
        want[r] = 1;
    }
    cairn_seq_batch tree = {.tokens = tok, .n_tokens = T, .pos = pos, .kv_start = n_prefix,
                            .pages = f.pages, .mask = mask, .want = want};
    assert_int_equal(cairn_model_forward(f.m, f.pool, &f.kv, &tree, 1, logits, hidden, &n_out),
                     CAIRN_OK);
    assert_int_equal(n_out, T);

    /* every node against sequential decoding of prefix + its path */
    for (int r = 0; r < T; r++) {
        int32_t path[16];
        int n_path = 0;
        for (int a = r; a >= 0; a = parent[a])
            path[n_path++] = tok[a];
        int32_t seq[32];
        memcpy(seq, prefix, sizeof prefix);
        for (int i = 0; i < n_path; i++)
            seq[n_prefix + i] = path[n_path - 1 - i];
        plain_eval(&f, seq, n_prefix, 0, ref_l, NULL);
        for (int i = 0; i < n_path; i++)
            plain_eval(&f, &seq[n_prefix + i], 1, n_prefix + i, ref_l, ref_h);
        double max_d = 0, max_h = 0;
        for (int v = 0; v < f.n_vocab; v++)
            max_d = fmax(max_d, fabs((double)logits[(size_t)r * f.n_vocab + v] - ref_l[v]));
        for (int d = 0; d < f.dim; d++)
            max_h = fmax(max_h, fabs((double)hidden[(size_t)r * f.dim + d] - ref_h[d]));
        if (max_d > 1e-3 || max_h > 1e-4)
            fail_msg("tree row %d: logits differ by %g, features by %g", r, max_d, max_h);
    }
    free(mask);
    free(logits);
    free(hidden);
    free(ref_l);
    free(ref_h);
    close_fixture(&f);
}

/* ---- greedy ---------------------------------------------------------------- */

/* Prompts whose second half repeats part of the first, as a quoted
 * passage does: prompt lookup has something to copy. */
static int make_copy_prompt(int i, int n_vocab, int32_t *p)
{
    const int n = make_prompt(i + 100, n_vocab, p);
    const int from = 1 + i % 3, len = n - from < 9 ? n - from : 9;
    int m = n;
    for (int j = 0; j < len && m < 32; j++)
        p[m++] = p[from + j];
    return m;
}

static void greedy_case_with(const char *model, bool ngram, const char *draft, const char *head,
                             int n_prompts, int n_gen, const cairn_spec_params *shapes,
                             int n_shapes, double *tau_out, bool adaptive)
{
    fixture f;
    open_fixture_with(&f, model, ngram, draft, head);
    int32_t prompt[48], ref[256], got[256];
    for (int sh = 0; sh < n_shapes; sh++) {
        cairn_spec_seq *s;
        cairn_spec_params dp = shapes[sh];
        if (adaptive) /* the controller decides, as a server's does */
            assert_int_equal(cairn_spec_seq_create(f.spec, &dp, NULL, 0, &s), CAIRN_OK);
        else
            assert_int_equal(seq_create(&f, &dp, NULL, &s), CAIRN_OK);
        double tau_sum = 0;
        for (int i = 0; i < n_prompts; i++) {
            const int n = ngram && i % 2 ? make_copy_prompt(i, f.n_vocab, prompt)
                                         : make_prompt(i, f.n_vocab, prompt);
            plain_greedy(&f, prompt, n, n_gen, ref);
            double tau;
            spec_generate(&f, s, prompt, n, n_gen, got, &tau);
            tau_sum += tau;
            for (int j = 0; j < n_gen; j++)
                if (got[j] != ref[j])
                    fail_msg("shape depth %d top_k %d n %d, prompt %d: token %d is %d, plain "
                             "greedy gives %d",
                             shapes[sh].depth, shapes[sh].top_k, shapes[sh].n_draft, i, j, got[j],
                             ref[j]);
        }
        print_message("%s depth %d top_k %2d n %3d chain %2d: tau %.2f over %d prompts\n",
                      cairn_spec_describe(f.spec), shapes[sh].depth, shapes[sh].top_k,
                      shapes[sh].n_draft, shapes[sh].chain_max, tau_sum / n_prompts, n_prompts);
        if (tau_out)
            tau_out[sh] = tau_sum / n_prompts;
        cairn_spec_seq_free(s);
    }
    close_fixture(&f);
}

static void greedy_case(const char *model, const char *head, int n_prompts, int n_gen,
                        const cairn_spec_params *shapes, int n_shapes, double *tau_out)
{
    greedy_case_with(model, false, NULL, head, n_prompts, n_gen, shapes, n_shapes, tau_out, false);
}

static const cairn_spec_params shapes[] = {
    {.depth = 1, .top_k = 1, .n_draft = 1},
    {.depth = 2, .top_k = 3, .n_draft = 5},
    {.depth = 4, .top_k = 2, .n_draft = 6},
    {.depth = 5, .top_k = 8, .n_draft = 32},
    {.depth = 7, .top_k = 10, .n_draft = 60},
    {.depth = 3, .top_k = 16, .n_draft = 100},
};
#define N_SHAPES (int)(sizeof shapes / sizeof shapes[0])

static void test_greedy_bundled(void **state)
{
    (void)state;
    double tau[N_SHAPES];
    greedy_case(getenv("CAIRN_MODEL"), shipped_head, 16, 64, shapes, N_SHAPES, tau);
    /* The shipped head must actually draft well at the default shape (goal
     * 3): measured 3.55 (greedy, deterministic; AVX2 and AVX-512 alike). The
     * floor sits just under it: a head fed half-initialised features made
     * 1.1-1.45 against 3.08 in tests/eagle3 (test_spec_eagle3.c), which a
     * loose floor did not catch. */
    if (!(tau[3] > 3.2))
        fail_msg("shipped EAGLE head: tau %.2f at the default shape, want > 3.2 (3.55 measured)",
                 tau[3]);
    /* the controller pauses a head that does not pay (none does on a model
     * this small) for long stretches: the head must keep its features in
     * bounds meanwhile, and the tokens stay the same */
    greedy_case_with(getenv("CAIRN_MODEL"), false, NULL, shipped_head, 4, 240, shapes + 3, 1, NULL,
                     true);
}

static void test_greedy_bundled_random_head(void **state)
{
    (void)state;
    greedy_case(getenv("CAIRN_MODEL"), rand_head_260k, 6, 48, shapes + 1, 3, NULL);
}

static void test_greedy_synthetic(void **state)
{
    (void)state;
    greedy_case(synth_model, synth_head, 8, 48, shapes, N_SHAPES, NULL);
}

/* ---- sampling distribution -------------------------------------------------- */

/* The sampler's distribution, written out independently: top-k, min-p, top-p
 * (mass over the top-k survivors), temperature. */
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

static void sampling_case_with(bool ngram, const char *draft, const char *head,
                               const cairn_sampling_params *sp, const cairn_spec_params *dp,
                               int n_runs)
{
    fixture f;
    open_fixture_with(&f, getenv("CAIRN_MODEL"), ngram, draft, head);
    /* "Once upon a time, there was a": an uncertain next word (entropy
     * ~1.8 nats), then another (~1.1), so the joint has many cells */
    const int32_t prompt[] = {1, 403, 407, 261, 378, 432, 383, 286, 261};
    const int n_prompt = 9, nv = f.n_vocab;

    /* exact joint distribution of (t1, t2) */
    double *p1 = malloc((size_t)nv * sizeof(double));
    double *joint = calloc((size_t)nv * nv, sizeof(double));
    float *logits = malloc((size_t)nv * sizeof(float));
    plain_eval(&f, prompt, n_prompt, 0, logits, NULL);
    add_bias(logits, sp);
    ref_probs(logits, nv, sp, p1);
    double *p2 = malloc((size_t)nv * sizeof(double));
    for (int a = 0; a < nv; a++) {
        if (p1[a] == 0)
            continue;
        plain_eval(&f, prompt, n_prompt, 0, logits, NULL);
        plain_eval(&f, (const int32_t[]){a}, 1, n_prompt, logits, NULL);
        add_bias(logits, sp);
        ref_probs(logits, nv, sp, p2);
        for (int b = 0; b < nv; b++)
            joint[(size_t)a * nv + b] = p1[a] * p2[b];
    }

    /* observed */
    int *count = calloc((size_t)nv * nv, sizeof(int));
    for (int run = 0; run < n_runs; run++) {
        cairn_sampling_params s = *sp;
        s.seed = 1000 + (uint64_t)run;
        cairn_spec_seq *q;
        assert_int_equal(seq_create(&f, dp, &s, &q), CAIRN_OK);
        int32_t out[2];
        spec_generate(&f, q, prompt, n_prompt, 2, out, NULL);
        count[(size_t)out[0] * nv + out[1]]++;
        cairn_spec_seq_free(q);
    }

    /* cells expected >= 5 alone, the rest pooled; a draw of probability 0 fails */
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
    assert_true(df >= 10); /* a test with power: many cells */
    const double crit = support_chi2_critical(df);
    print_message("temp %.2f top_k %d top_p %.2f: chi2 %.1f, df %d, 0.1%% critical %.1f\n",
                  sp->temperature, sp->top_k, sp->top_p, chi2, df, crit);
    if (chi2 > crit)
        fail_msg("speculative sampling does not follow the target (chi2 %.1f > %.1f)", chi2, crit);
    free(count);
    free(p1);
    free(p2);
    free(joint);
    free(logits);
    close_fixture(&f);
}

static void sampling_case(const char *head, const cairn_sampling_params *sp,
                          const cairn_spec_params *dp, int n_runs)
{
    sampling_case_with(false, NULL, head, sp, dp, n_runs);
}

/* Sampling settings: temperature t, top-k k, top-p p, min-p m. */
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
    const cairn_spec_params dp = {.depth = 4, .top_k = 4, .n_draft = 16};
    sampling_case(shipped_head, &sp, &dp, 3000);
}

static void test_sampling_truncated(void **state)
{
    (void)state;
    const cairn_sampling_params sp = sampling(0.9f, 12, 0.9f, 0.02f);
    const cairn_spec_params dp = {.depth = 5, .top_k = 8, .n_draft = 32};
    sampling_case(shipped_head, &sp, &dp, 3000);
}

static void test_sampling_random_head(void **state)
{
    (void)state;
    const cairn_sampling_params sp = sampling(1.0f, 20, 1.0f, 0.0f);
    const cairn_spec_params dp = {.depth = 3, .top_k = 6, .n_draft = 12};
    sampling_case(rand_head_260k, &sp, &dp, 3000);
}

/* A logit bias is part of the target distribution: sampled speculation
 * follows the biased distribution exactly, and greedy speculation gives the
 * biased argmax (a banned favourite, a token pushed to the top). */
static void test_sampling_logit_bias(void **state)
{
    (void)state;
    cairn_sampling_params sp = sampling(1.0f, 0, 1.0f, 0.0f);
    sp.n_logit_bias = 3;
    sp.logit_bias[0].token = 261; /* " a" */
    sp.logit_bias[0].bias = 2.0f;
    sp.logit_bias[1].token = 286;
    sp.logit_bias[1].bias = -3.0f;
    sp.logit_bias[2].token = 400;
    sp.logit_bias[2].bias = 3.0f;
    const cairn_spec_params dp = {.depth = 4, .top_k = 4, .n_draft = 16};
    sampling_case(shipped_head, &sp, &dp, 3000);
}

static void test_greedy_logit_bias(void **state)
{
    (void)state;
    fixture f;
    open_fixture(&f, getenv("CAIRN_MODEL"), shipped_head);
    int32_t prompt[32], ref[48], got[48];
    const int n = make_prompt(3, f.n_vocab, prompt), n_gen = 40;
    plain_greedy(&f, prompt, n, 1, ref);
    cairn_sampling_params sp = cairn_sampling_defaults();
    sp.temperature = 0;
    sp.n_logit_bias = 2;
    sp.logit_bias[0].token = ref[0]; /* the favourite, banned */
    sp.logit_bias[0].bias = -100.0f;
    sp.logit_bias[1].token = 378;
    sp.logit_bias[1].bias = 4.0f;
    plain_greedy_biased(&f, prompt, n, n_gen, &sp, ref);
    cairn_spec_seq *s;
    assert_int_equal(seq_create(&f, &shapes[3], &sp, &s), CAIRN_OK);
    double tau;
    spec_generate(&f, s, prompt, n, n_gen, got, &tau);
    for (int j = 0; j < n_gen; j++)
        if (got[j] != ref[j])
            fail_msg("biased greedy: token %d is %d, plain biased greedy gives %d", j, got[j],
                     ref[j]);
    print_message("biased greedy: tau %.2f\n", tau);
    cairn_spec_seq_free(s);
    close_fixture(&f);
}

/* ---- errors ------------------------------------------------------------------ */

/* ---- the other methods, alone and together ------------------------------ */

/* chain lengths and budgets for the chain drafters (n-gram lookup, a draft
 * model): a chain of one, budgets below and above the chain, longest */
static const cairn_spec_params chain_shapes[] = {
    {.depth = 5, .top_k = 8, .n_draft = 1, .chain_max = 1},
    {.depth = 5, .top_k = 8, .n_draft = 6, .chain_max = 4, .ngram_min = 1, .ngram_max = 3},
    {.depth = 5, .top_k = 8, .n_draft = 32, .chain_max = 12},
    {.depth = 3, .top_k = 4, .n_draft = 10, .chain_max = 16, .ngram_min = 2, .ngram_max = 8},
};
#define N_CHAIN_SHAPES (int)(sizeof chain_shapes / sizeof chain_shapes[0])

static void test_greedy_ngram(void **state)
{
    (void)state;
    double tau[N_CHAIN_SHAPES];
    greedy_case_with(getenv("CAIRN_MODEL"), true, NULL, NULL, 16, 96, chain_shapes,
                     N_CHAIN_SHAPES, tau, false);
    /* stories260K repeats itself and half the prompts quote themselves:
     * lookup must find something to copy */
    assert_true(tau[2] > 1.2);
    /* the controller's choices (from measured times) never change tokens */
    greedy_case_with(getenv("CAIRN_MODEL"), true, NULL, NULL, 8, 96, chain_shapes + 2, 1, NULL,
                     true);
}

static void test_greedy_draft_model(void **state)
{
    (void)state;
    /* the target as its own draft model: every guess is taken, so chains
     * run to their end and the draft's rows after a full acceptance are
     * the ones kept */
    double tau[N_CHAIN_SHAPES];
    greedy_case_with(getenv("CAIRN_MODEL"), false, getenv("CAIRN_MODEL"), NULL, 8, 64,
                     chain_shapes, N_CHAIN_SHAPES, tau, false);
    assert_true(tau[2] > 8.0);
    /* a random model of another shape (dim 128, 2 layers, head size 32) with
     * the same vocabulary size: its KV layers are placed after the target's
     * in every page; most guesses are rejected */
    greedy_case_with(getenv("CAIRN_MODEL"), false, synth_model, NULL, 8, 64, chain_shapes,
                     N_CHAIN_SHAPES, NULL, false);
    /* and the other way round: stories260K drafting for the random model */
    greedy_case_with(synth_model, false, getenv("CAIRN_MODEL"), NULL, 6, 48, chain_shapes + 2, 1,
                     NULL, false);
}

/* Draft rows computed lazily, and pages whose draft rows were computed for
 * other tokens (model/spec_draft.c's stamps). The target is its own draft
 * model, so a step takes every guess exactly when the draft rows it reads
 * are right: one wrong row (a stale one trusted) shows as a rejection. */
static void adopted_greedy(fixture *f, const int32_t *tokens, int n_past, int n_gen, int32_t *out,
                           cairn_spec_stats *st)
{
    cairn_spec_seq *s = NULL;
    assert_int_equal(seq_create(f, NULL, NULL, &s), CAIRN_OK);
    assert_int_equal(cairn_spec_seq_adopt(s, f->pool, &f->kv, f->pages, CAPACITY, tokens,
                                          n_past + 1, n_past),
                     CAIRN_OK);
    spec_steps(s, n_gen, out);
    cairn_spec_seq_stats(s, st);
    cairn_spec_seq_free(s);
}

/* tokens[0 .. n) through the target alone into the fixture's pages (what a
 * server's batched prefill of a request that may not speculate writes:
 * target rows, no draft rows), then the greedy token after them. */
static int32_t target_only(fixture *f, const int32_t *tokens, int n)
{
    float *logits = malloc((size_t)f->n_vocab * sizeof(float));
    cairn_seq_batch sb = {.tokens = tokens, .n_tokens = n, .kv_start = 0, .pages = f->pages};
    int n_out = 0;
    assert_int_equal(cairn_model_forward(f->m, f->pool, &f->kv, &sb, 1, logits, NULL, &n_out),
                     CAIRN_OK);
    const int32_t next = support_argmax(logits, f->n_vocab);
    free(logits);
    return next;
}

static void test_draft_rows_stamped(void **state)
{
    (void)state;
    fixture f;
    open_fixture_with(&f, getenv("CAIRN_MODEL"), false, getenv("CAIRN_MODEL"), NULL);
    enum { N_PAST = 3 * PAGE + 5, N_GEN = 40 };
    /* want[0] is the pending token the adopted sequence starts from */
    int32_t x[N_PAST + 1], y[N_PAST + 1], want[N_GEN + 1], got[N_GEN];
    uint64_t r = 0x9E3779B97F4A7C15ull;
    x[0] = y[0] = 1;
    for (int i = 1; i < N_PAST; i++) {
        x[i] = 3 + (int32_t)(support_xorshift64(&r) % (uint64_t)(f.n_vocab - 3));
        /* y: x's first page, then other tokens */
        y[i] = i < PAGE ? x[i] : 3 + (int32_t)(support_xorshift64(&r) % (uint64_t)(f.n_vocab - 3));
    }
    cairn_spec_stats st;

    /* 1. pages with target rows only: the draft rows are computed when the
     * sequence first drafts, and every guess is taken */
    x[N_PAST] = target_only(&f, x, N_PAST);
    plain_greedy(&f, x, N_PAST, N_GEN + 1, want);
    adopted_greedy(&f, x, N_PAST, N_GEN, got, &st);
    assert_memory_equal(got, want + 1, sizeof got);
    assert_true(st.drafted > 0);
    assert_int_equal(st.accepted, st.drafted);

    /* 2. the same pages hold x's draft rows now, stamped; y's target rows
     * replace x's from the second page on, its draft rows are x's: only
     * the first page's stamp may be trusted */
    y[N_PAST] = target_only(&f, y, N_PAST);
    plain_greedy(&f, y, N_PAST, N_GEN + 1, want);
    adopted_greedy(&f, y, N_PAST, N_GEN, got, &st);
    assert_memory_equal(got, want + 1, sizeof got);
    assert_true(st.drafted > 0);
    assert_int_equal(st.accepted, st.drafted);

    /* 3. x again over y's pages, x's draft rows of the first page still
     * stamped and right, the rest y's */
    assert_int_equal(target_only(&f, x, N_PAST), x[N_PAST]);
    plain_greedy(&f, x, N_PAST, N_GEN + 1, want);
    adopted_greedy(&f, x, N_PAST, N_GEN, got, &st);
    assert_memory_equal(got, want + 1, sizeof got);
    assert_int_equal(st.accepted, st.drafted);
    close_fixture(&f);
}

static void test_greedy_combined(void **state)
{
    (void)state;
    /* lookup, a draft model and the head add to one tree */
    double tau[2];
    greedy_case_with(getenv("CAIRN_MODEL"), true, synth_model, shipped_head, 10, 64, shapes + 2, 2,
                     tau, false);
    assert_true(tau[1] > 2.0);
    greedy_case_with(getenv("CAIRN_MODEL"), true, getenv("CAIRN_MODEL"), shipped_head, 6, 64,
                     chain_shapes + 1, 2, NULL, false);
}

static void test_sampling_ngram(void **state)
{
    (void)state;
    /* the prompt's last token " a" occurred before: lookup of length 1
     * guesses what followed it then */
    const cairn_sampling_params sp = sampling(1.0f, 0, 1.0f, 0.0f);
    const cairn_spec_params dp = {.depth = 5, .top_k = 8, .n_draft = 8, .chain_max = 6,
                                  .ngram_min = 1, .ngram_max = 2};
    sampling_case_with(true, NULL, NULL, &sp, &dp, 3000);
}

static void test_sampling_draft_model(void **state)
{
    (void)state;
    const cairn_sampling_params sp = sampling(0.9f, 40, 0.95f, 0.0f);
    const cairn_spec_params dp = {.depth = 5, .top_k = 8, .n_draft = 8, .chain_max = 4};
    sampling_case_with(false, getenv("CAIRN_MODEL"), NULL, &sp, &dp, 3000);
}

static void test_sampling_combined(void **state)
{
    (void)state;
    /* several children of the root from different methods: rejected ones
     * leave the residual for the next */
    const cairn_sampling_params sp = sampling(1.0f, 0, 1.0f, 0.0f);
    const cairn_spec_params dp = {.depth = 3, .top_k = 4, .n_draft = 16, .chain_max = 4,
                                  .ngram_min = 1, .ngram_max = 2};
    sampling_case_with(true, synth_model, shipped_head, &sp, &dp, 3000);
}

static void test_errors(void **state)
{
    (void)state;
    fixture f;
    open_fixture(&f, getenv("CAIRN_MODEL"), shipped_head);
    cairn_spec_seq *s = NULL;
    cairn_spec_params bad = {.depth = 0, .top_k = 4, .n_draft = 8};
    assert_int_equal(seq_create(&f, &bad, NULL, &s), CAIRN_EINVAL);
    bad = (cairn_spec_params){.depth = 4, .top_k = 17, .n_draft = 8};
    assert_int_equal(seq_create(&f, &bad, NULL, &s), CAIRN_EINVAL);
    bad = (cairn_spec_params){.depth = 4, .top_k = 4, .n_draft = 200}; /* > batch of 128 */
    assert_int_equal(seq_create(&f, &bad, NULL, &s), CAIRN_ERANGE);
    cairn_sampling_params sp = cairn_sampling_defaults();
    sp.repeat_penalty = 1.1f;
    /* penalties are the sampler's: a step draws as plain decoding does */
    assert_int_equal(seq_create(&f, NULL, &sp, &s), CAIRN_OK);
    cairn_spec_seq_free(s);
    assert_int_equal(seq_create(&f, NULL, NULL, &s), CAIRN_OK);
    int32_t out[16];
    int n;
    assert_int_equal(cairn_spec_seq_step(s, out, 16, &n), CAIRN_EINVAL); /* not begun */
    const int32_t prompt[] = {1, 403};
    assert_int_equal(cairn_spec_seq_begin(s, f.pool, &f.kv, f.pages, 2, prompt, 2), CAIRN_EINVAL);
    const int32_t bad_tok[] = {1, 100000};
    assert_int_equal(cairn_spec_seq_begin(s, f.pool, &f.kv, f.pages, 64, bad_tok, 2), CAIRN_EINVAL);
    /* running into the capacity: the tree shrinks, then CAIRN_ERANGE */
    assert_int_equal(cairn_spec_seq_begin(s, f.pool, &f.kv, f.pages, 20, prompt, 2), CAIRN_OK);
    int total = 0, rc;
    while ((rc = cairn_spec_seq_step(s, out, 16, &n)) == CAIRN_OK)
        total += n;
    assert_int_equal(rc, CAIRN_ERANGE);
    assert_int_equal(cairn_spec_seq_n_past(s), 20);
    assert_int_equal(total, 19);
    cairn_spec_seq_free(s);

    /* a head for another target */
    char err[256] = "";
    cairn_eagle *other = NULL;
    assert_int_equal(cairn_eagle_load(synth_head, f.m, &other, err, sizeof err), CAIRN_EFORMAT);
    assert_non_null(strstr(err, "does not fit"));
    assert_int_equal(cairn_eagle_load(getenv("CAIRN_MODEL"), f.m, &other, err, sizeof err),
                     CAIRN_EFORMAT);
    /* a method twice; a draft model of another vocabulary */
    assert_int_equal(cairn_spec_add_eagle(f.spec, f.head), CAIRN_EINVAL);
    cairn_model_params p = {.max_batch_tokens = 128, .max_seqs = 1};
    cairn_model *v600 = NULL;
    assert_int_equal(cairn_model_load(synth_v600, f.be, &p, &v600, err, sizeof err), CAIRN_OK);
    err[0] = '\0';
    assert_int_equal(cairn_spec_add_draft_model(f.spec, v600, err, sizeof err), CAIRN_EINVAL);
    assert_non_null(strstr(err, "vocabulary"));
    assert_int_equal(cairn_spec_add_draft_model(f.spec, f.m, err, sizeof err), CAIRN_EINVAL);
    assert_int_equal(cairn_spec_count(f.spec), 1);
    cairn_model_free(v600);
    close_fixture(&f);
}

static int run(const char *cmd)
{
    int rc = system(cmd);
    if (rc != 0)
        fprintf(stderr, "test_eagle: '%s' failed (%d)\n", cmd, rc);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: %s PYTHON TOOLS_DIR SHIPPED_HEAD SCRATCH_DIR\n", argv[0]);
        return 2;
    }
    python = argv[1];
    tools_dir = argv[2];
    shipped_head = argv[3];
    scratch_dir = argv[4];
    cairn_log_set_level(CAIRN_LOG_WARN);
    snprintf(synth_model, sizeof synth_model, "%s/eagle_synth.gguf", scratch_dir);
    snprintf(synth_head, sizeof synth_head, "%s/eagle_synth_head.gguf", scratch_dir);
    snprintf(rand_head_260k, sizeof rand_head_260k, "%s/eagle_rand_head_260k.gguf", scratch_dir);
    snprintf(synth_v600, sizeof synth_v600, "%s/spec_synth_v600.gguf", scratch_dir);
    static char cmd[16384];
    snprintf(cmd, sizeof cmd,
             "'%s' '%s/gen_synthetic_model.py' --shape tiny --type F32 --heads 4 --kv-heads 2 "
             "--seed 7 -o '%s' 2>/dev/null && "
             "'%s' '%s/eagle_convert.py' --target '%s' --random --seed 3 -o '%s' 2>/dev/null && "
             "'%s' '%s/eagle_convert.py' --target '%s' --random --seed 5 -o '%s' 2>/dev/null && "
             "'%s' '%s/gen_synthetic_model.py' --shape tiny --type F32 --vocab 600 --seed 9 "
             "-o '%s' 2>/dev/null",
             python, tools_dir, synth_model, python, tools_dir, synth_model, synth_head, python,
             tools_dir, getenv("CAIRN_MODEL"), rand_head_260k, python, tools_dir, synth_v600);
    if (run(cmd) != 0)
        return 1;
    if (getenv("EAGLE_TEST_FILTER"))
        cmocka_set_test_filter(getenv("EAGLE_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tree_mask),
        cmocka_unit_test(test_greedy_bundled),
        cmocka_unit_test(test_greedy_bundled_random_head),
        cmocka_unit_test(test_greedy_synthetic),
        cmocka_unit_test(test_sampling_plain_softmax),
        cmocka_unit_test(test_sampling_truncated),
        cmocka_unit_test(test_sampling_random_head),
        cmocka_unit_test(test_sampling_logit_bias),
        cmocka_unit_test(test_greedy_logit_bias),
        cmocka_unit_test(test_greedy_ngram),
        cmocka_unit_test(test_greedy_draft_model),
        cmocka_unit_test(test_draft_rows_stamped),
        cmocka_unit_test(test_greedy_combined),
        cmocka_unit_test(test_sampling_ngram),
        cmocka_unit_test(test_sampling_draft_model),
        cmocka_unit_test(test_sampling_combined),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
