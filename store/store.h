/*
 * store/store.h — KV page pools and tiers.
 *
 * Tier 0 is a pool of fixed-size KV pages allocated once, from a byte
 * budget, through the backend interface (RAM for the CPU backend, device
 * memory for CUDA). Nothing allocates KV memory per request: a request takes
 * page ids from the pool and gives them back.
 */
#ifndef CAIRN_STORE_H
#define CAIRN_STORE_H

#include "common/common.h"
#include "kernels/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cairn_page_pool cairn_page_pool;

/* Allocate floor(budget_bytes / L->page_bytes) pages from `be` (borrowed;
 * must outlive the pool) in one allocation. CAIRN_EINVAL when the budget
 * holds no page, CAIRN_ENOMEM when the backend cannot allocate it. */
int cairn_page_pool_create(cairn_backend *be, const cairn_kv_layout *L, size_t budget_bytes,
                           cairn_page_pool **out);
void cairn_page_pool_free(cairn_page_pool *p);

/* Backend memory of the pool: page i starts at base + i * page_bytes. */
void *cairn_page_pool_base(const cairn_page_pool *p);
const cairn_kv_layout *cairn_page_pool_layout(const cairn_page_pool *p);
int32_t cairn_page_pool_capacity(const cairn_page_pool *p);
int32_t cairn_page_pool_available(const cairn_page_pool *p);

/* Take `n` free pages (all or nothing): CAIRN_EFULL when fewer are free. */
int cairn_page_pool_alloc(cairn_page_pool *p, int32_t n, int32_t *pages);
/* Return pages taken with cairn_page_pool_alloc. */
void cairn_page_pool_release(cairn_page_pool *p, int32_t n, const int32_t *pages);

#ifdef __cplusplus
}
#endif
#endif /* CAIRN_STORE_H */
