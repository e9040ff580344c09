/*
 * text/grammar_compile.c — the first half of structured output: a JSON
 * schema compiled to the byte-level grammar of text/grammar_impl.h. The
 * matcher that runs the grammar (text/grammar_match.c) never sees a schema,
 * so everything JSON-Schema-specific, and every limit that keeps a hostile
 * schema small, lives here.
 *
 * A schema (parsed with jansson) becomes rules of sequences of byte sets and
 * rule references with alternatives. Counted repetition (minItems/maxItems,
 * minLength/maxLength, bounded digits and whitespace) is unrolled into chains
 * of rules; unbounded repetition is a right-recursive rule, which the matcher
 * runs as a tail call so the stack does not grow with the number of
 * repetitions.
 */
#include "text/text.h"
#include "text/grammar_impl.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Limits that keep a hostile schema from building a huge grammar (and
 * MAX_REPEAT, in text/grammar_impl.h). */
#define MAX_SCHEMA_DEPTH 64
#define MAX_GRAMMAR_ELEMS (4 << 20)
#define WS_MAX_INDENT 20         /* spaces/tabs after a newline               */
#define INT_MAX_DIGITS 16
#define FRAC_MAX_DIGITS 16
#define EXP_MAX_DIGITS 2

typedef struct {
    grammar_elem *v;
    size_t n, cap;
} evec;

typedef struct {
    char *name; /* a $ref string */
    int32_t rule;
} ref_entry;

typedef struct {
    evec *rules; /* body per rule: alternatives, each ended by ALT_END */
    int32_t n_rules, cap_rules;
    grammar_byteset *sets;
    int32_t n_sets, cap_sets;
    int32_t single[256]; /* set id of {b}, or -1 */
    size_t total_elems;
    /* shared fragments, built on first use (-1 before) */
    int32_t r_empty, r_ws, r_char, r_string, r_number, r_integer, r_value, r_bool, r_null;
    json_t *root_schema;
    ref_entry *refs;
    size_t n_refs, cap_refs;
    char *err;
    size_t err_len;
    int status; /* first error */
} compiler;

static int cfail(compiler *c, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int cfail(compiler *c, int rc, const char *fmt, ...)
{
    if (c->status == CAIRN_OK) {
        c->status = rc;
        if (c->err && c->err_len) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(c->err, c->err_len, fmt, ap);
            va_end(ap);
        }
    }
    return rc;
}

static int evec_push(compiler *c, evec *e, uint8_t kind, int32_t v)
{
    if (c->total_elems >= MAX_GRAMMAR_ELEMS)
        return cfail(c, CAIRN_ERANGE, "the schema expands to a grammar that is too large");
    if (e->n == e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 8;
        grammar_elem *nv = realloc(e->v, cap * sizeof *nv);
        if (!nv)
            return cfail(c, CAIRN_ENOMEM, "out of memory");
        e->v = nv;
        e->cap = cap;
    }
    e->v[e->n++] = (grammar_elem){kind, v};
    c->total_elems++;
    return CAIRN_OK;
}

/* A new rule with an empty body (no alternatives yet); returns its id. */
static int32_t new_rule(compiler *c)
{
    if (c->n_rules == c->cap_rules) {
        int32_t cap = c->cap_rules ? c->cap_rules * 2 : 64;
        evec *nr = realloc(c->rules, (size_t)cap * sizeof *nr);
        if (!nr)
            return cfail(c, CAIRN_ENOMEM, "out of memory");
        c->rules = nr;
        c->cap_rules = cap;
    }
    c->rules[c->n_rules] = (evec){0};
    return c->n_rules++;
}

static int32_t set_id(compiler *c, const grammar_byteset *s)
{
    for (int32_t i = 0; i < c->n_sets; i++)
        if (memcmp(&c->sets[i], s, sizeof *s) == 0)
            return i;
    if (c->n_sets == c->cap_sets) {
        int32_t cap = c->cap_sets ? c->cap_sets * 2 : 32;
        grammar_byteset *ns = realloc(c->sets, (size_t)cap * sizeof *ns);
        if (!ns)
            return cfail(c, CAIRN_ENOMEM, "out of memory");
        c->sets = ns;
        c->cap_sets = cap;
    }
    c->sets[c->n_sets] = *s;
    return c->n_sets++;
}

static void bs_add(grammar_byteset *s, int lo, int hi)
{
    for (int b = lo; b <= hi; b++)
        s->bits[b >> 6] |= 1ull << (b & 63);
}

/* Append to rule r's current alternative. */
static int add_range(compiler *c, int32_t r, int lo, int hi)
{
    grammar_byteset s = {{0}};
    bs_add(&s, lo, hi);
    int32_t id = set_id(c, &s);
    return id < 0 ? id : evec_push(c, &c->rules[r], GRAMMAR_SET, id);
}

static int add_set(compiler *c, int32_t r, const grammar_byteset *s)
{
    int32_t id = set_id(c, s);
    return id < 0 ? id : evec_push(c, &c->rules[r], GRAMMAR_SET, id);
}

static int add_lit(compiler *c, int32_t r, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)s[i];
        if (c->single[b] < 0) {
            grammar_byteset one = {{0}};
            bs_add(&one, b, b);
            if ((c->single[b] = set_id(c, &one)) < 0)
                return c->single[b];
        }
        int rc = evec_push(c, &c->rules[r], GRAMMAR_SET, c->single[b]);
        if (rc)
            return rc;
    }
    return CAIRN_OK;
}

static int add_cstr(compiler *c, int32_t r, const char *s) { return add_lit(c, r, s, strlen(s)); }

static int add_ref(compiler *c, int32_t r, int32_t target)
{
    if (target < 0)
        return target;
    return evec_push(c, &c->rules[r], GRAMMAR_REF, target);
}

static int end_alt(compiler *c, int32_t r) { return evec_push(c, &c->rules[r], GRAMMAR_ALT_END, 0); }

/* A rule with the one empty alternative. */
static int32_t rule_empty(compiler *c)
{
    if (c->r_empty >= 0)
        return c->r_empty;
    int32_t r = new_rule(c);
    if (r < 0 || end_alt(c, r))
        return c->status;
    return c->r_empty = r;
}

/* `rest(kmin, kmax)`: between kmin and kmax (-1: unbounded) repetitions of
 * [sep] item. Unrolled into a chain, ending in a right-recursive rule when
 * unbounded. */
static int32_t rule_rest(compiler *c, int32_t item, int32_t sep, int kmin, int kmax)
{
    if (kmax == 0)
        return rule_empty(c);
    int32_t r = new_rule(c);
    if (r < 0)
        return r;
    int32_t next = r; /* unbounded without a minimum: the rule repeats itself */
    if (!(kmin == 0 && kmax < 0)) {
        next = rule_rest(c, item, sep, kmin > 0 ? kmin - 1 : 0, kmax < 0 ? -1 : kmax - 1);
        if (next < 0)
            return next;
    }
    if ((sep >= 0 && add_ref(c, r, sep)) || add_ref(c, r, item) || add_ref(c, r, next) ||
        end_alt(c, r))
        return c->status;
    if (kmin == 0 && end_alt(c, r))
        return c->status;
    return r;
}

/* item ([sep] item)*, between min and max items (max -1: unbounded). */
static int32_t rule_repeat(compiler *c, int32_t item, int32_t sep, int min, int max)
{
    if (item < 0)
        return item;
    if (max == 0)
        return rule_empty(c);
    int32_t rest = rule_rest(c, item, sep, min > 0 ? min - 1 : 0, max < 0 ? -1 : max - 1);
    int32_t r = rest < 0 ? rest : new_rule(c);
    if (r < 0)
        return r;
    if (add_ref(c, r, item) || add_ref(c, r, rest) || end_alt(c, r))
        return c->status;
    if (min == 0 && end_alt(c, r))
        return c->status;
    return r;
}

/* A rule matching exactly these bytes. */
static int32_t rule_lit(compiler *c, const char *s, size_t n)
{
    int32_t r = new_rule(c);
    if (r < 0 || add_lit(c, r, s, n) || end_alt(c, r))
        return c->status ? c->status : r;
    return r;
}

static int32_t rule_range(compiler *c, int lo, int hi)
{
    int32_t r = new_rule(c);
    if (r < 0 || add_range(c, r, lo, hi) || end_alt(c, r))
        return c->status ? c->status : r;
    return r;
}

/* Whitespace between tokens: nothing, one space, or one newline followed
 * by at most WS_MAX_INDENT spaces or tabs — enough for pretty-printing, and
 * bounded so a model cannot loop on whitespace. */
static int32_t rule_ws(compiler *c)
{
    if (c->r_ws >= 0)
        return c->r_ws;
    grammar_byteset indent = {{0}};
    bs_add(&indent, ' ', ' ');
    bs_add(&indent, '\t', '\t');
    int32_t ind = new_rule(c);
    if (ind < 0 || add_set(c, ind, &indent) || end_alt(c, ind))
        return c->status;
    int32_t ind_rep = rule_repeat(c, ind, -1, 0, WS_MAX_INDENT);
    int32_t r = ind_rep < 0 ? ind_rep : new_rule(c);
    if (r < 0 || end_alt(c, r) || add_cstr(c, r, " ") || end_alt(c, r) || add_cstr(c, r, "\n") ||
        add_ref(c, r, ind_rep) || end_alt(c, r))
        return c->status;
    return c->r_ws = r;
}

/* One character of a JSON string: plain bytes (no '"', '\\' or control
 * byte), an escape (\uXXXX never a surrogate, so each escape is one code
 * point and counted lengths agree with validators), or a well-formed UTF-8
 * multi-byte character (no overlongs, no surrogates, nothing past U+10FFFF). */
static int32_t rule_char(compiler *c)
{
    if (c->r_char >= 0)
        return c->r_char;
    int32_t r = new_rule(c);
    if (r < 0)
        return r;
    grammar_byteset plain = {{0}}, esc = {{0}}, hex = {{0}}, hex_lead = {{0}};
    bs_add(&plain, 0x20, 0x7f);
    plain.bits['"' >> 6] &= ~(1ull << ('"' & 63));
    plain.bits['\\' >> 6] &= ~(1ull << ('\\' & 63));
    for (const char *p = "\"\\/bfnrt"; *p; p++)
        bs_add(&esc, (uint8_t)*p, (uint8_t)*p);
    bs_add(&hex, '0', '9');
    bs_add(&hex, 'a', 'f');
    bs_add(&hex, 'A', 'F');
    hex_lead = hex;
    hex_lead.bits['d' >> 6] &= ~(1ull << ('d' & 63));
    hex_lead.bits['D' >> 6] &= ~(1ull << ('D' & 63));
    if (add_set(c, r, &plain) || end_alt(c, r) ||
        add_cstr(c, r, "\\") || add_set(c, r, &esc) || end_alt(c, r) ||
        add_cstr(c, r, "\\u") || add_set(c, r, &hex_lead) || add_set(c, r, &hex) ||
        add_set(c, r, &hex) || add_set(c, r, &hex) || end_alt(c, r) ||
        add_cstr(c, r, "\\u") || add_range(c, r, 'd', 'd') || add_range(c, r, '0', '7') ||
        add_set(c, r, &hex) || add_set(c, r, &hex) || end_alt(c, r) ||
        add_cstr(c, r, "\\u") || add_range(c, r, 'D', 'D') || add_range(c, r, '0', '7') ||
        add_set(c, r, &hex) || add_set(c, r, &hex) || end_alt(c, r))
        return c->status;
    /* UTF-8: lead byte ranges and the continuation range each allows */
    static const struct {
        uint8_t lead_lo, lead_hi, c1_lo, c1_hi, n_cont;
    } utf8[] = {
        {0xc2, 0xdf, 0x80, 0xbf, 1}, {0xe0, 0xe0, 0xa0, 0xbf, 2}, {0xe1, 0xec, 0x80, 0xbf, 2},
        {0xed, 0xed, 0x80, 0x9f, 2}, {0xee, 0xef, 0x80, 0xbf, 2}, {0xf0, 0xf0, 0x90, 0xbf, 3},
        {0xf1, 0xf3, 0x80, 0xbf, 3}, {0xf4, 0xf4, 0x80, 0x8f, 3},
    };
    for (size_t i = 0; i < sizeof utf8 / sizeof utf8[0]; i++) {
        if (add_range(c, r, utf8[i].lead_lo, utf8[i].lead_hi) ||
            add_range(c, r, utf8[i].c1_lo, utf8[i].c1_hi))
            return c->status;
        for (int k = 1; k < utf8[i].n_cont; k++)
            if (add_range(c, r, 0x80, 0xbf))
                return c->status;
        if (end_alt(c, r))
            return c->status;
    }
    return c->r_char = r;
}

static int32_t rule_string(compiler *c, int min_len, int max_len)
{
    bool free_form = min_len == 0 && max_len < 0;
    if (free_form && c->r_string >= 0)
        return c->r_string;
    int32_t chars = rule_repeat(c, rule_char(c), -1, min_len, max_len);
    int32_t r = chars < 0 ? chars : new_rule(c);
    if (r < 0 || add_cstr(c, r, "\"") || add_ref(c, r, chars) || add_cstr(c, r, "\"") ||
        end_alt(c, r))
        return c->status;
    if (free_form)
        c->r_string = r;
    return r;
}

/* -?(0|[1-9][0-9]{0,15}): integer digits are bounded so a model cannot
 * emit digits forever. */
static int32_t rule_integer(compiler *c)
{
    if (c->r_integer >= 0)
        return c->r_integer;
    int32_t digit = rule_range(c, '0', '9');
    int32_t more = rule_repeat(c, digit, -1, 0, INT_MAX_DIGITS - 1);
    int32_t uint = more < 0 ? more : new_rule(c);
    if (uint < 0 || add_cstr(c, uint, "0") || end_alt(c, uint) || add_range(c, uint, '1', '9') ||
        add_ref(c, uint, more) || end_alt(c, uint))
        return c->status;
    int32_t r = new_rule(c);
    if (r < 0 || add_ref(c, r, uint) || end_alt(c, r) || add_cstr(c, r, "-") ||
        add_ref(c, r, uint) || end_alt(c, r))
        return c->status;
    return c->r_integer = r;
}

static int32_t rule_number(compiler *c)
{
    if (c->r_number >= 0)
        return c->r_number;
    int32_t integer = rule_integer(c);
    int32_t digit = rule_range(c, '0', '9');
    int32_t frac_digits = rule_repeat(c, digit, -1, 1, FRAC_MAX_DIGITS);
    int32_t exp_digits = rule_repeat(c, digit, -1, 1, EXP_MAX_DIGITS);
    if (integer < 0 || frac_digits < 0 || exp_digits < 0)
        return c->status;
    int32_t frac = new_rule(c);
    if (frac < 0 || end_alt(c, frac) || add_cstr(c, frac, ".") || add_ref(c, frac, frac_digits) ||
        end_alt(c, frac))
        return c->status;
    grammar_byteset e = {{0}}, sign = {{0}};
    bs_add(&e, 'e', 'e');
    bs_add(&e, 'E', 'E');
    bs_add(&sign, '+', '+');
    bs_add(&sign, '-', '-');
    int32_t exp = new_rule(c);
    if (exp < 0 || end_alt(c, exp) || add_set(c, exp, &e) || add_ref(c, exp, exp_digits) ||
        end_alt(c, exp) || add_set(c, exp, &e) || add_set(c, exp, &sign) ||
        add_ref(c, exp, exp_digits) || end_alt(c, exp))
        return c->status;
    int32_t r = new_rule(c);
    if (r < 0 || add_ref(c, r, integer) || add_ref(c, r, frac) || add_ref(c, r, exp) ||
        end_alt(c, r))
        return c->status;
    return c->r_number = r;
}

/* "{" ws [ entry ws ("," ws entry ws)* ] "}" for a given entry rule, and the
 * same with brackets for arrays. */
static int32_t rule_container(compiler *c, const char *open, const char *close, int32_t entry,
                              int min, int max)
{
    int32_t ws = rule_ws(c);
    if (entry < 0 || ws < 0)
        return c->status;
    int32_t entry_ws = new_rule(c);
    if (entry_ws < 0 || add_ref(c, entry_ws, entry) || add_ref(c, entry_ws, ws) ||
        end_alt(c, entry_ws))
        return c->status;
    int32_t comma = new_rule(c);
    if (comma < 0 || add_cstr(c, comma, ",") || add_ref(c, comma, ws) || end_alt(c, comma))
        return c->status;
    int32_t list = rule_repeat(c, entry_ws, comma, min, max);
    int32_t r = list < 0 ? list : new_rule(c);
    if (r < 0 || add_cstr(c, r, open) || add_ref(c, r, ws) || add_ref(c, r, list) ||
        add_cstr(c, r, close) || end_alt(c, r))
        return c->status;
    return r;
}

/* key ws ":" ws value: the member of a free-form object. */
static int32_t rule_member(compiler *c, int32_t key, int32_t value)
{
    int32_t ws = rule_ws(c);
    int32_t r = ws < 0 ? ws : new_rule(c);
    if (r < 0 || key < 0 || value < 0 || add_ref(c, r, key) || add_ref(c, r, ws) ||
        add_cstr(c, r, ":") || add_ref(c, r, ws) || add_ref(c, r, value) || end_alt(c, r))
        return c->status;
    return r;
}

/* Any JSON value (json_object mode's members, schemas without a type). */
static int32_t rule_value(compiler *c)
{
    if (c->r_value >= 0)
        return c->r_value;
    int32_t r = c->r_value = new_rule(c); /* set first: objects and arrays recurse */
    if (r < 0)
        return r;
    int32_t obj = rule_container(c, "{", "}", rule_member(c, rule_string(c, 0, -1), r), 0, -1);
    int32_t arr = rule_container(c, "[", "]", r, 0, -1);
    if (obj < 0 || arr < 0)
        return c->status;
    if (add_ref(c, r, obj) || end_alt(c, r) || add_ref(c, r, arr) || end_alt(c, r) ||
        add_ref(c, r, rule_string(c, 0, -1)) || end_alt(c, r) ||
        add_ref(c, r, rule_number(c)) || end_alt(c, r) || add_cstr(c, r, "true") ||
        end_alt(c, r) || add_cstr(c, r, "false") || end_alt(c, r) || add_cstr(c, r, "null") ||
        end_alt(c, r))
        return c->status;
    return r;
}

static int32_t rule_any_object(compiler *c)
{
    return rule_container(c, "{", "}", rule_member(c, rule_string(c, 0, -1), rule_value(c)), 0,
                          -1);
}

/* ---- schemas -------------------------------------------------------------- */

static int32_t compile_schema(compiler *c, json_t *s, int depth);

static const char *const annotation_keywords[] = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment",
    "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "format",
};
static const char *const known_keywords[] = {
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
    "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "minLength", "maxLength",
};

static bool is_annotation(const char *k)
{
    for (size_t i = 0; i < sizeof annotation_keywords / sizeof *annotation_keywords; i++)
        if (strcmp(k, annotation_keywords[i]) == 0)
            return true;
    return false;
}

static int check_keywords(compiler *c, json_t *s)
{
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) {
        (void)v;
        bool known = is_annotation(k);
        for (size_t i = 0; !known && i < sizeof known_keywords / sizeof *known_keywords; i++)
            known = strcmp(k, known_keywords[i]) == 0;
        if (!known)
            return cfail(c, CAIRN_EUNSUPPORTED, "JSON-schema keyword '%s' is not supported", k);
    }
    return CAIRN_OK;
}

/* Only annotations besides `except` (for anyOf/oneOf/allOf/$ref/enum/const,
 * whose combination with other constraints cairn does not intersect). */
static int check_alone(compiler *c, json_t *s, const char *except)
{
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) {
        (void)v;
        if (strcmp(k, except) != 0 && !is_annotation(k) &&
            !((strcmp(except, "enum") == 0 || strcmp(except, "const") == 0) &&
              strcmp(k, "type") == 0))
            return cfail(c, CAIRN_EUNSUPPORTED, "'%s' combined with '%s' is not supported", except,
                         k);
    }
    return CAIRN_OK;
}

static int get_count(compiler *c, json_t *s, const char *key, int dflt, int *out)
{
    json_t *v = json_object_get(s, key);
    if (!v) {
        *out = dflt;
        return CAIRN_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return cfail(c, CAIRN_EINVAL, "'%s' must be a non-negative integer", key);
    if (json_integer_value(v) > MAX_REPEAT)
        return cfail(c, CAIRN_EUNSUPPORTED, "'%s' above %d is not supported", key, MAX_REPEAT);
    *out = (int)json_integer_value(v);
    return CAIRN_OK;
}

/* The rule for a literal JSON value (enum, const): its compact serialization. */
static int32_t rule_json_literal(compiler *c, json_t *v)
{
    char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text)
        return cfail(c, CAIRN_ENOMEM, "out of memory");
    int32_t r = rule_lit(c, text, strlen(text));
    free(text);
    return r;
}

static bool json_has_type(json_t *v, const char *t)
{
    if (strcmp(t, "null") == 0) return json_is_null(v);
    if (strcmp(t, "boolean") == 0) return json_is_boolean(v);
    if (strcmp(t, "string") == 0) return json_is_string(v);
    if (strcmp(t, "object") == 0) return json_is_object(v);
    if (strcmp(t, "array") == 0) return json_is_array(v);
    if (strcmp(t, "number") == 0) return json_is_number(v);
    if (strcmp(t, "integer") == 0)
        return json_is_integer(v) || (json_is_real(v) && floor(json_real_value(v)) == json_real_value(v));
    return false;
}

static bool type_allows(json_t *type, json_t *v)
{
    if (!type)
        return true;
    if (json_is_string(type))
        return json_has_type(v, json_string_value(type));
    size_t i;
    json_t *t;
    json_array_foreach(type, i, t)
        if (json_is_string(t) && json_has_type(v, json_string_value(t)))
            return true;
    return false;
}

static int32_t compile_enum(compiler *c, json_t *s, json_t *values, const char *kw)
{
    json_t *type = json_object_get(s, "type");
    int32_t r = new_rule(c);
    if (r < 0)
        return r;
    size_t i, n = 0;
    json_t *v;
    json_array_foreach(values, i, v) {
        if (!type_allows(type, v))
            continue; /* a value of another type could never validate */
        if (add_ref(c, r, rule_json_literal(c, v)) || end_alt(c, r))
            return c->status;
        n++;
    }
    if (n == 0)
        return cfail(c, CAIRN_EINVAL, "'%s' allows no value of the schema's type", kw);
    return r;
}

static int32_t compile_object(compiler *c, json_t *s, int depth)
{
    json_t *props = json_object_get(s, "properties");
    json_t *required = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return cfail(c, CAIRN_EINVAL, "'properties' must be an object");
    if (required && !json_is_array(required))
        return cfail(c, CAIRN_EINVAL, "'required' must be an array");
    if (addl && !json_is_boolean(addl) && !json_is_object(addl))
        return cfail(c, CAIRN_EINVAL, "'additionalProperties' must be a boolean or a schema");
    size_t n_props = props ? json_object_size(props) : 0;
    size_t ri;
    json_t *rv;
    if (required)
        json_array_foreach(required, ri, rv) {
            if (!json_is_string(rv))
                return cfail(c, CAIRN_EINVAL, "'required' must hold strings");
            if (!props || !json_object_get(props, json_string_value(rv)))
                return cfail(c, CAIRN_EUNSUPPORTED,
                             "required property '%s' has no schema in 'properties'",
                             json_string_value(rv));
        }
    if (n_props == 0) {
        /* No declared properties: free keys with values of
         * additionalProperties' schema (any value when true or absent). */
        if (json_is_false(addl))
            return rule_lit(c, "{}", 2); /* the only object allowed */
        int32_t value = json_is_object(addl) ? compile_schema(c, addl, depth + 1) : rule_value(c);
        return rule_container(c, "{", "}", rule_member(c, rule_string(c, 0, -1), value), 0, -1);
    }
    /* Declared properties, emitted in schema order; optional ones may be
     * left out. Extra properties are never generated (valid whether or not
     * additionalProperties allows them). first[i]: properties i.. with none
     * emitted before; later[i]: the same after one was (a comma first). */
    int32_t ws = rule_ws(c);
    if (ws < 0)
        return ws;
    int32_t *first = calloc(n_props + 1, sizeof *first);
    int32_t *later = calloc(n_props + 1, sizeof *later);
    int32_t *kv = calloc(n_props, sizeof *kv);
    bool *req = calloc(n_props, sizeof *req);
    int32_t result = CAIRN_ENOMEM;
    if (!first || !later || !kv || !req) {
        cfail(c, CAIRN_ENOMEM, "out of memory");
        goto out;
    }
    size_t i = 0;
    const char *key;
    json_t *sub;
    json_object_foreach(props, key, sub) {
        req[i] = false;
        if (required)
            json_array_foreach(required, ri, rv)
                if (strcmp(json_string_value(rv), key) == 0)
                    req[i] = true;
        json_t *jkey = json_string(key);
        char *key_text = jkey ? json_dumps(jkey, JSON_ENCODE_ANY) : NULL;
        json_decref(jkey);
        if (!key_text) {
            result = cfail(c, CAIRN_ENOMEM, "out of memory");
            goto out;
        }
        int32_t value = compile_schema(c, sub, depth + 1);
        int32_t r = value < 0 ? value : new_rule(c);
        if (r >= 0 && (add_cstr(c, r, key_text) || add_ref(c, r, ws) || add_cstr(c, r, ":") ||
                       add_ref(c, r, ws) || add_ref(c, r, value) || add_ref(c, r, ws) ||
                       end_alt(c, r)))
            r = c->status;
        free(key_text);
        if (r < 0) {
            result = r;
            goto out;
        }
        kv[i++] = r;
    }
    first[n_props] = later[n_props] = rule_empty(c);
    for (size_t k = n_props; k-- > 0;) {
        int32_t f = new_rule(c), l = f < 0 ? f : new_rule(c);
        if (l < 0) {
            result = l;
            goto out;
        }
        if (add_ref(c, f, kv[k]) || add_ref(c, f, later[k + 1]) || end_alt(c, f) ||
            (!req[k] && (add_ref(c, f, first[k + 1]) || end_alt(c, f))) ||
            add_cstr(c, l, ",") || add_ref(c, l, ws) || add_ref(c, l, kv[k]) ||
            add_ref(c, l, later[k + 1]) || end_alt(c, l) ||
            (!req[k] && (add_ref(c, l, later[k + 1]) || end_alt(c, l)))) {
            result = c->status;
            goto out;
        }
        first[k] = f;
        later[k] = l;
    }
    int32_t r = new_rule(c);
    if (r >= 0 && (add_cstr(c, r, "{") || add_ref(c, r, ws) || add_ref(c, r, first[0]) ||
                   add_cstr(c, r, "}") || end_alt(c, r)))
        r = c->status;
    result = r;
out:
    free(first);
    free(later);
    free(kv);
    free(req);
    return result;
}

static int32_t compile_type(compiler *c, json_t *s, const char *type, int depth)
{
    if (strcmp(type, "string") == 0) {
        int min_len, max_len;
        if (get_count(c, s, "minLength", 0, &min_len) || get_count(c, s, "maxLength", -1, &max_len))
            return c->status;
        if (max_len >= 0 && max_len < min_len)
            return cfail(c, CAIRN_EINVAL, "'maxLength' is below 'minLength'");
        return rule_string(c, min_len, max_len);
    }
    if (strcmp(type, "number") == 0)
        return rule_number(c);
    if (strcmp(type, "integer") == 0)
        return rule_integer(c);
    if (strcmp(type, "boolean") == 0) {
        if (c->r_bool < 0) {
            int32_t r = new_rule(c);
            if (r < 0 || add_cstr(c, r, "true") || end_alt(c, r) || add_cstr(c, r, "false") ||
                end_alt(c, r))
                return c->status;
            c->r_bool = r;
        }
        return c->r_bool;
    }
    if (strcmp(type, "null") == 0) {
        if (c->r_null < 0)
            c->r_null = rule_lit(c, "null", 4);
        return c->r_null;
    }
    if (strcmp(type, "object") == 0)
        return compile_object(c, s, depth);
    if (strcmp(type, "array") == 0) {
        int min_items, max_items;
        json_t *items = json_object_get(s, "items");
        if (get_count(c, s, "minItems", 0, &min_items) || get_count(c, s, "maxItems", -1, &max_items))
            return c->status;
        if (max_items >= 0 && max_items < min_items)
            return cfail(c, CAIRN_EINVAL, "'maxItems' is below 'minItems'");
        if (items && !json_is_object(items) && !json_is_true(items))
            return cfail(c, CAIRN_EINVAL, "'items' must be a schema");
        int32_t item = items && json_is_object(items) ? compile_schema(c, items, depth + 1)
                                                      : rule_value(c);
        return rule_container(c, "[", "]", item, min_items, max_items);
    }
    return cfail(c, CAIRN_EINVAL, "unknown type '%s'", type);
}

/* "#", "#/$defs/NAME" or "#/definitions/NAME" (with ~0 ~1 escapes). */
static int32_t compile_ref(compiler *c, const char *ref, int depth)
{
    for (size_t i = 0; i < c->n_refs; i++)
        if (strcmp(c->refs[i].name, ref) == 0)
            return c->refs[i].rule;
    json_t *target = NULL;
    if (strcmp(ref, "#") == 0) {
        target = c->root_schema;
    } else {
        const char *name = NULL;
        json_t *defs = NULL;
        if (strncmp(ref, "#/$defs/", 8) == 0) {
            defs = json_object_get(c->root_schema, "$defs");
            name = ref + 8;
        } else if (strncmp(ref, "#/definitions/", 14) == 0) {
            defs = json_object_get(c->root_schema, "definitions");
            name = ref + 14;
        }
        if (!name || strchr(name, '/'))
            return cfail(c, CAIRN_EUNSUPPORTED,
                         "$ref '%s' is not supported (only #, #/$defs/NAME, #/definitions/NAME)",
                         ref);
        char unescaped[256];
        size_t n = 0;
        for (const char *p = name; *p && n + 1 < sizeof unescaped; p++) {
            if (p[0] == '~' && (p[1] == '0' || p[1] == '1')) {
                unescaped[n++] = p[1] == '0' ? '~' : '/';
                p++;
            } else {
                unescaped[n++] = *p;
            }
        }
        unescaped[n] = '\0';
        target = json_is_object(defs) ? json_object_get(defs, unescaped) : NULL;
    }
    if (!target)
        return cfail(c, CAIRN_EINVAL, "$ref '%s' points to nothing", ref);
    if (c->n_refs == c->cap_refs) {
        size_t cap = c->cap_refs ? c->cap_refs * 2 : 8;
        ref_entry *nr = realloc(c->refs, cap * sizeof *nr);
        if (!nr)
            return cfail(c, CAIRN_ENOMEM, "out of memory");
        c->refs = nr;
        c->cap_refs = cap;
    }
    /* The rule exists before its body so recursive references find it. */
    int32_t r = new_rule(c);
    char *copy = r < 0 ? NULL : strdup(ref);
    if (!copy)
        return cfail(c, CAIRN_ENOMEM, "out of memory");
    c->refs[c->n_refs++] = (ref_entry){copy, r};
    int32_t body = compile_schema(c, target, depth + 1);
    if (body < 0 || add_ref(c, r, body) || end_alt(c, r))
        return c->status;
    return r;
}

static int32_t compile_schema(compiler *c, json_t *s, int depth)
{
    if (c->status)
        return c->status;
    if (depth > MAX_SCHEMA_DEPTH)
        return cfail(c, CAIRN_EUNSUPPORTED, "the schema nests deeper than %d", MAX_SCHEMA_DEPTH);
    if (json_is_true(s))
        return rule_value(c);
    if (json_is_false(s))
        return cfail(c, CAIRN_EINVAL, "the schema 'false' allows no value");
    if (!json_is_object(s))
        return cfail(c, CAIRN_EINVAL, "a schema must be an object or a boolean");
    if (check_keywords(c, s))
        return c->status;
    json_t *v;
    if ((v = json_object_get(s, "$ref"))) {
        if (!json_is_string(v))
            return cfail(c, CAIRN_EINVAL, "'$ref' must be a string");
        if (check_alone(c, s, "$ref"))
            return c->status;
        return compile_ref(c, json_string_value(v), depth);
    }
    if ((v = json_object_get(s, "const"))) {
        if (check_alone(c, s, "const"))
            return c->status;
        json_t *one = json_array();
        if (!one || json_array_append(one, v)) {
            json_decref(one);
            return cfail(c, CAIRN_ENOMEM, "out of memory");
        }
        int32_t r = compile_enum(c, s, one, "const");
        json_decref(one);
        return r;
    }
    if ((v = json_object_get(s, "enum"))) {
        if (!json_is_array(v) || json_array_size(v) == 0)
            return cfail(c, CAIRN_EINVAL, "'enum' must be a non-empty array");
        if (check_alone(c, s, "enum"))
            return c->status;
        return compile_enum(c, s, v, "enum");
    }
    static const char *const combinators[] = {"anyOf", "oneOf", "allOf"};
    for (int k = 0; k < 3; k++) {
        if (!(v = json_object_get(s, combinators[k])))
            continue;
        if (!json_is_array(v) || json_array_size(v) == 0)
            return cfail(c, CAIRN_EINVAL, "'%s' must be a non-empty array", combinators[k]);
        if (check_alone(c, s, combinators[k]))
            return c->status;
        if (k == 2) { /* allOf: only the trivial one-schema case */
            if (json_array_size(v) != 1)
                return cfail(c, CAIRN_EUNSUPPORTED,
                             "'allOf' with more than one schema is not supported");
            return compile_schema(c, json_array_get(v, 0), depth + 1);
        }
        /* oneOf is compiled as anyOf: the branches are meant to be disjoint
         * (documented in text/text.h). */
        int32_t r = new_rule(c);
        size_t i;
        json_t *sub;
        json_array_foreach(v, i, sub)
            if (r < 0 || add_ref(c, r, compile_schema(c, sub, depth + 1)) || end_alt(c, r))
                return c->status;
        return r;
    }
    json_t *type = json_object_get(s, "type");
    if (!type) {
        /* No type: infer it from the keywords present, else any value. */
        const char *inferred = NULL;
        if (json_object_get(s, "properties") || json_object_get(s, "additionalProperties") ||
            json_object_get(s, "required"))
            inferred = "object";
        else if (json_object_get(s, "items") || json_object_get(s, "minItems") ||
                 json_object_get(s, "maxItems"))
            inferred = "array";
        else if (json_object_get(s, "minLength") || json_object_get(s, "maxLength"))
            inferred = "string";
        return inferred ? compile_type(c, s, inferred, depth) : rule_value(c);
    }
    if (json_is_string(type))
        return compile_type(c, s, json_string_value(type), depth);
    if (!json_is_array(type) || json_array_size(type) == 0)
        return cfail(c, CAIRN_EINVAL, "'type' must be a string or a non-empty array of strings");
    int32_t r = new_rule(c);
    size_t i;
    json_t *t;
    json_array_foreach(type, i, t) {
        if (!json_is_string(t))
            return cfail(c, CAIRN_EINVAL, "'type' must hold strings");
        if (r < 0 || add_ref(c, r, compile_type(c, s, json_string_value(t), depth)) ||
            end_alt(c, r))
            return c->status;
    }
    return r;
}

/* Flatten the rule bodies into one element array. */
static int link_grammar(compiler *c, int32_t root, cairn_grammar **out)
{
    cairn_grammar *g = calloc(1, sizeof *g);
    if (g)
        atomic_init(&g->refs, 1);
    size_t n = 0;
    for (int32_t r = 0; r < c->n_rules; r++)
        n += c->rules[r].n + 1;
    if (!g || !(g->elems = malloc(n * sizeof *g->elems)) ||
        !(g->rule_start = malloc((size_t)(c->n_rules ? c->n_rules : 1) * sizeof *g->rule_start)) ||
        !(g->sets = malloc((size_t)(c->n_sets ? c->n_sets : 1) * sizeof *g->sets))) {
        cairn_grammar_free(g);
        return cfail(c, CAIRN_ENOMEM, "out of memory");
    }
    size_t at = 0;
    for (int32_t r = 0; r < c->n_rules; r++) {
        g->rule_start[r] = (int32_t)at;
        if (c->rules[r].n == 0) { /* a rule never given a body: matches nothing */
            cairn_grammar_free(g);
            return cfail(c, CAIRN_EINVAL, "internal: an empty rule");
        }
        memcpy(g->elems + at, c->rules[r].v, c->rules[r].n * sizeof *g->elems);
        at += c->rules[r].n;
        g->elems[at++] = (grammar_elem){GRAMMAR_RULE_END, 0};
    }
    memcpy(g->sets, c->sets, (size_t)c->n_sets * sizeof *g->sets);
    g->n_elems = (int32_t)at;
    g->n_rules = c->n_rules;
    g->n_sets = c->n_sets;
    g->root = root;
    *out = g;
    return CAIRN_OK;
}

int cairn_grammar_from_json_schema(const char *schema_json, size_t len, cairn_grammar **out,
                                   char *err, size_t err_len)
{
    if (!out)
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "no output pointer");
    *out = NULL;
    if (err && err_len)
        err[0] = '\0';
    compiler c = {.r_empty = -1, .r_ws = -1, .r_char = -1, .r_string = -1, .r_number = -1,
                  .r_integer = -1, .r_value = -1, .r_bool = -1, .r_null = -1,
                  .err = err, .err_len = err_len};
    memset(c.single, -1, sizeof c.single);
    json_t *schema = NULL;
    if (schema_json) {
        json_error_t jerr;
        schema = json_loadb(schema_json, len, JSON_DECODE_ANY, &jerr);
        if (!schema)
            return cairn_errorf(err, err_len, CAIRN_EINVAL, "the schema is not JSON: %s (line %d)",
                                jerr.text, jerr.line);
    }
    c.root_schema = schema;
    /* Document: bounded leading whitespace, then the value; nothing after. */
    int32_t value = schema ? compile_schema(&c, schema, 0) : rule_any_object(&c);
    int32_t ws = value < 0 ? value : rule_ws(&c);
    int32_t root = ws < 0 ? ws : new_rule(&c);
    if (root >= 0 && (add_ref(&c, root, ws) || add_ref(&c, root, value) || end_alt(&c, root)))
        root = c.status;
    int rc = root < 0 ? (c.status ? c.status : root) : link_grammar(&c, root, out);
    for (int32_t r = 0; r < c.n_rules; r++)
        free(c.rules[r].v);
    free(c.rules);
    free(c.sets);
    for (size_t i = 0; i < c.n_refs; i++)
        free(c.refs[i].name);
    free(c.refs);
    json_decref(schema);
    return rc;
}

cairn_grammar *cairn_grammar_retain(cairn_grammar *g)
{
    if (g)
        atomic_fetch_add(&g->refs, 1);
    return g;
}

void cairn_grammar_free(cairn_grammar *g)
{
    if (!g || atomic_fetch_sub(&g->refs, 1) > 1)
        return;
    free(g->elems);
    free(g->rule_start);
    free(g->sets);
    free(g);
}
