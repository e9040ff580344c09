/*
 * tests/support/gguf_writer.c — GGUF images written field by field, for
 * the tests that build their own files (support.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/support/support.h"

void gw_put(gw_buf *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

void gw_u8(gw_buf *b, uint8_t v) { gw_put(b, &v, 1); }
void gw_u16(gw_buf *b, uint16_t v) { gw_put(b, &v, 2); }
void gw_u32(gw_buf *b, uint32_t v) { gw_put(b, &v, 4); }
void gw_u64(gw_buf *b, uint64_t v) { gw_put(b, &v, 8); }
void gw_f32(gw_buf *b, float v) { gw_put(b, &v, 4); }
void gw_f64(gw_buf *b, double v) { gw_put(b, &v, 8); }

void gw_str(gw_buf *b, const char *s)
{
    gw_u64(b, strlen(s));
    gw_put(b, s, strlen(s));
}

void gw_fill(gw_buf *b, uint8_t byte, size_t n)
{
    for (size_t i = 0; i < n; i++)
        gw_u8(b, byte);
}

void gw_pad(gw_buf *b, size_t align)
{
    while (b->n % align)
        gw_u8(b, 0);
}

void gw_header(gw_buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    gw_put(b, "GGUF", 4);
    gw_u32(b, version);
    gw_u64(b, n_tensors);
    gw_u64(b, n_kv);
}

void gw_kv(gw_buf *b, const char *key, uint32_t type)
{
    gw_str(b, key);
    gw_u32(b, type);
}

void gw_tensor_info(gw_buf *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                    uint32_t type, uint64_t offset)
{
    gw_str(b, name);
    gw_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++)
        gw_u64(b, ne[d]);
    gw_u32(b, type);
    gw_u64(b, offset);
}
