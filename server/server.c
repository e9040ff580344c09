/*
 * protocol/server.c — the libuv server: listeners, connections, and the
 * bridge between the loop thread and the engine thread (see protocol.h for
 * the threads, ownership and connection life cycle).
 *
 * Rules this file keeps:
 *  - Only the loop thread touches libuv handles and connections. The engine
 *    thread's callback (on_engine_event) copies the event into a node, links
 *    it into `queue` under `queue_mu`, and wakes the loop with uv_async_send.
 *  - Events name their connection by id; the loop looks it up in the table
 *    and drops events whose connection has gone (closed, or lingering).
 *  - A connection's memory is freed only from the close callback of the
 *    last of its two handles (stream and timer), so libuv never calls back
 *    into freed memory; write callbacks that run during close only free
 *    their own buffer.
 *  - Bytes from a client are buffered only up to what the scanner allows: a
 *    message in progress (<= max_message_bytes) plus one read's worth.
 *  - A connection that has not authenticated (when credentials exist) gets
 *    no decoding beyond the envelope, smaller limits, no second chance after
 *    an error, and a deadline to authenticate (protocol.h, section 3).
 */
#include "server/server.h"
#include "server/http_impl.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#define READ_CHUNK (64 * 1024)
#define N_BUCKETS 4096 /* client ids are sequential, so id % N spreads evenly */
#define LINGER_S 5.0   /* after a fatal error: how long to wait for the client's EOF */

typedef struct {
    uint32_t msgid;
    cairn_rpc_method method;
    char *tools_json; /* session.generate: read the reply for these tools'
                         calls (owned; NULL: none) */
} pending;

typedef struct conn {
    union {
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } sock;
    uv_stream_t *stream; /* &sock.tcp or &sock.pipe                      */
    uv_timer_t timer;    /* idle timeout / linger deadline              */
    cairn_server *srv;
    uint64_t id;
    struct conn *next; /* bucket chain                                   */
    struct conn *all_prev, *all_next; /* every live connection, attached or not */
    int open_handles;  /* handles not yet closed; freed at 0            */
    bool attached;     /* in the table: requests and events flow        */
    bool closing;      /* uv_close was called                           */
    bool lingering;    /* answered a fatal error; closing after EOF      */
    bool authed;       /* may make requests (always, without credentials) */
    uint64_t tenant;   /* given to every request (0: no tenants)         */
    const char *tenant_name; /* owned by the server's cairn_access       */
    /* Input: in[in_off .. in_len) is unprocessed; the first `scanned` of
     * those bytes are the current message as far as the scanner got. */
    uint8_t *in;
    size_t in_len, in_cap, in_off, scanned;
    cairn_mp_scanner sc;
    bool skipping; /* discarding the rest of an over-limit message        */
    pending *pend;
    int n_pend, cap_pend;
    uv_shutdown_t shutdown_req;
} conn;

/* An event copied off the engine thread; its pointers point into the node. */
typedef struct ev_node {
    struct ev_node *next;
    cairn_event ev;
} ev_node;

typedef struct {
    uv_write_t req;
    char *data; /* the whole packed message (owned)                      */
} write_op;

struct cairn_server {
    uv_loop_t loop;
    bool loop_ready;
    uv_tcp_t tcp;
    bool has_tcp;
    int tcp_port;
    char tcp_desc[128];
    uv_pipe_t pipe;
    bool has_pipe;
    char *unix_path;
    uv_signal_t sigint, sigterm;
    bool has_signals;
    uv_async_t events_async, stop_async;
    bool has_asyncs;
    cairn_http *http;         /* the OpenAI facade, when configured      */

    cairn_server_config cfg;
    cairn_access *access;     /* credentials; requires nothing when there are none */
    cairn_mp_limits preauth_limits;
    cairn_runtime *rt;        /* opened after binding, closed after the loop */
    cairn_service *svc;
    cairn_rpc_context rctx;
    uint64_t next_client_id;
    uint64_t seed_state;
    bool stopping;

    conn *buckets[N_BUCKETS]; /* attached connections by id              */
    conn *all;                /* every connection until its memory is freed */

    pthread_mutex_t queue_mu;
    ev_node *queue_head, *queue_tail;
};

void cairn_server_config_default(cairn_server_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->host = "127.0.0.1";
    cfg->port = 7077;
    cairn_mp_limits_default(&cfg->limits);
    cfg->max_output_bytes = 16u << 20;
    cfg->idle_timeout_s = 60;
    cfg->max_inflight = 256;
    cfg->http.port = -1;
    cfg->http.max_body_bytes = 4u << 20;
    cfg->http.max_header_bytes = 32u << 10;
    cfg->http.timeout_s = 30;
    cfg->http.max_session_keys = 1024;
    cfg->service.page_size = 16;
    cfg->service.kv_type = CAIRN_TYPE_F16;
}

/* ---- connection table ------------------------------------------------------ */

static conn *table_find(cairn_server *s, uint64_t id)
{
    for (conn *c = s->buckets[id % N_BUCKETS]; c; c = c->next)
        if (c->id == id)
            return c;
    return NULL;
}

static void table_insert(cairn_server *s, conn *c)
{
    conn **b = &s->buckets[c->id % N_BUCKETS];
    c->next = *b;
    *b = c;
    c->attached = true;
}

static void table_remove(cairn_server *s, conn *c)
{
    for (conn **p = &s->buckets[c->id % N_BUCKETS]; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    c->attached = false;
}

/* ---- pending requests of a connection -------------------------------------- */

static pending *pending_find(conn *c, uint32_t msgid)
{
    for (int i = 0; i < c->n_pend; i++)
        if (c->pend[i].msgid == msgid)
            return &c->pend[i];
    return NULL;
}

static int pending_add(conn *c, uint32_t msgid, cairn_rpc_method m)
{
    if (c->n_pend == c->cap_pend) {
        int cap = c->cap_pend ? c->cap_pend * 2 : 8;
        pending *p = realloc(c->pend, (size_t)cap * sizeof *p);
        if (!p)
            return CAIRN_ENOMEM;
        c->pend = p;
        c->cap_pend = cap;
    }
    c->pend[c->n_pend++] = (pending){msgid, m, NULL};
    return CAIRN_OK;
}

static void pending_remove(conn *c, pending *p)
{
    free(p->tools_json);
    *p = c->pend[--c->n_pend];
}

/* ---- closing ----------------------------------------------------------------- */

static void conn_free(conn *c)
{
    cairn_server *s = c->srv;
    if (c->all_prev)
        c->all_prev->all_next = c->all_next;
    else if (s->all == c)
        s->all = c->all_next;
    if (c->all_next)
        c->all_next->all_prev = c->all_prev;
    free(c->in);
    for (int i = 0; i < c->n_pend; i++)
        free(c->pend[i].tools_json);
    free(c->pend);
    free(c);
}

static void on_handle_closed(uv_handle_t *h)
{
    conn *c = h->data;
    if (--c->open_handles == 0)
        conn_free(c);
}

/* Leave the table: events for this client are dropped from now on, and the
 * engine cancels its work and releases its pages. */
static void conn_detach(conn *c)
{
    if (!c->attached)
        return;
    table_remove(c->srv, c);
    if (!c->srv->stopping && c->srv->svc) {
        cairn_request *r = cairn_request_new(CAIRN_REQ_CLIENT_GONE);
        if (r) {
            r->client = c->id;
            cairn_service_submit(c->srv->svc, r);
        }
    }
}

static void conn_close(conn *c)
{
    if (c->closing)
        return;
    c->closing = true;
    conn_detach(c);
    cairn_log(CAIRN_LOG_DEBUG, "client %llu: closed", (unsigned long long)c->id);
    uv_close((uv_handle_t *)c->stream, on_handle_closed);
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    (void)req;
    (void)status; /* EOF from the client, or the linger timer, closes it */
}

static void on_linger_timeout(uv_timer_t *t) { conn_close(t->data); }

/* After answering a message that leaves the stream unreadable: stop acting
 * on input, let the answer drain, send FIN, and close on the client's EOF
 * (or after LINGER_S). Closing at once could reset the connection while the
 * client is still sending, and a reset can destroy the answer unread. */
static void conn_linger(conn *c)
{
    if (c->closing || c->lingering)
        return;
    c->lingering = true;
    conn_detach(c);
    c->in_len = c->in_off = c->scanned = 0;
    if (uv_shutdown(&c->shutdown_req, c->stream, on_shutdown) != 0) {
        conn_close(c);
        return;
    }
    uv_timer_start(&c->timer, on_linger_timeout, (uint64_t)(LINGER_S * 1000), 0);
}

/* ---- writing ------------------------------------------------------------------ */

static void on_write(uv_write_t *req, int status)
{
    write_op *w = (write_op *)req;
    conn *c = req->handle->data;
    free(w->data);
    free(w);
    if (status < 0 && status != UV_ECANCELED)
        conn_close(c);
}

/* Send one packed message; takes the sbuffer's memory in every case. */
static void conn_send(conn *c, msgpack_sbuffer *sb)
{
    size_t len = sb->size;
    char *data = msgpack_sbuffer_release(sb);
    if (c->closing || !c->attached || len == 0) {
        free(data);
        return;
    }
    /* Backpressure: a client that does not read its answers cannot make us
     * hold an unbounded amount of them. One answer is always accepted into
     * an empty queue, so a single large (but limited) answer still goes out
     * to a client that reads. */
    size_t queued = uv_stream_get_write_queue_size(c->stream);
    if (queued > 0 && queued + len > c->srv->cfg.max_output_bytes) {
        cairn_log(CAIRN_LOG_WARN, "client %llu: %zu bytes of output unread; disconnecting",
                  (unsigned long long)c->id, queued + len);
        free(data);
        conn_close(c);
        return;
    }
    uv_buf_t buf = uv_buf_init(data, (unsigned)len);
    int n = uv_try_write(c->stream, &buf, 1);
    if (n == (int)len) {
        free(data);
        return;
    }
    if (n < 0 && n != UV_EAGAIN) {
        free(data);
        conn_close(c);
        return;
    }
    if (n < 0)
        n = 0;
    write_op *w = malloc(sizeof *w);
    if (!w) {
        free(data);
        conn_close(c);
        return;
    }
    w->data = data;
    buf = uv_buf_init(data + n, (unsigned)(len - (size_t)n));
    if (uv_write(&w->req, c->stream, &buf, 1, on_write) != 0) {
        free(data);
        free(w);
        conn_close(c);
    }
}

static void send_error(conn *c, uint32_t msgid, int code, const char *message)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    if (cairn_rpc_pack_error(&sb, msgid, code, message) == CAIRN_OK)
        conn_send(c, &sb);
    else
        conn_close(c);
    msgpack_sbuffer_destroy(&sb);
}

/* ---- requests ------------------------------------------------------------------ */

static const cairn_req_kind req_kind_of[] = {
    [CAIRN_RPC_GENERATE] = CAIRN_REQ_GENERATE,
    [CAIRN_RPC_SESSION_OPEN] = CAIRN_REQ_SESSION_OPEN,
    [CAIRN_RPC_SESSION_APPEND] = CAIRN_REQ_SESSION_APPEND,
    [CAIRN_RPC_SESSION_GENERATE] = CAIRN_REQ_SESSION_GENERATE,
    [CAIRN_RPC_SESSION_FORK] = CAIRN_REQ_SESSION_FORK,
    [CAIRN_RPC_SESSION_TRUNCATE] = CAIRN_REQ_SESSION_TRUNCATE,
    [CAIRN_RPC_SESSION_CLOSE] = CAIRN_REQ_SESSION_CLOSE,
    [CAIRN_RPC_SESSION_INFO] = CAIRN_REQ_SESSION_INFO,
    [CAIRN_RPC_GEN_CANCEL] = CAIRN_REQ_CANCEL,
    [CAIRN_RPC_CACHE_STATS] = CAIRN_REQ_CACHE_STATS,
};

/* Hand a decoded call to the engine. Consumes the call. */
static void submit_call(conn *c, cairn_rpc_call *call)
{
    cairn_server *s = c->srv;
    const uint32_t msgid = call->msgid;
    if (pending_find(c, msgid)) {
        send_error(c, msgid, CAIRN_RPC_INVALID_REQUEST, "this msgid is already in flight");
        return;
    }
    if (c->n_pend >= s->cfg.max_inflight) {
        send_error(c, msgid, CAIRN_RPC_OVERLOADED, "too many requests in flight on this connection");
        return;
    }
    cairn_request *r = cairn_request_new(req_kind_of[call->method]);
    if (!r || pending_add(c, msgid, call->method) != CAIRN_OK) {
        cairn_request_free(r);
        send_error(c, msgid, CAIRN_RPC_OVERLOADED, "out of memory");
        return;
    }
    r->client = c->id;
    r->id = msgid;
    r->tenant = c->tenant;
    r->session = call->session;
    r->tokens = call->tokens; /* ownership moves to the request */
    r->n_tokens = call->n_tokens;
    call->tokens = NULL;
    call->n_tokens = 0;
    if (call->method == CAIRN_RPC_GENERATE || call->method == CAIRN_RPC_SESSION_GENERATE) {
        r->gen = call->gen; /* the stop strings and the grammar move too */
        call->gen.n_stop = 0;
        call->gen.grammar = NULL;
        pending_find(c, msgid)->tools_json = call->tools_json; /* for the reply */
        call->tools_json = NULL;
    }
    r->target = call->target;
    r->n_keep = call->n_keep;
    r->persist = call->persist;
    r->chat_turn = call->chat_turn;
    int rc = cairn_service_submit(s->svc, r);
    if (rc != CAIRN_OK) {
        pending_remove(c, pending_find(c, msgid));
        send_error(c, msgid, rc == CAIRN_ECLOSED ? CAIRN_RPC_OVERLOADED : rc,
                   "the engine is not accepting requests");
    }
}

static const cairn_mp_limits *conn_limits(const conn *c)
{
    return c->authed ? &c->srv->cfg.limits : &c->srv->preauth_limits;
}

/* Answer an error and close once it is written: how every failure of an
 * unauthenticated connection, and every wrong token, ends. */
static void refuse(conn *c, uint32_t msgid, int code, const char *message)
{
    send_error(c, msgid, code, message);
    conn_linger(c);
}

/* auth {token}: check it and answer {tenant}. */
static void handle_auth(conn *c, const cairn_rpc_call *call)
{
    cairn_server *s = c->srv;
    uint64_t tenant;
    const char *name;
    if (cairn_access_check(s->access, call->token, call->token_len, &tenant, &name) != CAIRN_OK) {
        cairn_log(CAIRN_LOG_WARN, "client %llu: wrong token; closing",
                  (unsigned long long)c->id);
        refuse(c, call->msgid, CAIRN_RPC_UNAUTHORIZED, "wrong token");
        return;
    }
    if (c->authed && tenant != c->tenant) {
        /* Switching tenants under requests already running would blur whose
         * they are; a client that needs two tenants opens two connections. */
        send_error(c, call->msgid, CAIRN_RPC_INVALID_REQUEST,
                   "this connection is authenticated as another tenant");
        return;
    }
    if (!c->authed) {
        c->authed = true;
        c->tenant = tenant;
        c->tenant_name = name;
        uv_timer_stop(&c->timer); /* the deadline to authenticate */
        if (name)
            cairn_log(CAIRN_LOG_DEBUG, "client %llu: tenant %s", (unsigned long long)c->id,
                      name);
    }
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    if (cairn_rpc_pack_auth(&sb, call->msgid, c->tenant_name) == CAIRN_OK)
        conn_send(c, &sb);
    else
        send_error(c, call->msgid, CAIRN_RPC_OVERLOADED, "out of memory");
    msgpack_sbuffer_destroy(&sb);
}

static void handle_message(conn *c, const uint8_t *msg, size_t len)
{
    cairn_server *s = c->srv;
    cairn_rpc_call call;
    cairn_rpc_error err;
    int rc = c->authed ? cairn_rpc_decode(&s->rctx, msg, len, &s->seed_state, &call, &err)
                       : cairn_rpc_decode_preauth(msg, len, &call, &err);
    if (rc == CAIRN_ECLOSED)
        return; /* a notification from the client; none is defined */
    if (rc != CAIRN_OK) {
        if (!err.has_msgid)
            conn_close(c); /* not a request at all: nothing to answer */
        else if (!c->authed)
            refuse(c, err.msgid, err.code, err.message);
        else
            send_error(c, err.msgid, err.code, err.message);
        return;
    }
    if (call.method == CAIRN_RPC_AUTH) {
        handle_auth(c, &call);
        cairn_rpc_call_clear(&call);
        return;
    }
    if (call.method != CAIRN_RPC_SERVER_INFO && call.method != CAIRN_RPC_TOKENIZE &&
        call.method != CAIRN_RPC_DETOKENIZE) {
        submit_call(c, &call);
        cairn_rpc_call_clear(&call);
        return;
    }
    /* Answered here on the loop thread: no engine state is involved. */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    switch (call.method) {
    case CAIRN_RPC_SERVER_INFO: {
        cairn_rpc_server_info info = {
            .version = CAIRN_VERSION,
            .hparams = cairn_service_hparams(s->svc),
            .n_ctx = s->rctx.n_ctx,
            .page_size = cairn_service_page_size(s->svc),
            .limits = s->rctx.limits,
        };
        rc = cairn_rpc_pack_server_info(&sb, call.msgid, &info);
        break;
    }
    case CAIRN_RPC_TOKENIZE: rc = cairn_rpc_pack_tokenize(&sb, &call); break;
    default: rc = cairn_rpc_pack_detokenize(&sb, &s->rctx, &call); break;
    }
    if (rc == CAIRN_OK)
        conn_send(c, &sb);
    else
        send_error(c, call.msgid, CAIRN_RPC_OVERLOADED, "out of memory");
    msgpack_sbuffer_destroy(&sb);
    cairn_rpc_call_clear(&call);
}

/* ---- reading -------------------------------------------------------------------- */

static void on_auth_timeout(uv_timer_t *t)
{
    conn *c = t->data;
    cairn_log(CAIRN_LOG_INFO, "client %llu: did not authenticate in time; closing",
              (unsigned long long)c->id);
    conn_close(c);
}

static void on_idle_timeout(uv_timer_t *t)
{
    conn *c = t->data;
    cairn_log(CAIRN_LOG_INFO, "client %llu: half a message and no more bytes; closing",
              (unsigned long long)c->id);
    conn_close(c);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    conn *c = h->data;
    /* Move the unprocessed bytes to the front before growing. */
    if (c->in_off > 0) {
        memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
        c->in_len -= c->in_off;
        c->in_off = 0;
    }
    if (c->in_cap - c->in_len < READ_CHUNK) {
        size_t cap = c->in_cap ? c->in_cap : READ_CHUNK;
        while (cap - c->in_len < READ_CHUNK)
            cap *= 2;
        uint8_t *in = realloc(c->in, cap);
        if (!in) {
            *buf = uv_buf_init(NULL, 0); /* the read callback gets UV_ENOBUFS */
            return;
        }
        c->in = in;
        c->in_cap = cap;
    }
    *buf = uv_buf_init((char *)c->in + c->in_len, (unsigned)(c->in_cap - c->in_len));
}

/* Act on every complete message in the buffer; keep the partial tail. */
static void process_input(conn *c)
{
    while (!c->closing && !c->lingering) {
        uint8_t *msg = c->in + c->in_off;
        size_t avail = c->in_len - c->in_off;
        size_t used;
        bool complete;
        int rc = cairn_mp_scan(&c->sc, msg + c->scanned, avail - c->scanned, &used, &complete);
        c->scanned += used;
        if (rc == CAIRN_OK) {
            if (complete && !c->skipping)
                handle_message(c, msg, c->scanned);
            if (complete || c->skipping) {
                /* Skipped bytes are dropped as soon as they are scanned. */
                c->in_off += c->scanned;
                c->scanned = 0;
            }
            if (!complete)
                break;
            c->skipping = false;
            cairn_mp_scanner_reset(&c->sc, conn_limits(c));
            continue;
        }
        uint32_t msgid;
        bool answerable = !c->skipping && cairn_rpc_peek_msgid(msg, avail, &msgid);
        int code = rc == CAIRN_ERANGE ? CAIRN_RPC_TOO_LARGE : CAIRN_RPC_INVALID_REQUEST;
        if (!answerable) {
            cairn_log(CAIRN_LOG_INFO, "client %llu: %s; closing", (unsigned long long)c->id,
                      c->sc.error ? c->sc.error : "malformed input");
            conn_close(c);
            return;
        }
        send_error(c, msgid, code, c->sc.error);
        if (rc == CAIRN_ERANGE && c->sc.can_skip && c->authed) {
            /* Resynchronise: discard the rest of this message as it comes. */
            c->in_off += c->scanned;
            c->scanned = 0;
            cairn_mp_scanner_skip(&c->sc);
            c->skipping = true;
            continue;
        }
        conn_linger(c);
        return;
    }
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    conn *c = stream->data;
    if (c->closing)
        return;
    if (nread < 0) { /* EOF, reset, or UV_ENOBUFS */
        conn_close(c);
        return;
    }
    if (c->lingering) /* only waiting for EOF; bytes are ignored */
        return;
    c->in_len += (size_t)nread;
    process_input(c);
    if (c->closing || c->lingering)
        return;
    if (c->in_off == c->in_len) {
        c->in_off = c->in_len = 0;
        /* Do not keep a big message's buffer on an idle connection. */
        if (c->in_cap > 4 * READ_CHUNK) {
            free(c->in);
            c->in = NULL;
            c->in_cap = 0;
        }
    }
    if (!c->authed)
        return; /* the deadline to authenticate set at accept keeps running */
    /* A half-received message (or one being skipped) must keep arriving. */
    if (c->in_len > c->in_off || c->skipping)
        uv_timer_start(&c->timer, on_idle_timeout, (uint64_t)(c->srv->cfg.idle_timeout_s * 1000),
                       0);
    else
        uv_timer_stop(&c->timer);
}

static void on_connection(uv_stream_t *listener, int status)
{
    cairn_server *s = listener->data;
    if (status < 0) {
        cairn_log(CAIRN_LOG_WARN, "accept: %s", uv_strerror(status));
        return;
    }
    if (s->stopping)
        return;
    conn *c = calloc(1, sizeof *c);
    if (!c)
        return; /* the connection stays in the backlog; tried again later */
    c->srv = s;
    c->all_next = s->all;
    if (s->all)
        s->all->all_prev = c;
    s->all = c;
    bool is_tcp = listener == (uv_stream_t *)&s->tcp;
    if (is_tcp) {
        uv_tcp_init(&s->loop, &c->sock.tcp);
        c->stream = (uv_stream_t *)&c->sock.tcp;
    } else {
        uv_pipe_init(&s->loop, &c->sock.pipe, 0);
        c->stream = (uv_stream_t *)&c->sock.pipe;
    }
    uv_timer_init(&s->loop, &c->timer);
    c->stream->data = c->timer.data = c;
    c->open_handles = 2;
    if (uv_accept(listener, c->stream) != 0) {
        c->closing = true;
        uv_close((uv_handle_t *)c->stream, on_handle_closed);
        uv_close((uv_handle_t *)&c->timer, on_handle_closed);
        return;
    }
    if (is_tcp)
        uv_tcp_nodelay(&c->sock.tcp, 1); /* streamed tokens should not wait for Nagle */
    c->id = ++s->next_client_id;
    c->authed = !cairn_access_required(s->access);
    cairn_mp_scanner_reset(&c->sc, conn_limits(c));
    if (!c->authed)
        uv_timer_start(&c->timer, on_auth_timeout, (uint64_t)(s->cfg.idle_timeout_s * 1000), 0);
    table_insert(s, c);
    cairn_log(CAIRN_LOG_DEBUG, "client %llu: connected", (unsigned long long)c->id);
    if (uv_read_start(c->stream, on_alloc, on_read) != 0)
        conn_close(c);
}

/* ---- events from the engine thread -------------------------------------------------- */

/* Engine thread. Copy the event (it is valid only during this call), queue
 * it, wake the loop. Never touches a connection. */
static void on_engine_event(const cairn_event *ev, void *user)
{
    cairn_server *s = user;
    size_t msg_len = ev->message ? strlen(ev->message) + 1 : 0;
    size_t fr_len = ev->finish_reason ? strlen(ev->finish_reason) + 1 : 0;
    size_t tok_bytes = ev->n_tokens * sizeof(int32_t);
    size_t text_len = ev->text ? ev->text_len : 0;
    size_t lp_bytes = ev->logprobs ? ev->n_tokens * (size_t)(1 + ev->n_top) *
                                         sizeof(cairn_token_logprob)
                                   : 0;
    ev_node *n = malloc(sizeof *n + lp_bytes + tok_bytes + text_len + 1 + msg_len + fr_len);
    if (n) {
        n->ev = *ev;
        char *p = (char *)(n + 1);
        if (lp_bytes) /* first: the node's end is aligned for it */
            memcpy(p, ev->logprobs, lp_bytes);
        n->ev.logprobs = ev->logprobs ? (const cairn_token_logprob *)p : NULL;
        p += lp_bytes;
        if (ev->n_tokens)
            memcpy(p, ev->tokens, tok_bytes);
        n->ev.tokens = (const int32_t *)p;
        p += tok_bytes;
        if (text_len)
            memcpy(p, ev->text, text_len);
        p[text_len] = '\0';
        n->ev.text = p;
        n->ev.text_len = text_len;
        p += text_len + 1;
        if (msg_len) {
            memcpy(p, ev->message, msg_len);
            n->ev.message = p;
            p += msg_len;
        }
        if (fr_len) {
            memcpy(p, ev->finish_reason, fr_len);
            n->ev.finish_reason = p;
        }
    } else if (ev->kind != CAIRN_EV_DELTA) {
        /* The answer must not be lost: send a short error instead. */
        n = malloc(sizeof *n);
        if (!n) {
            cairn_log(CAIRN_LOG_ERROR, "out of memory: the answer to request %llu is lost",
                      (unsigned long long)ev->id);
            return;
        }
        memset(&n->ev, 0, sizeof n->ev);
        n->ev.kind = CAIRN_EV_ERROR;
        n->ev.client = ev->client;
        n->ev.id = ev->id;
        n->ev.code = CAIRN_ENOMEM;
        n->ev.message = "out of memory while reporting the result";
    } else {
        return; /* a lost delta; the final answer still carries all the text */
    }
    n->next = NULL;
    pthread_mutex_lock(&s->queue_mu);
    if (s->queue_tail)
        s->queue_tail->next = n;
    else
        s->queue_head = n;
    s->queue_tail = n;
    pthread_mutex_unlock(&s->queue_mu);
    uv_async_send(&s->events_async);
}

static ev_node *queue_take_all(cairn_server *s)
{
    pthread_mutex_lock(&s->queue_mu);
    ev_node *n = s->queue_head;
    s->queue_head = s->queue_tail = NULL;
    pthread_mutex_unlock(&s->queue_mu);
    return n;
}

static void on_events(uv_async_t *a)
{
    cairn_server *s = a->data;
    for (ev_node *n = queue_take_all(s), *next; n; n = next) {
        next = n->next;
        const cairn_event *ev = &n->ev;
        if (ev->client & CAIRN_HTTP_CLIENT_BIT) { /* the HTTP facade's */
            if (s->http)
                cairn_http_on_event(s->http, ev);
            free(n);
            continue;
        }
        conn *c = table_find(s, ev->client);
        pending *p = c ? pending_find(c, (uint32_t)ev->id) : NULL;
        if (p) {
            msgpack_sbuffer sb;
            msgpack_sbuffer_init(&sb);
            cairn_rpc_method method = p->method;
            /* A finished generation of a request with tools: its calls. */
            char *calls_json = NULL, *content = NULL;
            if (ev->kind == CAIRN_EV_DONE && ev->what == CAIRN_DONE_GENERATION &&
                p->tools_json && s->rctx.chat_template) {
                /* ids unique on the server: call_<connection>_<msgid>_<n> */
                char prefix[64];
                snprintf(prefix, sizeof prefix, "call_%llu_%u_", (unsigned long long)c->id,
                         p->msgid);
                cairn_chat_parse_tool_calls(s->rctx.chat_template, ev->text ? ev->text : "",
                                            ev->text ? ev->text_len : 0, p->tools_json, prefix,
                                            &calls_json, &content);
            }
            const cairn_rpc_tool_calls calls = {calls_json, content};
            if (ev->kind != CAIRN_EV_DELTA)
                pending_remove(c, p);
            if (cairn_rpc_pack_event(&sb, method, ev, calls_json ? &calls : NULL) == CAIRN_OK)
                conn_send(c, &sb);
            else if (ev->kind != CAIRN_EV_DELTA)
                send_error(c, (uint32_t)ev->id, CAIRN_ENOMEM, "out of memory");
            msgpack_sbuffer_destroy(&sb);
            free(calls_json);
            free(content);
        }
        free(n);
    }
}

/* ---- start, run, stop ------------------------------------------------------------------ */

static void close_if(uv_handle_t *h, bool *flag)
{
    if (*flag && !uv_is_closing(h))
        uv_close(h, NULL);
    *flag = false;
}

static void begin_shutdown(cairn_server *s)
{
    if (s->stopping)
        return;
    s->stopping = true;
    if (s->svc)
        cairn_log(CAIRN_LOG_INFO, "shutting down");
    close_if((uv_handle_t *)&s->tcp, &s->has_tcp);
    close_if((uv_handle_t *)&s->pipe, &s->has_pipe);
    if (s->has_signals) {
        uv_close((uv_handle_t *)&s->sigint, NULL);
        uv_close((uv_handle_t *)&s->sigterm, NULL);
        s->has_signals = false;
    }
    /* Lingering connections are no longer in the table, hence the list. */
    for (conn *c = s->all; c; c = c->all_next)
        conn_close(c);
    cairn_http_shutdown(s->http);
    /* After this returns no event can be emitted, so the async handle that
     * the engine thread signals may be closed. */
    cairn_service_stop(s->svc);
    s->svc = NULL;
    for (ev_node *n = queue_take_all(s), *next; n; n = next) {
        next = n->next;
        free(n);
    }
    if (s->has_asyncs) {
        uv_close((uv_handle_t *)&s->events_async, NULL);
        uv_close((uv_handle_t *)&s->stop_async, NULL);
        s->has_asyncs = false;
    }
}

static void on_signal(uv_signal_t *h, int signum)
{
    cairn_log(CAIRN_LOG_INFO, "signal %d", signum);
    begin_shutdown(h->data);
}

static void on_stop(uv_async_t *a) { begin_shutdown(a->data); }

static int bind_tcp(cairn_server *s, char *err, size_t err_len)
{
    const cairn_server_config *cfg = &s->cfg;
    struct sockaddr_storage addr;
    if (uv_ip4_addr(cfg->host, cfg->port, (struct sockaddr_in *)&addr) != 0 &&
        uv_ip6_addr(cfg->host, cfg->port, (struct sockaddr_in6 *)&addr) != 0)
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "'%s' is not an IP address", cfg->host);
    uv_tcp_init(&s->loop, &s->tcp);
    s->tcp.data = s;
    s->has_tcp = true;
    int rc = uv_tcp_bind(&s->tcp, (const struct sockaddr *)&addr, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&s->tcp, 128, on_connection);
    if (rc != 0)
        return cairn_errorf(err, err_len, CAIRN_EIO, "cannot listen on %s port %d: %s", cfg->host,
                     cfg->port, uv_strerror(rc));
    struct sockaddr_storage bound;
    int len = sizeof bound;
    uv_tcp_getsockname(&s->tcp, (struct sockaddr *)&bound, &len);
    s->tcp_port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                    : ((struct sockaddr_in *)&bound)->sin_port);
    snprintf(s->tcp_desc, sizeof s->tcp_desc, bound.ss_family == AF_INET6 ? "[%s]:%d" : "%s:%d",
             cfg->host, s->tcp_port);
    return CAIRN_OK;
}

/* A socket file left by a server that died is removed; one a live server
 * listens on, or a file that is not a socket, is left alone. */
static int clear_stale_socket(const char *path, char *err, size_t err_len)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? CAIRN_OK
                               : cairn_errorf(err, err_len, CAIRN_EIO, "%s: %s", path, strerror(errno));
    if (!S_ISSOCK(st.st_mode))
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "%s exists and is not a socket", path);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0)
        return cairn_errorf(err, err_len, CAIRN_EIO, "socket: %s", strerror(errno));
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int live = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    close(fd);
    if (live)
        return cairn_errorf(err, err_len, CAIRN_EBUSY, "another server is listening on %s", path);
    if (unlink(path) != 0)
        return cairn_errorf(err, err_len, CAIRN_EIO, "cannot remove stale %s: %s", path,
                     strerror(errno));
    return CAIRN_OK;
}

static int bind_unix(cairn_server *s, char *err, size_t err_len)
{
    const char *path = s->cfg.unix_path;
    if (strlen(path) >= sizeof(((struct sockaddr_un *)0)->sun_path))
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "Unix socket path too long: %s", path);
    int rc = clear_stale_socket(path, err, err_len);
    if (rc != CAIRN_OK)
        return rc;
    uv_pipe_init(&s->loop, &s->pipe, 0);
    s->pipe.data = s;
    s->has_pipe = true;
    /* bind() creates the file with 0777 & ~umask: with this umask it is 0600
     * from the first instant. No other thread exists yet to be affected. */
    mode_t old = umask(0177);
    rc = uv_pipe_bind(&s->pipe, path);
    umask(old);
    if (rc != 0)
        return cairn_errorf(err, err_len, CAIRN_EIO, "cannot bind %s: %s", path, uv_strerror(rc));
    s->unix_path = strdup(path);
    if (!s->unix_path)
        return CAIRN_ENOMEM;
    if ((rc = uv_listen((uv_stream_t *)&s->pipe, 128, on_connection)) != 0)
        return cairn_errorf(err, err_len, CAIRN_EIO, "cannot listen on %s: %s", path, uv_strerror(rc));
    return CAIRN_OK;
}

int cairn_server_create(const cairn_server_config *cfg, cairn_server **out, char *err,
                        size_t err_len)
{
    if (err && err_len)
        err[0] = '\0';
    if (!cfg || !out || (!cfg->host && !cfg->unix_path) || cfg->port < 0 || cfg->port > 65535 ||
        cfg->limits.max_depth < 1 || cfg->limits.max_depth > CAIRN_MP_DEPTH_CAP ||
        cfg->idle_timeout_s <= 0 || cfg->max_inflight < 1)
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "invalid server configuration");
    if (!cfg->n_credentials && !cairn_host_is_loopback(cfg->host))
        return cairn_errorf(err, err_len, CAIRN_EINVAL,
                     "refusing to listen on %s without authentication: configure a token or "
                     "tenants, or listen on a loopback address",
                     cfg->host);
    if (cfg->http.port >= 0 && cfg->http.host && !cfg->n_credentials &&
        !cairn_host_is_loopback(cfg->http.host))
        return cairn_errorf(err, err_len, CAIRN_EINVAL,
                     "refusing to listen (HTTP) on %s without authentication: configure a "
                     "token or tenants, or listen on a loopback address",
                     cfg->http.host);
    cairn_access *access = NULL;
    int rc = cairn_access_create(cfg->credentials, cfg->n_credentials, &access, err, err_len);
    if (rc != CAIRN_OK)
        return rc;
    cairn_server *s = calloc(1, sizeof *s);
    if (!s) {
        cairn_access_free(access);
        return CAIRN_ENOMEM;
    }
    s->cfg = *cfg;
    s->cfg.credentials = NULL; /* the copy in `access` is what counts */
    s->cfg.n_credentials = 0;
    s->access = access;
    s->preauth_limits = cfg->limits;
    cairn_mp_limits *pl = &s->preauth_limits;
    if (pl->max_message_bytes > CAIRN_PREAUTH_MESSAGE_BYTES)
        pl->max_message_bytes = CAIRN_PREAUTH_MESSAGE_BYTES;
    if (pl->max_string_bytes > CAIRN_PREAUTH_STRING_BYTES)
        pl->max_string_bytes = CAIRN_PREAUTH_STRING_BYTES;
    if (pl->max_depth > CAIRN_PREAUTH_DEPTH)
        pl->max_depth = CAIRN_PREAUTH_DEPTH;
    if (pl->max_array_len > CAIRN_PREAUTH_COUNT)
        pl->max_array_len = CAIRN_PREAUTH_COUNT;
    if (pl->max_map_len > CAIRN_PREAUTH_COUNT)
        pl->max_map_len = CAIRN_PREAUTH_COUNT;
    s->tcp_port = -1;
    pthread_mutex_init(&s->queue_mu, NULL);
    rc = uv_loop_init(&s->loop);
    if (rc != 0) {
        pthread_mutex_destroy(&s->queue_mu);
        cairn_access_free(s->access);
        free(s);
        return cairn_errorf(err, err_len, CAIRN_EIO, "uv_loop_init: %s", uv_strerror(rc));
    }
    s->loop_ready = true;
    /* A write to a client that went away must be an error, not a signal
     * that kills the server. */
    signal(SIGPIPE, SIG_IGN);

    rc = CAIRN_OK;
    if (cfg->host)
        rc = bind_tcp(s, err, err_len);
    if (rc == CAIRN_OK && cfg->unix_path)
        rc = bind_unix(s, err, err_len);
    if (rc == CAIRN_OK && cfg->http.port >= 0) {
        /* the TCP host (loopback unless credentials allowed otherwise) */
        if (!s->cfg.http.host)
            s->cfg.http.host = cfg->host ? cfg->host : "127.0.0.1";
        cairn_http_env env = {.loop = &s->loop, .cfg = &s->cfg.http, .access = s->access,
                              .next_client_id = &s->next_client_id, .seed_state = &s->seed_state,
                              .max_output_bytes = cfg->max_output_bytes};
        rc = cairn_http_create(&env, &s->http, err, err_len);
    }
    if (rc == CAIRN_OK) {
        uv_async_init(&s->loop, &s->events_async, on_events);
        uv_async_init(&s->loop, &s->stop_async, on_stop);
        s->events_async.data = s->stop_async.data = s;
        s->has_asyncs = true;
        uv_signal_init(&s->loop, &s->sigint);
        uv_signal_init(&s->loop, &s->sigterm);
        s->sigint.data = s->sigterm.data = s;
        s->has_signals = true;
        /* Seeds for requests without one: unpredictable across runs. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        s->seed_state = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^
                        (uint64_t)getpid() << 40;

        rc = cairn_runtime_open(&cfg->runtime, &s->rt, err, err_len);
    }
    if (rc == CAIRN_OK) {
        cairn_service_config sc = cfg->service;
        sc.runtime = s->rt;
        sc.on_event = on_engine_event;
        sc.user = s;
        rc = cairn_service_start(&sc, &s->svc, err, err_len);
    }
    if (rc != CAIRN_OK) {
        cairn_server_free(s);
        return rc;
    }
    if (s->http)
        cairn_http_set_service(s->http, s->svc, cfg->runtime.model_path);
    s->rctx.vocab = cairn_service_vocab(s->svc);
    s->rctx.chat_template = cairn_service_chat_template(s->svc);
    s->rctx.n_vocab = cairn_service_hparams(s->svc)->n_vocab;
    s->rctx.n_ctx = cairn_service_n_ctx(s->svc);
    s->rctx.limits = cfg->limits;
    *out = s;
    return CAIRN_OK;
}

int cairn_server_tcp_port(const cairn_server *s) { return s->has_tcp ? s->tcp_port : -1; }

int cairn_server_http_port(const cairn_server *s) { return cairn_http_port(s->http); }

void cairn_server_describe(const cairn_server *s, char *out, size_t cap)
{
    char http[200] = "";
    if (s->http)
        cairn_http_describe(s->http, http, sizeof http);
    snprintf(out, cap, "%s%s%s%s%s%s%s", s->has_tcp ? "tcp " : "", s->has_tcp ? s->tcp_desc : "",
             s->has_tcp && s->has_pipe ? ", " : "", s->has_pipe ? "unix " : "",
             s->has_pipe ? s->unix_path : "", (s->has_tcp || s->has_pipe) && http[0] ? ", " : "",
             http);
}

int cairn_server_run(cairn_server *s)
{
    if (!s || s->stopping)
        return CAIRN_EINVAL;
    uv_signal_start(&s->sigint, on_signal, SIGINT);
    uv_signal_start(&s->sigterm, on_signal, SIGTERM);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    /* The loop only ends once every handle is closed, which begin_shutdown
     * arranges; run it once more in case something is still pending. */
    begin_shutdown(s);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    return CAIRN_OK;
}

void cairn_server_stop(cairn_server *s)
{
    if (s)
        uv_async_send(&s->stop_async);
}

void cairn_server_free(cairn_server *s)
{
    if (!s)
        return;
    if (s->loop_ready) {
        begin_shutdown(s); /* a no-op after cairn_server_run */
        uv_run(&s->loop, UV_RUN_DEFAULT);
        uv_loop_close(&s->loop);
    }
    cairn_http_free(s->http);
    cairn_runtime_close(s->rt); /* the service that borrowed it has stopped */
    if (s->unix_path) {
        unlink(s->unix_path);
        free(s->unix_path);
    }
    pthread_mutex_destroy(&s->queue_mu);
    cairn_access_free(s->access);
    free(s);
}
