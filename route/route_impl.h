/*
 * route/route_impl.h — the router's own structures, shared by the files of
 * route/ (nothing outside route/ includes this):
 *
 *   index.c       chained hash -> replicas; a prompt's page hashes
 *   pick.c        the cost and the choice
 *   net.c         a libuv TCP stream with a copying write queue
 *   replicas.c    the replica registry, health checks, the choice for a request
 *   sessions.c    sticky sessions: key -> replica slot (bounded, LRU)
 *   events.c      the Redis Stream reader (its own thread)
 *   proxy_http.c  HTTP: parse, decode, forward, stream the answer back
 *   proxy_rpc.c   msgpack-RPC: delimit, decode, forward per replica, relay
 *   router.c      the loop, listeners, signals, /router/health and metrics
 */
#ifndef CAIRN_ROUTE_IMPL_H
#define CAIRN_ROUTE_IMPL_H

#include "route/route.h"

#include "api/api.h"
#include "server/server.h"

#include <pthread.h>
#include <sys/socket.h>
#include <uv.h>

/* ---- net.c ------------------------------------------------------------------ */

typedef struct rstream rstream;
struct rstream {
    uv_tcp_t tcp;
    uv_connect_t connect_req;
    uv_shutdown_t shutdown_req;
    void *owner;
    /* bytes arrived (n > 0), or the end (n < 0: EOF or an error; the stream
     * is being closed when this returns unless the callback kept it) */
    void (*on_read)(rstream *s, const char *buf, ssize_t n);
    void (*on_connect)(rstream *s, int status); /* status < 0: failed (then closed) */
    void (*on_close)(rstream *s);               /* the handle is closed: free the owner */
    bool open, closing, reading;
    size_t out_pending; /* bytes handed to libuv and not yet written */
    size_t max_pending; /* more than this unwritten: the peer does not read,
                           the stream is closed (0: no limit)              */
};

void rstream_init(uv_loop_t *loop, rstream *s, void *owner);
int rstream_accept(uv_stream_t *listener, rstream *s);
int rstream_connect(rstream *s, const struct sockaddr *addr);
void rstream_read(rstream *s, bool on);
/* Copies; a failed write closes the stream. */
void rstream_write(rstream *s, const void *data, size_t len);
void rstream_close(rstream *s);
/* Close once what was written has gone (FIN first). */
void rstream_finish(rstream *s);

/* "HOST:PORT" (numeric or a name, resolved now) -> address. */
int route_parse_hostport(const char *text, struct sockaddr_storage *out);

/* ---- replicas ------------------------------------------------------------------ */

/* What the registry knows of a replica (shared with the events thread:
 * under reg_mu). */
typedef struct {
    bool used;        /* the slot belongs to a replica                    */
    bool gone;        /* it said bye: nothing is routed to it             */
    bool is_static;   /* given with --replica                             */
    char id[128];
    char http[128], rpc[128]; /* "HOST:PORT" or ""                         */
    struct sockaddr_storage http_addr, rpc_addr;
    bool has_http_addr, has_rpc_addr;
    uint8_t ns[ROUTE_HASH_BYTES];
    bool has_ns;
    int ps;
    uint64_t generation; /* bumped when its addresses change              */
} route_reg_entry;

typedef struct hup hup;

/* The loop thread's state of a replica. */
typedef struct {
    bool up;
    int fails;           /* health checks failed in a row                 */
    int unanswered;      /* of which timed out (no refusal, no answer)    */
    void *check;         /* the health check on its way, or NULL          */
    uint64_t generation; /* of the registry entry the state belongs to    */
    route_load load;
    uint64_t routed, prompt_tokens, predicted_cached_tokens, failures;
    hup *idle;           /* keep-alive HTTP connections to it              */
    int n_idle;
} route_live;

/* Counters /router/metrics reports. */
typedef struct {
    uint64_t requests_http, requests_rpc;
    uint64_t undecodable;        /* sent on unchanged to any replica           */
    uint64_t no_replica;         /* refused: no healthy replica                */
    uint64_t replica_errors;     /* requests a replica failed mid-way          */
    uint64_t session_moves;      /* sessions sent elsewhere: their replica down */
    uint64_t events, events_bad;
    uint64_t stream_resets;
} route_counters;

typedef struct route_sessions route_sessions;

struct cairn_router {
    uv_loop_t loop;
    bool loop_ready;
    route_config cfg;
    char *prefix;
    cairn_gguf *gguf;
    cairn_vocab *vocab;
    cairn_chat_template *chat;
    cairn_api api;
    cairn_access *access;        /* --tenants, or NULL                         */
    route_index *index;

    pthread_mutex_t reg_mu;
    route_reg_entry reg[ROUTE_MAX_REPLICAS];
    route_live live[ROUTE_MAX_REPLICAS];
    int rr_cursor;

    route_sessions *sessions;
    route_counters counters;     /* counters.events* are the events thread's:
                                    read with atomics                          */

    uv_tcp_t http_listener, rpc_listener;
    bool has_http, has_rpc;
    int http_port, rpc_port;
    uv_timer_t health_timer;
    struct hclient *http_clients; /* every HTTP client connection (proxy_http.c) */
    struct rclient *rpc_clients;  /* every msgpack client connection (proxy_rpc.c) */
    double last_sweep;           /* of expired predictions                      */
    uv_signal_t sigint, sigterm;
    bool stopping;

    /* events thread */
    pthread_t events_thread;
    bool has_events_thread;
    int events_stop;             /* atomics: the loop tells the thread to end, */
    int events_connected;        /* the thread tells whether it has Redis      */
};

/* Registry (replicas.c). The *_locked ones expect reg_mu held. */
int route_reg_find_locked(cairn_router *r, const char *id);
/* The slot of `id`, created when absent; NULL addresses keep the known ones.
 * -1 when every slot is taken. */
int route_reg_upsert_locked(cairn_router *r, const char *id, const char *http, const char *rpc);
int route_replicas_add_static(cairn_router *r, const route_replica_spec *spec, char *err,
                              size_t err_len);
void route_health_start(cairn_router *r);
/* A connection to the replica failed: down at once. */
void route_replica_failed(cairn_router *r, int slot, const char *why);

/* One routing decision: what the request is, and what the router decided. */
typedef struct {
    /* in */
    const int32_t *tokens;   /* prompt tokens, or NULL (not decoded)          */
    size_t n_tokens;
    int64_t max_tokens;      /* <= 0: unknown                                 */
    uint64_t tenant;
    const char *sticky;      /* a session's key ("s:HEX", "k:TENANT:KEY"), or NULL */
    uint64_t exclude;        /* slots not to use (they just failed)           */
    bool need_http, need_rpc;
    /* out */
    int slot;
    int64_t cached;          /* predicted cached tokens on it                 */
    int64_t uncached, decode; /* what was added to its load                   */
    bool moved;              /* a sticky session moved off a down replica     */
    uint8_t (*hashes)[ROUTE_HASH_BYTES]; /* the prompt's pages on that replica
                                (owned; route_done frees them)              */
    size_t n_pages;
} route_choice;

/* Choose (fills c->slot, -1 when no replica is up), add the request to that
 * replica's load and record the prediction. */
void route_choose(cairn_router *r, route_choice *c);
/* The request has been answered in part: its prompt is computed (the first
 * token came), and `tokens` more were generated. Takes that much off its
 * replica's queued work. */
void route_progress(cairn_router *r, route_choice *c, int64_t tokens);
/* The request is over: take it off the load; ok: renew the prediction. */
void route_done(cairn_router *r, route_choice *c, bool ok); /* c->slot -1 after */

/* sessions.c */
int route_sessions_create(size_t cap, route_sessions **out);
void route_sessions_free(route_sessions *m);
int route_sessions_get(route_sessions *m, const char *key); /* -1: unknown */
void route_sessions_set(route_sessions *m, const char *key, int slot);
void route_sessions_del(route_sessions *m, const char *key);
size_t route_sessions_count(const route_sessions *m);

/* events.c */
int route_events_start(cairn_router *r, char *err, size_t err_len);
void route_events_stop(cairn_router *r);

/* proxy_http.c, proxy_rpc.c */
void route_http_accept(cairn_router *r, uv_stream_t *listener);
void route_rpc_accept(cairn_router *r, uv_stream_t *listener);
/* Close client connections past their deadlines (called every health tick):
 * HTTP, no whole request within http_timeout_s of becoming idle (408 when
 * part of one came); msgpack, half a message and no byte for idle_timeout_s. */
void route_http_sweep(cairn_router *r, double now);
void route_rpc_sweep(cairn_router *r, double now);
/* The replica of `slot` stopped answering (hung, not refusing): end the
 * requests in flight on it with an error, as when it dies. */
void route_http_fail_slot(cairn_router *r, int slot);
void route_rpc_fail_slot(cairn_router *r, int slot);
/* Free the idle keep-alive connections of a slot (its replica went down). */
void route_http_drop_idle(cairn_router *r, int slot);

/* router.c */
/* The tenant of a token (0: no tenants file, or a token it does not know). */
uint64_t route_tenant_of(cairn_router *r, const char *token, size_t len);
/* Prometheus text of /router/metrics (malloc'ed). */
char *route_metrics_text(cairn_router *r, size_t *len);
/* {"status": ..., "replicas_up": N}; *status 200 or 503. */
char *route_health_text(cairn_router *r, int *status, size_t *len);

#endif /* CAIRN_ROUTE_IMPL_H */
