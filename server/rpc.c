/*
 * protocol/rpc.c — requests in, responses out: decoding one scanned message
 * into a validated cairn_rpc_call, and packing results with msgpack-c.
 *
 * Decoding never trusts the client: every field is checked for its type and
 * range before it is used, token ids against the vocabulary, counts against
 * the context size, and text is tokenized into a buffer bounded by the limit
 * that applies (so a long text cannot make us allocate more than that limit
 * allows). Unknown parameter names are ignored, so clients may send fields
 * that a later server understands; a nil value counts as absent.
 */
#include "server/server.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STOP_BYTES 256

/* ---- errors --------------------------------------------------------------- */

int cairn_rpc_error_code(int status)
{
    switch (status) {
    case CAIRN_EINVAL:
    case CAIRN_EFORMAT: return CAIRN_RPC_INVALID_REQUEST;
    case CAIRN_ERANGE: return CAIRN_RPC_TOO_LARGE;
    case CAIRN_ENOTFOUND: return CAIRN_RPC_NOT_FOUND;
    case CAIRN_EFULL:
    case CAIRN_EBUSY:
    case CAIRN_ENOMEM: return CAIRN_RPC_OVERLOADED;
    case CAIRN_EUNSUPPORTED: return CAIRN_RPC_UNSUPPORTED;
    case CAIRN_RPC_UNAUTHORIZED: return CAIRN_RPC_UNAUTHORIZED;
    default: return CAIRN_RPC_INTERNAL;
    }
}

const char *cairn_rpc_error_type(int code)
{
    switch (cairn_rpc_error_code(code)) {
    case CAIRN_RPC_INVALID_REQUEST: return "invalid_request";
    case CAIRN_RPC_TOO_LARGE: return "too_large";
    case CAIRN_RPC_NOT_FOUND: return "not_found";
    case CAIRN_RPC_OVERLOADED: return "overloaded";
    case CAIRN_RPC_UNSUPPORTED: return "unsupported";
    case CAIRN_RPC_UNAUTHORIZED: return "unauthorized";
    default: return "internal";
    }
}

static int fail(cairn_rpc_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(cairn_rpc_error *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    err->code = code;
    return code;
}

/* ---- methods and fields --------------------------------------------------- */

static const struct {
    const char *name;
    cairn_rpc_method method;
} methods[] = {
    {"server.info", CAIRN_RPC_SERVER_INFO},
    {"generate", CAIRN_RPC_GENERATE},
    {"session.open", CAIRN_RPC_SESSION_OPEN},
    {"session.append", CAIRN_RPC_SESSION_APPEND},
    {"session.generate", CAIRN_RPC_SESSION_GENERATE},
    {"session.fork", CAIRN_RPC_SESSION_FORK},
    {"session.truncate", CAIRN_RPC_SESSION_TRUNCATE},
    {"session.close", CAIRN_RPC_SESSION_CLOSE},
    {"session.info", CAIRN_RPC_SESSION_INFO},
    {"gen.cancel", CAIRN_RPC_GEN_CANCEL},
    {"tokenize", CAIRN_RPC_TOKENIZE},
    {"detokenize", CAIRN_RPC_DETOKENIZE},
    {"cache.stats", CAIRN_RPC_CACHE_STATS},
    {"auth", CAIRN_RPC_AUTH},
};

const char *cairn_rpc_method_name(cairn_rpc_method m)
{
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (methods[i].method == m)
            return methods[i].name;
    return "?";
}

typedef enum {
    F_PROMPT, F_TOKENS, F_TEXT, F_MESSAGES, F_SYSTEM, F_ADD_BOS, F_PARSE_SPECIAL,
    F_SESSION_ID, F_N_TOKENS, F_REQUEST, F_PERSIST, F_TTL_S,
    F_MAX_TOKENS, F_TEMPERATURE, F_TOP_K, F_TOP_P, F_MIN_P, F_REPEAT_PENALTY,
    F_FREQUENCY_PENALTY, F_PRESENCE_PENALTY, F_SEED, F_STOP, F_STREAM, F_TOKEN,
    F_RESPONSE_FORMAT, F_SPECULATIVE, F_DRAFT, F_TOOLS, F_TOOL_CHOICE,
    F_PARALLEL_TOOL_CALLS, F_LOGIT_BIAS,
    F_COUNT_
} field;

static const char *const field_names[F_COUNT_] = {
    "prompt", "tokens", "text", "messages", "system", "add_bos", "parse_special",
    "session_id", "n_tokens", "request", "persist", "ttl_s",
    "max_tokens", "temperature", "top_k", "top_p", "min_p", "repeat_penalty",
    "frequency_penalty", "presence_penalty", "seed", "stop", "stream", "token",
    "response_format", "speculative", "draft", "tools", "tool_choice",
    "parallel_tool_calls", "logit_bias",
};

/* Where each known parameter's value starts; NULL when absent or nil. */
typedef struct {
    const uint8_t *at[F_COUNT_];
    const uint8_t *end;
} params;

static cairn_mp_reader field_reader(const params *p, field f)
{
    return (cairn_mp_reader){p->at[f], p->end};
}

static int collect_params(cairn_mp_reader *r, params *p, cairn_rpc_error *err)
{
    memset(p, 0, sizeof *p);
    p->end = r->end;
    uint32_t n;
    if (cairn_mp_read_map(r, &n) != CAIRN_OK)
        return fail(err, CAIRN_RPC_INVALID_REQUEST, "params must be a map");
    bool seen[F_COUNT_] = {false};
    for (uint32_t i = 0; i < n; i++) {
        const char *key;
        uint32_t key_len;
        if (cairn_mp_read_str(r, &key, &key_len) != CAIRN_OK)
            return fail(err, CAIRN_RPC_INVALID_REQUEST, "parameter names must be strings");
        int f = -1;
        for (int k = 0; k < F_COUNT_; k++)
            if (strlen(field_names[k]) == key_len && memcmp(field_names[k], key, key_len) == 0)
                f = k;
        if (f >= 0) {
            if (seen[f])
                return fail(err, CAIRN_RPC_INVALID_REQUEST, "parameter '%s' is given twice",
                            field_names[f]);
            seen[f] = true;
            if (cairn_mp_peek(r) != CAIRN_MP_NIL)
                p->at[f] = r->p;
        }
        if (cairn_mp_skip(r) != CAIRN_OK)
            return fail(err, CAIRN_RPC_INVALID_REQUEST, "truncated parameter value");
    }
    return CAIRN_OK;
}

/* ---- typed field getters: absent leaves *out as it is ---------------------- */

static int get_bool(const params *p, field f, bool *out, cairn_rpc_error *err)
{
    if (!p->at[f])
        return CAIRN_OK;
    cairn_mp_reader r = field_reader(p, f);
    if (cairn_mp_read_bool(&r, out) != CAIRN_OK)
        return fail(err, CAIRN_RPC_INVALID_REQUEST, "'%s' must be a boolean", field_names[f]);
    return CAIRN_OK;
}

static int get_int(const params *p, field f, int64_t lo, int64_t hi, int64_t *out,
                   cairn_rpc_error *err)
{
    if (!p->at[f])
        return CAIRN_OK;
    cairn_mp_reader r = field_reader(p, f);
    int64_t v;
    if (cairn_mp_read_int(&r, &v) != CAIRN_OK || v < lo || v > hi)
        return fail(err, CAIRN_RPC_INVALID_REQUEST, "'%s' must be an integer in [%lld, %lld]",
                    field_names[f], (long long)lo, (long long)hi);
    *out = v;
    return CAIRN_OK;
}

static int get_float(const params *p, field f, double lo, double hi, float *out,
                     cairn_rpc_error *err)
{
    if (!p->at[f])
        return CAIRN_OK;
    cairn_mp_reader r = field_reader(p, f);
    double v;
    if (cairn_mp_read_number(&r, &v) != CAIRN_OK || !isfinite(v) || v < lo || v > hi)
        return fail(err, CAIRN_RPC_INVALID_REQUEST, "'%s' must be a number in [%g, %g]",
                    field_names[f], lo, hi);
    *out = (float)v;
    return CAIRN_OK;
}

static int get_str(const params *p, field f, const char **s, uint32_t *len,
                   cairn_rpc_error *err)
{
    cairn_mp_reader r = field_reader(p, f);
    if (cairn_mp_read_str(&r, s, len) != CAIRN_OK)
        return fail(err, CAIRN_RPC_INVALID_REQUEST, "'%s' must be a string", field_names[f]);
    return CAIRN_OK;
}

static int get_session_id(const params *p, cairn_session_id *out, cairn_rpc_error *err)
{
    const char *s;
    uint32_t len;
    if (!p->at[F_SESSION_ID])
        return fail(err, CAIRN_RPC_INVALID_REQUEST, "'session_id' is required");
    if (get_str(p, F_SESSION_ID, &s, &len, err) != CAIRN_OK)
        return err->code;
    if (cairn_session_id_from_hex(s, len, out) != CAIRN_OK)
        return fail(err, CAIRN_RPC_INVALID_REQUEST, "'session_id' must be 32 hex digits");
    return CAIRN_OK;
}

/* ---- content: text, messages or token ids -------------------------------- */

/* Tokenize into a new array of at most `limit` tokens (too_large beyond). The
 * buffer is sized from the text we hold, never from a declared length. */
static int tokenize_bounded(const cairn_rpc_context *ctx, const char *text, size_t len,
                            int flags, size_t limit, const char *what, int32_t **out,
                            size_t *n_out, cairn_rpc_error *err)
{
    if (!ctx->vocab)
        return fail(err, CAIRN_RPC_UNSUPPORTED, "this server cannot tokenize text");
    /* A token covers at least one byte of text, plus BOS/EOS markers. */
    size_t cap = len + 4 < limit + 1 ? len + 4 : limit + 1;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids)
        return fail(err, CAIRN_RPC_OVERLOADED, "out of memory");
    size_t n = 0;
    int rc = cairn_tokenize(ctx->vocab, text, len, flags, ids, cap, &n);
    if (rc == CAIRN_ERANGE && n <= limit) { /* cannot happen by the bound above */
        int32_t *bigger = realloc(ids, n * sizeof *ids);
        if (!bigger) {
            free(ids);
            return fail(err, CAIRN_RPC_OVERLOADED, "out of memory");
        }
        ids = bigger;
        rc = cairn_tokenize(ctx->vocab, text, len, flags, ids, n, &n);
    }
    if (rc == CAIRN_OK && n > limit)
        rc = CAIRN_ERANGE;
    if (rc != CAIRN_OK) {
        free(ids);
        if (rc == CAIRN_ERANGE)
            return fail(err, CAIRN_RPC_TOO_LARGE, "%s has %zu tokens, more than the limit of %zu",
                        what, n, limit);
        return fail(err, cairn_rpc_error_code(rc), "cannot tokenize %s: %s", what,
                    cairn_strerror(rc));
    }
    *out = ids;
    *n_out = n;
    return CAIRN_OK;
}

static int read_token_array(const cairn_rpc_context *ctx, const params *p, field f,
                            size_t limit, int32_t **out, size_t *n_out, cairn_rpc_error *err)
{
    cairn_mp_reader r = field_reader(p, f);
    uint32_t n;
    if (cairn_mp_read_array(&r, &n) != CAIRN_OK)
        return fail(err, CAIRN_RPC_INVALID_REQUEST, "'%s' must be an array of token ids",
                    field_names[f]);
    if (n > limit)
        return fail(err, CAIRN_RPC_TOO_LARGE, "'%s' has %u tokens, more than the limit of %zu",
                    field_names[f], n, limit);
    /* n is honest (the scanner checked it against the bytes received) and
     * bounded by limit, so this allocation is proportional to real input. */
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids)
        return fail(err, CAIRN_RPC_OVERLOADED, "out of memory");
    for (uint32_t i = 0; i < n; i++) {
        int64_t v;
        if (cairn_mp_read_int(&r, &v) != CAIRN_OK || v < 0 || v >= ctx->n_vocab) {
            free(ids);
            return fail(err, CAIRN_RPC_INVALID_REQUEST,
                        "'%s'[%u] must be a token id in [0, %d)", field_names[f], i,
                        ctx->n_vocab);
        }
        ids[i] = (int32_t)v;
    }
    *out = ids;
    *n_out = n;
    return CAIRN_OK;
}

/* A growing byte buffer for rendered chat text. */
typedef cairn_strbuf strbuf;

static void sb_add(strbuf *b, const char *s, size_t n) { cairn_strbuf_add(b, s, n); }

static void render_message(strbuf *b, const char *role, size_t role_len, const char *content,
                           size_t content_len)
{
    /* Generic chat format of docs/protocol.md: "<|ROLE|>\n" content "\n". */
    sb_add(b, "<|", 2);
    sb_add(b, role, role_len);
    sb_add(b, "|>\n", 3);
    sb_add(b, content, content_len);
    sb_add(b, "\n", 1);
}

static json_t *mp_to_json(cairn_mp_reader *r, int depth);

/* The messages of a request as NUL-terminated copies, for the chat template. */
typedef struct {
    cairn_chat_message *m;
    size_t n;
} chat_list;

static void chat_list_free(chat_list *l)
{
    for (size_t i = 0; i < l->n; i++) {
        free((char *)l->m[i].role);
        free((char *)l->m[i].content);
        free((char *)l->m[i].tool_call_id);
        free((char *)l->m[i].name);
        free((char *)l->m[i].tool_calls_json);
    }
    free(l->m);
    memset(l, 0, sizeof *l);
}

/* Append a message (copies the strings; NULL/0 = absent). */
static int chat_list_add(chat_list *l, const char *role, uint32_t role_len, const char *content,
                         uint32_t content_len, const char *call_id, uint32_t call_id_len,
                         const char *name, uint32_t name_len)
{
    cairn_chat_message *m = realloc(l->m, (l->n + 1) * sizeof *m);
    if (!m)
        return CAIRN_ENOMEM;
    l->m = m;
    cairn_chat_message *x = &m[l->n++];
    memset(x, 0, sizeof *x);
    x->role = strndup(role, role_len);
    x->content = strndup(content ? content : "", content_len);
    x->tool_call_id = call_id ? strndup(call_id, call_id_len) : NULL;
    x->name = name ? strndup(name, name_len) : NULL;
    if (!x->role || !x->content || (call_id && !x->tool_call_id) || (name && !x->name))
        return CAIRN_ENOMEM;
    return CAIRN_OK;
}

static int collect_messages(const params *p, chat_list *l, cairn_rpc_error *err)
{
    cairn_mp_reader r = field_reader(p, F_MESSAGES);
    uint32_t n;
    if (cairn_mp_read_array(&r, &n) != CAIRN_OK)
        return fail(err, CAIRN_RPC_INVALID_REQUEST, "'messages' must be an array of maps");
    for (uint32_t i = 0; i < n; i++) {
        uint32_t n_keys;
        if (cairn_mp_read_map(&r, &n_keys) != CAIRN_OK)
            return fail(err, CAIRN_RPC_INVALID_REQUEST, "'messages'[%u] must be a map", i);
        static const char *const keys[] = {"role", "content", "tool_call_id", "name"};
        const char *val[4] = {0};
        uint32_t len[4] = {0};
        char *calls_json = NULL; /* an assistant's tool_calls, as JSON text */
        for (uint32_t k = 0; k < n_keys; k++) {
            const char *key;
            uint32_t key_len;
            if (cairn_mp_read_str(&r, &key, &key_len) != CAIRN_OK) {
                free(calls_json);
                return fail(err, CAIRN_RPC_INVALID_REQUEST,
                            "'messages'[%u] keys must be strings", i);
            }
            int which = -1;
            for (int q = 0; q < 4; q++)
                if (strlen(keys[q]) == key_len && memcmp(key, keys[q], key_len) == 0)
                    which = q;
            if (key_len == 10 && memcmp(key, "tool_calls", 10) == 0 && !calls_json &&
                cairn_mp_peek(&r) != CAIRN_MP_NIL) {
                json_t *calls = cairn_mp_peek(&r) == CAIRN_MP_ARRAY ? mp_to_json(&r, 0) : NULL;
                calls_json = calls ? json_dumps(calls, JSON_COMPACT) : NULL;
                json_decref(calls);
                if (!calls_json)
                    return fail(err, CAIRN_RPC_INVALID_REQUEST,
                                "'messages'[%u].tool_calls must be an array of calls", i);
                continue;
            }
            if (which >= 0 && cairn_mp_peek(&r) == CAIRN_MP_NIL) {
                cairn_mp_skip(&r); /* nil: absent (an assistant's content beside calls) */
            } else if (which >= 0) {
                if (cairn_mp_read_str(&r, &val[which], &len[which]) != CAIRN_OK) {
                    free(calls_json);
                    return fail(err, CAIRN_RPC_INVALID_REQUEST,
                                "'messages'[%u].%s must be a string", i, keys[which]);
                }
            } else if (cairn_mp_skip(&r) != CAIRN_OK) {
                free(calls_json);
                return fail(err, CAIRN_RPC_INVALID_REQUEST, "truncated message");
            }
        }
        static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
        bool known = false;
        for (size_t k = 0; val[0] && k < sizeof roles / sizeof roles[0]; k++)
            known |= strlen(roles[k]) == len[0] && memcmp(roles[k], val[0], len[0]) == 0;
        bool assistant = known && len[0] == 9 && memcmp(val[0], "assistant", 9) == 0;
        int rc = CAIRN_OK;
        if (!known)
            rc = fail(err, CAIRN_RPC_INVALID_REQUEST,
                      "'messages'[%u].role must be system, developer, user, assistant or tool",
                      i);
        else if (calls_json && !assistant)
            rc = fail(err, CAIRN_RPC_INVALID_REQUEST,
                      "'messages'[%u].tool_calls: only an assistant message carries calls", i);
        else if (!val[1] && !calls_json)
            rc = fail(err, CAIRN_RPC_INVALID_REQUEST, "'messages'[%u].content is required", i);
        else if (chat_list_add(l, val[0], len[0], val[1], len[1], val[2], len[2], val[3],
                               len[3]))
            rc = fail(err, CAIRN_RPC_OVERLOADED, "out of memory");
        if (rc != CAIRN_OK) {
            free(calls_json);
            return rc;
        }
        l->m[l->n - 1].tool_calls_json = calls_json; /* the list owns it now */
    }
    return CAIRN_OK;
}

/* Decode the content fields allowed for `method` into call->tokens.
 *   text_field   F_PROMPT (generate) or F_TEXT (session methods)
 *   first_text   BOS by default (a new prompt or a new session's history)
 *   assistant    append "<|assistant|>\n" after messages (session.generate) */
static int decode_content(const cairn_rpc_context *ctx, const params *p, field text_field,
                          bool allow_messages, bool allow_system, bool first_text,
                          bool assistant, cairn_rpc_call *call, cairn_rpc_error *err)
{
    if (first_text && call->tools_json && !(allow_messages && p->at[F_MESSAGES]) &&
        !(allow_system && p->at[F_SYSTEM]))
        return fail(err, CAIRN_RPC_INVALID_REQUEST,
                    "'tools' are rendered with 'messages' (or 'system'), not with '%s'",
                    p->at[F_TOKENS] ? "tokens" : field_names[text_field]);
    const size_t limit = (size_t)ctx->n_ctx;
    int given = (p->at[text_field] != NULL) + (p->at[F_TOKENS] != NULL) +
                (allow_messages && p->at[F_MESSAGES] != NULL);
    bool system = allow_system && p->at[F_SYSTEM] != NULL;
    if (given > 1)
        return fail(err, CAIRN_RPC_INVALID_REQUEST, "give only one of '%s', %s'tokens'",
                    field_names[text_field], allow_messages ? "'messages', " : "");
    if (system && (p->at[text_field] || p->at[F_TOKENS]))
        return fail(err, CAIRN_RPC_INVALID_REQUEST, "'system' goes only with 'messages'");
    if (given == 0 && !system)
        return CAIRN_OK;
    call->has_content = true;
    if (p->at[F_TOKENS])
        return read_token_array(ctx, p, F_TOKENS, limit, &call->tokens, &call->n_tokens, err);

    bool add_bos = first_text && ctx->vocab && cairn_vocab_add_bos(ctx->vocab);
    bool parse_special = false;
    if (get_bool(p, F_ADD_BOS, &add_bos, err) || get_bool(p, F_PARSE_SPECIAL, &parse_special, err))
        return err->code;
    int flags = (add_bos ? CAIRN_TOK_ADD_BOS : 0) | (parse_special ? CAIRN_TOK_PARSE_SPECIAL : 0);
    if (p->at[text_field]) {
        const char *s;
        uint32_t len;
        if (get_str(p, text_field, &s, &len, err) != CAIRN_OK)
            return err->code;
        return tokenize_bounded(ctx, s, len, flags, limit, field_names[text_field],
                                &call->tokens, &call->n_tokens, err);
    }
    chat_list list = {0};
    int rc = CAIRN_OK;
    if (system) {
        const char *s;
        uint32_t len;
        if ((rc = get_str(p, F_SYSTEM, &s, &len, err)) == CAIRN_OK &&
            chat_list_add(&list, "system", 6, s, len, NULL, 0, NULL, 0))
            rc = fail(err, CAIRN_RPC_OVERLOADED, "out of memory");
    }
    if (rc == CAIRN_OK && p->at[F_MESSAGES])
        rc = collect_messages(p, &list, err);
    if (rc == CAIRN_OK && ctx->chat_template && ctx->vocab) {
        /* The model's template. Later messages of a session continue the
         * conversation (no default system prompt or BOS again); only the
         * template's own markers become special tokens. */
        int cflags = (assistant ? CAIRN_CHAT_GENERATION_PROMPT : 0) |
                     (first_text ? 0 : CAIRN_CHAT_CONTINUE) | (add_bos ? CAIRN_CHAT_ADD_BOS : 0);
        rc = cairn_chat_tokenize(ctx->chat_template, ctx->vocab, list.m, list.n,
                                 call->tools_json, cflags, &call->tokens, &call->n_tokens);
        call->chat_turn = !first_text;
        if (rc == CAIRN_OK && call->n_tokens > limit) {
            size_t n = call->n_tokens;
            free(call->tokens);
            call->tokens = NULL;
            call->n_tokens = 0;
            rc = fail(err, CAIRN_RPC_TOO_LARGE,
                      "the messages have %zu tokens, more than the limit of %zu", n, limit);
        } else if (rc != CAIRN_OK) {
            rc = fail(err, cairn_rpc_error_code(rc), "cannot format the messages: %s",
                      cairn_strerror(rc));
        }
    } else if (rc == CAIRN_OK) {
        strbuf b = {0};
        for (size_t i = 0; i < list.n; i++)
            render_message(&b, list.m[i].role, strlen(list.m[i].role), list.m[i].content,
                           strlen(list.m[i].content));
        if (assistant)
            sb_add(&b, "<|assistant|>\n", 14);
        if (b.oom)
            rc = fail(err, CAIRN_RPC_OVERLOADED, "out of memory");
        else
            rc = tokenize_bounded(ctx, b.data ? b.data : "", b.len, flags, limit, "the messages",
                                  &call->tokens, &call->n_tokens, err);
        free(b.data);
    }
    chat_list_free(&list);
    return rc;
}

/* ---- sampling ------------------------------------------------------------- */

static uint64_t next_seed(uint64_t *state)
{
    if (!state)
        return 0;
    /* splitmix64: a well-mixed sequence from any starting state. */
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int decode_response_format(const params *p, cairn_gen_params *g, cairn_rpc_error *err);

/* "draft": {depth, top_k, n} — the draft tree of a speculative request;
 * absent keys take the server's settings. */
static int decode_draft(const params *p, cairn_gen_params *g, cairn_rpc_error *err)
{
    if (!p->at[F_DRAFT])
        return CAIRN_OK;
    cairn_mp_reader r = field_reader(p, F_DRAFT);
    uint32_t n;
    if (cairn_mp_read_map(&r, &n) != CAIRN_OK)
        return fail(err, CAIRN_RPC_INVALID_REQUEST, "'draft' must be a map");
    for (uint32_t i = 0; i < n; i++) {
        const char *key;
        uint32_t key_len;
        if (cairn_mp_read_str(&r, &key, &key_len) != CAIRN_OK)
            return fail(err, CAIRN_RPC_INVALID_REQUEST, "'draft' keys must be strings");
        int *out = NULL;
        int64_t hi = 16, v;
        if (key_len == 5 && memcmp(key, "depth", 5) == 0)
            out = &g->draft.depth;
        else if (key_len == 5 && memcmp(key, "top_k", 5) == 0)
            out = &g->draft.top_k;
        else if (key_len == 1 && key[0] == 'n')
            out = &g->draft.n_draft, hi = 255;
        if (!out) { /* unknown keys are ignored, as in params */
            if (cairn_mp_skip(&r) != CAIRN_OK)
                return fail(err, CAIRN_RPC_INVALID_REQUEST, "truncated 'draft'");
            continue;
        }
        if (cairn_mp_read_int(&r, &v) != CAIRN_OK || v < 1 || v > hi)
            return fail(err, CAIRN_RPC_INVALID_REQUEST,
                        "'draft'.%.*s must be an integer in [1, %lld]", (int)key_len, key,
                        (long long)hi);
        *out = (int)v;
    }
    return CAIRN_OK;
}

static int decode_gen(const cairn_rpc_context *ctx, const params *p, uint64_t *seed_source,
                      cairn_gen_params *g, cairn_rpc_error *err)
{
    memset(g, 0, sizeof *g);
    g->max_tokens = 128;
    g->sampling = cairn_sampling_defaults();
    cairn_sampling_params *sp = &g->sampling;

    if (p->at[F_MAX_TOKENS]) {
        cairn_mp_reader r = field_reader(p, F_MAX_TOKENS);
        int64_t v;
        int rc = cairn_mp_read_int(&r, &v);
        if ((rc == CAIRN_OK && v > ctx->n_ctx) || rc == CAIRN_ERANGE)
            return fail(err, CAIRN_RPC_TOO_LARGE,
                        "'max_tokens' exceeds the context size (%d)", ctx->n_ctx);
        if (rc != CAIRN_OK || v < 0)
            return fail(err, CAIRN_RPC_INVALID_REQUEST,
                        "'max_tokens' must be a non-negative integer");
        g->max_tokens = (int)v;
    }
    int64_t top_k = sp->top_k;
    if (get_float(p, F_TEMPERATURE, 0, 100, &sp->temperature, err) ||
        get_int(p, F_TOP_K, 0, INT32_MAX, &top_k, err) ||
        get_float(p, F_TOP_P, 0, 1, &sp->top_p, err) ||
        get_float(p, F_MIN_P, 0, 1, &sp->min_p, err) ||
        get_float(p, F_REPEAT_PENALTY, 1e-3, 100, &sp->repeat_penalty, err) ||
        get_float(p, F_FREQUENCY_PENALTY, -100, 100, &sp->frequency_penalty, err) ||
        get_float(p, F_PRESENCE_PENALTY, -100, 100, &sp->presence_penalty, err) ||
        get_bool(p, F_STREAM, &g->stream, err))
        return err->code;
    /* top_p keeps the smallest set whose mass reaches it: 0 (or a value that
     * rounds to 0 as a float) keeps nothing, so it is refused here rather
     * than by the sampler later */
    if (!(sp->top_p > 0))
        return fail(err, CAIRN_RPC_INVALID_REQUEST, "'top_p' must be in (0, 1]");
    sp->top_k = (int)top_k;
    if (p->at[F_SEED]) {
        cairn_mp_reader r = field_reader(p, F_SEED);
        if (cairn_mp_read_uint(&r, &sp->seed) != CAIRN_OK)
            return fail(err, CAIRN_RPC_INVALID_REQUEST, "'seed' must be a non-negative integer");
    } else {
        sp->seed = next_seed(seed_source);
    }
    if (p->at[F_STOP]) {
        cairn_mp_reader r = field_reader(p, F_STOP);
        uint32_t n = 1;
        bool single = cairn_mp_peek(&r) == CAIRN_MP_STR; /* "stop": "x" is ["x"] */
        if (!single && cairn_mp_read_array(&r, &n) != CAIRN_OK)
            return fail(err, CAIRN_RPC_INVALID_REQUEST, "'stop' must be an array of strings");
        if (n > CAIRN_MAX_STOP)
            return fail(err, CAIRN_RPC_TOO_LARGE, "at most %d stop strings", CAIRN_MAX_STOP);
        for (uint32_t i = 0; i < n; i++) {
            const char *s;
            uint32_t len;
            if (cairn_mp_read_str(&r, &s, &len) != CAIRN_OK || len == 0)
                return fail(err, CAIRN_RPC_INVALID_REQUEST,
                            "'stop' must hold non-empty strings");
            if (len > MAX_STOP_BYTES)
                return fail(err, CAIRN_RPC_TOO_LARGE, "a stop string is longer than %d bytes",
                            MAX_STOP_BYTES);
            char *copy = malloc(len + 1);
            if (!copy)
                return fail(err, CAIRN_RPC_OVERLOADED, "out of memory");
            memcpy(copy, s, len);
            copy[len] = '\0';
            g->stop[g->n_stop++] = copy;
        }
    }
    if (p->at[F_LOGIT_BIAS]) {
        /* {token id: bias}: keys integers (or their decimal text, as JSON
         * clients send them), biases numbers in [-100, 100] */
        cairn_mp_reader r = field_reader(p, F_LOGIT_BIAS);
        uint32_t n;
        if (cairn_mp_read_map(&r, &n) != CAIRN_OK)
            return fail(err, CAIRN_RPC_INVALID_REQUEST,
                        "'logit_bias' must be a map of token ids to biases");
        if (n > CAIRN_MAX_LOGIT_BIAS)
            return fail(err, CAIRN_RPC_TOO_LARGE, "'logit_bias' has more than %d entries",
                        CAIRN_MAX_LOGIT_BIAS);
        for (uint32_t i = 0; i < n; i++) {
            int64_t id = -1;
            if (cairn_mp_peek(&r) == CAIRN_MP_STR) {
                const char *k = NULL;
                uint32_t klen = 0;
                char buf[24];
                if (cairn_mp_read_str(&r, &k, &klen) != CAIRN_OK || klen >= sizeof buf)
                    klen = 0;
                memcpy(buf, k, klen);
                buf[klen] = '\0';
                char *end;
                long long v = klen ? strtoll(buf, &end, 10) : -1;
                id = klen && !*end ? v : -1;
            } else if (cairn_mp_read_int(&r, &id) != CAIRN_OK) {
                id = -1;
            }
            double bias;
            if (id < 0 || id >= ctx->n_vocab)
                return fail(err, CAIRN_RPC_INVALID_REQUEST,
                            "'logit_bias' keys must be token ids in [0, %d)", ctx->n_vocab);
            if (cairn_mp_read_number(&r, &bias) != CAIRN_OK || !(bias >= -100 && bias <= 100))
                return fail(err, CAIRN_RPC_INVALID_REQUEST,
                            "'logit_bias' values must be numbers in [-100, 100]");
            sp->logit_bias[sp->n_logit_bias].token = (int32_t)id;
            sp->logit_bias[sp->n_logit_bias].bias = (float)bias;
            sp->n_logit_bias++;
        }
    }
    bool speculative = true;
    if (get_bool(p, F_SPECULATIVE, &speculative, err) || decode_draft(p, g, err))
        return err->code;
    g->no_speculation = !speculative;
    return decode_response_format(p, g, err);
}

/* ---- response_format: structured output ------------------------------------ */

#define MAX_SCHEMA_DEPTH 64

/* One msgpack value as a jansson value (the schema may come as a map). */
static json_t *mp_to_json(cairn_mp_reader *r, int depth)
{
    if (depth > MAX_SCHEMA_DEPTH)
        return NULL;
    switch (cairn_mp_peek(r)) {
    case CAIRN_MP_NIL: return cairn_mp_read_nil(r) == CAIRN_OK ? json_null() : NULL;
    case CAIRN_MP_BOOL: {
        bool b;
        return cairn_mp_read_bool(r, &b) == CAIRN_OK ? json_boolean(b) : NULL;
    }
    case CAIRN_MP_UINT:
    case CAIRN_MP_NINT: {
        int64_t v;
        return cairn_mp_read_int(r, &v) == CAIRN_OK ? json_integer(v) : NULL;
    }
    case CAIRN_MP_FLOAT: {
        double v;
        return cairn_mp_read_number(r, &v) == CAIRN_OK && isfinite(v) ? json_real(v) : NULL;
    }
    case CAIRN_MP_STR: {
        const char *str;
        uint32_t len;
        return cairn_mp_read_str(r, &str, &len) == CAIRN_OK ? json_stringn(str, len) : NULL;
    }
    case CAIRN_MP_ARRAY: {
        uint32_t n;
        json_t *a = cairn_mp_read_array(r, &n) == CAIRN_OK ? json_array() : NULL;
        for (uint32_t i = 0; a && i < n; i++)
            if (json_array_append_new(a, mp_to_json(r, depth + 1)) != 0) {
                json_decref(a);
                a = NULL;
            }
        return a;
    }
    case CAIRN_MP_MAP: {
        uint32_t n;
        json_t *o = cairn_mp_read_map(r, &n) == CAIRN_OK ? json_object() : NULL;
        for (uint32_t i = 0; o && i < n; i++) {
            const char *key;
            uint32_t key_len;
            json_t *v = NULL;
            if (cairn_mp_read_str(r, &key, &key_len) != CAIRN_OK ||
                !(v = mp_to_json(r, depth + 1)) ||
                json_object_setn_new(o, key, key_len, v) != 0) { /* v is taken even then */
                json_decref(o);
                o = NULL;
            }
        }
        return o;
    }
    default: return NULL;
    }
}

/* {"type": "text" | "json_object"} or {"type": "json_schema", "json_schema":
 * {"schema": <map or JSON text>, ...}}: compiled to g->grammar. */
static int decode_response_format(const params *p, cairn_gen_params *g, cairn_rpc_error *err)
{
    if (!p->at[F_RESPONSE_FORMAT])
        return CAIRN_OK;
    cairn_mp_reader r = field_reader(p, F_RESPONSE_FORMAT);
    uint32_t n;
    if (cairn_mp_read_map(&r, &n) != CAIRN_OK)
        return fail(err, CAIRN_RPC_INVALID_REQUEST, "'response_format' must be a map");
    const char *type = NULL;
    uint32_t type_len = 0;
    cairn_mp_reader json_schema = {NULL, NULL};
    for (uint32_t i = 0; i < n; i++) {
        const char *key;
        uint32_t key_len;
        if (cairn_mp_read_str(&r, &key, &key_len) != CAIRN_OK)
            return fail(err, CAIRN_RPC_INVALID_REQUEST, "'response_format' keys must be strings");
        if (key_len == 4 && memcmp(key, "type", 4) == 0) {
            if (cairn_mp_read_str(&r, &type, &type_len) != CAIRN_OK)
                return fail(err, CAIRN_RPC_INVALID_REQUEST,
                            "'response_format'.type must be a string");
            continue;
        }
        if (key_len == 11 && memcmp(key, "json_schema", 11) == 0)
            json_schema = r;
        if (cairn_mp_skip(&r) != CAIRN_OK)
            return fail(err, CAIRN_RPC_INVALID_REQUEST, "truncated 'response_format'");
    }
    if (!type)
        return fail(err, CAIRN_RPC_INVALID_REQUEST, "'response_format' needs a 'type'");
    if (type_len == 4 && memcmp(type, "text", 4) == 0)
        return CAIRN_OK;
    char *schema_text = NULL;
    size_t schema_len = 0;
    if (type_len == 11 && memcmp(type, "json_schema", 11) == 0) {
        if (!json_schema.p || cairn_mp_read_map(&json_schema, &n) != CAIRN_OK)
            return fail(err, CAIRN_RPC_INVALID_REQUEST,
                        "'response_format'.json_schema must be a map holding 'schema'");
        for (uint32_t i = 0; i < n && !schema_text; i++) {
            const char *key;
            uint32_t key_len;
            if (cairn_mp_read_str(&json_schema, &key, &key_len) != CAIRN_OK)
                return fail(err, CAIRN_RPC_INVALID_REQUEST,
                            "'response_format'.json_schema keys must be strings");
            if (key_len == 6 && memcmp(key, "schema", 6) == 0) {
                const char *str;
                uint32_t len;
                if (cairn_mp_peek(&json_schema) == CAIRN_MP_STR) { /* JSON text */
                    cairn_mp_read_str(&json_schema, &str, &len);
                    if (!(schema_text = malloc(len + 1u)))
                        return fail(err, CAIRN_RPC_OVERLOADED, "out of memory");
                    memcpy(schema_text, str, len);
                    schema_len = len;
                } else { /* a map: to JSON text for the compiler */
                    json_t *j = mp_to_json(&json_schema, 0);
                    schema_text = j ? json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
                    json_decref(j);
                    if (!schema_text)
                        return fail(err, CAIRN_RPC_INVALID_REQUEST,
                                    "'response_format'.json_schema.schema must be a map or JSON "
                                    "text");
                    schema_len = strlen(schema_text);
                }
            } else if (cairn_mp_skip(&json_schema) != CAIRN_OK) {
                return fail(err, CAIRN_RPC_INVALID_REQUEST, "truncated 'response_format'");
            }
        }
        if (!schema_text)
            return fail(err, CAIRN_RPC_INVALID_REQUEST,
                        "'response_format'.json_schema must hold 'schema'");
    } else if (!(type_len == 11 && memcmp(type, "json_object", 11) == 0)) {
        return fail(err, CAIRN_RPC_INVALID_REQUEST,
                    "'response_format'.type must be text, json_object or json_schema");
    }
    char msg[160] = "";
    int rc = cairn_grammar_from_json_schema(schema_text, schema_len, &g->grammar, msg, sizeof msg);
    free(schema_text);
    if (rc == CAIRN_ENOMEM)
        return fail(err, CAIRN_RPC_OVERLOADED, "out of memory");
    if (rc != CAIRN_OK)
        return fail(err, CAIRN_RPC_INVALID_REQUEST, "invalid JSON schema: %s", msg);
    return CAIRN_OK;
}

/* ---- tools ------------------------------------------------------------------
 * OpenAI's tools and tool_choice (cairn_chat_tools_select): at session.open
 * the tools are rendered with the messages (the template's tool block); at
 * session.generate the reply is read for calls of them, and a required or
 * named choice forces one (cairn_chat_tool_call_schema). */

static int decode_tools(const cairn_rpc_context *ctx, const params *p, bool generation,
                        cairn_rpc_call *c, cairn_rpc_error *err)
{
    if (!p->at[F_TOOLS] && !p->at[F_TOOL_CHOICE])
        return CAIRN_OK;
    char *text[2] = {NULL, NULL};
    const field fields[2] = {F_TOOLS, F_TOOL_CHOICE};
    for (int k = 0; k < 2; k++) {
        if (!p->at[fields[k]])
            continue;
        cairn_mp_reader r = field_reader(p, fields[k]);
        json_t *j = mp_to_json(&r, 0);
        text[k] = j ? json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
        json_decref(j);
        if (!text[k]) {
            free(text[0]);
            return fail(err, CAIRN_RPC_INVALID_REQUEST, "'%s' cannot be read as JSON",
                        field_names[fields[k]]);
        }
    }
    cairn_chat_tool_mode mode;
    char msg[200] = "";
    int rc = cairn_chat_tools_select(text[0], text[1], &c->tools_json, &mode, NULL, msg,
                                     sizeof msg);
    free(text[0]);
    free(text[1]);
    if (rc == CAIRN_ENOMEM)
        return fail(err, CAIRN_RPC_OVERLOADED, "out of memory");
    if (rc != CAIRN_OK)
        return fail(err, CAIRN_RPC_INVALID_REQUEST, "%s", msg);
    if (mode != CAIRN_TOOLS_REQUIRED && mode != CAIRN_TOOLS_NAMED)
        return CAIRN_OK;
    if (!generation)
        return fail(err, CAIRN_RPC_INVALID_REQUEST,
                    "a required or named 'tool_choice' goes with session.generate");
    if (c->gen.grammar)
        return fail(err, CAIRN_RPC_INVALID_REQUEST, "a required or named 'tool_choice' cannot "
                                                    "be combined with a JSON 'response_format'");
    bool parallel = true; /* "required" may answer several calls; named: one */
    if (get_bool(p, F_PARALLEL_TOOL_CALLS, &parallel, err))
        return err->code;
    char *schema = NULL;
    rc = cairn_chat_tool_call_schema(ctx->chat_template, c->tools_json,
                                     mode == CAIRN_TOOLS_REQUIRED && parallel, &schema);
    if (rc == CAIRN_OK)
        rc = cairn_grammar_from_json_schema(schema, strlen(schema), &c->gen.grammar, msg,
                                            sizeof msg);
    free(schema);
    if (rc == CAIRN_ENOMEM)
        return fail(err, CAIRN_RPC_OVERLOADED, "out of memory");
    if (rc != CAIRN_OK)
        return fail(err, CAIRN_RPC_INVALID_REQUEST, "the tools cannot be forced: %s",
                    msg[0] ? msg : cairn_strerror(rc));
    return CAIRN_OK;
}

/* ---- the envelope and the methods ----------------------------------------- */

static int decode_params(const cairn_rpc_context *ctx, const params *p, uint64_t *seed_source,
                         cairn_rpc_call *c, cairn_rpc_error *err)
{
    switch (c->method) {
    case CAIRN_RPC_SERVER_INFO:
    case CAIRN_RPC_CACHE_STATS:
        return CAIRN_OK;
    case CAIRN_RPC_GENERATE:
        /* a prompt, tokens, or a whole conversation (messages, optionally
         * with tools, rendered with the assistant cue); the sampling first,
         * as a forced tool call excludes response_format */
        if (decode_gen(ctx, p, seed_source, &c->gen, err) || decode_tools(ctx, p, true, c, err) ||
            decode_content(ctx, p, F_PROMPT, true, true, true, true, c, err))
            return err->code;
        if (!c->has_content)
            return fail(err, CAIRN_RPC_INVALID_REQUEST,
                        "'prompt', 'messages' or 'tokens' is required");
        if (c->n_tokens == 0)
            return fail(err, CAIRN_RPC_INVALID_REQUEST, "the prompt is empty");
        return CAIRN_OK;
    case CAIRN_RPC_SESSION_OPEN: {
        float ttl = 0;
        /* ttl_s is accepted and checked; sessions do not expire yet. */
        if (get_bool(p, F_PERSIST, &c->persist, err) ||
            get_float(p, F_TTL_S, 0, 1e12, &ttl, err) || decode_tools(ctx, p, false, c, err))
            return err->code;
        return decode_content(ctx, p, F_TEXT, true, true, true, false, c, err);
    }
    case CAIRN_RPC_SESSION_APPEND:
        if (p->at[F_TOOLS] || p->at[F_TOOL_CHOICE])
            return fail(err, CAIRN_RPC_INVALID_REQUEST,
                        "'tools' go with generate, session.open and session.generate");
        if (get_session_id(p, &c->session, err) ||
            decode_content(ctx, p, F_TEXT, true, false, false, false, c, err))
            return err->code;
        if (!c->has_content)
            return fail(err, CAIRN_RPC_INVALID_REQUEST,
                        "one of 'messages', 'text' or 'tokens' is required");
        return CAIRN_OK;
    case CAIRN_RPC_SESSION_GENERATE:
        /* tools after response_format (decode_gen): forcing excludes it */
        if (get_session_id(p, &c->session, err) ||
            decode_content(ctx, p, F_TEXT, true, false, false, true, c, err) ||
            decode_gen(ctx, p, seed_source, &c->gen, err) || decode_tools(ctx, p, true, c, err))
            return err->code;
        return CAIRN_OK;
    case CAIRN_RPC_SESSION_FORK:
    case CAIRN_RPC_SESSION_CLOSE:
    case CAIRN_RPC_SESSION_INFO:
        return get_session_id(p, &c->session, err);
    case CAIRN_RPC_SESSION_TRUNCATE:
        if (get_session_id(p, &c->session, err))
            return err->code;
        if (!p->at[F_N_TOKENS])
            return fail(err, CAIRN_RPC_INVALID_REQUEST, "'n_tokens' is required");
        c->n_keep = -1;
        return get_int(p, F_N_TOKENS, 0, INT64_MAX, &c->n_keep, err);
    case CAIRN_RPC_GEN_CANCEL: {
        int64_t target = -1;
        if (!p->at[F_REQUEST])
            return fail(err, CAIRN_RPC_INVALID_REQUEST, "'request' is required");
        if (get_int(p, F_REQUEST, 0, UINT32_MAX, &target, err))
            return err->code;
        c->target = (uint32_t)target;
        return CAIRN_OK;
    }
    case CAIRN_RPC_TOKENIZE: {
        if (!p->at[F_TEXT])
            return fail(err, CAIRN_RPC_INVALID_REQUEST, "'text' is required");
        const char *s;
        uint32_t len;
        bool add_bos = ctx->vocab && cairn_vocab_add_bos(ctx->vocab), parse_special = false;
        if (get_str(p, F_TEXT, &s, &len, err) || get_bool(p, F_ADD_BOS, &add_bos, err) ||
            get_bool(p, F_PARSE_SPECIAL, &parse_special, err))
            return err->code;
        c->has_content = true;
        return tokenize_bounded(ctx, s, len,
                                (add_bos ? CAIRN_TOK_ADD_BOS : 0) |
                                    (parse_special ? CAIRN_TOK_PARSE_SPECIAL : 0),
                                ctx->limits.max_array_len, "'text'", &c->tokens, &c->n_tokens,
                                err);
    }
    case CAIRN_RPC_AUTH:
        /* Only the type is checked here: whether the token is right (and
         * whether its length is possible at all) is the server's question,
         * answered in constant time. */
        if (!p->at[F_TOKEN])
            return fail(err, CAIRN_RPC_INVALID_REQUEST, "'token' is required");
        return get_str(p, F_TOKEN, &c->token, &c->token_len, err);
    case CAIRN_RPC_DETOKENIZE:
        if (!p->at[F_TOKENS])
            return fail(err, CAIRN_RPC_INVALID_REQUEST, "'tokens' is required");
        c->has_content = true;
        return read_token_array(ctx, p, F_TOKENS, ctx->limits.max_array_len, &c->tokens,
                                &c->n_tokens, err);
    }
    return fail(err, CAIRN_RPC_INTERNAL, "unhandled method");
}

/* The envelope [0, msgid, method, params]: fills call->msgid and
 * call->method, and leaves *params at the params map (or an empty one). */
static int decode_envelope(const uint8_t *msg, size_t len, cairn_rpc_call *call,
                           cairn_mp_reader *params_out, cairn_rpc_error *err)
{
    memset(call, 0, sizeof *call);
    memset(err, 0, sizeof *err);
    cairn_mp_reader r = cairn_mp_reader_of(msg, len);
    uint32_t n;
    uint64_t type, msgid;
    if (cairn_mp_read_array(&r, &n) != CAIRN_OK || n < 3 ||
        cairn_mp_read_uint(&r, &type) != CAIRN_OK)
        return fail(err, CAIRN_RPC_INVALID_REQUEST, "not a msgpack-RPC message");
    if (type == 2 && n == 3)
        return CAIRN_ECLOSED; /* a notification: nothing to answer, none defined */
    if (type != 0 || cairn_mp_read_uint(&r, &msgid) != CAIRN_OK || msgid > UINT32_MAX)
        return fail(err, CAIRN_RPC_INVALID_REQUEST, "not a request with a valid msgid");
    err->has_msgid = true;
    err->msgid = call->msgid = (uint32_t)msgid;
    if (n != 4)
        return fail(err, CAIRN_RPC_INVALID_REQUEST, "a request is [0, msgid, method, params]");

    const char *name;
    uint32_t name_len;
    if (cairn_mp_read_str(&r, &name, &name_len) != CAIRN_OK)
        return fail(err, CAIRN_RPC_INVALID_REQUEST, "the method must be a string");
    call->method = 0;
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (strlen(methods[i].name) == name_len && memcmp(methods[i].name, name, name_len) == 0)
            call->method = methods[i].method;
    if (!call->method)
        return fail(err, CAIRN_RPC_INVALID_REQUEST, "unknown method '%.*s'",
                    (int)(name_len < 64 ? name_len : 64), name);

    /* params: [map], [], [nil], a bare map, or nil. */
    static const uint8_t empty_map[] = {0x80};
    *params_out = cairn_mp_reader_of(empty_map, 1);
    switch (cairn_mp_peek(&r)) {
    case CAIRN_MP_ARRAY: {
        uint32_t np;
        cairn_mp_read_array(&r, &np);
        if (np > 0 && cairn_mp_peek(&r) == CAIRN_MP_MAP)
            *params_out = r;
        else if (np > 0 && cairn_mp_peek(&r) != CAIRN_MP_NIL)
            return fail(err, CAIRN_RPC_INVALID_REQUEST, "params must be [map]");
        break;
    }
    case CAIRN_MP_MAP: *params_out = r; break;
    case CAIRN_MP_NIL: break;
    default: return fail(err, CAIRN_RPC_INVALID_REQUEST, "params must be [map]");
    }
    return CAIRN_OK;
}

int cairn_rpc_decode(const cairn_rpc_context *ctx, const uint8_t *msg, size_t len,
                     uint64_t *seed_source, cairn_rpc_call *call, cairn_rpc_error *err)
{
    cairn_mp_reader pr;
    int rc = decode_envelope(msg, len, call, &pr, err);
    params p;
    if (rc == CAIRN_OK)
        rc = collect_params(&pr, &p, err);
    if (rc == CAIRN_OK)
        rc = decode_params(ctx, &p, seed_source, call, err);
    if (rc != CAIRN_OK && rc != CAIRN_ECLOSED) {
        cairn_rpc_call_clear(call);
        call->msgid = err->msgid;
    }
    return rc;
}

int cairn_rpc_decode_preauth(const uint8_t *msg, size_t len, cairn_rpc_call *call,
                             cairn_rpc_error *err)
{
    cairn_mp_reader pr;
    int rc = decode_envelope(msg, len, call, &pr, err);
    /* The same answer for an unknown method as for a known one: before
     * authentication the server says nothing about what it implements. */
    if (err->has_msgid && (rc == CAIRN_OK || err->code == CAIRN_RPC_INVALID_REQUEST) &&
        call->method != CAIRN_RPC_AUTH && rc != CAIRN_ECLOSED)
        rc = fail(err, CAIRN_RPC_UNAUTHORIZED,
                  "authenticate first: call 'auth' with this server's token");
    params p;
    if (rc == CAIRN_OK)
        rc = collect_params(&pr, &p, err);
    if (rc == CAIRN_OK)
        rc = decode_params(NULL, &p, NULL, call, err); /* auth reads no context */
    if (rc != CAIRN_OK && rc != CAIRN_ECLOSED) {
        cairn_rpc_call_clear(call);
        call->msgid = err->msgid;
    }
    return rc;
}

void cairn_rpc_call_clear(cairn_rpc_call *call)
{
    if (!call)
        return;
    free(call->tokens);
    for (int i = 0; i < call->gen.n_stop; i++)
        free(call->gen.stop[i]);
    cairn_grammar_free(call->gen.grammar);
    free(call->tools_json);
    memset(call, 0, sizeof *call);
}

/* ---- packing -------------------------------------------------------------- */

/* msgpack-c's packer reports a failed write per call; the sink remembers the
 * first one so a packer function can check once at the end. */
typedef struct {
    msgpack_sbuffer *sb;
    bool failed;
} sink;

static int sink_write(void *data, const char *buf, size_t len)
{
    sink *s = data;
    if (s->failed || msgpack_sbuffer_write(s->sb, buf, len) != 0) {
        s->failed = true;
        return -1;
    }
    return 0;
}

static void pack_cstr(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pack_strn(msgpack_packer *pk, const char *s, size_t n)
{
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s ? s : "", n);
}

static void pack_tokens(msgpack_packer *pk, const int32_t *tokens, size_t n)
{
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_int32(pk, tokens[i]);
}

/* [1, msgid, nil, ...]: the result value is packed next. */
static void pack_result_head(msgpack_packer *pk, uint32_t msgid)
{
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint8(pk, 1);
    msgpack_pack_uint32(pk, msgid);
    msgpack_pack_nil(pk);
}

#define PACKER(pk, s, sb)                                                                          \
    sink s = {(sb), false};                                                                        \
    msgpack_packer pk;                                                                             \
    msgpack_packer_init(&pk, &s, sink_write)

int cairn_rpc_pack_error(msgpack_sbuffer *sb, uint32_t msgid, int code, const char *message)
{
    PACKER(pk, s, sb);
    code = cairn_rpc_error_code(code);
    msgpack_pack_array(&pk, 4);
    msgpack_pack_uint8(&pk, 1);
    msgpack_pack_uint32(&pk, msgid);
    msgpack_pack_map(&pk, 3);
    pack_cstr(&pk, "code");
    msgpack_pack_int(&pk, code);
    pack_cstr(&pk, "type");
    pack_cstr(&pk, cairn_rpc_error_type(code));
    pack_cstr(&pk, "message");
    pack_cstr(&pk, message ? message : cairn_strerror(code));
    msgpack_pack_nil(&pk);
    return s.failed ? CAIRN_ENOMEM : CAIRN_OK;
}

static void pack_session_id(msgpack_packer *pk, cairn_session_id id)
{
    char hex[33];
    cairn_session_id_to_hex(id, hex);
    pack_cstr(pk, "session_id");
    pack_cstr(pk, hex);
}

static void pack_stats(msgpack_packer *pk, const cairn_service_stats *st)
{
    msgpack_pack_map(pk, 14);
#define U64(name, v) pack_cstr(pk, name), msgpack_pack_uint64(pk, v)
    U64("queries", st->queries);
    U64("prompt_tokens", st->prompt_tokens);
    U64("cached_tokens", st->cached_tokens);
    U64("generated_tokens", st->generated_tokens);
    pack_cstr(pk, "hit_rate");
    msgpack_pack_double(pk, st->prompt_tokens ? (double)st->cached_tokens / st->prompt_tokens
                                              : 0.0);
    pack_cstr(pk, "pages");
    msgpack_pack_map(pk, 3);
    U64("device", st->pages[0]);
    U64("host", st->pages[1]);
    U64("disk", st->pages[2]);
    U64("device_pages_total", st->device_pages_total);
    U64("device_pages_free", st->device_pages_free);
    U64("evicted_pages", st->evicted_pages);
    U64("paused", st->paused);
    U64("running", st->running);
    U64("waiting", st->waiting);
    U64("sessions", st->sessions);
    static const char *tier_names[3] = {"device", "host", "disk"};
    pack_cstr(pk, "tiers");
    msgpack_pack_map(pk, 3);
    for (int t = 0; t < 3; t++) {
        const cairn_service_tier_stats *ts = &st->tiers[t];
        pack_cstr(pk, tier_names[t]);
        msgpack_pack_map(pk, 10);
        U64("pages", ts->pages);
        U64("bytes", ts->bytes);
        U64("hit_tokens", ts->hit_tokens);
        U64("miss_tokens", ts->miss_tokens);
        U64("evicted_pages", ts->evicted_pages);
        U64("promoted_pages", ts->promoted_pages);
        U64("load_ops", ts->load_ops);
        U64("store_ops", ts->store_ops);
        pack_cstr(pk, "load_mean_ms");
        msgpack_pack_double(pk, ts->load_mean_s * 1e3);
        pack_cstr(pk, "store_mean_ms");
        msgpack_pack_double(pk, ts->store_mean_s * 1e3);
    }
#undef U64
}

/* A JSON value (tool calls) as msgpack. */
static void pack_json(msgpack_packer *pk, const json_t *j)
{
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        msgpack_pack_map(pk, json_object_size(j));
        const char *key;
        json_t *v;
        json_object_foreach((json_t *)j, key, v)
        {
            pack_cstr(pk, key);
            pack_json(pk, v);
        }
        break;
    }
    case JSON_ARRAY: {
        msgpack_pack_array(pk, json_array_size(j));
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v) { pack_json(pk, v); }
        break;
    }
    case JSON_STRING: pack_strn(pk, json_string_value(j), json_string_length(j)); break;
    case JSON_INTEGER: msgpack_pack_int64(pk, json_integer_value(j)); break;
    case JSON_REAL: msgpack_pack_double(pk, json_real_value(j)); break;
    case JSON_TRUE: msgpack_pack_true(pk); break;
    case JSON_FALSE: msgpack_pack_false(pk); break;
    default: msgpack_pack_nil(pk); break;
    }
}

int cairn_rpc_pack_event(msgpack_sbuffer *sb, cairn_rpc_method method, const cairn_event *ev,
                         const cairn_rpc_tool_calls *calls)
{
    const uint32_t msgid = (uint32_t)ev->id;
    if (ev->kind == CAIRN_EV_ERROR)
        return cairn_rpc_pack_error(sb, msgid, ev->code, ev->message);
    PACKER(pk, s, sb);
    if (ev->kind == CAIRN_EV_DELTA) {
        msgpack_pack_array(&pk, 3);
        msgpack_pack_uint8(&pk, 2);
        pack_cstr(&pk, "gen.delta");
        msgpack_pack_array(&pk, 1);
        msgpack_pack_map(&pk, 3);
        pack_cstr(&pk, "request");
        msgpack_pack_uint32(&pk, msgid);
        pack_cstr(&pk, "text");
        pack_strn(&pk, ev->text, ev->text_len);
        pack_cstr(&pk, "tokens");
        pack_tokens(&pk, ev->tokens, ev->n_tokens);
        return s.failed ? CAIRN_ENOMEM : CAIRN_OK;
    }
    pack_result_head(&pk, msgid);
    switch (ev->what) {
    case CAIRN_DONE_GENERATION: {
        json_t *tool_calls = calls && calls->calls_json ? json_loads(calls->calls_json, 0, NULL)
                                                        : NULL;
        msgpack_pack_map(&pk, tool_calls ? 6 : 4);
        pack_cstr(&pk, "text");
        pack_strn(&pk, ev->text, ev->text_len);
        pack_cstr(&pk, "tokens");
        pack_tokens(&pk, ev->tokens, ev->n_tokens);
        pack_cstr(&pk, "finish_reason");
        pack_cstr(&pk, tool_calls ? "tool_calls" : ev->finish_reason ? ev->finish_reason : "stop");
        if (tool_calls) {
            pack_cstr(&pk, "tool_calls");
            pack_json(&pk, tool_calls);
            pack_cstr(&pk, "content");
            pack_cstr(&pk, calls->content ? calls->content : "");
            json_decref(tool_calls);
        }
        pack_cstr(&pk, "usage");
        msgpack_pack_map(&pk, 4);
        pack_cstr(&pk, "prompt_tokens");
        msgpack_pack_int64(&pk, ev->prompt_tokens);
        pack_cstr(&pk, "cached_tokens");
        msgpack_pack_int64(&pk, ev->cached_tokens);
        pack_cstr(&pk, "cached_tokens_by_tier");
        msgpack_pack_map(&pk, 3);
        pack_cstr(&pk, "device");
        msgpack_pack_int64(&pk, ev->cached_by_tier[0]);
        pack_cstr(&pk, "host");
        msgpack_pack_int64(&pk, ev->cached_by_tier[1]);
        pack_cstr(&pk, "disk");
        msgpack_pack_int64(&pk, ev->cached_by_tier[2]);
        pack_cstr(&pk, "completion_tokens");
        msgpack_pack_int64(&pk, ev->completion_tokens);
        break;
    }
    case CAIRN_DONE_SESSION:
        switch (method) {
        case CAIRN_RPC_SESSION_OPEN:
        case CAIRN_RPC_SESSION_INFO:
            msgpack_pack_map(&pk, 2);
            pack_session_id(&pk, ev->session);
            pack_cstr(&pk, "n_tokens");
            msgpack_pack_int64(&pk, ev->n_session_tokens);
            break;
        case CAIRN_RPC_SESSION_FORK:
            msgpack_pack_map(&pk, 1);
            pack_session_id(&pk, ev->session);
            break;
        case CAIRN_RPC_SESSION_CLOSE:
            msgpack_pack_map(&pk, 1);
            pack_cstr(&pk, "closed");
            msgpack_pack_true(&pk);
            break;
        default: /* append, truncate */
            msgpack_pack_map(&pk, 1);
            pack_cstr(&pk, "n_tokens");
            msgpack_pack_int64(&pk, ev->n_session_tokens);
            break;
        }
        break;
    case CAIRN_DONE_CANCEL:
        msgpack_pack_map(&pk, 1);
        pack_cstr(&pk, "cancelled");
        if (ev->found)
            msgpack_pack_true(&pk);
        else
            msgpack_pack_false(&pk);
        break;
    case CAIRN_DONE_STATS:
        pack_stats(&pk, &ev->stats);
        break;
    default:
        msgpack_pack_nil(&pk);
        break;
    }
    return s.failed ? CAIRN_ENOMEM : CAIRN_OK;
}

int cairn_rpc_pack_server_info(msgpack_sbuffer *sb, uint32_t msgid,
                               const cairn_rpc_server_info *info)
{
    PACKER(pk, s, sb);
    pack_result_head(&pk, msgid);
    msgpack_pack_map(&pk, 4);
    pack_cstr(&pk, "version");
    pack_cstr(&pk, info->version);
    pack_cstr(&pk, "model");
    msgpack_pack_map(&pk, 4);
    pack_cstr(&pk, "name");
    pack_cstr(&pk, info->hparams ? info->hparams->name : "");
    pack_cstr(&pk, "arch");
    pack_cstr(&pk, info->hparams ? info->hparams->arch : "");
    pack_cstr(&pk, "n_ctx");
    msgpack_pack_int(&pk, info->n_ctx);
    pack_cstr(&pk, "n_vocab");
    msgpack_pack_int(&pk, info->hparams ? info->hparams->n_vocab : 0);
    pack_cstr(&pk, "page_size");
    msgpack_pack_int(&pk, info->page_size);
    pack_cstr(&pk, "limits");
    msgpack_pack_map(&pk, 8);
#define LIM(name, v) pack_cstr(&pk, name), msgpack_pack_uint64(&pk, v)
    LIM("max_message_bytes", info->limits.max_message_bytes);
    LIM("max_depth", info->limits.max_depth);
    LIM("max_string_bytes", info->limits.max_string_bytes);
    LIM("max_array_len", info->limits.max_array_len);
    LIM("max_map_len", info->limits.max_map_len);
    LIM("max_tokens", (uint64_t)info->n_ctx);
    LIM("max_stop", CAIRN_MAX_STOP);
    LIM("max_stop_bytes", MAX_STOP_BYTES);
#undef LIM
    return s.failed ? CAIRN_ENOMEM : CAIRN_OK;
}

int cairn_rpc_pack_tokenize(msgpack_sbuffer *sb, const cairn_rpc_call *call)
{
    PACKER(pk, s, sb);
    pack_result_head(&pk, call->msgid);
    msgpack_pack_map(&pk, 1);
    pack_cstr(&pk, "tokens");
    pack_tokens(&pk, call->tokens, call->n_tokens);
    return s.failed ? CAIRN_ENOMEM : CAIRN_OK;
}

int cairn_rpc_pack_detokenize(msgpack_sbuffer *sb, const cairn_rpc_context *ctx,
                              const cairn_rpc_call *call)
{
    if (!ctx->vocab)
        return cairn_rpc_pack_error(sb, call->msgid, CAIRN_RPC_UNSUPPORTED,
                                    "this server cannot detokenize");
    cairn_detok *d = NULL;
    strbuf b = {0};
    char piece[512];
    size_t n = 0;
    int rc = cairn_detok_create(ctx->vocab, false, &d);
    for (size_t i = 0; rc == CAIRN_OK && i <= call->n_tokens; i++) {
        rc = i < call->n_tokens ? cairn_detok_push(d, call->tokens[i], piece, sizeof piece, &n)
                                : cairn_detok_flush(d, piece, sizeof piece, &n);
        if (rc == CAIRN_OK)
            sb_add(&b, piece, n);
        /* Token pieces can be long; the answer must stay within the limit a
         * client is told strings have. */
        if (rc == CAIRN_OK && b.len > ctx->limits.max_string_bytes)
            rc = CAIRN_ERANGE;
    }
    cairn_detok_free(d);
    if (rc == CAIRN_OK && b.oom)
        rc = CAIRN_ENOMEM;
    if (rc != CAIRN_OK) {
        free(b.data);
        return cairn_rpc_pack_error(sb, call->msgid, rc,
                                    rc == CAIRN_ERANGE ? "the text would exceed max_string_bytes"
                                                       : cairn_strerror(rc));
    }
    PACKER(pk, s, sb);
    pack_result_head(&pk, call->msgid);
    msgpack_pack_map(&pk, 1);
    pack_cstr(&pk, "text");
    pack_strn(&pk, b.data, b.len);
    free(b.data);
    return s.failed ? CAIRN_ENOMEM : CAIRN_OK;
}

int cairn_rpc_pack_auth(msgpack_sbuffer *sb, uint32_t msgid, const char *tenant_name)
{
    PACKER(pk, s, sb);
    pack_result_head(&pk, msgid);
    msgpack_pack_map(&pk, 1);
    pack_cstr(&pk, "tenant");
    if (tenant_name)
        pack_cstr(&pk, tenant_name);
    else
        msgpack_pack_nil(&pk);
    return s.failed ? CAIRN_ENOMEM : CAIRN_OK;
}
