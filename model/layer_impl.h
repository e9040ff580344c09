/*
 * model/layer_impl.h — internal to model/: one pre-norm decoder layer on a
 * backend, the piece the model's forward pass repeats n_layer times and an
 * EAGLE head runs once. Nothing outside model/ includes this.
 *
 *   h  = rmsnorm(x) * attn_norm          (no attn_norm: h = x, EAGLE's layer)
 *   q  = h·Wqᵀ (+bq), k = h·Wkᵀ (+bk), v = h·Wvᵀ (+bv)
 *   (q, k per head: rmsnorm(q_h) * q_norm, rmsnorm(k_h) * k_norm, on qwen3)
 *   q, k = rope(q, pos), rope(k, pos);  KV pages[slot(t)] <- k[t], v[t]
 *   x += attention(q, paged KV)·Woᵀ
 *   h  = rmsnorm(x) * ffn_norm
 *   x += (silu(h·Wgᵀ) * (h·Wuᵀ))·Wdᵀ
 */
#ifndef CAIRN_ENGINE_LAYER_IMPL_H
#define CAIRN_ENGINE_LAYER_IMPL_H

#include "model/model.h"

/* Return a failed status at once: a forward pass is a sequence of backend
 * calls, any of which may fail (model.c, eagle.c and layer.c use it). */
#define TRY(call)                                                                                  \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != CAIRN_OK)                                                                       \
            return rc_;                                                                            \
    } while (0)

typedef struct {
    const void *data; /* backend memory; NULL: absent */
    cairn_type type;
    /* backend I32 [n_in] or NULL: the matmul reads its input in this order
     * (in[j] = x[perm[j]]), for weights whose columns were sorted at load
     * (GPTQ act-order, ckpt/ckpt.h) */
    const int32_t *perm;
} cairn_layer_weight;

typedef struct {
    cairn_layer_weight attn_norm;  /* [dim] F32; data NULL: no input norm      */
    cairn_layer_weight wq, wk, wv; /* [q_dim | kv_dim][dim]                      */
    cairn_layer_weight bq, bk, bv; /* [q_dim | kv_dim] F32 biases, or data NULL  */
    cairn_layer_weight q_norm, k_norm; /* [head_dim] F32 RMSNorm weights applied to
                                      every head of q and k before RoPE (qwen3),
                                      or data NULL                             */
    cairn_layer_weight k_center;   /* [kv_dim] F32 or data NULL: minus the part of
                                      every key that RoPE leaves (almost) in
                                      place, added to k before a quantized KV
                                      type stores it (model.c, k_centers)     */
    cairn_layer_weight wo;         /* [dim][q_dim]                               */
    cairn_layer_weight ffn_norm;   /* [dim] F32                                  */
    cairn_layer_weight w_gate, w_up, w_down; /* [ffn][dim], [ffn][dim], [dim][ffn] */
} cairn_layer_weights;

typedef struct {
    int dim, n_head, n_kv_head, head_dim, ffn_dim;
    float rms_eps;
    cairn_rope_params rope;
} cairn_layer_shape;

/* Activations, backend memory, room for the call's T rows each. */
typedef struct {
    float *x;           /* [T][dim] the residual stream, updated in place */
    float *h;           /* [T][dim] scratch                               */
    float *q, *attn;    /* [T][n_head * head_dim]                         */
    float *k, *v;       /* [T][n_kv_head * head_dim]                      */
    float *gate, *up;   /* [T][ffn_dim]                                   */
    /* Optional: what q/k/v read instead of the (normed) x, [T][attn_in_dim]
     * (EAGLE-3's [normed embedding ; normed feature], 2*dim wide). */
    const float *attn_in;
    int attn_in_dim;
    /* [T][max(dim, q_dim, ffn_dim)]: a matmul input gathered for a weight
     * with a perm; NULL when no weight has one */
    float *gathered;
    /* The leading rows that must come out as they would alone (decode and
     * verification rows; kernels/backend.h, "Batch invariance"): their
     * matmuls run in calls the backend keeps row-invariant. 0: none. */
    int exact_rows;
} cairn_layer_acts;

/* One layer for T rows at RoPE positions pos[T] (host), their K/V stored at
 * KV slots[T] (host) of `layer`. `attn` gives the attention's sequences, scale and head count;
 * out, q, kv_pool, kv and layer are filled in here. */
int cairn_layer_forward(cairn_backend *be, const cairn_layer_weights *w,
                        const cairn_layer_shape *s, const cairn_layer_acts *a, int T,
                        const int32_t *pos, const int32_t *slots, void *kv_pool,
                        const cairn_kv_layout *kv, int layer, const cairn_attn_args *attn);

#endif /* CAIRN_ENGINE_LAYER_IMPL_H */
