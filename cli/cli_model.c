/*
 * cli/cli_model.c — what the model-running subcommands share: option parsing,
 * a runtime + one sequence's KV pages, chunked evaluation of that sequence.
 */
#include "cli/cli.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cli_model_opts_defaults(cli_model_opts *o)
{
    memset(o, 0, sizeof *o);
    o->model_path = CLI_DEFAULT_MODEL;
    o->page_size = 16;
    o->kv_type = CAIRN_TYPE_F16;
    o->batch = 512;
}

int cli_help_or_usage(int opt, const char *help)
{
    if (opt == 'h') {
        fputs(help, stdout);
        return 0;
    }
    fputs(help, stderr);
    return 2;
}

int cli_no_operands(const char *cmd, int argc, char **argv)
{
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", cmd, argv[optind]);
        return 2;
    }
    return CLI_PROCEED;
}

bool cli_long_in(const char *arg, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(arg, &end, 10);
    if (errno || *end || end == arg || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

int cli_parse_long(const char *cmd, const char *arg, const char *what, long lo, long hi,
                   long *out)
{
    if (!cli_long_in(arg, lo, hi, out)) {
        fprintf(stderr, "%s: %s must be an integer in [%ld, %ld], got '%s'\n", cmd, what, lo, hi,
                arg);
        return -1;
    }
    return 1;
}

int cli_parse_int(const char *arg, const char *what, int lo, int hi, int *out)
{
    long v;
    if (cli_parse_long("cairn", arg, what, lo, hi, &v) < 0)
        return -1;
    *out = (int)v;
    return 1;
}

int cli_parse_float(const char *cmd, const char *arg, const char *what, float *out)
{
    char *end;
    errno = 0;
    const float v = strtof(arg, &end);
    if (errno || *end || end == arg || !isfinite(v)) {
        fprintf(stderr, "%s: %s must be a number, got '%s'\n", cmd, what, arg);
        return -1;
    }
    *out = v;
    return 1;
}

int cli_parse_seed(const char *cmd, const char *arg, uint64_t *out)
{
    char *end;
    errno = 0;
    const unsigned long long v = strtoull(arg, &end, 10);
    /* strtoull takes "-1" as 2^64 - 1: a sign is refused, not wrapped */
    if (errno || *end || end == arg || arg[0] == '-') {
        fprintf(stderr, "%s: --seed must be a non-negative integer\n", cmd);
        return -1;
    }
    *out = (uint64_t)v;
    return 1;
}

int cli_parse_load_policy(const char *cmd, const char *arg, cairn_load_policy *out)
{
    if (strcmp(arg, "measured") == 0)
        *out = CAIRN_LOAD_MEASURED;
    else if (strcmp(arg, "always") == 0)
        *out = CAIRN_LOAD_ALWAYS;
    else if (strcmp(arg, "never") == 0)
        *out = CAIRN_LOAD_NEVER;
    else {
        fprintf(stderr, "%s: --tier-loads must be measured, always or never\n", cmd);
        return -1;
    }
    return 1;
}

int cli_model_opts_parse(cli_model_opts *o, int opt, const char *arg)
{
    switch (opt) {
    case 'm': o->model_path = arg; return 1;
    case 't': return cli_parse_int(arg, "--threads", 0, 1024, &o->n_threads);
    case 'c': return cli_parse_int(arg, "--ctx-size", 0, 1 << 22, &o->n_ctx);
    case 'b':
        o->batch_given = true;
        return cli_parse_int(arg, "--batch-size", 1, 1 << 16, &o->batch);
    case 1001: return cli_parse_int(arg, "--page-size", 1, 4096, &o->page_size);
    case 1002:
        if (cairn_kv_type_parse(arg, &o->kv_type) != CAIRN_OK) {
            fprintf(stderr, "cairn: --kv-type must be f16, bf16, f32, q8_0 or q4_0, got '%s'\n",
                    arg);
            return -1;
        }
        return 1;
    case 1003: {
        char err[160];
        if (cairn_device_parse(arg, &o->device, err, sizeof err) != CAIRN_OK) {
            fprintf(stderr, "cairn: %s\n", err);
            return -1;
        }
        return 1;
    }
    default: return 0;
    }
}

cairn_runtime_config cli_runtime_config(const cli_model_opts *o, const char *draft)
{
    return (cairn_runtime_config){.model_path = o->model_path, .device = o->device,
                                  .n_threads = o->n_threads, .max_batch_tokens = o->batch,
                                  .max_seqs = 1, .draft_path = draft};
}

int cli_runtime_open(cli_runtime *rt, const cli_model_opts *o, const cairn_runtime_config *cfg)
{
    memset(rt, 0, sizeof *rt);
    char err[512] = "";
    double t0 = cairn_now();
    const cairn_runtime_config rc_cfg = cfg ? *cfg : cli_runtime_config(o, NULL);
    int rc = cairn_runtime_open(&rc_cfg, &rt->rt, err, sizeof err);
    if (rc != CAIRN_OK) {
        fprintf(stderr, "cairn: cannot load model: %s\n", err[0] ? err : cairn_strerror(rc));
        return rc;
    }
    rt->be = cairn_runtime_backend(rt->rt);
    rt->model = cairn_runtime_model(rt->rt);
    rt->vocab = cairn_runtime_vocab(rt->rt);
    const cairn_hparams *hp = cairn_model_hparams(rt->model);
    rt->n_ctx = o->n_ctx > 0 ? o->n_ctx : (hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096);
    rt->batch = o->batch;
    if ((rc = cairn_model_kv_layout(rt->model, o->page_size, o->kv_type, &rt->kv)) != CAIRN_OK) {
        fprintf(stderr, "cairn: a KV cache of type %s does not fit this model (head_dim %d; "
                        "q8_0 and q4_0 need a multiple of 32)\n",
                cairn_kv_type_name(o->kv_type), hp->head_dim);
        cli_runtime_close(rt);
        return rc;
    }
    int n_pages = (rt->n_ctx + o->page_size - 1) / o->page_size;
    /* The cache's device tier alone, used as a plain page pool: no tree
     * lookups, nothing evicted (every page is taken at once below). */
    cairn_kvcache_config kc = {.backend = rt->be, .layout = rt->kv,
                               .device_bytes = (size_t)n_pages * rt->kv.page_bytes};
    rc = cairn_kvcache_create(&kc, &rt->cache, NULL, 0);
    rt->pages = malloc((size_t)n_pages * sizeof *rt->pages);
    rt->logits = malloc((size_t)o->batch * hp->n_vocab * sizeof(float));
    if (rc == CAIRN_OK && (!rt->pages || !rt->logits))
        rc = CAIRN_ENOMEM;
    if (rc == CAIRN_OK)
        rc = cairn_kvcache_alloc(rt->cache, n_pages, rt->pages);
    if (rc != CAIRN_OK) {
        fprintf(stderr, "cairn: cannot allocate the KV cache (%d pages of %zu bytes): %s\n",
                n_pages, rt->kv.page_bytes, cairn_strerror(rc));
        cli_runtime_close(rt);
        return rc;
    }
    char shape[192];
    cairn_log(CAIRN_LOG_INFO,
              "model %s: %s, vocab %d; loaded in %.2f s on %s (%d threads); KV %s, %d pages of "
              "%d tokens",
              hp->name, cairn_hparams_describe(hp, shape, sizeof shape), hp->n_vocab,
              cairn_now() - t0, rt->be->iface->name, cairn_runtime_threads(rt->rt),
              cairn_kv_type_name(o->kv_type), n_pages, o->page_size);
    return CAIRN_OK;
}

void cli_runtime_close(cli_runtime *rt)
{
    cairn_kvcache_free(rt->cache); /* takes back the pages too */
    cairn_runtime_close(rt->rt);
    free(rt->pages);
    free(rt->logits);
    memset(rt, 0, sizeof *rt);
}

int cli_eval(cli_runtime *rt, const int32_t *tokens, int n, int kv_start, bool all_logits,
             float *out_logits)
{
    if (kv_start + n > rt->n_ctx) {
        fprintf(stderr, "cairn: context full (%d tokens); raise --ctx-size\n", rt->n_ctx);
        return CAIRN_ERANGE;
    }
    const int n_vocab = cairn_model_hparams(rt->model)->n_vocab;
    uint8_t *want = NULL;
    if (all_logits) {
        want = malloc((size_t)rt->batch);
        if (!want)
            return CAIRN_ENOMEM;
        memset(want, 1, (size_t)rt->batch);
    }
    int rc = CAIRN_OK;
    for (int done = 0; done < n && rc == CAIRN_OK;) {
        int chunk = n - done < rt->batch ? n - done : rt->batch;
        bool last = done + chunk == n;
        cairn_seq_batch sb = {
            .tokens = tokens + done,
            .n_tokens = chunk,
            .kv_start = kv_start + done,
            .pages = rt->pages,
            .want = want,
        };
        int n_out = 0;
        float *dst = all_logits ? out_logits + (size_t)done * n_vocab : rt->logits;
        rc = cairn_model_forward(rt->model, cairn_kvcache_kv_base(rt->cache), &rt->kv, &sb, 1,
                                 all_logits || last ? dst : NULL, NULL, &n_out);
        if (rc == CAIRN_OK && !all_logits && last)
            memcpy(out_logits, rt->logits, (size_t)n_vocab * sizeof(float));
        done += chunk;
    }
    free(want);
    if (rc != CAIRN_OK)
        fprintf(stderr, "cairn: forward pass failed: %s\n", cairn_strerror(rc));
    return rc;
}

int cli_tokenize_alloc(const cairn_vocab *v, const char *text, size_t len, int flags,
                       int32_t **out, size_t *n_out)
{
    size_t cap = len + 16, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids)
        return CAIRN_ENOMEM;
    int rc = cairn_tokenize(v, text, len, flags, ids, cap, &n);
    if (rc == CAIRN_ERANGE) {
        int32_t *bigger = realloc(ids, n * sizeof *ids);
        if (!bigger) {
            free(ids);
            return CAIRN_ENOMEM;
        }
        ids = bigger;
        cap = n;
        rc = cairn_tokenize(v, text, len, flags, ids, cap, &n);
    }
    if (rc != CAIRN_OK) {
        free(ids);
        return rc;
    }
    *out = ids;
    *n_out = n;
    return CAIRN_OK;
}

char *cli_read_file(const char *path, size_t *len)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap) {
            if (ferror(f)) {
                free(buf);
                buf = NULL;
            }
            break;
        }
        char *bigger = realloc(buf, cap * 2 + 1);
        if (!bigger) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = bigger;
        cap *= 2;
    }
    if (f != stdin)
        fclose(f);
    if (buf) {
        buf[n] = '\0';
        *len = n;
    }
    return buf;
}
