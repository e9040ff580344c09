/*
 * tests/radix/test_radix.c — the radix tree on its own: the header's
 * examples, then random operations against a naive model (a plain list of
 * token sequences), with the tree's invariant check after every step.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "radix/radix.h"
#include "tests/support/support.h"

#define PS 4

static const cairn_page_hash SEED = {.lo = 0x1234, .hi = 0x5678};

/* "abcd" -> token ids 'a','b','c','d' */
static void letters(const char *s, int32_t *out, size_t *n)
{
    size_t k = 0;
    for (; *s; s++)
        if (*s != ' ')
            out[k++] = (int32_t)*s;
    *n = k;
}

static void test_header_example(void **state)
{
    (void)state;
    cairn_radix *t;
    assert_int_equal(cairn_radix_create(PS, SEED, &t), CAIRN_OK);
    int32_t tok[64];
    size_t n, cached;
    int32_t ids[16];
    for (int i = 0; i < 16; i++)
        ids[i] = 100 + i;
    cairn_radix_node *leaf;

    letters("abcd efgh ijkl", tok, &n);
    assert_int_equal(cairn_radix_insert(t, 0, tok, n / PS, ids, &cached, &leaf), CAIRN_OK);
    assert_int_equal(cached, 0);
    assert_int_equal(cairn_radix_node_depth(leaf), 3);

    letters("abcd efgh mnop qrst", tok, &n);
    assert_int_equal(cairn_radix_insert(t, 0, tok, n / PS, ids + 3, &cached, &leaf), CAIRN_OK);
    assert_int_equal(cached, 2); /* abcd efgh were there: split of [abcd efgh ijkl] */
    cairn_radix_node *mnop_qrst = leaf;
    assert_int_equal(cairn_radix_node_pages(leaf, NULL), 2);

    letters("abcd wxyz", tok, &n);
    assert_int_equal(cairn_radix_insert(t, 0, tok, n / PS, ids + 7, &cached, &leaf), CAIRN_OK);
    assert_int_equal(cached, 1);
    assert_int_equal(cairn_radix_check(t), CAIRN_OK);

    cairn_radix_stats st;
    cairn_radix_get_stats(t, &st);
    assert_int_equal(st.n_nodes, 5); /* abcd, efgh, ijkl, mnop qrst, wxyz */
    assert_int_equal(st.pages[CAIRN_TIER_DEVICE], 6);

    /* A match ending inside [mnop qrst] splits it; the old handle keeps qrst. */
    letters("abcd efgh mnop uvwx zz", tok, &n);
    cairn_radix_match_result m;
    assert_int_equal(cairn_radix_match(t, 0, tok, n, &m), CAIRN_OK);
    assert_int_equal(m.n_pages, 3);
    assert_int_equal(cairn_radix_node_pages(m.node, NULL), 1);
    assert_ptr_equal(cairn_radix_parent(mnop_qrst), m.node);
    assert_int_equal(cairn_radix_node_depth(mnop_qrst), 4);
    cairn_radix_page *pg;
    cairn_radix_node_pages(mnop_qrst, &pg);
    assert_int_equal(pg[0].device_page, 100 + 3 + 3); /* qrst was inserted with ids+3, 4th page */
    assert_int_equal(cairn_radix_check(t), CAIRN_OK);

    /* Pages come back in path order with their ids; the hash chain is the
     * one documented: h_i = H(h_{i-1} || page i). */
    cairn_radix_page *path[8];
    size_t np;
    assert_int_equal(cairn_radix_path(m.node, path, 8, &np), CAIRN_OK);
    assert_int_equal(np, 3);
    assert_int_equal(path[0]->device_page, 100);
    assert_int_equal(path[1]->device_page, 101);
    assert_int_equal(path[2]->device_page, 105);
    cairn_page_hash h = SEED;
    for (size_t i = 0; i < 3; i++) {
        h = cairn_page_hash_next(h, tok + i * PS, PS);
        assert_true(cairn_page_hash_equal(h, path[i]->hash));
    }
    assert_true(cairn_page_hash_equal(h, m.last_hash));
    assert_int_equal(cairn_radix_path(m.node, path, 2, &np), CAIRN_ERANGE);

    /* Unmatched first page: nothing. Partial trailing page: ignored. */
    letters("abcx", tok, &n);
    assert_int_equal(cairn_radix_match(t, 0, tok, n, &m), CAIRN_OK);
    assert_int_equal(m.n_pages, 0);
    assert_ptr_equal(m.node, cairn_radix_root(t));
    letters("abcd ef", tok, &n);
    assert_int_equal(cairn_radix_match(t, 0, tok, n, &m), CAIRN_OK);
    assert_int_equal(m.n_pages, 1);
    cairn_radix_free(t);
}

static void test_hash_chain(void **state)
{
    (void)state;
    int32_t a[PS] = {1, 2, 3, 4}, b[PS] = {1, 2, 3, 5};
    cairn_page_hash h1 = cairn_page_hash_next(SEED, a, PS);
    cairn_page_hash h1b = cairn_page_hash_next(SEED, a, PS);
    cairn_page_hash h2 = cairn_page_hash_next(SEED, b, PS);
    cairn_page_hash other_seed = cairn_page_hash_next((cairn_page_hash){0, 1}, a, PS);
    assert_true(cairn_page_hash_equal(h1, h1b));
    /* The value is the disk format (pagekey.h): XXH3-128 of the 16-byte
     * big-endian seed and the tokens as little-endian int32, as any XXH3
     * implementation computes it. */
    assert_true(h1.hi == 0xd5779bef3735193bull && h1.lo == 0xa9d12b02a73ddab7ull);
    /* The chain pagekey gives is the one the tree keeps, in any namespace. */
    cairn_radix *t;
    assert_int_equal(cairn_radix_create(PS, SEED, &t), CAIRN_OK);
    int32_t two[2 * PS] = {1, 2, 3, 4, 9, 8, 7, 6}, ids[2] = {0, 1};
    size_t cached;
    cairn_radix_node *leaf;
    assert_int_equal(cairn_radix_insert(t, 7, two, 2, ids, &cached, &leaf), CAIRN_OK);
    cairn_page_hash chain[2];
    cairn_page_chain(SEED, 7, two, 2, PS, chain);
    cairn_radix_page *pg;
    cairn_radix_node_pages(leaf, &pg);
    assert_true(cairn_page_hash_equal(chain[0], pg[0].hash));
    assert_true(cairn_page_hash_equal(chain[1], pg[1].hash));
    assert_true(cairn_page_hash_equal(cairn_radix_ns_seed(t, 7), cairn_page_chain_seed(SEED, 7)));
    assert_true(cairn_page_hash_equal(cairn_page_chain_seed(SEED, 0), SEED));
    uint8_t k[16];
    cairn_page_hash_to_bytes(chain[1], k);
    assert_true(cairn_page_hash_equal(cairn_page_hash_from_bytes(k), chain[1]));
    cairn_radix_free(t);
    assert_false(cairn_page_hash_equal(h1, h2));
    assert_false(cairn_page_hash_equal(h1, other_seed));
    /* Same page after a different prefix: a different key. */
    cairn_page_hash x = cairn_page_hash_next(h1, a, PS), y = cairn_page_hash_next(h2, a, PS);
    assert_false(cairn_page_hash_equal(x, y));
    uint8_t bytes[16];
    cairn_page_hash_to_bytes((cairn_page_hash){.lo = 0x0102030405060708ull, .hi = 0x1112131415161718ull},
                             bytes);
    assert_int_equal(bytes[0], 0x11); /* big-endian, high half first */
    assert_int_equal(bytes[15], 0x08);
    /* Large pages take the other code path; same function of the input. */
    int32_t big[1000];
    for (int i = 0; i < 1000; i++)
        big[i] = i * 7;
    cairn_page_hash g1 = cairn_page_hash_next(SEED, big, 1000);
    big[999]++;
    assert_false(cairn_page_hash_equal(g1, cairn_page_hash_next(SEED, big, 1000)));
}

static void test_locks_and_lru(void **state)
{
    (void)state;
    cairn_radix *t;
    assert_int_equal(cairn_radix_create(PS, SEED, &t), CAIRN_OK);
    int32_t tok[64];
    size_t n, cached;
    int32_t ids[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    cairn_radix_node *a, *b, *c;
    letters("aaaa bbbb", tok, &n);
    cairn_radix_insert(t, 0, tok, 2, ids, &cached, &a);
    letters("aaaa cccc", tok, &n);
    cairn_radix_insert(t, 0, tok, 2, ids + 2, &cached, &b);
    letters("dddd", tok, &n);
    cairn_radix_insert(t, 0, tok, 1, ids + 4, &cached, &c);
    /* LRU leaf first: the "bbbb" leaf. */
    assert_ptr_equal(cairn_radix_lru(t, CAIRN_TIER_DEVICE), a);
    /* Using a path makes it recent. */
    letters("aaaa bbbb", tok, &n);
    cairn_radix_match_result m;
    cairn_radix_match(t, 0, tok, n, &m);
    assert_ptr_equal(m.node, a);
    assert_ptr_equal(cairn_radix_lru(t, CAIRN_TIER_DEVICE), b);
    /* Locked nodes are not candidates; the lock covers the path. */
    assert_int_equal(cairn_radix_lock(t, b), CAIRN_OK);
    assert_int_equal(cairn_radix_node_refs(cairn_radix_parent(b)), 1);
    assert_ptr_equal(cairn_radix_lru(t, CAIRN_TIER_DEVICE), c);
    assert_int_equal(cairn_radix_drop(t, cairn_radix_parent(b), 0, NULL, NULL), CAIRN_EBUSY);
    assert_int_equal(cairn_radix_check(t), CAIRN_OK);
    /* Moving a locked node to a slower tier is refused. */
    cairn_radix_page *pg;
    cairn_radix_node_pages(b, &pg);
    pg[0].device_page = -1;
    pg[0].host_slot = 9;
    assert_int_equal(cairn_radix_set_tier(t, b, CAIRN_TIER_HOST), CAIRN_EBUSY);
    assert_int_equal(cairn_radix_unlock(t, b), CAIRN_OK);
    assert_int_equal(cairn_radix_unlock(t, b), CAIRN_EINVAL);
    /* Unlocked: the move is fine, and the inner "aaaa" node is then not a
     * device leaf yet (its "bbbb" child is still on the device). */
    assert_int_equal(cairn_radix_set_tier(t, b, CAIRN_TIER_HOST), CAIRN_OK);
    assert_ptr_equal(cairn_radix_lru(t, CAIRN_TIER_HOST), b);
    cairn_radix_node_pages(a, &pg);
    pg[0].device_page = -1;
    pg[0].host_slot = 10;
    assert_int_equal(cairn_radix_set_tier(t, a, CAIRN_TIER_HOST), CAIRN_OK);
    /* Both children on the host: the parent is a device candidate now. */
    cairn_radix_node *inner = cairn_radix_parent(a);
    assert_ptr_equal(cairn_radix_parent(b), inner);
    cairn_radix_stats st;
    cairn_radix_get_stats(t, &st);
    assert_int_equal(st.evictable[CAIRN_TIER_DEVICE], 2); /* inner, dddd */
    assert_int_equal(st.evictable[CAIRN_TIER_HOST], 2);
    /* Inconsistent records are refused. */
    cairn_radix_node_pages(c, &pg);
    assert_int_equal(cairn_radix_set_tier(t, c, CAIRN_TIER_HOST), CAIRN_EINVAL);
    assert_int_equal(cairn_radix_check(t), CAIRN_OK);
    /* Dropping a subtree takes every node below with it. */
    assert_int_equal(cairn_radix_drop(t, inner, 0, NULL, NULL), CAIRN_OK);
    cairn_radix_get_stats(t, &st);
    assert_int_equal(st.n_nodes, 1);
    assert_int_equal(cairn_radix_check(t), CAIRN_OK);
    cairn_radix_free(t);
}

/* Eviction order: one-off pages go first, then pages another request found
 * cached, then a live session's (held) pages, least recently used first
 * within each class; a live mark never stops eviction, and a marked node
 * that leaves the tree takes its marks from its ancestors. */
static void test_eviction_order(void **state)
{
    (void)state;
    cairn_radix *t;
    assert_int_equal(cairn_radix_create(PS, SEED, &t), CAIRN_OK);
    int32_t tok[64];
    size_t n, cached;
    int32_t ids[16];
    for (int i = 0; i < 16; i++)
        ids[i] = i;
    cairn_radix_node *session, *once1, *once2, *doc;
    /* oldest first: a session's history, a document, two one-off prompts */
    letters("ssss tttt", tok, &n);
    cairn_radix_insert(t, 0, tok, 2, ids, &cached, &session);
    letters("dddd", tok, &n);
    cairn_radix_insert(t, 0, tok, 1, ids + 2, &cached, &doc);
    letters("oooo", tok, &n);
    cairn_radix_insert(t, 0, tok, 1, ids + 3, &cached, &once1);
    letters("pppp", tok, &n);
    cairn_radix_insert(t, 0, tok, 1, ids + 4, &cached, &once2);
    assert_int_equal(cairn_radix_node_class(doc), CAIRN_RADIX_CLASS_ONCE);
    /* plain LRU would give up the session first */
    assert_ptr_equal(cairn_radix_lru(t, CAIRN_TIER_DEVICE), session);
    assert_int_equal(cairn_radix_mark_live(t, session), CAIRN_OK);
    assert_int_equal(cairn_radix_node_live(session), 1);
    assert_int_equal(cairn_radix_node_class(session), CAIRN_RADIX_CLASS_LIVE);
    assert_int_equal(cairn_radix_mark_reused(t, doc), CAIRN_OK);
    assert_int_equal(cairn_radix_node_class(doc), CAIRN_RADIX_CLASS_SHARED);
    assert_int_equal(cairn_radix_check(t), CAIRN_OK);
    /* the one-off prompts, oldest first, then the document, then the session */
    cairn_radix_node *want[] = {once1, once2, doc, session};
    for (size_t i = 0; i < 4; i++) {
        cairn_radix_node *v = cairn_radix_lru(t, CAIRN_TIER_DEVICE);
        assert_ptr_equal(v, want[i]);
        if (v == session) {
            /* whoever marked it finds the node again by tokens and id */
            letters("ssss tttt", tok, &n);
            assert_ptr_equal(cairn_radix_find(t, 0, tok, 2), session);
            assert_null(cairn_radix_find(t, 0, tok, 1)); /* ends inside the node */
        }
        uint64_t id = cairn_radix_node_id(v);
        assert_int_equal(cairn_radix_drop(t, v, 0, NULL, NULL), CAIRN_OK);
        assert_int_equal(cairn_radix_check(t), CAIRN_OK);
        (void)id;
    }
    letters("ssss tttt", tok, &n);
    assert_null(cairn_radix_find(t, 0, tok, 2));
    cairn_radix_stats st;
    cairn_radix_get_stats(t, &st);
    assert_int_equal(st.n_nodes, 0);
    /* Recency still orders within a class; a branch point is SHARED. */
    letters("aaaa bbbb", tok, &n);
    cairn_radix_insert(t, 0, tok, 2, ids, &cached, &once1);
    letters("aaaa cccc", tok, &n);
    cairn_radix_insert(t, 0, tok, 2, ids + 2, &cached, &once2);
    cairn_radix_node *branch = cairn_radix_parent(once1);
    assert_int_equal(cairn_radix_node_class(branch), CAIRN_RADIX_CLASS_SHARED);
    assert_int_equal(cairn_radix_mark_live(t, once1), CAIRN_OK);
    assert_int_equal(cairn_radix_mark_live(t, once1), CAIRN_OK);
    assert_ptr_equal(cairn_radix_lru(t, CAIRN_TIER_DEVICE), once2);
    assert_int_equal(cairn_radix_unmark_live(t, once1), CAIRN_OK);
    assert_int_equal(cairn_radix_unmark_live(t, once1), CAIRN_OK);
    assert_int_equal(cairn_radix_unmark_live(t, once1), CAIRN_EINVAL);
    assert_ptr_equal(cairn_radix_lru(t, CAIRN_TIER_DEVICE), once1); /* older again */
    /* a split keeps the marks on both halves, and the deeper half its id */
    uint64_t id = cairn_radix_node_id(once1);
    assert_int_equal(cairn_radix_mark_live(t, once1), CAIRN_OK);
    letters("aaaa bbbb eeee", tok, &n);
    cairn_radix_node *leaf;
    int32_t more[3] = {-1, -1, 9};
    cairn_radix_insert(t, 0, tok, 3, more, &cached, &leaf);
    assert_int_equal(cached, 2);
    assert_int_equal(cairn_radix_node_id(once1), id);
    assert_int_equal(cairn_radix_node_live(leaf), 0);
    assert_int_equal(cairn_radix_node_live(branch), 1);
    assert_int_equal(cairn_radix_check(t), CAIRN_OK);
    /* dropping the marked subtree takes its marks from the ancestors */
    assert_int_equal(cairn_radix_drop(t, once1, 0, NULL, NULL), CAIRN_OK);
    assert_int_equal(cairn_radix_node_live(branch), 0);
    assert_int_equal(cairn_radix_check(t), CAIRN_OK);
    cairn_radix_free(t);
}

/* ---- property test against a list of sequences --------------------------- */

#define MAXP 24     /* pages per sequence */
#define MAXSEQ 4096 /* model capacity     */
#define MAXIDS 200000

/* The model (tests/support, pm_*) and every choice draw from one
 * xorshift64 stream, so a failure reproduces. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    return support_xorshift64(&rng_state);
}

/* Page-id owners: what each id was inserted for (digest of its prefix). */
static uint64_t prefix_digest(const int32_t *tok, size_t np)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < np * PS; i++)
        h = (h ^ (uint32_t)tok[i]) * 1099511628211ull;
    return h;
}

typedef struct {
    uint64_t *owner;   /* [MAXIDS] digest, 0 = free */
    int32_t next_id;
    size_t live;
} id_table;

static void release_page(const cairn_radix_page *p, void *user)
{
    id_table *ids = user;
    assert_true(p->device_page >= 0 && ids->owner[p->device_page] != 0);
    ids->owner[p->device_page] = 0;
    ids->live--;
}

/* The lowest class among the unlocked device leaves (brute force). */
static int lowest_class_visit(cairn_radix_node *n, void *user)
{
    int *lowest = user;
    if (cairn_radix_node_refs(n) == 0 && cairn_radix_node_n_children(n) == 0 &&
        cairn_radix_node_class(n) < *lowest)
        *lowest = cairn_radix_node_class(n);
    return 0;
}

static int lowest_evictable_class(cairn_radix *t)
{
    int lowest = 99;
    cairn_radix_visit(t, lowest_class_visit, &lowest);
    return lowest;
}

static void test_property_random(void **state)
{
    (void)state;
    cairn_radix *t;
    assert_int_equal(cairn_radix_create(PS, SEED, &t), CAIRN_OK);
    pm_model m;
    pm_init(&m, PS, MAXP, MAXSEQ);
    id_table ids = {.owner = calloc(MAXIDS, sizeof(uint64_t))};
    assert_non_null(ids.owner);
    cairn_radix_node *locked[64];
    size_t n_locked = 0;
    /* live marks, as a session keeps them: tokens, pages and the node's id */
    struct { int32_t tok[MAXP * PS]; size_t np; uint64_t id; } held[32];
    size_t n_held = 0;
    int32_t tok[MAXP * PS];
    int32_t pages[MAXP];
    cairn_radix_page *path[MAXP];

    for (int step = 0; step < 6000; step++) {
        unsigned op = (unsigned)(rnd() % 100);
        size_t np;
        if (op < 40 && m.n < MAXSEQ && ids.next_id + MAXP < MAXIDS) { /* insert */
            pm_query(&m, &rng_state, 4, tok, &np);
            for (size_t i = 0; i < np; i++) {
                pages[i] = ids.next_id++;
                ids.owner[pages[i]] = prefix_digest(tok, i + 1);
            }
            size_t expect = pm_match(&m, tok, np), cached;
            cairn_radix_node *leaf;
            assert_int_equal(cairn_radix_insert(t, 0, tok, np, pages, &cached, &leaf), CAIRN_OK);
            assert_int_equal(cached, expect);
            assert_int_equal(cairn_radix_node_depth(leaf), np);
            for (size_t i = 0; i < cached; i++)
                ids.owner[pages[i]] = 0; /* duplicates: the caller frees them */
            ids.live += np - cached;
            assert_true(pm_add(&m, tok, np));
        } else if (op < 70) { /* match: length and content of every page */
            pm_query(&m, &rng_state, 4, tok, &np);
            size_t extra = np < MAXP ? rnd() % PS : 0; /* a partial page is never matched */
            for (size_t i = 0; i < extra; i++)
                tok[np * PS + i] = 7;
            size_t qn = np * PS + extra;
            cairn_radix_match_result r;
            assert_int_equal(cairn_radix_match(t, 0, tok, qn, &r), CAIRN_OK);
            assert_int_equal(r.n_pages, pm_match(&m, tok, np));
            size_t got;
            assert_int_equal(cairn_radix_path(r.node, path, MAXP, &got), CAIRN_OK);
            assert_int_equal(got, r.n_pages);
            for (size_t i = 0; i < got; i++)
                assert_true(ids.owner[path[i]->device_page] == prefix_digest(tok, i + 1));
        } else if (op < 80 && n_locked < 64) { /* lock the end of a match */
            pm_query(&m, &rng_state, 4, tok, &np);
            cairn_radix_match_result r;
            assert_int_equal(cairn_radix_match(t, 0, tok, np * PS, &r), CAIRN_OK);
            if (r.n_pages) {
                assert_int_equal(cairn_radix_lock(t, r.node), CAIRN_OK);
                locked[n_locked++] = r.node;
            }
        } else if (op < 88 && n_locked) { /* unlock */
            size_t i = rnd() % n_locked;
            assert_int_equal(cairn_radix_unlock(t, locked[i]), CAIRN_OK);
            locked[i] = locked[--n_locked];
        } else if (op < 91 && n_held < 32) { /* mark the end of a match live */
            pm_query(&m, &rng_state, 4, tok, &np);
            cairn_radix_match_result r;
            assert_int_equal(cairn_radix_match(t, 0, tok, np * PS, &r), CAIRN_OK);
            if (r.n_pages) {
                assert_int_equal(cairn_radix_mark_live(t, r.node), CAIRN_OK);
                memcpy(held[n_held].tok, tok, r.n_pages * PS * sizeof *tok);
                held[n_held].np = r.n_pages;
                held[n_held++].id = cairn_radix_node_id(r.node);
                if (rnd() % 2)
                    assert_int_equal(cairn_radix_mark_reused(t, r.node), CAIRN_OK);
            }
        } else if (op < 93 && n_held) { /* unmark, if the node is still there */
            size_t i = rnd() % n_held;
            cairn_radix_node *v = cairn_radix_find(t, 0, held[i].tok, held[i].np);
            if (v && cairn_radix_node_id(v) == held[i].id)
                assert_int_equal(cairn_radix_unmark_live(t, v), CAIRN_OK);
            held[i] = held[--n_held];
        } else { /* evict LRU device leaves: drop them, as a one-tier cache would */
            int k = 1 + (int)(rnd() % 4);
            for (int e = 0; e < k; e++) {
                cairn_radix_node *v = cairn_radix_lru(t, CAIRN_TIER_DEVICE);
                if (!v)
                    break;
                /* no evictable node is of a lower class */
                int lowest = lowest_evictable_class(t);
                assert_int_equal(cairn_radix_node_class(v), lowest);
                assert_int_equal(cairn_radix_node_refs(v), 0);
                assert_int_equal(cairn_radix_node_n_children(v), 0);
                /* Model: no sequence extends past the node's first page now. */
                size_t depth = cairn_radix_node_depth(v);
                size_t start = depth - cairn_radix_node_pages(v, NULL);
                cairn_radix_page *dummy[MAXP];
                size_t gotp;
                assert_int_equal(cairn_radix_path(v, dummy, MAXP, &gotp), CAIRN_OK);
                int32_t vt[MAXP * PS];
                pm_node_tokens(v, depth, PS, vt);
                pm_forget(&m, vt, depth, start);
                assert_int_equal(cairn_radix_drop(t, v, 0, release_page, &ids), CAIRN_OK);
            }
            /* Locked nodes are still there and still locked. */
            for (size_t i = 0; i < n_locked; i++)
                assert_true(cairn_radix_node_refs(locked[i]) > 0);
        }
        assert_int_equal(cairn_radix_check(t), CAIRN_OK);
        cairn_radix_stats st;
        cairn_radix_get_stats(t, &st);
        assert_int_equal(st.pages[CAIRN_TIER_DEVICE], ids.live);
    }
    while (n_locked)
        assert_int_equal(cairn_radix_unlock(t, locked[--n_locked]), CAIRN_OK);
    cairn_radix_stats st;
    cairn_radix_get_stats(t, &st);
    assert_int_equal(st.locked_nodes, 0);
    pm_free(&m);
    free(ids.owner);
    cairn_radix_free(t);
}

/* Namespaces: equal tokens in two namespaces are two paths with their own
 * hash chains; namespace 0 chains from the seed itself, as before
 * namespaces existed (pages already on disk keep their keys). */
static void test_namespaces(void **state)
{
    (void)state;
    cairn_radix *t;
    assert_int_equal(cairn_radix_create(PS, SEED, &t), CAIRN_OK);
    int32_t tok[64];
    size_t n, cached;
    int32_t ids[8] = {10, 11, 12, 13, 14, 15, 16, 17};
    cairn_radix_node *a, *b;
    letters("abcd efgh", tok, &n);
    assert_int_equal(cairn_radix_insert(t, 0, tok, 2, ids, &cached, &a), CAIRN_OK);
    assert_int_equal(cairn_radix_insert(t, 7, tok, 2, ids + 2, &cached, &b), CAIRN_OK);
    assert_int_equal(cached, 0); /* the other namespace's pages are not ours */
    assert_ptr_not_equal(a, b);
    assert_int_equal(cairn_radix_node_ns(a), 0);
    assert_int_equal(cairn_radix_node_ns(b), 7);
    cairn_radix_page *pa, *pb;
    cairn_radix_node_pages(a, &pa);
    cairn_radix_node_pages(b, &pb);
    cairn_page_hash h0 = cairn_page_hash_next(SEED, tok, PS);
    assert_true(cairn_page_hash_equal(pa[0].hash, h0));
    assert_false(cairn_page_hash_equal(pb[0].hash, h0));
    assert_true(cairn_page_hash_equal(pb[0].hash,
                                      cairn_page_hash_next(cairn_radix_ns_seed(t, 7), tok, PS)));
    assert_true(cairn_page_hash_equal(cairn_radix_ns_seed(t, 0), SEED));
    cairn_radix_match_result m;
    assert_int_equal(cairn_radix_match(t, 7, tok, n, &m), CAIRN_OK);
    assert_ptr_equal(m.node, b);
    assert_int_equal(cairn_radix_match(t, 8, tok, n, &m), CAIRN_OK);
    assert_int_equal(m.n_pages, 0);
    assert_true(cairn_page_hash_equal(m.last_hash, cairn_radix_ns_seed(t, 8)));
    /* a split keeps the namespace on both halves */
    letters("abcd wxyz", tok, &n);
    assert_int_equal(cairn_radix_insert(t, 7, tok, 2, ids + 4, &cached, &b), CAIRN_OK);
    assert_int_equal(cached, 1);
    assert_int_equal(cairn_radix_node_ns(cairn_radix_parent(b)), 7);
    assert_int_equal(cairn_radix_check(t), CAIRN_OK);
    cairn_radix_free(t);
}

/* The non-mutating closest-sequence query: token-exact departures, the
 * tier, containment, other namespaces, and that it changes nothing. */
static void test_common_prefix(void **state)
{
    (void)state;
    cairn_radix *t;
    assert_int_equal(cairn_radix_create(PS, SEED, &t), CAIRN_OK);
    int32_t tok[64], ids[16];
    size_t n, cached;
    for (int i = 0; i < 16; i++)
        ids[i] = 200 + i;
    cairn_radix_common x;

    letters("abcd efgh", tok, &n);
    assert_int_equal(cairn_radix_common_prefix(t, 0, tok, n, &x), CAIRN_OK);
    assert_false(x.ns_cached);
    assert_int_equal(x.common_tokens, 0);
    assert_int_equal(x.tier, -1);

    letters("abcd efgh ijkl", tok, &n);
    assert_int_equal(cairn_radix_insert(t, 0, tok, n / PS, ids, &cached, NULL), CAIRN_OK);
    cairn_radix_stats before;
    cairn_radix_get_stats(t, &before);

    /* departs inside page 2 of the one node, at token 9 */
    letters("abcd efgh iXkl mnop", tok, &n);
    assert_int_equal(cairn_radix_common_prefix(t, 0, tok, n, &x), CAIRN_OK);
    assert_true(x.ns_cached);
    assert_int_equal(x.common_tokens, 9);
    assert_int_equal(x.whole_pages, 2);
    assert_int_equal(x.sequence_tokens, 12);
    assert_false(x.contained);
    assert_int_equal(x.tier, CAIRN_TIER_DEVICE);
    assert_int_equal(x.n_cached_next, 3);
    assert_int_equal(x.cached_next[0], 'j');
    /* the hash is the one a match gives for the same pages */
    cairn_page_hash h = cairn_radix_ns_seed(t, 0);
    h = cairn_page_hash_next(h, tok, PS);
    h = cairn_page_hash_next(h, tok + PS, PS);
    assert_true(cairn_page_hash_equal(x.last_hash, h));

    /* nothing moved: no split, same node count */
    cairn_radix_stats after;
    cairn_radix_get_stats(t, &after);
    assert_int_equal(after.n_nodes, before.n_nodes);

    /* holds the whole cached sequence and goes on: contained */
    letters("abcd efgh ijkl mnop qr", tok, &n);
    assert_int_equal(cairn_radix_common_prefix(t, 0, tok, n, &x), CAIRN_OK);
    assert_int_equal(x.common_tokens, 12);
    assert_true(x.contained);
    assert_null(x.cached_next);

    /* a short prompt departing inside the first page (less than a page) */
    letters("abX", tok, &n);
    assert_int_equal(cairn_radix_common_prefix(t, 0, tok, n, &x), CAIRN_OK);
    assert_int_equal(x.common_tokens, 2);
    assert_int_equal(x.whole_pages, 0);
    assert_int_equal(x.tier, CAIRN_TIER_DEVICE);

    /* another namespace sees nothing of its own, but pages elsewhere */
    letters("abcd efgh ijkl", tok, &n);
    assert_int_equal(cairn_radix_common_prefix(t, 7, tok, n, &x), CAIRN_OK);
    assert_false(x.ns_cached);
    assert_int_equal(x.common_tokens, 0);
    assert_int_equal(cairn_radix_pages_elsewhere(t, 7, tok, n), 3);
    assert_int_equal(cairn_radix_pages_elsewhere(t, 0, tok, n), 0);
    letters("abcd efgh", tok, &n);
    assert_int_equal(cairn_radix_pages_elsewhere(t, 7, tok, n), 2);

    /* on a node boundary with two children: the one sharing more tokens */
    letters("abcd efgh wxyz", tok, &n);
    assert_int_equal(cairn_radix_insert(t, 0, tok, n / PS, ids + 3, &cached, NULL), CAIRN_OK);
    letters("abcd efgh wxQQ", tok, &n);
    assert_int_equal(cairn_radix_common_prefix(t, 0, tok, n, &x), CAIRN_OK);
    assert_int_equal(x.common_tokens, 10);
    assert_int_equal(x.whole_pages, 2);
    assert_int_equal(x.cached_next[0], 'y');
    assert_int_equal(cairn_radix_check(t), CAIRN_OK);
    cairn_radix_free(t);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    cairn_radix *t;
    assert_int_equal(cairn_radix_create(0, SEED, &t), CAIRN_EINVAL);
    assert_int_equal(cairn_radix_create(PS, SEED, NULL), CAIRN_EINVAL);
    assert_int_equal(cairn_radix_create(PS, SEED, &t), CAIRN_OK);
    int32_t tok[PS] = {1, 2, 3, 4}, bad_id = -1;
    size_t cached;
    assert_int_equal(cairn_radix_insert(t, 0, tok, 1, &bad_id, &cached, NULL), CAIRN_EINVAL);
    assert_int_equal(cairn_radix_insert(t, 0, NULL, 1, &bad_id, &cached, NULL), CAIRN_EINVAL);
    assert_int_equal(cairn_radix_match(t, 0, tok, PS, NULL), CAIRN_EINVAL);
    assert_int_equal(cairn_radix_drop(t, cairn_radix_root(t), 0, NULL, NULL), CAIRN_EINVAL);
    assert_int_equal(cairn_radix_set_tier(t, cairn_radix_root(t), 1), CAIRN_EINVAL);
    assert_null(cairn_radix_lru(t, 5));
    cairn_radix_free(t);
    cairn_radix_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_example),
        cmocka_unit_test(test_hash_chain),
        cmocka_unit_test(test_locks_and_lru),
        cmocka_unit_test(test_eviction_order),
        cmocka_unit_test(test_property_random),
        cmocka_unit_test(test_namespaces),
        cmocka_unit_test(test_common_prefix),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
