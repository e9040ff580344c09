/*
 * server/http/conn.c — an HTTP/1.1 connection: libhttp-parser callbacks
 * (every part of a request under its cap, credentials checked before the
 * body is read), the request deadline, routing, and keep-alive.
 */
#include "server/http/http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static hconn *of(http_parser *p) { return p->data; }

/* ---- deadlines and the end of a response ------------------------------------------ */

static void on_read_deadline(srv_conn *sc)
{
    hconn *c = (hconn *)sc;
    if (c->active)
        return;
    if (c->in_request || c->base.in_len > c->base.in_off) {
        cairn_log(CAIRN_LOG_INFO, "http client %llu: request not received in time",
                  (unsigned long long)c->base.id);
        c->keep_alive = false;
        http_respond_error(c, 408, "the request was not received in time", NULL, NULL);
    } else {
        srv_conn_close(&c->base); /* an idle keep-alive connection */
    }
}

void http_response_finished(hconn *c)
{
    if (srv_conn_gone(&c->base))
        return;
    if (!c->keep_alive || c->base.srv->draining) {
        srv_conn_linger(&c->base);
        return;
    }
    c->in_request = false;
    srv_conn_timer(&c->base, c->base.srv->cfg.http.timeout_s, on_read_deadline);
    if (!c->in_process)
        http_conn_process(c); /* a request may already be waiting in the buffer */
}

/* ---- routing -------------------------------------------------------------------------- */

static bool path_is(const hconn *c, const char *p)
{
    if (!c->url.data)
        return false;
    size_t n;
    const char *path = http_path(c, &n);
    return n == strlen(p) && memcmp(path, p, n) == 0;
}

static const char *allow_list(unsigned method)
{
    return method == HTTP_GET      ? "GET, HEAD, OPTIONS"
           : method == HTTP_DELETE ? "GET, HEAD, DELETE, OPTIONS" /* /v1/responses/{id} */
                                   : "POST, OPTIONS";
}

static void method_not_allowed(hconn *c, unsigned allowed)
{
    char allow[64];
    snprintf(allow, sizeof allow, "Allow: %s\r\n", allow_list(allowed));
    json_t *body = http_error_body(405, "method not allowed", NULL, NULL);
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    http_respond(c, 405, "application/json", text ? text : "{}", text ? strlen(text) : 2, allow);
    free(text);
    json_decref(body);
}

/* /v1/models/{id} */
static bool model_route(hconn *c)
{
    static const char prefix[] = "/v1/models/";
    size_t plen = sizeof prefix - 1, n;
    http_path(c, &n);
    if (!(n > plen && memcmp(c->url.data, prefix, plen) == 0 &&
          (c->parser.method == HTTP_GET || c->parser.method == HTTP_HEAD)))
        return false;
    const char *id = c->base.srv->model_id;
    if (n - plen == strlen(id) && memcmp(c->url.data + plen, id, n - plen) == 0) {
        json_t *o = json_pack("{s:s, s:s, s:I, s:s}", "id", id, "object", "model", "created",
                              (json_int_t)0, "owned_by", "cairn");
        http_respond_json(c, 200, o);
        json_decref(o);
    } else {
        http_respond_error(c, 404, "no such model", "model", "model_not_found");
    }
    return true;
}

/* OPTIONS: what the route takes, and — for an allowed origin — the CORS
 * preflight's answer (the methods, and the headers the browser asked for). */
static void preflight(hconn *c, unsigned method)
{
    cairn_strbuf h = {0};
    http_printf(&h, "Allow: %s\r\n", allow_list(method));
    if (c->cors_allowed) {
        http_printf(&h, "Access-Control-Allow-Methods: %s\r\nAccess-Control-Max-Age: 600\r\n",
                    allow_list(method));
        if (c->cors_headers && *c->cors_headers) {
            cairn_strbuf_add(&h, "Access-Control-Allow-Headers: ", 30);
            cairn_strbuf_add(&h, c->cors_headers, strlen(c->cors_headers));
            cairn_strbuf_add(&h, "\r\n", 2);
        }
    }
    if (h.oom) {
        cairn_strbuf_free(&h);
        srv_conn_close(&c->base);
        return;
    }
    http_respond(c, 200, "text/plain", "", 0, h.data);
    cairn_strbuf_free(&h);
}

static void handle_message(hconn *c)
{
    if (c->base.srv->draining) {
        c->keep_alive = false;
        http_respond_error(c, 503, "the server is shutting down", NULL, NULL);
        return;
    }
    static const struct {
        const char *path;
        unsigned method;
        int route;
    } routes[] = {
        {"/health", HTTP_GET, 1},
        {"/v1/models", HTTP_GET, 2},
        {"/metrics", HTTP_GET, 3},
        {"/v1/chat/completions", HTTP_POST, 4},
        {"/v1/completions", HTTP_POST, 5},
        {"/tokenize", HTTP_POST, 6},
        {"/detokenize", HTTP_POST, 7},
        {"/v1/messages", HTTP_POST, 8},
        {"/v1/responses", HTTP_POST, 9},
        {"/v1/cache/explain", HTTP_POST, 10},
        {"/v1/chat/completions/render", HTTP_POST, 11},
        {"/v1/completions/render", HTTP_POST, 12},
        {"/v1/messages/render", HTTP_POST, 13},
    };
    const unsigned method = c->parser.method;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (!path_is(c, routes[i].path))
            continue;
        if (method == HTTP_OPTIONS) {
            preflight(c, routes[i].method);
            return;
        }
        if (method != routes[i].method && !(method == HTTP_HEAD && routes[i].method == HTTP_GET)) {
            method_not_allowed(c, routes[i].method);
            return;
        }
        switch (routes[i].route) {
        case 1: {
            static const char ok[] = "{\"status\":\"ok\"}";
            http_respond(c, 200, "application/json", ok, sizeof ok - 1, NULL);
            return;
        }
        case 2: http_handle_models(c); return;
        case 3: http_handle_metrics(c); return;
        case 4: http_handle_generation(c, CAIRN_API_CHAT); return;
        case 5: http_handle_generation(c, CAIRN_API_COMPLETION); return;
        case 6: http_handle_generation(c, CAIRN_API_TOKENIZE); return;
        case 7: http_handle_generation(c, CAIRN_API_DETOKENIZE); return;
        case 8: http_handle_wire(c, &http_anthropic_wire); return;
        case 10: http_handle_explain(c); return;
        case 11: http_handle_render(c, CAIRN_API_CHAT); return;
        case 12: http_handle_render(c, CAIRN_API_COMPLETION); return;
        case 13: http_handle_render(c, CAIRN_API_MESSAGES); return;
        default: http_handle_wire(c, &http_responses_wire); return;
        }
    }
    const char *url = c->url.data ? c->url.data : "";
    if (method == HTTP_OPTIONS && strncmp(url, "/v1/models/", 11) == 0)
        preflight(c, HTTP_GET);
    else if (method == HTTP_OPTIONS && strncmp(url, "/v1/responses/", 14) == 0)
        preflight(c, HTTP_DELETE);
    else if (!model_route(c) && !http_responses_route(c) && !http_web_route(c))
        http_respond_error(c, 404, "no such route", NULL, NULL);
}

/* ---- parser callbacks ------------------------------------------------------------------- */

static int refuse_in_parser(hconn *c, int status, const char *message)
{
    c->error_status = status;
    c->error_message = message;
    return -1;
}

static int count_header_bytes(hconn *c, size_t n)
{
    c->header_bytes += n;
    if (c->header_bytes > c->base.srv->cfg.http.max_header_bytes)
        return refuse_in_parser(c, 431, "the request line and headers are too large");
    return 0;
}

static int on_message_begin(http_parser *p)
{
    hconn *c = of(p);
    c->in_request = true;
    c->url.len = c->field.len = c->value.len = c->body.len = 0;
    c->header_bytes = 0;
    c->header_is_value = false;
    free(c->authorization);
    free(c->session_header);
    free(c->origin);
    free(c->cors_headers);
    free(c->api_key);
    free(c->host);
    c->authorization = c->session_header = c->origin = c->cors_headers = c->api_key = NULL;
    c->host = NULL;
    c->cors_allowed = c->head_only = false;
    c->expect_continue = false;
    return 0;
}

static int on_url(http_parser *p, const char *at, size_t len)
{
    hconn *c = of(p);
    if (count_header_bytes(c, len))
        return -1;
    cairn_strbuf_add(&c->url, at, len);
    return c->url.oom ? refuse_in_parser(c, 503, "out of memory") : 0;
}

static bool name_is(const cairn_strbuf *b, const char *name)
{
    return b->len == strlen(name) && strncasecmp(b->data, name, b->len) == 0;
}

static char *trimmed_copy(const cairn_strbuf *b)
{
    const char *s = b->data ? b->data : "";
    size_t n = b->len;
    while (n && (*s == ' ' || *s == '\t'))
        s++, n--;
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        n--;
    char *out = malloc(n + 1);
    if (out) {
        memcpy(out, s, n);
        out[n] = '\0';
    }
    return out;
}

/* One whole header (field and value) has arrived. */
static int header_done(hconn *c)
{
    if (c->field.len == 0)
        return 0;
    char **dst = name_is(&c->field, "authorization")    ? &c->authorization
                 : name_is(&c->field, "x-session-id")   ? &c->session_header
                 : name_is(&c->field, "x-api-key")      ? &c->api_key
                 : name_is(&c->field, "origin")         ? &c->origin
                 : name_is(&c->field, "host")           ? &c->host
                 : name_is(&c->field, "access-control-request-headers") ? &c->cors_headers
                                                        : NULL;
    if (dst) {
        free(*dst);
        if (!(*dst = trimmed_copy(&c->value)))
            return refuse_in_parser(c, 503, "out of memory");
    } else if (name_is(&c->field, "expect")) {
        char *v = trimmed_copy(&c->value);
        if (!v || strcasecmp(v, "100-continue") != 0) {
            free(v);
            return refuse_in_parser(c, 417, "only Expect: 100-continue is supported");
        }
        free(v);
        c->expect_continue = true;
    }
    c->field.len = c->value.len = 0;
    return 0;
}

static int on_header_field(http_parser *p, const char *at, size_t len)
{
    hconn *c = of(p);
    if (count_header_bytes(c, len))
        return -1;
    if (c->header_is_value && header_done(c))
        return -1;
    c->header_is_value = false;
    cairn_strbuf_add(&c->field, at, len);
    return c->field.oom ? refuse_in_parser(c, 503, "out of memory") : 0;
}

static int on_header_value(http_parser *p, const char *at, size_t len)
{
    hconn *c = of(p);
    if (count_header_bytes(c, len))
        return -1;
    c->header_is_value = true;
    cairn_strbuf_add(&c->value, at, len);
    return c->value.oom ? refuse_in_parser(c, 503, "out of memory") : 0;
}

/* Constant-time check of "Bearer TOKEN" (or, as Anthropic's clients send
 * it, "x-api-key: TOKEN") against the server's credentials (server.h,
 * section 1): the token decides the tenant. */
static int check_auth(hconn *c)
{
    const cairn_access *access = c->base.srv->access;
    if (!cairn_access_required(access)) {
        c->base.tenant = 0;
        return 0;
    }
    const char *a = c->authorization, *tok = c->api_key; /* Authorization wins */
    if (a) {
        if (strncasecmp(a, "Bearer ", 7) != 0)
            return -1;
        tok = a + 7;
        while (*tok == ' ')
            tok++;
    }
    if (!tok)
        return -1;
    uint64_t tenant;
    const char *name;
    if (cairn_access_check(access, tok, strlen(tok), &tenant, &name) != CAIRN_OK)
        return -1;
    c->base.tenant = tenant;
    return 0;
}

/* Is `origin` in the comma-separated list (or is the list "*")? */
static bool origin_listed(const char *list, const char *origin)
{
    if (!list || !origin || !*origin)
        return false;
    for (const char *p = list; *p;) {
        while (*p == ' ' || *p == ',')
            p++;
        size_t n = strcspn(p, ", ");
        if ((n == 1 && *p == '*') || (n == strlen(origin) && strncasecmp(p, origin, n) == 0))
            return true;
        p += n;
    }
    return false;
}

/* The value of a header echoed back must not carry a line break. */
static bool header_safe(const char *v)
{
    return v && !strpbrk(v, "\r\n");
}

static int on_headers_complete(http_parser *p)
{
    hconn *c = of(p);
    if (c->header_is_value && header_done(c))
        return -1;
    c->header_is_value = false;
    c->head_only = p->method == HTTP_HEAD;
    c->cors_allowed = header_safe(c->origin) &&
                      origin_listed(c->base.srv->cfg.http.cors_origins, c->origin);
    if (c->cors_headers && !header_safe(c->cors_headers)) {
        free(c->cors_headers);
        c->cors_headers = NULL;
    }
    /* Refuse what we can before reading a byte of the body. A preflight
     * carries no credentials, and answers with no data. */
    if (p->method != HTTP_OPTIONS && !path_is(c, "/health") && !http_web_is_page(c) &&
        check_auth(c) != 0)
        return refuse_in_parser(c, 401, "a valid 'Authorization: Bearer TOKEN' (or 'x-api-key: "
                                        "TOKEN') header is required");
    if ((p->flags & F_CONTENTLENGTH) && p->content_length > c->base.srv->cfg.http.max_body_bytes)
        return refuse_in_parser(c, 413, "the request body is too large");
    if (c->expect_continue) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        srv_conn_write(&c->base, cont, sizeof cont - 1);
    }
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t len)
{
    hconn *c = of(p);
    if (c->body.len + len > c->base.srv->cfg.http.max_body_bytes)
        return refuse_in_parser(c, 413, "the request body is too large");
    cairn_strbuf_add(&c->body, at, len);
    return c->body.oom ? refuse_in_parser(c, 503, "out of memory") : 0;
}

static int on_message_complete(http_parser *p)
{
    hconn *c = of(p);
    c->message_done = true;
    c->keep_alive = http_should_keep_alive(p) != 0;
    http_parser_pause(p, 1); /* act on it before parsing anything after it */
    return 0;
}

/* ---- reading ------------------------------------------------------------------------------ */

void http_conn_process(hconn *c)
{
    srv_conn *b = &c->base;
    c->in_process = true;
    while (!srv_conn_gone(b) && !c->active && b->in_off < b->in_len) {
        size_t n = http_parser_execute(&c->parser, &b->srv->http->settings,
                                       (const char *)b->in + b->in_off, b->in_len - b->in_off);
        b->in_off += n;
        if (c->message_done) {
            c->message_done = false;
            http_parser_pause(&c->parser, 0);
            srv_conn_timer_stop(b);
            handle_message(c);
            continue;
        }
        enum http_errno err = HTTP_PARSER_ERRNO(&c->parser);
        if (err != HPE_OK) {
            int status = c->error_status ? c->error_status : 400;
            char msg[200];
            snprintf(msg, sizeof msg, "%s", c->error_status ? c->error_message
                                                            : http_errno_description(err));
            c->keep_alive = false;
            if (status == 401)
                cairn_log(CAIRN_LOG_INFO, "http client %llu: unauthorized",
                          (unsigned long long)b->id);
            http_respond_error(c, status, msg, NULL, NULL);
            break;
        }
    }
    c->in_process = false;
}

static void on_input(srv_conn *b)
{
    hconn *c = (hconn *)b;
    /* Bytes wait in the buffer while a request runs (a pipelining client);
     * more than a whole request's worth of them is not a client we serve. */
    const cairn_http_config *cfg = &b->srv->cfg.http;
    if (b->in_len - b->in_off > cfg->max_body_bytes + cfg->max_header_bytes + SRV_READ_CHUNK) {
        srv_conn_close(b);
        return;
    }
    if (!c->active) {
        c->in_request = true;
        http_conn_process(c);
    }
}

static bool on_event(srv_conn *b, srv_event *node) { return http_on_event((hconn *)b, node); }

/* Draining waits for the request being answered (its body may still be
 * on a text worker). */
static bool busy(srv_conn *b) { return ((hconn *)b)->active != NULL; }

static void on_free(srv_conn *b)
{
    hconn *c = (hconn *)b;
    http_request_free(c->active);
    cairn_strbuf_free(&c->url);
    cairn_strbuf_free(&c->field);
    cairn_strbuf_free(&c->value);
    cairn_strbuf_free(&c->body);
    free(c->authorization);
    free(c->session_header);
    free(c->origin);
    free(c->cors_headers);
    free(c->api_key);
    free(c->host);
}

const srv_conn_ops srv_http_ops = {
    .name = "http",
    .on_input = on_input,
    .on_event = on_event,
    .on_free = on_free,
    .busy = busy,
};

void srv_http_accept(cairn_server *s, uv_stream_t *listener)
{
    srv_conn *b = srv_conn_accept(s, listener, true, &srv_http_ops, sizeof(hconn));
    if (!b)
        return;
    hconn *c = (hconn *)b;
    c->keep_alive = true;
    http_parser_init(&c->parser, HTTP_REQUEST);
    c->parser.data = c;
    srv_conn_timer(b, s->cfg.http.timeout_s, on_read_deadline);
}

int srv_http_create(cairn_server *s, srv_http **out)
{
    (void)s;
    srv_http *h = calloc(1, sizeof *h);
    if (!h)
        return CAIRN_ENOMEM;
    h->settings.on_message_begin = on_message_begin;
    h->settings.on_url = on_url;
    h->settings.on_header_field = on_header_field;
    h->settings.on_header_value = on_header_value;
    h->settings.on_headers_complete = on_headers_complete;
    h->settings.on_body = on_body;
    h->settings.on_message_complete = on_message_complete;
    if (srv_web_create(&h->web) != CAIRN_OK) {
        free(h);
        return CAIRN_ENOMEM;
    }
    *out = h;
    return CAIRN_OK;
}

void srv_http_free(srv_http *h)
{
    if (h)
        srv_web_free(h->web);
    free(h);
}
