/*
 * tests/spec/test_suffix.c — the suffix drafter (model/spec_suffix.c) on
 * token sequences built here, through its drafter table as model/spec.c
 * calls it: matches in the request and in the corpus, weighting by how often
 * a continuation followed, tenants kept apart, the ring's bound, and the
 * draft's depth following the match's length.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "model/spec_impl.h"

#define CAP 64

typedef struct {
    spec_tree t;
    int32_t token[CAP], parent[CAP], depth[CAP];
    uint32_t source[CAP];
} tree_buf;

static void tree_init(tree_buf *b, int32_t root)
{
    memset(b, 0, sizeof *b);
    b->t = (spec_tree){.n = 1, .cap = CAP, .token = b->token, .parent = b->parent,
                       .depth = b->depth, .source = b->source};
    b->token[0] = root;
    b->parent[0] = -1;
}

/* What the drafter proposes for `tokens` (the last one pending) of `tenant`
 * with a budget of `rows`; the tree in *b. */
static void propose(spec_suffix *corpus, uint64_t tenant, const int32_t *tokens, int n, int rows,
                    tree_buf *b)
{
    cairn_spec_params p = cairn_spec_defaults();
    void *state = NULL;
    assert_int_equal(spec_suffix_ops.seq_create(corpus, &p, NULL, &state), CAIRN_OK);
    const spec_view v = {.tokens = tokens, .n_past = n - 1, .n_known = n, .chain_len = rows,
                         .tenant = tenant};
    tree_init(b, tokens[n - 1]);
    assert_int_equal(spec_suffix_ops.propose(state, &v, &b->t, CAP - 1, 0), CAIRN_OK);
    spec_suffix_ops.seq_free(state);
}

/* The chain under the root that follows the first child each time. */
static int main_chain(const tree_buf *b, int32_t *out)
{
    int n = 0, row = 0;
    for (;;) {
        int child = -1;
        for (int r = row + 1; r < b->t.n; r++)
            if (b->parent[r] == row) {
                child = r;
                break;
            }
        if (child < 0)
            return n;
        out[n++] = b->token[child];
        row = child;
    }
}

static void own_context(void **unused)
{
    (void)unused;
    spec_suffix *c;
    assert_int_equal(spec_suffix_create(0, &c), CAIRN_OK);
    /* ... 1 2 3 4 5 6 7 8 ... 1 2 3 [pending]: guesses 4 5 6 ... */
    const int32_t h[] = {9, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 1, 2, 3};
    tree_buf b;
    int32_t chain[CAP];
    propose(c, 0, h, 14, 16, &b);
    const int n = main_chain(&b, chain);
    /* a three-token match guesses at most six tokens */
    const int32_t want[] = {4, 5, 6, 7, 8, 10};
    assert_int_equal(n, 6);
    for (int i = 0; i < n; i++)
        assert_int_equal(chain[i], want[i]);
    /* nothing to match: nothing proposed */
    const int32_t fresh[] = {1, 2, 3, 4, 5};
    propose(c, 0, fresh, 5, 16, &b);
    assert_int_equal(b.t.n, 1);
    /* the controller's row budget bounds the draft */
    propose(c, 0, h, 14, 2, &b);
    assert_int_equal(b.t.n, 3);
    spec_suffix_free(c);
}

static void corpus_by_tenant(void **unused)
{
    (void)unused;
    spec_suffix *c;
    assert_int_equal(spec_suffix_create(4096, &c), CAIRN_OK);
    const int32_t alice[] = {100, 101, 102, 103, 104, 105, 106, 107, 108, 109};
    assert_int_equal(spec_suffix_add(c, 7, alice, 10), CAIRN_OK);
    const int32_t ask[] = {50, 51, 100, 101, 102, 103};
    tree_buf b;
    int32_t chain[CAP];
    propose(c, 7, ask, 6, 16, &b);
    const int n = main_chain(&b, chain);
    assert_int_equal(n, 6);
    for (int i = 0; i < n; i++)
        assert_int_equal(chain[i], 104 + i);
    /* the same tokens asked by another tenant, or by no tenant: nothing */
    propose(c, 8, ask, 6, 16, &b);
    assert_int_equal(b.t.n, 1);
    propose(c, 0, ask, 6, 16, &b);
    assert_int_equal(b.t.n, 1);
    spec_suffix_free(c);
}

static void weighted_by_frequency(void **unused)
{
    (void)unused;
    spec_suffix *c;
    assert_int_equal(spec_suffix_create(4096, &c), CAIRN_OK);
    /* after 5 6 7 8 came 20 three times, 30 once, and (a shorter match) 40 */
    const int32_t a[] = {5, 6, 7, 8, 20, 21}, b2[] = {5, 6, 7, 8, 30, 31}, d[] = {7, 8, 40, 41};
    for (int i = 0; i < 3; i++)
        assert_int_equal(spec_suffix_add(c, 1, a, 6), CAIRN_OK);
    assert_int_equal(spec_suffix_add(c, 1, b2, 6), CAIRN_OK);
    assert_int_equal(spec_suffix_add(c, 1, d, 4), CAIRN_OK);
    const int32_t ask[] = {5, 6, 7, 8};
    tree_buf b;
    propose(c, 1, ask, 4, 16, &b);
    /* the main chain is the frequent continuation, the other a branch with
     * a quarter of the weight; the two-token match is not weighed beside
     * four-token ones */
    assert_true(b.t.n >= 3);
    assert_int_equal(b.token[1], 20);
    assert_int_equal(b.parent[1], 0);
    bool has30 = false, has40 = false;
    for (int r = 1; r < b.t.n; r++) {
        has30 |= b.token[r] == 30 && b.parent[r] == 0;
        has40 |= b.token[r] == 40;
    }
    assert_true(has30);
    assert_false(has40);
    /* a match never runs across two requests' text */
    const int32_t ask2[] = {21, 5, 6};
    propose(c, 1, ask2, 3, 16, &b);
    int32_t chain[CAP];
    assert_int_equal(main_chain(&b, chain), 4); /* 7 8 20 21: a 2-token match, 4 deep */
    spec_suffix_free(c);
}

static void bounded_ring(void **unused)
{
    (void)unused;
    spec_suffix *c;
    assert_int_equal(spec_suffix_create(256, &c), CAIRN_OK);
    int32_t seg[40];
    for (int s = 0; s < 100; s++) {
        for (int i = 0; i < 40; i++)
            seg[i] = 1000 + s * 40 + i; /* every token once */
        assert_int_equal(spec_suffix_add(c, 3, seg, 40), CAIRN_OK);
    }
    assert_int_equal(spec_suffix_tokens(c), 256);
    tree_buf b;
    /* the oldest text is gone; the newest is found */
    const int32_t old[] = {1000, 1001, 1002};
    propose(c, 3, old, 3, 8, &b);
    assert_int_equal(b.t.n, 1);
    const int32_t recent[] = {1000 + 99 * 40 + 10, 1000 + 99 * 40 + 11};
    propose(c, 3, recent, 2, 8, &b);
    assert_int_equal(b.t.n, 5); /* a two-token match: four guesses */
    assert_int_equal(b.token[1], 1000 + 99 * 40 + 12);
    spec_suffix_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(own_context),
        cmocka_unit_test(corpus_by_tenant),
        cmocka_unit_test(weighted_by_frequency),
        cmocka_unit_test(bounded_ring),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
