/*
 * server/msgpack/rpc.c — one scanned message into a cairn_rpc_call: the
 * envelope [0, msgid, method, [params]] is the wire's; the parameters are
 * read as the JSON object they are and decoded by api/api.h, so a field
 * means the same here as over HTTP.
 *
 * Nothing is trusted: the scanner has bounded every count and length by
 * the bytes received, and the conversion below copies only what is there.
 */
#include "server/msgpack/msgpack.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* ---- methods ---------------------------------------------------------------- */

static const struct {
    const char *name;
    cairn_rpc_method method;
    cairn_api_op op; /* 0: answered by the server itself */
} methods[] = {
    {"server.info", CAIRN_RPC_SERVER_INFO, 0},
    {"generate", CAIRN_RPC_GENERATE, CAIRN_API_GENERATE},
    {"session.open", CAIRN_RPC_SESSION_OPEN, CAIRN_API_SESSION_OPEN},
    {"session.append", CAIRN_RPC_SESSION_APPEND, CAIRN_API_SESSION_APPEND},
    {"session.generate", CAIRN_RPC_SESSION_GENERATE, CAIRN_API_SESSION_GENERATE},
    {"session.fork", CAIRN_RPC_SESSION_FORK, CAIRN_API_SESSION_FORK},
    {"session.truncate", CAIRN_RPC_SESSION_TRUNCATE, CAIRN_API_SESSION_TRUNCATE},
    {"session.close", CAIRN_RPC_SESSION_CLOSE, CAIRN_API_SESSION_CLOSE},
    {"session.info", CAIRN_RPC_SESSION_INFO, CAIRN_API_SESSION_INFO},
    {"gen.cancel", CAIRN_RPC_GEN_CANCEL, CAIRN_API_CANCEL},
    {"tokenize", CAIRN_RPC_TOKENIZE, CAIRN_API_TOKENIZE},
    {"detokenize", CAIRN_RPC_DETOKENIZE, CAIRN_API_DETOKENIZE},
    {"cache.stats", CAIRN_RPC_CACHE_STATS, CAIRN_API_CACHE_STATS},
    {"auth", CAIRN_RPC_AUTH, 0},
};

const char *cairn_rpc_method_name(cairn_rpc_method m)
{
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (methods[i].method == m)
            return methods[i].name;
    return "?";
}

static cairn_api_op op_of(cairn_rpc_method m)
{
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (methods[i].method == m)
            return methods[i].op;
    return 0;
}

/* ---- msgpack as JSON ---------------------------------------------------------- */

#define MAX_JSON_DEPTH 64

/* One msgpack value as a jansson value: nil -> null, integers (one above
 * 2^63 - 1, which a JSON integer here cannot hold, as its decimal text: the
 * form api/api.h takes for a seed that large), floats, strings (bytes as they are: text
 * is not UTF-8-checked here, the tokenizer takes any bytes), arrays, maps
 * (integer keys as their decimal text: JSON clients' logit_bias), bin and
 * ext -> null (no request field takes them; an unknown field stays
 * ignorable). NULL: malformed, too deep, or out of memory. */
static json_t *mp_to_json(cairn_mp_reader *r, int depth)
{
    if (depth > MAX_JSON_DEPTH)
        return NULL;
    switch (cairn_mp_peek(r)) {
    case CAIRN_MP_NIL: return cairn_mp_read_nil(r) == CAIRN_OK ? json_null() : NULL;
    case CAIRN_MP_BOOL: {
        bool b;
        return cairn_mp_read_bool(r, &b) == CAIRN_OK ? json_boolean(b) : NULL;
    }
    case CAIRN_MP_UINT: {
        uint64_t v;
        if (cairn_mp_read_uint(r, &v) != CAIRN_OK)
            return NULL;
        if (v <= (uint64_t)INT64_MAX)
            return json_integer((json_int_t)v);
        char digits[24];
        snprintf(digits, sizeof digits, "%llu", (unsigned long long)v);
        return json_string(digits);
    }
    case CAIRN_MP_NINT: {
        int64_t v;
        return cairn_mp_read_int(r, &v) == CAIRN_OK ? json_integer(v) : NULL;
    }
    case CAIRN_MP_FLOAT: {
        double v;
        if (cairn_mp_read_number(r, &v) != CAIRN_OK)
            return NULL;
        return isfinite(v) ? json_real(v) : json_string("non-finite number");
    }
    case CAIRN_MP_STR: {
        const char *str;
        uint32_t len;
        return cairn_mp_read_str(r, &str, &len) == CAIRN_OK ? json_stringn_nocheck(str, len)
                                                             : NULL;
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
            char num[24];
            int64_t k;
            if (cairn_mp_peek(r) == CAIRN_MP_UINT || cairn_mp_peek(r) == CAIRN_MP_NINT) {
                if (cairn_mp_read_int(r, &k) != CAIRN_OK)
                    k = -1;
                key_len = (uint32_t)snprintf(num, sizeof num, "%lld", (long long)k);
                key = num;
            } else if (cairn_mp_read_str(r, &key, &key_len) != CAIRN_OK) {
                json_decref(o);
                return NULL;
            }
            json_t *v = mp_to_json(r, depth + 1);
            if (!v || json_object_setn_new_nocheck(o, key, key_len, v) != 0) { /* v is taken */
                json_decref(o);
                o = NULL;
            }
        }
        return o;
    }
    case CAIRN_MP_BIN:
    case CAIRN_MP_EXT: return cairn_mp_skip(r) == CAIRN_OK ? json_null() : NULL;
    default: return NULL;
    }
}

/* An array of token ids read as ids, not as JSON values (a long prompt's
 * tokens would cost megabytes of them); `true` stands in its place in the
 * params. Elements that are not 32-bit integers are -1, the first one
 * named in t->bad. */
static json_t *read_ids(cairn_mp_reader *r, cairn_api_tokens *t, int32_t **buf)
{
    uint32_t n;
    if (cairn_mp_read_array(r, &n) != CAIRN_OK)
        return NULL;
    /* n is honest: the scanner checked it against the bytes received */
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids)
        return NULL;
    t->bad = -1;
    for (uint32_t i = 0; i < n; i++) {
        int64_t v;
        bool ok = (cairn_mp_peek(r) == CAIRN_MP_UINT || cairn_mp_peek(r) == CAIRN_MP_NINT) &&
                  cairn_mp_read_int(r, &v) == CAIRN_OK && v >= INT32_MIN && v <= INT32_MAX;
        if (!ok && cairn_mp_skip(r) != CAIRN_OK) {
            free(ids);
            return NULL;
        }
        if (!ok && t->bad < 0)
            t->bad = i;
        ids[i] = ok ? (int32_t)v : -1;
    }
    free(*buf);
    *buf = ids;
    t->ids = ids;
    t->n = n;
    return json_true();
}

/* The params map as a JSON object: names must be strings, none given twice;
 * an array under "tokens" goes to *tokens instead (its ids in *buf, the
 * caller's to free). */
static int params_to_json(cairn_mp_reader *r, json_t **out, cairn_api_tokens *tokens,
                          int32_t **buf, cairn_rpc_error *err)
{
    uint32_t n;
    if (cairn_mp_read_map(r, &n) != CAIRN_OK)
        return fail(err, CAIRN_RPC_INVALID_REQUEST, "params must be a map");
    json_t *o = json_object();
    if (!o)
        return fail(err, CAIRN_RPC_OVERLOADED, "out of memory");
    for (uint32_t i = 0; i < n; i++) {
        const char *key;
        uint32_t key_len;
        int rc = CAIRN_OK;
        json_t *v = NULL;
        if (cairn_mp_read_str(r, &key, &key_len) != CAIRN_OK)
            rc = fail(err, CAIRN_RPC_INVALID_REQUEST, "parameter names must be strings");
        else if (json_object_getn(o, key, key_len))
            rc = fail(err, CAIRN_RPC_INVALID_REQUEST, "parameter '%.*s' is given twice",
                      (int)(key_len < 64 ? key_len : 64), key);
        else if (!(v = key_len == 6 && memcmp(key, "tokens", 6) == 0 &&
                               cairn_mp_peek(r) == CAIRN_MP_ARRAY
                           ? read_ids(r, tokens, buf)
                           : mp_to_json(r, 0)))
            rc = fail(err, CAIRN_RPC_INVALID_REQUEST, "parameter '%.*s' cannot be read",
                      (int)(key_len < 64 ? key_len : 64), key);
        else if (json_object_setn_new_nocheck(o, key, key_len, v) != 0)
            rc = fail(err, CAIRN_RPC_OVERLOADED, "out of memory");
        if (rc != CAIRN_OK) {
            json_decref(o);
            return rc;
        }
    }
    *out = o;
    return CAIRN_OK;
}

/* ---- the envelope -------------------------------------------------------------- */


/* [0, msgid, method, params]: fills call->msgid and call->method, and leaves
 * *params_out at the params map (or an empty one). */
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

/* auth {token}: only the type is checked here; whether the token is right
 * (and whether its length is possible at all) is the server's question,
 * answered in constant time. */
static int decode_auth(cairn_mp_reader *pr, cairn_rpc_call *call, cairn_rpc_error *err)
{
    uint32_t n;
    if (cairn_mp_read_map(pr, &n) != CAIRN_OK)
        return fail(err, CAIRN_RPC_INVALID_REQUEST, "params must be a map");
    for (uint32_t i = 0; i < n; i++) {
        const char *key;
        uint32_t key_len;
        if (cairn_mp_read_str(pr, &key, &key_len) != CAIRN_OK)
            return fail(err, CAIRN_RPC_INVALID_REQUEST, "parameter names must be strings");
        if (key_len == 5 && memcmp(key, "token", 5) == 0 && cairn_mp_peek(pr) != CAIRN_MP_NIL) {
            if (call->token)
                return fail(err, CAIRN_RPC_INVALID_REQUEST, "parameter 'token' is given twice");
            if (cairn_mp_read_str(pr, &call->token, &call->token_len) != CAIRN_OK)
                return fail(err, CAIRN_RPC_INVALID_REQUEST, "'token' must be a string");
        } else if (cairn_mp_skip(pr) != CAIRN_OK) {
            return fail(err, CAIRN_RPC_INVALID_REQUEST, "truncated parameter value");
        }
    }
    if (!call->token)
        return fail(err, CAIRN_RPC_INVALID_REQUEST, "'token' is required");
    return CAIRN_OK;
}

/* The api's answer moved into the call's fields. */
static void take_api_call(cairn_rpc_call *call, cairn_api_call *a)
{
    cairn_request *r = a->req;
    call->has_content = a->has_content;
    call->tools_json = a->tools_json;
    a->tools_json = NULL;
    call->text = a->text;
    call->text_len = a->text_len;
    a->text = NULL;
    call->conv = a->conv;
    a->conv = (cairn_api_conversation){0};
    if (!r) { /* tokenize, detokenize: the tokens are the answer, or the question */
        call->tokens = a->tokens;
        call->n_tokens = a->n_tokens;
        a->tokens = NULL;
        return;
    }
    call->tokens = r->tokens;
    call->n_tokens = r->n_tokens;
    r->tokens = NULL;
    call->chat_turn = r->chat_turn;
    call->session = r->session;
    call->gen = r->gen; /* stop strings and the grammar move too */
    r->gen.n_stop = 0;
    r->gen.grammar = NULL;
    call->target = (uint32_t)r->target;
    call->n_keep = r->n_keep;
    call->persist = r->persist;
    call->n_pins = r->n_pins;
    for (int i = 0; i < r->n_pins && i < CAIRN_MAX_PINS; i++) {
        call->pins[i].tokens = r->pins[i].tokens;
        call->pins[i].ttl_s = r->pins[i].ttl_s;
    }
}

static int decode_params(const cairn_rpc_context *ctx, cairn_mp_reader *pr, uint64_t seed,
                         cairn_rpc_call *call, cairn_rpc_error *err)
{
    if (call->method == CAIRN_RPC_AUTH)
        return decode_auth(pr, call, err);
    json_t *params = NULL;
    int32_t *ids = NULL;
    cairn_api_tokens tokens = {.bad = -1};
    int rc = params_to_json(pr, &params, &tokens, &ids, err);
    if (rc != CAIRN_OK) {
        free(ids);
        return rc;
    }
    const cairn_api_op op = op_of(call->method);
    if (op == 0) { /* server.info */
        json_decref(params);
        free(ids);
        return CAIRN_OK;
    }
    cairn_api_call a;
    cairn_api_error e;
    rc = cairn_api_decode(ctx->api, op, params, seed, NULL, ids ? &tokens : NULL, &a, &e);
    json_decref(params);
    free(ids);
    if (rc != CAIRN_OK)
        return fail(err, cairn_rpc_error_code(rc), "%s", e.message);
    take_api_call(call, &a);
    cairn_api_call_clear(&a);
    return CAIRN_OK;
}

int cairn_rpc_decode(const cairn_rpc_context *ctx, const uint8_t *msg, size_t len,
                     uint64_t *seed_source, cairn_rpc_call *call, cairn_rpc_error *err)
{
    cairn_mp_reader pr;
    int rc = decode_envelope(msg, len, call, &pr, err);
    if (rc == CAIRN_OK)
        rc = decode_params(ctx, &pr, seed_source ? cairn_splitmix64(seed_source) : 0, call, err);
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
    if (rc == CAIRN_OK)
        rc = decode_auth(&pr, call, err); /* auth reads no context */
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
    cairn_api_gen_clear(&call->gen);
    free(call->tools_json);
    free(call->text);
    json_decref(call->conv.msgs);
    free(call->conv.system);
    memset(call, 0, sizeof *call);
}
