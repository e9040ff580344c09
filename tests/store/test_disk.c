/*
 * tests/store/test_disk.c — the LMDB tier (and the small pieces around it:
 * namespace hash, host pool, lost pages in the tiered cache).
 *
 *   - persistence across close/reopen, content and access order included;
 *   - damaged values (payload, tokens, header) are detected, counted,
 *     deleted and reported as misses, never returned;
 *   - a damaged data file (meta pages, truncation) is refused at open, or
 *     reset when asked;
 *   - a writer killed with SIGKILL in the middle of a write storm leaves a
 *     store in which every confirmed page reads back right and every other
 *     page either reads back right or is a miss;
 *   - a tiny map exercises the disk-full path (LRU eviction, never failure);
 *   - the page that continues a parent best is found by its tokens (read
 *     child), after a restart too, and a deleted page is never returned.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

#define PS 16

/* Page i of the synthetic corpus: tokens and key are functions of i. */
static void page_tokens(uint64_t i, int32_t *tok)
{
    for (int k = 0; k < PS; k++)
        tok[k] = (int32_t)((i * 2654435761u + (uint64_t)k * 40503u) % 50000);
}

static cairn_page_hash page_key(cairn_page_hash ns, uint64_t i)
{
    int32_t tok[PS];
    page_tokens(i, tok);
    return cairn_page_hash_next(ns, tok, PS);
}

static void page_payload(uint64_t i, void *out, size_t bytes)
{
    int32_t tok[PS];
    page_tokens(i, tok);
    test_payload(tok, PS, out, bytes);
}

static cairn_page_hash test_ns(void)
{
    cairn_kv_layout L = test_layout(PS);
    cairn_page_namespace ns = {.model_fingerprint = "disk-test", .fingerprint_bytes = 9,
                               .layout = &L, .layout_version = CAIRN_KV_LAYOUT_VERSION};
    cairn_page_hash h;
    assert_int_equal(cairn_page_namespace_hash(&ns, &h), CAIRN_OK);
    return h;
}

static cairn_disk_config config(const char *dir, size_t page_bytes, size_t map_bytes)
{
    return (cairn_disk_config){
        .dir = dir, .map_bytes = map_bytes, .page_size = PS, .page_bytes = page_bytes,
        .ns = test_ns(),
    };
}

/* Wait for `n` completions; statuses by cookie into status[cookie]. */
static void collect(cairn_disk *d, size_t n, int *status, size_t n_status)
{
    cairn_disk_completion buf[128];
    while (n > 0) {
        int k;
        assert_int_equal(cairn_disk_poll(d, buf, 128, &k), CAIRN_OK);
        if (k == 0) {
            cairn_disk_wait(d, 1000);
            continue;
        }
        for (int i = 0; i < k; i++)
            if (status && buf[i].cookie < n_status)
                status[buf[i].cookie] = buf[i].status;
        n -= (size_t)k;
    }
}

static void write_pages(cairn_disk *d, uint64_t first, uint64_t n, size_t page_bytes)
{
    uint8_t *buf = malloc(page_bytes);
    int32_t tok[PS];
    assert_non_null(buf);
    int *st = calloc(n, sizeof *st);
    for (uint64_t i = first; i < first + n; i++) {
        page_tokens(i, tok);
        page_payload(i, buf, page_bytes);
        assert_int_equal(cairn_disk_write(d, page_key(test_ns(), i), NULL, tok, buf, i - first), CAIRN_OK);
    }
    collect(d, n, st, n);
    for (uint64_t i = 0; i < n; i++)
        assert_int_equal(st[i], CAIRN_OK);
    free(st);
    free(buf);
}

/* Read page i: CAIRN_OK only if the content is exactly the page's. */
static int read_page(cairn_disk *d, uint64_t i, size_t page_bytes)
{
    uint8_t *got = malloc(page_bytes), *want = malloc(page_bytes);
    int32_t tok[PS];
    page_tokens(i, tok);
    memset(got, 0xAA, page_bytes);
    assert_int_equal(cairn_disk_read(d, page_key(test_ns(), i), tok, got, 7), CAIRN_OK);
    int st = -100;
    int one[8];
    collect(d, 1, one, 8);
    st = one[7];
    if (st == CAIRN_OK) {
        page_payload(i, want, page_bytes);
        assert_memory_equal(got, want, page_bytes); /* never wrong content */
    }
    free(got);
    free(want);
    return st;
}

static size_t lcp_of(const int32_t *a, const int32_t *b, size_t n)
{
    size_t i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

/* ---- persistence ---------------------------------------------------------- */

static void test_persistence(void **state)
{
    (void)state;
    char dir[512];
    test_make_dir(dir, sizeof dir, "persist");
    const size_t pb = 1024;
    cairn_disk_config cfg = config(dir, pb, 32u << 20);
    cairn_disk *d;
    char err[256];
    assert_int_equal(cairn_disk_open(&cfg, &d, err, sizeof err), CAIRN_OK);
    write_pages(d, 0, 600, pb);
    assert_int_equal(read_page(d, 5, pb), CAIRN_OK);
    assert_int_equal(read_page(d, 10000, pb), CAIRN_ENOTFOUND);
    cairn_disk_stats st;
    cairn_disk_get_stats(d, &st);
    assert_int_equal(st.pages, 600);
    assert_int_equal(st.writes, 600);
    assert_true(st.commits >= 3); /* batched, at most 256 per transaction */
    assert_true(st.commits <= 600);
    cairn_disk_close(d);

    /* Another process would see the same; a fresh handle is as good. */
    assert_int_equal(cairn_disk_open(&cfg, &d, err, sizeof err), CAIRN_OK);
    cairn_disk_get_stats(d, &st);
    assert_int_equal(st.pages, 600);
    for (uint64_t i = 0; i < 600; i += 7)
        assert_int_equal(read_page(d, i, pb), CAIRN_OK);

    /* A read expecting other tokens under an existing key is a mismatch:
     * counted, deleted, a miss. */
    int32_t wrong[PS];
    page_tokens(3, wrong);
    wrong[0] ^= 1;
    uint8_t *buf = malloc(pb);
    assert_int_equal(cairn_disk_read(d, page_key(test_ns(), 3), wrong, buf, 1), CAIRN_OK);
    int s2[2];
    collect(d, 1, s2, 2);
    assert_int_equal(s2[1], CAIRN_ENOTFOUND);
    assert_int_equal(read_page(d, 3, pb), CAIRN_ENOTFOUND);
    cairn_disk_get_stats(d, &st);
    assert_int_equal(st.corrupt, 1);
    assert_int_equal(st.pages, 599);

    /* Queue order: a read queued right after a write sees it. */
    int32_t tok[PS];
    page_tokens(3, tok);
    page_payload(3, buf, pb);
    assert_int_equal(cairn_disk_write(d, page_key(test_ns(), 3), NULL, tok, buf, 0), CAIRN_OK);
    memset(buf, 0, pb);
    assert_int_equal(cairn_disk_read(d, page_key(test_ns(), 3), tok, buf, 1), CAIRN_OK);
    assert_int_equal(cairn_disk_fence(d, 2), CAIRN_OK);
    int s3[3] = {-1, -1, -1};
    collect(d, 3, s3, 3);
    assert_int_equal(s3[0], CAIRN_OK);
    assert_int_equal(s3[1], CAIRN_OK);
    assert_int_equal(s3[2], CAIRN_OK);
    uint8_t *want = malloc(pb);
    page_payload(3, want, pb);
    assert_memory_equal(buf, want, pb);
    free(want);
    free(buf);

    /* A store opened under another namespace never returns these pages:
     * its keys differ, and even the same key would fail the header check. */
    cairn_disk_close(d);
    cairn_disk_config other = cfg;
    other.ns.lo ^= 1;
    assert_int_equal(cairn_disk_open(&other, &d, err, sizeof err), CAIRN_OK);
    uint8_t *b2 = malloc(pb);
    page_tokens(9, tok);
    assert_int_equal(cairn_disk_read(d, page_key(test_ns(), 9), tok, b2, 0), CAIRN_OK);
    int s4[1];
    collect(d, 1, s4, 1);
    assert_int_equal(s4[0], CAIRN_ENOTFOUND);
    free(b2);
    cairn_disk_close(d);
    test_remove_dir(dir);
}

/* The eventfd wakes a poll loop; a completion callback runs per batch. */
static int notified;
static void on_notify(void *user)
{
    (void)user;
    __atomic_add_fetch(&notified, 1, __ATOMIC_SEQ_CST);
}

static void test_notify(void **state)
{
    (void)state;
    char dir[512];
    test_make_dir(dir, sizeof dir, "notify");
    cairn_disk_config cfg = config(dir, 256, 1u << 20);
    cfg.notify = on_notify;
    cairn_disk *d;
    assert_int_equal(cairn_disk_open(&cfg, &d, NULL, 0), CAIRN_OK);
    int fd = cairn_disk_notify_fd(d);
    assert_true(fd >= 0);
    assert_int_equal(cairn_disk_fence(d, 42), CAIRN_OK);
    /* no time limit: the fence completes, or ctest's TIMEOUT catches a hang */
    assert_int_equal(cairn_disk_wait(d, -1), CAIRN_OK);
    cairn_disk_completion c;
    int n;
    assert_int_equal(cairn_disk_poll(d, &c, 1, &n), CAIRN_OK);
    assert_int_equal(n, 1);
    assert_int_equal(c.cookie, 42);
    assert_int_equal(c.op, CAIRN_DISK_FENCE);
    /* The callback runs right after the completion is queued (on the I/O
     * thread), so it may trail our poll: wait for it. The bound (120 s) is
     * only a hang guard, far beyond any scheduling delay under ASan. */
    for (int i = 0; i < 120000 && __atomic_load_n(&notified, __ATOMIC_SEQ_CST) < 1; i++)
        usleep(1000);
    assert_int_equal(__atomic_load_n(&notified, __ATOMIC_SEQ_CST), 1);
    cairn_disk_close(d);
    test_remove_dir(dir);
}

/* ---- damaged values ------------------------------------------------------- */

/* Offsets of every value header in the file ("CKVP", version 1, header 48). */
static size_t find_values(const uint8_t *buf, size_t len, size_t *offs, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i + 8 <= len && n < max; i++)
        if (memcmp(buf + i, "CKVP", 4) == 0 && buf[i + 4] == CAIRN_DISK_FORMAT_VERSION &&
            buf[i + 5] == 0 && buf[i + 6] == CAIRN_DISK_HEADER_BYTES && buf[i + 7] == 0)
            offs[n++] = i;
    return n;
}

static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void spit(const char *path, const uint8_t *b, size_t len)
{
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, len, f), len);
    fclose(f);
}

static void test_corrupt_values(void **state)
{
    (void)state;
    char dir[512], path[600];
    test_make_dir(dir, sizeof dir, "corrupt");
    /* Pages larger than an LMDB page live in overflow pages, which LMDB
     * writes once and never copies: each value is in the file exactly once. */
    const size_t pb = 8192;
    const uint64_t N = 60;
    cairn_disk_config cfg = config(dir, pb, 16u << 20);
    cairn_disk *d;
    assert_int_equal(cairn_disk_open(&cfg, &d, NULL, 0), CAIRN_OK);
    write_pages(d, 0, N, pb);
    cairn_disk_close(d);

    snprintf(path, sizeof path, "%s/data.mdb", dir);
    size_t len;
    uint8_t *file = slurp(path, &len);
    size_t offs[128];
    size_t n = find_values(file, len, offs, 128);
    assert_int_equal(n, N);
    /* Damage every 4th value, each in a different part of it. */
    size_t damaged = 0;
    for (size_t k = 0; k < n; k += 4, damaged++) {
        size_t o = offs[k];
        switch ((k / 4) % 5) {
        case 0: file[o + CAIRN_DISK_HEADER_BYTES + 4 * PS + 1000] ^= 0x01; break; /* payload bit */
        case 1: file[o + CAIRN_DISK_HEADER_BYTES + 5] ^= 0x80; break;            /* a token     */
        case 2: file[o + 41] ^= 0x10; break;                                     /* checksum    */
        case 3: file[o + 10] ^= 0xFF; break;                                     /* namespace   */
        case 4: memset(file + o + CAIRN_DISK_HEADER_BYTES + 4 * PS, 0, pb); break; /* zeroed    */
        }
    }
    spit(path, file, len);
    free(file);

    assert_int_equal(cairn_disk_open(&cfg, &d, NULL, 0), CAIRN_OK);
    size_t ok = 0, miss = 0;
    for (uint64_t i = 0; i < N; i++) {
        int st = read_page(d, i, pb); /* asserts content whenever it says OK */
        ok += st == CAIRN_OK;
        miss += st == CAIRN_ENOTFOUND;
    }
    assert_int_equal(miss, damaged);
    assert_int_equal(ok, N - damaged);
    cairn_disk_stats st;
    cairn_disk_get_stats(d, &st);
    assert_int_equal(st.corrupt, damaged);
    assert_int_equal(st.pages, N - damaged); /* deleted */
    /* Deleted means deleted: a second pass finds nothing new to count. */
    for (uint64_t i = 0; i < N; i++)
        read_page(d, i, pb);
    cairn_disk_get_stats(d, &st);
    assert_int_equal(st.corrupt, damaged);
    cairn_disk_close(d);
    test_remove_dir(dir);
}

/* ---- damaged data file ---------------------------------------------------- */

static void test_corrupt_file(void **state)
{
    (void)state;
    char dir[512], path[600];
    test_make_dir(dir, sizeof dir, "badfile");
    const size_t pb = 1024;
    cairn_disk_config cfg = config(dir, pb, 8u << 20);
    cairn_disk *d;
    assert_int_equal(cairn_disk_open(&cfg, &d, NULL, 0), CAIRN_OK);
    write_pages(d, 0, 100, pb);
    cairn_disk_close(d);
    snprintf(path, sizeof path, "%s/data.mdb", dir);

    /* 1. Both meta pages destroyed: LMDB refuses the file; we say so. */
    size_t len;
    uint8_t *file = slurp(path, &len);
    uint8_t *orig = malloc(len);
    memcpy(orig, file, len);
    long psz = sysconf(_SC_PAGESIZE);
    for (size_t i = 16; i < 2 * (size_t)psz && i < len; i += 8)
        file[i] ^= 0x5A;
    spit(path, file, len);
    char err[256] = "";
    assert_int_equal(cairn_disk_open(&cfg, &d, err, sizeof err), CAIRN_ECORRUPT);
    assert_true(strlen(err) > 0);
    /* ... or, when asked, starts over empty. */
    cfg.reset_if_corrupt = true;
    assert_int_equal(cairn_disk_open(&cfg, &d, err, sizeof err), CAIRN_OK);
    cairn_disk_stats st;
    cairn_disk_get_stats(d, &st);
    assert_true(st.reset_on_open);
    assert_int_equal(st.pages, 0);
    assert_int_equal(read_page(d, 1, pb), CAIRN_ENOTFOUND);
    write_pages(d, 0, 10, pb); /* and works */
    assert_int_equal(read_page(d, 1, pb), CAIRN_OK);
    cairn_disk_close(d);

    /* 2. A truncated file (a crash of the disk, a bad copy): refused before
     * anything maps the missing part. */
    cfg.reset_if_corrupt = false;
    FILE *f = fopen(path, "wb");
    fwrite(orig, 1, len, f);
    fclose(f);
    assert_int_equal(truncate(path, (off_t)(len / 2)), 0);
    assert_int_equal(cairn_disk_open(&cfg, &d, err, sizeof err), CAIRN_ECORRUPT);

    /* 3. One meta page destroyed: LMDB falls back to the other; every page
     * that reads back is right. */
    f = fopen(path, "wb");
    fwrite(orig, 1, len, f);
    fclose(f);
    file = realloc(file, len);
    memcpy(file, orig, len);
    for (size_t i = 16; i < (size_t)psz; i += 8)
        file[i] ^= 0x5A;
    spit(path, file, len);
    int rc = cairn_disk_open(&cfg, &d, err, sizeof err);
    if (rc == CAIRN_OK) {
        for (uint64_t i = 0; i < 100; i++) {
            int r = read_page(d, i, pb);
            assert_true(r == CAIRN_OK || r == CAIRN_ENOTFOUND);
        }
        cairn_disk_close(d);
    } else {
        assert_int_equal(rc, CAIRN_ECORRUPT);
    }
    free(file);
    free(orig);
    test_remove_dir(dir);
}

/* Damage in LMDB's own pages, which LMDB trusts and which a later write
 * transaction would follow into a crash: the integrity walk at open must
 * call the store corrupt (and reset it when asked), never hand it over. */
static void test_damaged_structure(void **state)
{
    (void)state;
    char dir[512], path[600];
    test_make_dir(dir, sizeof dir, "badtree");
    const size_t pb = 6000; /* values of two pages: overflow runs */
    cairn_disk_config cfg = config(dir, pb, 8u << 20);
    cairn_disk *d;
    assert_int_equal(cairn_disk_open(&cfg, &d, NULL, 0), CAIRN_OK);
    write_pages(d, 0, 60, pb);
    cairn_disk_close(d);
    snprintf(path, sizeof path, "%s/data.mdb", dir);
    size_t len;
    uint8_t *orig = slurp(path, &len);
    const size_t psz = (size_t)sysconf(_SC_PAGESIZE);

    /* Leaf pages with nodes and overflow runs' heads (flags at byte 10 of
     * a page: 0x02 leaf, 0x04 overflow; its number at byte 0). Some are
     * stale copies on the free list, whose damage is harmless, so each
     * kind of damage is done to every page of the kind. */
    bool is_leaf[512] = {false}, is_overflow[512] = {false};
    size_t n_leaf = 0, n_overflow = 0;
    assert_true(len / psz <= 512);
    for (size_t p = 2; p < len / psz; p++) {
        uint64_t no;
        uint16_t flags, lower;
        memcpy(&no, orig + p * psz, 8);
        memcpy(&flags, orig + p * psz + 10, 2);
        memcpy(&lower, orig + p * psz + 12, 2);
        if (no != p)
            continue;
        if ((flags & 0x02) && lower > 16 + 2)
            n_leaf += is_leaf[p] = true;
        if (flags & 0x04)
            n_overflow += is_overflow[p] = true;
    }
    assert_true(n_leaf > 0 && n_overflow > 0);

    for (int how = 0; how < 3; how++) {
        uint8_t *file = malloc(len);
        memcpy(file, orig, len);
        for (size_t p = 2; p < len / psz; p++) {
            uint8_t *page = file + p * psz;
            if (how == 0 && is_leaf[p]) { /* the first node's data size + 2 KiB */
                uint16_t at;
                memcpy(&at, page + 16, 2);
                page[at + 1] ^= 0x08;
            } else if (how == 1 && is_leaf[p]) { /* `upper` beyond the page */
                page[15] ^= 0x40;
            } else if (how == 2 && is_overflow[p]) { /* the run's page count */
                page[14] ^= 0x10;
            }
        }
        spit(path, file, len);
        free(file);
        char err[256] = "";
        cfg.reset_if_corrupt = false;
        assert_int_equal(cairn_disk_open(&cfg, &d, err, sizeof err), CAIRN_ECORRUPT);
        assert_true(strlen(err) > 0);
        cfg.reset_if_corrupt = true;
        assert_int_equal(cairn_disk_open(&cfg, &d, err, sizeof err), CAIRN_OK);
        cairn_disk_stats st;
        cairn_disk_get_stats(d, &st);
        assert_true(st.reset_on_open);
        write_pages(d, 0, 10, pb); /* and works */
        assert_int_equal(read_page(d, 3, pb), CAIRN_OK);
        cairn_disk_close(d);
    }
    /* The undamaged file passes the same walk with everything in it. */
    spit(path, orig, len);
    cfg.reset_if_corrupt = true;
    assert_int_equal(cairn_disk_open(&cfg, &d, NULL, 0), CAIRN_OK);
    cairn_disk_stats st;
    cairn_disk_get_stats(d, &st);
    assert_false(st.reset_on_open);
    assert_int_equal(st.pages, 60);
    cairn_disk_close(d);
    free(orig);
    test_remove_dir(dir);
}

/* ---- SIGKILL during a write storm ----------------------------------------- */

#define STORM_CONFIRM 3000 /* the parent kills once this many are committed */
#define STORM_INFLIGHT 512 /* the child never has more requests queued       */

static void storm_child(const char *dir, int fd, size_t pb, uint64_t base)
{
    cairn_disk_config cfg = config(dir, pb, 64u << 20);
    cfg.max_batch = 64;
    cairn_disk *d;
    if (cairn_disk_open(&cfg, &d, NULL, 0) != CAIRN_OK)
        _exit(2);
    uint8_t *buf = malloc(pb);
    int32_t tok[PS];
    uint64_t next = base, done = base;
    for (;;) {
        while (next - done < STORM_INFLIGHT) {
            page_tokens(next, tok);
            page_payload(next, buf, pb);
            if (cairn_disk_write(d, page_key(test_ns(), next), NULL, tok, buf, next) != CAIRN_OK)
                _exit(3);
            next++;
        }
        cairn_disk_completion c[256];
        int n;
        cairn_disk_wait(d, 1000);
        cairn_disk_poll(d, c, 256, &n);
        for (int i = 0; i < n; i++) {
            if (c[i].status != CAIRN_OK || c[i].cookie != done)
                _exit(4); /* completions come in order */
            done++;
        }
        /* Completed means committed: tell the parent how far that is. */
        if (n && write(fd, &done, sizeof done) != sizeof done)
            _exit(5);
    }
}

/* Three rounds on the same store, killed at different points; each round
 * writes new pages after the previous round's, and checks all of them. */
static void test_sigkill_storm(void **state)
{
    (void)state;
    char dir[512];
    test_make_dir(dir, sizeof dir, "storm");
    const size_t pb = 2048;
    const uint64_t kill_after[3] = {1000, 3000, 2000};
    uint64_t base = 0, ok_lo[3], ok_hi[3]; /* confirmed ranges per round */
    for (int round = 0; round < 3; round++) {
        int fds[2];
        assert_int_equal(pipe(fds), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            close(fds[0]);
            storm_child(dir, fds[1], pb, base);
            _exit(0);
        }
        close(fds[1]);
        uint64_t confirmed = base, v;
        while (confirmed < base + kill_after[round] && read(fds[0], &v, sizeof v) == sizeof v)
            confirmed = v;
        kill(pid, SIGKILL);
        int wst;
        waitpid(pid, &wst, 0);
        /* What the child managed to say before dying counts too. */
        while (read(fds[0], &v, sizeof v) == sizeof v)
            confirmed = v;
        close(fds[0]);
        assert_true(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL);
        assert_true(confirmed >= base + kill_after[round]);
        ok_lo[round] = base;
        ok_hi[round] = confirmed;

        cairn_disk_config cfg = config(dir, pb, 64u << 20);
        cairn_disk *d;
        char err[256] = "";
        assert_int_equal(cairn_disk_open(&cfg, &d, err, sizeof err), CAIRN_OK);
        /* Every confirmed page (this round's and earlier rounds') is there
         * and right; pages queued after that are right or absent. */
        uint64_t limit = confirmed + STORM_INFLIGHT + 64, present = 0;
        for (uint64_t i = 0; i < limit; i++) {
            int st = read_page(d, i, pb); /* checks content when OK */
            bool must = false;
            for (int r = 0; r <= round; r++)
                must |= i >= ok_lo[r] && i < ok_hi[r];
            if (must)
                assert_int_equal(st, CAIRN_OK);
            else
                assert_true(st == CAIRN_OK || st == CAIRN_ENOTFOUND);
            present += st == CAIRN_OK;
        }
        cairn_disk_stats st;
        cairn_disk_get_stats(d, &st);
        assert_int_equal(st.corrupt, 0);
        assert_int_equal(st.pages, present); /* nothing beyond what we looked at */
        cairn_disk_close(d);
        /* The next round starts after every page this one could have
         * written. */
        base = limit;
    }
    /* And the store keeps working after the crashes. */
    cairn_disk_config cfg = config(dir, pb, 64u << 20);
    cairn_disk *d;
    assert_int_equal(cairn_disk_open(&cfg, &d, NULL, 0), CAIRN_OK);
    write_pages(d, base, 10, pb);
    assert_int_equal(read_page(d, base + 3, pb), CAIRN_OK);
    cairn_disk_close(d);
    test_remove_dir(dir);
}

/* ---- disk full ------------------------------------------------------------ */

static void test_tiny_map(void **state)
{
    (void)state;
    char dir[512];
    test_make_dir(dir, sizeof dir, "tiny");
    const size_t pb = 8192;
    cairn_disk_config cfg = config(dir, pb, 256u << 10); /* room for ~25 pages */
    cairn_disk *d;
    assert_int_equal(cairn_disk_open(&cfg, &d, NULL, 0), CAIRN_OK);
    write_pages(d, 0, 10, pb);
    /* Page 0 becomes the most recently used. */
    assert_int_equal(read_page(d, 0, pb), CAIRN_OK);
    /* One write at a time until the map fills and eviction starts. */
    uint64_t next = 10;
    cairn_disk_stats st;
    do {
        write_pages(d, next++, 1, pb); /* asserts every write succeeded */
        cairn_disk_get_stats(d, &st);
    } while (st.evicted == 0 && next < 1000);
    assert_true(st.evicted > 0);
    /* The least recently used went first. Access order, oldest first, was
     * 1..9, 0, 10, 11, ...: what is left must be a suffix of it. */
    uint64_t order[1000];
    size_t n_order = 0;
    for (uint64_t i = 1; i <= 9; i++)
        order[n_order++] = i;
    order[n_order++] = 0;
    for (uint64_t i = 10; i < next; i++)
        order[n_order++] = i;
    bool present[1000];
    for (size_t k = 0; k < n_order; k++)
        present[k] = read_page(d, order[k], pb) == CAIRN_OK;
    /* (the reads above touch pages in order, which keeps that order) */
    size_t first = 0;
    while (first < n_order && !present[first])
        first++;
    assert_true(first > 0);          /* something was evicted ...        */
    assert_true(first < n_order);    /* ... but not everything           */
    for (size_t k = first; k < n_order; k++)
        assert_true(present[k]);
    assert_false(present[0]);        /* page 1, the least recently used */

    /* A storm far beyond the map: no write fails, the store stays small,
     * and the newest pages are there. */
    write_pages(d, next, 500, pb);
    next += 500;
    cairn_disk_get_stats(d, &st);
    assert_int_equal(st.write_failures, 0);
    assert_true(st.pages < 40);
    assert_true(st.evicted >= 470);
    for (uint64_t i = next - 5; i < next; i++)
        assert_int_equal(read_page(d, i, pb), CAIRN_OK);
    cairn_disk_close(d);
    /* Still a valid store after all that. */
    assert_int_equal(cairn_disk_open(&cfg, &d, NULL, 0), CAIRN_OK);
    assert_int_equal(read_page(d, next - 1, pb), CAIRN_OK);
    cairn_disk_close(d);
    test_remove_dir(dir);

    /* A page bigger than the whole map: that write fails alone, cleanly. */
    test_make_dir(dir, sizeof dir, "toobig");
    cairn_disk_config big = config(dir, 256u << 10, 128u << 10);
    assert_int_equal(cairn_disk_open(&big, &d, NULL, 0), CAIRN_OK);
    uint8_t *buf = calloc(1, 256u << 10);
    int32_t tok[PS];
    page_tokens(0, tok);
    assert_int_equal(cairn_disk_write(d, page_key(test_ns(), 0), NULL, tok, buf, 0), CAIRN_OK);
    assert_int_equal(cairn_disk_fence(d, 1), CAIRN_OK);
    int s[2] = {99, 99};
    collect(d, 2, s, 2);
    assert_int_equal(s[0], CAIRN_EFULL);
    assert_int_equal(s[1], CAIRN_OK);
    free(buf);
    cairn_disk_close(d);
    test_remove_dir(dir);
}

/* ---- the page that continues a parent ------------------------------------ */

/* Write child `tok` of `parent` (listed under it) with the payload of its
 * tokens; returns its key. */
static cairn_page_hash write_child(cairn_disk *d, cairn_page_hash parent, const int32_t *tok,
                                   size_t pb)
{
    uint8_t *buf = malloc(pb);
    assert_non_null(buf);
    test_payload(tok, PS, buf, pb);
    cairn_page_hash key = cairn_page_hash_next(parent, tok, PS);
    cairn_disk_page_origin o = {.parent = parent, .has_parent = true};
    assert_int_equal(cairn_disk_write(d, key, &o, tok, buf, 0), CAIRN_OK);
    int st[1] = {-1};
    collect(d, 1, st, 1);
    assert_int_equal(st[0], CAIRN_OK);
    free(buf);
    return key;
}

/* read_child: *matched and the page's tokens into tok_out; returns the
 * status, and checks the payload is the tokens' own. */
static int read_child(cairn_disk *d, cairn_page_hash parent, const int32_t *next, size_t n,
                      size_t pb, int *matched, int32_t *tok_out)
{
    uint8_t *got = malloc(pb), *want = malloc(pb);
    assert_non_null(got);
    assert_int_equal(cairn_disk_read_child(d, parent, next, n, got, 5), CAIRN_OK);
    cairn_disk_completion c;
    int k = 0;
    while (k == 0) {
        cairn_disk_wait(d, 1000);
        assert_int_equal(cairn_disk_poll(d, &c, 1, &k), CAIRN_OK);
    }
    assert_int_equal(c.cookie, 5);
    assert_int_equal(c.op, CAIRN_DISK_READ_CHILD);
    *matched = c.matched;
    if (c.status == CAIRN_OK) {
        assert_int_equal(c.bytes, PS * sizeof(int32_t));
        memcpy(tok_out, c.data, PS * sizeof(int32_t));
        test_payload(tok_out, PS, want, pb);
        assert_memory_equal(got, want, pb);
        /* and it is parent's child: its key chains from parent */
        assert_int_equal(lcp_of(tok_out, next, n), (size_t)c.matched);
    } else {
        assert_null(c.data);
    }
    free(c.data);
    free(got);
    free(want);
    return c.status;
}

static void test_read_child(void **state)
{
    (void)state;
    char dir[512];
    test_make_dir(dir, sizeof dir, "child");
    const size_t pb = 2048;
    cairn_disk_config cfg = config(dir, pb, 32u << 20);
    cairn_disk *d;
    assert_int_equal(cairn_disk_open(&cfg, &d, NULL, 0), CAIRN_OK);
    /* parent: a page of some sequence; three pages continue it, sharing 16,
     * 5 and 2 leading tokens with A (a document's last tokens, then
     * different questions) */
    cairn_page_hash parent = page_key(test_ns(), 0), other = page_key(test_ns(), 1);
    int32_t a[PS], b[PS], c[PS], next[PS], got[PS];
    page_tokens(100, a);
    memcpy(b, a, sizeof a);
    memcpy(c, a, sizeof a);
    for (int i = 5; i < PS; i++)
        b[i] = a[i] + 1;
    for (int i = 2; i < PS; i++)
        c[i] = a[i] + 2;
    write_child(d, parent, b, pb);
    write_child(d, parent, a, pb);
    write_child(d, parent, c, pb);
    /* a page that is not listed (no origin): never an answer */
    write_pages(d, 50, 1, pb);

    int m = -1;
    memcpy(next, a, sizeof a);
    next[7] = a[7] + 3; /* shares 7 with A, 5 with B, 2 with C */
    assert_int_equal(read_child(d, parent, next, PS - 1, pb, &m, got), CAIRN_OK);
    assert_int_equal(m, 7);
    assert_memory_equal(got, a, sizeof a);
    /* a shorter request: as much as it has */
    assert_int_equal(read_child(d, parent, next, 3, pb, &m, got), CAIRN_OK);
    assert_int_equal(m, 3);
    memcpy(next, b, sizeof b);
    assert_int_equal(read_child(d, parent, next, PS - 1, pb, &m, got), CAIRN_OK);
    assert_int_equal(m, PS - 1);
    assert_memory_equal(got, b, sizeof b);
    /* nothing shared, another parent, bad arguments */
    next[0] = a[0] + 1;
    assert_int_equal(read_child(d, parent, next, PS - 1, pb, &m, got), CAIRN_ENOTFOUND);
    assert_int_equal(m, 0);
    memcpy(next, a, sizeof a);
    assert_int_equal(read_child(d, other, next, PS - 1, pb, &m, got), CAIRN_ENOTFOUND);
    uint8_t *dst = malloc(pb);
    assert_int_equal(cairn_disk_read_child(d, parent, next, PS, dst, 0), CAIRN_EINVAL);
    assert_int_equal(cairn_disk_read_child(d, parent, next, 0, dst, 0), CAIRN_EINVAL);
    cairn_disk_close(d);

    /* after a restart, the list is there */
    assert_int_equal(cairn_disk_open(&cfg, &d, NULL, 0), CAIRN_OK);
    next[7] = a[7] + 3;
    assert_int_equal(read_child(d, parent, next, PS - 1, pb, &m, got), CAIRN_OK);
    assert_int_equal(m, 7);
    assert_memory_equal(got, a, sizeof a);
    /* A's value goes (a read expecting other tokens deletes it): the next
     * best, B, answers; A is never returned again */
    int32_t wrong[PS];
    memcpy(wrong, a, sizeof a);
    wrong[PS - 1] ^= 1;
    assert_int_equal(cairn_disk_read(d, cairn_page_hash_next(parent, a, PS), wrong, dst, 1),
                     CAIRN_OK);
    int s1[2];
    collect(d, 1, s1, 2);
    assert_int_equal(s1[1], CAIRN_ENOTFOUND);
    assert_int_equal(read_child(d, parent, next, PS - 1, pb, &m, got), CAIRN_OK);
    assert_int_equal(m, 5);
    assert_memory_equal(got, b, sizeof b);
    free(dst);
    cairn_disk_close(d);
    test_remove_dir(dir);
}

/* ---- small pieces --------------------------------------------------------- */

static void test_namespace(void **state)
{
    (void)state;
    cairn_kv_layout L = test_layout(PS), L2 = L;
    L2.dtype = CAIRN_TYPE_F16;
    cairn_page_namespace a = {.model_fingerprint = "m", .fingerprint_bytes = 1, .layout = &L,
                              .layout_version = 1};
    cairn_page_hash h1, h2;
    assert_int_equal(cairn_page_namespace_hash(&a, &h1), CAIRN_OK);
    assert_int_equal(cairn_page_namespace_hash(&a, &h2), CAIRN_OK);
    assert_true(cairn_page_hash_equal(h1, h2));
    /* The value itself is part of the disk format: every key on disk
     * chains from it (pagekey.h). */
    assert_true(h1.hi == 0xee6b217a538c3506ull && h1.lo == 0x2a41e1479bfa82eeull);
    cairn_page_namespace b = a;
    b.layout = &L2;
    assert_int_equal(cairn_page_namespace_hash(&b, &h2), CAIRN_OK);
    assert_false(cairn_page_hash_equal(h1, h2));
    b = a;
    b.layout_version = 2;
    cairn_page_namespace_hash(&b, &h2);
    assert_false(cairn_page_hash_equal(h1, h2));
    b = a;
    b.model_fingerprint = "n";
    cairn_page_namespace_hash(&b, &h2);
    assert_false(cairn_page_hash_equal(h1, h2));
    b.layout = NULL;
    assert_int_equal(cairn_page_namespace_hash(&b, &h2), CAIRN_EINVAL);
}

static void test_host_pool(void **state)
{
    (void)state;
    cairn_host_pool *p;
    assert_int_equal(cairn_host_pool_create(NULL, 100, 99, &p), CAIRN_EINVAL);
    assert_int_equal(cairn_host_pool_create(NULL, 100, 1050, &p), CAIRN_OK);
    assert_int_equal(cairn_host_pool_capacity(p), 10);
    int32_t s[11];
    assert_int_equal(cairn_host_pool_alloc(p, 11, s), CAIRN_EFULL);
    assert_int_equal(cairn_host_pool_available(p), 10);
    assert_int_equal(cairn_host_pool_alloc(p, 4, s), CAIRN_OK);
    assert_int_equal(cairn_host_pool_available(p), 6);
    for (int i = 0; i < 4; i++) {
        assert_non_null(cairn_host_pool_slot(p, s[i]));
        memset(cairn_host_pool_slot(p, s[i]), i, 100);
    }
    assert_null(cairn_host_pool_slot(p, 10));
    cairn_host_pool_release(p, 4, s);
    cairn_host_pool_release(p, 1, s); /* twice: ignored */
    assert_int_equal(cairn_host_pool_available(p), 10);
    cairn_host_pool_free(p);
}

/* A promotion that meets a page the disk lost reports it; forget drops the
 * lost tail; the prefix before it is kept and usable. */
static void test_lost_page(void **state)
{
    (void)state;
    char dir[512];
    test_make_dir(dir, sizeof dir, "lost");
    cairn_kv_layout L = test_layout(PS);
    cairn_backend *be = test_backend_create();
    cairn_kvcache_config cfg = {.backend = be, .layout = L, .device_bytes = 8 * L.page_bytes,
                                .host_bytes = 8 * L.page_bytes, .disk_dir = dir,
                                .disk_map_bytes = 8u << 20, .ns = test_ns()};
    cairn_kvcache *c;
    assert_int_equal(cairn_kvcache_create(&cfg, &c, NULL, 0), CAIRN_OK);
    cairn_radix *t = cairn_kvcache_tree(c);
    int32_t tok[4 * PS], ids[4];
    for (int i = 0; i < 4 * PS; i++)
        tok[i] = i;
    assert_int_equal(cairn_kvcache_alloc(c, 4, ids), CAIRN_OK);
    uint8_t *buf = malloc(L.page_bytes), *got = malloc(L.page_bytes);
    for (int i = 0; i < 4; i++) {
        test_payload(tok, (size_t)(i + 1) * PS, buf, L.page_bytes);
        memcpy((uint8_t *)cairn_page_pool_base(cairn_kvcache_device_pool(c)) + ids[i] * L.page_bytes,
               buf, L.page_bytes);
    }
    size_t cached;
    cairn_radix_node *leaf;
    assert_int_equal(cairn_radix_insert(t, 0, tok, 4, ids, &cached, &leaf), CAIRN_OK);
    /* Down to disk: device -> host -> disk. */
    size_t moved;
    assert_int_equal(cairn_kvcache_evict(c, CAIRN_TIER_DEVICE, 4, &moved), CAIRN_OK);
    assert_int_equal(moved, 4);
    assert_int_equal(cairn_kvcache_evict(c, CAIRN_TIER_HOST, 4, &moved), CAIRN_OK);
    assert_int_equal(moved, 4);
    assert_int_equal(cairn_radix_node_tier(leaf), CAIRN_TIER_DISK);
    /* Lose page 2 behind the cache's back: a read with the wrong tokens
     * makes the disk delete it. */
    cairn_disk *d = cairn_kvcache_disk(c);
    cairn_radix_page *path[4];
    size_t np;
    cairn_radix_path(leaf, path, 4, &np);
    int32_t wrong[PS] = {0};
    assert_int_equal(cairn_disk_read(d, path[2]->hash, wrong, buf, 0), CAIRN_OK);
    cairn_kvcache_event ev;
    int n = 0;
    /* cookie 0 is not one of the cache's; poll ignores its completion */
    assert_int_equal(cairn_radix_lock(t, leaf), CAIRN_OK);
    assert_int_equal(cairn_kvcache_promote(c, leaf, 77), CAIRN_OK);
    while (!n) {
        cairn_kvcache_wait(c, 100);
        assert_int_equal(cairn_kvcache_poll(c, &ev, 1, &n), CAIRN_OK);
    }
    assert_int_equal(ev.cookie, 77);
    assert_int_equal(ev.status, CAIRN_ENOTFOUND);
    assert_int_equal(ev.resident_pages, 2);
    assert_int_equal(cairn_radix_unlock(t, leaf), CAIRN_OK);
    assert_int_equal(cairn_kvcache_forget(c, 0, tok, 4 * PS, ev.resident_pages), CAIRN_OK);
    cairn_radix_match_result m;
    assert_int_equal(cairn_radix_match(t, 0, tok, 4 * PS, &m), CAIRN_OK);
    assert_int_equal(m.n_pages, 2);
    cairn_radix_path(m.node, path, 4, &np);
    for (int i = 0; i < 2; i++) {
        test_payload(tok, (size_t)(i + 1) * PS, buf, L.page_bytes);
        assert_int_equal(cairn_kvcache_read_page(c, path[i], got), CAIRN_OK);
        assert_memory_equal(buf, got, L.page_bytes);
    }
    assert_int_equal(cairn_radix_check(t), CAIRN_OK);
    /* Accounting: the two kept pages on the device, no host slot in use. */
    assert_int_equal(cairn_page_pool_available(cairn_kvcache_device_pool(c)), 6);
    assert_int_equal(cairn_host_pool_available(cairn_kvcache_host_pool(c)), 8);
    free(buf);
    free(got);
    cairn_kvcache_free(c);
    cairn_backend_destroy(be);
    test_remove_dir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_namespace),
        cmocka_unit_test(test_host_pool),
        cmocka_unit_test(test_persistence),
        cmocka_unit_test(test_notify),
        cmocka_unit_test(test_corrupt_values),
        cmocka_unit_test(test_corrupt_file),
        cmocka_unit_test(test_damaged_structure),
        cmocka_unit_test(test_sigkill_storm),
        cmocka_unit_test(test_tiny_map),
        cmocka_unit_test(test_lost_page),
        cmocka_unit_test(test_read_child),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
