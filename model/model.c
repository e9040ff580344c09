/*
 * model/model.c — loading a llama-family GGUF (llama, incl. Llama 3, Mistral
 * and Mixtral; qwen2, qwen3, gemma3, qwen3moe, qwen2moe) onto a backend and
 * the batched forward pass over paged KV.
 *
 * The forward pass, for T new tokens spread over several sequences:
 *
 *   x = embed(tokens)                                   x   [T][dim]
 *   for each layer l:                                   (model/layer.c) 
 *       h  = rmsnorm(x) * attn_norm                     h   [T][dim]
 *       q  = h·Wqᵀ, k = h·Wkᵀ, v = h·Wvᵀ                q   [T][n_head*hd]
 *            (+ bq, bk, bv on qwen2)                    k,v [T][n_kv*hd]
 *       q, k = rope(q, pos), rope(k, pos)
 *       KV pages[slot(t)] <- k[t], v[t]
 *       a  = attention(q, paged KV of t's sequence)     a   [T][n_head*hd]
 *       x += a·Woᵀ
 *       h  = rmsnorm(x) * ffn_norm
 *       x += (silu(h·Wgᵀ) * (h·Wuᵀ))·Wdᵀ                 ffn [T][ffn_dim]
 *   y = rmsnorm(x[wanted rows]) * output_norm           y   [n_out][dim]
 *   logits = y·Woutᵀ                                    [n_out][n_vocab]
 *
 * The architectures differ only in the arch_traits below: how RoPE pairs the
 * dimensions of a head, whether q/k/v carry biases, Gemma's norms, gate and
 * windows, and experts in place of the FFN. Llama 3's long-context
 * RoPE (rope_freqs.weight, one divisor per frequency) is a tensor, used
 * whenever the file has it; YaRN is built into the same divisors at load
 * (yarn_divisors), its magnitude scale into the attention scale.
 *
 * Every buffer used here is allocated once at load time for the largest batch
 * (max_batch_tokens); a forward call allocates nothing.
 */
#include "model/model.h"
#include "model/layer_impl.h"

#include "ckpt/ckpt.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* Logit rows are projected and downloaded in chunks of this many, so the
 * device buffer for them stays small even for 150k-token vocabularies. */
#define LOGIT_CHUNK 32

typedef cairn_layer_weight weight; /* backend memory */
/* bq, bk, bv: data NULL when the architecture has none */
typedef cairn_layer_weights layer_weights;

/* What differs between the architectures cairn runs. All are the same
 * pre-norm decoder (RMSNorm, RoPE, grouped-query attention, a gated FFN).
 *
 * Gemma 3 on top of the others: the embeddings are scaled by sqrt(dim);
 * the attention output and the FFN output are each normed again before
 * they join the residual stream (post_attention_norm, post_ffw_norm); the
 * FFN gate is GELU (tanh form) instead of SiLU; five local layers with a
 * sliding window and their own RoPE base alternate with one global layer.
 * Its GGUF norm weights already hold Gemma's (1 + w) (the converter adds
 * the 1), so every norm here is the plain rmsnorm(x) * w.
 *
 * Mixture-of-experts FFNs (layer.c, moe_ffn): qwen3moe and qwen2moe are
 * qwen3's and qwen2's attention with experts (qwen2moe: a shared expert
 * too, and the chosen weights not renormalised); a llama file with
 * expert_count is Mixtral.
 *
 * gpt-oss is qwen2's attention (q/k/v biases, NEOX RoPE, here with YaRN on
 * every layer) with an output bias and a learned sink per head, local
 * (128-token window) and global layers alternating, and experts on every
 * layer with biases, a clamped SwiGLU, and the top k chosen on the router's
 * logits before a softmax over those k (layer_impl.h). Its FFN input norm
 * is stored as post_attention_norm. Its experts come as MXFP4: multiplied as
 * they are by the CPU and CUDA backends, rewritten as Q5_0 at load for a
 * backend without MXFP4 kernels (upload_mxfp4). */
typedef struct {
    const char *name;          /* general.architecture and the metadata prefix */
    cairn_rope_mode rope_mode; /* llama: adjacent pairs; qwen2: first/second half */
    bool qkv_bias;             /* attn_{q,k,v}.bias tensors are required */
    bool qk_norm;              /* attn_{q,k}_norm: per-head RMSNorm of q and k */
    bool gemma;                /* the Gemma 3 differences above */
    int experts;               /* 0: dense; 1: experts if the file has them
                                  (llama: Mixtral); 2: experts required */
    bool shared_expert;        /* qwen2moe's gated shared expert */
    bool expert_norm;          /* the chosen experts' weights renormalised */
    bool oss;                  /* the gpt-oss differences above */
} arch_traits;

static const arch_traits ARCHES[] = {
    {"llama", CAIRN_ROPE_NORMAL, false, false, false, 1, false, true, false},
    {"qwen2", CAIRN_ROPE_NEOX, true, false, false, 0, false, false, false},
    {"qwen3", CAIRN_ROPE_NEOX, false, true, false, 0, false, false, false},
    {"gemma3", CAIRN_ROPE_NEOX, false, true, true, 0, false, false, false},
    {"qwen3moe", CAIRN_ROPE_NEOX, false, true, false, 2, false, true, false},
    {"qwen2moe", CAIRN_ROPE_NEOX, true, false, false, 2, true, false, false},
    {"gpt-oss", CAIRN_ROPE_NEOX, true, false, false, 2, false, false, true},
};

struct cairn_model {
    cairn_backend *be;
    cairn_hparams hp;
    cairn_model_params params;
    const arch_traits *arch;
    float attn_scale; /* multiplies q·k: 1/sqrt(head_dim), except Gemma 3 27B */
    uint8_t fingerprint[16];

    void *weights_mem; /* one backend allocation for all tensors */
    float *k_centers;  /* backend [n_layer][kv_dim], or NULL (k_centers) */
    size_t token_weight_bytes; /* cairn_model_token_weight_bytes */
    weight tok_embd, output_norm, output;
    const float *rope_freqs; /* optional, backend memory */
    layer_weights *layers;
    /* mixture of experts: every layer's expert matrices, [n_layer][3][n_expert]
     * (gate, up, down), which layers[l].exp_* point into; and while loading,
     * the GGUF views of one expert each that are uploaded into them */
    weight *expert_weights;
    cairn_gguf_tensor *expert_views;

    /* activations, backend memory, sized for max_batch_tokens rows */
    float *x, *h, *q, *k, *v, *attn, *ffn_gate, *ffn_up, *out_rows, *logits;
    /* mixture of experts only: backend buffers and host scratch (layer_impl.h) */
    float *router, *moe_in, *moe_out, *moe_gate, *moe_up;
    cairn_moe_host moe_host;
    bool has_perms;  /* a weight reads its input reordered (layer_weight.perm) */
    float *gathered; /* [max_batch_tokens][max matmul input], when has_perms */
    /* host staging, sized for max_batch_tokens / max_seqs */
    int32_t *tokens, *pos, *slots, *q_index, *out_index;
    cairn_attn_seq *attn_seqs;
    /* Batch invariance (kernels/backend.h): when the backend's matmul keeps
     * a row to itself only up to exact_max rows (> 0), stage_batch puts the
     * sequences that must not depend on their batch first (exact_rows of
     * them) and caller_row maps a staged row back to the caller's order
     * (for the per-token features); exact_max <= 0: the caller's order. */
    int exact_max, exact_rows;
    bool reordered;
    int32_t *caller_row; /* [max_batch_tokens] */
    int32_t *seq_out;    /* [max_seqs] a sequence's first logits row, staging */

    /* cairn_model_set_feature_layers: the layers whose input state
     * forward_features returns (none: the final normed state) */
    int feature_layers[CAIRN_MAX_FEATURE_LAYERS], n_feature_layers;
    float *layer_states;      /* backend [n][max_batch_tokens][dim] */
    float *layer_states_host; /* the same on the host, for interleaving */

    /* cairn_model_forward_keep: every wanted row's logits, left in backend
     * memory for sampling there; [logits_keep_rows][n_vocab], grown to the
     * largest n_out asked for (none until the first such call). */
    float *logits_keep;
    int logits_keep_rows;
};

/* ---- hyper-parameters -------------------------------------------------- */

static int get_u32_or(const cairn_gguf *g, const char *key, uint32_t dflt, uint32_t *out)
{
    int rc = cairn_gguf_get_u32(g, key, out);
    if (rc == CAIRN_ENOTFOUND) {
        *out = dflt;
        return CAIRN_OK;
    }
    return rc;
}

static int get_f32_or(const cairn_gguf *g, const char *key, float dflt, float *out)
{
    int rc = cairn_gguf_get_f32(g, key, out);
    if (rc == CAIRN_ENOTFOUND) {
        *out = dflt;
        return CAIRN_OK;
    }
    return rc;
}

/* "<arch>.<suffix>": every hyper-parameter key is prefixed by the
 * architecture's name. */
static const char *arch_key(const arch_traits *a, const char *suffix)
{
    static _Thread_local char key[96];
    snprintf(key, sizeof key, "%s.%s", a->name, suffix);
    return key;
}

/* The mixture-of-experts keys (none for a dense model). Only the softmax
 * router is implemented; another gating function is refused by name. */
static int read_experts(const cairn_gguf *g, const char *path, const arch_traits *A,
                        cairn_hparams *hp, char *err, size_t err_len)
{
    uint32_t n_expert = 0, n_used = 0, ffe = 0, ffs = 0, gating = 1;
    float scale = 0;
    if (A->experts == 0)
        return CAIRN_OK;
    if (get_u32_or(g, arch_key(A, "expert_count"), 0, &n_expert) ||
        get_u32_or(g, arch_key(A, "expert_used_count"), 0, &n_used))
        return cairn_errorf(err, err_len, CAIRN_EFORMAT, "%s: invalid %s", path,
                            arch_key(A, "expert_count / expert_used_count"));
    if (n_expert == 0 && A->experts == 1)
        return CAIRN_OK; /* a dense llama */
    if (n_expert == 0 || n_expert > 1024 || n_used == 0 || n_used > n_expert ||
        n_used > CAIRN_MOE_MAX_USED)
        return cairn_errorf(err, err_len, CAIRN_EFORMAT,
                            "%s: %s %u with %s %u is inconsistent", path,
                            "expert_count", n_expert, "expert_used_count", n_used);
    /* Mixtral's experts are feed_forward_length wide; the Qwen MoE files
     * give expert_feed_forward_length (qwen3moe falls back to
     * feed_forward_length / expert_used_count, as llama.cpp does) */
    const uint32_t ffe_default = A->experts == 1 ? (uint32_t)hp->ffn_dim
                                                 : (uint32_t)hp->ffn_dim / n_used;
    if (get_u32_or(g, arch_key(A, "expert_feed_forward_length"), ffe_default, &ffe) ||
        ffe == 0 || ffe > (1u << 20))
        return cairn_errorf(err, err_len, CAIRN_EFORMAT, "%s: invalid %s", path,
                            arch_key(A, "expert_feed_forward_length"));
    if (A->shared_expert &&
        (get_u32_or(g, arch_key(A, "expert_shared_feed_forward_length"), (uint32_t)hp->ffn_dim,
                    &ffs) ||
         ffs == 0 || ffs > (1u << 20)))
        return cairn_errorf(err, err_len, CAIRN_EFORMAT, "%s: invalid %s", path,
                            arch_key(A, "expert_shared_feed_forward_length"));
    if (get_f32_or(g, arch_key(A, "expert_weights_scale"), 0, &scale) || !isfinite(scale) ||
        scale < 0)
        return cairn_errorf(err, err_len, CAIRN_EFORMAT, "%s: invalid %s", path,
                            arch_key(A, "expert_weights_scale"));
    /* llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE: 1 softmax over all experts,
     * then the top k; 3 the top k, then softmax over them (gpt-oss's, which
     * its files do not name) */
    const uint32_t gating_default = A->oss ? 3 : 1;
    if (get_u32_or(g, arch_key(A, "expert_gating_func"), gating_default, &gating) ||
        gating != gating_default)
        return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                            "%s: %s %u is not supported (only %u for %s)", path,
                            arch_key(A, "expert_gating_func"), gating, gating_default, A->name);
    if (A->oss) { /* llama.cpp's constants for gpt-oss's SwiGLU */
        hp->expert_softmax_chosen = true;
        hp->swiglu_limit = 7.0f;
        hp->swiglu_alpha = 1.702f;
    }
    hp->n_expert = (int)n_expert;
    hp->n_expert_used = (int)n_used;
    hp->expert_ffn_dim = (int)ffe;
    hp->shared_ffn_dim = (int)ffs;
    hp->expert_norm = A->expert_norm;
    hp->expert_weights_scale = scale == 0 ? 1.0f : scale; /* 0: absent, as in llama.cpp */
    return CAIRN_OK;
}

/* YaRN's parameters, as llama.cpp reads them: rope.scaling.factor, the
 * trained context rope.scaling.original_context_length (default: the
 * context length), the correction range yarn_beta_fast / yarn_beta_slow
 * (32 and 1), and rope.scaling.attn_factor multiplying the magnitude
 * scale. The variants cairn does not build (a partial extrapolation mix, a
 * DeepSeek log multiplier, another attention factor) are refused. */
static int read_yarn(const cairn_gguf *g, const char *path, const arch_traits *A, uint32_t n_ctx,
                     cairn_hparams *hp, char *err, size_t err_len)
{
    float factor = 0, fast, slow, attn, ext, log_mul, yarn_attn;
    uint32_t orig;
    if (get_f32_or(g, arch_key(A, "rope.scaling.factor"), 0, &factor) || !(factor >= 1) ||
        factor > 1024)
        return cairn_errorf(err, err_len, CAIRN_EFORMAT, "%s: YaRN needs %s >= 1", path,
                            arch_key(A, "rope.scaling.factor"));
    if (get_u32_or(g, arch_key(A, "rope.scaling.original_context_length"), n_ctx, &orig) ||
        orig == 0 || get_f32_or(g, arch_key(A, "rope.scaling.yarn_beta_fast"), 32, &fast) ||
        get_f32_or(g, arch_key(A, "rope.scaling.yarn_beta_slow"), 1, &slow) || !(fast > 0) ||
        !(slow > 0) || get_f32_or(g, arch_key(A, "rope.scaling.attn_factor"), 1, &attn) ||
        !(attn > 0) || !isfinite(attn))
        return cairn_errorf(err, err_len, CAIRN_EFORMAT, "%s: invalid YaRN parameters (%s...)",
                            path, arch_key(A, "rope.scaling"));
    if (get_f32_or(g, arch_key(A, "rope.scaling.yarn_ext_factor"), 1, &ext) || ext != 1 ||
        get_f32_or(g, arch_key(A, "rope.scaling.yarn_log_multiplier"), 0, &log_mul) ||
        log_mul != 0 || get_f32_or(g, arch_key(A, "rope.scaling.yarn_attn_factor"), 1, &yarn_attn) ||
        yarn_attn != 1)
        return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                            "%s: YaRN with %s other than 1, %s or %s is not supported", path,
                            arch_key(A, "rope.scaling.yarn_ext_factor"),
                            "rope.scaling.yarn_log_multiplier", "rope.scaling.yarn_attn_factor");
    /* rope.scaling.yarn_truncate false: ckpt/'s key for a folder's
     * rope_scaling.truncate false (no GGUF writer has it: llama.cpp always
     * rounds) */
    bool truncate = true;
    if (cairn_gguf_find_key(g, arch_key(A, "rope.scaling.yarn_truncate")) >= 0 &&
        cairn_gguf_get_bool(g, arch_key(A, "rope.scaling.yarn_truncate"), &truncate) != CAIRN_OK)
        return cairn_errorf(err, err_len, CAIRN_EFORMAT, "%s: %s is not a bool", path,
                            arch_key(A, "rope.scaling.yarn_truncate"));
    hp->yarn_unrounded = !truncate;
    hp->rope_yarn = true;
    hp->yarn_factor = factor;
    hp->yarn_orig_ctx = (int)orig;
    hp->yarn_beta_fast = fast;
    hp->yarn_beta_slow = slow;
    hp->yarn_mscale = (factor > 1 ? 0.1f * logf(factor) + 1.0f : 1.0f) * attn;
    return CAIRN_OK;
}

/* YaRN as RoPE divisors, one per pair (the rope op's freq_factors): pair
 * i's angle is pos * base^(-2i/n_rot) * (ramp_i + (1 - ramp_i) / factor),
 * ramp_i 1 for the pairs that turn more than beta_fast times in the trained
 * context (kept), 0 below beta_slow turns (interpolated), linear between,
 * with llama.cpp's and HF's correction range (floor and ceil of the pair
 * index where a pair turns beta times; unrounded for HF's truncate false). */
static void yarn_divisors(const cairn_hparams *hp, float *div)
{
    const int n = hp->n_rot;
    const float two_pi = 6.28318530718f;
#define CORR_DIM(beta)                                                                             \
    ((float)n * logf((float)hp->yarn_orig_ctx / ((beta) * two_pi)) / (2 * logf(hp->rope_freq_base)))
    float low = CORR_DIM(hp->yarn_beta_fast), high = CORR_DIM(hp->yarn_beta_slow);
#undef CORR_DIM
    if (!hp->yarn_unrounded) {
        low = floorf(low);
        high = ceilf(high);
    }
    low = low > 0 ? low : 0;
    high = high < (float)(n - 1) ? high : (float)(n - 1);
    for (int i = 0; i < n / 2; i++) {
        float y = ((float)i - low) / (high - low > 0.001f ? high - low : 0.001f);
        y = y < 0 ? 0 : y > 1 ? 1 : y;
        const float keep = 1 - y; /* 1: extrapolate (as trained), 0: interpolate */
        div[i] = 1.0f / (keep + (1 - keep) / hp->yarn_factor);
    }
}

static int read_hparams(const cairn_gguf *g, const char *path, const arch_traits **arch_out,
                        cairn_hparams *hp, char *err, size_t err_len)
{
    const char *arch;
    size_t arch_len;
    if (cairn_gguf_get_str(g, "general.architecture", &arch, &arch_len) != CAIRN_OK)
        return cairn_errorf(err, err_len, CAIRN_EFORMAT, "%s: no general.architecture", path);
    const arch_traits *A = NULL;
    for (size_t i = 0; i < sizeof ARCHES / sizeof ARCHES[0]; i++)
        if (strcmp(arch, ARCHES[i].name) == 0)
            A = &ARCHES[i];
    if (!A)
        return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                    "%s: architecture '%s' is not supported (supported: llama, qwen2, qwen3, "
                    "gemma3, qwen3moe, qwen2moe, gpt-oss)", path,
                    arch);
    *arch_out = A;
    memset(hp, 0, sizeof *hp);
    snprintf(hp->arch, sizeof hp->arch, "%s", arch);
    const char *name;
    size_t name_len;
    if (cairn_gguf_get_str(g, "general.name", &name, &name_len) == CAIRN_OK)
        snprintf(hp->name, sizeof hp->name, "%s", name);
    else {
        const char *base = strrchr(path, '/');
        snprintf(hp->name, sizeof hp->name, "%s", base ? base + 1 : path);
    }

    uint32_t n_ctx, dim, n_layer, ffn, n_head, n_kv, n_rot;
    float eps, base, scale_factor = 1;
    int rc = CAIRN_OK;
    if ((rc = cairn_gguf_get_u32(g, arch_key(A, "embedding_length"), &dim)) ||
        (rc = cairn_gguf_get_u32(g, arch_key(A, "block_count"), &n_layer)) ||
        (rc = cairn_gguf_get_u32(g, arch_key(A, "feed_forward_length"), &ffn)) ||
        (rc = cairn_gguf_get_u32(g, arch_key(A, "attention.head_count"), &n_head)))
        return cairn_errorf(err, err_len, CAIRN_EFORMAT, "%s: missing or invalid %s hyper-parameter",
                    path, A->name);
    if ((rc = get_u32_or(g, arch_key(A, "context_length"), 2048, &n_ctx)) ||
        (rc = get_u32_or(g, arch_key(A, "attention.head_count_kv"), n_head, &n_kv)) ||
        (rc = get_f32_or(g, arch_key(A, "attention.layer_norm_rms_epsilon"), 1e-5f, &eps)) ||
        (rc = get_f32_or(g, arch_key(A, "rope.freq_base"), 10000.0f, &base)))
        return cairn_errorf(err, err_len, CAIRN_EFORMAT, "%s: invalid %s hyper-parameter", path,
                            A->name);
    /* The head width is attention.key_length when given (Qwen3: 128 with
     * dim 1024 and 16 heads, so q is wider than x), else dim / n_head. */
    uint32_t key_length = 0, value_length;
    if ((rc = get_u32_or(g, arch_key(A, "attention.key_length"), 0, &key_length)))
        return cairn_errorf(err, err_len, CAIRN_EFORMAT, "%s: invalid %s", path,
                            arch_key(A, "attention.key_length"));
    if (dim == 0 || n_layer == 0 || ffn == 0 || n_head == 0 || n_kv == 0 || n_ctx == 0 ||
        (key_length == 0 && dim % n_head != 0) || n_head % n_kv != 0 || dim > (1u << 16) ||
        n_layer > 1024 || ffn > (1u << 20) || n_head > 1024 || key_length > 1024)
        return cairn_errorf(err, err_len, CAIRN_EFORMAT,
                    "%s: inconsistent shape (dim %u, layers %u, heads %u/%u, ffn %u)", path, dim,
                    n_layer, n_head, n_kv, ffn);
    const uint32_t head_dim = key_length ? key_length : dim / n_head;
    /* Values as wide as keys: what every supported architecture has (a
     * different value_length would need its own attention-output width). */
    if ((rc = get_u32_or(g, arch_key(A, "attention.value_length"), head_dim, &value_length)) ||
        value_length != head_dim)
        return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                            "%s: attention.value_length %u differs from key_length %u", path,
                            value_length, head_dim);
    if ((rc = get_u32_or(g, arch_key(A, "rope.dimension_count"), head_dim, &n_rot)) ||
        n_rot > head_dim || n_rot % 2)
        return cairn_errorf(err, err_len, CAIRN_EFORMAT, "%s: invalid %s", path,
                            arch_key(A, "rope.dimension_count"));

    /* Linear RoPE scaling stretches positions by 1/factor. Llama 3's scaling
     * arrives as the rope_freqs tensor instead (see upload_weights), YaRN as
     * its parameters (read_yarn; the divisors are built at load). Any other
     * scheme (LongRoPE, ...) would silently give wrong attention, so it is
     * refused by name. */
    const char *scaling;
    size_t scaling_len;
    if (cairn_gguf_get_str(g, arch_key(A, "rope.scaling.type"), &scaling, &scaling_len) ==
        CAIRN_OK) {
        if (strcmp(scaling, "linear") == 0)
            get_f32_or(g, arch_key(A, "rope.scaling.factor"), 1.0f, &scale_factor);
        else if (strcmp(scaling, "yarn") == 0) {
            if ((rc = read_yarn(g, path, A, n_ctx, hp, err, err_len)))
                return rc;
        } else if (strcmp(scaling, "none") != 0 && strcmp(scaling, "llama3") != 0)
            return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                                "%s: RoPE scaling '%s' is not supported (supported: none, linear, "
                                "yarn, llama3 via rope_freqs)", path, scaling);
    }
    if (!(scale_factor > 0))
        scale_factor = 1;

    /* Sliding windows: Gemma 3's local layers (every layer but each
     * period-th, with a RoPE base of their own), or every layer of a file
     * that names a window (Mistral's sliding_window). A window wider than
     * the context could never slide: the file is inconsistent. */
    uint32_t window = 0, period = A->gemma ? 6 : A->oss ? 2 : 0;
    float base_local = base;
    if ((rc = get_u32_or(g, arch_key(A, "attention.sliding_window"), 0, &window)) ||
        window > n_ctx || window > (1u << 30))
        return cairn_errorf(err, err_len, CAIRN_EFORMAT,
                            "%s: %s %u is invalid (context length %u)", path,
                            arch_key(A, "attention.sliding_window"), window, n_ctx);
    if (A->oss && window == 0)
        return cairn_errorf(err, err_len, CAIRN_EFORMAT, "%s: %s is missing (gpt-oss's local "
                            "layers need their window)", path,
                            arch_key(A, "attention.sliding_window"));
    if (window > 0 && (A->gemma || A->oss)) {
        if ((rc = get_u32_or(g, arch_key(A, "attention.sliding_window_pattern"), period,
                             &period)) ||
            period == 0 || period > n_layer)
            return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                                "%s: %s must be one period of at most %u layers (a per-layer "
                                "list is not supported)", path,
                                arch_key(A, "attention.sliding_window_pattern"), n_layer);
        if ((rc = get_f32_or(g, arch_key(A, "rope.freq_base_swa"), A->gemma ? 10000.0f : base,
                             &base_local)) ||
            !(base_local > 0))
            return cairn_errorf(err, err_len, CAIRN_EFORMAT, "%s: invalid %s", path,
                                arch_key(A, "rope.freq_base_swa"));
    }
    /* Logit soft-capping (Gemma 2, and Gemma 3 files that carry it) is a
     * tanh cairn has no op for: refused rather than ignored. */
    float softcap = 0;
    if (get_f32_or(g, arch_key(A, "final_logit_softcapping"), 0, &softcap) != CAIRN_OK ||
        softcap != 0 ||
        get_f32_or(g, arch_key(A, "attn_logit_softcapping"), 0, &softcap) != CAIRN_OK ||
        softcap != 0)
        return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                            "%s: logit soft-capping (%s / %s) is not supported", path,
                            arch_key(A, "final_logit_softcapping"), "attn_logit_softcapping");

    hp->n_ctx_train = (int)n_ctx;
    hp->dim = (int)dim;
    hp->n_layer = (int)n_layer;
    hp->ffn_dim = (int)ffn;
    hp->n_head = (int)n_head;
    hp->n_kv_head = (int)n_kv;
    hp->head_dim = (int)head_dim;
    hp->n_rot = (int)n_rot;
    hp->rms_eps = eps;
    hp->rope_freq_base = base;
    hp->rope_freq_scale = 1.0f / scale_factor;
    hp->rope_mode = A->rope_mode;
    hp->sliding_window = (int)window;
    hp->swa_period = window > 0 ? (int)period : 0;
    hp->rope_freq_base_local = base_local;
    hp->local_rope_own = A->gemma;
    hp->attn_sinks = A->oss;
    if (A->oss && base_local != base)
        return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                            "%s: %s differing from rope.freq_base is not supported on gpt-oss",
                            path, arch_key(A, "rope.freq_base_swa"));
    return read_experts(g, path, A, hp, err, err_len);
}

/* ---- tensors ------------------------------------------------------------ */

/* Look up `name`, check its shape is [ne0, ne1] (ne1 = 1 for vectors) and its
 * type usable; a missing optional tensor leaves *t NULL. */
static int find_tensor(const cairn_gguf *g, const char *name, int64_t ne0, int64_t ne1,
                       bool must_be_f32, bool optional, const cairn_gguf_tensor **t, char *err,
                       size_t err_len)
{
    *t = cairn_gguf_find_tensor(g, name);
    if (!*t) {
        if (optional)
            return CAIRN_OK;
        return cairn_errorf(err, err_len, CAIRN_EFORMAT, "missing tensor '%s'", name);
    }
    const cairn_gguf_tensor *x = *t;
    int64_t n_rest = 1;
    for (int d = 2; d < x->n_dims; d++)
        n_rest *= x->ne[d];
    if (x->ne[0] != ne0 || x->ne[1] != ne1 || n_rest != 1)
        return cairn_errorf(err, err_len, CAIRN_EFORMAT,
                    "tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]", name,
                    (long long)x->ne[0], (long long)x->ne[1], (long long)ne0, (long long)ne1);
    const cairn_type_traits *tr = cairn_type_get(x->type);
    if (!tr || !tr->compute || (must_be_f32 && x->type != CAIRN_TYPE_F32))
        return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED, "tensor '%s' has type %s, which cairn %s",
                    name, tr ? tr->name : "?",
                    must_be_f32 ? "needs as F32 here" : "cannot compute with yet");
    return CAIRN_OK;
}

typedef struct {
    const cairn_gguf_tensor *src;
    weight *dst;
    bool perm;   /* src is dst's input order (I32), not its data */
    bool matrix; /* a vector that matmul reads as a one-row matrix
                    (qwen2moe's shared-expert gate) */
    bool expert; /* one expert of a 3-D tensor: a token reads it only when
                    the router picks it */
    bool plain;  /* a matrix of F32 values read as they are (gpt-oss's
                    expert biases, [n_expert][eff]), never packed */
} tensor_binding;

static int find_perm(const cairn_gguf *g, const char *weight_name, int64_t n_in,
                     const cairn_gguf_tensor **t, char *err, size_t err_len);

/* The n_expert matrices [ne1][ne0] of one expert projection (views[e], each
 * a GGUF tensor of its own to the upload), and each one's input order
 * (perms[e]: GPTQ act-order, "blk.L.<proj>.E.input_perm", else NULL): the slices of
 * the 3-D tensor "blk.L.<proj>_exps.weight" ([ne0, ne1, n_expert]) that the
 * GGUF converters write, or else one 2-D tensor per expert,
 * "blk.L.<proj>.E.weight" (early Mixtral GGUFs, and ckpt/'s view of a HF
 * folder, whose experts are separate tensors). */
static int find_experts(const cairn_gguf *g, int layer, const char *proj, int64_t ne0,
                        int64_t ne1, int n_expert, cairn_gguf_tensor *views,
                        const cairn_gguf_tensor **perms, char *err, size_t err_len)
{
    for (int e = 0; e < n_expert; e++)
        perms[e] = NULL;
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s_exps.weight", layer, proj);
    const cairn_gguf_tensor *t = cairn_gguf_find_tensor(g, name);
    if (!t) {
        snprintf(name, sizeof name, "blk.%d.%s.0.weight", layer, proj);
        if (!cairn_gguf_find_tensor(g, name))
            return cairn_errorf(err, err_len, CAIRN_EFORMAT,
                                "missing tensor 'blk.%d.%s_exps.weight' (experts as one 3-D "
                                "tensor per layer, or blk.%d.%s.E.weight per expert)",
                                layer, proj, layer, proj);
        for (int e = 0; e < n_expert; e++) {
            snprintf(name, sizeof name, "blk.%d.%s.%d.weight", layer, proj, e);
            int rc = find_tensor(g, name, ne0, ne1, false, false, &t, err, err_len);
            if (rc)
                return rc;
            views[e] = *t;
            if ((rc = find_perm(g, name, ne0, &perms[e], err, err_len)))
                return rc;
        }
        snprintf(name, sizeof name, "blk.%d.%s.%d.weight", layer, proj, n_expert);
        if (cairn_gguf_find_tensor(g, name))
            return cairn_errorf(err, err_len, CAIRN_EFORMAT,
                                "tensor '%s' is one expert more than expert_count %d", name,
                                n_expert);
        return CAIRN_OK;
    }
    if (t->n_dims != 3 || t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != n_expert)
        return cairn_errorf(err, err_len, CAIRN_EFORMAT,
                            "tensor '%s' has shape [%lld, %lld, %lld], expected [%lld, %lld, %d] "
                            "(expert_count %d)", name, (long long)t->ne[0], (long long)t->ne[1],
                            (long long)t->ne[2], (long long)ne0, (long long)ne1, n_expert,
                            n_expert);
    const cairn_type_traits *tr = cairn_type_get(t->type);
    if (!tr || !tr->compute)
        return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                            "tensor '%s' has type %s, which cairn cannot compute with yet", name,
                            tr ? tr->name : "?");
    const uint64_t each = t->size / (uint64_t)n_expert;
    for (int e = 0; e < n_expert; e++) {
        views[e] = *t;
        views[e].n_dims = 2;
        views[e].ne[2] = 1;
        views[e].size = each;
        views[e].offset = t->offset + (uint64_t)e * each;
        views[e].data = (const uint8_t *)t->data + (uint64_t)e * each;
    }
    return CAIRN_OK;
}

/* "<base>.input_perm" of a matmul weight "<base>.weight": I32 [n_in], a
 * permutation of the input columns (GPTQ act-order, from ckpt/). Checked
 * here on the host, since the gather op trusts it. *t NULL when absent. */
static int find_perm(const cairn_gguf *g, const char *weight_name, int64_t n_in,
                     const cairn_gguf_tensor **t, char *err, size_t err_len)
{
    char name[128];
    const size_t base = strlen(weight_name) - strlen(".weight");
    snprintf(name, sizeof name, "%.*s.input_perm", (int)base, weight_name);
    *t = cairn_gguf_find_tensor(g, name);
    if (!*t)
        return CAIRN_OK;
    const cairn_gguf_tensor *x = *t;
    if (x->type != CAIRN_TYPE_I32 || x->n_dims != 1 || x->ne[0] != n_in)
        return cairn_errorf(err, err_len, CAIRN_EFORMAT, "tensor '%s' is not I32 [%lld]", name,
                            (long long)n_in);
    uint8_t *seen = calloc((size_t)n_in, 1);
    if (!seen)
        return CAIRN_ENOMEM;
    int rc = CAIRN_OK;
    for (int64_t j = 0; j < n_in && rc == CAIRN_OK; j++) {
        int32_t v;
        memcpy(&v, (const uint8_t *)x->data + 4 * j, 4);
        if (v < 0 || v >= n_in || seen[v]++)
            rc = cairn_errorf(err, err_len, CAIRN_EFORMAT, "tensor '%s' is not a permutation",
                              name);
    }
    free(seen);
    return rc;
}

static int bind_weights(cairn_model *m, const cairn_gguf *g, tensor_binding **out, int *n_out,
                        char *err, size_t err_len)
{
    const cairn_hparams *hp = &m->hp;
    int64_t dim = hp->dim, hd = hp->head_dim, ffn = hp->ffn_dim;
    int64_t q_dim = hp->n_head * hd, kv_dim = hp->n_kv_head * hd;
    const int n_expert = hp->n_expert;
    /* 16 tensors and up to 7 input orders, the router, 3 matrices an
     * expert and their input orders, 4 of the shared expert, and gpt-oss's
     * 6 biases and sinks */
    int cap = 4 + (36 + 6 * n_expert) * hp->n_layer;
    tensor_binding *b = calloc((size_t)cap, sizeof *b);
    if (!b)
        return CAIRN_ENOMEM;
    if (n_expert > 0) {
        const size_t per = (size_t)hp->n_layer * 3 * n_expert;
        m->expert_weights = calloc(per, sizeof *m->expert_weights);
        m->expert_views = calloc(per, sizeof *m->expert_views);
        if (!m->expert_weights || !m->expert_views) {
            free(b);
            return CAIRN_ENOMEM;
        }
    }
    int n = 0, rc;
    const cairn_gguf_tensor *t;

    /* The vocabulary size comes from the embedding table. */
    t = cairn_gguf_find_tensor(g, "token_embd.weight");
    if (!t || t->ne[0] != dim || t->n_dims != 2 || t->ne[1] <= 0 || t->ne[1] > (1 << 24)) {
        rc = cairn_errorf(err, err_len, CAIRN_EFORMAT, "missing or malformed tensor 'token_embd.weight'");
        goto out;
    }
    m->hp.n_vocab = (int)t->ne[1];
    if ((rc = find_tensor(g, "token_embd.weight", dim, hp->n_vocab, false, false, &t, err,
                          err_len)))
        goto out;
    b[n++] = (tensor_binding){.src = t, .dst = &m->tok_embd};
    if ((rc = find_tensor(g, "output_norm.weight", dim, 1, true, false, &t, err, err_len)))
        goto out;
    b[n++] = (tensor_binding){.src = t, .dst = &m->output_norm};
    if ((rc = find_tensor(g, "output.weight", dim, hp->n_vocab, false, true, &t, err, err_len)))
        goto out;
    m->hp.tied_embeddings = t == NULL;
    if (t)
        b[n++] = (tensor_binding){.src = t, .dst = &m->output};
    const cairn_gguf_tensor *perm;
    if ((rc = find_perm(g, "output.weight", dim, &perm, err, err_len)))
        goto out;
    if (perm) {
        rc = cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                          "an input order for output.weight (an act-order quantized LM head) is "
                          "not supported");
        goto out;
    }

    for (int l = 0; l < hp->n_layer; l++) {
        layer_weights *L = &m->layers[l];
        const bool bias = m->arch->qkv_bias, gemma = m->arch->gemma, dense = n_expert == 0;
        const bool oss = m->arch->oss;
        const bool shared = !dense && m->arch->shared_expert;
        const int64_t ffs = hp->shared_ffn_dim;
        struct {
            const char *suffix;
            int64_t ne0, ne1;
            bool f32, wanted;
            weight *w;
        } spec[] = {
            {"attn_norm.weight", dim, 1, true, true, &L->attn_norm},
            {"attn_q.weight", dim, q_dim, false, true, &L->wq},
            {"attn_k.weight", dim, kv_dim, false, true, &L->wk},
            {"attn_v.weight", dim, kv_dim, false, true, &L->wv},
            {"attn_q.bias", q_dim, 1, true, bias, &L->bq},
            {"attn_k.bias", kv_dim, 1, true, bias, &L->bk},
            {"attn_v.bias", kv_dim, 1, true, bias, &L->bv},
            {"attn_q_norm.weight", hd, 1, true, m->arch->qk_norm, &L->q_norm},
            {"attn_k_norm.weight", hd, 1, true, m->arch->qk_norm, &L->k_norm},
            {"attn_output.weight", q_dim, dim, false, true, &L->wo},
            {"attn_output.bias", dim, 1, true, oss, &L->bo},
            {"attn_sinks.weight", hp->n_head, 1, true, oss, &L->sinks},
            {"post_attention_norm.weight", dim, 1, true, gemma, &L->attn_post_norm},
            /* gpt-oss names its FFN input norm post_attention_norm */
            {"post_attention_norm.weight", dim, 1, true, oss, &L->ffn_norm},
            {"ffn_norm.weight", dim, 1, true, !oss, &L->ffn_norm},
            {"ffn_gate.weight", dim, ffn, false, dense, &L->w_gate},
            {"ffn_up.weight", dim, ffn, false, dense, &L->w_up},
            {"ffn_down.weight", ffn, dim, false, dense, &L->w_down},
            {"post_ffw_norm.weight", dim, 1, true, gemma, &L->ffn_post_norm},
            {"ffn_gate_inp.weight", dim, n_expert, false, !dense, &L->router},
            {"ffn_gate_inp.bias", n_expert, 1, true, oss, &L->router_b},
            {"ffn_gate_shexp.weight", dim, ffs, false, shared, &L->sh_gate},
            {"ffn_up_shexp.weight", dim, ffs, false, shared, &L->sh_up},
            {"ffn_down_shexp.weight", ffs, dim, false, shared, &L->sh_down},
        };
        for (size_t i = 0; i < sizeof spec / sizeof spec[0]; i++) {
            if (!spec[i].wanted)
                continue;
            char name[96];
            snprintf(name, sizeof name, "blk.%d.%s", l, spec[i].suffix);
            if ((rc = find_tensor(g, name, spec[i].ne0, spec[i].ne1, spec[i].f32, false, &t, err,
                                  err_len)))
                goto out;
            b[n++] = (tensor_binding){.src = t, .dst = spec[i].w};
            if (!spec[i].f32) {
                if ((rc = find_perm(g, name, spec[i].ne0, &t, err, err_len)))
                    goto out;
                if (t) /* after its weight: binding the weight resets perm */
                    b[n++] = (tensor_binding){.src = t, .dst = spec[i].w, .perm = true};
            }
        }
        if (shared) { /* the shared expert's gate: [dim] read as a [1][dim] matrix */
            char name[96];
            snprintf(name, sizeof name, "blk.%d.ffn_gate_inp_shexp.weight", l);
            if ((rc = find_tensor(g, name, dim, 1, false, false, &t, err, err_len)))
                goto out;
            b[n++] = (tensor_binding){.src = t, .dst = &L->sh_router, .matrix = true};
        }
        if (!dense) { /* gate, up, down of every expert */
            static const char *const proj[3] = {"ffn_gate", "ffn_up", "ffn_down"};
            const int64_t ffe = hp->expert_ffn_dim;
            const int64_t ne0[3] = {dim, dim, ffe}, ne1[3] = {ffe, ffe, dim};
            const cairn_gguf_tensor **perms = calloc((size_t)n_expert, sizeof *perms);
            if (!perms) {
                rc = CAIRN_ENOMEM;
                goto out;
            }
            for (int k = 0; k < 3 && rc == CAIRN_OK; k++) {
                const size_t at = ((size_t)l * 3 + k) * n_expert;
                if ((rc = find_experts(g, l, proj[k], ne0[k], ne1[k], n_expert,
                                       m->expert_views + at, perms, err, err_len)))
                    break;
                for (int e = 0; e < n_expert; e++) {
                    b[n++] = (tensor_binding){.src = m->expert_views + at + e,
                                              .dst = m->expert_weights + at + e, .expert = true};
                    if (perms[e]) /* after its weight, as for the dense ones */
                        b[n++] = (tensor_binding){.src = perms[e],
                                                  .dst = m->expert_weights + at + e, .perm = true};
                }
            }
            free(perms);
            if (rc)
                goto out;
            /* gpt-oss: every expert's biases, [n_expert][eff | dim] F32 */
            weight *const eb[3] = {&L->exp_gate_b, &L->exp_up_b, &L->exp_down_b};
            for (int k = 0; k < 3 && oss; k++) {
                char name[96];
                snprintf(name, sizeof name, "blk.%d.%s_exps.bias", l, proj[k]);
                if ((rc = find_tensor(g, name, ne1[k], n_expert, true, false, &t, err, err_len)))
                    goto out;
                b[n++] = (tensor_binding){.src = t, .dst = eb[k], .plain = true};
            }
            L->exp_gate = m->expert_weights + ((size_t)l * 3 + 0) * n_expert;
            L->exp_up = m->expert_weights + ((size_t)l * 3 + 1) * n_expert;
            L->exp_down = m->expert_weights + ((size_t)l * 3 + 2) * n_expert;
        }
    }
    rc = CAIRN_OK;
out:
    if (rc != CAIRN_OK) {
        free(b);
        return rc;
    }
    *out = b;
    *n_out = n;
    return CAIRN_OK;
}

/* The key centres of a model with key biases (qwen2): minus, per layer and
 * channel, the part of the bias that RoPE keeps in place. RoPE turns a
 * channel pair by pos * theta_i; for the pairs whose theta_i turns less than
 * half a radian over 1024 positions (and for channels RoPE does not touch)
 * the bias b is close to constant across positions, and those are the
 * outlier channels of Qwen2.5's keys. The rule depends on the weights alone,
 * so every request and every tier stores the same bytes. */
static int k_centers(cairn_model *m)
{
    const cairn_hparams *hp = &m->hp;
    const int hd = hp->head_dim, kv_dim = hp->n_kv_head * hd, half = hp->n_rot / 2;
    if (!m->arch->qkv_bias)
        return CAIRN_OK;
    cairn_backend *be = m->be;
    float *host = malloc((size_t)hp->n_layer * kv_dim * sizeof(float));
    int rc = host ? be->iface->alloc(be, (size_t)hp->n_layer * kv_dim * sizeof(float),
                                     (void **)&m->k_centers)
                  : CAIRN_ENOMEM;
    for (int l = 0; rc == CAIRN_OK && l < hp->n_layer; l++) {
        float *c = host + (size_t)l * kv_dim;
        rc = be->iface->download(be, c, m->layers[l].bk.data, (size_t)kv_dim * sizeof(float));
        for (int i = 0; rc == CAIRN_OK && i < kv_dim; i++) {
            const int d = i % hd;
            /* the pair d belongs to: NEOX pairs d and d + n_rot/2, NORMAL 2i and 2i+1 */
            const int pair = hp->rope_mode == CAIRN_ROPE_NEOX ? d % (half ? half : 1) : d / 2;
            const double theta = pow(hp->rope_freq_base, -2.0 * pair / hp->n_rot);
            const int still = d >= hp->n_rot || theta * 1024.0 < 0.5;
            c[i] = still ? -c[i] : 0.0f;
        }
    }
    if (rc == CAIRN_OK)
        rc = be->iface->upload(be, m->k_centers, host, (size_t)hp->n_layer * kv_dim * sizeof(float));
    for (int l = 0; rc == CAIRN_OK && l < hp->n_layer; l++)
        m->layers[l].k_center = (weight){m->k_centers + (size_t)l * kv_dim, CAIRN_TYPE_F32, NULL};
    free(host);
    return rc;
}

/* Whether binding b is a matrix that matmul reads (every 2-D weight, and the
 * token embeddings only when they are also the output head): those are
 * uploaded in the backend's own layout (kernels/backend.h, "Weight
 * layouts"); norms, biases, input orders and an embedding table that only
 * get_rows reads keep GGUF's. */
static bool is_matmul_weight(const cairn_model *m, const tensor_binding *b)
{
    if (b->matrix)
        return true;
    return !b->perm && !b->plain && b->src->n_dims >= 2 && b->src->ne[1] > 1 &&
           (b->dst != &m->tok_embd || m->hp.tied_embeddings);
}

/* The type the kernels multiply a GGUF type as: MXFP4 as Q5_0 (rewritten
 * exactly by upload_mxfp4) on a backend without MXFP4 kernels, every other
 * as itself. */
static cairn_type kernel_type(const cairn_backend *be, cairn_type t)
{
    return t == CAIRN_TYPE_MXFP4 && !cairn_backend_supports_type(be, t) ? CAIRN_TYPE_Q5_0 : t;
}

/* Upload an MXFP4 matrix as the Q5_0 matrix of the same weights
 * (cairn_mxfp4_to_q5_0), in the backend's layout for Q5_0: for a backend
 * without MXFP4 kernels (the CPU and CUDA backends have them), at 22 bytes
 * a block instead of 17. */
static int upload_mxfp4(cairn_backend *be, void *dst, const cairn_gguf_tensor *t,
                        int64_t *inexact)
{
    const size_t rb = cairn_type_row_bytes(CAIRN_TYPE_Q5_0, t->ne[0]);
    uint8_t *q = rb ? malloc(rb * (size_t)t->ne[1]) : NULL;
    if (!q)
        return rb ? CAIRN_ENOMEM : CAIRN_EINVAL;
    int rc = cairn_mxfp4_to_q5_0(t->data, q, t->ne[0] * t->ne[1], inexact);
    if (rc == CAIRN_OK)
        rc = cairn_backend_upload_weight(be, dst, q, CAIRN_TYPE_Q5_0, (int)t->ne[0],
                                         (int)t->ne[1]);
    free(q);
    return rc;
}

/* Upload every bound tensor into one backend allocation (each 64-byte
 * aligned) and fingerprint the weights as they go. The fingerprint hashes
 * the GGUF bytes, whatever layout the backend keeps them in. */
static int upload_weights(cairn_model *m, const cairn_gguf *g, const tensor_binding *b, int n,
                          char *err, size_t err_len)
{
    cairn_backend *be = m->be;
    const cairn_gguf_tensor *freqs = cairn_gguf_find_tensor(g, "rope_freqs.weight");
    if (freqs && (freqs->type != CAIRN_TYPE_F32 || freqs->ne[0] != m->hp.n_rot / 2))
        return cairn_errorf(err, err_len, CAIRN_EFORMAT, "tensor 'rope_freqs.weight' is malformed");
    /* YaRN's divisors go up as if the file had them as rope_freqs */
    float yarn_div[512];
    cairn_gguf_tensor yarn_t = {.name = "rope_freqs (YaRN)", .type = CAIRN_TYPE_F32, .n_dims = 1,
                                .ne = {m->hp.n_rot / 2, 1, 1, 1},
                                .size = (uint64_t)(m->hp.n_rot / 2) * sizeof(float),
                                .data = yarn_div};
    if (m->hp.rope_yarn) {
        if (freqs)
            return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                                "YaRN scaling together with a rope_freqs.weight is not supported");
        yarn_divisors(&m->hp, yarn_div);
        freqs = &yarn_t;
    }
    /* find_tensor checked that cairn can compute with each type; this
     * backend may implement fewer. */
    for (int i = 0; i < n; i++) {
        const cairn_gguf_tensor *t = b[i].src;
        if (kernel_type(be, t->type) != t->type && !is_matmul_weight(m, &b[i]))
            return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                                "tensor '%s': MXFP4 on backend %s is supported for matrices that "
                                "multiply, not for a lookup table", t->name, be->iface->name);
        if (!b[i].perm && !cairn_backend_supports_type(be, kernel_type(be, t->type))) { /* perms: index data */
            const cairn_type_traits *tr = cairn_type_get(t->type);
            return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                                "tensor '%s' has type %s, which backend %s does not support",
                                t->name, tr ? tr->name : "?", be->iface->name);
        }
    }
    /* each tensor's bytes and type in backend memory */
    size_t *bytes = malloc(((size_t)n + 1) * sizeof *bytes);
    cairn_type *as = malloc(((size_t)n + 1) * sizeof *as);
    if (!bytes || !as) {
        free(bytes);
        free(as);
        return CAIRN_ENOMEM;
    }
    size_t total = 0;
    int rc = CAIRN_OK;
    for (int i = 0; i < n && rc == CAIRN_OK; i++) {
        const cairn_gguf_tensor *t = b[i].src;
        bytes[i] = t->size;
        as[i] = t->type;
        if (is_matmul_weight(m, &b[i]) &&
            (rc = cairn_backend_weight_layout(be, kernel_type(be, t->type), (int)t->ne[0],
                                              (int)t->ne[1], &bytes[i], &as[i])) != CAIRN_OK)
            rc = cairn_errorf(err, err_len, rc, "tensor '%s': no layout on backend %s", t->name,
                              be->iface->name);
        total += (bytes[i] + 63) & ~(size_t)63;
    }
    if (freqs)
        total += (freqs->size + 63) & ~(size_t)63;
    if (rc == CAIRN_OK && (rc = be->iface->alloc(be, total, &m->weights_mem)) != CAIRN_OK)
        rc = cairn_errorf(err, err_len, rc, "cannot allocate %.1f MiB for weights on backend %s",
                          (double)total / (1 << 20), be->iface->name);
    XXH3_state_t *hs = rc == CAIRN_OK ? XXH3_createState() : NULL;
    if (rc == CAIRN_OK && !hs)
        rc = CAIRN_ENOMEM;
    if (rc != CAIRN_OK) {
        free(bytes);
        free(as);
        return rc;
    }
    XXH3_128bits_reset(hs);
    uint8_t *dst = m->weights_mem;
    /* A load that takes long (a big file read from a cold disk, weights
     * packed into the backend's layout) says how far it is, at most once a
     * second, so a start that takes a minute is not mistaken for a hang. */
    size_t src_total = 0, src_done = 0;
    for (int i = 0; i < n + (freqs != NULL); i++)
        src_total += (i < n ? b[i].src : freqs)->size;
    const double t_start = cairn_now();
    double t_logged = t_start;
    int64_t inexact = 0; /* MXFP4 blocks whose scale no fp16 holds */
    for (int i = 0; i < n + (freqs != NULL); i++) {
        const cairn_gguf_tensor *t = i < n ? b[i].src : freqs;
        const double now = cairn_now();
        if (now - t_logged >= 1.0 && src_done > 0) {
            const double rate = (double)src_done / (now - t_start);
            cairn_log(CAIRN_LOG_INFO,
                      "model: loading weights into %s: %.0f%% (%.0f of %.0f MiB), %.1f s, ETA %.0f s",
                      be->iface->name, 100.0 * (double)src_done / (double)src_total,
                      (double)src_done / (1 << 20), (double)src_total / (1 << 20), now - t_start,
                      (double)(src_total - src_done) / rate);
            t_logged = now;
        }
        src_done += t->size;
        if (i < n && kernel_type(be, t->type) != t->type)
            rc = upload_mxfp4(be, dst, t, &inexact);
        else if (i < n && is_matmul_weight(m, &b[i]))
            rc = cairn_backend_upload_weight(be, dst, t->data, t->type, (int)t->ne[0],
                                             (int)t->ne[1]);
        else
            rc = be->iface->upload(be, dst, t->data, t->size);
        if (rc != CAIRN_OK) {
            XXH3_freeState(hs);
            free(bytes);
            free(as);
            return cairn_errorf(err, err_len, rc, "uploading '%s' failed", t->name);
        }
        if (i < n && b[i].perm) {
            b[i].dst->perm = (const int32_t *)dst;
            m->has_perms = true;
        } else if (i < n)
            *b[i].dst = (weight){dst, as[i], NULL};
        else
            m->rope_freqs = (const float *)dst;
        /* a token looks up one row of an embedding table that is not also
         * the output head; every other tensor is read whole */
        bool one_row = i < n && b[i].dst == &m->tok_embd && !m->hp.tied_embeddings;
        if (i < n && b[i].expert) /* a token reads n_expert_used of n_expert */
            m->token_weight_bytes += t->size * (uint64_t)m->hp.n_expert_used /
                                     (uint64_t)m->hp.n_expert;
        else
            m->token_weight_bytes += one_row ? t->size / (uint64_t)t->ne[1] : t->size;
        /* name, type, shape, data: any change to the weights changes it */
        uint32_t type = (uint32_t)t->type;
        XXH3_128bits_update(hs, t->name, strlen(t->name) + 1);
        XXH3_128bits_update(hs, &type, sizeof type);
        XXH3_128bits_update(hs, t->ne, sizeof t->ne);
        XXH3_128bits_update(hs, t->data, t->size);
        dst += ((i < n ? bytes[i] : t->size) + 63) & ~(size_t)63;
    }
    free(bytes);
    free(as);
    if (inexact > 0)
        cairn_log(CAIRN_LOG_WARN,
                  "model: %lld MXFP4 blocks have a scale outside fp16's range; their weights "
                  "were rounded to the nearest representable scale",
                  (long long)inexact);
    if (t_logged > t_start) /* it said how far it was: say it is done */
        cairn_log(CAIRN_LOG_INFO, "model: weights loaded into %s in %.1f s (%.0f MiB)",
                  be->iface->name, cairn_now() - t_start, (double)src_total / (1 << 20));
    /* and the hyper-parameters that change the maths: the same weights
     * under another RoPE base, scaling, window or expert count compute
     * other K/V, so they never share cached pages (the name and the trained
     * context change nothing computed) */
    cairn_hparams shape;
    memcpy(&shape, &m->hp, sizeof shape); /* padding too: read_hparams zeroed it */
    memset(shape.name, 0, sizeof shape.name);
    shape.n_ctx_train = 0;
    XXH3_128bits_update(hs, &shape, sizeof shape);
    XXH3_128bits_update(hs, &m->attn_scale, sizeof m->attn_scale);
    XXH128_hash_t h = XXH3_128bits_digest(hs);
    XXH3_freeState(hs);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    memcpy(m->fingerprint, c.digest, 16);
    if (m->hp.tied_embeddings)
        m->output = m->tok_embd;
    return CAIRN_OK;
}

/* The most rows a layer matmul keeps each row to itself for (the
 * smallest positive bound over the layer weights' types; kernels/backend.h,
 * "Batch invariance"), or 0 when every T does (or none: then staging order
 * cannot help). */
static int exact_rows_bound(const cairn_model *m)
{
    const layer_weights *lw = &m->layers[0];
    const weight none = {0};
    const bool moe = lw->exp_gate != NULL;
    const weight *ws[] = {&lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->w_gate, &lw->w_up, &lw->w_down,
                          &lw->router, moe ? &lw->exp_gate[0] : &none,
                          moe ? &lw->exp_up[0] : &none, moe ? &lw->exp_down[0] : &none,
                          &lw->sh_gate, &lw->sh_up, &lw->sh_down, &lw->sh_router};
    int bound = 0;
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
        if (!ws[i]->data)
            continue;
        const int L = cairn_backend_matmul_invariant_rows(m->be, ws[i]->type);
        if (L > 0 && (bound == 0 || L < bound))
            bound = L;
    }
    return bound;
}

static int alloc_scratch(cairn_model *m)
{
    const cairn_hparams *hp = &m->hp;
    size_t T = (size_t)m->params.max_batch_tokens;
    size_t q_dim = (size_t)hp->n_head * hp->head_dim, kv_dim = (size_t)hp->n_kv_head * hp->head_dim;
    /* a mixture of experts: the router's logits, an expert's rows in and out
     * and its gate and up (the shared expert's too); 0: none (dense) */
    const size_t E = (size_t)hp->n_expert, moe_dim = E > 0 ? (size_t)hp->dim : 0;
    const size_t eff = (size_t)(hp->shared_ffn_dim > hp->expert_ffn_dim ? hp->shared_ffn_dim
                                                                        : hp->expert_ffn_dim);
    struct {
        float **p;
        size_t n;
    } bufs[] = {
        {&m->x, T * hp->dim},           {&m->h, T * hp->dim},
        {&m->q, T * q_dim},             {&m->k, T * kv_dim},
        {&m->v, T * kv_dim},            {&m->attn, T * q_dim},
        {&m->ffn_gate, T * hp->ffn_dim}, {&m->ffn_up, T * hp->ffn_dim},
        {&m->out_rows, T * hp->dim},    {&m->logits, (size_t)LOGIT_CHUNK * hp->n_vocab},
        {&m->router, T * E},            {&m->moe_in, T * moe_dim},
        {&m->moe_out, T * moe_dim},     {&m->moe_gate, T * eff},
        {&m->moe_up, T * eff},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (bufs[i].n == 0) /* not this model's: stays NULL */
            continue;
        int rc = m->be->iface->alloc(m->be, bufs[i].n * sizeof(float), (void **)bufs[i].p);
        if (rc != CAIRN_OK)
            return rc;
    }
    if (E > 0) {
        cairn_moe_host *mh = &m->moe_host;
        mh->probs = malloc(T * E * sizeof(float));
        mh->rows = malloc(T * E * sizeof(int32_t));
        mh->weights = malloc(T * E * sizeof(float));
        mh->count = malloc(E * sizeof(int));
        mh->all = malloc(T * sizeof(int32_t));
        if (!mh->probs || !mh->rows || !mh->weights || !mh->count || !mh->all)
            return CAIRN_ENOMEM;
        for (size_t t = 0; t < T; t++)
            mh->all[t] = (int32_t)t;
    }
    if (m->has_perms) {
        size_t widest = (size_t)hp->dim > q_dim ? (size_t)hp->dim : q_dim;
        widest = widest > (size_t)hp->ffn_dim ? widest : (size_t)hp->ffn_dim;
        widest = widest > (size_t)hp->expert_ffn_dim ? widest : (size_t)hp->expert_ffn_dim;
        widest = widest > (size_t)hp->shared_ffn_dim ? widest : (size_t)hp->shared_ffn_dim;
        int rc = m->be->iface->alloc(m->be, T * widest * sizeof(float), (void **)&m->gathered);
        if (rc != CAIRN_OK)
            return rc;
    }
    m->tokens = malloc(T * sizeof(int32_t));
    m->pos = malloc(T * sizeof(int32_t));
    m->slots = malloc(T * sizeof(int32_t));
    m->q_index = malloc(T * sizeof(int32_t));
    m->out_index = malloc(T * sizeof(int32_t));
    m->caller_row = malloc(T * sizeof(int32_t));
    m->seq_out = malloc((size_t)m->params.max_seqs * sizeof(int32_t));
    m->attn_seqs = malloc((size_t)m->params.max_seqs * sizeof *m->attn_seqs);
    if (!m->tokens || !m->pos || !m->slots || !m->q_index || !m->out_index || !m->caller_row || !m->seq_out ||
        !m->attn_seqs)
        return CAIRN_ENOMEM;
    return CAIRN_OK;
}

int cairn_model_load_gguf(const cairn_gguf *g, const char *name, cairn_backend *be,
                          const cairn_model_params *params, cairn_model **out, char *err,
                          size_t err_len)
{
    if (!g || !be || !out)
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "cairn_model_load: missing argument");
    if (!name)
        name = "model";
    cairn_model_params p = {.max_batch_tokens = 512, .max_seqs = 64};
    if (params)
        p = *params;
    if (p.max_batch_tokens <= 0 || p.max_seqs <= 0)
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "max_batch_tokens and max_seqs must be positive");

    cairn_model *m = calloc(1, sizeof *m);
    tensor_binding *bindings = NULL;
    int n_bindings = 0;
    if (!m)
        return CAIRN_ENOMEM;
    m->be = be;
    m->params = p;
    int rc;
    if ((rc = read_hparams(g, name, &m->arch, &m->hp, err, err_len)))
        goto fail;
    if (m->hp.swiglu_limit > 0 && !be->iface->swiglu_clamped) {
        rc = cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                          "%s: %s experts need the clamped SwiGLU, which backend %s lacks", name,
                          m->hp.arch, be->iface->name);
        goto fail;
    }
    /* Gemma 3 27B scales queries by 1/sqrt(dim / n_head) (168), not by the
     * head width; the GGUF does not say so, its 62 layers do (as in
     * llama.cpp and Google's reference code). */
    m->attn_scale = 1.0f / sqrtf((float)m->hp.head_dim);
    if (m->arch->gemma && m->hp.n_layer == 62)
        m->attn_scale = 1.0f / sqrtf((float)(m->hp.dim / m->hp.n_head));
    if (m->hp.rope_yarn) /* q and k each scaled by mscale, as llama.cpp and HF rotate them */
        m->attn_scale *= m->hp.yarn_mscale * m->hp.yarn_mscale;
    m->layers = calloc((size_t)m->hp.n_layer, sizeof *m->layers);
    if (!m->layers) {
        rc = CAIRN_ENOMEM;
        goto fail;
    }
    if ((rc = bind_weights(m, g, &bindings, &n_bindings, err, err_len)))
        goto fail;
    if ((rc = upload_weights(m, g, bindings, n_bindings, err, err_len)))
        goto fail;
    free(m->expert_views); /* uploaded: the views of the mapping are done with */
    m->expert_views = NULL;
    if ((rc = k_centers(m))) {
        cairn_errorf(err, err_len, rc, "cannot place the key centres");
        goto fail;
    }
    m->exact_max = exact_rows_bound(m);
    if ((rc = alloc_scratch(m))) {
        cairn_errorf(err, err_len, rc, "cannot allocate activation buffers for %d tokens",
             p.max_batch_tokens);
        goto fail;
    }
    free(bindings);
    *out = m;
    return CAIRN_OK;
fail:
    free(bindings);
    cairn_model_free(m);
    return rc;
}

int cairn_model_load(const char *path, cairn_backend *be, const cairn_model_params *params,
                     cairn_model **out, char *err, size_t err_len)
{
    if (!path || !be || !out)
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "cairn_model_load: missing argument");
    cairn_gguf *g = NULL;
    int rc = cairn_ckpt_open(path, &g, err, err_len);
    if (rc == CAIRN_OK)
        rc = cairn_model_load_gguf(g, path, be, params, out, err, err_len);
    cairn_gguf_close(g);
    return rc;
}

void cairn_model_free(cairn_model *m)
{
    if (!m)
        return;
    cairn_backend *be = m->be;
    float *bufs[] = {m->x, m->h, m->q, m->k, m->v, m->attn, m->ffn_gate, m->ffn_up,
                     m->out_rows, m->logits, m->gathered, m->router, m->moe_in, m->moe_out,
                     m->moe_gate, m->moe_up};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i])
            be->iface->free(be, bufs[i]);
    if (m->weights_mem)
        be->iface->free(be, m->weights_mem);
    if (m->k_centers)
        be->iface->free(be, m->k_centers);
    if (m->layer_states)
        be->iface->free(be, m->layer_states);
    if (m->logits_keep)
        be->iface->free(be, m->logits_keep);
    free(m->layer_states_host);
    free(m->tokens);
    free(m->pos);
    free(m->slots);
    free(m->q_index);
    free(m->out_index);
    free(m->caller_row);
    free(m->seq_out);
    free(m->attn_seqs);
    free(m->layers);
    free(m->expert_weights);
    free(m->expert_views);
    free(m->moe_host.probs);
    free(m->moe_host.rows);
    free(m->moe_host.weights);
    free(m->moe_host.count);
    free(m->moe_host.all);
    free(m);
}

const cairn_hparams *cairn_model_hparams(const cairn_model *m) { return &m->hp; }

const char *cairn_hparams_describe(const cairn_hparams *hp, char *buf, size_t n)
{
    int at = snprintf(buf, n, "%s, dim %d, %d layers, %d/%d heads", hp->arch, hp->dim,
                      hp->n_layer, hp->n_head, hp->n_kv_head);
    if (hp->n_expert > 0 && at >= 0 && (size_t)at < n)
        at += snprintf(buf + at, n - (size_t)at, ", %d experts (%d a token)", hp->n_expert,
                       hp->n_expert_used);
    if (hp->sliding_window > 0 && at >= 0 && (size_t)at < n) {
        int local = 0;
        for (int l = 0; l < hp->n_layer; l++)
            local += cairn_hparams_layer_window(hp, l) > 0;
        at += snprintf(buf + at, n - (size_t)at, ", window %d on %d of %d layers",
                       hp->sliding_window, local, hp->n_layer);
    }
    if (hp->rope_yarn && at >= 0 && (size_t)at < n)
        snprintf(buf + at, n - (size_t)at, ", YaRN x%g of %d tokens", hp->yarn_factor,
                 hp->yarn_orig_ctx);
    return buf;
}
cairn_backend *cairn_model_backend(const cairn_model *m) { return m->be; }

size_t cairn_model_token_weight_bytes(const cairn_model *m) { return m->token_weight_bytes; }

void cairn_model_limits(const cairn_model *m, int *max_batch_tokens, int *max_seqs)
{
    *max_batch_tokens = m->params.max_batch_tokens;
    *max_seqs = m->params.max_seqs;
}

void cairn_model_fingerprint(const cairn_model *m, uint8_t out[16])
{
    memcpy(out, m->fingerprint, 16);
}

int cairn_model_kv_layout(const cairn_model *m, int page_size, cairn_type dtype,
                          cairn_kv_layout *out)
{
    return cairn_kv_layout_init(out, m->hp.n_layer, m->hp.n_kv_head, m->hp.head_dim, page_size,
                                dtype);
}

/* ---- forward ------------------------------------------------------------ */

/* Flatten the sequences into rows, check them, and fill the host staging
 * arrays. Returns the number of rows (T) and of output rows via out-params. */
/* A sequence whose rows must come out the bits they would alone, whatever
 * shares the step: a decode token, a verification tree (mask), or rows that
 * all want their logits (a verified chain), up to the backend's bound. */
static bool seq_exact(const cairn_seq_batch *sb, int exact_max)
{
    if (sb->n_tokens == 1 || sb->mask)
        return true;
    if (!sb->want || sb->n_tokens > exact_max)
        return false;
    for (int i = 0; i < sb->n_tokens; i++)
        if (!sb->want[i])
            return false;
    return true;
}

static int stage_batch(cairn_model *m, const cairn_kv_layout *kv, const cairn_seq_batch *seqs,
                       int n_seqs, int *T_out, int *n_out)
{
    const cairn_hparams *hp = &m->hp;
    if (n_seqs <= 0 || n_seqs > m->params.max_seqs)
        return CAIRN_ERANGE;
    if (kv->n_layer < hp->n_layer || kv->n_kv_head != hp->n_kv_head ||
        kv->head_dim != hp->head_dim)
        return CAIRN_EINVAL;
    /* the logits rows come out in the caller's sequence order whatever
     * order the rows are staged in: each sequence's first output row */
    int n_o = 0, n_in = 0;
    for (int s = 0; s < n_seqs; s++) {
        const cairn_seq_batch *sb = &seqs[s];
        if (sb->n_tokens <= 0 || !sb->tokens || !sb->pages || sb->kv_start < 0)
            return CAIRN_EINVAL;
        if (sb->n_tokens > m->params.max_batch_tokens - n_in)
            return CAIRN_ERANGE;
        n_in += sb->n_tokens;
        m->seq_out[s] = n_o;
        if (sb->want) {
            for (int i = 0; i < sb->n_tokens; i++)
                n_o += sb->want[i] != 0;
        } else {
            n_o++;
        }
    }
    /* pass 0: the exact sequences, pass 1: the others (one pass in the
     * caller's order when the backend's rows never depend on their batch) */
    const int passes = m->exact_max > 0 ? 2 : 1;
    int T = 0, caller_start = 0;
    m->exact_rows = 0;
    m->reordered = false;
    for (int pass = 0; pass < passes; pass++) {
        caller_start = 0;
        for (int s = 0; s < n_seqs; s++) {
            const cairn_seq_batch *sb = &seqs[s];
            const int first_row = caller_start;
            caller_start += sb->n_tokens;
            if (passes == 2 && seq_exact(sb, m->exact_max) != (pass == 0))
                continue;
            if (T != first_row)
                m->reordered = true;
            int n_kv = sb->kv_start + sb->n_tokens;
            if (n_kv > hp->n_ctx_train * 64) /* far beyond any sane context */
                return CAIRN_ERANGE;
            cairn_attn_seq *as = &m->attn_seqs[s];
            int o = m->seq_out[s];
            as->q_start = T;
            as->n_q = sb->n_tokens;
            as->n_kv = n_kv;
            as->q_index = m->q_index + T;
            as->pages = sb->pages;
            as->mask = sb->mask;
            for (int i = 0; i < sb->n_tokens; i++, T++) {
                int32_t tok = sb->tokens[i];
                if (tok < 0 || tok >= hp->n_vocab)
                    return CAIRN_EINVAL;
                int32_t kv_index = sb->kv_start + i;
                m->tokens[T] = tok;
                m->pos[T] = sb->pos ? sb->pos[i] : kv_index;
                if (m->pos[T] < 0)
                    return CAIRN_EINVAL;
                m->q_index[T] = kv_index;
                m->slots[T] = sb->pages[kv_index / kv->page_size] * kv->page_size +
                              kv_index % kv->page_size;
                m->caller_row[T] = first_row + i;
                bool want = sb->want ? sb->want[i] != 0 : i == sb->n_tokens - 1;
                if (want)
                    m->out_index[o++] = T;
            }
        }
        if (pass == 0 && passes == 2)
            m->exact_rows = T;
    }
    *T_out = T;
    *n_out = n_o;
    return CAIRN_OK;
}

/* The keep buffer with room for n_o rows (its old rows are not kept). */
static int reserve_logits_keep(cairn_model *m, int n_o)
{
    if (n_o <= m->logits_keep_rows)
        return CAIRN_OK;
    cairn_backend *be = m->be;
    if (m->logits_keep)
        be->iface->free(be, m->logits_keep);
    m->logits_keep = NULL;
    m->logits_keep_rows = 0;
    /* whole chunks, so a batch that grows by a row or two does not
     * reallocate every step */
    const int rows = (n_o + LOGIT_CHUNK - 1) / LOGIT_CHUNK * LOGIT_CHUNK;
    TRY(be->iface->alloc(be, (size_t)rows * m->hp.n_vocab * sizeof(float),
                         (void **)&m->logits_keep));
    m->logits_keep_rows = rows;
    return CAIRN_OK;
}

/* The ops of a forward over the staged batch (stage_batch): embeddings,
 * layers, the wanted rows' logits. logits, hidden, features: host outputs
 * downloaded here (each may be NULL; with logits NULL the last chunk's
 * logits stay in m->logits). keep: the logits go to m->logits_keep
 * [n_o][n_vocab] and stay there (`logits` is then unused). */
static int forward_ops(cairn_model *m, void *kv_pool, const cairn_kv_layout *kv, int n_seqs, int T,
                       int n_o, float *logits, float *hidden, float *features, bool keep)
{
    cairn_backend *be = m->be;
    const cairn_backend_iface *op = be->iface;
    const cairn_hparams *hp = &m->hp;
    const int dim = hp->dim, hd = hp->head_dim, ffn = hp->ffn_dim;
    const cairn_rope_params rope = {
        .n_rot = hp->n_rot,
        .mode = hp->rope_mode,
        .freq_base = hp->rope_freq_base,
        .freq_scale = hp->rope_freq_scale,
        .freq_factors = m->rope_freqs,
    };
    const cairn_layer_shape shape = {
        .dim = dim, .n_head = hp->n_head, .n_kv_head = hp->n_kv_head, .head_dim = hd,
        .ffn_dim = ffn, .rms_eps = hp->rms_eps, .rope = rope, .gelu = m->arch->gemma,
        .n_expert = hp->n_expert, .n_expert_used = hp->n_expert_used,
        .expert_ffn_dim = hp->expert_ffn_dim, .shared_ffn_dim = hp->shared_ffn_dim,
        .expert_norm = hp->expert_norm, .expert_weights_scale = hp->expert_weights_scale,
        .expert_softmax_chosen = hp->expert_softmax_chosen, .swiglu_limit = hp->swiglu_limit,
        .swiglu_alpha = hp->swiglu_alpha,
    };
    /* a local layer of Gemma 3: its own RoPE base, unscaled; Mistral's
     * windowed layers and gpt-oss's local ones keep the model's RoPE */
    cairn_layer_shape shape_local = shape;
    if (hp->local_rope_own) {
        shape_local.rope.freq_base = hp->rope_freq_base_local;
        shape_local.rope.freq_scale = 1.0f;
        shape_local.rope.freq_factors = NULL;
    }
    const cairn_layer_acts acts = {
        .x = m->x, .h = m->h, .q = m->q, .attn = m->attn, .k = m->k, .v = m->v,
        .gate = m->ffn_gate, .up = m->ffn_up, .gathered = m->gathered,
        .exact_rows = m->exact_rows,
        .router = m->router, .moe_in = m->moe_in, .moe_out = m->moe_out,
        .moe_gate = m->moe_gate, .moe_up = m->moe_up,
        .moe_host = m->hp.n_expert > 0 ? &m->moe_host : NULL,
    };
    cairn_attn_args attn = {
        .n_head = hp->n_head, .scale = m->attn_scale, .n_seqs = n_seqs, .seqs = m->attn_seqs,
    };

    /* x [T][dim] */
    TRY(op->get_rows(be, m->x, m->tok_embd.data, m->tok_embd.type, dim, m->tokens, T));
    if (m->arch->gemma) /* Gemma scales its embeddings by sqrt(dim) */
        TRY(op->scale(be, m->x, sqrtf((float)dim), (size_t)T * dim));

    const size_t block = (size_t)m->params.max_batch_tokens * dim;
    const bool by_layer = features && m->n_feature_layers > 0;
    for (int l = 0; l <= hp->n_layer; l++) {
        /* the residual stream entering layer l (l = n_layer: leaving the last) */
        for (int i = 0; by_layer && i < m->n_feature_layers; i++)
            if (m->feature_layers[i] == l)
                TRY(cairn_backend_copy(be, m->layer_states + i * block, m->x,
                                       (size_t)T * dim * sizeof(float)));
        if (l < hp->n_layer) {
            attn.window = cairn_hparams_layer_window(hp, l);
            /* Gemma's local layers have a RoPE base of their own; a window
             * over every layer (Mistral) and gpt-oss's keep the file's */
            const bool local = attn.window > 0 && hp->local_rope_own;
            TRY(cairn_layer_forward(be, &m->layers[l], local ? &shape_local : &shape, &acts, T,
                                    m->pos, m->slots, kv_pool, kv, l, &attn));
        }
    }

    /* Only the wanted rows go through the output norm and projection. */
    if (n_o > 0) {
        TRY(op->get_rows(be, m->out_rows, m->x, CAIRN_TYPE_F32, dim, m->out_index, n_o));
        TRY(op->rmsnorm(be, m->out_rows, m->out_rows, m->output_norm.data, n_o, dim,
                        hp->rms_eps)); /* [n_o][dim] */
        if (hidden)
            TRY(op->download(be, hidden, m->out_rows, (size_t)n_o * dim * sizeof(float)));
        /* chunks the backend keeps each row to itself in (batch invariance) */
        const int chunk = m->exact_max > 0 && m->exact_max < LOGIT_CHUNK ? m->exact_max
                                                                         : LOGIT_CHUNK;
        for (int r = 0; r < n_o; r += chunk) {
            int rows = n_o - r < chunk ? n_o - r : chunk;
            /* kept rows go through the same chunked projection, so they are
             * the very values the download path would have returned */
            float *dst = keep ? m->logits_keep + (size_t)r * hp->n_vocab : m->logits;
            TRY(op->matmul(be, dst, m->output.data, m->output.type,
                           m->out_rows + (size_t)r * dim, rows, dim, hp->n_vocab));
            if (logits && !keep)
                TRY(op->download(be, logits + (size_t)r * hp->n_vocab, m->logits,
                                 (size_t)rows * hp->n_vocab * sizeof(float)));
        }
    }
    if (by_layer) { /* [T][n][dim]: each token's states side by side */
        const int n = m->n_feature_layers;
        for (int i = 0; i < n; i++)
            TRY(op->download(be, m->layer_states_host + i * block, m->layer_states + i * block,
                             (size_t)T * dim * sizeof(float)));
        TRY(cairn_backend_synchronize(be));
        for (int t = 0; t < T; t++) /* staged row t is the caller's row caller_row[t] */
            for (int i = 0; i < n; i++)
                memcpy(features + ((size_t)m->caller_row[t] * n + i) * dim,
                       m->layer_states_host + i * block + (size_t)t * dim,
                       (size_t)dim * sizeof(float));
    } else if (features) { /* the output norm over every row; out_rows holds T rows */
        TRY(op->rmsnorm(be, m->out_rows, m->x, m->output_norm.data, T, dim, hp->rms_eps));
        if (!m->reordered) {
            TRY(op->download(be, features, m->out_rows, (size_t)T * dim * sizeof(float)));
        } else { /* each sequence's rows are contiguous in both orders */
            for (int s = 0; s < n_seqs; s++) {
                const cairn_attn_seq *as = &m->attn_seqs[s];
                TRY(op->download(be, features + (size_t)m->caller_row[as->q_start] * dim,
                                 m->out_rows + (size_t)as->q_start * dim,
                                 (size_t)as->n_q * dim * sizeof(float)));
            }
        }
    }
    return CAIRN_OK;
}

/* A decode step — one new token a sequence, no tree mask, only logits out,
 * all of them in one projection chunk — is the same ops every step for the
 * same batch size: on a device it runs as one graph (kernels/backend.h,
 * "Step graphs"), with exactly the results of running the ops one by one. */
static bool is_decode_step(const cairn_seq_batch *seqs, int n_seqs, int n_o, const float *hidden,
                           const float *features, bool keep)
{
    /* kept logits never leave the device; downloaded ones must fit the one
     * chunk that is downloaded after the step */
    if (hidden || features || n_o != n_seqs || (!keep && n_o > LOGIT_CHUNK))
        return false;
    for (int s = 0; s < n_seqs; s++)
        if (seqs[s].n_tokens != 1 || seqs[s].mask)
            return false;
    return true;
}

/* features: NULL, or host [T][dim] for every token of the batch (not only
 * the wanted rows): what a server keeping an EAGLE head's KV needs. keep:
 * the logits stay in m->logits_keep (forward_ops). */
static int forward(cairn_model *m, void *kv_pool, const cairn_kv_layout *kv,
                   const cairn_seq_batch *seqs, int n_seqs, float *logits, float *hidden,
                   float *features, bool keep, int *n_out)
{
    if (!m || !kv_pool || !kv || !seqs || !n_out)
        return CAIRN_EINVAL;
    int T, n_o;
    TRY(stage_batch(m, kv, seqs, n_seqs, &T, &n_o));
    if (keep)
        TRY(reserve_logits_keep(m, n_o));
    cairn_backend *be = m->be;
    /* a mixture of experts chooses its experts on the host between ops,
     * which a recorded step cannot */
    if (m->hp.n_expert == 0 && is_decode_step(seqs, n_seqs, n_o, hidden, features, keep) &&
        cairn_backend_graph_begin(be, (uint64_t)T * 2 + keep) == CAIRN_OK) {
        /* recorded, then run as one launch; downloads come after */
        const int rc = forward_ops(m, kv_pool, kv, n_seqs, T, n_o, NULL, NULL, NULL, keep);
        if (rc != CAIRN_OK) {
            /* none of the recorded ops may run: launched, the ops before the
             * failure would run once here and again below */
            if (cairn_backend_graph_abandon(be) == CAIRN_OK)
                return rc; /* the op failed on its own: its status, first hand */
            /* the recording had broken (an op that must wait, say): the
             * step runs without a graph below */
        } else {
            const int end = cairn_backend_graph_end(be);
            if (end == CAIRN_OK) {
                if (logits && !keep)
                    TRY(be->iface->download(be, logits, m->logits,
                                            (size_t)n_o * m->hp.n_vocab * sizeof(float)));
                TRY(cairn_backend_synchronize(be));
                *n_out = n_o;
                return CAIRN_OK;
            }
            if (end != CAIRN_EBUSY)
                return end; /* the device failed */
            /* CAIRN_EBUSY: none of it ran; it runs without a graph below */
        }
    }
    TRY(forward_ops(m, kv_pool, kv, n_seqs, T, n_o, logits, hidden, features, keep));
    TRY(cairn_backend_synchronize(be));
    *n_out = n_o;
    return CAIRN_OK;
}

int cairn_model_forward(cairn_model *m, void *kv_pool, const cairn_kv_layout *kv,
                        const cairn_seq_batch *seqs, int n_seqs, float *logits, float *hidden,
                        int *n_out)
{
    return forward(m, kv_pool, kv, seqs, n_seqs, logits, hidden, NULL, false, n_out);
}

int cairn_model_forward_features(cairn_model *m, void *kv_pool, const cairn_kv_layout *kv,
                                 const cairn_seq_batch *seqs, int n_seqs, float *logits,
                                 float *features, int *n_out)
{
    if (!features)
        return CAIRN_EINVAL;
    return forward(m, kv_pool, kv, seqs, n_seqs, logits, NULL, features, false, n_out);
}

int cairn_model_forward_keep(cairn_model *m, void *kv_pool, const cairn_kv_layout *kv,
                             const cairn_seq_batch *seqs, int n_seqs, float *features,
                             const float **logits, int *n_out)
{
    if (!logits)
        return CAIRN_EINVAL;
    TRY(forward(m, kv_pool, kv, seqs, n_seqs, NULL, NULL, features, true, n_out));
    *logits = m->logits_keep; /* NULL when no row was wanted */
    return CAIRN_OK;
}

int cairn_model_set_feature_layers(cairn_model *m, const int *layers, int n)
{
    if (!m || n < 0 || n > CAIRN_MAX_FEATURE_LAYERS || (n > 0 && !layers))
        return CAIRN_EINVAL;
    for (int i = 0; i < n; i++)
        if (layers[i] < 0 || layers[i] > m->hp.n_layer)
            return CAIRN_EINVAL;
    cairn_backend *be = m->be;
    if (n > 0 && !m->layer_states) { /* sized once, for the most layers */
        const size_t bytes = (size_t)CAIRN_MAX_FEATURE_LAYERS * m->params.max_batch_tokens *
                             m->hp.dim * sizeof(float);
        TRY(be->iface->alloc(be, bytes, (void **)&m->layer_states));
        m->layer_states_host = malloc(bytes);
        if (!m->layer_states_host)
            return CAIRN_ENOMEM;
    }
    if (n > 0) /* n == 0 (no feature layers) may come with layers == NULL */
        memcpy(m->feature_layers, layers, (size_t)n * sizeof *layers);
    m->n_feature_layers = n;
    return CAIRN_OK;
}

int cairn_model_feature_dim(const cairn_model *m)
{
    return m->n_feature_layers > 0 ? m->n_feature_layers * m->hp.dim : m->hp.dim;
}

/* ---- for model/eagle.c -------------------------------------------------- */

#include "model/eagle_impl.h"

void cairn_model_eagle_shared(const cairn_model *m, cairn_model_shared *out)
{
    out->tok_embd = m->tok_embd.data;
    out->tok_embd_type = m->tok_embd.type;
    out->output = m->output.data;
    out->output_type = m->output.type;
    out->rope_freqs = m->rope_freqs;
    out->max_batch_tokens = m->params.max_batch_tokens;
}
