/*
 * cli/cli_spec.h — internal to the `cairn` executable: the speculative
 * decoding options (--spec, --draft and the draft settings) that `cairn
 * run`, `cairn bench` and `cairn serve` share, and a speculative decoder
 * over its own KV pages (the target's layers plus the methods'), set up
 * beside a cli_runtime.
 */
#ifndef CAIRN_CLI_SPEC_H
#define CAIRN_CLI_SPEC_H

#include "cli/cli.h"

typedef struct {
    const char *spec;      /* --spec METHOD[,METHOD]: NULL = none            */
    const char *head_path; /* --draft HEAD.gguf (an EAGLE head): NULL = none */
    cairn_spec_params params;
} cli_draft_opts;

void cli_draft_opts_defaults(cli_draft_opts *o);
/* 1 if `opt` was a draft option, 0 if not, -1 on a bad value (printed). */
int cli_draft_opts_parse(cli_draft_opts *o, int opt, const char *arg);
/* Whether any speculative method was asked for. */
bool cli_draft_opts_active(const cli_draft_opts *o);
/* The runtime configuration with the asked-for methods. */
cairn_runtime_config cli_spec_runtime_config(const cli_model_opts *m, const cli_draft_opts *o);

#define CLI_DRAFT_OPT_BASE 3100
#define CLI_DRAFT_LONGOPTS                                                                         \
    {"draft", required_argument, 0, CLI_DRAFT_OPT_BASE},                                           \
        {"draft-depth", required_argument, 0, CLI_DRAFT_OPT_BASE + 1},                             \
        {"draft-topk", required_argument, 0, CLI_DRAFT_OPT_BASE + 2},                              \
        {"draft-n", required_argument, 0, CLI_DRAFT_OPT_BASE + 3},                                 \
        {"spec", required_argument, 0, CLI_DRAFT_OPT_BASE + 4},                                    \
        {"spec-chain", required_argument, 0, CLI_DRAFT_OPT_BASE + 5},                              \
        {"spec-ngram", required_argument, 0, CLI_DRAFT_OPT_BASE + 6},                              \
        {"spec-fixed", no_argument, 0, CLI_DRAFT_OPT_BASE + 7}
#define CLI_DRAFT_HELP                                                                             \
    "      --spec LIST          speculative decoding, same output (lossless): comma-separated\n"  \
    "                           methods that draft together: suffix[:TOKENS] (copies from\n"     \
    "                           the request and the tenant's earlier requests, a corpus of\n"   \
    "                           TOKENS tokens, default 1048576, 0 = the request only; ngram\n"  \
    "                           is the same),\n"                                                 \
    "                           draft:MODEL.gguf (a smaller model, same vocabulary),\n"           \
    "                           eagle:HEAD.gguf (an EAGLE head), medusa:HEADS.gguf (Medusa\n"   \
    "                           heads), eagle3:HEAD.gguf (an EAGLE-3 head; not beside\n"        \
    "                           eagle or medusa)\n"                                              \
    "      --draft HEAD.gguf    the same as --spec eagle:HEAD.gguf\n"                              \
    "      --draft-depth N      EAGLE draft tree depth (default 5)\n"                              \
    "      --draft-topk K       children per expanded EAGLE draft node (default 8)\n"              \
    "      --draft-n N          most draft tokens verified per step (default 32)\n"                \
    "      --spec-chain N       most rows suffix / a draft model guesses (default 12)\n"          \
    "      --spec-ngram MIN:MAX suffix: shortest match, and the match length from which\n"      \
    "                           all occurrences are weighed together (default 2:4)\n"         \
    "      --spec-fixed         always draft the most, never pause speculation that\n"             \
    "                           does not pay (for measurements)\n"

typedef struct {
    cairn_spec *spec; /* the runtime's */
    cairn_kvcache *cache; /* device tier only: the draft sequence's pages */
    cairn_kv_layout kv;
    int32_t *pages;
    int capacity; /* KV indices the page table covers */
    cairn_spec_seq *seq;
} cli_spec;

/* A decoder over rt's speculative methods (rt opened with
 * cli_spec_runtime_config) and KV for rt->n_ctx tokens. Prints why on
 * failure. */
int cli_spec_open(cli_spec *s, cli_runtime *rt, const cli_draft_opts *o,
                  const cairn_sampling_params *sp);
void cli_spec_close(cli_spec *s);

#endif /* CAIRN_CLI_SPEC_H */
