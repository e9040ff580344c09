/*
 * server/server.c — the loop thread's server: listeners (TCP and Unix for
 * msgpack-RPC, TCP for HTTP), the bridge from the engine thread, and
 * start-up and shutdown (server.h; the files of server/ are listed in
 * server_impl.h).
 *
 * The engine thread's callback (on_engine_event) only copies the event
 * into a node, links it into `queue` under `queue_mu`, and wakes the loop
 * with uv_async_send; it never touches a connection. The loop finds the
 * event's connection by id and hands it to the connection's protocol;
 * events of connections that have gone are dropped.
 */
#include "server/server_impl.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

void srv_msgpack_accept(cairn_server *s, uv_stream_t *listener, bool tcp);
void srv_http_accept(cairn_server *s, uv_stream_t *listener);

void cairn_server_config_default(cairn_server_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->host = "127.0.0.1";
    cfg->port = 7077;
    cairn_mp_limits_default(&cfg->limits);
    cfg->max_output_bytes = 16u << 20;
    cfg->idle_timeout_s = 60;
    cfg->drain_timeout_s = 30;
    cfg->max_inflight = 256;
    cfg->http.port = -1;
    cfg->http.max_body_bytes = 4u << 20;
    cfg->http.max_header_bytes = 32u << 10;
    cfg->http.timeout_s = 30;
    cfg->http.max_session_keys = 1024;
    cfg->service.page_size = 16;
    cfg->service.kv_type = CAIRN_TYPE_F16;
}

/* ---- events from the engine thread -------------------------------------------------- */

/* Engine thread. Copy the event (it is valid only during this call), queue
 * it, wake the loop. Never touches a connection. */
static void on_engine_event(const cairn_event *ev, void *user)
{
    cairn_server *s = user;
    size_t msg_len = ev->message ? strlen(ev->message) + 1 : 0;
    size_t fr_len = ev->finish_reason ? strlen(ev->finish_reason) + 1 : 0;
    size_t tok_bytes = ev->n_tokens * sizeof(int32_t);
    size_t text_len = ev->text ? ev->text_len : 0;
    size_t lp_bytes = ev->logprobs ? ev->n_tokens * (size_t)(1 + ev->n_top) *
                                         sizeof(cairn_token_logprob)
                                   : 0;
    size_t note_len = ev->note ? ev->note_len : 0;
    size_t list_bytes = ev->sessions ? ev->n_listed * sizeof(cairn_session_entry) : 0;
    srv_event *n = malloc(sizeof *n + list_bytes + lp_bytes + tok_bytes + text_len + 1 +
                          msg_len + fr_len + note_len);
    if (n) {
        n->ev = *ev;
        char *p = (char *)(n + 1);
        if (list_bytes) /* first (with the logprobs): the node's end is aligned for both */
            memcpy(p, ev->sessions, list_bytes);
        n->ev.sessions = ev->sessions ? (const cairn_session_entry *)p : NULL;
        p += list_bytes;
        if (lp_bytes)
            memcpy(p, ev->logprobs, lp_bytes);
        n->ev.logprobs = ev->logprobs ? (const cairn_token_logprob *)p : NULL;
        p += lp_bytes;
        if (ev->n_tokens)
            memcpy(p, ev->tokens, tok_bytes);
        n->ev.tokens = (const int32_t *)p;
        p += tok_bytes;
        if (text_len)
            memcpy(p, ev->text, text_len);
        p[text_len] = '\0';
        n->ev.text = p;
        n->ev.text_len = text_len;
        p += text_len + 1;
        if (msg_len) {
            memcpy(p, ev->message, msg_len);
            n->ev.message = p;
            p += msg_len;
        }
        if (fr_len) {
            memcpy(p, ev->finish_reason, fr_len);
            n->ev.finish_reason = p;
            p += fr_len;
        }
        if (ev->note) {
            memcpy(p, ev->note, note_len);
            n->ev.note = p;
        }
    } else if (ev->kind != CAIRN_EV_DELTA) {
        /* The answer must not be lost: send a short error instead. */
        n = malloc(sizeof *n);
        if (!n) {
            cairn_log(CAIRN_LOG_ERROR, "out of memory: the answer to request %llu is lost",
                      (unsigned long long)ev->id);
            return;
        }
        memset(&n->ev, 0, sizeof n->ev);
        n->ev.kind = CAIRN_EV_ERROR;
        n->ev.client = ev->client;
        n->ev.id = ev->id;
        n->ev.code = CAIRN_ENOMEM;
        n->ev.message = "out of memory while reporting the result";
    } else {
        return; /* a lost delta; the final answer still carries all the text */
    }
    n->next = NULL;
    pthread_mutex_lock(&s->queue_mu);
    if (s->queue_tail)
        s->queue_tail->next = n;
    else
        s->queue_head = n;
    s->queue_tail = n;
    pthread_mutex_unlock(&s->queue_mu);
    uv_async_send(&s->events_async);
}

static srv_event *queue_take_all(cairn_server *s)
{
    pthread_mutex_lock(&s->queue_mu);
    srv_event *n = s->queue_head;
    s->queue_head = s->queue_tail = NULL;
    pthread_mutex_unlock(&s->queue_mu);
    return n;
}

static void on_events(uv_async_t *a)
{
    cairn_server *s = a->data;
    for (srv_event *n = queue_take_all(s), *next; n; n = next) {
        next = n->next;
        srv_http_note_event(s, &n->ev);
        srv_conn *c = srv_conn_find(s, n->ev.client);
        if (!(c && !srv_conn_gone(c) && c->ops->on_event(c, n)))
            free(n);
    }
}

/* ---- listening ------------------------------------------------------------------------ */

static void on_connection(uv_stream_t *listener, int status)
{
    cairn_server *s = listener->data;
    if (status < 0) {
        cairn_log(CAIRN_LOG_WARN, "accept: %s", uv_strerror(status));
        return;
    }
    if (s->stopping)
        return;
    if (listener == (uv_stream_t *)&s->http_tcp)
        srv_http_accept(s, listener);
    else
        srv_msgpack_accept(s, listener, listener == (uv_stream_t *)&s->tcp);
}

/* An IP address to listen on, bound, listening; *port the bound port and
 * desc "HOST:PORT" (with [] around IPv6). */
static int listen_tcp(cairn_server *s, uv_tcp_t *h, bool *has, const char *host, int port,
                      const char *what, int *bound_port, char *desc, size_t desc_cap, char *err,
                      size_t err_len)
{
    struct sockaddr_storage addr;
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&addr) != 0 &&
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&addr) != 0)
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "'%s' is not an IP address", host);
    uv_tcp_init(&s->loop, h);
    h->data = s;
    *has = true;
    int rc = uv_tcp_bind(h, (const struct sockaddr *)&addr, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)h, 128, on_connection);
    if (rc != 0)
        return cairn_errorf(err, err_len, CAIRN_EIO, "cannot listen%s on %s port %d: %s", what,
                            host, port, uv_strerror(rc));
    struct sockaddr_storage bound;
    int len = sizeof bound;
    uv_tcp_getsockname(h, (struct sockaddr *)&bound, &len);
    *bound_port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                    : ((struct sockaddr_in *)&bound)->sin_port);
    snprintf(desc, desc_cap, bound.ss_family == AF_INET6 ? "[%s]:%d" : "%s:%d", host,
             *bound_port);
    return CAIRN_OK;
}

/* A socket file left by a server that died is removed; one a live server
 * listens on, or a file that is not a socket, is left alone. */
static int clear_stale_socket(const char *path, char *err, size_t err_len)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? CAIRN_OK
                               : cairn_errorf(err, err_len, CAIRN_EIO, "%s: %s", path, strerror(errno));
    if (!S_ISSOCK(st.st_mode))
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "%s exists and is not a socket", path);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0)
        return cairn_errorf(err, err_len, CAIRN_EIO, "socket: %s", strerror(errno));
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int live = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    close(fd);
    if (live)
        return cairn_errorf(err, err_len, CAIRN_EBUSY, "another server is listening on %s", path);
    if (unlink(path) != 0)
        return cairn_errorf(err, err_len, CAIRN_EIO, "cannot remove stale %s: %s", path,
                     strerror(errno));
    return CAIRN_OK;
}

static int bind_unix(cairn_server *s, char *err, size_t err_len)
{
    const char *path = s->cfg.unix_path;
    if (strlen(path) >= sizeof(((struct sockaddr_un *)0)->sun_path))
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "Unix socket path too long: %s", path);
    int rc = clear_stale_socket(path, err, err_len);
    if (rc != CAIRN_OK)
        return rc;
    uv_pipe_init(&s->loop, &s->pipe, 0);
    s->pipe.data = s;
    s->has_pipe = true;
    /* bind() creates the file with 0777 & ~umask: with this umask it is 0600
     * from the first instant. No other thread exists yet to be affected. */
    mode_t old = umask(0177);
    rc = uv_pipe_bind(&s->pipe, path);
    umask(old);
    if (rc != 0)
        return cairn_errorf(err, err_len, CAIRN_EIO, "cannot bind %s: %s", path, uv_strerror(rc));
    s->unix_path = strdup(path);
    if (!s->unix_path)
        return CAIRN_ENOMEM;
    if ((rc = uv_listen((uv_stream_t *)&s->pipe, 128, on_connection)) != 0)
        return cairn_errorf(err, err_len, CAIRN_EIO, "cannot listen on %s: %s", path, uv_strerror(rc));
    return CAIRN_OK;
}

/* ---- shutdown ----------------------------------------------------------------------------- */

static void close_if(uv_handle_t *h, bool *flag)
{
    if (*flag && !uv_is_closing(h))
        uv_close(h, NULL);
    *flag = false;
}

static void begin_shutdown(cairn_server *s)
{
    if (s->stopping)
        return;
    s->stopping = true;
    if (s->svc)
        cairn_log(CAIRN_LOG_INFO, "shutting down");
    close_if((uv_handle_t *)&s->tcp, &s->has_tcp);
    close_if((uv_handle_t *)&s->pipe, &s->has_pipe);
    close_if((uv_handle_t *)&s->http_tcp, &s->has_http);
    if (s->has_drain_timer) {
        uv_close((uv_handle_t *)&s->drain_timer, NULL);
        s->has_drain_timer = false;
    }
    if (s->has_signals) {
        uv_close((uv_handle_t *)&s->sigint, NULL);
        uv_close((uv_handle_t *)&s->sigterm, NULL);
        s->has_signals = false;
    }
    /* Lingering connections are no longer in the table, hence the list. */
    for (srv_conn *c = s->all; c; c = c->all_next)
        srv_conn_close(c);
    /* After this returns no event can be emitted, so the async handle that
     * the engine thread signals may be closed. */
    cairn_service_stop(s->svc);
    s->svc = NULL;
    for (srv_event *n = queue_take_all(s), *next; n; n = next) {
        next = n->next;
        free(n);
    }
    if (s->has_asyncs) {
        uv_close((uv_handle_t *)&s->events_async, NULL);
        uv_close((uv_handle_t *)&s->stop_async, NULL);
        s->has_asyncs = false;
    }
}

/* ---- draining: the first SIGTERM or SIGINT ----------------------------------------------
 *
 *   signal ──▶ listeners closed; idle connections closed; new requests on
 *              the others refused ("shutting down")
 *          ──▶ running requests go on, up to drain_timeout_s
 *          ──▶ still running then: ended as if cancelled (an HTTP stream gets
 *              its last chunk and [DONE], a native call its result)
 *          ──▶ once nothing runs and every reply is written (or DRAIN_GRACE_S
 *              after the end): begin_shutdown. A second signal: at once. */

#define DRAIN_TICK_MS 50
#define DRAIN_GRACE_S 5.0 /* after ending the requests: for their last replies */

static bool conn_busy(srv_conn *c)
{
    return c->attached && !srv_conn_gone(c) && c->ops->busy && c->ops->busy(c);
}

static bool conn_unflushed(const srv_conn *c)
{
    return !c->closing && c->stream && uv_stream_get_write_queue_size(c->stream) > 0;
}

static void drain_end_requests(cairn_server *s)
{
    for (srv_conn *c = s->all; c; c = c->all_next) {
        if (!conn_busy(c))
            continue;
        /* the engine cancels every request of the client; the connection
         * stays attached, so each one's last event still reaches it */
        cairn_request *r = cairn_request_new(CAIRN_REQ_CLIENT_GONE);
        if (r && srv_submit(c, r) != CAIRN_OK)
            srv_conn_close(c);
        else if (!r)
            srv_conn_close(c);
    }
}

static void on_drain_tick(uv_timer_t *t)
{
    cairn_server *s = t->data;
    size_t busy = 0, unflushed = 0;
    for (srv_conn *c = s->all; c; c = c->all_next) {
        busy += conn_busy(c);
        unflushed += conn_unflushed(c);
    }
    const double waited = (double)(uv_now(&s->loop) - s->drain_started_ms) / 1000.0;
    if (busy && !s->drain_ended && waited >= s->cfg.drain_timeout_s) {
        cairn_log(CAIRN_LOG_WARN, "drain: %zu connections still busy after %.0f s; ending their "
                  "requests", busy, s->cfg.drain_timeout_s);
        s->drain_ended = true;
        drain_end_requests(s);
    }
    if ((!busy && !unflushed) || waited >= s->cfg.drain_timeout_s + DRAIN_GRACE_S)
        begin_shutdown(s);
}

static void begin_drain(cairn_server *s)
{
    s->draining = true;
    close_if((uv_handle_t *)&s->tcp, &s->has_tcp);
    close_if((uv_handle_t *)&s->pipe, &s->has_pipe);
    close_if((uv_handle_t *)&s->http_tcp, &s->has_http);
    size_t busy = 0;
    for (srv_conn *c = s->all; c; c = c->all_next) {
        if (conn_busy(c))
            busy++;
        else if (!c->closing && !c->lingering)
            srv_conn_close(c); /* nothing of it runs: nothing to wait for */
    }
    cairn_log(CAIRN_LOG_INFO, "draining: %zu connections with requests running (up to %.0f s)",
              busy, s->cfg.drain_timeout_s);
    s->drain_started_ms = uv_now(&s->loop);
    uv_timer_init(&s->loop, &s->drain_timer);
    s->drain_timer.data = s;
    s->has_drain_timer = true;
    uv_timer_start(&s->drain_timer, on_drain_tick, 0, DRAIN_TICK_MS);
}

static void on_signal(uv_signal_t *h, int signum)
{
    cairn_server *s = h->data;
    cairn_log(CAIRN_LOG_INFO, "signal %d", signum);
    if (s->draining)
        begin_shutdown(s); /* a second signal: now */
    else
        begin_drain(s);
}

static void on_stop(uv_async_t *a) { begin_shutdown(a->data); }

/* ---- start, run, stop ------------------------------------------------------------------ */

/* The configuration's checks and the copy of the credentials. */
static int check_config(const cairn_server_config *cfg, cairn_access **access, char *err,
                        size_t err_len)
{
    if (!cfg || (!cfg->host && !cfg->unix_path && cfg->http.port < 0) || cfg->port < 0 || cfg->port > 65535 ||
        cfg->limits.max_depth < 1 || cfg->limits.max_depth > CAIRN_MP_DEPTH_CAP ||
        cfg->idle_timeout_s <= 0 || cfg->max_inflight < 1 || !(cfg->drain_timeout_s >= 0))
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "invalid server configuration");
    if (cfg->http.port >= 0 &&
        (cfg->http.port > 65535 || cfg->http.max_body_bytes == 0 ||
         cfg->http.max_header_bytes < 256 || !(cfg->http.timeout_s > 0)))
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "invalid HTTP configuration");
    if (!cfg->n_credentials && !cairn_host_is_loopback(cfg->host))
        return cairn_errorf(err, err_len, CAIRN_EINVAL,
                            "refusing to listen on %s without authentication: configure a token "
                            "or tenants, or listen on a loopback address",
                            cfg->host);
    if (cfg->http.port >= 0 && cfg->http.host && !cfg->n_credentials &&
        !cairn_host_is_loopback(cfg->http.host))
        return cairn_errorf(err, err_len, CAIRN_EINVAL,
                            "refusing to listen (HTTP) on %s without authentication: configure a "
                            "token or tenants, or listen on a loopback address",
                            cfg->http.host);
    return cairn_access_create(cfg->credentials, cfg->n_credentials, access, err, err_len);
}

/* Before authentication a connection lives under tighter limits. */
static void preauth_limits(cairn_server *s)
{
    cairn_mp_limits *pl = &s->preauth_limits;
    *pl = s->cfg.limits;
    if (pl->max_message_bytes > CAIRN_PREAUTH_MESSAGE_BYTES)
        pl->max_message_bytes = CAIRN_PREAUTH_MESSAGE_BYTES;
    if (pl->max_string_bytes > CAIRN_PREAUTH_STRING_BYTES)
        pl->max_string_bytes = CAIRN_PREAUTH_STRING_BYTES;
    if (pl->max_depth > CAIRN_PREAUTH_DEPTH)
        pl->max_depth = CAIRN_PREAUTH_DEPTH;
    if (pl->max_array_len > CAIRN_PREAUTH_COUNT)
        pl->max_array_len = CAIRN_PREAUTH_COUNT;
    if (pl->max_map_len > CAIRN_PREAUTH_COUNT)
        pl->max_map_len = CAIRN_PREAUTH_COUNT;
}

/* Every listener, before any thread exists. */
static int bind_all(cairn_server *s, char *err, size_t err_len)
{
    const cairn_server_config *cfg = &s->cfg;
    int rc = CAIRN_OK;
    if (cfg->host) {
        rc = listen_tcp(s, &s->tcp, &s->has_tcp, cfg->host, cfg->port, "", &s->tcp_port, s->tcp_desc,
                        sizeof s->tcp_desc, err, err_len);
    }
    if (rc == CAIRN_OK && cfg->unix_path)
        rc = bind_unix(s, err, err_len);
    if (rc == CAIRN_OK && cfg->http.port >= 0) {
        /* the TCP host (loopback unless credentials allowed otherwise) */
        if (!s->cfg.http.host)
            s->cfg.http.host = cfg->host ? cfg->host : "127.0.0.1";
        char desc[sizeof s->http_desc - 5];
        rc = listen_tcp(s, &s->http_tcp, &s->has_http, s->cfg.http.host, cfg->http.port, " (HTTP)",
                        &s->http_port, desc, sizeof desc, err, err_len);
        snprintf(s->http_desc, sizeof s->http_desc, "http %s", desc);
        if (rc == CAIRN_OK)
            rc = srv_http_create(s, &s->http);
    }
    return rc;
}

/* The model, the engine, and what requests mean. */
static int start_engine(cairn_server *s, char *err, size_t err_len)
{
    int rc = cairn_runtime_open(&s->cfg.runtime, &s->rt, err, err_len);
    if (rc != CAIRN_OK)
        return rc;
    cairn_service_config sc = s->cfg.service;
    sc.runtime = s->rt;
    sc.on_event = on_engine_event;
    sc.user = s;
    if (!sc.max_named_sessions)
        sc.max_named_sessions = s->cfg.http.max_session_keys;
    if ((rc = cairn_service_start(&sc, &s->svc, err, err_len)) != CAIRN_OK)
        return rc;
    s->api = (cairn_api){.vocab = cairn_runtime_vocab(s->rt),
                         .chat_template = cairn_runtime_chat_template(s->rt),
                         .n_vocab = cairn_runtime_hparams(s->rt)->n_vocab,
                         .n_ctx = cairn_service_n_ctx(s->svc),
                         .max_tokenize = s->cfg.limits.max_array_len,
                         .max_text_bytes = s->cfg.limits.max_string_bytes,
                         .runtime = s->rt,
                         .default_chat_flags = s->cfg.default_chat_flags};
    const char *name = s->cfg.http.model_name, *path = s->cfg.runtime.model_path;
    if (name) {
        snprintf(s->model_id, sizeof s->model_id, "%s", name);
    } else {
        /* the file's or the folder's name ("./Qwen2.5-7B-Instruct-AWQ/") */
        size_t end = strlen(path);
        while (end > 1 && path[end - 1] == '/')
            end--;
        const char *base = path;
        for (size_t i = 0; i < end; i++)
            if (path[i] == '/' && i + 1 < end)
                base = path + i + 1;
        size_t n = (size_t)(path + end - base);
        if (n > 5 && strncmp(base + n - 5, ".gguf", 5) == 0)
            n -= 5;
        snprintf(s->model_id, sizeof s->model_id, "%.*s", (int)n, base);
    }
    return CAIRN_OK;
}

int cairn_server_create(const cairn_server_config *cfg, cairn_server **out, char *err,
                        size_t err_len)
{
    if (err && err_len)
        err[0] = '\0';
    cairn_access *access = NULL;
    int rc = check_config(cfg, &access, err, err_len);
    if (rc != CAIRN_OK)
        return rc;
    cairn_server *s = calloc(1, sizeof *s);
    if (!s) {
        cairn_access_free(access);
        return CAIRN_ENOMEM;
    }
    s->cfg = *cfg;
    s->cfg.credentials = NULL; /* the copy in `access` is what counts */
    s->cfg.n_credentials = 0;
    s->access = access;
    preauth_limits(s);
    s->tcp_port = s->http_port = -1;
    pthread_mutex_init(&s->queue_mu, NULL);
    if ((rc = uv_loop_init(&s->loop)) != 0) {
        pthread_mutex_destroy(&s->queue_mu);
        cairn_access_free(s->access);
        free(s);
        return cairn_errorf(err, err_len, CAIRN_EIO, "uv_loop_init: %s", uv_strerror(rc));
    }
    s->loop_ready = true;
    /* A write to a client that went away must be an error, not a signal
     * that kills the server. */
    signal(SIGPIPE, SIG_IGN);
    rc = bind_all(s, err, err_len);
    if (rc == CAIRN_OK) {
        uv_async_init(&s->loop, &s->events_async, on_events);
        uv_async_init(&s->loop, &s->stop_async, on_stop);
        s->events_async.data = s->stop_async.data = s;
        s->has_asyncs = true;
        uv_signal_init(&s->loop, &s->sigint);
        uv_signal_init(&s->loop, &s->sigterm);
        s->sigint.data = s->sigterm.data = s;
        s->has_signals = true;
        /* From here, not from cairn_server_run: the caller says "listening"
         * between the two, and a SIGTERM sent on that line must stop the
         * server gracefully (libuv holds it until the loop runs). */
        uv_signal_start(&s->sigint, on_signal, SIGINT);
        uv_signal_start(&s->sigterm, on_signal, SIGTERM);
        /* Seeds for requests without one: unpredictable across runs. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        s->seed_state = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^
                        (uint64_t)getpid() << 40;
        rc = start_engine(s, err, err_len);
    }
    if (rc != CAIRN_OK) {
        cairn_server_free(s);
        return rc;
    }
    *out = s;
    return CAIRN_OK;
}

int cairn_server_tcp_port(const cairn_server *s) { return s->has_tcp ? s->tcp_port : -1; }

int cairn_server_http_port(const cairn_server *s) { return s->has_http ? s->http_port : -1; }

int cairn_server_announce(cairn_server *s, const char *replica, char *id, size_t id_cap)
{
    if (!s)
        return CAIRN_EINVAL;
    char http[sizeof s->http_desc] = "";
    if (s->has_http) { /* "http HOST:PORT (HTTP)" -> "HOST:PORT" */
        snprintf(http, sizeof http, "%s", s->http_desc + 5);
        char *tag = strstr(http, " (");
        if (tag)
            *tag = '\0';
    }
    const char *rpc = s->has_tcp ? s->tcp_desc : "";
    /* the default id: the address a router reaches this replica at */
    const char *name = replica ? replica : http[0] ? http : rpc[0] ? rpc : s->cfg.unix_path;
    if (id && id_cap)
        snprintf(id, id_cap, "%s", name ? name : "");
    return cairn_service_announce(s->svc, name, http, rpc);
}

cairn_service *cairn_server_service(const cairn_server *s) { return s->svc; }

void cairn_server_describe(const cairn_server *s, char *out, size_t cap)
{
    const char *http = s->has_http ? s->http_desc : "";
    snprintf(out, cap, "%s%s%s%s%s%s%s", s->has_tcp ? "tcp " : "", s->has_tcp ? s->tcp_desc : "",
             s->has_tcp && s->has_pipe ? ", " : "", s->has_pipe ? "unix " : "",
             s->has_pipe ? s->unix_path : "", (s->has_tcp || s->has_pipe) && http[0] ? ", " : "",
             http);
}

int cairn_server_run(cairn_server *s)
{
    if (!s || s->stopping)
        return CAIRN_EINVAL;
    uv_run(&s->loop, UV_RUN_DEFAULT);
    /* The loop only ends once every handle is closed (and every work item
     * has come back), which begin_shutdown arranges; run it once more in
     * case something is still pending. */
    begin_shutdown(s);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    return CAIRN_OK;
}

void cairn_server_stop(cairn_server *s)
{
    if (s)
        uv_async_send(&s->stop_async);
}

void cairn_server_free(cairn_server *s)
{
    if (!s)
        return;
    if (s->loop_ready) {
        begin_shutdown(s); /* a no-op after cairn_server_run */
        uv_run(&s->loop, UV_RUN_DEFAULT);
        uv_loop_close(&s->loop);
    }
    srv_http_free(s->http);
    cairn_runtime_close(s->rt); /* the service that borrowed it has stopped */
    if (s->unix_path) {
        unlink(s->unix_path);
        free(s->unix_path);
    }
    pthread_mutex_destroy(&s->queue_mu);
    cairn_access_free(s->access);
    free(s);
}
