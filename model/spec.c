/*
 * model/spec.c — speculative decoding of one sequence with any set of draft
 * methods: one draft tree per step (every method adds to it), one
 * tree-masked target forward, acceptance by drawing as plain decoding does, and a
 * controller that sizes chains and pauses speculation that does not pay.
 * The contract is in model/model.h; the drafter table in model/spec_impl.h.
 *
 * Indices, for a sequence whose first n_past tokens have target KV and whose
 * token n_past ("the root") is pending:
 *
 *   target KV   index i = token i, RoPE position i; tree row r of a step
 *               sits at index n_past + r, RoPE position n_past + depth(r)
 *   method KV   in each method's own layers of the same pages (placed by
 *               cairn_spec_kv_layout after the target's), never the target's
 */
#include "model/spec_impl.h"
#include "model/layer_impl.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define SPEC_MAX_METHODS 8
/* Rows per target forward while a sequence is begun with methods that read
 * features (their host buffers are sized for this many). */
#define BEGIN_CHUNK 64

struct cairn_spec {
    cairn_model *target;
    cairn_hparams thp;
    int max_batch_tokens;
    spec_drafter drafters[SPEC_MAX_METHODS];
    int n;
    char describe[96];
    /* What the last sequence that judged speculation learnt: 0 = it paid,
     * else the pause a new sequence starts with (the controller's memory
     * across sequences; the decoders of one spec run on one thread). */
    int prior_pause;
    /* What verifying T rows (the root and T-1 guesses) cost on this machine
     * as measured, seconds (EMAs; 0 = not measured yet): the price list
     * every sequence's controller sizes its drafts by (control_update). */
    double verify_cost[SPEC_MAX_DRAFT + 2];
    /* What a token of speculation with a model drafter saved, as a fraction
     * of a plain step, in the windows judged lately (EMA; may be negative),
     * and whether any was judged yet: how much catching up a new sequence's
     * draft model is worth (spec_control.hope). */
    double model_gain;
    bool model_gain_known;
    double plain_cost; /* a plain step, as the last sequence measured it */
};

/* ======================================================================== */
/* The set of methods                                                       */
/* ======================================================================== */

cairn_spec_params cairn_spec_defaults(void)
{
    return (cairn_spec_params){.depth = 5, .top_k = 8, .n_draft = 32, .ngram_min = 2,
                               .ngram_max = 4, .chain_max = 12};
}

int cairn_spec_create(cairn_model *target, cairn_spec **out)
{
    if (!target || !out)
        return CAIRN_EINVAL;
    cairn_spec *s = calloc(1, sizeof *s);
    if (!s)
        return CAIRN_ENOMEM;
    s->target = target;
    s->thp = *cairn_model_hparams(target);
    int max_seqs;
    cairn_model_limits(target, &s->max_batch_tokens, &max_seqs);
    *out = s;
    return CAIRN_OK;
}

void cairn_spec_free(cairn_spec *s)
{
    if (!s)
        return;
    /* an EAGLE-3 head set the target's features to its layers' states */
    if (cairn_spec_method_mask(s, "eagle3"))
        cairn_model_set_feature_layers(s->target, NULL, 0);
    for (int i = 0; i < s->n; i++)
        if (s->drafters[i].ops->method_free)
            s->drafters[i].ops->method_free(s->drafters[i].method);
    free(s);
}

static int spec_add(cairn_spec *s, const spec_drafter_ops *ops, void *method)
{
    if (!s || !ops || s->n == SPEC_MAX_METHODS)
        return CAIRN_EINVAL;
    for (int i = 0; i < s->n; i++)
        if (s->drafters[i].ops == ops)
            return CAIRN_EINVAL; /* each method once */
    s->drafters[s->n++] = (spec_drafter){.ops = ops, .method = method};
    size_t len = strlen(s->describe);
    snprintf(s->describe + len, sizeof s->describe - len, "%s%s", len ? "+" : "", ops->name);
    return CAIRN_OK;
}

int spec_add_drafter(cairn_spec *s, const spec_drafter_ops *ops, void *method)
{
    return spec_add(s, ops, method);
}

cairn_model *spec_target(const cairn_spec *s) { return s->target; }

int cairn_spec_add_suffix(cairn_spec *s, int64_t corpus_tokens)
{
    if (!s)
        return CAIRN_EINVAL;
    if (corpus_tokens < 0)
        corpus_tokens = CAIRN_SPEC_CORPUS_DEFAULT;
    spec_suffix *c;
    TRY(spec_suffix_create(corpus_tokens, &c));
    const int rc = spec_add(s, &spec_suffix_ops, c);
    if (rc != CAIRN_OK)
        spec_suffix_free(c);
    return rc;
}

int cairn_spec_add_ngram(cairn_spec *s) { return cairn_spec_add_suffix(s, -1); }

int cairn_spec_add_eagle(cairn_spec *s, cairn_eagle *head)
{
    /* not beside an EAGLE-3 head (here or in another spec of the target):
     * the target's features are then its layers' states */
    if (!s || !head || cairn_model_feature_dim(s->target) != s->thp.dim)
        return CAIRN_EINVAL;
    return spec_add(s, &spec_eagle_ops, head);
}

int cairn_spec_add_draft_model(cairn_spec *s, cairn_model *draft, char *err, size_t err_len)
{
    if (!s || !draft)
        return CAIRN_EINVAL;
    const cairn_hparams *d = cairn_model_hparams(draft);
    if (d->n_vocab != s->thp.n_vocab)
        return cairn_errorf(err, err_len, CAIRN_EINVAL,
                            "the draft model's vocabulary has %d tokens, the target's %d: a draft "
                            "model must share the target's vocabulary",
                            d->n_vocab, s->thp.n_vocab);
    if (draft == s->target)
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "the draft model is the target itself");
    if (cairn_model_backend(draft) != cairn_model_backend(s->target))
        return cairn_errorf(err, err_len, CAIRN_EINVAL,
                            "the draft model must run on the target's backend");
    return spec_add(s, &spec_dmodel_ops, draft);
}

const char *cairn_spec_describe(const cairn_spec *s) { return s ? s->describe : ""; }
int cairn_spec_count(const cairn_spec *s) { return s ? s->n : 0; }

uint32_t cairn_spec_method_mask(const cairn_spec *s, const char *name)
{
    if (!s || !name)
        return 0;
    if (strcmp(name, "ngram") == 0) /* what suffix speculation was called */
        name = "suffix";
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->drafters[i].ops->name, name) == 0)
            return 1u << i;
    return 0;
}

/* Every method's own KV placed after the target's; placed[i] for method i
 * (n_layer 0 when it has none). */
static int spec_layouts(const cairn_spec *s, int page_size, cairn_type dtype,
                        cairn_kv_layout *page, cairn_kv_layout *placed)
{
    TRY(cairn_model_kv_layout(s->target, page_size, dtype, page));
    for (int i = 0; i < s->n; i++) {
        const spec_drafter *d = &s->drafters[i];
        memset(&placed[i], 0, sizeof placed[i]);
        if (!d->ops->kv_part)
            continue;
        cairn_kv_layout part;
        TRY(d->ops->kv_part(d->method, page_size, dtype, &part));
        TRY(cairn_kv_layout_place(page, &part, &placed[i]));
    }
    for (int i = 0; i < s->n; i++)
        placed[i].page_bytes = page->page_bytes;
    return CAIRN_OK;
}

int cairn_spec_kv_layout(const cairn_spec *s, int page_size, cairn_type dtype,
                         cairn_kv_layout *out)
{
    if (!s || !out)
        return CAIRN_EINVAL;
    cairn_kv_layout placed[SPEC_MAX_METHODS];
    return spec_layouts(s, page_size, dtype, out, placed);
}

bool cairn_spec_has_kv(const cairn_spec *s)
{
    for (int i = 0; s && i < s->n; i++)
        if (s->drafters[i].ops->kv_part)
            return true;
    return false;
}

void cairn_spec_fingerprint(const cairn_spec *s, uint8_t out[16])
{
    memset(out, 0, 16);
    if (!cairn_spec_has_kv(s))
        return;
    XXH3_state_t *hs = XXH3_createState();
    if (!hs)
        return;
    XXH3_128bits_reset(hs);
    for (int i = 0; i < s->n; i++) {
        const spec_drafter *d = &s->drafters[i];
        if (!d->ops->kv_part)
            continue;
        uint8_t fp[16] = {0};
        if (d->ops->fingerprint)
            d->ops->fingerprint(d->method, fp);
        XXH3_128bits_update(hs, d->ops->name, strlen(d->ops->name) + 1);
        XXH3_128bits_update(hs, fp, sizeof fp);
    }
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(hs));
    XXH3_freeState(hs);
    memcpy(out, c.digest, 16);
}

bool cairn_spec_needs_features(const cairn_spec *s)
{
    for (int i = 0; s && i < s->n; i++)
        if (s->drafters[i].ops->needs_features)
            return true;
    return false;
}

bool cairn_spec_whole_pages(const cairn_spec *s)
{
    for (int i = 0; s && i < s->n; i++)
        if (s->drafters[i].ops->rows_read_next_token)
            return true;
    return false;
}

/* ======================================================================== */
/* The draft tree                                                           */
/* ======================================================================== */

int spec_tree_add(spec_tree *t, int parent, int32_t token, int source)
{
    if (parent < 0 || parent >= t->n)
        return -1;
    for (int r = parent + 1; r < t->n; r++)
        if (t->parent[r] == parent && t->token[r] == token) {
            t->source[r] |= 1u << source;
            return r;
        }
    if (t->n >= t->cap || t->depth[parent] + 1 > SPEC_MAX_DEPTH)
        return -1;
    const int r = t->n++;
    t->token[r] = token;
    t->parent[r] = parent;
    t->depth[r] = t->depth[parent] + 1;
    t->source[r] = 1u << source;
    return r;
}

void spec_top_k_logprobs(const float *logits, int n, int k, int32_t *ids, float *lp)
{
    float max = -INFINITY;
    for (int i = 0; i < n; i++)
        if (logits[i] > max)
            max = logits[i];
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += exp((double)logits[i] - max);
    const float log_z = (float)(max + log(sum));
    int m = 0;
    for (int i = 0; i < n; i++) {
        const float l = logits[i];
        if (m == k && !(l > logits[ids[k - 1]]))
            continue;
        int at = m < k ? m++ : k - 1;
        while (at > 0 && l > logits[ids[at - 1]]) {
            ids[at] = ids[at - 1];
            at--;
        }
        ids[at] = i;
    }
    for (int i = 0; i < m; i++)
        lp[i] = logits[ids[i]] - log_z;
}

/* ======================================================================== */
/* One sequence                                                             */
/* ======================================================================== */

/* The controller's view of what steps cost and give (seconds, EMAs). */
typedef struct {
    double plain_cost;   /* one plain decoding step; 0 = not measured yet     */
    double spec_cost;    /* one speculative step, drafting included          */
    double spec_tokens;  /* tokens one speculative step gives                */
    int n_spec;          /* speculative steps measured since the last pause  */
    int pause_left;      /* plain steps to go before trying again            */
    int pause_len;       /* the next pause's length (doubles while it fails) */
    int since_plain;     /* speculative steps since plain_cost was measured  */
    int chain;           /* rows the chain drafters may propose this step    */
    double accepted, rejected; /* guesses kept, and steps that rejected one
                                  (decaying counts): a guess is kept with
                                  probability about kept / (kept + rejected) */
    double draft_row;    /* what drafting costs per proposed row (seconds):
                            nearly nothing for suffix lookup, a forward of
                            its own per row for a draft model               */
    /* Catching up a model drafter (model/spec_draft.c) */
    double hope;         /* what a speculated token saves, as a fraction of a
                            plain step, when model drafters propose: the
                            spec's memory at first, then this sequence's
                            last judged window (<= 0 after a loss: its rows
                            are no longer kept up, only caught up for a
                            probe the tokens left can repay)              */
    bool model_window;   /* a model drafter proposed in the current window */
    bool caller_keep_up; /* the caller may let it speculate soon           */
    bool decoding;       /* past the prompt: the caller asked for a step  */
    bool fell_behind;    /* model drafters were left behind at some point,
                            or judged: catching up is weighed from then on
                            (before, they keep up as part of the prompt, as
                            a draft model's prefill always is)             */
    int tokens_left;     /* tokens the caller may still ask for (0: unknown) */
} spec_control;

struct cairn_spec_seq {
    cairn_spec *spec;
    cairn_spec_params dp;
    cairn_sampling_params sp;
    uint32_t propose_mask;   /* methods that propose for this sequence */
    char describe[96];       /* their names */
    void *states[SPEC_MAX_METHODS];
    cairn_kv_layout own_kv[SPEC_MAX_METHODS]; /* each method's placed KV part */
    int feature_dim;         /* 0 when no method reads features */

    /* the sequence */
    void *kv_pool;
    const cairn_kv_layout *kv;
    const int32_t *pages;
    int capacity;
    int32_t *tokens;   /* [tokens_cap]: committed tokens, then the root   */
    int n_past;        /* tokens with target KV; tokens[n_past] is pending */
    int n_known;       /* tokens[0 .. n_known) are known (>= n_past)       */
    int tokens_cap;
    bool shared;
    bool begun;

    /* verification */
    spec_tree tree;
    int32_t *tree_pos;
    uint8_t *tree_mask;    /* [1 + n_draft][capacity + 1]                   */
    int mask_capacity;
    uint8_t *want;
    float *tree_logits;    /* [1 + n_draft][n_vocab], made by the first
                              cairn_spec_seq_step (NULL until then)       */
    float *tree_feat;      /* [1 + n_draft][feature_dim], the same          */
    float *path_feat;      /* [1 + SPEC_MAX_DEPTH][feature_dim]             */
    float *begin_feat;     /* [BEGIN_CHUNK][feature_dim]                    */
    cairn_sampler *own;    /* the request's sampler, when none is lent      */
    cairn_sampler *sampler; /* draws every emitted token: own, or the
                              caller's (cairn_spec_seq_use_sampler)        */
    cairn_spec_hooks hooks;
    cairn_token_logprob *lps; /* [1 + SPEC_MAX_DEPTH][1 + n_logprobs] of the
                              last step's tokens                          */
    spec_control ctl;
    double t_step;         /* when the step being verified began           */
    int drafted_cap;       /* out[] room of the drafted step; 0 = none      */
    double t_drafting;     /* seconds the drafted step spent proposing      */
    double catchup_spent;  /* of it, seconds model drafters spent catching
                              up (not the step's own price: the gate
                              weighed it)                                  */
    uint64_t tenant;       /* whose request (cairn_spec_seq_set_tenant)      */
    int first_new;         /* n_past when first begun or adopted: tokens
                              from there on are new to the cache (-1 until
                              then)                                        */
    cairn_spec_stats stats;
};

/* Rows a model drafter may compute to catch up: as many as the tokens left
 * can repay twice over (a margin for what the estimate does not know).
 * Catching up n rows costs n * catchup_row seconds; each token speculated
 * with it saves about hope * plain_cost (the last judged gain), over the
 * tokens left (at most 512 counted: an answer is rarely longer). No bound
 * before anything is measured (that is how it gets measured), nor while a
 * sequence has kept its drafters up from its start without a verdict: its
 * prompt's rows are a draft model's prefill, as in any engine. */
#define LAG_HORIZON_MAX 512
#define LAG_HORIZON_UNKNOWN 256
static int lag_allowed(const cairn_spec_seq *s, const spec_drafter *dr)
{
    const spec_control *c = &s->ctl;
    if (s->dp.fixed_length || !dr->ops->may_sit_out)
        return INT_MAX;
    const double plain = c->plain_cost > 0 ? c->plain_cost : s->spec->plain_cost;
    if (plain <= 0 || dr->catchup_row <= 0 || !c->fell_behind)
        return INT_MAX;
    /* after a loss, a tenth of a step: probes after a pause still catch
     * up its rows while many tokens are left (text turns to copying), not
     * near the end of the answer */
    const double hope = c->hope > 0.1 ? c->hope : 0.1;
    int left = c->tokens_left > 0 ? c->tokens_left : LAG_HORIZON_UNKNOWN;
    if (left > LAG_HORIZON_MAX)
        left = LAG_HORIZON_MAX;
    const double rows = 0.5 * hope * left * plain / dr->catchup_row;
    return rows < 1e6 ? (int)rows : 1000000;
}

static spec_view seq_view(cairn_spec_seq *s, int method)
{
    spec_drafter *dr = &s->spec->drafters[method];
    return (spec_view){
        .tokens = s->tokens, .n_past = s->n_past, .n_known = s->n_known,
        .kv_pool = s->kv_pool, .kv = s->kv, .pages = s->pages, .capacity = s->capacity,
        .shared = s->shared, .feature_dim = s->feature_dim,
        .own_kv = s->own_kv[method].n_layer > 0 ? &s->own_kv[method] : NULL,
        .chain_len = s->ctl.chain, .tenant = s->tenant,
        /* a pause is of decoding steps: the prompt's rows are kept up
         * through it, so that the end of a pause costs only its own rows */
        .keep_up = s->dp.fixed_length ||
                   (s->ctl.caller_keep_up && s->ctl.hope > 0 &&
                    (s->ctl.pause_left == 0 || !s->ctl.decoding)),
        .max_lag = lag_allowed(s, dr), .catchup_row = &dr->catchup_row,
        .catchup_spent = &s->catchup_spent,
    };
}

int cairn_spec_seq_create(cairn_spec *spec, const cairn_spec_params *dp,
                          const cairn_sampling_params *sp, uint32_t methods,
                          cairn_spec_seq **out)
{
    if (!spec || !out)
        return CAIRN_EINVAL;
    cairn_spec_params d = dp ? *dp : cairn_spec_defaults();
    const cairn_spec_params def = cairn_spec_defaults();
    if (d.ngram_min == 0 && d.ngram_max == 0) { /* unset: the defaults */
        d.ngram_min = def.ngram_min;
        d.ngram_max = def.ngram_max;
    }
    if (d.chain_max == 0)
        d.chain_max = def.chain_max < d.n_draft ? def.chain_max : d.n_draft;
    if (d.depth < 1 || d.depth > SPEC_MAX_DEPTH || d.top_k < 1 || d.top_k > 16 ||
        d.n_draft < 1 || d.n_draft > SPEC_MAX_DRAFT || d.ngram_min < 1 || d.ngram_min > 16 ||
        d.ngram_max < d.ngram_min || d.ngram_max > 16 || d.chain_max < 1 ||
        d.chain_max > SPEC_MAX_DEPTH)
        return CAIRN_EINVAL;
    cairn_sampling_params s = cairn_sampling_defaults();
    s.temperature = 0;
    if (sp)
        s = *sp;
    if (!isfinite(s.temperature) || !(s.top_p > 0 && s.top_p <= 1) || !(s.min_p >= 0 && s.min_p <= 1))
        return CAIRN_EINVAL;
    if (1 + d.n_draft > spec->max_batch_tokens)
        return CAIRN_ERANGE;
    cairn_spec_seq *q = calloc(1, sizeof *q);
    if (!q)
        return CAIRN_ENOMEM;
    q->spec = spec;
    q->dp = d;
    q->sp = s;
    q->propose_mask = methods ? methods : ~0u;
    for (int i = 0; i < spec->n; i++)
        if (q->propose_mask & (1u << i)) {
            const size_t len = strlen(q->describe);
            snprintf(q->describe + len, sizeof q->describe - len, "%s%s", len ? "+" : "",
                     spec->drafters[i].ops->name);
        }
    /* the target's final feature, or the layer states an EAGLE-3 head set */
    q->feature_dim = cairn_spec_needs_features(spec) ? cairn_model_feature_dim(spec->target) : 0;
    q->ctl.chain = d.fixed_length ? d.chain_max : (d.chain_max < 4 ? d.chain_max : 4);
    q->ctl.pause_len = 16;
    q->ctl.pause_left = spec->prior_pause;
    q->ctl.caller_keep_up = true;
    /* until its own first verdict a sequence hopes for what model drafters
     * gained lately, and for a quarter of a step at least: one free-form
     * answer elsewhere must not keep a copying request from trying */
    q->ctl.hope = spec->model_gain_known && spec->model_gain > 0.25 ? spec->model_gain : 0.25;
    q->first_new = -1;
    if (spec->prior_pause > 16)
        q->ctl.pause_len = spec->prior_pause;

    const size_t rows = 1 + (size_t)d.n_draft;
    const size_t fd = (size_t)q->feature_dim;
    q->tree.token = malloc(rows * sizeof(int32_t));
    q->tree.parent = malloc(rows * sizeof(int32_t));
    q->tree.depth = malloc(rows * sizeof(int32_t));
    q->tree.source = malloc(rows * sizeof(uint32_t));
    q->tree_pos = malloc(rows * sizeof(int32_t));
    q->want = malloc(rows);
    q->lps = malloc((size_t)(SPEC_MAX_DEPTH + 2) * (1 + (size_t)s.n_logprobs) * sizeof *q->lps);
    if (fd) {
        q->path_feat = malloc((size_t)(SPEC_MAX_DEPTH + 2) * fd * sizeof(float));
        q->begin_feat = malloc((size_t)BEGIN_CHUNK * fd * sizeof(float));
    }
    int rc = cairn_sampler_create(&s, spec->thp.n_vocab, &q->own);
    q->sampler = q->own;
    if (rc == CAIRN_OK &&
        (!q->tree.token || !q->tree.parent || !q->tree.depth || !q->tree.source || !q->tree_pos ||
         !q->want || !q->lps || (fd && (!q->path_feat || !q->begin_feat))))
        rc = CAIRN_ENOMEM;
    for (int i = 0; rc == CAIRN_OK && i < spec->n; i++) {
        const spec_drafter *dr = &spec->drafters[i];
        if (dr->ops->seq_create)
            rc = dr->ops->seq_create(dr->method, &q->dp, &q->sp, &q->states[i]);
    }
    if (rc != CAIRN_OK) {
        cairn_spec_seq_free(q);
        return rc;
    }
    memset(q->want, 1, rows);
    *out = q;
    return CAIRN_OK;
}

void cairn_spec_seq_free(cairn_spec_seq *s)
{
    if (!s)
        return;
    /* what it brought joins the methods that learn across requests (a
     * failure there loses a guess source, never an output) */
    for (int i = 0; s->first_new >= 0 && s->tokens && i < s->spec->n; i++) {
        const spec_drafter_ops *ops = s->spec->drafters[i].ops;
        if (ops->retire && s->states[i]) {
            const spec_view v = seq_view(s, i);
            (void)ops->retire(s->states[i], &v, s->first_new);
        }
    }
    for (int i = 0; i < s->spec->n; i++)
        if (s->states[i] && s->spec->drafters[i].ops->seq_free)
            s->spec->drafters[i].ops->seq_free(s->states[i]);
    free(s->tokens);
    free(s->tree.token);
    free(s->tree.parent);
    free(s->tree.depth);
    free(s->tree.source);
    free(s->tree_pos);
    free(s->tree_mask);
    free(s->want);
    free(s->tree_logits);
    free(s->tree_feat);
    free(s->path_feat);
    free(s->begin_feat);
    free(s->lps);
    cairn_sampler_free(s->own);
    free(s);
}

int cairn_spec_seq_n_past(const cairn_spec_seq *s) { return s ? s->n_past : 0; }

void cairn_spec_seq_set_tenant(cairn_spec_seq *s, uint64_t tenant)
{
    if (s)
        s->tenant = tenant;
}

int cairn_spec_seq_sync(cairn_spec_seq *s)
{
    if (!s)
        return CAIRN_EINVAL;
    if (!s->kv_pool)
        return CAIRN_OK; /* never begun: no rows to make final */
    for (int i = 0; i < s->spec->n; i++) {
        const spec_drafter_ops *ops = s->spec->drafters[i].ops;
        if (ops->sync) {
            const spec_view v = seq_view(s, i);
            TRY(ops->sync(s->states[i], &v));
        }
    }
    return CAIRN_OK;
}
const char *cairn_spec_seq_describe(const cairn_spec_seq *s) { return s ? s->describe : ""; }

void cairn_spec_seq_stats(const cairn_spec_seq *s, cairn_spec_stats *out)
{
    if (s && out)
        *out = s->stats;
}

int cairn_spec_seq_max_out(const cairn_spec_seq *s)
{
    return s ? 1 + SPEC_MAX_DEPTH : 0;
}

int cairn_spec_seq_span(const cairn_spec_seq *s)
{
    /* the pending token and the tree; a draft model's chain and an EAGLE
     * head's scratch rows stay below that (chains are at most chain_max <=
     * SPEC_MAX_DEPTH long, head rows at most (depth-1) * top_k) */
    if (!s)
        return 0;
    int span = 1 + s->dp.n_draft;
    const int head_rows = 1 + (s->dp.depth - 1) * s->dp.top_k;
    if (head_rows > span)
        span = head_rows;
    if (1 + s->dp.chain_max > span)
        span = 1 + s->dp.chain_max;
    return span;
}

/* Scratch sized by the capacity; tokens[] keeps its contents and holds at
 * least max(capacity + 1, n_tokens) entries. */
static int seq_resize(cairn_spec_seq *s, int capacity, int n_tokens)
{
    int need = capacity + 1 > n_tokens ? capacity + 1 : n_tokens;
    if (need > s->tokens_cap) {
        int32_t *t = realloc(s->tokens, (size_t)need * sizeof *t);
        if (!t)
            return CAIRN_ENOMEM;
        s->tokens = t;
        s->tokens_cap = need;
    }
    if (capacity != s->mask_capacity) {
        free(s->tree_mask);
        const size_t cap1 = capacity > 0 ? (size_t)capacity : 1; /* malloc(0) may be NULL */
        s->tree_mask = malloc((size_t)(1 + s->dp.n_draft) * (cap1 + 1));
        s->mask_capacity = s->tree_mask ? capacity : 0;
        if (!s->tree_mask)
            return CAIRN_ENOMEM;
    }
    s->capacity = capacity;
    return CAIRN_OK;
}

static int check_layout(const cairn_spec_seq *s, const cairn_kv_layout *kv)
{
    cairn_kv_layout want;
    cairn_kv_layout placed[SPEC_MAX_METHODS];
    if (spec_layouts(s->spec, kv->page_size, kv->dtype, &want, placed) != CAIRN_OK)
        return CAIRN_EINVAL;
    if (kv->n_layer != want.n_layer || kv->n_kv_head != want.n_kv_head ||
        kv->head_dim != want.head_dim || kv->page_bytes != want.page_bytes || kv->layer_base != 0)
        return CAIRN_EINVAL;
    return CAIRN_OK;
}

static int place_methods(cairn_spec_seq *s, const cairn_kv_layout *kv)
{
    cairn_kv_layout page;
    return spec_layouts(s->spec, kv->page_size, kv->dtype, &page, s->own_kv);
}

static int reset_methods(cairn_spec_seq *s)
{
    for (int i = 0; i < s->spec->n; i++) {
        const spec_drafter_ops *ops = s->spec->drafters[i].ops;
        if (ops->reset) {
            const spec_view v = seq_view(s, i);
            TRY(ops->reset(s->states[i], &v));
        }
    }
    return CAIRN_OK;
}

/* The target computed rows from .. n_past-1 (features, when kept, in feat). */
static int advance_methods(cairn_spec_seq *s, int from, const float *feat, int n)
{
    for (int i = 0; i < s->spec->n; i++) {
        const spec_drafter_ops *ops = s->spec->drafters[i].ops;
        if (ops->advance) {
            const spec_view v = seq_view(s, i);
            if (ops->may_sit_out && !v.keep_up)
                s->ctl.fell_behind = true;
            TRY(ops->advance(s->states[i], &v, from, ops->needs_features ? feat : NULL, n));
        }
    }
    return CAIRN_OK;
}

int cairn_spec_seq_begin(cairn_spec_seq *s, void *kv_pool, const cairn_kv_layout *kv,
                         const int32_t *pages, int capacity, const int32_t *prompt, int n)
{
    if (!s || !kv_pool || !kv || !pages || !prompt || n < 1 || capacity <= n)
        return CAIRN_EINVAL;
    cairn_spec *spec = s->spec;
    if (check_layout(s, kv) != CAIRN_OK)
        return CAIRN_EINVAL;
    for (int i = 0; i < n; i++)
        if (prompt[i] < 0 || prompt[i] >= spec->thp.n_vocab)
            return CAIRN_EINVAL;
    s->begun = false;
    s->shared = false;
    TRY(seq_resize(s, capacity, n));
    TRY(place_methods(s, kv));
    s->kv_pool = kv_pool;
    s->kv = kv;
    s->pages = pages;
    memcpy(s->tokens, prompt, (size_t)n * sizeof(int32_t));
    s->n_past = 0;
    s->n_known = n;
    if (s->first_new < 0)
        s->first_new = 0;
    memset(&s->stats, 0, sizeof s->stats);
    TRY(reset_methods(s));
    if (s->sampler == s->own) { /* penalties see the prompt, as plain decoding's do */
        cairn_sampler_reset(s->own);
        for (int i = 0; i < n; i++)
            cairn_sampler_accept(s->own, prompt[i]);
    }

    /* prompt[0 .. n-2] through the target in chunks, the methods catching up
     * after each (so feature buffers stay small) */
    const int chunk_max = s->feature_dim
                              ? (spec->max_batch_tokens < BEGIN_CHUNK ? spec->max_batch_tokens
                                                                      : BEGIN_CHUNK)
                              : spec->max_batch_tokens;
    uint8_t *want = calloc((size_t)chunk_max, 1);
    if (!want)
        return CAIRN_ENOMEM;
    int rc = CAIRN_OK;
    while (rc == CAIRN_OK && s->n_past < n - 1) {
        int T = n - 1 - s->n_past;
        if (T > chunk_max)
            T = chunk_max;
        cairn_seq_batch sb = {
            .tokens = s->tokens + s->n_past, .n_tokens = T, .kv_start = s->n_past,
            .pages = pages, .want = want,
        };
        int n_out = 0;
        const int from = s->n_past;
        if (s->feature_dim)
            rc = cairn_model_forward_features(spec->target, kv_pool, kv, &sb, 1, NULL,
                                              s->begin_feat, &n_out);
        else
            rc = cairn_model_forward(spec->target, kv_pool, kv, &sb, 1, NULL, NULL, &n_out);
        if (rc == CAIRN_OK) {
            s->n_past += T;
            rc = advance_methods(s, from, s->begin_feat, T);
        }
    }
    free(want);
    TRY(rc);
    s->begun = true;
    return CAIRN_OK;
}

/* ---- the controller ------------------------------------------------------ */

static double ema(double old, double x, double w) { return old > 0 ? old + w * (x - old) : x; }

/* Whether this step drafts: not while paused, and every 64 speculative
 * steps one plain step re-measures what plain decoding costs at the
 * current context length. */
static bool control_wants_draft(cairn_spec_seq *s)
{
    spec_control *c = &s->ctl;
    if (s->dp.fixed_length)
        return true;
    if (c->pause_left > 0)
        return false;
    if (c->plain_cost <= 0 || c->since_plain >= 64)
        return false;
    /* a method that runs a model and is further behind than the tokens
     * left can repay proposes nothing: a step of none is a plain step,
     * better taken in the caller's batch */
    const cairn_spec *sp = s->spec;
    for (int i = 0; i < sp->n; i++) {
        if (!(s->propose_mask & (1u << i)))
            continue;
        const spec_drafter_ops *ops = sp->drafters[i].ops;
        if (!ops->may_sit_out || !ops->behind)
            return true;
        const spec_view v = seq_view(s, i);
        if (ops->behind(s->states[i], &v) <= v.max_lag)
            return true;
    }
    return false;
}

/* What verifying T rows costs, from the spec's price list: the measured
 * figure; between two measured sizes, the line through them; above the
 * largest, its slope carried on, but at least ROW_PRIOR of a plain step per
 * row (so that sizes never tried look cheap enough to be tried once, and
 * are then priced by what they cost). T = 1 is a plain step. */
#define ROW_PRIOR 0.03
static double verify_estimate(const cairn_spec *sp, double plain, int T)
{
    if (T <= 1)
        return plain;
    if (sp->verify_cost[T] > 0)
        return sp->verify_cost[T];
    int lo = T - 1;
    while (lo > 1 && sp->verify_cost[lo] <= 0)
        lo--;
    const double c_lo = lo == 1 ? plain : sp->verify_cost[lo];
    int hi = T + 1;
    while (hi <= SPEC_MAX_DRAFT + 1 && sp->verify_cost[hi] <= 0)
        hi++;
    if (hi <= SPEC_MAX_DRAFT + 1)
        return c_lo + (sp->verify_cost[hi] - c_lo) * (T - lo) / (hi - lo);
    double slope = ROW_PRIOR * plain;
    if (lo > 1 && (c_lo - plain) / (lo - 1) > slope)
        slope = (c_lo - plain) / (lo - 1);
    return c_lo + slope * (T - lo);
}

/* The number of guesses with the most tokens per second: a guess is kept
 * with probability a (each after the one before), so L guesses give
 * (1 - a^(L+1)) / (1 - a) tokens, for what verifying 1 + L rows costs on
 * this machine plus drafting L rows. Where rows are nearly free
 * (memory-bound decode, a few rows) drafts grow to what is accepted; where
 * each row costs (compute-bound kernels, many rows) they stay short. */
static int best_chain(const cairn_spec_seq *s, int chain_max)
{
    const spec_control *c = &s->ctl;
    const double a = (c->accepted + 1) / (c->accepted + c->rejected + 2);
    int best = 1;
    double best_rate = 0;
    for (int L = 1; L <= chain_max; L++) {
        const double tokens = a > 0.999 ? L + 1 : (1 - pow(a, L + 1)) / (1 - a);
        const double cost = verify_estimate(s->spec, c->plain_cost, 1 + L) + c->draft_row * L;
        const double rate = tokens / cost;
        if (rate > best_rate) {
            best_rate = rate;
            best = L;
        }
    }
    return best;
}

/* After a step: `drafted` rows were verified beside the root (0 = a plain
 * step), `tokens` emitted, in `cost` seconds of which `drafting` went to
 * proposing; `accepted_depth` draft tokens accepted of a tree `tree_depth`
 * deep. */
static void control_update(cairn_spec_seq *s, int drafted, int tokens, int accepted_depth,
                           int tree_depth, double cost, double drafting)
{
    spec_control *c = &s->ctl;
    if (s->dp.fixed_length)
        return;
    if (drafted == 0) {
        c->plain_cost = ema(c->plain_cost, cost, 0.3);
        s->spec->plain_cost = c->plain_cost;
        c->since_plain = 0;
        if (c->pause_left > 0)
            c->pause_left--;
        return;
    }
    c->since_plain++;
    /* what guesses are worth, what rows cost, then the next draft's size */
    c->accepted = 0.9 * c->accepted + accepted_depth;
    c->rejected = 0.9 * c->rejected + (accepted_depth < tree_depth ? 1 : 0);
    const double verify = cost - drafting > 0 ? cost - drafting : 0;
    double *price = &s->spec->verify_cost[1 + drafted];
    *price = ema(*price, verify, 0.3);
    c->draft_row = ema(c->draft_row, drafting / drafted, 0.3);
    if (c->plain_cost > 0) {
        c->chain = best_chain(s, s->dp.chain_max);
    } else if (accepted_depth >= c->chain) { /* no plain cost known yet: grow */
        c->chain = c->chain + 2 <= s->dp.chain_max ? c->chain + 2 : s->dp.chain_max;
    }
    /* the speed since speculation (re)started: sums over a window of at
     * most 32 steps, then EMAs of the same */
    if (c->n_spec < 32) {
        c->spec_cost += cost;
        c->spec_tokens += tokens;
    } else {
        c->spec_cost += (cost - c->spec_cost / 32);
        c->spec_tokens += (tokens - c->spec_tokens / 32);
    }
    c->n_spec++;
    /* judged from the second step on, so that a method far slower than
     * plain decoding (a tiny model's tree) costs little before it pauses */
    if (c->n_spec >= 2 && c->plain_cost > 0) {
        const double spec_rate = c->spec_tokens / c->spec_cost;
        const double plain_rate = 1.0 / c->plain_cost;
        if (c->model_window) { /* what a token saved, model drafters included */
            c->hope = 1.0 - plain_rate / spec_rate;
            c->fell_behind = true;
            cairn_spec *sp = s->spec;
            sp->model_gain = sp->model_gain_known
                                 ? sp->model_gain + 0.5 * (c->hope - sp->model_gain)
                                 : c->hope;
            sp->model_gain_known = true;
        }
        if (spec_rate < plain_rate) {
            c->pause_left = c->pause_len;
            c->pause_len = c->pause_len < 4096 ? c->pause_len * 2 : 4096;
            c->n_spec = 0;
            c->spec_cost = c->spec_tokens = 0;
            c->model_window = false;
            /* later sequences start from this verdict (the spec's memory) */
            s->spec->prior_pause = c->pause_len / 2;
        } else if (c->n_spec >= 4 && spec_rate > 1.05 * plain_rate) {
            c->pause_len = 16;
            s->spec->prior_pause = 0;
        }
    }
}

bool cairn_spec_seq_wants_step(cairn_spec_seq *s)
{
    if (!s)
        return false;
    s->ctl.decoding = true;
    if (control_wants_draft(s))
        return true;
    /* a plain step of the caller's counts towards the pause */
    if (s->ctl.pause_left > 0)
        s->ctl.pause_left--;
    if (s->ctl.since_plain >= 64)
        s->ctl.since_plain = 0; /* the caller's plain step re-measures it */
    return false;
}

void cairn_spec_seq_set_outlook(cairn_spec_seq *s, bool may_speculate, int tokens_left)
{
    if (!s)
        return;
    s->ctl.caller_keep_up = may_speculate;
    s->ctl.tokens_left = tokens_left > 0 ? tokens_left : 0;
}

void cairn_spec_seq_note_plain_cost(cairn_spec_seq *s, double seconds)
{
    if (s && seconds > 0 && !s->dp.fixed_length)
        s->ctl.plain_cost = ema(s->ctl.plain_cost, seconds, 0.3);
}

/* ---- acceptance ---------------------------------------------------------- */

void cairn_spec_seq_use_sampler(cairn_spec_seq *s, cairn_sampler *sampler)
{
    if (s)
        s->sampler = sampler ? sampler : s->own;
}

void cairn_spec_seq_set_hooks(cairn_spec_seq *s, const cairn_spec_hooks *hooks)
{
    if (s)
        s->hooks = hooks ? *hooks : (cairn_spec_hooks){0};
}

const cairn_token_logprob *cairn_spec_seq_logprobs(const cairn_spec_seq *s)
{
    return s ? s->lps : NULL;
}

/* Walks the verified tree as plain decoding would: at each node the
 * request's sampler draws the next token from the target's logits there
 * (after the caller's filter), and the walk goes on into the child with
 * that token, if the tree has one. So the tokens are exactly those plain
 * decoding draws, for greedy and seeded sampling alike, and a child x is
 * taken with probability p(x), as the accept-with-min(1, p/q) rule takes a
 * guess proposed with certainty. path[0..*n_path) are the accepted rows
 * (row 0, the root, first); *next is the token that follows them (-1 when
 * the filter allowed none), and *ended says the caller's accept hook ended
 * the sequence with it. */
static int accept_path(cairn_spec_seq *s, float *logits, int *path, int *n_path, int32_t *next,
                       bool *ended)
{
    const int nv = s->spec->thp.n_vocab, per = 1 + s->sp.n_logprobs;
    const bool want_lp = s->sp.n_logprobs > 0 || s->hooks.logprobs;
    const spec_tree *t = &s->tree;
    int row = 0;
    *n_path = 0;
    *ended = false;
    path[(*n_path)++] = 0;
    for (int k = 0;; k++) {
        float *lg = logits + (size_t)row * nv;
        *next = -1;
        if (s->hooks.filter && s->hooks.filter(s->hooks.ctx, lg, nv) != CAIRN_OK)
            return CAIRN_OK; /* nothing may follow */
        int32_t tok;
        cairn_token_logprob *lp = s->lps + (size_t)k * per;
        TRY(cairn_sampler_sample(s->sampler, lg, &tok, want_lp ? &lp[0] : NULL,
                                 want_lp ? &lp[1] : NULL));
        cairn_sampler_accept(s->sampler, tok);
        *next = tok;
        if (s->hooks.accept && s->hooks.accept(s->hooks.ctx, tok)) {
            *ended = true;
            return CAIRN_OK;
        }
        int child = -1;
        for (int r = row + 1; r < t->n; r++)
            if (t->parent[r] == row && t->token[r] == tok) {
                child = r;
                break;
            }
        if (child < 0)
            return CAIRN_OK;
        path[(*n_path)++] = child;
        row = child;
    }
}

int cairn_spec_seq_draft(cairn_spec_seq *s, int cap, cairn_seq_batch *sb)
{
    if (!s || !sb || !s->begun || cap < 1)
        return CAIRN_EINVAL;
    cairn_spec *spec = s->spec;
    const int room = s->capacity - s->n_past; /* KV indices left, root included */
    if (room < 1) {
        s->begun = false;
        return CAIRN_ERANGE;
    }
    s->begun = false; /* until the step completes */
    s->ctl.decoding = true;
    const double t0 = cairn_now();
    s->t_step = t0;
    s->catchup_spent = 0;

    /* every proposing method adds to one tree, within what fits the
     * capacity, the output buffer and the verifier */
    spec_tree *t = &s->tree;
    t->n = 1;
    t->token[0] = s->tokens[s->n_past];
    t->parent[0] = -1;
    t->depth[0] = 0;
    t->source[0] = 0;
    int budget = s->dp.n_draft < room - 1 ? s->dp.n_draft : room - 1;
    const int max_depth = cap - 1 < SPEC_MAX_DEPTH ? cap - 1 : SPEC_MAX_DEPTH;
    t->cap = 1 + (budget > 0 ? budget : 0);
    const bool drafting = budget > 0 && max_depth > 0 && control_wants_draft(s);
    /* the drafters that cost nothing first, whatever the order they were
     * named in; then those that run a model, unless the tree already holds
     * a chain as deep as the controller asks for */
    for (int pass = 0; drafting && pass < 2; pass++) {
        if (pass == 1) {
            int deepest = 0;
            for (int r = 1; r < t->n; r++)
                if (t->depth[r] > deepest)
                    deepest = t->depth[r];
            if (deepest >= s->ctl.chain && deepest > 0)
                break;
        }
        for (int i = 0; i < spec->n; i++) {
            if (!(s->propose_mask & (1u << i)) || t->n >= t->cap ||
                spec->drafters[i].ops->may_sit_out != (pass == 1))
                continue;
            const spec_view v = seq_view(s, i);
            TRY(spec->drafters[i].ops->propose(s->states[i], &v, t, t->cap - t->n, i));
        }
    }
    /* rows deeper than the output buffer allows are dropped (with their
     * subtrees: children come after parents) */
    int map[SPEC_MAX_DRAFT + 1], keep = 1;
    map[0] = 0;
    for (int r = 1; r < t->n; r++) {
        const int p = map[t->parent[r]];
        if (t->depth[r] > max_depth || p < 0) {
            map[r] = -1;
            continue;
        }
        map[r] = keep;
        t->token[keep] = t->token[r];
        t->parent[keep] = p;
        t->depth[keep] = t->depth[r];
        t->source[keep] = t->source[r];
        keep++;
    }
    t->n = keep;
    for (int r = 1; r < t->n; r++)
        for (int i = 0; i < spec->n; i++)
            if ((t->source[r] & (1u << i)) && spec->drafters[i].ops->may_sit_out)
                s->ctl.model_window = true;
    s->stats.t_draft += cairn_now() - t0;
    s->t_drafting = cairn_now() - t0 - s->catchup_spent;

    /* root and tree: the rows of one target forward */
    const int T = t->n, n_kv = s->n_past + T;
    for (int r = 0; r < T; r++) {
        s->tree_pos[r] = s->n_past + t->depth[r];
        uint8_t *m = s->tree_mask + (size_t)r * n_kv;
        memset(m, 1, (size_t)s->n_past);
        memset(m + s->n_past, 0, (size_t)T);
        for (int a = r; a >= 0; a = t->parent[a])
            m[s->n_past + a] = 1;
    }
    *sb = (cairn_seq_batch){
        .tokens = t->token, .n_tokens = T, .pos = s->tree_pos, .kv_start = s->n_past,
        .pages = s->pages, .mask = T > 1 ? s->tree_mask : NULL, .want = s->want,
    };
    s->drafted_cap = cap;
    return CAIRN_OK;
}

int cairn_spec_seq_verified(cairn_spec_seq *s, float *logits, const float *features,
                            int32_t *out, int *n_out)
{
    if (!s || !logits || !out || !n_out || s->drafted_cap < 1 || (s->feature_dim && !features))
        return CAIRN_EINVAL;
    cairn_spec *spec = s->spec;
    spec_tree *t = &s->tree;
    const int T = t->n;
    const double t1 = cairn_now();
    s->drafted_cap = 0;

    /* accept */
    int path[SPEC_MAX_DEPTH + 2], n_path;
    int32_t next;
    bool ended;
    TRY(accept_path(s, logits, path, &n_path, &next, &ended));

    /* keep: move the accepted rows' target KV to consecutive indices (rows
     * only move down, parents before children, so nothing is overwritten
     * early); methods keep their own KV themselves */
    const cairn_kv_layout *L = s->kv;
    uint8_t *pool = s->kv_pool;
    cairn_backend *be = cairn_model_backend(spec->target);
    for (int i = 1; i < n_path; i++) {
        const int src = s->n_past + path[i], dst = s->n_past + i;
        if (src == dst)
            continue;
        const size_t sp = (size_t)s->pages[src / L->page_size] * L->page_bytes;
        const size_t dpg = (size_t)s->pages[dst / L->page_size] * L->page_bytes;
        for (int l = 0; l < spec->thp.n_layer; l++)
            for (int kv = 0; kv < 2; kv++)
                TRY(cairn_backend_copy(be, pool + dpg + cairn_kv_offset(L, l, kv, dst % L->page_size),
                                       pool + sp + cairn_kv_offset(L, l, kv, src % L->page_size),
                                       L->row_bytes));
    }
    if (s->feature_dim)
        for (int i = 0; i < n_path; i++)
            memcpy(s->path_feat + (size_t)i * s->feature_dim,
                   features + (size_t)path[i] * s->feature_dim,
                   (size_t)s->feature_dim * sizeof(float));
    int n = 0;
    for (int i = 1; i < n_path; i++)
        out[n++] = t->token[path[i]];
    if (next >= 0)
        out[n++] = next;
    for (int i = 1; i < n_path; i++)
        s->tokens[s->n_past + i] = t->token[path[i]];
    s->n_past += n_path;
    *n_out = n;
    if (next < 0) {
        /* the caller's filter allowed no token: the sequence cannot go on
         * (begun stays false) */
        s->n_known = s->n_past;
        s->stats.t_verify += cairn_now() - t1;
        return CAIRN_OK;
    }
    s->tokens[s->n_past] = next;
    s->n_known = s->n_past + 1;
    const double t2 = cairn_now();
    s->stats.t_verify += t2 - t1;

    /* the methods learn what was kept */
    for (int i = 0; i < spec->n; i++) {
        const spec_drafter_ops *ops = spec->drafters[i].ops;
        if (!ops->accepted)
            continue;
        const spec_view v = seq_view(s, i);
        TRY(ops->accepted(s->states[i], &v, t, path, n_path,
                          ops->needs_features ? s->path_feat : NULL));
    }
    s->stats.t_head_update += cairn_now() - t2;

    s->stats.steps++;
    s->stats.tokens += n;
    s->stats.drafted += T - 1;
    s->stats.accepted += n_path - 1;
    for (int i = 1; i < n_path; i++)
        for (int d = 0; d < spec->n && d < 8; d++)
            if (t->source[path[i]] & (1u << d))
                s->stats.accepted_by[d]++;
    if (T > 1)
        s->stats.spec_steps++;
    else
        s->stats.paused_steps++;
    int tree_depth = 0;
    for (int r = 1; r < T; r++)
        if (t->depth[r] > tree_depth)
            tree_depth = t->depth[r];
    control_update(s, T - 1, n, n_path - 1, tree_depth,
                   cairn_now() - s->t_step - s->catchup_spent, s->t_drafting);
    s->begun = true;
    return CAIRN_OK;
}

int cairn_spec_seq_step(cairn_spec_seq *s, int32_t *out, int cap, int *n_out)
{
    if (!s || !out || !n_out)
        return CAIRN_EINVAL;
    cairn_seq_batch sb;
    TRY(cairn_spec_seq_draft(s, cap, &sb));
    /* the verification's own buffers, made on the first step (a server
     * verifies in its own batch and never needs them) */
    const size_t rows = 1 + (size_t)s->dp.n_draft, nv = (size_t)s->spec->thp.n_vocab;
    if (!s->tree_logits && !(s->tree_logits = malloc(rows * nv * sizeof(float))))
        return CAIRN_ENOMEM;
    if (s->feature_dim && !s->tree_feat &&
        !(s->tree_feat = malloc(rows * (size_t)s->feature_dim * sizeof(float))))
        return CAIRN_ENOMEM;
    /* The methods read features in cairn_model_forward_features' layout
     * ([T][feature_dim]: EAGLE's final normed state, or EAGLE-3's states
     * entering its three layers), what a server's batch passes to
     * cairn_spec_seq_verified. cairn_model_forward's `hidden` is always the
     * final normed state, [n_out][dim]: for an EAGLE-3 head it would be the
     * wrong state and fill only a third of each row, the rest left as
     * whatever malloc returned. */
    int n_o = 0;
    if (s->feature_dim)
        TRY(cairn_model_forward_features(s->spec->target, s->kv_pool, s->kv, &sb, 1,
                                         s->tree_logits, s->tree_feat, &n_o));
    else
        TRY(cairn_model_forward(s->spec->target, s->kv_pool, s->kv, &sb, 1, s->tree_logits,
                                NULL, &n_o));
    if (n_o != sb.n_tokens)
        return CAIRN_EBACKEND;
    return cairn_spec_seq_verified(s, s->tree_logits, s->tree_feat, out, n_out);
}

/* ---- adopted sequences (server) ------------------------------------------ */

int cairn_spec_seq_adopt(cairn_spec_seq *s, void *kv_pool, const cairn_kv_layout *kv,
                         const int32_t *pages, int capacity, const int32_t *tokens, int n_tokens,
                         int n_past)
{
    if (!s || !kv_pool || !kv || !pages || !tokens || n_past < 0 || n_tokens <= n_past ||
        capacity < n_past || kv->page_size <= 0)
        return CAIRN_EINVAL;
    if (cairn_spec_whole_pages(s->spec) && n_past % kv->page_size != 0)
        return CAIRN_EINVAL;
    if (check_layout(s, kv) != CAIRN_OK)
        return CAIRN_EINVAL;
    for (int i = 0; i < n_tokens; i++)
        if (tokens[i] < 0 || tokens[i] >= s->spec->thp.n_vocab)
            return CAIRN_EINVAL;
    s->begun = false;
    s->shared = true;
    s->kv_pool = kv_pool;
    s->kv = kv;
    TRY(seq_resize(s, capacity, n_tokens));
    TRY(place_methods(s, kv));
    s->pages = pages;
    memcpy(s->tokens, tokens, (size_t)n_tokens * sizeof *tokens);
    s->n_known = n_tokens;
    s->n_past = n_past;
    if (s->first_new < 0)
        s->first_new = n_past;
    TRY(reset_methods(s));
    s->begun = s->n_known > s->n_past && s->n_past > 0 && !cairn_spec_needs_features(s->spec);
    return CAIRN_OK;
}

int cairn_spec_seq_set_pages(cairn_spec_seq *s, const int32_t *pages, int capacity)
{
    if (!s || !pages || !s->shared || capacity < s->n_past)
        return CAIRN_EINVAL;
    TRY(seq_resize(s, capacity, s->n_known));
    s->pages = pages;
    return CAIRN_OK;
}

int cairn_spec_seq_advance(cairn_spec_seq *s, const int32_t *tokens, int n_tokens,
                           const float *features, int n)
{
    if (!s || !s->shared || !tokens || n < 0 || n_tokens < s->n_past + n ||
        (n > 0 && s->feature_dim && !features))
        return CAIRN_EINVAL;
    s->begun = false;
    if (n_tokens > s->n_known) {
        TRY(seq_resize(s, s->capacity, n_tokens));
        for (int i = s->n_known; i < n_tokens; i++)
            if (tokens[i] < 0 || tokens[i] >= s->spec->thp.n_vocab)
                return CAIRN_EINVAL;
        memcpy(s->tokens + s->n_known, tokens + s->n_known,
               (size_t)(n_tokens - s->n_known) * sizeof *tokens);
    }
    s->n_known = n_tokens;
    const int from = s->n_past;
    s->n_past += n;
    TRY(advance_methods(s, from, features, n));
    s->begun = s->n_known > s->n_past && s->n_past > 0;
    return CAIRN_OK;
}
