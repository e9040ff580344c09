/*
 * store/disk.c — tier 2: KV pages in LMDB, served by one I/O thread.
 *
 * Layout of the environment (one per cache directory), five named databases:
 *   pages   16-byte page key -> value (header + tokens + payload, store.h)
 *   atime   16-byte page key -> 8-byte access tick of that page
 *   lru     8-byte big-endian access tick -> 16-byte page key
 *   meta    "format" -> u32 format version
 *   records the caller's key bytes -> the caller's value bytes (session
 *           records); never evicted, and independent of the page namespace
 * The lru database is the disk tier's own access order: its first entry is
 * the least recently used page, which is what a full map deletes first.
 * Ticks grow monotonically across restarts (the next tick is one past the
 * last lru key found at open).
 *
 * Requests go through a FIFO; the thread takes up to max_batch at a time and
 * serves them, reads and writes interleaved in queue order, inside one write
 * transaction, then queues the completions. Why one write transaction even
 * for reads: a read moves its page in the access order, and a read must see
 * the writes queued before it.
 */
#include "store/store.h"

#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#define DISK_MAGIC "CKVP"

typedef struct disk_req {
    struct disk_req *next;
    cairn_disk_op op;
    uint64_t cookie;
    uint8_t key[16];
    void *dst;           /* read: caller's buffer                          */
    size_t bytes;        /* bytes in data[]                                */
    size_t key_len;      /* records: data[0..key_len) is the key, the rest
                            (bytes - key_len) the value                    */
    void *result;        /* record get: the value, malloc'd, handed over   */
    size_t result_bytes;
    double queued_at;    /* cairn_now() at enqueue: completion latency     */
    int status;
    uint8_t data[];      /* write: the whole value; read: expected tokens  */
} disk_req;

struct cairn_disk {
    cairn_disk_config cfg;
    char *dir;
    size_t value_bytes;  /* header + tokens + payload */
    uint64_t max_pages;  /* keep at most this many values: see page_budget() */
    MDB_env *env;
    MDB_dbi db_pages, db_atime, db_lru, db_meta, db_records;
    uint64_t tick;       /* I/O thread only, after open */

    pthread_t thread;
    bool thread_started;

    pthread_mutex_t qmu; /* request queue */
    pthread_cond_t qcv;
    disk_req *head, *tail;
    bool stopping;

    pthread_mutex_t cmu; /* completions and stats */
    pthread_cond_t ccv;
    cairn_disk_completion *done;
    size_t n_done, cap_done;
    cairn_disk_stats stats;
    int efd;
};

static void set_err(char *err, size_t len, const char *fmt, const char *a, const char *b)
{
    if (err && len)
        snprintf(err, len, fmt, a, b);
}

/* ---- value format ------------------------------------------------------- */

static void put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* Checksum of everything but the checksum field itself. */
static uint64_t value_checksum(const uint8_t *v, size_t bytes)
{
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, v, 40);
    XXH3_64bits_update(&st, v + CAIRN_DISK_HEADER_BYTES, bytes - CAIRN_DISK_HEADER_BYTES);
    return XXH3_64bits_digest(&st);
}

static void build_header(const cairn_disk *d, uint8_t *v)
{
    memcpy(v, DISK_MAGIC, 4);
    put_u16(v + 4, CAIRN_DISK_FORMAT_VERSION);
    put_u16(v + 6, CAIRN_DISK_HEADER_BYTES);
    cairn_page_hash_to_bytes(d->cfg.ns, v + 8);
    put_u32(v + 24, (uint32_t)d->cfg.page_size);
    put_u32(v + 28, 0);
    put_u64(v + 32, (uint64_t)d->cfg.page_bytes);
    put_u64(v + 40, 0); /* checksum, filled once the value is complete */
}

bool cairn_disk_value_verify(const void *value, size_t bytes, cairn_page_hash ns, int page_size,
                             size_t page_bytes, const uint8_t *tokens_le)
{
    const uint8_t *v = value;
    if (!v || !tokens_le || page_size <= 0)
        return false;
    size_t tok_bytes = 4 * (size_t)page_size;
    /* The length check comes first, and guards every read below. */
    if (bytes < CAIRN_DISK_HEADER_BYTES || bytes - CAIRN_DISK_HEADER_BYTES < tok_bytes ||
        bytes - CAIRN_DISK_HEADER_BYTES - tok_bytes != page_bytes)
        return false;
    uint8_t ns_bytes[16];
    cairn_page_hash_to_bytes(ns, ns_bytes);
    return memcmp(v, DISK_MAGIC, 4) == 0 && get_u16(v + 4) == CAIRN_DISK_FORMAT_VERSION &&
           get_u16(v + 6) == CAIRN_DISK_HEADER_BYTES && memcmp(v + 8, ns_bytes, 16) == 0 &&
           get_u32(v + 24) == (uint32_t)page_size && get_u64(v + 32) == (uint64_t)page_bytes &&
           memcmp(v + CAIRN_DISK_HEADER_BYTES, tokens_le, tok_bytes) == 0 &&
           get_u64(v + 40) == value_checksum(v, bytes);
}

/* True when the stored value is the page the caller expects. */
static bool value_ok(const cairn_disk *d, const uint8_t *v, size_t bytes, const uint8_t *tokens_le)
{
    return bytes == d->value_bytes &&
           cairn_disk_value_verify(v, bytes, d->cfg.ns, d->cfg.page_size, d->cfg.page_bytes,
                                   tokens_le);
}

static void tokens_to_le(uint8_t *dst, const int32_t *tokens, int n)
{
    for (int i = 0; i < n; i++)
        put_u32(dst + 4 * i, (uint32_t)tokens[i]);
}

/* ---- LMDB helpers (I/O thread) ------------------------------------------ */

static int map_mdb(int rc)
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

static int delete_page(cairn_disk *d, MDB_txn *txn, MDB_val *key)
{
    int rc = mdb_del(txn, d->db_pages, key, NULL);
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
    while (!rc && k < n && (rc = mdb_cursor_get(cur, &lk, &pk, MDB_FIRST)) == MDB_SUCCESS) {
        uint8_t key[16];
        if (pk.mv_size != 16) {
            rc = mdb_cursor_del(cur, 0);
            continue;
        }
        memcpy(key, pk.mv_data, 16);
        rc = mdb_cursor_del(cur, 0);
        MDB_val kv = {16, key};
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
        k++;
    }
    if (rc == MDB_NOTFOUND)
        rc = MDB_SUCCESS;
    if (!rc)
        mdb_cursor_close(cur);
    if (rc) {
        mdb_txn_abort(txn);
        return rc;
    }
    rc = mdb_txn_commit(txn);
    if (rc)
        return rc;
    *n_out = k;
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
            if (!value_ok(d, val.mv_data, val.mv_size, r->data)) {
                rc = delete_page(d, txn, &key);
                if (rc)
                    break;
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
        if (r->op == CAIRN_DISK_READ) {
            d->stats.read_seconds += waited;
        } else if (r->op == CAIRN_DISK_WRITE) {
            d->stats.write_seconds += waited;
        }
        if (d->n_done < d->cap_done) {
            d->done[d->n_done++] = (cairn_disk_completion){
                .cookie = r->cookie, .op = r->op, .status = r->status, .seconds = waited,
                .data = r->result, .bytes = r->result_bytes};
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
                           : list->op == CAIRN_DISK_READ || list->op == CAIRN_DISK_RECORD_GET
                               ? CAIRN_ENOTFOUND
                               : CAIRN_EIO;
            bc.reads = bc.misses = list->op == CAIRN_DISK_READ;
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
            } else if (r->op == CAIRN_DISK_READ) {
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

static void *io_main(void *arg)
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

/* ---- open / close ------------------------------------------------------- */

static int path_join(char *out, size_t len, const char *dir, const char *name)
{
    int n = snprintf(out, len, "%s/%s", dir, name);
    return n < 0 || (size_t)n >= len ? CAIRN_EINVAL : CAIRN_OK;
}

/* How many values the map holds with room to spare. LMDB cannot even
 * delete when its map is completely full (a delete copies pages too), so
 * the store keeps its own data under three quarters of the map and evicts
 * ahead of time; MDB_MAP_FULL remains only a fallback. A value larger than
 * about half an LMDB page lives in whole overflow pages of its own; smaller
 * ones share leaf pages, which are at least half full. Each value also has
 * an entry in the two access-order databases. */
static uint64_t page_budget(const cairn_disk *d, size_t psize)
{
    size_t node = 16 + 8 + d->value_bytes;
    size_t footprint = node > (psize - 16) / 2 ? (d->value_bytes + 16 + psize - 1) / psize * psize
                                               : 2 * node;
    footprint += 2 * 2 * (16 + 8 + 8); /* atime and lru entries, half-full leaves */
    uint64_t n = (uint64_t)(d->cfg.map_bytes / 4 * 3) / footprint;
    return n > 0 ? n : 1;
}

/* ---- integrity walk ------------------------------------------------------
 *
 * The value checksums protect our bytes, not LMDB's: LMDB trusts its own
 * branch, leaf and free-list pages, so a flipped bit in one of them can send
 * a later transaction (typically the write-back at shutdown, which allocates
 * pages from the free list and splits leaves) through a wild pointer, and
 * the process dies with SIGSEGV. The walk below runs at open, before the
 * server's own process maps the file, in a forked child: it reads the free
 * list (whose page numbers must lie inside the file), then every page not on
 * it with pread (pages_hold_together, below), and only then lets LMDB's
 * cursors read every tree (the main database, each named database, and the
 * header of every overflow page holding a large value, whose page count
 * LMDB trusts when it frees the value); then it exercises the write path in a transaction it aborts, so
 * nothing is written: a probe inserted into and deleted from every database
 * (page allocation from the free list, leaf splits), then every database
 * dropped (which frees every page and overflow run). A child that reports
 * damage or dies of a signal marks the store corrupt; the parent never
 * touches the damaged map. (The overflow check reads LMDB's on-disk page
 * header -- format version 1, stable since 2011: a 16-byte header of page
 * number, pad, flags, then the number of pages of the run.)
 *
 * Cost: proportional to the number of entries (values are not read; an
 * overflow value is only referenced), a few milliseconds for thousands of
 * pages. */

enum { WALK_OK = 0, WALK_CORRUPT = 1 };

static bool mdb_rc_is_damage(int rc)
{
    return rc == MDB_CORRUPTED || rc == MDB_PAGE_NOTFOUND || rc == MDB_INVALID ||
           rc == MDB_BAD_VALSIZE || rc == MDB_BAD_DBI ||
           rc == MDB_INCOMPATIBLE || rc == MDB_VERSION_MISMATCH;
}

typedef struct {
    size_t psize;     /* page size (the mapping is aligned to it) */
    size_t last_pgno; /* last page in use */
    uint8_t *is_free; /* [last_pgno + 1] filled from the free list */
} walk_geometry;

/* A value of more than about half a page lives in its own run of overflow
 * pages; `data` points just past the run's header. Is that header one? */
static bool overflow_header_ok(const walk_geometry *g, const MDB_val *v)
{
    enum { PAGE_HEADER = 16, P_OVERFLOW_FLAG = 0x04 };
    const char *data = v->mv_data;
    if (v->mv_size < g->psize / 2)
        return true; /* kept inside its leaf page */
    const char *page = data - PAGE_HEADER;
    if ((uintptr_t)page % g->psize != 0)
        return true; /* not at a page start: an inline value */
    uint64_t pgno;
    uint16_t flags;
    uint32_t n_pages;
    memcpy(&pgno, page, 8);
    memcpy(&flags, page + 10, 2);
    memcpy(&n_pages, page + 12, 4);
    if (!(flags & P_OVERFLOW_FLAG))
        return true; /* a leaf page that happens to start there */
    size_t want = (PAGE_HEADER + v->mv_size + g->psize - 1) / g->psize;
    return pgno >= 2 && n_pages == want && pgno + n_pages - 1 <= g->last_pgno;
}

/* Every entry of `dbi`; MDB_SUCCESS, or the LMDB error that stopped it. The
 * count must agree with the tree's own statistics. */
static int walk_db(MDB_txn *txn, MDB_dbi dbi, bool free_list, walk_geometry *g)
{
    const size_t last_pgno = g->last_pgno;
    MDB_cursor *cur;
    int rc = mdb_cursor_open(txn, dbi, &cur);
    if (rc)
        return rc;
    MDB_val k, v;
    size_t n = 0;
    while ((rc = mdb_cursor_get(cur, &k, &v, n ? MDB_NEXT : MDB_FIRST)) == MDB_SUCCESS) {
        n++;
        if (!overflow_header_ok(g, &v)) {
            rc = MDB_CORRUPTED;
            break;
        }
        if (free_list) {
            /* An entry is a list of free page numbers: a count, then that
             * many page numbers, each of which must be a page of the file. */
            size_t count;
            if (v.mv_size < sizeof count) {
                rc = MDB_CORRUPTED;
                break;
            }
            memcpy(&count, v.mv_data, sizeof count);
            if (count > v.mv_size / sizeof(size_t) - 1) {
                rc = MDB_CORRUPTED;
                break;
            }
            for (size_t i = 1; i <= count; i++) {
                size_t pgno;
                memcpy(&pgno, (const char *)v.mv_data + i * sizeof pgno, sizeof pgno);
                if (pgno < 2 || pgno > last_pgno) {
                    rc = MDB_CORRUPTED;
                    break;
                }
                g->is_free[pgno] = 1;
            }
            if (rc)
                break;
        }
    }
    mdb_cursor_close(cur);
    if (rc != MDB_NOTFOUND)
        return rc;
    MDB_stat st;
    if ((rc = mdb_stat(txn, dbi, &st)) != MDB_SUCCESS)
        return rc;
    return st.ms_entries == n ? MDB_SUCCESS : MDB_CORRUPTED;
}

/* Every page in use (not on the free list) must be a branch or leaf page
 * whose header and node offsets fit in the page, or the head of an overflow
 * run that ends inside the file. Read with pread from the file itself. In
 * LMDB's format (version 1) a page starts with its number (8 bytes), 2 pad
 * bytes, 2 flag bytes, then lower and upper (2 bytes each: where the node
 * offsets end and the nodes begin), or for an overflow head the run's page
 * count (4 bytes); the node offsets follow the 16-byte header. A node is an
 * 8-byte header (data size low 16 and high 16 bits -- a child page number
 * in a branch --, flags, key size), the key, then (in a leaf) the data, or
 * 8 bytes naming an overflow run when the flags say F_BIGDATA; nodes are
 * packed, each rounded up to an even size, from `upper` to the page's end,
 * so their sizes must add up to exactly that span. */
static bool pages_hold_together(const char *path, const walk_geometry *g)
{
    enum { HDR = 16, F_BRANCH = 0x01, F_LEAF = 0x02, F_OVERFLOW = 0x04, F_LEAF2 = 0x20 };
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return true; /* not ours to judge: the parent's open will say */
    uint8_t *page = malloc(g->psize);
    bool ok = page != NULL;
    for (size_t pgno = 2; ok && pgno <= g->last_pgno; pgno++) {
        if (g->is_free[pgno])
            continue;
        ssize_t got = pread(fd, page, g->psize, (off_t)(pgno * g->psize));
        if (got != (ssize_t)g->psize) {
            ok = false;
            break;
        }
        uint64_t stored;
        uint16_t flags, lower, upper;
        uint32_t n_pages;
        memcpy(&stored, page, 8);
        memcpy(&flags, page + 10, 2);
        memcpy(&lower, page + 12, 2);
        memcpy(&upper, page + 14, 2);
        memcpy(&n_pages, page + 12, 4);
        if (stored != pgno) {
            ok = false;
        } else if (flags & F_OVERFLOW) {
            ok = n_pages >= 1 && pgno + n_pages - 1 <= g->last_pgno;
            pgno += n_pages - 1; /* the rest of the run is the value's bytes */
        } else if (flags & (F_BRANCH | F_LEAF)) {
            ok = lower >= HDR && lower <= upper && upper <= g->psize;
            size_t packed = 0;
            if (ok && !(flags & F_LEAF2)) {
                for (size_t i = HDR; ok && i + 2 <= lower; i += 2) {
                    uint16_t at, lo, hi, nflags, ksize;
                    memcpy(&at, page + i, 2);
                    ok = at >= upper && at + 8u <= g->psize;
                    if (!ok)
                        break;
                    memcpy(&lo, page + at, 2);
                    memcpy(&hi, page + at + 2, 2);
                    memcpy(&nflags, page + at + 4, 2);
                    memcpy(&ksize, page + at + 6, 2);
                    size_t data = 0;
                    if (flags & F_LEAF)
                        data = (nflags & 0x01 /* F_BIGDATA */) ? 8 : ((size_t)hi << 16 | lo);
                    size_t size = (8 + (size_t)ksize + data + 1) & ~(size_t)1;
                    ok = at + size <= g->psize;
                    packed += size;
                }
                ok = ok && packed == g->psize - upper;
            }
        } else {
            ok = false;
        }
    }
    free(page);
    close(fd);
    return ok;
}

static const char *const STORE_DBS[] = {"pages", "atime", "lru", "meta", "records"};
#define N_STORE_DBS (sizeof STORE_DBS / sizeof STORE_DBS[0])

/* The child's side: WALK_OK or WALK_CORRUPT as its exit status. An error
 * that is not damage (permissions, memory) is left for the parent's own
 * open to report, so it exits WALK_OK. */
static int walk_store(const char *dir, size_t map_bytes)
{
    MDB_env *env;
    if (mdb_env_create(&env))
        return WALK_OK;
    mdb_env_set_maxdbs(env, 8);
    mdb_env_set_mapsize(env, map_bytes);
    int rc = mdb_env_open(env, dir, MDB_NOTLS | MDB_NOSYNC, 0600);
    if (rc) {
        mdb_env_close(env);
        return mdb_rc_is_damage(rc) ? WALK_CORRUPT : WALK_OK;
    }
    MDB_envinfo info;
    MDB_stat est;
    char path[4096];
    struct stat sb;
    if (mdb_env_info(env, &info) || mdb_env_stat(env, &est) ||
        path_join(path, sizeof path, dir, "data.mdb") != CAIRN_OK || stat(path, &sb) != 0 ||
        (uint64_t)sb.st_size < ((uint64_t)info.me_last_pgno + 1) * est.ms_psize) {
        mdb_env_close(env);
        return WALK_CORRUPT; /* the parent would refuse it too; don't map past the end */
    }

    walk_geometry geo = {.psize = est.ms_psize, .last_pgno = info.me_last_pgno,
                         .is_free = calloc(info.me_last_pgno + 1, 1)};
    if (!geo.is_free) {
        mdb_env_close(env);
        return WALK_OK;
    }

    /* 1. Read every tree. */
    MDB_txn *txn;
    if ((rc = mdb_txn_begin(env, NULL, MDB_RDONLY, &txn)))
        return mdb_rc_is_damage(rc) ? WALK_CORRUPT : WALK_OK;
    MDB_dbi main_dbi, dbis[N_STORE_DBS];
    bool have[N_STORE_DBS] = {false};
    /* The free list first: the page scan needs to know which pages are
     * free, and every other page is checked by that scan before a cursor of
     * LMDB's walks the trees above it. */
    rc = walk_db(txn, 0 /* the free list */, true, &geo);
    if (!rc && !pages_hold_together(path, &geo))
        rc = MDB_CORRUPTED;
    if (!rc)
        rc = mdb_dbi_open(txn, NULL, 0, &main_dbi);
    if (!rc)
        rc = walk_db(txn, main_dbi, false, &geo);
    for (size_t i = 0; !rc && i < N_STORE_DBS; i++) {
        int o = mdb_dbi_open(txn, STORE_DBS[i], 0, &dbis[i]);
        if (o == MDB_NOTFOUND)
            continue;
        if ((rc = o) == MDB_SUCCESS && (rc = walk_db(txn, dbis[i], false, &geo)) ==
                                           MDB_SUCCESS)
            have[i] = true;
    }
    mdb_txn_abort(txn);
    if (rc)
        return mdb_rc_is_damage(rc) || rc == MDB_NOTFOUND ? WALK_CORRUPT : WALK_OK;

    /* 2. The write path, aborted: page allocation (from the free list),
     * leaf splits and deletion in every database. */
    if ((rc = mdb_txn_begin(env, NULL, 0, &txn)))
        return mdb_rc_is_damage(rc) ? WALK_CORRUPT : WALK_OK;
    static uint8_t big[3 * 4096 + 1];
    const uint8_t probe_key[24] = "cairn-integrity-probe";
    bool spent = false; /* a full map ends the transaction; not damage */
    for (size_t i = 0; !rc && !spent && i < N_STORE_DBS; i++) {
        if (!have[i] || (rc = mdb_dbi_open(txn, STORE_DBS[i], 0, &dbis[i])))
            continue;
        MDB_val k = {sizeof probe_key, (void *)probe_key};
        MDB_val v = {i == 0 ? sizeof big : 8, big};
        rc = mdb_put(txn, dbis[i], &k, &v, MDB_NOOVERWRITE);
        if (rc == MDB_KEYEXIST) {
            rc = MDB_SUCCESS; /* not damage; nothing to delete */
            continue;
        }
        if (rc == MDB_MAP_FULL || rc == MDB_TXN_FULL) {
            rc = MDB_SUCCESS;
            spent = true;
            break;
        }
        if (!rc)
            rc = mdb_del(txn, dbis[i], &k, NULL);
    }
    for (size_t i = 0; !rc && !spent && i < N_STORE_DBS; i++)
        if (have[i])
            rc = mdb_drop(txn, dbis[i], 0);
    if (rc == MDB_MAP_FULL || rc == MDB_TXN_FULL)
        rc = MDB_SUCCESS;
    mdb_txn_abort(txn);
    mdb_env_close(env);
    return rc && mdb_rc_is_damage(rc) ? WALK_CORRUPT : WALK_OK;
}

/* CAIRN_OK when the store at d->dir passed the walk (or there is none yet),
 * CAIRN_ECORRUPT otherwise. */
static int check_store_integrity(const cairn_disk *d, char *err, size_t err_len)
{
    char path[4096];
    struct stat sb;
    if (path_join(path, sizeof path, d->dir, "data.mdb") != CAIRN_OK || stat(path, &sb) != 0 ||
        sb.st_size == 0)
        return CAIRN_OK; /* a new store, or one LMDB's open will judge */
    pid_t pid = fork();
    if (pid < 0) {
        cairn_log(CAIRN_LOG_WARN, "disk tier: cannot fork to check %s (%s); opening unchecked",
                  d->dir, strerror(errno));
        return CAIRN_OK;
    }
    if (pid == 0) {
        /* This process exists to die in the server's place: a fault in it is
         * the verdict, not a bug to report. Take back the fatal signals from
         * any handler the parent installed (a crash reporter, a sanitizer's
         * runtime, whose report would count as a failure of its own) and
         * leave no core file of a copy of the server behind. */
        static const int fatal[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
        for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; i++)
            signal(fatal[i], SIG_DFL);
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        _exit(walk_store(d->dir, d->cfg.map_bytes));
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            cairn_log(CAIRN_LOG_WARN, "disk tier: lost the check of %s (%s); opening unchecked",
                      d->dir, strerror(errno));
            return CAIRN_OK;
        }
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == WALK_OK)
        return CAIRN_OK;
    if (WIFSIGNALED(status)) {
        if (err && err_len)
            snprintf(err, err_len, "LMDB store %s is damaged: its integrity walk died of signal %d",
                     d->dir, WTERMSIG(status));
    } else
        set_err(err, err_len, "LMDB store %s is damaged: its B-trees or free list do not "
                              "hold together%s", d->dir, "");
    return CAIRN_ECORRUPT;
}

/* Open the environment and its databases. CAIRN_ECORRUPT when the files are
 * not a usable store. */
static int open_env(cairn_disk *d, char *err, size_t err_len)
{
    int rc = mdb_env_create(&d->env);
    if (rc)
        return map_mdb(rc);
    mdb_env_set_maxdbs(d->env, 8);
    mdb_env_set_mapsize(d->env, d->cfg.map_bytes);
    unsigned flags = MDB_NOTLS | (d->cfg.durable ? 0 : MDB_NOSYNC);
    rc = mdb_env_open(d->env, d->dir, flags, 0600);
    if (rc) {
        set_err(err, err_len, "cannot open LMDB environment %s: %s", d->dir, mdb_strerror(rc));
        mdb_env_close(d->env);
        d->env = NULL;
        return rc == MDB_INVALID || rc == MDB_VERSION_MISMATCH || rc == MDB_CORRUPTED
                   ? CAIRN_ECORRUPT
                   : map_mdb(rc);
    }
    int dead;
    mdb_reader_check(d->env, &dead); /* slots of killed processes */

    /* A data file shorter than its own last page would fault on access. */
    MDB_envinfo info;
    MDB_stat est;
    char path[4096];
    struct stat sb;
    if (mdb_env_info(d->env, &info) == MDB_SUCCESS && mdb_env_stat(d->env, &est) == MDB_SUCCESS &&
        path_join(path, sizeof path, d->dir, "data.mdb") == CAIRN_OK && stat(path, &sb) == 0 &&
        (uint64_t)sb.st_size < ((uint64_t)info.me_last_pgno + 1) * est.ms_psize) {
        set_err(err, err_len, "LMDB data file %s is shorter than its metadata says%s", path, "");
        mdb_env_close(d->env);
        d->env = NULL;
        return CAIRN_ECORRUPT;
    }
    /* A map smaller than the one the file was created with: take ours when
     * the data still fits (LMDB keeps the larger otherwise). */
    if (info.me_mapsize != d->cfg.map_bytes)
        mdb_env_set_mapsize(d->env, d->cfg.map_bytes);
    d->max_pages = page_budget(d, est.ms_psize ? est.ms_psize : 4096);

    MDB_txn *txn;
    rc = mdb_txn_begin(d->env, NULL, 0, &txn);
    if (!rc)
        rc = mdb_dbi_open(txn, "pages", MDB_CREATE, &d->db_pages);
    if (!rc)
        rc = mdb_dbi_open(txn, "atime", MDB_CREATE, &d->db_atime);
    if (!rc)
        rc = mdb_dbi_open(txn, "lru", MDB_CREATE, &d->db_lru);
    if (!rc)
        rc = mdb_dbi_open(txn, "meta", MDB_CREATE, &d->db_meta);
    if (!rc)
        rc = mdb_dbi_open(txn, "records", MDB_CREATE, &d->db_records);
    uint32_t version = CAIRN_DISK_FORMAT_VERSION;
    if (!rc) {
        MDB_val k = {6, "format"}, v;
        int g = mdb_get(txn, d->db_meta, &k, &v);
        if (g == MDB_NOTFOUND) {
            v = (MDB_val){4, &version};
            rc = mdb_put(txn, d->db_meta, &k, &v, 0);
        } else if (g) {
            rc = g;
        } else if (v.mv_size != 4 || memcmp(v.mv_data, &version, 4) != 0) {
            rc = MDB_INVALID; /* another format: not ours to read */
        }
    }
    if (!rc) {
        MDB_cursor *cur;
        MDB_val lk, pk;
        rc = mdb_cursor_open(txn, d->db_lru, &cur);
        if (!rc) {
            int g = mdb_cursor_get(cur, &lk, &pk, MDB_LAST);
            d->tick = 0;
            if (g == MDB_SUCCESS && lk.mv_size == 8) {
                const uint8_t *b = lk.mv_data;
                for (int i = 0; i < 8; i++)
                    d->tick = d->tick << 8 | b[i];
                d->tick++;
            } else if (g != MDB_NOTFOUND && g != MDB_SUCCESS) {
                rc = g;
            }
            mdb_cursor_close(cur);
        }
    }
    MDB_stat ms;
    if (!rc && (rc = mdb_stat(txn, d->db_pages, &ms)) == MDB_SUCCESS)
        d->stats.pages = ms.ms_entries;
    if (!rc && (rc = mdb_stat(txn, d->db_records, &ms)) == MDB_SUCCESS)
        d->stats.records = ms.ms_entries;
    if (!rc)
        rc = mdb_txn_commit(txn);
    else if (txn)
        mdb_txn_abort(txn);
    if (rc) {
        set_err(err, err_len, "cannot open the databases of %s: %s", d->dir, mdb_strerror(rc));
        mdb_env_close(d->env);
        d->env = NULL;
        return rc == MDB_INVALID || rc == MDB_CORRUPTED || rc == MDB_PAGE_NOTFOUND ||
                       rc == MDB_INCOMPATIBLE
                   ? CAIRN_ECORRUPT
                   : map_mdb(rc);
    }
    return CAIRN_OK;
}

int cairn_disk_open(const cairn_disk_config *cfg, cairn_disk **out, char *err, size_t err_len)
{
    if (!cfg || !out || !cfg->dir || cfg->page_size <= 0 || cfg->page_bytes == 0 ||
        cfg->map_bytes < 65536)
        return CAIRN_EINVAL;
    if (mkdir(cfg->dir, 0700) != 0 && errno != EEXIST) {
        set_err(err, err_len, "cannot create %s: %s", cfg->dir, strerror(errno));
        return CAIRN_EIO;
    }
    cairn_disk *d = calloc(1, sizeof *d);
    if (!d)
        return CAIRN_ENOMEM;
    d->cfg = *cfg;
    d->dir = strdup(cfg->dir);
    d->cfg.dir = d->dir;
    d->value_bytes = CAIRN_DISK_HEADER_BYTES + 4 * (size_t)cfg->page_size + cfg->page_bytes;
    d->efd = -1;
    pthread_mutex_init(&d->qmu, NULL);
    pthread_cond_init(&d->qcv, NULL);
    pthread_mutex_init(&d->cmu, NULL);
    pthread_cond_init(&d->ccv, NULL);
    if (!d->dir) {
        cairn_disk_close(d);
        return CAIRN_ENOMEM;
    }
    int rc = check_store_integrity(d, err, err_len);
    if (rc == CAIRN_OK)
        rc = open_env(d, err, err_len);
    if (rc == CAIRN_ECORRUPT && cfg->reset_if_corrupt) {
        char path[4096];
        cairn_log(CAIRN_LOG_WARN, "disk tier: %s is unusable, starting it empty",
                  d->dir);
        if (path_join(path, sizeof path, d->dir, "data.mdb") == CAIRN_OK)
            unlink(path);
        if (path_join(path, sizeof path, d->dir, "lock.mdb") == CAIRN_OK)
            unlink(path);
        memset(&d->stats, 0, sizeof d->stats);
        d->stats.reset_on_open = true;
        rc = open_env(d, err, err_len);
    }
    if (rc == CAIRN_OK) {
        d->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (d->efd < 0)
            rc = CAIRN_EIO;
    }
    if (rc == CAIRN_OK) {
        if (pthread_create(&d->thread, NULL, io_main, d) != 0)
            rc = CAIRN_ENOMEM;
        else
            d->thread_started = true;
    }
    if (rc) {
        cairn_disk_close(d);
        return rc;
    }
    *out = d;
    return CAIRN_OK;
}

void cairn_disk_close(cairn_disk *d)
{
    if (!d)
        return;
    if (d->thread_started) {
        pthread_mutex_lock(&d->qmu);
        d->stopping = true;
        pthread_cond_signal(&d->qcv);
        pthread_mutex_unlock(&d->qmu);
        pthread_join(d->thread, NULL);
    }
    while (d->head) {
        disk_req *n = d->head->next;
        free(d->head->result);
        free(d->head);
        d->head = n;
    }
    for (size_t i = 0; i < d->n_done; i++)
        free(d->done[i].data);
    if (d->env)
        mdb_env_close(d->env);
    if (d->efd >= 0)
        close(d->efd);
    pthread_mutex_destroy(&d->qmu);
    pthread_cond_destroy(&d->qcv);
    pthread_mutex_destroy(&d->cmu);
    pthread_cond_destroy(&d->ccv);
    free(d->done);
    free(d->dir);
    free(d);
}

/* ---- requests ----------------------------------------------------------- */

static int enqueue(cairn_disk *d, disk_req *r)
{
    r->queued_at = cairn_now();
    pthread_mutex_lock(&d->qmu);
    if (d->stopping) {
        pthread_mutex_unlock(&d->qmu);
        free(r);
        return CAIRN_ECLOSED;
    }
    if (d->tail)
        d->tail->next = r;
    else
        d->head = r;
    d->tail = r;
    pthread_cond_signal(&d->qcv);
    pthread_mutex_unlock(&d->qmu);
    return CAIRN_OK;
}

int cairn_disk_write(cairn_disk *d, cairn_page_hash key, const int32_t *tokens, const void *payload,
                     uint64_t cookie)
{
    if (!d || !tokens || !payload)
        return CAIRN_EINVAL;
    disk_req *r = malloc(sizeof *r + d->value_bytes);
    if (!r)
        return CAIRN_ENOMEM;
    memset(r, 0, sizeof *r);
    r->op = CAIRN_DISK_WRITE;
    r->cookie = cookie;
    cairn_page_hash_to_bytes(key, r->key);
    r->bytes = d->value_bytes;
    build_header(d, r->data);
    tokens_to_le(r->data + CAIRN_DISK_HEADER_BYTES, tokens, d->cfg.page_size);
    memcpy(r->data + CAIRN_DISK_HEADER_BYTES + 4 * (size_t)d->cfg.page_size, payload,
           d->cfg.page_bytes);
    /* The checksum is the only per-byte work left; it is cheap next to the
     * copy above, and doing it here keeps the I/O thread's loop simple. */
    put_u64(r->data + 40, value_checksum(r->data, r->bytes));
    return enqueue(d, r);
}

int cairn_disk_read(cairn_disk *d, cairn_page_hash key, const int32_t *tokens, void *dst,
                    uint64_t cookie)
{
    if (!d || !tokens || !dst)
        return CAIRN_EINVAL;
    size_t tb = 4 * (size_t)d->cfg.page_size;
    disk_req *r = malloc(sizeof *r + tb);
    if (!r)
        return CAIRN_ENOMEM;
    memset(r, 0, sizeof *r);
    r->op = CAIRN_DISK_READ;
    r->cookie = cookie;
    r->dst = dst;
    cairn_page_hash_to_bytes(key, r->key);
    r->bytes = tb;
    tokens_to_le(r->data, tokens, d->cfg.page_size);
    return enqueue(d, r);
}

int cairn_disk_fence(cairn_disk *d, uint64_t cookie)
{
    if (!d)
        return CAIRN_EINVAL;
    disk_req *r = calloc(1, sizeof *r);
    if (!r)
        return CAIRN_ENOMEM;
    r->op = CAIRN_DISK_FENCE;
    r->cookie = cookie;
    return enqueue(d, r);
}

int cairn_disk_poll(cairn_disk *d, cairn_disk_completion *out, int max, int *n)
{
    if (!d || !n || max < 0 || (max > 0 && !out))
        return CAIRN_EINVAL;
    pthread_mutex_lock(&d->cmu);
    size_t k = d->n_done < (size_t)max ? d->n_done : (size_t)max;
    if (k) {
        memcpy(out, d->done, k * sizeof *out);
        memmove(d->done, d->done + k, (d->n_done - k) * sizeof *d->done);
        d->n_done -= k;
    }
    if (d->n_done == 0) {
        uint64_t v;
        ssize_t r = read(d->efd, &v, sizeof v); /* reset; EAGAIN when already 0 */
        (void)r;
    }
    pthread_mutex_unlock(&d->cmu);
    *n = (int)k;
    return CAIRN_OK;
}

int cairn_disk_wait(cairn_disk *d, int timeout_ms)
{
    if (!d)
        return CAIRN_EINVAL;
    struct pollfd p = {.fd = d->efd, .events = POLLIN};
    pthread_mutex_lock(&d->cmu);
    bool ready = d->n_done > 0;
    pthread_mutex_unlock(&d->cmu);
    if (!ready)
        poll(&p, 1, timeout_ms);
    return CAIRN_OK;
}

int cairn_disk_notify_fd(const cairn_disk *d) { return d ? d->efd : -1; }

void cairn_disk_get_stats(cairn_disk *d, cairn_disk_stats *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (!d)
        return;
    pthread_mutex_lock(&d->cmu);
    *out = d->stats;
    pthread_mutex_unlock(&d->cmu);
}

/* ---- durability and records --------------------------------------------- */

int cairn_disk_sync(cairn_disk *d, uint64_t cookie)
{
    if (!d)
        return CAIRN_EINVAL;
    disk_req *r = calloc(1, sizeof *r);
    if (!r)
        return CAIRN_ENOMEM;
    r->op = CAIRN_DISK_SYNC;
    r->cookie = cookie;
    return enqueue(d, r);
}

static bool record_key_ok(const cairn_disk *d, const void *key, size_t key_len)
{
    return key && key_len > 0 && key_len <= (size_t)mdb_env_get_maxkeysize(d->env);
}

static int record_request(cairn_disk *d, cairn_disk_op op, const void *key, size_t key_len,
                          const void *value, size_t value_bytes, uint64_t cookie)
{
    if (!d || !record_key_ok(d, key, key_len) || (value_bytes && !value) ||
        value_bytes > CAIRN_DISK_RECORD_MAX_BYTES)
        return CAIRN_EINVAL;
    disk_req *r = malloc(sizeof *r + key_len + value_bytes);
    if (!r)
        return CAIRN_ENOMEM;
    memset(r, 0, sizeof *r);
    r->op = op;
    r->cookie = cookie;
    r->key_len = key_len;
    r->bytes = key_len + value_bytes;
    memcpy(r->data, key, key_len);
    if (value_bytes)
        memcpy(r->data + key_len, value, value_bytes);
    return enqueue(d, r);
}

int cairn_disk_record_put(cairn_disk *d, const void *key, size_t key_len, const void *value,
                          size_t value_bytes, uint64_t cookie)
{
    return record_request(d, CAIRN_DISK_RECORD_PUT, key, key_len, value, value_bytes, cookie);
}

int cairn_disk_record_delete(cairn_disk *d, const void *key, size_t key_len, uint64_t cookie)
{
    return record_request(d, CAIRN_DISK_RECORD_DELETE, key, key_len, NULL, 0, cookie);
}

int cairn_disk_record_get(cairn_disk *d, const void *key, size_t key_len, uint64_t cookie)
{
    return record_request(d, CAIRN_DISK_RECORD_GET, key, key_len, NULL, 0, cookie);
}

int cairn_disk_record_read(cairn_disk *d, const void *key, size_t key_len, void **value,
                           size_t *value_bytes)
{
    if (!d || !record_key_ok(d, key, key_len) || !value || !value_bytes)
        return CAIRN_EINVAL;
    MDB_txn *txn;
    int rc = mdb_txn_begin(d->env, NULL, MDB_RDONLY, &txn);
    if (rc)
        return map_mdb(rc);
    MDB_val k = {key_len, (void *)key}, v;
    rc = mdb_get(txn, d->db_records, &k, &v);
    int out = map_mdb(rc);
    if (rc == MDB_SUCCESS) {
        void *copy = malloc(v.mv_size ? v.mv_size : 1);
        if (!copy) {
            out = CAIRN_ENOMEM;
        } else {
            memcpy(copy, v.mv_data, v.mv_size);
            *value = copy;
            *value_bytes = v.mv_size;
        }
    }
    mdb_txn_abort(txn);
    return out;
}

int cairn_disk_record_iterate(cairn_disk *d, cairn_disk_record_fn fn, void *user)
{
    if (!d || !fn)
        return CAIRN_EINVAL;
    MDB_txn *txn;
    int rc = mdb_txn_begin(d->env, NULL, MDB_RDONLY, &txn);
    if (rc)
        return map_mdb(rc);
    MDB_cursor *cur;
    rc = mdb_cursor_open(txn, d->db_records, &cur);
    if (rc) {
        mdb_txn_abort(txn);
        return map_mdb(rc);
    }
    MDB_val k, v;
    int out = CAIRN_OK;
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == MDB_SUCCESS;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        out = fn(k.mv_data, k.mv_size, v.mv_data, v.mv_size, user);
        if (out)
            break;
    }
    if (!out && rc != MDB_NOTFOUND)
        out = map_mdb(rc);
    mdb_cursor_close(cur);
    mdb_txn_abort(txn);
    return out;
}
