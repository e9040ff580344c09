/*
 * runtime/runtime.h — one open of a model file: the compute backend it runs
 * on, its weights, its vocabulary and chat template, and optionally an EAGLE
 * speculative decoding methods (n-gram lookup, a draft model, an EAGLE head).
 *
 *                       cairn_runtime_open(cfg)
 *                                │
 *        --device ──▶ backend    │    model.gguf ──open once──┐
 *        (cpu, cuda[:N])         │                            │
 *                                ▼                            ▼
 *     ┌──────────────────────────────────────────────────────────────┐
 *     │ backend        kernels/  CPU worker pool or CUDA stream      │
 *     │ model          model/    weights on the backend              │
 *     │ vocab          text/     tokenizer of the same file          │
 *     │ chat template  text/     tokenizer.chat_template, by family  │
 *     │ turn end       tokens that close an assistant turn           │
 *     │ speculation    model/    draft methods (--spec: n-gram       │
 *     │                          lookup, a draft model, an EAGLE     │
 *     │                          head), optional                     │
 *     │ grammar vocab  text/     byte trie of the vocabulary, built  │
 *     │                          on first use (structured output)    │
 *     └──────────────────────────────────────────────────────────────┘
 *          used by session/ (the engine thread), api/ (request
 *          semantics, on text workers) and cli/
 *
 * Why one module: every front end needs the same five things of a model
 * file, and the file is opened (and its metadata validated) exactly once;
 * the backend is chosen in one place, so `serve`, `run`, `bench` and
 * `perplexity` all take --device the same way.
 *
 * Threads and ownership. A runtime is created and freed by one thread (the
 * owner); it must outlive everything that borrows from it (a service, an
 * api context). The vocabulary, chat template, turn-end tokens and grammar
 * vocabulary are immutable and may be read from any thread at once. The
 * backend, model and speculative methods belong to one thread at a time: the engine
 * thread while a service runs, or the CLI command that opened them.
 *
 * Errors: cairn_runtime_open returns CAIRN_EINVAL (bad configuration),
 * CAIRN_EUNSUPPORTED (no such device, or a file cairn cannot run),
 * CAIRN_EIO / CAIRN_EFORMAT (the file), CAIRN_ENOMEM, CAIRN_EBACKEND; err
 * holds one line saying what and why, naming the option or file.
 */
#ifndef CAIRN_RUNTIME_H
#define CAIRN_RUNTIME_H

#include "common/common.h"
#include "kernels/backend.h"
#include "model/model.h"
#include "text/text.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which backend runs the model. AUTO: CUDA device 0 when cairn was built
 * with CUDA and a GPU is present, else the CPU. An explicit CUDA fails when
 * there is no such device (never a silent fallback to the CPU). */
typedef enum {
    CAIRN_DEVICE_AUTO = 0,
    CAIRN_DEVICE_CPU = 1,
    CAIRN_DEVICE_CUDA = 2,
} cairn_device_kind;

typedef struct {
    cairn_device_kind kind;
    int index; /* CUDA device number (cuda:N); 0 otherwise */
} cairn_device;

/* "cpu", "cuda", "cuda:N" (N in 0..1023), "auto". CAIRN_EINVAL otherwise,
 * with what is expected in err. */
int cairn_device_parse(const char *text, cairn_device *out, char *err, size_t err_len);
/* "cpu", "cuda:0", ... into out[cap] (at least 16 bytes). */
void cairn_device_name(cairn_device d, char *out, size_t cap);

typedef struct {
    const char *model_path;  /* GGUF file (required)                          */
    cairn_device device;     /* zeroed: AUTO                                  */
    int n_threads;           /* CPU backend threads; 0 = one per core         */
    int max_batch_tokens;    /* tokens one forward may carry (0: 512)         */
    int max_seqs;            /* sequences one forward may carry (0: 64)       */
    const char *draft_path;  /* EAGLE head (NULL: none), as spec "eagle:PATH" */
    /* Speculative decoding methods, comma-separated, in the order they add
     * to a draft tree: "suffix" or "suffix:TOKENS" (suffix speculation over
     * the request and a corpus of TOKENS tokens of the tenant's earlier
     * requests; "ngram" is the same), "draft:MODEL.gguf" (a draft
     * model with the target's vocabulary, token for token, else refused),
     * "eagle:HEAD.gguf", "medusa:HEADS.gguf" (Medusa heads), "eagle3:HEAD.gguf"
     * (an EAGLE-3 head, not beside eagle or medusa). NULL or "": none (besides
     * draft_path). */
    const char *spec;
} cairn_runtime_config;

typedef struct cairn_runtime cairn_runtime;

/* Create the backend, open the model file once and load the weights, the
 * vocabulary (its size must fit the model's), the chat template (the
 * generic format with a warning when the file has none) and, with
 * draft_path and spec, the speculative methods (an EAGLE head's shape must
 * fit the model; a draft model's vocabulary must be the model's). The caller
 * owns *out. */
int cairn_runtime_open(const cairn_runtime_config *cfg, cairn_runtime **out, char *err,
                       size_t err_len);
/* Free everything, the backend last. NULL is a no-op. */
void cairn_runtime_close(cairn_runtime *rt);

/* What the runtime opened (owned by it, valid until close; read-only after
 * open, so any thread may ask). */
cairn_backend *cairn_runtime_backend(const cairn_runtime *rt);
cairn_device cairn_runtime_device(const cairn_runtime *rt); /* what was opened */
cairn_model *cairn_runtime_model(const cairn_runtime *rt);
const cairn_hparams *cairn_runtime_hparams(const cairn_runtime *rt);
const cairn_vocab *cairn_runtime_vocab(const cairn_runtime *rt);
const cairn_chat_template *cairn_runtime_chat_template(const cairn_runtime *rt);
/* The speculative decoding methods (NULL without any). */
cairn_spec *cairn_runtime_spec(const cairn_runtime *rt);
const char *cairn_runtime_model_path(const cairn_runtime *rt);

/* The sampling a model recommends (a checkpoint folder's
 * generation_config.json: temperature, top_p, top_k, min_p,
 * repetition_penalty), written over *p field by field where the model gives
 * one; a GGUF gives none and leaves *p as it was. Request decoding applies it
 * to the fields a request leaves out, as vLLM and SGLang do. */
void cairn_runtime_sampling_defaults(const cairn_runtime *rt, cairn_sampling_params *p);
/* CPU threads in use (0 on another backend). */
int cairn_runtime_threads(const cairn_runtime *rt);
/* Free and total memory of the device the model runs on, now (what sizes a
 * KV cache by default). CAIRN_EUNSUPPORTED on the CPU, whose memory is the
 * machine's RAM. */
int cairn_runtime_device_memory(const cairn_runtime *rt, size_t *free_bytes, size_t *total_bytes);

/* The tokens that close an assistant turn in this model's template
 * ("<|im_end|>\n" tokenized with its markers special): what follows a
 * generated reply, whose end-of-generation token is never kept, when the
 * conversation continues. *n = 0 when the family has none. Owned by the
 * runtime. */
const int32_t *cairn_runtime_turn_end(const cairn_runtime *rt, size_t *n);

/* The grammar vocabulary (byte trie of every token) of this model, built on
 * the first call — walking a 150k-token vocabulary takes a while, and most
 * servers never constrain output — and shared afterwards. Thread-safe: the
 * first callers wait for one build. NULL when memory ran out (a later call
 * tries again). */
const cairn_grammar_vocab *cairn_runtime_grammar_vocab(cairn_runtime *rt);

#ifdef __cplusplus
}
#endif
#endif /* CAIRN_RUNTIME_H */
