/*
 * route/index.c — chained page hash -> replicas (route.h, section 1), and
 * the page hashes of a prompt (section 2).
 *
 * A chained hash table: the keys are already uniform (XXH3-128), so their
 * low bits pick the bucket. It doubles when it holds more entries than
 * buckets. An entry whose masks both become empty is freed at once, so the
 * table holds what the replicas hold (plus predictions not yet expired).
 */
#include "route/route_impl.h"

#include "pagekey/pagekey.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct ix_entry {
    struct ix_entry *next;
    uint8_t hash[ROUTE_HASH_BYTES];
    uint64_t confirmed;       /* slots that announced the page           */
    uint64_t predicted;       /* slots the router sent its prompt to     */
    double predicted_until;   /* predictions end then                    */
} ix_entry;

struct route_index {
    pthread_mutex_t mu;
    ix_entry **buckets;
    size_t n_buckets; /* a power of two */
    size_t n_entries;
};

static size_t bucket_of(const route_index *ix, const uint8_t h[ROUTE_HASH_BYTES])
{
    uint64_t v;
    memcpy(&v, h + 8, sizeof v); /* the low half of the canonical big-endian form */
    return (size_t)v & (ix->n_buckets - 1);
}

int route_index_create(route_index **out)
{
    route_index *ix = calloc(1, sizeof *ix);
    if (!ix)
        return CAIRN_ENOMEM;
    ix->n_buckets = 1024;
    ix->buckets = calloc(ix->n_buckets, sizeof *ix->buckets);
    if (!ix->buckets) {
        free(ix);
        return CAIRN_ENOMEM;
    }
    pthread_mutex_init(&ix->mu, NULL);
    *out = ix;
    return CAIRN_OK;
}

static void free_all(route_index *ix)
{
    for (size_t b = 0; b < ix->n_buckets; b++) {
        for (ix_entry *e = ix->buckets[b], *next; e; e = next) {
            next = e->next;
            free(e);
        }
        ix->buckets[b] = NULL;
    }
    ix->n_entries = 0;
}

void route_index_free(route_index *ix)
{
    if (!ix)
        return;
    free_all(ix);
    free(ix->buckets);
    pthread_mutex_destroy(&ix->mu);
    free(ix);
}

/* Double the buckets (a failed allocation just keeps the longer chains). */
static void grow(route_index *ix)
{
    size_t n = ix->n_buckets * 2;
    ix_entry **nb = calloc(n, sizeof *nb);
    if (!nb)
        return;
    ix_entry **old = ix->buckets;
    size_t old_n = ix->n_buckets;
    ix->buckets = nb;
    ix->n_buckets = n;
    for (size_t b = 0; b < old_n; b++) {
        for (ix_entry *e = old[b], *next; e; e = next) {
            next = e->next;
            size_t k = bucket_of(ix, e->hash);
            e->next = nb[k];
            nb[k] = e;
        }
    }
    free(old);
}

static ix_entry **find(route_index *ix, const uint8_t h[ROUTE_HASH_BYTES])
{
    ix_entry **pp = &ix->buckets[bucket_of(ix, h)];
    while (*pp && memcmp((*pp)->hash, h, ROUTE_HASH_BYTES) != 0)
        pp = &(*pp)->next;
    return pp;
}

static ix_entry *find_or_add(route_index *ix, const uint8_t h[ROUTE_HASH_BYTES])
{
    ix_entry **pp = find(ix, h);
    if (*pp)
        return *pp;
    ix_entry *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    memcpy(e->hash, h, ROUTE_HASH_BYTES);
    *pp = e;
    if (++ix->n_entries > ix->n_buckets)
        grow(ix);
    return e;
}

static void unlink_entry(route_index *ix, ix_entry **pp)
{
    ix_entry *e = *pp;
    *pp = e->next;
    free(e);
    ix->n_entries--;
}

/* Mark the pages `slot` holds: confirmed (an event said so) or predicted
 * (the router sent it the prompt; valid until `until`). */
static int mark(route_index *ix, int slot, const uint8_t (*hashes)[ROUTE_HASH_BYTES], size_t n,
                bool predicted, double until)
{
    if (slot < 0 || slot >= ROUTE_MAX_REPLICAS)
        return CAIRN_EINVAL;
    const uint64_t bit = 1ull << slot;
    int rc = CAIRN_OK;
    pthread_mutex_lock(&ix->mu);
    for (size_t i = 0; i < n; i++) {
        ix_entry *e = find_or_add(ix, hashes[i]);
        if (!e) {
            rc = CAIRN_ENOMEM;
            break;
        }
        if (!predicted) {
            e->confirmed |= bit;
            continue;
        }
        e->predicted |= bit;
        if (until > e->predicted_until)
            e->predicted_until = until;
    }
    pthread_mutex_unlock(&ix->mu);
    return rc;
}

int route_index_store(route_index *ix, int slot, const uint8_t (*hashes)[ROUTE_HASH_BYTES],
                      size_t n)
{
    return mark(ix, slot, hashes, n, false, 0);
}

void route_index_remove(route_index *ix, int slot, const uint8_t (*hashes)[ROUTE_HASH_BYTES],
                        size_t n)
{
    if (slot < 0 || slot >= ROUTE_MAX_REPLICAS)
        return;
    const uint64_t bit = 1ull << slot;
    pthread_mutex_lock(&ix->mu);
    for (size_t i = 0; i < n; i++) {
        ix_entry **pp = find(ix, hashes[i]);
        if (!*pp)
            continue;
        (*pp)->confirmed &= ~bit;
        (*pp)->predicted &= ~bit;
        if (!(*pp)->confirmed && !(*pp)->predicted)
            unlink_entry(ix, pp);
    }
    pthread_mutex_unlock(&ix->mu);
}

int route_index_predict(route_index *ix, int slot, const uint8_t (*hashes)[ROUTE_HASH_BYTES],
                        size_t n, double until)
{
    return mark(ix, slot, hashes, n, true, until);
}

void route_index_drop_slot(route_index *ix, int slot)
{
    if (slot < 0 || slot >= ROUTE_MAX_REPLICAS)
        return;
    const uint64_t bit = 1ull << slot;
    pthread_mutex_lock(&ix->mu);
    for (size_t b = 0; b < ix->n_buckets; b++) {
        ix_entry **pp = &ix->buckets[b];
        while (*pp) {
            (*pp)->confirmed &= ~bit;
            (*pp)->predicted &= ~bit;
            if (!(*pp)->confirmed && !(*pp)->predicted)
                unlink_entry(ix, pp);
            else
                pp = &(*pp)->next;
        }
    }
    pthread_mutex_unlock(&ix->mu);
}

void route_index_clear(route_index *ix)
{
    pthread_mutex_lock(&ix->mu);
    free_all(ix);
    pthread_mutex_unlock(&ix->mu);
}

void route_index_match(route_index *ix, uint64_t slots, const uint8_t (*hashes)[ROUTE_HASH_BYTES],
                       size_t n, double now, uint32_t pages[ROUTE_MAX_REPLICAS])
{
    memset(pages, 0, ROUTE_MAX_REPLICAS * sizeof *pages);
    uint64_t alive = slots; /* slots that hold every page so far */
    pthread_mutex_lock(&ix->mu);
    for (size_t i = 0; i < n && alive; i++) {
        ix_entry **pp = find(ix, hashes[i]);
        uint64_t has = 0;
        if (*pp) {
            ix_entry *e = *pp;
            if (e->predicted && e->predicted_until < now) {
                e->predicted = 0; /* expired: forget it lazily */
                if (!e->confirmed) {
                    unlink_entry(ix, pp);
                    e = NULL;
                }
            }
            if (e)
                has = e->confirmed | e->predicted;
        }
        /* a slot that lacks page i keeps the run it had: i pages */
        uint64_t lost = alive & ~has;
        for (int s = 0; lost; s++, lost >>= 1)
            if (lost & 1)
                pages[s] = (uint32_t)i;
        alive &= has;
    }
    for (int s = 0; alive; s++, alive >>= 1)
        if (alive & 1)
            pages[s] = (uint32_t)n;
    pthread_mutex_unlock(&ix->mu);
}

void route_index_expire(route_index *ix, double now)
{
    pthread_mutex_lock(&ix->mu);
    for (size_t b = 0; b < ix->n_buckets; b++) {
        ix_entry **pp = &ix->buckets[b];
        while (*pp) {
            ix_entry *e = *pp;
            if (e->predicted && e->predicted_until < now)
                e->predicted = 0;
            if (!e->confirmed && !e->predicted)
                unlink_entry(ix, pp);
            else
                pp = &e->next;
        }
    }
    pthread_mutex_unlock(&ix->mu);
}

size_t route_index_entries(route_index *ix)
{
    pthread_mutex_lock(&ix->mu);
    size_t n = ix->n_entries;
    pthread_mutex_unlock(&ix->mu);
    return n;
}

/* ---- page hashes of a prompt ---------------------------------------------------- */

size_t route_useful_pages(size_t n_tokens, int ps)
{
    return n_tokens == 0 || ps <= 0 ? 0 : (n_tokens - 1) / (size_t)ps;
}

void route_prompt_hashes(const uint8_t root[ROUTE_HASH_BYTES], uint64_t tenant, int ps,
                         const int32_t *tokens, size_t n_pages,
                         uint8_t (*out)[ROUTE_HASH_BYTES])
{
    /* the replicas' own keys (pagekey.h), as bytes */
    cairn_page_hash h = cairn_page_chain_seed(cairn_page_hash_from_bytes(root), tenant);
    for (size_t i = 0; i < n_pages; i++) {
        h = cairn_page_hash_next(h, tokens + i * (size_t)ps, (size_t)ps);
        cairn_page_hash_to_bytes(h, out[i]);
    }
}
