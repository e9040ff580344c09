/*
 * radix/radix.h — the prefix index of cached KV: a radix tree over token ids,
 * cut at page boundaries, that says for every cached page where it lives.
 *
 * What it is for
 * --------------
 * A prompt prefix, once computed, is kept as KV pages. This tree finds those
 * pages again from a token sequence, lets many requests share them, and
 * decides which ones leave fast memory first. It does not own any KV memory:
 * each page is a small record (cairn_radix_page) naming where the page's
 * bytes are — a tier-0 page id, a tier-1 host slot, and/or "on disk" — and
 * the page's chained hash, which is its key on disk. The store module
 * (store/store.h) owns the memory and moves pages between tiers; it tells the
 * tree what it did with cairn_radix_set_tier() and cairn_radix_drop().
 *
 * Shape of the tree
 * -----------------
 * With page_size = 4 (letters stand for token ids), after inserting
 *   "abcd efgh ijkl"   (3 pages)       and   "abcd efgh mnop qrst" (4 pages)
 *   "abcd wxyz"        (2 pages)
 * the tree is
 *
 *            (root)
 *              |
 *           [abcd]                  one node = one edge label = whole pages
 *           /    \
 *      [efgh]    [wxyz]
 *      /     \
 *  [ijkl]  [mnop qrst]              a node may hold several pages
 *
 * Children of a node are told apart by their first page (all page_size tokens
 * of it, not just the first token), because a node never starts mid-page.
 * Tokens after the last whole page of a sequence are never cached: they are
 * recomputed, which costs less than one page of work.
 *
 * Split. Matching "abcd efgh mnop uvwx" ends inside [mnop qrst]. The match
 * splits that node so that the match ends exactly on a node boundary:
 *
 *      [efgh]                         [efgh]
 *      /     \          match         /     \
 *  [ijkl]  [mnop qrst]   ───▶     [ijkl]   [mnop]      <- new node, the prefix
 *                                             |
 *                                          [qrst]      <- the old node object
 *
 * The deeper half keeps the identity of the old node object, so a handle to
 * a node (and a lock taken on it) always denotes the same full token path,
 * whatever splits happen above it. Only the page records move.
 *
 * Locks. cairn_radix_lock(node) adds one reference to the node and to every
 * ancestor: the whole path from the root is protected. A node with refs > 0
 * is never evicted, dropped, or moved to a slower tier; the store refuses to.
 * Requests lock the path they compute on; a pinned prefix stays locked. An
 * idle session holds no lock: it keeps its token ids and matches again.
 *
 * Tiers and eviction. Each node's pages are all in the same tier, the node's
 * tier: DEVICE (tier 0), HOST (tier 1) or DISK (tier 2). Eviction picks,
 * among the nodes that are a "leaf of its tier", the first in eviction order
 * (below: the lowest class, then the least recently used):
 *
 *     evictable from tier t  <=>  refs == 0, tier == t, and no child is in
 *                                 tier t or a faster one
 *
 * which, when every node is on the device, is exactly "unlocked LRU leaf".
 * Evicting moves a node's pages down one tier; the node stays in the tree and
 * becomes a candidate of the next tier; its parent may become a candidate of
 * this one. Only the last tier drops nodes from the tree:
 *
 *   device:  [abcd]─[efgh]─[ijkl]      evict DEVICE    [abcd]─[efgh]─[ijkl]
 *     ref 0        ref 0   ref 0      ────────────▶   dev    dev     host
 *                                     (ijkl LRU)
 *
 * Recency is a counter bumped by every match and insert along the whole path,
 * so an ancestor is never older than its descendants.
 *
 * Eviction order. Plain LRU lets a burst of one-off prompts push out the
 * system prompt every live conversation shares. So each node has a class,
 * and a tier gives up its lowest class first, least recently used first
 * within a class:
 *
 *   class 0  ONCE    pages one sequence computed and nobody found again
 *   class 1  SHARED  pages found cached by another request (a fetch marks
 *                    the matched path: cairn_radix_mark_reused), or a
 *                    branch point (two or more children): several
 *                    sequences continue from them
 *   class 2  LIVE    pages marked live: an open session's history
 *                    (cairn_radix_mark_live; unlike a lock, a mark does not
 *                    stop eviction, it only puts the pages last)
 *   locked   never evicted at all (refs > 0: running requests, pins)
 *
 *        device heap, first out on the left
 *        [one-off q1] [one-off q2] | [doc A, reused] | [session 7's turns]
 *          ONCE, older  ONCE        SHARED             LIVE
 *
 * A live mark and a reuse count on every ancestor too, so a prefix is worth
 * at least what its continuations are. Live marks, like locks, are counted
 * on the whole path; a marked node may still leave the tree at the last
 * tier, and then its marks leave its ancestors with it (whoever marked
 * keeps the node's id and finds it again with cairn_radix_find before
 * unmarking).
 *
 * Namespaces. Every key starts with a 64-bit namespace word (a tenant: 0 is
 * "shared by everyone"). Sequences of different namespaces never share a
 * node, however equal their tokens: the root's children are told apart by
 * (namespace, first page), and everything below a child inherits its
 * namespace:
 *
 *            (root)
 *            /     \
 *    ns 0 [abcd]   ns 7 [abcd]      same tokens, two tenants: two subtrees
 *
 * Page hash. Every page record carries its key, the chained hash of
 * pagekey/pagekey.h: h_i over the tokens of pages 0..i, from h_{-1} =
 * cairn_radix_ns_seed(ns) = cairn_page_chain_seed(seed, ns), the seed given
 * at creation being the model's root (cairn_page_namespace_hash). The tree
 * computes them as pages come in; it defines nothing about them.
 *
 * Ownership, lifetime, threads
 * ----------------------------
 * - A cairn_radix is created with cairn_radix_create and freed with
 *   cairn_radix_free. Node handles are owned by the tree; a handle stays
 *   valid until that node is dropped (cairn_radix_drop, directly or as part
 *   of a subtree) or the tree is freed. A locked node is never dropped.
 * - Pointers to page records (cairn_radix_node_pages, cairn_radix_path) stay
 *   valid until the next call that modifies the tree (match, insert, split,
 *   drop, free); lock, unlock, set_tier and the accessors do not move them.
 * - Not thread-safe: the tree belongs to the engine thread.
 * - Errors: CAIRN_EINVAL for a NULL or out-of-range argument (or unlocking an
 *   unlocked node), CAIRN_ENOMEM when memory runs out (the tree is left as it
 *   was), CAIRN_EBUSY when an operation would touch a locked node.
 */
#ifndef CAIRN_RADIX_H
#define CAIRN_RADIX_H

#include "common/common.h"
#include "pagekey/pagekey.h" /* cairn_page_hash and the chain: page identity */

#ifdef __cplusplus
extern "C" {
#endif

/* Tiers, fastest first. */
enum { CAIRN_TIER_DEVICE = 0, CAIRN_TIER_HOST = 1, CAIRN_TIER_DISK = 2, CAIRN_TIER_COUNT = 3 };

/* Where one page lives. The tree stores and copies these records; the store
 * fills them in. A page may be present in several tiers at once (a device
 * page written through to disk has device_page >= 0 and on_disk = 1). */
typedef struct {
    cairn_page_hash hash; /* chained hash of the path up to this page (set by the tree) */
    int32_t device_page;  /* tier-0 page id, -1 when not on the device                  */
    int32_t host_slot;    /* tier-1 slot, -1 when not in host RAM                       */
    uint8_t on_disk;      /* 1 once a write to tier 2 has been queued                  */
    uint8_t flags;        /* for the store's own bookkeeping; the tree only copies it   */
} cairn_radix_page;

typedef struct cairn_radix cairn_radix;
typedef struct cairn_radix_node cairn_radix_node;

/* Create an empty tree whose pages hold `page_size` tokens (1 .. 65536) and
 * whose hash chain starts at `seed`. The caller owns *out. */
int cairn_radix_create(int page_size, cairn_page_hash seed, cairn_radix **out);

/* Free the tree and every node. The page records are forgotten, not released:
 * whoever owns the memory they name frees it separately. NULL is a no-op. */
void cairn_radix_free(cairn_radix *t);

/* Tokens per page, as created. */
int cairn_radix_page_size(const cairn_radix *t);

/* h_{-1} of namespace `ns` (see "Page hash" above). */
cairn_page_hash cairn_radix_ns_seed(const cairn_radix *t, uint64_t ns);

/* ---- match and insert --------------------------------------------------- */

typedef struct {
    cairn_radix_node *node; /* the match ends at the end of this node (the root when
                               nothing matched); lock it to keep the pages        */
    size_t n_pages;         /* whole pages matched: tokens[0 .. n_pages*page_size) */
    cairn_page_hash last_hash; /* hash of page n_pages-1 (the seed when 0): continue
                                  the chain from here to look further on disk    */
} cairn_radix_match_result;

/* Longest cached prefix of tokens[0..n_tokens) in namespace `ns`, in whole pages. Splits the
 * node where the match ends inside one, and marks the matched path as used
 * now. The result may name pages in any tier; the caller promotes what it
 * needs. Errors: CAIRN_EINVAL, CAIRN_ENOMEM (a split failed; *out then
 * describes the match up to the last whole node). */
int cairn_radix_match(cairn_radix *t, uint64_t ns, const int32_t *tokens, size_t n_tokens,
                      cairn_radix_match_result *out);

/* What the tree holds closest to a token sequence, without changing anything
 * (no split, no recency bump, no lock): for explaining why a prompt was not
 * (all) cached. Token-exact where cairn_radix_match stops at whole pages: the
 * walk follows whole pages as match does, then compares token by token inside
 * the first page that differs (against the child sharing the most tokens
 * with it when the walk ends on a node boundary). Partial tails the store
 * keeps outside the tree are not looked at. */
typedef struct {
    size_t common_tokens;   /* tokens[0 .. common_tokens) equal a cached sequence
                               of the namespace; the prompt departs there     */
    size_t whole_pages;     /* of them, whole pages: what a match would give  */
    cairn_page_hash last_hash; /* hash of page whole_pages-1 (the namespace seed
                               when 0): continue the chain to name the page
                               after the match                              */
    size_t sequence_tokens; /* where the closest cached sequence's node ends,
                               in tokens from the start (0: nothing shared)  */
    bool contained;         /* the walk reached a leaf: the sequence holds a
                               whole cached sequence and goes on past it     */
    int tier;               /* tier of the node holding the last common token;
                               -1 when common_tokens is 0                   */
    bool ns_cached;         /* the namespace holds anything at all           */
    const int32_t *cached_next; /* the closest sequence's tokens from the
                               departure on (NULL when contained or nothing
                               is cached); valid until the tree is modified  */
    size_t n_cached_next;   /* how many of them (to the end of their node)   */
} cairn_radix_common;

/* Fill *out for tokens[0 .. n_tokens) in namespace `ns`. O(n_tokens) token
 * compares plus, where the walk ends on a node boundary, one page compared
 * with each child there. Errors: CAIRN_EINVAL. */
int cairn_radix_common_prefix(const cairn_radix *t, uint64_t ns, const int32_t *tokens,
                              size_t n_tokens, cairn_radix_common *out);

/* The most whole pages of tokens[0 .. n_tokens) that any namespace other than
 * `ns` holds (0 when none). Tells "only another tenant had it" apart from
 * "nobody had it" without reading the other tenant's tokens: only a count
 * comes out. Non-mutating; one page compared per root child, then a walk. */
size_t cairn_radix_pages_elsewhere(const cairn_radix *t, uint64_t ns, const int32_t *tokens,
                                   size_t n_tokens);

/* Insert the first n_pages whole pages of `tokens` (n_pages * page_size
 * tokens) in namespace `ns`, whose KV is in tier-0 pages device_pages[0..n_pages).
 *
 * *n_cached receives how many leading pages the tree already had; for those
 * the ids are not read (pass -1 for pages the caller has no copy of). The tree
 * takes ownership of device_pages[*n_cached .. n_pages) only; the caller still
 * owns device_pages[0 .. *n_cached) and must release those it allocated itself
 * (they duplicate the tree's pages; ids it got from a match are the tree's own
 * and must not be released). *leaf (optional) receives the node that ends at
 * page n_pages (the root when n_pages == 0). Errors: CAIRN_EINVAL,
 * CAIRN_ENOMEM (nothing taken, *n_cached and *leaf untouched). */
int cairn_radix_insert(cairn_radix *t, uint64_t ns, const int32_t *tokens, size_t n_pages,
                       const int32_t *device_pages, size_t *n_cached, cairn_radix_node **leaf);

/* Split `node` after its first `at` pages (0 < at < pages of node). *prefix
 * receives the new parent holding those pages; `node` keeps the rest and its
 * identity. Used by the store when only part of a node can change tier. */
int cairn_radix_split(cairn_radix *t, cairn_radix_node *node, size_t at,
                      cairn_radix_node **prefix);

/* ---- locks -------------------------------------------------------------- */

/* Add (remove) one reference on `node` and every ancestor. Locking the root
 * is a no-op. Unlocking a node whose count is 0 is CAIRN_EINVAL and changes
 * nothing. */
int cairn_radix_lock(cairn_radix *t, cairn_radix_node *node);
int cairn_radix_unlock(cairn_radix *t, cairn_radix_node *node);

/* ---- what pages are worth (eviction order) ------------------------------ */

enum { CAIRN_RADIX_CLASS_ONCE = 0, CAIRN_RADIX_CLASS_SHARED = 1, CAIRN_RADIX_CLASS_LIVE = 2 };

/* Plain LRU instead (every node in one class): for comparisons, before the
 * first insert (CAIRN_EBUSY after). */
int cairn_radix_set_plain_lru(cairn_radix *t, bool plain);

/* Add (remove) one live mark on `node` and every ancestor: they go last in
 * eviction order while marked, and age like any page otherwise. Marking
 * the root is a no-op. Unmarking a node whose count is 0 is CAIRN_EINVAL and
 * changes nothing. */
int cairn_radix_mark_live(cairn_radix *t, cairn_radix_node *node);
int cairn_radix_unmark_live(cairn_radix *t, cairn_radix_node *node);

/* The path root..node was found cached by a request other than the one that
 * computed it: its nodes become SHARED. */
int cairn_radix_mark_reused(cairn_radix *t, cairn_radix_node *node);

/* The node that ends exactly after the first n_pages whole pages of tokens in
 * namespace ns, or NULL (not cached, or the pages end inside a node). Changes
 * nothing: no split, no recency. n_pages == 0 gives NULL. */
cairn_radix_node *cairn_radix_find(const cairn_radix *t, uint64_t ns, const int32_t *tokens,
                                   size_t n_pages);

/* ---- eviction support (used by the store) ------------------------------- */

/* The first node in eviction order evictable from `tier` (see the header
 * comment), or NULL when there is none. Does not change anything. */
cairn_radix_node *cairn_radix_lru(const cairn_radix *t, int tier);

/* Record that every page of `node` now lives in `tier`: the caller has
 * already updated the page records. Checks them: DEVICE needs
 * device_page >= 0 on every page, HOST host_slot >= 0 and device_page < 0,
 * DISK device_page < 0 (CAIRN_EINVAL otherwise). Moving a locked node to a
 * slower tier is CAIRN_EBUSY. */
int cairn_radix_set_tier(cairn_radix *t, cairn_radix_node *node, int tier);

/* Called once for every page leaving the tree, so its owner can release the
 * memory it names. */
typedef void (*cairn_radix_release_fn)(const cairn_radix_page *page, void *user);

/* Drop pages [keep, n) of `node` and its whole subtree from the tree. With
 * keep == 0 the node itself goes (and its handle dies). `release` (may be
 * NULL) sees each dropped page. CAIRN_EBUSY, changing nothing, when any
 * dropped node is locked; CAIRN_EINVAL for the root or keep >= pages. */
int cairn_radix_drop(cairn_radix *t, cairn_radix_node *node, size_t keep,
                     cairn_radix_release_fn release, void *user);

/* ---- inspection --------------------------------------------------------- */

/* The root (depth 0, no tokens; never dropped). */
cairn_radix_node *cairn_radix_root(const cairn_radix *t);
cairn_radix_node *cairn_radix_parent(const cairn_radix_node *node); /* NULL for the root */
int cairn_radix_node_tier(const cairn_radix_node *node);
uint64_t cairn_radix_node_ns(const cairn_radix_node *node); /* 0 for the root */
int32_t cairn_radix_node_refs(const cairn_radix_node *node);
int32_t cairn_radix_node_live(const cairn_radix_node *node);
uint32_t cairn_radix_node_uses(const cairn_radix_node *node); /* 1 + times marked reused */
/* An id no other node of this tree has had or will have (a split gives the
 * new prefix node a new id; the deeper half keeps its own). */
uint64_t cairn_radix_node_id(const cairn_radix_node *node);
/* Its class (CAIRN_RADIX_CLASS_*; the same with cairn_radix_set_plain_lru,
 * which only stops eviction from going by it). */
int cairn_radix_node_class(const cairn_radix_node *node);
size_t cairn_radix_node_n_children(const cairn_radix_node *node);
/* Child i (0 .. n_children-1, in no meaningful order), NULL out of range.
 * Valid until the next call that modifies the tree. */
cairn_radix_node *cairn_radix_node_child(const cairn_radix_node *node, size_t i);
/* Pages from the root to the end of this node. */
size_t cairn_radix_node_depth(const cairn_radix_node *node);
/* The node's own pages and their tokens ([n_pages * page_size]); the records
 * may be edited in place except `hash`. */
size_t cairn_radix_node_pages(cairn_radix_node *node, cairn_radix_page **pages);
const int32_t *cairn_radix_node_tokens(const cairn_radix_node *node);

/* Pointers to the page records of the path root..node, in order, into
 * out[0 .. depth). CAIRN_ERANGE when cap < depth (nothing written). */
int cairn_radix_path(cairn_radix_node *node, cairn_radix_page **out, size_t cap, size_t *n_out);

/* Call fn on every node except the root, parents before children; a non-zero
 * return stops the walk and is returned. fn must not modify the tree. */
int cairn_radix_visit(cairn_radix *t, int (*fn)(cairn_radix_node *node, void *user), void *user);

typedef struct {
    size_t n_nodes;                  /* excluding the root              */
    size_t pages[CAIRN_TIER_COUNT];  /* pages whose node is in each tier */
    size_t evictable[CAIRN_TIER_COUNT]; /* candidate nodes per tier     */
    size_t locked_nodes;             /* nodes with refs > 0             */
} cairn_radix_stats;

/* Counts as of now (O(1): kept up to date by every operation). */
void cairn_radix_get_stats(const cairn_radix *t, cairn_radix_stats *out);

/* Check every internal invariant (child order, counts, heaps, depths,
 * hashes). CAIRN_OK or CAIRN_ECORRUPT; for tests. O(size of tree). */
int cairn_radix_check(const cairn_radix *t);

#ifdef __cplusplus
}
#endif
#endif /* CAIRN_RADIX_H */
