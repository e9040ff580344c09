/*
 * protocol/protocol.h — the native msgpack-RPC protocol (docs/protocol.md):
 * a validating scanner for untrusted msgpack, a reader over validated bytes,
 * request decoding into engine requests, response packing, and the libuv
 * server that owns the sockets.
 *
 * Layers, each usable on its own (the tests use the first two without
 * any socket or model thread):
 *
 *   1. cairn_mp_scanner  finds where one msgpack object ends in a stream of
 *                        bytes and checks it against limits (size, depth,
 *                        string/bin length, array/map count) WITHOUT
 *                        allocating anything. It never trusts a declared
 *                        length: a count that could not fit in the bytes the
 *                        message may still have is refused at once, and a
 *                        string is only "complete" once its bytes are here.
 *      cairn_mp_reader   reads values one by one out of bytes the scanner
 *                        accepted (zero-copy: strings point into the buffer).
 *   2. cairn_rpc_*       turns one accepted message into a cairn_rpc_call
 *                        (method + validated, typed parameters; text already
 *                        tokenized) or into an error {code, type, message};
 *                        and packs responses and notifications with
 *                        msgpack-c's packer.
 *   3. cairn_access      who may connect: tokens, tenants, the constant-time
 *                        token check, the tenants file (see section 3).
 *   4. cairn_http_*      the OpenAI-compatible HTTP facade's settings.
 *   5. cairn_server      a libuv loop with a TCP and/or Unix-socket listener
 *                        (and optionally the HTTP one), one cairn_service
 *                        (session/session.h), and the connections between
 *                        them.
 *
 * Why a scanner in front of msgpack-c: msgpack-c's unpacker reserves memory
 * for an array or string as soon as it reads the header, so 5 bytes claiming
 * a 4 GiB string would cost 4 GiB. The scanner walks headers only, keeping a
 * fixed-size stack of "items still expected" per open container, so its
 * memory is constant whatever the input says.
 *
 * Server threads and ownership
 * ----------------------------
 *   loop thread   (the caller of cairn_server_run) owns every libuv handle,
 *                 every connection, their buffers and the connection table.
 *                 It decodes requests, tokenizes text with the service's
 *                 vocab (immutable, so safe here), submits requests, and
 *                 writes responses.
 *   engine thread (inside cairn_service) calls the server's event callback.
 *                 That callback only copies the event into a node, appends
 *                 it to a mutex-protected queue and calls uv_async_send; it
 *                 never touches a connection.
 *
 * Connections are never referred to by pointer across threads: a request
 * carries its connection's 64-bit id (never reused), and the loop looks the
 * id up in its table when the event comes back. An event for a connection
 * that has gone is dropped. When a connection closes, the server submits
 * CAIRN_REQ_CLIENT_GONE so the engine cancels its work and frees its pages.
 *
 * A connection's life: accepted -> reading (requests may overlap; responses
 * come in any order) -> closing (uv_close on its stream and timer; it leaves
 * the table at once, the memory goes when both close callbacks have run).
 * Reasons to close: EOF or read error, a message with no readable msgid that
 * is not a request, more than max_output_bytes of responses the client has
 * not read (it is not reading: backpressure; one answer is always accepted
 * into an empty queue), idle_timeout_s without a byte while a message is
 * half received, and — when credentials are configured (section 3) — any
 * error before a successful `auth`, a wrong token, or no `auth` within
 * idle_timeout_s of connecting (the first two after the answer: lingering
 * close, below). Requests in flight per connection are capped
 * (max_inflight, then `overloaded`), and a msgid already in flight is
 * refused, so events map back to exactly one request. A malformed message that still has
 * a msgid is answered with an error; when the stream can be resynchronised
 * (a string or count over a limit: the scanner skips the rest of that
 * message without buffering it) the connection stays open, otherwise the
 * server answers, stops reading requests and closes after the answer has
 * been written ("lingering close", so the answer is not lost to a reset).
 *
 * Shutdown (SIGINT/SIGTERM, or cairn_server_stop): stop accepting, close
 * every connection, cairn_service_stop (after which no event can arrive),
 * then close the async handle and remove the Unix socket file. No handle is
 * closed while the engine thread could still signal it.
 */
#ifndef CAIRN_PROTOCOL_H
#define CAIRN_PROTOCOL_H

#include "session/session.h"

#include <msgpack.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================== */
/* 1. Scanner and reader                                                    */
/* ======================================================================== */

/* Hard cap on nesting the scanner can follow at all (its stack size). The
 * configurable max_depth must be <= this. */
#define CAIRN_MP_DEPTH_CAP 32

typedef struct {
    uint32_t max_message_bytes; /* one whole message (default 8 MiB)          */
    uint32_t max_depth;         /* nested arrays/maps, top level = 1 (8)      */
    uint32_t max_string_bytes;  /* one str, bin or ext payload (4 MiB)        */
    uint32_t max_array_len;     /* elements of one array (1,048,576)          */
    uint32_t max_map_len;       /* pairs of one map (64)                      */
} cairn_mp_limits;

void cairn_mp_limits_default(cairn_mp_limits *lim);

/*
 * Resumable scanner. Feed it the bytes after the ones it already consumed;
 * it consumes whole items (a header plus, for str/bin/ext, its payload) and
 * stops at the first item that is not fully present, so a caller can keep
 * the unconsumed tail and call again when more bytes arrive. Total work over
 * a message is linear in its size.
 *
 * After a limit is exceeded, cairn_mp_scan returns CAIRN_ERANGE without
 * consuming the offending item, and `can_skip` says whether the rest of the
 * message can still be delimited. If so, cairn_mp_scanner_skip() switches to
 * skip mode: limits no longer apply, payloads are consumed even when only
 * partly present, and the caller should discard every byte the scanner
 * consumes. When the object ends the caller resets the scanner and the
 * stream is in sync again.
 */
typedef struct {
    cairn_mp_limits lim;
    uint64_t total;        /* bytes of the current object consumed so far   */
    uint64_t skip_payload; /* skip mode: payload bytes still to discard      */
    uint32_t depth;        /* open containers                              */
    uint64_t left[CAIRN_MP_DEPTH_CAP]; /* items still expected per level    */
    bool skipping;
    bool can_skip;         /* after an error: skipping is possible          */
    const char *error;     /* after an error: what was wrong (static text)  */
} cairn_mp_scanner;

void cairn_mp_scanner_reset(cairn_mp_scanner *sc, const cairn_mp_limits *lim);
void cairn_mp_scanner_skip(cairn_mp_scanner *sc);

/* Scan forward in buf[0..len). *used: bytes consumed now (those bytes belong
 * to the current object). *complete: the object ended within them.
 *   CAIRN_OK       fine so far (complete or in need of more bytes)
 *   CAIRN_ERANGE   a limit was exceeded (sc->error, sc->can_skip)
 *   CAIRN_EFORMAT  a byte that is never valid msgpack (0xc1); not skippable */
int cairn_mp_scan(cairn_mp_scanner *sc, const uint8_t *buf, size_t len, size_t *used,
                  bool *complete);

/* One-shot form: CAIRN_OK and *obj_len > 0 when buf starts with a complete,
 * acceptable object of *obj_len bytes; CAIRN_OK and *obj_len == 0 when more
 * bytes are needed; otherwise the error of cairn_mp_scan. */
int cairn_mp_scan_buffer(const uint8_t *buf, size_t len, const cairn_mp_limits *lim,
                         size_t *obj_len);

typedef enum {
    CAIRN_MP_NONE = 0, /* end of input or an invalid byte */
    CAIRN_MP_NIL,
    CAIRN_MP_BOOL,
    CAIRN_MP_UINT,     /* non-negative integer */
    CAIRN_MP_NINT,     /* negative integer     */
    CAIRN_MP_FLOAT,
    CAIRN_MP_STR,
    CAIRN_MP_BIN,
    CAIRN_MP_ARRAY,
    CAIRN_MP_MAP,
    CAIRN_MP_EXT,
} cairn_mp_kind;

/* A cursor over bytes. Every read is bounds-checked (CAIRN_EFORMAT when the
 * value runs past `end`), so it is safe even on unscanned bytes; the scanner
 * is what guarantees the counts it returns are small and honest. A read of
 * the wrong kind returns CAIRN_EINVAL and consumes nothing. */
typedef struct {
    const uint8_t *p, *end;
} cairn_mp_reader;

static inline cairn_mp_reader cairn_mp_reader_of(const void *buf, size_t len)
{
    cairn_mp_reader r = {(const uint8_t *)buf, (const uint8_t *)buf + len};
    return r;
}

cairn_mp_kind cairn_mp_peek(const cairn_mp_reader *r);
int cairn_mp_read_nil(cairn_mp_reader *r);
int cairn_mp_read_bool(cairn_mp_reader *r, bool *out);
/* Any integer that fits int64 (uint64 above INT64_MAX: CAIRN_ERANGE). */
int cairn_mp_read_int(cairn_mp_reader *r, int64_t *out);
/* A non-negative integer. */
int cairn_mp_read_uint(cairn_mp_reader *r, uint64_t *out);
/* A float or any integer, as a double. */
int cairn_mp_read_number(cairn_mp_reader *r, double *out);
/* A str: *s points into the buffer, not NUL-terminated. */
int cairn_mp_read_str(cairn_mp_reader *r, const char **s, uint32_t *len);
int cairn_mp_read_array(cairn_mp_reader *r, uint32_t *n);
int cairn_mp_read_map(cairn_mp_reader *r, uint32_t *n_pairs);
/* Skip one whole value of any kind (iteratively; no recursion). */
int cairn_mp_skip(cairn_mp_reader *r);

/* Read the msgid of a request from the first bytes of a message, even an
 * incomplete or invalid one: true when they are [0, msgid, ... with a msgid
 * < 2^32. Used to answer a message that fails validation. */
bool cairn_rpc_peek_msgid(const uint8_t *buf, size_t len, uint32_t *msgid);

/* ======================================================================== */
/* 2. Requests and responses                                                */
/* ======================================================================== */

/* Error types of docs/protocol.md; the codes are cairn status codes. */
#define CAIRN_RPC_INVALID_REQUEST CAIRN_EINVAL     /* -1  */
#define CAIRN_RPC_UNSUPPORTED     CAIRN_EUNSUPPORTED /* -5 */
#define CAIRN_RPC_NOT_FOUND       CAIRN_ENOTFOUND  /* -6  */
#define CAIRN_RPC_TOO_LARGE       CAIRN_ERANGE     /* -7  */
#define CAIRN_RPC_OVERLOADED      CAIRN_EFULL      /* -8  */
#define CAIRN_RPC_INTERNAL        CAIRN_EBACKEND   /* -11 */
#define CAIRN_RPC_UNAUTHORIZED    CAIRN_EPERM      /* -13 */

/* Map any cairn status to one of the seven protocol codes above. */
int cairn_rpc_error_code(int status);
/* "invalid_request", "too_large", ... for a protocol code. */
const char *cairn_rpc_error_type(int code);

typedef enum {
    CAIRN_RPC_SERVER_INFO = 1,
    CAIRN_RPC_GENERATE,
    CAIRN_RPC_SESSION_OPEN,
    CAIRN_RPC_SESSION_APPEND,
    CAIRN_RPC_SESSION_GENERATE,
    CAIRN_RPC_SESSION_FORK,
    CAIRN_RPC_SESSION_TRUNCATE,
    CAIRN_RPC_SESSION_CLOSE,
    CAIRN_RPC_SESSION_INFO,
    CAIRN_RPC_GEN_CANCEL,
    CAIRN_RPC_TOKENIZE,
    CAIRN_RPC_DETOKENIZE,
    CAIRN_RPC_CACHE_STATS,
    CAIRN_RPC_AUTH,
} cairn_rpc_method;

const char *cairn_rpc_method_name(cairn_rpc_method m);

/* What a decoder needs to know about the model. vocab may be NULL, in which
 * case any request carrying text is refused as unsupported (tests). */
typedef struct {
    const cairn_vocab *vocab;
    const cairn_chat_template *chat_template; /* formats `messages`; NULL =
                              the generic format                             */
    int n_vocab;           /* token ids must be < n_vocab                    */
    int n_ctx;             /* most tokens in a prompt / session content, and
                              the most max_tokens may ask for                */
    cairn_mp_limits limits;
} cairn_rpc_context;

/* One decoded, validated request. Everything is owned by the call: free it
 * with cairn_rpc_call_clear (which also frees what was not moved out). */
typedef struct {
    uint32_t msgid;
    cairn_rpc_method method;
    /* Content: the prompt (generate), initial/appended history (session.*),
     * the text to tokenize (already tokenized: these are the result), or the
     * tokens to detokenize. has_content is false when none was given. */
    bool has_content;
    int32_t *tokens;
    size_t n_tokens;
    bool chat_turn;           /* tokens are messages continuing a session's
                                 conversation (cairn_request.chat_turn)   */
    cairn_session_id session; /* session.* except open                    */
    cairn_gen_params gen;     /* generate, session.generate (stop owned)   */
    uint32_t target;          /* gen.cancel                                */
    int64_t n_keep;           /* session.truncate                          */
    bool persist;             /* session.open                              */
    char *tools_json;         /* session.open: the tools its messages render;
                                 session.generate: the tools whose calls its
                                 reply is read for (JSON array, owned; NULL:
                                 none)                                      */
    /* auth: the token as sent. It points INTO the decoded message (not
     * owned, not NUL-terminated): valid only while those bytes are. */
    const char *token;
    uint32_t token_len;
} cairn_rpc_call;

typedef struct {
    bool has_msgid; /* false: the message cannot be answered; close        */
    uint32_t msgid;
    int code;       /* CAIRN_RPC_*                                          */
    char message[200];
} cairn_rpc_error;

/*
 * Decode one complete message (as delimited by the scanner, whose limits the
 * context repeats) into *call. Parameter names the server does not know are
 * ignored (forward compatibility) and a nil value counts as absent; "stop"
 * may also be a single string. Returns
 *   CAIRN_OK      a request to act on
 *   CAIRN_ECLOSED a well-formed notification from the client: ignore it
 *   any other     *err says what to answer (when err->has_msgid) or that
 *                 the connection should be closed
 * Nothing is left allocated on failure. Random seeds for requests without
 * "seed" come from `seed_source` (advanced on each use; may be NULL -> 0).
 */
int cairn_rpc_decode(const cairn_rpc_context *ctx, const uint8_t *msg, size_t len,
                     uint64_t *seed_source, cairn_rpc_call *call, cairn_rpc_error *err);
void cairn_rpc_call_clear(cairn_rpc_call *call);

/*
 * The decoder for a connection that has not authenticated yet (section 4):
 * it reads the envelope and, only for `auth`, its parameters. Any other
 * method — known or not — fails with CAIRN_RPC_UNAUTHORIZED before its
 * parameters are looked at, so an unauthenticated client cannot make the
 * server tokenize text or allocate anything for it. Returns as
 * cairn_rpc_decode.
 */
int cairn_rpc_decode_preauth(const uint8_t *msg, size_t len, cairn_rpc_call *call,
                             cairn_rpc_error *err);

/* ---- packing (msgpack-c) ------------------------------------------------ */
/* Each packer appends one complete message to `sb` (initialised by the
 * caller) and returns CAIRN_OK, or CAIRN_ENOMEM, after which the buffer's
 * contents are unusable. */

/* [1, msgid, {code, type, message}, nil] */
int cairn_rpc_pack_error(msgpack_sbuffer *sb, uint32_t msgid, int code, const char *message);

/* A generation's text read as tool calls (cairn_chat_parse_tool_calls): the
 * calls, a JSON array in OpenAI's form, and the text left around them. */
typedef struct {
    const char *calls_json;
    const char *content;
} cairn_rpc_tool_calls;

/* The whole response or notification for an engine event, given the method
 * of the request it answers. DELTA gives a gen.delta notification. `calls`
 * (NULL: none) adds tool_calls and content to a generation's result, whose
 * finish_reason is then "tool_calls". */
int cairn_rpc_pack_event(msgpack_sbuffer *sb, cairn_rpc_method method, const cairn_event *ev,
                         const cairn_rpc_tool_calls *calls);

typedef struct {
    const char *version;
    const cairn_hparams *hparams;
    int n_ctx;
    int page_size;
    cairn_mp_limits limits;
} cairn_rpc_server_info;

int cairn_rpc_pack_server_info(msgpack_sbuffer *sb, uint32_t msgid,
                               const cairn_rpc_server_info *info);

/* Answers tokenize (from call->tokens) and detokenize (text of call->tokens;
 * too_large error when the text would exceed max_string_bytes). */
int cairn_rpc_pack_tokenize(msgpack_sbuffer *sb, const cairn_rpc_call *call);
int cairn_rpc_pack_detokenize(msgpack_sbuffer *sb, const cairn_rpc_context *ctx,
                              const cairn_rpc_call *call);

/* Answers auth: {tenant: NAME} or {tenant: nil} (no tenants configured). */
int cairn_rpc_pack_auth(msgpack_sbuffer *sb, uint32_t msgid, const char *tenant_name);

/* ======================================================================== */
/* 3. Access control                                                        */
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
 * token when nothing is required — else CAIRN_RPC_UNAUTHORIZED. Constant
 * time as described above. */
int cairn_access_check(const cairn_access *a, const char *token, size_t len, uint64_t *tenant,
                       const char **tenant_name);

/* ======================================================================== */
/* 4. OpenAI-compatible HTTP facade (docs/openai.md)                        */
/* ======================================================================== */
/*
 * An HTTP/1.1 listener on the server's own loop (protocol/http.c): the
 * OpenAI routes /v1/chat/completions, /v1/completions and /v1/models, plus
 * /health and /metrics (Prometheus). HTTP is parsed by libhttp-parser and
 * JSON by jansson; no bytes from a client reach a hand-written parser.
 *
 * It follows the server's rules (section 5 below): the loop thread owns its
 * connections; engine events reach it through the server's queue. Its
 * connections take ids from the server's counter with CAIRN_HTTP_CLIENT_BIT
 * set, which is how the server routes an event to the facade. A request
 * whose connection has gone is cancelled with CAIRN_REQ_CLIENT_GONE, as the
 * msgpack server does. Access control is the server's (section 3): with
 * credentials, every route but /health needs `Authorization: Bearer TOKEN`.
 *
 * Limits: the request line and headers together (max_header_bytes, else
 * 431), the body (max_body_bytes, else 413, refused from Content-Length
 * before it is read), and time: a connection must deliver a whole request
 * within timeout_s of becoming idle (after connecting or after the previous
 * response), else 408 (or a silent close when nothing was sent).
 */
#define CAIRN_HTTP_CLIENT_BIT (1ull << 63)

typedef struct {
    const char *host;        /* address; NULL: the TCP host, else 127.0.0.1 */
    int port;                /* -1: no HTTP listener (default); 0: any port  */
    size_t max_body_bytes;   /* default 4 MiB                                */
    size_t max_header_bytes; /* request line + headers; default 32 KiB      */
    double timeout_s;        /* to receive a whole request; default 30      */
    const char *model_name;  /* the id /v1/models reports; NULL: the model
                                file's base name without .gguf              */
    size_t max_session_keys; /* session_id / prompt_cache_key values mapped
                                to cairn sessions at once (LRU; default 1024) */
} cairn_http_config;

/* ======================================================================== */
/* 5. Server                                                                */
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
    /* Access control (section 3); copied at create. None: no authentication,
     * which cairn_server_create refuses unless host is loopback (or NULL). */
    const cairn_credential *credentials;
    size_t n_credentials;
    cairn_http_config http;       /* the OpenAI facade (section 4); off by default */
    cairn_runtime_config runtime; /* the model to serve: opened after the
                                     listeners are bound                     */
    cairn_service_config service; /* runtime, on_event and user are the
                                     server's                               */
} cairn_server_config;

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
/* "tcp 127.0.0.1:7077, unix /path" for the listening line. */
void cairn_server_describe(const cairn_server *s, char *out, size_t cap);

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
#endif /* CAIRN_PROTOCOL_H */
