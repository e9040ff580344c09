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
 *
 * Two kinds of value are built differently. Bounded numbers
 * (minimum/maximum/exclusive*) are digit-range rules over decimal strings,
 * exact under the comparison validators make (see "bounded numbers").
 * Strings with a pattern or a known format become a DFA over code points
 * (text/grammar_regex.c), intersected when both are given, then one rule
 * per (DFA state, characters so far) so that minLength/maxLength count
 * code points along it; a DFA keeps the matcher at one stack however
 * ambiguous the pattern.
 */
#include "text/text.h"
#include "text/grammar_impl.h"

#include <jansson.h>
#include <float.h>
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

/* ---- bounded numbers -------------------------------------------------------
 * minimum/maximum/exclusive* are compiled exactly as Python's jsonschema
 * (and any validator comparing parsed values) judges them: a number written
 * without '.' is an integer compared exactly with the bound; one with a
 * fraction is parsed to the nearest double first, then compared. Bounded
 * numbers are written without an exponent, so the text's magnitude is
 * plain to see: integer digits, and at most FRAC_MAX_DIGITS fraction digits.
 * Decimal arithmetic runs on digit strings (bounds may exceed int64 once
 * scaled), over a "grid" of multiples of 10^-FRAC_MAX_DIGITS. */

#define DEC_MAX 400           /* digits: a double's integer part (309) + the grid */
#define BOUND_MAX_DIGITS 40   /* integer digits a bounded number may need */

typedef struct {
    bool neg;
    char d[DEC_MAX + 2]; /* magnitude: digits, no leading zero ("0" for zero) */
} sdec;

static void dig_norm(char *d)
{
    size_t z = 0, n = strlen(d);
    while (z + 1 < n && d[z] == '0')
        z++;
    memmove(d, d + z, n - z + 1);
}

static int dig_cmp(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    if (na != nb)
        return na < nb ? -1 : 1;
    int r = strcmp(a, b);
    return r < 0 ? -1 : r > 0;
}

static void dig_inc(char *d)
{
    size_t n = strlen(d);
    for (size_t i = n; i-- > 0;) {
        if (d[i] != '9') {
            d[i]++;
            return;
        }
        d[i] = '0';
    }
    memmove(d + 1, d, n + 1);
    d[0] = '1';
}

static void dig_dec(char *d) /* d > 0 */
{
    for (size_t i = strlen(d); i-- > 0;) {
        if (d[i] != '0') {
            d[i]--;
            break;
        }
        d[i] = '9';
    }
    dig_norm(d);
}

static bool dig_zero(const char *d) { return strcmp(d, "0") == 0; }

static int sdec_cmp(const sdec *x, const sdec *y)
{
    if (x->neg != y->neg)
        return x->neg ? -1 : 1;
    int r = dig_cmp(x->d, y->d);
    return x->neg ? -r : r;
}

static void sdec_inc(sdec *x)
{
    if (!x->neg) {
        dig_inc(x->d);
    } else {
        dig_dec(x->d);
        x->neg = !dig_zero(x->d);
    }
}

static void sdec_dec(sdec *x)
{
    if (x->neg) {
        dig_inc(x->d);
    } else if (dig_zero(x->d)) {
        x->neg = true;
        strcpy(x->d, "1");
    } else {
        dig_dec(x->d);
    }
}

static void sdec_set(sdec *x, const char *text) /* "[-]digits" */
{
    x->neg = text[0] == '-';
    snprintf(x->d, sizeof x->d, "%s", text + x->neg);
    dig_norm(x->d);
    if (dig_zero(x->d))
        x->neg = false;
}

/* The integers a bound allows: the least (lower) or greatest (upper). */
static void bound_int(json_t *v, bool lower, bool excl, sdec *out)
{
    char text[DEC_MAX];
    if (json_is_integer(v)) {
        snprintf(text, sizeof text, "%lld", (long long)json_integer_value(v));
        sdec_set(out, text);
        if (excl)
            lower ? sdec_inc(out) : sdec_dec(out);
        return;
    }
    double d = json_real_value(v), r = lower ? ceil(d) : floor(d);
    snprintf(text, sizeof text, "%.0f", r);
    sdec_set(out, text);
    if (excl && r == d)
        lower ? sdec_inc(out) : sdec_dec(out);
}

/* The least (lower) or greatest double a bound allows. */
static double bound_double(json_t *v, bool lower, bool excl)
{
    double toward = lower ? INFINITY : -INFINITY;
    if (json_is_real(v)) {
        double d = json_real_value(v);
        return excl ? nextafter(d, toward) : d;
    }
    long long k = (long long)json_integer_value(v);
    double d = (double)k;
    long double kd = (long double)d, kk = (long double)k; /* exact: 64-bit significand */
    if (lower ? (excl ? kd <= kk : kd < kk) : (excl ? kd >= kk : kd > kk))
        d = nextafter(d, toward);
    return d;
}

_Static_assert(LDBL_MANT_DIG >= 64, "bounded numbers need a long double that holds int64 and "
                                    "the midpoint of two doubles exactly");

/* A decimal threshold: ±ip.fp… with fp its first FRAC_MAX_DIGITS fraction
 * digits and `more` whether any later digit is non-zero. */
typedef struct {
    bool present, incl, neg;
    char ip[DEC_MAX];
    char fp[FRAC_MAX_DIGITS + 1];
    bool more;
} threshold;

/* Texts that parse to a double >= lo (lower) or <= hi are those on the
 * right side of the midpoint between that double and its neighbour; the
 * midpoint itself rounds to the even one. */
static void make_threshold(double x, bool lower, threshold *t)
{
    double other = nextafter(x, lower ? -INFINITY : INFINITY);
    long double mid = ((long double)x + (long double)other) / 2;
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    t->present = true;
    t->incl = (bits & 1) == 0;
    char local[1300], *text = local; /* exact: the expansion ends by 1075 digits */
    snprintf(local, sizeof local, "%.1100Lf", mid);
    t->neg = text[0] == '-';
    text += t->neg;
    const char *dot = strchr(text, '.');
    size_t ni = dot ? (size_t)(dot - text) : strlen(text);
    if (ni >= sizeof t->ip)
        ni = sizeof t->ip - 1;
    memcpy(t->ip, text, ni);
    t->ip[ni] = '\0';
    dig_norm(t->ip);
    const char *f = dot ? dot + 1 : "";
    size_t k = 0;
    for (; k < FRAC_MAX_DIGITS && f[k]; k++)
        t->fp[k] = f[k];
    for (; k < FRAC_MAX_DIGITS; k++)
        t->fp[k] = '0';
    t->fp[FRAC_MAX_DIGITS] = '\0';
    t->more = k <= strlen(f) && strspn(f + k, "0") < strlen(f + k); /* k == FRAC_MAX_DIGITS */
    bool zero = dig_zero(t->ip) && !t->more && strspn(t->fp, "0") == FRAC_MAX_DIGITS;
    if (zero)
        t->neg = false;
}

static bool threshold_zero(const threshold *t)
{
    return dig_zero(t->ip) && !t->more && strspn(t->fp, "0") == FRAC_MAX_DIGITS;
}

/* The grid value (digits of |t| * 10^FRAC_MAX_DIGITS) at or above |t|
 * (ceil) or at or below it, the threshold itself only when incl; false:
 * none (below zero). */
static bool grid_of(const threshold *t, bool ceil_, char *g)
{
    size_t ni = strlen(t->ip); /* ip < DEC_MAX - FRAC_MAX_DIGITS digits: |t| < 1e41 */
    memcpy(g, t->ip, ni);
    memcpy(g + ni, t->fp, FRAC_MAX_DIGITS + 1);
    dig_norm(g);
    bool on_grid = !t->more;
    if (ceil_) {
        if (!on_grid || !t->incl)
            dig_inc(g);
        return true;
    }
    if (on_grid && !t->incl) {
        if (dig_zero(g))
            return false;
        dig_dec(g);
    }
    return true;
}

/* Append the digit ranges of prefix[0..n) as one alternative of r. */
static int emit_digits_alt(compiler *c, int32_t r, const char (*pre)[2], int n)
{
    for (int i = 0; i < n; i++)
        if (add_range(c, r, pre[i][0], pre[i][1]))
            return c->status;
    return end_alt(c, r);
}

/* Alternatives of r for the n-digit strings from lo to hi (same length). */
static int same_len_range(compiler *c, int32_t r, char (*pre)[2], int np, const char *lo,
                          const char *hi, int n)
{
    if (n == 0)
        return emit_digits_alt(c, r, (const char (*)[2])pre, np);
    if (lo[0] == hi[0]) {
        pre[np][0] = pre[np][1] = lo[0];
        return same_len_range(c, r, pre, np + 1, lo + 1, hi + 1, n - 1);
    }
    char zeros[DEC_MAX], nines[DEC_MAX];
    memset(zeros, '0', (size_t)n - 1);
    memset(nines, '9', (size_t)n - 1);
    zeros[n - 1] = nines[n - 1] = '\0';
    char a = lo[0], b = hi[0];
    if (strcmp(lo + 1, zeros) != 0) {
        pre[np][0] = pre[np][1] = lo[0];
        if (same_len_range(c, r, pre, np + 1, lo + 1, nines, n - 1))
            return c->status;
        a++;
    }
    if (strcmp(hi + 1, nines) != 0) {
        pre[np][0] = pre[np][1] = hi[0];
        if (same_len_range(c, r, pre, np + 1, zeros, hi + 1, n - 1))
            return c->status;
        b--;
    }
    if (a <= b) {
        pre[np][0] = a;
        pre[np][1] = b;
        for (int i = 1; i < n; i++)
            pre[np + i][0] = '0', pre[np + i][1] = '9';
        return emit_digits_alt(c, r, (const char (*)[2])pre, np + n);
    }
    return CAIRN_OK;
}

/* The decimal texts (no leading zero) of the integers lo..hi, lo <= hi. */
static int32_t rule_uint_range(compiler *c, const char *lo, const char *hi)
{
    int32_t r = new_rule(c);
    if (r < 0)
        return r;
    int nl = (int)strlen(lo), nh = (int)strlen(hi);
    char (*pre)[2] = malloc((size_t)(nh + 1) * sizeof *pre);
    char from[DEC_MAX], to[DEC_MAX];
    if (!pre)
        return cfail(c, CAIRN_ENOMEM, "out of memory");
    for (int len = nl; len <= nh; len++) {
        if (len == nl) {
            snprintf(from, sizeof from, "%s", lo);
        } else {
            memset(from, '0', (size_t)len);
            from[0] = '1';
            from[len] = '\0';
        }
        if (len == nh) {
            snprintf(to, sizeof to, "%s", hi);
        } else {
            memset(to, '9', (size_t)len);
            to[len] = '\0';
        }
        if (same_len_range(c, r, pre, 0, from, to, len)) {
            free(pre);
            return c->status;
        }
    }
    free(pre);
    return r;
}

/* An integer lo..hi (signed), as alternatives appended to r; -0 is never
 * written. Returns how many branches were added, or an error. */
static int add_int_range(compiler *c, int32_t r, const sdec *lo, const sdec *hi)
{
    int n = 0;
    if (!hi->neg) { /* 0.. */
        const char *a = lo->neg ? "0" : lo->d;
        if (dig_cmp(a, hi->d) <= 0) {
            if (add_ref(c, r, rule_uint_range(c, a, hi->d)) || end_alt(c, r))
                return c->status;
            n++;
        }
    }
    if (lo->neg) { /* ..-1 as "-" magnitude */
        const char *a = hi->neg ? hi->d : "1";
        if (dig_cmp(a, lo->d) <= 0) {
            if (add_cstr(c, r, "-") || add_ref(c, r, rule_uint_range(c, a, lo->d)) || end_alt(c, r))
                return c->status;
            n++;
        }
    }
    return n;
}

/* Fraction digits (1..FRAC_MAX_DIGITS, padded with zeros to the grid) from
 * position j on, at most h (le), at least l (ge), or both. */
static int32_t rule_frac(compiler *c, const char *l, const char *h, int j)
{
    int32_t digit = rule_range(c, '0', '9');
    int32_t r = digit < 0 ? digit : new_rule(c);
    if (r < 0)
        return c->status;
    bool l_zero = !l || strspn(l + j, "0") == strlen(l + j);
    if (j > 0 && l_zero && end_alt(c, r)) /* stop: the rest is zeros */
        return c->status;
    if (j == FRAC_MAX_DIGITS)
        return j > 0 ? r : cfail(c, CAIRN_EINVAL, "internal: empty fraction");
    int32_t any = rule_repeat(c, digit, -1, 0, FRAC_MAX_DIGITS - 1 - j);
    char lo = l ? l[j] : '0', hi = h ? h[j] : '9';
    if (lo == hi) {
        int32_t rest = rule_frac(c, l, h, j + 1);
        if (add_range(c, r, lo, lo) || add_ref(c, r, rest) || end_alt(c, r))
            return c->status;
        return r;
    }
    char a = lo, b = hi;
    if (l) { /* tight on the low side */
        int32_t rest = rule_frac(c, l, NULL, j + 1);
        if (add_range(c, r, lo, lo) || add_ref(c, r, rest) || end_alt(c, r))
            return c->status;
        a++;
    }
    if (h) {
        int32_t rest = rule_frac(c, NULL, h, j + 1);
        if (add_range(c, r, hi, hi) || add_ref(c, r, rest) || end_alt(c, r))
            return c->status;
        b--;
    }
    if (a <= b && (add_range(c, r, a, b) || add_ref(c, r, any) || end_alt(c, r)))
        return c->status;
    return r;
}

/* Texts with a fraction whose magnitude is on the grid from ga to gb. */
static int add_frac_range(compiler *c, int32_t r, const char *sign, const char *ga, const char *gb)
{
    if (dig_cmp(ga, gb) > 0)
        return 0;
    char ia[DEC_MAX], fa[FRAC_MAX_DIGITS + 1], ib[DEC_MAX], fb[FRAC_MAX_DIGITS + 1];
    const char *g[2] = {ga, gb};
    char *ip[2] = {ia, ib}, *fp[2] = {fa, fb};
    for (int k = 0; k < 2; k++) {
        size_t n = strlen(g[k]);
        if (n > FRAC_MAX_DIGITS) {
            memcpy(ip[k], g[k], n - FRAC_MAX_DIGITS);
            ip[k][n - FRAC_MAX_DIGITS] = '\0';
            memcpy(fp[k], g[k] + n - FRAC_MAX_DIGITS, FRAC_MAX_DIGITS + 1);
        } else {
            strcpy(ip[k], "0");
            memset(fp[k], '0', FRAC_MAX_DIGITS - n);
            memcpy(fp[k] + FRAC_MAX_DIGITS - n, g[k], n + 1);
        }
    }
    if (strcmp(ia, ib) == 0) {
        if (add_cstr(c, r, sign) || add_cstr(c, r, ia) || add_cstr(c, r, ".") ||
            add_ref(c, r, rule_frac(c, fa, fb, 0)) || end_alt(c, r))
            return c->status;
        return 1;
    }
    if (add_cstr(c, r, sign) || add_cstr(c, r, ia) || add_cstr(c, r, ".") ||
        add_ref(c, r, rule_frac(c, fa, NULL, 0)) || end_alt(c, r) ||
        add_cstr(c, r, sign) || add_cstr(c, r, ib) || add_cstr(c, r, ".") ||
        add_ref(c, r, rule_frac(c, NULL, fb, 0)) || end_alt(c, r))
        return c->status;
    dig_inc(ia);
    dig_dec(ib);
    if (dig_cmp(ia, ib) <= 0 &&
        (add_cstr(c, r, sign) || add_ref(c, r, rule_uint_range(c, ia, ib)) || add_cstr(c, r, ".") ||
         add_ref(c, r, rule_frac(c, NULL, NULL, 0)) || end_alt(c, r)))
        return c->status;
    return 2;
}

typedef struct {
    json_t *v;
    bool excl;
} num_bound;

/* The bounds of s on one side (lower: minimum/exclusiveMinimum): up to two
 * (draft 2020's numeric exclusive*, and minimum, exclusive under draft 4's
 * boolean form). */
static int get_bounds(compiler *c, json_t *s, bool lower, num_bound *b, int *n)
{
    const char *inc = lower ? "minimum" : "maximum";
    const char *exc = lower ? "exclusiveMinimum" : "exclusiveMaximum";
    json_t *vi = json_object_get(s, inc), *ve = json_object_get(s, exc);
    *n = 0;
    if (vi && !json_is_number(vi))
        return cfail(c, CAIRN_EINVAL, "'%s' must be a number", inc);
    if (ve && !json_is_number(ve) && !json_is_boolean(ve))
        return cfail(c, CAIRN_EINVAL, "'%s' must be a number (or a boolean, draft 4)", exc);
    if (vi)
        b[(*n)++] = (num_bound){vi, json_is_true(ve)};
    if (ve && json_is_number(ve))
        b[(*n)++] = (num_bound){ve, true};
    return CAIRN_OK;
}

static bool has_bounds(json_t *s)
{
    return json_object_get(s, "minimum") || json_object_get(s, "maximum") ||
           json_object_get(s, "exclusiveMinimum") || json_object_get(s, "exclusiveMaximum");
}

/* integer (frac false) or number (frac true) within s's bounds. */
static int32_t rule_bounded_number(compiler *c, json_t *s, bool frac)
{
    num_bound lb[2], ub[2];
    int nl, nu;
    if (get_bounds(c, s, true, lb, &nl) || get_bounds(c, s, false, ub, &nu))
        return c->status;
    /* the integers allowed, exactly */
    sdec lo = {0}, hi = {0}, t;
    for (int i = 0; i < nl; i++) {
        bound_int(lb[i].v, true, lb[i].excl, &t);
        if (i == 0 || sdec_cmp(&t, &lo) > 0)
            lo = t;
    }
    for (int i = 0; i < nu; i++) {
        bound_int(ub[i].v, false, ub[i].excl, &t);
        if (i == 0 || sdec_cmp(&t, &hi) < 0)
            hi = t;
    }
    /* digits: as unbounded numbers have, or as many as a far bound needs */
    int digits = INT_MAX_DIGITS;
    if (nl && !lo.neg && (int)strlen(lo.d) > digits)
        digits = (int)strlen(lo.d);
    if (nu && hi.neg && (int)strlen(hi.d) > digits)
        digits = (int)strlen(hi.d);
    if (digits > BOUND_MAX_DIGITS)
        return cfail(c, CAIRN_EUNSUPPORTED, "a bound of magnitude 1e%d or more is not supported",
                     BOUND_MAX_DIGITS);
    sdec cap_hi = {false, ""}, cap_lo;
    memset(cap_hi.d, '9', (size_t)digits);
    cap_hi.d[digits] = '\0';
    cap_lo = cap_hi;
    cap_lo.neg = true;
    if (!nl || sdec_cmp(&lo, &cap_lo) < 0)
        lo = cap_lo;
    if (!nu || sdec_cmp(&hi, &cap_hi) > 0)
        hi = cap_hi;
    int32_t r = new_rule(c);
    if (r < 0)
        return r;
    int branches = sdec_cmp(&lo, &hi) <= 0 ? add_int_range(c, r, &lo, &hi) : 0;
    if (branches < 0)
        return branches;
    if (frac) {
        /* texts with a fraction, judged as the double they parse to */
        threshold tl = {0}, tu = {0};
        double dl = -INFINITY, du = INFINITY;
        for (int i = 0; i < nl; i++) {
            double d = bound_double(lb[i].v, true, lb[i].excl);
            dl = d > dl ? d : dl;
        }
        for (int i = 0; i < nu; i++) {
            double d = bound_double(ub[i].v, false, ub[i].excl);
            du = d < du ? d : du;
        }
        /* past the digit cap a bound changes nothing on its near side */
        if (nl && dl > -1e41)
            make_threshold(dl, true, &tl);
        if (nu && du < 1e41)
            make_threshold(du, false, &tu);
        char cap[DEC_MAX + 2], ga[DEC_MAX + 2], gb[DEC_MAX + 2];
        memset(cap, '9', (size_t)digits + FRAC_MAX_DIGITS);
        cap[digits + FRAC_MAX_DIGITS] = '\0';
        /* v >= 0: from max(tl, 0) to min(tu, cap) */
        bool ok = true;
        if (!tl.present || tl.neg)
            strcpy(ga, "0");
        else if (threshold_zero(&tl))
            strcpy(ga, tl.incl ? "0" : "1");
        else
            grid_of(&tl, true, ga);
        if (!tu.present)
            strcpy(gb, cap);
        else if (tu.neg)
            ok = false;
        else
            ok = grid_of(&tu, false, gb);
        if (ok && dig_cmp(gb, cap) > 0)
            strcpy(gb, cap);
        int n = ok ? add_frac_range(c, r, "", ga, gb) : 0;
        if (n < 0)
            return n;
        branches += n;
        /* v < 0, as "-" and a magnitude m > 0 from max(-tu, 0+) to -tl */
        ok = true;
        if (!tu.present || !tu.neg)
            strcpy(ga, "1");
        else
            grid_of(&tu, true, ga);
        if (!tl.present)
            strcpy(gb, cap);
        else if (!tl.neg)
            ok = false;
        else
            ok = grid_of(&tl, false, gb) && !dig_zero(gb);
        if (ok && dig_cmp(gb, cap) > 0)
            strcpy(gb, cap);
        n = ok ? add_frac_range(c, r, "-", ga, gb) : 0;
        if (n < 0)
            return n;
        branches += n;
    }
    if (branches == 0)
        return cfail(c, CAIRN_EINVAL, "no %s satisfies the schema's bounds",
                     frac ? "number" : "integer");
    return r;
}

/* ---- pattern and format ----------------------------------------------------
 * A string's content as a DFA over code points (text/grammar_regex.c),
 * each code point spelled one way: itself (UTF-8) when JSON allows it
 * plain, else its short escape (\" \\ \b \t \n \f \r) or \u00XX. Counting
 * code points along the DFA makes minLength/maxLength exact with it. */

#define MAX_DFA_NODES (1 << 20) /* DFA states x counted lengths */
#define HOSTNAME_MAX 253

/* Alternatives of r for the UTF-8 encodings of lo..hi (one length). */
static int utf8_alts(compiler *c, int32_t r, uint32_t lo, uint32_t hi)
{
    int n = lo < 0x800 ? 2 : lo < 0x10000 ? 3 : 4;
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) == (hi & ~m))
            continue;
        /* split where the continuation bytes stop being full ranges */
        if ((lo & m) != 0)
            return utf8_alts(c, r, lo, lo | m) || utf8_alts(c, r, (lo | m) + 1, hi) ? c->status : 0;
        if ((hi & m) != m)
            return utf8_alts(c, r, lo, (hi & ~m) - 1) || utf8_alts(c, r, hi & ~m, hi) ? c->status : 0;
    }
    uint8_t a[4], b[4];
    uint32_t cp[2] = {lo, hi};
    uint8_t *out[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        uint32_t v = cp[k];
        for (int i = n - 1; i > 0; i--, v >>= 6)
            out[k][i] = (uint8_t)(0x80 | (v & 0x3f));
        out[k][0] = (uint8_t)((n == 2 ? 0xc0 : n == 3 ? 0xe0 : 0xf0) | v);
    }
    for (int i = 0; i < n; i++)
        if (add_range(c, r, a[i], b[i]))
            return c->status;
    return end_alt(c, r);
}

/* One code point of `rg` (n ranges) as JSON string content. */
static int32_t rule_cpset(compiler *c, const grammar_cprange *rg, int32_t n)
{
    int32_t r = new_rule(c);
    if (r < 0)
        return r;
    grammar_byteset plain = {{0}}, esc = {{0}}, u[2] = {{{0}}, {{0}}};
    bool has_plain = false, has_esc = false, has_u[2] = {false, false};
    static const char hexd[] = "0123456789abcdef";
    for (int32_t i = 0; i < n; i++)
        for (uint32_t cp = rg[i].lo; cp <= rg[i].hi && cp < 0x80; cp++) {
            const char *short_esc = strchr("\b\t\n\f\r", (int)cp);
            if (cp >= 0x20 && cp != '"' && cp != '\\') {
                bs_add(&plain, (int)cp, (int)cp);
                has_plain = true;
            } else if (cp == '"' || cp == '\\' || (cp && short_esc)) {
                int e = cp == '"' || cp == '\\' ? (int)cp : "btnfr"[short_esc - "\b\t\n\f\r"];
                bs_add(&esc, e, e);
                has_esc = true;
            } else { /* \u00XX: the last hex digit in either case */
                int h = (int)(cp & 15);
                bs_add(&u[cp >> 4], hexd[h], hexd[h]);
                if (h >= 10)
                    bs_add(&u[cp >> 4], hexd[h] - 32, hexd[h] - 32);
                has_u[cp >> 4] = true;
            }
        }
    if (has_plain && (add_set(c, r, &plain) || end_alt(c, r)))
        return c->status;
    if (has_esc && (add_cstr(c, r, "\\") || add_set(c, r, &esc) || end_alt(c, r)))
        return c->status;
    for (int k = 0; k < 2; k++)
        if (has_u[k] && (add_cstr(c, r, k ? "\\u001" : "\\u000") || add_set(c, r, &u[k]) ||
                         end_alt(c, r)))
            return c->status;
    static const uint32_t len_end[] = {0x7ff, 0xffff, 0x10ffff};
    for (int32_t i = 0; i < n; i++) {
        uint32_t lo = rg[i].lo < 0x80 ? 0x80 : rg[i].lo;
        for (int k = 0; k < 3 && lo <= rg[i].hi; k++) {
            if (lo > len_end[k])
                continue;
            uint32_t hi = rg[i].hi < len_end[k] ? rg[i].hi : len_end[k];
            if (utf8_alts(c, r, lo, hi))
                return c->status;
            lo = hi + 1;
        }
    }
    if (c->rules[r].n == 0)
        return cfail(c, CAIRN_EINVAL, "internal: an empty character set");
    return r;
}

/* The JSON string whose content d accepts, with min_len..max_len (-1: no
 * limit) code points; `what` names the constraint in errors. */
static int32_t rule_dfa_string(compiler *c, const grammar_dfa *d, int min_len, int max_len,
                               const char *what)
{
    if (d->n_states == 0)
        return cfail(c, CAIRN_EINVAL, "no string matches %s", what);
    int32_t K = max_len >= 0 ? max_len : min_len; /* unbounded: layer K loops */
    int64_t n_nodes = (int64_t)d->n_states * (K + 1);
    if (n_nodes > MAX_DFA_NODES)
        return cfail(c, CAIRN_ERANGE, "%s with minLength/maxLength makes a grammar too large", what);
    int32_t n_edges = d->first_edge[d->n_states];
    uint8_t *live = calloc((size_t)n_nodes, 1), *seen = calloc((size_t)n_nodes, 1);
    int32_t *rule_of = malloc((size_t)n_nodes * sizeof *rule_of);
    int32_t *queue = malloc((size_t)n_nodes * sizeof *queue);
    int32_t *set_rule = malloc(((size_t)n_edges + 1) * sizeof *set_rule);
    int32_t result = CAIRN_ENOMEM;
    if (!live || !seen || !rule_of || !queue || !set_rule) {
        cfail(c, CAIRN_ENOMEM, "out of memory");
        goto out;
    }
#define NODE(s, k) ((int64_t)(s) * (K + 1) + (k))
#define NEXT_K(k) ((k) < K ? (k) + 1 : max_len < 0 ? K : -1)
    /* live: an accepting node can still be reached, counting lengths */
    for (int32_t k = K; k >= 0; k--)
        for (bool changed = true; changed;) {
            changed = false; /* layer K loops on itself when unbounded */
            for (int32_t s = 0; s < d->n_states; s++) {
                if (live[NODE(s, k)])
                    continue;
                bool l = d->accept[s] && k >= min_len;
                int32_t nk = NEXT_K(k);
                for (int32_t e = d->first_edge[s]; !l && nk >= 0 && e < d->first_edge[s + 1]; e++)
                    l = live[NODE(d->edge_target[e], nk)];
                if (l)
                    live[NODE(s, k)] = changed = true;
            }
            if (k < K || max_len >= 0)
                break;
        }
    if (!live[NODE(0, 0)]) {
        result = cfail(c, CAIRN_EINVAL, "no string satisfies %s with minLength/maxLength", what);
        goto out;
    }
    /* the live nodes reachable from the start get a rule each */
    int64_t nq = 0;
    queue[nq++] = (int32_t)NODE(0, 0);
    seen[NODE(0, 0)] = 1;
    for (int64_t i = 0; i < nq; i++) {
        int32_t s = (int32_t)(queue[i] / (K + 1)), k = (int32_t)(queue[i] % (K + 1));
        if ((rule_of[queue[i]] = new_rule(c)) < 0) {
            result = c->status;
            goto out;
        }
        int32_t nk = NEXT_K(k);
        for (int32_t e = d->first_edge[s]; nk >= 0 && e < d->first_edge[s + 1]; e++) {
            int64_t t = NODE(d->edge_target[e], nk);
            if (live[t] && !seen[t]) {
                seen[t] = 1;
                queue[nq++] = (int32_t)t;
            }
        }
    }
    for (int32_t e = 0; e < n_edges; e++)
        set_rule[e] = -1;
    for (int64_t i = 0; i < nq; i++) {
        int32_t s = (int32_t)(queue[i] / (K + 1)), k = (int32_t)(queue[i] % (K + 1));
        int32_t r = rule_of[queue[i]], nk = NEXT_K(k);
        if (d->accept[s] && k >= min_len && end_alt(c, r)) {
            result = c->status;
            goto out;
        }
        for (int32_t e = d->first_edge[s]; nk >= 0 && e < d->first_edge[s + 1]; e++) {
            int64_t t = NODE(d->edge_target[e], nk);
            if (!live[t])
                continue;
            if (set_rule[e] < 0) {
                /* the same code points as an earlier edge: share its rule */
                int32_t nr = d->edge_range[e + 1] - d->edge_range[e];
                const grammar_cprange *rg = d->ranges + d->edge_range[e];
                for (int32_t f = 0; f < e && set_rule[e] < 0; f++)
                    if (set_rule[f] >= 0 && d->edge_range[f + 1] - d->edge_range[f] == nr &&
                        memcmp(d->ranges + d->edge_range[f], rg, (size_t)nr * sizeof *rg) == 0)
                        set_rule[e] = set_rule[f];
                if (set_rule[e] < 0 && (set_rule[e] = rule_cpset(c, rg, nr)) < 0) {
                    result = c->status;
                    goto out;
                }
            }
            if (add_ref(c, r, set_rule[e]) || add_ref(c, r, rule_of[t]) || end_alt(c, r)) {
                result = c->status;
                goto out;
            }
        }
    }
#undef NODE
#undef NEXT_K
    int32_t r = new_rule(c);
    if (r >= 0 && (add_cstr(c, r, "\"") || add_ref(c, r, rule_of[0]) || add_cstr(c, r, "\"") ||
                   end_alt(c, r)))
        r = c->status;
    result = r;
out:
    free(live);
    free(seen);
    free(rule_of);
    free(queue);
    free(set_rule);
    return result;
}

/* The formats that constrain, as whole-string regexes (RFC 3339 for dates
 * and times, with real month lengths and leap years; RFC 4122's textual
 * uuid; dotted-quad ipv4 without leading zeros; RFC 1123 hostnames; an
 * email as dot-atom@hostname). Leap seconds and fractions of more than 9
 * digits are not generated. */
#define RE_YEAR "(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
#define RE_DATE                                                                                   \
    "(?:" RE_YEAR "-(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)|"   \
    "(?:0[13578]|1[02])-31)|(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|"                        \
    "(?:0[48]|[2468][048]|[13579][26])00)-02-29)"
#define RE_TIME                                                                                   \
    "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,9})?"                                \
    "(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
#define RE_LABEL "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
#define RE_HOST RE_LABEL "(?:\\." RE_LABEL ")*"
#define RE_OCTET "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
#define RE_ATOM "[A-Za-z0-9!#$%&'*+/=?^_`\\{|\\}~-]+"

static const struct {
    const char *name, *re;
    int max_len; /* -1: none of its own */
} formats[] = {
    {"date", RE_DATE, -1},
    {"time", RE_TIME, -1},
    {"date-time", RE_DATE "[Tt]" RE_TIME, -1},
    {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}", -1},
    {"ipv4", RE_OCTET "(?:\\." RE_OCTET "){3}", -1},
    {"hostname", RE_HOST, HOSTNAME_MAX},
    {"email", RE_ATOM "(?:\\." RE_ATOM ")*@" RE_HOST, -1},
};

static int find_format(json_t *s)
{
    const char *f = json_string_value(json_object_get(s, "format"));
    for (int i = 0; f && i < (int)(sizeof formats / sizeof *formats); i++)
        if (strcmp(f, formats[i].name) == 0)
            return i;
    return -1; /* none, or an annotation only */
}

/* A string with pattern and/or a known format, and lengths. */
static int32_t rule_constrained_string(compiler *c, json_t *s, int min_len, int max_len)
{
    json_t *pat = json_object_get(s, "pattern");
    int fmt = find_format(s);
    grammar_dfa *dp = NULL, *df = NULL, *both = NULL;
    char msg[160] = "";
    int rc = CAIRN_OK;
    if (pat) {
        rc = grammar_regex_dfa(json_string_value(pat), json_string_length(pat), true, &dp, msg,
                               sizeof msg);
        if (rc)
            return cfail(c, rc, "%s", msg);
    }
    if (fmt >= 0) {
        rc = grammar_regex_dfa(formats[fmt].re, strlen(formats[fmt].re), false, &df, msg, sizeof msg);
        if (rc) {
            grammar_dfa_free(dp);
            return cfail(c, rc, "format '%s': %s", formats[fmt].name, msg);
        }
        if (formats[fmt].max_len >= 0 && (max_len < 0 || max_len > formats[fmt].max_len))
            max_len = formats[fmt].max_len;
    }
    if (dp && df) {
        rc = grammar_dfa_intersect(dp, df, &both, msg, sizeof msg);
        if (rc) {
            grammar_dfa_free(dp);
            grammar_dfa_free(df);
            return cfail(c, rc, "%s", msg);
        }
    }
    char what[96];
    snprintf(what, sizeof what, "%s%s%s%s", dp ? "'pattern'" : "", dp && df ? " and " : "",
             df ? "format " : "", df ? formats[fmt].name : "");
    int32_t r = rule_dfa_string(c, both ? both : dp ? dp : df, min_len, max_len, what);
    grammar_dfa_free(dp);
    grammar_dfa_free(df);
    grammar_dfa_free(both);
    return r;
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
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "pattern", "prefixItems",
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

/* An array with prefixItems (draft 2020-12): item i follows prefixItems[i],
 * the ones after it `items` (none when false, any value when absent), and
 * min..max items in all. */
static int32_t rule_tuple(compiler *c, json_t *prefix, json_t *items, int min, int max, int depth)
{
    int32_t ws = rule_ws(c);
    int32_t comma = ws < 0 ? ws : new_rule(c);
    if (comma < 0 || add_cstr(c, comma, ",") || add_ref(c, comma, ws) || end_alt(c, comma))
        return c->status;
    int n_prefix = prefix ? (int)json_array_size(prefix) : 0;
    if (json_is_false(items) && (max < 0 || max > n_prefix))
        max = n_prefix;
    if (max >= 0 && max < min)
        return cfail(c, CAIRN_EINVAL, "'minItems' is more than 'prefixItems' and 'items' allow");
    /* each item followed by whitespace, as rule_container has them */
    int32_t *entry = calloc((size_t)n_prefix + 1, sizeof *entry);
    if (!entry)
        return cfail(c, CAIRN_ENOMEM, "out of memory");
    int32_t result = CAIRN_OK;
    for (int i = 0; i <= n_prefix; i++) {
        if (i == n_prefix && json_is_false(items)) {
            entry[i] = -1;
            break;
        }
        json_t *sub = i < n_prefix ? json_array_get(prefix, (size_t)i) : items;
        int32_t v = sub && !json_is_true(sub) ? compile_schema(c, sub, depth + 1) : rule_value(c);
        int32_t e = v < 0 ? v : new_rule(c);
        if (e < 0 || add_ref(c, e, v) || add_ref(c, e, ws) || end_alt(c, e)) {
            result = c->status;
            goto out;
        }
        entry[i] = e;
    }
    /* after[i]: what may follow once i items are written (i >= 1) */
    int32_t next = -1;
    int top = max >= 0 && max < n_prefix ? max : n_prefix;
    if (top == n_prefix && entry[n_prefix] >= 0) {
        /* past the prefix: items of `items`, counted from n_prefix */
        int kmin = min > n_prefix ? min - n_prefix : 0, kmax = max < 0 ? -1 : max - n_prefix;
        next = rule_rest(c, entry[n_prefix], comma, kmin, kmax);
    } else {
        next = rule_empty(c);
    }
    for (int i = top - 1; i >= 1 && next >= 0; i--) { /* i items written; the next is i */
        int32_t r = new_rule(c);
        if (r < 0 || add_ref(c, r, comma) || add_ref(c, r, entry[i]) || add_ref(c, r, next) ||
            end_alt(c, r) || (i >= min && end_alt(c, r))) {
            result = c->status;
            goto out;
        }
        next = r;
    }
    if (next < 0) {
        result = c->status;
        goto out;
    }
    int32_t body = new_rule(c);
    if (body < 0 || (top >= 1 && (add_ref(c, body, entry[0]) || add_ref(c, body, next) ||
                                  end_alt(c, body))) ||
        (min == 0 && end_alt(c, body))) {
        result = c->status;
        goto out;
    }
    int32_t r = new_rule(c);
    if (r < 0 || add_cstr(c, r, "[") || add_ref(c, r, ws) || add_ref(c, r, body) ||
        add_cstr(c, r, "]") || end_alt(c, r)) {
        result = c->status;
        goto out;
    }
    result = r;
out:
    free(entry);
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
        json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
        if (pat && !json_is_string(pat))
            return cfail(c, CAIRN_EINVAL, "'pattern' must be a string");
        if (fmt && !json_is_string(fmt))
            return cfail(c, CAIRN_EINVAL, "'format' must be a string");
        if (pat || find_format(s) >= 0)
            return rule_constrained_string(c, s, min_len, max_len);
        return rule_string(c, min_len, max_len);
    }
    if (strcmp(type, "number") == 0)
        return has_bounds(s) ? rule_bounded_number(c, s, true) : rule_number(c);
    if (strcmp(type, "integer") == 0)
        return has_bounds(s) ? rule_bounded_number(c, s, false) : rule_integer(c);
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
        if (items && !json_is_object(items) && !json_is_boolean(items))
            return cfail(c, CAIRN_EINVAL, "'items' must be a schema");
        json_t *prefix = json_object_get(s, "prefixItems");
        if (prefix && (!json_is_array(prefix) || json_array_size(prefix) == 0))
            return cfail(c, CAIRN_EINVAL, "'prefixItems' must be a non-empty array of schemas");
        if (prefix || json_is_false(items))
            return rule_tuple(c, prefix, items, min_items, max_items, depth);
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
        else if (json_object_get(s, "prefixItems"))
            inferred = "array";
        else if (json_object_get(s, "minLength") || json_object_get(s, "maxLength") ||
                 json_object_get(s, "pattern") || find_format(s) >= 0)
            inferred = "string";
        else if (has_bounds(s))
            inferred = "number";
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
