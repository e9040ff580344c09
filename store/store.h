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
 * A page's key is its chained hash (radix.h): h_i = XXH3-128(h_{i-1} ||
 * tokens of page i), where h_{-1} = cairn_page_namespace_hash() of the model
 * fingerprint, the KV dtype, the layout version, the page geometry and an
 * optional tenant salt. The same prefix under the same model therefore has
 * the same key in every process and after every restart, and a page computed
 * under another model, dtype or tenant can never be found.
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
 * event loop (libuv) can be woken.
 *
 * Errors: CAIRN_EINVAL (bad argument), CAIRN_ENOMEM, CAIRN_EFULL (a pool is
 * exhausted and nothing can be evicted), CAIRN_EIO (LMDB or file failure),
 * CAIRN_ECORRUPT (a disk environment that cannot be trusted), CAIRN_ENOTFOUND
 * (a page is not stored, or failed verification), CAIRN_EBUSY (a locked
 * node), CAIRN_ECLOSED (the I/O thread has stopped).
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
    const void *tenant_salt;       /* optional; NULL = shared by everyone          */
    size_t salt_bytes;
} cairn_page_namespace;

/* h_{-1} of every page chain under this namespace: XXH3-128 of a fixed
 * serialisation of the fields. Deterministic across processes. */
int cairn_page_namespace_hash(const cairn_page_namespace *ns, cairn_page_hash *out);

/* ---- tier 1: host pool -------------------------------------------------- */

typedef struct cairn_host_pool cairn_host_pool;

/* floor(budget_bytes / page_bytes) slots of page_bytes each, in one
 * allocation (64-byte aligned). CAIRN_EINVAL when the budget holds no slot. */
int cairn_host_pool_create(size_t page_bytes, size_t budget_bytes, cairn_host_pool **out);
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
} cairn_disk_config;

/* Open (creating) the environment and start the I/O thread. `err` (may be
 * NULL) receives a message on failure. CAIRN_ECORRUPT when the data file is
 * damaged and reset_if_corrupt is off; CAIRN_EIO for other failures. */
int cairn_disk_open(const cairn_disk_config *cfg, cairn_disk **out, char *err, size_t err_len);

/* Finish every queued request, stop the thread and close the environment.
 * Completions not yet polled are discarded. NULL is a no-op. */
void cairn_disk_close(cairn_disk *d);

typedef enum { CAIRN_DISK_WRITE = 1, CAIRN_DISK_READ = 2, CAIRN_DISK_FENCE = 3 } cairn_disk_op;

typedef struct {
    uint64_t cookie;  /* the caller's, from the request                       */
    cairn_disk_op op;
    int status;       /* CAIRN_OK; a read: CAIRN_ENOTFOUND (absent or failed
                         verification); a write: CAIRN_EFULL (larger than the
                         whole map), CAIRN_EIO                                */
} cairn_disk_completion;

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
int cairn_disk_write(cairn_disk *d, cairn_page_hash key, const int32_t *tokens,
                     const void *payload, uint64_t cookie);

/* Queue a read into `dst` [page_bytes], host memory that the caller must keep
 * valid and untouched until the completion arrives. `tokens` [page_size] (the
 * expected token ids) is copied. Requests are served in the order they were
 * queued, so a read queued after a write of the same key sees it. */
int cairn_disk_read(cairn_disk *d, cairn_page_hash key, const int32_t *tokens, void *dst,
                    uint64_t cookie);

/* Queue a no-op whose completion means every earlier request has completed. */
int cairn_disk_fence(cairn_disk *d, uint64_t cookie);

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
} cairn_disk_stats;

/* A snapshot of the counters, consistent with the completions polled so far
 * (they are updated before completions are queued). */
void cairn_disk_get_stats(cairn_disk *d, cairn_disk_stats *out);

/* ---- the tiered cache --------------------------------------------------- *
 *
 * One request, as the engine thread runs it:
 *
 *   cairn_radix_match(tree, tokens, n, &m);          longest cached prefix
 *   cairn_radix_lock(tree, m.node);                  nothing on it moves down now
 *   cairn_kvcache_promote(c, m.node, cookie);        ... later, from poll():
 *       event {cookie, CAIRN_OK, m.n_pages}           all of it is in tier 0
 *   cairn_kvcache_alloc(c, k, ids);                  pages for the new tokens
 *   ... forward pass writes KV into ids ...
 *   cairn_radix_insert(tree, tokens, m.n_pages + k, ids_with_prefix, &cached, &leaf);
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
 * LMDB copies of pages dropped from the tree stay on disk). Unlocked LRU
 * nodes go first, whole nodes at a time; locked nodes never move.
 * *moved (optional) receives how many pages moved. Write-back: a page is
 * written to disk when it leaves host RAM, unless it is already there. */
int cairn_kvcache_evict(cairn_kvcache *c, int tier, size_t n_pages, size_t *moved);

typedef struct {
    uint64_t cookie;
    int status;            /* CAIRN_OK: every page of the path is on the device;
                              CAIRN_ENOTFOUND: a page was lost (disk miss or
                              corrupt); CAIRN_EFULL: no device pages free      */
    size_t resident_pages; /* leading pages of the path now on the device      */
} cairn_kvcache_event;

/* Bring every page on the path root..node to tier 0, asynchronously. `node`
 * must be locked by the caller (CAIRN_EINVAL otherwise) and stay locked until
 * the event with `cookie` comes out of cairn_kvcache_poll — even when the
 * pages are resident already, the answer comes as an event. On
 * CAIRN_ENOTFOUND, unlock and call cairn_kvcache_forget with the tokens and
 * resident_pages so the lost pages leave the tree, then recompute. */
int cairn_kvcache_promote(cairn_kvcache *c, cairn_radix_node *node, uint64_t cookie);

/* Handle disk completions and return finished promotions. Never blocks. */
int cairn_kvcache_poll(cairn_kvcache *c, cairn_kvcache_event *out, int max, int *n);

/* Block until there may be something to poll, or timeout_ms (-1 = forever). */
int cairn_kvcache_wait(cairn_kvcache *c, int timeout_ms);

/* Pin: lock the path root..node and write its pages through to disk now, so
 * a pinned prefix survives a restart and is never evicted. Unpin unlocks. */
int cairn_kvcache_pin(cairn_kvcache *c, cairn_radix_node *node);
int cairn_kvcache_unpin(cairn_kvcache *c, cairn_radix_node *node);

/* Drop from the tree every cached page after the first keep_pages pages of
 * tokens[0 .. n_tokens), releasing their tier-0/1 memory (the disk copies
 * stay). CAIRN_EBUSY when some of those pages are locked. */
int cairn_kvcache_forget(cairn_kvcache *c, const int32_t *tokens, size_t n_tokens,
                         size_t keep_pages);

/* Copy a resident page (tier 0 or 1) into host memory dst [page_bytes].
 * CAIRN_ENOTFOUND when the page is only on disk. For tests and tools. */
int cairn_kvcache_read_page(cairn_kvcache *c, const cairn_radix_page *page, void *dst);

typedef struct {
    size_t promotions, promoted_pages, lost_pages;
    size_t evicted_pages[CAIRN_TIER_COUNT]; /* pages moved out of each tier */
    size_t written_pages;                   /* disk writes queued            */
    size_t write_failures;                  /* disk writes that failed       */
} cairn_kvcache_stats;

void cairn_kvcache_get_stats(const cairn_kvcache *c, cairn_kvcache_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* CAIRN_STORE_H */
