/*
 * model/spec_medusa.c — Medusa heads as a drafter of model/spec.c. The
 * heads read the target's feature of the last token with KV (row n_past-1,
 * whose logits chose the pending token) and guess the tokens after the
 * pending one; cairn_medusa_draft turns their guesses into the best paths
 * under the row budget. No KV of their own: the whole state is that one
 * feature, kept from the last forward the sequence saw.
 */
#include "model/layer_impl.h"
#include "model/spec_impl.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    cairn_medusa *m;
    int depth, top_k, dim, n_vocab;
    cairn_sampling_params sp; /* its logit bias applies to the guesses */
    float *feat;              /* [dim] the feature of token feat_index     */
    int feat_index;           /* -1: none yet                              */
    float *logits;            /* [heads][n_vocab]                          */
    int32_t tokens[CAIRN_MEDUSA_MAX_ROWS], parents[CAIRN_MEDUSA_MAX_ROWS];
    int32_t rows[CAIRN_MEDUSA_MAX_ROWS]; /* tree row of each drafted row   */
} medusa_state;

static int medusa_seq_create(void *method, const cairn_spec_params *p,
                             const cairn_sampling_params *sp, void **state)
{
    cairn_medusa *m = method;
    if (p->top_k > CAIRN_MEDUSA_MAX_TOP_K)
        return CAIRN_EINVAL;
    medusa_state *q = calloc(1, sizeof *q);
    if (!q)
        return CAIRN_ENOMEM;
    const cairn_hparams *hp = cairn_model_hparams(cairn_medusa_target(m));
    q->m = m;
    q->depth = p->depth;
    q->top_k = p->top_k;
    q->dim = hp->dim;
    q->n_vocab = hp->n_vocab;
    q->sp = sp ? *sp : cairn_sampling_defaults();
    q->feat_index = -1;
    q->feat = malloc((size_t)q->dim * sizeof(float));
    q->logits = malloc((size_t)cairn_medusa_head_count(m) * q->n_vocab * sizeof(float));
    *state = q;
    if (!q->feat || !q->logits)
        return CAIRN_ENOMEM; /* the caller frees the state */
    return CAIRN_OK;
}

static void medusa_seq_free(void *state)
{
    medusa_state *q = state;
    if (!q)
        return;
    free(q->feat);
    free(q->logits);
    free(q);
}

static int medusa_reset(void *state, const spec_view *v)
{
    (void)v;
    ((medusa_state *)state)->feat_index = -1; /* adopted pages carry no feature */
    return CAIRN_OK;
}

static int medusa_advance(void *state, const spec_view *v, int from, const float *features,
                          int n)
{
    (void)v;
    medusa_state *q = state;
    if (n > 0 && features) {
        memcpy(q->feat, features + (size_t)(n - 1) * q->dim, (size_t)q->dim * sizeof(float));
        q->feat_index = from + n - 1;
    }
    return CAIRN_OK;
}

static int medusa_accepted(void *state, const spec_view *v, const spec_tree *t, const int *path,
                           int n_path, const float *features)
{
    (void)t, (void)path;
    medusa_state *q = state;
    if (n_path > 0 && features) {
        memcpy(q->feat, features + (size_t)(n_path - 1) * q->dim, (size_t)q->dim * sizeof(float));
        q->feat_index = v->n_past - 1;
    }
    return CAIRN_OK;
}

static int medusa_propose(void *state, const spec_view *v, spec_tree *t, int budget, int source)
{
    medusa_state *q = state;
    if (q->feat_index != v->n_past - 1 || v->n_past < 1 || budget <= 0)
        return CAIRN_OK; /* no feature for the pending token's predecessor */
    if (budget > CAIRN_MEDUSA_MAX_ROWS)
        budget = CAIRN_MEDUSA_MAX_ROWS;
    TRY(cairn_medusa_logits(q->m, q->feat, q->logits));
    int n = 0;
    TRY(cairn_medusa_draft(q->m, q->logits, &q->sp, q->depth, q->top_k, budget, q->tokens,
                                  q->parents, &n));
    for (int r = 0; r < n; r++) {
        const int parent = q->parents[r] < 0 ? 0 : q->rows[q->parents[r]];
        /* a parent the tree had no room for drops its subtree */
        q->rows[r] = parent < 0 ? -1 : spec_tree_add(t, parent, q->tokens[r], source);
    }
    return CAIRN_OK;
}

const spec_drafter_ops spec_medusa_ops = {
    .name = "medusa",
    .needs_features = true,
    .seq_create = medusa_seq_create,
    .seq_free = medusa_seq_free,
    .reset = medusa_reset,
    .advance = medusa_advance,
    .propose = medusa_propose,
    .accepted = medusa_accepted,
};

int cairn_spec_add_medusa(cairn_spec *s, cairn_medusa *heads)
{
    /* not beside an EAGLE-3 head (here or in another spec of the target):
     * the target's features are then its layers' states */
    if (!s || !heads || cairn_medusa_target(heads) != spec_target(s) ||
        cairn_model_feature_dim(spec_target(s)) != cairn_model_hparams(spec_target(s))->dim)
        return CAIRN_EINVAL;
    return spec_add_drafter(s, &spec_medusa_ops, heads);
}
