/*
 * kvevents/kvevents.c — the publisher behind kvevents.h: a bounded queue
 * the reporting threads copy events into, and one thread that owns both ZMQ
 * sockets, encodes each wake-up's events as one EventBatch, sends it, keeps
 * it for replay and answers replay requests.
 *
 * Sockets are created and bound in open() (so a bad or busy endpoint is an
 * error the caller sees) and from then on touched only by the publisher
 * thread: ZMQ sockets belong to one thread at a time, and pthread_create is
 * the hand-over.
 */
#include "kvevents/kvevents.h"

#include <msgpack.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

enum { EV_STORED = 0, EV_REMOVED = 1, EV_CLEARED = 2 };

#define BATCH_EVENTS 1024                   /* events per EventBatch at most        */
#define REPLAY_BYTES ((size_t)256 << 20)    /* replay ring's payload bytes at most  */
#define IDLE_POLL_MS 20                     /* wake-up when nothing is queued       */

/* One queued event; hashes and tokens follow it in the same allocation. */
typedef struct qevent {
    struct qevent *next;
    int kind;
    cairn_kv_medium medium;
    bool has_parent;
    cairn_page_hash parent;
    size_t n;          /* pages                                 */
    size_t n_tokens;   /* stored: n * block_size                */
    cairn_page_hash *hashes;
    int32_t *tokens;
} qevent;

typedef struct {
    uint64_t seq;
    char *payload;
    size_t bytes;
} kept_batch;

struct cairn_kv_events {
    cairn_kv_events_config cfg;
    char *topic;
    size_t topic_len;

    void *zctx, *pub, *replay; /* replay may be NULL */

    pthread_mutex_t mu;        /* the queue and `stopping` */
    pthread_cond_t cv;
    qevent *head, *tail;
    size_t q_events, q_bytes;
    bool stopping;
    pthread_t thread;
    bool thread_started;

    /* the publisher thread's own */
    kept_batch *kept;          /* ring of cfg.replay_batches */
    size_t kept_head, kept_n, kept_bytes;
    uint64_t seq;

    /* the mirror: every page announced and not removed, with its parent
     * and tokens, so a subscriber that connects later (a restarted router)
     * is sent the whole state at once (mirror_dump) */
    struct mirror_page *mirror;  /* open addressing on hash.lo            */
    size_t mirror_cap, mirror_n, mirror_used; /* used: live + tombstones  */
    bool dumping;                /* publishing the mirror: not applied back */
    int32_t *mirror_tokens;      /* [mirror_cap * block_size]              */

    atomic_bool overflow;
    _Atomic uint64_t queued, published, batches, dropped, replays, replayed, next_seq, resyncs;
};

struct mirror_page {
    cairn_page_hash hash;
    cairn_page_hash parent;
    uint8_t state;     /* 0 empty, 1 live, 2 removed                        */
    uint8_t media;     /* bit m: announced in medium m                     */
    bool has_parent;
    uint32_t first_child, next_sibling; /* mirror_dump's scratch: index + 1 */
};

const char *cairn_kv_medium_name(cairn_kv_medium m)
{
    switch (m) {
    case CAIRN_KV_MEDIUM_GPU: return "GPU";
    case CAIRN_KV_MEDIUM_CPU: return "CPU";
    case CAIRN_KV_MEDIUM_STORAGE: return "STORAGE";
    default: return NULL;
    }
}

/* ---- encoding --------------------------------------------------------------
 * vLLM 0.32 encodes events with msgspec (tag=True, omit_defaults=True): a map
 * whose first key is "type", then every field without a default (None
 * included), then the defaulted ones that differ from their default. */

static void pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pack_hash(msgpack_packer *pk, cairn_page_hash h)
{
    uint8_t b[16];
    cairn_page_hash_to_bytes(h, b);
    msgpack_pack_bin(pk, 16);
    msgpack_pack_bin_body(pk, b, 16);
}

static void pack_event(msgpack_packer *pk, const qevent *e, int block_size)
{
    if (e->kind == EV_CLEARED) {
        msgpack_pack_map(pk, 1);
        pack_str(pk, "type");
        pack_str(pk, "AllBlocksCleared");
        return;
    }
    bool stored = e->kind == EV_STORED;
    msgpack_pack_map(pk, stored ? 10 : 4);
    pack_str(pk, "type");
    pack_str(pk, stored ? "BlockStored" : "BlockRemoved");
    pack_str(pk, "block_hashes");
    msgpack_pack_array(pk, e->n);
    for (size_t i = 0; i < e->n; i++)
        pack_hash(pk, e->hashes[i]);
    if (stored) {
        pack_str(pk, "parent_block_hash");
        if (e->has_parent)
            pack_hash(pk, e->parent);
        else
            msgpack_pack_nil(pk);
        pack_str(pk, "token_ids");
        msgpack_pack_array(pk, e->n_tokens);
        for (size_t i = 0; i < e->n_tokens; i++)
            msgpack_pack_uint32(pk, (uint32_t)e->tokens[i]);
        pack_str(pk, "block_size");
        msgpack_pack_int(pk, block_size);
        pack_str(pk, "lora_id");
        msgpack_pack_nil(pk);
    }
    pack_str(pk, "medium");
    pack_str(pk, cairn_kv_medium_name(e->medium));
    if (stored) {
        pack_str(pk, "lora_name");
        msgpack_pack_nil(pk);
    }
    /* every cairn page holds every layer: one full-attention group */
    pack_str(pk, "group_idx");
    msgpack_pack_int(pk, 0);
    if (stored) {
        pack_str(pk, "kv_cache_spec_kind");
        pack_str(pk, "full_attention");
    }
}

/* ---- the publisher thread --------------------------------------------------- */

static void seq_bytes(uint64_t seq, uint8_t out[8])
{
    for (int i = 0; i < 8; i++)
        out[i] = (uint8_t)(seq >> (56 - 8 * i));
}

static void keep_batch(cairn_kv_events *ev, uint64_t seq, const char *data, size_t bytes)
{
    size_t cap = ev->cfg.replay_batches;
    /* make room: by count, then by bytes (the oldest go first) */
    while (ev->kept_n > 0 && (ev->kept_n == cap || ev->kept_bytes + bytes > REPLAY_BYTES)) {
        kept_batch *old = &ev->kept[ev->kept_head];
        ev->kept_bytes -= old->bytes;
        free(old->payload);
        old->payload = NULL;
        ev->kept_head = (ev->kept_head + 1) % cap;
        ev->kept_n--;
    }
    char *copy = malloc(bytes ? bytes : 1);
    if (!copy)
        return; /* a replay will miss it; the live stream had it */
    memcpy(copy, data, bytes);
    kept_batch *k = &ev->kept[(ev->kept_head + ev->kept_n) % cap];
    *k = (kept_batch){.seq = seq, .payload = copy, .bytes = bytes};
    ev->kept_n++;
    ev->kept_bytes += bytes;
}

/* ---- the mirror (publisher thread only) ------------------------------------- */

static size_t mirror_find(const cairn_kv_events *ev, cairn_page_hash h, bool *found)
{
    size_t mask = ev->mirror_cap - 1, j = (size_t)(h.lo ^ h.hi) & mask, tomb = SIZE_MAX;
    *found = false;
    while (ev->mirror[j].state) {
        if (ev->mirror[j].state == 1 && cairn_page_hash_equal(ev->mirror[j].hash, h)) {
            *found = true;
            return j;
        }
        if (ev->mirror[j].state == 2 && tomb == SIZE_MAX)
            tomb = j;
        j = (j + 1) & mask;
    }
    return tomb != SIZE_MAX ? tomb : j;
}

static void mirror_clear(cairn_kv_events *ev)
{
    free(ev->mirror);
    free(ev->mirror_tokens);
    ev->mirror = NULL;
    ev->mirror_tokens = NULL;
    ev->mirror_cap = ev->mirror_n = ev->mirror_used = 0;
}

static bool mirror_grow(cairn_kv_events *ev)
{
    if (ev->mirror_cap && 4 * (ev->mirror_used + 1) <= 3 * ev->mirror_cap)
        return true;
    /* rebuild: tombstones go, and the table doubles while live pages fill half */
    size_t cap = ev->mirror_cap ? ev->mirror_cap : 1024;
    while (2 * (ev->mirror_n + 1) > cap)
        cap *= 2;
    size_t bs = (size_t)ev->cfg.block_size;
    struct mirror_page *v = calloc(cap, sizeof *v);
    int32_t *t = malloc(cap * bs * sizeof *t);
    if (!v || !t) {
        free(v);
        free(t);
        return false;
    }
    struct mirror_page *old = ev->mirror;
    int32_t *old_t = ev->mirror_tokens;
    size_t old_cap = ev->mirror_cap;
    ev->mirror = v;
    ev->mirror_tokens = t;
    ev->mirror_cap = cap;
    ev->mirror_used = ev->mirror_n;
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i].state != 1)
            continue;
        bool found;
        size_t j = mirror_find(ev, old[i].hash, &found);
        v[j] = old[i];
        memcpy(t + j * bs, old_t + i * bs, bs * sizeof *t);
    }
    free(old);
    free(old_t);
    return true;
}

static void mirror_apply(cairn_kv_events *ev, const qevent *e)
{
    size_t bs = (size_t)ev->cfg.block_size;
    if (e->kind == EV_CLEARED) {
        mirror_clear(ev);
        return;
    }
    for (size_t i = 0; i < e->n; i++) {
        if (e->kind == EV_STORED && !mirror_grow(ev))
            return; /* out of memory: a later subscriber misses some pages */
        if (!ev->mirror_cap)
            return;
        bool found;
        size_t j = mirror_find(ev, e->hashes[i], &found);
        struct mirror_page *p = &ev->mirror[j];
        if (e->kind == EV_STORED) {
            if (!found) {
                ev->mirror_used += p->state == 0;
                *p = (struct mirror_page){.hash = e->hashes[i], .state = 1};
                ev->mirror_n++;
            }
            p->media |= (uint8_t)(1u << e->medium);
            p->has_parent = i > 0 || e->has_parent;
            p->parent = i > 0 ? e->hashes[i - 1] : e->parent;
            memcpy(ev->mirror_tokens + j * bs, e->tokens + i * bs, bs * sizeof(int32_t));
        } else if (found) {
            p->media &= (uint8_t)~(1u << e->medium);
            if (!p->media) {
                p->state = 2;
                ev->mirror_n--;
            }
        }
    }
}

static void publish(cairn_kv_events *ev, qevent *list, size_t n);
static void free_list(qevent *e);

/* A new subscription: AllBlocksCleared, then every page the mirror holds,
 * parents before children, one page per medium per event, in batches. A
 * subscriber that was there already ends where it was; a new one (a
 * restarted router, which asks the replay socket only after a gap it has
 * seen) starts from the whole state instead of from nothing. */
static void mirror_dump(cairn_kv_events *ev)
{
    size_t bs = (size_t)ev->cfg.block_size;
    qevent *cleared = calloc(1, sizeof *cleared);
    if (!cleared)
        return;
    ev->dumping = true;
    cleared->kind = EV_CLEARED;
    publish(ev, cleared, 1);
    free(cleared);
    if (!ev->mirror_n) {
        ev->dumping = false;
        return;
    }
    /* children lists: each live page under its parent, if the parent is live */
    size_t *roots = malloc(ev->mirror_n * sizeof *roots), n_roots = 0;
    size_t *stack = malloc(ev->mirror_n * sizeof *stack);
    qevent **batch = malloc(BATCH_EVENTS * sizeof *batch);
    if (!roots || !stack || !batch) {
        free(roots);
        free(stack);
        free(batch);
        ev->dumping = false;
        return;
    }
    for (size_t i = 0; i < ev->mirror_cap; i++)
        ev->mirror[i].first_child = ev->mirror[i].next_sibling = 0;
    for (size_t i = 0; i < ev->mirror_cap; i++) {
        struct mirror_page *p = &ev->mirror[i];
        if (p->state != 1)
            continue;
        bool found = false;
        size_t up = p->has_parent ? mirror_find(ev, p->parent, &found) : 0;
        if (found) {
            p->next_sibling = ev->mirror[up].first_child;
            ev->mirror[up].first_child = (uint32_t)(i + 1);
        } else {
            roots[n_roots++] = i;
        }
    }
    size_t nb = 0;
    for (size_t r = 0; r < n_roots; r++) {
        size_t top = 0;
        stack[top++] = roots[r];
        while (top) {
            size_t i = stack[--top];
            struct mirror_page *p = &ev->mirror[i];
            for (int m = 0; m < CAIRN_KV_MEDIUM_COUNT; m++) {
                if (!(p->media & (1u << m)))
                    continue;
                qevent *e = malloc(sizeof *e + sizeof(cairn_page_hash) + bs * sizeof(int32_t));
                if (!e)
                    continue;
                *e = (qevent){.kind = EV_STORED, .medium = (cairn_kv_medium)m, .n = 1,
                              .n_tokens = bs, .has_parent = p->has_parent, .parent = p->parent};
                e->hashes = (cairn_page_hash *)(e + 1);
                e->tokens = (int32_t *)(e->hashes + 1);
                e->hashes[0] = p->hash;
                memcpy(e->tokens, ev->mirror_tokens + i * bs, bs * sizeof(int32_t));
                e->next = NULL;
                if (nb)
                    batch[nb - 1]->next = e;
                batch[nb++] = e;
                if (nb == BATCH_EVENTS) {
                    publish(ev, batch[0], nb);
                    free_list(batch[0]);
                    nb = 0;
                }
            }
            for (uint32_t c = p->first_child; c; c = ev->mirror[c - 1].next_sibling)
                stack[top++] = c - 1;
        }
    }
    if (nb) {
        publish(ev, batch[0], nb);
        free_list(batch[0]);
    }
    free(roots);
    free(stack);
    free(batch);
    ev->dumping = false;
    atomic_fetch_add(&ev->resyncs, 1);
}

/* Subscriptions arrive on the XPUB socket as [1, topic] (0: unsubscribe). */
static void serve_subscriptions(cairn_kv_events *ev)
{
    bool joined = false;
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, ev->pub, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            break;
        }
        if (zmq_msg_size(&m) > 0 && ((const uint8_t *)zmq_msg_data(&m))[0] == 1)
            joined = true;
        zmq_msg_close(&m);
    }
    if (joined)
        mirror_dump(ev);
}

static void publish(cairn_kv_events *ev, qevent *list, size_t n)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, cairn_wall_now());
    msgpack_pack_array(&pk, n);
    for (qevent *e = list; e; e = e->next) {
        pack_event(&pk, e, ev->cfg.block_size);
        if (!ev->dumping)
            mirror_apply(ev, e);
    }
    if (ev->cfg.data_parallel_rank >= 0)
        msgpack_pack_int(&pk, ev->cfg.data_parallel_rank);
    else
        msgpack_pack_nil(&pk);

    uint64_t seq = ev->seq++;
    uint8_t sq[8];
    seq_bytes(seq, sq);
    /* A PUB socket drops for a slow subscriber instead of blocking (its
     * high-water mark); the replay ring is how that subscriber catches up. */
    zmq_send(ev->pub, ev->topic, ev->topic_len, ZMQ_SNDMORE);
    zmq_send(ev->pub, sq, 8, ZMQ_SNDMORE);
    zmq_send(ev->pub, sb.data, sb.size, 0);
    if (ev->replay)
        keep_batch(ev, seq, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    atomic_fetch_add(&ev->published, n);
    atomic_fetch_add(&ev->batches, 1);
    atomic_store(&ev->next_seq, ev->seq);
}

/* Answer one replay request, if one is waiting. */
static void serve_replay(cairn_kv_events *ev)
{
    zmq_msg_t part[3];
    int got = 0;
    int more = 1;
    /* read the whole multipart message, keeping the first three frames */
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, ev->replay, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            break;
        }
        more = zmq_msg_more(&m);
        if (got < 3)
            part[got++] = m;
        else
            zmq_msg_close(&m);
    }
    if (got == 3 && zmq_msg_size(&part[2]) == 8) {
        const uint8_t *b = zmq_msg_data(&part[2]);
        uint64_t start = 0;
        for (int i = 0; i < 8; i++)
            start = start << 8 | b[i];
        const void *id = zmq_msg_data(&part[0]);
        size_t id_len = zmq_msg_size(&part[0]);
        uint64_t sent = 0;
        for (size_t i = 0; i < ev->kept_n; i++) {
            const kept_batch *k = &ev->kept[(ev->kept_head + i) % ev->cfg.replay_batches];
            if (k->seq < start)
                continue;
            uint8_t sq[8];
            seq_bytes(k->seq, sq);
            zmq_send(ev->replay, id, id_len, ZMQ_SNDMORE);
            zmq_send(ev->replay, "", 0, ZMQ_SNDMORE);
            zmq_send(ev->replay, ev->topic, ev->topic_len, ZMQ_SNDMORE);
            zmq_send(ev->replay, sq, 8, ZMQ_SNDMORE);
            zmq_send(ev->replay, k->payload, k->bytes, 0);
            sent++;
        }
        static const uint8_t end_seq[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
        zmq_send(ev->replay, id, id_len, ZMQ_SNDMORE);
        zmq_send(ev->replay, "", 0, ZMQ_SNDMORE);
        zmq_send(ev->replay, "", 0, ZMQ_SNDMORE);
        zmq_send(ev->replay, end_seq, 8, ZMQ_SNDMORE);
        zmq_send(ev->replay, "", 0, 0);
        atomic_fetch_add(&ev->replays, 1);
        atomic_fetch_add(&ev->replayed, sent);
    }
    for (int i = 0; i < got; i++)
        zmq_msg_close(&part[i]);
}

static void free_list(qevent *e)
{
    while (e) {
        qevent *next = e->next;
        free(e);
        e = next;
    }
}

static void *publisher_main(void *arg)
{
    cairn_kv_events *ev = arg;
    for (;;) {
        pthread_mutex_lock(&ev->mu);
        bool idle = !ev->head;
        bool stop = ev->stopping;
        pthread_mutex_unlock(&ev->mu);
        zmq_pollitem_t it[2] = {{.socket = ev->pub, .events = ZMQ_POLLIN},
                                {.socket = ev->replay, .events = ZMQ_POLLIN}};
        if (zmq_poll(it, ev->replay ? 2 : 1, idle && !stop ? IDLE_POLL_MS : 0) > 0) {
            if (it[0].revents & ZMQ_POLLIN)
                serve_subscriptions(ev);
            if (ev->replay && (it[1].revents & ZMQ_POLLIN))
                serve_replay(ev);
        }
        pthread_mutex_lock(&ev->mu);
        /* take at most one batch's worth */
        qevent *list = ev->head, *last = NULL;
        size_t n = 0, bytes = 0;
        for (qevent *e = ev->head; e && n < BATCH_EVENTS; e = e->next) {
            last = e;
            n++;
            bytes += e->n * sizeof *e->hashes + e->n_tokens * sizeof *e->tokens;
        }
        if (last) {
            ev->head = last->next;
            if (!ev->head)
                ev->tail = NULL;
            last->next = NULL;
            ev->q_events -= n;
            ev->q_bytes -= bytes;
        } else {
            list = NULL;
        }
        bool done = ev->stopping && !ev->head;
        pthread_mutex_unlock(&ev->mu);
        if (list) {
            publish(ev, list, n);
            free_list(list);
        }
        if (done && !list)
            return NULL;
    }
}

/* ---- the reporting side ---------------------------------------------------- */

static int enqueue(cairn_kv_events *ev, qevent *e)
{
    size_t bytes = e->n * sizeof *e->hashes + e->n_tokens * sizeof *e->tokens;
    pthread_mutex_lock(&ev->mu);
    if (ev->stopping || ev->q_events + 1 > ev->cfg.queue_events ||
        ev->q_bytes + bytes > ev->cfg.queue_bytes) {
        pthread_mutex_unlock(&ev->mu);
        free(e);
        atomic_fetch_add(&ev->dropped, 1);
        atomic_store(&ev->overflow, true);
        return CAIRN_EFULL;
    }
    if (ev->tail)
        ev->tail->next = e;
    else
        ev->head = e;
    ev->tail = e;
    ev->q_events++;
    ev->q_bytes += bytes;
    pthread_cond_signal(&ev->cv);
    pthread_mutex_unlock(&ev->mu);
    atomic_fetch_add(&ev->queued, 1);
    return CAIRN_OK;
}

static qevent *new_event(int kind, cairn_kv_medium m, size_t n, size_t n_tokens)
{
    qevent *e = malloc(sizeof *e + n * sizeof(cairn_page_hash) + n_tokens * sizeof(int32_t));
    if (!e)
        return NULL;
    *e = (qevent){.kind = kind, .medium = m, .n = n, .n_tokens = n_tokens};
    e->hashes = (cairn_page_hash *)(e + 1);
    e->tokens = (int32_t *)(e->hashes + n);
    return e;
}

int cairn_kv_events_stored(cairn_kv_events *ev, cairn_kv_medium m, bool has_parent,
                           cairn_page_hash parent, const cairn_page_hash *hashes, size_t n,
                           const int32_t *tokens)
{
    if (!ev || !hashes || !tokens || n == 0 || !cairn_kv_medium_name(m))
        return CAIRN_EINVAL;
    size_t nt = n * (size_t)ev->cfg.block_size;
    qevent *e = new_event(EV_STORED, m, n, nt);
    if (!e)
        return CAIRN_ENOMEM;
    e->has_parent = has_parent;
    e->parent = parent;
    memcpy(e->hashes, hashes, n * sizeof *hashes);
    memcpy(e->tokens, tokens, nt * sizeof *tokens);
    return enqueue(ev, e);
}

int cairn_kv_events_removed(cairn_kv_events *ev, cairn_kv_medium m, const cairn_page_hash *hashes,
                            size_t n)
{
    if (!ev || !hashes || n == 0 || !cairn_kv_medium_name(m))
        return CAIRN_EINVAL;
    qevent *e = new_event(EV_REMOVED, m, n, 0);
    if (!e)
        return CAIRN_ENOMEM;
    memcpy(e->hashes, hashes, n * sizeof *hashes);
    return enqueue(ev, e);
}

int cairn_kv_events_cleared(cairn_kv_events *ev)
{
    if (!ev)
        return CAIRN_EINVAL;
    qevent *e = new_event(EV_CLEARED, CAIRN_KV_MEDIUM_GPU, 0, 0);
    return e ? enqueue(ev, e) : CAIRN_ENOMEM;
}

bool cairn_kv_events_take_overflow(cairn_kv_events *ev)
{
    return ev && atomic_exchange(&ev->overflow, false);
}

void cairn_kv_events_get_stats(const cairn_kv_events *ev, cairn_kv_events_stats *out)
{
    if (!out)
        return;
    *out = (cairn_kv_events_stats){0};
    if (!ev)
        return;
    cairn_kv_events *e = (cairn_kv_events *)ev; /* atomics: loads only */
    out->queued_events = atomic_load(&e->queued);
    out->published_events = atomic_load(&e->published);
    out->published_batches = atomic_load(&e->batches);
    out->dropped_events = atomic_load(&e->dropped);
    out->replay_requests = atomic_load(&e->replays);
    out->replayed_batches = atomic_load(&e->replayed);
    out->next_seq = atomic_load(&e->next_seq);
    out->resyncs = atomic_load(&e->resyncs);
}

/* ---- open and close ---------------------------------------------------------- */

static bool endpoint_ok(const char *url)
{
    return url && (strncmp(url, "tcp://", 6) == 0 || strncmp(url, "ipc://", 6) == 0) && url[6];
}

static void close_sockets(cairn_kv_events *ev)
{
    if (ev->pub)
        zmq_close(ev->pub);
    if (ev->replay)
        zmq_close(ev->replay);
    if (ev->zctx)
        zmq_ctx_term(ev->zctx);
    ev->pub = ev->replay = ev->zctx = NULL;
}

static void free_all(cairn_kv_events *ev)
{
    close_sockets(ev);
    free_list(ev->head);
    if (ev->kept) {
        for (size_t i = 0; i < ev->kept_n; i++)
            free(ev->kept[(ev->kept_head + i) % ev->cfg.replay_batches].payload);
        free(ev->kept);
    }
    free(ev->topic);
    mirror_clear(ev);
    pthread_mutex_destroy(&ev->mu);
    pthread_cond_destroy(&ev->cv);
    free(ev);
}

static int bind_socket(void *ctx, int type, const char *url, void **out, char *err,
                       size_t err_len)
{
    void *s = zmq_socket(ctx, type);
    if (!s) {
        if (err && err_len)
            snprintf(err, err_len, "KV events: cannot create a socket: %s", zmq_strerror(zmq_errno()));
        return CAIRN_EIO;
    }
    int linger = 500; /* ms: close sends what is queued, then gives up */
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    if (type == ZMQ_XPUB) {
        int hwm = 100000, verbose = 1; /* every subscription, repeats included */
        zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
        zmq_setsockopt(s, ZMQ_XPUB_VERBOSE, &verbose, sizeof verbose);
    }
    if (zmq_bind(s, url) != 0) {
        if (err && err_len)
            snprintf(err, err_len, "KV events: cannot bind %s: %s", url, zmq_strerror(zmq_errno()));
        zmq_close(s);
        return CAIRN_EIO;
    }
    *out = s;
    return CAIRN_OK;
}

int cairn_kv_events_open(const cairn_kv_events_config *cfg, cairn_kv_events **out, char *err,
                         size_t err_len)
{
    if (out)
        *out = NULL;
    if (!cfg || !out || cfg->block_size <= 0 || !endpoint_ok(cfg->endpoint) ||
        (cfg->replay_endpoint && !endpoint_ok(cfg->replay_endpoint))) {
        if (err && err_len)
            snprintf(err, err_len, "KV events: an endpoint must be tcp://HOST:PORT or "
                                   "ipc://PATH (got '%s')",
                     !cfg || !cfg->endpoint ? "(none)"
                     : !endpoint_ok(cfg->endpoint) ? cfg->endpoint
                                                   : cfg->replay_endpoint ? cfg->replay_endpoint
                                                                          : "");
        return CAIRN_EINVAL;
    }
    cairn_kv_events *ev = calloc(1, sizeof *ev);
    if (!ev)
        return CAIRN_ENOMEM;
    ev->cfg = *cfg;
    if (!ev->cfg.queue_events)
        ev->cfg.queue_events = 65536;
    if (!ev->cfg.queue_bytes)
        ev->cfg.queue_bytes = (size_t)64 << 20;
    if (!ev->cfg.replay_batches)
        ev->cfg.replay_batches = 10000;
    pthread_mutex_init(&ev->mu, NULL);
    pthread_cond_init(&ev->cv, NULL);
    ev->topic = strdup(cfg->topic ? cfg->topic : "");
    ev->kept = cfg->replay_endpoint ? calloc(ev->cfg.replay_batches, sizeof *ev->kept) : NULL;
    ev->zctx = zmq_ctx_new();
    if (!ev->topic || (cfg->replay_endpoint && !ev->kept) || !ev->zctx) {
        free_all(ev);
        return CAIRN_ENOMEM;
    }
    ev->topic_len = strlen(ev->topic);
    ev->cfg.topic = ev->topic;
    int rc = bind_socket(ev->zctx, ZMQ_XPUB, cfg->endpoint, &ev->pub, err, err_len);
    if (!rc && cfg->replay_endpoint)
        rc = bind_socket(ev->zctx, ZMQ_ROUTER, cfg->replay_endpoint, &ev->replay, err, err_len);
    if (!rc && pthread_create(&ev->thread, NULL, publisher_main, ev) != 0)
        rc = CAIRN_ENOMEM;
    if (rc) {
        free_all(ev);
        return rc;
    }
    ev->thread_started = true;
    *out = ev;
    return CAIRN_OK;
}

void cairn_kv_events_close(cairn_kv_events *ev)
{
    if (!ev)
        return;
    pthread_mutex_lock(&ev->mu);
    ev->stopping = true;
    pthread_cond_signal(&ev->cv);
    pthread_mutex_unlock(&ev->mu);
    if (ev->thread_started)
        pthread_join(ev->thread, NULL); /* it sends what was queued, then returns */
    free_all(ev);
}
