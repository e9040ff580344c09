/*
 * store/share.c — sharing KV while it is being computed, and reusing part
 * of a page: the facade calls that let the engine compute a prefix once
 * even when many requests want it at the same moment, and reuse a match
 * that ends inside a page.
 *
 *   extend       a running sequence gives the tree its whole pages as soon
 *                as they are computed (not only when it ends), and moves its
 *                lock to the new end: a request arriving meanwhile matches
 *                them like any cached prefix.
 *   partial      after a whole-page match, the page that continues it may
 *                share only its first k tokens with the request (another
 *                question about the same document, a conversation resent
 *                with one more message). That page is copied into a page of
 *                the caller's, whose first k rows are then valid KV for the
 *                request's tokens; the caller writes rows k.. itself. A
 *                page is never shared half-written: copy, not alias.
 *   tails        the last, partial page of a finished sequence (what
 *                commit would return to the pool: the end of a reply) is
 *                kept, keyed by the chained hash of the whole pages before
 *                it, so the next turn of that conversation reuses it.
 *                Tails are the first pages to leave tier 0 when the pool
 *                runs short (each is worth less than a page of recompute):
 *                to a host slot when one is free, else dropped; host tails
 *                are the first slots given up when host RAM is needed.
 *                Below host RAM they live as padded pages listed under
 *                their parent (see "tails in the lower tiers"): written at
 *                flush and persist, shared at once with --shared-write all.
 *
 * Why copy and not copy-on-write sharing: a page is written row by row
 * while its sequence runs; sharing a page some of whose rows another
 * sequence will still write would need per-row ownership in every kernel.
 * One page copy (page_bytes, a few hundred KiB at most) per admission costs
 * less than computing the rows it saves.
 */
#include "store/tiers.h"
#include "store/store_impl.h"

#include <stdlib.h>
#include <string.h>

/* Tails kept at most: an eighth of the pool, within these bounds. */
#define TAILS_MIN 16
#define TAILS_MAX 4096

struct kv_tail {
    cairn_page_hash parent; /* chained hash of the whole pages before it */
    uint64_t ns;
    int32_t page;           /* tier-0 page id, -1: not on the device        */
    int32_t slot;           /* tier-1 slot when it moved to host RAM, else -1 */
    int32_t n;              /* valid tokens (1 .. page_size-1)             */
    uint64_t last_use;
    uint64_t id;            /* unique while the cache lives (a live mark's) */
    int32_t live;           /* live marks of sessions whose history ends in it */
    bool on_disk, shared;   /* written to LMDB / queued for Redis (below)  */
    int8_t came_from;       /* a page read by parent: CAIRN_TIER_DISK or
                               CAIRN_KVCACHE_FROM_SHARED until its first use
                               (where that use's rows came from); else -1 */
    int32_t *tokens;        /* [page_size], points into the shared array   */
};

static size_t lcp(const int32_t *a, const int32_t *b, size_t n)
{
    size_t i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

/* ---- extend ------------------------------------------------------------ */

int cairn_kvcache_extend(cairn_kvcache *c, uint64_t ns, const int32_t *tokens, size_t n_full,
                         int32_t *pages, size_t *n_held, cairn_kv_hold **hold)
{
    if (!c || !tokens || !pages || !n_held || !hold)
        return CAIRN_EINVAL;
    if (n_full <= *n_held)
        return CAIRN_OK;
    const size_t ps = (size_t)c->L.page_size;
    /* What the tree has already: another sequence may have computed some of
     * these pages too (it raced us). Their tree copies must be on the
     * device for our page table to point at them instead. */
    cairn_radix_match_result m;
    int rc = cairn_radix_match(c->tree, ns, tokens, n_full * ps, &m);
    if (rc)
        return rc;
    size_t have = m.n_pages < n_full ? m.n_pages : n_full;
    if (have > *n_held) {
        size_t depth = 0;
        if (kvc_path_reserve(c, have) != CAIRN_OK)
            return CAIRN_ENOMEM;
        if ((rc = cairn_radix_path(m.node, c->path, c->path_cap, &depth)) != CAIRN_OK)
            return rc;
        for (size_t i = *n_held; i < have; i++)
            if (i >= depth || c->path[i]->device_page < 0)
                return CAIRN_EBUSY; /* not on the device: keep ours private */
        for (size_t i = *n_held; i < have; i++) {
            cairn_page_pool_release(c->dev, 1, &pages[i]);
            pages[i] = c->path[i]->device_page;
        }
    }
    size_t n_cached = 0;
    cairn_radix_node *leaf = NULL;
    if ((rc = cairn_radix_insert(c->tree, ns, tokens, n_full, pages, &n_cached, &leaf)) != CAIRN_OK) {
        /* nothing taken; but pages [n_held, have) are the tree's now: hold them */
        if (have > *n_held) {
            cairn_radix_lock(c->tree, m.node);
            if (*hold)
                cairn_radix_unlock(c->tree, *hold);
            *hold = m.node;
            *n_held = have;
        }
        return rc;
    }
    kvc_note_stored(c, leaf, n_full > n_cached ? n_full - n_cached : 0);
    kvc_announce_node(c, leaf);
    cairn_radix_lock(c->tree, leaf);
    if (*hold)
        cairn_radix_unlock(c->tree, *hold);
    *hold = leaf;
    *n_held = n_full;
    return CAIRN_OK;
}

/* ---- tails ------------------------------------------------------------- */

static int tails_init(cairn_kvcache *c)
{
    if (c->tails)
        return CAIRN_OK;
    size_t cap = (size_t)cairn_page_pool_capacity(c->dev) / 8;
    cap = cap < TAILS_MIN ? TAILS_MIN : cap > TAILS_MAX ? TAILS_MAX : cap;
    c->tails = calloc(cap, sizeof *c->tails);
    c->tail_tokens = malloc(cap * (size_t)c->L.page_size * sizeof(int32_t));
    if (!c->tails || !c->tail_tokens) {
        kvc_tails_free(c);
        return CAIRN_ENOMEM;
    }
    for (size_t i = 0; i < cap; i++) {
        c->tails[i].page = c->tails[i].slot = -1;
        c->tails[i].tokens = c->tail_tokens + i * (size_t)c->L.page_size;
    }
    c->n_tails_cap = cap;
    return CAIRN_OK;
}

void kvc_tails_free(cairn_kvcache *c)
{
    free(c->tails);
    free(c->tail_tokens);
    c->tails = NULL;
    c->tail_tokens = NULL;
    c->n_tails_cap = c->n_tails = 0;
}

static bool tail_live(const struct kv_tail *t) { return t->page >= 0 || t->slot >= 0; }

static void tail_drop(cairn_kvcache *c, struct kv_tail *t)
{
    if (!tail_live(t))
        return;
    if (t->page >= 0)
        cairn_page_pool_release(c->dev, 1, &t->page);
    if (t->slot >= 0)
        kvc_host_release(c, t->slot);
    t->page = t->slot = -1;
    c->n_tails--;
}

/* The least recently used tail in tier 0 (device) or 1 (host) that is
 * (live) or is not (!live) the end of a live session's history, or NULL;
 * never the one partial() is copying. With plain LRU, any tail. */
static struct kv_tail *lru_tail(cairn_kvcache *c, bool on_device, bool live)
{
    struct kv_tail *lru = NULL;
    for (size_t i = 0; i < c->n_tails_cap && c->n_tails > 0; i++) {
        struct kv_tail *t = &c->tails[i];
        if (t == c->tail_busy)
            continue; /* partial() is copying it */
        if (!c->plain_lru && (t->live > 0) != live)
            continue;
        if ((on_device ? t->page : t->slot) >= 0 && (!lru || t->last_use < lru->last_use))
            lru = t;
    }
    return lru;
}

bool kvc_drop_lru_tail(cairn_kvcache *c, bool live)
{
    struct kv_tail *t = lru_tail(c, true, live);
    if (!t)
        return false;
    int32_t slot;
    if (c->host && cairn_host_pool_available(c->host) > 0 &&
        cairn_host_pool_alloc(c->host, 1, &slot) == CAIRN_OK) {
        if (kvc_move_to_host(c, slot, t->page) == CAIRN_OK) {
            c->slot_state[slot] = SLOT_IDLE;
            t->page = -1;
            t->slot = slot;
            return true;
        }
        kvc_host_release(c, slot);
    }
    tail_drop(c, t);
    return true;
}

void kvc_tail_counts(const cairn_kvcache *c, uint64_t *on_device, uint64_t *in_host)
{
    *on_device = *in_host = 0;
    for (size_t i = 0; i < c->n_tails_cap; i++) {
        *on_device += c->tails[i].page >= 0;
        *in_host += c->tails[i].slot >= 0;
    }
}

bool kvc_drop_host_tail(cairn_kvcache *c, bool live)
{
    struct kv_tail *t = lru_tail(c, false, live);
    if (!t)
        return false;
    tail_drop(c, t);
    return true;
}

/* h of the whole pages of tokens[0 .. n_pages * page_size) in namespace ns. */
static cairn_page_hash chain_hash(cairn_kvcache *c, uint64_t ns, const int32_t *tokens,
                                  size_t n_pages)
{
    const size_t ps = (size_t)c->L.page_size;
    cairn_page_hash h = cairn_radix_ns_seed(c->tree, ns);
    for (size_t i = 0; i < n_pages; i++)
        h = cairn_page_hash_next(h, tokens + i * ps, ps);
    return h;
}

/* Give back what a tail would have been kept in: a device page or a host
 * slot. */
static void release_holder(cairn_kvcache *c, int32_t page, int32_t host_slot)
{
    if (page >= 0)
        cairn_page_pool_release(c->dev, 1, &page);
    if (host_slot >= 0)
        kvc_host_release(c, host_slot);
}

/* Keep tail[0 .. n) under `parent`, its KV in device page `page` or host
 * slot `host_slot` (one of them; taken in every case), which came from
 * `came_from` (kv_tail.came_from). */
static int tail_place(cairn_kvcache *c, uint64_t ns, cairn_page_hash parent, const int32_t *tail,
                      size_t n, int32_t page, int32_t host_slot, int came_from)
{
    if (tails_init(c) != CAIRN_OK) {
        release_holder(c, page, host_slot);
        return CAIRN_ENOMEM;
    }
    struct kv_tail *slot = NULL;
    for (size_t i = 0; i < c->n_tails_cap; i++) {
        struct kv_tail *t = &c->tails[i];
        if (!tail_live(t)) {
            if (!slot)
                slot = t;
            continue;
        }
        if (t->ns != ns || !cairn_page_hash_equal(t->parent, parent))
            continue;
        size_t l = lcp(t->tokens, tail, (size_t)t->n < n ? (size_t)t->n : n);
        if (l == (size_t)t->n) { /* ours extends it (or equals it): replace */
            tail_drop(c, t);
            if (!slot)
                slot = t;
        } else if (l == n) { /* it already holds ours and more */
            t->last_use = ++c->tail_clock;
            release_holder(c, page, host_slot);
            return CAIRN_OK;
        }
    }
    if (!slot) { /* all taken: the least recently used one goes, a live
                    session's last (lru_tail's order) */
        struct kv_tail *lru = NULL;
        for (size_t i = 0; i < c->n_tails_cap; i++) {
            struct kv_tail *t = &c->tails[i];
            bool keep_t = !c->plain_lru && t->live > 0;
            bool keep_lru = lru && !c->plain_lru && lru->live > 0;
            if (!lru || (keep_lru && !keep_t) ||
                (keep_lru == keep_t && t->last_use < lru->last_use))
                lru = t;
        }
        tail_drop(c, lru);
        slot = lru;
    }
    *slot = (struct kv_tail){.parent = parent, .ns = ns, .page = page, .slot = host_slot,
                             .n = (int32_t)n, .last_use = ++c->tail_clock,
                             .id = ++c->tail_ids, .came_from = (int8_t)came_from,
                             .tokens = slot->tokens};
    memcpy(slot->tokens, tail, n * sizeof *tail);
    c->n_tails++;
    return CAIRN_OK;
}

int cairn_kvcache_keep_tail(cairn_kvcache *c, uint64_t ns, const int32_t *tokens, size_t n_tokens,
                            int32_t page)
{
    if (!c || !tokens || page < 0)
        return CAIRN_EINVAL;
    const size_t ps = (size_t)c->L.page_size;
    const size_t n = n_tokens % ps;
    if (n == 0) {
        cairn_page_pool_release(c->dev, 1, &page);
        return CAIRN_EINVAL;
    }
    const cairn_page_hash parent = chain_hash(c, ns, tokens, n_tokens / ps);
    int rc = tail_place(c, ns, parent, tokens + (n_tokens - n), n, page, -1, -1);
    if (rc == CAIRN_OK && c->shared && c->share_policy == CAIRN_SHARE_ALL)
        kvc_tails_down(c, &parent, false, true); /* a conversation may go on elsewhere */
    return rc;
}

int kvc_tail_adopt_host(cairn_kvcache *c, uint64_t ns, cairn_page_hash parent,
                        const int32_t *tokens, size_t n, int32_t host_slot, int came_from)
{
    if (n == 0 || n >= (size_t)c->L.page_size) {
        kvc_host_release(c, host_slot);
        return CAIRN_EINVAL;
    }
    c->slot_state[host_slot] = SLOT_IDLE;
    return tail_place(c, ns, parent, tokens, n, -1, host_slot, came_from);
}

/* A live session's history that ends in a partial page ends in a tail: it
 * gives way after one-off and reused pages, like the rest of the history
 * (store.h, "live sessions"). Returns the tail's id, 0 when none holds it. */
uint64_t kvc_tail_mark_live(cairn_kvcache *c, uint64_t ns, const int32_t *tokens, size_t n_tokens)
{
    const size_t ps = (size_t)c->L.page_size;
    const size_t n = n_tokens % ps;
    if (n == 0 || c->n_tails == 0)
        return 0;
    const cairn_page_hash parent = chain_hash(c, ns, tokens, n_tokens / ps);
    /* The tail that shares the most of the partial page: a history's last
     * token was sampled, never fed, so its tail usually holds one token
     * fewer than the history. */
    struct kv_tail *best = NULL;
    size_t best_l = 0;
    for (size_t i = 0; i < c->n_tails_cap; i++) {
        struct kv_tail *t = &c->tails[i];
        if (!tail_live(t) || t->ns != ns || !cairn_page_hash_equal(t->parent, parent))
            continue;
        size_t m = (size_t)t->n < n ? (size_t)t->n : n;
        size_t l = lcp(t->tokens, tokens + (n_tokens - n), m);
        if (l == m && l > best_l) {
            best = t;
            best_l = l;
        }
    }
    if (!best)
        return 0;
    best->live++;
    best->last_use = ++c->tail_clock;
    return best->id;
}

void kvc_tail_unmark_live(cairn_kvcache *c, uint64_t id)
{
    for (size_t i = 0; id && i < c->n_tails_cap; i++)
        if (c->tails[i].id == id && tail_live(&c->tails[i])) {
            if (c->tails[i].live > 0)
                c->tails[i].live--;
            return;
        }
}

/* ---- tails in the lower tiers ------------------------------------------ *
 *
 * A tail is not a page of the tree: no read by hash can name it (its key
 * would cover tokens that do not exist yet). It goes to LMDB and Redis as a
 * page whose tokens are the tail's, padded with -1 (never a token id) to a
 * whole page, listed under its parent like any page; a read child finds it
 * by its leading tokens, and the padding stops every match at the tail's
 * end. It is never announced to routers. Written: at flush (a graceful
 * restart resumes conversations to the token), at persist (a persisted
 * session's last reply survives a SIGKILL), and, with --shared-write all,
 * to Redis as soon as it is kept (a conversation moved to another replica
 * finds its last page there). */

/* The tail's padded tokens, key, origin and bytes; false when it has no
 * place below (a sequence's first page is never listed) or its bytes
 * cannot be had. Bytes of a device page are downloaded into c->scratch. */
static bool tail_value(cairn_kvcache *c, struct kv_tail *t, int32_t *padded, cairn_page_hash *key,
                       cairn_disk_page_origin *o, const void **bytes)
{
    const size_t ps = (size_t)c->L.page_size;
    if (!tail_live(t) || cairn_page_hash_equal(t->parent, cairn_radix_ns_seed(c->tree, t->ns)))
        return false;
    memcpy(padded, t->tokens, (size_t)t->n * sizeof *padded);
    for (size_t i = (size_t)t->n; i < ps; i++)
        padded[i] = -1;
    *key = cairn_page_hash_next(t->parent, padded, ps);
    *o = (cairn_disk_page_origin){.parent = t->parent, .has_parent = true, .announce = false};
    if (t->page >= 0)
        *bytes = c->be->iface->download(c->be, c->scratch, dev_addr(c, t->page),
                                        c->L.page_bytes) == CAIRN_OK
                     ? c->scratch
                     : NULL;
    else
        *bytes = kvc_slot_settle(c, t->slot) == CAIRN_OK ? cairn_host_pool_slot(c->host, t->slot)
                                                         : NULL;
    return *bytes != NULL;
}

/* Write (disk) or share the tail; true when it was queued. */
static bool tail_down(cairn_kvcache *c, struct kv_tail *t, bool to_disk)
{
    int32_t *padded = malloc((size_t)c->L.page_size * sizeof *padded);
    cairn_page_hash key;
    cairn_disk_page_origin o;
    const void *bytes;
    bool ok = padded && tail_value(c, t, padded, &key, &o, &bytes) &&
              (to_disk ? cairn_disk_write(c->disk, key, &o, padded, bytes, COOKIE_WRITE)
                       : cairn_disk_share_page(c->disk, key, &o, padded, bytes)) == CAIRN_OK;
    free(padded);
    return ok;
}

void kvc_tails_down(cairn_kvcache *c, const cairn_page_hash *parent, bool to_disk, bool share)
{
    if (!c->disk)
        return;
    share = share && c->shared && c->share_policy != CAIRN_SHARE_NONE;
    for (size_t i = 0; i < c->n_tails_cap && c->n_tails > 0; i++) {
        struct kv_tail *t = &c->tails[i];
        if (!tail_live(t) || (parent && !cairn_page_hash_equal(t->parent, *parent)))
            continue;
        if (to_disk && !t->on_disk && tail_down(c, t, true)) {
            t->on_disk = true;
            c->stats.written_pages++;
        }
        if (share && !t->shared && tail_down(c, t, false)) {
            t->shared = true;
            c->stats.shared_pages_queued++;
        }
    }
}

/* ---- partial reuse ----------------------------------------------------- */

int cairn_kvcache_copy_page(cairn_kvcache *c, int32_t src, int32_t dst)
{
    const int32_t cap = c ? cairn_page_pool_capacity(c->dev) : 0;
    if (!c || src < 0 || dst < 0 || src >= cap || dst >= cap)
        return CAIRN_EINVAL;
    return cairn_backend_copy(c->be, dev_addr(c, dst), dev_addr(c, src), c->L.page_bytes);
}

/* Take a page for partial() while its source can neither move nor be
 * dropped: a tree child is locked, a tail is set aside from the LRU. */
static int alloc_guarded(cairn_kvcache *c, cairn_radix_node *child, struct kv_tail *tail,
                         int32_t *page)
{
    if (child)
        cairn_radix_lock(c->tree, child);
    c->tail_busy = tail;
    int rc = cairn_kvcache_alloc(c, 1, page);
    c->tail_busy = NULL;
    if (child)
        cairn_radix_unlock(c->tree, child);
    return rc;
}

/* Among the pages that continue `node` in memory (its children in the tree,
 * device or host tier, and the tails under its last page), the one sharing
 * the most leading tokens with next[0 .. limit): how many, and which. */
static size_t best_source(cairn_kvcache *c, uint64_t ns, cairn_radix_node *node,
                          const int32_t *next, size_t limit, cairn_radix_node **from_child,
                          struct kv_tail **from_tail)
{
    const bool at_root = cairn_radix_parent(node) == NULL;
    size_t best = 0;
    *from_child = NULL;
    *from_tail = NULL;
    for (size_t i = 0, nc = cairn_radix_node_n_children(node); i < nc; i++) {
        cairn_radix_node *ch = cairn_radix_node_child(node, i);
        if (at_root && cairn_radix_node_ns(ch) != ns)
            continue;
        /* by the node's tier: a DISK node's page may have a host slot that
         * a read is still filling */
        const int tier = cairn_radix_node_tier(ch);
        if (tier == CAIRN_TIER_DISK)
            continue; /* on disk only: not worth a read for < 1 page */
        cairn_radix_page *pg;
        cairn_radix_node_pages(ch, &pg);
        if (tier == CAIRN_TIER_DEVICE ? pg[0].device_page < 0 : pg[0].host_slot < 0)
            continue;
        size_t l = lcp(cairn_radix_node_tokens(ch), next, limit);
        if (l > best) {
            best = l;
            *from_child = ch;
        }
    }
    if (c->n_tails > 0) {
        cairn_page_hash parent = cairn_radix_ns_seed(c->tree, ns);
        if (!at_root) {
            cairn_radix_page *pg;
            size_t np = cairn_radix_node_pages(node, &pg);
            parent = pg[np - 1].hash;
        }
        for (size_t i = 0; i < c->n_tails_cap; i++) {
            struct kv_tail *t = &c->tails[i];
            if (!tail_live(t) || t->ns != ns || !cairn_page_hash_equal(t->parent, parent))
                continue;
            size_t l = lcp(t->tokens, next, limit < (size_t)t->n ? limit : (size_t)t->n);
            if (l > best) {
                best = l;
                *from_tail = t;
                *from_child = NULL;
            }
        }
    }
    return best;
}

size_t kvc_partial_best(cairn_kvcache *c, uint64_t ns, cairn_radix_node *node,
                        const int32_t *next, size_t limit, cairn_radix_node **child)
{
    struct kv_tail *tail;
    cairn_radix_node *ch;
    size_t best = best_source(c, ns, node, next, limit, &ch, &tail);
    if (child)
        *child = ch;
    return best;
}

int cairn_kvcache_partial(cairn_kvcache *c, uint64_t ns, cairn_kv_hold *hold, size_t n_held,
                          const int32_t *next, size_t n_next, int32_t *page, size_t *n_reused,
                          int *from_tier)
{
    if (!c || !next || !n_reused || !page)
        return CAIRN_EINVAL;
    *n_reused = 0;
    cairn_radix_node *node = hold ? hold : cairn_radix_root(c->tree);
    if (cairn_radix_node_depth(node) != n_held)
        return CAIRN_EINVAL; /* next[] must continue exactly where the hold ends */
    const size_t ps = (size_t)c->L.page_size;
    const size_t limit = n_next < ps - 1 ? n_next : ps - 1; /* a whole page is a match */
    if (limit == 0)
        return CAIRN_OK;
    cairn_radix_node *from_child = NULL; /* a tree page (device or host) */
    struct kv_tail *from_tail = NULL;
    size_t best = best_source(c, ns, node, next, limit, &from_child, &from_tail);
    if (best == 0)
        return CAIRN_OK;
    /* a page only now that there is something to put in it */
    const bool ours = *page < 0;
    int rc = ours ? alloc_guarded(c, from_child, from_tail, page) : CAIRN_OK;
    if (rc != CAIRN_OK)
        return rc;
    /* the source's records after the allocation (it may have evicted others) */
    int32_t device_page = -1, host_slot = -1;
    if (from_tail) {
        from_tail->last_use = ++c->tail_clock;
        device_page = from_tail->page;
        host_slot = from_tail->slot;
    } else {
        cairn_radix_page *pg;
        cairn_radix_node_pages(from_child, &pg);
        if (cairn_radix_node_tier(from_child) == CAIRN_TIER_DEVICE)
            device_page = pg[0].device_page;
        else
            host_slot = pg[0].host_slot;
    }
    if (device_page >= 0) {
        rc = cairn_kvcache_copy_page(c, device_page, *page);
    } else {
        double t0 = cairn_now();
        rc = kvc_page_to_device(c, *page, host_slot);
        if (rc == CAIRN_OK)
            kvc_note_upload(c, 1, cairn_now() - t0);
    }
    if (rc == CAIRN_OK) {
        *n_reused = best;
        if (from_tier)
            *from_tier = from_tail && from_tail->came_from >= 0 ? from_tail->came_from
                         : device_page >= 0                    ? CAIRN_TIER_DEVICE
                                                               : CAIRN_TIER_HOST;
        if (from_tail)
            from_tail->came_from = -1; /* from now on, it is a host page like any */
    } else if (ours) {
        cairn_page_pool_release(c->dev, 1, page);
        *page = -1;
    }
    return rc;
}
