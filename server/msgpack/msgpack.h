/*
 * server/msgpack/msgpack.h — the native msgpack-RPC protocol
 * (docs/protocol.md) below the connection: a validating scanner for
 * untrusted msgpack, a reader over validated bytes, decoding one message
 * into a request, and packing responses. Used by the server's msgpack
 * connections (server/msgpack/conn.c), the codec tests and the fuzzers; no
 * socket, thread or loop here.
 *
 * Layers, each usable on its own:
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
 *   2. cairn_rpc_*       turns one accepted message into a cairn_rpc_call:
 *                        the envelope [0, msgid, method, [params]] is read
 *                        here, the parameters mean what api/api.h says;
 *                        and packs responses and notifications with
 *                        msgpack-c's packer.
 *
 * Why a scanner in front of msgpack-c: msgpack-c's unpacker reserves memory
 * for an array or string as soon as it reads the header, so 5 bytes claiming
 * a 4 GiB string would cost 4 GiB. The scanner walks headers only, keeping a
 * fixed-size stack of "items still expected" per open container, so its
 * memory is constant whatever the input says.
 *
 * Threads: everything here is a pure function of its arguments; decoding may
 * run on any thread (the server's text workers do).
 */
#ifndef CAIRN_SERVER_MSGPACK_H
#define CAIRN_SERVER_MSGPACK_H

#include "api/api.h"
#include "server/server.h"

#include <msgpack.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================== */
/* 1. Scanner and reader                                                    */
/* ======================================================================== */



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

/* What a decoder needs: what the fields mean (api/api.h: the model's
 * vocabulary, template and context; its vocab may be NULL, and then any
 * request carrying text is refused as unsupported) and the limits the
 * scanner enforced. */
typedef struct {
    const cairn_api *api;
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
    int n_pins;               /* generate, session.generate: cache_pin     */
    struct {
        size_t tokens;
        double ttl_s;
    } pins[CAIRN_MAX_PINS];
    char *tools_json;         /* session.open: the tools its messages render;
                                 session.generate: the tools whose calls its
                                 reply is read for (JSON array, owned; NULL:
                                 none)                                      */
    cairn_api_conversation conv; /* generate over messages: the conversation
                                 it rendered (owned), so a cache miss can be
                                 placed in it (server/explain.c)           */
    char *text;               /* detokenize: the answer (owned)            */
    size_t text_len;
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
 * context repeats) into *call: the envelope here, the parameters by
 * api/api.h (the msgpack map read as the JSON object it is). Parameter
 * names the server does not know are ignored (forward compatibility) and a
 * nil value counts as absent; "stop" may also be a single string. This is
 * text work (tokenizing, templates, grammars): the server runs it on its
 * text workers. Returns
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

/* A generation's text read (cairn_chat_parse_reply): the tool calls, a
 * JSON array in OpenAI's form (NULL: none), the content (the text around
 * the calls; for a reply in channels, its answer without markers) and, for
 * a reply in channels, its reasoning (NULL: none). */
typedef struct {
    const char *calls_json;
    const char *content;
    const char *reasoning;
} cairn_rpc_tool_calls;

/* The whole response or notification for an engine event, given the method
 * of the request it answers. DELTA gives a gen.delta notification. `calls`
 * (NULL: the text was not read) adds content, and tool_calls and reasoning
 * when there are any, to a generation's result, whose finish_reason is
 * "tool_calls" when there are calls. */
int cairn_rpc_pack_event(msgpack_sbuffer *sb, cairn_rpc_method method, const cairn_event *ev,
                         const cairn_rpc_tool_calls *calls);

typedef struct {
    const char *version;
    const cairn_hparams *hparams;
    int n_ctx;
    int page_size;
    const char *kv_type; /* "f16", "q8_0", ... */
    cairn_mp_limits limits;
} cairn_rpc_server_info;

int cairn_rpc_pack_server_info(msgpack_sbuffer *sb, uint32_t msgid,
                               const cairn_rpc_server_info *info);

/* Answers tokenize (call->tokens) and detokenize (call->text, which the
 * decoder made: a too_large error then when it would exceed max_string_bytes). */
int cairn_rpc_pack_tokenize(msgpack_sbuffer *sb, const cairn_rpc_call *call);
int cairn_rpc_pack_detokenize(msgpack_sbuffer *sb, const cairn_rpc_call *call);

/* Answers auth: {tenant: NAME} or {tenant: nil} (no tenants configured). */
int cairn_rpc_pack_auth(msgpack_sbuffer *sb, uint32_t msgid, const char *tenant_name);

#ifdef __cplusplus
}
#endif
#endif /* CAIRN_SERVER_MSGPACK_H */
