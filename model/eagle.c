/*
 * model/eagle.c — EAGLE heads, and the EAGLE drafter of model/spec.c
 * (EAGLE-2 dynamic draft trees). The contract is in model/model.h.
 *
 * Indices, for a sequence whose first n_past tokens have target KV and whose
 * token n_past ("the root") is pending:
 *
 *   head KV    its own layer (placed after the target's in every page):
 *              index j = head row for (feature f_j, token j+1), position j;
 *              rows 0 .. head_done-1 are final. Draft rows of a step are
 *              scratch at indices >= n_past of the head layer only, so the
 *              target's tree rows never collide with them.
 *   features   f_j for head_done <= j < feat_end are kept on the host until
 *              the head has consumed them (a few rows after each step).
 */
#include "model/eagle_impl.h"
#include "model/layer_impl.h"
#include "model/spec_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* Head rows per forward call: prompt catch-up goes in chunks of this many;
 * a draft level has at most top_k (<= 16) rows. */
#define HEAD_MAX_ROWS 64
#define MAX_TOP_K 16
#define MAX_DEPTH SPEC_MAX_DEPTH

typedef cairn_layer_weight head_weight; /* backend memory */

struct cairn_eagle {
    cairn_model *target;
    cairn_backend *be;
    cairn_model_shared shared;
    cairn_hparams thp; /* the target's */
    int dim, n_head, n_kv_head, head_dim, ffn_dim;
    float rms_eps;
    uint8_t fingerprint[16];

    void *weights_mem;  /* every weight and bias, backend memory */
    head_weight fc, fc_bias;     /* fc_bias: data NULL when absent */
    cairn_layer_weights layer;   /* its decoder layer, without attn_norm */

    /* activations, backend memory, HEAD_MAX_ROWS rows */
    float *cat, *x, *h, *q, *k, *v, *attn, *gate, *up, *logits;
    /* host staging */
    int32_t slots[HEAD_MAX_ROWS], pos[HEAD_MAX_ROWS], q_index[HEAD_MAX_ROWS];
};

/* ======================================================================== */
/* Loading                                                                  */
/* ======================================================================== */

static int meta_u32(const cairn_gguf *g, const char *key, uint32_t *out, char *err, size_t n)
{
    int rc = cairn_gguf_get_u32(g, key, out);
    if (rc != CAIRN_OK)
        return cairn_errorf(err, n, CAIRN_EFORMAT, "EAGLE head: missing or invalid '%s'", key);
    return CAIRN_OK;
}

/* Finds `name` with shape [ne0, ne1] (ne1 = 1: a vector); optional tensors
 * may be absent (*t = NULL). Vectors must be F32. */
static int head_tensor(const cairn_gguf *g, const char *name, int64_t ne0, int64_t ne1,
                       bool optional, const cairn_gguf_tensor **t, char *err, size_t n)
{
    *t = cairn_gguf_find_tensor(g, name);
    if (!*t)
        return optional ? CAIRN_OK
                        : cairn_errorf(err, n, CAIRN_EFORMAT, "EAGLE head: missing tensor '%s'", name);
    const cairn_gguf_tensor *x = *t;
    int64_t rest = 1;
    for (int d = 2; d < x->n_dims; d++)
        rest *= x->ne[d];
    if (x->ne[0] != ne0 || x->ne[1] != ne1 || rest != 1)
        return cairn_errorf(err, n, CAIRN_EFORMAT,
                            "EAGLE head: tensor '%s' has shape [%lld, %lld], the target needs "
                            "[%lld, %lld]",
                            name, (long long)x->ne[0], (long long)x->ne[1], (long long)ne0,
                            (long long)ne1);
    const cairn_type_traits *tr = cairn_type_get(x->type);
    if (!tr || !tr->compute || (ne1 == 1 && x->type != CAIRN_TYPE_F32))
        return cairn_errorf(err, n, CAIRN_EUNSUPPORTED, "EAGLE head: tensor '%s' has type %s",
                            name, tr ? tr->name : "?");
    return CAIRN_OK;
}

static int alloc_acts(cairn_eagle *e)
{
    const size_t R = HEAD_MAX_ROWS;
    const size_t q_dim = (size_t)e->n_head * e->head_dim, kv_dim = (size_t)e->n_kv_head * e->head_dim;
    struct {
        float **p;
        size_t n;
    } bufs[] = {
        {&e->cat, R * 2 * e->dim}, {&e->x, R * e->dim},         {&e->h, R * e->dim},
        {&e->q, R * q_dim},        {&e->k, R * kv_dim},         {&e->v, R * kv_dim},
        {&e->attn, R * q_dim},     {&e->gate, R * e->ffn_dim},  {&e->up, R * e->ffn_dim},
        {&e->logits, (size_t)MAX_TOP_K * e->thp.n_vocab},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        int rc = e->be->iface->alloc(e->be, bufs[i].n * sizeof(float), (void **)bufs[i].p);
        if (rc != CAIRN_OK)
            return rc;
    }
    return CAIRN_OK;
}

static int load_head(cairn_eagle *e, const cairn_gguf *g, const char *path, char *err, size_t n)
{
    const char *arch;
    size_t arch_len;
    if (cairn_gguf_get_str(g, "general.architecture", &arch, &arch_len) != CAIRN_OK ||
        strcmp(arch, "eagle") != 0)
        return cairn_errorf(err, n, CAIRN_EFORMAT, "%s: not an EAGLE head "
                            "(general.architecture must be 'eagle')", path);
    uint32_t dim, ffn, n_head, n_kv;
    int rc;
    if ((rc = meta_u32(g, "eagle.embedding_length", &dim, err, n)) ||
        (rc = meta_u32(g, "eagle.feed_forward_length", &ffn, err, n)) ||
        (rc = meta_u32(g, "eagle.attention.head_count", &n_head, err, n)))
        return rc;
    if (cairn_gguf_get_u32(g, "eagle.attention.head_count_kv", &n_kv) != CAIRN_OK)
        n_kv = n_head;
    float eps = 1e-5f;
    if (cairn_gguf_get_f32(g, "eagle.attention.layer_norm_rms_epsilon", &eps) == CAIRN_ENOTFOUND)
        eps = e->thp.rms_eps;
    const cairn_hparams *t = &e->thp;
    if (dim == 0 || n_head == 0 || n_kv == 0 || ffn == 0 || ffn > (1u << 20) || dim % n_head ||
        n_head % n_kv)
        return cairn_errorf(err, n, CAIRN_EFORMAT, "%s: inconsistent head shape", path);
    if ((int)dim != t->dim || (int)n_kv != t->n_kv_head || (int)(dim / n_head) != t->head_dim)
        return cairn_errorf(err, n, CAIRN_EFORMAT,
                            "%s: head (dim %u, %u KV heads of %u) does not fit the target "
                            "(dim %d, %d KV heads of %d)",
                            path, dim, n_kv, dim / n_head, t->dim, t->n_kv_head, t->head_dim);
    e->dim = (int)dim;
    e->n_head = (int)n_head;
    e->n_kv_head = (int)n_kv;
    e->head_dim = (int)(dim / n_head);
    e->ffn_dim = (int)ffn;
    e->rms_eps = eps;
    const int64_t q_dim = (int64_t)n_head * e->head_dim, kv_dim = (int64_t)n_kv * e->head_dim;

    struct {
        const char *name;
        int64_t ne0, ne1;
        head_weight *w;
        const cairn_gguf_tensor *t;
        bool optional;
    } spec[] = {
        {"fc.weight", 2 * (int64_t)dim, dim, &e->fc, NULL, false},
        {"blk.0.attn_q.weight", dim, q_dim, &e->layer.wq, NULL, false},
        {"blk.0.attn_k.weight", dim, kv_dim, &e->layer.wk, NULL, false},
        {"blk.0.attn_v.weight", dim, kv_dim, &e->layer.wv, NULL, false},
        {"blk.0.attn_output.weight", q_dim, dim, &e->layer.wo, NULL, false},
        {"blk.0.ffn_norm.weight", dim, 1, &e->layer.ffn_norm, NULL, false},
        {"blk.0.ffn_gate.weight", dim, ffn, &e->layer.w_gate, NULL, false},
        {"blk.0.ffn_up.weight", dim, ffn, &e->layer.w_up, NULL, false},
        {"blk.0.ffn_down.weight", ffn, dim, &e->layer.w_down, NULL, false},
        {"fc.bias", dim, 1, &e->fc_bias, NULL, true},
        {"blk.0.attn_q.bias", q_dim, 1, &e->layer.bq, NULL, true},
        {"blk.0.attn_k.bias", kv_dim, 1, &e->layer.bk, NULL, true},
        {"blk.0.attn_v.bias", kv_dim, 1, &e->layer.bv, NULL, true},
    };
    const int n_spec = (int)(sizeof spec / sizeof spec[0]);
    size_t total = 0;
    for (int i = 0; i < n_spec; i++) {
        if ((rc = head_tensor(g, spec[i].name, spec[i].ne0, spec[i].ne1, spec[i].optional,
                              &spec[i].t, err, n)))
            return rc;
        if (spec[i].t)
            total += (spec[i].t->size + 63) & ~(size_t)63;
    }

    cairn_backend *be = e->be;
    if ((rc = be->iface->alloc(be, total, &e->weights_mem)) != CAIRN_OK)
        return cairn_errorf(err, n, rc, "%s: cannot allocate the head's weights", path);
    XXH3_state_t *hs = XXH3_createState();
    if (!hs)
        return CAIRN_ENOMEM;
    XXH3_128bits_reset(hs);
    uint8_t *dst = e->weights_mem;
    for (int i = 0; i < n_spec && rc == CAIRN_OK; i++) {
        const cairn_gguf_tensor *x = spec[i].t;
        if (!x)
            continue; /* an absent bias: data stays NULL */
        rc = be->iface->upload(be, dst, x->data, x->size);
        *spec[i].w = (head_weight){dst, x->type, NULL};
        dst += (x->size + 63) & ~(size_t)63;
        uint32_t type = (uint32_t)x->type;
        XXH3_128bits_update(hs, x->name, strlen(x->name) + 1);
        XXH3_128bits_update(hs, &type, sizeof type);
        XXH3_128bits_update(hs, x->ne, sizeof x->ne);
        XXH3_128bits_update(hs, x->data, x->size);
    }
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(hs));
    XXH3_freeState(hs);
    memcpy(e->fingerprint, c.digest, 16);
    if (rc != CAIRN_OK)
        return cairn_errorf(err, n, rc, "%s: uploading the head's weights failed", path);
    if ((rc = alloc_acts(e)) != CAIRN_OK)
        return cairn_errorf(err, n, rc, "%s: cannot allocate the head's activations", path);
    return CAIRN_OK;
}

int cairn_eagle_load(const char *path, cairn_model *target, cairn_eagle **out, char *err,
                     size_t err_len)
{
    if (!path || !target || !out)
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "cairn_eagle_load: missing argument");
    /* A head re-embeds tokens through the target's table; Gemma's targets
     * scale their embeddings by sqrt(dim), which no head here is built for. */
    if (strcmp(cairn_model_hparams(target)->arch, "gemma3") == 0)
        return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                            "%s: EAGLE heads for a gemma3 target are not supported", path);
    cairn_eagle *e = calloc(1, sizeof *e);
    if (!e)
        return CAIRN_ENOMEM;
    e->target = target;
    e->be = cairn_model_backend(target);
    e->thp = *cairn_model_hparams(target);
    cairn_model_eagle_shared(target, &e->shared);
    cairn_gguf *g = NULL;
    int rc = cairn_gguf_open(path, &g, err, err_len);
    if (rc == CAIRN_OK)
        rc = load_head(e, g, path, err, err_len);
    cairn_gguf_close(g);
    if (rc != CAIRN_OK) {
        cairn_eagle_free(e);
        return rc;
    }
    *out = e;
    return CAIRN_OK;
}

void cairn_eagle_free(cairn_eagle *e)
{
    if (!e)
        return;
    float *bufs[] = {e->cat, e->x, e->h, e->q, e->k, e->v, e->attn, e->gate, e->up, e->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i])
            e->be->iface->free(e->be, bufs[i]);
    if (e->weights_mem)
        e->be->iface->free(e->be, e->weights_mem);
    free(e);
}

void cairn_eagle_fingerprint(const cairn_eagle *e, uint8_t out[16])
{
    memcpy(out, e->fingerprint, 16);
}

static int eagle_kv_part(void *method, int page_size, cairn_type dtype, cairn_kv_layout *part)
{
    const cairn_eagle *e = method;
    return cairn_kv_layout_init(part, 1, e->thp.n_kv_head, e->thp.head_dim, page_size, dtype);
}

/* ======================================================================== */
/* Head forward                                                             */
/* ======================================================================== */

/* R head rows: tokens[R], host features feat[R][dim], RoPE positions pos[R],
 * head-KV indices kv_index[R] in the head's own KV layout `kv` (layer 0). The rows attend over head KV 0 .. n_kv-1:
 * causally (mask NULL: row r sees 0 .. kv_index[r]) or by mask [R][n_kv].
 * Writes the head's output hidden[R][dim] (host, optional) and the logits of
 * the last `n_logit_rows` rows to logits[n_logit_rows][n_vocab] (host). */
static int head_forward(cairn_eagle *e, void *kv_pool, const cairn_kv_layout *kv,
                        const int32_t *pages, const int32_t *tokens, const float *feat,
                        const int32_t *pos, const int32_t *kv_index, int R, int n_kv,
                        const uint8_t *mask, float *hidden, float *logits, int n_logit_rows)
{
    if (R <= 0 || R > HEAD_MAX_ROWS || n_logit_rows > R || n_logit_rows > MAX_TOP_K)
        return CAIRN_EINVAL;
    cairn_backend *be = e->be;
    const cairn_backend_iface *op = be->iface;
    const int dim = e->dim, hd = e->head_dim;
    const int layer = 0; /* the head's one layer of its own KV part */
    const size_t row = (size_t)dim * sizeof(float);

    for (int r = 0; r < R; r++) {
        e->slots[r] = pages[kv_index[r] / kv->page_size] * kv->page_size + kv_index[r] % kv->page_size;
        e->pos[r] = pos[r];
        e->q_index[r] = kv_index[r];
    }
    /* cat [R][2*dim] = [embed(token) ; feature] */
    TRY(op->get_rows(be, e->x, e->shared.tok_embd, e->shared.tok_embd_type, dim, tokens, R));
    for (int r = 0; r < R; r++) {
        TRY(cairn_backend_copy(be, e->cat + (size_t)r * 2 * dim, e->x + (size_t)r * dim, row));
        TRY(op->upload(be, e->cat + (size_t)r * 2 * dim + dim, feat + (size_t)r * dim, row));
    }
    TRY(op->matmul(be, e->x, e->fc.data, e->fc.type, e->cat, R, 2 * dim, dim)); /* [R][dim] */
    if (e->fc_bias.data)
        TRY(op->add_bias(be, e->x, e->fc_bias.data, R, dim));

    /* the decoder layer, without an input norm (EAGLE's has none), its KV
     * in its own layer after the target's */
    const cairn_layer_shape shape = {
        .dim = dim, .n_head = e->n_head, .n_kv_head = e->n_kv_head, .head_dim = hd,
        .ffn_dim = e->ffn_dim, .rms_eps = e->rms_eps,
        .rope = {
            .n_rot = e->thp.n_rot,
            .mode = e->thp.rope_mode,
            .freq_base = e->thp.rope_freq_base,
            .freq_scale = e->thp.rope_freq_scale,
            .freq_factors = e->shared.rope_freqs,
        },
    };
    const cairn_layer_acts acts = {
        .x = e->x, .h = e->h, .q = e->q, .attn = e->attn, .k = e->k, .v = e->v,
        .gate = e->gate, .up = e->up,
    };
    const cairn_attn_seq seq = {
        .q_start = 0, .n_q = R, .n_kv = n_kv, .q_index = e->q_index, .pages = pages, .mask = mask,
    };
    const cairn_attn_args attn = {
        .n_head = e->n_head, .scale = 1.0f / sqrtf((float)hd), .n_seqs = 1, .seqs = &seq,
    };
    TRY(cairn_layer_forward(be, &e->layer, &shape, &acts, R, e->pos, e->slots, kv_pool, kv,
                            layer, &attn)); /* head output x [R][dim] */

    if (hidden)
        TRY(op->download(be, hidden, e->x, (size_t)R * row));
    if (n_logit_rows > 0) {
        const float *last = e->x + (size_t)(R - n_logit_rows) * dim;
        TRY(op->matmul(be, e->logits, e->shared.output, e->shared.output_type, last,
                       n_logit_rows, dim, e->thp.n_vocab));
        TRY(op->download(be, logits, e->logits,
                         (size_t)n_logit_rows * e->thp.n_vocab * sizeof(float)));
    }
    return cairn_backend_synchronize(be);
}


/* ======================================================================== */
/* The EAGLE drafter                                                        */
/* ======================================================================== */

typedef struct {
    int32_t token;
    int16_t parent; /* candidate index, -1 = the root                    */
    uint8_t depth;  /* 1 = child of the root                              */
    float score;    /* cumulative log-probability under the head          */
    int16_t head_row; /* draft head row when expanded, else -1            */
    int16_t row;    /* its row in the verified tree, -1 = not in it      */
} cand;

typedef struct {
    cairn_eagle *e;
    int depth, top_k;
    cairn_sampling_params sp; /* its logit bias applies to the guesses */

    int head_done;     /* head rows 0 .. head_done-1 are final             */
    int feat_end;      /* features f_j for head_done <= j < feat_end held  */
    float *feat;       /* host [MAX_DEPTH + 2 + HEAD_MAX_ROWS][dim]: f_j at
                          row j - head_done                                */
    bool root_ready;   /* head_logits[0] is the root's                     */

    /* drafting scratch */
    cand *cands;           /* [top_k + (depth-1) * top_k * top_k]          */
    int n_cands;
    float *head_hidden;    /* host [(depth-1) * top_k + 1][dim] head outputs,
                              row 0 = the root's                          */
    float *head_logits;    /* host [top_k][n_vocab]                        */
    float *draft_feat;     /* host [top_k][dim] features of a draft level  */
    int32_t *order;        /* [n_cands] scratch                            */
    uint8_t *head_mask;    /* [top_k][mask_cap]                            */
    uint8_t *catch_mask;   /* [HEAD_MAX_ROWS][mask_cap] (shared sequences) */
    int mask_cap;
} eagle_state;

static int eagle_seq_create(void *method, const cairn_spec_params *p,
                            const cairn_sampling_params *sp, void **state)
{
    cairn_eagle *e = method;
    if (p->top_k > MAX_TOP_K)
        return CAIRN_EINVAL;
    eagle_state *q = calloc(1, sizeof *q);
    if (!q)
        return CAIRN_ENOMEM;
    q->e = e;
    q->depth = p->depth;
    q->top_k = p->top_k;
    q->sp = *sp;
    const size_t dim = (size_t)e->dim, nv = (size_t)e->thp.n_vocab, k = (size_t)p->top_k;
    const size_t max_cands = k + (size_t)(p->depth - 1) * k * k;
    q->cands = malloc(max_cands * sizeof *q->cands);
    q->order = malloc(max_cands * sizeof *q->order);
    q->head_hidden = malloc(((size_t)(p->depth - 1) * k + 1) * dim * sizeof(float));
    q->head_logits = malloc(k * nv * sizeof(float));
    q->draft_feat = malloc(k * dim * sizeof(float));
    q->feat = malloc((size_t)(MAX_DEPTH + 2 + HEAD_MAX_ROWS) * dim * sizeof(float));
    *state = q;
    if (!q->cands || !q->order || !q->head_hidden || !q->head_logits || !q->draft_feat || !q->feat)
        return CAIRN_ENOMEM; /* the caller frees the state */
    return CAIRN_OK;
}

static void eagle_seq_free(void *state)
{
    eagle_state *q = state;
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

/* Masks sized by the sequence's capacity. */
static int masks_fit(eagle_state *q, const spec_view *v)
{
    if (v->capacity <= q->mask_cap && q->head_mask && (!v->shared || q->catch_mask))
        return CAIRN_OK;
    free(q->head_mask);
    free(q->catch_mask);
    const size_t cap1 = v->capacity > 0 ? (size_t)v->capacity : 1;
    q->head_mask = malloc((size_t)q->top_k * cap1);
    q->catch_mask = malloc((size_t)HEAD_MAX_ROWS * cap1);
    q->mask_cap = q->head_mask && q->catch_mask ? v->capacity : 0;
    return q->mask_cap == v->capacity ? CAIRN_OK : CAIRN_ENOMEM;
}

/* Runs the head over its pending rows head_done .. upto-1 (features in
 * q->feat, tokens j+1 from v->tokens, so upto < n_known), in chunks. The
 * last row's output and logits (the root's when upto = n_past) land in
 * head_hidden[0] and head_logits[0] — the logits only for a sequence of
 * its own: an adopted one runs the head after every plain decoding step
 * too, and projecting onto the vocabulary each time (as costly as the
 * target's own LM head) would be wasted unless it then speculates, so
 * root_logits does that at the step. */
static int head_catch_up_to(eagle_state *q, const spec_view *v, int upto)
{
    cairn_eagle *e = q->e;
    const int dim = e->dim;
    int32_t pos[HEAD_MAX_ROWS];
    if (upto > q->feat_end)
        upto = q->feat_end;
    if (q->head_done < upto)
        TRY(masks_fit(q, v));
    while (q->head_done < upto) {
        int R = upto - q->head_done;
        if (R > HEAD_MAX_ROWS)
            R = HEAD_MAX_ROWS;
        const bool last = q->head_done + R == upto;
        for (int r = 0; r < R; r++)
            pos[r] = q->head_done + r;
        const int n_kv = q->head_done + R;
        uint8_t *mask = NULL;
        if (v->shared) { /* causal, without other rows' page-last entries */
            mask = q->catch_mask;
            for (int r = 0; r < R; r++) {
                uint8_t *m = mask + (size_t)r * n_kv;
                for (int k = 0; k < n_kv; k++)
                    m[k] = k <= q->head_done + r && (!spec_page_last(v, k) || k == q->head_done + r);
            }
        }
        TRY(head_forward(e, v->kv_pool, v->own_kv, v->pages, v->tokens + q->head_done + 1, q->feat,
                         pos, pos, R, n_kv, mask, NULL,
                         last && !v->shared ? q->head_logits : NULL,
                         last && !v->shared ? 1 : 0));
        if (last) {
            /* the root's output: download only its row */
            TRY(e->be->iface->download(e->be, q->head_hidden, e->x + (size_t)(R - 1) * dim,
                                       (size_t)dim * sizeof(float)));
            q->root_ready = !v->shared;
        }
        q->head_done += R;
        /* drop consumed features */
        const int left = q->feat_end - q->head_done;
        memmove(q->feat, q->feat + (size_t)R * dim, (size_t)left * dim * sizeof(float));
    }
    return CAIRN_OK;
}

/* head_logits[0] = the root's head output (head_hidden[0]) through the LM head. */
static int root_logits(eagle_state *q)
{
    cairn_eagle *e = q->e;
    const cairn_backend_iface *op = e->be->iface;
    TRY(op->upload(e->be, e->x, q->head_hidden, (size_t)e->dim * sizeof(float)));
    TRY(op->matmul(e->be, e->logits, e->shared.output, e->shared.output_type, e->x, 1, e->dim,
                   e->thp.n_vocab));
    TRY(op->download(e->be, q->head_logits, e->logits, (size_t)e->thp.n_vocab * sizeof(float)));
    q->root_ready = true;
    return cairn_backend_synchronize(e->be);
}

static int eagle_reset(void *state, const spec_view *v)
{
    eagle_state *q = state;
    /* adopted: rows below n_past are in the pages (row n_past-1 is a page's
     * last, never attended) */
    q->head_done = q->feat_end = v->n_past;
    q->root_ready = false;
    return CAIRN_OK;
}

/* Hold features f_from .. f_from+n-1 and let the head run over every row
 * whose next token is known; in pieces that fit q->feat (after each
 * catch-up at most one row, whose next token is unknown, waits). */
static int eagle_take_features(eagle_state *q, const spec_view *v, int from, const float *features,
                               int n)
{
    const int dim = q->e->dim;
    if (from != q->feat_end)
        return CAIRN_EINVAL; /* features must come in order */
    for (int done = 0; done < n;) {
        int m = n - done;
        if (m > HEAD_MAX_ROWS)
            m = HEAD_MAX_ROWS;
        memcpy(q->feat + (size_t)(q->feat_end - q->head_done) * dim, features + (size_t)done * dim,
               (size_t)m * dim * sizeof(float));
        q->feat_end += m;
        done += m;
        const int upto = v->n_known - 1 < q->feat_end ? v->n_known - 1 : q->feat_end;
        TRY(head_catch_up_to(q, v, upto));
    }
    return CAIRN_OK;
}

static int eagle_advance(void *state, const spec_view *v, int from, const float *features, int n)
{
    eagle_state *q = state;
    q->root_ready = false;
    return eagle_take_features(q, v, from, features, n);
}

/* ---- drafting ----------------------------------------------------------- */

/* Candidates ordered by score, descending; ties to the earlier candidate. */
static int cmp_cand_score(const void *a, const void *b, const cand *c)
{
    const int i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (c[i].score != c[j].score)
        return c[i].score > c[j].score ? -1 : 1;
    return (i > j) - (i < j);
}

/* qsort has no context argument: an insertion sort over indices is enough
 * for the at most top_k + (depth-1) * top_k^2 candidates. */
static void sort_by_score(int32_t *idx, int n, const cand *c)
{
    for (int i = 1; i < n; i++) {
        int32_t v = idx[i];
        int j = i;
        while (j > 0 && cmp_cand_score(&v, &idx[j - 1], c) < 0) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = v;
    }
}

/* `logits` is a row of the head's (scratch, changed here): the request's
 * logit bias applies to the guesses too, or a forced token would never be
 * drafted (the verification is lossless either way). */
static void add_children(eagle_state *q, int parent, float *logits)
{
    const int k = q->top_k;
    int32_t ids[MAX_TOP_K];
    float lp[MAX_TOP_K];
    for (int i = 0; i < q->sp.n_logit_bias; i++)
        logits[q->sp.logit_bias[i].token] += q->sp.logit_bias[i].bias;
    spec_top_k_logprobs(logits, q->e->thp.n_vocab, k, ids, lp);
    const float base = parent < 0 ? 0.0f : q->cands[parent].score;
    const int depth = parent < 0 ? 1 : q->cands[parent].depth + 1;
    for (int i = 0; i < k; i++)
        q->cands[q->n_cands++] = (cand){
            .token = ids[i], .parent = (int16_t)parent, .depth = (uint8_t)depth,
            .score = base + lp[i], .head_row = -1, .row = -1,
        };
}

/* Builds the candidate set: level 1 from the root's head logits, then
 * depth-1 expansions of the best top_k nodes of the newest level. */
static int draft_tree(eagle_state *q, const spec_view *v, int depth)
{
    cairn_eagle *e = q->e;
    const int k = q->top_k, dim = e->dim, base = v->n_past;
    q->n_cands = 0;
    add_children(q, -1, q->head_logits);
    int level_start = 0, level_end = q->n_cands, n_rows = 0;
    int32_t frontier[MAX_TOP_K], tokens[MAX_TOP_K], pos[MAX_TOP_K], kv_index[MAX_TOP_K];
    float *feat = q->draft_feat; /* [k][dim] */
    for (int d = 2; d <= depth; d++) {
        /* the best k of the newest level */
        int n_level = level_end - level_start;
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
            const float *pf = p < 0 ? q->head_hidden : q->head_hidden + (size_t)(1 + q->cands[p].head_row) * dim;
            memcpy(feat + (size_t)r * dim, pf, (size_t)dim * sizeof(float));
            /* the committed head rows, the expanded ancestors, itself */
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
        TRY(head_forward(e, v->kv_pool, v->own_kv, v->pages, tokens, feat, pos, kv_index, R, n_kv,
                         q->head_mask, q->head_hidden + (size_t)(1 + n_rows) * dim,
                         q->head_logits, R));
        n_rows += R;
        level_start = q->n_cands;
        for (int r = 0; r < R; r++)
            add_children(q, frontier[r], q->head_logits + (size_t)r * e->thp.n_vocab);
        level_end = q->n_cands;
    }
    return CAIRN_OK;
}

/* Adds the best n candidates to the tree by depth (parents first); a set
 * closed under ancestors, since a child never scores above its parent. */
static void select_tree(eagle_state *q, spec_tree *t, int n, int source)
{
    for (int i = 0; i < q->n_cands; i++)
        q->order[i] = i;
    sort_by_score(q->order, q->n_cands, q->cands);
    if (n > q->n_cands)
        n = q->n_cands;
    /* by depth, then candidate index: parents come before children */
    int32_t *chosen = q->order;
    for (int i = 1; i < n; i++) {
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

static int eagle_propose(void *state, const spec_view *v, spec_tree *t, int budget, int source)
{
    eagle_state *q = state;
    if (v->n_past == 0 || budget <= 0)
        return CAIRN_OK; /* no feature yet to draft from */
    /* the head catches up with the features of the last step */
    TRY(head_catch_up_to(q, v, v->n_past));
    if (q->head_done != v->n_past)
        return CAIRN_OK;
    TRY(masks_fit(q, v));
    if (!q->root_ready)
        TRY(root_logits(q));
    const int depth = q->depth < budget ? q->depth : budget;
    TRY(draft_tree(q, v, depth));
    select_tree(q, t, budget, source);
    q->root_ready = false;
    return CAIRN_OK;
}

static int eagle_accepted(void *state, const spec_view *v, const spec_tree *t, const int *path,
                          int n_path, const float *features)
{
    (void)t, (void)path;
    eagle_state *q = state;
    q->root_ready = false;
    const int old = v->n_past - n_path;
    if (q->feat_end != old) { /* the head lost track (cannot happen): start over */
        q->head_done = q->head_done < old ? q->head_done : old;
        return CAIRN_EBACKEND;
    }
    const int dim = q->e->dim;
    memcpy(q->feat + (size_t)(q->feat_end - q->head_done) * dim, features,
           (size_t)n_path * dim * sizeof(float));
    q->feat_end += n_path;
    /* pages may be shared as soon as the caller has them back; and while
     * the head does not draft (speculation paused) features must not pile
     * up past q->feat (HEAD_MAX_ROWS + MAX_DEPTH + 2 rows: a step adds at
     * most MAX_DEPTH + 1) */
    if (v->shared || q->feat_end - q->head_done >= HEAD_MAX_ROWS)
        return head_catch_up_to(q, v, v->n_past);
    return CAIRN_OK;
}

static void eagle_fingerprint_op(void *method, uint8_t out[16])
{
    cairn_eagle_fingerprint(method, out);
}

const spec_drafter_ops spec_eagle_ops = {
    .name = "eagle",
    .needs_features = true,
    .seq_create = eagle_seq_create,
    .seq_free = eagle_seq_free,
    .reset = eagle_reset,
    .advance = eagle_advance,
    .propose = eagle_propose,
    .accepted = eagle_accepted,
    .kv_part = eagle_kv_part,
    .rows_read_next_token = true,
    .fingerprint = eagle_fingerprint_op,
};
