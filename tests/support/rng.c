/*
 * tests/support/rng.c — the random generators the C tests share
 * (support.h): splitmix64, xorshift64, two LCGs, and the kernel tests'
 * seeded streams.
 */
#include "tests/support/support.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

uint64_t support_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t support_splitmix64(uint64_t *state)
{
    return support_mix64(*state += 0x9e3779b97f4a7c15ull);
}

uint64_t support_xorshift64(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}

uint32_t support_lcg64(uint64_t *state)
{
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*state >> 33);
}

uint32_t support_lcg32(uint32_t *state)
{
    return *state = *state * 1664525u + 1013904223u;
}

/* ---- the kernel tests' seeded streams ---------------------------------- */

uint64_t kt_seed;

void kt_init_seed(const char *suite)
{
    const char *env = getenv("CAIRN_TEST_SEED");
    if (env && *env) {
        kt_seed = strtoull(env, NULL, 10);
    } else {
        /* Mix time and pid (one splitmix64 round) so runs started in the
         * same second still differ in every bit. */
        uint64_t z = ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
        kt_seed = support_mix64(z) % 1000000007ull; /* short enough to retype */
    }
    fprintf(stderr, "%s: seed %llu (rerun with CAIRN_TEST_SEED=%llu)\n", suite,
            (unsigned long long)kt_seed, (unsigned long long)kt_seed);
}

uint64_t kt_next(kt_rng *r)
{
    return support_splitmix64(&r->state);
}

kt_rng kt_rng_for(const char *name)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a of the name */
    for (const char *c = name; *c; c++)
        h = (h ^ (uint8_t)*c) * 1099511628211ull;
    kt_rng r = {kt_seed ^ h};
    kt_next(&r);
    return r;
}

float kt_uniform(kt_rng *r, float lo, float hi)
{
    double u = (double)(kt_next(r) >> 11) * 0x1p-53;
    return (float)(lo + (hi - lo) * u);
}

int kt_below(kt_rng *r, int n)
{
    return (int)(kt_next(r) % (uint64_t)n);
}

void kt_permutation(kt_rng *r, int32_t *p, int n)
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
