/*
 * route/proxy_http.c — HTTP in front of the replicas: every route cairn
 * serves, proxied with its meaning unchanged.
 *
 *   client bytes ─http_parser (request)─▶ method, url, headers, body
 *       /router/health, /router/metrics: answered here
 *       POST /v1/chat/completions, /v1/completions, /v1/messages,
 *       /v1/responses: the body decoded on libuv's threadpool (api/, as a
 *       replica decodes it) into prompt tokens and a session key ─┐
 *       anything else, or a body that does not decode ────────────┤
 *                                                                 ▼
 *                                     route_choose ─▶ a keep-alive connection
 *                                     to that replica (pooled) ─▶ the request,
 *                                     re-framed with Content-Length
 *   replica bytes ─http_parser (response)─▶ status and headers, then the body
 *       as it comes (SSE chunks go out as they arrive), re-chunked when the
 *       replica chunked it (or gave no length), so the router always knows
 *       where it is in the client's stream.
 *
 * One request at a time per client connection (HTTP/1.1 without parallel
 * pipelining, as the replicas): what arrives meanwhile is buffered, and the
 * connection is not read while that buffer holds more than a request may.
 * Hop-by-hop headers (Connection, Keep-Alive, Transfer-Encoding, TE,
 * Trailer, Upgrade, Expect, Content-Length) are the router's on each side;
 * every other header goes through, Authorization included.
 *
 * Failures: a replica that refuses the connection is marked down and the
 * request goes to another (nothing was sent); a pooled connection the
 * replica had closed is replaced by a new one to the same replica. A
 * replica that fails after the request went out: 502 when nothing was
 * answered yet; an SSE `error` event and a closed connection when a
 * stream had started; a closed connection otherwise.
 */
#include "route/route_impl.h"

#include <http_parser.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define HTTP_MAX_ATTEMPTS 3
#define HTTP_LEARN_BYTES 8192 /* of a /v1/responses answer: where its id is */
#define HTTP_MAX_IDLE 32      /* keep-alive connections kept per replica */

typedef struct hclient hclient;
typedef struct hjob hjob;

struct hup {
    rstream s;
    cairn_router *r;
    int slot;
    uint64_t generation;
    hup *next_idle;
    hjob *job;             /* the request it answers; NULL while idle     */
    bool connected, reused, got_bytes, failed;
    http_parser p;
    cairn_strbuf field, value, head;
    bool in_value;
    bool headers_done, chunked_out, message_done;
};

struct hjob {
    uv_work_t work;
    cairn_router *r;
    hclient *c;            /* NULL once the client has gone               */
    /* the request */
    unsigned method;
    char *url;
    cairn_strbuf headers;  /* end-to-end header lines, as received         */
    char *body;
    size_t body_len;
    char *session_header;  /* X-Session-Id                                 */
    uint64_t tenant;
    cairn_api_op op;       /* 0: not a generation route                    */
    bool keep_alive;
    /* decoded (threadpool) */
    bool decoded;
    int32_t *tokens;
    size_t n_tokens;
    int64_t max_tokens;
    char *sticky;
    bool learn_response_id;
    /* forwarding */
    route_choice choice;
    bool chosen;
    uint64_t exclude;
    int attempts;
    hup *up;
    bool head_sent, sse, over;
    int status;            /* the replica's answer's                       */
    bool decoding;         /* on the threadpool: decode_done frees it if the
                              client has gone                             */
    size_t learn_seen;
    char learn_buf[64];
    size_t learn_len;
};

struct hclient {
    rstream s;
    cairn_router *r;
    hclient *prev, *next;  /* the router's list of clients                */
    double idle_since;     /* waiting for a request since then             */
    http_parser p;
    char *in;
    size_t in_len, in_off, in_cap;
    cairn_strbuf url, field, value, headers, body;
    bool in_value;
    size_t header_bytes;
    char *authorization, *session_header, *api_key;
    bool expect_continue;  /* Expect: 100-continue                          */
    bool message_done;
    int error_status;
    const char *error_message;
    hjob *job;
    bool paused;
};

static http_parser_settings g_req_settings, g_resp_settings;
static bool g_settings_ready;

static void client_process(hclient *c);
static void job_dispatch(hjob *j);
static void job_finish(hjob *j, bool ok);

/* ---- small helpers ---------------------------------------------------------------- */

static bool name_is(const cairn_strbuf *b, const char *name)
{
    return b->len == strlen(name) && strncasecmp(b->data, name, b->len) == 0;
}

static char *dup_buf(const cairn_strbuf *b)
{
    return strndup(b->data ? b->data : "", b->len);
}

static void bprintf(cairn_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bprintf(cairn_strbuf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        cairn_strbuf_add(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static bool hop_by_hop(const cairn_strbuf *name)
{
    static const char *const hop[] = {"connection", "keep-alive", "proxy-connection",
                                      "transfer-encoding", "te", "trailer", "upgrade",
                                      "expect", "content-length"};
    for (size_t i = 0; i < sizeof hop / sizeof hop[0]; i++)
        if (name_is(name, hop[i]))
            return true;
    return false;
}

static const char *reason_of(int status)
{
    return http_status_str((enum http_status)status);
}

/* A whole response from the router itself. */
static void respond(hclient *c, int status, const char *ctype, const char *body, size_t len,
                    bool keep)
{
    cairn_strbuf b = {0};
    bprintf(&b, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: %s\r\n\r\n",
            status, reason_of(status), ctype, len, keep ? "keep-alive" : "close");
    cairn_strbuf_add(&b, body, len);
    rstream_write(&c->s, b.data, b.len);
    cairn_strbuf_free(&b);
}

/* {"error": {message, type, code}} in OpenAI's shape. */
static void respond_error(hclient *c, int status, const char *message, const char *code,
                          bool keep)
{
    json_t *o = json_pack("{s:{s:s,s:s,s:s?,s:n}}", "error", "message", message, "type",
                          status >= 500 ? "server_error" : "invalid_request_error", "code", code,
                          "param");
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    respond(c, status, "application/json", text ? text : "{}", text ? strlen(text) : 2, keep);
    free(text);
}

/* ---- the client side: parsing ------------------------------------------------------ */

static hclient *cl(http_parser *p) { return p->data; }

static int refuse(hclient *c, int status, const char *message)
{
    c->error_status = status;
    c->error_message = message;
    return -1;
}

static void commit_header(hclient *c)
{
    if (!c->in_value)
        return;
    c->in_value = false;
    if (name_is(&c->field, "authorization")) {
        free(c->authorization);
        c->authorization = dup_buf(&c->value);
    } else if (name_is(&c->field, "x-api-key")) {
        free(c->api_key);
        c->api_key = dup_buf(&c->value);
    } else if (name_is(&c->field, "expect")) {
        c->expect_continue = c->value.len == 12 && strncasecmp(c->value.data, "100-continue", 12) == 0;
    } else if (name_is(&c->field, "x-session-id")) {
        free(c->session_header);
        c->session_header = dup_buf(&c->value);
    }
    if (!hop_by_hop(&c->field)) {
        cairn_strbuf_add(&c->headers, c->field.data ? c->field.data : "", c->field.len);
        cairn_strbuf_add(&c->headers, ": ", 2);
        cairn_strbuf_add(&c->headers, c->value.data ? c->value.data : "", c->value.len);
        cairn_strbuf_add(&c->headers, "\r\n", 2);
    }
    cairn_strbuf_free(&c->field);
    cairn_strbuf_free(&c->value);
}

static int req_message_begin(http_parser *p)
{
    hclient *c = cl(p);
    cairn_strbuf_free(&c->url);
    cairn_strbuf_free(&c->field);
    cairn_strbuf_free(&c->value);
    cairn_strbuf_free(&c->headers);
    cairn_strbuf_free(&c->body);
    free(c->authorization);
    free(c->api_key);
    free(c->session_header);
    c->authorization = c->api_key = c->session_header = NULL;
    c->expect_continue = false;
    c->in_value = false;
    c->header_bytes = 0;
    return 0;
}

static int count_head(hclient *c, size_t len)
{
    c->header_bytes += len;
    if (c->header_bytes > c->r->cfg.max_header_bytes)
        return refuse(c, 431, "the request line and headers are too large");
    return 0;
}

static int req_url(http_parser *p, const char *at, size_t len)
{
    hclient *c = cl(p);
    cairn_strbuf_add(&c->url, at, len);
    return count_head(c, len);
}

static int req_header_field(http_parser *p, const char *at, size_t len)
{
    hclient *c = cl(p);
    commit_header(c);
    cairn_strbuf_add(&c->field, at, len);
    return count_head(c, len);
}

static int req_header_value(http_parser *p, const char *at, size_t len)
{
    hclient *c = cl(p);
    c->in_value = true;
    cairn_strbuf_add(&c->value, at, len);
    return count_head(c, len);
}

static int req_headers_complete(http_parser *p)
{
    hclient *c = cl(p);
    commit_header(c);
    if ((p->flags & F_CONTENTLENGTH) && p->content_length > c->r->cfg.max_body_bytes)
        return refuse(c, 413, "the request body is too large");
    /* the router reads the body itself (it decodes it before choosing) */
    if (c->expect_continue && p->http_minor >= 1) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        rstream_write(&c->s, cont, sizeof cont - 1);
    }
    return 0;
}

static int req_body(http_parser *p, const char *at, size_t len)
{
    hclient *c = cl(p);
    if (c->body.len + len > c->r->cfg.max_body_bytes)
        return refuse(c, 413, "the request body is too large");
    cairn_strbuf_add(&c->body, at, len);
    return c->body.oom ? refuse(c, 503, "out of memory") : 0;
}

static int req_message_complete(http_parser *p)
{
    hclient *c = cl(p);
    c->message_done = true;
    http_parser_pause(p, 1); /* one request at a time */
    return 0;
}

/* ---- the upstream side -------------------------------------------------------------- */

static hup *up_of(http_parser *p) { return p->data; }

static void up_free_bufs(hup *u)
{
    cairn_strbuf_free(&u->field);
    cairn_strbuf_free(&u->value);
    cairn_strbuf_free(&u->head);
}

static void up_commit_header(hup *u)
{
    if (!u->in_value)
        return;
    u->in_value = false;
    if (!hop_by_hop(&u->field)) {
        cairn_strbuf_add(&u->head, u->field.data ? u->field.data : "", u->field.len);
        cairn_strbuf_add(&u->head, ": ", 2);
        cairn_strbuf_add(&u->head, u->value.data ? u->value.data : "", u->value.len);
        cairn_strbuf_add(&u->head, "\r\n", 2);
    } else if (name_is(&u->field, "content-length")) {
        cairn_strbuf_add(&u->head, "Content-Length: ", 16);
        cairn_strbuf_add(&u->head, u->value.data ? u->value.data : "", u->value.len);
        cairn_strbuf_add(&u->head, "\r\n", 2);
    }
    if (u->job && name_is(&u->field, "content-type") && u->value.data &&
        strncasecmp(u->value.data, "text/event-stream", 17) == 0)
        u->job->sse = true;
    cairn_strbuf_free(&u->field);
    cairn_strbuf_free(&u->value);
}

static int resp_message_begin(http_parser *p)
{
    hup *u = up_of(p);
    up_free_bufs(u);
    u->in_value = false;
    u->headers_done = false;
    return 0;
}

static int resp_header_field(http_parser *p, const char *at, size_t len)
{
    hup *u = up_of(p);
    up_commit_header(u);
    cairn_strbuf_add(&u->field, at, len);
    return 0;
}

static int resp_header_value(http_parser *p, const char *at, size_t len)
{
    hup *u = up_of(p);
    u->in_value = true;
    cairn_strbuf_add(&u->value, at, len);
    return 0;
}

static int resp_headers_complete(http_parser *p)
{
    hup *u = up_of(p);
    up_commit_header(u);
    hjob *j = u->job;
    if (!j)
        return -1; /* an answer nobody asked for */
    u->headers_done = true;
    const int status = p->status_code;
    const bool no_body = j->method == HTTP_HEAD || status < 200 || status == 204 || status == 304;
    if (status < 200)
        return 0; /* an interim answer: not forwarded, the real one follows */
    u->chunked_out = !no_body && !(p->flags & F_CONTENTLENGTH);
    if (j->c && !j->head_sent) {
        cairn_strbuf b = {0};
        bprintf(&b, "HTTP/1.1 %d %s\r\n", status, reason_of(status));
        cairn_strbuf_add(&b, u->head.data ? u->head.data : "", u->head.len);
        if (u->chunked_out)
            cairn_strbuf_add(&b, "Transfer-Encoding: chunked\r\n", 28);
        bprintf(&b, "Connection: %s\r\n\r\n", j->keep_alive ? "keep-alive" : "close");
        rstream_write(&j->c->s, b.data, b.len);
        cairn_strbuf_free(&b);
        j->head_sent = true;
    }
    return no_body ? 1 : 0;
}

/* A stored response's id ("resp_" + 32 hex: its session) in the first bytes
 * of the answer: that session lives on this replica. The key "id" is
 * matched with its quotes, so an echoed "previous_response_id" is not taken
 * for it (the replica writes compact JSON, also in its SSE events). */
static void learn_from(hjob *j, const char *at, size_t len)
{
    static const char pat[] = "\"id\":\"resp_";
    const size_t pl = sizeof pat - 1;
    if (!j->learn_response_id || j->learn_seen >= HTTP_LEARN_BYTES)
        return;
    for (size_t i = 0; i < len && j->learn_seen < HTTP_LEARN_BYTES; i++, j->learn_seen++) {
        char ch = at[i];
        if (j->learn_len < pl) {
            j->learn_len = ch == pat[j->learn_len] ? j->learn_len + 1 : ch == pat[0];
            continue;
        }
        const bool hex = (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f');
        if (!hex) {
            j->learn_len = ch == pat[0];
            continue;
        }
        j->learn_buf[j->learn_len - pl] = ch;
        if (++j->learn_len == pl + 32) {
            char key[40];
            snprintf(key, sizeof key, "s:%.32s", j->learn_buf);
            route_sessions_set(j->r->sessions, key, j->choice.slot);
            j->learn_response_id = false;
            return;
        }
    }
}

static int resp_body(http_parser *p, const char *at, size_t len)
{
    hup *u = up_of(p);
    hjob *j = u->job;
    if (!j || !j->c)
        return 0;
    learn_from(j, at, len);
    if (j->chosen) {
        /* the answer has begun: the prompt is computed; each SSE event of a
         * stream is about one token more */
        int64_t events = 0;
        for (size_t i = 0; j->sse && i + 1 < len; i++)
            events += at[i] == '\n' && at[i + 1] == '\n';
        route_progress(j->r, &j->choice, events);
    }
    if (u->chunked_out) {
        char size[24];
        int n = snprintf(size, sizeof size, "%zx\r\n", len);
        rstream_write(&j->c->s, size, (size_t)n);
        rstream_write(&j->c->s, at, len);
        rstream_write(&j->c->s, "\r\n", 2);
    } else {
        rstream_write(&j->c->s, at, len);
    }
    return 0;
}

static int resp_message_complete(http_parser *p)
{
    hup *u = up_of(p);
    if (p->status_code < 200 && p->status_code >= 100)
        return 0;
    u->message_done = true;
    if (u->chunked_out && u->job && u->job->c)
        rstream_write(&u->job->c->s, "0\r\n\r\n", 5);
    http_parser_pause(p, 1);
    return 0;
}

static void up_closed(rstream *s)
{
    hup *u = s->owner;
    up_free_bufs(u);
    free(u);
}

/* Take u out of its replica's idle list (it is there when it has no job). */
static void unlink_idle(hup *u)
{
    route_live *lv = &u->r->live[u->slot];
    for (hup **pp = &lv->idle; *pp; pp = &(*pp)->next_idle)
        if (*pp == u) {
            *pp = u->next_idle;
            lv->n_idle--;
            break;
        }
    u->next_idle = NULL;
}

static void client_close(hclient *c);

/* The replica connection failed while (or before) answering j. */
static void job_upstream_failed(hjob *j, hup *u, bool connect_failed, const char *why)
{
    cairn_router *r = j->r;
    j->up = NULL;
    u->job = NULL;
    const int slot = j->choice.slot;
    if (connect_failed)
        route_replica_failed(r, slot, why);
    if (!j->c) {
        job_finish(j, false);
        return;
    }
    const bool retry = !r->stopping && !u->got_bytes && (connect_failed || u->reused) &&
                       j->attempts < HTTP_MAX_ATTEMPTS && !j->head_sent;
    if (retry) {
        /* nothing reached the replica (or it had closed the pooled
         * connection): the request can go again */
        route_done(r, &j->choice, false);
        j->chosen = false;
        if (connect_failed)
            j->exclude |= 1ull << slot;
        job_dispatch(j);
        return;
    }
    r->counters.replica_errors++;
    route_replica_failed(r, slot, why);
    hclient *c = j->c;
    char msg[300];
    pthread_mutex_lock(&r->reg_mu);
    snprintf(msg, sizeof msg, "the replica serving this request (%s) failed: %s", r->reg[slot].id,
             why);
    pthread_mutex_unlock(&r->reg_mu);
    if (!j->head_sent) {
        const bool keep = j->keep_alive;
        job_finish(j, false);
        respond_error(c, 502, msg, "replica_failed", keep);
        if (!keep)
            rstream_finish(&c->s);
        else
            client_process(c);
        return;
    }
    if (j->sse && u->chunked_out) {
        json_t *o = json_pack("{s:{s:s,s:s,s:s}}", "error", "message", msg, "type", "server_error",
                              "code", "replica_failed");
        char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        if (text) {
            cairn_strbuf b = {0};
            size_t n = strlen(text) + 8; /* "data: " + text + "\n\n" */
            bprintf(&b, "%zx\r\ndata: ", n);
            cairn_strbuf_add(&b, text, strlen(text));
            cairn_strbuf_add(&b, "\n\n\r\n", 4);
            rstream_write(&c->s, b.data, b.len);
            cairn_strbuf_free(&b);
            free(text);
        }
    }
    /* the stream is cut short without its last chunk: the client sees an
     * incomplete answer, not a finished one */
    job_finish(j, false);
    rstream_finish(&c->s);
}

static void up_read(rstream *s, const char *buf, ssize_t n)
{
    hup *u = s->owner;
    hjob *j = u->job;
    if (n < 0) {
        if (!j) { /* an idle connection the replica closed */
            unlink_idle(u);
            return;
        }
        if (u->headers_done && !u->message_done) {
            http_parser_execute(&u->p, &g_resp_settings, NULL, 0); /* EOF ends some bodies */
            if (u->message_done) {
                j->status = u->p.status_code;
                u->job = NULL;
                j->up = NULL;
                job_finish(j, true);
                return;
            }
        }
        job_upstream_failed(j, u, false, n == UV_EOF ? "connection closed" : uv_strerror((int)n));
        return;
    }
    if (!j) { /* bytes on an idle connection: not a replica we understand */
        unlink_idle(u);
        rstream_close(&u->s);
        return;
    }
    u->got_bytes = true;
    size_t used = http_parser_execute(&u->p, &g_resp_settings, buf, (size_t)n);
    if (u->message_done) {
        const bool keep = http_should_keep_alive(&u->p) && used == (size_t)n;
        j->status = u->p.status_code;
        u->job = NULL;
        j->up = NULL;
        route_live *lv = &u->r->live[u->slot];
        if (keep && lv->up && lv->n_idle < HTTP_MAX_IDLE && lv->generation == u->generation) {
            http_parser_init(&u->p, HTTP_RESPONSE);
            u->p.data = u;
            u->message_done = u->headers_done = u->got_bytes = false;
            u->reused = true;
            u->next_idle = lv->idle;
            lv->idle = u;
            lv->n_idle++;
        } else {
            rstream_close(&u->s);
        }
        job_finish(j, true);
        return;
    }
    if (HTTP_PARSER_ERRNO(&u->p) != HPE_OK) {
        rstream_close(&u->s); /* its on_read(-) is not called: close says nothing */
        job_upstream_failed(j, u, false, "malformed answer");
    }
}

static void send_request(hup *u, hjob *j)
{
    cairn_strbuf b = {0};
    bprintf(&b, "%s ", http_method_str((enum http_method)j->method));
    cairn_strbuf_add(&b, j->url, strlen(j->url));
    cairn_strbuf_add(&b, " HTTP/1.1\r\n", 11);
    cairn_strbuf_add(&b, j->headers.data ? j->headers.data : "", j->headers.len);
    if (j->body_len || j->method == HTTP_POST || j->method == HTTP_PUT ||
        j->method == HTTP_PATCH)
        bprintf(&b, "Content-Length: %zu\r\n", j->body_len);
    cairn_strbuf_add(&b, "Connection: keep-alive\r\n\r\n", 26);
    cairn_strbuf_add(&b, j->body ? j->body : "", j->body_len);
    rstream_write(&u->s, b.data, b.len);
    cairn_strbuf_free(&b);
}

static void up_connected(rstream *s, int status)
{
    hup *u = s->owner;
    hjob *j = u->job;
    if (status < 0) {
        if (j)
            job_upstream_failed(j, u, true, uv_strerror(status));
        return;
    }
    u->connected = true;
    rstream_read(s, true);
    if (j)
        send_request(u, j);
}

/* The close of a connection with a job (not through up_read) must fail it:
 * rstream_close is called by net.c on a failed write. */
static void up_closed_with_job(rstream *s)
{
    hup *u = s->owner;
    if (u->job)
        job_upstream_failed(u->job, u, !u->connected, "connection lost");
    up_closed(s);
}

static hup *up_get(cairn_router *r, int slot, bool *fresh)
{
    route_live *lv = &r->live[slot];
    while (lv->idle) {
        hup *u = lv->idle;
        lv->idle = u->next_idle;
        lv->n_idle--;
        u->next_idle = NULL;
        if (u->generation == lv->generation && !u->s.closing) {
            *fresh = false;
            return u;
        }
        rstream_close(&u->s);
    }
    hup *u = calloc(1, sizeof *u);
    if (!u)
        return NULL;
    u->r = r;
    u->slot = slot;
    u->generation = lv->generation;
    rstream_init(&r->loop, &u->s, u);
    u->s.on_read = up_read;
    u->s.on_connect = up_connected;
    u->s.on_close = up_closed_with_job;
    http_parser_init(&u->p, HTTP_RESPONSE);
    u->p.data = u;
    *fresh = true;
    return u;
}

void route_http_fail_slot(cairn_router *r, int slot)
{
    for (hclient *c = r->http_clients; c; c = c->next)
        if (c->job && c->job->up && c->job->up->slot == slot)
            rstream_close(&c->job->up->s); /* its close fails the job */
    route_http_drop_idle(r, slot);
}

void route_http_drop_idle(cairn_router *r, int slot)
{
    route_live *lv = &r->live[slot];
    while (lv->idle) {
        hup *u = lv->idle;
        lv->idle = u->next_idle;
        u->next_idle = NULL;
        rstream_close(&u->s);
    }
    lv->n_idle = 0;
}

/* ---- jobs ------------------------------------------------------------------------------ */

static void job_free(hjob *j)
{
    free(j->url);
    cairn_strbuf_free(&j->headers);
    free(j->body);
    free(j->session_header);
    free(j->tokens);
    free(j->sticky);
    free(j);
}

/* The job is over (answered, failed, or its client gone): the load it put
 * on its replica ends, the client may send its next request. */
static void job_finish(hjob *j, bool ok)
{
    if (j->over)
        return;
    j->over = true;
    if (j->chosen) /* an answered error renews no prediction */
        route_done(j->r, &j->choice, ok && j->status > 0 && j->status < 400);
    j->chosen = false;
    if (j->up) {
        hup *u = j->up;
        j->up = NULL;
        u->job = NULL;
        rstream_close(&u->s); /* mid-answer: the replica cancels the request */
    }
    hclient *c = j->c;
    if (c) {
        c->job = NULL;
        j->c = NULL;
        c->idle_since = cairn_now();
        if (ok) {
            if (!j->keep_alive)
                rstream_finish(&c->s);
            else
                client_process(c);
        }
    }
    job_free(j);
}

static void job_dispatch(hjob *j)
{
    cairn_router *r = j->r;
    hclient *c = j->c;
    j->attempts++;
    j->choice = (route_choice){.tokens = j->tokens,
                               .n_tokens = j->n_tokens,
                               .max_tokens = j->max_tokens,
                               .tenant = j->tenant,
                               .sticky = j->sticky,
                               .exclude = j->exclude,
                               .need_http = true};
    if (!r->stopping)
        route_choose(r, &j->choice);
    else
        j->choice.slot = -1;
    if (j->choice.slot < 0) {
        r->counters.no_replica++;
        const bool keep = j->keep_alive;
        j->chosen = false;
        c->job = NULL;
        j->c = NULL;
        job_free(j);
        respond_error(c, 503, "no healthy replica can take this request", "no_replica", keep);
        if (!keep)
            rstream_finish(&c->s);
        else
            client_process(c);
        return;
    }
    j->chosen = true;
    bool fresh;
    hup *u = up_get(r, j->choice.slot, &fresh);
    if (!u) {
        job_finish(j, false);
        client_close(c);
        return;
    }
    u->job = j;
    j->up = u;
    j->learn_seen = j->learn_len = 0;
    if (!fresh) {
        send_request(u, j);
        return;
    }
    route_reg_entry e;
    pthread_mutex_lock(&r->reg_mu);
    e = r->reg[j->choice.slot];
    pthread_mutex_unlock(&r->reg_mu);
    if (rstream_connect(&u->s, (const struct sockaddr *)&e.http_addr) != CAIRN_OK) {
        u->job = NULL;
        j->up = NULL;
        rstream_close(&u->s);
        hup tmp = {.got_bytes = false};
        job_upstream_failed(j, &tmp, true, "connect failed");
    }
}

static void decode_work(uv_work_t *w)
{
    hjob *j = (hjob *)w;
    json_error_t jerr;
    json_t *params = cairn_api_json_parse(j->body ? j->body : "", j->body_len, &jerr);
    if (!params)
        return;
    cairn_api_call call;
    cairn_api_error err;
    if (cairn_api_decode(&j->r->api, j->op, params, 0, j->session_header, NULL, &call, &err) ==
        CAIRN_OK) {
        const cairn_request *q = call.req;
        if (q && q->n_tokens && (j->tokens = malloc(q->n_tokens * sizeof *j->tokens))) {
            memcpy(j->tokens, q->tokens, q->n_tokens * sizeof *j->tokens);
            j->n_tokens = q->n_tokens;
        }
        j->decoded = true;
        if (q)
            j->max_tokens = q->gen.max_tokens;
        char hex[33];
        if (q && q->kind == CAIRN_REQ_SESSION_SYNC && q->session_key) {
            size_t n = q->session_key_len + 32;
            if ((j->sticky = malloc(n)))
                snprintf(j->sticky, n, "k:%llx:%.*s", (unsigned long long)j->tenant,
                         (int)q->session_key_len, q->session_key);
        } else if (j->op == CAIRN_API_RESPONSES && call.has_previous) {
            cairn_session_id_to_hex(call.previous, hex);
            if ((j->sticky = malloc(40)))
                snprintf(j->sticky, 40, "s:%s", hex);
        }
        j->learn_response_id = j->op == CAIRN_API_RESPONSES && call.store;
        cairn_api_call_clear(&call);
    }
    json_decref(params);
}

static void decode_done(uv_work_t *w, int status)
{
    (void)status;
    hjob *j = (hjob *)w;
    j->decoding = false;
    if (!j->c) {
        job_free(j);
        return;
    }
    if (!j->decoded)
        j->r->counters.undecodable++;
    job_dispatch(j);
}

static cairn_api_op op_of(unsigned method, const char *path, size_t n)
{
    if (method != HTTP_POST)
        return 0;
#define PATH_IS(p) (n == sizeof(p) - 1 && memcmp(path, p, n) == 0)
    if (PATH_IS("/v1/chat/completions"))
        return CAIRN_API_CHAT;
    if (PATH_IS("/v1/completions"))
        return CAIRN_API_COMPLETION;
    if (PATH_IS("/v1/messages"))
        return CAIRN_API_MESSAGES;
    if (PATH_IS("/v1/responses"))
        return CAIRN_API_RESPONSES;
#undef PATH_IS
    return 0;
}

/* One whole request parsed: answer it here, or make it a job. */
static void handle_request(hclient *c)
{
    cairn_router *r = c->r;
    const bool keep = http_should_keep_alive(&c->p) != 0;
    const char *url = c->url.data ? c->url.data : "/";
    size_t plen = strcspn(url, "?");
    if ((plen == 14 && memcmp(url, "/router/health", 14) == 0) ||
        (plen == 15 && memcmp(url, "/router/metrics", 15) == 0)) {
        size_t len;
        int status = 200;
        char *text = plen == 14 ? route_health_text(r, &status, &len) : route_metrics_text(r, &len);
        respond(c, status, plen == 14 ? "application/json" : "text/plain; version=0.0.4",
                text ? text : "", text ? len : 0, keep);
        free(text);
        if (!keep)
            rstream_finish(&c->s);
        return;
    }
    hjob *j = calloc(1, sizeof *j);
    if (!j) {
        client_close(c);
        return;
    }
    j->r = r;
    j->c = c;
    j->method = c->p.method;
    j->keep_alive = keep;
    j->url = strdup(url);
    j->headers = c->headers;
    c->headers = (cairn_strbuf){0};
    j->body_len = c->body.len;
    j->body = c->body.data;
    c->body = (cairn_strbuf){0};
    j->session_header = c->session_header;
    c->session_header = NULL;
    /* the tenant whose pages the replica will use: from the token it checks */
    const char *auth = c->authorization;
    if (auth && strncasecmp(auth, "Bearer ", 7) == 0)
        j->tenant = route_tenant_of(r, auth + 7, strlen(auth + 7));
    else if (c->api_key)
        j->tenant = route_tenant_of(r, c->api_key, strlen(c->api_key));
    c->job = j;
    r->counters.requests_http++;
    /* GET/DELETE /v1/responses/resp_HEX: that stored response's session */
    static const char rp[] = "/v1/responses/resp_";
    if (plen == sizeof rp - 1 + 32 && memcmp(url, rp, sizeof rp - 1) == 0) {
        if ((j->sticky = malloc(40)))
            snprintf(j->sticky, 40, "s:%.32s", url + sizeof rp - 1);
    }
    j->op = op_of(j->method, url, plen);
    if (!j->url || !j->op) {
        job_dispatch(j);
        return;
    }
    j->decoding = true;
    if (uv_queue_work(&r->loop, &j->work, decode_work, decode_done) != 0) {
        j->decoding = false;
        job_dispatch(j); /* route it undecoded */
    }
}

static void client_process(hclient *c)
{
    while (!c->job && !c->s.closing && c->in_off < c->in_len) {
        size_t n = http_parser_execute(&c->p, &g_req_settings, c->in + c->in_off,
                                       c->in_len - c->in_off);
        c->in_off += n;
        if (c->message_done) {
            c->message_done = false;
            http_parser_pause(&c->p, 0);
            handle_request(c);
            continue;
        }
        enum http_errno err = HTTP_PARSER_ERRNO(&c->p);
        if (err != HPE_OK) {
            int status = c->error_status ? c->error_status : 400;
            respond_error(c, status, c->error_status ? c->error_message : http_errno_description(err),
                          NULL, false);
            rstream_finish(&c->s);
            return;
        }
    }
    if (c->in_off == c->in_len)
        c->in_off = c->in_len = 0;
    /* a client that sends more than one request ahead is not read further */
    const bool full = c->in_len - c->in_off > c->r->cfg.max_body_bytes + c->r->cfg.max_header_bytes;
    if (!c->s.closing)
        rstream_read(&c->s, !full);
}

static void client_read(rstream *s, const char *buf, ssize_t n)
{
    hclient *c = s->owner;
    if (n < 0) {
        client_close(c);
        return;
    }
    if (c->in_off > 0 && c->in_off == c->in_len)
        c->in_off = c->in_len = 0;
    if (c->in_len + (size_t)n > c->in_cap) {
        if (c->in_off > 0) {
            memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
            c->in_len -= c->in_off;
            c->in_off = 0;
        }
        size_t cap = c->in_cap ? c->in_cap : 16384;
        while (cap < c->in_len + (size_t)n)
            cap *= 2;
        char *p = realloc(c->in, cap);
        if (!p) {
            client_close(c);
            return;
        }
        c->in = p;
        c->in_cap = cap;
    }
    memcpy(c->in + c->in_len, buf, (size_t)n);
    c->in_len += (size_t)n;
    if (!c->job)
        client_process(c);
    else if (c->in_len - c->in_off > c->r->cfg.max_body_bytes + c->r->cfg.max_header_bytes)
        rstream_read(&c->s, false);
}

static void client_close(hclient *c)
{
    hjob *j = c->job;
    if (j) {
        c->job = NULL;
        j->c = NULL;
        if (!j->decoding)
            job_finish(j, false);
        /* else decode_done frees it */
    }
    rstream_close(&c->s);
}

static void client_closed(rstream *s)
{
    hclient *c = s->owner;
    if (c->prev)
        c->prev->next = c->next;
    else
        c->r->http_clients = c->next;
    if (c->next)
        c->next->prev = c->prev;
    if (c->job) {
        hjob *j = c->job;
        c->job = NULL;
        j->c = NULL;
        if (!j->decoding)
            job_finish(j, false);
    }
    free(c->in);
    cairn_strbuf_free(&c->url);
    cairn_strbuf_free(&c->field);
    cairn_strbuf_free(&c->value);
    cairn_strbuf_free(&c->headers);
    cairn_strbuf_free(&c->body);
    free(c->authorization);
    free(c->session_header);
    free(c->api_key);
    free(c);
}

static void settings_init(void)
{
    if (g_settings_ready)
        return;
    g_settings_ready = true;
    g_req_settings.on_message_begin = req_message_begin;
    g_req_settings.on_url = req_url;
    g_req_settings.on_header_field = req_header_field;
    g_req_settings.on_header_value = req_header_value;
    g_req_settings.on_headers_complete = req_headers_complete;
    g_req_settings.on_body = req_body;
    g_req_settings.on_message_complete = req_message_complete;
    g_resp_settings.on_message_begin = resp_message_begin;
    g_resp_settings.on_header_field = resp_header_field;
    g_resp_settings.on_header_value = resp_header_value;
    g_resp_settings.on_headers_complete = resp_headers_complete;
    g_resp_settings.on_body = resp_body;
    g_resp_settings.on_message_complete = resp_message_complete;
}

void route_http_accept(cairn_router *r, uv_stream_t *listener)
{
    settings_init();
    hclient *c = calloc(1, sizeof *c);
    if (!c)
        return;
    c->r = r;
    rstream_init(&r->loop, &c->s, c);
    c->s.on_read = client_read;
    c->s.on_close = client_closed;
    c->s.max_pending = r->cfg.max_output_bytes;
    c->idle_since = cairn_now();
    c->next = r->http_clients; /* before anything can close it */
    if (c->next)
        c->next->prev = c;
    r->http_clients = c;
    if (rstream_accept(listener, &c->s) != CAIRN_OK) {
        rstream_close(&c->s);
        return;
    }
    http_parser_init(&c->p, HTTP_REQUEST);
    c->p.data = c;
    rstream_read(&c->s, true);
}

void route_http_sweep(cairn_router *r, double now)
{
    for (hclient *c = r->http_clients, *next; c; c = next) {
        next = c->next;
        if (c->job || c->s.closing || now - c->idle_since < r->cfg.http_timeout_s)
            continue;
        if (c->in_len > c->in_off || c->url.len || c->headers.len || c->body.len) {
            respond_error(c, 408, "the request was not received in time", NULL, false);
            rstream_finish(&c->s);
        } else {
            rstream_close(&c->s); /* an idle keep-alive connection */
        }
    }
}
