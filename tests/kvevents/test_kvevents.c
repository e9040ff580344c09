/*
 * tests/kvevents/test_kvevents.c — the publisher's wire output, read back
 * with msgpack-c and libzmq exactly as a router reads it: every event a
 * tagged map with vLLM 0.32's keys in vLLM's order and types (hashes as
 * 16-byte bin, the parent nil for a sequence's first page), batches as
 * [ts, events, nil]; the replay socket's answer (from a sequence number,
 * then the end marker); the live stream's three frames; a full queue
 * refused and remembered once; bad endpoints refused; close with events
 * still queued.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <msgpack.h>
#include <zmq.h>

#include "kvevents/kvevents.h"

#define BS 4 /* tokens per block */

static void endpoint(char *out, size_t cap, const char *tag)
{
    snprintf(out, cap, "ipc:///tmp/cairn-kvev-%d-%s", (int)getpid(), tag);
}

static cairn_page_hash H(uint64_t i) { return (cairn_page_hash){.lo = i * 7919, .hi = i}; }

static void wait_published(cairn_kv_events *ev, uint64_t n)
{
    cairn_kv_events_stats st;
    for (int i = 0; i < 1000; i++) { /* a hang guard, not a timing check */
        cairn_kv_events_get_stats(ev, &st);
        if (st.published_events >= n)
            return;
        usleep(10000);
    }
    fail_msg("the publisher did not publish %llu events", (unsigned long long)n);
}

static const msgpack_object *get(const msgpack_object *map, const char *key, int index)
{
    assert_int_equal(map->type, MSGPACK_OBJECT_MAP);
    assert_true((uint32_t)index < map->via.map.size);
    const msgpack_object_kv *kv = &map->via.map.ptr[index];
    assert_int_equal(kv->key.type, MSGPACK_OBJECT_STR);
    assert_int_equal(kv->key.via.str.size, strlen(key));
    assert_memory_equal(kv->key.via.str.ptr, key, strlen(key));
    return &kv->val;
}

static void expect_str(const msgpack_object *o, const char *s)
{
    assert_int_equal(o->type, MSGPACK_OBJECT_STR);
    assert_int_equal(o->via.str.size, strlen(s));
    assert_memory_equal(o->via.str.ptr, s, strlen(s));
}

static void expect_hash(const msgpack_object *o, cairn_page_hash h)
{
    uint8_t b[16];
    cairn_page_hash_to_bytes(h, b);
    assert_int_equal(o->type, MSGPACK_OBJECT_BIN);
    assert_int_equal(o->via.bin.size, 16);
    assert_memory_equal(o->via.bin.ptr, b, 16);
}

/* The four events emit_script sends, checked in order as they arrive. */
typedef struct {
    int next;
} script_check;

static void emit_script(cairn_kv_events *ev)
{
    int32_t tok[3 * BS];
    for (int i = 0; i < 3 * BS; i++)
        tok[i] = 100 + i;
    cairn_page_hash h[2] = {H(1), H(2)};
    assert_int_equal(cairn_kv_events_stored(ev, CAIRN_KV_MEDIUM_GPU, false, H(0), h, 2, tok),
                     CAIRN_OK);
    cairn_page_hash h3 = H(3);
    assert_int_equal(
        cairn_kv_events_stored(ev, CAIRN_KV_MEDIUM_STORAGE, true, H(2), &h3, 1, tok + 2 * BS),
        CAIRN_OK);
    assert_int_equal(cairn_kv_events_removed(ev, CAIRN_KV_MEDIUM_GPU, h, 2), CAIRN_OK);
    assert_int_equal(cairn_kv_events_cleared(ev), CAIRN_OK);
}

static void check_event(script_check *sc, const msgpack_object *e)
{
    assert_int_equal(e->type, MSGPACK_OBJECT_MAP);
    switch (sc->next++) {
    case 0:
    case 1: {
        bool first = sc->next == 1;
        assert_int_equal(e->via.map.size, 10);
        expect_str(get(e, "type", 0), "BlockStored");
        const msgpack_object *hs = get(e, "block_hashes", 1);
        assert_int_equal(hs->type, MSGPACK_OBJECT_ARRAY);
        assert_int_equal(hs->via.array.size, first ? 2 : 1);
        for (uint32_t i = 0; i < hs->via.array.size; i++)
            expect_hash(&hs->via.array.ptr[i], H(first ? 1 + i : 3));
        const msgpack_object *parent = get(e, "parent_block_hash", 2);
        if (first)
            assert_int_equal(parent->type, MSGPACK_OBJECT_NIL);
        else
            expect_hash(parent, H(2));
        const msgpack_object *t = get(e, "token_ids", 3);
        assert_int_equal(t->type, MSGPACK_OBJECT_ARRAY);
        assert_int_equal(t->via.array.size, first ? 2 * BS : BS);
        for (uint32_t i = 0; i < t->via.array.size; i++) {
            assert_int_equal(t->via.array.ptr[i].type, MSGPACK_OBJECT_POSITIVE_INTEGER);
            assert_int_equal(t->via.array.ptr[i].via.u64, 100 + i + (first ? 0 : 2 * BS));
        }
        assert_int_equal(get(e, "block_size", 4)->via.u64, BS);
        assert_int_equal(get(e, "lora_id", 5)->type, MSGPACK_OBJECT_NIL);
        expect_str(get(e, "medium", 6), first ? "GPU" : "STORAGE");
        assert_int_equal(get(e, "lora_name", 7)->type, MSGPACK_OBJECT_NIL);
        assert_int_equal(get(e, "group_idx", 8)->via.u64, 0);
        expect_str(get(e, "kv_cache_spec_kind", 9), "full_attention");
        break;
    }
    case 2: {
        assert_int_equal(e->via.map.size, 4);
        expect_str(get(e, "type", 0), "BlockRemoved");
        const msgpack_object *hs = get(e, "block_hashes", 1);
        assert_int_equal(hs->via.array.size, 2);
        expect_hash(&hs->via.array.ptr[0], H(1));
        expect_hash(&hs->via.array.ptr[1], H(2));
        expect_str(get(e, "medium", 2), "GPU");
        assert_int_equal(get(e, "group_idx", 3)->via.u64, 0);
        break;
    }
    case 3:
        assert_int_equal(e->via.map.size, 1);
        expect_str(get(e, "type", 0), "AllBlocksCleared");
        break;
    default:
        fail_msg("more events than were sent");
    }
}

/* [ts, [events...], nil]: every event checked in order. */
static void check_batch(script_check *sc, const void *data, size_t size)
{
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    assert_int_equal(msgpack_unpack_next(&u, data, size, NULL), MSGPACK_UNPACK_SUCCESS);
    const msgpack_object *b = &u.data;
    assert_int_equal(b->type, MSGPACK_OBJECT_ARRAY);
    assert_int_equal(b->via.array.size, 3);
    assert_true(b->via.array.ptr[0].type == MSGPACK_OBJECT_FLOAT64);
    assert_true(b->via.array.ptr[0].via.f64 > 1.6e9); /* seconds since the epoch */
    assert_int_equal(b->via.array.ptr[1].type, MSGPACK_OBJECT_ARRAY);
    assert_int_equal(b->via.array.ptr[2].type, MSGPACK_OBJECT_NIL);
    const msgpack_object *evs = &b->via.array.ptr[1];
    for (uint32_t i = 0; i < evs->via.array.size; i++)
        check_event(sc, &evs->via.array.ptr[i]);
    msgpack_unpacked_destroy(&u);
}

static uint64_t be64(const void *p)
{
    const uint8_t *b = p;
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | b[i];
    return v;
}

/* Ask the replay socket from `start`; check every batch; the batch count. */
static int replay_from(void *ctx, const char *rep, uint64_t start, script_check *sc,
                       uint64_t *first_seq)
{
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    assert_non_null(d);
    assert_int_equal(zmq_connect(d, rep), 0);
    uint8_t sq[8];
    for (int i = 0; i < 8; i++)
        sq[i] = (uint8_t)(start >> (56 - 8 * i));
    zmq_send(d, "", 0, ZMQ_SNDMORE);
    zmq_send(d, sq, 8, 0);
    int batches = 0;
    int timeout = 10000; /* a hang guard */
    zmq_setsockopt(d, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    for (;;) {
        zmq_msg_t f[4];
        for (int i = 0; i < 4; i++) {
            zmq_msg_init(&f[i]);
            assert_true(zmq_msg_recv(&f[i], d, 0) >= 0);
        }
        /* DEALER frames: "", topic, seq, payload */
        assert_int_equal(zmq_msg_size(&f[0]), 0);
        assert_int_equal(zmq_msg_size(&f[2]), 8);
        uint64_t seq = be64(zmq_msg_data(&f[2]));
        bool end = seq == UINT64_MAX;
        if (!end) {
            assert_true(seq >= start);
            if (batches == 0 && first_seq)
                *first_seq = seq;
            assert_int_equal(zmq_msg_size(&f[1]), 5);
            assert_memory_equal(zmq_msg_data(&f[1]), "cairn", 5);
            check_batch(sc, zmq_msg_data(&f[3]), zmq_msg_size(&f[3]));
            batches++;
        } else {
            assert_int_equal(zmq_msg_size(&f[3]), 0);
        }
        for (int i = 0; i < 4; i++)
            zmq_msg_close(&f[i]);
        if (end)
            break;
    }
    zmq_close(d);
    return batches;
}

static void test_wire_and_replay(void **state)
{
    (void)state;
    char pub[128], rep[128], err[256] = "";
    endpoint(pub, sizeof pub, "pub");
    endpoint(rep, sizeof rep, "rep");
    cairn_kv_events_config cfg = {.endpoint = pub, .replay_endpoint = rep, .topic = "cairn",
                                  .block_size = BS, .data_parallel_rank = -1};
    cairn_kv_events *ev;
    assert_int_equal(cairn_kv_events_open(&cfg, &ev, err, sizeof err), CAIRN_OK);
    emit_script(ev);
    wait_published(ev, 4);
    void *ctx = zmq_ctx_new();
    script_check sc = {0};
    uint64_t first = 99;
    int n = replay_from(ctx, rep, 0, &sc, &first);
    assert_int_equal(sc.next, 4); /* every event, in order, however they were batched */
    assert_int_equal(first, 0);
    assert_true(n >= 1 && n <= 4);
    cairn_kv_events_stats st;
    cairn_kv_events_get_stats(ev, &st);
    assert_int_equal(st.next_seq, (uint64_t)n);
    assert_int_equal(st.published_events, 4);
    assert_int_equal(st.replay_requests, 1);
    /* from past the end: only the end marker */
    script_check none = {0};
    assert_int_equal(replay_from(ctx, rep, st.next_seq, &none, NULL), 0);
    assert_int_equal(none.next, 0);

    /* the live stream: topic, 8-byte big-endian sequence, payload */
    void *sub = zmq_socket(ctx, ZMQ_SUB);
    zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0);
    assert_int_equal(zmq_connect(sub, pub), 0);
    bool got = false;
    for (int i = 0; i < 200 && !got; i++) { /* until the subscription is through */
        assert_int_equal(cairn_kv_events_cleared(ev), CAIRN_OK);
        zmq_pollitem_t it = {.socket = sub, .events = ZMQ_POLLIN};
        if (zmq_poll(&it, 1, 50) > 0) {
            zmq_msg_t f[3];
            for (int k = 0; k < 3; k++) {
                zmq_msg_init(&f[k]);
                assert_true(zmq_msg_recv(&f[k], sub, 0) >= 0);
            }
            assert_int_equal(zmq_msg_size(&f[0]), 5);
            assert_int_equal(zmq_msg_size(&f[1]), 8);
            assert_true(be64(zmq_msg_data(&f[1])) >= (uint64_t)n);
            assert_false(zmq_msg_more(&f[2]));
            script_check cleared = {.next = 3};
            check_batch(&cleared, zmq_msg_data(&f[2]), zmq_msg_size(&f[2]));
            for (int k = 0; k < 3; k++)
                zmq_msg_close(&f[k]);
            got = true;
        }
    }
    assert_true(got);
    zmq_close(sub);
    zmq_ctx_term(ctx);
    cairn_kv_events_close(ev);
}

static void test_full_queue_is_refused_once(void **state)
{
    (void)state;
    char pub[128];
    endpoint(pub, sizeof pub, "full");
    cairn_kv_events_config cfg = {.endpoint = pub, .block_size = BS, .queue_bytes = 16,
                                  .data_parallel_rank = -1};
    cairn_kv_events *ev;
    assert_int_equal(cairn_kv_events_open(&cfg, &ev, NULL, 0), CAIRN_OK);
    assert_false(cairn_kv_events_take_overflow(ev));
    int32_t tok[2 * BS] = {0};
    cairn_page_hash h[2] = {H(1), H(2)};
    /* 2 hashes and 8 token ids are more bytes than the whole queue */
    assert_int_equal(cairn_kv_events_stored(ev, CAIRN_KV_MEDIUM_GPU, false, H(0), h, 2, tok),
                     CAIRN_EFULL);
    assert_true(cairn_kv_events_take_overflow(ev));
    assert_false(cairn_kv_events_take_overflow(ev)); /* once */
    cairn_kv_events_stats st;
    cairn_kv_events_get_stats(ev, &st);
    assert_int_equal(st.dropped_events, 1);
    assert_int_equal(st.queued_events, 0);
    /* a cleared event carries no bytes: it still fits */
    assert_int_equal(cairn_kv_events_cleared(ev), CAIRN_OK);
    cairn_kv_events_close(ev);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    char err[256] = "";
    cairn_kv_events *ev = (cairn_kv_events *)1;
    cairn_kv_events_config cfg = {.endpoint = NULL, .block_size = BS};
    assert_int_equal(cairn_kv_events_open(&cfg, &ev, err, sizeof err), CAIRN_EINVAL);
    assert_null(ev);
    cfg.endpoint = "http://127.0.0.1:1";
    assert_int_equal(cairn_kv_events_open(&cfg, &ev, err, sizeof err), CAIRN_EINVAL);
    assert_non_null(strstr(err, "http://127.0.0.1:1"));
    cfg.endpoint = "tcp://127.0.0.1:5";
    cfg.block_size = 0;
    assert_int_equal(cairn_kv_events_open(&cfg, &ev, err, sizeof err), CAIRN_EINVAL);
    /* a port already bound: the second open fails, naming the endpoint */
    char pub[128];
    endpoint(pub, sizeof pub, "x");
    cfg = (cairn_kv_events_config){.endpoint = "tcp://127.0.0.1:*", .block_size = BS};
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_PUB);
    assert_int_equal(zmq_bind(s, "tcp://127.0.0.1:*"), 0);
    char bound[128];
    size_t len = sizeof bound;
    zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, bound, &len);
    cfg.endpoint = bound;
    assert_int_equal(cairn_kv_events_open(&cfg, &ev, err, sizeof err), CAIRN_EIO);
    assert_non_null(strstr(err, bound));
    zmq_close(s);
    zmq_ctx_term(ctx);
    /* NULLs */
    cfg.endpoint = pub;
    assert_int_equal(cairn_kv_events_open(&cfg, &ev, NULL, 0), CAIRN_OK);
    cairn_page_hash h = H(1);
    int32_t tok[BS] = {0};
    assert_int_equal(cairn_kv_events_stored(ev, CAIRN_KV_MEDIUM_GPU, false, h, &h, 0, tok),
                     CAIRN_EINVAL);
    assert_int_equal(cairn_kv_events_stored(ev, CAIRN_KV_MEDIUM_GPU, false, h, NULL, 1, tok),
                     CAIRN_EINVAL);
    assert_int_equal(cairn_kv_events_removed(ev, (cairn_kv_medium)7, &h, 1), CAIRN_EINVAL);
    assert_null(cairn_kv_medium_name((cairn_kv_medium)7));
    /* close with events still queued: sent or not, nothing leaks or hangs */
    for (int i = 0; i < 200; i++)
        cairn_kv_events_stored(ev, CAIRN_KV_MEDIUM_CPU, false, h, &h, 1, tok);
    cairn_kv_events_close(ev);
    cairn_kv_events_close(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wire_and_replay),
        cmocka_unit_test(test_full_queue_is_refused_once),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
