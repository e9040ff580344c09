/*
 * store/durable.c — what makes pages and records outlive the process, and
 * what takes pages out of the tree on request: pin / unpin (write-through),
 * persist, flush (write-back at shutdown), durable records, forget and
 * read_page. Apart from kvcache.c because these are the disk-facing calls a
 * session makes, each answered by a pending op that promote.c completes.
 */
#include "store/tiers.h"
#include "store/store_impl.h"

#include <stdlib.h>
#include <string.h>

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
        const void *bytes = kvc_page_bytes(c, tier, &pg[j]);
        if (!bytes || kvc_write_page(c, node, j, tok + j * ps, bytes) != CAIRN_OK) {
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
    rc = kvc_path_nodes(c, node, &n_nodes);
    if (rc)
        return rc;
    /* Write-through: every resident page of the pinned prefix goes to disk
     * now, so it survives eviction and restarts. */
    for (size_t i = 0; i < n_nodes; i++)
        write_through_node(c, c->nodes[i], NULL);
    kvc_share_path(c, node, NULL);
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
    int rc = kvc_path_nodes(c, node, &n_nodes);
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
    kvc_share_path(c, node, NULL); /* where the session goes if this replica dies */
    /* ... with its last reply's partly filled page, when it ends in one */
    if (cairn_radix_parent(node)) {
        cairn_radix_page *pg;
        size_t np = cairn_radix_node_pages(node, &pg);
        kvc_tails_down(c, &pg[np - 1].hash, true, true);
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
    kvc_tails_down(c, NULL, true, false); /* conversations resume to the token */
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
        kvc_drain_disk(c);
        size_t idx;
        pending_op *op = kvc_find_op(c, id, &idx);
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
    return cairn_radix_drop(c->tree, x, keep_pages - start, kvc_release_page, c);
}

int cairn_kvcache_read_page(cairn_kvcache *c, const cairn_radix_page *page, void *dst)
{
    if (!c || !page || !dst)
        return CAIRN_EINVAL;
    if (page->device_page >= 0)
        return c->be->iface->download(c->be, dst, dev_addr(c, page->device_page), c->L.page_bytes);
    if (page->host_slot >= 0 && c->slot_state[page->host_slot] == SLOT_IDLE) {
        if (kvc_slot_settle(c, page->host_slot) != CAIRN_OK)
            return CAIRN_EBACKEND;
        memcpy(dst, cairn_host_pool_slot(c->host, page->host_slot), c->L.page_bytes);
        return CAIRN_OK;
    }
    return CAIRN_ENOTFOUND;
}
