/*
 * store/store.h — KV page pools and tiers: where the bytes of cached pages
 * live, how they move between tiers, and how they persist on disk.
 *
 * The pieces, fastest first
 * -------------------------
 *   tier 0  cairn_page_pool   fixed-size KV pages carved once from a byte budget
 *                             through the backend (RAM for the CPU backend, device
 *                             memory for CUDA). Nothing allocates KV memory per
 *                             request: requests take page ids and give them back.
 *   tier 1  cairn_host_pool   the same, in host RAM (pinned later, for CUDA).
 *   tier 2  cairn_disk        an LMDB environment keyed by page hash, driven by
 *                             its own I/O thread.
 *   all     cairn_kvcache     the radix tree (radix/radix.h) plus the three tiers:
 *                             allocation with eviction, promotion, pinning.
 *
 * Page identity
 * -------------
 * A page's key is its chained hash (pagekey/pagekey.h): the tokens of the
 * page and of every page before it, under the root of the model's
 * fingerprint and KV layout (cairn_page_namespace_hash below) and a
 * tenant's namespace word. The same prefix under the same model has the
 * same key in every process, on every replica and after every restart; a
 * page computed under another model, dtype or tenant can never be found.
 *
 * Disk value format (little-endian), version CAIRN_DISK_FORMAT_VERSION:
 *
 *     offset  size            field
 *          0     4            magic "CKVP"
 *          4     2            format version
 *          6     2            header bytes (48)
 *          8    16            namespace hash (canonical bytes)
 *         24     4            page_size (tokens)
 *         28     4            reserved, 0
 *         32     8            payload bytes
 *         40     8            XXH3-64 of [header bytes 0..40) + tokens + payload
 *         48     4*page_size  the page's token ids
 *          …     payload      the page's KV bytes (kv_layout.page_bytes)
 *
 * A read checks the magic, version, namespace, length, the caller's expected
 * tokens and the checksum. Any mismatch is counted (stats.corrupt), the value
 * is deleted, and the read completes as a miss (CAIRN_ENOTFOUND): a damaged
 * page is recomputed, never used.
 *
 * Threads
 * -------
 * Pools, the kvcache and the radix tree belong to the engine thread and are
 * not thread-safe. cairn_disk's functions are also called from the engine
 * thread only; the work itself happens on the store's I/O thread, which
 * receives requests through a queue and hands results back through a
 * completion queue that the engine thread drains with cairn_disk_poll (or
 * cairn_kvcache_poll). An eventfd becomes readable, and an optional callback
 * is called from the I/O thread, whenever completions are waiting, so an
 * event loop (libuv) can be woken. Two exceptions, both documented where
 * they are declared: cairn_disk_record_read / _iterate run a read
 * transaction on the calling thread (any thread; blocking), and
 * cairn_kvcache_flush blocks the engine thread until its writes are on disk
 * (shutdown only). Nothing else in this header waits for the disk.
 *
 * Errors: CAIRN_EINVAL (bad argument), CAIRN_ENOMEM, CAIRN_EFULL (a pool is
 * exhausted and nothing can be evicted), CAIRN_EIO (LMDB or file failure),
 * CAIRN_ECORRUPT (a disk environment that cannot be trusted), CAIRN_ENOTFOUND
 * (a page is not stored, or failed verification), CAIRN_EBUSY (a locked
 * node), CAIRN_ECLOSED (the I/O thread has stopped), CAIRN_EUNSUPPORTED
 * (a disk-only call on a cache without a disk tier).
 */
#ifndef CAIRN_STORE_H
#define CAIRN_STORE_H

#include "common/common.h"
#include "kernels/backend.h"
#include "radix/radix.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- tier 0: the KV page pool ------------------------------------------- */

typedef struct cairn_page_pool cairn_page_pool;

/* Allocate floor(budget_bytes / L->page_bytes) pages from `be` (borrowed;
 * must outlive the pool) in one allocation. CAIRN_EINVAL when the budget
 * holds no page, CAIRN_ENOMEM when the backend cannot allocate it. */
int cairn_page_pool_create(cairn_backend *be, const cairn_kv_layout *L, size_t budget_bytes,
                           cairn_page_pool **out);
void cairn_page_pool_free(cairn_page_pool *p);

/* Backend memory of the pool: page i starts at base + i * page_bytes. */
void *cairn_page_pool_base(const cairn_page_pool *p);
const cairn_kv_layout *cairn_page_pool_layout(const cairn_page_pool *p);
int32_t cairn_page_pool_capacity(const cairn_page_pool *p);
int32_t cairn_page_pool_available(const cairn_page_pool *p);

/* Take `n` free pages (all or nothing): CAIRN_EFULL when fewer are free. */
int cairn_page_pool_alloc(cairn_page_pool *p, int32_t n, int32_t *pages);
/* Return pages taken with cairn_page_pool_alloc. */
void cairn_page_pool_release(cairn_page_pool *p, int32_t n, const int32_t *pages);

/* ---- page namespace ----------------------------------------------------- */

/* Bump when the meaning of a page's bytes changes (kernels' KV layout). */
#define CAIRN_KV_LAYOUT_VERSION 1

typedef struct {
    const void *model_fingerprint; /* e.g. hash of the tensor data (+ EAGLE head) */
    size_t fingerprint_bytes;
    const cairn_kv_layout *layout; /* dtype, geometry and page size                */
    uint32_t layout_version;       /* CAIRN_KV_LAYOUT_VERSION                      */
} cairn_page_namespace;

/* The root of every page chain under this model and layout: the layout's
 * fields given to cairn_page_root_hash (pagekey/pagekey.h). Tenants chain
 * from it with cairn_page_chain_seed. Deterministic across processes. */
int cairn_page_namespace_hash(const cairn_page_namespace *ns, cairn_page_hash *out);

/* ---- tier 1: host pool -------------------------------------------------- */

typedef struct cairn_host_pool cairn_host_pool;

/* floor(budget_bytes / page_bytes) slots of page_bytes each, in one
 * allocation (64-byte aligned). With a backend the memory is its transfer
 * memory (cairn_backend_host_alloc: page-locked on CUDA, so page copies run
 * on the copy engine without staging); when that cannot be had, plain
 * memory, with a warning. CAIRN_EINVAL when the budget holds no slot. */
int cairn_host_pool_create(cairn_backend *be, size_t page_bytes, size_t budget_bytes,
                           cairn_host_pool **out);
void cairn_host_pool_free(cairn_host_pool *p); /* NULL is a no-op */
/* Memory of slot `slot`; NULL when out of range. Valid until the pool is freed. */
void *cairn_host_pool_slot(const cairn_host_pool *p, int32_t slot);
int32_t cairn_host_pool_capacity(const cairn_host_pool *p);
int32_t cairn_host_pool_available(const cairn_host_pool *p);
/* All or nothing; CAIRN_EFULL when fewer than n are free. */
int cairn_host_pool_alloc(cairn_host_pool *p, int32_t n, int32_t *slots);
/* Releasing a slot that is not taken is ignored (and logged). */
void cairn_host_pool_release(cairn_host_pool *p, int32_t n, const int32_t *slots);

/* ---- tier 2: LMDB ------------------------------------------------------- */

#define CAIRN_DISK_FORMAT_VERSION 1
#define CAIRN_DISK_HEADER_BYTES 48

typedef struct cairn_disk cairn_disk;

/* Check one stored value (the "Disk value format" above) against what a
 * reader expects: total length, magic, version, header size, namespace,
 * page_size, payload length, the expected token ids and the checksum. True
 * only when all match. `tokens_le` is the page's expected token ids in their
 * stored form (4 * page_size bytes, little-endian). Safe on any bytes of any
 * length: nothing is read past value[bytes). The disk tier's reads use it;
 * it is public so the fuzzer (fuzz/) can drive it directly. */
bool cairn_disk_value_verify(const void *value, size_t bytes, cairn_page_hash ns, int page_size,
                             size_t page_bytes, const uint8_t *tokens_le);

typedef struct {
    const char *dir;          /* cache directory; created if missing            */
    size_t map_bytes;         /* LMDB map size: the most the store will use     */
    int page_size;            /* tokens per page                                */
    size_t page_bytes;        /* payload bytes per page                         */
    cairn_page_hash ns;       /* namespace hash written into every value        */
    int max_batch;            /* requests per LMDB transaction (0 = 256)        */
    bool durable;             /* fsync every commit (default off: a crash of the
                                 process loses nothing, a crash of the machine
                                 may lose the last commits, never consistency)  */
    bool reset_if_corrupt;    /* a data file that LMDB rejects, or that is shorter
                                 than its own metadata says, is deleted and
                                 recreated empty instead of failing open       */
    void (*notify)(void *user); /* optional; called on the I/O thread after
                                   completions are queued (e.g. uv_async_send)  */
    void *notify_user;
    const struct cairn_shared_config *shared; /* optional: tier 3 (below); read
                                   during open only                            */
} cairn_disk_config;

/* Open (creating) the environment and start the I/O thread. `err` (may be
 * NULL) receives a message on failure. CAIRN_ECORRUPT when the data file is
 * damaged and reset_if_corrupt is off; CAIRN_EIO for other failures. */
int cairn_disk_open(const cairn_disk_config *cfg, cairn_disk **out, char *err, size_t err_len);

/* Finish every queued request, stop the thread and close the environment.
 * Completions not yet polled are discarded. NULL is a no-op. */
void cairn_disk_close(cairn_disk *d);

typedef enum {
    CAIRN_DISK_WRITE = 1,
    CAIRN_DISK_READ = 2,
    CAIRN_DISK_FENCE = 3,
    CAIRN_DISK_SYNC = 4,          /* durable fence (cairn_disk_sync)           */
    CAIRN_DISK_RECORD_PUT = 5,    /* records: see "durable records" below      */
    CAIRN_DISK_RECORD_DELETE = 6,
    CAIRN_DISK_RECORD_GET = 7,
} cairn_disk_op;

typedef struct {
    uint64_t cookie;  /* the caller's, from the request                       */
    cairn_disk_op op;
    int status;       /* CAIRN_OK; a read: CAIRN_ENOTFOUND (absent or failed
                         verification); a write: CAIRN_EFULL (larger than the
                         whole map), CAIRN_EIO; a sync or record put/delete:
                         CAIRN_EIO when the commit or the fsync failed; a
                         record delete or get: CAIRN_ENOTFOUND when absent   */
    double seconds;   /* from queueing the request to its completion        */
    bool shared;      /* READ / RECORD_GET with CAIRN_OK: served by the shared
                         tier (Redis), not by LMDB                           */
    bool seen_elsewhere; /* READ that missed: another replica looked the page
                         up in the shared tier before (a prefix the cluster
                         has seen twice: worth sharing once computed)       */
    void *data;       /* RECORD_GET with CAIRN_OK: the value, malloc'd; the
                         poller owns it (free()). NULL otherwise.            */
    size_t bytes;     /* bytes of data                                      */
} cairn_disk_completion;

/* Where a page written to disk hangs: the page before it (the namespace's
 * chain seed for a sequence's first page, has_parent false), whose first
 * four bytes the value keeps so the chain can be rebuilt after a restart,
 * and whether the watcher may announce it (namespace 0 only). */
typedef struct {
    cairn_page_hash parent;
    bool has_parent;
    bool announce;
} cairn_disk_page_origin;

/* Queue a write of one page. `tokens` [page_size] and `payload` [page_bytes]
 * are copied before return (the caller may reuse them at once). Writes are
 * batched into LMDB transactions; the completion comes after the commit. A
 * write of a key that exists replaces it.
 *
 * Disk full: the store keeps its values under about three quarters of the
 * map (LMDB cannot even delete in a completely full map) and, before a
 * batch would exceed that, deletes its own least recently used pages — reads
 * and writes both count as use. Nobody's write fails for lack of room,
 * except a single page larger than the whole map (CAIRN_EFULL). */
int cairn_disk_write(cairn_disk *d, cairn_page_hash key, const cairn_disk_page_origin *origin,
                     const int32_t *tokens, const void *payload, uint64_t cookie);

/* Watching what LMDB holds (disk_watch.c). The watcher hears, on the I/O
 * thread, every committed write whose origin asked to be announced (stored)
 * and every page the store deleted (least recently used, or failing
 * verification): removed, whether it was announced or not (a reader ignores
 * a hash it never saw). NULL stops it. */
typedef struct {
    bool stored;                  /* false: removed                          */
    const cairn_page_hash *hashes; /* [n] consecutive pages of one sequence  */
    size_t n;
    bool has_parent;              /* stored: parent names the page before    */
    cairn_page_hash parent;
    const int32_t *tokens;        /* stored: [n * page_size]                 */
} cairn_disk_page_event;
typedef void (*cairn_disk_watch_fn)(const cairn_disk_page_event *e, void *user);
int cairn_disk_watch(cairn_disk *d, cairn_disk_watch_fn fn, void *user);

/* Tell the watcher, as stored runs, every page on disk that chains from
 * `seed` (namespace 0's h_-1), parents before children. The caller's thread,
 * a read transaction; values are not verified (the routers' view is a hint;
 * a read still verifies). */
int cairn_disk_announce_pages(cairn_disk *d, cairn_page_hash seed);

/* Queue a read into `dst` [page_bytes], host memory that the caller must keep
 * valid and untouched until the completion arrives. `tokens` [page_size] (the
 * expected token ids) is copied. Requests are served in the order they were
 * queued, so a read queued after a write of the same key sees it. */
int cairn_disk_read(cairn_disk *d, cairn_page_hash key, const int32_t *tokens, void *dst,
                    uint64_t cookie);

/* Queue a no-op whose completion means every earlier request has completed. */
int cairn_disk_fence(cairn_disk *d, uint64_t cookie);

/* A durable fence: its completion (CAIRN_OK) means every earlier request has
 * been committed and the data file has been fsync'd, whatever `durable`
 * says. CAIRN_EIO in the completion when the sync failed. */
int cairn_disk_sync(cairn_disk *d, uint64_t cookie);

/* ---- durable records ----------------------------------------------------
 * Arbitrary key bytes -> value bytes (session records: token history,
 * settings) in a database of their own ("records") in the same LMDB
 * environment. Records are not pages: they are never evicted, carry no
 * namespace (the caller puts what it needs in the key or value), and are
 * kept across restarts. Keys are 1 .. 511 bytes (LMDB's limit), values 0 ..
 * CAIRN_DISK_RECORD_MAX_BYTES. Requests share the FIFO with page requests,
 * so a put queued after page writes completes after them too.
 *
 * put / delete copy their arguments before return; their completion comes
 * after the commit AND an fsync (they are durable when reported, even on a
 * store opened without `durable`). A record that does not fit even after
 * the store evicted pages fails with CAIRN_EFULL. get's completion carries
 * the value in `data` (the poller frees it). */
#define CAIRN_DISK_RECORD_MAX_BYTES ((size_t)256 << 20)

int cairn_disk_record_put(cairn_disk *d, const void *key, size_t key_len, const void *value,
                          size_t value_bytes, uint64_t cookie);
int cairn_disk_record_delete(cairn_disk *d, const void *key, size_t key_len, uint64_t cookie);
int cairn_disk_record_get(cairn_disk *d, const void *key, size_t key_len, uint64_t cookie);

/* Blocking reads on the calling thread (a read transaction: they see every
 * commit completed so far, and never wait for the I/O thread). Meant for
 * start-up and tools, not for the engine's hot path.
 * record_read: *value (malloc'd, the caller frees) and *value_bytes;
 * CAIRN_ENOTFOUND when absent. record_iterate calls fn for every record in
 * key order (byte-wise); the pointers are valid during the call only; a
 * non-zero return from fn stops the walk and is returned. */
int cairn_disk_record_read(cairn_disk *d, const void *key, size_t key_len, void **value,
                           size_t *value_bytes);
typedef int (*cairn_disk_record_fn)(const void *key, size_t key_len, const void *value,
                                    size_t value_bytes, void *user);
int cairn_disk_record_iterate(cairn_disk *d, cairn_disk_record_fn fn, void *user);

/* Move up to `max` completions into out[]; *n receives how many (0 when none
 * are waiting). Never blocks. */
int cairn_disk_poll(cairn_disk *d, cairn_disk_completion *out, int max, int *n);

/* Block until at least one completion is waiting or timeout_ms passes
 * (-1 = no limit). CAIRN_OK either way; poll to see what arrived. */
int cairn_disk_wait(cairn_disk *d, int timeout_ms);

/* An eventfd that is readable while completions are waiting (poll resets
 * it). Owned by the store; valid until close. */
int cairn_disk_notify_fd(const cairn_disk *d);

typedef struct {
    uint64_t pages;        /* values in the store now (after the last commit)   */
    uint64_t writes, reads, hits, misses;
    uint64_t corrupt;      /* values that failed verification and were deleted  */
    uint64_t evicted;      /* values deleted to make room (map full)            */
    uint64_t write_failures;
    uint64_t commits;
    uint64_t bytes_written, bytes_read; /* payload bytes                        */
    bool reset_on_open;    /* the data file was unusable and was recreated      */
    uint64_t records;      /* records in the store now                          */
    uint64_t syncs;        /* fsyncs forced by durable requests                 */
    double read_seconds;   /* page reads / writes: sum of queue-to-completion  */
    double write_seconds;  /* times (divide by reads / writes for the mean)     */
    /* tier 3 (all zero without one) */
    bool shared_on;        /* a shared tier is configured                      */
    bool shared_up;        /* its writer's connection is up                    */
    uint64_t shared_hits, shared_misses; /* page reads that missed in LMDB     */
    uint64_t shared_corrupt;   /* values that failed verification (deleted)    */
    uint64_t shared_puts;      /* SETs Redis took (pages and records)          */
    uint64_t shared_dropped;   /* writes and events dropped (queue full, stop) */
    uint64_t shared_errors;    /* commands Redis refused (e.g. out of memory)  */
    uint64_t shared_events;    /* page events published                        */
    uint64_t shared_outages;   /* times a connection went down                 */
    uint64_t shared_queued_bytes; /* waiting for Redis now                     */
} cairn_disk_stats;

/* A snapshot of the counters, consistent with the completions polled so far
 * (they are updated before completions are queued). */
void cairn_disk_get_stats(cairn_disk *d, cairn_disk_stats *out);

/* ---- tier 3: a Redis shared by replicas ----------------------------------- *
 *
 * Under the disk tier, and driven by it: a page read or record get that
 * misses in LMDB asks Redis before it completes (on the I/O thread, one
 * pipeline per batch), and every committed record put is copied there.
 * Pages go to Redis only when the cache says so (cairn_disk_share_page:
 * the kvcache shares prefixes seen twice, pinned and persisted ones), and
 * the replica's page events (stored / removed) go to a stream that a
 * router (route/) reads to send each request where its prefix is cached.
 *
 *     P p:<namespace root hex>:<page hash hex>  a page, the disk value format
 *     P r:<record key hex>                      a durable record's value
 *     P events                                  stream: r, op, ns, ps[, h | http, rpc]
 *
 * Writes are queued to a writer thread of the tier's own (bounded: past
 * queue_bytes they are dropped and counted); nothing here waits for Redis
 * on the calling thread. A Redis that is absent, slow (past timeout_ms per
 * command), restarted or flushed costs cache hits, never a request: its
 * connection is dropped and retried after a back-off, with a log line per
 * outage (cairn_disk_stats.shared_*). */
typedef struct cairn_shared_config {
    const char *url;      /* redis://[:PASSWORD@]HOST[:PORT][/DB] | unix:///PATH[?db=N] */
    const char *prefix;   /* of every key; NULL = "cairn:"                    */
    const char *replica;  /* this replica's id in page events (at most
                             CAIRN_SHARED_REPLICA_MAX bytes); NULL = the one
                             cairn_disk_announce gives (no events before)  */
    int timeout_ms;       /* connect and per command; 0 = 250                 */
    size_t queue_bytes;   /* writes waiting for Redis at most; 0 = 64 MiB     */
    long page_ttl_s;      /* pages expire after this (records never do), so a
                             Redis run with maxmemory-policy volatile-lru evicts
                             pages and keeps session records; 0 = 7 days      */
} cairn_shared_config;

#define CAIRN_SHARED_REPLICA_MAX 200

/* Where a Redis is: the URLs --shared-cache takes, for serve and route
 * alike (store/redis.c). */
typedef struct {
    char host[256];     /* "" for a Unix socket                         */
    char path[256];     /* the socket; "" for TCP                       */
    char password[256]; /* "" = no AUTH                                 */
    int port, db;       /* port 6379 and db 0 unless the URL says       */
} cairn_redis_address;

/* redis://[[USER]:PASSWORD@]HOST[:PORT][/DB] or unix:///PATH[?db=N] into
 * *out; CAIRN_EINVAL with the reason in err otherwise. */
int cairn_redis_address_parse(const char *url, cairn_redis_address *out, char *err,
                              size_t err_len);
/* "HOST:PORT" or the socket path, for log lines. */
void cairn_redis_address_describe(const cairn_redis_address *a, char *out, size_t cap);
/* A hiredis connection (connect within connect_ms, every command within
 * command_ms), AUTH and SELECT done as the address says. NULL, and the
 * reason in err, on failure. The caller owns it (redisFree). */
struct redisContext *cairn_redis_connect(const cairn_redis_address *a, int connect_ms,
                                         int command_ms, char *err, size_t err_len);

/* Which pages the cache copies to tier 3 (store/shared.c says why). */
typedef enum {
    CAIRN_SHARE_REUSED = 0, /* prefixes seen twice, pinned ones, persisted sessions' */
    CAIRN_SHARE_ALL,        /* every page a sequence commits, too                   */
    CAIRN_SHARE_NONE,       /* none (reads and page events only)                    */
} cairn_share_policy;

typedef enum {
    CAIRN_SHARED_STORED = 0, /* these pages can now be served from a local tier */
    CAIRN_SHARED_REMOVED,    /* ... no longer                                   */
    CAIRN_SHARED_HELLO,      /* the replica is up (cairn_disk_announce)          */
    CAIRN_SHARED_BYE,        /* it stops (sent by close)                         */
} cairn_shared_event;

bool cairn_disk_has_shared(const cairn_disk *d);
/* Queue a page for Redis (tokens and payload copied). CAIRN_EUNSUPPORTED
 * without a shared tier, CAIRN_EFULL when the queue is full (dropped). */
int cairn_disk_share_page(cairn_disk *d, cairn_page_hash key, const int32_t *tokens,
                          const void *payload);
/* Queue the deletion of a record's Redis copy (a session its user closed;
 * the local copy goes with cairn_disk_record_delete). CAIRN_OK without a
 * shared tier. */
int cairn_disk_unshare_record(cairn_disk *d, const void *key, size_t key_len);
/* Queue a page event for the stream (nothing without a replica id). */
int cairn_disk_publish(cairn_disk *d, cairn_shared_event op, const cairn_page_hash *hashes,
                       size_t n);
/* Queue a "hello": this replica serves on these addresses ("HOST:PORT";
 * NULL or "" for a listener that is off). `replica` names it when the
 * configuration did not (NULL: keep the configured id; without any, no
 * events are published). Any thread. */
int cairn_disk_announce(cairn_disk *d, const char *replica, const char *http, const char *rpc);

/* ---- the tiered cache --------------------------------------------------- *
 *
 * One request, as the engine thread runs it (cairn_kvcache_fetch, below,
 * does the first three steps in one call, continues the match on disk and
 * applies the cost model; this is the same thing spelled out):
 *
 *   cairn_radix_match(tree, ns, tokens, n, &m);      longest cached prefix
 *   cairn_radix_lock(tree, m.node);                  nothing on it moves down now
 *   cairn_kvcache_promote(c, m.node, cookie);        ... later, from poll():
 *       event {cookie, CAIRN_OK, m.n_pages}           all of it is in tier 0
 *   cairn_kvcache_alloc(c, k, ids);                  pages for the new tokens
 *   ... forward pass writes KV into ids ...
 *   cairn_radix_insert(tree, ns, tokens, m.n_pages + k, ids_with_prefix, &cached, &leaf);
 *   cairn_radix_lock(tree, leaf); cairn_radix_unlock(tree, m.node);
 *   ... decode ...; cairn_radix_unlock(tree, leaf);  idle: evictable again
 *
 * A disk tier needs a host tier: disk reads land in host slots before they
 * are uploaded to the device.
 */

typedef struct cairn_kvcache cairn_kvcache;

typedef struct {
    cairn_backend *backend;      /* borrowed; must outlive the cache          */
    cairn_kv_layout layout;
    size_t device_bytes;         /* tier-0 budget (at least one page)         */
    size_t host_bytes;           /* tier-1 budget; 0 = no host tier           */
    const char *disk_dir;        /* NULL = no disk tier                       */
    size_t disk_map_bytes;       /* LMDB map size                             */
    bool disk_durable;
    cairn_page_hash ns;          /* cairn_page_namespace_hash(...)           */
    const cairn_shared_config *shared; /* tier 3 under the disk tier; NULL =
                                    none (needs disk_dir)                     */
    int share_policy;            /* which pages tier 3 gets: CAIRN_SHARE_*   */
    bool write_behind;           /* with a disk tier: write the pages of reused
                                    prefixes to LMDB in the background (below,
                                    "write-behind"); off: only eviction, pin,
                                    persist and flush write pages            */
    bool plain_lru;              /* evict in plain LRU order instead of by
                                    class (radix.h, "Eviction order"): for
                                    comparisons                              */
} cairn_kvcache_config;

/* Create the pools, the tree and (with disk_dir) the disk tier. `err` (may be
 * NULL) receives a message on failure. The caller owns *out. */
int cairn_kvcache_create(const cairn_kvcache_config *cfg, cairn_kvcache **out, char *err,
                         size_t err_len);

/* Free everything. The disk tier finishes its queued writes first. Pages
 * allocated with cairn_kvcache_alloc and not given to the tree are
 * reclaimed with the pool. NULL is a no-op. */
void cairn_kvcache_free(cairn_kvcache *c);

/* The parts, owned by the cache. Use the tree for match / insert / lock /
 * unlock; use cairn_kvcache_* for anything that moves or frees pages. The
 * host pool and disk are NULL when that tier is off. */
cairn_radix *cairn_kvcache_tree(cairn_kvcache *c);
cairn_page_pool *cairn_kvcache_device_pool(cairn_kvcache *c);
cairn_host_pool *cairn_kvcache_host_pool(cairn_kvcache *c);
cairn_disk *cairn_kvcache_disk(cairn_kvcache *c);

/* Take n tier-0 pages for new KV, evicting unlocked LRU nodes down a tier
 * as needed (all or nothing). CAIRN_EFULL when even that leaves too few.
 * Give pages that end up unused back with cairn_page_pool_release. */
int cairn_kvcache_alloc(cairn_kvcache *c, int32_t n, int32_t *pages);

/* Move at least n_pages pages out of `tier` (when that many can move):
 * DEVICE -> HOST, HOST -> DISK, and out of the tree from the slowest tier
 * there is (DISK, or the fastest one when the slower tiers are off; the
 * LMDB copies of pages dropped from the tree stay on disk). Nodes go in the
 * tree's eviction order (radix.h: one-off pages, then reused ones, then
 * live sessions', least recently used first within each), whole nodes at a
 * time; locked nodes never move. *moved (optional) receives how many pages
 * moved. Write-back: a page is written to disk when it leaves host RAM,
 * unless it is already there.
 *
 * What a page costs to get back decides whether it is worth a slower tier
 * at all: a leaf whose pages would take longer to load back from the tier
 * it would go to than to recompute (the rates in force, as a fetch weighs
 * them: cairn_kvcache_get_rates), by a margin of two, leaves the tree
 * instead — a fetch would recompute it anyway, and its slot in the slower
 * tier is kept for pages worth loading. */
int cairn_kvcache_evict(cairn_kvcache *c, int tier, size_t n_pages, size_t *moved);

/* ---- live sessions: their pages go last ---------------------------------- */

/* An open session's history marked live in the tree (radix.h, "Eviction
 * order"): its pages leave their tier after every other unlocked page
 * there, but they do leave when nothing else is left (a mark is not a pin).
 * What the marker keeps is this value, not a node: the node may leave the
 * tree meanwhile, and then its mark is gone with it. */
typedef struct {
    uint64_t node_id; /* the marked node's id; 0: nothing marked */
    size_t n_pages;   /* whole pages from the root to its end     */
    uint64_t tail_id; /* the kept partial last page it ends in, 0: none */
} cairn_kv_live;

/* Mark the longest cached prefix of tokens[0 .. n_tokens) (whole pages, in
 * namespace ns) live, and the kept tail (cairn_kvcache_keep_tail) that holds
 * its partial last page when all its whole pages are cached: tails give way
 * before tree pages, but a live one only when the tier holds nothing but
 * live pages. *l receives what to unmark it with ({0} when nothing was
 * cached). Counts as a use of those pages (their recency). Errors:
 * CAIRN_EINVAL, CAIRN_ENOMEM (nothing marked, *l zeroed). */
int cairn_kvcache_mark_live(cairn_kvcache *c, uint64_t ns, const int32_t *tokens, size_t n_tokens,
                            cairn_kv_live *l);
/* Undo a mark. tokens[0 .. n_tokens) must still begin with what was marked
 * (unmark before changing a history, mark again after); when they do not,
 * or the node left the tree, there is nothing to undo. *l is zeroed. */
void cairn_kvcache_unmark_live(cairn_kvcache *c, uint64_t ns, const int32_t *tokens,
                               size_t n_tokens, cairn_kv_live *l);

/* What an event answers (cairn_kvcache_event.kind). */
typedef enum {
    CAIRN_KVCACHE_EV_PROMOTE = 0,   /* cairn_kvcache_promote                 */
    CAIRN_KVCACHE_EV_FETCH = 1,     /* cairn_kvcache_fetch                   */
    CAIRN_KVCACHE_EV_PERSIST = 2,   /* cairn_kvcache_persist                 */
    CAIRN_KVCACHE_EV_RECORD_PUT = 3,
    CAIRN_KVCACHE_EV_RECORD_DELETE = 4,
    CAIRN_KVCACHE_EV_RECORD_GET = 5,
} cairn_kvcache_event_kind;

typedef struct {
    uint64_t cookie;
    int status;            /* PROMOTE: CAIRN_OK: every page of the path is on
                              the device; CAIRN_ENOTFOUND: a page was lost
                              (disk miss or corrupt); CAIRN_EFULL: no device
                              pages free. Other kinds: see their call.       */
    size_t resident_pages; /* PROMOTE, FETCH: leading pages of the path now on
                              the device                                     */
    /* -- fields below are zero for PROMOTE events -- */
    int kind;              /* cairn_kvcache_event_kind                       */
    cairn_radix_node *node; /* FETCH: the node the caller now holds one lock on;
                              its whole path (resident_pages pages) is on the
                              device. The root (no lock) when nothing is.   */
    size_t from_tier[CAIRN_TIER_COUNT]; /* FETCH: of resident_pages, how many
                              were in each tier when fetch was called (pages
                              found by hash in LMDB count as DISK)          */
    size_t skipped_pages;  /* FETCH: pages cached in a lower tier that the cost
                              model chose to recompute rather than load     */
    size_t lost_pages;     /* FETCH: pages that failed verification or were
                              gone from disk (they are dropped from the tree) */
    size_t shared_pages;   /* FETCH: of from_tier[CAIRN_TIER_DISK], pages the
                              shared tier (Redis) served                     */
    bool share_wanted;     /* FETCH: the pages after the answer were looked up
                              by another replica before: once computed, give
                              them to the shared tier (cairn_kvcache_share) */
    void *data;            /* RECORD_GET with CAIRN_OK: the value, malloc'd;
                              the poller owns it and free()s it             */
    size_t data_bytes;
} cairn_kvcache_event;

/* Bring every page on the path root..node to tier 0, asynchronously. `node`
 * must be locked by the caller (CAIRN_EINVAL otherwise) and stay locked until
 * the event with `cookie` comes out of cairn_kvcache_poll — even when the
 * pages are resident already, the answer comes as an event. On
 * CAIRN_ENOTFOUND, unlock and call cairn_kvcache_forget with the tokens and
 * resident_pages so the lost pages leave the tree, then recompute. */
int cairn_kvcache_promote(cairn_kvcache *c, cairn_radix_node *node, uint64_t cookie);

/* ---- admission: one call ---------------------------------------------- *
 *
 * cairn_kvcache_fetch is what the engine calls when it admits a request:
 *
 *   cairn_kvcache_fetch(c, ns, seq, n - 1, SIZE_MAX, cookie);  (the last
 *                                 token is always computed, for its logits)
 *   ... other requests keep running; later, from poll():
 *       event {FETCH, cookie, node, resident_pages, from_tier[], ...}
 *   use the device pages of cairn_radix_path(node) for tokens
 *   [0, resident_pages * page_size), compute the rest, insert, lock the new
 *   leaf, and unlock `node` (unlocking the root is a no-op).
 *
 * What fetch does:
 *   1. matches tokens[0 .. n_tokens) in the tree under namespace `ns` (a
 *      tenant; 0: shared, see radix.h), looking at no more than
 *      max_pages whole pages (SIZE_MAX: no limit);
 *   2. drops from the tree a matched page whose only copy was lost (a DISK
 *      page not on disk) and everything after it, unless someone holds it;
 *   3. considers, after the in-memory match, every further whole page of the
 *      request as a disk candidate (only with a disk tier): after a restart
 *      the tree is empty but LMDB still holds pages under their hashes;
 *   4. asks the cost model how many leading candidate pages are worth having
 *      on the device (see "cost model" below);
 *   5. locks the node that ends there (splitting one if needed), promotes
 *      its path to tier 0 (host pages uploaded; disk pages read into host
 *      slots, then uploaded), and, past the in-memory match, reads pages
 *      h_n, h_n+1, ... from LMDB in rounds until the first miss, inserting
 *      each round's hits into the tree on the device. Pages that fail
 *      verification are misses.
 * It returns at once: disk reads run on the I/O thread and the rest happens
 * in cairn_kvcache_poll when they complete. The answer always comes as an
 * event (even when everything was resident already; then the event is
 * queued before fetch returns). `tokens` is copied.
 *
 * The event's node is locked once for the caller, who must unlock it; its
 * whole path is on the device (resident_pages pages). status is CAIRN_OK,
 * or says why the answer is shorter than the choice: CAIRN_ENOTFOUND (a
 * page was lost), CAIRN_EFULL (no device or host room), CAIRN_ENOMEM —
 * the answer is usable in every case. Disk misses past the in-memory match
 * are not errors. Errors of the call itself: CAIRN_EINVAL, CAIRN_ENOMEM
 * (nothing locked, no event).
 *
 * Requests whose matches overlap may be fetched concurrently; pages one
 * fetch inserted while another's reads of the same pages were in flight are
 * shared, and the duplicate copies go back to the pool.
 */
int cairn_kvcache_fetch(cairn_kvcache *c, uint64_t ns, const int32_t *tokens, size_t n_tokens,
                        size_t max_pages, uint64_t cookie);

/* ---- the engine's sequences: the facade ---------------------------------- *
 *
 * What the engine thread (session/) needs, and all it uses: it never calls
 * the tree or the pools directly. A sequence being computed holds
 *
 *     pages[0 .. n_held)          the device pages of a cached prefix, read
 *                                 from a fetch event's hold (locked: they
 *                                 cannot move while the sequence runs)
 *     pages[n_held .. n_pages)    pages it took with cairn_kvcache_alloc
 *
 * and ends (finished, paused or failed) with one cairn_kvcache_commit, which
 * gives its whole computed pages to the tree (so the next request finds
 * them), returns every other page, and releases the hold.
 *
 * A hold is a node of the tree, opaque here: the prefix a fetch event locked
 * for its caller (the root when nothing was; releasing the root is a
 * no-op), or the leaf a commit inserted (not locked: use it at once, e.g.
 * for cairn_kvcache_persist). */
typedef cairn_radix_node cairn_kv_hold;

/* Base of the tier-0 pool (backend memory) and the layout of its pages: what
 * the forward pass writes KV into. */
void *cairn_kvcache_kv_base(const cairn_kvcache *c);
const cairn_kv_layout *cairn_kvcache_layout(const cairn_kvcache *c);
bool cairn_kvcache_has_disk(const cairn_kvcache *c);

/* The device page ids of the first n pages of a hold's path (n at most its
 * depth: a fetch event's resident_pages). CAIRN_EINVAL when the path is
 * shorter or not on the device. */
int cairn_kvcache_held_pages(cairn_kvcache *c, cairn_kv_hold *hold, size_t n, int32_t *pages);
/* Give back the lock of a hold (a fetch event's node). */
int cairn_kvcache_release(cairn_kvcache *c, cairn_kv_hold *hold);
/* Return pages taken with cairn_kvcache_alloc that never reached the tree. */
void cairn_kvcache_free_pages(cairn_kvcache *c, int32_t n, const int32_t *pages);

/* End a sequence: with `tokens` (NULL: cache nothing, e.g. prefix caching
 * off), insert its first n_full whole pages (tokens[0 .. n_full*page_size),
 * namespace ns) — the tree takes the caller's pages among them, and pages it
 * had already are returned as duplicates — then return every caller page
 * past them (a partial last page, scratch), and release `hold` (may be
 * NULL). pages[0 .. n_held) are the hold's and are never returned.
 * *leaf (may be NULL) receives the node that ends at page n_full (NULL when
 * nothing was inserted). CAIRN_ENOMEM when the insert failed: the pages were
 * returned all the same, the hold released. */
int cairn_kvcache_commit(cairn_kvcache *c, uint64_t ns, const int32_t *tokens, size_t n_full,
                         const int32_t *pages, size_t n_held, size_t n_pages,
                         cairn_kv_hold *hold, cairn_kv_hold **leaf);

/* ---- computing a prefix once ------------------------------------------ *
 *
 * A sequence that is still computing gives the tree its whole pages as it
 * goes, so a request arriving meanwhile matches them instead of computing
 * them again (the engine decides who waits for whom):
 *
 *     admitted    pages[0 .. n_held) = hold's           (locked)
 *     computing   ... after each step, extend(n_computed / page_size):
 *                 pages[0 .. n_held = n_full) are the tree's, the hold
 *                 moves to the node ending there      (still locked)
 *     ends        commit as above: only pages past n_held are the caller's
 *
 * A match may end inside a page: partial() looks at the pages that continue
 * the hold (its children in the tree, device or host tier, and the tails:
 * partial last pages of finished sequences, kept by keep_tail) for the one
 * sharing the most leading tokens with the request, and copies it into a
 * page of the caller's; its first *n_reused rows are then valid KV. */

/* Insert the sequence's first n_full whole pages (tokens[0 .. n_full *
 * page_size)) into the tree now, lock the node that ends there and release
 * *hold (NULL: none yet; the root counts as none), which becomes that node;
 * *n_held becomes n_full. Pages the tree already had (another sequence
 * computed them too) replace ours in pages[] when they are on the device,
 * and ours go back to the pool; when they are not, nothing changes and the
 * answer is CAIRN_EBUSY (keep computing privately; commit at the end sorts
 * it out). CAIRN_OK also when n_full <= *n_held (nothing to do);
 * CAIRN_EINVAL; CAIRN_ENOMEM (nothing inserted; pages the tree already had
 * were still swapped in, and then *hold and *n_held cover them). */
int cairn_kvcache_extend(cairn_kvcache *c, uint64_t ns, const int32_t *tokens, size_t n_full,
                         int32_t *pages, size_t *n_held, cairn_kv_hold **hold);

/* After a whole-page match ending at `hold` (NULL: the root) after n_held
 * pages (CAIRN_EINVAL when the hold's path is not that long), find the
 * cached page that shares the most leading tokens with next[0 .. n_next),
 * fewer than page_size of them (a whole page would have been part of the
 * match), and copy it into a page of the caller's: *page when it is >= 0,
 * else one taken now (cairn_kvcache_alloc, which never evicts the source)
 * only because something was found, and the caller's from then on.
 * *n_reused receives how many rows of it are now valid for those tokens
 * (0: nothing found, *page untouched). Pages in tier 2 only are not
 * considered. *from_tier (may be NULL) receives where the rows came from:
 * CAIRN_TIER_DEVICE (a page copy on the device) or CAIRN_TIER_HOST (a host
 * slot uploaded), whenever *n_reused > 0. Errors: CAIRN_EINVAL;
 * CAIRN_EFULL (no page to copy into); what the copy or upload returned (a
 * page taken here is given back). */
int cairn_kvcache_partial(cairn_kvcache *c, uint64_t ns, cairn_kv_hold *hold, size_t n_held,
                          const int32_t *next, size_t n_next, int32_t *page, size_t *n_reused,
                          int *from_tier);

/* Keep `page` (the caller's, holding the KV of the last n_tokens %
 * page_size tokens of tokens[0 .. n_tokens)) as a tail for partial(). Takes
 * the page in every case: when it cannot be kept (no partial page, no
 * memory) it goes back to the pool. A tail that the new one extends is
 * replaced; the least recently used tail makes room when all are taken.
 * Tails are the first pages to leave tier 0 when allocation runs short (to
 * a free host slot, else dropped) and the first host slots given up; they
 * never go to disk. */
int cairn_kvcache_keep_tail(cairn_kvcache *c, uint64_t ns, const int32_t *tokens, size_t n_tokens,
                            int32_t page);

/* Copy tier-0 page src to dst (the caller owns dst): a partial page taken
 * from a sequence still computing it. CAIRN_EINVAL for a bad id. */
int cairn_kvcache_copy_page(cairn_kvcache *c, int32_t src, int32_t dst);

/* The durable records (session records), for the start-up read: as
 * cairn_disk_record_iterate on the calling thread (blocking).
 * CAIRN_EUNSUPPORTED without a disk tier. */
int cairn_kvcache_record_iterate(cairn_kvcache *c, cairn_disk_record_fn fn, void *user);

/* ---- cost model ------------------------------------------------------- *
 *
 * A page costs nothing to use on the device, page_bytes / h2d to upload
 * from host RAM, page_bytes / disk + page_bytes / h2d from disk, and the
 * first disk page of a fetch adds one disk round trip (disk_latency_s; the
 * model counts one even when the continuation needs several rounds).
 * Recomputing a page costs page_size / compute_tokens_per_s. fetch takes
 * the prefix length that saves the most time, the shorter one on a tie: a
 * load is issued only when it is expected to be strictly faster than
 * recomputing, so a slow disk makes a hit no slower than a miss.
 *
 * Measurements, as the cache runs: every upload (bytes, seconds) feeds the
 * host->device rate (decayed sums, decay 0.9 per sample); every disk round
 * (reads + fence, timed by the I/O thread from queueing to completion)
 * feeds a decayed least-squares fit of seconds = latency + bytes / rate
 * (rounds of one size cannot tell latency from throughput; then the last
 * throughput estimate is kept and the latency follows the mean). The
 * engine reports its prefill rate with cairn_kvcache_set_compute_rate
 * (tokens per second of prompt processing, measured over its own batches).
 *
 * Priors, before any measurement: compute 2000 tokens/s, host->device 4e9
 * bytes/s, disk 2e8 bytes/s with 2 ms per round. The compute prior is
 * deliberately slow: until the engine has said how fast it is, a cache hit
 * is assumed worth loading, which is right for every model large enough
 * for caching to matter; the first report corrects it.
 */
typedef struct {
    double compute_tokens_per_s;  /* prefill rate (engine-reported)          */
    double h2d_bytes_per_s;       /* host RAM -> device upload               */
    double disk_bytes_per_s;      /* LMDB read throughput (payload bytes)    */
    double disk_latency_s;        /* fixed cost of one disk round trip       */
    uint64_t compute_samples, h2d_samples, disk_samples; /* measurements so far;
                                     ignored by override_rates              */
    bool overridden;              /* get_rates: estimates pinned by override */
} cairn_kvcache_rates;

/* The engine's measured prefill rate (tokens per second, > 0). */
int cairn_kvcache_set_compute_rate(cairn_kvcache *c, double tokens_per_s);
/* The estimates in force. */
int cairn_kvcache_get_rates(const cairn_kvcache *c, cairn_kvcache_rates *out);
/* Pin the four estimates (tests, benchmarks, an operator who knows better);
 * measurements go on being collected but do not change them. NULL returns
 * to measured values. CAIRN_EINVAL for a rate <= 0 or a latency < 0. */
int cairn_kvcache_override_rates(cairn_kvcache *c, const cairn_kvcache_rates *r);

/* Handle disk completions and return finished promotions, fetches, persists
 * and record operations, in completion order. Never blocks. */
int cairn_kvcache_poll(cairn_kvcache *c, cairn_kvcache_event *out, int max, int *n);

/* Block until there may be something to poll, or timeout_ms (-1 = forever). */
int cairn_kvcache_wait(cairn_kvcache *c, int timeout_ms);

/* Shutdown and restart, as the engine runs them:
 *
 *   SIGTERM:  cairn_kvcache_flush(c); cairn_kvcache_free(c); exit(0)
 *   start:    the tree is empty; cairn_kvcache_fetch finds old pages by hash
 *             in LMDB (same namespace only: another model fingerprint, KV
 *             dtype, layout or page size gives other keys, and a value
 *             whose header names another namespace is never returned);
 *             session records come back with cairn_disk_record_iterate.
 *   durable session call:  cairn_kvcache_persist(c, leaf, A) and
 *             cairn_kvcache_record_put(c, id, ..., B); reply after both
 *             events. (Requests complete in order, so B's event already
 *             implies A's writes are durable; A's status says whether every
 *             page could be written.)
 */

/* Pin: lock the path root..node and write its pages through to disk now, so
 * a pinned prefix survives a restart and is never evicted. Unpin unlocks. */
int cairn_kvcache_pin(cairn_kvcache *c, cairn_radix_node *node);
int cairn_kvcache_unpin(cairn_kvcache *c, cairn_radix_node *node);

/* Retention (a client's hint that a prefix will be asked for again): lock
 * the node of namespace ns that ends after the longest cached part of
 * tokens[0 .. n_pages * page_size) (splitting the node it ends in), so its
 * whole path stays in the tier each page is in now -- neither evicted nor
 * moved down -- until cairn_kvcache_release(*hold). Unlike pin, nothing is
 * written through: released, the pages age like any others. *n_held: the
 * pages the hold covers (fewer than n_pages when the rest is not cached).
 * CAIRN_ENOTFOUND (nothing held) when not even the first page is cached;
 * CAIRN_EINVAL. */
int cairn_kvcache_hold_prefix(cairn_kvcache *c, uint64_t ns, const int32_t *tokens,
                              size_t n_pages, cairn_kv_hold **hold, size_t *n_held);

/* ---- tier 3 -------------------------------------------------------------- */

/* With a shared tier: tell the router this replica is up, serving on these
 * addresses (cairn_disk_announce). CAIRN_OK and nothing without one. Unlike
 * the rest of the kvcache, any thread may call it (it only queues). */
int cairn_kvcache_announce(cairn_kvcache *c, const char *replica, const char *http,
                           const char *rpc);
bool cairn_kvcache_has_shared(const cairn_kvcache *c);
/* Give the pages of a hold's path (a sequence's prefix in the tree) to the
 * shared tier, those not there yet: for a fetch event with share_wanted,
 * as the sequence computes them. Nothing without a shared tier or under
 * CAIRN_SHARE_NONE. */
int cairn_kvcache_share(cairn_kvcache *c, cairn_kv_hold *hold);

/* ---- durability --------------------------------------------------------- */

/* Write-back on shutdown (SIGTERM): write every tree page that is in tier 0
 * or 1 and not on disk yet, then wait — blocking the calling thread — until
 * all of it is committed and fsync'd. Completions of other requests that
 * arrive meanwhile are handled; their events wait for the next poll.
 * CAIRN_OK, or CAIRN_EIO when a write or the sync failed. Without a disk
 * tier: CAIRN_OK at once. */
int cairn_kvcache_flush(cairn_kvcache *c);

/* Write-behind (config.write_behind, store/behind.c). Without it a page
 * reaches LMDB only when it leaves host RAM, when it is pinned or persisted,
 * or at flush (SIGTERM): a SIGKILL (an OOM kill, a container runtime's kill
 * after its grace period) loses every prefix computed since the start. With
 * it, a prefix that was reused -- the rule the shared tier uses: a fetch
 * that found cached pages in memory -- is queued (its namespace and tokens,
 * not node handles, so eviction and splits meanwhile cost nothing) and its
 * pages not on disk yet are written by poll in the background: the engine
 * thread copies a few pages per poll into requests, the disk's I/O thread
 * commits them (one LMDB transaction a batch: a page is in LMDB whole, with
 * its tokens and checksum, or not at all). Bounds, and why:
 *   - bytes copied per poll (1 MiB, at least one page): the copy is the
 *     only part on the engine thread, and it delays the next forward step;
 *   - write-behind bytes queued in the disk FIFO and not yet committed
 *     (4 MiB): the FIFO is shared with the reads of promotions and fetches,
 *     which wait behind every write queued before them;
 *   - prefixes waiting (64): memory; a prefix that does not fit is dropped
 *     (counted) and written back on eviction or flush as before.
 * Pinned prefixes and persisted sessions' pages are written through at once
 * instead (pin, persist below). Pages written behind are not fsync'd: they
 * survive a process kill (committed to the file), not a power loss. */

/* True while write-behind has work queued or in flight: poll again soon
 * (an idle engine waits with cairn_kvcache_wait instead of sleeping). */
bool cairn_kvcache_busy(const cairn_kvcache *c);

/* Make the pages of the path root..node durable: queue a write of every
 * resident page not yet on disk (write-through; the bytes are copied before
 * return, so the node may change tier afterwards), then a durable fence.
 * The event (kind PERSIST, cookie) comes once all of them are committed and
 * fsync'd: CAIRN_OK; CAIRN_ENOTFOUND when a page of the path exists nowhere
 * (lost: recompute and persist again); CAIRN_EIO when a write or the sync
 * failed (conservative: a failure of any write completed in between counts).
 * Pages stay subject to the disk tier's own LRU when the map fills up.
 * CAIRN_EUNSUPPORTED without a disk tier. */
int cairn_kvcache_persist(cairn_kvcache *c, cairn_radix_node *node, uint64_t cookie);

/* Durable records (session records) in the disk tier's "records" database
 * (see cairn_disk_record_put for keys, sizes and semantics). The event
 * (kind RECORD_PUT / RECORD_DELETE / RECORD_GET) comes after the commit and,
 * for put and delete, an fsync. Requests are served in call order together
 * with page writes: a put called after persist completes after it. For a
 * blocking read at start-up use cairn_disk_record_read / _iterate on
 * cairn_kvcache_disk(c). CAIRN_EUNSUPPORTED without a disk tier. */
int cairn_kvcache_record_put(cairn_kvcache *c, const void *key, size_t key_len, const void *value,
                             size_t value_bytes, uint64_t cookie);
int cairn_kvcache_record_delete(cairn_kvcache *c, const void *key, size_t key_len, uint64_t cookie);
int cairn_kvcache_record_get(cairn_kvcache *c, const void *key, size_t key_len, uint64_t cookie);

/* Drop from the tree every cached page after the first keep_pages pages of
 * tokens[0 .. n_tokens) (in namespace ns), releasing their tier-0/1 memory (the disk copies
 * stay). CAIRN_EBUSY when some of those pages are locked. */
int cairn_kvcache_forget(cairn_kvcache *c, uint64_t ns, const int32_t *tokens, size_t n_tokens,
                         size_t keep_pages);

/* ---- explaining a miss --------------------------------------------------- *
 *
 * Why a prompt was not (all) found: the closest cached sequence of the
 * namespace (cairn_radix_common_prefix: token-exact, non-mutating), whether
 * the page right after the match left the tree recently, and whether another
 * namespace holds more of it. Nothing is changed (no recency bump, no split,
 * no disk read), so asking never alters what is evicted next.
 *
 * "Left recently": eviction remembers the chained hash of every page it
 * drops from the tree for good (not one whose copy stays in LMDB) with the
 * tier it was dropped from, in a direct-mapped table of CAIRN_KV_GONE_SLOTS
 * entries: O(1) per page, fixed memory, and a later drop that maps to the
 * same slot overwrites an older one. So "evicted" is reported for the last
 * few thousand pages to go, and older losses read as plain misses. Pages the
 * disk tier's own LRU deletes from LMDB are not seen here.
 */
#define CAIRN_KV_GONE_SLOTS 4096
#define CAIRN_KV_EXCERPT 8 /* tokens of the cached side kept at a departure */

typedef struct {
    size_t common_tokens;   /* tokens equal to the closest cached sequence     */
    size_t whole_pages;     /* of them, whole pages                            */
    size_t sequence_tokens; /* where that sequence's node ends (tokens)        */
    bool contained;         /* the prompt holds a whole cached sequence         */
    int tier;               /* tier of the last common token's node; -1 none    */
    bool ns_cached;         /* the namespace holds anything in the tree         */
    int evicted_tier;       /* the page after the whole-page match was dropped
                               from this tier recently; -1 when not            */
    size_t pages_elsewhere; /* most whole pages another namespace holds         */
    int32_t cached_next[CAIRN_KV_EXCERPT]; /* the cached side after the departure */
    size_t n_cached_next;
} cairn_kv_explain;

/* Fill *out for tokens[0 .. n_tokens) in namespace `ns`. O(n_tokens) plus one
 * page hash. Errors: CAIRN_EINVAL. */
int cairn_kvcache_explain(const cairn_kvcache *c, uint64_t ns, const int32_t *tokens,
                          size_t n_tokens, cairn_kv_explain *out);

/* Copy a resident page (tier 0 or 1) into host memory dst [page_bytes].
 * CAIRN_ENOTFOUND when the page is only on disk. For tests and tools. */
int cairn_kvcache_read_page(cairn_kvcache *c, const cairn_radix_page *page, void *dst);

/* Per tier. Hits and misses are counted by fetch, in tokens, as a lookup
 * goes down the tiers: tier 0 looks at every token of the request (up to
 * max_pages), each slower tier at the misses of the tier above; a hit is a
 * token whose page the tier served (from_tier), so the disk tier's misses
 * are the tokens the engine computes. Loads move pages up out of a tier
 * (host: an upload to the device; disk: one round of reads + fence) and
 * stores move pages into it (host: a download at eviction; disk: one page
 * write, from queueing to commit); their latencies are per operation. The
 * device tier has no loads or stores. */
typedef struct {
    uint64_t pages;          /* pages in the tier now: tree pages (device,
                                host); every value in LMDB (disk)          */
    uint64_t bytes;          /* pages * page_bytes                          */
    uint64_t capacity_pages, free_pages; /* the pool (0 for disk)          */
    uint64_t draining_pages; /* given back while a copy to or from them still
                                runs (device, host): free once it ends, so
                                pages + free + draining == capacity        */
    uint64_t hit_tokens, miss_tokens;
    uint64_t evicted_pages;  /* moved out by eviction (disk: deleted by the
                                store's own LRU when the map fills)        */
    uint64_t promoted_pages; /* moved up out of this tier toward the device */
    uint64_t load_ops, store_ops;
    double load_seconds, store_seconds; /* totals                           */
    double load_mean_s, store_mean_s;   /* totals / ops (0 when no ops)      */
} cairn_kvcache_tier_stats;

typedef struct {
    size_t promotions, promoted_pages, lost_pages;
    size_t evicted_pages[CAIRN_TIER_COUNT]; /* pages moved out of each tier */
    size_t written_pages;                   /* disk writes queued            */
    size_t write_failures;                  /* disk writes that failed       */
    cairn_kvcache_tier_stats tier[CAIRN_TIER_COUNT];
    size_t fetches;                         /* fetches completed             */
    size_t fetch_skipped_pages;             /* pages the cost model skipped  */
    size_t dropped_cheap_pages;             /* evicted out of the tree, not
                                               down a tier: cheaper to
                                               recompute than to load back  */
    size_t persists;                        /* persist calls queued          */
    uint64_t disk_records;                  /* durable records stored        */
    uint64_t tree_pages[CAIRN_TIER_COUNT];  /* pages of the tree per tier    */
    uint64_t tail_pages, tail_host_pages;   /* tails kept now: tier 0, host  */
    uint64_t shared_hit_tokens;             /* of the disk tier's hits, tokens
                                               the shared tier served        */
    uint64_t shared_pages_queued;           /* pages queued for the shared tier */
    uint64_t behind_queued_pages;           /* write-behind: page writes queued */
    uint64_t behind_pages;                  /* ... committed to LMDB          */
    uint64_t behind_dropped;                /* reused prefixes not queued (full) */
    uint64_t behind_waiting;                /* prefixes waiting now            */
    double behind_seconds;                  /* engine-thread time spent on it  */
} cairn_kvcache_stats;

/* Counters as of now (the owner thread, as every kvcache call). */
void cairn_kvcache_get_stats(const cairn_kvcache *c, cairn_kvcache_stats *out);

/* ---- watching pages ---------------------------------------------------------
 *
 * A watcher hears whole pages enter and leave each tier, for publishing
 * what a replica holds (kvevents/). A page is in a memory tier when its node
 * is (device or host RAM) and on disk when LMDB holds its value, so one page
 * can be in two places at once (a device page written through). Runs are
 * consecutive pages of one sequence; STORED runs name the page before them.
 *
 *     kind      when                                           thread
 *     STORED    a node enters the device or host RAM (insert,  engine
 *               eviction, promotion); LMDB commits a write
 *     REMOVED   a node leaves a memory tier or the tree;       engine /
 *               LMDB deletes a value                           I/O (disk)
 *     CLEARED   cairn_kvcache_announce_all starts over         engine
 *
 * Only namespace 0 is announced (announce.c says why). Partial last pages
 * (tails) are never announced: routers count whole blocks. Tier-2 events
 * come from the disk's I/O thread, so the watcher must be thread-safe. */
enum { CAIRN_KV_PAGES_STORED = 0, CAIRN_KV_PAGES_REMOVED = 1, CAIRN_KV_PAGES_CLEARED = 2 };

typedef struct {
    int kind;                      /* CAIRN_KV_PAGES_*                          */
    int tier;                      /* CAIRN_TIER_DEVICE / _HOST / _DISK; -1 cleared */
    uint64_t ns;                   /* the namespace (0; tier-2 removals: 0)     */
    const cairn_page_hash *hashes; /* [n]                                      */
    size_t n;
    bool has_parent;               /* STORED: parent is the page before hashes[0] */
    cairn_page_hash parent;
    const int32_t *tokens;         /* STORED: [n * page_size]                  */
} cairn_kv_page_event;
typedef void (*cairn_kvcache_watch_fn)(const cairn_kv_page_event *e, void *user);

/* Set (or with NULL clear) the watcher. Pages already held are not told:
 * call cairn_kvcache_announce_all for that. */
int cairn_kvcache_watch(cairn_kvcache *c, cairn_kvcache_watch_fn fn, void *user);

/* CLEARED, then every page held: the memory tiers' nodes parents first,
 * then what LMDB holds (cairn_disk_announce_pages). At start-up, and after
 * the watcher lost events. Engine thread; reads LMDB's keys and page
 * headers, not the pages' KV. */
int cairn_kvcache_announce_all(cairn_kvcache *c);

#ifdef __cplusplus
}
#endif
#endif /* CAIRN_STORE_H */
