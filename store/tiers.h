/*
 * store/tiers.h — store/'s internal header: the tiers under the cache
 * facade (store/store.h), for store/'s own files and for tests and benchmarks that
 * drive a tier directly. Nothing else includes it: the build defines
 * CAIRN_STORE_INTERNAL only for store/'s library, tests/ and the disk
 * fuzzer, and this header refuses to compile without it.
 *
 * The pieces, fastest first
 * -------------------------
 *   tier 0  cairn_page_pool   fixed-size KV pages carved once from a byte budget
 *                             through the backend (RAM for the CPU backend, device
 *                             memory for CUDA). Nothing allocates KV memory per
 *                             request: requests take page ids and give them back.
 *   tier 1  cairn_host_pool   the same, in host RAM (transfer memory: page-locked
 *                             on CUDA).
 *   tier 2  cairn_disk        an LMDB environment keyed by page hash, driven by
 *                             its own I/O thread; durable records beside it.
 *   tier 3  (in cairn_disk)   a Redis shared by replicas, under the disk tier.
 *   all     cairn_kvcache     the radix tree (radix/radix.h) plus the tiers
 *                             (store_impl.h); its accessors are below.
 *
 * Disk value format (little-endian), version CAIRN_DISK_FORMAT_VERSION:
 *
 *     offset  size            field
 *          0     4            magic "CKVP"
 *          4     2            format version
 *          6     2            header bytes (48)
 *          8    16            namespace hash (canonical bytes)
 *         24     4            page_size (tokens)
 *         28     4            parent4: the first four bytes of the page
 *                              before it (0: unknown; disk_watch.c)
 *         32     8            payload bytes
 *         40     8            XXH3-64 of [header bytes 0..40) + tokens + payload
 *         48     4*page_size  the page's token ids
 *          …     payload      the page's KV bytes (kv_layout.page_bytes)
 *
 * A read checks the magic, version, namespace, length, the caller's expected
 * tokens and the checksum. Any mismatch is counted (stats.corrupt), the value
 * is deleted, and the read completes as a miss (CAIRN_ENOTFOUND): a damaged
 * page is recomputed, never used.
 * * Threads
 * -------
 * Pools belong to the engine thread and are not thread-safe. cairn_disk's
 * functions are also called from the engine thread only; the work itself
 * happens on the store's I/O thread, which receives requests through a
 * queue and hands results back through a completion queue that the engine
 * thread drains with cairn_disk_poll (or cairn_kvcache_poll). An eventfd
 * becomes readable, and an optional callback is called from the I/O thread,
 * whenever completions are waiting, so an event loop (libuv) can be woken.
 * Two exceptions, both documented where they are declared:
 * cairn_disk_record_read / _iterate run a read transaction on the calling
 * thread (any thread; blocking), and cairn_disk_announce may be called from
 * any thread.
 */
#ifndef CAIRN_STORE_TIERS_H
#define CAIRN_STORE_TIERS_H

#ifndef CAIRN_STORE_INTERNAL
#error "store/tiers.h is store/'s internal header; outside store/ use store/store.h"
#endif

#include "store/store.h"

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
    CAIRN_DISK_READ_CHILD = 8,    /* cairn_disk_read_child                     */
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
    bool busy_elsewhere; /* READ that missed: ... and that replica gives Redis
                         the pages it computes, and looked it up less than
                         CAIRN_SHARED_BUSY_S ago: it is probably computing
                         the page now                                       */
    void *data;       /* RECORD_GET with CAIRN_OK: the value; READ_CHILD with
                         CAIRN_OK: the page's tokens (int32_t [page_size]);
                         malloc'd, the poller owns it (free()). NULL
                         otherwise.                                         */
    size_t bytes;     /* bytes of data                                      */
    int matched;      /* READ_CHILD with CAIRN_OK: leading tokens of next[] the
                         page found shares (1 .. n_next)                    */
} cairn_disk_completion;

/* Where a page written to disk hangs: the page before it (the namespace's
 * chain seed for a sequence's first page, has_parent false), whose first
 * four bytes the value keeps so the chain can be rebuilt after a restart,
 * and whether the watcher may announce it (namespace 0 only). NULL: none of
 * that (the reserved word stays 0, nothing is announced). */
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
    bool stored;                   /* false: removed                          */
    const cairn_page_hash *hashes; /* [n] consecutive pages of one sequence  */
    size_t n;
    bool has_parent;               /* stored: parent names the page before    */
    cairn_page_hash parent;
    const int32_t *tokens;         /* stored: [n * page_size]                 */
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

/* The page that continues `parent` best. A prefix shared with a cached
 * sequence usually ends inside a page (a document followed by another
 * question, a conversation resent with one more message); the page that
 * holds its last tokens is keyed by tokens the request does not have, so no
 * read by hash finds it. Every page written with an origin is therefore also
 * listed under the page before it (a sequence's first page is not: the
 * namespace's seed would list every prompt; LMDB's "children" database, keyed by the
 * parent's word that the value keeps; Redis's P c:<ns>:<parent> hash, see
 * tier 3), and this read looks through that list:
 *
 *     parent ──▶ child A  [t0 t1 t2 t3 ... t15]     lcp with next[] = 3
 *            └─▶ child B  [t0 t1 u2 u3 ... u15]     lcp with next[] = 2
 *
 * Among the pages listed under `parent` (LMDB first, then the shared tier),
 * the one whose tokens share the most leading tokens with next[0 .. n_next)
 * (1 <= n_next < page_size; a page sharing all page_size tokens would be the
 * read by hash) is read into `dst` [page_bytes] (the caller's, valid and
 * untouched until the completion). The completion's `matched` says how many
 * leading tokens it shares, and its `data` holds the page's page_size token
 * ids (int32_t, malloc'd; the poller frees it). CAIRN_ENOTFOUND when none
 * shares even one. Each candidate is checked by
 * hashing (parent, its tokens) to its key, the one read is verified like
 * any read; entries whose page is gone are dropped from the list. Pages
 * written before the list existed are not in it (they are found by hash
 * as before). */
int cairn_disk_read_child(cairn_disk *d, cairn_page_hash parent, const int32_t *next,
                          size_t n_next, void *dst, uint64_t cookie);

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
/* The same callback as cairn_kvcache_record_iterate's. */
typedef cairn_kv_record_fn cairn_disk_record_fn;
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
 *     P c:<namespace root hex>:<page hash hex>  the pages after it: child key ->
 *                                               its tokens (read_child)
 *     P r:<record key hex>                      a durable record's value
 *     P events                                  stream: r, op, ns, ps[, h | http, rpc]
 *
 * Writes are queued to a writer thread of the tier's own (bounded: past
 * queue_bytes they are dropped and counted); nothing here waits for Redis
 * on the calling thread. A Redis that is absent, slow (past timeout_ms per
 * command), restarted or flushed costs cache hits, never a request: its
 * connection is dropped and retried after a back-off, with a log line per
 * outage (cairn_disk_stats.shared_*).
 *
 * Its configuration (cairn_shared_config), share policy and address
 * parsing are in store/store.h: the cache's configuration and the router
 * take them. */

typedef enum {
    CAIRN_SHARED_STORED = 0, /* these pages can now be served from a local tier */
    CAIRN_SHARED_REMOVED,    /* ... no longer                                   */
    CAIRN_SHARED_HELLO,      /* the replica is up (cairn_disk_announce)          */
    CAIRN_SHARED_BYE,        /* it stops (sent by close)                         */
} cairn_shared_event;

bool cairn_disk_has_shared(const cairn_disk *d);
/* Queue a page for Redis (tokens and payload copied); with an origin, it
 * is also listed under its parent for cairn_disk_read_child (P c:<ns>:
 * <parent hex>, a hash of child key -> its tokens, with the page's TTL).
 * CAIRN_EUNSUPPORTED without a shared tier, CAIRN_EFULL when the queue is
 * full (dropped). */
int cairn_disk_share_page(cairn_disk *d, cairn_page_hash key, const cairn_disk_page_origin *origin,
                          const int32_t *tokens, const void *payload);
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
/* ---- the cache's parts ---------------------------------------------------- *
 *
 * One request, as the engine thread's fetch runs it with the parts
 * (cairn_kvcache_fetch does the first three steps in one call, continues
 * the match on disk and applies the cost model; this is the same thing
 * spelled out, as the store's own files and the tests use it):
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
 * */

/* The parts, owned by the cache. Inside store/ and in tests, use the tree
 * for match / insert / lock / unlock; use cairn_kvcache_* for anything that
 * moves or frees pages. The host pool and disk are NULL when that tier is
 * off. */
cairn_radix *cairn_kvcache_tree(cairn_kvcache *c);
cairn_page_pool *cairn_kvcache_device_pool(cairn_kvcache *c);
cairn_host_pool *cairn_kvcache_host_pool(cairn_kvcache *c);
cairn_disk *cairn_kvcache_disk(cairn_kvcache *c);

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
/* Bring every page on the path root..node to tier 0, asynchronously. `node`
 * must be locked by the caller (CAIRN_EINVAL otherwise) and stay locked until
 * the event with `cookie` comes out of cairn_kvcache_poll — even when the
 * pages are resident already, the answer comes as an event. On
 * CAIRN_ENOTFOUND, unlock and call cairn_kvcache_forget with the tokens and
 * resident_pages so the lost pages leave the tree, then recompute. */
int cairn_kvcache_promote(cairn_kvcache *c, cairn_radix_node *node, uint64_t cookie);

/* Copy a resident page (tier 0 or 1) into host memory dst [page_bytes].
 * CAIRN_ENOTFOUND when the page is only on disk. For tests and tools. */
int cairn_kvcache_read_page(cairn_kvcache *c, const cairn_radix_page *page, void *dst);


/* ---- cost model, as measured (store/cost.c) ------------------------------- *
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

/* ---- write-behind (config.write_behind, store/behind.c) ------------------ *
 *
 * Without it a page reaches LMDB only when it leaves host RAM, when it is pinned or persisted,
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
 * instead (cairn_kvcache_pin, _persist). Pages written behind are not fsync'd: they
 * survive a process kill (committed to the file), not a power loss. */

#ifdef __cplusplus
}
#endif
#endif /* CAIRN_STORE_TIERS_H */
