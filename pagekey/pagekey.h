/*
 * pagekey/pagekey.h — what names a page of KV, in every process, on every
 * replica and on disk: its chained hash. The tree (radix/), the store and
 * its tiers (store/: LMDB keys, the Redis tier), the router's index
 * (route/) and the events a replica publishes all name pages with these
 * functions and no other.
 *
 * The chain
 * ---------
 *
 *     root  = cairn_page_root_hash(model, KV layout)       one per model+layout
 *     h_-1  = cairn_page_chain_seed(root, ns)              one per tenant
 *     h_i   = cairn_page_hash_next(h_i-1, tokens of page i)
 *
 *       root ──ns──▶ h_-1 ──page 0──▶ h_0 ──page 1──▶ h_1 ── ...
 *
 * A page's key is h_i: it names the page's tokens and every token before
 * them, under one model, KV dtype, layout and page size, for one tenant.
 * Two sequences share h_i exactly when they share pages 0..i, so the same
 * prefix has the same keys in every process and after every restart, and a
 * page computed under another model, dtype or tenant can never be found.
 *
 *   h_next(prev, tokens) = XXH3-128(canonical(prev) || tokens as LE int32)
 *
 * where canonical() is the 16-byte big-endian form (cairn_page_hash_to_
 * bytes, also the LMDB and Redis key). Namespace 0 ("shared by everyone")
 * chains from the root itself; another namespace word w chains once more,
 * over w as two little-endian int32 "tokens", so a tenant's keys are its
 * own on disk too.
 *
 * The root hashes a fixed serialisation of the model fingerprint and the
 * KV layout (explicit lengths, little-endian integers), so no two different
 * descriptions give the same bytes and struct padding never matters.
 *
 * All functions are pure and thread-safe. The values are the same on every
 * little-endian machine; changing any of them orphans every page on disk.
 */
#ifndef CAIRN_PAGEKEY_H
#define CAIRN_PAGEKEY_H

#include "common/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A 128-bit page hash; `hi` and `lo` are XXH3-128's high and low halves. */
typedef struct {
    uint64_t lo, hi;
} cairn_page_hash;

static inline bool cairn_page_hash_equal(cairn_page_hash a, cairn_page_hash b)
{
    return a.lo == b.lo && a.hi == b.hi;
}

/* h_next = XXH3-128(canonical(prev) || tokens[0..n)) — the chain step. */
cairn_page_hash cairn_page_hash_next(cairn_page_hash prev, const int32_t *tokens, size_t n);

/* The 16-byte big-endian form of a hash: its key on disk and in Redis. */
void cairn_page_hash_to_bytes(cairn_page_hash h, uint8_t out[16]);
/* Its inverse: a hash from its 16-byte big-endian form (an event's, a key's). */
cairn_page_hash cairn_page_hash_from_bytes(const uint8_t in[16]);

/* h_{-1} of namespace ns: the root itself for 0, else the root chained over
 * the word as two little-endian int32. */
cairn_page_hash cairn_page_chain_seed(cairn_page_hash root, uint64_t ns);

/* out[i] = h_i for the first n_pages pages of tokens ([n_pages * page_size])
 * in namespace ns under root. */
void cairn_page_chain(cairn_page_hash root, uint64_t ns, const int32_t *tokens, size_t n_pages,
                      size_t page_size, cairn_page_hash *out);

/* What the root stands for: the model and how its KV is laid out. Every
 * field is part of the key. */
typedef struct {
    const void *model_fingerprint; /* e.g. a hash of the tensor data (+ draft heads) */
    size_t fingerprint_bytes;
    uint64_t kv_dtype;             /* the KV element type                  */
    uint64_t layout_version;       /* bumped when a page's bytes change meaning */
    uint64_t n_layer, n_kv_head, head_dim;
    uint64_t page_size;            /* tokens per page                      */
    uint64_t page_bytes;           /* bytes per page                        */
    uint64_t rotation;             /* rotated (quantized) KV: its rotation; 0: none */
} cairn_page_root;

/* The root of every chain under r: XXH3-128 of r's fixed serialisation.
 * CAIRN_EINVAL for NULLs (or a NULL fingerprint with a length). */
int cairn_page_root_hash(const cairn_page_root *r, cairn_page_hash *out);

#ifdef __cplusplus
}
#endif
#endif /* CAIRN_PAGEKEY_H */
