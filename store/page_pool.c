/*
 * store/page_pool.c — tier 0: fixed-size KV pages carved from one backend
 * allocation, handed out by id from a free stack; and that stack, which the
 * host pool (tier 1) uses too.
 */
#include "store/tiers.h"
#include "store/store_impl.h"

#include <stdlib.h>

/* ---- the free-id stack ---------------------------------------------------- */

int id_stack_init(id_stack *s, int32_t capacity)
{
    s->capacity = capacity;
    s->free_ids = malloc((size_t)capacity * sizeof *s->free_ids);
    s->in_use = calloc((size_t)capacity, 1);
    if (!s->free_ids || !s->in_use) {
        id_stack_free(s);
        return CAIRN_ENOMEM;
    }
    /* Lowest ids on top, so a fresh pool hands out 0, 1, 2, ... */
    for (int32_t i = 0; i < capacity; i++)
        s->free_ids[i] = capacity - 1 - i;
    s->n_free = capacity;
    return CAIRN_OK;
}

void id_stack_free(id_stack *s)
{
    free(s->free_ids);
    free(s->in_use);
    s->free_ids = NULL;
    s->in_use = NULL;
    s->n_free = s->capacity = 0;
}

int id_stack_take(id_stack *s, int32_t n, int32_t *ids)
{
    if (n < 0 || (n > 0 && !ids))
        return CAIRN_EINVAL;
    if (n > s->n_free)
        return CAIRN_EFULL;
    for (int32_t i = 0; i < n; i++) {
        int32_t id = s->free_ids[--s->n_free];
        s->in_use[id] = 1;
        ids[i] = id;
    }
    return CAIRN_OK;
}

void id_stack_give(id_stack *s, int32_t n, const int32_t *ids, const char *what)
{
    if (!ids)
        return;
    for (int32_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        /* Releasing an id twice or one that is not ours is a broken
         * invariant in the caller; ignore it rather than corrupt the stack. */
        if (id < 0 || id >= s->capacity || !s->in_use[id]) {
            cairn_log(CAIRN_LOG_ERROR, "%s: release of id %d that is not taken", what, id);
            continue;
        }
        s->in_use[id] = 0;
        s->free_ids[s->n_free++] = id;
    }
}

/* ---- tier 0 ----------------------------------------------------------------- */

struct cairn_page_pool {
    cairn_backend *be;
    cairn_kv_layout layout;
    void *base; /* backend memory, capacity * page_bytes */
    id_stack ids;
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
    int rc = id_stack_init(&p->ids, (int32_t)n);
    if (rc == CAIRN_OK)
        rc = be->iface->alloc(be, n * L->page_bytes, &p->base);
    if (rc != CAIRN_OK) {
        id_stack_free(&p->ids);
        free(p);
        return rc;
    }
    *out = p;
    return CAIRN_OK;
}

void cairn_page_pool_free(cairn_page_pool *p)
{
    if (!p)
        return;
    p->be->iface->free(p->be, p->base);
    id_stack_free(&p->ids);
    free(p);
}

void *cairn_page_pool_base(const cairn_page_pool *p) { return p->base; }
const cairn_kv_layout *cairn_page_pool_layout(const cairn_page_pool *p) { return &p->layout; }
int32_t cairn_page_pool_capacity(const cairn_page_pool *p) { return p->ids.capacity; }
int32_t cairn_page_pool_available(const cairn_page_pool *p) { return p->ids.n_free; }

int cairn_page_pool_alloc(cairn_page_pool *p, int32_t n, int32_t *pages)
{
    if (!p)
        return CAIRN_EINVAL;
    return id_stack_take(&p->ids, n, pages);
}

void cairn_page_pool_release(cairn_page_pool *p, int32_t n, const int32_t *pages)
{
    id_stack_give(&p->ids, n, pages, "page pool");
}
