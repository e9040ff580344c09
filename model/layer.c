/*
 * model/layer.c — one pre-norm decoder layer (model/layer_impl.h), as a
 * sequence of backend ops. Shapes for T rows:
 *
 *   x [T][dim]   h [T][dim]   q, attn [T][q_dim]   k, v [T][kv_dim]
 *   gate, up [T][ffn]          q_dim = n_head * hd, kv_dim = n_kv_head * hd
 */
#include "model/layer_impl.h"

#include <math.h>

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

/* The gate's activation of a gated FFN. */
typedef enum { ACT_SILU, ACT_GELU, ACT_SWIGLU_CLAMPED } ffn_act;

/* Biases of a gated FFN's three projections (data NULL: none). */
typedef struct {
    const float *gate, *up, *down;
} ffn_biases;

/* out[T][dim] = (act(in·Wgᵀ + bg) * (in·Wuᵀ + bu))·Wdᵀ + bd: the gated FFN
 * of a dense layer, of one expert over the rows that chose it, and of
 * qwen2moe's shared expert; act SiLU, GELU, or gpt-oss's clamped SwiGLU
 * (s->swiglu_alpha, s->swiglu_limit). gate and up hold [T][ff]; out may
 * be in, which is read only before out is written. */
static int gated_ffn(cairn_backend *be, const cairn_layer_weight *w_gate,
                     const cairn_layer_weight *w_up, const cairn_layer_weight *w_down,
                     const ffn_biases *bias, const float *in, float *gathered, int T, int exact,
                     int dim, int ff, ffn_act act, const cairn_layer_shape *s, float *gate,
                     float *up, float *out)
{
    const cairn_layer_weight *const ws[] = {w_gate, w_up};
    float *const ys[] = {gate, up};
    const int outs[] = {ff, ff};
    TRY(linears(be, in, gathered, T, exact, dim, 2, ws, ys, outs)); /* [T][ff] each */
    if (bias && bias->gate)
        TRY(be->iface->add_bias(be, gate, bias->gate, T, ff));
    if (bias && bias->up)
        TRY(be->iface->add_bias(be, up, bias->up, T, ff));
    if (act == ACT_GELU)
        TRY(be->iface->geglu(be, gate, gate, up, (size_t)T * ff));
    else if (act == ACT_SWIGLU_CLAMPED) {
        if (!be->iface->swiglu_clamped)
            return CAIRN_EUNSUPPORTED;
        TRY(be->iface->swiglu_clamped(be, gate, gate, up, (size_t)T * ff, s->swiglu_alpha,
                                      s->swiglu_limit));
    } else
        TRY(be->iface->swiglu(be, gate, gate, up, (size_t)T * ff));
    TRY(linear(be, out, w_down, gate, gathered, T, exact, ff, dim)); /* [T][dim] */
    if (bias && bias->down)
        TRY(be->iface->add_bias(be, out, bias->down, T, dim));
    return CAIRN_OK;
}

/* v[0..n) = softmax(v), summed in double about the largest. */
static void softmax_in_place(float *v, int n)
{
    float mx = v[0];
    for (int i = 1; i < n; i++)
        mx = v[i] > mx ? v[i] : mx;
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += (double)(v[i] = expf(v[i] - mx));
    for (int i = 0; i < n; i++)
        v[i] = (float)(v[i] / sum);
}

/* Each row's experts from the router's logits in mh->probs [T][E] (host):
 * softmax, the top k (ties to the lower index), their weights (renormalised
 * to sum 1 when `norm`, times `scale`), gathered per expert into rows /
 * weights / count. The rows of an expert come out ascending, and every
 * step depends on the row alone, so a token's experts and weights are the
 * same whatever else is in the batch. */
static void route_tokens(const cairn_moe_host *mh, int T, int E, int k, bool norm, float scale,
                         bool softmax_chosen)
{
    for (int e = 0; e < E; e++)
        mh->count[e] = 0;
    for (int t = 0; t < T; t++) {
        float *p = mh->probs + (size_t)t * E;
        if (!softmax_chosen) /* probabilities of all E first */
            softmax_in_place(p, E);
        /* the top k by repeated selection (k is small: 2 to 10) */
        int chosen[CAIRN_MOE_MAX_USED];
        float w[CAIRN_MOE_MAX_USED];
        double wsum = 0;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int i = 0; i < j && !taken; i++)
                    taken = chosen[i] == e;
                if (!taken && (best < 0 || p[e] > p[best]))
                    best = e;
            }
            chosen[j] = best;
            w[j] = p[best];
        }
        if (softmax_chosen) /* logits of the k chosen -> their softmax */
            softmax_in_place(w, k);
        for (int j = 0; j < k; j++)
            wsum += w[j];
        /* renormalised as llama.cpp does: the sum clamped to F16's smallest
         * normal, so a row of underflowed probabilities cannot divide by 0 */
        const double div = norm ? (wsum > 6.103515625e-5 ? wsum : 6.103515625e-5) : 1.0;
        for (int j = 0; j < k; j++) {
            const int e = chosen[j];
            mh->rows[(size_t)e * T + mh->count[e]] = t;
            mh->weights[(size_t)e * T + mh->count[e]] = (float)(w[j] / div) * scale;
            mh->count[e]++;
        }
    }
}

/* How many of the n rows (ascending) are among the leading `exact` ones. */
static int exact_among(const int32_t *rows, int n, int exact)
{
    int c = 0;
    while (c < n && rows[c] < exact)
        c++;
    return c;
}

/* x += the mixture-of-experts FFN of h (layer_impl.h). */
static int moe_ffn(cairn_backend *be, const cairn_layer_weights *w, const cairn_layer_shape *s,
                   const cairn_layer_acts *a, int T)
{
    const cairn_backend_iface *op = be->iface;
    const int dim = s->dim, E = s->n_expert, eff = s->expert_ffn_dim;
    const cairn_moe_host *mh = a->moe_host;
    if (!mh || s->n_expert_used > CAIRN_MOE_MAX_USED)
        return CAIRN_EINVAL;
    /* router logits [T][E], to the host to choose */
    TRY(linear(be, a->router, &w->router, a->h, NULL, T, a->exact_rows, dim, E));
    if (w->router_b.data)
        TRY(op->add_bias(be, a->router, w->router_b.data, T, E));
    TRY(op->download(be, mh->probs, a->router, (size_t)T * E * sizeof(float)));
    TRY(cairn_backend_synchronize(be));
    route_tokens(mh, T, E, s->n_expert_used, s->expert_norm, s->expert_weights_scale,
                 s->expert_softmax_chosen);
    const ffn_act act = s->swiglu_limit > 0 ? ACT_SWIGLU_CLAMPED : ACT_SILU;

    for (int e = 0; e < E; e++) { /* ascending: each row adds its experts in one order */
        const int n = mh->count[e];
        if (n == 0)
            continue;
        const int32_t *rows = mh->rows + (size_t)e * T;
        const int exact = exact_among(rows, n, a->exact_rows);
        /* moe_in [n][dim]: the rows that chose e */
        TRY(op->get_rows(be, a->moe_in, a->h, CAIRN_TYPE_F32, dim, rows, n));
        const ffn_biases b = {
            w->exp_gate_b.data ? (const float *)w->exp_gate_b.data + (size_t)e * eff : NULL,
            w->exp_up_b.data ? (const float *)w->exp_up_b.data + (size_t)e * eff : NULL,
            w->exp_down_b.data ? (const float *)w->exp_down_b.data + (size_t)e * dim : NULL};
        TRY(gated_ffn(be, &w->exp_gate[e], &w->exp_up[e], &w->exp_down[e], &b, a->moe_in,
                      a->gathered, n, exact, dim, eff, act, s, a->moe_gate, a->moe_up,
                      a->moe_out));
        TRY(op->add_rows_scaled(be, a->x, a->moe_out, rows, mh->weights + (size_t)e * T, n,
                                dim));
    }
    if (w->sh_gate.data) { /* qwen2moe: every row, gated by sigmoid(h·w_s) */
        TRY(linear(be, a->router, &w->sh_router, a->h, NULL, T, a->exact_rows, dim, 1));
        TRY(op->download(be, mh->probs, a->router, (size_t)T * sizeof(float)));
        TRY(gated_ffn(be, &w->sh_gate, &w->sh_up, &w->sh_down, NULL, a->h, a->gathered, T,
                      a->exact_rows, dim, s->shared_ffn_dim, ACT_SILU, s, a->moe_gate, a->moe_up,
                      a->moe_out));
        TRY(cairn_backend_synchronize(be)); /* the gate's logits are on the host now */
        for (int t = 0; t < T; t++)
            mh->weights[t] = 1.0f / (1.0f + expf(-mh->probs[t]));
        TRY(op->add_rows_scaled(be, a->x, a->moe_out, mh->all, mh->weights, T, dim));
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
    args.sinks = w->sinks.data;
    TRY(op->attention(be, &args));                                          /* [T][q_dim] */
    TRY(linear(be, a->h, &w->wo, a->attn, a->gathered, T, a->exact_rows, q_dim, dim)); /* [T][dim] */
    if (w->bo.data)
        TRY(op->add_bias(be, a->h, w->bo.data, T, dim));
    if (w->attn_post_norm.data)
        TRY(op->rmsnorm(be, a->h, a->h, w->attn_post_norm.data, T, dim, s->rms_eps));
    TRY(op->add(be, a->x, a->x, a->h, (size_t)T * dim));

    /* feed-forward block */
    TRY(op->rmsnorm(be, a->h, a->x, w->ffn_norm.data, T, dim, s->rms_eps));
    if (w->router.data)
        return moe_ffn(be, w, s, a, T);
    TRY(gated_ffn(be, &w->w_gate, &w->w_up, &w->w_down, NULL, a->h, a->gathered, T,
                  a->exact_rows, dim, ffn, s->gelu ? ACT_GELU : ACT_SILU, s, a->gate, a->up,
                  a->h)); /* [T][dim] */
    if (w->ffn_post_norm.data)
        TRY(op->rmsnorm(be, a->h, a->h, w->ffn_post_norm.data, T, dim, s->rms_eps));
    TRY(op->add(be, a->x, a->x, a->h, (size_t)T * dim));
    return CAIRN_OK;
}
