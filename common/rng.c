/*
 * common/rng.c — the random numbers cairn uses: splitmix64 (a well-mixed
 * sequence from any state: random seeds, expanding one seed into many),
 * xoshiro256** (the samplers' generator: the same draws for a seed on every
 * machine) and the kernel's randomness (session ids, which are
 * capabilities and must not be guessable).
 */
#include "common/common.h"

#include <errno.h>
#include <stdio.h>
#include <sys/random.h>

uint64_t cairn_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void cairn_rng_seed(cairn_rng *r, uint64_t seed)
{
    /* splitmix64 never yields four zero words from one seed, so the
     * xoshiro state is never the all-zero fixed point. */
    uint64_t st = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = cairn_splitmix64(&st);
}

static uint64_t rotl64(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t cairn_rng_next(cairn_rng *r)
{
    uint64_t *s = r->s;
    const uint64_t result = rotl64(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

double cairn_rng_uniform(cairn_rng *r)
{
    return (double)(cairn_rng_next(r) >> 11) * 0x1.0p-53;
}

int cairn_os_random(void *buf, size_t n)
{
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t got = getrandom(p, n, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        p += got;
        n -= (size_t)got;
    }
    if (n == 0)
        return CAIRN_OK;
    /* getrandom missing (old kernel, seccomp): the device it fronts */
    FILE *f = fopen("/dev/urandom", "rb");
    size_t got = f ? fread(p, 1, n, f) : 0;
    if (f)
        fclose(f);
    return got == n ? CAIRN_OK : CAIRN_EIO;
}
