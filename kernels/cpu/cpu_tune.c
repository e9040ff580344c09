/*
 * kernels/cpu/cpu_tune.c — choosing the quantized kernels' speed knobs
 * (cpu_quant_tuning) on this machine by measuring them, not by guessing
 * from the instruction-set flags.
 *
 * The knobs never change a bit of any result (cpu_x86_quant.c computes
 * every output with the same operations whichever is set), only how the
 * weight stream meets the memory system, which differs between
 * microarchitectures (an AMD Zen 4 runs 512-bit operations in two halves
 * and prefetches differently from an Intel Xeon) and between a machine's
 * thread counts. So each candidate decodes one token against synthetic
 * packed matrices several times the last-level cache, the way decode
 * streams its weights, and the fastest wins (measured on an AMD EPYC Zen 4:
 * no prefetch costs Q4_K decode 30%, while Q4_0's barely notices). The choice is kept in a small
 * file per CPU model, thread count and ISA level
 * ($XDG_CACHE_HOME/cairn/cpu-tune, else ~/.cache/cairn/cpu-tune), so only
 * the first start on a machine pays for the measurement (about 0.3 s).
 *
 * CAIRN_CPU_TUNE=0 skips it (the defaults below); CAIRN_CPU_PREFETCH and
 * CAIRN_CPU_PAIR_TOKENS set the knobs by hand (both bypass the cache).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kernels/cpu/cpu_impl.h"

/* The candidates. */
/* Passes over each candidate, taken in turn. */
#define TUNE_PASSES 6

/* The candidates, the default first (see pick). */
static const int prefetch_opts[] = {4096, 0, 2048, 8192, 16384};
static const int pair_opts[] = {4, 0};

void cpu_tune_defaults(cpu_quant_tuning *t)
{
    t->prefetch = 4096;
    t->pair_tokens = 4;
}

/* "vendor family model stepping | model name", from /proc/cpuinfo; "?" when
 * there is none. */
static void cpu_model_key(char *out, size_t cap)
{
    snprintf(out, cap, "?");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512], vendor[64] = "", family[16] = "", model[16] = "", step[16] = "",
                    name[256] = "";
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon)
            continue;
        if (line[0] == '\n' || strncmp(line, "processor", 9) == 0) {
            if (name[0]) /* the first processor's block is enough */
                break;
            continue;
        }
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t')
            v++;
        v[strcspn(v, "\n")] = 0;
        if (strncmp(line, "vendor_id", 9) == 0)
            snprintf(vendor, sizeof vendor, "%s", v);
        else if (strncmp(line, "cpu family", 10) == 0)
            snprintf(family, sizeof family, "%s", v);
        else if (strncmp(line, "model name", 10) == 0)
            snprintf(name, sizeof name, "%s", v);
        else if (strncmp(line, "model", 5) == 0 && (line[5] == '\t' || line[5] == ' '))
            snprintf(model, sizeof model, "%s", v);
        else if (strncmp(line, "stepping", 8) == 0)
            snprintf(step, sizeof step, "%s", v);
    }
    fclose(f);
    snprintf(out, cap, "%s %s %s %s | %s", vendor, family, model, step, name);
    for (char *p = out; *p; p++) /* one line, one field separator */
        if (*p == '\t' || *p == '=')
            *p = ' ';
}

static int cache_path(char *out, size_t cap, int make_dir)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char dir[1024];
    if (xdg && *xdg)
        snprintf(dir, sizeof dir, "%s/cairn", xdg);
    else if (home && *home)
        snprintf(dir, sizeof dir, "%s/.cache/cairn", home);
    else
        return 0;
    if (make_dir) {
        char parent[1024];
        snprintf(parent, sizeof parent, "%.*s", (int)(strrchr(dir, '/') - dir), dir);
        (void)mkdir(parent, 0755);
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return 0;
    }
    return snprintf(out, cap, "%s/cpu-tune", dir) < (int)cap;
}

/* The cached choice for `key`: 1 and *t set, or 0. Lines are
 * "<key>\tprefetch=N pair=M". */
static int cache_lookup(const char *key, cpu_quant_tuning *t)
{
    char path[1100], line[768];
    if (!cache_path(path, sizeof path, 0))
        return 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        char *tab = strchr(line, '\t');
        if (!tab || (size_t)(tab - line) != strlen(key) || strncmp(line, key, strlen(key)) != 0)
            continue;
        int pf, pair;
        if (sscanf(tab + 1, "prefetch=%d pair=%d", &pf, &pair) == 2 && pf >= 0 &&
            pf <= (1 << 20) && pair >= 0 && pair <= 64) {
            t->prefetch = pf;
            t->pair_tokens = pair;
            found = 1;
        }
    }
    fclose(f);
    return found;
}

static void cache_store(const char *key, const cpu_quant_tuning *t)
{
    char path[1100];
    if (!cache_path(path, sizeof path, 1))
        return;
    FILE *f = fopen(path, "a"); /* later lines for the same key are not read */
    if (!f)
        return;
    fprintf(f, "%s\tprefetch=%d pair=%d\n", key, t->prefetch, t->pair_tokens);
    fclose(f);
}

/* Seconds of the best of `reps` decode passes over `W` with knobs t. */
static double time_variant(cairn_backend *be, const void *W, cairn_type as, const float *x,
                           float *y, int n_in, int n_out, const cpu_quant_tuning *t, int reps)
{
    cpu_ctx *ctx = cpu_ctx_of(be);
    ctx->tune = *t;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        const double t0 = cairn_now();
        if (cpu_matmul(be, y, W, as, x, 1, n_in, n_out) != CAIRN_OK)
            return 1e30;
        const double dt = cairn_now() - t0;
        best = dt < best ? dt : best;
    }
    return best;
}

/* A synthetic packed matrix of `type` (random codes, small scales) of
 * about `want` bytes, n_in = 4096, with room for one token's x and y. */
typedef struct {
    void *W, *x, *y;
    cairn_type as;
    int n_in, n_out;
    size_t bytes;
} tune_matrix;

static int tune_matrix_make(cairn_backend *be, cairn_type type, size_t want, tune_matrix *m)
{
    memset(m, 0, sizeof *m);
    m->n_in = 4096;
    m->n_out = (int)(want / cairn_type_row_bytes(type, m->n_in) / 16 * 16);
    int rc = cpu_weight_layout(be, type, m->n_in, m->n_out, &m->bytes, &m->as);
    if (rc == CAIRN_OK)
        rc = be->iface->alloc(be, m->bytes, &m->W);
    if (rc == CAIRN_OK)
        rc = be->iface->alloc(be, (size_t)m->n_out * sizeof(float), &m->y);
    if (rc == CAIRN_OK)
        rc = be->iface->alloc(be, (size_t)m->n_in * sizeof(float), &m->x);
    if (rc != CAIRN_OK)
        return rc;
    /* real pages with plausible values: random codes, then every f16 in
     * the packed bytes kept finite by clearing its exponent's top bit */
    uint8_t *p = m->W;
    uint32_t s = 0x12345678u;
    for (size_t i = 0; i < m->bytes; i += 4) {
        s = s * 1664525u + 1013904223u;
        const uint32_t v = s & 0xbfffbfffu;
        memcpy(p + i, &v, 4);
    }
    float *xf = m->x;
    for (int i = 0; i < m->n_in; i++)
        xf[i] = (float)((i * 37) % 19) - 9.0f;
    return CAIRN_OK;
}

static void tune_matrix_free(cairn_backend *be, tune_matrix *m)
{
    be->iface->free(be, m->x);
    be->iface->free(be, m->y);
    be->iface->free(be, m->W);
}

/* Index of the fastest of n timings; the default (index 0) unless another
 * is more than 5% faster: a measurement on a shared machine is noisy, and
 * every choice gives the same results, so only a clear win moves it. */
static int pick(const double *s, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (s[i] < s[best] * (best == 0 ? 0.95 : 1.0))
            best = i;
    return best;
}

int cairn_backend_cpu_tune(cairn_backend *be)
{
    if (!be || !be->ctx || be->iface->matmul != cpu_matmul)
        return CAIRN_EINVAL;
    cpu_ctx *ctx = cpu_ctx_of(be);
    const char *pf = getenv("CAIRN_CPU_PREFETCH"), *pair = getenv("CAIRN_CPU_PAIR_TOKENS");
    const char *off = getenv("CAIRN_CPU_TUNE");
    if ((pf && *pf) || (pair && *pair) || (off && strcmp(off, "0") == 0) ||
        ctx->isa < CPU_ISA_AVX512) /* only the AVX-512 kernels have the knobs */
        return CAIRN_OK;
    char model[400], key[512];
    cpu_model_key(model, sizeof model);
    snprintf(key, sizeof key, "%s | %d threads | %s | v2", model, ctx->n_threads,
             cpu_isa_name(ctx->isa));
    if (cache_lookup(key, &ctx->tune)) {
        cairn_log(CAIRN_LOG_DEBUG, "cpu backend: kernel knobs from the cache: prefetch %d, "
                                   "pair up to %d tokens", ctx->tune.prefetch,
                  ctx->tune.pair_tokens);
        return CAIRN_OK;
    }
    /* matrices of 4 x the last-level cache, at least 128 MiB each: the
     * prefetch distance on Q4_K (the K-quants' heavier decoding leans on
     * it most), then pairing on Q4_0 (the K-quants never pair) */
    size_t want = (size_t)128 << 20;
#ifdef _SC_LEVEL3_CACHE_SIZE
    const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (llc > 0 && (size_t)llc * 4 > want)
        want = (size_t)llc * 4;
#endif
    if (want > ((size_t)512 << 20))
        want = (size_t)512 << 20;
    const double t0 = cairn_now();
    cpu_quant_tuning best;
    cpu_tune_defaults(&best);
    tune_matrix m;
    int rc = tune_matrix_make(be, CAIRN_TYPE_Q4_K, want, &m);
    if (rc == CAIRN_OK) {
        const int n = (int)(sizeof prefetch_opts / sizeof prefetch_opts[0]);
        double s_pf[8];
        (void)time_variant(be, m.W, m.as, m.x, m.y, m.n_in, m.n_out, &best, 1); /* warm up */
        for (int i = 0; i < n; i++)
            s_pf[i] = 1e30;
        /* round robin, so a change in the machine's load hits every
         * candidate alike; the best pass of each */
        for (int r = 0; r < TUNE_PASSES; r++)
            for (int i = 0; i < n; i++) {
                const cpu_quant_tuning t = {prefetch_opts[i], best.pair_tokens};
                const double x = time_variant(be, m.W, m.as, m.x, m.y, m.n_in, m.n_out, &t, 1);
                s_pf[i] = x < s_pf[i] ? x : s_pf[i];
            }
        best.prefetch = prefetch_opts[pick(s_pf, n)];
    }
    tune_matrix_free(be, &m);
    memset(&m, 0, sizeof m);
    if (rc == CAIRN_OK && (rc = tune_matrix_make(be, CAIRN_TYPE_Q4_0, want, &m)) == CAIRN_OK) {
        const int n = (int)(sizeof pair_opts / sizeof pair_opts[0]);
        double s_pair[4];
        (void)time_variant(be, m.W, m.as, m.x, m.y, m.n_in, m.n_out, &best, 1);
        for (int i = 0; i < n; i++)
            s_pair[i] = 1e30;
        for (int r = 0; r < TUNE_PASSES; r++)
            for (int i = 0; i < n; i++) {
                const cpu_quant_tuning t = {best.prefetch, pair_opts[i]};
                const double x = time_variant(be, m.W, m.as, m.x, m.y, m.n_in, m.n_out, &t, 1);
                s_pair[i] = x < s_pair[i] ? x : s_pair[i];
            }
        best.pair_tokens = pair_opts[pick(s_pair, n)];
    }
    tune_matrix_free(be, &m);
    ctx->tune = best;
    if (rc == CAIRN_OK) {
        cairn_log(CAIRN_LOG_INFO, "cpu backend: measured the kernel knobs in %.2f s: prefetch "
                                  "%d, pair up to %d tokens; cached for this CPU",
                  cairn_now() - t0, best.prefetch, best.pair_tokens);
        cache_store(key, &best);
    }
    return rc;
}

int cairn_backend_cpu_describe(const cairn_backend *be, char *out, size_t cap)
{
    if (!be || !be->ctx || be->iface->matmul != cpu_matmul || !out || cap == 0)
        return CAIRN_EINVAL;
    const cpu_ctx *ctx = be->ctx;
    snprintf(out, cap, "%s kernels, quantized weights packed in 16-row groups%s, prefetch %d, "
                       "pair up to %d tokens",
             cpu_isa_name(ctx->isa), ctx->quantize_activations ? "" : " (exact float mode)",
             ctx->tune.prefetch, ctx->tune.pair_tokens);
    return CAIRN_OK;
}
