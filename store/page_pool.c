/*
 * store/page_pool.c — tier 0: fixed-size KV pages carved from one backend
 * allocation, handed out by id from a free stack.
 */
#include "store/store.h"

#include <stdlib.h>

struct cairn_page_pool {
    cairn_backend *be;
    cairn_kv_layout layout;
    void *base;        /* backend memory, capacity * page_bytes            */
    int32_t capacity;
    int32_t n_free;
    int32_t *free_ids; /* stack of free page ids; top is free_ids[n_free-1] */
    uint8_t *in_use;   /* [capacity] guards against double release         */
};

int cairn_page_pool_create(cairn_backend *be, const cairn_kv_layout *L, size_t budget_bytes,
                           cairn_page_pool **out)
{
    if (!be || !L || !out || L->page_bytes == 0)
        return CAIRN_EINVAL;
    size_t n = budget_bytes / L->page_bytes;
    if (n == 0 || n > INT32_MAX)
        return CAIRN_EINVAL;
    cairn_page_pool *p = calloc(1, sizeof *p);
    if (!p)
        return CAIRN_ENOMEM;
    p->be = be;
    p->layout = *L;
    p->capacity = (int32_t)n;
    p->free_ids = malloc(n * sizeof *p->free_ids);
    p->in_use = calloc(n, 1);
    int rc = (p->free_ids && p->in_use) ? be->iface->alloc(be, n * L->page_bytes, &p->base)
                                        : CAIRN_ENOMEM;
    if (rc != CAIRN_OK) {
        free(p->free_ids);
        free(p->in_use);
        free(p);
        return rc;
    }
    /* Lowest ids on top, so a fresh pool hands out 0, 1, 2, ... */
    for (int32_t i = 0; i < p->capacity; i++)
        p->free_ids[i] = p->capacity - 1 - i;
    p->n_free = p->capacity;
    *out = p;
    return CAIRN_OK;
}

void cairn_page_pool_free(cairn_page_pool *p)
{
    if (!p)
        return;
    p->be->iface->free(p->be, p->base);
    free(p->free_ids);
    free(p->in_use);
    free(p);
}

void *cairn_page_pool_base(const cairn_page_pool *p) { return p->base; }
const cairn_kv_layout *cairn_page_pool_layout(const cairn_page_pool *p) { return &p->layout; }
int32_t cairn_page_pool_capacity(const cairn_page_pool *p) { return p->capacity; }
int32_t cairn_page_pool_available(const cairn_page_pool *p) { return p->n_free; }

int cairn_page_pool_alloc(cairn_page_pool *p, int32_t n, int32_t *pages)
{
    if (!p || n < 0 || (n > 0 && !pages))
        return CAIRN_EINVAL;
    if (n > p->n_free)
        return CAIRN_EFULL;
    for (int32_t i = 0; i < n; i++) {
        int32_t id = p->free_ids[--p->n_free];
        p->in_use[id] = 1;
        pages[i] = id;
    }
    return CAIRN_OK;
}

void cairn_page_pool_release(cairn_page_pool *p, int32_t n, const int32_t *pages)
{
    for (int32_t i = 0; i < n; i++) {
        int32_t id = pages[i];
        /* Releasing a page twice or one that is not ours is a broken
         * invariant in the caller; ignore it rather than corrupt the stack. */
        if (id < 0 || id >= p->capacity || !p->in_use[id]) {
            cairn_log(CAIRN_LOG_ERROR, "page pool: release of page %d that is not in use", id);
            continue;
        }
        p->in_use[id] = 0;
        p->free_ids[p->n_free++] = id;
    }
}
