/*
 * server/http/web.c — the browser page (docs/web.md): its files at `/`
 * (web/web.h, embedded at build time), and GET /web/state, the JSON the
 * page's Cache view polls: the tiers' fill, what each tier served over the
 * last minutes, the asking tenant's sessions and the prefixes it reused
 * most.
 *
 * Who sees what:
 *  - The files hold no data and are served without a token (a browser's
 *    address bar sends none); the page asks the person for the token and
 *    sends it as `Authorization: Bearer` with every API call, /web/state
 *    included, which answers 401 without it like every API route. GET
 *    /web/info, also without a token, says only whether a token is needed
 *    and whether tenants are on (so the page knows whether to ask).
 *  - Same origin only: /web/state refuses (403) a request whose Origin is
 *    not the server's own (http://HOST), and the files carry a Content-
 *    Security-Policy that lets the page load and call nothing but its own
 *    origin, and no frame embed it.
 *  - Tenants: the time series, the sessions and the prefixes are the asking
 *    tenant's only (the engine lists only its sessions; the activity below
 *    is kept per tenant). The tiers' fill is the machine's, shared by all;
 *    with tenants the server-wide counters are left out.
 *
 * Activity. The engine keeps cumulative counters only; what the page plots
 * ("tokens each tier served, per 10 seconds, over the last 10 minutes") is
 * kept here, on the loop thread, from every generation's final event
 * (msgpack and HTTP alike, srv_http_note_event): its cached tokens by tier
 * and the tokens it computed. The prefixes reused most are counted by the
 * first up to WEB_PREFIX_TOKENS tokens of a prompt that came back with at
 * least a page cached (its tokens are kept from the submission,
 * srv_http_note_submit); the page shows them through /detokenize.
 */
#include "server/http/http.h"

#include "web/web.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <xxhash.h>

#define WEB_BUCKET_S 10      /* one point of the time series                */
#define WEB_BUCKETS 60       /* points kept: 10 minutes                     */
#define WEB_TENANTS 32       /* tenants whose activity is kept (LRU)        */
#define WEB_PENDING 512      /* generations in flight whose prompt is kept  */
#define WEB_PREFIX_TOKENS 32 /* a prefix is named by its first tokens        */
#define WEB_MIN_PREFIX 16    /* cached tokens that count as a reuse          */
#define WEB_PREFIXES 64      /* prefixes counted (least used replaced)       */
#define WEB_NAMED 256        /* named sessions whose last turn is kept       */

typedef struct {
    int64_t t;                /* the bucket's start (unix seconds); 0: empty */
    uint64_t hit[4];          /* cached tokens by tier                      */
    uint64_t computed, generated, requests;
} web_bucket;

typedef struct {
    bool used;
    uint64_t tenant, last;
    web_bucket b[WEB_BUCKETS];
} web_tenant;

typedef struct {
    bool used;
    uint64_t client, id, tenant, serial;
    int n;                    /* tokens kept                                 */
    int32_t tokens[WEB_PREFIX_TOKENS];
    char name[CAIRN_SESSION_NAME_SHOWN];
} web_pending;

typedef struct {
    bool used;
    uint64_t tenant, hash, uses, saved, last;
    int n;
    int32_t tokens[WEB_PREFIX_TOKENS];
} web_prefix;

typedef struct {
    bool used;
    uint64_t tenant, last;
    char name[CAIRN_SESSION_NAME_SHOWN];
    int64_t prompt, cached, by_tier[4];
    double at;
} web_named;

struct srv_web {
    uint64_t serial;
    web_tenant tenants[WEB_TENANTS];
    web_pending pending[WEB_PENDING];
    web_prefix prefixes[WEB_PREFIXES];
    web_named named[WEB_NAMED];
};

static const char *const tier_names[4] = {"device", "host", "disk", "shared"};

int srv_web_create(srv_web **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? CAIRN_OK : CAIRN_ENOMEM;
}

void srv_web_free(srv_web *w) { free(w); }

/* ---- activity ------------------------------------------------------------------------------ */

static bool is_generation(cairn_req_kind k)
{
    return k == CAIRN_REQ_GENERATE || k == CAIRN_REQ_SESSION_SYNC ||
           k == CAIRN_REQ_SESSION_GENERATE;
}

void srv_http_note_submit(cairn_server *s, const cairn_request *r)
{
    srv_web *w = s->http ? s->http->web : NULL;
    if (!w || !is_generation(r->kind) || !r->n_tokens || r->kind == CAIRN_REQ_SESSION_GENERATE)
        return;
    web_pending *slot = NULL;
    for (int i = 0; i < WEB_PENDING; i++) {
        web_pending *p = &w->pending[i];
        if (!p->used) {
            slot = p;
            break;
        }
        if (!slot || p->serial < slot->serial)
            slot = p; /* full: the oldest (its client most likely gone) */
    }
    memset(slot, 0, sizeof *slot);
    slot->used = true;
    slot->client = r->client;
    slot->id = r->id;
    slot->tenant = r->tenant;
    slot->serial = ++w->serial;
    slot->n = r->n_tokens < WEB_PREFIX_TOKENS ? (int)r->n_tokens : WEB_PREFIX_TOKENS;
    memcpy(slot->tokens, r->tokens, (size_t)slot->n * sizeof(int32_t));
    if (r->session_key) {
        size_t k = r->session_key_len < sizeof slot->name - 1 ? r->session_key_len
                                                              : sizeof slot->name - 1;
        memcpy(slot->name, r->session_key, k);
    }
}

static web_tenant *tenant_slot(srv_web *w, uint64_t tenant, bool create)
{
    web_tenant *lru = NULL;
    for (int i = 0; i < WEB_TENANTS; i++) {
        web_tenant *t = &w->tenants[i];
        if (t->used && t->tenant == tenant)
            return t;
        if (!lru || !t->used || (lru->used && t->last < lru->last))
            lru = t;
    }
    if (!create)
        return NULL;
    memset(lru, 0, sizeof *lru);
    lru->used = true;
    lru->tenant = tenant;
    return lru;
}

static web_bucket *bucket_at(web_tenant *t, int64_t now)
{
    int64_t start = now - now % WEB_BUCKET_S;
    web_bucket *b = &t->b[(start / WEB_BUCKET_S) % WEB_BUCKETS];
    if (b->t != start) {
        memset(b, 0, sizeof *b);
        b->t = start;
    }
    return b;
}

static void note_prefix(srv_web *w, const web_pending *p, int64_t cached, double now)
{
    int n = cached < p->n ? (int)cached : p->n;
    uint64_t h = XXH3_64bits_withSeed(p->tokens, (size_t)n * sizeof(int32_t), p->tenant);
    web_prefix *slot = NULL;
    for (int i = 0; i < WEB_PREFIXES; i++) {
        web_prefix *x = &w->prefixes[i];
        if (x->used && x->tenant == p->tenant && x->hash == h && x->n == n) {
            slot = x;
            break;
        }
        if (!slot || !x->used ||
            (slot->used && (x->uses < slot->uses || (x->uses == slot->uses && x->last < slot->last))))
            slot = x;
    }
    if (!(slot->used && slot->tenant == p->tenant && slot->hash == h && slot->n == n)) {
        memset(slot, 0, sizeof *slot);
        slot->used = true;
        slot->tenant = p->tenant;
        slot->hash = h;
        slot->n = n;
        memcpy(slot->tokens, p->tokens, (size_t)n * sizeof(int32_t));
    }
    slot->uses++;
    slot->saved += (uint64_t)cached;
    slot->last = (uint64_t)now;
}

static void note_named(srv_web *w, const web_pending *p, const cairn_event *ev, double now)
{
    web_named *slot = NULL;
    for (int i = 0; i < WEB_NAMED; i++) {
        web_named *x = &w->named[i];
        if (x->used && x->tenant == p->tenant && strcmp(x->name, p->name) == 0) {
            slot = x;
            break;
        }
        if (!slot || !x->used || (slot->used && x->last < slot->last))
            slot = x;
    }
    memset(slot, 0, sizeof *slot);
    slot->used = true;
    slot->tenant = p->tenant;
    snprintf(slot->name, sizeof slot->name, "%s", p->name);
    slot->last = w->serial;
    slot->prompt = ev->prompt_tokens;
    slot->cached = ev->cached_tokens;
    memcpy(slot->by_tier, ev->cached_by_tier, sizeof slot->by_tier);
    slot->at = now;
}

void srv_http_note_event(cairn_server *s, const cairn_event *ev)
{
    srv_web *w = s->http ? s->http->web : NULL;
    if (!w || ev->kind == CAIRN_EV_DELTA)
        return;
    web_pending *p = NULL;
    for (int i = 0; i < WEB_PENDING; i++)
        if (w->pending[i].used && w->pending[i].client == ev->client &&
            w->pending[i].id == ev->id) {
            p = &w->pending[i];
            break;
        }
    if (!(ev->kind == CAIRN_EV_DONE && ev->what == CAIRN_DONE_GENERATION)) {
        if (p && ev->kind == CAIRN_EV_ERROR)
            p->used = false;
        return;
    }
    /* the tenant: the pending entry's, else the connection's */
    srv_conn *c = srv_conn_find(s, ev->client);
    uint64_t tenant = p ? p->tenant : c ? c->tenant : 0;
    double now = cairn_wall_now();
    web_tenant *t = tenant_slot(w, tenant, true);
    t->last = ++w->serial;
    web_bucket *b = bucket_at(t, (int64_t)now);
    for (int i = 0; i < 4; i++)
        b->hit[i] += ev->cached_by_tier[i] > 0 ? (uint64_t)ev->cached_by_tier[i] : 0;
    if (ev->prompt_tokens > ev->cached_tokens)
        b->computed += (uint64_t)(ev->prompt_tokens - ev->cached_tokens);
    b->generated += ev->completion_tokens > 0 ? (uint64_t)ev->completion_tokens : 0;
    b->requests++;
    if (p) {
        if (ev->cached_tokens >= WEB_MIN_PREFIX && p->n > 0)
            note_prefix(w, p, ev->cached_tokens, now);
        if (p->name[0])
            note_named(w, p, ev, now);
        p->used = false;
    }
}

/* ---- the files ------------------------------------------------------------------------------ */

static bool web_on(const hconn *c) { return c->base.srv->http && !c->base.srv->cfg.http.no_web; }

static bool is_info(const char *path, size_t len)
{
    return len == 9 && memcmp(path, "/web/info", 9) == 0;
}

bool http_web_is_page(const hconn *c)
{
    size_t len;
    const char *path = http_path(c, &len);
    return web_on(c) && (cairn_web_find(path, len) != NULL || is_info(path, len));
}

static const char page_headers[] =
    "Cache-Control: no-cache\r\n"
    "X-Content-Type-Options: nosniff\r\n"
    "X-Frame-Options: DENY\r\n"
    "Referrer-Policy: no-referrer\r\n"
    "Cross-Origin-Resource-Policy: same-origin\r\n"
    "Content-Security-Policy: default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'\r\n";

/* ---- /web/state ------------------------------------------------------------------------------ */

/* Is the request's Origin (when it has one) the server's own? */
static bool same_origin(const hconn *c)
{
    if (!c->origin)
        return true; /* not a cross-origin browser request (curl, a script) */
    const char *o = c->origin;
    if (strncasecmp(o, "http://", 7) == 0)
        o += 7;
    else
        return false;
    return c->host && strcasecmp(o, c->host) == 0;
}

typedef struct {
    cairn_service_stats stats;
    bool have_stats;
    json_t *sessions;
} web_state;

static json_t *tiers_json(const cairn_server *s, const cairn_service_stats *st)
{
    json_t *a = json_array();
    const cairn_service_config *sc = &s->cfg.service;
    size_t page_bytes = st->tiers[0].pages ? st->tiers[0].bytes / st->tiers[0].pages : 0;
    for (int t = 0; t < 3 && a; t++) {
        json_t *o = json_pack("{s:s, s:I, s:I, s:I, s:I}", "name", tier_names[t], "pages",
                              (json_int_t)st->tiers[t].pages, "bytes",
                              (json_int_t)st->tiers[t].bytes, "tree_pages",
                              (json_int_t)st->pages[t], "hit_tokens",
                              (json_int_t)st->cached_tokens_by_tier[t]);
        if (!o)
            continue;
        bool on = t == 0 || (t == 1 && (sc->host_bytes || sc->cache_dir)) ||
                  (t == 2 && sc->cache_dir);
        json_object_set_new(o, "on", json_boolean(on));
        if (t == 0) {
            json_object_set_new(o, "capacity_pages", json_integer((json_int_t)st->device_pages_total));
            json_object_set_new(o, "free_pages", json_integer((json_int_t)st->device_pages_free));
            if (page_bytes)
                json_object_set_new(o, "capacity_bytes",
                                    json_integer((json_int_t)(page_bytes * st->device_pages_total)));
        } else {
            size_t cap = t == 1 ? (sc->host_bytes ? sc->host_bytes : sc->cache_dir ? 256u << 20 : 0)
                                : (sc->disk_bytes ? sc->disk_bytes : (size_t)4 << 30);
            if (on && cap)
                json_object_set_new(o, "capacity_bytes", json_integer((json_int_t)cap));
        }
        json_array_append_new(a, o);
    }
    json_t *sh = json_pack("{s:s, s:b, s:b, s:I, s:I, s:I}", "name", "shared", "on",
                           (int)st->shared.on, "up", (int)st->shared.up, "hit_tokens",
                           (json_int_t)st->cached_tokens_by_tier[3], "reads_hit",
                           (json_int_t)st->shared.hits, "writes", (json_int_t)st->shared.puts);
    if (a && sh)
        json_array_append_new(a, sh);
    return a;
}

static json_t *series_json(srv_web *w, uint64_t tenant, int64_t now)
{
    web_tenant *t = tenant_slot(w, tenant, false);
    json_t *a = json_array();
    int64_t last = now - now % WEB_BUCKET_S;
    for (int i = WEB_BUCKETS - 1; i >= 0 && a; i--) {
        int64_t start = last - (int64_t)i * WEB_BUCKET_S;
        const web_bucket *b = t ? &t->b[(start / WEB_BUCKET_S) % WEB_BUCKETS] : NULL;
        if (b && b->t != start)
            b = NULL;
        json_array_append_new(
            a, json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "t", (json_int_t)start,
                         "device", (json_int_t)(b ? b->hit[0] : 0), "host",
                         (json_int_t)(b ? b->hit[1] : 0), "disk", (json_int_t)(b ? b->hit[2] : 0),
                         "shared", (json_int_t)(b ? b->hit[3] : 0), "computed",
                         (json_int_t)(b ? b->computed : 0), "generated",
                         (json_int_t)(b ? b->generated : 0), "requests",
                         (json_int_t)(b ? b->requests : 0)));
    }
    return a;
}

static json_t *prefixes_json(srv_web *w, uint64_t tenant)
{
    const web_prefix *top[10];
    int n = 0;
    for (int i = 0; i < WEB_PREFIXES; i++) {
        const web_prefix *x = &w->prefixes[i];
        if (!x->used || x->tenant != tenant)
            continue;
        int at = n < 10 ? n++ : 10;
        while (at > 0 && (top[at - 1]->uses < x->uses ||
                          (top[at - 1]->uses == x->uses && top[at - 1]->saved < x->saved))) {
            if (at < 10)
                top[at] = top[at - 1];
            at--;
        }
        if (at < 10)
            top[at] = x;
    }
    json_t *a = json_array();
    for (int i = 0; i < n && a; i++) {
        json_t *toks = json_array();
        for (int k = 0; k < top[i]->n && toks; k++)
            json_array_append_new(toks, json_integer(top[i]->tokens[k]));
        json_array_append_new(a, json_pack("{s:o, s:I, s:I, s:I}", "tokens", toks, "uses",
                                           (json_int_t)top[i]->uses, "saved_tokens",
                                           (json_int_t)top[i]->saved, "last",
                                           (json_int_t)top[i]->last));
    }
    return a;
}

static int cmp_entry(const void *a, const void *b)
{
    const cairn_session_entry *x = a, *y = b;
    return x->last_used < y->last_used ? 1 : x->last_used > y->last_used ? -1 : 0;
}

static json_t *sessions_json(srv_web *w, uint64_t tenant, const cairn_event *ev)
{
    json_t *a = json_array();
    cairn_session_entry *list = NULL;
    if (ev->n_listed && (list = malloc(ev->n_listed * sizeof *list))) {
        memcpy(list, ev->sessions, ev->n_listed * sizeof *list);
        qsort(list, ev->n_listed, sizeof *list, cmp_entry);
    }
    for (size_t i = 0; list && i < ev->n_listed && a; i++) {
        const cairn_session_entry *e = &list[i];
        char hex[33];
        cairn_session_id_to_hex(e->id, hex);
        json_t *o = json_pack("{s:s, s:s, s:I, s:b, s:b}", "id", hex, "name", e->name, "tokens",
                              (json_int_t)e->n_tokens, "persisted", (int)e->persist, "busy",
                              (int)e->busy);
        if (!o)
            continue;
        /* where its last turn's prompt was found (named sessions this
         * server has seen a turn of) */
        for (int k = 0; e->name[0] && k < WEB_NAMED; k++) {
            const web_named *x = &w->named[k];
            if (!x->used || x->tenant != tenant || strcmp(x->name, e->name) != 0)
                continue;
            json_t *bt = json_object();
            for (int t = 0; t < 4 && bt; t++)
                json_object_set_new(bt, tier_names[t], json_integer(x->by_tier[t]));
            json_object_set_new(o, "last_turn",
                                json_pack("{s:I, s:I, s:o, s:I}", "prompt_tokens",
                                          (json_int_t)x->prompt, "cached_tokens",
                                          (json_int_t)x->cached, "cached_by_tier", bt, "at",
                                          (json_int_t)x->at));
            break;
        }
        json_array_append_new(a, o);
    }
    free(list);
    return a;
}

static void answer_state(hconn *c, hreq *q)
{
    cairn_server *s = c->base.srv;
    web_state *ws = q->wire_state;
    const cairn_service_stats *st = &ws->stats;
    uint64_t tenant = c->base.tenant;
    bool tenants = cairn_access_has_tenants(s->access);
    int64_t now = (int64_t)cairn_wall_now();
    json_t *o = json_pack("{s:I, s:s, s:b, s:I, s:o, s:{s:I, s:o}, s:o, s:o}", "now",
                          (json_int_t)now, "model", s->model_id, "tenants", (int)tenants,
                          "page_size", (json_int_t)s->cfg.service.page_size, "tiers",
                          tiers_json(s, st), "series", "bucket_s", (json_int_t)WEB_BUCKET_S,
                          "points", series_json(s->http->web, tenant, now), "sessions",
                          ws->sessions ? json_incref(ws->sessions) : json_array(), "prefixes",
                          prefixes_json(s->http->web, tenant));
    if (o && !tenants) /* server-wide counters: only where there is one tenant */
        json_object_set_new(
            o, "totals",
            json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "requests", (json_int_t)st->queries,
                      "prompt_tokens", (json_int_t)st->prompt_tokens, "cached_tokens",
                      (json_int_t)st->cached_tokens, "generated_tokens",
                      (json_int_t)st->generated_tokens, "running", (json_int_t)st->running,
                      "waiting", (json_int_t)st->waiting, "sessions", (json_int_t)st->sessions));
    c->active = NULL;
    if (!o)
        http_respond_error(c, 503, "out of memory", NULL, NULL);
    else {
        http_respond_json(c, 200, o);
        json_decref(o);
    }
    http_request_free(q);
}

void http_web_on_event(hconn *c, hreq *q, int index, const cairn_event *ev)
{
    web_state *ws = q->wire_state;
    if (ev->kind == CAIRN_EV_ERROR) {
        http_request_fail(c, q, http_status_of(ev->code), ev->message ? ev->message : "error",
                          NULL, NULL);
        return;
    }
    if (ev->kind != CAIRN_EV_DONE)
        return;
    if (index == 0 && ev->what == CAIRN_DONE_STATS) {
        ws->stats = ev->stats;
        ws->have_stats = true;
    } else if (index == 1 && ev->what == CAIRN_DONE_SESSION_LIST) {
        ws->sessions = sessions_json(c->base.srv->http->web, c->base.tenant, ev);
    } else {
        return;
    }
    q->choices[index].over = true;
    if (++q->n_over == q->n_choices)
        answer_state(c, q);
}

static void web_state_free(hreq *q)
{
    web_state *ws = q->wire_state;
    if (ws)
        json_decref(ws->sessions);
    free(ws);
}

/* A hook table with only `free`: the state request is no wire format, but
 * http_request_free frees wire_state through it. */
static const http_wire web_state_wire = {.free = web_state_free};

static void handle_state(hconn *c)
{
    if (!same_origin(c)) {
        http_respond_error(c, 403, "the page may be read only from its own origin", NULL, NULL);
        return;
    }
    hreq *q = calloc(1, sizeof *q);
    hchoice *ch = calloc(2, sizeof *ch);
    web_state *ws = calloc(1, sizeof *ws);
    cairn_request *r0 = cairn_request_new(CAIRN_REQ_CACHE_STATS);
    cairn_request *r1 = cairn_request_new(CAIRN_REQ_SESSION_LIST);
    if (!q || !ch || !ws || !r0 || !r1) {
        free(q);
        free(ch);
        free(ws);
        cairn_request_free(r0);
        cairn_request_free(r1);
        http_respond_error(c, 503, "out of memory", NULL, NULL);
        return;
    }
    q->kind = HK_WEB;
    q->wire = &web_state_wire;
    q->wire_state = ws;
    q->choices = ch;
    q->n_choices = 2;
    ch[0].msgid = ++c->next_msgid;
    ch[1].msgid = ++c->next_msgid;
    r0->id = ch[0].msgid;
    r1->id = ch[1].msgid;
    c->active = q;
    int rc0 = srv_submit(&c->base, r0);
    int rc1 = srv_submit(&c->base, r1);
    if (rc0 != CAIRN_OK || rc1 != CAIRN_OK)
        http_request_fail(c, q, 503, "the engine is not accepting requests", NULL, NULL);
}

bool http_web_route(hconn *c)
{
    if (!web_on(c))
        return false;
    size_t len;
    const char *path = http_path(c, &len);
    const unsigned method = c->parser.method;
    bool get = method == HTTP_GET || method == HTTP_HEAD;
    if (len == 10 && memcmp(path, "/web/state", 10) == 0) {
        if (!get) {
            http_respond(c, 405, "text/plain", "", 0, "Allow: GET, HEAD\r\n");
            return true;
        }
        handle_state(c);
        return true;
    }
    if (is_info(path, len)) {
        /* what the page must know before it has a token: whether to ask */
        if (!get) {
            http_respond(c, 405, "text/plain", "", 0, "Allow: GET, HEAD\r\n");
            return true;
        }
        const cairn_access *acc = c->base.srv->access;
        char body[96];
        int n = snprintf(body, sizeof body, "{\"auth_required\":%s,\"tenants\":%s}",
                         cairn_access_required(acc) ? "true" : "false",
                         cairn_access_has_tenants(acc) ? "true" : "false");
        http_respond(c, 200, "application/json", body, (size_t)n, page_headers);
        return true;
    }
    const cairn_web_asset *a = cairn_web_find(path, len);
    if (!a)
        return false;
    if (!get) {
        http_respond(c, 405, "text/plain", "", 0, "Allow: GET, HEAD\r\n");
        return true;
    }
    http_respond(c, 200, a->content_type, (const char *)a->data, a->len, page_headers);
    return true;
}
