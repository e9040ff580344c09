/*
 * model/spec_impl.h — internal to model/: the table every draft method
 * fills in, and the draft tree they fill. Nothing outside model/ includes
 * this; the public contract is model.h's "Speculative decoding".
 *
 * One speculative step of a sequence (model/spec.c):
 *
 *      tokens [0 .. n_past)   target KV computed      tokens[n_past]: pending
 *                       │
 *     ┌─────────────────┴─────────────────────────────────────────────┐
 *     │ propose   every drafter adds rows under the root of one tree  │
 *     │           (a row = a token and its parent row; rows proposed  │
 *     │           twice are merged, so methods combine into one tree) │
 *     │ verify    root + tree in one target forward, tree mask        │
 *     │ accept    walk from the root: greedy = follow the argmax;     │
 *     │           sampled = accept child x with probability p(x),     │
 *     │           else continue with p without x (lossless)           │
 *     │ keep      accepted rows' target KV moved to consecutive       │
 *     │           indices; every drafter told the accepted path       │
 *     └───────────────────────────────────────────────────────────────┘
 *
 * A drafter is a table of functions with optional slots (NULL = nothing to
 * do), like a backend: the method object (weights, shared by sequences) is
 * `method`; each sequence gets its own `state`. Rows of the tree are the
 * verifier's; a drafter may keep KV of its own in the pages (EAGLE's head
 * layer, a draft model's layers) but never writes the target's layers.
 */
#ifndef CAIRN_ENGINE_SPEC_IMPL_H
#define CAIRN_ENGINE_SPEC_IMPL_H

#include "model/model.h"

#define SPEC_MAX_DEPTH 16 /* levels of a draft tree                      */
#define SPEC_MAX_DRAFT 255 /* draft rows verified per step               */

/* The tree one step verifies. Row 0 is the root (the pending token); every
 * other row's parent is an earlier row, so parents come before children. */
typedef struct {
    int n;            /* rows, the root included                          */
    int cap;          /* rows the verifier takes this step                */
    int32_t *token;   /* [cap]                                            */
    int32_t *parent;  /* [cap] parent row; -1 for the root                */
    int32_t *depth;   /* [cap] 0 for the root                             */
    uint32_t *source; /* [cap] bit d set: drafter d proposed the row      */
} spec_tree;

/* Add `token` under row `parent` for drafter `source`: the existing row
 * when that child is there already, else a new one. -1 when the tree is
 * full or too deep (the drafter stops extending that branch). */
int spec_tree_add(spec_tree *t, int parent, int32_t token, int source);

/* What a drafter sees of its sequence (read-only; owned by the decoder). */
typedef struct {
    const int32_t *tokens;     /* [n_known] the sequence as known           */
    int n_past;                /* tokens with target KV                     */
    int n_known;               /* > n_past when tokens[n_past] is pending   */
    void *kv_pool;
    const cairn_kv_layout *kv; /* the spec's page layout (target first)     */
    const int32_t *pages;      /* covering KV indices 0 .. capacity-1       */
    int capacity;
    bool shared;               /* adopted: pages shared by a prefix cache   */
    int feature_dim;           /* floats per feature row (0: none kept)     */
    const cairn_kv_layout *own_kv; /* this drafter's placed KV part, or NULL */
    int chain_len;             /* most rows a chain drafter should propose
                                  this step (the controller's)             */
    uint64_t tenant;           /* whose request (cairn_spec_seq_set_tenant):
                                  a drafter that learns across requests
                                  keeps tenants apart                      */
    /* For drafters that run a model of their own (may_sit_out), whose rows
     * must cover every earlier token before they can propose: */
    bool keep_up;              /* advance: keep those rows up with the
                                  target now (the controller expects to
                                  speculate soon); else leave them behind  */
    int max_lag;               /* most rows it may compute to catch up
                                  before it proposes (or keeps up); further
                                  behind, it sits the step out: the tokens
                                  left would not repay the catching up     */
    double *catchup_row;       /* seconds per row of its catch-up forwards
                                  (the spec's EMA, shared by its sequences;
                                  the drafter measures, the controller
                                  prices max_lag with it)                  */
    double *catchup_spent;     /* += seconds spent catching up: a cost the
                                  gate above already weighed, kept out of
                                  what the controller learns of a step     */
} spec_view;

typedef struct {
    const char *name;      /* "ngram", "eagle", "draft", "medusa", ...      */
    /* Whether advance/accepted need the target's features (the final hidden
     * state after the output norm, cairn_model_forward_features). */
    bool needs_features;
    /* Whether proposing costs forward passes of a model of its own and the
     * drafter catches up by itself after a step it sat out (the draft
     * model): the decoder asks it only when the drafters that cost nothing
     * have not already proposed a chain as deep as the controller wants,
     * so with suffix+draft a copied passage is not paid for twice. */
    bool may_sit_out;
    /* Rows it would compute to catch up before it can propose (a method
     * with may_sit_out; optional: NULL = none). */
    int (*behind)(void *state, const spec_view *v);
    int (*seq_create)(void *method, const cairn_spec_params *p, const cairn_sampling_params *sp,
                      void **state);
    void (*seq_free)(void *state);
    /* The sequence (re)starts: tokens[0 .. n_past) have target KV. For an
     * adopted sequence, the drafter's own KV rows below n_past are in the
     * pages as far as whoever computed them went (a draft model reads the
     * pages' stamps, spec_draft.c). Optional. */
    int (*reset)(void *state, const spec_view *v);
    /* The target computed rows from .. from+n-1 outside a step (begin's
     * prompt, a server's batched forwards); features[n][feature_dim] when
     * needs_features. v->n_past is already from + n. Optional. */
    int (*advance)(void *state, const spec_view *v, int from, const float *features, int n);
    /* Add at most `budget` rows to t (row 0 = v->tokens[v->n_past]). A
     * drafter with nothing to say adds none. Required. */
    int (*propose)(void *state, const spec_view *v, spec_tree *t, int budget, int source);
    /* After verification: rows path[0 .. n_path) of t were accepted (path[0]
     * = the root), their target KV now at old n_past + i; features[n_path]
     * [feature_dim] are theirs (when needs_features); v is the sequence
     * after the step (n_past grown by n_path, the bonus token pending).
     * Optional. */
    int (*accepted)(void *state, const spec_view *v, const spec_tree *t, const int *path,
                    int n_path, const float *features);
    /* KV of its own in every page, beside the target's: *part = its
     * geometry (layer_base 0; the spec places it after the target's and
     * earlier parts and hands the placed layout back in spec_view.own_kv).
     * Optional: NULL = none (n-gram lookup, Medusa). */
    int (*kv_part)(void *method, int page_size, cairn_type dtype, cairn_kv_layout *part);
    /* Whether its KV row at index i depends on token i+1 (EAGLE's head row
     * reads the next token): then a page's rows are final only once the
     * next page's first token is known, prefix matches stay whole pages and
     * an adopted sequence starts at a page boundary. */
    bool rows_read_next_token;
    /* XXH3-128 of its weights for the page namespace (optional: methods
     * without KV of their own leave pages unchanged). */
    void (*fingerprint)(void *method, uint8_t out[16]);
    /* The caller is about to hand the partial page at v->n_past to others:
     * record in it which of its own rows are final (a method that catches
     * up lazily). Optional. */
    int (*sync)(void *state, const spec_view *v);
    /* The sequence ends (cairn_spec_seq_free): tokens[first_new ..
     * n_known) are what it brought that the cache had not seen (its
     * uncached prompt and its output). Optional. */
    int (*retire)(void *state, const spec_view *v, int first_new);
    /* Frees a method object the spec owns (the suffix corpus); NULL for
     * borrowed ones (models and heads the caller loaded). */
    void (*method_free)(void *method);
} spec_drafter_ops;

/* One method of a cairn_spec: its table and object. */
typedef struct {
    const spec_drafter_ops *ops;
    void *method;
    double catchup_row; /* spec_view.catchup_row of its sequences */
} spec_drafter;

/* The best k tokens of logits[n] (descending; ties to the lower id) and
 * their log-probabilities (k <= n): the candidates of a tree drafter. */
void spec_top_k_logprobs(const float *logits, int n, int k, int32_t *ids, float *lp);

/* A head row at a page's last index: never attended by other rows of an
 * adopted (page-sharing) sequence, for heads whose rows read the next token
 * (model/model.h). */
static inline bool spec_page_last(const spec_view *v, int index)
{
    const int ps = v->kv->page_size;
    return index % ps == ps - 1;
}

/* Add a drafter to a spec (what the cairn_spec_add_* functions do). */
int spec_add_drafter(cairn_spec *s, const spec_drafter_ops *ops, void *method);
cairn_model *spec_target(const cairn_spec *s);

/* The suffix corpus (model/spec_suffix.c): a ring of `cap` tokens of
 * earlier requests, by tenant, with its match index (0 = own context only). */
typedef struct spec_suffix spec_suffix;
int spec_suffix_create(int64_t cap, spec_suffix **out);
void spec_suffix_free(spec_suffix *c);
int spec_suffix_add(spec_suffix *c, uint64_t tenant, const int32_t *tokens, int n);
int64_t spec_suffix_tokens(const spec_suffix *c);

/* The drafters model/ has. */
extern const spec_drafter_ops spec_suffix_ops; /* model/spec_suffix.c */
extern const spec_drafter_ops spec_eagle_ops;  /* model/eagle.c       */
extern const spec_drafter_ops spec_dmodel_ops; /* model/spec_draft.c  */
extern const spec_drafter_ops spec_medusa_ops; /* model/spec_medusa.c */
extern const spec_drafter_ops spec_eagle3_ops; /* model/spec_eagle3.c */

#endif /* CAIRN_ENGINE_SPEC_IMPL_H */
