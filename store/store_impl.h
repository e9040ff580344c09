/*
 * store/store_impl.h — internal to store/: the free-id stack both page pools
 * hand out their ids from. No other folder includes this.
 *
 * Ids 0 .. capacity-1; a fresh stack hands out 0, 1, 2, ... Taking is all or
 * nothing; giving back an id that is not taken is a caller bug that is logged
 * and ignored, so the accounting (available + taken == capacity) stays exact.
 */
#ifndef CAIRN_STORE_IMPL_H
#define CAIRN_STORE_IMPL_H

#include "common/common.h"

typedef struct {
    int32_t capacity;
    int32_t n_free;
    int32_t *free_ids; /* stack; top is free_ids[n_free-1] */
    uint8_t *in_use;   /* [capacity]                       */
} id_stack;

/* CAIRN_ENOMEM when the arrays cannot be allocated (nothing to free then). */
int id_stack_init(id_stack *s, int32_t capacity);
void id_stack_free(id_stack *s);
/* Take n ids into ids[] (all or nothing): CAIRN_EFULL when fewer are free. */
int id_stack_take(id_stack *s, int32_t n, int32_t *ids);
/* Give ids back; `what` names the pool in the log line for a bad id. */
void id_stack_give(id_stack *s, int32_t n, const int32_t *ids, const char *what);

#endif /* CAIRN_STORE_IMPL_H */
