/*
 * store/fetch.c — admission (cairn_kvcache_fetch): match in memory, let the
 * cost model choose, promote the chosen in-memory path and continue the
 * match on disk by page hash, round by round. Apart from promote.c because
 * a fetch op has its own life cycle (rounds, lock moves, its event).
 *
 * Fetch in brief. fetch() matches in memory, asks the cost model how many
 * leading pages are worth having on the device, locks the node that ends
 * there and starts that node's promotion (promote.c). When the choice goes
 * past the in-memory match, it also queues the first "round" of reads that
 * continue the match by page hash in LMDB (into host slots that are not in
 * the tree yet), all before the same fence. When the fence completes, the
 * in-memory path is finished first; then the round's leading hits get device
 * pages, are uploaded and inserted into the tree, the op's lock moves to the
 * new leaf, and, if every read of the round hit, the next round is queued.
 * The op's lock always sits on a node whose whole path is on the device.
 */
#include "store/tiers.h"
#include "store/store_impl.h"

#include <stdlib.h>
#include <string.h>

/* Reads of the first continuation round when few host slots are free: a
 * new prompt usually misses on disk at once, and probing it must not push
 * idle host pages down for nothing. Later rounds come only after a round
 * that hit throughout. */
#define FIRST_ROUND_MIN 4
#define NEXT_ROUND_MIN 256

/* The node on the path root..node that ends exactly after `k` pages,
 * splitting the node that contains page k-1 when needed (the root for 0).
 * On a failed split, the last node that ends before k. */
static cairn_radix_node *node_ending_at(cairn_kvcache *c, cairn_radix_node *node, size_t k)
{
    cairn_radix_node *x = node;
    while (cairn_radix_parent(x) && cairn_radix_node_depth(x) - cairn_radix_node_pages(x, NULL) >= k)
        x = cairn_radix_parent(x);
    if (!cairn_radix_parent(x) || cairn_radix_node_depth(x) == k)
        return x;
    size_t start = cairn_radix_node_depth(x) - cairn_radix_node_pages(x, NULL);
    cairn_radix_node *prefix;
    if (cairn_radix_split(c->tree, x, k - start, &prefix) == CAIRN_OK)
        return prefix;
    return cairn_radix_parent(x);
}

/* The deepest node of the path root..node whose whole path is on the device
 * (nodes are tier-uniform, so the resident prefix ends at a node). */
static cairn_radix_node *resident_end(cairn_kvcache *c, cairn_radix_node *node)
{
    size_t n_nodes;
    cairn_radix_node *last = cairn_radix_root(c->tree);
    if (kvc_path_nodes(c, node, &n_nodes))
        return last;
    for (size_t i = 0; i < n_nodes && cairn_radix_node_tier(c->nodes[i]) == CAIRN_TIER_DEVICE; i++)
        last = c->nodes[i];
    return last;
}

/* Move the op's lock to `to`. */
static void move_lock(cairn_kvcache *c, fetch_op *op, cairn_radix_node *to)
{
    if (to == op->node)
        return;
    cairn_radix_lock(c->tree, to);
    cairn_radix_unlock(c->tree, op->node);
    op->node = to;
}

/* Reads that were queued but will not be waited for: their slots go back
 * when their completions arrive (poll sees SLOT_ORPHAN). */
static void orphan_round(cairn_kvcache *c, fetch_op *op)
{
    for (size_t i = 0; i < op->n_round; i++)
        c->slot_state[op->round[i]] = SLOT_ORPHAN;
    op->n_reads = 0;
    op->n_round = 0;
}

static void release_round(cairn_kvcache *c, fetch_op *op)
{
    for (size_t i = 0; i < op->n_round; i++) {
        c->slot_state[op->round[i]] = SLOT_IDLE;
        kvc_host_release(c, op->round[i]);
    }
    op->n_round = 0;
}

/* Queue reads of the next pages of the op's tokens by page hash, chained
 * from the end of the op's node. The first round only takes the host slots
 * that are free (at least FIRST_ROUND_MIN); later ones make room. */
static void queue_round(cairn_kvcache *c, fetch_op *op, bool first)
{
    size_t ps = (size_t)c->L.page_size;
    size_t remaining = op->n_target - op->next;
    size_t avail = (size_t)cairn_host_pool_available(c->host);
    size_t floor_n = first ? FIRST_ROUND_MIN : NEXT_ROUND_MIN;
    size_t want = avail > floor_n ? avail : floor_n;
    if (want > remaining)
        want = remaining;
    cairn_page_hash h = cairn_radix_ns_seed(c->tree, op->ns);
    if (cairn_radix_parent(op->node)) {
        cairn_radix_page *pg;
        size_t np = cairn_radix_node_pages(op->node, &pg);
        h = pg[np - 1].hash;
    }
    op->n_round = 0;
    for (size_t i = 0; i < want; i++) {
        kvc_host_room(c, 1);
        int32_t slot;
        if (cairn_host_pool_alloc(c->host, 1, &slot) != CAIRN_OK)
            break;
        const int32_t *tok = op->tokens + (op->next + i) * ps;
        h = cairn_page_hash_next(h, tok, ps);
        if (cairn_disk_read(c->disk, h, tok, cairn_host_pool_slot(c->host, slot),
                            COOKIE_READ | (uint64_t)slot) != CAIRN_OK) {
            kvc_host_release(c, slot);
            break;
        }
        c->slot_state[slot] = SLOT_LOADING;
        op->round[op->n_round++] = slot;
    }
    if (op->n_round == 0 && want > 0 && op->status == CAIRN_OK)
        op->status = CAIRN_EFULL; /* no host slot to read into */
    op->n_reads += op->n_round;
}

/* Take the leading hits of the finished round into the tree, on the
 * device. True when the round hit throughout and there is more to read. */
static bool absorb_round(cairn_kvcache *c, fetch_op *op)
{
    size_t hits = 0;
    while (hits < op->n_round && c->slot_state[op->round[hits]] == SLOT_LOADED)
        hits++;
    if (hits < op->n_round && (c->slot_seen[op->round[hits]] & SLOT_SEEN))
        op->share_wanted = true; /* where the answer ends, another replica asked too */
    /* ... and is computing it, for Redis: told by any page of the round
     * from there on, not only the first. Replicas of a burst mark the pages
     * they look up first, in whatever order their pipelines reach Redis, so
     * the first missing page may carry this replica's own mark while the
     * rest carry the mark of the one computing them. */
    for (size_t i = hits; i < op->n_round && !op->busy_elsewhere; i++)
        if (c->slot_seen[op->round[i]] & SLOT_BUSY)
            op->busy_elsewhere = true;
    uint8_t shared_of[NEXT_ROUND_MIN];
    bool marks = hits <= sizeof shared_of;
    bool all = hits == op->n_round;
    size_t base = op->next;
    int32_t *ids = malloc((base + hits + 1) * sizeof *ids);
    if (!ids) {
        release_round(c, op);
        op->status = CAIRN_ENOMEM;
        return false;
    }
    for (size_t i = 0; i < base; i++)
        ids[i] = -1; /* the tree has these */
    size_t got = 0;
    double up_seconds = 0;
    for (; got < hits; got++) {
        if (cairn_kvcache_alloc(c, 1, &ids[base + got]) != CAIRN_OK) {
            op->status = CAIRN_EFULL;
            break;
        }
        double t0 = cairn_now();
        int rc = kvc_page_to_device(c, ids[base + got], op->round[got]);
        up_seconds += cairn_now() - t0;
        if (rc) {
            cairn_page_pool_release(c->dev, 1, &ids[base + got]);
            op->status = CAIRN_EBACKEND;
            break;
        }
        uint8_t from_shared = c->slot_shared[op->round[got]];
        op->from_shared += from_shared;
        if (marks)
            shared_of[got] = from_shared;
    }
    if (got < hits)
        all = false;
    release_round(c, op);
    kvc_note_upload(c, got, up_seconds);
    if (got == 0) {
        free(ids);
        return false;
    }
    size_t n_cached;
    cairn_radix_node *leaf;
    if (cairn_radix_insert(c->tree, op->ns, op->tokens, base + got, ids, &n_cached, &leaf) !=
        CAIRN_OK) {
        cairn_page_pool_release(c->dev, (int32_t)got, ids + base);
        free(ids);
        op->status = CAIRN_ENOMEM;
        return false;
    }
    /* Pages someone inserted while our reads were in flight are the tree's;
     * our copies of them go back. */
    size_t dup_end = n_cached < base + got ? n_cached : base + got;
    if (dup_end > base)
        cairn_page_pool_release(c->dev, (int32_t)(dup_end - base), ids + base);
    free(ids);
    kvc_note_stored(c, leaf, base + got > n_cached ? base + got - n_cached : 0);
    kvc_announce_node(c, leaf);
    /* Pages that came from the shared tier have their copy there already. */
    size_t depth = 0;
    if (c->shared && marks && kvc_path_reserve(c, base + got) == CAIRN_OK &&
        cairn_radix_path(leaf, c->path, base + got, &depth) == CAIRN_OK && depth == base + got)
        for (size_t i = 0; i < got; i++)
            if (shared_of[i])
                c->path[base + i]->flags |= PAGE_SHARED;
    c->stats.tier[CAIRN_TIER_DISK].promoted_pages += got;
    c->stats.tier[CAIRN_TIER_HOST].promoted_pages += got;
    c->stats.promoted_pages += got;
    /* Those pages may be in a lower tier: stop where the device path ends. */
    cairn_radix_node *end = resident_end(c, leaf);
    if (cairn_radix_node_depth(end) < cairn_radix_node_depth(op->node))
        end = op->node; /* cannot happen (the op's path is locked); be safe */
    move_lock(c, op, end);
    if (end != leaf)
        all = false;
    op->next = cairn_radix_node_depth(op->node);
    return all && op->next < op->n_target;
}

static int add_fetch(cairn_kvcache *c, fetch_op *op)
{
    if (c->n_fetches == c->cap_fetches) {
        size_t cap = c->cap_fetches ? 2 * c->cap_fetches : 8;
        fetch_op **nf = realloc(c->fetches, cap * sizeof *nf);
        if (!nf)
            return CAIRN_ENOMEM;
        c->fetches = nf;
        c->cap_fetches = cap;
    }
    c->fetches[c->n_fetches++] = op;
    return CAIRN_OK;
}

static void free_fetch(fetch_op *op)
{
    free(op->child_tokens);
    free(op->tokens);
    free(op->origin);
    free(op->round);
    free(op);
}

/* Post the op's event and count hits and misses per tier. */
static void complete_fetch(cairn_kvcache *c, fetch_op *op)
{
    cairn_kvcache_event ev = {.cookie = op->cookie, .status = op->status,
                              .kind = CAIRN_KVCACHE_EV_FETCH, .node = op->node,
                              .skipped_pages = op->skipped, .lost_pages = op->lost,
                              .shared_pages = op->from_shared,
                              .share_wanted = op->share_wanted && c->share_policy != CAIRN_SHARE_NONE,
                              .busy_elsewhere = op->busy_elsewhere};
    ev.resident_pages = cairn_radix_node_depth(op->node);
    /* A prefix seen twice is worth having where every replica finds it. */
    if (ev.resident_pages > 0) {
        /* with the tree page its partial match ends in, when there is one:
         * found again by parent, on another replica or after a restart */
        size_t ps = (size_t)c->L.page_size, at = ev.resident_pages * ps;
        cairn_radix_node *child = NULL;
        if (op->n_tokens > at)
            kvc_partial_best(c, op->ns, op->node, op->tokens + at,
                             op->n_tokens - at < ps - 1 ? op->n_tokens - at : ps - 1, &child);
        kvc_share_path(c, op->node, child);
        /* ... and worth more than pages nobody found again (eviction order) */
        cairn_radix_mark_reused(c->tree, op->node);
        /* ... and worth keeping on this replica's disk across a crash */
        kvc_behind_note(c, op->node, child);
    }
    for (size_t i = 0; i < ev.resident_pages && i < op->n_target; i++)
        ev.from_tier[op->origin[i]]++;
    size_t ps = (size_t)c->L.page_size;
    size_t looked = op->n_lookup;
    /* the disk tier's hits include the rows of the page found by parent */
    size_t child_hit = op->child_slot < 0 && op->child_matched > 0 ? (size_t)op->child_matched : 0;
    for (int t = 0; t < CAIRN_TIER_COUNT; t++) {
        if ((t == CAIRN_TIER_HOST && !c->host) || (t == CAIRN_TIER_DISK && !c->disk))
            break;
        size_t hit = ev.from_tier[t] * ps + (t == CAIRN_TIER_DISK ? child_hit : 0);
        if (hit > looked)
            hit = looked;
        c->stats.tier[t].hit_tokens += hit;
        c->stats.tier[t].miss_tokens += looked - hit;
        looked -= hit;
    }
    c->stats.fetches++;
    c->stats.fetch_skipped_pages += op->skipped;
    c->stats.shared_hit_tokens += op->from_shared * ps + (op->child_shared ? child_hit : 0);
    if (kvc_push_event(c, ev) != CAIRN_OK) {
        /* Nobody will hear of this lock: give it back. */
        cairn_radix_unlock(c->tree, op->node);
    }
    free_fetch(op);
}

/* ---- the partial page, read by parent -------------------------------------
 *
 * The match usually ends inside a page: the page after the last whole-page
 * hit holds the request's next tokens and then others (another question
 * about the same document). In memory, partial() finds such a page among
 * the tree's children and the tails. After a restart, or on a replica that
 * took the whole pages from Redis, memory has none, and a read by hash
 * cannot find it (its key covers the tokens the request does not share):
 * the disk's list of children can (tiers.h, cairn_disk_read_child). The
 * page it returns becomes a tail in host RAM, where partial() takes it
 * from, like any tail. One read per fetch, only when memory has nothing. */

/* The hash of the op's last page (the op's node is never the root here). */
static cairn_page_hash node_hash(cairn_radix_node *node)
{
    cairn_radix_page *pg;
    size_t np = cairn_radix_node_pages(node, &pg);
    return pg[np - 1].hash;
}

/* Tokens of the request after the op's node worth looking for: up to a page
 * less one. 0 when there is no reason to look: an error, a sequence's first
 * page (the seed's list would be every prompt), nothing after the node, the
 * cost model stopping before the request's whole pages ended (the next page
 * may be whole on disk; it was not worth reading), or a page in memory that
 * already continues the match. */
static size_t child_wanted(cairn_kvcache *c, fetch_op *op)
{
    const size_t ps = (size_t)c->L.page_size;
    const size_t at = op->next * ps;
    if (!c->disk || !c->host || op->status != CAIRN_OK || op->child_asked || op->next == 0 ||
        op->n_tokens <= at || (op->next == op->n_target && op->n_target < op->n_pages_req))
        return 0;
    size_t limit = op->n_tokens - at < ps - 1 ? op->n_tokens - at : ps - 1;
    if (kvc_partial_best(c, op->ns, op->node, op->tokens + at, limit, NULL) > 0)
        return 0;
    return limit;
}

static bool queue_child(cairn_kvcache *c, fetch_op *op, size_t limit)
{
    op->child_asked = true;
    kvc_host_room(c, 1);
    int32_t slot;
    if (cairn_host_pool_alloc(c->host, 1, &slot) != CAIRN_OK)
        return false;
    const int32_t *next = op->tokens + op->next * (size_t)c->L.page_size;
    if (cairn_disk_read_child(c->disk, node_hash(op->node), next, limit,
                              cairn_host_pool_slot(c->host, slot), COOKIE_CHILD | (uint64_t)slot) !=
        CAIRN_OK) {
        kvc_host_release(c, slot);
        return false;
    }
    /* not a rate sample: a walk of a list, not a transfer of pages */
    c->slot_state[slot] = SLOT_LOADING;
    op->child_slot = slot;
    return true;
}

/* The read child came back (its completion precedes the fence's): a page
 * found becomes a tail, its first page_size - 1 tokens (a kept tail's own
 * tokens) usable by any request that shares some of them. */
static void absorb_child(cairn_kvcache *c, fetch_op *op)
{
    int32_t slot = op->child_slot;
    op->child_slot = -1;
    if (c->slot_state[slot] == SLOT_LOADED && op->child_tokens && op->child_matched > 0) {
        /* a kept tail comes back padded with -1 (share.c): its own length */
        size_t n = 0;
        while (n < (size_t)c->L.page_size - 1 && op->child_tokens[n] >= 0)
            n++;
        if (kvc_tail_adopt_host(c, op->ns, node_hash(op->node), op->child_tokens, n, slot,
                                op->child_shared ? CAIRN_KVCACHE_FROM_SHARED : CAIRN_TIER_DISK) ==
            CAIRN_OK)
            c->stats.child_pages++;
        else
            op->child_matched = 0; /* not kept: not a hit */
        return;
    }
    c->slot_state[slot] = SLOT_IDLE;
    kvc_host_release(c, slot);
}

void kvc_child_done(cairn_kvcache *c, int32_t slot, const cairn_disk_completion *done)
{
    for (size_t j = 0; j < c->n_fetches; j++) {
        fetch_op *op = c->fetches[j];
        if (op->child_slot != slot)
            continue;
        bool ok = done->status == CAIRN_OK && done->data &&
                  done->bytes == (size_t)c->L.page_size * sizeof(int32_t);
        c->slot_state[slot] = ok ? SLOT_LOADED : SLOT_MISSED;
        if (ok) {
            free(op->child_tokens);
            op->child_tokens = done->data; /* taken */
            op->child_matched = done->matched;
            op->child_shared = done->shared;
        }
        return;
    }
    /* nobody waits for it (its op was finished early) */
    c->slot_state[slot] = SLOT_IDLE;
    kvc_host_release(c, slot);
}

/* Drive the op after its fence completed (or at once when it had nothing
 * to wait for). Returns true when the op is finished (and freed). */
bool kvc_advance_fetch(cairn_kvcache *c, fetch_op *op, double fence_seconds)
{
    if (op->n_reads) {
        kvc_note_disk_round(c, op->n_reads, fence_seconds);
        op->n_reads = 0;
    }
    if (op->promoting) {
        op->promoting = false;
        size_t resident;
        int st = kvc_finish_path(c, op->node, &resident);
        if (resident < cairn_radix_node_depth(op->node)) {
            if (op->status == CAIRN_OK)
                op->status = st != CAIRN_OK ? st : CAIRN_EFULL;
            size_t lost_at = resident;
            move_lock(c, op, resident_end(c, op->node));
            if (st == CAIRN_ENOTFOUND) {
                op->lost++;
                /* The pages from the lost one on are no use to anyone. */
                cairn_kvcache_forget(c, op->ns, op->tokens,
                                     op->n_target * (size_t)c->L.page_size, lost_at);
            }
            release_round(c, op);
        }
    }
    if (op->n_round) {
        bool more = absorb_round(c, op);
        if (more && add_fetch(c, op) == CAIRN_OK) {
            queue_round(c, op, false);
            if (op->n_round && cairn_disk_fence(c->disk, COOKIE_FETCH | op->id) == CAIRN_OK)
                return false;
            c->n_fetches--; /* it is the last one: just added */
            orphan_round(c, op);
        }
    }
    size_t limit;
    if (op->child_slot >= 0) {
        absorb_child(c, op);
    } else if ((limit = child_wanted(c, op)) > 0 && queue_child(c, op, limit)) {
        if (add_fetch(c, op) == CAIRN_OK) {
            if (cairn_disk_fence(c->disk, COOKIE_FETCH | op->id) == CAIRN_OK)
                return false;
            c->n_fetches--;
        }
        op->child_slot = -1; /* kvc_child_done finds no op: it gives the slot back */
    }
    complete_fetch(c, op);
    return true;
}

/* Fetch, step 1: match tokens[0 .. n_match) in the tree and find where the
 * usable path ends: before the first page whose only copy was lost (a DISK
 * page that is not on disk). Such pages are no use to anyone; drop them now
 * so nobody matches them again. On return c->nodes[0 .. *n_nodes) is the
 * path of m->node, *usable the pages of it before the first lost one, and
 * *broken whether there is one. An error of the match is returned. */
static int match_usable(cairn_kvcache *c, fetch_op *op, const int32_t *tokens, size_t n_match,
                        cairn_radix_match_result *m, size_t *n_nodes, size_t *usable,
                        bool *broken)
{
    int rc = cairn_radix_match(c->tree, op->ns, tokens, n_match, m);
    if (rc != CAIRN_OK && rc != CAIRN_ENOMEM)
        return rc;
    for (int attempt = 0; attempt < 2; attempt++) {
        if ((rc = kvc_path_nodes(c, m->node, n_nodes)) != CAIRN_OK)
            return rc;
        *usable = 0;
        *broken = false;
        cairn_radix_node *lost_node = NULL;
        size_t lost_keep = 0;
        for (size_t i = 0; i < *n_nodes && !*broken; i++) {
            cairn_radix_page *pg;
            size_t np = cairn_radix_node_pages(c->nodes[i], &pg);
            bool disk = cairn_radix_node_tier(c->nodes[i]) == CAIRN_TIER_DISK;
            for (size_t j = 0; j < np; j++) {
                if (disk && pg[j].host_slot < 0 && ((pg[j].flags & PAGE_LOST) || !pg[j].on_disk)) {
                    *broken = true;
                    lost_node = c->nodes[i];
                    lost_keep = j;
                    break;
                }
                (*usable)++;
            }
        }
        if (!*broken || attempt == 1)
            break;
        if (cairn_radix_drop(c->tree, lost_node, lost_keep, kvc_release_page, c) != CAIRN_OK)
            break; /* someone holds it: just stop before it */
        c->stats.lost_pages++;
        op->lost++;
        rc = cairn_radix_match(c->tree, op->ns, tokens, n_match, m);
        if (rc != CAIRN_OK && rc != CAIRN_ENOMEM)
            return rc;
    }
    return CAIRN_OK;
}

/* Fetch, step 2: the tier of each of the n_cand candidate pages (the first
 * `usable` from the path in c->nodes[0 .. n_nodes), the rest on disk), the
 * cost model's choice among them (op->n_target, op->skipped), and a copy of
 * the chosen pages' tokens. CAIRN_ENOMEM when the op's arrays cannot be
 * allocated. */
static int choose_target(cairn_kvcache *c, fetch_op *op, const int32_t *tokens, size_t n_tokens,
                         size_t n_nodes, size_t usable, size_t n_cand)
{
    size_t ps = (size_t)c->L.page_size;
    op->origin = malloc(n_cand + 1);
    op->tokens = malloc((n_cand * ps + ps) * sizeof *op->tokens);
    if (!op->origin || !op->tokens)
        return CAIRN_ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < n_nodes && k < usable; i++) {
        size_t np = cairn_radix_node_pages(c->nodes[i], NULL);
        int tier = cairn_radix_node_tier(c->nodes[i]);
        for (size_t j = 0; j < np && k < usable; j++)
            op->origin[k++] = (uint8_t)tier;
    }
    for (; k < n_cand; k++)
        op->origin[k] = CAIRN_TIER_DISK;
    size_t target = kvc_choose_pages(c, op->origin, n_cand);
    op->n_target = target;
    op->skipped = usable > target ? usable - target : 0;
    /* and up to a page less one past them: the partial page (child_wanted) */
    op->n_tokens = target * ps + ps - 1 < n_tokens ? target * ps + ps - 1 : n_tokens;
    memcpy(op->tokens, tokens, op->n_tokens * sizeof *tokens);
    return CAIRN_OK;
}

/* Fetch, step 3: lock the node that ends where the target leaves the
 * in-memory match (n_mem pages of `matched`), queue its path's disk reads
 * and, past the match, the first continuation round, all before one fence;
 * with nothing to wait for (or no way to wait), finish the op now. */
static void start_fetch(cairn_kvcache *c, fetch_op *op, cairn_radix_node *matched, size_t n_mem)
{
    size_t target = op->n_target;
    size_t in_mem = target < n_mem ? target : n_mem;
    cairn_radix_node *node = node_ending_at(c, matched, in_mem);
    cairn_radix_lock(c->tree, node);
    op->node = node;
    op->next = cairn_radix_node_depth(node);
    op->promoting = true;
    c->stats.promotions++;

    size_t n_nodes, queued = 0;
    bool pending = false;
    if (kvc_path_nodes(c, node, &n_nodes) == CAIRN_OK && c->disk)
        kvc_queue_path_reads(c, n_nodes, &queued, &pending);
    op->n_reads = queued;
    if (target > op->next && op->next == n_mem && c->disk) {
        op->round = malloc((target - op->next) * sizeof *op->round);
        if (op->round)
            queue_round(c, op, true);
        else
            op->status = CAIRN_ENOMEM;
    }
    op->id = ++c->next_op;
    if ((queued || pending || op->n_round) && add_fetch(c, op) == CAIRN_OK) {
        if (cairn_disk_fence(c->disk, COOKIE_FETCH | op->id) == CAIRN_OK)
            return;
        c->n_fetches--;
    }
    /* Nothing to wait for (or no way to wait): finish now. */
    orphan_round(c, op);
    kvc_advance_fetch(c, op, 0);
}

int cairn_kvcache_fetch(cairn_kvcache *c, uint64_t ns, const int32_t *tokens, size_t n_tokens,
                        size_t max_pages, uint64_t cookie)
{
    if (!c || (!tokens && n_tokens))
        return CAIRN_EINVAL;
    size_t ps = (size_t)c->L.page_size;
    size_t n_pages = n_tokens / ps;
    if (n_pages > max_pages)
        n_pages = max_pages;
    /* Tokens the request asks about, for the hit/miss counts: all of them,
     * unless max_pages stops the lookup earlier. */
    size_t n_lookup = n_tokens / ps > max_pages ? max_pages * ps : n_tokens;
    fetch_op *op = calloc(1, sizeof *op);
    if (!op)
        return CAIRN_ENOMEM;
    op->cookie = cookie;
    op->ns = ns;
    op->n_lookup = n_lookup;
    op->n_pages_req = n_pages;
    op->child_slot = -1;

    cairn_radix_match_result m;
    size_t n_nodes, usable = 0;
    bool broken = false;
    int rc = match_usable(c, op, tokens, n_pages * ps, &m, &n_nodes, &usable, &broken);
    if (rc != CAIRN_OK) {
        free(op);
        return rc;
    }
    size_t n_mem = cairn_radix_node_depth(m.node);
    if (usable > n_mem)
        usable = n_mem;
    /* Candidates: the usable in-memory pages, then (when the in-memory path
     * is whole and there is a disk) every further whole page of the
     * request, to be looked up by hash. */
    size_t n_cand = usable;
    if (!broken && usable == n_mem && c->disk)
        n_cand = n_pages;
    if (choose_target(c, op, tokens, n_tokens, n_nodes, usable, n_cand) != CAIRN_OK) {
        free_fetch(op);
        return CAIRN_ENOMEM;
    }
    start_fetch(c, op, m.node, n_mem);
    return CAIRN_OK;
}
