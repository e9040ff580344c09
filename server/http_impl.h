/*
 * protocol/http_impl.h — the OpenAI-compatible HTTP facade as the server
 * (protocol/server.c) drives it. Internal to protocol/: the settings are
 * cairn_http_config in protocol.h, the routes are in docs/openai.md.
 *
 * Everything here runs on the server's loop thread.
 *
 * Life: cairn_http_create binds the listener (before the model loads, like
 * the msgpack listeners; nothing is accepted until the loop runs), then
 * cairn_http_set_service gives it the started service. Engine events whose
 * client id has CAIRN_HTTP_CLIENT_BIT go to cairn_http_on_event.
 * cairn_http_shutdown (before cairn_service_stop) stops listening and
 * closes every connection; cairn_http_free, once the loop has run the close
 * callbacks, frees what is left (requests whose answers never came).
 */
#ifndef CAIRN_PROTOCOL_HTTP_IMPL_H
#define CAIRN_PROTOCOL_HTTP_IMPL_H

#include "server/server.h"

#include <uv.h>

typedef struct cairn_http cairn_http;

/* What the facade borrows from the server; every pointer must outlive it. */
typedef struct {
    uv_loop_t *loop;
    const cairn_http_config *cfg;
    const cairn_access *access;  /* who may use it (section 3 of protocol.h) */
    uint64_t *next_client_id;    /* the server's counter: ids never collide  */
    uint64_t *seed_state;        /* splitmix64 state for requests without a seed */
    size_t max_output_bytes;     /* unread output per connection            */
} cairn_http_env;

/* Bind and listen. CAIRN_EINVAL (bad address), CAIRN_EIO (cannot listen),
 * CAIRN_ENOMEM; err says which. */
int cairn_http_create(const cairn_http_env *env, cairn_http **out, char *err, size_t err_len);

/* The service requests go to, and the model file (for the model id). */
void cairn_http_set_service(cairn_http *h, cairn_service *svc, const char *model_path);

int cairn_http_port(const cairn_http *h);
/* "http 127.0.0.1:8080" */
void cairn_http_describe(const cairn_http *h, char *out, size_t cap);

/* An engine event for one of the facade's clients (copied by the server;
 * valid during the call). */
void cairn_http_on_event(cairn_http *h, const cairn_event *ev);

/* Stop listening and close every connection (no CLIENT_GONE: the service
 * is about to stop). */
void cairn_http_shutdown(cairn_http *h);

/* After the loop has closed the handles. NULL is a no-op. */
void cairn_http_free(cairn_http *h);

#endif /* CAIRN_PROTOCOL_HTTP_IMPL_H */
