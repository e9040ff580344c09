/*
 * api/responses.c — OpenAI's Responses API (POST /v1/responses) as the chat
 * request it means. The body is rewritten into the chat form and decoded by
 * the chat rules (every range, default, template and grammar rule is
 * theirs):
 *
 *   instructions                      -> a system message first
 *   input: a string                   -> a user message
 *          message items (input_text /   -> messages of that role
 *            output_text parts)
 *          function_call {call_id,    -> an assistant message's tool call
 *            name, arguments}            (joined to the assistant message
 *                                         just before it)
 *          function_call_output       -> a tool message answering call_id
 *   tools [{type: function, name,     -> chat's [{type: function, function:
 *     description, parameters}]          {name, description, parameters}}]
 *   tool_choice {type: function, name} -> chat's named function
 *   text.format json_schema / json_object -> response_format (not while
 *                                       tool_choice forces a call)
 *   max_output_tokens                 -> max_tokens
 *   temperature, top_p, parallel_tool_calls, stream, seed -> the same
 *
 * What a stored response adds (the front end, server/http/responses.c, runs
 * it): with `store` (default true) the response is a session of its own —
 * the request becomes a SESSION_GENERATE of the whole prompt on a new
 * session; with `previous_response_id` it continues that response's
 * session — the new input is rendered as the continuation of the
 * conversation (no preamble, the previous reply's turn closed first) and
 * generated on a fork of it. Without either it is a plain GENERATE.
 */
#include "api/api_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RESPONSE_ID_PREFIX "resp_"
#define MAX_METADATA 16

/* A message's content: a string or an array of text parts (input_text,
 * output_text, text), joined. */
static int content_text(const json_t *v, size_t i, cairn_strbuf *out, cairn_api_error *e)
{
    if (api_clean_string(v)) {
        cairn_strbuf_add(out, json_string_value(v), json_string_length(v));
        return out->oom ? api_oom(e) : CAIRN_OK;
    }
    if (!json_is_array(v))
        return api_fail(e, CAIRN_EINVAL, "input",
                        "input[%zu].content must be a string or an array of text parts", i);
    size_t k;
    json_t *part;
    json_array_foreach(v, k, part)
    {
        const char *type = json_string_value(json_object_get(part, "type"));
        json_t *text = json_object_get(part, "text");
        if (!type || (strcmp(type, "input_text") != 0 && strcmp(type, "output_text") != 0 &&
                      strcmp(type, "text") != 0))
            return api_fail(e, CAIRN_EINVAL, "input", "input[%zu].content[%zu]: only text "
                            "parts are supported (type '%.32s')", i, k, type ? type : "?");
        if (!api_clean_string(text))
            return api_fail(e, CAIRN_EINVAL, "input",
                            "input[%zu].content[%zu].text must be a string", i, k);
        cairn_strbuf_add(out, json_string_value(text), json_string_length(text));
    }
    return out->oom ? api_oom(e) : CAIRN_OK;
}

/* The assistant message an output item of an earlier reply belongs to: the
 * last message when it is the assistant's and `fits` it, else a new one. */
static json_t *assistant_turn(json_t *msgs, bool fits, cairn_api_error *e)
{
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    const char *role = json_string_value(json_object_get(last, "role"));
    if (last && role && strcmp(role, "assistant") == 0 && fits)
        return last;
    last = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
    return api_append(msgs, last, e) == CAIRN_OK ? last : NULL;
}

/* Is `m` an assistant message that holds only reasoning so far (a reasoning
 * item's, waiting for the reply's text or calls)? */
static bool reasoning_only(const json_t *m)
{
    const char *role = json_string_value(json_object_get(m, "role"));
    const char *content = json_string_value(json_object_get(m, "content"));
    return role && strcmp(role, "assistant") == 0 && json_object_get(m, "reasoning_content") &&
           !json_object_get(m, "tool_calls") && content && !content[0];
}

/* A reasoning item of an earlier reply (what this server returned, sent
 * back by a client that keeps the conversation itself): its text becomes
 * the reasoning of the assistant message it precedes, which the chat
 * template keeps or drops as the model was trained (gpt-oss keeps it only
 * before a tool call). An item with nothing to read (only a summary of
 * another server's, or its encrypted_content) adds nothing. */
static int reasoning_input(const json_t *item, size_t i, json_t *msgs, cairn_api_error *e)
{
    cairn_strbuf text = {0};
    json_t *parts = json_object_get(item, "content");
    if (json_array_size(parts) == 0 && json_array_size(json_object_get(item, "summary")))
        parts = json_object_get(item, "summary"); /* the text when there is one, else its summary */
    if (json_is_null(parts))
        parts = NULL;
    if (parts && !json_is_array(parts))
        return api_fail(e, CAIRN_EINVAL, "input",
                        "input[%zu]: a reasoning item's content is an array of text parts", i);
    size_t k;
    json_t *part;
    json_array_foreach(parts, k, part)
    {
        json_t *t = json_object_get(part, "text");
        if (!json_is_object(part) || !api_clean_string(t)) {
            cairn_strbuf_free(&text);
            return api_fail(e, CAIRN_EINVAL, "input",
                            "input[%zu]: a reasoning item's parts each have a string 'text'", i);
        }
        if (text.len)
            cairn_strbuf_add(&text, "\n", 1);
        cairn_strbuf_add(&text, json_string_value(t), json_string_length(t));
    }
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    if (text.len && reasoning_only(last)) { /* two in a row: one turn's */
        const char *before = json_string_value(json_object_get(last, "reasoning_content"));
        cairn_strbuf joined = {0};
        cairn_strbuf_add(&joined, before, strlen(before));
        cairn_strbuf_add(&joined, "\n", 1);
        cairn_strbuf_add(&joined, text.data, text.len);
        cairn_strbuf_free(&text);
        text = joined;
    }
    int rc = text.oom ? api_oom(e) : CAIRN_OK;
    if (rc == CAIRN_OK && text.len) {
        json_t *m = assistant_turn(msgs, reasoning_only(last), e);
        rc = m ? api_set(m, "reasoning_content", json_stringn(text.data, text.len), e)
               : e->code; /* api_append said out of memory */
    }
    cairn_strbuf_free(&text);
    return rc;
}

static int message_item(const json_t *item, size_t i, json_t *msgs, cairn_api_error *e)
{
    static const char *const roles[] = {"user", "assistant", "system", "developer"};
    const char *role = json_string_value(json_object_get(item, "role"));
    bool known = false;
    for (size_t r = 0; role && r < sizeof roles / sizeof roles[0]; r++)
        known = known || strcmp(role, roles[r]) == 0;
    if (!known)
        return api_fail(e, CAIRN_EINVAL, "input",
                        "input[%zu].role must be user, assistant, system or developer", i);
    cairn_strbuf text = {0};
    int rc = content_text(json_object_get(item, "content"), i, &text, e);
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    if (rc == CAIRN_OK && strcmp(role, "assistant") == 0 && reasoning_only(last))
        rc = api_set(last, "content", json_stringn(text.data ? text.data : "", text.len), e);
    else if (rc == CAIRN_OK)
        rc = api_append(msgs, json_pack("{s:s, s:s%}", "role", role, "content",
                                    text.data ? text.data : "", text.len), e);
    cairn_strbuf_free(&text);
    return rc;
}

/* A function_call item: a tool call of the assistant message just before
 * it, or of a new one. */
static int call_item(const json_t *item, size_t i, json_t *msgs, cairn_api_error *e)
{
    json_t *id = json_object_get(item, "call_id"), *name = json_object_get(item, "name");
    json_t *args = json_object_get(item, "arguments");
    if (!api_clean_string(id) || !api_clean_string(name) || !api_clean_string(args))
        return api_fail(e, CAIRN_EINVAL, "input", "input[%zu]: a function_call has string "
                        "'call_id', 'name' and 'arguments'", i);
    json_t *call = json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", id, "type", "function", "function",
                             "name", name, "arguments", args);
    if (!call)
        return api_oom(e);
    json_t *last = assistant_turn(msgs, true, e);
    if (!last) {
        json_decref(call);
        return e->code;
    }
    json_t *calls = json_object_get(last, "tool_calls");
    if (!calls && api_set(last, "tool_calls", calls = json_array(), e)) {
        json_decref(call);
        return api_oom(e);
    }
    return api_append(calls, call, e);
}

static int output_item(const json_t *item, size_t i, json_t *msgs, cairn_api_error *e)
{
    json_t *id = json_object_get(item, "call_id"), *out = json_object_get(item, "output");
    if (!api_clean_string(id))
        return api_fail(e, CAIRN_EINVAL, "input",
                        "input[%zu]: a function_call_output has a string 'call_id'", i);
    cairn_strbuf text = {0};
    int rc = content_text(out, i, &text, e);
    if (rc == CAIRN_OK)
        rc = api_append(msgs, json_pack("{s:s, s:O, s:s%}", "role", "tool", "tool_call_id", id,
                                    "content", text.data ? text.data : "", text.len), e);
    cairn_strbuf_free(&text);
    return rc;
}

static int input_field(const json_t *params, json_t *chat, cairn_api_error *e)
{
    json_t *in = api_field(params, "input"), *instructions = api_field(params, "instructions");
    json_t *msgs = json_array();
    int rc = api_set(chat, "messages", msgs, e);
    if (rc)
        return rc;
    if (instructions && !api_clean_string(instructions))
        return api_fail(e, CAIRN_EINVAL, "instructions", "'instructions' must be a string");
    if (instructions &&
        (rc = api_append(msgs, json_pack("{s:s, s:O}", "role", "system", "content", instructions),
                     e)))
        return rc;
    if (api_clean_string(in))
        return api_append(msgs, json_pack("{s:s, s:O}", "role", "user", "content", in), e);
    if (!json_is_array(in) || json_array_size(in) == 0)
        return api_fail(e, CAIRN_EINVAL, "input",
                        "'input' must be a string or a non-empty array of items");
    size_t i;
    json_t *item;
    json_array_foreach(in, i, item)
    {
        const char *type = json_string_value(json_object_get(item, "type"));
        if (!json_is_object(item))
            return api_fail(e, CAIRN_EINVAL, "input", "input[%zu] must be an object", i);
        if (!type || strcmp(type, "message") == 0)
            rc = message_item(item, i, msgs, e);
        else if (strcmp(type, "function_call") == 0)
            rc = call_item(item, i, msgs, e);
        else if (strcmp(type, "function_call_output") == 0)
            rc = output_item(item, i, msgs, e);
        else if (strcmp(type, "reasoning") == 0)
            rc = reasoning_input(item, i, msgs, e);
        else
            return api_fail(e, CAIRN_EINVAL, "input", "input[%zu]: items of type '%.40s' are "
                            "not supported (message, reasoning, function_call, "
                            "function_call_output)", i, type);
        if (rc)
            return rc;
    }
    return CAIRN_OK;
}

/* One of the Responses API's flat function tools {type: function, name,
 * description, parameters}. */
static int tool_parts(const json_t *t, size_t i, const json_t **name, const json_t **desc,
                      const json_t **schema, cairn_api_error *e)
{
    const char *type = json_string_value(json_object_get(t, "type"));
    *name = json_object_get(t, "name");
    *desc = api_field(t, "description");
    *schema = api_field(t, "parameters");
    if (!type || strcmp(type, "function") != 0)
        return api_fail(e, CAIRN_EINVAL, "tools", "tools[%zu]: only function tools are "
                        "supported (type '%.32s')", i, type ? type : "?");
    if (!api_clean_string(*name) || (*desc && !json_is_string(*desc)) ||
        (*schema && !json_is_object(*schema)))
        return api_fail(e, CAIRN_EINVAL, "tools", "tools[%zu] must have a string 'name', an "
                        "optional string 'description' and object 'parameters'", i);
    return CAIRN_OK;
}

static int tool_choice_field(const json_t *params, json_t *chat, cairn_api_error *e)
{
    json_t *tc = api_field(params, "tool_choice");
    if (!tc)
        return CAIRN_OK;
    if (json_is_string(tc)) /* none, auto, required: chat's own rule checks them */
        return api_set(chat, "tool_choice", json_deep_copy(tc), e);
    const char *type = json_string_value(json_object_get(tc, "type"));
    json_t *name = json_object_get(tc, "name");
    if (!json_is_object(tc) || !type || strcmp(type, "function") != 0 || !api_clean_string(name))
        return api_fail(e, CAIRN_EINVAL, "tool_choice", "'tool_choice' must be none, auto, "
                        "required or {\"type\": \"function\", \"name\": ...}");
    return api_set(chat, "tool_choice",
               json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name), e);
}

/* text.format -> response_format */
static int text_field(const json_t *params, json_t *chat, cairn_api_error *e)
{
    json_t *text = api_field(params, "text");
    json_t *format = text ? api_field(text, "format") : NULL;
    if (text && !json_is_object(text))
        return api_fail(e, CAIRN_EINVAL, "text", "'text' must be an object");
    if (!format)
        return CAIRN_OK;
    /* A forced call is the whole reply: there is no text for the format to
     * shape (an agent's output type stays on while it forces a tool). The
     * chat rule refuses the pair, so it is not passed on. */
    json_t *tc = api_field(params, "tool_choice");
    if (api_field(params, "tools") &&
        (json_is_object(tc) ||
         (json_is_string(tc) && strcmp(json_string_value(tc), "required") == 0)))
        return CAIRN_OK;
    const char *type = json_string_value(json_object_get(format, "type"));
    if (!json_is_object(format) || !type)
        return api_fail(e, CAIRN_EINVAL, "text", "'text'.format must be {\"type\": ...}");
    if (strcmp(type, "json_schema") != 0)
        return api_set(chat, "response_format", json_pack("{s:s}", "type", type), e);
    json_t *js = json_pack("{s:O*}", "schema", json_object_get(format, "schema"));
    if (js && json_object_get(format, "name"))
        json_object_set(js, "name", json_object_get(format, "name"));
    return api_set(chat, "response_format", json_pack("{s:s, s:o}", "type", "json_schema",
                                                  "json_schema", js), e);
}

/* The body as the chat request it means. */
static int translate(const json_t *params, json_t *chat, cairn_api_error *e)
{
    static const char *const same[] = {"model", "temperature", "top_p", "parallel_tool_calls",
                                       "stream", "seed", "prompt_cache_retention", "cache_pin"};
    int rc = CAIRN_OK;
    json_t *bg = api_field(params, "background"), *max = api_field(params, "max_output_tokens");
    if (bg && !json_is_false(bg))
        return api_fail(e, CAIRN_EINVAL, "background", "background responses are not supported");
    for (size_t i = 0; i < sizeof same / sizeof same[0] && rc == CAIRN_OK; i++) {
        json_t *v = api_field(params, same[i]);
        if (v)
            rc = api_set(chat, same[i], json_deep_copy(v), e);
    }
    if (rc == CAIRN_OK && max)
        rc = api_set(chat, "max_tokens", json_deep_copy(max), e);
    /* reasoning: {effort}: the chat request's reasoning_effort (checked there) */
    json_t *effort = api_field(api_field(params, "reasoning"), "effort");
    if (rc == CAIRN_OK && effort)
        rc = api_set(chat, "reasoning_effort", json_deep_copy(effort), e);
    if (rc == CAIRN_OK)
        rc = input_field(params, chat, e);
    if (rc == CAIRN_OK)
        rc = api_translate_tools(params, chat, tool_parts, e);
    if (rc == CAIRN_OK)
        rc = tool_choice_field(params, chat, e);
    if (rc == CAIRN_OK)
        rc = text_field(params, chat, e);
    return rc;
}

/* The request fields a response object repeats, with the values used. */
static int echo_fields(const json_t *params, const json_t *chat, const cairn_gen_params *g,
                       cairn_api_call *c, cairn_api_error *e)
{
    json_t *meta = api_field(params, "metadata");
    if (meta) {
        const char *k;
        json_t *v;
        bool ok = json_is_object(meta) && json_object_size(meta) <= MAX_METADATA;
        json_object_foreach(ok ? meta : NULL, k, v)
            ok = ok && strlen(k) <= 64 && api_clean_string(v) && json_string_length(v) <= 512;
        if (!ok)
            return api_fail(e, CAIRN_EINVAL, "metadata", "'metadata' must be an object of at "
                            "most %d strings (keys up to 64 bytes, values up to 512)",
                            MAX_METADATA);
    }
    json_t *tools = api_field(params, "tools"), *choice = api_field(params, "tool_choice");
    json_t *text = api_field(params, "text"), *prev = api_field(params, "previous_response_id");
    json_t *par = api_field(chat, "parallel_tool_calls");
    json_t *max = api_field(params, "max_output_tokens");
    json_t *format = text ? api_field(text, "format") : NULL;
    json_t *effort = api_field(api_field(params, "reasoning"), "effort");
    json_t *o = json_pack(
        "{s:O*, s:o, s:o, s:o, s:f, s:f, s:O, s:O, s:b, s:O, s:o}", "instructions",
        api_field(params, "instructions"), "metadata",
        meta ? json_deep_copy(meta) : json_object(), "tools",
        tools ? json_deep_copy(tools) : json_array(), "tool_choice",
        choice ? json_deep_copy(choice) : json_string("auto"), "temperature",
        (double)g->sampling.temperature, "top_p", (double)g->sampling.top_p, "max_output_tokens",
        max ? max : json_null(), "previous_response_id", prev ? prev : json_null(), "store",
        c->store, "parallel_tool_calls", par ? par : json_true(), "text",
        format ? json_pack("{s:O}", "format", format)
               : json_pack("{s:{s:s}}", "format", "type", "text"));
    if (!o)
        return api_oom(e);
    if (!json_object_get(o, "instructions"))
        json_object_set_new(o, "instructions", json_null());
    json_object_set_new(o, "reasoning", json_pack("{s:O, s:n}", "effort",
                                                  effort ? effort : json_null(), "summary"));
    c->echo_json = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return c->echo_json ? CAIRN_OK : api_oom(e);
}

/* previous_response_id: "resp_" and the 32 hex digits of its session. */
static int previous_field(const json_t *params, cairn_api_call *c, cairn_api_error *e)
{
    json_t *v = api_field(params, "previous_response_id");
    if (!v)
        return CAIRN_OK;
    const char *s = json_string_value(v);
    size_t pl = strlen(RESPONSE_ID_PREFIX);
    if (!api_clean_string(v) || json_string_length(v) != pl + 32 ||
        strncmp(s, RESPONSE_ID_PREFIX, pl) != 0 ||
        cairn_session_id_from_hex(s + pl, 32, &c->previous) != CAIRN_OK)
        return api_fail(e, CAIRN_EINVAL, "previous_response_id",
                        "'previous_response_id' is not the id of a response of this server");
    c->has_previous = true;
    return CAIRN_OK;
}

/* A turn continuing a stored conversation: generation fields and tools by
 * the chat rules, the messages rendered as its continuation. */
static int continuation(const cairn_api *api, const json_t *chat, uint64_t seed,
                        cairn_api_call *c, cairn_api_error *e)
{
    cairn_request *r = c->req = cairn_request_new(CAIRN_REQ_SESSION_GENERATE);
    if (!r)
        return api_oom(e);
    r->gen = cairn_api_gen_defaults(api, CAIRN_API_CHAT);
    int rc;
    if ((rc = api_gen_fields(api, CAIRN_API_CHAT, chat, seed, &r->gen, e)) ||
        (rc = api_tools(api, chat, true, &r->gen, &c->tools_json, e)))
        return rc;
    api_content_rules rules = {.text_field = "input", .allow_messages = true,
                               .assistant = true, .tools_json = c->tools_json};
    bool given;
    if ((rc = api_native_content(api, chat, &rules, &r->tokens, &r->n_tokens, &given,
                                 &r->chat_turn, &c->conv, e)))
        return rc;
    r->session = c->previous; /* the front end forks it and names the fork here */
    c->stream = r->gen.stream;
    c->n_choices = 1;
    if (api->runtime && r->gen.grammar && !cairn_runtime_grammar_vocab(api->runtime))
        return api_oom(e);
    return CAIRN_OK;
}

/* A chat rule's error, named as the Responses client wrote the field. */
static void rename_field(cairn_api_error *e)
{
    static const api_field_name names[] = {{"max_tokens", "max_output_tokens"},
                                           {"response_format", "text"},
                                           {"messages", "input"},
                                           {"reasoning_effort", "reasoning.effort"}};
    api_rename_field(e, names, sizeof names / sizeof names[0]);
}

int api_decode_responses(const cairn_api *api, const json_t *params, uint64_t random_seed,
                         cairn_api_call *out, cairn_api_error *e)
{
    memset(out, 0, sizeof *out);
    memset(e, 0, sizeof *e);
    if (!json_is_object(params))
        return api_fail(e, CAIRN_EINVAL, NULL, "the body must be a JSON object");
    bool store = true;
    cairn_api_call prev = {0};
    int rc = api_get_bool(params, "store", &store, e);
    if (rc == CAIRN_OK)
        rc = previous_field(params, &prev, e);
    json_t *chat = rc == CAIRN_OK ? json_object() : NULL;
    if (rc == CAIRN_OK)
        rc = chat ? translate(params, chat, e) : api_oom(e);
    if (rc == CAIRN_OK && prev.has_previous) {
        out->has_previous = true;
        out->previous = prev.previous;
        rc = continuation(api, chat, random_seed, out, e);
    } else if (rc == CAIRN_OK) {
        rc = cairn_api_decode(api, CAIRN_API_CHAT, chat, random_seed, NULL, NULL, out, e);
        /* stored: a session of its own, the whole prompt its first turn */
        if (rc == CAIRN_OK && store)
            out->req->kind = CAIRN_REQ_SESSION_GENERATE;
    }
    rename_field(e);
    out->store = store;
    if (rc == CAIRN_OK)
        rc = echo_fields(params, chat, &out->req->gen, out, e);
    json_decref(chat);
    if (rc != CAIRN_OK) {
        cairn_api_call_clear(out);
        return rc;
    }
    out->op = CAIRN_API_RESPONSES;
    return CAIRN_OK;
}
