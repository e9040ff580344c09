/*
 * cli/cli.h — internal to the `cairn` executable: the subcommands and the
 * small pieces they share (model + KV pages set-up, prompt evaluation).
 * Nothing outside cli/ includes this.
 */
#ifndef CAIRN_CLI_H
#define CAIRN_CLI_H

#include "runtime/runtime.h"
#include "session/session.h"
#include "store/store.h"

#include <stdio.h>

int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_chat_format(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_route(int argc, char **argv);
int cmd_cache(int argc, char **argv);

/* What an option parser returns when its command should go on; anything
 * else is the exit status the command returns at once (0 after --help, 2
 * after a bad option, its message printed). */
#define CLI_PROCEED (-1)

/* The end of every command's option switch: -h prints `help` to stdout
 * (status 0); anything else getopt_long returned is a usage error, `help`
 * to stderr (status 2). */
int cli_help_or_usage(int opt, const char *help);
/* Commands that take no operands: CLI_PROCEED when getopt_long left none,
 * else 2 after "CMD: unexpected argument 'ARG'". */
int cli_no_operands(const char *cmd, int argc, char **argv);

/* -m/--model, the same in every command that reads a GGUF file (those that
 * only read metadata take it alone, with help texts of their own). */
#define CLI_DEFAULT_MODEL "models/stories260K.gguf"
#define CLI_MODEL_PATH_LONGOPT {"model", required_argument, 0, 'm'}

/* Options every model-loading command accepts. */
typedef struct {
    const char *model_path;
    int n_threads;      /* 0 = all cores                           */
    int n_ctx;          /* tokens of KV to reserve; 0 = default     */
    int page_size;
    cairn_type kv_type; /* F16 by default, like llama.cpp           */
    int batch;          /* max tokens per forward call              */
    cairn_device device; /* --device (runtime/runtime.h); AUTO = CUDA
                            when a GPU is present, else the CPU      */
    bool batch_given;   /* -b was given: serve and bench size the batch
                           themselves otherwise                      */
} cli_model_opts;

void cli_model_opts_defaults(cli_model_opts *o);
/* Parses one of the shared options; returns 1 if `opt` was one of them, 0 if
 * not, -1 on a bad value (message printed). */
int cli_model_opts_parse(cli_model_opts *o, int opt, const char *arg);
/* The getopt_long entries and help text for the shared options. */
#define CLI_MODEL_LONGOPTS                                                                         \
    CLI_MODEL_PATH_LONGOPT, {"threads", required_argument, 0, 't'},                                \
        {"ctx-size", required_argument, 0, 'c'}, {"page-size", required_argument, 0, 1001},        \
        {"kv-type", required_argument, 0, 1002}, {"batch-size", required_argument, 0, 'b'},        \
        {"device", required_argument, 0, 1003}
#define CLI_MODEL_SHORTOPTS "m:t:c:b:"
#define CLI_MODEL_HELP                                                                             \
    "  -m, --model PATH       GGUF file or Hugging Face checkpoint folder (default "             \
    CLI_DEFAULT_MODEL ")\n"                                                                     \
    "  -t, --threads N        CPU threads (default: all cores)\n"                                  \
    "  -c, --ctx-size N       context to reserve KV pages for (default: the model's; `run`\n"      \
    "                         at most 4096)\n"                                                    \
    "  -b, --batch-size N     most tokens per forward call (default 512)\n"                        \
    "      --page-size N      tokens per KV page (default 16)\n"                                   \
    "      --kv-type T        KV cache type: f16 (default), bf16, f32, q8_0 or q4_0\n"              \
    "      --device D         cpu, cuda, cuda:N or auto (default auto: the first CUDA GPU\n"       \
    "                         when built with CUDA and one is present, else the CPU)\n"

/* The runtime options the shared model options ask for (draft: an EAGLE
 * head, or NULL). */
cairn_runtime_config cli_runtime_config(const cli_model_opts *o, const char *draft);

/* A loaded model with one sequence's worth of KV pages. */
typedef struct {
    cairn_runtime *rt;
    cairn_backend *be;  /* the runtime's */
    cairn_model *model; /* the runtime's */
    const cairn_vocab *vocab;
    cairn_kvcache *cache; /* device tier only: the single sequence's pages */
    cairn_kv_layout kv;
    int n_ctx;
    int32_t *pages; /* page table of the single sequence, n_ctx tokens */
    float *logits;  /* host [batch][n_vocab]                          */
    int batch;
} cli_runtime;

/* cfg: NULL for cli_runtime_config(o, NULL) (no speculative methods). */
int cli_runtime_open(cli_runtime *rt, const cli_model_opts *o, const cairn_runtime_config *cfg);
void cli_runtime_close(cli_runtime *rt);

/* Evaluate tokens[0..n) at KV indices kv_start.. of the sequence, in chunks
 * of the batch size. When all_logits is set, logits for every token are
 * written to out_logits ([n][n_vocab]); otherwise only the last token's
 * ([n_vocab]). */
int cli_eval(cli_runtime *rt, const int32_t *tokens, int n, int kv_start, bool all_logits,
             float *out_logits);

/* Tokenize a whole string into a freshly allocated array (caller frees). */
int cli_tokenize_alloc(const cairn_vocab *v, const char *text, size_t len, int flags,
                       int32_t **out, size_t *n_out);

/* Option values. Each command words its own messages (they are part of its
 * interface), so the checks come apart from the printing:
 *
 * cli_long_in: a whole decimal integer (strtol's syntax: leading blanks and
 * a sign allowed, nothing after it) in [lo, hi]; prints nothing. */
bool cli_long_in(const char *arg, long lo, long hi, long *out);
/* The same, 1 with *out set, or -1 after "CMD: WHAT must be an integer in
 * [LO, HI], got 'ARG'" (the cli_*_opts_parse convention). */
int cli_parse_long(const char *cmd, const char *arg, const char *what, long lo, long hi,
                   long *out);
/* cli_parse_long for an int, with the message under "cairn" (the options
 * several commands share). */
int cli_parse_int(const char *arg, const char *what, int lo, int hi, int *out);
/* A finite number (strtof's syntax, nothing after it): 1 with *out set, or
 * -1 after "CMD: WHAT must be a number, got 'ARG'". */
int cli_parse_float(const char *cmd, const char *arg, const char *what, float *out);
/* --seed: a non-negative decimal integer (all 64 bits): 1 with *out set, or
 * -1 after "CMD: --seed must be a non-negative integer". */
int cli_parse_seed(const char *cmd, const char *arg, uint64_t *out);
/* --tier-loads: measured, always or never: 1 with *out set, or -1 after
 * "CMD: --tier-loads must be measured, always or never". */
int cli_parse_load_policy(const char *cmd, const char *arg, cairn_load_policy *out);

/* Read a whole file ("-" = stdin) into a NUL-terminated buffer. */
char *cli_read_file(const char *path, size_t *len);

#endif /* CAIRN_CLI_H */
