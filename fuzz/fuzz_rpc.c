/*
 * fuzz/fuzz_rpc.c — msgpack-RPC request scanning, reading and decoding
 * (server/msgpack/msgpack.h, the parameters by api/api.h), i.e. everything the server does with a client's
 * bytes before a request reaches the engine.
 *
 * Per input:
 *   1. cairn_mp_scan_buffer with the default limits and with tight ones.
 *   2. The resumable scanner fed the same bytes in pieces (sizes drawn from
 *      the input) must reach the same verdict as the one-shot scan; after a
 *      skippable limit error, skip mode must delimit the message without
 *      consuming more bytes than there are.
 *   3. The reader (bounds-checked, safe on unscanned bytes) skips values
 *      across the raw input, and cairn_rpc_peek_msgid reads it.
 *   4. A complete object goes through cairn_rpc_decode with the bundled
 *      model's vocabulary. An accepted call must be honest (token ids inside
 *      the vocabulary, sampling settings the sampler accepts) and its answer
 *      must pack; a refused one must carry a protocol error code and a
 *      terminated message, and its error response must pack.
 */
#include "fuzz_common.h"
#include "server/msgpack/msgpack.h"

#include <string.h>

static cairn_vocab *g_vocab;
static cairn_api g_api;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    g_vocab = fuzz_load_vocab("models/stories260K.gguf");
    cairn_mp_limits lim;
    cairn_mp_limits_default(&lim);
    g_api = (cairn_api){.vocab = g_vocab, .n_vocab = cairn_vocab_n_tokens(g_vocab), .n_ctx = 512,
                        .max_tokenize = lim.max_array_len, .max_text_bytes = lim.max_string_bytes};
    return 0;
}

static bool is_protocol_code(int code)
{
    return code == CAIRN_RPC_INVALID_REQUEST || code == CAIRN_RPC_UNSUPPORTED ||
           code == CAIRN_RPC_NOT_FOUND || code == CAIRN_RPC_TOO_LARGE ||
           code == CAIRN_RPC_OVERLOADED || code == CAIRN_RPC_INTERNAL;
}

/* Scan `data` in pieces whose sizes come from `seed`, as the server does
 * with reads off a socket: keep the unconsumed tail, append what arrives. */
static int scan_in_pieces(const uint8_t *data, size_t size, const cairn_mp_limits *lim,
                          uint32_t seed, size_t *obj_len)
{
    cairn_mp_scanner sc;
    cairn_mp_scanner_reset(&sc, lim);
    size_t consumed = 0, arrived = 0;
    *obj_len = 0;
    for (;;) {
        seed = seed * 1103515245u + 12345u;
        size_t piece = 1 + (seed >> 16) % 17;
        arrived = size - arrived < piece ? size : arrived + piece;
        size_t used = 0;
        bool complete = false;
        int rc = cairn_mp_scan(&sc, data + consumed, arrived - consumed, &used, &complete);
        FUZZ_CHECK(used <= arrived - consumed);
        consumed += used;
        if (rc != CAIRN_OK)
            return rc;
        if (complete) {
            *obj_len = consumed;
            return CAIRN_OK;
        }
        if (arrived == size)
            return CAIRN_OK; /* needs more bytes than the input has */
    }
}

/* After a limit error: skip the rest of the message, as the server does. */
static void skip_rest(const uint8_t *data, size_t size, const cairn_mp_limits *lim)
{
    cairn_mp_scanner sc;
    cairn_mp_scanner_reset(&sc, lim);
    size_t used = 0;
    bool complete = false;
    if (cairn_mp_scan(&sc, data, size, &used, &complete) != CAIRN_ERANGE || !sc.can_skip)
        return;
    cairn_mp_scanner_skip(&sc);
    size_t at = used;
    int rc = cairn_mp_scan(&sc, data + at, size - at, &used, &complete);
    FUZZ_CHECK(used <= size - at);
    (void)rc;
}

static void check_call(const cairn_rpc_context *ctx, const cairn_rpc_call *call)
{
    for (size_t i = 0; i < call->n_tokens; i++)
        FUZZ_CHECK(call->tokens[i] >= 0 && call->tokens[i] < ctx->api->n_vocab);
    FUZZ_CHECK(call->has_content || call->n_tokens == 0);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    switch (call->method) {
    case CAIRN_RPC_GENERATE:
    case CAIRN_RPC_SESSION_GENERATE: {
        FUZZ_CHECK(call->gen.max_tokens >= 0 && call->gen.max_tokens <= ctx->api->n_ctx);
        FUZZ_CHECK(call->gen.n_stop >= 0 && call->gen.n_stop <= CAIRN_MAX_STOP);
        for (int i = 0; i < call->gen.n_stop; i++)
            FUZZ_CHECK(call->gen.stop[i] != NULL);
        /* Validation must catch everything the engine would refuse later. */
        cairn_sampler *s = NULL;
        int rc = cairn_sampler_create(&call->gen.sampling, ctx->api->n_vocab, &s);
        FUZZ_CHECK(rc == CAIRN_OK);
        cairn_sampler_free(s);
        break;
    }
    case CAIRN_RPC_TOKENIZE:
        FUZZ_CHECK(cairn_rpc_pack_tokenize(&sb, call) == CAIRN_OK);
        break;
    case CAIRN_RPC_DETOKENIZE: {
        int rc = cairn_rpc_pack_detokenize(&sb, call);
        FUZZ_CHECK(rc == CAIRN_OK);
        break;
    }
    default:
        break;
    }
    msgpack_sbuffer_destroy(&sb);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cairn_mp_limits lim, tight;
    cairn_mp_limits_default(&lim);
    /* Tight limits put every limit within reach of small inputs. */
    tight = (cairn_mp_limits){.max_message_bytes = 256, .max_depth = 3,
                              .max_string_bytes = 32, .max_array_len = 16, .max_map_len = 8};
    const uint32_t seed = size ? data[0] | (uint32_t)data[size - 1] << 8 : 7;

    size_t obj_len = 0;
    int rc = cairn_mp_scan_buffer(data, size, &lim, &obj_len);
    FUZZ_CHECK(obj_len <= size);
    for (int pass = 0; pass < 2; pass++) {
        const cairn_mp_limits *l = pass ? &tight : &lim;
        size_t whole = 0, pieces = 0;
        int rc_whole = cairn_mp_scan_buffer(data, size, l, &whole);
        int rc_pieces = scan_in_pieces(data, size, l, seed, &pieces);
        FUZZ_CHECK(rc_whole == rc_pieces);
        FUZZ_CHECK(whole == pieces);
        if (rc_whole == CAIRN_ERANGE)
            skip_rest(data, size, l);
    }

    cairn_mp_reader r = cairn_mp_reader_of(data, size);
    for (int i = 0; i < 64 && r.p < r.end; i++) {
        const uint8_t *before = r.p;
        if (cairn_mp_skip(&r) != CAIRN_OK)
            break;
        FUZZ_CHECK(r.p > before && r.p <= r.end);
    }
    uint32_t msgid;
    (void)cairn_rpc_peek_msgid(data, size, &msgid);

    if (rc != CAIRN_OK || obj_len == 0)
        return 0;
    cairn_rpc_context ctx = {.api = &g_api, .limits = lim};
    uint64_t seeds = 1;
    cairn_rpc_call call;
    cairn_rpc_error err;
    rc = cairn_rpc_decode(&ctx, data, obj_len, &seeds, &call, &err);
    if (rc == CAIRN_OK) {
        check_call(&ctx, &call);
    } else if (rc != CAIRN_ECLOSED) {
        FUZZ_CHECK(memchr(err.message, 0, sizeof err.message) != NULL);
        if (err.has_msgid) {
            FUZZ_CHECK(is_protocol_code(err.code));
            msgpack_sbuffer sb;
            msgpack_sbuffer_init(&sb);
            FUZZ_CHECK(cairn_rpc_pack_error(&sb, err.msgid, err.code, err.message) == CAIRN_OK);
            msgpack_sbuffer_destroy(&sb);
        }
    }
    cairn_rpc_call_clear(&call);
    return 0;
}
