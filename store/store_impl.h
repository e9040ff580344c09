/*
 * store/store_impl.h — internal to store/. Nothing outside store/ includes
 * this (no other folder may: it is not part of the module's API).
 *
 * Two parts:
 *   - the free-id stack both page pools hand out their ids from
 *     (page_pool.c, host_pool.c);
 *   - the insides of cairn_kvcache, shared by the files that implement it:
 *       kvcache.c   create / free, accessors, the engine-sequence facade,
 *                   allocation with eviction, stats
 *       cost.c      the cost model: rate estimates and the fetch choice
 *       promote.c   promotion to the device; draining disk completions
 *                   into events (poll, wait)
 *       fetch.c     admission: fetch ops and their continuation rounds
 *       durable.c   pin / unpin, persist, flush, records, forget, read_page
 *       share.c     extend (pages to the tree while computing), partial
 *                   reuse of a page, tails
 *       behind.c    write-behind: reused prefixes to LMDB in the background
 *       retain.c    holding a prefix for a retention hint (no write-through)
 *     Functions one of them defines for the others carry the kvc_ prefix.
 *
 * The id stack. Ids 0 .. capacity-1; a fresh stack hands out 0, 1, 2, ...
 * Taking is all or nothing; giving back an id that is not taken is a caller
 * bug that is logged and ignored, so the accounting (available + taken ==
 * capacity) stays exact.
 */
#ifndef CAIRN_STORE_IMPL_H
#define CAIRN_STORE_IMPL_H

#include "common/common.h"
#include "store/tiers.h"

/* ---- the free-id stack (page_pool.c, host_pool.c) ----------------------- */

typedef struct {
    int32_t capacity;
    int32_t n_free;
    int32_t *free_ids; /* stack; top is free_ids[n_free-1] */
    uint8_t *in_use;   /* [capacity]                       */
} id_stack;

/* CAIRN_ENOMEM when the arrays cannot be allocated (nothing to free then). */
int id_stack_init(id_stack *s, int32_t capacity);
void id_stack_free(id_stack *s);
/* Take n ids into ids[] (all or nothing): CAIRN_EFULL when fewer are free. */
int id_stack_take(id_stack *s, int32_t n, int32_t *ids);
/* Give ids back; `what` names the pool in the log line for a bad id. */
void id_stack_give(id_stack *s, int32_t n, const int32_t *ids, const char *what);

/* ---- the tiered cache: shared state ------------------------------------ */

/* slot_state[]: what a host slot is doing. SLOT_ORPHAN: a read is in
 * flight into it that nobody waits for any more; poll frees the slot when
 * the read completes. */
enum { SLOT_IDLE = 0, SLOT_LOADING, SLOT_LOADED, SLOT_MISSED, SLOT_ORPHAN };
/* cairn_radix_page.flags: PAGE_LOST, the disk copy is gone; PAGE_SHARED, a
 * copy was queued for (or came from) the shared tier. */
enum { PAGE_LOST = 1, PAGE_SHARED = 2 };
/* ... and which memory tiers the page watcher was told it is in
 * (announce.c). */
enum { PAGE_ANN_DEVICE = 4, PAGE_ANN_HOST = 8 };

/* Disk cookies: the top four bits say what the completion is for; 0 is
 * nobody's (ignored). */
#define COOKIE_READ (1ull << 60)  /* value: host slot                      */
#define COOKIE_FENCE (2ull << 60) /* value: promotion id                   */
#define COOKIE_WRITE (3ull << 60)
#define COOKIE_FETCH (4ull << 60) /* value: fetch op id                    */
#define COOKIE_OP (5ull << 60)    /* value: pending op id (sync, records)  */
#define COOKIE_CHILD (6ull << 60) /* value: host slot of a fetch's read child */
/* COOKIE_WRITE's value: 0 for write-back / write-through, BEHIND_WRITE for
 * a write-behind write (its completion ends its in-flight count). */
#define BEHIND_WRITE 1ull
#define COOKIE_KIND(c) ((c) & (15ull << 60))
#define COOKIE_VALUE(c) ((c) & ~(15ull << 60))

/* Priors of the cost model (store.h explains the choice). */
#define PRIOR_COMPUTE_TOKENS_PER_S 2000.0
#define PRIOR_H2D_BYTES_PER_S 4e9
#define PRIOR_DISK_BYTES_PER_S 200e6
#define PRIOR_DISK_LATENCY_S 2e-3

/* A promotion waiting for its fence (promote.c). */
typedef struct {
    uint64_t cookie; /* the caller's */
    uint64_t id;     /* fence cookie value */
    cairn_radix_node *node;
    size_t n_reads;  /* disk reads queued by this promotion (rate samples) */
} promotion;

/* A request whose completion becomes an event or ends a flush (queued in
 * durable.c, completed in promote.c). */
typedef struct {
    uint64_t cookie, id;
    int kind;               /* CAIRN_KVCACHE_EV_*; -1: flush (no event)   */
    int status;             /* known before the completion (persist)     */
    size_t failures_before; /* write failures when queued (persist)      */
} pending_op;

/* slot_seen bits */
#define SLOT_SEEN 1u
#define SLOT_BUSY 2u

/* One fetch in flight (fetch.c). */
typedef struct {
    uint64_t id, cookie;
    cairn_radix_node *node; /* locked by the op; its path is (being made) resident */
    bool promoting;         /* waiting for the in-memory path's loads */
    int status;
    uint64_t ns;            /* the namespace the tokens are looked up in */
    int32_t *tokens;        /* [n_target * page_size] */
    size_t n_lookup;        /* tokens the request asked about (hit/miss stats) */
    size_t n_target;        /* pages the op wants on the device */
    uint8_t *origin;        /* [n_target] tier of each page when fetch was called */
    size_t next;            /* pages of the tree path the op holds: continue here */
    int32_t *round;         /* host slots of the continuation round in flight */
    size_t n_round;
    size_t from_shared;     /* continuation pages the shared tier served */
    bool share_wanted;      /* a miss another replica had looked up too */
    bool busy_elsewhere;    /* ... and is computing for Redis now       */
    size_t n_reads;         /* disk reads before the current fence (rate samples) */
    size_t skipped, lost;
    size_t n_tokens;        /* tokens[] holds this many: the target's pages and
                               up to a page past them (the partial page)     */
    size_t n_pages_req;     /* whole pages the request has (the most the target
                               could be)                                    */
    /* the page that continues the match in part, read by parent (fetch.c) */
    bool child_asked;
    int32_t child_slot;     /* its host slot while the read is out, else -1 */
    int child_matched;      /* tokens of the request it shares (0: none)    */
    bool child_shared;      /* ... and Redis answered, not LMDB            */
    int32_t *child_tokens;  /* [page_size], from the completion             */
} fetch_op;

/* Decayed sums for the rate estimates. */
typedef struct {
    double w, x, y, xx, xy;
} decayed_fit;

struct cairn_kvcache {
    cairn_backend *be;
    cairn_kv_layout L;
    cairn_page_pool *dev;
    cairn_host_pool *host;
    cairn_disk *disk;
    cairn_radix *tree;
    uint8_t *scratch;     /* one page of host memory: device -> disk          */
    uint8_t *slot_state;  /* [host capacity]                                 */
    uint8_t *slot_shared; /* [host capacity]: the loaded read came from tier 3 */
    uint8_t *slot_seen;   /* [host capacity]: the missed read was another
                             replica's miss before (SLOT_SEEN: seen twice in
                             the cluster), lately and by one that writes what
                             it computes (SLOT_BUSY)                         */

    /* tier 3 (shared.c): on when the disk has a shared tier */
    bool shared;
    int share_policy;     /* cairn_share_policy                               */
    cairn_page_hash *ev_stored, *ev_removed; /* page events not yet queued    */
    size_t n_ev_stored, n_ev_removed, cap_ev_stored, cap_ev_removed;

    promotion *promos;
    size_t n_promos, cap_promos;
    uint64_t next_promo;

    fetch_op **fetches;
    size_t n_fetches, cap_fetches;
    pending_op *ops;
    size_t n_ops, cap_ops;
    uint64_t next_op;
    cairn_page_hash ns;

    /* cost model */
    decayed_fit h2d;       /* x = bytes, y = seconds of uploads          */
    decayed_fit disk_fit;  /* x = bytes, y = seconds of disk rounds      */
    double compute_rate;   /* tokens/s reported by the engine (0: none)  */
    cairn_kvcache_rates rates;     /* the estimates in force              */
    bool rates_overridden;

    cairn_kvcache_event *events;
    size_t n_events, cap_events;

    cairn_radix_page **path; /* scratch for path walks */
    size_t path_cap;
    cairn_radix_node **nodes;
    size_t nodes_cap;

    /* partial last pages of finished sequences (share.c) */
    struct kv_tail *tails;
    int32_t *tail_tokens;
    size_t n_tails_cap, n_tails;
    uint64_t tail_clock;
    struct kv_tail *tail_busy; /* being copied by partial(): not to be moved */
    uint64_t tail_ids;         /* the last tail id given                    */
    bool plain_lru;            /* config.plain_lru: no class, tails included */

    /* transfers in flight (transfer.c): the fence of the last copy that
     * reads or writes each host slot, and the device pages and host slots
     * released while their copy still runs, oldest first */
    uint64_t *slot_fence; /* [host capacity]; 0 = nothing in flight */
    struct kv_drain {
        struct kv_draining *v;
        size_t n, cap;
    } drain[2]; /* [CAIRN_TIER_DEVICE]: device pages, [CAIRN_TIER_HOST]: slots */

    /* write-behind (behind.c): reused prefixes waiting, oldest first, and
     * write-behind pages queued on the disk and not completed yet */
    bool write_behind;
    struct kv_behind {
        uint64_t ns;
        int32_t *tokens; /* [n_pages * page_size] */
        size_t n_pages;
    } *behind;
    size_t n_behind;
    size_t behind_inflight;

    /* pages evicted out of the tree for good, by hash (explain.c): direct
     * mapped on hash.lo; tier_plus_one 0 = empty slot */
    struct kv_gone {
        cairn_page_hash hash;
        int8_t tier_plus_one;
    } gone[CAIRN_KV_GONE_SLOTS];

    /* the page watcher (announce.c) */
    cairn_kvcache_watch_fn watch_fn;
    void *watch_user;
    cairn_page_hash *watch_hashes; /* scratch for one run */
    size_t watch_cap;

    cairn_kvcache_stats stats;
};

static inline uint8_t *dev_addr(cairn_kvcache *c, int32_t page)
{
    return (uint8_t *)cairn_page_pool_base(c->dev) + (size_t)page * c->L.page_bytes;
}

/* ---- kvcache.c: helpers and eviction ----------------------------------- */

/* Give back a tree page's device page and host slot (a cairn_radix_drop
 * callback; user is the cache). */
void kvc_release_page(const cairn_radix_page *p, void *user);
/* Room for n entries in c->path (the scratch of path walks). */
int kvc_path_reserve(cairn_kvcache *c, size_t n);
/* Nodes of the path root..node (root excluded) into c->nodes, in order. */
int kvc_path_nodes(cairn_kvcache *c, cairn_radix_node *node, size_t *n);
/* The bytes of a page of a node in `tier`: a device page downloaded into
 * c->scratch (valid until the next use of it), a host page's slot; NULL
 * for a disk page or when the download failed. */
const void *kvc_page_bytes(cairn_kvcache *c, int tier, const cairn_radix_page *pg);
/* Queue a disk write of one page; marks it on disk. */
int kvc_write_page(cairn_kvcache *c, cairn_radix_node *node, size_t i, const int32_t *tokens,
                   const void *bytes);
/* Evict the LRU candidate of `tier`; pages moved, 0 when nothing could. */
size_t kvc_evict_one(cairn_kvcache *c, int tier);
/* Make n host slots free (drained slots back, then eviction from tier 1);
 * false when fewer could be had. */
bool kvc_host_room(cairn_kvcache *c, int32_t n);

/* ---- explain.c ------------------------------------------------------------ */

/* The pages of `node` (a leaf about to be dropped from `tier` by eviction)
 * leave the tree: remember those whose only copy goes with them. */
void kvc_note_gone(cairn_kvcache *c, cairn_radix_node *node, int tier);

/* ---- transfer.c: page copies between tier 0 and tier 1 ----------------- */

/* A device page or host slot given back while a copy still uses it. */
struct kv_draining {
    int32_t id;
    uint64_t fence;
};

int kvc_transfers_init(cairn_kvcache *c);
/* Wait for every copy in flight and give back what drains (before free). */
void kvc_transfers_finish(cairn_kvcache *c);
/* Move a device page into a host slot (eviction): the copy is started and
 * the device page given back, to be handed out again once the copy has
 * read it; on failure the page stays the caller's. Copy a host slot into a
 * device page (promotion). Either way the slot's fence is the copy's: the
 * host slot is not touched by the host until it passes. */
int kvc_move_to_host(cairn_kvcache *c, int32_t host_slot, int32_t device_page);
int kvc_page_to_device(cairn_kvcache *c, int32_t device_page, int32_t host_slot);
/* Make a host slot's bytes safe to read or write on the host: wait for the
 * copy in flight on it. CAIRN_EBACKEND when that copy failed. */
int kvc_slot_settle(cairn_kvcache *c, int32_t slot);
/* Give a host slot back to the pool, or set it aside until its copy ends. */
void kvc_host_release(cairn_kvcache *c, int32_t slot);
/* Give back the drained device pages (tier CAIRN_TIER_DEVICE) or host slots
 * (CAIRN_TIER_HOST) whose copies have passed; with block, wait for the
 * oldest first when there is one. Returns how many came back. */
size_t kvc_reclaim(cairn_kvcache *c, int tier, bool block);

/* ---- share.c: tails --------------------------------------------------- */

/* Free the tier-0 page of the least recently used tail in tier 0 (it moves
 * to a free host slot, or is dropped); false when there is none. */
bool kvc_drop_lru_tail(cairn_kvcache *c, bool live);
/* Drop the least recently used tail in host RAM; false when there is none. */
bool kvc_drop_host_tail(cairn_kvcache *c, bool live);
/* Live marks on the tail a session's history ends in (0: none holds it). */
uint64_t kvc_tail_mark_live(cairn_kvcache *c, uint64_t ns, const int32_t *tokens, size_t n_tokens);
void kvc_tail_unmark_live(cairn_kvcache *c, uint64_t id);
void kvc_tails_free(cairn_kvcache *c);
/* Keep tokens[0 .. n) (n < page_size) under `parent` as a tail whose KV is
 * in host slot `slot` (a page read by parent: fetch.c), which came from
 * `came_from` (partial()'s *from_tier at its first use); the slot is taken
 * in every case. */
int kvc_tail_adopt_host(cairn_kvcache *c, uint64_t ns, cairn_page_hash parent,
                        const int32_t *tokens, size_t n, int32_t slot, int came_from);
/* Write to LMDB (to_disk) and/or queue for Redis (share; only when pages are
 * shared at all) the tails under `parent` (NULL: every tail) that are not
 * there yet, as padded pages listed under their parent (share.c). */
void kvc_tails_down(cairn_kvcache *c, const cairn_page_hash *parent, bool to_disk, bool share);
/* How many leading tokens of next[0 .. limit) the best page continuing
 * `node` in memory shares (a tree child on the device or in host RAM, or a
 * tail); *child (may be NULL) receives the tree child when that is it. */
size_t kvc_partial_best(cairn_kvcache *c, uint64_t ns, cairn_radix_node *node,
                        const int32_t *next, size_t limit, cairn_radix_node **child);
void kvc_tail_counts(const cairn_kvcache *c, uint64_t *on_device, uint64_t *in_host);

/* ---- cost.c: the cost model --------------------------------------------- */

/* An upload of `pages` pages took `seconds` (stats and the h2d rate). */
void kvc_note_upload(cairn_kvcache *c, size_t pages, double seconds);
/* A disk round (reads + fence) of n_reads pages took `seconds`. */
void kvc_note_disk_round(cairn_kvcache *c, size_t n_reads, double seconds);
/* How many leading pages of a candidate list (tier of each) are worth
 * having on the device. */
size_t kvc_choose_pages(const cairn_kvcache *c, const uint8_t *tier, size_t n);

/* ---- promote.c: promotion, completions and events ----------------------- */

int kvc_push_event(cairn_kvcache *c, cairn_kvcache_event ev);
/* Finish bringing the path root..node to the device once its disk reads
 * have completed: CAIRN_OK, CAIRN_ENOTFOUND (a page was lost) or
 * CAIRN_EFULL; *resident receives the leading pages now on the device. */
int kvc_finish_path(cairn_kvcache *c, cairn_radix_node *node_in, size_t *resident);
/* Queue disk reads (into host slots) for the DISK pages of the path in
 * c->nodes[0 .. n_nodes) that are not loading yet. */
void kvc_queue_path_reads(cairn_kvcache *c, size_t n_nodes, size_t *queued, bool *pending);
pending_op *kvc_find_op(cairn_kvcache *c, uint64_t id, size_t *idx);
/* Handle every disk completion waiting. */
void kvc_drain_disk(cairn_kvcache *c);

/* ---- shared.c: the cache's side of tier 3 --------------------------------- */

/* Queue for Redis every resident page of the path root..node that has no
 * copy there yet (device pages are downloaded into c->scratch first), and
 * the first page of `child` (a child of node, may be NULL: the page a
 * partial match ends in). */
void kvc_share_path(cairn_kvcache *c, cairn_radix_node *node, cairn_radix_node *child);
/* The last n_new pages of the path root..leaf just entered the tree. */
void kvc_note_stored(cairn_kvcache *c, cairn_radix_node *leaf, size_t n_new);
/* A page left the tree (a cairn_radix_drop callback's page). */
void kvc_note_removed(cairn_kvcache *c, const cairn_radix_page *p);

/* announce.c: the page watcher. kvc_set_tier is cairn_radix_set_tier plus
 * telling the watcher; kvc_announce_node reconciles a node (after an
 * insert); kvc_announce_release is called for every page leaving the tree;
 * kvc_page_parent gives the page before pg[i] of node (false and the
 * namespace's seed for a sequence's first page). */
void kvc_set_tier(cairn_kvcache *c, cairn_radix_node *node, int tier);
void kvc_announce_node(cairn_kvcache *c, cairn_radix_node *node);
void kvc_announce_release(cairn_kvcache *c, const cairn_radix_page *p);
bool kvc_page_parent(cairn_kvcache *c, cairn_radix_node *node, size_t i, cairn_page_hash *out);
/* The origin of pg[i] of node for cairn_disk_write. */
cairn_disk_page_origin kvc_page_origin(cairn_kvcache *c, cairn_radix_node *node, size_t i);
/* Hand the page events gathered so far to the disk's shared tier. */
void kvc_flush_events(cairn_kvcache *c);

/* ---- behind.c: write-behind -------------------------------------------- */

/* The path root..node was reused (a fetch found it cached): queue its pages
 * that are not on disk yet for write-behind, and the first page of `child`
 * (a child of node, may be NULL): the page the reuse's partial match ends
 * in, which a restart finds again by parent (fetch.c). Uses c->path and
 * c->nodes. */
void kvc_behind_note(cairn_kvcache *c, cairn_radix_node *node, cairn_radix_node *child);
/* Queue the next write-behind pages, within the bounds (from poll). */
void kvc_behind_step(cairn_kvcache *c);
/* A write-behind write completed. */
void kvc_behind_done(cairn_kvcache *c, int status);
void kvc_behind_free(cairn_kvcache *c);

/* ---- fetch.c: admission ------------------------------------------------- */

/* Drive a fetch op after its fence completed (or at once when it had
 * nothing to wait for). Returns true when the op is finished (and freed). */
/* A fetch's read child completed (promote.c's drain): to its op, or the
 * slot back when the op is gone. */
void kvc_child_done(cairn_kvcache *c, int32_t slot, const cairn_disk_completion *done);
bool kvc_advance_fetch(cairn_kvcache *c, fetch_op *op, double fence_seconds);

#endif /* CAIRN_STORE_IMPL_H */
