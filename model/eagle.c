/*
 * model/eagle.c — EAGLE heads and speculative decoding of one sequence
 * (EAGLE-2 dynamic draft trees, one tree-masked target forward per step,
 * greedy or lossless sampled acceptance). The contract is in model/model.h.
 *
 * Indices, for a sequence whose first n_past tokens have target KV and whose
 * token n_past ("the root") is pending:
 *
 *   target KV  index i = token i, RoPE position i (tree rows: n_past + depth)
 *   head KV    index j = head row for (feature f_j, token j+1), position j;
 *              rows 0 .. head_done-1 are final. Draft rows of a step are
 *              scratch at indices >= n_past of the head layer only, so the
 *              target's tree rows (layers 0 .. n_layer-1) never collide.
 *   features   f_j for head_done <= j < n_past are kept on the host until the
 *              head has consumed them (a few rows after each step).
 */
#include "model/eagle_impl.h"
#include "model/layer_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* Head rows per forward call: prompt catch-up goes in chunks of this many;
 * a draft level has at most top_k (<= 16) rows. */
#define HEAD_MAX_ROWS 64
#define MAX_TOP_K 16
#define MAX_DEPTH 16
#define MAX_DRAFT 255

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
        *spec[i].w = (head_weight){dst, x->type};
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

int cairn_eagle_kv_layout(const cairn_eagle *e, int page_size, cairn_type dtype,
                          cairn_kv_layout *out)
{
    if (!e || !out)
        return CAIRN_EINVAL;
    return cairn_kv_layout_init(out, e->thp.n_layer + 1, e->thp.n_kv_head, e->thp.head_dim,
                                page_size, dtype);
}

/* ======================================================================== */
/* Head forward                                                             */
/* ======================================================================== */

/* R head rows: tokens[R], host features feat[R][dim], RoPE positions pos[R],
 * head-KV indices kv_index[R]. The rows attend over head KV 0 .. n_kv-1:
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
    const int layer = e->thp.n_layer;
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
     * one layer past the target's */
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
/* Decoding                                                                 */
/* ======================================================================== */

typedef struct {
    int32_t token;
    int16_t parent; /* candidate index, -1 = the root                    */
    uint8_t depth;  /* 1 = child of the root                              */
    float score;    /* cumulative log-probability under the head          */
    int16_t head_row; /* draft head row when expanded, else -1            */
} cand;

struct cairn_eagle_seq {
    cairn_eagle *e;
    cairn_eagle_params dp;
    cairn_sampling_params sp;
    bool greedy;
    cairn_rng rng;

    /* the sequence */
    void *kv_pool;
    const cairn_kv_layout *kv;
    const int32_t *pages;
    int capacity;
    int32_t *tokens;   /* [capacity + 1]: committed tokens, then the root  */
    int n_past;        /* tokens with target KV; tokens[n_past] is pending */
    int head_done;     /* head rows 0 .. head_done-1 are final             */
    int n_known;       /* tokens[0 .. n_known) are known (>= n_past)       */
    int tokens_cap;    /* entries of tokens[]                              */
    bool shared;       /* adopted: pages shared by a prefix cache, head
                          rows at page-last indices are never attended     */
    uint8_t *catch_mask; /* shared: [HEAD_MAX_ROWS][capacity] catch-up mask */
    float *feat;       /* host [MAX_DEPTH + 2 + HEAD_MAX_ROWS][dim]: f_j for
                          head_done <= j < n_past, row j - head_done       */
    bool begun;

    /* drafting scratch */
    cand *cands;           /* [top_k + (depth-1) * top_k * top_k]          */
    int n_cands;
    float *head_hidden;    /* host [(depth-1) * top_k + 1][dim] head outputs,
                              row 0 = the root's                          */
    float *head_logits;    /* host [top_k][n_vocab]                        */
    float *draft_feat;     /* host [top_k][dim] features of a draft level  */
    uint8_t *head_mask;    /* [top_k][capacity]                            */
    int32_t *order;        /* [n_cands] scratch                            */

    /* verification */
    int n_tree;            /* rows: root + selected candidates             */
    int *tree_cand;        /* [1 + n_draft] candidate of each row (-1 root) */
    int *tree_parent;      /* [1 + n_draft] parent row (-1 for the root)    */
    int32_t *tree_tokens, *tree_pos;
    uint8_t *tree_mask;    /* [1 + n_draft][capacity + 1]                   */
    uint8_t *want;
    float *tree_logits;    /* [1 + n_draft][n_vocab]                        */
    float *tree_hidden;    /* [1 + n_draft][dim]                            */
    float *probs;          /* [n_vocab] target distribution (sampling)      */
    cairn_sampler *target; /* the request's sampler settings: the target's
                              distribution (cairn_sampler_probs) and, when
                              greedy, its argmax (logit bias included)     */

    cairn_eagle_stats stats;
};

cairn_eagle_params cairn_eagle_defaults(void)
{
    return (cairn_eagle_params){.depth = 5, .top_k = 8, .n_draft = 32};
}

int cairn_eagle_seq_create(cairn_eagle *e, const cairn_eagle_params *dp,
                           const cairn_sampling_params *sp, cairn_eagle_seq **out)
{
    if (!e || !out)
        return CAIRN_EINVAL;
    cairn_eagle_params d = dp ? *dp : cairn_eagle_defaults();
    if (d.depth < 1 || d.depth > MAX_DEPTH || d.top_k < 1 || d.top_k > MAX_TOP_K ||
        d.n_draft < 1 || d.n_draft > MAX_DRAFT)
        return CAIRN_EINVAL;
    cairn_sampling_params s = cairn_sampling_defaults();
    s.temperature = 0;
    if (sp)
        s = *sp;
    if (!isfinite(s.temperature) || !(s.top_p > 0 && s.top_p <= 1) || !(s.min_p >= 0 && s.min_p <= 1))
        return CAIRN_EINVAL;
    /* Penalties make the target's distribution depend on the path through
     * the tree; not supported here. (A logit bias does not: it is part of
     * the distribution cairn_sampler_probs gives.) */
    if (cairn_sampling_has_penalties(&s))
        return CAIRN_EUNSUPPORTED;
    if (1 + d.n_draft > e->shared.max_batch_tokens)
        return CAIRN_ERANGE;
    cairn_eagle_seq *q = calloc(1, sizeof *q);
    if (!q)
        return CAIRN_ENOMEM;
    q->e = e;
    q->dp = d;
    q->sp = s;
    q->greedy = s.temperature <= 0;
    cairn_rng_seed(&q->rng, s.seed);

    const size_t dim = (size_t)e->dim, nv = (size_t)e->thp.n_vocab;
    const size_t k = (size_t)d.top_k, rows = 1 + (size_t)d.n_draft;
    const size_t max_cands = k + (size_t)(d.depth - 1) * k * k;
    q->cands = malloc(max_cands * sizeof *q->cands);
    q->order = malloc(max_cands * sizeof *q->order);
    q->head_hidden = malloc(((size_t)(d.depth - 1) * k + 1) * dim * sizeof(float));
    q->head_logits = malloc(k * nv * sizeof(float));
    q->draft_feat = malloc(k * dim * sizeof(float));
    q->feat = malloc((size_t)(MAX_DEPTH + 2 + HEAD_MAX_ROWS) * dim * sizeof(float));
    q->tree_cand = malloc(rows * sizeof(int));
    q->tree_parent = malloc(rows * sizeof(int));
    q->tree_tokens = malloc(rows * sizeof(int32_t));
    q->tree_pos = malloc(rows * sizeof(int32_t));
    q->want = malloc(rows);
    q->tree_logits = malloc(rows * nv * sizeof(float));
    q->tree_hidden = malloc(rows * dim * sizeof(float));
    q->probs = malloc(nv * sizeof(float));
    int trc = cairn_sampler_create(&s, e->thp.n_vocab, &q->target);
    if (trc != CAIRN_OK) {
        cairn_eagle_seq_free(q);
        return trc;
    }
    if (!q->cands || !q->order || !q->head_hidden || !q->head_logits || !q->draft_feat || !q->feat ||
        !q->tree_cand || !q->tree_parent || !q->tree_tokens || !q->tree_pos || !q->want ||
        !q->tree_logits || !q->tree_hidden || !q->probs) {
        cairn_eagle_seq_free(q);
        return CAIRN_ENOMEM;
    }
    memset(q->want, 1, rows);
    *out = q;
    return CAIRN_OK;
}

void cairn_eagle_seq_free(cairn_eagle_seq *s)
{
    if (!s)
        return;
    free(s->tokens);
    free(s->catch_mask);
    free(s->feat);
    free(s->cands);
    free(s->order);
    free(s->head_hidden);
    free(s->head_logits);
    free(s->draft_feat);
    free(s->head_mask);
    free(s->tree_cand);
    free(s->tree_parent);
    free(s->tree_tokens);
    free(s->tree_pos);
    free(s->tree_mask);
    free(s->want);
    free(s->tree_logits);
    free(s->tree_hidden);
    free(s->probs);
    cairn_sampler_free(s->target);
    free(s);
}

int cairn_eagle_seq_n_past(const cairn_eagle_seq *s) { return s ? s->n_past : 0; }

void cairn_eagle_seq_stats(const cairn_eagle_seq *s, cairn_eagle_stats *out)
{
    if (s && out)
        *out = s->stats;
}

/* A head row at a page's last index: never attended by other rows of an
 * adopted (page-sharing) sequence, see model/model.h. */
static bool page_last(const cairn_eagle_seq *s, int index)
{
    const int ps = s->kv->page_size;
    return index % ps == ps - 1;
}

/* Runs the head over its pending rows head_done .. upto-1 (features in
 * s->feat, tokens j+1 from s->tokens, so upto < n_known), in chunks. The
 * last row's output and logits (the root's when upto = n_past) land in
 * head_hidden[0] and head_logits[0] — the logits only for a sequence of
 * its own: an adopted one runs the head after every plain decoding step
 * too, and projecting onto the vocabulary each time (as costly as the
 * target's own LM head) would be wasted unless it then speculates, so
 * root_logits does that at the step. */
static int head_catch_up_to(cairn_eagle_seq *s, int upto)
{
    cairn_eagle *e = s->e;
    const int dim = e->dim;
    int32_t pos[HEAD_MAX_ROWS];
    while (s->head_done < upto) {
        int R = upto - s->head_done;
        if (R > HEAD_MAX_ROWS)
            R = HEAD_MAX_ROWS;
        const bool last = s->head_done + R == upto;
        for (int r = 0; r < R; r++)
            pos[r] = s->head_done + r;
        const int n_kv = s->head_done + R;
        uint8_t *mask = NULL;
        if (s->shared) { /* causal, without other rows' page-last entries */
            mask = s->catch_mask;
            for (int r = 0; r < R; r++) {
                uint8_t *m = mask + (size_t)r * n_kv;
                for (int k = 0; k < n_kv; k++)
                    m[k] = k <= s->head_done + r && (!page_last(s, k) || k == s->head_done + r);
            }
        }
        TRY(head_forward(e, s->kv_pool, s->kv, s->pages, s->tokens + s->head_done + 1, s->feat,
                         pos, pos, R, n_kv, mask, NULL,
                         last && !s->shared ? s->head_logits : NULL,
                         last && !s->shared ? 1 : 0));
        if (last) {
            /* the root's output: download only its row */
            TRY(e->be->iface->download(e->be, s->head_hidden, e->x + (size_t)(R - 1) * dim,
                                       (size_t)dim * sizeof(float)));
        }
        s->head_done += R;
        /* drop consumed features */
        const int left = s->n_past - s->head_done;
        memmove(s->feat, s->feat + (size_t)R * dim, (size_t)left * dim * sizeof(float));
    }
    return CAIRN_OK;
}

static int head_catch_up(cairn_eagle_seq *s) { return head_catch_up_to(s, s->n_past); }

/* head_logits[0] = the root's head output (head_hidden[0]) through the LM head. */
static int root_logits(cairn_eagle_seq *s)
{
    cairn_eagle *e = s->e;
    const cairn_backend_iface *op = e->be->iface;
    TRY(op->upload(e->be, e->x, s->head_hidden, (size_t)e->dim * sizeof(float)));
    TRY(op->matmul(e->be, e->logits, e->shared.output, e->shared.output_type, e->x, 1, e->dim,
                   e->thp.n_vocab));
    TRY(op->download(e->be, s->head_logits, e->logits, (size_t)e->thp.n_vocab * sizeof(float)));
    return cairn_backend_synchronize(e->be);
}

/* Scratch sized by the capacity; tokens[] keeps its contents and holds at
 * least max(capacity + 1, n_tokens) entries. */
static int seq_resize(cairn_eagle_seq *s, int capacity, int n_tokens)
{
    int need = capacity + 1 > n_tokens ? capacity + 1 : n_tokens;
    if (need > s->tokens_cap) {
        int32_t *t = realloc(s->tokens, (size_t)need * sizeof *t);
        if (!t)
            return CAIRN_ENOMEM;
        s->tokens = t;
        s->tokens_cap = need;
    }
    if (capacity != s->capacity || (s->shared && !s->catch_mask)) {
        free(s->head_mask);
        free(s->tree_mask);
        free(s->catch_mask);
        s->catch_mask = NULL;
        const size_t cap1 = capacity > 0 ? (size_t)capacity : 1; /* malloc(0) may be NULL */
        s->head_mask = malloc((size_t)s->dp.top_k * cap1);
        s->tree_mask = malloc((size_t)(1 + s->dp.n_draft) * (cap1 + 1));
        if (s->shared)
            s->catch_mask = malloc((size_t)HEAD_MAX_ROWS * cap1);
        s->capacity = capacity;
        if (!s->head_mask || !s->tree_mask || (s->shared && !s->catch_mask)) {
            s->capacity = 0;
            return CAIRN_ENOMEM;
        }
    }
    return CAIRN_OK;
}

int cairn_eagle_seq_begin(cairn_eagle_seq *s, void *kv_pool, const cairn_kv_layout *kv,
                          const int32_t *pages, int capacity, const int32_t *prompt, int n)
{
    if (!s || !kv_pool || !kv || !pages || !prompt || n < 1 || capacity <= n)
        return CAIRN_EINVAL;
    cairn_eagle *e = s->e;
    if (kv->n_layer != e->thp.n_layer + 1 || kv->n_kv_head != e->thp.n_kv_head ||
        kv->head_dim != e->thp.head_dim)
        return CAIRN_EINVAL;
    for (int i = 0; i < n; i++)
        if (prompt[i] < 0 || prompt[i] >= e->thp.n_vocab)
            return CAIRN_EINVAL;
    s->begun = false;
    s->shared = false;
    TRY(seq_resize(s, capacity, n));
    s->kv_pool = kv_pool;
    s->kv = kv;
    s->pages = pages;
    memcpy(s->tokens, prompt, (size_t)n * sizeof(int32_t));
    s->n_past = 0;
    s->head_done = 0;
    memset(&s->stats, 0, sizeof s->stats);

    /* prompt[0 .. n-2] through the target, features kept, and the head's
     * rows over them chunk by chunk (so the feature buffer stays small) */
    const int chunk_max = e->shared.max_batch_tokens < HEAD_MAX_ROWS ? e->shared.max_batch_tokens
                                                                     : HEAD_MAX_ROWS;
    while (s->n_past < n - 1) {
        int T = n - 1 - s->n_past;
        if (T > chunk_max)
            T = chunk_max;
        uint8_t want[HEAD_MAX_ROWS];
        memset(want, 1, sizeof want);
        cairn_seq_batch sb = {
            .tokens = s->tokens + s->n_past, .n_tokens = T, .kv_start = s->n_past,
            .pages = pages, .want = want,
        };
        int n_out = 0;
        /* features of this chunk only: the head consumes them right away */
        TRY(cairn_model_forward(e->target, kv_pool, kv, &sb, 1, NULL, s->feat, &n_out));
        s->n_past += T;
        TRY(head_catch_up(s));
    }
    s->begun = true;
    return CAIRN_OK;
}

/* ---- drafting ----------------------------------------------------------- */

/* The best k tokens of logits[n] (descending; ties to the lower id) and
 * their log-probabilities. */
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
static void add_children(cairn_eagle_seq *s, int parent, float *logits)
{
    const int k = s->dp.top_k;
    int32_t ids[MAX_TOP_K];
    float lp[MAX_TOP_K];
    for (int i = 0; i < s->sp.n_logit_bias; i++)
        logits[s->sp.logit_bias[i].token] += s->sp.logit_bias[i].bias;
    top_k_logprobs(logits, s->e->thp.n_vocab, k, ids, lp);
    const float base = parent < 0 ? 0.0f : s->cands[parent].score;
    const int depth = parent < 0 ? 1 : s->cands[parent].depth + 1;
    for (int i = 0; i < k; i++)
        s->cands[s->n_cands++] = (cand){
            .token = ids[i], .parent = (int16_t)parent, .depth = (uint8_t)depth,
            .score = base + lp[i], .head_row = -1,
        };
}

/* Builds the candidate set: level 1 from the root's head logits, then
 * depth-1 expansions of the best top_k nodes of the newest level. */
static int draft_tree(cairn_eagle_seq *s, int depth)
{
    cairn_eagle *e = s->e;
    const int k = s->dp.top_k, dim = e->dim, base = s->n_past;
    s->n_cands = 0;
    add_children(s, -1, s->head_logits);
    int level_start = 0, level_end = s->n_cands, n_rows = 0;
    int32_t frontier[MAX_TOP_K], tokens[MAX_TOP_K], pos[MAX_TOP_K], kv_index[MAX_TOP_K];
    float *feat = s->draft_feat; /* [k][dim] */
    for (int d = 2; d <= depth; d++) {
        /* the best k of the newest level */
        int n_level = level_end - level_start;
        for (int i = 0; i < n_level; i++)
            s->order[i] = level_start + i;
        sort_by_score(s->order, n_level, s->cands);
        const int R = n_level < k ? n_level : k;
        const int n_kv = base + n_rows + R;
        if (n_kv > s->capacity)
            break;
        for (int r = 0; r < R; r++) {
            const int c = s->order[r];
            frontier[r] = c;
            tokens[r] = s->cands[c].token;
            pos[r] = base + s->cands[c].depth - 1;
            kv_index[r] = base + n_rows + r;
            s->cands[c].head_row = (int16_t)(n_rows + r);
            const int p = s->cands[c].parent;
            const float *pf = p < 0 ? s->head_hidden : s->head_hidden + (size_t)(1 + s->cands[p].head_row) * dim;
            memcpy(feat + (size_t)r * dim, pf, (size_t)dim * sizeof(float));
            /* the committed head rows, the expanded ancestors, itself */
            uint8_t *m = s->head_mask + (size_t)r * n_kv;
            memset(m, 1, (size_t)base);
            if (s->shared)
                for (int i = s->kv->page_size - 1; i < base; i += s->kv->page_size)
                    m[i] = 0;
            memset(m + base, 0, (size_t)(n_rows + R));
            m[base + n_rows + r] = 1;
            for (int a = p; a >= 0; a = s->cands[a].parent)
                m[base + s->cands[a].head_row] = 1;
        }
        TRY(head_forward(e, s->kv_pool, s->kv, s->pages, tokens, feat, pos, kv_index, R, n_kv,
                         s->head_mask, s->head_hidden + (size_t)(1 + n_rows) * dim,
                         s->head_logits, R));
        n_rows += R;
        level_start = s->n_cands;
        for (int r = 0; r < R; r++)
            add_children(s, frontier[r], s->head_logits + (size_t)r * e->thp.n_vocab);
        level_end = s->n_cands;
    }
    return CAIRN_OK;
}

/* Chooses the best n candidates and lays out the verification rows: row 0
 * is the root, then the chosen candidates by depth (parents first). */
static void select_tree(cairn_eagle_seq *s, int n)
{
    for (int i = 0; i < s->n_cands; i++)
        s->order[i] = i;
    sort_by_score(s->order, s->n_cands, s->cands);
    if (n > s->n_cands)
        n = s->n_cands;
    /* by depth, then candidate index: parents come before children */
    int32_t *chosen = s->order;
    for (int i = 1; i < n; i++) {
        int32_t v = chosen[i];
        int j = i;
        while (j > 0 && (s->cands[chosen[j - 1]].depth > s->cands[v].depth ||
                         (s->cands[chosen[j - 1]].depth == s->cands[v].depth && chosen[j - 1] > v))) {
            chosen[j] = chosen[j - 1];
            j--;
        }
        chosen[j] = v;
    }
    s->n_tree = 1 + n;
    s->tree_cand[0] = -1;
    s->tree_parent[0] = -1;
    s->tree_tokens[0] = s->tokens[s->n_past];
    s->tree_pos[0] = s->n_past;
    /* each row's parent row: the parent candidate sits in an earlier row */
    for (int r = 1; r <= n; r++) {
        const int c = chosen[r - 1];
        s->tree_cand[r] = c;
        s->tree_tokens[r] = s->cands[c].token;
        s->tree_pos[r] = s->n_past + s->cands[c].depth;
        int parent_row = 0;
        const int pc = s->cands[c].parent;
        if (pc >= 0)
            for (int q = 1; q < r; q++)
                if (s->tree_cand[q] == pc) {
                    parent_row = q;
                    break;
                }
        s->tree_parent[r] = parent_row;
    }
}

/* ---- target distribution (sampling) ------------------------------------ */

static int32_t draw(cairn_eagle_seq *s)
{
    const int n = s->e->thp.n_vocab;
    double total = 0;
    int32_t last = -1;
    for (int i = 0; i < n; i++)
        if (s->probs[i] > 0) {
            total += s->probs[i];
            last = i;
        }
    const double u = cairn_rng_uniform(&s->rng) * total;
    double cum = 0;
    for (int i = 0; i < n; i++) {
        if (s->probs[i] <= 0)
            continue;
        cum += s->probs[i];
        if (u < cum)
            return i;
    }
    return last;
}

/* Walks the verified tree; path[0..*n_path) are the accepted rows (row 0,
 * the root, first) and *next the token that follows them. */
static void accept_path(cairn_eagle_seq *s, int *path, int *n_path, int32_t *next)
{
    const int nv = s->e->thp.n_vocab;
    int row = 0;
    *n_path = 0;
    path[(*n_path)++] = 0;
    for (;;) {
        const float *lg = s->tree_logits + (size_t)row * nv;
        int child = -1;
        int32_t tok;
        if (s->greedy) {
            cairn_sampler_sample(s->target, lg, &tok, NULL, NULL); /* argmax, bias included */
            for (int r = row + 1; r < s->n_tree; r++)
                if (s->tree_parent[r] == row && s->tree_tokens[r] == tok) {
                    child = r;
                    break;
                }
        } else {
            cairn_sampler_probs(s->target, lg, s->probs);
            tok = -1;
            /* children in row order = best draft score first */
            for (int r = row + 1; r < s->n_tree && child < 0; r++) {
                if (s->tree_parent[r] != row)
                    continue;
                const int32_t x = s->tree_tokens[r];
                const double px = s->probs[x];
                /* q is a point mass on x: accept with min(1, p/q) = p(x) */
                if (px > 0 && cairn_rng_uniform(&s->rng) < px) {
                    child = r;
                    tok = x;
                } else if (px > 0) {
                    /* residual max(0, p - q), renormalised: p without x */
                    s->probs[x] = 0;
                    double rest = 0;
                    for (int i = 0; i < nv; i++)
                        rest += s->probs[i];
                    if (rest > 0)
                        for (int i = 0; i < nv; i++)
                            s->probs[i] = (float)(s->probs[i] / rest);
                }
            }
            if (child < 0)
                tok = draw(s);
            if (tok < 0) /* no mass left: cannot happen, as p(x) = 1 is always accepted */
                cairn_sampler_sample(s->target, lg, &tok, NULL, NULL);
        }
        if (child < 0) {
            *next = tok;
            return;
        }
        path[(*n_path)++] = child;
        row = child;
    }
}

int cairn_eagle_seq_step(cairn_eagle_seq *s, int32_t *out, int cap, int *n_out)
{
    if (!s || !out || !n_out || !s->begun || cap < s->dp.depth + 1)
        return CAIRN_EINVAL;
    cairn_eagle *e = s->e;
    const int dim = e->dim;
    const int room = s->capacity - s->n_past; /* KV indices left, root included */
    if (room < 1) {
        s->begun = false;
        return CAIRN_ERANGE;
    }
    s->begun = false; /* until this step completes */

    /* 1. the head catches up with the features of the last step */
    double t0 = cairn_now();
    TRY(head_catch_up(s));
    double t1 = cairn_now();
    s->stats.t_head_update += t1 - t0;

    /* 2. draft, when the head has a root feature and there is room */
    int n_draft = s->dp.n_draft < room - 1 ? s->dp.n_draft : room - 1;
    int depth = s->dp.depth < n_draft ? s->dp.depth : n_draft;
    s->n_cands = 0;
    if (s->n_past > 0 && n_draft > 0) {
        if (s->shared)
            TRY(root_logits(s));
        TRY(draft_tree(s, depth));
        select_tree(s, n_draft);
    } else {
        s->n_tree = 1;
        s->tree_cand[0] = -1;
        s->tree_parent[0] = -1;
        s->tree_tokens[0] = s->tokens[s->n_past];
        s->tree_pos[0] = s->n_past;
    }
    double t2 = cairn_now();
    s->stats.t_draft += t2 - t1;

    /* 3. verify: root and tree in one target forward */
    const int T = s->n_tree, n_kv = s->n_past + T;
    for (int r = 0; r < T; r++) {
        uint8_t *m = s->tree_mask + (size_t)r * n_kv;
        memset(m, 1, (size_t)s->n_past);
        memset(m + s->n_past, 0, (size_t)T);
        for (int a = r; a >= 0; a = s->tree_parent[a])
            m[s->n_past + a] = 1;
    }
    cairn_seq_batch sb = {
        .tokens = s->tree_tokens, .n_tokens = T, .pos = s->tree_pos, .kv_start = s->n_past,
        .pages = s->pages, .mask = s->tree_mask, .want = s->want,
    };
    int n_o = 0;
    TRY(cairn_model_forward(e->target, s->kv_pool, s->kv, &sb, 1, s->tree_logits, s->tree_hidden,
                            &n_o));
    if (n_o != T)
        return CAIRN_EBACKEND;

    /* 4. accept */
    int path[MAX_DEPTH + 2], n_path;
    int32_t next;
    accept_path(s, path, &n_path, &next);

    /* 5. keep: move the accepted rows' KV to consecutive indices (rows only
     * move down, parents before children, so nothing is overwritten early) */
    const cairn_kv_layout *L = s->kv;
    uint8_t *pool = s->kv_pool;
    for (int i = 1; i < n_path; i++) {
        const int src = s->n_past + path[i], dst = s->n_past + i;
        if (src == dst)
            continue;
        const size_t sp = (size_t)s->pages[src / L->page_size] * L->page_bytes;
        const size_t dp = (size_t)s->pages[dst / L->page_size] * L->page_bytes;
        for (int l = 0; l < e->thp.n_layer; l++)
            for (int kv = 0; kv < 2; kv++)
                TRY(cairn_backend_copy(e->be, pool + dp + cairn_kv_offset(L, l, kv, dst % L->page_size),
                                       pool + sp + cairn_kv_offset(L, l, kv, src % L->page_size),
                                       L->row_bytes));
    }
    /* features of the accepted rows, for the head's next catch-up */
    const int pending = s->n_past - s->head_done; /* 0 after catch-up */
    for (int i = 0; i < n_path; i++)
        memcpy(s->feat + (size_t)(pending + i) * dim, s->tree_hidden + (size_t)path[i] * dim,
               (size_t)dim * sizeof(float));
    int n = 0;
    for (int i = 1; i < n_path; i++)
        out[n++] = s->tree_tokens[path[i]];
    out[n++] = next;
    for (int i = 1; i < n_path; i++)
        s->tokens[s->n_past + i] = s->tree_tokens[path[i]];
    s->n_past += n_path;
    s->tokens[s->n_past] = next;
    *n_out = n;

    s->stats.steps++;
    s->stats.tokens += n;
    s->stats.drafted += T - 1;
    s->stats.t_verify += cairn_now() - t2;
    if (s->shared) { /* pages may be shared as soon as the caller has them back */
        s->n_known = s->n_past + 1;
        double t3 = cairn_now();
        TRY(head_catch_up(s));
        s->stats.t_head_update += cairn_now() - t3;
    }
    s->begun = true;
    return CAIRN_OK;
}

/* ---- adopted sequences (server) ------------------------------------------ */

int cairn_eagle_seq_adopt(cairn_eagle_seq *s, void *kv_pool, const cairn_kv_layout *kv,
                          const int32_t *pages, int capacity, const int32_t *tokens,
                          int n_tokens, int n_past)
{
    if (!s || !kv_pool || !kv || !pages || !tokens || n_past < 0 || n_tokens <= n_past ||
        capacity < n_past || kv->page_size <= 0 || n_past % kv->page_size != 0)
        return CAIRN_EINVAL;
    cairn_eagle *e = s->e;
    if (kv->n_layer != e->thp.n_layer + 1 || kv->n_kv_head != e->thp.n_kv_head ||
        kv->head_dim != e->thp.head_dim)
        return CAIRN_EINVAL;
    for (int i = 0; i < n_tokens; i++)
        if (tokens[i] < 0 || tokens[i] >= e->thp.n_vocab)
            return CAIRN_EINVAL;
    s->begun = false;
    s->shared = true;
    s->kv_pool = kv_pool;
    s->kv = kv;
    TRY(seq_resize(s, capacity, n_tokens));
    s->pages = pages;
    memcpy(s->tokens, tokens, (size_t)n_tokens * sizeof *tokens);
    s->n_known = n_tokens;
    s->n_past = n_past;
    s->head_done = n_past; /* row n_past-1 is a page's last: never attended */
    return CAIRN_OK;
}

int cairn_eagle_seq_set_pages(cairn_eagle_seq *s, const int32_t *pages, int capacity)
{
    if (!s || !pages || !s->shared || capacity < s->n_past)
        return CAIRN_EINVAL;
    TRY(seq_resize(s, capacity, s->n_known));
    s->pages = pages;
    return CAIRN_OK;
}

int cairn_eagle_seq_advance(cairn_eagle_seq *s, const int32_t *tokens, int n_tokens,
                            const float *features, int n)
{
    if (!s || !s->shared || !tokens || (n > 0 && !features) || n < 0 ||
        n_tokens < s->n_past + n)
        return CAIRN_EINVAL;
    cairn_eagle *e = s->e;
    const int dim = e->dim;
    s->begun = false;
    if (n_tokens > s->n_known) {
        TRY(seq_resize(s, s->capacity, n_tokens));
        for (int i = s->n_known; i < n_tokens; i++)
            if (tokens[i] < 0 || tokens[i] >= e->thp.n_vocab)
                return CAIRN_EINVAL;
        memcpy(s->tokens + s->n_known, tokens + s->n_known,
               (size_t)(n_tokens - s->n_known) * sizeof *tokens);
    }
    s->n_known = n_tokens;
    /* features in pieces that fit s->feat; after each catch-up at most one
     * row (whose next token is unknown) waits */
    for (int done = 0; done < n;) {
        int m = n - done;
        if (m > HEAD_MAX_ROWS)
            m = HEAD_MAX_ROWS;
        const int pending = s->n_past - s->head_done;
        memcpy(s->feat + (size_t)pending * dim, features + (size_t)done * dim,
               (size_t)m * dim * sizeof(float));
        s->n_past += m;
        done += m;
        int upto = s->n_known - 1 < s->n_past ? s->n_known - 1 : s->n_past;
        double t0 = cairn_now();
        TRY(head_catch_up_to(s, upto));
        s->stats.t_head_update += cairn_now() - t0;
    }
    s->begun = s->n_known > s->n_past && s->head_done == s->n_past && s->n_past > 0;
    return CAIRN_OK;
}
