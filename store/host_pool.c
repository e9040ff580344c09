/*
 * store/host_pool.c — tier 1: page-sized slots in host RAM, one allocation,
 * handed out by id from a free stack (the same discipline as the tier-0
 * pool, so accounting is exact: available + taken == capacity).
 */
#include "store/store.h"

#include <stdlib.h>
#include <string.h>

struct cairn_host_pool {
    uint8_t *base;     /* capacity * page_bytes, 64-byte aligned */
    size_t page_bytes;
    int32_t capacity;
    int32_t n_free;
    int32_t *free_ids; /* stack; top is free_ids[n_free-1]        */
    uint8_t *in_use;   /* [capacity]                              */
};

int cairn_host_pool_create(size_t page_bytes, size_t budget_bytes, cairn_host_pool **out)
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
    p->base = aligned_alloc(64, bytes);
    p->free_ids = malloc(n * sizeof *p->free_ids);
    p->in_use = calloc(n, 1);
    if (!p->base || !p->free_ids || !p->in_use) {
        cairn_host_pool_free(p);
        return CAIRN_ENOMEM;
    }
    p->page_bytes = page_bytes;
    p->capacity = (int32_t)n;
    for (int32_t i = 0; i < p->capacity; i++)
        p->free_ids[i] = p->capacity - 1 - i;
    p->n_free = p->capacity;
    *out = p;
    return CAIRN_OK;
}

void cairn_host_pool_free(cairn_host_pool *p)
{
    if (!p)
        return;
    free(p->base);
    free(p->free_ids);
    free(p->in_use);
    free(p);
}

void *cairn_host_pool_slot(const cairn_host_pool *p, int32_t slot)
{
    if (!p || slot < 0 || slot >= p->capacity)
        return NULL;
    return p->base + (size_t)slot * p->page_bytes;
}

int32_t cairn_host_pool_capacity(const cairn_host_pool *p) { return p ? p->capacity : 0; }
int32_t cairn_host_pool_available(const cairn_host_pool *p) { return p ? p->n_free : 0; }

int cairn_host_pool_alloc(cairn_host_pool *p, int32_t n, int32_t *slots)
{
    if (!p || n < 0 || (n > 0 && !slots))
        return CAIRN_EINVAL;
    if (n > p->n_free)
        return CAIRN_EFULL;
    for (int32_t i = 0; i < n; i++) {
        int32_t id = p->free_ids[--p->n_free];
        p->in_use[id] = 1;
        slots[i] = id;
    }
    return CAIRN_OK;
}

void cairn_host_pool_release(cairn_host_pool *p, int32_t n, const int32_t *slots)
{
    if (!p || !slots)
        return;
    for (int32_t i = 0; i < n; i++) {
        int32_t id = slots[i];
        if (id < 0 || id >= p->capacity || !p->in_use[id]) {
            cairn_log(CAIRN_LOG_ERROR, "host pool: release of slot %d that is not taken", id);
            continue;
        }
        p->in_use[id] = 0;
        p->free_ids[p->n_free++] = id;
    }
}
