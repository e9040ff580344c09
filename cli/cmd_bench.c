/*
 * cli/cmd_bench.c — `cairn bench`: prompt-processing and generation speed,
 * measured the way llama-bench measures them so the numbers compare:
 *
 *   - pp: one forward call over P random tokens starting from an empty
 *     context (the KV cache is simply overwritten from index 0 each time);
 *     tokens/s = P / seconds.
 *   - tg: N forward calls of one token each, from an empty context, the
 *     output logits of every step computed and copied to the host;
 *     tokens/s = N / seconds.
 *   - one untimed warm-up of each (touches every weight page and starts the
 *     worker threads), then R timed repetitions; the mean and standard
 *     deviation of the per-repetition rates are reported.
 *
 * Tokens are drawn from a fixed-seed generator over the model's vocabulary;
 * a forward pass costs the same whatever the ids are.
 */
#include "cli/cli.h"
#include "cli/cli_spec.h"

#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char help[] =
    "usage: cairn bench -m MODEL [options]\n\n"
    "Prompt processing (pp) and generation (tg) speed in tokens/s, like llama-bench.\n\n"
    "  -p, --n-prompt N         prompt tokens per pp run (default 512; 0 = skip pp)\n"
    "  -n, --n-gen N            generated tokens per tg run (default 128; 0 = skip tg)\n"
    "  -r, --repetitions N      timed runs of each test (default 5)\n"
    "      --json               print one JSON line instead of a table\n"
    "  with --spec/--draft: greedy generation of -n tokens from --text, timed with and without\n"
    "  speculation, and tau (tokens per target forward)\n"
    "      --text TEXT          prompt for the --spec comparison (default \"Once upon a time\")\n"
    CLI_DRAFT_HELP CLI_MODEL_HELP
    "  -h, --help               this help\n";

typedef struct {
    double mean, sd;
} rate_stats;

static rate_stats stats_of(const double *v, int n)
{
    rate_stats s = {0, 0};
    for (int i = 0; i < n; i++)
        s.mean += v[i];
    s.mean /= n;
    for (int i = 0; i < n; i++)
        s.sd += (v[i] - s.mean) * (v[i] - s.mean);
    s.sd = n > 1 ? sqrt(s.sd / (n - 1)) : 0.0;
    return s;
}

/* One pp run: P tokens in one forward call (or batch-sized chunks when P
 * exceeds the batch). Returns tokens/s, or a negative status. */
static int run_pp(cli_runtime *rt, const int32_t *tokens, int P, float *logits, double *rate)
{
    double t0 = cairn_now();
    int rc = cli_eval(rt, tokens, P, 0, false, logits);
    double dt = cairn_now() - t0;
    if (rc != CAIRN_OK)
        return rc;
    *rate = P / dt;
    return CAIRN_OK;
}

/* One tg run: N single-token forward calls at KV indices 0..N-1. */
static int run_tg(cli_runtime *rt, const int32_t *tokens, int N, float *logits, double *rate)
{
    double t0 = cairn_now();
    for (int i = 0; i < N; i++) {
        int rc = cli_eval(rt, tokens + i, 1, i, false, logits);
        if (rc != CAIRN_OK)
            return rc;
    }
    *rate = N / (cairn_now() - t0);
    return CAIRN_OK;
}

/* Greedy generation of n tokens after `prompt`, one target forward per
 * token (end-of-text tokens are generated through, like llama-bench). */
static int run_text_plain(cli_runtime *rt, const int32_t *prompt, int n_prompt, int n,
                          float *logits, double *rate)
{
    const int n_vocab = cairn_model_hparams(rt->model)->n_vocab;
    double t0 = cairn_now();
    int rc = cli_eval(rt, prompt, n_prompt, 0, false, logits);
    for (int i = 0; rc == CAIRN_OK && i < n; i++) {
        int32_t tok = 0;
        for (int v = 1; v < n_vocab; v++)
            if (logits[v] > logits[tok])
                tok = v;
        if (i + 1 < n)
            rc = cli_eval(rt, &tok, 1, n_prompt + i, false, logits);
    }
    *rate = n / (cairn_now() - t0);
    return rc;
}

/* The same with speculation; *tau = tokens per target forward. */
static int run_text_eagle(cli_spec *spec, const int32_t *prompt, int n_prompt, int n,
                          double *rate, double *tau)
{
    double t0 = cairn_now();
    int rc = cairn_spec_seq_begin(spec->seq, cairn_page_pool_base(spec->pool), &spec->kv,
                                   spec->pages, spec->capacity, prompt, n_prompt);
    int32_t step[32];
    for (int done = 0; rc == CAIRN_OK && done < n;) {
        int got = 0;
        rc = cairn_spec_seq_step(spec->seq, step, 32, &got);
        done += got;
    }
    *rate = n / (cairn_now() - t0);
    cairn_spec_stats st;
    cairn_spec_seq_stats(spec->seq, &st);
    *tau = st.steps ? (double)st.tokens / (double)st.steps : 0;
    return rc;
}

/* ---- options -------------------------------------------------------------- */

enum { OPT_JSON = 4000, OPT_TEXT };

typedef struct {
    cli_model_opts model;
    cli_draft_opts draft;
    int n_prompt, n_gen, reps;
    bool json;
    const char *text; /* the --draft comparison's prompt */
} bench_opts;

/* -p, -n and -r: 1 with the count set, -1 after saying what it needs. */
static int parse_count_opt(int opt, const char *arg, int *out)
{
    long v;
    if (!cli_long_in(arg, opt == 'r' ? 1 : 0, 1 << 20, &v)) {
        fprintf(stderr, "cairn bench: -%c needs a %s integer, got '%s'\n", opt,
                opt == 'r' ? "positive" : "non-negative", arg);
        return -1;
    }
    *out = (int)v;
    return 1;
}

/* What `bench` adds to the shared options: 1 if `opt` was one, 0 if not,
 * -1 on a bad value (printed). */
static int parse_bench_opt(bench_opts *o, int opt, const char *arg)
{
    switch (opt) {
    case 'p': return parse_count_opt(opt, arg, &o->n_prompt);
    case 'n': return parse_count_opt(opt, arg, &o->n_gen);
    case 'r': return parse_count_opt(opt, arg, &o->reps);
    case OPT_JSON: o->json = true; return 1;
    case OPT_TEXT: o->text = arg; return 1;
    default: return 0;
    }
}

/* The command line into *o: CLI_PROCEED, or the exit status. */
static int parse_bench_opts(bench_opts *o, int argc, char **argv)
{
    static const struct option longopts[] = {
        CLI_MODEL_LONGOPTS,
        {"n-prompt", required_argument, 0, 'p'},
        {"n-gen", required_argument, 0, 'n'},
        {"repetitions", required_argument, 0, 'r'},
        {"json", no_argument, 0, OPT_JSON},
        {"text", required_argument, 0, OPT_TEXT},
        {"help", no_argument, 0, 'h'},
        CLI_DRAFT_LONGOPTS,
        {0, 0, 0, 0},
    };
    memset(o, 0, sizeof *o);
    cli_model_opts_defaults(&o->model);
    cli_draft_opts_defaults(&o->draft);
    o->n_prompt = 512;
    o->n_gen = 128;
    o->reps = 5;
    o->text = "Once upon a time";
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, CLI_MODEL_SHORTOPTS "p:n:r:h", longopts, NULL)) != -1) {
        int r = cli_model_opts_parse(&o->model, opt, optarg);
        if (r == 0)
            r = cli_draft_opts_parse(&o->draft, opt, optarg);
        if (r == 0)
            r = parse_bench_opt(o, opt, optarg);
        if (r < 0)
            return 2;
        if (r == 0)
            return cli_help_or_usage(opt, help);
    }
    return cli_no_operands("cairn bench", argc, argv);
}

/* ---- set-up --------------------------------------------------------------- */

/* The batch and context the tests need, unless the options gave them.
 * CLI_PROCEED, or 2 when there is nothing to measure. */
static int prepare_bench(bench_opts *o)
{
    cli_model_opts *mo = &o->model;
    const int n_prompt = o->n_prompt, n_gen = o->n_gen;
    if (n_prompt == 0 && n_gen == 0) {
        fprintf(stderr, "cairn bench: nothing to do (-p 0 and -n 0)\n");
        return 2;
    }
    /* Like llama-bench's default micro-batch: a 512-token prompt is one call. */
    if (!mo->batch_given)
        mo->batch = n_prompt > 0 && n_prompt < 512 ? n_prompt : 512;
    int need_ctx = n_prompt > n_gen ? n_prompt : n_gen;
    if (cli_draft_opts_active(&o->draft)) /* the text prompt, then n_gen tokens and a draft tree */
        need_ctx = need_ctx > n_gen + 512 ? need_ctx : n_gen + 512;
    if (cli_draft_opts_active(&o->draft) && mo->batch < o->draft.params.n_draft + 1)
        mo->batch = o->draft.params.n_draft + 1;
    if (mo->n_ctx < need_ctx)
        mo->n_ctx = need_ctx;
    if (o->json)
        cairn_log_set_level(CAIRN_LOG_WARN);
    return CLI_PROCEED;
}

/* ---- the action ----------------------------------------------------------- */

typedef struct {
    rate_stats pp, tg, text_plain, text_eagle; /* text_eagle: with speculation */
    double tau;
    const char *method; /* the speculative methods */
} bench_results;

/* The buffers every test shares: random token ids, one step's logits, the
 * per-repetition rates. */
typedef struct {
    int32_t *tokens;
    float *logits;
    double *rates;
} bench_buffers;

static void bench_buffers_free(bench_buffers *b)
{
    free(b->tokens);
    free(b->logits);
    free(b->rates);
}

static int bench_buffers_alloc(bench_buffers *b, const cli_runtime *rt, const bench_opts *o)
{
    const int n_vocab = cairn_model_hparams(rt->model)->n_vocab;
    int n_tok = o->n_prompt > o->n_gen ? o->n_prompt : o->n_gen;
    b->tokens = malloc((size_t)n_tok * sizeof *b->tokens);
    b->logits = malloc((size_t)n_vocab * sizeof *b->logits);
    b->rates = malloc((size_t)o->reps * sizeof *b->rates);
    if (!b->tokens || !b->logits || !b->rates)
        return CAIRN_ENOMEM;
    uint64_t state = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < n_tok; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        b->tokens[i] = (int32_t)((state >> 33) % (uint64_t)n_vocab);
    }
    return CAIRN_OK;
}

/* pp and tg: an untimed warm-up, then the timed repetitions. */
static int bench_pp_tg(cli_runtime *rt, const bench_opts *o, bench_buffers *b, bench_results *res)
{
    int rc = CAIRN_OK;
    double warm;
    if (o->n_prompt > 0) {
        rc = run_pp(rt, b->tokens, o->n_prompt, b->logits, &warm);
        for (int r = 0; rc == CAIRN_OK && r < o->reps; r++)
            rc = run_pp(rt, b->tokens, o->n_prompt, b->logits, &b->rates[r]);
        if (rc == CAIRN_OK)
            res->pp = stats_of(b->rates, o->reps);
    }
    if (rc == CAIRN_OK && o->n_gen > 0) {
        rc = run_tg(rt, b->tokens, o->n_gen < 16 ? o->n_gen : 16, b->logits, &warm);
        for (int r = 0; rc == CAIRN_OK && r < o->reps; r++)
            rc = run_tg(rt, b->tokens, o->n_gen, b->logits, &b->rates[r]);
        if (rc == CAIRN_OK)
            res->tg = stats_of(b->rates, o->reps);
    }
    return rc;
}

/* --draft: the same greedy text with and without speculation. */
static int bench_draft_text(cli_runtime *rt, const bench_opts *o, bench_buffers *b,
                            bench_results *res)
{
    const int n_gen = o->n_gen, warm_n = n_gen < 16 ? n_gen : 16;
    cairn_sampling_params greedy = cairn_sampling_defaults();
    greedy.temperature = 0;
    cli_spec spec;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    const cairn_vocab *vocab = rt->vocab;
    int rc = cli_tokenize_alloc(vocab, o->text, strlen(o->text),
                                cairn_vocab_add_bos(vocab) ? CAIRN_TOK_ADD_BOS : 0, &ids, &n_ids);
    if (rc == CAIRN_OK && n_ids == 0)
        rc = CAIRN_EINVAL;
    if (rc == CAIRN_OK && (rc = cli_spec_open(&spec, rt, &o->draft, &greedy)) == CAIRN_OK) {
        double warm, warm_tau;
        rc = run_text_plain(rt, ids, (int)n_ids, warm_n, b->logits, &warm);
        for (int r = 0; rc == CAIRN_OK && r < o->reps; r++)
            rc = run_text_plain(rt, ids, (int)n_ids, n_gen, b->logits, &b->rates[r]);
        if (rc == CAIRN_OK)
            res->text_plain = stats_of(b->rates, o->reps);
        if (rc == CAIRN_OK)
            rc = run_text_eagle(&spec, ids, (int)n_ids, warm_n, &warm, &warm_tau);
        for (int r = 0; rc == CAIRN_OK && r < o->reps; r++)
            rc = run_text_eagle(&spec, ids, (int)n_ids, n_gen, &b->rates[r], &res->tau);
        res->method = cairn_spec_describe(spec.spec);
        if (rc == CAIRN_OK)
            res->text_eagle = stats_of(b->rates, o->reps);
        cli_spec_close(&spec);
    }
    free(ids);
    return rc;
}

static void print_bench_json(const bench_opts *o, const cairn_hparams *hp, int threads,
                             long long model_bytes, const bench_results *res)
{
    const cairn_spec_params *dp = &o->draft.params;
    printf("{\"pp\": %.3f, \"tg\": %.3f, \"pp_sd\": %.3f, \"tg_sd\": %.3f, "
           "\"n_prompt\": %d, \"n_gen\": %d, \"reps\": %d, \"threads\": %d, "
           "\"model\": \"%s\", \"model_bytes\": %lld, \"n_params_dim\": %d, "
           "\"n_layer\": %d, \"n_vocab\": %d",
           res->pp.mean, res->tg.mean, res->pp.sd, res->tg.sd, o->n_prompt, o->n_gen, o->reps,
           threads, hp->name, model_bytes, hp->dim, hp->n_layer, hp->n_vocab);
    if (cli_draft_opts_active(&o->draft))
        printf(", \"text_plain\": %.3f, \"text_plain_sd\": %.3f, \"text_eagle\": %.3f, "
               "\"text_eagle_sd\": %.3f, \"tau\": %.3f, \"draft_depth\": %d, "
               "\"draft_topk\": %d, \"draft_n\": %d, \"spec\": \"%s\"",
               res->text_plain.mean, res->text_plain.sd, res->text_eagle.mean,
               res->text_eagle.sd, res->tau, dp->depth, dp->top_k, dp->n_draft,
               res->method ? res->method : "");
    printf("}\n");
}

/* The llama-bench table. */
static void print_bench_table(const bench_opts *o, const cairn_hparams *hp, int threads,
                              const bench_results *res)
{
    const cairn_spec_params *dp = &o->draft.params;
    printf("| %-28s | %7s | %8s | %16s |\n", "model", "threads", "test", "t/s");
    printf("| %.28s | ------: | -------: | ---------------: |\n", "----------------------------");
    if (o->n_prompt > 0)
        printf("| %-28.28s | %7d | %5s%-3d | %8.2f ± %5.2f |\n", hp->name, threads, "pp",
               o->n_prompt, res->pp.mean, res->pp.sd);
    if (o->n_gen > 0)
        printf("| %-28.28s | %7d | %5s%-3d | %8.2f ± %5.2f |\n", hp->name, threads, "tg",
               o->n_gen, res->tg.mean, res->tg.sd);
    if (cli_draft_opts_active(&o->draft) && o->n_gen > 0) {
        printf("| %-28.28s | %7d | %5s%-3d | %8.2f ± %5.2f |  greedy text, plain\n", hp->name,
               threads, "text", o->n_gen, res->text_plain.mean, res->text_plain.sd);
        printf("| %-28.28s | %7d | %5s%-3d | %8.2f ± %5.2f |  %s d%d k%d n%d: "
               "tau %.2f\n", hp->name, threads, "text", o->n_gen, res->text_eagle.mean,
               res->text_eagle.sd, res->method, dp->depth, dp->top_k, dp->n_draft, res->tau);
    }
}

/* Load the model, run the tests, print the results: the exit status. */
static int run_bench(const bench_opts *o)
{
    cli_runtime rt;
    const cairn_runtime_config cfg = cli_spec_runtime_config(&o->model, &o->draft);
    if (cli_runtime_open(&rt, &o->model, &cfg) != CAIRN_OK)
        return 1;
    bench_buffers b = {0};
    bench_results res = {0};
    int rc = bench_buffers_alloc(&b, &rt, o);
    if (rc == CAIRN_OK)
        rc = bench_pp_tg(&rt, o, &b, &res);
    if (rc == CAIRN_OK && cli_draft_opts_active(&o->draft) && o->n_gen > 0)
        rc = bench_draft_text(&rt, o, &b, &res);
    if (rc == CAIRN_OK) {
        const cairn_hparams *hp = cairn_model_hparams(rt.model);
        struct stat st;
        long long model_bytes = stat(o->model.model_path, &st) == 0 ? (long long)st.st_size : -1;
        int threads = cairn_backend_cpu_threads(rt.be);
        if (o->json)
            print_bench_json(o, hp, threads, model_bytes, &res);
        else
            print_bench_table(o, hp, threads, &res);
    } else {
        fprintf(stderr, "cairn bench: failed: %s\n", cairn_strerror(rc));
    }
    bench_buffers_free(&b);
    cli_runtime_close(&rt);
    return rc == CAIRN_OK ? 0 : 1;
}

int cmd_bench(int argc, char **argv)
{
    bench_opts o;
    int status = parse_bench_opts(&o, argc, argv);
    if (status == CLI_PROCEED)
        status = prepare_bench(&o);
    return status != CLI_PROCEED ? status : run_bench(&o);
}
