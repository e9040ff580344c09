/*
 * server/msgpack/conn.c — a msgpack-RPC connection (docs/protocol.md):
 * messages delimited by the scanner, decoded on the text workers, submitted
 * to the engine in the order they arrived, and answered as events come
 * back.
 *
 *   bytes ─scan─▶ message ─copy─▶ work item ─(worker: cairn_rpc_decode)─▶
 *        in order, from the head of the connection's queue:
 *        auth / server.info / tokenize / detokenize: answered here
 *        everything else: a request to the engine; its events are answered
 *
 * Order matters to a client that pipelines (session.append, then
 * session.generate; a generate, then its gen.cancel): items finish on the
 * workers in any order, but act only from the head of the queue. Messages
 * that need no decoding (before authentication) join the same queue already
 * done. A connection with a message being decoded is not read until it is
 * acted on: backpressure instead of memory (queue_full says why).
 *
 * Before authentication (when credentials exist) a connection gets no
 * decoding beyond the envelope, smaller limits, no second chance after an
 * error, and a deadline to authenticate (server.h, section 1).
 */
#include "server/msgpack/msgpack.h"
#include "server/server_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint32_t msgid;
    cairn_rpc_method method;
    char *tools_json; /* the reply is read for these tools' calls (owned) */
    bool channels;    /* a chat reply in channels (harmony): read for its
                         content and reasoning, tools or not             */
    srv_conv *conv;   /* generate over messages: to place a cache miss    */
} pending;

struct rpc_conn;

/* One message on its way from the socket to the engine. */
typedef struct rpc_item {
    srv_work w;
    struct rpc_conn *conn; /* NULL once the connection has gone              */
    struct rpc_item *next; /* in the connection's queue                      */
    bool done;
    uint8_t *msg;          /* the message (owned; NULL once decoded)         */
    size_t len;
    uint64_t seed;         /* for a request that names none                  */
    cairn_rpc_context ctx;
    int rc;                /* cairn_rpc_decode's                             */
    cairn_rpc_call call;
    cairn_rpc_error err;
} rpc_item;

typedef struct rpc_conn {
    srv_conn base;
    cairn_mp_scanner sc;
    size_t scanned;        /* of in[in_off ..): the current message so far   */
    bool skipping;         /* discarding the rest of an over-limit message    */
    pending *pend;
    int n_pend, cap_pend;
    rpc_item *head, *tail; /* messages not acted on yet, in arrival order     */
    int n_items;
} rpc_conn;

static const cairn_mp_limits *conn_limits(const rpc_conn *rc)
{
    const cairn_server *s = rc->base.srv;
    return rc->base.authed ? &s->cfg.limits : &s->preauth_limits;
}

/* ---- pending requests ----------------------------------------------------------- */

static pending *pending_find(rpc_conn *rc, uint32_t msgid)
{
    for (int i = 0; i < rc->n_pend; i++)
        if (rc->pend[i].msgid == msgid)
            return &rc->pend[i];
    return NULL;
}

static pending *pending_add(rpc_conn *rc, uint32_t msgid, cairn_rpc_method m)
{
    if (rc->n_pend == rc->cap_pend) {
        int cap = rc->cap_pend ? rc->cap_pend * 2 : 8;
        pending *p = realloc(rc->pend, (size_t)cap * sizeof *p);
        if (!p)
            return NULL;
        rc->pend = p;
        rc->cap_pend = cap;
    }
    rc->pend[rc->n_pend] = (pending){msgid, m, NULL, false, NULL};
    return &rc->pend[rc->n_pend++];
}

static void pending_remove(rpc_conn *rc, pending *p)
{
    free(p->tools_json);
    srv_conv_release(p->conv);
    *p = rc->pend[--rc->n_pend];
}

/* ---- answering -------------------------------------------------------------------- */

static void send_packed(rpc_conn *rc, msgpack_sbuffer *sb)
{
    srv_conn_write(&rc->base, sb->data, sb->size);
    msgpack_sbuffer_destroy(sb);
}

static void send_error(rpc_conn *rc, uint32_t msgid, int code, const char *message)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    if (cairn_rpc_pack_error(&sb, msgid, code, message) == CAIRN_OK) {
        send_packed(rc, &sb);
        return;
    }
    msgpack_sbuffer_destroy(&sb);
    srv_conn_close(&rc->base);
}

/* Answer an error and close once it is written: how every failure of an
 * unauthenticated connection, and every wrong token, ends. */
static void refuse(rpc_conn *rc, uint32_t msgid, int code, const char *message)
{
    send_error(rc, msgid, code, message);
    srv_conn_linger(&rc->base);
}

/* auth {token}: check it and answer {tenant}. */
static void handle_auth(rpc_conn *rc, const cairn_rpc_call *call)
{
    srv_conn *c = &rc->base;
    uint64_t tenant;
    const char *name;
    if (cairn_access_check(c->srv->access, call->token, call->token_len, &tenant, &name) !=
        CAIRN_OK) {
        cairn_log(CAIRN_LOG_WARN, "client %llu: wrong token; closing", (unsigned long long)c->id);
        refuse(rc, call->msgid, CAIRN_RPC_UNAUTHORIZED, "wrong token");
        return;
    }
    if (c->authed && tenant != c->tenant) {
        /* Switching tenants under requests already running would blur whose
         * they are; a client that needs two tenants opens two connections. */
        send_error(rc, call->msgid, CAIRN_RPC_INVALID_REQUEST,
                   "this connection is authenticated as another tenant");
        return;
    }
    if (!c->authed) {
        c->authed = true;
        c->tenant = tenant;
        c->tenant_name = name;
        srv_conn_timer_stop(c); /* the deadline to authenticate */
        if (name)
            cairn_log(CAIRN_LOG_DEBUG, "client %llu: tenant %s", (unsigned long long)c->id, name);
    }
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    if (cairn_rpc_pack_auth(&sb, call->msgid, c->tenant_name) == CAIRN_OK)
        send_packed(rc, &sb);
    else {
        msgpack_sbuffer_destroy(&sb);
        send_error(rc, call->msgid, CAIRN_RPC_OVERLOADED, "out of memory");
    }
}

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

/* Hand a decoded call to the engine. Takes what it needs out of the call. */
static void submit_call(rpc_conn *rc, cairn_rpc_call *call)
{
    const uint32_t msgid = call->msgid;
    if (rc->n_pend >= rc->base.srv->cfg.max_inflight) {
        send_error(rc, msgid, CAIRN_RPC_OVERLOADED, "too many requests in flight on this connection");
        return;
    }
    cairn_request *r = cairn_request_new(req_kind_of[call->method]);
    pending *p = r ? pending_add(rc, msgid, call->method) : NULL;
    if (!p) {
        cairn_request_free(r);
        send_error(rc, msgid, CAIRN_RPC_OVERLOADED, "out of memory");
        return;
    }
    r->id = msgid;
    r->session = call->session;
    r->tokens = call->tokens; /* ownership moves to the request */
    r->n_tokens = call->n_tokens;
    call->tokens = NULL;
    call->n_tokens = 0;
    if (call->method == CAIRN_RPC_GENERATE || call->method == CAIRN_RPC_SESSION_GENERATE) {
        r->gen = call->gen; /* the stop strings and the grammar move too */
        call->gen.n_stop = 0;
        call->gen.grammar = NULL;
        p->tools_json = call->tools_json; /* for the reply */
        call->tools_json = NULL;
        /* a chat reply in channels is read like the chat route's: content,
         * reasoning, calls (`text` stays the whole reply) */
        p->channels = call->conv.msgs && cairn_api_reply_has_channels(&rc->base.srv->api);
        if (call->method == CAIRN_RPC_GENERATE && call->conv.msgs) {
            /* the conversation, to place a cache miss in (explain.c) */
            cairn_api_call view = {.req = r, .conv = call->conv, .tools_json = p->tools_json};
            if ((p->conv = srv_conv_take(&view)))
                call->conv = (cairn_api_conversation){0};
            view.tools_json = NULL; /* still p's */
        }
    }
    r->target = call->target;
    r->n_keep = call->n_keep;
    r->persist = call->persist;
    r->chat_turn = call->chat_turn;
    r->n_pins = call->n_pins;
    for (int i = 0; i < call->n_pins && i < CAIRN_MAX_PINS; i++) {
        r->pins[i].tokens = call->pins[i].tokens;
        r->pins[i].ttl_s = call->pins[i].ttl_s;
    }
    int rc_submit = srv_submit(&rc->base, r);
    if (rc_submit != CAIRN_OK) {
        pending_remove(rc, pending_find(rc, msgid));
        send_error(rc, msgid, rc_submit == CAIRN_ECLOSED ? CAIRN_RPC_OVERLOADED : rc_submit,
                   "the engine is not accepting requests");
    }
}

/* Answered here on the loop thread: no engine state is involved. */
static void answer_locally(rpc_conn *rc, const cairn_rpc_call *call)
{
    cairn_server *s = rc->base.srv;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    int rc_pack;
    switch (call->method) {
    case CAIRN_RPC_SERVER_INFO: {
        cairn_rpc_server_info info = {
            .version = CAIRN_VERSION,
            .hparams = cairn_service_hparams(s->svc),
            .n_ctx = s->api.n_ctx,
            .page_size = cairn_service_page_size(s->svc),
            .kv_type = cairn_service_kv_type(s->svc),
            .limits = s->cfg.limits,
        };
        rc_pack = cairn_rpc_pack_server_info(&sb, call->msgid, &info);
        break;
    }
    case CAIRN_RPC_TOKENIZE: rc_pack = cairn_rpc_pack_tokenize(&sb, call); break;
    default: rc_pack = cairn_rpc_pack_detokenize(&sb, call); break;
    }
    if (rc_pack == CAIRN_OK) {
        send_packed(rc, &sb);
        return;
    }
    msgpack_sbuffer_destroy(&sb);
    send_error(rc, call->msgid, CAIRN_RPC_OVERLOADED, "out of memory");
}

/* A decoded message, at the head of the queue: act on it. */
static void act(rpc_conn *rc, rpc_item *it)
{
    srv_conn *c = &rc->base;
    if (it->rc == CAIRN_ECLOSED)
        return; /* a notification from the client; none is defined */
    /* A msgid names one answer: a message reusing one still in flight —
     * whatever its method, and even malformed — gets this error instead, so
     * that no msgid is ever answered twice by what it asked for. */
    const bool has_msgid = it->rc == CAIRN_OK || it->err.has_msgid;
    const uint32_t msgid = it->rc == CAIRN_OK ? it->call.msgid : it->err.msgid;
    if (has_msgid && pending_find(rc, msgid)) {
        send_error(rc, msgid, CAIRN_RPC_INVALID_REQUEST, "this msgid is already in flight");
        return;
    }
    if (it->rc != CAIRN_OK) {
        if (!it->err.has_msgid)
            srv_conn_close(c); /* not a request at all: nothing to answer */
        else if (!c->authed)
            refuse(rc, it->err.msgid, it->err.code, it->err.message);
        else
            send_error(rc, it->err.msgid, it->err.code, it->err.message);
        return;
    }
    cairn_rpc_call *call = &it->call;
    if (call->method == CAIRN_RPC_AUTH)
        handle_auth(rc, call);
    else if (call->method == CAIRN_RPC_SERVER_INFO || call->method == CAIRN_RPC_TOKENIZE ||
             call->method == CAIRN_RPC_DETOKENIZE)
        answer_locally(rc, call);
    else if (c->srv->draining)
        send_error(rc, call->msgid, CAIRN_RPC_OVERLOADED,
                   "the server is shutting down: no new requests");
    else
        submit_call(rc, call);
}

/* ---- the queue -------------------------------------------------------------------- */

static void item_free(rpc_item *it)
{
    cairn_rpc_call_clear(&it->call);
    free(it->msg);
    free(it);
}

/* While a message of the connection is being decoded, the connection is not
 * read: its next messages wait in the client's socket (what they did while
 * the loop decoded them itself), so a client cannot make the server hold
 * more than what one read delivered, and one that sends without reading its
 * answers meets --max-output as soon as they pile up. Other connections'
 * messages decode meanwhile, on other workers. */
static bool queue_full(const rpc_conn *rc)
{
    return rc->n_items > 0;
}

static void drain(rpc_conn *rc)
{
    while (rc->head && rc->head->done) {
        rpc_item *it = rc->head;
        rc->head = it->next;
        if (!rc->head)
            rc->tail = NULL;
        rc->n_items--;
        if (!srv_conn_gone(&rc->base))
            act(rc, it);
        item_free(it);
    }
    srv_conn_pause(&rc->base, queue_full(rc) && !srv_conn_gone(&rc->base));
}

static void decode_work(srv_work *w)
{
    rpc_item *it = (rpc_item *)w;
    it->rc = cairn_rpc_decode(&it->ctx, it->msg, it->len, &it->seed, &it->call, &it->err);
    /* the token of an auth points into the message: then the bytes stay
     * until the item is acted on */
    if (it->rc != CAIRN_OK || it->call.method != CAIRN_RPC_AUTH) {
        free(it->msg);
        it->msg = NULL;
    }
}

static void decode_done(srv_work *w, srv_conn *c)
{
    (void)c; /* the item knows its connection (or that it has gone) */
    rpc_item *it = (rpc_item *)w;
    it->done = true;
    if (!it->conn) {
        item_free(it);
        return;
    }
    drain(it->conn);
}

static void enqueue(rpc_conn *rc, rpc_item *it)
{
    it->conn = rc;
    if (rc->tail)
        rc->tail->next = it;
    else
        rc->head = it;
    rc->tail = it;
    rc->n_items++;
}

/* One complete message: decoded in line when that is cheap (before
 * authentication: the envelope and `auth` only), on a worker otherwise. */
static void handle_message(rpc_conn *rc, const uint8_t *msg, size_t len)
{
    cairn_server *s = rc->base.srv;
    rpc_item *it = calloc(1, sizeof *it);
    if (it && rc->base.authed && (it->msg = malloc(len))) {
        memcpy(it->msg, msg, len);
        it->len = len;
        it->seed = srv_next_seed(s);
        it->ctx = (cairn_rpc_context){.api = &s->api, .limits = s->cfg.limits};
        it->w.conn_id = rc->base.id;
        it->w.work = decode_work;
        it->w.done = decode_done;
        enqueue(rc, it);
        if (srv_work_queue(s, &it->w) != CAIRN_OK) { /* cannot happen with libuv's pool */
            it->rc = CAIRN_ENOMEM;
            it->err = (cairn_rpc_error){.has_msgid = false};
            it->done = true;
        }
    } else if (it && !rc->base.authed) {
        it->rc = cairn_rpc_decode_preauth(msg, len, &it->call, &it->err);
        it->done = true;
        /* the auth token points into `msg`, valid until this call returns:
         * the queue is empty before authentication, so it is acted on now */
        enqueue(rc, it);
    } else {
        free(it);
        uint32_t msgid;
        if (cairn_rpc_peek_msgid(msg, len, &msgid))
            send_error(rc, msgid, CAIRN_RPC_OVERLOADED, "out of memory");
        else
            srv_conn_close(&rc->base);
        return;
    }
    drain(rc);
}

/* ---- reading ------------------------------------------------------------------------ */

static void on_auth_timeout(srv_conn *c)
{
    cairn_log(CAIRN_LOG_INFO, "client %llu: did not authenticate in time; closing",
              (unsigned long long)c->id);
    srv_conn_close(c);
}

static void on_idle_timeout(srv_conn *c)
{
    cairn_log(CAIRN_LOG_INFO, "client %llu: half a message and no more bytes; closing",
              (unsigned long long)c->id);
    srv_conn_close(c);
}

/* Act on every complete message in the buffer; keep the partial tail. */
static void process_input(rpc_conn *rc)
{
    srv_conn *c = &rc->base;
    while (!srv_conn_gone(c)) {
        uint8_t *msg = c->in + c->in_off;
        size_t avail = c->in_len - c->in_off, used;
        bool complete;
        int rc_scan = cairn_mp_scan(&rc->sc, msg + rc->scanned, avail - rc->scanned, &used,
                                    &complete);
        rc->scanned += used;
        if (rc_scan == CAIRN_OK) {
            if (complete && !rc->skipping)
                handle_message(rc, msg, rc->scanned);
            if (srv_conn_gone(c))
                return; /* answered and closing: its input is gone too */
            if (complete || rc->skipping) {
                /* Skipped bytes are dropped as soon as they are scanned. */
                c->in_off += rc->scanned;
                rc->scanned = 0;
            }
            if (!complete)
                break;
            rc->skipping = false;
            cairn_mp_scanner_reset(&rc->sc, conn_limits(rc));
            continue;
        }
        uint32_t msgid;
        bool answerable = !rc->skipping && cairn_rpc_peek_msgid(msg, avail, &msgid);
        int code = rc_scan == CAIRN_ERANGE ? CAIRN_RPC_TOO_LARGE : CAIRN_RPC_INVALID_REQUEST;
        if (!answerable) {
            cairn_log(CAIRN_LOG_INFO, "client %llu: %s; closing", (unsigned long long)c->id,
                      rc->sc.error ? rc->sc.error : "malformed input");
            srv_conn_close(c);
            return;
        }
        send_error(rc, msgid, code, rc->sc.error);
        if (rc_scan == CAIRN_ERANGE && rc->sc.can_skip && c->authed) {
            /* Resynchronise: discard the rest of this message as it comes. */
            c->in_off += rc->scanned;
            rc->scanned = 0;
            cairn_mp_scanner_skip(&rc->sc);
            rc->skipping = true;
            continue;
        }
        srv_conn_linger(c);
        return;
    }
}

static void on_input(srv_conn *c)
{
    rpc_conn *rc = (rpc_conn *)c;
    process_input(rc);
    if (srv_conn_gone(c) || !c->authed)
        return; /* the deadline to authenticate set at accept keeps running */
    if (c->reading_paused) { /* our queue is full, not the client slow */
        srv_conn_timer_stop(c);
        return;
    }
    /* A half-received message (or one being skipped) must keep arriving. */
    if (c->in_len > c->in_off || rc->skipping)
        srv_conn_timer(c, c->srv->cfg.idle_timeout_s, on_idle_timeout);
    else
        srv_conn_timer_stop(c);
}

/* ---- events ---------------------------------------------------------------------------- */

/* A finished generation of a request with tools: its text read for calls
 * on a worker (text work), then the answer. */
typedef struct {
    srv_calls k;
    cairn_rpc_method method;
    bool channels;
} calls_item;

static void send_event(rpc_conn *rc, cairn_rpc_method method, const cairn_event *ev,
                       const cairn_rpc_tool_calls *calls)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    if (cairn_rpc_pack_event(&sb, method, ev, calls) == CAIRN_OK) {
        send_packed(rc, &sb);
        return;
    }
    msgpack_sbuffer_destroy(&sb);
    if (ev->kind != CAIRN_EV_DELTA)
        send_error(rc, (uint32_t)ev->id, CAIRN_ENOMEM, "out of memory");
}

static void calls_answer(srv_calls *k, srv_conn *c)
{
    if (!c)
        return;
    const cairn_rpc_tool_calls calls = {k->calls_json, k->content, k->reasoning};
    send_event((rpc_conn *)c, ((calls_item *)k)->method, &k->node->ev,
               k->calls_json || ((calls_item *)k)->channels ? &calls : NULL);
}

static bool on_event(srv_conn *c, srv_event *node);

static bool classified(srv_classify *k, srv_conn *c) { return on_event(c, k->node); }

static bool on_event(srv_conn *c, srv_event *node)
{
    rpc_conn *rc = (rpc_conn *)c;
    cairn_event *ev = &node->ev;
    pending *p = pending_find(rc, (uint32_t)ev->id);
    if (!p)
        return false;
    const cairn_rpc_method method = p->method;
    if (ev->kind == CAIRN_EV_DONE && ev->what == CAIRN_DONE_GENERATION) {
        if (ev->miss.known && ev->miss.reason == CAIRN_MISS_DEPARTED && p->conv) {
            /* which part changed: rendering, so on a text worker */
            srv_classify *k = calloc(1, sizeof *k);
            if (k) {
                k->conv = p->conv;
                k->node = node;
                k->msgid = p->msgid;
                k->answer = classified;
                if (srv_classify_queue(c->srv, k, c->id) == CAIRN_OK)
                    return true;
                free(k);
            }
        }
        if (ev->miss.reason == CAIRN_MISS_DEPARTED)
            ev->miss.reason = CAIRN_MISS_NEW_CONTENT;
        srv_miss_count(c->srv, &ev->miss);
    }
    if (ev->kind == CAIRN_EV_DONE && ev->what == CAIRN_DONE_GENERATION &&
        (p->tools_json || p->channels)) {
        calls_item *ci = calloc(1, sizeof *ci);
        if (ci) {
            ci->k.node = node;
            ci->method = method;
            ci->channels = p->channels;
            ci->k.tools_json = p->tools_json; /* the item takes it */
            p->tools_json = NULL;
            /* ids unique on the server: call_<connection>_<msgid>_<n> */
            snprintf(ci->k.prefix, sizeof ci->k.prefix, "call_%llu_%u_",
                     (unsigned long long)c->id, p->msgid);
            ci->k.answer = calls_answer;
            pending_remove(rc, p);
            if (srv_calls_queue(c->srv, &ci->k, c->id) == CAIRN_OK)
                return true;
            ci->k.node = NULL; /* the server frees the event */
            srv_calls_free(&ci->k);
            send_error(rc, (uint32_t)ev->id, CAIRN_ENOMEM, "out of memory");
            return false;
        }
    }
    if (ev->kind != CAIRN_EV_DELTA)
        pending_remove(rc, p);
    send_event(rc, method, ev, NULL);
    return false;
}

/* ---- life ------------------------------------------------------------------------------- */

static void on_free(srv_conn *c)
{
    rpc_conn *rc = (rpc_conn *)c;
    /* items still on a worker free themselves when they come back */
    for (rpc_item *it = rc->head, *next; it; it = next) {
        next = it->next;
        if (it->done)
            item_free(it);
        else
            it->conn = NULL;
    }
    for (int i = 0; i < rc->n_pend; i++) {
        free(rc->pend[i].tools_json);
        srv_conv_release(rc->pend[i].conv);
    }
    free(rc->pend);
}

/* Draining waits for the requests in flight and the messages being decoded. */
static bool busy(srv_conn *b)
{
    const rpc_conn *rc = (const rpc_conn *)b;
    return rc->n_pend > 0 || rc->n_items > 0;
}

const srv_conn_ops srv_msgpack_ops = {
    .name = "msgpack",
    .on_input = on_input,
    .on_event = on_event,
    .on_free = on_free,
    .busy = busy,
};

/* A new connection on the TCP or Unix listener. */
void srv_msgpack_accept(cairn_server *s, uv_stream_t *listener, bool tcp)
{
    srv_conn *c = srv_conn_accept(s, listener, tcp, &srv_msgpack_ops, sizeof(rpc_conn));
    if (!c)
        return;
    rpc_conn *rc = (rpc_conn *)c;
    cairn_mp_scanner_reset(&rc->sc, conn_limits(rc));
    if (!c->authed)
        srv_conn_timer(c, s->cfg.idle_timeout_s, on_auth_timeout);
}
