/*
 * store/disk_shared.c — tier 3: a Redis shared by replicas, under the disk
 * tier. Two connections, each owned by one thread, so the engine thread
 * never waits for Redis:
 *
 *   reader   the disk's I/O thread. After a batch, the page reads that
 *            missed in LMDB ask Redis (one pipeline of GETs for the whole
 *            batch) and record gets that missed ask for the record; what
 *            comes back is verified like an LMDB value before use.
 *   writer   a thread of its own, fed by a queue: pages the cache chose to
 *            share, session records after their local commit, record
 *            deletions, and page events (XADD to the events stream). The
 *            queue is bounded in bytes; past the bound new items are
 *            dropped and counted.
 *
 * Keys (P the configured prefix, hex lower-case):
 *     P p:<namespace root>:<page hash>   a page, in the disk value format
 *     P c:<namespace root>:<page hash>   the pages after it: a hash of child
 *                                        key (16 bytes) -> its tokens (LE),
 *                                        with the pages' TTL (read_child)
 *     P s:<namespace root>:<page hash>   its lookup mark: "<looker> <unix ms>
 *                                        <w>", set once (NX) by the first
 *                                        replica to look the page up; w = 1
 *                                        when that replica gives Redis every
 *                                        page it computes
 *     P r:<record key>                   a durable record's value
 *     P events                           the stream of page events
 *
 * Failure is never a failed request. A command that fails at the
 * connection level (refused, reset, timed out) drops the connection and
 * marks that side down for a back-off (1 s, doubling to 30 s) during which
 * reads are misses and writes wait in the queue; a log line says so once
 * per outage, and the stats count outages. A value that fails its checks
 * is deleted from Redis and the read is a miss.
 */
#include "store/tiers.h"
#include "store/disk_impl.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SHARED_DEFAULT_PREFIX "cairn:"
#define SHARED_DEFAULT_TIMEOUT_MS 250
#define SHARED_DEFAULT_QUEUE_BYTES ((size_t)64 << 20)
#define SHARED_BACKOFF_MIN_S 1.0
#define SHARED_BACKOFF_MAX_S 30.0
#define SHARED_STREAM_MAXLEN "1000000"
#define SHARED_PIPELINE_MAX 256 /* writer commands per round trip */
#define SHARED_DEFAULT_PAGE_TTL_S (7L * 24 * 3600)

enum { ITEM_SET = 1, ITEM_DEL, ITEM_EVENT, ITEM_INDEX };
#define ITEM_MAX_ARGS 20

/* A queued write: one Redis command, its arguments back to back in data[]
 * (lens[i] bytes each). `kind` only feeds the counters. */
typedef struct shared_item {
    struct shared_item *next;
    int kind;
    int argc;
    size_t lens[ITEM_MAX_ARGS];
    size_t bytes; /* of data[] */
    uint8_t data[];
} shared_item;

/* One connection and its back-off: the owning thread's alone. */
typedef struct {
    redisContext *ctx;
    double retry_at; /* no attempt before this (cairn_now) */
    double backoff;
    bool down_logged;
} link_state;

struct disk_shared {
    cairn_redis_address addr;
    char *prefix, *replica;
    char where[300]; /* host:port or the socket path, for log lines */
    int timeout_ms;
    size_t queue_bytes;
    char page_ttl[24]; /* seconds, as SET ... EX takes them */
    char ns_hex[33];
    char looker[17];   /* this process in lookup marks (random, hex) */
    bool writes_computed;

    link_state reader; /* the disk's I/O thread only */
    link_state writer; /* the writer thread only     */

    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu; /* the queue and the counters below */
    pthread_cond_t cv;
    shared_item *head, *tail;
    size_t queued_bytes;
    bool stopping;
    uint64_t puts, dropped, errors, events, outages;
    double last_ok, last_failed; /* cairn_now of the last exchange that worked /
                                    failed, either connection: "up" is the
                                    later being a success                   */
};

static void note_exchange(disk_shared *s, bool ok)
{
    double now = cairn_now();
    pthread_mutex_lock(&s->mu);
    if (ok)
        s->last_ok = now;
    else
        s->last_failed = now;
    pthread_mutex_unlock(&s->mu);
}

static void hex_of(const uint8_t *b, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[2 * n] = '\0';
}

/* ---- connections -------------------------------------------------------- */

static void link_drop(disk_shared *s, link_state *l, const char *side, const char *why_in)
{
    char why[128]; /* often the context's own errstr, freed below */
    snprintf(why, sizeof why, "%s", why_in ? why_in : "unknown");
    if (l->ctx) {
        redisFree(l->ctx);
        l->ctx = NULL;
    }
    double now = cairn_now();
    l->backoff = l->backoff > 0 ? l->backoff * 2 : SHARED_BACKOFF_MIN_S;
    if (l->backoff > SHARED_BACKOFF_MAX_S)
        l->backoff = SHARED_BACKOFF_MAX_S;
    l->retry_at = now + l->backoff;
    note_exchange(s, false);
    if (!l->down_logged) {
        l->down_logged = true;
        pthread_mutex_lock(&s->mu);
        s->outages++;
        pthread_mutex_unlock(&s->mu);
        cairn_log(CAIRN_LOG_WARN,
                  "shared cache: %s connection to %s down (%s); serving from the local tiers, "
                  "retrying in the background",
                  side, s->where, why);
    }
}

/* Connected, or false during a back-off / when the attempt failed. */
static bool link_up(disk_shared *s, link_state *l, const char *side)
{
    if (l->ctx)
        return true;
    if (cairn_now() < l->retry_at)
        return false;
    char why[160] = "";
    l->ctx = cairn_redis_connect(&s->addr, s->timeout_ms, s->timeout_ms, why, sizeof why);
    if (!l->ctx) {
        link_drop(s, l, side, why);
        return false;
    }
    if (l->down_logged)
        cairn_log(CAIRN_LOG_INFO, "shared cache: %s connection to %s is back", side, s->where);
    l->down_logged = false;
    l->backoff = 0;
    note_exchange(s, true);
    return true;
}

/* ---- keys --------------------------------------------------------------- */

/* P <kind>:<ns>:<hash> into out: a page ("p") or its lookup marker ("s"). */
static size_t page_key_of(const disk_shared *s, const char *kind, const uint8_t key[16],
                          char *out, size_t cap)
{
    char h[33];
    hex_of(key, 16, h);
    int n = snprintf(out, cap, "%s%s:%s:%s", s->prefix, kind, s->ns_hex, h);
    return n < 0 || (size_t)n >= cap ? 0 : (size_t)n;
}

static size_t page_key(const disk_shared *s, const uint8_t key[16], char *out, size_t cap)
{
    return page_key_of(s, "p", key, out, cap);
}

/* "some replica looked this page up": the second to do so shares it */
static size_t seen_key(const disk_shared *s, const uint8_t key[16], char *out, size_t cap)
{
    return page_key_of(s, "s", key, out, cap);
}

/* Whether a lookup mark (the GET of it) says another process that writes
 * what it computes looked the page up less than CAIRN_SHARED_BUSY_S ago.
 * Marks of older versions ("1") and of this process say no. */
static bool mark_busy(const disk_shared *s, const void *reply)
{
    const redisReply *v = reply;
    if (!v || v->type != REDIS_REPLY_STRING || v->len >= 64)
        return false;
    char buf[64], who[64];
    memcpy(buf, v->str, v->len);
    buf[v->len] = '\0';
    long long ms;
    int writes;
    if (sscanf(buf, "%63s %lld %d", who, &ms, &writes) != 3 || !writes ||
        strcmp(who, s->looker) == 0)
        return false;
    const double age = cairn_wall_now() - (double)ms / 1000;
    return age < CAIRN_SHARED_BUSY_S && age > -CAIRN_SHARED_BUSY_S; /* clocks drift a little */
}

/* P r:<hex of the record key> (malloc'd). */
static char *record_key(const disk_shared *s, const uint8_t *key, size_t len, size_t *out_len)
{
    size_t pl = strlen(s->prefix);
    char *k = malloc(pl + 2 + 2 * len + 1);
    if (!k)
        return NULL;
    memcpy(k, s->prefix, pl);
    memcpy(k + pl, "r:", 2);
    hex_of(key, len, k + pl + 2);
    *out_len = pl + 2 + 2 * len;
    return k;
}

/* ---- the reader: the disk's I/O thread ------------------------------------ */

typedef struct {
    uint64_t hits, misses, corrupt, bytes;
} read_counts;

/* A read child that missed in LMDB (tiers.h, cairn_disk_read_child): the
 * parent's list in Redis, the child sharing the most with next[], then that
 * page. Two round trips, at most one per fetch. False when the connection
 * failed (it was dropped). */
static bool serve_child(cairn_disk *d, disk_req *r, read_counts *rc)
{
    disk_shared *s = d->shared;
    redisContext *c = s->reader.ctx;
    const int ps = d->cfg.page_size;
    const size_t tok_bytes = 4 * (size_t)ps;
    const uint8_t *next = r->data; /* int32_t, unaligned */
    const cairn_page_hash parent = cairn_page_hash_from_bytes(r->parent);
    char k[256];
    size_t kl = page_key_of(s, "c", r->parent, k, sizeof k);
    const char *hv[2] = {"HGETALL", k};
    const size_t hl[2] = {7, kl};
    redisReply *list = redisCommandArgv(c, 2, hv, hl);
    if (!list) {
        link_drop(s, &s->reader, "read", c->errstr[0] ? c->errstr : "no reply");
        return false;
    }
    r->shared_asked = true;
    int best = 0;
    uint8_t best_key[16], *best_tokens = malloc(tok_bytes);
    int32_t *tok = malloc(tok_bytes);
    for (size_t i = 0; best_tokens && tok && list->type == REDIS_REPLY_ARRAY &&
                       i + 1 < list->elements; i += 2) {
        const redisReply *f = list->element[i], *v = list->element[i + 1];
        if (f->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING || f->len != 16 ||
            v->len != tok_bytes)
            continue;
        int l = disk_child_match(parent, (const uint8_t *)f->str, (const uint8_t *)v->str, ps,
                                 next, r->n_next, best);
        if (l > 0) {
            best = l;
            memcpy(best_key, f->str, 16);
            memcpy(best_tokens, v->str, tok_bytes);
        }
    }
    freeReplyObject(list);
    bool ok = true;
    if (best > 0) {
        char pk[256];
        size_t pkl = page_key(s, best_key, pk, sizeof pk);
        const char *gv[2] = {"GET", pk};
        const size_t gl[2] = {3, pkl};
        redisReply *page = redisCommandArgv(c, 2, gv, gl);
        if (!page) {
            link_drop(s, &s->reader, "read", c->errstr[0] ? c->errstr : "no reply");
            ok = false;
        } else if (page->type == REDIS_REPLY_STRING &&
                   disk_value_ok(d, (const uint8_t *)page->str, page->len, best_tokens)) {
            memcpy(r->dst, (const uint8_t *)page->str + CAIRN_DISK_HEADER_BYTES + tok_bytes,
                   d->cfg.page_bytes);
            disk_tokens_from_le(tok, best_tokens, ps);
            r->result = tok; /* handed over */
            tok = NULL;
            r->result_bytes = tok_bytes;
            memcpy(r->key, best_key, 16);
            r->matched = best;
            r->status = CAIRN_OK;
            r->from_shared = true;
            rc->hits++;
            rc->bytes += d->cfg.page_bytes;
        } else if (page->type == REDIS_REPLY_STRING) {
            rc->corrupt++; /* never used; deleted so nobody else tries it */
            disk_shared_delete_key(d, pk, pkl);
        }
        if (page)
            freeReplyObject(page);
    }
    free(best_tokens);
    free(tok);
    if (r->status != CAIRN_OK)
        rc->misses++;
    return ok;
}

void disk_shared_serve(cairn_disk *d, disk_req *list)
{
    disk_shared *s = d->shared;
    if (!s)
        return;
    size_t n_pages = 0, n_records = 0, n_children = 0;
    for (disk_req *r = list; r; r = r->next) {
        n_pages += r->op == CAIRN_DISK_READ && r->status == CAIRN_ENOTFOUND;
        n_records += r->op == CAIRN_DISK_RECORD_GET && r->status == CAIRN_ENOTFOUND;
        n_children += r->op == CAIRN_DISK_READ_CHILD && r->status == CAIRN_ENOTFOUND;
    }
    if (n_pages + n_records + n_children == 0 || !link_up(s, &s->reader, "read"))
        return;
    read_counts children = {0};
    for (disk_req *r = list; r && n_children; r = r->next)
        if (r->op == CAIRN_DISK_READ_CHILD && r->status == CAIRN_ENOTFOUND &&
            !serve_child(d, r, &children))
            return; /* the connection went: the rest stay misses */
    redisContext *c = s->reader.ctx;
    size_t sent = 0;
    for (disk_req *r = list; r; r = r->next) {
        if (r->status != CAIRN_ENOTFOUND)
            continue;
        if (r->op == CAIRN_DISK_READ) {
            char k[256], m[256];
            size_t kl = page_key(s, r->key, k, sizeof k);
            const char *argv[2] = {"GET", k};
            const size_t lens[2] = {3, kl};
            redisAppendCommandArgv(c, 2, argv, lens);
            /* and leave a mark: the second replica to look a page up (a
             * prefix seen twice in the cluster) learns that it was, and
             * from the mark's value who looked, when, and whether that
             * replica gives Redis what it computes */
            size_t ml = seen_key(s, r->key, m, sizeof m);
            char val[64];
            int vl = snprintf(val, sizeof val, "%s %lld %d", s->looker,
                              (long long)(cairn_wall_now() * 1000),
                              s->writes_computed ? 1 : 0);
            const char *mv[6] = {"SET", m, val, "NX", "EX", s->page_ttl};
            const size_t ml_[6] = {3, ml, (size_t)vl, 2, 2, strlen(s->page_ttl)};
            redisAppendCommandArgv(c, 6, mv, ml_);
            const char *gv[2] = {"GET", m};
            const size_t gl[2] = {3, ml};
            redisAppendCommandArgv(c, 2, gv, gl);
            r->shared_asked = true;
            sent++;
        } else if (r->op == CAIRN_DISK_RECORD_GET) {
            size_t kl;
            char *k = record_key(s, r->data, r->key_len, &kl);
            if (!k)
                continue;
            const char *argv[2] = {"GET", k};
            const size_t lens[2] = {3, kl};
            redisAppendCommandArgv(c, 2, argv, lens);
            free(k);
            r->shared_asked = true;
            sent++;
        }
    }
    uint64_t hits = children.hits, misses = children.misses, corrupt = children.corrupt,
             bytes = children.bytes;
    size_t tok_bytes = 4 * (size_t)d->cfg.page_size;
    size_t got = 0;
    for (disk_req *r = list; r && got < sent; r = r->next) {
        if (!r->shared_asked || r->op == CAIRN_DISK_READ_CHILD)
            continue;
        void *reply = NULL;
        if (redisGetReply(c, &reply) != REDIS_OK) {
            link_drop(s, &s->reader, "read", c->errstr[0] ? c->errstr : "no reply");
            break; /* the rest stay misses */
        }
        got++;
        redisReply *rep = reply;
        bool have = rep && rep->type == REDIS_REPLY_STRING;
        if (r->op == CAIRN_DISK_READ) {
            void *mark = NULL;
            if (redisGetReply(c, &mark) != REDIS_OK) {
                freeReplyObject(rep);
                link_drop(s, &s->reader, "read", c->errstr[0] ? c->errstr : "no reply");
                break;
            }
            void *value = NULL;
            if (redisGetReply(c, &value) != REDIS_OK) {
                freeReplyObject(rep);
                freeReplyObject(mark);
                link_drop(s, &s->reader, "read", c->errstr[0] ? c->errstr : "no reply");
                break;
            }
            /* NX refused: the mark was there, someone looked before us */
            r->seen_elsewhere = mark && ((redisReply *)mark)->type == REDIS_REPLY_NIL;
            r->busy_elsewhere = r->seen_elsewhere && mark_busy(s, value);
            freeReplyObject(mark);
            freeReplyObject(value);
            if (have && disk_value_ok(d, (const uint8_t *)rep->str, rep->len, r->data)) {
                memcpy(r->dst, (const uint8_t *)rep->str + CAIRN_DISK_HEADER_BYTES + tok_bytes,
                       d->cfg.page_bytes);
                r->status = CAIRN_OK;
                r->from_shared = true;
                hits++;
                bytes += d->cfg.page_bytes;
            } else {
                misses++;
                if (have) {
                    /* never used; delete it so nobody else tries it */
                    corrupt++;
                    char k[256];
                    size_t kl = page_key(s, r->key, k, sizeof k);
                    disk_shared_delete_key(d, k, kl);
                }
            }
        } else if (have) {
            free(r->result);
            r->result = malloc(rep->len ? rep->len : 1);
            if (r->result) {
                memcpy(r->result, rep->str, rep->len);
                r->result_bytes = rep->len;
                r->status = CAIRN_OK;
                r->from_shared = true;
            }
        }
        freeReplyObject(rep);
    }
    if (s->reader.ctx)
        note_exchange(s, true);
    pthread_mutex_lock(&d->cmu);
    d->stats.shared_hits += hits;
    d->stats.shared_misses += misses;
    d->stats.shared_corrupt += corrupt;
    d->stats.bytes_read += bytes;
    pthread_mutex_unlock(&d->cmu);
}

/* ---- the writer --------------------------------------------------------- */

static int enqueue(disk_shared *s, shared_item *it)
{
    pthread_mutex_lock(&s->mu);
    if (s->stopping || s->queued_bytes + it->bytes > s->queue_bytes) {
        s->dropped++;
        pthread_mutex_unlock(&s->mu);
        free(it);
        return CAIRN_EFULL;
    }
    s->queued_bytes += it->bytes;
    if (s->tail)
        s->tail->next = it;
    else
        s->head = it;
    s->tail = it;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return CAIRN_OK;
}

/* An item of `argc` arguments (args[i] of lens[i] bytes). */
static shared_item *item_of(int kind, int argc, const void *const *args, const size_t *lens)
{
    size_t bytes = 0;
    for (int i = 0; i < argc; i++)
        bytes += lens[i];
    shared_item *it = malloc(sizeof *it + bytes);
    if (!it)
        return NULL;
    memset(it, 0, sizeof *it);
    it->kind = kind;
    it->argc = argc;
    it->bytes = bytes;
    uint8_t *at = it->data;
    for (int i = 0; i < argc; i++) {
        it->lens[i] = lens[i];
        if (lens[i])
            memcpy(at, args[i], lens[i]);
        at += lens[i];
    }
    return it;
}

void disk_shared_delete_key(cairn_disk *d, const char *key, size_t len)
{
    const void *args[2] = {"DEL", key};
    const size_t lens[2] = {3, len};
    shared_item *it = item_of(ITEM_DEL, 2, args, lens);
    if (it)
        enqueue(d->shared, it);
}

void disk_shared_record_put(cairn_disk *d, const disk_req *r)
{
    disk_shared *s = d->shared;
    size_t kl;
    char *k = record_key(s, r->data, r->key_len, &kl);
    if (!k)
        return;
    const void *args[3] = {"SET", k, r->data + r->key_len};
    const size_t lens[3] = {3, kl, r->bytes - r->key_len};
    shared_item *it = item_of(ITEM_SET, 3, args, lens);
    if (it)
        enqueue(s, it);
    free(k);
}

/* Append one item's command to the pipeline. */
static void append_item(redisContext *c, const shared_item *it)
{
    const char *argv[ITEM_MAX_ARGS];
    const uint8_t *at = it->data;
    for (int i = 0; i < it->argc; i++) {
        argv[i] = (const char *)at;
        at += it->lens[i];
    }
    redisAppendCommandArgv(c, it->argc, argv, it->lens);
}

static void *writer_main(void *arg)
{
    cairn_disk *d = arg;
    disk_shared *s = d->shared;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->head && !s->stopping)
            pthread_cond_wait(&s->cv, &s->mu);
        if (!s->head) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        bool stopping = s->stopping;
        pthread_mutex_unlock(&s->mu);

        if (!link_up(s, &s->writer, "write")) {
            if (stopping) {
                /* shutting down with Redis away: what waits is dropped */
                pthread_mutex_lock(&s->mu);
                for (shared_item *it = s->head, *n; it; it = n) {
                    n = it->next;
                    s->dropped++;
                    free(it);
                }
                s->head = s->tail = NULL;
                s->queued_bytes = 0;
                pthread_mutex_unlock(&s->mu);
                break;
            }
            /* wait out the back-off (or a stop) */
            double wait = s->writer.retry_at - cairn_now();
            if (wait > 0) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                double at = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + wait;
                ts.tv_sec = (time_t)at;
                ts.tv_nsec = (long)((at - (double)ts.tv_sec) * 1e9);
                pthread_mutex_lock(&s->mu);
                if (!s->stopping)
                    pthread_cond_timedwait(&s->cv, &s->mu, &ts);
                pthread_mutex_unlock(&s->mu);
            }
            continue;
        }
        /* take up to a pipeline's worth */
        pthread_mutex_lock(&s->mu);
        shared_item *batch = s->head, *last = s->head;
        size_t n = 1, bytes = last->bytes;
        while (n < SHARED_PIPELINE_MAX && last->next) {
            last = last->next;
            bytes += last->bytes;
            n++;
        }
        s->head = last->next;
        if (!s->head)
            s->tail = NULL;
        last->next = NULL;
        s->queued_bytes -= bytes;
        pthread_mutex_unlock(&s->mu);

        redisContext *c = s->writer.ctx;
        for (shared_item *it = batch; it; it = it->next)
            append_item(c, it);
        uint64_t ok = 0, refused = 0, events = 0;
        shared_item *it = batch;
        for (; it; it = it->next) {
            void *reply = NULL;
            if (redisGetReply(c, &reply) != REDIS_OK)
                break;
            redisReply *rep = reply;
            if (rep && rep->type == REDIS_REPLY_ERROR) {
                refused++;
                if (refused == 1)
                    cairn_log(CAIRN_LOG_WARN, "shared cache: Redis refused a write: %s", rep->str);
            } else {
                ok += it->kind == ITEM_SET;
                events += it->kind == ITEM_EVENT;
            }
            freeReplyObject(rep);
        }
        shared_item *unsent = it;
        if (!unsent)
            note_exchange(s, true);
        if (unsent) {
            /* The connection failed part-way: the rest go back to the front
             * of the queue (SET, DEL and XADD may be repeated safely). */
            link_drop(s, &s->writer, "write", c->errstr[0] ? c->errstr : "no reply");
            size_t back = 0;
            shared_item *tail = unsent;
            for (shared_item *x = unsent; x; x = x->next) {
                back += x->bytes;
                tail = x;
            }
            pthread_mutex_lock(&s->mu);
            tail->next = s->head;
            s->head = unsent;
            if (!s->tail)
                s->tail = tail;
            s->queued_bytes += back;
            pthread_mutex_unlock(&s->mu);
        }
        pthread_mutex_lock(&s->mu);
        s->puts += ok;
        s->errors += refused;
        s->events += events;
        pthread_mutex_unlock(&s->mu);
        for (shared_item *x = batch, *next; x != unsent; x = next) {
            next = x->next;
            free(x);
        }
    }
    return NULL;
}

/* ---- the calls ---------------------------------------------------------- */

int disk_shared_open(cairn_disk *d, char *err, size_t err_len)
{
    const cairn_shared_config *cfg = d->cfg.shared;
    if (!cfg || !cfg->url)
        return CAIRN_OK;
    disk_shared *s = calloc(1, sizeof *s);
    if (!s)
        return CAIRN_ENOMEM;
    d->shared = s;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    char why[400] = "";
    int rc = cairn_redis_address_parse(cfg->url, &s->addr, why, sizeof why);
    if (rc) {
        set_err(err, err_len, "shared cache: %s%s", why, "");
        return rc;
    }
    cairn_redis_address_describe(&s->addr, s->where, sizeof s->where);
    s->prefix = strdup(cfg->prefix ? cfg->prefix : SHARED_DEFAULT_PREFIX);
    if (cfg->replica && strlen(cfg->replica) > CAIRN_SHARED_REPLICA_MAX) {
        set_err(err, err_len, "shared cache: the replica id is longer than 200 bytes%s%s", "", "");
        return CAIRN_EINVAL;
    }
    s->replica = cfg->replica && cfg->replica[0] ? strdup(cfg->replica) : NULL;
    if (!s->prefix || (cfg->replica && cfg->replica[0] && !s->replica))
        return CAIRN_ENOMEM;
    if (strlen(s->prefix) > 128) {
        set_err(err, err_len, "shared cache: the key prefix is longer than 128 bytes%s%s", "", "");
        return CAIRN_EINVAL;
    }
    s->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : SHARED_DEFAULT_TIMEOUT_MS;
    s->queue_bytes = cfg->queue_bytes ? cfg->queue_bytes : SHARED_DEFAULT_QUEUE_BYTES;
    snprintf(s->page_ttl, sizeof s->page_ttl, "%ld",
             cfg->page_ttl_s > 0 ? cfg->page_ttl_s : SHARED_DEFAULT_PAGE_TTL_S);
    uint8_t ns[16];
    cairn_page_hash_to_bytes(d->cfg.ns, ns);
    hex_of(ns, 16, s->ns_hex);
    s->writes_computed = cfg->writes_computed;
    uint64_t who = 0;
    if (cairn_os_random(&who, sizeof who) != CAIRN_OK)
        who = (uint64_t)getpid() << 32 ^ (uint64_t)(cairn_wall_now() * 1e6);
    hex_of((const uint8_t *)&who, sizeof who, s->looker);
    d->cfg.shared = NULL; /* the caller's; not kept */
    if (pthread_create(&s->thread, NULL, writer_main, d) != 0)
        return CAIRN_ENOMEM;
    s->thread_started = true;
    /* Not required to succeed: an absent Redis is a degraded cache, not a
     * server that cannot start. The first attempt says which it is. */
    link_up(s, &s->reader, "read");
    return CAIRN_OK;
}

void disk_shared_close(cairn_disk *d)
{
    disk_shared *s = d->shared;
    if (!s)
        return;
    if (s->thread_started) {
        cairn_disk_publish(d, CAIRN_SHARED_BYE, NULL, 0); /* when named */
        pthread_mutex_lock(&s->mu);
        s->stopping = true;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    for (shared_item *it = s->head, *n; it; it = n) {
        n = it->next;
        free(it);
    }
    if (s->reader.ctx)
        redisFree(s->reader.ctx);
    if (s->writer.ctx)
        redisFree(s->writer.ctx);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->prefix);
    free(s->replica);
    free(s);
    d->shared = NULL;
}

bool cairn_disk_has_shared(const cairn_disk *d) { return d && d->shared; }

/* List a shared page under its parent: HSET P c:<ns>:<parent> <key>
 * <tokens>, then the list's TTL renewed to the pages'. */
static int list_child(disk_shared *s, const uint8_t parent[16], const uint8_t key[16],
                      const uint8_t *tokens_le, size_t tok_bytes)
{
    char k[256];
    size_t kl = page_key_of(s, "c", parent, k, sizeof k);
    const void *hargs[4] = {"HSET", k, key, tokens_le};
    const size_t hlens[4] = {4, kl, 16, tok_bytes};
    const void *eargs[3] = {"EXPIRE", k, s->page_ttl};
    const size_t elens[3] = {6, kl, strlen(s->page_ttl)};
    shared_item *h = item_of(ITEM_INDEX, 4, hargs, hlens);
    shared_item *e = h ? item_of(ITEM_INDEX, 3, eargs, elens) : NULL;
    if (!e) {
        free(h);
        return CAIRN_ENOMEM;
    }
    int rc = enqueue(s, h);
    if (rc == CAIRN_OK)
        rc = enqueue(s, e);
    else
        free(e);
    return rc;
}

int cairn_disk_share_page(cairn_disk *d, cairn_page_hash key, const cairn_disk_page_origin *origin,
                          const int32_t *tokens, const void *payload)
{
    if (!d || !tokens || !payload)
        return CAIRN_EINVAL;
    disk_shared *s = d->shared;
    if (!s)
        return CAIRN_EUNSUPPORTED;
    uint8_t kb[16];
    cairn_page_hash_to_bytes(key, kb);
    char k[256];
    size_t kl = page_key(s, kb, k, sizeof k);
    uint8_t *v = malloc(d->value_bytes);
    if (!v)
        return CAIRN_ENOMEM;
    disk_build_header(d, v);
    uint8_t parent[16];
    if (origin) {
        cairn_page_hash_to_bytes(origin->parent, parent);
        disk_parent_word(parent, v + DISK_PARENT_WORD_AT);
    }
    disk_tokens_to_le(v + CAIRN_DISK_HEADER_BYTES, tokens, d->cfg.page_size);
    memcpy(v + CAIRN_DISK_HEADER_BYTES + 4 * (size_t)d->cfg.page_size, payload, d->cfg.page_bytes);
    put_u64(v + 40, disk_value_checksum(v, d->value_bytes));
    const void *args[5] = {"SET", k, v, "EX", s->page_ttl};
    const size_t lens[5] = {3, kl, d->value_bytes, 2, strlen(s->page_ttl)};
    shared_item *it = item_of(ITEM_SET, 5, args, lens);
    int rc = it ? enqueue(s, it) : CAIRN_ENOMEM;
    /* listed after the page is queued: whoever finds the entry finds the page */
    if (rc == CAIRN_OK && origin && origin->has_parent)
        list_child(s, parent, kb, v + CAIRN_DISK_HEADER_BYTES, 4 * (size_t)d->cfg.page_size);
    free(v);
    return rc;
}

int cairn_disk_unshare_record(cairn_disk *d, const void *key, size_t key_len)
{
    if (!d || !key || !key_len)
        return CAIRN_EINVAL;
    if (!d->shared)
        return CAIRN_OK;
    size_t kl;
    char *k = record_key(d->shared, key, key_len, &kl);
    if (!k)
        return CAIRN_ENOMEM;
    disk_shared_delete_key(d, k, kl);
    free(k);
    return CAIRN_OK;
}

/* An XADD to the events stream: the fields every event has, then `extra`
 * field/value pairs. */
static int publish(cairn_disk *d, const char *op, int n_extra, const void *const *extra,
                   const size_t *extra_lens)
{
    disk_shared *s = d->shared;
    char stream[160], ps[16], replica[CAIRN_SHARED_REPLICA_MAX + 1];
    pthread_mutex_lock(&s->mu);
    bool named = s->replica != NULL;
    if (named)
        snprintf(replica, sizeof replica, "%s", s->replica);
    pthread_mutex_unlock(&s->mu);
    if (!named)
        return CAIRN_OK; /* no id yet (before the announce): nobody to name */
    snprintf(stream, sizeof stream, "%sevents", s->prefix);
    snprintf(ps, sizeof ps, "%d", d->cfg.page_size);
    const void *args[ITEM_MAX_ARGS] = {"XADD", stream, "MAXLEN", "~", SHARED_STREAM_MAXLEN, "*",
                                       "r", replica, "op", op, "ns", s->ns_hex, "ps", ps};
    size_t lens[ITEM_MAX_ARGS];
    int argc = 14;
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(args[i]);
    for (int i = 0; i < n_extra && argc < ITEM_MAX_ARGS; i++, argc++) {
        args[argc] = extra[i];
        lens[argc] = extra_lens[i];
    }
    shared_item *it = item_of(ITEM_EVENT, argc, args, lens);
    return it ? enqueue(s, it) : CAIRN_ENOMEM;
}

int cairn_disk_publish(cairn_disk *d, cairn_shared_event op, const cairn_page_hash *hashes,
                       size_t n)
{
    if (!d || (n && !hashes) || op < CAIRN_SHARED_STORED || op > CAIRN_SHARED_BYE)
        return CAIRN_EINVAL;
    if (!d->shared)
        return CAIRN_OK;
    static const char *const names[] = {"stored", "removed", "hello", "bye"};
    if (op == CAIRN_SHARED_HELLO || op == CAIRN_SHARED_BYE)
        return publish(d, names[op], 0, NULL, NULL);
    if (n == 0)
        return CAIRN_OK;
    uint8_t *h = malloc(16 * n);
    if (!h)
        return CAIRN_ENOMEM;
    for (size_t i = 0; i < n; i++)
        cairn_page_hash_to_bytes(hashes[i], h + 16 * i);
    const void *extra[2] = {"h", h};
    const size_t lens[2] = {1, 16 * n};
    int rc = publish(d, names[op], 2, extra, lens);
    free(h);
    return rc;
}

int cairn_disk_announce(cairn_disk *d, const char *replica, const char *http, const char *rpc)
{
    if (!d || (replica && (!replica[0] || strlen(replica) > CAIRN_SHARED_REPLICA_MAX)))
        return CAIRN_EINVAL;
    disk_shared *s = d->shared;
    if (!s)
        return CAIRN_OK;
    pthread_mutex_lock(&s->mu);
    if (!s->replica && replica)
        s->replica = strdup(replica);
    bool named = s->replica != NULL;
    pthread_mutex_unlock(&s->mu);
    if (!named)
        return CAIRN_OK;
    const void *extra[4] = {"http", http ? http : "", "rpc", rpc ? rpc : ""};
    const size_t lens[4] = {4, strlen(extra[1]), 3, strlen(extra[3])};
    return publish(d, "hello", 4, extra, lens);
}

void disk_shared_stats(const cairn_disk *d, cairn_disk_stats *out)
{
    disk_shared *s = d->shared;
    if (!s)
        return;
    pthread_mutex_t *mu = &s->mu;
    pthread_mutex_lock(mu);
    out->shared_on = true;
    /* up: the last exchange with Redis, on either connection, worked */
    out->shared_up = s->last_ok > 0 && s->last_ok >= s->last_failed;
    out->shared_puts = s->puts;
    out->shared_dropped = s->dropped;
    out->shared_errors = s->errors;
    out->shared_events = s->events;
    out->shared_outages = s->outages;
    out->shared_queued_bytes = s->queued_bytes;
    pthread_mutex_unlock(mu);
}
