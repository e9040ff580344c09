/*
 * model/spec_draft.c — a draft model: a smaller model with the target's
 * vocabulary guesses a chain greedily, one token per forward of its own.
 *
 * Its KV lives in the same pages as the target's, in layers of its own
 * geometry placed after the target's (cairn_kv_layout_place), so a prefix
 * cached for the target is cached for the draft model too. Draft row j is
 * a function of tokens 0 .. j alone, like a target row, so a page's draft
 * rows are final as soon as its tokens are: nothing stops sharing.
 *
 *   index      0 .. done-1          done .. n_past      n_past+1 .. +L-1
 *   draft KV   final                caught up at the    the chain's own
 *                                   next proposal, or   rows (scratch)
 *                                   when a page fills
 *
 * Catching up lazily is what makes a paused draft model cheap: while the
 * controller has speculation paused, the draft model runs once per page
 * (a forward of page_size rows, about what two or three single-token
 * forwards cost with the multi-row kernels), not once per token; whole
 * pages are final whenever the caller has them back, so they can be shared,
 * and cairn_spec_seq_sync finishes a partial page before it is.
 *
 * A chain's rows sit at the indices its tokens get when accepted (row i at
 * n_past + i), so after a step the rows of the accepted prefix of the chain
 * are already right and only the rest is recomputed.
 */
#include "model/spec_impl.h"
#include "model/layer_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    cairn_model *m;
    int n_vocab, max_batch;
    cairn_sampling_params sp; /* its logit bias applies to the guesses */
    int done;                 /* draft rows 0 .. done-1 are final         */
    int32_t chain[SPEC_MAX_DEPTH + 1];
    int n_chain;              /* chain rows computed: chain[0 .. n_chain-1]
                                 sit at indices base+1 .. base+n_chain     */
    int base;                 /* n_past when the chain was drafted         */
    float *logits;            /* [n_vocab]                                 */
    uint8_t *want;            /* [max_batch] zeros but the last            */
} dmodel_state;

static int dmodel_kv_part(void *method, int page_size, cairn_type dtype, cairn_kv_layout *part)
{
    return cairn_model_kv_layout(method, page_size, dtype, part);
}

static void dmodel_fingerprint(void *method, uint8_t out[16])
{
    cairn_model_fingerprint(method, out);
}

static int dmodel_seq_create(void *method, const cairn_spec_params *p,
                             const cairn_sampling_params *sp, void **state)
{
    (void)p;
    dmodel_state *d = calloc(1, sizeof *d);
    if (!d)
        return CAIRN_ENOMEM;
    d->m = method;
    d->n_vocab = cairn_model_hparams(d->m)->n_vocab;
    int max_seqs;
    cairn_model_limits(d->m, &d->max_batch, &max_seqs);
    d->sp = *sp;
    d->logits = malloc((size_t)d->n_vocab * sizeof(float));
    d->want = calloc((size_t)d->max_batch, 1);
    if (!d->logits || !d->want) {
        free(d->logits);
        free(d->want);
        free(d);
        return CAIRN_ENOMEM;
    }
    *state = d;
    return CAIRN_OK;
}

static void dmodel_seq_free(void *state)
{
    dmodel_state *d = state;
    if (!d)
        return;
    free(d->logits);
    free(d->want);
    free(d);
}

static int dmodel_reset(void *state, const spec_view *v)
{
    dmodel_state *d = state;
    d->done = v->n_past; /* an adopted sequence's pages hold rows below */
    d->n_chain = 0;
    return CAIRN_OK;
}

/* Draft rows done .. upto-1 from v->tokens, in forwards of at most
 * max_batch tokens; with `logits`, the last row's logits land there. */
static int catch_up(dmodel_state *d, const spec_view *v, int upto, bool logits)
{
    while (d->done < upto) {
        int T = upto - d->done;
        if (T > d->max_batch)
            T = d->max_batch;
        const bool last = d->done + T == upto;
        if (last && logits)
            d->want[T - 1] = 1;
        const cairn_seq_batch sb = {
            .tokens = v->tokens + d->done, .n_tokens = T, .kv_start = d->done,
            .pages = v->pages, .want = d->want,
        };
        int n_out = 0;
        const int rc = cairn_model_forward(d->m, v->kv_pool, v->own_kv, &sb, 1, d->logits, NULL,
                                           &n_out);
        d->want[T - 1] = 0;
        TRY(rc);
        d->done += T;
    }
    return CAIRN_OK;
}

/* The last page boundary at or below n_past: rows below it must be final
 * when the caller gets the pages back. */
static int whole_pages(const spec_view *v)
{
    return v->n_past / v->kv->page_size * v->kv->page_size;
}

static int dmodel_advance(void *state, const spec_view *v, int from, const float *features, int n)
{
    (void)from, (void)features, (void)n;
    dmodel_state *d = state;
    d->n_chain = 0;
    return catch_up(d, v, whole_pages(v), false);
}

static int dmodel_sync(void *state, const spec_view *v)
{
    dmodel_state *d = state;
    if (d->done > v->n_past)
        d->done = v->n_past; /* the pending row of a chain is scratch */
    d->n_chain = 0;
    return catch_up(d, v, v->n_past, false);
}

/* The guess from a row of logits: argmax after the request's logit bias
 * (a forced token must be guessable), ties to the lower id. */
static int32_t guess(dmodel_state *d)
{
    for (int i = 0; i < d->sp.n_logit_bias; i++)
        d->logits[d->sp.logit_bias[i].token] += d->sp.logit_bias[i].bias;
    int32_t best = 0;
    for (int i = 1; i < d->n_vocab; i++)
        if (d->logits[i] > d->logits[best])
            best = i;
    return best;
}

static int dmodel_propose(void *state, const spec_view *v, spec_tree *t, int budget, int source)
{
    dmodel_state *d = state;
    int len = v->chain_len < budget ? v->chain_len : budget;
    if (len > SPEC_MAX_DEPTH)
        len = SPEC_MAX_DEPTH;
    /* the chain's rows must fit the pages: indices up to n_past + len - 1 */
    if (v->n_past + len > v->capacity)
        len = v->capacity - v->n_past;
    d->n_chain = 0;
    d->base = v->n_past;
    if (len <= 0)
        return CAIRN_OK;
    /* rows up to the pending token's; the pending token's logits */
    if (d->done > v->n_past)
        d->done = v->n_past; /* a pending row of an earlier chain */
    TRY(catch_up(d, v, v->n_past + 1, true));
    int parent = 0;
    for (int i = 0; i < len; i++) {
        const int32_t tok = guess(d);
        const int r = spec_tree_add(t, parent, tok, source);
        if (r < 0)
            break;
        d->chain[i] = tok;
        parent = r;
        if (i + 1 == len)
            break;
        /* the guess's own row, at the index it gets when accepted */
        const int32_t pos = v->n_past + 1 + i;
        const uint8_t one = 1;
        const cairn_seq_batch sb = {
            .tokens = &d->chain[i], .n_tokens = 1, .kv_start = pos, .pages = v->pages,
            .want = &one,
        };
        int n_out = 0;
        TRY(cairn_model_forward(d->m, v->kv_pool, v->own_kv, &sb, 1, d->logits, NULL, &n_out));
        d->n_chain = i + 1;
    }
    return CAIRN_OK;
}

static int dmodel_accepted(void *state, const spec_view *v, const spec_tree *t, const int *path,
                           int n_path, const float *features)
{
    (void)t, (void)path, (void)features;
    dmodel_state *d = state;
    const int old = v->n_past - n_path;
    /* the chain's rows that hold accepted tokens at their final index */
    if (d->base == old && d->done == old + 1) {
        int m = 0;
        while (m < d->n_chain && m + 1 < n_path && v->tokens[old + 1 + m] == d->chain[m])
            m++;
        d->done = old + 1 + m;
    } else if (d->done > old) {
        d->done = old; /* drafted nothing this step: rows past old are stale */
    }
    d->n_chain = 0;
    /* shared pages must be complete when the caller has them back */
    return v->shared ? catch_up(d, v, whole_pages(v), false) : CAIRN_OK;
}

const spec_drafter_ops spec_dmodel_ops = {
    .name = "draft",
    .needs_features = false,
    .may_sit_out = true,
    .seq_create = dmodel_seq_create,
    .seq_free = dmodel_seq_free,
    .reset = dmodel_reset,
    .advance = dmodel_advance,
    .propose = dmodel_propose,
    .accepted = dmodel_accepted,
    .sync = dmodel_sync,
    .kv_part = dmodel_kv_part,
    .fingerprint = dmodel_fingerprint,
};
