/*
 * server/http/http.h — the OpenAI-compatible HTTP facade (docs/openai.md) as
 * the server drives it; internal to server/ (nothing else includes this).
 *
 * Shape of one request:
 *
 *   bytes ─http_parser─▶ url, headers, body (each under its cap)   conn.c
 *         ─route─▶ /health, /v1/models: answered at once
 *                  /metrics: cache.stats from the engine             metrics.c
 *                  /v1/chat/completions, /v1/completions,            openai.c
 *                  /tokenize, /detokenize (answered after decoding):
 *                      body ─(text worker: JSON + cairn_api_decode)─▶
 *                      n engine requests (a session key: one named-session
 *                      turn, SESSION_SYNC) ─▶ events ─▶ JSON or SSE chunks
 *                                                                    respond.c
 *                  /v1/messages (Anthropic's wire)                 anthropic.c
 *                  /v1/responses[/{id}] (OpenAI's Responses)       responses.c
 *                      the same life as a chat request (openai.c: decoding,
 *                      the engine request, holding back and reading tool
 *                      calls); an http_wire writes their own answers
 *
 * Rules:
 *  - Everything here runs on the loop thread but the decoding, which runs
 *    on the text workers (server/work.c) — JSON bodies can be megabytes, a
 *    prompt a long document.
 *  - One request at a time per connection (HTTP/1.1 without parallel
 *    pipelining): bytes that arrive while one runs are buffered (capped)
 *    and parsed once its response is complete.
 *  - A request's state belongs to its connection and goes with it: the
 *    engine keeps every session's history itself, so nothing of a request
 *    must outlive its client.
 *  - HEAD is answered wherever GET is, with GET's headers and no body;
 *    OPTIONS on any route answers a CORS preflight without credentials
 *    (a browser sends none). With --cors-origin, a request whose Origin is
 *    allowed gets Access-Control-Allow-Origin (that origin) on every reply,
 *    errors and streams included; without it no CORS header is ever sent.
 */
#ifndef CAIRN_SERVER_HTTP_H
#define CAIRN_SERVER_HTTP_H

#include "server/server_impl.h"

#include <http_parser.h>
#include <jansson.h>

#define HTTP_N_STATUS_SLOTS 16 /* distinct status codes counted for /metrics */

typedef struct srv_web srv_web; /* the page's activity record (web.c) */

struct srv_http {
    http_parser_settings settings;
    srv_web *web;
    struct {
        int code;
        uint64_t n;
    } status_counts[HTTP_N_STATUS_SLOTS];
};

typedef enum {
    HK_CHAT = 1, HK_COMPLETION, HK_METRICS, HK_WIRE, HK_WEB, HK_EXPLAIN,
    HK_RENDER /* POST /v1/.../render: the prompt's tokens, nothing run */
} hreq_kind;

typedef struct hreq hreq;
typedef struct hconn hconn;

/* A wire format besides OpenAI's chat and completions (HK_WIRE): a chat
 * request as far as openai.c is concerned (one choice), whose answer this
 * writes. Every hook runs on the loop thread; NULL hooks are skipped. */
typedef struct http_wire {
    cairn_api_op op;
    const char *id_prefix;   /* of the request's id ("msg_")                 */
    const char *call_prefix; /* of its tool calls' ids ("toolu_")            */
    /* Decoded, before the engine request goes: may look at the call, and
     * take call->req (NULL'ed) to submit it itself later (on_event). A
     * cairn error code answers 503. */
    int (*decoded)(hconn *c, hreq *q, cairn_api_call *call);
    /* Every event of the connection while q is active, first: true when it
     * was the wire's own (a session call it made); the node is not kept. */
    bool (*on_event)(hconn *c, hreq *q, srv_event *node);
    /* Streaming: text that is the reply's content (never a tool call). */
    void (*stream_text)(hconn *c, hreq *q, const char *text, size_t len);
    /* Streaming a reply in channels: a piece of its reasoning (NULL: the
     * wire leaves reasoning out). The model reasons first as a rule, but
     * may reason again after a piece of content. */
    void (*stream_reasoning)(hconn *c, hreq *q, const char *text, size_t len);
    /* The generation is over: its tool calls (an OpenAI tool_calls array,
     * borrowed) or NULL, its reasoning (a reply in channels) or NULL, the
     * content text. Returns true when it answered (taking q off c->active
     * first; openai.c frees q), false when it goes on (then it answers and
     * frees q itself). */
    bool (*finish)(hconn *c, hreq *q, const cairn_event *ev, json_t *calls,
                   const char *reasoning, const char *text, size_t len);
    /* Answer an error (q is already off c->active); NULL: OpenAI's shape. */
    void (*fail)(hconn *c, hreq *q, int status, const char *message, const char *param,
                 const char *code);
    void (*free)(hreq *q); /* what the wire keeps in q->wire_state           */
} http_wire;

/* One choice of a request (n > 1: one engine request each). */
typedef struct {
    uint32_t msgid;    /* its engine request's id on this connection        */
    bool over;
    bool role_sent;    /* streaming chat: the first delta said the role     */
    cairn_strbuf text; /* with tools or channels: everything generated so far */
    size_t text_sent;  /* of which already streamed as content (channels: the
                          bytes of content streamed)                         */
    bool holding;      /* a tool call may have started: stream no more      */
    cairn_chat_reply_cursor cursor; /* channels: how far the reply is read  */
    size_t reasoning_sent; /* channels: bytes of reasoning streamed          */
    json_t *answer;    /* not streaming: its choice object, once over       */
    int64_t prompt_tokens, cached_tokens, completion_tokens;
    int64_t reasoning_tokens; /* channels: tokens of the reply's reasoning   */
    cairn_cache_miss miss; /* why the rest of the prompt was not cached      */
    int64_t cached_by_tier[4]; /* device, host, disk, shared                */
    int64_t spec_steps, spec_tokens, spec_drafted, spec_accepted;
    char spec_method[64];  /* the methods that proposed ("" = none)        */
    char *echo;        /* completions with echo: the prompt's text (owned)  */
    size_t echo_len;
} hchoice;

/* The request a connection is answering. */
struct hreq {
    hreq_kind kind;
    char id[48];
    long long created;
    bool decoding;     /* its body is on a text worker                      */
    bool stream, include_usage;
    char *tools_json;  /* tool calls may come back: the tools (owned)       */
    bool channels;     /* chat replies in channels (gpt-oss's harmony): read
                          into reasoning, content and calls, tools or not    */
    int n_choices, n_over;
    int per_prompt;    /* choices of each prompt (n); the prompts are
                          n_choices / per_prompt                            */
    hchoice *choices;  /* [n_choices]                                       */
    bool head_sent;    /* streaming: the SSE response head is written        */
    bool failed;       /* answered with an error: the rest is dropped       */
    int parsing;       /* choices whose tool calls are on a text worker      */
    const http_wire *wire; /* HK_WIRE: who writes the answer                 */
    void *wire_state;  /* the wire's own (freed by wire->free)              */
    srv_conv *conv;    /* chat: the conversation, to place a cache miss in
                          it (server/explain.c); NULL otherwise             */
};

struct hconn {
    srv_conn base;
    http_parser parser;
    bool in_request;      /* a byte of a request has been seen              */
    bool message_done;
    bool header_is_value; /* the last header callback was a value           */
    size_t header_bytes;
    cairn_strbuf url, field, value, body;
    char *authorization, *session_header;
    char *origin;         /* Origin (a browser's page), or NULL             */
    char *host;           /* Host, or NULL (web.c: same-origin checks)      */
    char *cors_headers;   /* Access-Control-Request-Headers, or NULL        */
    bool cors_allowed;    /* origin is one --cors-origin lets read replies  */
    bool head_only;       /* a HEAD request: headers as for GET, no body    */
    char *api_key;        /* x-api-key (Anthropic's clients send it)        */
    bool expect_continue;
    int error_status;     /* set by a callback that refused the request    */
    const char *error_message;
    bool keep_alive;
    bool in_process;      /* inside conn_process: do not re-enter           */
    hreq *active;         /* the request being answered, or NULL           */
    uint32_t next_msgid;
};

/* conn.c */
/* Parse what is buffered while no request is running. */
void http_conn_process(hconn *c);

/* respond.c */
void http_count_status(srv_http *h, int code);
/* printf onto a growing string (a line of a response or of /metrics). */
void http_printf(cairn_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A whole response. extra_headers: complete lines or NULL. */
void http_respond(hconn *c, int status, const char *content_type, const char *body,
                  size_t body_len, const char *extra_headers);
void http_respond_json(hconn *c, int status, json_t *obj);
/* {"error": {message, type, param, code}}, as OpenAI words it. */
json_t *http_error_body(int status, const char *message, const char *param, const char *code);
void http_respond_error(hconn *c, int status, const char *message, const char *param,
                        const char *code);
/* The response is complete: wait for the next request, or close (conn.c).
 * Whoever answers a request takes it off c->active first (a next request
 * may be parsed at once) and frees it after. */
void http_response_finished(hconn *c);
void http_sse_head(hconn *c);
void http_sse_json(hconn *c, json_t *obj);
void http_sse_end(hconn *c);
/* An HTTP status for a cairn status code. */
int http_status_of(int cairn_code);
/* One `event: NAME` + `data: JSON` server-sent event (Anthropic's and the
 * Responses API's streams name their events). */
void http_sse_event(hconn *c, const char *name, json_t *obj);
/* The end of a stream without OpenAI's `data: [DONE]`. */
void http_sse_close(hconn *c);
/* The path of the request being answered (no query), and its length. */
const char *http_path(const hconn *c, size_t *len);

/* openai.c */
/* /v1/chat/completions, /v1/completions, and /tokenize, /detokenize (the
 * vocabulary ops: decoded on a worker too, answered without the engine). */
void http_handle_generation(hconn *c, cairn_api_op op);
void http_handle_models(hconn *c);
/* POST /v1/cache/explain: a /v1/chat/completions, /v1/completions or
 * /v1/messages body (told apart by `prompt` / `system`), answered with what
 * the cache holds of its prompt and why not more (cache_miss), without
 * running it or changing the cache's recency. */
void http_handle_explain(hconn *c);
/* POST /v1/chat/completions/render, /v1/completions/render,
 * /v1/messages/render: vLLM's render API — the request decoded exactly as
 * its route would decode it, answered with the prompt's token ids
 * (vLLM's GenerateRequest; a list of them for completions). Routers that
 * route on token ids (vllm-router's kv_aware) ask it before they choose a
 * replica. Nothing reaches the engine. */
void http_handle_render(hconn *c, cairn_api_op op);
bool http_on_event(hconn *c, srv_event *node);
void http_request_free(hreq *q);
/* A request of another wire format (its route), from decoding on. */
void http_handle_wire(hconn *c, const http_wire *w);
/* End q with an error (HTTP status, or an event once streaming), cancelling
 * what it still runs. Takes q. */
void http_request_fail(hconn *c, hreq *q, int status, const char *message, const char *param,
                       const char *code);

/* anthropic.c */
extern const http_wire http_anthropic_wire;
/* {"type": "error", "error": {type, message}}: Anthropic's error shape,
 * which every answer on /v1/messages uses. */
json_t *http_anthropic_error_body(int status, const char *message);
bool http_path_is_anthropic(const hconn *c);

/* responses.c */
extern const http_wire http_responses_wire;
/* GET / DELETE /v1/responses/{id}: true when the path was one (answered). */
bool http_responses_route(hconn *c);

/* metrics.c */
void http_handle_metrics(hconn *c);
/* The answer to a metrics request: Prometheus text from the engine's stats. */
void http_metrics_answer(hconn *c, const cairn_service_stats *st);

/* web.c: the browser page (docs/web.md) */
int srv_web_create(srv_web **out);
void srv_web_free(srv_web *w);
/* Is this request one of the page's files (served without a token)? */
bool http_web_is_page(const hconn *c);
/* `/`, the page's files and GET /web/state: true when the path was one
 * (answered); false when --no-web or another path. */
bool http_web_route(hconn *c);
/* An event of an HK_WEB request (its choice `index`). */
void http_web_on_event(hconn *c, hreq *q, int index, const cairn_event *ev);

#endif /* CAIRN_SERVER_HTTP_H */
