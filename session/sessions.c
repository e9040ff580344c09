/*
 * session/sessions.c — session ids and the table of open sessions (engine
 * thread only), including named sessions: a client's own key for a
 * conversation (HTTP's session_id / prompt_cache_key) mapped to a session
 * here, so that a front end keeps no state of its own.
 */
#include "session/session_impl.h"

#include <stdio.h>

void cairn_session_id_to_hex(cairn_session_id id, char out[33])
{
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)id.hi, (unsigned long long)id.lo);
}

int cairn_session_id_from_hex(const char *hex, size_t len, cairn_session_id *out)
{
    if (!hex || len != 32)
        return CAIRN_EINVAL;
    uint64_t v[2] = {0, 0};
    for (size_t i = 0; i < 32; i++) {
        char c = hex[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                                : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return CAIRN_EINVAL;
        v[i / 16] = v[i / 16] << 4 | (uint64_t)d;
    }
    out->hi = v[0];
    out->lo = v[1];
    return CAIRN_OK;
}

static bool session_id_equal(cairn_session_id a, cairn_session_id b)
{
    return a.hi == b.hi && a.lo == b.lo;
}

static size_t bucket_of(const cairn_service *s, cairn_session_id id)
{
    return (size_t)((id.lo ^ (id.hi * 0x9e3779b97f4a7c15ull)) % s->n_buckets);
}

session *session_find(cairn_service *s, cairn_session_id id)
{
    for (session *x = s->buckets[bucket_of(s, id)]; x; x = x->next)
        if (session_id_equal(x->id, id))
            return x;
    return NULL;
}

int session_adopt(cairn_service *s, session *x)
{
    if (session_find(s, x->id))
        return CAIRN_EBUSY;
    if (s->n_sessions >= s->cfg.max_sessions)
        return CAIRN_EFULL;
    size_t b = bucket_of(s, x->id);
    x->next = s->buckets[b];
    s->buckets[b] = x;
    s->n_sessions++;
    if (x->key)
        s->n_keyed++;
    return CAIRN_OK;
}

static int session_create(cairn_service *s, session **out)
{
    if (s->n_sessions >= s->cfg.max_sessions)
        return CAIRN_EFULL;
    session *x = calloc(1, sizeof *x);
    if (!x)
        return CAIRN_ENOMEM;
    int rc;
    /* 128 random bits from the kernel; never a predictable counter, since
     * the id is the only capability a client needs to reach a session */
    do {
        rc = cairn_os_random(&x->id, sizeof x->id);
    } while (rc == CAIRN_OK && session_find(s, x->id));
    if (rc == CAIRN_OK)
        rc = session_adopt(s, x);
    if (rc) {
        free(x);
        return rc;
    }
    *out = x;
    return CAIRN_OK;
}

session *session_new(cairn_service *s, cairn_request *r)
{
    session *x = NULL;
    int rc = session_create(s, &x);
    if (rc != CAIRN_OK) {
        svc_emit_error(s, r, rc, rc == CAIRN_EFULL ? "too many open sessions"
                                                   : "cannot create session");
        return NULL;
    }
    return x;
}

void session_destroy(cairn_service *s, session *x)
{
    session **pp = &s->buckets[bucket_of(s, x->id)];
    while (*pp && *pp != x)
        pp = &(*pp)->next;
    if (*pp)
        *pp = x->next;
    if (x->key)
        s->n_keyed--;
    free(x->key);
    free(x->note);
    free(x->history.v);
    free(x);
    s->n_sessions--;
}

int session_set_key(session *x, const char *key, size_t len)
{
    char *k = malloc(len + 1);
    if (!k)
        return CAIRN_ENOMEM;
    memcpy(k, key, len);
    k[len] = '\0';
    free(x->key);
    x->key = k;
    x->key_len = len;
    return CAIRN_OK;
}

/* Named sessions are few (max_named_sessions) and looked up once per
 * turn: a walk of the table is cheaper than keeping a second index in step
 * with it. */
static session *named_find(cairn_service *s, uint64_t tenant, const char *key, size_t len,
                           session **lru_idle)
{
    *lru_idle = NULL;
    for (size_t b = 0; b < s->n_buckets; b++)
        for (session *x = s->buckets[b]; x; x = x->next) {
            if (!x->key)
                continue;
            if (x->tenant == tenant && x->key_len == len && memcmp(x->key, key, len) == 0)
                return x;
            if (!x->busy && !x->persist && (!*lru_idle || x->last_used < (*lru_idle)->last_used))
                *lru_idle = x;
        }
    return NULL;
}

session *session_named(cairn_service *s, cairn_request *r)
{
    session *lru = NULL;
    session *x = named_find(s, r->tenant, r->session_key, r->session_key_len, &lru);
    if (!x) {
        if (s->n_keyed >= s->cfg.max_named_sessions) {
            if (!lru) {
                svc_emit_error(s, r, CAIRN_EFULL, "too many sessions in use");
                return NULL;
            }
            /* the least recently used conversation makes room; its pages
             * stay cached for as long as the cache keeps them */
            if (s->have_disk)
                record_delete(s, lru->id, 0);
            record_unshare(s, lru->id);
            session_destroy(s, lru);
        }
        if (!(x = session_new(s, r)))
            return NULL;
        int rc = session_set_key(x, r->session_key, r->session_key_len);
        if (rc) {
            session_destroy(s, x);
            svc_emit_error(s, r, rc, "cannot create session");
            return NULL;
        }
        s->n_keyed++;
        x->tenant = r->tenant;
    }
    x->last_used = ++s->key_clock;
    return x;
}

session *session_of_request(cairn_service *s, cairn_request *r)
{
    session *lru;
    /* by name when the request gives one: found, never created */
    session *x = r->session_key && r->session_key_len
                     ? named_find(s, r->tenant, r->session_key, r->session_key_len, &lru)
                     : session_find(s, r->session);
    if (x && x->tenant != r->tenant)
        x = NULL; /* another tenant's session does not exist for this one */
    if (!x)
        svc_emit_error(s, r, CAIRN_ENOTFOUND, "no such session");
    return x;
}

session *session_idle_of_request(cairn_service *s, cairn_request *r, const char *busy_msg)
{
    session *x = session_of_request(s, r);
    if (x && x->busy) {
        svc_emit_error(s, r, CAIRN_EBUSY, busy_msg);
        return NULL;
    }
    return x;
}
