/*
 * kernels/cuda/cuda_transfer.cu — page transfers on a copy stream of their
 * own, page-locked host memory, and device memory figures: the optional
 * slots host_alloc, host_free, transfer, fence_wait and memory_info
 * (kernels/backend.h, "Transfers and fences").
 *
 * Two streams, joined only by events, never by a device-wide wait:
 *
 *     compute  ─ops─●────────────ops──────────────■─ops that read the page─
 *                   │ before                      ▲
 *                   ▼                             │ (H2D only)
 *     copy     ─────■──cudaMemcpyAsync──●fence n──┘
 *
 *   ● cudaEventRecord, ■ cudaStreamWaitEvent. Each transfer first makes the
 *   copy stream wait for everything the compute stream holds (the page's
 *   K/V writes); an upload then makes the compute stream wait for the copy,
 *   so ops issued later read the new page without the host waiting.
 *
 * Fences are numbers 1, 2, 3, ... Fence n's event lives in ring[n % RING];
 * before a ring entry is recorded again, the fence it held is waited for
 * (RING copies in flight at once is far more than a step moves), so
 * `passed` — the highest fence known complete — always covers a fence whose
 * event was reused. One copy stream carries every transfer, so fences
 * complete in order: fence n passed means every fence below it did.
 *
 * Page-locked memory: the store's host tier is allocated here once
 * (cudaHostAlloc), so the copy engine reads and writes it directly; a
 * transfer from pageable memory would still be correct, but staged by the
 * driver and not overlapped.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_impl.h"

enum { FENCE_RING = 1024 };

struct cuda_transfers {
    cudaStream_t copy;
    cudaEvent_t before;            /* the compute stream's tail, per transfer */
    cudaEvent_t ring[FENCE_RING];  /* fence n: ring[n % FENCE_RING]          */
    int n_events;                  /* ring entries created so far            */
    uint64_t next;                 /* the next fence number (from 1)         */
    uint64_t passed;               /* every fence <= passed has completed    */
};

void cuda_transfers_free(cuda_ctx *ctx)
{
    cuda_transfers *x = ctx->xfer;
    if (!x)
        return;
    if (x->copy) {
        cudaStreamSynchronize(x->copy);
        cudaStreamDestroy(x->copy);
    }
    if (x->before)
        cudaEventDestroy(x->before);
    for (int i = 0; i < x->n_events; i++)
        cudaEventDestroy(x->ring[i]);
    free(x);
    ctx->xfer = NULL;
}

/* The copy stream and its events, made on the first transfer (a backend
 * that never spills pages never creates them). */
static int transfers_of(cuda_ctx *ctx, cuda_transfers **out)
{
    if (ctx->xfer) {
        *out = ctx->xfer;
        return CAIRN_OK;
    }
    cuda_transfers *x = (cuda_transfers *)calloc(1, sizeof *x);
    if (!x)
        return CAIRN_ENOMEM;
    ctx->xfer = x;
    x->next = 1;
    cudaError_t e = cudaStreamCreateWithFlags(&x->copy, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        x->copy = NULL;
        cuda_transfers_free(ctx);
        return cuda_fail("cudaStreamCreateWithFlags (copy stream)", e);
    }
    e = cudaEventCreateWithFlags(&x->before, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        x->before = NULL;
        cuda_transfers_free(ctx);
        return cuda_fail("cudaEventCreateWithFlags", e);
    }
    *out = x;
    return CAIRN_OK;
}

/* The event of fence n, created on first use and free to record again
 * (its previous fence waited for when that one may still be running). */
static int fence_event(cuda_transfers *x, uint64_t n, cudaEvent_t *ev)
{
    int i = (int)(n % FENCE_RING);
    if (i >= x->n_events) {
        /* entries are used in order 1, 2, ..., RING-1, 0 */
        while (x->n_events <= i) {
            cudaError_t e = cudaEventCreateWithFlags(&x->ring[x->n_events], cudaEventDisableTiming);
            if (e != cudaSuccess)
                return cuda_fail("cudaEventCreateWithFlags", e);
            x->n_events++;
        }
    } else if (n > FENCE_RING && n - FENCE_RING > x->passed) {
        cudaError_t e = cudaEventSynchronize(x->ring[i]);
        if (e != cudaSuccess)
            return cuda_fail("cudaEventSynchronize (fence ring)", e);
        x->passed = n - FENCE_RING;
    }
    *ev = x->ring[i];
    return CAIRN_OK;
}

static int cuda_transfer(cairn_backend *be, void *dst, const void *src, size_t bytes, int to_host,
                         uint64_t *fence)
{
    if (!dst || !src || !fence)
        return CAIRN_EINVAL;
    *fence = 0;
    if (bytes == 0)
        return CAIRN_OK;
    int rc = cuda_enter(be);
    if (rc != CAIRN_OK)
        return rc;
    cuda_ctx *ctx = cuda_ctx_of(be);
    cuda_transfers *x = NULL;
    if ((rc = transfers_of(ctx, &x)) != CAIRN_OK)
        return rc;
    cudaEvent_t done = NULL;
    uint64_t n = x->next;
    if ((rc = fence_event(x, n, &done)) != CAIRN_OK)
        return rc;
    CUDA_TRY(cudaEventRecord(x->before, ctx->stream));
    CUDA_TRY(cudaStreamWaitEvent(x->copy, x->before, 0));
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice,
                             x->copy));
    CUDA_TRY(cudaEventRecord(done, x->copy));
    if (!to_host)
        CUDA_TRY(cudaStreamWaitEvent(ctx->stream, done, 0));
    x->next = n + 1;
    *fence = n;
    return CAIRN_OK;
}

static int cuda_fence_wait(cairn_backend *be, uint64_t fence, int block)
{
    cuda_transfers *x = cuda_ctx_of(be)->xfer;
    if (fence == 0)
        return CAIRN_OK;
    if (!x || fence >= x->next)
        return CAIRN_EINVAL; /* never handed out */
    if (fence <= x->passed)
        return CAIRN_OK;
    int rc = cuda_enter(be);
    if (rc != CAIRN_OK)
        return rc;
    cudaEvent_t ev = x->ring[fence % FENCE_RING];
    cudaError_t e = block ? cudaEventSynchronize(ev) : cudaEventQuery(ev);
    if (e == cudaErrorNotReady) {
        /* not a failure, but the runtime records it as the thread's last
         * error all the same: clear it, or the next kernel launch would be
         * reported as failed with "device not ready" */
        cudaGetLastError();
        return CAIRN_EBUSY;
    }
    if (e != cudaSuccess)
        return cuda_fail(block ? "cudaEventSynchronize (transfer)" : "cudaEventQuery (transfer)", e);
    x->passed = fence; /* in order: everything below it is done too */
    return CAIRN_OK;
}

static int cuda_host_alloc(cairn_backend *be, size_t bytes, void **out)
{
    if (!out || bytes == 0)
        return CAIRN_EINVAL;
    *out = NULL;
    int rc = cuda_enter(be);
    if (rc != CAIRN_OK)
        return rc;
    size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded < bytes)
        return CAIRN_ENOMEM;
    void *p = NULL;
    cudaError_t e = cudaHostAlloc(&p, rounded, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* not a kernel failure: do not leave it for the next op */
        cairn_log(CAIRN_LOG_WARN, "cuda: cannot page-lock %.1f MiB of host memory (%s)",
                  (double)rounded / (1 << 20), cudaGetErrorString(e));
        return CAIRN_ENOMEM;
    }
    memset(p, 0, rounded);
    *out = p;
    return CAIRN_OK;
}

static void cuda_host_free(cairn_backend *be, void *ptr)
{
    if (!ptr || cuda_enter(be) != CAIRN_OK)
        return;
    cuda_ctx *ctx = cuda_ctx_of(be);
    if (ctx->xfer && ctx->xfer->copy)
        cudaStreamSynchronize(ctx->xfer->copy); /* a copy may still use it */
    cudaFreeHost(ptr);
}

static int cuda_memory_info(cairn_backend *be, size_t *free_bytes, size_t *total_bytes)
{
    if (!free_bytes || !total_bytes)
        return CAIRN_EINVAL;
    int rc = cuda_enter(be);
    if (rc != CAIRN_OK)
        return rc;
    CUDA_TRY(cudaMemGetInfo(free_bytes, total_bytes));
    return CAIRN_OK;
}

void cuda_transfer_iface(cairn_backend_iface *t)
{
    t->host_alloc = cuda_host_alloc;
    t->host_free = cuda_host_free;
    t->transfer = cuda_transfer;
    t->fence_wait = cuda_fence_wait;
    t->memory_info = cuda_memory_info;
}
