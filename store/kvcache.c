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
 */
#include "store/store.h"

#include <stdlib.h>
#include <string.h>

enum { SLOT_IDLE = 0, SLOT_LOADING, SLOT_LOADED, SLOT_MISSED };
enum { PAGE_LOST = 1 }; /* cairn_radix_page.flags: the disk copy is gone */

/* Disk cookies: the top two bits say what the completion is for. */
#define COOKIE_READ (1ull << 62)
#define COOKIE_FENCE (2ull << 62)
#define COOKIE_WRITE (3ull << 62)
#define COOKIE_KIND(c) ((c) & (3ull << 62))
#define COOKIE_VALUE(c) ((c) & ~(3ull << 62))

typedef struct {
    uint64_t cookie; /* the caller's */
    uint64_t id;     /* fence cookie value */
    cairn_radix_node *node;
} promotion;

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
    free(c->events);
    free(c->path);
    free(c->nodes);
    free(c);
}

cairn_radix *cairn_kvcache_tree(cairn_kvcache *c) { return c ? c->tree : NULL; }
cairn_page_pool *cairn_kvcache_device_pool(cairn_kvcache *c) { return c ? c->dev : NULL; }
cairn_host_pool *cairn_kvcache_host_pool(cairn_kvcache *c) { return c ? c->host : NULL; }
cairn_disk *cairn_kvcache_disk(cairn_kvcache *c) { return c ? c->disk : NULL; }

void cairn_kvcache_get_stats(const cairn_kvcache *c, cairn_kvcache_stats *out)
{
    if (out)
        *out = c ? c->stats : (cairn_kvcache_stats){0};
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
    for (size_t i = 0; i < np; i++) {
        int32_t id;
        int rc = cairn_kvcache_alloc(c, 1, &id);
        if (rc == CAIRN_OK)
            rc = c->be->iface->upload(c->be, dev_addr(c, id),
                                      cairn_host_pool_slot(c->host, pg[i].host_slot),
                                      c->L.page_bytes);
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

static void finish_promotion(cairn_kvcache *c, const promotion *p)
{
    int status = CAIRN_OK;
    size_t n_nodes;
    if (path_nodes(c, p->node, &n_nodes)) {
        push_event(c, (cairn_kvcache_event){p->cookie, CAIRN_ENOMEM, 0});
        return;
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
    size_t resident = leading_device_pages(c, p->node);
    if (status == CAIRN_OK && resident != cairn_radix_node_depth(p->node))
        status = CAIRN_EFULL;
    push_event(c, (cairn_kvcache_event){p->cookie, status, resident});
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
    size_t ps = (size_t)c->L.page_size;
    bool queued_reads = false, pending_loads = false;
    for (size_t i = 0; i < n_nodes; i++) {
        cairn_radix_node *x = c->nodes[i];
        if (cairn_radix_node_tier(x) != CAIRN_TIER_DISK)
            continue;
        cairn_radix_page *pg;
        size_t np = cairn_radix_node_pages(x, &pg);
        const int32_t *tok = cairn_radix_node_tokens(x);
        for (size_t j = 0; j < np; j++) {
            if (pg[j].host_slot >= 0) {
                pending_loads = true; /* an earlier promotion is loading it */
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
            rc = cairn_disk_read(c->disk, pg[j].hash, tok + j * ps,
                                 cairn_host_pool_slot(c->host, slot), COOKIE_READ | (uint64_t)slot);
            if (rc) {
                cairn_host_pool_release(c->host, 1, &slot);
                continue;
            }
            c->slot_state[slot] = SLOT_LOADING;
            pg[j].host_slot = slot;
            queued_reads = true;
        }
    }
    promotion p = {.cookie = cookie, .id = ++c->next_promo, .node = node};
    if ((queued_reads || pending_loads) && c->disk) {
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

int cairn_kvcache_poll(cairn_kvcache *c, cairn_kvcache_event *out, int max, int *n)
{
    if (!c || !n || max < 0 || (max && !out))
        return CAIRN_EINVAL;
    if (c->disk) {
        cairn_disk_completion done[64];
        int k;
        do {
            cairn_disk_poll(c->disk, done, 64, &k);
            for (int i = 0; i < k; i++) {
                uint64_t kind = COOKIE_KIND(done[i].cookie), v = COOKIE_VALUE(done[i].cookie);
                if (kind == COOKIE_READ) {
                    c->slot_state[v] = done[i].status == CAIRN_OK ? SLOT_LOADED : SLOT_MISSED;
                } else if (kind == COOKIE_WRITE) {
                    if (done[i].status != CAIRN_OK)
                        c->stats.write_failures++;
                } else if (kind == COOKIE_FENCE) {
                    for (size_t j = 0; j < c->n_promos; j++) {
                        if (c->promos[j].id != v)
                            continue;
                        promotion p = c->promos[j];
                        c->promos[j] = c->promos[--c->n_promos];
                        finish_promotion(c, &p);
                        break;
                    }
                }
            }
        } while (k == 64);
    }
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
    size_t ps = (size_t)c->L.page_size;
    /* Write-through: every resident page of the pinned prefix goes to disk
     * now, so it survives eviction and restarts. */
    for (size_t i = 0; i < n_nodes; i++) {
        cairn_radix_page *pg;
        size_t np = cairn_radix_node_pages(c->nodes[i], &pg);
        const int32_t *tok = cairn_radix_node_tokens(c->nodes[i]);
        int tier = cairn_radix_node_tier(c->nodes[i]);
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
            if (bytes)
                write_page(c, &pg[j], tok + j * ps, bytes);
        }
    }
    return CAIRN_OK;
}

int cairn_kvcache_unpin(cairn_kvcache *c, cairn_radix_node *node)
{
    return c ? cairn_radix_unlock(c->tree, node) : CAIRN_EINVAL;
}

int cairn_kvcache_forget(cairn_kvcache *c, const int32_t *tokens, size_t n_tokens, size_t keep_pages)
{
    if (!c || (!tokens && n_tokens))
        return CAIRN_EINVAL;
    cairn_radix_match_result m;
    int rc = cairn_radix_match(c->tree, tokens, n_tokens, &m);
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
