/*
 * server/http/responses.c — OpenAI's Responses API (docs/openai.md,
 * "Responses"): POST /v1/responses, GET and DELETE /v1/responses/{id}.
 *
 * The body is a chat request once api/ has translated it
 * (api/responses.c); its generation lives openai.c's life (decoding,
 * holding back and reading tool calls). What is the Responses API's is here:
 * the response object, its stream events, and stored responses.
 *
 * A stored response is an engine session: its history is the conversation
 * so far (the prompt and the reply, as tokens), its note the response
 * object as JSON. The id is "resp_" and the session's id, so the engine
 * keeps everything and this file keeps nothing between requests:
 *
 *   store, no previous:   session.open (persist with --cache-dir)
 *   previous_response_id: session.fork of the previous response's session
 *                         ──▶ session.generate (the new input's tokens)
 *                         ──▶ tool calls read ──▶ session note = the object
 *                         ──▶ answer (after the note is durable)
 *   store false:          a plain generation (or, continuing, a fork that
 *                         is closed once the answer is known)
 *   GET:    session.info ──▶ its note;  DELETE: session.info, session.close
 *
 * With --cache-dir the sessions are persisted (record and note durable
 * before the answer), so a chain survives a restart or a SIGKILL; without
 * it they live in the engine's memory until DELETE or the server stops.
 *
 * Every session made here is opened or forked as a stored response
 * (cairn_request.response): a client makes one per call and never closes
 * it, so the engine keeps them apart from the user's sessions — not
 * counted toward --max-sessions, at most --max-responses of them (the
 * least recently continued go first) and each for --responses-ttl (30
 * days, as OpenAI). One that has gone is answered as OpenAI answers: 404
 * with a message that says so (not_found below).
 *
 * Stream: response.created, response.in_progress, then per output item
 * response.output_item.added, (message) response.content_part.added,
 * response.output_text.delta..., response.output_text.done,
 * response.content_part.done, (function_call) response.function_call_
 * arguments.delta and .done, response.output_item.done; at last
 * response.completed (response.incomplete when max_output_tokens cut it).
 * Every event has a sequence_number.
 */
#include "server/http/http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum {
    RS_SESSION = 1, /* its session is being opened or forked               */
    RS_GENERATING,
    RS_STORING,     /* the object goes into the session's note            */
    RS_CLOSING,     /* store false: the fork it generated on goes         */
    RS_GET,         /* GET: the session's note                            */
    RS_DELETE_INFO, /* DELETE: is it a response?                          */
    RS_DELETE,
} rs_step;

typedef struct {
    rs_step step;
    uint32_t step_msgid;    /* the session call in flight (0: none)           */
    cairn_request *gen;     /* the generation, until its session is there     */
    bool has_session;       /* a session was made for it (to close on failure) */
    cairn_session_id session;
    bool store;
    char id[48];            /* resp_...                                       */
    char previous[48];      /* previous_response_id, when given               */
    json_t *echo;           /* the request's fields the object repeats        */
    json_t *response;       /* the finished object                            */
    int64_t seq;            /* streaming: the next sequence_number             */
    int n_items;            /* streaming: output items added                   */
    bool text_open;         /* streaming: the message item is open             */
    int text_index;         /* its output_index                                */
    char item_id[48];       /* the message item's id                           */
    cairn_strbuf streamed;  /* its text so far                                 */
    bool rs_open;           /* streaming: the reasoning item is open           */
    int rs_index;           /* its output_index                                */
    cairn_strbuf rs_streamed; /* its text so far                               */
} resp_state;

static resp_state *state_of(hreq *q) { return q->wire_state; }

static json_t *jstrn(const char *s, size_t n)
{
    json_t *v = json_stringn(s ? s : "", s ? n : 0);
    return v ? v : json_string("");
}

static void session_hex_id(char *out, size_t cap, const char *prefix, cairn_session_id id)
{
    char hex[33];
    cairn_session_id_to_hex(id, hex);
    snprintf(out, cap, "%s%s", prefix, hex);
}

/* A session call of this request, answered to on_event. */
static int session_call(hconn *c, resp_state *st, cairn_req_kind kind, cairn_session_id id,
                        rs_step step)
{
    cairn_request *r = cairn_request_new(kind);
    if (!r)
        return CAIRN_ENOMEM;
    r->session = id;
    r->persist = kind == CAIRN_REQ_SESSION_OPEN && c->base.srv->cfg.service.cache_dir;
    /* a stored response, not a user's session (also store false's fork: it
     * is closed once answered, and must not take a user's place meanwhile) */
    r->response = kind == CAIRN_REQ_SESSION_OPEN || kind == CAIRN_REQ_SESSION_FORK;
    r->id = st->step_msgid = ++c->next_msgid;
    st->step = step;
    return srv_submit(&c->base, r);
}

/* The response object: the request's echoed fields and these. */
static json_t *response_object(hconn *c, hreq *q, resp_state *st, const char *status,
                               json_t *output, json_t *usage, json_t *incomplete)
{
    json_t *o = st->echo ? json_deep_copy(st->echo) : json_object();
    json_t *add = json_pack(
        "{s:s, s:s, s:I, s:s, s:n, s:o, s:s, s:o, s:o, s:{s:n, s:n}, s:s, s:n}", "id", st->id,
        "object", "response", "created_at", (json_int_t)q->created, "status", status, "error",
        "incomplete_details", incomplete ? incomplete : json_null(), "model",
        c->base.srv->model_id, "output", output ? output : json_array(), "usage",
        usage ? usage : json_null(), "reasoning", "effort", "summary", "truncation", "disabled",
        "user");
    /* the request's reasoning effort, when it gave one, is in the echo */
    json_t *asked = st->echo ? json_object_get(st->echo, "reasoning") : NULL;
    if (add && asked)
        json_object_set(add, "reasoning", asked);
    if (!o || !add || json_object_update(o, add) != 0) {
        json_decref(o);
        o = NULL;
    }
    json_decref(add);
    return o;
}

/* One stream event: `type` and its sequence_number set, then sent. Takes obj. */
static void emit(hconn *c, resp_state *st, const char *type, json_t *obj)
{
    if (obj) {
        json_object_set_new(obj, "type", json_string(type));
        json_object_set_new(obj, "sequence_number", json_integer((json_int_t)st->seq++));
    }
    http_sse_event(c, type, obj);
    json_decref(obj);
}

static void emit_response(hconn *c, hreq *q, resp_state *st, const char *type, json_t *resp)
{
    emit(c, st, type, json_pack("{s:o}", "response",
                                resp ? resp : response_object(c, q, st, "in_progress", NULL,
                                                              NULL, NULL)));
}

/* Streaming: the head and the response's first two events. */
static void stream_open(hconn *c, hreq *q, resp_state *st)
{
    q->head_sent = true;
    http_sse_head(c);
    emit_response(c, q, st, "response.created", NULL);
    emit_response(c, q, st, "response.in_progress", NULL);
}

static json_t *text_part(const char *text, size_t len)
{
    return json_pack("{s:s, s:o, s:[], s:[]}", "type", "output_text", "text", jstrn(text, len),
                     "annotations", "logprobs");
}

static json_t *message_item(const resp_state *st, const char *status, json_t *content)
{
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", st->item_id, "type", "message", "status",
                     status, "role", "assistant", "content", content ? content : json_array());
}

/* A reply's reasoning (gpt-oss's analysis channel) as a reasoning item: the
 * text as reasoning_text content, as vLLM gives it for gpt-oss; there is no
 * summary (it would be another generation). */
static json_t *reasoning_part(const char *text, size_t len)
{
    return json_pack("{s:s, s:o}", "type", "reasoning_text", "text", jstrn(text, len));
}

static json_t *reasoning_item(const resp_state *st, const char *status, json_t *content)
{
    char id[48];
    snprintf(id, sizeof id, "rs_%s", st->id + 5);
    return json_pack("{s:s, s:s, s:s, s:[], s:o}", "id", id, "type", "reasoning", "status",
                     status, "summary", "content", content ? content : json_array());
}

static json_t *call_item(const resp_state *st, size_t i, json_t *call, bool with_args)
{
    char id[64];
    snprintf(id, sizeof id, "fc_%s_%zu", st->id + 5, i);
    json_t *fn = json_object_get(call, "function");
    return json_pack("{s:s, s:s, s:O, s:O, s:O, s:s}", "id", id, "type", "function_call",
                     "call_id", json_object_get(call, "id"), "name", json_object_get(fn, "name"),
                     "arguments", with_args ? json_object_get(fn, "arguments") : json_string(""),
                     "status", with_args ? "completed" : "in_progress");
}

/* ---- the answer ------------------------------------------------------------------------ */

/* A response that is not (or no longer) stored: 404 with OpenAI's message
 * (and, for previous_response_id, its code), and why one may have gone. */
static void not_found(hconn *c, hreq *q, const char *id, bool previous)
{
    char msg[400];
    snprintf(msg, sizeof msg, "%s with id '%s' not found. A stored response is kept until it "
             "is deleted or expires (cairn serve --responses-ttl, 30 days by default), and the "
             "least recently continued go first when more than --max-responses are stored.",
             previous ? "Previous response" : "Response", id);
    http_request_fail(c, q, 404, msg, previous ? "previous_response_id" : NULL,
                      previous ? "previous_response_not_found" : NULL);
}

/* Write the finished response (q taken off c->active first). */
static void answer(hconn *c, hreq *q, resp_state *st)
{
    c->active = NULL;
    if (!q->stream) {
        http_respond_json(c, 200, st->response);
        return;
    }
    const char *status = json_string_value(json_object_get(st->response, "status"));
    emit_response(c, q, st,
                  status && strcmp(status, "incomplete") == 0 ? "response.incomplete"
                                                              : "response.completed",
                  json_incref(st->response));
    http_sse_close(c);
}

static void fail(hconn *c, hreq *q, int status, const char *message, const char *param,
                 const char *code)
{
    resp_state *st = state_of(q);
    /* a response that will not be stored: its session goes */
    if (st && st->has_session) {
        st->has_session = false;
        cairn_request *r = cairn_request_new(CAIRN_REQ_SESSION_CLOSE);
        if (r) {
            r->session = st->session;
            r->id = ++c->next_msgid; /* nobody waits for its answer */
            srv_submit(&c->base, r);
        }
    }
    if (!q->head_sent) {
        http_respond_error(c, status, message, param, code);
        return;
    }
    json_t *o = json_pack("{s:o, s:s, s:o}", "code", code ? json_string(code) : json_null(),
                          "message", message ? message : "", "param",
                          param ? json_string(param) : json_null());
    if (st)
        emit(c, st, "error", o);
    else
        json_decref(o);
    http_sse_close(c);
}

/* ---- hooks ---------------------------------------------------------------------------------- */

static int on_decoded(hconn *c, hreq *q, cairn_api_call *call)
{
    resp_state *st = calloc(1, sizeof *st);
    if (!st)
        return CAIRN_ENOMEM;
    q->wire_state = st;
    st->store = call->store;
    st->echo = call->echo_json ? json_loads(call->echo_json, 0, NULL) : NULL;
    if (!st->echo)
        return CAIRN_ENOMEM;
    if (call->req->kind == CAIRN_REQ_SESSION_GENERATE) {
        /* first its session: a new one, or a fork of the one it continues */
        st->gen = call->req;
        call->req = NULL;
        cairn_session_id none = {0, 0};
        if (call->has_previous)
            session_hex_id(st->previous, sizeof st->previous, "resp_", call->previous);
        return call->has_previous
                   ? session_call(c, st, CAIRN_REQ_SESSION_FORK, call->previous, RS_SESSION)
                   : session_call(c, st, CAIRN_REQ_SESSION_OPEN, none, RS_SESSION);
    }
    /* not stored: an id that names no session */
    snprintf(st->id, sizeof st->id, "resp_%016llx%016llx",
             (unsigned long long)srv_next_seed(c->base.srv),
             (unsigned long long)srv_next_seed(c->base.srv));
    st->step = RS_GENERATING;
    if (q->stream)
        stream_open(c, q, st);
    return CAIRN_OK;
}

/* The session is there: the generation goes. */
static void session_ready(hconn *c, hreq *q, resp_state *st, cairn_session_id id)
{
    st->session = id;
    st->has_session = true;
    st->step = RS_GENERATING;
    st->step_msgid = 0;
    session_hex_id(st->id, sizeof st->id, "resp_", id);
    cairn_request *r = st->gen;
    st->gen = NULL;
    r->session = id;
    r->id = q->choices[0].msgid = ++c->next_msgid;
    r->gen.stream = q->stream;
    if (q->stream)
        stream_open(c, q, st);
    if (srv_submit(&c->base, r) != CAIRN_OK)
        http_request_fail(c, q, 503, "the engine is not accepting requests", NULL, NULL);
}

static bool on_event(hconn *c, hreq *q, srv_event *node)
{
    resp_state *st = state_of(q);
    const cairn_event *ev = &node->ev;
    if (!st || !st->step_msgid || ev->id != st->step_msgid)
        return false;
    st->step_msgid = 0;
    bool err = ev->kind == CAIRN_EV_ERROR;
    bool done = ev->kind == CAIRN_EV_DONE && ev->what == CAIRN_DONE_SESSION;
    if (!err && !done)
        return true;
    const char *msg = err && ev->message ? ev->message : "error";
    switch (st->step) {
    case RS_SESSION:
        if (done)
            session_ready(c, q, st, ev->session);
        else if (ev->code == CAIRN_ENOTFOUND)
            not_found(c, q, st->previous, true);
        else
            http_request_fail(c, q, http_status_of(ev->code), msg, NULL, NULL);
        return true;
    case RS_STORING:
        if (err) {
            http_request_fail(c, q, 500, "the response could not be stored", NULL, NULL);
            return true;
        }
        st->has_session = false; /* stored: it stays */
        break;
    case RS_CLOSING: st->has_session = false; break; /* answered either way */
    case RS_GET:
    case RS_DELETE_INFO:
        if (err && ev->code != CAIRN_ENOTFOUND)
            http_request_fail(c, q, http_status_of(ev->code), msg, NULL, NULL);
        else if (err || !ev->note)
            not_found(c, q, st->id, false);
        if (err || !ev->note)
            return true;
        if (st->step == RS_DELETE_INFO) {
            if (session_call(c, st, CAIRN_REQ_SESSION_CLOSE, st->session, RS_DELETE) != CAIRN_OK)
                http_request_fail(c, q, 503, "the engine is not accepting requests", NULL, NULL);
            return true;
        }
        st->response = json_loadb(ev->note, ev->note_len, 0, NULL);
        if (!st->response) {
            http_request_fail(c, q, 500, "the stored response cannot be read", NULL, NULL);
            return true;
        }
        break;
    case RS_DELETE:
        if (err) {
            http_request_fail(c, q, http_status_of(ev->code), msg, NULL, NULL);
            return true;
        }
        st->response = json_pack("{s:s, s:s, s:b}", "id", st->id, "object", "response",
                                 "deleted", 1);
        break;
    default: return true;
    }
    answer(c, q, st);
    http_request_free(q);
    return true;
}

static void on_stream_text(hconn *c, hreq *q, const char *text, size_t len)
{
    resp_state *st = state_of(q);
    if (!st->text_open) {
        st->text_open = true;
        st->text_index = st->n_items++;
        snprintf(st->item_id, sizeof st->item_id, "msg_%s", st->id + 5);
        emit(c, st, "response.output_item.added",
             json_pack("{s:i, s:o}", "output_index", st->text_index, "item",
                       message_item(st, "in_progress", NULL)));
        emit(c, st, "response.content_part.added",
             json_pack("{s:s, s:i, s:i, s:o}", "item_id", st->item_id, "output_index",
                       st->text_index, "content_index", 0, "part", text_part("", 0)));
    }
    cairn_strbuf_add(&st->streamed, text, len);
    emit(c, st, "response.output_text.delta",
         json_pack("{s:s, s:i, s:i, s:o, s:[]}", "item_id", st->item_id, "output_index",
                   st->text_index, "content_index", 0, "delta", jstrn(text, len), "logprobs"));
}

/* Streaming the reasoning: one reasoning item, opened by its first piece
 * and kept open to the end (a model that reasons again after some content
 * adds to it, as the finished object has all its reasoning in one item). */
static void on_stream_reasoning(hconn *c, hreq *q, const char *text, size_t len)
{
    resp_state *st = state_of(q);
    char id[48];
    snprintf(id, sizeof id, "rs_%s", st->id + 5);
    if (!st->rs_open) {
        st->rs_open = true;
        st->rs_index = st->n_items++;
        emit(c, st, "response.output_item.added",
             json_pack("{s:i, s:o}", "output_index", st->rs_index, "item",
                       reasoning_item(st, "in_progress", NULL)));
        emit(c, st, "response.content_part.added",
             json_pack("{s:s, s:i, s:i, s:o}", "item_id", id, "output_index", st->rs_index,
                       "content_index", 0, "part", reasoning_part("", 0)));
    }
    cairn_strbuf_add(&st->rs_streamed, text, len);
    emit(c, st, "response.reasoning_text.delta",
         json_pack("{s:s, s:i, s:i, s:o}", "item_id", id, "output_index", st->rs_index,
                   "content_index", 0, "delta", jstrn(text, len)));
}

/* Streaming: the open reasoning item's last events. */
static void stream_close_reasoning(hconn *c, resp_state *st)
{
    const char *t = st->rs_streamed.data ? st->rs_streamed.data : "";
    size_t n = st->rs_streamed.len;
    char id[48];
    snprintf(id, sizeof id, "rs_%s", st->id + 5);
    emit(c, st, "response.reasoning_text.done",
         json_pack("{s:s, s:i, s:i, s:o}", "item_id", id, "output_index", st->rs_index,
                   "content_index", 0, "text", jstrn(t, n)));
    emit(c, st, "response.content_part.done",
         json_pack("{s:s, s:i, s:i, s:o}", "item_id", id, "output_index", st->rs_index,
                   "content_index", 0, "part", reasoning_part(t, n)));
    emit(c, st, "response.output_item.done",
         json_pack("{s:i, s:o}", "output_index", st->rs_index, "item",
                   reasoning_item(st, "completed", json_pack("[o]", reasoning_part(t, n)))));
    st->rs_open = false;
}

/* Streaming: the open message item's last events. */
static void stream_close_text(hconn *c, resp_state *st)
{
    const char *t = st->streamed.data ? st->streamed.data : "";
    size_t n = st->streamed.len;
    emit(c, st, "response.output_text.done",
         json_pack("{s:s, s:i, s:i, s:o, s:[]}", "item_id", st->item_id, "output_index",
                   st->text_index, "content_index", 0, "text", jstrn(t, n), "logprobs"));
    emit(c, st, "response.content_part.done",
         json_pack("{s:s, s:i, s:i, s:o}", "item_id", st->item_id, "output_index",
                   st->text_index, "content_index", 0, "part", text_part(t, n)));
    emit(c, st, "response.output_item.done",
         json_pack("{s:i, s:o}", "output_index", st->text_index, "item",
                   message_item(st, "completed", json_pack("[o]", text_part(t, n)))));
    st->text_open = false;
}

static void stream_call(hconn *c, resp_state *st, size_t i, json_t *call)
{
    json_t *item = call_item(st, i, call, true);
    const char *id = json_string_value(json_object_get(item, "id"));
    json_t *args = json_object_get(item, "arguments");
    const int index = st->n_items++;
    emit(c, st, "response.output_item.added",
         json_pack("{s:i, s:o}", "output_index", index, "item", call_item(st, i, call, false)));
    emit(c, st, "response.function_call_arguments.delta",
         json_pack("{s:s, s:i, s:O}", "item_id", id ? id : "", "output_index", index, "delta",
                   args));
    emit(c, st, "response.function_call_arguments.done",
         json_pack("{s:s, s:i, s:O}", "item_id", id ? id : "", "output_index", index,
                   "arguments", args));
    emit(c, st, "response.output_item.done",
         json_pack("{s:i, s:o}", "output_index", index, "item", item));
}

static bool on_finish(hconn *c, hreq *q, const cairn_event *ev, json_t *calls,
                      const char *reasoning, const char *text, size_t len)
{
    resp_state *st = state_of(q);
    const bool cut = !calls && ev->finish_reason && strcmp(ev->finish_reason, "length") == 0;
    if (!st->item_id[0])
        snprintf(st->item_id, sizeof st->item_id, "msg_%s", st->id + 5);
    /* the items in the order the stream added them: the reasoning first,
     * unless content came before any of it */
    const bool text_first = q->stream && st->text_open && (!st->rs_open ||
                                                           st->text_index < st->rs_index);
    if (q->stream) {
        if (!st->text_open && !calls) /* as the object has it: one message */
            on_stream_text(c, q, "", 0);
        if (st->rs_open && !text_first)
            stream_close_reasoning(c, st);
        if (st->text_open)
            stream_close_text(c, st);
        if (st->rs_open)
            stream_close_reasoning(c, st);
    }
    json_t *output = json_array();
    json_t *thought = NULL;
    if (output && reasoning && reasoning[0]) /* all of it was streamed by now */
        thought = reasoning_item(st, "completed",
                                 json_pack("[o]", reasoning_part(reasoning, strlen(reasoning))));
    if (thought && !text_first)
        json_array_append_new(output, thought);
    if (output && (len > 0 || !calls))
        json_array_append_new(output,
                              message_item(st, "completed", json_pack("[o]", text_part(text, len))));
    if (thought && text_first)
        json_array_append_new(output, thought);
    size_t i;
    json_t *call;
    json_array_foreach(calls, i, call)
    {
        if (q->stream)
            stream_call(c, st, i, call);
        json_array_append_new(output, call_item(st, i, call, true));
    }
    json_t *usage = json_pack(
        "{s:I, s:{s:I}, s:I, s:{s:I}, s:I}", "input_tokens", (json_int_t)ev->prompt_tokens,
        "input_tokens_details", "cached_tokens", (json_int_t)ev->cached_tokens, "output_tokens",
        (json_int_t)ev->completion_tokens, "output_tokens_details", "reasoning_tokens",
        (json_int_t)q->choices[0].reasoning_tokens, /* counted by finish_choice */
        "total_tokens", (json_int_t)(ev->prompt_tokens + ev->completion_tokens));
    if (usage) /* a cairn extension: why the rest was not cached */
        json_object_set_new(json_object_get(usage, "input_tokens_details"), "cache_miss",
                            srv_miss_json(&c->base.srv->api, &ev->miss));
    st->response = response_object(c, q, st, cut ? "incomplete" : "completed", output, usage,
                                   cut ? json_pack("{s:s}", "reason", "max_output_tokens")
                                       : NULL);
    if (!st->response) {
        c->active = NULL;
        fail(c, q, 503, "out of memory", NULL, NULL);
        return true;
    }
    int rc = CAIRN_OK;
    if (st->has_session && st->store) {
        /* kept: the object is the session's note, durable before the answer */
        cairn_request *r = cairn_request_new(CAIRN_REQ_SESSION_NOTE);
        char *note = json_dumps(st->response, JSON_COMPACT);
        if (!r || !note) {
            cairn_request_free(r);
            free(note);
            rc = CAIRN_ENOMEM;
        } else {
            r->note = note;
            r->note_len = strlen(note);
            r->session = st->session;
            r->id = st->step_msgid = ++c->next_msgid;
            st->step = RS_STORING;
            rc = srv_submit(&c->base, r);
        }
    } else if (st->has_session) {
        rc = session_call(c, st, CAIRN_REQ_SESSION_CLOSE, st->session, RS_CLOSING);
    } else {
        answer(c, q, st);
        return true;
    }
    if (rc != CAIRN_OK) {
        c->active = NULL;
        fail(c, q, 503, "the response could not be stored", NULL, NULL);
        return true;
    }
    return false;
}

static void on_free(hreq *q)
{
    resp_state *st = state_of(q);
    if (!st)
        return;
    cairn_request_free(st->gen);
    json_decref(st->echo);
    json_decref(st->response);
    cairn_strbuf_free(&st->streamed);
    cairn_strbuf_free(&st->rs_streamed);
    free(st);
}

const http_wire http_responses_wire = {
    .op = CAIRN_API_RESPONSES,
    .id_prefix = "resp_",
    .call_prefix = "call_",
    .decoded = on_decoded,
    .on_event = on_event,
    .stream_text = on_stream_text,
    .stream_reasoning = on_stream_reasoning,
    .finish = on_finish,
    .fail = fail,
    .free = on_free,
};

/* ---- GET and DELETE /v1/responses/{id} ------------------------------------------------------- */

bool http_responses_route(hconn *c)
{
    static const char prefix[] = "/v1/responses/";
    size_t plen = sizeof prefix - 1, n;
    const char *path = http_path(c, &n);
    if (!(n > plen && memcmp(path, prefix, plen) == 0))
        return false;
    const bool get = c->parser.method == HTTP_GET || c->parser.method == HTTP_HEAD;
    if (!get && c->parser.method != HTTP_DELETE) {
        json_t *body = http_error_body(405, "method not allowed", NULL, NULL);
        char *t = body ? json_dumps(body, JSON_COMPACT) : NULL;
        http_respond(c, 405, "application/json", t ? t : "{}", t ? strlen(t) : 2,
                     "Allow: GET, HEAD, DELETE, OPTIONS\r\n");
        free(t);
        json_decref(body);
        return true;
    }
    const char *id = path + plen;
    size_t id_len = n - plen;
    cairn_session_id sid;
    if (id_len != 5 + 32 || memcmp(id, "resp_", 5) != 0 ||
        cairn_session_id_from_hex(id + 5, 32, &sid) != CAIRN_OK) {
        http_respond_error(c, 404, "no such response", NULL, NULL);
        return true;
    }
    hreq *q = calloc(1, sizeof *q);
    resp_state *st = q ? calloc(1, sizeof *st) : NULL;
    if (!st) {
        free(q);
        http_respond_error(c, 503, "out of memory", NULL, NULL);
        return true;
    }
    q->kind = HK_WIRE;
    q->wire = &http_responses_wire;
    q->wire_state = st;
    st->session = sid;
    session_hex_id(st->id, sizeof st->id, "resp_", sid);
    c->active = q;
    if (session_call(c, st, CAIRN_REQ_SESSION_INFO, sid,
                     get ? RS_GET : RS_DELETE_INFO) != CAIRN_OK)
        http_request_fail(c, q, 503, "the engine is not accepting requests", NULL, NULL);
    return true;
}
