/*
 * fuzz/fuzz_common.h — helpers shared by the libFuzzer targets.
 *
 * A target checks two things: that no input makes the code under test
 * misbehave (ASan/UBSan report it), and a few properties that must hold
 * for every input (FUZZ_CHECK: a broken one aborts, so libFuzzer saves the
 * input as a crash). Fixed data (vocabularies) comes from the source tree:
 * CAIRN_FUZZ_ROOT (environment) or the tree the target was built from.
 */
#ifndef CAIRN_FUZZ_COMMON_H
#define CAIRN_FUZZ_COMMON_H

#include "runtime/runtime.h"

#include <stdio.h>
#include <stdlib.h>

#ifndef CAIRN_FUZZ_SOURCE_DIR
#define CAIRN_FUZZ_SOURCE_DIR "."
#endif

#define FUZZ_CHECK(cond)                                                                     \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "%s:%d: property failed: %s\n", __FILE__, __LINE__, #cond);      \
            abort();                                                                         \
        }                                                                                    \
    } while (0)

/* Path of a file under the source tree, in a static buffer. */
static inline const char *fuzz_path(const char *rel)
{
    static char buf[4096];
    const char *root = getenv("CAIRN_FUZZ_ROOT");
    snprintf(buf, sizeof buf, "%s/%s", root && *root ? root : CAIRN_FUZZ_SOURCE_DIR, rel);
    return buf;
}

/* Load the vocabulary of a GGUF under the source tree, or exit: a target
 * without its fixed data cannot run at all. */
static inline cairn_vocab *fuzz_load_vocab(const char *rel)
{
    const char *path = fuzz_path(rel);
    char err[256] = "";
    cairn_gguf *g = NULL;
    cairn_vocab *v = NULL;
    int rc = cairn_gguf_open(path, &g, err, sizeof err);
    if (rc == CAIRN_OK)
        rc = cairn_vocab_load(g, &v, err, sizeof err);
    cairn_gguf_close(g);
    if (rc != CAIRN_OK) {
        fprintf(stderr, "fuzz: cannot load the vocabulary of %s: %s (set CAIRN_FUZZ_ROOT)\n",
                path, err);
        exit(2);
    }
    return v;
}

/* True when s[0..n) is well-formed UTF-8 (no overlongs, surrogates or code
 * points above U+10FFFF). */
static inline int fuzz_utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len;
        unsigned cp, min;
        if (c < 0x80) { i++; continue; }
        if ((c & 0xe0) == 0xc0) { len = 2; cp = c & 0x1f; min = 0x80; }
        else if ((c & 0xf0) == 0xe0) { len = 3; cp = c & 0x0f; min = 0x800; }
        else if ((c & 0xf8) == 0xf0) { len = 4; cp = c & 0x07; min = 0x10000; }
        else return 0;
        if (n - i < len)
            return 0;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return 0;
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += len;
    }
    return 1;
}

#endif
