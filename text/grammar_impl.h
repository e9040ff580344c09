/*
 * text/grammar_impl.h — the compiled form of a grammar, shared by the
 * schema compiler (text/grammar_compile.c) and the matcher
 * (text/grammar_match.c), and visible to white-box tests. Nothing outside
 * text/ includes this.
 *
 * A grammar is a set of rules over bytes. Rule r's body starts at
 * elems[rule_start[r]] and is a list of alternatives, each a sequence of
 * elements ended by GRAMMAR_ALT_END; the last alternative is followed by
 * GRAMMAR_RULE_END. An element is either a byte set (match one byte in
 * sets[v]) or a reference to rule v. The grammar has no left recursion (every
 * recursive reference is preceded by a byte), so expanding references
 * always terminates.
 */
#ifndef CAIRN_TEXT_GRAMMAR_IMPL_H
#define CAIRN_TEXT_GRAMMAR_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Largest minItems/maxItems/minLength/maxLength the compiler accepts; the
 * matcher sizes its per-string state (MAX_PLAIN_LEVELS) above it. */
#define MAX_REPEAT 1024

typedef enum {
    GRAMMAR_SET = 1,     /* match one byte of sets[v]                        */
    GRAMMAR_REF = 2,     /* match rule v                                     */
    GRAMMAR_ALT_END = 3, /* end of one alternative                           */
    GRAMMAR_RULE_END = 4,/* end of the rule's last alternative               */
} grammar_elem_kind;

typedef struct {
    uint8_t kind;
    int32_t v;
} grammar_elem;

typedef struct {
    uint64_t bits[4]; /* bit b: byte b is in the set */
} grammar_byteset;

struct cairn_grammar {
    atomic_int refs;     /* owners: 1 + cairn_grammar_retain calls */
    grammar_elem *elems;
    int32_t n_elems;
    int32_t *rule_start; /* [n_rules] */
    int32_t n_rules;
    grammar_byteset *sets;
    int32_t n_sets;
    int32_t root;
};

/* ---- regular languages (text/grammar_regex.c) -------------------------------
 * A DFA over code points (never surrogates), for `pattern` and `format`:
 * state 0 starts; state s's edges are [first_edge[s], first_edge[s+1]), edge
 * e goes to edge_target[e] on the code points of ranges[edge_range[e] ..
 * edge_range[e+1]) (sorted, disjoint; a state's edges are disjoint too).
 * Every state is reachable and can reach an accepting one; n_states == 0
 * means no string at all. */
typedef struct {
    uint32_t lo, hi;
} grammar_cprange;

typedef struct {
    int32_t n_states;
    uint8_t *accept;      /* [n_states] */
    int32_t *first_edge;  /* [n_states + 1] */
    int32_t *edge_target; /* [edges] */
    int32_t *edge_range;  /* [edges + 1] */
    grammar_cprange *ranges;
} grammar_dfa;

/* The strings `re` (len bytes of UTF-8, ECMA-262 syntax) matches: search
 * true as JSON Schema's `pattern` means it (a match anywhere, unless
 * anchored by ^ and $), false for a whole-string match. CAIRN_EINVAL for
 * bad syntax, CAIRN_EUNSUPPORTED for constructs cairn does not generate
 * (lookaround, backreferences, , ...), CAIRN_ERANGE past the size limits;
 * err names the construct. */
int grammar_regex_dfa(const char *re, size_t len, bool search, grammar_dfa **out, char *err,
                      size_t err_len);
/* The strings both x and y accept. */
int grammar_dfa_intersect(const grammar_dfa *x, const grammar_dfa *y, grammar_dfa **out,
                          char *err, size_t err_len);
void grammar_dfa_free(grammar_dfa *d);

#endif
