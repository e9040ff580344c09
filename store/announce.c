/*
 * store/announce.c — the page watcher (store.h, "watching pages"): who is
 * told when a whole page enters or leaves a tier, so a replica can publish
 * what it holds to the routers in front of it (kvevents/).
 *
 * The memory tiers are reconciled per node, never reasoned about per call
 * site: a page's announced media live in two bits of its flags, and after
 * anything that changes a node's tier (insertion, eviction, promotion) the
 * node is compared against them:
 *
 *     wanted  = the node's tier if it is DEVICE or HOST, for namespace 0
 *     stored  = wanted  & ~announced   -> one STORED run per medium
 *     removed = announced & ~wanted    -> one REMOVED run per medium
 *
 * A page leaving the tree is removed from whatever its bits say
 * (kvc_announce_release). Tier 2 is LMDB's own business: the disk reports
 * the pages it commits and deletes itself, on its I/O thread (disk.c).
 *
 * Only namespace 0 is announced: a router's index is keyed by token ids and
 * knows no tenants, so a tenant's pages would credit a replica with a cache
 * another tenant cannot use, and tell the router that someone holds that
 * text. A tenant's pages are served from the cache as ever, just not
 * advertised.
 */
#include "store/store_impl.h"

#include <stdlib.h>

static uint8_t medium_bit(int tier)
{
    return tier == CAIRN_TIER_DEVICE ? PAGE_ANN_DEVICE : tier == CAIRN_TIER_HOST ? PAGE_ANN_HOST : 0;
}

/* The hash of the page before pg[i] of node: the previous page of the node,
 * else the last page of the parent node; false at the start of a sequence. */
static bool page_parent(cairn_radix_node *node, cairn_radix_page *pg, size_t i,
                        cairn_page_hash *out)
{
    if (i > 0) {
        *out = pg[i - 1].hash;
        return true;
    }
    cairn_radix_node *up = cairn_radix_parent(node);
    if (!up || !cairn_radix_parent(up))
        return false; /* node hangs from the root */
    cairn_radix_page *pp;
    size_t pn = cairn_radix_node_pages(up, &pp);
    if (pn == 0)
        return false;
    *out = pp[pn - 1].hash;
    return true;
}

bool kvc_page_parent(cairn_kvcache *c, cairn_radix_node *node, size_t i, cairn_page_hash *out)
{
    cairn_radix_page *pg;
    cairn_radix_node_pages(node, &pg);
    if (page_parent(node, pg, i, out))
        return true;
    *out = cairn_radix_ns_seed(c->tree, cairn_radix_node_ns(node));
    return false;
}

cairn_disk_page_origin kvc_page_origin(cairn_kvcache *c, cairn_radix_node *node, size_t i)
{
    cairn_disk_page_origin o;
    o.has_parent = kvc_page_parent(c, node, i, &o.parent);
    o.announce = c->watch_fn != NULL && cairn_radix_node_ns(node) == 0;
    return o;
}

static int reserve_hashes(cairn_kvcache *c, size_t n)
{
    if (n <= c->watch_cap)
        return CAIRN_OK;
    cairn_page_hash *v = realloc(c->watch_hashes, n * sizeof *v);
    if (!v)
        return CAIRN_ENOMEM;
    c->watch_hashes = v;
    c->watch_cap = n;
    return CAIRN_OK;
}

/* One event for pages [from, to) of node in `tier`. */
static void emit_run(cairn_kvcache *c, cairn_radix_node *node, cairn_radix_page *pg, size_t from,
                     size_t to, int kind, int tier)
{
    if (from >= to || reserve_hashes(c, to - from) != CAIRN_OK)
        return;
    for (size_t i = from; i < to; i++)
        c->watch_hashes[i - from] = pg[i].hash;
    cairn_kv_page_event e = {
        .kind = kind,
        .tier = tier,
        .ns = cairn_radix_node_ns(node),
        .hashes = c->watch_hashes,
        .n = to - from,
    };
    if (kind == CAIRN_KV_PAGES_STORED) {
        e.has_parent = page_parent(node, pg, from, &e.parent);
        e.tokens = cairn_radix_node_tokens(node) + from * (size_t)c->L.page_size;
    }
    c->watch_fn(&e, c->watch_user);
}

void kvc_announce_node(cairn_kvcache *c, cairn_radix_node *node)
{
    if (!c->watch_fn || !node || !cairn_radix_parent(node))
        return;
    int tier = cairn_radix_node_tier(node);
    uint8_t want = cairn_radix_node_ns(node) == 0 ? medium_bit(tier) : 0;
    cairn_radix_page *pg;
    size_t np = cairn_radix_node_pages(node, &pg);
    static const int tiers[2] = {CAIRN_TIER_DEVICE, CAIRN_TIER_HOST};
    /* Stores first, then removals: a page moving device -> host is
     * stored in host RAM before it is removed from the device, so a reader
     * applying the events in order never sees it nowhere. */
    for (int pass = 0; pass < 2; pass++) {
        int kind = pass == 0 ? CAIRN_KV_PAGES_STORED : CAIRN_KV_PAGES_REMOVED;
        for (int t = 0; t < 2; t++) {
            uint8_t bit = medium_bit(tiers[t]);
            size_t run = np;
            for (size_t i = 0; i <= np; i++) {
                bool change = false;
                if (i < np) {
                    bool has = pg[i].flags & bit, wants = want & bit;
                    change = kind == CAIRN_KV_PAGES_STORED ? wants && !has : has && !wants;
                }
                if (change && run == np)
                    run = i;
                else if (!change && run != np) {
                    emit_run(c, node, pg, run, i, kind, tiers[t]);
                    run = np;
                }
            }
            for (size_t i = 0; i < np; i++) {
                if (kind == CAIRN_KV_PAGES_STORED && (want & bit))
                    pg[i].flags |= bit;
                else if (kind == CAIRN_KV_PAGES_REMOVED && !(want & bit))
                    pg[i].flags &= (uint8_t)~bit;
            }
        }
    }
}

void kvc_set_tier(cairn_kvcache *c, cairn_radix_node *node, int tier)
{
    cairn_radix_set_tier(c->tree, node, tier);
    kvc_announce_node(c, node);
}

void kvc_announce_release(cairn_kvcache *c, const cairn_radix_page *p)
{
    if (!c->watch_fn || !(p->flags & (PAGE_ANN_DEVICE | PAGE_ANN_HOST)))
        return;
    cairn_kv_page_event e = {.kind = CAIRN_KV_PAGES_REMOVED, .ns = 0, .hashes = &p->hash, .n = 1};
    if (p->flags & PAGE_ANN_DEVICE) {
        e.tier = CAIRN_TIER_DEVICE;
        c->watch_fn(&e, c->watch_user);
    }
    if (p->flags & PAGE_ANN_HOST) {
        e.tier = CAIRN_TIER_HOST;
        c->watch_fn(&e, c->watch_user);
    }
}

/* Depth first, parents before children: a reader anchors each run under
 * the page before it, which it has then already seen. */
static void announce_subtree(cairn_kvcache *c, cairn_radix_node *node)
{
    if (cairn_radix_parent(node)) {
        cairn_radix_page *pg;
        size_t np = cairn_radix_node_pages(node, &pg);
        for (size_t i = 0; i < np; i++)
            pg[i].flags &= (uint8_t)~(PAGE_ANN_DEVICE | PAGE_ANN_HOST);
        kvc_announce_node(c, node);
    }
    size_t nc = cairn_radix_node_n_children(node);
    for (size_t i = 0; i < nc; i++)
        announce_subtree(c, cairn_radix_node_child(node, i));
}

/* The disk reports from its I/O thread in its own terms; the watcher
 * hears them as tier-2 page events. */
static void disk_watch(const cairn_disk_page_event *d, void *user)
{
    cairn_kvcache *c = user;
    cairn_kv_page_event e = {
        .kind = d->stored ? CAIRN_KV_PAGES_STORED : CAIRN_KV_PAGES_REMOVED,
        .tier = CAIRN_TIER_DISK,
        .ns = 0,
        .has_parent = d->has_parent,
        .parent = d->parent,
        .hashes = d->hashes,
        .n = d->n,
        .tokens = d->tokens,
    };
    c->watch_fn(&e, c->watch_user);
}

int cairn_kvcache_watch(cairn_kvcache *c, cairn_kvcache_watch_fn fn, void *user)
{
    if (!c)
        return CAIRN_EINVAL;
    c->watch_fn = fn;
    c->watch_user = user;
    if (c->disk)
        return cairn_disk_watch(c->disk, fn ? disk_watch : NULL, fn ? c : NULL);
    return CAIRN_OK;
}

int cairn_kvcache_announce_all(cairn_kvcache *c)
{
    if (!c)
        return CAIRN_EINVAL;
    if (!c->watch_fn)
        return CAIRN_OK;
    cairn_kv_page_event e = {.kind = CAIRN_KV_PAGES_CLEARED, .tier = -1};
    c->watch_fn(&e, c->watch_user);
    announce_subtree(c, cairn_radix_root(c->tree));
    if (c->disk)
        return cairn_disk_announce_pages(c->disk, cairn_radix_ns_seed(c->tree, 0));
    return CAIRN_OK;
}
