/*
 * model/eagle3.c — EAGLE-3 heads (Li et al. 2025): loading and the head's
 * forward pass. The contract is in model/model.h ("EAGLE-3 heads").
 *
 * A head row reads the target's states entering three of its layers (low,
 * mid, high; cairn_model_set_feature_layers) fused by fc, or, deeper in a
 * draft tree, the head's own pre-norm output for its parent, and the
 * embedding of the next token:
 *
 *   h   = fc · [s_low ; s_mid ; s_high]          (committed rows)
 *       | the parent row's output x               (draft rows)
 *   a   = [rmsnorm(embed(token)) * attn_norm ; rmsnorm(h) * hidden_norm]
 *   x   = h + attention(a·Wq, a·Wk, a·Wv) · Woᵀ   (q/k/v over 2*dim)
 *   x  += ffn(rmsnorm(x) * ffn_norm)
 *   logits = (rmsnorm(x) * output_norm) · outputᵀ  over the draft vocabulary;
 *   draft id d is target id d + d2t[d].
 */
#include "model/eagle_impl.h"
#include "model/layer_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

struct cairn_eagle3 {
    cairn_model *target;
    cairn_backend *be;
    cairn_model_shared shared;
    cairn_hparams thp;
    int dim, n_head, n_kv_head, head_dim, ffn_dim, n_draft_vocab;
    int layers[3];
    float rms_eps;
    uint8_t fingerprint[16];

    void *weights_mem;
    cairn_layer_weight fc, hidden_norm, output_norm, output;
    cairn_layer_weights layer; /* attn_norm is the embedding's norm, applied here */
    int32_t *d2t;              /* host [n_draft_vocab] */

    /* activations, backend memory, CAIRN_EAGLE3_MAX_ROWS rows */
    float *in3, *emb, *cat, *x, *h, *q, *k, *v, *attn, *gate, *up, *logits;
    int32_t slots[CAIRN_EAGLE3_MAX_ROWS], pos[CAIRN_EAGLE3_MAX_ROWS],
        q_index[CAIRN_EAGLE3_MAX_ROWS];
};

static int find(const cairn_gguf *g, const char *path, const char *name, int64_t ne0, int64_t ne1,
                const cairn_gguf_tensor **t, char *err, size_t n)
{
    *t = cairn_gguf_find_tensor(g, name);
    if (!*t)
        return cairn_errorf(err, n, CAIRN_EFORMAT, "%s: EAGLE-3 head: missing tensor '%s'", path,
                            name);
    const cairn_gguf_tensor *x = *t;
    int64_t rest = 1;
    for (int d = 2; d < x->n_dims; d++)
        rest *= x->ne[d];
    if (x->ne[0] != ne0 || x->ne[1] != ne1 || rest != 1)
        return cairn_errorf(err, n, CAIRN_EFORMAT,
                            "%s: EAGLE-3 head: tensor '%s' has shape [%lld, %lld], the target "
                            "needs [%lld, %lld]",
                            path, name, (long long)x->ne[0], (long long)x->ne[1],
                            (long long)ne0, (long long)ne1);
    const cairn_type_traits *tr = cairn_type_get(x->type);
    const bool ints = strcmp(name, "d2t") == 0;
    if (ints ? x->type != CAIRN_TYPE_I32
             : (!tr || !tr->compute || (ne1 == 1 && x->type != CAIRN_TYPE_F32)))
        return cairn_errorf(err, n, CAIRN_EUNSUPPORTED, "%s: EAGLE-3 head: tensor '%s' has type %s",
                            path, name, tr ? tr->name : "?");
    return CAIRN_OK;
}

static int meta_u32(const cairn_gguf *g, const char *path, const char *key, uint32_t *out,
                    char *err, size_t n)
{
    if (cairn_gguf_get_u32(g, key, out) != CAIRN_OK)
        return cairn_errorf(err, n, CAIRN_EFORMAT, "%s: EAGLE-3 head: missing or invalid '%s'",
                            path, key);
    return CAIRN_OK;
}

static int load_head(cairn_eagle3 *e, const cairn_gguf *g, const char *path, char *err, size_t n)
{
    const char *arch;
    size_t arch_len;
    if (cairn_gguf_get_str(g, "general.architecture", &arch, &arch_len) != CAIRN_OK ||
        strcmp(arch, "eagle3") != 0)
        return cairn_errorf(err, n, CAIRN_EFORMAT,
                            "%s: not an EAGLE-3 head (general.architecture must be 'eagle3')",
                            path);
    uint32_t dim, ffn, n_head, n_kv, nvd;
    int rc;
    if ((rc = meta_u32(g, path, "eagle3.embedding_length", &dim, err, n)) ||
        (rc = meta_u32(g, path, "eagle3.feed_forward_length", &ffn, err, n)) ||
        (rc = meta_u32(g, path, "eagle3.attention.head_count", &n_head, err, n)) ||
        (rc = meta_u32(g, path, "eagle3.vocab_size", &nvd, err, n)))
        return rc;
    if (cairn_gguf_get_u32(g, "eagle3.attention.head_count_kv", &n_kv) != CAIRN_OK)
        n_kv = n_head;
    float eps = e->thp.rms_eps;
    (void)cairn_gguf_get_f32(g, "eagle3.attention.layer_norm_rms_epsilon", &eps);
    const cairn_hparams *t = &e->thp;
    if (dim == 0 || n_head == 0 || n_kv == 0 || ffn == 0 || ffn > (1u << 20) || dim % n_head ||
        n_head % n_kv || nvd == 0 || nvd > (uint32_t)t->n_vocab)
        return cairn_errorf(err, n, CAIRN_EFORMAT, "%s: EAGLE-3 head: inconsistent shape", path);
    if ((int)dim != t->dim || (int)n_kv != t->n_kv_head || (int)(dim / n_head) != t->head_dim)
        return cairn_errorf(err, n, CAIRN_EFORMAT,
                            "%s: EAGLE-3 head (dim %u, %u KV heads of %u) does not fit the "
                            "target (dim %d, %d KV heads of %d)",
                            path, dim, n_kv, dim / n_head, t->dim, t->n_kv_head, t->head_dim);
    cairn_gguf_vtype vt;
    uint64_t n_layers = 0;
    const void *layer_data = NULL;
    if (cairn_gguf_get_arr(g, "eagle3.target_layers", &vt, &n_layers, &layer_data) != CAIRN_OK ||
        n_layers != 3 || (vt != CAIRN_GGUF_INT32 && vt != CAIRN_GGUF_UINT32) || !layer_data)
        return cairn_errorf(err, n, CAIRN_EFORMAT,
                            "%s: EAGLE-3 head: 'eagle3.target_layers' must list 3 layers", path);
    for (int i = 0; i < 3; i++) {
        int32_t l;
        memcpy(&l, (const uint8_t *)layer_data + 4 * i, 4);
        if (l < 0 || l > t->n_layer)
            return cairn_errorf(err, n, CAIRN_EFORMAT,
                                "%s: EAGLE-3 head reads layer %d; the target has %d", path, l,
                                t->n_layer);
        e->layers[i] = l;
    }
    e->dim = (int)dim;
    e->n_head = (int)n_head;
    e->n_kv_head = (int)n_kv;
    e->head_dim = (int)(dim / n_head);
    e->ffn_dim = (int)ffn;
    e->n_draft_vocab = (int)nvd;
    e->rms_eps = eps;
    const int64_t qd = (int64_t)n_head * e->head_dim, kvd = (int64_t)n_kv * e->head_dim;

    struct {
        const char *name;
        int64_t ne0, ne1;
        cairn_layer_weight *w;
        const cairn_gguf_tensor *t;
    } spec[] = {
        {"fc.weight", 3 * (int64_t)dim, dim, &e->fc, NULL},
        {"blk.0.attn_norm.weight", dim, 1, &e->layer.attn_norm, NULL},
        {"blk.0.hidden_norm.weight", dim, 1, &e->hidden_norm, NULL},
        {"blk.0.attn_q.weight", 2 * (int64_t)dim, qd, &e->layer.wq, NULL},
        {"blk.0.attn_k.weight", 2 * (int64_t)dim, kvd, &e->layer.wk, NULL},
        {"blk.0.attn_v.weight", 2 * (int64_t)dim, kvd, &e->layer.wv, NULL},
        {"blk.0.attn_output.weight", qd, dim, &e->layer.wo, NULL},
        {"blk.0.ffn_norm.weight", dim, 1, &e->layer.ffn_norm, NULL},
        {"blk.0.ffn_gate.weight", dim, ffn, &e->layer.w_gate, NULL},
        {"blk.0.ffn_up.weight", dim, ffn, &e->layer.w_up, NULL},
        {"blk.0.ffn_down.weight", ffn, dim, &e->layer.w_down, NULL},
        {"output_norm.weight", dim, 1, &e->output_norm, NULL},
        {"output.weight", dim, nvd, &e->output, NULL},
    };
    const int n_spec = (int)(sizeof spec / sizeof spec[0]);
    size_t total = 0;
    for (int i = 0; i < n_spec; i++) {
        if ((rc = find(g, path, spec[i].name, spec[i].ne0, spec[i].ne1, &spec[i].t, err, n)))
            return rc;
        total += (spec[i].t->size + 63) & ~(size_t)63;
    }
    const cairn_gguf_tensor *d2t;
    if ((rc = find(g, path, "d2t", nvd, 1, &d2t, err, n)))
        return rc;
    e->d2t = malloc((size_t)nvd * sizeof *e->d2t);
    if (!e->d2t)
        return CAIRN_ENOMEM;
    memcpy(e->d2t, d2t->data, (size_t)nvd * sizeof *e->d2t);
    for (uint32_t d = 0; d < nvd; d++)
        if ((int64_t)d + e->d2t[d] < 0 || (int64_t)d + e->d2t[d] >= t->n_vocab)
            return cairn_errorf(err, n, CAIRN_EFORMAT,
                                "%s: EAGLE-3 head: d2t maps draft id %u outside the target's "
                                "vocabulary",
                                path, d);

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
        rc = be->iface->upload(be, dst, x->data, x->size);
        *spec[i].w = (cairn_layer_weight){dst, x->type, NULL};
        dst += (x->size + 63) & ~(size_t)63;
        uint32_t type = (uint32_t)x->type;
        XXH3_128bits_update(hs, x->name, strlen(x->name) + 1);
        XXH3_128bits_update(hs, &type, sizeof type);
        XXH3_128bits_update(hs, x->ne, sizeof x->ne);
        XXH3_128bits_update(hs, x->data, x->size);
    }
    XXH3_128bits_update(hs, e->d2t, (size_t)nvd * sizeof *e->d2t);
    XXH3_128bits_update(hs, e->layers, sizeof e->layers);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(hs));
    XXH3_freeState(hs);
    memcpy(e->fingerprint, c.digest, 16);
    if (rc != CAIRN_OK)
        return cairn_errorf(err, n, rc, "%s: uploading the head's weights failed", path);

    const size_t R = CAIRN_EAGLE3_MAX_ROWS;
    struct {
        float **p;
        size_t n;
    } bufs[] = {
        {&e->in3, R * 3 * dim},  {&e->emb, R * dim},        {&e->cat, R * 2 * dim},
        {&e->x, R * dim},        {&e->h, R * dim},          {&e->q, R * qd},
        {&e->k, R * kvd},        {&e->v, R * kvd},          {&e->attn, R * qd},
        {&e->gate, R * ffn},     {&e->up, R * ffn},         {&e->logits, R * nvd},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if ((rc = be->iface->alloc(be, bufs[i].n * sizeof(float), (void **)bufs[i].p)))
            return cairn_errorf(err, n, rc, "%s: cannot allocate the head's activations", path);
    return CAIRN_OK;
}

int cairn_eagle3_load(const char *path, cairn_model *target, cairn_eagle3 **out, char *err,
                      size_t err_len)
{
    if (!path || !target || !out)
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "cairn_eagle3_load: missing argument");
    /* A head re-embeds tokens through the target's table; Gemma's targets
     * scale their embeddings by sqrt(dim), which no head here is built for. */
    if (strcmp(cairn_model_hparams(target)->arch, "gemma3") == 0)
        return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                            "%s: EAGLE heads for a gemma3 target are not supported", path);
    cairn_eagle3 *e = calloc(1, sizeof *e);
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
        cairn_eagle3_free(e);
        return rc;
    }
    *out = e;
    return CAIRN_OK;
}

void cairn_eagle3_free(cairn_eagle3 *e)
{
    if (!e)
        return;
    float *bufs[] = {e->in3, e->emb, e->cat, e->x, e->h, e->q,
                     e->k,   e->v,   e->attn, e->gate, e->up, e->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i])
            e->be->iface->free(e->be, bufs[i]);
    if (e->weights_mem)
        e->be->iface->free(e->be, e->weights_mem);
    free(e->d2t);
    free(e);
}

void cairn_eagle3_fingerprint(const cairn_eagle3 *e, uint8_t out[16])
{
    memcpy(out, e->fingerprint, 16);
}

void cairn_eagle3_target_layers(const cairn_eagle3 *e, int out[3])
{
    memcpy(out, e->layers, sizeof e->layers);
}

int cairn_eagle3_draft_vocab(const cairn_eagle3 *e)
{
    return e->n_draft_vocab;
}

int32_t cairn_eagle3_target_token(const cairn_eagle3 *e, int32_t draft_id)
{
    if (draft_id < 0 || draft_id >= e->n_draft_vocab)
        return -1;
    return draft_id + e->d2t[draft_id];
}

int cairn_eagle3_forward(cairn_eagle3 *e, const cairn_eagle3_rows *r, float *hidden,
                         float *logits, int n_logit_rows)
{
    const int R = r ? r->n_rows : 0;
    if (!e || !r || R <= 0 || R > CAIRN_EAGLE3_MAX_ROWS || !r->tokens || !r->features ||
        !r->pos || !r->kv_index || !r->pages || !r->kv_pool || !r->kv || n_logit_rows < 0 ||
        n_logit_rows > R || (n_logit_rows > 0 && !logits))
        return CAIRN_EINVAL;
    cairn_backend *be = e->be;
    const cairn_backend_iface *op = be->iface;
    const int dim = e->dim, hd = e->head_dim;
    const cairn_kv_layout *kv = r->kv;
    if (r->kv_layer < 0 || r->kv_layer >= kv->n_layer)
        return CAIRN_EINVAL;
    for (int i = 0; i < R; i++) {
        if (r->tokens[i] < 0 || r->tokens[i] >= e->thp.n_vocab)
            return CAIRN_EINVAL;
        e->slots[i] = r->pages[r->kv_index[i] / kv->page_size] * kv->page_size +
                      r->kv_index[i] % kv->page_size;
        e->pos[i] = r->pos[i];
        e->q_index[i] = r->kv_index[i];
    }
    const size_t row = (size_t)dim * sizeof(float);
    /* h [R][dim]: fused target states, or the parents' outputs */
    if (r->fused) {
        TRY(op->upload(be, e->in3, r->features, (size_t)R * 3 * row));
        TRY(op->matmul(be, e->x, e->fc.data, e->fc.type, e->in3, R, 3 * dim, dim));
    } else {
        TRY(op->upload(be, e->x, r->features, (size_t)R * row));
    }
    /* cat [R][2*dim] = [rmsnorm(embed) * attn_norm ; rmsnorm(h) * hidden_norm] */
    TRY(op->get_rows(be, e->emb, e->shared.tok_embd, e->shared.tok_embd_type, dim, r->tokens, R));
    TRY(op->rmsnorm(be, e->emb, e->emb, e->layer.attn_norm.data, R, dim, e->rms_eps));
    TRY(op->rmsnorm(be, e->h, e->x, e->hidden_norm.data, R, dim, e->rms_eps));
    for (int i = 0; i < R; i++) {
        TRY(cairn_backend_copy(be, e->cat + (size_t)i * 2 * dim, e->emb + (size_t)i * dim, row));
        TRY(cairn_backend_copy(be, e->cat + (size_t)i * 2 * dim + dim, e->h + (size_t)i * dim,
                               row));
    }
    cairn_layer_weights w = e->layer;
    w.attn_norm = (cairn_layer_weight){0}; /* applied above, to the embedding only */
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
        .gate = e->gate, .up = e->up, .attn_in = e->cat, .attn_in_dim = 2 * dim,
    };
    const cairn_attn_seq seq = {
        .q_start = 0, .n_q = R, .n_kv = r->n_kv, .q_index = e->q_index, .pages = r->pages,
        .mask = r->mask,
    };
    const cairn_attn_args attn = {
        .n_head = e->n_head, .scale = 1.0f / sqrtf((float)hd), .n_seqs = 1, .seqs = &seq,
    };
    TRY(cairn_layer_forward(be, &w, &shape, &acts, R, e->pos, e->slots, r->kv_pool, kv,
                            r->kv_layer, &attn)); /* x [R][dim], before the norm */
    if (hidden)
        TRY(op->download(be, hidden, e->x, (size_t)R * row));
    if (n_logit_rows > 0) {
        float *last = e->h; /* scratch: the normed rows */
        TRY(op->rmsnorm(be, last, e->x + (size_t)(R - n_logit_rows) * dim, e->output_norm.data,
                        n_logit_rows, dim, e->rms_eps));
        TRY(op->matmul(be, e->logits, e->output.data, e->output.type, last, n_logit_rows, dim,
                       e->n_draft_vocab));
        TRY(op->download(be, logits, e->logits,
                         (size_t)n_logit_rows * e->n_draft_vocab * sizeof(float)));
    }
    return cairn_backend_synchronize(be);
}

int cairn_eagle3_project(cairn_eagle3 *e, const float *hidden, int n, float *logits)
{
    if (!e || !hidden || !logits || n <= 0 || n > CAIRN_EAGLE3_MAX_ROWS)
        return CAIRN_EINVAL;
    cairn_backend *be = e->be;
    const cairn_backend_iface *op = be->iface;
    TRY(op->upload(be, e->x, hidden, (size_t)n * e->dim * sizeof(float)));
    TRY(op->rmsnorm(be, e->h, e->x, e->output_norm.data, n, e->dim, e->rms_eps));
    TRY(op->matmul(be, e->logits, e->output.data, e->output.type, e->h, n, e->dim,
                   e->n_draft_vocab));
    TRY(op->download(be, logits, e->logits, (size_t)n * e->n_draft_vocab * sizeof(float)));
    return cairn_backend_synchronize(be);
}

cairn_model *cairn_eagle3_target(const cairn_eagle3 *e)
{
    return e->target;
}
