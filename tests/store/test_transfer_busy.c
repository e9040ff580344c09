/*
 * tests/store/test_transfer_busy.c — the store when a page copy is still
 * running at the poll right after it starts (store/transfer.c), on a real
 * compute backend.
 *
 * A device answers the store's non-blocking fence poll with "not yet"
 * almost every time: the poll comes microseconds after an eviction's copy
 * was queued. The backend here is the CPU backend's table plus a transfer
 * slot and a fence_wait that says CAIRN_EBUSY to the first non-blocking
 * poll (a fake in the manner of a device's copy queue). After that busy
 * poll the evicted page must stay draining (not handed out while "in
 * flight"), ops on the same backend must go on working and give the CPU's
 * results, a later allocation must take the page back, and the page's
 * bytes must be in its host slot.
 *
 * What a busy poll must not do on CUDA — leave the runtime's last error
 * behind, so that the next kernel is reported failed (review 2026-12-05,
 * finding 1) — only a GPU can show: tests/gpu/test_gpu_transfer.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "store/tiers.h"
#include "tests/support/support.h"

#define PS 16

static cairn_backend *cpu;
static cairn_backend_iface busy_iface;
static cairn_backend busy; /* the CPU's table and context, plus the two slots */
static uint64_t next_fence;
static int busy_left, busy_polls;

static int bt_transfer(cairn_backend *be, void *dst, const void *src, size_t bytes, int to_host,
                       uint64_t *fence)
{
    (void)be;
    const int rc = to_host ? cpu->iface->download(cpu, dst, src, bytes)
                           : cpu->iface->upload(cpu, dst, src, bytes);
    if (rc != CAIRN_OK)
        return rc;
    *fence = ++next_fence;
    return CAIRN_OK;
}

static int bt_fence_wait(cairn_backend *be, uint64_t fence, int block)
{
    (void)be;
    if (fence > next_fence)
        return CAIRN_EINVAL;
    if (!block && busy_left > 0) {
        busy_left--;
        busy_polls++;
        return CAIRN_EBUSY;
    }
    return CAIRN_OK;
}

/* K and V of `T` random tokens into `slots`, and the attention of one
 * query over them, on backend `be`: the attention output [n_head * hd]. */
static float *store_and_attend(cairn_backend *be, void *pool, const cairn_kv_layout *L,
                               const float *k, const float *v, const float *q, const int32_t *slots,
                               int T, const int32_t *pages)
{
    const size_t width = (size_t)L->n_kv_head * L->head_dim;
    const int n_head = 2 * L->n_kv_head;
    float *K = kt_dev(be, k, sizeof(float) * T * width);
    float *V = kt_dev(be, v, sizeof(float) * T * width);
    for (int layer = 0; layer < L->n_layer; layer++)
        assert_int_equal(be->iface->kv_store(be, pool, L, layer, K, V, slots, T), CAIRN_OK);
    float *Q = kt_dev(be, q, sizeof(float) * n_head * L->head_dim);
    float *O = kt_dev(be, NULL, sizeof(float) * n_head * L->head_dim);
    int32_t qi = T - 1;
    cairn_attn_seq seq = {.q_start = 0, .n_q = 1, .n_kv = T, .q_index = &qi, .pages = pages};
    cairn_attn_args a = {.out = O, .q = Q, .kv_pool = pool, .kv = L, .layer = L->n_layer - 1,
                         .n_head = n_head, .scale = 1.0f / sqrtf((float)L->head_dim),
                         .n_seqs = 1, .seqs = &seq};
    assert_int_equal(be->iface->attention(be, &a), CAIRN_OK);
    float *out = kt_host(be, O, sizeof(float) * n_head * L->head_dim);
    be->iface->free(be, K);
    be->iface->free(be, V);
    be->iface->free(be, Q);
    be->iface->free(be, O);
    return out;
}

static void test_busy_poll_keeps_page_draining(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("transfer busy");
    cairn_kv_layout L;
    assert_int_equal(cairn_kv_layout_init(&L, 2, 2, 32, PS, CAIRN_TYPE_F32), CAIRN_OK);
    cairn_page_namespace pns = {.model_fingerprint = "busy", .fingerprint_bytes = 4,
                                .layout = &L, .layout_version = CAIRN_KV_LAYOUT_VERSION};
    cairn_kvcache_config cfg = {.backend = &busy, .layout = L, .device_bytes = 4 * L.page_bytes,
                                .host_bytes = 4 * L.page_bytes};
    assert_int_equal(cairn_page_namespace_hash(&pns, &cfg.ns), CAIRN_OK);
    cairn_kvcache *c = NULL;
    char err[256] = "";
    assert_int_equal(cairn_kvcache_create(&cfg, &c, err, sizeof err), CAIRN_OK);
    void *pool = cairn_kvcache_kv_base(c);

    /* a cached prefix of one page, written by kv_store */
    const size_t width = (size_t)L.n_kv_head * L.head_dim;
    float *k = kt_xmalloc(sizeof(float) * PS * width), *v = kt_xmalloc(sizeof(float) * PS * width);
    float *q = kt_xmalloc(sizeof(float) * 2 * width);
    kt_fill(&r, k, PS * width, -1, 1);
    kt_fill(&r, v, PS * width, -1, 1);
    kt_fill(&r, q, 2 * width, -1, 1);
    int32_t page, slots[PS], tokens[PS];
    assert_int_equal(cairn_kvcache_alloc(c, 1, &page), CAIRN_OK);
    for (int i = 0; i < PS; i++) {
        slots[i] = page * PS + i;
        tokens[i] = 100 + 7 * i;
    }
    free(store_and_attend(&busy, pool, &L, k, v, q, slots, PS, &page));
    uint8_t *bytes = kt_host(&busy, (uint8_t *)pool + (size_t)page * L.page_bytes, L.page_bytes);
    size_t cached = 0;
    cairn_radix_node *leaf = NULL;
    assert_int_equal(cairn_radix_insert(cairn_kvcache_tree(c), 0, tokens, 1, &page, &cached,
                                        &leaf),
                     CAIRN_OK);

    /* evicted to host: the first poll says busy, so the page drains */
    busy_left = 1;
    size_t moved = 0;
    assert_int_equal(cairn_kvcache_evict(c, CAIRN_TIER_DEVICE, 1, &moved), CAIRN_OK);
    assert_int_equal(moved, 1);
    assert_int_equal(busy_polls, 1);
    cairn_kvcache_stats st;
    cairn_kvcache_get_stats(c, &st);
    assert_int_equal(st.tier[CAIRN_TIER_DEVICE].draining_pages, 1);
    assert_int_equal(cairn_page_pool_available(cairn_kvcache_device_pool(c)), 3);

    /* the next ops on the backend work, with the CPU's results, while the
     * page still drains (a page the pool had free: never the draining one) */
    cairn_page_pool *dev = cairn_kvcache_device_pool(c);
    int32_t other;
    assert_int_equal(cairn_page_pool_alloc(dev, 1, &other), CAIRN_OK);
    assert_int_not_equal(other, page);
    for (int i = 0; i < PS; i++)
        slots[i] = other * PS + i;
    float *got = store_and_attend(&busy, pool, &L, k, v, q, slots, PS, &other);
    void *pool_c = kt_dev(cpu, NULL, 4 * L.page_bytes);
    float *want = store_and_attend(cpu, pool_c, &L, k, v, q, slots, PS, &other);
    KT_SAME_BYTES(got, want, sizeof(float) * 2 * width, "attention after a busy fence poll");
    free(got);
    free(want);
    cpu->iface->free(cpu, pool_c);
    cairn_kvcache_get_stats(c, &st);
    assert_int_equal(st.tier[CAIRN_TIER_DEVICE].draining_pages, 1);
    cairn_page_pool_release(dev, 1, &other);

    /* the next allocation polls again (the copy has ended now) and takes
     * the page back: all four are there */
    int32_t four[4];
    assert_int_equal(cairn_kvcache_alloc(c, 4, four), CAIRN_OK);
    cairn_kvcache_get_stats(c, &st);
    assert_int_equal(st.tier[CAIRN_TIER_DEVICE].draining_pages, 0);
    cairn_page_pool_release(dev, 4, four);

    /* the page's bytes are in its host slot */
    cairn_radix_page *path[1];
    size_t np = 0;
    assert_int_equal(cairn_radix_path(leaf, path, 1, &np), CAIRN_OK);
    assert_int_equal(np, 1);
    assert_true(path[0]->device_page < 0);
    uint8_t *host = kt_xmalloc(L.page_bytes);
    assert_int_equal(cairn_kvcache_read_page(c, path[0], host), CAIRN_OK);
    KT_SAME_BYTES(host, bytes, L.page_bytes, "the evicted page in host RAM");
    free(host);
    free(bytes);
    free(k);
    free(v);
    free(q);
    cairn_kvcache_free(c);
}

int main(void)
{
    kt_init_seed("store_transfer_busy");
    cpu = kt_cpu(1);
    busy_iface = *cpu->iface;
    busy_iface.name = "cpu-busy-once";
    busy_iface.transfer = bt_transfer;
    busy_iface.fence_wait = bt_fence_wait;
    busy.iface = &busy_iface;
    busy.ctx = cpu->ctx;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_busy_poll_keeps_page_draining),
    };
    const int failed = cmocka_run_group_tests(tests, NULL, NULL);
    cairn_backend_destroy(cpu);
    return failed;
}
