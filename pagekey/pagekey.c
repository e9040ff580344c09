/*
 * pagekey/pagekey.c — the page-hash chain and its root (see pagekey.h).
 */
#include "pagekey/pagekey.h"

#include <string.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

void cairn_page_hash_to_bytes(cairn_page_hash h, uint8_t out[16])
{
    XXH128_hash_t x = {.low64 = h.lo, .high64 = h.hi};
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, x);
    memcpy(out, c.digest, 16);
}

cairn_page_hash cairn_page_hash_from_bytes(const uint8_t in[16])
{
    XXH128_canonical_t c;
    memcpy(c.digest, in, 16);
    XXH128_hash_t x = XXH128_hashFromCanonical(&c);
    return (cairn_page_hash){.lo = x.low64, .hi = x.high64};
}

/* Little-endian bytes of n tokens. */
static void tokens_le(uint8_t *dst, const int32_t *tokens, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)tokens[i];
        dst[4 * i + 0] = (uint8_t)v;
        dst[4 * i + 1] = (uint8_t)(v >> 8);
        dst[4 * i + 2] = (uint8_t)(v >> 16);
        dst[4 * i + 3] = (uint8_t)(v >> 24);
    }
}

cairn_page_hash cairn_page_hash_next(cairn_page_hash prev, const int32_t *tokens, size_t n)
{
    /* The tokens are written little-endian explicitly so the key does not
     * depend on the host's byte order. Usual pages fit one stack buffer and
     * one XXH3 call; larger ones stream through it in chunks (same digest). */
    enum { CHUNK = 256 };
    uint8_t buf[16 + 4 * CHUNK];
    XXH128_hash_t h;
    cairn_page_hash_to_bytes(prev, buf);
    if (n <= CHUNK) {
        tokens_le(buf + 16, tokens, n);
        h = XXH3_128bits(buf, 16 + 4 * n);
    } else {
        XXH3_state_t st;
        XXH3_128bits_reset(&st);
        XXH3_128bits_update(&st, buf, 16);
        for (size_t i = 0; i < n; i += CHUNK) {
            size_t k = n - i < CHUNK ? n - i : CHUNK;
            tokens_le(buf, tokens + i, k);
            XXH3_128bits_update(&st, buf, 4 * k);
        }
        h = XXH3_128bits_digest(&st);
    }
    return (cairn_page_hash){.lo = h.low64, .hi = h.high64};
}

cairn_page_hash cairn_page_chain_seed(cairn_page_hash root, uint64_t ns)
{
    if (ns == 0)
        return root;
    /* the word as two little-endian int32 "tokens" after the root */
    const int32_t word[2] = {(int32_t)(uint32_t)ns, (int32_t)(uint32_t)(ns >> 32)};
    return cairn_page_hash_next(root, word, 2);
}

void cairn_page_chain(cairn_page_hash root, uint64_t ns, const int32_t *tokens, size_t n_pages,
                      size_t page_size, cairn_page_hash *out)
{
    cairn_page_hash h = cairn_page_chain_seed(root, ns);
    for (size_t i = 0; i < n_pages; i++)
        out[i] = h = cairn_page_hash_next(h, tokens + i * page_size, page_size);
}

/* ---- the root ------------------------------------------------------------ */

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

int cairn_page_root_hash(const cairn_page_root *r, cairn_page_hash *out)
{
    if (!r || !out || (!r->model_fingerprint && r->fingerprint_bytes))
        return CAIRN_EINVAL;
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    add_bytes(&st, "cairn-kv-page-namespace", 23);
    add_bytes(&st, r->model_fingerprint, r->fingerprint_bytes);
    add_u64(&st, r->kv_dtype);
    add_u64(&st, r->layout_version);
    add_u64(&st, r->n_layer);
    add_u64(&st, r->n_kv_head);
    add_u64(&st, r->head_dim);
    add_u64(&st, r->page_size);
    add_u64(&st, r->page_bytes);
    /* An optional salt once followed here (never set outside a test): its
     * "absent" bytes stay, so every root, and every key on disk, is what it
     * was. */
    add_u64(&st, 0);
    add_bytes(&st, NULL, 0);
    /* Rotated KV (the quantized types) hashes its rotation as a tagged field
     * at the end, so the roots of unrotated layouts stay what they were and
     * stores written before it keep their pages. */
    if (r->rotation) {
        add_bytes(&st, "rotation", 8);
        add_u64(&st, r->rotation);
    }
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    *out = (cairn_page_hash){.lo = h.low64, .hi = h.high64};
    return CAIRN_OK;
}
