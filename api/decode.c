/*
 * api/decode.c — each op: which fields it takes and the engine request it
 * becomes (api.h); and the helpers front ends use on results.
 */
#include "api/api_impl.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const cairn_req_kind kind_of[] = {
    [CAIRN_API_GENERATE] = CAIRN_REQ_GENERATE,
    [CAIRN_API_SESSION_OPEN] = CAIRN_REQ_SESSION_OPEN,
    [CAIRN_API_SESSION_APPEND] = CAIRN_REQ_SESSION_APPEND,
    [CAIRN_API_SESSION_GENERATE] = CAIRN_REQ_SESSION_GENERATE,
    [CAIRN_API_SESSION_FORK] = CAIRN_REQ_SESSION_FORK,
    [CAIRN_API_SESSION_TRUNCATE] = CAIRN_REQ_SESSION_TRUNCATE,
    [CAIRN_API_SESSION_CLOSE] = CAIRN_REQ_SESSION_CLOSE,
    [CAIRN_API_SESSION_INFO] = CAIRN_REQ_SESSION_INFO,
    [CAIRN_API_CANCEL] = CAIRN_REQ_CANCEL,
    [CAIRN_API_CACHE_STATS] = CAIRN_REQ_CACHE_STATS,
    [CAIRN_API_CHAT] = CAIRN_REQ_GENERATE,
    [CAIRN_API_COMPLETION] = CAIRN_REQ_GENERATE,
};

static int session_id_field(const json_t *params, cairn_session_id *out, cairn_api_error *e)
{
    const char *s;
    size_t len;
    if (!api_field(params, "session_id"))
        return api_fail(e, CAIRN_EINVAL, "session_id", "'session_id' is required");
    int rc = api_get_str(params, "session_id", &s, &len, e);
    if (rc)
        return rc;
    if (cairn_session_id_from_hex(s, len, out) != CAIRN_OK)
        return api_fail(e, CAIRN_EINVAL, "session_id", "'session_id' must be 32 hex digits");
    return CAIRN_OK;
}

/* The content of a native op into the request. */
static int native_content(const cairn_api *api, const json_t *params, cairn_api_op op,
                          const cairn_api_tokens *typed, cairn_api_call *c, cairn_api_error *e)
{
    cairn_request *r = c->req;
    api_content_rules rules = {.text_field = op == CAIRN_API_GENERATE ? "prompt" : "text",
                               .allow_messages = true,
                               .allow_system = op == CAIRN_API_GENERATE ||
                                               op == CAIRN_API_SESSION_OPEN,
                               .first = op == CAIRN_API_GENERATE || op == CAIRN_API_SESSION_OPEN,
                               .assistant = op == CAIRN_API_GENERATE ||
                                            op == CAIRN_API_SESSION_GENERATE,
                               .tools_json = c->tools_json,
                               .typed = typed};
    bool given = false;
    int rc = api_native_content(api, params, &rules, &r->tokens, &r->n_tokens, &given,
                                &r->chat_turn, &c->conv, e);
    if (rc)
        return rc;
    c->has_content = given;
    if (op == CAIRN_API_GENERATE && !given)
        return api_fail(e, CAIRN_EINVAL, "prompt", "'prompt', 'messages' or 'tokens' is required");
    if (op == CAIRN_API_GENERATE && r->n_tokens == 0)
        return api_fail(e, CAIRN_EINVAL, "prompt", "the prompt is empty");
    if (op == CAIRN_API_SESSION_APPEND && !given)
        return api_fail(e, CAIRN_EINVAL, "text", "one of 'messages', 'text' or 'tokens' is required");
    return CAIRN_OK;
}

/* cache_pin {tokens?, ttl_s}: keep the first `tokens` tokens of the
 * sequence (all of the prompt when absent) cached for ttl_s seconds after
 * the request (session.h, "Retention"). The native field, also taken by
 * OpenAI's routes as cairn's extension. */
static int cache_pin_field(const json_t *params, cairn_request *r, cairn_api_error *e)
{
    json_t *pin = api_field(params, "cache_pin");
    if (!pin)
        return CAIRN_OK;
    if (!json_is_object(pin))
        return api_fail(e, CAIRN_EINVAL, "cache_pin",
                        "'cache_pin' must be an object {\"ttl_s\": seconds, \"tokens\": n}");
    json_t *ttl = api_field(pin, "ttl_s");
    int64_t n = 0;
    if (!ttl || !json_is_number(ttl) || !(json_number_value(ttl) > 0) ||
        json_number_value(ttl) > CAIRN_PIN_MAX_TTL_S)
        return api_fail(e, CAIRN_EINVAL, "cache_pin.ttl_s",
                        "'cache_pin.ttl_s' must be a number of seconds in (0, %.0f]",
                        CAIRN_PIN_MAX_TTL_S);
    json_t *tokens = api_field(pin, "tokens");
    if (tokens && (!api_json_int(tokens, &n) || n < 1))
        return api_fail(e, CAIRN_EINVAL, "cache_pin.tokens",
                        "'cache_pin.tokens' must be an integer >= 1 (absent: the whole prompt)");
    r->n_pins = 1;
    r->pins[0].tokens = (size_t)n;
    r->pins[0].ttl_s = json_number_value(ttl);
    return CAIRN_OK;
}

/* OpenAI's prompt_cache_retention: "in_memory" is what every prompt gets
 * (cached while there is room, no pin); "24h" pins the whole prompt for 24
 * hours (a cache_pin of its prompt). */
static int retention_field(const json_t *params, cairn_request *r, cairn_api_error *e)
{
    json_t *v = api_field(params, "prompt_cache_retention");
    if (!v)
        return CAIRN_OK;
    const char *s = json_string_value(v);
    if (s && strcmp(s, "in_memory") == 0)
        return CAIRN_OK;
    if (!s || strcmp(s, "24h") != 0)
        return api_fail(e, CAIRN_EINVAL, "prompt_cache_retention",
                        "'prompt_cache_retention' must be \"in_memory\" or \"24h\"");
    if (r->n_pins == 0) { /* an explicit cache_pin says more */
        r->n_pins = 1;
        r->pins[0].tokens = 0;
        r->pins[0].ttl_s = CAIRN_PIN_MAX_TTL_S;
    }
    return CAIRN_OK;
}

/* generate, session.open / .append / .generate. */
static int decode_native_content_op(const cairn_api *api, cairn_api_op op, const json_t *params,
                                    uint64_t seed, const cairn_api_tokens *typed,
                                    cairn_api_call *c, cairn_api_error *e)
{
    cairn_request *r = c->req;
    const bool generates = op == CAIRN_API_GENERATE || op == CAIRN_API_SESSION_GENERATE;
    int rc;
    if (op != CAIRN_API_GENERATE && op != CAIRN_API_SESSION_OPEN &&
        (rc = session_id_field(params, &r->session, e)))
        return rc;
    if (generates && (rc = api_gen_fields(api, op, params, seed, &r->gen, e)))
        return rc;
    if (op == CAIRN_API_SESSION_APPEND) {
        if (api_field(params, "tools") || api_field(params, "tool_choice"))
            return api_fail(e, CAIRN_EINVAL, "tools",
                            "'tools' go with generate, session.open and session.generate");
    } else if ((rc = api_tools(api, params, generates, &r->gen, &c->tools_json, e))) {
        return rc;
    }
    if (op == CAIRN_API_SESSION_OPEN) {
        int64_t ttl = 0; /* accepted and checked; sessions do not expire yet */
        if ((rc = api_get_bool(params, "persist", &r->persist, e)) ||
            (rc = api_get_int(params, "ttl_s", 0, (int64_t)1e12, &ttl, e)))
            return rc;
    }
    if (generates && (rc = cache_pin_field(params, r, e)))
        return rc;
    c->stream = r->gen.stream;
    return native_content(api, params, op, typed, c, e);
}

/* tokenize / detokenize: answered from the vocabulary alone. */
static int decode_vocab_op(const cairn_api *api, cairn_api_op op, const json_t *params,
                           const cairn_api_tokens *typed, cairn_api_call *c, cairn_api_error *e)
{
    if (op == CAIRN_API_DETOKENIZE) {
        json_t *ids = api_field(params, "tokens");
        if (!ids)
            return api_fail(e, CAIRN_EINVAL, "tokens", "'tokens' is required");
        int rc = api_token_array(api, ids, typed, "tokens", api->max_tokenize, &c->tokens,
                                 &c->n_tokens, e);
        if (rc)
            return rc;
        c->has_content = true;
        if (!api->vocab)
            return api_fail(e, CAIRN_EUNSUPPORTED, "tokens", "this server cannot detokenize");
        return api_detokenize(api, c->tokens, c->n_tokens, &c->text, &c->text_len, e);
    }
    const char *s;
    size_t len;
    if (!api_field(params, "text"))
        return api_fail(e, CAIRN_EINVAL, "text", "'text' is required");
    bool add_bos = api->vocab && cairn_vocab_add_bos(api->vocab), parse_special = false;
    int rc;
    if ((rc = api_get_str(params, "text", &s, &len, e)) ||
        (rc = api_get_bool(params, "add_bos", &add_bos, e)) ||
        (rc = api_get_bool(params, "parse_special", &parse_special, e)))
        return rc;
    int flags = (add_bos ? CAIRN_TOK_ADD_BOS : 0) | (parse_special ? CAIRN_TOK_PARSE_SPECIAL : 0);
    c->has_content = true;
    return api_tokenize(api, s, len, flags, api->max_tokenize, "text", NULL, &c->tokens,
                        &c->n_tokens, e);
}

/* session_id / prompt_cache_key / X-Session-Id: a named session's key. */
static int session_key(const json_t *params, const char *header, cairn_request *r,
                       cairn_api_error *e)
{
    static const char *const names[] = {"session_id", "prompt_cache_key"};
    const char *key = NULL;
    size_t len = 0;
    for (int i = 0; i < 2 && !key; i++) {
        json_t *v = api_field(params, names[i]);
        if (!v)
            continue;
        if (!json_is_string(v) || json_string_length(v) == 0 ||
            json_string_length(v) > CAIRN_API_MAX_SESSION_KEY)
            return api_fail(e, CAIRN_EINVAL, names[i], "'%s' must be a string of 1 to %d bytes",
                            names[i], CAIRN_API_MAX_SESSION_KEY);
        key = json_string_value(v);
        len = json_string_length(v);
    }
    if (!key && header) {
        key = header;
        len = strlen(key);
        if (len == 0 || len > CAIRN_API_MAX_SESSION_KEY)
            return api_fail(e, CAIRN_EINVAL, NULL, "X-Session-Id must be 1 to %d bytes",
                            CAIRN_API_MAX_SESSION_KEY);
    }
    if (!key)
        return CAIRN_OK;
    if (!(r->session_key = malloc(len + 1)))
        return api_oom(e);
    memcpy(r->session_key, key, len);
    r->session_key[len] = '\0';
    r->session_key_len = len;
    r->kind = CAIRN_REQ_SESSION_SYNC; /* the conversation continues a named session */
    return CAIRN_OK;
}

/* The fields OpenAI's routes take besides the generation ones. */
static int openai_shape(cairn_api_op op, const json_t *params, cairn_api_call *c,
                        cairn_api_error *e)
{
    json_t *model = api_field(params, "model"), *so = api_field(params, "stream_options");
    json_t *best_of = api_field(params, "best_of");
    int64_t n = 1;
    int rc;
    if (model && !json_is_string(model))
        return api_fail(e, CAIRN_EINVAL, "model", "'model' must be a string");
    if ((rc = api_get_int(params, "n", 1, CAIRN_API_MAX_CHOICES, &n, e)))
        return rc;
    c->n_choices = (int)n;
    if (best_of && (!json_is_integer(best_of) || json_integer_value(best_of) != 1))
        return api_fail(e, CAIRN_EINVAL, "best_of", "only best_of = 1 is supported");
    if (so && !json_is_object(so))
        return api_fail(e, CAIRN_EINVAL, "stream_options", "'stream_options' must be an object");
    if (so && (rc = api_get_bool(so, "include_usage", &c->include_usage, e)))
        return rc;
    if (op == CAIRN_API_COMPLETION && (rc = api_get_bool(params, "echo", &c->echo, e)))
        return rc;
    return CAIRN_OK;
}

/* An explicit max_tokens must fit beside every prompt, as OpenAI and vLLM
 * answer: 400 context_length_exceeded rather than a reply silently cut at
 * the context's end. Without it the default is what the context leaves. */
static int fits_context(const cairn_api *api, cairn_api_op op, const json_t *params,
                        const cairn_api_call *c, cairn_api_error *e)
{
    const char *name = op == CAIRN_API_CHAT && api_field(params, "max_completion_tokens")
                           ? "max_completion_tokens" : "max_tokens";
    if (!api_field(params, name) || api->n_ctx <= 0)
        return CAIRN_OK;
    const int64_t want = c->req->gen.max_tokens;
    for (int i = 0; i < (c->n_prompts > 1 ? c->n_prompts : 1); i++) {
        const size_t n = i == 0 ? c->req->n_tokens : c->prompts[i].n_tokens;
        if ((int64_t)n + want <= api->n_ctx)
            continue;
        e->reason = "context_length_exceeded";
        return api_fail(e, CAIRN_ERANGE, name,
                        "This model's maximum context length is %d tokens, but %lld were "
                        "requested (%zu in the %s, %lld for the completion). Shorten the %s "
                        "or lower '%s'.",
                        api->n_ctx, (long long)((int64_t)n + want), n,
                        op == CAIRN_API_CHAT ? "messages" : "prompt", (long long)want,
                        op == CAIRN_API_CHAT ? "messages" : "prompt", name);
    }
    return CAIRN_OK;
}

static int decode_openai(const cairn_api *api, cairn_api_op op, const json_t *params,
                         uint64_t seed, const char *header, cairn_api_call *c,
                         cairn_api_error *e)
{
    cairn_request *r = c->req;
    int rc;
    if ((rc = openai_shape(op, params, c, e)) ||
        (rc = api_gen_fields(api, op, params, seed, &r->gen, e)))
        return rc;
    c->stream = r->gen.stream;
    c->include_usage = c->include_usage && c->stream;
    c->logprobs = r->gen.logprobs;
    if (op == CAIRN_API_CHAT) {
        if ((rc = api_tools(api, params, true, &r->gen, &c->tools_json, e)) ||
            (rc = api_chat_prompt(api, params, c->tools_json, &r->tokens, &r->n_tokens, &c->conv,
                                   e)))
            return rc;
    } else if ((rc = api_completion_prompts(api, params, c, e))) {
        return rc;
    }
    if ((rc = fits_context(api, op, params, c, e)))
        return rc;
    if (c->echo && c->logprobs)
        return api_fail(e, CAIRN_EUNSUPPORTED, "echo",
                        "'echo' with 'logprobs' is not supported (no prompt logprobs)");
    if ((rc = cache_pin_field(params, r, e)) || (rc = retention_field(params, r, e)))
        return rc;
    if ((rc = session_key(params, header, r, e)))
        return rc;
    if (c->n_choices > 1 && r->session_key)
        return api_fail(e, CAIRN_EINVAL, c->n_prompts > 1 ? "prompt" : "n",
                        "'n' > 1 or several prompts cannot be combined with a session key");
    return CAIRN_OK;
}

int cairn_api_decode(const cairn_api *api, cairn_api_op op, const json_t *params,
                     uint64_t random_seed, const char *session_header,
                     const cairn_api_tokens *tokens, cairn_api_call *out, cairn_api_error *err)
{
    /* other wire formats: translated into the requests below (their files) */
    if (op == CAIRN_API_MESSAGES)
        return api_decode_messages(api, params, random_seed, session_header, out, err);
    if (op == CAIRN_API_RESPONSES)
        return api_decode_responses(api, params, random_seed, out, err);
    memset(out, 0, sizeof *out);
    memset(err, 0, sizeof *err);
    out->op = op;
    out->n_choices = 1;
    if (params && !json_is_object(params))
        return api_fail(err, CAIRN_EINVAL, NULL, "params must be a map");
    int rc = CAIRN_OK;
    if (op == CAIRN_API_TOKENIZE || op == CAIRN_API_DETOKENIZE) {
        rc = decode_vocab_op(api, op, params, tokens, out, err);
    } else if (op < CAIRN_API_GENERATE || op > CAIRN_API_COMPLETION) {
        rc = api_fail(err, CAIRN_EINVAL, NULL, "unknown request");
    } else if (!(out->req = cairn_request_new(kind_of[op]))) {
        rc = api_oom(err);
    } else {
        out->req->gen = cairn_api_gen_defaults(api, op);
        cairn_request *r = out->req;
        int64_t v = -1;
        switch (op) {
        case CAIRN_API_CHAT:
        case CAIRN_API_COMPLETION:
            rc = decode_openai(api, op, params, random_seed, session_header, out, err);
            break;
        case CAIRN_API_GENERATE:
        case CAIRN_API_SESSION_OPEN:
        case CAIRN_API_SESSION_APPEND:
        case CAIRN_API_SESSION_GENERATE:
            rc = decode_native_content_op(api, op, params, random_seed, tokens, out, err);
            break;
        case CAIRN_API_SESSION_TRUNCATE:
            if (!(rc = session_id_field(params, &r->session, err)) &&
                !api_field(params, "n_tokens"))
                rc = api_fail(err, CAIRN_EINVAL, "n_tokens", "'n_tokens' is required");
            if (!rc && !(rc = api_get_int(params, "n_tokens", 0, INT64_MAX, &v, err)))
                r->n_keep = v;
            break;
        case CAIRN_API_CANCEL:
            if (!api_field(params, "request"))
                rc = api_fail(err, CAIRN_EINVAL, "request", "'request' is required");
            else if (!(rc = api_get_int(params, "request", 0, UINT32_MAX, &v, err)))
                r->target = (uint64_t)v;
            break;
        case CAIRN_API_CACHE_STATS: break;
        default: rc = session_id_field(params, &r->session, err); break; /* fork, close, info */
        }
    }
    if (rc != CAIRN_OK)
        cairn_api_call_clear(out);
    else if (api->runtime && out->req && out->req->gen.grammar &&
             !cairn_runtime_grammar_vocab(api->runtime)) {
        rc = api_oom(err);
        cairn_api_call_clear(out);
    }
    return rc;
}

void cairn_api_call_clear(cairn_api_call *c)
{
    if (!c)
        return;
    cairn_request_free(c->req);
    free(c->tokens);
    free(c->text);
    free(c->tools_json);
    for (int i = 0; i < c->n_prompts; i++) {
        free(c->prompts[i].tokens);
        free(c->prompts[i].echo);
    }
    free(c->prompts);
    free(c->echo_json);
    json_decref(c->conv.msgs);
    free(c->conv.system);
    memset(c, 0, sizeof *c);
}

int cairn_api_choice(const cairn_api_call *c, int i, cairn_request **out)
{
    const cairn_request *src = c->req;
    cairn_request *r = cairn_request_new(src->kind);
    if (!r)
        return CAIRN_ENOMEM;
    int rc = CAIRN_OK;
    r->gen = src->gen;
    r->gen.n_stop = 0;
    r->gen.grammar = cairn_grammar_retain(src->gen.grammar);
    const int per = c->n_prompts > 1 ? c->n_choices / c->n_prompts : c->n_choices;
    const cairn_api_prompt *p = c->n_prompts > 1 ? &c->prompts[i / per] : NULL;
    const int32_t *src_tokens = p && p->tokens ? p->tokens : src->tokens;
    const size_t n_src = p && p->tokens ? p->n_tokens : src->n_tokens;
    r->gen.sampling.seed += (uint64_t)(i % per);
    /* each choice asks to keep its prompt as the call did */
    r->n_pins = src->n_pins;
    memcpy(r->pins, src->pins, sizeof r->pins);
    for (int k = 0; k < src->gen.n_stop && rc == CAIRN_OK; k++) {
        if ((r->gen.stop[k] = strdup(src->gen.stop[k])))
            r->gen.n_stop++;
        else
            rc = CAIRN_ENOMEM;
    }
    r->n_tokens = n_src;
    if (rc == CAIRN_OK && !(r->tokens = malloc((n_src ? n_src : 1) * sizeof *r->tokens)))
        rc = CAIRN_ENOMEM;
    if (rc == CAIRN_OK && n_src)
        memcpy(r->tokens, src_tokens, n_src * sizeof *r->tokens);
    if (rc == CAIRN_OK && src->session_key) {
        if ((r->session_key = malloc(src->session_key_len + 1))) {
            memcpy(r->session_key, src->session_key, src->session_key_len + 1);
            r->session_key_len = src->session_key_len;
        } else {
            rc = CAIRN_ENOMEM;
        }
    }
    if (rc != CAIRN_OK) {
        cairn_request_free(r);
        return rc;
    }
    *out = r;
    return CAIRN_OK;
}

void cairn_api_gen_clear(cairn_gen_params *g)
{
    for (int i = 0; i < g->n_stop; i++)
        free(g->stop[i]);
    g->n_stop = 0;
    cairn_grammar_free(g->grammar);
    g->grammar = NULL;
}

/* ---- results ---------------------------------------------------------------------------- */

/* cairn_api_tool_calls of a whole reply, or (answer) of the content a
 * thinking reply was split into: a <think> in it is text by then. */
static int tool_calls_of(const cairn_api *api, const char *text, size_t len,
                         const char *tools_json, const char *id_prefix, bool cut, bool answer,
                         char **calls_json, char **content)
{
    *calls_json = *content = NULL;
    if (!api->chat_template)
        return CAIRN_ENOTFOUND;
    if (!text)
        text = "", len = 0;
    int rc = (answer ? cairn_chat_parse_answer_tool_calls : cairn_chat_parse_tool_calls)(
        api->chat_template, text, len, tools_json, id_prefix, calls_json, content);
    if (!cut || (rc != CAIRN_OK && rc != CAIRN_ENOTFOUND))
        return rc;
    /* Cut by max_tokens: what follows the first call (complete or not)
     * may be a call it broke off, which is never content; the complete
     * calls stay calls and the text before them is the content. (After a
     * whole call, where a broken one begins cannot be told reliably: a
     * fence closing one call may open the next.) */
    bool certain;
    size_t at = cairn_chat_tool_call_start(text, len, tools_json, &certain);
    if (at >= len || !(certain || rc == CAIRN_OK))
        return rc;
    const char *t = text;
    while (at > 0 && isspace((unsigned char)t[at - 1]))
        at--;
    while (at > 0 && isspace((unsigned char)*t))
        t++, at--;
    char *kept = malloc(at + 1);
    if (!kept) {
        free(*calls_json);
        free(*content);
        *calls_json = *content = NULL;
        return CAIRN_ENOMEM;
    }
    memcpy(kept, t, at);
    kept[at] = '\0';
    free(*content);
    *content = kept;
    return CAIRN_OK;
}

int cairn_api_tool_calls(const cairn_api *api, const char *text, size_t len,
                         const char *tools_json, const char *id_prefix, bool cut,
                         char **calls_json, char **content)
{
    return tool_calls_of(api, text, len, tools_json, id_prefix, cut, false, calls_json, content);
}

int64_t cairn_api_reasoning_tokens(const cairn_api *api, const char *text, size_t len)
{
    int32_t one;
    size_t n = 0;
    if (!api->vocab || !text || len == 0)
        return 0;
    int rc = cairn_tokenize(api->vocab, text, len, 0, &one, 1, &n);
    return rc == CAIRN_OK || rc == CAIRN_ERANGE ? (int64_t)n : 0;
}

bool cairn_api_reply_has_channels(const cairn_api *api)
{
    return api->chat_template && cairn_chat_reply_has_channels(api->chat_template);
}

int cairn_api_reply(const cairn_api *api, const char *text, size_t len, const char *tools_json,
                    const char *id_prefix, bool cut, char **reasoning, char **calls_json,
                    char **content)
{
    *reasoning = *calls_json = *content = NULL;
    if (!cairn_api_reply_has_channels(api)) {
        if (!tools_json)
            return CAIRN_ENOTFOUND;
        return cairn_api_tool_calls(api, text, len, tools_json, id_prefix, cut, calls_json,
                                    content);
    }
    if (cairn_chat_template_thinks(api->chat_template)) {
        /* the reasoning first; the calls are the content's, read (cut or
         * not) as any other family's */
        int rc = cairn_chat_parse_reply(api->chat_template, text ? text : "", text ? len : 0,
                                        NULL, id_prefix, reasoning, calls_json, content);
        if (rc != CAIRN_OK || !tools_json)
            return rc;
        char *rest = NULL;
        rc = tool_calls_of(api, *content, strlen(*content), tools_json, id_prefix, cut, true,
                           calls_json, &rest);
        if (rc == CAIRN_OK && rest) {
            free(*content);
            *content = rest;
        } else if (rc == CAIRN_ENOTFOUND) {
            rc = CAIRN_OK; /* no call: the content as read */
        } else if (rc != CAIRN_OK) {
            free(*reasoning);
            free(*content);
            *reasoning = *content = NULL;
        }
        return rc;
    }
    /* A harmony call is told by its header, and one cut off keeps its
     * arguments only when they are complete JSON: nothing of a broken call
     * reaches the content, so `cut` needs no more here. */
    return cairn_chat_parse_reply(api->chat_template, text ? text : "", text ? len : 0,
                                  tools_json, id_prefix, reasoning, calls_json, content);
}

bool cairn_api_reply_next(const cairn_api *api, cairn_chat_reply_cursor *c, const char *text,
                          size_t len, bool done, cairn_chat_reply_part *part)
{
    return cairn_chat_reply_next(api->chat_template, c, text, len, done, part);
}

size_t cairn_api_tool_call_start(const char *text, size_t len, const char *tools_json,
                                 bool *certain)
{
    return cairn_chat_tool_call_start(text, len, tools_json, certain);
}

int cairn_api_token_piece(const cairn_api *api, int32_t token, char *out, size_t cap, size_t *n)
{
    *n = 0;
    if (!api->vocab)
        return CAIRN_EUNSUPPORTED;
    return cairn_token_to_piece(api->vocab, token, true, out, cap, n);
}
