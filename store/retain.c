/*
 * store/retain.c — holding a cached prefix for a while: the lock a client's
 * retention hint takes (session/pins.c decides how long). Apart from
 * durable.c's pin because it writes nothing through: the pages stay in the
 * tier they are in, locked, and age normally once the lock is given back.
 */
#include "store/tiers.h"
#include "store/store_impl.h"

int cairn_kvcache_hold_prefix(cairn_kvcache *c, uint64_t ns, const int32_t *tokens,
                              size_t n_pages, cairn_kv_hold **hold, size_t *n_held)
{
    if (!c || !hold || !n_held || (!tokens && n_pages))
        return CAIRN_EINVAL;
    *hold = NULL;
    *n_held = 0;
    if (n_pages == 0)
        return CAIRN_ENOTFOUND;
    /* The match splits the node the prefix ends in, so the lock covers the
     * prefix and nothing past it: what follows stays evictable. */
    cairn_radix_match_result m;
    int rc = cairn_radix_match(c->tree, ns, tokens, n_pages * (size_t)c->L.page_size, &m);
    if (rc != CAIRN_OK && rc != CAIRN_ENOMEM)
        return rc;
    if (m.n_pages == 0)
        return CAIRN_ENOTFOUND;
    if ((rc = cairn_radix_lock(c->tree, m.node)) != CAIRN_OK)
        return rc;
    *hold = m.node;
    *n_held = m.n_pages;
    return CAIRN_OK;
}
