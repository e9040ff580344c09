/*
 * session/pins.c — retention hints: prefixes a client asked to keep cached
 * for a while (session.h, "Retention").
 *
 * A pin is (tenant, the prefix's tokens, a deadline) and one lock on the
 * tree node that ends at the prefix's last whole page. Its life:
 *
 *   intake      pins_reserve: the request's hints are cut to whole pages of
 *               its prompt and checked against the bounds; a new prefix gets
 *               an entry at once (no lock yet) so that concurrent requests
 *               count it, one already pinned is only marked as being
 *               refreshed (`users`, so it cannot expire under the request)
 *   finish      pins_commit: the prompt's pages are in the tree now; a new
 *               entry takes its lock, and the deadline becomes the request's
 *               end + its TTL when that is later (Anthropic refreshes a
 *               cached prefix on every hit, and a longer TTL upgrades it)
 *   job freed   pins_job_gone: a request that failed or was cancelled gives
 *               up its part (an entry nobody committed goes at the sweep)
 *   sweep       pins_sweep, every loop turn: an entry past its deadline that
 *               no request is about to refresh is unlocked and forgotten;
 *               its pages then age like any others
 *
 * The entries are a short list (each holds at least a page and the total
 * is bounded by half the tier-0 pool); a linear walk is what it costs.
 * Engine thread only.
 */
#include "session/session_impl.h"

#include <math.h>
#include <stdio.h>

struct svc_pin {
    uint64_t tenant;
    int32_t *tokens;        /* the prefix (whole pages)                      */
    size_t n_tokens;
    cairn_kv_hold *hold;    /* locked; NULL until a request committed it      */
    double deadline;        /* cairn_now() time it expires (with hold)       */
    int users;              /* requests that will commit or refresh it        */
    struct svc_pin *next;
};

void pins_bounds(cairn_service *s)
{
    cairn_kvcache_stats ks;
    cairn_kvcache_get_stats(s->cache, &ks);
    size_t pool = (size_t)ks.tier[CAIRN_TIER_DEVICE].capacity_pages * (size_t)s->page_size;
    /* half the pool at most, so running requests always find pages; a
     * quarter per tenant unless configured, so two tenants can pin */
    s->pin_cap_total = pool / 2;
    s->pin_cap_tenant = s->cfg.max_pinned_tokens ? s->cfg.max_pinned_tokens : pool / 4;
}

static svc_pin *pin_find(cairn_service *s, uint64_t tenant, const int32_t *tokens, size_t n)
{
    for (svc_pin *p = s->pins; p; p = p->next)
        if (p->tenant == tenant && p->n_tokens == n &&
            memcmp(p->tokens, tokens, n * sizeof *tokens) == 0)
            return p;
    return NULL;
}

static void pins_sum(const cairn_service *s, uint64_t tenant, size_t *of_tenant, size_t *all)
{
    *of_tenant = *all = 0;
    for (const svc_pin *p = s->pins; p; p = p->next) {
        *all += p->n_tokens;
        if (p->tenant == tenant)
            *of_tenant += p->n_tokens;
    }
}

int pins_reserve(cairn_service *s, job *j, char *msg, size_t cap)
{
    const cairn_request *r = j->req;
    const size_t ps = (size_t)s->page_size;
    if (!s->prefix_cache) /* nothing is cached to keep: the hint has no object */
        return CAIRN_OK;
    for (int i = 0; i < r->n_pins && i < CAIRN_MAX_PINS; i++) {
        size_t n = r->pins[i].tokens ? r->pins[i].tokens : j->seq.n;
        if (n > j->seq.n)
            n = j->seq.n;
        n -= n % ps; /* the tree keeps whole pages */
        if (n == 0)
            continue;
        svc_pin *p = pin_find(s, r->tenant, j->seq.v, n);
        if (!p) {
            size_t mine, all;
            pins_sum(s, r->tenant, &mine, &all);
            if (mine + n > s->pin_cap_tenant || all + n > s->pin_cap_total) {
                s->stats.pins_refused++;
                if (mine + n > s->pin_cap_tenant)
                    snprintf(msg, cap, "cache pin refused: this tenant already pins %zu tokens "
                             "and this request asks for %zu more, past its bound of %zu "
                             "(--max-pinned-tokens); pins free as their TTLs pass", mine, n,
                             s->pin_cap_tenant);
                else
                    snprintf(msg, cap, "cache pin refused: all pins together already hold %zu "
                             "tokens and this request asks for %zu more, past %zu (half the "
                             "KV pool); pins free as their TTLs pass", all, n, s->pin_cap_total);
                return CAIRN_EQUOTA;
            }
            if (!(p = calloc(1, sizeof *p)) || !(p->tokens = malloc(n * sizeof *p->tokens))) {
                free(p);
                snprintf(msg, cap, "out of memory");
                return CAIRN_ENOMEM;
            }
            memcpy(p->tokens, j->seq.v, n * sizeof *p->tokens);
            p->n_tokens = n;
            p->tenant = r->tenant;
            p->next = s->pins;
            s->pins = p;
        }
        p->users++;
        j->pins[i] = p;
    }
    return CAIRN_OK;
}

void pins_commit(cairn_service *s, job *j)
{
    const double now = cairn_now();
    for (int i = 0; i < CAIRN_MAX_PINS; i++) {
        svc_pin *p = j->pins[i];
        if (!p)
            continue;
        j->pins[i] = NULL;
        p->users--;
        if (!p->hold) {
            size_t held = 0;
            int rc = cairn_kvcache_hold_prefix(s->cache, p->tenant, p->tokens,
                                               p->n_tokens / (size_t)s->page_size, &p->hold,
                                               &held);
            if (rc != CAIRN_OK) {
                /* the prompt's pages did not reach the tree (out of memory):
                 * nothing to keep, the entry goes at the next sweep */
                cairn_log(CAIRN_LOG_WARN, "service: a pinned prefix of %zu tokens was not "
                          "cached (%s); not pinned", p->n_tokens, cairn_strerror(rc));
                continue;
            }
            p->deadline = 0;
        }
        double until = now + j->req->pins[i].ttl_s;
        if (until > p->deadline)
            p->deadline = until;
    }
}

void pins_job_gone(job *j)
{
    for (int i = 0; i < CAIRN_MAX_PINS; i++)
        if (j->pins[i]) {
            j->pins[i]->users--;
            j->pins[i] = NULL;
        }
}

static void pin_drop(cairn_service *s, svc_pin *p)
{
    if (p->hold)
        cairn_kvcache_release(s->cache, p->hold);
    free(p->tokens);
    free(p);
}

double pins_sweep(cairn_service *s, double now)
{
    double next = INFINITY;
    for (svc_pin **pp = &s->pins; *pp;) {
        svc_pin *p = *pp;
        if (p->users == 0 && (!p->hold || p->deadline <= now)) {
            *pp = p->next;
            pin_drop(s, p);
            continue;
        }
        if (p->users == 0 && p->deadline < next)
            next = p->deadline;
        pp = &p->next;
    }
    return next;
}

void pins_stats(const cairn_service *s, uint64_t *tokens, uint64_t *prefixes)
{
    *tokens = *prefixes = 0;
    for (const svc_pin *p = s->pins; p; p = p->next)
        if (p->hold) {
            *tokens += p->n_tokens;
            (*prefixes)++;
        }
}

void pins_free(cairn_service *s)
{
    while (s->pins) {
        svc_pin *p = s->pins;
        s->pins = p->next;
        pin_drop(s, p);
    }
}
