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
#include "cli/cli_eagle.h"

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
    "  with --draft: greedy generation of -n tokens from --text, timed with and without\n"
    "  speculation, and tau (tokens per target forward)\n"
    "      --text TEXT          prompt for the --draft comparison (default \"Once upon a time\")\n"
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

/* The same with EAGLE speculation; *tau = tokens per target forward. */
static int run_text_eagle(cli_spec *spec, const int32_t *prompt, int n_prompt, int n,
                          double *rate, double *tau)
{
    double t0 = cairn_now();
    int rc = cairn_eagle_seq_begin(spec->seq, cairn_page_pool_base(spec->pool), &spec->kv,
                                   spec->pages, spec->capacity, prompt, n_prompt);
    int32_t step[32];
    for (int done = 0; rc == CAIRN_OK && done < n;) {
        int got = 0;
        rc = cairn_eagle_seq_step(spec->seq, step, 32, &got);
        done += got;
    }
    *rate = n / (cairn_now() - t0);
    cairn_eagle_stats st;
    cairn_eagle_seq_stats(spec->seq, &st);
    *tau = st.steps ? (double)st.tokens / (double)st.steps : 0;
    return rc;
}

int cmd_bench(int argc, char **argv)
{
    cli_model_opts mo;
    cli_model_opts_defaults(&mo);
    int n_prompt = 512, n_gen = 128, reps = 5;
    bool json = false, batch_given = false;
    static const struct option longopts[] = {
        CLI_MODEL_LONGOPTS,
        {"n-prompt", required_argument, 0, 'p'},
        {"n-gen", required_argument, 0, 'n'},
        {"repetitions", required_argument, 0, 'r'},
        {"json", no_argument, 0, 4000},
        {"text", required_argument, 0, 4001},
        {"help", no_argument, 0, 'h'},
        CLI_DRAFT_LONGOPTS,
        {0, 0, 0, 0},
    };
    cli_draft_opts draft;
    cli_draft_opts_defaults(&draft);
    const char *text = "Once upon a time";
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, CLI_MODEL_SHORTOPTS "p:n:r:h", longopts, NULL)) != -1) {
        int r = cli_model_opts_parse(&mo, opt, optarg);
        if (r == 0)
            r = cli_draft_opts_parse(&draft, opt, optarg);
        if (r < 0)
            return 2;
        if (r > 0) {
            batch_given |= opt == 'b';
            continue;
        }
        char *end = NULL;
        long v = 0;
        switch (opt) {
        case 'p':
        case 'n':
        case 'r':
            v = strtol(optarg, &end, 10);
            if (!*optarg || *end || v < (opt == 'r' ? 1 : 0) || v > (1 << 20)) {
                fprintf(stderr, "cairn bench: -%c needs a %s integer, got '%s'\n", opt,
                        opt == 'r' ? "positive" : "non-negative", optarg);
                return 2;
            }
            if (opt == 'p')
                n_prompt = (int)v;
            else if (opt == 'n')
                n_gen = (int)v;
            else
                reps = (int)v;
            break;
        case 4000: json = true; break;
        case 4001: text = optarg; break;
        case 'h': fputs(help, stdout); return 0;
        default: fputs(help, stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "cairn bench: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (n_prompt == 0 && n_gen == 0) {
        fprintf(stderr, "cairn bench: nothing to do (-p 0 and -n 0)\n");
        return 2;
    }
    /* Like llama-bench's default micro-batch: a 512-token prompt is one call. */
    if (!batch_given)
        mo.batch = n_prompt > 0 && n_prompt < 512 ? n_prompt : 512;
    int need_ctx = n_prompt > n_gen ? n_prompt : n_gen;
    if (draft.head_path) /* the text prompt, then n_gen tokens and a draft tree */
        need_ctx = need_ctx > n_gen + 512 ? need_ctx : n_gen + 512;
    if (draft.head_path && mo.batch < draft.params.n_draft + 1)
        mo.batch = draft.params.n_draft + 1;
    if (mo.n_ctx < need_ctx)
        mo.n_ctx = need_ctx;
    if (json)
        cairn_log_set_level(CAIRN_LOG_WARN);

    cli_runtime rt;
    if (cli_runtime_open(&rt, &mo) != CAIRN_OK)
        return 1;
    const cairn_hparams *hp = cairn_model_hparams(rt.model);
    int n_tok = n_prompt > n_gen ? n_prompt : n_gen;
    int32_t *tokens = malloc((size_t)n_tok * sizeof *tokens);
    float *logits = malloc((size_t)hp->n_vocab * sizeof *logits);
    double *rates = malloc((size_t)reps * sizeof *rates);
    int rc = tokens && logits && rates ? CAIRN_OK : CAIRN_ENOMEM;
    uint64_t state = 0x9e3779b97f4a7c15ull;
    for (int i = 0; rc == CAIRN_OK && i < n_tok; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        tokens[i] = (int32_t)((state >> 33) % (uint64_t)hp->n_vocab);
    }

    rate_stats pp = {0, 0}, tg = {0, 0};
    double warm;
    if (rc == CAIRN_OK && n_prompt > 0) {
        rc = run_pp(&rt, tokens, n_prompt, logits, &warm);
        for (int r = 0; rc == CAIRN_OK && r < reps; r++)
            rc = run_pp(&rt, tokens, n_prompt, logits, &rates[r]);
        if (rc == CAIRN_OK)
            pp = stats_of(rates, reps);
    }
    if (rc == CAIRN_OK && n_gen > 0) {
        rc = run_tg(&rt, tokens, n_gen < 16 ? n_gen : 16, logits, &warm);
        for (int r = 0; rc == CAIRN_OK && r < reps; r++)
            rc = run_tg(&rt, tokens, n_gen, logits, &rates[r]);
        if (rc == CAIRN_OK)
            tg = stats_of(rates, reps);
    }

    /* --draft: the same greedy text with and without speculation */
    rate_stats text_plain = {0, 0}, text_eagle = {0, 0};
    double tau = 0;
    if (rc == CAIRN_OK && draft.head_path && n_gen > 0) {
        cairn_sampling_params greedy = cairn_sampling_defaults();
        greedy.temperature = 0;
        cli_spec spec;
        int32_t *ids = NULL;
        size_t n_ids = 0;
        const cairn_vocab *vocab = rt.vocab;
        rc = cli_tokenize_alloc(vocab, text, strlen(text),
                                cairn_vocab_add_bos(vocab) ? CAIRN_TOK_ADD_BOS : 0, &ids, &n_ids);
        if (rc == CAIRN_OK && n_ids == 0)
            rc = CAIRN_EINVAL;
        if (rc == CAIRN_OK && (rc = cli_spec_open(&spec, &rt, &draft, &greedy)) == CAIRN_OK) {
            double warm_tau;
            rc = run_text_plain(&rt, ids, (int)n_ids, n_gen < 16 ? n_gen : 16, logits, &warm);
            for (int r = 0; rc == CAIRN_OK && r < reps; r++)
                rc = run_text_plain(&rt, ids, (int)n_ids, n_gen, logits, &rates[r]);
            if (rc == CAIRN_OK)
                text_plain = stats_of(rates, reps);
            if (rc == CAIRN_OK)
                rc = run_text_eagle(&spec, ids, (int)n_ids, n_gen < 16 ? n_gen : 16, &warm, &warm_tau);
            for (int r = 0; rc == CAIRN_OK && r < reps; r++)
                rc = run_text_eagle(&spec, ids, (int)n_ids, n_gen, &rates[r], &tau);
            if (rc == CAIRN_OK)
                text_eagle = stats_of(rates, reps);
            cli_spec_close(&spec);
        }
        free(ids);
    }

    if (rc == CAIRN_OK) {
        struct stat st;
        long long model_bytes = stat(mo.model_path, &st) == 0 ? (long long)st.st_size : -1;
        int threads = cairn_backend_cpu_threads(rt.be);
        if (json) {
            printf("{\"pp\": %.3f, \"tg\": %.3f, \"pp_sd\": %.3f, \"tg_sd\": %.3f, "
                   "\"n_prompt\": %d, \"n_gen\": %d, \"reps\": %d, \"threads\": %d, "
                   "\"model\": \"%s\", \"model_bytes\": %lld, \"n_params_dim\": %d, "
                   "\"n_layer\": %d, \"n_vocab\": %d",
                   pp.mean, tg.mean, pp.sd, tg.sd, n_prompt, n_gen, reps, threads, hp->name,
                   model_bytes, hp->dim, hp->n_layer, hp->n_vocab);
            if (draft.head_path)
                printf(", \"text_plain\": %.3f, \"text_plain_sd\": %.3f, \"text_eagle\": %.3f, "
                       "\"text_eagle_sd\": %.3f, \"tau\": %.3f, \"draft_depth\": %d, "
                       "\"draft_topk\": %d, \"draft_n\": %d",
                       text_plain.mean, text_plain.sd, text_eagle.mean, text_eagle.sd, tau,
                       draft.params.depth, draft.params.top_k, draft.params.n_draft);
            printf("}\n");
        } else {
            printf("| %-28s | %7s | %8s | %16s |\n", "model", "threads", "test", "t/s");
            printf("| %.28s | ------: | -------: | ---------------: |\n",
                   "----------------------------");
            if (n_prompt > 0)
                printf("| %-28.28s | %7d | %5s%-3d | %8.2f ± %5.2f |\n", hp->name, threads, "pp",
                       n_prompt, pp.mean, pp.sd);
            if (n_gen > 0)
                printf("| %-28.28s | %7d | %5s%-3d | %8.2f ± %5.2f |\n", hp->name, threads, "tg",
                       n_gen, tg.mean, tg.sd);
            if (draft.head_path && n_gen > 0) {
                printf("| %-28.28s | %7d | %5s%-3d | %8.2f ± %5.2f |  greedy text, plain\n",
                       hp->name, threads, "text", n_gen, text_plain.mean, text_plain.sd);
                printf("| %-28.28s | %7d | %5s%-3d | %8.2f ± %5.2f |  EAGLE d%d k%d n%d: "
                       "tau %.2f\n", hp->name, threads, "text", n_gen, text_eagle.mean,
                       text_eagle.sd, draft.params.depth, draft.params.top_k,
                       draft.params.n_draft, tau);
            }
        }
    } else {
        fprintf(stderr, "cairn bench: failed: %s\n", cairn_strerror(rc));
    }
    free(tokens);
    free(logits);
    free(rates);
    cli_runtime_close(&rt);
    return rc == CAIRN_OK ? 0 : 1;
}
