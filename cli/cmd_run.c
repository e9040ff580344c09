/*
 * cli/cmd_run.c — `cairn run`: tokenize a prompt, evaluate it, sample a
 * continuation and stream it to stdout as complete UTF-8. Only generated text
 * goes to stdout; everything else (load info, timings) goes to stderr, so the
 * output can be piped and compared.
 */
#include "cli/cli.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char help[] =
    "usage: cairn run -m MODEL -p PROMPT [options]\n\n"
    "Prints only the generated continuation of PROMPT to stdout; diagnostics and\n"
    "timings go to stderr.\n\n"
    "  -p, --prompt TEXT        the prompt\n"
    "  -f, --file FILE          read the prompt from FILE instead\n"
    "  -n, --n-predict N        tokens to generate (default 128; stops early at end of text)\n"
    "      --temp T             temperature, 0 = greedy (default 0.8)\n"
    "      --seed S             sampling seed (default: random, printed to stderr)\n"
    "      --top-k K            top-k, 0 disables (default 40)\n"
    "      --top-p P            top-p, 1 disables (default 0.95)\n"
    "      --min-p P            min-p, 0 disables (default 0.05)\n"
    "      --repeat-penalty R   repetition penalty, 1 disables (default 1)\n"
    "      --repeat-last-n N    window for penalties (default 64)\n"
    "      --frequency-penalty F, --presence-penalty P   (default 0)\n"
    "      --parse-special      recognise special-token text in the prompt\n"
    "      --no-bos             never prepend BOS\n"
    "      --ignore-eos         keep generating past end-of-generation tokens\n"
    "  -v, --verbose            print each token id to stderr as it is generated\n" CLI_MODEL_HELP
    "  -h, --help               this help\n";

static int parse_float(const char *arg, const char *what, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(arg, &end);
    if (errno || *end || end == arg || !isfinite(v)) {
        fprintf(stderr, "cairn run: %s must be a number, got '%s'\n", what, arg);
        return -1;
    }
    *out = v;
    return 0;
}

enum {
    OPT_TEMP = 2000, OPT_SEED, OPT_TOPK, OPT_TOPP, OPT_MINP, OPT_REPEAT, OPT_REPEAT_N,
    OPT_FREQ, OPT_PRES, OPT_PARSE_SPECIAL, OPT_NO_BOS, OPT_IGNORE_EOS,
};

int cmd_run(int argc, char **argv)
{
    cli_model_opts mo;
    cli_model_opts_defaults(&mo);
    cairn_sampling_params sp = cairn_sampling_defaults();
    bool seed_given = false, parse_special = false, no_bos = false, ignore_eos = false;
    bool verbose = false;
    const char *prompt = NULL, *prompt_file = NULL;
    int n_predict = 128;

    static const struct option longopts[] = {
        CLI_MODEL_LONGOPTS,
        {"prompt", required_argument, 0, 'p'},
        {"file", required_argument, 0, 'f'},
        {"n-predict", required_argument, 0, 'n'},
        {"temp", required_argument, 0, OPT_TEMP},
        {"seed", required_argument, 0, OPT_SEED},
        {"top-k", required_argument, 0, OPT_TOPK},
        {"top-p", required_argument, 0, OPT_TOPP},
        {"min-p", required_argument, 0, OPT_MINP},
        {"repeat-penalty", required_argument, 0, OPT_REPEAT},
        {"repeat-last-n", required_argument, 0, OPT_REPEAT_N},
        {"frequency-penalty", required_argument, 0, OPT_FREQ},
        {"presence-penalty", required_argument, 0, OPT_PRES},
        {"parse-special", no_argument, 0, OPT_PARSE_SPECIAL},
        {"no-bos", no_argument, 0, OPT_NO_BOS},
        {"ignore-eos", no_argument, 0, OPT_IGNORE_EOS},
        {"verbose", no_argument, 0, 'v'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, CLI_MODEL_SHORTOPTS "p:f:n:vh", longopts, NULL)) != -1) {
        int r = cli_model_opts_parse(&mo, opt, optarg);
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        float f;
        switch (opt) {
        case 'p': prompt = optarg; break;
        case 'f': prompt_file = optarg; break;
        case 'n':
            if (parse_float(optarg, "-n", &f) || f < 0 || f > 1e7 || f != floorf(f))
                return 2;
            n_predict = (int)f;
            break;
        case OPT_TEMP: if (parse_float(optarg, "--temp", &sp.temperature)) return 2; break;
        case OPT_TOPK:
            if (parse_float(optarg, "--top-k", &f)) return 2;
            sp.top_k = (int)f;
            break;
        case OPT_TOPP: if (parse_float(optarg, "--top-p", &sp.top_p)) return 2; break;
        case OPT_MINP: if (parse_float(optarg, "--min-p", &sp.min_p)) return 2; break;
        case OPT_REPEAT: if (parse_float(optarg, "--repeat-penalty", &sp.repeat_penalty)) return 2; break;
        case OPT_REPEAT_N:
            if (parse_float(optarg, "--repeat-last-n", &f) || f < 0) return 2;
            sp.penalty_last_n = (int)f;
            break;
        case OPT_FREQ: if (parse_float(optarg, "--frequency-penalty", &sp.frequency_penalty)) return 2; break;
        case OPT_PRES: if (parse_float(optarg, "--presence-penalty", &sp.presence_penalty)) return 2; break;
        case OPT_SEED: {
            char *end;
            errno = 0;
            sp.seed = strtoull(optarg, &end, 10);
            if (errno || *end || end == optarg) {
                fprintf(stderr, "cairn run: --seed must be a non-negative integer\n");
                return 2;
            }
            seed_given = true;
            break;
        }
        case OPT_PARSE_SPECIAL: parse_special = true; break;
        case OPT_NO_BOS: no_bos = true; break;
        case OPT_IGNORE_EOS: ignore_eos = true; break;
        case 'v': verbose = true; break;
        case 'h': fputs(help, stdout); return 0;
        default: fputs(help, stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "cairn run: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    char *file_text = NULL;
    size_t prompt_len = 0;
    if (prompt_file) {
        file_text = cli_read_file(prompt_file, &prompt_len);
        if (!file_text) {
            fprintf(stderr, "cairn run: cannot read '%s': %s\n", prompt_file, strerror(errno));
            return 1;
        }
        prompt = file_text;
    } else if (prompt) {
        prompt_len = strlen(prompt);
    } else {
        fprintf(stderr, "cairn run: a prompt is required (-p TEXT or -f FILE)\n");
        return 2;
    }
    if (!seed_given)
        sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);

    cli_runtime rt;
    if (cli_runtime_open(&rt, &mo) != CAIRN_OK) {
        free(file_text);
        return 1;
    }
    const cairn_vocab *vocab = cairn_model_vocab(rt.model);
    const int n_vocab = cairn_model_hparams(rt.model)->n_vocab;
    int flags = (!no_bos && cairn_vocab_add_bos(vocab) ? CAIRN_TOK_ADD_BOS : 0) |
                (parse_special ? CAIRN_TOK_PARSE_SPECIAL : 0);
    int32_t *prompt_ids = NULL;
    size_t n_prompt = 0;
    float *logits = malloc((size_t)n_vocab * sizeof(float));
    cairn_sampler *sampler = NULL;
    cairn_detok *detok = NULL;
    int rc = logits ? cli_tokenize_alloc(vocab, prompt, prompt_len, flags, &prompt_ids, &n_prompt)
                    : CAIRN_ENOMEM;
    if (rc == CAIRN_OK && n_prompt == 0) {
        fprintf(stderr, "cairn run: the prompt is empty\n");
        rc = CAIRN_EINVAL;
    }
    if (rc == CAIRN_OK && (rc = cairn_sampler_create(&sp, n_vocab, &sampler)) != CAIRN_OK)
        fprintf(stderr, "cairn run: invalid sampling settings\n");
    if (rc == CAIRN_OK)
        rc = cairn_detok_create(vocab, false, &detok);
    if (rc != CAIRN_OK)
        goto done;
    cairn_log(CAIRN_LOG_INFO, "prompt: %zu tokens; sampling: temp %.2f top-k %d top-p %.2f "
              "min-p %.2f seed %llu", n_prompt, sp.temperature, sp.top_k, sp.top_p, sp.min_p,
              (unsigned long long)sp.seed);

    for (size_t i = 0; i < n_prompt; i++)
        cairn_sampler_accept(sampler, prompt_ids[i]);
    double t0 = cairn_now();
    if ((rc = cli_eval(&rt, prompt_ids, (int)n_prompt, 0, false, logits)) != CAIRN_OK)
        goto done;
    double t_prompt = cairn_now() - t0;

    int n_gen = 0;
    int n_past = (int)n_prompt;
    char text[512];
    size_t text_len;
    t0 = cairn_now();
    while (n_gen < n_predict) {
        int32_t tok;
        if ((rc = cairn_sampler_sample(sampler, logits, &tok, NULL, NULL)) != CAIRN_OK)
            break;
        if (!ignore_eos && cairn_vocab_is_eog(vocab, tok))
            break;
        cairn_sampler_accept(sampler, tok);
        n_gen++;
        if (verbose)
            fprintf(stderr, "[%d]", tok);
        if (cairn_detok_push(detok, tok, text, sizeof text, &text_len) == CAIRN_OK && text_len) {
            fwrite(text, 1, text_len, stdout);
            fflush(stdout);
        }
        if (n_gen == n_predict)
            break;
        if (n_past >= rt.n_ctx) {
            cairn_log(CAIRN_LOG_WARN, "context full at %d tokens; stopping", n_past);
            break;
        }
        if ((rc = cli_eval(&rt, &tok, 1, n_past, false, logits)) != CAIRN_OK)
            break;
        n_past++;
    }
    double t_gen = cairn_now() - t0;
    if (cairn_detok_flush(detok, text, sizeof text, &text_len) == CAIRN_OK && text_len)
        fwrite(text, 1, text_len, stdout);
    printf("\n");
    fflush(stdout);
    cairn_log(CAIRN_LOG_INFO, "prompt: %zu tokens in %.3f s (%.1f tok/s); generated %d tokens in "
              "%.3f s (%.1f tok/s)", n_prompt, t_prompt, n_prompt / (t_prompt > 0 ? t_prompt : 1e-9),
              n_gen, t_gen, n_gen / (t_gen > 0 ? t_gen : 1e-9));
done:
    cairn_detok_free(detok);
    cairn_sampler_free(sampler);
    free(prompt_ids);
    free(logits);
    free(file_text);
    cli_runtime_close(&rt);
    return rc == CAIRN_OK ? 0 : 1;
}
