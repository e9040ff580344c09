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
    char arch[32];        /* "llama"                                          */
    char name[128];       /* general.name, or the file name                   */
    int n_vocab;
    int n_ctx_train;
    int dim;              /* embedding width                                  */
    int n_layer;
    int n_head;
    int n_kv_head;
    int head_dim;
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

/* ======================================================================== */
/* Sampler                                                                  */
/* ======================================================================== */
/*
 * Order of operations (the order llama.cpp's default chain uses, so settings
 * mean the same thing): penalties over the last `penalty_last_n` accepted
 * tokens → top-k → top-p → min-p → temperature → draw. temperature <= 0 is
 * greedy (argmax after penalties; ties go to the lowest id). A given seed
 * reproduces the same draws on every machine (xoshiro256** generator).
 */

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
} cairn_sampling_params;

/* The defaults listed above. */
cairn_sampling_params cairn_sampling_defaults(void);

typedef struct {
    int32_t token;
    float logprob; /* log-probability under the model's own distribution
                      (softmax of raw logits, before any sampling transform) */
} cairn_token_logprob;

typedef struct cairn_sampler cairn_sampler;

/* CAIRN_EINVAL for: temperature not finite, top_p outside (0, 1], min_p
 * outside [0, 1], repeat_penalty <= 0 or not finite, frequency or presence
 * penalty not finite, penalty_last_n outside 0 .. 2^20, n_logprobs outside
 * 0 .. 20, n_vocab <= 0. All buffers are sized here; sampling allocates
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

/* Record a token of the sequence (prompt or generated) for the penalties. */
void cairn_sampler_accept(cairn_sampler *s, int32_t token);
/* Forget accepted tokens and restart the generator from the seed. */
void cairn_sampler_reset(cairn_sampler *s);

#ifdef __cplusplus
}
#endif
#endif /* CAIRN_ENGINE_H */
