/*
 * model/sample_batch.c — sampling a batch of logits rows where they are.
 *
 * A decode step of 64 sequences over a 152k vocabulary produces 39 MB of
 * logits; downloading them all to run the CPU sampler costs more than the
 * step's matmuls. A backend with the sample_rows slot (kernels/backend.h)
 * samples on the device instead and returns only token ids and the
 * logprobs asked for. This file is the one place that turns cairn_sampler
 * state into the slot's plain rows, and the slot's fallback:
 *
 *   slot set   for each row: the settings, the penalty window as distinct
 *              (token, count, bias) triples, the logit-bias pairs, the
 *              grammar bitset, and the draw u the sampler's generator would
 *              make next (peeked, not taken); after the slot, the generator
 *              of every row that was sampled (not greedy, not refused) takes
 *              that draw, so the stream stays where cairn_sampler_sample
 *              would have left it.
 *   slot NULL  each row is downloaded, masked (disallowed -> -inf, as
 *              cairn_grammar_matcher_mask writes it) and handed to
 *              cairn_sampler_sample: today's host path, bit for bit.
 *
 * Nothing is allocated per call once the arrays have grown to the largest
 * penalty window seen (they are sized by the samplers' penalty_last_n).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

struct cairn_sample_batch {
    cairn_backend *be;
    int n_vocab, max_rows;
    float *row;                      /* [n_vocab] host, the fallback's row */
    cairn_sample_row *rows;          /* [max_rows]                         */
    cairn_sample_logprob *lp;        /* [max_rows][1 + MAX_LOGPROBS]       */
    cairn_sample_bias *bias;         /* [max_rows][CAIRN_MAX_LOGIT_BIAS]   */
    cairn_sample_penalty *pen;       /* [pen_cap], every row's windows     */
    size_t pen_cap;
};

enum { LP_PER_ROW = 1 + CAIRN_SAMPLE_MAX_LOGPROBS };

int cairn_sample_batch_create(cairn_backend *be, int n_vocab, int max_rows,
                              cairn_sample_batch **out)
{
    if (!be || !out || n_vocab <= 0 || max_rows <= 0)
        return CAIRN_EINVAL;
    cairn_sample_batch *b = calloc(1, sizeof *b);
    if (!b)
        return CAIRN_ENOMEM;
    b->be = be;
    b->n_vocab = n_vocab;
    b->max_rows = max_rows;
    b->row = malloc((size_t)n_vocab * sizeof *b->row);
    b->rows = calloc((size_t)max_rows, sizeof *b->rows);
    b->lp = calloc((size_t)max_rows * LP_PER_ROW, sizeof *b->lp);
    b->bias = calloc((size_t)max_rows * CAIRN_MAX_LOGIT_BIAS, sizeof *b->bias);
    if (!b->row || !b->rows || !b->lp || !b->bias) {
        cairn_sample_batch_free(b);
        return CAIRN_ENOMEM;
    }
    *out = b;
    return CAIRN_OK;
}

void cairn_sample_batch_free(cairn_sample_batch *b)
{
    if (!b)
        return;
    free(b->row);
    free(b->rows);
    free(b->lp);
    free(b->bias);
    free(b->pen);
    free(b);
}

/* The fallback: each row through the host sampler, exactly as a caller
 * holding the downloaded row would run it. */
static int run_on_host(cairn_sample_batch *b, const float *logits, int n_rows,
                       const cairn_sample_req *reqs, int32_t *tokens, int *status,
                       cairn_token_logprob *lp)
{
    const cairn_backend_iface *op = b->be->iface;
    const size_t row_bytes = (size_t)b->n_vocab * sizeof(float);
    for (int r = 0; r < n_rows; r++) {
        int rc = op->download(b->be, b->row, logits + (size_t)reqs[r].row * b->n_vocab, row_bytes);
        if (rc != CAIRN_OK)
            return rc; /* rows before r were sampled: their generators moved */
        const uint32_t *allowed = reqs[r].allowed;
        for (int t = 0; allowed && t < b->n_vocab; t++)
            if (!(allowed[t >> 5] >> (t & 31) & 1u))
                b->row[t] = -INFINITY;
        cairn_token_logprob *mine = lp && reqs[r].want_logprobs ? lp + (size_t)r * LP_PER_ROW
                                                                : NULL;
        status[r] = cairn_sampler_sample(reqs[r].sampler, b->row, &tokens[r], mine,
                                         mine ? mine + 1 : NULL);
        if (status[r] != CAIRN_OK)
            tokens[r] = -1;
    }
    return CAIRN_OK;
}

/* Room for `need` penalty triples in all. */
static int reserve_penalties(cairn_sample_batch *b, size_t need)
{
    if (need <= b->pen_cap)
        return CAIRN_OK;
    size_t cap = b->pen_cap ? b->pen_cap : 1024;
    while (cap < need)
        cap *= 2;
    cairn_sample_penalty *p = realloc(b->pen, cap * sizeof *p);
    if (!p)
        return CAIRN_ENOMEM;
    b->pen = p;
    b->pen_cap = cap;
    return CAIRN_OK;
}

int cairn_sample_batch_run(cairn_sample_batch *b, const float *logits, int n_rows,
                           const cairn_sample_req *reqs, int32_t *tokens, int *status,
                           cairn_token_logprob *lp)
{
    if (!b || !logits || !reqs || !tokens || !status || n_rows <= 0 || n_rows > b->max_rows)
        return CAIRN_EINVAL;
    size_t pen_need = 0;
    for (int r = 0; r < n_rows; r++) {
        if (!reqs[r].sampler || cairn_sampler_n_vocab(reqs[r].sampler) != b->n_vocab ||
            reqs[r].row < 0)
            return CAIRN_EINVAL;
        const cairn_sampling_params *p = cairn_sampler_params(reqs[r].sampler);
        if (cairn_sampling_has_penalties(p))
            pen_need += (size_t)p->penalty_last_n;
    }
    if (!b->be->iface->sample_rows)
        return run_on_host(b, logits, n_rows, reqs, tokens, status, lp);

    int rc = reserve_penalties(b, pen_need);
    if (rc != CAIRN_OK)
        return rc;
    size_t pen_used = 0;
    for (int r = 0; r < n_rows; r++) {
        cairn_sampler *s = reqs[r].sampler;
        const cairn_sampling_params *p = cairn_sampler_params(s);
        cairn_sample_row *row = &b->rows[r];
        cairn_sample_penalty *pen = b->pen + pen_used;
        cairn_sample_bias *bias = b->bias + (size_t)r * CAIRN_MAX_LOGIT_BIAS;
        *row = (cairn_sample_row){
            .row = reqs[r].row,
            .temperature = p->temperature,
            .top_k = p->top_k,
            .top_p = p->top_p,
            .min_p = p->min_p,
            .repeat_penalty = p->repeat_penalty,
            .frequency_penalty = p->frequency_penalty,
            .presence_penalty = p->presence_penalty,
            .n_penalties = cairn_sampler_window(s, pen),
            .penalties = pen,
            .n_bias = cairn_sampler_bias_pairs(s, bias),
            .bias = bias,
            .allowed = reqs[r].allowed,
            .want_logprobs = reqs[r].want_logprobs,
            .n_logprobs = reqs[r].want_logprobs ? p->n_logprobs : 0,
            .u = p->temperature > 0.0f ? cairn_sampler_peek_uniform(s) : 0.0,
        };
        pen_used += (size_t)row->n_penalties;
    }
    const bool any_lp = lp != NULL;
    rc = b->be->iface->sample_rows(b->be, logits, n_rows, b->n_vocab, b->rows, tokens,
                                   any_lp ? b->lp : NULL);
    if (rc != CAIRN_OK)
        return rc; /* no generator has moved */
    for (int r = 0; r < n_rows; r++) {
        cairn_sampler *s = reqs[r].sampler;
        if (tokens[r] < 0 || tokens[r] >= b->n_vocab) {
            /* what the host sampler says of a row without a finite maximum */
            tokens[r] = -1;
            status[r] = CAIRN_EINVAL;
            continue;
        }
        status[r] = CAIRN_OK;
        if (cairn_sampler_params(s)->temperature > 0.0f)
            cairn_sampler_skip_uniform(s); /* the draw the slot was given */
        if (any_lp && reqs[r].want_logprobs) {
            const int n = 1 + cairn_sampler_params(s)->n_logprobs;
            for (int i = 0; i < n; i++) {
                lp[(size_t)r * LP_PER_ROW + i].token = b->lp[(size_t)r * LP_PER_ROW + i].token;
                lp[(size_t)r * LP_PER_ROW + i].logprob =
                    b->lp[(size_t)r * LP_PER_ROW + i].logprob;
            }
        }
    }
    return CAIRN_OK;
}
