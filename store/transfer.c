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
 *               the page goes to drain_dev until f passes, then to the
 *               free pages; the slot, which the node now owns, carries
 *               slot_fence = f and is settled before the host reads it
 *               (a disk write, a record, the shared tier)
 *     promote:  host slot ──copy (fence g)──▶ device page
 *               the page is the node's at once (ops issued later wait for
 *               the copy on the device); the slot carries g and is given
 *               back through drain_host, so no disk read lands in it while
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
#include "store/store.h"
#include "store/store_impl.h"

#include <stdlib.h>

int kvc_transfers_init(cairn_kvcache *c)
{
    if (!c->host)
        return CAIRN_OK;
    c->slot_fence = calloc((size_t)cairn_host_pool_capacity(c->host), sizeof *c->slot_fence);
    return c->slot_fence ? CAIRN_OK : CAIRN_ENOMEM;
}

static int push_draining(struct kv_draining **list, size_t *n, size_t *cap, int32_t id,
                         uint64_t fence)
{
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        struct kv_draining *l = realloc(*list, nc * sizeof *l);
        if (!l)
            return CAIRN_ENOMEM;
        *list = l;
        *cap = nc;
    }
    (*list)[(*n)++] = (struct kv_draining){id, fence};
    return CAIRN_OK;
}

/* The first k entries have passed: drop them from the front. */
static void pop_front(struct kv_draining *list, size_t *n, size_t k)
{
    if (k == 0)
        return;
    for (size_t i = k; i < *n; i++)
        list[i - k] = list[i];
    *n -= k;
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

int kvc_page_to_host(cairn_kvcache *c, int32_t host_slot, int32_t device_page)
{
    uint64_t fence = 0;
    int rc = cairn_backend_transfer(c->be, cairn_host_pool_slot(c->host, host_slot),
                                    dev_addr(c, device_page), c->L.page_bytes, 1, &fence);
    if (rc == CAIRN_OK)
        c->slot_fence[host_slot] = fence;
    return rc;
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
    uint64_t f = c->slot_fence ? c->slot_fence[slot] : 0;
    if (f && cairn_backend_fence_wait(c->be, f, 0) == CAIRN_EBUSY) {
        if (push_draining(&c->drain_host, &c->n_drain_host, &c->cap_drain_host, slot, f) ==
            CAIRN_OK)
            return;
        cairn_backend_fence_wait(c->be, f, 1); /* no room to wait later: wait now */
    }
    if (c->slot_fence)
        c->slot_fence[slot] = 0;
    cairn_host_pool_release(c->host, 1, &slot);
}

void kvc_device_release_after(cairn_kvcache *c, int32_t page, uint64_t fence)
{
    if (page < 0)
        return;
    if (fence && cairn_backend_fence_wait(c->be, fence, 0) == CAIRN_EBUSY) {
        if (push_draining(&c->drain_dev, &c->n_drain_dev, &c->cap_drain_dev, page, fence) ==
            CAIRN_OK)
            return;
        cairn_backend_fence_wait(c->be, fence, 1);
    }
    cairn_page_pool_release(c->dev, 1, &page);
}

size_t kvc_reclaim_device(cairn_kvcache *c, bool block)
{
    size_t k = 0;
    while (k < c->n_drain_dev) {
        int rc = cairn_backend_fence_wait(c->be, c->drain_dev[k].fence, block && k == 0);
        if (rc == CAIRN_EBUSY)
            break;
        /* passed, or failed: either way the copy no longer reads the page */
        cairn_page_pool_release(c->dev, 1, &c->drain_dev[k].id);
        k++;
    }
    pop_front(c->drain_dev, &c->n_drain_dev, k);
    return k;
}

size_t kvc_reclaim_host(cairn_kvcache *c, bool block)
{
    size_t k = 0;
    while (k < c->n_drain_host) {
        int rc = cairn_backend_fence_wait(c->be, c->drain_host[k].fence, block && k == 0);
        if (rc == CAIRN_EBUSY)
            break;
        int32_t slot = c->drain_host[k].id;
        c->slot_fence[slot] = 0;
        cairn_host_pool_release(c->host, 1, &slot);
        k++;
    }
    pop_front(c->drain_host, &c->n_drain_host, k);
    return k;
}

void kvc_transfers_finish(cairn_kvcache *c)
{
    while (c->n_drain_dev)
        kvc_reclaim_device(c, true);
    while (c->n_drain_host)
        kvc_reclaim_host(c, true);
    if (c->slot_fence && c->host)
        for (int32_t s = 0; s < cairn_host_pool_capacity(c->host); s++)
            kvc_slot_settle(c, s);
    free(c->drain_dev);
    free(c->drain_host);
    free(c->slot_fence);
    c->drain_dev = c->drain_host = NULL;
    c->slot_fence = NULL;
    c->n_drain_dev = c->n_drain_host = 0;
}
