/*
 * fuzz/fuzz_disk_value.c — verification of page values read back from the
 * LMDB tier (cairn_disk_value_verify, store/tiers.h). A value on disk may be
 * damaged, truncated, from another build or another model; the check must
 * never read outside it and must accept only the exact page expected.
 *
 * Input: byte 0 chooses repairs, byte 1 the page size (1..16 tokens), byte 2
 * a byte to corrupt afterwards, the rest is the value. Repairs, so that the
 * fuzzer gets past each field without having to guess a 64-bit checksum:
 *   bit 0  pick page_bytes so the length is right
 *   bit 1  write the right header (magic, version, size, namespace, geometry)
 *   bit 2  write the expected tokens
 *   bit 3  write the right checksum
 *   bit 4  then flip one bit of the value (byte index from byte 2)
 * Properties: the verdict equals an independent reading of the format in
 * store.h; a value with every repair and no flip is accepted; any flipped
 * bit is refused.
 */
#include "fuzz_common.h"
#include "store/tiers.h"

#include <string.h>
#include <xxhash.h>

static const cairn_page_hash ns = {.lo = 0x0123456789abcdefull, .hi = 0xfedcba9876543210ull};

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* XXH3-64 of header bytes [0, 40) followed by everything after the header. */
static uint64_t checksum(const uint8_t *v, size_t bytes)
{
    uint8_t *tmp = malloc(bytes - 8 + 1);
    FUZZ_CHECK(tmp != NULL);
    memcpy(tmp, v, 40);
    memcpy(tmp + 40, v + 48, bytes - 48);
    uint64_t h = XXH3_64bits(tmp, bytes - 8);
    free(tmp);
    return h;
}

static bool reference_verify(const uint8_t *v, size_t bytes, int page_size, size_t page_bytes,
                             const uint8_t *tokens_le)
{
    size_t tok = 4 * (size_t)page_size;
    if (bytes != 48 + tok + page_bytes)
        return false;
    uint8_t ns_bytes[16];
    cairn_page_hash_to_bytes(ns, ns_bytes);
    return memcmp(v, "CKVP", 4) == 0 && get_le(v + 4, 2) == CAIRN_DISK_FORMAT_VERSION &&
           get_le(v + 6, 2) == 48 && memcmp(v + 8, ns_bytes, 16) == 0 &&
           get_le(v + 24, 4) == (uint64_t)page_size && get_le(v + 32, 8) == page_bytes &&
           memcmp(v + 48, tokens_le, tok) == 0 && get_le(v + 40, 8) == checksum(v, bytes);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    const unsigned repairs = data[0];
    const int page_size = 1 + data[1] % 16;
    const uint8_t flip_at = data[2];
    const size_t bytes = size - 3;
    const size_t tok = 4 * (size_t)page_size;

    uint8_t tokens_le[64];
    for (int i = 0; i < page_size; i++)
        put_le(tokens_le + 4 * i, (uint32_t)(i * 2654435761u), 4);

    /* An exact-size copy, so ASan catches a read one past the value. */
    uint8_t *v = malloc(bytes ? bytes : 1);
    FUZZ_CHECK(v != NULL);
    memcpy(v, data + 3, bytes);

    size_t page_bytes = bytes;
    bool len_ok = false;
    if ((repairs & 1) && bytes >= 48 + tok) {
        page_bytes = bytes - 48 - tok;
        len_ok = true;
    } else if (bytes >= 48) {
        page_bytes = (size_t)get_le(v + 32, 2); /* usually wrong: a length mismatch */
    }
    const bool full = len_ok && (repairs & 0xe) == 0xe;
    if (len_ok && (repairs & 2)) {
        memcpy(v, "CKVP", 4);
        put_le(v + 4, CAIRN_DISK_FORMAT_VERSION, 2);
        put_le(v + 6, CAIRN_DISK_HEADER_BYTES, 2);
        cairn_page_hash_to_bytes(ns, v + 8);
        put_le(v + 24, (uint64_t)page_size, 4);
        put_le(v + 28, 0, 4);
        put_le(v + 32, page_bytes, 8);
    }
    if (len_ok && (repairs & 4))
        memcpy(v + 48, tokens_le, tok);
    if (len_ok && (repairs & 8))
        put_le(v + 40, checksum(v, bytes), 8);
    bool flipped = false;
    if ((repairs & 16) && bytes > 0) {
        size_t at = (size_t)flip_at * 2654435761u % bytes;
        v[at] ^= (uint8_t)(1u << (flip_at & 7));
        flipped = true;
    }

    bool got = cairn_disk_value_verify(v, bytes, ns, page_size, page_bytes, tokens_le);
    bool want = reference_verify(v, bytes, page_size, page_bytes, tokens_le);
    FUZZ_CHECK(got == want);
    if (full && !flipped)
        FUZZ_CHECK(got);
    if (full && flipped)
        FUZZ_CHECK(!got);
    free(v);
    return 0;
}
