/*
 * model/medusa.c — Medusa heads (Cai et al. 2024): K small heads on the
 * target's final feature, head k guessing the token k+1 places past the
 * next one, and the sparse draft tree their guesses make. The contract is
 * in model/model.h ("Medusa heads").
 *
 * For a feature f (the target's hidden state after the output norm at the
 * last token with KV), head k computes
 *
 *   h = f;  for each residual block j:  h += silu(h·W_jᵀ + b_j)
 *   logits_k = h · output_kᵀ        (its own LM head, or the target's)
 *
 * The heads are independent given f, so a path t_1 .. t_d of the tree has
 * the log-probability sum_k log p_k(t_k), and the best rows under a budget
 * are the best paths: they are enumerated best first (a path's children
 * never score above it, so every chosen row's parent is chosen first).
 */
#include "model/eagle_impl.h"
#include "model/layer_impl.h"
#include "model/spec_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

struct cairn_medusa {
    cairn_model *target;
    cairn_backend *be;
    cairn_model_shared shared;
    int dim, n_vocab, n_heads, n_layers;
    uint8_t fingerprint[16];

    void *weights_mem;
    cairn_layer_weight res_w[CAIRN_MEDUSA_MAX_HEADS][CAIRN_MEDUSA_MAX_LAYERS];
    cairn_layer_weight res_b[CAIRN_MEDUSA_MAX_HEADS][CAIRN_MEDUSA_MAX_LAYERS];
    cairn_layer_weight output[CAIRN_MEDUSA_MAX_HEADS]; /* the target's when absent */

    /* activations, backend memory: one feature row through every head */
    float *f, *h, *t, *ones, *logits; /* logits [n_heads][n_vocab] */
    float *host_logits;               /* [n_heads][n_vocab] */
};

static int meta_u32(const cairn_gguf *g, const char *path, const char *key, uint32_t *out,
                    char *err, size_t n)
{
    if (cairn_gguf_get_u32(g, key, out) != CAIRN_OK)
        return cairn_errorf(err, n, CAIRN_EFORMAT, "%s: Medusa head: missing or invalid '%s'",
                            path, key);
    return CAIRN_OK;
}

/* `name` with shape [ne0, ne1] (ne1 = 1: a vector, which must be F32). */
static int find(const cairn_gguf *g, const char *path, const char *name, int64_t ne0, int64_t ne1,
                bool optional, const cairn_gguf_tensor **t, char *err, size_t n)
{
    *t = cairn_gguf_find_tensor(g, name);
    if (!*t)
        return optional ? CAIRN_OK
                        : cairn_errorf(err, n, CAIRN_EFORMAT,
                                       "%s: Medusa head: missing tensor '%s'", path, name);
    const cairn_gguf_tensor *x = *t;
    int64_t rest = 1;
    for (int d = 2; d < x->n_dims; d++)
        rest *= x->ne[d];
    if (x->ne[0] != ne0 || x->ne[1] != ne1 || rest != 1)
        return cairn_errorf(err, n, CAIRN_EFORMAT,
                            "%s: Medusa head: tensor '%s' has shape [%lld, %lld], the target "
                            "needs [%lld, %lld]",
                            path, name, (long long)x->ne[0], (long long)x->ne[1],
                            (long long)ne0, (long long)ne1);
    const cairn_type_traits *tr = cairn_type_get(x->type);
    if (!tr || !tr->compute || (ne1 == 1 && x->type != CAIRN_TYPE_F32))
        return cairn_errorf(err, n, CAIRN_EUNSUPPORTED,
                            "%s: Medusa head: tensor '%s' has type %s", path, name,
                            tr ? tr->name : "?");
    return CAIRN_OK;
}

static int load_heads(cairn_medusa *m, const cairn_gguf *g, const char *path, char *err,
                      size_t n)
{
    const char *arch;
    size_t arch_len;
    if (cairn_gguf_get_str(g, "general.architecture", &arch, &arch_len) != CAIRN_OK ||
        strcmp(arch, "medusa") != 0)
        return cairn_errorf(err, n, CAIRN_EFORMAT,
                            "%s: not a Medusa head (general.architecture must be 'medusa')",
                            path);
    uint32_t n_heads, n_layers, dim, n_vocab = 0;
    int rc;
    if ((rc = meta_u32(g, path, "medusa.head_count", &n_heads, err, n)) ||
        (rc = meta_u32(g, path, "medusa.layer_count", &n_layers, err, n)) ||
        (rc = meta_u32(g, path, "medusa.embedding_length", &dim, err, n)))
        return rc;
    if (n_heads < 1 || n_heads > CAIRN_MEDUSA_MAX_HEADS || n_layers > CAIRN_MEDUSA_MAX_LAYERS)
        return cairn_errorf(err, n, CAIRN_EFORMAT,
                            "%s: Medusa head: %u heads of %u residual blocks (cairn takes 1..%d "
                            "heads of 0..%d blocks)",
                            path, n_heads, n_layers, CAIRN_MEDUSA_MAX_HEADS,
                            CAIRN_MEDUSA_MAX_LAYERS);
    const cairn_hparams *t = cairn_model_hparams(m->target);
    if (cairn_gguf_get_u32(g, "medusa.vocab_size", &n_vocab) != CAIRN_OK)
        n_vocab = (uint32_t)t->n_vocab;
    if ((int)dim != t->dim || (int)n_vocab != t->n_vocab)
        return cairn_errorf(err, n, CAIRN_EFORMAT,
                            "%s: Medusa head (dim %u, vocabulary %u) does not fit the target "
                            "(dim %d, vocabulary %d)",
                            path, dim, n_vocab, t->dim, t->n_vocab);
    m->dim = (int)dim;
    m->n_vocab = (int)n_vocab;
    m->n_heads = (int)n_heads;
    m->n_layers = (int)n_layers;

    enum { MAX_T = CAIRN_MEDUSA_MAX_HEADS * (2 * CAIRN_MEDUSA_MAX_LAYERS + 1) };
    const cairn_gguf_tensor *tensors[MAX_T];
    cairn_layer_weight *dest[MAX_T];
    int n_t = 0;
    size_t total = 0;
    char name[96];
    for (int i = 0; i < m->n_heads; i++) {
        for (int j = 0; j < m->n_layers; j++) {
            snprintf(name, sizeof name, "medusa.%d.res.%d.weight", i, j);
            if ((rc = find(g, path, name, dim, dim, false, &tensors[n_t], err, n)))
                return rc;
            dest[n_t++] = &m->res_w[i][j];
            snprintf(name, sizeof name, "medusa.%d.res.%d.bias", i, j);
            if ((rc = find(g, path, name, dim, 1, false, &tensors[n_t], err, n)))
                return rc;
            dest[n_t++] = &m->res_b[i][j];
        }
        snprintf(name, sizeof name, "medusa.%d.output.weight", i);
        if ((rc = find(g, path, name, dim, n_vocab, true, &tensors[n_t], err, n)))
            return rc;
        if (tensors[n_t])
            dest[n_t++] = &m->output[i];
        else /* a head without an LM head of its own reads the target's */
            m->output[i] = (cairn_layer_weight){m->shared.output, m->shared.output_type, NULL};
    }
    for (int i = 0; i < n_t; i++)
        total += (tensors[i]->size + 63) & ~(size_t)63;

    cairn_backend *be = m->be;
    if (total && (rc = be->iface->alloc(be, total, &m->weights_mem)) != CAIRN_OK)
        return cairn_errorf(err, n, rc, "%s: cannot allocate the Medusa weights", path);
    XXH3_state_t *hs = XXH3_createState();
    if (!hs)
        return CAIRN_ENOMEM;
    XXH3_128bits_reset(hs);
    uint8_t *dst = m->weights_mem;
    for (int i = 0; i < n_t && rc == CAIRN_OK; i++) {
        const cairn_gguf_tensor *x = tensors[i];
        rc = be->iface->upload(be, dst, x->data, x->size);
        *dest[i] = (cairn_layer_weight){dst, x->type, NULL};
        dst += (x->size + 63) & ~(size_t)63;
        uint32_t type = (uint32_t)x->type;
        XXH3_128bits_update(hs, x->name, strlen(x->name) + 1);
        XXH3_128bits_update(hs, &type, sizeof type);
        XXH3_128bits_update(hs, x->ne, sizeof x->ne);
        XXH3_128bits_update(hs, x->data, x->size);
    }
    /* heads that read the target's LM head differ from heads that do not */
    uint32_t shape[2] = {n_heads, n_layers};
    XXH3_128bits_update(hs, shape, sizeof shape);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(hs));
    XXH3_freeState(hs);
    memcpy(m->fingerprint, c.digest, 16);
    if (rc != CAIRN_OK)
        return cairn_errorf(err, n, rc, "%s: uploading the Medusa weights failed", path);

    const size_t row = (size_t)m->dim * sizeof(float);
    const size_t lg = (size_t)m->n_heads * m->n_vocab * sizeof(float);
    if ((rc = be->iface->alloc(be, row, (void **)&m->f)) ||
        (rc = be->iface->alloc(be, row, (void **)&m->h)) ||
        (rc = be->iface->alloc(be, row, (void **)&m->t)) ||
        (rc = be->iface->alloc(be, row, (void **)&m->ones)) ||
        (rc = be->iface->alloc(be, lg, (void **)&m->logits)))
        return cairn_errorf(err, n, rc, "%s: cannot allocate the Medusa activations", path);
    m->host_logits = malloc(lg);
    float *ones = malloc(row);
    if (!m->host_logits || !ones) {
        free(ones);
        return CAIRN_ENOMEM;
    }
    for (int i = 0; i < m->dim; i++)
        ones[i] = 1.0f;
    /* silu(a) = swiglu(a, 1): the backend has no silu of its own */
    rc = be->iface->upload(be, m->ones, ones, row);
    free(ones);
    return rc;
}

int cairn_medusa_load(const char *path, cairn_model *target, cairn_medusa **out, char *err,
                      size_t err_len)
{
    if (!path || !target || !out)
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "cairn_medusa_load: missing argument");
    cairn_medusa *m = calloc(1, sizeof *m);
    if (!m)
        return CAIRN_ENOMEM;
    m->target = target;
    m->be = cairn_model_backend(target);
    cairn_model_eagle_shared(target, &m->shared);
    cairn_gguf *g = NULL;
    int rc = cairn_gguf_open(path, &g, err, err_len);
    if (rc == CAIRN_OK)
        rc = load_heads(m, g, path, err, err_len);
    cairn_gguf_close(g);
    if (rc != CAIRN_OK) {
        cairn_medusa_free(m);
        return rc;
    }
    *out = m;
    return CAIRN_OK;
}

void cairn_medusa_free(cairn_medusa *m)
{
    if (!m)
        return;
    float *bufs[] = {m->f, m->h, m->t, m->ones, m->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i])
            m->be->iface->free(m->be, bufs[i]);
    if (m->weights_mem)
        m->be->iface->free(m->be, m->weights_mem);
    free(m->host_logits);
    free(m);
}

void cairn_medusa_fingerprint(const cairn_medusa *m, uint8_t out[16])
{
    memcpy(out, m->fingerprint, 16);
}

int cairn_medusa_head_count(const cairn_medusa *m)
{
    return m->n_heads;
}

cairn_model *cairn_medusa_target(const cairn_medusa *m)
{
    return m->target;
}

/* ======================================================================== */
/* Forward and draft tree                                                   */
/* ======================================================================== */

int cairn_medusa_logits(cairn_medusa *m, const float *feature, float *logits)
{
    if (!m || !feature || !logits)
        return CAIRN_EINVAL;
    cairn_backend *be = m->be;
    const cairn_backend_iface *op = be->iface;
    const int d = m->dim;
    const size_t row = (size_t)d * sizeof(float);
    TRY(op->upload(be, m->f, feature, row));
    for (int i = 0; i < m->n_heads; i++) {
        const float *h = m->f;
        if (m->n_layers > 0) {
            TRY(cairn_backend_copy(be, m->h, m->f, row));
            h = m->h;
        }
        for (int j = 0; j < m->n_layers; j++) {
            TRY(op->matmul(be, m->t, m->res_w[i][j].data, m->res_w[i][j].type, m->h, 1, d, d));
            TRY(op->add_bias(be, m->t, m->res_b[i][j].data, 1, d));
            TRY(op->swiglu(be, m->t, m->t, m->ones, (size_t)d));
            TRY(op->add(be, m->h, m->h, m->t, (size_t)d));
        }
        TRY(op->matmul(be, m->logits + (size_t)i * m->n_vocab, m->output[i].data,
                       m->output[i].type, h, 1, d, m->n_vocab));
    }
    TRY(op->download(be, logits, m->logits, (size_t)m->n_heads * m->n_vocab * sizeof(float)));
    return cairn_backend_synchronize(be);
}

/* A path not yet chosen: the chosen row it extends (-1: the root), its depth
 * (= the head whose guess it ends in, 1-based) and the rank of that guess. */
typedef struct {
    float score;
    int16_t parent;
    uint8_t depth, rank;
} medusa_cand;

int cairn_medusa_draft(cairn_medusa *m, const float *logits, const cairn_sampling_params *sp,
                       int depth, int top_k, int budget, int32_t *tokens, int32_t *parents,
                       int *n_rows)
{
    if (!m || !logits || !tokens || !parents || !n_rows || top_k < 1 ||
        top_k > CAIRN_MEDUSA_MAX_TOP_K || budget < 0 || budget > CAIRN_MEDUSA_MAX_ROWS)
        return CAIRN_EINVAL;
    *n_rows = 0;
    if (depth > m->n_heads)
        depth = m->n_heads;
    if (depth < 1 || budget == 0)
        return CAIRN_OK;
    const int nv = m->n_vocab;
    if (top_k > nv)
        top_k = nv;
    /* each head's best guesses, with the request's logit bias: a forced
     * token must be guessable (verification is lossless either way) */
    int32_t ids[CAIRN_MEDUSA_MAX_HEADS][CAIRN_MEDUSA_MAX_TOP_K];
    float lp[CAIRN_MEDUSA_MAX_HEADS][CAIRN_MEDUSA_MAX_TOP_K];
    float *row = malloc((size_t)nv * sizeof(float));
    if (!row)
        return CAIRN_ENOMEM;
    for (int k = 0; k < depth; k++) {
        memcpy(row, logits + (size_t)k * nv, (size_t)nv * sizeof(float));
        for (int b = 0; sp && b < sp->n_logit_bias; b++)
            row[sp->logit_bias[b].token] += sp->logit_bias[b].bias;
        spec_top_k_logprobs(row, nv, top_k, ids[k], lp[k]);
    }
    free(row);

    /* Best-first enumeration of paths: choosing a path makes its first
     * child and its next sibling candidates, which reaches every path after
     * all better ones. Deeper levels keep fewer children (top_k halved per
     * level, at least 2), Medusa's sparse shape: the guesses of farther
     * heads are right less often, so their low ranks rarely pay. */
    int width[CAIRN_MEDUSA_MAX_HEADS];
    for (int k = 0; k < depth; k++) {
        width[k] = top_k >> k;
        if (width[k] < 2)
            width[k] = top_k < 2 ? top_k : 2;
    }
    medusa_cand heap[2 * CAIRN_MEDUSA_MAX_ROWS + 2];
    int n_heap = 0;
    float path_score[CAIRN_MEDUSA_MAX_ROWS];
#define HEAP_LESS(a, b) ((a).score < (b).score)
#define HEAP_PUSH(c)                                                                               \
    do {                                                                                           \
        int at_ = n_heap++;                                                                        \
        heap[at_] = (c);                                                                           \
        while (at_ > 0 && HEAP_LESS(heap[(at_ - 1) / 2], heap[at_])) {                             \
            medusa_cand tmp_ = heap[at_];                                                          \
            heap[at_] = heap[(at_ - 1) / 2];                                                       \
            heap[(at_ - 1) / 2] = tmp_;                                                            \
            at_ = (at_ - 1) / 2;                                                                   \
        }                                                                                          \
    } while (0)
    HEAP_PUSH(((medusa_cand){.score = lp[0][0], .parent = -1, .depth = 1, .rank = 0}));
    int n = 0;
    while (n < budget && n_heap > 0) {
        const medusa_cand c = heap[0];
        heap[0] = heap[--n_heap];
        for (int at = 0;;) { /* sift down */
            int l = 2 * at + 1, r = l + 1, best = at;
            if (l < n_heap && HEAP_LESS(heap[best], heap[l]))
                best = l;
            if (r < n_heap && HEAP_LESS(heap[best], heap[r]))
                best = r;
            if (best == at)
                break;
            medusa_cand tmp = heap[at];
            heap[at] = heap[best];
            heap[best] = tmp;
            at = best;
        }
        const int k = c.depth - 1;
        tokens[n] = ids[k][c.rank];
        parents[n] = c.parent;
        path_score[n] = c.score;
        const float base = c.parent < 0 ? 0.0f : path_score[c.parent];
        if (c.rank + 1 < width[k])
            HEAP_PUSH(((medusa_cand){.score = base + lp[k][c.rank + 1], .parent = c.parent,
                                     .depth = c.depth, .rank = (uint8_t)(c.rank + 1)}));
        if (c.depth < depth)
            HEAP_PUSH(((medusa_cand){.score = c.score + lp[k + 1][0], .parent = (int16_t)n,
                                     .depth = (uint8_t)(c.depth + 1), .rank = 0}));
        n++;
    }
#undef HEAP_PUSH
#undef HEAP_LESS
    *n_rows = n;
    return CAIRN_OK;
}
