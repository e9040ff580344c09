/*
 * route/sessions.c — sticky sessions: a session's key -> the replica slot
 * that holds it. Bounded: past `cap` keys the least recently used is
 * forgotten (its next request is routed as a new one; the replica side
 * finds its record in the shared tier). Loop thread only.
 */
#include "route/route_impl.h"

#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

typedef struct sess {
    struct sess *next;             /* bucket chain                    */
    struct sess *lru_prev, *lru_next; /* most recent first            */
    int slot;
    char key[];
} sess;

struct route_sessions {
    sess **buckets;
    size_t n_buckets, n, cap;
    sess *lru_head, *lru_tail;
};

int route_sessions_create(size_t cap, route_sessions **out)
{
    route_sessions *m = calloc(1, sizeof *m);
    if (!m)
        return CAIRN_ENOMEM;
    m->cap = cap ? cap : 1;
    m->n_buckets = 1;
    while (m->n_buckets < m->cap && m->n_buckets < (1u << 20))
        m->n_buckets <<= 1;
    m->buckets = calloc(m->n_buckets, sizeof *m->buckets);
    if (!m->buckets) {
        free(m);
        return CAIRN_ENOMEM;
    }
    *out = m;
    return CAIRN_OK;
}

void route_sessions_free(route_sessions *m)
{
    if (!m)
        return;
    for (sess *s = m->lru_head, *next; s; s = next) {
        next = s->lru_next;
        free(s);
    }
    free(m->buckets);
    free(m);
}

static sess **find(route_sessions *m, const char *key)
{
    size_t b = (size_t)XXH3_64bits(key, strlen(key)) & (m->n_buckets - 1);
    sess **pp = &m->buckets[b];
    while (*pp && strcmp((*pp)->key, key) != 0)
        pp = &(*pp)->next;
    return pp;
}

static void lru_unlink(route_sessions *m, sess *s)
{
    if (s->lru_prev)
        s->lru_prev->lru_next = s->lru_next;
    else
        m->lru_head = s->lru_next;
    if (s->lru_next)
        s->lru_next->lru_prev = s->lru_prev;
    else
        m->lru_tail = s->lru_prev;
    s->lru_prev = s->lru_next = NULL;
}

static void lru_front(route_sessions *m, sess *s)
{
    s->lru_next = m->lru_head;
    s->lru_prev = NULL;
    if (m->lru_head)
        m->lru_head->lru_prev = s;
    m->lru_head = s;
    if (!m->lru_tail)
        m->lru_tail = s;
}

int route_sessions_get(route_sessions *m, const char *key)
{
    sess *s = *find(m, key);
    if (!s)
        return -1;
    lru_unlink(m, s);
    lru_front(m, s);
    return s->slot;
}

void route_sessions_del(route_sessions *m, const char *key)
{
    sess **pp = find(m, key);
    sess *s = *pp;
    if (!s)
        return;
    *pp = s->next;
    lru_unlink(m, s);
    free(s);
    m->n--;
}

void route_sessions_set(route_sessions *m, const char *key, int slot)
{
    sess **pp = find(m, key);
    if (*pp) {
        (*pp)->slot = slot;
        lru_unlink(m, *pp);
        lru_front(m, *pp);
        return;
    }
    if (m->n >= m->cap && m->lru_tail) {
        char old[1100];
        size_t kl = strlen(m->lru_tail->key);
        if (kl < sizeof old) {
            memcpy(old, m->lru_tail->key, kl + 1);
            route_sessions_del(m, old);
            pp = find(m, key);
        }
    }
    size_t n = strlen(key);
    sess *s = malloc(sizeof *s + n + 1);
    if (!s)
        return;
    memcpy(s->key, key, n + 1);
    s->slot = slot;
    s->next = NULL;
    *pp = s;
    lru_front(m, s);
    m->n++;
}

size_t route_sessions_count(const route_sessions *m)
{
    return m->n;
}
