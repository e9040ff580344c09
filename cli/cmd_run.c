/*
 * cli/cmd_run.c — `cairn run`: tokenize a prompt, evaluate it, sample a
 * continuation and stream it to stdout as complete UTF-8. Only generated text
 * goes to stdout; everything else (load info, timings) goes to stderr, so the
 * output can be piped and compared.
 */
#include "cli/cli.h"
#include "cli/cli_eagle.h"

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
    "      --chat               treat the prompt as a user message: format it with the model's\n"
    "                           chat template (tokenizer.chat_template) and an assistant turn\n"
    "      --system TEXT        with --chat, a system message before the user message\n"
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
    "      --json               output one JSON object (grammar-constrained sampling)\n"
    "      --json-schema FILE   output JSON valid against the schema in FILE\n"
    "  -v, --verbose            print each token id to stderr as it is generated\n"
    "      --show-top N         print the N highest logits of each step to stderr\n"
    "                           (\"cairn: top: step S: id piece logit | ...\"; pieces\n"
    "                           escaped: bytes outside printable ASCII as \\xHH)\n" CLI_DRAFT_HELP
    CLI_MODEL_HELP
    "  -h, --help               this help\n";

/* The n best logits of a step, best first, on one stderr line: for seeing
 * how close a choice was (bench/models/compare_llamacpp.py reads it). */
static void show_top(const cairn_vocab *vocab, const float *logits, int n_vocab, int n, int step)
{
    enum { MAX_TOP = 16 };
    int best[MAX_TOP];
    n = n > MAX_TOP ? MAX_TOP : n;
    int have = 0;
    for (int id = 0; id < n_vocab; id++) {
        int at = have < n ? have++ : n;
        while (at > 0 && logits[best[at - 1]] < logits[id]) {
            if (at < n)
                best[at] = best[at - 1];
            at--;
        }
        if (at < n)
            best[at] = id;
    }
    fprintf(stderr, "cairn: top: step %d:", step);
    for (int i = 0; i < have; i++) {
        char piece[256];
        size_t len = 0;
        if (cairn_token_to_piece(vocab, best[i], true, piece, sizeof piece, &len) != CAIRN_OK)
            len = 0;
        fprintf(stderr, "%s %d ", i ? " |" : "", best[i]);
        for (size_t k = 0; k < len && k < sizeof piece; k++) {
            unsigned char c = (unsigned char)piece[k];
            if (c > ' ' && c < 0x7f && c != '\\' && c != '|')
                fputc(c, stderr);
            else
                fprintf(stderr, "\\x%02X", c);
        }
        fprintf(stderr, " %.4f", logits[best[i]]);
    }
    fputc('\n', stderr);
}

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
    OPT_FREQ, OPT_PRES, OPT_PARSE_SPECIAL, OPT_NO_BOS, OPT_IGNORE_EOS, OPT_CHAT, OPT_SYSTEM,
    OPT_JSON, OPT_JSON_SCHEMA, OPT_SHOW_TOP,
};

/* --chat: the prompt as one user turn (after an optional system turn) in the
 * model's chat template, with the assistant turn opened. Only the template's
 * own markers become special tokens. */
static int chat_prompt_tokens(const cairn_runtime *rt, const char *system, const char *prompt,
                              bool add_bos, int32_t **ids, size_t *n_ids)
{
    const cairn_vocab *vocab = cairn_runtime_vocab(rt);
    const cairn_chat_template *t = cairn_runtime_chat_template(rt);
    int rc;
    cairn_log(CAIRN_LOG_INFO, "chat template: %s", cairn_chat_family_name(cairn_chat_template_family(t)));
    cairn_chat_message msgs[2] = {{.role = "system", .content = system},
                                  {.role = "user", .content = prompt}};
    rc = cairn_chat_tokenize(t, vocab, system ? msgs : msgs + 1, system ? 2 : 1, NULL,
                             CAIRN_CHAT_GENERATION_PROMPT | (add_bos ? CAIRN_CHAT_ADD_BOS : 0),
                             ids, n_ids);
    if (rc != CAIRN_OK)
        fprintf(stderr, "cairn run: cannot format the chat prompt: %s\n", cairn_strerror(rc));
    return rc;
}

/* --draft: EAGLE speculative decoding. Prints the same stream a plain run
 * would (identical at temperature 0, the same distribution when sampling)
 * and logs tau, the tokens emitted per target forward. */
static int run_speculative(cli_runtime *rt, const cli_draft_opts *draft,
                           const cairn_sampling_params *sp, const int32_t *prompt, int n_prompt,
                           int n_predict, bool ignore_eos, bool verbose, cairn_detok *detok)
{
    cli_spec spec;
    int rc = cli_spec_open(&spec, rt, draft, sp);
    if (rc != CAIRN_OK)
        return rc;
    const cairn_vocab *vocab = rt->vocab;
    double t0 = cairn_now();
    rc = cairn_eagle_seq_begin(spec.seq, cairn_page_pool_base(spec.pool), &spec.kv, spec.pages,
                               spec.capacity, prompt, n_prompt);
    double t_prompt = cairn_now() - t0;
    int n_gen = 0;
    bool stop = false;
    char text[512];
    size_t text_len;
    int32_t step[32];
    t0 = cairn_now();
    while (rc == CAIRN_OK && !stop && n_gen < n_predict) {
        int got = 0;
        rc = cairn_eagle_seq_step(spec.seq, step, 32, &got);
        if (rc == CAIRN_ERANGE) {
            cairn_log(CAIRN_LOG_WARN, "context full at %d tokens; stopping",
                      cairn_eagle_seq_n_past(spec.seq));
            rc = CAIRN_OK;
            break;
        }
        for (int i = 0; rc == CAIRN_OK && i < got && n_gen < n_predict; i++) {
            if (!ignore_eos && cairn_vocab_is_eog(vocab, step[i])) {
                stop = true;
                break;
            }
            n_gen++;
            if (verbose)
                fprintf(stderr, "[%d]", step[i]);
            if (cairn_detok_push(detok, step[i], text, sizeof text, &text_len) == CAIRN_OK &&
                text_len) {
                fwrite(text, 1, text_len, stdout);
                fflush(stdout);
            }
        }
    }
    double t_gen = cairn_now() - t0;
    if (cairn_detok_flush(detok, text, sizeof text, &text_len) == CAIRN_OK && text_len)
        fwrite(text, 1, text_len, stdout);
    printf("\n");
    fflush(stdout);
    if (rc != CAIRN_OK)
        fprintf(stderr, "cairn run: speculative decoding failed: %s\n", cairn_strerror(rc));
    cairn_eagle_stats st;
    cairn_eagle_seq_stats(spec.seq, &st);
    cairn_log(CAIRN_LOG_INFO, "prompt: %d tokens in %.3f s; generated %d tokens in %.3f s "
              "(%.1f tok/s); speculative: %lld target forwards, tau %.2f tokens per forward, "
              "%lld draft tokens verified; time: draft %.3f s, verify %.3f s, head update %.3f s",
              n_prompt, t_prompt, n_gen, t_gen, n_gen / (t_gen > 0 ? t_gen : 1e-9),
              (long long)st.steps, st.steps ? (double)st.tokens / st.steps : 0.0,
              (long long)st.drafted, st.t_draft, st.t_verify, st.t_head_update);
    cli_spec_close(&spec);
    return rc;
}

int cmd_run(int argc, char **argv)
{
    cli_model_opts mo;
    cli_model_opts_defaults(&mo);
    cairn_sampling_params sp = cairn_sampling_defaults();
    bool seed_given = false, parse_special = false, no_bos = false, ignore_eos = false;
    bool verbose = false, chat = false;
    int n_show_top = 0;
    bool json_mode = false;              /* --json: any JSON object        */
    const char *json_schema_file = NULL; /* --json-schema FILE             */
    const char *prompt = NULL, *prompt_file = NULL, *system = NULL;
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
        {"json", no_argument, 0, OPT_JSON},
        {"json-schema", required_argument, 0, OPT_JSON_SCHEMA},
        {"chat", no_argument, 0, OPT_CHAT},
        {"system", required_argument, 0, OPT_SYSTEM},
        {"verbose", no_argument, 0, 'v'},
        {"show-top", required_argument, 0, OPT_SHOW_TOP},
        {"help", no_argument, 0, 'h'},
        CLI_DRAFT_LONGOPTS,
        {0, 0, 0, 0},
    };
    cli_draft_opts draft;
    cli_draft_opts_defaults(&draft);
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, CLI_MODEL_SHORTOPTS "p:f:n:vh", longopts, NULL)) != -1) {
        int r = cli_model_opts_parse(&mo, opt, optarg);
        if (r == 0)
            r = cli_draft_opts_parse(&draft, opt, optarg);
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
        case OPT_JSON: json_mode = true; break;
        case OPT_JSON_SCHEMA: json_schema_file = optarg; break;
        case OPT_CHAT: chat = true; break;
        case OPT_SYSTEM: system = optarg; break;
        case 'v': verbose = true; break;
        case OPT_SHOW_TOP:
            if (cli_parse_int(optarg, "--show-top", 1, 16, &n_show_top) < 0)
                return 2;
            break;
        case 'h': fputs(help, stdout); return 0;
        default: fputs(help, stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "cairn run: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    /* Structured output: compiled before the model loads, so a bad schema
     * fails fast. */
    cairn_grammar *grammar = NULL;
    if (json_mode || json_schema_file) {
        size_t schema_len = 0;
        char *schema = json_schema_file ? cli_read_file(json_schema_file, &schema_len) : NULL;
        char gerr[256] = "";
        if (json_schema_file && !schema) {
            fprintf(stderr, "cairn run: cannot read '%s': %s\n", json_schema_file, strerror(errno));
            return 1;
        }
        int grc = cairn_grammar_from_json_schema(schema, schema_len, &grammar, gerr, sizeof gerr);
        free(schema);
        if (grc != CAIRN_OK) {
            fprintf(stderr, "cairn run: %s\n", gerr[0] ? gerr : cairn_strerror(grc));
            return 2;
        }
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
    if (system && !chat) {
        fprintf(stderr, "cairn run: --system goes with --chat\n");
        free(file_text);
        return 2;
    }
    if (!seed_given)
        sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);

    cli_runtime rt;
    if (cli_runtime_open(&rt, &mo) != CAIRN_OK) {
        free(file_text);
        cairn_grammar_free(grammar);
        return 1;
    }
    const cairn_vocab *vocab = rt.vocab;
    const int n_vocab = cairn_model_hparams(rt.model)->n_vocab;
    int flags = (!no_bos && cairn_vocab_add_bos(vocab) ? CAIRN_TOK_ADD_BOS : 0) |
                (parse_special ? CAIRN_TOK_PARSE_SPECIAL : 0);
    int32_t *prompt_ids = NULL;
    size_t n_prompt = 0;
    float *logits = malloc((size_t)n_vocab * sizeof(float));
    cairn_sampler *sampler = NULL;
    cairn_detok *detok = NULL;
    cairn_grammar_matcher *matcher = NULL;
    int rc = !logits ? CAIRN_ENOMEM
             : chat  ? chat_prompt_tokens(rt.rt, system, prompt,
                                          flags & CAIRN_TOK_ADD_BOS, &prompt_ids, &n_prompt)
                     : cli_tokenize_alloc(vocab, prompt, prompt_len, flags, &prompt_ids, &n_prompt);
    if (rc == CAIRN_OK && n_prompt == 0) {
        fprintf(stderr, "cairn run: the prompt is empty\n");
        rc = CAIRN_EINVAL;
    }
    if (rc == CAIRN_OK && (rc = cairn_sampler_create(&sp, n_vocab, &sampler)) != CAIRN_OK)
        fprintf(stderr, "cairn run: invalid sampling settings\n");
    if (rc == CAIRN_OK)
        rc = cairn_detok_create(vocab, false, &detok);
    if (rc == CAIRN_OK && grammar)
        rc = cairn_grammar_matcher_create(grammar, vocab, &matcher);
    if (rc != CAIRN_OK)
        goto done;
    cairn_log(CAIRN_LOG_INFO, "prompt: %zu tokens; sampling: temp %.2f top-k %d top-p %.2f "
              "min-p %.2f seed %llu", n_prompt, sp.temperature, sp.top_k, sp.top_p, sp.min_p,
              (unsigned long long)sp.seed);

    if (draft.head_path) {
        if (matcher) {
            fprintf(stderr, "cairn run: --draft does not combine with --json/--json-schema\n");
            rc = CAIRN_EUNSUPPORTED;
        } else {
            rc = run_speculative(&rt, &draft, &sp, prompt_ids, (int)n_prompt, n_predict,
                                 ignore_eos, verbose, detok);
        }
        goto done;
    }
    for (size_t i = 0; i < n_prompt; i++)
        cairn_sampler_accept(sampler, prompt_ids[i]);
    double t0 = cairn_now();
    if ((rc = cli_eval(&rt, prompt_ids, (int)n_prompt, 0, false, logits)) != CAIRN_OK)
        goto done;
    double t_prompt = cairn_now() - t0;

    int n_gen = 0;
    int n_past = (int)n_prompt;
    const char *finish = "length"; /* "stop" when an end-of-generation token ends it */
    char text[512];
    size_t text_len;
    t0 = cairn_now();
    while (n_gen < n_predict) {
        int32_t tok;
        if (matcher && (rc = cairn_grammar_matcher_mask(matcher, logits, n_vocab)) != CAIRN_OK) {
            cairn_log(CAIRN_LOG_ERROR, "no token can continue the JSON document");
            break;
        }
        if (n_show_top)
            show_top(vocab, logits, n_vocab, n_show_top, n_gen);
        if ((rc = cairn_sampler_sample(sampler, logits, &tok, NULL, NULL)) != CAIRN_OK)
            break;
        if (!ignore_eos && cairn_vocab_is_eog(vocab, tok)) {
            finish = "stop";
            cairn_log(CAIRN_LOG_INFO, "end-of-generation token %d after %d tokens", tok, n_gen);
            break;
        }
        if (matcher && (rc = cairn_grammar_matcher_accept(matcher, tok)) != CAIRN_OK)
            break;
        cairn_sampler_accept(sampler, tok);
        n_gen++;
        if (verbose)
            fprintf(stderr, "[%d]", tok);
        if (cairn_detok_push(detok, tok, text, sizeof text, &text_len) == CAIRN_OK && text_len) {
            fwrite(text, 1, text_len, stdout);
            fflush(stdout);
        }
        if (matcher && cairn_grammar_matcher_done(matcher)) {
            finish = "stop"; /* the JSON document is complete */
            break;
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
              "%.3f s (%.1f tok/s); finish: %s", n_prompt, t_prompt, n_prompt / (t_prompt > 0 ? t_prompt : 1e-9),
              n_gen, t_gen, n_gen / (t_gen > 0 ? t_gen : 1e-9), finish);
done:
    cairn_grammar_matcher_free(matcher);
    cairn_grammar_free(grammar);
    cairn_detok_free(detok);
    cairn_sampler_free(sampler);
    free(prompt_ids);
    free(logits);
    free(file_text);
    cli_runtime_close(&rt);
    return rc == CAIRN_OK ? 0 : 1;
}
