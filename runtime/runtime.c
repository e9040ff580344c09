/*
 * runtime/runtime.c — backend choice and the one open of a model file (see
 * runtime.h).
 */
#include "ckpt/ckpt.h"
#include "runtime/runtime.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cairn_runtime {
    char *model_path;
    cairn_device device;
    cairn_backend *be;
    cairn_model *model;
    cairn_vocab *vocab;
    cairn_chat_template *chat;
    /* speculative decoding: the methods and what they borrow */
    cairn_spec *spec;
    cairn_eagle *eagle;
    cairn_medusa *medusa;
    cairn_eagle3 *eagle3;
    cairn_model *draft_model;
    int32_t turn_end[16];
    size_t n_turn_end;
    /* the model's recommended sampling (a checkpoint's generation_config) */
    float gen_value[CAIRN_CKPT_N_GENERATION]; /* cairn_ckpt_generation_keys' order */
    bool gen_given[CAIRN_CKPT_N_GENERATION];
    pthread_mutex_t grammar_mu; /* guards the lazy build below */
    cairn_grammar_vocab *grammar_vocab;
};

int cairn_device_parse(const char *text, cairn_device *out, char *err, size_t err_len)
{
    cairn_device d = {CAIRN_DEVICE_AUTO, 0};
    if (!text || !out)
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "--device: missing value");
    if (strcmp(text, "cpu") == 0) {
        d.kind = CAIRN_DEVICE_CPU;
    } else if (strcmp(text, "cuda") == 0) {
        d.kind = CAIRN_DEVICE_CUDA;
    } else if (strncmp(text, "cuda:", 5) == 0) {
        char *end;
        errno = 0;
        long n = strtol(text + 5, &end, 10);
        if (errno || *end || end == text + 5 || n < 0 || n > 1023)
            return cairn_errorf(err, err_len, CAIRN_EINVAL,
                                "--device cuda:N must be an integer in [0, 1023], got '%s'",
                                text);
        d.kind = CAIRN_DEVICE_CUDA;
        d.index = (int)n;
    } else if (strcmp(text, "auto") != 0) {
        return cairn_errorf(err, err_len, CAIRN_EINVAL,
                            "--device must be cpu, cuda or cuda:N, got '%s'", text);
    }
    *out = d;
    return CAIRN_OK;
}

void cairn_device_name(cairn_device d, char *out, size_t cap)
{
    if (d.kind == CAIRN_DEVICE_CUDA)
        snprintf(out, cap, "cuda:%d", d.index);
    else
        snprintf(out, cap, "%s", d.kind == CAIRN_DEVICE_CPU ? "cpu" : "auto");
}

/* The backend the configuration asks for; AUTO tries CUDA quietly first. */
static int open_backend(cairn_runtime *rt, const cairn_runtime_config *cfg, char *err,
                        size_t err_len)
{
    const cairn_device d = cfg->device;
    if (d.kind == CAIRN_DEVICE_CUDA) {
        int rc = cairn_backend_cuda_create(d.index, &rt->be);
        if (rc == CAIRN_EUNSUPPORTED)
            return cairn_errorf(err, err_len, rc,
                                "--device cuda:%d: there is no CUDA device %d on this machine "
                                "(or this cairn was built without CUDA); use --device cpu",
                                d.index, d.index);
        if (rc != CAIRN_OK)
            return cairn_errorf(err, err_len, rc,
                                "--device cuda:%d: cannot start the CUDA backend: %s", d.index,
                                cairn_strerror(rc));
        rt->device = d;
        return CAIRN_OK;
    }
#ifdef CAIRN_HAVE_CUDA
    /* auto: a GPU when there is one (the probe logs nothing when there is
     * none), else the CPU */
    if (d.kind == CAIRN_DEVICE_AUTO && cairn_backend_cuda_create(0, &rt->be) == CAIRN_OK) {
        rt->device = (cairn_device){CAIRN_DEVICE_CUDA, 0};
        return CAIRN_OK;
    }
#endif
    int rc = cairn_backend_cpu_create(cfg->n_threads, &rt->be);
    if (rc != CAIRN_OK)
        return cairn_errorf(err, err_len, rc, "cannot start the CPU backend: %s",
                            cairn_strerror(rc));
    rt->device = (cairn_device){CAIRN_DEVICE_CPU, 0};
    /* the kernels' speed knobs, measured once per machine (bit-identical
     * results whatever they are, so a failure only costs speed) */
    (void)cairn_backend_cpu_tune(rt->be);
    return CAIRN_OK;
}

void cairn_runtime_sampling_defaults(const cairn_runtime *rt, cairn_sampling_params *p)
{
    if (!rt || !p)
        return;
    const float *v = rt->gen_value;
    if (rt->gen_given[0])
        p->temperature = v[0];
    if (rt->gen_given[1] && v[1] <= 1)
        p->top_p = v[1];
    if (rt->gen_given[2] && v[2] < 1e6f)
        p->top_k = (int)v[2];
    if (rt->gen_given[3] && v[3] <= 1)
        p->min_p = v[3];
    if (rt->gen_given[4] && v[4] > 0)
        p->repeat_penalty = v[4];
}

/* The model, its vocabulary and its chat template from one open file. */
static int open_model(cairn_runtime *rt, const cairn_runtime_config *cfg, char *err,
                      size_t err_len)
{
    cairn_gguf *g = NULL;
    int rc = cairn_ckpt_open(cfg->model_path, &g, err, err_len);
    if (rc != CAIRN_OK)
        return rc;
    cairn_model_params mp = {.max_batch_tokens = cfg->max_batch_tokens > 0
                                                     ? cfg->max_batch_tokens : 512,
                             .max_seqs = cfg->max_seqs > 0 ? cfg->max_seqs : 64};
    rc = cairn_model_load_gguf(g, cfg->model_path, rt->be, &mp, &rt->model, err, err_len);
    if (rc == CAIRN_OK)
        rc = cairn_vocab_load(g, &rt->vocab, err, err_len);
    if (rc == CAIRN_OK && cairn_vocab_n_tokens(rt->vocab) > cairn_model_hparams(rt->model)->n_vocab)
        rc = cairn_errorf(err, err_len, CAIRN_EFORMAT,
                          "%s: vocabulary has %d tokens but the model %d", cfg->model_path,
                          cairn_vocab_n_tokens(rt->vocab),
                          cairn_model_hparams(rt->model)->n_vocab);
    if (rc == CAIRN_OK && (rc = cairn_chat_template_from_gguf(g, rt->vocab, &rt->chat)))
        cairn_errorf(err, err_len, rc, "%s: cannot read the chat template: %s", cfg->model_path,
                     cairn_strerror(rc));
    for (int i = 0; rc == CAIRN_OK && i < CAIRN_CKPT_N_GENERATION; i++) {
        char key[64];
        snprintf(key, sizeof key, "cairn.generation.%s", cairn_ckpt_generation_keys[i]);
        rt->gen_given[i] = cairn_gguf_get_f32(g, key, &rt->gen_value[i]) == CAIRN_OK &&
                           isfinite(rt->gen_value[i]) && rt->gen_value[i] >= 0;
    }
    cairn_gguf_close(g);
    if (rc != CAIRN_OK)
        return rc;
    const char *end = cairn_chat_turn_end(rt->chat);
    if (end && *end &&
        cairn_tokenize(rt->vocab, end, strlen(end), CAIRN_TOK_PARSE_SPECIAL, rt->turn_end,
                       sizeof rt->turn_end / sizeof rt->turn_end[0], &rt->n_turn_end) != CAIRN_OK)
        rt->n_turn_end = 0; /* a turn end longer than 16 tokens is no turn end we know */
    return CAIRN_OK;
}

/* A draft model: loaded on the target's backend, refused unless its
 * vocabulary is the target's token for token (ids must mean the same). */
static int open_draft_model(cairn_runtime *rt, const cairn_runtime_config *cfg, const char *path,
                            char *err, size_t err_len)
{
    if (rt->draft_model)
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "--spec: one draft model at most");
    cairn_gguf *g = NULL;
    char why[400] = "";
    int rc = cairn_ckpt_open(path, &g, why, sizeof why);
    if (rc != CAIRN_OK)
        return cairn_errorf(err, err_len, rc, "cannot open the draft model %s: %s", path, why);
    int max_batch, max_seqs;
    cairn_model_limits(rt->model, &max_batch, &max_seqs);
    cairn_model_params mp = {.max_batch_tokens = max_batch, .max_seqs = 1};
    cairn_vocab *vocab = NULL;
    rc = cairn_model_load_gguf(g, path, rt->be, &mp, &rt->draft_model, why, sizeof why);
    if (rc == CAIRN_OK)
        rc = cairn_vocab_load(g, &vocab, why, sizeof why);
    cairn_gguf_close(g);
    if (rc != CAIRN_OK) {
        cairn_vocab_free(vocab);
        return cairn_errorf(err, err_len, rc, "cannot load the draft model %s: %s", path, why);
    }
    const int32_t n = cairn_vocab_n_tokens(vocab), nt = cairn_vocab_n_tokens(rt->vocab);
    int32_t differs = -1;
    for (int32_t i = 0; n == nt && i < n && differs < 0; i++)
        if (strcmp(cairn_vocab_token_text(vocab, i), cairn_vocab_token_text(rt->vocab, i)) != 0)
            differs = i;
    if (n != nt)
        rc = cairn_errorf(err, err_len, CAIRN_EINVAL,
                          "the draft model %s has %d tokens in its vocabulary and %s %d: a draft "
                          "model must share the target's vocabulary", path, n, cfg->model_path, nt);
    else if (differs >= 0)
        rc = cairn_errorf(err, err_len, CAIRN_EINVAL,
                          "the draft model %s has another vocabulary than %s (token %d is '%s' "
                          "there, '%s' here): a draft model must share the target's vocabulary",
                          path, cfg->model_path, differs, cairn_vocab_token_text(vocab, differs),
                          cairn_vocab_token_text(rt->vocab, differs));
    cairn_vocab_free(vocab);
    if (rc == CAIRN_OK && (rc = cairn_spec_add_draft_model(rt->spec, rt->draft_model, why,
                                                           sizeof why)) != CAIRN_OK)
        cairn_errorf(err, err_len, rc, "the draft model %s: %s", path, why);
    return rc;
}

static int open_eagle(cairn_runtime *rt, const char *path, char *err, size_t err_len)
{
    if (rt->eagle)
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "--spec: one EAGLE head at most");
    char why[400] = "";
    int rc = cairn_eagle_load(path, rt->model, &rt->eagle, why, sizeof why);
    if (rc != CAIRN_OK)
        return cairn_errorf(err, err_len, rc, "cannot load the draft head %s: %s", path,
                            why[0] ? why : cairn_strerror(rc));
    return cairn_spec_add_eagle(rt->spec, rt->eagle);
}

static int open_medusa(cairn_runtime *rt, const char *path, char *err, size_t err_len)
{
    if (rt->medusa)
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "--spec: one set of Medusa heads at most");
    char why[400] = "";
    int rc = cairn_medusa_load(path, rt->model, &rt->medusa, why, sizeof why);
    if (rc != CAIRN_OK)
        return cairn_errorf(err, err_len, rc, "cannot load the Medusa heads %s: %s", path,
                            why[0] ? why : cairn_strerror(rc));
    if ((rc = cairn_spec_add_medusa(rt->spec, rt->medusa)) != CAIRN_OK)
        return cairn_errorf(err, err_len, rc, "--spec: Medusa heads cannot go beside eagle3");
    return CAIRN_OK;
}

static int open_eagle3(cairn_runtime *rt, const char *path, char *err, size_t err_len)
{
    if (rt->eagle3)
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "--spec: one EAGLE-3 head at most");
    char why[400] = "";
    int rc = cairn_eagle3_load(path, rt->model, &rt->eagle3, why, sizeof why);
    if (rc != CAIRN_OK)
        return cairn_errorf(err, err_len, rc, "cannot load the EAGLE-3 head %s: %s", path,
                            why[0] ? why : cairn_strerror(rc));
    if ((rc = cairn_spec_add_eagle3(rt->spec, rt->eagle3)) != CAIRN_OK)
        return cairn_errorf(err, err_len, rc,
                            "--spec: an EAGLE-3 head reads other target states than eagle and "
                            "medusa do: it cannot go beside them");
    return CAIRN_OK;
}

/* --spec METHOD[,METHOD...] (and --draft HEAD, an EAGLE head). */
static int open_spec(cairn_runtime *rt, const cairn_runtime_config *cfg, char *err, size_t err_len)
{
    int rc = cairn_spec_create(rt->model, &rt->spec);
    if (rc != CAIRN_OK)
        return cairn_errorf(err, err_len, rc, "out of memory");
    const char *list = cfg->spec ? cfg->spec : "";
    while (rc == CAIRN_OK && *list) {
        const char *end = strchr(list, ',');
        const size_t len = end ? (size_t)(end - list) : strlen(list);
        char item[1024];
        if (len == 0 || len >= sizeof item)
            return cairn_errorf(err, err_len, CAIRN_EINVAL, "--spec: empty or overlong method in '%s'",
                                cfg->spec);
        memcpy(item, list, len);
        item[len] = '\0';
        list += len + (end ? 1 : 0);
        if (strcmp(item, "ngram") == 0 || strcmp(item, "suffix") == 0 ||
            strncmp(item, "suffix:", 7) == 0) {
            long long corpus = -1; /* the default */
            if (item[6] == ':') {
                char *e;
                errno = 0;
                corpus = strtoll(item + 7, &e, 10);
                if (errno || e == item + 7 || *e || corpus < 0 || corpus > (1ll << 31))
                    return cairn_errorf(err, err_len, CAIRN_EINVAL,
                                        "--spec: suffix:TOKENS wants the corpus size in tokens, "
                                        "0 .. 2147483648 (0: the request's own context only), "
                                        "not '%s'", item + 7);
            }
            if ((rc = cairn_spec_add_suffix(rt->spec, corpus)) != CAIRN_OK)
                return cairn_errorf(err, err_len, rc,
                                    rc == CAIRN_ENOMEM ? "--spec: out of memory"
                                                       : "--spec: suffix (ngram) given twice");
        } else if (strncmp(item, "draft:", 6) == 0 && item[6]) {
            rc = open_draft_model(rt, cfg, item + 6, err, err_len);
        } else if (strncmp(item, "eagle:", 6) == 0 && item[6]) {
            rc = open_eagle(rt, item + 6, err, err_len);
        } else if (strncmp(item, "medusa:", 7) == 0 && item[7]) {
            rc = open_medusa(rt, item + 7, err, err_len);
        } else if (strncmp(item, "eagle3:", 7) == 0 && item[7]) {
            rc = open_eagle3(rt, item + 7, err, err_len);
        } else {
            return cairn_errorf(err, err_len, CAIRN_EINVAL,
                                "--spec: unknown method '%s' (expected suffix[:TOKENS] (or ngram), draft:MODEL.gguf, "
                                "eagle:HEAD.gguf, medusa:HEADS.gguf or eagle3:HEAD.gguf, "
                                "comma-separated)", item);
        }
    }
    if (rc == CAIRN_OK && cfg->draft_path)
        rc = open_eagle(rt, cfg->draft_path, err, err_len);
    return rc;
}

int cairn_runtime_open(const cairn_runtime_config *cfg, cairn_runtime **out, char *err,
                       size_t err_len)
{
    if (err && err_len)
        err[0] = '\0';
    if (!cfg || !out || !cfg->model_path)
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "no model file given");
    cairn_runtime *rt = calloc(1, sizeof *rt);
    if (!rt || !(rt->model_path = strdup(cfg->model_path))) {
        free(rt);
        return cairn_errorf(err, err_len, CAIRN_ENOMEM, "out of memory");
    }
    pthread_mutex_init(&rt->grammar_mu, NULL);
    int rc = open_backend(rt, cfg, err, err_len);
    if (rc == CAIRN_OK)
        rc = open_model(rt, cfg, err, err_len);
    if (rc == CAIRN_OK && (cfg->draft_path || (cfg->spec && *cfg->spec)))
        rc = open_spec(rt, cfg, err, err_len);
    if (rc != CAIRN_OK) {
        if (err && err_len && !err[0])
            cairn_errorf(err, err_len, rc, "%s", cairn_strerror(rc));
        cairn_runtime_close(rt);
        return rc;
    }
    *out = rt;
    return CAIRN_OK;
}

void cairn_runtime_close(cairn_runtime *rt)
{
    if (!rt)
        return;
    cairn_grammar_vocab_free(rt->grammar_vocab);
    cairn_spec_free(rt->spec);
    cairn_eagle_free(rt->eagle);
    cairn_medusa_free(rt->medusa);
    cairn_eagle3_free(rt->eagle3);
    cairn_model_free(rt->draft_model);
    cairn_chat_template_free(rt->chat);
    cairn_vocab_free(rt->vocab);
    cairn_model_free(rt->model);
    cairn_backend_destroy(rt->be);
    pthread_mutex_destroy(&rt->grammar_mu);
    free(rt->model_path);
    free(rt);
}

cairn_backend *cairn_runtime_backend(const cairn_runtime *rt) { return rt->be; }
cairn_device cairn_runtime_device(const cairn_runtime *rt) { return rt->device; }
cairn_model *cairn_runtime_model(const cairn_runtime *rt) { return rt->model; }
const cairn_hparams *cairn_runtime_hparams(const cairn_runtime *rt)
{
    return cairn_model_hparams(rt->model);
}
const cairn_vocab *cairn_runtime_vocab(const cairn_runtime *rt) { return rt->vocab; }
const cairn_chat_template *cairn_runtime_chat_template(const cairn_runtime *rt)
{
    return rt->chat;
}
cairn_spec *cairn_runtime_spec(const cairn_runtime *rt) { return rt->spec; }
const char *cairn_runtime_model_path(const cairn_runtime *rt) { return rt->model_path; }

int cairn_runtime_threads(const cairn_runtime *rt)
{
    int n = cairn_backend_cpu_threads(rt->be);
    return n > 0 ? n : 0;
}

const int32_t *cairn_runtime_turn_end(const cairn_runtime *rt, size_t *n)
{
    *n = rt->n_turn_end;
    return rt->turn_end;
}

const cairn_grammar_vocab *cairn_runtime_grammar_vocab(cairn_runtime *rt)
{
    pthread_mutex_lock(&rt->grammar_mu);
    if (!rt->grammar_vocab && cairn_grammar_vocab_create(rt->vocab, &rt->grammar_vocab) != CAIRN_OK)
        rt->grammar_vocab = NULL;
    const cairn_grammar_vocab *gv = rt->grammar_vocab;
    pthread_mutex_unlock(&rt->grammar_mu);
    return gv;
}

int cairn_runtime_device_memory(const cairn_runtime *rt, size_t *free_bytes, size_t *total_bytes)
{
    if (!rt)
        return CAIRN_EINVAL;
    return cairn_backend_memory_info(cairn_runtime_backend(rt), free_bytes, total_bytes);
}
