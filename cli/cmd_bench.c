/*
 * cli/cmd_bench.c — `cairn bench`: prompt-processing and generation speed,
 * measured the way llama-bench measures them so the numbers compare:
 *
 *   - depth D (-d, default 0): D tokens of context already in the KV cache
 *     before each measured test, like llama-bench's -d. They are written
 *     once, untimed, at KV indices 0..D-1; every test then writes its own
 *     tokens after them, so the prefix stays and only the measured part is
 *     overwritten from one repetition to the next.
 *   - pp: one forward call over P random tokens at KV indices D..D+P-1 (or
 *     batch-sized chunks when P exceeds the batch); tokens/s = P / seconds.
 *   - tg: N forward calls of one token each at indices D..D+N-1, the output
 *     logits of every step computed and copied to the host;
 *     tokens/s = N / seconds.
 *   - one untimed warm-up of each (touches every weight page and starts the
 *     worker threads), then R timed repetitions; the mean and standard
 *     deviation of the per-repetition rates are reported.
 *
 * Decode is bound by memory reads, so tg is also reported against the
 * machine's limit: the bytes one decode step reads (the weights a token's
 * forward pass touches, cairn_model_token_weight_bytes, plus the K and V
 * rows attention reads at the mean context of the tg run) times tg tokens/s
 * is the bandwidth achieved, divided by the read bandwidth measured in the
 * same run with the same number of threads (measure_read_bandwidth).
 *
 * Tokens are drawn from a fixed-seed generator over the model's vocabulary;
 * a forward pass costs the same whatever the ids are.
 */
#include "cli/cli.h"
#include "cli/cli_spec.h"

#include <dirent.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char help[] =
    "usage: cairn bench -m MODEL [options]\n\n"
    "Prompt processing (pp) and generation (tg) speed in tokens/s, like llama-bench.\n\n"
    "  -p, --n-prompt N         prompt tokens per pp run (default 512; 0 = skip pp)\n"
    "  -n, --n-gen N            generated tokens per tg run (default 128; 0 = skip tg)\n"
    "  -r, --repetitions N      timed runs of each test (default 5)\n"
    "  -d, --depth N            tokens of context in the KV cache before each test, like\n"
    "                           llama-bench's -d (default 0); filled once, untimed (pp and\n"
    "                           tg only, not the --spec comparison)\n"
    "      --rows LIST          the cost of one forward of T rows (each with its logits, as\n"
    "                           speculative verification and batched decode compute them)\n"
    "                           for each T of a comma-separated list (1..64), in one-row\n"
    "                           steps: its time over the time of a forward of one row\n"
    "      --no-bandwidth       skip measuring the read bandwidth (about a second)\n"
    "      --json               print one JSON line instead of a table\n"
    "  tg is also given as bytes read per token (weights + KV at the tg run's mean context),\n"
    "  the GB/s that makes, and its fraction of the measured read bandwidth\n"
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

/* One pp run: P tokens at KV indices kv_start.. in one forward call (or
 * batch-sized chunks when P exceeds the batch). *rate = tokens/s. */
static int run_pp(cli_runtime *rt, const int32_t *tokens, int P, int kv_start, float *logits,
                  double *rate)
{
    double t0 = cairn_now();
    int rc = cli_eval(rt, tokens, P, kv_start, false, logits);
    double dt = cairn_now() - t0;
    if (rc != CAIRN_OK)
        return rc;
    *rate = P / dt;
    return CAIRN_OK;
}

/* One tg run: N single-token forward calls at KV indices kv_start.. */
static int run_tg(cli_runtime *rt, const int32_t *tokens, int N, int kv_start, float *logits,
                  double *rate)
{
    double t0 = cairn_now();
    for (int i = 0; i < N; i++) {
        int rc = cli_eval(rt, tokens + i, 1, kv_start + i, false, logits);
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
    int rc = cairn_spec_seq_begin(spec->seq, cairn_kvcache_kv_base(spec->cache), &spec->kv,
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

/* ---- read bandwidth ------------------------------------------------------- */

/* Read bandwidth, not copy bandwidth, is the limit decode runs against: a
 * decode step streams every weight (and the KV) in and writes almost
 * nothing, so a copy's write traffic (and its read-for-ownership) would
 * measure a different machine. Each thread sums its own slice of a buffer
 * far larger than the last-level cache, as the benchmark's threads each
 * stream their share of the weights; the best of a few passes is the
 * machine's figure (the others carry noise from other users). */
typedef struct {
    const uint64_t *words;
    size_t n_words;
    uint64_t sum; /* kept so the reads cannot be optimised away */
    bool fill;    /* first pass: write the slice (the pages must exist) */
} bw_slice;

static void *bw_slice_run(void *arg)
{
    bw_slice *s = arg;
    if (s->fill) {
        memset((void *)s->words, 1, s->n_words * sizeof *s->words);
        return NULL;
    }
    /* four independent 64-byte sums (one vector register each where the
     * machine has them): no single add chain limits the loads */
    typedef uint64_t line __attribute__((vector_size(64)));
    const line *p = (const line *)s->words;
    line a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    for (size_t i = 0; i + 4 <= s->n_words / 8; i += 4) {
        a0 += p[i];
        a1 += p[i + 1];
        a2 += p[i + 2];
        a3 += p[i + 3];
    }
    line a = a0 + a1 + a2 + a3;
    s->sum = 0;
    for (int j = 0; j < 8; j++)
        s->sum += a[j];
    return NULL;
}

/* One pass of every slice on its own thread: seconds, or < 0 when a thread
 * could not be started. */
static double bw_pass(bw_slice *slices, int threads, bool fill)
{
    pthread_t tid[256];
    int started = 0;
    double t0 = cairn_now();
    for (; started < threads; started++) {
        slices[started].fill = fill;
        if (pthread_create(&tid[started], NULL, bw_slice_run, &slices[started]) != 0)
            break;
    }
    for (int i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
    return started == threads ? cairn_now() - t0 : -1.0;
}

#define BW_PASSES 5

/* Streaming read bandwidth of `threads` threads in bytes/s over a buffer of
 * max(1 GiB, 4 x the last-level cache); *buffer_bytes says how big. */
static int measure_read_bandwidth(int threads, double *bytes_per_s, size_t *buffer_bytes)
{
    size_t bytes = (size_t)1 << 30;
#ifdef _SC_LEVEL3_CACHE_SIZE
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (llc > 0 && (size_t)llc * 4 > bytes)
        bytes = (size_t)llc * 4;
#endif
    if (threads < 1 || threads > 256)
        return CAIRN_EINVAL;
    /* each slice a whole number of 4-line blocks, 64-byte aligned */
    const size_t per = bytes / sizeof(uint64_t) / (size_t)threads / 32 * 32;
    bytes = per * sizeof(uint64_t) * (size_t)threads;
    uint64_t *buf = aligned_alloc(64, bytes);
    bw_slice *slices = calloc((size_t)threads, sizeof *slices);
    int rc = buf && slices ? CAIRN_OK : CAIRN_ENOMEM;
    double best = 0;
    for (int t = 0; rc == CAIRN_OK && t < threads; t++)
        slices[t] = (bw_slice){buf + (size_t)t * per, per, 0, false};
    if (rc == CAIRN_OK && bw_pass(slices, threads, true) < 0)
        rc = CAIRN_ENOMEM;
    for (int p = 0; rc == CAIRN_OK && p < BW_PASSES; p++) {
        double dt = bw_pass(slices, threads, false);
        if (dt <= 0) {
            rc = CAIRN_ENOMEM;
            break;
        }
        if (bytes / dt > best)
            best = bytes / dt;
    }
    uint64_t check = 0;
    for (int t = 0; rc == CAIRN_OK && t < threads; t++)
        check += slices[t].sum;
    /* every byte is 1, so the sums are known: a wrong one is a broken probe */
    if (rc == CAIRN_OK && check != (bytes / 8) * 0x0101010101010101ull)
        rc = CAIRN_EINVAL;
    free(buf);
    free(slices);
    *bytes_per_s = best;
    *buffer_bytes = bytes;
    return rc;
}

/* ---- options -------------------------------------------------------------- */

enum { OPT_JSON = 4000, OPT_TEXT, OPT_NO_BANDWIDTH, OPT_ROWS };

/* Most entries of --rows, and the largest. */
#define ROWS_MAX 16
#define ROWS_LIMIT 64

typedef struct {
    cli_model_opts model;
    cli_draft_opts draft;
    int n_prompt, n_gen, reps;
    int depth; /* tokens of context before each pp / tg test */
    bool json, no_bandwidth;
    const char *text; /* the --draft comparison's prompt */
    int rows[ROWS_MAX + 1]; /* --rows, with 1 added first when not given */
    int n_rows;
} bench_opts;

/* --rows "1,2,4,8": 1 with o->rows set (1 first, once), -1 after saying
 * what is wrong. */
static int parse_rows_opt(bench_opts *o, const char *arg)
{
    o->n_rows = 0;
    o->rows[o->n_rows++] = 1;
    for (const char *p = arg; *p;) {
        char *end;
        const long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > ROWS_LIMIT || (*end && *end != ',')) {
            fprintf(stderr, "cairn bench: --rows wants counts from 1 to %d separated by commas, "
                            "not '%s'\n", ROWS_LIMIT, arg);
            return -1;
        }
        if (v != 1) {
            if (o->n_rows > ROWS_MAX) {
                fprintf(stderr, "cairn bench: --rows takes at most %d counts\n", ROWS_MAX);
                return -1;
            }
            o->rows[o->n_rows++] = (int)v;
        }
        p = *end ? end + 1 : end;
    }
    return 1;
}

/* -p, -n, -r and -d: 1 with the count set, -1 after saying what it needs. */
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
    case 'd': return parse_count_opt(opt, arg, &o->depth);
    case OPT_JSON: o->json = true; return 1;
    case OPT_NO_BANDWIDTH: o->no_bandwidth = true; return 1;
    case OPT_TEXT: o->text = arg; return 1;
    case OPT_ROWS: return parse_rows_opt(o, arg);
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
        {"depth", required_argument, 0, 'd'},
        {"no-bandwidth", no_argument, 0, OPT_NO_BANDWIDTH},
        {"json", no_argument, 0, OPT_JSON},
        {"text", required_argument, 0, OPT_TEXT},
        {"rows", required_argument, 0, OPT_ROWS},
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
    while ((opt = getopt_long(argc, argv, CLI_MODEL_SHORTOPTS "p:n:r:d:h", longopts, NULL)) != -1) {
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
    if (n_prompt == 0 && n_gen == 0 && o->n_rows == 0) {
        fprintf(stderr, "cairn bench: nothing to do (-p 0 and -n 0)\n");
        return 2;
    }
    int max_rows = 0;
    for (int i = 0; i < o->n_rows; i++)
        max_rows = o->rows[i] > max_rows ? o->rows[i] : max_rows;
    /* Like llama-bench's default micro-batch: a 512-token prompt is one call. */
    if (!mo->batch_given)
        mo->batch = n_prompt > 0 && n_prompt < 512 ? n_prompt : 512;
    int need_ctx = o->depth + (n_prompt > n_gen ? n_prompt : n_gen);
    if (cli_draft_opts_active(&o->draft)) /* the text prompt, then n_gen tokens and a draft tree */
        need_ctx = need_ctx > n_gen + 512 ? need_ctx : n_gen + 512;
    if (cli_draft_opts_active(&o->draft) && mo->batch < o->draft.params.n_draft + 1)
        mo->batch = o->draft.params.n_draft + 1;
    if (need_ctx < o->depth + max_rows)
        need_ctx = o->depth + max_rows;
    if (mo->batch < max_rows)
        mo->batch = max_rows;
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
    /* what one decode step reads, in bytes: the weights a token touches and
     * the K/V rows of every layer at the tg run's mean context */
    double weight_bytes, kv_bytes, mean_ctx;
    double load_s;        /* opening the model: read, repack, upload */
    double rows_s[ROWS_MAX + 1]; /* --rows: seconds per forward of o->rows[i] rows */
    double read_bw;       /* bytes/s; 0 = not measured */
    size_t read_bw_bytes; /* the probe's buffer */
    char kernels[256];    /* the CPU backend's kernels, or "" */
} bench_results;

/* The buffers every test shares: random token ids (the depth's context,
 * then the measured tokens), one step's logits, the per-repetition rates. */
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
    int n_tok = o->depth + (o->n_prompt > o->n_gen ? o->n_prompt : o->n_gen);
    for (int i = 0; i < o->n_rows; i++)
        n_tok = o->depth + o->rows[i] > n_tok ? o->depth + o->rows[i] : n_tok;
    b->tokens = malloc((size_t)n_tok * sizeof *b->tokens);
    b->logits = malloc((size_t)n_vocab * sizeof *b->logits);
    b->rates = malloc((size_t)o->reps * sizeof *b->rates);
    if (o->n_rows > 0 && o->reps < 1)
        return CAIRN_EINVAL;
    if (!b->tokens || !b->logits || !b->rates)
        return CAIRN_ENOMEM;
    uint64_t state = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < n_tok; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        b->tokens[i] = (int32_t)((state >> 33) % (uint64_t)n_vocab);
    }
    return CAIRN_OK;
}

/* On a terminal only: which repetition is done and its rate, on one line
 * that the next overwrites (cleared after the last). */
static void bench_progress(const char *what, int done, int total, double rate)
{
    if (!isatty(STDERR_FILENO))
        return;
    fprintf(stderr, "\rbench: %s %d/%d, %.1f tok/s   ", what, done, total, rate);
    if (done == total)
        fprintf(stderr, "\r%*s\r", 48, "");
    fflush(stderr);
}

/* pp and tg after the depth's context (written once, untimed): an untimed
 * warm-up of each, then the timed repetitions. */
static int bench_pp_tg(cli_runtime *rt, const bench_opts *o, bench_buffers *b, bench_results *res)
{
    const int D = o->depth;
    const int32_t *measured = b->tokens + D;
    int rc = CAIRN_OK;
    double warm;
    if (D > 0) {
        double t0 = cairn_now();
        rc = cli_eval(rt, b->tokens, D, 0, false, b->logits);
        cairn_log(CAIRN_LOG_INFO, "bench: %d tokens of context written in %.2f s", D,
                  cairn_now() - t0);
    }
    if (rc == CAIRN_OK && o->n_prompt > 0) {
        rc = run_pp(rt, measured, o->n_prompt, D, b->logits, &warm);
        for (int r = 0; rc == CAIRN_OK && r < o->reps; r++) {
            rc = run_pp(rt, measured, o->n_prompt, D, b->logits, &b->rates[r]);
            bench_progress("pp", r + 1, o->reps, b->rates[r]);
        }
        if (rc == CAIRN_OK)
            res->pp = stats_of(b->rates, o->reps);
    }
    if (rc == CAIRN_OK && o->n_gen > 0) {
        rc = run_tg(rt, measured, o->n_gen < 16 ? o->n_gen : 16, D, b->logits, &warm);
        for (int r = 0; rc == CAIRN_OK && r < o->reps; r++) {
            rc = run_tg(rt, measured, o->n_gen, D, b->logits, &b->rates[r]);
            bench_progress("tg", r + 1, o->reps, b->rates[r]);
        }
        if (rc == CAIRN_OK)
            res->tg = stats_of(b->rates, o->reps);
    }
    return rc;
}

/* --rows: one forward of T rows with every row's logits at KV indices D..,
 * an untimed warm-up and then the mean of the repetitions, for each T. */
static int bench_rows(cli_runtime *rt, const bench_opts *o, const bench_buffers *b,
                      bench_results *res)
{
    const int n_vocab = cairn_model_hparams(rt->model)->n_vocab;
    int max_rows = 0;
    for (int i = 0; i < o->n_rows; i++)
        max_rows = o->rows[i] > max_rows ? o->rows[i] : max_rows;
    float *logits = malloc((size_t)max_rows * (size_t)n_vocab * sizeof *logits);
    int rc = logits ? CAIRN_OK : CAIRN_ENOMEM;
    if (rc == CAIRN_OK && o->depth > 0 && o->n_prompt == 0 && o->n_gen == 0)
        rc = cli_eval(rt, b->tokens, o->depth, 0, false, logits); /* the context */
    for (int i = 0; rc == CAIRN_OK && i < o->n_rows; i++) {
        const int T = o->rows[i];
        rc = cli_eval(rt, b->tokens + o->depth, T, o->depth, true, logits);
        double total = 0;
        for (int r = 0; rc == CAIRN_OK && r < o->reps; r++) {
            const double t0 = cairn_now();
            rc = cli_eval(rt, b->tokens + o->depth, T, o->depth, true, logits);
            total += cairn_now() - t0;
        }
        res->rows_s[i] = total / o->reps;
    }
    free(logits);
    return rc;
}

/* What one decode step reads. The token at KV index D+i attends to D+i+1
 * keys, so over a tg run of n tokens the mean is D + (n+1)/2; each key is a
 * K row and a V row in every layer. */
static void bench_bytes_per_token(const cli_runtime *rt, const bench_opts *o, bench_results *res)
{
    const cairn_hparams *hp = cairn_model_hparams(rt->model);
    res->weight_bytes = (double)cairn_model_token_weight_bytes(rt->model);
    res->mean_ctx = o->depth + (o->n_gen > 0 ? (o->n_gen + 1) / 2.0 : 1.0);
    res->kv_bytes = (double)hp->n_layer * 2.0 * (double)rt->kv.row_bytes * res->mean_ctx;
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

/* A JSON number, or null for a figure that was not measured. */
static void print_json_number(const char *key, double v, bool known)
{
    if (known)
        printf(", \"%s\": %.6g", key, v);
    else
        printf(", \"%s\": null", key);
}

static void print_bench_json(const bench_opts *o, const cairn_hparams *hp, int threads,
                             long long model_bytes, const bench_results *res)
{
    const cairn_spec_params *dp = &o->draft.params;
    printf("{\"pp\": %.3f, \"tg\": %.3f, \"pp_sd\": %.3f, \"tg_sd\": %.3f, "
           "\"n_prompt\": %d, \"n_gen\": %d, \"depth\": %d, \"reps\": %d, \"threads\": %d, "
           "\"model\": \"%s\", \"model_bytes\": %lld, \"n_params_dim\": %d, "
           "\"n_layer\": %d, \"n_vocab\": %d, \"load_s\": %.3f, \"kernels\": \"%s\"",
           res->pp.mean, res->tg.mean, res->pp.sd, res->tg.sd, o->n_prompt, o->n_gen, o->depth,
           o->reps, threads, hp->name, model_bytes, hp->dim, hp->n_layer, hp->n_vocab,
           res->load_s, res->kernels);
    const double bpt = res->weight_bytes + res->kv_bytes;
    const double achieved = bpt * res->tg.mean;
    printf(", \"bytes_per_token\": %.0f, \"weight_bytes_per_token\": %.0f, "
           "\"kv_bytes_per_token\": %.0f, \"kv_mean_ctx\": %.1f",
           bpt, res->weight_bytes, res->kv_bytes, res->mean_ctx);
    print_json_number("tg_gbps", achieved / 1e9, o->n_gen > 0);
    print_json_number("read_bw_gbps", res->read_bw / 1e9, res->read_bw > 0);
    print_json_number("read_bw_buffer_bytes", (double)res->read_bw_bytes, res->read_bw > 0);
    print_json_number("bw_fraction", achieved / res->read_bw, res->read_bw > 0 && o->n_gen > 0);
    if (o->n_rows > 0) {
        printf(", \"rows\": [");
        for (int i = 0; i < o->n_rows; i++)
            printf("%s{\"rows\": %d, \"ms\": %.4f, \"steps\": %.4f}", i ? ", " : "",
                   o->rows[i], res->rows_s[i] * 1e3, res->rows_s[i] / res->rows_s[0]);
        printf("]");
    }
    if (cli_draft_opts_active(&o->draft))
        printf(", \"text_plain\": %.3f, \"text_plain_sd\": %.3f, \"text_eagle\": %.3f, "
               "\"text_eagle_sd\": %.3f, \"tau\": %.3f, \"draft_depth\": %d, "
               "\"draft_topk\": %d, \"draft_n\": %d, \"spec\": \"%s\"",
               res->text_plain.mean, res->text_plain.sd, res->text_eagle.mean,
               res->text_eagle.sd, res->tau, dp->depth, dp->top_k, dp->n_draft,
               res->method ? res->method : "");
    printf("}\n");
}

/* llama-bench's test name: "pp512", "tg128 @ d4096". */
static void test_name(char *out, size_t cap, const char *kind, int n, int depth)
{
    if (depth > 0)
        snprintf(out, cap, "%s%d @ d%d", kind, n, depth);
    else
        snprintf(out, cap, "%s%d", kind, n);
}

/* The llama-bench table, with tg's bytes per token, the GB/s they make and
 * that figure's fraction of the measured read bandwidth. */
static void print_bench_table(const bench_opts *o, const cairn_hparams *hp, int threads,
                              const bench_results *res)
{
    const cairn_spec_params *dp = &o->draft.params;
    const double bpt = res->weight_bytes + res->kv_bytes;
    char name[48];
    printf("| %-28s | %7s | %16s | %16s | %8s | %7s | %7s |\n", "model", "threads", "test", "t/s",
           "MB/token", "GB/s", "of bw");
    printf("| %.28s | ------: | ---------------: | ---------------: | -------: | ------: | "
           "------: |\n", "----------------------------");
    if (o->n_prompt > 0) {
        test_name(name, sizeof name, "pp", o->n_prompt, o->depth);
        printf("| %-28.28s | %7d | %16s | %8.2f ± %5.2f | %8s | %7s | %7s |\n", hp->name, threads,
               name, res->pp.mean, res->pp.sd, "", "", "");
    }
    if (o->n_gen > 0) {
        char frac[16] = "-";
        if (res->read_bw > 0)
            snprintf(frac, sizeof frac, "%.1f%%", 100.0 * bpt * res->tg.mean / res->read_bw);
        test_name(name, sizeof name, "tg", o->n_gen, o->depth);
        printf("| %-28.28s | %7d | %16s | %8.2f ± %5.2f | %8.2f | %7.2f | %7s |\n", hp->name,
               threads, name, res->tg.mean, res->tg.sd, bpt / 1e6, bpt * res->tg.mean / 1e9,
               frac);
    }
    if (cli_draft_opts_active(&o->draft) && o->n_gen > 0) {
        test_name(name, sizeof name, "text", o->n_gen, 0);
        printf("| %-28.28s | %7d | %16s | %8.2f ± %5.2f |  greedy text, plain\n", hp->name,
               threads, name, res->text_plain.mean, res->text_plain.sd);
        printf("| %-28.28s | %7d | %16s | %8.2f ± %5.2f |  %s d%d k%d n%d: "
               "tau %.2f\n", hp->name, threads, name, res->text_eagle.mean,
               res->text_eagle.sd, res->method, dp->depth, dp->top_k, dp->n_draft, res->tau);
    }
    if (o->n_rows > 0) {
        printf("\n| rows | ms / forward | one-row steps | rows/s |\n"
               "| ---: | -----------: | ------------: | -----: |\n");
        for (int i = 0; i < o->n_rows; i++)
            printf("| %4d | %12.2f | %13.2f | %6.1f |\n", o->rows[i], res->rows_s[i] * 1e3,
                   res->rows_s[i] / res->rows_s[0], o->rows[i] / res->rows_s[i]);
        printf("(each forward at depth %d computes every row's logits)\n", o->depth);
    }
    printf("\nbytes/token: weights %.2f MB + KV %.2f MB (mean context %.1f)\n",
           res->weight_bytes / 1e6, res->kv_bytes / 1e6, res->mean_ctx);
    if (res->read_bw > 0)
        printf("read bandwidth: %.2f GB/s (%d threads, streaming read of %.2f GiB, best of %d)\n",
               res->read_bw / 1e9, threads, res->read_bw_bytes / 1073741824.0, BW_PASSES);
    else
        printf("read bandwidth: not measured%s\n", o->no_bandwidth ? " (--no-bandwidth)" : "");
    printf("load: %.2f s (open, repack, upload)\n", res->load_s);
    if (res->kernels[0])
        printf("kernels: %s\n", res->kernels);
}

/* The bytes of the model on disk: the GGUF file, or a checkpoint folder's
 * .safetensors files; -1 when unknown. */
static long long model_file_bytes(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return -1;
    if (!S_ISDIR(st.st_mode))
        return (long long)st.st_size;
    DIR *d = opendir(path);
    long long total = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        const size_t len = strlen(e->d_name);
        char file[4096];
        if (len > 12 && strcmp(e->d_name + len - 12, ".safetensors") == 0 &&
            snprintf(file, sizeof file, "%s/%s", path, e->d_name) < (int)sizeof file &&
            stat(file, &st) == 0)
            total += (long long)st.st_size;
    }
    if (d)
        closedir(d);
    return d ? total : -1;
}

/* Load the model, run the tests, print the results: the exit status. */
static int run_bench(const bench_opts *o)
{
    cli_runtime rt;
    const cairn_runtime_config cfg = cli_spec_runtime_config(&o->model, &o->draft);
    const double t_load = cairn_now();
    if (cli_runtime_open(&rt, &o->model, &cfg) != CAIRN_OK)
        return 1;
    const double load_s = cairn_now() - t_load;
    const cairn_hparams *hp = cairn_model_hparams(rt.model);
    const int need = o->depth + (o->n_prompt > o->n_gen ? o->n_prompt : o->n_gen);
    if (need > hp->n_ctx_train) {
        /* Positions past the trained context would still compute, but what
         * they measure is not a context the model can use. */
        fprintf(stderr,
                "cairn bench: -d %d with %d measured tokens needs %d positions, more than the "
                "model's trained context of %d\n", o->depth, need - o->depth, need,
                hp->n_ctx_train);
        cli_runtime_close(&rt);
        return 1;
    }
    bench_buffers b = {0};
    bench_results res = {.load_s = load_s};
    const int threads = cairn_backend_cpu_threads(rt.be);
    if (cairn_backend_cpu_describe(rt.be, res.kernels, sizeof res.kernels) != CAIRN_OK)
        res.kernels[0] = 0;
    int rc = bench_buffers_alloc(&b, &rt, o);
    if (rc == CAIRN_OK)
        rc = bench_pp_tg(&rt, o, &b, &res);
    if (rc == CAIRN_OK && o->n_rows > 0)
        rc = bench_rows(&rt, o, &b, &res);
    if (rc == CAIRN_OK && cli_draft_opts_active(&o->draft) && o->n_gen > 0)
        rc = bench_draft_text(&rt, o, &b, &res);
    bench_bytes_per_token(&rt, o, &res);
    /* the probe reads host memory with the CPU backend's threads; a GPU's
     * bandwidth is not something it can measure */
    if (rc == CAIRN_OK && !o->no_bandwidth && threads > 0) {
        int brc = measure_read_bandwidth(threads, &res.read_bw, &res.read_bw_bytes);
        if (brc != CAIRN_OK) {
            res.read_bw = 0;
            fprintf(stderr, "cairn bench: read bandwidth not measured: %s\n",
                    cairn_strerror(brc));
        }
    }
    if (rc == CAIRN_OK) {
        const long long model_bytes = model_file_bytes(o->model.model_path);
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
