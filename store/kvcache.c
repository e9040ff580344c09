/*
 * store/kvcache.c — the radix tree plus the three tiers: allocation with
 * eviction, asynchronous promotion, pinning, forgetting lost pages.
 *
 * Promotion in brief. promote() uploads HOST nodes on the path at once, and
 * for DISK nodes takes a host slot per page and queues a disk read into it;
 * then it queues a fence. The disk serves requests in order, so when the
 * fence completes every read this promotion (or an earlier one) queued for
 * the path has completed too; poll() then finishes the promotion: fully
 * loaded DISK nodes become HOST, HOST nodes go up to the device, and the
 * event is posted. While a load is in flight its page has host_slot >= 0 in
 * a DISK node, and slot_state[] says how the read went.
 *
 * Fetch (admission) in brief. fetch() matches in memory, asks the cost model
 * how many leading pages are worth having on the device, locks the node that
 * ends there and starts that node's promotion as above. When the choice goes
 * past the in-memory match, it also queues the first "round" of reads that
 * continue the match by page hash in LMDB (into host slots that are not in
 * the tree yet), all before the same fence. When the fence completes, the
 * in-memory path is finished first; then the round's leading hits get device
 * pages, are uploaded and inserted into the tree, the op's lock moves to the
 * new leaf, and, if every read of the round hit, the next round is queued.
 * The op's lock always sits on a node whose whole path is on the device.
 *
 * Cost model. Rates are measured as the cache runs: host->device uploads
 * (bytes / seconds, decayed sums), disk rounds (a decayed least-squares fit
 * of seconds = latency + bytes / rate over the rounds' fence latencies), and
 * the prefill rate the engine reports. See store.h for the priors.
 */
#include "store/store.h"

#include <stdlib.h>
#include <string.h>

/* slot_state[]: what a host slot is doing. SLOT_ORPHAN: a read is in
 * flight into it that nobody waits for any more; poll frees the slot when
 * the read completes. */
enum { SLOT_IDLE = 0, SLOT_LOADING, SLOT_LOADED, SLOT_MISSED, SLOT_ORPHAN };
enum { PAGE_LOST = 1 }; /* cairn_radix_page.flags: the disk copy is gone */

/* Disk cookies: the top four bits say what the completion is for; 0 is
 * nobody's (ignored). */
#define COOKIE_READ (1ull << 60)  /* value: host slot                      */
#define COOKIE_FENCE (2ull << 60) /* value: promotion id                   */
#define COOKIE_WRITE (3ull << 60)
#define COOKIE_FETCH (4ull << 60) /* value: fetch op id                    */
#define COOKIE_OP (5ull << 60)    /* value: pending op id (sync, records)  */
#define COOKIE_KIND(c) ((c) & (15ull << 60))
#define COOKIE_VALUE(c) ((c) & ~(15ull << 60))

/* Priors of the cost model (store.h explains the choice). */
#define PRIOR_COMPUTE_TOKENS_PER_S 2000.0
#define PRIOR_H2D_BYTES_PER_S 4e9
#define PRIOR_DISK_BYTES_PER_S 200e6
#define PRIOR_DISK_LATENCY_S 2e-3
#define RATE_DECAY 0.9 /* weight of the past in the decayed sums */

/* Reads of the first continuation round when few host slots are free: a
 * new prompt usually misses on disk at once, and probing it must not push
 * idle host pages down for nothing. Later rounds come only after a round
 * that hit throughout. */
#define FIRST_ROUND_MIN 4
#define NEXT_ROUND_MIN 256

typedef struct {
    uint64_t cookie; /* the caller's */
    uint64_t id;     /* fence cookie value */
    cairn_radix_node *node;
    size_t n_reads;  /* disk reads queued by this promotion (rate samples) */
} promotion;

typedef struct {
    uint64_t cookie, id;
    int kind;               /* CAIRN_KVCACHE_EV_*; -1: flush (no event)   */
    int status;             /* known before the completion (persist)     */
    size_t failures_before; /* write failures when queued (persist)      */
} pending_op;

typedef struct {
    uint64_t id, cookie;
    cairn_radix_node *node; /* locked by the op; its path is (being made) resident */
    bool promoting;         /* waiting for the in-memory path's loads */
    int status;
    uint64_t ns;            /* the namespace the tokens are looked up in */
    int32_t *tokens;        /* [n_target * page_size] */
    size_t n_lookup;        /* tokens the request asked about (hit/miss stats) */
    size_t n_target;        /* pages the op wants on the device */
    uint8_t *origin;        /* [n_target] tier of each page when fetch was called */
    size_t next;            /* pages of the tree path the op holds: continue here */
    int32_t *round;         /* host slots of the continuation round in flight */
    size_t n_round;
    size_t n_reads;         /* disk reads before the current fence (rate samples) */
    size_t skipped, lost;
} fetch_op;

/* Decayed sums for the rate estimates. */
typedef struct {
    double w, x, y, xx, xy;
} decayed_fit;

struct cairn_kvcache {
    cairn_backend *be;
    cairn_kv_layout L;
    cairn_page_pool *dev;
    cairn_host_pool *host;
    cairn_disk *disk;
    cairn_radix *tree;
    uint8_t *scratch;     /* one page of host memory: device -> disk          */
    uint8_t *slot_state;  /* [host capacity]                                 */

    promotion *promos;
    size_t n_promos, cap_promos;
    uint64_t next_promo;

    fetch_op **fetches;
    size_t n_fetches, cap_fetches;
    pending_op *ops;
    size_t n_ops, cap_ops;
    uint64_t next_op;
    cairn_page_hash ns;

    /* cost model */
    decayed_fit h2d;       /* x = bytes, y = seconds of uploads          */
    decayed_fit disk_fit;  /* x = bytes, y = seconds of disk rounds      */
    double compute_rate;   /* tokens/s reported by the engine (0: none)  */
    cairn_kvcache_rates rates;     /* the estimates in force              */
    bool rates_overridden;

    cairn_kvcache_event *events;
    size_t n_events, cap_events;

    cairn_radix_page **path; /* scratch for path walks */
    size_t path_cap;
    cairn_radix_node **nodes;
    size_t nodes_cap;

    cairn_kvcache_stats stats;
};

static void set_err(char *err, size_t len, const char *msg)
{
    if (err && len) {
        strncpy(err, msg, len - 1);
        err[len - 1] = 0;
    }
}

static uint8_t *dev_addr(cairn_kvcache *c, int32_t page)
{
    return (uint8_t *)cairn_page_pool_base(c->dev) + (size_t)page * c->L.page_bytes;
}

/* ---- create / free ------------------------------------------------------ */

int cairn_kvcache_create(const cairn_kvcache_config *cfg, cairn_kvcache **out, char *err,
                         size_t err_len)
{
    if (!cfg || !out || !cfg->backend || cfg->layout.page_bytes == 0 || cfg->layout.page_size <= 0)
        return CAIRN_EINVAL;
    if (cfg->disk_dir && cfg->host_bytes < cfg->layout.page_bytes) {
        /* Disk reads land in host slots; a disk tier needs a host tier. */
        set_err(err, err_len, "a disk tier needs a host tier of at least one page");
        return CAIRN_EINVAL;
    }
    cairn_kvcache *c = calloc(1, sizeof *c);
    if (!c)
        return CAIRN_ENOMEM;
    c->be = cfg->backend;
    c->L = cfg->layout;
    c->ns = cfg->ns;
    c->rates = (cairn_kvcache_rates){
        .compute_tokens_per_s = PRIOR_COMPUTE_TOKENS_PER_S,
        .h2d_bytes_per_s = PRIOR_H2D_BYTES_PER_S,
        .disk_bytes_per_s = PRIOR_DISK_BYTES_PER_S,
        .disk_latency_s = PRIOR_DISK_LATENCY_S,
    };
    int rc = cairn_page_pool_create(c->be, &c->L, cfg->device_bytes, &c->dev);
    if (rc) {
        set_err(err, err_len, "cannot create the device page pool");
        goto fail;
    }
    if (cfg->host_bytes >= c->L.page_bytes) {
        rc = cairn_host_pool_create(c->L.page_bytes, cfg->host_bytes, &c->host);
        if (rc) {
            set_err(err, err_len, "cannot create the host page pool");
            goto fail;
        }
        c->slot_state = calloc((size_t)cairn_host_pool_capacity(c->host), 1);
        if (!c->slot_state) {
            rc = CAIRN_ENOMEM;
            goto fail;
        }
    }
    rc = cairn_radix_create(c->L.page_size, cfg->ns, &c->tree);
    if (rc)
        goto fail;
    c->scratch = malloc(c->L.page_bytes);
    if (!c->scratch) {
        rc = CAIRN_ENOMEM;
        goto fail;
    }
    if (cfg->disk_dir) {
        cairn_disk_config dc = {
            .dir = cfg->disk_dir,
            .map_bytes = cfg->disk_map_bytes,
            .page_size = c->L.page_size,
            .page_bytes = c->L.page_bytes,
            .ns = cfg->ns,
            .durable = cfg->disk_durable,
            .reset_if_corrupt = true,
        };
        rc = cairn_disk_open(&dc, &c->disk, err, err_len);
        if (rc)
            goto fail;
    }
    *out = c;
    return CAIRN_OK;
fail:
    cairn_kvcache_free(c);
    return rc;
}

void cairn_kvcache_free(cairn_kvcache *c)
{
    if (!c)
        return;
    /* The disk first: its thread may still be reading into host slots. */
    cairn_disk_close(c->disk);
    cairn_radix_free(c->tree);
    cairn_host_pool_free(c->host);
    cairn_page_pool_free(c->dev);
    free(c->slot_state);
    free(c->scratch);
    free(c->promos);
    for (size_t i = 0; i < c->n_fetches; i++) {
        free(c->fetches[i]->tokens);
        free(c->fetches[i]->origin);
        free(c->fetches[i]->round);
        free(c->fetches[i]);
    }
    free(c->fetches);
    free(c->ops);
    for (size_t i = 0; i < c->n_events; i++)
        free(c->events[i].data);
    free(c->events);
    free(c->path);
    free(c->nodes);
    free(c);
}

cairn_radix *cairn_kvcache_tree(cairn_kvcache *c) { return c ? c->tree : NULL; }
cairn_page_pool *cairn_kvcache_device_pool(cairn_kvcache *c) { return c ? c->dev : NULL; }
cairn_host_pool *cairn_kvcache_host_pool(cairn_kvcache *c) { return c ? c->host : NULL; }
cairn_disk *cairn_kvcache_disk(cairn_kvcache *c) { return c ? c->disk : NULL; }

/* ---- the engine's sequences ------------------------------------------------ */

void *cairn_kvcache_kv_base(const cairn_kvcache *c) { return cairn_page_pool_base(c->dev); }
const cairn_kv_layout *cairn_kvcache_layout(const cairn_kvcache *c) { return &c->L; }
bool cairn_kvcache_has_disk(const cairn_kvcache *c) { return c && c->disk; }

int cairn_kvcache_held_pages(cairn_kvcache *c, cairn_kv_hold *hold, size_t n, int32_t *pages)
{
    if (!c || !hold || (n && !pages))
        return CAIRN_EINVAL;
    if (n == 0)
        return CAIRN_OK;
    if (n > c->path_cap) {
        cairn_radix_page **p = realloc(c->path, n * sizeof *p);
        if (!p)
            return CAIRN_ENOMEM;
        c->path = p;
        c->path_cap = n;
    }
    size_t got = 0;
    int rc = cairn_radix_path(hold, c->path, n, &got);
    if (rc == CAIRN_OK && got != n)
        rc = CAIRN_EINVAL;
    for (size_t i = 0; rc == CAIRN_OK && i < n; i++) {
        if (c->path[i]->device_page < 0)
            return CAIRN_EINVAL; /* a hold's path is on the device */
        pages[i] = c->path[i]->device_page;
    }
    return rc;
}

int cairn_kvcache_release(cairn_kvcache *c, cairn_kv_hold *hold)
{
    if (!c || !hold)
        return CAIRN_EINVAL;
    return cairn_radix_unlock(c->tree, hold);
}

void cairn_kvcache_free_pages(cairn_kvcache *c, int32_t n, const int32_t *pages)
{
    if (c && n > 0)
        cairn_page_pool_release(c->dev, n, pages);
}

int cairn_kvcache_commit(cairn_kvcache *c, uint64_t ns, const int32_t *tokens, size_t n_full,
                         const int32_t *pages, size_t n_held, size_t n_pages,
                         cairn_kv_hold *hold, cairn_kv_hold **leaf)
{
    if (!c || (n_pages && !pages) || n_held > n_pages)
        return CAIRN_EINVAL;
    cairn_radix_node *end = NULL;
    size_t from = n_held; /* the first page the caller owns */
    if (n_full > n_pages)
        n_full = n_pages;
    int rc = CAIRN_OK;
    if (tokens && n_full > 0) {
        size_t n_cached = 0;
        rc = cairn_radix_insert(c->tree, ns, tokens, n_full, pages, &n_cached, &end);
        if (rc == CAIRN_OK) {
            /* pages [from, n_cached) duplicate what the tree already had */
            if (n_cached > from)
                cairn_page_pool_release(c->dev, (int32_t)(n_cached - from), pages + from);
            from = n_cached > from ? n_cached : from;
            from = from > n_full ? from : n_full; /* [.., n_full) are the tree's now */
        } else {
            end = NULL;
        }
    }
    if (n_pages > from)
        cairn_page_pool_release(c->dev, (int32_t)(n_pages - from), pages + from);
    if (hold)
        cairn_radix_unlock(c->tree, hold);
    if (leaf)
        *leaf = end;
    return rc;
}

int cairn_kvcache_record_iterate(cairn_kvcache *c, cairn_disk_record_fn fn, void *user)
{
    if (!c || !fn)
        return CAIRN_EINVAL;
    if (!c->disk)
        return CAIRN_EUNSUPPORTED;
    return cairn_disk_record_iterate(c->disk, fn, user);
}


/* ---- helpers ------------------------------------------------------------ */

static void release_page(const cairn_radix_page *p, void *user)
{
    cairn_kvcache *c = user;
    if (p->device_page >= 0)
        cairn_page_pool_release(c->dev, 1, &p->device_page);
    if (p->host_slot >= 0) {
        c->slot_state[p->host_slot] = SLOT_IDLE;
        cairn_host_pool_release(c->host, 1, &p->host_slot);
    }
}

/* Nodes of the path root..node (root excluded) into c->nodes, in order. */
static int path_nodes(cairn_kvcache *c, cairn_radix_node *node, size_t *n)
{
    size_t k = 0;
    for (cairn_radix_node *x = node; cairn_radix_parent(x); x = cairn_radix_parent(x))
        k++;
    if (k > c->nodes_cap) {
        cairn_radix_node **nn = realloc(c->nodes, k * sizeof *nn);
        if (!nn)
            return CAIRN_ENOMEM;
        c->nodes = nn;
        c->nodes_cap = k;
    }
    size_t i = k;
    for (cairn_radix_node *x = node; cairn_radix_parent(x); x = cairn_radix_parent(x))
        c->nodes[--i] = x;
    *n = k;
    return CAIRN_OK;
}

static int write_page(cairn_kvcache *c, cairn_radix_page *pg, const int32_t *tokens,
                      const void *bytes)
{
    int rc = cairn_disk_write(c->disk, pg->hash, tokens, bytes, COOKIE_WRITE);
    if (rc == CAIRN_OK) {
        pg->on_disk = 1;
        pg->flags &= (uint8_t)~PAGE_LOST;
        c->stats.written_pages++;
    }
    return rc;
}

static size_t evict_node(cairn_kvcache *c, int tier, cairn_radix_node *node);

/* Evict the LRU candidate of `tier`; pages moved, 0 when nothing could. */
static size_t evict_one(cairn_kvcache *c, int tier)
{
    cairn_radix_node *v = cairn_radix_lru(c->tree, tier);
    return v ? evict_node(c, tier, v) : 0;
}

static size_t drop_node(cairn_kvcache *c, int tier, cairn_radix_node *node)
{
    size_t np = cairn_radix_node_pages(node, NULL);
    if (cairn_radix_node_n_children(node) > 0)
        return 0; /* only leaves leave the tree */
    if (cairn_radix_drop(c->tree, node, 0, release_page, c) != CAIRN_OK)
        return 0;
    c->stats.evicted_pages[tier] += np;
    return np;
}

static size_t evict_node(cairn_kvcache *c, int tier, cairn_radix_node *node)
{
    cairn_radix_page *pg;
    size_t np = cairn_radix_node_pages(node, &pg);
    const int32_t *tok = cairn_radix_node_tokens(node);
    size_t ps = (size_t)c->L.page_size;

    if (tier == CAIRN_TIER_DEVICE) {
        if (!c->host)
            return drop_node(c, tier, node);
        while (cairn_host_pool_available(c->host) < (int32_t)np)
            if (evict_one(c, CAIRN_TIER_HOST) == 0)
                break;
        /* Evicting other nodes never moves this node's page records, so
         * pg is still good. */
        if (cairn_host_pool_available(c->host) < (int32_t)np)
            return drop_node(c, tier, node); /* host full of locked loads */
        double t0 = cairn_now();
        for (size_t i = 0; i < np; i++) {
            int32_t slot;
            cairn_host_pool_alloc(c->host, 1, &slot);
            int rc = c->be->iface->download(c->be, cairn_host_pool_slot(c->host, slot),
                                            dev_addr(c, pg[i].device_page), c->L.page_bytes);
            if (rc) {
                cairn_host_pool_release(c->host, 1, &slot);
                return drop_node(c, tier, node);
            }
            c->slot_state[slot] = SLOT_IDLE;
            cairn_page_pool_release(c->dev, 1, &pg[i].device_page);
            pg[i].device_page = -1;
            pg[i].host_slot = slot;
        }
        cairn_radix_set_tier(c->tree, node, CAIRN_TIER_HOST);
        c->stats.evicted_pages[tier] += np;
        c->stats.tier[CAIRN_TIER_HOST].store_ops++;
        c->stats.tier[CAIRN_TIER_HOST].store_seconds += cairn_now() - t0;
        return np;
    }
    if (tier == CAIRN_TIER_HOST) {
        if (!c->disk)
            return drop_node(c, tier, node);
        /* Write-back: the page goes to disk now unless it is there already. */
        for (size_t i = 0; i < np; i++) {
            if (!pg[i].on_disk &&
                write_page(c, &pg[i], tok + i * ps,
                           cairn_host_pool_slot(c->host, pg[i].host_slot)) != CAIRN_OK)
                pg[i].flags |= PAGE_LOST; /* nowhere now: a promotion reports it */
            c->slot_state[pg[i].host_slot] = SLOT_IDLE;
            cairn_host_pool_release(c->host, 1, &pg[i].host_slot);
            pg[i].host_slot = -1;
        }
        cairn_radix_set_tier(c->tree, node, CAIRN_TIER_DISK);
        c->stats.evicted_pages[tier] += np;
        return np;
    }
    return drop_node(c, tier, node);
}

int cairn_kvcache_evict(cairn_kvcache *c, int tier, size_t n_pages, size_t *moved)
{
    if (!c || tier < 0 || tier >= CAIRN_TIER_COUNT)
        return CAIRN_EINVAL;
    size_t done = 0;
    while (done < n_pages) {
        size_t k = evict_one(c, tier);
        if (k == 0)
            break;
        done += k;
    }
    if (moved)
        *moved = done;
    return CAIRN_OK;
}

int cairn_kvcache_alloc(cairn_kvcache *c, int32_t n, int32_t *pages)
{
    if (!c || n < 0 || (n && !pages))
        return CAIRN_EINVAL;
    while (cairn_page_pool_available(c->dev) < n)
        if (evict_one(c, CAIRN_TIER_DEVICE) == 0)
            return CAIRN_EFULL;
    return cairn_page_pool_alloc(c->dev, n, pages);
}

/* ---- cost model ---------------------------------------------------------- */

static void fit_add(decayed_fit *f, double x, double y)
{
    f->w = RATE_DECAY * f->w + 1;
    f->x = RATE_DECAY * f->x + x;
    f->y = RATE_DECAY * f->y + y;
    f->xx = RATE_DECAY * f->xx + x * x;
    f->xy = RATE_DECAY * f->xy + x * y;
}

/* Recompute the estimates in force from the measurements (unless a caller
 * pinned them). */
static void refresh_rates(cairn_kvcache *c)
{
    if (c->rates_overridden)
        return;
    cairn_kvcache_rates *r = &c->rates;
    r->compute_tokens_per_s = c->compute_rate > 0 ? c->compute_rate : PRIOR_COMPUTE_TOKENS_PER_S;
    if (c->h2d.y > 0 && c->h2d.x > 0)
        r->h2d_bytes_per_s = c->h2d.x / c->h2d.y;
    const decayed_fit *f = &c->disk_fit;
    if (f->w > 0) {
        double mx = f->x / f->w, my = f->y / f->w;
        double vx = f->xx / f->w - mx * mx, cxy = f->xy / f->w - mx * my;
        /* seconds per byte: the fit's slope when the rounds differed enough
         * in size to tell latency from throughput, else the last estimate. */
        double slope = 1.0 / r->disk_bytes_per_s;
        if (vx > 1e-6 * mx * mx && vx > 0 && cxy > 0)
            slope = cxy / vx;
        double latency = my - slope * mx;
        if (latency < 0) {
            /* All of the time is throughput. */
            latency = 0;
            if (mx > 0 && my > 0)
                slope = my / mx;
        }
        if (slope > 0)
            r->disk_bytes_per_s = 1.0 / slope;
        r->disk_latency_s = latency;
    }
}

static void note_upload(cairn_kvcache *c, size_t pages, double seconds)
{
    if (pages == 0)
        return;
    c->stats.tier[CAIRN_TIER_HOST].load_ops++;
    c->stats.tier[CAIRN_TIER_HOST].load_seconds += seconds;
    c->rates.h2d_samples++;
    if (seconds > 0) {
        double bytes = (double)pages * (double)c->L.page_bytes;
        c->h2d.x = RATE_DECAY * c->h2d.x + bytes;
        c->h2d.y = RATE_DECAY * c->h2d.y + seconds;
        refresh_rates(c);
    }
}

/* A disk round (reads + fence) of n_reads pages took `seconds`. */
static void note_disk_round(cairn_kvcache *c, size_t n_reads, double seconds)
{
    if (n_reads == 0)
        return;
    c->stats.tier[CAIRN_TIER_DISK].load_ops++;
    c->stats.tier[CAIRN_TIER_DISK].load_seconds += seconds;
    c->rates.disk_samples++;
    fit_add(&c->disk_fit, (double)n_reads * (double)c->L.page_bytes, seconds);
    refresh_rates(c);
}

/* How many leading pages of a candidate list are worth having on the
 * device: the count that saves the most time against recomputing them,
 * where a page costs nothing on the device, an upload in host RAM, a disk
 * read plus an upload on disk, and the first disk page adds one disk round
 * trip. Ties go to the shorter prefix, so a load is issued only when it is
 * expected to be strictly faster than recomputing. */
static size_t choose_pages(const cairn_kvcache *c, const uint8_t *tier, size_t n)
{
    const cairn_kvcache_rates *r = &c->rates;
    double pb = (double)c->L.page_bytes;
    double recompute = (double)c->L.page_size / r->compute_tokens_per_s;
    double up = pb / r->h2d_bytes_per_s;
    double from_disk = pb / r->disk_bytes_per_s + up;
    double saved = 0, best_saved = 0;
    size_t best = 0;
    bool disk_seen = false;
    for (size_t i = 0; i < n; i++) {
        double cost = tier[i] == CAIRN_TIER_DEVICE ? 0 : tier[i] == CAIRN_TIER_HOST ? up : from_disk;
        if (tier[i] == CAIRN_TIER_DISK && !disk_seen) {
            cost += r->disk_latency_s;
            disk_seen = true;
        }
        saved += recompute - cost;
        if (saved > best_saved) {
            best_saved = saved;
            best = i + 1;
        }
    }
    return best;
}

int cairn_kvcache_set_compute_rate(cairn_kvcache *c, double tokens_per_s)
{
    if (!c || !(tokens_per_s > 0) || tokens_per_s > 1e15)
        return CAIRN_EINVAL;
    c->compute_rate = tokens_per_s;
    c->rates.compute_samples++;
    refresh_rates(c);
    return CAIRN_OK;
}

int cairn_kvcache_get_rates(const cairn_kvcache *c, cairn_kvcache_rates *out)
{
    if (!c || !out)
        return CAIRN_EINVAL;
    *out = c->rates;
    out->overridden = c->rates_overridden;
    return CAIRN_OK;
}

int cairn_kvcache_override_rates(cairn_kvcache *c, const cairn_kvcache_rates *r)
{
    if (!c)
        return CAIRN_EINVAL;
    if (!r) {
        c->rates_overridden = false;
        c->rates.compute_tokens_per_s = PRIOR_COMPUTE_TOKENS_PER_S;
        c->rates.h2d_bytes_per_s = PRIOR_H2D_BYTES_PER_S;
        c->rates.disk_bytes_per_s = PRIOR_DISK_BYTES_PER_S;
        c->rates.disk_latency_s = PRIOR_DISK_LATENCY_S;
        refresh_rates(c);
        return CAIRN_OK;
    }
    if (!(r->compute_tokens_per_s > 0) || !(r->h2d_bytes_per_s > 0) ||
        !(r->disk_bytes_per_s > 0) || !(r->disk_latency_s >= 0))
        return CAIRN_EINVAL;
    c->rates.compute_tokens_per_s = r->compute_tokens_per_s;
    c->rates.h2d_bytes_per_s = r->h2d_bytes_per_s;
    c->rates.disk_bytes_per_s = r->disk_bytes_per_s;
    c->rates.disk_latency_s = r->disk_latency_s;
    c->rates_overridden = true;
    return CAIRN_OK;
}

/* ---- promotion ---------------------------------------------------------- */

static int push_event(cairn_kvcache *c, cairn_kvcache_event ev)
{
    if (c->n_events == c->cap_events) {
        size_t cap = c->cap_events ? 2 * c->cap_events : 16;
        cairn_kvcache_event *e = realloc(c->events, cap * sizeof *e);
        if (!e)
            return CAIRN_ENOMEM;
        c->events = e;
        c->cap_events = cap;
    }
    c->events[c->n_events++] = ev;
    return CAIRN_OK;
}

/* Host node -> device. CAIRN_EFULL when the device has no room. */
static int upload_node(cairn_kvcache *c, cairn_radix_node *node)
{
    cairn_radix_page *pg;
    size_t np = cairn_radix_node_pages(node, &pg);
    double upload_seconds = 0;
    for (size_t i = 0; i < np; i++) {
        int32_t id;
        int rc = cairn_kvcache_alloc(c, 1, &id);
        double t0 = cairn_now();
        if (rc == CAIRN_OK)
            rc = c->be->iface->upload(c->be, dev_addr(c, id),
                                      cairn_host_pool_slot(c->host, pg[i].host_slot),
                                      c->L.page_bytes);
        upload_seconds += cairn_now() - t0;
        if (rc) {
            /* Undo this node's uploads: it stays a HOST node. */
            for (size_t j = 0; j < i; j++) {
                cairn_page_pool_release(c->dev, 1, &pg[j].device_page);
                pg[j].device_page = -1;
            }
            return rc == CAIRN_EFULL ? CAIRN_EFULL : rc;
        }
        pg[i].device_page = id;
    }
    for (size_t i = 0; i < np; i++) {
        c->slot_state[pg[i].host_slot] = SLOT_IDLE;
        cairn_host_pool_release(c->host, 1, &pg[i].host_slot);
        pg[i].host_slot = -1;
    }
    cairn_radix_set_tier(c->tree, node, CAIRN_TIER_DEVICE);
    c->stats.promoted_pages += np;
    c->stats.tier[CAIRN_TIER_HOST].promoted_pages += np;
    note_upload(c, np, upload_seconds);
    return CAIRN_OK;
}

/* Release the slots of pages whose reads finished (loaded or missed), and
 * record misses as lost pages. Slots still loading belong to a later
 * promotion and are left to it. */
static void unload_finished(cairn_kvcache *c, cairn_radix_page *pg, size_t np)
{
    for (size_t i = 0; i < np; i++) {
        if (pg[i].host_slot < 0)
            continue;
        uint8_t st = c->slot_state[pg[i].host_slot];
        if (st == SLOT_LOADING)
            continue;
        if (st == SLOT_MISSED) {
            pg[i].flags |= PAGE_LOST;
            pg[i].on_disk = 0;
        }
        c->slot_state[pg[i].host_slot] = SLOT_IDLE;
        cairn_host_pool_release(c->host, 1, &pg[i].host_slot);
        pg[i].host_slot = -1;
    }
}

static size_t leading_device_pages(cairn_kvcache *c, cairn_radix_node *node)
{
    size_t n_nodes, k = 0;
    if (path_nodes(c, node, &n_nodes))
        return 0;
    for (size_t i = 0; i < n_nodes; i++) {
        if (cairn_radix_node_tier(c->nodes[i]) != CAIRN_TIER_DEVICE)
            break;
        k += cairn_radix_node_pages(c->nodes[i], NULL);
    }
    return k;
}

/* Finish bringing the path root..node to the device once its disk reads
 * have completed: CAIRN_OK, CAIRN_ENOTFOUND (a page was lost) or
 * CAIRN_EFULL; *resident receives the leading pages now on the device. */
static int finish_path(cairn_kvcache *c, cairn_radix_node *node_in, size_t *resident)
{
    int status = CAIRN_OK;
    size_t n_nodes;
    if (path_nodes(c, node_in, &n_nodes)) {
        *resident = 0;
        return CAIRN_ENOMEM;
    }
    for (size_t i = 0; i < n_nodes; i++) {
        cairn_radix_node *node = c->nodes[i];
        int tier = cairn_radix_node_tier(node);
        cairn_radix_page *pg;
        size_t np = cairn_radix_node_pages(node, &pg);
        if (tier == CAIRN_TIER_DISK) {
            size_t loaded = 0, loading = 0, lost_at = np;
            for (size_t j = 0; j < np; j++) {
                int32_t s = pg[j].host_slot;
                uint8_t st = s >= 0 ? c->slot_state[s] : SLOT_IDLE;
                if (st == SLOT_LOADED)
                    loaded++;
                else if (st == SLOT_LOADING)
                    loading++;
                else if (lost_at == np && (st == SLOT_MISSED || (pg[j].flags & PAGE_LOST) ||
                                           !pg[j].on_disk))
                    lost_at = j;
            }
            if (status == CAIRN_OK && loaded == np) {
                for (size_t j = 0; j < np; j++)
                    c->slot_state[pg[j].host_slot] = SLOT_IDLE;
                cairn_radix_set_tier(c->tree, node, CAIRN_TIER_HOST);
                c->stats.tier[CAIRN_TIER_DISK].promoted_pages += np;
                tier = CAIRN_TIER_HOST;
            } else if (status == CAIRN_OK && lost_at < np) {
                /* Keep what loaded before the lost page: split it off. */
                cairn_radix_node *prefix = NULL;
                size_t lost_idx = lost_at;
                bool head_loaded = true;
                for (size_t j = 0; j < lost_at; j++)
                    head_loaded &= pg[j].host_slot >= 0 && c->slot_state[pg[j].host_slot] == SLOT_LOADED;
                if (lost_at > 0 && head_loaded &&
                    cairn_radix_split(c->tree, node, lost_at, &prefix) == CAIRN_OK) {
                    cairn_radix_page *pp;
                    size_t pn = cairn_radix_node_pages(prefix, &pp);
                    for (size_t j = 0; j < pn; j++)
                        c->slot_state[pp[j].host_slot] = SLOT_IDLE;
                    cairn_radix_set_tier(c->tree, prefix, CAIRN_TIER_HOST);
                    c->stats.tier[CAIRN_TIER_DISK].promoted_pages += pn;
                    if (upload_node(c, prefix) != CAIRN_OK)
                        status = CAIRN_EFULL;
                    np = cairn_radix_node_pages(node, &pg);
                    lost_idx = 0; /* the node now starts at the lost page */
                }
                unload_finished(c, pg, np);
                pg[lost_idx].flags |= PAGE_LOST;
                pg[lost_idx].on_disk = 0;
                c->stats.lost_pages++;
                if (status == CAIRN_OK)
                    status = CAIRN_ENOTFOUND;
                continue;
            } else {
                /* After an earlier failure, or pages this promotion could not
                 * start loading: give back what finished; a later promotion
                 * owns anything still loading. */
                if (loading == 0)
                    unload_finished(c, pg, np);
                if (status == CAIRN_OK)
                    status = CAIRN_EFULL;
                continue;
            }
        }
        if (tier == CAIRN_TIER_HOST && status == CAIRN_OK) {
            int rc = upload_node(c, node);
            if (rc)
                status = rc;
        }
    }
    *resident = leading_device_pages(c, node_in);
    if (status == CAIRN_OK && *resident != cairn_radix_node_depth(node_in))
        status = CAIRN_EFULL;
    return status;
}

static void finish_promotion(cairn_kvcache *c, const promotion *p)
{
    size_t resident;
    int status = finish_path(c, p->node, &resident);
    push_event(c, (cairn_kvcache_event){.cookie = p->cookie, .status = status,
                                        .resident_pages = resident});
}

/* Queue disk reads (into host slots) for the DISK pages on the path
 * root..node that are not loading yet. *queued: reads queued now; *pending:
 * some page is being loaded by an earlier promotion. */
static void queue_path_reads(cairn_kvcache *c, size_t n_nodes, size_t *queued, bool *pending)
{
    size_t ps = (size_t)c->L.page_size;
    *queued = 0;
    *pending = false;
    for (size_t i = 0; i < n_nodes; i++) {
        cairn_radix_node *x = c->nodes[i];
        if (cairn_radix_node_tier(x) != CAIRN_TIER_DISK)
            continue;
        cairn_radix_page *pg;
        size_t np = cairn_radix_node_pages(x, &pg);
        const int32_t *tok = cairn_radix_node_tokens(x);
        for (size_t j = 0; j < np; j++) {
            if (pg[j].host_slot >= 0) {
                *pending = true; /* an earlier promotion is loading it */
                continue;
            }
            if ((pg[j].flags & PAGE_LOST) || !pg[j].on_disk)
                continue; /* finish_promotion reports it lost */
            while (cairn_host_pool_available(c->host) < 1)
                if (evict_one(c, CAIRN_TIER_HOST) == 0)
                    break;
            int32_t slot;
            if (cairn_host_pool_alloc(c->host, 1, &slot) != CAIRN_OK)
                continue; /* reported as EFULL when the promotion finishes */
            int rc = cairn_disk_read(c->disk, pg[j].hash, tok + j * ps,
                                     cairn_host_pool_slot(c->host, slot), COOKIE_READ | (uint64_t)slot);
            if (rc) {
                cairn_host_pool_release(c->host, 1, &slot);
                continue;
            }
            c->slot_state[slot] = SLOT_LOADING;
            pg[j].host_slot = slot;
            (*queued)++;
        }
    }
}

int cairn_kvcache_promote(cairn_kvcache *c, cairn_radix_node *node, uint64_t cookie)
{
    if (!c || !node)
        return CAIRN_EINVAL;
    if (cairn_radix_parent(node) && cairn_radix_node_refs(node) <= 0)
        return CAIRN_EINVAL;
    c->stats.promotions++;
    size_t n_nodes;
    int rc = path_nodes(c, node, &n_nodes);
    if (rc)
        return rc;
    size_t queued = 0;
    bool pending = false;
    queue_path_reads(c, n_nodes, &queued, &pending);
    promotion p = {.cookie = cookie, .id = ++c->next_promo, .node = node, .n_reads = queued};
    if ((queued || pending) && c->disk) {
        if (c->n_promos == c->cap_promos) {
            size_t cap = c->cap_promos ? 2 * c->cap_promos : 8;
            promotion *np = realloc(c->promos, cap * sizeof *np);
            if (!np)
                return CAIRN_ENOMEM; /* reads stay queued; their slots come
                                        back when the node is promoted later */
            c->promos = np;
            c->cap_promos = cap;
        }
        rc = cairn_disk_fence(c->disk, COOKIE_FENCE | p.id);
        if (rc == CAIRN_OK) {
            c->promos[c->n_promos++] = p;
            return CAIRN_OK;
        }
    }
    finish_promotion(c, &p);
    return CAIRN_OK;
}

/* ---- fetch ---------------------------------------------------------------- */

/* The node on the path root..node that ends exactly after `k` pages,
 * splitting the node that contains page k-1 when needed (the root for 0).
 * On a failed split, the last node that ends before k. */
static cairn_radix_node *node_ending_at(cairn_kvcache *c, cairn_radix_node *node, size_t k)
{
    cairn_radix_node *x = node;
    while (cairn_radix_parent(x) && cairn_radix_node_depth(x) - cairn_radix_node_pages(x, NULL) >= k)
        x = cairn_radix_parent(x);
    if (!cairn_radix_parent(x) || cairn_radix_node_depth(x) == k)
        return x;
    size_t start = cairn_radix_node_depth(x) - cairn_radix_node_pages(x, NULL);
    cairn_radix_node *prefix;
    if (cairn_radix_split(c->tree, x, k - start, &prefix) == CAIRN_OK)
        return prefix;
    return cairn_radix_parent(x);
}

/* The deepest node of the path root..node whose whole path is on the device
 * (nodes are tier-uniform, so the resident prefix ends at a node). */
static cairn_radix_node *resident_end(cairn_kvcache *c, cairn_radix_node *node)
{
    size_t n_nodes;
    cairn_radix_node *last = cairn_radix_root(c->tree);
    if (path_nodes(c, node, &n_nodes))
        return last;
    for (size_t i = 0; i < n_nodes && cairn_radix_node_tier(c->nodes[i]) == CAIRN_TIER_DEVICE; i++)
        last = c->nodes[i];
    return last;
}

/* Move the op's lock to `to`. */
static void move_lock(cairn_kvcache *c, fetch_op *op, cairn_radix_node *to)
{
    if (to == op->node)
        return;
    cairn_radix_lock(c->tree, to);
    cairn_radix_unlock(c->tree, op->node);
    op->node = to;
}

/* Reads that were queued but will not be waited for: their slots go back
 * when their completions arrive (poll sees SLOT_ORPHAN). */
static void orphan_round(cairn_kvcache *c, fetch_op *op)
{
    for (size_t i = 0; i < op->n_round; i++)
        c->slot_state[op->round[i]] = SLOT_ORPHAN;
    op->n_reads = 0;
    op->n_round = 0;
}

static void release_round(cairn_kvcache *c, fetch_op *op)
{
    for (size_t i = 0; i < op->n_round; i++) {
        c->slot_state[op->round[i]] = SLOT_IDLE;
        cairn_host_pool_release(c->host, 1, &op->round[i]);
    }
    op->n_round = 0;
}

/* Queue reads of the next pages of the op's tokens by page hash, chained
 * from the end of the op's node. The first round only takes the host slots
 * that are free (at least FIRST_ROUND_MIN); later ones make room. */
static void queue_round(cairn_kvcache *c, fetch_op *op, bool first)
{
    size_t ps = (size_t)c->L.page_size;
    size_t remaining = op->n_target - op->next;
    size_t avail = (size_t)cairn_host_pool_available(c->host);
    size_t floor_n = first ? FIRST_ROUND_MIN : NEXT_ROUND_MIN;
    size_t want = avail > floor_n ? avail : floor_n;
    if (want > remaining)
        want = remaining;
    cairn_page_hash h = cairn_radix_ns_seed(c->tree, op->ns);
    if (cairn_radix_parent(op->node)) {
        cairn_radix_page *pg;
        size_t np = cairn_radix_node_pages(op->node, &pg);
        h = pg[np - 1].hash;
    }
    op->n_round = 0;
    for (size_t i = 0; i < want; i++) {
        while (cairn_host_pool_available(c->host) < 1)
            if (evict_one(c, CAIRN_TIER_HOST) == 0)
                break;
        int32_t slot;
        if (cairn_host_pool_alloc(c->host, 1, &slot) != CAIRN_OK)
            break;
        const int32_t *tok = op->tokens + (op->next + i) * ps;
        h = cairn_page_hash_next(h, tok, ps);
        if (cairn_disk_read(c->disk, h, tok, cairn_host_pool_slot(c->host, slot),
                            COOKIE_READ | (uint64_t)slot) != CAIRN_OK) {
            cairn_host_pool_release(c->host, 1, &slot);
            break;
        }
        c->slot_state[slot] = SLOT_LOADING;
        op->round[op->n_round++] = slot;
    }
    if (op->n_round == 0 && want > 0 && op->status == CAIRN_OK)
        op->status = CAIRN_EFULL; /* no host slot to read into */
    op->n_reads += op->n_round;
}

/* Take the leading hits of the finished round into the tree, on the
 * device. True when the round hit throughout and there is more to read. */
static bool absorb_round(cairn_kvcache *c, fetch_op *op)
{
    size_t hits = 0;
    while (hits < op->n_round && c->slot_state[op->round[hits]] == SLOT_LOADED)
        hits++;
    bool all = hits == op->n_round;
    size_t base = op->next;
    int32_t *ids = malloc((base + hits + 1) * sizeof *ids);
    if (!ids) {
        release_round(c, op);
        op->status = CAIRN_ENOMEM;
        return false;
    }
    for (size_t i = 0; i < base; i++)
        ids[i] = -1; /* the tree has these */
    size_t got = 0;
    double up_seconds = 0;
    for (; got < hits; got++) {
        if (cairn_kvcache_alloc(c, 1, &ids[base + got]) != CAIRN_OK) {
            op->status = CAIRN_EFULL;
            break;
        }
        double t0 = cairn_now();
        int rc = c->be->iface->upload(c->be, dev_addr(c, ids[base + got]),
                                      cairn_host_pool_slot(c->host, op->round[got]),
                                      c->L.page_bytes);
        up_seconds += cairn_now() - t0;
        if (rc) {
            cairn_page_pool_release(c->dev, 1, &ids[base + got]);
            op->status = CAIRN_EBACKEND;
            break;
        }
    }
    if (got < hits)
        all = false;
    release_round(c, op);
    note_upload(c, got, up_seconds);
    if (got == 0) {
        free(ids);
        return false;
    }
    size_t n_cached;
    cairn_radix_node *leaf;
    if (cairn_radix_insert(c->tree, op->ns, op->tokens, base + got, ids, &n_cached, &leaf) !=
        CAIRN_OK) {
        cairn_page_pool_release(c->dev, (int32_t)got, ids + base);
        free(ids);
        op->status = CAIRN_ENOMEM;
        return false;
    }
    /* Pages someone inserted while our reads were in flight are the tree's;
     * our copies of them go back. */
    size_t dup_end = n_cached < base + got ? n_cached : base + got;
    if (dup_end > base)
        cairn_page_pool_release(c->dev, (int32_t)(dup_end - base), ids + base);
    free(ids);
    c->stats.tier[CAIRN_TIER_DISK].promoted_pages += got;
    c->stats.tier[CAIRN_TIER_HOST].promoted_pages += got;
    c->stats.promoted_pages += got;
    /* Those pages may be in a lower tier: stop where the device path ends. */
    cairn_radix_node *end = resident_end(c, leaf);
    if (cairn_radix_node_depth(end) < cairn_radix_node_depth(op->node))
        end = op->node; /* cannot happen (the op's path is locked); be safe */
    move_lock(c, op, end);
    if (end != leaf)
        all = false;
    op->next = cairn_radix_node_depth(op->node);
    return all && op->next < op->n_target;
}

static int add_fetch(cairn_kvcache *c, fetch_op *op)
{
    if (c->n_fetches == c->cap_fetches) {
        size_t cap = c->cap_fetches ? 2 * c->cap_fetches : 8;
        fetch_op **nf = realloc(c->fetches, cap * sizeof *nf);
        if (!nf)
            return CAIRN_ENOMEM;
        c->fetches = nf;
        c->cap_fetches = cap;
    }
    c->fetches[c->n_fetches++] = op;
    return CAIRN_OK;
}

static void free_fetch(fetch_op *op)
{
    free(op->tokens);
    free(op->origin);
    free(op->round);
    free(op);
}

/* Post the op's event and count hits and misses per tier. */
static void complete_fetch(cairn_kvcache *c, fetch_op *op)
{
    cairn_kvcache_event ev = {.cookie = op->cookie, .status = op->status,
                              .kind = CAIRN_KVCACHE_EV_FETCH, .node = op->node,
                              .skipped_pages = op->skipped, .lost_pages = op->lost};
    ev.resident_pages = cairn_radix_node_depth(op->node);
    for (size_t i = 0; i < ev.resident_pages && i < op->n_target; i++)
        ev.from_tier[op->origin[i]]++;
    size_t ps = (size_t)c->L.page_size;
    size_t looked = op->n_lookup;
    for (int t = 0; t < CAIRN_TIER_COUNT; t++) {
        if ((t == CAIRN_TIER_HOST && !c->host) || (t == CAIRN_TIER_DISK && !c->disk))
            break;
        size_t hit = ev.from_tier[t] * ps;
        if (hit > looked)
            hit = looked;
        c->stats.tier[t].hit_tokens += hit;
        c->stats.tier[t].miss_tokens += looked - hit;
        looked -= hit;
    }
    c->stats.fetches++;
    c->stats.fetch_skipped_pages += op->skipped;
    if (push_event(c, ev) != CAIRN_OK) {
        /* Nobody will hear of this lock: give it back. */
        cairn_radix_unlock(c->tree, op->node);
    }
    free_fetch(op);
}

/* Drive the op after its fence completed (or at once when it had nothing
 * to wait for). Returns true when the op is finished (and freed). */
static bool advance_fetch(cairn_kvcache *c, fetch_op *op, double fence_seconds)
{
    if (op->n_reads) {
        note_disk_round(c, op->n_reads, fence_seconds);
        op->n_reads = 0;
    }
    if (op->promoting) {
        op->promoting = false;
        size_t resident;
        int st = finish_path(c, op->node, &resident);
        if (resident < cairn_radix_node_depth(op->node)) {
            if (op->status == CAIRN_OK)
                op->status = st != CAIRN_OK ? st : CAIRN_EFULL;
            size_t lost_at = resident;
            move_lock(c, op, resident_end(c, op->node));
            if (st == CAIRN_ENOTFOUND) {
                op->lost++;
                /* The pages from the lost one on are no use to anyone. */
                cairn_kvcache_forget(c, op->ns, op->tokens,
                                     op->n_target * (size_t)c->L.page_size, lost_at);
            }
            release_round(c, op);
        }
    }
    if (op->n_round) {
        bool more = absorb_round(c, op);
        if (more && add_fetch(c, op) == CAIRN_OK) {
            queue_round(c, op, false);
            if (op->n_round && cairn_disk_fence(c->disk, COOKIE_FETCH | op->id) == CAIRN_OK)
                return false;
            c->n_fetches--; /* it is the last one: just added */
            orphan_round(c, op);
        }
    }
    complete_fetch(c, op);
    return true;
}

int cairn_kvcache_fetch(cairn_kvcache *c, uint64_t ns, const int32_t *tokens, size_t n_tokens,
                        size_t max_pages, uint64_t cookie)
{
    if (!c || (!tokens && n_tokens))
        return CAIRN_EINVAL;
    size_t ps = (size_t)c->L.page_size;
    size_t n_pages = n_tokens / ps;
    if (n_pages > max_pages)
        n_pages = max_pages;
    /* Tokens the request asks about, for the hit/miss counts: all of them,
     * unless max_pages stops the lookup earlier. */
    size_t n_lookup = n_tokens / ps > max_pages ? max_pages * ps : n_tokens;
    fetch_op *op = calloc(1, sizeof *op);
    if (!op)
        return CAIRN_ENOMEM;
    op->cookie = cookie;
    op->ns = ns;
    op->n_lookup = n_lookup;

    cairn_radix_match_result m;
    int rc = cairn_radix_match(c->tree, ns, tokens, n_pages * ps, &m);
    if (rc != CAIRN_OK && rc != CAIRN_ENOMEM) {
        free(op);
        return rc;
    }
    /* Where the usable path ends: before the first page whose only copy was
     * lost (a DISK page that is not on disk). Such pages are no use to
     * anyone; drop them now so nobody matches them again. */
    size_t n_nodes, usable = 0;
    bool broken = false;
    for (int attempt = 0; attempt < 2; attempt++) {
        if ((rc = path_nodes(c, m.node, &n_nodes)) != CAIRN_OK) {
            free(op);
            return rc;
        }
        usable = 0;
        broken = false;
        cairn_radix_node *lost_node = NULL;
        size_t lost_keep = 0;
        for (size_t i = 0; i < n_nodes && !broken; i++) {
            cairn_radix_page *pg;
            size_t np = cairn_radix_node_pages(c->nodes[i], &pg);
            bool disk = cairn_radix_node_tier(c->nodes[i]) == CAIRN_TIER_DISK;
            for (size_t j = 0; j < np; j++) {
                if (disk && pg[j].host_slot < 0 && ((pg[j].flags & PAGE_LOST) || !pg[j].on_disk)) {
                    broken = true;
                    lost_node = c->nodes[i];
                    lost_keep = j;
                    break;
                }
                usable++;
            }
        }
        if (!broken || attempt == 1)
            break;
        if (cairn_radix_drop(c->tree, lost_node, lost_keep, release_page, c) != CAIRN_OK)
            break; /* someone holds it: just stop before it */
        c->stats.lost_pages++;
        op->lost++;
        rc = cairn_radix_match(c->tree, ns, tokens, n_pages * ps, &m);
        if (rc != CAIRN_OK && rc != CAIRN_ENOMEM) {
            free(op);
            return rc;
        }
    }
    size_t n_mem = cairn_radix_node_depth(m.node);
    if (usable > n_mem)
        usable = n_mem;
    /* Candidates: the usable in-memory pages, then (when the in-memory path
     * is whole and there is a disk) every further whole page of the
     * request, to be looked up by hash. */
    size_t n_cand = usable;
    if (!broken && usable == n_mem && c->disk)
        n_cand = n_pages;
    op->origin = malloc(n_cand + 1);
    op->tokens = malloc((n_cand * ps + 1) * sizeof *op->tokens);
    if (!op->origin || !op->tokens) {
        free_fetch(op);
        return CAIRN_ENOMEM;
    }
    size_t k = 0;
    for (size_t i = 0; i < n_nodes && k < usable; i++) {
        size_t np = cairn_radix_node_pages(c->nodes[i], NULL);
        int tier = cairn_radix_node_tier(c->nodes[i]);
        for (size_t j = 0; j < np && k < usable; j++)
            op->origin[k++] = (uint8_t)tier;
    }
    for (; k < n_cand; k++)
        op->origin[k] = CAIRN_TIER_DISK;
    size_t target = choose_pages(c, op->origin, n_cand);
    op->n_target = target;
    op->skipped = usable > target ? usable - target : 0;
    memcpy(op->tokens, tokens, target * ps * sizeof *tokens);

    size_t in_mem = target < n_mem ? target : n_mem;
    cairn_radix_node *node = node_ending_at(c, m.node, in_mem);
    cairn_radix_lock(c->tree, node);
    op->node = node;
    op->next = cairn_radix_node_depth(node);
    op->promoting = true;
    c->stats.promotions++;

    size_t queued = 0;
    bool pending = false;
    if ((rc = path_nodes(c, node, &n_nodes)) == CAIRN_OK && c->disk)
        queue_path_reads(c, n_nodes, &queued, &pending);
    op->n_reads = queued;
    if (target > op->next && op->next == n_mem && c->disk) {
        op->round = malloc((target - op->next) * sizeof *op->round);
        if (op->round)
            queue_round(c, op, true);
        else
            op->status = CAIRN_ENOMEM;
    }
    op->id = ++c->next_op;
    if ((queued || pending || op->n_round) && add_fetch(c, op) == CAIRN_OK) {
        if (cairn_disk_fence(c->disk, COOKIE_FETCH | op->id) == CAIRN_OK)
            return CAIRN_OK;
        c->n_fetches--;
    }
    /* Nothing to wait for (or no way to wait): finish now. */
    orphan_round(c, op);
    advance_fetch(c, op, 0);
    return CAIRN_OK;
}

static pending_op *find_op(cairn_kvcache *c, uint64_t id, size_t *idx)
{
    for (size_t j = 0; j < c->n_ops; j++)
        if (c->ops[j].id == id) {
            *idx = j;
            return &c->ops[j];
        }
    return NULL;
}

/* Handle every disk completion waiting. */
static void drain_disk(cairn_kvcache *c)
{
    if (!c->disk)
        return;
    cairn_disk_completion done[64];
    int k;
    do {
        cairn_disk_poll(c->disk, done, 64, &k);
        for (int i = 0; i < k; i++) {
            uint64_t kind = COOKIE_KIND(done[i].cookie), v = COOKIE_VALUE(done[i].cookie);
            if (kind == COOKIE_READ) {
                if (c->slot_state[v] == SLOT_ORPHAN) {
                    int32_t slot = (int32_t)v;
                    c->slot_state[v] = SLOT_IDLE;
                    cairn_host_pool_release(c->host, 1, &slot);
                } else {
                    c->slot_state[v] = done[i].status == CAIRN_OK ? SLOT_LOADED : SLOT_MISSED;
                }
            } else if (kind == COOKIE_WRITE) {
                c->stats.tier[CAIRN_TIER_DISK].store_ops++;
                c->stats.tier[CAIRN_TIER_DISK].store_seconds += done[i].seconds;
                if (done[i].status != CAIRN_OK)
                    c->stats.write_failures++;
            } else if (kind == COOKIE_FENCE) {
                for (size_t j = 0; j < c->n_promos; j++) {
                    if (c->promos[j].id != v)
                        continue;
                    promotion p = c->promos[j];
                    c->promos[j] = c->promos[--c->n_promos];
                    note_disk_round(c, p.n_reads, done[i].seconds);
                    finish_promotion(c, &p);
                    break;
                }
            } else if (kind == COOKIE_FETCH) {
                for (size_t j = 0; j < c->n_fetches; j++) {
                    if (c->fetches[j]->id != v)
                        continue;
                    fetch_op *op = c->fetches[j];
                    c->fetches[j] = c->fetches[--c->n_fetches];
                    advance_fetch(c, op, done[i].seconds);
                    break;
                }
            } else if (kind == COOKIE_OP) {
                size_t idx;
                pending_op *op = find_op(c, v, &idx);
                if (op) {
                    int status = op->status != CAIRN_OK ? op->status : done[i].status;
                    if (op->kind == CAIRN_KVCACHE_EV_PERSIST && status == CAIRN_OK &&
                        c->stats.write_failures > op->failures_before)
                        status = CAIRN_EIO; /* conservative: some write failed meanwhile */
                    if (op->kind >= 0) {
                        cairn_kvcache_event ev = {.cookie = op->cookie, .status = status,
                                                  .kind = op->kind, .data = done[i].data,
                                                  .data_bytes = done[i].bytes};
                        if (push_event(c, ev) == CAIRN_OK)
                            done[i].data = NULL;
                    } else {
                        op->status = status; /* flush: read by its waiter */
                        op->kind = -2;       /* done */
                        continue;            /* the waiter removes it */
                    }
                    c->ops[idx] = c->ops[--c->n_ops];
                }
            }
            free(done[i].data); /* nobody's (or not handed over) */
        }
    } while (k == 64);
}

int cairn_kvcache_poll(cairn_kvcache *c, cairn_kvcache_event *out, int max, int *n)
{
    if (!c || !n || max < 0 || (max && !out))
        return CAIRN_EINVAL;
    drain_disk(c);
    size_t m = c->n_events < (size_t)max ? c->n_events : (size_t)max;
    if (m) {
        memcpy(out, c->events, m * sizeof *out);
        memmove(c->events, c->events + m, (c->n_events - m) * sizeof *c->events);
        c->n_events -= m;
    }
    *n = (int)m;
    return CAIRN_OK;
}

int cairn_kvcache_wait(cairn_kvcache *c, int timeout_ms)
{
    if (!c)
        return CAIRN_EINVAL;
    if (c->n_events || !c->disk)
        return CAIRN_OK;
    return cairn_disk_wait(c->disk, timeout_ms);
}

/* ---- pin, forget, read -------------------------------------------------- */

/* Queue a disk write of every page of `node` that is resident (tier 0 or
 * 1) and not on disk yet. *missing (optional) counts pages that are
 * nowhere: not resident and not on disk. */
static void write_through_node(cairn_kvcache *c, cairn_radix_node *node, size_t *missing)
{
    size_t ps = (size_t)c->L.page_size;
    cairn_radix_page *pg;
    size_t np = cairn_radix_node_pages(node, &pg);
    const int32_t *tok = cairn_radix_node_tokens(node);
    int tier = cairn_radix_node_tier(node);
    for (size_t j = 0; j < np; j++) {
        if (pg[j].on_disk)
            continue;
        const void *bytes = NULL;
        if (tier == CAIRN_TIER_DEVICE) {
            if (c->be->iface->download(c->be, c->scratch, dev_addr(c, pg[j].device_page),
                                       c->L.page_bytes) == CAIRN_OK)
                bytes = c->scratch;
        } else if (tier == CAIRN_TIER_HOST) {
            bytes = cairn_host_pool_slot(c->host, pg[j].host_slot);
        }
        if (!bytes || write_page(c, &pg[j], tok + j * ps, bytes) != CAIRN_OK) {
            if (missing)
                (*missing)++;
        }
    }
}

int cairn_kvcache_pin(cairn_kvcache *c, cairn_radix_node *node)
{
    if (!c || !node)
        return CAIRN_EINVAL;
    int rc = cairn_radix_lock(c->tree, node);
    if (rc || !c->disk)
        return rc;
    size_t n_nodes;
    rc = path_nodes(c, node, &n_nodes);
    if (rc)
        return rc;
    /* Write-through: every resident page of the pinned prefix goes to disk
     * now, so it survives eviction and restarts. */
    for (size_t i = 0; i < n_nodes; i++)
        write_through_node(c, c->nodes[i], NULL);
    return CAIRN_OK;
}

static int add_op(cairn_kvcache *c, int kind, uint64_t cookie, int status, uint64_t *id)
{
    if (c->n_ops == c->cap_ops) {
        size_t cap = c->cap_ops ? 2 * c->cap_ops : 16;
        pending_op *no = realloc(c->ops, cap * sizeof *no);
        if (!no)
            return CAIRN_ENOMEM;
        c->ops = no;
        c->cap_ops = cap;
    }
    *id = ++c->next_op;
    c->ops[c->n_ops++] = (pending_op){.cookie = cookie, .id = *id, .kind = kind, .status = status,
                                      .failures_before = c->stats.write_failures};
    return CAIRN_OK;
}

/* Undo the last add_op (its request could not be queued). */
static void drop_last_op(cairn_kvcache *c) { c->n_ops--; }

int cairn_kvcache_persist(cairn_kvcache *c, cairn_radix_node *node, uint64_t cookie)
{
    if (!c || !node)
        return CAIRN_EINVAL;
    if (!c->disk)
        return CAIRN_EUNSUPPORTED;
    size_t n_nodes;
    int rc = path_nodes(c, node, &n_nodes);
    if (rc)
        return rc;
    size_t missing = 0;
    for (size_t i = 0; i < n_nodes; i++) {
        cairn_radix_page *pg;
        size_t np = cairn_radix_node_pages(c->nodes[i], &pg);
        if (cairn_radix_node_tier(c->nodes[i]) == CAIRN_TIER_DISK) {
            for (size_t j = 0; j < np; j++)
                missing += (pg[j].flags & PAGE_LOST) || !pg[j].on_disk;
            continue;
        }
        write_through_node(c, c->nodes[i], &missing);
    }
    uint64_t id;
    rc = add_op(c, CAIRN_KVCACHE_EV_PERSIST, cookie, missing ? CAIRN_ENOTFOUND : CAIRN_OK, &id);
    if (rc)
        return rc;
    rc = cairn_disk_sync(c->disk, COOKIE_OP | id);
    if (rc)
        drop_last_op(c);
    else
        c->stats.persists++;
    return rc;
}

typedef struct {
    cairn_kvcache *c;
    size_t *n;
} node_collector;

/* Append a node to c->nodes (the walk does not use that array). */
static int collect_node(cairn_radix_node *node, void *user)
{
    node_collector *col = user;
    cairn_kvcache *c = col->c;
    if (*col->n == c->nodes_cap) {
        size_t cap = c->nodes_cap ? 2 * c->nodes_cap : 64;
        cairn_radix_node **nn = realloc(c->nodes, cap * sizeof *nn);
        if (!nn)
            return CAIRN_ENOMEM;
        c->nodes = nn;
        c->nodes_cap = cap;
    }
    c->nodes[(*col->n)++] = node;
    return CAIRN_OK;
}

int cairn_kvcache_flush(cairn_kvcache *c)
{
    if (!c)
        return CAIRN_EINVAL;
    if (!c->disk)
        return CAIRN_OK;
    /* Every node, parents first; the list is taken before writing because
     * the visit must not run while page records change. */
    size_t n = 0;
    node_collector col = {c, &n};
    int rc = cairn_radix_visit(c->tree, collect_node, &col);
    if (rc)
        return rc;
    size_t failures_before = c->stats.write_failures;
    for (size_t i = 0; i < n; i++)
        if (cairn_radix_node_tier(c->nodes[i]) != CAIRN_TIER_DISK)
            write_through_node(c, c->nodes[i], NULL);
    uint64_t id;
    rc = add_op(c, -1, 0, CAIRN_OK, &id);
    if (rc)
        return rc;
    rc = cairn_disk_sync(c->disk, COOKIE_OP | id);
    if (rc) {
        drop_last_op(c);
        return rc;
    }
    /* Block: other completions arriving meanwhile are handled as poll
     * would, and their events wait for the next poll. */
    for (;;) {
        drain_disk(c);
        size_t idx;
        pending_op *op = find_op(c, id, &idx);
        if (!op)
            return CAIRN_EIO; /* cannot happen */
        if (op->kind == -2) {
            int status = op->status;
            c->ops[idx] = c->ops[--c->n_ops];
            if (status == CAIRN_OK && c->stats.write_failures > failures_before)
                status = CAIRN_EIO;
            return status;
        }
        cairn_disk_wait(c->disk, 100);
    }
}

/* ---- records --------------------------------------------------------------- */

static int record_op(cairn_kvcache *c, int kind, const void *key, size_t key_len,
                     const void *value, size_t value_bytes, uint64_t cookie)
{
    if (!c)
        return CAIRN_EINVAL;
    if (!c->disk)
        return CAIRN_EUNSUPPORTED;
    uint64_t id;
    int rc = add_op(c, kind, cookie, CAIRN_OK, &id);
    if (rc)
        return rc;
    if (kind == CAIRN_KVCACHE_EV_RECORD_PUT)
        rc = cairn_disk_record_put(c->disk, key, key_len, value, value_bytes, COOKIE_OP | id);
    else if (kind == CAIRN_KVCACHE_EV_RECORD_DELETE)
        rc = cairn_disk_record_delete(c->disk, key, key_len, COOKIE_OP | id);
    else
        rc = cairn_disk_record_get(c->disk, key, key_len, COOKIE_OP | id);
    if (rc)
        drop_last_op(c);
    return rc;
}

int cairn_kvcache_record_put(cairn_kvcache *c, const void *key, size_t key_len, const void *value,
                             size_t value_bytes, uint64_t cookie)
{
    return record_op(c, CAIRN_KVCACHE_EV_RECORD_PUT, key, key_len, value, value_bytes, cookie);
}

int cairn_kvcache_record_delete(cairn_kvcache *c, const void *key, size_t key_len, uint64_t cookie)
{
    return record_op(c, CAIRN_KVCACHE_EV_RECORD_DELETE, key, key_len, NULL, 0, cookie);
}

int cairn_kvcache_record_get(cairn_kvcache *c, const void *key, size_t key_len, uint64_t cookie)
{
    return record_op(c, CAIRN_KVCACHE_EV_RECORD_GET, key, key_len, NULL, 0, cookie);
}

int cairn_kvcache_unpin(cairn_kvcache *c, cairn_radix_node *node)
{
    return c ? cairn_radix_unlock(c->tree, node) : CAIRN_EINVAL;
}

int cairn_kvcache_forget(cairn_kvcache *c, uint64_t ns, const int32_t *tokens, size_t n_tokens,
                         size_t keep_pages)
{
    if (!c || (!tokens && n_tokens))
        return CAIRN_EINVAL;
    cairn_radix_match_result m;
    int rc = cairn_radix_match(c->tree, ns, tokens, n_tokens, &m);
    if (rc)
        return rc;
    if (m.n_pages <= keep_pages)
        return CAIRN_OK;
    /* The node holding page index keep_pages. */
    cairn_radix_node *x = m.node;
    while (cairn_radix_node_depth(x) - cairn_radix_node_pages(x, NULL) > keep_pages)
        x = cairn_radix_parent(x);
    size_t start = cairn_radix_node_depth(x) - cairn_radix_node_pages(x, NULL);
    return cairn_radix_drop(c->tree, x, keep_pages - start, release_page, c);
}

int cairn_kvcache_read_page(cairn_kvcache *c, const cairn_radix_page *page, void *dst)
{
    if (!c || !page || !dst)
        return CAIRN_EINVAL;
    if (page->device_page >= 0)
        return c->be->iface->download(c->be, dst, dev_addr(c, page->device_page), c->L.page_bytes);
    if (page->host_slot >= 0 && c->slot_state[page->host_slot] == SLOT_IDLE) {
        memcpy(dst, cairn_host_pool_slot(c->host, page->host_slot), c->L.page_bytes);
        return CAIRN_OK;
    }
    return CAIRN_ENOTFOUND;
}

/* ---- stats ------------------------------------------------------------------ */

void cairn_kvcache_get_stats(const cairn_kvcache *c, cairn_kvcache_stats *out)
{
    if (!out)
        return;
    if (!c) {
        *out = (cairn_kvcache_stats){0};
        return;
    }
    *out = c->stats;
    cairn_radix_stats rs;
    cairn_radix_get_stats(c->tree, &rs);
    for (int t = 0; t < CAIRN_TIER_COUNT; t++) {
        cairn_kvcache_tier_stats *ts = &out->tier[t];
        ts->pages = rs.pages[t];
        out->tree_pages[t] = rs.pages[t];
        ts->evicted_pages = c->stats.evicted_pages[t];
    }
    out->tier[CAIRN_TIER_DEVICE].capacity_pages = (uint64_t)cairn_page_pool_capacity(c->dev);
    out->tier[CAIRN_TIER_DEVICE].free_pages = (uint64_t)cairn_page_pool_available(c->dev);
    if (c->host) {
        out->tier[CAIRN_TIER_HOST].capacity_pages = (uint64_t)cairn_host_pool_capacity(c->host);
        out->tier[CAIRN_TIER_HOST].free_pages = (uint64_t)cairn_host_pool_available(c->host);
    }
    if (c->disk) {
        cairn_disk_stats ds;
        cairn_disk_get_stats(c->disk, &ds);
        out->tier[CAIRN_TIER_DISK].pages = ds.pages; /* everything in LMDB */
        out->tier[CAIRN_TIER_DISK].evicted_pages += ds.evicted;
        out->disk_records = ds.records;
    }
    for (int t = 0; t < CAIRN_TIER_COUNT; t++) {
        cairn_kvcache_tier_stats *ts = &out->tier[t];
        ts->bytes = ts->pages * (uint64_t)c->L.page_bytes;
        ts->load_mean_s = ts->load_ops ? ts->load_seconds / (double)ts->load_ops : 0;
        ts->store_mean_s = ts->store_ops ? ts->store_seconds / (double)ts->store_ops : 0;
    }
}
