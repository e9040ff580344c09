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

#endif
