/*
 * tests/store/test_kvcache_share.c — a prefix computed once (store.h,
 * "computing a prefix once"): extend gives the tree a running sequence's
 * pages and moves its lock; two sequences that computed the same pages end
 * with one copy; partial() copies the page that continues a match from a
 * tree child (device or host tier) or a kept tail; tails give way first
 * when the pool runs short. Pool accounting is checked after every step:
 * every page id is in exactly one place (tree, a caller, a tail, free).
 * Built twice: as is, and with ASan + UBSan (leaks included).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test_util.h"

#define PS 16

typedef struct {
    cairn_backend *be;
    cairn_kvcache *c;
    cairn_kv_layout L;
    uint8_t *base;
} cache;

static void cache_open(cache *k, int dev_pages, int host_pages)
{
    k->L = test_layout(PS);
    k->be = test_backend_create();
    assert_non_null(k->be);
    cairn_kvcache_config cfg = {.backend = k->be, .layout = k->L,
                                .device_bytes = (size_t)dev_pages * k->L.page_bytes,
                                .host_bytes = (size_t)host_pages * k->L.page_bytes,
                                .ns = {.lo = 7, .hi = 9}};
    char err[256] = "";
    assert_int_equal(cairn_kvcache_create(&cfg, &k->c, err, sizeof err), CAIRN_OK);
    k->base = cairn_page_pool_base(cairn_kvcache_device_pool(k->c));
}

static void cache_close(cache *k)
{
    cairn_kvcache_free(k->c);
    cairn_backend_destroy(k->be);
}

static uint8_t *page_addr(cache *k, int32_t id) { return k->base + (size_t)id * k->L.page_bytes; }

static void seq_tokens(int32_t *tok, size_t n, int s)
{
    for (size_t i = 0; i < n; i++)
        tok[i] = (int32_t)((i * 7919u + (unsigned)s * 104729u) % 30000);
}

/* "Compute" page p of tok into page id: the payload of its whole prefix. */
static void compute(cache *k, const int32_t *tok, size_t p, int32_t id)
{
    test_payload(tok, (p + 1) * PS, page_addr(k, id), k->L.page_bytes);
}

/* Tree pages on the device + pages held by callers + tails + free == capacity. */
static void check_accounting(cache *k, size_t held_by_callers)
{
    cairn_radix *t = cairn_kvcache_tree(k->c);
    assert_int_equal(cairn_radix_check(t), CAIRN_OK);
    cairn_radix_stats rs;
    cairn_radix_get_stats(t, &rs);
    cairn_kvcache_stats st;
    cairn_kvcache_get_stats(k->c, &st);
    cairn_page_pool *dev = cairn_kvcache_device_pool(k->c);
    assert_int_equal(rs.pages[CAIRN_TIER_DEVICE] + held_by_callers + st.tail_pages +
                         st.tier[CAIRN_TIER_DEVICE].draining_pages +
                         (size_t)cairn_page_pool_available(dev),
                     (size_t)cairn_page_pool_capacity(dev));
}

/* A running sequence's pages reach the tree step by step, its lock moving
 * with them; a second sequence that computed the same pages privately ends
 * up on the first one's pages, its own returned. */
static void test_extend(void **state)
{
    (void)state;
    cache k;
    cache_open(&k, 32, 0);
    int32_t tok[4 * PS];
    seq_tokens(tok, 4 * PS, 1);
    int32_t a[4], b[4];
    size_t a_held = 0, b_held = 0;
    cairn_kv_hold *a_hold = NULL, *b_hold = NULL;
    assert_int_equal(cairn_kvcache_alloc(k.c, 4, a), CAIRN_OK);
    assert_int_equal(cairn_kvcache_alloc(k.c, 2, b), CAIRN_OK);
    for (size_t p = 0; p < 2; p++) {
        compute(&k, tok, p, a[p]);
        compute(&k, tok, p, b[p]);
    }
    /* A: two pages computed, they go to the tree, locked */
    assert_int_equal(cairn_kvcache_extend(k.c, 0, tok, 2, a, &a_held, &a_hold), CAIRN_OK);
    assert_int_equal(a_held, 2);
    assert_non_null(a_hold);
    assert_int_equal(cairn_radix_node_refs(a_hold), 1);
    check_accounting(&k, 2 /* A's last two */ + 2 /* B's */);
    /* B raced A over the same pages: B now uses A's, its own are free */
    int32_t b_before[2] = {b[0], b[1]};
    assert_int_equal(cairn_kvcache_extend(k.c, 0, tok, 2, b, &b_held, &b_hold), CAIRN_OK);
    assert_int_equal(b_held, 2);
    assert_int_equal(b[0], a[0]);
    assert_int_equal(b[1], a[1]);
    assert_true(b_before[0] != a[0]);
    check_accounting(&k, 2);
    /* A goes on; the hold follows it; the old node stays locked by B only */
    compute(&k, tok, 2, a[2]);
    assert_int_equal(cairn_kvcache_extend(k.c, 0, tok, 3, a, &a_held, &a_hold), CAIRN_OK);
    assert_int_equal(a_held, 3);
    assert_int_equal(cairn_radix_node_refs(b_hold), 2); /* B's lock + A's, via the path */
    check_accounting(&k, 1);
    /* both end: only pages past what each holds are theirs */
    cairn_kv_hold *leaf = NULL;
    assert_int_equal(cairn_kvcache_commit(k.c, 0, tok, 3, a, a_held, 4, a_hold, &leaf), CAIRN_OK);
    assert_int_equal(cairn_kvcache_commit(k.c, 0, tok, 2, b, b_held, 2, b_hold, NULL), CAIRN_OK);
    check_accounting(&k, 0);
    cairn_radix_stats rs;
    cairn_radix_get_stats(cairn_kvcache_tree(k.c), &rs);
    assert_int_equal(rs.pages[CAIRN_TIER_DEVICE], 3);
    assert_int_equal(rs.locked_nodes, 0);
    cache_close(&k);
}

/* Explaining a miss (store.h): the closest sequence to the token, pages
 * dropped by eviction named with their tier, another namespace's pages
 * counted but not shown, and nothing in the tree changed by asking. */
static void test_explain(void **state)
{
    (void)state;
    cache k;
    cache_open(&k, 4, 0); /* no host tier: eviction drops from the device */
    int32_t tok[3 * PS], ids[3];
    seq_tokens(tok, 3 * PS, 2);
    assert_int_equal(cairn_kvcache_alloc(k.c, 3, ids), CAIRN_OK);
    for (size_t p = 0; p < 3; p++)
        compute(&k, tok, p, ids[p]);
    assert_int_equal(cairn_kvcache_commit(k.c, 0, tok, 3, ids, 0, 3, NULL, NULL), CAIRN_OK);

    cairn_kv_explain x;
    int32_t q[3 * PS];
    memcpy(q, tok, sizeof q);
    q[PS + 5] = -7; /* departs inside page 1 */
    assert_int_equal(cairn_kvcache_explain(k.c, 0, q, 3 * PS, &x), CAIRN_OK);
    assert_int_equal(x.common_tokens, PS + 5);
    assert_int_equal(x.whole_pages, 1);
    assert_int_equal(x.tier, CAIRN_TIER_DEVICE);
    assert_int_equal(x.evicted_tier, -1);
    assert_true(x.ns_cached);
    assert_int_equal(x.n_cached_next, CAIRN_KV_EXCERPT);
    assert_int_equal(x.cached_next[0], tok[PS + 5]);
    cairn_radix_stats before, after;
    cairn_radix_get_stats(cairn_kvcache_tree(k.c), &before);

    /* another namespace: nothing of its own, three pages elsewhere */
    assert_int_equal(cairn_kvcache_explain(k.c, 5, tok, 3 * PS, &x), CAIRN_OK);
    assert_false(x.ns_cached);
    assert_int_equal(x.pages_elsewhere, 3);
    assert_int_equal(x.n_cached_next, 0);
    cairn_radix_get_stats(cairn_kvcache_tree(k.c), &after);
    assert_int_equal(after.n_nodes, before.n_nodes); /* no split happened */

    /* evict it all: the prompt's next page was lost from the device */
    size_t moved = 0;
    assert_int_equal(cairn_kvcache_evict(k.c, CAIRN_TIER_DEVICE, 3, &moved), CAIRN_OK);
    assert_int_equal(moved, 3);
    assert_int_equal(cairn_kvcache_explain(k.c, 0, tok, 3 * PS, &x), CAIRN_OK);
    assert_int_equal(x.common_tokens, 0);
    assert_false(x.ns_cached);
    assert_int_equal(x.evicted_tier, CAIRN_TIER_DEVICE);
    /* a prompt that never was cached is no eviction */
    seq_tokens(q, 3 * PS, 3);
    assert_int_equal(cairn_kvcache_explain(k.c, 0, q, 3 * PS, &x), CAIRN_OK);
    assert_int_equal(x.evicted_tier, -1);
    check_accounting(&k, 0);
    cache_close(&k);
}

/* A match that ends inside a page: the rows the request shares with the
 * cached page that continues it (device tier, then host tier) are copied. */
static void test_partial_from_tree(void **state)
{
    (void)state;
    cache k;
    cache_open(&k, 8, 8);
    int32_t tok[2 * PS], req[2 * PS];
    seq_tokens(tok, 2 * PS, 3);
    int32_t ids[2];
    assert_int_equal(cairn_kvcache_alloc(k.c, 2, ids), CAIRN_OK);
    compute(&k, tok, 0, ids[0]);
    compute(&k, tok, 1, ids[1]);
    cairn_kv_hold *leaf;
    assert_int_equal(cairn_kvcache_commit(k.c, 0, tok, 2, ids, 0, 2, NULL, &leaf), CAIRN_OK);
    /* the request shares page 0 and 5 tokens of page 1 */
    memcpy(req, tok, sizeof req);
    req[PS + 5] = -1;
    cairn_radix_match_result m;
    cairn_radix *t = cairn_kvcache_tree(k.c);
    uint8_t *want = malloc(k.L.page_bytes);
    test_payload(tok, 2 * PS, want, k.L.page_bytes);
    for (int round = 0; round < 2; round++) {
        assert_int_equal(cairn_radix_match(t, 0, req, PS, &m), CAIRN_OK);
        assert_int_equal(m.n_pages, 1);
        cairn_radix_lock(t, m.node);
        int32_t dst;
        assert_int_equal(cairn_kvcache_alloc(k.c, 1, &dst), CAIRN_OK);
        size_t got = 99;
        /* the hold's depth must be said right */
        assert_int_equal(cairn_kvcache_partial(k.c, 0, m.node, 0, req + PS, PS, &dst, &got, NULL),
                         CAIRN_EINVAL);
        assert_int_equal(cairn_kvcache_partial(k.c, 0, m.node, 1, req + PS, PS, &dst, &got, NULL),
                         CAIRN_OK);
        assert_int_equal(got, 5);
        assert_memory_equal(page_addr(&k, dst), want, k.L.page_bytes);
        /* another namespace sees nothing, and no page is taken for it */
        int32_t none = -1;
        assert_int_equal(cairn_kvcache_partial(k.c, 5, NULL, 0, req, PS, &none, &got, NULL), CAIRN_OK);
        assert_int_equal(got, 0);
        assert_int_equal(none, -1);
        cairn_kvcache_free_pages(k.c, 1, &dst);
        cairn_radix_unlock(t, m.node);
        check_accounting(&k, 0);
        if (round == 0) { /* round 2: the same from host RAM (an upload) */
            size_t moved, up = test_backend_counters_of(k.be)->uploaded;
            assert_int_equal(cairn_kvcache_evict(k.c, CAIRN_TIER_DEVICE, 2, &moved), CAIRN_OK);
            assert_int_equal(moved, 2);
            (void)up;
        }
    }
    assert_true(test_backend_counters_of(k.be)->uploaded >= k.L.page_bytes);
    free(want);
    cache_close(&k);
}

/* A sequence that ends n tokens into its second page, as commit leaves it:
 * page 0 in the tree, page 1 (computed) kept as a tail of n tokens. */
static void finish_with_tail(cache *k, const int32_t *tok, size_t n)
{
    int32_t ids[2];
    assert_int_equal(cairn_kvcache_alloc(k->c, 2, ids), CAIRN_OK);
    compute(k, tok, 0, ids[0]);
    compute(k, tok, 1, ids[1]);
    cairn_kv_hold *leaf;
    assert_int_equal(cairn_kvcache_commit(k->c, 0, tok, 1, ids, 0, 1, NULL, &leaf), CAIRN_OK);
    assert_int_equal(cairn_kvcache_keep_tail(k->c, 0, tok, PS + n, ids[1]), CAIRN_OK);
}

/* A finished sequence's partial last page is kept and found by the next
 * request over the same prefix; a longer tail replaces a shorter one;
 * tails are given up first when allocation runs short. */
static void test_tails(void **state)
{
    (void)state;
    cache k;
    cache_open(&k, 6, 0);
    int32_t tok[2 * PS];
    seq_tokens(tok, 2 * PS, 5);
    finish_with_tail(&k, tok, 7);
    check_accounting(&k, 0);
    cairn_kvcache_stats st;
    cairn_kvcache_get_stats(k.c, &st);
    assert_int_equal(st.tail_pages, 1);
    /* a longer tail over the same prefix replaces it */
    int32_t longer;
    assert_int_equal(cairn_kvcache_alloc(k.c, 1, &longer), CAIRN_OK);
    compute(&k, tok, 1, longer);
    assert_int_equal(cairn_kvcache_keep_tail(k.c, 0, tok, PS + 9, longer), CAIRN_OK);
    cairn_kvcache_get_stats(k.c, &st);
    assert_int_equal(st.tail_pages, 1);
    check_accounting(&k, 0);
    /* found after the whole-page match */
    cairn_radix_match_result m;
    cairn_radix *t = cairn_kvcache_tree(k.c);
    assert_int_equal(cairn_radix_match(t, 0, tok, 2 * PS, &m), CAIRN_OK);
    assert_int_equal(m.n_pages, 1);
    int32_t dst;
    assert_int_equal(cairn_kvcache_alloc(k.c, 1, &dst), CAIRN_OK);
    size_t got;
    assert_int_equal(cairn_kvcache_partial(k.c, 0, m.node, 1, tok + PS, PS, &dst, &got, NULL), CAIRN_OK);
    assert_int_equal(got, 9);
    uint8_t *want = malloc(k.L.page_bytes);
    test_payload(tok, 2 * PS, want, k.L.page_bytes);
    assert_memory_equal(page_addr(&k, dst), want, k.L.page_bytes);
    free(want);
    cairn_kvcache_free_pages(k.c, 1, &dst);
    /* all free pages and then the tail's: allocation takes the tail first,
     * then evicts; the tree page stays (the pool has 6 = 1 tree + 1 tail + 4) */
    int32_t all[5];
    assert_int_equal(cairn_kvcache_alloc(k.c, 5, all), CAIRN_OK);
    cairn_kvcache_get_stats(k.c, &st);
    assert_int_equal(st.tail_pages, 0);
    assert_int_equal(st.tree_pages[CAIRN_TIER_DEVICE], 1);
    check_accounting(&k, 5);
    cairn_kvcache_free_pages(k.c, 5, all);
    cache_close(&k);
}

/* Under tier-0 pressure a tail moves to a free host slot and is still found
 * (uploaded); host pressure drops host tails before any tree page. */
static void test_tail_in_host_ram(void **state)
{
    (void)state;
    cache k;
    cache_open(&k, 3, 2);
    int32_t tok[2 * PS];
    seq_tokens(tok, 2 * PS, 11);
    finish_with_tail(&k, tok, 12);
    /* one page free; taking two moves the tail, not the tree page */
    int32_t two[2];
    assert_int_equal(cairn_kvcache_alloc(k.c, 2, two), CAIRN_OK);
    cairn_kvcache_stats st;
    cairn_kvcache_get_stats(k.c, &st);
    assert_int_equal(st.tail_pages, 0);
    assert_int_equal(st.tail_host_pages, 1);
    assert_int_equal(st.tree_pages[CAIRN_TIER_DEVICE], 1);
    cairn_kvcache_free_pages(k.c, 1, &two[1]);
    cairn_radix_match_result m;
    assert_int_equal(cairn_radix_match(cairn_kvcache_tree(k.c), 0, tok, 2 * PS, &m), CAIRN_OK);
    size_t got;
    assert_int_equal(cairn_kvcache_partial(k.c, 0, m.node, 1, tok + PS, PS, &two[0], &got, NULL),
                     CAIRN_OK);
    assert_int_equal(got, 12);
    uint8_t *want = malloc(k.L.page_bytes);
    test_payload(tok, 2 * PS, want, k.L.page_bytes);
    assert_memory_equal(page_addr(&k, two[0]), want, k.L.page_bytes);
    free(want);
    cairn_kvcache_free_pages(k.c, 1, &two[0]);
    /* host RAM wanted: the tail goes first */
    size_t moved;
    assert_int_equal(cairn_kvcache_evict(k.c, CAIRN_TIER_HOST, 1, &moved), CAIRN_OK);
    cairn_kvcache_get_stats(k.c, &st);
    assert_int_equal(st.tail_host_pages, 0);
    assert_int_equal(st.tree_pages[CAIRN_TIER_DEVICE], 1);
    check_accounting(&k, 0);
    cache_close(&k);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_extend),
        cmocka_unit_test(test_explain),
        cmocka_unit_test(test_partial_from_tree),
        cmocka_unit_test(test_tails),
        cmocka_unit_test(test_tail_in_host_ram),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
