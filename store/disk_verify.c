/*
 * store/disk_verify.c — what makes the disk tier's bytes trustworthy: the
 * value format (header, checksum, the check every read applies) and the
 * integrity walk of the LMDB file that open runs in a forked child. Apart
 * from disk.c because neither needs the queue or the I/O thread, and the
 * walk's fork and signal handling is best read on its own.
 */
#include "store/tiers.h"
#include "store/disk_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

/* ---- value format ------------------------------------------------------- */

/* Checksum of everything but the checksum field itself. */
uint64_t disk_value_checksum(const uint8_t *v, size_t bytes)
{
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, v, 40);
    XXH3_64bits_update(&st, v + CAIRN_DISK_HEADER_BYTES, bytes - CAIRN_DISK_HEADER_BYTES);
    return XXH3_64bits_digest(&st);
}

void disk_build_header(const cairn_disk *d, uint8_t *v)
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
           get_u64(v + 40) == disk_value_checksum(v, bytes);
}

/* True when the stored value is the page the caller expects. */
bool disk_value_ok(const cairn_disk *d, const uint8_t *v, size_t bytes, const uint8_t *tokens_le)
{
    return bytes == d->value_bytes &&
           cairn_disk_value_verify(v, bytes, d->cfg.ns, d->cfg.page_size, d->cfg.page_bytes,
                                   tokens_le);
}

void disk_tokens_to_le(uint8_t *dst, const int32_t *tokens, int n)
{
    for (int i = 0; i < n; i++)
        put_u32(dst + 4 * i, (uint32_t)tokens[i]);
}

void disk_tokens_from_le(int32_t *dst, const uint8_t *src, int n)
{
    for (int i = 0; i < n; i++)
        dst[i] = (int32_t)get_u32(src + 4 * i);
}

int disk_child_match(cairn_page_hash parent, const uint8_t key[16], const uint8_t *tokens_le,
                     int ps, const void *next, int n_next, int better_than)
{
    int l = disk_shared_prefix(tokens_le, next, n_next);
    if (l <= better_than)
        return 0;
    int32_t *tok = malloc((size_t)ps * sizeof *tok);
    if (!tok)
        return 0;
    disk_tokens_from_le(tok, tokens_le, ps);
    uint8_t hb[16];
    cairn_page_hash_to_bytes(cairn_page_hash_next(parent, tok, (size_t)ps), hb);
    free(tok);
    return memcmp(hb, key, 16) == 0 ? l : 0;
}

void disk_parent_word(const uint8_t parent[16], uint8_t out[4])
{
    put_u32(out, (uint32_t)parent[0] << 24 | (uint32_t)parent[1] << 16 |
                     (uint32_t)parent[2] << 8 | parent[3]);
}

int disk_shared_prefix(const uint8_t *tokens_le, const void *next, int n)
{
    int i = 0;
    for (; i < n; i++) {
        int32_t t;
        memcpy(&t, (const uint8_t *)next + 4 * i, 4); /* a request's data[]: unaligned */
        if ((int32_t)get_u32(tokens_le + 4 * i) != t)
            break;
    }
    return i;
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

static const char *const STORE_DBS[] = {"pages", "atime", "lru", "meta", "records", "children"};
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
int disk_check_store_integrity(const cairn_disk *d, char *err, size_t err_len)
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

