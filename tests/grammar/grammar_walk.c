/*
 * tests/grammar/grammar_walk.c — a byte-level driver of the schema grammar
 * for tests/grammar/test_grammar_walk.py, which judges its output with
 * Python's jsonschema (an implementation independent of cairn's):
 *
 *   grammar_walk SCHEMA_FILE walk N SEED
 *       N random documents, each ended by a NUL byte: from the start, a
 *       random byte the matcher accepts at every step (all 256 tried in a
 *       random order), ending when the document may end with probability
 *       1/3 (or must). A walk past 600 bytes is dropped; a state where no
 *       byte is accepted and the document cannot end prints "DEADEND" on
 *       stderr and exits 3 (the grammar let through a prefix that no valid
 *       document has).
 *   grammar_walk SCHEMA_FILE check
 *       reads NUL-ended documents on stdin, writes '1' (accepted whole) or
 *       '0' for each.
 * A schema the compiler refuses: its message on stderr, exit 2.
 */
#include "text/text.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WALK_MAX_BYTES 600

static char *read_all(FILE *f, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
        }
    }
    *len = n;
    return buf;
}

static uint64_t next_rand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* One walk into doc (WALK_MAX_BYTES + 1); its length, -1 when too long. */
static long walk(cairn_grammar_matcher *m, uint64_t *rng, char *doc)
{
    cairn_grammar_matcher_reset(m);
    long n = 0;
    for (;;) {
        if (cairn_grammar_matcher_done(m) ||
            (cairn_grammar_matcher_can_end(m) && next_rand(rng) % 3 == 0))
            return n;
        if (n >= WALK_MAX_BYTES)
            return -1;
        uint8_t order[256];
        for (int i = 0; i < 256; i++)
            order[i] = (uint8_t)i;
        for (int i = 255; i > 0; i--) {
            int j = (int)(next_rand(rng) % (uint64_t)(i + 1));
            uint8_t t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        int i = 0;
        while (i < 256 && cairn_grammar_matcher_accept_bytes(m, (const char *)&order[i], 1) != CAIRN_OK)
            i++;
        if (i == 256) {
            if (cairn_grammar_matcher_can_end(m))
                return n;
            doc[n] = '\0';
            fprintf(stderr, "DEADEND after %ld bytes: %s\n", n, doc);
            exit(3);
        }
        doc[n++] = (char)order[i];
    }
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: grammar_walk SCHEMA_FILE walk N SEED | check\n");
        return 1;
    }
    FILE *f = fopen(argv[1], "rb");
    size_t len = 0;
    char *schema = f ? read_all(f, &len) : NULL;
    if (f)
        fclose(f);
    if (!schema) {
        fprintf(stderr, "cannot read %s\n", argv[1]);
        return 1;
    }
    cairn_grammar *g = NULL;
    char err[256] = "";
    int rc = cairn_grammar_from_json_schema(schema, len, &g, err, sizeof err);
    free(schema);
    if (rc != CAIRN_OK) {
        fprintf(stderr, "%s (%d)\n", err, rc);
        return 2;
    }
    cairn_grammar_matcher *m = NULL;
    if (cairn_grammar_matcher_create(g, NULL, &m) != CAIRN_OK)
        return 1;
    if (strcmp(argv[2], "walk") == 0 && argc == 5) {
        long want = atol(argv[3]);
        uint64_t rng = strtoull(argv[4], NULL, 10) * 0x9e3779b97f4a7c15ull + 1;
        char doc[WALK_MAX_BYTES + 1];
        for (long k = 0, tries = 0; k < want && tries < want * 20; tries++) {
            long n = walk(m, &rng, doc);
            if (n < 0)
                continue;
            fwrite(doc, 1, (size_t)n, stdout);
            fputc('\0', stdout);
            k++;
        }
    } else if (strcmp(argv[2], "check") == 0) {
        size_t n = 0;
        char *in = read_all(stdin, &n);
        for (size_t at = 0; in && at < n;) {
            char *end = memchr(in + at, '\0', n - at);
            size_t dl = end ? (size_t)(end - (in + at)) : n - at;
            cairn_grammar_matcher_reset(m);
            bool ok = cairn_grammar_matcher_accept_bytes(m, in + at, dl) == CAIRN_OK &&
                      cairn_grammar_matcher_can_end(m);
            fputc(ok ? '1' : '0', stdout);
            at += dl + 1;
        }
        free(in);
    } else {
        fprintf(stderr, "unknown mode %s\n", argv[2]);
        return 1;
    }
    cairn_grammar_matcher_free(m);
    cairn_grammar_free(g);
    return 0;
}
