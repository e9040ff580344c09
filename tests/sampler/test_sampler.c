/*
 * tests/sampler/test_sampler.c — the sampler against its specification in
 * model/model.h.
 *
 * Distribution tests draw many tokens with a fixed seed and compare the
 * counts with the exact probabilities (computed here independently, in
 * double, by the textbook definition of each transform) using a chi-squared
 * test at the 0.999 quantile. The seed is fixed, so each test is
 * deterministic: it either always passes or always fails.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/model.h"
#include "tests/support/support.h"

enum { N_DRAWS = 20000 };

/* ---- helpers ------------------------------------------------------------ */

static cairn_sampling_params plain_params(float temperature)
{
    /* Every transform off except temperature. */
    cairn_sampling_params p = cairn_sampling_defaults();
    p.temperature = temperature;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.frequency_penalty = 0.0f;
    p.presence_penalty = 0.0f;
    p.seed = 1234;
    return p;
}

static cairn_sampler *make_sampler(const cairn_sampling_params *p, int n_vocab)
{
    cairn_sampler *s = NULL;
    assert_int_equal(cairn_sampler_create(p, n_vocab, &s), CAIRN_OK);
    assert_non_null(s);
    return s;
}

static int32_t sample_one(cairn_sampler *s, const float *logits)
{
    int32_t tok = -1;
    assert_int_equal(cairn_sampler_sample(s, logits, &tok, NULL, NULL), CAIRN_OK);
    return tok;
}

/* Deterministic pseudo-random logits in [lo, hi). */
static void fill_logits(float *logits, int n, uint32_t seed, float lo, float hi)
{
    uint32_t x = seed * 2654435761u + 1;
    for (int i = 0; i < n; i++)
        logits[i] = lo + (hi - lo) * (float)(support_lcg32(&x) >> 8) / (float)(1u << 24);
}

/* Ids best first: larger logit, then lower id (insertion sort; small n). */
static void rank_ids(const double *logits, int n, int *order)
{
    for (int i = 0; i < n; i++) {
        int j = i;
        while (j > 0 && (logits[order[j - 1]] < logits[i] ||
                         (logits[order[j - 1]] == logits[i] && order[j - 1] > i))) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
}

/* The exact sampling distribution of `p` over `logits` (no penalties),
 * straight from the definitions: top-k, then top-p and min-p on the softmax
 * of what is left, then the softmax at temperature T of the survivors. */
static void expected_probs(const float *logits_f, int n, const cairn_sampling_params *p,
                           double *out)
{
    double *logits = calloc((size_t)n, sizeof *logits);
    int *order = calloc((size_t)n, sizeof *order);
    assert_true(logits && order);
    for (int i = 0; i < n; i++)
        logits[i] = logits_f[i];
    rank_ids(logits, n, order);

    int kept = n;
    if (p->top_k > 0 && p->top_k < kept)
        kept = p->top_k;

    if (p->top_p < 1.0f) {
        double z = 0.0;
        for (int i = 0; i < kept; i++)
            z += exp(logits[order[i]]);
        double cum = 0.0;
        for (int i = 0; i < kept; i++) {
            cum += exp(logits[order[i]]) / z;
            if (cum >= p->top_p) {
                kept = i + 1;
                break;
            }
        }
    }

    if (p->min_p > 0.0f) {
        double z = 0.0;
        for (int i = 0; i < kept; i++)
            z += exp(logits[order[i]]);
        double p_max = exp(logits[order[0]]) / z;
        int k = 0;
        while (k < kept && exp(logits[order[k]]) / z >= p->min_p * p_max)
            k++;
        kept = k;
    }

    double z = 0.0;
    for (int i = 0; i < kept; i++)
        z += exp(logits[order[i]] / p->temperature);
    memset(out, 0, (size_t)n * sizeof *out);
    for (int i = 0; i < kept; i++)
        out[order[i]] = exp(logits[order[i]] / p->temperature) / z;
    free(logits);
    free(order);
}

/* Pearson's statistic of `counts` (n draws) against `probs`. Categories
 * expected fewer than 5 times are pooled into one bin so the asymptotic
 * distribution holds. Zero-probability categories are not counted here (the
 * caller checks they were never drawn). Sets *df. */
static double chi2_stat(const int *counts, const double *probs, int n_cat, int n, int *df)
{
    double stat = 0.0, pool_obs = 0.0, pool_exp = 0.0;
    int bins = 0;
    for (int i = 0; i < n_cat; i++) {
        if (probs[i] <= 0.0)
            continue;
        double e = probs[i] * n;
        if (e < 5.0) {
            pool_obs += counts[i];
            pool_exp += e;
            continue;
        }
        stat += (counts[i] - e) * (counts[i] - e) / e;
        bins++;
    }
    if (pool_exp > 0.0) {
        stat += (pool_obs - pool_exp) * (pool_obs - pool_exp) / pool_exp;
        bins++;
    }
    *df = bins - 1;
    return stat;
}

/* Draws N_DRAWS tokens with `p` from `logits` and checks them against the
 * exact distribution of `expect_p` over `expect_logits`: excluded tokens
 * never drawn, the rest by chi-squared. */
static void check_draws_against(const float *logits, const cairn_sampling_params *p,
                                const float *expect_logits, const cairn_sampling_params *expect_p,
                                int n)
{
    double *probs = calloc((size_t)n, sizeof *probs);
    int *counts = calloc((size_t)n, sizeof *counts);
    assert_true(probs && counts);
    expected_probs(expect_logits, n, expect_p, probs);

    cairn_sampler *s = make_sampler(p, n);
    for (int i = 0; i < N_DRAWS; i++) {
        int32_t t = sample_one(s, logits);
        assert_true(t >= 0 && t < n);
        counts[t]++;
    }
    cairn_sampler_free(s);

    for (int i = 0; i < n; i++)
        if (probs[i] == 0.0 && counts[i] != 0)
            fail_msg("token %d is excluded by the transforms but was drawn %d times", i,
                     counts[i]);
    int df = 0;
    double stat = chi2_stat(counts, probs, n, N_DRAWS, &df);
    if (df >= 1) {
        double crit = support_chi2_critical(df);
        if (!(stat < crit))
            fail_msg("chi-squared %.2f >= %.2f (df %d)", stat, crit, df);
    } else {
        /* One token left: it must have been drawn every time. */
        for (int i = 0; i < n; i++)
            if (probs[i] > 0.0)
                assert_int_equal(counts[i], N_DRAWS);
    }
    free(probs);
    free(counts);
}

static void check_distribution(const float *logits, int n, const cairn_sampling_params *p)
{
    check_draws_against(logits, p, logits, p, n);
}

/* A small vocabulary with a tie (ids 1 and 3) and a spread of values. */
static const float SMALL_LOGITS[10] = {1.0f, 2.5f, 0.3f, 2.5f, -1.0f, 1.8f, 0.0f, 3.0f, -0.5f, 1.2f};

/* ---- parameters ----------------------------------------------------------- */

static void test_defaults(void **state)
{
    (void)state;
    cairn_sampling_params p = cairn_sampling_defaults();
    assert_float_equal(p.temperature, 0.8f, 0.0f);
    assert_int_equal(p.top_k, 40);
    assert_float_equal(p.top_p, 0.95f, 0.0f);
    assert_float_equal(p.min_p, 0.05f, 0.0f);
    assert_float_equal(p.repeat_penalty, 1.0f, 0.0f);
    assert_float_equal(p.frequency_penalty, 0.0f, 0.0f);
    assert_float_equal(p.presence_penalty, 0.0f, 0.0f);
    assert_int_equal(p.penalty_last_n, 64);
    assert_int_equal(p.n_logprobs, 0);
    cairn_sampler *s = make_sampler(&p, 32000);
    cairn_sampler_free(s);
    cairn_sampler_free(NULL); /* harmless */
}

static void test_bad_params(void **state)
{
    (void)state;
    cairn_sampler *s = NULL;
    cairn_sampling_params ok = cairn_sampling_defaults();
    assert_int_equal(cairn_sampler_create(NULL, 10, &s), CAIRN_EINVAL);
    assert_int_equal(cairn_sampler_create(&ok, 10, NULL), CAIRN_EINVAL);
    assert_int_equal(cairn_sampler_create(&ok, 0, &s), CAIRN_EINVAL);
    assert_int_equal(cairn_sampler_create(&ok, -5, &s), CAIRN_EINVAL);

    /* Each bad value alone must be refused. */
    cairn_sampling_params p;
#define EXPECT_BAD(field, value)                                              \
    do {                                                                      \
        p = ok;                                                               \
        p.field = (value);                                                    \
        s = NULL;                                                             \
        if (cairn_sampler_create(&p, 10, &s) != CAIRN_EINVAL)                 \
            fail_msg("%s = %s accepted", #field, #value);                     \
        assert_null(s);                                                       \
    } while (0)
    EXPECT_BAD(temperature, NAN);
    EXPECT_BAD(temperature, INFINITY);
    EXPECT_BAD(top_p, 0.0f);
    EXPECT_BAD(top_p, -0.5f);
    EXPECT_BAD(top_p, 1.01f);
    EXPECT_BAD(top_p, NAN);
    EXPECT_BAD(min_p, -0.01f);
    EXPECT_BAD(min_p, 1.5f);
    EXPECT_BAD(min_p, NAN);
    EXPECT_BAD(repeat_penalty, 0.0f);
    EXPECT_BAD(repeat_penalty, -1.0f);
    EXPECT_BAD(repeat_penalty, NAN);
    EXPECT_BAD(repeat_penalty, INFINITY);
    EXPECT_BAD(frequency_penalty, NAN);
    EXPECT_BAD(presence_penalty, INFINITY);
    EXPECT_BAD(penalty_last_n, -1);
    EXPECT_BAD(n_logprobs, -1);
    EXPECT_BAD(n_logprobs, 21);
#undef EXPECT_BAD

    /* Edge values that are valid. */
    p = ok;
    p.top_p = 1.0f;
    p.min_p = 1.0f;
    p.temperature = -1.0f; /* greedy */
    p.top_k = -3;          /* disabled */
    p.n_logprobs = 20;
    p.penalty_last_n = 0;
    s = make_sampler(&p, 10);
    cairn_sampler_free(s);
}

static void test_bad_calls(void **state)
{
    (void)state;
    cairn_sampling_params p = plain_params(1.0f);
    cairn_sampler *s = make_sampler(&p, 4);
    float logits[4] = {0, 1, 2, 3};
    int32_t tok;
    assert_int_equal(cairn_sampler_sample(NULL, logits, &tok, NULL, NULL), CAIRN_EINVAL);
    assert_int_equal(cairn_sampler_sample(s, NULL, &tok, NULL, NULL), CAIRN_EINVAL);
    assert_int_equal(cairn_sampler_sample(s, logits, NULL, NULL, NULL), CAIRN_EINVAL);

    /* No finite maximum: no distribution. */
    float all_nan[4] = {NAN, NAN, NAN, NAN};
    float all_neg_inf[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    float pos_inf[4] = {0, INFINITY, 1, 2};
    assert_int_equal(cairn_sampler_sample(s, all_nan, &tok, NULL, NULL), CAIRN_EINVAL);
    assert_int_equal(cairn_sampler_sample(s, all_neg_inf, &tok, NULL, NULL), CAIRN_EINVAL);
    assert_int_equal(cairn_sampler_sample(s, pos_inf, &tok, NULL, NULL), CAIRN_EINVAL);

    /* NaN and -inf entries are impossible tokens, never drawn. */
    float masked[4] = {NAN, 0.5f, -INFINITY, 0.4f};
    for (int i = 0; i < 2000; i++) {
        int32_t t = sample_one(s, masked);
        assert_true(t == 1 || t == 3);
    }

    /* Out-of-vocabulary ids given to accept are ignored. */
    cairn_sampler_accept(s, -1);
    cairn_sampler_accept(s, 4);
    cairn_sampler_accept(s, INT32_MAX);
    cairn_sampler_accept(NULL, 1);
    cairn_sampler_reset(NULL);
    cairn_sampler_free(s);
}

/* ---- greedy --------------------------------------------------------------- */

static void test_greedy_argmax(void **state)
{
    (void)state;
    enum { N = 1000 };
    float logits[N];
    fill_logits(logits, N, 7, -5.0f, 5.0f);
    int want = 0;
    for (int i = 1; i < N; i++)
        if (logits[i] > logits[want])
            want = i;

    /* Sampling settings do not matter when greedy: the argmax survives
     * every filter. */
    cairn_sampling_params p = cairn_sampling_defaults();
    p.temperature = 0.0f;
    cairn_sampler *s = make_sampler(&p, N);
    for (int i = 0; i < 10; i++)
        assert_int_equal(sample_one(s, logits), want);
    cairn_sampler_free(s);

    p.temperature = -2.0f;
    s = make_sampler(&p, N);
    assert_int_equal(sample_one(s, logits), want);

    /* Ties go to the lowest id. */
    float tied[6] = {0.5f, 2.0f, 1.0f, 2.0f, -3.0f, 2.0f};
    cairn_sampler_free(s);
    s = make_sampler(&p, 6);
    assert_int_equal(sample_one(s, tied), 1);
    float tied_last[3] = {-1.0f, -7.0f, -1.0f};
    cairn_sampler_free(s);
    s = make_sampler(&p, 3);
    assert_int_equal(sample_one(s, tied_last), 0);
    cairn_sampler_free(s);
}

/* ---- the generator -------------------------------------------------------- */

/* Independent statement of the generator the header names (its seeding,
 * splitmix64, is the tests' own: support_splitmix64). */
static uint64_t ref_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t ref_xoshiro(uint64_t s[4])
{
    uint64_t out = ref_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = ref_rotl(s[3], 45);
    return out;
}

static void test_generator_is_xoshiro256ss(void **state)
{
    (void)state;
    /* Published first outputs, to be sure the reference itself is right. */
    uint64_t x = 0;
    assert_true(support_splitmix64(&x) == 0xe220a8397b1dcdafull);
    uint64_t st[4] = {1, 2, 3, 4};
    assert_true(ref_xoshiro(st) == 11520u);
    assert_true(ref_xoshiro(st) == 0u);
    assert_true(ref_xoshiro(st) == 1509978240u);
    assert_true(ref_xoshiro(st) == 1215971899390074240ull);

    /* With four equal logits the draw is u * 4 with u = top 53 bits / 2^53,
     * so the token is exactly the top two bits of each generator output:
     * the sampler's draws pin down its generator. */
    const uint64_t seed = 0x5eed0123456789abull;
    uint64_t sm = seed, ref[4];
    for (int i = 0; i < 4; i++)
        ref[i] = support_splitmix64(&sm);
    cairn_sampling_params p = plain_params(1.0f);
    p.seed = seed;
    cairn_sampler *s = make_sampler(&p, 4);
    const float flat[4] = {0.25f, 0.25f, 0.25f, 0.25f};
    for (int i = 0; i < 500; i++)
        assert_int_equal(sample_one(s, flat), (int)(ref_xoshiro(ref) >> 62));
    cairn_sampler_free(s);
}

static void test_seed_reproducible(void **state)
{
    (void)state;
    enum { N = 64, STEPS = 300 };
    float logits[N];
    fill_logits(logits, N, 3, -1.0f, 1.0f);
    cairn_sampling_params p = cairn_sampling_defaults();
    p.top_k = 0;
    p.min_p = 0.0f;
    p.seed = 99;
    int32_t a[STEPS], b[STEPS], c[STEPS], d[STEPS];

    cairn_sampler *sa = make_sampler(&p, N), *sb = make_sampler(&p, N);
    p.seed = 100;
    cairn_sampler *sc = make_sampler(&p, N);
    int distinct = 0;
    bool seen[N] = {false};
    for (int i = 0; i < STEPS; i++) {
        a[i] = sample_one(sa, logits);
        b[i] = sample_one(sb, logits);
        c[i] = sample_one(sc, logits);
        if (!seen[a[i]]) {
            seen[a[i]] = true;
            distinct++;
        }
    }
    assert_memory_equal(a, b, sizeof a);
    assert_true(memcmp(a, c, sizeof a) != 0);
    assert_true(distinct > 10); /* really random, not stuck on one token */

    /* reset restarts the generator from the seed. */
    cairn_sampler_reset(sa);
    for (int i = 0; i < STEPS; i++)
        d[i] = sample_one(sa, logits);
    assert_memory_equal(a, d, sizeof a);
    cairn_sampler_free(sa);
    cairn_sampler_free(sb);
    cairn_sampler_free(sc);
}

/* ---- distributions -------------------------------------------------------- */

static void test_dist_temperature(void **state)
{
    (void)state;
    const float temps[] = {1.0f, 0.7f, 1.8f};
    for (size_t i = 0; i < sizeof temps / sizeof temps[0]; i++) {
        cairn_sampling_params p = plain_params(temps[i]);
        p.seed = 11 + i;
        check_distribution(SMALL_LOGITS, 10, &p);
    }
}

static void test_dist_has_power(void **state)
{
    /* The chi-squared check must be able to fail: draws at T = 0.7 are far
     * from the T = 1 distribution. */
    (void)state;
    cairn_sampling_params p = plain_params(0.7f), wrong = plain_params(1.0f);
    double probs[10];
    int counts[10] = {0};
    expected_probs(SMALL_LOGITS, 10, &wrong, probs);
    cairn_sampler *s = make_sampler(&p, 10);
    for (int i = 0; i < N_DRAWS; i++)
        counts[sample_one(s, SMALL_LOGITS)]++;
    cairn_sampler_free(s);
    int df;
    double stat = chi2_stat(counts, probs, 10, N_DRAWS, &df);
    assert_true(stat > 10.0 * support_chi2_critical(df));
}

static void test_dist_top_k(void **state)
{
    (void)state;
    const int ks[] = {1, 2, 3, 4, 9, 10, 50};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        cairn_sampling_params p = plain_params(1.0f);
        p.top_k = ks[i];
        p.seed = 21 + i;
        check_distribution(SMALL_LOGITS, 10, &p);
    }
    /* k = 3 over {3.0, 2.5, 2.5, ...} keeps ids 7, 1, 3; k = 2 keeps 7 and
     * the lower-id of the tie, 1 (checked above through expected_probs'
     * tie rule; check it directly too). */
    cairn_sampling_params p = plain_params(1.0f);
    p.top_k = 2;
    cairn_sampler *s = make_sampler(&p, 10);
    for (int i = 0; i < 3000; i++) {
        int32_t t = sample_one(s, SMALL_LOGITS);
        assert_true(t == 7 || t == 1);
    }
    cairn_sampler_free(s);
}

static void test_dist_top_p(void **state)
{
    (void)state;
    /* Softmax of SMALL_LOGITS, best first: 7 .2611, 1 .1584, 3 .1584,
     * 5 .0787, 9 .0432, 0 .0353, 2 .0175, 6 .0130, 8 .0079, 4 .0048; the
     * cut points (cumulative .2611 .4195 .5779 .6566 .6998 .7351 ...) are
     * kept away from these p values. */
    const float ps[] = {0.1f, 0.3f, 0.5f, 0.62f, 0.9f, 0.99f, 1.0f};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
        cairn_sampling_params p = plain_params(1.0f);
        p.top_p = ps[i];
        p.seed = 31 + i;
        check_distribution(SMALL_LOGITS, 10, &p);
    }
}

static void test_dist_min_p(void **state)
{
    (void)state;
    /* Ratios to p_max (logit differences from 3.0): 1, .607, .607, .301,
     * .165, .135, .067, .050, .030, .018. */
    const float mps[] = {0.05f, 0.1f, 0.2f, 0.5f, 0.7f, 1.0f};
    for (size_t i = 0; i < sizeof mps / sizeof mps[0]; i++) {
        cairn_sampling_params p = plain_params(1.0f);
        p.min_p = mps[i];
        p.seed = 41 + i;
        check_distribution(SMALL_LOGITS, 10, &p);
    }
}

static void test_dist_combined(void **state)
{
    (void)state;
    struct { int k; float top_p, min_p, temp; } cases[] = {
        {6, 0.9f, 0.1f, 1.3f},  /* k then p: p cuts inside the top 6 */
        {8, 0.8f, 0.25f, 0.6f}, /* min-p is the tighter filter       */
        {0, 0.95f, 0.05f, 0.8f},/* the shipped defaults, without k   */
        {40, 0.95f, 0.05f, 0.8f}, /* the shipped defaults            */
        {3, 0.99f, 0.0f, 2.5f}, /* k is the tighter filter           */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cairn_sampling_params p = plain_params(cases[i].temp);
        p.top_k = cases[i].k;
        p.top_p = cases[i].top_p;
        p.min_p = cases[i].min_p;
        p.seed = 51 + i;
        check_distribution(SMALL_LOGITS, 10, &p);
    }
}

static void test_dist_large_vocab(void **state)
{
    /* A vocabulary larger than the sampler's first top-p attempt (it orders
     * only the best few hundred before falling back to a full sort): one
     * case where those suffice, one where they do not. */
    (void)state;
    enum { N = 700 };
    float *logits = malloc(N * sizeof *logits);
    assert_non_null(logits);

    /* Steep: a handful of tokens carry the mass. */
    for (int i = 0; i < N; i++)
        logits[i] = 4.0f - 0.035f * (float)((i * 7919) % N);
    cairn_sampling_params p = plain_params(0.9f);
    p.top_p = 0.9f;
    p.seed = 61;
    check_distribution(logits, N, &p);

    /* Nearly flat: top_p = 0.97 needs almost all of them; the ~3% least
     * likely tokens are excluded and must never be drawn (each would be
     * expected ~28 times if they were wrongly kept). */
    fill_logits(logits, N, 5, 0.0f, 0.2f);
    p = plain_params(1.0f);
    p.top_p = 0.97f;
    p.seed = 62;
    check_distribution(logits, N, &p);

    /* And min-p + top-p together on it. */
    fill_logits(logits, N, 6, -3.0f, 0.0f);
    p = plain_params(1.1f);
    p.top_p = 0.7f;
    p.min_p = 0.2f;
    p.seed = 63;
    check_distribution(logits, N, &p);
    free(logits);
}

/* ---- penalties ------------------------------------------------------------ */

/* Greedy choice after accepting `history`. */
static int32_t greedy_after(const cairn_sampling_params *base, const float *logits, int n,
                            const int32_t *history, int n_hist)
{
    cairn_sampling_params p = *base;
    p.temperature = 0.0f;
    cairn_sampler *s = make_sampler(&p, n);
    for (int i = 0; i < n_hist; i++)
        cairn_sampler_accept(s, history[i]);
    int32_t t = sample_one(s, logits);
    cairn_sampler_free(s);
    return t;
}

static void test_repeat_penalty(void **state)
{
    (void)state;
    cairn_sampling_params p = plain_params(0.0f);
    p.repeat_penalty = 1.25f;
    const int32_t seen0[] = {0};

    /* Positive logit is divided: 2.5 / 1.25 = 2.0. */
    float pos_hi[3] = {2.5f, 2.001f, -1.0f}, pos_lo[3] = {2.5f, 1.999f, -1.0f};
    assert_int_equal(greedy_after(&p, pos_hi, 3, seen0, 1), 1);
    assert_int_equal(greedy_after(&p, pos_lo, 3, seen0, 1), 0);

    /* Negative logit is multiplied: -1.0 * 1.25 = -1.25. */
    float neg_hi[3] = {-1.0f, -1.249f, -9.0f}, neg_lo[3] = {-1.0f, -1.251f, -9.0f};
    assert_int_equal(greedy_after(&p, neg_hi, 3, seen0, 1), 1);
    assert_int_equal(greedy_after(&p, neg_lo, 3, seen0, 1), 0);

    /* Zero stays zero; repetition penalty ignores the count. */
    float zero[3] = {0.0f, -0.001f, -9.0f};
    const int32_t seen000[] = {0, 0, 0};
    assert_int_equal(greedy_after(&p, zero, 3, seen000, 3), 0);
    assert_int_equal(greedy_after(&p, pos_lo, 3, seen000, 3), 0);

    /* Without the history nothing changes. */
    assert_int_equal(greedy_after(&p, pos_hi, 3, NULL, 0), 0);
    assert_int_equal(greedy_after(&p, neg_hi, 3, NULL, 0), 0);

    /* Penalty below 1 rewards repeats. */
    p.repeat_penalty = 0.5f;
    float reward[3] = {1.0f, 1.99f, 0.0f};
    assert_int_equal(greedy_after(&p, reward, 3, seen0, 1), 0);
}

static void test_frequency_presence_penalties(void **state)
{
    (void)state;
    const int32_t seen000[] = {0, 2, 0, 0}; /* token 0 three times */

    cairn_sampling_params p = plain_params(0.0f);
    p.frequency_penalty = 0.5f; /* 3.0 - 3 * 0.5 = 1.5 */
    float f_hi[3] = {3.0f, 1.51f, -5.0f}, f_lo[3] = {3.0f, 1.49f, -5.0f};
    assert_int_equal(greedy_after(&p, f_hi, 3, seen000, 4), 1);
    assert_int_equal(greedy_after(&p, f_lo, 3, seen000, 4), 0);

    p = plain_params(0.0f);
    p.presence_penalty = 0.7f; /* once, whatever the count: 3.0 - 0.7 = 2.3 */
    float pr_hi[3] = {3.0f, 2.31f, -5.0f}, pr_lo[3] = {3.0f, 2.29f, -5.0f};
    assert_int_equal(greedy_after(&p, pr_hi, 3, seen000, 4), 1);
    assert_int_equal(greedy_after(&p, pr_lo, 3, seen000, 4), 0);

    /* All three: 4.0 / 2 - 3 * 0.25 - 0.25 = 1.0 */
    p = plain_params(0.0f);
    p.repeat_penalty = 2.0f;
    p.frequency_penalty = 0.25f;
    p.presence_penalty = 0.25f;
    float all_hi[3] = {4.0f, 1.01f, -5.0f}, all_lo[3] = {4.0f, 0.99f, -5.0f};
    assert_int_equal(greedy_after(&p, all_hi, 3, seen000, 4), 1);
    assert_int_equal(greedy_after(&p, all_lo, 3, seen000, 4), 0);

    /* Token 2 (seen once) is penalized too: 2.2 - 1 * 0.5 = 1.7 < 1.8. */
    p = plain_params(0.0f);
    p.frequency_penalty = 0.5f;
    float two[3] = {-9.0f, 1.8f, 2.2f};
    assert_int_equal(greedy_after(&p, two, 3, seen000, 4), 1);
    assert_int_equal(greedy_after(&p, two, 3, NULL, 0), 2);
}

static void test_penalty_window(void **state)
{
    (void)state;
    cairn_sampling_params p = plain_params(0.0f);
    p.frequency_penalty = 1.0f;
    p.penalty_last_n = 2;
    float logits[4] = {3.0f, 2.5f, -1.0f, -2.0f};

    /* Token 0 has left the two-token window. */
    const int32_t old[] = {0, 2, 3};
    assert_int_equal(greedy_after(&p, logits, 4, old, 3), 0);
    /* Inside the window once: 3.0 - 1 = 2.0 < 2.5. */
    const int32_t recent[] = {2, 0};
    assert_int_equal(greedy_after(&p, logits, 4, recent, 2), 1);
    /* Counted only as often as it is in the window: {0, 0, 0, 2} leaves
     * one 0 in it -> 3.0 - 1 = 2.0 > 1.9; counting all three would pick 1. */
    float tight[4] = {3.0f, 1.9f, -1.0f, -2.0f};
    const int32_t three[] = {0, 0, 0, 2};
    assert_int_equal(greedy_after(&p, tight, 4, three, 4), 0);
    const int32_t zeros[] = {0, 0, 0};
    assert_int_equal(greedy_after(&p, tight, 4, zeros, 3), 1); /* 3 - 2 = 1 < 1.9 */

    /* penalty_last_n = 0 disables penalties. */
    p.penalty_last_n = 0;
    assert_int_equal(greedy_after(&p, logits, 4, recent, 2), 0);

    /* reset forgets the history. */
    p.penalty_last_n = 8;
    p.temperature = 0.0f;
    cairn_sampler *s = make_sampler(&p, 4);
    cairn_sampler_accept(s, 0);
    assert_int_equal(sample_one(s, logits), 1);
    cairn_sampler_reset(s);
    assert_int_equal(sample_one(s, logits), 0);
    /* sample itself records nothing. */
    assert_int_equal(sample_one(s, logits), 0);
    cairn_sampler_free(s);
}

static void test_penalties_before_top_k(void **state)
{
    /* Penalties come first in the chain: with top_k = 1 the draw is the
     * best token *after* the penalty. */
    (void)state;
    cairn_sampling_params p = plain_params(1.0f);
    p.top_k = 1;
    p.repeat_penalty = 2.0f;
    cairn_sampler *s = make_sampler(&p, 4);
    cairn_sampler_accept(s, 0);
    float logits[4] = {3.0f, 2.0f, 1.0f, 0.0f}; /* 0 -> 1.5 */
    for (int i = 0; i < 200; i++)
        assert_int_equal(sample_one(s, logits), 1);
    cairn_sampler_free(s);

    /* ... and before temperature: distribution matches the penalized row. */
    p = plain_params(0.9f);
    p.presence_penalty = 1.0f;
    float penalized[10];
    memcpy(penalized, SMALL_LOGITS, sizeof penalized);
    penalized[7] -= 1.0f;
    penalized[1] -= 1.0f;
    double probs[10];
    expected_probs(penalized, 10, &p, probs);
    s = make_sampler(&p, 10);
    cairn_sampler_accept(s, 7);
    cairn_sampler_accept(s, 1);
    cairn_sampler_accept(s, 7);
    int counts[10] = {0};
    for (int i = 0; i < N_DRAWS; i++)
        counts[sample_one(s, SMALL_LOGITS)]++;
    cairn_sampler_free(s);
    int df;
    double stat = chi2_stat(counts, probs, 10, N_DRAWS, &df);
    assert_true(stat < support_chi2_critical(df));
}

static void test_penalty_overflow(void **state)
{
    /* Extreme but valid settings overflow float; the result must stay a
     * distribution (no NaN draws, no crash). */
    (void)state;
    float logits[3] = {1e10f, 0.0f, -1.0f};
    cairn_sampling_params p = plain_params(1.0f);
    p.repeat_penalty = 1e-30f; /* 1e10 / 1e-30 overflows: the token dominates */
    cairn_sampler *s = make_sampler(&p, 3);
    cairn_sampler_accept(s, 0);
    for (int i = 0; i < 100; i++)
        assert_int_equal(sample_one(s, logits), 0);
    cairn_sampler_free(s);

    p = plain_params(1.0f);
    p.frequency_penalty = 1e38f; /* 5 * 1e38 overflows: the token vanishes */
    s = make_sampler(&p, 3);
    for (int i = 0; i < 5; i++)
        cairn_sampler_accept(s, 0);
    for (int i = 0; i < 100; i++) {
        int32_t t = sample_one(s, logits);
        assert_true(t == 1 || t == 2);
    }
    cairn_sampler_free(s);
}

/* ---- logprobs ------------------------------------------------------------- */

static void log_softmax(const float *logits, int n, double *out)
{
    double mx = -INFINITY, sum = 0.0;
    for (int i = 0; i < n; i++)
        if (logits[i] > mx)
            mx = logits[i];
    for (int i = 0; i < n; i++)
        sum += exp((double)logits[i] - mx);
    for (int i = 0; i < n; i++)
        out[i] = (double)logits[i] - mx - log(sum);
}

static void test_logit_bias(void **state)
{
    (void)state;
    const int N = 10;
    cairn_sampling_params p = plain_params(0.0f);
    /* greedy: the best token (7, logit 3.0) banned, then another forced */
    p.n_logit_bias = 1;
    p.logit_bias[0].token = 7;
    p.logit_bias[0].bias = -100.0f;
    assert_int_equal(greedy_after(&p, SMALL_LOGITS, N, NULL, 0), 1); /* tie 1/3: lower id */
    p.n_logit_bias = 2;
    p.logit_bias[1].token = 4;
    p.logit_bias[1].bias = 100.0f;
    assert_int_equal(greedy_after(&p, SMALL_LOGITS, N, NULL, 0), 4);
    /* a token listed twice takes its last bias */
    p.logit_bias[1].token = 7;
    p.logit_bias[1].bias = 0.25f;
    assert_int_equal(greedy_after(&p, SMALL_LOGITS, N, NULL, 0), 7);

    /* penalties see the biased logit: 1.0 + 1.0 = 2.0, halved by the
     * repetition penalty to 1.0 < 1.2 (penalizing first, 0.5 + 1.0 = 1.5,
     * would keep token 0) */
    const float two[3] = {1.0f, 1.2f, -5.0f};
    const int32_t seen0[] = {0};
    cairn_sampling_params q = plain_params(0.0f);
    q.repeat_penalty = 2.0f;
    q.n_logit_bias = 1;
    q.logit_bias[0].token = 0;
    q.logit_bias[0].bias = 1.0f;
    assert_int_equal(greedy_after(&q, two, 3, seen0, 1), 1);

    /* sampled: the draws follow the distribution of the biased logits under
     * the same transforms */
    cairn_sampling_params b = plain_params(0.9f), plain = plain_params(0.9f);
    b.top_k = plain.top_k = 6;
    b.seed = 77;
    const struct { int32_t token; float bias; } biases[] = {{7, -2.0f}, {2, 2.5f}, {9, 0.5f}};
    float biased[10];
    memcpy(biased, SMALL_LOGITS, sizeof biased);
    b.n_logit_bias = 3;
    for (int i = 0; i < 3; i++) {
        b.logit_bias[i].token = biases[i].token;
        b.logit_bias[i].bias = biases[i].bias;
        biased[biases[i].token] += biases[i].bias;
    }
    check_draws_against(SMALL_LOGITS, &b, biased, &plain, N);

    /* logprobs stay the model's own */
    b.n_logprobs = 3;
    cairn_sampler *s = make_sampler(&b, N);
    plain.n_logprobs = 3;
    plain.seed = 77;
    cairn_sampler *u = make_sampler(&plain, N);
    cairn_token_logprob tb[3], tu[3], cb, cu;
    int32_t xb, xu;
    assert_int_equal(cairn_sampler_sample(s, SMALL_LOGITS, &xb, &cb, tb), CAIRN_OK);
    assert_int_equal(cairn_sampler_sample(u, SMALL_LOGITS, &xu, &cu, tu), CAIRN_OK);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(tb[i].token, tu[i].token);
        assert_true(tb[i].logprob == tu[i].logprob);
    }
    cairn_sampler_free(s);
    cairn_sampler_free(u);

    /* refused: tokens outside the vocabulary, biases outside [-100, 100],
     * too many entries */
    cairn_sampler *bad = NULL;
    const struct { int32_t token; float bias; int n; } wrong[] = {
        {-1, 1.0f, 1}, {N, 1.0f, 1}, {0, 100.5f, 1}, {0, -101.0f, 1}, {0, NAN, 1},
        {0, 1.0f, -1}, {0, 1.0f, CAIRN_MAX_LOGIT_BIAS + 1}};
    for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
        cairn_sampling_params w = plain_params(1.0f);
        w.n_logit_bias = wrong[i].n;
        w.logit_bias[0].token = wrong[i].token;
        w.logit_bias[0].bias = wrong[i].bias;
        assert_int_equal(cairn_sampler_create(&w, N, &bad), CAIRN_EINVAL);
    }
    cairn_sampling_params full = plain_params(1.0f);
    full.n_logit_bias = CAIRN_MAX_LOGIT_BIAS; /* all zero: token 0, bias 0 */
    assert_int_equal(cairn_sampler_create(&full, N, &bad), CAIRN_OK);
    cairn_sampler_free(bad);
}

static void test_logprobs(void **state)
{
    (void)state;
    enum { N = 500 };
    float logits[N];
    double want[N];
    fill_logits(logits, N, 9, -8.0f, 8.0f);
    logits[77] = 9.0f; /* a tie at the top: lower id first */
    logits[123] = 9.0f;
    log_softmax(logits, N, want);
    double dl[N];
    int order[N];
    for (int i = 0; i < N; i++)
        dl[i] = logits[i];
    rank_ids(dl, N, order);

    /* Penalties and transforms must not leak into the reported values. */
    cairn_sampling_params p = cairn_sampling_defaults();
    p.n_logprobs = 20;
    p.temperature = 0.5f;
    p.repeat_penalty = 1.3f;
    p.presence_penalty = 0.5f;
    p.seed = 5;
    cairn_sampler *s = make_sampler(&p, N);
    cairn_sampler_accept(s, 77);
    cairn_sampler_accept(s, order[5]);

    for (int round = 0; round < 20; round++) {
        cairn_token_logprob chosen = {-1, 0}, top[20];
        int32_t tok = -1;
        assert_int_equal(cairn_sampler_sample(s, logits, &tok, &chosen, top), CAIRN_OK);
        assert_int_equal(chosen.token, tok);
        assert_float_equal(chosen.logprob, want[tok], 1e-5);
        for (int i = 0; i < 20; i++) {
            assert_int_equal(top[i].token, order[i]);
            assert_float_equal(top[i].logprob, want[order[i]], 1e-5);
            if (i > 0)
                assert_true(top[i].logprob <= top[i - 1].logprob);
        }
        assert_int_equal(top[0].token, 77);
        assert_int_equal(top[1].token, 123);
    }
    cairn_sampler_free(s);

    /* Over a whole (small) vocabulary they are a distribution. */
    p = plain_params(1.0f);
    p.n_logprobs = 10;
    s = make_sampler(&p, 10);
    cairn_token_logprob chosen, top[20];
    int32_t tok;
    assert_int_equal(cairn_sampler_sample(s, SMALL_LOGITS, &tok, &chosen, top), CAIRN_OK);
    double sum = 0.0;
    for (int i = 0; i < 10; i++)
        sum += exp((double)top[i].logprob);
    assert_float_equal(sum, 1.0, 1e-5);
    cairn_sampler_free(s);

    /* More asked than the vocabulary has: the rest is marked empty. */
    p.n_logprobs = 20;
    s = make_sampler(&p, 3);
    float three[3] = {0.0f, 1.0f, 2.0f};
    assert_int_equal(cairn_sampler_sample(s, three, &tok, &chosen, top), CAIRN_OK);
    assert_int_equal(top[0].token, 2);
    assert_int_equal(top[2].token, 0);
    for (int i = 3; i < 20; i++)
        assert_int_equal(top[i].token, -1);
    cairn_sampler_free(s);

    /* Greedy reports them too; n_logprobs = 0 leaves top alone. */
    p = plain_params(0.0f);
    p.n_logprobs = 0;
    s = make_sampler(&p, 10);
    top[0].token = 4242;
    assert_int_equal(cairn_sampler_sample(s, SMALL_LOGITS, &tok, &chosen, top), CAIRN_OK);
    assert_int_equal(tok, 7);
    assert_int_equal(top[0].token, 4242);
    double ls[10];
    log_softmax(SMALL_LOGITS, 10, ls);
    assert_float_equal(chosen.logprob, ls[7], 1e-6);
    cairn_sampler_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_bad_calls),
        cmocka_unit_test(test_greedy_argmax),
        cmocka_unit_test(test_generator_is_xoshiro256ss),
        cmocka_unit_test(test_seed_reproducible),
        cmocka_unit_test(test_dist_temperature),
        cmocka_unit_test(test_dist_has_power),
        cmocka_unit_test(test_dist_top_k),
        cmocka_unit_test(test_dist_top_p),
        cmocka_unit_test(test_dist_min_p),
        cmocka_unit_test(test_dist_combined),
        cmocka_unit_test(test_dist_large_vocab),
        cmocka_unit_test(test_repeat_penalty),
        cmocka_unit_test(test_frequency_presence_penalties),
        cmocka_unit_test(test_penalty_window),
        cmocka_unit_test(test_penalties_before_top_k),
        cmocka_unit_test(test_penalty_overflow),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_logprobs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
