/*
 * server/server_impl.h — the loop thread's own structures, shared by the
 * files of server/ and its two protocols (nothing outside server/ includes
 * this):
 *
 *   server.c         listeners, the engine-event queue, shutdown
 *   conn.c           the connection core: libuv handle rules, written once
 *   work.c           text work on libuv's threadpool
 *   access.c         who may connect (server.h, section 1)
 *   msgpack/         the native protocol: codec (msgpack.h) and connections
 *   http/            the OpenAI-compatible facade
 *
 * A connection, whatever its protocol:
 *
 *     accept ──▶ attached (in the table: requests go out, events come back)
 *                   │ a final error answered          │ EOF, error, timeout,
 *                   ▼                                 │ backpressure, shutdown
 *                lingering (detached; FIN sent,       │
 *                waiting for EOF or LINGER_S) ────────┤
 *                                                     ▼
 *                                    closing (uv_close on stream and timer)
 *                                                     │ both close callbacks
 *                                                     ▼
 *                                    freed (ops->on_free, then the memory)
 *
 * Leaving the table (linger or close) tells the engine the client is gone
 * (CAIRN_REQ_CLIENT_GONE: its work is cancelled, its pages released), and
 * from then on its events are dropped. Nothing holds a connection pointer
 * across the threadpool: work items name their connection by id, or are
 * told it has gone.
 */
#ifndef CAIRN_SERVER_IMPL_H
#define CAIRN_SERVER_IMPL_H

#include "server/server.h"
#include "api/api.h"

#include <pthread.h>
#include <uv.h>

#define SRV_READ_CHUNK (64 * 1024)
#define SRV_LINGER_S 5.0    /* after a final answer: how long to wait for EOF */
#define SRV_N_BUCKETS 4096  /* client ids are sequential: id % N spreads evenly */

typedef struct srv_conn srv_conn;
typedef struct srv_http srv_http; /* the HTTP facade's state (http/http.h) */

/* An engine event copied off the engine thread (server.c); its pointers
 * point into the node, which a protocol may keep (and then frees). */
typedef struct srv_event {
    struct srv_event *next;
    cairn_event ev;
} srv_event;

/* What a protocol does with its connections. */
typedef struct {
    const char *name;                            /* "msgpack", "http": logs  */
    void (*on_input)(srv_conn *c);               /* bytes arrived in in[in_off .. in_len) */
    /* an engine event for it: true when the protocol keeps the node (it
     * frees it later with free()), false when the server may free it */
    bool (*on_event)(srv_conn *c, srv_event *node);
    void (*on_detach)(srv_conn *c);              /* it left the table (may be NULL) */
    bool (*busy)(srv_conn *c);                   /* a request of it runs: draining
                                                    waits for it (NULL: never) */
    void (*on_free)(srv_conn *c);                /* its handles are closed: free what the
                                                    protocol added (may be NULL) */
} srv_conn_ops;

/* The core of every connection; a protocol's connection begins with it. */
struct srv_conn {
    union {
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } sock;
    uv_stream_t *stream;     /* &sock.tcp or &sock.pipe                      */
    uv_timer_t timer;        /* the protocol's deadlines; the linger deadline */
    void (*on_timer)(srv_conn *c);
    cairn_server *srv;
    const srv_conn_ops *ops;
    uint64_t id;             /* never reused: events and work find it by id */
    uint64_t tenant;         /* given to every request (0: no tenants)       */
    const char *tenant_name; /* owned by the server's cairn_access           */
    bool authed;             /* may make requests                            */
    int open_handles;        /* handles not yet closed; freed at 0           */
    bool attached, closing, lingering;
    bool reading_paused;     /* the protocol has too much work queued        */
    /* Input: in[in_off .. in_len) is what the protocol has not consumed. */
    uint8_t *in;
    size_t in_len, in_off, in_cap;
    uv_shutdown_t shutdown_req;
    srv_conn *next;                /* bucket chain                          */
    srv_conn *all_prev, *all_next; /* every connection until it is freed    */
};

struct cairn_server {
    uv_loop_t loop;
    bool loop_ready;
    uv_tcp_t tcp, http_tcp;
    bool has_tcp, has_http;
    int tcp_port, http_port;
    char tcp_desc[128], http_desc[160];
    uv_pipe_t pipe;
    bool has_pipe;
    char *unix_path;
    uv_signal_t sigint, sigterm;
    bool has_signals;
    uv_async_t events_async, stop_async;
    bool has_asyncs;

    cairn_server_config cfg;
    cairn_access *access;     /* credentials; requires nothing when there are none */
    cairn_mp_limits preauth_limits;
    cairn_runtime *rt;        /* opened after binding, closed after the loop */
    cairn_service *svc;
    cairn_api api;            /* what requests mean (api/api.h)              */
    uint64_t next_client_id;
    uint64_t seed_state;      /* seeds of requests without one (loop thread) */
    bool stopping;
    bool draining;            /* a signal came: finishing what runs          */
    bool drain_ended;         /* the drain's time is up: requests were ended  */
    uv_timer_t drain_timer;
    bool has_drain_timer;
    uint64_t drain_started_ms;
    srv_http *http;           /* the OpenAI facade, when configured          */
    char model_id[256];       /* the id /v1/models reports                   */

    srv_conn *buckets[SRV_N_BUCKETS]; /* attached connections by id            */
    srv_conn *all;            /* every connection until its memory is freed   */

    uint64_t misses[CAIRN_MISS_REASONS]; /* generations whose prompt was not
                                 all cached, by final reason (explain.c)   */
    pthread_mutex_t queue_mu; /* engine thread -> loop: copied events       */
    srv_event *queue_head, *queue_tail;
};

/* ---- conn.c --------------------------------------------------------------- */

/* Accept a connection of `size` bytes (a protocol struct that begins with a
 * srv_conn) from `listener`, attach it and start reading. NULL when it could
 * not be accepted (it stays in the backlog, or is closed). */
srv_conn *srv_conn_accept(cairn_server *s, uv_stream_t *listener, bool tcp,
                          const srv_conn_ops *ops, size_t size);
srv_conn *srv_conn_find(cairn_server *s, uint64_t id);
/* Send bytes (copied as needed). A client that does not read cannot make
 * the server hold more than max_output_bytes for it: it is disconnected. A
 * failed write closes the connection at once, so callers that write several
 * pieces check c->closing (srv_conn_gone) between them. */
void srv_conn_write(srv_conn *c, const void *data, size_t len);
/* True when nothing more can be written (closing or lingering). */
static inline bool srv_conn_gone(const srv_conn *c)
{
    return !c || c->closing || c->lingering;
}
/* Close now (idempotent). */
void srv_conn_close(srv_conn *c);
/* After a final answer: stop acting on input, let the answer drain, send
 * FIN, and close on the client's EOF (or after SRV_LINGER_S). Closing at
 * once could reset a connection whose client is still sending, and a reset
 * can destroy the answer unread. */
void srv_conn_linger(srv_conn *c);
/* (Re)start the connection's one timer; fn runs on the loop thread. */
void srv_conn_timer(srv_conn *c, double seconds, void (*fn)(srv_conn *c));
void srv_conn_timer_stop(srv_conn *c);
/* Stop / resume reading (the protocol's queue of work is full / drained). */
void srv_conn_pause(srv_conn *c, bool paused);
/* Submit a request for c (tenant and client filled in). Takes it. */
int srv_submit(srv_conn *c, cairn_request *r);

/* ---- work.c ----------------------------------------------------------------- */

/* Text work (api/api.h's decoding) on libuv's threadpool: `work` runs on a
 * worker thread, `done` back on the loop thread. The item must stay alive
 * until `done`; it names its connection by id (the connection may have
 * gone by then). */
typedef struct srv_work srv_work;
struct srv_work {
    uv_work_t req;
    cairn_server *srv;
    uint64_t conn_id;
    void (*work)(srv_work *w);
    void (*done)(srv_work *w, srv_conn *c); /* c NULL: the connection has gone */
};
int srv_work_queue(cairn_server *s, srv_work *w);
/* A finished reply read for tool calls (and, in channels, its reasoning)
 * on a text worker (api/api.h, cairn_api_reply), then `answer` on the loop
 * thread (c NULL: the connection has gone). A protocol's item begins with
 * one. */
typedef struct srv_calls {
    srv_work w;
    srv_event *node;          /* the DONE event (owned)                     */
    char *tools_json;         /* the tools the reply is read for (owned;
                                 NULL: none, a reply in channels)           */
    char *calls_json, *content; /* the result (owned; NULL: no calls, the
                                 text as it is)                             */
    char *reasoning;          /* channels: the reasoning (owned; NULL: none) */
    char prefix[64];          /* ids are <prefix><n>                        */
    void (*answer)(struct srv_calls *k, srv_conn *c);
} srv_calls;
/* Queue k (node, tools_json, prefix and answer filled in) for conn_id;
 * freed after its answer. CAIRN_ENOMEM: not queued, the caller frees it. */
int srv_calls_queue(cairn_server *s, srv_calls *k, uint64_t conn_id);
void srv_calls_free(srv_calls *k);

/* A seed for a request that names none (loop thread). */
uint64_t srv_next_seed(cairn_server *s);

/* ---- msgpack/conn.c, http/ --------------------------------------------------- */

extern const srv_conn_ops srv_msgpack_ops;
extern const srv_conn_ops srv_http_ops;
/* The facade's state (counters for /metrics). */
int srv_http_create(cairn_server *s, srv_http **out);
void srv_http_free(srv_http *h);
/* What the browser page's Cache view plots (http/web.c): every request
 * submitted and every event, seen on the loop thread; no-ops without HTTP. */
void srv_http_note_submit(cairn_server *s, const cairn_request *r);
void srv_http_note_event(cairn_server *s, const cairn_event *ev);

/* ---- explain.c: why a prompt was recomputed ---------------------------- */

/* A chat call's conversation and prompt, kept until its generation is done
 * so a miss inside it can be placed (cairn_miss_reason). Reference counted
 * on the loop thread only (a text worker reads it while holding one). */
typedef struct {
    cairn_api_call call; /* conv and tools_json only */
    int32_t *tokens;     /* the prompt as decoded   */
    size_t n_tokens;
    int refs;
} srv_conv;

/* Take the conversation out of a decoded call (moved) with a copy of its
 * prompt, before the request is submitted; NULL when the call is no plain
 * generation over a conversation (or memory ran out: then no refinement). */
srv_conv *srv_conv_take(cairn_api_call *call);
void srv_conv_release(srv_conv *k); /* NULL is a no-op */
/* The part of the conversation a departure lies in (a text worker: it
 * renders). */
cairn_miss_reason srv_conv_classify(const cairn_api *api, const srv_conv *k, int64_t departure);

/* A DONE(generation) whose miss is refined on a text worker; then
 * node->ev.miss.reason is final and `answer` continues with the event
 * (true: it kept the node). */
typedef struct srv_classify {
    srv_work w;
    srv_conv *conv;      /* one reference held while queued               */
    srv_event *node;     /* owned until answer keeps it                    */
    uint32_t msgid;
    cairn_miss_reason reason;
    bool (*answer)(struct srv_classify *k, srv_conn *c);
} srv_classify;
int srv_classify_queue(cairn_server *s, srv_classify *k, uint64_t conn_id);

/* Count a generation's final reason (loop thread), for /metrics. */
void srv_miss_count(cairn_server *s, const cairn_cache_miss *m);
/* usage's cache_miss object: reason (null on a hit), position, closest_tokens,
 * closest_tier, evicted_tier, prompt_excerpt, cached_excerpt; null when the
 * cache was not looked at. */
json_t *srv_miss_json(const cairn_api *api, const cairn_cache_miss *m);

#endif /* CAIRN_SERVER_IMPL_H */
