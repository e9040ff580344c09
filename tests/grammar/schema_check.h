/*
 * tests/grammar/schema_check.h — an independent JSON-schema validator for the
 * subset text/grammar_compile.c supports, and a generator of random valid
 * documents, written from the JSON Schema spec (not from the compiler) so the
 * tests compare two implementations. Test-only: header-defined statics.
 */
#ifndef CAIRN_TESTS_SCHEMA_CHECK_H
#define CAIRN_TESTS_SCHEMA_CHECK_H

#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *sc_resolve(json_t *root, const char *ref)
{
    if (strcmp(ref, "#") == 0)
        return root;
    if (strncmp(ref, "#/$defs/", 8) == 0)
        return json_object_get(json_object_get(root, "$defs"), ref + 8);
    if (strncmp(ref, "#/definitions/", 14) == 0)
        return json_object_get(json_object_get(root, "definitions"), ref + 14);
    return NULL;
}

static size_t sc_utf8_len(const char *s, size_t n)
{
    size_t chars = 0;
    for (size_t i = 0; i < n; i++)
        chars += ((uint8_t)s[i] & 0xc0) != 0x80;
    return chars;
}

static bool sc_has_type(json_t *v, const char *t)
{
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "object")) return json_is_object(v);
    if (!strcmp(t, "array")) return json_is_array(v);
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "integer"))
        return json_is_integer(v) ||
               (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)));
    return false;
}

/* Does v validate against schema s (root for $ref)? */
static bool sc_valid(json_t *root, json_t *s, json_t *v)
{
    if (json_is_true(s))
        return true;
    if (!json_is_object(s))
        return false;
    json_t *k;
    if ((k = json_object_get(s, "$ref")))
        return sc_valid(root, sc_resolve(root, json_string_value(k)), v);
    if ((k = json_object_get(s, "const")) && !json_equal(k, v))
        return false;
    if ((k = json_object_get(s, "enum"))) {
        bool found = false;
        size_t i;
        json_t *e;
        json_array_foreach(k, i, e) found |= json_equal(e, v);
        if (!found)
            return false;
    }
    if ((k = json_object_get(s, "anyOf")) || (k = json_object_get(s, "oneOf"))) {
        bool one = json_object_get(s, "oneOf") != NULL;
        int n = 0;
        size_t i;
        json_t *e;
        json_array_foreach(k, i, e) n += sc_valid(root, e, v);
        if (one ? n != 1 : n == 0)
            return false;
    }
    if ((k = json_object_get(s, "allOf"))) {
        size_t i;
        json_t *e;
        json_array_foreach(k, i, e) if (!sc_valid(root, e, v)) return false;
    }
    if ((k = json_object_get(s, "type"))) {
        bool ok = false;
        if (json_is_string(k))
            ok = sc_has_type(v, json_string_value(k));
        size_t i;
        json_t *e;
        if (json_is_array(k))
            json_array_foreach(k, i, e) ok |= sc_has_type(v, json_string_value(e));
        if (!ok)
            return false;
    }
    if (json_is_number(v)) {
        /* bounds as Python compares them: exactly (integers against integers
         * or doubles, doubles against doubles); long double holds both */
        long double x = json_is_integer(v) ? (long double)json_integer_value(v) : json_real_value(v);
        static const char *const kw[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
        for (int i = 0; i < 4; i++) {
            json_t *b = json_object_get(s, kw[i]);
            if (!json_is_number(b))
                continue;
            long double y = json_is_integer(b) ? (long double)json_integer_value(b) : json_real_value(b);
            if ((i == 0 && x < y) || (i == 1 && x > y) || (i == 2 && x <= y) || (i == 3 && x >= y))
                return false;
        }
    }
    if (json_is_string(v)) {
        size_t n = sc_utf8_len(json_string_value(v), json_string_length(v));
        if ((k = json_object_get(s, "minLength")) && n < (size_t)json_integer_value(k))
            return false;
        if ((k = json_object_get(s, "maxLength")) && n > (size_t)json_integer_value(k))
            return false;
    }
    if (json_is_array(v)) {
        size_t n = json_array_size(v), i;
        json_t *e;
        if ((k = json_object_get(s, "minItems")) && n < (size_t)json_integer_value(k))
            return false;
        if ((k = json_object_get(s, "maxItems")) && n > (size_t)json_integer_value(k))
            return false;
        json_t *prefix = json_object_get(s, "prefixItems"); /* then items for the rest */
        size_t np = json_array_size(prefix);
        json_array_foreach(v, i, e) {
            json_t *is = i < np ? json_array_get(prefix, i) : json_object_get(s, "items");
            if (json_is_false(is) || (is && !sc_valid(root, is, e)))
                return false;
        }
    }
    if (json_is_object(v)) {
        json_t *props = json_object_get(s, "properties"), *addl = json_object_get(s, "additionalProperties");
        size_t i;
        json_t *e;
        if ((k = json_object_get(s, "required")))
            json_array_foreach(k, i, e) if (!json_object_get(v, json_string_value(e))) return false;
        const char *key;
        json_object_foreach(v, key, e) {
            json_t *ps = props ? json_object_get(props, key) : NULL;
            if (ps) {
                if (!sc_valid(root, ps, e))
                    return false;
            } else if (json_is_false(addl)) {
                return false;
            } else if (json_is_object(addl) && !sc_valid(root, addl, e)) {
                return false;
            }
        }
    }
    return true;
}

/* Parse `text` (any JSON value) and validate it against schema JSON text. */
static bool sc_text_valid(const char *schema_text, const char *text, size_t len)
{
    json_t *v = json_loadb(text, len, JSON_DECODE_ANY, NULL);
    if (!v)
        return false;
    bool ok = true;
    if (schema_text) {
        json_t *s = json_loads(schema_text, 0, NULL);
        ok = s && sc_valid(s, s, v);
        json_decref(s);
    } else {
        ok = json_is_object(v);
    }
    json_decref(v);
    return ok;
}

/* ---- random valid documents ---------------------------------------------------- */

typedef struct {
    char *buf;
    size_t n, cap;
    uint64_t rng;
} sc_gen;

static uint32_t sc_rand(sc_gen *g, uint32_t n)
{
    g->rng ^= g->rng << 13;
    g->rng ^= g->rng >> 7;
    g->rng ^= g->rng << 17;
    return n ? (uint32_t)(g->rng % n) : 0;
}

static void sc_put(sc_gen *g, const char *s, size_t n)
{
    if (g->n + n + 1 > g->cap) {
        g->cap = (g->n + n + 1) * 2;
        g->buf = realloc(g->buf, g->cap);
    }
    memcpy(g->buf + g->n, s, n);
    g->n += n;
    g->buf[g->n] = '\0';
}

static void sc_puts(sc_gen *g, const char *s) { sc_put(g, s, strlen(s)); }

/* Whitespace the grammar allows between tokens. */
static void sc_ws(sc_gen *g)
{
    switch (sc_rand(g, 4)) {
    case 0: sc_puts(g, " "); break;
    case 1: {
        sc_puts(g, "\n");
        int n = (int)sc_rand(g, 21);
        for (int i = 0; i < n; i++)
            sc_puts(g, sc_rand(g, 4) ? " " : "\t");
        break;
    }
    default: break;
    }
}

static void sc_string(sc_gen *g, int min, int max)
{
    static const char *const chars[] = {"a", "Z", " ", "7", "{", "}", ":", ",", "'", "é", "中",
                                        "😀", "\\n", "\\\"", "\\\\", "\\/", "\\u00e9", "\\u4E2D",
                                        "\\t", "~"};
    if (max < 0)
        max = min + 8;
    int n = min + (int)sc_rand(g, (uint32_t)(max - min + 1));
    sc_puts(g, "\"");
    for (int i = 0; i < n; i++)
        sc_puts(g, chars[sc_rand(g, sizeof chars / sizeof *chars)]);
    sc_puts(g, "\"");
}

static void sc_digits(sc_gen *g, int n)
{
    for (int i = 0; i < n; i++) {
        char d = (char)('0' + sc_rand(g, 10));
        sc_put(g, &d, 1);
    }
}

static void sc_integer(sc_gen *g)
{
    if (sc_rand(g, 3) == 0)
        sc_puts(g, "-");
    if (sc_rand(g, 5) == 0) {
        sc_puts(g, "0");
        return;
    }
    char d = (char)('1' + sc_rand(g, 9));
    sc_put(g, &d, 1);
    sc_digits(g, (int)sc_rand(g, 8));
}

static void sc_number(sc_gen *g)
{
    sc_integer(g);
    if (sc_rand(g, 2)) {
        sc_puts(g, ".");
        sc_digits(g, 1 + (int)sc_rand(g, 5));
    }
    if (sc_rand(g, 3) == 0) {
        sc_puts(g, sc_rand(g, 2) ? "e" : "E");
        if (sc_rand(g, 2))
            sc_puts(g, sc_rand(g, 2) ? "+" : "-");
        sc_digits(g, 1 + (int)sc_rand(g, 2));
    }
}

static void sc_value(sc_gen *g, json_t *root, json_t *s, int depth);

static void sc_any(sc_gen *g, int depth)
{
    switch (sc_rand(g, depth > 2 ? 5 : 7)) {
    case 0: sc_string(g, 0, 5); break;
    case 1: sc_number(g); break;
    case 2: sc_puts(g, "true"); break;
    case 3: sc_puts(g, "false"); break;
    case 4: sc_puts(g, "null"); break;
    case 5:
    case 6: {
        bool obj = sc_rand(g, 2);
        int n = (int)sc_rand(g, 3);
        sc_puts(g, obj ? "{" : "[");
        sc_ws(g);
        for (int i = 0; i < n; i++) {
            if (i) {
                sc_puts(g, ",");
                sc_ws(g);
            }
            if (obj) {
                sc_string(g, 0, 4);
                sc_ws(g);
                sc_puts(g, ":");
                sc_ws(g);
            }
            sc_any(g, depth + 1);
            sc_ws(g);
        }
        sc_puts(g, obj ? "}" : "]");
    }
    }
}

static void sc_typed(sc_gen *g, json_t *root, json_t *s, const char *t, int depth)
{
    json_t *k;
    if (!strcmp(t, "string")) {
        k = json_object_get(s, "maxLength");
        sc_string(g, (int)json_integer_value(json_object_get(s, "minLength")),
                  k ? (int)json_integer_value(k) : -1);
    } else if (!strcmp(t, "integer") && json_is_integer(json_object_get(s, "minimum")) &&
               json_is_integer(json_object_get(s, "maximum"))) {
        /* (the tests' bounded integers have both, as integers) */
        json_int_t lo = json_integer_value(json_object_get(s, "minimum"));
        json_int_t hi = json_integer_value(json_object_get(s, "maximum"));
        char text[32];
        snprintf(text, sizeof text, "%lld", (long long)(lo + (json_int_t)sc_rand(g, (uint32_t)(hi - lo + 1))));
        sc_puts(g, text);
    } else if (!strcmp(t, "integer")) {
        sc_integer(g);
    } else if (!strcmp(t, "number")) {
        sc_number(g);
    } else if (!strcmp(t, "boolean")) {
        sc_puts(g, sc_rand(g, 2) ? "true" : "false");
    } else if (!strcmp(t, "null")) {
        sc_puts(g, "null");
    } else if (!strcmp(t, "array")) {
        int min = (int)json_integer_value(json_object_get(s, "minItems"));
        k = json_object_get(s, "maxItems");
        int max = k ? (int)json_integer_value(k) : min + 3;
        if (max > min + 3)
            max = min + 3;
        int n = min + (int)sc_rand(g, (uint32_t)(max - min + 1));
        json_t *items = json_object_get(s, "items");
        sc_puts(g, "[");
        sc_ws(g);
        for (int i = 0; i < n; i++) {
            if (i) {
                sc_puts(g, ",");
                sc_ws(g);
            }
            if (items)
                sc_value(g, root, items, depth + 1);
            else
                sc_any(g, depth + 1);
            sc_ws(g);
        }
        sc_puts(g, "]");
    } else { /* object */
        json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
        json_t *addl = json_object_get(s, "additionalProperties");
        sc_puts(g, "{");
        sc_ws(g);
        int n = 0;
        if (props && json_object_size(props)) {
            const char *key;
            json_t *ps;
            json_object_foreach(props, key, ps) {
                bool required = false;
                size_t i;
                json_t *e;
                json_array_foreach(req, i, e) required |= !strcmp(json_string_value(e), key);
                if (!required && sc_rand(g, 2))
                    continue;
                if (n++) {
                    sc_puts(g, ",");
                    sc_ws(g);
                }
                json_t *jk = json_string(key);
                char *kt = json_dumps(jk, JSON_ENCODE_ANY);
                sc_puts(g, kt);
                free(kt);
                json_decref(jk);
                sc_ws(g);
                sc_puts(g, ":");
                sc_ws(g);
                sc_value(g, root, ps, depth + 1);
                sc_ws(g);
            }
        } else if (!json_is_false(addl)) {
            int m = (int)sc_rand(g, 3);
            for (int i = 0; i < m; i++) {
                if (i) {
                    sc_puts(g, ",");
                    sc_ws(g);
                }
                char key[16];
                snprintf(key, sizeof key, "\"k%d\"", i);
                sc_puts(g, key);
                sc_ws(g);
                sc_puts(g, ":");
                sc_ws(g);
                if (json_is_object(addl))
                    sc_value(g, root, addl, depth + 1);
                else
                    sc_any(g, depth + 1);
                sc_ws(g);
            }
        }
        sc_puts(g, "}");
    }
}

static void sc_value(sc_gen *g, json_t *root, json_t *s, int depth)
{
    json_t *k;
    if (json_is_true(s) || !json_is_object(s)) {
        sc_any(g, depth);
        return;
    }
    if ((k = json_object_get(s, "$ref"))) {
        json_t *t = sc_resolve(root, json_string_value(k));
        /* recursion: past a depth, take the schema's shortest branch (callers
         * keep recursive schemas finite: see the tests) */
        sc_value(g, root, t, depth + 1);
        return;
    }
    json_t *vals = json_object_get(s, "enum");
    if ((k = json_object_get(s, "const")) || vals) {
        json_t *v = k ? k : json_array_get(vals, sc_rand(g, (uint32_t)json_array_size(vals)));
        char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        sc_puts(g, text);
        free(text);
        return;
    }
    if ((k = json_object_get(s, "anyOf")) || (k = json_object_get(s, "oneOf"))) {
        /* deep in a recursive schema, the first branch ends recursion */
        size_t i = depth > 6 ? 0 : sc_rand(g, (uint32_t)json_array_size(k));
        sc_value(g, root, json_array_get(k, i), depth + 1);
        return;
    }
    json_t *type = json_object_get(s, "type");
    if (json_is_string(type)) {
        sc_typed(g, root, s, json_string_value(type), depth);
    } else if (json_is_array(type)) {
        sc_typed(g, root, s,
                 json_string_value(json_array_get(type, sc_rand(g, (uint32_t)json_array_size(type)))),
                 depth);
    } else if (json_object_get(s, "properties")) {
        sc_typed(g, root, s, "object", depth);
    } else {
        sc_any(g, depth);
    }
}

/* A random valid document for schema text (NULL: any object). Caller frees. */
static char *sc_generate(const char *schema_text, uint64_t seed)
{
    sc_gen g = {.rng = seed * 0x9e3779b97f4a7c15ull + 1};
    if (sc_rand(&g, 3) == 0)
        sc_ws(&g);
    json_t *s = schema_text ? json_loads(schema_text, 0, NULL) : NULL;
    if (s) {
        sc_value(&g, s, s, 0);
    } else {
        json_t *obj = json_pack("{s:s}", "type", "object");
        sc_value(&g, obj, obj, 0);
        json_decref(obj);
    }
    json_decref(s);
    return g.buf;
}

#endif
