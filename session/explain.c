/*
 * session/explain.c — why a prompt was (partly) recomputed: the engine's
 * side of cairn_cache_miss (session.h), from the cache's closest-sequence
 * query (store.h, "explaining a miss"). Runs on the engine thread, at a
 * job's first admission and for CAIRN_REQ_CACHE_EXPLAIN; it only reads.
 */
#include "session/session_impl.h"

const char *cairn_miss_reason_name(cairn_miss_reason r)
{
    switch (r) {
    case CAIRN_MISS_NEW_CONTENT: return "new_content";
    case CAIRN_MISS_HISTORY_REWRITTEN: return "history_rewritten";
    case CAIRN_MISS_SYSTEM_CHANGED: return "system_changed";
    case CAIRN_MISS_TOOLS_CHANGED: return "tools_changed";
    case CAIRN_MISS_EVICTED: return "evicted";
    case CAIRN_MISS_IN_FLIGHT: return "in_flight";
    case CAIRN_MISS_OTHER_TENANT: return "other_tenant_only";
    case CAIRN_MISS_NO_CACHE: return "no_cache";
    case CAIRN_MISS_DEPARTED: return "new_content";
    default: return NULL;
    }
}

void svc_explain(cairn_service *s, uint64_t tenant, const int32_t *prompt, size_t n_prompt,
                 int64_t cached, bool waited, cairn_cache_miss *out)
{
    *out = (cairn_cache_miss){.tier = -1, .evicted_tier = -1};
    const bool run = cached >= 0;
    if (!s->prefix_cache || n_prompt < 2)
        return;
    /* the last token is always computed (for its logits): the lookup, like
     * the fetch, is over the tokens before it */
    const size_t n = n_prompt - 1, ps = (size_t)s->page_size;
    cairn_kv_explain x;
    if (cairn_kvcache_explain(s->cache, tenant, prompt, n, &x) != CAIRN_OK)
        return;
    out->known = true;
    out->departure = (int64_t)x.common_tokens;
    out->closest_tokens = (int64_t)x.sequence_tokens;
    out->tier = x.tier;
    for (size_t i = x.common_tokens; i < n_prompt && out->n_prompt_next < CAIRN_MISS_EXCERPT; i++)
        out->prompt_next[out->n_prompt_next++] = prompt[i];
    for (size_t i = 0; i < x.n_cached_next && i < CAIRN_MISS_EXCERPT; i++)
        out->cached_next[out->n_cached_next++] = x.cached_next[i];
    if (cached < 0) /* explain: what a run would take from the tree */
        cached = (int64_t)(x.whole_pages * ps);
    const size_t full = n / ps * ps; /* all a lookup can find in whole pages */
    if (waited)
        out->reason = CAIRN_MISS_IN_FLIGHT;
    else if ((size_t)cached >= full)
        out->reason = CAIRN_MISS_NONE;
    else if (x.evicted_tier >= 0) { /* even when nothing else of the tenant's is left */
        out->reason = CAIRN_MISS_EVICTED;
        out->evicted_tier = x.evicted_tier;
    } else if (!x.ns_cached)
        out->reason = x.pages_elsewhere > 0 ? CAIRN_MISS_OTHER_TENANT : CAIRN_MISS_NO_CACHE;
    else if ((size_t)cached < x.whole_pages * ps) {
        /* cached in a slower tier, not loaded: recomputing was cheaper */
        out->reason = CAIRN_MISS_EVICTED;
        out->evicted_tier = CAIRN_TIER_DEVICE;
    } else if (x.pages_elsewhere > x.whole_pages)
        out->reason = CAIRN_MISS_OTHER_TENANT;
    else if (x.contained)
        out->reason = CAIRN_MISS_NEW_CONTENT;
    else
        out->reason = CAIRN_MISS_DEPARTED;
    if (run && out->reason != CAIRN_MISS_NONE)
        s->stats.misses[out->reason]++;
}
