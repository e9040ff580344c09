/*
 * model/model.h — running a transformer: hyper-parameters and weights
 * resident in a backend, the forward pass over paged KV, sampling, and
 * speculative decoding with an EAGLE head.
 *
 * One decoder step of a batch, as the forward pass computes it
 * (model/model.c, model/layer.c read like this):
 *
 *     tokens [T] ──embed──▶ x [T][dim]
 *     for each layer:  x += attn(rmsnorm(x))   q,k,v projections, RoPE,
 *                                              K/V written to the pages,
 *                                              paged attention (GQA; a
 *                                              sliding window on local
 *                                              layers)
 *                      x += ffn(rmsnorm(x))    SwiGLU (GeGLU on Gemma), or
 *                                              the router's top-k experts
 *     x = rmsnorm(x) ──▶ hidden (EAGLE's feature) ──LM head──▶ logits
 *
 * Architectures: llama (Llama 2/3, Mistral with its window, Mixtral's
 * experts), qwen2, qwen3, gemma3, qwen3moe, qwen2moe, gpt-oss (model.c,
 * arch_traits).
 *
 * The KV of every sequence lives in pages of a pool the caller owns
 * (store/ carves them); a sequence names its pages in a page table, so
 * pages are shared between sequences without copies.
 *
 * Parts, each an opaque handle with load/create and free:
 *   cairn_model     weights + scratch on a backend; forward over a batch
 *   cairn_sampler   logits -> a token (llama.cpp's chain, seeded)
 *   cairn_eagle     an EAGLE draft head
 *   cairn_spec      draft methods for a target (n-gram lookup, a draft
 *                   model, an EAGLE head); cairn_spec_seq decodes one
 *                   sequence speculatively with them (lossless)
 *
 * Ownership: a `*_load`/`*_create` gives the caller a new object, released
 * by the matching `*_free`. None of these objects may be used from two
 * threads at once; distinct objects are independent. Functions return
 * CAIRN_OK or a negative status; those with `char *err, size_t err_len`
 * also write a one-line explanation there on failure.
 *
 * Layering: model/ uses kernels/ (the backend) and gguf/ (weights), never
 * text/: the vocabulary and the chat template of a file are the text
 * module's, opened beside the model by runtime/.
 */
#ifndef CAIRN_MODEL_H
#define CAIRN_MODEL_H

#include "common/common.h"
#include "gguf/gguf.h"
#include "kernels/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================== */
/* Model and forward pass                                                   */
/* ======================================================================== */

typedef struct {
    char arch[32];        /* general.architecture (model.c, ARCHES)          */
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
    /* Sliding-window attention. With sliding_window = W > 0 a local layer's
     * query at position i sees only keys i-W+1 .. i (kernels/backend.h,
     * "Sliding windows"). Which layers are local: with swa_period = P > 0,
     * layer l is local unless l % P == P - 1 (Gemma 3: five local layers,
     * then one global); with P = 0 every layer is (Mistral's
     * sliding_window). cairn_hparams_layer_window gives a layer's W. */
    int sliding_window;
    int swa_period;
    float rope_freq_base_local; /* RoPE base of the local layers (Gemma 3:
                                   10000, the global layers 1e6); their
                                   frequency scale is 1 when local_rope_own */
    bool local_rope_own;  /* the local layers' RoPE is rope_freq_base_local,
                             unscaled (Gemma 3); else the model's (gpt-oss,
                             whose local and global layers alternate) */
    /* Mixture of experts (n_expert > 0: qwen3moe, qwen2moe, Mixtral as
     * llama). Every layer's FFN is n_expert experts of expert_ffn_dim; a
     * router picks n_expert_used of them per token (softmax over its logits,
     * the top n_expert_used, their weights renormalised to sum 1 when
     * expert_norm, then times expert_weights_scale) and the token's FFN
     * output is the weighted sum of theirs. qwen2moe adds a shared expert of
     * shared_ffn_dim that every token runs, gated by a sigmoid of its own. */
    int n_expert, n_expert_used, expert_ffn_dim, shared_ffn_dim;
    bool expert_norm;
    float expert_weights_scale;
    /* gpt-oss: the top n_expert_used chosen on the router's logits and
     * softmaxed among themselves; the experts' SwiGLU clamped at
     * swiglu_limit (> 0) with sigmoid slope swiglu_alpha; a learned sink
     * logit per attention head (kernels/backend.h, cairn_attn_args.sinks);
     * biases on every projection. */
    bool expert_softmax_chosen;
    float swiglu_limit, swiglu_alpha;
    bool attn_sinks;
    /* YaRN (rope.scaling.type "yarn"): the frequencies a trained context of
     * yarn_orig_ctx cannot tell apart are interpolated by 1/yarn_factor,
     * the fast ones kept, a linear ramp between them over the pairs whose
     * wavelengths fall between yarn_beta_fast and yarn_beta_slow turns in
     * that context; q and k are each scaled by yarn_mscale (0.1 ln(factor)
     * + 1, times rope.scaling.attn_factor). Global layers only. */
    bool rope_yarn;
    float yarn_factor, yarn_beta_fast, yarn_beta_slow, yarn_mscale;
    int yarn_orig_ctx;
    bool yarn_unrounded; /* the ramp's ends kept fractional (HF's truncate
                            false: gpt-oss folders), not rounded out to
                            whole pairs (llama.cpp, every GGUF) */
} cairn_hparams;

/* "qwen3moe, dim 2048, 16 layers, 16/4 heads, 32 experts (4 a token)", with
 * ", window 512 on 15 of 18 layers" for a sliding-window model: the shape
 * in one line for logs and banners. Returns buf. */
const char *cairn_hparams_describe(const cairn_hparams *hp, char *buf, size_t n);

/* The window of layer l: sliding_window for a local layer, 0 (every key the
 * causal rule allows) for a global one. */
static inline int cairn_hparams_layer_window(const cairn_hparams *hp, int l)
{
    if (hp->sliding_window <= 0)
        return 0;
    if (hp->swa_period > 0 && l % hp->swa_period == hp->swa_period - 1)
        return 0;
    return hp->sliding_window;
}

typedef struct cairn_model cairn_model;

typedef struct {
    int max_batch_tokens;  /* most new tokens one forward call may carry
                              (scratch is sized for it once); default 512     */
    int max_seqs;          /* most sequences per call; default 64             */
} cairn_model_params;

/* Load the model of an open GGUF file onto `be` (borrowed; must outlive the
 * model). Weights are uploaded once: the file may be closed afterwards.
 * `name` (the file's path, for messages; may be NULL) names it in errors.
 * Unsupported architectures or tensor types are refused with a message
 * naming them. `params` may be NULL for the defaults. The vocabulary and
 * chat template of the same file are text/'s (runtime/ opens all three from
 * one open of the file). */
int cairn_model_load_gguf(const cairn_gguf *g, const char *name, cairn_backend *be,
                          const cairn_model_params *params, cairn_model **out, char *err,
                          size_t err_len);
/* The same from a path: opens the file, loads, closes it (tools and tests;
 * a server opens a model through runtime/). */
int cairn_model_load(const char *path, cairn_backend *be, const cairn_model_params *params,
                     cairn_model **out, char *err, size_t err_len);
void cairn_model_free(cairn_model *m);

/* The hyper-parameters the model was loaded with (owned by m). */
const cairn_hparams *cairn_model_hparams(const cairn_model *m);
/* What the model was loaded for (cairn_model_params): a forward may carry at
 * most *max_batch_tokens tokens of at most *max_seqs sequences. */
void cairn_model_limits(const cairn_model *m, int *max_batch_tokens, int *max_seqs);
cairn_backend *cairn_model_backend(const cairn_model *m);

/* Bytes of weights one token's forward pass reads: every matrix, norm and
 * bias of the layers and the head, plus one row of the token-embedding table
 * (the whole table when it is also the output head, tied). What a decode
 * step streams before it reads any KV; `cairn bench` counts it against the
 * machine's read bandwidth. */
size_t cairn_model_token_weight_bytes(const cairn_model *m);

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

/* The forward with the logits left in backend memory: *logits receives the
 * model's device buffer [n_out][n_vocab] (rows as cairn_model_forward's),
 * valid until the next forward call on m; nothing [n_out][n_vocab] crosses
 * to the host (cairn_sample_batch_run samples it where it is). features:
 * NULL, or as cairn_model_forward_features's. The buffer grows to the
 * largest n_out asked for (CAIRN_ENOMEM when the backend has no room). */
int cairn_model_forward_keep(cairn_model *m, void *kv_pool, const cairn_kv_layout *kv,
                             const cairn_seq_batch *seqs, int n_seqs, float *features,
                             const float **logits, int *n_out);

#define CAIRN_MAX_FEATURE_LAYERS 4

/* What cairn_model_forward_features returns from now on: with n > 0, the
 * residual stream (before any norm) entering each of layers[0 .. n) (0 =
 * the embeddings, n_layer = leaving the last layer), side by side: rows of
 * [n][dim], i.e. features [T][n*dim] (EAGLE-3's low, mid and high states:
 * layers 2, n_layer/2, n_layer-3). n = 0 restores the final normed state.
 * CAIRN_EINVAL for n > CAIRN_MAX_FEATURE_LAYERS or a layer outside
 * 0 .. n_layer. cairn_model_forward's hidden rows are unchanged. */
int cairn_model_set_feature_layers(cairn_model *m, const int *layers, int n);
/* Floats per row of cairn_model_forward_features (dim, or n*dim). */
int cairn_model_feature_dim(const cairn_model *m);

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

/* ---- what a batched sampler reads ---------------------------------------
 * cairn_sample_batch_run (below) hands a sampler's state to a backend that
 * samples on the device; these export it without changing what
 * cairn_sampler_sample does. */
/* The settings the sampler was created with (owned by s). */
const cairn_sampling_params *cairn_sampler_params(const cairn_sampler *s);
int cairn_sampler_n_vocab(const cairn_sampler *s);
/* The distinct tokens of the penalty window with their counts and logit
 * biases into out[0 .. penalty_last_n); returns how many (0 when no
 * penalty is in effect). */
int cairn_sampler_window(cairn_sampler *s, cairn_sample_penalty *out);
/* The logit-bias entries into out[0 .. n_logit_bias), each with the bias
 * the sampler applies to its token; returns how many. */
int cairn_sampler_bias_pairs(const cairn_sampler *s, cairn_sample_bias *out);
/* The uniform draw in [0, 1) the next sampled (non-greedy, not refused)
 * cairn_sampler_sample would make, without making it... */
double cairn_sampler_peek_uniform(const cairn_sampler *s);
/* ...and making it: the generator advances exactly as that call's would. */
void cairn_sampler_skip_uniform(cairn_sampler *s);

/* ---- sampling a batch of rows where the logits are ----------------------
 * A decode step's logits [n_rows][n_vocab] stay in backend memory
 * (cairn_model_forward_keep); each row is sampled by its own sampler. With
 * a backend sample_rows slot (CUDA) the rows are sampled on the device and
 * only tokens and asked-for logprobs come back; without one (the CPU) each
 * row is downloaded and given to cairn_sampler_sample, which is exactly the
 * host path, bit for bit. Either way the samplers' generators advance as
 * cairn_sampler_sample's do, and nothing is accepted (the caller calls
 * cairn_sampler_accept for tokens it keeps). */
typedef struct {
    int row;                 /* the row of the logits it draws from           */
    cairn_sampler *sampler;  /* the request's sampler (its n_vocab the rows')  */
    const uint32_t *allowed; /* optional grammar mask, n_vocab bits (bit t of
                                word t/32), 1 = allowed: disallowed logits are
                                -inf before sampling and logprobs (what
                                cairn_grammar_matcher_mask on the row does)   */
    bool want_logprobs;      /* lp[row][0] = the chosen token's, then the
                                sampler's n_logprobs best                     */
} cairn_sample_req;

typedef struct cairn_sample_batch cairn_sample_batch;

/* For rows of n_vocab logits on `be` (borrowed), at most max_rows a call. */
int cairn_sample_batch_create(cairn_backend *be, int n_vocab, int max_rows,
                              cairn_sample_batch **out);
void cairn_sample_batch_free(cairn_sample_batch *b);
/* Sample n_rows requests (reqs[i] from row reqs[i].row of `logits`,
 * backend memory [..][n_vocab]; a step samples only the rows it needs).
 *   tokens  host [n_rows]
 *   status  host [n_rows]: CAIRN_OK, or what cairn_sampler_sample returns
 *           for that row (CAIRN_EINVAL: no finite maximum); tokens[r] is
 *           then -1 and the row's generator does not advance
 *   lp      optional host [n_rows][1 + CAIRN_SAMPLE_MAX_LOGPROBS], written
 *           for rows with want_logprobs, as cairn_sampler_sample's chosen
 *           and top
 * Returns CAIRN_OK when every row has its status; CAIRN_EINVAL for bad
 * arguments (a sampler of another vocabulary, a negative row, n_rows
 * outside 1 .. max_rows; nothing sampled), CAIRN_ENOMEM, or a backend failure: then no
 * status is valid (the device path advanced no generator; the fallback may
 * have sampled the rows before the failed download). */
int cairn_sample_batch_run(cairn_sample_batch *b, const float *logits, int n_rows,
                           const cairn_sample_req *reqs, int32_t *tokens, int *status,
                           cairn_token_logprob *lp);

/* ======================================================================== */
/* EAGLE heads, and how a draft tree is verified                            */
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
 * KV: the head's keys and values are one extra layer after the target's in
 * the same pages (cairn_spec_kv_layout places it), with the target's
 * geometry. Head row j sits at KV index j and is computed from (f_j,
 * token_{j+1}) at RoPE position j, so it is final only once token j+1 is.
 *
 * Decoding (one sequence, cairn_spec_seq below): each step drafts an EAGLE-2
 * dynamic tree, checks it with one target forward and keeps the longest
 * accepted path (the last three phases are every method's):
 *   draft   the best top_k tokens after the pending token form level 1; for
 *           `depth`-1 more levels the top_k frontier nodes by cumulative
 *           log-probability are expanded by top_k children each; all
 *           candidates are reranked and the best n_draft kept (a set closed
 *           under ancestors, since a child never scores above its parent).
 *   verify  the pending token and the tree in one cairn_model_forward with a
 *           tree mask (each token sees the prefix and its ancestors) at
 *           positions n_past + depth.
 *   accept  walk from the root as plain decoding would: the request's
 *           sampler draws the token at each node from the target's logits
 *           there; the walk follows the child with that token while there
 *           is one. Every emitted token is the one plain decoding draws
 *           (greedy or seeded, penalties and logit bias included); a guess
 *           x is kept with probability p(x), what accepting a guess
 *           proposed with certainty by min(1, p/q) gives (lossless).
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


/* ======================================================================== */
/* Speculative decoding                                                     */
/* ======================================================================== */
/*
 * A cairn_spec is a set of draft methods bound to one target; a
 * cairn_spec_seq decodes one sequence with them. Every step each method
 * adds guesses to one draft tree (rows proposed by two methods are merged,
 * so methods combine), the target checks the whole tree in one forward, and
 * the accepted path is kept — the verification, acceptance and KV moves
 * above, whatever proposed the tree:
 *
 *   suffix  suffix speculation over what the engine has seen: the last
 *           tokens (at least ngram_min of them) are matched in the sequence
 *           itself (prompt, session history, documents, generated text)
 *           and in a corpus of earlier requests of the same tenant (their
 *           new prompt tokens and their outputs); what followed the
 *           matches, weighted by how often and after how long a match,
 *           becomes a tree of guesses no deeper than twice the longest
 *           match (model/spec_suffix.c). No weights, no KV. Tenants never
 *           see each other's text; the corpus is a bounded ring. "ngram",
 *           its old name, names it too.
 *   draft   a small model with the target's vocabulary guesses a chain
 *           greedily; its KV is extra layers in the same pages (so it is
 *           prefix-cached with them), kept current over every token.
 *   eagle   an EAGLE head (above): a dynamic tree of depth x top_k.
 *
 * Draft length adapts per sequence and step: the rows proposed are the
 * number with the most expected tokens per second, from the measured
 * acceptance of this sequence's guesses and the measured cost of verifying
 * T rows on this machine (a price list the spec's sequences share, filled
 * as steps of each size run). A sequence whose measured speed with
 * speculation — tokens per step over the step's measured cost — falls
 * below its measured plain decoding speed stops speculating for a while
 * (doubling while it keeps failing), then tries again (fixed_length turns
 * both off, for measurements). A draft model's own KV catches up in
 * page-sized forwards while speculation is paused, not token by token.
 *
 * Output: exactly the tokens of plain decoding, greedy or sampled with a
 * seed (cairn_spec_seq_use_sampler below says how).
 */

typedef struct {
    int depth;     /* tree drafters (EAGLE): levels, 1..16; default 5         */
    int top_k;     /* tree drafters: children per expanded node, 1..16; 8    */
    int n_draft;   /* most draft rows verified per step, all methods
                      together, 1..255; default 32; the target must take
                      1 + n_draft tokens per forward                          */
    int ngram_min; /* suffix: shortest match, 1..16; default 2                */
    int ngram_max; /* suffix: occurrences whose match is at least
                      min(longest found, ngram_max) long are weighed,
                      ngram_min..16; default 4 (both 0: the defaults)        */
    int chain_max; /* longest chain a chain drafter (suffix, draft model)
                      proposes, 1..16; default 12 (0: that, or n_draft when
                      smaller)                                                */
    bool fixed_length; /* draft the most every step and never turn off       */
} cairn_spec_params;

/* The defaults named in cairn_spec_params. */
cairn_spec_params cairn_spec_defaults(void);

typedef struct cairn_spec cairn_spec;

/* An empty set of methods for `target` (borrowed; must outlive the spec). */
int cairn_spec_create(cairn_model *target, cairn_spec **out);
/* Frees the set, not the heads or models it borrows. */
void cairn_spec_free(cairn_spec *s);
/* Add a method. Each may be added once; at most 8 methods. The head or
 * model is borrowed and must outlive the spec, on the target's backend.
 * A draft model must have the target's vocabulary size (its texts are
 * runtime/'s check) and its own page geometry. CAIRN_EINVAL with a message
 * otherwise. */
/* Suffix speculation with a corpus of `corpus_tokens` tokens of earlier
 * requests (16 bytes each, plus an index of 4 bytes per token; allocated
 * when the first request ends); 0 = the request's own context only; < 0 =
 * CAIRN_SPEC_CORPUS_DEFAULT. */
#define CAIRN_SPEC_CORPUS_DEFAULT ((int64_t)1 << 20)
int cairn_spec_add_suffix(cairn_spec *s, int64_t corpus_tokens);
/* The same with the default corpus (the method's old name). */
int cairn_spec_add_ngram(cairn_spec *s);
int cairn_spec_add_eagle(cairn_spec *s, cairn_eagle *head);
int cairn_spec_add_draft_model(cairn_spec *s, cairn_model *draft, char *err, size_t err_len);
/* "suffix", "suffix+eagle", ... (owned by s). */
const char *cairn_spec_describe(const cairn_spec *s);
int cairn_spec_count(const cairn_spec *s);
/* Its methods by bit: 1 << index in the order they were added; the names
 * "suffix" (or "ngram"), "draft", "eagle" map to bits with cairn_spec_method_mask (0 when
 * the spec has no such method). */
uint32_t cairn_spec_method_mask(const cairn_spec *s, const char *name);

/* The page layout: the target's layers, then every method's own KV (an
 * EAGLE head's layer, a draft model's layers) in the order added. */
int cairn_spec_kv_layout(const cairn_spec *s, int page_size, cairn_type dtype,
                         cairn_kv_layout *out);
/* XXH3-128 over the fingerprints of the methods that keep KV in the pages
 * (all zeros when none does: then pages are the target's alone). */
void cairn_spec_fingerprint(const cairn_spec *s, uint8_t out[16]);
/* Whether pages hold more than the target's KV. */
bool cairn_spec_has_kv(const cairn_spec *s);
/* Whether a method reads the target's features (then the caller runs the
 * target with cairn_model_forward_features and passes them on). */
bool cairn_spec_needs_features(const cairn_spec *s);
/* Whether a method's KV row depends on the next token (EAGLE): then prefix
 * matches are whole pages and adopted sequences start on a page boundary. */
bool cairn_spec_whole_pages(const cairn_spec *s);

typedef struct {
    int64_t steps;        /* target forward passes made by steps             */
    int64_t spec_steps;   /* of which verified a draft                        */
    int64_t tokens;       /* tokens emitted by steps; tau = tokens / steps     */
    int64_t drafted;      /* draft rows verified                              */
    int64_t accepted;     /* draft tokens accepted                            */
    int64_t accepted_by[8]; /* draft tokens accepted that method i proposed   */
    int64_t paused_steps; /* steps decoded plainly because speculation did not
                             pay (measured) or had nothing to propose         */
    double t_draft, t_verify, t_head_update; /* seconds                      */
} cairn_spec_stats;

typedef struct cairn_spec_seq cairn_spec_seq;

/* A decoder for one sequence. `dp` and `sp` may be NULL for the defaults
 * (sp NULL = greedy). `methods` (a mask of cairn_spec_method_mask bits; 0 =
 * all) chooses which of the spec's methods propose for this sequence; the
 * others still keep their KV current. CAIRN_EINVAL for parameters out of
 * range, CAIRN_ERANGE when the target cannot take 1 + n_draft tokens per
 * forward. */
int cairn_spec_seq_create(cairn_spec *spec, const cairn_spec_params *dp,
                          const cairn_sampling_params *sp, uint32_t methods,
                          cairn_spec_seq **out);
void cairn_spec_seq_free(cairn_spec_seq *s);

/* Start a sequence: the KV pool (laid out by cairn_spec_kv_layout) and page
 * table (borrowed, covering KV indices 0 .. capacity-1) stay in use until the
 * next begin or free. Evaluates prompt[0 .. n-2] through the target and the
 * methods; prompt[n-1] becomes the pending token. n >= 1 and n < capacity. */
int cairn_spec_seq_begin(cairn_spec_seq *s, void *kv_pool, const cairn_kv_layout *kv,
                         const int32_t *pages, int capacity, const int32_t *prompt, int n);

/* One draft-verify-accept step. Writes the emitted tokens (1 .. chain or
 * tree depth + 1, at most cairn_spec_seq_max_out; 0 only when the filter
 * hook allowed no token) to out[cap] and their count to *n_out. The tree
 * is shrunk near the end of the capacity;
 * CAIRN_ERANGE when not even the pending token fits. After an error the
 * sequence must be begun again. */
int cairn_spec_seq_step(cairn_spec_seq *s, int32_t *out, int cap, int *n_out);
/* How a step's tokens are drawn. The tree is walked as plain decoding
 * would walk the sequence: at each node the request's sampler draws the
 * next token from the target's logits there, and the walk goes on into the
 * child guessed with that token, if any. So a step emits exactly the
 * tokens plain decoding draws — greedy and seeded sampling alike, penalties
 * and logit bias included — whatever was guessed and whether a step
 * speculated at all; a guess x is kept with probability p(x).
 *
 * By default the sequence's own sampler (from `sp`, seeded, fed the prompt
 * at begin) draws. A caller that also decodes the sequence plainly lends
 * its own sampler, so both ways draw from one stream (borrowed; it must
 * outlive the decoder; the decoder accepts every token it emits into it). */
void cairn_spec_seq_use_sampler(cairn_spec_seq *s, cairn_sampler *sampler);

/* The caller's part of drawing a token (structured output, end of
 * generation), called at each node of the walk. Both optional. */
typedef struct {
    void *ctx;
    /* Mask logits[n_vocab] in place before the token is drawn. Non-zero:
     * no token may follow (the step ends before it, and the sequence cannot
     * go on). */
    int (*filter)(void *ctx, float *logits, int n_vocab);
    /* The token was drawn and is kept (after the sampler accepted it);
     * true: the sequence ends with it, nothing after it is drawn. */
    bool (*accept)(void *ctx, int32_t token);
    /* Draw with logprobs (the chosen token's and sp.n_logprobs best), for
     * cairn_spec_seq_logprobs; also on when sp.n_logprobs > 0. */
    bool logprobs;
} cairn_spec_hooks;
void cairn_spec_seq_set_hooks(cairn_spec_seq *s, const cairn_spec_hooks *hooks);

/* With logprobs asked for (hooks.logprobs or sp.n_logprobs > 0): the last
 * step's tokens' logprobs, 1 + n_logprobs per token (the chosen one's, then the best alternatives), as
 * cairn_sampler_sample writes them. Owned by s. */
const cairn_token_logprob *cairn_spec_seq_logprobs(const cairn_spec_seq *s);

/* The same step in two halves, for a caller that verifies many sequences'
 * trees (and plain decoders' tokens) in one forward of its own:
 *   draft     proposes the tree and fills *sb with its rows (tokens,
 *             positions, tree mask, all rows wanted; pointing into s, valid
 *             until verified); out[] of verified will have room for `cap`
 *   verified  takes the logits [sb->n_tokens][n_vocab] of those rows (the
 *             filter hook may change them) and, when a method reads
 *             features, their features [n_tokens][dim] (the forward's
 *             hidden rows); emits as cairn_spec_seq_step does.
 * Between the two only the caller's forward may run on the sequence. */
int cairn_spec_seq_draft(cairn_spec_seq *s, int cap, cairn_seq_batch *sb);
int cairn_spec_seq_verified(cairn_spec_seq *s, float *logits, const float *features,
                            int32_t *out, int *n_out);

/* The most tokens one step may emit (out[] of cairn_spec_seq_step). */
int cairn_spec_seq_max_out(const cairn_spec_seq *s);
/* KV indices past n_past a step may write (the pending token and the draft
 * rows of every method): the pages the caller must provide beyond n_past. */
int cairn_spec_seq_span(const cairn_spec_seq *s);

/* ---- sequences whose target forwards the caller runs (a server) -------- *
 *
 * A server batches the target over many sequences and shares KV pages
 * between them through a prefix cache, so the methods' KV in a page must
 * mean the same thing whoever computed it. A draft model's row j depends on
 * tokens 0 .. j, like the target's. An EAGLE head's row j depends on tokens
 * 0 .. j+1, and token j+1 lies in the next page when j is a page's last
 * index: two sequences sharing that page may continue differently there.
 * So for an adopted sequence the head never attends to a row at a page's
 * last index (index % page_size == page_size - 1) except a query row's own;
 * every other head row of a page is a function of that page's token path
 * alone, and drafts (hence sampled outputs for a seed) do not depend on
 * which sequence computed a shared page. The server keeps every page's
 * method rows current by passing every forward it runs to
 * cairn_spec_seq_advance, so pages it shares are always complete. */

/* Take over a sequence whose tokens[0 .. n_past) already have target and
 * method KV in `pages` (computed by this or another sequence with the same
 * tokens, under the rule above); with cairn_spec_whole_pages n_past must be
 * a multiple of the page size (CAIRN_EINVAL otherwise); n_tokens > n_past.
 * Nothing is computed. The random state of sampled acceptance carries on
 * from earlier steps. */
int cairn_spec_seq_adopt(cairn_spec_seq *s, void *kv_pool, const cairn_kv_layout *kv,
                         const int32_t *pages, int capacity, const int32_t *tokens, int n_tokens,
                         int n_past);
/* The page table moved or grew: it now covers KV indices 0 .. capacity-1. */
int cairn_spec_seq_set_pages(cairn_spec_seq *s, const int32_t *pages, int capacity);
/* The caller's target forward computed tokens n_past .. n_past+n-1 of an
 * adopted sequence; features[n][dim] are their rows of
 * cairn_model_forward_features (NULL when !cairn_spec_needs_features).
 * tokens[0 .. n_tokens) is the sequence as known now (n_tokens >= n_past +
 * n; earlier tokens must not have changed). The methods catch up, so when
 * n_tokens > n_past + n the sequence is ready for cairn_spec_seq_step
 * (tokens[n_past] pending). Methods with KV of their own need not be
 * caught up (cairn_spec_seq_set_outlook); pages say which of their rows
 * are final, so the caller may share them at any time. */
int cairn_spec_seq_advance(cairn_spec_seq *s, const int32_t *tokens, int n_tokens,
                           const float *features, int n);
/* What the caller expects of this sequence, before its next forward:
 * whether it may let it speculate soon (a server lets only a few sequences
 * speculate at once, --draft-max-batch), and how many tokens it may still
 * ask for (0 = unknown). A method that runs a model of its own (a draft
 * model) keeps its rows up with the target only while speculating is
 * expected, and catches up from further behind only when the tokens left
 * can repay it; its rows of a page are then missing until someone needs
 * them, which each page records (model/spec_draft.c). Until called:
 * expected, unknown. */
void cairn_spec_seq_set_outlook(cairn_spec_seq *s, bool may_speculate, int tokens_left);
/* A plain decoding step of this sequence (in the caller's batch) took
 * `seconds`: the speed speculation must beat. */
void cairn_spec_seq_note_plain_cost(cairn_spec_seq *s, double seconds);
/* Whether the next step should speculate (false: decode it plainly, in the
 * caller's batch, and call cairn_spec_seq_advance as for any forward).
 * Steps that do not speculate count towards the pause. */
bool cairn_spec_seq_wants_step(cairn_spec_seq *s);

/* Tokens whose target KV is in the pages (the pending token excluded). */
int cairn_spec_seq_n_past(const cairn_spec_seq *s);
/* Whose request this is (0 = no tenants): methods that learn across
 * requests (suffix) match only the same tenant's earlier text. Set before
 * the sequence begins. */
void cairn_spec_seq_set_tenant(cairn_spec_seq *s, uint64_t tenant);
/* Before a partial page is handed to the prefix cache: the methods' own KV
 * rows of it say how many of them are final (a draft model stamps the page;
 * nothing is computed). Whole pages are stamped as they become final. */
int cairn_spec_seq_sync(cairn_spec_seq *s);
/* The methods that propose for this sequence, "suffix+eagle" (owned by s). */
const char *cairn_spec_seq_describe(const cairn_spec_seq *s);
void cairn_spec_seq_stats(const cairn_spec_seq *s, cairn_spec_stats *out);

/* ======================================================================== */
/* Medusa heads                                                             */
/* ======================================================================== */
/*
 * Medusa heads (Cai et al. 2024) read the target's final feature f_j (the
 * hidden state after the output norm, cairn_model_forward_features) of the
 * last token with KV; head k (0-based) guesses the token k+1 places past the
 * next one, i.e. depth k+1 of a draft tree under the pending token:
 *
 *   h = f_j;  for each residual block b:  h += silu(h·W_bᵀ + bias_b)
 *   logits_k = h · output_kᵀ       (the head's own LM head, or the target's)
 *
 * The heads are independent given f_j, so a tree path's log-probability is
 * the sum of its tokens' under their heads; the draft tree is the best rows
 * by that sum within the row budget, each depth keeping fewer children
 * (Medusa's sparse tree). No KV of their own.
 *
 * File: a GGUF with general.architecture = "medusa", metadata
 * medusa.head_count (1..8), medusa.layer_count (residual blocks per head,
 * 0..4), medusa.embedding_length (the target's dim), optional
 * medusa.vocab_size (default: the target's), medusa.target.name; tensors
 * medusa.{i}.res.{b}.weight [dim -> dim], medusa.{i}.res.{b}.bias [dim] (F32),
 * optional medusa.{i}.output.weight [dim -> n_vocab] (absent: the target's
 * LM head). tools/eagle_convert.py --medusa writes one from a published
 * checkpoint (medusa_lm_head.pt / .safetensors with config.json),
 * tools/eagle_train.py --kind medusa trains one.
 */

#define CAIRN_MEDUSA_MAX_HEADS 8
#define CAIRN_MEDUSA_MAX_LAYERS 4
#define CAIRN_MEDUSA_MAX_TOP_K 16
#define CAIRN_MEDUSA_MAX_ROWS 255

typedef struct cairn_medusa cairn_medusa;

/* Load heads for `target` (borrowed; must outlive them) onto the target's
 * backend. CAIRN_EFORMAT with a message when the file is not a Medusa head,
 * lacks a tensor or does not fit the target (dim, vocabulary). */
int cairn_medusa_load(const char *path, cairn_model *target, cairn_medusa **out, char *err,
                      size_t err_len);
void cairn_medusa_free(cairn_medusa *m);
/* XXH3-128 of the heads' tensors and shape. */
void cairn_medusa_fingerprint(const cairn_medusa *m, uint8_t out[16]);
int cairn_medusa_head_count(const cairn_medusa *m);
cairn_model *cairn_medusa_target(const cairn_medusa *m);

/* logits[head_count][n_vocab] (host) of every head for one feature [dim]
 * (host). */
int cairn_medusa_logits(cairn_medusa *m, const float *feature, float *logits);

/* The draft tree of `logits` (from cairn_medusa_logits): at most `budget`
 * (0..255) rows, best path first, of depth at most min(depth, head_count),
 * the tokens of depth d among head d-1's best top_k (1..16) at depth 1,
 * halved per level down to 2. tokens[r], parents[r] (an earlier row, or -1
 * for a child of the pending token); *n_rows rows. The logit bias of `sp`
 * (may be NULL) applies to the guesses, so a forced token is proposed. */
int cairn_medusa_draft(cairn_medusa *m, const float *logits, const cairn_sampling_params *sp,
                       int depth, int top_k, int budget, int32_t *tokens, int32_t *parents,
                       int *n_rows);

/* Add Medusa heads (borrowed; loaded for the spec's target) to a spec as
 * method "medusa": features needed, no KV of its own; the tree shape is the
 * sequence's depth and top_k, its rows within n_draft. CAIRN_EINVAL for
 * heads of another target or a second add. */
int cairn_spec_add_medusa(cairn_spec *s, cairn_medusa *heads);

/* ======================================================================== */
/* EAGLE-3 heads                                                            */
/* ======================================================================== */
/*
 * An EAGLE-3 head (Li et al. 2025) reads the target's residual stream
 * entering three of its layers (low, mid, high: by default 2, n_layer/2,
 * n_layer-3; cairn_model_set_feature_layers exports them) instead of the
 * final feature, fused by fc; its one decoder layer attends over
 * [normed embedding ; normed feature]; it predicts tokens over a reduced
 * draft vocabulary mapped to the target's by d2t. Row j reads (states of
 * token j, token j+1) at RoPE position j, like an EAGLE head; deeper draft
 * rows read their parent row's pre-norm output instead of fused states:
 *
 *   h = fc · [s_low ; s_mid ; s_high]   | the parent row's output
 *   a = [rmsnorm(embed(token)) * attn_norm ; rmsnorm(h) * hidden_norm]
 *   x = h + attention(a·Wq, a·Wk, a·Wv) · Woᵀ;  x += ffn(rmsnorm(x) * ffn_norm)
 *   logits = rmsnorm(x) * output_norm · outputᵀ   [draft vocabulary]
 *
 * File: a GGUF with general.architecture = "eagle3", metadata
 * eagle3.embedding_length, eagle3.feed_forward_length,
 * eagle3.attention.head_count, eagle3.attention.head_count_kv,
 * eagle3.attention.layer_norm_rms_epsilon, eagle3.vocab_size (the draft
 * vocabulary), eagle3.target_layers (3 integers); tensors fc.weight
 * [3*dim -> dim], blk.0.attn_norm.weight (the embedding's norm),
 * blk.0.hidden_norm.weight, blk.0.attn_{q,k,v}.weight [2*dim -> ...],
 * blk.0.attn_output.weight, blk.0.ffn_norm.weight, blk.0.ffn_{gate,up,down}
 * .weight, output_norm.weight, output.weight [dim -> draft vocabulary], d2t
 * (I32 [draft vocabulary]: target id = draft id + d2t). tools/eagle_convert.py
 * writes one from a published checkpoint (SafeAILab/EAGLE's eagle3 layout).
 */

#define CAIRN_EAGLE3_MAX_ROWS 64

typedef struct cairn_eagle3 cairn_eagle3;

/* Load a head for `target` (borrowed) onto its backend. CAIRN_EFORMAT with a
 * message when it is not an EAGLE-3 head or does not fit the target (dim,
 * KV heads, head size, layers, vocabulary). */
int cairn_eagle3_load(const char *path, cairn_model *target, cairn_eagle3 **out, char *err,
                      size_t err_len);
void cairn_eagle3_free(cairn_eagle3 *e);
void cairn_eagle3_fingerprint(const cairn_eagle3 *e, uint8_t out[16]);
/* The target layers whose entering states it fuses, low to high. */
void cairn_eagle3_target_layers(const cairn_eagle3 *e, int out[3]);
int cairn_eagle3_draft_vocab(const cairn_eagle3 *e);
cairn_model *cairn_eagle3_target(const cairn_eagle3 *e);
/* The target token of a draft id (-1 outside the draft vocabulary). */
int32_t cairn_eagle3_target_token(const cairn_eagle3 *e, int32_t draft_id);

/* One call's head rows. Their K/V go to layer kv_layer of the pages (a page
 * layout with a layer for the head), at KV indices kv_index[]; the rows
 * attend over head KV 0 .. n_kv-1, causally (mask NULL: row r sees
 * 0 .. kv_index[r]) or by mask [n_rows][n_kv]. */
typedef struct {
    int n_rows;               /* 1 .. CAIRN_EAGLE3_MAX_ROWS                  */
    const int32_t *tokens;    /* [n_rows] the next token of each row         */
    const float *features;    /* fused: [n_rows][3*dim] target states (the
                                 layout cairn_model_forward_features writes
                                 with the head's layers); else [n_rows][dim]
                                 parent outputs                              */
    bool fused;
    const int32_t *pos, *kv_index; /* [n_rows]                               */
    int n_kv;
    const uint8_t *mask;
    void *kv_pool;
    const cairn_kv_layout *kv;
    const int32_t *pages;
    int kv_layer;
} cairn_eagle3_rows;

/* Runs the rows: hidden[n_rows][dim] (host, optional) their pre-norm
 * outputs (what deeper rows read), logits[n_logit_rows][draft vocabulary]
 * (host) of the last n_logit_rows rows. */
int cairn_eagle3_forward(cairn_eagle3 *e, const cairn_eagle3_rows *rows, float *hidden,
                         float *logits, int n_logit_rows);
/* logits[n][draft vocabulary] of pre-norm outputs hidden[n][dim] (host), as
 * cairn_eagle3_forward computes them for its last rows. */
int cairn_eagle3_project(cairn_eagle3 *e, const float *hidden, int n, float *logits);

/* Add an EAGLE-3 head (borrowed; loaded for the spec's target) as method
 * "eagle3". It sets the target's feature layers to the head's
 * (cairn_model_set_feature_layers), so no method reading the final feature
 * (eagle, medusa) may be in the same spec: CAIRN_EINVAL then (and for a
 * head of another target, or a second add). */
int cairn_spec_add_eagle3(cairn_spec *s, cairn_eagle3 *head);

#ifdef __cplusplus
}
#endif
#endif /* CAIRN_MODEL_H */
