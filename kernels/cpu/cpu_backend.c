/*
 * kernels/cpu/cpu_backend.c — the CPU backend: creation, host memory and the
 * function table. The ops themselves live in cpu_matmul.c, cpu_ops.c and
 * cpu_attention.c.
 *
 * Argument rules shared by every op of this backend (the CUDA backend follows
 * the same ones):
 *   - NULL tensor or index pointers, and sizes that are not positive, are
 *     CAIRN_EINVAL. Memory copies of 0 bytes are a no-op, as with memcpy.
 *   - What cannot be checked is the caller's responsibility: that buffers are
 *     as large as the shapes say, that token ids are below the table's row
 *     count, and that KV slots and page ids lie inside the pool.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels/cpu/cpu_impl.h"

/* Alignment of every allocation: a cache line, and enough for any AVX-512
 * load. */
#define CPU_ALIGN 64

/* More threads than this is a configuration mistake, not a machine. */
#define CPU_MAX_THREADS 1024

int cpu_scratch_reserve(cpu_ctx *ctx, size_t floats)
{
    /* Round each slice up to whole cache lines. */
    size_t stride = (floats + 15) / 16 * 16;
    if (stride <= ctx->scratch_stride)
        return CAIRN_OK;
    if (stride > SIZE_MAX / sizeof(float) / (size_t)ctx->n_threads)
        return CAIRN_ENOMEM;
    void *mem = NULL;
    if (posix_memalign(&mem, CPU_ALIGN, stride * sizeof(float) * (size_t)ctx->n_threads) != 0)
        return CAIRN_ENOMEM;
    free(ctx->scratch);
    ctx->scratch = mem;
    ctx->scratch_stride = stride;
    return CAIRN_OK;
}

static void cpu_destroy(cairn_backend *be)
{
    if (!be)
        return;
    cpu_ctx *ctx = cpu_ctx_of(be);
    if (ctx) {
        cpu_pool_destroy(ctx->pool);
        free(ctx->scratch);
        free(ctx->seq_row_start);
        free(ctx->attn_partial);
        free(ctx->act_q);
        free(ctx->act_d);
        free(ctx->act_s);
        free(ctx->act_s_lo);
        free(ctx->act_corr);
        free(ctx->act_bf16);
        for (int i = 0; i < ctx->n_maps; i++) /* what the caller did not free */
            munmap(ctx->maps[i].base, ctx->maps[i].len);
        free(ctx->maps);
        free(ctx);
    }
    free(be);
}

/* Allocations of at least this size are mappings of their own (see
 * cpu_alloc). */
#define CPU_MAP_MIN ((size_t)4 << 20)
/* The huge page size the big mappings are aligned to. */
#define CPU_HUGE ((size_t)2 << 20)

/* Backend memory. Small blocks come from the C heap, zeroed. Big ones (the
 * weights, the KV pool, the logits) are anonymous mappings, which the
 * kernel hands out as zero pages and backs with memory only when touched:
 * a KV pool sized for the worst case costs RAM only for the pages a
 * request has written, so an idle server is as small as its weights. They
 * are aligned to 2 MiB and marked for transparent huge pages, because
 * decode streams gigabytes of weights per second and 4 KiB pages cost it a
 * TLB miss every 64 cache lines (measured on an AMD EPYC Zen 4: 26 -> 29
 * GB/s for a Q4_0 GEMV with two threads). Their addresses and lengths are
 * kept in ctx->maps so that free() can tell them apart. */
static int cpu_alloc(cairn_backend *be, size_t bytes, void **out)
{
    if (!out || bytes == 0)
        return CAIRN_EINVAL;
    if (bytes > SIZE_MAX - CPU_HUGE)
        return CAIRN_ENOMEM;
    cpu_ctx *ctx = cpu_ctx_of(be);
    /* Whole cache lines, so a vector loop may read a row's padded tail. */
    size_t rounded = (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
    if (rounded < CPU_MAP_MIN) {
        void *mem = NULL;
        if (posix_memalign(&mem, CPU_ALIGN, rounded) != 0)
            return CAIRN_ENOMEM;
        memset(mem, 0, rounded);
        *out = mem;
        return CAIRN_OK;
    }
    if (ctx->n_maps == ctx->maps_cap) {
        const int cap = ctx->maps_cap ? 2 * ctx->maps_cap : 8;
        cpu_map *m = realloc(ctx->maps, (size_t)cap * sizeof *m);
        if (!m)
            return CAIRN_ENOMEM;
        ctx->maps = m;
        ctx->maps_cap = cap;
    }
    rounded = (rounded + CPU_HUGE - 1) & ~(CPU_HUGE - 1);
    /* over-map by one huge page and trim both ends to the alignment */
    uint8_t *raw = mmap(NULL, rounded + CPU_HUGE, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return CAIRN_ENOMEM;
    uint8_t *mem = (uint8_t *)(((uintptr_t)raw + CPU_HUGE - 1) & ~(uintptr_t)(CPU_HUGE - 1));
    if (mem > raw)
        munmap(raw, (size_t)(mem - raw));
    const size_t tail = (size_t)(raw + rounded + CPU_HUGE - (mem + rounded));
    if (tail > 0)
        munmap(mem + rounded, tail);
    (void)madvise(mem, rounded, MADV_HUGEPAGE); /* a hint: no THP is fine */
    ctx->maps[ctx->n_maps++] = (cpu_map){mem, rounded};
    *out = mem;
    return CAIRN_OK;
}

static void cpu_free(cairn_backend *be, void *ptr)
{
    if (!ptr)
        return;
    cpu_ctx *ctx = cpu_ctx_of(be);
    for (int i = 0; i < ctx->n_maps; i++)
        if (ctx->maps[i].base == ptr) {
            munmap(ptr, ctx->maps[i].len);
            ctx->maps[i] = ctx->maps[--ctx->n_maps];
            return;
        }
    free(ptr);
}

static int cpu_memcpy(void *dst, const void *src, size_t bytes)
{
    if (!dst || !src)
        return CAIRN_EINVAL;
    if (bytes > 0 && dst != src)
        memmove(dst, src, bytes);
    return CAIRN_OK;
}

static int cpu_upload(cairn_backend *be, void *dst, const void *host_src, size_t bytes)
{
    (void)be;
    return cpu_memcpy(dst, host_src, bytes);
}

static int cpu_download(cairn_backend *be, void *host_dst, const void *src, size_t bytes)
{
    (void)be;
    return cpu_memcpy(host_dst, src, bytes);
}

static int cpu_copy(cairn_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    return cpu_memcpy(dst, src, bytes);
}

static int cpu_synchronize(cairn_backend *be)
{
    /* Every op has finished when it returns. */
    (void)be;
    return CAIRN_OK;
}

static int cpu_supports_type(const cairn_backend *be, cairn_type t)
{
    (void)be;
    return cpu_type_supported(t);
}

static const cairn_backend_iface cpu_iface = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .supports_type = cpu_supports_type,
    .weight_layout = cpu_weight_layout,
    .upload_weight = cpu_upload_weight,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_upload,
    .download = cpu_download,
    .copy = cpu_copy,
    .synchronize = cpu_synchronize,
    .get_rows = cpu_get_rows,
    .matmul = cpu_matmul,
    .matmul_multi = cpu_matmul_multi,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .swiglu = cpu_swiglu,
    .geglu = cpu_geglu,
    .swiglu_clamped = cpu_swiglu_clamped,
    .scale = cpu_scale,
    .gather_cols = cpu_gather_cols,
    .add = cpu_add,
    .add_bias = cpu_add_bias,
    .add_rows_scaled = cpu_add_rows_scaled,
    .softmax = cpu_softmax,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
};

int cairn_backend_cpu_create(int n_threads, cairn_backend **out)
{
    if (!out || n_threads < 0 || n_threads > CPU_MAX_THREADS)
        return CAIRN_EINVAL;
    if (n_threads == 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = online < 1 ? 1 : online > CPU_MAX_THREADS ? CPU_MAX_THREADS : (int)online;
    }
    cairn_backend *be = calloc(1, sizeof *be);
    cpu_ctx *ctx = calloc(1, sizeof *ctx);
    if (!be || !ctx) {
        free(be);
        free(ctx);
        return CAIRN_ENOMEM;
    }
    ctx->n_threads = n_threads;
    ctx->isa = cpu_isa_detect();
    const char *exact = getenv("CAIRN_CPU_EXACT_MATMUL");
    ctx->quantize_activations = !(exact && strcmp(exact, "1") == 0);
    cpu_tune_defaults(&ctx->tune);
    ctx->bf16_dot = ctx->quantize_activations && cpu_has_bf16(ctx->isa);
    const char *pf = getenv("CAIRN_CPU_PREFETCH"), *pair = getenv("CAIRN_CPU_PAIR_TOKENS");
    if (pf && *pf)
        ctx->tune.prefetch = atoi(pf);
    if (pair && *pair)
        ctx->tune.pair_tokens = atoi(pair);
    cairn_log(CAIRN_LOG_DEBUG, "cpu backend: %d threads, %s kernels, %s quantized matmul",
              n_threads, cpu_isa_name(ctx->isa),
              ctx->quantize_activations ? "8-bit activations for" : "exact float");
    int rc = cpu_pool_create(n_threads, &ctx->pool);
    if (rc != CAIRN_OK) {
        free(ctx);
        free(be);
        return rc;
    }
    be->iface = &cpu_iface;
    be->ctx = ctx;
    *out = be;
    return CAIRN_OK;
}

int cairn_backend_cpu_threads(const cairn_backend *be)
{
    if (!be || be->iface != &cpu_iface || !be->ctx)
        return CAIRN_EINVAL;
    return ((const cpu_ctx *)be->ctx)->n_threads;
}
