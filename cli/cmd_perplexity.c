/*
 * cli/cmd_perplexity.c — `cairn perplexity`, computed the way llama.cpp's
 * llama-perplexity does so the figures are comparable:
 *
 *   - the whole file is tokenized once, with BOS if the model asks for it;
 *   - it is cut into floor(n_tokens / CTX) non-overlapping chunks of CTX
 *     tokens (at least two chunks' worth of text is required);
 *   - each chunk is evaluated from an empty context, its first token replaced
 *     by BOS (when the model uses one);
 *   - only the second half is scored: for positions j = CTX/2 .. CTX-2 the
 *     negative log-likelihood of token j+1 under the logits at j;
 *   - PPL = exp(mean NLL) over all scored tokens, printed cumulatively per
 *     chunk to stderr and finally as the last line of stdout: `PPL = <value>`.
 *
 * With --kl-ref TYPE the same chunks also run on a second runtime whose KV
 * cache is of TYPE (f16, say), and every position of every chunk compares
 * the two distributions: the mean KL divergence KL(ref || this) and how
 * often both put the same token first. That isolates what a KV type costs
 * from what the weights cost, position by position, as llama-perplexity's
 * --kl-divergence does against saved logits. --kl-model MODEL does the same
 * against another build of the same model (the BF16 checkpoint an AWQ,
 * GPTQ or FP8 folder was made from, say): same vocabulary, other weights.
 */
#include "cli/cli.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char help[] =
    "usage: cairn perplexity -m MODEL -f FILE -c CTX [options]\n\n"
    "Perplexity over non-overlapping chunks of CTX tokens, scoring the second half\n"
    "of each chunk (the llama-perplexity method). Last line of stdout: PPL = <value>.\n\n"
    "  -f, --file FILE          text to score\n"
    "      --chunks N           score at most N chunks (default: all)\n"
    "      --kl-ref TYPE        also run with KV type TYPE and print the KL divergence\n"
    "                           and top-1 agreement against it over every position\n"
    "      --kl-model MODEL     the same against another build of the model (same\n"
    "                           vocabulary; with --kl-ref, that model with that KV type)\n"
    CLI_MODEL_HELP
    "  -h, --help               this help\n";

/* KL(p || q) of the softmaxes of two logit rows, in double, and whether
 * their first choices agree (ties to the lower id). */
static double row_kl(const float *p_logits, const float *q_logits, int n_vocab, int *same_top)
{
    int pa = 0, qa = 0;
    for (int i = 1; i < n_vocab; i++) {
        pa = p_logits[i] > p_logits[pa] ? i : pa;
        qa = q_logits[i] > q_logits[qa] ? i : qa;
    }
    *same_top = pa == qa;
    double ps = 0, qs = 0;
    for (int i = 0; i < n_vocab; i++) {
        ps += exp((double)(p_logits[i] - p_logits[pa]));
        qs += exp((double)(q_logits[i] - q_logits[qa]));
    }
    const double lps = log(ps), lqs = log(qs);
    double kl = 0;
    for (int i = 0; i < n_vocab; i++) {
        const double lp = (double)(p_logits[i] - p_logits[pa]) - lps;
        const double lq = (double)(q_logits[i] - q_logits[qa]) - lqs;
        kl += exp(lp) * (lp - lq);
    }
    return kl > 0 ? kl : 0;
}

/* -log softmax(logits)[target], in double like the reference tool. */
static double token_nll(const float *logits, int n_vocab, int target)
{
    float max = logits[0];
    for (int i = 1; i < n_vocab; i++)
        max = logits[i] > max ? logits[i] : max;
    double sum = 0;
    for (int i = 0; i < n_vocab; i++)
        sum += exp((double)(logits[i] - max));
    return -((double)(logits[target] - max) - log(sum));
}

int cmd_perplexity(int argc, char **argv)
{
    cli_model_opts mo;
    cli_model_opts_defaults(&mo);
    const char *path = NULL;
    int max_chunks = -1;
    bool kl = false;
    cairn_type kl_type = CAIRN_TYPE_F16;
    bool kl_type_given = false;
    const char *kl_model = NULL;
    static const struct option longopts[] = {
        CLI_MODEL_LONGOPTS,
        {"file", required_argument, 0, 'f'},
        {"chunks", required_argument, 0, 3000},
        {"kl-ref", required_argument, 0, 3001},
        {"kl-model", required_argument, 0, 3002},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, CLI_MODEL_SHORTOPTS "f:h", longopts, NULL)) != -1) {
        int r = cli_model_opts_parse(&mo, opt, optarg);
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        switch (opt) {
        case 'f': path = optarg; break;
        case 3000: max_chunks = atoi(optarg); break;
        case 3001:
            if (cairn_kv_type_parse(optarg, &kl_type) != CAIRN_OK) {
                fprintf(stderr, "cairn perplexity: --kl-ref must be a KV type (f16, bf16, f32, "
                                "q8_0, q4_0), got '%s'\n", optarg);
                return 2;
            }
            kl = kl_type_given = true;
            break;
        case 3002:
            kl_model = optarg;
            kl = true;
            break;
        default: return cli_help_or_usage(opt, help);
        }
    }
    if (!path || mo.n_ctx < 4) {
        fprintf(stderr, "cairn perplexity: -f FILE and -c CTX (>= 4) are required\n");
        return 2;
    }
    const int n_ctx = mo.n_ctx;
    if (mo.batch < n_ctx)
        mo.batch = n_ctx; /* one forward call per chunk */

    size_t len = 0;
    char *text = cli_read_file(path, &len);
    if (!text) {
        fprintf(stderr, "cairn perplexity: cannot read '%s'\n", path);
        return 1;
    }
    cli_runtime rt, ref;
    if (cli_runtime_open(&rt, &mo, NULL) != CAIRN_OK) {
        free(text);
        return 1;
    }
    cli_model_opts ref_mo = mo;
    ref_mo.kv_type = kl_type_given ? kl_type : mo.kv_type;
    if (kl_model)
        ref_mo.model_path = kl_model;
    if (kl && cli_runtime_open(&ref, &ref_mo, NULL) != CAIRN_OK) {
        cli_runtime_close(&rt);
        free(text);
        return 1;
    }
    const cairn_vocab *vocab = rt.vocab;
    const int n_vocab = cairn_model_hparams(rt.model)->n_vocab;
    if (kl && cairn_model_hparams(ref.model)->n_vocab != n_vocab) {
        fprintf(stderr, "cairn perplexity: --kl-model has %d logits per position, this model %d: "
                "not the same vocabulary\n", cairn_model_hparams(ref.model)->n_vocab, n_vocab);
        cli_runtime_close(&ref);
        cli_runtime_close(&rt);
        free(text);
        return 1;
    }
    const bool add_bos = cairn_vocab_add_bos(vocab);
    int32_t *tokens = NULL;
    size_t n_tokens = 0;
    float *logits = NULL, *ref_logits = NULL;
    int rc = cli_tokenize_alloc(vocab, text, len, add_bos ? CAIRN_TOK_ADD_BOS : 0, &tokens,
                                &n_tokens);
    if (rc != CAIRN_OK)
        goto done;
    if (n_tokens < 2 * (size_t)n_ctx) {
        fprintf(stderr, "cairn perplexity: need at least %d tokens for a context of %d; '%s' "
                "has %zu\n", 2 * n_ctx, n_ctx, path, n_tokens);
        rc = CAIRN_ERANGE;
        goto done;
    }
    int n_chunk = (int)(n_tokens / (size_t)n_ctx);
    if (max_chunks > 0 && max_chunks < n_chunk)
        n_chunk = max_chunks;
    const int first = n_ctx / 2;
    logits = malloc((size_t)n_ctx * n_vocab * sizeof(float));
    if (kl)
        ref_logits = malloc((size_t)n_ctx * n_vocab * sizeof(float));
    if (!logits || (kl && !ref_logits)) {
        rc = CAIRN_ENOMEM;
        goto done;
    }
    cairn_log(CAIRN_LOG_INFO, "perplexity: %zu tokens, %d chunks of %d, scoring the last %d of "
              "each", n_tokens, n_chunk, n_ctx, n_ctx - first - 1);

    double nll = 0, nll2 = 0, ref_nll = 0, kl_sum = 0;
    long count = 0, kl_rows = 0, kl_same = 0;
    double t0 = cairn_now();
    const bool tty = isatty(STDERR_FILENO);
    for (int c = 0; c < n_chunk; c++) {
        int32_t *chunk = tokens + (size_t)c * n_ctx;
        int32_t saved = chunk[0];
        if (add_bos)
            chunk[0] = cairn_vocab_bos(vocab);
        rc = cli_eval(&rt, chunk, n_ctx, 0, true, logits);
        if (rc == CAIRN_OK && kl)
            rc = cli_eval(&ref, chunk, n_ctx, 0, true, ref_logits);
        chunk[0] = saved;
        if (rc != CAIRN_OK)
            goto done;
        for (int j = 0; kl && j < n_ctx; j++) {
            int same;
            kl_sum += row_kl(ref_logits + (size_t)j * n_vocab, logits + (size_t)j * n_vocab,
                             n_vocab, &same);
            kl_same += same;
            kl_rows++;
        }
        for (int j = first; kl && j < n_ctx - 1; j++)
            ref_nll += token_nll(ref_logits + (size_t)j * n_vocab, n_vocab, chunk[j + 1]);
        for (int j = first; j < n_ctx - 1; j++) {
            double v = token_nll(logits + (size_t)j * n_vocab, n_vocab, chunk[j + 1]);
            nll += v;
            nll2 += v * v;
        }
        count += n_ctx - 1 - first;
        if (tty) { /* a progress line: chunks, tokens/s, time left */
            const double dt = cairn_now() - t0, rate = (double)(c + 1) * n_ctx / dt;
            fprintf(stderr, "\rperplexity: chunk %d/%d, PPL so far %.4f, %.0f tok/s, ETA %.0f s  ",
                    c + 1, n_chunk, exp(nll / count), rate,
                    (double)(n_chunk - c - 1) * n_ctx / rate);
        } else {
            fprintf(stderr, "[%d]%.4f,", c + 1, exp(nll / count));
        }
    }
    fprintf(stderr, "\n");
    double mean = nll / count, var = nll2 / count - mean * mean;
    double ppl = exp(mean);
    double err = var > 0 && count > 1 ? ppl * sqrt(var / (count - 1)) : 0;
    cairn_log(CAIRN_LOG_INFO, "perplexity: %ld tokens scored in %.2f s; PPL = %.6f +/- %.5f",
              count, cairn_now() - t0, ppl, err);
    if (kl) {
        const double ref_ppl = exp(ref_nll / count);
        char ref_name[512];
        if (kl_model)
            snprintf(ref_name, sizeof ref_name, "%s KV %s", kl_model,
                     cairn_kv_type_name(ref_mo.kv_type));
        else
            snprintf(ref_name, sizeof ref_name, "%s", cairn_kv_type_name(ref_mo.kv_type));
        printf("%s%s vs %s: PPL %.4f vs %.4f (%+.2f%%), mean KL %.6f, top-1 agreement %.2f%% "
               "over %ld positions\n",
               kl_model ? "" : "KV ", kl_model ? mo.model_path : cairn_kv_type_name(mo.kv_type),
               ref_name, ppl, ref_ppl,
               100.0 * (ppl / ref_ppl - 1.0), kl_sum / kl_rows, 100.0 * kl_same / kl_rows,
               kl_rows);
    }
    printf("PPL = %.4f\n", ppl);
done:
    free(ref_logits);
    if (kl)
        cli_runtime_close(&ref);
    free(logits);
    free(tokens);
    free(text);
    cli_runtime_close(&rt);
    return rc == CAIRN_OK ? 0 : 1;
}
