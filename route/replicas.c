/*
 * route/replicas.c — the replica registry (static replicas and those the
 * stream announces), health checks, and the choice of a replica for one
 * request with its load and prediction bookkeeping.
 *
 * Health: every health_interval_s each known replica with an HTTP address
 * gets `GET /health` on a new connection (one with only a msgpack address:
 * a TCP connect); an answer 200 is a success. health_failures failures in a
 * row make a replica down, a refused connection makes it down at once (as
 * does any refused proxy connection), one success brings it back.
 */
#include "route/route_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- registry ---------------------------------------------------------------- */

int route_reg_find_locked(cairn_router *r, const char *id)
{
    for (int s = 0; s < ROUTE_MAX_REPLICAS; s++)
        if (r->reg[s].used && strcmp(r->reg[s].id, id) == 0)
            return s;
    return -1;
}

static void set_addr(char *field, size_t cap, struct sockaddr_storage *addr, bool *has,
                     const char *text)
{
    if (!text)
        return;
    snprintf(field, cap, "%s", text);
    *has = text[0] && route_parse_hostport(text, addr) == CAIRN_OK;
    if (text[0] && !*has)
        cairn_log(CAIRN_LOG_WARN, "route: cannot resolve replica address '%s'", text);
}

int route_reg_upsert_locked(cairn_router *r, const char *id, const char *http, const char *rpc)
{
    int s = route_reg_find_locked(r, id);
    if (s < 0) {
        for (int k = 0; k < ROUTE_MAX_REPLICAS && s < 0; k++)
            if (!r->reg[k].used)
                s = k;
        /* full: the slot of a replica that said bye, or of one never heard
         * of but in old entries of the stream (no address), is taken over */
        for (int k = 0; k < ROUTE_MAX_REPLICAS && s < 0; k++)
            if (r->reg[k].gone || (!r->reg[k].is_static && !r->reg[k].has_http_addr &&
                                   !r->reg[k].has_rpc_addr))
                s = k;
        if (s < 0)
            return -1;
        if (r->reg[s].used) {
            route_index_drop_slot(r->index, s); /* (reg_mu, then the index's: the usual order) */
            r->reg[s].generation++;
        }
        route_reg_entry *e = &r->reg[s];
        const uint64_t generation = e->generation;
        memset(e, 0, sizeof *e);
        e->generation = generation + 1; /* whatever the loop knew of the slot is over */
        e->used = true;
        snprintf(e->id, sizeof e->id, "%s", id);
        e->ps = r->cfg.page_size;
    }
    route_reg_entry *e = &r->reg[s];
    const bool changed = (http && strcmp(http, e->http) != 0) || (rpc && strcmp(rpc, e->rpc) != 0);
    set_addr(e->http, sizeof e->http, &e->http_addr, &e->has_http_addr, http);
    set_addr(e->rpc, sizeof e->rpc, &e->rpc_addr, &e->has_rpc_addr, rpc);
    if (changed)
        e->generation++;
    e->gone = false;
    return s;
}

int route_replicas_add_static(cairn_router *r, const route_replica_spec *spec, char *err,
                              size_t err_len)
{
    const char *id = spec->id ? spec->id : spec->http ? spec->http : spec->rpc;
    if (!id)
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "a replica needs http= or rpc=");
    struct sockaddr_storage tmp;
    if ((spec->http && route_parse_hostport(spec->http, &tmp) != CAIRN_OK) ||
        (spec->rpc && route_parse_hostport(spec->rpc, &tmp) != CAIRN_OK))
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "replica %s: bad HOST:PORT", id);
    pthread_mutex_lock(&r->reg_mu);
    int s = route_reg_upsert_locked(r, id, spec->http ? spec->http : "",
                                    spec->rpc ? spec->rpc : "");
    if (s >= 0)
        r->reg[s].is_static = true;
    pthread_mutex_unlock(&r->reg_mu);
    if (s < 0)
        return cairn_errorf(err, err_len, CAIRN_EFULL, "more than %d replicas",
                            ROUTE_MAX_REPLICAS);
    return CAIRN_OK;
}

/* ---- health ------------------------------------------------------------------- */

typedef struct hcheck {
    rstream s;
    cairn_router *r;
    int slot;
    uint64_t generation;
    bool http;
    bool finished; /* success or failure counted */
    char buf[64];
    size_t len;
} hcheck;


static void mark(cairn_router *r, int slot, uint64_t generation, bool ok, bool at_once,
                 const char *why)
{
    route_live *lv = &r->live[slot];
    if (lv->generation != generation)
        return; /* the replica has moved since: this says nothing of it */
    char id[sizeof r->reg[slot].id];
    pthread_mutex_lock(&r->reg_mu);
    memcpy(id, r->reg[slot].id, sizeof id);
    pthread_mutex_unlock(&r->reg_mu);
    if (ok) {
        if (!lv->up)
            cairn_log(CAIRN_LOG_INFO, "route: replica %s is up", id);
        lv->up = true;
        lv->fails = lv->unanswered = 0;
        return;
    }
    lv->fails++;
    if (lv->up && (at_once || lv->fails >= r->cfg.health_failures)) {
        cairn_log(CAIRN_LOG_WARN, "route: replica %s is down (%s)", id, why);
        lv->up = false;
        route_http_drop_idle(r, slot);
    }
}

static void check_finish(hcheck *c, bool ok, bool at_once, const char *why)
{
    if (c->finished)
        return;
    c->finished = true;
    mark(c->r, c->slot, c->generation, ok, at_once, why);
    rstream_close(&c->s);
}

static void check_closed(rstream *s)
{
    hcheck *c = s->owner;
    check_finish(c, false, false, "no answer");
    if (c->r->live[c->slot].check == c)
        c->r->live[c->slot].check = NULL;
    free(c);
}

static void check_read(rstream *s, const char *buf, ssize_t n)
{
    hcheck *c = s->owner;
    if (n < 0) {
        check_finish(c, false, false, "closed without an answer");
        return;
    }
    size_t k = (size_t)n < sizeof c->buf - 1 - c->len ? (size_t)n : sizeof c->buf - 1 - c->len;
    memcpy(c->buf + c->len, buf, k);
    c->len += k;
    c->buf[c->len] = '\0';
    char *eol = strstr(c->buf, "\r\n");
    if (!eol && c->len < sizeof c->buf - 1)
        return;
    int status = 0;
    bool ok = sscanf(c->buf, "HTTP/%*d.%*d %d", &status) == 1 && status == 200;
    check_finish(c, ok, false, "GET /health failed");
}

static void check_connected(rstream *s, int status)
{
    hcheck *c = s->owner;
    if (status < 0) {
        check_finish(c, false, true, uv_strerror(status));
        return;
    }
    if (!c->http) {
        check_finish(c, true, false, NULL);
        return;
    }
    static const char req[] = "GET /health HTTP/1.1\r\nHost: cairn\r\nConnection: close\r\n\r\n";
    rstream_read(s, true);
    rstream_write(s, req, sizeof req - 1);
}

static void check_one(cairn_router *r, int slot)
{
    route_reg_entry e;
    pthread_mutex_lock(&r->reg_mu);
    e = r->reg[slot];
    pthread_mutex_unlock(&r->reg_mu);
    route_live *lv = &r->live[slot];
    if (!e.used || e.gone || (!e.has_http_addr && !e.has_rpc_addr)) {
        if (lv->up) {
            lv->up = false;
            route_http_drop_idle(r, slot);
        }
        return;
    }
    if (lv->generation != e.generation) {
        /* new addresses: a new replica as far as health goes */
        lv->generation = e.generation;
        lv->up = false;
        lv->fails = 0;
        route_http_drop_idle(r, slot);
    }
    if (r->live[slot].check) { /* the last one did not finish within the interval */
        check_finish((hcheck *)r->live[slot].check, false, false, "health check timed out");
        /* A replica that accepts but never answers is hung, not draining
         * (a draining one refuses connections and finishes what runs):
         * its requests in flight would wait forever, so they end now. */
        if (++lv->unanswered == r->cfg.health_failures) {
            cairn_log(CAIRN_LOG_WARN, "route: replica %s stopped answering; failing its requests",
                      e.id);
            route_http_fail_slot(r, slot);
            route_rpc_fail_slot(r, slot);
        }
    }
    hcheck *c = calloc(1, sizeof *c);
    if (!c)
        return;
    c->r = r;
    c->slot = slot;
    c->generation = e.generation;
    c->http = e.has_http_addr;
    rstream_init(&r->loop, &c->s, c);
    c->s.on_read = check_read;
    c->s.on_connect = check_connected;
    c->s.on_close = check_closed;
    r->live[slot].check = c;
    const struct sockaddr *addr =
        (const struct sockaddr *)(e.has_http_addr ? &e.http_addr : &e.rpc_addr);
    if (rstream_connect(&c->s, addr) != CAIRN_OK)
        check_finish(c, false, true, "connect failed");
}

static void on_health_timer(uv_timer_t *t)
{
    cairn_router *r = t->data;
    if (r->stopping)
        return;
    for (int s = 0; s < ROUTE_MAX_REPLICAS; s++)
        check_one(r, s);
    route_http_sweep(r, cairn_now());
    route_rpc_sweep(r, cairn_now());
    /* predictions nobody asked about again: a sweep now and then */
    const double now = cairn_now();
    if (now - r->last_sweep > 10.0) {
        r->last_sweep = now;
        route_index_expire(r->index, now);
    }
}

void route_health_start(cairn_router *r)
{
    uv_timer_init(&r->loop, &r->health_timer);
    r->health_timer.data = r;
    uint64_t ms = (uint64_t)(r->cfg.health_interval_s * 1000);
    if (ms < 10)
        ms = 10;
    uv_timer_start(&r->health_timer, on_health_timer, 0, ms);
}

void route_replica_failed(cairn_router *r, int slot, const char *why)
{
    if (slot < 0 || slot >= ROUTE_MAX_REPLICAS)
        return;
    r->live[slot].failures++;
    mark(r, slot, r->live[slot].generation, false, true, why);
}

/* ---- the choice ----------------------------------------------------------------- */

static const uint8_t k_zero_root[ROUTE_HASH_BYTES];

/* The hashes of c's prompt in the namespace of slot s (reg_mu held). */
static uint8_t (*hashes_for(cairn_router *r, const route_choice *c, int s, size_t *n_pages))
    [ROUTE_HASH_BYTES]
{
    const route_reg_entry *e = &r->reg[s];
    *n_pages = route_useful_pages(c->n_tokens, e->ps);
    if (!c->tokens || *n_pages == 0)
        return NULL;
    uint8_t(*h)[ROUTE_HASH_BYTES] = malloc(*n_pages * ROUTE_HASH_BYTES);
    if (!h) {
        *n_pages = 0;
        return NULL;
    }
    /* A replica that has not said its namespace gets only the router's own
     * predictions, under a root of zeros that no replica announces. */
    route_prompt_hashes(e->has_ns ? e->ns : k_zero_root, c->tenant, e->ps, c->tokens, *n_pages,
                        h);
    return h;
}

static bool usable(const cairn_router *r, const route_choice *c, int s)
{
    const route_reg_entry *e = &r->reg[s];
    return e->used && !e->gone && r->live[s].up && !(c->exclude >> s & 1) &&
           (!c->need_http || e->has_http_addr) && (!c->need_rpc || e->has_rpc_addr);
}

static bool same_namespace(const route_reg_entry *a, const route_reg_entry *b)
{
    return a->ps == b->ps && a->has_ns == b->has_ns &&
           (!a->has_ns || memcmp(a->ns, b->ns, ROUTE_HASH_BYTES) == 0);
}

void route_choose(cairn_router *r, route_choice *c)
{
    c->slot = -1;
    c->cached = 0;
    c->hashes = NULL;
    c->n_pages = 0;
    c->moved = false;
    c->uncached = c->decode = 0;
    const double now = cairn_now();
    uint32_t pages[ROUTE_MAX_REPLICAS] = {0};
    bool by_session = false;
    pthread_mutex_lock(&r->reg_mu);
    int sticky = c->sticky ? route_sessions_get(r->sessions, c->sticky) : -1;
    if (sticky >= 0 && usable(r, c, sticky)) {
        c->slot = sticky;
        by_session = true;
    } else {
        c->moved = sticky >= 0;
        uint64_t pending = 0;
        for (int s = 0; s < ROUTE_MAX_REPLICAS; s++)
            if (usable(r, c, s))
                pending |= 1ull << s;
        const uint64_t all = pending;
        if (r->cfg.policy == ROUTE_POLICY_CACHE && c->tokens) {
            /* one lookup per namespace (usually one for all replicas) */
            while (pending) {
                int s = __builtin_ctzll(pending);
                uint64_t group = 0;
                for (int t = s; t < ROUTE_MAX_REPLICAS; t++)
                    if ((pending >> t & 1) && same_namespace(&r->reg[s], &r->reg[t]))
                        group |= 1ull << t;
                size_t np;
                uint8_t(*h)[ROUTE_HASH_BYTES] = hashes_for(r, c, s, &np);
                uint32_t gp[ROUTE_MAX_REPLICAS];
                route_index_match(r->index, group, (const uint8_t(*)[ROUTE_HASH_BYTES])h, np, now,
                                  gp);
                free(h);
                for (int t = s; t < ROUTE_MAX_REPLICAS; t++)
                    if (group >> t & 1)
                        pages[t] = gp[t];
                pending &= ~group;
            }
        }
        route_candidate cand[ROUTE_MAX_REPLICAS];
        int n = 0;
        for (int s = 0; s < ROUTE_MAX_REPLICAS; s++) {
            if (!(all >> s & 1))
                continue;
            cand[n] = (route_candidate){.slot = s,
                                        .up = true,
                                        .cached = (int64_t)pages[s] * r->reg[s].ps,
                                        .load = r->live[s].load};
            n++;
        }
        int k = route_pick(r->cfg.policy, cand, n, (int64_t)c->n_tokens, &r->cfg.weights,
                           &r->rr_cursor);
        c->slot = k >= 0 ? cand[k].slot : -1;
    }
    if (c->slot >= 0) {
        c->cached = (int64_t)pages[c->slot] * r->reg[c->slot].ps;
        if (!by_session && c->tokens)
            c->hashes = hashes_for(r, c, c->slot, &c->n_pages);
    }
    pthread_mutex_unlock(&r->reg_mu);
    if (c->slot < 0)
        return;
    if (c->sticky && !by_session)
        route_sessions_set(r->sessions, c->sticky, c->slot);
    if (c->moved)
        r->counters.session_moves++;
    route_live *lv = &r->live[c->slot];
    c->uncached = (int64_t)c->n_tokens - c->cached;
    if (c->uncached < 0)
        c->uncached = 0;
    c->decode = route_expected_decode(c->max_tokens, r->cfg.decode_estimate);
    lv->load.prefill += c->uncached;
    lv->load.decode += c->decode;
    lv->load.inflight++;
    lv->routed++;
    lv->prompt_tokens += c->n_tokens;
    lv->predicted_cached_tokens += (uint64_t)c->cached;
    if (c->hashes)
        route_index_predict(r->index, c->slot, (const uint8_t(*)[ROUTE_HASH_BYTES])c->hashes,
                            c->n_pages, now + r->cfg.predict_ttl_s);
}

void route_progress(cairn_router *r, route_choice *c, int64_t tokens)
{
    if (c->slot < 0)
        return;
    route_live *lv = &r->live[c->slot];
    lv->load.prefill -= c->uncached;
    c->uncached = 0;
    int64_t k = tokens < c->decode ? tokens : c->decode;
    if (k > 0) {
        lv->load.decode -= k;
        c->decode -= k;
    }
}

void route_done(cairn_router *r, route_choice *c, bool ok)
{
    if (c->slot >= 0) {
        route_live *lv = &r->live[c->slot];
        lv->load.prefill -= c->uncached;
        lv->load.decode -= c->decode;
        lv->load.inflight--;
        if (ok && c->hashes)
            route_index_predict(r->index, c->slot, (const uint8_t(*)[ROUTE_HASH_BYTES])c->hashes,
                                c->n_pages, cairn_now() + r->cfg.predict_ttl_s);
    }
    free(c->hashes);
    c->hashes = NULL;
    c->n_pages = 0;
    c->slot = -1;
}
