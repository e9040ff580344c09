/*
 * model/layer_impl.h — internal to model/: one pre-norm decoder layer on a
 * backend, the piece the model's forward pass repeats n_layer times and an
 * EAGLE head runs once. Nothing outside model/ includes this.
 *
 *   h  = rmsnorm(x) * attn_norm          (no attn_norm: h = x, EAGLE's layer)
 *   q  = h·Wqᵀ (+bq), k = h·Wkᵀ (+bk), v = h·Wvᵀ (+bv)
 *   (q, k per head: rmsnorm(q_h) * q_norm, rmsnorm(k_h) * k_norm, on qwen3)
 *   q, k = rope(q, pos), rope(k, pos);  KV pages[slot(t)] <- k[t], v[t]
 *   x += attention(q, paged KV)·Woᵀ       (gemma3: x += rmsnorm(that) * attn_post_norm)
 *   h  = rmsnorm(x) * ffn_norm
 *   x += (silu(h·Wgᵀ) * (h·Wuᵀ))·Wdᵀ      (gemma3: gelu for silu, then the
 *                                          sum normed by ffn_post_norm)
 *
 * With experts (qwen3moe, qwen2moe, Mixtral) the FFN line becomes
 *   p  = softmax(h·Wrᵀ)                    p [T][n_expert], on the host
 *   for each token, its top k experts E with weights w_e = p_e (/ sum, when
 *   renormalised):   x += Σ_e w_e · (silu(h·Wg_eᵀ) * (h·Wu_eᵀ))·Wd_eᵀ
 *   (qwen2moe, every token:  x += sigmoid(h·w_s) · shared FFN(h))
 * computed expert by expert over the rows that chose it, so each expert's
 * weights are read once per call and an expert no token chose not at all.
 *
 * gpt-oss on top of that: biases on q/k/v, on the attention output and on
 * the router and every expert projection; a per-head attention sink in the
 * softmax; the top k chosen on the router's logits and only those k
 * softmaxed (w = softmax(r_E)); the expert's gate clamped SwiGLU
 *   a = g' sigmoid(1.702 g') (u' + 1),  g' = min(g, 7), u' = clamp(u, -7, 7).
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
    cairn_layer_weight bo;         /* [dim] F32 output bias (gpt-oss), or data NULL */
    cairn_layer_weight sinks;      /* [n_head] F32 attention sinks (gpt-oss), or NULL */
    cairn_layer_weight attn_post_norm; /* [dim] F32 norm of the attention output
                                      before the residual add (gemma3), or
                                      data NULL                                */
    cairn_layer_weight ffn_norm;   /* [dim] F32                                  */
    cairn_layer_weight w_gate, w_up, w_down; /* [ffn][dim], [ffn][dim], [dim][ffn] */
    cairn_layer_weight ffn_post_norm; /* [dim] F32 norm of the FFN output before
                                      the residual add (gemma3), or data NULL */
    /* Mixture of experts (w_gate, w_up, w_down are then absent): */
    cairn_layer_weight router;     /* [n_expert][dim], or data NULL: dense FFN   */
    cairn_layer_weight router_b;   /* [n_expert] F32 router bias, or data NULL   */
    const cairn_layer_weight *exp_gate, *exp_up; /* [n_expert] of [eff][dim]     */
    const cairn_layer_weight *exp_down;          /* [n_expert] of [dim][eff]     */
    /* F32 biases of every expert's projections, or data NULL (gpt-oss):
     * [n_expert][eff], [n_expert][eff], [n_expert][dim] */
    cairn_layer_weight exp_gate_b, exp_up_b, exp_down_b;
    cairn_layer_weight sh_gate, sh_up;  /* [sff][dim] shared expert (qwen2moe),
                                           or data NULL                          */
    cairn_layer_weight sh_down;         /* [dim][sff]                            */
    cairn_layer_weight sh_router;       /* [1][dim]: its gate, sigmoid(h·w)      */
} cairn_layer_weights;

typedef struct {
    int dim, n_head, n_kv_head, head_dim, ffn_dim;
    float rms_eps;
    cairn_rope_params rope;
    bool gelu; /* the FFN gate is GELU (tanh form, Gemma's GeGLU), not SiLU */
    /* experts (weights.router set): cairn_hparams' fields of the same names */
    int n_expert, n_expert_used, expert_ffn_dim, shared_ffn_dim;
    bool expert_norm;
    float expert_weights_scale;
    bool expert_softmax_chosen; /* the top k by logit, then softmax over those k
                                   (gpt-oss); else softmax, then the top k  */
    float swiglu_limit;   /* > 0: the experts' clamped SwiGLU at this limit   */
    float swiglu_alpha;   /*      and sigmoid slope (gpt-oss: 7 and 1.702)    */
} cairn_layer_shape;

/* The most experts a token may choose: the router's choice is kept on the
 * stack (the families cairn runs choose 2 to 10; model.c refuses more). */
#define CAIRN_MOE_MAX_USED 64

/* Host scratch of a mixture-of-experts FFN, room for T rows. */
typedef struct {
    float *probs;   /* [T][n_expert] the router's logits, then probabilities */
    int32_t *rows;  /* [n_expert][T] the rows that chose each expert, ascending */
    float *weights; /* [n_expert][T] their router weights                     */
    int *count;     /* [n_expert]                                               */
    int32_t *all;   /* [T] 0 .. T-1 (the shared expert's rows)                  */
} cairn_moe_host;

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
    /* Mixture of experts only (else NULL): backend buffers router [T][n_expert],
     * moe_in and moe_out [T][dim], moe_gate and moe_up [T][max(eff, sff)];
     * host scratch moe_host. */
    float *router, *moe_in, *moe_out, *moe_gate, *moe_up;
    const cairn_moe_host *moe_host;
} cairn_layer_acts;

/* One layer for T rows at RoPE positions pos[T] (host), their K/V stored at
 * KV slots[T] (host) of `layer`. `attn` gives the attention's sequences, scale, head count
 * and window (a local layer's); out, q, kv_pool, kv and layer are filled in here. */
int cairn_layer_forward(cairn_backend *be, const cairn_layer_weights *w,
                        const cairn_layer_shape *s, const cairn_layer_acts *a, int T,
                        const int32_t *pos, const int32_t *slots, void *kv_pool,
                        const cairn_kv_layout *kv, int layer, const cairn_attn_args *attn);

#endif /* CAIRN_ENGINE_LAYER_IMPL_H */
