/*
 * server/http/openai.c — /v1/chat/completions and /v1/completions: the body
 * decoded on a text worker (JSON, then api/api.h), `n` engine requests (a
 * session key makes it one named-session turn), and the answer — one JSON
 * response, or server-sent chunks as tokens come — built from the events.
 *
 * With tools, a stream holds its content back from the first place a tool
 * call could begin (so a call never leaks out as content), and the finished
 * text is read for calls on a text worker before the last chunk.
 *
 * The other wire formats (Anthropic's Messages, OpenAI's Responses) live the
 * same life here as chat requests; their http_wire writes what they answer.
 */
#include "server/http/http.h"

#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void http_request_free(hreq *q)
{
    if (!q)
        return;
    for (int i = 0; i < q->n_choices; i++) {
        cairn_strbuf_free(&q->choices[i].text);
        json_decref(q->choices[i].answer);
        free(q->choices[i].echo);
    }
    free(q->choices);
    free(q->tools_json);
    srv_conv_release(q->conv);
    if (q->wire && q->wire->free)
        q->wire->free(q);
    free(q);
}

static hchoice *choice_of(hreq *q, uint64_t msgid, int *index)
{
    for (int i = 0; q && i < q->n_choices; i++)
        if (q->choices[i].msgid == msgid) {
            *index = i;
            return &q->choices[i];
        }
    return NULL;
}

/* ---- chunks ------------------------------------------------------------------------- */

static json_t *jstr(const char *s, size_t n)
{
    json_t *v = json_stringn(s ? s : "", s ? n : 0);
    return v ? v : json_string(""); /* invalid UTF-8 cannot come from the engine */
}

/* A chunk's frame: {id, object, created, model, choices: [], (usage: null)} */
static json_t *chunk_frame(const hconn *c, const hreq *q)
{
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:[]}", "id", q->id, "object",
                          q->kind == HK_CHAT ? "chat.completion.chunk" : "text_completion",
                          "created", (json_int_t)q->created, "model", c->base.srv->model_id,
                          "choices");
    if (o && q->include_usage)
        json_object_set_new(o, "usage", json_null());
    return o;
}

/* One chunk holding `choice` (taken; NULL when building it failed). */
static void send_choice_chunk(hconn *c, hreq *q, json_t *choice)
{
    json_t *o = chunk_frame(c, q);
    if (o && choice)
        json_array_append_new(json_object_get(o, "choices"), choice);
    else
        json_decref(choice);
    http_sse_json(c, o);
    json_decref(o);
}

static void send_chat_delta(hconn *c, hreq *q, int index, json_t *delta, json_t *logprobs,
                            const char *finish)
{
    send_choice_chunk(c, q, json_pack("{s:i, s:o, s:o, s:o}", "index", index, "delta", delta,
                                      "logprobs", logprobs ? logprobs : json_null(),
                                      "finish_reason", finish ? json_string(finish) : json_null()));
}

static void send_completion_delta(hconn *c, hreq *q, int index, const char *text, size_t len,
                                  json_t *logprobs, const char *finish)
{
    send_choice_chunk(c, q, json_pack("{s:o, s:i, s:o, s:o}", "text", jstr(text, len), "index",
                                      index, "logprobs", logprobs ? logprobs : json_null(),
                                      "finish_reason", finish ? json_string(finish) : json_null()));
}

/* ---- logprobs ------------------------------------------------------------------------ */

/* JSON has no -inf: OpenAI reports -9999 for "impossible". */
static double finite_logprob(float lp) { return lp > -9999.0f ? (double)lp : -9999.0; }

/* {token, logprob, bytes} of one token: the text of a token may be part of
 * a UTF-8 character, which `bytes` carries exactly (token is "" then). A
 * piece is a table lookup, not text work. */
static json_t *token_entry(const cairn_api *api, int32_t tok, float logprob)
{
    char piece[300];
    size_t n = 0;
    if (cairn_api_token_piece(api, tok, piece, sizeof piece, &n) != CAIRN_OK)
        n = 0;
    json_t *bytes = json_array();
    for (size_t i = 0; i < n && bytes; i++)
        json_array_append_new(bytes, json_integer((unsigned char)piece[i]));
    return json_pack("{s:o, s:f, s:o}", "token", jstr(piece, n), "logprob",
                     finite_logprob(logprob), "bytes", bytes ? bytes : json_null());
}

/* chat: {"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]} */
static json_t *chat_logprobs(const cairn_api *api, const cairn_event *ev)
{
    if (!ev->logprobs)
        return NULL;
    size_t per = 1 + (size_t)ev->n_top;
    json_t *content = json_array();
    for (size_t i = 0; i < ev->n_tokens && content; i++) {
        const cairn_token_logprob *lp = ev->logprobs + i * per;
        json_t *entry = token_entry(api, ev->tokens[i], lp[0].logprob);
        json_t *top = json_array();
        for (int k = 1; k <= ev->n_top && top; k++)
            if (lp[k].token >= 0)
                json_array_append_new(top, token_entry(api, lp[k].token, lp[k].logprob));
        if (entry)
            json_object_set_new(entry, "top_logprobs", top ? top : json_array());
        json_array_append_new(content, entry);
    }
    return json_pack("{s:o}", "content", content ? content : json_array());
}

/* completions: {tokens, token_logprobs, top_logprobs, text_offset}. */
static json_t *completion_logprobs(const cairn_api *api, const cairn_event *ev, size_t offset)
{
    if (!ev->logprobs)
        return NULL;
    size_t per = 1 + (size_t)ev->n_top;
    json_t *tokens = json_array(), *lps = json_array(), *offsets = json_array();
    json_t *tops = ev->n_top > 0 ? json_array() : json_null();
    for (size_t i = 0; i < ev->n_tokens; i++) {
        const cairn_token_logprob *lp = ev->logprobs + i * per;
        char piece[300];
        size_t n = 0;
        if (cairn_api_token_piece(api, ev->tokens[i], piece, sizeof piece, &n) != CAIRN_OK)
            n = 0;
        json_array_append_new(tokens, jstr(piece, n));
        json_array_append_new(lps, json_real(finite_logprob(lp[0].logprob)));
        json_array_append_new(offsets, json_integer((json_int_t)offset));
        offset += n;
        if (ev->n_top > 0) {
            json_t *alt = json_object();
            for (int k = 1; k <= ev->n_top; k++) {
                size_t m = 0;
                if (lp[k].token < 0 || cairn_api_token_piece(api, lp[k].token, piece,
                                                             sizeof piece - 1, &m) != CAIRN_OK)
                    continue;
                piece[m] = '\0';
                json_object_set_new(alt, piece, json_real(finite_logprob(lp[k].logprob)));
            }
            json_array_append_new(tops, alt);
        }
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps,
                     "top_logprobs", tops, "text_offset", offsets);
}

/* ---- streaming ------------------------------------------------------------------------- */

static void stream_begin(hconn *c, hreq *q, int index)
{
    if (!q->head_sent) {
        q->head_sent = true;
        http_sse_head(c);
    }
    hchoice *ch = &q->choices[index];
    if (ch->echo) { /* completions with echo: the prompt comes first */
        send_completion_delta(c, q, index, ch->echo, ch->echo_len, NULL, NULL);
        free(ch->echo);
        ch->echo = NULL;
    }
    if (q->kind == HK_CHAT && !ch->role_sent) {
        ch->role_sent = true;
        send_chat_delta(c, q, index, json_pack("{s:s, s:s}", "role", "assistant", "content", ""),
                        NULL, NULL);
    }
}

static void stream_content(hconn *c, hreq *q, int index, const char *text, size_t len)
{
    if (len == 0)
        return;
    if (q->wire)
        q->wire->stream_text(c, q, text, len);
    else if (q->kind == HK_CHAT)
        send_chat_delta(c, q, index, json_pack("{s:o}", "content", jstr(text, len)), NULL, NULL);
    else
        send_completion_delta(c, q, index, text, len, NULL, NULL);
}

/* Streaming: a piece of the reply's reasoning, as `reasoning_content`
 * deltas (vLLM's and llama.cpp's field), or as the wire writes reasoning
 * (Responses: a reasoning item; Anthropic: a thinking block). */
static void stream_reasoning(hconn *c, hreq *q, int index, const char *text, size_t len)
{
    if (len == 0)
        return;
    if (!q->wire)
        send_chat_delta(c, q, index, json_pack("{s:o}", "reasoning_content", jstr(text, len)),
                        NULL, NULL);
    else if (q->wire->stream_reasoning)
        q->wire->stream_reasoning(c, q, text, len);
}

/* Streaming a reply in channels: each settled piece as it comes, the
 * reasoning as reasoning (stream_reasoning), the content as content. Calls
 * come whole at the end (stream_finish). */
static void stream_channels(hconn *c, hreq *q, int index)
{
    hchoice *ch = &q->choices[index];
    const char *text = ch->text.data ? ch->text.data : "";
    cairn_chat_reply_part part;
    while (cairn_api_reply_next(&c->base.srv->api, &ch->cursor, text, ch->text.len, false,
                                &part)) {
        if (part.kind == CAIRN_REPLY_CALL || part.len == 0)
            continue;
        stream_begin(c, q, index);
        if (part.kind == CAIRN_REPLY_REASONING) {
            stream_reasoning(c, q, index, text + part.off, part.len);
            ch->reasoning_sent += part.len;
        } else {
            stream_content(c, q, index, text + part.off, part.len);
            ch->text_sent += part.len;
        }
    }
}

static void on_delta(hconn *c, hreq *q, int index, const cairn_event *ev)
{
    if (!q->stream)
        return;
    hchoice *ch = &q->choices[index];
    const cairn_api *api = &c->base.srv->api;
    if (q->channels) {
        cairn_strbuf_add(&ch->text, ev->text, ev->text_len);
        if (!ch->text.oom)
            stream_channels(c, q, index);
        return;
    }
    if (!q->tools_json) {
        if (ev->text_len == 0 && !(ev->logprobs && ev->n_tokens))
            return;
        stream_begin(c, q, index);
        if (!ev->logprobs)
            stream_content(c, q, index, ev->text, ev->text_len);
        else if (q->kind == HK_CHAT)
            send_chat_delta(c, q, index, json_pack("{s:o}", "content", jstr(ev->text, ev->text_len)),
                            chat_logprobs(api, ev), NULL);
        else
            send_completion_delta(c, q, index, ev->text, ev->text_len,
                                  completion_logprobs(api, ev, ch->text_sent), NULL);
        ch->text_sent += ev->text_len;
        return;
    }
    cairn_strbuf_add(&ch->text, ev->text, ev->text_len);
    if (ch->holding || ch->text.oom)
        return;
    bool certain;
    /* from where a call may have begun (api/api.h: markers, a leading
     * object, a fenced call of one of the tools) */
    size_t upto = cairn_api_tool_call_start(ch->text.data ? ch->text.data : "", ch->text.len,
                                            q->tools_json, &certain);
    ch->holding = certain;
    /* never cut a UTF-8 character */
    while (upto > ch->text_sent && upto < ch->text.len &&
           ((unsigned char)ch->text.data[upto] & 0xC0) == 0x80)
        upto--;
    if (upto > ch->text_sent) {
        stream_begin(c, q, index);
        stream_content(c, q, index, ch->text.data + ch->text_sent, upto - ch->text_sent);
        ch->text_sent = upto;
    }
}

/* ---- answers ---------------------------------------------------------------------------- */

/* Every choice is in: the usage chunk and the end of the stream, or the
 * whole response. Takes the request. */
static void answer_request(hconn *c, hreq *q)
{
    c->active = NULL;
    /* each prompt counts once (its n choices share it), each choice's tokens */
    int64_t completion = 0, prompt = 0, cached = 0, tier[4] = {0, 0, 0, 0}, reasoning = 0;
    int64_t spec[4] = {0, 0, 0, 0}; /* steps, tokens, drafted, accepted */
    const char *method = NULL;
    const int per = q->per_prompt > 0 ? q->per_prompt : 1;
    for (int i = 0; i < q->n_choices; i++) {
        const hchoice *ch = &q->choices[i];
        completion += ch->completion_tokens;
        reasoning += ch->reasoning_tokens;
        spec[0] += ch->spec_steps;
        spec[1] += ch->spec_tokens;
        spec[2] += ch->spec_drafted;
        spec[3] += ch->spec_accepted;
        if (ch->spec_method[0])
            method = ch->spec_method;
        if (i % per)
            continue;
        prompt += ch->prompt_tokens;
        cached += ch->cached_tokens;
        for (int t = 0; t < 4; t++)
            tier[t] += ch->cached_by_tier[t];
    }
    /* cached_tokens_by_tier: where the cached tokens were found (a cairn
     * extension beside OpenAI's cached_tokens; they sum to it) */
    json_t *usage = json_pack(
        "{s:I, s:I, s:I, s:{s:I, s:{s:I, s:I, s:I, s:I}}}", "prompt_tokens", (json_int_t)prompt,
        "completion_tokens", (json_int_t)completion, "total_tokens",
        (json_int_t)(prompt + completion), "prompt_tokens_details", "cached_tokens",
        (json_int_t)cached, "cached_tokens_by_tier", "device", (json_int_t)tier[0], "host",
        (json_int_t)tier[1], "disk", (json_int_t)tier[2], "shared", (json_int_t)tier[3]);
    /* speculative: how the reply was decoded (a cairn extension): steps =
     * target forwards that verified a draft, tokens = what they gave, tau =
     * tokens / steps, drafted / accepted = draft tokens checked / kept */
    /* cache_miss: why the uncached part was not cached (docs/why-recomputed.md);
     * the first prompt's, which every choice of it shares */
    if (usage && q->n_choices > 0)
        json_object_set_new(json_object_get(usage, "prompt_tokens_details"), "cache_miss",
                            srv_miss_json(&c->base.srv->api, &q->choices[0].miss));
    /* OpenAI's reasoning count, for models whose replies are read for it */
    if (usage && q->channels)
        json_object_set_new(usage, "completion_tokens_details",
                            json_pack("{s:I}", "reasoning_tokens", (json_int_t)reasoning));
    if (usage && spec[0] > 0)
        json_object_set_new(usage, "speculative",
                            json_pack("{s:s, s:I, s:I, s:f, s:I, s:I}", "method",
                                      method ? method : "", "steps", (json_int_t)spec[0], "tokens",
                                      (json_int_t)spec[1], "tau", (double)spec[1] / (double)spec[0],
                                      "drafted", (json_int_t)spec[2], "accepted",
                                      (json_int_t)spec[3]));
    if (q->stream) {
        if (q->include_usage) {
            json_t *o = chunk_frame(c, q);
            if (o)
                json_object_set(o, "usage", usage);
            http_sse_json(c, o);
            json_decref(o);
        }
        http_sse_end(c);
    } else {
        json_t *choices = json_array();
        for (int i = 0; choices && i < q->n_choices; i++)
            json_array_append(choices, q->choices[i].answer);
        json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:o, s:O}", "id", q->id, "object",
                              q->kind == HK_CHAT ? "chat.completion" : "text_completion",
                              "created", (json_int_t)q->created, "model", c->base.srv->model_id,
                              "choices", choices ? choices : json_array(), "usage", usage);
        if (o)
            http_respond_json(c, 200, o);
        else
            http_respond_error(c, 503, "out of memory", NULL, NULL);
        json_decref(o);
    }
    json_decref(usage);
    http_request_free(q);
}

/* Answer an error (HTTP status, or an SSE error event once streaming has
 * begun) and end the request; the other choices are cancelled (their
 * events find no request any more). Takes the request. */
static void fail_request(hconn *c, hreq *q, int status, const char *message, const char *param,
                         const char *code)
{
    c->active = NULL;
    for (int i = 0; i < q->n_choices; i++) {
        if (q->choices[i].over || !q->choices[i].msgid)
            continue;
        cairn_request *r = cairn_request_new(CAIRN_REQ_CANCEL);
        if (r) {
            r->target = q->choices[i].msgid; /* the cancel's own answer (id 0) matches nothing */
            srv_submit(&c->base, r);
        }
    }
    if (q->wire && q->wire->fail) {
        q->wire->fail(c, q, status, message, param, code);
    } else if (q->head_sent) {
        json_t *body = http_error_body(status, message, param, code);
        http_sse_json(c, body);
        json_decref(body);
        http_sse_end(c);
    } else {
        http_respond_error(c, status, message, param, code);
    }
    http_request_free(q);
}

static const char *finish_of(const cairn_event *ev)
{
    const char *f = ev->finish_reason;
    return f && strcmp(f, "length") == 0 ? "length" : "stop";
}

/* Streaming with tools: what was held back, the rest of the content
 * (`read`: text is the content read out of the reply, not all of it). */
static void stream_held(hconn *c, hreq *q, int index, bool read, const char *text,
                        size_t text_len)
{
    hchoice *ch = &q->choices[index];
    const char *all = ch->text.data ? ch->text.data : "";
    if (!read)
        stream_content(c, q, index, all + ch->text_sent, ch->text.len - ch->text_sent);
    else if (text_len > ch->text_sent && memcmp(text, all, ch->text_sent) == 0)
        stream_content(c, q, index, text + ch->text_sent, text_len - ch->text_sent);
}

/* Streaming a reply in channels, at its end: what the finished reply's
 * reasoning and content hold beyond what was streamed of them (read the
 * same way, what was streamed is their beginning). */
static void stream_rest(hconn *c, hreq *q, int index, const char *reasoning, const char *text,
                        size_t text_len)
{
    hchoice *ch = &q->choices[index];
    size_t r_len = reasoning ? strlen(reasoning) : 0;
    if (r_len > ch->reasoning_sent)
        stream_reasoning(c, q, index, reasoning + ch->reasoning_sent, r_len - ch->reasoning_sent);
    ch->reasoning_sent = r_len;
    if (text_len > ch->text_sent)
        stream_content(c, q, index, text + ch->text_sent, text_len - ch->text_sent);
    ch->text_sent = text_len;
}

/* Streaming: what was held back (the rest of the content), then the calls
 * as tool_calls deltas, then the choice's last chunk. */
static void stream_finish(hconn *c, hreq *q, int index, json_t *tool_calls, bool read,
                          const char *reasoning, const char *text, size_t text_len,
                          const char *finish)
{
    stream_begin(c, q, index);
    if (q->tools_json || q->channels) {
        if (q->channels)
            stream_rest(c, q, index, reasoning, text, text_len);
        else
            stream_held(c, q, index, read, text, text_len);
        size_t i;
        json_t *call;
        json_array_foreach(tool_calls, i, call)
        {
            json_t *fn = json_object_get(call, "function");
            send_chat_delta(c, q, index,
                            json_pack("{s:[{s:I, s:O, s:s, s:{s:O, s:s}}]}", "tool_calls",
                                      "index", (json_int_t)i, "id", json_object_get(call, "id"),
                                      "type", "function", "function", "name",
                                      json_object_get(fn, "name"), "arguments", ""),
                            NULL, NULL);
            send_chat_delta(c, q, index,
                            json_pack("{s:[{s:I, s:{s:O}}]}", "tool_calls", "index",
                                      (json_int_t)i, "function", "arguments",
                                      json_object_get(fn, "arguments")),
                            NULL, NULL);
        }
    }
    if (q->kind == HK_CHAT)
        send_chat_delta(c, q, index, json_object(), NULL, finish);
    else
        send_completion_delta(c, q, index, "", 0, NULL, finish);
}

/* A choice's generation is done (its text read for tool calls when the
 * request had tools, and for its reasoning when the reply is in channels:
 * calls_json / content / reasoning, else NULL). */
static void finish_choice(hconn *c, hreq *q, int index, const cairn_event *ev,
                          const char *calls_json, const char *content, const char *reasoning)
{
    hchoice *ch = &q->choices[index];
    ch->over = true;
    q->n_over++;
    ch->prompt_tokens = ev->prompt_tokens;
    ch->cached_tokens = ev->cached_tokens;
    ch->miss = ev->miss;
    for (int t = 0; t < 4; t++)
        ch->cached_by_tier[t] = ev->cached_by_tier[t];
    ch->completion_tokens = ev->completion_tokens;
    ch->reasoning_tokens =
        reasoning ? cairn_api_reasoning_tokens(&c->base.srv->api, reasoning, strlen(reasoning)) : 0;
    ch->spec_steps = ev->spec_forwards;
    ch->spec_tokens = ev->spec_tokens;
    ch->spec_drafted = ev->spec_drafted;
    ch->spec_accepted = ev->spec_accepted;
    snprintf(ch->spec_method, sizeof ch->spec_method, "%s", ev->spec_method);
    const char *finish = finish_of(ev);
    json_t *tool_calls = calls_json ? json_loads(calls_json, 0, NULL) : NULL;
    if (tool_calls && (!json_is_array(tool_calls) || json_array_size(tool_calls) == 0)) {
        json_decref(tool_calls);
        tool_calls = NULL;
    }
    const char *text = ev->text;
    size_t text_len = ev->text_len;
    if (tool_calls || content) { /* content alone: a cut reply's partial call dropped */
        if (tool_calls && strcmp(finish, "length") != 0)
            finish = "tool_calls"; /* a reply cut after calls is still cut */
        text = content ? content : "";
        text_len = strlen(text);
    }
    const cairn_api *api = &c->base.srv->api;
    if (q->wire) {
        if (q->stream && (q->tools_json || q->channels)) {
            stream_begin(c, q, index);
            if (q->channels)
                stream_rest(c, q, index, reasoning, text, text_len);
            else
                stream_held(c, q, index, tool_calls || content, text, text_len);
        }
        bool answered = q->wire->finish(c, q, ev, tool_calls, reasoning, text, text_len);
        json_decref(tool_calls);
        if (answered)
            http_request_free(q);
        return;
    }
    if (q->stream) {
        stream_finish(c, q, index, tool_calls, tool_calls || content, reasoning, text, text_len,
                      finish);
    } else if (q->kind == HK_CHAT) {
        json_t *msg = json_pack("{s:s, s:o}", "role", "assistant", "content",
                                tool_calls && text_len == 0 ? json_null() : jstr(text, text_len));
        if (msg && tool_calls)
            json_object_set(msg, "tool_calls", tool_calls);
        if (msg && reasoning) /* a reply in channels: its analysis */
            json_object_set_new(msg, "reasoning_content", jstr(reasoning, strlen(reasoning)));
        json_t *lp = chat_logprobs(api, ev);
        ch->answer = json_pack("{s:i, s:o, s:o, s:s}", "index", index, "message", msg,
                               "logprobs", lp ? lp : json_null(), "finish_reason", finish);
    } else {
        json_t *lp = completion_logprobs(api, ev, 0);
        cairn_strbuf whole = {0}; /* with echo: the prompt, then the completion */
        if (ch->echo) {
            cairn_strbuf_add(&whole, ch->echo, ch->echo_len);
            cairn_strbuf_add(&whole, text, text_len);
        }
        ch->answer = whole.oom ? NULL
                     : json_pack("{s:o, s:i, s:o, s:s}", "text",
                                 ch->echo ? jstr(whole.data, whole.len) : jstr(text, text_len),
                                 "index", index, "logprobs", lp ? lp : json_null(),
                                 "finish_reason", finish);
        cairn_strbuf_free(&whole);
    }
    json_decref(tool_calls);
    if (!q->stream && !ch->answer) {
        fail_request(c, q, 503, "out of memory", NULL, NULL);
        return;
    }
    if (q->n_over == q->n_choices)
        answer_request(c, q);
}

/* The finished text of a request with tools, read for calls on a worker. */
typedef struct {
    srv_calls k;
    uint32_t msgid; /* the choice it finishes */
} calls_item;

static void calls_answer(srv_calls *k, srv_conn *b)
{
    hconn *c = (hconn *)b;
    int index;
    hreq *q = c ? c->active : NULL;
    if (q && choice_of(q, ((calls_item *)k)->msgid, &index)) {
        q->parsing--;
        finish_choice(c, q, index, &k->node->ev, k->calls_json, k->content, k->reasoning);
    }
}

static bool on_generation_done(hconn *c, hreq *q, int index, srv_event *node);

/* A miss inside the conversation has been placed: go on with the event. */
/* A miss that departed inside the cached sequence: which part of the
 * conversation changed takes rendering, so it is found on a text worker and
 * `answer` finishes the reply there. false: nothing queued (no such miss, no
 * conversation kept, or out of memory), the caller answers as it is. */
static bool queue_classify(hconn *c, hreq *q, int index, srv_event *node,
                           bool (*answer)(srv_classify *, srv_conn *))
{
    const cairn_cache_miss *miss = &node->ev.miss;
    if (!miss->known || miss->reason != CAIRN_MISS_DEPARTED || !q->conv)
        return false;
    srv_classify *k = calloc(1, sizeof *k);
    if (!k)
        return false;
    k->conv = q->conv;
    k->node = node;
    k->msgid = q->choices[index].msgid;
    k->answer = answer;
    if (srv_classify_queue(c->base.srv, k, c->base.id) == CAIRN_OK)
        return true;
    free(k);
    return false;
}

static bool classified(srv_classify *k, srv_conn *b)
{
    hconn *c = (hconn *)b;
    int index;
    hreq *q = c->active;
    if (!q || q->failed || !choice_of(q, k->msgid, &index))
        return false;
    return on_generation_done(c, q, index, k->node);
}

static bool on_generation_done(hconn *c, hreq *q, int index, srv_event *node)
{
    if (queue_classify(c, q, index, node, classified))
        return true;
    cairn_cache_miss *miss = &node->ev.miss;
    if (miss->reason == CAIRN_MISS_DEPARTED) /* no structure to tell parts by */
        miss->reason = CAIRN_MISS_NEW_CONTENT;
    srv_miss_count(c->base.srv, miss);
    if ((q->kind != HK_CHAT && q->kind != HK_WIRE) || (!q->tools_json && !q->channels)) {
        finish_choice(c, q, index, &node->ev, NULL, NULL, NULL);
        return false;
    }
    calls_item *ci = calloc(1, sizeof *ci);
    if (!ci || (q->tools_json && !(ci->k.tools_json = strdup(q->tools_json)))) {
        free(ci);
        fail_request(c, q, 503, "out of memory", NULL, NULL);
        return false;
    }
    ci->msgid = q->choices[index].msgid;
    /* ids unique across turns: call_<request>_<n> */
    const char *tail = strpbrk(q->id, "-_");
    snprintf(ci->k.prefix, sizeof ci->k.prefix, "%s%s_", q->wire ? q->wire->call_prefix : "call_",
             tail ? tail + 1 : q->id);
    ci->k.answer = calls_answer;
    ci->k.node = node; /* queued: the item keeps the event */
    q->parsing++;
    if (srv_calls_queue(c->base.srv, &ci->k, c->base.id) != CAIRN_OK) {
        ci->k.node = NULL; /* not queued: the caller keeps the event */
        q->parsing--;
        srv_calls_free(&ci->k);
        fail_request(c, q, 503, "out of memory", NULL, NULL);
        return false;
    }
    return true;
}

/* ---- POST /v1/cache/explain ------------------------------------------------------------ */

/* The answer: what a run of the prompt would find, and why not more. */
static void explain_answer(hconn *c, hreq *q, const cairn_event *ev)
{
    c->active = NULL;
    cairn_cache_miss miss = ev->miss;
    if (miss.reason == CAIRN_MISS_DEPARTED)
        miss.reason = CAIRN_MISS_NEW_CONTENT;
    json_t *o = json_pack("{s:s, s:I, s:I, s:o}", "object", "cache.explain", "prompt_tokens",
                          (json_int_t)ev->prompt_tokens, "cached_tokens",
                          (json_int_t)ev->cached_tokens, "cache_miss",
                          srv_miss_json(&c->base.srv->api, &miss));
    if (o)
        http_respond_json(c, 200, o);
    else
        http_respond_error(c, 503, "out of memory", NULL, NULL);
    json_decref(o);
    http_request_free(q);
}

static bool explain_classified(srv_classify *k, srv_conn *b)
{
    hconn *c = (hconn *)b;
    int index;
    hreq *q = c->active;
    if (q && !q->failed && q->kind == HK_EXPLAIN && choice_of(q, k->msgid, &index))
        explain_answer(c, q, &k->node->ev);
    return false;
}

static bool on_explain_event(hconn *c, hreq *q, int index, srv_event *node)
{
    const cairn_event *ev = &node->ev;
    if (ev->kind == CAIRN_EV_ERROR) {
        fail_request(c, q, http_status_of(ev->code), ev->message ? ev->message : "error", NULL,
                     NULL);
        return false;
    }
    if (ev->kind != CAIRN_EV_DONE || ev->what != CAIRN_DONE_EXPLAIN)
        return false;
    if (queue_classify(c, q, index, node, explain_classified))
        return true;
    explain_answer(c, q, ev);
    return false;
}

/* The decoded body becomes one CACHE_EXPLAIN: the prompt's tokens, looked up
 * for this connection's tenant; nothing runs. */
static int explain_submit(hconn *c, hreq *q, cairn_api_call *call)
{
    if (!call->req || call->req->n_tokens == 0)
        return CAIRN_EINVAL;
    q->conv = srv_conv_take(call);
    q->choices = calloc(1, sizeof *q->choices);
    cairn_request *r = q->choices ? cairn_request_new(CAIRN_REQ_CACHE_EXPLAIN) : NULL;
    if (!r)
        return CAIRN_ENOMEM;
    q->n_choices = 1;
    r->tokens = call->req->tokens;
    r->n_tokens = call->req->n_tokens;
    call->req->tokens = NULL;
    call->req->n_tokens = 0;
    r->id = q->choices[0].msgid = ++c->next_msgid;
    return srv_submit(&c->base, r) == CAIRN_OK ? CAIRN_OK : CAIRN_ECLOSED;
}

/* ---- POST /v1/.../render ---------------------------------------------------------------- */

/* One prompt as vLLM's GenerateRequest: its token ids and the sampling the
 * request asked for. */
static json_t *render_one(const hreq *q, int index, const int32_t *tokens, size_t n,
                          const cairn_request *r, const char *model)
{
    json_t *ids = json_array();
    for (size_t i = 0; ids && i < n; i++)
        json_array_append_new(ids, json_integer(tokens[i]));
    const cairn_sampling_params *sp = &r->gen.sampling;
    char rid[96];
    snprintf(rid, sizeof rid, index > 0 ? "%s-%d" : "%s", q->id, index);
    return json_pack("{s:s, s:o, s:{s:i, s:f, s:f, s:i, s:f}, s:s, s:b}", "request_id", rid,
                     "token_ids", ids ? ids : json_null(), "sampling_params", "max_tokens",
                     r->gen.max_tokens, "temperature", (double)sp->temperature, "top_p",
                     (double)sp->top_p, "top_k", sp->top_k, "min_p", (double)sp->min_p, "model",
                     model, "stream", false);
}

static void render_answer(hconn *c, hreq *q, cairn_api_call *call)
{
    c->active = NULL;
    const char *model = c->base.srv->model_id;
    json_t *o = NULL;
    if (!call->req || call->req->n_tokens == 0) {
        http_request_free(q);
        http_respond_error(c, 400, "the prompt is empty", "messages", NULL);
        return;
    }
    if (call->op == CAIRN_API_COMPLETION) {
        o = json_array();
        for (int i = 0; o && i < call->n_prompts; i++) {
            const cairn_api_prompt *p = &call->prompts[i];
            const int32_t *t = i == 0 || !p->tokens ? call->req->tokens : p->tokens;
            size_t n = i == 0 || !p->tokens ? call->req->n_tokens : p->n_tokens;
            json_array_append_new(o, render_one(q, i, t, n, call->req, model));
        }
    } else {
        o = render_one(q, 0, call->req->tokens, call->req->n_tokens, call->req, model);
    }
    if (o)
        http_respond_json(c, 200, o);
    else
        http_respond_error(c, 503, "out of memory", NULL, NULL);
    json_decref(o);
    http_request_free(q);
}

bool http_on_event(hconn *c, srv_event *node)
{
    const cairn_event *ev = &node->ev;
    hreq *q = c->active;
    int index;
    if (q && !q->failed && q->wire && q->wire->on_event && q->wire->on_event(c, q, node))
        return false;
    if (!q || q->failed || !choice_of(q, ev->id, &index))
        return false; /* a choice of a request already answered */
    if (q->kind == HK_WEB) {
        http_web_on_event(c, q, index, ev);
        return false;
    }
    if (q->kind == HK_EXPLAIN)
        return on_explain_event(c, q, index, node);
    if (q->kind == HK_METRICS) {
        if (ev->kind == CAIRN_EV_DONE && ev->what == CAIRN_DONE_STATS)
            http_metrics_answer(c, &ev->stats);
        else if (ev->kind == CAIRN_EV_ERROR)
            fail_request(c, q, http_status_of(ev->code), ev->message, NULL, NULL);
        return false;
    }
    if (ev->kind == CAIRN_EV_ERROR) {
        fail_request(c, q, http_status_of(ev->code), ev->message ? ev->message : "error", NULL,
                     ev->code == CAIRN_ERANGE ? "context_length_exceeded" : NULL);
        return false;
    }
    if (ev->kind == CAIRN_EV_DELTA) {
        on_delta(c, q, index, ev);
        return false;
    }
    if (ev->kind == CAIRN_EV_DONE && ev->what == CAIRN_DONE_GENERATION)
        return on_generation_done(c, q, index, node);
    return false;
}

/* ---- requests ------------------------------------------------------------------------------ */

/* A body on its way to the engine. */
typedef struct {
    srv_work w;
    cairn_api_op op;
    char *body;            /* the request body (owned)                         */
    size_t body_len;
    char *session_header;  /* X-Session-Id (owned) or NULL                    */
    uint64_t seed;
    bool explain;          /* POST /v1/cache/explain: the op is the body's    */
    int rc;
    cairn_api_call call;
    cairn_api_error err;
} decode_item;

/* POST /tokenize, in the shapes llama-server and vLLM take: `content` or
 * `prompt` (text; `add_special` / `add_special_tokens` for BOS), or
 * `messages` (a chat, rendered as /v1/chat/completions renders it). */
static int decode_tokenize(cairn_server *srv, json_t *root, decode_item *it)
{
    const cairn_api *api = &srv->api;
    if (json_object_get(root, "messages")) {
        /* Measuring is what /tokenize is for: a conversation longer than
         * the context is counted (up to max_tokenize), not refused. */
        cairn_api wide = *api;
        if (api->max_tokenize > (uint32_t)api->n_ctx)
            wide.n_ctx = api->max_tokenize > INT_MAX ? INT_MAX : (int)api->max_tokenize;
        int rc = cairn_api_decode(&wide, CAIRN_API_CHAT, root, it->seed, NULL, NULL, &it->call,
                                  &it->err);
        if (rc == CAIRN_OK) {
            cairn_request *r = it->call.req;
            it->call.tokens = r->tokens;
            it->call.n_tokens = r->n_tokens;
            r->tokens = NULL;
            r->n_tokens = 0;
        }
        it->call.op = CAIRN_API_TOKENIZE;
        return rc;
    }
    static const char *const text_names[] = {"content", "prompt"};
    static const char *const bos_names[] = {"add_special", "add_special_tokens"};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(root, text_names[i]);
        if (v && !json_object_get(root, "text"))
            json_object_set(root, "text", v);
        v = json_object_get(root, bos_names[i]);
        if (v && !json_object_get(root, "add_bos"))
            json_object_set(root, "add_bos", v);
    }
    if (!json_object_get(root, "text")) {
        it->err = (cairn_api_error){.code = CAIRN_EINVAL, .field = "content"};
        snprintf(it->err.message, sizeof it->err.message,
                 "'content' (or 'prompt', or 'messages') is required");
        return CAIRN_EINVAL;
    }
    return cairn_api_decode(api, CAIRN_API_TOKENIZE, root, it->seed, NULL, NULL, &it->call,
                            &it->err);
}

static void decode_work(srv_work *w)
{
    decode_item *it = (decode_item *)w;
    json_error_t jerr;
    json_t *root = cairn_api_json_parse(it->body, it->body_len, &jerr);
    free(it->body);
    it->body = NULL;
    if (!root || !json_is_object(root)) {
        it->rc = CAIRN_EINVAL;
        if (root)
            snprintf(it->err.message, sizeof it->err.message, "the body must be a JSON object");
        else
            snprintf(it->err.message, sizeof it->err.message,
                     "invalid JSON at line %d column %d: %s", jerr.line, jerr.column, jerr.text);
        json_decref(root);
        return;
    }
    if (it->explain) /* the body of whichever route it would be run on */
        it->op = json_object_get(root, "prompt") && !json_object_get(root, "messages")
                     ? CAIRN_API_COMPLETION
                 : json_object_get(root, "system") ? CAIRN_API_MESSAGES
                                                   : CAIRN_API_CHAT;
    it->rc = it->op == CAIRN_API_TOKENIZE ? decode_tokenize(w->srv, root, it)
                                          : cairn_api_decode(&w->srv->api, it->op, root, it->seed,
                                                             it->session_header, NULL, &it->call,
                                                             &it->err);
    json_decref(root);
}

static void decode_item_free(decode_item *it)
{
    cairn_api_call_clear(&it->call);
    free(it->body);
    free(it->session_header);
    free(it);
}

/* Every choice to the engine, in index order (choice i samples with seed + i). */
static int submit_choices(hconn *c, hreq *q, cairn_api_call *call)
{
    for (int i = 0; i < q->n_choices; i++) {
        cairn_request *r = NULL;
        if (q->n_choices == 1) {
            r = call->req; /* the only one: as decoded */
            call->req = NULL;
        } else if (cairn_api_choice(call, i, &r) != CAIRN_OK) {
            return CAIRN_ENOMEM;
        }
        r->id = q->choices[i].msgid = ++c->next_msgid;
        r->gen.stream = q->stream;
        if (srv_submit(&c->base, r) != CAIRN_OK)
            return CAIRN_ECLOSED;
    }
    return CAIRN_OK;
}

static void decode_done(srv_work *w, srv_conn *b)
{
    decode_item *it = (decode_item *)w;
    hconn *c = (hconn *)b;
    hreq *q = c ? c->active : NULL;
    if (!q) {
        decode_item_free(it);
        return;
    }
    q->decoding = false;
    if (it->rc != CAIRN_OK) {
        fail_request(c, q, it->rc == CAIRN_ENOMEM ? 503 : 400, it->err.message, it->err.field,
                     it->err.reason);
        decode_item_free(it);
        return;
    }
    cairn_api_call *call = &it->call;
    if (q->kind == HK_RENDER) {
        render_answer(c, q, call);
        decode_item_free(it);
        return;
    }
    if (q->kind == HK_EXPLAIN) {
        int rc = explain_submit(c, q, call);
        if (rc == CAIRN_EINVAL)
            fail_request(c, q, 400, "the prompt is empty", "messages", NULL);
        else if (rc != CAIRN_OK)
            fail_request(c, q, 503, rc == CAIRN_ENOMEM ? "out of memory"
                                                       : "the engine is not accepting requests",
                         NULL, NULL);
        decode_item_free(it);
        return;
    }
    if (call->op == CAIRN_API_TOKENIZE || call->op == CAIRN_API_DETOKENIZE) {
        c->active = NULL;
        json_t *o = NULL;
        if (call->op == CAIRN_API_TOKENIZE) {
            json_t *ids = json_array();
            for (size_t i = 0; ids && i < call->n_tokens; i++)
                json_array_append_new(ids, json_integer(call->tokens[i]));
            o = json_pack("{s:o, s:I, s:i}", "tokens", ids ? ids : json_null(), "count",
                          (json_int_t)call->n_tokens, "max_model_len", c->base.srv->api.n_ctx);
        } else {
            /* llama-server says content, vLLM prompt */
            o = json_pack("{s:s%, s:s%}", "content", call->text, call->text_len, "prompt",
                          call->text, call->text_len);
        }
        if (o)
            http_respond_json(c, 200, o);
        else
            http_respond_error(c, 503, "out of memory", NULL, NULL);
        json_decref(o);
        http_request_free(q);
        decode_item_free(it);
        return;
    }
    q->stream = call->stream;
    q->include_usage = call->include_usage;
    if (q->kind == HK_CHAT || q->kind == HK_WIRE)
        q->conv = srv_conv_take(call); /* NULL: misses are not placed in parts */
    q->tools_json = call->tools_json;
    call->tools_json = NULL;
    q->channels = (q->kind == HK_CHAT || q->kind == HK_WIRE) &&
                  cairn_api_reply_has_channels(&c->base.srv->api);
    q->n_choices = call->n_choices;
    q->per_prompt = call->n_prompts > 1 ? call->n_choices / call->n_prompts : call->n_choices;
    q->choices = calloc((size_t)q->n_choices, sizeof *q->choices);
    int rc = q->choices ? CAIRN_OK : CAIRN_ENOMEM;
    for (int i = 0; rc == CAIRN_OK && call->echo && i < q->n_choices; i++) {
        const cairn_api_prompt *p = &call->prompts[i / q->per_prompt];
        hchoice *ch = &q->choices[i];
        if (!(ch->echo = malloc(p->echo_len + 1)))
            rc = CAIRN_ENOMEM;
        else {
            memcpy(ch->echo, p->echo, p->echo_len);
            ch->echo_len = p->echo_len;
        }
    }
    if (rc == CAIRN_OK && q->wire && q->wire->decoded)
        rc = q->wire->decoded(c, q, call); /* it may submit the request itself, later */
    if (rc == CAIRN_OK && call->req)
        rc = submit_choices(c, q, call);
    if (!q->choices)
        q->n_choices = 0;
    if (rc != CAIRN_OK)
        fail_request(c, q, 503, rc == CAIRN_ENOMEM ? "out of memory"
                                                   : "the engine is not accepting requests",
                     NULL, NULL);
    decode_item_free(it);
}

static void handle_request(hconn *c, hreq_kind kind, cairn_api_op op, const char *id_prefix,
                           const http_wire *wire)
{
    hreq *q = calloc(1, sizeof *q);
    decode_item *it = q ? calloc(1, sizeof *it) : NULL;
    if (!it) {
        free(q);
        http_respond_error(c, 503, "out of memory", NULL, NULL);
        return;
    }
    q->kind = kind;
    q->wire = wire;
    q->created = (long long)time(NULL);
    snprintf(q->id, sizeof q->id, "%s%016llx", id_prefix,
             (unsigned long long)srv_next_seed(c->base.srv));
    q->decoding = true;
    /* the body goes to the worker: the next request reads into a new one */
    it->body = c->body.data;
    it->body_len = c->body.len;
    c->body = (cairn_strbuf){0};
    it->session_header = c->session_header;
    c->session_header = NULL;
    it->op = op;
    it->explain = kind == HK_EXPLAIN;
    it->seed = srv_next_seed(c->base.srv);
    it->w.conn_id = c->base.id;
    it->w.work = decode_work;
    it->w.done = decode_done;
    c->active = q;
    if (srv_work_queue(c->base.srv, &it->w) != CAIRN_OK) {
        decode_item_free(it);
        fail_request(c, q, 503, "out of memory", NULL, NULL);
    }
}

void http_handle_generation(hconn *c, cairn_api_op op)
{
    const bool chat = op == CAIRN_API_CHAT;
    handle_request(c, chat ? HK_CHAT : HK_COMPLETION, op, chat ? "chatcmpl-" : "cmpl-", NULL);
}

void http_handle_explain(hconn *c)
{
    handle_request(c, HK_EXPLAIN, CAIRN_API_CHAT, "explain-", NULL);
}

void http_handle_render(hconn *c, cairn_api_op op)
{
    handle_request(c, HK_RENDER, op, "render-", NULL);
}

void http_handle_wire(hconn *c, const http_wire *w)
{
    handle_request(c, HK_WIRE, w->op, w->id_prefix, w);
}

void http_request_fail(hconn *c, hreq *q, int status, const char *message, const char *param,
                       const char *code)
{
    fail_request(c, q, status, message, param, code);
}

void http_handle_models(hconn *c)
{
    json_t *o = json_pack("{s:s, s:[{s:s, s:s, s:I, s:s}]}", "object", "list", "data", "id",
                          c->base.srv->model_id, "object", "model", "created", (json_int_t)0,
                          "owned_by", "cairn");
    http_respond_json(c, 200, o);
    json_decref(o);
}
