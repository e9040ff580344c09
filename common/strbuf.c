/*
 * common/strbuf.c — the growing NUL-terminated string (cairn_strbuf).
 */
#include "common/common.h"

#include <stdlib.h>
#include <string.h>

void cairn_strbuf_add(cairn_strbuf *b, const void *s, size_t n)
{
    if (b->oom || n == 0) /* n == 0: data may still be NULL (NULL + 0 is UB) */
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) {
            b->oom = true;
            return;
        }
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void cairn_strbuf_free(cairn_strbuf *b)
{
    free(b->data);
    *b = (cairn_strbuf){0};
}
