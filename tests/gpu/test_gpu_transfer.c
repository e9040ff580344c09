/*
 * tests/gpu/test_gpu_transfer.c — the transfer slots of the CUDA backend
 * (kernels/backend.h, "Transfers and fences"; kernels/cuda/cuda_transfer.cu)
 * against the rules the store relies on:
 *
 *   - a page copied to the host holds what ops issued before the copy wrote
 *     (kv_store, then transfer with no synchronize in between);
 *   - a page copied to the device is what ops issued after the copy read
 *     (transfer, then attention, with no synchronize in between), checked
 *     against the CPU backend's attention over the same bytes;
 *   - fences pass in order, polling never reports a later fence passed
 *     before an earlier one, and more copies than the fence ring holds
 *     (1,024) keep every fence meaningful;
 *   - host→device→host round trips of many pages are byte-exact;
 *   - page-locked memory comes zeroed; device memory figures are sane;
 *   - a kernel op issued right after a poll that found a copy still running
 *     succeeds (the poll leaves no error behind);
 *   - on a GPU the backend has the slots at all (else the fallbacks would
 *     pass all of the above).
 *
 * Random inputs are seeded (rerun with CAIRN_TEST_SEED). Skips, fails or
 * runs as gpu_probe.h says (77 only when there is no CUDA device at all). With CAIRN_GPU_TEST_BACKEND=cpu the
 * CPU backend stands in, which has none of these slots: the wrappers'
 * synchronous fallbacks are then what is checked, and the harness with them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_probe.h"
#include "tests/support/support.h"

static cairn_backend *cpu, *gpu;

static void test_host_memory(void **state)
{
    (void)state;
    const size_t bytes = (size_t)3 << 20;
    uint8_t *p = NULL;
    assert_int_equal(cairn_backend_host_alloc(gpu, bytes, (void **)&p), CAIRN_OK);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 64, 0);
    for (size_t i = 0; i < bytes; i += 4093)
        assert_int_equal(p[i], 0);
    memset(p, 0xa5, bytes);
    cairn_backend_host_free(gpu, p);
    cairn_backend_host_free(gpu, NULL); /* a no-op */

    size_t free_b = 0, total_b = 0;
    int rc = cairn_backend_memory_info(gpu, &free_b, &total_b);
    if (gpu->iface->memory_info) {
        assert_int_equal(rc, CAIRN_OK);
        assert_true(total_b > 0);
        assert_true(free_b <= total_b);
    } else {
        assert_int_equal(rc, CAIRN_EUNSUPPORTED);
    }
}

/* K/V rows written by kv_store, then copied out at once: the copy must see
 * them (the copy stream waits for the compute stream). */
static void test_page_to_host_after_ops(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("page_to_host");
    cairn_kv_layout L;
    assert_int_equal(cairn_kv_layout_init(&L, 4, 2, 64, 16, CAIRN_TYPE_F16), CAIRN_OK);
    const int n_pages = 8, T = 16 * n_pages;
    void *pool_g = kt_dev(gpu, NULL, L.page_bytes * n_pages);
    void *pool_c = kt_dev(cpu, NULL, L.page_bytes * n_pages);
    const size_t width = (size_t)L.n_kv_head * L.head_dim;
    float *k = kt_xmalloc(sizeof(float) * T * width), *v = kt_xmalloc(sizeof(float) * T * width);
    int32_t *slots = kt_xmalloc(sizeof(int32_t) * T);
    kt_permutation(&r, slots, T); /* scattered rows */
    float *k_g = kt_dev(gpu, NULL, sizeof(float) * T * width);
    float *v_g = kt_dev(gpu, NULL, sizeof(float) * T * width);
    float *k_c = kt_dev(cpu, NULL, sizeof(float) * T * width);
    float *v_c = kt_dev(cpu, NULL, sizeof(float) * T * width);
    uint8_t *host = NULL;
    assert_int_equal(cairn_backend_host_alloc(gpu, L.page_bytes * n_pages, (void **)&host),
                     CAIRN_OK);
    for (int layer = 0; layer < L.n_layer; layer++) {
        kt_fill(&r, k, (size_t)T * width, -2, 2);
        kt_fill(&r, v, (size_t)T * width, -2, 2);
        assert_int_equal(gpu->iface->upload(gpu, k_g, k, sizeof(float) * T * width), CAIRN_OK);
        assert_int_equal(gpu->iface->upload(gpu, v_g, v, sizeof(float) * T * width), CAIRN_OK);
        assert_int_equal(cpu->iface->upload(cpu, k_c, k, sizeof(float) * T * width), CAIRN_OK);
        assert_int_equal(cpu->iface->upload(cpu, v_c, v, sizeof(float) * T * width), CAIRN_OK);
        assert_int_equal(gpu->iface->kv_store(gpu, pool_g, &L, layer, k_g, v_g, slots, T),
                         CAIRN_OK);
        assert_int_equal(cpu->iface->kv_store(cpu, pool_c, &L, layer, k_c, v_c, slots, T),
                         CAIRN_OK);
    }
    /* every page out, in reverse order, no synchronize before */
    uint64_t fence[8];
    for (int p = n_pages - 1; p >= 0; p--)
        assert_int_equal(cairn_backend_transfer(gpu, host + (size_t)p * L.page_bytes,
                                                (uint8_t *)pool_g + (size_t)p * L.page_bytes,
                                                L.page_bytes, 1, &fence[p]),
                         CAIRN_OK);
    assert_int_equal(cairn_backend_fence_wait(gpu, fence[0], 1), CAIRN_OK);
    /* fence[0] was issued last: every page has arrived */
    for (int p = 0; p < n_pages; p++)
        assert_int_equal(cairn_backend_fence_wait(gpu, fence[p], 0), CAIRN_OK);
    uint8_t *want = kt_host(cpu, pool_c, L.page_bytes * n_pages);
    KT_SAME_BYTES(host, want, L.page_bytes * n_pages, "pages copied out after kv_store");
    free(want);
    cairn_backend_host_free(gpu, host);
    gpu->iface->free(gpu, pool_g);
    gpu->iface->free(gpu, k_g);
    gpu->iface->free(gpu, v_g);
    cpu->iface->free(cpu, pool_c);
    cpu->iface->free(cpu, k_c);
    cpu->iface->free(cpu, v_c);
    free(k);
    free(v);
    free(slots);
}

/* Pages copied in, then attention over them at once: the compute stream
 * must wait for the copies (not the host). */
static void test_page_to_device_before_ops(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("page_to_device");
    cairn_kv_layout L;
    assert_int_equal(cairn_kv_layout_init(&L, 2, 2, 64, 16, CAIRN_TYPE_F16), CAIRN_OK);
    const int n_pages = 6, n_kv = 16 * n_pages - 5, n_head = 4, hd = 64;
    /* random F16 K/V bytes (finite halves in about [-2, 2]) */
    uint8_t *bytes = NULL;
    assert_int_equal(cairn_backend_host_alloc(gpu, L.page_bytes * n_pages, (void **)&bytes),
                     CAIRN_OK);
    uint16_t *h16 = (uint16_t *)bytes;
    for (size_t i = 0; i < L.page_bytes * n_pages / 2; i++)
        h16[i] = cairn_fp32_to_fp16(kt_uniform(&r, -2, 2));
    void *pool_g = kt_dev(gpu, NULL, L.page_bytes * (n_pages + 2));
    void *pool_c = kt_dev(cpu, NULL, L.page_bytes * (n_pages + 2));
    int32_t pages[6];
    kt_permutation(&r, pages, n_pages); /* where each goes in the pool */
    uint64_t last = 0;
    for (int p = 0; p < n_pages; p++) {
        uint8_t *src = bytes + (size_t)p * L.page_bytes;
        assert_int_equal(cairn_backend_transfer(gpu, (uint8_t *)pool_g + (size_t)pages[p] * L.page_bytes,
                                                src, L.page_bytes, 0, &last),
                         CAIRN_OK);
        assert_int_equal(cpu->iface->upload(cpu, (uint8_t *)pool_c + (size_t)pages[p] * L.page_bytes,
                                            src, L.page_bytes),
                         CAIRN_OK);
    }
    const int n_q = 3;
    float *q = kt_xmalloc(sizeof(float) * n_q * n_head * hd);
    kt_fill(&r, q, (size_t)n_q * n_head * hd, -1, 1);
    float *q_g = kt_dev(gpu, q, sizeof(float) * n_q * n_head * hd);
    float *q_c = kt_dev(cpu, q, sizeof(float) * n_q * n_head * hd);
    float *o_g = kt_dev(gpu, NULL, sizeof(float) * n_q * n_head * hd);
    float *o_c = kt_dev(cpu, NULL, sizeof(float) * n_q * n_head * hd);
    int32_t q_index[3] = {n_kv - 3, n_kv - 2, n_kv - 1};
    cairn_attn_seq seq = {.q_start = 0, .n_q = n_q, .n_kv = n_kv, .q_index = q_index,
                          .pages = pages};
    for (int layer = 0; layer < L.n_layer; layer++) {
        cairn_attn_args a = {.out = o_g, .q = q_g, .kv_pool = pool_g, .kv = &L, .layer = layer,
                             .n_head = n_head, .scale = 1.0f / sqrtf((float)hd), .n_seqs = 1,
                             .seqs = &seq};
        assert_int_equal(gpu->iface->attention(gpu, &a), CAIRN_OK);
        a.out = o_c, a.q = q_c, a.kv_pool = pool_c;
        assert_int_equal(cpu->iface->attention(cpu, &a), CAIRN_OK);
        float *got = kt_host(gpu, o_g, sizeof(float) * n_q * n_head * hd);
        float *want = kt_host(cpu, o_c, sizeof(float) * n_q * n_head * hd);
        for (int i = 0; i < n_q * n_head * hd; i++)
            KT_CLOSE(got[i], want[i], 2e-5, "attention over pages copied in", i);
        free(got);
        free(want);
    }
    assert_int_equal(cairn_backend_fence_wait(gpu, last, 1), CAIRN_OK);
    cairn_backend_host_free(gpu, bytes);
    gpu->iface->free(gpu, pool_g);
    gpu->iface->free(gpu, q_g);
    gpu->iface->free(gpu, o_g);
    cpu->iface->free(cpu, pool_c);
    cpu->iface->free(cpu, q_c);
    cpu->iface->free(cpu, o_c);
    free(q);
}

/* More copies than the fence ring has events; fences are polled in order
 * while they run, each chunk must arrive intact, and a fence that passed
 * stays passed. */
static void test_fences_in_order(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("fences");
    const int n = 2600;
    const size_t chunk = 4096;
    uint8_t *src = kt_xmalloc((size_t)n * chunk);
    for (size_t i = 0; i < (size_t)n * chunk; i++)
        src[i] = (uint8_t)kt_next(&r);
    uint8_t *dev = kt_dev(gpu, src, (size_t)n * chunk);
    uint8_t *host = NULL;
    assert_int_equal(cairn_backend_host_alloc(gpu, (size_t)n * chunk, (void **)&host), CAIRN_OK);
    uint64_t *fence = kt_xmalloc(sizeof(uint64_t) * n);
    int polled = 0; /* fences [0, polled) seen passed */
    for (int i = 0; i < n; i++) {
        assert_int_equal(cairn_backend_transfer(gpu, host + (size_t)i * chunk,
                                                dev + (size_t)i * chunk, chunk, 1, &fence[i]),
                         CAIRN_OK);
        if (i > 0 && fence[i] != 0)
            assert_true(fence[i] > fence[i - 1]);
        /* poll the oldest outstanding one now and then */
        if (i % 7 == 0 && polled < i) {
            int rc = cairn_backend_fence_wait(gpu, fence[polled], 0);
            assert_true(rc == CAIRN_OK || rc == CAIRN_EBUSY);
            if (rc == CAIRN_OK) {
                assert_memory_equal(host + (size_t)polled * chunk, src + (size_t)polled * chunk,
                                    chunk);
                polled++;
            }
        }
    }
    assert_int_equal(cairn_backend_fence_wait(gpu, fence[n - 1], 1), CAIRN_OK);
    for (int i = 0; i < n; i++)
        assert_int_equal(cairn_backend_fence_wait(gpu, fence[i], 0), CAIRN_OK);
    KT_SAME_BYTES(host, src, (size_t)n * chunk, "chunks copied out");
    cairn_backend_host_free(gpu, host);
    gpu->iface->free(gpu, dev);
    free(src);
    free(fence);
}

/* Pages in and out again through the transfer slots, interleaved with
 * synchronous downloads, byte for byte. */
static void test_round_trip(void **state)
{
    (void)state;
    kt_rng r = kt_rng_for("round_trip");
    const int n = 64;
    const size_t page = 147456; /* a 0.5B model's page: 24 layers, 2 x 64, 16 tokens, F16 */
    uint8_t *in = NULL, *out = NULL;
    assert_int_equal(cairn_backend_host_alloc(gpu, (size_t)n * page, (void **)&in), CAIRN_OK);
    assert_int_equal(cairn_backend_host_alloc(gpu, (size_t)n * page, (void **)&out), CAIRN_OK);
    for (size_t i = 0; i < (size_t)n * page; i++)
        in[i] = (uint8_t)kt_next(&r);
    uint8_t *dev = kt_dev(gpu, NULL, (size_t)n * page);
    uint64_t f = 0;
    for (int i = 0; i < n; i++)
        assert_int_equal(cairn_backend_transfer(gpu, dev + (size_t)i * page, in + (size_t)i * page,
                                                page, 0, &f),
                         CAIRN_OK);
    /* out again in a shuffled order */
    int32_t order[64];
    kt_permutation(&r, order, n);
    for (int i = 0; i < n; i++)
        assert_int_equal(cairn_backend_transfer(gpu, out + (size_t)order[i] * page,
                                                dev + (size_t)order[i] * page, page, 1, &f),
                         CAIRN_OK);
    assert_int_equal(cairn_backend_fence_wait(gpu, f, 1), CAIRN_OK);
    KT_SAME_BYTES(out, in, (size_t)n * page, "pages in and out");
    uint8_t *sync = kt_host(gpu, dev, (size_t)n * page);
    KT_SAME_BYTES(sync, in, (size_t)n * page, "pages downloaded after transfers");
    free(sync);
    /* argument rules of the wrapper */
    assert_int_equal(cairn_backend_transfer(gpu, NULL, in, page, 0, &f), CAIRN_EINVAL);
    assert_int_equal(cairn_backend_transfer(gpu, dev, in, 0, 0, &f), CAIRN_OK);
    assert_int_equal(f, 0);
    assert_int_equal(cairn_backend_fence_wait(gpu, 0, 0), CAIRN_OK);
    cairn_backend_host_free(gpu, in);
    cairn_backend_host_free(gpu, out);
    gpu->iface->free(gpu, dev);
}

/* On a GPU the copy slots must be the backend's own: without them the
 * wrappers' synchronous fallbacks would pass every check in this file. */
static void test_slots_present(void **state)
{
    (void)state;
    if (gpu_test_is_harness())
        return; /* the CPU backend has none: the fallbacks are what runs */
    assert_non_null(gpu->iface->host_alloc);
    assert_non_null(gpu->iface->host_free);
    assert_non_null(gpu->iface->transfer);
    assert_non_null(gpu->iface->fence_wait);
    assert_non_null(gpu->iface->memory_info);
}

/* A non-blocking poll that finds the copy still running, and then at once a
 * kernel: the poll's "not ready" must not become the kernel's failure (the
 * CUDA runtime records it as the thread's last error, which a launch check
 * reads). The store polls right after every eviction, so this is the next
 * forward after an eviction to host. */
static void test_kernel_after_busy_poll(void **state)
{
    (void)state;
    if (!gpu->iface->fence_wait) {
        printf("(harness: fences pass at once, no poll is ever busy)\n");
        return;
    }
    kt_rng r = kt_rng_for("busy poll");
    cairn_kv_layout L;
    assert_int_equal(cairn_kv_layout_init(&L, 1, 2, 64, 16, CAIRN_TYPE_F16), CAIRN_OK);
    const int T = 16;
    const size_t width = (size_t)L.n_kv_head * L.head_dim;
    float *k = kt_xmalloc(sizeof(float) * T * width), *v = kt_xmalloc(sizeof(float) * T * width);
    kt_fill(&r, k, (size_t)T * width, -2, 2);
    kt_fill(&r, v, (size_t)T * width, -2, 2);
    int32_t slots[16];
    kt_permutation(&r, slots, T);
    float *k_g = kt_dev(gpu, k, sizeof(float) * T * width);
    float *v_g = kt_dev(gpu, v, sizeof(float) * T * width);
    float *k_c = kt_dev(cpu, k, sizeof(float) * T * width);
    float *v_c = kt_dev(cpu, v, sizeof(float) * T * width);
    void *pool_g = kt_dev(gpu, NULL, L.page_bytes), *pool_c = kt_dev(cpu, NULL, L.page_bytes);
    assert_int_equal(cpu->iface->kv_store(cpu, pool_c, &L, 0, k_c, v_c, slots, T), CAIRN_OK);

    /* 64 MiB out to pinned memory takes milliseconds; the poll comes
     * microseconds after it was queued */
    const size_t big = (size_t)64 << 20;
    uint8_t *dev = kt_dev(gpu, NULL, big), *host = NULL;
    assert_int_equal(cairn_backend_host_alloc(gpu, big, (void **)&host), CAIRN_OK);
    int busy = 0;
    for (int attempt = 0; attempt < 16 && !busy; attempt++) {
        uint64_t f = 0;
        assert_int_equal(cairn_backend_transfer(gpu, host, dev, big, 1, &f), CAIRN_OK);
        const int rc = cairn_backend_fence_wait(gpu, f, 0);
        assert_true(rc == CAIRN_OK || rc == CAIRN_EBUSY);
        if (rc == CAIRN_EBUSY) {
            busy = 1;
            /* the very next call into the backend launches a kernel */
            assert_int_equal(gpu->iface->kv_store(gpu, pool_g, &L, 0, k_g, v_g, slots, T),
                             CAIRN_OK);
        }
        assert_int_equal(cairn_backend_fence_wait(gpu, f, 1), CAIRN_OK);
    }
    if (!busy)
        fail_msg("16 copies of 64 MiB, and every poll right after found the copy done");
    uint8_t *got = kt_host(gpu, pool_g, L.page_bytes), *want = kt_host(cpu, pool_c, L.page_bytes);
    KT_SAME_BYTES(got, want, L.page_bytes, "kv_store right after a busy fence poll");
    free(got);
    free(want);
    cairn_backend_host_free(gpu, host);
    gpu->iface->free(gpu, dev);
    gpu->iface->free(gpu, pool_g);
    gpu->iface->free(gpu, k_g);
    gpu->iface->free(gpu, v_g);
    cpu->iface->free(cpu, pool_c);
    cpu->iface->free(cpu, k_c);
    cpu->iface->free(cpu, v_c);
    free(k);
    free(v);
}

int main(void)
{
    const int open_rc = gpu_test_open(&gpu, "gpu_transfer");
    if (open_rc != 0)
        return open_rc;
    cpu = kt_cpu(2);
    kt_init_seed("gpu_transfer");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slots_present),
        cmocka_unit_test(test_host_memory),
        cmocka_unit_test(test_kernel_after_busy_poll),
        cmocka_unit_test(test_page_to_host_after_ops),
        cmocka_unit_test(test_page_to_device_before_ops),
        cmocka_unit_test(test_fences_in_order),
        cmocka_unit_test(test_round_trip),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    cairn_backend_destroy(cpu);
    cairn_backend_destroy(gpu);
    return failed;
}
