/*
 * text/grammar_regex.c — regular languages for the schema compiler: a
 * JSON-Schema `pattern` (ECMA-262 syntax) or a built-in `format` parsed and
 * turned into a DFA over code points (text/grammar_impl.h), and the
 * intersection of two such DFAs. text/grammar_compile.c turns a DFA into
 * grammar rules that spell each code point the way JSON does.
 *
 * Why a DFA and not regex-shaped grammar rules: the matcher keeps every
 * ambiguous parse as a separate stack, and an unanchored pattern (`.*p.*`)
 * or a nested quantifier would make many of them; a DFA is one state per
 * position whatever the pattern, intersects with a format, and lets the
 * compiler count characters (minLength/maxLength) exactly.
 *
 * Pipeline: parse to a small syntax tree; build a Thompson NFA from it
 * (counted repetitions unrolled, bounded by RE_MAX_NFA); subset
 * construction over "atoms" (the code-point intervals no character class
 * splits), with ^ passable only before the first character and $ only at
 * the end; finally drop every state that cannot reach acceptance.
 *
 * Regex engines disagree on \d \w \s: ECMA-262 makes \d and \w ASCII,
 * Python's re (what the jsonschema package validates with) makes them
 * Unicode. So that the generated text matches under both, each class item
 * carries two sets: the code points it surely matches (min) and the ones it
 * may match (max); a class generates its min set, and negation swaps them
 * (complement of max). Non-ASCII characters are therefore never generated
 * for \d \w \D \W, and \s \S generate what both agree on (their lists of
 * spaces are short).
 */
#include "text/text.h"
#include "text/grammar_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RE_MAX_NFA 50000      /* NFA states after unrolling {m,n}                */
#define RE_MAX_COUNT 1000     /* largest m or n in {m,n}                         */
#define RE_MAX_NEST 100       /* group nesting                                   */
#define RE_MAX_DFA 4000       /* DFA states (subset construction, intersection) */
#define RE_MAX_WORK 40000000L /* membership tests in one subset construction     */
#define CP_MAX 0x10ffff

/* ---- code-point sets ---------------------------------------------------------- */

typedef struct {
    grammar_cprange *r;
    int32_t n, cap;
} cpset;

typedef struct {
    char *err;
    size_t err_len;
    int status;
} re_err;

static int rfail(re_err *e, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int rfail(re_err *e, int rc, const char *fmt, ...)
{
    if (e->status == CAIRN_OK) {
        e->status = rc;
        if (e->err && e->err_len) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(e->err, e->err_len, fmt, ap);
            va_end(ap);
        }
    }
    return rc;
}

static int grow(void **p, int32_t *cap, int32_t need, size_t elem)
{
    if (need <= *cap)
        return CAIRN_OK;
    int32_t nc = *cap ? *cap : 16;
    while (nc < need)
        nc *= 2;
    void *np = realloc(*p, (size_t)nc * elem);
    if (!np)
        return CAIRN_ENOMEM;
    *p = np;
    *cap = nc;
    return CAIRN_OK;
}

/* Add [lo, hi] minus the surrogates (never characters of a JSON text). */
static int cpset_add(cpset *s, uint32_t lo, uint32_t hi)
{
    if (lo <= 0xdfff && hi >= 0xd800) {
        int rc = lo < 0xd800 ? cpset_add(s, lo, 0xd7ff) : CAIRN_OK;
        return rc ? rc : hi > 0xdfff ? cpset_add(s, 0xe000, hi) : CAIRN_OK;
    }
    if (lo > hi)
        return CAIRN_OK;
    if (grow((void **)&s->r, &s->cap, s->n + 1, sizeof *s->r))
        return CAIRN_ENOMEM;
    s->r[s->n++] = (grammar_cprange){lo, hi};
    return CAIRN_OK;
}

static int cmp_range(const void *a, const void *b)
{
    const grammar_cprange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sort and merge overlapping or adjacent ranges. */
static void cpset_norm(cpset *s)
{
    if (s->n < 2)
        return;
    qsort(s->r, (size_t)s->n, sizeof *s->r, cmp_range);
    int32_t k = 0;
    for (int32_t i = 1; i < s->n; i++) {
        if (s->r[i].lo <= s->r[k].hi + 1) {
            if (s->r[i].hi > s->r[k].hi)
                s->r[k].hi = s->r[i].hi;
        } else {
            s->r[++k] = s->r[i];
        }
    }
    s->n = k + 1;
}

static int cpset_union(cpset *d, const cpset *s)
{
    for (int32_t i = 0; i < s->n; i++)
        if (cpset_add(d, s->r[i].lo, s->r[i].hi))
            return CAIRN_ENOMEM;
    cpset_norm(d);
    return CAIRN_OK;
}

/* Every character (no surrogate) not in normalized `s`, into `out`. */
static int cpset_complement(const cpset *s, cpset *out)
{
    out->n = 0;
    uint32_t next = 0;
    for (int32_t i = 0; i < s->n; i++) {
        if (s->r[i].lo > next && cpset_add(out, next, s->r[i].lo - 1))
            return CAIRN_ENOMEM;
        next = s->r[i].hi + 1;
    }
    if (next <= CP_MAX && cpset_add(out, next, CP_MAX))
        return CAIRN_ENOMEM;
    return CAIRN_OK;
}

static bool ranges_have(const grammar_cprange *r, int32_t n, uint32_t cp)
{
    int32_t lo = 0, hi = n - 1;
    while (lo <= hi) {
        int32_t mid = (lo + hi) / 2;
        if (cp < r[mid].lo)
            hi = mid - 1;
        else if (cp > r[mid].hi)
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

/* ---- syntax tree ---------------------------------------------------------------- */

enum { RN_SET, RN_CAT, RN_ALT, RN_REP, RN_BOL, RN_EOL, RN_EMPTY };

typedef struct {
    uint8_t kind;
    int32_t a, b;     /* CAT/ALT: the two operands; REP: a is the operand */
    int32_t min, max; /* REP: max -1 unbounded */
    int32_t set;      /* SET: index into sets */
} re_node;

/* A class item: what it surely matches and what it may match (see top). */
typedef struct {
    cpset min, max;
} cls;

typedef struct {
    const char *p, *end;
    re_node *nodes;
    int32_t n_nodes, cap_nodes;
    cpset *sets;
    int32_t n_sets, cap_sets;
    re_err *e;
    int depth;
} re_parser;

static int32_t new_node(re_parser *ps, re_node n)
{
    if (grow((void **)&ps->nodes, &ps->cap_nodes, ps->n_nodes + 1, sizeof *ps->nodes))
        return rfail(ps->e, CAIRN_ENOMEM, "out of memory");
    if (ps->n_nodes >= RE_MAX_NFA)
        return rfail(ps->e, CAIRN_ERANGE, "'pattern' is too long");
    ps->nodes[ps->n_nodes] = n;
    return ps->n_nodes++;
}

/* A SET node owning `s` (moved in). */
static int32_t set_node(re_parser *ps, cpset *s)
{
    if (grow((void **)&ps->sets, &ps->cap_sets, ps->n_sets + 1, sizeof *ps->sets)) {
        free(s->r);
        return rfail(ps->e, CAIRN_ENOMEM, "out of memory");
    }
    cpset_norm(s);
    ps->sets[ps->n_sets] = *s;
    *s = (cpset){0};
    return new_node(ps, (re_node){.kind = RN_SET, .set = ps->n_sets++});
}

/* The next code point of the pattern (UTF-8; the JSON parser checked it). */
static uint32_t next_cp(re_parser *ps)
{
    const uint8_t *s = (const uint8_t *)ps->p;
    uint32_t c = s[0];
    int n = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    if (ps->p + n > ps->end)
        n = 1;
    if (n > 1) {
        c &= 0x3f >> (n - 1);
        for (int i = 1; i < n; i++)
            c = (c << 6) | (s[i] & 0x3f);
    }
    ps->p += n;
    return c;
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

static int read_hex(re_parser *ps, int digits, uint32_t *out, const char *what)
{
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        int h = ps->p < ps->end ? hexval(*ps->p) : -1;
        if (h < 0)
            return rfail(ps->e, CAIRN_EINVAL, "'pattern': \\%s needs %d hex digits", what, digits);
        v = v * 16 + (uint32_t)h;
        ps->p++;
    }
    *out = v;
    return CAIRN_OK;
}

/* \d \w \s and their negations as (min, max) sets. */
static int shorthand(char k, cls *out)
{
    cpset lo = {0}, hi = {0};
    int rc = CAIRN_OK;
    char base = (char)(k | 0x20);
    out->min = out->max = (cpset){0};
    if (base == 'd') {
        rc = cpset_add(&lo, '0', '9');
    } else if (base == 'w') {
        rc = cpset_add(&lo, '0', '9') || cpset_add(&lo, 'A', 'Z') || cpset_add(&lo, 'a', 'z') ||
             cpset_add(&lo, '_', '_');
    } else { /* s: the spaces ECMA-262 and Python's str.isspace() share */
        static const uint32_t sp[][2] = {{9, 13}, {32, 32}, {0xa0, 0xa0}, {0x1680, 0x1680},
                                         {0x2000, 0x200a}, {0x2028, 0x2029}, {0x202f, 0x202f},
                                         {0x205f, 0x205f}, {0x3000, 0x3000}};
        for (size_t i = 0; i < sizeof sp / sizeof *sp && !rc; i++)
            rc = cpset_add(&lo, sp[i][0], sp[i][1]);
    }
    /* what either engine may match: for \s both lists are short (Python
     * adds \x1c-\x1f and \x85, ECMA-262 \ufeff); for \d and \w the ASCII
     * part and, as Python's are Unicode-wide, every non-ASCII character */
    if (base == 's') {
        rc = cpset_union(&hi, &lo) || cpset_add(&hi, 0x1c, 0x1f) || cpset_add(&hi, 0x85, 0x85) ||
             cpset_add(&hi, 0xfeff, 0xfeff);
    } else {
        for (int32_t i = 0; i < lo.n && !rc; i++)
            rc = cpset_add(&hi, lo.r[i].lo, lo.r[i].hi);
        if (!rc)
            rc = cpset_add(&hi, 0x80, CP_MAX);
    }
    cpset_norm(&lo);
    cpset_norm(&hi);
    if (!rc && k != base) { /* \D \W \S: complement, with min and max swapped */
        rc = cpset_complement(&hi, &out->min) || cpset_complement(&lo, &out->max);
        free(lo.r);
        free(hi.r);
        return rc ? CAIRN_ENOMEM : CAIRN_OK;
    }
    out->min = lo;
    out->max = hi;
    return rc ? CAIRN_ENOMEM : CAIRN_OK;
}

/* After a backslash: a single character (*cp, returns 0) or a shorthand
 * class (*c filled, returns 1); in_class: \b is backspace there. */
static int parse_escape(re_parser *ps, bool in_class, uint32_t *cp, cls *c)
{
    if (ps->p >= ps->end)
        return rfail(ps->e, CAIRN_EINVAL, "'pattern' ends with a lone backslash");
    char k = *ps->p;
    if ((unsigned char)k >= 0x80)
        return rfail(ps->e, CAIRN_EUNSUPPORTED, "'pattern': a backslash before a non-ASCII character");
    ps->p++;
    switch (k) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S':
        if (shorthand(k, c))
            return rfail(ps->e, CAIRN_ENOMEM, "out of memory");
        return 1;
    case 't': *cp = '\t'; return 0;
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 'v': *cp = '\v'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'b':
        if (in_class) {
            *cp = '\b';
            return 0;
        }
        return rfail(ps->e, CAIRN_EUNSUPPORTED, "'pattern': the word boundary \\b is not supported");
    case 'B':
        return rfail(ps->e, CAIRN_EUNSUPPORTED, "'pattern': \\B is not supported");
    case '0':
        if (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
            return rfail(ps->e, CAIRN_EUNSUPPORTED, "'pattern': octal escapes are not supported");
        *cp = 0;
        return 0;
    case 'x':
        return read_hex(ps, 2, cp, "x") ? ps->e->status : 0;
    case 'u':
        if (ps->p < ps->end && *ps->p == '{')
            return rfail(ps->e, CAIRN_EUNSUPPORTED, "'pattern': \\u{...} is not supported");
        if (read_hex(ps, 4, cp, "u"))
            return ps->e->status;
        if (*cp >= 0xd800 && *cp <= 0xdfff)
            return rfail(ps->e, CAIRN_EUNSUPPORTED,
                         "'pattern': surrogate escapes (\\u%04X) are not supported", *cp);
        return 0;
    case 'c':
        return rfail(ps->e, CAIRN_EUNSUPPORTED, "'pattern': control escapes \\c are not supported");
    case 'k':
        return rfail(ps->e, CAIRN_EUNSUPPORTED, "'pattern': backreferences are not supported");
    case 'p': case 'P':
        return rfail(ps->e, CAIRN_EUNSUPPORTED,
                     "'pattern': Unicode property escapes \\%c are not supported", k);
    default:
        if (k >= '1' && k <= '9')
            return rfail(ps->e, CAIRN_EUNSUPPORTED, "'pattern': backreferences are not supported");
        if ((k >= 'a' && k <= 'z') || (k >= 'A' && k <= 'Z'))
            return rfail(ps->e, CAIRN_EINVAL, "'pattern': unknown escape \\%c", k);
        *cp = (uint32_t)(unsigned char)k; /* an escaped punctuation character */
        return 0;
    }
}

static int32_t parse_alt(re_parser *ps);

/* "[...]" after the '['. */
static int32_t parse_class(re_parser *ps)
{
    bool neg = ps->p < ps->end && *ps->p == '^';
    if (neg)
        ps->p++;
    if (ps->p < ps->end && *ps->p == ']')
        return rfail(ps->e, CAIRN_EUNSUPPORTED,
                     "'pattern': the empty class [] or [^] is not supported (engines differ)");
    cls acc = {{0}, {0}};
    int rc = CAIRN_OK;
    for (;;) {
        if (ps->p >= ps->end) {
            rc = rfail(ps->e, CAIRN_EINVAL, "'pattern': a '[' is not closed");
            break;
        }
        if (*ps->p == ']') {
            ps->p++;
            break;
        }
        uint32_t lo;
        cls sh = {{0}, {0}};
        int kind = 0;
        if (*ps->p == '\\') {
            ps->p++;
            if ((kind = parse_escape(ps, true, &lo, &sh)) < 0) {
                rc = kind;
                break;
            }
        } else {
            lo = next_cp(ps);
        }
        bool range = ps->p + 1 < ps->end && ps->p[0] == '-' && ps->p[1] != ']';
        if (kind == 1) {
            if (range) {
                free(sh.min.r);
                free(sh.max.r);
                rc = rfail(ps->e, CAIRN_EUNSUPPORTED,
                           "'pattern': a class escape as a range end is not supported");
                break;
            }
            rc = cpset_union(&acc.min, &sh.min) || cpset_union(&acc.max, &sh.max) ? CAIRN_ENOMEM : 0;
            free(sh.min.r);
            free(sh.max.r);
            if (rc) {
                rfail(ps->e, rc, "out of memory");
                break;
            }
            continue;
        }
        uint32_t hi = lo;
        if (range) {
            ps->p++; /* '-' */
            if (*ps->p == '\\') {
                ps->p++;
                if ((kind = parse_escape(ps, true, &hi, &sh)) < 0) {
                    rc = kind;
                    break;
                }
                if (kind == 1) {
                    free(sh.min.r);
                    free(sh.max.r);
                    rc = rfail(ps->e, CAIRN_EUNSUPPORTED,
                               "'pattern': a class escape as a range end is not supported");
                    break;
                }
            } else {
                hi = next_cp(ps);
            }
            if (hi < lo) {
                rc = rfail(ps->e, CAIRN_EINVAL, "'pattern': a class range is out of order");
                break;
            }
        }
        if (cpset_add(&acc.min, lo, hi) || cpset_add(&acc.max, lo, hi)) {
            rc = rfail(ps->e, CAIRN_ENOMEM, "out of memory");
            break;
        }
    }
    if (rc) {
        free(acc.min.r);
        free(acc.max.r);
        return rc;
    }
    cpset_norm(&acc.min);
    cpset_norm(&acc.max);
    cpset out = {0};
    if (neg) {
        if (cpset_complement(&acc.max, &out))
            rc = rfail(ps->e, CAIRN_ENOMEM, "out of memory");
        free(acc.min.r);
    } else {
        out = acc.min;
    }
    free(acc.max.r);
    if (rc) {
        free(out.r);
        return rc;
    }
    return set_node(ps, &out);
}

static int32_t single_node(re_parser *ps, uint32_t lo, uint32_t hi)
{
    cpset s = {0};
    if (cpset_add(&s, lo, hi))
        return rfail(ps->e, CAIRN_ENOMEM, "out of memory");
    return set_node(ps, &s);
}

static bool read_int(re_parser *ps, int32_t *out)
{
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
        return false;
    long v = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        if (v <= RE_MAX_COUNT)
            v = v * 10 + (*ps->p - '0');
        ps->p++;
    }
    *out = v > RE_MAX_COUNT ? RE_MAX_COUNT + 1 : (int32_t)v;
    return true;
}

/* {m}, {m,}, {m,n} at ps->p; false (p unchanged) when it is not one. */
static bool parse_braces(re_parser *ps, int32_t *min, int32_t *max)
{
    const char *start = ps->p;
    ps->p++;
    if (!read_int(ps, min))
        goto no;
    *max = *min;
    if (ps->p < ps->end && *ps->p == ',') {
        ps->p++;
        if (!read_int(ps, max))
            *max = -1;
    }
    if (ps->p < ps->end && *ps->p == '}') {
        ps->p++;
        return true;
    }
no:
    ps->p = start;
    return false;
}

/* One atom and its quantifiers; -1 with status OK: the end of a sequence. */
static int32_t parse_piece(re_parser *ps)
{
    if (ps->p >= ps->end || *ps->p == '|' || *ps->p == ')')
        return -1;
    char ch = *ps->p;
    int32_t atom;
    bool anchor = false;
    if (ch == '*' || ch == '+' || ch == '?')
        return rfail(ps->e, CAIRN_EINVAL, "'pattern': nothing to repeat before '%c'", ch);
    if (ch == '{') {
        int32_t a, b;
        if (parse_braces(ps, &a, &b))
            return rfail(ps->e, CAIRN_EINVAL, "'pattern': nothing to repeat before '{'");
        return rfail(ps->e, CAIRN_EUNSUPPORTED,
                     "'pattern': a literal '{' must be escaped as \\{ (engines differ)");
    }
    if (ch == '(') {
        ps->p++;
        if (ps->p < ps->end && *ps->p == '?') {
            if (ps->p + 1 < ps->end && ps->p[1] == ':') {
                ps->p += 2;
            } else if (ps->p + 1 < ps->end && (ps->p[1] == '=' || ps->p[1] == '!')) {
                return rfail(ps->e, CAIRN_EUNSUPPORTED, "'pattern': lookahead (?%c is not supported",
                             ps->p[1]);
            } else if (ps->p + 2 < ps->end && ps->p[1] == '<' &&
                       (ps->p[2] == '=' || ps->p[2] == '!')) {
                return rfail(ps->e, CAIRN_EUNSUPPORTED,
                             "'pattern': lookbehind (?<%c is not supported", ps->p[2]);
            } else if (ps->p + 1 < ps->end && ps->p[1] == '<') {
                /* a named group matches like any other */
                const char *q = ps->p + 2;
                while (q < ps->end && *q != '>')
                    q++;
                if (q >= ps->end)
                    return rfail(ps->e, CAIRN_EINVAL, "'pattern': a group name is not closed");
                ps->p = q + 1;
            } else {
                return rfail(ps->e, CAIRN_EUNSUPPORTED, "'pattern': the group syntax '(?%.1s' is "
                             "not supported", ps->p + 1 < ps->end ? ps->p + 1 : "");
            }
        }
        if (++ps->depth > RE_MAX_NEST)
            return rfail(ps->e, CAIRN_EINVAL, "'pattern' nests groups deeper than %d", RE_MAX_NEST);
        atom = parse_alt(ps);
        ps->depth--;
        if (atom < 0)
            return ps->e->status ? ps->e->status : atom;
        if (ps->p >= ps->end || *ps->p != ')')
            return rfail(ps->e, CAIRN_EINVAL, "'pattern': a '(' is not closed");
        ps->p++;
    } else if (ch == '[') {
        ps->p++;
        atom = parse_class(ps);
    } else if (ch == '.') {
        ps->p++;
        cpset s = {0};
        /* ECMA-262's '.' (no line terminator); Python's excludes only \n */
        if (cpset_add(&s, 0, 9) || cpset_add(&s, 11, 12) || cpset_add(&s, 14, 0x2027) ||
            cpset_add(&s, 0x202a, CP_MAX)) {
            free(s.r);
            return rfail(ps->e, CAIRN_ENOMEM, "out of memory");
        }
        atom = set_node(ps, &s);
    } else if (ch == '^' || ch == '$') {
        ps->p++;
        anchor = true;
        atom = new_node(ps, (re_node){.kind = ch == '^' ? RN_BOL : RN_EOL});
    } else if (ch == '\\') {
        ps->p++;
        uint32_t cp;
        cls sh;
        int kind = parse_escape(ps, false, &cp, &sh);
        if (kind < 0)
            return kind;
        if (kind == 1) {
            free(sh.max.r);
            atom = set_node(ps, &sh.min);
        } else {
            atom = single_node(ps, cp, cp);
        }
    } else {
        uint32_t cp = next_cp(ps);
        atom = single_node(ps, cp, cp);
    }
    if (atom < 0)
        return ps->e->status ? ps->e->status : atom;
    /* quantifiers (lazy ones generate the same strings) */
    if (ps->p < ps->end && (*ps->p == '*' || *ps->p == '+' || *ps->p == '?' || *ps->p == '{')) {
        int32_t min, max;
        if (*ps->p == '{') {
            if (!parse_braces(ps, &min, &max))
                return rfail(ps->e, CAIRN_EUNSUPPORTED,
                             "'pattern': a literal '{' must be escaped as \\{ (engines differ)");
            if (min > RE_MAX_COUNT || max > RE_MAX_COUNT)
                return rfail(ps->e, CAIRN_ERANGE, "'pattern': a count above {%d} is not supported",
                             RE_MAX_COUNT);
            if (max >= 0 && max < min)
                return rfail(ps->e, CAIRN_EINVAL, "'pattern': {%d,%d} is out of order", min, max);
        } else {
            min = *ps->p == '+';
            max = *ps->p == '?' ? 1 : -1;
            ps->p++;
        }
        if (anchor)
            return rfail(ps->e, CAIRN_EUNSUPPORTED, "'pattern': a quantified anchor is not supported");
        if (ps->p < ps->end && *ps->p == '?')
            ps->p++;
        if (ps->p < ps->end && (*ps->p == '*' || *ps->p == '+' || *ps->p == '?' ||
                                (*ps->p == '{' && ps->p + 1 < ps->end && ps->p[1] >= '0' &&
                                 ps->p[1] <= '9')))
            return rfail(ps->e, CAIRN_EINVAL, "'pattern': nothing to repeat before '%c'", *ps->p);
        atom = new_node(ps, (re_node){.kind = RN_REP, .a = atom, .min = min, .max = max});
    }
    return atom;
}

static int32_t parse_cat(re_parser *ps)
{
    int32_t acc = -1;
    for (;;) {
        int32_t piece = parse_piece(ps);
        if (ps->e->status)
            return ps->e->status;
        if (piece < 0)
            break;
        acc = acc < 0 ? piece : new_node(ps, (re_node){.kind = RN_CAT, .a = acc, .b = piece});
        if (acc < 0)
            return acc;
    }
    return acc < 0 ? new_node(ps, (re_node){.kind = RN_EMPTY}) : acc;
}

static int32_t parse_alt(re_parser *ps)
{
    int32_t acc = parse_cat(ps);
    while (acc >= 0 && ps->p < ps->end && *ps->p == '|') {
        ps->p++;
        int32_t rhs = parse_cat(ps);
        if (rhs < 0)
            return rhs;
        acc = new_node(ps, (re_node){.kind = RN_ALT, .a = acc, .b = rhs});
    }
    return acc;
}

/* ---- Thompson NFA --------------------------------------------------------------- */

enum { NS_CHAR, NS_EPS, NS_BOL, NS_EOL, NS_MATCH };

typedef struct {
    uint8_t kind;
    int32_t set;       /* CHAR */
    int32_t out, out1; /* out1: EPS's second branch, or -1 */
} nfa_state;

typedef struct {
    nfa_state *s;
    int32_t n, cap;
    re_err *e;
} nfa;

static int32_t nfa_add(nfa *a, nfa_state st)
{
    if (a->n >= RE_MAX_NFA)
        return rfail(a->e, CAIRN_ERANGE,
                     "'pattern' expands to more than %d automaton states (counted repetition)",
                     RE_MAX_NFA);
    if (grow((void **)&a->s, &a->cap, a->n + 1, sizeof *a->s))
        return rfail(a->e, CAIRN_ENOMEM, "out of memory");
    a->s[a->n] = st;
    return a->n++;
}

/* The start of node `x`'s fragment, built backwards: it continues at `next`. */
static int32_t nfa_build(nfa *a, const re_node *nodes, int32_t x, int32_t next)
{
    if (next < 0)
        return next;
    const re_node *n = &nodes[x];
    switch (n->kind) {
    case RN_SET: return nfa_add(a, (nfa_state){NS_CHAR, n->set, next, -1});
    case RN_EMPTY: return next;
    case RN_BOL: return nfa_add(a, (nfa_state){NS_BOL, -1, next, -1});
    case RN_EOL: return nfa_add(a, (nfa_state){NS_EOL, -1, next, -1});
    case RN_CAT:
        /* the parser makes sequences left-deep: walk the spine, so a long
         * pattern does not recurse once per character */
        while (nodes[x].kind == RN_CAT && next >= 0) {
            next = nfa_build(a, nodes, nodes[x].b, next);
            x = nodes[x].a;
        }
        return nfa_build(a, nodes, x, next);
    case RN_ALT: {
        int32_t alt = -1;
        while (nodes[x].kind == RN_ALT) { /* left-deep as well */
            int32_t r = nfa_build(a, nodes, nodes[x].b, next);
            alt = r < 0 ? r : nfa_add(a, (nfa_state){NS_EPS, -1, r, alt < 0 ? -1 : alt});
            if (alt < 0)
                return alt;
            x = nodes[x].a;
        }
        int32_t l = nfa_build(a, nodes, x, next);
        return l < 0 ? l : nfa_add(a, (nfa_state){NS_EPS, -1, l, alt});
    }
    case RN_REP: {
        int32_t s = next;
        if (n->max < 0) { /* a loop: L -> body -> L, or on to next */
            int32_t loop = nfa_add(a, (nfa_state){NS_EPS, -1, -1, next});
            int32_t body = loop < 0 ? loop : nfa_build(a, nodes, n->a, loop);
            if (body < 0)
                return body;
            a->s[loop].out = body;
            s = loop;
        } else {
            for (int32_t i = n->min; i < n->max && s >= 0; i++) {
                int32_t body = nfa_build(a, nodes, n->a, s);
                s = body < 0 ? body : nfa_add(a, (nfa_state){NS_EPS, -1, body, next});
            }
        }
        for (int32_t i = 0; i < n->min && s >= 0; i++)
            s = nfa_build(a, nodes, n->a, s);
        return s;
    }
    }
    return rfail(a->e, CAIRN_EINVAL, "internal: a bad pattern node");
}


/* ---- DFAs under construction ---------------------------------------------------------- */

/* States are added in any order but given their edges in id order: the
 * caller sets first_edge[s] (db_begin) before s's edges, and seals at the end. */
typedef struct {
    int32_t n_states, cap_acc, cap_fe;
    uint8_t *accept;
    int32_t *first_edge;
    int32_t n_edges, cap_et, cap_er;
    int32_t *edge_target, *edge_range; /* edge_range: [n_edges + 1] */
    grammar_cprange *ranges;
    int32_t n_ranges, cap_ranges;
} dfa_build;

static int32_t db_state(dfa_build *d, bool accept)
{
    if (grow((void **)&d->accept, &d->cap_acc, d->n_states + 1, 1) ||
        grow((void **)&d->first_edge, &d->cap_fe, d->n_states + 2, sizeof *d->first_edge))
        return CAIRN_ENOMEM;
    d->accept[d->n_states] = accept;
    return d->n_states++;
}

static void db_begin(dfa_build *d, int32_t s) { d->first_edge[s] = d->n_edges; }
static void db_seal(dfa_build *d) { d->first_edge[d->n_states] = d->n_edges; }

static int db_edge(dfa_build *d, int32_t target, const grammar_cprange *r, int32_t n)
{
    if (grow((void **)&d->edge_target, &d->cap_et, d->n_edges + 1, sizeof *d->edge_target) ||
        grow((void **)&d->edge_range, &d->cap_er, d->n_edges + 2, sizeof *d->edge_range) ||
        grow((void **)&d->ranges, &d->cap_ranges, d->n_ranges + n, sizeof *d->ranges))
        return CAIRN_ENOMEM;
    d->edge_range[0] = 0;
    memcpy(d->ranges + d->n_ranges, r, (size_t)n * sizeof *r);
    d->n_ranges += n;
    d->edge_target[d->n_edges++] = target;
    d->edge_range[d->n_edges] = d->n_ranges;
    return CAIRN_OK;
}

static void db_free(dfa_build *d)
{
    free(d->accept);
    free(d->first_edge);
    free(d->edge_target);
    free(d->edge_range);
    free(d->ranges);
}

void grammar_dfa_free(grammar_dfa *d)
{
    if (!d)
        return;
    free(d->accept);
    free(d->first_edge);
    free(d->edge_target);
    free(d->edge_range);
    free(d->ranges);
    free(d);
}

/* Keep the states reachable from 0 that can reach acceptance, renumbered in
 * discovery order; an empty language gives n_states == 0. Frees `d`. */
static int db_trim(dfa_build *d, grammar_dfa **out)
{
    int32_t n = d->n_states;
    grammar_dfa *g = calloc(1, sizeof *g);
    uint8_t *live = calloc((size_t)n + 1, 1);
    int32_t *map = malloc(((size_t)n + 1) * sizeof *map);
    int32_t *order = malloc(((size_t)n + 1) * sizeof *order);
    int rc = CAIRN_ENOMEM;
    if (!g || !live || !map || !order)
        goto done;
    for (int32_t s = 0; s < n; s++)
        live[s] = d->accept[s];
    for (bool changed = true; changed;) { /* a fixpoint: a few rounds on these sizes */
        changed = false;
        for (int32_t s = n; s-- > 0;)
            for (int32_t e = d->first_edge[s]; !live[s] && e < d->first_edge[s + 1]; e++)
                if (live[d->edge_target[e]])
                    live[s] = changed = true;
    }
    int32_t m = 0;
    for (int32_t s = 0; s < n; s++)
        map[s] = -1;
    if (n > 0 && live[0]) {
        map[0] = 0;
        order[m++] = 0;
    }
    for (int32_t i = 0; i < m; i++)
        for (int32_t e = d->first_edge[order[i]]; e < d->first_edge[order[i] + 1]; e++) {
            int32_t t = d->edge_target[e];
            if (live[t] && map[t] < 0) {
                map[t] = m;
                order[m++] = t;
            }
        }
    int32_t n_edges = 0, n_ranges = 0;
    for (int32_t i = 0; i < m; i++)
        for (int32_t e = d->first_edge[order[i]]; e < d->first_edge[order[i] + 1]; e++)
            if (map[d->edge_target[e]] >= 0) {
                n_edges++;
                n_ranges += d->edge_range[e + 1] - d->edge_range[e];
            }
    g->n_states = m;
    g->accept = malloc((size_t)m + 1);
    g->first_edge = malloc(((size_t)m + 1) * sizeof *g->first_edge);
    g->edge_target = malloc(((size_t)n_edges + 1) * sizeof *g->edge_target);
    g->edge_range = malloc(((size_t)n_edges + 1) * sizeof *g->edge_range);
    g->ranges = malloc(((size_t)n_ranges + 1) * sizeof *g->ranges);
    if (!g->accept || !g->first_edge || !g->edge_target || !g->edge_range || !g->ranges)
        goto done;
    int32_t ke = 0, kr = 0;
    g->edge_range[0] = 0;
    for (int32_t i = 0; i < m; i++) {
        int32_t s = order[i];
        g->accept[i] = d->accept[s];
        g->first_edge[i] = ke;
        for (int32_t e = d->first_edge[s]; e < d->first_edge[s + 1]; e++) {
            if (map[d->edge_target[e]] < 0)
                continue;
            int32_t nr = d->edge_range[e + 1] - d->edge_range[e];
            memcpy(g->ranges + kr, d->ranges + d->edge_range[e], (size_t)nr * sizeof *g->ranges);
            kr += nr;
            g->edge_target[ke++] = map[d->edge_target[e]];
            g->edge_range[ke] = kr;
        }
    }
    g->first_edge[m] = ke;
    *out = g;
    g = NULL;
    rc = CAIRN_OK;
done:
    grammar_dfa_free(g);
    free(live);
    free(map);
    free(order);
    db_free(d);
    return rc;
}

/* Open-addressing map from an int sequence to a state id (ids dense from 0). */
typedef struct {
    int32_t *slot; /* state id or -1 */
    uint32_t mask;
    int32_t *keys; /* keys back to back */
    int64_t n_keys, cap_keys;
    int64_t *key_off; /* [ids + 1] */
    int32_t cap_off;
} seq_map;

static uint32_t seq_hash(const int32_t *k, int32_t n)
{
    uint32_t h = 2166136261u ^ (uint32_t)n;
    for (int32_t i = 0; i < n; i++)
        h = (h ^ (uint32_t)k[i]) * 16777619u;
    return h;
}

/* slots: a power of two above RE_MAX_DFA, so the table never fills. */
static int seq_init(seq_map *m)
{
    uint32_t slots = 8192;
    *m = (seq_map){0};
    m->slot = malloc(slots * sizeof *m->slot);
    m->key_off = malloc(2 * sizeof *m->key_off);
    m->cap_off = 2;
    if (!m->slot || !m->key_off)
        return CAIRN_ENOMEM;
    memset(m->slot, -1, slots * sizeof *m->slot);
    m->mask = slots - 1;
    m->key_off[0] = 0;
    return CAIRN_OK;
}

static void seq_free(seq_map *m)
{
    free(m->slot);
    free(m->keys);
    free(m->key_off);
}

/* The id of key k (n ints); a new key gets id `next_id` (*added). */
static int32_t seq_get(seq_map *m, const int32_t *k, int32_t n, int32_t next_id, bool *added)
{
    uint32_t h = seq_hash(k, n) & m->mask;
    *added = false;
    while (m->slot[h] >= 0) {
        int32_t id = m->slot[h];
        int64_t off = m->key_off[id];
        if (m->key_off[id + 1] - off == n && memcmp(m->keys + off, k, (size_t)n * sizeof *k) == 0)
            return id;
        h = (h + 1) & m->mask;
    }
    if (m->n_keys + n > m->cap_keys) {
        int64_t cap = m->cap_keys ? m->cap_keys * 2 : 1024;
        while (cap < m->n_keys + n)
            cap *= 2;
        int32_t *nk = realloc(m->keys, (size_t)cap * sizeof *nk);
        if (!nk)
            return CAIRN_ENOMEM;
        m->keys = nk;
        m->cap_keys = cap;
    }
    if (next_id + 2 > m->cap_off) {
        int32_t cap = m->cap_off * 2 > next_id + 2 ? m->cap_off * 2 : next_id + 2;
        int64_t *no = realloc(m->key_off, (size_t)cap * sizeof *no);
        if (!no)
            return CAIRN_ENOMEM;
        m->key_off = no;
        m->cap_off = cap;
    }
    memcpy(m->keys + m->n_keys, k, (size_t)n * sizeof *k);
    m->n_keys += n;
    m->key_off[next_id + 1] = m->n_keys;
    m->slot[h] = next_id;
    *added = true;
    return next_id;
}

/* ---- minimization ------------------------------------------------------------------------
 * Moore's refinement: states are split by acceptance, then by where each
 * code point leads (in blocks of the previous round) until nothing splits.
 * Besides a smaller grammar this merges, for an unanchored pattern, every
 * state after the match into one that loops on any character, which the
 * matcher then masks per token instead of walking its whole vocabulary. */

typedef struct {
    uint32_t lo, hi;
    int32_t block;
} range_to;

static int cmp_range_to(const void *a, const void *b)
{
    const range_to *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* State s's transitions as sorted, merged (lo, hi, block) triples. */
static int32_t signature(const grammar_dfa *d, int32_t s, const int32_t *block, range_to *out)
{
    int32_t n = 0;
    for (int32_t e = d->first_edge[s]; e < d->first_edge[s + 1]; e++)
        for (int32_t k = d->edge_range[e]; k < d->edge_range[e + 1]; k++)
            out[n++] = (range_to){d->ranges[k].lo, d->ranges[k].hi, block[d->edge_target[e]]};
    qsort(out, (size_t)n, sizeof *out, cmp_range_to);
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        if (m > 0 && out[m - 1].block == out[i].block && out[m - 1].hi + 1 == out[i].lo)
            out[m - 1].hi = out[i].hi;
        else
            out[m++] = out[i];
    }
    return m;
}

/* *d replaced by its minimal equivalent (state 0 still the start). */
static int dfa_minimize(grammar_dfa **dp)
{
    grammar_dfa *d = *dp;
    int32_t n = d->n_states, n_ranges = d->edge_range[d->first_edge[n]];
    if (n < 2)
        return CAIRN_OK;
    int32_t *block = malloc((size_t)n * sizeof *block), *next = malloc((size_t)n * sizeof *next);
    range_to *sig = malloc(((size_t)n_ranges + 1) * sizeof *sig);
    int32_t *key = malloc(((size_t)n_ranges * 3 + 2) * sizeof *key);
    dfa_build b = {0};
    int rc = CAIRN_ENOMEM;
    if (!block || !next || !sig || !key)
        goto done;
    for (int32_t s = 0; s < n; s++)
        block[s] = d->accept[s];
    for (int32_t n_blocks = -1;;) {
        seq_map map;
        if (seq_init(&map))
            goto done;
        int32_t count = 0;
        for (int32_t s = 0; s < n; s++) {
            int32_t m = signature(d, s, block, sig), k = 0;
            key[k++] = block[s];
            for (int32_t i = 0; i < m; i++) {
                key[k++] = (int32_t)sig[i].lo;
                key[k++] = (int32_t)sig[i].hi;
                key[k++] = sig[i].block;
            }
            bool added;
            int32_t id = seq_get(&map, key, k, count, &added);
            if (id < 0) {
                seq_free(&map);
                goto done;
            }
            count += added;
            next[s] = id;
        }
        seq_free(&map);
        memcpy(block, next, (size_t)n * sizeof *block);
        if (count == n_blocks)
            break;
        n_blocks = count;
    }
    /* one state per block, numbered as first met: state 0's block is 0 */
    int32_t n_blocks = 0;
    for (int32_t s = 0; s < n; s++)
        n_blocks = block[s] + 1 > n_blocks ? block[s] + 1 : n_blocks;
    int32_t *rep = malloc((size_t)n_blocks * sizeof *rep);
    if (!rep)
        goto done;
    for (int32_t i = 0; i < n_blocks; i++)
        rep[i] = -1;
    for (int32_t s = 0; s < n; s++)
        if (rep[block[s]] < 0)
            rep[block[s]] = s;
    for (int32_t i = 0; i < n_blocks; i++)
        if (db_state(&b, d->accept[rep[i]]) < 0) {
            free(rep);
            goto done;
        }
    for (int32_t i = 0; i < n_blocks; i++) {
        db_begin(&b, i);
        int32_t m = signature(d, rep[i], block, sig);
        /* one edge per target block, its ranges in order */
        for (int32_t a = 0; a < m; a++) {
            if (sig[a].block < 0)
                continue;
            int32_t t = sig[a].block, nr = 0;
            grammar_cprange *tmp = (grammar_cprange *)key; /* key is large enough */
            for (int32_t k = a; k < m; k++)
                if (sig[k].block == t) {
                    tmp[nr++] = (grammar_cprange){sig[k].lo, sig[k].hi};
                    sig[k].block = -1;
                }
            if (db_edge(&b, t, tmp, nr)) {
                free(rep);
                goto done;
            }
        }
    }
    db_seal(&b);
    free(rep);
    grammar_dfa *min = NULL;
    rc = db_trim(&b, &min); /* frees b */
    b = (dfa_build){0};
    if (rc == CAIRN_OK) {
        grammar_dfa_free(d);
        *dp = min;
    }
done:
    db_free(&b);
    free(block);
    free(next);
    free(sig);
    free(key);
    return rc;
}

/* ---- subset construction ---------------------------------------------------------------- */

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    const nfa *a;
    int32_t *stack, *mark;
    int32_t stamp;
} closure_ws;

/* The CHAR states reachable from `seeds` over epsilons (and ^ when bol, $
 * when eol), sorted into out; *match: MATCH is reachable. */
static int32_t closure(closure_ws *w, const int32_t *seeds, int32_t n_seeds, bool bol, bool eol,
                       int32_t *out, bool *match)
{
    const nfa_state *s = w->a->s;
    int32_t sp = 0, n = 0;
    w->stamp++;
    *match = false;
    for (int32_t i = 0; i < n_seeds; i++)
        if (w->mark[seeds[i]] != w->stamp) {
            w->mark[seeds[i]] = w->stamp;
            w->stack[sp++] = seeds[i];
        }
    while (sp > 0) {
        int32_t x = w->stack[--sp];
        int32_t next[2] = {-1, -1};
        switch (s[x].kind) {
        case NS_CHAR: out[n++] = x; break;
        case NS_MATCH: *match = true; break;
        case NS_EPS: next[0] = s[x].out; next[1] = s[x].out1; break;
        case NS_BOL: if (bol) next[0] = s[x].out; break;
        case NS_EOL: if (eol) next[0] = s[x].out; break;
        }
        for (int k = 0; k < 2; k++)
            if (next[k] >= 0 && w->mark[next[k]] != w->stamp) {
                w->mark[next[k]] = w->stamp;
                w->stack[sp++] = next[k];
            }
    }
    qsort(out, (size_t)n, sizeof *out, cmp_i32); /* equal sets must compare equal */
    return n;
}

/* A DFA state's key: [accept, sorted CHAR states...]. Transitions use the
 * closure without $ (nothing is consumed after it); acceptance the one with. */
static int subset_construct(const nfa *a, int32_t start, const cpset *sets, dfa_build *d, re_err *e)
{
    int32_t n_b = 0, cap_b = 0, n_atoms = 0;
    uint32_t *bounds = NULL;
    int rc = CAIRN_ENOMEM;
    size_t n1 = (size_t)a->n + 2;
    closure_ws w = {a, malloc(n1 * sizeof(int32_t)), calloc(n1, sizeof(int32_t)), 0};
    int32_t *cur = malloc(n1 * sizeof *cur), *seeds = malloc(n1 * sizeof *seeds);
    int32_t *key = malloc(n1 * sizeof *key), *scratch = malloc(n1 * sizeof *scratch);
    int32_t *targets = NULL;
    grammar_cprange *tmp = NULL;
    seq_map map;
    bool match, acc, added;
    if (seq_init(&map) || !w.stack || !w.mark || !cur || !seeds || !key || !scratch)
        goto done;
    /* atoms: the intervals between every boundary of every set */
    for (int32_t i = 0; i < a->n; i++) {
        if (a->s[i].kind != NS_CHAR)
            continue;
        const cpset *st = &sets[a->s[i].set];
        if (grow((void **)&bounds, &cap_b, n_b + 2 * st->n, sizeof *bounds))
            goto done;
        for (int32_t k = 0; k < st->n; k++) {
            bounds[n_b++] = st->r[k].lo;
            bounds[n_b++] = st->r[k].hi + 1;
        }
    }
    if (grow((void **)&bounds, &cap_b, n_b + 2, sizeof *bounds))
        goto done;
    bounds[n_b++] = 0;
    bounds[n_b++] = CP_MAX + 1;
    qsort(bounds, (size_t)n_b, sizeof *bounds, cmp_u32);
    for (int32_t i = 0; i < n_b; i++)
        if (n_atoms == 0 || bounds[i] != bounds[n_atoms - 1])
            bounds[n_atoms++] = bounds[i];
    n_atoms--; /* atom i is [bounds[i], bounds[i+1]) */
    targets = malloc(((size_t)n_atoms + 1) * sizeof *targets);
    tmp = malloc(((size_t)n_atoms + 1) * sizeof *tmp);
    if (!targets || !tmp)
        goto done;
    /* the start: ^ is passable before the first character */
    int32_t n = closure(&w, &start, 1, true, false, key + 1, &match);
    (void)closure(&w, &start, 1, true, true, scratch, &acc);
    key[0] = acc;
    if (seq_get(&map, key, n + 1, 0, &added) < 0 || db_state(d, acc) < 0)
        goto done;
    long work = 0;
    for (int32_t ds = 0; ds < d->n_states; ds++) {
        int64_t off = map.key_off[ds];
        int32_t n_cur = (int32_t)(map.key_off[ds + 1] - off) - 1;
        memcpy(cur, map.keys + off + 1, (size_t)n_cur * sizeof *cur);
        for (int32_t at = 0; at < n_atoms; at++) {
            targets[at] = -1;
            uint32_t cp = bounds[at];
            if (cp >= 0xd800 && cp <= 0xdfff)
                continue; /* the surrogates' atom: not characters */
            int32_t n_seeds = 0;
            for (int32_t i = 0; i < n_cur; i++) {
                const cpset *st = &sets[a->s[cur[i]].set];
                if (ranges_have(st->r, st->n, cp))
                    seeds[n_seeds++] = a->s[cur[i]].out;
            }
            if ((work += n_cur + 1) > RE_MAX_WORK) {
                rc = rfail(e, CAIRN_ERANGE, "'pattern' is too complex to compile");
                goto done;
            }
            if (n_seeds == 0)
                continue;
            int32_t nk = closure(&w, seeds, n_seeds, false, false, key + 1, &match);
            (void)closure(&w, seeds, n_seeds, false, true, scratch, &acc);
            if (nk == 0 && !acc)
                continue; /* dead */
            key[0] = acc;
            int32_t id = seq_get(&map, key, nk + 1, d->n_states, &added);
            if (id < 0)
                goto done;
            if (added) {
                if (d->n_states >= RE_MAX_DFA) {
                    rc = rfail(e, CAIRN_ERANGE, "'pattern' needs more than %d automaton states",
                               RE_MAX_DFA);
                    goto done;
                }
                if (db_state(d, acc) < 0)
                    goto done;
            }
            targets[at] = id;
        }
        /* ds's edges: its atoms grouped by target */
        db_begin(d, ds);
        for (int32_t at = 0; at < n_atoms; at++) {
            int32_t t = targets[at];
            if (t < 0)
                continue;
            int32_t nr = 0;
            for (int32_t k = at; k < n_atoms; k++) {
                if (targets[k] != t)
                    continue;
                targets[k] = -1;
                uint32_t lo = bounds[k], hi = bounds[k + 1] - 1;
                if (nr > 0 && tmp[nr - 1].hi + 1 == lo)
                    tmp[nr - 1].hi = hi;
                else
                    tmp[nr++] = (grammar_cprange){lo, hi};
            }
            if (db_edge(d, t, tmp, nr))
                goto done;
        }
    }
    db_seal(d);
    rc = CAIRN_OK;
done:
    if (rc == CAIRN_ENOMEM)
        rfail(e, rc, "out of memory");
    seq_free(&map);
    free(w.stack);
    free(w.mark);
    free(cur);
    free(seeds);
    free(key);
    free(scratch);
    free(bounds);
    free(targets);
    free(tmp);
    return rc;
}

/* ---- entry points ------------------------------------------------------------------------ */

static int32_t add_set(re_parser *ps, cpset *s)
{
    if (grow((void **)&ps->sets, &ps->cap_sets, ps->n_sets + 1, sizeof *ps->sets)) {
        free(s->r);
        return rfail(ps->e, CAIRN_ENOMEM, "out of memory");
    }
    ps->sets[ps->n_sets] = *s;
    *s = (cpset){0};
    return ps->n_sets++;
}

/* A loop over every character, continuing at `next`: [\s\S]* */
static int32_t any_loop(nfa *a, int32_t any_set, int32_t next)
{
    int32_t loop = next < 0 ? next : nfa_add(a, (nfa_state){NS_EPS, -1, -1, next});
    int32_t ch = loop < 0 ? loop : nfa_add(a, (nfa_state){NS_CHAR, any_set, loop, -1});
    if (ch >= 0)
        a->s[loop].out = ch;
    return ch < 0 ? ch : loop;
}

int grammar_regex_dfa(const char *re, size_t len, bool search, grammar_dfa **out, char *err,
                      size_t err_len)
{
    re_err e = {err, err_len, CAIRN_OK};
    re_parser ps = {.p = re, .end = re + len, .e = &e};
    nfa a = {.e = &e};
    dfa_build d = {0};
    *out = NULL;
    int32_t root = parse_alt(&ps);
    if (root >= 0 && ps.p < ps.end)
        rfail(&e, CAIRN_EINVAL, "'pattern': a ')' has no '('");
    cpset any = {0};
    int32_t any_set = e.status ? -1 : cpset_add(&any, 0, CP_MAX) ? -1 : add_set(&ps, &any);
    if (any_set < 0 && !e.status)
        rfail(&e, CAIRN_ENOMEM, "out of memory");
    free(any.r);
    if (!e.status) {
        /* search: the match may start and end anywhere: [\s\S]* p [\s\S]* */
        int32_t match = nfa_add(&a, (nfa_state){NS_MATCH, -1, -1, -1});
        int32_t next = search ? any_loop(&a, any_set, match) : match;
        int32_t body = next < 0 ? next : nfa_build(&a, ps.nodes, root, next);
        int32_t start = search && body >= 0 ? any_loop(&a, any_set, body) : body;
        if (start >= 0 && subset_construct(&a, start, ps.sets, &d, &e) == CAIRN_OK &&
            (db_trim(&d, out) != CAIRN_OK || dfa_minimize(out) != CAIRN_OK))
            rfail(&e, CAIRN_ENOMEM, "out of memory");
        else if (e.status)
            db_free(&d);
    }
    for (int32_t i = 0; i < ps.n_sets; i++)
        free(ps.sets[i].r);
    free(ps.sets);
    free(ps.nodes);
    free(a.s);
    return e.status;
}

int grammar_dfa_intersect(const grammar_dfa *x, const grammar_dfa *y, grammar_dfa **out,
                          char *err, size_t err_len)
{
    re_err e = {err, err_len, CAIRN_OK};
    dfa_build d = {0};
    seq_map map;
    int32_t *px = NULL, *py = NULL, cap_p = 0;
    grammar_cprange *tmp = NULL;
    int32_t cap_tmp = 0;
    bool added;
    *out = NULL;
    int rc = CAIRN_ENOMEM;
    if (seq_init(&map))
        goto done;
    if (x->n_states > 0 && y->n_states > 0) {
        int32_t k0[2] = {0, 0};
        if (seq_get(&map, k0, 2, 0, &added) < 0 || db_state(&d, x->accept[0] && y->accept[0]) < 0 ||
            grow((void **)&px, &cap_p, 1, sizeof *px) || !(py = malloc((size_t)cap_p * sizeof *py)))
            goto done;
        px[0] = py[0] = 0;
    }
    for (int32_t ds = 0; ds < d.n_states; ds++) {
        db_begin(&d, ds);
        int32_t sx = px[ds], sy = py[ds];
        for (int32_t ex = x->first_edge[sx]; ex < x->first_edge[sx + 1]; ex++)
            for (int32_t ey = y->first_edge[sy]; ey < y->first_edge[sy + 1]; ey++) {
                const grammar_cprange *rx = x->ranges + x->edge_range[ex];
                const grammar_cprange *ry = y->ranges + y->edge_range[ey];
                int32_t nx = x->edge_range[ex + 1] - x->edge_range[ex];
                int32_t ny = y->edge_range[ey + 1] - y->edge_range[ey];
                if (grow((void **)&tmp, &cap_tmp, nx + ny, sizeof *tmp))
                    goto done;
                int32_t n = 0;
                for (int32_t i = 0, j = 0; i < nx && j < ny;) {
                    uint32_t lo = rx[i].lo > ry[j].lo ? rx[i].lo : ry[j].lo;
                    uint32_t hi = rx[i].hi < ry[j].hi ? rx[i].hi : ry[j].hi;
                    if (lo <= hi)
                        tmp[n++] = (grammar_cprange){lo, hi};
                    if (rx[i].hi < ry[j].hi)
                        i++;
                    else
                        j++;
                }
                if (n == 0)
                    continue;
                int32_t tx = x->edge_target[ex], ty = y->edge_target[ey];
                int32_t key[2] = {tx, ty};
                int32_t id = seq_get(&map, key, 2, d.n_states, &added);
                if (id < 0)
                    goto done;
                if (added) {
                    if (d.n_states >= RE_MAX_DFA) {
                        rc = rfail(&e, CAIRN_ERANGE,
                                   "'pattern' and 'format' together need more than %d automaton "
                                   "states", RE_MAX_DFA);
                        goto done;
                    }
                    if (db_state(&d, x->accept[tx] && y->accept[ty]) < 0 ||
                        grow((void **)&px, &cap_p, d.n_states, sizeof *px))
                        goto done;
                    int32_t *np = realloc(py, (size_t)cap_p * sizeof *np);
                    if (!np)
                        goto done;
                    py = np;
                    px[id] = tx;
                    py[id] = ty;
                }
                if (db_edge(&d, id, tmp, n))
                    goto done;
            }
    }
    if (d.n_states == 0) { /* an empty language: one dead state */
        if (db_state(&d, false) < 0)
            goto done;
        db_begin(&d, 0);
    }
    db_seal(&d);
    rc = db_trim(&d, out);
    d = (dfa_build){0};
    if (rc == CAIRN_OK)
        rc = dfa_minimize(out);
done:
    if (rc == CAIRN_ENOMEM)
        rfail(&e, rc, "out of memory");
    db_free(&d);
    seq_free(&map);
    free(px);
    free(py);
    free(tmp);
    return e.status ? e.status : rc;
}
