/*
 * store/transfer.c — page copies between tier 0 (backend memory) and tier 1
 * (host slots) that run beside the model instead of in front of it.
 *
 * On a device, an evicted page is copied to its host slot by the copy
 * engine while the next forward already runs (kernels/backend.h,
 * "Transfers and fences"); a promoted page is copied up the same way, and
 * the compute queue, not the host, waits for it. What the store must add is
 * the host's half of the rule: memory a copy is still using is neither
 * read, written nor handed out again.
 *
 *     evict:    device page ──copy (fence f)──▶ host slot
 *               the page goes to drain[DEVICE] until f passes, then to the
 *               free pages; the slot, which the node now owns, carries
 *               slot_fence = f and is settled before the host reads it
 *               (a disk write, a record, the shared tier)
 *     promote:  host slot ──copy (fence g)──▶ device page
 *               the page is the node's at once (ops issued later wait for
 *               the copy on the device); the slot carries g and is given
 *               back through drain[HOST], so no disk read lands in it while
 *               the copy still reads it
 *
 * Fences pass in the order they were issued, and entries join the drain
 * lists in that order too, so reclaiming stops at the first entry whose
 * fence has not passed. On the CPU, or any backend without the transfer
 * slot, every fence is 0: pages and slots come back at once and nothing
 * here ever waits.
 *
 * A copy that failed (CAIRN_EBACKEND from its fence) leaves its host slot
 * without the page: settle reports it, and the caller treats the page as
 * lost (it is recomputed), exactly as a failed synchronous download was.
 */
#include "store/tiers.h"
#include "store/store_impl.h"

#include <stdlib.h>

int kvc_transfers_init(cairn_kvcache *c)
{
    if (!c->host)
        return CAIRN_OK;
    c->slot_fence = calloc((size_t)cairn_host_pool_capacity(c->host), sizeof *c->slot_fence);
    return c->slot_fence ? CAIRN_OK : CAIRN_ENOMEM;
}

/* Back to its pool for good: a device page, or a host slot (whose fence
 * is then forgotten). */
static void give_back(cairn_kvcache *c, int tier, int32_t id)
{
    if (tier == CAIRN_TIER_DEVICE) {
        cairn_page_pool_release(c->dev, 1, &id);
    } else {
        c->slot_fence[id] = 0;
        cairn_host_pool_release(c->host, 1, &id);
    }
}

/* Give `id` back now when `fence` has passed, else set it aside on its
 * tier's drain list (oldest first, as fences pass). */
static void release_after(cairn_kvcache *c, int tier, int32_t id, uint64_t fence)
{
    struct kv_drain *d = &c->drain[tier];
    if (fence && cairn_backend_fence_wait(c->be, fence, 0) == CAIRN_EBUSY) {
        if (d->n == d->cap) {
            size_t cap = d->cap ? d->cap * 2 : 64;
            struct kv_draining *v = realloc(d->v, cap * sizeof *v);
            if (!v) {
                cairn_backend_fence_wait(c->be, fence, 1); /* no room to wait later */
                give_back(c, tier, id);
                return;
            }
            d->v = v;
            d->cap = cap;
        }
        d->v[d->n++] = (struct kv_draining){id, fence};
        return;
    }
    give_back(c, tier, id);
}

int kvc_slot_settle(cairn_kvcache *c, int32_t slot)
{
    if (!c->slot_fence || slot < 0 || slot >= cairn_host_pool_capacity(c->host))
        return CAIRN_OK;
    uint64_t f = c->slot_fence[slot];
    if (f == 0)
        return CAIRN_OK;
    int rc = cairn_backend_fence_wait(c->be, f, 1);
    c->slot_fence[slot] = 0;
    return rc == CAIRN_OK ? CAIRN_OK : CAIRN_EBACKEND;
}

int kvc_move_to_host(cairn_kvcache *c, int32_t host_slot, int32_t device_page)
{
    uint64_t fence = 0;
    int rc = cairn_backend_transfer(c->be, cairn_host_pool_slot(c->host, host_slot),
                                    dev_addr(c, device_page), c->L.page_bytes, 1, &fence);
    if (rc != CAIRN_OK)
        return rc;
    c->slot_fence[host_slot] = fence;
    release_after(c, CAIRN_TIER_DEVICE, device_page, fence);
    return CAIRN_OK;
}

int kvc_page_to_device(cairn_kvcache *c, int32_t device_page, int32_t host_slot)
{
    /* The slot may itself still be arriving from the device (evicted and
     * promoted again before its copy ended): the copy queue keeps the two in
     * order, so there is nothing to wait for here. */
    uint64_t fence = 0;
    int rc = cairn_backend_transfer(c->be, dev_addr(c, device_page),
                                    cairn_host_pool_slot(c->host, host_slot), c->L.page_bytes, 0,
                                    &fence);
    if (rc == CAIRN_OK && fence > c->slot_fence[host_slot])
        c->slot_fence[host_slot] = fence;
    return rc;
}

void kvc_host_release(cairn_kvcache *c, int32_t slot)
{
    if (slot < 0)
        return;
    if (!c->slot_fence) { /* after kvc_transfers_finish: nothing in flight */
        cairn_host_pool_release(c->host, 1, &slot);
        return;
    }
    release_after(c, CAIRN_TIER_HOST, slot, c->slot_fence[slot]);
}

size_t kvc_reclaim(cairn_kvcache *c, int tier, bool block)
{
    struct kv_drain *d = &c->drain[tier];
    size_t k = 0;
    /* passed, or failed: either way the copy no longer uses the page or slot */
    while (k < d->n &&
           cairn_backend_fence_wait(c->be, d->v[k].fence, block && k == 0) != CAIRN_EBUSY)
        give_back(c, tier, d->v[k++].id);
    if (k > 0) {
        for (size_t i = k; i < d->n; i++)
            d->v[i - k] = d->v[i];
        d->n -= k;
    }
    return k;
}

void kvc_transfers_finish(cairn_kvcache *c)
{
    for (int tier = CAIRN_TIER_DEVICE; tier <= CAIRN_TIER_HOST; tier++) {
        while (c->drain[tier].n)
            kvc_reclaim(c, tier, true);
        free(c->drain[tier].v);
        c->drain[tier] = (struct kv_drain){0};
    }
    if (c->slot_fence && c->host)
        for (int32_t s = 0; s < cairn_host_pool_capacity(c->host); s++)
            kvc_slot_settle(c, s);
    free(c->slot_fence);
    c->slot_fence = NULL;
}
