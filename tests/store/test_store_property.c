/*
 * tests/store/test_store_property.c — random operations on the whole tiered
 * cache (tree + device pool + host pool + LMDB) against a naive model: a
 * plain list of the token sequences inserted.
 *
 * After every step:
 *   - the tree's own invariants hold (cairn_radix_check);
 *   - no locked node ever moved to a slower tier or left the tree;
 *   - accounting is exact: device pages named by the tree + free pages ==
 *     capacity, same for host slots, and no id is named twice;
 *   - periodically, once the disk has caught up: pages in LMDB == distinct
 *     page keys the cache ever queued for writing;
 *   - before every eviction, the node the store gives up is of the lowest
 *     eviction class among the tier's candidates (radix.h: one-off pages,
 *     then reused ones, then live sessions'), with live marks taken and
 *     released as sessions do and reuse marked by every fetch.
 * Every match is compared with the model's longest prefix, and every matched
 * page, once promoted, must hold exactly the payload inserted for its prefix.
 * Sequences also reach the tree while being computed (extend), partial last
 * pages are kept (tails), and every page partial() copies must be the page
 * of a sequence or tail that really shares the copied tokens.
 * A page watcher (store.h, "watching pages") keeps what a router would
 * believe from the events alone, as sets of (page, medium); after every step
 * the device and host sets equal the tree's device and host nodes exactly,
 * once the disk has caught up the disk set equals what LMDB holds, every
 * stored run's hashes follow from its parent and token ids, and
 * cairn_kvcache_announce_all — in the same process, and after a restart on
 * the same directory, from LMDB alone — rebuilds the disk set, parents
 * included, less only the pages whose parent is not on disk.
 * This file is built twice: as is, and with ASan + UBSan (leaks included).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

#include <cmocka.h>

#include "test_util.h"
#include "tests/support/support.h"

#define PS 4
#define MAXP 10
#define MAXSEQ 2000
#define MAXLOCKS 3
#define DEVICE_PAGES 64
#define HOST_PAGES 48
#define MAXTAILS 64


/* The sequence of operations depends only on the seed (nothing depends on
 * how fast the disk answers), so a failure reproduces. */
static uint64_t rng = 0x243f6a8885a308d3ull;
static uint64_t rnd(void)
{
    return support_xorshift64(&rng);
}

/* A set of page hashes with removal (open addressing, tombstones). */
typedef struct {
    cairn_page_hash *v;
    uint8_t *st; /* 0 empty, 1 used, 2 removed */
    size_t n, cap;
    size_t n_tomb;
    cairn_page_hash *parent; /* [cap] the page before (disk set only)   */
    uint8_t *root;           /* [cap] 1: first page of a sequence        */
} hset;

static size_t hset_find(const hset *s, cairn_page_hash h, bool *found)
{
    size_t j = h.lo & (s->cap - 1), tomb = SIZE_MAX;
    *found = false;
    while (s->st[j]) {
        if (s->st[j] == 1 && cairn_page_hash_equal(s->v[j], h)) {
            *found = true;
            return j;
        }
        if (s->st[j] == 2 && tomb == SIZE_MAX)
            tomb = j;
        j = (j + 1) & (s->cap - 1);
    }
    return tomb != SIZE_MAX ? tomb : j;
}

static bool hset_has(const hset *s, cairn_page_hash h)
{
    bool found = false;
    if (s->cap)
        hset_find(s, h, &found);
    return found;
}

static void hset_clear(hset *s)
{
    free(s->v);
    free(s->st);
    free(s->parent);
    free(s->root);
    *s = (hset){0};
}

static void hset_set_parent(hset *s, cairn_page_hash h, bool root, cairn_page_hash parent)
{
    bool found;
    size_t j = hset_find(s, h, &found);
    assert_true(found);
    s->root[j] = root;
    s->parent[j] = parent;
}

/* false when h was there already */
static bool hset_add(hset *s, cairn_page_hash h)
{
    if (4 * (s->n + s->n_tomb + 1) > 3 * s->cap) {
        hset old = *s;
        s->cap = 4 * (old.n + 1) > old.cap ? (old.cap ? 2 * old.cap : 256) : old.cap;
        s->n_tomb = 0;
        s->v = calloc(s->cap, sizeof *s->v);
        s->st = calloc(s->cap, 1);
        s->parent = calloc(s->cap, sizeof *s->parent);
        s->root = calloc(s->cap, 1);
        s->n = 0;
        assert_true(s->v && s->st && s->parent && s->root);
        for (size_t i = 0; i < old.cap; i++)
            if (old.st[i] == 1) {
                hset_add(s, old.v[i]);
                hset_set_parent(s, old.v[i], old.root[i], old.parent[i]);
            }
        free(old.v);
        free(old.st);
        free(old.parent);
        free(old.root);
    }
    bool found;
    size_t j = hset_find(s, h, &found);
    if (found)
        return false;
    if (s->st[j] == 2)
        s->n_tomb--;
    s->v[j] = h;
    s->st[j] = 1;
    s->n++;
    return true;
}

/* false when h was not there */
static bool hset_del(hset *s, cairn_page_hash h)
{
    bool found = false;
    size_t j = s->cap ? hset_find(s, h, &found) : 0;
    if (!found)
        return false;
    s->st[j] = 2;
    s->n--;
    s->n_tomb++;
    return true;
}

typedef struct {
    cairn_backend *be;
    cairn_kvcache *c;
    cairn_radix *t;
    cairn_kv_layout L;
    char dir[512];
    pm_model seqs; /* every sequence inserted (tests/support) */
    struct {
        cairn_radix_node *node;
        int tier_at_lock[MAXP]; /* per page of the path */
        size_t n_pages;
        bool pinned;
    } locks[MAXLOCKS];
    size_t n_locks;
    /* distinct page keys ever queued for the disk (open addressing) */
    cairn_page_hash *keys;
    size_t n_keys, cap_keys;
    uint8_t *seen_dev, *seen_host;
    uint64_t cookie;
    size_t n_promotions_checked, n_pages_checked;
    /* every tail ever kept (a ring): whole pages + 1..PS-1 tokens */
    struct {
        int32_t tok[(MAXP + 1) * PS];
        size_t n;
    } tails[MAXTAILS];
    size_t n_tails_kept;
    size_t n_partial_checked, n_extends;
    /* live marks, as sessions keep them */
    struct {
        int32_t tok[MAXP * PS];
        size_t n;
        cairn_kv_live live;
    } lives[8];
    size_t n_lives, n_order_checked;
    /* what the events say is where (the watcher; tier-2 events come from
     * the disk's I/O thread, hence the lock) */
    pthread_mutex_t ev_mu;
    hset announced[CAIRN_TIER_COUNT];
    cairn_page_hash seed; /* namespace 0's h_-1 */
    size_t n_runs_checked, n_cleared;
} world;

static void key_add(world *w, cairn_page_hash h)
{
    if (2 * (w->n_keys + 1) > w->cap_keys) {
        size_t cap = w->cap_keys ? 2 * w->cap_keys : 1024;
        cairn_page_hash *nk = calloc(cap, sizeof *nk);
        assert_non_null(nk);
        for (size_t i = 0; i < w->cap_keys; i++) {
            if (!w->keys[i].lo && !w->keys[i].hi)
                continue;
            size_t j = w->keys[i].lo & (cap - 1);
            while (nk[j].lo || nk[j].hi)
                j = (j + 1) & (cap - 1);
            nk[j] = w->keys[i];
        }
        free(w->keys);
        w->keys = nk;
        w->cap_keys = cap;
    }
    size_t j = h.lo & (w->cap_keys - 1);
    while (w->keys[j].lo || w->keys[j].hi) {
        if (cairn_page_hash_equal(w->keys[j], h))
            return;
        j = (j + 1) & (w->cap_keys - 1);
    }
    w->keys[j] = h;
    w->n_keys++;
}

/* ---- the page watcher: a router's view ----------------------------------- */

static void watch(const cairn_kv_page_event *e, void *user)
{
    world *w = user;
    pthread_mutex_lock(&w->ev_mu);
    if (e->kind == CAIRN_KV_PAGES_CLEARED) {
        for (int t = 0; t < CAIRN_TIER_COUNT; t++)
            hset_clear(&w->announced[t]);
        w->n_cleared++;
        pthread_mutex_unlock(&w->ev_mu);
        return;
    }
    assert_true(e->tier >= 0 && e->tier < CAIRN_TIER_COUNT);
    assert_int_equal(e->ns, 0);
    assert_true(e->n > 0);
    hset *set = &w->announced[e->tier];
    if (e->kind == CAIRN_KV_PAGES_STORED) {
        /* the run's hashes follow from its parent and its token ids */
        cairn_page_hash prev = e->has_parent ? e->parent : w->seed;
        for (size_t i = 0; i < e->n; i++) {
            cairn_page_hash h = cairn_page_hash_next(prev, e->tokens + i * PS, PS);
            assert_true(cairn_page_hash_equal(h, e->hashes[i]));
            prev = h;
            /* a memory tier is told once per stay; LMDB may be written again */
            bool fresh = hset_add(set, h);
            if (e->tier != CAIRN_TIER_DISK)
                assert_true(fresh);
            else
                hset_set_parent(set, h, i == 0 && !e->has_parent,
                                i == 0 ? e->parent : e->hashes[i - 1]);
        }
        w->n_runs_checked++;
    } else {
        for (size_t i = 0; i < e->n; i++)
            assert_true(hset_del(set, e->hashes[i]));
    }
    pthread_mutex_unlock(&w->ev_mu);
}

typedef struct {
    world *w;
    size_t n[CAIRN_TIER_COUNT];
} view_count;

static int view_node(cairn_radix_node *n, void *user)
{
    view_count *v = user;
    int tier = cairn_radix_node_tier(n);
    if (tier == CAIRN_TIER_DISK)
        return 0;
    cairn_radix_page *pg;
    size_t np = cairn_radix_node_pages(n, &pg);
    for (size_t i = 0; i < np; i++)
        assert_true(hset_has(&v->w->announced[tier], pg[i].hash));
    v->n[tier] += np;
    return 0;
}

/* Whether page h of the disk set s chains back to a sequence's first page
 * through pages all in s: what a restarted store can announce (a page whose
 * parent left LMDB cannot be found by a request either). */
static bool disk_reachable(const hset *s, cairn_page_hash h, int depth)
{
    for (; depth < 64; depth++) {
        bool found;
        size_t j = hset_find(s, h, &found);
        if (!found)
            return false;
        if (s->root[j])
            return true;
        h = s->parent[j];
    }
    return false;
}

/* After cairn_kvcache_announce_all: the disk set is exactly the pages of
 * `before` (the set the writes announced) that chain back to a root. */
static void check_rebuilt_disk(world *w, const hset *before)
{
    size_t want = 0;
    for (size_t i = 0; i < before->cap; i++) {
        if (before->st[i] != 1)
            continue;
        bool r = disk_reachable(before, before->v[i], 0);
        want += r;
        assert_int_equal(hset_has(&w->announced[CAIRN_TIER_DISK], before->v[i]), r);
    }
    assert_int_equal(w->announced[CAIRN_TIER_DISK].n, want);
}

static void hset_copy(hset *dst, const hset *src)
{
    *dst = (hset){0};
    for (size_t i = 0; i < src->cap; i++)
        if (src->st[i] == 1) {
            hset_add(dst, src->v[i]);
            hset_set_parent(dst, src->v[i], src->root[i], src->parent[i]);
        }
}

/* The device and host sets are exactly the tree's device and host pages. */
static void check_view(world *w)
{
    view_count v = {.w = w};
    pthread_mutex_lock(&w->ev_mu);
    assert_int_equal(cairn_radix_visit(w->t, view_node, &v), 0);
    assert_int_equal(w->announced[CAIRN_TIER_DEVICE].n, v.n[CAIRN_TIER_DEVICE]);
    assert_int_equal(w->announced[CAIRN_TIER_HOST].n, v.n[CAIRN_TIER_HOST]);
    pthread_mutex_unlock(&w->ev_mu);
}

/* ---- per-step checks ----------------------------------------------------- */

/* Tier of every page on the path root..node; returns the page count. */
static size_t path_tiers(cairn_radix_node *node, int *tiers)
{
    size_t depth = cairn_radix_node_depth(node), pos = depth;
    for (cairn_radix_node *x = node; cairn_radix_parent(x); x = cairn_radix_parent(x)) {
        size_t xn = cairn_radix_node_pages(x, NULL);
        for (size_t k = 0; k < xn; k++)
            tiers[pos - xn + k] = cairn_radix_node_tier(x);
        pos -= xn;
    }
    return depth;
}

typedef struct {
    world *w;
    size_t dev, host;
} acct;

static int count_node(cairn_radix_node *n, void *user)
{
    acct *a = user;
    cairn_radix_page *pg;
    size_t np = cairn_radix_node_pages(n, &pg);
    for (size_t i = 0; i < np; i++) {
        if (pg[i].device_page >= 0) {
            assert_true(pg[i].device_page < DEVICE_PAGES);
            assert_int_equal(a->w->seen_dev[pg[i].device_page], 0); /* named once */
            a->w->seen_dev[pg[i].device_page] = 1;
            a->dev++;
        }
        if (pg[i].host_slot >= 0) {
            assert_true(pg[i].host_slot < HOST_PAGES);
            assert_int_equal(a->w->seen_host[pg[i].host_slot], 0);
            a->w->seen_host[pg[i].host_slot] = 1;
            a->host++;
        }
        if (pg[i].on_disk)
            key_add(a->w, pg[i].hash);
    }
    return 0;
}

static void check_world(world *w)
{
    assert_int_equal(cairn_radix_check(w->t), CAIRN_OK);
    memset(w->seen_dev, 0, DEVICE_PAGES);
    memset(w->seen_host, 0, HOST_PAGES);
    acct a = {.w = w};
    assert_int_equal(cairn_radix_visit(w->t, count_node, &a), 0);
    cairn_kvcache_stats ks;
    cairn_kvcache_get_stats(w->c, &ks);
    /* draining: given back while a late copy still uses them */
    assert_int_equal(a.dev + ks.tail_pages + ks.tier[CAIRN_TIER_DEVICE].draining_pages +
                         (size_t)cairn_page_pool_available(cairn_kvcache_device_pool(w->c)),
                     DEVICE_PAGES);
    assert_int_equal(a.host + ks.tail_host_pages + ks.tier[CAIRN_TIER_HOST].draining_pages +
                         (size_t)cairn_host_pool_available(cairn_kvcache_host_pool(w->c)),
                     HOST_PAGES);
    /* Locked paths: still there, and no page on them is in a slower tier
     * than when the lock was taken. */
    for (size_t i = 0; i < w->n_locks; i++) {
        cairn_radix_node *x = w->locks[i].node;
        assert_true(cairn_radix_node_refs(x) > 0);
        int tiers[MAXP];
        size_t n = path_tiers(x, tiers);
        assert_int_equal(n, w->locks[i].n_pages);
        for (size_t k = 0; k < n; k++)
            assert_true(tiers[k] <= w->locks[i].tier_at_lock[k]);
    }
}

/* Wait until the disk has served every write the cache queued, then compare
 * the number of stored pages with the distinct keys queued. */
static void check_disk(world *w)
{
    cairn_disk *d = cairn_kvcache_disk(w->c);
    cairn_kvcache_stats ks;
    cairn_disk_stats ds;
    for (;;) {
        cairn_kvcache_event ev[8];
        int n;
        assert_int_equal(cairn_kvcache_poll(w->c, ev, 8, &n), CAIRN_OK);
        assert_int_equal(n, 0); /* no promotion is outstanding between steps */
        cairn_kvcache_get_stats(w->c, &ks);
        cairn_disk_get_stats(d, &ds);
        if (ds.writes + ds.write_failures == ks.written_pages)
            break;
        cairn_kvcache_wait(w->c, 20);
    }
    assert_int_equal(ds.write_failures, 0);
    assert_int_equal(ds.corrupt, 0);
    assert_int_equal(ds.evicted, 0);
    check_world(w); /* refresh the key set */
    assert_int_equal(ds.pages, w->n_keys);
    /* the disk set: every key queued, announced once it was committed */
    pthread_mutex_lock(&w->ev_mu);
    assert_int_equal(w->announced[CAIRN_TIER_DISK].n, w->n_keys);
    for (size_t i = 0; i < w->cap_keys; i++)
        if (w->keys[i].lo || w->keys[i].hi)
            assert_true(hset_has(&w->announced[CAIRN_TIER_DISK], w->keys[i]));
    pthread_mutex_unlock(&w->ev_mu);
}

/* ---- operations ------------------------------------------------------------ */

static void fill_and_upload(world *w, const int32_t *tok, size_t first, size_t np, const int32_t *ids)
{
    uint8_t buf[1024];
    assert_true(w->L.page_bytes <= sizeof buf);
    for (size_t i = first; i < np; i++) {
        test_payload(tok, (i + 1) * PS, buf, w->L.page_bytes);
        uint8_t *dst = (uint8_t *)cairn_page_pool_base(cairn_kvcache_device_pool(w->c)) +
                       (size_t)ids[i] * w->L.page_bytes;
        assert_int_equal(w->be->iface->upload(w->be, dst, buf, w->L.page_bytes), CAIRN_OK);
    }
}

static void op_insert(world *w)
{
    int32_t tok[MAXP * PS], ids[MAXP];
    size_t np;
    pm_query(&w->seqs, &rng, 5, tok, &np);
    size_t expect = pm_match(&w->seqs, tok, np), cached;
    cairn_radix_node *leaf;
    if (rnd() % 2) {
        /* The engine's way: match, lock, compute only the rest. */
        cairn_radix_match_result r;
        assert_int_equal(cairn_radix_match(w->t, 0, tok, np * PS, &r), CAIRN_OK);
        assert_int_equal(r.n_pages, expect);
        assert_int_equal(cairn_radix_lock(w->t, r.node), CAIRN_OK);
        int rc = cairn_kvcache_alloc(w->c, (int32_t)(np - r.n_pages), ids + r.n_pages);
        if (rc == CAIRN_EFULL) {
            assert_int_equal(cairn_radix_unlock(w->t, r.node), CAIRN_OK);
            return;
        }
        assert_int_equal(rc, CAIRN_OK);
        for (size_t i = 0; i < r.n_pages; i++)
            ids[i] = -1;
        fill_and_upload(w, tok, r.n_pages, np, ids);
        /* the commit inserts the rest and releases the hold (the lock) */
        assert_int_equal(cairn_kvcache_commit(w->c, 0, tok, np, ids, r.n_pages, np, r.node, &leaf),
                         CAIRN_OK);
    } else {
        /* Blind insert of fully computed pages: duplicates go back. */
        int rc = cairn_kvcache_alloc(w->c, (int32_t)np, ids);
        if (rc == CAIRN_EFULL)
            return;
        assert_int_equal(rc, CAIRN_OK);
        fill_and_upload(w, tok, 0, np, ids);
        assert_int_equal(cairn_kvcache_commit(w->c, 0, tok, np, ids, 0, np, NULL, &leaf), CAIRN_OK);
    }
    (void)cached;
    assert_int_equal(cairn_radix_node_depth(leaf), np);
    assert_true(pm_add(&w->seqs, tok, np)); /* MAXSEQ is above a run's inserts */
}

/* Match, lock, promote, wait for the event, and compare every page. */
static void op_match_promote(world *w)
{
    int32_t tok[MAXP * PS];
    size_t np;
    pm_query(&w->seqs, &rng, 5, tok, &np);
    cairn_radix_match_result r;
    assert_int_equal(cairn_radix_match(w->t, 0, tok, np * PS + rnd() % PS, &r), CAIRN_OK);
    assert_int_equal(r.n_pages, pm_match(&w->seqs, tok, np));
    if (r.n_pages == 0)
        return;
    assert_int_equal(cairn_radix_lock(w->t, r.node), CAIRN_OK);
    uint64_t cookie = ++w->cookie;
    assert_int_equal(cairn_kvcache_promote(w->c, r.node, cookie), CAIRN_OK);
    /* Other work goes on while the disk loads: the locked path must survive
     * it, and the pages being loaded must not be touched. */
    if (rnd() % 2)
        cairn_kvcache_evict(w->c, (int)(rnd() % 2), 1 + rnd() % 4, NULL);
    cairn_kvcache_event ev;
    int n = 0;
    for (;;) {
        assert_int_equal(cairn_kvcache_poll(w->c, &ev, 1, &n), CAIRN_OK);
        if (n)
            break;
        cairn_kvcache_wait(w->c, 20);
    }
    assert_int_equal(ev.cookie, cookie);
    assert_int_equal(ev.status, CAIRN_OK);
    assert_int_equal(ev.resident_pages, r.n_pages);
    cairn_radix_page *path[MAXP];
    size_t got;
    assert_int_equal(cairn_radix_path(r.node, path, MAXP, &got), CAIRN_OK);
    assert_int_equal(got, r.n_pages);
    uint8_t want[1024], have[1024];
    for (size_t i = 0; i < got; i++) {
        assert_true(path[i]->device_page >= 0);
        test_payload(tok, (i + 1) * PS, want, w->L.page_bytes);
        assert_int_equal(cairn_kvcache_read_page(w->c, path[i], have), CAIRN_OK);
        assert_memory_equal(want, have, w->L.page_bytes);
        w->n_pages_checked++;
    }
    w->n_promotions_checked++;
    assert_int_equal(cairn_radix_unlock(w->t, r.node), CAIRN_OK);
}

/* Two promotions in flight at once; the second match may split nodes whose
 * pages the first is still loading. */
static void op_two_promotions(world *w)
{
    int32_t tok[2][MAXP * PS];
    cairn_radix_match_result r[2];
    uint64_t cookies[2];
    bool done[2] = {false, false};
    for (int k = 0; k < 2; k++) {
        size_t np;
        pm_query(&w->seqs, &rng, 5, tok[k], &np);
        assert_int_equal(cairn_radix_match(w->t, 0, tok[k], np * PS, &r[k]), CAIRN_OK);
        assert_int_equal(r[k].n_pages, pm_match(&w->seqs, tok[k], np));
        assert_int_equal(cairn_radix_lock(w->t, r[k].node), CAIRN_OK);
        cookies[k] = ++w->cookie;
        assert_int_equal(cairn_kvcache_promote(w->c, r[k].node, cookies[k]), CAIRN_OK);
    }
    while (!done[0] || !done[1]) {
        cairn_kvcache_event ev;
        int n;
        assert_int_equal(cairn_kvcache_poll(w->c, &ev, 1, &n), CAIRN_OK);
        if (!n) {
            cairn_kvcache_wait(w->c, 20);
            continue;
        }
        int k = ev.cookie == cookies[0] ? 0 : 1;
        assert_true(ev.cookie == cookies[k] && !done[k]);
        assert_int_equal(ev.status, CAIRN_OK);
        done[k] = true;
    }
    uint8_t want[1024], have[1024];
    for (int k = 0; k < 2; k++) {
        cairn_radix_page *path[MAXP];
        size_t got;
        assert_int_equal(cairn_radix_path(r[k].node, path, MAXP, &got), CAIRN_OK);
        assert_int_equal(got, r[k].n_pages);
        for (size_t i = 0; i < got; i++) {
            assert_true(path[i]->device_page >= 0);
            test_payload(tok[k], (i + 1) * PS, want, w->L.page_bytes);
            assert_int_equal(cairn_kvcache_read_page(w->c, path[i], have), CAIRN_OK);
            assert_memory_equal(want, have, w->L.page_bytes);
            w->n_pages_checked++;
        }
        w->n_promotions_checked++;
    }
    for (int k = 0; k < 2; k++)
        assert_int_equal(cairn_radix_unlock(w->t, r[k].node), CAIRN_OK);
}

/* Match without promoting: pages resident in tier 0 or 1 must be right. */
static void op_match_peek(world *w)
{
    int32_t tok[MAXP * PS];
    size_t np;
    pm_query(&w->seqs, &rng, 5, tok, &np);
    cairn_radix_match_result r;
    assert_int_equal(cairn_radix_match(w->t, 0, tok, np * PS, &r), CAIRN_OK);
    assert_int_equal(r.n_pages, pm_match(&w->seqs, tok, np));
    cairn_radix_page *path[MAXP];
    size_t got;
    assert_int_equal(cairn_radix_path(r.node, path, MAXP, &got), CAIRN_OK);
    uint8_t want[1024], have[1024];
    for (size_t i = 0; i < got; i++) {
        if (cairn_kvcache_read_page(w->c, path[i], have) != CAIRN_OK)
            continue; /* on disk only */
        test_payload(tok, (i + 1) * PS, want, w->L.page_bytes);
        assert_memory_equal(want, have, w->L.page_bytes);
        w->n_pages_checked++;
    }
}

static void op_lock(world *w, bool pin)
{
    if (w->n_locks == MAXLOCKS)
        return;
    int32_t tok[MAXP * PS];
    size_t np;
    pm_query(&w->seqs, &rng, 5, tok, &np);
    cairn_radix_match_result r;
    assert_int_equal(cairn_radix_match(w->t, 0, tok, np * PS, &r), CAIRN_OK);
    if (r.n_pages == 0)
        return;
    if (pin)
        assert_int_equal(cairn_kvcache_pin(w->c, r.node), CAIRN_OK);
    else
        assert_int_equal(cairn_radix_lock(w->t, r.node), CAIRN_OK);
    w->locks[w->n_locks].node = r.node;
    w->locks[w->n_locks].n_pages = path_tiers(r.node, w->locks[w->n_locks].tier_at_lock);
    w->locks[w->n_locks].pinned = pin;
    w->n_locks++;
    if (pin) {
        /* Write-through: every resident page of the prefix is queued for
         * disk now. */
        cairn_radix_page *path[MAXP];
        size_t got;
        assert_int_equal(cairn_radix_path(r.node, path, MAXP, &got), CAIRN_OK);
        for (size_t i = 0; i < got; i++)
            if (path[i]->device_page >= 0 || path[i]->host_slot >= 0)
                assert_int_equal(path[i]->on_disk, 1);
    }
}

static void op_unlock(world *w)
{
    if (!w->n_locks)
        return;
    size_t i = rnd() % w->n_locks;
    if (w->locks[i].pinned)
        assert_int_equal(cairn_kvcache_unpin(w->c, w->locks[i].node), CAIRN_OK);
    else
        assert_int_equal(cairn_radix_unlock(w->t, w->locks[i].node), CAIRN_OK);
    w->locks[i] = w->locks[--w->n_locks];
}

/* Mark a sequence live as a session would, or release a mark. */
static void op_live(world *w)
{
    if (w->n_lives == 8 || (w->n_lives && rnd() % 2)) {
        size_t i = rnd() % w->n_lives;
        cairn_kvcache_unmark_live(w->c, 0, w->lives[i].tok, w->lives[i].n, &w->lives[i].live);
        assert_int_equal(w->lives[i].live.node_id, 0);
        w->lives[i] = w->lives[--w->n_lives];
        return;
    }
    size_t np;
    pm_query(&w->seqs, &rng, 5, w->lives[w->n_lives].tok, &np);
    w->lives[w->n_lives].n = np * PS;
    assert_int_equal(cairn_kvcache_mark_live(w->c, 0, w->lives[w->n_lives].tok, np * PS,
                                             &w->lives[w->n_lives].live),
                     CAIRN_OK);
    w->n_lives++;
}

/* The lowest eviction class among a tier's candidates, by brute force. */
typedef struct {
    int tier, lowest;
} lowest_ctx;

static int lowest_visit(cairn_radix_node *n, void *user)
{
    lowest_ctx *x = user;
    if (cairn_radix_node_refs(n) || cairn_radix_node_tier(n) != x->tier)
        return 0;
    for (size_t i = 0; i < cairn_radix_node_n_children(n); i++)
        if (cairn_radix_node_tier(cairn_radix_node_child(n, i)) <= x->tier)
            return 0;
    if (cairn_radix_node_class(n) < x->lowest)
        x->lowest = cairn_radix_node_class(n);
    return 0;
}

static void check_order(world *w, int tier)
{
    cairn_radix_node *v = cairn_radix_lru(w->t, tier);
    lowest_ctx x = {.tier = tier, .lowest = 99};
    cairn_radix_visit(w->t, lowest_visit, &x);
    if (!v) {
        assert_int_equal(x.lowest, 99);
        return;
    }
    assert_int_equal(cairn_radix_node_class(v), x.lowest);
    w->n_order_checked++;
}

/* Evict from a random tier. Dropping disk-tier leaves from the tree loses
 * those prefixes from the in-memory index, so the model forgets them too. */
static void op_evict(world *w)
{
    int tier = (int)(rnd() % 3);
    size_t want = 1 + rnd() % 8;
    check_order(w, tier);
    if (tier != CAIRN_TIER_DISK) {
        size_t moved;
        assert_int_equal(cairn_kvcache_evict(w->c, tier, want, &moved), CAIRN_OK);
        check_order(w, tier);
        return;
    }
    for (size_t e = 0; e < want; e++) {
        cairn_radix_node *v = cairn_radix_lru(w->t, CAIRN_TIER_DISK);
        if (!v)
            break;
        assert_int_equal(cairn_radix_node_refs(v), 0);
        size_t depth = cairn_radix_node_depth(v);
        size_t start = depth - cairn_radix_node_pages(v, NULL);
        int32_t vt[MAXP * PS];
        pm_node_tokens(v, depth, PS, vt);
        size_t moved;
        assert_int_equal(cairn_kvcache_evict(w->c, CAIRN_TIER_DISK, 1, &moved), CAIRN_OK);
        assert_int_equal(moved, depth - start);
        pm_forget(&w->seqs, vt, depth, start);
    }
}

/* The engine's way of computing while others may match: match, lock, compute
 * the rest in two steps, giving the tree each step's pages (extend), then
 * commit. */
static void op_extend(world *w)
{
    int32_t tok[MAXP * PS], ids[MAXP];
    size_t np;
    pm_query(&w->seqs, &rng, 5, tok, &np);
    cairn_radix_match_result r;
    assert_int_equal(cairn_radix_match(w->t, 0, tok, np * PS, &r), CAIRN_OK);
    assert_int_equal(r.n_pages, pm_match(&w->seqs, tok, np));
    if (r.n_pages == np)
        return;
    assert_int_equal(cairn_radix_lock(w->t, r.node), CAIRN_OK);
    cairn_kv_hold *hold = r.node;
    size_t held = r.n_pages;
    for (size_t i = 0; i < r.n_pages; i++)
        ids[i] = -1; /* the tree's: never read */
    int rc = cairn_kvcache_alloc(w->c, (int32_t)(np - held), ids + held);
    if (rc == CAIRN_EFULL) {
        assert_int_equal(cairn_radix_unlock(w->t, hold), CAIRN_OK);
        return;
    }
    assert_int_equal(rc, CAIRN_OK);
    fill_and_upload(w, tok, held, np, ids);
    size_t half = held + (np - held + 1) / 2;
    assert_int_equal(cairn_kvcache_extend(w->c, 0, tok, half, ids, &held, &hold), CAIRN_OK);
    assert_int_equal(held, half);
    assert_int_equal(cairn_radix_node_depth(hold), half);
    assert_true(cairn_radix_node_refs(hold) > 0);
    assert_int_equal(cairn_kvcache_extend(w->c, 0, tok, np, ids, &held, &hold), CAIRN_OK);
    assert_int_equal(held, np);
    cairn_kv_hold *leaf;
    assert_int_equal(cairn_kvcache_commit(w->c, 0, tok, np, ids, held, np, hold, &leaf), CAIRN_OK);
    assert_int_equal(cairn_radix_node_depth(leaf), np);
    assert_true(pm_add(&w->seqs, tok, np));
    w->n_extends++;
}

/* A finished sequence's partial last page kept as a tail. */
static void op_tail(world *w)
{
    int32_t tok[(MAXP + 1) * PS];
    size_t np;
    pm_query(&w->seqs, &rng, 5, tok, &np);
    size_t extra = 1 + rnd() % (PS - 1), n = np * PS + extra;
    for (size_t i = np * PS; i < n; i++)
        tok[i] = (int32_t)(rnd() % 3);
    int32_t id;
    if (cairn_kvcache_alloc(w->c, 1, &id) != CAIRN_OK)
        return;
    uint8_t buf[1024];
    test_payload(tok, n, buf, w->L.page_bytes);
    uint8_t *dst = (uint8_t *)cairn_page_pool_base(cairn_kvcache_device_pool(w->c)) +
                   (size_t)id * w->L.page_bytes;
    assert_int_equal(w->be->iface->upload(w->be, dst, buf, w->L.page_bytes), CAIRN_OK);
    assert_int_equal(cairn_kvcache_keep_tail(w->c, 0, tok, n, id), CAIRN_OK);
    size_t k = w->n_tails_kept++ % MAXTAILS;
    memcpy(w->tails[k].tok, tok, n * sizeof *tok);
    w->tails[k].n = n;
}

/* A match that ends inside a page: whatever partial() copies must be the
 * page of a sequence or tail that really shares those tokens. */
static void op_partial(world *w)
{
    int32_t tok[MAXP * PS];
    size_t np;
    pm_query(&w->seqs, &rng, 5, tok, &np);
    cairn_radix_match_result r;
    assert_int_equal(cairn_radix_match(w->t, 0, tok, np * PS, &r), CAIRN_OK);
    const size_t m = r.n_pages;
    if (m == np)
        return;
    assert_int_equal(cairn_radix_lock(w->t, r.node), CAIRN_OK);
    const int32_t *next = tok + m * PS;
    const size_t n_next = 1 + rnd() % PS;
    size_t k;
    /* the cache takes the page, only when it found something to copy */
    int32_t dst = -1;
    int rc = cairn_kvcache_partial(w->c, 0, r.node, m, next, n_next, &dst, &k, NULL);
    assert_true(rc == CAIRN_OK || rc == CAIRN_EFULL);
    assert_true(k < PS && k <= n_next);
    assert_int_equal(k > 0, dst >= 0);
    if (k > 0) {
        uint8_t got[1024], want[1024];
        assert_int_equal(w->be->iface->download(w->be, got,
                                                (uint8_t *)cairn_page_pool_base(
                                                    cairn_kvcache_device_pool(w->c)) +
                                                    (size_t)dst * w->L.page_bytes,
                                                w->L.page_bytes),
                         CAIRN_OK);
        bool found = false;
        /* a tree sequence continuing the match for at least k tokens */
        for (size_t i = 0; i < w->seqs.n && !found; i++) {
            const int32_t *st = w->seqs.tok + i * w->seqs.max_pages * PS;
            if (w->seqs.n_pages[i] <= m || memcmp(st, tok, (m * PS + k) * sizeof *tok) != 0)
                continue;
            test_payload(st, (m + 1) * PS, want, w->L.page_bytes);
            found = memcmp(want, got, w->L.page_bytes) == 0;
        }
        /* or a tail after exactly these m pages */
        for (size_t i = 0; i < MAXTAILS && i < w->n_tails_kept && !found; i++) {
            if (w->tails[i].n / PS != m || w->tails[i].n < m * PS + k ||
                memcmp(w->tails[i].tok, tok, (m * PS + k) * sizeof *tok) != 0)
                continue;
            test_payload(w->tails[i].tok, w->tails[i].n, want, w->L.page_bytes);
            found = memcmp(want, got, w->L.page_bytes) == 0;
        }
        assert_true(found);
        w->n_partial_checked++;
    }
    if (dst >= 0)
        cairn_kvcache_free_pages(w->c, 1, &dst);
    assert_int_equal(cairn_radix_unlock(w->t, r.node), CAIRN_OK);
}

static void run_world(uint64_t seed, int steps)
{
    rng = seed;
    world w = {0};
    w.L = test_layout(PS);
    w.be = test_backend_create();
    assert_non_null(w.be);
    test_make_dir(w.dir, sizeof w.dir, "prop");
    assert_true(w.dir[0]);
    cairn_kv_layout L = w.L;
    cairn_page_hash ns;
    cairn_page_namespace nsd = {.model_fingerprint = "test-model", .fingerprint_bytes = 10,
                                .layout = &L, .layout_version = CAIRN_KV_LAYOUT_VERSION};
    assert_int_equal(cairn_page_namespace_hash(&nsd, &ns), CAIRN_OK);
    cairn_kvcache_config cfg = {
        .backend = w.be, .layout = L,
        .device_bytes = DEVICE_PAGES * L.page_bytes,
        .host_bytes = HOST_PAGES * L.page_bytes,
        .disk_dir = w.dir, .disk_map_bytes = 64u << 20, .ns = ns,
    };
    char err[256] = "";
    assert_int_equal(cairn_kvcache_create(&cfg, &w.c, err, sizeof err), CAIRN_OK);
    w.t = cairn_kvcache_tree(w.c);
    pthread_mutex_init(&w.ev_mu, NULL);
    w.seed = cairn_radix_ns_seed(w.t, 0);
    assert_int_equal(cairn_kvcache_watch(w.c, watch, &w), CAIRN_OK);
    assert_int_equal(cairn_kvcache_announce_all(w.c), CAIRN_OK);
    pm_init(&w.seqs, PS, MAXP, MAXSEQ);
    w.seen_dev = calloc(DEVICE_PAGES, 1);
    w.seen_host = calloc(HOST_PAGES, 1);

    for (int step = 0; step < steps; step++) {
        unsigned op = (unsigned)(rnd() % 100);
        if (op < 22)
            op_insert(&w);
        else if (op < 26)
            op_extend(&w);
        else if (op < 28)
            op_tail(&w);
        else if (op < 30)
            op_partial(&w);
        else if (op < 45)
            op_match_promote(&w);
        else if (op < 50)
            op_two_promotions(&w);
        else if (op < 62)
            op_match_peek(&w);
        else if (op < 69)
            op_lock(&w, false);
        else if (op < 72)
            op_lock(&w, true);
        else if (op < 78)
            op_unlock(&w);
        else if (op < 81)
            op_live(&w);
        else
            op_evict(&w);
        check_world(&w);
        check_view(&w);
        if (step % 250 == 249)
            check_disk(&w);
    }
    while (w.n_locks)
        op_unlock(&w);
    while (w.n_lives) {
        w.n_lives--;
        cairn_kvcache_unmark_live(w.c, 0, w.lives[w.n_lives].tok, w.lives[w.n_lives].n,
                                  &w.lives[w.n_lives].live);
    }
    assert_true(w.n_order_checked > 100);
    check_disk(&w);

    /* The run must have exercised every tier. */
    cairn_kvcache_stats ks;
    cairn_kvcache_get_stats(w.c, &ks);
    cairn_disk_stats ds;
    cairn_disk_get_stats(cairn_kvcache_disk(w.c), &ds);
    print_message("promotions %zu (pages %zu), pages checked %zu, extends %zu, partial "
                  "copies checked %zu, evicted dev %zu host %zu disk %zu, disk pages %llu "
                  "reads %llu\n",
                  w.n_promotions_checked, ks.promoted_pages, w.n_pages_checked, w.n_extends,
                  w.n_partial_checked,
                  ks.evicted_pages[0], ks.evicted_pages[1], ks.evicted_pages[2],
                  (unsigned long long)ds.pages, (unsigned long long)ds.reads);
    assert_true(ks.evicted_pages[CAIRN_TIER_DEVICE] > 100);
    assert_true(ks.evicted_pages[CAIRN_TIER_HOST] > 100);
    assert_true(ks.evicted_pages[CAIRN_TIER_DISK] > 10);
    assert_true(ds.hits > 100);
    assert_int_equal(ds.misses, 0);
    assert_int_equal(ks.lost_pages, 0);
    assert_true(w.n_extends > 20);
    assert_true(w.n_partial_checked > 5);

    /* announce_all starts over and tells the same story, but for disk
     * pages whose parent is not on disk (nobody can use those) */
    hset written;
    hset_copy(&written, &w.announced[CAIRN_TIER_DISK]);
    assert_int_equal(cairn_kvcache_announce_all(w.c), CAIRN_OK);
    check_view(&w);
    check_rebuilt_disk(&w, &written);

    /* A restart on the same directory: the new cache holds nothing in
     * memory, and announces what LMDB kept, every chain rebuilt (watch()
     * checks each run against its parent). */
    cairn_kvcache_free(w.c);
    for (int t = 0; t < CAIRN_TIER_COUNT; t++)
        hset_clear(&w.announced[t]);
    assert_int_equal(cairn_kvcache_create(&cfg, &w.c, err, sizeof err), CAIRN_OK);
    w.t = cairn_kvcache_tree(w.c);
    size_t runs_before = w.n_runs_checked;
    assert_int_equal(cairn_kvcache_watch(w.c, watch, &w), CAIRN_OK);
    assert_int_equal(cairn_kvcache_announce_all(w.c), CAIRN_OK);
    assert_int_equal(w.announced[CAIRN_TIER_DEVICE].n, 0);
    assert_int_equal(w.announced[CAIRN_TIER_HOST].n, 0);
    check_rebuilt_disk(&w, &written);
    assert_true(w.announced[CAIRN_TIER_DISK].n > w.n_keys / 2);
    assert_true(w.n_runs_checked > runs_before);
    print_message("page events: %zu stored runs checked, %zu clears, %zu disk pages "
                  "re-announced after the restart\n",
                  w.n_runs_checked, w.n_cleared, w.announced[CAIRN_TIER_DISK].n);

    cairn_kvcache_free(w.c);
    for (int t = 0; t < CAIRN_TIER_COUNT; t++)
        hset_clear(&w.announced[t]);
    hset_clear(&written);
    pthread_mutex_destroy(&w.ev_mu);
    assert_int_equal(test_backend_counters_of(w.be)->live_allocs, 0);
    cairn_backend_destroy(w.be);
    test_remove_dir(w.dir);
    pm_free(&w.seqs);
    free(w.keys);
    free(w.seen_dev);
    free(w.seen_host);
}

/* Three independent worlds of 5000 steps each. */
static void test_property_seed1(void **state)
{
    (void)state;
    run_world(0x243f6a8885a308d3ull, 5000);
}
static void test_property_seed2(void **state)
{
    (void)state;
    run_world(0x13198a2e03707344ull, 5000);
}
static void test_property_seed3(void **state)
{
    (void)state;
    run_world(0xa4093822299f31d0ull, 5000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_property_seed1),
        cmocka_unit_test(test_property_seed2),
        cmocka_unit_test(test_property_seed3),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
