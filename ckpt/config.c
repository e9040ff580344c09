/*
 * ckpt/config.c — config.json: the architecture, the shapes and the
 * quantization_config, turned into the `<arch>.*` keys a converted GGUF has.
 * A field that would change the maths in a way cairn does not implement
 * (another activation, biases on llama, DeepSeek's or unrounded YaRN, Qwen2's
 * optional window, logit soft-capping, dense layers among experts, another
 * SwiGLU clamp or layer pattern on gpt-oss) is refused by name rather than
 * ignored.
 */
#include "ckpt/ckpt_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const struct {
    const char *hf;   /* config.json "architectures"[0] */
    const char *arch; /* cairn's (GGUF's) name */
} ARCHES[] = {
    {"LlamaForCausalLM", "llama"},
    {"MistralForCausalLM", "llama"},
    {"Qwen2ForCausalLM", "qwen2"},
    {"Qwen3ForCausalLM", "qwen3"},
    {"Gemma3ForCausalLM", "gemma3"},
    {"Gemma3ForConditionalGeneration", "gemma3"}, /* its language model; images are not read */
    {"Qwen2MoeForCausalLM", "qwen2moe"},
    {"Qwen3MoeForCausalLM", "qwen3moe"},
    {"MixtralForCausalLM", "llama"},
    {"GptOssForCausalLM", "gpt-oss"},
};

/* An integer field: *out when present; CAIRN_ENOTFOUND when absent, and an
 * error for a present field of the wrong kind or out of [lo, hi]. */
static int get_int(json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out, char *err,
                   size_t err_len)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return CAIRN_ENOTFOUND;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return cairn_errorf(err, err_len, CAIRN_EFORMAT,
                            "config.json: %s must be an integer in [%lld, %lld]", key,
                            (long long)lo, (long long)hi);
    *out = json_integer_value(v);
    return CAIRN_OK;
}

static int need_int(json_t *o, const char *key, int64_t lo, int64_t hi, int *out, char *err,
                    size_t err_len)
{
    int64_t v;
    int rc = get_int(o, key, lo, hi, &v, err, err_len);
    if (rc == CAIRN_ENOTFOUND)
        return cairn_errorf(err, err_len, CAIRN_EFORMAT, "config.json: no %s", key);
    if (rc == CAIRN_OK)
        *out = (int)v;
    return rc;
}

static int opt_int(json_t *o, const char *key, int64_t lo, int64_t hi, int dflt, int *out,
                   char *err, size_t err_len)
{
    int64_t v;
    int rc = get_int(o, key, lo, hi, &v, err, err_len);
    *out = rc == CAIRN_OK ? (int)v : dflt;
    return rc == CAIRN_ENOTFOUND ? CAIRN_OK : rc;
}

static int opt_num(json_t *o, const char *key, double dflt, double *out, char *err, size_t err_len)
{
    json_t *v = json_object_get(o, key);
    *out = dflt;
    if (!v || json_is_null(v))
        return CAIRN_OK;
    if (!json_is_number(v))
        return cairn_errorf(err, err_len, CAIRN_EFORMAT, "config.json: %s must be a number", key);
    *out = json_number_value(v);
    return CAIRN_OK;
}

static bool opt_bool(json_t *o, const char *key, bool dflt)
{
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static const char *opt_str(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static int read_rope_scaling(json_t *root, ckpt_config *cfg, cairn_gguf_builder *b,
                             const char *arch, char *err, size_t err_len)
{
    json_t *rs = json_object_get(root, "rope_scaling");
    if (!rs || json_is_null(rs))
        return CAIRN_OK;
    if (!json_is_object(rs))
        return cairn_errorf(err, err_len, CAIRN_EFORMAT, "config.json: rope_scaling is not an object");
    const char *type = opt_str(rs, "rope_type");
    if (!type)
        type = opt_str(rs, "type");
    if (!type || strcmp(type, "default") == 0)
        return CAIRN_OK;
    double factor;
    int rc = opt_num(rs, "factor", 1.0, &factor, err, err_len);
    if (rc)
        return rc;
    if (!(factor > 0))
        return cairn_errorf(err, err_len, CAIRN_EFORMAT, "config.json: rope_scaling.factor must be > 0");
    char key[96];
    if (strcmp(type, "linear") == 0) {
        snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
        cairn_gguf_builder_set_str(b, key, "linear");
        snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
        return cairn_gguf_builder_set_f32(b, key, (float)factor);
    }
    if (strcmp(type, "llama3") == 0) {
        double lo, hi;
        int orig;
        if ((rc = opt_num(rs, "low_freq_factor", 1.0, &lo, err, err_len)) ||
            (rc = opt_num(rs, "high_freq_factor", 4.0, &hi, err, err_len)) ||
            (rc = opt_int(rs, "original_max_position_embeddings", 1, 1 << 24, 8192, &orig, err,
                          err_len)))
            return rc;
        if (!(hi > lo) || !(lo > 0))
            return cairn_errorf(err, err_len, CAIRN_EFORMAT,
                                "config.json: rope_scaling needs high_freq_factor > low_freq_factor > 0");
        cfg->llama3_rope = true;
        cfg->rope_factor = (float)factor;
        cfg->rope_low_freq = (float)lo;
        cfg->rope_high_freq = (float)hi;
        cfg->rope_orig_ctx = orig;
        return CAIRN_OK;
    }
    if (strcmp(type, "yarn") == 0) {
        /* HF's YaRN: the trained context original_max_position_embeddings
         * (else max_position_embeddings), beta_fast/beta_slow, and the
         * magnitude attention_factor (default 0.1 ln(factor) + 1, which
         * llama.cpp's rope.scaling.attn_factor multiplies) */
        double fast, slow, attn;
        int orig;
        if ((rc = opt_int(rs, "original_max_position_embeddings", 1, 1 << 24, cfg->n_ctx, &orig,
                          err, err_len)) ||
            (rc = opt_num(rs, "beta_fast", 32.0, &fast, err, err_len)) ||
            (rc = opt_num(rs, "beta_slow", 1.0, &slow, err, err_len)))
            return rc;
        const double mscale = factor > 1 ? 0.1 * log(factor) + 1 : 1;
        if ((rc = opt_num(rs, "attention_factor", mscale, &attn, err, err_len)))
            return rc;
        static const char *const other[] = {"mscale", "mscale_all_dim"};
        for (int i = 0; i < 2; i++)
            if (json_object_get(rs, other[i]) && !json_is_null(json_object_get(rs, other[i])))
                return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                                    "config.json: rope_scaling.%s (DeepSeek's YaRN) is not "
                                    "supported", other[i]);
        /* YaRN's ramp runs between the dimensions where a pair turns
         * beta_fast and beta_slow times; truncate (HF's default true, and
         * every GGUF, as llama.cpp computes it) rounds those two bounds out
         * to whole dimensions, false (gpt-oss's configs, as HF, vLLM and
         * OpenAI's reference compute it) keeps them fractional: other
         * frequencies on the dimensions between, so it is carried to the
         * loader (rope.scaling.yarn_truncate, model.c read_yarn). */
        json_t *truncate = json_object_get(rs, "truncate");
        if (truncate && !json_is_null(truncate) && !json_is_boolean(truncate))
            return cairn_errorf(err, err_len, CAIRN_EFORMAT,
                                "config.json: rope_scaling.truncate must be true or false");
        if (factor < 1 || !(fast > 0) || !(slow > 0) || !(attn > 0))
            return cairn_errorf(err, err_len, CAIRN_EFORMAT,
                                "config.json: rope_scaling (yarn) needs factor >= 1 and positive "
                                "beta_fast, beta_slow, attention_factor");
        snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
        cairn_gguf_builder_set_str(b, key, "yarn");
        snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
        cairn_gguf_builder_set_f32(b, key, (float)factor);
        snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", arch);
        cairn_gguf_builder_set_u32(b, key, (uint32_t)orig);
        snprintf(key, sizeof key, "%s.rope.scaling.yarn_beta_fast", arch);
        cairn_gguf_builder_set_f32(b, key, (float)fast);
        snprintf(key, sizeof key, "%s.rope.scaling.yarn_beta_slow", arch);
        cairn_gguf_builder_set_f32(b, key, (float)slow);
        snprintf(key, sizeof key, "%s.rope.scaling.attn_factor", arch);
        cairn_gguf_builder_set_f32(b, key, (float)(attn / mscale));
        if (json_is_false(truncate)) {
            snprintf(key, sizeof key, "%s.rope.scaling.yarn_truncate", arch);
            cairn_gguf_builder_set_bool(b, key, false);
        }
        /* the context YaRN stretches to, as vLLM derives it */
        if ((double)orig * factor > cfg->n_ctx && (double)orig * factor <= (1 << 24))
            cfg->n_ctx = (int)((double)orig * factor);
        return CAIRN_OK;
    }
    return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                        "config.json: rope_scaling type '%s' is not supported (supported: "
                        "linear, llama3, yarn)", type);
}

/* An FP8 block shape [rows, cols] (weight_block_size, block_structure)
 * into cfg; the columns must be whole multiples of F8_E4M3's 32-blocks. */
static int read_fp8_block(json_t *bs, const char *field, ckpt_config *cfg, char *err,
                          size_t err_len)
{
    if (!json_is_array(bs) || json_array_size(bs) != 2 ||
        !json_is_integer(json_array_get(bs, 0)) || !json_is_integer(json_array_get(bs, 1)))
        return cairn_errorf(err, err_len, CAIRN_EFORMAT, "config.json: %s must be [rows, cols]",
                            field);
    const json_int_t rows = json_integer_value(json_array_get(bs, 0));
    const json_int_t cols = json_integer_value(json_array_get(bs, 1));
    if (rows <= 0 || cols <= 0 || rows > (1 << 20) || cols > (1 << 20) || cols % 32 != 0)
        return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                            "config.json: FP8 blocks of %lldx%lld are not supported (columns a "
                            "multiple of 32)", (long long)rows, (long long)cols);
    cfg->fp8_block = true;
    cfg->fp8_block_rows = (int)rows;
    cfg->fp8_block_cols = (int)cols;
    return CAIRN_OK;
}

/* compressed-tensors: the weights' scheme of its one config group. */
static int read_compressed_tensors(json_t *q, ckpt_config *cfg, char *err, size_t err_len)
{
    const char *format = opt_str(q, "format");
    json_t *groups = json_object_get(q, "config_groups");
    if (!json_is_object(groups) || json_object_size(groups) != 1)
        return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                            "config.json: compressed-tensors with %zu config groups (cairn reads "
                            "one)", json_is_object(groups) ? json_object_size(groups) : 0);
    const char *gname;
    json_t *g;
    json_t *w = NULL;
    json_object_foreach(groups, gname, g) w = json_object_get(g, "weights");
    const char *type = opt_str(w, "type"), *strategy = opt_str(w, "strategy");
    int64_t bits = 0;
    get_int(w, "num_bits", 1, 64, &bits, err, err_len);
    if (format && strcmp(format, "pack-quantized") == 0 && type && strcmp(type, "int") == 0 &&
        bits == 4) {
        /* W4A16 (llm-compressor): int4 per group or per output channel */
        cfg->quant = QM_CT_INT4;
        cfg->sym = opt_bool(w, "symmetric", true);
        if (strategy && strcmp(strategy, "channel") == 0) {
            cfg->group_size = -1;
        } else if (strategy && strcmp(strategy, "group") == 0) {
            int rc = need_int(w, "group_size", 32, 1 << 20, &cfg->group_size, err, err_len);
            if (rc)
                return rc;
            if (cfg->group_size % 32)
                return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                                    "config.json: group_size %d is not supported (a multiple of 32)",
                                    cfg->group_size);
        } else {
            return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                                "config.json: int4 strategy '%s' is not supported (group, channel)",
                                strategy ? strategy : "?");
        }
        return CAIRN_OK;
    }
    if (!format || strcmp(format, "float-quantized") != 0 || !type || strcmp(type, "float") != 0 ||
        bits != 8)
        return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                            "config.json: compressed-tensors format '%s' with %s weights of %lld "
                            "bits is not supported (supported: float-quantized FP8, pack-quantized "
                            "int4)",
                            format ? format : "?", type ? type : "?", (long long)bits);
    cfg->quant = QM_FP8;
    if (strategy && strcmp(strategy, "block") == 0)
        return read_fp8_block(json_object_get(w, "block_structure"), "block_structure", cfg, err,
                              err_len);
    if (strategy && strcmp(strategy, "tensor") != 0 && strcmp(strategy, "channel") != 0)
        return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                            "config.json: FP8 weight strategy '%s' is not supported (supported: "
                            "tensor, channel, block)", strategy);
    return CAIRN_OK;
}

static int read_quantization(json_t *root, ckpt_config *cfg, char *err, size_t err_len)
{
    json_t *q = json_object_get(root, "quantization_config");
    if (!q || json_is_null(q))
        return CAIRN_OK;
    const char *method = opt_str(q, "quant_method");
    if (!json_is_object(q) || !method)
        return cairn_errorf(err, err_len, CAIRN_EFORMAT,
                            "config.json: quantization_config without quant_method");
    int rc;
    if (strcmp(method, "awq") == 0 || strcmp(method, "gptq") == 0) {
        const bool awq = method[0] == 'a';
        cfg->quant = awq ? QM_AWQ : QM_GPTQ;
        int bits = 0;
        if ((rc = need_int(q, awq ? (json_object_get(q, "w_bit") ? "w_bit" : "bits") : "bits", 1,
                           16, &bits, err, err_len)) ||
            (rc = need_int(q, awq && json_object_get(q, "q_group_size") ? "q_group_size"
                                                                         : "group_size",
                           -1, 1 << 20, &cfg->group_size, err, err_len)))
            return rc;
        if (bits != 4)
            return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                                "config.json: %s with %d bits is not supported (4 bits only)",
                                method, bits);
        if (cfg->group_size == 0 || (cfg->group_size != -1 && cfg->group_size % 32 != 0))
            return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                                "config.json: group_size %d is not supported (a multiple of 32, "
                                "or -1 for whole rows)", cfg->group_size);
        if (awq) {
            const char *version = opt_str(q, "version");
            if (version && strcasecmp(version, "gemm") != 0)
                return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                                    "config.json: AWQ version '%s' is not supported (gemm only)",
                                    version);
            if (!opt_bool(q, "zero_point", true))
                return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                                    "config.json: AWQ without zero points is not supported (the "
                                    "GEMM layout carries qzeros)");
        } else {
            cfg->sym = opt_bool(q, "sym", true); /* act-order shows in g_idx itself */
            const char *fmt = opt_str(q, "checkpoint_format");
            if (fmt && strcmp(fmt, "gptq") != 0 && strcmp(fmt, "gptq_v2") != 0)
                return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                                    "config.json: GPTQ checkpoint_format '%s' is not supported "
                                    "(gptq, gptq_v2)", fmt);
            cfg->gptq_v1_zeros = !fmt || strcmp(fmt, "gptq") == 0;
        }
        return CAIRN_OK;
    }
    if (strcmp(method, "fp8") == 0 || strcmp(method, "fbgemm_fp8") == 0) {
        cfg->quant = QM_FP8;
        json_t *bs = json_object_get(q, "weight_block_size");
        if (bs && !json_is_null(bs))
            return read_fp8_block(bs, "weight_block_size", cfg, err, err_len);
        return CAIRN_OK;
    }
    if (strcmp(method, "compressed-tensors") == 0)
        return read_compressed_tensors(q, cfg, err, err_len);
    /* transformers' mxfp4 quantizes gpt-oss's experts only (modules_to_not_convert
     * lists the rest); which form a layer's experts have is read from its
     * tensors (weights.c), so that list is not needed here */
    if (strcmp(method, "mxfp4") == 0) {
        if (!cfg->oss)
            return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                                "config.json: quant_method 'mxfp4' is supported for "
                                "GptOssForCausalLM's experts only");
        cfg->quant = QM_MXFP4;
        return CAIRN_OK;
    }
    return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                        "config.json: quant_method '%s' is not supported (supported: awq, gptq, "
                        "fp8, fbgemm_fp8, compressed-tensors FP8 and int4, mxfp4 for gpt-oss)",
                        method);
}

/* Gemma 3: the local layers' window and RoPE base, which layers are global
 * (layer_types, or the older sliding_window_pattern: every N-th layer), and
 * the fields cairn refuses rather than ignores. */
static int read_gemma(json_t *root, ckpt_config *cfg, cairn_gguf_builder *b, char *err,
                      size_t err_len)
{
    static const char *const caps[] = {"final_logit_softcapping", "attn_logit_softcapping"};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(root, caps[i]);
        if (v && !json_is_null(v) && !(json_is_number(v) && json_number_value(v) == 0))
            return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                                "config.json: %s is set; cairn does not implement logit "
                                "soft-capping", caps[i]);
    }
    if (opt_bool(root, "use_bidirectional_attention", false))
        return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                            "config.json: use_bidirectional_attention (an embedding model) is "
                            "not supported");
    /* the query scale cairn applies, as llama.cpp does: 1/sqrt(head_dim), the
     * 27B's (62 layers) 1/sqrt(hidden_size / heads) */
    const double scalar = cfg->n_layer == 62 ? (double)cfg->dim / cfg->n_head : cfg->head_dim;
    double q;
    int rc = opt_num(root, "query_pre_attn_scalar", scalar, &q, err, err_len);
    if (rc)
        return rc;
    if (q != scalar)
        return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                            "config.json: query_pre_attn_scalar %g is not supported (cairn scales "
                            "this model's queries by 1/sqrt(%g))", q, scalar);
    int window = 0, period = 6;
    if ((rc = need_int(root, "sliding_window", 1, 1 << 24, &window, err, err_len)))
        return rc;
    if (window > cfg->n_ctx)
        return cairn_errorf(err, err_len, CAIRN_EFORMAT,
                            "config.json: sliding_window %d is wider than max_position_embeddings "
                            "%d", window, cfg->n_ctx);
    json_t *types = json_object_get(root, "layer_types");
    if (json_is_array(types)) {
        if ((int)json_array_size(types) != cfg->n_layer)
            return cairn_errorf(err, err_len, CAIRN_EFORMAT,
                                "config.json: layer_types has %zu entries for %d layers",
                                json_array_size(types), cfg->n_layer);
        period = 0;
        for (int l = 0; l < cfg->n_layer; l++) {
            const char *t = json_string_value(json_array_get(types, l));
            const bool full = t && strcmp(t, "full_attention") == 0;
            if (!full && !(t && strcmp(t, "sliding_attention") == 0))
                return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                                    "config.json: layer_types[%d] '%s' is not supported "
                                    "(sliding_attention, full_attention)", l, t ? t : "?");
            if (full && period == 0)
                period = l + 1;
            if (period == 0 ? full : full != ((l + 1) % period == 0))
                return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                                    "config.json: layer_types is not one full_attention layer "
                                    "every N (layer %d)", l);
        }
        if (period == 0)
            return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                                "config.json: layer_types has no full_attention layer");
    } else if ((rc = opt_int(root, json_object_get(root, "sliding_window_pattern")
                                       ? "sliding_window_pattern" : "_sliding_window_pattern",
                             1, cfg->n_layer, 6, &period, err, err_len))) {
        return rc;
    }
    double base_local;
    if ((rc = opt_num(root, "rope_local_base_freq", 10000.0, &base_local, err, err_len)))
        return rc;
    cairn_gguf_builder_set_u32(b, "gemma3.attention.sliding_window", (uint32_t)window);
    cairn_gguf_builder_set_u32(b, "gemma3.attention.sliding_window_pattern", (uint32_t)period);
    return cairn_gguf_builder_set_f32(b, "gemma3.rope.freq_base_swa", (float)base_local);
}

/* The experts of Qwen2-MoE, Qwen3-MoE, Mixtral and gpt-oss: how many, how
 * many a token uses, their width, whether the chosen weights are
 * renormalised (fixed per family in cairn, as in llama.cpp: a config that
 * says otherwise is refused), and no dense layers among them. gpt-oss's
 * router (a softmax over the chosen k) has no field to check. */
static int read_experts(json_t *root, ckpt_config *cfg, cairn_gguf_builder *b, char *err,
                        size_t err_len)
{
    const char *A = cfg->arch;
    const bool qwen3 = strcmp(A, "qwen3moe") == 0, qwen2 = strcmp(A, "qwen2moe") == 0;
    int used = 0, rc;
    const bool local = cfg->mixtral || cfg->oss; /* their field names */
    if ((rc = need_int(root, local ? "num_local_experts" : "num_experts", 1, 1024,
                       &cfg->n_expert, err, err_len)) ||
        (rc = need_int(root, "num_experts_per_tok", 1, cfg->n_expert, &used, err, err_len)))
        return rc;
    cfg->expert_ffn = cfg->ffn; /* Mixtral's and gpt-oss's experts are intermediate_size wide */
    if (!local) {
        int step;
        if ((rc = need_int(root, "moe_intermediate_size", 1, 1 << 20, &cfg->expert_ffn, err,
                           err_len)) ||
            (rc = opt_int(root, "decoder_sparse_step", 0, 1024, 1, &step, err, err_len)))
            return rc;
        json_t *dense = json_object_get(root, "mlp_only_layers");
        if (step != 1 || (json_is_array(dense) && json_array_size(dense) > 0))
            return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                                "config.json: dense layers among the experts (decoder_sparse_step "
                                "%d, mlp_only_layers) are not supported", step);
        const bool norm = opt_bool(root, "norm_topk_prob", false); /* transformers' default */
        if (norm != qwen3)
            return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                                "config.json: norm_topk_prob %s is not supported for %s (cairn "
                                "%s the chosen experts' weights there, as llama.cpp does)",
                                norm ? "true" : "false (or absent)", A,
                                qwen3 ? "renormalises" : "does not renormalise");
    }
    if (qwen2 && (rc = need_int(root, "shared_expert_intermediate_size", 1, 1 << 20,
                                &cfg->shared_ffn, err, err_len)))
        return rc;
    char key[96];
    snprintf(key, sizeof key, "%s.expert_count", A);
    cairn_gguf_builder_set_u32(b, key, (uint32_t)cfg->n_expert);
    snprintf(key, sizeof key, "%s.expert_used_count", A);
    cairn_gguf_builder_set_u32(b, key, (uint32_t)used);
    snprintf(key, sizeof key, "%s.expert_feed_forward_length", A);
    cairn_gguf_builder_set_u32(b, key, (uint32_t)cfg->expert_ffn);
    if (qwen2) {
        snprintf(key, sizeof key, "%s.expert_shared_feed_forward_length", A);
        cairn_gguf_builder_set_u32(b, key, (uint32_t)cfg->shared_ffn);
    }
    return CAIRN_OK;
}

/* A config field's default, as a transformers config class has it. */
typedef struct {
    const char *key;
    double value;
} field_default;

/* Set each default on m where the field is absent, or (null_too) null. */
static void fill_defaults(json_t *m, const field_default *d, size_t n, bool null_too)
{
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_object_get(m, d[i].key);
        if (v && !(null_too && json_is_null(v)))
            continue;
        const double x = d[i].value;
        json_object_set_new(m, d[i].key,
                            x == (double)(json_int_t)x ? json_integer((json_int_t)x) : json_real(x));
    }
}

/* Gemma 3's model fields as transformers reads them: the text_config of a
 * Gemma3ForConditionalGeneration (4B, 12B, 27B) or the file itself, with
 * Gemma3TextConfig's defaults for what it leaves out (the 4B's text_config
 * names only five fields), and the file's quantization_config and name.
 * *out is a new reference. */
static int gemma_fields(json_t *file, bool multimodal, json_t **out, char *err, size_t err_len)
{
    json_t *src = multimodal ? json_object_get(file, "text_config") : file;
    if (!json_is_object(src))
        return cairn_errorf(err, err_len, CAIRN_EFORMAT,
                            "config.json: Gemma3ForConditionalGeneration without a text_config");
    json_t *m = json_deep_copy(src);
    if (!m)
        return CAIRN_ENOMEM;
    static const field_default defaults[] = {
        {"vocab_size", 262208},       {"hidden_size", 2304},
        {"intermediate_size", 9216},  {"num_hidden_layers", 26},
        {"num_attention_heads", 8},   {"num_key_value_heads", 4},
        {"head_dim", 256},            {"max_position_embeddings", 131072},
        {"rope_theta", 1e6},          {"query_pre_attn_scalar", 256},
        {"sliding_window", 4096},     {"rope_local_base_freq", 10000},
        {"rms_norm_eps", 1e-6},       {"bos_token_id", 2},
        {"eos_token_id", 1},
    };
    fill_defaults(m, defaults, sizeof defaults / sizeof defaults[0], true);
    if (!json_object_get(m, "hidden_activation") && !json_object_get(m, "hidden_act"))
        json_object_set_new(m, "hidden_activation", json_string("gelu_pytorch_tanh"));
    static const char *const from_file[] = {"quantization_config", "_name_or_path",
                                            "tie_word_embeddings"};
    for (size_t i = 0; multimodal && i < sizeof from_file / sizeof from_file[0]; i++)
        if (json_object_get(file, from_file[i]) && !json_object_get(m, from_file[i]))
            json_object_set(m, from_file[i], json_object_get(file, from_file[i]));
    *out = m;
    return CAIRN_OK;
}

/* gpt-oss's model fields as transformers reads them: GptOssConfig's
 * defaults for what the file leaves out (the default rope_scaling included:
 * YaRN x32 over 4096 tokens, truncate false), and transformers 5's
 * rope_parameters read as rope_scaling and rope_theta. *out is a new
 * reference. */
static int oss_fields(json_t *file, json_t **out)
{
    json_t *m = json_deep_copy(file);
    if (!m)
        return CAIRN_ENOMEM;
    static const field_default defaults[] = {
        {"vocab_size", 201088},       {"hidden_size", 2880},
        {"intermediate_size", 2880},  {"num_hidden_layers", 36},
        {"num_attention_heads", 64},  {"num_key_value_heads", 8},
        {"head_dim", 64},             {"num_local_experts", 128},
        {"num_experts_per_tok", 4},   {"sliding_window", 128},
        {"max_position_embeddings", 131072}, {"rms_norm_eps", 1e-5},
        {"rope_theta", 150000},
    };
    json_t *params = json_object_get(m, "rope_parameters");
    if (json_is_object(params) && !json_object_get(m, "rope_scaling")) {
        json_t *theta = json_object_get(params, "rope_theta");
        if (theta && !json_object_get(m, "rope_theta"))
            json_object_set(m, "rope_theta", theta);
        json_object_set(m, "rope_scaling", params);
    }
    /* absent only: an explicit null is the file's own value (sliding_window
     * null is refused by name in read_oss) */
    fill_defaults(m, defaults, sizeof defaults / sizeof defaults[0], false);
    if (!json_object_get(m, "rope_scaling"))
        json_object_set_new(m, "rope_scaling",
                            json_pack("{s:s, s:f, s:f, s:f, s:b, s:i}", "rope_type", "yarn",
                                      "factor", 32.0, "beta_fast", 32.0, "beta_slow", 1.0,
                                      "truncate", 0, "original_max_position_embeddings", 4096));
    *out = m;
    return CAIRN_OK;
}

/* gpt-oss: the clamp of its SwiGLU, its local layers' window and which
 * layers are local (model.c runs llama.cpp's form only: even layers local,
 * odd ones global), written as the keys a converted GGUF has. */
static int read_oss(json_t *root, ckpt_config *cfg, cairn_gguf_builder *b, char *err,
                    size_t err_len)
{
    /* the kernels clamp at 7 with sigmoid(1.702 x), the constants of
     * transformers' GptOssExperts and llama.cpp; the config names only the
     * first */
    double limit;
    int rc = opt_num(root, "swiglu_limit", 7.0, &limit, err, err_len);
    if (rc)
        return rc;
    if (limit != 7.0)
        return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                            "config.json: swiglu_limit %g is not supported (cairn's gpt-oss "
                            "experts clamp at 7)", limit);
    if (json_is_null(json_object_get(root, "sliding_window")))
        return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                            "config.json: sliding_window null (local layers without a window) is "
                            "not supported for gpt-oss");
    int window = 0;
    if ((rc = need_int(root, "sliding_window", 1, 1 << 24, &window, err, err_len)))
        return rc;
    if (window > cfg->n_ctx)
        return cairn_errorf(err, err_len, CAIRN_EFORMAT,
                            "config.json: sliding_window %d is wider than the context (%d)", window,
                            cfg->n_ctx);
    json_t *types = json_object_get(root, "layer_types");
    if (types && !json_is_null(types)) { /* null: transformers' default, the pattern below */
        if (!json_is_array(types) || (int)json_array_size(types) != cfg->n_layer)
            return cairn_errorf(err, err_len, CAIRN_EFORMAT,
                                "config.json: layer_types must list %d layers", cfg->n_layer);
        for (int l = 0; l < cfg->n_layer; l++) {
            const char *t = json_string_value(json_array_get(types, l));
            const char *want = l % 2 ? "full_attention" : "sliding_attention";
            if (!t || strcmp(t, want) != 0)
                return cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                                    "config.json: layer_types[%d] is '%s'; cairn runs gpt-oss with "
                                    "sliding_attention on even layers and full_attention on odd "
                                    "ones", l, t ? t : "?");
        }
    }
    return cairn_gguf_builder_set_u32(b, "gpt-oss.attention.sliding_window", (uint32_t)window);
}

int ckpt_config_read(const char *dir, ckpt_config *cfg, cairn_gguf_builder *b, char *err,
                     size_t err_len)
{
    memset(cfg, 0, sizeof *cfg);
    json_t *root = NULL;
    int rc = ckpt_read_json(dir, "config.json", false, &root, err, err_len);
    if (rc)
        return rc;
    json_t *archs = json_object_get(root, "architectures");
    /* a copy: root may be replaced below (gemma_fields) */
    char hf_name[128] = "";
    const char *hf = json_is_array(archs) ? json_string_value(json_array_get(archs, 0)) : NULL;
    if (hf) {
        snprintf(hf_name, sizeof hf_name, "%s", hf);
        hf = hf_name;
    }
    for (size_t i = 0; hf && i < sizeof ARCHES / sizeof ARCHES[0]; i++)
        if (strcmp(hf, ARCHES[i].hf) == 0)
            cfg->arch = ARCHES[i].arch;
    if (!cfg->arch) {
        char known[256] = "";
        for (size_t i = 0, at = 0; i < sizeof ARCHES / sizeof ARCHES[0]; i++)
            at += (size_t)snprintf(known + at, sizeof known - at, "%s%s", i ? ", " : "",
                                   ARCHES[i].hf);
        rc = cairn_errorf(err, err_len, hf ? CAIRN_EUNSUPPORTED : CAIRN_EFORMAT,
                          hf ? "config.json: architecture '%s' is not supported (supported: %s)"
                             : "config.json: no architectures list%s",
                          hf ? hf : "", hf ? known : "");
        goto out;
    }
    const char *A = cfg->arch;
    cfg->llama_rope = strcmp(A, "llama") == 0;
    cfg->gemma = strcmp(A, "gemma3") == 0;
    cfg->mixtral = strcmp(hf, "MixtralForCausalLM") == 0;
    cfg->oss = strcmp(A, "gpt-oss") == 0;
    if (cfg->oss) {
        json_t *file = root, *fields = NULL;
        rc = oss_fields(file, &fields);
        json_decref(file);
        root = fields;
        if (rc)
            goto out;
    }
    if (cfg->gemma) {
        json_t *file = root, *fields = NULL;
        rc = gemma_fields(file, strcmp(hf, "Gemma3ForConditionalGeneration") == 0, &fields, err,
                          err_len);
        json_decref(file);
        root = fields;
        if (rc)
            goto out;
    }
    if ((rc = need_int(root, "hidden_size", 1, 1 << 16, &cfg->dim, err, err_len)) ||
        (rc = need_int(root, "intermediate_size", 1, 1 << 20, &cfg->ffn, err, err_len)) ||
        (rc = need_int(root, "num_hidden_layers", 1, 1024, &cfg->n_layer, err, err_len)) ||
        (rc = need_int(root, "num_attention_heads", 1, 1024, &cfg->n_head, err, err_len)) ||
        (rc = need_int(root, "vocab_size", 1, 1 << 24, &cfg->n_vocab, err, err_len)) ||
        (rc = opt_int(root, "num_key_value_heads", 1, 1024, cfg->n_head, &cfg->n_kv, err,
                      err_len)) ||
        (rc = opt_int(root, "max_position_embeddings", 1, 1 << 24, 2048, &cfg->n_ctx, err,
                      err_len)))
        goto out;
    if (cfg->dim % cfg->n_head && !json_object_get(root, "head_dim")) {
        rc = cairn_errorf(err, err_len, CAIRN_EFORMAT,
                          "config.json: hidden_size %d is not a multiple of %d heads", cfg->dim,
                          cfg->n_head);
        goto out;
    }
    if ((rc = opt_int(root, "head_dim", 1, 1024, cfg->dim / cfg->n_head, &cfg->head_dim, err,
                      err_len)))
        goto out;
    double eps, theta, partial;
    if ((rc = opt_num(root, "rms_norm_eps", 1e-6, &eps, err, err_len)) ||
        (rc = opt_num(root, "rope_theta", 10000.0, &theta, err, err_len)) ||
        (rc = opt_num(root, "partial_rotary_factor", 1.0, &partial, err, err_len)))
        goto out;
    cfg->rope_theta = (float)theta;
    cfg->tied = opt_bool(root, "tie_word_embeddings", cfg->gemma); /* Gemma's default: tied */
    cfg->bos_id = ckpt_json_id(root, "bos_token_id", 0);
    cfg->eos_id = ckpt_json_id(root, "eos_token_id", 0);
    /* Gemma's configs name the activation hidden_activation (hidden_act, when
     * also there, is a leftover the model does not read) */
    const char *act_key = cfg->gemma ? "hidden_activation" : "hidden_act";
    const char *act = opt_str(root, act_key);
    if (!act)
        act = opt_str(root, act_key = cfg->gemma ? "hidden_act" : "hidden_activation");
    const char *want_act = cfg->gemma ? "gelu_pytorch_tanh" : "silu";
    if (act && strcmp(act, want_act) != 0) {
        rc = cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                          "config.json: %s '%s' is not supported for %s (%s)", act_key, act, hf,
                          want_act);
        goto out;
    }
    if (cfg->llama_rope && (opt_bool(root, "attention_bias", false) || opt_bool(root, "mlp_bias", false))) {
        rc = cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                          "config.json: llama with attention_bias or mlp_bias is not supported");
        goto out;
    }
    /* Mistral and Mixtral apply their sliding_window whenever it is set
     * (Qwen2 only under use_sliding_window, refused below); a window as wide
     * as the context changes nothing */
    int mistral_window = 0;
    if ((strcmp(hf, "MistralForCausalLM") == 0 || cfg->mixtral) &&
        (rc = opt_int(root, "sliding_window", 1, 1 << 24, 0, &mistral_window, err, err_len)))
        goto out;
    if (opt_bool(root, "use_sliding_window", false)) {
        rc = cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                          "config.json: use_sliding_window is true; cairn runs %s with full "
                          "attention only", A);
        goto out;
    }
    const int n_rot = (int)(cfg->head_dim * partial + 0.5);
    if (n_rot <= 0 || n_rot > cfg->head_dim || n_rot % 2) {
        rc = cairn_errorf(err, err_len, CAIRN_EFORMAT,
                          "config.json: partial_rotary_factor %g gives %d rotary dimensions",
                          partial, n_rot);
        goto out;
    }

    /* before the context length is written: YaRN may stretch it */
    if ((rc = read_rope_scaling(root, cfg, b, A, err, err_len)))
        goto out;
    char key[96];
#define ARCH_KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, A), key)
    cairn_gguf_builder_set_str(b, "general.architecture", A);
    const char *name = opt_str(root, "_name_or_path");
    const char *base = strrchr(dir, '/');
    base = base && base[1] ? base + 1 : dir;
    cairn_gguf_builder_set_str(b, "general.name", name && name[0] ? name : base);
    cairn_gguf_builder_set_u32(b, ARCH_KEY("context_length"), (uint32_t)cfg->n_ctx);
    cairn_gguf_builder_set_u32(b, ARCH_KEY("embedding_length"), (uint32_t)cfg->dim);
    cairn_gguf_builder_set_u32(b, ARCH_KEY("block_count"), (uint32_t)cfg->n_layer);
    cairn_gguf_builder_set_u32(b, ARCH_KEY("feed_forward_length"), (uint32_t)cfg->ffn);
    cairn_gguf_builder_set_u32(b, ARCH_KEY("attention.head_count"), (uint32_t)cfg->n_head);
    cairn_gguf_builder_set_u32(b, ARCH_KEY("attention.head_count_kv"), (uint32_t)cfg->n_kv);
    cairn_gguf_builder_set_u32(b, ARCH_KEY("attention.key_length"), (uint32_t)cfg->head_dim);
    cairn_gguf_builder_set_u32(b, ARCH_KEY("attention.value_length"), (uint32_t)cfg->head_dim);
    cairn_gguf_builder_set_u32(b, ARCH_KEY("rope.dimension_count"), (uint32_t)n_rot);
    cairn_gguf_builder_set_f32(b, ARCH_KEY("attention.layer_norm_rms_epsilon"), (float)eps);
    cairn_gguf_builder_set_f32(b, ARCH_KEY("rope.freq_base"), (float)theta);
    if (mistral_window > 0 && mistral_window < cfg->n_ctx)
        cairn_gguf_builder_set_u32(b, ARCH_KEY("attention.sliding_window"),
                                   (uint32_t)mistral_window);
#undef ARCH_KEY
    if ((cfg->gemma && (rc = read_gemma(root, cfg, b, err, err_len))) ||
        (cfg->oss && (rc = read_oss(root, cfg, b, err, err_len))) ||
        ((strstr(A, "moe") || cfg->mixtral || cfg->oss) &&
         (rc = read_experts(root, cfg, b, err, err_len))) ||
        (rc = read_quantization(root, cfg, err, err_len)))
        goto out;
    static const char *const methods[] = {"none", "awq", "gptq", "fp8", "compressed-tensors int4",
                                          "mxfp4"};
    /* gpt-oss's experts are stacked tensors that only the MXFP4 and float
     * forms describe (weights.c); its other weights are never quantized */
    if (cfg->oss && cfg->quant != QM_NONE && cfg->quant != QM_MXFP4) {
        rc = cairn_errorf(err, err_len, CAIRN_EUNSUPPORTED,
                          "config.json: GptOssForCausalLM quantized as %s is not supported "
                          "(quant_method mxfp4, or none: BF16)", methods[cfg->quant]);
        goto out;
    }
    cairn_gguf_builder_set_str(b, "cairn.source.format", "safetensors");
    rc = cairn_gguf_builder_set_str(b, "cairn.source.quantization", methods[cfg->quant]);
out:
    json_decref(root);
    return rc;
}
