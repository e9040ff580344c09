/*
 * route/events.c — the replicas' events (scaleout-contract: the stream
 * "P events", entries {r, op, ns, ps, h, http, rpc}) read on a thread of
 * their own with a blocking hiredis connection:
 *
 *   connect ─▶ XREAD COUNT 1000 BLOCK 1000 STREAMS P events <last id>
 *                 (from 0-0 at start: a restarted router rebuilds its index
 *                 from the whole stream, then follows it) ─▶ apply each entry
 *           ◀─ every few seconds, and after a reconnect: is the stream the
 *              one we were reading?  Two signs say it is not (Redis lost or
 *              flushed it): the router's own marker key is gone, or the
 *              stream's last id is below ours.  Then the index is cleared
 *              and read again from 0-0.
 *
 * Why a marker: the last id alone misses a flush that a replica writes
 * behind at once (a new stream's ids come from the clock, so they are above
 * ours again within a millisecond).  The marker "P router:<pid>-<random>"
 * is set with SET ... GET, one atomic step, with an expiry so routers that
 * go away leave nothing behind; a missing marker (a flush, a Redis restarted
 * without its data) is a reset.  A router stalled past the expiry rebuilds
 * once for nothing, which is safe.  A Redis that refuses the write (a
 * read-only user) leaves the last-id check alone.
 *
 *   hello    the replica's addresses, namespace root and page size; what
 *            the index held for it is forgotten (it starts afresh)
 *   stored   its pages: the index gains them
 *   removed  its pages: the index loses them
 *   bye      nothing more is routed to it; the index forgets it
 *
 * A Redis that is away only stops the index from learning: the router keeps
 * routing on what it knows and on its own predictions, and reconnects
 * every second.
 */
#include "route/route_impl.h"
#include "store/store.h"

#include <hiredis/hiredis.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    uint64_t ms, seq;
} stream_id;

static stream_id parse_id(const char *s)
{
    stream_id id = {0, 0};
    sscanf(s, "%" SCNu64 "-%" SCNu64, &id.ms, &id.seq);
    return id;
}

static bool id_less(stream_id a, stream_id b)
{
    return a.ms < b.ms || (a.ms == b.ms && a.seq < b.seq);
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

static bool parse_hex16(const char *s, size_t len, uint8_t out[ROUTE_HASH_BYTES])
{
    if (len != 2 * ROUTE_HASH_BYTES)
        return false;
    for (size_t i = 0; i < ROUTE_HASH_BYTES; i++) {
        int a = hexval(s[2 * i]), b = hexval(s[2 * i + 1]);
        if (a < 0 || b < 0)
            return false;
        out[i] = (uint8_t)(a << 4 | b);
    }
    return true;
}

typedef struct {
    const redisReply *r, *op, *ns, *ps, *h, *http, *rpc;
} entry_fields;

static void read_fields(const redisReply *kv, entry_fields *f)
{
    memset(f, 0, sizeof *f);
    if (!kv || kv->type != REDIS_REPLY_ARRAY)
        return;
    for (size_t i = 0; i + 1 < kv->elements; i += 2) {
        const redisReply *k = kv->element[i], *v = kv->element[i + 1];
        if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING)
            continue;
        if (k->len == 1 && k->str[0] == 'r')
            f->r = v;
        else if (k->len == 2 && memcmp(k->str, "op", 2) == 0)
            f->op = v;
        else if (k->len == 2 && memcmp(k->str, "ns", 2) == 0)
            f->ns = v;
        else if (k->len == 2 && memcmp(k->str, "ps", 2) == 0)
            f->ps = v;
        else if (k->len == 1 && k->str[0] == 'h')
            f->h = v;
        else if (k->len == 4 && memcmp(k->str, "http", 4) == 0)
            f->http = v;
        else if (k->len == 3 && memcmp(k->str, "rpc", 3) == 0)
            f->rpc = v;
    }
}

static bool op_is(const redisReply *op, const char *name)
{
    return op->len == strlen(name) && memcmp(op->str, name, op->len) == 0;
}

/* A short string field as a C string ("" when absent or too long). */
static void field_str(const redisReply *v, char *out, size_t cap)
{
    out[0] = '\0';
    if (v && v->len < cap && !memchr(v->str, '\0', v->len)) {
        memcpy(out, v->str, v->len);
        out[v->len] = '\0';
    }
}

/* Apply one entry; false when it is malformed (counted, skipped). */
static bool apply(cairn_router *r, const redisReply *kv)
{
    entry_fields f;
    read_fields(kv, &f);
    char id[128];
    field_str(f.r, id, sizeof id);
    if (!f.op || !id[0])
        return false;
    uint8_t ns[ROUTE_HASH_BYTES];
    const bool has_ns = f.ns && parse_hex16(f.ns->str, f.ns->len, ns);
    char ps_text[16];
    field_str(f.ps, ps_text, sizeof ps_text);
    const int ps = ps_text[0] ? atoi(ps_text) : 0;
    if (op_is(f.op, "hello")) {
        char http[128], rpc[128];
        field_str(f.http, http, sizeof http);
        field_str(f.rpc, rpc, sizeof rpc);
        pthread_mutex_lock(&r->reg_mu);
        int slot = route_reg_upsert_locked(r, id, http, rpc);
        if (slot >= 0) {
            if (has_ns) {
                memcpy(r->reg[slot].ns, ns, ROUTE_HASH_BYTES);
                r->reg[slot].has_ns = true;
            }
            if (ps > 0)
                r->reg[slot].ps = ps;
        }
        pthread_mutex_unlock(&r->reg_mu);
        if (slot < 0)
            return false;
        route_index_drop_slot(r->index, slot);
        cairn_log(CAIRN_LOG_INFO, "route: hello from replica %s (http %s, rpc %s)", id,
                  http[0] ? http : "-", rpc[0] ? rpc : "-");
        return true;
    }
    if (op_is(f.op, "bye")) {
        pthread_mutex_lock(&r->reg_mu);
        int slot = route_reg_find_locked(r, id);
        if (slot >= 0)
            r->reg[slot].gone = true;
        pthread_mutex_unlock(&r->reg_mu);
        if (slot >= 0) {
            route_index_drop_slot(r->index, slot);
            cairn_log(CAIRN_LOG_INFO, "route: bye from replica %s", id);
        }
        return true;
    }
    const bool stored = op_is(f.op, "stored");
    if (!stored && !op_is(f.op, "removed"))
        return false;
    if (!f.h || f.h->len % ROUTE_HASH_BYTES != 0)
        return false;
    pthread_mutex_lock(&r->reg_mu);
    /* pages of a replica whose hello is not (or no longer) in the stream:
     * known by id until a hello or a --replica gives its addresses */
    int slot = stored ? route_reg_upsert_locked(r, id, NULL, NULL) : route_reg_find_locked(r, id);
    if (slot >= 0 && stored) {
        if (has_ns && !r->reg[slot].has_ns) {
            memcpy(r->reg[slot].ns, ns, ROUTE_HASH_BYTES);
            r->reg[slot].has_ns = true;
        }
        if (ps > 0)
            r->reg[slot].ps = ps;
    }
    pthread_mutex_unlock(&r->reg_mu);
    if (slot < 0)
        return !stored;
    const uint8_t(*h)[ROUTE_HASH_BYTES] = (const uint8_t(*)[ROUTE_HASH_BYTES])f.h->str;
    const size_t n = f.h->len / ROUTE_HASH_BYTES;
    if (stored)
        route_index_store(r->index, slot, h, n);
    else
        route_index_remove(r->index, slot, h, n);
    return true;
}

/* The replicas' Redis (the URL `serve --shared-cache` takes): connected,
 * with a command timeout above XREAD's BLOCK so a dead link is noticed. */
static redisContext *connect_redis(const char *url)
{
    cairn_redis_address a;
    char why[400] = "";
    if (cairn_redis_address_parse(url, &a, why, sizeof why) != CAIRN_OK)
        return NULL;
    redisContext *c = cairn_redis_connect(&a, 2000, 5000, why, sizeof why);
    if (!c)
        cairn_log(CAIRN_LOG_DEBUG, "route: Redis: %s", why);
    return c;
}

/* The stream's last id, or 0-0 when it is empty or absent; false on error. */
static bool last_entry(redisContext *c, const char *key, stream_id *out)
{
    redisReply *rep = redisCommand(c, "XREVRANGE %s + - COUNT 1", key);
    if (!rep)
        return false;
    bool ok = rep->type == REDIS_REPLY_ARRAY;
    *out = (stream_id){0, 0};
    if (ok && rep->elements == 1 && rep->element[0]->type == REDIS_REPLY_ARRAY &&
        rep->element[0]->elements >= 1 && rep->element[0]->element[0]->type == REDIS_REPLY_STRING)
        *out = parse_id(rep->element[0]->element[0]->str);
    freeReplyObject(rep);
    return ok;
}

enum { MARKER_TTL_S = 600 };

typedef enum { MARKER_PRESENT, MARKER_MISSING, MARKER_UNUSABLE, MARKER_IO_ERROR } marker_state;

/* Sets the marker and says whether it was there before. */
static marker_state touch_marker(redisContext *c, const char *marker)
{
    redisReply *rep = redisCommand(c, "SET %s 1 EX %d GET", marker, (int)MARKER_TTL_S);
    if (!rep)
        return MARKER_IO_ERROR;
    marker_state st = rep->type == REDIS_REPLY_STRING ? MARKER_PRESENT
                      : rep->type == REDIS_REPLY_NIL  ? MARKER_MISSING
                                                      : MARKER_UNUSABLE;
    if (st == MARKER_UNUSABLE)
        cairn_log(CAIRN_LOG_DEBUG, "route: Redis refused the marker key (%s); flushes are seen "
                  "by the stream's last id only", rep->type == REDIS_REPLY_ERROR ? rep->str : "?");
    freeReplyObject(rep);
    return st;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static void *events_main(void *arg)
{
    cairn_router *r = arg;
    char key[512];
    snprintf(key, sizeof key, "%sevents", r->prefix);
    char last[64] = "0-0";
    redisContext *c = NULL;
    double last_check = 0;
    bool logged_down = false;
    char marker[600];
    uint64_t nonce = ((uint64_t)getpid() << 32) ^ (uint64_t)(cairn_now() * 1e6);
    snprintf(marker, sizeof marker, "%srouter:%d-%016" PRIx64, r->prefix, (int)getpid(), nonce);
    bool marker_set = false;  /* set by us, so its absence means a reset */
    bool marker_usable = true;
    while (!__atomic_load_n(&r->events_stop, __ATOMIC_ACQUIRE)) {
        if (!c) {
            c = connect_redis(r->cfg.redis_url);
            if (!c) {
                if (!logged_down)
                    cairn_log(CAIRN_LOG_WARN, "route: cannot reach Redis at %s; retrying",
                              r->cfg.redis_url);
                logged_down = true;
                __atomic_store_n(&r->events_connected, 0, __ATOMIC_RELAXED);
                sleep_s(1.0);
                continue;
            }
            logged_down = false;
            __atomic_store_n(&r->events_connected, 1, __ATOMIC_RELAXED);
            last_check = 0; /* check the stream at once after (re)connecting */
        }
        if (cairn_now() - last_check > 2.0) {
            stream_id tail;
            if (!last_entry(c, key, &tail)) {
                redisFree(c);
                c = NULL;
                continue;
            }
            bool lost_marker = false;
            if (marker_usable) {
                marker_state st = touch_marker(c, marker);
                if (st == MARKER_IO_ERROR) {
                    redisFree(c);
                    c = NULL;
                    continue;
                }
                marker_usable = st != MARKER_UNUSABLE;
                lost_marker = marker_set && st == MARKER_MISSING;
                marker_set = marker_usable;
            }
            last_check = cairn_now();
            if (lost_marker || id_less(tail, parse_id(last))) {
                /* the stream is not the one we read: Redis lost or flushed it */
                cairn_log(CAIRN_LOG_WARN, "route: the event stream was reset; rebuilding");
                route_index_clear(r->index);
                __atomic_add_fetch(&r->counters.stream_resets, 1, __ATOMIC_RELAXED);
                snprintf(last, sizeof last, "0-0");
            }
        }
        redisReply *rep = redisCommand(c, "XREAD COUNT 1000 BLOCK 1000 STREAMS %s %s", key, last);
        if (!rep) {
            cairn_log(CAIRN_LOG_WARN, "route: Redis: %s; reconnecting", c->errstr);
            redisFree(c);
            c = NULL;
            __atomic_store_n(&r->events_connected, 0, __ATOMIC_RELAXED);
            continue;
        }
        if (rep->type == REDIS_REPLY_ARRAY && rep->elements >= 1 &&
            rep->element[0]->type == REDIS_REPLY_ARRAY && rep->element[0]->elements == 2) {
            const redisReply *entries = rep->element[0]->element[1];
            for (size_t i = 0; entries->type == REDIS_REPLY_ARRAY && i < entries->elements; i++) {
                const redisReply *e = entries->element[i];
                if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 ||
                    e->element[0]->type != REDIS_REPLY_STRING)
                    continue;
                bool ok = apply(r, e->element[1]);
                __atomic_add_fetch(ok ? &r->counters.events : &r->counters.events_bad, 1,
                                   __ATOMIC_RELAXED);
                snprintf(last, sizeof last, "%.*s", (int)e->element[0]->len, e->element[0]->str);
            }
        } else if (rep->type == REDIS_REPLY_ERROR) {
            cairn_log(CAIRN_LOG_WARN, "route: XREAD: %s", rep->str);
            sleep_s(1.0);
        }
        freeReplyObject(rep);
    }
    if (c)
        redisFree(c);
    return NULL;
}

int route_events_start(cairn_router *r, char *err, size_t err_len)
{
    if (!r->cfg.redis_url)
        return CAIRN_OK;
    cairn_redis_address a;
    char why[400] = "";
    if (cairn_redis_address_parse(r->cfg.redis_url, &a, why, sizeof why) != CAIRN_OK)
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "--shared-cache: %s", why);
    __atomic_store_n(&r->events_stop, 0, __ATOMIC_RELEASE);
    if (pthread_create(&r->events_thread, NULL, events_main, r) != 0)
        return cairn_errorf(err, err_len, CAIRN_ENOMEM, "cannot start the events thread");
    r->has_events_thread = true;
    return CAIRN_OK;
}

void route_events_stop(cairn_router *r)
{
    if (!r->has_events_thread)
        return;
    __atomic_store_n(&r->events_stop, 1, __ATOMIC_RELEASE); /* seen within one XREAD BLOCK (1 s) */
    pthread_join(r->events_thread, NULL);
    r->has_events_thread = false;
}
