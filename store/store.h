/*
 * store/store.h — the KV cache, as everything outside store/ sees it: one
 * handle (cairn_kvcache) that finds a prompt's prefix in any tier, hands the
 * engine device pages to compute into, keeps what was computed, and makes it
 * durable. The tiers themselves (pools, LMDB, Redis) are store/'s business
 * (store/tiers.h, included only by store/'s own files and tests).
 *
 * The tiers, fastest first, and how a page moves
 * -----------------------------------------------
 *
 *     tier 0  device pages   the forward pass reads and writes KV here
 *        ▲ upload   │ evict (LRU by class, radix.h "Eviction order")
 *        │          ▼
 *     tier 1  host RAM       page-locked slots on CUDA
 *        ▲ read     │ evict: written back to LMDB unless already there
 *        │          ▼
 *     tier 2  LMDB on disk   keyed by page hash; survives restarts; its own
 *        ▲ miss     │        I/O thread
 *        │          ▼ share (prefixes seen twice, pinned, persisted)
 *     tier 3  Redis          shared by replicas (optional, under tier 2)
 *
 * A page enters at tier 0 (cairn_kvcache_alloc, then extend or commit give
 * it to the radix tree), sinks a tier at a time when room is needed (or
 * leaves the tree when recomputing it would be cheaper than loading it back),
 * and comes back up in one fetch: host pages uploaded, disk pages read into
 * host slots and uploaded. pin, persist, write-behind and flush write pages
 * through to LMDB without moving them.
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
 * Threads and ownership
 * ---------------------
 * The cache belongs to the engine thread (session/) and is not thread-safe;
 * every function here is called from that thread, except cairn_kvcache_announce
 * (any thread: it only queues). Disk work runs on the store's I/O thread and
 * comes back as events (cairn_kvcache_poll); an idle engine sleeps in
 * cairn_kvcache_wait. Only cairn_kvcache_flush (shutdown) and
 * cairn_kvcache_record_iterate (start-up) block on the disk. The caller owns
 * the handle (create/free); page ids it takes with alloc are its own until
 * it gives them to the tree (extend, commit, keep_tail) or back
 * (free_pages); a hold is a lock it must release (or commit) exactly once.
 *
 * Errors: CAIRN_EINVAL (bad argument), CAIRN_ENOMEM, CAIRN_EFULL (no room in
 * a tier and nothing can be evicted), CAIRN_EIO (LMDB or file failure),
 * CAIRN_ECORRUPT (a disk environment that cannot be trusted), CAIRN_ENOTFOUND
 * (a page is not stored, or failed verification), CAIRN_EBUSY (a locked
 * node), CAIRN_ECLOSED (the I/O thread has stopped), CAIRN_EUNSUPPORTED
 * (a disk-only call on a cache without a disk tier).
 */
#ifndef CAIRN_STORE_H
#define CAIRN_STORE_H

#include "common/common.h"
#include "kernels/backend.h"
#include "radix/radix.h" /* the tier numbers (CAIRN_TIER_*) and the opaque node a hold is */

#ifdef __cplusplus
extern "C" {
#endif

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

/* ---- tier 3: a Redis shared by replicas ----------------------------------- *
 *
 * Optional, under the disk tier (store/tiers.h says how it runs). A page read
 * or record get that misses in LMDB asks Redis; record puts are copied
 * there; pages go there only as the share policy says; page events go to a
 * stream a router (route/) reads. A Redis that is absent, slow, restarted or
 * flushed costs cache hits, never a request (cairn_kvcache_stats.shared). */
typedef struct cairn_shared_config {
    const char *url;      /* redis://[:PASSWORD@]HOST[:PORT][/DB] | unix:///PATH[?db=N] */
    const char *prefix;   /* of every key; NULL = "cairn:"                    */
    const char *replica;  /* this replica's id in page events (at most
                             CAIRN_SHARED_REPLICA_MAX bytes); NULL = the one
                             cairn_kvcache_announce gives (no events before)  */
    int timeout_ms;       /* connect and per command; 0 = 250                 */
    size_t queue_bytes;   /* writes waiting for Redis at most; 0 = 64 MiB     */
    long page_ttl_s;      /* pages expire after this (records never do), so a
                             Redis run with maxmemory-policy volatile-lru evicts
                             pages and keeps session records; 0 = 7 days      */
    bool writes_computed; /* this replica gives Redis every page it computes,
                             as it computes it (CAIRN_SHARE_ALL; the cache
                             sets it): its lookup marks say so, and another
                             replica that finds it computing a prefix waits
                             for the pages instead of computing them too   */
} cairn_shared_config;

#define CAIRN_SHARED_REPLICA_MAX 200
/* A lookup mark younger than this, left by a replica that writes what it
 * computes, makes a miss "busy elsewhere" (cairn_kvcache_event). */
#define CAIRN_SHARED_BUSY_S 60

/* Which pages the cache copies to tier 3 (store/shared.c says why). */
typedef enum {
    CAIRN_SHARE_REUSED = 0, /* prefixes seen twice, pinned ones, persisted sessions' */
    CAIRN_SHARE_ALL,        /* every page a sequence commits, too                   */
    CAIRN_SHARE_NONE,       /* none (reads and page events only)                    */
} cairn_share_policy;

/* ---- a shared tier's address ---------------------------------------------- *
 * Public beyond the cache: the router (route/) reads the page-event stream
 * of the same Redis, so it parses --shared-cache URLs and connects the same
 * way (store/redis.c). */
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

/* ---- the cache ------------------------------------------------------------ */

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

/* Create the pools, the tree and (with disk_dir) the disk tier. A disk tier
 * needs a host tier: disk reads land in host slots before they are uploaded
 * to the device. `err` (may be NULL) receives a message on failure. The
 * caller owns *out. */
int cairn_kvcache_create(const cairn_kvcache_config *cfg, cairn_kvcache **out, char *err,
                         size_t err_len);

/* Free everything. The disk tier finishes its queued writes first. Pages
 * allocated with cairn_kvcache_alloc and not given to the tree are
 * reclaimed with the pool. NULL is a no-op. */
void cairn_kvcache_free(cairn_kvcache *c);

/* ---- the engine's sequences ----------------------------------------------- *
 *
 * What the engine thread (session/) needs, and all it uses: it never calls
 * the tree or the pools. A sequence being computed holds
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
 * no-op), the node hold_prefix locked, or the leaf a commit inserted (not
 * locked: use it at once, e.g. for cairn_kvcache_persist or _pin). */
typedef cairn_radix_node cairn_kv_hold;

/* Base of the tier-0 pool (backend memory) and the layout of its pages: what
 * the forward pass writes KV into. */
void *cairn_kvcache_kv_base(const cairn_kvcache *c);
const cairn_kv_layout *cairn_kvcache_layout(const cairn_kvcache *c);
bool cairn_kvcache_has_disk(const cairn_kvcache *c);

/* Take n tier-0 pages for new KV, evicting unlocked nodes down a tier as
 * needed (all or nothing). CAIRN_EFULL when even that leaves too few. Give
 * pages that end up unused back with cairn_kvcache_free_pages. */
int cairn_kvcache_alloc(cairn_kvcache *c, int32_t n, int32_t *pages);

/* The device page ids of the first n pages of a hold's path (n at most its
 * depth: a fetch event's resident_pages). CAIRN_EINVAL when the path is
 * shorter or not on the device. */
int cairn_kvcache_held_pages(cairn_kvcache *c, cairn_kv_hold *hold, size_t n, int32_t *pages);
/* Give back the lock of a hold (a fetch event's node, hold_prefix's hold). */
int cairn_kvcache_release(cairn_kvcache *c, cairn_kv_hold *hold);
/* Return pages taken with cairn_kvcache_alloc that never reached the tree. */
void cairn_kvcache_free_pages(cairn_kvcache *c, int32_t n, const int32_t *pages);

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
    cairn_kv_hold *node;   /* FETCH: the hold: one lock the caller now owns;
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
    bool busy_elsewhere;   /* FETCH: a page after the answer (of those the
                              last round looked up) is being computed by
                              another replica that gives Redis what it
                              computes (its lookup mark is recent and says
                              so): fetching again a little later finds more,
                              where computing now would compute the same
                              tokens twice in the cluster                    */
    void *data;            /* RECORD_GET with CAIRN_OK: the value, malloc'd;
                              the poller owns it and free()s it             */
    size_t data_bytes;
} cairn_kvcache_event;

/* ---- admission: one call ---------------------------------------------- *
 *
 * cairn_kvcache_fetch is what the engine calls when it admits a request:
 *
 *   cairn_kvcache_fetch(c, ns, seq, n - 1, SIZE_MAX, cookie);  (the last
 *                                 token is always computed, for its logits)
 *   ... other requests keep running; later, from poll():
 *       event {FETCH, cookie, node, resident_pages, from_tier[], ...}
 *   cairn_kvcache_held_pages(c, node, resident_pages, pages): the device
 *   pages of tokens [0, resident_pages * page_size); compute the rest
 *   (extend as it goes), then commit, which releases the hold `node`
 *   (releasing the root is a no-op).
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
 * slot uploaded), whenever *n_reused > 0; CAIRN_TIER_DISK, or
 * CAIRN_KVCACHE_FROM_SHARED when Redis answered, for the first use of a page
 * the fetch just read by parent (it waits in host RAM as a tail, but this
 * request's rows came from the tier below). Errors: CAIRN_EINVAL;
 * CAIRN_EFULL (no page to copy into); what the copy or upload returned (a
 * page taken here is given back). */
#define CAIRN_KVCACHE_FROM_SHARED 3 /* partial()'s *from_tier: the shared tier */
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
 * are not evicted to disk, but reach LMDB as padded pages listed under their
 * parent at flush and persist (the tail under the persisted node), and
 * Redis at once with CAIRN_SHARE_ALL, where a fetch's read by parent finds
 * them (fetch.c). */
int cairn_kvcache_keep_tail(cairn_kvcache *c, uint64_t ns, const int32_t *tokens, size_t n_tokens,
                            int32_t page);

/* Copy tier-0 page src to dst (the caller owns dst): a partial page taken
 * from a sequence still computing it. CAIRN_EINVAL for a bad id. */
int cairn_kvcache_copy_page(cairn_kvcache *c, int32_t src, int32_t dst);

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

/* ---- keeping a prefix ----------------------------------------------------- */

/* Pin: lock the path root..hold and write its pages through to disk now, so
 * a pinned prefix survives a restart and is never evicted. Unpin unlocks. */
int cairn_kvcache_pin(cairn_kvcache *c, cairn_kv_hold *hold);
int cairn_kvcache_unpin(cairn_kvcache *c, cairn_kv_hold *hold);

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

/* ---- sharing with other replicas (tier 3) -------------------------------- */

/* With a shared tier: tell the router this replica is up, serving on these
 * addresses (a "hello" on the page-event stream). CAIRN_OK and nothing
 * without one. Unlike the rest of the kvcache, any thread may call it (it
 * only queues). */
int cairn_kvcache_announce(cairn_kvcache *c, const char *replica, const char *http,
                           const char *rpc);
bool cairn_kvcache_has_shared(const cairn_kvcache *c);
/* Give the pages of a hold's path (a sequence's prefix in the tree) to the
 * shared tier, those not there yet: for a fetch event with share_wanted,
 * as the sequence computes them. Nothing without a shared tier or under
 * CAIRN_SHARE_NONE. */
int cairn_kvcache_share(cairn_kvcache *c, cairn_kv_hold *hold);
/* Delete the shared tier's copy of a durable record (a session its user
 * closed; the local copy goes with cairn_kvcache_record_delete). Queued;
 * CAIRN_OK and nothing without a shared tier. */
int cairn_kvcache_unshare_record(cairn_kvcache *c, const void *key, size_t key_len);

/* ---- durability --------------------------------------------------------- */

/* Write-back on shutdown (SIGTERM): write every tree page that is in tier 0
 * or 1 and not on disk yet, then wait — blocking the calling thread — until
 * all of it is committed and fsync'd. Completions of other requests that
 * arrive meanwhile are handled; their events wait for the next poll.
 * CAIRN_OK, or CAIRN_EIO when a write or the sync failed. Without a disk
 * tier: CAIRN_OK at once. */
int cairn_kvcache_flush(cairn_kvcache *c);

/* Write-behind (config.write_behind): a prefix that was reused (a fetch
 * that found cached pages in memory) has its pages not on disk yet written
 * to LMDB in the background by poll, a few pages per call, so a SIGKILL
 * loses less than every prefix computed since the start. Pages written
 * behind survive a process kill, not a power loss (not fsync'd); bounds
 * and reasons are in store/tiers.h ("write-behind"). */

/* True while write-behind has work queued or in flight: poll again soon
 * (an idle engine waits with cairn_kvcache_wait instead of sleeping). */
bool cairn_kvcache_busy(const cairn_kvcache *c);

/* Shutdown and restart, as the engine runs them:
 *
 *   SIGTERM:  cairn_kvcache_flush(c); cairn_kvcache_free(c); exit(0)
 *   start:    the tree is empty; cairn_kvcache_fetch finds old pages by hash
 *             in LMDB (same namespace only: another model fingerprint, KV
 *             dtype, layout or page size gives other keys, and a value
 *             whose header names another namespace is never returned);
 *             session records come back with cairn_kvcache_record_iterate.
 *   durable session call:  cairn_kvcache_persist(c, leaf, A) and
 *             cairn_kvcache_record_put(c, id, ..., B); reply after both
 *             events. (Requests complete in order, so B's event already
 *             implies A's writes are durable; A's status says whether every
 *             page could be written.)
 */

/* Make the pages of the path root..hold durable: queue a write of every
 * resident page not yet on disk (write-through; the bytes are copied before
 * return, so its pages may change tier afterwards), then a durable fence.
 * The event (kind PERSIST, cookie) comes once all of them are committed and
 * fsync'd: CAIRN_OK; CAIRN_ENOTFOUND when a page of the path exists nowhere
 * (lost: recompute and persist again); CAIRN_EIO when a write or the sync
 * failed (conservative: a failure of any write completed in between counts).
 * Pages stay subject to the disk tier's own LRU when the map fills up.
 * CAIRN_EUNSUPPORTED without a disk tier. */
int cairn_kvcache_persist(cairn_kvcache *c, cairn_kv_hold *hold, uint64_t cookie);

/* Durable records (session records: key bytes -> value bytes, keys 1 .. 511
 * bytes, values up to 256 MiB) in a database of their own in the disk tier:
 * never evicted, no namespace, kept across restarts. The event
 * (kind RECORD_PUT / RECORD_DELETE / RECORD_GET) comes after the commit and,
 * for put and delete, an fsync. Requests are served in call order together
 * with page writes: a put called after persist completes after it. A
 * record that does not fit even after the disk evicted pages fails with
 * CAIRN_EFULL; a delete or get of an absent key with CAIRN_ENOTFOUND.
 * CAIRN_EUNSUPPORTED without a disk tier. */
int cairn_kvcache_record_put(cairn_kvcache *c, const void *key, size_t key_len, const void *value,
                             size_t value_bytes, uint64_t cookie);
int cairn_kvcache_record_delete(cairn_kvcache *c, const void *key, size_t key_len, uint64_t cookie);
int cairn_kvcache_record_get(cairn_kvcache *c, const void *key, size_t key_len, uint64_t cookie);
/* The durable records, for the start-up read: fn is called for every record
 * in key order (byte-wise), on the calling thread (a read transaction:
 * blocking, sees every commit completed so far); the pointers are valid
 * during the call only; a non-zero return from fn stops the walk and is
 * returned. CAIRN_EUNSUPPORTED without a disk tier. */
typedef int (*cairn_kv_record_fn)(const void *key, size_t key_len, const void *value,
                                  size_t value_bytes, void *user);
int cairn_kvcache_record_iterate(cairn_kvcache *c, cairn_kv_record_fn fn, void *user);

/* Drop from the tree every cached page after the first keep_pages pages of
 * tokens[0 .. n_tokens) (in namespace ns), releasing their tier-0/1 memory (the disk copies
 * stay). CAIRN_EBUSY when some of those pages are locked. */
int cairn_kvcache_forget(cairn_kvcache *c, uint64_t ns, const int32_t *tokens, size_t n_tokens,
                         size_t keep_pages);

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
 * The rates are measured as the cache runs (uploads, disk rounds) and
 * reported by the engine (its prefill rate); before any measurement the
 * priors assume a cache hit is worth loading (store/tiers.h, "cost model").
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
/* Tier 3, as its writer and the disk tier's reads count it. */
typedef struct {
    bool on;                 /* a shared tier is configured                   */
    bool up;                 /* its writer's connection is up                 */
    uint64_t hits, misses;   /* page reads that missed in LMDB                */
    uint64_t corrupt;        /* values that failed verification (deleted)     */
    uint64_t puts;           /* SETs Redis took (pages and records)           */
    uint64_t dropped;        /* writes and events dropped (queue full, stop)  */
    uint64_t errors;         /* commands Redis refused (e.g. out of memory)   */
    uint64_t events;         /* page events published                         */
    uint64_t outages;        /* times a connection went down                  */
    uint64_t queued_bytes;   /* waiting for Redis now                         */
} cairn_kvcache_shared_stats;

typedef struct {
    size_t promotions, promoted_pages, lost_pages;
    size_t evicted_pages[CAIRN_TIER_COUNT]; /* pages moved out of each tier */
    size_t written_pages;                   /* disk writes queued            */
    size_t write_failures;                  /* disk writes that failed       */
    cairn_kvcache_tier_stats tier[CAIRN_TIER_COUNT];
    size_t fetches;                         /* fetches completed             */
    size_t fetch_skipped_pages;             /* pages the cost model skipped  */
    size_t child_pages;                     /* partial pages found by parent
                                               on disk or in Redis (fetch.c) */
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
    cairn_kvcache_shared_stats shared;      /* tier 3; all zero without one  */
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
