/*
 * server/server.h — the loop thread: cairn's network front ends on one
 * libuv loop, in front of one engine (session/session.h).
 *
 *        clients                      loop thread (libuv)                engine thread
 *   msgpack-RPC ──TCP/Unix──▶ msgpack/ conn ─┐                          ┌─▶ session/
 *   OpenAI HTTP ────TCP────▶ http/ conn ─────┼─▶ text workers (libuv's ─┘    (sessions,
 *                                             │   threadpool): api/ turns     scheduler,
 *                                             │   params into requests        cache)
 *        ◀────── responses, SSE chunks ◀──────┴──── events (uv_async) ◀──────┘
 *
 * Threads and ownership
 * ---------------------
 *   loop thread   (the caller of cairn_server_run) owns every libuv handle,
 *                 every connection, their buffers and the connection table.
 *                 It reads, delimits and writes; it submits requests in the
 *                 order each connection sent them.
 *   text workers  decode requests (api/api.h: tokenizing long documents,
 *                 rendering chat templates, compiling grammars) and read
 *                 finished replies for tool calls. They touch no handle and
 *                 no connection: a work item names its connection by id.
 *   engine thread (inside cairn_service) calls the server's event callback.
 *                 That callback only copies the event into a node, appends
 *                 it to a mutex-protected queue and calls uv_async_send; it
 *                 never touches a connection.
 *
 * Connections are never referred to by pointer across threads: a request
 * carries its connection's 64-bit id (never reused), and the loop looks the
 * id up in its table when the event (or the work item) comes back. An event
 * for a connection that has gone is dropped. When a connection closes, the
 * server submits CAIRN_REQ_CLIENT_GONE so the engine cancels its work and
 * frees its pages. The life of a connection, whatever its protocol, is
 * drawn in server_impl.h.
 *
 * The native protocol (docs/protocol.md; its codec is msgpack/msgpack.h):
 * requests may overlap and responses come in any order. Reasons to close:
 * EOF or read error, a message with no readable msgid that is not a
 * request, more than max_output_bytes of responses the client has not read
 * (backpressure; one answer is always accepted into an empty queue),
 * idle_timeout_s without a byte while a message is half received, and —
 * when credentials are configured (section 1) — any error before a
 * successful `auth`, a wrong token, or no `auth` within idle_timeout_s of
 * connecting (the first two after the answer: lingering close). Requests in
 * flight per connection are capped (max_inflight, then `overloaded`), a
 * msgid already in flight is refused, and a connection is not read while a
 * message of it is being decoded (what it sends next waits in its socket). A malformed message that still has a msgid is answered
 * with an error; when the stream can be resynchronised (a string or count
 * over a limit: the scanner skips the rest of that message without
 * buffering it) the connection stays open, otherwise the server answers,
 * stops reading requests and closes after the answer has been written
 * ("lingering close", so the answer is not lost to a reset).
 *
 * Shutdown (SIGINT/SIGTERM, or cairn_server_stop): stop accepting, close
 * every connection, cairn_service_stop (after which no event can arrive),
 * then close the async handle, let the text workers' items come back, and
 * remove the Unix socket file. No handle is closed while the engine thread
 * could still signal it.
 */
#ifndef CAIRN_SERVER_H
#define CAIRN_SERVER_H

#include "runtime/runtime.h"
#include "session/session.h"


#ifdef __cplusplus
extern "C" {
#endif

/* ---- limits of the native protocol (docs/protocol.md) -------------------- */

/* Hard cap on nesting the scanner can follow at all (its stack size). The
 * configurable max_depth must be <= this. */
#define CAIRN_MP_DEPTH_CAP 32

typedef struct {
    uint32_t max_message_bytes; /* one whole message (default 8 MiB)          */
    uint32_t max_depth;         /* nested arrays/maps, top level = 1 (8)      */
    uint32_t max_string_bytes;  /* one str, bin or ext payload (4 MiB)        */
    uint32_t max_array_len;     /* elements of one array (1,048,576)          */
    uint32_t max_map_len;       /* pairs of one map (65,536)                  */
} cairn_mp_limits;

/* Fill in the defaults named above. */
void cairn_mp_limits_default(cairn_mp_limits *lim);

/* ======================================================================== */
/* 1. Access control                                                        */
/* ======================================================================== */
/*
 * Who may use a server, and whose sessions and cache a connection sees
 * (docs/protocol.md, "Access control").
 *
 *   none         no credentials: every connection may do everything, and
 *                everything runs as tenant 0 (no tenants). Only allowed when
 *                TCP listens on a loopback address (127.0.0.0/8, ::1) or not
 *                at all; the Unix socket is mode 0600 either way.
 *   shared token one credential without a name (`serve --auth-token` or
 *                `--auth-token-file`): a connection must present it; then it
 *                runs as tenant 0, like a server without tokens.
 *   tenants      named credentials (`serve --tenants FILE`, lines
 *                `NAME TOKEN`): the token a connection presents decides its
 *                tenant. Every request of that connection carries the
 *                tenant's id in cairn_request.tenant, and the engine scopes
 *                sessions (another tenant's session is not_found) and the
 *                prefix cache (no page is shared across tenants, so neither
 *                is the time a cache hit saves) by it.
 *
 * With any credential, a connection — TCP or Unix socket alike — must call
 * `auth {token}` before anything else, server.info included. Anything else
 * first, or a wrong token, is answered `unauthorized` and the connection is
 * closed after that answer. Until it authenticates a connection also lives
 * under tighter limits (CAIRN_PREAUTH_*: a small message, no resynchronising
 * after an error) and must authenticate within idle_timeout_s of
 * connecting. Without credentials `auth` is accepted, whatever the token,
 * and answered {tenant: nil}, so a client may always send it.
 *
 * A later `auth` on an authenticated connection is checked again: a wrong
 * token closes the connection; a token of another tenant is refused
 * (invalid_request) and the connection keeps its tenant.
 *
 * Tenant id: cairn_tenant_id(NAME) = XXH3-64(NAME, seed
 * CAIRN_TENANT_ID_SEED), with 0 mapped to 1 (0 means "no tenants"). It is a
 * function of the name alone, so it is the same after a restart — the disk
 * tier's page keys are derived from it — and renaming a tenant starts it on
 * an empty cache. It is not a secret: isolation comes from the token check,
 * which decides which id a connection gets, not from the id being unknown.
 *
 * Token comparison takes the same time whichever token was sent and
 * whichever credential (if any) it matches: every credential is compared,
 * each over CAIRN_AUTH_TOKEN_MAX bytes, and the match is selected with masks.
 */

#define CAIRN_AUTH_TOKEN_MAX 256       /* bytes of a token at most              */
#define CAIRN_TENANT_NAME_MAX 64       /* bytes of a tenant name at most        */
#define CAIRN_TENANT_ID_SEED 0x636169726e2e746eull /* "cairn.tn"              */
/* Limits before authentication (each also at most the configured one). */
#define CAIRN_PREAUTH_MESSAGE_BYTES 4096
#define CAIRN_PREAUTH_STRING_BYTES 1024
#define CAIRN_PREAUTH_DEPTH 4
#define CAIRN_PREAUTH_COUNT 16          /* array elements and map pairs          */

typedef struct {
    const char *name;  /* tenant name (1..64 of A-Z a-z 0-9 . _ -); NULL for the
                          single shared token of a server without tenants   */
    const char *token; /* 1..256 printable ASCII characters, no spaces       */
} cairn_credential;

/* The tenant id of a name (see above); never 0. */
uint64_t cairn_tenant_id(const char *name, size_t len);
bool cairn_tenant_name_valid(const char *name, size_t len);
bool cairn_auth_token_valid(const char *token, size_t len);

/* True for an IPv4 address in 127.0.0.0/8, ::1, ::ffff:127.x.y.z, and for
 * NULL (no TCP). Host names are not resolved: "localhost" is false. */
bool cairn_host_is_loopback(const char *host);

/* Read a whole file that holds secrets (a token file, a tenants file) into
 * a new NUL-terminated buffer (free it; the caller should clear it first).
 * Refused (CAIRN_EINVAL, with the reason in err) when it is not a regular
 * file or when its mode gives group or others any access: a token others
 * can read is not a secret. At most 1 MiB. */
int cairn_secret_file_read(const char *path, char **text, size_t *len, char *err,
                           size_t err_len);

/* The token of a token file: its first line, surrounding blanks and a CR
 * removed. `out` has room for CAIRN_AUTH_TOKEN_MAX + 1 bytes. CAIRN_EINVAL
 * when that line is not a valid token. */
int cairn_token_from_text(const char *text, size_t len, char *out, size_t *out_len, char *err,
                          size_t err_len);

/* Parse a tenants file: one `NAME TOKEN` per line (separated by blanks),
 * blank lines and lines starting with '#' ignored. Any other line, an
 * invalid name or token, a name or a token given twice, or no tenant at all
 * is CAIRN_EINVAL with the line in err. *out (n_out entries, pointing into
 * the same allocation) is freed with cairn_credentials_free. */
int cairn_tenants_parse(const char *text, size_t len, cairn_credential **out, size_t *n_out,
                        char *err, size_t err_len);
void cairn_credentials_free(cairn_credential *creds, size_t n);

/* The checker a server uses: a copy of the credentials. n == 0 gives one
 * that requires nothing. CAIRN_EINVAL for an invalid token or name, a
 * duplicate name or token, or a nameless token next to others. */
typedef struct cairn_access cairn_access;
int cairn_access_create(const cairn_credential *creds, size_t n, cairn_access **out, char *err,
                        size_t err_len);
void cairn_access_free(cairn_access *a);
bool cairn_access_required(const cairn_access *a);
bool cairn_access_has_tenants(const cairn_access *a);
/* CAIRN_OK and the connection's tenant id (0 without tenants) and name
 * (NULL without tenants; owned by `a`) when the token is accepted — any
 * token when nothing is required — else CAIRN_EPERM. Constant
 * time as described above. */
int cairn_access_check(const cairn_access *a, const char *token, size_t len, uint64_t *tenant,
                       const char **tenant_name);

/* ======================================================================== */
/* 2. OpenAI-compatible HTTP facade (docs/openai.md)                        */
/* ======================================================================== */
/*
 * An HTTP/1.1 listener on the server's own loop (server/http/): the
 * OpenAI routes /v1/chat/completions, /v1/completions, /v1/models and
 * /v1/responses, Anthropic's /v1/messages, /tokenize and /detokenize, plus
 * /health and /metrics (Prometheus); HEAD wherever GET, OPTIONS (CORS with
 * cors_origins) everywhere. HTTP is parsed by libhttp-parser and
 * JSON by jansson; no bytes from a client reach a hand-written parser.
 *
 * Its connections are the server's (the same core, table and event queue
 * as the msgpack ones); a request whose connection has gone is cancelled
 * with CAIRN_REQ_CLIENT_GONE. A conversation with a session key
 * (session_id, prompt_cache_key or X-Session-Id) is one named session in
 * the engine, which keeps its history: the facade holds no state between
 * requests. Access control is the server's (section 1): with credentials,
 * every route but /health needs `Authorization: Bearer TOKEN`.
 *
 * Limits: the request line and headers together (max_header_bytes, else
 * 431), the body (max_body_bytes, else 413, refused from Content-Length
 * before it is read), and time: a connection must deliver a whole request
 * within timeout_s of becoming idle (after connecting or after the previous
 * response), else 408 (or a silent close when nothing was sent).
 */
typedef struct {
    const char *host;        /* address; NULL: the TCP host, else 127.0.0.1 */
    int port;                /* -1: no HTTP listener (default); 0: any port  */
    size_t max_body_bytes;   /* default 4 MiB                                */
    size_t max_header_bytes; /* request line + headers; default 32 KiB      */
    double timeout_s;        /* to receive a whole request; default 30      */
    const char *model_name;  /* the id /v1/models reports; NULL: the model
                                file's base name without .gguf              */
    size_t max_session_keys; /* session keys kept at once: the engine's named
                                sessions (LRU; default 1024)                  */
    const char *cors_origins; /* origins whose pages may read the replies
                                (browser front ends), comma-separated, or
                                "*" for any; NULL (default): no CORS      */
    bool no_web;             /* no browser page at `/` (docs/web.md)         */
} cairn_http_config;

/* ======================================================================== */
/* 3. Server                                                                */
/* ======================================================================== */

typedef struct cairn_server cairn_server;

typedef struct {
    const char *host;          /* TCP address (default "127.0.0.1"); NULL: no TCP */
    int port;                  /* default 7077; 0 = any free port           */
    const char *unix_path;     /* Unix socket path (mode 0600); NULL: none  */
    cairn_mp_limits limits;
    size_t max_output_bytes;   /* unread responses per connection (16 MiB)  */
    double idle_timeout_s;     /* half a message and silence: close (60)    */
    int max_inflight;          /* requests in flight per connection (256)   */
    double drain_timeout_s;    /* SIGTERM: how long running requests may go
                                  on before they are ended (30; 0: end them
                                  at once); a second signal stops at once  */
    /* Access control (section 1); copied at create. None: no authentication,
     * which cairn_server_create refuses unless host is loopback (or NULL). */
    const cairn_credential *credentials;
    size_t n_credentials;
    cairn_http_config http;       /* the OpenAI facade (section 2); off by default */
    int default_chat_flags;       /* chat requests' template defaults, both
                                     protocols (cairn_api_template_kwargs_flags;
                                     0: the template's own)                  */
    cairn_runtime_config runtime; /* the model to serve: opened after the
                                     listeners are bound                     */
    cairn_service_config service; /* runtime, on_event and user are the
                                     server's                               */
} cairn_server_config;

/* Fill in the defaults named in the fields' comments. */
void cairn_server_config_default(cairn_server_config *cfg);

/* Check the access configuration (credentials as cairn_access_create
 * wants them; a non-loopback host without any is CAIRN_EINVAL before
 * anything is bound), bind the listeners (before any thread exists, so the
 * umask used for the Unix socket affects nothing else), then start the
 * service (loads the model). Nothing is accepted until cairn_server_run;
 * connections made before wait in the listen backlog. A stale Unix socket
 * file (no server answers on it) is replaced; a live one or a non-socket
 * file is an error. Sets SIGPIPE to ignored for the process: a client that
 * vanishes must be a write error, not a fatal signal. */
int cairn_server_create(const cairn_server_config *cfg, cairn_server **out, char *err,
                        size_t err_len);

/* The bound TCP port (useful with port 0), or -1 without TCP. */
int cairn_server_tcp_port(const cairn_server *s);
/* The bound HTTP port, or -1 without the HTTP listener. */
int cairn_server_http_port(const cairn_server *s);
/* The engine it serves (for a start banner: model, KV type, tiers). */
cairn_service *cairn_server_service(const cairn_server *s);
/* "tcp 127.0.0.1:7077, unix /path" for the listening line. */
void cairn_server_describe(const cairn_server *s, char *out, size_t cap);
/* With a shared cache tier (service.shared): publish this replica's
 * "hello" for routers, with its HTTP and TCP addresses, under `replica`
 * (NULL: its HTTP address, else its TCP one, else its socket path). The id
 * used goes into id[id_cap] (may be NULL). CAIRN_OK and nothing without a
 * shared tier. Call once the listeners are bound (after create). */
int cairn_server_announce(cairn_server *s, const char *replica, char *id, size_t id_cap);

/* Run the loop until SIGINT/SIGTERM or cairn_server_stop, then shut down as
 * described above. Call once, from the thread that created the server. */
int cairn_server_run(cairn_server *s);

/* Ask a running server to shut down. Thread-safe and async-signal-safe. */
void cairn_server_stop(cairn_server *s);

/* Free a server that is not running (after cairn_server_run returned, or
 * instead of running it). NULL is a no-op. */
void cairn_server_free(cairn_server *s);

#ifdef __cplusplus
}
#endif
#endif /* CAIRN_SERVER_H */
