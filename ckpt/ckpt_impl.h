/*
 * ckpt/ckpt_impl.h — the parts of the checkpoint reader (ckpt/ckpt.h), for
 * the files of this folder only.
 *
 *   safetensors.c   the .safetensors files of a folder (one, or the shards
 *                   an index names): mapped, every header entry checked
 *   config.c        config.json (+ generation_config.json) -> hyper-parameters
 *   tokenizer_json.c  tokenizer.json + tokenizer_config.json -> vocabulary,
 *                   merges, special ids, chat template
 *   weights.c       HF tensor names -> GGUF names, and the weight formats
 *                   (BF16/F16/F32, AWQ, GPTQ, FP8, gpt-oss's MXFP4 experts)
 *                   -> cairn types
 *   ckpt.c          the folder as one cairn_gguf (cairn_ckpt_open)
 */
#ifndef CAIRN_CKPT_IMPL_H
#define CAIRN_CKPT_IMPL_H

#include "ckpt/ckpt.h"

#include <jansson.h>

/* ---- safetensors ---------------------------------------------------------- */

typedef enum {
    ST_BOOL, ST_U8, ST_I8, ST_I16, ST_U16, ST_F16, ST_BF16, ST_I32, ST_U32, ST_F32, ST_F64,
    ST_I64, ST_U64, ST_F8_E4M3, ST_F8_E5M2,
} st_dtype;

typedef struct {
    const char *name;     /* owned by the set */
    st_dtype dtype;
    int n_dims;           /* 0 (scalar) .. 4 */
    int64_t shape[4];     /* outermost first, as torch writes them */
    int64_t n_elems;
    const uint8_t *data;  /* inside the file's mapping; no alignment promised */
    size_t size;
    const char *file;     /* the shard's file name, for messages */
} st_tensor;

typedef struct st_set st_set;

/* Map every safetensors file of `dir`: model.safetensors.index.json's
 * shards when it exists, else model.safetensors, else the one *.safetensors
 * file there. */
int st_open_dir(const char *dir, st_set **out, char *err, size_t err_len);
void st_close(st_set *s);
const st_tensor *st_find(const st_set *s, const char *name);
int st_count(const st_set *s);
const st_tensor *st_at(const st_set *s, int i);
size_t st_dtype_size(st_dtype t);
const char *st_dtype_name(st_dtype t);
/* Hand the mappings to the builder (released with the cairn_gguf). */
int st_keep_maps(st_set *s, cairn_gguf_builder *b);

/* ---- JSON files ------------------------------------------------------------ */

/* Read dir/name as JSON: CAIRN_ENOTFOUND when absent (and optional),
 * CAIRN_EFORMAT with the parser's line and column when malformed. */
int ckpt_read_json(const char *dir, const char *name, bool optional, json_t **out, char *err,
                   size_t err_len);

/* A token id field (bos_token_id, eos_token_id): an integer, or element
 * `which` of a list of them; -1 when absent or not an integer. */
int64_t ckpt_json_id(json_t *o, const char *key, int which);

/* ---- config.json ------------------------------------------------------------- */

/* QM_CT_INT4: compressed-tensors "pack-quantized" 4-bit integers; QM_MXFP4:
 * transformers' "mxfp4" (gpt-oss: the experts only, as _blocks/_scales) */
typedef enum { QM_NONE, QM_AWQ, QM_GPTQ, QM_FP8, QM_CT_INT4, QM_MXFP4 } ckpt_quant_method;

typedef struct {
    const char *arch;      /* cairn's name: llama, qwen2, qwen3, gemma3, qwen2moe, qwen3moe,
                              gpt-oss */
    bool gemma;            /* Gemma's names, and norms stored as w for x * (1 + w) */
    bool oss;              /* gpt-oss: biases, sinks, a router with a bias, and every layer's
                              experts as three stacked tensors (weights.c) */
    int n_layer, dim, ffn, n_head, n_kv, head_dim, n_vocab, n_ctx;
    int64_t bos_id, eos_id; /* bos_token_id, eos_token_id (the first of a list); -1: none */
    bool tied;             /* tie_word_embeddings */
    bool llama_rope;       /* HF llama's rotate-half q/k rows: permute to GGUF's order */
    /* mixture of experts (0 experts: dense); mixtral names them block_sparse_moe.* */
    int n_expert, expert_ffn, shared_ffn;
    bool mixtral;
    /* quantization_config */
    ckpt_quant_method quant;
    int group_size;        /* 4-bit groups; -1: a whole row (act-order: from g_idx) */
    bool sym, gptq_v1_zeros;
    bool fp8_block;        /* FP8 with weight_block_size (weight_scale_inv) */
    int fp8_block_rows, fp8_block_cols;
    /* llama3 rope scaling, when given */
    bool llama3_rope;
    float rope_factor, rope_low_freq, rope_high_freq;
    int rope_orig_ctx;
    float rope_theta;
} ckpt_config;

/* Parse config.json (and generation_config.json when present) into `cfg`
 * and the builder's `<arch>.*` and `general.*` keys. */
int ckpt_config_read(const char *dir, ckpt_config *cfg, cairn_gguf_builder *b, char *err,
                     size_t err_len);

/* ---- tokenizer --------------------------------------------------------------- */

/* tokenizer.json (+ tokenizer_config.json, generation_config.json) into the
 * builder's tokenizer.ggml.* keys for cfg->n_vocab ids; cfg's bos/eos ids
 * are the fallback when tokenizer_config.json names none. */
int ckpt_tokenizer_read(const char *dir, const ckpt_config *cfg, cairn_gguf_builder *b, char *err,
                        size_t err_len);

/* ---- weights ----------------------------------------------------------------- */

/* Every tensor the model needs, under its GGUF name, in a cairn type. */
int ckpt_weights_add(const st_set *s, const ckpt_config *cfg, cairn_gguf_builder *b, char *err,
                     size_t err_len);

#endif /* CAIRN_CKPT_IMPL_H */
