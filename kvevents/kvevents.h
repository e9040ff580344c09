/*
 * kvevents/kvevents.h — a replica tells the routers in front of it which KV
 * pages it holds, in vLLM's KV-event wire format, so vllm-router's kv_aware
 * policy, llm-d's precise prefix scorer or Dynamo's KV router can send each
 * request where its prefix already is.
 *
 * What goes over the wire
 * -----------------------
 * A ZMQ PUB socket (XPUB, bound at `endpoint`) sends one three-frame message per
 * batch of events:
 *
 *     frame 0   topic            the configured topic bytes ("" by default)
 *     frame 1   sequence number  8 bytes, big-endian, 0, 1, 2, ... per publisher
 *     frame 2   payload          msgpack EventBatch
 *
 *     EventBatch  = [ts (float64 seconds), [event, ...], data_parallel_rank | nil]
 *     event       = a map tagged by "type" (vLLM 0.32's msgspec tag=True structs):
 *       {"type": "BlockStored", "block_hashes": [h, ...], "parent_block_hash": h | nil,
 *        "token_ids": [...], "block_size": n, "lora_id": nil, "medium": "GPU",
 *        "lora_name": nil, "group_idx": 0, "kv_cache_spec_kind": "full_attention"}
 *       {"type": "BlockRemoved", "block_hashes": [h, ...], "medium": "GPU", "group_idx": 0}
 *       {"type": "AllBlocksCleared"}
 *
 * A block hash h is a page's 16-byte canonical key (pagekey/pagekey.h), sent
 * as msgpack bin: the same name the page has in LMDB and in Redis. vLLM's
 * ExternalBlockHash is `bytes | int`; routers treat it as an opaque key for
 * chaining (parent_block_hash) and removal, and index the token ids.
 *
 * Media. A page is announced once per tier it is in, and removed per tier:
 *
 *     cairn tier                  medium      (vLLM's words)
 *     0  device pool              "GPU"       the working KV the kernels read
 *     1  host RAM                 "CPU"
 *     2  LMDB on local disk       "STORAGE"
 *
 * so a page written through to disk while still on the device is announced
 * twice ("GPU" and "STORAGE"), and one evicted from the device to host RAM
 * gives BlockStored("CPU") then BlockRemoved("GPU"). The Redis tier is not
 * announced: every replica reads it alike, so crediting it to one replica
 * would skew a router, not inform it.
 *
 * Replay. With `replay_endpoint`, a ZMQ ROUTER socket answers a request
 * [identity, "", start_seq (8 bytes big-endian)] with every kept batch whose
 * sequence number is >= start_seq, each as [identity, "", topic, seq, payload],
 * then [identity, "", "", -1 as 8 bytes, ""]: a router that restarted or
 * missed messages catches up from where it stopped. The last
 * `replay_batches` batches are kept.
 *
 * Late subscribers. The PUB side is an XPUB socket (the same wire for a
 * subscriber), so the publisher sees each subscription arrive. It keeps a
 * mirror of every page announced and not removed (hash, parent, tokens,
 * media), and when someone subscribes it sends AllBlocksCleared and then the
 * whole mirror, parents before children. A router that restarts therefore
 * knows everything at once — vllm-router 0.1.17 asks a replay socket only
 * after a gap in sequence numbers it has already seen, never from zero — and
 * the subscribers already there end where they were.
 *
 * Threads and the engine
 * ----------------------
 * The calls that report events (stored, removed, cleared) never block and
 * may be made from any thread — the engine thread reports the memory tiers,
 * the disk's I/O thread reports LMDB: they copy the event into a bounded
 * queue under a mutex held for the copy, and return. The publisher's own thread encodes, batches whatever is queued
 * (one EventBatch per wake-up), sends, keeps the replay buffer and answers
 * replay requests. When the queue is full the event is dropped and counted
 * (stats.dropped_events), and the publisher remembers that its subscribers'
 * view is now wrong: cairn_kv_events_take_overflow() returns true once, and
 * the owner answers with cairn_kv_events_cleared() followed by a full
 * re-announcement of what it holds.
 *
 * Ownership and errors: open returns a handle the caller frees with close;
 * every function returns CAIRN_OK or an error code (CAIRN_EINVAL bad
 * argument or endpoint, CAIRN_EIO a socket that cannot bind, CAIRN_ENOMEM,
 * CAIRN_EFULL an event dropped because the queue is full).
 */
#ifndef CAIRN_KVEVENTS_H
#define CAIRN_KVEVENTS_H

#include "common/common.h"
#include "pagekey/pagekey.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cairn_kv_events cairn_kv_events;

/* Where a page is, in vLLM's words (see the table above). */
typedef enum {
    CAIRN_KV_MEDIUM_GPU = 0,     /* tier 0: the device pool   */
    CAIRN_KV_MEDIUM_CPU = 1,     /* tier 1: host RAM          */
    CAIRN_KV_MEDIUM_STORAGE = 2, /* tier 2: LMDB on local disk */
    CAIRN_KV_MEDIUM_COUNT = 3
} cairn_kv_medium;

/* "GPU", "CPU", "STORAGE"; NULL for anything else. */
const char *cairn_kv_medium_name(cairn_kv_medium m);

typedef struct {
    const char *endpoint;        /* PUB socket to bind, "tcp://HOST:PORT" (required)   */
    const char *replay_endpoint; /* ROUTER socket to bind, or NULL for no replay       */
    const char *topic;           /* frame 0 of every message; NULL means ""            */
    int block_size;              /* tokens per page (block_size of every BlockStored)  */
    size_t queue_events;         /* bounded queue, in events; 0 means 65536            */
    size_t queue_bytes;          /* ... and in bytes of token ids; 0 means 64 MiB      */
    size_t replay_batches;       /* batches kept for replay; 0 means 10000             */
    int data_parallel_rank;      /* the batch's third element; < 0 sends nil           */
} cairn_kv_events_config;

/* Bind the sockets and start the publisher thread. On failure *out is NULL
 * and err (if given) says why, e.g. the endpoint that could not be bound. */
int cairn_kv_events_open(const cairn_kv_events_config *cfg, cairn_kv_events **out, char *err,
                         size_t err_len);

/* Send what is queued (waiting at most about a second for the publisher to
 * drain it), stop the thread, close the sockets, free. NULL is a no-op. */
void cairn_kv_events_close(cairn_kv_events *ev);

/* n pages entered medium m: hashes[0..n) are consecutive pages of one
 * sequence, tokens [n * block_size] their token ids, and parent the page
 * before hashes[0] (has_parent false for the first page of a sequence).
 * Any thread; never blocks. CAIRN_EFULL when dropped (counted). */
int cairn_kv_events_stored(cairn_kv_events *ev, cairn_kv_medium m, bool has_parent,
                           cairn_page_hash parent, const cairn_page_hash *hashes, size_t n,
                           const int32_t *tokens);

/* n pages left medium m (they may still be in another). Any thread. */
int cairn_kv_events_removed(cairn_kv_events *ev, cairn_kv_medium m, const cairn_page_hash *hashes,
                            size_t n);

/* Everything this replica announced is gone (a restart, a resync). */
int cairn_kv_events_cleared(cairn_kv_events *ev);

/* True once after events were dropped: the owner should send cleared() and
 * announce again everything it holds. */
bool cairn_kv_events_take_overflow(cairn_kv_events *ev);

typedef struct {
    uint64_t queued_events;    /* accepted by stored/removed/cleared             */
    uint64_t published_events; /* sent on the PUB socket                         */
    uint64_t published_batches;
    uint64_t dropped_events;   /* refused because the queue was full             */
    uint64_t replay_requests;  /* requests answered on the replay socket         */
    uint64_t replayed_batches; /* batches resent in those answers                */
    uint64_t next_seq;         /* the sequence number the next batch will carry  */
    uint64_t resyncs;          /* whole states sent to a new subscriber           */
} cairn_kv_events_stats;

/* A consistent-enough snapshot of the counters; any thread. */
void cairn_kv_events_get_stats(const cairn_kv_events *ev, cairn_kv_events_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* CAIRN_KVEVENTS_H */
