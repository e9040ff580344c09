/*
 * store/disk_impl.h — internal to the disk tier (tier 2, cairn_disk). Nothing
 * outside store/ includes this, and inside it only the disk*.c files do.
 *
 * The disk tier is four files, one responsibility each:
 *   disk.c          open / close, the request functions and their queue,
 *                   poll, wait, stats
 *   disk_io.c       LMDB helpers and serving a batch on the I/O thread
 *   disk_verify.c   the value format, and the integrity walk run at open
 *                   in a forked child
 *   disk_records.c  the durable fence and durable records
 *   disk_shared.c   tier 3: Redis under LMDB (reads that missed, a writer
 *                   thread for shared pages, records and page events)
 * Functions one of them defines for the others carry the disk_ prefix.
 */
#ifndef CAIRN_DISK_IMPL_H
#define CAIRN_DISK_IMPL_H

#include "store/tiers.h"

#include <lmdb.h>
#include <pthread.h>
#include <stdio.h>

#define DISK_MAGIC "CKVP"

/* A request in the FIFO: disk.c and disk_records.c queue it, disk_io.c
 * serves it. */
typedef struct disk_req {
    struct disk_req *next;
    cairn_disk_op op;
    uint64_t cookie;
    uint8_t key[16];
    void *dst;           /* read: caller's buffer                          */
    size_t bytes;        /* bytes in data[]                                */
    size_t key_len;      /* records: data[0..key_len) is the key, the rest
                            (bytes - key_len) the value                    */
    void *result;        /* record get: the value; read child: the page's
                            tokens (int32_t); malloc'd, handed over        */
    size_t result_bytes;
    double queued_at;    /* cairn_now() at enqueue: completion latency     */
    int status;
    bool shared_asked;   /* a miss this batch asked the shared tier about  */
    bool from_shared;    /* ... and the shared tier answered               */
    bool seen_elsewhere; /* ... or not, but another replica asked it before */
    bool busy_elsewhere; /* ... and said it writes what it computes, lately */
    uint8_t announce;    /* write: DISK_ANNOUNCE / DISK_HAS_PARENT (disk_watch.c),
                            DISK_INDEXED (listed under its parent)         */
    int n_next;          /* read child: next[] tokens in data[]            */
    int matched;         /* read child: what the page found shares         */

    bool deleted;        /* read: the value failed verification and went   */
    uint8_t parent[16];  /* write: the page before this one (or the seed);
                            read child: the parent looked under            */
    uint8_t data[];      /* write: the whole value; read: expected tokens  */
} disk_req;

typedef struct disk_shared disk_shared; /* disk_shared.c */

/* The store; its I/O thread is disk_io_main. */
struct cairn_disk {
    cairn_disk_config cfg;
    char *dir;
    size_t value_bytes;  /* header + tokens + payload */
    uint64_t max_pages;  /* keep at most this many values: see page_budget() */
    MDB_env *env;
    MDB_dbi db_pages, db_atime, db_lru, db_meta, db_records;
    MDB_dbi db_children; /* parent word -> child keys (DUPSORT): read_child */
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

    disk_shared *shared; /* tier 3, NULL without one */

    /* the page watcher (disk_watch.c), set and read under cmu, called on
     * the I/O thread outside it */
    cairn_disk_watch_fn watch_fn;
    void *watch_user;
};

/* disk_req.announce bits */
enum { DISK_ANNOUNCE = 1, DISK_HAS_PARENT = 2, DISK_INDEXED = 4 };

/* Where a value keeps its parent: the first four bytes of the parent's
 * hash, as a little-endian word at this offset of the header. The children
 * database is keyed by those four bytes (a value deleted tells which entry
 * to drop); two parents sharing them are told apart by hashing. */
#define DISK_PARENT_WORD_AT 28

/* disk_watch.c: tell the watcher what a committed batch stored and
 * deleted; the keys [n][16] an LRU eviction deleted. I/O thread. */
bool disk_watching(cairn_disk *d);
void disk_watch_batch(cairn_disk *d, const disk_req *list);
void disk_watch_deleted(cairn_disk *d, const uint8_t (*keys)[16], size_t n);

static inline void set_err(char *err, size_t len, const char *fmt, const char *a, const char *b)
{
    if (err && len)
        snprintf(err, len, fmt, a, b);
}

static inline int path_join(char *out, size_t len, const char *dir, const char *name)
{
    int n = snprintf(out, len, "%s/%s", dir, name);
    return n < 0 || (size_t)n >= len ? CAIRN_EINVAL : CAIRN_OK;
}

/* ---- value format: little-endian fields --------------------------------- */

static inline void put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}
static inline uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* ---- disk_verify.c: the value format and the integrity walk -------------- */

/* Checksum of everything but the checksum field itself. */
uint64_t disk_value_checksum(const uint8_t *v, size_t bytes);
/* The 48-byte header of a value of this store (checksum field zero). */
void disk_build_header(const cairn_disk *d, uint8_t *v);
/* True when the stored value is the page the caller expects. */
bool disk_value_ok(const cairn_disk *d, const uint8_t *v, size_t bytes, const uint8_t *tokens_le);
void disk_tokens_to_le(uint8_t *dst, const int32_t *tokens, int n);
void disk_tokens_from_le(int32_t *dst, const uint8_t *src, int n);
/* How many leading tokens of next[0 .. n_next) a listed child shares, when
 * that is more than better_than and the child (its key, its tokens in
 * stored form) really chains from parent (the list is keyed by four bytes
 * of the parent's hash, which two parents may share); else 0. */
int disk_child_match(cairn_page_hash parent, const uint8_t key[16], const uint8_t *tokens_le,
                     int ps, const void *next, int n_next, int better_than);
/* The parent word of a value (DISK_PARENT_WORD_AT) for this parent. */
void disk_parent_word(const uint8_t parent[16], uint8_t out[4]);
/* The longest run of leading tokens a stored page's tokens (little-endian)
 * share with next[0 .. n) (int32_t, host order, any alignment). */
int disk_shared_prefix(const uint8_t *tokens_le, const void *next, int n);
/* CAIRN_OK when the store at d->dir passed the walk (or there is none yet),
 * CAIRN_ECORRUPT otherwise. */
int disk_check_store_integrity(const cairn_disk *d, char *err, size_t err_len);

/* ---- disk_io.c: the I/O thread ------------------------------------------ */

/* An LMDB return code as a CAIRN_* code. */
int disk_map_mdb(int rc);
/* The I/O thread's loop (pthread start routine; arg is the cairn_disk). */
void *disk_io_main(void *arg);

/* ---- disk_shared.c: tier 3 ----------------------------------------------- */

/* Start the shared tier of d->cfg.shared (nothing without one): its writer
 * thread, and a first connection attempt whose failure is only logged.
 * Before the I/O thread starts. Errors: a bad URL (CAIRN_EINVAL), memory. */
int disk_shared_open(cairn_disk *d, char *err, size_t err_len);
/* After the I/O thread stopped: a "bye" event, the writer drained while
 * Redis answers, everything freed. */
void disk_shared_close(cairn_disk *d);
/* On the I/O thread, after a batch committed: its page reads and record
 * gets that missed ask Redis, and take what verifies. */
void disk_shared_serve(cairn_disk *d, disk_req *list);
/* Queue a committed record put's value for Redis. */
void disk_shared_record_put(cairn_disk *d, const disk_req *r);
/* Queue a DEL of a full Redis key. */
void disk_shared_delete_key(cairn_disk *d, const char *key, size_t len);
/* The writer's counters into out (the reader's are in d->stats). */
void disk_shared_stats(const cairn_disk *d, cairn_disk_stats *out);

/* ---- disk.c: the request queue ------------------------------------------ */

/* Append a request to the FIFO (taking it over); CAIRN_ECLOSED, and the
 * request freed, once the store is closing. */
int disk_enqueue(cairn_disk *d, disk_req *r);

#endif /* CAIRN_DISK_IMPL_H */
