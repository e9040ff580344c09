/*
 * cli/cmd_run.c — `cairn run`: tokenize a prompt and generate a continuation
 * through the service's decode path (session/: the same sampling, stop,
 * grammar and speculative decoding `serve` runs), streaming it to stdout as
 * complete UTF-8. Only generated text goes to stdout; everything else (load
 * info, timings) goes to stderr, so the output can be piped and compared.
 */
#include "cli/cli.h"
#include "cli/cli_spec.h"
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

enum {
    OPT_TEMP = 2000, OPT_SEED, OPT_TOPK, OPT_TOPP, OPT_MINP, OPT_REPEAT, OPT_REPEAT_N,
    OPT_FREQ, OPT_PRES, OPT_PARSE_SPECIAL, OPT_NO_BOS, OPT_IGNORE_EOS, OPT_CHAT, OPT_SYSTEM,
    OPT_JSON, OPT_JSON_SCHEMA, OPT_SHOW_TOP,
};

/* ---- options -------------------------------------------------------------- */

typedef struct {
    cli_model_opts model;
    cli_draft_opts draft;
    cairn_sampling_params sampling;
    bool seed_given, parse_special, no_bos, ignore_eos;
    bool verbose, chat;
    int show_top;                   /* --show-top N; 0 = off          */
    bool json_mode;                 /* --json: any JSON object        */
    const char *json_schema_file;   /* --json-schema FILE             */
    const char *prompt, *prompt_file, *system;
    int n_predict;
} run_opts;

/* The sampling options: 1 if `opt` was one, 0 if not, -1 on a bad value.
 * A value that is not a number is reported; one out of range (here and for
 * -n) is refused without a message, as it always has been. */
static int parse_sampling_opt(run_opts *o, int opt, const char *arg)
{
    cairn_sampling_params *sp = &o->sampling;
    float f;
    switch (opt) {
    case OPT_TEMP: return cli_parse_float("cairn run", arg, "--temp", &sp->temperature);
    case OPT_TOPK:
        if (cli_parse_float("cairn run", arg, "--top-k", &f) < 0)
            return -1;
        sp->top_k = (int)f;
        return 1;
    case OPT_TOPP: return cli_parse_float("cairn run", arg, "--top-p", &sp->top_p);
    case OPT_MINP: return cli_parse_float("cairn run", arg, "--min-p", &sp->min_p);
    case OPT_REPEAT: return cli_parse_float("cairn run", arg, "--repeat-penalty", &sp->repeat_penalty);
    case OPT_REPEAT_N:
        if (cli_parse_float("cairn run", arg, "--repeat-last-n", &f) < 0 || f < 0)
            return -1;
        sp->penalty_last_n = (int)f;
        return 1;
    case OPT_FREQ: return cli_parse_float("cairn run", arg, "--frequency-penalty", &sp->frequency_penalty);
    case OPT_PRES: return cli_parse_float("cairn run", arg, "--presence-penalty", &sp->presence_penalty);
    case OPT_SEED:
        if (cli_parse_seed("cairn run", arg, &sp->seed) < 0)
            return -1;
        o->seed_given = true;
        return 1;
    default: return 0;
    }
}

/* Everything else `run` adds to the shared options, in the same convention. */
static int parse_run_opt(run_opts *o, int opt, const char *arg)
{
    float f;
    switch (opt) {
    case 'p': o->prompt = arg; return 1;
    case 'f': o->prompt_file = arg; return 1;
    case 'n':
        /* a number, so "1e3" has always been accepted; whole and in range */
        if (cli_parse_float("cairn run", arg, "-n", &f) < 0 || f < 0 || f > 1e7 || f != floorf(f))
            return -1;
        o->n_predict = (int)f;
        return 1;
    case OPT_PARSE_SPECIAL: o->parse_special = true; return 1;
    case OPT_NO_BOS: o->no_bos = true; return 1;
    case OPT_IGNORE_EOS: o->ignore_eos = true; return 1;
    case OPT_JSON: o->json_mode = true; return 1;
    case OPT_JSON_SCHEMA: o->json_schema_file = arg; return 1;
    case OPT_CHAT: o->chat = true; return 1;
    case OPT_SYSTEM: o->system = arg; return 1;
    case 'v': o->verbose = true; return 1;
    case OPT_SHOW_TOP: return cli_parse_int(arg, "--show-top", 1, 16, &o->show_top);
    default: return parse_sampling_opt(o, opt, arg);
    }
}

/* The command line into *o: CLI_PROCEED, or the exit status. */
static int parse_run_opts(run_opts *o, int argc, char **argv)
{
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
    memset(o, 0, sizeof *o);
    cli_model_opts_defaults(&o->model);
    cli_draft_opts_defaults(&o->draft);
    o->sampling = cairn_sampling_defaults();
    o->n_predict = 128;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, CLI_MODEL_SHORTOPTS "p:f:n:vh", longopts, NULL)) != -1) {
        int r = cli_model_opts_parse(&o->model, opt, optarg);
        if (r == 0)
            r = cli_draft_opts_parse(&o->draft, opt, optarg);
        if (r == 0)
            r = parse_run_opt(o, opt, optarg);
        if (r < 0)
            return 2;
        if (r == 0)
            return cli_help_or_usage(opt, help);
    }
    return cli_no_operands("cairn run", argc, argv);
}

/* ---- generation ---------------------------------------------------------- */

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
    int64_t n_prompt, n_gen, spec_forwards, spec_tokens, spec_drafted, spec_accepted;
    char spec_method[64];
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
        st->spec_drafted = ev->spec_drafted;
        st->spec_accepted = ev->spec_accepted;
        snprintf(st->spec_method, sizeof st->spec_method, "%s", ev->spec_method);
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


/* ---- set-up: what is checked before the model loads ----------------------- */

/* What the options ask for that is read or compiled before the model loads. */
typedef struct {
    cairn_grammar *grammar; /* --json/--json-schema; NULL without          */
    char *file_text;        /* -f FILE's contents; NULL with -p            */
    const char *prompt;
    size_t prompt_len;
} run_inputs;

static void run_inputs_free(run_inputs *in)
{
    cairn_grammar_free(in->grammar);
    free(in->file_text);
    memset(in, 0, sizeof *in);
}

/* Structured output: compiled before the model loads, so a bad schema fails
 * fast. CLI_PROCEED or the exit status. */
static int compile_output_grammar(const run_opts *o, cairn_grammar **grammar)
{
    if (!o->json_mode && !o->json_schema_file)
        return CLI_PROCEED;
    size_t schema_len = 0;
    char *schema = o->json_schema_file ? cli_read_file(o->json_schema_file, &schema_len) : NULL;
    char gerr[256] = "";
    if (o->json_schema_file && !schema) {
        fprintf(stderr, "cairn run: cannot read '%s': %s\n", o->json_schema_file, strerror(errno));
        return 1;
    }
    int grc = cairn_grammar_from_json_schema(schema, schema_len, grammar, gerr, sizeof gerr);
    free(schema);
    if (grc != CAIRN_OK) {
        fprintf(stderr, "cairn run: %s\n", gerr[0] ? gerr : cairn_strerror(grc));
        return 2;
    }
    return CLI_PROCEED;
}

/* The prompt text: -f FILE's contents or -p TEXT. */
static int read_prompt(const run_opts *o, run_inputs *in)
{
    if (o->prompt_file) {
        in->file_text = cli_read_file(o->prompt_file, &in->prompt_len);
        if (!in->file_text) {
            fprintf(stderr, "cairn run: cannot read '%s': %s\n", o->prompt_file, strerror(errno));
            return 1;
        }
        in->prompt = in->file_text;
    } else if (o->prompt) {
        in->prompt = o->prompt;
        in->prompt_len = strlen(o->prompt);
    } else {
        fprintf(stderr, "cairn run: a prompt is required (-p TEXT or -f FILE)\n");
        return 2;
    }
    return CLI_PROCEED;
}

/* Everything that can be refused before the model loads, in the order the
 * messages have always come: grammar, prompt, option combinations. Picks
 * the seed when none was given. CLI_PROCEED or the exit status; *in holds
 * what was read either way. */
static int prepare_run(run_opts *o, run_inputs *in)
{
    int status = compile_output_grammar(o, &in->grammar);
    if (status == CLI_PROCEED)
        status = read_prompt(o, in);
    if (status != CLI_PROCEED)
        return status;
    if (o->system && !o->chat) {
        fprintf(stderr, "cairn run: --system goes with --chat\n");
        return 2;
    }
    if (!o->seed_given)
        o->sampling.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    return CLI_PROCEED;
}

/* ---- the action: load, generate, report ----------------------------------- */

static cairn_runtime *open_run_runtime(const run_opts *o)
{
    cairn_runtime *rt = NULL;
    char err[512] = "";
    double t0 = cairn_now();
    const cairn_runtime_config rcfg = cli_spec_runtime_config(&o->model, &o->draft);
    if (cairn_runtime_open(&rcfg, &rt, err, sizeof err) != CAIRN_OK) {
        fprintf(stderr, "cairn: cannot load model: %s\n", err);
        return NULL;
    }
    const cairn_hparams *hp = cairn_runtime_hparams(rt);
    char shape[192];
    cairn_log(CAIRN_LOG_INFO, "model %s: %s, vocab %d; loaded in %.2f s on %s (%d threads)",
              hp->name, cairn_hparams_describe(hp, shape, sizeof shape), hp->n_vocab,
              cairn_now() - t0, cairn_runtime_backend(rt)->iface->name,
              cairn_runtime_threads(rt));
    return rt;
}

/* The generation request: the prompt's tokens and the options' settings.
 * Takes the grammar and the prompt file's text out of *in (the request
 * owns the one, the other is no longer needed). */
static int make_run_request(cairn_runtime *rt, const run_opts *o, run_inputs *in,
                            cairn_request **out)
{
    const cairn_vocab *vocab = cairn_runtime_vocab(rt);
    int flags = (!o->no_bos && cairn_vocab_add_bos(vocab) ? CAIRN_TOK_ADD_BOS : 0) |
                (o->parse_special ? CAIRN_TOK_PARSE_SPECIAL : 0);
    cairn_request *req = cairn_request_new(CAIRN_REQ_GENERATE);
    int rc = req ? prompt_tokens(rt, o->chat, o->system, in->prompt, in->prompt_len, flags,
                                 &req->tokens, &req->n_tokens)
                 : CAIRN_ENOMEM;
    free(in->file_text);
    in->file_text = NULL;
    if (rc == CAIRN_OK && req->n_tokens == 0) {
        fprintf(stderr, "cairn run: the prompt is empty\n");
        rc = CAIRN_EINVAL;
    }
    if (rc != CAIRN_OK) {
        cairn_request_free(req);
        return rc;
    }
    const cairn_sampling_params *sp = &o->sampling;
    req->gen.max_tokens = o->n_predict;
    req->gen.sampling = *sp;
    req->gen.sampling.n_logprobs = o->show_top;
    req->gen.logprobs = o->show_top > 0;
    req->gen.grammar = in->grammar; /* the request owns it now */
    in->grammar = NULL;
    req->gen.stream = true;
    req->gen.ignore_eos = o->ignore_eos;
    cairn_log(CAIRN_LOG_INFO, "prompt: %zu tokens; sampling: temp %.2f top-k %d top-p %.2f "
              "min-p %.2f seed %llu", req->n_tokens, sp->temperature, sp->top_k, sp->top_p,
              sp->min_p, (unsigned long long)sp->seed);
    *out = req;
    return CAIRN_OK;
}

/* The timings to stderr once the generation has ended well. */
static void report_run(const run_state *st, bool speculative)
{
    if (st->eog_token >= 0)
        cairn_log(CAIRN_LOG_INFO, "end-of-generation token %d after %lld tokens", st->eog_token,
                  (long long)st->n_gen);
    cairn_log(CAIRN_LOG_INFO, "prompt: %lld tokens in %.3f s (%.1f tok/s); generated %lld "
              "tokens in %.3f s (%.1f tok/s); finish: %s", (long long)st->n_prompt,
              st->prompt_s, st->n_prompt / (st->prompt_s > 0 ? st->prompt_s : 1e-9),
              (long long)st->n_gen, st->decode_s,
              st->n_gen / (st->decode_s > 0 ? st->decode_s : 1e-9), st->finish);
    if (speculative)
        cairn_log(CAIRN_LOG_INFO, "speculative (%s): %lld target forwards, tau %.2f tokens per "
                  "forward; %lld of %lld draft tokens accepted",
                  st->spec_method[0] ? st->spec_method : "none", (long long)st->spec_forwards,
                  st->spec_forwards ? (double)st->spec_tokens / st->spec_forwards : 0.0,
                  (long long)st->spec_accepted, (long long)st->spec_drafted);
}

/* Load the model, generate, report: the exit status. */
static int run_generation(const run_opts *o, run_inputs *in)
{
    cairn_runtime *rt = open_run_runtime(o);
    if (!rt)
        return 1;
    cairn_request *req = NULL;
    int rc = make_run_request(rt, o, in, &req);
    if (rc != CAIRN_OK) {
        cairn_runtime_close(rt);
        return 1;
    }
    run_state st = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER,
                    .verbose = o->verbose, .show_top = o->show_top,
                    .vocab = cairn_runtime_vocab(rt)};
    rc = generate(rt, &o->model, &o->draft, req, &st);
    printf("\n");
    fflush(stdout);
    if (rc == CAIRN_OK)
        report_run(&st, cli_draft_opts_active(&o->draft));
    cairn_runtime_close(rt);
    return rc == CAIRN_OK ? 0 : 1;
}

int cmd_run(int argc, char **argv)
{
    run_opts o;
    int status = parse_run_opts(&o, argc, argv);
    if (status != CLI_PROCEED)
        return status;
    run_inputs in = {0};
    status = prepare_run(&o, &in);
    if (status == CLI_PROCEED)
        status = run_generation(&o, &in);
    run_inputs_free(&in);
    return status;
}
