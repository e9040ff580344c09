/*
 * bench/radix_store/bench_radix_store.c — throughput of the prefix tree and
 * of the LMDB tier. Prints a table; checks nothing (the tests do that).
 *
 *   bench_radix_store [--tokens N] [--page-bytes B] [--disk-pages P] [--dir D]
 *
 * Radix: N cached tokens (default 1M) in pages of 16, as 64 shared "system
 * prompts" of 512 tokens each followed by private continuations of 512 to
 * 2048 tokens — the shape of chat and RAG traffic. Then every cached
 * sequence is matched again with a fresh tail (full hits), and as many random
 * sequences are matched (misses after the shared prefix).
 * Disk: P pages of B bytes (default 2000 x 64 KiB) written through the I/O
 * thread, then read back in random order, with a fresh environment in D
 * (default $TMPDIR or /tmp).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/tiers.h"
#include "test_util.h"

#define PAGE 16

static uint64_t rng = 88172645463325252ull;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

typedef struct {
    int32_t *tok;
    size_t n_pages;
} seqv;

static void row(const char *what, double n, const char *unit, double seconds)
{
    printf("| %-38s | %12.0f %-8s | %9.4f s | %14.0f %s/s |\n", what, n, unit, seconds,
           seconds > 0 ? n / seconds : 0.0, unit);
}

static int bench_radix(size_t target_tokens)
{
    cairn_radix *t;
    cairn_page_hash seed = {1, 2};
    if (cairn_radix_create(PAGE, seed, &t))
        return 1;
    const size_t n_sys = 64, sys_pages = 512 / PAGE;
    int32_t *sys = malloc(n_sys * sys_pages * PAGE * sizeof *sys);
    for (size_t i = 0; i < n_sys * sys_pages * PAGE; i++)
        sys[i] = (int32_t)(rnd() % 32000);
    size_t cap = target_tokens / (512 + 1280) * 2 + 16, n = 0, total_pages = 0, cached_tokens = 0;
    seqv *seqs = calloc(cap, sizeof *seqs);
    while (cached_tokens < target_tokens && n < cap) {
        size_t own = (512 + rnd() % 1537) / PAGE;
        size_t np = sys_pages + own;
        seqs[n].tok = malloc(np * PAGE * sizeof(int32_t));
        memcpy(seqs[n].tok, sys + (rnd() % n_sys) * sys_pages * PAGE, sys_pages * PAGE * sizeof(int32_t));
        for (size_t i = sys_pages * PAGE; i < np * PAGE; i++)
            seqs[n].tok[i] = (int32_t)(rnd() % 32000);
        seqs[n].n_pages = np;
        cached_tokens += own * PAGE; /* the shared prefix is cached once */
        total_pages += np;
        n++;
    }
    int32_t *ids = malloc(total_pages * sizeof *ids);
    for (size_t i = 0; i < total_pages; i++)
        ids[i] = (int32_t)i;

    double t0 = cairn_now();
    size_t off = 0, inserted_tokens = 0;
    for (size_t i = 0; i < n; i++) {
        size_t cached;
        if (cairn_radix_insert(t, 0, seqs[i].tok, seqs[i].n_pages, ids + off, &cached, NULL))
            return 1;
        off += seqs[i].n_pages;
        inserted_tokens += seqs[i].n_pages * PAGE;
    }
    double t_insert = cairn_now() - t0;

    cairn_radix_stats st;
    cairn_radix_get_stats(t, &st);
    printf("radix tree: %zu sequences, %zu cached pages (%zu tokens), %zu nodes\n\n", n,
           st.pages[CAIRN_TIER_DEVICE], st.pages[CAIRN_TIER_DEVICE] * PAGE, st.n_nodes);
    printf("| %-38s | %21s | %11s | %20s |\n", "operation", "work", "time", "throughput");
    printf("|%s|%s|%s|%s|\n", "----------------------------------------", "-----------------------",
           "-------------", "----------------------");
    row("build: insert into empty tree (tokens)", (double)inserted_tokens, "tokens", t_insert);
    row("build: insert into empty tree (calls)", (double)n, "calls", t_insert);

    /* Full hits: each sequence plus a partial page of new tokens. Several
     * passes, so the timing is not dominated by the clock. */
    const int passes = 20;
    int32_t *q = malloc((2048 + 512 + PAGE) * sizeof *q);
    size_t matched_tokens = 0;
    t0 = cairn_now();
    for (int p = 0; p < passes; p++) {
        for (size_t i = 0; i < n; i++) {
            size_t len = seqs[i].n_pages * PAGE;
            memcpy(q, seqs[i].tok, len * sizeof *q);
            for (size_t k = 0; k < PAGE / 2; k++)
                q[len + k] = 7;
            cairn_radix_match_result m;
            if (cairn_radix_match(t, 0, q, len + PAGE / 2, &m))
                return 1;
            matched_tokens += m.n_pages * PAGE;
        }
    }
    double t_hit = cairn_now() - t0;
    row("match, full hit (tokens matched)", (double)matched_tokens, "tokens", t_hit);
    row("match, full hit (calls)", (double)n * passes, "calls", t_hit);

    /* Shared prefix then a miss: the common case for a new request. */
    t0 = cairn_now();
    for (int p = 0; p < passes; p++) {
        for (size_t i = 0; i < n; i++) {
            memcpy(q, sys + (i % n_sys) * sys_pages * PAGE, sys_pages * PAGE * sizeof *q);
            for (size_t k = sys_pages * PAGE; k < sys_pages * PAGE + 1024; k++)
                q[k] = (int32_t)(rnd() % 32000);
            cairn_radix_match_result m;
            if (cairn_radix_match(t, 0, q, sys_pages * PAGE + 1024, &m))
                return 1;
        }
    }
    double t_miss = cairn_now() - t0;
    row("match, prefix then miss (calls)", (double)n * passes, "calls", t_miss);

    /* New turns on a tree that holds ~1M tokens: each cached sequence gets
     * 256 more tokens (the insert finds the sequence, adds one node). */
    int32_t *turn = malloc((2048 + 512 + 256) * sizeof *turn);
    int32_t new_ids[2048 / PAGE + 512 / PAGE + 256 / PAGE];
    size_t new_tokens = 0;
    t0 = cairn_now();
    for (size_t i = 0; i < n; i++) {
        size_t len = seqs[i].n_pages * PAGE, np = seqs[i].n_pages + 256 / PAGE, cached;
        memcpy(turn, seqs[i].tok, len * sizeof *turn);
        for (size_t k = len; k < np * PAGE; k++)
            turn[k] = (int32_t)(rnd() % 32000);
        for (size_t k = 0; k < np; k++)
            new_ids[k] = (int32_t)(total_pages + k);
        if (cairn_radix_insert(t, 0, turn, np, new_ids, &cached, NULL))
            return 1;
        new_tokens += np * PAGE;
    }
    double t_turn = cairn_now() - t0;
    row("insert a new turn, 1M cached (tokens)", (double)new_tokens, "tokens", t_turn);
    row("insert a new turn, 1M cached (calls)", (double)n, "calls", t_turn);
    free(turn);

    /* Lock/unlock the path of every sequence. */
    t0 = cairn_now();
    for (size_t i = 0; i < n; i++) {
        cairn_radix_match_result m;
        cairn_radix_match(t, 0, seqs[i].tok, seqs[i].n_pages * PAGE, &m);
        cairn_radix_lock(t, m.node);
        cairn_radix_unlock(t, m.node);
    }
    row("match + lock + unlock (calls)", (double)n, "calls", cairn_now() - t0);

    /* Evict everything, LRU leaf by LRU leaf (drop, as a one-tier cache). */
    t0 = cairn_now();
    size_t dropped = 0;
    cairn_radix_node *v;
    while ((v = cairn_radix_lru(t, CAIRN_TIER_DEVICE))) {
        dropped += cairn_radix_node_pages(v, NULL);
        cairn_radix_drop(t, v, 0, NULL, NULL);
    }
    row("evict LRU leaves (pages)", (double)dropped, "pages", cairn_now() - t0);

    for (size_t i = 0; i < n; i++)
        free(seqs[i].tok);
    free(seqs);
    free(sys);
    free(ids);
    free(q);
    cairn_radix_free(t);
    return 0;
}

static int bench_disk(const char *base, size_t page_bytes, size_t n_pages)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/cairn-bench-XXXXXX", base);
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    cairn_disk_config cfg = {
        .dir = dir, .map_bytes = (n_pages * (page_bytes + 4096)) * 2 + (64u << 20),
        .page_size = PAGE, .page_bytes = page_bytes, .ns = {3, 4},
    };
    cairn_disk *d;
    char err[256] = "";
    if (cairn_disk_open(&cfg, &d, err, sizeof err)) {
        fprintf(stderr, "disk open: %s\n", err);
        return 1;
    }
    uint8_t *buf = malloc(page_bytes);
    uint8_t *dst = malloc(page_bytes * 64);
    int32_t tok[PAGE];
    cairn_page_hash *keys = malloc(n_pages * sizeof *keys);
    int32_t (*toks)[PAGE] = malloc(n_pages * sizeof *toks);
    for (size_t i = 0; i < n_pages; i++) {
        for (int k = 0; k < PAGE; k++)
            toks[i][k] = (int32_t)(rnd() % 32000);
        keys[i] = cairn_page_hash_next(cfg.ns, toks[i], PAGE);
    }
    memset(buf, 0x5c, page_bytes);

    /* Writes: keep up to 256 in flight, as a busy engine would. */
    double t0 = cairn_now();
    size_t done = 0, next = 0;
    cairn_disk_completion c[256];
    while (done < n_pages) {
        while (next < n_pages && next - done < 256) {
            memcpy(tok, toks[next], sizeof tok);
            buf[0] = (uint8_t)next;
            cairn_disk_write(d, keys[next], NULL, tok, buf, next);
            next++;
        }
        int k;
        cairn_disk_wait(d, 1000);
        cairn_disk_poll(d, c, 256, &k);
        done += (size_t)k;
    }
    double t_write = cairn_now() - t0;

    /* Reads in random order, 64 in flight (into 64 destination buffers). */
    size_t *order = malloc(n_pages * sizeof *order);
    for (size_t i = 0; i < n_pages; i++)
        order[i] = i;
    for (size_t i = n_pages - 1; i > 0; i--) {
        size_t j = rnd() % (i + 1), x = order[i];
        order[i] = order[j];
        order[j] = x;
    }
    t0 = cairn_now();
    done = next = 0;
    size_t hits = 0;
    while (done < n_pages) {
        while (next < n_pages && next - done < 64) {
            size_t i = order[next];
            cairn_disk_read(d, keys[i], toks[i], dst + (next % 64) * page_bytes, next);
            next++;
        }
        int k;
        cairn_disk_wait(d, 1000);
        cairn_disk_poll(d, c, 256, &k);
        for (int j = 0; j < k; j++)
            hits += c[j].status == CAIRN_OK;
        done += (size_t)k;
    }
    double t_read = cairn_now() - t0;
    cairn_disk_stats st;
    cairn_disk_get_stats(d, &st);
    double mb = (double)n_pages * (double)page_bytes / 1e6;
    printf("\nLMDB tier: %zu pages of %zu bytes (%.0f MB), %llu commits, %zu/%zu read hits\n\n",
           n_pages, page_bytes, mb, (unsigned long long)st.commits, hits, n_pages);
    printf("| %-38s | %21s | %11s | %20s |\n", "operation", "work", "time", "throughput");
    printf("|%s|%s|%s|%s|\n", "----------------------------------------", "-----------------------",
           "-------------", "----------------------");
    row("disk write (pages)", (double)n_pages, "pages", t_write);
    row("disk write (MB)", mb, "MB", t_write);
    row("disk read, random order (pages)", (double)n_pages, "pages", t_read);
    row("disk read, random order (MB)", mb, "MB", t_read);
    cairn_disk_close(d);
    test_remove_dir(dir);
    free(buf);
    free(dst);
    free(keys);
    free(toks);
    free(order);
    return 0;
}

int main(int argc, char **argv)
{
    size_t tokens = 1000000, page_bytes = 64 << 10, disk_pages = 2000;
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir)
        dir = "/tmp";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--tokens"))
            tokens = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--page-bytes"))
            page_bytes = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--disk-pages"))
            disk_pages = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--dir"))
            dir = argv[i + 1];
        else {
            fprintf(stderr, "usage: %s [--tokens N] [--page-bytes B] [--disk-pages P] [--dir D]\n",
                    argv[0]);
            return 2;
        }
    }
    if (bench_radix(tokens))
        return 1;
    return bench_disk(dir, page_bytes, disk_pages);
}
