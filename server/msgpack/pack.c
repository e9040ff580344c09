/*
 * server/msgpack/pack.c — responses and notifications of the native
 * protocol, packed with msgpack-c (docs/protocol.md gives their shapes), and
 * the protocol's error words.
 */
#include "server/msgpack/msgpack.h"

#include <jansson.h>
#include <string.h>

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
    case CAIRN_EQUOTA: /* try again once the caller's pins expire */
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
    msgpack_pack_map(pk, st->shared.on ? 22 : 21);
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
    U64("partial_tokens", st->partial_tokens);
    U64("shared_waits", st->shared_waits);
    U64("running", st->running);
    U64("waiting", st->waiting);
    U64("sessions", st->sessions);
    U64("stored_responses", st->stored_responses);
    U64("pinned_tokens", st->pinned_tokens); /* retention hints (session.h) */
    U64("pinned_prefixes", st->pinned_prefixes);
    U64("pins_refused", st->pins_refused);
    pack_cstr(pk, "write_behind"); /* reused prefixes to disk (store.h) */
    msgpack_pack_map(pk, 5);
    U64("pages", st->behind.pages);
    U64("queued", st->behind.queued);
    U64("waiting", st->behind.waiting);
    U64("dropped", st->behind.dropped);
    pack_cstr(pk, "engine_ms");
    msgpack_pack_double(pk, st->behind.seconds * 1e3);
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
    if (st->shared.on) { /* tier 3 (Redis): docs/scale-out.md */
        pack_cstr(pk, "shared");
        msgpack_pack_map(pk, 11);
        pack_cstr(pk, "up");
        if (st->shared.up)
            msgpack_pack_true(pk);
        else
            msgpack_pack_false(pk);
        U64("hits", st->shared.hits);
        U64("misses", st->shared.misses);
        U64("corrupt", st->shared.corrupt);
        U64("pages_queued", st->shared.pages_queued);
        U64("writes", st->shared.puts);
        U64("dropped", st->shared.dropped);
        U64("errors", st->shared.errors);
        U64("events", st->shared.events);
        U64("outages", st->shared.outages);
        U64("queued_bytes", st->shared.queued_bytes);
    }
#undef U64
}

/* A JSON value (tool calls) as msgpack. */
static const char *miss_tier(int t)
{
    static const char *const names[3] = {"device", "host", "disk"};
    return t >= 0 && t < 3 ? names[t] : NULL;
}

static void pack_cstr_or_nil(msgpack_packer *pk, const char *s)
{
    if (s)
        pack_cstr(pk, s);
    else
        msgpack_pack_nil(pk);
}

/* usage.cache_miss (docs/protocol.md): as HTTP's, with the excerpts as token
 * ids (this protocol's currency); nil when the cache was not looked at. */
static void pack_miss(msgpack_packer *pk, const cairn_cache_miss *m)
{
    if (!m->known) {
        msgpack_pack_nil(pk);
        return;
    }
    msgpack_pack_map(pk, 7);
    pack_cstr(pk, "reason");
    pack_cstr_or_nil(pk, cairn_miss_reason_name(m->reason));
    pack_cstr(pk, "position");
    msgpack_pack_int64(pk, m->departure);
    pack_cstr(pk, "closest_tokens");
    msgpack_pack_int64(pk, m->closest_tokens);
    pack_cstr(pk, "closest_tier");
    pack_cstr_or_nil(pk, miss_tier(m->tier));
    pack_cstr(pk, "evicted_tier");
    pack_cstr_or_nil(pk, miss_tier(m->evicted_tier));
    pack_cstr(pk, "prompt_excerpt");
    pack_tokens(pk, m->prompt_next, (size_t)m->n_prompt_next);
    pack_cstr(pk, "cached_excerpt");
    pack_tokens(pk, m->cached_next, (size_t)m->n_cached_next);
}

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
        const bool reasoning = calls && calls->reasoning;
        msgpack_pack_map(&pk, 4 + (tool_calls ? 1 : 0) + (calls ? 1 : 0) + (reasoning ? 1 : 0));
        pack_cstr(&pk, "text");
        pack_strn(&pk, ev->text, ev->text_len);
        pack_cstr(&pk, "tokens");
        pack_tokens(&pk, ev->tokens, ev->n_tokens);
        pack_cstr(&pk, "finish_reason");
        pack_cstr(&pk, tool_calls ? "tool_calls" : ev->finish_reason ? ev->finish_reason : "stop");
        if (tool_calls) {
            pack_cstr(&pk, "tool_calls");
            pack_json(&pk, tool_calls);
            json_decref(tool_calls);
        }
        if (calls) {
            pack_cstr(&pk, "content");
            pack_cstr(&pk, calls->content ? calls->content : "");
        }
        if (reasoning) {
            pack_cstr(&pk, "reasoning");
            pack_cstr(&pk, calls->reasoning);
        }
        pack_cstr(&pk, "usage");
        msgpack_pack_map(&pk, ev->spec_forwards > 0 ? 6 : 5);
        pack_cstr(&pk, "cache_miss");
        pack_miss(&pk, &ev->miss);
        pack_cstr(&pk, "prompt_tokens");
        msgpack_pack_int64(&pk, ev->prompt_tokens);
        pack_cstr(&pk, "cached_tokens");
        msgpack_pack_int64(&pk, ev->cached_tokens);
        pack_cstr(&pk, "cached_tokens_by_tier");
        msgpack_pack_map(&pk, 4);
        pack_cstr(&pk, "device");
        msgpack_pack_int64(&pk, ev->cached_by_tier[0]);
        pack_cstr(&pk, "host");
        msgpack_pack_int64(&pk, ev->cached_by_tier[1]);
        pack_cstr(&pk, "disk");
        msgpack_pack_int64(&pk, ev->cached_by_tier[2]);
        pack_cstr(&pk, "shared");
        msgpack_pack_int64(&pk, ev->cached_by_tier[3]);
        pack_cstr(&pk, "completion_tokens");
        msgpack_pack_int64(&pk, ev->completion_tokens);
        if (ev->spec_forwards > 0) { /* how the reply was decoded (docs/protocol.md) */
            pack_cstr(&pk, "speculative");
            msgpack_pack_map(&pk, 6);
            pack_cstr(&pk, "method");
            pack_cstr(&pk, ev->spec_method);
            pack_cstr(&pk, "steps");
            msgpack_pack_int64(&pk, ev->spec_forwards);
            pack_cstr(&pk, "tokens");
            msgpack_pack_int64(&pk, ev->spec_tokens);
            pack_cstr(&pk, "tau");
            msgpack_pack_double(&pk, (double)ev->spec_tokens / (double)ev->spec_forwards);
            pack_cstr(&pk, "drafted");
            msgpack_pack_int64(&pk, ev->spec_drafted);
            pack_cstr(&pk, "accepted");
            msgpack_pack_int64(&pk, ev->spec_accepted);
        }
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
    msgpack_pack_map(&pk, 5);
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
    pack_cstr(&pk, "kv_type");
    pack_cstr(&pk, info->kv_type ? info->kv_type : "");
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
    LIM("max_stop_bytes", CAIRN_API_MAX_STOP_BYTES);
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

int cairn_rpc_pack_detokenize(msgpack_sbuffer *sb, const cairn_rpc_call *call)
{
    PACKER(pk, s, sb);
    pack_result_head(&pk, call->msgid);
    msgpack_pack_map(&pk, 1);
    pack_cstr(&pk, "text");
    pack_strn(&pk, call->text, call->text_len);
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
