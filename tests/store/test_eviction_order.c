/*
 * tests/store/test_eviction_order.c — what the tiered cache gives up first
 * (radix.h, "Eviction order"; store.h, cairn_kvcache_evict): under a flood
 * of one-off prompts, a reused document and a live session's history stay
 * on the device while the one-offs go down and out (the session's partial
 * last page, kept as a tail, too); a live mark is not a pin (when nothing else is left the session's pages move too, and the mark
 * leaves with a node that leaves the tree); and pages that would cost more
 * to load back than to recompute leave the tree instead of taking room in
 * a slower tier. Built twice: as is, and with ASan + UBSan.
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
#define SEQ_PAGES 4

typedef struct {
    cairn_backend *be;
    cairn_kvcache *c;
    cairn_kv_layout L;
} cache;

static void cache_open(cache *k, int dev_pages, int host_pages)
{
    k->L = test_layout(PS);
    k->be = test_backend_create();
    assert_non_null(k->be);
    cairn_kvcache_config cfg = {.backend = k->be, .layout = k->L,
                                .device_bytes = (size_t)dev_pages * k->L.page_bytes,
                                .host_bytes = (size_t)host_pages * k->L.page_bytes,
                                .ns = {.lo = 3, .hi = 4}};
    char err[256] = "";
    assert_int_equal(cairn_kvcache_create(&cfg, &k->c, err, sizeof err), CAIRN_OK);
}

static void cache_close(cache *k)
{
    cairn_kvcache_free(k->c);
    cairn_backend_destroy(k->be);
}

static void seq_tokens(int32_t *tok, size_t n, int s)
{
    for (size_t i = 0; i < n; i++)
        tok[i] = (int32_t)((i * 7919u + (unsigned)s * 104729u) % 30000);
}

/* A prompt computed and given to the tree, as a finished request leaves it;
 * its leaf. */
static cairn_radix_node *compute(cache *k, const int32_t *tok, size_t np)
{
    int32_t ids[SEQ_PAGES];
    assert_int_equal(cairn_kvcache_alloc(k->c, (int32_t)np, ids), CAIRN_OK);
    size_t cached;
    cairn_radix_node *leaf;
    assert_int_equal(cairn_radix_insert(cairn_kvcache_tree(k->c), 0, tok, np, ids, &cached, &leaf),
                     CAIRN_OK);
    cairn_page_pool_release(cairn_kvcache_device_pool(k->c), (int32_t)cached, ids);
    return leaf;
}

static int tier_of(cache *k, const int32_t *tok, size_t np)
{
    cairn_radix_node *n = cairn_radix_find(cairn_kvcache_tree(k->c), 0, tok, np);
    return n ? cairn_radix_node_tier(n) : -1;
}

static void test_flood_keeps_session_and_document(void **state)
{
    (void)state;
    cache k;
    cache_open(&k, 16, 16); /* a one-off flood of 40 x 4 pages is 5x both tiers */
    cairn_radix *t = cairn_kvcache_tree(k.c);
    int32_t session[SEQ_PAGES * PS], doc[SEQ_PAGES * PS], once[SEQ_PAGES * PS];
    seq_tokens(session, sizeof session / sizeof *session, 1);
    seq_tokens(doc, sizeof doc / sizeof *doc, 2);
    /* oldest first: the session's turn, then the document */
    compute(&k, session, SEQ_PAGES);
    cairn_kv_live live;
    assert_int_equal(cairn_kvcache_mark_live(k.c, 0, session, SEQ_PAGES * PS, &live), CAIRN_OK);
    assert_int_equal(live.n_pages, SEQ_PAGES);
    cairn_radix_node *d = compute(&k, doc, SEQ_PAGES);
    cairn_radix_mark_reused(t, d); /* another request found it: a fetch marks it so */
    for (int i = 0; i < 40; i++) {
        seq_tokens(once, sizeof once / sizeof *once, 100 + i);
        compute(&k, once, SEQ_PAGES);
        assert_int_equal(cairn_radix_check(t), CAIRN_OK);
        /* plain LRU would have moved both out after the third one-off */
        assert_int_equal(tier_of(&k, session, SEQ_PAGES), CAIRN_TIER_DEVICE);
        assert_int_equal(tier_of(&k, doc, SEQ_PAGES), CAIRN_TIER_DEVICE);
    }
    cairn_kvcache_stats st;
    cairn_kvcache_get_stats(k.c, &st);
    assert_true(st.evicted_pages[CAIRN_TIER_DEVICE] >= 36 * SEQ_PAGES);
    /* the document goes before the live session once the one-offs are gone */
    size_t moved;
    while (tier_of(&k, doc, SEQ_PAGES) == CAIRN_TIER_DEVICE) {
        assert_int_equal(tier_of(&k, session, SEQ_PAGES), CAIRN_TIER_DEVICE);
        assert_int_equal(cairn_kvcache_evict(k.c, CAIRN_TIER_DEVICE, 1, &moved), CAIRN_OK);
        assert_true(moved > 0);
    }
    /* a mark is not a pin: with nothing else left, the session's pages go too */
    assert_int_equal(cairn_kvcache_evict(k.c, CAIRN_TIER_DEVICE, 64, &moved), CAIRN_OK);
    assert_int_equal(tier_of(&k, session, SEQ_PAGES), CAIRN_TIER_HOST);
    /* out of the tree at the last tier: the mark leaves with the node */
    assert_int_equal(cairn_kvcache_evict(k.c, CAIRN_TIER_HOST, 64, &moved), CAIRN_OK);
    assert_int_equal(tier_of(&k, session, SEQ_PAGES), -1);
    cairn_kvcache_unmark_live(k.c, 0, session, SEQ_PAGES * PS, &live);
    assert_int_equal(live.node_id, 0);
    assert_int_equal(cairn_radix_check(t), CAIRN_OK);
    cache_close(&k);
}

static void test_unmark_restores_lru(void **state)
{
    (void)state;
    cache k;
    cache_open(&k, 16, 16);
    int32_t a[SEQ_PAGES * PS], b[SEQ_PAGES * PS];
    seq_tokens(a, sizeof a / sizeof *a, 1);
    seq_tokens(b, sizeof b / sizeof *b, 2);
    compute(&k, a, SEQ_PAGES);
    cairn_kv_live live;
    assert_int_equal(cairn_kvcache_mark_live(k.c, 0, a, SEQ_PAGES * PS, &live), CAIRN_OK);
    compute(&k, b, SEQ_PAGES);
    size_t moved;
    assert_int_equal(cairn_kvcache_evict(k.c, CAIRN_TIER_DEVICE, 1, &moved), CAIRN_OK);
    assert_int_equal(tier_of(&k, b, SEQ_PAGES), CAIRN_TIER_HOST); /* a is live */
    /* the session closed: its history is just the oldest pages again */
    cairn_kvcache_unmark_live(k.c, 0, a, SEQ_PAGES * PS, &live);
    compute(&k, b, SEQ_PAGES); /* b back on the device, used now */
    cairn_radix_node *bn = cairn_radix_find(cairn_kvcache_tree(k.c), 0, b, SEQ_PAGES);
    assert_non_null(bn);
    assert_int_equal(cairn_kvcache_evict(k.c, CAIRN_TIER_DEVICE, 1, &moved), CAIRN_OK);
    assert_int_equal(tier_of(&k, a, SEQ_PAGES), CAIRN_TIER_HOST);
    /* an unmark with tokens that no longer begin with the marked ones, or
     * a second unmark, changes nothing */
    assert_int_equal(cairn_kvcache_mark_live(k.c, 0, b, SEQ_PAGES * PS, &live), CAIRN_OK);
    int32_t other[SEQ_PAGES * PS];
    seq_tokens(other, sizeof other / sizeof *other, 9);
    cairn_kvcache_unmark_live(k.c, 0, other, SEQ_PAGES * PS, &live);
    assert_int_equal(live.node_id, 0);
    assert_int_equal(cairn_radix_node_class(cairn_radix_find(cairn_kvcache_tree(k.c), 0, b,
                                                             SEQ_PAGES)),
                     CAIRN_RADIX_CLASS_LIVE);
    cairn_kvcache_unmark_live(k.c, 0, b, SEQ_PAGES * PS, &live);
    assert_int_equal(cairn_radix_check(cairn_kvcache_tree(k.c)), CAIRN_OK);
    cache_close(&k);
}

/* With rates under which a page loads back from host RAM slower than it is
 * recomputed, an evicted leaf leaves the tree instead of filling host RAM;
 * with the usual rates it goes down a tier. */
static void test_cheap_pages_leave(void **state)
{
    (void)state;
    cache k;
    cache_open(&k, 8, 16);
    int32_t a[SEQ_PAGES * PS], b[SEQ_PAGES * PS];
    seq_tokens(a, sizeof a / sizeof *a, 1);
    seq_tokens(b, sizeof b / sizeof *b, 2);
    cairn_kvcache_rates slow_bus = {.compute_tokens_per_s = 1e9,
                                    .h2d_bytes_per_s = (double)k.L.page_bytes * 10,
                                    .disk_bytes_per_s = 1e6, .disk_latency_s = 0};
    assert_int_equal(cairn_kvcache_override_rates(k.c, &slow_bus), CAIRN_OK);
    compute(&k, a, SEQ_PAGES);
    size_t moved;
    assert_int_equal(cairn_kvcache_evict(k.c, CAIRN_TIER_DEVICE, SEQ_PAGES, &moved), CAIRN_OK);
    assert_int_equal(moved, SEQ_PAGES);
    assert_int_equal(tier_of(&k, a, SEQ_PAGES), -1);
    cairn_kvcache_stats st;
    cairn_kvcache_get_stats(k.c, &st);
    assert_int_equal(st.dropped_cheap_pages, SEQ_PAGES);
    assert_int_equal(st.tier[CAIRN_TIER_HOST].pages, 0);
    /* the usual rates (priors): a page is worth host RAM */
    assert_int_equal(cairn_kvcache_override_rates(k.c, NULL), CAIRN_OK);
    compute(&k, b, SEQ_PAGES);
    assert_int_equal(cairn_kvcache_evict(k.c, CAIRN_TIER_DEVICE, SEQ_PAGES, &moved), CAIRN_OK);
    assert_int_equal(tier_of(&k, b, SEQ_PAGES), CAIRN_TIER_HOST);
    cache_close(&k);
}

/* A live session's history that ends in a partial page keeps that page (a
 * tail) through the flood too; other tails go first. */
static void test_live_tail(void **state)
{
    (void)state;
    cache k;
    cache_open(&k, 16, 0);
    int32_t session[SEQ_PAGES * PS + 5], other[SEQ_PAGES * PS + 5], once[SEQ_PAGES * PS];
    seq_tokens(session, sizeof session / sizeof *session, 1);
    seq_tokens(other, sizeof other / sizeof *other, 2);
    compute(&k, session, SEQ_PAGES);
    compute(&k, other, SEQ_PAGES);
    int32_t page;
    assert_int_equal(cairn_kvcache_alloc(k.c, 1, &page), CAIRN_OK);
    assert_int_equal(cairn_kvcache_keep_tail(k.c, 0, session, SEQ_PAGES * PS + 5, page), CAIRN_OK);
    assert_int_equal(cairn_kvcache_alloc(k.c, 1, &page), CAIRN_OK);
    assert_int_equal(cairn_kvcache_keep_tail(k.c, 0, other, SEQ_PAGES * PS + 5, page), CAIRN_OK);
    cairn_kv_live live;
    assert_int_equal(cairn_kvcache_mark_live(k.c, 0, session, SEQ_PAGES * PS + 5, &live),
                     CAIRN_OK);
    assert_true(live.tail_id != 0);
    cairn_kvcache_stats st;
    for (int i = 0; i < 10; i++) {
        seq_tokens(once, sizeof once / sizeof *once, 100 + i);
        compute(&k, once, SEQ_PAGES);
        cairn_kvcache_get_stats(k.c, &st);
        assert_true(st.tail_pages >= 1); /* the session's, at least */
        assert_int_equal(tier_of(&k, session, SEQ_PAGES), CAIRN_TIER_DEVICE);
    }
    assert_int_equal(st.tail_pages, 1); /* the other went first */
    /* closed: its tail is just a tail again */
    cairn_kvcache_unmark_live(k.c, 0, session, SEQ_PAGES * PS + 5, &live);
    seq_tokens(once, sizeof once / sizeof *once, 200);
    compute(&k, once, SEQ_PAGES);
    cairn_kvcache_get_stats(k.c, &st);
    assert_int_equal(st.tail_pages, 0);
    assert_int_equal(cairn_radix_check(cairn_kvcache_tree(k.c)), CAIRN_OK);
    cache_close(&k);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flood_keeps_session_and_document),
        cmocka_unit_test(test_unmark_restores_lru),
        cmocka_unit_test(test_cheap_pages_leave),
        cmocka_unit_test(test_live_tail),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
