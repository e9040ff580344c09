/*
 * store/namespace.c — the root of every page-hash chain of a model: its
 * KV layout described to pagekey/pagekey.h, which owns page identity.
 */
#include "store/tiers.h"

int cairn_page_namespace_hash(const cairn_page_namespace *ns, cairn_page_hash *out)
{
    if (!ns || !out || !ns->layout)
        return CAIRN_EINVAL;
    const cairn_kv_layout *L = ns->layout;
    cairn_page_root r = {.model_fingerprint = ns->model_fingerprint,
                         .fingerprint_bytes = ns->fingerprint_bytes,
                         .kv_dtype = (uint64_t)L->dtype,
                         .layout_version = ns->layout_version,
                         .n_layer = (uint64_t)L->n_layer,
                         .n_kv_head = (uint64_t)L->n_kv_head,
                         .head_dim = (uint64_t)L->head_dim,
                         .page_size = (uint64_t)L->page_size,
                         .page_bytes = (uint64_t)L->page_bytes,
                         .rotation = (uint64_t)L->rotation};
    return cairn_page_root_hash(&r, out);
}
