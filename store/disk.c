/*
 * store/disk.c — tier 2: KV pages in LMDB, served by one I/O thread. This
 * file opens and closes the store and queues its requests; disk_io.c
 * serves them, disk_verify.c holds the value format and the integrity walk,
 * disk_records.c the durable fence and records (see disk_impl.h).
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
#include "store/tiers.h"
#include "store/disk_impl.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- open / close ------------------------------------------------------- */

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

/* Open the environment and its databases. CAIRN_ECORRUPT when the files are
 * not a usable store. */
static int open_env(cairn_disk *d, char *err, size_t err_len)
{
    int rc = mdb_env_create(&d->env);
    if (rc)
        return disk_map_mdb(rc);
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
                   : disk_map_mdb(rc);
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
    if (!rc)
        rc = mdb_dbi_open(txn, "children", MDB_CREATE | MDB_DUPSORT, &d->db_children);
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
                   : disk_map_mdb(rc);
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
    int rc = disk_check_store_integrity(d, err, err_len);
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
    if (rc == CAIRN_OK)
        rc = disk_shared_open(d, err, err_len);
    if (rc == CAIRN_OK) {
        if (pthread_create(&d->thread, NULL, disk_io_main, d) != 0)
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
    disk_shared_close(d);
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

int disk_enqueue(cairn_disk *d, disk_req *r)
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

int cairn_disk_write(cairn_disk *d, cairn_page_hash key, const cairn_disk_page_origin *origin,
                     const int32_t *tokens, const void *payload, uint64_t cookie)
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
    disk_build_header(d, r->data);
    if (origin) {
        /* The first four bytes of the page before it: enough to find its
         * parent again after a restart (cairn_disk_announce_pages checks
         * each candidate by hashing), and covered by the checksum. */
        cairn_page_hash_to_bytes(origin->parent, r->parent);
        disk_parent_word(r->parent, r->data + DISK_PARENT_WORD_AT);
        r->announce = (uint8_t)((origin->announce ? DISK_ANNOUNCE : 0) |
                                (origin->has_parent ? DISK_HAS_PARENT | DISK_INDEXED : 0));
    }
    disk_tokens_to_le(r->data + CAIRN_DISK_HEADER_BYTES, tokens, d->cfg.page_size);
    memcpy(r->data + CAIRN_DISK_HEADER_BYTES + 4 * (size_t)d->cfg.page_size, payload,
           d->cfg.page_bytes);
    /* The checksum is the only per-byte work left; it is cheap next to the
     * copy above, and doing it here keeps the I/O thread's loop simple. */
    put_u64(r->data + 40, disk_value_checksum(r->data, r->bytes));
    return disk_enqueue(d, r);
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
    disk_tokens_to_le(r->data, tokens, d->cfg.page_size);
    return disk_enqueue(d, r);
}

int cairn_disk_read_child(cairn_disk *d, cairn_page_hash parent, const int32_t *next,
                          size_t n_next, void *dst, uint64_t cookie)
{
    if (!d || !next || !dst || n_next == 0 ||
        n_next >= (size_t)d->cfg.page_size)
        return CAIRN_EINVAL;
    disk_req *r = malloc(sizeof *r + n_next * sizeof *next);
    if (!r)
        return CAIRN_ENOMEM;
    memset(r, 0, sizeof *r);
    r->op = CAIRN_DISK_READ_CHILD;
    r->cookie = cookie;
    r->dst = dst;
    cairn_page_hash_to_bytes(parent, r->parent);
    r->n_next = (int)n_next;
    memcpy(r->data, next, n_next * sizeof *next);
    return disk_enqueue(d, r);
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
    return disk_enqueue(d, r);
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
    disk_shared_stats(d, out);
}
