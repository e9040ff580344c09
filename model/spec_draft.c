/*
 * model/spec_draft.c — a draft model: a smaller model with the target's
 * vocabulary guesses a chain greedily, one token per forward of its own.
 *
 * Its KV lives in the same pages as the target's, in layers of its own
 * geometry placed after the target's (cairn_kv_layout_place), so a prefix
 * cached for the target can carry the draft model's rows too. Draft row j
 * is a function of tokens 0 .. j alone, like a target row.
 *
 *   index      0 .. done-1          done .. n_past      n_past+1 .. +L-1
 *   draft KV   final                computed when it    the chain's own
 *                                   proposes (or kept   rows (scratch)
 *                                   up, page by page,
 *                                   while speculating
 *                                   is expected)
 *
 * Draft rows cost: on a 2-core Zen 4 the 0.5B computes a row of a batch in
 * about 4% of a 1.5B decode step, so keeping them up with every token costs
 * ~4% of plain decoding whether or not the draft model ever proposes again.
 * So they are computed lazily: only while the controller expects to
 * speculate soon (spec_view.keep_up) and, when they have fallen behind,
 * only if the tokens left can repay catching up (spec_view.max_lag).
 *
 * A page may therefore reach the prefix cache, other requests, the lower
 * tiers and the disk with its draft rows missing or partial. Each page says
 * which of its draft rows are final in a stamp after the draft layers:
 *
 *   page:  [ target layers | draft layers | stamp: key, rows, magic ]
 *
 * `rows` leading rows are final for the tokens hashed into `key` (XXH3-64
 * of the page's first `rows` tokens, seeded by the key of the sequence
 * through the page before). The stamp travels with the page's bytes through
 * every tier, so nothing in the store knows about it; a sequence that
 * adopts pages (dmodel_reset) trusts the leading run of pages whose stamps
 * match its own tokens and computes the rest when it needs them. A page
 * reused for other tokens keeps a stale stamp whose key cannot match. A
 * wrong guess costs speed, never an output: every proposal is verified by
 * the target. (So one race is let be: on a device, a page's asynchronous
 * copy to host RAM taken while its rows are being caught up may carry the
 * new stamp and some old rows; a later reader's guesses from them are
 * rejected. On the CPU the engine thread makes every copy.)
 *
 * A chain's rows sit at the indices its tokens get when accepted (row i at
 * n_past + i), so after a step the rows of the accepted prefix of the chain
 * are already right and only the rest is recomputed.
 */
#include "model/spec_impl.h"
#include "model/layer_impl.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* The stamp after a page's draft layers (bytes reserved: a multiple of any
 * alignment a backend wants for the next page). */
typedef struct {
    uint64_t key;   /* XXH3-64 of the page's first `rows` tokens, seeded by
                       the key through the page before (STAMP_SEED for page 0) */
    uint32_t rows;  /* leading rows of the page whose draft KV is final    */
    uint32_t magic; /* STAMP_MAGIC                                         */
} draft_stamp;
#define STAMP_BYTES 256
#define STAMP_MAGIC 0x54465244u /* "DRFT" */
#define STAMP_SEED 0x636169726e647266ull

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
    int stamped;              /* whole pages below this index are stamped  */
    int cleared;              /* pages below this one are stamped by this
                                 sequence or had their stamps cleared      */
    size_t stamp_off;         /* the stamp's byte offset in a page         */
    uint64_t *keys;           /* [keys_cap] key through the end of page p  */
    int n_keys, keys_cap;     /* keys[0 .. n_keys) computed                */
} dmodel_state;

static int dmodel_kv_part(void *method, int page_size, cairn_type dtype, cairn_kv_layout *part)
{
    TRY(cairn_model_kv_layout(method, page_size, dtype, part));
    part->page_bytes += STAMP_BYTES;
    return CAIRN_OK;
}

static void dmodel_fingerprint(void *method, uint8_t out[16])
{
    cairn_model_fingerprint(method, out);
    out[15] ^= 0x5a; /* pages with stamps: never mixed with older pages */
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
    free(d->keys);
    free(d);
}

/* ---- stamps ------------------------------------------------------------- */

static uint64_t page_seed(const dmodel_state *d, int page)
{
    return page == 0 ? STAMP_SEED : d->keys[page - 1];
}

/* keys[0 .. page] from the sequence's tokens (whole pages). */
static int keys_through(dmodel_state *d, const spec_view *v, int page)
{
    if (page >= d->keys_cap) {
        int cap = d->keys_cap ? d->keys_cap : 64;
        while (cap <= page)
            cap *= 2;
        uint64_t *k = realloc(d->keys, (size_t)cap * sizeof *k);
        if (!k)
            return CAIRN_ENOMEM;
        d->keys = k;
        d->keys_cap = cap;
    }
    const int ps = v->kv->page_size;
    for (; d->n_keys <= page; d->n_keys++)
        d->keys[d->n_keys] = XXH3_64bits_withSeed(v->tokens + (size_t)d->n_keys * ps,
                                                  (size_t)ps * sizeof(int32_t),
                                                  page_seed(d, d->n_keys));
    return CAIRN_OK;
}

/* The stamp of page `page` with its first `rows` rows final. */
static int stamp_make(dmodel_state *d, const spec_view *v, int page, int rows, draft_stamp *st)
{
    if (page > 0)
        TRY(keys_through(d, v, page - 1));
    const int ps = v->kv->page_size;
    *st = (draft_stamp){
        .key = rows == ps && page < d->n_keys
                   ? d->keys[page]
                   : XXH3_64bits_withSeed(v->tokens + (size_t)page * ps,
                                          (size_t)rows * sizeof(int32_t), page_seed(d, page)),
        .rows = (uint32_t)rows, .magic = STAMP_MAGIC,
    };
    return CAIRN_OK;
}

static uint8_t *stamp_at(const dmodel_state *d, const spec_view *v, int page)
{
    return (uint8_t *)v->kv_pool + (size_t)v->pages[page] * v->kv->page_bytes + d->stamp_off;
}

static int stamp_write(dmodel_state *d, const spec_view *v, int page, int rows)
{
    draft_stamp st;
    TRY(stamp_make(d, v, page, rows, &st));
    cairn_backend *be = cairn_model_backend(d->m);
    return be->iface->upload(be, stamp_at(d, v, page), &st, sizeof st);
}

/* Before draft rows land in pages first .. last: a page this sequence has
 * not stamped may carry the stamp of an earlier use of its memory (the same
 * tokens, computed again after an eviction), which these rows (a chain's
 * guesses) would make a lie. */
static int stamp_clear(dmodel_state *d, const spec_view *v, int first, int last)
{
    if (first < d->stamped)
        first = d->stamped;
    if (first < d->cleared)
        first = d->cleared;
    const draft_stamp none = {0};
    cairn_backend *be = cairn_model_backend(d->m);
    for (int page = first; page <= last; page++)
        TRY(be->iface->upload(be, stamp_at(d, v, page), &none, sizeof none));
    if (last + 1 > d->cleared)
        d->cleared = last + 1;
    return CAIRN_OK;
}

/* Stamp the whole pages whose draft rows are all final now. */
static int stamp_whole(dmodel_state *d, const spec_view *v)
{
    const int ps = v->kv->page_size;
    const int final = d->done < v->n_past ? d->done : v->n_past;
    for (; (d->stamped + 1) * ps <= final; d->stamped++) {
        TRY(keys_through(d, v, d->stamped));
        TRY(stamp_write(d, v, d->stamped, ps));
    }
    return CAIRN_OK;
}

/* How many leading rows of the adopted pages hold final draft KV for these
 * tokens: whole pages while their stamps match, then what the first page
 * that is not whole says of itself. */
static int rows_stamped(dmodel_state *d, const spec_view *v, int *whole_pages)
{
    const int ps = v->kv->page_size;
    cairn_backend *be = cairn_model_backend(d->m);
    *whole_pages = 0;
    for (int page = 0; page * ps < v->n_past; page++) {
        draft_stamp got, want;
        if (be->iface->download(be, &got, stamp_at(d, v, page), sizeof got) != CAIRN_OK ||
            got.magic != STAMP_MAGIC || got.rows == 0 || got.rows > (uint32_t)ps ||
            page * ps + (int)got.rows > v->n_past ||
            stamp_make(d, v, page, (int)got.rows, &want) != CAIRN_OK || got.key != want.key)
            return page * ps;
        if ((int)got.rows < ps)
            return page * ps + (int)got.rows;
        *whole_pages = page + 1;
    }
    return v->n_past; /* every page, the last one ending at n_past */
}

static int dmodel_reset(void *state, const spec_view *v)
{
    dmodel_state *d = state;
    cairn_kv_layout mine;
    TRY(cairn_model_kv_layout(d->m, v->kv->page_size, v->kv->dtype, &mine));
    d->stamp_off = v->own_kv->layer_base + mine.page_bytes;
    d->n_keys = 0;
    d->n_chain = 0;
    /* an adopted sequence's pages hold the rows their stamps say */
    d->done = rows_stamped(d, v, &d->stamped);
    d->cleared = d->stamped;
    return CAIRN_OK;
}

/* Draft rows done .. upto-1 from v->tokens, in forwards of at most
 * max_batch tokens; with `logits`, the last row's logits land there. */
static int catch_up(dmodel_state *d, const spec_view *v, int upto, bool logits)
{
    const int from = d->done;
    if (upto <= from)
        return stamp_whole(d, v);
    TRY(stamp_clear(d, v, from / v->kv->page_size, (upto - 1) / v->kv->page_size));
    const double t0 = cairn_now();
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
    /* what a row of a batched catch-up costs (a few rows cost about what
     * one does: they say little of the batched price) */
    /* a step's own row or two (the token verification added) are the
     * price of drafting; a longer run is a catch-up the gate weighed */
    const double spent = cairn_now() - t0;
    if (v->catchup_spent && upto - from >= 8)
        *v->catchup_spent += spent;
    if (v->catchup_row && upto - from >= 8) {
        const double per = spent / (upto - from);
        *v->catchup_row = *v->catchup_row > 0 ? *v->catchup_row + 0.3 * (per - *v->catchup_row)
                                              : per;
    }
    return stamp_whole(d, v);
}

/* The last page boundary at or below n_past: how far keeping up goes (a
 * page at a time, so each forward is a batch of page_size rows). */
static int whole_pages(const spec_view *v)
{
    return v->n_past / v->kv->page_size * v->kv->page_size;
}

static int dmodel_advance(void *state, const spec_view *v, int from, const float *features, int n)
{
    (void)from, (void)features, (void)n;
    dmodel_state *d = state;
    d->n_chain = 0;
    const int upto = whole_pages(v);
    if (!v->keep_up || upto - d->done > v->max_lag)
        return CAIRN_OK; /* left behind: computed when it proposes, if ever */
    return catch_up(d, v, upto, false);
}

/* The caller is about to hand a partial page to others: its stamp says how
 * many of its rows are final (nothing is computed for it). */
static int dmodel_sync(void *state, const spec_view *v)
{
    dmodel_state *d = state;
    if (d->done > v->n_past)
        d->done = v->n_past; /* the pending row of a chain is scratch */
    d->n_chain = 0;
    TRY(stamp_whole(d, v));
    const int ps = v->kv->page_size, page = v->n_past / ps;
    const int rows = d->done - page * ps;
    return rows > 0 && page == d->stamped && page * ps < v->capacity ? stamp_write(d, v, page, rows)
                                                                     : CAIRN_OK;
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
    if (v->n_past + 1 - d->done > v->max_lag)
        return CAIRN_OK; /* too far behind to repay catching up: sits out */
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
        TRY(stamp_clear(d, v, pos / v->kv->page_size, pos / v->kv->page_size));
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
    return stamp_whole(d, v);
}

static int dmodel_behind(void *state, const spec_view *v)
{
    const dmodel_state *d = state;
    const int done = d->done < v->n_past ? d->done : v->n_past;
    return v->n_past + 1 - done;
}

const spec_drafter_ops spec_dmodel_ops = {
    .name = "draft",
    .needs_features = false,
    .may_sit_out = true,
    .behind = dmodel_behind,
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
