/*
 * store/kvcache.c — the tiered cache's core: create / free, accessors, the
 * engine-sequence facade (held pages, release, commit), allocation with
 * eviction down the tiers, and stats.
 *
 * The rest of cairn_kvcache lives beside it, one responsibility a file, so
 * each stays small enough to read whole: cost.c (the cost model),
 * promote.c (promotion and the disk completions that drive it), fetch.c
 * (admission), durable.c (pin, persist, flush, records, forget). What they
 * share is in store_impl.h.
 */
#include "store/tiers.h"
#include "store/store_impl.h"

#include <stdlib.h>
#include <string.h>

static void set_err(char *err, size_t len, const char *msg)
{
    if (err && len) {
        strncpy(err, msg, len - 1);
        err[len - 1] = 0;
    }
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
    if (cfg->shared && !cfg->disk_dir) {
        /* Tier 3 is read through the disk tier's I/O thread, into host slots. */
        set_err(err, err_len, "the shared cache tier needs a disk tier (a cache directory)");
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
        rc = cairn_host_pool_create(c->be, c->L.page_bytes, cfg->host_bytes, &c->host);
        if (rc) {
            set_err(err, err_len, "cannot create the host page pool");
            goto fail;
        }
        c->slot_state = calloc((size_t)cairn_host_pool_capacity(c->host), 1);
        c->slot_shared = calloc((size_t)cairn_host_pool_capacity(c->host), 1);
        c->slot_seen = calloc((size_t)cairn_host_pool_capacity(c->host), 1);
        if (!c->slot_state || !c->slot_shared || !c->slot_seen ||
            kvc_transfers_init(c) != CAIRN_OK) {
            rc = CAIRN_ENOMEM;
            goto fail;
        }
    }
    rc = cairn_radix_create(c->L.page_size, cfg->ns, &c->tree);
    c->plain_lru = cfg->plain_lru;
    if (rc == CAIRN_OK && cfg->plain_lru)
        rc = cairn_radix_set_plain_lru(c->tree, true);
    if (rc)
        goto fail;
    /* page-locked on a device: device pages bound for disk or Redis are
     * downloaded through it */
    if (cairn_backend_host_alloc(c->be, c->L.page_bytes, (void **)&c->scratch) != CAIRN_OK) {
        rc = CAIRN_ENOMEM;
        goto fail;
    }
    if (cfg->disk_dir) {
        cairn_shared_config shared;
        if (cfg->shared) {
            shared = *cfg->shared;
            shared.writes_computed = cfg->share_policy == CAIRN_SHARE_ALL;
        }
        cairn_disk_config dc = {
            .dir = cfg->disk_dir,
            .map_bytes = cfg->disk_map_bytes,
            .page_size = c->L.page_size,
            .page_bytes = c->L.page_bytes,
            .ns = cfg->ns,
            .durable = cfg->disk_durable,
            .reset_if_corrupt = true,
            .shared = cfg->shared ? &shared : NULL,
        };
        rc = cairn_disk_open(&dc, &c->disk, err, err_len);
        if (rc)
            goto fail;
        c->shared = cairn_disk_has_shared(c->disk);
        c->share_policy = cfg->share_policy;
        c->write_behind = cfg->write_behind;
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
    kvc_flush_events(c);
    cairn_disk_close(c->disk);
    kvc_transfers_finish(c); /* no copy may still use a slot or page */
    free(c->ev_stored);
    free(c->ev_removed);
    free(c->slot_shared);
    free(c->slot_seen);
    cairn_radix_free(c->tree);
    cairn_host_pool_free(c->host);
    cairn_page_pool_free(c->dev);
    free(c->slot_state);
    cairn_backend_host_free(c->be, c->scratch);
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
    free(c->watch_hashes);
    free(c->nodes);
    kvc_behind_free(c);
    kvc_tails_free(c);
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

int kvc_path_reserve(cairn_kvcache *c, size_t n)
{
    if (n <= c->path_cap)
        return CAIRN_OK;
    cairn_radix_page **p = realloc(c->path, n * sizeof *p);
    if (!p)
        return CAIRN_ENOMEM;
    c->path = p;
    c->path_cap = n;
    return CAIRN_OK;
}

int cairn_kvcache_held_pages(cairn_kvcache *c, cairn_kv_hold *hold, size_t n, int32_t *pages)
{
    if (!c || !hold || (n && !pages))
        return CAIRN_EINVAL;
    if (n == 0)
        return CAIRN_OK;
    if (kvc_path_reserve(c, n) != CAIRN_OK)
        return CAIRN_ENOMEM;
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
            kvc_note_stored(c, end, n_full > n_cached ? n_full - n_cached : 0);
            kvc_announce_node(c, end);
            if (c->share_policy == CAIRN_SHARE_ALL)
                kvc_share_path(c, end, NULL);
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

void kvc_release_page(const cairn_radix_page *p, void *user)
{
    cairn_kvcache *c = user;
    kvc_note_removed(c, p);
    kvc_announce_release(c, p);
    if (p->device_page >= 0)
        cairn_page_pool_release(c->dev, 1, &p->device_page);
    if (p->host_slot >= 0) {
        c->slot_state[p->host_slot] = SLOT_IDLE;
        kvc_host_release(c, p->host_slot);
    }
}

/* Nodes of the path root..node (root excluded) into c->nodes, in order. */
int kvc_path_nodes(cairn_kvcache *c, cairn_radix_node *node, size_t *n)
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

const void *kvc_page_bytes(cairn_kvcache *c, int tier, const cairn_radix_page *pg)
{
    if (tier == CAIRN_TIER_DEVICE)
        return c->be->iface->download(c->be, c->scratch, dev_addr(c, pg->device_page),
                                      c->L.page_bytes) == CAIRN_OK
                   ? c->scratch
                   : NULL;
    if (tier == CAIRN_TIER_HOST)
        return kvc_slot_settle(c, pg->host_slot) == CAIRN_OK
                   ? cairn_host_pool_slot(c->host, pg->host_slot)
                   : NULL;
    return NULL;
}

int kvc_write_page(cairn_kvcache *c, cairn_radix_node *node, size_t i, const int32_t *tokens,
                   const void *bytes)
{
    cairn_radix_page *pages;
    cairn_radix_node_pages(node, &pages);
    cairn_radix_page *pg = &pages[i];
    cairn_disk_page_origin origin = kvc_page_origin(c, node, i);
    int rc = cairn_disk_write(c->disk, pg->hash, &origin, tokens, bytes, COOKIE_WRITE);
    if (rc == CAIRN_OK) {
        pg->on_disk = 1;
        pg->flags &= (uint8_t)~PAGE_LOST;
        c->stats.written_pages++;
    }
    return rc;
}

static size_t evict_node(cairn_kvcache *c, int tier, cairn_radix_node *node);

/* Whether the tier's next node in eviction order is an open session's
 * history (plain LRU knows no such thing). */
static bool next_is_live(cairn_kvcache *c, cairn_radix_node *v)
{
    return !c->plain_lru && cairn_radix_node_class(v) == CAIRN_RADIX_CLASS_LIVE;
}

/* Evict the first candidate of `tier` in eviction order; pages moved, 0
 * when nothing could. A tail is worth less than any page of the tree of its
 * class, so tails go first: other tails before anything, a live session's
 * last partial page only when the tier holds nothing but live pages. */
size_t kvc_evict_one(cairn_kvcache *c, int tier)
{
    if (tier == CAIRN_TIER_HOST && kvc_drop_host_tail(c, false))
        return 1;
    cairn_radix_node *v = cairn_radix_lru(c->tree, tier);
    if (tier == CAIRN_TIER_HOST && (!v || next_is_live(c, v)) && kvc_drop_host_tail(c, true))
        return 1;
    return v ? evict_node(c, tier, v) : 0;
}

/* Tier 0's next page to give up (see kvc_evict_one): true when one went. */
static bool evict_device_page(cairn_kvcache *c)
{
    if (kvc_drop_lru_tail(c, false))
        return true;
    cairn_radix_node *v = cairn_radix_lru(c->tree, CAIRN_TIER_DEVICE);
    if ((!v || next_is_live(c, v)) && kvc_drop_lru_tail(c, true))
        return true;
    return v && evict_node(c, CAIRN_TIER_DEVICE, v) > 0;
}

bool kvc_host_room(cairn_kvcache *c, int32_t n)
{
    /* slots whose copy has ended first, then one still being copied (free
     * within microseconds), then eviction to disk */
    kvc_reclaim(c, CAIRN_TIER_HOST, false);
    while (cairn_host_pool_available(c->host) < n)
        if (kvc_reclaim(c, CAIRN_TIER_HOST, true) == 0 && kvc_evict_one(c, CAIRN_TIER_HOST) == 0)
            return false;
    return true;
}

static size_t drop_node(cairn_kvcache *c, int tier, cairn_radix_node *node)
{
    size_t np = cairn_radix_node_pages(node, NULL);
    if (cairn_radix_node_n_children(node) > 0)
        return 0; /* only leaves leave the tree */
    kvc_note_gone(c, node, tier);
    if (cairn_radix_drop(c->tree, node, 0, kvc_release_page, c) != CAIRN_OK)
        return 0;
    c->stats.evicted_pages[tier] += np;
    return np;
}

/* Whether loading np pages back from `to` (the tier an eviction would put
 * them in) is expected to cost at least twice what recomputing them would:
 * then nobody would load them (cost.c weighs a fetch the same way) and the
 * slower tier's room is better kept for pages that pay. The margin keeps
 * the decision away from the noise of the measured rates. */
static bool cheaper_to_recompute(const cairn_kvcache *c, int to, size_t np)
{
    const cairn_kvcache_rates *r = &c->rates;
    double pb = (double)c->L.page_bytes;
    double recompute = (double)c->L.page_size / r->compute_tokens_per_s;
    double up = pb / r->h2d_bytes_per_s;
    double load = to == CAIRN_TIER_HOST ? up : pb / r->disk_bytes_per_s + up;
    (void)np; /* per page: both sides scale with the node's pages */
    return load >= 2 * recompute;
}

static size_t evict_node(cairn_kvcache *c, int tier, cairn_radix_node *node)
{
    cairn_radix_page *pg;
    size_t np = cairn_radix_node_pages(node, &pg);
    const int32_t *tok = cairn_radix_node_tokens(node);
    size_t ps = (size_t)c->L.page_size;

    if (tier < CAIRN_TIER_DISK && cairn_radix_node_n_children(node) == 0 &&
        cheaper_to_recompute(c, tier + 1, np)) {
        c->stats.dropped_cheap_pages += np;
        return drop_node(c, tier, node);
    }

    if (tier == CAIRN_TIER_DEVICE) {
        if (!c->host)
            return drop_node(c, tier, node);
        kvc_host_room(c, (int32_t)np);
        /* Evicting other nodes never moves this node's page records, so
         * pg is still good. */
        if (cairn_host_pool_available(c->host) < (int32_t)np)
            return drop_node(c, tier, node); /* host full of locked loads */
        double t0 = cairn_now();
        for (size_t i = 0; i < np; i++) {
            int32_t slot;
            cairn_host_pool_alloc(c->host, 1, &slot);
            /* The copy runs on the copy queue; the device page comes back
             * when it has been read (transfer.c). */
            int rc = kvc_move_to_host(c, slot, pg[i].device_page);
            if (rc) {
                kvc_host_release(c, slot);
                return drop_node(c, tier, node);
            }
            c->slot_state[slot] = SLOT_IDLE;
            pg[i].device_page = -1;
            pg[i].host_slot = slot;
        }
        kvc_set_tier(c, node, CAIRN_TIER_HOST);
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
                (kvc_slot_settle(c, pg[i].host_slot) != CAIRN_OK ||
                 kvc_write_page(c, node, i, tok + i * ps,
                                cairn_host_pool_slot(c->host, pg[i].host_slot)) != CAIRN_OK))
                pg[i].flags |= PAGE_LOST; /* nowhere now: a promotion reports it */
            c->slot_state[pg[i].host_slot] = SLOT_IDLE;
            kvc_host_release(c, pg[i].host_slot);
            pg[i].host_slot = -1;
        }
        kvc_set_tier(c, node, CAIRN_TIER_DISK);
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
        size_t k = kvc_evict_one(c, tier);
        if (k == 0)
            break;
        done += k;
    }
    if (moved)
        *moved = done;
    return CAIRN_OK;
}

int cairn_kvcache_mark_live(cairn_kvcache *c, uint64_t ns, const int32_t *tokens, size_t n_tokens,
                            cairn_kv_live *l)
{
    if (!l)
        return CAIRN_EINVAL;
    *l = (cairn_kv_live){0};
    if (!c || (!tokens && n_tokens))
        return CAIRN_EINVAL;
    cairn_radix_match_result m;
    int rc = cairn_radix_match(c->tree, ns, tokens, n_tokens, &m);
    if (rc != CAIRN_OK)
        return rc;
    if (m.n_pages == 0)
        return CAIRN_OK;
    if ((rc = cairn_radix_mark_live(c->tree, m.node)) != CAIRN_OK)
        return rc;
    l->node_id = cairn_radix_node_id(m.node);
    l->n_pages = m.n_pages;
    /* the partial last page, when a tail holds it */
    if (m.n_pages == n_tokens / (size_t)c->L.page_size)
        l->tail_id = kvc_tail_mark_live(c, ns, tokens, n_tokens);
    return CAIRN_OK;
}

void cairn_kvcache_unmark_live(cairn_kvcache *c, uint64_t ns, const int32_t *tokens,
                               size_t n_tokens, cairn_kv_live *l)
{
    if (!c || !l || !l->node_id)
        return;
    kvc_tail_unmark_live(c, l->tail_id);
    size_t ps = (size_t)c->L.page_size;
    if (tokens && n_tokens >= l->n_pages * ps) {
        cairn_radix_node *n = cairn_radix_find(c->tree, ns, tokens, l->n_pages);
        if (n && cairn_radix_node_id(n) == l->node_id)
            cairn_radix_unmark_live(c->tree, n);
    }
    *l = (cairn_kv_live){0};
}

int cairn_kvcache_alloc(cairn_kvcache *c, int32_t n, int32_t *pages)
{
    if (!c || n < 0 || (n && !pages))
        return CAIRN_EINVAL;
    /* Pages whose copy to host RAM has ended come back first; then a page
     * still being copied (it is free within microseconds), then tails (each
     * worth less than a page of recompute), then eviction. */
    kvc_reclaim(c, CAIRN_TIER_DEVICE, false);
    while (cairn_page_pool_available(c->dev) < n)
        if (kvc_reclaim(c, CAIRN_TIER_DEVICE, true) == 0 && !evict_device_page(c))
            return CAIRN_EFULL;
    return cairn_page_pool_alloc(c->dev, n, pages);
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
    out->behind_waiting = c->n_behind;
    kvc_tail_counts(c, &out->tail_pages, &out->tail_host_pages);
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
    out->tier[CAIRN_TIER_DEVICE].draining_pages = c->drain[CAIRN_TIER_DEVICE].n;
    out->tier[CAIRN_TIER_HOST].draining_pages = c->drain[CAIRN_TIER_HOST].n;
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
        if (cairn_disk_has_shared(c->disk))
            out->shared = (cairn_kvcache_shared_stats){
                .on = true, .up = ds.shared_up, .hits = ds.shared_hits,
                .misses = ds.shared_misses, .corrupt = ds.shared_corrupt,
                .puts = ds.shared_puts, .dropped = ds.shared_dropped,
                .errors = ds.shared_errors, .events = ds.shared_events,
                .outages = ds.shared_outages, .queued_bytes = ds.shared_queued_bytes};
    }
    for (int t = 0; t < CAIRN_TIER_COUNT; t++) {
        cairn_kvcache_tier_stats *ts = &out->tier[t];
        ts->bytes = ts->pages * (uint64_t)c->L.page_bytes;
        ts->load_mean_s = ts->load_ops ? ts->load_seconds / (double)ts->load_ops : 0;
        ts->store_mean_s = ts->store_ops ? ts->store_seconds / (double)ts->store_ops : 0;
    }
}
