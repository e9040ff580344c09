/*
 * route/proxy_rpc.c — msgpack-RPC (docs/protocol.md) in front of the
 * replicas.
 *
 *   client bytes ─cairn_mp_scanner─▶ one message ─▶ its envelope read here:
 *       generate, session.open        decoded on the threadpool (the same
 *                                     cairn_rpc_decode a replica runs) into
 *                                     prompt tokens ─▶ route_choose by cost
 *       session.* {session_id}        the session's replica (sticky)
 *       gen.cancel {request}          the replica running that request
 *       auth                          any replica; once accepted, the same
 *                                     message opens every later upstream
 *       anything else, or undecodable any healthy replica, unchanged
 *     ─▶ the message's bytes, unchanged, on this client's connection to that
 *        replica (opened when first needed; one per client and replica, so
 *        msgids stay the client's own and gen.cancel finds its target)
 *   replica bytes ─scanner─▶ responses [1, msgid, ...] and notifications
 *       [2, "gen.delta", ...] forwarded unchanged; session.open/fork answers
 *       teach the session map; session.close forgets.
 *
 * Messages of a client are acted on in order, one at a time: while one is
 * being decoded the connection is not read (as a replica does), so a
 * session.append then session.generate, or a generate then its gen.cancel,
 * reach their replica in the order sent. A msgid already in flight is
 * refused here, since two replicas would otherwise both answer it.
 *
 * A replica connection that fails answers each of the client's requests on
 * it with an `internal` error naming the replica; the client's connection
 * stays open for requests to the others.
 */
#include "route/route_impl.h"

#include "server/msgpack/msgpack.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rclient rclient;

typedef enum { UP_CONNECTING, UP_AUTHING, UP_READY } up_state;

typedef struct rup {
    rstream s;
    rclient *c;            /* NULL once the client has gone               */
    int slot;
    up_state state;
    cairn_strbuf queued;   /* messages waiting for the connection or auth */
    char *in;
    size_t in_len, in_cap;
    cairn_mp_scanner sc;
    size_t scanned;
    bool failed;
    bool queued_auth_itself; /* opened for the client's auth: it goes as queued */
} rup;

typedef enum { PK_OTHER = 0, PK_AUTH, PK_OPEN, PK_FORK, PK_CLOSE } pend_kind;

typedef struct {
    uint32_t msgid;
    int slot;
    pend_kind kind;
    char sticky[40];       /* PK_CLOSE: the session it closes              */
    route_choice choice;
    bool chosen;
} rpend;

typedef struct rjob {
    uv_work_t work;
    rclient *c;            /* NULL once the client has gone               */
    cairn_router *r;
    uint8_t *msg;
    size_t len;
    int rc;
    cairn_rpc_call call;
    cairn_rpc_error err;
} rjob;

struct rclient {
    rstream s;
    cairn_router *r;
    rclient *prev, *next;  /* the router's list of clients                */
    double last_byte;      /* when the last bytes came                     */
    char *in;
    size_t in_len, in_off, in_cap;
    cairn_mp_scanner sc;
    size_t scanned;
    bool skipping;
    rup *up[ROUTE_MAX_REPLICAS];
    rpend *pend;
    int n_pend, cap_pend;
    uint8_t *auth_msg;     /* the client's accepted auth, for new upstreams */
    size_t auth_len;
    uint8_t *pending_auth; /* its auth on its way to a replica            */
    size_t pending_auth_len;
    const uint8_t *pending_auth_src; /* the auth message being forwarded now */
    uint64_t tenant, pending_tenant;
    rjob *decoding;
    bool gone;
};

static cairn_mp_limits g_limits, g_up_limits;

static void client_process(rclient *c);

/* ---- answering the client ----------------------------------------------------------- */

static void send_error(rclient *c, uint32_t msgid, int code, const char *message)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    if (cairn_rpc_pack_error(&sb, msgid, code, message) == CAIRN_OK)
        rstream_write(&c->s, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
}

static rpend *pend_find(rclient *c, uint32_t msgid)
{
    for (int i = 0; i < c->n_pend; i++)
        if (c->pend[i].msgid == msgid)
            return &c->pend[i];
    return NULL;
}

static rpend *pend_add(rclient *c)
{
    if (c->n_pend == c->cap_pend) {
        int cap = c->cap_pend ? 2 * c->cap_pend : 8;
        rpend *p = realloc(c->pend, (size_t)cap * sizeof *p);
        if (!p)
            return NULL;
        c->pend = p;
        c->cap_pend = cap;
    }
    rpend *p = &c->pend[c->n_pend++];
    memset(p, 0, sizeof *p);
    p->slot = -1;
    return p;
}

static void pend_remove(rclient *c, rpend *p, bool ok)
{
    if (p->chosen)
        route_done(c->r, &p->choice, ok);
    *p = c->pend[--c->n_pend];
}

/* ---- upstream connections ----------------------------------------------------------- */

static void up_fail_all(rup *u, const char *why)
{
    rclient *c = u->c;
    if (!c)
        return;
    cairn_router *r = c->r;
    char msg[300];
    pthread_mutex_lock(&r->reg_mu);
    snprintf(msg, sizeof msg, "the replica serving this request (%s) failed: %s",
             r->reg[u->slot].id, why);
    pthread_mutex_unlock(&r->reg_mu);
    bool any = false;
    for (int i = 0; i < c->n_pend;) {
        rpend *p = &c->pend[i];
        if (p->slot != u->slot) {
            i++;
            continue;
        }
        any = true;
        r->counters.replica_errors++;
        send_error(c, p->msgid, CAIRN_RPC_INTERNAL, msg);
        if (p->kind == PK_AUTH) {
            free(c->pending_auth);
            c->pending_auth = NULL;
        }
        pend_remove(c, p, false);
    }
    (void)any; /* a replica that closed mid-way is for the health checks to judge */
    if (u->state == UP_CONNECTING)
        route_replica_failed(r, u->slot, why);
}

static void up_closed(rstream *s)
{
    rup *u = s->owner;
    if (u->c) {
        if (u->c->up[u->slot] == u)
            u->c->up[u->slot] = NULL;
        up_fail_all(u, "connection lost");
    }
    cairn_strbuf_free(&u->queued);
    free(u->in);
    free(u);
}

/* A session id in a result map ({session_id: "hex"}), into hex[33]. */
static bool result_session(cairn_mp_reader rd, char hex[33])
{
    uint32_t n;
    if (cairn_mp_read_map(&rd, &n) != CAIRN_OK)
        return false;
    for (uint32_t i = 0; i < n; i++) {
        const char *k, *v;
        uint32_t kl, vl;
        if (cairn_mp_read_str(&rd, &k, &kl) != CAIRN_OK)
            return false;
        if (kl == 10 && memcmp(k, "session_id", 10) == 0 &&
            cairn_mp_read_str(&rd, &v, &vl) == CAIRN_OK && vl == 32) {
            memcpy(hex, v, 32);
            hex[32] = '\0';
            return true;
        }
        if (cairn_mp_skip(&rd) != CAIRN_OK)
            return false;
    }
    return false;
}

/* One whole message from the replica. */
static void up_message(rup *u, const uint8_t *msg, size_t len)
{
    rclient *c = u->c;
    cairn_router *r = c->r;
    cairn_mp_reader rd = cairn_mp_reader_of(msg, len);
    uint32_t n;
    uint64_t type = 9, msgid = 0;
    if (cairn_mp_read_array(&rd, &n) != CAIRN_OK || n < 3 ||
        cairn_mp_read_uint(&rd, &type) != CAIRN_OK)
        return;
    if (type != 1) {
        /* gen.delta: [2, "gen.delta", [{request, text, tokens}]] — the work
         * left of that request shrinks */
        const char *m;
        uint32_t ml, np, pairs;
        if (cairn_mp_read_str(&rd, &m, &ml) == CAIRN_OK && ml == 9 &&
            memcmp(m, "gen.delta", 9) == 0 && cairn_mp_read_array(&rd, &np) == CAIRN_OK &&
            np >= 1 && cairn_mp_read_map(&rd, &pairs) == CAIRN_OK) {
            uint64_t request = UINT64_MAX;
            uint32_t n_tokens = 0;
            for (uint32_t i = 0; i < pairs; i++) {
                const char *k;
                uint32_t kl;
                if (cairn_mp_read_str(&rd, &k, &kl) != CAIRN_OK)
                    break;
                if (kl == 7 && memcmp(k, "request", 7) == 0 &&
                    cairn_mp_peek(&rd) == CAIRN_MP_UINT) {
                    cairn_mp_read_uint(&rd, &request);
                    continue;
                }
                if (kl == 6 && memcmp(k, "tokens", 6) == 0 &&
                    cairn_mp_peek(&rd) == CAIRN_MP_ARRAY) {
                    cairn_mp_reader probe = rd;
                    cairn_mp_read_array(&probe, &n_tokens);
                }
                if (cairn_mp_skip(&rd) != CAIRN_OK)
                    break;
            }
            rpend *p = request <= UINT32_MAX ? pend_find(c, (uint32_t)request) : NULL;
            if (p && p->chosen && p->slot == u->slot)
                route_progress(r, &p->choice, n_tokens);
        }
        rstream_write(&c->s, msg, len);
        return;
    }
    if (cairn_mp_read_uint(&rd, &msgid) != CAIRN_OK)
        return;
    if (u->state == UP_AUTHING) {
        /* the answer to the router's auth on this new connection: its own */
        u->state = UP_READY;
        bool ok = cairn_mp_peek(&rd) == CAIRN_MP_NIL;
        if (ok && u->queued.len)
            rstream_write(&u->s, u->queued.data, u->queued.len);
        cairn_strbuf_free(&u->queued);
        return;
    }
    const bool ok = cairn_mp_peek(&rd) == CAIRN_MP_NIL;
    rpend *p = pend_find(c, (uint32_t)msgid);
    if (p && p->slot == u->slot) {
        char hex[33], key[40];
        if (ok && cairn_mp_skip(&rd) == CAIRN_OK && (p->kind == PK_OPEN || p->kind == PK_FORK) &&
            result_session(rd, hex)) {
            snprintf(key, sizeof key, "s:%s", hex);
            route_sessions_set(r->sessions, key, u->slot);
        }
        if (ok && p->kind == PK_CLOSE && p->sticky[0])
            route_sessions_del(r->sessions, p->sticky);
        if (p->kind == PK_AUTH) {
            if (ok) {
                free(c->auth_msg);
                c->auth_msg = c->pending_auth;
                c->auth_len = c->pending_auth_len;
                c->tenant = c->pending_tenant;
            } else {
                free(c->pending_auth);
            }
            c->pending_auth = NULL;
        }
        pend_remove(c, p, ok);
    }
    rstream_write(&c->s, msg, len);
}

static void up_read(rstream *s, const char *buf, ssize_t n)
{
    rup *u = s->owner;
    if (n < 0 || !u->c)
        return; /* closing: up_closed answers what was pending */
    if (u->in_len + (size_t)n > u->in_cap) {
        size_t cap = u->in_cap ? u->in_cap : 65536;
        while (cap < u->in_len + (size_t)n)
            cap *= 2;
        char *p = realloc(u->in, cap);
        if (!p) {
            rstream_close(&u->s);
            return;
        }
        u->in = p;
        u->in_cap = cap;
    }
    memcpy(u->in + u->in_len, buf, (size_t)n);
    u->in_len += (size_t)n;
    size_t off = 0;
    while (off < u->in_len && u->c && !u->s.closing) {
        size_t used;
        bool complete;
        int rc = cairn_mp_scan(&u->sc, (const uint8_t *)u->in + off + u->scanned,
                               u->in_len - off - u->scanned, &used, &complete);
        if (rc != CAIRN_OK) {
            rstream_close(&u->s); /* a replica that does not speak the protocol */
            return;
        }
        u->scanned += used;
        if (!complete)
            break;
        up_message(u, (const uint8_t *)u->in + off, u->scanned);
        off += u->scanned;
        u->scanned = 0;
        cairn_mp_scanner_reset(&u->sc, &g_up_limits);
    }
    memmove(u->in, u->in + off, u->in_len - off);
    u->in_len -= off;
}

static void up_connected(rstream *s, int status)
{
    rup *u = s->owner;
    if (status < 0)
        return; /* closed by net.c: up_closed answers */
    rstream_read(s, true);
    rclient *c = u->c;
    /* the accepted auth, or one still on its way (pipelined after it) */
    const uint8_t *auth = c ? (c->auth_msg ? c->auth_msg : c->pending_auth) : NULL;
    const size_t auth_len = c ? (c->auth_msg ? c->auth_len : c->pending_auth_len) : 0;
    if (auth && !u->queued_auth_itself) {
        u->state = UP_AUTHING;
        rstream_write(&u->s, auth, auth_len);
        return;
    }
    u->state = UP_READY;
    if (u->queued.len)
        rstream_write(&u->s, u->queued.data, u->queued.len);
    cairn_strbuf_free(&u->queued);
}

/* Send a message to `slot` on this client's connection to it. */
static bool up_send(rclient *c, int slot, const uint8_t *msg, size_t len)
{
    rup *u = c->up[slot];
    if (!u && c->r->stopping)
        return false;
    if (!u) {
        route_reg_entry e;
        pthread_mutex_lock(&c->r->reg_mu);
        e = c->r->reg[slot];
        pthread_mutex_unlock(&c->r->reg_mu);
        if (!e.has_rpc_addr || !(u = calloc(1, sizeof *u)))
            return false;
        u->c = c;
        u->slot = slot;
        u->state = UP_CONNECTING;
        cairn_mp_scanner_reset(&u->sc, &g_up_limits);
        rstream_init(&c->r->loop, &u->s, u);
        u->s.on_read = up_read;
        u->s.on_connect = up_connected;
        u->s.on_close = up_closed;
        c->up[slot] = u;
        if (rstream_connect(&u->s, (const struct sockaddr *)&e.rpc_addr) != CAIRN_OK) {
            u->c = NULL;
            c->up[slot] = NULL;
            rstream_close(&u->s);
            route_replica_failed(c->r, slot, "connect failed");
            return false;
        }
    }
    if (u->state == UP_CONNECTING && u->queued.len == 0 && msg == c->pending_auth_src)
        u->queued_auth_itself = true;
    if (u->state == UP_READY)
        rstream_write(&u->s, msg, len);
    else
        cairn_strbuf_add(&u->queued, msg, len);
    return true;
}

/* ---- client messages ---------------------------------------------------------------- */

typedef struct {
    uint64_t type;
    bool has_msgid;
    uint32_t msgid;
    char method[32];
    char session_hex[33];
    bool has_request;
    uint64_t request;
    const char *token;
    uint32_t token_len;
} envelope;

/* Read what routing needs; false when the message is not a request we can
 * read (it still goes to a replica, which answers the error). */
static bool read_envelope(const uint8_t *msg, size_t len, envelope *e)
{
    memset(e, 0, sizeof *e);
    cairn_mp_reader rd = cairn_mp_reader_of(msg, len);
    uint32_t n, np;
    uint64_t msgid;
    const char *m;
    uint32_t ml;
    if (cairn_mp_read_array(&rd, &n) != CAIRN_OK || n < 3 ||
        cairn_mp_read_uint(&rd, &e->type) != CAIRN_OK)
        return false;
    if (e->type != 0)
        return true;
    if (n != 4 || cairn_mp_read_uint(&rd, &msgid) != CAIRN_OK || msgid > UINT32_MAX)
        return false;
    e->has_msgid = true;
    e->msgid = (uint32_t)msgid;
    if (cairn_mp_read_str(&rd, &m, &ml) != CAIRN_OK || ml >= sizeof e->method)
        return false;
    memcpy(e->method, m, ml);
    if (cairn_mp_read_array(&rd, &np) != CAIRN_OK || np < 1 ||
        cairn_mp_peek(&rd) != CAIRN_MP_MAP)
        return true;
    uint32_t pairs;
    cairn_mp_read_map(&rd, &pairs);
    for (uint32_t i = 0; i < pairs; i++) {
        const char *k, *v;
        uint32_t kl, vl;
        if (cairn_mp_read_str(&rd, &k, &kl) != CAIRN_OK)
            return true;
        if (kl == 10 && memcmp(k, "session_id", 10) == 0 && cairn_mp_peek(&rd) == CAIRN_MP_STR) {
            cairn_mp_read_str(&rd, &v, &vl);
            if (vl == 32) {
                memcpy(e->session_hex, v, 32);
                e->session_hex[32] = '\0';
            }
            continue;
        }
        if (kl == 7 && memcmp(k, "request", 7) == 0 && cairn_mp_peek(&rd) == CAIRN_MP_UINT) {
            e->has_request = cairn_mp_read_uint(&rd, &e->request) == CAIRN_OK;
            continue;
        }
        if (kl == 5 && memcmp(k, "token", 5) == 0 && cairn_mp_peek(&rd) == CAIRN_MP_STR) {
            cairn_mp_read_str(&rd, &e->token, &e->token_len);
            continue;
        }
        if (cairn_mp_skip(&rd) != CAIRN_OK)
            return true;
    }
    return true;
}

/* Route one message (decoded or not) and send it on. */
static void forward(rclient *c, const uint8_t *msg, size_t len, const envelope *e,
                    const cairn_rpc_call *call)
{
    cairn_router *r = c->r;
    r->counters.requests_rpc++;
    if (e->has_msgid && pend_find(c, e->msgid)) {
        send_error(c, e->msgid, CAIRN_RPC_INVALID_REQUEST, "this msgid is already in flight");
        return;
    }
    rpend *p = e->has_msgid ? pend_add(c) : NULL;
    if (e->has_msgid && !p) {
        send_error(c, e->msgid, CAIRN_RPC_OVERLOADED, "out of memory");
        return;
    }
    route_choice ch = {.tenant = c->tenant, .need_rpc = true};
    char sticky[40] = "";
    int slot = -1;
    pend_kind kind = PK_OTHER;
    if (strcmp(e->method, "gen.cancel") == 0 && e->has_request) {
        rpend *t = e->request <= UINT32_MAX ? pend_find(c, (uint32_t)e->request) : NULL;
        if (t && t->slot >= 0 && c->up[t->slot])
            slot = t->slot;
    }
    if (e->session_hex[0] && strncmp(e->method, "session.", 8) == 0) {
        snprintf(sticky, sizeof sticky, "s:%s", e->session_hex);
        ch.sticky = sticky;
        if (strcmp(e->method, "session.fork") == 0)
            kind = PK_FORK;
        else if (strcmp(e->method, "session.close") == 0)
            kind = PK_CLOSE;
    }
    if (strcmp(e->method, "session.open") == 0)
        kind = PK_OPEN;
    if (strcmp(e->method, "auth") == 0)
        kind = PK_AUTH;
    if (call) {
        ch.tokens = call->tokens;
        ch.n_tokens = call->n_tokens;
        ch.max_tokens = call->method == CAIRN_RPC_GENERATE ? call->gen.max_tokens : 0;
    }
    if (kind == PK_AUTH) {
        /* the tenant the replica will give this connection */
        c->pending_tenant = route_tenant_of(r, e->token, e->token_len);
        free(c->pending_auth);
        if ((c->pending_auth = malloc(len))) {
            memcpy(c->pending_auth, msg, len);
            c->pending_auth_len = len;
        }
        ch.tenant = c->pending_tenant;
        /* a replica this client already talks to, when there is one */
        for (int s = 0; s < ROUTE_MAX_REPLICAS && slot < 0; s++)
            if (c->up[s] && r->live[s].up)
                slot = s;
    }
    if (slot < 0) {
        route_choose(r, &ch);
        slot = ch.slot;
        if (slot >= 0 && p) {
            p->choice = ch;
            p->chosen = true;
        } else if (slot >= 0) {
            route_done(r, &ch, true); /* a notification: nothing comes back */
        }
    }
    if (slot < 0) {
        r->counters.no_replica++;
        if (p) {
            pend_remove(c, p, false);
            send_error(c, e->msgid, CAIRN_RPC_OVERLOADED, "no healthy replica can take this request");
        }
        return;
    }
    if (p) {
        p->msgid = e->msgid;
        p->slot = slot;
        p->kind = kind;
        if (kind == PK_CLOSE)
            snprintf(p->sticky, sizeof p->sticky, "%s", sticky);
    }
    c->pending_auth_src = kind == PK_AUTH ? msg : NULL;
    const bool sent = up_send(c, slot, msg, len);
    c->pending_auth_src = NULL;
    if (!sent && p) {
        p = pend_find(c, e->msgid);
        if (p) {
            pend_remove(c, p, false);
            send_error(c, e->msgid, CAIRN_RPC_INTERNAL, "cannot reach the chosen replica");
        }
    }
}

static void decode_work(uv_work_t *w)
{
    rjob *j = (rjob *)w;
    cairn_rpc_context ctx = {.api = &j->r->api, .limits = g_limits};
    uint64_t seed = 0;
    j->rc = cairn_rpc_decode(&ctx, j->msg, j->len, &seed, &j->call, &j->err);
}

static void decode_done(uv_work_t *w, int status)
{
    (void)status;
    rjob *j = (rjob *)w;
    rclient *c = j->c;
    if (c) {
        c->decoding = NULL;
        envelope e;
        read_envelope(j->msg, j->len, &e);
        if (j->rc != CAIRN_OK)
            c->r->counters.undecodable++;
        forward(c, j->msg, j->len, &e, j->rc == CAIRN_OK ? &j->call : NULL);
    }
    if (j->rc == CAIRN_OK)
        cairn_rpc_call_clear(&j->call);
    free(j->msg);
    free(j);
    if (c && !c->gone)
        client_process(c);
}

static void handle_message(rclient *c, const uint8_t *msg, size_t len)
{
    envelope e;
    bool readable = read_envelope(msg, len, &e);
    if (readable && e.type == 2)
        return; /* a notification from the client: none is defined */
    if (!readable && !e.has_msgid) {
        uint32_t id;
        if (cairn_rpc_peek_msgid(msg, len, &id)) {
            e.has_msgid = true;
            e.msgid = id;
        } else {
            rstream_close(&c->s); /* not a request at all, as a replica would */
            return;
        }
    }
    const bool decode = readable && (strcmp(e.method, "generate") == 0 ||
                                     strcmp(e.method, "session.open") == 0);
    if (decode && c->r->cfg.policy == ROUTE_POLICY_CACHE) {
        rjob *j = calloc(1, sizeof *j);
        if (j && (j->msg = malloc(len))) {
            memcpy(j->msg, msg, len);
            j->len = len;
            j->c = c;
            j->r = c->r;
            j->rc = CAIRN_EINVAL;
            c->decoding = j;
            if (uv_queue_work(&c->r->loop, &j->work, decode_work, decode_done) == 0)
                return;
            c->decoding = NULL;
            free(j->msg);
        }
        free(j);
    }
    forward(c, msg, len, &e, NULL);
}

static void client_process(rclient *c)
{
    while (!c->decoding && !c->s.closing && c->in_off < c->in_len) {
        const uint8_t *msg = (const uint8_t *)c->in + c->in_off;
        size_t avail = c->in_len - c->in_off, used;
        bool complete;
        int rc = cairn_mp_scan(&c->sc, msg + c->scanned, avail - c->scanned, &used, &complete);
        c->scanned += used;
        if (rc == CAIRN_OK) {
            if (!complete && !c->skipping)
                break;
            size_t whole = c->scanned;
            if (complete && !c->skipping)
                handle_message(c, msg, whole);
            c->in_off += whole;
            c->scanned = 0;
            if (!complete)
                break;
            c->skipping = false;
            cairn_mp_scanner_reset(&c->sc, &g_limits);
            continue;
        }
        uint32_t msgid;
        if (!c->skipping && cairn_rpc_peek_msgid(msg, avail, &msgid))
            send_error(c, msgid, rc == CAIRN_ERANGE ? CAIRN_RPC_TOO_LARGE : CAIRN_RPC_INVALID_REQUEST,
                       c->sc.error ? c->sc.error : "malformed message");
        if (rc == CAIRN_ERANGE && c->sc.can_skip) {
            c->in_off += c->scanned;
            c->scanned = 0;
            cairn_mp_scanner_skip(&c->sc);
            c->skipping = true;
            continue;
        }
        rstream_finish(&c->s);
        return;
    }
    if (c->in_off == c->in_len)
        c->in_off = c->in_len = 0;
    if (!c->s.closing)
        rstream_read(&c->s, !c->decoding);
}

static void client_read(rstream *s, const char *buf, ssize_t n)
{
    rclient *c = s->owner;
    if (n < 0)
        return; /* net.c closes it: client_closed */
    if (c->in_len + (size_t)n > c->in_cap) {
        if (c->in_off) {
            memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
            c->in_len -= c->in_off;
            c->in_off = 0;
        }
        size_t cap = c->in_cap ? c->in_cap : 65536;
        while (cap < c->in_len + (size_t)n)
            cap *= 2;
        char *p = realloc(c->in, cap);
        if (!p) {
            rstream_close(&c->s);
            return;
        }
        c->in = p;
        c->in_cap = cap;
    }
    memcpy(c->in + c->in_len, buf, (size_t)n);
    c->in_len += (size_t)n;
    c->last_byte = cairn_now();
    client_process(c);
}

static void client_closed(rstream *s)
{
    rclient *c = s->owner;
    if (c->prev)
        c->prev->next = c->next;
    else
        c->r->rpc_clients = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->gone = true;
    if (c->decoding)
        c->decoding->c = NULL;
    for (int i = 0; i < ROUTE_MAX_REPLICAS; i++) {
        rup *u = c->up[i];
        if (u) {
            u->c = NULL; /* closing it makes the replica cancel what runs */
            rstream_close(&u->s);
        }
    }
    while (c->n_pend)
        pend_remove(c, &c->pend[c->n_pend - 1], false);
    free(c->pend);
    free(c->in);
    free(c->auth_msg);
    free(c->pending_auth);
    free(c);
}

void route_rpc_accept(cairn_router *r, uv_stream_t *listener)
{
    static bool ready;
    if (!ready) {
        ready = true;
        cairn_mp_limits_default(&g_limits);
        /* what a replica sends is trusted as far as its size goes */
        g_up_limits = g_limits;
        g_up_limits.max_message_bytes = 1u << 30;
        g_up_limits.max_string_bytes = 1u << 30;
        g_up_limits.max_array_len = 1u << 28;
        g_up_limits.max_map_len = 1u << 24;
    }
    rclient *c = calloc(1, sizeof *c);
    if (!c)
        return;
    c->r = r;
    cairn_mp_scanner_reset(&c->sc, &g_limits);
    rstream_init(&r->loop, &c->s, c);
    c->s.on_read = client_read;
    c->s.on_close = client_closed;
    c->s.max_pending = r->cfg.max_output_bytes;
    c->last_byte = cairn_now();
    c->next = r->rpc_clients; /* before anything can close it */
    if (c->next)
        c->next->prev = c;
    r->rpc_clients = c;
    if (rstream_accept(listener, &c->s) != CAIRN_OK) {
        rstream_close(&c->s);
        return;
    }
    rstream_read(&c->s, true);
}

void route_rpc_fail_slot(cairn_router *r, int slot)
{
    for (rclient *c = r->rpc_clients; c; c = c->next)
        if (c->up[slot])
            rstream_close(&c->up[slot]->s); /* its close answers what was pending */
}

void route_rpc_sweep(cairn_router *r, double now)
{
    for (rclient *c = r->rpc_clients, *next; c; c = next) {
        next = c->next;
        /* half a message (or one being skipped) must keep arriving */
        const bool partial = c->in_len > c->in_off || c->skipping;
        if (partial && !c->decoding && !c->s.closing && now - c->last_byte >= r->cfg.idle_timeout_s)
            rstream_close(&c->s);
    }
}
