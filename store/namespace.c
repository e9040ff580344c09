/*
 * store/namespace.c — the seed of every page-hash chain.
 *
 * The namespace is serialised field by field with explicit lengths and
 * little-endian integers, so no two different namespaces can produce the
 * same byte string and the result does not depend on struct padding.
 */
#include "store/store.h"

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

static void add_u64(XXH3_state_t *st, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    XXH3_128bits_update(st, b, 8);
}

static void add_bytes(XXH3_state_t *st, const void *p, size_t n)
{
    add_u64(st, n);
    if (n)
        XXH3_128bits_update(st, p, n);
}

int cairn_page_namespace_hash(const cairn_page_namespace *ns, cairn_page_hash *out)
{
    if (!ns || !out || !ns->layout || (!ns->model_fingerprint && ns->fingerprint_bytes) ||
        (!ns->tenant_salt && ns->salt_bytes))
        return CAIRN_EINVAL;
    const cairn_kv_layout *L = ns->layout;
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    add_bytes(&st, "cairn-kv-page-namespace", 23);
    add_bytes(&st, ns->model_fingerprint, ns->fingerprint_bytes);
    add_u64(&st, (uint64_t)L->dtype);
    add_u64(&st, ns->layout_version);
    add_u64(&st, (uint64_t)L->n_layer);
    add_u64(&st, (uint64_t)L->n_kv_head);
    add_u64(&st, (uint64_t)L->head_dim);
    add_u64(&st, (uint64_t)L->page_size);
    add_u64(&st, (uint64_t)L->page_bytes);
    add_u64(&st, ns->tenant_salt ? 1 : 0);
    add_bytes(&st, ns->tenant_salt, ns->salt_bytes);
    /* Rotated KV (the quantized types) hashes its rotation as a tagged field
     * at the end, so the namespaces of unrotated layouts stay what they were
     * and stores written before it keep their pages. */
    if (L->rotation) {
        add_bytes(&st, "rotation", 8);
        add_u64(&st, (uint64_t)L->rotation);
    }
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    *out = (cairn_page_hash){.lo = h.low64, .hi = h.high64};
    return CAIRN_OK;
}
