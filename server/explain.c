/*
 * server/explain.c — the front ends' side of "why was my prompt recomputed"
 * (session.h, cairn_cache_miss). The engine says where a prompt departed
 * from the closest cached sequence; when that is inside the conversation
 * (CAIRN_MISS_DEPARTED) only the request's structure can tell which part
 * changed. A chat call's conversation is therefore kept (srv_conv) until its
 * generation is done, and then, only for such a miss, a text worker renders
 * prefixes of it to find the part: O(log parts) renderings, never on the
 * loop thread and never in an engine step.
 *
 * The parts, as api.h's cairn_api_conversation_end finds them:
 *   [preamble + system text + tool list] [message 1] ... [final message] [reply opener]
 *    departure inside:  the tool list   -> tools_changed
 *                       the rest of it  -> system_changed
 *                       an earlier msg  -> history_rewritten
 *                       the final msg or after -> new_content
 * Where the tool list starts: the end of the system part rendered without
 * the tools (its longest common prefix with the prompt stops where the tool
 * text begins, for templates that put the tools after the system text).
 */
#include "server/server_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

srv_conv *srv_conv_take(cairn_api_call *call)
{
    /* the prompt must be all of what the engine looks up: a plain generation,
     * a named session's turn (its tokens are the whole prompt), or a stored
     * response that continues nothing (its new session holds only these) */
    const bool whole = call && call->req &&
                       (call->req->kind == CAIRN_REQ_GENERATE ||
                        call->req->kind == CAIRN_REQ_SESSION_SYNC ||
                        (call->req->kind == CAIRN_REQ_SESSION_GENERATE &&
                         call->op == CAIRN_API_RESPONSES && !call->has_previous));
    if (!whole ||
        cairn_api_conversation_parts(call) == 0 || call->req->n_tokens == 0)
        return NULL;
    srv_conv *k = calloc(1, sizeof *k);
    if (!k)
        return NULL;
    k->tokens = malloc(call->req->n_tokens * sizeof *k->tokens);
    if (!k->tokens || (call->tools_json && !(k->call.tools_json = strdup(call->tools_json)))) {
        srv_conv_release(k);
        return NULL;
    }
    memcpy(k->tokens, call->req->tokens, call->req->n_tokens * sizeof *k->tokens);
    k->n_tokens = call->req->n_tokens;
    k->call.conv = call->conv; /* moved: the call no longer needs it */
    call->conv = (cairn_api_conversation){0};
    k->refs = 1;
    return k;
}

void srv_conv_release(srv_conv *k)
{
    if (!k || --k->refs > 0)
        return;
    cairn_api_call_clear(&k->call);
    free(k->tokens);
    free(k);
}

static bool first_part_is_system(const srv_conv *k)
{
    if (k->call.conv.system)
        return true;
    const json_t *m0 = json_array_get(k->call.conv.msgs, 0);
    const char *role = json_string_value(json_object_get(m0, "role"));
    return role && (strcmp(role, "system") == 0 || strcmp(role, "developer") == 0);
}

cairn_miss_reason srv_conv_classify(const cairn_api *api, const srv_conv *k, int64_t departure)
{
    const size_t parts = cairn_api_conversation_parts(&k->call);
    const size_t d = departure > 0 ? (size_t)departure : 0;
    const bool tools = k->call.tools_json != NULL;
    const size_t sys = first_part_is_system(k) ? 1 : 0;
    size_t end = 0;
    if (cairn_api_conversation_end(api, &k->call, sys, true, k->tokens, k->n_tokens, &end))
        return CAIRN_MISS_NEW_CONTENT;
    if (d < end) {
        size_t no_tools = 0;
        if (tools && cairn_api_conversation_end(api, &k->call, sys, false, k->tokens, k->n_tokens,
                                                &no_tools) == CAIRN_OK &&
            d >= no_tools)
            return CAIRN_MISS_TOOLS_CHANGED;
        return CAIRN_MISS_SYSTEM_CHANGED;
    }
    /* the first k whose parts end past the departure: it is in part k-1 */
    size_t lo = sys + 1, hi = parts;
    if (lo > hi)
        return CAIRN_MISS_NEW_CONTENT;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cairn_api_conversation_end(api, &k->call, mid, true, k->tokens, k->n_tokens, &end))
            return CAIRN_MISS_NEW_CONTENT;
        if (end > d)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo < parts ? CAIRN_MISS_HISTORY_REWRITTEN : CAIRN_MISS_NEW_CONTENT;
}

/* ---- the work item ------------------------------------------------------ */

static void classify_work(srv_work *w)
{
    srv_classify *k = (srv_classify *)w;
    k->reason = srv_conv_classify(&w->srv->api, k->conv, k->node->ev.miss.departure);
}

static void classify_done(srv_work *w, srv_conn *c)
{
    srv_classify *k = (srv_classify *)w;
    k->node->ev.miss.reason = k->reason;
    bool kept = c ? k->answer(k, c) : false;
    if (!kept)
        free(k->node);
    srv_conv_release(k->conv);
    free(k);
}

int srv_classify_queue(cairn_server *s, srv_classify *k, uint64_t conn_id)
{
    k->w.conn_id = conn_id;
    k->w.work = classify_work;
    k->w.done = classify_done;
    k->conv->refs++;
    int rc = srv_work_queue(s, &k->w);
    if (rc)
        k->conv->refs--;
    return rc;
}

/* ---- reporting ----------------------------------------------------------- */

void srv_miss_count(cairn_server *s, const cairn_cache_miss *m)
{
    if (m->known && m->reason > CAIRN_MISS_NONE && m->reason < CAIRN_MISS_REASONS)
        s->misses[m->reason == CAIRN_MISS_DEPARTED ? CAIRN_MISS_NEW_CONTENT : m->reason]++;
}

/* Tokens as text, with bytes that do not form UTF-8 (a token may hold part
 * of a character) replaced by U+FFFD, so the excerpt is always valid. */
static json_t *excerpt(const cairn_api *api, const int32_t *tokens, int n)
{
    char raw[512], out[1600];
    size_t len = 0, o = 0;
    for (int i = 0; i < n; i++) {
        size_t got = 0;
        if (cairn_api_token_piece(api, tokens[i], raw + len, sizeof raw - len, &got) == CAIRN_OK)
            len += got;
    }
    for (size_t i = 0; i < len && o + 4 < sizeof out;) {
        const unsigned char b = (unsigned char)raw[i];
        size_t need = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
        bool ok = need > 0 && i + need <= len;
        for (size_t j = 1; ok && j < need; j++)
            ok = ((unsigned char)raw[i + j] >> 6) == 2;
        if (ok) {
            memcpy(out + o, raw + i, need);
            o += need;
            i += need;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    json_t *v = json_stringn(out, o);
    return v ? v : json_string("");
}

static const char *const tier_name[3] = {"device", "host", "disk"};

json_t *srv_miss_json(const cairn_api *api, const cairn_cache_miss *m)
{
    if (!m->known)
        return json_null();
    cairn_miss_reason r = m->reason == CAIRN_MISS_DEPARTED ? CAIRN_MISS_NEW_CONTENT : m->reason;
    const char *name = cairn_miss_reason_name(r);
    json_t *o = json_pack("{s:o, s:I, s:I, s:o, s:o, s:o, s:o}", "reason",
                          name ? json_string(name) : json_null(), "position",
                          (json_int_t)m->departure, "closest_tokens",
                          (json_int_t)m->closest_tokens, "closest_tier",
                          m->tier >= 0 && m->tier < 3 ? json_string(tier_name[m->tier]) : json_null(),
                          "evicted_tier",
                          m->evicted_tier >= 0 && m->evicted_tier < 3
                              ? json_string(tier_name[m->evicted_tier])
                              : json_null(),
                          "prompt_excerpt", excerpt(api, m->prompt_next, m->n_prompt_next),
                          "cached_excerpt", excerpt(api, m->cached_next, m->n_cached_next));
    return o ? o : json_null();
}
