/*
 * tests/route/test_route_index.c — the router's pure parts: the page hashes
 * of a prompt (the same chain, tenant seed included, as the radix tree's),
 * the index (longest announced prefix per replica, removals, predictions
 * and their expiry, growth), the cost formula and the choice, and the
 * bounded session map.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "radix/radix.h"
#include "route/route_impl.h"

#define PS 4

static const uint8_t ROOT[ROUTE_HASH_BYTES] = {0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe,
                                               0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef};

static void tokens_of(int32_t *t, size_t n, int32_t base)
{
    for (size_t i = 0; i < n; i++)
        t[i] = base + (int32_t)i;
}

/* The chain the replicas compute (radix.h "Page hash"), tenant seed from
 * cairn_radix_ns_seed itself. */
static void test_hashes_match_radix_chain(void **state)
{
    (void)state;
    const cairn_page_hash root = cairn_page_hash_from_bytes(ROOT);
    uint8_t back[16];
    cairn_page_hash_to_bytes(root, back);
    assert_memory_equal(back, ROOT, 16);
    cairn_radix *t = NULL;
    assert_int_equal(cairn_radix_create(PS, root, &t), CAIRN_OK);
    int32_t tok[5 * PS];
    tokens_of(tok, 5 * PS, 100);
    const uint64_t tenants[] = {0, 7, 0x8000000000000001ull};
    for (size_t k = 0; k < 3; k++) {
        uint8_t got[5][ROUTE_HASH_BYTES];
        route_prompt_hashes(ROOT, tenants[k], PS, tok, 5, got);
        cairn_page_hash h = cairn_radix_ns_seed(t, tenants[k]);
        for (int i = 0; i < 5; i++) {
            h = cairn_page_hash_next(h, tok + i * PS, PS);
            uint8_t want[16];
            cairn_page_hash_to_bytes(h, want);
            assert_memory_equal(got[i], want, 16);
        }
    }
    /* tenants see different hashes for the same tokens */
    uint8_t a[1][16], b[1][16];
    route_prompt_hashes(ROOT, 0, PS, tok, 1, a);
    route_prompt_hashes(ROOT, 7, PS, tok, 1, b);
    assert_memory_not_equal(a[0], b[0], 16);
    cairn_radix_free(t);
    /* the last token is always computed: only whole pages before it count */
    assert_int_equal(route_useful_pages(0, PS), 0);
    assert_int_equal(route_useful_pages(4, PS), 0);
    assert_int_equal(route_useful_pages(5, PS), 1);
    assert_int_equal(route_useful_pages(9, PS), 2);
}

static void test_index_longest_prefix(void **state)
{
    (void)state;
    route_index *ix = NULL;
    assert_int_equal(route_index_create(&ix), CAIRN_OK);
    int32_t tok[6 * PS];
    tokens_of(tok, 6 * PS, 1);
    uint8_t h[6][ROUTE_HASH_BYTES];
    route_prompt_hashes(ROOT, 0, PS, tok, 6, h);
    assert_int_equal(route_index_store(ix, 0, (const uint8_t(*)[16])h, 5), CAIRN_OK); /* 0..4 */
    assert_int_equal(route_index_store(ix, 1, (const uint8_t(*)[16])h, 2), CAIRN_OK); /* 0..1 */
    assert_int_equal(route_index_store(ix, 2, (const uint8_t(*)[16])h, 1), CAIRN_OK); /* 0 */
    assert_int_equal(route_index_store(ix, 2, (const uint8_t(*)[16])h + 2, 2), CAIRN_OK); /* 2, 3 */
    assert_int_equal(route_index_store(ix, 63, (const uint8_t(*)[16])h + 1, 1), CAIRN_OK); /* 1 */
    assert_int_equal(route_index_entries(ix), 5);
    uint32_t pages[ROUTE_MAX_REPLICAS];
    const uint64_t all = 1ull | 2ull | 4ull | 8ull | (1ull << 63);
    route_index_match(ix, all, (const uint8_t(*)[16])h, 6, 0, pages);
    assert_int_equal(pages[0], 5);
    assert_int_equal(pages[1], 2);
    assert_int_equal(pages[2], 1); /* a gap ends the run: 2, 3 are not a prefix */
    assert_int_equal(pages[3], 0);
    assert_int_equal(pages[63], 0); /* page 1 alone is no prefix */
    /* only the slots asked about are looked at */
    route_index_match(ix, 2ull, (const uint8_t(*)[16])h, 6, 0, pages);
    assert_int_equal(pages[0], 0);
    assert_int_equal(pages[1], 2);
    /* a prompt of fewer pages: at most that many */
    route_index_match(ix, all, (const uint8_t(*)[16])h, 3, 0, pages);
    assert_int_equal(pages[0], 3);
    /* another tenant's hashes of the same tokens match nothing */
    uint8_t other[6][ROUTE_HASH_BYTES];
    route_prompt_hashes(ROOT, 9, PS, tok, 6, other);
    route_index_match(ix, all, (const uint8_t(*)[16])other, 6, 0, pages);
    assert_int_equal(pages[0], 0);
    /* removed: the run stops there */
    route_index_remove(ix, 0, (const uint8_t(*)[16])h + 3, 1);
    route_index_match(ix, all, (const uint8_t(*)[16])h, 6, 0, pages);
    assert_int_equal(pages[0], 3);
    assert_int_equal(pages[2], 1);
    /* a slot dropped (bye / hello again) holds nothing */
    route_index_drop_slot(ix, 0);
    route_index_match(ix, all, (const uint8_t(*)[16])h, 6, 0, pages);
    assert_int_equal(pages[0], 0);
    assert_int_equal(pages[1], 2);
    /* entries no slot holds are gone */
    route_index_drop_slot(ix, 1);
    route_index_drop_slot(ix, 2);
    route_index_drop_slot(ix, 63);
    assert_int_equal(route_index_entries(ix), 0);
    assert_int_equal(route_index_store(ix, 64, (const uint8_t(*)[16])h, 1), CAIRN_EINVAL);
    assert_int_equal(route_index_store(ix, -1, (const uint8_t(*)[16])h, 1), CAIRN_EINVAL);
    route_index_free(ix);
}

static void test_index_predictions_expire(void **state)
{
    (void)state;
    route_index *ix = NULL;
    assert_int_equal(route_index_create(&ix), CAIRN_OK);
    int32_t tok[3 * PS];
    tokens_of(tok, 3 * PS, 50);
    uint8_t h[3][ROUTE_HASH_BYTES];
    route_prompt_hashes(ROOT, 0, PS, tok, 3, h);
    uint32_t pages[ROUTE_MAX_REPLICAS];
    assert_int_equal(route_index_predict(ix, 4, (const uint8_t(*)[16])h, 3, 100.0), CAIRN_OK);
    assert_int_equal(route_index_store(ix, 5, (const uint8_t(*)[16])h, 1), CAIRN_OK);
    route_index_match(ix, 0x30, (const uint8_t(*)[16])h, 3, 50.0, pages);
    assert_int_equal(pages[4], 3);
    assert_int_equal(pages[5], 1);
    /* a later prediction extends it */
    assert_int_equal(route_index_predict(ix, 4, (const uint8_t(*)[16])h, 3, 200.0), CAIRN_OK);
    route_index_match(ix, 0x30, (const uint8_t(*)[16])h, 3, 150.0, pages);
    assert_int_equal(pages[4], 3);
    /* expired: forgotten; a page only predicted leaves the table (match
     * forgets what it meets, the sweep the rest), a confirmed one stays */
    route_index_match(ix, 0x30, (const uint8_t(*)[16])h, 3, 250.0, pages);
    assert_int_equal(pages[4], 0);
    assert_int_equal(pages[5], 1);
    route_index_expire(ix, 250.0);
    assert_int_equal(route_index_entries(ix), 1);
    /* a "removed" event ends a prediction too */
    assert_int_equal(route_index_predict(ix, 4, (const uint8_t(*)[16])h, 3, 1000.0), CAIRN_OK);
    route_index_remove(ix, 4, (const uint8_t(*)[16])h + 1, 1);
    route_index_match(ix, 0x10, (const uint8_t(*)[16])h, 3, 300.0, pages);
    assert_int_equal(pages[4], 1);
    route_index_clear(ix);
    assert_int_equal(route_index_entries(ix), 0);
    route_index_free(ix);
}

static void test_index_grows(void **state)
{
    (void)state;
    route_index *ix = NULL;
    assert_int_equal(route_index_create(&ix), CAIRN_OK);
    enum { N = 20000 };
    int32_t *tok = malloc(N * PS * sizeof *tok);
    uint8_t(*h)[ROUTE_HASH_BYTES] = malloc(N * ROUTE_HASH_BYTES);
    assert_non_null(tok);
    assert_non_null(h);
    tokens_of(tok, N * PS, 7);
    route_prompt_hashes(ROOT, 0, PS, tok, N, h);
    assert_int_equal(route_index_store(ix, 9, (const uint8_t(*)[16])h, N), CAIRN_OK);
    assert_int_equal(route_index_entries(ix), N);
    uint32_t pages[ROUTE_MAX_REPLICAS];
    route_index_match(ix, 1ull << 9, (const uint8_t(*)[16])h, N, 0, pages);
    assert_int_equal(pages[9], N);
    free(tok);
    free(h);
    route_index_free(ix);
}

static void test_cost(void **state)
{
    (void)state;
    const route_load idle = {0, 0, 0}, busy = {.prefill = 10, .decode = 5, .inflight = 2};
    const route_weights w = {.work = 1, .decode = 4}, no_decode = {.work = 1, .decode = 0},
                        latency = {.work = 0, .decode = 4};
    /* (1 + work) x uncached prompt + queued prefill + decode x queued decode */
    assert_true(route_cost(100, 64, &busy, &w) == 2 * 36 + 10 + 4.0 * 5);
    assert_true(route_cost(100, 64, &idle, &w) == 72);
    assert_true(route_cost(100, 64, &busy, &no_decode) == 82);
    assert_true(route_cost(100, 64, &busy, &latency) == 36 + 10 + 20);
    /* cached is clamped to [0, n] */
    assert_true(route_cost(100, 500, &idle, &w) == 0);
    assert_true(route_cost(100, -3, &idle, &w) == 200);
    assert_true(route_cost(100, 0, NULL, &w) == 200);
    assert_int_equal(route_expected_decode(0, 128), 128);
    assert_int_equal(route_expected_decode(-1, 128), 128);
    assert_int_equal(route_expected_decode(16, 128), 16);
    assert_int_equal(route_expected_decode(1000, 128), 128);
}

static void test_pick(void **state)
{
    (void)state;
    const route_weights w = {.work = 1, .decode = 4};
    int cursor = 0;
    route_candidate c[3] = {
        {.slot = 0, .up = true, .cached = 0},
        {.slot = 2, .up = true, .cached = 96},
        {.slot = 5, .up = true, .cached = 32},
    };
    /* the longest cached prefix wins when the load is equal */
    assert_int_equal(route_pick(ROUTE_POLICY_CACHE, c, 3, 100, &w, &cursor), 1);
    assert_int_equal(cursor, 3);
    /* idle costs: 200, 8, 136 */
    c[1].load = (route_load){.prefill = 100, .decode = 0, .inflight = 1}; /* 108: still */
    assert_int_equal(route_pick(ROUTE_POLICY_CACHE, c, 3, 100, &w, &cursor), 1);
    /* unless its queue costs more than (1 + work) x the prefill it saves */
    c[1].load = (route_load){.prefill = 200, .decode = 0, .inflight = 1}; /* 208 > 136 */
    assert_int_equal(route_pick(ROUTE_POLICY_CACHE, c, 3, 100, &w, &cursor), 2);
    c[2].load = (route_load){.prefill = 0, .decode = 20, .inflight = 1}; /* 136 + 80 > 200 */
    assert_int_equal(route_pick(ROUTE_POLICY_CACHE, c, 3, 100, &w, &cursor), 0);
    /* a down replica is never chosen */
    c[0].up = false;
    assert_int_equal(route_pick(ROUTE_POLICY_CACHE, c, 3, 100, &w, &cursor), 1); /* 208 < 216 */
    c[1].up = c[2].up = false;
    assert_int_equal(route_pick(ROUTE_POLICY_CACHE, c, 3, 100, &w, &cursor), -1);
    assert_int_equal(route_pick(ROUTE_POLICY_ROUND_ROBIN, c, 3, 100, &w, &cursor), -1);
    assert_int_equal(route_pick(ROUTE_POLICY_CACHE, c, 0, 100, &w, &cursor), -1);
    /* equal costs: fewer in flight, then spread from the cursor */
    route_candidate e[3] = {
        {.slot = 1, .up = true}, {.slot = 3, .up = true}, {.slot = 4, .up = true}};
    cursor = 0;
    int seen[3] = {0};
    for (int i = 0; i < 3; i++)
        seen[route_pick(ROUTE_POLICY_CACHE, e, 3, 10, &w, &cursor)]++;
    assert_int_equal(seen[0] + seen[1] + seen[2], 3);
    assert_int_equal(seen[0], 1);
    assert_int_equal(seen[1], 1);
    e[0].load.inflight = 1; /* same cost, but busier */
    e[0].load.prefill = 0;
    cursor = 0;
    assert_int_equal(route_pick(ROUTE_POLICY_CACHE, e, 3, 10, &w, &cursor), 1);
    /* round-robin ignores cache and load, skips what is down */
    cursor = 0;
    e[1].up = false;
    e[0].cached = 0;
    assert_int_equal(route_pick(ROUTE_POLICY_ROUND_ROBIN, e, 3, 10, &w, &cursor), 0);
    assert_int_equal(route_pick(ROUTE_POLICY_ROUND_ROBIN, e, 3, 10, &w, &cursor), 2);
    assert_int_equal(route_pick(ROUTE_POLICY_ROUND_ROBIN, e, 3, 10, &w, &cursor), 0);
}

static void test_sessions_lru(void **state)
{
    (void)state;
    route_sessions *m = NULL;
    assert_int_equal(route_sessions_create(3, &m), CAIRN_OK);
    route_sessions_set(m, "s:a", 1);
    route_sessions_set(m, "s:b", 2);
    route_sessions_set(m, "s:c", 3);
    assert_int_equal(route_sessions_get(m, "s:a"), 1); /* a is now the most recent */
    route_sessions_set(m, "s:d", 4);                   /* b, the least recent, goes */
    assert_int_equal(route_sessions_get(m, "s:b"), -1);
    assert_int_equal(route_sessions_get(m, "s:c"), 3);
    assert_int_equal(route_sessions_get(m, "s:d"), 4);
    assert_int_equal(route_sessions_count(m), 3);
    route_sessions_set(m, "s:a", 7); /* moved to another replica */
    assert_int_equal(route_sessions_get(m, "s:a"), 7);
    route_sessions_del(m, "s:a");
    assert_int_equal(route_sessions_get(m, "s:a"), -1);
    assert_int_equal(route_sessions_count(m), 2);
    route_sessions_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hashes_match_radix_chain),
        cmocka_unit_test(test_index_longest_prefix),
        cmocka_unit_test(test_index_predictions_expire),
        cmocka_unit_test(test_index_grows),
        cmocka_unit_test(test_cost),
        cmocka_unit_test(test_pick),
        cmocka_unit_test(test_sessions_lru),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
