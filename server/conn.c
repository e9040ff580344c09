/*
 * server/conn.c — the connection core (server_impl.h): accepting, the id
 * table, buffered input, writing with backpressure, lingering close, the
 * one timer, and the libuv handle rules every protocol relies on:
 *
 *  - only the loop thread touches a handle or a connection;
 *  - a connection's memory is freed only from the close callback of the
 *    last of its two handles (stream and timer), so libuv never calls back
 *    into freed memory; write callbacks that run during close only free
 *    their own buffer;
 *  - a connection leaves the table (and the engine is told its client has
 *    gone) before anything of it is released.
 */
#include "server/server_impl.h"

#include <stdlib.h>
#include <string.h>

/* ---- the table ------------------------------------------------------------ */

srv_conn *srv_conn_find(cairn_server *s, uint64_t id)
{
    for (srv_conn *c = s->buckets[id % SRV_N_BUCKETS]; c; c = c->next)
        if (c->id == id)
            return c;
    return NULL;
}

static void table_insert(cairn_server *s, srv_conn *c)
{
    srv_conn **b = &s->buckets[c->id % SRV_N_BUCKETS];
    c->next = *b;
    *b = c;
    c->attached = true;
}

/* Leave the table: events for this client are dropped from now on, and the
 * engine cancels its work and releases its pages. */
static void detach(srv_conn *c)
{
    if (!c->attached)
        return;
    cairn_server *s = c->srv;
    for (srv_conn **p = &s->buckets[c->id % SRV_N_BUCKETS]; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    c->attached = false;
    if (!s->stopping && s->svc) {
        cairn_request *r = cairn_request_new(CAIRN_REQ_CLIENT_GONE);
        if (r) {
            r->client = c->id;
            cairn_service_submit(s->svc, r);
        }
    }
    if (c->ops->on_detach)
        c->ops->on_detach(c);
}

int srv_submit(srv_conn *c, cairn_request *r)
{
    r->client = c->id;
    r->tenant = c->tenant;
    if (!c->srv->svc) {
        cairn_request_free(r);
        return CAIRN_ECLOSED;
    }
    srv_http_note_submit(c->srv, r);
    return cairn_service_submit(c->srv->svc, r);
}

/* ---- closing ----------------------------------------------------------------- */

static void conn_free(srv_conn *c)
{
    cairn_server *s = c->srv;
    if (c->all_prev)
        c->all_prev->all_next = c->all_next;
    else if (s->all == c)
        s->all = c->all_next;
    if (c->all_next)
        c->all_next->all_prev = c->all_prev;
    if (c->ops->on_free)
        c->ops->on_free(c);
    free(c->in);
    free(c);
}

static void on_handle_closed(uv_handle_t *h)
{
    srv_conn *c = h->data;
    if (--c->open_handles == 0)
        conn_free(c);
}

void srv_conn_close(srv_conn *c)
{
    if (c->closing)
        return;
    c->closing = true;
    detach(c);
    cairn_log(CAIRN_LOG_DEBUG, "%s client %llu: closed", c->ops->name, (unsigned long long)c->id);
    uv_close((uv_handle_t *)c->stream, on_handle_closed);
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    (void)req;
    (void)status; /* EOF from the client, or the linger timer, closes it */
}

void srv_conn_linger(srv_conn *c)
{
    if (c->closing || c->lingering)
        return;
    c->lingering = true;
    detach(c);
    c->in_len = c->in_off = 0;
    if (uv_shutdown(&c->shutdown_req, c->stream, on_shutdown) != 0) {
        srv_conn_close(c);
        return;
    }
    srv_conn_timer(c, SRV_LINGER_S, srv_conn_close);
}

/* ---- the timer ----------------------------------------------------------------- */

static void on_timer(uv_timer_t *t)
{
    srv_conn *c = t->data;
    if (!c->closing && c->on_timer)
        c->on_timer(c);
}

void srv_conn_timer(srv_conn *c, double seconds, void (*fn)(srv_conn *c))
{
    if (c->closing)
        return;
    c->on_timer = fn;
    uv_timer_start(&c->timer, on_timer, (uint64_t)(seconds * 1000), 0);
}

void srv_conn_timer_stop(srv_conn *c)
{
    if (!c->closing)
        uv_timer_stop(&c->timer);
}

/* ---- writing ------------------------------------------------------------------- */

typedef struct {
    uv_write_t req;
    char *data;
} write_op;

static void on_write(uv_write_t *req, int status)
{
    write_op *w = (write_op *)req;
    srv_conn *c = req->handle->data;
    free(w->data);
    free(w);
    if (status < 0 && status != UV_ECANCELED)
        srv_conn_close(c);
}

void srv_conn_write(srv_conn *c, const void *data, size_t len)
{
    if (srv_conn_gone(c) || len == 0)
        return;
    /* Backpressure: a client that does not read its answers cannot make us
     * hold an unbounded amount of them. One answer is always accepted into
     * an empty queue, so a single large (but limited) answer still goes out
     * to a client that reads. */
    size_t queued = uv_stream_get_write_queue_size(c->stream);
    if (queued > 0 && queued + len > c->srv->cfg.max_output_bytes) {
        cairn_log(CAIRN_LOG_WARN, "%s client %llu: %zu bytes of output unread; disconnecting",
                  c->ops->name, (unsigned long long)c->id, queued + len);
        srv_conn_close(c);
        return;
    }
    uv_buf_t buf = uv_buf_init((char *)data, (unsigned)len);
    int n = queued == 0 ? uv_try_write(c->stream, &buf, 1) : UV_EAGAIN;
    if (n == (int)len)
        return;
    if (n < 0 && n != UV_EAGAIN) {
        srv_conn_close(c);
        return;
    }
    if (n < 0)
        n = 0;
    write_op *w = malloc(sizeof *w);
    char *copy = malloc(len - (size_t)n);
    if (!w || !copy) {
        free(w);
        free(copy);
        srv_conn_close(c);
        return;
    }
    memcpy(copy, (const char *)data + n, len - (size_t)n);
    w->data = copy;
    buf = uv_buf_init(copy, (unsigned)(len - (size_t)n));
    if (uv_write(&w->req, c->stream, &buf, 1, on_write) != 0) {
        free(copy);
        free(w);
        srv_conn_close(c);
    }
}

/* ---- reading --------------------------------------------------------------------- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    srv_conn *c = h->data;
    /* Move the unconsumed bytes to the front before growing. */
    if (c->in_off > 0) {
        memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
        c->in_len -= c->in_off;
        c->in_off = 0;
    }
    if (c->in_cap - c->in_len < SRV_READ_CHUNK) {
        size_t cap = c->in_cap ? c->in_cap : SRV_READ_CHUNK;
        while (cap - c->in_len < SRV_READ_CHUNK)
            cap *= 2;
        uint8_t *in = realloc(c->in, cap);
        if (!in) {
            *buf = uv_buf_init(NULL, 0); /* the read callback gets UV_ENOBUFS */
            return;
        }
        c->in = in;
        c->in_cap = cap;
    }
    *buf = uv_buf_init((char *)c->in + c->in_len, (unsigned)(c->in_cap - c->in_len));
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    srv_conn *c = stream->data;
    if (c->closing)
        return;
    if (nread < 0) { /* EOF, reset, or UV_ENOBUFS */
        srv_conn_close(c);
        return;
    }
    if (c->lingering || nread == 0) /* lingering: only waiting for EOF */
        return;
    c->in_len += (size_t)nread;
    c->ops->on_input(c);
    if (c->closing || c->lingering)
        return;
    if (c->in_off == c->in_len) {
        c->in_off = c->in_len = 0;
        /* Do not keep a big message's buffer on an idle connection. */
        if (c->in_cap > 4 * SRV_READ_CHUNK) {
            free(c->in);
            c->in = NULL;
            c->in_cap = 0;
        }
    }
}

void srv_conn_pause(srv_conn *c, bool paused)
{
    if (c->closing || c->reading_paused == paused)
        return;
    c->reading_paused = paused;
    if (paused)
        uv_read_stop(c->stream);
    else if (uv_read_start(c->stream, on_alloc, on_read) != 0)
        srv_conn_close(c);
}

/* ---- accepting --------------------------------------------------------------------- */

srv_conn *srv_conn_accept(cairn_server *s, uv_stream_t *listener, bool tcp,
                          const srv_conn_ops *ops, size_t size)
{
    srv_conn *c = calloc(1, size);
    if (!c)
        return NULL; /* the connection stays in the backlog; tried again later */
    c->srv = s;
    c->ops = ops;
    c->all_next = s->all;
    if (s->all)
        s->all->all_prev = c;
    s->all = c;
    if (tcp) {
        uv_tcp_init(&s->loop, &c->sock.tcp);
        c->stream = (uv_stream_t *)&c->sock.tcp;
    } else {
        uv_pipe_init(&s->loop, &c->sock.pipe, 0);
        c->stream = (uv_stream_t *)&c->sock.pipe;
    }
    uv_timer_init(&s->loop, &c->timer);
    c->stream->data = c->timer.data = c;
    c->open_handles = 2;
    c->id = ++s->next_client_id;
    if (uv_accept(listener, c->stream) != 0) {
        c->closing = true;
        uv_close((uv_handle_t *)c->stream, on_handle_closed);
        uv_close((uv_handle_t *)&c->timer, on_handle_closed);
        return NULL;
    }
    if (tcp)
        uv_tcp_nodelay(&c->sock.tcp, 1); /* streamed tokens should not wait for Nagle */
    c->authed = !cairn_access_required(s->access);
    table_insert(s, c);
    cairn_log(CAIRN_LOG_DEBUG, "%s client %llu: connected", ops->name, (unsigned long long)c->id);
    if (uv_read_start(c->stream, on_alloc, on_read) != 0) {
        srv_conn_close(c);
        return NULL;
    }
    return c;
}
