/*
 * server/http/anthropic.c — POST /v1/messages in Anthropic's wire format
 * (docs/anthropic.md). The body is a chat request once api/ has translated
 * it (api/anthropic.c); its life is openai.c's. What is Anthropic's is here:
 * the message object, the named stream events, the error shape.
 *
 *   stream:  message_start, ping,
 *            per block: content_block_start, content_block_delta (text_delta;
 *                       input_json_delta for a tool_use), content_block_stop
 *            message_delta (stop_reason, usage), message_stop
 *
 * Tool calls are found as for chat (held back while they may be starting,
 * read from the finished text on a text worker), so a tool_use block is
 * sent whole at the end, after the text.
 */
#include "server/http/http.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    char *stop[CAIRN_MAX_STOP]; /* the request's stop strings, to name the one that hit */
    int n_stop;
    int64_t n_prompt;           /* prompt tokens, for message_start             */
    int n_blocks;               /* streaming: content blocks started             */
    /* cache breakpoints (the request's pins, in whole pages): usage says
     * what was written to the cache for them */
    int64_t bp_end;             /* the last breakpoint's prefix; 0: none         */
    int64_t bp_end_1h;          /* the last '1h' breakpoint's; 0: none            */
    bool text_open;             /* streaming: the text block is open             */
    bool thinking_open;         /* streaming: a thinking block is open           */
} anthropic_state;

static anthropic_state *state_of(hreq *q) { return q->wire_state; }

json_t *http_anthropic_error_body(int status, const char *message)
{
    const char *type = status == 401   ? "authentication_error"
                       : status == 403 ? "permission_error"
                       : status == 404 ? "not_found_error"
                       : status == 413 ? "request_too_large"
                       : status == 429 ? "rate_limit_error"
                       : status == 503 ? "overloaded_error"
                       : status >= 500 ? "api_error"
                                       : "invalid_request_error";
    return json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", type, "message",
                     message ? message : "");
}

bool http_path_is_anthropic(const hconn *c)
{
    static const char route[] = "/v1/messages";
    size_t n, r = sizeof route - 1;
    const char *p = http_path(c, &n);
    return n >= r && memcmp(p, route, r) == 0 && (n == r || p[r] == '/');
}

/* Anthropic's usage: of the prompt, cache_read_input_tokens were read from
 * the cache, cache_creation_input_tokens were written to it for a
 * breakpoint (the prefix up to the last breakpoint, less what was read; 0
 * without breakpoints), and input_tokens are the rest, so the three add up
 * to the prompt. cache_creation splits the written tokens by TTL: those up
 * to the last '1h' breakpoint are an hour's (a '1h' one never follows a
 * '5m' one), the rest five minutes'. Breakpoints are counted in the whole
 * pages the cache keeps of them. */
static json_t *usage_of(const anthropic_state *st, int64_t prompt, int64_t cached,
                        int64_t output)
{
    int64_t end = st ? st->bp_end : 0, end_1h = st ? st->bp_end_1h : 0;
    if (end > prompt)
        end = prompt;
    if (end_1h > end)
        end_1h = end;
    int64_t created = end > cached ? end - cached : 0;
    int64_t created_1h = end_1h > cached ? end_1h - cached : 0;
    return json_pack("{s:I, s:I, s:I, s:I, s:{s:I, s:I}}", "input_tokens",
                     (json_int_t)(prompt - cached - created), "output_tokens", (json_int_t)output,
                     "cache_read_input_tokens", (json_int_t)cached, "cache_creation_input_tokens",
                     (json_int_t)created, "cache_creation", "ephemeral_5m_input_tokens",
                     (json_int_t)(created - created_1h), "ephemeral_1h_input_tokens",
                     (json_int_t)created_1h);
}

static json_t *jstrn(const char *s, size_t n)
{
    json_t *v = json_stringn(s ? s : "", s ? n : 0);
    return v ? v : json_string("");
}

/* {type: tool_use, id, name, input} of an OpenAI tool call (arguments: JSON
 * text of an object, as the reply parser and the forcing grammar give). */
static json_t *tool_use_block(json_t *call, bool empty_input)
{
    json_t *fn = json_object_get(call, "function");
    json_t *input = empty_input ? json_object()
                                : json_loads(json_string_value(json_object_get(fn, "arguments")),
                                             JSON_DECODE_ANY, NULL);
    if (input && !json_is_object(input)) /* not an object: Anthropic's input must be one */
        input = json_pack("{s:o}", "arguments", input);
    return json_pack("{s:s, s:O, s:O, s:o}", "type", "tool_use", "id", json_object_get(call, "id"),
                     "name", json_object_get(fn, "name"), "input",
                     input ? input : json_object());
}

/* stop_reason and stop_sequence of a finished generation. */
static const char *stop_reason(const anthropic_state *st, const cairn_event *ev, json_t *calls,
                               json_t **sequence)
{
    *sequence = json_null();
    if (ev->finish_reason && strcmp(ev->finish_reason, "length") == 0)
        return "max_tokens"; /* cut, even after whole tool calls */
    if (calls)
        return "tool_use";
    if (ev->stop_string > 0 && ev->stop_string <= st->n_stop) {
        *sequence = json_string(st->stop[ev->stop_string - 1]);
        return "stop_sequence";
    }
    return "end_turn";
}

/* ---- hooks -------------------------------------------------------------------------- */

static void start_block(hconn *c, anthropic_state *st, json_t *block)
{
    json_t *o = json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index",
                          st->n_blocks, "content_block", block);
    http_sse_event(c, "content_block_start", o);
    json_decref(o);
}

static void block_event(hconn *c, const char *type, int index, json_t *delta)
{
    json_t *o = delta ? json_pack("{s:s, s:i, s:o}", "type", type, "index", index, "delta", delta)
                      : json_pack("{s:s, s:i}", "type", type, "index", index);
    http_sse_event(c, type, o);
    json_decref(o);
}

static int on_decoded(hconn *c, hreq *q, cairn_api_call *call)
{
    anthropic_state *st = calloc(1, sizeof *st);
    if (!st)
        return CAIRN_ENOMEM;
    q->wire_state = st;
    const cairn_gen_params *g = &call->req->gen;
    for (int i = 0; i < g->n_stop; i++)
        if (!(st->stop[st->n_stop++] = strdup(g->stop[i])))
            return CAIRN_ENOMEM;
    st->n_prompt = (int64_t)call->req->n_tokens;
    const int64_t page = cairn_service_page_size(c->base.srv->svc);
    for (int i = 0; i < call->req->n_pins; i++) {
        int64_t end = (int64_t)call->req->pins[i].tokens;
        end -= page > 0 ? end % page : 0; /* the cache keeps whole pages */
        if (end > st->bp_end)
            st->bp_end = end;
        if (call->req->pins[i].ttl_s > 300.0 && end > st->bp_end_1h)
            st->bp_end_1h = end;
    }
    if (!q->stream)
        return CAIRN_OK;
    /* the message opens at once; what is cached is known only at the end */
    q->head_sent = true;
    http_sse_head(c);
    json_t *o = json_pack("{s:s, s:{s:s, s:s, s:s, s:[], s:s, s:n, s:n, s:o}}", "type",
                          "message_start", "message", "id", q->id, "type", "message", "role",
                          "assistant", "content", "model", c->base.srv->model_id, "stop_reason",
                          "stop_sequence", "usage", usage_of(st, st->n_prompt, 0, 0));
    http_sse_event(c, "message_start", o);
    json_decref(o);
    o = json_pack("{s:s}", "type", "ping");
    http_sse_event(c, "ping", o);
    json_decref(o);
    return CAIRN_OK;
}

/* A reply's reasoning (gpt-oss's analysis channel) as a thinking block.
 * Its signature is empty: Anthropic signs its own thinking so that it can
 * check what comes back; cairn reads a thinking block sent back as it is. */
static json_t *thinking_block(const char *text, size_t len)
{
    return json_pack("{s:s, s:o, s:s}", "type", "thinking", "thinking", jstrn(text, len),
                     "signature", "");
}

static void close_block(hconn *c, anthropic_state *st)
{
    if (st->thinking_open)
        block_event(c, "content_block_delta", st->n_blocks,
                    json_pack("{s:s, s:s}", "type", "signature_delta", "signature", ""));
    block_event(c, "content_block_stop", st->n_blocks++, NULL);
    st->text_open = st->thinking_open = false;
}

static void on_stream_reasoning(hconn *c, hreq *q, const char *text, size_t len)
{
    anthropic_state *st = state_of(q);
    if (st->text_open) /* reasoning again after some text: a block of its own */
        close_block(c, st);
    if (!st->thinking_open) {
        st->thinking_open = true;
        start_block(c, st, thinking_block("", 0));
    }
    block_event(c, "content_block_delta", st->n_blocks,
                json_pack("{s:s, s:o}", "type", "thinking_delta", "thinking", jstrn(text, len)));
}

static void on_stream_text(hconn *c, hreq *q, const char *text, size_t len)
{
    anthropic_state *st = state_of(q);
    if (st->thinking_open)
        close_block(c, st);
    if (!st->text_open) {
        st->text_open = true;
        start_block(c, st, json_pack("{s:s, s:s}", "type", "text", "text", ""));
    }
    block_event(c, "content_block_delta", st->n_blocks,
                json_pack("{s:s, s:o}", "type", "text_delta", "text", jstrn(text, len)));
}

static bool on_finish(hconn *c, hreq *q, const cairn_event *ev, json_t *calls,
                      const char *reasoning, const char *text, size_t len)
{
    anthropic_state *st = state_of(q);
    json_t *sequence;
    const char *reason = stop_reason(st, ev, calls, &sequence);
    json_t *usage = usage_of(st, ev->prompt_tokens, ev->cached_tokens, ev->completion_tokens);
    /* a cairn extension (the clients keep unknown fields): why the rest of
     * the prompt was not read from the cache */
    if (usage)
        json_object_set_new(usage, "cache_miss", srv_miss_json(&c->base.srv->api, &ev->miss));
    size_t i;
    json_t *call;
    c->active = NULL;
    if (!q->stream) {
        json_t *content = json_array();
        if (content && reasoning && reasoning[0])
            json_array_append_new(content, thinking_block(reasoning, strlen(reasoning)));
        if (content && (len > 0 || !calls))
            json_array_append_new(content, json_pack("{s:s, s:o}", "type", "text", "text",
                                                     jstrn(text, len)));
        json_array_foreach(calls, i, call)
            json_array_append_new(content, tool_use_block(call, false));
        json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:o, s:o}", "id", q->id, "type",
                              "message", "role", "assistant", "model", c->base.srv->model_id,
                              "content", content ? content : json_array(), "stop_reason", reason,
                              "stop_sequence", sequence, "usage", usage);
        if (o)
            http_respond_json(c, 200, o);
        else
            http_respond_error(c, 503, "out of memory", NULL, NULL);
        json_decref(o);
        return true;
    }
    if (!st->text_open && !calls) /* as the whole message has it: one text block */
        on_stream_text(c, q, "", 0);
    if (st->text_open || st->thinking_open)
        close_block(c, st);
    json_array_foreach(calls, i, call)
    {
        json_t *fn = json_object_get(call, "function");
        start_block(c, st, tool_use_block(call, true));
        block_event(c, "content_block_delta", st->n_blocks,
                    json_pack("{s:s, s:O}", "type", "input_json_delta", "partial_json",
                              json_object_get(fn, "arguments")));
        block_event(c, "content_block_stop", st->n_blocks++, NULL);
    }
    json_t *o = json_pack("{s:s, s:{s:s, s:o}, s:o}", "type", "message_delta", "delta",
                          "stop_reason", reason, "stop_sequence", sequence, "usage", usage);
    http_sse_event(c, "message_delta", o);
    json_decref(o);
    o = json_pack("{s:s}", "type", "message_stop");
    http_sse_event(c, "message_stop", o);
    json_decref(o);
    http_sse_close(c);
    return true;
}

static void on_fail(hconn *c, hreq *q, int status, const char *message, const char *param,
                    const char *code)
{
    if (!q->head_sent) {
        http_respond_error(c, status, message, param, code);
        return;
    }
    json_t *body = http_anthropic_error_body(status, message);
    http_sse_event(c, "error", body);
    json_decref(body);
    http_sse_close(c);
}

static void on_free(hreq *q)
{
    anthropic_state *st = state_of(q);
    if (!st)
        return;
    for (int i = 0; i < st->n_stop; i++)
        free(st->stop[i]);
    free(st);
}

const http_wire http_anthropic_wire = {
    .op = CAIRN_API_MESSAGES,
    .id_prefix = "msg_",
    .call_prefix = "toolu_",
    .decoded = on_decoded,
    .stream_text = on_stream_text,
    .stream_reasoning = on_stream_reasoning,
    .finish = on_finish,
    .fail = on_fail,
    .free = on_free,
};
