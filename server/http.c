/*
 * protocol/http.c — the OpenAI-compatible HTTP facade (docs/openai.md):
 * HTTP/1.1 connections on the server's loop, parsed by libhttp-parser, with
 * JSON bodies parsed and built by jansson.
 *
 * Shape of one request:
 *   bytes -> http_parser (url, headers, body, each under its cap)
 *         -> route -> decode JSON into a prompt (chat template + tokenizer)
 *            and cairn_gen_params
 *         -> one or more engine requests (a session turn may first open or
 *            truncate its session) -> events -> JSON response or SSE chunks.
 *
 * Rules this file keeps (protocol.h, "Server threads and ownership"):
 *  - Everything runs on the loop thread; engine events arrive through the
 *    server's queue (cairn_http_on_event).
 *  - One request at a time per connection (HTTP/1.1 without pipelining in
 *    parallel): bytes that arrive while a request runs are buffered (capped)
 *    and parsed once its response is complete.
 *  - A request in flight (hreq) lives until the engine's final event for it,
 *    even when its connection has gone: a session's token mirror must learn
 *    what the engine appended (a cancelled turn still appends what it
 *    generated), or the next turn would be computed against a wrong history.
 *  - A connection's memory is freed only from the close callback of the last
 *    of its two handles (socket and timer).
 */
#include "server/http_impl.h"

#include <ctype.h>
#include <errno.h>
#include <http_parser.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define READ_CHUNK (64 * 1024)
#define LINGER_S 5.0        /* after a final error answer: wait this long for EOF */
#define MAX_STOP_BYTES 256  /* per stop string, as the msgpack protocol */
#define MAX_SESSION_KEY 256 /* bytes of a session_id / prompt_cache_key value */
#define N_STATUS_SLOTS 16   /* distinct status codes counted for /metrics */
#define MAX_CHOICES 64      /* most choices (`n`) one request may ask for */

/* ---- growing byte buffers ------------------------------------------------ */

typedef cairn_strbuf sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) { cairn_strbuf_add(b, s, n); }

static void sb_puts(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    sb_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static void sb_free(sbuf *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}

/* ---- structures ------------------------------------------------------------ */

/* A session_id / prompt_cache_key / X-Session-Id value mapped to a cairn
 * session, with a mirror of the session's token history as the engine holds
 * it (what lets a resent conversation be appended rather than recomputed). */
typedef struct skey {
    char *key;
    size_t key_len;
    uint64_t tenant;
    cairn_session_id sid;
    bool opened;   /* sid is a live engine session                       */
    bool busy;     /* a request is working on it                         */
    int32_t *tokens;
    size_t n, cap;
    uint64_t last_used;
    struct skey *next;
} skey;

typedef enum { HK_CHAT = 1, HK_COMPLETION, HK_METRICS } hreq_kind;
typedef enum { PH_OPEN = 1, PH_TRUNCATE, PH_GENERATE, PH_STATS } hreq_phase;

struct hconn;

/* One HTTP request that waits for the engine. */
typedef struct hreq {
    cairn_http *h;
    struct hconn *conn;   /* NULL once the connection has gone             */
    uint64_t client;
    uint32_t msgid;
    hreq_kind kind;
    hreq_phase ph;
    bool stream, include_usage, retried;
    skey *sess;
    int32_t *prompt;      /* the whole prompt (owned)                       */
    size_t n_prompt;
    size_t keep;          /* a session turn: tokens of the history reused   */
    cairn_gen_params gen; /* handed to the engine request that generates    */
    char id[48];
    long long created;
    bool tools_active;    /* tool calls may come back: parse them           */
    char *tools_json;     /* the tools rendered (JSON array), for parsing   */
    /* n > 1: this is choice `index` of a group of requests (one engine
     * request each) answered together; the group's first request, its
     * lead, holds the answer being built. A lone request leads itself. */
    struct hreq *lead;
    int index;
    bool over;            /* this choice has finished                       */
    int n_choices, n_over;/* lead: choices, and how many have finished      */
    bool failed;          /* lead: the group was answered with an error     */
    json_t *choices;      /* lead, not streaming: [n_choices] choice objects */
    int64_t prompt_tokens, cached_tokens, completion_tokens; /* lead: usage */
    /* streaming */
    bool head_sent;       /* lead: the SSE response head is written         */
    bool role_sent;
    sbuf text;            /* everything generated so far                    */
    size_t text_sent;     /* of which already streamed as content           */
    bool holding;         /* a tool call may have started: stream no more   */
    struct hreq *next;
} hreq;

typedef struct hconn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    cairn_http *h;
    uint64_t id;
    int open_handles;
    bool closing, lingering;
    http_parser parser;
    /* input not yet parsed: in[in_off .. in_len) */
    char *in;
    size_t in_len, in_off, in_cap;
    char rbuf[READ_CHUNK];
    /* the request being read */
    bool in_request;      /* a byte of a request has been seen              */
    bool message_done;
    bool header_is_value; /* the last header callback was a value           */
    size_t header_bytes;
    sbuf url, field, value, body;
    char *authorization, *session_header;
    bool expect_continue;
    int error_status;     /* set by a callback that refused the request    */
    const char *error_message;
    bool keep_alive;
    uint64_t tenant;
    bool in_process;      /* inside conn_process: do not re-enter           */
    hreq *active;
    uint32_t next_msgid;
    uv_shutdown_t shutdown_req;
    struct hconn *prev, *next;
} hconn;

typedef struct {
    uv_write_t req;
    char *data;
} write_op;

struct cairn_http {
    cairn_http_env env;
    cairn_http_config cfg;
    uv_tcp_t listener;
    bool listening;
    int port;
    char desc[160];
    cairn_service *svc;
    const cairn_vocab *vocab;
    int n_ctx;
    char model_id[256];
    bool stopping;
    hconn *conns;
    hreq *reqs;
    skey *keys;
    size_t n_keys;
    uint64_t key_clock;
    uint64_t internal_client; /* id for fire-and-forget requests (closing sessions) */
    http_parser_settings settings;
    struct {
        int code;
        uint64_t n;
    } status_counts[N_STATUS_SLOTS];
};

static void conn_process(hconn *c);

/* ---- counters -------------------------------------------------------------- */

static void count_status(cairn_http *h, int code)
{
    for (int i = 0; i < N_STATUS_SLOTS; i++) {
        if (h->status_counts[i].code == code || h->status_counts[i].code == 0) {
            h->status_counts[i].code = code;
            h->status_counts[i].n++;
            return;
        }
    }
}

/* ---- closing ----------------------------------------------------------------- */

static void conn_free(hconn *c)
{
    sb_free(&c->url);
    sb_free(&c->field);
    sb_free(&c->value);
    sb_free(&c->body);
    free(c->authorization);
    free(c->session_header);
    free(c->in);
    free(c);
}

static void on_handle_closed(uv_handle_t *hd)
{
    hconn *c = hd->data;
    if (--c->open_handles == 0)
        conn_free(c);
}

static void conn_close(hconn *c)
{
    if (c->closing)
        return;
    c->closing = true;
    cairn_http *h = c->h;
    if (c->prev)
        c->prev->next = c->next;
    else if (h->conns == c)
        h->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
    if (c->active) {
        /* The request (every choice of it) lives on until its final event;
         * only its output goes. */
        for (hreq *q = h->reqs; q; q = q->next)
            if (q->conn == c)
                q->conn = NULL;
        c->active = NULL;
        if (!h->stopping && h->svc) {
            cairn_request *r = cairn_request_new(CAIRN_REQ_CLIENT_GONE);
            if (r) {
                r->client = c->id;
                cairn_service_submit(h->svc, r);
            }
        }
    }
    cairn_log(CAIRN_LOG_DEBUG, "http client %llu: closed",
              (unsigned long long)(c->id & ~CAIRN_HTTP_CLIENT_BIT));
    uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

static void on_linger_timeout(uv_timer_t *t) { conn_close(t->data); }

static void on_shutdown(uv_shutdown_t *req, int status)
{
    (void)req;
    (void)status; /* EOF from the client, or the linger timer, closes it */
}

/* After the last answer: send FIN once it is written, and close on the
 * client's EOF or after LINGER_S. Closing at once could reset a connection
 * whose client is still sending, and a reset can destroy the answer. */
static void conn_linger(hconn *c)
{
    if (c->closing || c->lingering)
        return;
    c->lingering = true;
    if (uv_shutdown(&c->shutdown_req, (uv_stream_t *)&c->tcp, on_shutdown) != 0) {
        conn_close(c);
        return;
    }
    uv_timer_start(&c->timer, on_linger_timeout, (uint64_t)(LINGER_S * 1000), 0);
}

/* ---- writing ------------------------------------------------------------------ */

static void on_write(uv_write_t *req, int status)
{
    write_op *w = (write_op *)req;
    hconn *c = req->handle->data;
    free(w->data);
    free(w);
    if (status < 0 && status != UV_ECANCELED)
        conn_close(c);
}

/* Send bytes (copied). A client that does not read cannot make us hold more
 * than max_output_bytes for it. A failed write closes the connection at
 * once, which detaches its requests (their `conn` becomes NULL): so every
 * writer below takes NULL for a connection that has gone, and a caller
 * that writes several pieces re-reads q->conn for each. */
static void conn_write(hconn *c, const char *data, size_t len)
{
    if (!c || c->closing || c->lingering || len == 0)
        return;
    uv_stream_t *st = (uv_stream_t *)&c->tcp;
    size_t queued = uv_stream_get_write_queue_size(st);
    if (queued > 0 && queued + len > c->h->env.max_output_bytes) {
        cairn_log(CAIRN_LOG_WARN, "http client %llu: %zu bytes of output unread; disconnecting",
                  (unsigned long long)(c->id & ~CAIRN_HTTP_CLIENT_BIT), queued + len);
        conn_close(c);
        return;
    }
    uv_buf_t buf = uv_buf_init((char *)data, (unsigned)len);
    int n = queued == 0 ? uv_try_write(st, &buf, 1) : UV_EAGAIN;
    if (n == (int)len)
        return;
    if (n < 0 && n != UV_EAGAIN) {
        conn_close(c);
        return;
    }
    if (n < 0)
        n = 0;
    write_op *w = malloc(sizeof *w);
    char *copy = malloc(len - (size_t)n);
    if (!w || !copy) {
        free(w);
        free(copy);
        conn_close(c);
        return;
    }
    memcpy(copy, data + n, len - (size_t)n);
    w->data = copy;
    buf = uv_buf_init(copy, (unsigned)(len - (size_t)n));
    if (uv_write(&w->req, st, &buf, 1, on_write) != 0) {
        free(copy);
        free(w);
        conn_close(c);
    }
}

static const char *status_text(int code)
{
    switch (code) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Payload Too Large";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "Error";
    }
}

static void on_read_deadline(uv_timer_t *t);

/* The response is complete: wait for the next request, or close. */
static void response_finished(hconn *c)
{
    if (c->closing || c->lingering)
        return;
    if (!c->keep_alive) {
        conn_linger(c);
        return;
    }
    c->in_request = false;
    uv_timer_start(&c->timer, on_read_deadline, (uint64_t)(c->h->cfg.timeout_s * 1000), 0);
    if (!c->in_process)
        conn_process(c); /* a request may already be waiting in the buffer */
}

/* A whole response with a body. extra_headers: complete lines or NULL. */
static void respond(hconn *c, int status, const char *content_type, const char *body,
                    size_t body_len, const char *extra_headers)
{
    if (!c)
        return;
    count_status(c->h, status);
    sbuf out = {0};
    sb_printf(&out,
              "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: %s\r\n",
              status, status_text(status), content_type, body_len,
              c->keep_alive ? "keep-alive" : "close");
    if (extra_headers)
        sb_puts(&out, extra_headers);
    sb_puts(&out, "\r\n");
    sb_put(&out, body, body_len);
    if (out.oom) {
        sb_free(&out);
        conn_close(c);
        return;
    }
    conn_write(c, out.data, out.len);
    sb_free(&out);
    response_finished(c);
}

static void respond_json(hconn *c, int status, json_t *obj)
{
    char *text = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    if (!text) {
        static const char oom[] =
            "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
            "\"code\":null}}";
        respond(c, 500, "application/json", oom, sizeof oom - 1, NULL);
        return;
    }
    respond(c, status, "application/json", text, strlen(text), NULL);
    free(text);
}

/* {"error": {message, type, param, code}} as the OpenAI API words it. */
static json_t *error_body(int status, const char *message, const char *param, const char *code)
{
    const char *type = status == 401   ? "authentication_error"
                       : status >= 500 ? "server_error"
                       : status == 429 ? "rate_limit_error"
                                       : "invalid_request_error";
    if (status == 400 || status == 404 || status == 405 || status == 413 || status == 409 ||
        status == 408 || status == 431)
        type = "invalid_request_error";
    json_t *e = json_pack("{s:s, s:s, s:o, s:o}", "message", message ? message : "", "type",
                          type, "param", param ? json_string(param) : json_null(), "code",
                          code ? json_string(code) : json_null());
    return e ? json_pack("{s:o}", "error", e) : NULL;
}

static void respond_error(hconn *c, int status, const char *message, const char *param,
                          const char *code)
{
    json_t *body = error_body(status, message, param, code);
    if (status == 401) {
        /* the client's credentials are wrong: answer and close */
        c->keep_alive = false;
        char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
        const char *t = text ? text : "{}";
        respond(c, status, "application/json", t, strlen(t),
                "WWW-Authenticate: Bearer\r\n");
        free(text);
    } else {
        respond_json(c, status, body);
    }
    json_decref(body);
}

/* ---- server-sent events ---------------------------------------------------------- */

static void sse_head(hconn *c)
{
    if (!c)
        return;
    count_status(c->h, 200);
    static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                               "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n";
    sbuf out = {0};
    sb_puts(&out, head);
    sb_printf(&out, "Connection: %s\r\n\r\n", c->keep_alive ? "keep-alive" : "close");
    if (!out.oom)
        conn_write(c, out.data, out.len);
    sb_free(&out);
}

/* One `data: ...` event as one HTTP chunk. */
static void sse_data(hconn *c, const char *payload, size_t len)
{
    if (!c)
        return;
    sbuf out = {0};
    sb_printf(&out, "%zx\r\ndata: ", len + 8);
    sb_put(&out, payload, len);
    sb_puts(&out, "\n\n\r\n");
    if (out.oom)
        conn_close(c);
    else
        conn_write(c, out.data, out.len);
    sb_free(&out);
}

static void sse_json(hconn *c, json_t *obj)
{
    if (!c)
        return;
    char *text = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    if (!text) {
        conn_close(c);
        return;
    }
    sse_data(c, text, strlen(text));
    free(text);
}

static void sse_end(hconn *c)
{
    if (!c)
        return;
    sse_data(c, "[DONE]", 6);
    conn_write(c, "0\r\n\r\n", 5);
    response_finished(c);
}

/* ---- session keys ------------------------------------------------------------------ */

static skey *skey_find(cairn_http *h, const char *key, size_t len, uint64_t tenant)
{
    for (skey *k = h->keys; k; k = k->next)
        if (k->tenant == tenant && k->key_len == len && memcmp(k->key, key, len) == 0)
            return k;
    return NULL;
}

/* Close the engine session behind a key (nothing waits for the answer). */
static void skey_close_session(cairn_http *h, skey *k)
{
    if (!k->opened || !h->svc || h->stopping)
        return;
    cairn_request *r = cairn_request_new(CAIRN_REQ_SESSION_CLOSE);
    if (r) {
        r->client = h->internal_client;
        r->session = k->sid;
        r->tenant = k->tenant;
        cairn_service_submit(h->svc, r);
    }
    k->opened = false;
    k->n = 0;
}

static void skey_unlink_free(cairn_http *h, skey *k)
{
    for (skey **p = &h->keys; *p; p = &(*p)->next)
        if (*p == k) {
            *p = k->next;
            break;
        }
    h->n_keys--;
    free(k->key);
    free(k->tokens);
    free(k);
}

/* The entry for a key, created when new (evicting the least recently used
 * idle one when the map is full). NULL: out of memory, or every entry busy. */
static skey *skey_get(cairn_http *h, const char *key, size_t len, uint64_t tenant)
{
    skey *k = skey_find(h, key, len, tenant);
    if (k)
        return k;
    if (h->n_keys >= h->cfg.max_session_keys) {
        skey *lru = NULL;
        for (skey *x = h->keys; x; x = x->next)
            if (!x->busy && (!lru || x->last_used < lru->last_used))
                lru = x;
        if (!lru)
            return NULL;
        skey_close_session(h, lru);
        skey_unlink_free(h, lru);
    }
    k = calloc(1, sizeof *k);
    if (!k || !(k->key = malloc(len + 1))) {
        free(k);
        return NULL;
    }
    memcpy(k->key, key, len);
    k->key[len] = '\0';
    k->key_len = len;
    k->tenant = tenant;
    k->next = h->keys;
    h->keys = k;
    h->n_keys++;
    return k;
}

static int skey_set_tokens(skey *k, const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    size_t need = na + nb;
    if (need > k->cap) {
        int32_t *t = realloc(k->tokens, (need ? need : 1) * sizeof *t);
        if (!t)
            return CAIRN_ENOMEM;
        k->tokens = t;
        k->cap = need;
    }
    if (na && a != k->tokens)
        memmove(k->tokens, a, na * sizeof *a);
    if (nb)
        memcpy(k->tokens + na, b, nb * sizeof *b);
    k->n = need;
    return CAIRN_OK;
}

/* ---- requests in flight --------------------------------------------------------------- */

static void gen_clear(cairn_gen_params *g)
{
    for (int i = 0; i < g->n_stop; i++)
        free(g->stop[i]);
    g->n_stop = 0;
    if (g->grammar)
        cairn_grammar_free(g->grammar);
    g->grammar = NULL;
}

/* The session key is free again (before answering: a pipelined request of
 * the same conversation may start as soon as the answer is out). */
static void hreq_release_session(hreq *q)
{
    if (q->sess)
        q->sess->busy = false;
    q->sess = NULL;
}

static hreq *hreq_find(cairn_http *h, uint64_t client, uint64_t id)
{
    for (hreq *q = h->reqs; q; q = q->next)
        if (q->client == client && q->msgid == id)
            return q;
    return NULL;
}

/* The request is over (answered, or its connection gone and its final event
 * in). Frees it; the connection, if any, was already answered. */
static void hreq_finish(hreq *q)
{
    cairn_http *h = q->h;
    for (hreq **p = &h->reqs; *p; p = &(*p)->next)
        if (*p == q) {
            *p = q->next;
            break;
        }
    if (q->conn && q->conn->active == q)
        q->conn->active = NULL;
    hreq_release_session(q);
    gen_clear(&q->gen);
    json_decref(q->choices);
    free(q->tools_json);
    free(q->prompt);
    sb_free(&q->text);
    free(q);
}

/* q's choice is over. When it was the group's last, the lead answers (unless
 * the group failed or its connection has gone) and the group is freed. */
static void group_answer(hreq *lead);

static void group_choice_over(hreq *q)
{
    hreq *lead = q->lead;
    q->over = true;
    lead->n_over++;
    if (q != lead)
        hreq_finish(q);
    if (lead->n_over < lead->n_choices)
        return;
    if (lead->conn && !lead->failed) {
        lead->conn->active = NULL;
        group_answer(lead);
    }
    hreq_finish(lead);
}

/* Answer an error for q (HTTP status, or an SSE error event once streaming
 * has begun) and end it. The other choices of its group are cancelled and
 * give no output. */
static void hreq_fail_param(hreq *q, int status, const char *message, const char *param,
                            const char *code)
{
    hreq *lead = q->lead;
    hconn *c = q->conn;
    hreq_release_session(q);
    if (c && !lead->failed) {
        c->active = NULL;
        if (lead->head_sent) {
            json_t *body = error_body(status, message, param, code);
            sse_json(c, body);
            json_decref(body);
            sse_end(c);
        } else {
            respond_error(c, status, message, param, code);
        }
    }
    cairn_http *h = q->h;
    if (!lead->failed) {
        lead->failed = true;
        for (hreq *o = h->reqs; o; o = o->next) {
            if (o->lead != lead)
                continue;
            o->conn = NULL; /* nothing more is written for the group */
            if (o == q || o->over || o->ph != PH_GENERATE || h->stopping || !h->svc)
                continue;
            cairn_request *r = cairn_request_new(CAIRN_REQ_CANCEL);
            if (r) {
                r->client = o->client;
                r->target = o->msgid; /* its DONE ends it; the cancel's own
                                         answer (id 0) matches no request */
                cairn_service_submit(h->svc, r);
            }
        }
    }
    /* choices never submitted end with this one */
    for (bool more = true; more;) {
        more = false;
        for (hreq *o = h->reqs; o; o = o->next)
            if (o->lead == lead && o != q && !o->over && o->ph == 0) {
                o->over = true;
                lead->n_over++;
                if (o != lead)
                    hreq_finish(o);
                more = true;
                break;
            }
    }
    group_choice_over(q);
}

static void hreq_fail(hreq *q, int status, const char *message, const char *code)
{
    hreq_fail_param(q, status, message, NULL, code);
}

static int status_of(int cairn_code)
{
    switch (cairn_code) {
    case CAIRN_EINVAL:
    case CAIRN_EFORMAT:
    case CAIRN_ERANGE: return 400;
    case CAIRN_ENOTFOUND: return 404;
    case CAIRN_EBUSY: return 409;
    case CAIRN_EFULL:
    case CAIRN_ENOMEM: return 503;
    case CAIRN_EUNSUPPORTED: return 400;
    case CAIRN_EPERM: return 401;
    default: return 500;
    }
}

/* Submit the next engine request of q's chain:
 *   no session key        GENERATE(prompt)
 *   key not opened yet    SESSION_OPEN, then ...
 *   history not a prefix  SESSION_TRUNCATE(common prefix), then ...
 *   otherwise             SESSION_GENERATE(the new suffix)
 * Returns false when it failed (q was answered and freed). */
static bool hreq_submit_next(hreq *q)
{
    cairn_http *h = q->h;
    skey *k = q->sess;
    cairn_req_kind kind;
    if (!k) {
        kind = CAIRN_REQ_GENERATE;
        q->ph = PH_GENERATE;
        q->keep = 0;
    } else if (!k->opened) {
        kind = CAIRN_REQ_SESSION_OPEN;
        q->ph = PH_OPEN;
    } else {
        size_t common = 0, lim = k->n < q->n_prompt ? k->n : q->n_prompt;
        while (common < lim && k->tokens[common] == q->prompt[common])
            common++;
        /* the last prompt token is computed again for its logits anyway, but
         * a session that IS the prompt gives a turn nothing to append */
        q->keep = common;
        if (common < k->n) {
            kind = CAIRN_REQ_SESSION_TRUNCATE;
            q->ph = PH_TRUNCATE;
        } else {
            kind = CAIRN_REQ_SESSION_GENERATE;
            q->ph = PH_GENERATE;
        }
    }
    cairn_request *r = cairn_request_new(kind);
    if (!r) {
        hreq_fail(q, 503, "out of memory", NULL);
        return false;
    }
    r->client = q->client;
    r->id = q->msgid;
    r->tenant = k ? k->tenant : q->conn ? q->conn->tenant : 0;
    if (k && k->opened)
        r->session = k->sid;
    if (kind == CAIRN_REQ_SESSION_TRUNCATE)
        r->n_keep = (int64_t)q->keep;
    if (kind == CAIRN_REQ_GENERATE || kind == CAIRN_REQ_SESSION_GENERATE) {
        size_t n = q->n_prompt - q->keep;
        r->tokens = malloc((n ? n : 1) * sizeof *r->tokens);
        if (!r->tokens) {
            cairn_request_free(r);
            hreq_fail(q, 503, "out of memory", NULL);
            return false;
        }
        if (n)
            memcpy(r->tokens, q->prompt + q->keep, n * sizeof *r->tokens);
        r->n_tokens = n;
        r->gen = q->gen; /* stop strings and grammar move to the request */
        memset(&q->gen, 0, sizeof q->gen);
        r->gen.stream = q->stream;
    }
    int rc = cairn_service_submit(h->svc, r);
    if (rc != CAIRN_OK) {
        hreq_fail(q, 503, "the engine is not accepting requests", NULL);
        return false;
    }
    return true;
}

/* ---- building responses --------------------------------------------------------------- */

static json_t *jstr(const char *s, size_t n)
{
    json_t *v = json_stringn(s ? s : "", s ? n : 0);
    return v ? v : json_string(""); /* invalid UTF-8 cannot come from the engine */
}

static const char *finish_of(const cairn_event *ev)
{
    const char *f = ev->finish_reason;
    return f && strcmp(f, "length") == 0 ? "length" : "stop";
}

/* A chunk's frame: {id, object, created, model, choices: [], (usage: null)} */
static json_t *chunk_frame(const hreq *q)
{
    cairn_http *h = q->h;
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:[]}", "id", q->id, "object",
                          q->kind == HK_CHAT ? "chat.completion.chunk" : "text_completion",
                          "created", (json_int_t)q->created, "model", h->model_id, "choices");
    if (o && q->include_usage)
        json_object_set_new(o, "usage", json_null());
    return o;
}

/* ---- logprobs ---- */

/* JSON has no -inf: OpenAI reports -9999 for "impossible". */
static double finite_logprob(float lp) { return lp > -9999.0f ? (double)lp : -9999.0; }

/* {token, logprob, bytes} of one token: the text of a token may be part of
 * a UTF-8 character, which `bytes` carries exactly (token is "" then). */
static json_t *token_entry(const cairn_http *h, int32_t tok, float logprob)
{
    char piece[300];
    size_t n = 0;
    if (cairn_token_to_piece(h->vocab, tok, true, piece, sizeof piece, &n) != CAIRN_OK)
        n = 0;
    json_t *bytes = json_array();
    for (size_t i = 0; i < n && bytes; i++)
        json_array_append_new(bytes, json_integer((unsigned char)piece[i]));
    return json_pack("{s:o, s:f, s:o}", "token", jstr(piece, n), "logprob",
                     finite_logprob(logprob), "bytes", bytes ? bytes : json_null());
}

/* chat: {"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]} for
 * the event's tokens; NULL when it carries no logprobs. */
static json_t *chat_logprobs(const cairn_http *h, const cairn_event *ev)
{
    if (!ev->logprobs)
        return NULL;
    size_t per = 1 + (size_t)ev->n_top;
    json_t *content = json_array();
    for (size_t i = 0; i < ev->n_tokens && content; i++) {
        const cairn_token_logprob *lp = ev->logprobs + i * per;
        json_t *entry = token_entry(h, ev->tokens[i], lp[0].logprob);
        json_t *top = json_array();
        for (int k = 1; k <= ev->n_top && top; k++)
            if (lp[k].token >= 0)
                json_array_append_new(top, token_entry(h, lp[k].token, lp[k].logprob));
        if (entry)
            json_object_set_new(entry, "top_logprobs", top ? top : json_array());
        json_array_append_new(content, entry);
    }
    return json_pack("{s:o}", "content", content ? content : json_array());
}

/* completions: {tokens, token_logprobs, top_logprobs, text_offset}. */
static json_t *completion_logprobs(const cairn_http *h, const cairn_event *ev, size_t offset)
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
        if (cairn_token_to_piece(h->vocab, ev->tokens[i], true, piece, sizeof piece, &n))
            n = 0;
        json_array_append_new(tokens, jstr(piece, n));
        json_array_append_new(lps, json_real(finite_logprob(lp[0].logprob)));
        json_array_append_new(offsets, json_integer((json_int_t)offset));
        offset += n;
        if (ev->n_top > 0) {
            json_t *alt = json_object();
            for (int k = 1; k <= ev->n_top; k++) {
                size_t m = 0;
                if (lp[k].token < 0 ||
                    cairn_token_to_piece(h->vocab, lp[k].token, true, piece, sizeof piece - 1,
                                         &m) != CAIRN_OK)
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

/* A chat chunk with one choice whose delta is `delta` (taken); logprobs
 * (taken) may be NULL. */
/* One chunk holding `choice` (taken; NULL when building it failed). */
static void send_choice_chunk(hreq *q, json_t *choice)
{
    json_t *o = chunk_frame(q);
    if (o && choice)
        json_array_append_new(json_object_get(o, "choices"), choice);
    else
        json_decref(choice);
    sse_json(q->conn, o);
    json_decref(o);
}

static void send_chat_delta_lp(hreq *q, json_t *delta, json_t *logprobs, const char *finish)
{
    send_choice_chunk(q, json_pack("{s:i, s:o, s:o, s:o}", "index", q->index, "delta", delta,
                                   "logprobs", logprobs ? logprobs : json_null(), "finish_reason",
                                   finish ? json_string(finish) : json_null()));
}

static void send_chat_delta(hreq *q, json_t *delta, const char *finish)
{
    send_chat_delta_lp(q, delta, NULL, finish);
}

static void send_completion_delta_lp(hreq *q, const char *text, size_t len, json_t *logprobs,
                                     const char *finish)
{
    send_choice_chunk(q, json_pack("{s:o, s:i, s:o, s:o}", "text", jstr(text, len), "index",
                                   q->index, "logprobs", logprobs ? logprobs : json_null(),
                                   "finish_reason", finish ? json_string(finish) : json_null()));
}

static void send_completion_delta(hreq *q, const char *text, size_t len, const char *finish)
{
    send_completion_delta_lp(q, text, len, NULL, finish);
}

static void stream_begin(hreq *q)
{
    if (!q->lead->head_sent) {
        q->lead->head_sent = true;
        sse_head(q->conn);
    }
    if (q->kind == HK_CHAT && !q->role_sent) {
        q->role_sent = true;
        send_chat_delta(q, json_pack("{s:s, s:s}", "role", "assistant", "content", ""), NULL);
    }
}

static void stream_content(hreq *q, const char *text, size_t len)
{
    if (len == 0)
        return;
    if (q->kind == HK_CHAT)
        send_chat_delta(q, json_pack("{s:o}", "content", jstr(text, len)), NULL);
    else
        send_completion_delta(q, text, len, NULL);
}

/* Text that may open a tool call in the formats chat templates use. A
 * stream holds its content back from the first place one of these could
 * begin, so a tool call never leaks out as content. */
static const char *const tool_openers[] = {"<tool_call>", "<|python_tag|>", "[TOOL_CALLS]",
                                           "<function=", "<|tool_call_begin|>"};

/* Where held-back text starts: the first full opener, or a tail that is the
 * beginning of one, or (JSON-style tool calls) the start when the text
 * begins with '{' or '['. */
static size_t tool_hold_from(const char *t, size_t len, bool *certain)
{
    *certain = false;
    size_t first_ws = 0;
    while (first_ws < len && isspace((unsigned char)t[first_ws]))
        first_ws++;
    if (first_ws < len && (t[first_ws] == '{' || t[first_ws] == '[')) {
        *certain = true;
        return 0;
    }
    size_t best = len;
    for (size_t i = 0; i < sizeof tool_openers / sizeof tool_openers[0]; i++) {
        const char *op = tool_openers[i];
        size_t ol = strlen(op);
        const char *hit = len >= ol ? memmem(t, len, op, ol) : NULL;
        if (hit && (size_t)(hit - t) < best) {
            best = (size_t)(hit - t);
            *certain = true;
        }
        for (size_t k = ol - 1; k > 0; k--)
            if (k <= len && memcmp(t + len - k, op, k) == 0) {
                if (len - k < best)
                    best = len - k;
                break;
            }
    }
    return best;
}

static void on_delta(hreq *q, const cairn_event *ev)
{
    if (!q->conn || !q->stream)
        return;
    if (!q->tools_active) {
        if (ev->text_len == 0 && !(ev->logprobs && ev->n_tokens))
            return;
        stream_begin(q);
        if (!ev->logprobs) {
            stream_content(q, ev->text, ev->text_len);
        } else if (q->kind == HK_CHAT) {
            send_chat_delta_lp(q, json_pack("{s:o}", "content", jstr(ev->text, ev->text_len)),
                               chat_logprobs(q->h, ev), NULL);
        } else {
            send_completion_delta_lp(q, ev->text, ev->text_len,
                                     completion_logprobs(q->h, ev, q->text_sent), NULL);
        }
        q->text_sent += ev->text_len;
        return;
    }
    sb_put(&q->text, ev->text, ev->text_len);
    if (q->holding || q->text.oom)
        return;
    bool certain;
    size_t upto = tool_hold_from(q->text.data ? q->text.data : "", q->text.len, &certain);
    q->holding = certain;
    /* never cut a UTF-8 character */
    while (upto > q->text_sent && upto < q->text.len &&
           ((unsigned char)q->text.data[upto] & 0xC0) == 0x80)
        upto--;
    if (upto > q->text_sent) {
        stream_begin(q);
        stream_content(q, q->text.data + q->text_sent, upto - q->text_sent);
        q->text_sent = upto;
    }
}

/* Tool calls parsed out of a finished chat text: a JSON array in OpenAI's
 * message.tool_calls shape (NULL when there are none), and the content left
 * (*content: malloc'ed, or NULL for all of `text`). */
static json_t *parse_tool_calls(hreq *q, const char *text, size_t len, char **content)
{
    *content = NULL;
    const cairn_chat_template *t = cairn_service_chat_template(q->h->svc);
    /* ids unique across turns: call_<request>_<n> */
    char prefix[64];
    const char *tail = strchr(q->id, '-');
    snprintf(prefix, sizeof prefix, "call_%s_", tail ? tail + 1 : q->id);
    char *calls_json = NULL;
    if (!t || cairn_chat_parse_tool_calls(t, text, len, q->tools_json, prefix, &calls_json,
                                          content) != CAIRN_OK)
        return NULL;
    json_t *calls = json_loads(calls_json, 0, NULL);
    free(calls_json);
    if (!json_is_array(calls) || json_array_size(calls) == 0) {
        json_decref(calls);
        free(*content);
        *content = NULL;
        return NULL;
    }
    return calls;
}

static void on_generation_done(hreq *q, const cairn_event *ev)
{
    hconn *c = q->conn;
    skey *k = q->sess;
    if (k) {
        /* The engine's history is now the whole prompt + what it generated
         * (a cancelled turn included). */
        if (skey_set_tokens(k, q->prompt, q->n_prompt, ev->tokens, ev->n_tokens) != CAIRN_OK)
            skey_close_session(q->h, k);
        hreq_release_session(q);
    }
    hreq *lead = q->lead;
    if (q->index == 0) {
        lead->prompt_tokens = ev->prompt_tokens;
        lead->cached_tokens = ev->cached_tokens;
    }
    lead->completion_tokens += ev->completion_tokens;
    if (!c) {
        group_choice_over(q);
        return;
    }
    const char *finish = finish_of(ev);
    json_t *tool_calls = NULL;
    char *content = NULL;
    const char *text = ev->text;
    size_t text_len = ev->text_len;
    if (q->kind == HK_CHAT && q->tools_active) {
        tool_calls = parse_tool_calls(q, ev->text, ev->text_len, &content);
        if (tool_calls) {
            finish = "tool_calls";
            text = content ? content : "";
            text_len = content ? strlen(content) : 0;
        }
    }
    if (q->stream) {
        stream_begin(q);
        if (q->tools_active) {
            /* what was held back: the rest of the content, then the calls */
            const char *all = q->text.data ? q->text.data : "";
            if (!tool_calls) {
                stream_content(q, all + q->text_sent, q->text.len - q->text_sent);
            } else if (text_len > q->text_sent && memcmp(text, all, q->text_sent) == 0) {
                stream_content(q, text + q->text_sent, text_len - q->text_sent);
            }
            size_t i;
            json_t *call;
            json_array_foreach(tool_calls, i, call)
            {
                json_t *fn = json_object_get(call, "function");
                json_t *head = json_pack(
                    "{s:[{s:I, s:O, s:s, s:{s:O, s:s}}]}", "tool_calls", "index", (json_int_t)i,
                    "id", json_object_get(call, "id"), "type", "function", "function", "name",
                    json_object_get(fn, "name"), "arguments", "");
                send_chat_delta(q, head, NULL);
                json_t *args = json_pack("{s:[{s:I, s:{s:O}}]}", "tool_calls", "index",
                                         (json_int_t)i, "function", "arguments",
                                         json_object_get(fn, "arguments"));
                send_chat_delta(q, args, NULL);
            }
        }
        if (q->kind == HK_CHAT)
            send_chat_delta(q, json_object(), finish);
        else
            send_completion_delta(q, "", 0, finish);
    } else {
        json_t *choice;
        if (q->kind == HK_CHAT) {
            json_t *msg = json_pack("{s:s, s:o}", "role", "assistant", "content",
                                    tool_calls && text_len == 0 ? json_null()
                                                                : jstr(text, text_len));
            if (msg && tool_calls)
                json_object_set(msg, "tool_calls", tool_calls);
            json_t *lp = chat_logprobs(q->h, ev);
            choice = json_pack("{s:i, s:o, s:o, s:s}", "index", q->index, "message", msg,
                               "logprobs", lp ? lp : json_null(), "finish_reason", finish);
        } else {
            json_t *lp = completion_logprobs(q->h, ev, 0);
            choice = json_pack("{s:o, s:i, s:o, s:s}", "text", jstr(text, text_len), "index",
                               q->index, "logprobs", lp ? lp : json_null(), "finish_reason",
                               finish);
        }
        /* kept in index order until the group answers */
        if (!lead->choices)
            lead->choices = json_array();
        while (lead->choices && json_array_size(lead->choices) <= (size_t)q->index)
            json_array_append_new(lead->choices, json_null());
        if (!lead->choices || !choice ||
            json_array_set_new(lead->choices, (size_t)q->index, choice) != 0) {
            json_decref(tool_calls);
            free(content);
            hreq_fail(q, 503, "out of memory", NULL);
            return;
        }
    }
    json_decref(tool_calls);
    free(content);
    group_choice_over(q);
}

/* Every choice of the group is in: the usage chunk and the end of the
 * stream, or the whole response. */
static void group_answer(hreq *lead)
{
    hconn *c = lead->conn;
    json_t *usage = json_pack(
        "{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)lead->prompt_tokens,
        "completion_tokens", (json_int_t)lead->completion_tokens, "total_tokens",
        (json_int_t)(lead->prompt_tokens + lead->completion_tokens), "prompt_tokens_details",
        "cached_tokens", (json_int_t)lead->cached_tokens);
    if (lead->stream) {
        if (lead->include_usage) {
            json_t *o = chunk_frame(lead);
            if (o)
                json_object_set(o, "usage", usage);
            sse_json(c, o);
            json_decref(o);
        }
        sse_end(c);
    } else {
        json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:O, s:O}", "id", lead->id, "object",
                              lead->kind == HK_CHAT ? "chat.completion" : "text_completion",
                              "created", (json_int_t)lead->created, "model", lead->h->model_id,
                              "choices", lead->choices, "usage", usage);
        if (o)
            respond_json(c, 200, o);
        else
            respond_error(c, 503, "out of memory", NULL, NULL);
        json_decref(o);
    }
    json_decref(usage);
}

/* ---- /metrics ------------------------------------------------------------------------- */

static void metric_head(sbuf *b, const char *name, const char *type, const char *help)
{
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void metric_u64(sbuf *b, const char *name, const char *type, const char *help,
                       uint64_t v)
{
    metric_head(b, name, type, help);
    sb_printf(b, "%s %llu\n", name, (unsigned long long)v);
}

static const char *const tier_names[3] = {"device", "host", "disk"};

static void metric_tiers(sbuf *b, const char *name, const char *type, const char *help,
                         const uint64_t v[3])
{
    metric_head(b, name, type, help);
    for (int t = 0; t < 3; t++)
        sb_printf(b, "%s{tier=\"%s\"} %llu\n", name, tier_names[t], (unsigned long long)v[t]);
}

static void metric_histogram(sbuf *b, const char *name, const char *help,
                             const cairn_latency_histogram *hg)
{
    metric_head(b, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i < CAIRN_LATENCY_BUCKETS; i++) {
        cum += hg->counts[i];
        sb_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, cairn_latency_bounds[i],
                  (unsigned long long)cum);
    }
    cum += hg->counts[CAIRN_LATENCY_BUCKETS];
    sb_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    sb_printf(b, "%s_sum %.9g\n", name, hg->sum_s);
    sb_printf(b, "%s_count %llu\n", name, (unsigned long long)hg->count);
}

static void render_metrics(cairn_http *h, const cairn_service_stats *st, sbuf *b)
{
    metric_u64(b, "cairn_requests_running", "gauge",
               "Generation requests running (or fetching their prefix) now.", st->running);
    metric_u64(b, "cairn_requests_waiting", "gauge", "Generation requests waiting to run.",
               st->waiting);
    metric_u64(b, "cairn_requests_total", "counter", "Generation requests admitted.",
               st->queries);
    metric_u64(b, "cairn_requests_paused_total", "counter",
               "Requests paused for lack of KV pages.", st->paused);
    metric_u64(b, "cairn_prompt_tokens_total", "counter",
               "Prompt tokens of admitted requests (prefix-cache query tokens).",
               st->prompt_tokens);
    metric_u64(b, "cairn_generation_tokens_total", "counter", "Tokens generated.",
               st->generated_tokens);
    metric_u64(b, "cairn_prefix_cache_queries_total", "counter",
               "Prompt tokens looked up in the prefix cache.", st->prompt_tokens);
    metric_u64(b, "cairn_prefix_cache_hits_total", "counter",
               "Prompt tokens served from the prefix cache (not computed).", st->cached_tokens);
    metric_tiers(b, "cairn_prefix_cache_hit_tokens_total", "counter",
                 "Prompt tokens served from the prefix cache, by the tier they were in.",
                 st->cached_tokens_by_tier);
    uint64_t v[3];
    for (int t = 0; t < 3; t++)
        v[t] = st->tiers[t].hit_tokens;
    metric_tiers(b, "cairn_kv_tier_lookup_hit_tokens_total", "counter",
                 "Tokens of prefix lookups that found their pages in this tier.", v);
    for (int t = 0; t < 3; t++)
        v[t] = st->tiers[t].miss_tokens;
    metric_tiers(b, "cairn_kv_tier_lookup_miss_tokens_total", "counter",
                 "Tokens of prefix lookups that reached this tier and missed.", v);
    metric_tiers(b, "cairn_kv_tree_pages", "gauge",
                 "KV pages of the prefix tree, by the tier they are in.", st->pages);
    for (int t = 0; t < 3; t++)
        v[t] = st->tiers[t].pages;
    metric_tiers(b, "cairn_kv_pages_used", "gauge", "KV pages held by each tier.", v);
    for (int t = 0; t < 3; t++)
        v[t] = st->tiers[t].bytes;
    metric_tiers(b, "cairn_kv_bytes_used", "gauge", "Bytes of KV pages held by each tier.", v);
    metric_u64(b, "cairn_kv_device_pages_total", "gauge", "Tier-0 KV pages in the pool.",
               st->device_pages_total);
    metric_u64(b, "cairn_kv_device_pages_free", "gauge", "Tier-0 KV pages free now.",
               st->device_pages_free);
    metric_u64(b, "cairn_kv_evicted_pages_total", "counter", "Pages moved out of tier 0.",
               st->evicted_pages);
    metric_u64(b, "cairn_sessions", "gauge", "Open sessions.", st->sessions);
    metric_histogram(b, "cairn_time_to_first_token_seconds",
                     "From a request's submission to its first sampled token.", &st->ttft);
    metric_histogram(b, "cairn_inter_token_latency_seconds",
                     "Between consecutive tokens of a request.", &st->inter_token);
    metric_head(b, "cairn_http_responses_total", "counter",
                "HTTP responses sent by the OpenAI facade, by status code.");
    for (int i = 0; i < N_STATUS_SLOTS && h->status_counts[i].code; i++)
        sb_printf(b, "cairn_http_responses_total{code=\"%d\"} %llu\n", h->status_counts[i].code,
                  (unsigned long long)h->status_counts[i].n);
}

/* ---- events ---------------------------------------------------------------------------- */

void cairn_http_on_event(cairn_http *h, const cairn_event *ev)
{
    hreq *q = hreq_find(h, ev->client, ev->id);
    if (!q)
        return; /* a fire-and-forget request, or one already over */
    skey *k = q->sess;
    if (ev->kind == CAIRN_EV_ERROR) {
        const char *msg = ev->message ? ev->message : "error";
        if (k && ev->code == CAIRN_ENOTFOUND && !q->retried &&
            (q->ph == PH_TRUNCATE || q->ph == PH_GENERATE)) {
            /* the engine no longer knows the session: start it again */
            q->retried = true;
            k->opened = false;
            k->n = 0;
            if (q->conn)
                hreq_submit_next(q);
            else
                hreq_finish(q);
            return;
        }
        if (k && q->ph == PH_GENERATE && ev->code != CAIRN_EBUSY && ev->code != CAIRN_ERANGE &&
            ev->code != CAIRN_EINVAL)
            skey_close_session(h, k); /* its history is unknown now */
        hreq_fail(q, status_of(ev->code), msg,
                  ev->code == CAIRN_ERANGE ? "context_length_exceeded" : NULL);
        return;
    }
    switch (q->ph) {
    case PH_STATS:
        if (ev->kind == CAIRN_EV_DONE && ev->what == CAIRN_DONE_STATS) {
            hconn *c = q->conn;
            if (c) {
                c->active = NULL;
                sbuf b = {0};
                render_metrics(h, &ev->stats, &b);
                if (b.oom)
                    respond_error(c, 503, "out of memory", NULL, NULL);
                else
                    respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", b.data, b.len,
                            NULL);
                sb_free(&b);
            }
            hreq_finish(q);
        }
        return;
    case PH_OPEN:
    case PH_TRUNCATE:
        if (ev->kind != CAIRN_EV_DONE || ev->what != CAIRN_DONE_SESSION)
            return;
        if (q->ph == PH_OPEN) {
            k->sid = ev->session;
            k->opened = true;
            k->n = 0;
        } else {
            k->n = q->keep < k->n ? q->keep : k->n;
        }
        if (q->conn)
            hreq_submit_next(q);
        else
            hreq_finish(q);
        return;
    case PH_GENERATE:
        if (ev->kind == CAIRN_EV_DELTA)
            on_delta(q, ev);
        else if (ev->kind == CAIRN_EV_DONE && ev->what == CAIRN_DONE_GENERATION)
            on_generation_done(q, ev);
        return;
    }
}

/* ---- decoding requests ------------------------------------------------------------------ */

typedef struct {
    int status;
    char message[300];
    const char *param;
    const char *code;
} herr;

static int bad(herr *e, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(herr *e, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    e->status = 400;
    e->param = param;
    return -1;
}

/* A field that is absent or JSON null counts as absent. */
static json_t *field(json_t *root, const char *name)
{
    json_t *v = json_object_get(root, name);
    return json_is_null(v) ? NULL : v;
}

static int get_number(json_t *root, const char *name, double lo, double hi, float *out, herr *e)
{
    json_t *v = field(root, name);
    if (!v)
        return 0;
    double d = json_number_value(v);
    if (!json_is_number(v) || !(d >= lo && d <= hi))
        return bad(e, name, "'%s' must be a number in [%g, %g]", name, lo, hi);
    *out = (float)d;
    return 0;
}

static int get_bool(json_t *root, const char *name, bool *out, herr *e)
{
    json_t *v = field(root, name);
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return bad(e, name, "'%s' must be a boolean", name);
    *out = json_is_true(v);
    return 0;
}

static uint64_t next_seed(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The sampling fields shared by both generation routes. OpenAI's defaults
 * (temperature 1, top_p 1, no top-k or min-p) unless the request sets
 * cairn's extensions top_k / min_p / repeat_penalty. */
static int decode_sampling(cairn_http *h, json_t *root, bool chat, hreq *q, herr *e)
{
    cairn_gen_params *g = &q->gen;
    g->sampling = cairn_sampling_defaults();
    cairn_sampling_params *sp = &g->sampling;
    sp->temperature = 1;
    sp->top_p = 1;
    sp->top_k = 0;
    sp->min_p = 0;
    g->max_tokens = chat ? h->n_ctx : 16; /* chat: until the context ends */

    const char *mt_name = chat && field(root, "max_completion_tokens") ? "max_completion_tokens"
                                                                       : "max_tokens";
    json_t *mt = field(root, mt_name);
    if (mt) {
        if (!json_is_integer(mt) || json_integer_value(mt) < 0)
            return bad(e, mt_name, "'%s' must be a non-negative integer", mt_name);
        if (json_integer_value(mt) > h->n_ctx) {
            bad(e, mt_name, "'%s' exceeds the context size (%d)", mt_name, h->n_ctx);
            e->code = "context_length_exceeded";
            return -1;
        }
        g->max_tokens = (int)json_integer_value(mt);
    }
    float top_k = 0;
    bool has_top_k = field(root, "top_k") != NULL;
    if (get_number(root, "temperature", 0, 2, &sp->temperature, e) ||
        get_number(root, "top_p", 0, 1, &sp->top_p, e) ||
        get_number(root, "presence_penalty", -2, 2, &sp->presence_penalty, e) ||
        get_number(root, "frequency_penalty", -2, 2, &sp->frequency_penalty, e) ||
        get_number(root, "min_p", 0, 1, &sp->min_p, e) ||
        get_number(root, "repeat_penalty", 1e-3, 100, &sp->repeat_penalty, e) ||
        get_number(root, "top_k", 0, 1e9, &top_k, e) || get_bool(root, "stream", &q->stream, e))
        return -1;
    if (!(sp->top_p > 0))
        return bad(e, "top_p", "'top_p' must be in (0, 1]");
    if (has_top_k) {
        if (top_k != (float)(int)top_k)
            return bad(e, "top_k", "'top_k' must be an integer");
        sp->top_k = (int)top_k;
    }
    json_t *seed = field(root, "seed");
    if (seed) {
        if (!json_is_integer(seed))
            return bad(e, "seed", "'seed' must be an integer");
        sp->seed = (uint64_t)json_integer_value(seed);
    } else {
        sp->seed = next_seed(h->env.seed_state);
    }
    json_t *best_of = field(root, "best_of");
    if (best_of && (!json_is_integer(best_of) || json_integer_value(best_of) != 1))
        return bad(e, "best_of", "only best_of = 1 is supported");
    /* chat: logprobs (bool) + top_logprobs (0..20); completions: logprobs
     * (0..20 alternatives; 0 = only the chosen tokens') */
    json_t *lp = field(root, "logprobs");
    json_t *tlp = chat ? field(root, "top_logprobs") : lp;
    if (lp && (chat ? !json_is_boolean(lp) : !json_is_integer(lp)))
        return bad(e, "logprobs", chat ? "'logprobs' must be a boolean"
                                       : "'logprobs' must be an integer in [0, 20]");
    g->logprobs = chat ? json_is_true(lp) : lp != NULL;
    if (tlp) {
        if (!json_is_integer(tlp) || json_integer_value(tlp) < 0 ||
            json_integer_value(tlp) > 20)
            return bad(e, chat ? "top_logprobs" : "logprobs",
                       "'%s' must be an integer in [0, 20]", chat ? "top_logprobs" : "logprobs");
        if (!g->logprobs && json_integer_value(tlp) > 0)
            return bad(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        sp->n_logprobs = (int)json_integer_value(tlp);
    }
    /* logit_bias: {"<token id>": bias in [-100, 100]} */
    json_t *bias = field(root, "logit_bias");
    if (bias) {
        if (!json_is_object(bias))
            return bad(e, "logit_bias", "'logit_bias' must be an object of token ids to biases");
        if (json_object_size(bias) > CAIRN_MAX_LOGIT_BIAS)
            return bad(e, "logit_bias", "'logit_bias' has more than %d entries",
                       CAIRN_MAX_LOGIT_BIAS);
        const int n_vocab = cairn_vocab_n_tokens(h->vocab);
        const char *key;
        json_t *val;
        json_object_foreach(bias, key, val)
        {
            char *end;
            errno = 0;
            long id = strtol(key, &end, 10);
            if (!*key || *end || errno || id < 0 || id >= n_vocab)
                return bad(e, "logit_bias", "'logit_bias' key '%.32s' is not a token id in "
                                            "[0, %d)", key, n_vocab);
            if (!json_is_number(val) || !(json_number_value(val) >= -100) ||
                !(json_number_value(val) <= 100))
                return bad(e, "logit_bias", "'logit_bias'[\"%s\"] must be a number in "
                                            "[-100, 100]", key);
            sp->logit_bias[sp->n_logit_bias].token = (int32_t)id;
            sp->logit_bias[sp->n_logit_bias].bias = (float)json_number_value(val);
            sp->n_logit_bias++;
        }
    }
    json_t *stop = field(root, "stop");
    if (stop) {
        size_t count = json_is_string(stop) ? 1 : json_is_array(stop) ? json_array_size(stop) : 0;
        if (!json_is_string(stop) && !json_is_array(stop))
            return bad(e, "stop", "'stop' must be a string or an array of strings");
        if (count > CAIRN_MAX_STOP)
            return bad(e, "stop", "at most %d stop strings", CAIRN_MAX_STOP);
        for (size_t i = 0; i < count; i++) {
            json_t *s = json_is_string(stop) ? stop : json_array_get(stop, i);
            if (!json_is_string(s) || json_string_length(s) == 0)
                return bad(e, "stop", "'stop' must hold non-empty strings");
            if (json_string_length(s) > MAX_STOP_BYTES)
                return bad(e, "stop", "a stop string is longer than %d bytes", MAX_STOP_BYTES);
            if (strlen(json_string_value(s)) != json_string_length(s))
                return bad(e, "stop", "a stop string holds a NUL character");
            if (!(g->stop[g->n_stop] = strdup(json_string_value(s)))) {
                e->status = 503;
                snprintf(e->message, sizeof e->message, "out of memory");
                return -1;
            }
            g->n_stop++;
        }
    }
    json_t *so = field(root, "stream_options");
    if (so) {
        if (!json_is_object(so))
            return bad(e, "stream_options", "'stream_options' must be an object");
        if (get_bool(so, "include_usage", &q->include_usage, e))
            return -1;
        if (!q->stream)
            q->include_usage = false;
    }
    return 0;
}

/* Tokenize into at most n_ctx tokens (a too-long prompt is a 400 with
 * OpenAI's context_length_exceeded code). */
static int tokenize_prompt(cairn_http *h, const char *text, size_t len, int flags, hreq *q,
                           herr *e)
{
    size_t limit = (size_t)h->n_ctx;
    /* a token covers at least one byte, plus BOS/EOS markers */
    size_t cap = len + 4 < limit + 1 ? len + 4 : limit + 1;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) {
        e->status = 503;
        snprintf(e->message, sizeof e->message, "out of memory");
        return -1;
    }
    size_t n = 0;
    int rc = cairn_tokenize(h->vocab, text, len, flags, ids, cap, &n);
    if (rc == CAIRN_ERANGE || (rc == CAIRN_OK && n > limit)) {
        free(ids);
        bad(e, "messages", "the prompt has more than the context's %zu tokens", limit);
        e->code = "context_length_exceeded";
        return -1;
    }
    if (rc != CAIRN_OK) {
        free(ids);
        return bad(e, NULL, "cannot tokenize the prompt: %s", cairn_strerror(rc));
    }
    /* A template that writes BOS itself, tokenized with BOS added too. */
    int32_t bos = cairn_vocab_bos(h->vocab);
    if (n >= 2 && bos >= 0 && ids[0] == bos && ids[1] == bos) {
        memmove(ids, ids + 1, (n - 1) * sizeof *ids);
        n--;
    }
    if (n == 0) {
        free(ids);
        return bad(e, NULL, "the prompt is empty");
    }
    q->prompt = ids;
    q->n_prompt = n;
    return 0;
}

/* Strings the messages point to, freed together. */
typedef struct {
    char **v;
    size_t n, cap;
} strlist;

static char *keep_str(strlist *l, char *s)
{
    if (!s)
        return NULL;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        char **v = realloc(l->v, cap * sizeof *v);
        if (!v) {
            free(s);
            return NULL;
        }
        l->v = v;
        l->cap = cap;
    }
    return l->v[l->n++] = s;
}

static void strlist_free(strlist *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
}

static int oom(herr *e)
{
    e->status = 503;
    snprintf(e->message, sizeof e->message, "out of memory");
    return -1;
}

/* A message's content: a string, or an array of {type: "text", text} parts
 * (joined), or null. *out stays NULL for null. */
static int message_content(json_t *m, size_t i, strlist *keep, const char **out, herr *e)
{
    *out = NULL;
    json_t *content = field(m, "content");
    if (!content)
        return 0;
    if (json_is_string(content)) {
        if (strlen(json_string_value(content)) != json_string_length(content))
            return bad(e, "messages", "messages[%zu].content holds a NUL character", i);
        *out = json_string_value(content);
        return 0;
    }
    if (!json_is_array(content))
        return bad(e, "messages", "messages[%zu].content must be a string or an array of parts",
                   i);
    sbuf joined = {0};
    size_t k;
    json_t *part;
    json_array_foreach(content, k, part)
    {
        json_t *type = json_object_get(part, "type");
        json_t *text = json_object_get(part, "text");
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0) {
            sb_free(&joined);
            return bad(e, "messages",
                       "messages[%zu].content[%zu]: only text parts are supported", i, k);
        }
        if (!json_is_string(text) || strlen(json_string_value(text)) != json_string_length(text)) {
            sb_free(&joined);
            return bad(e, "messages", "messages[%zu].content[%zu].text must be a string", i, k);
        }
        sb_put(&joined, json_string_value(text), json_string_length(text));
    }
    if (joined.oom)
        return oom(e);
    *out = keep_str(keep, joined.data ? joined.data : strdup(""));
    return *out ? 0 : oom(e);
}

static bool role_valid(const char *r)
{
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        if (strcmp(r, roles[i]) == 0)
            return true;
    return false;
}

/* Compile `schema_text` (JSON Schema text, taken and freed; NULL: any JSON
 * object) into q->gen.grammar; a refusal is a 400 on `param`. */
static int compile_grammar(hreq *q, char *schema_text, const char *param, const char *what,
                           herr *e)
{
    char msg[200] = "";
    int rc = cairn_grammar_from_json_schema(schema_text, schema_text ? strlen(schema_text) : 0,
                                            &q->gen.grammar, msg, sizeof msg);
    free(schema_text);
    if (rc == CAIRN_OK)
        return 0;
    q->gen.grammar = NULL;
    if (rc == CAIRN_ENOMEM)
        return oom(e);
    return bad(e, param, "%s: %s", what, msg[0] ? msg : cairn_strerror(rc));
}

/* tool_choice "required" or a named function: the reply is constrained,
 * like response_format, to a call of one of `tools` (see
 * cairn_chat_tool_call_schema); the reply parser reads it back as calls.
 * `several`: an array of calls is allowed too. */
static int force_tool_call(hreq *q, const char *tools_json, bool several, herr *e)
{
    if (q->gen.grammar)
        return bad(e, "tool_choice", "a required or named 'tool_choice' cannot be combined with "
                                     "a JSON 'response_format'");
    char *schema = NULL;
    int rc = cairn_chat_tool_call_schema(cairn_service_chat_template(q->h->svc), tools_json,
                                         several, &schema);
    if (rc == CAIRN_ENOMEM)
        return oom(e);
    if (rc != CAIRN_OK)
        return bad(e, "tools", "the tools cannot be forced: %s", cairn_strerror(rc));
    return compile_grammar(q, schema, "tools", "the tools cannot be forced", e);
}

/* tools and tool_choice -> the tools JSON to render (NULL: none); a required
 * or named choice forces the call. */
static int decode_tools(json_t *root, strlist *keep, hreq *q, const char **tools_json, herr *e)
{
    *tools_json = NULL;
    json_t *tools = field(root, "tools"), *choice = field(root, "tool_choice");
    char *tools_text = tools ? json_dumps(tools, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    char *choice_text = choice ? json_dumps(choice, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    if ((tools && !tools_text) || (choice && !choice_text)) {
        free(tools_text);
        free(choice_text);
        return oom(e);
    }
    cairn_chat_tool_mode mode;
    const char *which = "tools";
    char msg[200] = "";
    int rc = cairn_chat_tools_select(tools_text, choice_text, &q->tools_json, &mode, &which, msg,
                                     sizeof msg);
    free(tools_text);
    free(choice_text);
    if (rc == CAIRN_ENOMEM)
        return oom(e);
    if (rc != CAIRN_OK)
        return bad(e, which, "%s", msg);
    if (mode == CAIRN_TOOLS_OFF)
        return 0;
    if (!(*tools_json = keep_str(keep, strdup(q->tools_json))))
        return oom(e);
    if (mode == CAIRN_TOOLS_REQUIRED || mode == CAIRN_TOOLS_NAMED) {
        /* "required" may answer several calls at once unless the client
         * said parallel_tool_calls: false; a named choice is one call */
        json_t *parallel = field(root, "parallel_tool_calls");
        if (parallel && !json_is_boolean(parallel))
            return bad(e, "parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
        return force_tool_call(q, q->tools_json,
                               mode == CAIRN_TOOLS_REQUIRED && !json_is_false(parallel), e);
    }
    return 0;
}

static int decode_response_format(json_t *root, hreq *q, herr *e)
{
    json_t *rf = field(root, "response_format");
    if (!rf)
        return 0;
    json_t *type = json_object_get(rf, "type");
    if (!json_is_object(rf) || !json_is_string(type))
        return bad(e, "response_format", "'response_format' must be {type: ...}");
    const char *t = json_string_value(type);
    if (strcmp(t, "text") == 0)
        return 0;
    char *schema_text = NULL;
    if (strcmp(t, "json_schema") == 0) {
        json_t *js = json_object_get(rf, "json_schema");
        json_t *schema = json_object_get(js, "schema");
        if (!json_is_object(js))
            return bad(e, "response_format", "'response_format'.json_schema must be an object");
        if (schema && !json_is_object(schema) && !json_is_boolean(schema))
            return bad(e, "response_format",
                       "'response_format'.json_schema.schema must be an object");
        if (schema && !(schema_text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY)))
            return oom(e);
    } else if (strcmp(t, "json_object") != 0) {
        return bad(e, "response_format",
                   "'response_format'.type must be text, json_object or json_schema");
    }
    return compile_grammar(q, schema_text, "response_format", "invalid JSON schema", e);
}

/* /v1/chat/completions: messages -> chat template -> tokens. */
static int decode_chat(cairn_http *h, json_t *root, hreq *q, herr *e)
{
    json_t *messages = field(root, "messages");
    if (!json_is_array(messages) || json_array_size(messages) == 0)
        return bad(e, "messages", "'messages' must be a non-empty array");
    const cairn_chat_template *tmpl = cairn_service_chat_template(h->svc);
    if (!tmpl) {
        e->status = 400;
        snprintf(e->message, sizeof e->message, "this model has no chat template");
        return -1;
    }
    size_t n = json_array_size(messages);
    cairn_chat_message *msgs = calloc(n, sizeof *msgs);
    strlist keep = {0};
    if (!msgs)
        return oom(e);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        json_t *m = json_array_get(messages, i);
        json_t *role = json_object_get(m, "role");
        if (!json_is_object(m) || !json_is_string(role) || !role_valid(json_string_value(role))) {
            rc = bad(e, "messages",
                     "messages[%zu].role must be system, developer, user, assistant or tool", i);
            break;
        }
        const char *r = json_string_value(role);
        /* the templates know "system"; "developer" is OpenAI's new name for it */
        msgs[i].role = strcmp(r, "developer") == 0 ? "system" : r;
        if ((rc = message_content(m, i, &keep, &msgs[i].content, e)) != 0)
            break;
        json_t *calls = field(m, "tool_calls");
        if (calls) {
            if (strcmp(r, "assistant") != 0 || !json_is_array(calls)) {
                rc = bad(e, "messages", "messages[%zu].tool_calls: only an assistant message "
                                        "may carry an array of tool calls", i);
                break;
            }
            if (!(msgs[i].tool_calls_json = keep_str(&keep, json_dumps(calls, JSON_COMPACT)))) {
                rc = oom(e);
                break;
            }
        }
        if (!msgs[i].content && !(strcmp(r, "assistant") == 0 && calls)) {
            rc = bad(e, "messages", "messages[%zu].content is required", i);
            break;
        }
        json_t *tcid = field(m, "tool_call_id"), *name = field(m, "name");
        if ((tcid && !json_is_string(tcid)) || (name && !json_is_string(name))) {
            rc = bad(e, "messages", "messages[%zu]: tool_call_id and name must be strings", i);
            break;
        }
        msgs[i].tool_call_id = tcid ? json_string_value(tcid) : NULL;
        msgs[i].name = name ? json_string_value(name) : NULL;
    }
    const char *tools_json = NULL;
    if (rc == 0)
        rc = decode_tools(root, &keep, q, &tools_json, e);
    q->tools_active = tools_json != NULL;
    if (rc == 0) {
        /* Only the template's own markers are parsed as special tokens:
         * message text can never forge a turn. */
        int flags = CAIRN_CHAT_GENERATION_PROMPT |
                    (cairn_vocab_add_bos(h->vocab) ? CAIRN_CHAT_ADD_BOS : 0);
        int frc = cairn_chat_tokenize(tmpl, h->vocab, msgs, n, tools_json, flags, &q->prompt,
                                      &q->n_prompt);
        if (frc == CAIRN_ENOMEM) {
            rc = oom(e);
        } else if (frc != CAIRN_OK) {
            rc = bad(e, "messages", "the messages cannot be rendered with the model's chat "
                                    "template: %s", cairn_strerror(frc));
        } else if (q->n_prompt > (size_t)h->n_ctx) {
            rc = bad(e, "messages", "the prompt has %zu tokens, more than the context's %d",
                     q->n_prompt, h->n_ctx);
            e->code = "context_length_exceeded";
        } else if (q->n_prompt == 0) {
            rc = bad(e, "messages", "the prompt is empty");
        }
    }
    free(msgs);
    strlist_free(&keep);
    return rc;
}

/* /v1/completions: a prompt string (or [string], or token ids). */
static int decode_completion(cairn_http *h, json_t *root, hreq *q, herr *e)
{
    json_t *p = field(root, "prompt");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
        p = json_array_get(p, 0);
    if (json_is_string(p)) {
        if (strlen(json_string_value(p)) != json_string_length(p))
            return bad(e, "prompt", "'prompt' holds a NUL character");
        int flags = cairn_vocab_add_bos(h->vocab) ? CAIRN_TOK_ADD_BOS : 0;
        return tokenize_prompt(h, json_string_value(p), json_string_length(p), flags, q, e);
    }
    if (json_is_array(p) && json_array_size(p) > 0 && json_is_integer(json_array_get(p, 0))) {
        size_t n = json_array_size(p);
        if (n > (size_t)h->n_ctx) {
            bad(e, "prompt", "the prompt has more than the context's %d tokens", h->n_ctx);
            e->code = "context_length_exceeded";
            return -1;
        }
        if (!(q->prompt = malloc(n * sizeof *q->prompt)))
            return oom(e);
        int n_vocab = cairn_vocab_n_tokens(h->vocab);
        for (size_t i = 0; i < n; i++) {
            json_t *t = json_array_get(p, i);
            if (!json_is_integer(t) || json_integer_value(t) < 0 ||
                json_integer_value(t) >= n_vocab)
                return bad(e, "prompt", "prompt[%zu] must be a token id in [0, %d)", i, n_vocab);
            q->prompt[i] = (int32_t)json_integer_value(t);
        }
        q->n_prompt = n;
        return 0;
    }
    return bad(e, "prompt", "'prompt' must be a string (one prompt per request) or an array "
                            "of token ids");
}

/* session_id, prompt_cache_key or X-Session-Id -> the session entry. */
static int decode_session(cairn_http *h, hconn *c, json_t *root, hreq *q, herr *e)
{
    const char *names[] = {"session_id", "prompt_cache_key"};
    const char *key = NULL;
    size_t len = 0;
    for (int i = 0; i < 2 && !key; i++) {
        json_t *v = field(root, names[i]);
        if (!v)
            continue;
        if (!json_is_string(v) || json_string_length(v) == 0 ||
            json_string_length(v) > MAX_SESSION_KEY)
            return bad(e, names[i], "'%s' must be a string of 1 to %d bytes", names[i],
                       MAX_SESSION_KEY);
        key = json_string_value(v);
        len = json_string_length(v);
    }
    if (!key && c->session_header) {
        key = c->session_header;
        len = strlen(key);
        if (len == 0 || len > MAX_SESSION_KEY)
            return bad(e, NULL, "X-Session-Id must be 1 to %d bytes", MAX_SESSION_KEY);
    }
    if (!key)
        return 0;
    skey *k = skey_get(h, key, len, c->tenant);
    if (!k) {
        e->status = 503;
        snprintf(e->message, sizeof e->message, "too many sessions in use");
        return -1;
    }
    if (k->busy) {
        e->status = 409;
        snprintf(e->message, sizeof e->message,
                 "a request of this session is still running; wait for it to finish");
        return -1;
    }
    k->busy = true;
    k->last_used = ++h->key_clock;
    q->sess = k;
    return 0;
}

static void make_id(cairn_http *h, hreq *q, const char *prefix)
{
    snprintf(q->id, sizeof q->id, "%s%016llx", prefix,
             (unsigned long long)next_seed(h->env.seed_state));
}

/* Every field of a generation request into q. */
static int decode_request(cairn_http *h, hconn *c, json_t *root, bool chat, hreq *q, herr *e)
{
    json_t *model = field(root, "model");
    int rc = 0;
    if (model && !json_is_string(model))
        rc = bad(e, "model", "'model' must be a string");
    if (rc == 0)
        rc = decode_sampling(h, root, chat, q, e);
    if (rc == 0 && chat)
        rc = decode_response_format(root, q, e);
    if (rc == 0)
        rc = chat ? decode_chat(h, root, q, e) : decode_completion(h, root, q, e);
    if (rc == 0 && !chat) {
        json_t *echo = field(root, "echo"), *suffix = field(root, "suffix");
        if (echo && !json_is_false(echo))
            rc = bad(e, "echo", "echo is not supported");
        else if (suffix && !(json_is_string(suffix) && json_string_length(suffix) == 0))
            rc = bad(e, "suffix", "suffix is not supported");
    }
    if (rc == 0)
        rc = decode_session(h, c, root, q, e);
    return rc;
}

/* POST /v1/chat/completions and /v1/completions. */
static void handle_generation(hconn *c, bool chat)
{
    cairn_http *h = c->h;
    json_error_t jerr;
    json_t *root = json_loadb(c->body.data ? c->body.data : "", c->body.len,
                              JSON_REJECT_DUPLICATES, &jerr);
    if (!root || !json_is_object(root)) {
        char msg[300];
        if (root)
            snprintf(msg, sizeof msg, "the body must be a JSON object");
        else
            snprintf(msg, sizeof msg, "invalid JSON at line %d column %d: %s", jerr.line,
                     jerr.column, jerr.text);
        json_decref(root);
        respond_error(c, 400, msg, NULL, NULL);
        return;
    }
    /* n: that many choices, each its own engine request (choice i samples
     * with seed + i when a seed is given), answered together */
    json_t *nj = field(root, "n");
    if (nj && (!json_is_integer(nj) || json_integer_value(nj) < 1 ||
               json_integer_value(nj) > MAX_CHOICES)) {
        json_decref(root);
        char msg[80];
        snprintf(msg, sizeof msg, "'n' must be an integer in [1, %d]", MAX_CHOICES);
        respond_error(c, 400, msg, "n", NULL);
        return;
    }
    const int n_choices = nj ? (int)json_integer_value(nj) : 1;
    hreq *lead = NULL;
    for (int i = 0; i < n_choices; i++) {
        hreq *q = calloc(1, sizeof *q);
        if (!q) {
            if (lead) {
                lead->n_choices = i; /* the choices made so far end the group */
                hreq_fail(lead, 503, "out of memory", NULL);
            } else {
                respond_error(c, 503, "out of memory", NULL, NULL);
            }
            json_decref(root);
            return;
        }
        q->h = h;
        q->conn = c;
        q->client = c->id;
        q->msgid = ++c->next_msgid;
        q->kind = chat ? HK_CHAT : HK_COMPLETION;
        q->lead = lead ? lead : q;
        q->index = i;
        q->n_choices = i == 0 ? n_choices : 0;
        if (lead) {
            memcpy(q->id, lead->id, sizeof q->id);
            q->created = lead->created;
        } else {
            q->created = (long long)time(NULL);
            make_id(h, q, chat ? "chatcmpl-" : "cmpl-");
        }
        q->next = h->reqs;
        h->reqs = q;
        if (!lead)
            lead = q;
        herr e = {0};
        int rc = decode_request(h, c, root, chat, q, &e);
        if (rc == 0 && json_is_integer(field(root, "seed")))
            q->gen.sampling.seed += (uint64_t)i;
        if (rc == 0 && n_choices > 1 && q->sess)
            rc = bad(&e, "n", "'n' > 1 cannot be combined with a session key");
        if (rc != 0) {
            lead->n_choices = i + 1; /* the choices made so far end the group */
            json_decref(root);
            hreq_fail_param(q, e.status ? e.status : 400, e.message, e.param, e.code);
            return;
        }
    }
    json_decref(root);
    c->active = lead;
    hreq *group[MAX_CHOICES];
    int m = 0;
    for (hreq *q = h->reqs; q; q = q->next)
        if (q->lead == lead)
            group[q->index] = q, m++;
    /* in index order; a failed submission answers and ends the group (the
     * choices not submitted yet with it) */
    for (int i = 0; i < m; i++)
        if (!hreq_submit_next(group[i]))
            break;
}

static void handle_metrics(hconn *c)
{
    cairn_http *h = c->h;
    hreq *q = calloc(1, sizeof *q);
    cairn_request *r = q ? cairn_request_new(CAIRN_REQ_CACHE_STATS) : NULL;
    if (!r) {
        free(q);
        respond_error(c, 503, "out of memory", NULL, NULL);
        return;
    }
    q->h = h;
    q->conn = c;
    q->client = c->id;
    q->msgid = ++c->next_msgid;
    q->kind = HK_METRICS;
    q->ph = PH_STATS;
    q->lead = q;
    q->n_choices = 1;
    q->next = h->reqs;
    h->reqs = q;
    c->active = q;
    r->client = q->client;
    r->id = q->msgid;
    if (cairn_service_submit(h->svc, r) != CAIRN_OK)
        hreq_fail(q, 503, "the engine is not accepting requests", NULL);
}

static void handle_models(hconn *c)
{
    cairn_http *h = c->h;
    json_t *o = json_pack("{s:s, s:[{s:s, s:s, s:I, s:s}]}", "object", "list", "data", "id",
                          h->model_id, "object", "model", "created", (json_int_t)0, "owned_by",
                          "cairn");
    respond_json(c, 200, o);
    json_decref(o);
}

/* ---- routing ------------------------------------------------------------------------------ */

/* The path of the request target, without the query. */
static size_t path_len(const hconn *c)
{
    const char *u = c->url.data ? c->url.data : "";
    const char *q = strchr(u, '?');
    return q ? (size_t)(q - u) : strlen(u);
}

static bool path_is(const hconn *c, const char *p)
{
    if (!c->url.data)
        return false;
    size_t n = path_len(c);
    return n == strlen(p) && memcmp(c->url.data, p, n) == 0;
}

static void handle_message(hconn *c)
{
    unsigned method = c->parser.method;
    struct {
        const char *path;
        unsigned method;
        int route;
    } routes[] = {
        {"/health", HTTP_GET, 1},
        {"/v1/models", HTTP_GET, 2},
        {"/metrics", HTTP_GET, 3},
        {"/v1/chat/completions", HTTP_POST, 4},
        {"/v1/completions", HTTP_POST, 5},
    };
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (!path_is(c, routes[i].path))
            continue;
        if (method != routes[i].method) {
            char allow[64];
            snprintf(allow, sizeof allow, "Allow: %s\r\n",
                     routes[i].method == HTTP_GET ? "GET" : "POST");
            json_t *body = error_body(405, "method not allowed", NULL, NULL);
            char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
            respond(c, 405, "application/json", text ? text : "{}", text ? strlen(text) : 2,
                    allow);
            free(text);
            json_decref(body);
            return;
        }
        switch (routes[i].route) {
        case 1: {
            static const char ok[] = "{\"status\":\"ok\"}";
            respond(c, 200, "application/json", ok, sizeof ok - 1, NULL);
            return;
        }
        case 2: handle_models(c); return;
        case 3: handle_metrics(c); return;
        case 4: handle_generation(c, true); return;
        default: handle_generation(c, false); return;
        }
    }
    /* /v1/models/{id} */
    static const char models_prefix[] = "/v1/models/";
    size_t plen = sizeof models_prefix - 1, n = path_len(c);
    if (n > plen && memcmp(c->url.data, models_prefix, plen) == 0 && method == HTTP_GET) {
        cairn_http *h = c->h;
        if (n - plen == strlen(h->model_id) && memcmp(c->url.data + plen, h->model_id, n - plen) == 0) {
            json_t *o = json_pack("{s:s, s:s, s:I, s:s}", "id", h->model_id, "object", "model",
                                  "created", (json_int_t)0, "owned_by", "cairn");
            respond_json(c, 200, o);
            json_decref(o);
        } else {
            respond_error(c, 404, "no such model", "model", "model_not_found");
        }
        return;
    }
    respond_error(c, 404, "no such route", NULL, NULL);
}

/* ---- parser callbacks ------------------------------------------------------------------------ */

static int refuse_in_parser(hconn *c, int status, const char *message)
{
    c->error_status = status;
    c->error_message = message;
    return -1;
}

static int count_header_bytes(hconn *c, size_t n)
{
    c->header_bytes += n;
    if (c->header_bytes > c->h->cfg.max_header_bytes)
        return refuse_in_parser(c, 431, "the request line and headers are too large");
    return 0;
}

static int on_message_begin(http_parser *p)
{
    hconn *c = p->data;
    c->in_request = true;
    c->url.len = c->field.len = c->value.len = c->body.len = 0;
    c->header_bytes = 0;
    c->header_is_value = false;
    free(c->authorization);
    free(c->session_header);
    c->authorization = c->session_header = NULL;
    c->expect_continue = false;
    return 0;
}

static int on_url(http_parser *p, const char *at, size_t len)
{
    hconn *c = p->data;
    if (count_header_bytes(c, len))
        return -1;
    sb_put(&c->url, at, len);
    return c->url.oom ? refuse_in_parser(c, 503, "out of memory") : 0;
}

static bool name_is(const sbuf *b, const char *name)
{
    return b->len == strlen(name) && strncasecmp(b->data, name, b->len) == 0;
}

static char *trimmed_copy(const sbuf *b)
{
    const char *s = b->data ? b->data : "";
    size_t n = b->len;
    while (n && (*s == ' ' || *s == '\t'))
        s++, n--;
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        n--;
    char *out = malloc(n + 1);
    if (out) {
        memcpy(out, s, n);
        out[n] = '\0';
    }
    return out;
}

/* One whole header (field and value) has arrived. */
static int header_done(hconn *c)
{
    if (c->field.len == 0)
        return 0;
    char **dst = name_is(&c->field, "authorization")  ? &c->authorization
                 : name_is(&c->field, "x-session-id") ? &c->session_header
                                                      : NULL;
    if (dst) {
        free(*dst);
        if (!(*dst = trimmed_copy(&c->value)))
            return refuse_in_parser(c, 503, "out of memory");
    } else if (name_is(&c->field, "expect")) {
        char *v = trimmed_copy(&c->value);
        if (!v || strcasecmp(v, "100-continue") != 0) {
            free(v);
            return refuse_in_parser(c, 417, "only Expect: 100-continue is supported");
        }
        free(v);
        c->expect_continue = true;
    }
    c->field.len = c->value.len = 0;
    return 0;
}

static int on_header_field(http_parser *p, const char *at, size_t len)
{
    hconn *c = p->data;
    if (count_header_bytes(c, len))
        return -1;
    if (c->header_is_value && header_done(c))
        return -1;
    c->header_is_value = false;
    sb_put(&c->field, at, len);
    return c->field.oom ? refuse_in_parser(c, 503, "out of memory") : 0;
}

static int on_header_value(http_parser *p, const char *at, size_t len)
{
    hconn *c = p->data;
    if (count_header_bytes(c, len))
        return -1;
    c->header_is_value = true;
    sb_put(&c->value, at, len);
    return c->value.oom ? refuse_in_parser(c, 503, "out of memory") : 0;
}

/* Constant-time check of "Bearer TOKEN" against the server's credentials. */
static int check_auth(hconn *c)
{
    cairn_http *h = c->h;
    if (!cairn_access_required(h->env.access)) {
        c->tenant = 0;
        return 0;
    }
    const char *a = c->authorization;
    if (!a || strncasecmp(a, "Bearer ", 7) != 0)
        return -1;
    const char *tok = a + 7;
    while (*tok == ' ')
        tok++;
    uint64_t tenant;
    const char *name;
    if (cairn_access_check(h->env.access, tok, strlen(tok), &tenant, &name) != CAIRN_OK)
        return -1;
    c->tenant = tenant;
    return 0;
}

static int on_headers_complete(http_parser *p)
{
    hconn *c = p->data;
    if (c->header_is_value && header_done(c))
        return -1;
    c->header_is_value = false;
    /* Refuse what we can before reading a byte of the body. */
    if (!path_is(c, "/health") && check_auth(c) != 0)
        return refuse_in_parser(c, 401, "a valid 'Authorization: Bearer TOKEN' header is required");
    if ((p->flags & F_CONTENTLENGTH) && p->content_length > c->h->cfg.max_body_bytes)
        return refuse_in_parser(c, 413, "the request body is too large");
    if (c->expect_continue && !c->closing) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        conn_write(c, cont, sizeof cont - 1);
    }
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t len)
{
    hconn *c = p->data;
    if (c->body.len + len > c->h->cfg.max_body_bytes)
        return refuse_in_parser(c, 413, "the request body is too large");
    sb_put(&c->body, at, len);
    return c->body.oom ? refuse_in_parser(c, 503, "out of memory") : 0;
}

static int on_message_complete(http_parser *p)
{
    hconn *c = p->data;
    c->message_done = true;
    c->keep_alive = http_should_keep_alive(p) != 0;
    http_parser_pause(p, 1); /* act on it before parsing anything after it */
    return 0;
}

/* ---- reading ----------------------------------------------------------------------------------- */

/* Parse what is buffered while no request is running. */
static void conn_process(hconn *c)
{
    c->in_process = true;
    while (!c->closing && !c->lingering && !c->active && c->in_off < c->in_len) {
        size_t n = http_parser_execute(&c->parser, &c->h->settings, c->in + c->in_off,
                                       c->in_len - c->in_off);
        c->in_off += n;
        if (c->message_done) {
            c->message_done = false;
            http_parser_pause(&c->parser, 0);
            uv_timer_stop(&c->timer);
            handle_message(c);
            continue;
        }
        enum http_errno err = HTTP_PARSER_ERRNO(&c->parser);
        if (err != HPE_OK) {
            int status = c->error_status ? c->error_status : 400;
            char msg[200];
            snprintf(msg, sizeof msg, "%s", c->error_status ? c->error_message
                                                            : http_errno_description(err));
            c->keep_alive = false;
            if (status == 401)
                cairn_log(CAIRN_LOG_INFO, "http client %llu: unauthorized",
                          (unsigned long long)(c->id & ~CAIRN_HTTP_CLIENT_BIT));
            respond_error(c, status, msg, NULL, NULL);
            break;
        }
    }
    if (c->in_off == c->in_len)
        c->in_off = c->in_len = 0;
    c->in_process = false;
}

static void on_read_deadline(uv_timer_t *t)
{
    hconn *c = t->data;
    if (c->closing || c->lingering || c->active)
        return;
    if (c->in_request || c->in_len > c->in_off) {
        cairn_log(CAIRN_LOG_INFO, "http client %llu: request not received in time",
                  (unsigned long long)(c->id & ~CAIRN_HTTP_CLIENT_BIT));
        c->keep_alive = false;
        respond_error(c, 408, "the request was not received in time", NULL, NULL);
    } else {
        conn_close(c); /* an idle keep-alive connection */
    }
}

static void on_alloc(uv_handle_t *hd, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    hconn *c = hd->data;
    *buf = uv_buf_init(c->rbuf, sizeof c->rbuf);
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    hconn *c = st->data;
    if (c->closing)
        return;
    if (nread < 0) { /* EOF or error: a running request is cancelled */
        conn_close(c);
        return;
    }
    if (c->lingering || nread == 0)
        return;
    /* Bytes wait in `in` while a request runs (a pipelining client); more
     * than a whole request's worth of them is not a client we serve. */
    size_t limit = c->h->cfg.max_body_bytes + c->h->cfg.max_header_bytes + READ_CHUNK;
    if (c->in_off > 0 && c->in_len + (size_t)nread > c->in_cap) {
        memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
        c->in_len -= c->in_off;
        c->in_off = 0;
    }
    if (c->in_len + (size_t)nread > limit) {
        conn_close(c);
        return;
    }
    if (c->in_len + (size_t)nread > c->in_cap) {
        size_t cap = c->in_cap ? c->in_cap : READ_CHUNK;
        while (cap < c->in_len + (size_t)nread)
            cap *= 2;
        char *in = realloc(c->in, cap);
        if (!in) {
            conn_close(c);
            return;
        }
        c->in = in;
        c->in_cap = cap;
    }
    memcpy(c->in + c->in_len, buf->base, (size_t)nread);
    c->in_len += (size_t)nread;
    if (!c->in_request && !c->active)
        c->in_request = true;
    if (!c->active)
        conn_process(c);
    /* Do not keep a big body's buffer on an idle connection. */
    if (!c->closing && c->in_len == 0 && c->in_cap > 4 * READ_CHUNK) {
        free(c->in);
        c->in = NULL;
        c->in_cap = 0;
    }
}

static void on_connection(uv_stream_t *listener, int status)
{
    cairn_http *h = listener->data;
    if (status < 0 || h->stopping)
        return;
    hconn *c = calloc(1, sizeof *c);
    if (!c)
        return; /* stays in the backlog */
    c->h = h;
    uv_tcp_init(h->env.loop, &c->tcp);
    uv_timer_init(h->env.loop, &c->timer);
    c->tcp.data = c->timer.data = c;
    c->open_handles = 2;
    c->next = h->conns;
    if (h->conns)
        h->conns->prev = c;
    h->conns = c;
    if (uv_accept(listener, (uv_stream_t *)&c->tcp) != 0) {
        conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1); /* streamed chunks should not wait for Nagle */
    c->id = ++*h->env.next_client_id | CAIRN_HTTP_CLIENT_BIT;
    c->keep_alive = true;
    http_parser_init(&c->parser, HTTP_REQUEST);
    c->parser.data = c;
    uv_timer_start(&c->timer, on_read_deadline, (uint64_t)(h->cfg.timeout_s * 1000), 0);
    cairn_log(CAIRN_LOG_DEBUG, "http client %llu: connected",
              (unsigned long long)(c->id & ~CAIRN_HTTP_CLIENT_BIT));
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0)
        conn_close(c);
}

/* ---- life ------------------------------------------------------------------------------------- */

int cairn_http_create(const cairn_http_env *env, cairn_http **out, char *err, size_t err_len)
{
    const cairn_http_config *cfg = env->cfg;
    if (!cfg->host || cfg->port < 0 || cfg->port > 65535 || cfg->max_body_bytes == 0 ||
        cfg->max_header_bytes < 256 || !(cfg->timeout_s > 0) || cfg->max_session_keys == 0)
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "invalid HTTP configuration");
    struct sockaddr_storage addr;
    if (uv_ip4_addr(cfg->host, cfg->port, (struct sockaddr_in *)&addr) != 0 &&
        uv_ip6_addr(cfg->host, cfg->port, (struct sockaddr_in6 *)&addr) != 0)
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "'%s' is not an IP address", cfg->host);
    cairn_http *h = calloc(1, sizeof *h);
    if (!h)
        return CAIRN_ENOMEM;
    h->env = *env;
    h->cfg = *cfg;
    h->internal_client = ++*env->next_client_id | CAIRN_HTTP_CLIENT_BIT;
    h->settings.on_message_begin = on_message_begin;
    h->settings.on_url = on_url;
    h->settings.on_header_field = on_header_field;
    h->settings.on_header_value = on_header_value;
    h->settings.on_headers_complete = on_headers_complete;
    h->settings.on_body = on_body;
    h->settings.on_message_complete = on_message_complete;
    snprintf(h->model_id, sizeof h->model_id, "cairn");
    uv_tcp_init(env->loop, &h->listener);
    h->listener.data = h;
    h->listening = true;
    int rc = uv_tcp_bind(&h->listener, (const struct sockaddr *)&addr, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&h->listener, 128, on_connection);
    if (rc != 0) {
        int r = cairn_errorf(err, err_len, CAIRN_EIO, "cannot listen (HTTP) on %s port %d: %s",
                             cfg->host, cfg->port, uv_strerror(rc));
        cairn_http_shutdown(h);
        *out = h; /* freed by the caller after the loop closed the handle */
        return r;
    }
    struct sockaddr_storage bound;
    int len = sizeof bound;
    uv_tcp_getsockname(&h->listener, (struct sockaddr *)&bound, &len);
    h->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                : ((struct sockaddr_in *)&bound)->sin_port);
    snprintf(h->desc, sizeof h->desc, bound.ss_family == AF_INET6 ? "http [%s]:%d" : "http %s:%d",
             cfg->host, h->port);
    *out = h;
    return CAIRN_OK;
}

void cairn_http_set_service(cairn_http *h, cairn_service *svc, const char *model_path)
{
    h->svc = svc;
    h->vocab = cairn_service_vocab(svc);
    h->n_ctx = cairn_service_n_ctx(svc);
    if (h->cfg.model_name) {
        snprintf(h->model_id, sizeof h->model_id, "%s", h->cfg.model_name);
    } else if (model_path) {
        const char *base = strrchr(model_path, '/');
        base = base ? base + 1 : model_path;
        size_t n = strlen(base);
        if (n > 5 && strcmp(base + n - 5, ".gguf") == 0)
            n -= 5;
        snprintf(h->model_id, sizeof h->model_id, "%.*s", (int)n, base);
    }
}

int cairn_http_port(const cairn_http *h) { return h && h->listening ? h->port : -1; }

void cairn_http_describe(const cairn_http *h, char *out, size_t cap)
{
    snprintf(out, cap, "%s", h ? h->desc : "");
}

void cairn_http_shutdown(cairn_http *h)
{
    if (!h)
        return;
    h->stopping = true;
    if (h->listening && !uv_is_closing((uv_handle_t *)&h->listener))
        uv_close((uv_handle_t *)&h->listener, NULL);
    h->listening = false;
    while (h->conns)
        conn_close(h->conns);
}

void cairn_http_free(cairn_http *h)
{
    if (!h)
        return;
    while (h->reqs)
        hreq_finish(h->reqs);
    while (h->keys)
        skey_unlink_free(h, h->keys);
    free(h);
}
