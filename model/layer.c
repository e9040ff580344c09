/*
 * model/layer.c — one pre-norm decoder layer (model/layer_impl.h), as a
 * sequence of backend ops. Shapes for T rows:
 *
 *   x [T][dim]   h [T][dim]   q, attn [T][q_dim]   k, v [T][kv_dim]
 *   gate, up [T][ffn]          q_dim = n_head * hd, kv_dim = n_kv_head * hd
 */
#include "model/layer_impl.h"

/* Where the matmul call that starts at row r0 of T ends (kernels/backend.h,
 * "Batch invariance"): the first `exact` rows go in calls of at most L rows,
 * so that each comes out the bits it would alone; the rows after them in
 * one call. L <= 0 (any T is invariant, or none is) or T <= L: one call. */
static int call_end(int r0, int T, int exact, int L)
{
    if (L <= 0 || T <= L || r0 >= exact)
        return T;
    return exact - r0 < L ? exact : r0 + L;
}

/* y[T][n_out] = x[T][n_in] · Wᵀ, through the gathered input when W's
 * columns were reordered at load. */
static int linear(cairn_backend *be, float *y, const cairn_layer_weight *w, const float *x,
                  float *gathered, int T, int exact, int n_in, int n_out)
{
    if (w->perm) {
        if (!gathered)
            return CAIRN_EINVAL;
        TRY(be->iface->gather_cols(be, gathered, x, w->perm, T, n_in));
        x = gathered;
    }
    const int L = cairn_backend_matmul_invariant_rows(be, w->type);
    for (int r0 = 0, r1; r0 < T; r0 = r1) {
        r1 = call_end(r0, T, exact, L);
        TRY(be->iface->matmul(be, y + (size_t)r0 * n_out, w->data, w->type,
                              x + (size_t)r0 * n_in, r1 - r0, n_in, n_out));
    }
    return CAIRN_OK;
}

/* Several linears of the same input in one backend call (q, k, v; gate,
 * up), which quantizes the input once and splits all their rows among the
 * workers; one by one when a weight reads its input reordered. */
static int linears(cairn_backend *be, const float *x, float *gathered, int T, int exact, int n_in,
                   int n, const cairn_layer_weight *const w[], float *const y[], const int n_out[])
{
    int fused = n <= 3, L = 0;
    for (int i = 0; i < n && fused; i++) {
        fused = !w[i]->perm;
        const int Li = cairn_backend_matmul_invariant_rows(be, w[i]->type);
        if (Li > 0 && (L == 0 || Li < L))
            L = Li;
    }
    if (!fused) {
        for (int i = 0; i < n; i++)
            TRY(linear(be, y[i], w[i], x, gathered, T, exact, n_in, n_out[i]));
        return CAIRN_OK;
    }
    for (int r0 = 0, r1; r0 < T; r0 = r1) {
        r1 = call_end(r0, T, exact, L);
        cairn_matmul_part parts[3];
        for (int i = 0; i < n; i++)
            parts[i] = (cairn_matmul_part){y[i] + (size_t)r0 * n_out[i], w[i]->data, w[i]->type,
                                           n_out[i]};
        TRY(cairn_backend_matmul_multi(be, x + (size_t)r0 * n_in, r1 - r0, n_in, n, parts));
    }
    return CAIRN_OK;
}

int cairn_layer_forward(cairn_backend *be, const cairn_layer_weights *w,
                        const cairn_layer_shape *s, const cairn_layer_acts *a, int T,
                        const int32_t *pos, const int32_t *slots, void *kv_pool,
                        const cairn_kv_layout *kv, int layer, const cairn_attn_args *attn)
{
    const cairn_backend_iface *op = be->iface;
    const int dim = s->dim, hd = s->head_dim, ffn = s->ffn_dim;
    const int q_dim = s->n_head * hd, kv_dim = s->n_kv_head * hd;

    /* attention block */
    const float *h = a->x;
    int in_dim = dim;
    if (a->attn_in) {
        h = a->attn_in;
        in_dim = a->attn_in_dim;
    } else if (w->attn_norm.data) {
        TRY(op->rmsnorm(be, a->h, a->x, w->attn_norm.data, T, dim, s->rms_eps)); /* [T][dim] */
        h = a->h;
    }
    { /* q [T][q_dim], k and v [T][kv_dim] */
        const cairn_layer_weight *const ws[] = {&w->wq, &w->wk, &w->wv};
        float *const ys[] = {a->q, a->k, a->v};
        const int outs[] = {q_dim, kv_dim, kv_dim};
        TRY(linears(be, h, a->gathered, T, a->exact_rows, in_dim, 3, ws, ys, outs));
    }
    if (w->bq.data)
        TRY(op->add_bias(be, a->q, w->bq.data, T, q_dim));
    if (w->bk.data)
        TRY(op->add_bias(be, a->k, w->bk.data, T, kv_dim));
    if (w->bv.data)
        TRY(op->add_bias(be, a->v, w->bv.data, T, kv_dim));
    if (w->q_norm.data) /* q as [T * n_head][hd] rows, k as [T * n_kv_head][hd] */
        TRY(op->rmsnorm(be, a->q, a->q, w->q_norm.data, T * s->n_head, hd, s->rms_eps));
    if (w->k_norm.data)
        TRY(op->rmsnorm(be, a->k, a->k, w->k_norm.data, T * s->n_kv_head, hd, s->rms_eps));
    TRY(op->rope(be, a->q, T, s->n_head, hd, pos, &s->rope));
    TRY(op->rope(be, a->k, T, s->n_kv_head, hd, pos, &s->rope));
    /* Quantized KV stores k - c: the same shift of every key moves every
     * score of a query by the same q·c, which softmax ignores, while the
     * large constant channels (Qwen's key bias) no longer set the block
     * scales. Exact in the maths; only the rounding of the blocks improves. */
    if (w->k_center.data && (kv->dtype == CAIRN_TYPE_Q8_0 || kv->dtype == CAIRN_TYPE_Q4_0))
        TRY(op->add_bias(be, a->k, w->k_center.data, T, kv_dim));
    TRY(op->kv_store(be, kv_pool, kv, layer, a->k, a->v, slots, T));
    cairn_attn_args args = *attn;
    args.out = a->attn;
    args.q = a->q;
    args.kv_pool = kv_pool;
    args.kv = kv;
    args.layer = layer;
    TRY(op->attention(be, &args));                                          /* [T][q_dim] */
    TRY(linear(be, a->h, &w->wo, a->attn, a->gathered, T, a->exact_rows, q_dim, dim)); /* [T][dim] */
    TRY(op->add(be, a->x, a->x, a->h, (size_t)T * dim));

    /* feed-forward block */
    TRY(op->rmsnorm(be, a->h, a->x, w->ffn_norm.data, T, dim, s->rms_eps));
    { /* gate, up [T][ffn] */
        const cairn_layer_weight *const ws[] = {&w->w_gate, &w->w_up};
        float *const ys[] = {a->gate, a->up};
        const int outs[] = {ffn, ffn};
        TRY(linears(be, a->h, a->gathered, T, a->exact_rows, dim, 2, ws, ys, outs));
    }
    TRY(op->swiglu(be, a->gate, a->gate, a->up, (size_t)T * ffn));
    TRY(linear(be, a->h, &w->w_down, a->gate, a->gathered, T, a->exact_rows, ffn, dim)); /* [T][dim] */
    TRY(op->add(be, a->x, a->x, a->h, (size_t)T * dim));
    return CAIRN_OK;
}
