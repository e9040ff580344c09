/*
 * tests/kernels/kernel_test_util.h — shared helpers of the kernel tests:
 * a seeded random generator, tolerance checks that name the seed on failure,
 * and buffers in backend memory.
 *
 * Seeds: every run draws a fresh seed (time and pid) unless CAIRN_TEST_SEED
 * is set, prints it, and repeats it in every failure message, so a failing
 * run can be replayed exactly with CAIRN_TEST_SEED=<seed>. Each test derives
 * its own stream from the seed and its name, so tests do not depend on the
 * order they run in.
 *
 * Include after <cmocka.h>.
 */
#ifndef CAIRN_TESTS_KERNEL_TEST_UTIL_H
#define CAIRN_TESTS_KERNEL_TEST_UTIL_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "kernels/backend.h"

static uint64_t kt_seed;

static inline void kt_init_seed(const char *suite)
{
    const char *env = getenv("CAIRN_TEST_SEED");
    if (env && *env) {
        kt_seed = strtoull(env, NULL, 10);
    } else {
        /* Mix time and pid (one splitmix64 round) so runs started in the
         * same second still differ in every bit. */
        uint64_t z = ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        kt_seed = (z ^ (z >> 31)) % 1000000007ull; /* short enough to retype */
    }
    fprintf(stderr, "%s: seed %llu (rerun with CAIRN_TEST_SEED=%llu)\n", suite,
            (unsigned long long)kt_seed, (unsigned long long)kt_seed);
}

/* splitmix64: tiny, fast and good enough for test data. */
typedef struct {
    uint64_t state;
} kt_rng;

static inline uint64_t kt_next(kt_rng *r)
{
    uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A stream for one test: the run's seed mixed with the test's name. */
static inline kt_rng kt_rng_for(const char *name)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *c = name; *c; c++)
        h = (h ^ (uint8_t)*c) * 1099511628211ull;
    kt_rng r = {kt_seed ^ h};
    kt_next(&r);
    return r;
}

/* Uniform in [lo, hi). */
static inline float kt_uniform(kt_rng *r, float lo, float hi)
{
    double u = (double)(kt_next(r) >> 11) * 0x1p-53;
    return (float)(lo + (hi - lo) * u);
}

/* Uniform integer in [0, n). */
static inline int kt_below(kt_rng *r, int n)
{
    return (int)(kt_next(r) % (uint64_t)n);
}

static inline void kt_fill(kt_rng *r, float *x, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = kt_uniform(r, lo, hi);
}

/* Random permutation of 0..n-1 into p. */
static inline void kt_permutation(kt_rng *r, int32_t *p, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = kt_below(r, i + 1);
        int32_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
}

/* Fail (naming the seed) unless |got - want| <= tol. NaN always fails. */
#define KT_CLOSE(got, want, tol, what, idx)                                                     \
    do {                                                                                        \
        double kt_g_ = (got), kt_w_ = (want), kt_t_ = (tol);                                    \
        if (!(fabs(kt_g_ - kt_w_) <= kt_t_))                                                    \
            fail_msg("seed %llu: %s [%lld]: got %.9g, want %.9g, |diff| %.3g > tol %.3g",        \
                     (unsigned long long)kt_seed, (what), (long long)(idx), kt_g_, kt_w_,       \
                     fabs(kt_g_ - kt_w_), kt_t_);                                               \
    } while (0)

/* Fail (naming the seed) unless two buffers are bitwise equal. */
#define KT_SAME_BYTES(a, b, n, what)                                                            \
    do {                                                                                        \
        if (memcmp((a), (b), (n)) != 0)                                                         \
            fail_msg("seed %llu: %s: results differ", (unsigned long long)kt_seed, (what));     \
    } while (0)

static inline void *kt_xmalloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    assert_non_null(p);
    return p;
}

/* A backend buffer holding a copy of `bytes` bytes of host data (or zeroed
 * when host is NULL). */
static inline void *kt_dev(cairn_backend *be, const void *host, size_t bytes)
{
    void *p = NULL;
    assert_int_equal(be->iface->alloc(be, bytes, &p), CAIRN_OK);
    if (host)
        assert_int_equal(be->iface->upload(be, p, host, bytes), CAIRN_OK);
    return p;
}

/* Download a backend buffer into fresh host memory. */
static inline void *kt_host(cairn_backend *be, const void *dev, size_t bytes)
{
    void *h = kt_xmalloc(bytes);
    assert_int_equal(be->iface->download(be, h, dev, bytes), CAIRN_OK);
    return h;
}

static inline cairn_backend *kt_cpu(int n_threads)
{
    cairn_backend *be = NULL;
    assert_int_equal(cairn_backend_cpu_create(n_threads, &be), CAIRN_OK);
    assert_non_null(be);
    return be;
}

#endif /* CAIRN_TESTS_KERNEL_TEST_UTIL_H */
