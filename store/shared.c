/*
 * store/shared.c — the tiered cache's side of tier 3 (the Redis shared by
 * replicas; the connection itself is the disk's, disk_shared.c): which
 * pages get a copy there, and the page events a router routes by.
 *
 * Which pages. Redis is shared and smaller than the sum of the replicas'
 * disks, so not every computed page goes there, only those worth it to
 * another replica:
 *   - a prefix seen twice: a fetch that found pages cached (that prefix is
 *     reused, so others will likely want it too); or one whose lookup in
 *     Redis missed where another replica's had missed before (each lookup
 *     leaves a marker, P s:<ns>:<hash>): the second replica to compute a
 *     prefix shares it as it computes it (cairn_kvcache_share), so a third
 *     finds it;
 *   - a pinned prefix and a persisted session's pages (an agent's history:
 *     where its session goes when its replica dies, its pages follow);
 *   - with CAIRN_SHARE_ALL, every page a sequence commits; with
 *     CAIRN_SHARE_NONE, none (the replica only reads, and publishes events).
 * A page is copied once (PAGE_SHARED); pages that came from Redis are
 * marked so too.
 *
 * Page events. "stored": pages entered this replica's tree; "removed": a
 * page left the tree and has no copy on this replica's disk. The disk's
 * own LRU deletions are not reported (the I/O thread does not know which
 * of them the tree still holds): a router treats the index as a hint, and
 * a replica that no longer has a page just computes it. Events are
 * gathered per call and queued in one XADD each per poll, never per page.
 */
#include "store/tiers.h"
#include "store/store_impl.h"

#include <stdlib.h>
#include <string.h>

/* Share the node's first max_pages pages. */
static void share_node(cairn_kvcache *c, cairn_radix_node *node, size_t max_pages)
{
    size_t ps = (size_t)c->L.page_size;
    cairn_radix_page *pg;
    size_t np = cairn_radix_node_pages(node, &pg);
    if (np > max_pages)
        np = max_pages;
    const int32_t *tok = cairn_radix_node_tokens(node);
    int tier = cairn_radix_node_tier(node);
    if (tier == CAIRN_TIER_DISK)
        return; /* not resident: shared when it comes back up */
    for (size_t j = 0; j < np; j++) {
        if (pg[j].flags & PAGE_SHARED)
            continue;
        const void *bytes = kvc_page_bytes(c, tier, &pg[j]);
        if (!bytes)
            continue;
        cairn_disk_page_origin origin = kvc_page_origin(c, node, j);
        int rc = cairn_disk_share_page(c->disk, pg[j].hash, &origin, tok + j * ps, bytes);
        if (rc == CAIRN_EFULL)
            return; /* the queue is full: Redis is behind, try again later */
        if (rc == CAIRN_OK) {
            pg[j].flags |= PAGE_SHARED;
            c->stats.shared_pages_queued++;
        }
    }
}

void kvc_share_path(cairn_kvcache *c, cairn_radix_node *node, cairn_radix_node *child)
{
    if (!c->shared || c->share_policy == CAIRN_SHARE_NONE || !node || !cairn_radix_parent(node))
        return;
    size_t n_nodes;
    if (kvc_path_nodes(c, node, &n_nodes) != CAIRN_OK)
        return;
    for (size_t i = 0; i < n_nodes; i++)
        share_node(c, c->nodes[i], SIZE_MAX);
    if (child) /* the page a partial match ends in: other replicas find it by parent */
        share_node(c, child, 1);
}

static void push_hash(cairn_page_hash **v, size_t *n, size_t *cap, cairn_page_hash h)
{
    if (*n == *cap) {
        size_t nc = *cap ? 2 * *cap : 64;
        cairn_page_hash *nv = realloc(*v, nc * sizeof *nv);
        if (!nv)
            return; /* an event lost: the index is a hint */
        *v = nv;
        *cap = nc;
    }
    (*v)[(*n)++] = h;
}

void kvc_note_stored(cairn_kvcache *c, cairn_radix_node *leaf, size_t n_new)
{
    if (!c->shared || !leaf || n_new == 0)
        return;
    size_t depth = cairn_radix_node_depth(leaf);
    if (n_new > depth)
        n_new = depth;
    if (kvc_path_reserve(c, depth) != CAIRN_OK)
        return;
    size_t got = 0;
    if (cairn_radix_path(leaf, c->path, depth, &got) != CAIRN_OK)
        return;
    for (size_t i = got - n_new; i < got; i++)
        push_hash(&c->ev_stored, &c->n_ev_stored, &c->cap_ev_stored, c->path[i]->hash);
}

void kvc_note_removed(cairn_kvcache *c, const cairn_radix_page *p)
{
    if (c->shared && !p->on_disk)
        push_hash(&c->ev_removed, &c->n_ev_removed, &c->cap_ev_removed, p->hash);
}

void kvc_flush_events(cairn_kvcache *c)
{
    if (!c->shared)
        return;
    if (c->n_ev_stored) {
        cairn_disk_publish(c->disk, CAIRN_SHARED_STORED, c->ev_stored, c->n_ev_stored);
        c->n_ev_stored = 0;
    }
    if (c->n_ev_removed) {
        cairn_disk_publish(c->disk, CAIRN_SHARED_REMOVED, c->ev_removed, c->n_ev_removed);
        c->n_ev_removed = 0;
    }
}

int cairn_kvcache_announce(cairn_kvcache *c, const char *replica, const char *http,
                           const char *rpc)
{
    if (!c)
        return CAIRN_EINVAL;
    if (!c->shared)
        return CAIRN_OK;
    return cairn_disk_announce(c->disk, replica, http, rpc);
}

bool cairn_kvcache_has_shared(const cairn_kvcache *c) { return c && c->shared; }

int cairn_kvcache_unshare_record(cairn_kvcache *c, const void *key, size_t key_len)
{
    if (!c)
        return CAIRN_EINVAL;
    if (!c->shared)
        return CAIRN_OK;
    return cairn_disk_unshare_record(c->disk, key, key_len);
}

int cairn_kvcache_share(cairn_kvcache *c, cairn_kv_hold *hold)
{
    if (!c)
        return CAIRN_EINVAL;
    kvc_share_path(c, hold, NULL);
    return CAIRN_OK;
}
