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
 * thread counts. So each candidate decodes one token against a synthetic
 * packed Q4_0 matrix several times the last-level cache, the way decode
 * streams its weights, and the fastest wins. The choice is kept in a small
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
static const int prefetch_opts[] = {0, 4096, 16384};
static const int pair_opts[] = {0, 4};

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
    snprintf(key, sizeof key, "%s | %d threads | %s", model, ctx->n_threads,
             cpu_isa_name(ctx->isa));
    if (cache_lookup(key, &ctx->tune)) {
        cairn_log(CAIRN_LOG_DEBUG, "cpu backend: kernel knobs from the cache: prefetch %d, "
                                   "pair up to %d tokens", ctx->tune.prefetch,
                  ctx->tune.pair_tokens);
        return CAIRN_OK;
    }
    /* a Q4_0 matrix of 4 x the last-level cache, at least 128 MiB */
    size_t want = (size_t)128 << 20;
#ifdef _SC_LEVEL3_CACHE_SIZE
    const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (llc > 0 && (size_t)llc * 4 > want)
        want = (size_t)llc * 4;
#endif
    if (want > ((size_t)1 << 30))
        want = (size_t)1 << 30;
    const int n_in = 4096, n_out = (int)(want / cairn_type_row_bytes(CAIRN_TYPE_Q4_0, n_in) / 16 * 16);
    size_t bytes;
    cairn_type as;
    void *W = NULL, *y = NULL, *x = NULL;
    int rc = cpu_weight_layout(be, CAIRN_TYPE_Q4_0, n_in, n_out, &bytes, &as);
    if (rc == CAIRN_OK)
        rc = be->iface->alloc(be, bytes, &W);
    if (rc == CAIRN_OK)
        rc = be->iface->alloc(be, (size_t)n_out * sizeof(float), &y);
    if (rc == CAIRN_OK)
        rc = be->iface->alloc(be, (size_t)n_in * sizeof(float), &x);
    if (rc == CAIRN_OK) {
        /* real pages with plausible values: small scales, any codes */
        uint8_t *p = W;
        uint32_t s = 0x12345678u;
        for (size_t i = 0; i < bytes; i += 4) {
            s = s * 1664525u + 1013904223u;
            memcpy(p + i, &s, 4);
        }
        float *xf = x;
        for (int i = 0; i < n_in; i++)
            xf[i] = (float)((i * 37) % 19) - 9.0f;
        const double t0 = cairn_now();
        cpu_quant_tuning best = ctx->tune;
        double best_s = 1e30;
        (void)time_variant(be, W, as, x, y, n_in, n_out, &best, 1); /* warm up */
        for (size_t i = 0; i < sizeof prefetch_opts / sizeof prefetch_opts[0]; i++)
            for (size_t j = 0; j < sizeof pair_opts / sizeof pair_opts[0]; j++) {
                const cpu_quant_tuning t = {prefetch_opts[i], pair_opts[j]};
                const double s_t = time_variant(be, W, as, x, y, n_in, n_out, &t, 3);
                if (s_t < best_s) {
                    best_s = s_t;
                    best = t;
                }
            }
        ctx->tune = best;
        cairn_log(CAIRN_LOG_INFO, "cpu backend: measured the kernel knobs in %.2f s: prefetch "
                                  "%d, pair up to %d tokens (%.1f GB/s); cached for this CPU",
                  cairn_now() - t0, best.prefetch, best.pair_tokens, bytes / best_s / 1e9);
        cache_store(key, &best);
    }
    be->iface->free(be, x);
    be->iface->free(be, y);
    be->iface->free(be, W);
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
