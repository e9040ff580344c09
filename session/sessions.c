/*
 * session/sessions.c — session ids and the table of open sessions (engine
 * thread only), including named sessions: a client's own key for a
 * conversation (HTTP's session_id / prompt_cache_key) mapped to a session
 * here, so that a front end keeps no state of its own.
 */
#include "session/session_impl.h"

#include <math.h>
#include <stdio.h>
#include <time.h>

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

/* Sessions a user opened, named or forked: what max_sessions bounds. */
static size_t user_sessions(const cairn_service *s)
{
    return s->n_sessions - s->n_responses;
}

int session_adopt(cairn_service *s, session *x)
{
    if (session_find(s, x->id))
        return CAIRN_EBUSY;
    /* stored responses have their own bound (max_responses), kept by
     * whoever makes one (session_create, responses_loaded) */
    if (!x->response && user_sessions(s) >= s->cfg.max_sessions)
        return CAIRN_EFULL;
    size_t b = bucket_of(s, x->id);
    x->next = s->buckets[b];
    s->buckets[b] = x;
    s->n_sessions++;
    if (x->key)
        s->n_keyed++;
    if (x->response) {
        /* the newest is the last to go */
        x->resp_prev = s->resp_tail;
        x->resp_next = NULL;
        if (s->resp_tail)
            s->resp_tail->resp_next = x;
        else
            s->resp_head = x;
        s->resp_tail = x;
        s->n_responses++;
    }
    return CAIRN_OK;
}

static int session_create(cairn_service *s, bool response, const session *spare,
                          session **out)
{
    /* A new stored response first makes room among the stored ones; it
     * never takes a user's session's place, nor is refused for them. */
    if (response ? !responses_trim(s, s->cfg.max_responses - 1, spare)
                 : user_sessions(s) >= s->cfg.max_sessions)
        return CAIRN_EFULL;
    session *x = calloc(1, sizeof *x);
    if (!x)
        return CAIRN_ENOMEM;
    x->response = response;
    if (response) {
        x->created = (int64_t)time(NULL);
        x->expires = response_deadline(s, x->created);
    }
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

session *session_new(cairn_service *s, cairn_request *r, const session *spare)
{
    session *x = NULL;
    const bool response = r->response && (r->kind == CAIRN_REQ_SESSION_OPEN ||
                                           r->kind == CAIRN_REQ_SESSION_FORK);
    int rc = session_create(s, response, spare, &x);
    if (rc != CAIRN_OK) {
        /* say what is full and what to do about it */
        char msg[256];
        if (rc != CAIRN_EFULL)
            snprintf(msg, sizeof msg, "cannot create session");
        else if (response)
            snprintf(msg, sizeof msg, "too many stored responses are being generated at once "
                     "(all %zu of --max-responses): retry later, or raise --max-responses",
                     s->cfg.max_responses);
        else
            snprintf(msg, sizeof msg, "too many open sessions (%zu, --max-sessions): close "
                     "sessions that are no longer needed, or raise --max-sessions",
                     s->cfg.max_sessions);
        svc_emit_error(s, r, rc, msg);
        return NULL;
    }
    return x;
}

/* An open session's history is worth more than pages nobody is coming back
 * to: it is marked live in the cache (store.h), so under pressure its pages
 * go after one-off prompts' and after reused prefixes'. A mark follows the
 * history: unmark before changing it (while it still begins with what was
 * marked), mark again after. Stored responses are not marked: there may be
 * thousands, and most are never continued. */
void session_mark_live(cairn_service *s, session *x)
{
    if (!s->prefix_cache || x->response)
        return;
    session_unmark_live(s, x);
    cairn_kvcache_mark_live(s->cache, x->tenant, x->history.v, x->history.n, &x->live);
}

void session_unmark_live(cairn_service *s, session *x)
{
    cairn_kvcache_unmark_live(s->cache, x->tenant, x->history.v, x->history.n, &x->live);
}

void session_destroy(cairn_service *s, session *x)
{
    session_unmark_live(s, x);
    session **pp = &s->buckets[bucket_of(s, x->id)];
    while (*pp && *pp != x)
        pp = &(*pp)->next;
    if (*pp)
        *pp = x->next;
    if (x->key)
        s->n_keyed--;
    if (x->response) {
        *(x->resp_prev ? &x->resp_prev->resp_next : &s->resp_head) = x->resp_next;
        *(x->resp_next ? &x->resp_next->resp_prev : &s->resp_tail) = x->resp_prev;
        s->n_responses--;
    }
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
                char msg[200];
                snprintf(msg, sizeof msg, "too many named sessions in use (all %zu are generating "
                         "or persisted): retry later, or close some", s->cfg.max_named_sessions);
                svc_emit_error(s, r, CAIRN_EFULL, msg);
                return NULL;
            }
            /* the least recently used conversation makes room; its pages
             * stay cached for as long as the cache keeps them */
            if (s->have_disk)
                record_delete(s, lru->id, 0);
            record_unshare(s, lru->id);
            session_destroy(s, lru);
        }
        if (!(x = session_new(s, r, NULL)))
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

/* ---- stored responses ------------------------------------------------------------- */

/* How often the TTL sweep walks the list (a response named after its TTL
 * is dropped when it is named, whenever the sweep comes). */
#define RESPONSES_SWEEP_S 60

void responses_touch(cairn_service *s, session *x)
{
    if (!x->response || x == s->resp_tail)
        return;
    *(x->resp_prev ? &x->resp_prev->resp_next : &s->resp_head) = x->resp_next;
    x->resp_next->resp_prev = x->resp_prev; /* not the tail: there is a next */
    x->resp_prev = s->resp_tail;
    x->resp_next = NULL;
    s->resp_tail->resp_next = x;
    s->resp_tail = x;
}

int64_t response_deadline(const cairn_service *s, int64_t created)
{
    if (s->cfg.response_ttl_s < 0)
        return 0;
    return created + (int64_t)ceil(s->cfg.response_ttl_s);
}

/* A response whose object is not stored yet (no note: generating, or just
 * done) is given a minute past its deadline, so a short TTL cannot take it
 * between its last token and the front end storing it; one whose client
 * left before that still goes then. */
#define RESPONSE_STORE_GRACE_S 60
bool response_expired(const cairn_service *s, const session *x, int64_t now)
{
    (void)s;
    if (!x->response || x->busy || x->expires <= 0)
        return false;
    return now >= x->expires + (x->note ? 0 : RESPONSE_STORE_GRACE_S);
}

void response_drop(cairn_service *s, session *x)
{
    /* the record goes (here and on the shared tier); the pages stay in the
     * cache and are evicted as any others, so a conversation that is sent
     * again still finds them */
    if (s->have_disk)
        record_delete(s, x->id, 0);
    record_unshare(s, x->id);
    session_destroy(s, x);
}

void responses_expire(cairn_service *s, int64_t now)
{
    if (now < s->resp_next_sweep)
        return;
    s->resp_next_sweep = now + RESPONSES_SWEEP_S;
    /* the list is in order of use, not of creation: the whole of it */
    for (session *x = s->resp_head, *next; x; x = next) {
        next = x->resp_next;
        if (response_expired(s, x, now)) {
            response_drop(s, x);
            s->resp_expired++;
        }
    }
}

bool responses_trim(cairn_service *s, size_t keep, const session *spare)
{
    session *x = s->resp_head;
    while (s->n_responses > keep) {
        /* a response generating now, or the one being continued, stays */
        while (x && (x->busy || x == spare))
            x = x->resp_next;
        if (!x)
            return false;
        session *next = x->resp_next;
        response_drop(s, x);
        s->resp_pushed_out++;
        x = next;
    }
    return true;
}

static int by_created(const void *a, const void *b)
{
    const session *x = *(session *const *)a, *y = *(session *const *)b;
    return (x->created > y->created) - (x->created < y->created);
}

void responses_loaded(cairn_service *s)
{
    size_t n = s->n_responses, i = 0;
    session **all = n ? malloc(n * sizeof *all) : NULL;
    if (all) {
        /* records come back in key order (random ids): oldest first again,
         * as nothing says which were continued last */
        for (session *x = s->resp_head; x; x = x->resp_next)
            all[i++] = x;
        qsort(all, n, sizeof *all, by_created);
        for (i = 0; i < n; i++) {
            all[i]->resp_prev = i ? all[i - 1] : NULL;
            all[i]->resp_next = i + 1 < n ? all[i + 1] : NULL;
        }
        s->resp_head = all[0];
        s->resp_tail = all[n - 1];
        free(all);
    }
    s->resp_next_sweep = 0;
    responses_expire(s, (int64_t)time(NULL));
    responses_trim(s, s->cfg.max_responses, NULL);
}
