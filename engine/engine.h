/*
 * engine/engine.h — model execution: GGUF files, vocabularies and
 * tokenization, the transformer forward pass over paged KV, and sampling.
 *
 * This is the only engine header other modules include. It has four parts,
 * each an opaque handle with create/free functions:
 *
 *   cairn_gguf      a read-only, memory-mapped GGUF file (metadata + tensors)
 *   cairn_vocab     a tokenizer built from GGUF metadata (SentencePiece or
 *                   byte-level BPE)
 *   cairn_model     hyper-parameters and weights resident in a backend, and the
 *                   forward pass over a batch of sequences
 *   cairn_sampler   turns a row of logits into a token
 *   cairn_eagle     an EAGLE draft head; cairn_eagle_seq decodes one sequence
 *                   speculatively with it (lossless)
 *
 * Ownership: a `*_open`/`*_load`/`*_create` function gives the caller a new
 * object, released by the matching `*_close`/`*_free`. Borrowed pointers
 * (strings, tensor data, the vocab of a model) stay valid until their owner
 * is released. None of these objects is safe to use from two threads at once;
 * distinct objects are independent. All functions return CAIRN_OK or a
 * negative status from common/common.h; those that take `char *err, size_t
 * err_len` also write a one-line human explanation there on failure.
 */
#ifndef CAIRN_ENGINE_H
#define CAIRN_ENGINE_H

#include "common/common.h"
#include "kernels/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================== */
/* GGUF                                                                     */
/* ======================================================================== */
/*
 * A GGUF file (versions 2 and 3, little-endian) is:
 *
 *   magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv x  { string key | u32 value_type | value }
 *   n_tensors x { string name | u32 n_dims | u64 ne[n_dims] | u32 type | u64 offset }
 *   padding to `general.alignment` (default 32)
 *   tensor data: each tensor at data_start + offset (offset aligned)
 *
 * The file is mmap'ed read-only. Opening validates everything before anything
 * is trusted: every length against the bytes that remain, string lengths and
 * array counts against caps, tensor types against the known types, each
 * tensor's byte size (from its shape and type) against the data section, and
 * offsets against alignment and overlap. A truncated or corrupt file fails
 * with CAIRN_EFORMAT and a message naming the field, never a crash.
 */

typedef struct cairn_gguf cairn_gguf;

typedef enum {
    CAIRN_GGUF_UINT8 = 0,
    CAIRN_GGUF_INT8 = 1,
    CAIRN_GGUF_UINT16 = 2,
    CAIRN_GGUF_INT16 = 3,
    CAIRN_GGUF_UINT32 = 4,
    CAIRN_GGUF_INT32 = 5,
    CAIRN_GGUF_FLOAT32 = 6,
    CAIRN_GGUF_BOOL = 7,
    CAIRN_GGUF_STRING = 8,
    CAIRN_GGUF_ARRAY = 9,
    CAIRN_GGUF_UINT64 = 10,
    CAIRN_GGUF_INT64 = 11,
    CAIRN_GGUF_FLOAT64 = 12,
} cairn_gguf_vtype;

typedef struct {
    const char *name;    /* NUL-terminated copy owned by the cairn_gguf      */
    int n_dims;          /* 1..4                                             */
    int64_t ne[4];       /* elements per dimension, ne[0] fastest-varying;   */
                         /* unused dims are 1                                */
    cairn_type type;
    uint64_t offset;     /* from the start of the data section               */
    uint64_t size;       /* bytes                                            */
    const void *data;    /* inside the mapping                               */
} cairn_gguf_tensor;

/* Open and validate `path`. On success *out owns the mapping. GGUF v1,
 * big-endian files and tensor types cairn does not know give
 * CAIRN_EUNSUPPORTED; damage gives CAIRN_EFORMAT. */
int cairn_gguf_open(const char *path, cairn_gguf **out, char *err, size_t err_len);

/* Parse an in-memory image (not copied; must outlive the handle). Used by
 * tests and fuzzers; identical validation. */
int cairn_gguf_open_memory(const void *data, size_t size, cairn_gguf **out, char *err,
                           size_t err_len);
void cairn_gguf_close(cairn_gguf *g);

uint32_t cairn_gguf_version(const cairn_gguf *g);
size_t cairn_gguf_alignment(const cairn_gguf *g);
const void *cairn_gguf_file_data(const cairn_gguf *g, size_t *size);

/* Metadata. Keys are looked up by exact name; index order is file order. */
int64_t cairn_gguf_n_kv(const cairn_gguf *g);
int64_t cairn_gguf_find_key(const cairn_gguf *g, const char *key); /* -1 when absent */
const char *cairn_gguf_key(const cairn_gguf *g, int64_t i);
cairn_gguf_vtype cairn_gguf_kv_type(const cairn_gguf *g, int64_t i);

/* Typed getters by key. Integer getters accept any integer or bool value that
 * fits the requested type; the float getter accepts FLOAT32/FLOAT64 and
 * integers. CAIRN_ENOTFOUND when absent, CAIRN_EFORMAT when of another type
 * or out of range. Strings are not NUL-terminated in the file: *len is given,
 * and *str is NUL-terminated by the reader (a copy it owns). */
int cairn_gguf_get_u32(const cairn_gguf *g, const char *key, uint32_t *out);
int cairn_gguf_get_i64(const cairn_gguf *g, const char *key, int64_t *out);
int cairn_gguf_get_f32(const cairn_gguf *g, const char *key, float *out);
int cairn_gguf_get_bool(const cairn_gguf *g, const char *key, bool *out);
int cairn_gguf_get_str(const cairn_gguf *g, const char *key, const char **str, size_t *len);

/* Arrays: element type and count; scalar elements as a packed little-endian
 * array inside the mapping (may be unaligned: read with memcpy); string
 * elements one at a time (CAIRN_EINVAL for an index out of range). For string
 * and nested arrays *data is NULL. Nested arrays are parsed and validated but
 * can only be counted. */
int cairn_gguf_get_arr(const cairn_gguf *g, const char *key, cairn_gguf_vtype *elem_type,
                       uint64_t *n, const void **data);
int cairn_gguf_get_arr_str(const cairn_gguf *g, const char *key, uint64_t i, const char **str,
                           size_t *len);

/* Tensors. */
int64_t cairn_gguf_n_tensors(const cairn_gguf *g);
const cairn_gguf_tensor *cairn_gguf_tensor_at(const cairn_gguf *g, int64_t i);
const cairn_gguf_tensor *cairn_gguf_find_tensor(const cairn_gguf *g, const char *name);

/* ======================================================================== */
/* Vocabulary and tokenizer                                                 */
/* ======================================================================== */
/*
 * Built from `tokenizer.ggml.*` metadata; works on vocab-only GGUF files.
 *
 *   model "llama"  SentencePiece: scores, a "▁" space marker, optional space
 *                  prefix, <0xNN> byte fallback for characters not in vocab.
 *   model "gpt2"   byte-level BPE: the text is split by the pre-tokenizer
 *                  named in `tokenizer.ggml.pre` (PCRE2 regexes with Unicode
 *                  properties), each piece mapped to byte-level symbols and
 *                  merged by rank from `tokenizer.ggml.merges`.
 *
 * Control tokens (<s>, <|im_start|>, ...) are only recognised in the input
 * text when CAIRN_TOK_PARSE_SPECIAL is given; by default their text is
 * tokenized as ordinary characters, so user text cannot inject turn markers.
 * User-defined (added) tokens are always matched, as the reference tokenizers
 * do (mpt's runs of spaces are such tokens) — except end-of-turn markers
 * (<|im_end|>, <|eot_id|>, <|end|>, ...), which count as control whatever
 * type the file gives them. Special matching is leftmost, then longest.
 */

typedef struct cairn_vocab cairn_vocab;

enum {
    CAIRN_TOK_ADD_BOS = 1 << 0,       /* prepend BOS (only if the vocab has one) */
    CAIRN_TOK_PARSE_SPECIAL = 1 << 1, /* match special-token strings in text     */
};

typedef enum {
    CAIRN_VOCAB_SPM = 1, /* "llama"  */
    CAIRN_VOCAB_BPE = 2, /* "gpt2"   */
} cairn_vocab_kind;

/* Build a vocab from a GGUF's metadata. The vocab copies what it needs; the
 * gguf may be closed afterwards. */
int cairn_vocab_load(const cairn_gguf *g, cairn_vocab **out, char *err, size_t err_len);
void cairn_vocab_free(cairn_vocab *v);

cairn_vocab_kind cairn_vocab_kind_of(const cairn_vocab *v);
int32_t cairn_vocab_n_tokens(const cairn_vocab *v);
int32_t cairn_vocab_bos(const cairn_vocab *v); /* -1 when none */
int32_t cairn_vocab_eos(const cairn_vocab *v); /* -1 when none */
bool cairn_vocab_add_bos(const cairn_vocab *v); /* the model asks for BOS     */
/* End of generation: eos, eot, <|im_end|> and the like. */
bool cairn_vocab_is_eog(const cairn_vocab *v, int32_t token);
/* The token's stored text (SentencePiece "▁" / byte-level symbols as-is). */
const char *cairn_vocab_token_text(const cairn_vocab *v, int32_t token);

/* Tokenize `len` bytes of UTF-8 `text` (invalid bytes are treated as single
 * characters, never rejected; a byte a byte-level vocabulary cannot spell
 * becomes its unknown token only when that is not a control token, else
 * U+FFFD — so plain text can never produce an end-of-generation token). Writes at most `cap` ids to `out`; *n_out is
 * always set to the full count, and CAIRN_ERANGE is returned when it exceeds
 * `cap`, so a caller can retry with a larger buffer. */
int cairn_tokenize(const cairn_vocab *v, const char *text, size_t len, int flags, int32_t *out,
                   size_t cap, size_t *n_out);

/* The bytes a token stands for: "▁" becomes a space, <0xNN> its byte,
 * byte-level symbols their bytes. Control tokens give "" unless `special`.
 * Same size contract as cairn_tokenize. The bytes may be part of a UTF-8
 * character; use cairn_detok to stream text. */
int cairn_token_to_piece(const cairn_vocab *v, int32_t token, bool special, char *out,
                         size_t cap, size_t *n_out);

/* Streaming detokenizer: push tokens, get back only complete UTF-8 (bytes of
 * a character split across tokens are held until it completes; bytes that can
 * never form valid UTF-8 come out as U+FFFD). The vocab must outlive it. */
typedef struct cairn_detok cairn_detok;
int cairn_detok_create(const cairn_vocab *v, bool special, cairn_detok **out);
void cairn_detok_free(cairn_detok *d);
/* Appends the text now complete to out (cap bytes; a token never yields more
 * than 256 bytes plus 3 held ones, so cap >= 260 always suffices). */
int cairn_detok_push(cairn_detok *d, int32_t token, char *out, size_t cap, size_t *n_out);
/* Emits whatever is held (as U+FFFD for an incomplete character). */
int cairn_detok_flush(cairn_detok *d, char *out, size_t cap, size_t *n_out);

/* ======================================================================== */
/* Model and forward pass                                                   */
/* ======================================================================== */

typedef struct {
    char arch[32];        /* "llama", "qwen2" or "qwen3"                      */
    char name[128];       /* general.name, or the file name                   */
    int n_vocab;
    int n_ctx_train;
    int dim;              /* embedding width                                  */
    int n_layer;
    int n_head;
    int n_kv_head;
    int head_dim;         /* attention.key_length, else dim / n_head (qwen3's
                             heads are wider: n_head * head_dim > dim)        */
    int ffn_dim;
    int n_rot;            /* rotated dims per head                            */
    float rope_freq_base;
    float rope_freq_scale;
    cairn_rope_mode rope_mode;
    float rms_eps;
    bool tied_embeddings; /* output projection reuses token_embd              */
} cairn_hparams;

typedef struct cairn_model cairn_model;

typedef struct {
    int max_batch_tokens;  /* most new tokens one forward call may carry
                              (scratch is sized for it once); default 512     */
    int max_seqs;          /* most sequences per call; default 64             */
} cairn_model_params;

/* Load `path` onto `be` (borrowed; must outlive the model). Weights are
 * uploaded once; the GGUF is closed afterwards. Unsupported architectures or
 * tensor types are refused with a message naming them. `params` may be NULL
 * for the defaults. */
int cairn_model_load(const char *path, cairn_backend *be, const cairn_model_params *params,
                     cairn_model **out, char *err, size_t err_len);
void cairn_model_free(cairn_model *m);

const cairn_hparams *cairn_model_hparams(const cairn_model *m);
const cairn_vocab *cairn_model_vocab(const cairn_model *m); /* owned by the model */
cairn_backend *cairn_model_backend(const cairn_model *m);

/* 128-bit fingerprint of the weights (XXH3-128 over every tensor's name,
 * type, shape and data). Part of the KV page-hash namespace. */
void cairn_model_fingerprint(const cairn_model *m, uint8_t out[16]);

/* The KV page geometry this model needs at `page_size` tokens per page. */
int cairn_model_kv_layout(const cairn_model *m, int page_size, cairn_type dtype,
                          cairn_kv_layout *out);

/* One sequence's part of a forward call: `n_tokens` new tokens whose KV is
 * written at KV indices kv_start .. kv_start+n_tokens-1 of the sequence's
 * page table, attending to indices 0 .. kv_start+n_tokens-1. */
typedef struct {
    const int32_t *tokens;  /* [n_tokens]                                     */
    int n_tokens;
    const int32_t *pos;     /* [n_tokens] RoPE positions; NULL = kv_start + i */
    int kv_start;
    const int32_t *pages;   /* page table covering kv_start + n_tokens        */
    const uint8_t *mask;    /* optional [n_tokens][kv_start+n_tokens] tree mask */
    const uint8_t *want;    /* [n_tokens] 1 = return logits for this token;
                               NULL = only the last token                     */
} cairn_seq_batch;

/* Run the forward pass for `n_seqs` sequences at once.
 *   kv_pool    backend memory laid out by cairn_model_kv_layout(page_size, dtype)
 *   logits     host [n_out][n_vocab], rows in (sequence, token) order of `want`
 *   hidden     optional host [n_out][dim]: final hidden state after the
 *              output norm for the same rows (EAGLE's feature)
 *   n_out      set to the number of rows written
 * CAIRN_ERANGE when the batch exceeds max_batch_tokens / max_seqs or a
 * position exceeds the context. Nothing is allocated per call. */
int cairn_model_forward(cairn_model *m, void *kv_pool, const cairn_kv_layout *kv,
                        const cairn_seq_batch *seqs, int n_seqs, float *logits, float *hidden,
                        int *n_out);

/* The same, with `features` (required) host [T][dim]: the final hidden state
 * after the output norm of every token of the batch, in batch order (T = the
 * sum of n_tokens), wanted or not; logits only for the wanted rows. A server
 * that keeps an EAGLE head's KV in step with the target feeds these to
 * cairn_eagle_seq_advance. */
int cairn_model_forward_features(cairn_model *m, void *kv_pool, const cairn_kv_layout *kv,
                                 const cairn_seq_batch *seqs, int n_seqs, float *logits,
                                 float *features, int *n_out);

/* ======================================================================== */
/* Sampler                                                                  */
/* ======================================================================== */
/*
 * Order of operations (the order llama.cpp's default chain uses, so settings
 * mean the same thing): logit bias → penalties over the last
 * `penalty_last_n` accepted tokens → top-k → top-p → min-p → temperature →
 * draw. temperature <= 0 is
 * greedy (argmax after penalties; ties go to the lowest id). A given seed
 * reproduces the same draws on every machine (xoshiro256** generator).
 */

#define CAIRN_MAX_LOGIT_BIAS 300 /* entries of cairn_sampling_params.logit_bias */

typedef struct {
    float temperature;      /* 0 = greedy; default 0.8                         */
    int top_k;              /* <= 0 disables; default 40                       */
    float top_p;            /* 1 disables; default 0.95                        */
    float min_p;            /* 0 disables; default 0.05                        */
    float repeat_penalty;   /* 1 disables; default 1                           */
    float frequency_penalty;/* 0 disables                                      */
    float presence_penalty; /* 0 disables                                      */
    int penalty_last_n;     /* window for penalties; default 64                */
    uint64_t seed;
    int n_logprobs;         /* top alternatives to report, 0..20               */
    /* Logit bias (OpenAI's logit_bias): `bias` is added to the logit of
     * `token` before anything else (penalties see the biased value); -100
     * all but bans a token, +100 all but forces it. Logprobs stay the
     * model's own. Tokens must be in the vocabulary, biases in [-100, 100];
     * a token listed twice takes its last bias. */
    int n_logit_bias;       /* 0..CAIRN_MAX_LOGIT_BIAS                         */
    struct {
        int32_t token;
        float bias;
    } logit_bias[CAIRN_MAX_LOGIT_BIAS];
} cairn_sampling_params;

/* The defaults listed above. */
cairn_sampling_params cairn_sampling_defaults(void);
/* Whether any repetition/frequency/presence penalty is in effect (a window
 * and a penalty that changes something). */
bool cairn_sampling_has_penalties(const cairn_sampling_params *p);

typedef struct {
    int32_t token;
    float logprob; /* log-probability under the model's own distribution
                      (softmax of raw logits, before any sampling transform) */
} cairn_token_logprob;

typedef struct cairn_sampler cairn_sampler;

/* CAIRN_EINVAL for: temperature not finite, top_p outside (0, 1], min_p
 * outside [0, 1], repeat_penalty <= 0 or not finite, frequency or presence
 * penalty not finite, penalty_last_n outside 0 .. 2^20, n_logprobs outside
 * 0 .. 20, n_logit_bias outside 0 .. CAIRN_MAX_LOGIT_BIAS, a biased token
 * outside [0, n_vocab) or a bias outside [-100, 100], n_vocab <= 0. All buffers are sized here; sampling allocates
 * nothing. */
int cairn_sampler_create(const cairn_sampling_params *p, int n_vocab, cairn_sampler **out);
void cairn_sampler_free(cairn_sampler *s);

/* Choose a token from `logits` [n_vocab] (read-only). When n_logprobs > 0
 * and `top` is non-NULL, writes the n_logprobs most likely tokens, best first,
 * to top[] (token -1 / -inf past the vocabulary); *chosen, when non-NULL,
 * always receives the chosen token's logprob. A NaN logit is an impossible
 * token; a row with no finite maximum (all NaN/-inf, or any +inf) gives
 * CAIRN_EINVAL. Does not record the token: call cairn_sampler_accept for
 * tokens that are kept (ids outside the vocabulary are ignored there). */
int cairn_sampler_sample(cairn_sampler *s, const float *logits, int32_t *token,
                         cairn_token_logprob *chosen, cairn_token_logprob *top);

/* probs[n_vocab] = the distribution cairn_sampler_sample would draw this
 * row from, given the tokens accepted so far: 0 for every token the
 * transforms exclude, one-hot on the argmax when greedy. Draws nothing
 * (the generator does not advance). CAIRN_EINVAL as for sample. Speculative
 * decoding accepts draft tokens against it. */
int cairn_sampler_probs(cairn_sampler *s, const float *logits, float *probs);

/* Record a token of the sequence (prompt or generated) for the penalties. */
void cairn_sampler_accept(cairn_sampler *s, int32_t token);
/* Forget accepted tokens and restart the generator from the seed. */
void cairn_sampler_reset(cairn_sampler *s);

/* ======================================================================== */
/* EAGLE speculative decoding                                               */
/* ======================================================================== */
/*
 * An EAGLE head is a one-layer draft model that reads the target's own final
 * feature (the hidden state after the output norm) and predicts the next
 * feature, so the target's LM head turns it into next-token guesses:
 *
 *   x  = [embed(token_{j+1}) ; f_j] · fcᵀ (+ fc bias)       x [R][dim]
 *   x += attention(x·Wq, x·Wk, x·Wv) · Woᵀ                  (no input norm)
 *   x += ffn(rmsnorm(x) * ffn_norm)
 *   logits = x · outputᵀ                                    (target's LM head)
 *
 * It reuses the target's embedding table, LM head and RoPE settings. Its file
 * is a GGUF with general.architecture = "eagle" and metadata
 * eagle.embedding_length, eagle.feed_forward_length, eagle.attention.head_count,
 * eagle.attention.head_count_kv, eagle.attention.layer_norm_rms_epsilon;
 * tensors fc.weight [2*dim -> dim] (optional fc.bias), blk.0.attn_{q,k,v,output}
 * (optional q/k/v biases), blk.0.ffn_norm, blk.0.ffn_{gate,up,down}.
 * tools/eagle_convert.py writes one from a published checkpoint,
 * tools/eagle_train.py trains one by self-distillation.
 *
 * KV: the head's keys and values are one extra layer (index n_layer of the
 * target) in the same pages, so a page layout from cairn_eagle_kv_layout
 * holds both. Head row j sits at KV index j and is computed from (f_j,
 * token_{j+1}) at RoPE position j, so it is final only once token j+1 is.
 *
 * Decoding (one sequence): each step drafts an EAGLE-2 dynamic tree, checks
 * it with one target forward and keeps the longest accepted path:
 *   draft   the best top_k tokens after the pending token form level 1; for
 *           `depth`-1 more levels the top_k frontier nodes by cumulative
 *           log-probability are expanded by top_k children each; all
 *           candidates are reranked and the best n_draft kept (a set closed
 *           under ancestors, since a child never scores above its parent).
 *   verify  the pending token and the tree in one cairn_model_forward with a
 *           tree mask (each token sees the prefix and its ancestors) at
 *           positions n_past + depth.
 *   accept  greedy (temperature <= 0): follow children equal to the target's
 *           argmax. Sampled: at each node the children are tried in draft
 *           order; the tree proposes each child deterministically (q is a
 *           point mass), so the rule accept-with-min(1, p/q) accepts child x
 *           with probability p(x) and on rejection continues with the
 *           residual max(0, p - q) renormalised, i.e. p without x. Where no
 *           child is accepted the token is drawn from what remains. This
 *           reproduces the target's sampling distribution exactly (lossless).
 *           p is the sampler's distribution: top-k, min-p, top-p, then
 *           temperature, in cairn_sampler's order, after the logit bias
 *           (cairn_sampler_probs); penalties are not supported with
 *           speculation (CAIRN_EUNSUPPORTED).
 *   keep    the accepted path's target KV is moved to consecutive indices;
 *           entries past the new length are scratch: pages holding only such
 *           indices may be released by the caller between steps.
 * Every step emits 1 + (accepted draft tokens) tokens; the last one (the
 * "bonus" token drawn from the target) is pending: its KV is written by the
 * next step's verification.
 */

typedef struct cairn_eagle cairn_eagle;

/* Load a head for `target` (borrowed; must outlive the head) onto the
 * target's backend. Its shape must fit the target (dim, vocabulary, KV heads
 * and head size), else CAIRN_EFORMAT with a message. */
int cairn_eagle_load(const char *path, cairn_model *target, cairn_eagle **out, char *err,
                     size_t err_len);
void cairn_eagle_free(cairn_eagle *e);

/* XXH3-128 of the head's tensors, for the page-hash namespace (a page holds
 * head KV too). */
void cairn_eagle_fingerprint(const cairn_eagle *e, uint8_t out[16]);

/* The target's page geometry with one more layer for the head's KV. */
int cairn_eagle_kv_layout(const cairn_eagle *e, int page_size, cairn_type dtype,
                          cairn_kv_layout *out);

typedef struct {
    int depth;   /* draft levels, 1..16; default 5                         */
    int top_k;   /* children per expanded node and frontier width, 1..16;
                    default 8                                               */
    int n_draft; /* draft tokens verified per step, 1..255; default 32;
                    the target must accept 1 + n_draft tokens per forward   */
} cairn_eagle_params;

cairn_eagle_params cairn_eagle_defaults(void);

/* Per step: the tree verified, tokens emitted, time in each phase. */
typedef struct {
    int64_t steps;        /* target forward passes (verifications)           */
    int64_t tokens;       /* tokens emitted; tau = tokens / steps            */
    int64_t drafted;      /* draft tokens verified                           */
    double t_draft, t_verify, t_head_update; /* seconds                      */
} cairn_eagle_stats;

typedef struct cairn_eagle_seq cairn_eagle_seq;

/* A decoder for one sequence. `dp` and `sp` may be NULL for the defaults
 * (sp NULL = greedy). CAIRN_EINVAL for parameters out of range,
 * CAIRN_EUNSUPPORTED for sampling penalties. */
int cairn_eagle_seq_create(cairn_eagle *e, const cairn_eagle_params *dp,
                           const cairn_sampling_params *sp, cairn_eagle_seq **out);
void cairn_eagle_seq_free(cairn_eagle_seq *s);

/* Start a sequence: the KV pool (laid out by cairn_eagle_kv_layout) and page
 * table (borrowed, covering KV indices 0 .. capacity-1) stay in use until the
 * next begin or free. Evaluates prompt[0 .. n-2] through the target and the
 * head; prompt[n-1] becomes the pending token. n >= 1 and n < capacity. */
int cairn_eagle_seq_begin(cairn_eagle_seq *s, void *kv_pool, const cairn_kv_layout *kv,
                          const int32_t *pages, int capacity, const int32_t *prompt, int n);

/* One draft-verify-accept step. Writes the emitted tokens (1 .. depth+1) to
 * out[cap] (cap >= depth + 1) and their count to *n_out. The tree is shrunk
 * near the end of the capacity; CAIRN_ERANGE when not even the pending token
 * fits. After an error the sequence must be begun again. */
int cairn_eagle_seq_step(cairn_eagle_seq *s, int32_t *out, int cap, int *n_out);

/* ---- sequences whose target forwards the caller runs (a server) -------- *
 *
 * A server batches the target over many sequences and shares KV pages
 * between them through a prefix cache, so the head's KV in a page must mean
 * the same thing whoever computed it. Head row j depends on tokens 0 .. j+1,
 * and token j+1 lies in the next page when j is a page's last index: two
 * sequences sharing that page may continue differently there. So for an
 * adopted sequence the head never attends to a row at a page's last index
 * (index % page_size == page_size - 1) except a query row's own; every other
 * head row of a page is a function of that page's token path alone, and
 * drafts (hence sampled outputs for a seed) do not depend on which sequence
 * computed a shared page. The server keeps every page's head rows current by
 * running the head over every token it runs the target over
 * (cairn_eagle_seq_advance after each forward), so pages it shares are
 * always complete. */

/* Take over a sequence whose tokens[0 .. n_past) already have target and
 * head KV in `pages` (computed by this or another sequence with the same
 * tokens, under the rule above); n_past must be a multiple of the page size
 * (CAIRN_EINVAL otherwise) and n_tokens > n_past. Nothing is computed. The
 * random state of sampled acceptance carries on from earlier steps. */
int cairn_eagle_seq_adopt(cairn_eagle_seq *s, void *kv_pool, const cairn_kv_layout *kv,
                          const int32_t *pages, int capacity, const int32_t *tokens,
                          int n_tokens, int n_past);
/* The page table moved or grew: it now covers KV indices 0 .. capacity-1. */
int cairn_eagle_seq_set_pages(cairn_eagle_seq *s, const int32_t *pages, int capacity);
/* The caller's target forward computed tokens n_past .. n_past+n-1 of an
 * adopted sequence; features[n][dim] are their rows of
 * cairn_model_forward_features. tokens[0 .. n_tokens) is the sequence as
 * known now (n_tokens >= n_past + n; earlier tokens must not have changed).
 * The head runs over every row whose next token is known, so when
 * n_tokens > n_past + n the sequence is ready for cairn_eagle_seq_step
 * (tokens[n_past] pending). After a step of an adopted sequence the head is
 * caught up at once, so its pages are complete when the caller shares them. */
int cairn_eagle_seq_advance(cairn_eagle_seq *s, const int32_t *tokens, int n_tokens,
                            const float *features, int n);

/* Tokens whose target KV is in the pages (the pending token excluded). */
int cairn_eagle_seq_n_past(const cairn_eagle_seq *s);
void cairn_eagle_seq_stats(const cairn_eagle_seq *s, cairn_eagle_stats *out);

/* ======================================================================== */
/* Chat templates                                                           */
/* ======================================================================== */
/*
 * Instruct models ship a Jinja2 chat template in `tokenizer.chat_template`.
 * cairn does not interpret Jinja: it recognises the template's family by
 * markers in its source and formats with a hand-written formatter that
 * reproduces byte for byte what the Hugging Face rendering (jinja2,
 * trim_blocks + lstrip_blocks, tojson = json.dumps(ensure_ascii=False)) gives
 * for that family's reference template:
 *
 *   <|im_start|> + <tool_call>   QWEN2   ChatML with a <tools> block,
 *                                        <tool_call> calls and
 *                                        <tool_response> results; Qwen2.5's
 *                                        default system prompt only when the
 *                                        source has it (Qwen3 and Hermes-style
 *                                        templates have none). Qwen3's
 *                                        <think> handling of earlier turns is
 *                                        not reproduced: their text is kept
 *                                        as given
 *   <|im_start|>                 CHATML  plain ChatML turns
 *   <|start_header_id|>          LLAMA3  3.0 turns; with "Cutting Knowledge
 *                                        Date" the 3.1+ form (dated system
 *                                        header, tools in the first user
 *                                        message, {"name","parameters"} calls,
 *                                        results as "ipython" turns)
 *   <start_of_turn>              GEMMA   no system role: its text opens the
 *                                        first user turn; contents trimmed
 *   <|assistant|> + <|end|>      PHI3    empty system left out; EOS ends a
 *                                        render without generation prompt
 *   [INST]                       LLAMA2  with <<SYS>>: Llama 2 (BOS before
 *                                        every user turn); else Mistral
 *                                        v1 ("[INST] u [/INST] a</s>", system
 *                                        text + "\n\n" opens the first user
 *                                        message) or, with "[INST]" right
 *                                        before a quote, v3-tekken/Nemo
 *                                        ("[INST]u[/INST]a</s>", system text
 *                                        on the last user message); Mistral
 *                                        tool formats are not rendered
 *   anything else / no template  GENERIC "<|ROLE|>\n" content "\n" per
 *                                        message, "<|assistant|>\n" to prompt
 *                                        (docs/protocol.md), with a warning
 *
 * "developer" is treated as "system". Tool lists are rendered by QWEN2 and
 * LLAMA3 (3.1+) only; other families ignore them with a warning. Tool-call
 * arguments given as a JSON string (OpenAI form) are parsed and rendered as
 * the object the templates expect; a string that is not JSON stays a string.
 *
 * BOS: templates that begin with bos_token (Llama 3, Gemma, Llama 2, Mistral)
 * have it removed from the start of cairn_chat_format's text — the BOS token
 * belongs to tokenization (CAIRN_TOK_ADD_BOS, cairn_vocab_add_bos), so
 * tokenizing the text with ADD_BOS | PARSE_SPECIAL gives the reference ids.
 * BOS written later in the text (Llama 2's every user turn) stays as text.
 *
 * A template is immutable once made: safe to share between threads.
 */

typedef enum {
    CAIRN_CHAT_GENERIC = 0,
    CAIRN_CHAT_CHATML,
    CAIRN_CHAT_QWEN2,  /* chatml + Qwen2.5 tool format */
    CAIRN_CHAT_LLAMA3,
    CAIRN_CHAT_LLAMA2, /* [INST], also Mistral */
    CAIRN_CHAT_GEMMA,
    CAIRN_CHAT_PHI3,
} cairn_chat_family;

typedef struct cairn_chat_template cairn_chat_template;

typedef struct {
    const char *role;            /* "system", "developer" (= system), "user",
                                    "assistant", "tool"                        */
    const char *content;         /* UTF-8; NULL counts as ""                  */
    const char *tool_calls_json; /* assistant: JSON array of OpenAI tool calls
                                    [{"id","type":"function","function":
                                    {"name","arguments"}}], or NULL           */
    const char *tool_call_id;    /* tool: id of the call answered, or NULL    */
    const char *name;            /* tool: function name, or NULL              */
} cairn_chat_message;

/* From a GGUF's tokenizer.chat_template (absent: generic, with a warning).
 * `v` (may be NULL) supplies the BOS/EOS texts. *out is the caller's; free
 * with cairn_chat_template_free. CAIRN_EFORMAT when the key is not a string. */
int cairn_chat_template_from_gguf(const cairn_gguf *g, const cairn_vocab *v,
                                  cairn_chat_template **out);
/* From template source (NULL or "" = generic). `v` may be NULL: the family's
 * customary BOS/EOS texts are used then. */
int cairn_chat_template_from_string(const char *jinja_source, const cairn_vocab *v,
                                    cairn_chat_template **out);
void cairn_chat_template_free(cairn_chat_template *t); /* NULL is a no-op */
cairn_chat_family cairn_chat_template_family(const cairn_chat_template *t);
const char *cairn_chat_family_name(cairn_chat_family f); /* "qwen2", ... static */

/* The whole conversation as text. tools_json: JSON array of OpenAI tools
 * [{"type":"function","function":{...}}] or NULL. *out is malloc'ed and
 * NUL-terminated (caller frees); *out_len (may be NULL) its length.
 * CAIRN_EINVAL for an unknown role, tools/tool_calls that are not JSON arrays,
 * or what the family's template refuses (Llama 3.1: tools without a user
 * message, several calls in one turn). */
int cairn_chat_format(const cairn_chat_template *t, const cairn_chat_message *msgs,
                      size_t n_msgs, const char *tools_json, bool add_generation_prompt,
                      char **out, size_t *out_len);

enum {
    CAIRN_CHAT_GENERATION_PROMPT = 1 << 0, /* open an assistant turn at the end */
    CAIRN_CHAT_CONTINUE = 1 << 1, /* the messages continue a conversation already
                                     in the context: no preamble (BOS, default
                                     system prompt, tools block, date header) */
    CAIRN_CHAT_ADD_BOS = 1 << 2,  /* start with BOS (templates that write it
                                     get it anyway, once)                    */
};

/* Format and tokenize in one step, safely: only the markers the formatter
 * itself writes (turn delimiters, BOS/EOS) are parsed as special tokens;
 * message contents and tool texts are tokenized as plain text, so a message
 * can never forge a turn marker. For contents without marker text the ids
 * equal tokenizing cairn_chat_format's text with PARSE_SPECIAL. *tokens is
 * malloc'ed (caller frees). */
int cairn_chat_tokenize(const cairn_chat_template *t, const cairn_vocab *v,
                        const cairn_chat_message *msgs, size_t n_msgs, const char *tools_json,
                        int flags, int32_t **tokens, size_t *n_tokens);

/* The text that closes an assistant turn in this family ("<|im_end|>\n",
 * "<|eot_id|>", ...): what follows a generated reply, whose end-of-generation
 * token is not kept, when the conversation continues. Static or owned by t. */
const char *cairn_chat_turn_end(const cairn_chat_template *t);

/* Tool calls in a generated assistant text, in the family's native format:
 * QWEN2 and others <tool_call>\n{"name":..., "arguments":{...}}\n</tool_call>
 * blocks (a block whose JSON is malformed stays text); LLAMA3 a JSON object
 * {"name":..., "parameters":...} (after an optional <|python_tag|>; several
 * may be separated by ';'). On success *calls_json is a malloc'ed JSON array
 * in OpenAI form [{"id":"<id_prefix><n>","type":"function","function":
 * {"name", "arguments": "<JSON text>"}}] (n from 0; id_prefix NULL: "call_";
 * a caller makes ids unique across replies with its own prefix) and
 * *content the remaining text,
 * trimmed (malloc'ed, may be ""). CAIRN_ENOTFOUND when the text holds no
 * tool call (outputs untouched). With `tools_json` (an OpenAI tools array;
 * NULL: none), a text that is as a whole a bare call object {"name": TOOL,
 * "arguments"|"parameters": {...}} or an array of them, each naming one of
 * those tools, is read as calls too (small models answer so, and forced
 * calls -- cairn_chat_tool_call_schema -- are generated so); CAIRN_EINVAL
 * when tools_json is not a JSON array. */
int cairn_chat_parse_tool_calls(const cairn_chat_template *t, const char *text, size_t len,
                                const char *tools_json, const char *id_prefix, char **calls_json,
                                char **content);

/* The JSON schema (malloc'ed text in *schema_json, caller frees) of a reply
 * that is a call of one of `tools_json`'s tools (an OpenAI tools array), for
 * cairn_grammar_from_json_schema: {"name": TOOL, "arguments": {...}}
 * ("parameters" instead of "arguments" for the Llama 3 family, whose
 * template asks for that key), or with `several` also a JSON array of one or
 * more such calls. The arguments follow each tool's `parameters` schema,
 * whose $defs and $refs are carried over; a tool whose schema uses what the
 * grammar does not support gets free-form object arguments (a warning is
 * logged). cairn_chat_parse_tool_calls with the same tools reads such a reply
 * back as calls. CAIRN_EINVAL when tools_json is not a non-empty array of
 * named function tools. */
int cairn_chat_tool_call_schema(const cairn_chat_template *t, const char *tools_json,
                                bool several, char **schema_json);

/* OpenAI's tool semantics, for every protocol: `tools_json` (an array of
 * {"type": "function", "function": {"name", "description"?, "parameters"?}},
 * or NULL) and `choice_json` (tool_choice as JSON text: "none", "auto",
 * "required" or {"type": "function", "function": {"name": N}}; NULL = auto)
 * become the tools to render and parse (*render_json, malloc'ed JSON array,
 * NULL when there are none: no tools, an empty array, or "none") and what
 * the reply must be (*mode: OFF when *render_json is NULL; AUTO; REQUIRED,
 * a call of any of them; NAMED, a call of the one tool left in
 * *render_json). CAIRN_EINVAL for a malformed value, with a message in err
 * and the name of the offending field ("tools" or "tool_choice", static)
 * in *field (may be NULL). */
typedef enum {
    CAIRN_TOOLS_OFF = 0,
    CAIRN_TOOLS_AUTO,
    CAIRN_TOOLS_REQUIRED,
    CAIRN_TOOLS_NAMED,
} cairn_chat_tool_mode;

int cairn_chat_tools_select(const char *tools_json, const char *choice_json, char **render_json,
                            cairn_chat_tool_mode *mode, const char **field, char *err,
                            size_t err_len);

/* ======================================================================== */
/* Grammar-constrained sampling                                             */
/* ======================================================================== */
/*
 * Structured output: a JSON schema is compiled to a byte-level grammar, and a
 * matcher follows one generation, setting the logits of every token that
 * cannot continue a valid document to -INFINITY before sampling. Whatever
 * the sampler then draws, the text parses as JSON and validates against the
 * schema — provided generation is not cut short by max_tokens.
 *
 * Supported JSON Schema subset:
 *   type           object, array, string, number, integer, boolean, null, or
 *                  a list of them; no type: inferred from properties/items/
 *                  minLength..., else any JSON value
 *   properties, required
 *                  properties are emitted in schema order; optional ones may
 *                  be omitted. Only declared properties are ever generated,
 *                  whatever additionalProperties says (valid either way); a
 *                  required name missing from properties is refused.
 *   additionalProperties
 *                  false/true/absent; a schema is used only for objects
 *                  without properties (free keys, values of that schema)
 *   items, minItems, maxItems
 *   minLength, maxLength   in code points (at most 1024, as are minItems and
 *                  maxItems); \u escapes of surrogates are never generated
 *   enum, const    any JSON values, emitted in compact form; values not of
 *                  the schema's `type` are dropped
 *   anyOf, oneOf   alternatives; oneOf is treated as anyOf (its branches
 *                  must be disjoint for the output to validate)
 *   allOf          with exactly one schema
 *   $ref           "#", "#/$defs/NAME", "#/definitions/NAME" (recursion ok)
 *   format         annotation only (JSON Schema 2020-12's default): the
 *                  string is not checked against the format
 *   title, description, default, examples, $schema, $id, $comment,
 *   deprecated, readOnly, writeOnly: ignored (annotations)
 * Any other keyword (pattern, minimum, maximum, multipleOf, uniqueItems,
 * prefixItems, not, if/then/else, ...) is refused with CAIRN_EINVAL naming
 * it, as are $ref/enum/const/anyOf/oneOf combined with other constraints.
 *
 * Generated text: optional leading whitespace, then the value, nothing
 * after it. Whitespace between tokens is bounded (nothing, one space, or a
 * newline and at most 20 spaces/tabs); integers have at most 16 digits,
 * fractions 16, exponents 2 — so a model cannot loop on whitespace or
 * digits. Free-form strings and unbounded arrays are bounded only by the
 * caller's max_tokens.
 *
 * Threads: a cairn_grammar and a cairn_grammar_vocab are immutable after
 * creation and may be shared by any number of matchers on any threads; a
 * matcher belongs to one generation and one thread at a time.
 */

typedef struct cairn_grammar cairn_grammar;

/* Compile `len` bytes of JSON schema text; schema_json NULL: any JSON object
 * (response_format json_object). CAIRN_EINVAL with a message in err for bad
 * JSON or unsupported keywords; CAIRN_ERANGE when the grammar would be too
 * large. The caller owns *out. */
int cairn_grammar_from_json_schema(const char *schema_json, size_t len, cairn_grammar **out,
                                   char *err, size_t err_len);
void cairn_grammar_free(cairn_grammar *g);

/* The bytes of every token of a vocabulary and a byte trie over them, built
 * once per vocabulary and shared by matchers (building it walks every
 * token: do it once, not per request). EOG tokens and tokens
 * without text (control tokens) are never part of a document. The vocab
 * may be freed afterwards. */
typedef struct cairn_grammar_vocab cairn_grammar_vocab;
int cairn_grammar_vocab_create(const cairn_vocab *v, cairn_grammar_vocab **out);
void cairn_grammar_vocab_free(cairn_grammar_vocab *gv);

typedef struct cairn_grammar_matcher cairn_grammar_matcher;

/* A matcher at the start of a document. `g` (and `gv`) are borrowed and must
 * outlive it. cairn_grammar_matcher_create builds a private vocab index
 * from `v` (v may be NULL: then only the byte-level calls work);
 * create_with shares `gv` (may be NULL likewise). */
int cairn_grammar_matcher_create(const cairn_grammar *g, const cairn_vocab *v,
                                 cairn_grammar_matcher **out);
int cairn_grammar_matcher_create_with(const cairn_grammar *g, const cairn_grammar_vocab *gv,
                                      cairn_grammar_matcher **out);
void cairn_grammar_matcher_free(cairn_grammar_matcher *m);
/* Back to the start of a document. */
int cairn_grammar_matcher_reset(cairn_grammar_matcher *m);

/* Set logits[t] = -INFINITY for every token t < n_vocab that cannot continue
 * the document (ids past the vocabulary included). EOG tokens stay allowed
 * exactly when the document may end here; once it is complete and nothing
 * can follow, only they do. CAIRN_ENOTFOUND when no token at all is
 * allowed (the vocabulary cannot spell any continuation); the logits are
 * masked even then. */
int cairn_grammar_matcher_mask(cairn_grammar_matcher *m, float *logits, int n_vocab);

/* Advance over a sampled token. CAIRN_EINVAL (state unchanged) for a token
 * the grammar refuses; an EOG token is accepted (changing nothing) when the
 * document may end. */
int cairn_grammar_matcher_accept(cairn_grammar_matcher *m, int32_t token);
/* The same over raw bytes (tests, validation): all or nothing. */
int cairn_grammar_matcher_accept_bytes(cairn_grammar_matcher *m, const char *bytes, size_t len);
/* The text so far is a complete document (more may still follow, e.g. digits). */
bool cairn_grammar_matcher_can_end(const cairn_grammar_matcher *m);
/* Complete, and nothing may follow: generation should stop. */
bool cairn_grammar_matcher_done(const cairn_grammar_matcher *m);

#ifdef __cplusplus
}
#endif
#endif /* CAIRN_ENGINE_H */
