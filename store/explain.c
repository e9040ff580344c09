/*
 * store/explain.c — why a prompt was not (all) cached: the closest cached
 * sequence, pages that eviction dropped recently, other namespaces (store.h,
 * "explaining a miss"). Nothing here changes the tree or the tiers.
 */
#include "store/store_impl.h"

#include <string.h>

static size_t gone_slot(cairn_page_hash h) { return (size_t)(h.lo & (CAIRN_KV_GONE_SLOTS - 1)); }

void kvc_note_gone(cairn_kvcache *c, cairn_radix_node *node, int tier)
{
    cairn_radix_page *pg;
    size_t np = cairn_radix_node_pages(node, &pg);
    for (size_t i = 0; i < np; i++) {
        /* a page whose copy stays in LMDB is found again by hash: not lost */
        if (pg[i].on_disk && !(pg[i].flags & PAGE_LOST))
            continue;
        struct kv_gone *g = &c->gone[gone_slot(pg[i].hash)];
        g->hash = pg[i].hash;
        g->tier_plus_one = (int8_t)(tier + 1);
    }
}

int cairn_kvcache_explain(const cairn_kvcache *c, uint64_t ns, const int32_t *tokens,
                          size_t n_tokens, cairn_kv_explain *out)
{
    if (!c || !out || (!tokens && n_tokens))
        return CAIRN_EINVAL;
    *out = (cairn_kv_explain){.tier = -1, .evicted_tier = -1};
    cairn_radix_common x;
    int rc = cairn_radix_common_prefix(c->tree, ns, tokens, n_tokens, &x);
    if (rc)
        return rc;
    out->common_tokens = x.common_tokens;
    out->whole_pages = x.whole_pages;
    out->sequence_tokens = x.sequence_tokens;
    out->contained = x.contained;
    out->tier = x.tier;
    out->ns_cached = x.ns_cached;
    out->n_cached_next = x.n_cached_next < CAIRN_KV_EXCERPT ? x.n_cached_next : CAIRN_KV_EXCERPT;
    if (out->n_cached_next)
        memcpy(out->cached_next, x.cached_next, out->n_cached_next * sizeof *x.cached_next);
    const size_t ps = (size_t)c->L.page_size;
    if ((x.whole_pages + 1) * ps <= n_tokens) {
        /* the page after the match, named as the tree would name it */
        cairn_page_hash next = cairn_page_hash_next(x.last_hash, tokens + x.whole_pages * ps, ps);
        const struct kv_gone *g = &c->gone[gone_slot(next)];
        if (g->tier_plus_one && cairn_page_hash_equal(g->hash, next))
            out->evicted_tier = g->tier_plus_one - 1;
    }
    out->pages_elsewhere = cairn_radix_pages_elsewhere(c->tree, ns, tokens, n_tokens);
    return CAIRN_OK;
}
