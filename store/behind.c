/*
 * store/behind.c — write-behind: the pages of prefixes that were reused go
 * to LMDB in the background, so that a SIGKILL keeps what was worth keeping
 * (store.h, "Write-behind", says what and why; the bounds are below).
 *
 * Which prefixes. The rule the shared tier already uses (shared.c): a
 * prefix is worth keeping once it was seen twice, i.e. when a fetch found
 * its pages cached in memory. A one-off prompt is never written here (it
 * reaches LMDB only if it is evicted from host RAM, or at flush).
 *
 * How. kvc_behind_note (from the fetch's completion) copies the prefix's
 * namespace and tokens into a FIFO -- not node handles or page records,
 * which eviction, splits and drops invalidate. kvc_behind_step (from every
 * poll, on the engine thread, which owns the tree) walks the oldest entry's
 * path down the tree read-only (no split, no LRU touch: write-behind must
 * not change what is evicted next), and for each page that is in tier 0 or
 * 1 and not on disk yet copies it into a disk write request
 * (cairn_disk_write copies and checksums it), within the bounds. The disk's
 * own I/O thread commits the requests, many to a transaction; the page's
 * value carries its namespace, tokens and checksum, which every read
 * verifies, and a transaction is all or nothing, so a kill in the middle of
 * a write leaves the page absent, never half there. Pages that left memory
 * meanwhile were written back by eviction (on_disk) or are gone: either
 * way there is nothing left to do for them.
 */
#include "store/tiers.h"
#include "store/store_impl.h"

#include <stdlib.h>
#include <string.h>

/* Bytes the engine thread copies for write-behind per poll (at least one
 * page): a page costs a download (a memcpy on the CPU backend), a copy into
 * the request and a checksum, all before the next forward step. 1 MiB is
 * well under a millisecond of memory traffic, next to forward steps of
 * tens of milliseconds. */
#define BEHIND_STEP_BYTES ((size_t)1 << 20)
/* Write-behind bytes queued on the disk and not committed yet. The disk's
 * FIFO is shared with promotion and fetch reads, which wait behind every
 * write queued before them: 4 MiB is ~20 ms at the cost model's prior disk
 * rate (200 MB/s), and a few LMDB transactions' worth. */
#define BEHIND_INFLIGHT_BYTES ((size_t)4 << 20)
/* Prefixes waiting at most (their tokens are copied). */
#define BEHIND_ENTRIES 64

static size_t pages_of(const cairn_kvcache *c, size_t bytes)
{
    size_t n = bytes / c->L.page_bytes;
    return n > 0 ? n : 1;
}

static bool prefix_of(const int32_t *a, size_t na, const int32_t *b, size_t nb, size_t ps)
{
    return na <= nb && memcmp(a, b, na * ps * sizeof *a) == 0;
}

void kvc_behind_note(cairn_kvcache *c, cairn_radix_node *node, cairn_radix_node *child)
{
    if (!c->write_behind || !c->disk || !node || !cairn_radix_parent(node))
        return;
    size_t path_pages = cairn_radix_node_depth(node);
    size_t depth = path_pages + (child ? 1 : 0);
    size_t got = 0;
    if (kvc_path_reserve(c, path_pages) != CAIRN_OK ||
        cairn_radix_path(node, c->path, path_pages, &got) != CAIRN_OK)
        return;
    bool any = false;
    for (size_t i = 0; i < got && !any; i++)
        any = !c->path[i]->on_disk;
    cairn_radix_page *child_pg = NULL;
    if (child)
        cairn_radix_node_pages(child, &child_pg);
    if (child_pg && !child_pg[0].on_disk && cairn_radix_node_tier(child) != CAIRN_TIER_DISK)
        any = true;
    if (!any)
        return; /* all on disk already: a hot prefix costs one walk */
    size_t n_nodes;
    if (kvc_path_nodes(c, node, &n_nodes) != CAIRN_OK)
        return;
    size_t ps = (size_t)c->L.page_size;
    uint64_t ns = cairn_radix_node_ns(node);
    int32_t *tokens = malloc(depth * ps * sizeof *tokens);
    if (!tokens)
        return;
    size_t at = 0;
    for (size_t i = 0; i < n_nodes; i++) {
        size_t np = cairn_radix_node_pages(c->nodes[i], NULL);
        memcpy(tokens + at * ps, cairn_radix_node_tokens(c->nodes[i]), np * ps * sizeof *tokens);
        at += np;
    }
    if (child) /* its first page: where the next request's match ends */
        memcpy(tokens + at * ps, cairn_radix_node_tokens(child), ps * sizeof *tokens);
    /* One entry per path: a waiting prefix of this one grows into it; one
     * this is a prefix of covers it already. */
    for (size_t i = 0; i < c->n_behind; i++) {
        struct kv_behind *e = &c->behind[i];
        if (e->ns != ns)
            continue;
        if (prefix_of(tokens, depth, e->tokens, e->n_pages, ps)) {
            free(tokens);
            return;
        }
        if (prefix_of(e->tokens, e->n_pages, tokens, depth, ps)) {
            free(e->tokens);
            e->tokens = tokens;
            e->n_pages = depth;
            return;
        }
    }
    if (!c->behind) {
        c->behind = malloc(BEHIND_ENTRIES * sizeof *c->behind);
        if (!c->behind) {
            free(tokens);
            return;
        }
    }
    if (c->n_behind == BEHIND_ENTRIES) {
        c->stats.behind_dropped++;
        free(tokens);
        return;
    }
    c->behind[c->n_behind++] = (struct kv_behind){.ns = ns, .tokens = tokens, .n_pages = depth};
}

/* The child of x in namespace ns whose first page is tokens[0 .. ps). */
static cairn_radix_node *child_for(cairn_radix_node *x, uint64_t ns, const int32_t *tokens,
                                   size_t ps)
{
    size_t n = cairn_radix_node_n_children(x);
    for (size_t i = 0; i < n; i++) {
        cairn_radix_node *ch = cairn_radix_node_child(x, i);
        if (ch && cairn_radix_node_ns(ch) == ns &&
            memcmp(cairn_radix_node_tokens(ch), tokens, ps * sizeof *tokens) == 0)
            return ch;
    }
    return NULL;
}

/* Queue writes for the entry's pages, at most *left of them. True when the
 * entry is done (every page of its path still in the tree is on disk or
 * queued, or not resident); false when the budget ran out first. */
static bool write_entry(cairn_kvcache *c, const struct kv_behind *e, size_t *left)
{
    size_t ps = (size_t)c->L.page_size;
    cairn_radix_node *x = cairn_radix_root(c->tree);
    size_t pos = 0;
    while (pos < e->n_pages) {
        cairn_radix_node *next = child_for(x, e->ns, e->tokens + pos * ps, ps);
        if (!next)
            return true; /* the rest of the path left the tree */
        cairn_radix_page *pg;
        size_t np = cairn_radix_node_pages(next, &pg);
        const int32_t *tok = cairn_radix_node_tokens(next);
        int tier = cairn_radix_node_tier(next);
        for (size_t j = 0; j < np; j++, pos++) {
            if (pos == e->n_pages)
                return true; /* the prefix ends inside this node */
            if (j > 0 && memcmp(tok + j * ps, e->tokens + pos * ps, ps * sizeof *tok) != 0)
                return true; /* the path goes elsewhere from here */
            if (pg[j].on_disk || tier == CAIRN_TIER_DISK)
                continue; /* there already, or only there (and then lost) */
            if (*left == 0)
                return false;
            const void *bytes = kvc_page_bytes(c, tier, &pg[j]);
            if (!bytes)
                continue; /* a failed download: eviction writes it back */
            cairn_disk_page_origin origin = kvc_page_origin(c, next, j);
            if (cairn_disk_write(c->disk, pg[j].hash, &origin, tok + j * ps, bytes,
                                 COOKIE_WRITE | BEHIND_WRITE) != CAIRN_OK)
                continue;
            pg[j].on_disk = 1;
            pg[j].flags &= (uint8_t)~PAGE_LOST;
            c->stats.written_pages++;
            c->stats.behind_queued_pages++;
            c->behind_inflight++;
            (*left)--;
        }
        x = next;
    }
    return true;
}

void kvc_behind_step(cairn_kvcache *c)
{
    if (!c->n_behind || !c->disk)
        return;
    size_t inflight_max = pages_of(c, BEHIND_INFLIGHT_BYTES);
    if (c->behind_inflight >= inflight_max)
        return;
    double t0 = cairn_now();
    size_t left = pages_of(c, BEHIND_STEP_BYTES);
    if (left > inflight_max - c->behind_inflight)
        left = inflight_max - c->behind_inflight;
    size_t done = 0;
    while (done < c->n_behind && left > 0 && write_entry(c, &c->behind[done], &left))
        free(c->behind[done++].tokens);
    /* An entry that ran out of budget may be done all the same: the next
     * step finds nothing to write and drops it. */
    if (done) {
        memmove(c->behind, c->behind + done, (c->n_behind - done) * sizeof *c->behind);
        c->n_behind -= done;
    }
    c->stats.behind_seconds += cairn_now() - t0;
}

void kvc_behind_done(cairn_kvcache *c, int status)
{
    if (c->behind_inflight)
        c->behind_inflight--;
    if (status == CAIRN_OK)
        c->stats.behind_pages++;
}

void kvc_behind_free(cairn_kvcache *c)
{
    for (size_t i = 0; i < c->n_behind; i++)
        free(c->behind[i].tokens);
    free(c->behind);
    c->behind = NULL;
    c->n_behind = 0;
}

bool cairn_kvcache_busy(const cairn_kvcache *c)
{
    return c && (c->n_behind > 0 || c->behind_inflight > 0);
}
