/*
 * cli/cli_eagle.c — --draft options and the speculative decoder's set-up for
 * `cairn run` and `cairn bench`.
 */
#include "cli/cli_eagle.h"

#include <stdlib.h>
#include <string.h>

void cli_draft_opts_defaults(cli_draft_opts *o)
{
    o->head_path = NULL;
    o->params = cairn_eagle_defaults();
}

int cli_draft_opts_parse(cli_draft_opts *o, int opt, const char *arg)
{
    switch (opt) {
    case CLI_DRAFT_OPT_BASE: o->head_path = arg; return 1;
    case CLI_DRAFT_OPT_BASE + 1: return cli_parse_int(arg, "--draft-depth", 1, 16, &o->params.depth);
    case CLI_DRAFT_OPT_BASE + 2: return cli_parse_int(arg, "--draft-topk", 1, 16, &o->params.top_k);
    case CLI_DRAFT_OPT_BASE + 3: return cli_parse_int(arg, "--draft-n", 1, 255, &o->params.n_draft);
    default: return 0;
    }
}

int cli_spec_open(cli_spec *s, cli_runtime *rt, const cli_draft_opts *o,
                  const cairn_sampling_params *sp)
{
    memset(s, 0, sizeof *s);
    char err[512] = "";
    int rc = cairn_eagle_load(o->head_path, rt->model, &s->head, err, sizeof err);
    if (rc != CAIRN_OK) {
        fprintf(stderr, "cairn: cannot load the draft head: %s\n", err[0] ? err : cairn_strerror(rc));
        return rc;
    }
    rc = cairn_eagle_seq_create(s->head, &o->params, sp, &s->seq);
    if (rc == CAIRN_EUNSUPPORTED)
        fprintf(stderr, "cairn: speculative decoding does not support repetition, frequency or "
                        "presence penalties\n");
    else if (rc == CAIRN_ERANGE)
        fprintf(stderr, "cairn: --draft-n %d needs a batch size (-b) of at least %d\n",
                o->params.n_draft, o->params.n_draft + 1);
    else if (rc != CAIRN_OK)
        fprintf(stderr, "cairn: invalid draft settings: %s\n", cairn_strerror(rc));
    const int page_size = rt->kv.page_size;
    s->capacity = rt->n_ctx;
    int n_pages = (s->capacity + page_size - 1) / page_size;
    if (rc == CAIRN_OK)
        rc = cairn_eagle_kv_layout(s->head, page_size, rt->kv.dtype, &s->kv);
    if (rc == CAIRN_OK)
        rc = cairn_page_pool_create(rt->be, &s->kv, (size_t)n_pages * s->kv.page_bytes, &s->pool);
    if (rc == CAIRN_OK && !(s->pages = malloc((size_t)n_pages * sizeof *s->pages)))
        rc = CAIRN_ENOMEM;
    if (rc == CAIRN_OK)
        rc = cairn_page_pool_alloc(s->pool, n_pages, s->pages);
    if (rc != CAIRN_OK) {
        if (s->seq)
            fprintf(stderr, "cairn: cannot set up speculative decoding: %s\n", cairn_strerror(rc));
        cli_spec_close(s);
        return rc;
    }
    const cairn_eagle_params *p = &o->params;
    cairn_log(CAIRN_LOG_INFO, "draft head %s: depth %d, top-k %d, %d draft tokens per step",
              o->head_path, p->depth, p->top_k, p->n_draft);
    return CAIRN_OK;
}

void cli_spec_close(cli_spec *s)
{
    if (s->pool && s->pages)
        cairn_page_pool_release(s->pool, (s->capacity + s->kv.page_size - 1) / s->kv.page_size,
                                s->pages);
    cairn_page_pool_free(s->pool);
    cairn_eagle_seq_free(s->seq);
    cairn_eagle_free(s->head);
    free(s->pages);
    memset(s, 0, sizeof *s);
}
