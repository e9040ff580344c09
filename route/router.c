/*
 * route/router.c — the router process: what requests mean (the model's
 * vocabulary and template, no weights), the listeners, signals, and the
 * router's own /router/health and /router/metrics.
 */
#include "ckpt/ckpt.h"
#include "route/route_impl.h"

#include "gguf/gguf.h"
#include "text/text.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void route_config_default(route_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->host = "127.0.0.1";
    cfg->http_port = 8080;
    cfg->rpc_port = -1;
    cfg->prefix = "cairn:";
    cfg->policy = ROUTE_POLICY_CACHE;
    cfg->weights = (route_weights){.work = 1.0, .decode = 4.0};
    cfg->decode_estimate = 128;
    cfg->predict_ttl_s = 30.0;
    cfg->health_interval_s = 1.0;
    cfg->health_failures = 3;
    cfg->page_size = 16;
    cfg->max_body_bytes = 4u << 20;
    cfg->max_header_bytes = 32u << 10;
    cfg->max_sessions = 100000;
    cfg->http_timeout_s = 30.0;
    cfg->max_output_bytes = 64u << 20;
    cfg->idle_timeout_s = 60.0;
}

static int load_model_text(cairn_router *r, char *err, size_t err_len)
{
    int rc = cairn_ckpt_open(r->cfg.model_path, &r->gguf, err, err_len);
    if (rc == CAIRN_OK)
        rc = cairn_vocab_load(r->gguf, &r->vocab, err, err_len);
    if (rc == CAIRN_OK && (rc = cairn_chat_template_from_gguf(r->gguf, r->vocab, &r->chat)))
        cairn_errorf(err, err_len, rc, "%s: cannot read its chat template", r->cfg.model_path);
    if (rc != CAIRN_OK)
        return rc;
    /* The context is the replicas' to enforce: the router decodes anything
     * they might take and leaves refusing to them. */
    r->api = (cairn_api){.vocab = r->vocab,
                         .chat_template = r->chat,
                         .n_vocab = cairn_vocab_n_tokens(r->vocab),
                         .n_ctx = 1 << 24,
                         .max_tokenize = 1u << 20,
                         .max_text_bytes = 4u << 20};
    return CAIRN_OK;
}

static int load_tenants(cairn_router *r, char *err, size_t err_len)
{
    if (!r->cfg.tenants_path)
        return CAIRN_OK;
    char *text = NULL;
    size_t len = 0;
    int rc = cairn_secret_file_read(r->cfg.tenants_path, &text, &len, err, err_len);
    if (rc != CAIRN_OK)
        return rc;
    cairn_credential *creds = NULL;
    size_t n = 0;
    rc = cairn_tenants_parse(text, len, &creds, &n, err, err_len);
    memset(text, 0, len);
    free(text);
    if (rc == CAIRN_OK)
        rc = cairn_access_create(creds, n, &r->access, err, err_len);
    cairn_credentials_free(creds, n);
    return rc;
}

uint64_t route_tenant_of(cairn_router *r, const char *token, size_t len)
{
    uint64_t tenant = 0;
    const char *name;
    if (!r->access || !token)
        return 0;
    if (cairn_access_check(r->access, token, len, &tenant, &name) != CAIRN_OK)
        return 0;
    return tenant;
}

static void on_http_connection(uv_stream_t *l, int status)
{
    if (status == 0)
        route_http_accept(l->data, l);
}

static void on_rpc_connection(uv_stream_t *l, int status)
{
    if (status == 0)
        route_rpc_accept(l->data, l);
}

static int listen_on(cairn_router *r, uv_tcp_t *t, int port, uv_connection_cb cb, int *bound,
                     char *err, size_t err_len)
{
    struct sockaddr_storage addr;
    char hp[300];
    snprintf(hp, sizeof hp, strchr(r->cfg.host, ':') ? "[%s]:%d" : "%s:%d", r->cfg.host,
             port ? port : 1);
    if (route_parse_hostport(hp, &addr) != CAIRN_OK)
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "cannot use host '%s'", r->cfg.host);
    if (addr.ss_family == AF_INET)
        ((struct sockaddr_in *)&addr)->sin_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in6 *)&addr)->sin6_port = htons((uint16_t)port);
    uv_tcp_init(&r->loop, t);
    t->data = r;
    int rc = uv_tcp_bind(t, (const struct sockaddr *)&addr, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)t, 512, cb);
    if (rc != 0)
        return cairn_errorf(err, err_len, CAIRN_EIO, "cannot listen on %s port %d: %s",
                            r->cfg.host, port, uv_strerror(rc));
    struct sockaddr_storage got;
    int gl = sizeof got;
    uv_tcp_getsockname(t, (struct sockaddr *)&got, &gl);
    *bound = ntohs(got.ss_family == AF_INET ? ((struct sockaddr_in *)&got)->sin_port
                                            : ((struct sockaddr_in6 *)&got)->sin6_port);
    return CAIRN_OK;
}

int cairn_router_create(const route_config *cfg, cairn_router **out, char *err, size_t err_len)
{
    if (!cfg->model_path)
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "a model (its vocabulary) is needed");
    if (cfg->http_port < 0 && cfg->rpc_port < 0)
        return cairn_errorf(err, err_len, CAIRN_EINVAL, "neither HTTP nor msgpack is listened on");
    cairn_router *r = calloc(1, sizeof *r);
    if (!r)
        return CAIRN_ENOMEM;
    r->cfg = *cfg;
    r->http_port = r->rpc_port = -1;
    pthread_mutex_init(&r->reg_mu, NULL);
    int rc = (r->prefix = strdup(cfg->prefix ? cfg->prefix : "cairn:")) ? CAIRN_OK : CAIRN_ENOMEM;
    if (rc == CAIRN_OK)
        rc = load_model_text(r, err, err_len);
    if (rc == CAIRN_OK)
        rc = load_tenants(r, err, err_len);
    if (rc == CAIRN_OK)
        rc = route_index_create(&r->index);
    if (rc == CAIRN_OK)
        rc = route_sessions_create(cfg->max_sessions, &r->sessions);
    for (int i = 0; rc == CAIRN_OK && i < cfg->n_replicas; i++)
        rc = route_replicas_add_static(r, &cfg->replicas[i], err, err_len);
    if (rc == CAIRN_OK && uv_loop_init(&r->loop) != 0)
        rc = cairn_errorf(err, err_len, CAIRN_ENOMEM, "cannot start the event loop");
    else if (rc == CAIRN_OK)
        r->loop_ready = true;
    if (rc == CAIRN_OK && cfg->http_port >= 0) {
        rc = listen_on(r, &r->http_listener, cfg->http_port, on_http_connection, &r->http_port,
                       err, err_len);
        r->has_http = rc == CAIRN_OK;
    }
    if (rc == CAIRN_OK && cfg->rpc_port >= 0) {
        rc = listen_on(r, &r->rpc_listener, cfg->rpc_port, on_rpc_connection, &r->rpc_port, err,
                       err_len);
        r->has_rpc = rc == CAIRN_OK;
    }
    if (rc == CAIRN_OK)
        rc = route_events_start(r, err, err_len);
    if (rc != CAIRN_OK) {
        cairn_router_free(r);
        return rc;
    }
    signal(SIGPIPE, SIG_IGN);
    *out = r;
    return CAIRN_OK;
}

int cairn_router_http_port(const cairn_router *r)
{
    return r->http_port;
}

int cairn_router_rpc_port(const cairn_router *r)
{
    return r->rpc_port;
}

/* Close every handle. Connections go through rstream_close, so their
 * owners are told (and freed) as on any close; listeners, timers and
 * signals have nothing to free. */
static void close_walk(uv_handle_t *h, void *arg)
{
    cairn_router *r = arg;
    if (uv_is_closing(h))
        return;
    if (h->type == UV_TCP && h != (uv_handle_t *)&r->http_listener &&
        h != (uv_handle_t *)&r->rpc_listener && h->data)
        rstream_close(h->data);
    else
        uv_close(h, NULL);
}

static void on_signal(uv_signal_t *s, int signum)
{
    cairn_router *r = s->data;
    cairn_log(CAIRN_LOG_INFO, "route: signal %d: stopping", signum);
    r->stopping = true;
    uv_stop(&r->loop);
}

int cairn_router_run(cairn_router *r)
{
    uv_signal_init(&r->loop, &r->sigint);
    uv_signal_init(&r->loop, &r->sigterm);
    r->sigint.data = r->sigterm.data = r;
    uv_signal_start(&r->sigint, on_signal, SIGINT);
    uv_signal_start(&r->sigterm, on_signal, SIGTERM);
    route_health_start(r);
    uv_run(&r->loop, UV_RUN_DEFAULT);
    route_events_stop(r);
    /* Connections are not drained: a client of a stopping router sees its
     * connection close, as with a replica that stops. */
    r->stopping = true; /* nothing new is connected from here on */
    uv_walk(&r->loop, close_walk, r);
    uv_run(&r->loop, UV_RUN_DEFAULT);
    return CAIRN_OK;
}

void cairn_router_free(cairn_router *r)
{
    if (!r)
        return;
    route_events_stop(r);
    if (r->loop_ready) {
        r->stopping = true;
        uv_walk(&r->loop, close_walk, r);
        uv_run(&r->loop, UV_RUN_DEFAULT);
        uv_loop_close(&r->loop);
    }
    route_index_free(r->index);
    route_sessions_free(r->sessions);
    cairn_access_free(r->access);
    cairn_chat_template_free(r->chat);
    cairn_vocab_free(r->vocab);
    cairn_gguf_close(r->gguf);
    pthread_mutex_destroy(&r->reg_mu);
    free(r->prefix);
    free(r);
}

/* ---- /router/health, /router/metrics ----------------------------------------------- */

static int replicas_up(cairn_router *r)
{
    int n = 0;
    for (int s = 0; s < ROUTE_MAX_REPLICAS; s++)
        n += r->live[s].up;
    return n;
}

char *route_health_text(cairn_router *r, int *status, size_t *len)
{
    int up = replicas_up(r);
    *status = up > 0 ? 200 : 503;
    cairn_strbuf b = {0};
    char line[160];
    int n = snprintf(line, sizeof line, "{\"status\":\"%s\",\"replicas_up\":%d,\"events\":%s}\n",
                     up > 0 ? "ok" : "no_replica", up,
                     !r->cfg.redis_url ? "\"off\""
                     : __atomic_load_n(&r->events_connected, __ATOMIC_RELAXED) ? "\"connected\""
                                           : "\"disconnected\"");
    cairn_strbuf_add(&b, line, (size_t)n);
    *len = b.len;
    return b.data;
}

static void add_escaped_label(cairn_strbuf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            cairn_strbuf_add(b, "\\", 1);
        if (*s == '\n')
            cairn_strbuf_add(b, "\\n", 2);
        else
            cairn_strbuf_add(b, s, 1);
    }
}

static void metric(cairn_strbuf *b, const char *name, const char *type, const char *help)
{
    char line[300];
    int n = snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
    cairn_strbuf_add(b, line, (size_t)n);
}

static void value(cairn_strbuf *b, const char *name, const char *replica, double v)
{
    char num[64];
    cairn_strbuf_add(b, name, strlen(name));
    if (replica) {
        cairn_strbuf_add(b, "{replica=\"", 10);
        add_escaped_label(b, replica);
        cairn_strbuf_add(b, "\"}", 2);
    }
    int n = snprintf(num, sizeof num, " %.17g\n", v);
    cairn_strbuf_add(b, num, (size_t)n);
}

char *route_metrics_text(cairn_router *r, size_t *len)
{
    cairn_strbuf b = {0};
    route_reg_entry reg[ROUTE_MAX_REPLICAS];
    pthread_mutex_lock(&r->reg_mu);
    memcpy(reg, r->reg, sizeof reg);
    pthread_mutex_unlock(&r->reg_mu);
    static const struct {
        const char *name, *type, *help;
    } per[] = {
        {"cairn_router_replica_up", "gauge", "1 when the replica passes its health checks"},
        {"cairn_router_requests_total", "counter", "requests routed to the replica"},
        {"cairn_router_prompt_tokens_total", "counter", "prompt tokens of those requests"},
        {"cairn_router_cached_tokens_predicted_total", "counter",
         "prompt tokens the index predicted the replica had cached"},
        {"cairn_router_inflight", "gauge", "requests in flight to the replica"},
        {"cairn_router_queued_prefill_tokens", "gauge", "uncached prompt tokens in flight"},
        {"cairn_router_queued_decode_tokens", "gauge", "expected decode tokens in flight"},
        {"cairn_router_replica_failures_total", "counter", "connections to it that failed"},
    };
    for (size_t m = 0; m < sizeof per / sizeof per[0]; m++) {
        metric(&b, per[m].name, per[m].type, per[m].help);
        for (int s = 0; s < ROUTE_MAX_REPLICAS; s++) {
            if (!reg[s].used)
                continue;
            const route_live *lv = &r->live[s];
            const double v[] = {lv->up,
                                (double)lv->routed,
                                (double)lv->prompt_tokens,
                                (double)lv->predicted_cached_tokens,
                                lv->load.inflight,
                                (double)lv->load.prefill,
                                (double)lv->load.decode,
                                (double)lv->failures};
            value(&b, per[m].name, reg[s].id, v[m]);
        }
    }
    const route_counters *c = &r->counters;
    const struct {
        const char *name, *type, *help;
        double v;
    } glob[] = {
        {"cairn_router_replicas_up", "gauge", "replicas passing their health checks",
         replicas_up(r)},
        {"cairn_router_http_requests_total", "counter", "HTTP requests proxied",
         (double)c->requests_http},
        {"cairn_router_rpc_requests_total", "counter", "msgpack requests proxied",
         (double)c->requests_rpc},
        {"cairn_router_undecodable_total", "counter",
         "requests the router could not decode, sent on unchanged", (double)c->undecodable},
        {"cairn_router_no_replica_total", "counter", "requests refused: no healthy replica",
         (double)c->no_replica},
        {"cairn_router_replica_errors_total", "counter",
         "requests whose replica failed before answering them whole",
         (double)c->replica_errors},
        {"cairn_router_session_moves_total", "counter",
         "sessions sent to another replica because theirs was down", (double)c->session_moves},
        {"cairn_router_sessions", "gauge", "sticky sessions remembered",
         (double)route_sessions_count(r->sessions)},
        {"cairn_router_index_entries", "gauge", "page hashes in the index",
         (double)route_index_entries(r->index)},
        {"cairn_router_events_total", "counter", "stream entries applied",
         (double)__atomic_load_n(&c->events, __ATOMIC_RELAXED)},
        {"cairn_router_events_bad_total", "counter", "stream entries skipped as malformed",
         (double)__atomic_load_n(&c->events_bad, __ATOMIC_RELAXED)},
        {"cairn_router_stream_resets_total", "counter",
         "times the stream was found reset and read again",
         (double)__atomic_load_n(&c->stream_resets, __ATOMIC_RELAXED)},
        {"cairn_router_events_connected", "gauge", "1 while the events reader has Redis",
         __atomic_load_n(&r->events_connected, __ATOMIC_RELAXED)},
    };
    for (size_t m = 0; m < sizeof glob / sizeof glob[0]; m++) {
        metric(&b, glob[m].name, glob[m].type, glob[m].help);
        value(&b, glob[m].name, NULL, glob[m].v);
    }
    *len = b.len;
    return b.data;
}
