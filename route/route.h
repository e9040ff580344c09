/*
 * route/route.h — `cairn route`: a cache-aware router in front of N cairn
 * replicas (docs/scale-out.md, "The router"). A process of its own: it loads
 * no weights, only the model's vocabulary and chat template, so that it can
 * turn a request into exactly the prompt tokens a replica would compute.
 *
 *   clients ──HTTP (OpenAI, Anthropic, everything)──▶ proxy_http.c ─┐
 *           ──msgpack-RPC (docs/protocol.md)────────▶ proxy_rpc.c  ─┤
 *                                                                    │ decode (api/, on
 *                                                                    │ libuv's threadpool)
 *                                                                    ▼
 *   Redis stream "P events" ──events.c (own thread)──▶ index.c ──▶ choose a replica
 *   (hello/stored/removed/bye)        chained page hash → replicas   (route_cost, pick.c)
 *                                                                    │
 *   replicas.c: addresses, health (GET /health every second), load ◀┘
 *                                                                    ▼
 *                                            the request, unchanged, to that replica;
 *                                            its answer (SSE streams, gen.delta
 *                                            notifications) back, unchanged
 *
 * Choosing a replica
 * ------------------
 * A request the router can decode (api/api.h, the same code a replica runs)
 * has prompt tokens t[0..n). With the replica's page size ps and namespace
 * root (from its hello/stored events) the router computes the chained page
 * hashes h_0 .. h_{k-1}, k = (n - 1) / ps (the last token is always
 * computed, so only those pages can be a hit; scaleout-contract), seeded by
 * the tenant word as the replicas seed theirs. For every replica r the index
 * gives the longest run h_0 .. h_{m_r - 1} that r has announced (m_r pages,
 * cached_r = m_r * ps tokens), and the router sends the request to the
 * healthy replica with the least
 *
 *     cost(r) = (1 + work_weight) * (n - cached_r)   its own prefill: the
 *                                                    request waits for it, and
 *                                                    the cluster computes it
 *             + queued_prefill(r)                    uncached prompt tokens of the
 *                                                    requests in flight to r
 *             + decode_weight * queued_decode(r)     their expected remaining
 *                                                    decode tokens (min(max_tokens,
 *                                                    decode_estimate) each)
 *
 * (route_cost; the queue shrinks as answers stream: a request's prompt
 * counts until its first token, each delta takes a decode token off). The
 * last two terms are the wait in r's queue, the first the
 * request's own prefill counted once as its wait and work_weight more times
 * as work the cluster does for it (default 1): a replica that holds a
 * prefix is preferred until its queue is longer than another's by
 * (1 + work_weight) times the tokens it would save — "the longest cached
 * prefix unless that overloads it". A decode token weighs decode_weight
 * prefill tokens (default 4: on a batched engine a decode step costs about
 * what a few prompt tokens do; `--decode-weight`). Ties go to the replica
 * with fewer requests in flight, then to the next one after the last chosen
 * (so cold requests spread). `--policy round-robin` ignores the cache and
 * the load (a baseline).
 *
 * Predictions. Events arrive after a replica has computed the pages, so the
 * router also records, when it sends a request, that its replica will hold
 * the prompt's pages ("predicted" entries, with a time to live that the end
 * of the request renews); an event confirms them, a "removed" event or the
 * expiry ends them. A second request for a document still being computed
 * thus follows the first instead of computing it again elsewhere.
 *
 * Sessions stick: a request naming a native session (session.* with
 * session_id) or an HTTP session key (session_id, prompt_cache_key,
 * X-Session-Id) goes to the replica that holds it, learned from the answers
 * that create one (session.open, session.fork) and from the first request
 * that names it. When that replica is down the session goes to another,
 * which loads its record from the shared tier (the replica side), and stays
 * there. Requests that cannot be decoded go to any healthy replica unchanged:
 * the replica answers them with the right error.
 *
 * Threads
 * -------
 *   loop thread    every socket, the replica table's connection state, the
 *                  session map, the load counters.
 *   threadpool     decoding (tokenizing documents, rendering templates).
 *   events thread  a blocking hiredis connection: XREAD from 0-0 (so a
 *                  restarted router rebuilds its index from the stream),
 *                  then blocking XREADs; it writes the index and the
 *                  replica registry, both under their own mutexes.
 *
 * Failures: a replica that refuses a connection is down at once (what it
 * runs goes on: a draining replica refuses new connections); three failed
 * health checks in a row make it down, and when they failed for want of an
 * answer (a hung replica) its requests in flight are ended; one good check
 * brings it back. A request whose replica fails mid-way gets an error (HTTP
 * 502 before the answer started; an SSE error event and a closed connection
 * after; a msgpack error response with type "internal"), never a hang. A
 * request that reached no replica (refused connection, a stale keep-alive
 * connection) is sent again, elsewhere or on a new connection.
 *
 * The router's own HTTP paths are /router/health and /router/metrics; every
 * other path is proxied (docs/scale-out.md, "The router").
 */
#ifndef CAIRN_ROUTE_H
#define CAIRN_ROUTE_H

#include "common/common.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ROUTE_MAX_REPLICAS 64 /* replica slots: one bit each in the index */
#define ROUTE_HASH_BYTES 16

/* ======================================================================== */
/* 1. The index: chained page hash -> the replicas that hold that page       */
/* ======================================================================== */
/*
 * A chained hash table of 16-byte page hashes (canonical big-endian form,
 * as the events carry them). Each entry has two replica bit masks: confirmed
 * (from "stored" events) and predicted (by the router itself, until
 * `predicted_until`). Thread-safe: every call takes the index's mutex.
 */
typedef struct route_index route_index;

int route_index_create(route_index **out);
void route_index_free(route_index *ix);

/* `slot` holds these pages (a "stored" event). */
int route_index_store(route_index *ix, int slot, const uint8_t (*hashes)[ROUTE_HASH_BYTES],
                      size_t n);
/* `slot` no longer holds them ("removed"): confirmed and predicted both end. */
void route_index_remove(route_index *ix, int slot, const uint8_t (*hashes)[ROUTE_HASH_BYTES],
                        size_t n);
/* The router sent these pages' prompt to `slot`: predicted until `until`
 * (cairn_now() seconds); an earlier prediction is extended. */
int route_index_predict(route_index *ix, int slot, const uint8_t (*hashes)[ROUTE_HASH_BYTES],
                        size_t n, double until);
/* Forget everything of a slot (its replica said bye or hello again). */
void route_index_drop_slot(route_index *ix, int slot);
/* Forget everything (the stream was reset). */
void route_index_clear(route_index *ix);
/* For every slot whose bit is in `slots`: the number of leading pages of
 * hashes[0..n) it holds (confirmed, or predicted and not expired at `now`),
 * into pages[slot]; other slots get 0. */
void route_index_match(route_index *ix, uint64_t slots, const uint8_t (*hashes)[ROUTE_HASH_BYTES],
                       size_t n, double now, uint32_t pages[ROUTE_MAX_REPLICAS]);
/* Forget the predictions that ended before `now` (match forgets those it
 * meets; this sweeps the rest, so pages no prompt asks for again go too). */
void route_index_expire(route_index *ix, double now);
size_t route_index_entries(route_index *ix);

/* ======================================================================== */
/* 2. Page hashes of a prompt (scaleout-contract "Hashes the router computes") */
/* ======================================================================== */

/* The hashes of the first `n_pages` whole pages of tokens (n_pages * ps <=
 * n_tokens) under namespace root `root` (16 bytes, canonical) and tenant
 * word `tenant` (0: no tenants), into out[n_pages]. */
void route_prompt_hashes(const uint8_t root[ROUTE_HASH_BYTES], uint64_t tenant, int ps,
                         const int32_t *tokens, size_t n_pages,
                         uint8_t (*out)[ROUTE_HASH_BYTES]);
/* The pages of a prompt of n tokens that can be a cache hit: (n - 1) / ps. */
size_t route_useful_pages(size_t n_tokens, int ps);

/* ======================================================================== */
/* 3. The cost of sending a request to a replica, and the choice            */
/* ======================================================================== */

/* What the router has in flight to one replica. */
typedef struct {
    int64_t prefill; /* uncached prompt tokens of its requests in flight       */
    int64_t decode;  /* their expected remaining decode tokens                 */
    int inflight;    /* their number                                           */
} route_load;

/* The weights of the cost (see "Choosing a replica" above). */
typedef struct {
    double work;   /* work_weight: extra weight of the request's own prefill (1) */
    double decode; /* decode_weight: prefill tokens a queued decode token is (4) */
} route_weights;

/* cost = (1 + w.work) * (n_prompt - cached) + load.prefill
 *        + w.decode * load.decode   (cached clamped to [0, n_prompt]; load
 * NULL: none). */
double route_cost(int64_t n_prompt, int64_t cached, const route_load *load,
                  const route_weights *w);

/* One replica as the choice sees it. */
typedef struct {
    int slot;
    bool up;
    int64_t cached;  /* tokens of the prompt it holds (pages * ps)             */
    route_load load;
} route_candidate;

typedef enum { ROUTE_POLICY_CACHE = 0, ROUTE_POLICY_ROUND_ROBIN } route_policy;

/* Index into c[0..n) (in increasing slot order) of the replica to use, or
 * -1 when none is up. *cursor is a slot: the scan starts at the first
 * candidate whose slot is >= *cursor and wraps around. CACHE: the least
 * route_cost, ties by fewer in flight, then the first in scan order.
 * ROUND_ROBIN: the first one up in scan order. *cursor becomes the chosen
 * slot + 1. */
int route_pick(route_policy policy, const route_candidate *c, int n, int64_t n_prompt,
               const route_weights *w, int *cursor);

/* Expected decode tokens of a request asking for at most max_tokens
 * (<= 0: until the context ends) when a typical reply is `estimate`. */
int64_t route_expected_decode(int64_t max_tokens, int64_t estimate);

/* ======================================================================== */
/* 4. The router process                                                    */
/* ======================================================================== */

typedef struct {
    const char *id;   /* NULL: "HOST:PORT" of http, else of rpc (the contract's default) */
    const char *http; /* "HOST:PORT" or NULL                                 */
    const char *rpc;  /* "HOST:PORT" or NULL                                 */
} route_replica_spec;

typedef struct {
    const char *model_path;     /* GGUF: vocabulary and chat template only     */
    const char *host;           /* listen address (default 127.0.0.1)          */
    int http_port;              /* -1: none; 0: any (default 8080)             */
    int rpc_port;               /* -1: none (default); 0: any                  */
    const char *redis_url;      /* redis://HOST:PORT or unix:///path; NULL: no events */
    const char *prefix;         /* key prefix (default "cairn:")               */
    const route_replica_spec *replicas; /* static replicas                    */
    int n_replicas;
    const char *tenants_path;   /* --tenants: derive the tenant word           */
    route_policy policy;
    route_weights weights;      /* default {1, 4}                              */
    int64_t decode_estimate;    /* default 128                                 */
    double predict_ttl_s;       /* default 30                                  */
    double health_interval_s;   /* default 1                                   */
    int health_failures;        /* checks failed in a row that make it down (3) */
    int page_size;              /* of replicas whose events have not said (16) */
    size_t max_body_bytes;      /* HTTP request body (default 4 MiB)           */
    size_t max_header_bytes;    /* HTTP request head (default 32 KiB)          */
    size_t max_sessions;        /* sticky sessions remembered (default 100000) */
    double http_timeout_s;      /* a whole HTTP request within this (30)       */
    size_t max_output_bytes;    /* unread output per client (64 MiB)           */
    double idle_timeout_s;      /* half a msgpack message, then silence (60)   */
} route_config;

void route_config_default(route_config *cfg);

typedef struct cairn_router cairn_router;

/* Load the vocabulary, bind the listeners, start the events thread. */
int cairn_router_create(const route_config *cfg, cairn_router **out, char *err, size_t err_len);
int cairn_router_http_port(const cairn_router *r);
int cairn_router_rpc_port(const cairn_router *r);
/* Until SIGINT/SIGTERM. */
int cairn_router_run(cairn_router *r);
void cairn_router_free(cairn_router *r);

#ifdef __cplusplus
}
#endif
#endif /* CAIRN_ROUTE_H */
