/*
 * radix/radix.c — the page-granular radix tree (see radix.h for the model).
 *
 * Internals in one paragraph: every node keeps its children in an array
 * sorted by a 64-bit key of the child's first page (binary search, then a
 * token compare to rule out key collisions). Per tier there is a binary
 * min-heap, keyed by (class, last use), of the nodes evictable from that
 * tier (node_before: the class first, see "Eviction order" in radix.h); a node
 * can only be in the heap of its own tier, so one heap index per node is
 * enough. Whether a node is evictable depends on its refs, its tier and the
 * tiers of its children, so each node counts its children per tier and every
 * operation that changes one of those re-checks the node and its parent.
 */
#include "radix/radix.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h> /* sibling keys (node_key); page keys are pagekey.h's */

struct cairn_radix_node {
    cairn_radix_node *parent;
    cairn_radix_node **children; /* sorted by key                          */
    uint32_t n_children, cap_children;
    uint32_t child_tier_count[CAIRN_TIER_COUNT];
    uint64_t ns;              /* namespace word: the same for a whole subtree */
    uint64_t key;             /* node_key(): of ns and the first page        */
    int32_t *tokens;          /* [n_pages * page_size]                      */
    cairn_radix_page *pages;  /* [n_pages]                                  */
    size_t n_pages;
    size_t depth;             /* pages from the root to the end of the node */
    int32_t refs;
    int32_t live;             /* like refs, for live marks: this node's and below */
    uint32_t uses;            /* sequences that found it cached, plus one     */
    uint64_t id;              /* unique in the tree's life: never reused      */
    int tier;
    uint64_t last_use;
    int64_t heap_pos;         /* index in heaps[tier], -1 when not there    */
};

typedef struct {
    cairn_radix_node **items;
    size_t n, cap;
} node_heap;

struct cairn_radix {
    int page_size;
    cairn_page_hash seed;
    cairn_radix_node root;
    uint64_t clock;
    uint64_t next_id;
    bool plain_lru;           /* every node in class ONCE (comparisons)     */
    node_heap heaps[CAIRN_TIER_COUNT];
    size_t n_nodes;
    size_t tier_pages[CAIRN_TIER_COUNT];
    size_t locked_nodes;
};

/* ---- hashing ------------------------------------------------------------ */

/* Key that orders siblings: a plain (unchained) hash of the first page,
 * seeded by the namespace word (only the root's children differ in it, but
 * one rule for every node keeps split and check simple). */
static uint64_t node_key(uint64_t ns, const int32_t *tokens, int page_size)
{
    return XXH3_64bits_withSeed(tokens, (size_t)page_size * sizeof(int32_t), ns);
}

cairn_page_hash cairn_radix_ns_seed(const cairn_radix *t, uint64_t ns)
{
    return cairn_page_chain_seed(t->seed, ns);
}

/* h_{i-1} for the first page of `n`: the end of its parent, or the seed of
 * its namespace under the root. */
static cairn_page_hash chain_start(const cairn_radix *t, const cairn_radix_node *parent,
                                   uint64_t ns)
{
    return parent == &t->root ? cairn_radix_ns_seed(t, ns)
                              : parent->pages[parent->n_pages - 1].hash;
}

/* ---- heaps -------------------------------------------------------------- */

/* The eviction class (radix.h, "Eviction order"): what a node's pages are
 * worth keeping for, beyond their recency. */
static int class_of(const cairn_radix_node *n)
{
    if (n->live > 0)
        return CAIRN_RADIX_CLASS_LIVE;
    if (n->uses >= 2 || n->n_children >= 2)
        return CAIRN_RADIX_CLASS_SHARED;
    return CAIRN_RADIX_CLASS_ONCE;
}

/* ... and the class eviction goes by (one class for plain LRU). */
static int node_class(const cairn_radix *t, const cairn_radix_node *n)
{
    return t->plain_lru ? CAIRN_RADIX_CLASS_ONCE : class_of(n);
}

/* Whether a leaves its tier before b. */
static bool node_before(const cairn_radix *t, const cairn_radix_node *a,
                        const cairn_radix_node *b)
{
    int ca = node_class(t, a), cb = node_class(t, b);
    return ca != cb ? ca < cb : a->last_use < b->last_use;
}

static void heap_place(node_heap *h, size_t i, cairn_radix_node *n)
{
    h->items[i] = n;
    n->heap_pos = (int64_t)i;
}

static void heap_up(const cairn_radix *t, node_heap *h, size_t i)
{
    cairn_radix_node *n = h->items[i];
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!node_before(t, n, h->items[p]))
            break;
        heap_place(h, i, h->items[p]);
        i = p;
    }
    heap_place(h, i, n);
}

static void heap_down(const cairn_radix *t, node_heap *h, size_t i)
{
    cairn_radix_node *n = h->items[i];
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const cairn_radix_node *best = n;
        if (l < h->n && node_before(t, h->items[l], best)) {
            m = l;
            best = h->items[l];
        }
        if (r < h->n && node_before(t, h->items[r], best))
            m = r;
        if (m == i)
            break;
        heap_place(h, i, h->items[m]);
        i = m;
    }
    heap_place(h, i, n);
}

/* Grows the heap so that a later push cannot fail. */
static int heap_reserve(node_heap *h, size_t n)
{
    if (n <= h->cap)
        return CAIRN_OK;
    size_t cap = h->cap ? h->cap : 64;
    while (cap < n)
        cap *= 2;
    cairn_radix_node **items = realloc(h->items, cap * sizeof *items);
    if (!items)
        return CAIRN_ENOMEM;
    h->items = items;
    h->cap = cap;
    return CAIRN_OK;
}

static void heap_remove(const cairn_radix *t, node_heap *h, cairn_radix_node *n)
{
    size_t i = (size_t)n->heap_pos;
    n->heap_pos = -1;
    h->n--;
    if (i == h->n)
        return;
    cairn_radix_node *last = h->items[h->n];
    heap_place(h, i, last);
    heap_up(t, h, i);
    heap_down(t, h, (size_t)last->heap_pos);
}

/* ---- evictability ------------------------------------------------------- */

static bool is_evictable(const cairn_radix *t, const cairn_radix_node *n)
{
    if (n == &t->root || n->refs > 0)
        return false;
    for (int k = 0; k <= n->tier; k++)
        if (n->child_tier_count[k])
            return false;
    return true;
}

/* Put the node in, or take it out of, its tier's heap to match its state.
 * Heaps are reserved for every node ahead of time (see node_count_changed),
 * so this cannot fail. */
static void refresh(cairn_radix *t, cairn_radix_node *n)
{
    if (n == &t->root)
        return;
    bool want = is_evictable(t, n);
    if (n->heap_pos >= 0 && !want) {
        heap_remove(t, &t->heaps[n->tier], n);
    } else if (n->heap_pos < 0 && want) {
        node_heap *h = &t->heaps[n->tier];
        h->items[h->n] = n;
        n->heap_pos = (int64_t)h->n;
        h->n++;
        heap_up(t, h, h->n - 1);
    }
}

/* A node's key changed (its class, or its recency either way): restore
 * its heap's order. */
static void rekey(cairn_radix *t, cairn_radix_node *n)
{
    if (n == &t->root || n->heap_pos < 0)
        return;
    node_heap *h = &t->heaps[n->tier];
    heap_up(t, h, (size_t)n->heap_pos);
    heap_down(t, h, (size_t)n->heap_pos);
}

/* Every heap can hold every node, so pushes never allocate. */
static int reserve_heaps(cairn_radix *t, size_t n_nodes)
{
    for (int k = 0; k < CAIRN_TIER_COUNT; k++) {
        int rc = heap_reserve(&t->heaps[k], n_nodes);
        if (rc)
            return rc;
    }
    return CAIRN_OK;
}

/* ---- children ----------------------------------------------------------- */

/* Index of the first child whose key is >= key. */
static size_t child_lower_bound(const cairn_radix_node *n, uint64_t key)
{
    size_t lo = 0, hi = n->n_children;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (n->children[mid]->key < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static cairn_radix_node *find_child(const cairn_radix *t, const cairn_radix_node *n,
                                    uint64_t ns, const int32_t *page)
{
    const uint64_t key = node_key(ns, page, t->page_size);
    size_t bytes = (size_t)t->page_size * sizeof(int32_t);
    for (size_t i = child_lower_bound(n, key); i < n->n_children && n->children[i]->key == key; i++)
        if (n->children[i]->ns == ns && memcmp(n->children[i]->tokens, page, bytes) == 0)
            return n->children[i];
    return NULL;
}

static int reserve_child(cairn_radix_node *n)
{
    if (n->n_children < n->cap_children)
        return CAIRN_OK;
    uint32_t cap = n->cap_children ? n->cap_children * 2 : 2;
    cairn_radix_node **c = realloc(n->children, cap * sizeof *c);
    if (!c)
        return CAIRN_ENOMEM;
    n->children = c;
    n->cap_children = cap;
    return CAIRN_OK;
}

/* Needs reserve_child(parent) first. */
static void add_child(cairn_radix_node *parent, cairn_radix_node *child)
{
    size_t i = child_lower_bound(parent, child->key);
    memmove(parent->children + i + 1, parent->children + i,
            (parent->n_children - i) * sizeof *parent->children);
    parent->children[i] = child;
    parent->n_children++;
    parent->child_tier_count[child->tier]++;
    child->parent = parent;
}

/* Its class may have changed with its children's count. */
static void children_changed(cairn_radix *t, cairn_radix_node *n)
{
    rekey(t, n);
}

static void remove_child(cairn_radix_node *parent, cairn_radix_node *child)
{
    size_t i = child_lower_bound(parent, child->key);
    while (i < parent->n_children && parent->children[i] != child)
        i++;
    if (i == parent->n_children)
        return; /* not reachable while the tree is consistent */
    memmove(parent->children + i, parent->children + i + 1,
            (parent->n_children - i - 1) * sizeof *parent->children);
    parent->n_children--;
    parent->child_tier_count[child->tier]--;
}

/* ---- create / free ------------------------------------------------------ */

int cairn_radix_create(int page_size, cairn_page_hash seed, cairn_radix **out)
{
    if (page_size < 1 || page_size > 65536 || !out)
        return CAIRN_EINVAL;
    cairn_radix *t = calloc(1, sizeof *t);
    if (!t)
        return CAIRN_ENOMEM;
    t->page_size = page_size;
    t->seed = seed;
    t->root.heap_pos = -1;
    t->root.tier = CAIRN_TIER_DEVICE;
    t->next_id = 1;
    *out = t;
    return CAIRN_OK;
}

static void free_node(cairn_radix_node *n)
{
    free(n->children);
    free(n->tokens);
    free(n->pages);
    free(n);
}

static void free_subtree(cairn_radix_node *n, bool self)
{
    /* Iterative, so a deep chain of turns cannot overflow the stack: detach
     * children one at a time and descend. */
    cairn_radix_node *cur = n;
    while (cur) {
        if (cur->n_children) {
            cur = cur->children[--cur->n_children];
            continue;
        }
        cairn_radix_node *parent = cur->parent;
        if (cur == n) {
            if (self)
                free_node(cur);
            break;
        }
        free_node(cur);
        cur = parent;
    }
}

void cairn_radix_free(cairn_radix *t)
{
    if (!t)
        return;
    free_subtree(&t->root, false);
    free(t->root.children);
    for (int k = 0; k < CAIRN_TIER_COUNT; k++)
        free(t->heaps[k].items);
    free(t);
}

int cairn_radix_page_size(const cairn_radix *t) { return t ? t->page_size : 0; }

/* ---- recency ------------------------------------------------------------ */

static void touch_path(cairn_radix *t, cairn_radix_node *n)
{
    uint64_t now = ++t->clock;
    for (; n && n != &t->root; n = n->parent) {
        n->last_use = now;
        if (n->heap_pos >= 0)
            heap_down(t, &t->heaps[n->tier], (size_t)n->heap_pos);
    }
}

/* ---- split -------------------------------------------------------------- */

static int split_node(cairn_radix *t, cairn_radix_node *n, size_t at, cairn_radix_node **prefix_out)
{
    size_t ps = (size_t)t->page_size;
    int rc = reserve_heaps(t, t->n_nodes + 1);
    if (rc)
        return rc;
    cairn_radix_node *p = calloc(1, sizeof *p);
    int32_t *rest_tokens = malloc((n->n_pages - at) * ps * sizeof *rest_tokens);
    cairn_radix_page *rest_pages = malloc((n->n_pages - at) * sizeof *rest_pages);
    cairn_radix_node **kids = malloc(2 * sizeof *kids);
    if (!p || !rest_tokens || !rest_pages || !kids) {
        free(p);
        free(rest_tokens);
        free(rest_pages);
        free(kids);
        return CAIRN_ENOMEM;
    }
    memcpy(rest_tokens, n->tokens + at * ps, (n->n_pages - at) * ps * sizeof *rest_tokens);
    memcpy(rest_pages, n->pages + at, (n->n_pages - at) * sizeof *rest_pages);

    /* The prefix takes over the old arrays (shrinking is not worth a copy)
     * and the node's place among its parent's children: same first page, so
     * the same key and the same sorted position. */
    p->tokens = n->tokens;
    p->pages = n->pages;
    p->n_pages = at;
    p->ns = n->ns;
    p->key = n->key;
    p->parent = n->parent;
    p->depth = n->depth - (n->n_pages - at);
    p->refs = n->refs;
    p->live = n->live;
    p->uses = n->uses;
    p->id = t->next_id++;
    p->tier = n->tier;
    p->last_use = n->last_use;
    p->heap_pos = -1;
    p->children = kids;
    p->cap_children = 2;
    cairn_radix_node *parent = n->parent;
    for (uint32_t i = 0; i < parent->n_children; i++)
        if (parent->children[i] == n)
            parent->children[i] = p;

    n->tokens = rest_tokens;
    n->pages = rest_pages;
    n->n_pages -= at;
    n->key = node_key(n->ns, rest_tokens, t->page_size);
    add_child(p, n);

    t->n_nodes++;
    if (p->refs > 0)
        t->locked_nodes++;
    /* p has a child in its own tier, so it is not evictable; n's children
     * did not change. */
    if (prefix_out)
        *prefix_out = p;
    return CAIRN_OK;
}

int cairn_radix_split(cairn_radix *t, cairn_radix_node *node, size_t at, cairn_radix_node **prefix)
{
    if (!t || !node || node == &t->root || at == 0 || at >= node->n_pages)
        return CAIRN_EINVAL;
    return split_node(t, node, at, prefix);
}

/* ---- match / insert ----------------------------------------------------- */

/* Walk as far as whole pages match; split where the match ends mid-node. */
static int walk(cairn_radix *t, uint64_t ns, const int32_t *tokens, size_t n_pages_in,
                cairn_radix_node **end, size_t *matched_out)
{
    size_t ps = (size_t)t->page_size;
    cairn_radix_node *n = &t->root;
    size_t matched = 0;
    int rc = CAIRN_OK;
    while (matched < n_pages_in) {
        const int32_t *page = tokens + matched * ps;
        cairn_radix_node *c = find_child(t, n, ns, page);
        if (!c)
            break;
        size_t k = 1;
        while (k < c->n_pages && matched + k < n_pages_in &&
               memcmp(c->tokens + k * ps, tokens + (matched + k) * ps, ps * sizeof(int32_t)) == 0)
            k++;
        if (k < c->n_pages) {
            cairn_radix_node *p;
            rc = split_node(t, c, k, &p);
            if (rc == CAIRN_OK) {
                n = p;
                matched += k;
            }
            break;
        }
        n = c;
        matched += k;
    }
    *end = n;
    *matched_out = matched;
    return rc;
}

int cairn_radix_match(cairn_radix *t, uint64_t ns, const int32_t *tokens, size_t n_tokens,
                      cairn_radix_match_result *out)
{
    if (!t || (!tokens && n_tokens) || !out)
        return CAIRN_EINVAL;
    cairn_radix_node *end;
    size_t matched;
    int rc = walk(t, ns, tokens, n_tokens / (size_t)t->page_size, &end, &matched);
    touch_path(t, end);
    out->node = end;
    out->n_pages = matched;
    out->last_hash = end == &t->root ? cairn_radix_ns_seed(t, ns)
                                     : end->pages[end->n_pages - 1].hash;
    return rc;
}

/* ---- explaining a miss (non-mutating) ------------------------------------ */

static size_t token_lcp(const int32_t *a, const int32_t *b, size_t n)
{
    size_t i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

/* Whole pages of node c (whose first page is known to equal tokens[0..ps))
 * and of its descendants that tokens[0 .. n_pages*ps) follows. */
static size_t pages_below(const cairn_radix *t, const cairn_radix_node *c, const int32_t *tokens,
                          size_t n_pages)
{
    const size_t ps = (size_t)t->page_size;
    size_t matched = 0;
    while (c) {
        size_t k = 1;
        while (k < c->n_pages && matched + k < n_pages &&
               memcmp(c->tokens + k * ps, tokens + (matched + k) * ps, ps * sizeof(int32_t)) == 0)
            k++;
        matched += k;
        if (k < c->n_pages || matched >= n_pages)
            break;
        c = find_child(t, c, c->ns, tokens + matched * ps);
    }
    return matched;
}

int cairn_radix_common_prefix(const cairn_radix *t, uint64_t ns, const int32_t *tokens,
                              size_t n_tokens, cairn_radix_common *out)
{
    if (!t || (!tokens && n_tokens) || !out)
        return CAIRN_EINVAL;
    *out = (cairn_radix_common){.last_hash = cairn_radix_ns_seed(t, ns), .tier = -1};
    for (size_t i = 0; i < t->root.n_children && !out->ns_cached; i++)
        out->ns_cached = t->root.children[i]->ns == ns;
    const size_t ps = (size_t)t->page_size, n_pages = n_tokens / ps;
    const cairn_radix_node *n = &t->root;
    size_t matched = 0; /* whole pages, all of them ending on n's end */
    for (;;) {
        const cairn_radix_node *c =
            matched < n_pages ? find_child(t, n, ns, tokens + matched * ps) : NULL;
        if (c) {
            size_t k = 1;
            while (k < c->n_pages && matched + k < n_pages &&
                   memcmp(c->tokens + k * ps, tokens + (matched + k) * ps,
                          ps * sizeof(int32_t)) == 0)
                k++;
            if (k == c->n_pages) {
                n = c;
                matched += k;
                continue;
            }
            /* departs inside c, somewhere in its page k */
            size_t rest = n_tokens - (matched + k) * ps;
            size_t l = token_lcp(c->tokens + k * ps, tokens + (matched + k) * ps,
                                 rest < ps ? rest : ps);
            out->whole_pages = matched + k;
            out->last_hash = c->pages[k - 1].hash;
            out->common_tokens = (matched + k) * ps + l;
            out->sequence_tokens = c->depth * ps;
            out->tier = c->tier;
            out->cached_next = c->tokens + k * ps + l;
            out->n_cached_next = c->n_pages * ps - (k * ps + l);
            return CAIRN_OK;
        }
        /* on n's end: the child (of this namespace) sharing the most tokens
         * of the next page, if any shares one */
        out->whole_pages = matched;
        if (n != &t->root) {
            out->last_hash = n->pages[n->n_pages - 1].hash;
            out->tier = n->tier;
        }
        out->common_tokens = matched * ps;
        out->sequence_tokens = matched * ps;
        size_t rest = n_tokens - matched * ps, best = 0;
        const cairn_radix_node *closest = NULL;
        for (size_t i = 0; i < n->n_children; i++) {
            const cairn_radix_node *ch = n->children[i];
            if (ch->ns != ns)
                continue;
            size_t l = token_lcp(ch->tokens, tokens + matched * ps, rest < ps ? rest : ps);
            if (!closest || l > best) {
                closest = ch;
                best = l;
            }
        }
        if (!closest) {
            out->contained = n != &t->root;
            return CAIRN_OK;
        }
        out->common_tokens += best;
        out->sequence_tokens = closest->depth * ps;
        if (best > 0)
            out->tier = closest->tier;
        out->cached_next = closest->tokens + best;
        out->n_cached_next = closest->n_pages * ps - best;
        return CAIRN_OK;
    }
}

size_t cairn_radix_pages_elsewhere(const cairn_radix *t, uint64_t ns, const int32_t *tokens,
                                   size_t n_tokens)
{
    if (!t || !tokens)
        return 0;
    const size_t ps = (size_t)t->page_size, n_pages = n_tokens / ps;
    if (n_pages == 0)
        return 0;
    size_t best = 0;
    for (size_t i = 0; i < t->root.n_children; i++) {
        const cairn_radix_node *c = t->root.children[i];
        if (c->ns == ns || memcmp(c->tokens, tokens, ps * sizeof(int32_t)) != 0)
            continue;
        size_t k = pages_below(t, c, tokens, n_pages);
        if (k > best)
            best = k;
    }
    return best;
}

int cairn_radix_insert(cairn_radix *t, uint64_t ns, const int32_t *tokens, size_t n_pages,
                       const int32_t *device_pages, size_t *n_cached, cairn_radix_node **leaf)
{
    if (!t || (!tokens && n_pages) || (!device_pages && n_pages) || !n_cached)
        return CAIRN_EINVAL;
    size_t ps = (size_t)t->page_size;
    cairn_radix_node *end;
    size_t matched;
    int rc = walk(t, ns, tokens, n_pages, &end, &matched);
    if (rc)
        return rc;
    /* Only the pages the tree will take must be real; a split done by the
     * walk above is harmless if we refuse here. */
    for (size_t i = matched; i < n_pages; i++)
        if (device_pages[i] < 0)
            return CAIRN_EINVAL;
    if (matched < n_pages) {
        size_t add = n_pages - matched;
        cairn_radix_node *n = calloc(1, sizeof *n);
        int32_t *toks = malloc(add * ps * sizeof *toks);
        cairn_radix_page *pages = malloc(add * sizeof *pages);
        if (!n || !toks || !pages || reserve_child(end) || reserve_heaps(t, t->n_nodes + 1)) {
            free(n);
            free(toks);
            free(pages);
            return CAIRN_ENOMEM;
        }
        memcpy(toks, tokens + matched * ps, add * ps * sizeof *toks);
        cairn_page_hash h = chain_start(t, end, ns);
        for (size_t i = 0; i < add; i++) {
            h = cairn_page_hash_next(h, toks + i * ps, ps);
            pages[i] = (cairn_radix_page){
                .hash = h, .device_page = device_pages[matched + i], .host_slot = -1};
        }
        n->tokens = toks;
        n->pages = pages;
        n->n_pages = add;
        n->ns = ns;
        n->key = node_key(ns, toks, t->page_size);
        n->depth = end->depth + add;
        n->tier = CAIRN_TIER_DEVICE;
        n->heap_pos = -1;
        n->uses = 1;
        n->id = t->next_id++;
        add_child(end, n);
        children_changed(t, end);
        t->n_nodes++;
        t->tier_pages[CAIRN_TIER_DEVICE] += add;
        refresh(t, end); /* it gained a device child */
        end = n;
        touch_path(t, end);
        refresh(t, n);
    } else {
        touch_path(t, end);
    }
    *n_cached = matched;
    if (leaf)
        *leaf = end;
    return CAIRN_OK;
}

/* ---- locks -------------------------------------------------------------- */

int cairn_radix_lock(cairn_radix *t, cairn_radix_node *node)
{
    if (!t || !node)
        return CAIRN_EINVAL;
    for (cairn_radix_node *n = node; n != &t->root; n = n->parent) {
        if (n->refs++ == 0) {
            t->locked_nodes++;
            refresh(t, n);
        }
    }
    return CAIRN_OK;
}

int cairn_radix_unlock(cairn_radix *t, cairn_radix_node *node)
{
    if (!t || !node)
        return CAIRN_EINVAL;
    for (cairn_radix_node *n = node; n != &t->root; n = n->parent)
        if (n->refs <= 0)
            return CAIRN_EINVAL;
    for (cairn_radix_node *n = node; n != &t->root; n = n->parent) {
        if (--n->refs == 0) {
            t->locked_nodes--;
            refresh(t, n);
        }
    }
    return CAIRN_OK;
}

/* ---- what pages are worth: live marks and reuse ------------------------- */

int cairn_radix_mark_live(cairn_radix *t, cairn_radix_node *node)
{
    if (!t || !node)
        return CAIRN_EINVAL;
    for (cairn_radix_node *n = node; n != &t->root; n = n->parent)
        if (n->live++ == 0)
            rekey(t, n);
    return CAIRN_OK;
}

int cairn_radix_unmark_live(cairn_radix *t, cairn_radix_node *node)
{
    if (!t || !node)
        return CAIRN_EINVAL;
    for (cairn_radix_node *n = node; n != &t->root; n = n->parent)
        if (n->live <= 0)
            return CAIRN_EINVAL;
    for (cairn_radix_node *n = node; n != &t->root; n = n->parent)
        if (--n->live == 0)
            rekey(t, n);
    return CAIRN_OK;
}

int cairn_radix_mark_reused(cairn_radix *t, cairn_radix_node *node)
{
    if (!t || !node)
        return CAIRN_EINVAL;
    for (cairn_radix_node *n = node; n != &t->root; n = n->parent) {
        if (n->uses == UINT32_MAX)
            continue;
        if (++n->uses == 2)
            rekey(t, n);
    }
    return CAIRN_OK;
}

int cairn_radix_set_plain_lru(cairn_radix *t, bool plain)
{
    if (!t)
        return CAIRN_EINVAL;
    if (t->n_nodes)
        return CAIRN_EBUSY; /* the heaps are ordered by the classes in force */
    t->plain_lru = plain;
    return CAIRN_OK;
}

cairn_radix_node *cairn_radix_find(const cairn_radix *t, uint64_t ns, const int32_t *tokens,
                                   size_t n_pages)
{
    if (!t || (!tokens && n_pages))
        return NULL;
    size_t ps = (size_t)t->page_size, matched = 0;
    const cairn_radix_node *n = &t->root;
    while (matched < n_pages) {
        cairn_radix_node *c = find_child(t, n, ns, tokens + matched * ps);
        if (!c || matched + c->n_pages > n_pages ||
            memcmp(c->tokens, tokens + matched * ps, c->n_pages * ps * sizeof(int32_t)) != 0)
            return NULL;
        matched += c->n_pages;
        n = c;
    }
    return n == &t->root ? NULL : (cairn_radix_node *)n;
}

/* ---- eviction support --------------------------------------------------- */

cairn_radix_node *cairn_radix_lru(const cairn_radix *t, int tier)
{
    if (!t || tier < 0 || tier >= CAIRN_TIER_COUNT || t->heaps[tier].n == 0)
        return NULL;
    return t->heaps[tier].items[0];
}

int cairn_radix_set_tier(cairn_radix *t, cairn_radix_node *node, int tier)
{
    if (!t || !node || node == &t->root || tier < 0 || tier >= CAIRN_TIER_COUNT)
        return CAIRN_EINVAL;
    for (size_t i = 0; i < node->n_pages; i++) {
        const cairn_radix_page *pg = &node->pages[i];
        bool ok = tier == CAIRN_TIER_DEVICE ? pg->device_page >= 0
                  : tier == CAIRN_TIER_HOST ? pg->host_slot >= 0 && pg->device_page < 0
                                            : pg->device_page < 0;
        if (!ok)
            return CAIRN_EINVAL;
    }
    if (tier > node->tier && node->refs > 0)
        return CAIRN_EBUSY;
    if (tier == node->tier)
        return CAIRN_OK;
    if (node->heap_pos >= 0)
        heap_remove(t, &t->heaps[node->tier], node);
    t->tier_pages[node->tier] -= node->n_pages;
    t->tier_pages[tier] += node->n_pages;
    node->parent->child_tier_count[node->tier]--;
    node->parent->child_tier_count[tier]++;
    node->tier = tier;
    refresh(t, node);
    refresh(t, node->parent);
    return CAIRN_OK;
}

int cairn_radix_drop(cairn_radix *t, cairn_radix_node *node, size_t keep,
                     cairn_radix_release_fn release, void *user)
{
    if (!t || !node || node == &t->root || keep >= node->n_pages)
        return CAIRN_EINVAL;
    /* refs counts every lock at or below a node, so one check covers the
     * whole subtree. */
    if (node->refs > 0)
        return CAIRN_EBUSY;
    if (keep > 0) {
        int rc = split_node(t, node, keep, NULL);
        if (rc)
            return rc;
    }
    cairn_radix_node *parent = node->parent;
    remove_child(parent, node);
    /* The live marks below node leave with it: its ancestors no longer
     * count them (whoever marked finds out by the node's id,
     * cairn_radix_find). */
    if (node->live > 0)
        for (cairn_radix_node *a = parent; a != &t->root; a = a->parent) {
            a->live -= node->live;
            rekey(t, a);
        }

    /* Depth-first over the subtree: release pages, fix counters, free. */
    cairn_radix_node *cur = node;
    while (cur) {
        if (cur->n_children) {
            cur = cur->children[--cur->n_children];
            continue;
        }
        for (size_t i = 0; release && i < cur->n_pages; i++)
            release(&cur->pages[i], user);
        if (cur->heap_pos >= 0)
            heap_remove(t, &t->heaps[cur->tier], cur);
        t->tier_pages[cur->tier] -= cur->n_pages;
        t->n_nodes--;
        cairn_radix_node *up = cur == node ? NULL : cur->parent;
        free_node(cur);
        cur = up;
    }
    refresh(t, parent);
    children_changed(t, parent);
    return CAIRN_OK;
}

/* ---- inspection --------------------------------------------------------- */

cairn_radix_node *cairn_radix_root(const cairn_radix *t) { return t ? (cairn_radix_node *)&t->root : NULL; }
cairn_radix_node *cairn_radix_parent(const cairn_radix_node *n) { return n ? n->parent : NULL; }
int cairn_radix_node_tier(const cairn_radix_node *n) { return n ? n->tier : -1; }
uint64_t cairn_radix_node_ns(const cairn_radix_node *n) { return n ? n->ns : 0; }
int32_t cairn_radix_node_refs(const cairn_radix_node *n) { return n ? n->refs : 0; }
int32_t cairn_radix_node_live(const cairn_radix_node *n) { return n ? n->live : 0; }
uint32_t cairn_radix_node_uses(const cairn_radix_node *n) { return n ? n->uses : 0; }
uint64_t cairn_radix_node_id(const cairn_radix_node *n) { return n ? n->id : 0; }
int cairn_radix_node_class(const cairn_radix_node *n) { return n ? class_of(n) : -1; }

size_t cairn_radix_node_n_children(const cairn_radix_node *n) { return n ? n->n_children : 0; }
cairn_radix_node *cairn_radix_node_child(const cairn_radix_node *n, size_t i)
{
    return n && i < n->n_children ? n->children[i] : NULL;
}
size_t cairn_radix_node_depth(const cairn_radix_node *n) { return n ? n->depth : 0; }
const int32_t *cairn_radix_node_tokens(const cairn_radix_node *n) { return n ? n->tokens : NULL; }

size_t cairn_radix_node_pages(cairn_radix_node *n, cairn_radix_page **pages)
{
    if (pages)
        *pages = n ? n->pages : NULL;
    return n ? n->n_pages : 0;
}

int cairn_radix_path(cairn_radix_node *node, cairn_radix_page **out, size_t cap, size_t *n_out)
{
    if (!node || (!out && cap) || !n_out)
        return CAIRN_EINVAL;
    if (node->depth > cap)
        return CAIRN_ERANGE;
    size_t pos = node->depth;
    for (cairn_radix_node *n = node; n->parent; n = n->parent)
        for (size_t i = n->n_pages; i-- > 0;)
            out[--pos] = &n->pages[i];
    *n_out = node->depth;
    return CAIRN_OK;
}

int cairn_radix_visit(cairn_radix *t, int (*fn)(cairn_radix_node *, void *), void *user)
{
    if (!t || !fn)
        return CAIRN_EINVAL;
    /* Explicit stack of (node, next child index) — no recursion. */
    size_t cap = 64, sp = 0;
    struct frame { cairn_radix_node *n; uint32_t next; } *st = malloc(cap * sizeof *st);
    if (!st)
        return CAIRN_ENOMEM;
    st[sp++] = (struct frame){&t->root, 0};
    int rc = 0;
    while (sp && !rc) {
        struct frame *f = &st[sp - 1];
        if (f->next == f->n->n_children) {
            sp--;
            continue;
        }
        cairn_radix_node *c = f->n->children[f->next++];
        rc = fn(c, user);
        if (rc)
            break;
        if (sp == cap) {
            struct frame *ns = realloc(st, 2 * cap * sizeof *st);
            if (!ns) {
                rc = CAIRN_ENOMEM;
                break;
            }
            st = ns;
            cap *= 2;
        }
        st[sp++] = (struct frame){c, 0};
    }
    free(st);
    return rc;
}

void cairn_radix_get_stats(const cairn_radix *t, cairn_radix_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!t)
        return;
    out->n_nodes = t->n_nodes;
    for (int k = 0; k < CAIRN_TIER_COUNT; k++) {
        out->pages[k] = t->tier_pages[k];
        out->evictable[k] = t->heaps[k].n;
    }
    out->locked_nodes = t->locked_nodes;
}

/* ---- invariant check (tests) -------------------------------------------- */

typedef struct {
    const cairn_radix *t;
    size_t nodes, locked, pages[CAIRN_TIER_COUNT], in_heaps;
    int bad;
} check_ctx;

static int check_node(cairn_radix_node *n, void *user)
{
    check_ctx *c = user;
    const cairn_radix *t = c->t;
    size_t ps = (size_t)t->page_size;
    c->nodes++;
    c->pages[n->tier] += n->n_pages;
    if (n->refs > 0)
        c->locked++;
    if (n->n_pages == 0 || n->depth != n->parent->depth + n->n_pages)
        return c->bad = 1;
    if (n->key != node_key(n->ns, n->tokens, t->page_size) ||
        (n->parent != &t->root && n->ns != n->parent->ns))
        return c->bad = 2;
    cairn_page_hash h = chain_start(t, n->parent, n->ns);
    for (size_t i = 0; i < n->n_pages; i++) {
        h = cairn_page_hash_next(h, n->tokens + i * ps, ps);
        if (!cairn_page_hash_equal(h, n->pages[i].hash))
            return c->bad = 3;
    }
    uint32_t counts[CAIRN_TIER_COUNT] = {0};
    int32_t child_refs = 0, child_live = 0;
    for (uint32_t i = 0; i < n->n_children; i++) {
        cairn_radix_node *ch = n->children[i];
        if (ch->parent != n || (i > 0 && n->children[i - 1]->key > ch->key))
            return c->bad = 4;
        if (ch->last_use > n->last_use)
            return c->bad = 5;
        counts[ch->tier]++;
        child_refs += ch->refs;
        child_live += ch->live;
        if (ch->uses > n->uses && ch->uses >= 2 && n->uses < 2)
            return c->bad = 11; /* a reuse marks the whole path */
    }
    if (memcmp(counts, n->child_tier_count, sizeof counts) != 0)
        return c->bad = 6;
    if (n->refs < child_refs || n->live < child_live || n->uses == 0 || n->id == 0)
        return c->bad = 7;
    bool want = is_evictable(t, n);
    if (want != (n->heap_pos >= 0))
        return c->bad = 8;
    if (want) {
        const node_heap *hp = &t->heaps[n->tier];
        size_t i = (size_t)n->heap_pos;
        if (i >= hp->n || hp->items[i] != n)
            return c->bad = 9;
        if (i > 0 && node_before(t, n, hp->items[(i - 1) / 2]))
            return c->bad = 10;
        c->in_heaps++;
    }
    return 0;
}

int cairn_radix_check(const cairn_radix *t)
{
    if (!t)
        return CAIRN_EINVAL;
    check_ctx c = {.t = t};
    int rc = cairn_radix_visit((cairn_radix *)t, check_node, &c);
    if (rc || c.bad)
        return CAIRN_ECORRUPT;
    size_t heap_total = 0;
    for (int k = 0; k < CAIRN_TIER_COUNT; k++) {
        heap_total += t->heaps[k].n;
        if (c.pages[k] != t->tier_pages[k])
            return CAIRN_ECORRUPT;
    }
    if (c.nodes != t->n_nodes || c.locked != t->locked_nodes || heap_total != c.in_heaps)
        return CAIRN_ECORRUPT;
    uint32_t counts[CAIRN_TIER_COUNT] = {0};
    for (uint32_t i = 0; i < t->root.n_children; i++)
        counts[t->root.children[i]->tier]++;
    if (memcmp(counts, t->root.child_tier_count, sizeof counts) != 0)
        return CAIRN_ECORRUPT;
    return CAIRN_OK;
}
