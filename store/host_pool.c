/*
 * store/host_pool.c — tier 1: page-sized slots in host RAM, one allocation,
 * handed out by id from a free stack (the same discipline as the tier-0
 * pool, so accounting is exact: available + taken == capacity).
 */
#include "store/tiers.h"
#include "store/store_impl.h"

#include <stdlib.h>
#include <string.h>

struct cairn_host_pool {
    uint8_t *base; /* capacity * page_bytes, 64-byte aligned */
    cairn_backend *be; /* NULL: base is aligned_alloc's */
    size_t page_bytes;
    id_stack ids;
};

int cairn_host_pool_create(cairn_backend *be, size_t page_bytes, size_t budget_bytes,
                           cairn_host_pool **out)
{
    if (!out || page_bytes == 0)
        return CAIRN_EINVAL;
    size_t n = budget_bytes / page_bytes;
    if (n == 0 || n > INT32_MAX)
        return CAIRN_EINVAL;
    cairn_host_pool *p = calloc(1, sizeof *p);
    if (!p)
        return CAIRN_ENOMEM;
    size_t bytes = (n * page_bytes + 63) / 64 * 64;
    void *mem = NULL;
    if (be && cairn_backend_host_alloc(be, bytes, &mem) == CAIRN_OK) {
        p->be = be;
    } else {
        if (be)
            cairn_log(CAIRN_LOG_WARN,
                      "host page pool: %s cannot give %zu MiB of transfer memory; using plain "
                      "memory (page copies to and from the device will be staged)",
                      be->iface->name, bytes >> 20);
        mem = aligned_alloc(64, bytes);
    }
    p->base = mem;
    if (!p->base || id_stack_init(&p->ids, (int32_t)n) != CAIRN_OK) {
        cairn_host_pool_free(p);
        return CAIRN_ENOMEM;
    }
    p->page_bytes = page_bytes;
    *out = p;
    return CAIRN_OK;
}

void cairn_host_pool_free(cairn_host_pool *p)
{
    if (!p)
        return;
    if (p->be)
        cairn_backend_host_free(p->be, p->base);
    else
        free(p->base);
    id_stack_free(&p->ids);
    free(p);
}

void *cairn_host_pool_slot(const cairn_host_pool *p, int32_t slot)
{
    if (!p || slot < 0 || slot >= p->ids.capacity)
        return NULL;
    return p->base + (size_t)slot * p->page_bytes;
}

int32_t cairn_host_pool_capacity(const cairn_host_pool *p) { return p ? p->ids.capacity : 0; }
int32_t cairn_host_pool_available(const cairn_host_pool *p) { return p ? p->ids.n_free : 0; }

int cairn_host_pool_alloc(cairn_host_pool *p, int32_t n, int32_t *slots)
{
    if (!p)
        return CAIRN_EINVAL;
    return id_stack_take(&p->ids, n, slots);
}

void cairn_host_pool_release(cairn_host_pool *p, int32_t n, const int32_t *slots)
{
    if (p)
        id_stack_give(&p->ids, n, slots, "host pool");
}
