/*
 * server/http/respond.c — writing HTTP/1.1 responses: whole ones with a
 * body, OpenAI-shaped errors (Anthropic-shaped on its route), and
 * server-sent event streams (chunked; `data:` only, or named events).
 * Every writer takes a connection that a failed write has just closed: it
 * then writes nothing.
 */
#include "server/http/http.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void http_count_status(srv_http *h, int code)
{
    for (int i = 0; i < HTTP_N_STATUS_SLOTS; i++) {
        if (h->status_counts[i].code == code || h->status_counts[i].code == 0) {
            h->status_counts[i].code = code;
            h->status_counts[i].n++;
            return;
        }
    }
}

static const char *status_text(int code)
{
    switch (code) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Payload Too Large";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "Error";
    }
}

int http_status_of(int cairn_code)
{
    switch (cairn_code) {
    case CAIRN_EINVAL:
    case CAIRN_EFORMAT:
    case CAIRN_ERANGE:
    case CAIRN_EUNSUPPORTED: return 400;
    case CAIRN_ENOTFOUND: return 404;
    case CAIRN_EBUSY: return 409;
    case CAIRN_EFULL:
    case CAIRN_ENOMEM: return 503;
    case CAIRN_EPERM: return 401;
    case CAIRN_EQUOTA: return 429; /* the caller's bound, as a rate limit is */
    default: return 500;
    }
}

void http_printf(cairn_strbuf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        cairn_strbuf_add(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* Access-Control-Allow-Origin for an allowed origin (conn.c decides). */
static void add_cors(const hconn *c, cairn_strbuf *out)
{
    if (!c->cors_allowed)
        return;
    http_printf(out, "Access-Control-Allow-Origin: %.400s\r\nVary: Origin\r\n", c->origin);
}

void http_respond(hconn *c, int status, const char *content_type, const char *body,
                  size_t body_len, const char *extra_headers)
{
    if (srv_conn_gone(&c->base))
        return;
    http_count_status(c->base.srv->http, status);
    cairn_strbuf out = {0};
    http_printf(&out, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: %s\r\n",
               status, status_text(status), content_type, body_len,
               c->keep_alive ? "keep-alive" : "close");
    if (extra_headers)
        cairn_strbuf_add(&out, extra_headers, strlen(extra_headers));
    add_cors(c, &out);
    cairn_strbuf_add(&out, "\r\n", 2);
    if (!c->head_only) /* HEAD: the headers GET would have, Content-Length included */
        cairn_strbuf_add(&out, body, body_len);
    if (out.oom) {
        cairn_strbuf_free(&out);
        srv_conn_close(&c->base);
        return;
    }
    srv_conn_write(&c->base, out.data, out.len);
    cairn_strbuf_free(&out);
    http_response_finished(c);
}

void http_respond_json(hconn *c, int status, json_t *obj)
{
    char *text = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    if (!text) {
        static const char oom[] =
            "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
            "\"code\":null}}";
        http_respond(c, 500, "application/json", oom, sizeof oom - 1, NULL);
        return;
    }
    http_respond(c, status, "application/json", text, strlen(text), NULL);
    free(text);
}

json_t *http_error_body(int status, const char *message, const char *param, const char *code)
{
    const char *type = status == 401   ? "authentication_error"
                       : status >= 500 ? "server_error"
                       : status == 429 ? "rate_limit_error"
                                       : "invalid_request_error";
    json_t *e = json_pack("{s:s, s:s, s:o, s:o}", "message", message ? message : "", "type",
                          type, "param", param ? json_string(param) : json_null(), "code",
                          code ? json_string(code) : json_null());
    return e ? json_pack("{s:o}", "error", e) : NULL;
}

const char *http_path(const hconn *c, size_t *len)
{
    const char *u = c->url.data ? c->url.data : "";
    size_t n = 0;
    while (n < c->url.len && u[n] != '?')
        n++;
    *len = n;
    return u;
}

void http_respond_error(hconn *c, int status, const char *message, const char *param,
                        const char *code)
{
    /* every answer on Anthropic's route has its shape, errors included */
    json_t *body = http_path_is_anthropic(c) ? http_anthropic_error_body(status, message)
                                             : http_error_body(status, message, param, code);
    if (status == 401) {
        /* the client's credentials are wrong: answer and close */
        c->keep_alive = false;
        char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
        const char *t = text ? text : "{}";
        http_respond(c, status, "application/json", t, strlen(t), "WWW-Authenticate: Bearer\r\n");
        free(text);
    } else {
        http_respond_json(c, status, body);
    }
    json_decref(body);
}

/* ---- server-sent events ------------------------------------------------------- */

void http_sse_head(hconn *c)
{
    if (srv_conn_gone(&c->base))
        return;
    http_count_status(c->base.srv->http, 200);
    static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                               "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n";
    cairn_strbuf out = {0};
    cairn_strbuf_add(&out, head, sizeof head - 1);
    add_cors(c, &out);
    http_printf(&out, "Connection: %s\r\n\r\n", c->keep_alive ? "keep-alive" : "close");
    if (!out.oom)
        srv_conn_write(&c->base, out.data, out.len);
    cairn_strbuf_free(&out);
}

/* One `data: ...` event as one HTTP chunk. */
static void sse_data(hconn *c, const char *payload, size_t len)
{
    if (srv_conn_gone(&c->base))
        return;
    cairn_strbuf out = {0};
    http_printf(&out, "%zx\r\ndata: ", len + 8);
    cairn_strbuf_add(&out, payload, len);
    cairn_strbuf_add(&out, "\n\n\r\n", 4);
    if (out.oom)
        srv_conn_close(&c->base);
    else
        srv_conn_write(&c->base, out.data, out.len);
    cairn_strbuf_free(&out);
}

void http_sse_json(hconn *c, json_t *obj)
{
    if (srv_conn_gone(&c->base))
        return;
    char *text = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    if (!text) {
        srv_conn_close(&c->base);
        return;
    }
    sse_data(c, text, strlen(text));
    free(text);
}

void http_sse_event(hconn *c, const char *name, json_t *obj)
{
    if (srv_conn_gone(&c->base))
        return;
    char *text = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    cairn_strbuf out = {0};
    size_t nl = strlen(name), tl = text ? strlen(text) : 0;
    /* "event: " NAME "\n" "data: " JSON "\n\n" as one chunk */
    http_printf(&out, "%zx\r\nevent: ", 7 + nl + 1 + 6 + tl + 2);
    cairn_strbuf_add(&out, name, nl);
    cairn_strbuf_add(&out, "\ndata: ", 7);
    cairn_strbuf_add(&out, text ? text : "", tl);
    cairn_strbuf_add(&out, "\n\n\r\n", 4);
    if (!text || out.oom)
        srv_conn_close(&c->base);
    else
        srv_conn_write(&c->base, out.data, out.len);
    cairn_strbuf_free(&out);
    free(text);
}

void http_sse_close(hconn *c)
{
    if (srv_conn_gone(&c->base))
        return;
    srv_conn_write(&c->base, "0\r\n\r\n", 5);
    http_response_finished(c);
}

void http_sse_end(hconn *c)
{
    if (srv_conn_gone(&c->base))
        return;
    sse_data(c, "[DONE]", 6);
    srv_conn_write(&c->base, "0\r\n\r\n", 5);
    http_response_finished(c);
}
