/*
 * route/net.c — one TCP stream on the router's loop: connect or accept,
 * read into a per-stream buffer, copying writes, and one way to close
 * (the owner is told once the handle is closed, and frees itself then).
 */
#include "route/route_impl.h"

#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NET_READ_CHUNK (64 * 1024)

typedef struct {
    uv_write_t req;
    rstream *s;
    size_t len;
    char data[];
} net_write;

void rstream_init(uv_loop_t *loop, rstream *s, void *owner)
{
    memset(s, 0, sizeof *s);
    uv_tcp_init(loop, &s->tcp);
    s->tcp.data = s;
    s->owner = owner;
    s->open = true;
}

static void on_closed(uv_handle_t *h)
{
    rstream *s = h->data;
    if (s->on_close)
        s->on_close(s);
}

void rstream_close(rstream *s)
{
    if (!s->open || s->closing)
        return;
    s->closing = true;
    uv_close((uv_handle_t *)&s->tcp, on_closed);
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    (void)suggested;
    buf->base = malloc(NET_READ_CHUNK);
    buf->len = buf->base ? NET_READ_CHUNK : 0;
}

static void read_cb(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
    rstream *s = st->data;
    if (n > 0 && !s->closing && s->on_read)
        s->on_read(s, buf->base, n);
    else if (n < 0 && !s->closing) {
        if (s->on_read)
            s->on_read(s, NULL, n);
        rstream_close(s);
    }
    free(buf->base);
}

void rstream_read(rstream *s, bool on)
{
    if (s->closing || on == s->reading)
        return;
    s->reading = on;
    if (on)
        uv_read_start((uv_stream_t *)&s->tcp, alloc_cb, read_cb);
    else
        uv_read_stop((uv_stream_t *)&s->tcp);
}

int rstream_accept(uv_stream_t *listener, rstream *s)
{
    if (uv_accept(listener, (uv_stream_t *)&s->tcp) != 0)
        return CAIRN_EIO;
    uv_tcp_nodelay(&s->tcp, 1);
    return CAIRN_OK;
}

static void connect_cb(uv_connect_t *req, int status)
{
    rstream *s = req->data;
    if (s->closing)
        return;
    if (status == 0)
        uv_tcp_nodelay(&s->tcp, 1);
    if (s->on_connect)
        s->on_connect(s, status);
    if (status < 0)
        rstream_close(s);
}

int rstream_connect(rstream *s, const struct sockaddr *addr)
{
    s->connect_req.data = s;
    int rc = uv_tcp_connect(&s->connect_req, &s->tcp, addr, connect_cb);
    return rc == 0 ? CAIRN_OK : CAIRN_EIO;
}

static void write_cb(uv_write_t *req, int status)
{
    net_write *w = (net_write *)req;
    rstream *s = w->s;
    s->out_pending -= w->len;
    free(w);
    if (status < 0)
        rstream_close(s);
}

void rstream_write(rstream *s, const void *data, size_t len)
{
    if (s->closing || len == 0)
        return;
    if (s->max_pending && s->out_pending + len > s->max_pending) {
        /* a client that does not read cannot make the router hold its
         * answers without bound (as a replica's --max-output) */
        cairn_log(CAIRN_LOG_INFO, "route: a peer stopped reading; closing it");
        rstream_close(s);
        return;
    }
    net_write *w = malloc(sizeof *w + len);
    if (!w) {
        rstream_close(s);
        return;
    }
    memcpy(w->data, data, len);
    w->s = s;
    w->len = len;
    uv_buf_t b = uv_buf_init(w->data, (unsigned)len);
    if (uv_write(&w->req, (uv_stream_t *)&s->tcp, &b, 1, write_cb) != 0) {
        free(w);
        rstream_close(s);
        return;
    }
    s->out_pending += len;
}

static void shutdown_cb(uv_shutdown_t *req, int status)
{
    (void)status;
    rstream_close(req->data);
}

void rstream_finish(rstream *s)
{
    if (s->closing)
        return;
    s->shutdown_req.data = s;
    rstream_read(s, false);
    if (uv_shutdown(&s->shutdown_req, (uv_stream_t *)&s->tcp, shutdown_cb) != 0)
        rstream_close(s);
}

int route_parse_hostport(const char *text, struct sockaddr_storage *out)
{
    const char *colon = strrchr(text, ':');
    if (!colon || colon == text || !colon[1])
        return CAIRN_EINVAL;
    char host[256];
    size_t hl = (size_t)(colon - text);
    if (hl >= sizeof host)
        return CAIRN_EINVAL;
    memcpy(host, text, hl);
    host[hl] = '\0';
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') { /* [::1]:port */
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port <= 0 || port > 65535)
        return CAIRN_EINVAL;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%ld", port);
    if (getaddrinfo(host, ps, &hints, &res) != 0 || !res)
        return CAIRN_ENOTFOUND;
    memset(out, 0, sizeof *out);
    memcpy(out, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return CAIRN_OK;
}
