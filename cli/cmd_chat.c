/*
 * cli/cmd_chat.c — `cairn chat`: an interactive conversation in the terminal
 * on the model's chat template.
 *
 * A client of the session service, in process, as `run` is (session/: the
 * same decode loop, sampling and prefix cache `serve` runs; no loop here).
 * The conversation is kept here as messages; every turn renders all of them
 * with the template and sends the whole prompt:
 *   - an unnamed conversation as a plain generation: its earlier turns are
 *     found in the prefix cache (the radix tree), not recomputed;
 *   - a named one (/save NAME, /load NAME) as SESSION_SYNC on the session
 *     of that name, the service's named sessions (the ones HTTP's session_id
 *     reaches), whose note holds the messages (JSON, below). With
 *     --cache-dir the service writes every session's record and flushes
 *     its pages when it stops and reads them back when it starts, so /load
 *     after a restart finds the messages in the note and the history's KV
 *     pages on disk: the next turn computes only what is new.
 * The reply streams to stdout as it is generated; Ctrl-C cancels it (a
 * CANCEL request), and the partial reply stays in the conversation. The
 * prompt is read by cli/chat_edit.c (line editing and history).
 *
 * The note: {"format":"cairn-chat/1","system":TEXT|null,
 *            "messages":[{"role":"user"|"assistant","content":TEXT},...]}
 */
#include "cli/chat_edit.h"
#include "cli/cli.h"
#include "session/session.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char help[] =
    "usage: cairn chat -m MODEL [options]\n\n"
    "An interactive chat on the model's chat template: the reply streams as it is\n"
    "generated; the line is edited in place (arrows, Home/End, Ctrl-A/E/K/U/W) and\n"
    "Up/Down walk the lines entered. Ctrl-C stops a reply; Ctrl-C on an empty line,\n"
    "or Ctrl-D, exits.\n\n"
    "Commands at the prompt:\n"
    "  /system [TEXT]   set the system prompt (no TEXT: show it; '-': the template's default)\n"
    "  /reset           start a new conversation (a saved one stays saved)\n"
    "  /fork [NAME]     go on in a copy of the conversation (saved as NAME if given);\n"
    "                   the original stays as it was\n"
    "  /save NAME       name the conversation; it is kept under NAME from now on\n"
    "  /load NAME       go on with the conversation saved as NAME\n"
    "  /stats           the last turn's tokens (cached by tier) and the cache's figures\n"
    "  /help            this list; /quit exits\n\n"
    "Options:\n"
    "      --system TEXT        the system prompt (default: the template's)\n"
    "      --cache-dir DIR      disk tier: saved conversations and their KV pages survive\n"
    "                           the program (resume with /load NAME or --load NAME)\n"
    "      --load NAME          start with the conversation saved as NAME\n"
    "      --tier-loads P       measured (default), always or never: when cached pages on\n"
    "                           disk are loaded rather than recomputed\n"
    "  -n, --n-predict N        tokens per reply at most (default 1024)\n"
    "      --temp T             temperature, 0 = greedy (default 0.8)\n"
    "      --seed S             sampling seed (default: random)\n"
    "      --top-k K, --top-p P, --min-p P, --repeat-penalty R   (as in `cairn run`)\n"
    "  -v, --verbose            the engine's log lines on stderr\n"
    CLI_MODEL_HELP
    "  -h, --help               this help\n";

enum { OPT_TEMP = 2000, OPT_SEED, OPT_TOPK, OPT_TOPP, OPT_MINP, OPT_REPEAT, OPT_SYSTEM,
       OPT_CACHE_DIR, OPT_LOAD, OPT_TIER_LOADS };

#define CHAT_CLIENT 1 /* the one connection id of this client */
#define NOTE_FORMAT "cairn-chat/1"

typedef struct {
    cli_model_opts model;
    cairn_sampling_params sampling;
    bool verbose;
    int n_predict;
    const char *system, *cache_dir, *load;
    cairn_load_policy load_policy;
} chat_opts;

/* ---- signals ------------------------------------------------------------------ */

static volatile sig_atomic_t g_sigint, g_quit;

static void on_sigint(int sig)
{
    (void)sig;
    g_sigint = 1;
}

static void on_quit(int sig)
{
    (void)sig;
    g_quit = 1;
}

/* SIGINT, SIGTERM and SIGHUP blocked (block) or taken by this thread. The
 * engine's and the runtime's threads start with them blocked, so the main
 * thread is the one interrupted: its read or wait sees the flag. */
static void signals_mask(int how)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(how, &set, NULL);
}

static void signals_install(void)
{
    struct sigaction sa = {0};
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = on_sigint; /* no SA_RESTART: a blocked read returns */
    sigaction(SIGINT, &sa, NULL);
    sa.sa_handler = on_quit;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

/* ---- the service: one request at a time ------------------------------------------ */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    cairn_service *svc;
    uint64_t next_id, want_id;
    bool done, failed, echo;
    char error[256];
    /* DONE(generation) */
    char finish[16];
    int64_t prompt_tokens, cached_tokens, completion_tokens, cached_by_tier[4];
    double prompt_s, decode_s;
    /* DONE(session) */
    cairn_session_id session;
    int64_t n_session_tokens;
    char *note;
    size_t note_len;
    bool has_note;
    /* DONE(stats) */
    cairn_service_stats stats;
    /* the reply as it streamed */
    char *text;
    size_t text_len, text_cap;
    bool text_ends_line;
    /* a template whose replies are in channels (gpt-oss's harmony): the
     * reply is read as it streams, its reasoning shown apart (faint on a
     * terminal) and only its content kept in the conversation */
    const cairn_chat_template *channels;
    cairn_chat_reply_cursor cursor;
    int shown; /* the kind of the last part shown (0: none yet) */
} engine;

static bool g_dim_out; /* stdout is a terminal: reasoning in faint text */

static void engine_text(engine *e, const char *s, size_t n)
{
    if (e->text_len + n + 1 > e->text_cap) {
        size_t cap = e->text_cap ? e->text_cap : 256;
        while (cap < e->text_len + n + 1)
            cap *= 2;
        char *t = realloc(e->text, cap);
        if (!t)
            return;
        e->text = t;
        e->text_cap = cap;
    }
    memcpy(e->text + e->text_len, s, n);
    e->text_len += n;
    e->text[e->text_len] = '\0';
}

/* A reply in channels: what has settled since the last call (`done`: all
 * of it), reasoning faint and set off from the content by a blank line,
 * tool calls (there are no tools here) as a note of their name. */
static void show_parts(engine *e, bool done)
{
    cairn_chat_reply_part part;
    while (cairn_chat_reply_next(e->channels, &e->cursor, e->text ? e->text : "", e->text_len,
                                 done, &part)) {
        const char *t = e->text + part.off;
        if (part.kind == CAIRN_REPLY_CALL) {
            printf("%s[a call to %.*s]%s\n", g_dim_out ? "\x1b[2m" : "", (int)part.name_len,
                   e->text + part.name_off, g_dim_out ? "\x1b[0m" : "");
            e->text_ends_line = true;
            continue;
        }
        if (part.len == 0)
            continue;
        if ((int)part.kind != e->shown) {
            if (e->shown == CAIRN_REPLY_REASONING) /* its end */
                fputs(g_dim_out ? "\x1b[0m\n\n" : "\n\n", stdout);
            else if (part.kind == CAIRN_REPLY_REASONING && g_dim_out)
                fputs("\x1b[2m", stdout);
            e->shown = part.kind;
        }
        fwrite(t, 1, part.len, stdout);
        e->text_ends_line = t[part.len - 1] == '\n';
    }
    if (done && e->shown == CAIRN_REPLY_REASONING && g_dim_out)
        fputs("\x1b[0m", stdout);
    fflush(stdout);
}

static void on_event(const cairn_event *ev, void *user)
{
    engine *e = user;
    pthread_mutex_lock(&e->mu);
    if (ev->id != e->want_id) { /* a CANCEL's own answer */
        pthread_mutex_unlock(&e->mu);
        return;
    }
    if (ev->kind == CAIRN_EV_DELTA) {
        if (ev->text_len) {
            engine_text(e, ev->text, ev->text_len);
            if (e->echo && e->channels) {
                show_parts(e, false);
            } else if (e->echo) {
                fwrite(ev->text, 1, ev->text_len, stdout);
                fflush(stdout);
                e->text_ends_line = ev->text[ev->text_len - 1] == '\n';
            }
        }
        pthread_mutex_unlock(&e->mu);
        return;
    }
    if (ev->kind == CAIRN_EV_ERROR) {
        e->failed = true;
        snprintf(e->error, sizeof e->error, "%s",
                 ev->message ? ev->message : cairn_strerror(ev->code));
    } else if (ev->what == CAIRN_DONE_GENERATION) {
        snprintf(e->finish, sizeof e->finish, "%s", ev->finish_reason ? ev->finish_reason : "");
        e->prompt_tokens = ev->prompt_tokens;
        e->cached_tokens = ev->cached_tokens;
        e->completion_tokens = ev->completion_tokens;
        memcpy(e->cached_by_tier, ev->cached_by_tier, sizeof e->cached_by_tier);
        e->prompt_s = ev->prompt_seconds;
        e->decode_s = ev->decode_seconds;
    } else if (ev->what == CAIRN_DONE_SESSION) {
        e->session = ev->session;
        e->n_session_tokens = ev->n_session_tokens;
        free(e->note);
        e->note = NULL;
        e->note_len = 0;
        e->has_note = ev->note != NULL;
        if (ev->note && (e->note = malloc(ev->note_len + 1))) {
            memcpy(e->note, ev->note, ev->note_len);
            e->note[ev->note_len] = '\0';
            e->note_len = ev->note_len;
        }
    } else if (ev->what == CAIRN_DONE_STATS) {
        e->stats = ev->stats;
    }
    e->done = true;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

/* Submit r and wait for its answer; with `cancellable`, SIGINT cancels it
 * (the answer still comes: a generation's DONE with finish "cancelled").
 * CAIRN_OK, or an error whose message is in e->error. */
static int engine_call(engine *e, cairn_request *r, bool cancellable)
{
    pthread_mutex_lock(&e->mu);
    r->client = CHAT_CLIENT;
    r->id = e->want_id = ++e->next_id;
    e->done = e->failed = false;
    e->error[0] = '\0';
    e->text_len = 0;
    e->text_ends_line = true;
    pthread_mutex_unlock(&e->mu);
    if (cancellable)
        g_sigint = 0;
    uint64_t target = r->id;
    int rc = cairn_service_submit(e->svc, r);
    if (rc != CAIRN_OK) {
        snprintf(e->error, sizeof e->error, "%s", cairn_strerror(rc));
        return rc;
    }
    bool cancel_sent = false;
    pthread_mutex_lock(&e->mu);
    while (!e->done) {
        if (cancellable && !cancel_sent && (g_sigint || g_quit)) {
            pthread_mutex_unlock(&e->mu);
            cairn_request *c = cairn_request_new(CAIRN_REQ_CANCEL);
            if (c) {
                c->client = CHAT_CLIENT;
                c->id = ++e->next_id; /* never waited for: on_event ignores it */
                c->target = target;
                cairn_service_submit(e->svc, c);
            }
            cancel_sent = true;
            pthread_mutex_lock(&e->mu);
            continue;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&e->cv, &e->mu, &ts);
    }
    rc = e->failed ? CAIRN_EINVAL : CAIRN_OK;
    pthread_mutex_unlock(&e->mu);
    g_sigint = 0;
    return rc;
}

/* A request by session name: key copied into it. NULL when out of memory. */
static cairn_request *named_request(cairn_req_kind kind, const char *name)
{
    cairn_request *r = cairn_request_new(kind);
    if (!r)
        return NULL;
    r->session_key_len = strlen(name);
    if (!(r->session_key = strdup(name))) {
        cairn_request_free(r);
        return NULL;
    }
    return r;
}

/* ---- the conversation --------------------------------------------------------- */

typedef struct {
    char *role, *content;
} chat_msg;

typedef struct {
    chat_msg *msgs;
    size_t n, cap;
    char *system; /* NULL: the template's default */
    char *name;   /* NULL: not saved */
    bool have_turn;
    /* the last turn */
    int64_t prompt_tokens, cached_tokens, completion_tokens, cached_by_tier[4];
    double prompt_s, decode_s;
} conversation;

static int conv_push(conversation *c, const char *role, const char *content)
{
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 16;
        chat_msg *v = realloc(c->msgs, cap * sizeof *v);
        if (!v)
            return CAIRN_ENOMEM;
        c->msgs = v;
        c->cap = cap;
    }
    chat_msg m = {strdup(role), strdup(content)};
    if (!m.role || !m.content) {
        free(m.role);
        free(m.content);
        return CAIRN_ENOMEM;
    }
    c->msgs[c->n++] = m;
    return CAIRN_OK;
}

static void conv_pop(conversation *c)
{
    if (c->n) {
        c->n--;
        free(c->msgs[c->n].role);
        free(c->msgs[c->n].content);
    }
}

static void conv_clear(conversation *c)
{
    while (c->n)
        conv_pop(c);
    free(c->name);
    c->name = NULL;
}

static void set_str(char **dst, const char *src)
{
    free(*dst);
    *dst = src ? strdup(src) : NULL;
}

/* The whole conversation in the template, the assistant's turn opened when
 * `generation` (the next reply's prompt), else closed after the last
 * message (what a saved session holds). */
static int conv_tokens(const conversation *c, const cairn_service *svc, bool generation,
                       int32_t **ids, size_t *n)
{
    cairn_chat_message *m = calloc(c->n + 1, sizeof *m);
    if (!m)
        return CAIRN_ENOMEM;
    size_t k = 0;
    if (c->system)
        m[k++] = (cairn_chat_message){.role = "system", .content = c->system};
    for (size_t i = 0; i < c->n; i++)
        m[k++] = (cairn_chat_message){.role = c->msgs[i].role, .content = c->msgs[i].content};
    const cairn_vocab *v = cairn_service_vocab(svc);
    int flags = (generation ? CAIRN_CHAT_GENERATION_PROMPT : 0) |
                (cairn_vocab_add_bos(v) ? CAIRN_CHAT_ADD_BOS : 0);
    int rc = cairn_chat_tokenize(cairn_service_chat_template(svc), v, m, k, NULL, flags, ids, n);
    free(m);
    return rc;
}

static char *conv_note(const conversation *c, size_t *len)
{
    json_t *o = json_object(), *msgs = json_array();
    if (!o || !msgs) {
        json_decref(o);
        json_decref(msgs);
        return NULL;
    }
    json_object_set_new(o, "format", json_string(NOTE_FORMAT));
    json_object_set_new(o, "system", c->system ? json_string(c->system) : json_null());
    for (size_t i = 0; i < c->n; i++)
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", c->msgs[i].role, "content",
                                              c->msgs[i].content));
    json_object_set_new(o, "messages", msgs);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    *len = s ? strlen(s) : 0;
    return s;
}

/* The messages of a note into *c (its name left alone); CAIRN_EFORMAT when
 * the note is not a chat's. */
static int conv_from_note(conversation *c, const char *note, size_t len)
{
    json_error_t jerr;
    json_t *o = json_loadb(note, len, 0, &jerr);
    json_t *fmt = json_object_get(o, "format"), *msgs = json_object_get(o, "messages");
    json_t *sys = json_object_get(o, "system");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), NOTE_FORMAT) != 0 ||
        !json_is_array(msgs)) {
        json_decref(o);
        return CAIRN_EFORMAT;
    }
    char *name = c->name;
    c->name = NULL;
    conv_clear(c);
    c->name = name;
    set_str(&c->system, json_is_string(sys) ? json_string_value(sys) : NULL);
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        const char *content = json_string_value(json_object_get(m, "content"));
        if (role && content)
            conv_push(c, role, content);
    }
    json_decref(o);
    return CAIRN_OK;
}

/* ---- output ---------------------------------------------------------------------- */

static bool g_dim; /* stderr is a terminal: notes in faint text */

static void note_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note_line(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    if (g_dim)
        fputs("\x1b[2m", stderr);
    vfprintf(stderr, fmt, ap);
    if (g_dim)
        fputs("\x1b[0m", stderr);
    fputc('\n', stderr);
    fflush(stderr);
    va_end(ap);
}

static void print_turn_stats(const conversation *c)
{
    const int64_t *t = c->cached_by_tier;
    double tps = c->decode_s > 0 ? (double)(c->completion_tokens - 1) / c->decode_s : 0;
    note_line("[prompt %lld tokens, %lld cached (device %lld, host %lld, disk %lld); reply %lld "
              "tokens, %.1f tok/s; first token %.2f s]",
              (long long)c->prompt_tokens, (long long)c->cached_tokens, (long long)t[0],
              (long long)t[1], (long long)t[2], (long long)c->completion_tokens,
              tps > 0 ? tps : 0, c->prompt_s);
}

/* ---- commands -------------------------------------------------------------------- */

typedef struct {
    engine *e;
    conversation conv;
    const chat_opts *o;
} chat;

/* The note of a named conversation brought up to date. */
static int update_note(chat *ch)
{
    if (!ch->conv.name)
        return CAIRN_OK;
    cairn_request *r = named_request(CAIRN_REQ_SESSION_NOTE, ch->conv.name);
    if (!r)
        return CAIRN_ENOMEM;
    r->note = conv_note(&ch->conv, &r->note_len);
    if (!r->note) {
        cairn_request_free(r);
        return CAIRN_ENOMEM;
    }
    int rc = engine_call(ch->e, r, false);
    if (rc != CAIRN_OK)
        note_line("cannot keep the conversation with '%s': %s", ch->conv.name, ch->e->error);
    return rc;
}

/* One user message and the streamed reply. */
static void turn(chat *ch, const char *text)
{
    conversation *c = &ch->conv;
    if (conv_push(c, "user", text) != CAIRN_OK)
        return;
    cairn_request *r = c->name ? named_request(CAIRN_REQ_SESSION_SYNC, c->name)
                               : cairn_request_new(CAIRN_REQ_GENERATE);
    if (r && c->name)
        r->persist = ch->o->cache_dir != NULL; /* saved: kept through a crash too */
    int rc = r ? conv_tokens(c, ch->e->svc, true, &r->tokens, &r->n_tokens) : CAIRN_ENOMEM;
    if (rc != CAIRN_OK) {
        note_line("cannot format the conversation: %s", cairn_strerror(rc));
        cairn_request_free(r);
        conv_pop(c);
        return;
    }
    r->gen.max_tokens = ch->o->n_predict;
    r->gen.sampling = ch->o->sampling;
    r->gen.stream = true;
    memset(&ch->e->cursor, 0, sizeof ch->e->cursor);
    ch->e->shown = 0;
    ch->e->echo = true;
    rc = engine_call(ch->e, r, true);
    ch->e->echo = false;
    engine *e = ch->e;
    if (e->channels) /* the rest, now that the reply is whole */
        show_parts(e, true);
    if (!e->text_ends_line)
        fputc('\n', stdout);
    fflush(stdout);
    if (rc != CAIRN_OK) {
        note_line("error: %s", e->error);
        conv_pop(c);
        return;
    }
    /* a stopped reply stays as far as it went: that is what the model saw
     * (in channels, its content: the template renders the turn's markers
     * itself, and drops an earlier turn's reasoning as the model was
     * trained) */
    char *reasoning = NULL, *calls = NULL, *content = NULL;
    if (e->channels && cairn_chat_parse_reply(e->channels, e->text ? e->text : "", e->text_len,
                                              NULL, "call_", &reasoning, &calls,
                                              &content) != CAIRN_OK)
        content = NULL;
    conv_push(c, "assistant", content ? content : e->text ? e->text : "");
    free(reasoning);
    free(calls);
    free(content);
    c->have_turn = true;
    c->prompt_tokens = e->prompt_tokens;
    c->cached_tokens = e->cached_tokens;
    c->completion_tokens = e->completion_tokens;
    memcpy(c->cached_by_tier, e->cached_by_tier, sizeof c->cached_by_tier);
    c->prompt_s = e->prompt_s;
    c->decode_s = e->decode_s;
    if (strcmp(e->finish, "cancelled") == 0)
        note_line("[stopped]");
    else if (strcmp(e->finish, "length") == 0)
        note_line("[the reply reached its limit of %d tokens (-n)]", ch->o->n_predict);
    print_turn_stats(c);
    update_note(ch);
}

static bool valid_name(const char *name)
{
    size_t n = strlen(name);
    return n > 0 && n <= 1024;
}

/* The conversation as it is kept under `name` from now on. */
static void cmd_save(chat *ch, const char *name)
{
    if (!valid_name(name)) {
        note_line("usage: /save NAME (1 to 1024 bytes)");
        return;
    }
    conversation *c = &ch->conv;
    cairn_request *r = named_request(CAIRN_REQ_SESSION_SYNC, name);
    if (r) /* with a disk tier, saved means durable: it survives a crash */
        r->persist = ch->o->cache_dir != NULL;
    int rc = r ? conv_tokens(c, ch->e->svc, false, &r->tokens, &r->n_tokens) : CAIRN_ENOMEM;
    if (rc != CAIRN_OK) {
        note_line("cannot format the conversation: %s", cairn_strerror(rc));
        cairn_request_free(r);
        return;
    }
    /* the session brought to the conversation, nothing generated: its pages
     * are the ones the turns computed (the prefix cache finds them) */
    r->gen.max_tokens = 0;
    if (engine_call(ch->e, r, false) != CAIRN_OK) {
        note_line("cannot save as '%s': %s", name, ch->e->error);
        return;
    }
    set_str(&c->name, name);
    if (update_note(ch) != CAIRN_OK)
        return;
    note_line("saved as '%s' (%zu messages, %lld tokens)%s", name, c->n,
              (long long)ch->e->n_session_tokens,
              ch->o->cache_dir ? "; /load it later, also after a restart with this --cache-dir"
                               : "; kept until exit (--cache-dir DIR keeps it longer)");
}

static void replay(const conversation *c)
{
    for (size_t i = 0; i < c->n; i++) {
        if (strcmp(c->msgs[i].role, "user") == 0)
            printf("> %s\n", c->msgs[i].content);
        else {
            size_t n = strlen(c->msgs[i].content);
            printf("%s%s", c->msgs[i].content, n && c->msgs[i].content[n - 1] == '\n' ? "" : "\n");
        }
    }
    fflush(stdout);
}

static void cmd_load(chat *ch, const char *name)
{
    if (!valid_name(name)) {
        note_line("usage: /load NAME");
        return;
    }
    cairn_request *r = named_request(CAIRN_REQ_SESSION_INFO, name);
    if (!r || engine_call(ch->e, r, false) != CAIRN_OK) {
        note_line("no conversation named '%s'%s", name,
                  ch->o->cache_dir ? "" : " (without --cache-dir, only this run's)");
        return;
    }
    engine *e = ch->e;
    conversation next = {0};
    if (!e->has_note || conv_from_note(&next, e->note, e->note_len) != CAIRN_OK) {
        note_line("'%s' is a session without a chat transcript (another client's)", name);
        return;
    }
    conv_clear(&ch->conv);
    free(ch->conv.system);
    free(ch->conv.msgs);
    ch->conv = next;
    set_str(&ch->conv.name, name);
    replay(&ch->conv);
    note_line("loaded '%s': %zu messages, %lld tokens in its session", name, ch->conv.n,
              (long long)e->n_session_tokens);
}

static void cmd_stats(chat *ch)
{
    const conversation *c = &ch->conv;
    note_line("conversation: %s, %zu messages; system prompt: %s", c->name ? c->name : "(unsaved)",
              c->n, c->system ? c->system : "(the template's)");
    if (c->have_turn)
        print_turn_stats(c);
    cairn_request *r = cairn_request_new(CAIRN_REQ_CACHE_STATS);
    if (!r || engine_call(ch->e, r, false) != CAIRN_OK)
        return;
    const cairn_service_stats *s = &ch->e->stats;
    note_line("cache: %llu prompt tokens asked for, %llu served from the cache (device %llu, "
              "host %llu, disk %llu); %llu generated",
              (unsigned long long)s->prompt_tokens, (unsigned long long)s->cached_tokens,
              (unsigned long long)s->cached_tokens_by_tier[0],
              (unsigned long long)s->cached_tokens_by_tier[1],
              (unsigned long long)s->cached_tokens_by_tier[2],
              (unsigned long long)s->generated_tokens);
    note_line("pages (%d tokens each): device %llu (%llu of %llu free), host %llu, disk %llu; "
              "sessions %llu", cairn_service_page_size(ch->e->svc),
              (unsigned long long)s->tiers[0].pages, (unsigned long long)s->device_pages_free,
              (unsigned long long)s->device_pages_total, (unsigned long long)s->tiers[1].pages,
              (unsigned long long)s->tiers[2].pages, (unsigned long long)s->sessions);
}

static const char *skip_space(const char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    return s;
}

/* A line that starts with '/': false when it asks to exit. */
static bool command(chat *ch, const char *line)
{
    const char *p = line + 1;
    size_t n = strcspn(p, " \t");
    const char *arg = skip_space(p + n);
    char argbuf[1100];
    snprintf(argbuf, sizeof argbuf, "%s", arg);
    for (size_t k = strlen(argbuf); k > 0 && (argbuf[k - 1] == ' ' || argbuf[k - 1] == '\t');)
        argbuf[--k] = '\0';
#define IS(w) (n == strlen(w) && strncmp(p, w, n) == 0)
    conversation *c = &ch->conv;
    if (IS("quit") || IS("exit") || IS("bye"))
        return false;
    if (IS("help") || IS("?")) {
        const char *cmds = strstr(help, "Commands at the prompt:\n");
        const char *end = strstr(help, "Options:\n");
        fwrite(cmds, 1, (size_t)(end - cmds), stdout);
    } else if (IS("system")) {
        if (!arg[0])
            note_line("system prompt: %s", c->system ? c->system : "(the template's default)");
        else {
            set_str(&c->system, strcmp(arg, "-") == 0 ? NULL : arg);
            note_line("system prompt %s", c->system ? "set" : "back to the template's default");
            update_note(ch);
        }
    } else if (IS("reset")) {
        const char *was = c->name;
        if (was)
            note_line("'%s' stays saved; a new conversation begins", was);
        else
            note_line("a new conversation begins");
        conv_clear(c);
        c->have_turn = false;
    } else if (IS("fork")) {
        char *was = c->name;
        c->name = NULL;
        note_line("forked: this copy goes on%s%s%s", was ? ", '" : "", was ? was : "",
                  was ? "' stays as it was" : "");
        free(was);
        if (argbuf[0])
            cmd_save(ch, argbuf);
    } else if (IS("save")) {
        cmd_save(ch, argbuf);
    } else if (IS("load")) {
        cmd_load(ch, argbuf);
    } else if (IS("stats")) {
        cmd_stats(ch);
    } else {
        note_line("unknown command '/%.*s' (/help lists them)", (int)n, p);
    }
#undef IS
    return true;
}

static void chat_loop(chat *ch)
{
    chat_history hist = {.max = 1000};
    for (;;) {
        char *line = NULL;
        int st = chat_edit_read("> ", &hist, &g_quit, &g_sigint, &line);
        if (st == CHAT_EDIT_EOF || g_quit)
            break;
        if (st == CHAT_EDIT_INTERRUPT) {
            /* Ctrl-C on text drops it; on an empty line it exits */
            bool had_text = line && line[0];
            free(line);
            if (had_text)
                continue;
            break;
        }
        const char *text = skip_space(line);
        if (!text[0]) {
            free(line);
            continue;
        }
        chat_history_add(&hist, line);
        bool go_on = true;
        if (text[0] == '/' && text[1] != '/')
            go_on = command(ch, text);
        else
            turn(ch, text[0] == '/' ? text + 1 : text); /* "//x" says "/x" */
        free(line);
        if (!go_on || g_quit)
            break;
    }
    chat_history_free(&hist);
}

/* ---- options and set-up ------------------------------------------------------------ */

static int parse_chat_opt(chat_opts *o, int opt, const char *arg)
{
    cairn_sampling_params *sp = &o->sampling;
    switch (opt) {
    case 'n': return cli_parse_int(arg, "-n", 1, 1 << 24, &o->n_predict);
    case 'v': o->verbose = true; return 1;
    case OPT_TEMP: return cli_parse_float("cairn chat", arg, "--temp", &sp->temperature);
    case OPT_TOPK: return cli_parse_int(arg, "--top-k", 0, 1 << 24, &sp->top_k);
    case OPT_TOPP: return cli_parse_float("cairn chat", arg, "--top-p", &sp->top_p);
    case OPT_MINP: return cli_parse_float("cairn chat", arg, "--min-p", &sp->min_p);
    case OPT_REPEAT: return cli_parse_float("cairn chat", arg, "--repeat-penalty", &sp->repeat_penalty);
    case OPT_SEED: return cli_parse_seed("cairn chat", arg, &sp->seed);
    case OPT_SYSTEM: o->system = arg; return 1;
    case OPT_CACHE_DIR: o->cache_dir = arg; return 1;
    case OPT_LOAD: o->load = arg; return 1;
    case OPT_TIER_LOADS: return cli_parse_load_policy("cairn chat", arg, &o->load_policy);
    default: return 0;
    }
}

static int parse_chat_opts(chat_opts *o, int argc, char **argv)
{
    static const struct option longopts[] = {
        CLI_MODEL_LONGOPTS,
        {"n-predict", required_argument, 0, 'n'},
        {"temp", required_argument, 0, OPT_TEMP},
        {"seed", required_argument, 0, OPT_SEED},
        {"top-k", required_argument, 0, OPT_TOPK},
        {"top-p", required_argument, 0, OPT_TOPP},
        {"min-p", required_argument, 0, OPT_MINP},
        {"repeat-penalty", required_argument, 0, OPT_REPEAT},
        {"system", required_argument, 0, OPT_SYSTEM},
        {"cache-dir", required_argument, 0, OPT_CACHE_DIR},
        {"load", required_argument, 0, OPT_LOAD},
        {"tier-loads", required_argument, 0, OPT_TIER_LOADS},
        {"verbose", no_argument, 0, 'v'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    memset(o, 0, sizeof *o);
    cli_model_opts_defaults(&o->model);
    o->sampling = cairn_sampling_defaults();
    o->sampling.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    o->n_predict = 1024;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, CLI_MODEL_SHORTOPTS "n:vh", longopts, NULL)) != -1) {
        int r = cli_model_opts_parse(&o->model, opt, optarg);
        if (r == 0)
            r = parse_chat_opt(o, opt, optarg);
        if (r < 0)
            return 2;
        if (r == 0)
            return cli_help_or_usage(opt, help);
    }
    return cli_no_operands("cairn chat", argc, argv);
}

/* Load the model and start the service on it; the signals stay blocked in
 * every thread this starts. */
static int start(const chat_opts *o, cairn_runtime **rt, engine *e)
{
    char err[512] = "";
    const cairn_runtime_config rcfg = cli_runtime_config(&o->model, NULL);
    if (cairn_runtime_open(&rcfg, rt, err, sizeof err) != CAIRN_OK) {
        fprintf(stderr, "cairn: cannot load model: %s\n", err);
        return 1;
    }
    const cairn_hparams *hp = cairn_runtime_hparams(*rt);
    cairn_service_config cfg = {
        .runtime = *rt, .page_size = o->model.page_size, .kv_type = o->model.kv_type,
        .n_ctx = o->model.n_ctx > 0 ? o->model.n_ctx
                                    : (hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096),
        .max_batch_tokens = o->model.batch, .max_seqs = 1, .prefill_chunk = o->model.batch,
        .cache_dir = o->cache_dir, .load_policy = o->load_policy, .on_event = on_event,
        .user = e};
    int rc = cairn_service_start(&cfg, &e->svc, err, sizeof err);
    if (rc != CAIRN_OK) {
        fprintf(stderr, "cairn chat: %s\n", err[0] ? err : cairn_strerror(rc));
        cairn_runtime_close(*rt);
        *rt = NULL;
        return 1;
    }
    const cairn_chat_template *t = cairn_service_chat_template(e->svc);
    e->channels = t && cairn_chat_reply_has_channels(t) ? t : NULL;
    note_line("cairn chat: %s (%s, %s template%s, context %d tokens)%s%s", hp->name, hp->arch,
              cairn_chat_family_name(cairn_chat_template_family(t)),
              cairn_chat_template_thinks(t) ? " that thinks first" : "", cairn_service_n_ctx(e->svc),
              o->cache_dir ? ", saved conversations in " : "", o->cache_dir ? o->cache_dir : "");
    note_line("/help for the commands; Ctrl-C stops a reply; Ctrl-D exits");
    return 0;
}

int cmd_chat(int argc, char **argv)
{
    chat_opts o;
    int status = parse_chat_opts(&o, argc, argv);
    if (status != CLI_PROCEED)
        return status;
    if (!o.verbose)
        cairn_log_set_level(CAIRN_LOG_WARN);
    g_dim = isatty(STDERR_FILENO);
    g_dim_out = isatty(STDOUT_FILENO);
    signals_install();
    signals_mask(SIG_BLOCK);
    engine e = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    cairn_runtime *rt = NULL;
    status = start(&o, &rt, &e);
    signals_mask(SIG_UNBLOCK);
    if (status != 0)
        return status;
    chat ch = {.e = &e, .o = &o};
    set_str(&ch.conv.system, o.system);
    if (o.load)
        cmd_load(&ch, o.load);
    chat_loop(&ch);
    /* stopping writes every session's record and flushes the pages
     * (--cache-dir): what /load finds next time */
    signals_mask(SIG_BLOCK);
    cairn_service_stop(e.svc);
    cairn_runtime_close(rt);
    conv_clear(&ch.conv);
    free(ch.conv.system);
    free(ch.conv.msgs);
    free(e.text);
    free(e.note);
    return 0;
}
