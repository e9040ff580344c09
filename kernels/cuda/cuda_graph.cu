/*
 * kernels/cuda/cuda_graph.cu — a decode step as one CUDA graph: the
 * optional slots graph_begin and graph_end (kernels/backend.h, "Step
 * graphs").
 *
 * A decode step of an 8B model is ~16 kernels a layer, ~520 launches; each
 * leaves a gap on the GPU while the next is submitted. Captured into a graph
 * and launched as one, the step runs back to back. How:
 *
 *     graph_begin(key)         cudaStreamBeginCapture on the compute stream
 *       ops ...                recorded, not run (their staged index arrays
 *                              become memcpy nodes from the pinned ring)
 *     graph_end()              cudaStreamEndCapture -> a graph; the exec
 *                              kept for `key` is updated to it in place
 *                              (cudaGraphExecUpdate: same kernels, new
 *                              arguments), or instantiated when it is new
 *                              or its shape changed; then launched
 *
 * Every step is captured again, so nothing about the arguments (positions,
 * slots, page tables, how long each sequence is) has to be frozen: the
 * update carries them, and the result is the same kernels with the same
 * arguments as running the ops one by one — the same bits. What capture
 * forbids is anything that waits on the stream: the staging ring is given
 * room before capture starts so it cannot wrap inside it, and an op that
 * would have to wait anyway (the scratch growing, a download) invalidates
 * the capture; graph_end then says CAIRN_EBUSY, nothing of the step has
 * run, and the caller runs it again without a graph. An op that fails
 * while recording makes the caller call graph_abandon instead of graph_end:
 * nothing recorded runs (half a step would otherwise run here and again
 * without a graph), and an intact capture tells the caller the failure was
 * the op's own.
 *
 * Off unless CAIRN_CUDA_GRAPHS=1 (read at backend creation): this path has
 * not run on a GPU yet; tests/gpu/test_gpu_graph.c checks graph == eager
 * bit for bit, and bench/gpu/run.sh measures both.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_impl.h"

enum {
    GRAPH_KEYS = 16,                 /* execs kept (batch sizes seen)       */
    GRAPH_STAGE_ROOM = 1 << 20,      /* ring bytes free before a capture    */
};

struct cuda_graphs {
    void *blas_workspace; /* cuBLAS's, set by us: it may not allocate in a capture */
    struct {
        uint64_t key;
        cudaGraphExec_t exec; /* NULL: free entry */
        uint64_t last_use;
    } keys[GRAPH_KEYS];
    uint64_t clock;
    bool capturing;
    uint64_t key; /* of the capture in progress */
    uint64_t launched, updated, instantiated, abandoned;
};

void cuda_graphs_free(cuda_ctx *ctx)
{
    cuda_graphs *g = ctx->graphs;
    if (!g)
        return;
    if (g->capturing) {
        cudaGraph_t dropped = NULL;
        cudaStreamEndCapture(ctx->stream, &dropped);
        if (dropped)
            cudaGraphDestroy(dropped);
        cudaGetLastError();
    }
    for (int i = 0; i < GRAPH_KEYS; i++)
        if (g->keys[i].exec)
            cudaGraphExecDestroy(g->keys[i].exec);
    if (g->blas_workspace)
        cudaFree(g->blas_workspace);
    cairn_log(CAIRN_LOG_DEBUG,
              "cuda graphs: %llu steps launched (%llu updated in place, %llu instantiated), "
              "%llu captures abandoned",
              (unsigned long long)g->launched, (unsigned long long)g->updated,
              (unsigned long long)g->instantiated, (unsigned long long)g->abandoned);
    free(g);
    ctx->graphs = NULL;
}

int cuda_graphs_init(cuda_ctx *ctx)
{
    const char *env = getenv("CAIRN_CUDA_GRAPHS");
    if (!env || strcmp(env, "1") != 0)
        return CAIRN_OK; /* off: the slots say so */
    if (!cuda_blas.set_workspace) {
        cairn_log(CAIRN_LOG_WARN, "cuda graphs: this cuBLAS has no cublasSetWorkspace; steps "
                                  "run eagerly");
        return CAIRN_OK;
    }
    cuda_graphs *g = (cuda_graphs *)calloc(1, sizeof *g);
    if (!g)
        return CAIRN_ENOMEM;
    /* A workspace of its own for cuBLAS (32 MiB, what Hopper's kernels
     * want): without one it may allocate inside a capture. */
    const size_t ws = (size_t)32 << 20;
    cudaError_t e = cudaMalloc(&g->blas_workspace, ws);
    if (e != cudaSuccess) {
        cudaGetLastError();
        free(g);
        cairn_log(CAIRN_LOG_WARN, "cuda graphs: no memory for cuBLAS's workspace; steps run "
                                  "eagerly");
        return CAIRN_OK;
    }
    cublasStatus_t st = cuda_blas.set_workspace(ctx->cublas, g->blas_workspace, ws);
    if (st != CUBLAS_STATUS_SUCCESS) {
        cudaFree(g->blas_workspace);
        free(g);
        cairn_log(CAIRN_LOG_WARN, "cuda graphs: cublasSetWorkspace failed (status %d); steps "
                                  "run eagerly", (int)st);
        return CAIRN_OK;
    }
    ctx->graphs = g;
    cairn_log(CAIRN_LOG_INFO, "cuda graphs: on (CAIRN_CUDA_GRAPHS=1): decode steps run as one "
                              "graph each");
    return CAIRN_OK;
}

static int cuda_graph_begin(cairn_backend *be, uint64_t key)
{
    cuda_ctx *ctx = cuda_ctx_of(be);
    cuda_graphs *g = ctx->graphs;
    if (!g || cuda_debug_sync())
        return CAIRN_EUNSUPPORTED; /* eager: the caller just goes on */
    if (g->capturing)
        return CAIRN_EINVAL;
    int rc = cuda_enter(be);
    if (rc != CAIRN_OK)
        return rc;
    /* Room in the ring, so staging cannot wrap (a wait) inside the capture:
     * wrapping now, before it, instead of during it (cuda_stage_room). */
    if ((rc = cuda_stage_room(ctx, GRAPH_STAGE_ROOM)) != CAIRN_OK)
        return rc;
    /* Only arrays sent inside this capture may stand in for later ones
     * inside it, so every step of a key records the same nodes and its exec
     * is updated in place, not instantiated anew (cuda_stage_table.h). */
    cuda_stage_table_capture_begin(&ctx->stage_sent);
    CUDA_TRY(cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeThreadLocal));
    g->capturing = true;
    g->key = key;
    return CAIRN_OK;
}

/* The exec kept for `key`, or a free (or the least recently used) entry. */
static int graph_entry(cuda_graphs *g, uint64_t key)
{
    int lru = 0;
    for (int i = 0; i < GRAPH_KEYS; i++) {
        if (g->keys[i].exec && g->keys[i].key == key)
            return i;
        if (!g->keys[i].exec || (g->keys[lru].exec && g->keys[i].last_use < g->keys[lru].last_use))
            lru = i;
    }
    return lru;
}

static int cuda_graph_end(cairn_backend *be)
{
    cuda_ctx *ctx = cuda_ctx_of(be);
    cuda_graphs *g = ctx->graphs;
    if (!g || !g->capturing)
        return CAIRN_EINVAL;
    g->capturing = false;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(ctx->stream, &graph);
    if (e != cudaSuccess || !graph) {
        /* an op waited, or failed, inside the capture: nothing ran */
        cudaGetLastError();
        if (graph)
            cudaGraphDestroy(graph);
        g->abandoned++;
        /* index arrays "sent" inside it never reached the device: none of
         * them may stand in for a later one */
        cuda_stage_table_new_epoch(&ctx->stage_sent);
        cairn_log(CAIRN_LOG_DEBUG, "cuda graphs: capture abandoned (%s); the step runs eagerly",
                  cudaGetErrorString(e));
        return CAIRN_EBUSY;
    }
    const int i = graph_entry(g, g->key);
    bool ready = false;
    if (g->keys[i].exec && g->keys[i].key == g->key) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(g->keys[i].exec, graph, &info) == cudaSuccess) {
            ready = true;
            g->updated++;
        } else {
            cudaGetLastError(); /* a different shape: instantiate it below */
        }
    }
    if (!ready) {
        if (g->keys[i].exec)
            cudaGraphExecDestroy(g->keys[i].exec);
        g->keys[i].exec = NULL;
        e = cudaGraphInstantiate(&g->keys[i].exec, graph, 0);
        if (e != cudaSuccess) {
            cudaGetLastError();
            g->keys[i].exec = NULL;
            cudaGraphDestroy(graph);
            g->abandoned++;
            cuda_stage_table_new_epoch(&ctx->stage_sent); /* as above: its copies never ran */
            cairn_log(CAIRN_LOG_WARN, "cuda graphs: cannot instantiate a step (%s); it runs eagerly",
                      cudaGetErrorString(e));
            return CAIRN_EBUSY;
        }
        g->keys[i].key = g->key;
        g->instantiated++;
    }
    g->keys[i].last_use = ++g->clock;
    cudaGraphDestroy(graph); /* the exec keeps what it needs */
    e = cudaGraphLaunch(g->keys[i].exec, ctx->stream);
    if (e != cudaSuccess) {
        /* as above: the copies recorded in it may never have run */
        cuda_stage_table_new_epoch(&ctx->stage_sent);
        return cuda_fail("cudaGraphLaunch", e);
    }
    g->launched++;
    return CAIRN_OK;
}

static int cuda_graph_abandon(cairn_backend *be)
{
    cuda_ctx *ctx = cuda_ctx_of(be);
    cuda_graphs *g = ctx->graphs;
    if (!g || !g->capturing)
        return CAIRN_EINVAL;
    g->capturing = false;
    cudaGraph_t graph = NULL;
    const cudaError_t e = cudaStreamEndCapture(ctx->stream, &graph);
    if (e != cudaSuccess)
        cudaGetLastError();
    if (graph)
        cudaGraphDestroy(graph);
    g->abandoned++;
    cuda_stage_table_new_epoch(&ctx->stage_sent); /* its copies never ran */
    /* A capture the runtime had already given up was broken by what the
     * failing op tried (a wait, an allocation): without a capture it may
     * succeed, so say CAIRN_EBUSY as graph_end does. An intact capture
     * means the op failed on its own (a bad argument): CAIRN_OK, and the
     * caller reports that failure. */
    if (e != cudaSuccess || !graph) {
        cairn_log(CAIRN_LOG_DEBUG, "cuda graphs: capture broken by a failing op (%s); the step "
                                   "runs eagerly", cudaGetErrorString(e));
        return CAIRN_EBUSY;
    }
    return CAIRN_OK;
}

extern "C" int cairn_backend_cuda_graph_stats(const cairn_backend *be,
                                              cairn_cuda_graph_stats *out)
{
    if (!be || !out || !be->iface || strcmp(be->iface->name, "cuda") != 0)
        return CAIRN_EUNSUPPORTED;
    const cuda_graphs *g = ((const cuda_ctx *)be->ctx)->graphs;
    if (!g)
        return CAIRN_EUNSUPPORTED;
    out->launched = g->launched;
    out->updated = g->updated;
    out->instantiated = g->instantiated;
    out->abandoned = g->abandoned;
    return CAIRN_OK;
}

void cuda_graph_iface(cairn_backend_iface *t)
{
    t->graph_begin = cuda_graph_begin;
    t->graph_end = cuda_graph_end;
    t->graph_abandon = cuda_graph_abandon;
}
