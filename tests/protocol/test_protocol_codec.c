/*
 * tests/protocol/test_protocol_codec.c — the protocol's codec without a
 * server: the validating scanner (valid input, every truncation, hostile
 * lengths, deep nesting, resynchronisation after an over-limit value), the
 * reader, request decoding and validation (with the bundled model's vocab),
 * response packing, and random bytes that must never crash anything.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/msgpack/msgpack.h"

static cairn_vocab *g_vocab;
static cairn_mp_limits g_lim;
static cairn_api g_api, g_api_novocab;

static int setup(void **state)
{
    (void)state;
    cairn_mp_limits_default(&g_lim);
    const char *path = getenv("CAIRN_MODEL");
    cairn_gguf *g = NULL;
    char err[256];
    if (!path || cairn_gguf_open(path, &g, err, sizeof err) != CAIRN_OK)
        return -1;
    int rc = cairn_vocab_load(g, &g_vocab, err, sizeof err);
    cairn_gguf_close(g);
    g_api = (cairn_api){.vocab = g_vocab, .n_vocab = rc == CAIRN_OK ? cairn_vocab_n_tokens(g_vocab) : 0,
                        .n_ctx = 512, .max_tokenize = g_lim.max_array_len,
                        .max_text_bytes = g_lim.max_string_bytes};
    g_api_novocab = g_api;
    g_api_novocab.vocab = NULL;
    return rc == CAIRN_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    cairn_vocab_free(g_vocab);
    return 0;
}

static cairn_rpc_context ctx_for_tests(void)
{
    cairn_rpc_context c = {.api = &g_api, .limits = g_lim};
    return c;
}

/* ---- building messages with msgpack-c --------------------------------------- */

typedef struct {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} msg;

static void msg_init(msg *m)
{
    msgpack_sbuffer_init(&m->sb);
    msgpack_packer_init(&m->pk, &m->sb, msgpack_sbuffer_write);
}

static void put_str(msg *m, const char *s)
{
    msgpack_pack_str(&m->pk, strlen(s));
    msgpack_pack_str_body(&m->pk, s, strlen(s));
}

/* [0, msgid, method, [{...n_pairs}]]: the caller packs the pairs. */
static void request_head(msg *m, uint32_t msgid, const char *method, uint32_t n_pairs)
{
    msg_init(m);
    msgpack_pack_array(&m->pk, 4);
    msgpack_pack_uint8(&m->pk, 0);
    msgpack_pack_uint32(&m->pk, msgid);
    put_str(m, method);
    msgpack_pack_array(&m->pk, 1);
    msgpack_pack_map(&m->pk, n_pairs);
}

static const uint8_t *bytes(const msg *m) { return (const uint8_t *)m->sb.data; }

/* A varied, valid request used by several tests. */
static void sample_request(msg *m)
{
    request_head(m, 70000, "generate", 7);
    put_str(m, "prompt");
    put_str(m, "Once upon a time");
    put_str(m, "max_tokens");
    msgpack_pack_uint16(&m->pk, 32);
    put_str(m, "temperature");
    msgpack_pack_double(&m->pk, 0.5);
    put_str(m, "top_p");
    msgpack_pack_float(&m->pk, 0.25f);
    put_str(m, "stop");
    msgpack_pack_array(&m->pk, 2);
    put_str(m, "\n\n");
    put_str(m, "The end");
    put_str(m, "seed");
    msgpack_pack_uint64(&m->pk, 0xfedcba9876543210ull);
    put_str(m, "future_field"); /* unknown: ignored */
    msgpack_pack_map(&m->pk, 1);
    msgpack_pack_int8(&m->pk, -5);
    msgpack_pack_bin(&m->pk, 3);
    msgpack_pack_bin_body(&m->pk, "xyz", 3);
}

/* ---- scanner ------------------------------------------------------------------ */

static void test_scan_valid_and_back_to_back(void **state)
{
    (void)state;
    msg a, b;
    sample_request(&a);
    request_head(&b, 1, "server.info", 0);
    size_t n;
    assert_int_equal(cairn_mp_scan_buffer(bytes(&a), a.sb.size, &g_lim, &n), CAIRN_OK);
    assert_int_equal(n, a.sb.size);

    /* Two messages in one buffer: the first is delimited exactly. */
    uint8_t *both = malloc(a.sb.size + b.sb.size);
    memcpy(both, a.sb.data, a.sb.size);
    memcpy(both + a.sb.size, b.sb.data, b.sb.size);
    assert_int_equal(cairn_mp_scan_buffer(both, a.sb.size + b.sb.size, &g_lim, &n), CAIRN_OK);
    assert_int_equal(n, a.sb.size);
    assert_int_equal(cairn_mp_scan_buffer(both + n, b.sb.size, &g_lim, &n), CAIRN_OK);
    assert_int_equal(n, b.sb.size);
    free(both);

    /* Scalars at top level are complete objects too. */
    const uint8_t scalars[][9] = {{0x05}, {0xc0}, {0xcd, 1, 2}, {0xcb, 0, 0, 0, 0, 0, 0, 0, 0}};
    const size_t lens[] = {1, 1, 3, 9};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(cairn_mp_scan_buffer(scalars[i], lens[i], &g_lim, &n), CAIRN_OK);
        assert_int_equal(n, lens[i]);
    }
    msgpack_sbuffer_destroy(&a.sb);
    msgpack_sbuffer_destroy(&b.sb);
}

static void test_scan_every_truncation(void **state)
{
    (void)state;
    msg m;
    sample_request(&m);
    const size_t len = m.sb.size;
    /* Every strict prefix is "incomplete", never an error and never done. */
    for (size_t cut = 0; cut < len; cut++) {
        size_t n = 99;
        assert_int_equal(cairn_mp_scan_buffer(bytes(&m), cut, &g_lim, &n), CAIRN_OK);
        assert_int_equal(n, 0);
    }
    /* Fed one byte at a time, the resumable scanner ends exactly at the end,
     * and consumes only whole items (so the unconsumed tail is < one item). */
    cairn_mp_scanner sc;
    cairn_mp_scanner_reset(&sc, &g_lim);
    size_t consumed = 0;
    bool complete = false;
    for (size_t have = 1; have <= len && !complete; have++) {
        size_t used;
        assert_int_equal(cairn_mp_scan(&sc, bytes(&m) + consumed, have - consumed, &used,
                                       &complete),
                         CAIRN_OK);
        consumed += used;
        assert_true(consumed <= have);
        if (complete)
            assert_int_equal(have, len);
    }
    assert_true(complete);
    assert_int_equal(consumed, len);
    msgpack_sbuffer_destroy(&m.sb);
}

static void test_scan_hostile_lengths(void **state)
{
    (void)state;
    size_t n;
    /* str32 claiming 4 GiB, bin32, ext32: refused from the 5-byte header. */
    const uint8_t str32[] = {0xdb, 0xff, 0xff, 0xff, 0xff};
    const uint8_t bin32[] = {0xc6, 0xff, 0xff, 0xff, 0xf0};
    const uint8_t ext32[] = {0xc9, 0x80, 0x00, 0x00, 0x00};
    const uint8_t arr32[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
    const uint8_t map32[] = {0xdf, 0x00, 0x01, 0x00, 0x01}; /* 65,537 pairs */
    const uint8_t *hostile[] = {str32, bin32, ext32, arr32, map32};
    for (int i = 0; i < 5; i++)
        assert_int_equal(cairn_mp_scan_buffer(hostile[i], 5, &g_lim, &n), CAIRN_ERANGE);

    /* Inside a request, with a readable msgid. */
    const uint8_t req[] = {0x94, 0x00, 0xcd, 0x12, 0x34, 0xa8, 'g', 'e', 'n', 'e', 'r', 'a', 't',
                           'e', 0x91, 0x81, 0xa6, 'p', 'r', 'o', 'm', 'p', 't',
                           0xdb, 0xff, 0xff, 0xff, 0xff};
    assert_int_equal(cairn_mp_scan_buffer(req, sizeof req, &g_lim, &n), CAIRN_ERANGE);
    uint32_t id;
    assert_true(cairn_rpc_peek_msgid(req, sizeof req, &id));
    assert_int_equal(id, 0x1234);

    /* Exactly at the string limit: acceptable, just incomplete. */
    uint8_t at_limit[5] = {0xdb};
    uint32_t L = g_lim.max_string_bytes;
    at_limit[1] = (uint8_t)(L >> 24), at_limit[2] = (uint8_t)(L >> 16);
    at_limit[3] = (uint8_t)(L >> 8), at_limit[4] = (uint8_t)L;
    assert_int_equal(cairn_mp_scan_buffer(at_limit, 5, &g_lim, &n), CAIRN_OK);
    assert_int_equal(n, 0);
    L++;
    at_limit[1] = (uint8_t)(L >> 24), at_limit[2] = (uint8_t)(L >> 16);
    at_limit[3] = (uint8_t)(L >> 8), at_limit[4] = (uint8_t)L;
    assert_int_equal(cairn_mp_scan_buffer(at_limit, 5, &g_lim, &n), CAIRN_ERANGE);

    /* A count the message could not hold even at one byte per element. */
    cairn_mp_limits small = g_lim;
    small.max_message_bytes = 100;
    const uint8_t arr16[] = {0xdc, 0x00, 0xc8}; /* 200 elements */
    assert_int_equal(cairn_mp_scan_buffer(arr16, 3, &small, &n), CAIRN_ERANGE);
    const uint8_t arr16ok[] = {0xdc, 0x00, 0x60}; /* 96: might still come */
    assert_int_equal(cairn_mp_scan_buffer(arr16ok, 3, &small, &n), CAIRN_OK);
    assert_int_equal(n, 0);
    /* Two levels that each look fine but together cannot fit. */
    const uint8_t nested[] = {0x92, 0xdc, 0x00, 0x50, 0xdc, 0x00, 0x10};
    assert_int_equal(cairn_mp_scan_buffer(nested, sizeof nested, &small, &n), CAIRN_ERANGE);
    /* Map entries count twice. */
    small.max_map_len = 1000;
    const uint8_t map16[] = {0xde, 0x00, 0x40}; /* 64 pairs = 128 items > 100 bytes */
    assert_int_equal(cairn_mp_scan_buffer(map16, 3, &small, &n), CAIRN_ERANGE);
    /* Map and array counts have their own caps. */
    const uint8_t bigmap[] = {0xdf, 0x00, 0x01, 0x00, 0x01}; /* 65,537 pairs > 65,536 */
    assert_int_equal(cairn_mp_scan_buffer(bigmap, 5, &g_lim, &n), CAIRN_ERANGE);
    const uint8_t bigarr[] = {0xdd, 0x00, 0x10, 0x00, 0x01}; /* 2^20 + 1 */
    assert_int_equal(cairn_mp_scan_buffer(bigarr, 5, &g_lim, &n), CAIRN_ERANGE);
}

static void test_scan_nesting(void **state)
{
    (void)state;
    uint8_t buf[2000];
    size_t n;
    /* max_depth levels of [[[...nil]]] are fine; one more is not. */
    for (uint32_t d = 1; d <= g_lim.max_depth + 1; d++) {
        memset(buf, 0x91, d);
        buf[d] = 0xc0;
        int rc = cairn_mp_scan_buffer(buf, d + 1, &g_lim, &n);
        if (d <= g_lim.max_depth) {
            assert_int_equal(rc, CAIRN_OK);
            assert_int_equal(n, d + 1);
        } else {
            assert_int_equal(rc, CAIRN_ERANGE);
        }
    }
    /* Very deep: refused without recursion, and not skippable past the cap. */
    memset(buf, 0x91, sizeof buf);
    cairn_mp_scanner sc;
    cairn_mp_scanner_reset(&sc, &g_lim);
    size_t used;
    bool complete;
    assert_int_equal(cairn_mp_scan(&sc, buf, sizeof buf, &used, &complete), CAIRN_ERANGE);
    assert_true(sc.can_skip); /* depth 9 still fits the scanner's stack */
    cairn_mp_scanner_skip(&sc);
    size_t off = used;
    assert_int_equal(cairn_mp_scan(&sc, buf + off, sizeof buf - off, &used, &complete),
                     CAIRN_ERANGE);
    assert_false(sc.can_skip);
    assert_false(complete);

    /* Empty containers nest and close correctly. */
    const uint8_t empties[] = {0x93, 0x90, 0x80, 0x91, 0x90};
    assert_int_equal(cairn_mp_scan_buffer(empties, sizeof empties, &g_lim, &n), CAIRN_OK);
    assert_int_equal(n, sizeof empties);

    /* 0xc1 is never valid. */
    const uint8_t bad[] = {0x92, 0x01, 0xc1};
    assert_int_equal(cairn_mp_scan_buffer(bad, sizeof bad, &g_lim, &n), CAIRN_EFORMAT);
}

/* An over-limit string is skipped without being buffered, and the next
 * message is delimited correctly afterwards. */
static void test_scan_skip_resync(void **state)
{
    (void)state;
    cairn_mp_limits small = g_lim;
    small.max_string_bytes = 16;
    msg big, next;
    request_head(&big, 5, "generate", 2);
    put_str(&big, "prompt");
    char text[1000];
    memset(text, 'a', sizeof text - 1);
    text[sizeof text - 1] = '\0';
    put_str(&big, text);
    put_str(&big, "max_tokens");
    msgpack_pack_array(&big.pk, 3); /* containers after the big string are skipped too */
    msgpack_pack_nil(&big.pk);
    msgpack_pack_map(&big.pk, 1);
    put_str(&big, "k");
    msgpack_pack_bin(&big.pk, 300);
    msgpack_pack_bin_body(&big.pk, text, 300);
    msgpack_pack_true(&big.pk);
    request_head(&next, 6, "server.info", 0);

    size_t total = big.sb.size + next.sb.size;
    uint8_t *stream = malloc(total);
    memcpy(stream, big.sb.data, big.sb.size);
    memcpy(stream + big.sb.size, next.sb.data, next.sb.size);

    for (size_t chunk = 1; chunk <= 64; chunk *= 4) {
        cairn_mp_scanner sc;
        cairn_mp_scanner_reset(&sc, &small);
        size_t pos = 0, held = 0; /* pos: start of unscanned bytes; held: fed so far */
        bool complete = false;
        int rc = CAIRN_OK;
        /* Strict scanning stops at the string's header. */
        while (rc == CAIRN_OK && !complete && held < total) {
            held = held + chunk < total ? held + chunk : total;
            size_t used;
            rc = cairn_mp_scan(&sc, stream + pos, held - pos, &used, &complete);
            pos += used;
        }
        assert_int_equal(rc, CAIRN_ERANGE);
        assert_true(sc.can_skip);
        uint32_t id;
        assert_true(cairn_rpc_peek_msgid(stream, held, &id));
        assert_int_equal(id, 5);
        /* Skip mode: consume (and, in a server, discard) up to the end. */
        cairn_mp_scanner_skip(&sc);
        complete = false;
        for (;;) {
            size_t used;
            assert_int_equal(cairn_mp_scan(&sc, stream + pos, held - pos, &used, &complete),
                             CAIRN_OK);
            pos += used;
            if (complete)
                break;
            assert_true(held < total);
            held = held + chunk < total ? held + chunk : total;
        }
        assert_int_equal(pos, big.sb.size);
        /* In sync again. */
        size_t n;
        assert_int_equal(cairn_mp_scan_buffer(stream + pos, total - pos, &small, &n), CAIRN_OK);
        assert_int_equal(n, next.sb.size);
    }
    free(stream);
    msgpack_sbuffer_destroy(&big.sb);
    msgpack_sbuffer_destroy(&next.sb);
}

/* ---- reader ----------------------------------------------------------------------- */

static void test_reader(void **state)
{
    (void)state;
    msg m;
    msg_init(&m);
    msgpack_pack_array(&m.pk, 13);
    msgpack_pack_uint8(&m.pk, 7);            /* fixint */
    msgpack_pack_uint64(&m.pk, 200);         /* packed as uint8 */
    msgpack_pack_uint64(&m.pk, 70000);       /* uint32 */
    msgpack_pack_uint64(&m.pk, UINT64_MAX);  /* uint64 */
    msgpack_pack_int64(&m.pk, -3);           /* negative fixint */
    msgpack_pack_int64(&m.pk, -200);         /* int16 */
    msgpack_pack_int64(&m.pk, INT64_MIN);    /* int64 */
    msgpack_pack_float(&m.pk, 1.5f);
    msgpack_pack_double(&m.pk, -2.25);
    msgpack_pack_nil(&m.pk);
    msgpack_pack_false(&m.pk);
    put_str(&m, "héllo");
    msgpack_pack_map(&m.pk, 1);
    put_str(&m, "k");
    msgpack_pack_array(&m.pk, 2);
    msgpack_pack_array(&m.pk, 0);
    msgpack_pack_bin(&m.pk, 2);
    msgpack_pack_bin_body(&m.pk, "\x01\x02", 2);

    cairn_mp_reader r = cairn_mp_reader_of(m.sb.data, m.sb.size);
    uint32_t n;
    uint64_t u;
    int64_t i;
    double d;
    bool b;
    const char *s;
    uint32_t sl;
    assert_int_equal(cairn_mp_read_array(&r, &n), CAIRN_OK);
    assert_int_equal(n, 13);
    assert_int_equal(cairn_mp_read_uint(&r, &u), CAIRN_OK);
    assert_int_equal(u, 7);
    assert_int_equal(cairn_mp_read_int(&r, &i), CAIRN_OK);
    assert_int_equal(i, 200);
    assert_int_equal(cairn_mp_read_uint(&r, &u), CAIRN_OK);
    assert_int_equal(u, 70000);
    /* uint64 above INT64_MAX does not fit int64, and is not consumed. */
    assert_int_equal(cairn_mp_read_int(&r, &i), CAIRN_ERANGE);
    assert_int_equal(cairn_mp_read_uint(&r, &u), CAIRN_OK);
    assert_true(u == UINT64_MAX);
    /* A negative number is not a uint: EINVAL, nothing consumed. */
    assert_int_equal(cairn_mp_read_uint(&r, &u), CAIRN_EINVAL);
    assert_int_equal(cairn_mp_read_int(&r, &i), CAIRN_OK);
    assert_int_equal(i, -3);
    assert_int_equal(cairn_mp_read_number(&r, &d), CAIRN_OK);
    assert_true(d == -200.0);
    assert_int_equal(cairn_mp_read_int(&r, &i), CAIRN_OK);
    assert_true(i == INT64_MIN);
    assert_int_equal(cairn_mp_read_number(&r, &d), CAIRN_OK);
    assert_true(d == 1.5);
    assert_int_equal(cairn_mp_read_str(&r, &s, &sl), CAIRN_EINVAL);
    assert_int_equal(cairn_mp_read_number(&r, &d), CAIRN_OK);
    assert_true(d == -2.25);
    assert_int_equal(cairn_mp_peek(&r), CAIRN_MP_NIL);
    assert_int_equal(cairn_mp_read_nil(&r), CAIRN_OK);
    assert_int_equal(cairn_mp_read_bool(&r, &b), CAIRN_OK);
    assert_false(b);
    assert_int_equal(cairn_mp_read_str(&r, &s, &sl), CAIRN_OK);
    assert_int_equal(sl, strlen("héllo"));
    assert_memory_equal(s, "héllo", sl);
    assert_int_equal(cairn_mp_peek(&r), CAIRN_MP_MAP);
    assert_int_equal(cairn_mp_skip(&r), CAIRN_OK); /* {"k": [[], bin]} as a whole */
    assert_int_equal(cairn_mp_peek(&r), CAIRN_MP_NONE);
    assert_int_equal(cairn_mp_skip(&r), CAIRN_EFORMAT);

    /* Truncated values are refused, never read past the end. */
    for (size_t cut = 0; cut < m.sb.size; cut++) {
        cairn_mp_reader t = cairn_mp_reader_of(m.sb.data, cut);
        assert_int_not_equal(cairn_mp_skip(&t), CAIRN_OK);
    }
    /* Skip refuses counts that cannot be honest for the bytes present. */
    const uint8_t liar[] = {0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0};
    cairn_mp_reader t = cairn_mp_reader_of(liar, sizeof liar);
    assert_int_equal(cairn_mp_skip(&t), CAIRN_EFORMAT);
    msgpack_sbuffer_destroy(&m.sb);
}

/* ---- request decoding -------------------------------------------------------------- */

/* Decode and expect failure with `code` (and a msgid when has_msgid). */
static void expect_error(const msg *m, int code, bool has_msgid)
{
    cairn_rpc_context ctx = ctx_for_tests();
    cairn_rpc_call call;
    cairn_rpc_error err;
    uint64_t seed = 1;
    int rc = cairn_rpc_decode(&ctx, bytes(m), m->sb.size, &seed, &call, &err);
    if (rc == CAIRN_OK)
        cairn_rpc_call_clear(&call);
    assert_int_equal(rc, code);
    assert_int_equal(err.code, code);
    assert_int_equal(err.has_msgid, has_msgid);
    assert_true(strlen(err.message) > 0);
    assert_null(call.tokens); /* nothing left allocated */
}

static void test_decode_generate(void **state)
{
    (void)state;
    msg m;
    sample_request(&m);
    cairn_rpc_context ctx = ctx_for_tests();
    cairn_rpc_call call;
    cairn_rpc_error err;
    uint64_t seed = 1;
    assert_int_equal(cairn_rpc_decode(&ctx, bytes(&m), m.sb.size, &seed, &call, &err), CAIRN_OK);
    assert_int_equal(call.msgid, 70000);
    assert_int_equal(call.method, CAIRN_RPC_GENERATE);
    /* The prompt is tokenized like `cairn run` does it: BOS when asked for. */
    int32_t want[64];
    size_t n_want;
    const char *prompt = "Once upon a time";
    int flags = cairn_vocab_add_bos(g_vocab) ? CAIRN_TOK_ADD_BOS : 0;
    assert_int_equal(cairn_tokenize(g_vocab, prompt, strlen(prompt), flags, want, 64, &n_want),
                     CAIRN_OK);
    assert_int_equal(call.n_tokens, n_want);
    assert_memory_equal(call.tokens, want, n_want * sizeof(int32_t));
    assert_int_equal(call.gen.max_tokens, 32);
    assert_true(call.gen.sampling.temperature == 0.5f);
    assert_true(call.gen.sampling.top_p == 0.25f);
    assert_int_equal(call.gen.sampling.top_k, cairn_sampling_defaults().top_k);
    assert_true(call.gen.sampling.seed == 0xfedcba9876543210ull);
    assert_int_equal(call.gen.n_stop, 2);
    assert_string_equal(call.gen.stop[0], "\n\n");
    assert_string_equal(call.gen.stop[1], "The end");
    assert_false(call.gen.stream);
    cairn_rpc_call_clear(&call);
    msgpack_sbuffer_destroy(&m.sb);

    /* Token ids instead of text, streaming, no seed (drawn from the source). */
    request_head(&m, 3, "generate", 3);
    put_str(&m, "tokens");
    msgpack_pack_array(&m.pk, 3);
    msgpack_pack_int(&m.pk, 1);
    msgpack_pack_int(&m.pk, 400);
    msgpack_pack_int(&m.pk, 0);
    put_str(&m, "stream");
    msgpack_pack_true(&m.pk);
    put_str(&m, "stop");
    put_str(&m, "x"); /* a single string is accepted as one stop string */
    uint64_t before = seed;
    assert_int_equal(cairn_rpc_decode(&ctx, bytes(&m), m.sb.size, &seed, &call, &err), CAIRN_OK);
    assert_int_equal(call.n_tokens, 3);
    assert_int_equal(call.tokens[1], 400);
    assert_true(call.gen.stream);
    assert_int_equal(call.gen.n_stop, 1);
    assert_true(seed != before);
    cairn_rpc_call_clear(&call);
    msgpack_sbuffer_destroy(&m.sb);
}

static void test_decode_rejects(void **state)
{
    (void)state;
    msg m;
    const int INV = CAIRN_RPC_INVALID_REQUEST, BIG = CAIRN_RPC_TOO_LARGE;
    cairn_rpc_context ctx = ctx_for_tests();

    /* Not a request at all: no msgid, so the connection is to be closed. */
    msg_init(&m);
    msgpack_pack_int(&m.pk, 42);
    expect_error(&m, INV, false);
    msgpack_sbuffer_destroy(&m.sb);
    msg_init(&m);
    msgpack_pack_array(&m.pk, 4);
    msgpack_pack_int(&m.pk, 0);
    put_str(&m, "not an id");
    put_str(&m, "server.info");
    msgpack_pack_array(&m.pk, 0);
    expect_error(&m, INV, false);
    msgpack_sbuffer_destroy(&m.sb);
    msg_init(&m); /* a response sent to the server */
    msgpack_pack_array(&m.pk, 4);
    msgpack_pack_int(&m.pk, 1);
    msgpack_pack_int(&m.pk, 1);
    msgpack_pack_nil(&m.pk);
    msgpack_pack_nil(&m.pk);
    expect_error(&m, INV, false);
    msgpack_sbuffer_destroy(&m.sb);
    msg_init(&m); /* msgid >= 2^32 */
    msgpack_pack_array(&m.pk, 4);
    msgpack_pack_int(&m.pk, 0);
    msgpack_pack_uint64(&m.pk, 1ull << 32);
    put_str(&m, "server.info");
    msgpack_pack_array(&m.pk, 0);
    expect_error(&m, INV, false);
    msgpack_sbuffer_destroy(&m.sb);

    /* Answerable errors. */
    request_head(&m, 9, "no.such.method", 0);
    expect_error(&m, INV, true);
    msgpack_sbuffer_destroy(&m.sb);
    msg_init(&m); /* params not a map */
    msgpack_pack_array(&m.pk, 4);
    msgpack_pack_int(&m.pk, 0);
    msgpack_pack_int(&m.pk, 9);
    put_str(&m, "server.info");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_int(&m.pk, 5);
    expect_error(&m, INV, true);
    msgpack_sbuffer_destroy(&m.sb);

    struct {
        const char *method, *key;
        int what; /* 0 int, 1 str, 2 float, 3 big array, 4 bad token, 5 array of 9 str,
                     6 long stop, 7 huge int, 8 negative, 9 bool */
        int code;
    } cases[] = {
        {"generate", "prompt", 0, INV},        /* prompt must be a string     */
        {"generate", "tokens", 4, INV},        /* token id out of the vocab    */
        {"generate", "tokens", 3, BIG},        /* more tokens than n_ctx       */
        {"generate", "temperature", 1, INV},   /* wrong type                   */
        {"generate", "temperature", 8, INV},   /* out of range                 */
        {"generate", "top_p", 2, INV},         /* 7.5 > 1                      */
        {"generate", "max_tokens", 7, BIG},    /* > n_ctx                      */
        {"generate", "max_tokens", 8, INV},
        {"generate", "stream", 0, INV},
        {"generate", "stop", 5, BIG},          /* 9 stop strings               */
        {"generate", "stop", 6, BIG},          /* a 300-byte stop string       */
        {"generate", "seed", 8, INV},
        {"session.info", "session_id", 1, INV}, /* "abc" is not 32 hex digits */
        {"session.info", "session_id", 0, INV},
        {"session.truncate", "n_tokens", 8, INV},
        {"gen.cancel", "request", 7, INV},
        {"tokenize", "text", 9, INV},
        {"detokenize", "tokens", 1, INV},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const bool needs_prompt = strcmp(cases[k].method, "generate") == 0 &&
                                  strcmp(cases[k].key, "prompt") && strcmp(cases[k].key, "tokens");
        const bool needs_sid = strcmp(cases[k].method, "session.truncate") == 0;
        request_head(&m, (uint32_t)k, cases[k].method, 1 + needs_prompt + needs_sid);
        if (needs_prompt) {
            put_str(&m, "prompt");
            put_str(&m, "hello");
        }
        if (needs_sid) {
            put_str(&m, "session_id");
            put_str(&m, "0123456789abcdef0123456789abcdef");
        }
        put_str(&m, cases[k].key);
        switch (cases[k].what) {
        case 0: msgpack_pack_int(&m.pk, 3); break;
        case 1: put_str(&m, "abc"); break;
        case 2: msgpack_pack_double(&m.pk, 7.5); break;
        case 3:
            msgpack_pack_array(&m.pk, (size_t)ctx.api->n_ctx + 1);
            for (int i = 0; i <= ctx.api->n_ctx; i++)
                msgpack_pack_int(&m.pk, 1);
            break;
        case 4:
            msgpack_pack_array(&m.pk, 2);
            msgpack_pack_int(&m.pk, 1);
            msgpack_pack_int(&m.pk, ctx.api->n_vocab);
            break;
        case 5:
            msgpack_pack_array(&m.pk, 9);
            for (int i = 0; i < 9; i++)
                put_str(&m, "s");
            break;
        case 6: {
            char longs[301];
            memset(longs, 'z', 300);
            longs[300] = '\0';
            msgpack_pack_array(&m.pk, 1);
            put_str(&m, longs);
            break;
        }
        case 7: msgpack_pack_uint64(&m.pk, 1ull << 40); break;
        case 8: msgpack_pack_int(&m.pk, -1); break;
        case 9: msgpack_pack_true(&m.pk); break;
        }
        expect_error(&m, cases[k].code, true);
        msgpack_sbuffer_destroy(&m.sb);
    }

    /* A key given twice, a non-string key, and missing required fields. */
    request_head(&m, 1, "generate", 2);
    put_str(&m, "prompt");
    put_str(&m, "a");
    put_str(&m, "prompt");
    put_str(&m, "b");
    expect_error(&m, INV, true);
    msgpack_sbuffer_destroy(&m.sb);
    request_head(&m, 1, "server.info", 1);
    msgpack_pack_int(&m.pk, 1);
    msgpack_pack_int(&m.pk, 2);
    expect_error(&m, INV, true);
    msgpack_sbuffer_destroy(&m.sb);
    const char *need_something[] = {"generate", "session.append", "session.fork",
                                    "session.truncate", "gen.cancel", "tokenize", "detokenize"};
    for (size_t k = 0; k < sizeof need_something / sizeof *need_something; k++) {
        request_head(&m, 1, need_something[k], 0);
        expect_error(&m, INV, true);
        msgpack_sbuffer_destroy(&m.sb);
    }
    /* Both text and tokens. */
    request_head(&m, 1, "generate", 2);
    put_str(&m, "prompt");
    put_str(&m, "a");
    put_str(&m, "tokens");
    msgpack_pack_array(&m.pk, 0);
    expect_error(&m, INV, true);
    msgpack_sbuffer_destroy(&m.sb);
    /* An empty prompt. */
    request_head(&m, 1, "generate", 2);
    put_str(&m, "prompt");
    put_str(&m, "");
    put_str(&m, "add_bos");
    msgpack_pack_false(&m.pk);
    expect_error(&m, INV, true);
    msgpack_sbuffer_destroy(&m.sb);
    /* A message with an unknown role. */
    request_head(&m, 1, "session.open", 1);
    put_str(&m, "messages");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_map(&m.pk, 2);
    put_str(&m, "role");
    put_str(&m, "wizard");
    put_str(&m, "content");
    put_str(&m, "hi");
    expect_error(&m, INV, true);
    msgpack_sbuffer_destroy(&m.sb);
}

static void test_decode_sessions_and_misc(void **state)
{
    (void)state;
    cairn_rpc_context ctx = ctx_for_tests();
    cairn_rpc_call call;
    cairn_rpc_error err;
    msg m;
    uint64_t seed = 0;

    /* session.open with system + messages: the generic chat format, BOS. */
    request_head(&m, 11, "session.open", 2);
    put_str(&m, "system");
    put_str(&m, "Be brief.");
    put_str(&m, "messages");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_map(&m.pk, 3);
    put_str(&m, "role");
    put_str(&m, "user");
    put_str(&m, "name"); /* unknown keys inside a message are ignored */
    put_str(&m, "x");
    put_str(&m, "content");
    put_str(&m, "Hi");
    assert_int_equal(cairn_rpc_decode(&ctx, bytes(&m), m.sb.size, &seed, &call, &err), CAIRN_OK);
    const char *rendered = "<|system|>\nBe brief.\n<|user|>\nHi\n";
    int32_t want[128];
    size_t n_want;
    int flags = cairn_vocab_add_bos(g_vocab) ? CAIRN_TOK_ADD_BOS : 0;
    assert_int_equal(cairn_tokenize(g_vocab, rendered, strlen(rendered), flags, want, 128,
                                    &n_want), CAIRN_OK);
    assert_int_equal(call.n_tokens, n_want);
    assert_memory_equal(call.tokens, want, n_want * sizeof(int32_t));
    cairn_rpc_call_clear(&call);
    msgpack_sbuffer_destroy(&m.sb);

    /* session.generate with messages: no BOS, the assistant cue appended. */
    request_head(&m, 12, "session.generate", 3);
    put_str(&m, "session_id");
    put_str(&m, "00112233445566778899AABBCCDDEEFF");
    put_str(&m, "messages");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_map(&m.pk, 2);
    put_str(&m, "role");
    put_str(&m, "tool");
    put_str(&m, "content");
    put_str(&m, "42");
    put_str(&m, "max_tokens");
    msgpack_pack_int(&m.pk, 0);
    assert_int_equal(cairn_rpc_decode(&ctx, bytes(&m), m.sb.size, &seed, &call, &err), CAIRN_OK);
    rendered = "<|tool|>\n42\n<|assistant|>\n";
    assert_int_equal(cairn_tokenize(g_vocab, rendered, strlen(rendered), 0, want, 128, &n_want),
                     CAIRN_OK);
    assert_int_equal(call.n_tokens, n_want);
    assert_memory_equal(call.tokens, want, n_want * sizeof(int32_t));
    assert_true(call.session.hi == 0x0011223344556677ull && call.session.lo == 0x8899aabbccddeeffull);
    assert_int_equal(call.gen.max_tokens, 0);
    cairn_rpc_call_clear(&call);
    msgpack_sbuffer_destroy(&m.sb);

    /* session.open with nothing: an empty session. */
    request_head(&m, 13, "session.open", 0);
    assert_int_equal(cairn_rpc_decode(&ctx, bytes(&m), m.sb.size, &seed, &call, &err), CAIRN_OK);
    assert_false(call.has_content);
    assert_int_equal(call.n_tokens, 0);
    cairn_rpc_call_clear(&call);
    msgpack_sbuffer_destroy(&m.sb);

    /* truncate and cancel carry their numbers. */
    request_head(&m, 14, "session.truncate", 2);
    put_str(&m, "session_id");
    put_str(&m, "ffffffffffffffffffffffffffffffff");
    put_str(&m, "n_tokens");
    msgpack_pack_int(&m.pk, 17);
    assert_int_equal(cairn_rpc_decode(&ctx, bytes(&m), m.sb.size, &seed, &call, &err), CAIRN_OK);
    assert_int_equal(call.n_keep, 17);
    cairn_rpc_call_clear(&call);
    msgpack_sbuffer_destroy(&m.sb);
    request_head(&m, 15, "gen.cancel", 1);
    put_str(&m, "request");
    msgpack_pack_uint32(&m.pk, 4000000000u);
    assert_int_equal(cairn_rpc_decode(&ctx, bytes(&m), m.sb.size, &seed, &call, &err), CAIRN_OK);
    assert_int_equal(call.target, 4000000000u);
    cairn_rpc_call_clear(&call);
    msgpack_sbuffer_destroy(&m.sb);

    /* params may be [], [nil], a bare map, or nil. */
    const uint8_t forms[][16] = {
        {0x94, 0x00, 0x01, 0xab, 's', 'e', 'r', 'v', 'e', 'r', '.', 'i', 'n', 'f', 'o', 0x90},
        {0x94, 0x00, 0x01, 0xab, 's', 'e', 'r', 'v', 'e', 'r', '.', 'i', 'n', 'f', 'o', 0x80},
        {0x94, 0x00, 0x01, 0xab, 's', 'e', 'r', 'v', 'e', 'r', '.', 'i', 'n', 'f', 'o', 0xc0},
    };
    for (int i = 0; i < 3; i++) {
        assert_int_equal(cairn_rpc_decode(&ctx, forms[i], 16, &seed, &call, &err), CAIRN_OK);
        assert_int_equal(call.method, CAIRN_RPC_SERVER_INFO);
        cairn_rpc_call_clear(&call);
    }
    /* A notification from the client is ignored, not an error. */
    const uint8_t notif[] = {0x93, 0x02, 0xa1, 'x', 0x90};
    assert_int_equal(cairn_rpc_decode(&ctx, notif, sizeof notif, &seed, &call, &err),
                     CAIRN_ECLOSED);

    /* Without a vocab, text cannot be accepted (but token ids can). */
    cairn_rpc_context novocab = ctx;
    novocab.api = &g_api_novocab;
    request_head(&m, 16, "tokenize", 1);
    put_str(&m, "text");
    put_str(&m, "hello");
    assert_int_equal(cairn_rpc_decode(&novocab, bytes(&m), m.sb.size, &seed, &call, &err),
                     CAIRN_RPC_UNSUPPORTED);
    msgpack_sbuffer_destroy(&m.sb);
}

/* ---- packing ------------------------------------------------------------------------ */

/* Unpack our own output with msgpack-c (trusted bytes) and return the root. */
static msgpack_object unpack(msgpack_unpacked *u, const msgpack_sbuffer *sb)
{
    size_t off = 0;
    msgpack_unpacked_init(u);
    assert_int_equal(msgpack_unpack_next(u, sb->data, sb->size, &off), MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(off, sb->size); /* exactly one message */
    /* Our own scanner accepts it too. */
    size_t n;
    assert_int_equal(cairn_mp_scan_buffer((const uint8_t *)sb->data, sb->size, &g_lim, &n),
                     CAIRN_OK);
    assert_int_equal(n, sb->size);
    return u->data;
}

/* The value of `key` in map o, NULL when it has none. */
static const msgpack_object *map_find(const msgpack_object *o, const char *key)
{
    assert_int_equal(o->type, MSGPACK_OBJECT_MAP);
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object_kv *kv = &o->via.map.ptr[i];
        if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == strlen(key) &&
            memcmp(kv->key.via.str.ptr, key, strlen(key)) == 0)
            return &kv->val;
    }
    return NULL;
}

static const msgpack_object *map_get(const msgpack_object *o, const char *key)
{
    const msgpack_object *v = map_find(o, key);
    if (!v)
        fail_msg("key %s missing", key);
    return v;
}

static void test_pack(void **state)
{
    (void)state;
    msgpack_sbuffer sb;
    msgpack_unpacked u;

    msgpack_sbuffer_init(&sb);
    assert_int_equal(cairn_rpc_pack_error(&sb, 77, CAIRN_ERANGE, "too big"), CAIRN_OK);
    msgpack_object o = unpack(&u, &sb);
    assert_int_equal(o.via.array.size, 4);
    assert_int_equal(o.via.array.ptr[0].via.u64, 1);
    assert_int_equal(o.via.array.ptr[1].via.u64, 77);
    assert_int_equal(o.via.array.ptr[3].type, MSGPACK_OBJECT_NIL);
    const msgpack_object *e = &o.via.array.ptr[2];
    assert_int_equal(map_get(e, "code")->via.i64, -7);
    assert_memory_equal(map_get(e, "type")->via.str.ptr, "too_large", 9);
    assert_memory_equal(map_get(e, "message")->via.str.ptr, "too big", 7);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);

    /* Engine status codes collapse to the six protocol codes. */
    assert_int_equal(cairn_rpc_error_code(CAIRN_EFULL), -8);
    assert_int_equal(cairn_rpc_error_code(CAIRN_ENOTFOUND), -6);
    assert_int_equal(cairn_rpc_error_code(CAIRN_EIO), -11);
    assert_string_equal(cairn_rpc_error_type(CAIRN_EUNSUPPORTED), "unsupported");

    const int32_t toks[] = {5, 6, 7};
    cairn_event ev = {.kind = CAIRN_EV_DELTA, .client = 1, .id = 9, .text = "abc", .text_len = 3,
                      .tokens = toks, .n_tokens = 3};
    msgpack_sbuffer_init(&sb);
    assert_int_equal(cairn_rpc_pack_event(&sb, CAIRN_RPC_GENERATE, &ev, NULL), CAIRN_OK);
    o = unpack(&u, &sb);
    assert_int_equal(o.via.array.size, 3);
    assert_int_equal(o.via.array.ptr[0].via.u64, 2);
    assert_memory_equal(o.via.array.ptr[1].via.str.ptr, "gen.delta", 9);
    const msgpack_object *d = &o.via.array.ptr[2].via.array.ptr[0];
    assert_int_equal(map_get(d, "request")->via.u64, 9);
    assert_int_equal(map_get(d, "tokens")->via.array.size, 3);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);

    ev.kind = CAIRN_EV_DONE;
    ev.what = CAIRN_DONE_GENERATION;
    ev.finish_reason = "length";
    ev.prompt_tokens = 4;
    ev.cached_tokens = 2;
    ev.completion_tokens = 3;
    msgpack_sbuffer_init(&sb);
    assert_int_equal(cairn_rpc_pack_event(&sb, CAIRN_RPC_GENERATE, &ev, NULL), CAIRN_OK);
    o = unpack(&u, &sb);
    const msgpack_object *r = &o.via.array.ptr[3];
    assert_memory_equal(map_get(r, "finish_reason")->via.str.ptr, "length", 6);
    assert_int_equal(map_get(map_get(r, "usage"), "cached_tokens")->via.u64, 2);
    assert_int_equal(map_get(r, "tokens")->via.array.ptr[2].via.u64, 7);
    assert_int_equal(r->via.map.size, 4); /* no tool_calls, no content */
    /* the cache was not looked at: cache_miss is nil */
    assert_int_equal(map_get(map_get(r, "usage"), "cache_miss")->type, MSGPACK_OBJECT_NIL);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);

    /* A miss: its reason, position, tiers and both excerpts as token ids. */
    ev.miss = (cairn_cache_miss){.known = true, .reason = CAIRN_MISS_EVICTED, .departure = 32,
                                 .closest_tokens = 48, .tier = 0 /* device */,
                                 .evicted_tier = 1 /* host */, .prompt_next = {11, 12},
                                 .n_prompt_next = 2, .cached_next = {13}, .n_cached_next = 1};
    msgpack_sbuffer_init(&sb);
    assert_int_equal(cairn_rpc_pack_event(&sb, CAIRN_RPC_GENERATE, &ev, NULL), CAIRN_OK);
    o = unpack(&u, &sb);
    const msgpack_object *miss = map_get(map_get(&o.via.array.ptr[3], "usage"), "cache_miss");
    assert_int_equal(miss->type, MSGPACK_OBJECT_MAP);
    assert_memory_equal(map_get(miss, "reason")->via.str.ptr, "evicted", 7);
    assert_int_equal(map_get(miss, "position")->via.u64, 32);
    assert_int_equal(map_get(miss, "closest_tokens")->via.u64, 48);
    assert_memory_equal(map_get(miss, "closest_tier")->via.str.ptr, "device", 6);
    assert_memory_equal(map_get(miss, "evicted_tier")->via.str.ptr, "host", 4);
    assert_int_equal(map_get(miss, "prompt_excerpt")->via.array.size, 2);
    assert_int_equal(map_get(miss, "cached_excerpt")->via.array.ptr[0].via.u64, 13);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
    ev.miss = (cairn_cache_miss){0};

    /* With tool calls: finish_reason says so, the calls come as maps. */
    const cairn_rpc_tool_calls calls = {
        "[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\","
        "\"arguments\":\"{\\\"n\\\":2}\"},\"n\":[1,-2,0.5,true,null]}]",
        "around", NULL};
    msgpack_sbuffer_init(&sb);
    assert_int_equal(cairn_rpc_pack_event(&sb, CAIRN_RPC_SESSION_GENERATE, &ev, &calls), CAIRN_OK);
    o = unpack(&u, &sb);
    r = &o.via.array.ptr[3];
    assert_memory_equal(map_get(r, "finish_reason")->via.str.ptr, "tool_calls", 10);
    assert_memory_equal(map_get(r, "content")->via.str.ptr, "around", 6);
    const msgpack_object *tc = map_get(r, "tool_calls");
    assert_int_equal(tc->via.array.size, 1);
    const msgpack_object *fn = map_get(&tc->via.array.ptr[0], "function");
    assert_memory_equal(map_get(fn, "name")->via.str.ptr, "f", 1);
    assert_memory_equal(map_get(fn, "arguments")->via.str.ptr, "{\"n\":2}", 7);
    const msgpack_object *n = map_get(&tc->via.array.ptr[0], "n");
    assert_int_equal(n->via.array.size, 5);
    assert_int_equal(n->via.array.ptr[1].via.i64, -2);
    assert_true(n->via.array.ptr[2].via.f64 == 0.5);
    assert_true(n->via.array.ptr[3].via.boolean);
    assert_int_equal(n->via.array.ptr[4].type, MSGPACK_OBJECT_NIL);
    assert_null(map_find(r, "reasoning"));
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);

    /* A reply in channels without calls: its content and reasoning, the
     * finish_reason the generation's own. */
    const cairn_rpc_tool_calls parts = {NULL, "the answer", "thought"};
    msgpack_sbuffer_init(&sb);
    assert_int_equal(cairn_rpc_pack_event(&sb, CAIRN_RPC_GENERATE, &ev, &parts), CAIRN_OK);
    o = unpack(&u, &sb);
    r = &o.via.array.ptr[3];
    assert_memory_equal(map_get(r, "finish_reason")->via.str.ptr, ev.finish_reason,
                        strlen(ev.finish_reason));
    assert_null(map_find(r, "tool_calls"));
    assert_int_equal(map_get(r, "content")->via.str.size, 10);
    assert_memory_equal(map_get(r, "content")->via.str.ptr, "the answer", 10);
    assert_int_equal(map_get(r, "reasoning")->via.str.size, 7);
    assert_memory_equal(map_get(r, "reasoning")->via.str.ptr, "thought", 7);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);

    /* Session results depend on the method they answer. */
    ev.what = CAIRN_DONE_SESSION;
    ev.session = (cairn_session_id){0xabcdull, 0x1ull};
    ev.n_session_tokens = 12;
    msgpack_sbuffer_init(&sb);
    assert_int_equal(cairn_rpc_pack_event(&sb, CAIRN_RPC_SESSION_OPEN, &ev, NULL), CAIRN_OK);
    o = unpack(&u, &sb);
    r = &o.via.array.ptr[3];
    assert_int_equal(map_get(r, "n_tokens")->via.u64, 12);
    assert_int_equal(map_get(r, "session_id")->via.str.size, 32);
    assert_memory_equal(map_get(r, "session_id")->via.str.ptr,
                        "000000000000abcd0000000000000001", 32);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
    msgpack_sbuffer_init(&sb);
    assert_int_equal(cairn_rpc_pack_event(&sb, CAIRN_RPC_SESSION_CLOSE, &ev, NULL), CAIRN_OK);
    o = unpack(&u, &sb);
    assert_true(map_get(&o.via.array.ptr[3], "closed")->via.boolean);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);

    ev.what = CAIRN_DONE_STATS;
    ev.stats.prompt_tokens = 10;
    ev.stats.cached_tokens = 4;
    ev.stats.pages[1] = 3;
    msgpack_sbuffer_init(&sb);
    assert_int_equal(cairn_rpc_pack_event(&sb, CAIRN_RPC_CACHE_STATS, &ev, NULL), CAIRN_OK);
    o = unpack(&u, &sb);
    r = &o.via.array.ptr[3];
    assert_true(map_get(r, "hit_rate")->via.f64 == 0.4);
    assert_int_equal(map_get(map_get(r, "pages"), "host")->via.u64, 3);
    map_get(r, "sessions");
    map_get(r, "device_pages_free");
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);

    ev.kind = CAIRN_EV_ERROR;
    ev.code = CAIRN_ENOTFOUND;
    ev.message = "no such session";
    msgpack_sbuffer_init(&sb);
    assert_int_equal(cairn_rpc_pack_event(&sb, CAIRN_RPC_SESSION_INFO, &ev, NULL), CAIRN_OK);
    o = unpack(&u, &sb);
    assert_int_equal(map_get(&o.via.array.ptr[2], "code")->via.i64, -6);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);

    /* tokenize -> detokenize round trip through the packers. */
    cairn_rpc_context ctx = ctx_for_tests();
    const char *text = "Lily saw a big dog.";
    int32_t ids[64];
    size_t n_ids;
    assert_int_equal(cairn_tokenize(g_vocab, text, strlen(text), 0, ids, 64, &n_ids), CAIRN_OK);
    msg dm;
    request_head(&dm, 5, "detokenize", 1);
    put_str(&dm, "tokens");
    msgpack_pack_array(&dm.pk, n_ids);
    for (size_t i = 0; i < n_ids; i++)
        msgpack_pack_int32(&dm.pk, ids[i]);
    cairn_rpc_call call;
    cairn_rpc_error derr;
    uint64_t dseed = 1;
    assert_int_equal(cairn_rpc_decode(&ctx, bytes(&dm), dm.sb.size, &dseed, &call, &derr),
                     CAIRN_OK);
    msgpack_sbuffer_destroy(&dm.sb);
    msgpack_sbuffer_init(&sb);
    assert_int_equal(cairn_rpc_pack_detokenize(&sb, &call), CAIRN_OK);
    cairn_rpc_call_clear(&call);
    o = unpack(&u, &sb);
    const msgpack_object *t = map_get(&o.via.array.ptr[3], "text");
    /* SentencePiece adds a leading space marker; the text must contain ours. */
    assert_true(t->via.str.size >= strlen(text));
    assert_memory_equal(t->via.str.ptr + t->via.str.size - strlen(text), text, strlen(text));
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);

    cairn_rpc_server_info info = {.version = "0.1.0", .n_ctx = 256, .page_size = 16,
                                  .limits = g_lim};
    msgpack_sbuffer_init(&sb);
    assert_int_equal(cairn_rpc_pack_server_info(&sb, 1, &info), CAIRN_OK);
    o = unpack(&u, &sb);
    r = &o.via.array.ptr[3];
    assert_int_equal(map_get(map_get(r, "limits"), "max_depth")->via.u64, 24);
    assert_int_equal(map_get(map_get(r, "model"), "n_ctx")->via.u64, 256);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
}

/* ---- random input ----------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Scan, and when an object is complete decode it; free what comes back.
 * The checks: nothing crashes (ASan/UBSan builds catch memory errors),
 * lengths stay within the input, and errors carry a message. */
static int n_decoded, n_answered, n_unanswerable;

static void chew(const uint8_t *buf, size_t len, const cairn_mp_limits *lim)
{
    cairn_rpc_context ctx = ctx_for_tests();
    ctx.limits = *lim;
    size_t n;
    int rc = cairn_mp_scan_buffer(buf, len, lim, &n);
    assert_true(rc == CAIRN_OK || rc == CAIRN_ERANGE || rc == CAIRN_EFORMAT);
    assert_true(n <= len);
    uint32_t id;
    (void)cairn_rpc_peek_msgid(buf, len, &id);
    cairn_mp_reader r = cairn_mp_reader_of(buf, len);
    (void)cairn_mp_skip(&r);
    assert_true(r.p <= r.end);
    if (rc == CAIRN_OK && n > 0) {
        cairn_rpc_call call;
        cairn_rpc_error err;
        uint64_t seed = 0;
        rc = cairn_rpc_decode(&ctx, buf, n, &seed, &call, &err);
        if (rc == CAIRN_OK) {
            n_decoded++;
            cairn_rpc_call_clear(&call);
        } else if (rc != CAIRN_ECLOSED) {
            assert_true(err.message[0] != '\0');
            if (err.has_msgid)
                n_answered++;
            else
                n_unanswerable++;
        }
    }
}

static void test_fuzz(void **state)
{
    (void)state;
    cairn_mp_limits small = g_lim;
    small.max_message_bytes = 4096;
    small.max_string_bytes = 512;
    small.max_array_len = 256;
    uint8_t buf[600];
    /* CAIRN_FUZZ_ITERS=N runs longer (by hand, under ASan). */
    const char *env = getenv("CAIRN_FUZZ_ITERS");
    const int iters = env && atoi(env) > 0 ? atoi(env) : 30000;
    /* Pure noise, biased toward msgpack header bytes so structures appear. */
    for (int it = 0; it < iters; it++) {
        size_t len = rnd() % sizeof buf;
        for (size_t i = 0; i < len; i++) {
            uint64_t x = rnd();
            buf[i] = (x & 3) == 0 ? (uint8_t)(0x80 + (x >> 8) % 0x60) : (uint8_t)(x >> 16);
        }
        chew(buf, len, it & 1 ? &small : &g_lim);
    }
    /* Mutations of valid requests: flipped, inserted, truncated bytes. */
    msg seeds[3];
    sample_request(&seeds[0]);
    request_head(&seeds[1], 2, "session.open", 2);
    put_str(&seeds[1], "system");
    put_str(&seeds[1], "sys");
    put_str(&seeds[1], "messages");
    msgpack_pack_array(&seeds[1].pk, 2);
    for (int i = 0; i < 2; i++) {
        msgpack_pack_map(&seeds[1].pk, 2);
        put_str(&seeds[1], "role");
        put_str(&seeds[1], i ? "assistant" : "user");
        put_str(&seeds[1], "content");
        put_str(&seeds[1], "some words here");
    }
    request_head(&seeds[2], 3, "detokenize", 1);
    put_str(&seeds[2], "tokens");
    msgpack_pack_array(&seeds[2].pk, 20);
    for (int i = 0; i < 20; i++)
        msgpack_pack_int(&seeds[2].pk, i * 25);
    for (int it = 0; it < iters; it++) {
        const msg *s = &seeds[it % 3];
        size_t len = s->sb.size < sizeof buf ? s->sb.size : sizeof buf;
        memcpy(buf, s->sb.data, len);
        int edits = 1 + (int)(rnd() % 4);
        for (int e = 0; e < edits; e++) {
            size_t at = rnd() % len;
            switch (rnd() % 4) {
            case 0: buf[at] = (uint8_t)rnd(); break;
            case 1: buf[at] ^= (uint8_t)(1u << (rnd() % 8)); break;
            case 2: len = at + 1; break;
            default: buf[at] = (uint8_t[]){0xdb, 0xdd, 0xdf, 0xc6, 0xcf, 0xd3, 0xc1}[rnd() % 7];
            }
        }
        chew(buf, len, it & 1 ? &small : &g_lim);
    }
    for (int i = 0; i < 3; i++)
        msgpack_sbuffer_destroy(&seeds[i].sb);
    /* The mutations reached every outcome, so the decoder was exercised. */
    assert_true(n_decoded > 100);
    assert_true(n_answered > 100);
    assert_true(n_unanswerable > 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scan_valid_and_back_to_back),
        cmocka_unit_test(test_scan_every_truncation),
        cmocka_unit_test(test_scan_hostile_lengths),
        cmocka_unit_test(test_scan_nesting),
        cmocka_unit_test(test_scan_skip_resync),
        cmocka_unit_test(test_reader),
        cmocka_unit_test(test_decode_generate),
        cmocka_unit_test(test_decode_rejects),
        cmocka_unit_test(test_decode_sessions_and_misc),
        cmocka_unit_test(test_pack),
        cmocka_unit_test(test_fuzz),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
