/*
 * web/web.c — looking up the embedded page's files (web/web.h). The table
 * itself is generated at build time (web/embed.cmake -> web_assets.c).
 */
#include "web/web.h"

#include <string.h>

/* web_assets.c, generated */
extern const cairn_web_asset cairn_web_table[];
extern const size_t cairn_web_table_len;

const cairn_web_asset *cairn_web_find(const char *path, size_t len)
{
    if (len == 11 && memcmp(path, "/index.html", 11) == 0)
        path = "/", len = 1;
    for (size_t i = 0; i < cairn_web_table_len; i++) {
        const cairn_web_asset *a = &cairn_web_table[i];
        if (strlen(a->path) == len && memcmp(a->path, path, len) == 0)
            return a;
    }
    return NULL;
}

const cairn_web_asset *cairn_web_assets(size_t *n)
{
    *n = cairn_web_table_len;
    return cairn_web_table;
}
