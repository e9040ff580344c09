/*
 * cli/cmd_run.c — `cairn run`: tokenize a prompt and generate a continuation
 * through the service's decode path (session/: the same sampling, stop,
 * grammar and speculative decoding `serve` runs), streaming it to stdout as
 * complete UTF-8. Only generated text goes to stdout; everything else (load
 * info, timings) goes to stderr, so the output can be piped and compared.
 */
#include "cli/cli.h"
#include "cli/cli_eagle.h"
#include "session/session.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
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
    "      --show-top N         print the N most likely tokens of each step to stderr\n"
    "                           (\"cairn: top: step S: id piece logprob | ...\"; pieces\n"
    "                           escaped: bytes outside printable ASCII as \\xHH)\n" CLI_DRAFT_HELP
    CLI_MODEL_HELP
    "  -h, --help               this help\n";

/* The n most likely tokens of a step, best first, on one stderr line: for
 * seeing how close a choice was (bench/models/compare_llamacpp.py reads
 * it). Values are log-probabilities of the model's own distribution, whose
 * differences are the logits' differences. */
static void show_top(const cairn_vocab *vocab, const cairn_token_logprob *top, int n, int step)
{
    fprintf(stderr, "cairn: top: step %d:", step);
    for (int i = 0; i < n && top[i].token >= 0; i++) {
        char piece[256];
        size_t len = 0;
        if (cairn_token_to_piece(vocab, top[i].token, true, piece, sizeof piece, &len) != CAIRN_OK)
            len = 0;
        fprintf(stderr, "%s %d ", i ? " |" : "", top[i].token);
        for (size_t k = 0; k < len && k < sizeof piece; k++) {
            unsigned char c = (unsigned char)piece[k];
            if (c > ' ' && c < 0x7f && c != '\\' && c != '|')
                fputc(c, stderr);
            else
                fprintf(stderr, "\\x%02X", c);
        }
        fprintf(stderr, " %.4f", top[i].logprob);
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

/* What the generation's events tell the command: the text goes to stdout as
 * it comes (on the engine thread), the end wakes the main thread. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done, failed;
    bool verbose;
    int show_top, step;
    const cairn_vocab *vocab;
    char finish[16];
    int64_t n_prompt, n_gen, spec_forwards, spec_tokens;
    int32_t eog_token;
    double prompt_s, decode_s;
} run_state;

static void on_event(const cairn_event *ev, void *user)
{
    run_state *st = user;
    if (ev->kind == CAIRN_EV_DELTA || ev->kind == CAIRN_EV_DONE) {
        /* the final delta comes before DONE: DONE's text is all of it again */
        for (size_t i = 0; ev->kind == CAIRN_EV_DELTA && i < ev->n_tokens; i++) {
            if (st->show_top && ev->logprobs)
                show_top(st->vocab, ev->logprobs + i * (size_t)(1 + ev->n_top) + 1, ev->n_top,
                         st->step);
            st->step++;
            if (st->verbose)
                fprintf(stderr, "[%d]", ev->tokens[i]);
        }
        if (ev->kind == CAIRN_EV_DELTA && ev->text_len) {
            fwrite(ev->text, 1, ev->text_len, stdout);
            fflush(stdout);
        }
    }
    if (ev->kind == CAIRN_EV_DELTA)
        return;
    pthread_mutex_lock(&st->mu);
    if (ev->kind == CAIRN_EV_ERROR) {
        fprintf(stderr, "cairn run: %s\n", ev->message ? ev->message : cairn_strerror(ev->code));
        st->failed = true;
    } else {
        snprintf(st->finish, sizeof st->finish, "%s", ev->finish_reason ? ev->finish_reason : "");
        st->n_prompt = ev->prompt_tokens;
        st->n_gen = ev->completion_tokens;
        st->prompt_s = ev->prompt_seconds;
        st->decode_s = ev->decode_seconds;
        st->spec_forwards = ev->spec_forwards;
        st->spec_tokens = ev->spec_tokens;
        st->eog_token = ev->eog_token;
    }
    st->done = true;
    pthread_cond_signal(&st->cv);
    pthread_mutex_unlock(&st->mu);
}

/* The prompt as tokens: plain text with the tokenizer's flags, or (--chat)
 * one user turn in the model's template. */
static int prompt_tokens(const cairn_runtime *rt, bool chat, const char *system,
                         const char *prompt, size_t len, int flags, int32_t **ids, size_t *n)
{
    if (chat)
        return chat_prompt_tokens(rt, system, prompt, flags & CAIRN_TOK_ADD_BOS, ids, n);
    int rc = cli_tokenize_alloc(cairn_runtime_vocab(rt), prompt, len, flags, ids, n);
    if (rc != CAIRN_OK)
        fprintf(stderr, "cairn run: cannot tokenize the prompt: %s\n", cairn_strerror(rc));
    return rc;
}

/* Generate through a one-request service on the runtime (the same decode
 * path `serve` runs: sampling, stop, grammar, speculation) and stream the
 * text to stdout. */
static int generate(cairn_runtime *rt, const cli_model_opts *mo, const cli_draft_opts *draft,
                    cairn_request *req, run_state *st)
{
    const cairn_hparams *hp = cairn_runtime_hparams(rt);
    cairn_service_config cfg = {
        .runtime = rt, .page_size = mo->page_size, .kv_type = mo->kv_type,
        .n_ctx = mo->n_ctx > 0 ? mo->n_ctx : (hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096),
        .max_batch_tokens = mo->batch, .max_seqs = 1, .prefill_chunk = mo->batch,
        .no_prefix_cache = true, .draft = draft->params, .on_event = on_event, .user = st};
    cairn_service *svc = NULL;
    char err[512] = "";
    int rc = cairn_service_start(&cfg, &svc, err, sizeof err);
    if (rc != CAIRN_OK) {
        fprintf(stderr, "cairn run: %s\n", err[0] ? err : cairn_strerror(rc));
        cairn_request_free(req);
        return rc;
    }
    if ((rc = cairn_service_submit(svc, req)) == CAIRN_OK) {
        pthread_mutex_lock(&st->mu);
        while (!st->done)
            pthread_cond_wait(&st->cv, &st->mu);
        pthread_mutex_unlock(&st->mu);
    }
    cairn_service_stop(svc);
    return rc != CAIRN_OK ? rc : st->failed ? CAIRN_EINVAL : CAIRN_OK;
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

    if (draft.head_path && grammar) {
        fprintf(stderr, "cairn run: --draft does not combine with --json/--json-schema\n");
        free(file_text);
        cairn_grammar_free(grammar);
        return 1;
    }
    if (draft.head_path && cairn_sampling_has_penalties(&sp)) {
        fprintf(stderr, "cairn run: speculative decoding does not support repetition, "
                        "frequency or presence penalties\n");
        free(file_text);
        cairn_grammar_free(grammar);
        return 1;
    }
    cairn_runtime *rt = NULL;
    char err[512] = "";
    double t0 = cairn_now();
    const cairn_runtime_config rcfg = cli_runtime_config(&mo, draft.head_path);
    if (cairn_runtime_open(&rcfg, &rt, err, sizeof err) != CAIRN_OK) {
        fprintf(stderr, "cairn: cannot load model: %s\n", err);
        free(file_text);
        cairn_grammar_free(grammar);
        return 1;
    }
    const cairn_vocab *vocab = cairn_runtime_vocab(rt);
    const cairn_hparams *hp = cairn_runtime_hparams(rt);
    cairn_log(CAIRN_LOG_INFO, "model %s: %s, dim %d, %d layers, %d/%d heads, vocab %d; loaded in "
              "%.2f s on %s (%d threads)", hp->name, hp->arch, hp->dim, hp->n_layer, hp->n_head,
              hp->n_kv_head, hp->n_vocab, cairn_now() - t0,
              cairn_runtime_backend(rt)->iface->name, cairn_runtime_threads(rt));
    int flags = (!no_bos && cairn_vocab_add_bos(vocab) ? CAIRN_TOK_ADD_BOS : 0) |
                (parse_special ? CAIRN_TOK_PARSE_SPECIAL : 0);
    cairn_request *req = cairn_request_new(CAIRN_REQ_GENERATE);
    int rc = req ? prompt_tokens(rt, chat, system, prompt, prompt_len, flags, &req->tokens,
                                 &req->n_tokens)
                 : CAIRN_ENOMEM;
    free(file_text);
    if (rc == CAIRN_OK && req->n_tokens == 0) {
        fprintf(stderr, "cairn run: the prompt is empty\n");
        rc = CAIRN_EINVAL;
    }
    if (rc != CAIRN_OK) {
        cairn_request_free(req);
        cairn_grammar_free(grammar);
        cairn_runtime_close(rt);
        return 1;
    }
    req->gen.max_tokens = n_predict;
    req->gen.sampling = sp;
    req->gen.sampling.n_logprobs = n_show_top;
    req->gen.logprobs = n_show_top > 0;
    req->gen.grammar = grammar; /* the request owns it now */
    req->gen.stream = true;
    req->gen.ignore_eos = ignore_eos;
    cairn_log(CAIRN_LOG_INFO, "prompt: %zu tokens; sampling: temp %.2f top-k %d top-p %.2f "
              "min-p %.2f seed %llu", req->n_tokens, sp.temperature, sp.top_k, sp.top_p, sp.min_p,
              (unsigned long long)sp.seed);
    run_state st = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER,
                    .verbose = verbose, .show_top = n_show_top, .vocab = vocab};
    rc = generate(rt, &mo, &draft, req, &st);
    printf("\n");
    fflush(stdout);
    if (rc == CAIRN_OK && st.eog_token >= 0)
        cairn_log(CAIRN_LOG_INFO, "end-of-generation token %d after %lld tokens", st.eog_token,
                  (long long)st.n_gen);
    if (rc == CAIRN_OK) {
        cairn_log(CAIRN_LOG_INFO, "prompt: %lld tokens in %.3f s (%.1f tok/s); generated %lld "
                  "tokens in %.3f s (%.1f tok/s); finish: %s", (long long)st.n_prompt,
                  st.prompt_s, st.n_prompt / (st.prompt_s > 0 ? st.prompt_s : 1e-9),
                  (long long)st.n_gen, st.decode_s,
                  st.n_gen / (st.decode_s > 0 ? st.decode_s : 1e-9), st.finish);
        if (draft.head_path)
            cairn_log(CAIRN_LOG_INFO, "speculative: %lld target forwards, tau %.2f tokens per "
                      "forward", (long long)st.spec_forwards,
                      st.spec_forwards ? (double)st.spec_tokens / st.spec_forwards : 0.0);
    }
    cairn_runtime_close(rt);
    return rc == CAIRN_OK ? 0 : 1;
}
