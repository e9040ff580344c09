/*
 * store/disk_watch.c — what LMDB holds, told as it changes (store.h,
 * "watching pages"): the pages a committed batch wrote, the pages it
 * deleted (least recently used, or failing verification), and, on request,
 * every page already there — the last being how a restarted replica tells
 * the routers that its disk still holds what it computed before.
 *
 * Rebuilding the chains. A value names its page (the key) and its tokens,
 * not the page before it, and a router needs that parent to place the page.
 * Each value written since the watcher exists keeps the first four bytes of
 * its parent's key in the header's reserved word (disk.c), so:
 *
 *     roots     = values whose tokens hashed from the seed give their key
 *     children  = values whose reserved word is the first four bytes of
 *                 the parent's key AND hash_next(parent, tokens) == key
 *
 * The four bytes only narrow the candidates; the hash decides. A value
 * written before (reserved word 0) is found only if it is a root. The scan
 * runs on the caller's thread in a read transaction (like the records'
 * iterate) and reads a value's header and tokens, never its KV bytes.
 */
#include "store/tiers.h"
#include "store/disk_impl.h"

#include <stdlib.h>
#include <string.h>

bool disk_watching(cairn_disk *d)
{
    pthread_mutex_lock(&d->cmu);
    bool on = d->watch_fn != NULL;
    pthread_mutex_unlock(&d->cmu);
    return on;
}

static cairn_disk_watch_fn watcher(cairn_disk *d, void **user)
{
    pthread_mutex_lock(&d->cmu);
    cairn_disk_watch_fn fn = d->watch_fn;
    *user = d->watch_user;
    pthread_mutex_unlock(&d->cmu);
    return fn;
}

int cairn_disk_watch(cairn_disk *d, cairn_disk_watch_fn fn, void *user)
{
    if (!d)
        return CAIRN_EINVAL;
    pthread_mutex_lock(&d->cmu);
    d->watch_fn = fn;
    d->watch_user = fn ? user : NULL;
    pthread_mutex_unlock(&d->cmu);
    return CAIRN_OK;
}

void disk_watch_batch(cairn_disk *d, const disk_req *list)
{
    void *user;
    cairn_disk_watch_fn fn = watcher(d, &user);
    if (!fn)
        return;
    int ps = d->cfg.page_size;
    int32_t *tok = NULL;
    for (const disk_req *r = list; r; r = r->next) {
        cairn_page_hash h = cairn_page_hash_from_bytes(r->key);
        cairn_disk_page_event e = {.hashes = &h, .n = 1};
        if (r->op == CAIRN_DISK_WRITE && r->status == CAIRN_OK && (r->announce & DISK_ANNOUNCE)) {
            if (!tok && !(tok = malloc((size_t)ps * sizeof *tok)))
                return; /* an announcement lost: the routers' view is a hint */
            disk_tokens_from_le(tok, r->data + CAIRN_DISK_HEADER_BYTES, ps);
            e.stored = true;
            e.has_parent = r->announce & DISK_HAS_PARENT;
            e.parent = cairn_page_hash_from_bytes(r->parent);
            e.tokens = tok;
            fn(&e, user);
        } else if ((r->op == CAIRN_DISK_READ || r->op == CAIRN_DISK_READ_CHILD) && r->deleted) {
            fn(&e, user);
        }
    }
    free(tok);
}

void disk_watch_deleted(cairn_disk *d, const uint8_t (*keys)[16], size_t n)
{
    void *user;
    cairn_disk_watch_fn fn = watcher(d, &user);
    if (!fn || !keys)
        return;
    for (size_t i = 0; i < n; i++) {
        cairn_page_hash h = cairn_page_hash_from_bytes(keys[i]);
        cairn_disk_page_event e = {.hashes = &h, .n = 1};
        fn(&e, user);
    }
}

/* ---- the scan ------------------------------------------------------------ */

typedef struct {
    cairn_page_hash key;
    uint32_t parent4;  /* the reserved word: first four bytes of the parent */
    uint32_t next;     /* next entry with the same parent4 (bucket chain)   */
    int32_t *tokens;   /* into the scan's token array                       */
    bool done;
} scan_entry;

typedef struct {
    scan_entry *v;
    size_t n, cap;
    int32_t *tokens;
    size_t tok_cap; /* in pages */
    uint32_t *bucket;  /* [n_buckets]: first entry + 1, 0 = none */
    size_t n_buckets;
} scan;

static uint32_t first4(cairn_page_hash h)
{
    uint8_t b[16];
    cairn_page_hash_to_bytes(h, b);
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

static int scan_add(scan *s, const uint8_t key[16], const uint8_t *v, int ps)
{
    /* a kept tail (share.c): its tokens padded with -1, found only by its
     * parent; not a page anyone routes to */
    if ((int32_t)get_u32(v + CAIRN_DISK_HEADER_BYTES + 4 * (size_t)(ps - 1)) < 0)
        return CAIRN_OK;
    if (s->n == s->cap) {
        size_t nc = s->cap ? 2 * s->cap : 1024;
        scan_entry *nv = realloc(s->v, nc * sizeof *nv);
        int32_t *nt = realloc(s->tokens, nc * (size_t)ps * sizeof *nt);
        if (nv)
            s->v = nv;
        if (nt)
            s->tokens = nt;
        if (!nv || !nt)
            return CAIRN_ENOMEM;
        s->cap = nc;
    }
    scan_entry *e = &s->v[s->n];
    e->key = cairn_page_hash_from_bytes(key);
    e->parent4 = get_u32(v + 28);
    e->done = false;
    disk_tokens_from_le(s->tokens + s->n * (size_t)ps, v + CAIRN_DISK_HEADER_BYTES, ps);
    s->n++;
    return CAIRN_OK;
}

/* Announce the chain that starts at entry i (whose parent is given) and
 * follows first children; other children go on the stack. */
typedef struct {
    size_t entry;
    bool has_parent;
    cairn_page_hash parent;
} scan_start;

#define SCAN_RUN 256 /* pages per event at most */

static int scan_emit(cairn_disk *d, scan *s, scan_start *stack, size_t *n_stack, size_t cap,
                     scan_start st, cairn_disk_watch_fn fn, void *user, cairn_page_hash *hashes,
                     int32_t *tokens)
{
    int ps = d->cfg.page_size;
    size_t i = st.entry;
    size_t run = 0;
    cairn_disk_page_event e = {.stored = true, .has_parent = st.has_parent, .parent = st.parent};
    for (;;) {
        scan_entry *x = &s->v[i];
        x->done = true;
        hashes[run] = x->key;
        memcpy(tokens + run * (size_t)ps, x->tokens, (size_t)ps * sizeof *tokens);
        run++;
        /* children of x: same first four bytes, and the hash agrees */
        size_t next = (size_t)-1;
        uint32_t b = first4(x->key);
        for (uint32_t j = s->bucket[b % s->n_buckets]; j; j = s->v[j - 1].next) {
            scan_entry *y = &s->v[j - 1];
            if (y->done || y->parent4 != b)
                continue;
            cairn_page_hash h = cairn_page_hash_next(x->key, y->tokens, (size_t)ps);
            if (!cairn_page_hash_equal(h, y->key))
                continue;
            if (next == (size_t)-1) {
                next = j - 1;
            } else if (*n_stack < cap) {
                stack[(*n_stack)++] = (scan_start){j - 1, true, x->key};
                y->done = true; /* claimed by its stack entry */
            }
        }
        if (run == SCAN_RUN || next == (size_t)-1) {
            /* one event per run of consecutive pages */
            e.hashes = hashes;
            e.n = run;
            e.tokens = tokens;
            fn(&e, user);
            e.has_parent = true;
            e.parent = hashes[run - 1];
            run = 0;
            if (next == (size_t)-1)
                return CAIRN_OK;
        }
        s->v[next].done = true;
        i = next;
    }
}

int cairn_disk_announce_pages(cairn_disk *d, cairn_page_hash seed)
{
    if (!d)
        return CAIRN_EINVAL;
    void *user;
    cairn_disk_watch_fn fn = watcher(d, &user);
    if (!fn)
        return CAIRN_OK;
    int ps = d->cfg.page_size;
    uint8_t ns_bytes[16];
    cairn_page_hash_to_bytes(d->cfg.ns, ns_bytes);

    scan s = {0};
    MDB_txn *txn;
    int rc = mdb_txn_begin(d->env, NULL, MDB_RDONLY, &txn);
    if (rc)
        return disk_map_mdb(rc);
    MDB_cursor *cur;
    rc = mdb_cursor_open(txn, d->db_pages, &cur);
    if (rc) {
        mdb_txn_abort(txn);
        return disk_map_mdb(rc);
    }
    int out = CAIRN_OK;
    MDB_val k, v;
    size_t need = CAIRN_DISK_HEADER_BYTES + 4 * (size_t)ps;
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == MDB_SUCCESS;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        const uint8_t *b = v.mv_data;
        /* this model's pages only; the checksum is the reader's business */
        if (k.mv_size != 16 || v.mv_size < need || memcmp(b, "CKVP", 4) != 0 ||
            memcmp(b + 8, ns_bytes, 16) != 0 || get_u32(b + 24) != (uint32_t)ps)
            continue;
        if ((out = scan_add(&s, k.mv_data, b, ps)) != CAIRN_OK)
            break;
    }
    mdb_cursor_close(cur);
    mdb_txn_abort(txn);

    cairn_page_hash *hashes = NULL;
    int32_t *tokens = NULL;
    scan_start *stack = NULL;
    if (out == CAIRN_OK && s.n > 0) {
        s.n_buckets = s.n * 2 + 1;
        s.bucket = calloc(s.n_buckets, sizeof *s.bucket);
        hashes = malloc(SCAN_RUN * sizeof *hashes);
        tokens = malloc(SCAN_RUN * (size_t)ps * sizeof *tokens);
        stack = malloc(s.n * sizeof *stack);
        if (!s.bucket || !hashes || !tokens || !stack)
            out = CAIRN_ENOMEM;
    }
    if (out == CAIRN_OK && s.n > 0) {
        for (size_t i = 0; i < s.n; i++) {
            s.v[i].tokens = s.tokens + i * (size_t)ps;
            uint32_t *b = &s.bucket[s.v[i].parent4 % s.n_buckets];
            s.v[i].next = *b;
            *b = (uint32_t)(i + 1);
        }
        /* roots first, each followed by everything that hangs from it */
        uint32_t seed4 = first4(seed);
        for (size_t i = 0; i < s.n; i++) {
            scan_entry *x = &s.v[i];
            if (x->done || (x->parent4 != seed4 && x->parent4 != 0))
                continue;
            cairn_page_hash h = cairn_page_hash_next(seed, x->tokens, (size_t)ps);
            if (!cairn_page_hash_equal(h, x->key))
                continue;
            size_t n_stack = 0;
            stack[n_stack++] = (scan_start){i, false, seed};
            x->done = true;
            while (n_stack > 0) {
                scan_start st = stack[--n_stack];
                scan_emit(d, &s, stack, &n_stack, s.n, st, fn, user, hashes, tokens);
            }
        }
    }
    free(stack);
    free(tokens);
    free(hashes);
    free(s.bucket);
    free(s.tokens);
    free(s.v);
    return out;
}
