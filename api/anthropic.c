/*
 * api/anthropic.c — Anthropic's Messages API (POST /v1/messages) as the
 * chat request it means. Nothing here decides what a field means: the body
 * is rewritten into the chat form (OpenAI's messages, tools, tool_choice,
 * stop) and decoded as CAIRN_API_CHAT, so every range, default, template and
 * grammar rule is the one chat requests follow.
 *
 *   system (string | text blocks)        -> a first system message
 *   user: text blocks                    -> a user message (joined)
 *         tool_result {tool_use_id,      -> a tool message answering that
 *           content, is_error}              call ("Error: " before the text
 *                                           when is_error)
 *   assistant: text blocks + tool_use    -> content + tool_calls
 *         {id, name, input}
 *     + thinking blocks                  -> reasoning_content (redacted_thinking:
 *                                           nothing; the signature is not read)
 *   output_format / output_config.format -> response_format json_schema
 *     {type: json_schema, schema}           (structured outputs)
 *   tools [{name, description,           -> [{type: function, function:
 *           input_schema}]                   {name, description, parameters}}]
 *   tool_choice auto | any | tool | none -> auto | required | named | none
 *         (disable_parallel_tool_use     -> parallel_tool_calls: false)
 *   stop_sequences, max_tokens (required), temperature, top_p, top_k,
 *   stream, seed, session_id             -> the chat fields of those names
 *   thinking {type: disabled}            -> chat_template_kwargs.enable_thinking
 *                                           false (enabled, adaptive: the
 *                                           model's default; no budget kept)
 *   metadata, anthropic-version          -> ignored
 *   cache_control {type: ephemeral,      -> cache pins (cairn_request.pins):
 *     ttl: 5m | 1h} on system blocks,       the prompt up to the end of the
 *     tools, message blocks, or at the      block's part, kept 5 minutes or
 *     top level (the last block)            an hour (below)
 *
 * Errors name Anthropic's fields (a chat rule that refuses `stop` is
 * reported for `stop_sequences`).
 *
 * Cache breakpoints. Anthropic's rules: cache_control may sit on a system
 * text block, on a tool, on a message's text, image, tool_use or
 * tool_result block (and a text block inside a tool_result), or at the top
 * level, which puts one on the last block; at most 4 in all; type
 * "ephemeral"; ttl "5m" (default) or "1h", and no "1h" after a "5m" in the
 * order tools, system, messages. Anything else is a 400 naming the field
 * as Anthropic does ("messages.1.content.0.cache_control.ttl"). The
 * prefix a breakpoint covers is found in the rendered prompt
 * (cairn_api_conversation_end): on a tool, the template's preamble with the
 * tool list; on a system block, the system message; on a message's block,
 * the end of the chat message that block became (the template renders a
 * message as a whole: a breakpoint on a text block covers the user text it
 * is joined into, up to the next tool_result or the message's end; on a
 * tool_result, its tool message; on an assistant block, the assistant
 * message). The engine keeps whole pages of it (session.h, "Retention").
 */
#include "api/api_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The cache breakpoints of a body, in Anthropic's order (tools, system,
 * messages), each with the chat parts its prefix ends after (0: the
 * template's preamble with the tools; the system message is part 1). A
 * breakpoint is placed when the chat message its block went into is
 * complete: a text block's when the user text it is joined into is
 * flushed, a tool_result's with its tool message, an assistant block's with
 * the assistant message. */
typedef struct {
    struct {
        size_t parts;
        bool one_hour;
    } bp[CAIRN_MAX_PINS];
    int n, placed;   /* bp[placed .. n) wait for their message to end */
    bool seen_5m;
} cache_plan;

/* The breakpoints waiting end after the first `parts` chat parts. */
static void place_pending(cache_plan *cp, size_t parts)
{
    for (; cp->placed < cp->n; cp->placed++)
        cp->bp[cp->placed].parts = parts;
}

/* Fail naming `field` (a dotted path, as Anthropic names it). */
static int fail_at(cairn_api_error *e, const char *field, const char *what)
{
    api_fail(e, CAIRN_EINVAL, NULL, "%s: %s", field, what);
    snprintf(e->field_text, sizeof e->field_text, "%.*s", (int)sizeof e->field_text - 1, field);
    e->field = e->field_text;
    return CAIRN_EINVAL;
}

/* The cache_control of block `b` at `path` (absent or null: none), a
 * breakpoint waiting to be placed; `allowed`: this kind of block may carry
 * one. */
static int cache_control(const json_t *b, const char *path, bool allowed, cache_plan *cp,
                         cairn_api_error *e)
{
    json_t *cc = json_is_object(b) ? api_field(b, "cache_control") : NULL;
    if (!cc)
        return CAIRN_OK;
    char field[112], sub[128];
    snprintf(field, sizeof field, "%s%scache_control", path, path[0] ? "." : "");
    if (!allowed)
        return fail_at(e, field, "cache_control is not allowed here: it goes on system text "
                       "blocks, tools, and a message's text, image, tool_use or tool_result "
                       "blocks");
    if (!json_is_object(cc))
        return fail_at(e, field, "cache_control must be an object {\"type\": \"ephemeral\", "
                       "\"ttl\": \"5m\" | \"1h\"}");
    json_t *type = json_object_get(cc, "type"), *ttl = api_field(cc, "ttl");
    if (!json_is_string(type) || strcmp(json_string_value(type), "ephemeral") != 0) {
        snprintf(sub, sizeof sub, "%s.type", field);
        return fail_at(e, sub, "the type must be 'ephemeral'");
    }
    bool one_hour = false;
    if (ttl) {
        const char *t = json_string_value(ttl);
        one_hour = t && strcmp(t, "1h") == 0;
        if (!t || (!one_hour && strcmp(t, "5m") != 0)) {
            snprintf(sub, sizeof sub, "%s.ttl", field);
            return fail_at(e, sub, "the ttl must be '5m' or '1h'");
        }
    }
    if (cp->n == CAIRN_MAX_PINS)
        return fail_at(e, field, "a maximum of 4 blocks with cache_control may be given; "
                       "this is a fifth");
    if (one_hour && cp->seen_5m) {
        snprintf(sub, sizeof sub, "%s.ttl", field);
        return fail_at(e, sub, "a '1h' cache_control may not come after a '5m' one (the order "
                       "is tools, system, messages)");
    }
    cp->seen_5m = cp->seen_5m || !one_hour;
    cp->bp[cp->n].one_hour = one_hour;
    cp->n++;
    return CAIRN_OK;
}

/* A string without a NUL inside. */
/* Text blocks [{type: "text", text}] joined into *out, or a plain string.
 * `where` names the value in errors ("system", "messages[2].content[0]"). */
static int text_of(const json_t *v, const char *field, const char *where, cairn_strbuf *out,
                   cache_plan *cp, const char *path, cairn_api_error *e)
{
    if (api_clean_string(v)) {
        cairn_strbuf_add(out, json_string_value(v), json_string_length(v));
        return out->oom ? api_oom(e) : CAIRN_OK;
    }
    if (!json_is_array(v))
        return api_fail(e, CAIRN_EINVAL, field, "%s must be a string or an array of text blocks",
                        where);
    size_t k;
    json_t *b;
    json_array_foreach(v, k, b)
    {
        json_t *type = json_object_get(b, "type"), *text = json_object_get(b, "text");
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0 ||
            !api_clean_string(text))
            return api_fail(e, CAIRN_EINVAL, field,
                            "%s[%zu] must be a text block {\"type\": \"text\", \"text\": ...}",
                            where, k);
        char at[96];
        snprintf(at, sizeof at, "%s.%zu", path, k);
        int rc = cache_control(b, at, true, cp, e);
        if (rc)
            return rc;
        cairn_strbuf_add(out, json_string_value(text), json_string_length(text));
    }
    return out->oom ? api_oom(e) : CAIRN_OK;
}

/* The text gathered for a user turn, as one user message (nothing when
 * there is none). */
static int flush_user(cairn_strbuf *text, bool *pending, json_t *msgs, cairn_api_error *e)
{
    if (!*pending)
        return CAIRN_OK;
    *pending = false;
    json_t *m = json_pack("{s:s, s:s%}", "role", "user", "content", text->data ? text->data : "",
                          text->len);
    text->len = 0;
    return api_append(msgs, m, e);
}

static int tool_result(const json_t *b, size_t i, size_t k, json_t *msgs, cache_plan *cp,
                       cairn_api_error *e)
{
    char where[96];
    snprintf(where, sizeof where, "messages[%zu].content[%zu].content", i, k);
    json_t *id = json_object_get(b, "tool_use_id"), *content = api_field(b, "content");
    json_t *is_error = api_field(b, "is_error");
    if (!api_clean_string(id))
        return api_fail(e, CAIRN_EINVAL, "messages",
                        "messages[%zu].content[%zu].tool_use_id must be a string", i, k);
    if (is_error && !json_is_boolean(is_error))
        return api_fail(e, CAIRN_EINVAL, "messages",
                        "messages[%zu].content[%zu].is_error must be a boolean", i, k);
    cairn_strbuf text = {0};
    /* the templates have no error flag for a tool's answer: it says so */
    if (json_is_true(is_error))
        cairn_strbuf_add(&text, "Error: ", 7);
    char path[96];
    snprintf(path, sizeof path, "messages.%zu.content.%zu.content", i, k);
    int rc = content ? text_of(content, "messages", where, &text, cp, path, e) : CAIRN_OK;
    if (rc == CAIRN_OK && text.oom)
        rc = api_oom(e);
    if (rc == CAIRN_OK)
        rc = api_append(msgs,
                    json_pack("{s:s, s:O, s:s%}", "role", "tool", "tool_call_id", id, "content",
                              text.data ? text.data : "", text.len),
                    e);
    place_pending(cp, json_array_size(msgs)); /* the tool message is complete */
    cairn_strbuf_free(&text);
    return rc;
}

/* One user message's blocks: text gathered into user messages, each
 * tool_result its own tool message, in their order. */
/* Whether a message block of this type may carry cache_control. */
static bool cacheable_block(const char *type)
{
    static const char *const kinds[] = {"text", "image", "document", "tool_use", "tool_result"};
    for (size_t i = 0; type && i < sizeof kinds / sizeof kinds[0]; i++)
        if (strcmp(type, kinds[i]) == 0)
            return true;
    return false;
}

/* Block k of message i: its cache_control, a breakpoint of that message. */
static int block_cache_control(const json_t *b, const char *type, size_t i, size_t k,
                               cache_plan *cp, cairn_api_error *e)
{
    char path[96];
    snprintf(path, sizeof path, "messages.%zu.content.%zu", i, k);
    return cache_control(b, path, cacheable_block(type), cp, e);
}

static int user_blocks(const json_t *content, size_t i, json_t *msgs, cache_plan *cp,
                       cairn_api_error *e)
{
    cairn_strbuf text = {0};
    bool pending = false;
    int rc = CAIRN_OK;
    size_t k;
    json_t *b;
    json_array_foreach(content, k, b)
    {
        const char *type = json_string_value(json_object_get(b, "type"));
        json_t *t = json_object_get(b, "text");
        const bool result = type && strcmp(type, "tool_result") == 0;
        /* the text before a tool result is a user message of its own: its
         * breakpoints end with it, before the tool message */
        if (result && !(rc = flush_user(&text, &pending, msgs, e)))
            place_pending(cp, json_array_size(msgs));
        if (rc || (rc = block_cache_control(b, type, i, k, cp, e)))
            break;
        if (type && strcmp(type, "text") == 0 && api_clean_string(t)) {
            cairn_strbuf_add(&text, json_string_value(t), json_string_length(t));
            pending = true;
        } else if (result) {
            rc = tool_result(b, i, k, msgs, cp, e);
        } else {
            rc = api_fail(e, CAIRN_EINVAL, "messages",
                          "messages[%zu].content[%zu]: a user message holds text and "
                          "tool_result blocks (type '%.32s' is not supported)",
                          i, k, type ? type : "?");
        }
        if (rc)
            break;
    }
    if (rc == CAIRN_OK && text.oom)
        rc = api_oom(e);
    if (rc == CAIRN_OK)
        rc = flush_user(&text, &pending, msgs, e);
    cairn_strbuf_free(&text);
    return rc;
}

/* An assistant message's blocks: its text, its thinking (the reply's
 * reasoning, which the chat template keeps or drops as the model was
 * trained; redacted thinking cannot be read and adds nothing), and its
 * tool_use blocks as OpenAI tool calls (the input object as JSON text). */
static int assistant_blocks(const json_t *content, size_t i, json_t *msgs, cache_plan *cp,
                            cairn_api_error *e)
{
    cairn_strbuf text = {0}, thinking = {0};
    json_t *calls = json_array();
    int rc = calls ? CAIRN_OK : api_oom(e);
    size_t k;
    json_t *b;
    json_array_foreach(content, k, b)
    {
        if (rc)
            break;
        const char *type = json_string_value(json_object_get(b, "type"));
        json_t *t = json_object_get(b, "text");
        if ((rc = block_cache_control(b, type, i, k, cp, e)))
            break;
        if (type && strcmp(type, "text") == 0 && api_clean_string(t)) {
            cairn_strbuf_add(&text, json_string_value(t), json_string_length(t));
            continue;
        }
        json_t *th = json_object_get(b, "thinking");
        if (type && strcmp(type, "thinking") == 0 && api_clean_string(th)) {
            if (thinking.len)
                cairn_strbuf_add(&thinking, "\n", 1);
            cairn_strbuf_add(&thinking, json_string_value(th), json_string_length(th));
            continue;
        }
        if (type && strcmp(type, "redacted_thinking") == 0)
            continue;
        if (!type || strcmp(type, "tool_use") != 0) {
            rc = api_fail(e, CAIRN_EINVAL, "messages",
                          "messages[%zu].content[%zu]: an assistant message holds text, "
                          "thinking and tool_use blocks (type '%.32s' is not supported)",
                          i, k, type ? type : "?");
            break;
        }
        json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name");
        json_t *input = json_object_get(b, "input");
        if (!api_clean_string(id) || !api_clean_string(name) || !json_is_object(input)) {
            rc = api_fail(e, CAIRN_EINVAL, "messages",
                          "messages[%zu].content[%zu]: a tool_use block has a string 'id' and "
                          "'name' and an object 'input'", i, k);
            break;
        }
        char *args = json_dumps(input, JSON_COMPACT);
        rc = args ? api_append(calls,
                           json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", id, "type", "function",
                                     "function", "name", name, "arguments", args),
                           e)
                  : api_oom(e);
        free(args);
    }
    if (rc == CAIRN_OK && (text.oom || thinking.oom))
        rc = api_oom(e);
    if (rc == CAIRN_OK) {
        json_t *m = json_pack("{s:s, s:s%}", "role", "assistant", "content",
                              text.data ? text.data : "", text.len);
        if (m && json_array_size(calls))
            json_object_set(m, "tool_calls", calls);
        if (m && thinking.len)
            json_object_set_new(m, "reasoning_content",
                                json_stringn(thinking.data, thinking.len));
        rc = api_append(msgs, m, e);
    }
    json_decref(calls);
    cairn_strbuf_free(&text);
    cairn_strbuf_free(&thinking);
    return rc;
}

static int messages_field(const json_t *params, json_t *chat, cache_plan *cp, cairn_api_error *e)
{
    json_t *in = api_field(params, "messages"), *system = api_field(params, "system");
    if (!json_is_array(in) || json_array_size(in) == 0)
        return api_fail(e, CAIRN_EINVAL, "messages", "'messages' must be a non-empty array");
    json_t *msgs = json_array();
    int rc = api_set(chat, "messages", msgs, e);
    if (rc == CAIRN_OK && system) {
        cairn_strbuf text = {0};
        rc = text_of(system, "system", "'system'", &text, cp, "system", e);
        if (rc == CAIRN_OK)
            rc = api_append(msgs, json_pack("{s:s, s:s%}", "role", "system", "content",
                                        text.data ? text.data : "", text.len), e);
        place_pending(cp, json_array_size(msgs)); /* the system message */
        cairn_strbuf_free(&text);
    }
    size_t i;
    json_t *m;
    json_array_foreach(in, i, m)
    {
        if (rc)
            return rc;
        const char *role = json_string_value(json_object_get(m, "role"));
        json_t *content = json_object_get(m, "content");
        bool user = role && strcmp(role, "user") == 0;
        if (!json_is_object(m) || !role || (!user && strcmp(role, "assistant") != 0))
            return api_fail(e, CAIRN_EINVAL, "messages",
                            "messages[%zu].role must be 'user' or 'assistant'", i);
        char path[96];
        snprintf(path, sizeof path, "messages.%zu", i);
        if ((rc = cache_control(m, path, false, cp, e)))
            return rc;
        if (api_clean_string(content))
            rc = api_append(msgs, json_pack("{s:s, s:O}", "role", role, "content", content), e);
        else if (!json_is_array(content))
            return api_fail(e, CAIRN_EINVAL, "messages",
                            "messages[%zu].content must be a string or an array of blocks", i);
        else
            rc = user ? user_blocks(content, i, msgs, cp, e)
                      : assistant_blocks(content, i, msgs, cp, e);
        place_pending(cp, json_array_size(msgs)); /* what is left of message i */
    }
    return rc;
}

/* Each tool's cache_control (tools come first in the cached order). */
static int tools_cache_control(const json_t *params, cache_plan *cp, cairn_api_error *e)
{
    json_t *tools = api_field(params, "tools");
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t)
    {
        char path[96];
        snprintf(path, sizeof path, "tools.%zu", i);
        int rc = cache_control(t, path, true, cp, e);
        if (rc)
            return rc;
    }
    place_pending(cp, 0); /* the preamble with the tool list */
    return CAIRN_OK;
}

/* One of Anthropic's client tools {name, description, input_schema}. */
static int tool_parts(const json_t *t, size_t i, const json_t **name, const json_t **desc,
                      const json_t **schema, cairn_api_error *e)
{
    json_t *type = api_field(t, "type");
    *name = json_object_get(t, "name");
    *desc = api_field(t, "description");
    *schema = json_object_get(t, "input_schema");
    if (type && !(json_is_string(type) && strcmp(json_string_value(type), "custom") == 0))
        return api_fail(e, CAIRN_EINVAL, "tools",
                        "tools[%zu]: only client tools {name, description, input_schema} "
                        "are supported", i);
    if (!api_clean_string(*name) || (*desc && !json_is_string(*desc)) || !json_is_object(*schema))
        return api_fail(e, CAIRN_EINVAL, "tools", "tools[%zu] must have a string 'name', "
                        "an optional string 'description' and an object 'input_schema'", i);
    return CAIRN_OK;
}

static int tool_choice_field(const json_t *params, json_t *chat, cairn_api_error *e)
{
    json_t *tc = api_field(params, "tool_choice");
    if (!tc)
        return CAIRN_OK;
    const char *type = json_string_value(json_object_get(tc, "type"));
    json_t *name = json_object_get(tc, "name");
    json_t *no_parallel = api_field(tc, "disable_parallel_tool_use");
    if (!json_is_object(tc) || !type)
        return api_fail(e, CAIRN_EINVAL, "tool_choice", "'tool_choice' must be {\"type\": ...}");
    if (no_parallel && !json_is_boolean(no_parallel))
        return api_fail(e, CAIRN_EINVAL, "tool_choice",
                        "'tool_choice'.disable_parallel_tool_use must be a boolean");
    json_t *choice;
    if (strcmp(type, "auto") == 0 || strcmp(type, "none") == 0)
        choice = json_string(type);
    else if (strcmp(type, "any") == 0)
        choice = json_string("required");
    else if (strcmp(type, "tool") == 0 && api_clean_string(name))
        choice = json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name);
    else
        return api_fail(e, CAIRN_EINVAL, "tool_choice", "'tool_choice'.type must be auto, any, "
                        "none or tool (with a string 'name')");
    int rc = api_set(chat, "tool_choice", choice, e);
    if (rc == CAIRN_OK && json_is_true(no_parallel))
        rc = api_set(chat, "parallel_tool_calls", json_false(), e);
    return rc;
}

/* The body as the chat request it means. */
/* Structured outputs: output_format (the beta's name) or
 * output_config.format, {type: "json_schema", schema}, as the chat
 * request's json_schema response_format. */
static int output_format_field(const json_t *params, json_t *chat, cairn_api_error *e)
{
    const char *field = "output_format";
    json_t *f = api_field(params, field);
    json_t *config = api_field(params, "output_config");
    if (!f && config && json_is_object(config) && (f = api_field(config, "format")))
        field = "output_config.format";
    if (!f)
        return CAIRN_OK;
    const char *type = json_string_value(json_object_get(f, "type"));
    json_t *schema = json_object_get(f, "schema");
    if (!json_is_object(f) || !type || strcmp(type, "json_schema") != 0 ||
        !json_is_object(schema))
        return api_fail(e, CAIRN_EINVAL, field, "'%s' must be {\"type\": \"json_schema\", "
                        "\"schema\": {...}}", field);
    return api_set(chat, "response_format",
               json_pack("{s:s, s:{s:s, s:O}}", "type", "json_schema", "json_schema", "name",
                         "output", "schema", schema), e);
}

/* thinking {type: enabled (budget_tokens) | adaptive | disabled}: disabled
 * asks the template not to reason (chat_template_kwargs.enable_thinking
 * false: Qwen3 answers at once, harmony reasons least); enabled and
 * adaptive are what the model does anyway. A thinking budget is not
 * enforced: max_tokens bounds the reply, reasoning included. */
static int thinking_field(const json_t *params, json_t *chat, cairn_api_error *e)
{
    json_t *th = api_field(params, "thinking");
    if (!th)
        return CAIRN_OK;
    const char *type = json_string_value(json_object_get(th, "type"));
    json_t *budget = json_object_get(th, "budget_tokens");
    int64_t n;
    if (!json_is_object(th) || !type ||
        (strcmp(type, "enabled") && strcmp(type, "disabled") && strcmp(type, "adaptive")))
        return api_fail(e, CAIRN_EINVAL, "thinking.type",
                        "'thinking.type' must be \"enabled\", \"adaptive\" or \"disabled\"");
    if (budget && (!api_json_int(budget, &n) || n < 0))
        return api_fail(e, CAIRN_EINVAL, "thinking.budget_tokens",
                        "'thinking.budget_tokens' must be a non-negative integer");
    if (strcmp(type, "disabled") != 0)
        return CAIRN_OK;
    return api_set(chat, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", 0), e);
}

static int translate(const json_t *params, json_t *chat, cache_plan *cp, cairn_api_error *e)
{
    /* seed and session_id: cairn's extensions, as on the chat route */
    static const char *const same[] = {"model", "temperature", "top_p", "top_k",
                                       "stream", "seed", "session_id"};
    json_t *max = api_field(params, "max_tokens"), *stop = api_field(params, "stop_sequences");
    int64_t n;
    if (!max)
        return api_fail(e, CAIRN_EINVAL, "max_tokens", "'max_tokens' is required");
    /* Anthropic's floor; the ceiling is the chat rule's (the context) */
    if (!api_json_int(max, &n) || n < 1)
        return api_fail(e, CAIRN_EINVAL, "max_tokens", "'max_tokens' must be an integer >= 1");
    int rc = api_set(chat, "max_tokens", json_deep_copy(max), e);
    for (size_t i = 0; i < sizeof same / sizeof same[0] && rc == CAIRN_OK; i++) {
        json_t *v = api_field(params, same[i]);
        if (v)
            rc = api_set(chat, same[i], json_deep_copy(v), e);
    }
    if (rc == CAIRN_OK && stop && !json_is_array(stop))
        return api_fail(e, CAIRN_EINVAL, "stop_sequences", "'stop_sequences' must be an array "
                        "of strings");
    if (rc == CAIRN_OK && stop && json_array_size(stop))
        rc = api_set(chat, "stop", json_deep_copy(stop), e);
    if (rc == CAIRN_OK && json_is_array(api_field(params, "tools")))
        rc = tools_cache_control(params, cp, e);
    if (rc == CAIRN_OK)
        rc = messages_field(params, chat, cp, e);
    /* top level: automatic caching, a breakpoint on the last block */
    if (rc == CAIRN_OK)
        rc = cache_control(params, "", true, cp, e);
    place_pending(cp, json_array_size(json_object_get(chat, "messages")));
    if (rc == CAIRN_OK)
        rc = api_translate_tools(params, chat, tool_parts, e);
    if (rc == CAIRN_OK)
        rc = tool_choice_field(params, chat, e);
    if (rc == CAIRN_OK)
        rc = output_format_field(params, chat, e);
    if (rc == CAIRN_OK)
        rc = thinking_field(params, chat, e);
    return rc;
}

/* A chat rule's error, named as the Anthropic client wrote the field. */
static void rename_field(cairn_api_error *e)
{
    static const api_field_name names[] = {{"stop", "stop_sequences"},
                                           {"parallel_tool_calls", "tool_choice"},
                                           {"response_format", "output_format"}};
    api_rename_field(e, names, sizeof names / sizeof names[0]);
}

/* Each breakpoint as a pin of the prompt up to where its part ends there. */
static int place_breakpoints(const cairn_api *api, const cache_plan *cp, cairn_api_call *out)
{
    cairn_request *r = out->req;
    const bool tools = out->tools_json != NULL;
    for (int b = 0; b < cp->n; b++) {
        size_t pos = 0;
        int rc = cairn_api_conversation_end(api, out, cp->bp[b].parts, tools, r->tokens,
                                            r->n_tokens, &pos);
        if (rc == CAIRN_ENOMEM)
            return rc;
        if (rc != CAIRN_OK || pos == 0) /* nothing of the prompt is that part's alone */
            continue;
        r->pins[r->n_pins].tokens = pos;
        r->pins[r->n_pins].ttl_s = cp->bp[b].one_hour ? 3600.0 : 300.0;
        r->n_pins++;
    }
    return CAIRN_OK;
}

int api_decode_messages(const cairn_api *api, const json_t *params, uint64_t random_seed,
                        const char *session_header, cairn_api_call *out, cairn_api_error *e)
{
    memset(out, 0, sizeof *out);
    memset(e, 0, sizeof *e);
    if (!json_is_object(params))
        return api_fail(e, CAIRN_EINVAL, NULL, "the body must be a JSON object");
    json_t *chat = json_object();
    cache_plan cp = {0};
    int rc = chat ? translate(params, chat, &cp, e) : api_oom(e);
    if (rc == CAIRN_OK) {
        rc = cairn_api_decode(api, CAIRN_API_CHAT, chat, random_seed, session_header, NULL, out,
                              e);
        rename_field(e);
    }
    json_decref(chat);
    if (rc == CAIRN_OK && (rc = place_breakpoints(api, &cp, out))) {
        rc = api_oom(e);
        cairn_api_call_clear(out);
    }
    if (rc == CAIRN_OK)
        out->op = CAIRN_API_MESSAGES;
    return rc;
}
