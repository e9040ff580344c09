/*
 * protocol/protocol.h — the native msgpack-RPC protocol (docs/protocol.md):
 * a validating scanner for untrusted msgpack, a reader over validated bytes,
 * request decoding into engine requests, response packing, and the libuv
 * server that owns the sockets.
 *
 * Three layers, each usable on its own (the tests use the first two without
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
 *   3. cairn_server      a libuv loop with a TCP and/or Unix-socket listener,
 *                        one cairn_service (session/session.h), and the
 *                        connections between them.
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
 * into an empty queue), or idle_timeout_s without a byte while a message is
 * half received. Requests in flight per connection are capped (max_inflight,
 * then `overloaded`), and a msgid already in flight is refused, so events
 * map back to exactly one request. A malformed message that still has
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

/* Map any cairn status to one of the six protocol codes above. */
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
} cairn_rpc_method;

const char *cairn_rpc_method_name(cairn_rpc_method m);

/* What a decoder needs to know about the model. vocab may be NULL, in which
 * case any request carrying text is refused as unsupported (tests). */
typedef struct {
    const cairn_vocab *vocab;
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
    cairn_session_id session; /* session.* except open                    */
    cairn_gen_params gen;     /* generate, session.generate (stop owned)   */
    uint32_t target;          /* gen.cancel                                */
    int64_t n_keep;           /* session.truncate                          */
    bool persist;             /* session.open                              */
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

/* ---- packing (msgpack-c) ------------------------------------------------ */
/* Each packer appends one complete message to `sb` (initialised by the
 * caller) and returns CAIRN_OK, or CAIRN_ENOMEM, after which the buffer's
 * contents are unusable. */

/* [1, msgid, {code, type, message}, nil] */
int cairn_rpc_pack_error(msgpack_sbuffer *sb, uint32_t msgid, int code, const char *message);

/* The whole response or notification for an engine event, given the method
 * of the request it answers. DELTA gives a gen.delta notification. */
int cairn_rpc_pack_event(msgpack_sbuffer *sb, cairn_rpc_method method, const cairn_event *ev);

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
    cairn_service_config service; /* on_event and user are the server's    */
} cairn_server_config;

void cairn_server_config_default(cairn_server_config *cfg);

/* Bind the listeners (before any thread exists, so the umask used for the
 * Unix socket affects nothing else), then start the service (loads the
 * model). Nothing is accepted until cairn_server_run; connections made
 * before wait in the listen backlog. A stale Unix socket file (no server
 * answers on it) is replaced; a live one or a non-socket file is an error.
 * Sets SIGPIPE to ignored for the process: a client that vanishes must be a
 * write error, not a fatal signal. */
int cairn_server_create(const cairn_server_config *cfg, cairn_server **out, char *err,
                        size_t err_len);

/* The bound TCP port (useful with port 0), or -1 without TCP. */
int cairn_server_tcp_port(const cairn_server *s);
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
