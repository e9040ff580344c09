/*
 * tests/gpu/test_gpu_sample.c — sampling on the device (the CUDA backend's
 * sample_rows slot, through cairn_sample_batch_run) against the CPU sampler.
 *
 *   greedy      every greedy row's token equals cairn_sampler_sample's on
 *               the same row (argmax, ties to the lowest id), with penalties,
 *               bias and masks too: bit-equal, always;
 *   draws       for fixed seeds and fixed logits rows (vocabularies of 1000
 *               and 151936), a number of draws per setting (temperature,
 *               top-k, top-p, min-p, the defaults, penalties, logit bias, a
 *               grammar mask; see "Draws" below):
 *                 - the device's token histogram against the CPU sampler's
 *                   distribution (cairn_sampler_probs) by chi-squared at the
 *                   0.999 quantile (tests/support), tokens with fewer than 5
 *                   expected draws pooled in id order;
 *                 - the same draw u on both sides (each device row has a
 *                   twin CPU sampler of the same seed) gives the same token
 *                   in >= 99.9% of the draws, and tokens the CPU excludes
 *                   make up <= 0.1%. Why the bound is sound: the device sums
 *                   masses in another order (and with CUDA's exp), so a
 *                   decision can only differ when u or a top-p cut-off lies
 *                   within ~1e-13 relative of a cumulative boundary —
 *                   ~1e-10 of the draws; 0.1% leaves room for no more than
 *                   that and catches any real difference of semantics (a
 *                   wrong order, an off-by-one at top-k, a missed penalty
 *                   all disagree on far more than 0.1%);
 *   logprobs    the chosen token's and the 20 best, best first: ids equal,
 *               values within 1e-6 (1 + |want|) — both are double
 *               log-softmaxes rounded to float, so they differ by about one
 *               float ulp; vocabularies smaller than 20 get -1 / -inf;
 *   refusals    rows all -inf, all NaN, with a +inf, or masked to nothing
 *               are refused (CAIRN_EINVAL) like the CPU's, beside rows that
 *               are not;
 *   keep        with MODEL given (argv[1] or CAIRN_MODEL): the logits
 *               cairn_model_forward_keep leaves on the device are the bytes
 *               cairn_model_forward downloads, and sampling them there
 *               gives the CPU's greedy tokens.
 * The seeds and logits are fixed, so each check is deterministic.
 *
 * Opening the backend follows tests/gpu/gpu_probe.h: exit 77 only when the
 * runtime sees no device (a failure with CAIRN_GPU_REQUIRED=1), a device
 * whose backend does not come up is a failure, and so is a CUDA backend
 * without the sample_rows slot (the fallback would pass every check here
 * and prove nothing about the device). Under CAIRN_GPU_TEST_BACKEND=cpu the
 * backend has no slot and the fallback (the CPU sampler itself) runs, which
 * checks this file's logic.
 *
 * Draws: CAIRN_GPU_SAMPLE_DRAWS (a run-time setting, so a GPU run can size
 * it to its time) is the number per setting at the 151936-token vocabulary:
 * 2048 by default on a device, 384 on the CPU harness. Each device draw has
 * its twin draw on the CPU, and at 151936 tokens that costs 0.3 to 2 ms, and
 * ~30 ms for "bias" (its top-p 0.98 is past the sampler's first 256
 * candidates, so it sorts the whole row): ~40 ms a round of the 9 settings,
 * so 2048 draws cost about a minute on one core (75 s on the 2-core build
 * machine) and 20000 would cost ten.
 * The 1000-token vocabulary always takes 20000 draws (a few seconds: a twin
 * draw costs ~10 us there). What 2048 draws still prove:
 *   - same-u agreement, <= 0.1%: 2 of 2048 disagreements pass. A real
 *     difference of semantics moves at least ~0.5% of the decisions (even
 *     an off-by-one at top-k 40 moves 2-5%: the extra token holds only
 *     ~0.13%, but it rescales every cumulative boundary); at 0.5% (10.2
 *     expected) 2 or fewer happen with probability 0.2%, at 1% with 3e-7.
 *     The benign ~1e-10 per draw gives 3 with probability ~1e-21. The same
 *     arithmetic holds for the excluded tokens;
 *   - chi-squared at the 0.999 quantile, whatever the count (pooling to 5
 *     expected keeps the statistic's distribution; fewer draws pool more,
 *     i.e. fewer degrees of freedom). With noncentrality
 *     draws * sum(dp^2 / p), a top token of mass 0.45 moved by 11-19%
 *     relative (the rest proportionally) is found with 90% power at 2048
 *     draws and the 1-40 degrees of freedom these rows then have (1 for
 *     "mask" and "everything", whose mass sits on two tokens; 40 for
 *     "bias"), by 5-6% at 20000. It is the coarse check of the two (the
 *     same-u check is the sharp one); the 1000-token vocabulary keeps it at
 *     full power.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "store/tiers.h"
#include "tests/gpu/gpu_probe.h"
#include "tests/support/support.h"

enum { ROWS = 64, LP_ROW = 1 + CAIRN_SAMPLE_MAX_LOGPROBS, BIG_VOCAB = 151936 };

/* Draws per setting (the header's "Draws" says why these counts; the
 * checks scale with them). */
enum {
    DRAWS_SMALL = 20000,       /* at 1000 tokens, always                   */
    DRAWS_LARGE = 2048,        /* at 151936, on a device                   */
    DRAWS_LARGE_HARNESS = 384, /* at 151936, on the CPU harness (both sides
                                  run the CPU sampler there)               */
};

static cairn_backend *dev;
static int have_slot;
static const char *model_path;
static int draws_large; /* per setting at BIG_VOCAB */

/* A fixed stream (not the run's seed: the distribution checks must be
 * deterministic). */
static kt_rng fixed_rng(uint64_t k)
{
    kt_rng r = {0x5eed5a3b1e000000ull ^ k};
    return r;
}

/* Language-model-like logits: a random ranking with p ~ rank^-1.6, some
 * noise and a few exact ties. */
static void lm_logits(float *row, int n, uint64_t k)
{
    kt_rng g = fixed_rng(k);
    int32_t *perm = kt_xmalloc((size_t)n * sizeof *perm);
    kt_permutation(&g, perm, n);
    for (int i = 0; i < n; i++)
        row[perm[i]] = -1.6f * logf(1.0f + (float)i) + kt_uniform(&g, -0.3f, 0.3f);
    for (int i = 0; i + 1 < n && i < 40; i += 9)
        row[perm[i + 1]] = row[perm[i]];
    free(perm);
}

static cairn_sampling_params plain(float t)
{
    cairn_sampling_params p = cairn_sampling_defaults();
    p.temperature = t;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    return p;
}

static void mask_row(float *row, const uint32_t *bits, int n)
{
    for (int t = 0; bits && t < n; t++)
        if (!(bits[t >> 5] >> (t & 31) & 1u))
            row[t] = -INFINITY;
}

/* A setting of the distribution checks. */
typedef struct {
    const char *name;
    cairn_sampling_params p;
    int n_window;      /* tokens accepted before drawing (penalties)      */
    bool mask;         /* a grammar-like mask of about half the tokens    */
} setting;

/* The row's 8 best ids (ties to the lower id), by selection. */
static void best8(const float *row, int n, int32_t *best)
{
    for (int k = 0; k < 8; k++) {
        int32_t pick = -1;
        for (int i = 0; i < n; i++) {
            bool taken = false;
            for (int j = 0; j < k; j++)
                taken |= best[j] == i;
            if (!taken && (pick < 0 || row[i] > row[pick]))
                pick = i;
        }
        best[k] = pick;
    }
}

/* The window: n_window tokens among the row's best 8, repeated (counts up
 * to 3 and more), so the penalties move the likely tokens. */
static void feed_window(cairn_sampler *s, const int32_t *best, int n_window)
{
    for (int i = 0; i < n_window; i++)
        cairn_sampler_accept(s, best[(i * 5) % 8]);
}

/* Pearson's statistic with tokens pooled in id order into groups expected
 * at least 5 times; *df its degrees of freedom. */
static double chi2_pooled(const int *counts, const float *probs, int n, int draws, int *df)
{
    double stat = 0.0, obs = 0.0, exp_ = 0.0;
    int groups = 0;
    for (int t = 0; t < n; t++) {
        if (probs[t] <= 0.0f)
            continue;
        obs += counts[t];
        exp_ += (double)probs[t] * draws;
        if (exp_ >= 5.0) {
            stat += (obs - exp_) * (obs - exp_) / exp_;
            groups++;
            obs = exp_ = 0.0;
        }
    }
    if (exp_ > 0.0) { /* the remainder: its own group (below 5 only at the end) */
        stat += (obs - exp_) * (obs - exp_) / exp_;
        groups++;
    }
    *df = groups - 1;
    return stat;
}

static void check_setting(const setting *st, int n, int draws)
{
    float *row = kt_xmalloc((size_t)n * sizeof(float));
    float *masked = kt_xmalloc((size_t)n * sizeof(float));
    float *probs = kt_xmalloc((size_t)n * sizeof(float));
    int *counts = kt_xmalloc((size_t)n * sizeof(int));
    const size_t words = ((size_t)n + 31) / 32;
    uint32_t *bits = kt_xmalloc(words * sizeof(uint32_t));
    lm_logits(row, n, (uint64_t)n);
    if (st->mask) {
        kt_rng g = fixed_rng(77);
        for (size_t w = 0; w < words; w++)
            bits[w] = (uint32_t)kt_next(&g);
    }
    memcpy(masked, row, (size_t)n * sizeof(float));
    mask_row(masked, st->mask ? bits : NULL, n);
    int32_t best[8];
    best8(row, n, best);

    /* the rows on the device, ROWS copies */
    float *d = kt_dev(dev, NULL, (size_t)ROWS * n * sizeof(float));
    for (int r = 0; r < ROWS; r++)
        assert_int_equal(dev->iface->upload(dev, d + (size_t)r * n, row, (size_t)n * sizeof(float)),
                         CAIRN_OK);
    cairn_sampler *on_dev[ROWS], *twin[ROWS], *probe = NULL;
    for (int r = 0; r < ROWS; r++) {
        cairn_sampling_params p = st->p;
        p.seed = 4242 + (uint64_t)r;
        assert_int_equal(cairn_sampler_create(&p, n, &on_dev[r]), CAIRN_OK);
        assert_int_equal(cairn_sampler_create(&p, n, &twin[r]), CAIRN_OK);
        feed_window(on_dev[r], best, st->n_window);
        feed_window(twin[r], best, st->n_window);
    }
    assert_int_equal(cairn_sampler_create(&st->p, n, &probe), CAIRN_OK);
    feed_window(probe, best, st->n_window);
    assert_int_equal(cairn_sampler_probs(probe, masked, probs), CAIRN_OK);

    cairn_sample_batch *b = NULL;
    assert_int_equal(cairn_sample_batch_create(dev, n, ROWS, &b), CAIRN_OK);
    cairn_sample_req reqs[ROWS];
    for (int r = 0; r < ROWS; r++)
        reqs[r] = (cairn_sample_req){.row = r, .sampler = on_dev[r],
                                     .allowed = st->mask ? bits : NULL};
    int32_t tok[ROWS];
    int status[ROWS];
    int disagree = 0, excluded = 0;
    draws = (draws + ROWS - 1) / ROWS * ROWS; /* whole batches */
    for (int done = 0; done < draws; done += ROWS) {
        assert_int_equal(cairn_sample_batch_run(b, d, ROWS, reqs, tok, status, NULL), CAIRN_OK);
        for (int r = 0; r < ROWS; r++) {
            assert_int_equal(status[r], CAIRN_OK);
            assert_true(tok[r] >= 0 && tok[r] < n);
            int32_t want = -1;
            assert_int_equal(cairn_sampler_sample(twin[r], masked, &want, NULL, NULL), CAIRN_OK);
            disagree += tok[r] != want;
            excluded += probs[tok[r]] <= 0.0f;
            counts[tok[r]]++;
        }
    }
    int df = 0;
    const double stat = chi2_pooled(counts, probs, n, draws, &df);
    printf("  %-10s n_vocab %6d: %d draws, chi2 %.1f (df %d, critical %.1f), %d same-u "
           "disagreements, %d excluded\n",
           st->name, n, draws, stat, df, df >= 1 ? support_chi2_critical(df) : 0.0, disagree,
           excluded);
    if (disagree * 1000 > draws)
        fail_msg("%s (n_vocab %d): the same u gave another token in %d of %d draws", st->name, n,
                 disagree, draws);
    if (excluded * 1000 > draws)
        fail_msg("%s (n_vocab %d): %d of %d draws were tokens the CPU excludes", st->name, n,
                 excluded, draws);
    if (df >= 1 && !(stat < support_chi2_critical(df)))
        fail_msg("%s (n_vocab %d): chi-squared %.2f >= %.2f (df %d)", st->name, n, stat,
                 support_chi2_critical(df), df);

    cairn_sample_batch_free(b);
    for (int r = 0; r < ROWS; r++) {
        cairn_sampler_free(on_dev[r]);
        cairn_sampler_free(twin[r]);
    }
    cairn_sampler_free(probe);
    dev->iface->free(dev, d);
    free(row);
    free(masked);
    free(probs);
    free(counts);
    free(bits);
}

static void check_settings(int n, int draws)
{
    setting s[9];
    int k = 0;
    s[k++] = (setting){"temp", plain(0.7f), 0, false};
    s[k] = (setting){"top-k", plain(1.0f), 0, false};
    s[k++].p.top_k = 40;
    s[k] = (setting){"top-p", plain(1.0f), 0, false};
    s[k++].p.top_p = 0.9f;
    s[k] = (setting){"min-p", plain(1.3f), 0, false};
    s[k++].p.min_p = 0.05f;
    s[k++] = (setting){"defaults", cairn_sampling_defaults(), 0, false};
    s[k] = (setting){"penalties", plain(1.0f), 24, false};
    s[k].p.top_k = 50;
    s[k].p.top_p = 0.95f;
    s[k].p.repeat_penalty = 1.3f;
    s[k].p.frequency_penalty = 0.4f;
    s[k].p.presence_penalty = 0.3f;
    s[k++].p.penalty_last_n = 32;
    s[k] = (setting){"bias", plain(1.0f), 0, false};
    s[k].p.top_p = 0.98f;
    s[k].p.n_logit_bias = 3;
    s[k].p.logit_bias[0].token = 5;
    s[k].p.logit_bias[0].bias = 8.0f;
    s[k].p.logit_bias[1].token = n - 1;
    s[k].p.logit_bias[1].bias = 3.0f;
    s[k].p.logit_bias[2].token = 5;
    s[k++].p.logit_bias[2].bias = 6.0f; /* the last wins */
    s[k] = (setting){"mask", plain(1.0f), 0, true};
    s[k].p.top_p = 0.8f;
    s[k++].p.min_p = 0.02f;
    s[k] = (setting){"everything", cairn_sampling_defaults(), 24, true};
    s[k].p.repeat_penalty = 1.2f;
    s[k].p.presence_penalty = 0.5f;
    s[k].p.n_logit_bias = 1;
    s[k].p.logit_bias[0].token = 2;
    s[k++].p.logit_bias[0].bias = -100.0f;
    for (int i = 0; i < k; i++)
        check_setting(&s[i], n, draws);
}

static void test_draws_small_vocab(void **state)
{
    (void)state;
    check_settings(1000, DRAWS_SMALL);
}

static void test_draws_large_vocab(void **state)
{
    (void)state;
    /* the CPU sampler in the fallback and the twins takes ~ms a draw here */
    check_settings(BIG_VOCAB, draws_large);
}

/* ---- greedy, logprobs, refusals ------------------------------------------------- */

/* Rows of `n` on the device and, per row, a sampler of `p` plus a twin;
 * runs one batch and compares each row with the twin on the host. */
typedef struct {
    int n, rows;
    float *host;        /* [rows][n] */
    uint32_t **allowed; /* [rows], entries may be NULL */
    cairn_sampling_params *p;
    bool want_lp;
} batch_case;

static void run_case(const batch_case *c, int *n_refused)
{
    float *d = kt_dev(dev, c->host, (size_t)c->rows * c->n * sizeof(float));
    float *row = kt_xmalloc((size_t)c->n * sizeof(float));
    cairn_sampler **s = kt_xmalloc((size_t)c->rows * sizeof *s);
    cairn_sampler **twin = kt_xmalloc((size_t)c->rows * sizeof *twin);
    cairn_sample_req *reqs = kt_xmalloc((size_t)c->rows * sizeof *reqs);
    int32_t *tok = kt_xmalloc((size_t)c->rows * sizeof *tok);
    int *status = kt_xmalloc((size_t)c->rows * sizeof *status);
    cairn_token_logprob *lp = kt_xmalloc((size_t)c->rows * LP_ROW * sizeof *lp);
    cairn_token_logprob want_lp[LP_ROW];
    for (int r = 0; r < c->rows; r++) {
        assert_int_equal(cairn_sampler_create(&c->p[r], c->n, &s[r]), CAIRN_OK);
        assert_int_equal(cairn_sampler_create(&c->p[r], c->n, &twin[r]), CAIRN_OK);
        /* a short history, so penalties have something to act on */
        for (int i = 0; i < 6; i++) {
            cairn_sampler_accept(s[r], (int32_t)((r + 3 * i) % c->n));
            cairn_sampler_accept(twin[r], (int32_t)((r + 3 * i) % c->n));
        }
        /* request r draws from the rows in reverse: not the identity */
        reqs[r] = (cairn_sample_req){.row = c->rows - 1 - r, .sampler = s[r],
                                     .allowed = c->allowed[r],
                                     .want_logprobs = c->want_lp};
    }
    cairn_sample_batch *b = NULL;
    assert_int_equal(cairn_sample_batch_create(dev, c->n, c->rows, &b), CAIRN_OK);
    assert_int_equal(cairn_sample_batch_run(b, d, c->rows, reqs, tok, status, lp), CAIRN_OK);
    for (int r = 0; r < c->rows; r++) {
        memcpy(row, c->host + (size_t)(c->rows - 1 - r) * c->n, (size_t)c->n * sizeof(float));
        mask_row(row, c->allowed[r], c->n);
        int32_t want = -1;
        const int rc = cairn_sampler_sample(twin[r], row, &want, c->want_lp ? &want_lp[0] : NULL,
                                            c->want_lp ? &want_lp[1] : NULL);
        if (status[r] != rc)
            fail_msg("row %d: status %d, the CPU sampler's %d", r, status[r], rc);
        if (rc != CAIRN_OK) {
            assert_int_equal(tok[r], -1);
            (*n_refused)++;
            continue;
        }
        if (c->p[r].temperature <= 0.0f && tok[r] != want)
            fail_msg("row %d (greedy): token %d, the CPU sampler's %d", r, tok[r], want);
        if (!c->want_lp)
            continue;
        const cairn_token_logprob *got = lp + (size_t)r * LP_ROW;
        assert_int_equal(got[0].token, tok[r]);
        /* the chosen token's logprob, against the CPU's for that token */
        double chosen = isnan(row[tok[r]]) ? -INFINITY : row[tok[r]];
        {
            double mx = -INFINITY, sum = 0.0;
            for (int i = 0; i < c->n; i++)
                if (!isnan(row[i]) && row[i] > mx)
                    mx = row[i];
            for (int i = 0; i < c->n; i++)
                if (!isnan(row[i]))
                    sum += exp((double)row[i] - mx);
            chosen -= mx + log(sum);
        }
        KT_CLOSE(got[0].logprob, chosen, 1e-6 * (1.0 + fabs(chosen)), "chosen logprob", r);
        for (int i = 1; i <= c->p[r].n_logprobs; i++) {
            if (got[i].token != want_lp[i].token)
                fail_msg("row %d: logprob %d is token %d, the CPU's %d", r, i, got[i].token,
                         want_lp[i].token);
            if (want_lp[i].token < 0 || isinf(want_lp[i].logprob)) { /* past the vocabulary,
                                                                         or a masked token */
                assert_true(isinf(got[i].logprob) && got[i].logprob < 0);
                continue;
            }
            KT_CLOSE(got[i].logprob, want_lp[i].logprob, 1e-6 * (1.0 + fabs(want_lp[i].logprob)),
                     "top logprob", (long long)r * LP_ROW + i);
        }
    }
    cairn_sample_batch_free(b);
    for (int r = 0; r < c->rows; r++) {
        cairn_sampler_free(s[r]);
        cairn_sampler_free(twin[r]);
    }
    dev->iface->free(dev, d);
    free(row);
    free(s);
    free(twin);
    free(reqs);
    free(tok);
    free(status);
    free(lp);
}

static void greedy_case(int n, bool want_lp)
{
    enum { R = 16 };
    kt_rng g = fixed_rng(1000 + (uint64_t)n);
    float *host = kt_xmalloc((size_t)R * n * sizeof(float));
    uint32_t *bits = kt_xmalloc(((size_t)n + 31) / 32 * sizeof(uint32_t));
    for (size_t w = 0; w < ((size_t)n + 31) / 32; w++)
        bits[w] = (uint32_t)kt_next(&g) | (uint32_t)kt_next(&g);
    uint32_t *allowed[R];
    cairn_sampling_params p[R];
    for (int r = 0; r < R; r++) {
        float *row = host + (size_t)r * n;
        kt_fill(&g, row, (size_t)n, -5.0f, 5.0f);
        if (r % 2) /* the maximum several times: ties go to the lowest id */
            for (int i = n / 3; i < n; i += n / 5 + 1)
                row[i] = 7.0f;
        if (r % 5 == 4) /* and a -0/+0 tie at the top */
            for (int i = 0; i < n; i++)
                row[i] = i % 11 == 3 ? -0.0f : (i % 11 == 7 ? 0.0f : -1.0f - (float)(i % 5));
        if (r % 4 == 3)
            row[kt_below(&g, n)] = NAN;
        allowed[r] = r % 3 == 2 ? bits : NULL;
        p[r] = plain(0.0f);
        p[r].n_logprobs = r % 2 ? 20 : 3;
        if (r % 4 == 1) {
            p[r].repeat_penalty = 3.0f;
            p[r].frequency_penalty = 1.0f;
        }
        if (r % 6 == 5) {
            p[r].n_logit_bias = 2;
            p[r].logit_bias[0].token = (int32_t)(r % n);
            p[r].logit_bias[0].bias = 100.0f;
            p[r].logit_bias[1].token = (int32_t)((r + 1) % n);
            p[r].logit_bias[1].bias = -5.0f;
        }
    }
    batch_case c = {.n = n, .rows = R, .host = host, .allowed = allowed, .p = p,
                    .want_lp = want_lp};
    int refused = 0;
    run_case(&c, &refused);
    assert_int_equal(refused, 0);
    free(host);
    free(bits);
}

static void test_greedy(void **state)
{
    (void)state;
    greedy_case(1000, false);
    greedy_case(BIG_VOCAB, false);
    greedy_case(7, false); /* fewer tokens than threads */
}

static void test_logprobs(void **state)
{
    (void)state;
    greedy_case(1000, true);
    greedy_case(BIG_VOCAB, true);
    greedy_case(10, true); /* n_logprobs 20 > n_vocab: -1 / -inf entries */
    /* and sampled rows: the chosen token's logprob is of the raw row */
    enum { R = 8, N = 5000 };
    float *host = kt_xmalloc((size_t)R * N * sizeof(float));
    uint32_t *allowed[R] = {0};
    cairn_sampling_params p[R];
    for (int r = 0; r < R; r++) {
        lm_logits(host + (size_t)r * N, N, 50 + (uint64_t)r);
        p[r] = cairn_sampling_defaults();
        p[r].seed = (uint64_t)r;
        p[r].n_logprobs = 20;
    }
    batch_case c = {.n = N, .rows = R, .host = host, .allowed = allowed, .p = p, .want_lp = true};
    int refused = 0;
    run_case(&c, &refused);
    assert_int_equal(refused, 0);
    free(host);
}

static void test_refusals(void **state)
{
    (void)state;
    enum { R = 7, N = 3000 };
    kt_rng g = fixed_rng(9);
    float *host = kt_xmalloc((size_t)R * N * sizeof(float));
    uint32_t none[(N + 31) / 32];
    memset(none, 0, sizeof none);
    uint32_t *allowed[R] = {0};
    cairn_sampling_params p[R];
    for (int r = 0; r < R; r++) {
        float *row = host + (size_t)r * N;
        kt_fill(&g, row, N, -3.0f, 3.0f);
        p[r] = r % 2 ? cairn_sampling_defaults() : plain(0.0f);
        p[r].seed = (uint64_t)r;
    }
    for (int i = 0; i < N; i++) {
        host[1 * N + i] = -INFINITY; /* no finite maximum */
        host[2 * N + i] = NAN;       /* nothing but NaN */
        host[5 * N + i] = i % 2 ? NAN : -INFINITY;
    }
    host[3 * N + 17] = INFINITY; /* a +inf */
    /* run_case's request r draws from row R-1-r: request 2 from ordinary
     * row 4, masked to nothing; requests 0 and 6 (rows 6 and 0) are
     * ordinary and must still be sampled */
    allowed[2] = none;
    batch_case c = {.n = N, .rows = R, .host = host, .allowed = allowed, .p = p, .want_lp = true};
    int refused = 0;
    run_case(&c, &refused);
    assert_int_equal(refused, 5);
    free(host);
}

/* ---- logits kept on the device ------------------------------------------------- */

static void test_forward_keep(void **state)
{
    (void)state;
    if (!model_path) {
        printf("  (no MODEL: forward_keep not checked)\n");
        return;
    }
    enum { T = 37, PAGE = 16, PAGES = 4 };
    char err[256] = "";
    cairn_model *m = NULL;
    cairn_model_params mp = {.max_batch_tokens = 64, .max_seqs = 2};
    if (cairn_model_load(model_path, dev, &mp, &m, err, sizeof err) != CAIRN_OK)
        fail_msg("load %s: %s", model_path, err);
    const int n = cairn_model_hparams(m)->n_vocab;
    cairn_kv_layout kv;
    assert_int_equal(cairn_model_kv_layout(m, PAGE, CAIRN_TYPE_F32, &kv), CAIRN_OK);
    cairn_page_pool *pool = NULL;
    assert_int_equal(cairn_page_pool_create(dev, &kv, (size_t)2 * PAGES * kv.page_bytes, &pool),
                     CAIRN_OK);
    int32_t toks[T], pages_a[PAGES] = {0, 1, 2, 3}, pages_b[PAGES] = {7, 6, 5, 4};
    for (int i = 0; i < T; i++)
        toks[i] = i == 0 ? 1 : 3 + (int32_t)((i * 2654435761u) % (uint32_t)(n - 3));
    uint8_t want[T];
    memset(want, 1, sizeof want); /* 37 rows: more than one projection chunk */
    float *down = kt_xmalloc((size_t)T * n * sizeof(float));
    int n_out = 0;
    cairn_seq_batch sb = {.tokens = toks, .n_tokens = T, .pages = pages_a, .want = want};
    assert_int_equal(cairn_model_forward(m, cairn_page_pool_base(pool), &kv, &sb, 1, down, NULL,
                                         &n_out),
                     CAIRN_OK);
    assert_int_equal(n_out, T);
    const float *kept = NULL;
    sb.pages = pages_b;
    assert_int_equal(cairn_model_forward_keep(m, cairn_page_pool_base(pool), &kv, &sb, 1, NULL,
                                              &kept, &n_out),
                     CAIRN_OK);
    assert_int_equal(n_out, T);
    assert_non_null(kept);
    float *back = kt_host(dev, kept, (size_t)T * n * sizeof(float));
    KT_SAME_BYTES(back, down, (size_t)T * n * sizeof(float), "kept logits vs downloaded");

    /* greedy from where they are = argmax of the downloaded rows */
    cairn_sampler *s[T];
    cairn_sample_req reqs[T];
    cairn_sampling_params gp = plain(0.0f);
    for (int r = 0; r < T; r++) {
        assert_int_equal(cairn_sampler_create(&gp, n, &s[r]), CAIRN_OK);
        reqs[r] = (cairn_sample_req){.row = r, .sampler = s[r]};
    }
    cairn_sample_batch *b = NULL;
    assert_int_equal(cairn_sample_batch_create(dev, n, T, &b), CAIRN_OK);
    int32_t tok[T];
    int status[T];
    assert_int_equal(cairn_sample_batch_run(b, kept, T, reqs, tok, status, NULL), CAIRN_OK);
    for (int r = 0; r < T; r++) {
        assert_int_equal(status[r], CAIRN_OK);
        assert_int_equal(tok[r], support_argmax(down + (size_t)r * n, n));
        cairn_sampler_free(s[r]);
    }
    cairn_sample_batch_free(b);
    free(back);
    free(down);
    cairn_page_pool_free(pool);
    cairn_model_free(m);
}

/* CAIRN_GPU_SAMPLE_DRAWS, else the default for this backend. A value that
 * is not a positive number is refused, not silently replaced: a run that
 * asked for a census must not quietly do a check. */
static int read_draws(int fallback)
{
    const char *v = getenv("CAIRN_GPU_SAMPLE_DRAWS");
    if (!v || !*v)
        return fallback;
    char *end = NULL;
    const long n = strtol(v, &end, 10);
    if (*end || n < 1 || n > 10000000) {
        printf("FAIL gpu_sample: CAIRN_GPU_SAMPLE_DRAWS=%s is not a number of draws "
               "(1..10000000)\n",
               v);
        return -1;
    }
    return (int)n;
}

int main(int argc, char **argv)
{
    model_path = argc > 1 ? argv[1] : getenv("CAIRN_MODEL");
    const int rc = gpu_test_open(&dev, "gpu_sample");
    if (rc != 0)
        return rc;
    have_slot = dev->iface->sample_rows != NULL;
    printf("backend %s: %s\n", dev->iface->name,
           have_slot ? "sample_rows on the device" : "no sample_rows slot: the fallback runs");
    if (!gpu_test_is_harness() && !have_slot) {
        /* the fallback is the CPU sampler: every check below would pass
         * against itself and say nothing about the device */
        printf("FAIL gpu_sample: the %s backend on a real GPU has no sample_rows slot\n",
               dev->iface->name);
        cairn_backend_destroy(dev);
        return 1;
    }
    draws_large = read_draws(have_slot ? DRAWS_LARGE : DRAWS_LARGE_HARNESS);
    if (draws_large < 0) {
        cairn_backend_destroy(dev);
        return 1;
    }
    printf("draws per setting: %d at n_vocab 1000, %d at n_vocab %d%s\n", DRAWS_SMALL,
           draws_large, BIG_VOCAB,
           getenv("CAIRN_GPU_SAMPLE_DRAWS") ? " (CAIRN_GPU_SAMPLE_DRAWS)" : "");
    kt_init_seed("gpu_sample");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_forward_keep),
        cmocka_unit_test(test_draws_small_vocab),
        cmocka_unit_test(test_draws_large_vocab),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    cairn_backend_destroy(dev);
    return failed;
}
