/*
 * cli/cli_spec.c — the speculative decoding options and the speculative
 * decoder's set-up for `cairn run`, `cairn bench` and `cairn serve`.
 */
#include "cli/cli_spec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cli_draft_opts_defaults(cli_draft_opts *o)
{
    o->spec = NULL;
    o->head_path = NULL;
    o->params = cairn_spec_defaults();
}

static int parse_ngram(cli_draft_opts *o, const char *arg)
{
    int lo, hi;
    char tail;
    if (sscanf(arg, "%d:%d%c", &lo, &hi, &tail) != 2 || lo < 1 || hi < lo || hi > 16) {
        fprintf(stderr, "cairn: --spec-ngram must be MIN:MAX with 1 <= MIN <= MAX <= 16, got '%s'\n",
                arg);
        return -1;
    }
    o->params.ngram_min = lo;
    o->params.ngram_max = hi;
    return 1;
}

int cli_draft_opts_parse(cli_draft_opts *o, int opt, const char *arg)
{
    switch (opt) {
    case CLI_DRAFT_OPT_BASE: o->head_path = arg; return 1;
    case CLI_DRAFT_OPT_BASE + 1: return cli_parse_int(arg, "--draft-depth", 1, 16, &o->params.depth);
    case CLI_DRAFT_OPT_BASE + 2: return cli_parse_int(arg, "--draft-topk", 1, 16, &o->params.top_k);
    case CLI_DRAFT_OPT_BASE + 3: return cli_parse_int(arg, "--draft-n", 1, 255, &o->params.n_draft);
    case CLI_DRAFT_OPT_BASE + 4: o->spec = arg; return 1;
    case CLI_DRAFT_OPT_BASE + 5:
        return cli_parse_int(arg, "--spec-chain", 1, 16, &o->params.chain_max);
    case CLI_DRAFT_OPT_BASE + 6: return parse_ngram(o, arg);
    case CLI_DRAFT_OPT_BASE + 7: o->params.fixed_length = true; return 1;
    default: return 0;
    }
}

bool cli_draft_opts_active(const cli_draft_opts *o)
{
    return o->head_path || (o->spec && *o->spec);
}

cairn_runtime_config cli_spec_runtime_config(const cli_model_opts *m, const cli_draft_opts *o)
{
    cairn_runtime_config c = cli_runtime_config(m, o->head_path);
    c.spec = o->spec;
    return c;
}

int cli_spec_open(cli_spec *s, cli_runtime *rt, const cli_draft_opts *o,
                  const cairn_sampling_params *sp)
{
    memset(s, 0, sizeof *s);
    s->spec = cairn_runtime_spec(rt->rt);
    if (!s->spec) {
        fprintf(stderr, "cairn: no speculative method was loaded\n");
        return CAIRN_EINVAL;
    }
    cairn_spec_params p = o->params;
    if (p.chain_max > p.n_draft)
        p.chain_max = p.n_draft;
    int rc = cairn_spec_seq_create(s->spec, &p, sp, 0, &s->seq);
    if (rc == CAIRN_ERANGE)
        fprintf(stderr, "cairn: --draft-n %d needs a batch size (-b) of at least %d\n",
                p.n_draft, p.n_draft + 1);
    else if (rc != CAIRN_OK)
        fprintf(stderr, "cairn: invalid draft settings: %s\n", cairn_strerror(rc));
    const int page_size = rt->kv.page_size;
    s->capacity = rt->n_ctx;
    int n_pages = (s->capacity + page_size - 1) / page_size;
    if (rc == CAIRN_OK)
        rc = cairn_spec_kv_layout(s->spec, page_size, rt->kv.dtype, &s->kv);
    if (rc == CAIRN_OK) {
        cairn_kvcache_config kc = {.backend = rt->be, .layout = s->kv,
                                   .device_bytes = (size_t)n_pages * s->kv.page_bytes};
        rc = cairn_kvcache_create(&kc, &s->cache, NULL, 0);
    }
    if (rc == CAIRN_OK && !(s->pages = malloc((size_t)n_pages * sizeof *s->pages)))
        rc = CAIRN_ENOMEM;
    if (rc == CAIRN_OK)
        rc = cairn_kvcache_alloc(s->cache, n_pages, s->pages);
    if (rc != CAIRN_OK) {
        if (s->seq)
            fprintf(stderr, "cairn: cannot set up speculative decoding: %s\n", cairn_strerror(rc));
        cli_spec_close(s);
        return rc;
    }
    cairn_log(CAIRN_LOG_INFO, "speculative decoding with %s: depth %d, top-k %d, at most %d draft "
              "tokens per step, chains up to %d", cairn_spec_describe(s->spec), p.depth, p.top_k,
              p.n_draft, p.chain_max);
    return CAIRN_OK;
}

void cli_spec_close(cli_spec *s)
{
    cairn_kvcache_free(s->cache); /* takes back the pages too */
    cairn_spec_seq_free(s->seq);
    free(s->pages);
    memset(s, 0, sizeof *s);
}
