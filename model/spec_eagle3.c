/*
 * model/spec_eagle3.c — EAGLE-3 heads as a drafter of model/spec.c: an
 * EAGLE-2 dynamic draft tree (model/eagle.c's, over the head's reduced
 * vocabulary) from a head that reads the target's low/mid/high states.
 *
 *   head KV    index j = head row for (states of token j, token j+1) at
 *              RoPE position j, one layer of its own in the pages; rows
 *              0 .. head_done-1 are final. Draft rows of a step are scratch
 *              at indices >= n_past.
 *   features   the spec's rows are the target's states entering the head's
 *              three layers ([3*dim]; cairn_spec_add_eagle3 sets the target
 *              up so); draft rows read their parent's pre-norm output.
 */
#include "model/layer_impl.h"
#include "model/spec_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ROWS CAIRN_EAGLE3_MAX_ROWS
#define MAX_TOP_K 16

typedef struct {
    int32_t token;    /* a target id                                        */
    int16_t parent;   /* candidate index, -1 = the root                     */
    uint8_t depth;    /* 1 = child of the root                              */
    float score;      /* cumulative log-probability under the head          */
    int16_t head_row; /* draft head row when expanded, else -1              */
    int16_t row;      /* its row in the verified tree, -1 = not in it       */
} cand;

typedef struct {
    cairn_eagle3 *e;
    int dim, fdim, nvd, depth, top_k;
    /* the request's logit bias in draft ids (tokens outside the draft
     * vocabulary cannot be drafted) */
    int n_bias;
    int32_t bias_id[CAIRN_MAX_LOGIT_BIAS];
    float bias[CAIRN_MAX_LOGIT_BIAS];

    int head_done, feat_end; /* as in eagle.c */
    float *feat;             /* host [16 + 2 + ROWS][fdim]                  */
    bool root_ready;

    cand *cands;
    int n_cands;
    float *head_hidden; /* [(depth-1) * top_k + 1][dim], row 0 = the root's */
    float *head_logits; /* [top_k][nvd]                                     */
    float *draft_feat;  /* [top_k][dim]                                     */
    int32_t *order;
    uint8_t *head_mask, *catch_mask;
    int mask_cap;
} e3_state;

static int e3_seq_create(void *method, const cairn_spec_params *p, const cairn_sampling_params *sp,
                         void **state)
{
    cairn_eagle3 *e = method;
    if (p->top_k > MAX_TOP_K)
        return CAIRN_EINVAL;
    e3_state *q = calloc(1, sizeof *q);
    if (!q)
        return CAIRN_ENOMEM;
    const cairn_hparams *hp = cairn_model_hparams(cairn_eagle3_target(e));
    q->e = e;
    q->dim = hp->dim;
    q->fdim = 3 * hp->dim;
    q->nvd = cairn_eagle3_draft_vocab(e);
    q->depth = p->depth;
    q->top_k = p->top_k < q->nvd ? p->top_k : q->nvd;
    for (int i = 0; sp && i < sp->n_logit_bias; i++)
        for (int d = 0; d < q->nvd; d++)
            if (cairn_eagle3_target_token(e, d) == sp->logit_bias[i].token) {
                q->bias_id[q->n_bias] = d;
                q->bias[q->n_bias++] = sp->logit_bias[i].bias;
                break;
            }
    const size_t k = (size_t)q->top_k, dim = (size_t)q->dim;
    const size_t max_cands = k + (size_t)(p->depth - 1) * k * k;
    q->cands = malloc(max_cands * sizeof *q->cands);
    q->order = malloc(max_cands * sizeof *q->order);
    q->head_hidden = malloc(((size_t)(p->depth - 1) * k + 1) * dim * sizeof(float));
    q->head_logits = malloc(k * (size_t)q->nvd * sizeof(float));
    q->draft_feat = malloc(k * dim * sizeof(float));
    q->feat = malloc((size_t)(SPEC_MAX_DEPTH + 2 + ROWS) * q->fdim * sizeof(float));
    *state = q;
    if (!q->cands || !q->order || !q->head_hidden || !q->head_logits || !q->draft_feat || !q->feat)
        return CAIRN_ENOMEM; /* the caller frees the state */
    return CAIRN_OK;
}

static void e3_seq_free(void *state)
{
    e3_state *q = state;
    if (!q)
        return;
    free(q->cands);
    free(q->order);
    free(q->head_hidden);
    free(q->head_logits);
    free(q->draft_feat);
    free(q->feat);
    free(q->head_mask);
    free(q->catch_mask);
    free(q);
}

static int masks_fit(e3_state *q, const spec_view *v)
{
    if (v->capacity <= q->mask_cap && q->head_mask && q->catch_mask)
        return CAIRN_OK;
    free(q->head_mask);
    free(q->catch_mask);
    const size_t cap1 = v->capacity > 0 ? (size_t)v->capacity : 1;
    q->head_mask = malloc((size_t)q->top_k * cap1);
    q->catch_mask = malloc((size_t)ROWS * cap1);
    q->mask_cap = q->head_mask && q->catch_mask ? v->capacity : 0;
    return q->mask_cap == v->capacity ? CAIRN_OK : CAIRN_ENOMEM;
}

/* A head row at a page's last index: never attended by other rows of an
 * adopted (page-sharing) sequence, as for EAGLE (model/model.h). */
static bool page_last(const spec_view *v, int index)
{
    const int ps = v->kv->page_size;
    return index % ps == ps - 1;
}

/* The head over its pending rows head_done .. upto-1, in chunks; the last
 * row's output (the root's when upto = n_past) lands in head_hidden[0]. */
static int catch_up_to(e3_state *q, const spec_view *v, int upto)
{
    int32_t pos[ROWS];
    if (upto > q->feat_end)
        upto = q->feat_end;
    if (q->head_done < upto)
        TRY(masks_fit(q, v));
    float *out = malloc((size_t)ROWS * q->dim * sizeof(float));
    if (!out)
        return CAIRN_ENOMEM;
    int rc = CAIRN_OK;
    while (rc == CAIRN_OK && q->head_done < upto) {
        int R = upto - q->head_done;
        if (R > ROWS)
            R = ROWS;
        for (int r = 0; r < R; r++)
            pos[r] = q->head_done + r;
        const int n_kv = q->head_done + R;
        uint8_t *mask = NULL;
        if (v->shared) {
            mask = q->catch_mask;
            for (int r = 0; r < R; r++) {
                uint8_t *m = mask + (size_t)r * n_kv;
                for (int k = 0; k < n_kv; k++)
                    m[k] = k <= q->head_done + r && (!page_last(v, k) || k == q->head_done + r);
            }
        }
        const cairn_eagle3_rows rows = {
            .n_rows = R, .tokens = v->tokens + q->head_done + 1, .features = q->feat,
            .fused = true, .pos = pos, .kv_index = pos, .n_kv = n_kv, .mask = mask,
            .kv_pool = v->kv_pool, .kv = v->own_kv, .pages = v->pages, .kv_layer = 0,
        };
        rc = cairn_eagle3_forward(q->e, &rows, out, NULL, 0);
        if (rc != CAIRN_OK)
            break;
        if (q->head_done + R == upto) {
            memcpy(q->head_hidden, out + (size_t)(R - 1) * q->dim, (size_t)q->dim * sizeof(float));
            q->root_ready = false; /* projected at the step, when it drafts */
        }
        q->head_done += R;
        const int left = q->feat_end - q->head_done;
        memmove(q->feat, q->feat + (size_t)R * q->fdim, (size_t)left * q->fdim * sizeof(float));
    }
    free(out);
    return rc;
}

static int e3_reset(void *state, const spec_view *v)
{
    e3_state *q = state;
    q->head_done = q->feat_end = v->n_past;
    q->root_ready = false;
    return CAIRN_OK;
}

static int take_features(e3_state *q, const spec_view *v, int from, const float *features, int n)
{
    if (from != q->feat_end)
        return CAIRN_EINVAL;
    for (int done = 0; done < n;) {
        int m = n - done;
        if (m > ROWS)
            m = ROWS;
        memcpy(q->feat + (size_t)(q->feat_end - q->head_done) * q->fdim,
               features + (size_t)done * q->fdim, (size_t)m * q->fdim * sizeof(float));
        q->feat_end += m;
        done += m;
        const int upto = v->n_known - 1 < q->feat_end ? v->n_known - 1 : q->feat_end;
        TRY(catch_up_to(q, v, upto));
    }
    return CAIRN_OK;
}

static int e3_advance(void *state, const spec_view *v, int from, const float *features, int n)
{
    e3_state *q = state;
    q->root_ready = false;
    return take_features(q, v, from, features, n);
}

/* The best k of logits[n] (descending; ties to the lower id), log-probs. */
static void top_k_logprobs(const float *logits, int n, int k, int32_t *ids, float *lp)
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

static int cmp_score(int32_t i, int32_t j, const cand *c)
{
    if (c[i].score != c[j].score)
        return c[i].score > c[j].score ? -1 : 1;
    return (i > j) - (i < j);
}

static void sort_by_score(int32_t *idx, int n, const cand *c)
{
    for (int i = 1; i < n; i++) {
        int32_t v = idx[i];
        int j = i;
        while (j > 0 && cmp_score(v, idx[j - 1], c) < 0) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = v;
    }
}

/* logits: a head row over the draft vocabulary (scratch, biased here). */
static void add_children(e3_state *q, int parent, float *logits)
{
    int32_t ids[MAX_TOP_K];
    float lp[MAX_TOP_K];
    for (int i = 0; i < q->n_bias; i++)
        logits[q->bias_id[i]] += q->bias[i];
    top_k_logprobs(logits, q->nvd, q->top_k, ids, lp);
    const float base = parent < 0 ? 0.0f : q->cands[parent].score;
    const int depth = parent < 0 ? 1 : q->cands[parent].depth + 1;
    for (int i = 0; i < q->top_k; i++)
        q->cands[q->n_cands++] = (cand){
            .token = cairn_eagle3_target_token(q->e, ids[i]), .parent = (int16_t)parent,
            .depth = (uint8_t)depth, .score = base + lp[i], .head_row = -1, .row = -1,
        };
}

static int draft_tree(e3_state *q, const spec_view *v, int depth)
{
    const int k = q->top_k, dim = q->dim, base = v->n_past;
    q->n_cands = 0;
    add_children(q, -1, q->head_logits);
    int level_start = 0, level_end = q->n_cands, n_rows = 0;
    int32_t frontier[MAX_TOP_K], tokens[MAX_TOP_K], pos[MAX_TOP_K], kv_index[MAX_TOP_K];
    for (int d = 2; d <= depth; d++) {
        const int n_level = level_end - level_start;
        for (int i = 0; i < n_level; i++)
            q->order[i] = level_start + i;
        sort_by_score(q->order, n_level, q->cands);
        const int R = n_level < k ? n_level : k;
        const int n_kv = base + n_rows + R;
        if (n_kv > v->capacity)
            break;
        for (int r = 0; r < R; r++) {
            const int c = q->order[r];
            frontier[r] = c;
            tokens[r] = q->cands[c].token;
            pos[r] = base + q->cands[c].depth - 1;
            kv_index[r] = base + n_rows + r;
            q->cands[c].head_row = (int16_t)(n_rows + r);
            const int p = q->cands[c].parent;
            const float *pf = p < 0 ? q->head_hidden
                                    : q->head_hidden + (size_t)(1 + q->cands[p].head_row) * dim;
            memcpy(q->draft_feat + (size_t)r * dim, pf, (size_t)dim * sizeof(float));
            uint8_t *m = q->head_mask + (size_t)r * n_kv;
            memset(m, 1, (size_t)base);
            if (v->shared)
                for (int i = v->kv->page_size - 1; i < base; i += v->kv->page_size)
                    m[i] = 0;
            memset(m + base, 0, (size_t)(n_rows + R));
            m[base + n_rows + r] = 1;
            for (int a = p; a >= 0; a = q->cands[a].parent)
                m[base + q->cands[a].head_row] = 1;
        }
        const cairn_eagle3_rows rows = {
            .n_rows = R, .tokens = tokens, .features = q->draft_feat, .fused = false,
            .pos = pos, .kv_index = kv_index, .n_kv = n_kv, .mask = q->head_mask,
            .kv_pool = v->kv_pool, .kv = v->own_kv, .pages = v->pages, .kv_layer = 0,
        };
        TRY(cairn_eagle3_forward(q->e, &rows, q->head_hidden + (size_t)(1 + n_rows) * dim,
                                 q->head_logits, R));
        n_rows += R;
        level_start = q->n_cands;
        for (int r = 0; r < R; r++)
            add_children(q, frontier[r], q->head_logits + (size_t)r * q->nvd);
        level_end = q->n_cands;
    }
    return CAIRN_OK;
}

static void select_tree(e3_state *q, spec_tree *t, int n, int source)
{
    for (int i = 0; i < q->n_cands; i++)
        q->order[i] = i;
    sort_by_score(q->order, q->n_cands, q->cands);
    if (n > q->n_cands)
        n = q->n_cands;
    int32_t *chosen = q->order;
    for (int i = 1; i < n; i++) { /* by depth, then index: parents first */
        int32_t v = chosen[i];
        int j = i;
        while (j > 0 && (q->cands[chosen[j - 1]].depth > q->cands[v].depth ||
                         (q->cands[chosen[j - 1]].depth == q->cands[v].depth && chosen[j - 1] > v))) {
            chosen[j] = chosen[j - 1];
            j--;
        }
        chosen[j] = v;
    }
    for (int i = 0; i < n; i++) {
        cand *c = &q->cands[chosen[i]];
        const int parent_row = c->parent < 0 ? 0 : q->cands[c->parent].row;
        c->row = parent_row < 0 ? -1 : (int16_t)spec_tree_add(t, parent_row, c->token, source);
    }
}

static int e3_propose(void *state, const spec_view *v, spec_tree *t, int budget, int source)
{
    e3_state *q = state;
    if (v->n_past == 0 || budget <= 0)
        return CAIRN_OK;
    TRY(catch_up_to(q, v, v->n_past));
    if (q->head_done != v->n_past)
        return CAIRN_OK;
    TRY(masks_fit(q, v));
    if (!q->root_ready)
        TRY(cairn_eagle3_project(q->e, q->head_hidden, 1, q->head_logits));
    q->root_ready = true;
    const int depth = q->depth < budget ? q->depth : budget;
    TRY(draft_tree(q, v, depth));
    select_tree(q, t, budget, source);
    q->root_ready = false;
    return CAIRN_OK;
}

static int e3_accepted(void *state, const spec_view *v, const spec_tree *t, const int *path,
                       int n_path, const float *features)
{
    (void)t, (void)path;
    e3_state *q = state;
    q->root_ready = false;
    const int old = v->n_past - n_path;
    if (q->feat_end != old) {
        q->head_done = q->head_done < old ? q->head_done : old;
        return CAIRN_EBACKEND;
    }
    memcpy(q->feat + (size_t)(q->feat_end - q->head_done) * q->fdim, features,
           (size_t)n_path * q->fdim * sizeof(float));
    q->feat_end += n_path;
    return v->shared ? catch_up_to(q, v, v->n_past) : CAIRN_OK;
}

static int e3_kv_part(void *method, int page_size, cairn_type dtype, cairn_kv_layout *part)
{
    const cairn_hparams *hp = cairn_model_hparams(cairn_eagle3_target(method));
    return cairn_kv_layout_init(part, 1, hp->n_kv_head, hp->head_dim, page_size, dtype);
}

static void e3_fingerprint(void *method, uint8_t out[16])
{
    cairn_eagle3_fingerprint(method, out);
}

const spec_drafter_ops spec_eagle3_ops = {
    .name = "eagle3",
    .needs_features = true,
    .seq_create = e3_seq_create,
    .seq_free = e3_seq_free,
    .reset = e3_reset,
    .advance = e3_advance,
    .propose = e3_propose,
    .accepted = e3_accepted,
    .kv_part = e3_kv_part,
    .rows_read_next_token = true,
    .fingerprint = e3_fingerprint,
};

int cairn_spec_add_eagle3(cairn_spec *s, cairn_eagle3 *head)
{
    if (!s || !head || cairn_eagle3_target(head) != spec_target(s))
        return CAIRN_EINVAL;
    /* its features are the target's states at its layers: no other method
     * may read the final feature */
    if (cairn_spec_needs_features(s) || cairn_model_feature_dim(spec_target(s)) !=
                                            cairn_model_hparams(spec_target(s))->dim)
        return CAIRN_EINVAL; /* or another spec of the target has one */
    int layers[3];
    cairn_eagle3_target_layers(head, layers);
    TRY(cairn_model_set_feature_layers(spec_target(s), layers, 3));
    return spec_add_drafter(s, &spec_eagle3_ops, head);
}
