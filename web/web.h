/*
 * web/web.h — the browser page `cairn serve --http-port N` serves at `/`
 * (docs/web.md): its files, embedded in the binary when it is built.
 *
 * The page is plain HTML, CSS and JavaScript (web/assets/), written for
 * cairn: no build step, no Node toolchain, no third-party script, nothing
 * fetched from the network. At build time CMake turns every file of
 * web/assets/ into a byte array of a generated C file (web/embed.cmake), so
 * the binary needs no file at run time and the page is exactly what was
 * built.
 *
 * What the page may do is the server's business (server/http/web.c): the
 * files hold no data; everything the page shows comes from the API with the
 * token the person types in.
 *
 * Thread safety: the table is immutable, read from any thread.
 */
#ifndef CAIRN_WEB_H
#define CAIRN_WEB_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *path;         /* as requested: "/" or "/app.js"              */
    const char *content_type; /* with its charset                            */
    const unsigned char *data;
    size_t len;
} cairn_web_asset;

/* The asset at `path` (not NUL-terminated; no query), or NULL. */
const cairn_web_asset *cairn_web_find(const char *path, size_t len);

/* Every asset, for listing and tests: *n receives the count. */
const cairn_web_asset *cairn_web_assets(size_t *n);

#ifdef __cplusplus
}
#endif

#endif /* CAIRN_WEB_H */
