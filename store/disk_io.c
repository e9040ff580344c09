/*
 * store/disk_io.c — the disk tier's I/O thread: LMDB helpers (access order,
 * eviction of the least recently used pages) and serving a batch of
 * requests in one write transaction, then posting the completions. Apart
 * from disk.c because everything here runs on the I/O thread only.
 *
 * Requests go through a FIFO; the thread takes up to max_batch at a time and
 * serves them, reads and writes interleaved in queue order, inside one write
 * transaction, then queues the completions. Why one write transaction even
 * for reads: a read moves its page in the access order, and a read must see
 * the writes queued before it.
 */
#include "store/tiers.h"
#include "store/disk_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- LMDB helpers (I/O thread) ------------------------------------------ */

int disk_map_mdb(int rc)
{
    switch (rc) {
    case MDB_SUCCESS:
        return CAIRN_OK;
    case MDB_NOTFOUND:
        return CAIRN_ENOTFOUND;
    case MDB_MAP_FULL:
        return CAIRN_EFULL;
    case MDB_CORRUPTED:
    case MDB_PAGE_NOTFOUND:
    case MDB_INVALID:
    case MDB_VERSION_MISMATCH:
        return CAIRN_ECORRUPT;
    case ENOMEM:
        return CAIRN_ENOMEM;
    default:
        return CAIRN_EIO;
    }
}

/* Remove a page's access-order entries (not the value). */
static int forget_access(cairn_disk *d, MDB_txn *txn, MDB_val *key)
{
    MDB_val old;
    int rc = mdb_get(txn, d->db_atime, key, &old);
    if (rc == MDB_NOTFOUND)
        return MDB_SUCCESS;
    if (rc)
        return rc;
    if (old.mv_size == 8) {
        uint8_t be[8];
        uint64_t t;
        memcpy(&t, old.mv_data, 8);
        for (int i = 0; i < 8; i++)
            be[i] = (uint8_t)(t >> (56 - 8 * i));
        MDB_val lk = {8, be};
        rc = mdb_del(txn, d->db_lru, &lk, NULL);
        if (rc && rc != MDB_NOTFOUND)
            return rc;
    }
    rc = mdb_del(txn, d->db_atime, key, NULL);
    return rc == MDB_NOTFOUND ? MDB_SUCCESS : rc;
}

/* Make `key` the most recently used page. */
static int touch(cairn_disk *d, MDB_txn *txn, MDB_val *key)
{
    int rc = forget_access(d, txn, key);
    if (rc)
        return rc;
    uint64_t t = d->tick++;
    uint8_t be[8];
    for (int i = 0; i < 8; i++)
        be[i] = (uint8_t)(t >> (56 - 8 * i));
    MDB_val tv = {8, &t}, lk = {8, be};
    rc = mdb_put(txn, d->db_atime, key, &tv, 0);
    if (!rc)
        rc = mdb_put(txn, d->db_lru, &lk, key, MDB_APPEND);
    return rc;
}

/* Take a page off its parent's list of children (before its value goes:
 * the value says which list). */
static int unlist_child(cairn_disk *d, MDB_txn *txn, MDB_val *key)
{
    MDB_val v;
    int rc = mdb_get(txn, d->db_pages, key, &v);
    if (rc == MDB_NOTFOUND || (!rc && v.mv_size < CAIRN_DISK_HEADER_BYTES))
        return MDB_SUCCESS;
    if (rc)
        return rc;
    uint8_t word[4];
    memcpy(word, (const uint8_t *)v.mv_data + DISK_PARENT_WORD_AT, 4);
    MDB_val wk = {4, word};
    rc = mdb_del(txn, d->db_children, &wk, key);
    return rc == MDB_NOTFOUND ? MDB_SUCCESS : rc;
}

static int delete_page(cairn_disk *d, MDB_txn *txn, MDB_val *key)
{
    int rc = unlist_child(d, txn, key);
    if (!rc)
        rc = mdb_del(txn, d->db_pages, key, NULL);
    if (rc && rc != MDB_NOTFOUND)
        return rc;
    return forget_access(d, txn, key);
}

/* Delete up to n least recently used pages in a transaction of their own.
 * *n_out receives how many went. */
static int evict_lru(cairn_disk *d, size_t n, size_t *n_out)
{
    *n_out = 0;
    MDB_txn *txn;
    int rc = mdb_txn_begin(d->env, NULL, 0, &txn);
    if (rc)
        return rc;
    MDB_cursor *cur;
    rc = mdb_cursor_open(txn, d->db_lru, &cur);
    size_t k = 0;
    MDB_val lk, pk;
    /* the keys that went, for the watcher once the deletion is committed */
    uint8_t(*gone)[16] = disk_watching(d) ? malloc((n ? n : 1) * sizeof *gone) : NULL;
    size_t n_gone = 0;
    while (!rc && k < n && (rc = mdb_cursor_get(cur, &lk, &pk, MDB_FIRST)) == MDB_SUCCESS) {
        uint8_t key[16];
        if (pk.mv_size != 16) {
            rc = mdb_cursor_del(cur, 0);
            continue;
        }
        memcpy(key, pk.mv_data, 16);
        rc = mdb_cursor_del(cur, 0);
        MDB_val kv = {16, key};
        if (!rc)
            rc = unlist_child(d, txn, &kv);
        if (!rc) {
            rc = mdb_del(txn, d->db_pages, &kv, NULL);
            if (rc == MDB_NOTFOUND)
                rc = MDB_SUCCESS;
        }
        if (!rc) {
            rc = mdb_del(txn, d->db_atime, &kv, NULL);
            if (rc == MDB_NOTFOUND)
                rc = MDB_SUCCESS;
        }
        if (!rc && gone)
            memcpy(gone[n_gone++], key, 16);
        k++;
    }
    if (rc == MDB_NOTFOUND)
        rc = MDB_SUCCESS;
    if (!rc)
        mdb_cursor_close(cur);
    if (rc) {
        mdb_txn_abort(txn);
        free(gone);
        return rc;
    }
    rc = mdb_txn_commit(txn);
    if (rc) {
        free(gone);
        return rc;
    }
    *n_out = k;
    disk_watch_deleted(d, (const uint8_t(*)[16])gone, n_gone);
    free(gone);
    /* LMDB reuses the pages a transaction freed only two commits later
     * (the previous snapshot still points at them). One tiny commit now
     * makes the room just made usable by the very next transaction. */
    if (mdb_txn_begin(d->env, NULL, 0, &txn) == MDB_SUCCESS) {
        MDB_val k2 = {5, "evict"}, v2 = {8, &d->tick};
        if (mdb_put(txn, d->db_meta, &k2, &v2, 0) == MDB_SUCCESS)
            mdb_txn_commit(txn);
        else
            mdb_txn_abort(txn);
    }
    return MDB_SUCCESS;
}

/* ---- the page that continues a parent ------------------------------------ */

/* Children looked at per read at most: a prefix with more continuations
 * than this on disk is a template, not a document, and any of its first
 * children is as good a guess. */
#define CHILDREN_MAX 256

/* Serve a read child (tiers.h, cairn_disk_read_child): the listed child of
 * r->parent sharing the most leading tokens with next[], into r->dst and
 * (its tokens) r->result. r->status says what came of it; the return is an LMDB
 * code that fails the batch. */
static int read_child(cairn_disk *d, MDB_txn *txn, disk_req *r)
{
    const int ps = d->cfg.page_size;
    const size_t tok_bytes = 4 * (size_t)ps;
    const uint8_t *next = r->data; /* int32_t, unaligned */
    const cairn_page_hash parent = cairn_page_hash_from_bytes(r->parent);
    r->status = CAIRN_ENOTFOUND;
    r->matched = 0;
    uint8_t word[4];
    disk_parent_word(r->parent, word);
    MDB_val wk = {4, word}, ck;
    MDB_cursor *cur;
    int rc = mdb_cursor_open(txn, d->db_children, &cur);
    if (rc)
        return rc;
    uint8_t best_key[16], stale[CHILDREN_MAX][16];
    int best = 0, n_stale = 0;
    rc = mdb_cursor_get(cur, &wk, &ck, MDB_SET_KEY);
    for (int seen = 0; rc == MDB_SUCCESS && seen < CHILDREN_MAX; seen++) {
        if (ck.mv_size == 16) {
            MDB_val v, kv = {16, ck.mv_data};
            int g = mdb_get(txn, d->db_pages, &kv, &v);
            if (g == MDB_NOTFOUND) {
                memcpy(stale[n_stale++], ck.mv_data, 16); /* its page went */
            } else if (g) {
                rc = g;
                break;
            } else if (v.mv_size == d->value_bytes) {
                int l = disk_child_match(parent, ck.mv_data,
                                         (const uint8_t *)v.mv_data + CAIRN_DISK_HEADER_BYTES, ps,
                                         next, r->n_next, best);
                if (l > 0) {
                    best = l;
                    memcpy(best_key, ck.mv_data, 16);
                }
            }
        }
        rc = mdb_cursor_get(cur, &wk, &ck, MDB_NEXT_DUP);
    }
    mdb_cursor_close(cur);
    if (rc && rc != MDB_NOTFOUND)
        return rc;
    for (int i = 0; i < n_stale; i++) {
        MDB_val sk = {16, stale[i]};
        rc = mdb_del(txn, d->db_children, &wk, &sk);
        if (rc && rc != MDB_NOTFOUND)
            return rc;
    }
    if (best == 0)
        return MDB_SUCCESS;
    MDB_val key = {16, best_key}, v;
    if ((rc = mdb_get(txn, d->db_pages, &key, &v)))
        return rc;
    const uint8_t *tle = (const uint8_t *)v.mv_data + CAIRN_DISK_HEADER_BYTES;
    if (!disk_value_ok(d, v.mv_data, v.mv_size, tle)) {
        memcpy(r->key, best_key, 16);
        r->deleted = true; /* the watcher hears of it like a failed read */
        return delete_page(d, txn, &key);
    }
    int32_t *out = malloc(tok_bytes);
    if (!out)
        return MDB_SUCCESS; /* a miss */
    disk_tokens_from_le(out, tle, ps);
    memcpy(r->dst, tle + tok_bytes, d->cfg.page_bytes);
    free(r->result); /* a retried batch */
    r->result = out;
    r->result_bytes = tok_bytes;
    memcpy(r->key, best_key, 16);
    r->matched = best;
    r->status = CAIRN_OK;
    return touch(d, txn, &key);
}

/* ---- serving a batch ---------------------------------------------------- */

typedef struct {
    uint64_t hits, misses, corrupt, bytes_read, bytes_written, writes, reads, write_failures;
} batch_counts;

/* Serve the batch in one transaction. Returns an LMDB code: MDB_MAP_FULL
 * means "make room and retry"; other non-zero codes mean the transaction
 * failed as a whole. Nothing is visible until the commit succeeds. */
static int serve_batch(cairn_disk *d, disk_req *list, batch_counts *bc)
{
    MDB_txn *txn;
    int rc = mdb_txn_begin(d->env, NULL, 0, &txn);
    if (rc)
        return rc;
    memset(bc, 0, sizeof *bc);
    size_t tok_bytes = 4 * (size_t)d->cfg.page_size;
    for (disk_req *r = list; r; r = r->next) {
        MDB_val key = {16, r->key};
        if (r->op == CAIRN_DISK_WRITE) {
            MDB_val val = {r->bytes, NULL};
            rc = mdb_put(txn, d->db_pages, &key, &val, MDB_RESERVE);
            if (!rc) {
                memcpy(val.mv_data, r->data, r->bytes);
                rc = touch(d, txn, &key);
            }
            if (!rc && (r->announce & DISK_INDEXED)) {
                MDB_val wk = {4, r->data + DISK_PARENT_WORD_AT};
                rc = mdb_put(txn, d->db_children, &wk, &key, 0);
            }
            if (rc)
                break;
            r->status = CAIRN_OK;
            bc->writes++;
            bc->bytes_written += d->cfg.page_bytes;
        } else if (r->op == CAIRN_DISK_READ) {
            MDB_val val;
            bc->reads++;
            rc = mdb_get(txn, d->db_pages, &key, &val);
            if (rc == MDB_NOTFOUND) {
                rc = MDB_SUCCESS;
                r->status = CAIRN_ENOTFOUND;
                bc->misses++;
                continue;
            }
            if (rc)
                break;
            if (!disk_value_ok(d, val.mv_data, val.mv_size, r->data)) {
                rc = delete_page(d, txn, &key);
                if (rc)
                    break;
                r->deleted = true;
                r->status = CAIRN_ENOTFOUND;
                bc->corrupt++;
                bc->misses++;
                continue;
            }
            memcpy(r->dst, (const uint8_t *)val.mv_data + CAIRN_DISK_HEADER_BYTES + tok_bytes,
                   d->cfg.page_bytes);
            rc = touch(d, txn, &key);
            if (rc)
                break;
            r->status = CAIRN_OK;
            bc->hits++;
            bc->bytes_read += d->cfg.page_bytes;
        } else if (r->op == CAIRN_DISK_READ_CHILD) {
            bc->reads++;
            rc = read_child(d, txn, r);
            if (rc)
                break;
            if (r->status == CAIRN_OK) {
                bc->hits++;
                bc->bytes_read += d->cfg.page_bytes;
            } else {
                bc->misses++;
            }
        } else if (r->op == CAIRN_DISK_RECORD_PUT) {
            MDB_val rk = {r->key_len, r->data}, rv = {r->bytes - r->key_len, NULL};
            rc = mdb_put(txn, d->db_records, &rk, &rv, MDB_RESERVE);
            if (rc)
                break;
            if (rv.mv_size)
                memcpy(rv.mv_data, r->data + r->key_len, rv.mv_size);
            r->status = CAIRN_OK;
        } else if (r->op == CAIRN_DISK_RECORD_DELETE) {
            MDB_val rk = {r->key_len, r->data};
            rc = mdb_del(txn, d->db_records, &rk, NULL);
            r->status = rc == MDB_NOTFOUND ? CAIRN_ENOTFOUND : CAIRN_OK;
            if (rc == MDB_NOTFOUND)
                rc = MDB_SUCCESS;
            if (rc)
                break;
        } else if (r->op == CAIRN_DISK_RECORD_GET) {
            MDB_val rk = {r->key_len, r->data}, rv;
            rc = mdb_get(txn, d->db_records, &rk, &rv);
            if (rc == MDB_NOTFOUND) {
                rc = MDB_SUCCESS;
                r->status = CAIRN_ENOTFOUND;
                continue;
            }
            if (rc)
                break;
            free(r->result); /* a retried batch */
            r->result = malloc(rv.mv_size ? rv.mv_size : 1);
            if (!r->result) {
                r->status = CAIRN_ENOMEM;
                continue;
            }
            memcpy(r->result, rv.mv_data, rv.mv_size);
            r->result_bytes = rv.mv_size;
            r->status = CAIRN_OK;
        } else {
            r->status = CAIRN_OK;
        }
    }
    if (rc) {
        mdb_txn_abort(txn);
        return rc;
    }
    MDB_stat ms, rs;
    int src = mdb_stat(txn, d->db_pages, &ms);
    int rsrc = mdb_stat(txn, d->db_records, &rs);
    rc = mdb_txn_commit(txn);
    if (rc == MDB_SUCCESS && src == MDB_SUCCESS) {
        pthread_mutex_lock(&d->cmu);
        d->stats.pages = ms.ms_entries;
        if (rsrc == MDB_SUCCESS)
            d->stats.records = rs.ms_entries;
        pthread_mutex_unlock(&d->cmu);
    }
    return rc;
}

static bool is_durable_op(cairn_disk_op op)
{
    return op == CAIRN_DISK_SYNC || op == CAIRN_DISK_RECORD_PUT || op == CAIRN_DISK_RECORD_DELETE;
}

/* After a commit: when the batch holds an operation that promises
 * durability, force the data file to stable storage (the environment runs
 * with MDB_NOSYNC unless the whole store is durable). A failed sync fails
 * exactly those operations: their callers were promised more than a commit. */
static void sync_if_needed(cairn_disk *d, disk_req *list)
{
    bool need = false;
    for (disk_req *r = list; r; r = r->next)
        need |= is_durable_op(r->op) && r->status != CAIRN_EIO;
    if (!need)
        return;
    int rc = mdb_env_sync(d->env, 1);
    pthread_mutex_lock(&d->cmu);
    d->stats.syncs++;
    pthread_mutex_unlock(&d->cmu);
    if (rc == MDB_SUCCESS)
        return;
    cairn_log(CAIRN_LOG_WARN, "disk tier: sync failed: %s", mdb_strerror(rc));
    for (disk_req *r = list; r; r = r->next)
        if (is_durable_op(r->op))
            r->status = CAIRN_EIO;
}

static void post(cairn_disk *d, disk_req *list, const batch_counts *bc, uint64_t extra_failures)
{
    pthread_mutex_lock(&d->cmu);
    size_t n = 0;
    for (disk_req *r = list; r; r = r->next)
        n++;
    if (d->n_done + n > d->cap_done) {
        size_t cap = d->cap_done ? d->cap_done : 256;
        while (cap < d->n_done + n)
            cap *= 2;
        cairn_disk_completion *nd = realloc(d->done, cap * sizeof *nd);
        if (nd) {
            d->done = nd;
            d->cap_done = cap;
        }
    }
    double now = cairn_now();
    for (disk_req *r = list; r; r = r->next) {
        double waited = now - r->queued_at;
        if (r->op == CAIRN_DISK_READ || r->op == CAIRN_DISK_READ_CHILD) {
            d->stats.read_seconds += waited;
        } else if (r->op == CAIRN_DISK_WRITE) {
            d->stats.write_seconds += waited;
        }
        if (d->n_done < d->cap_done) {
            d->done[d->n_done++] = (cairn_disk_completion){
                .cookie = r->cookie, .op = r->op, .status = r->status, .seconds = waited,
                .data = r->result, .bytes = r->result_bytes, .shared = r->from_shared,
                .seen_elsewhere = r->seen_elsewhere, .busy_elsewhere = r->busy_elsewhere,
                .matched = r->matched};
            r->result = NULL; /* handed over */
        }
    }
    d->stats.hits += bc->hits;
    d->stats.misses += bc->misses;
    d->stats.corrupt += bc->corrupt;
    d->stats.reads += bc->reads;
    d->stats.writes += bc->writes;
    d->stats.bytes_read += bc->bytes_read;
    d->stats.bytes_written += bc->bytes_written;
    d->stats.write_failures += bc->write_failures + extra_failures;
    pthread_cond_broadcast(&d->ccv);
    pthread_mutex_unlock(&d->cmu);
    uint64_t one = 1;
    ssize_t w = write(d->efd, &one, sizeof one);
    (void)w; /* the counter only saturates; nothing to do */
    if (d->cfg.notify)
        d->cfg.notify(d->cfg.notify_user);
}

/* With a shared tier: what missed here is asked there, and records that
 * are now committed (and synced) here go there too. */
static void share_batch(cairn_disk *d, disk_req *list)
{
    if (!d->shared)
        return;
    disk_shared_serve(d, list);
    for (disk_req *r = list; r; r = r->next)
        if (r->op == CAIRN_DISK_RECORD_PUT && r->status == CAIRN_OK)
            disk_shared_record_put(d, r);
}

static size_t list_length(const disk_req *r)
{
    size_t n = 0;
    for (; r; r = r->next)
        n++;
    return n;
}

static void process(cairn_disk *d, disk_req *list);

/* Serve the first half and then the second half as batches of their own
 * (queue order is kept), then relink the list for the caller to free. */
static void process_halves(cairn_disk *d, disk_req *list, size_t n)
{
    disk_req *mid = list;
    for (size_t i = 1; i < n / 2; i++)
        mid = mid->next;
    disk_req *second = mid->next;
    mid->next = NULL;
    process(d, list);
    process(d, second);
    mid->next = second;
}

/* Serve one batch and post its completions. When the map is full, the store
 * deletes its own least recently used pages and tries again; a batch that
 * cannot fit even then is split, and a lone write larger than the whole map
 * fails by itself with CAIRN_EFULL. */
static void process(cairn_disk *d, disk_req *list)
{
    batch_counts bc;
    memset(&bc, 0, sizeof bc);
    bool any_io = false;
    for (disk_req *r = list; r; r = r->next) {
        r->status = CAIRN_OK;
        any_io |= r->op != CAIRN_DISK_FENCE && r->op != CAIRN_DISK_SYNC;
    }
    if (!any_io) {
        sync_if_needed(d, list);
        post(d, list, &bc, 0);
        return;
    }
    size_t n_req = list_length(list);
    size_t n_writes = 0;
    for (disk_req *r = list; r; r = r->next)
        n_writes += r->op == CAIRN_DISK_WRITE;
    if (n_writes > d->max_pages && n_req > 1) {
        process_halves(d, list, n_req); /* more than the disk may hold at once */
        return;
    }
    /* Make room ahead of time: the least recently used values go first. */
    pthread_mutex_lock(&d->cmu);
    uint64_t stored = d->stats.pages;
    pthread_mutex_unlock(&d->cmu);
    if (stored + n_writes > d->max_pages) {
        size_t gone = 0;
        evict_lru(d, (size_t)(stored + n_writes - d->max_pages), &gone);
        pthread_mutex_lock(&d->cmu);
        d->stats.evicted += gone;
        d->stats.pages = d->stats.pages > gone ? d->stats.pages - gone : 0;
        pthread_mutex_unlock(&d->cmu);
    }
    for (int rounds = 0;; rounds++) {
        int rc = serve_batch(d, list, &bc);
        if (rc == MDB_SUCCESS) {
            pthread_mutex_lock(&d->cmu);
            d->stats.commits++;
            pthread_mutex_unlock(&d->cmu);
            sync_if_needed(d, list);
            share_batch(d, list);
            disk_watch_batch(d, list);
            post(d, list, &bc, 0);
            return;
        }
        if (rc == MDB_MAP_FULL) {
            if (n_req > 1 && rounds >= 2) {
                process_halves(d, list, n_req);
                return;
            }
            /* The budget was not enough (fragmentation): evict some more. */
            size_t gone = 0;
            int erc = evict_lru(d, n_writes + 8, &gone);
            if (gone > 0) {
                pthread_mutex_lock(&d->cmu);
                d->stats.evicted += gone;
                d->stats.pages = d->stats.pages > gone ? d->stats.pages - gone : 0;
                pthread_mutex_unlock(&d->cmu);
            }
            if (erc == MDB_SUCCESS && gone > 0)
                continue;
            if (n_req > 1) {
                process_halves(d, list, n_req);
                return;
            }
            /* A lone request and nothing left to evict. */
            memset(&bc, 0, sizeof bc);
            list->status = list->op == CAIRN_DISK_WRITE || list->op == CAIRN_DISK_RECORD_PUT
                               ? CAIRN_EFULL
                           : list->op == CAIRN_DISK_READ || list->op == CAIRN_DISK_RECORD_GET ||
                                     list->op == CAIRN_DISK_READ_CHILD
                               ? CAIRN_ENOTFOUND
                               : CAIRN_EIO;
            bc.reads = bc.misses = list->op == CAIRN_DISK_READ || list->op == CAIRN_DISK_READ_CHILD;
            post(d, list, &bc, list->op == CAIRN_DISK_WRITE);
            return;
        }
        /* Any other failure fails the batch: writes are lost (the cache is
         * only a cache), reads are misses. */
        cairn_log(CAIRN_LOG_WARN, "disk tier: transaction failed: %s", mdb_strerror(rc));
        memset(&bc, 0, sizeof bc);
        uint64_t failures = 0;
        for (disk_req *r = list; r; r = r->next) {
            if (r->op == CAIRN_DISK_WRITE) {
                r->status = CAIRN_EIO;
                failures++;
            } else if (r->op == CAIRN_DISK_READ || r->op == CAIRN_DISK_READ_CHILD) {
                r->status = CAIRN_ENOTFOUND;
                bc.misses++;
                bc.reads++;
            } else if (r->op != CAIRN_DISK_FENCE) {
                r->status = CAIRN_EIO; /* records and syncs: not done */
            }
        }
        post(d, list, &bc, failures);
        return;
    }
}

void *disk_io_main(void *arg)
{
    cairn_disk *d = arg;
    int max_batch = d->cfg.max_batch > 0 ? d->cfg.max_batch : 256;
    for (;;) {
        pthread_mutex_lock(&d->qmu);
        while (!d->head && !d->stopping)
            pthread_cond_wait(&d->qcv, &d->qmu);
        if (!d->head) {
            pthread_mutex_unlock(&d->qmu);
            break;
        }
        disk_req *list = d->head, *last = d->head;
        for (int i = 1; i < max_batch && last->next; i++)
            last = last->next;
        d->head = last->next;
        if (!d->head)
            d->tail = NULL;
        last->next = NULL;
        pthread_mutex_unlock(&d->qmu);

        process(d, list);
        while (list) {
            disk_req *next = list->next;
            free(list->result); /* only when the completion could not be queued */
            free(list);
            list = next;
        }
    }
    return NULL;
}
