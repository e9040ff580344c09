/*
 * cli/cli_eagle.h — internal to the `cairn` executable: the --draft options
 * (EAGLE speculative decoding) that `cairn run` and `cairn bench` share, and
 * a speculative decoder over its own KV pages (the target's layers plus the
 * head's), set up beside a cli_runtime.
 */
#ifndef CAIRN_CLI_EAGLE_H
#define CAIRN_CLI_EAGLE_H

#include "cli/cli.h"

typedef struct {
    const char *head_path; /* NULL: no speculation */
    cairn_eagle_params params;
} cli_draft_opts;

void cli_draft_opts_defaults(cli_draft_opts *o);
/* 1 if `opt` was a draft option, 0 if not, -1 on a bad value (printed). */
int cli_draft_opts_parse(cli_draft_opts *o, int opt, const char *arg);

#define CLI_DRAFT_OPT_BASE 3100
#define CLI_DRAFT_LONGOPTS                                                                         \
    {"draft", required_argument, 0, CLI_DRAFT_OPT_BASE},                                           \
        {"draft-depth", required_argument, 0, CLI_DRAFT_OPT_BASE + 1},                             \
        {"draft-topk", required_argument, 0, CLI_DRAFT_OPT_BASE + 2},                              \
        {"draft-n", required_argument, 0, CLI_DRAFT_OPT_BASE + 3}
#define CLI_DRAFT_HELP                                                                             \
    "      --draft HEAD.gguf    EAGLE head: speculative decoding, same output distribution\n"     \
    "      --draft-depth N      draft tree depth (default 5)\n"                                    \
    "      --draft-topk K       children per expanded draft node (default 8)\n"                    \
    "      --draft-n N          draft tokens verified per step (default 32)\n"

typedef struct {
    cairn_eagle *head;
    cairn_page_pool *pool;
    cairn_kv_layout kv;
    int32_t *pages;
    int capacity; /* KV indices the page table covers */
    cairn_eagle_seq *seq;
} cli_spec;

/* Load the head for rt's model and reserve KV for rt->n_ctx tokens. Prints
 * why on failure. */
int cli_spec_open(cli_spec *s, cli_runtime *rt, const cli_draft_opts *o,
                  const cairn_sampling_params *sp);
void cli_spec_close(cli_spec *s);

#endif /* CAIRN_CLI_EAGLE_H */
