/*
 * tests/store/test_kvcache_fetch.c — the persistent prefix cache as the
 * engine drives it: admission (cairn_kvcache_fetch), cost-aware loads,
 * write-back on shutdown, durable session records and pages (SIGKILL),
 * write-behind of reused prefixes (SIGKILL),
 * namespace isolation, per-tier statistics.
 *
 * Every page's payload is a function of its whole prefix (test_payload), so
 * any page that comes back is checked byte for byte against what was stored
 * for exactly that prefix. Nothing here depends on timing: the cost model is
 * pinned with cairn_kvcache_override_rates wherever a decision matters.
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

#include <math.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

#define PS 16

static cairn_page_hash ns_of(const char *fingerprint, const cairn_kv_layout *L)
{
    cairn_page_namespace ns = {.model_fingerprint = fingerprint,
                               .fingerprint_bytes = strlen(fingerprint),
                               .layout = L, .layout_version = CAIRN_KV_LAYOUT_VERSION};
    cairn_page_hash h;
    assert_int_equal(cairn_page_namespace_hash(&ns, &h), CAIRN_OK);
    return h;
}

typedef struct {
    cairn_backend *be;
    cairn_kvcache *c;
    cairn_kv_layout L;
} cache;

static bool open_write_behind; /* the next cache_open's config.write_behind */

static void cache_open_ns(cache *k, const char *dir, int dev_pages, int host_pages,
                          cairn_kv_layout L, cairn_page_hash ns)
{
    k->L = L;
    k->be = test_backend_create();
    assert_non_null(k->be);
    cairn_kvcache_config cfg = {.backend = k->be, .layout = L,
                                .device_bytes = (size_t)dev_pages * L.page_bytes,
                                .host_bytes = (size_t)host_pages * L.page_bytes,
                                .disk_dir = dir, .disk_map_bytes = 16u << 20, .ns = ns,
                                .write_behind = open_write_behind};
    char err[256] = "";
    assert_int_equal(cairn_kvcache_create(&cfg, &k->c, err, sizeof err), CAIRN_OK);
}

static void cache_open(cache *k, const char *dir, int dev_pages, int host_pages)
{
    cairn_kv_layout L = test_layout(PS);
    cache_open_ns(k, dir, dev_pages, host_pages, L, ns_of("fetch-test", &L));
}

static void cache_close(cache *k)
{
    cairn_kvcache_free(k->c);
    cairn_backend_destroy(k->be);
}

/* Tokens of sequence `s`: page p of every sequence with the same `s` agrees,
 * so sequences share prefixes when their first pages are made equal. */
static void seq_tokens(int32_t *tok, size_t n, int s)
{
    for (size_t i = 0; i < n; i++)
        tok[i] = (int32_t)((i * 7919u + (unsigned)s * 104729u) % 30000);
}

/* Compute (fake) KV for pages [first, n_pages) of tok and insert the whole
 * prefix; returns the leaf. Pages the tree already has are not recomputed. */
static cairn_radix_node *put_pages(cache *k, const int32_t *tok, size_t n_pages)
{
    cairn_radix *t = cairn_kvcache_tree(k->c);
    int32_t ids[64];
    assert_true(n_pages <= 64);
    assert_int_equal(cairn_kvcache_alloc(k->c, (int32_t)n_pages, ids), CAIRN_OK);
    uint8_t *base = cairn_page_pool_base(cairn_kvcache_device_pool(k->c));
    for (size_t i = 0; i < n_pages; i++)
        test_payload(tok, (i + 1) * PS, base + (size_t)ids[i] * k->L.page_bytes, k->L.page_bytes);
    size_t cached;
    cairn_radix_node *leaf;
    assert_int_equal(cairn_radix_insert(t, 0, tok, n_pages, ids, &cached, &leaf), CAIRN_OK);
    if (cached)
        cairn_page_pool_release(cairn_kvcache_device_pool(k->c), (int32_t)cached, ids);
    return leaf;
}

static cairn_kvcache_event wait_event(cache *k)
{
    cairn_kvcache_event ev;
    int n = 0;
    for (int i = 0; i < 100000 && n == 0; i++) {
        assert_int_equal(cairn_kvcache_poll(k->c, &ev, 1, &n), CAIRN_OK);
        if (!n)
            cairn_kvcache_wait(k->c, 100);
    }
    assert_int_equal(n, 1);
    return ev;
}

/* Every page of the path root..node is on the device and holds the payload
 * of its own prefix of tok. */
static void check_resident(cache *k, cairn_radix_node *node, const int32_t *tok)
{
    cairn_radix_page *path[64];
    size_t np;
    assert_int_equal(cairn_radix_path(node, path, 64, &np), CAIRN_OK);
    uint8_t *want = malloc(k->L.page_bytes), *got = malloc(k->L.page_bytes);
    for (size_t i = 0; i < np; i++) {
        assert_true(path[i]->device_page >= 0);
        test_payload(tok, (i + 1) * PS, want, k->L.page_bytes);
        assert_int_equal(cairn_kvcache_read_page(k->c, path[i], got), CAIRN_OK);
        assert_memory_equal(want, got, k->L.page_bytes);
    }
    free(want);
    free(got);
}

/* Device pages named by the tree + free pages == capacity; same for host. */
static void check_accounting(cache *k)
{
    cairn_radix *t = cairn_kvcache_tree(k->c);
    assert_int_equal(cairn_radix_check(t), CAIRN_OK);
    cairn_radix_stats rs;
    cairn_radix_get_stats(t, &rs);
    cairn_kvcache_stats st; /* draining: given back while a late copy still uses them */
    cairn_kvcache_get_stats(k->c, &st);
    cairn_page_pool *dev = cairn_kvcache_device_pool(k->c);
    /* tails: partial pages kept apart from the tree (pages found by parent) */
    assert_int_equal(rs.pages[CAIRN_TIER_DEVICE] + st.tier[CAIRN_TIER_DEVICE].draining_pages +
                         st.tail_pages + (size_t)cairn_page_pool_available(dev),
                     (size_t)cairn_page_pool_capacity(dev));
    cairn_host_pool *host = cairn_kvcache_host_pool(k->c);
    if (host)
        assert_int_equal(rs.pages[CAIRN_TIER_HOST] + st.tier[CAIRN_TIER_HOST].draining_pages +
                             st.tail_host_pages + (size_t)cairn_host_pool_available(host),
                         (size_t)cairn_host_pool_capacity(host));
}

static const cairn_kvcache_rates fast_disk = {.compute_tokens_per_s = 1000,
                                              .h2d_bytes_per_s = 1e9,
                                              .disk_bytes_per_s = 1e9,
                                              .disk_latency_s = 1e-4};

/* ---- fetch: in-memory tiers ------------------------------------------------ */

static void test_fetch_memory_tiers(void **state)
{
    (void)state;
    char dir[512];
    test_make_dir(dir, sizeof dir, "fetchmem");
    cache k;
    cache_open(&k, dir, 16, 16);
    cairn_radix *t = cairn_kvcache_tree(k.c);
    assert_int_equal(cairn_kvcache_override_rates(k.c, &fast_disk), CAIRN_OK);
    int32_t tok[6 * PS + 5];
    seq_tokens(tok, 6 * PS + 5, 1);
    /* Three nodes: A = pages 0-1, B = 2-3, C = 4-5. */
    put_pages(&k, tok, 2);
    put_pages(&k, tok, 4);
    cairn_radix_node *leaf = put_pages(&k, tok, 6);
    size_t moved;
    /* C, then B, to host; then C to disk: A device, B host, C disk. */
    assert_int_equal(cairn_kvcache_evict(k.c, CAIRN_TIER_DEVICE, 4, &moved), CAIRN_OK);
    assert_int_equal(moved, 4);
    assert_int_equal(cairn_kvcache_evict(k.c, CAIRN_TIER_HOST, 2, &moved), CAIRN_OK);
    assert_int_equal(moved, 2);
    assert_int_equal(cairn_radix_node_tier(leaf), CAIRN_TIER_DISK);
    check_accounting(&k);

    /* The engine leaves the last token out; 5 trailing tokens never match. */
    assert_int_equal(cairn_kvcache_fetch(k.c, 0, tok, 6 * PS + 4, SIZE_MAX, 11), CAIRN_OK);
    cairn_kvcache_event ev = wait_event(&k);
    assert_int_equal(ev.kind, CAIRN_KVCACHE_EV_FETCH);
    assert_int_equal(ev.cookie, 11);
    assert_int_equal(ev.status, CAIRN_OK);
    assert_int_equal(ev.resident_pages, 6);
    assert_ptr_equal(ev.node, leaf);
    assert_int_equal(ev.from_tier[CAIRN_TIER_DEVICE], 2);
    assert_int_equal(ev.from_tier[CAIRN_TIER_HOST], 2);
    assert_int_equal(ev.from_tier[CAIRN_TIER_DISK], 2);
    assert_int_equal(ev.skipped_pages, 0);
    assert_int_equal(cairn_radix_node_refs(leaf), 1); /* the caller's lock */
    check_resident(&k, ev.node, tok);
    check_accounting(&k);

    cairn_kvcache_stats st;
    cairn_kvcache_get_stats(k.c, &st);
    /* 6*PS+4 tokens asked about: 2 pages served by each tier. */
    assert_int_equal(st.tier[CAIRN_TIER_DEVICE].hit_tokens, 2 * PS);
    assert_int_equal(st.tier[CAIRN_TIER_DEVICE].miss_tokens, 4 * PS + 4);
    assert_int_equal(st.tier[CAIRN_TIER_HOST].hit_tokens, 2 * PS);
    assert_int_equal(st.tier[CAIRN_TIER_HOST].miss_tokens, 2 * PS + 4);
    assert_int_equal(st.tier[CAIRN_TIER_DISK].hit_tokens, 2 * PS);
    assert_int_equal(st.tier[CAIRN_TIER_DISK].miss_tokens, 4);
    assert_int_equal(st.tier[CAIRN_TIER_DISK].promoted_pages, 2);
    assert_int_equal(st.tier[CAIRN_TIER_HOST].promoted_pages, 4); /* B, and C on its way */
    assert_int_equal(st.tier[CAIRN_TIER_DEVICE].evicted_pages, 4);
    assert_int_equal(st.tier[CAIRN_TIER_HOST].evicted_pages, 2);
    assert_int_equal(st.tier[CAIRN_TIER_HOST].store_ops, 2);   /* two downloads */
    assert_true(st.tier[CAIRN_TIER_HOST].load_ops >= 2);       /* uploads       */
    assert_int_equal(st.tier[CAIRN_TIER_DISK].load_ops, 1);    /* one round     */
    assert_int_equal(st.child_pages, 0); /* the page after, looked for by parent: none */
    assert_int_equal(st.tier[CAIRN_TIER_DISK].store_ops, 2);   /* C's writes    */
    assert_true(st.tier[CAIRN_TIER_DISK].load_mean_s >= 0);
    assert_int_equal(st.tier[CAIRN_TIER_DEVICE].pages, 6);
    assert_int_equal(st.tier[CAIRN_TIER_DEVICE].bytes, 6 * k.L.page_bytes);
    assert_int_equal(st.tier[CAIRN_TIER_DEVICE].capacity_pages, 16);
    assert_int_equal(st.tier[CAIRN_TIER_DEVICE].free_pages + st.tier[CAIRN_TIER_DEVICE].draining_pages,
                     10);
    assert_int_equal(st.tier[CAIRN_TIER_DISK].pages, 2);
    assert_int_equal(st.fetches, 1);
    /* The measured rates moved off nothing (they are pinned) but counted. */
    cairn_kvcache_rates r;
    assert_int_equal(cairn_kvcache_get_rates(k.c, &r), CAIRN_OK);
    assert_true(r.overridden);
    assert_true(r.h2d_samples >= 2);
    assert_int_equal(r.disk_samples, 1);
    assert_true(r.disk_bytes_per_s == 1e9);
    assert_int_equal(cairn_radix_unlock(t, ev.node), CAIRN_OK);

    /* A prefix ending inside a node: the node is split, the lock is on the
     * prefix, which is all on the device. */
    assert_int_equal(cairn_kvcache_fetch(k.c, 0, tok, 3 * PS, SIZE_MAX, 12), CAIRN_OK);
    ev = wait_event(&k);
    assert_int_equal(ev.resident_pages, 3);
    assert_int_equal(cairn_radix_node_depth(ev.node), 3);
    assert_int_equal(ev.from_tier[CAIRN_TIER_DEVICE], 3);
    check_resident(&k, ev.node, tok);
    assert_int_equal(cairn_radix_unlock(t, ev.node), CAIRN_OK);

    /* max_pages stops the lookup. */
    assert_int_equal(cairn_kvcache_fetch(k.c, 0, tok, 6 * PS, 4, 13), CAIRN_OK);
    ev = wait_event(&k);
    assert_int_equal(ev.resident_pages, 4);
    assert_int_equal(cairn_radix_unlock(t, ev.node), CAIRN_OK);

    /* Nothing cached: the root, no lock, still an event. */
    int32_t other[2 * PS];
    seq_tokens(other, 2 * PS, 99);
    assert_int_equal(cairn_kvcache_fetch(k.c, 0, other, 2 * PS, SIZE_MAX, 14), CAIRN_OK);
    ev = wait_event(&k);
    assert_int_equal(ev.cookie, 14);
    assert_int_equal(ev.resident_pages, 0);
    assert_ptr_equal(ev.node, cairn_radix_root(t));
    assert_int_equal(cairn_radix_unlock(t, ev.node), CAIRN_OK); /* a no-op */
    /* Fewer tokens than a page. */
    assert_int_equal(cairn_kvcache_fetch(k.c, 0, tok, 3, SIZE_MAX, 15), CAIRN_OK);
    ev = wait_event(&k);
    assert_int_equal(ev.resident_pages, 0);
    assert_int_equal(cairn_kvcache_fetch(NULL, 0, tok, 3, SIZE_MAX, 15), CAIRN_EINVAL);
    assert_int_equal(cairn_kvcache_fetch(k.c, 0, NULL, 3, SIZE_MAX, 15), CAIRN_EINVAL);

    cairn_radix_stats rs;
    cairn_radix_get_stats(t, &rs);
    assert_int_equal(rs.locked_nodes, 0);
    check_accounting(&k);
    cache_close(&k);
    test_remove_dir(dir);
}

/* ---- fetch: continuing the match on disk after a restart ------------------- */

static void test_fetch_after_restart(void **state)
{
    (void)state;
    char dir[512];
    test_make_dir(dir, sizeof dir, "restart");
    int32_t tok[10 * PS + 1], fork_tok[10 * PS + 1];
    seq_tokens(tok, 10 * PS + 1, 2);
    memcpy(fork_tok, tok, sizeof tok);
    fork_tok[6 * PS + 3] ^= 0x40; /* shares pages 0-5 only */

    /* First life: compute 10 pages, all on the device; SIGTERM: flush. */
    cache k;
    cache_open(&k, dir, 32, 8);
    put_pages(&k, tok, 10);
    assert_int_equal(cairn_kvcache_flush(k.c), CAIRN_OK);
    cairn_kvcache_stats st;
    cairn_kvcache_get_stats(k.c, &st);
    assert_int_equal(st.tier[CAIRN_TIER_DISK].pages, 10);
    assert_int_equal(st.written_pages, 10);
    /* A second flush has nothing to write. */
    assert_int_equal(cairn_kvcache_flush(k.c), CAIRN_OK);
    cairn_kvcache_get_stats(k.c, &st);
    assert_int_equal(st.written_pages, 10);
    cache_close(&k);

    /* Second life, with 3 host slots: the continuation needs several rounds. */
    cache_open(&k, dir, 32, 3);
    cairn_radix *t = cairn_kvcache_tree(k.c);
    assert_int_equal(cairn_kvcache_override_rates(k.c, &fast_disk), CAIRN_OK);
    assert_int_equal(cairn_kvcache_fetch(k.c, 0, tok, 10 * PS, SIZE_MAX, 21), CAIRN_OK);
    /* fetch did not wait for the disk: the tree learns of the pages only
     * when poll handles the completions. Meanwhile other work goes on. */
    cairn_radix_stats rs;
    cairn_radix_get_stats(t, &rs);
    assert_int_equal(rs.n_nodes, 0);
    int32_t other[2 * PS];
    seq_tokens(other, 2 * PS, 77);
    put_pages(&k, other, 2);
    cairn_kvcache_event ev = wait_event(&k);
    assert_int_equal(ev.kind, CAIRN_KVCACHE_EV_FETCH);
    assert_int_equal(ev.status, CAIRN_OK);
    assert_int_equal(ev.resident_pages, 10);
    assert_int_equal(ev.from_tier[CAIRN_TIER_DISK], 10);
    assert_int_equal(cairn_radix_node_depth(ev.node), 10);
    assert_int_equal(cairn_radix_node_refs(ev.node), 1);
    check_resident(&k, ev.node, tok);
    check_accounting(&k);
    cairn_kvcache_get_stats(k.c, &st);
    assert_true(st.tier[CAIRN_TIER_DISK].load_ops >= 3); /* rounds of <= 3 + 1 */
    assert_int_equal(st.tier[CAIRN_TIER_DISK].hit_tokens, 10 * PS);
    assert_int_equal(st.tier[CAIRN_TIER_DISK].miss_tokens, 0);
    assert_int_equal(cairn_radix_unlock(t, ev.node), CAIRN_OK);

    /* A fork of the conversation: the in-memory match covers pages 0-5. */
    assert_int_equal(cairn_kvcache_fetch(k.c, 0, fork_tok, 10 * PS, SIZE_MAX, 22), CAIRN_OK);
    ev = wait_event(&k);
    assert_int_equal(ev.resident_pages, 6);
    assert_int_equal(ev.from_tier[CAIRN_TIER_DEVICE], 6);
    assert_int_equal(cairn_radix_unlock(t, ev.node), CAIRN_OK);
    cache_close(&k);

    /* Third life: page 4 fails verification on disk (a read expecting other
     * tokens deletes it): the continuation stops there, pages 0-3 serve. */
    cache_open(&k, dir, 32, 8);
    t = cairn_kvcache_tree(k.c);
    assert_int_equal(cairn_kvcache_override_rates(k.c, &fast_disk), CAIRN_OK);
    cairn_page_hash h = ns_of("fetch-test", &k.L);
    for (int p = 0; p <= 4; p++)
        h = cairn_page_hash_next(h, tok + p * PS, PS);
    int32_t wrong[PS] = {0};
    uint8_t *buf = malloc(k.L.page_bytes);
    assert_int_equal(cairn_disk_read(cairn_kvcache_disk(k.c), h, wrong, buf, 0), CAIRN_OK);
    assert_int_equal(cairn_kvcache_fetch(k.c, 0, tok, 10 * PS, SIZE_MAX, 23), CAIRN_OK);
    ev = wait_event(&k);
    assert_int_equal(ev.status, CAIRN_OK); /* a miss past the match is no error */
    assert_int_equal(ev.resident_pages, 4);
    assert_int_equal(ev.from_tier[CAIRN_TIER_DISK], 4);
    check_resident(&k, ev.node, tok);
    assert_int_equal(cairn_radix_unlock(t, ev.node), CAIRN_OK);
    check_accounting(&k);
    cairn_disk_stats ds;
    cairn_disk_get_stats(cairn_kvcache_disk(k.c), &ds);
    assert_int_equal(ds.corrupt, 1);
    free(buf);
    cache_close(&k);
    test_remove_dir(dir);
}

/* After a restart, a request that shares a sequence's whole pages and part
 * of the next one (another question about the same document) finds that
 * page by its parent on disk: it comes back as a tail in host RAM, and
 * partial() copies its shared rows, exactly the stored ones. */
static void test_fetch_partial_after_restart(void **state)
{
    (void)state;
    char dir[512];
    test_make_dir(dir, sizeof dir, "partial");
    int32_t tok[4 * PS], q[4 * PS + 3];
    seq_tokens(tok, 4 * PS, 3);
    memcpy(q, tok, sizeof tok);
    for (int i = 3 * PS + 5; i < 4 * PS + 3; i++)
        q[i] = 29000 + i; /* shares pages 0-2 and 5 tokens of page 3 */

    cache k;
    cache_open(&k, dir, 32, 8);
    put_pages(&k, tok, 4);
    assert_int_equal(cairn_kvcache_flush(k.c), CAIRN_OK);
    cache_close(&k);

    cache_open(&k, dir, 32, 8);
    cairn_radix *t = cairn_kvcache_tree(k.c);
    assert_int_equal(cairn_kvcache_override_rates(k.c, &fast_disk), CAIRN_OK);
    assert_int_equal(cairn_kvcache_fetch(k.c, 0, q, 4 * PS + 2, SIZE_MAX, 31), CAIRN_OK);
    cairn_kvcache_event ev = wait_event(&k);
    assert_int_equal(ev.status, CAIRN_OK);
    assert_int_equal(ev.resident_pages, 3);
    check_resident(&k, ev.node, tok);
    cairn_kvcache_stats st;
    cairn_kvcache_get_stats(k.c, &st);
    assert_int_equal(st.child_pages, 1);
    assert_int_equal(st.tail_host_pages, 1);
    int32_t page = -1;
    size_t reused = 0;
    int from = -1;
    assert_int_equal(cairn_kvcache_partial(k.c, 0, ev.node, 3, q + 3 * PS, PS + 2, &page, &reused,
                                           &from),
                     CAIRN_OK);
    assert_int_equal(reused, 5);
    assert_int_equal(from, CAIRN_TIER_DISK); /* this request's rows came from disk */
    uint8_t *want = malloc(k.L.page_bytes);
    test_payload(tok, 4 * PS, want, k.L.page_bytes);
    uint8_t *base = cairn_page_pool_base(cairn_kvcache_device_pool(k.c));
    assert_memory_equal(base + (size_t)page * k.L.page_bytes, want, k.L.page_bytes);
    cairn_kvcache_free_pages(k.c, 1, &page);
    /* the next request finds it in host RAM */
    page = -1;
    assert_int_equal(cairn_kvcache_partial(k.c, 0, ev.node, 3, q + 3 * PS, PS + 2, &page, &reused,
                                           &from),
                     CAIRN_OK);
    assert_int_equal(reused, 5);
    assert_int_equal(from, CAIRN_TIER_HOST);
    cairn_kvcache_free_pages(k.c, 1, &page);
    assert_int_equal(cairn_radix_unlock(t, ev.node), CAIRN_OK);

    /* Asked again: memory has the page now, the disk is not asked. */
    assert_int_equal(cairn_kvcache_fetch(k.c, 0, q, 4 * PS + 2, SIZE_MAX, 32), CAIRN_OK);
    ev = wait_event(&k);
    assert_int_equal(ev.resident_pages, 3);
    assert_int_equal(cairn_radix_unlock(t, ev.node), CAIRN_OK);
    cairn_kvcache_get_stats(k.c, &st);
    assert_int_equal(st.child_pages, 1);

    /* A request sharing no token of page 3: nothing found, nothing kept. */
    int32_t r[4 * PS];
    memcpy(r, tok, 3 * PS * sizeof *r);
    for (int i = 3 * PS; i < 4 * PS; i++)
        r[i] = 28000 + i;
    assert_int_equal(cairn_kvcache_fetch(k.c, 0, r, 4 * PS - 1, SIZE_MAX, 33), CAIRN_OK);
    ev = wait_event(&k);
    assert_int_equal(ev.resident_pages, 3);
    assert_int_equal(cairn_radix_unlock(t, ev.node), CAIRN_OK);
    cairn_kvcache_get_stats(k.c, &st);
    assert_int_equal(st.child_pages, 1);
    check_accounting(&k);
    free(want);
    cache_close(&k);
    test_remove_dir(dir);
}

/* A conversation's partly filled last page (a tail, not a page of the
 * tree) is written at flush as a padded page under its parent: after a
 * restart, the next turn finds it by its tokens and reuses exactly them. */
static void test_tail_after_restart(void **state)
{
    (void)state;
    char dir[512];
    test_make_dir(dir, sizeof dir, "tail");
    int32_t tok[3 * PS + 40];
    seq_tokens(tok, 3 * PS + 40, 4);
    const size_t n_hist = 2 * PS + 9; /* 2 whole pages and a tail of 9 */

    cache k;
    cache_open(&k, dir, 32, 8);
    put_pages(&k, tok, 2);
    int32_t page;
    assert_int_equal(cairn_kvcache_alloc(k.c, 1, &page), CAIRN_OK);
    uint8_t *base = cairn_page_pool_base(cairn_kvcache_device_pool(k.c));
    test_payload(tok, n_hist, base + (size_t)page * k.L.page_bytes, k.L.page_bytes);
    assert_int_equal(cairn_kvcache_keep_tail(k.c, 0, tok, n_hist, page), CAIRN_OK);
    assert_int_equal(cairn_kvcache_flush(k.c), CAIRN_OK);
    cairn_kvcache_stats st;
    cairn_kvcache_get_stats(k.c, &st);
    assert_int_equal(st.written_pages, 3); /* two pages and the tail */
    cache_close(&k);

    cache_open(&k, dir, 32, 8);
    cairn_radix *t = cairn_kvcache_tree(k.c);
    assert_int_equal(cairn_kvcache_override_rates(k.c, &fast_disk), CAIRN_OK);
    /* the next turn: the history and more */
    assert_int_equal(cairn_kvcache_fetch(k.c, 0, tok, 3 * PS + 30, SIZE_MAX, 41), CAIRN_OK);
    cairn_kvcache_event ev = wait_event(&k);
    assert_int_equal(ev.resident_pages, 2);
    cairn_kvcache_get_stats(k.c, &st);
    assert_int_equal(st.child_pages, 1);
    int32_t got = -1;
    size_t reused = 0;
    int from = -1;
    assert_int_equal(cairn_kvcache_partial(k.c, 0, ev.node, 2, tok + 2 * PS, PS + 20, &got,
                                           &reused, &from),
                     CAIRN_OK);
    assert_int_equal(reused, 9); /* the tail's tokens, not one more */
    assert_int_equal(from, CAIRN_TIER_DISK);
    uint8_t *want = malloc(k.L.page_bytes);
    test_payload(tok, n_hist, want, k.L.page_bytes);
    base = cairn_page_pool_base(cairn_kvcache_device_pool(k.c));
    assert_memory_equal(base + (size_t)got * k.L.page_bytes, want, k.L.page_bytes);
    cairn_kvcache_free_pages(k.c, 1, &got);
    assert_int_equal(cairn_radix_unlock(t, ev.node), CAIRN_OK);
    /* a padded tail is never a page of the tree: a read by hash of the
     * request's whole pages does not find it */
    assert_int_equal(cairn_kvcache_fetch(k.c, 0, tok, 3 * PS + 30, SIZE_MAX, 42), CAIRN_OK);
    ev = wait_event(&k);
    assert_int_equal(ev.resident_pages, 2);
    assert_int_equal(cairn_radix_unlock(t, ev.node), CAIRN_OK);
    check_accounting(&k);
    free(want);
    cache_close(&k);
    test_remove_dir(dir);
}

/* Two fetches of the same disk-resident prefix at once: both answer, the
 * pages are in the tree once, and the duplicate copies go back. */
static void test_fetch_concurrent(void **state)
{
    (void)state;
    char dir[512];
    test_make_dir(dir, sizeof dir, "concurrent");
    int32_t tok[6 * PS];
    seq_tokens(tok, 6 * PS, 3);
    cache k;
    cache_open(&k, dir, 32, 16);
    put_pages(&k, tok, 6);
    assert_int_equal(cairn_kvcache_flush(k.c), CAIRN_OK);
    cache_close(&k);

    cache_open(&k, dir, 32, 16);
    cairn_radix *t = cairn_kvcache_tree(k.c);
    assert_int_equal(cairn_kvcache_override_rates(k.c, &fast_disk), CAIRN_OK);
    assert_int_equal(cairn_kvcache_fetch(k.c, 0, tok, 6 * PS, SIZE_MAX, 1), CAIRN_OK);
    assert_int_equal(cairn_kvcache_fetch(k.c, 0, tok, 4 * PS, SIZE_MAX, 2), CAIRN_OK);
    cairn_kvcache_event a = wait_event(&k), b = wait_event(&k);
    if (a.cookie == 2) {
        cairn_kvcache_event x = a;
        a = b;
        b = x;
    }
    assert_int_equal(a.resident_pages, 6);
    assert_int_equal(b.resident_pages, 4);
    check_resident(&k, a.node, tok);
    check_resident(&k, b.node, tok);
    cairn_radix_stats rs;
    cairn_radix_get_stats(t, &rs);
    assert_int_equal(rs.pages[CAIRN_TIER_DEVICE], 6);
    check_accounting(&k);
    assert_int_equal(cairn_radix_unlock(t, a.node), CAIRN_OK);
    assert_int_equal(cairn_radix_unlock(t, b.node), CAIRN_OK);
    cache_close(&k);
    test_remove_dir(dir);
}

/* ---- cost-aware loads ------------------------------------------------------ */

static void test_cost_model(void **state)
{
    (void)state;
    char dir[512];
    test_make_dir(dir, sizeof dir, "cost");
    cache k;
    cache_open(&k, dir, 16, 16);
    cairn_radix *t = cairn_kvcache_tree(k.c);
    int32_t tok[6 * PS];
    seq_tokens(tok, 6 * PS, 4);
    put_pages(&k, tok, 2);
    put_pages(&k, tok, 4);
    cairn_radix_node *leaf = put_pages(&k, tok, 6);
    size_t moved;
    cairn_kvcache_evict(k.c, CAIRN_TIER_DEVICE, 4, &moved);
    cairn_kvcache_evict(k.c, CAIRN_TIER_HOST, 2, &moved);
    assert_int_equal(cairn_radix_node_tier(leaf), CAIRN_TIER_DISK);
    size_t pb = k.L.page_bytes; /* 1 KiB */

    /* Recomputing a page takes 1 ms (16 tokens at 16000 tokens/s). A disk
     * that needs 1 s per round is not worth it; host RAM (1 us) is. */
    cairn_kvcache_rates slow_disk = {.compute_tokens_per_s = 16000, .h2d_bytes_per_s = 1e9,
                                     .disk_bytes_per_s = 1e9, .disk_latency_s = 1.0};
    assert_int_equal(cairn_kvcache_override_rates(k.c, &slow_disk), CAIRN_OK);
    cairn_disk_stats before, after;
    cairn_disk_get_stats(cairn_kvcache_disk(k.c), &before);
    assert_int_equal(cairn_kvcache_fetch(k.c, 0, tok, 6 * PS, SIZE_MAX, 1), CAIRN_OK);
    cairn_kvcache_event ev = wait_event(&k);
    assert_int_equal(ev.resident_pages, 4);
    assert_int_equal(ev.skipped_pages, 2);
    assert_int_equal(ev.from_tier[CAIRN_TIER_HOST], 2);
    check_resident(&k, ev.node, tok);
    cairn_disk_get_stats(cairn_kvcache_disk(k.c), &after);
    assert_int_equal(after.reads, before.reads); /* the disk was not touched */
    assert_int_equal(cairn_radix_node_tier(leaf), CAIRN_TIER_DISK);
    assert_int_equal(cairn_radix_unlock(t, ev.node), CAIRN_OK);
    cairn_kvcache_stats st;
    cairn_kvcache_get_stats(k.c, &st);
    assert_int_equal(st.fetch_skipped_pages, 2);

    /* A throughput-bound disk: 1 KiB at 100 KB/s = 10 ms a page, ten times
     * the recompute: nothing from disk, even with no latency. */
    cairn_kvcache_rates narrow = slow_disk;
    narrow.disk_latency_s = 0;
    narrow.disk_bytes_per_s = 1e5;
    assert_int_equal(cairn_kvcache_override_rates(k.c, &narrow), CAIRN_OK);
    assert_int_equal(cairn_kvcache_fetch(k.c, 0, tok, 6 * PS, SIZE_MAX, 2), CAIRN_OK);
    ev = wait_event(&k);
    assert_int_equal(ev.resident_pages, 4);
    assert_int_equal(ev.skipped_pages, 2);
    assert_int_equal(cairn_radix_unlock(t, ev.node), CAIRN_OK);

    /* Latency amortised: 1.5 ms per round is worth it for two pages
     * (2 ms of recompute saved) only because the per-page cost is tiny. */
    cairn_kvcache_rates amortised = slow_disk;
    amortised.disk_latency_s = 1.5e-3;
    assert_int_equal(cairn_kvcache_override_rates(k.c, &amortised), CAIRN_OK);
    assert_int_equal(cairn_kvcache_fetch(k.c, 0, tok, 6 * PS, SIZE_MAX, 3), CAIRN_OK);
    ev = wait_event(&k);
    assert_int_equal(ev.resident_pages, 6);
    assert_int_equal(ev.skipped_pages, 0);
    assert_int_equal(ev.from_tier[CAIRN_TIER_DISK], 2);
    check_resident(&k, ev.node, tok);
    assert_int_equal(cairn_radix_unlock(t, ev.node), CAIRN_OK);

    /* Everything slower than compute: only what is on the device. */
    cache_close(&k);
    test_remove_dir(dir);
    test_make_dir(dir, sizeof dir, "cost2");
    cache_open(&k, dir, 16, 16);
    t = cairn_kvcache_tree(k.c);
    put_pages(&k, tok, 2);
    put_pages(&k, tok, 4);
    cairn_kvcache_evict(k.c, CAIRN_TIER_DEVICE, 2, &moved);
    cairn_kvcache_rates all_slow = {.compute_tokens_per_s = 1e9, .h2d_bytes_per_s = 1e3,
                                    .disk_bytes_per_s = 1e3, .disk_latency_s = 1};
    assert_int_equal(cairn_kvcache_override_rates(k.c, &all_slow), CAIRN_OK);
    assert_int_equal(cairn_kvcache_fetch(k.c, 0, tok, 6 * PS, SIZE_MAX, 4), CAIRN_OK);
    ev = wait_event(&k);
    assert_int_equal(ev.resident_pages, 2);
    assert_int_equal(ev.skipped_pages, 2);
    assert_int_equal(ev.from_tier[CAIRN_TIER_DEVICE], 2);
    assert_int_equal(cairn_radix_unlock(t, ev.node), CAIRN_OK);
    /* After a restart with a slow disk: no read is even issued. */
    assert_int_equal(cairn_kvcache_flush(k.c), CAIRN_OK);
    cache_close(&k);
    cache_open(&k, dir, 16, 16);
    assert_int_equal(cairn_kvcache_override_rates(k.c, &all_slow), CAIRN_OK);
    cairn_disk_get_stats(cairn_kvcache_disk(k.c), &before);
    assert_int_equal(cairn_kvcache_fetch(k.c, 0, tok, 6 * PS, SIZE_MAX, 5), CAIRN_OK);
    ev = wait_event(&k);
    assert_int_equal(ev.resident_pages, 0);
    cairn_disk_get_stats(cairn_kvcache_disk(k.c), &after);
    assert_int_equal(after.reads, before.reads);

    /* The rates API: validation, priors, measured values. */
    cairn_kvcache_rates bad = all_slow;
    bad.h2d_bytes_per_s = 0;
    assert_int_equal(cairn_kvcache_override_rates(k.c, &bad), CAIRN_EINVAL);
    bad = all_slow;
    bad.disk_latency_s = -1;
    assert_int_equal(cairn_kvcache_override_rates(k.c, &bad), CAIRN_EINVAL);
    assert_int_equal(cairn_kvcache_set_compute_rate(k.c, 0), CAIRN_EINVAL);
    assert_int_equal(cairn_kvcache_set_compute_rate(k.c, -5), CAIRN_EINVAL);
    assert_int_equal(cairn_kvcache_set_compute_rate(k.c, NAN), CAIRN_EINVAL);
    assert_int_equal(cairn_kvcache_override_rates(k.c, NULL), CAIRN_OK);
    cairn_kvcache_rates r;
    cairn_kvcache_get_rates(k.c, &r);
    assert_false(r.overridden);
    assert_true(r.compute_tokens_per_s == 2000.0); /* the prior */
    assert_int_equal(cairn_kvcache_set_compute_rate(k.c, 12345), CAIRN_OK);
    cairn_kvcache_get_rates(k.c, &r);
    assert_true(r.compute_tokens_per_s == 12345);
    assert_int_equal(r.compute_samples, 1);
    /* With the priors and a 12345 tokens/s engine, 1 KiB pages load: the
     * restart fetch now reads from disk, and feeds the measurements. */
    cairn_radix *t2 = cairn_kvcache_tree(k.c);
    assert_int_equal(cairn_kvcache_fetch(k.c, 0, tok, 6 * PS, SIZE_MAX, 6), CAIRN_OK);
    ev = wait_event(&k);
    assert_int_equal(ev.resident_pages, 4);
    assert_int_equal(ev.from_tier[CAIRN_TIER_DISK], 4);
    check_resident(&k, ev.node, tok);
    assert_int_equal(cairn_radix_unlock(t2, ev.node), CAIRN_OK);
    cairn_kvcache_get_rates(k.c, &r);
    assert_true(r.disk_samples >= 1);
    assert_true(r.h2d_samples >= 1);
    assert_true(r.disk_bytes_per_s > 0 && isfinite(r.disk_bytes_per_s));
    assert_true(r.disk_latency_s >= 0 && isfinite(r.disk_latency_s));
    assert_true(r.h2d_bytes_per_s > 0 && isfinite(r.h2d_bytes_per_s));
    (void)pb;
    cache_close(&k);
    test_remove_dir(dir);
}

/* ---- records --------------------------------------------------------------- */

static int count_records(const void *key, size_t key_len, const void *value, size_t value_bytes,
                         void *user)
{
    (void)value;
    (void)value_bytes;
    size_t *n = user;
    assert_true(key_len > 0 && key != NULL);
    (*n)++;
    return 0;
}

static void test_records(void **state)
{
    (void)state;
    char dir[512];
    test_make_dir(dir, sizeof dir, "records");
    cache k;
    cache_open(&k, dir, 4, 4);
    size_t big_n = 3u << 20;
    uint8_t *big = malloc(big_n);
    for (size_t i = 0; i < big_n; i++)
        big[i] = (uint8_t)(i * 31 + (i >> 13));
    assert_int_equal(cairn_kvcache_record_put(k.c, "sess:a", 6, "hello", 5, 1), CAIRN_OK);
    assert_int_equal(cairn_kvcache_record_put(k.c, "sess:b", 6, big, big_n, 2), CAIRN_OK);
    assert_int_equal(cairn_kvcache_record_put(k.c, "sess:c", 6, NULL, 0, 3), CAIRN_OK);
    for (int i = 1; i <= 3; i++) {
        cairn_kvcache_event ev = wait_event(&k);
        assert_int_equal(ev.kind, CAIRN_KVCACHE_EV_RECORD_PUT);
        assert_int_equal(ev.cookie, (uint64_t)i); /* in call order */
        assert_int_equal(ev.status, CAIRN_OK);
    }
    /* Replace, delete, get. */
    assert_int_equal(cairn_kvcache_record_put(k.c, "sess:a", 6, "world!", 6, 4), CAIRN_OK);
    assert_int_equal(cairn_kvcache_record_delete(k.c, "sess:c", 6, 5), CAIRN_OK);
    assert_int_equal(cairn_kvcache_record_delete(k.c, "sess:zz", 7, 6), CAIRN_OK);
    assert_int_equal(cairn_kvcache_record_get(k.c, "sess:b", 6, 7), CAIRN_OK);
    assert_int_equal(cairn_kvcache_record_get(k.c, "sess:c", 6, 8), CAIRN_OK);
    cairn_kvcache_event ev = wait_event(&k);
    assert_int_equal(ev.status, CAIRN_OK);
    ev = wait_event(&k);
    assert_int_equal(ev.kind, CAIRN_KVCACHE_EV_RECORD_DELETE);
    assert_int_equal(ev.status, CAIRN_OK);
    ev = wait_event(&k);
    assert_int_equal(ev.cookie, 6);
    assert_int_equal(ev.status, CAIRN_ENOTFOUND);
    ev = wait_event(&k);
    assert_int_equal(ev.kind, CAIRN_KVCACHE_EV_RECORD_GET);
    assert_int_equal(ev.status, CAIRN_OK);
    assert_int_equal(ev.data_bytes, big_n);
    assert_memory_equal(ev.data, big, big_n);
    free(ev.data);
    ev = wait_event(&k);
    assert_int_equal(ev.cookie, 8);
    assert_int_equal(ev.status, CAIRN_ENOTFOUND);
    assert_null(ev.data);
    /* Bad keys. */
    char long_key[600];
    memset(long_key, 'k', sizeof long_key);
    assert_int_equal(cairn_kvcache_record_put(k.c, long_key, sizeof long_key, "x", 1, 9),
                     CAIRN_EINVAL);
    assert_int_equal(cairn_kvcache_record_put(k.c, "", 0, "x", 1, 9), CAIRN_EINVAL);
    assert_int_equal(cairn_kvcache_record_put(k.c, "k", 1, NULL, 5, 9), CAIRN_EINVAL);
    /* A get left unpolled is freed with the cache (ASan checks). */
    assert_int_equal(cairn_kvcache_record_get(k.c, "sess:a", 6, 10), CAIRN_OK);
    assert_int_equal(cairn_kvcache_flush(k.c), CAIRN_OK); /* waits past it */
    cairn_kvcache_stats st;
    cairn_kvcache_get_stats(k.c, &st);
    assert_int_equal(st.disk_records, 2);
    cache_close(&k);

    /* After a restart: blocking reads, iteration. */
    cache_open(&k, dir, 4, 4);
    cairn_disk *d = cairn_kvcache_disk(k.c);
    void *v;
    size_t vn;
    assert_int_equal(cairn_disk_record_read(d, "sess:a", 6, &v, &vn), CAIRN_OK);
    assert_int_equal(vn, 6);
    assert_memory_equal(v, "world!", 6);
    free(v);
    assert_int_equal(cairn_disk_record_read(d, "sess:b", 6, &v, &vn), CAIRN_OK);
    assert_int_equal(vn, big_n);
    assert_memory_equal(v, big, big_n);
    free(v);
    assert_int_equal(cairn_disk_record_read(d, "sess:c", 6, &v, &vn), CAIRN_ENOTFOUND);
    size_t n = 0;
    assert_int_equal(cairn_disk_record_iterate(d, count_records, &n), CAIRN_OK);
    assert_int_equal(n, 2);
    /* Records are not pages: a page namespace never sees them, and the
     * tier's page count does not include them. */
    cairn_kvcache_get_stats(k.c, &st);
    assert_int_equal(st.tier[CAIRN_TIER_DISK].pages, 0);
    cache_close(&k);

    /* No disk tier: records are unsupported. */
    cairn_kv_layout L = test_layout(PS);
    cairn_backend *be = test_backend_create();
    cairn_kvcache_config cfg = {.backend = be, .layout = L, .device_bytes = 4 * L.page_bytes,
                                .ns = ns_of("x", &L)};
    cairn_kvcache *c;
    assert_int_equal(cairn_kvcache_create(&cfg, &c, NULL, 0), CAIRN_OK);
    assert_int_equal(cairn_kvcache_record_put(c, "a", 1, "b", 1, 1), CAIRN_EUNSUPPORTED);
    assert_int_equal(cairn_kvcache_flush(c), CAIRN_OK);
    cairn_kvcache_free(c);
    cairn_backend_destroy(be);
    free(big);
    test_remove_dir(dir);
}

/* ---- durable session: SIGKILL after the engine was told ------------------- */

#define SESSION_PAGES 7

static void durable_child(const char *dir, int fd)
{
    cache k;
    cache_open(&k, dir, 32, 8);
    int32_t tok[SESSION_PAGES * PS];
    seq_tokens(tok, SESSION_PAGES * PS, 5);
    /* Some of the history is idle in host RAM, some on the device. */
    put_pages(&k, tok, 3);
    size_t moved;
    cairn_kvcache_evict(k.c, CAIRN_TIER_DEVICE, 3, &moved);
    cairn_radix_node *leaf = put_pages(&k, tok, SESSION_PAGES);
    const char record[] = "history=7 pages; temperature=0.7";
    if (cairn_kvcache_persist(k.c, leaf, 100) != CAIRN_OK ||
        cairn_kvcache_record_put(k.c, "session:42", 10, record, sizeof record, 101) != CAIRN_OK)
        _exit(2);
    int seen = 0;
    while (seen != 3) {
        cairn_kvcache_event ev;
        int n;
        cairn_kvcache_wait(k.c, 1000);
        cairn_kvcache_poll(k.c, &ev, 1, &n);
        if (n == 0)
            continue;
        if (ev.status != CAIRN_OK)
            _exit(3);
        seen |= ev.cookie == 100 ? 1 : ev.cookie == 101 ? 2 : 0;
    }
    /* Both durable: this is where the engine would reply. */
    char ok = 'D';
    if (write(fd, &ok, 1) != 1)
        _exit(4);
    for (;;)
        pause();
}

/* Runs child(dir, fd) in a forked process until it writes `ready` to fd
 * (what it made is durable, by its own account), then SIGKILLs it: no
 * shutdown, no flush, as an OOM kill or a container runtime's would. */
static void run_then_sigkill(const char *dir, void (*child)(const char *, int), char ready)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        child(dir, fds[1]);
        _exit(0);
    }
    close(fds[1]);
    char got = 0;
    assert_int_equal(read(fds[0], &got, 1), 1);
    assert_int_equal(got, ready);
    kill(pid, SIGKILL);
    int wst;
    waitpid(pid, &wst, 0);
    close(fds[0]);
    assert_true(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL);
}

static void test_durable_sigkill(void **state)
{
    (void)state;
    char dir[512];
    test_make_dir(dir, sizeof dir, "durable");
    run_then_sigkill(dir, durable_child, 'D');

    cache k;
    cache_open(&k, dir, 32, 8);
    void *v;
    size_t vn;
    const char record[] = "history=7 pages; temperature=0.7";
    assert_int_equal(cairn_disk_record_read(cairn_kvcache_disk(k.c), "session:42", 10, &v, &vn),
                     CAIRN_OK);
    assert_int_equal(vn, sizeof record);
    assert_memory_equal(v, record, sizeof record);
    free(v);
    assert_int_equal(cairn_kvcache_override_rates(k.c, &fast_disk), CAIRN_OK);
    int32_t tok[SESSION_PAGES * PS + 1];
    seq_tokens(tok, SESSION_PAGES * PS + 1, 5);
    assert_int_equal(cairn_kvcache_fetch(k.c, 0, tok, SESSION_PAGES * PS, SIZE_MAX, 1), CAIRN_OK);
    cairn_kvcache_event ev = wait_event(&k);
    assert_int_equal(ev.resident_pages, SESSION_PAGES);
    assert_int_equal(ev.from_tier[CAIRN_TIER_DISK], SESSION_PAGES);
    check_resident(&k, ev.node, tok);
    assert_int_equal(cairn_radix_unlock(cairn_kvcache_tree(k.c), ev.node), CAIRN_OK);
    cache_close(&k);
    test_remove_dir(dir);
}

/* Write-behind: a prefix that a fetch found in memory (reused) reaches
 * LMDB without eviction, flush or persist, and survives a SIGKILL; a
 * prefix used once does not go there. */
#define WB_PAGES 10
static void write_behind_child(const char *dir, int fd)
{
    open_write_behind = true;
    cache k;
    cache_open(&k, dir, 64, 32);
    int32_t tok[WB_PAGES * PS + 1], once[4 * PS];
    seq_tokens(tok, WB_PAGES * PS + 1, 8);
    seq_tokens(once, 4 * PS, 9);
    put_pages(&k, tok, WB_PAGES);
    put_pages(&k, once, 4);
    /* The prefix idles in host RAM (the least recently used node moves
     * there, and nothing leaves host RAM: no write-back) and is reused
     * from there. */
    size_t moved;
    cairn_kvcache_evict(k.c, CAIRN_TIER_DEVICE, 1, &moved);
    if (moved != WB_PAGES)
        _exit(7);
    if (cairn_kvcache_fetch(k.c, 0, tok, WB_PAGES * PS + 1, SIZE_MAX, 1) != CAIRN_OK)
        _exit(2);
    cairn_kvcache_event ev;
    int n = 0, rounds = 0;
    while (n == 0 || cairn_kvcache_busy(k.c)) {
        cairn_kvcache_event e;
        int m = 0;
        cairn_kvcache_poll(k.c, &e, 1, &m);
        if (m) {
            ev = e;
            n = 1;
        } else {
            cairn_kvcache_wait(k.c, 100);
        }
        if (++rounds > 100000)
            _exit(3);
    }
    if (ev.resident_pages != WB_PAGES)
        _exit(4);
    cairn_kvcache_stats st;
    cairn_kvcache_get_stats(k.c, &st);
    if (st.behind_pages != WB_PAGES || st.behind_queued_pages != WB_PAGES ||
        st.tier[CAIRN_TIER_DISK].pages != WB_PAGES)
        _exit(5);
    char ok = 'W';
    if (write(fd, &ok, 1) != 1)
        _exit(6);
    for (;;)
        pause();
}

static void test_write_behind_sigkill(void **state)
{
    (void)state;
    char dir[512];
    test_make_dir(dir, sizeof dir, "behind");
    run_then_sigkill(dir, write_behind_child, 'W');

    cache k;
    cache_open(&k, dir, 64, 8);
    cairn_kvcache_stats st;
    cairn_kvcache_get_stats(k.c, &st);
    assert_int_equal(st.tier[CAIRN_TIER_DISK].pages, WB_PAGES); /* not the one-off's */
    assert_int_equal(cairn_kvcache_override_rates(k.c, &fast_disk), CAIRN_OK);
    int32_t tok[WB_PAGES * PS + 1], once[4 * PS + 1];
    seq_tokens(tok, WB_PAGES * PS + 1, 8);
    seq_tokens(once, 4 * PS + 1, 9);
    assert_int_equal(cairn_kvcache_fetch(k.c, 0, tok, WB_PAGES * PS, SIZE_MAX, 1), CAIRN_OK);
    cairn_kvcache_event ev = wait_event(&k);
    assert_int_equal(ev.resident_pages, WB_PAGES);
    assert_int_equal(ev.from_tier[CAIRN_TIER_DISK], WB_PAGES);
    check_resident(&k, ev.node, tok); /* byte for byte, device and host pages alike */
    assert_int_equal(cairn_radix_unlock(cairn_kvcache_tree(k.c), ev.node), CAIRN_OK);
    assert_int_equal(cairn_kvcache_fetch(k.c, 0, once, 4 * PS, SIZE_MAX, 2), CAIRN_OK);
    ev = wait_event(&k);
    assert_int_equal(ev.resident_pages, 0);
    cache_close(&k);
    test_remove_dir(dir);
}

/* persist: durable answers, idempotent, and a page that exists nowhere is
 * reported (and fetch then drops it). */
static void test_persist_lost(void **state)
{
    (void)state;
    char dir[512];
    test_make_dir(dir, sizeof dir, "persistlost");
    cache k;
    cache_open(&k, dir, 8, 8);
    int32_t tok[4 * PS];
    seq_tokens(tok, 4 * PS, 6);
    cairn_radix_node *leaf = put_pages(&k, tok, 4);
    assert_int_equal(cairn_kvcache_persist(k.c, leaf, 1), CAIRN_OK);
    cairn_kvcache_event ev = wait_event(&k);
    assert_int_equal(ev.kind, CAIRN_KVCACHE_EV_PERSIST);
    assert_int_equal(ev.status, CAIRN_OK);
    cairn_disk_stats ds;
    cairn_disk_get_stats(cairn_kvcache_disk(k.c), &ds);
    assert_int_equal(ds.pages, 4);
    assert_true(ds.syncs >= 1);
    /* Again: nothing new to write, still a durable answer. */
    assert_int_equal(cairn_kvcache_persist(k.c, leaf, 2), CAIRN_OK);
    ev = wait_event(&k);
    assert_int_equal(ev.status, CAIRN_OK);
    cairn_kvcache_stats st;
    cairn_kvcache_get_stats(k.c, &st);
    assert_int_equal(st.written_pages, 4);
    assert_int_equal(st.persists, 2);
    assert_int_equal(cairn_kvcache_persist(k.c, NULL, 2), CAIRN_EINVAL);
    cache_close(&k);
    test_remove_dir(dir);

    /* A page that exists nowhere any more: down to disk, deleted there (a
     * read expecting other tokens), found lost by a promotion. */
    test_make_dir(dir, sizeof dir, "persistlost2");
    cache_open(&k, dir, 8, 8);
    cairn_radix *t = cairn_kvcache_tree(k.c);
    leaf = put_pages(&k, tok, 4);
    size_t moved;
    assert_int_equal(cairn_kvcache_evict(k.c, CAIRN_TIER_DEVICE, 4, &moved), CAIRN_OK);
    assert_int_equal(cairn_kvcache_evict(k.c, CAIRN_TIER_HOST, 4, &moved), CAIRN_OK);
    assert_int_equal(cairn_radix_node_tier(leaf), CAIRN_TIER_DISK);
    cairn_radix_page *path[4];
    size_t np;
    cairn_radix_path(leaf, path, 4, &np);
    int32_t wrong[PS] = {0};
    uint8_t *buf = malloc(k.L.page_bytes);
    assert_int_equal(cairn_disk_read(cairn_kvcache_disk(k.c), path[2]->hash, wrong, buf, 0),
                     CAIRN_OK);
    assert_int_equal(cairn_radix_lock(t, leaf), CAIRN_OK);
    assert_int_equal(cairn_kvcache_promote(k.c, leaf, 3), CAIRN_OK);
    ev = wait_event(&k);
    assert_int_equal(ev.kind, CAIRN_KVCACHE_EV_PROMOTE);
    assert_int_equal(ev.status, CAIRN_ENOTFOUND);
    assert_int_equal(ev.resident_pages, 2);
    assert_int_equal(cairn_radix_unlock(t, leaf), CAIRN_OK);
    /* (the engine would forget the tail now; it did not) */
    assert_int_equal(cairn_kvcache_persist(k.c, leaf, 4), CAIRN_OK);
    ev = wait_event(&k);
    assert_int_equal(ev.kind, CAIRN_KVCACHE_EV_PERSIST);
    assert_int_equal(ev.status, CAIRN_ENOTFOUND);
    /* fetch drops the lost page and what hangs below it, and answers with
     * what is left. */
    assert_int_equal(cairn_kvcache_override_rates(k.c, &fast_disk), CAIRN_OK);
    assert_int_equal(cairn_kvcache_fetch(k.c, 0, tok, 4 * PS, SIZE_MAX, 5), CAIRN_OK);
    ev = wait_event(&k);
    assert_int_equal(ev.kind, CAIRN_KVCACHE_EV_FETCH);
    assert_int_equal(ev.status, CAIRN_OK);
    assert_int_equal(ev.resident_pages, 2);
    assert_int_equal(ev.lost_pages, 1);
    check_resident(&k, ev.node, tok);
    assert_int_equal(cairn_radix_unlock(t, ev.node), CAIRN_OK);
    cairn_radix_match_result m;
    assert_int_equal(cairn_radix_match(t, 0, tok, 4 * PS, &m), CAIRN_OK);
    assert_int_equal(m.n_pages, 2);
    check_accounting(&k);
    free(buf);
    cache_close(&k);
    test_remove_dir(dir);
}

/* ---- namespaces ------------------------------------------------------------- */

static void test_namespace_isolation(void **state)
{
    (void)state;
    cairn_kv_layout L = test_layout(PS), L_f16 = L, L_ps8 = test_layout(8);
    L_f16.dtype = CAIRN_TYPE_F16;
    L_f16.row_bytes = 16;
    L_f16.page_bytes = 2 * PS * L_f16.row_bytes;
    cairn_page_hash base = ns_of("model-A", &L);
    cairn_page_hash other_model = ns_of("model-B", &L);
    cairn_page_hash other_dtype = ns_of("model-A", &L_f16);
    cairn_page_hash other_ps = ns_of("model-A", &L_ps8);
    assert_false(cairn_page_hash_equal(base, other_model));
    assert_false(cairn_page_hash_equal(base, other_dtype));
    assert_false(cairn_page_hash_equal(base, other_ps));
    assert_false(cairn_page_hash_equal(other_dtype, other_ps));
    /* Only the dtype differs (same page bytes): still another namespace. */
    cairn_kv_layout L_bf16 = L;
    L_bf16.dtype = CAIRN_TYPE_BF16;
    assert_false(cairn_page_hash_equal(base, ns_of("model-A", &L_bf16)));
    assert_true(cairn_page_hash_equal(base, ns_of("model-A", &L)));
    /* Only the rotation differs: another namespace too. */
    cairn_kv_layout L_rot = L;
    L_rot.rotation = 32;
    assert_false(cairn_page_hash_equal(base, ns_of("model-A", &L_rot)));

    char dir[512];
    test_make_dir(dir, sizeof dir, "namespace");
    int32_t tok[6 * PS];
    seq_tokens(tok, 6 * PS, 7);
    cache k;
    cache_open_ns(&k, dir, 16, 8, L, base);
    put_pages(&k, tok, 6);
    assert_int_equal(cairn_kvcache_flush(k.c), CAIRN_OK);
    cache_close(&k);

    struct {
        cairn_kv_layout L;
        cairn_page_hash ns;
    } others[4] = {{L, other_model}, {L_f16, other_dtype}, {L_ps8, other_ps}, {L_bf16, {0, 0}}};
    others[3].ns = ns_of("model-A", &L_bf16);
    for (int i = 0; i < 4; i++) {
        cache_open_ns(&k, dir, 16, 8, others[i].L, others[i].ns);
        assert_int_equal(cairn_kvcache_override_rates(k.c, &fast_disk), CAIRN_OK);
        size_t ps = (size_t)others[i].L.page_size;
        size_t n = 6 * PS / ps * ps;
        assert_int_equal(cairn_kvcache_fetch(k.c, 0, tok, n, SIZE_MAX, 1), CAIRN_OK);
        cairn_kvcache_event ev = wait_event(&k);
        assert_int_equal(ev.resident_pages, 0);
        /* Even asked for the old namespace's very key with the right tokens,
         * the store answers a miss and writes nothing into the buffer. */
        cairn_page_hash key = cairn_page_hash_next(base, tok, PS);
        size_t pb = others[i].L.page_bytes;
        uint8_t *buf = malloc(pb);
        memset(buf, 0x5C, pb);
        assert_int_equal(cairn_disk_read(cairn_kvcache_disk(k.c), key, tok, buf, 0), CAIRN_OK);
        cairn_disk_completion dc;
        int got = 0;
        while (!got) {
            cairn_disk_wait(cairn_kvcache_disk(k.c), 1000);
            cairn_disk_poll(cairn_kvcache_disk(k.c), &dc, 1, &got);
        }
        assert_int_equal(dc.status, CAIRN_ENOTFOUND);
        for (size_t b = 0; b < pb; b++)
            assert_int_equal(buf[b], 0x5C);
        free(buf);
        cache_close(&k);
    }
    test_remove_dir(dir);
}


/* ---- random admissions against a model ------------------------------------- *
 *
 * The engine's loop in miniature, with random evictions (including drops of
 * disk-tier nodes from the tree, whose LMDB copies stay), flushes and two
 * fetches in flight at once. The model: the set of page keys ever queued
 * for disk (every on_disk page seen in the tree) — LMDB never loses one here
 * (no corruption, a map far larger than the data). For a fetch of tokens
 * whose in-memory match is m pages, the answer must be m plus the run of
 * consecutive pages after it whose keys are in that set (when the status is
 * CAIRN_OK; shorter only with CAIRN_EFULL), and every resident page must hold
 * its own prefix's payload.
 */

#define RP_DEV 48
#define RP_HOST 12
#define RP_MAXP 8

static cairn_page_hash *rp_keys;
static size_t rp_n_keys, rp_cap_keys;
static uint64_t rp_rng;

static uint64_t rp_rnd(void)
{
    rp_rng ^= rp_rng << 13;
    rp_rng ^= rp_rng >> 7;
    rp_rng ^= rp_rng << 17;
    return rp_rng;
}

static bool rp_has(cairn_page_hash h)
{
    if (!rp_cap_keys)
        return false;
    size_t j = h.lo & (rp_cap_keys - 1);
    while (rp_keys[j].lo || rp_keys[j].hi) {
        if (cairn_page_hash_equal(rp_keys[j], h))
            return true;
        j = (j + 1) & (rp_cap_keys - 1);
    }
    return false;
}

static void rp_add(cairn_page_hash h)
{
    if (rp_has(h))
        return;
    if (2 * (rp_n_keys + 1) > rp_cap_keys) {
        size_t cap = rp_cap_keys ? 2 * rp_cap_keys : 1024;
        cairn_page_hash *nk = calloc(cap, sizeof *nk);
        assert_non_null(nk);
        for (size_t i = 0; i < rp_cap_keys; i++) {
            if (!rp_keys[i].lo && !rp_keys[i].hi)
                continue;
            size_t j = rp_keys[i].lo & (cap - 1);
            while (nk[j].lo || nk[j].hi)
                j = (j + 1) & (cap - 1);
            nk[j] = rp_keys[i];
        }
        free(rp_keys);
        rp_keys = nk;
        rp_cap_keys = cap;
    }
    size_t j = h.lo & (rp_cap_keys - 1);
    while (rp_keys[j].lo || rp_keys[j].hi)
        j = (j + 1) & (rp_cap_keys - 1);
    rp_keys[j] = h;
    rp_n_keys++;
}

static int rp_collect(cairn_radix_node *n, void *user)
{
    (void)user;
    cairn_radix_page *pg;
    size_t np = cairn_radix_node_pages(n, &pg);
    for (size_t i = 0; i < np; i++)
        if (pg[i].on_disk)
            rp_add(pg[i].hash);
    return 0;
}

/* A query: a random earlier sequence's prefix, then random tokens (a small
 * alphabet, so prefixes recur). */
static void rp_query(int32_t (*seqs)[RP_MAXP * PS], size_t n_seqs, int32_t *tok, size_t *np)
{
    size_t n = 1 + rp_rnd() % RP_MAXP, keep = 0;
    if (n_seqs && rp_rnd() % 4 != 0) {
        keep = rp_rnd() % (n + 1);
        memcpy(tok, seqs[rp_rnd() % n_seqs], keep * PS * sizeof(int32_t));
    }
    for (size_t i = keep * PS; i < n * PS; i++)
        tok[i] = (int32_t)(rp_rnd() % 2);
    *np = n;
}

/* What the answer must be: the in-memory match plus the run of pages
 * after it that LMDB holds. */
static size_t rp_expect(cache *k, const int32_t *tok, size_t np)
{
    cairn_radix_match_result m;
    assert_int_equal(cairn_radix_match(cairn_kvcache_tree(k->c), 0, tok, np * PS, &m), CAIRN_OK);
    size_t r = m.n_pages;
    cairn_page_hash h = m.last_hash;
    while (r < np) {
        h = cairn_page_hash_next(h, tok + r * PS, PS);
        if (!rp_has(h))
            break;
        r++;
    }
    return r;
}

static void rp_check_answer(cache *k, const cairn_kvcache_event *ev, const int32_t *tok,
                            size_t expect)
{
    assert_int_equal(ev->kind, CAIRN_KVCACHE_EV_FETCH);
    if (ev->status == CAIRN_OK)
        assert_int_equal(ev->resident_pages, expect);
    else
        assert_int_equal(ev->status, CAIRN_EFULL);
    assert_true(ev->resident_pages <= expect);
    assert_int_equal(cairn_radix_node_depth(ev->node), ev->resident_pages);
    assert_int_equal(ev->from_tier[0] + ev->from_tier[1] + ev->from_tier[2], ev->resident_pages);
    assert_int_equal(ev->lost_pages, 0);
    check_resident(k, ev->node, tok);
}

/* The engine: fetch, compute the rest, insert, release. */
static void rp_admit(cache *k, int32_t (*seqs)[RP_MAXP * PS], size_t *n_seqs, uint64_t *cookie)
{
    int32_t tok[2][RP_MAXP * PS];
    size_t np[2], expect[2];
    int n_req = rp_rnd() % 4 == 0 ? 2 : 1;
    cairn_kvcache_event ev[2];
    for (int q = 0; q < n_req; q++) {
        rp_query(seqs, *n_seqs, tok[q], &np[q]);
        expect[q] = rp_expect(k, tok[q], np[q]);
        assert_int_equal(cairn_kvcache_fetch(k->c, 0, tok[q], np[q] * PS, SIZE_MAX, ++*cookie + 100 * q),
                         CAIRN_OK);
    }
    /* Pressure while the reads are in flight. */
    if (rp_rnd() % 2)
        cairn_kvcache_evict(k->c, (int)(rp_rnd() % 2), 1 + rp_rnd() % 4, NULL);
    for (int got = 0; got < n_req; got++) {
        cairn_kvcache_event e = wait_event(k);
        int q = n_req == 2 && e.cookie == *cookie + 100 ? 1 : 0;
        ev[q] = e;
    }
    for (int q = 0; q < n_req; q++) {
        /* With two in flight, the second's expectation may have grown by
         * what the first inserted; it can only have grown. */
        size_t want = expect[q];
        if (n_req == 2) {
            size_t again = rp_expect(k, tok[q], np[q]);
            if (again > want)
                want = again;
            if (ev[q].status == CAIRN_OK)
                assert_true(ev[q].resident_pages >= expect[q] &&
                            ev[q].resident_pages <= want);
            assert_true(ev[q].resident_pages <= want);
            check_resident(k, ev[q].node, tok[q]);
        } else {
            rp_check_answer(k, &ev[q], tok[q], want);
        }
    }
    for (int q = 0; q < n_req; q++) {
        /* Compute the rest and hand it to the tree. */
        size_t have = ev[q].resident_pages;
        int32_t ids[RP_MAXP];
        if (cairn_kvcache_alloc(k->c, (int32_t)(np[q] - have), ids + have) == CAIRN_OK) {
            uint8_t *base = cairn_page_pool_base(cairn_kvcache_device_pool(k->c));
            for (size_t i = 0; i < have; i++)
                ids[i] = -1;
            for (size_t i = have; i < np[q]; i++)
                test_payload(tok[q], (i + 1) * PS, base + (size_t)ids[i] * k->L.page_bytes,
                             k->L.page_bytes);
            size_t cached;
            cairn_radix_node *leaf;
            assert_int_equal(cairn_radix_insert(cairn_kvcache_tree(k->c), 0, tok[q], np[q], ids,
                                                &cached, &leaf),
                             CAIRN_OK);
            if (cached > have)
                cairn_page_pool_release(cairn_kvcache_device_pool(k->c), (int32_t)(cached - have),
                                        ids + have);
            if (*n_seqs < 512)
                memcpy(seqs[(*n_seqs)++], tok[q], sizeof tok[q]);
        }
        assert_int_equal(cairn_radix_unlock(cairn_kvcache_tree(k->c), ev[q].node), CAIRN_OK);
    }
}

static void rp_run(uint64_t seed, int steps)
{
    rp_rng = seed;
    char dir[512];
    test_make_dir(dir, sizeof dir, "fetchprop");
    cache k;
    cache_open(&k, dir, RP_DEV, RP_HOST);
    assert_int_equal(cairn_kvcache_override_rates(k.c, &fast_disk), CAIRN_OK);
    static int32_t seqs[512][RP_MAXP * PS];
    size_t n_seqs = 0;
    uint64_t cookie = 0;
    for (int step = 0; step < steps; step++) {
        unsigned op = (unsigned)(rp_rnd() % 100);
        if (op < 60) {
            rp_admit(&k, seqs, &n_seqs, &cookie);
        } else if (op < 95) {
            size_t moved;
            cairn_kvcache_evict(k.c, (int)(rp_rnd() % 3), 1 + rp_rnd() % 6, &moved);
        } else {
            assert_int_equal(cairn_kvcache_flush(k.c), CAIRN_OK);
        }
        assert_int_equal(cairn_radix_visit(cairn_kvcache_tree(k.c), rp_collect, NULL), 0);
        check_accounting(&k);
        cairn_radix_stats rs;
        cairn_radix_get_stats(cairn_kvcache_tree(k.c), &rs);
        assert_int_equal(rs.locked_nodes, 0);
        if (step == steps / 2) {
            /* A restart in the middle: flush, reopen empty. */
            assert_int_equal(cairn_kvcache_flush(k.c), CAIRN_OK);
            cache_close(&k);
            cache_open(&k, dir, RP_DEV, RP_HOST);
            assert_int_equal(cairn_kvcache_override_rates(k.c, &fast_disk), CAIRN_OK);
        }
    }
    cairn_kvcache_stats st;
    cairn_kvcache_get_stats(k.c, &st);
    cairn_disk_stats ds;
    cairn_disk_get_stats(cairn_kvcache_disk(k.c), &ds);
    print_message("fetches %zu, disk hits %llu tokens, host hits %llu, device hits %llu, "
                  "disk pages %llu\n",
                  st.fetches, (unsigned long long)st.tier[2].hit_tokens,
                  (unsigned long long)st.tier[1].hit_tokens,
                  (unsigned long long)st.tier[0].hit_tokens, (unsigned long long)ds.pages);
    assert_true(st.tier[CAIRN_TIER_DISK].hit_tokens > 0);
    assert_true(st.tier[CAIRN_TIER_HOST].hit_tokens > 0);
    assert_int_equal(ds.corrupt, 0);
    assert_int_equal(ds.write_failures, 0);
    assert_int_equal(ds.evicted, 0);
    cache_close(&k);
    test_remove_dir(dir);
    free(rp_keys);
    rp_keys = NULL;
    rp_n_keys = rp_cap_keys = 0;
}

static void test_fetch_random_1(void **state)
{
    (void)state;
    rp_run(0x9e3779b97f4a7c15ull, 1500);
}

static void test_fetch_random_2(void **state)
{
    (void)state;
    rp_run(0xd1b54a32d192ed03ull, 1500);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fetch_memory_tiers),
        cmocka_unit_test(test_fetch_after_restart),
        cmocka_unit_test(test_fetch_partial_after_restart),
        cmocka_unit_test(test_tail_after_restart),
        cmocka_unit_test(test_fetch_concurrent),
        cmocka_unit_test(test_cost_model),
        cmocka_unit_test(test_records),
        cmocka_unit_test(test_durable_sigkill),
        cmocka_unit_test(test_write_behind_sigkill),
        cmocka_unit_test(test_persist_lost),
        cmocka_unit_test(test_namespace_isolation),
        cmocka_unit_test(test_fetch_random_1),
        cmocka_unit_test(test_fetch_random_2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
