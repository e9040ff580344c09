/*
 * tests/store/test_util.c — see test_util.h.
 */
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A copy to host memory started by transfer() and not carried out yet. */
typedef struct {
    void *dst;
    const void *src;
    size_t bytes;
    uint64_t fence;
    int polls_left; /* non-blocking polls of its fence before it passes */
} tb_pending;

typedef struct {
    test_backend_counters counters;
    /* deferred transfers (CAIRN_TEST_TRANSFER_DELAY): oldest first */
    int delay;
    tb_pending *pending;
    size_t n_pending, cap_pending;
    uint64_t next_fence, passed;
} test_ctx;

static void tb_destroy(cairn_backend *be)
{
    test_ctx *ctx = be->ctx;
    free(ctx->pending);
    free(ctx);
    free(be);
}

static int tb_alloc(cairn_backend *be, size_t bytes, void **out)
{
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p)
        return CAIRN_ENOMEM;
    ((test_ctx *)be->ctx)->counters.live_allocs++;
    *out = p;
    return CAIRN_OK;
}

static void tb_free(cairn_backend *be, void *p)
{
    if (p)
        ((test_ctx *)be->ctx)->counters.live_allocs--;
    free(p);
}

static int tb_upload(cairn_backend *be, void *dst, const void *src, size_t n)
{
    ((test_ctx *)be->ctx)->counters.uploaded += n;
    memcpy(dst, src, n);
    return CAIRN_OK;
}

static int tb_download(cairn_backend *be, void *dst, const void *src, size_t n)
{
    ((test_ctx *)be->ctx)->counters.downloaded += n;
    memcpy(dst, src, n);
    return CAIRN_OK;
}

static int tb_copy(cairn_backend *be, void *dst, const void *src, size_t n)
{
    (void)be;
    memmove(dst, src, n);
    return CAIRN_OK;
}

static int tb_sync(cairn_backend *be)
{
    (void)be;
    return CAIRN_OK;
}

static int tb_get_rows(cairn_backend *be, float *o, const void *t, cairn_type ty, int D,
                       const int32_t *ids, int T)
{
    (void)be, (void)o, (void)t, (void)ty, (void)D, (void)ids, (void)T;
    return CAIRN_EUNSUPPORTED;
}
static int tb_matmul(cairn_backend *be, float *y, const void *W, cairn_type wt, const float *x,
                     int T, int ni, int no)
{
    (void)be, (void)y, (void)W, (void)wt, (void)x, (void)T, (void)ni, (void)no;
    return CAIRN_EUNSUPPORTED;
}
static int tb_rmsnorm(cairn_backend *be, float *o, const float *x, const float *w, int T, int D,
                      float eps)
{
    (void)be, (void)o, (void)x, (void)w, (void)T, (void)D, (void)eps;
    return CAIRN_EUNSUPPORTED;
}
static int tb_rope(cairn_backend *be, float *x, int T, int nh, int hd, const int32_t *pos,
                   const cairn_rope_params *p)
{
    (void)be, (void)x, (void)T, (void)nh, (void)hd, (void)pos, (void)p;
    return CAIRN_EUNSUPPORTED;
}
static int tb_swiglu(cairn_backend *be, float *o, const float *g, const float *u, size_t n)
{
    (void)be, (void)o, (void)g, (void)u, (void)n;
    return CAIRN_EUNSUPPORTED;
}
static int tb_add(cairn_backend *be, float *y, const float *a, const float *b, size_t n)
{
    (void)be, (void)y, (void)a, (void)b, (void)n;
    return CAIRN_EUNSUPPORTED;
}
static int tb_softmax(cairn_backend *be, float *x, int T, int n)
{
    (void)be, (void)x, (void)T, (void)n;
    return CAIRN_EUNSUPPORTED;
}
static int tb_kv_store(cairn_backend *be, void *pool, const cairn_kv_layout *L, int layer,
                       const float *k, const float *v, const int32_t *slots, int T)
{
    (void)be, (void)pool, (void)L, (void)layer, (void)k, (void)v, (void)slots, (void)T;
    return CAIRN_EUNSUPPORTED;
}
static int tb_attention(cairn_backend *be, const cairn_attn_args *a)
{
    (void)be, (void)a;
    return CAIRN_EUNSUPPORTED;
}

/* ---- deferred transfers ------------------------------------------------
 * With CAIRN_TEST_TRANSFER_DELAY=N the backend has the transfer slots of a
 * device, and is as late as a device may be: a copy to host memory is only
 * carried out when its fence passes (after N polls of it, or a blocking
 * wait), reading its source *then*. A store that reads a host slot before
 * the fence (stale bytes), or hands the source page out again before it
 * (someone else's bytes copied), gets wrong payloads, which the tests see.
 * Copies to the device complete at once, after every earlier one, as the
 * compute queue of a device waits for them. Fences pass in order. */

static void tb_complete_upto(test_ctx *ctx, uint64_t fence)
{
    size_t k = 0;
    while (k < ctx->n_pending && ctx->pending[k].fence <= fence) {
        memcpy(ctx->pending[k].dst, ctx->pending[k].src, ctx->pending[k].bytes);
        k++;
    }
    if (k > 0 && k < ctx->n_pending) /* (no pointer arithmetic on an empty queue) */
        memmove(ctx->pending, ctx->pending + k, (ctx->n_pending - k) * sizeof *ctx->pending);
    ctx->n_pending -= k;
    if (fence > ctx->passed)
        ctx->passed = fence;
}

static int tb_transfer(cairn_backend *be, void *dst, const void *src, size_t n, int to_host,
                       uint64_t *fence)
{
    test_ctx *ctx = be->ctx;
    uint64_t f = ++ctx->next_fence;
    *fence = f;
    if (!to_host) {
        ctx->counters.uploaded += n;
        tb_complete_upto(ctx, f - 1); /* the copy queue is in order */
        memcpy(dst, src, n);
        ctx->passed = f;
        return CAIRN_OK;
    }
    ctx->counters.downloaded += n;
    if (ctx->n_pending == ctx->cap_pending) {
        size_t cap = ctx->cap_pending ? ctx->cap_pending * 2 : 64;
        tb_pending *p = realloc(ctx->pending, cap * sizeof *p);
        if (!p)
            return CAIRN_ENOMEM;
        ctx->pending = p;
        ctx->cap_pending = cap;
    }
    ctx->pending[ctx->n_pending++] = (tb_pending){dst, src, n, f, ctx->delay};
    return CAIRN_OK;
}

static int tb_fence_wait(cairn_backend *be, uint64_t fence, int block)
{
    test_ctx *ctx = be->ctx;
    if (fence > ctx->next_fence)
        return CAIRN_EINVAL;
    if (fence <= ctx->passed)
        return CAIRN_OK;
    if (!block) {
        for (size_t i = 0; i < ctx->n_pending; i++)
            if (ctx->pending[i].fence == fence && --ctx->pending[i].polls_left > 0)
                return CAIRN_EBUSY;
    }
    tb_complete_upto(ctx, fence);
    return CAIRN_OK;
}


static const cairn_backend_iface test_iface = {
    .name = "test-memory",
    .destroy = tb_destroy,
    .alloc = tb_alloc,
    .free = tb_free,
    .upload = tb_upload,
    .download = tb_download,
    .copy = tb_copy,
    .synchronize = tb_sync,
    .get_rows = tb_get_rows,
    .matmul = tb_matmul,
    .rmsnorm = tb_rmsnorm,
    .rope = tb_rope,
    .swiglu = tb_swiglu,
    .add = tb_add,
    .softmax = tb_softmax,
    .kv_store = tb_kv_store,
    .attention = tb_attention,
};

cairn_backend *test_backend_create(void)
{
    cairn_backend *be = calloc(1, sizeof *be);
    test_ctx *ctx = calloc(1, sizeof *ctx);
    if (!be || !ctx) {
        free(be);
        free(ctx);
        return NULL;
    }
    be->iface = &test_iface;
    be->ctx = ctx;
    const char *delay = getenv("CAIRN_TEST_TRANSFER_DELAY");
    if (delay && atoi(delay) > 0) {
        /* the same table with a device's transfer slots */
        static cairn_backend_iface deferred;
        deferred = test_iface;
        deferred.name = "test-memory-deferred";
        deferred.transfer = tb_transfer;
        deferred.fence_wait = tb_fence_wait;
        ctx->delay = atoi(delay);
        be->iface = &deferred;
    }
    return be;
}

test_backend_counters *test_backend_counters_of(cairn_backend *be)
{
    return &((test_ctx *)be->ctx)->counters;
}

void test_payload(const int32_t *prefix_tokens, size_t n_tokens, void *out, size_t bytes)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n_tokens; i++)
        h = (h ^ (uint32_t)prefix_tokens[i]) * 0x100000001b3ull;
    uint8_t *o = out;
    for (size_t i = 0; i < bytes; i += 8) {
        /* splitmix64 stream seeded by the prefix digest */
        h += 0x9e3779b97f4a7c15ull;
        uint64_t z = h;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        for (size_t k = 0; k < 8 && i + k < bytes; k++)
            o[i + k] = (uint8_t)(z >> (8 * k));
    }
}

void test_make_dir(char *out, size_t len, const char *tag)
{
    const char *base = getenv("TMPDIR");
    if (!base || !*base)
        base = "/tmp";
    snprintf(out, len, "%s/cairn-%s-XXXXXX", base, tag);
    if (!mkdtemp(out))
        out[0] = 0;
}

void test_remove_dir(const char *dir)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/data.mdb", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/lock.mdb", dir);
    unlink(p);
    rmdir(dir);
}

cairn_kv_layout test_layout(int page_size)
{
    cairn_kv_layout L = {
        .n_layer = 1, .n_kv_head = 1, .head_dim = 8, .page_size = page_size,
        .dtype = CAIRN_TYPE_F32, .row_bytes = 32,
    };
    L.page_bytes = (size_t)L.n_layer * 2 * (size_t)page_size * L.row_bytes;
    return L;
}
