/*
 * tests/sampler/test_sample_batch.c — cairn_sample_batch_run (model/
 * sample_batch.c) against per-row cairn_sampler_sample.
 *
 *   fallback   on the CPU backend (no sample_rows slot) a batch of rows with
 *              every kind of setting (greedy, temperature, top-k/p, min-p,
 *              penalties over a window that fills and slides, logit bias,
 *              grammar bitsets, logprobs, refused rows) gives the tokens,
 *              statuses and logprobs of cairn_sampler_sample on the same
 *              rows, masked on the host, bit for bit, step after step;
 *   the slot   a backend whose sample_rows slot records what it is given
 *              (and answers with the CPU sampler's own token) receives the
 *              sampler state exactly: settings, the window's distinct
 *              (token, count, bias), the bias pairs, the mask, and u equal
 *              to the draw cairn_sampler_sample would make; a refused row
 *              does not advance its generator, a sampled one does.
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

enum { N_ROWS = 12, N_STEPS = 40, LP_ROW = 1 + CAIRN_SAMPLE_MAX_LOGPROBS };

/* The settings of row r: every transform, alone and together. */
static cairn_sampling_params row_params(int r, int n_vocab)
{
    cairn_sampling_params p = cairn_sampling_defaults();
    p.seed = 1000 + (uint64_t)r;
    p.n_logprobs = r % 4 == 0 ? 5 : (r % 4 == 1 ? 20 : 0);
    switch (r % 9) {
    case 0: p.temperature = 0.0f; break;                               /* greedy */
    case 1: p.top_k = 0; p.top_p = 1.0f; p.min_p = 0.0f; p.temperature = 0.7f; break;
    case 2: p.top_k = 7; p.top_p = 1.0f; p.min_p = 0.0f; break;
    case 3: p.top_k = 0; p.top_p = 0.6f; p.min_p = 0.0f; break;
    case 4: p.top_k = 0; p.top_p = 1.0f; p.min_p = 0.2f; p.temperature = 1.5f; break;
    case 5: break; /* the defaults: top-k, top-p, min-p at once */
    case 6:
        p.repeat_penalty = 1.4f;
        p.frequency_penalty = 0.3f;
        p.presence_penalty = 0.2f;
        p.penalty_last_n = 6; /* fills and slides within the test's steps */
        break;
    case 7:
        p.n_logit_bias = 4;
        p.logit_bias[0].token = 3;
        p.logit_bias[0].bias = 6.0f;
        p.logit_bias[1].token = n_vocab - 1;
        p.logit_bias[1].bias = -100.0f;
        p.logit_bias[2].token = 3;
        p.logit_bias[2].bias = 2.5f; /* listed twice: the last wins */
        p.logit_bias[3].token = 10;
        p.logit_bias[3].bias = 1.0f;
        p.repeat_penalty = 1.2f; /* penalties of biased tokens */
        p.penalty_last_n = 8;
        break;
    default:
        p.temperature = 0.0f; /* greedy with penalties */
        p.repeat_penalty = 2.0f;
        p.presence_penalty = 1.0f;
        break;
    }
    return p;
}

/* Random logits; some rows get ties, NaNs, or are refused outright. */
static void fill_row(kt_rng *g, float *row, int n, int r, int step)
{
    kt_fill(g, row, (size_t)n, -4.0f, 4.0f);
    if (r % 3 == 0)
        for (int i = 0; i < n; i += 7)
            row[i] = 1.5f; /* ties between ids */
    if (r % 5 == 2)
        row[kt_below(g, n)] = NAN;
    if (r == 10 && step % 4 == 1)
        for (int i = 0; i < n; i++)
            row[i] = -INFINITY; /* no finite maximum: refused */
    if (r == 11 && step % 5 == 3)
        row[kt_below(g, n)] = INFINITY; /* refused too */
}

/* A grammar-like mask: about 2/3 of the tokens, the best ones included
 * some of the time, nothing at all for row 9 at some steps. */
static void fill_mask(kt_rng *g, uint32_t *bits, int n, int r, int step)
{
    const int words = (n + 31) / 32;
    for (int w = 0; w < words; w++)
        bits[w] = (uint32_t)kt_next(g) | (uint32_t)kt_next(g);
    if (r == 9 && step % 6 == 5)
        memset(bits, 0, (size_t)words * sizeof *bits);
}

static void mask_row(float *row, const uint32_t *bits, int n)
{
    for (int t = 0; t < n; t++)
        if (!(bits[t >> 5] >> (t & 31) & 1u))
            row[t] = -INFINITY;
}

static void check_against_host(int n_vocab)
{
    cairn_backend *be = kt_cpu(1);
    kt_rng g = kt_rng_for(n_vocab > 1000 ? "batch-large" : "batch");
    cairn_sampler *mine[N_ROWS], *ref[N_ROWS];
    for (int r = 0; r < N_ROWS; r++) {
        cairn_sampling_params p = row_params(r, n_vocab);
        assert_int_equal(cairn_sampler_create(&p, n_vocab, &mine[r]), CAIRN_OK);
        assert_int_equal(cairn_sampler_create(&p, n_vocab, &ref[r]), CAIRN_OK);
    }
    cairn_sample_batch *b = NULL;
    assert_int_equal(cairn_sample_batch_create(be, n_vocab, N_ROWS, &b), CAIRN_OK);
    const size_t words = ((size_t)n_vocab + 31) / 32;
    float *host = kt_xmalloc((size_t)N_ROWS * n_vocab * sizeof(float));
    float *row = kt_xmalloc((size_t)n_vocab * sizeof(float));
    uint32_t *bits = kt_xmalloc((size_t)N_ROWS * words * sizeof(uint32_t));
    float *dev = kt_dev(be, NULL, (size_t)N_ROWS * n_vocab * sizeof(float));
    cairn_sample_req reqs[N_ROWS];
    int32_t tokens[N_ROWS];
    int status[N_ROWS];
    static cairn_token_logprob lp[N_ROWS * LP_ROW], want_lp[LP_ROW];
    int refused = 0, masked = 0;

    for (int step = 0; step < N_STEPS; step++) {
        for (int r = 0; r < N_ROWS; r++) {
            fill_row(&g, host + (size_t)r * n_vocab, n_vocab, r, step);
            const bool with_mask = r % 3 == 1 || r == 9;
            if (with_mask)
                fill_mask(&g, bits + (size_t)r * words, n_vocab, r, step);
            /* request r draws from row 5r mod N_ROWS: not the identity */
            reqs[r] = (cairn_sample_req){.row = (r * 5) % N_ROWS, .sampler = mine[r],
                                         .allowed = with_mask ? bits + (size_t)r * words : NULL,
                                         .want_logprobs = r % 2 == 0};
        }
        assert_int_equal(be->iface->upload(be, dev, host, (size_t)N_ROWS * n_vocab * sizeof(float)),
                         CAIRN_OK);
        memset(lp, 0xab, sizeof lp);
        assert_int_equal(cairn_sample_batch_run(b, dev, N_ROWS, reqs, tokens, status, lp),
                         CAIRN_OK);
        for (int r = 0; r < N_ROWS; r++) {
            memcpy(row, host + (size_t)reqs[r].row * n_vocab, (size_t)n_vocab * sizeof(float));
            if (reqs[r].allowed) {
                mask_row(row, reqs[r].allowed, n_vocab);
                masked++;
            }
            int32_t want = -1;
            const bool wl = reqs[r].want_logprobs;
            const int rc = cairn_sampler_sample(ref[r], row, &want, wl ? &want_lp[0] : NULL,
                                                wl ? &want_lp[1] : NULL);
            if (status[r] != rc)
                fail_msg("step %d row %d: status %d, the host sampler's %d", step, r, status[r],
                         rc);
            if (rc != CAIRN_OK) {
                assert_int_equal(tokens[r], -1);
                refused++;
                continue;
            }
            if (tokens[r] != want)
                fail_msg("step %d row %d: token %d, the host sampler's %d", step, r, tokens[r],
                         want);
            if (wl) {
                const int n_lp = 1 + cairn_sampler_params(ref[r])->n_logprobs;
                if (memcmp(&lp[(size_t)r * LP_ROW], want_lp, (size_t)n_lp * sizeof *want_lp))
                    fail_msg("step %d row %d: logprobs differ from the host sampler's", step, r);
            }
            cairn_sampler_accept(mine[r], tokens[r]);
            cairn_sampler_accept(ref[r], want);
        }
    }
    /* the test reached what it means to check */
    assert_true(refused >= 3);
    assert_true(masked > 0);

    be->iface->free(be, dev);
    free(host);
    free(row);
    free(bits);
    cairn_sample_batch_free(b);
    for (int r = 0; r < N_ROWS; r++) {
        cairn_sampler_free(mine[r]);
        cairn_sampler_free(ref[r]);
    }
    cairn_backend_destroy(be);
}

static void test_fallback_equals_host(void **state)
{
    (void)state;
    check_against_host(1000);
}

static void test_fallback_equals_host_large(void **state)
{
    (void)state;
    check_against_host(151936);
}

/* ---- what the slot is given --------------------------------------------- */

/* A CPU backend with a recording sample_rows slot. */
static cairn_backend_iface rec_iface;
static const cairn_backend_iface *cpu_iface;
static cairn_sample_row rec_rows[N_ROWS];
static cairn_sample_penalty rec_pen[N_ROWS][64];
static cairn_sample_bias rec_bias[N_ROWS][CAIRN_MAX_LOGIT_BIAS];
static int rec_refuse; /* the row the slot answers -1 for, or -1 */

static int rec_sample_rows(cairn_backend *be, const float *logits, int n_rows, int n_vocab,
                           const cairn_sample_row *rows, int32_t *tokens, cairn_sample_logprob *lp)
{
    (void)lp;
    assert_true(n_rows <= N_ROWS);
    float *row = kt_xmalloc((size_t)n_vocab * sizeof(float));
    for (int r = 0; r < n_rows; r++) {
        rec_rows[r] = rows[r];
        assert_true(rows[r].n_penalties <= 64);
        memcpy(rec_pen[r], rows[r].penalties, (size_t)rows[r].n_penalties * sizeof *rec_pen[r]);
        memcpy(rec_bias[r], rows[r].bias, (size_t)rows[r].n_bias * sizeof *rec_bias[r]);
        assert_int_equal(cpu_iface->download(be, row, logits + (size_t)r * n_vocab,
                                             (size_t)n_vocab * sizeof(float)),
                         CAIRN_OK);
        assert_int_equal(rows[r].row, r);
        tokens[r] = r == rec_refuse ? -1 : support_argmax(row, n_vocab);
    }
    free(row);
    return CAIRN_OK;
}

static void test_slot_receives_sampler_state(void **state)
{
    (void)state;
    enum { V = 50 };
    cairn_backend *be = kt_cpu(1);
    cpu_iface = be->iface;
    rec_iface = *be->iface;
    rec_iface.sample_rows = rec_sample_rows;
    be->iface = &rec_iface;

    kt_rng g = kt_rng_for("slot");
    cairn_sampler *s[N_ROWS];
    cairn_rng gen[N_ROWS];    /* each row's generator, kept here */
    int counts[N_ROWS][V];    /* each row's window, kept here    */
    int32_t hist[N_ROWS][64];
    int n_hist[N_ROWS];
    for (int r = 0; r < N_ROWS; r++) {
        cairn_sampling_params p = row_params(r, V);
        assert_int_equal(cairn_sampler_create(&p, V, &s[r]), CAIRN_OK);
        cairn_rng_seed(&gen[r], p.seed);
        n_hist[r] = 0;
    }
    cairn_sample_batch *b = NULL;
    assert_int_equal(cairn_sample_batch_create(be, V, N_ROWS, &b), CAIRN_OK);
    float host[N_ROWS * V];
    uint32_t bits[N_ROWS][2];
    float *dev = kt_dev(be, NULL, sizeof host);
    cairn_sample_req reqs[N_ROWS];
    int32_t tokens[N_ROWS];
    int status[N_ROWS];
    for (int step = 0; step < 20; step++) {
        kt_fill(&g, host, N_ROWS * V, -3.0f, 3.0f);
        assert_int_equal(be->iface->upload(be, dev, host, sizeof host), CAIRN_OK);
        rec_refuse = step % 3 == 0 ? step % N_ROWS : -1;
        for (int r = 0; r < N_ROWS; r++) {
            bits[r][0] = (uint32_t)kt_next(&g);
            bits[r][1] = (uint32_t)kt_next(&g);
            reqs[r] = (cairn_sample_req){
                .row = r, .sampler = s[r], .allowed = r % 2 ? bits[r] : NULL,
                .want_logprobs = r % 3 == 0};
        }
        assert_int_equal(cairn_sample_batch_run(b, dev, N_ROWS, reqs, tokens, status, NULL),
                         CAIRN_OK);
        for (int r = 0; r < N_ROWS; r++) {
            const cairn_sampling_params *p = cairn_sampler_params(s[r]);
            const cairn_sample_row *got = &rec_rows[r];
            assert_true(got->temperature == p->temperature && got->top_k == p->top_k &&
                        got->top_p == p->top_p && got->min_p == p->min_p &&
                        got->repeat_penalty == p->repeat_penalty &&
                        got->frequency_penalty == p->frequency_penalty &&
                        got->presence_penalty == p->presence_penalty);
            assert_ptr_equal(got->allowed, reqs[r].allowed);
            assert_int_equal(got->want_logprobs != 0, reqs[r].want_logprobs);
            assert_int_equal(got->n_logprobs, reqs[r].want_logprobs ? p->n_logprobs : 0);
            /* u: the next draw of the row's own generator */
            if (p->temperature > 0.0f) {
                cairn_rng peek = gen[r];
                if (got->u != cairn_rng_uniform(&peek))
                    fail_msg("step %d row %d: u is not the generator's next draw", step, r);
            }
            /* the bias pairs, duplicates carrying the last bias */
            assert_int_equal(got->n_bias, p->n_logit_bias);
            for (int i = 0; i < got->n_bias; i++) {
                float last = 0.0f;
                for (int j = 0; j < p->n_logit_bias; j++)
                    if (p->logit_bias[j].token == rec_bias[r][i].token)
                        last = p->logit_bias[j].bias;
                assert_int_equal(rec_bias[r][i].token, p->logit_bias[i].token);
                assert_true(rec_bias[r][i].bias == last);
            }
            /* the window: its distinct tokens with their counts */
            memset(counts[r], 0, sizeof counts[r]);
            const int from = n_hist[r] > p->penalty_last_n ? n_hist[r] - p->penalty_last_n : 0;
            for (int i = from; i < n_hist[r]; i++)
                counts[r][hist[r][i]]++;
            int distinct = 0;
            for (int t = 0; t < V; t++)
                distinct += counts[r][t] > 0;
            if (!cairn_sampling_has_penalties(p))
                distinct = 0;
            assert_int_equal(got->n_penalties, distinct);
            for (int i = 0; i < got->n_penalties; i++) {
                const cairn_sample_penalty *e = &rec_pen[r][i];
                assert_true(e->token >= 0 && e->token < V);
                assert_int_equal(e->count, counts[r][e->token]);
                float bias = 0.0f;
                for (int j = 0; j < p->n_logit_bias; j++)
                    if (p->logit_bias[j].token == e->token)
                        bias = p->logit_bias[j].bias;
                assert_true(e->bias == bias);
                for (int j = 0; j < i; j++)
                    assert_int_not_equal(rec_pen[r][j].token, e->token);
            }
            /* what came back */
            if (r == rec_refuse) {
                assert_int_equal(status[r], CAIRN_EINVAL);
                assert_int_equal(tokens[r], -1);
                continue; /* its generator stays where it was */
            }
            assert_int_equal(status[r], CAIRN_OK);
            assert_int_equal(tokens[r], support_argmax(host + r * V, V));
            if (p->temperature > 0.0f)
                (void)cairn_rng_uniform(&gen[r]);
            cairn_sampler_accept(s[r], tokens[r]);
            if (n_hist[r] < 64)
                hist[r][n_hist[r]++] = tokens[r];
        }
    }
    /* and the sampler's own next draw is where this test's generator is */
    for (int r = 0; r < N_ROWS; r++)
        if (cairn_sampler_params(s[r])->temperature > 0.0f) {
            cairn_rng peek = gen[r];
            assert_true(cairn_sampler_peek_uniform(s[r]) == cairn_rng_uniform(&peek));
        }

    be->iface->free(be, dev);
    cairn_sample_batch_free(b);
    for (int r = 0; r < N_ROWS; r++)
        cairn_sampler_free(s[r]);
    be->iface = cpu_iface;
    cairn_backend_destroy(be);
}

static void test_bad_calls(void **state)
{
    (void)state;
    cairn_backend *be = kt_cpu(1);
    cairn_sample_batch *b = NULL;
    assert_int_equal(cairn_sample_batch_create(NULL, 10, 2, &b), CAIRN_EINVAL);
    assert_int_equal(cairn_sample_batch_create(be, 0, 2, &b), CAIRN_EINVAL);
    assert_int_equal(cairn_sample_batch_create(be, 10, 0, &b), CAIRN_EINVAL);
    assert_int_equal(cairn_sample_batch_create(be, 10, 2, &b), CAIRN_OK);
    cairn_sampling_params p = cairn_sampling_defaults();
    cairn_sampler *s10 = NULL, *s11 = NULL;
    assert_int_equal(cairn_sampler_create(&p, 10, &s10), CAIRN_OK);
    assert_int_equal(cairn_sampler_create(&p, 11, &s11), CAIRN_OK);
    float *dev = kt_dev(be, NULL, 3 * 11 * sizeof(float));
    cairn_sample_req reqs[3] = {{.sampler = s10}, {.row = 1, .sampler = s10}, {.sampler = s10}};
    int32_t tok[3];
    int st[3];
    assert_int_equal(cairn_sample_batch_run(b, dev, 3, reqs, tok, st, NULL), CAIRN_EINVAL);
    assert_int_equal(cairn_sample_batch_run(b, dev, 0, reqs, tok, st, NULL), CAIRN_EINVAL);
    assert_int_equal(cairn_sample_batch_run(b, NULL, 1, reqs, tok, st, NULL), CAIRN_EINVAL);
    reqs[1].sampler = s11; /* another vocabulary */
    assert_int_equal(cairn_sample_batch_run(b, dev, 2, reqs, tok, st, NULL), CAIRN_EINVAL);
    reqs[1].sampler = NULL;
    assert_int_equal(cairn_sample_batch_run(b, dev, 2, reqs, tok, st, NULL), CAIRN_EINVAL);
    reqs[1].sampler = s10;
    reqs[1].row = -1;
    assert_int_equal(cairn_sample_batch_run(b, dev, 2, reqs, tok, st, NULL), CAIRN_EINVAL);
    reqs[1].row = 1;
    /* zeros everywhere: a valid row (all ties; greedy or not, a token) */
    assert_int_equal(cairn_sample_batch_run(b, dev, 2, reqs, tok, st, NULL), CAIRN_OK);
    assert_int_equal(st[0], CAIRN_OK);
    assert_true(tok[0] >= 0 && tok[0] < 10);
    be->iface->free(be, dev);
    cairn_sampler_free(s10);
    cairn_sampler_free(s11);
    cairn_sample_batch_free(b);
    cairn_sample_batch_free(NULL);
    cairn_backend_destroy(be);
}

int main(void)
{
    kt_init_seed("sample_batch");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fallback_equals_host),
        cmocka_unit_test(test_fallback_equals_host_large),
        cmocka_unit_test(test_slot_receives_sampler_state),
        cmocka_unit_test(test_bad_calls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
